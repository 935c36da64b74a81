"""The `Trainer` path against a plain PyTorch loop: what `Trainer.train()` costs over the loop it runs for you.

The same Turner LM (nanoGPT's CPU recipe by default: L4 H4 D128, context 64, batch 12, vocabulary 65) trains for
`--steps` steps on the same batches, three ways, in rotating order each repetition:

* `loop`: the bare step, `model(input_ids=x, labels=x).loss.backward(); opt.step(); opt.zero_grad()`.
* `loop+recipe`: the same loop doing what the Trainer's defaults do besides: gradient clipping to norm 1.0, a linear
  learning-rate schedule, batches from a `DataLoader` with `default_data_collator`.
* `trainer`: `Trainer(model, TrainingArguments(max_steps=..., ...)).train()`, logging and saving off.

`loop+recipe / loop` is the recipe's cost; `trainer / loop+recipe` is the Trainer's own overhead (its setup,
callbacks, accelerate's wrappers); a callback also times the Trainer's training loop alone, from `on_train_begin`
to `on_train_end`, which leaves the setup out. With `--modes compiled` the loops run `torch.compile(model)` and the
Trainer gets `torch_compile=True`; compilation happens in the warm-up. Each figure is the wall time of a whole run of
`--steps` steps (the Trainer's setup amortised over them), as a median of paired ratios.
"""

from __future__ import annotations

import argparse
import importlib.util
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
from datasets import Dataset
from transformers import (
    Trainer,
    TrainerCallback,
    TrainingArguments,
    default_data_collator,
    get_linear_schedule_with_warmup,
)

from benchmarks import benchutils, devices
from benchmarks.bench_train import SHAPES
from benchmarks.peers import parameter_count, turner_lm

LEARNING_RATE = 1e-4
# the Trainer's run without logging, checkpoints, trackers, progress bars or pinned memory (a CPU has none)
QUIET = dict(
    logging_strategy="no", save_strategy="no", report_to="none", disable_tqdm=True, dataloader_pin_memory=False
)


def bare_loop(model: torch.nn.Module, batches: list[torch.Tensor], compiled: bool) -> Callable[[], None]:
    forward = torch.compile(model) if compiled else model

    def run() -> None:
        optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, fused=True)
        for x in batches:
            forward(input_ids=x, labels=x).loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    return run


def recipe_loop(model: torch.nn.Module, dataset: Dataset, batch: int, compiled: bool) -> Callable[[], None]:
    forward = torch.compile(model) if compiled else model

    def run() -> None:
        optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, fused=True)
        loader = torch.utils.data.DataLoader(dataset, batch_size=batch, collate_fn=default_data_collator)
        schedule = get_linear_schedule_with_warmup(optimizer, 0, len(loader))
        for inputs in loader:
            forward(**inputs).loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)

    return run


class LoopTimer(TrainerCallback):
    """Seconds from `on_train_begin` to `on_train_end` of each `train()` call: the Trainer's loop without its setup."""

    def __init__(self) -> None:
        self.seconds: list[float] = []

    def on_train_begin(self, *args: Any, **kwargs: Any) -> None:
        self.start = time.perf_counter()

    def on_train_end(self, *args: Any, **kwargs: Any) -> None:
        self.seconds.append(time.perf_counter() - self.start)


def trainer_run(
    model: torch.nn.Module, dataset: Dataset, batch: int, compiled: bool, output_dir: str, timer: LoopTimer
) -> Callable[[], Any]:
    steps = {"max_steps": len(dataset) // batch, "per_device_train_batch_size": batch, "learning_rate": LEARNING_RATE}
    args = TrainingArguments(output_dir=output_dir, **steps, torch_compile=compiled, use_cpu=True, **QUIET)
    trainer = Trainer(model, args, train_dataset=dataset, data_collator=default_data_collator, callbacks=[timer])
    return lambda: trainer.train()


def bench(shape_name: str, mode: str, steps: int, repeats: int, warmup: int, seed: int) -> dict[str, Any]:
    shape, batch = SHAPES[shape_name]
    torch.manual_seed(seed)
    ids = torch.randint(0, shape.vocab, (steps * batch, shape.context))
    dataset = Dataset.from_dict({"input_ids": ids.tolist(), "labels": ids.tolist()}).with_format("torch")
    batches = list(ids.split(batch))
    compiled = mode == "compiled"
    timer = LoopTimer()
    with tempfile.TemporaryDirectory() as output_dir:
        fns = {
            "loop": bare_loop(turner_lm(shape), batches, compiled),
            "loop+recipe": recipe_loop(turner_lm(shape), dataset, batch, compiled),
            "trainer": trainer_run(turner_lm(shape), dataset, batch, compiled, output_dir, timer),
        }
        times, record = benchutils.timed(fns, repeats, warmup)
    return {
        "shape": shape_name,
        "dims": shape.describe(),
        "batch": batch,
        "mode": mode,
        "steps": steps,
        "trainer_loop_only": benchutils.summarize(timer.seconds[-repeats:]),
        "ratios": {
            "recipe_over_loop": benchutils.paired_ratios(times["loop+recipe"], times["loop"]),
            "trainer_over_recipe": benchutils.paired_ratios(times["trainer"], times["loop+recipe"]),
            "trainer_over_loop": benchutils.paired_ratios(times["trainer"], times["loop"]),
        },
    } | record


# The GPU column's Trainer rows (benchmarks/gpu_column.py): one switch off and on, Turner through `Trainer.train()`,
# where nothing synchronises besides the Trainer itself: TrainingArguments for Liger, the config for the value checks
SWITCHES: dict[str, tuple[str, str]] = {
    "liger": ("arguments", "use_liger_kernel"),
    "checks": ("config", "check_input_values"),
}


def switch_not_run(switch: str, device: torch.device) -> str | None:
    """Why the `switch` row cannot run here (None: it can)."""
    if switch != "liger":
        return None
    if importlib.util.find_spec("liger_kernel") is None:
        return "liger-kernel is not installed (pip install liger-kernel)"
    if device.type != "cuda":
        return "Liger's Triton kernels need a CUDA device (triton's CPU interpreter runs its loss, not its norms)"
    return None


def bench_switch(
    shape_name: str, switch: str, batch: int, steps: int, repeats: int, warmup: int, seed: int, device: torch.device,
    compiled: bool = False, peak_flops: float | None = None,
) -> dict[str, Any]:  # fmt: skip
    """`steps` Trainer steps with `switch` off and on, in rotation (bf16 on CUDA): each one's time per step from
    `on_train_begin` to `on_train_end` (the Trainer's loop, its setup left out), MFU and peak memory (CUDA)."""
    shape = SHAPES[shape_name][0]
    where, name = SWITCHES[switch]
    record = {"shape": shape_name, "dims": shape.describe(), "batch": batch, "mode": switch, "steps": steps}
    record |= {"compiled": compiled, "device": str(device), "switch": name}
    if reason := switch_not_run(switch, device):
        return record | {"not_run": reason}
    torch.manual_seed(seed)
    ids = torch.randint(0, shape.vocab, (steps * batch, shape.context))
    dataset = Dataset.from_dict({"input_ids": ids.tolist(), "labels": ids.tolist()}).with_format("torch")
    timers, fns, parameters = {}, {}, 0
    with tempfile.TemporaryDirectory() as output_dir:
        for value in (False, True):
            model = turner_lm(shape)
            if where == "config":
                model.config.check_input_values = value
            parameters = parameter_count(model)
            arguments = {name: value} if where == "arguments" else {}
            args = TrainingArguments(
                output_dir=f"{output_dir}/{value}", max_steps=steps, per_device_train_batch_size=batch,
                learning_rate=LEARNING_RATE, torch_compile=compiled, use_cpu=device.type == "cpu",
                bf16=device.type == "cuda", **arguments, **QUIET,
            )  # fmt: skip
            timers[value] = LoopTimer()
            trainer = Trainer(model, args, train_dataset=dataset, data_collator=default_data_collator)
            trainer.add_callback(timers[value])
            fns["on" if value else "off"] = trainer.train
        peaks = {key: devices.peak_above(fn, device) for key, fn in fns.items()}  # the first runs (compile) too
        _, timing = benchutils.timed(fns, repeats, max(warmup - 1, 0))
    loop = {("on" if value else "off"): timer.seconds[-repeats:] for value, timer in timers.items()}
    per_step = {key: benchutils.summarize([s / steps for s in seconds]) for key, seconds in loop.items()}
    tokens = {key: batch * shape.context / s["median_s"] for key, s in per_step.items()}
    flops = devices.training_flops_per_token(parameters, shape)
    return (
        record
        | {
            "step_times": per_step,
            "steps_per_second": {key: 1 / s["median_s"] for key, s in per_step.items()},
            "on_over_off": benchutils.paired_ratios(loop["on"], loop["off"]),
            "tokens_per_second": tokens,
            "flops_per_token": flops,
            "mfu": {key: devices.mfu(rate, flops, peak_flops) for key, rate in tokens.items()} if peak_flops else None,
            # the model's fp32 weights, and the most a run allocates on top (gradients, AdamW's moments, activations)
            "peak_memory_bytes": None
            if device.type != "cuda"
            else {key: 4 * parameters + b for key, b in peaks.items()},
        }
        | timing
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="nanogpt-cpu", choices=sorted(SHAPES))
    parser.add_argument("--modes", nargs="+", default=["eager", "compiled"], choices=["eager", "compiled"])
    parser.add_argument("--steps", type=int, default=50, help="optimiser steps per timed run")
    benchutils.add_run_arguments(parser, repeats=5, warmup=1)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    env = benchutils.start_run(args.threads)
    results = [bench(args.shape, mode, args.steps, args.repeats, args.warmup, args.seed) for mode in args.modes]
    benchutils.finish_run(env)
    rows = []
    for r in results:
        t, q = r["times"], r["ratios"]
        per_step = {key: benchutils.fmt_ms(t[key]["median_s"] / r["steps"]) for key in t}
        rows.append(
            [
                r["mode"],
                per_step["loop"],
                per_step["loop+recipe"],
                per_step["trainer"],
                benchutils.fmt_ms(r["trainer_loop_only"]["median_s"] / r["steps"]),
                benchutils.fmt_spread(q["recipe_over_loop"]),
                benchutils.fmt_spread(q["trainer_over_recipe"]),
                t["loop"]["n"],
                benchutils.fmt_load(r),
            ]
        )
    header = ["mode", "loop / step", "loop+recipe / step", "Trainer / step", "Trainer's loop alone / step"]
    header += ["recipe cost", "Trainer overhead", "reps", "load avg"]
    intro = f"\nTurner LM {results[0]['dims']}, batch {results[0]['batch']}, {args.steps} steps per run.\n"
    note = "\nrecipe cost = loop+recipe time / loop time; Trainer overhead = Trainer time / loop+recipe time."
    benchutils.print_report(env, benchutils.markdown_table(header, rows), intro, note)
    return benchutils.save_run(args, "trainer", env, results=results)


if __name__ == "__main__":
    main()
