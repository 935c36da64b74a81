"""Build the package as a user gets it: a wheel from a copy of the sources, installed (not editable) into a folder,
and run it from there, outside the repository."""

import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHIPPED = ("pyproject.toml", "README.md", "turner_tfm", "convert", "model_cards")  # what the wheel is built from


@dataclass(frozen=True)
class InstalledWheel:
    wheel: Path
    site: Path  # the install target: packages here, console scripts in site / "bin"

    @property
    def names(self) -> list[str]:
        return zipfile.ZipFile(self.wheel).namelist()

    def read(self, name: str) -> str:
        return zipfile.ZipFile(self.wheel).read(name).decode()

    def run(self, command: list[str], cwd: Path) -> subprocess.CompletedProcess:
        """`command` with only the installed package importable (offline, no PYTHONPATH to the repository)."""
        env = {"PYTHONPATH": str(self.site), "PATH": f"{self.site / 'bin'}{os.pathsep}/usr/bin:/bin"}
        env |= {"HF_HUB_OFFLINE": "1", "HF_HOME": str(cwd / "hf_home"), "TOKENIZERS_PARALLELISM": "false"}
        return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def build_and_install(root: Path) -> InstalledWheel:
    source = root / "source"  # a copy, so the build leaves no build/ or egg-info in the checkout
    source.mkdir()
    for name in SHIPPED:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(REPO / name, source)
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(root / "dist")]
    subprocess.run([*build, str(source)], check=True, capture_output=True, timeout=300)
    (wheel,) = (root / "dist").glob("turner_tfm-*.whl")
    site = root / "site"
    install = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target", str(site), str(wheel)]
    subprocess.run(install, check=True, capture_output=True, timeout=300)
    return InstalledWheel(wheel, site)
