"""Where a `generate()` call spends its time: Turner and GPT-2 side by side, one profiled call each after warm-up.

For a row of `bench_generate.py` that misses its target: the same model, prompt and mode, the operators that took the
most time (self time, torch.profiler on the CPU), and each model's total. Example, the static cache compiled:

    python -m benchmarks.profile_generate --threads 1 --mode static-compile --batch 1 --new-tokens 128
"""

from __future__ import annotations

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.bench_generate import MODES, generate_fn
from benchmarks.benchutils import add_run_arguments, environment_markdown, finish_run, start_run
from benchmarks.peers import LMShape, gpt2_lm, turner_lm


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", default="static-compile", choices=MODES)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--rows", type=int, default=12, help="operators listed per model")
    parser.add_argument("--warmup", type=int, default=2, help="unprofiled calls first (the first one compiles)")
    add_run_arguments(parser, seed=0)
    return parser.parse_args(argv)


@torch.inference_mode()
def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    env = start_run(args.threads)
    shape = LMShape(layers=6, heads=6, features=384, context=args.prompt + args.new_tokens)
    torch.manual_seed(args.seed)
    prompt = torch.randint(0, shape.vocab, (args.batch, args.prompt))
    for name, build in (("Turner", turner_lm), ("GPT-2", gpt2_lm)):
        call = generate_fn(build(shape).eval(), prompt, args.new_tokens, args.mode)
        for _ in range(args.warmup):
            call()
        with profile(activities=[ProfilerActivity.CPU]) as profiled:
            call()
        events = profiled.key_averages()
        total_ms = sum(event.self_cpu_time_total for event in events) / 1e3
        run = f"{args.mode}, batch {args.batch}, {args.prompt} + {args.new_tokens} tokens"
        print(f"\n## {name}: {run}: {total_ms:.0f} ms\n")
        print(events.table(sort_by="self_cpu_time_total", row_limit=args.rows))
    print(environment_markdown(finish_run(env)))


if __name__ == "__main__":
    main()
