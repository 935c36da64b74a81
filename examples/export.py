"""Export a saved Turner model with transformers' own exporters: ONNX (run by ONNX Runtime), torch.export, ExecuTorch.

A causal language model is exported for generation: a prefill program (any prompt length) and a decode program (one
token), both over a static KV cache of --max-cache-len positions. A classifier is exported as one program. The script
then reloads the exported folder and checks it against the eager model: the logits (to 1e-4) and, for a language
model, the greedy tokens decoded through the exported programs against `generate()`'s. It prints what it wrote and
what it checked, and exits with status 1 if the check fails.

    python -m examples.export --model-name-or-path ./turner-quickstart --format onnx
    python -m examples.export --model-name-or-path ./turner-text-classifier --format torch --output-dir exported

The exported folder runs without turner_tfm: `ExportedModel.from_pretrained(folder, trust_remote_code=True)` (the
config's code is saved beside the programs), and `generate_exported` below needs only torch and transformers.
"""

import argparse
import sys
from pathlib import Path

# --format: (exporter, its config) in transformers.exporters; "torch" is torch.export (transformers calls it dynamo)
FORMATS = {
    "onnx": ("OnnxExporter", "OnnxConfig"),
    "torch": ("DynamoExporter", "DynamoConfig"),
    "executorch": ("ExecutorchExporter", "ExecutorchConfig"),
}
TOLERANCE = 1e-4


def build_parser() -> argparse.ArgumentParser:
    from examples.helpers.argtypes import positive_int, saved_model  # here: tests import the functions below alone

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-name-or-path", type=saved_model, required=True, help="a saved Turner model folder")
    parser.add_argument("--format", choices=list(FORMATS), default="onnx", help="what to export to")
    parser.add_argument("--output-dir", default=None, help="where to write the export (default: <model>-<format>)")
    parser.add_argument("--prompt", default="Return the", help="sample text for tracing and the check")
    parser.add_argument("--max-new-tokens", type=positive_int, default=20, help="tokens the check generates")
    parser.add_argument(
        "--max-cache-len",
        type=positive_int,
        default=None,
        help="static KV cache length (default: the model's positions)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    output_dir = Path(args.output_dir or f"{Path(args.model_name_or_path).resolve().name}-{args.format}")
    try:
        return run(args, output_dir)
    except ValueError as error:
        parser.error(str(error))


def run(args: argparse.Namespace, output_dir: Path) -> int:
    # torch and transformers load once the flags are checked, so --help and a bad flag answer at once
    import torch
    from transformers.exporters import ExportedModel

    model, sample = load_model_and_sample(args.model_name_or_path, args.prompt)
    max_cache_len = args.max_cache_len or model.config.max_position_embeddings
    if model.can_generate() and sample["input_ids"].shape[1] + args.max_new_tokens > max_cache_len:
        raise ValueError(
            f"argument --max-new-tokens: {args.max_new_tokens} is not valid: the prompt takes "
            f"{sample['input_ids'].shape[1]} of the {max_cache_len} cache positions (--max-cache-len)"
        )
    exported = export_model(model, args.format, sample, max_cache_len)
    exported.save_pretrained(output_dir)
    files = sorted(p for p in output_dir.iterdir() if p.is_file())
    print(f"wrote {output_dir}/: " + ", ".join(f"{p.name} ({p.stat().st_size / 1e6:.2f} MB)" for p in files))

    reloaded = ExportedModel.from_pretrained(output_dir, trust_remote_code=True)
    with torch.no_grad():
        expected = model(**sample).logits
    if model.can_generate():
        length = sample["input_ids"].shape[1]
        logits = reloaded.runners["prefill"](**prefill_inputs(reloaded, sample["input_ids"])).logits
        tokens = generate_exported(reloaded, sample["input_ids"], args.max_new_tokens)
        wanted = model.generate(**sample, max_new_tokens=args.max_new_tokens, do_sample=False)[0, length:]
        same_tokens = tokens.tolist() == wanted.tolist()
        token_check = (
            f"; {len(tokens)} greedy tokens through prefill + decode {'equal' if same_tokens else 'DIFFER from'} "
        )
        token_check += "generate()'s"
    else:
        logits, token_check, same_tokens = reloaded(**sample).logits, "", True
    difference = (logits - expected).abs().max().item()
    print(
        f"check ({args.format}, reloaded from {output_dir}): max |logit - eager logit| = {difference:.2e} "
        f"(tolerance {TOLERANCE:g}){token_check}"
    )
    passed = difference <= TOLERANCE and same_tokens
    print("check passed" if passed else "CHECK FAILED")
    return 0 if passed else 1


def load_model_and_sample(path: str, prompt: str) -> tuple:
    """The saved model in eval mode, and one sample of its inputs: the tokenized prompt (random ids without a
    tokenizer), or one random image for an image classifier."""
    import torch
    from transformers import AutoConfig, AutoTokenizer

    import turner_tfm

    architecture = AutoConfig.from_pretrained(path).architectures[0]
    model = getattr(turner_tfm, architecture).from_pretrained(path).eval()
    config = model.config
    if config.is_image_model:
        size = config.image_size
        return model, {"pixel_values": torch.rand(1, config.num_channels, size, size, generator=_seeded())}
    try:
        input_ids = AutoTokenizer.from_pretrained(path)(prompt, return_tensors="pt").input_ids
    except (OSError, ValueError):  # no tokenizer saved with the model
        input_ids = torch.randint(config.vocab_size, (1, 8), generator=_seeded())
    sample = {"input_ids": input_ids}
    return model, (sample if model.can_generate() else {**sample, "attention_mask": torch.ones_like(input_ids)})


def _seeded():
    import torch

    return torch.Generator().manual_seed(0)


def export_model(model, export_format: str, sample: dict, max_cache_len: int):
    """Export `model` with transformers' exporter for `export_format` (a key of FORMATS).

    A language model goes through `export_for_generation`: `generate()` runs once with a static cache of
    `max_cache_len` positions and its prefill and decode calls are traced; the prefill's sequence axis is dynamic.
    A classifier goes through `export`, its sequence axis dynamic (one batch row; an image classifier is all static).
    """
    import copy

    import torch
    from transformers import StaticCache, exporters
    from transformers.exporters.exporter_dynamo import register_cache_pytrees_for_model

    from turner_tfm.compat_turner import CACHE_NAME

    exporter_name, config_name = FORMATS[export_format]
    exporter, config_class = getattr(exporters, exporter_name)(), getattr(exporters, config_name)
    if model.config.is_image_model:
        return exporter.export(model, sample, config_class())
    if not model.can_generate():
        sequence = torch.export.Dim("sequence", min=2, max=model.config.max_position_embeddings)
        return exporter.export(model, sample, config_class(dynamic_shapes={key: {1: sequence} for key in sample}))
    generation_config = copy.deepcopy(model.generation_config)  # a trained model's config may say use_cache=False
    generation_config.update(
        cache_implementation="static", max_cache_len=max_cache_len, do_sample=False, use_cache=True
    )
    register_cache_pytrees_for_model(model)
    empty_cache = StaticCache(config=model.config, max_cache_len=max_cache_len)
    sequence = torch.export.Dim("sequence", min=1, max=max_cache_len)
    prefill_axes = {
        "input_ids": {1: sequence},
        "position_ids": {1: sequence},
        CACHE_NAME: [None] * len(torch.utils._pytree.tree_leaves(empty_cache)),  # the cache's name in this release
    }
    configs = {"prefill": config_class(dynamic_shapes=prefill_axes), "decode": config_class()}
    exported = exporter.export_for_generation(
        model, {"input_ids": sample["input_ids"]}, configs, generation_config=generation_config
    )
    return without_example_inputs(exported) if export_format == "torch" else exported


def without_example_inputs(exported):
    """`exported` with its torch.export programs stripped of their example inputs, so a saved `.pt2` holds the graph
    and tensors only and loads under `torch.load(weights_only=True)`.

    Workaround: transformers' `DynamoExporter` keeps the traced call's inputs on each program, and for a language
    model they include the `StaticCache` object itself; `torch.export.save` pickles it, and `torch.export.load` then
    falls back to unrestricted unpickling (`weights_only=False`) to read it back. Example inputs are optional (only
    `ExportedProgram.module()` checks use them). This stands in for the upstream fix: the exporter saving programs
    whose example inputs are flattened to tensors (or none).
    """
    for component in exported.components.values():
        component.program.example_inputs = None
    return exported


def prefill_inputs(exported, input_ids) -> dict:
    """What the exported prefill takes: the prompt, its positions and an empty static cache."""
    import torch
    from transformers import StaticCache

    positions = torch.arange(input_ids.shape[1]).unsqueeze(0)
    cache = StaticCache(config=exported.config, max_cache_len=exported.generation_config.max_cache_len)
    return {"input_ids": input_ids, "position_ids": positions, traced_cache_name(exported): cache}


def traced_cache_name(exported) -> str:
    """The name the export's programs take their cache under: `past_key_values` before transformers 5.24, `cache`
    from 5.24, as the model's forward was called when it was traced."""
    traced = exported.runners["prefill"].metadata.kwargs
    return next(name for name in traced if name not in ("input_ids", "position_ids", "attention_mask"))


def generate_exported(exported, input_ids, max_new_tokens: int):
    """Greedy decoding of one prompt (`input_ids` of shape (1, N)) through an export's prefill and decode programs:
    the prefill fills the static cache, then each decode step reads one token at its position and a mask over the
    cache positions filled so far. Stops at the end-of-sequence token, as `generate()` does. Needs only torch and
    transformers. Returns the new tokens."""
    import torch

    runners, cache_length = exported.runners, exported.generation_config.max_cache_len
    eos = exported.generation_config.eos_token_id
    stop = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
    cache_name = traced_cache_name(exported)
    outputs = runners["prefill"](**prefill_inputs(exported, input_ids))
    tokens = [outputs.logits[0, -1].argmax()]
    for position in range(input_ids.shape[1], input_ids.shape[1] + max_new_tokens - 1):
        if tokens[-1].item() in stop:
            break
        outputs = runners["decode"](
            input_ids=tokens[-1].view(1, 1),
            attention_mask=(torch.arange(cache_length) <= position).view(1, 1, 1, -1),
            position_ids=torch.tensor([[position]]),
            **{cache_name: getattr(outputs, cache_name)},
        )
        tokens.append(outputs.logits[0, -1].argmax())
    return torch.stack(tokens)


if __name__ == "__main__":
    sys.exit(main())
