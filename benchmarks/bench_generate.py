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
  fullgraph=True)`; on the CPU `mode="default"`, forced with `_compile_all_devices`; on CUDA `mode="reduce-overhead"`,
  CUDA graphs). Compilation happens in the warm-up and is timed separately.
* `continuous`: continuous batching, `model.generate_batch(prompts, ...)` (transformers' paged cache and scheduler,
  `ContinuousBatchingConfig` with room for every request's whole sequence), the batch's rows as its requests; the
  manager persists between calls, so its warm-up (CUDA-graph capture on CUDA) is in the first call.

In the static modes the same Turner model also runs with the dynamic cache in the rotation ("vs Turner dynamic": what
the static cache, and compilation, buy over the default). tokens/s = batch x new tokens / wall time of the whole
`generate` call (prefill included). Turner's speed-up is the median of per-repetition ratios (peer time / Turner
time). `--instances N` builds every contender N times over (the same weights, other memory: two builds of one model
can differ by a few percent on a shared machine) and times each build `--repeats` times; the speed-up pairs
repetitions within a build, and each build's own is kept beside it. `--device cuda --dtype bf16` runs it on a GPU with
bf16 weights, with each contender's peak memory (weights and caches plus the most a call allocates on top);
`benchmarks/gpu_column.py` runs it there with the others.
"""

from __future__ import annotations

import argparse
import gc
import statistics
from collections.abc import Callable
from typing import Any

import torch
from transformers import CompileConfig, ContinuousBatchingConfig, DynamicCache, GenerationConfig

from benchmarks import benchutils, devices
from benchmarks.peers import LMShape, build_on, gpt2_lm, minimal_lm, turner_lm
from turner_tfm.compat_turner import named_cache

MODES = ["dynamic", "static", "static-compile", "continuous"]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def compile_config(device_type: str = "cpu") -> CompileConfig:
    """The decoding step's compilation: CUDA graphs on CUDA (`reduce-overhead`, generate()'s own default mode there),
    inductor's default mode elsewhere (CUDA graphs need CUDA)."""
    mode = "reduce-overhead" if device_type == "cuda" else "default"
    config = CompileConfig(fullgraph=True, mode=mode, dynamic=False)
    config._compile_all_devices = True  # generate() only auto-compiles on accelerators otherwise
    return config


class BatchedRequests:
    """`model.generate_batch` of a prompt's rows as requests (greedy, exactly `new_tokens` each), returned as one tensor
    like generate()'s. The paged cache holds every request's whole sequence, as turner-serve sizes it. `spans`: each
    call's engine time, from the first request's arrival to the last one's end (without the manager's start and
    stop, which collect garbage and empty the device's cache)."""

    def __init__(self, model: torch.nn.Module, prompt: torch.Tensor, new_tokens: int) -> None:
        self.model, self.requests = model, prompt.tolist()
        batch, length = prompt.shape
        blocks = batch * -(-(length + new_tokens) // ContinuousBatchingConfig().page_size)
        self.paged = ContinuousBatchingConfig(num_blocks=blocks, max_batch_tokens=batch * length, seed=0)
        self.greedy = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=-1, pad_token_id=0)
        self.spans: list[float] = []

    def __call__(self) -> torch.Tensor:
        # Outside inference mode: transformers 5.23's manager thread resets its input tensors in place under no_grad
        # only, which an inference tensor (made here, under bench()'s inference mode) refuses.
        with torch.inference_mode(False):
            outputs = self.model.generate_batch(
                self.requests,
                generation_config=self.greedy,
                continuous_batching_config=self.paged,
                persistent_manager=True,
            )
        done = list(outputs.values())
        self.spans.append(max(out.lifespan[1] for out in done) - min(out.created_time for out in done))
        return torch.tensor([row + out.generated_tokens for row, out in zip(self.requests, done, strict=True)])


def generate_fn(model: torch.nn.Module, prompt: torch.Tensor, new_tokens: int, mode: str) -> Callable[[], Any]:
    if not hasattr(model, "generate"):
        return lambda: model.generate_greedy(prompt, new_tokens)
    if mode == "continuous":
        return BatchedRequests(model, prompt, new_tokens)
    kwargs: dict[str, Any] = {
        "max_new_tokens": new_tokens,
        "min_new_tokens": new_tokens,
        "do_sample": False,
        "pad_token_id": 0,
    }
    if mode == "static":
        kwargs |= {"cache_implementation": "static", "disable_compile": True}
    if mode == "static-compile":
        kwargs |= {"cache_implementation": "static", "compile_config": compile_config(prompt.device.type)}
    if mode == "concat":  # transformers' concatenating layers, passed in so generate() keeps them
        return lambda: model.generate(prompt, **named_cache(DynamicCache(config=model.config)), **kwargs)
    return lambda: model.generate(prompt, **kwargs)


@torch.inference_mode()
def bench(
    shape: LMShape,
    mode: str,
    batch: int,
    prompt_len: int,
    new_tokens: int,
    repeats: int,
    warmup: int,
    seed: int,
    device: torch.device | str = "cpu",
    dtype: str = "fp32",
    turner_variant: bool = True,
    instances: int = 1,
) -> dict[str, Any]:
    """One row: the contenders' calls in `mode`, timed in rotation. `turner_variant`: Turner also runs with
    concatenating cache layers (dynamic) or the dynamic cache (the other modes). `instances`: how many times every
    contender is built afresh (the same weights and prompt, other memory) and timed `repeats` times; the speed-ups
    pair repetitions within an instance and take the median over all of them, each instance's beside it."""
    device = torch.device(device)
    times: dict[str, list[float]] = {}
    instance_speedups, spans = [], {}
    before = benchutils.load_average()
    for instance in range(instances):
        fns, held, calls = build_contenders(
            shape, mode, batch, prompt_len, new_tokens, seed, device, dtype, turner_variant
        )
        first = devices.first_calls(fns, held, device, check_shape((batch, prompt_len + new_tokens)))
        if not instance:  # the first instance's first calls (compilation) and peaks stand for the row
            first_call, peaks = first, devices.peak_memory(fns, held, device)
        untimed = 2 if not instance and peaks is not None else 1  # the first call, and on CUDA the peaks' round
        one = benchutils.interleaved(fns, repeats, max(warmup - untimed, 0))
        instance_speedups.append(benchutils.speedups(one))
        for key, seconds in one.items():
            times.setdefault(key, []).extend(seconds)
        if mode == "continuous":
            for key, call in calls.items():
                spans.setdefault(key, []).extend(call.spans[-repeats:])
                call.model.destroy_cached_continuous_batching_manager()
        del fns, calls  # this build's models and compiled graphs go before the next build
        torch.compiler.reset()
        gc.collect()
    record = benchutils.timing_record(times, before)
    result = {
        "mode": mode,
        "batch": batch,
        "prompt": prompt_len,
        "new_tokens": new_tokens,
        "device": str(device),
        "dtype": dtype,
        "first_call_seconds": first_call,
        "tokens_per_second": {key: batch * new_tokens / s["median_s"] for key, s in record["times"].items()},
        "peak_memory_bytes": peaks,
        "turner_speedup": benchutils.speedups(times),
        "instances": instances,
        "instance_speedups": instance_speedups,
    } | record
    if mode == "continuous":
        result |= engine_record(spans, batch * new_tokens)
    return result


def build_contenders(
    shape: LMShape,
    mode: str,
    batch: int,
    prompt_len: int,
    new_tokens: int,
    seed: int,
    device: torch.device,
    dtype: str,
    turner_variant: bool,
) -> tuple[dict[str, Callable[[], Any]], dict[str, int | None], dict[str, Any]]:
    """Every contender of a row built afresh from `seed` (the same weights and prompt each time): the calls to time,
    the bytes each model holds, and the models' own calls (continuous batching's keep their engine times)."""
    torch.manual_seed(seed)
    factories = {"turner": turner_lm, "gpt2": gpt2_lm} | ({"minimal": minimal_lm} if mode == "dynamic" else {})

    def build(factory: Callable[[LMShape], torch.nn.Module]) -> torch.nn.Module:
        return build_on(device, factory, shape).to(DTYPES[dtype]).eval()

    models: dict[str, torch.nn.Module] = {}
    held = {}
    for key, factory in factories.items():
        models[key], held[key] = devices.held_by(lambda factory=factory: build(factory), device)
    prompt = build_on(device, torch.randint, 0, shape.vocab, (batch, prompt_len))
    calls = {key: generate_fn(model, prompt, new_tokens, mode) for key, model in models.items()}
    fns = dict(calls)
    if turner_variant and mode == "dynamic":  # the same Turner model with concatenating layers: what appending buys
        fns["turner_concat"] = generate_fn(models["turner"], prompt, new_tokens, "concat")
    elif turner_variant:  # the same Turner model with the default cache, eager: what the static cache buys
        fns["turner_dynamic"] = generate_fn(models["turner"], prompt, new_tokens, "dynamic")
    return {key: devices.synced(fn, device) for key, fn in fns.items()}, held, calls


def check_shape(expected: tuple[int, int]) -> Callable[[str, torch.Tensor], None]:
    """A check of each contender's first output: `generate()`'s ids of shape `expected`."""

    def check(key: str, out: torch.Tensor) -> None:
        if out.shape != expected:
            raise RuntimeError(f"{key} generated shape {tuple(out.shape)}")

    return check


def engine_record(spans: dict[str, list[float]], tokens: int) -> dict[str, Any]:
    """Continuous batching's engine time per timed call (`BatchedRequests.spans`), its tokens/s and speed-ups."""
    return {
        "engine_times": {key: benchutils.summarize(seconds) for key, seconds in spans.items()},
        "engine_tokens_per_second": {key: tokens / statistics.median(seconds) for key, seconds in spans.items()},
        "engine_turner_speedup": benchutils.speedups(spans),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modes", nargs="+", default=["dynamic", "static-compile"], choices=MODES)
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--dtype", default="fp32", choices=sorted(DTYPES), help="the weights' (default: %(default)s)")
    parser.add_argument("--vocab", type=int, default=65)
    benchutils.add_shape_arguments(parser, layers=6, heads=6, features=384)
    devices.add_device_arguments(parser)
    benchutils.add_run_arguments(parser, repeats=10, warmup=2)
    parser.add_argument(
        "--instances",
        type=int,
        default=1,
        help="build every contender afresh this many times, each timed --repeats times (default: %(default)s): two "
        "builds of one model can differ by a few percent on a shared machine",
    )
    args = parser.parse_args(argv)
    if args.instances < 1:
        parser.error(f"--instances must be at least 1, got {args.instances}")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    env = benchutils.start_run(args.threads) | {"device": devices.describe(args.device, args.peak_tflops)}
    positions = max(512, args.prompt + args.new_tokens)
    shape = LMShape(args.layers, args.heads, args.features, context=positions, vocab=args.vocab)
    results = []
    rows = []
    for mode in args.modes:
        for batch in args.batches:
            try:
                r = bench(
                    shape,
                    mode,
                    batch,
                    args.prompt,
                    args.new_tokens,
                    args.repeats,
                    args.warmup,
                    args.seed,
                    device=args.device,
                    dtype=args.dtype,
                    instances=args.instances,
                )
            except Exception as error:  # a compile failure is a result to report, not a crash
                results.append({"mode": mode, "batch": batch, "error": f"{type(error).__name__}: {error}"})
                rows.append([mode, batch, "failed"])
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
                    *memory_cells(r),
                    r["times"]["turner"]["n"],
                    benchutils.fmt_load(r),
                ]
            )
    benchutils.finish_run(env)
    header = ["cache", "batch", "Turner tok/s", "GPT-2 tok/s", "minimal tok/s", "Turner vs GPT-2", "Turner vs min"]
    memory = ["peak memory Turner / GPT-2 / min"] if any(r.get("peak_memory_bytes") for r in results) else []
    header += ["vs Turner concat / dynamic", *memory, "reps", "load avg"]
    rows = [row + [""] * (len(header) - len(row)) for row in rows]  # a failed row's empty cells
    intro = f"\nModel: {shape.describe()}, {args.dtype}; prompt {args.prompt}, {args.new_tokens} new tokens, greedy.\n"
    benchutils.print_report(env, benchutils.markdown_table(header, rows), intro, benchutils.SPEEDUP_NOTE)
    return benchutils.save_run(args, "generate", env, model=shape.describe(), results=results)


def memory_cells(result: dict[str, Any]) -> list[str]:
    """The peak-memory cell, Turner / GPT-2 / minimal in GiB, where the row has one (CUDA)."""
    peaks = result["peak_memory_bytes"]
    if not peaks:
        return []
    return [" / ".join(f"{peaks[key] / 2**30:.2f}" for key in ("turner", "gpt2", "minimal") if key in peaks) + " GiB"]


if __name__ == "__main__":
    main()
