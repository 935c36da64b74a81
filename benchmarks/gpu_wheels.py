"""The Python packages a lent GPU machine lacks for `benchmarks/gpu_session.sh`, carried there as wheels.

That machine has no package index, and its image (as the device tool's KINDS.md listed it, 2026-11) holds
transformers 5.17, below our range, and no datasets (which `bench_trainer` and a test import) or liger-kernel (the
`trainer` rows). Two commands:

    python -m benchmarks.gpu_wheels download   # here: this environment's versions of CARRIED into .whl/
    python -m benchmarks.gpu_wheels check      # there, after installing them: exit 1 naming each unmet need

`check` holds the machine to pyproject's dependencies, torch excepted (the image's own torch is the only one that
reaches the GPU there, 2.11 at the last look: the figures name it), the `liger` extra and datasets,
so that a stage fails in seconds rather than minutes in; what a carried package requires in turn it only warns of.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import subprocess
import sys
import tomllib
from collections.abc import Iterable
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
# transformers at our version; datasets with the two it needs that the image lacks; Liger for the Trainer rows
CARRIED = ("transformers", "datasets", "dill", "multiprocess", "liger-kernel")
NOT_CHECKED = {"torch"}  # the image's own: no other torch can reach that GPU
DEVICE_PYTHON = "3.12"  # the image's python3 (KINDS.md)


def project_requirements() -> list[str]:
    """pyproject's core dependencies, the `liger` extra and datasets (from `examples`): what the GPU stages import."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    datasets = [spec for spec in extras["examples"] if Requirement(spec).name == "datasets"]
    return [*project["dependencies"], *extras["liger"], *datasets]


def unmet(requirements: Iterable[str], skip: Iterable[str] = NOT_CHECKED) -> list[str]:
    """Each requirement (a PEP 508 string) this environment does not satisfy, said in a sentence; [] if all are."""
    skipped = set(skip)
    problems = []
    for spec in requirements:
        requirement = Requirement(spec)
        if requirement.name in skipped or (requirement.marker and not requirement.marker.evaluate({"extra": ""})):
            continue
        try:
            installed = importlib.metadata.version(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            problems.append(f"{requirement.name} is not installed (needs {requirement})")
            continue
        if requirement.specifier and not requirement.specifier.contains(Version(installed), prereleases=True):
            problems.append(f"{requirement.name} {installed} is installed; needs {requirement}")
    return problems


def carried_requirements(names: Iterable[str] = CARRIED) -> list[str]:
    """What the carried packages installed here require in turn (their extras' requirements left out)."""
    requirements = []
    for name in names:
        try:
            requirements += importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue  # reported by `unmet` on the project's requirements, or by the download
    return requirements


def download_command(names: Iterable[str] = CARRIED, folder: str = ".whl") -> list[str]:
    """`pip download` of this environment's version of each of `names`, as wheels for the GPU machine's Python."""
    pinned = [f"{name}=={importlib.metadata.version(name)}" for name in names]
    platform = ["--platform", "manylinux_2_28_x86_64", "--platform", "manylinux2014_x86_64"]
    where = ["--python-version", DEVICE_PYTHON, "--implementation", "cp", *platform, "--only-binary=:all:"]
    return [sys.executable, "-m", "pip", "download", "-q", "--no-deps", *where, "-d", folder, *pinned]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["download", "check"])
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.action == "download":
        return subprocess.run(download_command(), check=False).returncode
    for problem in unmet(carried_requirements()):  # a carried package's own needs: said, not fatal
        print(f"gpu_wheels check: warning: {problem}", file=sys.stderr)
    problems = unmet(project_requirements())
    for problem in problems:
        print(f"gpu_wheels check: {problem}", file=sys.stderr)
    if problems:
        print("carry the missing wheels: `python -m benchmarks.gpu_wheels download` where pip works", file=sys.stderr)
        return 1
    print(f"gpu_wheels check: the project's requirements are met ({', '.join(sorted(NOT_CHECKED))} not checked)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
