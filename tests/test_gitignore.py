"""Every example's default output (a trained folder, an export of one, a plot, an experiment's results) is ignored by
git: after `python -m examples.NAME` from the repository root, `git status` shows nothing new."""

import ast
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from examples.export import FORMATS

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(path for path in (REPO / "examples").rglob("*.py") if "helpers" not in path.parts)
# Scripts that write nothing of their own, or only a file whose name the user gives.
WRITE_NOTHING = {"__init__.py", "generate.py", "push_to_hub.py", "export.py"}  # export's default: <model>-<format>


def _text(node: ast.expr) -> str | None:
    """A string default as the script would make it: an f-string's fields stand for a name (`{name}` -> `name`)."""
    if isinstance(node, ast.Constant):
        return node.value if isinstance(node.value, str) else None
    if isinstance(node, ast.JoinedStr):
        return "".join(part.value if isinstance(part, ast.Constant) else "name" for part in node.values)
    return None


def default_outputs(script: Path) -> list[str]:
    """What `script` writes when no flag says where: a string `output_dir=` given to any call (`set_defaults`,
    `training.parse_arguments`: the Trainer's folder), the `default=` of an `--output` or `--output-dir` option, and
    for an experiment, the folder of `_shared.experiment_parser`."""
    outputs = []
    for node in ast.walk(ast.parse(script.read_text())):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        keywords = {keyword.arg: keyword.value for keyword in node.keywords}
        if "output_dir" in keywords:
            outputs.append(_text(keywords["output_dir"]))
        elif node.func.attr == "add_argument" and node.args and _text(node.args[0]) in ("--output", "--output-dir"):
            outputs.append(_text(keywords["default"]) if "default" in keywords else None)
        elif node.func.attr == "experiment_parser":
            outputs += default_outputs(script.with_name("_shared.py"))
    return [output for output in outputs if output is not None]


def ignored(path: str) -> bool:
    """Whether git ignores `path` (relative to the repository root), tracked or not."""
    result = subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=REPO, check=False)
    assert result.returncode in (0, 1), f"git check-ignore failed on {path!r}"
    return result.returncode == 0


@pytest.fixture(scope="module", autouse=True)
def _git_checkout():
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout: .gitignore means nothing here")


def test_every_script_that_writes_names_a_default_output():
    silent = [script.name for script in SCRIPTS if not default_outputs(script)]
    assert sorted(set(silent) - WRITE_NOTHING) == [], "a script writes where this test does not look"
    assert all(default_outputs(REPO / "examples" / name) == [] for name in WRITE_NOTHING - {"__init__.py"})


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: str(path.relative_to(REPO / "examples")))
def test_the_default_outputs_of_an_example_are_ignored(script):
    for output in default_outputs(script):
        inside = output if output.endswith(".png") else f"{output}/config.json"
        assert ignored(inside), f"{script.name} writes {output} by default: add /{output}/ to .gitignore"


def test_an_export_of_each_trained_folder_under_its_default_name_is_ignored():
    folders = [output for script in SCRIPTS for output in default_outputs(script) if output.startswith("turner-")]
    assert "turner-quickstart" in folders and len(folders) >= 6
    for folder, export_format in ((folder, name) for folder in folders for name in FORMATS):
        assert ignored(f"{folder}-{export_format}/config.json"), f"{folder}-{export_format}"


def docs_outputs() -> dict[str, str]:
    """The folders the commands in README.md and docs/ write (`--output-dir X` of an `examples.` run; a command
    continued with a backslash read as one line), each with a page that names it."""
    outputs = {}
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for line in re.sub(r"\\\n\s*", " ", page.read_text()).splitlines():
            if "-m examples." in line or "examples/" in line:
                for match in re.finditer(r"--output(?:-dir|_dir)?[ =]([^\s`'\"]+)", line):
                    outputs[match.group(1)] = page.name
    return outputs


def test_the_output_folders_of_the_docs_commands_are_ignored():
    outputs = docs_outputs()
    assert {"qs", "qs-onnx", "run"} <= set(outputs), outputs  # the parsing finds the commands it must
    for folder, page in outputs.items():
        assert ignored(f"{folder}/config.json"), f"{page} writes {folder}/: add /{folder}/ to .gitignore"


def test_the_repository_itself_is_not_ignored():
    """The patterns do not catch what is committed: the check can fail."""
    for path in ("README.md", "examples/quickstart.py", "docs/images/attention_text.png", "turner_tfm/__init__.py"):
        assert not ignored(path), path
