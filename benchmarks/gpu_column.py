"""The GPU column in one command: training, decoding and continuous batching of Turner against GPT-2 and the minimal GPT
on one CUDA device, bf16, at GPT-2's 124M shape (12 layers, 12 heads, 768 features, context 1024, vocabulary 50304).

    python -m benchmarks.gpu_column --json benchmarks/results/gpu/gpu_column.json

Sections (each row is one call of `bench_train.bench_shape` or `bench_generate.bench`, contenders rotated):

* `train`: a training step (forward, backward, fused AdamW; bf16 autocast over fp32 weights, as `bf16=True` runs it),
  eager, at GPT-2's shape with batch 16 x 1024 tokens and at nanoGPT's GPU recipe (L6 H6 D384, T256, vocabulary 65,
  batch 64): step time, tokens/s, MFU (6N + 12LDT FLOPs a token against the card's bf16 dense peak) and peak memory.
* `train-compiled`: the same with each model `torch.compile`d (the first step, which compiles, timed apart).
* `decode`: `generate()` greedy, prompt 128 + 128 new tokens, bf16 weights, the default dynamic cache, eager, batch 1
  and 64; the minimal GPT runs its own loop.
* `decode-static`: the same with `cache_implementation="static"` and the decoding step compiled with
  `CompileConfig(mode="reduce-overhead")` (CUDA graphs), Turner against GPT-2.
* `trainer`: Turner through `Trainer.train()` (bf16=True, GPT-2's shape, batch 16 x 1024, `--trainer-steps` steps a
  run, nothing synchronising but the Trainer itself) with one switch off and on, side by side: `use_liger_kernel`
  (eager and `torch_compile=True`; needs liger-kernel, and a row that cannot run says why) and the config's
  `check_input_values`: time per step, steps per second, MFU and peak memory (`bench_trainer.bench_switch`).
* `continuous-batching`: `generate_batch` of 64 such requests (transformers' continuous batching, a paged cache with
  room for all of them), Turner against GPT-2: wall time of the call and the engine's own time.

The JSON names the GPU, its driver, the CUDA and cuDNN versions, torch and transformers, and holds every row's raw
timings. Before the sections start the command prints each one's estimated time on one H100 (from the first
measurement there, `H100_SECONDS`) and at the end the time each took. `--device cpu --tiny` runs every section at
toy sizes on the CPU (what the smoke test runs); its figures mean nothing.
"""

from __future__ import annotations

import argparse
import gc
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from benchmarks import bench_generate, bench_train, bench_trainer, benchutils, devices
from benchmarks.bench_train import SHAPES
from benchmarks.peers import LMShape

GPT2_SMALL = SHAPES["gpt2-small"][0]
TINY_LM = LMShape(layers=1, heads=2, features=32, context=16)


@dataclass(frozen=True)
class Row:
    """One row of the column: the section it belongs to, its label, and how to run it."""

    section: str
    label: str
    kind: (
        str  # "train" (bench_train.bench_shape), "trainer" (bench_trainer.bench_switch) or "generate" (bench_generate)
    )
    mode: str
    shape: str | LMShape  # a bench_train shape name, or the decoding model
    batch: int
    contenders: int
    # seconds on one H100 at the default sizes: the first calls of all contenders together, and one timed call
    h100_first: float = 0.0
    h100_call: float = 0.0
    options: dict[str, Any] = field(default_factory=dict)


# From the H100 measurement of 2026-11-26 (torch 2.11, ../shared/measurements/h100-2026-11-26/results.jsonl): the first
# steps or calls of the contenders (compilation, CUDA-graph capture) and a step or call's median. The compiled L6 row
# and continuous batching were not measured there; their figures come from this command's first run, on an H200
# (2026-11-27, torch 2.11: benchmarks/results/gpu/), whose other rows took about what the H100's figures say.
H100_SECONDS: dict[str, tuple[float, float]] = {
    "train gpt2-small": (1.8, 0.054),
    "train nanogpt-gpu": (0.3, 0.013),
    "train-compiled gpt2-small": (77.0, 0.041),
    "train-compiled nanogpt-gpu": (48.0, 0.012),
    "decode 1": (14.0, 0.55),
    "decode 64": (16.0, 0.65),
    "decode-static 1": (23.5, 0.20),
    "decode-static 64": (27.6, 0.22),
    "continuous-batching 64": (20.0, 9.1),
    # not measured yet, guessed from the train rows: setup and the first steps; a run of 20 steps
    "trainer liger eager": (30.0, 1.2),
    "trainer liger compiled": (90.0, 1.0),
    "trainer checks eager": (30.0, 1.2),
}
SECTIONS = ["train", "train-compiled", "trainer", "decode", "decode-static", "continuous-batching"]
STARTUP_SECONDS = 20.0  # imports, CUDA's start, the matrix-product probe, building models on the GPU


def column(tiny: bool) -> list[Row]:
    """The column's rows, at the GPU sizes or (`tiny`) at toy sizes with the same structure."""
    rows = []
    train_shapes = [("gpt2-small", 16), ("nanogpt-gpu", 64)] if not tiny else [("tiny", 2), ("tiny", 3)]
    for section, mode in (("train", "eager"), ("train-compiled", "compiled")):
        for (name, batch), h100 in zip(train_shapes, ("gpt2-small", "nanogpt-gpu"), strict=True):
            label = f"training step, {mode}, {name} batch {batch} x {SHAPES[name][0].context}"
            first, call = H100_SECONDS[f"{section} {h100}"]
            rows.append(Row(section, label, "train", mode, name, batch, 3, first, call))
    name, batch = train_shapes[0]
    for switch, mode in (("liger", "eager"), ("liger", "compiled"), ("checks", "eager")):
        label = f"Trainer, {bench_trainer.SWITCHES[switch][1]} off / on, {mode}, {name} batch {batch}"
        first, call = H100_SECONDS[f"trainer {switch} {mode}"]
        rows.append(Row("trainer", label, "trainer", mode, name, batch, 2, first, call, {"switch": switch}))
    model = TINY_LM if tiny else GPT2_SMALL
    prompt, new = (4, 3) if tiny else (128, 128)
    batches = (1, 2) if tiny else (1, 64)
    for section, mode, what in (
        ("decode", "dynamic", "dynamic cache, eager"),
        ("decode-static", "static-compile", "static cache, compiled decoding step"),
        ("continuous-batching", "continuous", "continuous batching (generate_batch)"),
    ):
        for batch, h100 in zip(batches, (1, 64), strict=True):
            if mode == "continuous" and h100 == 1:
                continue
            label = f"greedy {prompt} + {new} tokens, {what}, batch {batch}"
            first, call = H100_SECONDS[f"{section} {h100}"]
            contenders = 3 if mode == "dynamic" else 2
            options = {"prompt_len": prompt, "new_tokens": new}
            rows.append(Row(section, label, "generate", mode, model, batch, contenders, first, call, options))
    return rows


def estimate(row: Row, args: argparse.Namespace) -> float:
    """Seconds `row` takes on one H100 with these repetitions: first calls, then the rest of each contender's calls."""
    repeats, warmup = (args.train_repeats, args.train_warmup) if row.kind == "train" else (args.repeats, args.warmup)
    repeats = args.cb_repeats if row.mode == "continuous" else repeats
    repeats = args.trainer_repeats if row.kind == "trainer" else repeats
    return row.h100_first + row.contenders * (max(warmup - 1, 1) + repeats) * row.h100_call


def run_row(row: Row, args: argparse.Namespace, peak: float | None) -> dict[str, Any]:
    """The row's measurement (bench_train's or bench_generate's record), or the error it ended with."""
    try:
        if row.kind == "train":
            return bench_train.bench_shape(
                row.shape,
                row.mode,
                "bf16",
                args.train_repeats,
                args.train_warmup,
                row.batch,
                args.seed,
                device=args.device,
                fp32_turner=False,
                peak_flops=peak,
            )
        if row.kind == "trainer":
            return bench_trainer.bench_switch(
                row.shape, row.options["switch"], row.batch, args.trainer_steps, args.trainer_repeats, 1, args.seed,
                args.device, compiled=row.mode == "compiled", peak_flops=peak,
            )  # fmt: skip
        repeats = args.cb_repeats if row.mode == "continuous" else args.repeats
        return bench_generate.bench(
            row.shape,
            row.mode,
            row.batch,
            repeats=repeats,
            warmup=args.warmup,
            seed=args.seed,
            device=args.device,
            dtype="bf16",
            turner_variant=False,
            **row.options,
        )
    except Exception as error:  # a failed row (a compiler's error, memory) is reported; the others still run
        return {"mode": row.mode, "batch": row.batch, "error": f"{type(error).__name__}: {error}"}
    finally:  # the next row starts clean: no compiled graphs or CUDA-graph pools of this row's models left
        torch.compiler.reset()
        gc.collect()
        if args.device.type == "cuda":
            torch.cuda.empty_cache()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sections", nargs="+", default=SECTIONS, choices=SECTIONS)
    parser.add_argument("--tiny", action="store_true", help="toy sizes (a check that every section runs)")
    parser.add_argument("--train-repeats", type=int, default=20, help="timed training steps per contender")
    parser.add_argument("--train-warmup", type=int, default=3, help="untimed training steps per contender")
    parser.add_argument("--cb-repeats", type=int, default=3, help="timed generate_batch calls per contender")
    parser.add_argument("--trainer-steps", type=int, default=20, help="steps of each timed Trainer run")
    parser.add_argument("--trainer-repeats", type=int, default=3, help="timed Trainer runs per switch value")
    devices.add_device_arguments(parser, default="cuda")
    benchutils.add_run_arguments(parser, repeats=10, warmup=2)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    env = benchutils.start_run(args.threads) | {"device": devices.describe(args.device, args.peak_tflops)}
    env["matmul_bf16_flops"] = devices.matmul_bf16_flops(args.device)
    rows = [row for row in column(args.tiny) if row.section in args.sections]
    estimated = {section: sum(estimate(r, args) for r in rows if r.section == section) for section in args.sections}
    print_estimates(estimated, args)
    started = time.perf_counter()
    results: dict[str, list[dict[str, Any]]] = {section: [] for section in args.sections}
    measured = dict.fromkeys(args.sections, 0.0)
    for done, row in enumerate(rows):  # the JSON is rewritten after each row: a run cut short keeps what it measured
        start = time.perf_counter()
        results[row.section].append({"label": row.label} | run_row(row, args, env["device"]["peak_bf16_flops"]))
        measured[row.section] += time.perf_counter() - start
        print(f"[{time.perf_counter() - started:6.0f} s] {row.section}: {row.label}", flush=True)
        benchutils.save_run(args, "gpu_column", env, sections=results, rows_done=f"{done + 1} of {len(rows)}")
    benchutils.finish_run(env)
    seconds = {s: {"estimated_h100": None if args.tiny else estimated[s], "measured": measured[s]} for s in measured}
    seconds["total"] = {
        "estimated_h100": None if args.tiny else STARTUP_SECONDS + sum(estimated.values()),
        "measured": time.perf_counter() - started,
    }
    benchutils.print_report(env, table(results), note=NOTE)
    print_times(seconds)
    failed = [f"{r['label']}: {r['error']}" for rs in results.values() for r in rs if "error" in r]
    for failure in failed:
        print(f"FAILED {failure}")
    payload = benchutils.save_run(args, "gpu_column", env, sections=results, seconds=seconds, failed=failed)
    if failed:
        raise SystemExit(f"{len(failed)} of {len(rows)} rows failed (the JSON has the others)")
    return payload


NOTE = (
    benchutils.SPEEDUP_NOTE + " MFU: 6N + 12LDT FLOPs a token (N parameters, L layers, D features, T context) over the "
    "bf16 dense peak above. Peak memory: allocated bytes the contender holds plus the most one call adds (CUDA)."
)


def print_estimates(estimated: dict[str, float], args: argparse.Namespace) -> None:
    if args.tiny:
        print("Toy sizes (--tiny): no time estimate; the figures check that every section runs, nothing more.")
        return
    print("Estimated time on one H100 (benchmarks/gpu_column.py's H100_SECONDS and these repetitions):")
    for section, seconds in estimated.items():
        print(f"  {section}: ~{seconds:.0f} s")
    print(f"  total, with ~{STARTUP_SECONDS:.0f} s of start-up: ~{STARTUP_SECONDS + sum(estimated.values()):.0f} s")


def print_times(seconds: dict[str, dict[str, float | None]]) -> None:
    print("\nTime per section (estimated on one H100 / measured here):")
    for section, taken in seconds.items():
        estimate_text = "-" if taken["estimated_h100"] is None else f"~{taken['estimated_h100']:.0f} s"
        print(f"  {section}: {estimate_text} / {taken['measured']:.0f} s")


def table(results: dict[str, list[dict[str, Any]]]) -> str:
    """The column as one Markdown table: a row per measurement (two for continuous batching: wall and engine time)."""
    header = ["figure", "Turner", "GPT-2", "minimal GPT", "Turner vs GPT-2", "Turner vs minimal"]
    header += ["MFU Turner / GPT-2 / min", "peak memory Turner / GPT-2 / min", "reps", "load avg"]
    rows = []
    for section_rows in results.values():
        for r in section_rows:
            if "error" in r or "not_run" in r:
                outcome = "failed" if "error" in r else f"not run: {r['not_run']}"
                rows.append([r["label"], outcome, *[""] * (len(header) - 2)])
                continue
            if "on_over_off" in r:
                rows.append(switch_cells(r, len(header)))
                continue
            rows.append(cells(r["label"], r, "times", "tokens_per_second", "turner_speedup"))
            if "engine_times" in r:
                label = r["label"] + ", engine time"
                rows.append(cells(label, r, "engine_times", "engine_tokens_per_second", "engine_turner_speedup"))
    return benchutils.markdown_table(header, rows)


def switch_cells(r: dict[str, Any], width: int) -> list[Any]:
    """A Trainer row (`bench_trainer.bench_switch`): Turner off / on in the Turner column, on over off beside it."""
    steps = " / ".join(f"{benchutils.fmt_ms(r['step_times'][k]['median_s'])}" for k in ("off", "on"))
    rates = " / ".join(f"{r['steps_per_second'][k]:.2f}" for k in ("off", "on"))
    mfu = " / ".join(f"{r['mfu'][k]:.1%}" for k in ("off", "on")) if r.get("mfu") else "n/a"
    memory = r.get("peak_memory_bytes")
    memory_text = " / ".join(f"{memory[k] / 2**30:.2f}" for k in ("off", "on")) + " GiB" if memory else "n/a"
    ratio = f"time on / off {benchutils.fmt_spread(r['on_over_off'])}"
    cells = [r["label"], f"{steps} a step ({rates} steps/s)", "", "", ratio, "", mfu, memory_text]
    return cells + [r["step_times"]["on"]["n"], benchutils.fmt_load(r)][: width - len(cells)]


def cells(label: str, r: dict[str, Any], times: str, tokens: str, speedup: str) -> list[Any]:
    """A table row from the record `r`: its `times`, `tokens` per second and `speedup` entries."""
    names = ("turner", "gpt2", "minimal")
    training = "first_step_seconds" in r

    def figure(name: str) -> str:
        if name not in r[times]:
            return "n/a"
        rate = f"{r[tokens][name] / 1e3:.1f}k tok/s" if r[tokens][name] >= 1e3 else f"{r[tokens][name]:.1f} tok/s"
        return f"{benchutils.fmt_ms(r[times][name]['median_s'])} ({rate})" if training else rate

    present = [name for name in names if name in r[times]]
    mfu = " / ".join(f"{r['mfu'][name]:.1%}" for name in present) if r.get("mfu") else "n/a"
    memory = r.get("peak_memory_bytes")
    memory_text = " / ".join(f"{memory[n] / 2**30:.2f}" for n in present) + " GiB" if memory else "n/a"
    return [
        label,
        *(figure(name) for name in names),
        *(benchutils.fmt_spread(r[speedup][f"vs_{n}"]) if f"vs_{n}" in r[speedup] else "n/a" for n in names[1:]),
        mfu,
        memory_text,
        r[times]["turner"]["n"],
        benchutils.fmt_load(r),
    ]


if __name__ == "__main__":
    main()
