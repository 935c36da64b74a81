"""Peak memory of Turner's attention paths (eager vs sdpa) as the sequence length N doubles (footnote 5).

Footnote 5 of the paper: "the need for transformers to store and compute N x N attention arrays can be a major
computational bottleneck". The eager path materialises the scores, the softmax and the mask as (B, H, N, N) arrays;
`scaled_dot_product_attention` on CPU runs a blocked (flash) kernel that never holds the whole N x N array.

Method. The model is a 1-block causal Turner LM backbone (`TurnerModel`, D=128, H=2 by default, batch 1, fixed
sinusoidal positions so that no parameter's size depends on the longest N). Each call
runs under `torch.profiler.profile(profile_memory=True)`, which makes the CPU allocator report every allocation and
free with the running total of bytes allocated since profiling started (`Total Allocated` of the `[memory]` events
in the trace `export_chrome_trace` writes, torch's public record of them). The peak of that running total is the
most memory the call held at once on top of what was live before it (weights and inputs excluded): exact for CPU
tensors, independent of the OS allocator and of other processes. `inference` mode is a forward under
`torch.inference_mode()`; `training` mode is forward + backward.

Reported per N: the peak of each path, eager / sdpa, and the growth factor when N doubles (2 = linear, 4 = quadratic),
with the size of one (B, H, N, N) float32 array for reference.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks import benchutils
from turner_tfm import TurnerConfig, TurnerModel

MIB = 2**20
CPU = 0  # the `Device Type` of a CPU allocation in the profiler's trace (c10::DeviceType::CPU)


def peak_allocated_bytes(fn: Any) -> tuple[int, float]:
    """Peak CPU bytes held at once by allocations made while `fn()` runs, and its wall time (profiled)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        start = time.perf_counter()
        fn()
        seconds = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as folder:
        trace = Path(folder) / "trace.json"
        prof.export_chrome_trace(str(trace))
        events = json.loads(trace.read_text())["traceEvents"]
    memory = [e["args"] for e in events if e.get("name") == "[memory]"]
    totals = [args["Total Allocated"] for args in memory if args["Device Type"] == CPU]
    return max(totals, default=0), seconds


def build(args: argparse.Namespace, impl: str, max_len: int) -> TurnerModel:
    config = TurnerConfig(
        vocab_size=65,
        hidden_size=args.features,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        max_position_embeddings=max_len,
        position_embedding_type="sinusoidal",  # no position table, whose gradient would be a constant offset
        attn_implementation=impl,
    )
    torch.manual_seed(0)
    return TurnerModel(config)


def measure(model: TurnerModel, x: torch.Tensor, mode: str) -> tuple[int, float]:
    if mode == "inference":
        model.eval()

        def call() -> None:
            with torch.inference_mode():
                model(input_ids=x, use_cache=False)

    else:
        model.train()

        def call() -> None:
            model(input_ids=x, use_cache=False).last_hidden_state.sum().backward()
            model.zero_grad(set_to_none=True)

    call()  # warm-up: lazily created buffers and caches are not part of the peak
    return peak_allocated_bytes(call)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", nargs="+", type=int, default=[256, 512, 1024, 2048, 4096])
    parser.add_argument("--modes", nargs="+", default=["inference", "training"], choices=["inference", "training"])
    parser.add_argument("--features", type=int, default=128)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--batch", type=int, default=1)
    benchutils.add_run_arguments(parser, seed=None)
    return parser.parse_args(argv)


def growth(values: list[int], i: int) -> str:
    return f"{values[i] / values[i - 1]:.2f}x" if i and values[i - 1] else ""


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    env = benchutils.start_run(args.threads)
    lengths = sorted(args.lengths)
    results = []
    print(benchutils.environment_markdown(env))
    for mode in args.modes:
        peaks: dict[str, list[int]] = {}
        seconds: dict[str, list[float]] = {}
        for impl in ("eager", "sdpa"):
            model = build(args, impl, lengths[-1])
            peaks[impl], seconds[impl] = [], []
            for n in lengths:
                x = torch.randint(0, 65, (args.batch, n))
                peak, secs = measure(model, x, mode)
                peaks[impl].append(peak)
                seconds[impl].append(secs)
        score_bytes = [4 * args.batch * args.heads * n * n for n in lengths]
        exponents = {
            impl: math.log2(values[-1] / values[-2]) if len(values) > 1 and values[-2] else None
            for impl, values in peaks.items()
        }
        rows = [
            [
                n,
                f"{peaks['eager'][i] / MIB:.1f}",
                growth(peaks["eager"], i),
                f"{peaks['sdpa'][i] / MIB:.1f}",
                growth(peaks["sdpa"], i),
                f"{peaks['eager'][i] / peaks['sdpa'][i]:.1f}x",
                f"{score_bytes[i] / MIB:.1f}",
            ]
            for i, n in enumerate(lengths)
        ]
        header = ["N", "eager MiB", "eager growth", "sdpa MiB", "sdpa growth", "eager / sdpa", "one BxHxNxN fp32 MiB"]
        print(f"\n{mode}: TurnerModel, {args.layers} block(s), D={args.features}, H={args.heads}, batch {args.batch}\n")
        print(benchutils.markdown_table(header, rows))
        print(
            "\nGrowth = peak(N) / peak(N/2): 2x is linear, 4x quadratic. Exponent over the last doubling: "
            + ", ".join(f"{impl} {e:.2f}" for impl, e in exponents.items() if e is not None)
        )
        results.append(
            {
                "mode": mode,
                "lengths": lengths,
                "peak_bytes": peaks,
                "seconds": seconds,
                "scores_array_bytes": score_bytes,
                "eager_over_sdpa": [e / s for e, s in zip(peaks["eager"], peaks["sdpa"], strict=True)],
                "exponent_last_doubling": exponents,
            }
        )
    print(f"\nLoad average {benchutils.fmt_load(benchutils.finish_run(env))}; peak bytes do not depend on it.")
    method = "peak of torch.profiler(profile_memory=True) Total Allocated during the call"
    return benchutils.save_run(args, "attention_memory", env, method=method, results=results)


if __name__ == "__main__":
    main()
