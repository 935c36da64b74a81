"""`pip install ".[examples]"` installs every module the example scripts import (issue 44, item 4: under `[examples]`
alone, `python -m examples.sentence_embeddings --help` stopped at `ModuleNotFoundError`). Read from the scripts' own
imports and the packages' metadata, the way pip resolves the extra: no environment is built."""

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

REPOSITORY = Path(__file__).resolve().parents[1]
OURS = {"examples", "turner_tfm", "convert"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def imported(script: Path) -> set[str]:
    """The top-level name of every absolute import in `script`, at its top or inside a function."""
    names = set()
    for node in ast.walk(ast.parse(script.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module.split(".")[0])
    return names - OURS - set(sys.stdlib_module_names)


def requirements_of(requirement: Requirement) -> list[Requirement]:
    """What installing `requirement` installs next: this checkout's pyproject for turner-tfm, else the metadata."""
    if canonical(requirement.name) == "turner-tfm":
        project = tomllib.loads((REPOSITORY / "pyproject.toml").read_text())["project"]
        lines = project["dependencies"] + [
            line for e in requirement.extras for line in project["optional-dependencies"][e]
        ]
        return [Requirement(line) for line in lines]
    try:
        lines = importlib.metadata.requires(requirement.name) or []
    except importlib.metadata.PackageNotFoundError:  # not installed here, so nothing here imports it
        return []
    wanted = [{"extra": extra} for extra in ("", *requirement.extras)]
    return [r for r in map(Requirement, lines) if r.marker is None or any(map(r.marker.evaluate, wanted))]


def installed_by(requirement: str) -> set[str]:
    """The distributions `pip install requirement` brings: it and everything it requires, recursively."""
    seen, todo = set(), [Requirement(requirement)]
    while todo:
        current = todo.pop()
        key = (canonical(current.name), frozenset(current.extras))
        if key not in seen:
            seen.add(key)
            todo += requirements_of(current)
    return {name for name, _ in seen}


def test_the_examples_extra_installs_every_module_an_example_imports():
    installed, owners = installed_by("turner-tfm[examples]"), importlib.metadata.packages_distributions()
    missing = {
        f"{script.relative_to(REPOSITORY)}: {name} ({', '.join(owners.get(name, ['not installed here']))})"
        for script in REPOSITORY.glob("examples/**/*.py")
        for name in imported(script)
        if not {canonical(owner) for owner in owners.get(name, [])} & installed
    }
    assert not missing, f"imported, but not installed by turner-tfm[examples]: {sorted(missing)}"
