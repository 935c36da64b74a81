"""A deprecation torch reports about a call of ours fails the test that made it, whether torch warns (pyproject's
`filterwarnings`) or logs (tests/conftest.py); one about someone else's call does not. Run through pytest itself on
tests/torch_deprecation_cases.py, so the rules are the ones every test runs under."""

import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

from .torch_deprecation_cases import CALLERS, CALLS

REPOSITORY = Path(__file__).resolve().parents[1]
# what the failure says, per call
REPORTS = {
    "upsample": "UserWarning: `nn.functional.upsample` is deprecated",
    "cpu_autocast": "FutureWarning: `torch.cpu.amp.autocast(args...)` is deprecated",
    "pytree_log": "transformers or torch reports a deprecated call of ours",
    "dynamo_log": "transformers or torch reports a deprecated call of ours",
}


def test_a_torch_deprecation_fails_a_test_when_the_call_is_ours(tmp_path: Path) -> None:
    report = tmp_path / "report.xml"
    command = [sys.executable, "-m", "pytest", "-p", "no:randomly", "-q", f"--junit-xml={report}"]
    run = subprocess.run(
        [*command, "tests/torch_deprecation_cases.py"], cwd=REPOSITORY, capture_output=True, text=True, timeout=300
    )
    assert report.exists(), run.stdout + run.stderr
    failures = {}
    for case in ElementTree.parse(report).iter("testcase"):
        problems = [
            child.get("message", "") + (child.text or "") for child in case if child.tag in ("failure", "error")
        ]
        failures[case.get("name")] = "\n".join(problems)
    for call in CALLS:
        for caller in CALLERS:
            failure = failures.pop(f"test[{call}-{caller}]")
            if caller == "someone_elses":
                assert not failure, f"{call} by someone else failed:\n{failure}"
            else:
                assert REPORTS[call] in failure, f"{call} by {caller}: {failure or 'passed'}"
    assert not failures, f"cases without an expectation: {sorted(failures)}"
