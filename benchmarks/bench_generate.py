"""Greedy generation tokens/s of the Turner LM against GPT2LMHeadModel (and the minimal GPT's plain KV-cache loop).

Model: nanoGPT's GPU-recipe model (6 layers, 6 heads, 384 features, vocabulary 65) with 512 learned positions so
that prompt + new tokens fit. Each call is `model.generate(prompt, max_new_tokens=256, min_new_tokens=256,
do_sample=False)`: prompt 128 tokens, batch 1 and 8, random weights (the same tokens come out for every repetition).
Modes:

* `dynamic`: the default `DynamicCache`, eager. The minimal GPT runs its own greedy loop with a concatenating cache.
  Turner also runs with a `DynamicCache` of transformers' own `DynamicLayer`s, which concatenate ("vs Turner
  concat": what Turner's appending `TurnerDynamicLayer` buys; GPT-2's default cache concatenates).
* `static`: `cache_implementation="static"`, eager (`disable_compile=True`).
* `static-compile`: `cache_implementation="static"` with `torch.compile` of the decoding step (`CompileConfig(
  fullgraph=True, mode="default")`, forced on CPU with `_compile_all_devices`; "reduce-overhead" is CUDA graphs).
  Compilation happens in the warm-up and is timed separately.

In the static modes the same Turner model also runs with the dynamic cache in the rotation ("vs Turner dynamic": what
the static cache, and compilation, buy over the default). tokens/s = batch x new tokens / wall time of the whole
`generate` call (prefill included). Turner's speed-up is the median of per-repetition ratios (peer time / Turner
time).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch
from transformers import CompileConfig, DynamicCache

from benchmarks import benchutils
from benchmarks.peers import LMShape, gpt2_lm, minimal_lm, turner_lm
from turner_tfm.compat_turner import named_cache

MODES = ["dynamic", "static", "static-compile"]


def compile_config() -> CompileConfig:
    config = CompileConfig(fullgraph=True, mode="default", dynamic=False)
    config._compile_all_devices = True  # generate() only auto-compiles on accelerators otherwise
    return config


def generate_fn(model: torch.nn.Module, prompt: torch.Tensor, new_tokens: int, mode: str) -> Callable[[], Any]:
    if not hasattr(model, "generate"):
        return lambda: model.generate_greedy(prompt, new_tokens)
    kwargs: dict[str, Any] = {
        "max_new_tokens": new_tokens,
        "min_new_tokens": new_tokens,
        "do_sample": False,
        "pad_token_id": 0,
    }
    if mode == "static":
        kwargs |= {"cache_implementation": "static", "disable_compile": True}
    if mode == "static-compile":
        kwargs |= {"cache_implementation": "static", "compile_config": compile_config()}
    if mode == "concat":  # transformers' concatenating layers, passed in so generate() keeps them
        return lambda: model.generate(prompt, **named_cache(DynamicCache(config=model.config)), **kwargs)
    return lambda: model.generate(prompt, **kwargs)


@torch.inference_mode()
def bench(
    shape: LMShape, mode: str, batch: int, prompt_len: int, new_tokens: int, repeats: int, warmup: int, seed: int
) -> dict[str, Any]:
    torch.manual_seed(seed)
    models: dict[str, torch.nn.Module] = {"turner": turner_lm(shape), "gpt2": gpt2_lm(shape)}
    if mode == "dynamic":
        models["minimal"] = minimal_lm(shape)
    for model in models.values():
        model.eval()
    prompt = torch.randint(0, shape.vocab, (batch, prompt_len))
    fns = {key: generate_fn(model, prompt, new_tokens, mode) for key, model in models.items()}
    if mode == "dynamic":  # the same Turner model with concatenating cache layers: what appending buys
        fns["turner_concat"] = generate_fn(models["turner"], prompt, new_tokens, "concat")
    else:  # the same Turner model with the default cache, eager: what the static cache buys
        fns["turner_dynamic"] = generate_fn(models["turner"], prompt, new_tokens, "dynamic")
    first_call = {}
    for key, fn in fns.items():  # the first call compiles in static-compile mode
        start = time.perf_counter()
        out = fn()
        first_call[key] = time.perf_counter() - start
        if out.shape != (batch, prompt_len + new_tokens):
            raise RuntimeError(f"{key} generated shape {tuple(out.shape)}")
    times, record = benchutils.timed(fns, repeats, max(warmup - 1, 0))
    return {
        "mode": mode,
        "batch": batch,
        "prompt": prompt_len,
        "new_tokens": new_tokens,
        "first_call_seconds": first_call,
        "tokens_per_second": {key: batch * new_tokens / s["median_s"] for key, s in record["times"].items()},
        "turner_speedup": benchutils.speedups(times),
    } | record


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", nargs="+", default=["dynamic", "static-compile"], choices=MODES)
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=256)
    benchutils.add_shape_arguments(parser, layers=6, heads=6, features=384)
    benchutils.add_run_arguments(parser, repeats=10, warmup=2)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    env = benchutils.start_run(args.threads)
    positions = max(512, args.prompt + args.new_tokens)
    shape = LMShape(layers=args.layers, heads=args.heads, features=args.features, context=positions)
    results = []
    rows = []
    for mode in args.modes:
        for batch in args.batches:
            try:
                r = bench(shape, mode, batch, args.prompt, args.new_tokens, args.repeats, args.warmup, args.seed)
            except Exception as error:  # a compile failure is a result to report, not a crash
                results.append({"mode": mode, "batch": batch, "error": f"{type(error).__name__}: {error}"})
                rows.append([mode, batch, "failed", "", "", "", "", "", "", ""])
                continue
            results.append(r)
            tps, s = r["tokens_per_second"], r["turner_speedup"]
            vs_min, vs_own = s.get("vs_minimal"), s.get("vs_turner_dynamic", s.get("vs_turner_concat"))
            rows.append(
                [
                    mode,
                    batch,
                    f"{tps['turner']:.1f}",
                    f"{tps['gpt2']:.1f}",
                    f"{tps['minimal']:.1f}" if "minimal" in tps else "n/a",
                    benchutils.fmt_spread(s["vs_gpt2"]),
                    benchutils.fmt_spread(vs_min) if vs_min else "n/a",
                    benchutils.fmt_spread(vs_own) if vs_own else "n/a",
                    r["times"]["turner"]["n"],
                    benchutils.fmt_load(r),
                ]
            )
    benchutils.finish_run(env)
    header = ["cache", "batch", "Turner tok/s", "GPT-2 tok/s", "minimal tok/s", "Turner vs GPT-2", "Turner vs min"]
    header += ["vs Turner concat / dynamic", "reps", "load avg"]
    intro = f"\nModel: {shape.describe()}; prompt {args.prompt}, {args.new_tokens} new tokens, greedy.\n"
    benchutils.print_report(env, benchutils.markdown_table(header, rows), intro, benchutils.SPEEDUP_NOTE)
    return benchutils.save_run(args, "generate", env, model=shape.describe(), results=results)


if __name__ == "__main__":
    main()
