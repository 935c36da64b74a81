"""Helpers for the workflow tests: run an example script as a user would (a subprocess, CPU, offline) and read what
it printed."""

import importlib
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
TINY_MODEL = ["--hidden-size", "32", "--num-hidden-layers", "2", "--num-attention-heads", "4"]
_NUMBER = r"([0-9]+(?:\.[0-9]+)?)"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def script_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of a user's shell, offline, with its own Hugging Face cache and one thread per process (the
    test machine is shared: several threads per process only wait on each other)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("HF_", "ACCELERATE_"))}
    env.update(
        HF_HUB_OFFLINE="1",
        HF_HOME=str(tmp_path / "hf-home"),
        OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


def accelerate_launch(script: Path, num_processes: int = 2) -> list[str]:
    """`accelerate launch` of `script` as DDP over `num_processes` CPU processes (gloo on 127.0.0.1, a free port);
    run it with `ACCELERATE_CONFIG_FILE` pointing to no file, so a user's accelerate config does not apply."""
    launcher = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        str(num_processes),
    ]
    launcher += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    return [*launcher, "--main_process_port", str(free_port()), str(script)]


def run_example(
    script: str | list[str],
    *args: str,
    tmp_path: Path,
    env: dict[str, str] | None = None,
    expect_failure: bool = False,
    timeout: float = 300,
) -> str:
    """Run `examples/<script>` (or a launcher command ending in it) in `tmp_path`; return stdout and stderr together.
    Fails the test, showing the output's tail, when the exit status is not what was expected."""
    command = script if isinstance(script, list) else [sys.executable, str(EXAMPLES / script)]
    result = subprocess.run(
        [*command, *args],
        cwd=tmp_path,
        env=env or script_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    output = (result.stdout + result.stderr).replace("\r", "\n")
    failed = result.returncode != 0
    assert failed == expect_failure, f"exit status {result.returncode}; output ends:\n{output[-4000:]}"
    return output


def training_losses(output: str) -> list[float]:
    """The losses of the script's closing `training loss: a (step 1) -> ... -> z (step N)` line."""
    line = next(line for line in output.splitlines() if line.startswith("training loss: "))
    return [float(value) for value in re.findall(_NUMBER + r" \(step", line)]


def printed_number(output: str, label: str) -> float:
    """The first number printed after `label`."""
    match = re.search(re.escape(label) + r"\s*" + _NUMBER, output)
    assert match, f"{label!r} not in the output:\n{output[-2000:]}"
    return float(match.group(1))


def import_example(name: str) -> object:
    """`examples/<name>.py` as a module, for its parser (the examples are scripts that import `_cli` as a sibling)."""
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    return importlib.import_module(name)
