"""Helpers for the workflow tests: run an example script as a user would (`python -m examples.NAME`, a subprocess, CPU,
offline) and read what it printed, or run a benchmark or experiment as `python -m` runs it from the repository root.
The examples' shared code is the package `examples.helpers` everywhere (pytest puts the repository root on the path,
as `python -m` puts the current folder; a script run elsewhere finds it through PYTHONPATH)."""

import contextlib
import json
import os
import re
import runpy
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import torch
import transformers
from safetensors.torch import load_file

from examples.helpers import resume
from turner_tfm import TurnerConfig, TurnerForCausalLM

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
WORKFLOWS_PAGE = REPO / "docs" / "workflows.md"
TINY_MODEL = ["--hidden-size", "32", "--num-hidden-layers", "2", "--num-attention-heads", "4"]
_NUMBER = r"([0-9]+(?:\.[0-9]+)?)"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_module(module: str, args: list[str], monkeypatch) -> None:
    """`python -m MODULE ARGS` from the repository root, in this process: how the benchmarks (`benchmarks.NAME`) and
    the experiments (`examples.experiments.NAME`) are run. A module imported before by another is run afresh, and
    transformers' log level (which the scripts lower) is restored for the tests that run after."""
    monkeypatch.setattr(sys, "argv", [module, *args])
    monkeypatch.delitem(sys.modules, module, raising=False)
    verbosity = transformers.logging.get_verbosity()
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as done:  # `sys.exit(main())`: a success exits with None or 0
        if done.code not in (None, 0):
            raise
    finally:
        transformers.logging.set_verbosity(verbosity)


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
        PYTHONPATH=str(REPO),  # as if run from the repository root: `python -m examples.NAME` finds `examples`
    )
    env.update(extra)
    return env


def example(script: str | Path) -> list[str]:
    """`-m examples.NAME` for the example `script` "NAME.py" (a `Path` is run as a file): what `python` and the
    launchers (torchrun, accelerate) run."""
    return [str(script)] if isinstance(script, Path) else ["-m", f"examples.{script.removesuffix('.py')}"]


def accelerate_launch(script: str | Path, num_processes: int = 2) -> list[str]:
    """`accelerate launch` of the example `script` ("NAME.py"), or of a file, as DDP over `num_processes` CPU
    processes (gloo on 127.0.0.1, a free port); run it with `ACCELERATE_CONFIG_FILE` pointing to no file, so a user's
    accelerate config does not apply."""
    launcher = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        str(num_processes),
    ]
    launcher += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    return [
        *launcher,
        "--main_process_port",
        str(free_port()),
        *(example(script) if isinstance(script, str) else [str(script)]),
    ]


def run_example(
    script: str | list[str],
    *args: str,
    tmp_path: Path,
    env: dict[str, str] | None = None,
    expect_failure: bool = False,
    timeout: float = 300,
) -> str:
    """Run the example `script` ("NAME.py": `python -m examples.NAME`), or a launcher command ending in it, in
    `tmp_path`; return stdout and stderr together.
    Fails the test, showing the output's tail, when the exit status is not what was expected."""
    command = script if isinstance(script, list) else [sys.executable, *example(script)]
    result = subprocess.run(
        [*command, *args],
        cwd=tmp_path,
        env=env or script_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return checked_output(result.returncode, result.stdout + result.stderr, expect_failure)


def checked_output(status: int, output: str, expect_failure: bool = False) -> str:
    """A run's `output`; fails the test, showing the output's tail, when its exit `status` is not what was expected."""
    output = output.replace("\r", "\n")
    assert (status != 0) == expect_failure, f"exit status {status}; output ends:\n{output[-4000:]}"
    return output


# The process of `run_examples`: each job runs as `python -m MODULE ARGS` runs a module (runpy, as `__main__`, with
# `sys.argv` set), its stdout and stderr (file descriptors 1 and 2, so every handler and library writes there too) in
# files of its own, its warnings filters fresh; an uncaught exception prints its traceback and counts as status 1, as
# the interpreter does. One line per job on the real stdout: its exit status.
_ONE_PROCESS = """
import json, os, runpy, sys, traceback, warnings
for module, argv, stdout, stderr in json.loads(sys.argv[1]):
    sys.stdout.flush(), sys.stderr.flush()
    real = os.dup(1), os.dup(2)
    for fd, log in ((1, stdout), (2, stderr)):
        with open(log, "w") as file:
            os.dup2(file.fileno(), fd)
    status, sys.argv = 0, [module, *argv]
    with warnings.catch_warnings():
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        except SystemExit as done:  # sys.exit(None | status | message)
            status = done.code or 0
            if not isinstance(status, int):
                print(status, file=sys.stderr)
                status = 1
        except BaseException:
            traceback.print_exc()
            status = 1
    sys.stdout.flush(), sys.stderr.flush()
    os.dup2(real[0], 1), os.dup2(real[1], 2)
    print(status, flush=True)
"""


def run_examples(
    runs: list[tuple[str, ...]],
    *,
    tmp_path: Path,
    env: dict[str, str] | None = None,
    expect_failure: bool | list[bool] = False,
    timeout: float = 300,
) -> list[str]:
    """Run each of `runs` ("NAME.py", *args) as `python -m examples.NAME ARGS` runs it, one after another in one
    Python process (in `tmp_path`, with `env` or `script_env`): what a user sees of each, for the price of one
    interpreter and one `import torch, transformers` (~8 s of CPU, more than a tiny training run costs). For runs
    that stop early (`--help`, a flag or a file refused) and tiny trainings whose outputs a test reads; a run that is
    killed, launched or timed gets a process of its own (`run_example`, `start`). Fails the test, showing the
    output's tail, when a run's exit status is not what was expected; returns each run's output."""
    expected = expect_failure if isinstance(expect_failure, list) else [expect_failure] * len(runs)
    results = run_examples_unchecked(runs, tmp_path=tmp_path, env=env, timeout=timeout)
    return [checked_output(*result, expect_failure=failure) for result, failure in zip(results, expected, strict=True)]


def run_examples_unchecked(
    runs: list[tuple[str, ...]], *, tmp_path: Path, env: dict[str, str] | None = None, timeout: float = 300
) -> list[tuple[int, str]]:
    """`run_examples`, returning each run's (exit status, output) unchecked: for a module's fixture that runs what
    several tests check, each test then checking its own runs with `checked_output` (a run that fails unexpectedly
    fails its test only)."""
    logs = [
        [tmp_path / f"run-{time.monotonic_ns()}-{index}.{kind}" for kind in ("out", "err")]
        for index in range(len(runs))
    ]
    modules = [f"examples.{script.removesuffix('.py')}" for script, *_ in runs]
    jobs = [[module, args, *map(str, files)] for module, (_, *args), files in zip(modules, runs, logs, strict=True)]
    result = subprocess.run(
        [sys.executable, "-c", _ONE_PROCESS, json.dumps(jobs)],
        cwd=tmp_path,
        env=env or script_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    statuses = [int(line) for line in result.stdout.split()]
    outputs = ["".join(log.read_text() for log in files if log.exists()) for files in logs]  # stdout, then stderr
    assert len(statuses) == len(runs), (  # the process died: the output of the run it died in, and its own
        f"{len(statuses)} of {len(runs)} runs ended:\n{outputs[len(statuses)][-3000:]}\n{result.stderr[-1000:]}"
    )
    return list(zip(statuses, outputs, strict=True))


def training_losses(output: str) -> list[float]:
    """The losses of the script's closing `training loss: a (step 1) -> ... -> z (step N)` line."""
    line = next(line for line in output.splitlines() if line.startswith("training loss: "))
    return [float(value) for value in re.findall(_NUMBER + r" \(step", line)]


def listed_files(text: str, line_start: str) -> list[str]:
    """The files on the line of `text` that starts with `line_start` (`saved to DIR/: a, b`, `pushed N files to URL:
    a, b`): what a run printed, or what docs/workflows.md shows of one (tests compare the two: no list kept by hand)."""
    match = re.search(rf"^{re.escape(line_start)}.*?: (.+)$", text, re.MULTILINE)
    assert match, f"no line starting {line_start!r} in:\n{text[-2000:]}"
    return match.group(1).split(", ")


def printed_number(output: str, label: str) -> float:
    """The first number printed after `label`."""
    match = re.search(re.escape(label) + r"\s*" + _NUMBER, output)
    assert match, f"{label!r} not in the output:\n{output[-2000:]}"
    return float(match.group(1))


# A tiny language-model run, 24 steps, saving every 8 (train_causal_lm.py), for the interrupted and multi-node runs
LM_RUN = ("--train-file", "text.txt", "--max-steps", "24", "--save-steps", "8", "--logging-steps", "2")
LM_RUN += ("--block-size", "32", "--max-new-tokens", "10", "--per-device-train-batch-size", "4", *TINY_MODEL)
LM_RUN += ("--hidden-dropout", "0.1")  # dropout draws random numbers: the RNG states must come back too


def write_text(tmp_path: Path) -> None:
    """The `text.txt` that LM_RUN trains on."""
    (tmp_path / "text.txt").write_text("Simple is better than complex. Complex is better than complicated.\n" * 40)


def launch_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """A user's environment (`script_env`) without their accelerate config, and `extra`."""
    return script_env(tmp_path, ACCELERATE_CONFIG_FILE=str(tmp_path / "no-config.yaml"), **extra)


def torchrun(
    *, nodes: int = 1, processes: int = 2, port: int, node_rank: int | None = None, max_restarts: int = 0
) -> list[str]:
    """`torchrun` as each of `nodes` machines runs it, `processes` workers each: with c10d rendezvous at
    127.0.0.1:`port`, or, given `node_rank`, the static rendezvous of node 0 at 127.0.0.1:`port` (node 0's launcher
    serves the store). On one machine, start it `nodes` times for that many "nodes"."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(nodes),
        "--nproc-per-node",
        str(processes),
    ]
    if node_rank is None:
        command += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "job"]
    else:
        command += ["--node-rank", str(node_rank), "--master-addr", "127.0.0.1", "--master-port", str(port)]
    return [*command, "--max-restarts", str(max_restarts), "--monitor-interval", "0.1"]


def start(command: list[str], tmp_path: Path, **env: str) -> subprocess.Popen:
    """A run in a session of its own (as from a user's shell), its output in the file `process.log`."""
    log = tmp_path / f"run-{time.monotonic_ns()}.log"
    with log.open("w") as file:
        process = subprocess.Popen(
            command,
            cwd=tmp_path,
            env=launch_env(tmp_path, **env),
            stdout=file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    process.log = log
    return process


def kill_run(process: subprocess.Popen, how: signal.Signals = signal.SIGKILL) -> None:
    """Send `how` to a run and every process it started, as a preempted job or a machine switched off is (a
    launcher's workers have sessions of their own, so killing the launcher's process group would not reach them);
    wait for it to end unless `how` only stops it (SIGSTOP)."""
    children = []
    with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):  # it ended by itself
        children = psutil.Process(process.pid).children(recursive=True)
        os.killpg(process.pid, how)
    for child in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.send_signal(how)
    if how != signal.SIGSTOP:
        process.wait(timeout=30)


def logs(*processes: subprocess.Popen, tail: int = 3000) -> str:
    """The end of each run's output (every launcher prints its workers' tracebacks), for a failed assertion."""
    return "\n".join(
        f"--- {process.log.name} (exit status {process.poll()}):\n{process.log.read_text()[-tail:]}"
        for process in processes
    )


def wait_all(*processes: subprocess.Popen, timeout: float = 600, expect_failure: bool = False) -> list[str]:
    """Wait for every run; after `timeout` seconds kill what is left, so a test never hangs. Fails the test, with
    every run's output, unless each ended as expected; returns the outputs."""
    deadline = time.monotonic() + timeout
    try:
        for process in processes:
            process.wait(timeout=max(deadline - time.monotonic(), 0.1))
    except subprocess.TimeoutExpired:
        raise AssertionError(f"still running after {timeout} s:\n{logs(*processes)}") from None
    finally:
        for process in processes:
            if process.poll() is None:
                kill_run(process)
    failed = [process.returncode != 0 for process in processes]
    assert failed == [expect_failure] * len(processes), (
        f"exit statuses {[p.returncode for p in processes]}:\n{logs(*processes)}"
    )
    return [process.log.read_text() for process in processes]


def complete_checkpoints(output_dir: Path) -> list[Path]:
    """`resume.complete_checkpoints`: what `--resume-from-checkpoint true|auto` chooses from."""
    return resume.complete_checkpoints(output_dir)


def kill_after_first_checkpoint(process: subprocess.Popen, output_dir: Path, timeout: float = 300) -> Path:
    """SIGKILL the run as soon as a checkpoint is complete; return the newest complete one."""
    deadline = time.monotonic() + timeout
    while not complete_checkpoints(output_dir):
        assert process.poll() is None, f"the run ended (status {process.returncode}) before a checkpoint"
        assert time.monotonic() < deadline, "no checkpoint in time"
        time.sleep(0.01)
    kill_run(process)
    return complete_checkpoints(output_dir)[-1]


def logged_after(output_dir: Path, step: int) -> list[dict]:
    """The Trainer's log entries (loss, grad norm, learning rate) after `step`, from the final checkpoint."""
    state = json.loads((complete_checkpoints(output_dir)[-1] / "trainer_state.json").read_text())
    return [entry for entry in state["log_history"] if "loss" in entry and entry["step"] > step]


def assert_same_weights(folder: Path, expected_folder: Path) -> None:
    """The saved model in `folder` has the weights of the one in `expected_folder` (1e-6)."""
    expected = load_file(expected_folder / "model.safetensors")
    weights = load_file(folder / "model.safetensors")
    assert weights.keys() == expected.keys()
    for name, tensor in weights.items():
        torch.testing.assert_close(tensor, expected[name], atol=1e-6, rtol=0, msg=name)


def assert_same_run(resumed: Path, uninterrupted: Path, resume_step: int) -> None:
    """The resumed run ends with the uninterrupted run's weights (1e-6) and logged the same losses after the resume."""
    assert_same_weights(resumed, uninterrupted)
    after = logged_after(uninterrupted, resume_step)
    assert after and logged_after(resumed, resume_step) == after


def worker_pids(launcher: subprocess.Popen, count: int = 2, timeout: float = 300) -> dict[int, int]:
    """{rank: pid} of the `count` processes a launcher started, once they all run."""
    deadline = time.monotonic() + timeout
    while True:
        assert launcher.poll() is None, launcher.log.read_text()[-3000:]
        assert time.monotonic() < deadline, f"no {count} workers in {timeout} s:\n{launcher.log.read_text()[-3000:]}"
        workers = {}
        for child in psutil.Process(launcher.pid).children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):
                rank = child.environ().get("RANK")
                if rank is not None and "accelerate.commands.launch" not in child.cmdline():
                    workers[int(rank)] = child.pid
        if len(workers) == count:
            return workers
        time.sleep(0.1)


# The two families a worker of test_resume_across_launchers.py or test_deepspeed.py trains side by side: the same
# shape, no dropout (1 and 2 processes draw no random numbers then), 32 rows of 16 random tokens.
TINY_LMS = {
    "gpt2": lambda: transformers.GPT2LMHeadModel(
        transformers.GPT2Config(
            vocab_size=64,
            n_positions=16,
            n_embd=32,
            n_layer=2,
            n_head=4,
            bos_token_id=1,
            eos_token_id=2,
            resid_pdrop=0,
            embd_pdrop=0,
            attn_pdrop=0,
        )
    ),
    "turner": lambda: TurnerForCausalLM(
        TurnerConfig(
            vocab_size=64, max_position_embeddings=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4
        )
    ),
}


def tiny_lm(family: str) -> transformers.PreTrainedModel:
    """One of `TINY_LMS`, made alike in every process (seed 0)."""
    transformers.set_seed(0)
    return TINY_LMS[family]()


def tiny_lm_trainer(model: transformers.PreTrainedModel, output_dir: Path, **training_args) -> transformers.Trainer:
    """A `Trainer` for a `tiny_lm`, on the same 32 rows in every process, with the default optimizer (fused AdamW on
    torch >= 2.8), a loss logged every step and `training_args` over those."""
    ids = torch.randint(3, 64, (32, 16), generator=torch.Generator().manual_seed(0))
    settings = dict(learning_rate=1e-2, logging_steps=1, report_to="none", disable_tqdm=True, use_cpu=True)
    return transformers.Trainer(
        model=model,
        args=transformers.TrainingArguments(output_dir=str(output_dir), **{**settings, **training_args}),
        train_dataset=[{"input_ids": row, "labels": row} for row in ids],
        data_collator=transformers.default_data_collator,
    )
