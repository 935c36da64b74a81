"""The classifier workflows, run as a user runs them: text classification on the built-in task, image
classification on an image folder, bad data named clearly; the full-size digits run behind the `slow` marker."""

from pathlib import Path

import numpy as np
import pytest
from huggingface_hub import ModelCard
from PIL import Image
from transformers import pipeline

from .workflow_utils import (
    TINY_MODEL,
    WORKFLOWS_PAGE,
    listed_files,
    printed_number,
    run_example,
    run_examples,
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


def test_text_classifier_learns_the_built_in_code_or_prose_task(tmp_path: Path) -> None:
    output = run_example(
        "train_text_classifier.py",
        *("--examples-per-class", "200", "--num-train-epochs", "3", "--logging-steps", "5", "--output-dir", "cp"),
        *("--per-device-train-batch-size", "16", "--max-length", "64", *TINY_MODEL),
        tmp_path=tmp_path,
    )
    accuracy = printed_number(output, "test accuracy:")
    assert accuracy >= 0.75, output[-3000:]
    losses = training_losses(output)
    assert losses[-1] < losses[0]
    assert "pipeline('text-classification'):" in output
    assert "-> code (" in output or "-> prose (" in output

    classifier = pipeline("text-classification", model=str(tmp_path / "cp"))
    assert {classifier("x = 1")[0]["label"], classifier("Return the sum.")[0]["label"]} <= {"code", "prose"}
    card = ModelCard.load(tmp_path / "cp" / "README.md")
    assert card.data.pipeline_tag == "text-classification"
    assert card.data.eval_results[0].metric_type == "accuracy"
    assert "`code`, `prose`" in card.text or "`prose`, `code`" in card.text


def test_image_classifier_trains_on_an_image_folder_and_saves_its_processor(tmp_path: Path) -> None:
    write_digit_folder(tmp_path / "digits", classes=(0, 1, 7), per_class=40)
    output = run_example(
        "train_image_classifier.py",
        *("--train-dir", "digits", "--image-size", "8", "--patch-size", "4", "--output-dir", "img"),
        *("--num-train-epochs", "8", "--logging-steps", "10", "--per-device-train-batch-size", "16", *TINY_MODEL),
        tmp_path=tmp_path,
    )
    assert "data: digits, 96 training and 24 test images, 3 classes" in output
    assert printed_number(output, "test accuracy:") >= 0.6, output[-3000:]
    assert (tmp_path / "img" / "preprocessor_config.json").is_file()
    documented = listed_files(WORKFLOWS_PAGE.read_text(), "saved to ./turner-image-classifier/")
    assert listed_files(output, "saved to") == documented

    classifier = pipeline("image-classification", model=str(tmp_path / "img"))
    predictions = classifier(Image.open(tmp_path / "digits" / "7" / "0.png"))
    assert {p["label"] for p in predictions} == {"0", "1", "7"}
    card = ModelCard.load(tmp_path / "img" / "README.md")
    assert card.data.pipeline_tag == "image-classification" and card.data.datasets == ["digits"]
    assert "8x8 images, 4x4 patches (4 + class token)" in card.text


def test_classifier_scripts_name_bad_data_clearly(tmp_path: Path) -> None:
    (tmp_path / "empty" / "cats").mkdir(parents=True)
    (tmp_path / "data.txt").write_text("not a table")
    empty, patch, table, test_only = run_examples(
        [
            ("train_image_classifier.py", "--train-dir", "empty"),
            ("train_image_classifier.py", "--patch-size", "3"),
            ("train_text_classifier.py", "--train-file", "data.txt"),
            ("train_text_classifier.py", "--test-file", "x.csv"),
        ],
        tmp_path=tmp_path,
        expect_failure=True,
    )
    assert "ValueError: no images (.png, " in empty and "class sub-folders of 'empty'" in empty
    assert "`patch_size`=3 is invalid" in patch and "Traceback" not in patch  # refused as it is parsed
    assert "--train_file 'data.txt' is not valid: expected a .csv, .json, .jsonl file" in table
    assert "--test_file needs --train_file" in test_only and "Traceback" not in test_only


@pytest.mark.slow
def test_image_classifier_defaults_reach_95_percent_on_the_digits(tmp_path: Path) -> None:
    output = run_example("train_image_classifier.py", tmp_path=tmp_path, timeout=1200)
    print(output)  # the numbers docs/workflows.md quotes: shown with `pytest -s`
    assert printed_number(output, "test accuracy:") >= 0.95, output[-3000:]
