"""A fresh, isolated Python process (`python -I`: no PYTHONPATH, no user site, no current folder on the path), offline,
for the tests that load a saved folder as remote code where the repository is out of reach."""

import subprocess
import sys
from pathlib import Path


def run_isolated(script: str, arguments: list[str], cwd: Path, timeout: float = 300) -> None:
    """Run `script` with `arguments` in `cwd`, with a Hub cache of its own and no network; fail with its stderr."""
    result = subprocess.run(
        [sys.executable, "-I", "-c", script, *arguments],
        cwd=cwd,
        env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(cwd / "hf_home"), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stderr[-3000:]
