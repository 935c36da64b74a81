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

from benchmarks import benchutils
from benchmarks.peers import ImageShape, parameter_count, turner_image, vit_image


@torch.inference_mode()
def bench(shape: ImageShape, batch: int, repeats: int, warmup: int, seed: int) -> dict[str, Any]:
    torch.manual_seed(seed)
    models = {"turner": turner_image(shape).eval(), "vit": vit_image(shape).eval()}
    x = torch.randn(batch, 3, shape.image_size, shape.image_size)
    fns = {key: (lambda m=model: m(pixel_values=x).logits) for key, model in models.items()}
    times, record = benchutils.timed(fns, repeats, warmup)
    return {
        "dims": shape.describe(),
        "batch": batch,
        "parameters": {key: parameter_count(model) for key, model in models.items()},
        "images_per_second": {key: batch / summary["median_s"] for key, summary in record["times"].items()},
        "turner_speedup": benchutils.speedups(times),
    } | record


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    benchutils.add_shape_arguments(parser, layers=12, heads=3, features=192)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--patch-size", type=int, default=16)
    benchutils.add_run_arguments(parser, repeats=30, warmup=3)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    env = benchutils.start_run(args.threads)
    sizes = {"layers": args.layers, "heads": args.heads, "features": args.features}
    shape = ImageShape(**sizes, image_size=args.image_size, patch_size=args.patch_size)
    r = bench(shape, args.batch, args.repeats, args.warmup, args.seed)
    cells = [
        f"{benchutils.fmt_ms(r['times'][key]['median_s'])} ({r['images_per_second'][key]:.1f} img/s)"
        for key in ("turner", "vit")
    ]
    row = [f"{r['dims']}, B={args.batch}", *cells, benchutils.fmt_spread(r["turner_speedup"]["vs_vit"])]
    benchutils.finish_run(env)
    header = ["image forward", "Turner", "ViTForImageClassification", "Turner vs ViT", "reps", "load avg"]
    table = benchutils.markdown_table(header, [[*row, r["times"]["turner"]["n"], benchutils.fmt_load(r)]])
    note = "\nSpeed-up = ViT time / Turner time, median of paired repetitions [interquartile range]."
    benchutils.print_report(env, table, note=note)
    return benchutils.save_run(args, "vision_forward", env, results=[r])


if __name__ == "__main__":
    main()
