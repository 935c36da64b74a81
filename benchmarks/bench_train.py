"""Training step (forward + backward + AdamW) of the Turner LM against GPT2LMHeadModel and the minimal GPT floor.

Shapes: nanoGPT's CPU recipe (4 layers, 4 heads, 128 features, context 64, batch 12, vocabulary 65) and its GPU
recipe's model (6 layers, 6 heads, 384 features, context 256; batch 8 here). Each step is
`loss = model(input_ids=x, labels=x, use_cache=False).loss; loss.backward(); opt.step(); opt.zero_grad()` for the two
`transformers` models, exactly what `Trainer` runs (its `TrainingArguments.use_cache` defaults to False: a training
step builds no KV cache; one returned from a compiled step costs the backward a zero gradient per layer's keys and
values: at the CPU shape Turner's compiled step was 0.95x the minimal GPT's speed with it, 1.02x without), and the
same with pre-shifted targets for the minimal GPT, which has no cache. The optimizer is
`torch.optim.AdamW(fused=True)` for all three (Trainer's default on torch >= 2.8).

Modes: `eager`, and `compiled` (each model wrapped in `torch.compile`, as `TrainingArguments(torch_compile=True)`
does; the first step, which compiles, is timed separately). Precisions: `fp32`, and `bf16` (forward and loss under
`torch.autocast(device, dtype=torch.bfloat16)`, what `TrainingArguments(bf16=True)` does; weights and optimizer
stay fp32). Every combination of `--shapes`, `--modes` and `--precisions` is one row; a bf16 row also runs Turner
in fp32 in its rotation, so "bf16 speed-up" is a paired ratio like the others.

Reported: the median step time of each, and Turner's speed-up over each peer as the median of per-repetition ratios
(peer time / Turner time; > 1 means Turner is faster), the three run in rotating order each repetition; tokens/s;
MFU, the fraction of the device's bf16 peak that 6N + 12LDT FLOPs a token reach (N parameters, L layers, D features,
T context; only where the peak is known: see `benchmarks/devices.py`); and on CUDA each contender's peak memory (its
weights and optimizer state plus the most a step allocates on top). `--device cuda` runs it on a GPU, where
`gpt2-small` (GPT-2's 124M shape: 12 layers, 12 heads, 768 features, context 1024, vocabulary 50304, batch 16) is the
shape to use; `benchmarks/gpu_column.py` runs it there with the others.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable
from typing import Any

import torch

from benchmarks import benchutils, devices
from benchmarks.peers import LMShape, build_on, gpt2_lm, minimal_lm, parameter_count, turner_lm

SHAPES: dict[str, tuple[LMShape, int]] = {
    "nanogpt-cpu": (LMShape(layers=4, heads=4, features=128, context=64), 12),
    "nanogpt-gpu": (LMShape(layers=6, heads=6, features=384, context=256), 8),
    "gpt2-small": (LMShape(layers=12, heads=12, features=768, context=1024, vocab=50304), 16),
    "tiny": (LMShape(layers=2, heads=2, features=32, context=16), 2),
}
CONTENDERS = {"turner": turner_lm, "gpt2": gpt2_lm, "minimal": minimal_lm}


def train_step(model: torch.nn.Module, x: torch.Tensor, minimal: bool, mode: str, precision: str) -> Callable[[], None]:
    """A closure running one optimisation step on the batch `x` (on `x`'s device)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.99), weight_decay=0.1, fused=True)
    model.train()
    forward = torch.compile(model) if mode == "compiled" else model
    targets = torch.roll(x, -1, dims=1)

    def step() -> None:
        with autocast(precision, x.device.type):
            loss = forward(x, targets)[1] if minimal else forward(input_ids=x, labels=x, use_cache=False).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def autocast(precision: str, device_type: str) -> contextlib.AbstractContextManager:
    """bf16 mixed precision as the Trainer's `bf16=True` runs it, or nothing for fp32."""
    if precision == "bf16":
        return torch.autocast(device_type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def bench_shape(
    name: str,
    mode: str,
    precision: str,
    repeats: int,
    warmup: int,
    batch: int | None,
    seed: int,
    device: torch.device | str = "cpu",
    fp32_turner: bool = True,
    peak_flops: float | None = None,
) -> dict[str, Any]:
    """One row: the contenders' steps at shape `name`, timed in rotation. `fp32_turner`: a bf16 row also times Turner
    in fp32; `peak_flops`: the device's bf16 peak for a bf16 row's MFU (None: no MFU)."""
    device = torch.device(device)
    shape, default_batch = SHAPES[name]
    batch = batch or default_batch
    torch.manual_seed(seed)
    models, held = {}, {}
    for key, factory in CONTENDERS.items():
        models[key], held[key] = devices.held_by(lambda factory=factory: build_on(device, factory, shape), device)
    x = build_on(device, torch.randint, 0, shape.vocab, (batch, shape.context))
    fns = {key: train_step(model, x, key == "minimal", mode, precision) for key, model in models.items()}
    if precision == "bf16" and fp32_turner:  # what autocast buys, measured in the same rotation
        models["turner_fp32"], held["turner_fp32"] = devices.held_by(lambda: build_on(device, turner_lm, shape), device)
        fns["turner_fp32"] = train_step(models["turner_fp32"], x, False, mode, "fp32")
    fns = {key: devices.synced(fn, device) for key, fn in fns.items()}
    first_step = devices.first_calls(fns, held, device)  # the first step compiles in compiled mode
    peaks = devices.peak_memory(fns, held, device)
    times, record = benchutils.timed(fns, repeats, max(warmup - (1 if peaks is None else 2), 0))
    parameters = {key: parameter_count(model) for key, model in models.items()}
    tokens = {key: batch * shape.context / s["median_s"] for key, s in record["times"].items()}
    flops = {key: devices.training_flops_per_token(n, shape) for key, n in parameters.items()}
    bf16_peak = peak_flops is not None and precision == "bf16"  # the peak is bf16's: no MFU for an fp32 row
    return {
        "shape": name,
        "mode": mode,
        "precision": precision,
        "device": str(device),
        "dims": shape.describe(),
        "batch": batch,
        "parameters": parameters,
        "first_step_seconds": first_step,
        "tokens_per_second": tokens,
        "flops_per_token": flops,
        "mfu": {key: devices.mfu(tokens[key], flops[key], peak_flops) for key in tokens} if bf16_peak else None,
        "peak_memory_bytes": peaks,
        "turner_speedup": benchutils.speedups(times),
    } | record


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=["nanogpt-cpu", "nanogpt-gpu"], choices=sorted(SHAPES))
    parser.add_argument("--modes", nargs="+", default=["eager"], choices=["eager", "compiled"])
    parser.add_argument("--precisions", nargs="+", default=["fp32"], choices=["fp32", "bf16"])
    parser.add_argument("--batch", type=int, default=None, help="override every shape's batch size")
    devices.add_device_arguments(parser)
    benchutils.add_run_arguments(parser, repeats=30, warmup=3)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    env = benchutils.start_run(args.threads) | {"device": devices.describe(args.device, args.peak_tflops)}
    peak = env["device"]["peak_bf16_flops"]
    results = [
        bench_shape(
            name, mode, precision, args.repeats, args.warmup, args.batch, args.seed, args.device, peak_flops=peak
        )
        for name in args.shapes
        for mode in args.modes
        for precision in args.precisions
    ]
    benchutils.finish_run(env)
    rows = []
    for r in results:
        t, s = r["times"], r["turner_speedup"]
        rows.append(
            [
                f"{r['shape']} ({r['dims']}, B={r['batch']})",
                r["mode"],
                r["precision"],
                *(benchutils.fmt_ms(t[key]["median_s"]) for key in ("turner", "gpt2", "minimal")),
                benchutils.fmt_spread(s["vs_gpt2"]),
                benchutils.fmt_spread(s["vs_minimal"]),
                benchutils.fmt_spread(s["vs_turner_fp32"]) if "vs_turner_fp32" in s else "n/a",
                *device_cells(r, ("turner", "gpt2", "minimal")),
                t["turner"]["n"],
                benchutils.fmt_load(r),
            ]
        )
    header = ["training step", "mode", "precision", "Turner", "GPT2LMHeadModel", "minimal GPT", "Turner vs GPT-2"]
    header += ["Turner vs min", "bf16 speed-up", *device_header(results), "reps", "load avg"]
    benchutils.print_report(env, benchutils.markdown_table(header, rows), note=benchutils.SPEEDUP_NOTE)
    for r in results:
        if r["mode"] == "compiled":
            firsts = ", ".join(f"{key} {seconds:.1f} s" for key, seconds in r["first_step_seconds"].items())
            print(f"First compiled step ({r['shape']}, {r['precision']}), compilation included: {firsts}")
    return benchutils.save_run(args, "train_step", env, results=results)


def device_header(results: list[dict[str, Any]]) -> list[str]:
    """The MFU and peak-memory columns, where some row has them (a GPU run, or a peak given)."""
    header = ["MFU Turner / GPT-2 / min"] if any(r.get("mfu") for r in results) else []
    return header + (["peak memory Turner / GPT-2 / min"] if any(r.get("peak_memory_bytes") for r in results) else [])


def device_cells(result: dict[str, Any], names: tuple[str, ...]) -> list[str]:
    """`result`'s MFU and peak-memory cells for `names`, where it has them (`device_header`'s columns)."""
    cells = []
    if result.get("mfu"):
        cells.append(" / ".join(f"{result['mfu'][name]:.1%}" for name in names))
    if result.get("peak_memory_bytes"):
        cells.append(" / ".join(f"{result['peak_memory_bytes'][name] / 2**30:.1f} GiB" for name in names))
    return cells


if __name__ == "__main__":
    main()
