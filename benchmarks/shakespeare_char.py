"""Train a character-level Turner language model on a text file through `Trainer` and report the validation loss.

The default recipe is nanoGPT's published CPU recipe for Shakespeare (4 layers, 4 heads, 128 features, context 64,
batch 12, 2000 steps, AdamW lr 1e-3 with 100 warm-up steps and a cosine to 1e-4, betas (0.9, 0.99), weight decay
0.1, gradient clipping 1.0, dropout 0, no biases in the linear layers). The first 90% of the characters train, the
last 10% validate. The validation loss is the mean cross-entropy (nats per character) over the WHOLE validation
split, scored by windows of `context` characters:

* `--eval-stride` equal to the context (the default): non-overlapping windows, every character scored once with
  0..63 characters of context (on average the same context as nanoGPT's random-window estimate);
* a smaller stride S: sliding windows, every character after the first window scored once with at least
  `context - S` characters of context.

Batches are random windows of the training split, as in nanoGPT. `labels` are the inputs (the model shifts them), so
each window of 64 characters trains 63 next-character predictions.

Example:

    python -m benchmarks.shakespeare_char /path/to/tinyshakespeare.txt --json benchmarks/results/shakespeare.json
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset
from transformers import Trainer, TrainingArguments

from benchmarks import benchutils
from benchmarks.peers import LMShape, turner_config
from turner_tfm import TurnerForCausalLM


class CharCodec:
    """Characters to ids and back, the vocabulary being the sorted set of characters in the text."""

    def __init__(self, text: str):
        self.chars = sorted(set(text))
        self.index = {c: i for i, c in enumerate(self.chars)}

    def encode(self, text: str) -> torch.Tensor:
        return torch.tensor([self.index[c] for c in text], dtype=torch.long)

    def decode(self, ids: list[int]) -> str:
        return "".join(self.chars[i] for i in ids)


class RandomWindows(Dataset):
    """`count` windows of `context` characters at random offsets in `data` (fixed by `seed`), as a map-style dataset."""

    def __init__(self, data: torch.Tensor, context: int, count: int, seed: int):
        generator = torch.Generator().manual_seed(seed)
        self.data = data
        self.context = context
        self.offsets = torch.randint(0, len(data) - context, (count,), generator=generator)

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        start = int(self.offsets[i])
        window = self.data[start : start + self.context]
        return {"input_ids": window, "labels": window}


@torch.inference_mode()
def validation_loss(
    model: TurnerForCausalLM, data: torch.Tensor, context: int, stride: int, batch_size: int = 256
) -> dict[str, float]:
    """Mean next-character cross-entropy over every character of `data` after the first.

    Window w covers `data[s : s + context]` with s = w * stride and predicts `data[s + 1 : s + context + 1]`; only
    the predictions not already scored by the previous window count (the last `stride` ones, all of them for the
    first window). The final window is shortened to end at the last character.
    """
    if not 1 <= stride <= context:
        raise ValueError(f"--eval-stride {stride} is invalid: it must be in [1, context={context}]")
    model.eval()
    targets_total = len(data) - 1
    starts = list(range(0, max(targets_total - context, 0) + 1, stride))
    if starts[-1] + context < targets_total:  # the tail the last full window missed
        starts.append(targets_total - context if targets_total >= context else 0)
    total_nll, scored, next_unscored = 0.0, 0, 1  # data[0] is never a target
    full = [s for s in starts if s + context <= targets_total]
    for first in range(0, len(full), batch_size):
        chunk = full[first : first + batch_size]
        x = torch.stack([data[s : s + context] for s in chunk])
        y = torch.stack([data[s + 1 : s + context + 1] for s in chunk])
        logits = model(input_ids=x).logits.float()
        nll = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").view(len(chunk), -1)
        for row, s in enumerate(chunk):
            skip = max(next_unscored - (s + 1), 0)  # predictions of targets already scored
            total_nll += float(nll[row, skip:].sum())
            scored += context - skip
            next_unscored = s + context + 1
    for s in (s for s in starts if s + context > targets_total):  # at most one short window, at the very end
        n = targets_total - s
        logits = model(input_ids=data[s : s + n].unsqueeze(0)).logits.float()[0]
        nll = F.cross_entropy(logits, data[s + 1 : s + n + 1], reduction="none")
        skip = max(next_unscored - (s + 1), 0)
        total_nll += float(nll[skip:].sum())
        scored += n - skip
        next_unscored = s + n + 1
    if scored != targets_total:
        raise RuntimeError(f"scored {scored} characters, expected {targets_total}")
    return {"loss": total_nll / scored, "characters": scored, "windows": len(starts)}


def build_model(args: argparse.Namespace, vocab_size: int) -> TurnerForCausalLM:
    shape = LMShape(args.layers, args.heads, args.features, context=args.context, vocab=vocab_size)
    dropout = {"hidden_dropout": args.dropout, "attention_dropout": args.dropout}
    bias = {"attention_bias": args.bias, "mlp_bias": args.bias}
    config = turner_config(shape, **dropout, **bias, hidden_act=args.act, position_embedding_type=args.positions)
    torch.manual_seed(args.seed)
    return TurnerForCausalLM(config)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("text", type=Path, help="a UTF-8 text file (first 90%% trains, last 10%% validates)")
    benchutils.add_shape_arguments(parser, layers=4, heads=4, features=128)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=12)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--min-lr", type=float, default=1e-4)
    parser.add_argument("--warmup-steps", type=int, default=100)
    parser.add_argument("--beta2", type=float, default=0.99)
    parser.add_argument("--weight-decay", type=float, default=0.1)
    parser.add_argument("--grad-clip", type=float, default=1.0)
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--bias", action=argparse.BooleanOptionalAction, default=False, help="biases in the linears")
    parser.add_argument("--act", default="gelu", help="hidden_act (nanoGPT: exact GELU)")
    parser.add_argument("--positions", default="learned", choices=["learned", "sinusoidal", "rotary", "none"])
    parser.add_argument("--eval-stride", type=int, default=None, help="validation window stride (default: context)")
    parser.add_argument("--extra-eval-stride", type=int, default=None, help="also report a sliding-window loss")
    parser.add_argument("--eval-limit", type=int, default=None, help="score only the first N validation characters")
    parser.add_argument("--logging-steps", type=int, default=100)
    parser.add_argument("--output-dir", type=Path, default=Path("/tmp/turner_shakespeare_char"))
    parser.add_argument("--save", action="store_true", help="save the trained model to --output-dir/final")
    benchutils.add_run_arguments(parser, seed=1337)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    env = benchutils.start_run(args.threads)
    text = args.text.read_text(encoding="utf-8")
    codec = CharCodec(text)
    data = codec.encode(text)
    split = int(0.9 * len(data))
    train_data, val_data = data[:split], data[split:]
    if args.eval_limit:
        val_data = val_data[: args.eval_limit]
    model = build_model(args, len(codec.chars))
    train_set = RandomWindows(train_data, args.context, args.steps * args.batch_size, args.seed)

    training_args = TrainingArguments(
        output_dir=str(args.output_dir),
        max_steps=args.steps,
        per_device_train_batch_size=args.batch_size,
        learning_rate=args.lr,
        lr_scheduler_type="cosine_with_min_lr",
        lr_scheduler_kwargs={"min_lr": args.min_lr},
        warmup_steps=args.warmup_steps,
        adam_beta1=0.9,
        adam_beta2=args.beta2,
        weight_decay=args.weight_decay,
        max_grad_norm=args.grad_clip,
        logging_steps=args.logging_steps,
        save_strategy="no",
        report_to="none",
        use_cpu=not torch.cuda.is_available(),
        dataloader_num_workers=0,
        seed=args.seed,
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=training_args, train_dataset=train_set)
    start = time.perf_counter()
    train_output = trainer.train()
    train_seconds = time.perf_counter() - start

    stride = args.eval_stride or args.context
    start = time.perf_counter()
    val = validation_loss(model, val_data, args.context, stride)
    eval_seconds = time.perf_counter() - start
    extra = None
    if args.extra_eval_stride:
        extra = validation_loss(model, val_data, args.context, args.extra_eval_stride)
        extra["stride"] = args.extra_eval_stride
    if args.save:
        trainer.save_model(str(args.output_dir / "final"))

    benchutils.finish_run(env)
    result = {
        "benchmark": "shakespeare_char",
        "environment": env,
        "text": str(args.text),
        "characters": {"train": len(train_data), "validation": len(val_data), "vocab": len(codec.chars)},
        "recipe": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "json"},
        "parameters": sum(p.numel() for p in model.parameters()),
        "final_train_loss": train_output.training_loss,
        "log_history": [h for h in trainer.state.log_history if "loss" in h],
        "validation": {"stride": stride, **val, "perplexity": math.exp(val["loss"])},
        "validation_sliding": extra,
        "train_seconds": train_seconds,
        "eval_seconds": eval_seconds,
        "steps_per_second": args.steps / train_seconds,
    }
    rows = [
        [f"validation loss (stride {stride}, whole split)", f"{val['loss']:.4f}"],
        ["characters scored", val["characters"]],
        ["training wall time", f"{train_seconds:.1f} s ({args.steps} steps, {args.steps / train_seconds:.2f} steps/s)"],
        ["final training loss (mean over run)", f"{train_output.training_loss:.4f}"],
    ]
    if extra:
        rows.insert(1, [f"validation loss (sliding, stride {extra['stride']})", f"{extra['loss']:.4f}"])
    benchutils.print_report(env, benchutils.markdown_table(["shakespeare_char", "value"], rows))
    benchutils.write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
