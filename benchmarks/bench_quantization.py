"""Int8 weights against fp32 for a saved Turner language model: size, held-out loss and greedy decoding speed.

The model is loaded three times from one folder (what `examples/quickstart.py` saves): fp32, torchao int8 weight-only
(`TorchAoConfig(Int8WeightOnlyConfig())`) and bitsandbytes 8-bit (`BitsAndBytesConfig(load_in_8bit=True)`, on the
CPU). Reported for each: `model.safetensors` on disk after `save_pretrained`, `get_memory_footprint()`, the held-out
loss on the quickstart's own held-out text (the last 5% of the standard-library docstrings), and greedy `generate()`
tokens/s at batch 1, the three run in rotation. Then the same torchao quantizer is pointed at a GPT-2 of the same
shape: how many of each model's matrix layers it replaced.

    python -m benchmarks.bench_quantization --model-dir ./turner-quickstart --threads 1 \
        --json benchmarks/results/quant.json
"""

from __future__ import annotations

import argparse
import math
import tempfile
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig, TorchAoConfig

import turner_tfm  # noqa: F401  (registers the Auto classes)
from benchmarks import benchutils
from benchmarks.peers import LMShape, gpt2_lm

METHODS = ("fp32", "torchao int8", "bitsandbytes int8")


def quantization_config(method: str) -> dict[str, Any]:
    from torchao.quantization import Int8WeightOnlyConfig

    if method == "torchao int8":
        return {"quantization_config": TorchAoConfig(Int8WeightOnlyConfig())}
    if method == "bitsandbytes int8":
        return {"quantization_config": BitsAndBytesConfig(load_in_8bit=True), "device_map": "cpu"}
    return {}


def load(folder: Path, method: str) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(folder, **quantization_config(method)).eval()


def saved_size(model: torch.nn.Module) -> int:
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        return sum(f.stat().st_size for f in Path(folder).glob("*.safetensors"))


def tensor_bytes(tensor: torch.Tensor) -> int:
    """Bytes a tensor holds; a tensor subclass (torchao's int8 weight) is counted by the tensors inside it."""
    if hasattr(tensor, "__tensor_flatten__"):
        names, _ = tensor.__tensor_flatten__()
        return sum(tensor_bytes(getattr(tensor, name)) for name in names)
    return tensor.numel() * tensor.element_size()


def memory_bytes(model: torch.nn.Module) -> int:
    """Parameters and buffers, each stored tensor once (a tied head shares the embedding's storage).
    `get_memory_footprint()` counts torchao's int8 weights at their fp32 size, so it is not used."""
    tensors = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    return sum(tensor_bytes(t) for t in tensors.values())


def held_out_loss(model: torch.nn.Module, blocks: torch.Tensor, batch: int) -> float:
    """Mean next-token loss over the held-out blocks (every block has the same length, so the mean is exact)."""
    with torch.inference_mode():
        losses = [model(chunk, labels=chunk).loss.item() for chunk in blocks.split(batch)]
    sizes = [len(chunk) for chunk in blocks.split(batch)]
    return sum(loss * size for loss, size in zip(losses, sizes, strict=True)) / sum(sizes)


def held_out_blocks(folder: Path, block_size: int) -> torch.Tensor:
    from examples.helpers import data

    _, eval_text = data.split_text(data.stdlib_docstrings(), validation_percentage=5)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    return torch.tensor(data.token_blocks(tokenizer, eval_text, block_size, "held-out")["input_ids"])


def layers_replaced(model: torch.nn.Module) -> dict[str, list[int]]:
    """Per layer class with a matrix weight: [replaced by int8, total]."""
    counts: dict[str, list[int]] = {}
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if isinstance(weight, torch.Tensor) and weight.dim() == 2:
            entry = counts.setdefault(type(module).__name__, [0, 0])
            entry[0] += "Int8" in type(weight).__name__
            entry[1] += 1
    return counts


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    benchutils.add_run_arguments(parser, repeats=10, warmup=2)
    parser.add_argument("--model-dir", type=Path, required=True, help="a saved Turner causal LM with its tokenizer")
    parser.add_argument("--new-tokens", type=int, default=64, help="greedy tokens per timed generate() call")
    parser.add_argument("--eval-batch", type=int, default=16, help="held-out blocks per forward")
    parser.add_argument("--max-eval-blocks", type=int, default=None, help="score only this many held-out blocks")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    env = benchutils.start_run(args.threads)
    models = {method: load(args.model_dir, method) for method in METHODS}
    config = models["fp32"].config
    blocks = held_out_blocks(args.model_dir, config.max_position_embeddings)[: args.max_eval_blocks]
    prompt = blocks[:1, : config.max_position_embeddings - args.new_tokens]
    greedy = {"max_new_tokens": args.new_tokens, "min_new_tokens": args.new_tokens, "do_sample": False}

    def decode(model: torch.nn.Module):
        return lambda: model.generate(prompt, **greedy)

    times, record = benchutils.timed({m: decode(models[m]) for m in METHODS}, args.repeats, args.warmup)
    results = {
        method: {
            "disk_bytes": saved_size(model),
            "memory_bytes": memory_bytes(model),
            "held_out_loss": held_out_loss(model, blocks, args.eval_batch),
            "times": record["times"][method],
            "tokens_per_second": args.new_tokens / record["times"][method]["median_s"],
            "speed_vs_fp32": benchutils.paired_ratios(times["fp32"], times[method]),
            "layers_replaced": layers_replaced(model),
        }
        for method, model in models.items()
    }
    gpt2_folder = Path(tempfile.mkdtemp())
    gpt2_lm(LMShape.of(config)).save_pretrained(gpt2_folder)
    gpt2 = layers_replaced(load(gpt2_folder, "torchao int8"))
    benchutils.finish_run(env)

    fp32 = results["fp32"]
    rows = [
        [
            method,
            f"{r['disk_bytes'] / 1e6:.2f} MB",
            f"{r['memory_bytes'] / 1e6:.2f} MB",
            f"{r['held_out_loss']:.5f} ({100 * (r['held_out_loss'] / fp32['held_out_loss'] - 1):+.3f}%)",
            f"{r['tokens_per_second']:.1f} tok/s",
            benchutils.fmt_spread(r["speed_vs_fp32"]),
        ]
        for method, r in results.items()
    ]
    header = ["weights", "safetensors on disk", "in memory", "held-out loss (vs fp32)", "greedy decode", "vs fp32"]
    replaced = {
        name: {layer: f"{done}/{total}" for layer, (done, total) in counts.items()}
        for name, counts in (("Turner", results["torchao int8"]["layers_replaced"]), ("GPT-2", gpt2))
    }
    note = f"\ntorchao int8 replaced, Turner: {replaced['Turner']}; GPT-2 of the same shape: {replaced['GPT-2']}"
    benchutils.print_report(env, benchutils.markdown_table(header, rows), f"{len(blocks)} held-out blocks\n", note)
    perplexity = {m: math.exp(r["held_out_loss"]) for m, r in results.items()}
    return benchutils.save_run(
        args, "quantization", env, results=results, gpt2_layers_replaced=gpt2, perplexity=perplexity
    )


if __name__ == "__main__":
    main()
