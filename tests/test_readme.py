"""README's first screen as a new user meets it: what the project is, every head by name, and a Python snippet within
the first 25 lines that runs as written and prints what its comments say (`print(...)  # what it prints`). It is the
snippet `tests/test_doc_snippets.py` finds first on the page, run the same way (a fresh interpreter, a folder of its
own, offline, the CPU); this file adds the check of its output. And what README must not hold or lose: no dates and no
load averages (those live beside the figures: `benchmarks/results/`, CHANGELOG.md), and the test command that
`.ci/run` runs in every lane."""

import re
from pathlib import Path

import turner_tfm

from .test_doc_snippets import Snippet, run_snippet, snippets

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
FIRST_SCREEN = 25  # lines
HEADS = 7
# a line a library logs to stdout on its own, not the snippet's (DeepSpeed's accelerator notice, where it is installed)
LOG_RECORD = re.compile(r"^\[\d{4}-\d\d-\d\d [\d:,.]+\] \[[A-Z]+\]")
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
LOAD = re.compile(r"\bload(?: average)?s?:?\s+\d|load average", re.IGNORECASE)
LINK_TARGET = re.compile(r"\]\([^)\s]*\)")
TEST_COMMAND = "python -m pytest -n auto"


def first_screen() -> str:
    return "\n".join(README.read_text(encoding="utf-8").splitlines()[:FIRST_SCREEN])


def first_snippet() -> Snippet:
    return snippets(README)[0]


def printed_comments(code: str) -> list[str]:
    """What each `print(...)  # X` line of `code` says it prints, in order."""
    return re.findall(r"^print\(.*\)\s+#\s*(.+?)\s*$", code, flags=re.MULTILINE)


def output_problems(code: str, stdout: str) -> list[str]:
    """How the lines `code` printed (libraries' own log records left out) differ from what its comments say."""
    expected = printed_comments(code)
    printed = [line for line in stdout.splitlines() if not LOG_RECORD.match(line)]
    if not expected:
        return ["no `print(...)  # what it prints` line: nothing a reader can check"]
    return [] if printed == expected else [f"printed {printed}, its comments say {expected}"]


def dates_and_loads(text: str) -> list[str]:
    """The dates and load averages of `text`, link targets left out (a cited JSON's folder is named by its day)."""
    prose = LINK_TARGET.sub("]()", text)
    return [match.group(0) for pattern in (DATE, LOAD) for match in pattern.finditer(prose)]


def test_the_first_screen_says_what_it_is_and_names_every_head():
    screen = first_screen()
    for said in ("`transformers`", 'model_type="turner"', "An Introduction to Transformers"):
        assert said in screen, f"README's first screen does not say {said}"
    named = set(re.findall(r"`(TurnerFor\w+)`", screen))
    exported = {name for name in turner_tfm.__all__ if name.startswith("TurnerFor")}
    assert exported <= named, f"heads the package exports and README's first screen does not name: {exported - named}"
    assert len(named) == HEADS, sorted(named)


def test_the_first_snippet_is_on_the_first_screen_and_runs_on_its_own():
    snippet = first_snippet()
    end = snippet.line + snippet.code.count("\n") + 1  # its closing fence
    assert end <= FIRST_SCREEN, f"README's first snippet ends on line {end}, past the first {FIRST_SCREEN}"
    assert snippet.marker is None, "the first snippet needs nothing run before it"


def test_the_first_snippet_prints_what_its_comments_say(tmp_path: Path):
    snippet = first_snippet()
    result = run_snippet(snippet.code, tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    assert output_problems(snippet.code, result.stdout) == []


def test_a_wrong_printed_comment_is_caught():
    code = first_snippet().code
    printed = "\n".join(printed_comments(code))
    assert output_problems(code, printed) == []
    assert output_problems(code, "[2026-11-29 02:05:04,855] [WARNING] [x.py:1:f] a notice\n" + printed) == []
    wrong = code.replace("# True", "# False")
    assert wrong != code and output_problems(wrong, printed)
    assert output_problems("print(1)\n", "1\n")  # a print without a comment saying what it prints


def test_readme_holds_no_dates_or_load_averages():
    assert dates_and_loads(README.read_text(encoding="utf-8")) == []
    assert dates_and_loads("measured on 2026-11-27, load 0.6 to 1.2") == ["2026-11-27", "load 0"]
    assert dates_and_loads("[x.json](benchmarks/results/2026-11-27/x.json); load it with from_pretrained") == []


def test_readme_gives_the_test_command_ci_runs():
    readme = README.read_text(encoding="utf-8")
    section = readme[readme.index("\n## Run the tests\n") :]
    assert re.search(rf"^{re.escape(TEST_COMMAND)}\b", section, flags=re.MULTILINE), "README's test command changed"
    assert re.search(r"-m pytest -n auto\b", (REPO / ".ci" / "run").read_text()), ".ci/run runs another command"
