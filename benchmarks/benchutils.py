"""Shared helpers for the benchmark scripts: the environment header, interleaved timing, tables and JSON.

Every figure the scripts report is a ratio of two medians measured in the same process, with the contenders run in
alternation (turner, peer, turner, peer, ...) after a warm-up, so that load from other processes on a shared machine
hits both sides alike. Every figure records the load average before and after it; one taken with more processes
waiting for a CPU than there are cores is marked noisy, since a ratio taken then mostly measures the other processes.

Run every benchmark from the repository root as a module (`python -m benchmarks.bench_train`): the repository root is
then the import root, so a benchmark imports this module as `benchmarks.benchutils` and the examples' own code (their
corpora, the padding-free collators) as `examples.helpers`, as the tests do.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import transformers


def environment() -> dict[str, Any]:
    """The machine, thread counts and library versions that a figure depends on."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    return {
        "cpu": cpu,
        "logical_cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch_interop_threads": torch.get_num_interop_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cuda": torch.cuda.is_available(),
        "time": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "load_before": load_average(),
    }


def load_average() -> float:
    """The 1-minute load average: processes running or waiting for a CPU (`os.getloadavg`)."""
    return os.getloadavg()[0]


def under_load(before: float) -> dict[str, Any]:
    """The load average before and after a measurement, and `noisy`: above the core count at either end."""
    after = load_average()
    return {"load_before": before, "load_after": after, "noisy": max(before, after) > (os.cpu_count() or 1)}


def fmt_load(record: dict[str, Any]) -> str:
    """`before -> after`, marked noisy where the load exceeded the core count."""
    text = f"{record['load_before']:.1f} -> {record['load_after']:.1f}"
    return f"{text} (noisy)" if record["noisy"] else text


def environment_markdown(env: dict[str, Any]) -> str:
    """One Markdown line describing the machine, versions and load (`finish_run` adds the load after)."""
    line = (
        f"Machine: {env['cpu']} ({env['logical_cpus']} logical CPUs), torch threads {env['torch_threads']}, "
        f"torch {env['torch']}, transformers {env['transformers']}, Python {env['python']}, "
        f"CUDA {'yes' if env['cuda'] else 'no'}; {env['time']}"
    )
    if "load_after" in env:
        line += f"; load average {fmt_load(env)}"
    device = env.get("device") or {}
    if device.get("name"):
        line += (
            f"\nDevice: {device['name']} ({device['memory_gib']:.0f} GiB), driver {device['driver']}, CUDA "
            f"{device['cuda']}, cuDNN {device['cudnn']}"
        )
    if device.get("name") or device.get("peak_bf16_flops"):
        line += f"; MFU against {describe_peak(device)}"
    return line


def describe_peak(device: dict[str, Any]) -> str:
    """The peak MFU is taken against, and where the figure comes from."""
    if device["peak_bf16_flops"] is None:
        return "no peak (a card not in benchmarks/devices.py's table: pass --peak-tflops)"
    return f"{device['peak_bf16_flops'] / 1e12:g} TFLOP/s bf16 dense ({device['peak_source']})"


def interleaved(
    fns: dict[str, Callable[[], Any]], repeats: int, warmup: int, clock: Callable[[], float] = time.perf_counter
) -> dict[str, list[float]]:
    """Seconds per call of each function, called in alternation: `warmup` untimed rounds, then `repeats` timed ones.

    The order inside a round rotates each repetition so that no contender always runs right after another. `clock`:
    wall time by default; `time.thread_time` counts only this thread's own CPU time (the host work of a call, less
    sensitive to other processes on a busy machine).
    """
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for rep in range(repeats):
            shift = rep % len(names)
            for name in names[shift:] + names[:shift]:
                start = clock()
                fns[name]()
                times[name].append(clock() - start)
            gc.collect()
    finally:
        if gc_was_enabled:
            gc.enable()
    return times


def timed(
    fns: dict[str, Callable[[], Any]], repeats: int, warmup: int, clock: Callable[[], float] = time.perf_counter
) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """`interleaved` timings of `fns`, and the record of them: each one's summary, the raw seconds, and the load
    average around the measurement."""
    before = load_average()
    times = interleaved(fns, repeats=repeats, warmup=warmup, clock=clock)
    return times, timing_record(times, before)


def timing_record(times: dict[str, list[float]], before: float) -> dict[str, Any]:
    """The record of timings taken since the load average was `before`: each one's summary, the raw seconds, and the
    load average around them."""
    summaries = {name: summarize(seconds) for name, seconds in times.items()}
    return {"times": summaries, "raw_seconds": times} | under_load(before)


def summarize(times: Sequence[float]) -> dict[str, float]:
    """Median, spread (interquartile range) and count of a list of timings, in seconds."""
    ordered = sorted(times)
    quartiles = statistics.quantiles(ordered, n=4, method="inclusive") if len(ordered) > 1 else [ordered[0]] * 3
    return {
        "median_s": statistics.median(ordered),
        "q1_s": quartiles[0],
        "q3_s": quartiles[2],
        "min_s": ordered[0],
        "n": len(ordered),
    }


def paired_ratios(numerator: Sequence[float], denominator: Sequence[float]) -> dict[str, float]:
    """Median of the per-repetition ratios `numerator[i] / denominator[i]`, with its quartiles.

    Pairing each repetition with its neighbour cancels slow drifts in machine load; the ratio of the medians is
    reported next to it as a check.
    """
    ratios = sorted(a / b for a, b in zip(numerator, denominator, strict=True))
    quartiles = statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1 else [ratios[0]] * 3
    return {
        "median": statistics.median(ratios),
        "q1": quartiles[0],
        "q3": quartiles[2],
        "ratio_of_medians": statistics.median(numerator) / statistics.median(denominator),
    }


def speedups(times: dict[str, list[float]], of: str = "turner") -> dict[str, dict[str, float]]:
    """`of`'s speed-up over every other contender (`vs_NAME`): their time over its, paired by repetition."""
    return {f"vs_{name}": paired_ratios(seconds, times[of]) for name, seconds in times.items() if name != of}


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub-flavoured Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


SPEEDUP_NOTE = "\nSpeed-up = peer time / Turner time, median of paired repetitions [interquartile range]."


def print_report(env: dict[str, Any], table: str, intro: str = "", note: str = "") -> None:
    """The machine's line, `intro` (a blank line by default), the table, then `note` if any."""
    print(environment_markdown(env))
    print(intro)
    print(table)
    if note:
        print(note)


def save_run(args: argparse.Namespace, benchmark: str, env: dict[str, Any], **results: Any) -> dict[str, Any]:
    """The run's record (`benchmark`, its environment and arguments, then `results`), written to `--json` if given."""
    payload = {"benchmark": benchmark, "environment": env, "args": vars(args), **results}
    write_json(args.json, payload)
    return payload


def write_json(path: str | Path | None, payload: dict[str, Any]) -> None:
    """Write `payload` as indented JSON, a value JSON lacks (a path) as its string (no-op when `path` is None)."""
    if path is None:
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")


def set_threads(threads: int | None) -> None:
    """Pin torch's intra-op thread count (None: leave torch's default)."""
    if threads:
        torch.set_num_threads(threads)


def add_run_arguments(
    parser: argparse.ArgumentParser, repeats: int | None = None, warmup: int = 3, seed: int | None = 0
) -> None:
    """The flags the benchmarks share: repetitions (timed ones only), threads, seed and the JSON output."""
    if repeats is not None:
        parser.add_argument("--repeats", type=int, default=repeats, help="timed repetitions per contender")
        parser.add_argument("--warmup", type=int, default=warmup, help="untimed repetitions per contender (>= 1)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    if seed is not None:
        parser.add_argument("--seed", type=int, default=seed)
    parser.add_argument("--json", type=Path, default=None, help="write the results here")


def add_shape_arguments(parser: argparse.ArgumentParser, **defaults: int | None) -> None:
    """`--layers`, `--heads` and `--features` (the model's M, H and D) with these defaults."""
    for name in ("layers", "heads", "features"):
        parser.add_argument(f"--{name}", type=int, default=defaults[name])


def start_run(threads: int | None) -> dict[str, Any]:
    """Before measuring: pin the threads, quiet transformers' logging, and return the environment to report."""
    set_threads(threads)
    transformers.logging.set_verbosity_error()
    logging.getLogger("ContinuousBatchingLogger").setLevel(logging.ERROR)  # generate_batch's own logger
    return environment()


def finish_run(env: dict[str, Any]) -> dict[str, Any]:
    """After measuring: add the load average after the run, and whether the run was noisy, to `env`."""
    env.update(under_load(env["load_before"]))
    return env


def fmt_ratio(value: float) -> str:
    return f"{value:.2f}x"


def fmt_spread(ratio: dict[str, float]) -> str:
    """A paired ratio as `median [q1-q3]`."""
    return f"{fmt_ratio(ratio['median'])} [{ratio['q1']:.2f}-{ratio['q3']:.2f}]"


def fmt_ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"
