"""Forward throughput of the Turner image classifier against ViTForImageClassification at ViT-Tiny-like dims.

Shape: 12 layers, 3 heads, 192 features, MLP 768, patch 16 on 224 x 224 RGB images (196 patches + a class token),
1000 labels, batch 8, no pooler, exact GELU, LayerNorm eps 1e-12, `sdpa` attention, random weights. Each call is
`model(pixel_values=x).logits` under `torch.inference_mode()` in eval mode.

Reported: images/s of each, and Turner's speed-up (median of per-repetition ratios ViT time / Turner time).
"""

from __future__ import annotations

import argparse
from typing import Any

import torch

from benchmarks.benchutils import (
    add_run_arguments,
    environment_markdown,
    finish_run,
    fmt_load,
    fmt_ms,
    fmt_ratio,
    interleaved,
    load_average,
    markdown_table,
    paired_ratios,
    start_run,
    summarize,
    under_load,
    write_json,
)
from benchmarks.peers import ImageShape, parameter_count, turner_image, vit_image


@torch.inference_mode()
def bench(shape: ImageShape, batch: int, repeats: int, warmup: int, seed: int) -> dict[str, Any]:
    load_before = load_average()
    torch.manual_seed(seed)
    models = {"turner": turner_image(shape).eval(), "vit": vit_image(shape).eval()}
    x = torch.randn(batch, 3, shape.image_size, shape.image_size)
    fns = {key: (lambda m=model: m(pixel_values=x).logits) for key, model in models.items()}
    times = interleaved(fns, repeats=repeats, warmup=warmup)
    return {
        "dims": shape.describe(),
        "batch": batch,
        "parameters": {key: parameter_count(model) for key, model in models.items()},
        "times": {key: summarize(t) for key, t in times.items()},
        "images_per_second": {key: batch / summarize(t)["median_s"] for key, t in times.items()},
        "turner_speedup": {"vs_vit": paired_ratios(times["vit"], times["turner"])},
        "raw_seconds": times,
    } | under_load(load_before)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--heads", type=int, default=3)
    parser.add_argument("--features", type=int, default=192)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--patch-size", type=int, default=16)
    add_run_arguments(parser, repeats=30, warmup=3)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    env = start_run(args.threads)
    shape = ImageShape(
        layers=args.layers,
        heads=args.heads,
        features=args.features,
        image_size=args.image_size,
        patch_size=args.patch_size,
    )
    r = bench(shape, args.batch, args.repeats, args.warmup, args.seed)
    s = r["turner_speedup"]["vs_vit"]
    rows = [
        [
            f"{r['dims']}, B={args.batch}",
            f"{fmt_ms(r['times']['turner']['median_s'])} ({r['images_per_second']['turner']:.1f} img/s)",
            f"{fmt_ms(r['times']['vit']['median_s'])} ({r['images_per_second']['vit']:.1f} img/s)",
            f"{fmt_ratio(s['median'])} [{s['q1']:.2f}-{s['q3']:.2f}]",
            r["times"]["turner"]["n"],
            fmt_load(r),
        ]
    ]
    finish_run(env)
    print(environment_markdown(env))
    print()
    print(
        markdown_table(
            ["image forward", "Turner", "ViTForImageClassification", "Turner vs ViT", "reps", "load avg"], rows
        )
    )
    print("\nSpeed-up = ViT time / Turner time, median of paired repetitions [interquartile range].")
    payload = {"benchmark": "vision_forward", "environment": env, "args": vars(args) | {"json": str(args.json)}}
    payload |= {"results": [r]}
    write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
