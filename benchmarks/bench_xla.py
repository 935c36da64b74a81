"""What a `Trainer` step costs on XLA, Turner beside GPT-2: graph compilations, graph executions, device-to-host
transfers and CPU fallbacks (ops XLA does not compile) per step once warm, counted by `torch_xla.debug.metrics`.

Both models (the same shape, learned positions, tied head) train with the Trainer's defaults but the optimizer
(`optim="adamw_torch"`: the default fused AdamW refuses XLA tensors, GPT-2's too), logging and saving off, on batches
of one shape; Turner with its input checks on (the default) and off. The counters are read after `--warmup` steps
and again after `--steps` more, through a callback: the differences, divided by the steps, are what each step costs.
Run under `PJRT_DEVICE=CPU` (torch_xla's CPU device) or on a TPU:

    PJRT_DEVICE=CPU python -m benchmarks.bench_xla --steps 10

`--generate N` counts greedy `generate()` calls instead (N new tokens after a prompt of half the context, both caches,
pad id 0), per call once warm: generate() syncs nowhere, so Turner's checks read the prompt's values at once there,
where GPT-2 reads nothing but what its decoding loop reads each step.
"""

from __future__ import annotations

import argparse
import tempfile
from typing import Any

import torch
import torch_xla.debug.metrics as metrics
from datasets import Dataset
from torch_xla.core import xla_model
from transformers import Trainer, TrainerCallback, TrainingArguments

from benchmarks import benchutils
from benchmarks.peers import LMShape, gpt2_lm, turner_lm


def turner_unchecked(shape: LMShape) -> torch.nn.Module:
    """Turner with its input checks off (`check_input_values=False`): what the checks cost, by difference."""
    model = turner_lm(shape)
    model.config.check_input_values = False
    return model


MODELS = {"turner": turner_lm, "turner, checks off": turner_unchecked, "gpt2": gpt2_lm}


def counts() -> dict[str, int]:
    """The XLA counters a step's cost is read from: compilations, executions, transfers to the host, CPU fallbacks,
    once every execution started has finished (torch_xla runs them asynchronously; waiting builds no graph)."""
    xla_model.wait_device_ops()
    fallbacks = sum(metrics.counter_value(name) or 0 for name in metrics.counter_names() if name.startswith("aten::"))
    return {
        "compilations": (metrics.metric_data("CompileTime") or (0,))[0],
        "executions": (metrics.metric_data("ExecuteTime") or (0,))[0],
        "transfers_to_host": (metrics.metric_data("TransferFromDeviceTime") or (0,))[0],
        "cpu_fallbacks": fallbacks,
    }


class Counted(TrainerCallback):
    """The counters at the end of step `warmup` and of the last step."""

    def __init__(self, warmup: int) -> None:
        self.warmup, self.readings = warmup, []

    def on_step_end(self, args: TrainingArguments, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step in (self.warmup, state.max_steps):
            self.readings.append(counts())


def per_step(name: str, shape: LMShape, batch: int, warmup: int, steps: int) -> dict[str, float]:
    """Train `name` for warmup + steps steps through the Trainer on XLA; its counters per step after warm-up."""
    torch.manual_seed(0)
    model = MODELS[name](shape)
    ids = torch.randint(0, shape.vocab, ((warmup + steps) * batch, shape.context))
    data = Dataset.from_dict({"input_ids": ids.tolist(), "labels": ids.tolist()})
    callback = Counted(warmup)
    with tempfile.TemporaryDirectory() as folder:
        args = TrainingArguments(
            output_dir=folder,
            max_steps=warmup + steps,
            per_device_train_batch_size=batch,
            optim="adamw_torch",
            report_to="none",
            save_strategy="no",
            logging_strategy="no",
            dataloader_drop_last=True,
        )
        Trainer(model=model, args=args, train_dataset=data, callbacks=[callback]).train()
    before, after = callback.readings
    return {key: (after[key] - before[key]) / steps for key in before}


def per_generate(name: str, shape: LMShape, batch: int, new_tokens: int, cache: str, warmup: int, calls: int):
    """The counters per greedy generate() call of `name` on XLA, after `warmup` calls of the same prompt shape."""
    import torch_xla

    torch.manual_seed(0)
    model = MODELS[name](shape).eval().to(torch_xla.device())
    model.tie_weights()  # `.to()` on XLA splits the tied head (any transformers model's)
    prompt = torch.randint(3, shape.vocab, (batch, shape.context // 2)).to(torch_xla.device())
    settings = {"max_new_tokens": new_tokens, "do_sample": False, "cache_implementation": cache, "pad_token_id": 0}
    readings = []
    for call in range(warmup + calls):
        if call == warmup:
            torch_xla.sync()  # what the warm-up left pending runs before the count
            readings.append(counts())
        model.generate(prompt, **settings)
    torch_xla.sync()  # and what the counted calls left, inside it
    readings.append(counts())
    before, after = readings
    return {key: (after[key] - before[key]) / calls for key in before}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--features", type=int, default=128)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=3, help="steps (or calls) before counting (compiling is there)")
    parser.add_argument("--steps", type=int, default=10, help="steps (or generate() calls) counted after the warm-up")
    parser.add_argument("--generate", type=int, default=0, metavar="N", help="count generate() calls of N new tokens")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args(argv)
    import torch_xla

    env = benchutils.environment() | {"torch_xla": torch_xla.__version__, "xla_device": str(torch_xla.device())}
    shape = LMShape(args.layers, args.heads, args.features, context=args.context)
    if args.generate:
        results = {
            f"{name}, {cache} cache": per_generate(
                name, shape, args.batch, args.generate, cache, args.warmup, args.steps
            )
            for name in MODELS
            for cache in ("dynamic", "static")
        }
        unit, intro = "call", f"greedy generate() of {args.generate} new tokens after {shape.context // 2}"
        intro = f"{intro} on XLA ({env['xla_device']}), {shape.describe()}, batch {args.batch}, after {args.warmup}"
        intro = f"{intro} warm-up calls"
    else:
        results = {name: per_step(name, shape, args.batch, args.warmup, args.steps) for name in MODELS}
        unit, intro = "step", f"Trainer steps on XLA ({env['xla_device']}), {shape.describe()}, batch {args.batch}"
        intro = f"{intro}, after {args.warmup} warm-up steps"
    env |= benchutils.under_load(env["load_before"])
    header = ["model", *(f"{count} / {unit}" for count in ("compilations", "executions", "transfers to host"))]
    header.append(f"CPU fallbacks / {unit}")
    rows = [[name, *(f"{value:g}" for value in result.values())] for name, result in results.items()]
    benchutils.print_report(env, benchutils.markdown_table(header, rows), intro=intro)
    return benchutils.save_run(args, "xla", env, results=results)


if __name__ == "__main__":
    main()
