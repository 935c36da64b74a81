"""Host cost per generated token and per training forward: Turner against GPT2LMHeadModel and the minimal GPT.

On a GPU a small model's decoding step waits on the host, not on the card (the H100 measurement of 2026-11-26: 5 ms
a step, ~0.1 ms of weight reads). The host work is the same on any CPU when the arithmetic is negligible, so this
measures it there: a deep, narrow model (12 layers, 32 features, 4 heads by default), batch 1, one torch thread.

For each contender and case, these axes:

* time: this thread's CPU time (`time.thread_time`: the host's own work, which time spent waiting for a busy
  machine's cores does not inflate) and wall time, interleaved repetitions with the contenders rotated, as every
  benchmark here;
* aten ops: operator events that `torch.profiler` records (nested ones included, e.g. `aten::linear` and the
  `aten::addmm` it calls), and of those the top-level ones, which Python called (each a crossing into torch's
  dispatcher; `nn.Linear` is one, `aten::linear`, whatever it calls inside);
* Python calls: the function calls `cProfile` counts (Python functions and built-ins).

Cases: `dynamic` (`generate()` greedy with the default dynamic cache), `static` (`cache_implementation="static"`,
eager), and `forward` (a training forward, `model(input_ids, labels=input_ids)` in train mode); on request
`static-compile`, the static cache with the decoding step compiled (inductor, `bench_generate.compile_config`; compiled
before anything is counted), where the model's own Python is inside the graph and what is left per token is
generate()'s loop and the compiled call's wrappers and guards: on a GPU, under CUDA graphs, most of a small model's
step. Per generated token is the difference between a call with `--new-tokens` and one with twice as many, divided by
the extra tokens: the prompt and generate()'s set-up cancel out. The minimal GPT runs its own greedy loop (dynamic
only).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks import benchutils
from benchmarks.bench_generate import generate_fn
from benchmarks.peers import LMShape, gpt2_lm, minimal_lm, turner_lm

CASES = ["dynamic", "static", "forward"]
OPTIONAL_CASES = ["static-compile"]  # compiles each model twice (the long call's cache is longer): not by default
AXES = ("seconds", "aten_ops", "top_level_ops", "python_calls")  # what each case counts per contender


def aten_ops(call: Callable[[], Any]) -> tuple[int, int]:
    """Operator events `torch.profiler` records in one call: all (nested ones counted), and the top-level ones (not
    called by another operator)."""
    with profile(activities=[ProfilerActivity.CPU]) as profiled:
        call()
    events = [event for event in profiled.events() if event.name.startswith("aten::")]
    top_level = [event for event in events if not (event.cpu_parent and event.cpu_parent.name.startswith("aten::"))]
    return len(events), len(top_level)


def python_calls(call: Callable[[], Any]) -> int:
    """Function calls (Python and built-in) `cProfile` counts in one call."""
    profiler = cProfile.Profile()
    profiler.runcall(call)
    return pstats.Stats(profiler).total_calls


def calls_of(models: dict[str, torch.nn.Module], case: str, prompt: torch.Tensor, new_tokens: int) -> dict:
    """For each contender, the call measured (short) and the same call with more work (long)."""
    if case == "forward":
        steps = {}
        for name, model in models.items():
            model.train()
            if name == "minimal":
                targets = torch.roll(prompt, -1, dims=1)
                steps[name] = (lambda m=model, t=targets: m(prompt, t)[1], None)
            else:
                steps[name] = (lambda m=model: m(input_ids=prompt, labels=prompt).loss, None)
        return steps
    return {
        name: (generate_fn(model, prompt, new_tokens, case), generate_fn(model, prompt, 2 * new_tokens, case))
        for name, model in models.items()
        if case == "dynamic" or name != "minimal"
    }


def per_unit(short: float, long: float | None, new_tokens: int) -> float:
    """Per generated token (the long call's extra tokens), or per call for the forward."""
    return short if long is None else (long - short) / new_tokens


def bench(shape: LMShape, case: str, prompt_len: int, new_tokens: int, repeats: int, warmup: int) -> dict[str, Any]:
    torch.manual_seed(0)
    models = {"turner": turner_lm(shape).eval(), "gpt2": gpt2_lm(shape).eval(), "minimal": minimal_lm(shape).eval()}
    prompt = torch.randint(0, shape.vocab, (1, prompt_len))
    calls = calls_of(models, case, prompt, new_tokens)
    with torch.inference_mode() if case != "forward" else torch.enable_grad():
        if case == "static-compile":  # compile outside the counts and the timing
            for call in (call for pair in calls.values() for call in pair):
                call()
        counted = {name: [aten_ops(c) if c else (None, None) for c in pair] for name, pair in calls.items()}
        ops, top_ops = (
            {name: per_unit(*(counts[axis] for counts in pair), new_tokens) for name, pair in counted.items()}
            for axis in (0, 1)
        )
        py = {
            name: per_unit(*(python_calls(c) if c else None for c in pair), new_tokens) for name, pair in calls.items()
        }
        timed_calls = {
            f"{name}/{length}": c for name, pair in calls.items() for length, c in zip("sl", pair, strict=True) if c
        }
        _, record = benchutils.timed(timed_calls, repeats, warmup, clock=time.thread_time)
        _, wall = benchutils.timed(timed_calls, repeats, 1)

    def per_contender(summaries: dict) -> dict[str, float]:
        medians = {key: summary["median_s"] for key, summary in summaries.items()}
        return {name: per_unit(medians[f"{name}/s"], medians.get(f"{name}/l"), new_tokens) for name in calls}

    axes = dict(zip(AXES, (per_contender(record["times"]), ops, top_ops, py), strict=True))
    return {
        "case": case,
        "unit": "forward" if case == "forward" else "generated token",
        "wall_seconds": per_contender(wall["times"]),
        **axes,
        "turner_ratio": {
            axis: {peer: values["turner"] / values[peer] for peer in values if peer != "turner"}
            for axis, values in axes.items()
        },
    } | {key: value for key, value in record.items() if key != "raw_seconds"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", default=CASES, choices=CASES + OPTIONAL_CASES)
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=32, help="the short call's; the long call makes twice")
    benchutils.add_shape_arguments(parser, layers=12, heads=4, features=32)
    benchutils.add_run_arguments(parser, repeats=20, warmup=3, seed=None)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    env = benchutils.start_run(args.threads)
    context = max(64, args.prompt + 2 * args.new_tokens)
    shape = LMShape(layers=args.layers, heads=args.heads, features=args.features, context=context)
    results = [bench(shape, case, args.prompt, args.new_tokens, args.repeats, args.warmup) for case in args.cases]
    benchutils.finish_run(env)
    rows = []
    for r in results:
        for name in ("turner", "gpt2", "minimal"):
            if name not in r["seconds"]:
                continue
            ratios = [r["turner_ratio"][axis].get(name) for axis in AXES]
            rows.append(
                [
                    f"{r['case']} (per {r['unit']})",
                    name,
                    f"{r['seconds'][name] * 1e6:.0f} us",
                    f"{r['wall_seconds'][name] * 1e6:.0f} us",
                    f"{r['aten_ops'][name]:.0f}",
                    f"{r['top_level_ops'][name]:.0f}",
                    f"{r['python_calls'][name]:.0f}",
                    " / ".join("-" if ratio is None else f"{ratio:.2f}x" for ratio in ratios),
                    benchutils.fmt_load(r),
                ]
            )
    header = ["case", "model", "CPU time", "wall time", "aten ops", "from Python", "Python calls"]
    header += ["Turner / this (CPU time / ops / from Python / calls)", "load"]
    intro = f"\nModel: {shape.describe()}, batch 1, prompt {args.prompt}; below 1.00x Turner does less.\n"
    benchutils.print_report(env, benchutils.markdown_table(header, rows), intro)
    return benchutils.save_run(args, "host_cost", env, model=shape.describe(), results=results)


if __name__ == "__main__":
    main()
