"""Training step (forward + backward + AdamW) of the Turner LM against GPT2LMHeadModel and the minimal GPT floor.

Shapes: nanoGPT's CPU recipe (4 layers, 4 heads, 128 features, context 64, batch 12, vocabulary 65) and its GPU
recipe's model (6 layers, 6 heads, 384 features, context 256; batch 8 here). Each step is
`loss = model(input_ids=x, labels=x).loss; loss.backward(); opt.step(); opt.zero_grad()` for the two `transformers`
models, exactly what `Trainer` runs, and the same with pre-shifted targets for the minimal GPT. The optimizer is
`torch.optim.AdamW(fused=True)` for all three (Trainer's default on torch >= 2.8).

Modes: `eager`, and `compiled` (each model wrapped in `torch.compile`, as `TrainingArguments(torch_compile=True)`
does; the first step, which compiles, is timed separately). Precisions: `fp32`, and `bf16` (forward and loss under
`torch.autocast(device, dtype=torch.bfloat16)`, what `TrainingArguments(bf16=True)` does; weights and optimizer
stay fp32). Every combination of `--shapes`, `--modes` and `--precisions` is one row; a bf16 row also runs Turner
in fp32 in its rotation, so "bf16 speed-up" is a paired ratio like the others.

Reported: the median step time of each, and Turner's speed-up over each peer as the median of per-repetition ratios
(peer time / Turner time; > 1 means Turner is faster), the three run in rotating order each repetition.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Callable
from typing import Any

import torch

from benchmarks import benchutils
from benchmarks.peers import LMShape, gpt2_lm, minimal_lm, parameter_count, turner_lm

SHAPES: dict[str, tuple[LMShape, int]] = {
    "nanogpt-cpu": (LMShape(layers=4, heads=4, features=128, context=64), 12),
    "nanogpt-gpu": (LMShape(layers=6, heads=6, features=384, context=256), 8),
    "tiny": (LMShape(layers=2, heads=2, features=32, context=16), 2),
}


def train_step(model: torch.nn.Module, x: torch.Tensor, minimal: bool, mode: str, precision: str) -> Callable[[], None]:
    """A closure running one optimisation step on the batch `x`."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.99), weight_decay=0.1, fused=True)
    model.train()
    forward = torch.compile(model) if mode == "compiled" else model
    targets = torch.roll(x, -1, dims=1)

    def step() -> None:
        with autocast(precision, x.device.type):
            loss = forward(x, targets)[1] if minimal else forward(input_ids=x, labels=x).loss
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
    name: str, mode: str, precision: str, repeats: int, warmup: int, batch: int | None, seed: int
) -> dict[str, Any]:
    shape, default_batch = SHAPES[name]
    batch = batch or default_batch
    torch.manual_seed(seed)
    models = {"turner": turner_lm(shape), "gpt2": gpt2_lm(shape), "minimal": minimal_lm(shape)}
    x = torch.randint(0, shape.vocab, (batch, shape.context))
    fns = {key: train_step(model, x, key == "minimal", mode, precision) for key, model in models.items()}
    if precision == "bf16":  # what autocast buys, measured in the same rotation
        models["turner_fp32"] = turner_lm(shape)
        fns["turner_fp32"] = train_step(models["turner_fp32"], x, False, mode, "fp32")
    first_step = {}
    for key, fn in fns.items():  # the first step compiles in compiled mode
        start = time.perf_counter()
        fn()
        first_step[key] = time.perf_counter() - start
    times, record = benchutils.timed(fns, repeats, max(warmup - 1, 0))
    return {
        "shape": name,
        "mode": mode,
        "precision": precision,
        "dims": shape.describe(),
        "batch": batch,
        "parameters": {key: parameter_count(model) for key, model in models.items()},
        "first_step_seconds": first_step,
        "turner_speedup": benchutils.speedups(times),
    } | record


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=["nanogpt-cpu", "nanogpt-gpu"], choices=sorted(SHAPES))
    parser.add_argument("--modes", nargs="+", default=["eager"], choices=["eager", "compiled"])
    parser.add_argument("--precisions", nargs="+", default=["fp32"], choices=["fp32", "bf16"])
    parser.add_argument("--batch", type=int, default=None, help="override every shape's batch size")
    benchutils.add_run_arguments(parser, repeats=30, warmup=3)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    env = benchutils.start_run(args.threads)
    results = [
        bench_shape(name, mode, precision, args.repeats, args.warmup, args.batch, args.seed)
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
                t["turner"]["n"],
                benchutils.fmt_load(r),
            ]
        )
    header = ["training step", "mode", "precision", "Turner", "GPT2LMHeadModel", "minimal GPT", "Turner vs GPT-2"]
    header += ["Turner vs min", "bf16 speed-up", "reps", "load avg"]
    benchutils.print_report(env, benchutils.markdown_table(header, rows), note=benchutils.SPEEDUP_NOTE)
    for r in results:
        if r["mode"] == "compiled":
            firsts = ", ".join(f"{key} {seconds:.1f} s" for key, seconds in r["first_step_seconds"].items())
            print(f"First compiled step ({r['shape']}, {r['precision']}), compilation included: {firsts}")
    return benchutils.save_run(args, "train_step", env, results=results)


if __name__ == "__main__":
    main()
