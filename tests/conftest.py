"""Test session setup: offline, deterministic; nothing here reaches the network.

A deprecation that transformers reports about a call of ours fails the test that made it: as a warning, by the
`filterwarnings` rules in pyproject.toml (scoped to warnings attributed to our modules); as a log record (transformers
logs some deprecations, e.g. of the cache's old name, with `logger.warning_once`), by `_no_deprecated_calls` below.
"""

import logging
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest
import torch

import turner_tfm  # noqa: F401  (registers "turner" with the Auto classes)

from .wheel_utils import InstalledWheel, build_and_install

REPOSITORY = Path(__file__).resolve().parents[1]
# Our code: the package (installed or from a saved folder's remote code), and the repository's converter and examples.
OUR_MODULES = ("turner_tfm", "transformers_modules")
OUR_FOLDERS = tuple(str(REPOSITORY / folder) for folder in ("turner_tfm", "convert", "examples"))
# Frames between a log record and the call that caused it: logging's own, and transformers' (at most
# `DEPTH_OF_A_CALL` of those: a deprecation logged deeper is transformers' own call, e.g. assisted decoding calling
# the assistant's generate() with arguments it deprecates).
MACHINERY = ("logging", "functools")
DEPTH_OF_A_CALL = 3


def _is_ours(frame) -> bool:
    module = frame.f_globals.get("__name__", "")
    return module.startswith(OUR_MODULES) or frame.f_code.co_filename.startswith(OUR_FOLDERS)


def _module_root(frame) -> str:
    return frame.f_globals.get("__name__", "").split(".")[0]


def _caller_of_transformers(frame):
    """The frame that called into transformers to cause a log record, or None if transformers called itself."""
    while frame is not None and _module_root(frame) in MACHINERY:
        frame = frame.f_back
    for _ in range(DEPTH_OF_A_CALL + 1):
        if frame is None or _module_root(frame) != "transformers":
            return frame
        frame = frame.f_back
    return None


class _DeprecatedCallRecorder(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.WARNING)
        self.calls: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "deprecat" not in message.lower():
            return
        caller = _caller_of_transformers(sys._getframe(1))
        if caller is not None and _is_ours(caller):
            self.calls.append(f"{caller.f_code.co_filename}:{caller.f_lineno}: {message}")


@pytest.fixture(autouse=True)
def _no_deprecated_calls():
    recorder = _DeprecatedCallRecorder()
    transformers_logger = logging.getLogger("transformers")
    transformers_logger.addHandler(recorder)
    try:
        yield
    finally:
        transformers_logger.removeHandler(recorder)
    assert not recorder.calls, "transformers reports a deprecated call of ours:\n" + "\n".join(recorder.calls)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def installed_wheel(tmp_path_factory) -> InstalledWheel:
    """The package built as a wheel and installed (not editable) into a folder of its own, once per session."""
    return build_and_install(tmp_path_factory.mktemp("wheel"))
