"""Padding-free training against padded batches of the same sequences: training tokens per second.

The data is what `train_causal_lm.py --padding-free` trains on by default: the paragraphs of the standard-library
docstrings, character-level, cut at --block-size. The same batches of --batch-size sequences are collated two ways,
as one packed row (`DataCollatorWithFlattening`, `position_ids` restarting per sequence, no mask) and padded to the
longest sequence (`DataCollatorForLanguageModeling`, attention mask, padding ignored by the loss). One training step
(forward, backward, AdamW) per timed call, the two in rotation; tokens/s counts real tokens only, the same for both.

    python benchmarks/bench_padding_free.py --threads 1 --json results/padding_free.json
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import _common
import _padding_free
from benchutils import (
    add_run_arguments,
    environment_markdown,
    finish_run,
    fmt_ratio,
    interleaved,
    markdown_table,
    paired_ratios,
    start_run,
    summarize,
    write_json,
)

from turner_tfm import TurnerConfig, TurnerForCausalLM


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--block-size", type=int, default=128, help="longest sequence, in characters")
    parser.add_argument("--batch-size", type=int, default=16, help="sequences per batch")
    parser.add_argument("--batches", type=int, default=8, help="distinct batches, cycled through")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--features", type=int, default=128)
    parser.add_argument("--attn-implementation", default="sdpa")
    add_run_arguments(parser, repeats=24, warmup=2)
    return parser.parse_args(argv)


def step(model: TurnerForCausalLM, optimizer: torch.optim.Optimizer, batches: itertools.cycle):
    def run() -> None:
        optimizer.zero_grad(set_to_none=True)
        model(**next(batches)).loss.backward()
        optimizer.step()

    return run


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    env = start_run(args.threads)
    text = _common.stdlib_docstrings()
    tokenizer = _common.char_tokenizer([text], model_max_length=args.block_size)
    sequences = _padding_free.paragraph_sequences(tokenizer, text, args.block_size, "training").shuffle(seed=args.seed)
    chunks = [sequences.select(range(i * args.batch_size, (i + 1) * args.batch_size)) for i in range(args.batches)]
    batches = {
        name: [_padding_free.collator(packed, tokenizer)(list(chunk)) for chunk in chunks]
        for name, packed in (("padding-free", True), ("padded", False))
    }
    real_tokens = sum(len(ids) for chunk in chunks for ids in chunk["input_ids"]) / args.batches
    padded_tokens = sum(batch["input_ids"].numel() for batch in batches["padded"]) / args.batches

    config = TurnerConfig(
        vocab_size=len(tokenizer),
        hidden_size=args.features,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        max_position_embeddings=args.block_size,
        pad_token_id=tokenizer.pad_token_id,
        attn_implementation=args.attn_implementation,
    )
    steps = {}
    for name in batches:
        torch.manual_seed(args.seed)
        model = TurnerForCausalLM(config).train()
        steps[name] = step(model, torch.optim.AdamW(model.parameters(), lr=1e-3), itertools.cycle(batches[name]))
    times = interleaved(steps, args.repeats, args.warmup)
    finish_run(env)

    speedup = paired_ratios(times["padded"], times["padding-free"])
    rows = [
        [name, f"{real_tokens / summarize(t)['median_s']:.0f} tok/s", f"{summarize(t)['median_s'] * 1e3:.1f} ms"]
        for name, t in times.items()
    ]
    print(environment_markdown(env))
    print(
        f"L{args.layers} H{args.heads} D{args.features}, {args.attn_implementation}, batch {args.batch_size} "
        f"sequences of at most {args.block_size}: {real_tokens:.0f} real tokens per batch, padded to "
        f"{padded_tokens:.0f} ({100 * (1 - real_tokens / padded_tokens):.0f}% padding)\n"
    )
    print(markdown_table(["batches", "training tokens/s (real tokens)", "step"], rows))
    print(f"\npadding-free vs padded: {fmt_ratio(speedup['median'])} [{speedup['q1']:.2f}-{speedup['q3']:.2f}]")
    payload = {"benchmark": "padding_free", "environment": env, "args": {k: str(v) for k, v in vars(args).items()}}
    payload |= {
        "tokens_per_batch": {"real": real_tokens, "padded": padded_tokens},
        "times": {name: summarize(t) for name, t in times.items()},
        "speedup_padding_free_vs_padded": speedup,
    }
    write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
