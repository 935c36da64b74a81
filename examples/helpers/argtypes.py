"""argparse value types for the scripts that train nothing (export, generate, plots, Hub upload, experiments): each
refuses a bad value with what is valid, as `argument --flag: 'value' is not valid: expected ...`."""

import argparse
import os
from collections.abc import Callable
from pathlib import Path


def _number(kind: type, low: float, low_inclusive: bool, high: float | None = None) -> Callable[[str], float]:
    """An argparse type that parses `kind` and checks it lies in the range."""
    valid = f"a number in [{low}, {high})" if high is not None else "an integer" if kind is int else "a number"
    valid = valid if high is not None else f"{valid} {'>=' if low_inclusive else '>'} {low}"

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
probability = _number(float, 0.0, True, 1.0)


def existing_file(text: str) -> Path:
    """A file that must exist."""
    if not Path(text).expanduser().is_file():
        raise argparse.ArgumentTypeError(f"{text!r} is not valid: no such file")
    return Path(text).expanduser()


def existing_dir(text: str) -> Path:
    """A folder that must exist."""
    if not Path(text).expanduser().is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is not valid: no such folder")
    return Path(text).expanduser()


def saved_model(text: str) -> str:
    """A saved model folder (with a config.json), or what looks like a Hub repo id (`namespace/name`)."""
    looks_like_repo_id = text.count("/") == 1 and not text.startswith((".", "/", "~")) and not os.path.exists(text)
    if not looks_like_repo_id and not os.path.isfile(os.path.join(text, "config.json")):
        raise argparse.ArgumentTypeError(f"{text!r} is not valid: no saved model folder (with a config.json) there")
    return text
