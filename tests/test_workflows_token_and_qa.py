"""The token-classification and question-answering workflows, run as a user runs them (one interpreter, CPU,
offline, tiny sizes): each trains on its built-in task, saves a folder that its pipeline or the card's usage snippet
reads, and names bad data in one line; and the commands docs/workflows.md shows for your own text end in one line
when the file or folder they name is not there."""

import json
import re
import shlex
from pathlib import Path

import pytest
from huggingface_hub import ModelCard
from transformers import pipeline

from examples.helpers import training
from turner_tfm import TurnerForQuestionAnswering, TurnerForTokenClassification
from turner_tfm.pretrained_turner import AUTO_CLASSES

from .once import made_once
from .workflow_utils import (
    TINY_MODEL,
    WORKFLOWS_PAGE,
    checked_output,
    listed_files,
    printed_number,
    run_examples_unchecked,
    run_module,
    training_losses,
)

TINY = ("--logging-steps", "5", "--per-device-train-batch-size", "16", *TINY_MODEL)
RUNS = {
    "tokens": ("train_token_classifier.py", "--lines", "300", "--num-train-epochs", "3", "--max-length", "64", *TINY),
    "tokens from a file": (
        "train_token_classifier.py",
        *("--train-file", "ner.jsonl", "--tokens-column", "words", "--tags-column", "ner", "--output-dir", "ner"),
        *("--max-steps", "2", *TINY),
    ),
    "qa": ("train_question_answering.py", "--questions", "400", "--num-train-epochs", "3", "--output-dir", "qa", *TINY),
    "no such column": ("train_token_classifier.py", "--train-file", "ner.jsonl"),
    "answer not in context": ("train_question_answering.py", "--train-file", "qa.jsonl"),
    "no such file": ("train_question_answering.py", "--train-file", "missing.jsonl"),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, tuple[int, str]]]:
    """Every run of `RUNS` in one interpreter: their folder, and each run's (exit status, output) by name. Made once for
    the session (`made_once`: not once per pytest-xdist worker)."""

    def make(folder: Path) -> dict:
        with (folder / "ner.jsonl").open("w") as file:
            for i in range(8):
                words = {"words": ["Ada", "met", "Alan", f"in {i}"], "ner": ["PER", "O", "PER", "O"]}
                file.write(json.dumps(words) + "\n")
        (folder / "qa.jsonl").write_text(json.dumps({"question": "Who?", "context": "Ada wrote it.", "answer": "Alan"}))
        return dict(zip(RUNS, run_examples_unchecked(list(RUNS.values()), tmp_path=folder), strict=True))

    return made_once(tmp_path_factory, "token-and-qa", make)


def test_token_classifier_learns_the_kinds_of_python_tokens_and_tags_in_the_pipeline(runs) -> None:
    folder, output = runs[0], checked_output(*runs[1]["tokens"])
    assert "tags ['keyword', 'name', 'number', 'op', 'string']" in output, output[-3000:]
    losses = training_losses(output)
    assert losses[-1] < losses[0] - 0.5, f"the loss did not fall: {losses}"
    assert printed_number(output, "test accuracy:") >= 0.6, output[-3000:]
    assert "pipeline('token-classification') on " in output, output[-3000:]
    documented = listed_files(WORKFLOWS_PAGE.read_text(), "saved to turner-token-classifier/")
    assert listed_files(output, "saved to") == documented, "the script saved other files than the page shows"

    model_dir = folder / "turner-token-classifier"
    tagger = pipeline("token-classification", model=str(model_dir))
    assert isinstance(tagger.model, TurnerForTokenClassification) and not tagger.model.config.is_causal
    tags = {token["entity"] for token in tagger("return len(items) + 1")}
    assert tags and tags <= {"keyword", "name", "number", "op", "string"}, tags
    card = ModelCard.load(model_dir / "README.md")
    assert card.data.pipeline_tag == "token-classification" and card.data.eval_results[0].metric_type == "accuracy"
    assert "`keyword`, `name`, `number`, `op`, `string`" in card.text, card.text


def test_token_classifier_reads_words_and_tags_from_a_json_lines_file(runs) -> None:
    folder, output = runs[0], checked_output(*runs[1]["tokens from a file"])
    assert "data: ner, 6 training and 2 test lines, tags ['O', 'PER']" in output, output[-3000:]
    assert TurnerForTokenClassification.from_pretrained(folder / "ner").config.id2label == {0: "O", 1: "PER"}


def test_question_answering_trains_and_the_cards_snippet_reads_an_answer(runs, monkeypatch, capsys) -> None:
    folder, output = runs[0], checked_output(*runs[1]["qa"])
    losses = training_losses(output)
    assert losses[-1] < losses[0] - 0.5, f"the loss did not fall: {losses}"
    assert 0 <= printed_number(output, "held-out exact match") <= printed_number(output, "F1") <= 1, output[-3000:]
    context, answer = (re.search(rf"^{name}: '(.*)'$", output, re.MULTILINE).group(1) for name in ("context", "answer"))
    assert answer and answer in context, output[-3000:]
    documented = listed_files(WORKFLOWS_PAGE.read_text(), "saved to turner-question-answering/")
    assert listed_files(output, "saved to") == documented, "the script saved other files than the page shows"

    card = ModelCard.load(folder / "qa" / "README.md")
    assert card.data.pipeline_tag == "question-answering"
    assert {result.metric_type for result in card.data.eval_results} == {"exact_match", "f1"}
    snippet = re.search(r"```python\n(.*?)```", card.text, re.DOTALL).group(1)
    monkeypatch.chdir(folder)  # the card loads its folder as `model_id = "qa"`
    exec(compile(snippet, "card-snippet", "exec"), {})  # the card's own usage code, as a user runs it
    printed = capsys.readouterr().out.strip()
    assert printed and printed in context, printed  # a span of the card's example context
    assert 'model_id = "qa"' in snippet and isinstance(
        TurnerForQuestionAnswering.from_pretrained(folder / "qa"), TurnerForQuestionAnswering
    )


def test_bad_data_ends_in_one_line_that_names_it(runs) -> None:
    results = runs[1]
    no_column = checked_output(*results["no such column"], expect_failure=True)
    assert no_column.strip().splitlines()[-1] == (
        "train_token_classifier.py: error: --tokens_column 'tokens' is not valid: 'ner.jsonl' has ['words', 'ner']"
    )
    not_in_context = checked_output(*results["answer not in context"], expect_failure=True)
    assert not_in_context.strip().splitlines()[-1] == (
        "train_question_answering.py: error: 'qa.jsonl', row 1: the answer 'Alan' is not in its context"
    )
    missing = checked_output(*results["no such file"], expect_failure=True)
    assert "error: --train_file 'missing.jsonl' is not valid: no such file in " in missing.strip().splitlines()[-1]
    assert all("Traceback" not in text for text in (no_column, not_in_context, missing))


def documented_command(start: str) -> list[str]:
    """The arguments of the one command of docs/workflows.md that starts with `start`."""
    (line,) = [line for line in WORKFLOWS_PAGE.read_text().splitlines() if line.startswith(start)]
    return shlex.split(line.removeprefix(start))


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ("--dataset-name my_data", "--dataset_name 'my_data' is not valid: no folder of that name in "),
        ("--model-name-or-path ./turner-quickstart", "--model_name_or_path './turner-quickstart' is not valid"),
    ],
)
def test_the_pages_own_commands_end_in_one_line_where_their_files_are_missing(
    arguments: str, message: str, tmp_path: Path, monkeypatch, capsys
) -> None:
    argv = documented_command(f"python -m examples.train_causal_lm {arguments}")
    monkeypatch.chdir(tmp_path)  # a new user's folder: no my_data, zen.txt or turner-quickstart there
    with pytest.raises(SystemExit) as stopped:
        run_module("examples.train_causal_lm", [*arguments.split(), *argv], monkeypatch)
    code = stopped.value.code  # argparse's status 2 after its usage and line, or `run`'s line
    said = capsys.readouterr().err + (code if isinstance(code, str) else "")
    last = said.strip().splitlines()[-1]
    assert message in last and "Traceback" not in said, said[-2000:]


def test_a_usage_error_inside_a_run_ends_in_one_line(monkeypatch) -> None:
    def main() -> None:
        raise training.UsageError("--train_file 'x' is not valid")

    monkeypatch.setattr("sys.argv", ["train_x.py"])
    with pytest.raises(SystemExit) as stopped:
        training.run(main)
    assert stopped.value.code == "train_x.py: error: --train_file 'x' is not valid"


def test_the_page_lists_every_auto_class_a_saved_folder_names() -> None:
    page = " ".join(WORKFLOWS_PAGE.read_text().split())
    for modality, classes in (("text", AUTO_CLASSES["text"]), ("images", AUTO_CLASSES["image"])):
        listed = re.search(rf"{modality}: ((?:`\w+`(?:,| and| or)? ?)+)", page)
        assert listed, modality
        assert set(re.findall(r"`(\w+)`", listed.group(1))) == set(classes), (modality, listed.group(1))
