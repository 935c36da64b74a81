"""Command-line pieces every example shares: the same flag names (as in `TrainingArguments` and `TurnerConfig`,
with dashes), argument types that reject bad values with a clear message, and nothing heavy to import.

The scripts parse their arguments with these before they import torch or transformers, so `--help` and a bad flag
answer at once.
"""

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

LR_SCHEDULERS = ("linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup")
POSITION_EMBEDDING_TYPES = ("learned", "sinusoidal", "rotary", "none")


def _number(kind: type, low: float, low_inclusive: bool, high: float | None = None) -> Callable[[str], float]:
    """An argparse type that parses `kind` and checks it lies in the range; the message says what is valid."""
    bound = f">= {low}" if low_inclusive else f"> {low}"
    valid = f"a number in [{low}, {high})" if high is not None else f"{'an integer' if kind is int else 'a number'}"
    valid = valid if high is not None else f"{valid} {bound}"

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not valid: expected {valid}") from None
        too_low = value < low if low_inclusive else value <= low
        if too_low or (high is not None and value >= high):
            raise argparse.ArgumentTypeError(f"{text!r} is not valid: expected {valid}")
        return value

    parse.__name__ = kind.__name__
    return parse


positive_int = _number(int, 1, True)
non_negative_int = _number(int, 0, True)
positive_float = _number(float, 0.0, False)
non_negative_float = _number(float, 0.0, True)
probability = _number(float, 0.0, True, 1.0)
percentage = _number(float, 0.0, False, 100.0)


def existing_file(text: str) -> Path:
    """An argparse type for a file that must exist."""
    path = Path(text).expanduser()
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{text!r} is not valid: no such file")
    return path


def existing_dir(text: str) -> Path:
    """An argparse type for a folder that must exist."""
    path = Path(text).expanduser()
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is not valid: no such folder")
    return path


def new_parser(description: str) -> argparse.ArgumentParser:
    """A parser that shows each flag's default in `--help`."""
    return argparse.ArgumentParser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)


def add_training_arguments(
    parser: argparse.ArgumentParser,
    *,
    output_dir: str,
    max_steps: int = -1,
    num_train_epochs: float = 3.0,
    learning_rate: float = 1e-3,
    per_device_train_batch_size: int = 32,
    warmup_steps: float = 0.05,
    logging_steps: int = 25,
) -> None:
    """The `TrainingArguments` every script exposes, spelled as there with dashes; defaults per script."""
    group = parser.add_argument_group("training (as in transformers.TrainingArguments)")
    group.add_argument("--output-dir", default=output_dir, help="where the model, tokenizer and card are saved")
    group.add_argument(
        "--max-steps", type=int, default=max_steps, help="optimiser steps; -1 trains for --num-train-epochs"
    )
    group.add_argument("--num-train-epochs", type=positive_float, default=num_train_epochs)
    group.add_argument("--learning-rate", type=positive_float, default=learning_rate)
    group.add_argument("--per-device-train-batch-size", type=positive_int, default=per_device_train_batch_size)
    group.add_argument("--per-device-eval-batch-size", type=positive_int, default=64)
    group.add_argument("--gradient-accumulation-steps", type=positive_int, default=1)
    group.add_argument(
        "--warmup-steps",
        type=non_negative_float,
        default=warmup_steps,
        help="warm-up steps, or a fraction of all steps if below 1",
    )
    group.add_argument("--weight-decay", type=non_negative_float, default=0.01)
    group.add_argument("--lr-scheduler-type", choices=LR_SCHEDULERS, default="cosine")
    group.add_argument("--logging-steps", type=positive_int, default=logging_steps)
    group.add_argument(
        "--eval-steps", type=positive_int, default=None, help="evaluate every N steps (default: at the end)"
    )
    group.add_argument(
        "--save-steps", type=positive_int, default=None, help="save a checkpoint every N steps (default: never)"
    )
    group.add_argument("--seed", type=non_negative_int, default=42)
    group.add_argument(
        "--use-cpu",
        action="store_true",
        help="train on the CPU even if a GPU is there (automatic for several processes without a GPU)",
    )
    group.add_argument("--report-to", default="none", help="experiment tracker(s) for the Trainer, e.g. tensorboard")


def add_model_arguments(
    parser: argparse.ArgumentParser,
    *,
    hidden_size: int,
    num_hidden_layers: int,
    num_attention_heads: int,
    hidden_dropout: float = 0.0,
) -> None:
    """The `TurnerConfig` fields a script exposes for a model trained from scratch."""
    group = parser.add_argument_group("model from scratch (as in turner_tfm.TurnerConfig)")
    group.add_argument("--hidden-size", type=positive_int, default=hidden_size, help="D, features per token")
    group.add_argument("--num-hidden-layers", type=positive_int, default=num_hidden_layers, help="M, blocks")
    group.add_argument("--num-attention-heads", type=positive_int, default=num_attention_heads, help="H, heads")
    group.add_argument(
        "--intermediate-size", type=positive_int, default=None, help="MLP width (default: 4 x --hidden-size)"
    )
    group.add_argument("--hidden-dropout", type=probability, default=hidden_dropout)
    group.add_argument("--attention-dropout", type=probability, default=0.0)
    group.add_argument("--position-embedding-type", choices=POSITION_EMBEDDING_TYPES, default="learned")


def run_script(
    parser: argparse.ArgumentParser,
    run: Callable[[argparse.Namespace], None],
    argv: list[str] | None = None,
    *,
    requires: dict[str, str] | None = None,
    model_hint: str = "",
) -> None:
    """Parse and check the flags, then `run(args)`. Bad input found later (a `UsageError`: a missing column, an empty
    folder) is reported like a bad flag: usage, the message, exit status 2.

    `requires` maps a flag to one it needs (`{"test_file": "train_file"}`); `model_hint` is added to the error for a
    --model-name-or-path that is not a saved model.
    """
    args = parser.parse_args(argv)
    check_arguments(parser, args)
    if getattr(args, "model_name_or_path", None) is not None:
        check_model_path(parser, "--model-name-or-path", args.model_name_or_path, model_hint)
    for flag, needed in (requires or {}).items():
        if getattr(args, flag) is not None and getattr(args, needed) is None:
            parser.error(f"argument {_flag(flag)}: it needs {_flag(needed)} (the built-in data makes its own split)")
    try:
        run(args)
    except UsageError as error:
        parser.error(str(error))
    finally:
        _leave_process_group()


def _leave_process_group() -> None:
    """Under `accelerate launch`, wait for every process, then close the group: a process that exits while gloo's
    threads still run aborts ("terminate called without an active exception") and fails the whole launch."""
    torch_module = sys.modules.get("torch")
    if torch_module is None or not torch_module.distributed.is_available():
        return
    if torch_module.distributed.is_initialized():
        torch_module.distributed.barrier()
        torch_module.distributed.destroy_process_group()


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Checks that span several flags; a failure exits with a message naming the flags, values and what is valid."""
    if args.max_steps == 0 or args.max_steps < -1:
        parser.error(f"argument --max-steps: {args.max_steps} is not valid: expected an integer >= 1, or -1")
    hidden, heads = getattr(args, "hidden_size", None), getattr(args, "num_attention_heads", None)
    if hidden is not None and heads is not None and hidden % heads:
        parser.error(
            f"argument --hidden-size: {hidden} is not valid: it must be divisible by --num-attention-heads {heads}"
        )
    image, patch = getattr(args, "image_size", None), getattr(args, "patch_size", None)
    if image is not None and patch is not None and image % patch:
        parser.error(f"argument --patch-size: {patch} is not valid: it must divide --image-size {image}")


class UsageError(ValueError):
    """Bad input found once the data is read (a missing column, an empty folder); the script reports it like a bad
    flag: usage, then the message, exit status 2."""


def check_model_path(parser: argparse.ArgumentParser, flag: str, path: str | None, hint: str = "") -> None:
    """A checkpoint named on the command line must be a saved model folder, unless it looks like a Hub repo id."""
    if path is None:
        return
    looks_like_repo_id = path.count("/") == 1 and not path.startswith((".", "/", "~")) and not os.path.exists(path)
    if not looks_like_repo_id and not os.path.isfile(os.path.join(path, "config.json")):
        parser.error(
            f"argument {flag}: {path!r} is not valid: no saved model folder (with a config.json) there. {hint}"
        )


def add_text_data_arguments(parser: argparse.ArgumentParser, default: str) -> None:
    """Where a language model's text comes from: a file, a `datasets` dataset, or the built-in `default` corpus."""
    group = parser.add_argument_group(f"text data (default: {default})")
    source = group.add_mutually_exclusive_group()
    source.add_argument("--train-file", type=existing_file, default=None, help="a UTF-8 text file")
    source.add_argument(
        "--dataset-name", default=None, help="a `datasets` dataset: a Hub id or a local folder of data files"
    )
    group.add_argument("--dataset-config-name", default=None, help="the dataset's configuration, if it has several")
    group.add_argument("--dataset-split", default="train", help="the split to read")
    group.add_argument("--text-column", default="text", help="the dataset column that holds the text")
    group.add_argument("--validation-split-percentage", type=percentage, default=5.0, help="held-out share of the text")
    group.add_argument("--block-size", type=positive_int, default=128, help="tokens per training sequence")


def add_sample_arguments(parser: argparse.ArgumentParser, prompt: str) -> None:
    """The sample a language-model script prints at the end."""
    group = parser.add_argument_group("sample")
    group.add_argument("--prompt", default=prompt, help="start of the sample printed at the end")
    group.add_argument("--max-new-tokens", type=positive_int, default=100, help="length of the sample")


def add_classification_data_arguments(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """The held-out split every classifier script shares; returns the group for the script's own data flags."""
    group = parser.add_argument_group("data")
    group.add_argument(
        "--test-split-percentage",
        type=percentage,
        default=20.0,
        help="share of the data held out for the test accuracy, when no separate test data is given",
    )
    return group
