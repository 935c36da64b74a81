"""Every Python snippet of README.md and docs/*.md runs on its own as written: each in a fresh interpreter (a user
pasting it into a new file), in a folder of its own, on the CPU, offline.

A snippet that needs what an earlier command on its page makes says so in an HTML comment on the line above it:
`<!-- snippet: after python -m examples.quickstart -->` (several commands: separated by `;`). The command must be on
the same page, as the user runs it; the test runs it first, with tiny sizes, and the snippet runs beside its outputs.
A snippet that cannot run here at all (another environment, the real Hub) says why: `<!-- snippet: needs REASON -->`,
and is only checked to say it. Every other snippet runs as it is."""

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from .once import made_once
from .workflow_utils import TINY_MODEL, run_examples, script_env

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
MARKER = re.compile(r"<!--\s*snippet:\s*(\w+)\s*(.*?)\s*-->")
SETUP = re.compile(r"python -m examples\.(\w+)((?: [^;]*)?)$")
# The flags that make an example's run tiny (a flag given twice: the last wins), by example.
TINY_RUNS = {
    "quickstart": ["--max-steps", "2", "--max-new-tokens", "2", "--block-size", "32", *TINY_MODEL],
    "train_image_classifier": ["--max-steps", "2", *TINY_MODEL],
}


@dataclass(frozen=True)
class Snippet:
    page: Path
    line: int  # of the opening fence, 1-based
    code: str
    marker: tuple[str, str] | None  # (kind, what it says) of the comment above it

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"

    @property
    def setups(self) -> list[str]:
        """The commands to run before it: `python -m examples.NAME ARGS`."""
        return [command.strip() for command in self.marker[1].split(";")] if self.marker_kind == "after" else []

    @property
    def marker_kind(self) -> str | None:
        return self.marker[0] if self.marker else None


def snippets(page: Path) -> list[Snippet]:
    """The ```python blocks of `page`, each with the `<!-- snippet: ... -->` comment on the line above it, if any."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found = []
    for index, line in enumerate(lines):
        if line.strip() != "```python":
            continue
        end = next(i for i in range(index + 1, len(lines)) if lines[i].strip() == "```")
        above = MARKER.search(lines[index - 1]) if index else None
        found.append(Snippet(page, index + 1, "\n".join(lines[index + 1 : end]) + "\n", above and above.groups()))
    return found


SNIPPETS = [snippet for page in PAGES for snippet in snippets(page)]
RUNNABLE = [snippet for snippet in SNIPPETS if snippet.marker_kind != "needs"]
# a snippet that imports the export or quant extra needs their torch, 2.13 (pyproject's torch_2_13 marker)
NEWER_TORCH_EXTRAS = re.compile(r"^\s*(from|import) (torchao|bitsandbytes|onnx\w*|executorch)\b", re.MULTILINE)


def runnable(snippet: Snippet) -> object:
    needs_torch_2_13 = NEWER_TORCH_EXTRAS.search(snippet.code)
    return pytest.param(
        snippet,
        marks=[pytest.mark.torch_2_13(reason="it imports the export or quant extra")] if needs_torch_2_13 else [],
    )


def setup_run(command: str) -> tuple[str, ...]:
    """`python -m examples.NAME ARGS` as a tiny run of `run_examples`: ("NAME.py", *ARGS, *tiny flags)."""
    match = SETUP.match(command)
    assert match, f"{command!r}: a setup is `python -m examples.NAME ARGS`"
    name, args = match.group(1), match.group(2).split()
    assert name in TINY_RUNS, f"{command!r}: add the flags of a tiny run of examples.{name} to TINY_RUNS"
    return (f"{name}.py", *args, *TINY_RUNS[name])


@pytest.fixture(scope="module")
def setups(tmp_path_factory) -> Path:
    """One folder with the outputs of every setup command the snippets name, each run once, tiny, in one process,
    for the whole session (`made_once`: not once per pytest-xdist worker)."""

    def make(folder: Path) -> None:
        commands = sorted({command for snippet in RUNNABLE for command in snippet.setups})
        if commands:
            run_examples([setup_run(command) for command in commands], tmp_path=folder, timeout=600)

    folder, _ = made_once(tmp_path_factory, "doc-snippet-setups", make)
    return folder


def test_the_pages_have_snippets_and_every_marker_is_understood():
    assert len(SNIPPETS) >= 8 and len(RUNNABLE) >= 6, [snippet.name for snippet in SNIPPETS]
    for snippet in SNIPPETS:
        kind, said = snippet.marker or ("run", "")
        assert kind in ("run", "after", "needs"), f"{snippet.name}: unknown marker <!-- snippet: {kind} ... -->"
        if kind == "needs":
            assert len(said.split()) >= 3, f"{snippet.name}: say what it needs, and why it cannot run here"
        page = snippet.page.read_text(encoding="utf-8")
        for command in snippet.setups:
            setup_run(command)
            assert page.count(command) >= 2, f"{snippet.name}: the page does not tell the user to run {command!r}"


def run_snippet(code: str, folder: Path) -> subprocess.CompletedProcess:
    """`code` saved as `folder/snippet.py` and run there as a user pasting it would: a fresh interpreter, offline."""
    (folder / "snippet.py").write_text(code, encoding="utf-8")
    return subprocess.run(
        [sys.executable, "snippet.py"],
        cwd=folder,
        env=script_env(folder, CUDA_VISIBLE_DEVICES=""),
        capture_output=True,
        text=True,
        timeout=600,
    )


# README's first snippet runs in tests/test_readme.py, which also checks what it prints: not a second time here
RUN_HERE = [snippet for snippet in RUNNABLE if snippet != snippets(PAGES[0])[0]]


@pytest.mark.parametrize("snippet", [runnable(snippet) for snippet in RUN_HERE], ids=lambda snippet: snippet.name)
def test_a_snippet_runs_on_its_own_as_written(snippet: Snippet, setups: Path, tmp_path: Path):
    for made in setups.iterdir():  # the folders the setup commands made, beside the snippet as on the user's disk
        if made.is_dir() and made.name != "hf-home":
            (tmp_path / made.name).symlink_to(made)
    result = run_snippet(snippet.code, tmp_path)
    assert result.returncode == 0, f"{snippet.name} failed:\n{snippet.code}\n{(result.stdout + result.stderr)[-4000:]}"
