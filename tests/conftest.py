"""Test session setup: offline, deterministic; nothing here reaches the network.

A deprecation that transformers or torch reports about a call of ours fails the test that made it: as a warning, by the
`filterwarnings` rules in pyproject.toml (scoped to warnings attributed to our modules; torch announces some
deprecations as a plain `UserWarning`, caught by its words); as a log record (transformers logs some deprecations, e.g.
of the cache's old name, with `logger.warning_once`, and torch some with `log.warning`), by `_no_deprecated_calls`
below. `tests/test_torch_deprecations.py` runs both through pytest.
"""

import importlib.util
import logging
import os
import re
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One torch thread per process, as CI runs the tests (.ci/run), whoever starts them: `pytest -n auto` runs one worker
# per core, and the tests' models are tiny, so more threads only wait on each other. Set before torch is imported
# here, so the subprocesses the tests start (examples, servers, launchers) inherit it too.
os.environ["OMP_NUM_THREADS"] = "1"
os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = "1"  # inductor compiles in the process, not in a pool of its own

import pytest
import torch

import turner_tfm  # noqa: F401  (registers "turner" with the Auto classes)

from .once import made_once
from .wheel_utils import InstalledWheel, build_and_install

torch.set_num_threads(1)  # in case a plugin imported torch before this file set the variable

REPOSITORY = Path(__file__).resolve().parents[1]
# Our code: the package (installed or from a saved folder's remote code), and the repository's converter and examples.
OUR_MODULES = ("turner_tfm", "transformers_modules")
OUR_FOLDERS = tuple(str(REPOSITORY / folder) for folder in ("turner_tfm", "convert", "examples"))
# The libraries whose logged deprecations of our calls fail the tests, by their loggers' and modules' top name.
LIBRARIES = ("transformers", "torch")
# What a deprecation says: the words of pyproject's `UserWarning` rule.
DEPRECATION = re.compile(r"deprecat|will be removed|future release|upcoming release", re.IGNORECASE)
# Frames between a log record and the call that caused it: logging's own, and the logging library's (at most
# `DEPTH_OF_A_CALL` of those: a deprecation logged deeper is the library's own call, e.g. transformers' assisted
# decoding calling the assistant's generate() with arguments it deprecates).
MACHINERY = ("logging", "functools")
DEPTH_OF_A_CALL = 3


def _is_ours(frame) -> bool:
    module = frame.f_globals.get("__name__", "")
    return module.startswith(OUR_MODULES) or frame.f_code.co_filename.startswith(OUR_FOLDERS)


def _module_root(frame) -> str:
    return frame.f_globals.get("__name__", "").split(".")[0]


def _caller_of_library(frame):
    """The frame that called into the library (transformers or torch) that logs a record, or None if it called
    itself."""
    while frame is not None and _module_root(frame) in MACHINERY:
        frame = frame.f_back
    library = None if frame is None else _module_root(frame)
    for _ in range(DEPTH_OF_A_CALL + 1):
        if frame is None or library not in LIBRARIES or _module_root(frame) != library:
            return frame
        frame = frame.f_back
    return None


def _library_loggers() -> list[logging.Logger]:
    """The loggers whose records reach no other of them: each library's top one, and each of torch's that stops its
    records at itself (torch's logging setup does so for the ones it registers, such as torch._dynamo's)."""
    loggers = logging.root.manager.loggerDict.values()
    ours = [logger for logger in loggers if isinstance(logger, logging.Logger) and _name_root(logger) in LIBRARIES]
    return [logger for logger in ours if logger.name in LIBRARIES or not logger.propagate]


def _name_root(logger: logging.Logger) -> str:
    return logger.name.split(".")[0]


class _DeprecatedCallRecorder(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.WARNING)
        self.calls: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if not DEPRECATION.search(message):
            return
        caller = _caller_of_library(sys._getframe(1))
        if caller is not None and _is_ours(caller):
            self.calls.append(f"{caller.f_code.co_filename}:{caller.f_lineno}: {message}")


@pytest.fixture(autouse=True)
def _no_deprecated_calls():
    recorder, loggers = _DeprecatedCallRecorder(), _library_loggers()
    for logger in loggers:
        logger.addHandler(recorder)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeHandler(recorder)
    assert not recorder.calls, "transformers or torch reports a deprecated call of ours:\n" + "\n".join(recorder.calls)


# transformers' own suites come from its sdist, which `.ci/run` unpacks as `upstream_tests` on PYTHONPATH
# (docs/testing.md): without it there is nothing to import them from
collect_ignore = [] if importlib.util.find_spec("upstream_tests") else ["test_upstream_suites.py"]

# The torch the version markers need (pyproject's markers): below it those tests skip, saying which torch and why.
TORCH_FLOORS = {
    "torch_2_10": "2.10",  # what torch 2.9 gets wrong: tensor parallel (refused), a compiled step per static cache
    "torch_2_13": "2.13",  # the export and quant extras' floor (pyproject)
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On a torch older than a version marker's (the core's floor is 2.9), its tests skip, naming the torch they need
    and the marker's `reason`, which every such marker must give."""
    for item in items:
        for name, needed in TORCH_FLOORS.items():
            marker = item.get_closest_marker(name)
            if marker is None:
                continue
            reason = marker.kwargs.get("reason")
            if not reason:
                raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.{name} needs reason='why torch {needed}'")
            if torch.__version__ < needed:
                item.add_marker(
                    pytest.mark.skip(reason=f"needs torch >= {needed} ({reason}); this is torch {torch.__version__}")
                )


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def installed_wheel(tmp_path_factory) -> InstalledWheel:
    """The package built as a wheel and installed (not editable) into a folder of its own, once per session (and not
    once per pytest-xdist worker: `made_once`)."""

    def make(root: Path) -> list[str]:
        installed = build_and_install(root)
        return [str(installed.wheel), str(installed.site)]

    _, (wheel, site) = made_once(tmp_path_factory, "wheel", make)
    return InstalledWheel(Path(wheel), Path(site))


@pytest.fixture(autouse=True)
def _flex_attention_compiled_afresh(request: pytest.FixtureRequest):
    """Each flex-attention test compiles the kernel for its own shapes, statically. transformers compiles
    `flex_attention` without `dynamic=False` on the CPU, so after a worker's earlier tests compiled it for other
    shapes, dynamo recompiles it with dynamic shapes, and torch 2.15's inductor then fails to build the CPU kernel
    (`CppCompileError: 'cur_kvSplitSize0' was not declared`), in whichever test comes next: the order pytest-xdist
    gives decides. `torch.compiler.reset()` forgets the shapes seen; the inductor cache keeps the kernels."""
    if "flex_attention" in request.node.name:
        torch.compiler.reset()
    yield
