"""The classifier workflows, run as a user runs them: text classification on the built-in task, image
classification on an image folder, bad data named clearly; the full-size digits run behind the `slow` marker."""

from pathlib import Path

import numpy as np
import pytest
from huggingface_hub import ModelCard
from PIL import Image
from transformers import pipeline

from .once import made_once
from .workflow_utils import (
    TINY_MODEL,
    WORKFLOWS_PAGE,
    checked_output,
    listed_files,
    printed_number,
    run_example,
    run_examples_unchecked,
    training_losses,
)


def write_digit_folder(root: Path, classes: tuple[int, ...], per_class: int) -> None:
    """scikit-learn digits as PNG files in `root/<digit>/`, enlarged to 16x16 like photos of other sizes."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    for digit in classes:
        (root / str(digit)).mkdir(parents=True)
        for i, pixels in enumerate(digits.images[digits.target == digit][:per_class]):
            image = Image.fromarray((pixels * 255 / 16).astype(np.uint8), mode="L").resize((16, 16))
            image.save(root / str(digit) / f"{i}.png")


# The runs that give bad data, and what each must say
BAD_DATA = {
    "empty": ("train_image_classifier.py", "--train-dir", "empty"),
    "patch": ("train_image_classifier.py", "--patch-size", "3"),
    "table": ("train_text_classifier.py", "--train-file", "data.txt"),
    "test only": ("train_text_classifier.py", "--test-file", "x.csv"),
}


@pytest.fixture(scope="module")
def classifier_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, tuple[int, str]]]:
    """The runs of the tests below, in one interpreter (`run_examples_unchecked`: each interpreter costs ~8 s of
    imports): a text classifier trained on the built-in task (into `cp`), an image classifier on a folder of digits
    (into `img`), and the `BAD_DATA` runs. Returns their folder and each run's (exit status, output) by name: each
    test checks its own runs with `checked_output`, so a broken run fails its test only. Made once for the session
    (`made_once`: not once per pytest-xdist worker)."""

    def make(folder: Path) -> dict[str, tuple[int, str]]:
        write_digit_folder(folder / "digits", classes=(0, 1, 7), per_class=40)
        (folder / "empty" / "cats").mkdir(parents=True)
        (folder / "data.txt").write_text("not a table")
        runs = {
            "text": (
                "train_text_classifier.py",
                *("--examples-per-class", "200", "--num-train-epochs", "3", "--logging-steps", "5"),
                *("--output-dir", "cp", "--per-device-train-batch-size", "16", "--max-length", "64", *TINY_MODEL),
            ),
            "image": (
                "train_image_classifier.py",
                *("--train-dir", "digits", "--image-size", "8", "--patch-size", "4", "--output-dir", "img"),
                *("--num-train-epochs", "8", "--logging-steps", "10", "--per-device-train-batch-size", "16"),
                *TINY_MODEL,
            ),
            **BAD_DATA,
        }
        return dict(zip(runs, run_examples_unchecked(list(runs.values()), tmp_path=folder), strict=True))

    return made_once(tmp_path_factory, "classifiers", make)


def test_text_classifier_learns_the_built_in_code_or_prose_task(classifier_runs: tuple[Path, dict]) -> None:
    folder, output = classifier_runs[0], checked_output(*classifier_runs[1]["text"])
    accuracy = printed_number(output, "test accuracy:")
    assert accuracy >= 0.75, output[-3000:]
    losses = training_losses(output)
    assert losses[-1] < losses[0], f"the loss did not fall: {losses}"
    assert "pipeline('text-classification'):" in output, output[-3000:]
    assert "-> code (" in output or "-> prose (" in output, output[-3000:]

    classifier = pipeline("text-classification", model=str(folder / "cp"))
    labels = {classifier("x = 1")[0]["label"], classifier("Return the sum.")[0]["label"]}
    assert labels <= {"code", "prose"}, labels
    card = ModelCard.load(folder / "cp" / "README.md")
    assert card.data.pipeline_tag == "text-classification", card.data.pipeline_tag
    assert card.data.eval_results[0].metric_type == "accuracy", card.data.eval_results
    assert "`code`, `prose`" in card.text or "`prose`, `code`" in card.text, card.text


def test_image_classifier_trains_on_an_image_folder_and_saves_its_processor(
    classifier_runs: tuple[Path, dict],
) -> None:
    folder, output = classifier_runs[0], checked_output(*classifier_runs[1]["image"])
    assert "data: digits, 96 training and 24 test images, 3 classes" in output, output[-3000:]
    assert printed_number(output, "test accuracy:") >= 0.6, output[-3000:]
    assert (folder / "img" / "preprocessor_config.json").is_file(), "no image processor saved"
    documented = listed_files(WORKFLOWS_PAGE.read_text(), "saved to ./turner-image-classifier/")
    assert listed_files(output, "saved to") == documented, "the script saved other files than the page shows"

    classifier = pipeline("image-classification", model=str(folder / "img"))
    predictions = classifier(Image.open(folder / "digits" / "7" / "0.png"))
    assert {p["label"] for p in predictions} == {"0", "1", "7"}, predictions
    card = ModelCard.load(folder / "img" / "README.md")
    assert card.data.pipeline_tag == "image-classification" and card.data.datasets == ["digits"], card.data
    assert "8x8 images, 4x4 patches (4 + class token)" in card.text, card.text


def test_classifier_scripts_name_bad_data_clearly(classifier_runs: tuple[Path, dict]) -> None:
    empty, patch, table, test_only = (
        checked_output(*classifier_runs[1][name], expect_failure=True) for name in BAD_DATA
    )
    assert "ValueError: no images (.png, " in empty and "class sub-folders of 'empty'" in empty, empty[-2000:]
    assert "`patch_size`=3 is invalid" in patch and "Traceback" not in patch, patch[-2000:]  # refused as it is parsed
    expected_table = "--train_file 'data.txt' is not valid: expected a .csv, .json, .jsonl file"
    assert expected_table in table, table[-2000:]
    assert "--test_file needs --train_file" in test_only and "Traceback" not in test_only, test_only[-2000:]


@pytest.mark.slow
def test_image_classifier_defaults_reach_95_percent_on_the_digits(tmp_path: Path) -> None:
    output = run_example("train_image_classifier.py", tmp_path=tmp_path, timeout=1200)
    print(output)  # the numbers docs/workflows.md quotes: shown with `pytest -s`
    assert printed_number(output, "test accuracy:") >= 0.95, output[-3000:]
