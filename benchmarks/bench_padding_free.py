"""Padding-free training against padded batches of the same sequences: training tokens per second.

The data is what the scripts train on by default with `--padding-free`, character-level, cut at --block-size:
`--task causal-lm`, the paragraphs of the standard-library docstrings (`train_causal_lm.py`); `--task
text-classification`, the built-in code-or-prose lines and their labels (`train_text_classifier.py`), on the script's
model shape unless the shape flags say otherwise. The same batches of --batch-size sequences are collated two ways,
as one packed row (`DataCollatorWithFlattening`, `position_ids` restarting per sequence, no mask; one label per
sequence for the classifier) and padded to the longest sequence (attention mask, padding ignored by the loss). One
training step (forward, backward, AdamW) per timed call, the two in rotation; tokens/s counts real tokens only, the
same for both.

    python -m benchmarks.bench_padding_free --threads 1 --json benchmarks/results/padding_free.json
    python -m benchmarks.bench_padding_free --task text-classification --threads 1 \
        --json benchmarks/results/2026-11-22/padding_free_text_classification.json
"""

from __future__ import annotations

import argparse
import itertools
from typing import Any

import torch
from datasets import Dataset
from transformers import PreTrainedTokenizerFast

from benchmarks import benchutils
from benchmarks.peers import LMShape, turner_config
from examples.helpers import data, padding_free
from turner_tfm import TurnerForCausalLM, TurnerForSequenceClassification

# each task's script defaults: model shape and --per-device-train-batch-size
TASK_DEFAULTS = {
    "causal-lm": {"layers": 4, "heads": 4, "features": 128, "batch_size": 16},
    "text-classification": {"layers": 2, "heads": 4, "features": 64, "batch_size": 32},
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", choices=tuple(TASK_DEFAULTS), default="causal-lm", help="whose data and model")
    parser.add_argument("--block-size", type=int, default=128, help="longest sequence, in characters")
    parser.add_argument("--batch-size", type=int, help="sequences per batch (default: the task's script's)")
    parser.add_argument("--batches", type=int, default=8, help="distinct batches, cycled through")
    benchutils.add_shape_arguments(parser, layers=None, heads=None, features=None)  # default: the task's script's
    parser.add_argument("--attn-implementation", default="sdpa")
    benchutils.add_run_arguments(parser, repeats=24, warmup=2)
    args = parser.parse_args(argv)
    for name, default in TASK_DEFAULTS[args.task].items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    return args


def causal_lm_data(args: argparse.Namespace) -> tuple[PreTrainedTokenizerFast, Dataset]:
    """The paragraphs `train_causal_lm.py --padding-free` trains on."""
    text = data.stdlib_docstrings()
    tokenizer = data.char_tokenizer([text], model_max_length=args.block_size)
    return tokenizer, padding_free.paragraph_sequences(tokenizer, text, args.block_size, "training")


def text_classification_data(args: argparse.Namespace) -> tuple[PreTrainedTokenizerFast, Dataset]:
    """The lines and labels `train_text_classifier.py` trains on by default (1000 per class), cut like its texts."""
    texts, labels = data.code_or_prose(1000, args.seed)
    tokenizer = data.char_tokenizer(texts, model_max_length=args.block_size)
    ids = tokenizer(texts, truncation=True, max_length=args.block_size)["input_ids"]
    names = sorted(set(labels))
    return tokenizer, Dataset.from_dict({"input_ids": ids, "label": [names.index(label) for label in labels]})


# task -> (its data, its collator for packed or padded batches, its model, what its config adds)
TASKS = {
    "causal-lm": (causal_lm_data, padding_free.collator, TurnerForCausalLM, {}),
    "text-classification": (
        text_classification_data,
        padding_free.classification_collator,
        TurnerForSequenceClassification,
        {"is_causal": False, "num_labels": 2},
    ),
}


def step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batches: itertools.cycle):
    def run() -> None:
        optimizer.zero_grad(set_to_none=True)
        model(**next(batches)).loss.backward()
        optimizer.step()

    return run


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    env = benchutils.start_run(args.threads)
    data, collator, model_class, task_config = TASKS[args.task]
    tokenizer, sequences = data(args)
    sequences = sequences.shuffle(seed=args.seed)
    chunks = [sequences.select(range(i * args.batch_size, (i + 1) * args.batch_size)) for i in range(args.batches)]
    batches = {
        name: [collator(packed, tokenizer)(list(chunk)) for chunk in chunks]
        for name, packed in (("padding-free", True), ("padded", False))
    }
    real_tokens = sum(len(ids) for chunk in chunks for ids in chunk["input_ids"]) / args.batches
    padded_tokens = sum(batch["input_ids"].numel() for batch in batches["padded"]) / args.batches

    shape = LMShape(args.layers, args.heads, args.features, context=args.block_size, vocab=len(tokenizer))
    config = turner_config(
        shape, pad_token_id=tokenizer.pad_token_id, attn_implementation=args.attn_implementation, **task_config
    )
    steps = {}
    for name in batches:
        torch.manual_seed(args.seed)
        model = model_class(config).train()
        steps[name] = step(model, torch.optim.AdamW(model.parameters(), lr=1e-3), itertools.cycle(batches[name]))
    times, record = benchutils.timed(steps, args.repeats, args.warmup)
    benchutils.finish_run(env)

    speedup = benchutils.paired_ratios(times["padded"], times["padding-free"])
    rows = [
        [name, f"{real_tokens / summary['median_s']:.0f} tok/s", f"{summary['median_s'] * 1e3:.1f} ms"]
        for name, summary in record["times"].items()
    ]
    intro = (
        f"{args.task}, L{args.layers} H{args.heads} D{args.features}, {args.attn_implementation}, "
        f"batch {args.batch_size} sequences of at most {args.block_size}: {real_tokens:.0f} real tokens per batch, "
        f"padded to {padded_tokens:.0f} ({100 * (1 - real_tokens / padded_tokens):.0f}% padding)\n"
    )
    table = benchutils.markdown_table(["batches", "training tokens/s (real tokens)", "step"], rows)
    benchutils.print_report(env, table, intro, f"\npadding-free vs padded: {benchutils.fmt_spread(speedup)}")
    return benchutils.save_run(
        args,
        "padding_free",
        env,
        tokens_per_batch={"real": real_tokens, "padded": padded_tokens},
        times=record["times"],
        speedup_padding_free_vs_padded=speedup,
    )


if __name__ == "__main__":
    main()
