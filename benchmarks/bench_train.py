"""Training step (forward + backward + AdamW) of the Turner LM against GPT2LMHeadModel and the minimal GPT floor.

Shapes: nanoGPT's CPU recipe (4 layers, 4 heads, 128 features, context 64, batch 12, vocabulary 65) and its GPU
recipe's model (6 layers, 6 heads, 384 features, context 256; batch 8 here). Each step is
`loss = model(input_ids=x, labels=x).loss; loss.backward(); opt.step(); opt.zero_grad()` for the two `transformers`
models, exactly what `Trainer` runs, and the same with pre-shifted targets for the minimal GPT. The optimizer is
`torch.optim.AdamW(fused=True)` for all three (Trainer's default on torch >= 2.8).

Reported: the median step time of each, and Turner's speed-up over each peer as the median of per-repetition ratios
(peer time / Turner time; > 1 means Turner is faster), the three run in rotating order each repetition.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchutils import (
    add_run_arguments,
    environment_markdown,
    fmt_ms,
    fmt_ratio,
    interleaved,
    markdown_table,
    paired_ratios,
    start_run,
    summarize,
    write_json,
)
from peers import LMShape, gpt2_lm, minimal_lm, parameter_count, turner_lm

SHAPES: dict[str, tuple[LMShape, int]] = {
    "nanogpt-cpu": (LMShape(layers=4, heads=4, features=128, context=64), 12),
    "nanogpt-gpu": (LMShape(layers=6, heads=6, features=384, context=256), 8),
    "tiny": (LMShape(layers=2, heads=2, features=32, context=16), 2),
}


def train_step(model: torch.nn.Module, x: torch.Tensor, minimal: bool, **kwargs: Any) -> Callable[[], None]:
    """A closure running one optimisation step on the batch `x`."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.99), weight_decay=0.1, fused=True)
    model.train()
    targets = torch.roll(x, -1, dims=1)

    def step() -> None:
        loss = model(x, targets)[1] if minimal else model(input_ids=x, labels=x, **kwargs).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def bench_shape(name: str, repeats: int, warmup: int, batch: int | None, seed: int) -> dict[str, Any]:
    shape, default_batch = SHAPES[name]
    batch = batch or default_batch
    torch.manual_seed(seed)
    models = {"turner": turner_lm(shape), "gpt2": gpt2_lm(shape), "minimal": minimal_lm(shape)}
    x = torch.randint(0, shape.vocab, (batch, shape.context))
    fns = {key: train_step(model, x, minimal=key == "minimal") for key, model in models.items()}
    times = interleaved(fns, repeats=repeats, warmup=warmup)
    return {
        "shape": name,
        "dims": shape.describe(),
        "batch": batch,
        "parameters": {key: parameter_count(model) for key, model in models.items()},
        "times": {key: summarize(t) for key, t in times.items()},
        "turner_speedup": {
            "vs_gpt2": paired_ratios(times["gpt2"], times["turner"]),
            "vs_minimal": paired_ratios(times["minimal"], times["turner"]),
        },
        "raw_seconds": times,
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=["nanogpt-cpu", "nanogpt-gpu"], choices=sorted(SHAPES))
    parser.add_argument("--batch", type=int, default=None, help="override every shape's batch size")
    add_run_arguments(parser, repeats=30, warmup=3)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    env = start_run(args.threads)
    results = [bench_shape(name, args.repeats, args.warmup, args.batch, args.seed) for name in args.shapes]
    rows = []
    for r in results:
        t, s = r["times"], r["turner_speedup"]
        rows.append(
            [
                f"{r['shape']} ({r['dims']}, B={r['batch']})",
                fmt_ms(t["turner"]["median_s"]),
                fmt_ms(t["gpt2"]["median_s"]),
                fmt_ms(t["minimal"]["median_s"]),
                f"{fmt_ratio(s['vs_gpt2']['median'])} [{s['vs_gpt2']['q1']:.2f}-{s['vs_gpt2']['q3']:.2f}]",
                f"{fmt_ratio(s['vs_minimal']['median'])} [{s['vs_minimal']['q1']:.2f}-{s['vs_minimal']['q3']:.2f}]",
                t["turner"]["n"],
            ]
        )
    header = ["training step", "Turner", "GPT2LMHeadModel", "minimal GPT", "Turner vs GPT-2", "Turner vs min", "reps"]
    print(environment_markdown(env))
    print()
    print(markdown_table(header, rows))
    print("\nSpeed-up = peer time / Turner time, median of paired repetitions [interquartile range].")
    payload = {"benchmark": "train_step", "environment": env, "args": vars(args) | {"json": str(args.json)}}
    write_json(args.json, payload | {"results": results})
    return payload | {"results": results}


if __name__ == "__main__":
    main()
