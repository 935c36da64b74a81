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

from benchmarks.bench_train import SHAPES
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
from benchmarks.peers import turner_lm

LEARNING_RATE = 1e-4


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
    args = TrainingArguments(
        output_dir=output_dir,
        max_steps=len(dataset) // batch,
        per_device_train_batch_size=batch,
        learning_rate=LEARNING_RATE,
        torch_compile=compiled,
        use_cpu=True,
        logging_strategy="no",
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_pin_memory=False,
    )
    trainer = Trainer(
        model=model, args=args, train_dataset=dataset, data_collator=default_data_collator, callbacks=[timer]
    )
    return lambda: trainer.train()


def bench(shape_name: str, mode: str, steps: int, repeats: int, warmup: int, seed: int) -> dict[str, Any]:
    shape, batch = SHAPES[shape_name]
    load_before = load_average()
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
        times = interleaved(fns, repeats=repeats, warmup=warmup)
    return {
        "shape": shape_name,
        "dims": shape.describe(),
        "batch": batch,
        "mode": mode,
        "steps": steps,
        "times": {key: summarize(t) for key, t in times.items()},
        "trainer_loop_only": summarize(timer.seconds[-repeats:]),
        "ratios": {
            "recipe_over_loop": paired_ratios(times["loop+recipe"], times["loop"]),
            "trainer_over_recipe": paired_ratios(times["trainer"], times["loop+recipe"]),
            "trainer_over_loop": paired_ratios(times["trainer"], times["loop"]),
        },
        "raw_seconds": times,
    } | under_load(load_before)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="nanogpt-cpu", choices=sorted(SHAPES))
    parser.add_argument("--modes", nargs="+", default=["eager", "compiled"], choices=["eager", "compiled"])
    parser.add_argument("--steps", type=int, default=50, help="optimiser steps per timed run")
    add_run_arguments(parser, repeats=5, warmup=1)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    env = start_run(args.threads)
    results = [bench(args.shape, mode, args.steps, args.repeats, args.warmup, args.seed) for mode in args.modes]
    finish_run(env)
    rows = []
    for r in results:
        t, q = r["times"], r["ratios"]
        per_step = {key: fmt_ms(t[key]["median_s"] / r["steps"]) for key in t}
        rows.append(
            [
                r["mode"],
                per_step["loop"],
                per_step["loop+recipe"],
                per_step["trainer"],
                fmt_ms(r["trainer_loop_only"]["median_s"] / r["steps"]),
                f"{fmt_ratio(q['recipe_over_loop']['median'])} [{q['recipe_over_loop']['q1']:.2f}-"
                f"{q['recipe_over_loop']['q3']:.2f}]",
                f"{fmt_ratio(q['trainer_over_recipe']['median'])} [{q['trainer_over_recipe']['q1']:.2f}-"
                f"{q['trainer_over_recipe']['q3']:.2f}]",
                t["loop"]["n"],
                fmt_load(r),
            ]
        )
    header = ["mode", "loop / step", "loop+recipe / step", "Trainer / step", "Trainer's loop alone / step"]
    header += ["recipe cost", "Trainer overhead"]
    print(environment_markdown(env))
    print(f"\nTurner LM {results[0]['dims']}, batch {results[0]['batch']}, {args.steps} steps per run.\n")
    print(markdown_table([*header, "reps", "load avg"], rows))
    print("\nrecipe cost = loop+recipe time / loop time; Trainer overhead = Trainer time / loop+recipe time.")
    payload = {"benchmark": "trainer", "environment": env, "args": vars(args) | {"json": str(args.json)}}
    payload |= {"results": results}
    write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
