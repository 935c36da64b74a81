"""Fixtures shared by every pytest-xdist worker of a session."""

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock


def made_once(
    tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], object]
) -> tuple[Path, object]:
    """The folder `name` and what `make(folder)` returned (anything JSON keeps: runs' outputs), made once in a test
    session however many pytest-xdist workers ask for it. A module-scoped fixture is made once per worker, and
    `--dist worksteal` splits a module between the workers whenever an idle one takes the tail of the other's queue:
    a fixture that runs the examples for a minute then ran twice (the newest lane on the 2-core Xeon: two). The
    first worker to ask makes the folder while the others wait on a lock, then every worker reads the same folder and
    result. A `make` that raises leaves no result: the next worker to ask makes it again, and fails with its own
    error."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the session's folder, the parent of every worker's own
    folder, result = root / name, root / f"{name}.json"
    with FileLock(str(root / f"{name}.lock")):
        if not result.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            result.write_text(json.dumps(make(folder)))
    return folder, json.loads(result.read_text())
