"""Where a `generate()` call spends its time: Turner and GPT-2 side by side, one profiled call each after warm-up.

For a row of `bench_generate.py` that misses its target: the same model, prompt and mode, the operators that took the
most time, and each model's totals. On the CPU: self time of torch's operators (torch.profiler). On CUDA
(`--device cuda`): the GPU kernels too, by device time, and per generated token the kernels launched and their device
time, which is where a decoding step under CUDA graphs loses or wins (the host's work is gone there). Examples, the
static cache compiled, on the CPU and at GPT-2's shape on a GPU:

    python -m benchmarks.profile_generate --threads 1 --mode static-compile --batch 1 --new-tokens 128
    python -m benchmarks.profile_generate --device cuda --dtype bf16 --shape gpt2-small --batch 64 \
        --json benchmarks/results/gpu/profile_static_b64.json
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks import benchutils, devices
from benchmarks.bench_generate import DTYPES, MODES, generate_fn
from benchmarks.bench_train import SHAPES
from benchmarks.peers import LMShape, build_on, gpt2_lm, turner_lm

SHAPE_NAMES = ["nanogpt-gpu", "gpt2-small", "tiny"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", default="static-compile", choices=MODES)
    parser.add_argument("--shape", default="nanogpt-gpu", choices=SHAPE_NAMES, help="the model (%(default)s)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--dtype", default="fp32", choices=sorted(DTYPES), help="the weights' (default: %(default)s)")
    parser.add_argument("--rows", type=int, default=12, help="operators (and kernels) listed per model")
    parser.add_argument("--warmup", type=int, default=2, help="unprofiled calls first (the first one compiles)")
    devices.add_device_arguments(parser)
    benchutils.add_run_arguments(parser, seed=0)
    return parser.parse_args(argv)


def model_shape(name: str, positions: int) -> LMShape:
    """`name`'s layers, heads, features and vocabulary, with room for `positions` positions."""
    shape = SHAPES[name][0]
    return LMShape(shape.layers, shape.heads, shape.features, context=max(shape.context, positions), vocab=shape.vocab)


def kernel_totals(events: Any, new_tokens: int) -> dict[str, float]:
    """The GPU kernels' launches and device time in one profiled call, in all and per generated token."""
    kernels = [event for event in events if event.device_type == torch.autograd.DeviceType.CUDA]
    launches = sum(event.count for event in kernels)
    device_us = sum(event.self_device_time_total for event in kernels)
    return {
        "kernels": launches,
        "kernel_us": device_us,
        "kernels_per_token": launches / new_tokens,
        "kernel_us_per_token": device_us / new_tokens,
    }


def top_events(events: Any, sort_by: str, rows: int) -> list[dict[str, Any]]:
    """The `rows` events that took the most `sort_by` time: name, calls, and that time in microseconds."""
    ranked = sorted(events, key=lambda event: getattr(event, sort_by), reverse=True)[:rows]
    return [{"name": event.key, "count": event.count, sort_by: getattr(event, sort_by)} for event in ranked]


@torch.inference_mode()
def profile_one(
    name: str,
    build: Callable[[LMShape], torch.nn.Module],
    shape: LMShape,
    prompt: torch.Tensor,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """One model's profiled call (after `args.warmup` unprofiled ones): its table printed, its totals returned."""
    model = build_on(args.device, build, shape).to(DTYPES[args.dtype]).eval()
    call = devices.synced(generate_fn(model, prompt, args.new_tokens, args.mode), args.device)
    for _ in range(args.warmup):
        call()
    on_cuda = args.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
    with profile(activities=activities) as profiled:
        call()
    events = profiled.key_averages()
    sort_by = "self_device_time_total" if on_cuda else "self_cpu_time_total"
    result = {
        "host_self_ms": sum(event.self_cpu_time_total for event in events) / 1e3,
        "top": top_events(events, sort_by, args.rows),
    } | (kernel_totals(events, args.new_tokens) if on_cuda else {})
    run = f"{args.mode}, batch {args.batch}, {args.prompt} + {args.new_tokens} tokens, {args.dtype}"
    totals = f"host {result['host_self_ms']:.0f} ms"
    if on_cuda:
        totals += f", {result['kernels_per_token']:.1f} kernels and {result['kernel_us_per_token']:.1f} us a token"
    print(f"\n## {name}: {run}: {totals}\n")
    print(events.table(sort_by=sort_by, row_limit=args.rows))
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    env = benchutils.start_run(args.threads) | {"device": devices.describe(args.device, args.peak_tflops)}
    shape = model_shape(args.shape, args.prompt + args.new_tokens)
    torch.manual_seed(args.seed)
    prompt = build_on(args.device, torch.randint, 0, shape.vocab, (args.batch, args.prompt))
    contenders = {"turner": turner_lm, "gpt2": gpt2_lm}
    models = {name: profile_one(name, build, shape, prompt, args) for name, build in contenders.items()}
    env = benchutils.finish_run(env)
    print(benchutils.environment_markdown(env))
    options = {key: getattr(args, key) for key in ("mode", "batch", "prompt", "new_tokens", "dtype")}
    return benchutils.save_run(args, "profile_generate", env, model=shape.describe(), **options, models=models)


if __name__ == "__main__":
    main()
