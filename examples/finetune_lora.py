"""Adapt a saved Turner language model to new text with LoRA (PEFT) on `qkv_proj`, then merge it.

By default the quickstart model (trained on the standard library's docstrings) learns the standard library's code.
Only the low-rank adapters train, through the `Trainer`; held-out loss is measured before and after. The adapter is
saved to --output-dir/adapter, then `merge_and_unload()` folds it into the weights, the script checks that the
merged model gives the same logits as the adapter model, and saves the merged model (plain Turner weights, code,
tokenizer, card) to --output-dir.

    python examples/quickstart.py && python examples/finetune_lora.py
    python examples/finetune_lora.py --model-name-or-path ./my-lm --train-file notes.txt --lora-r 16
"""

import argparse
import sys

from _cli import (
    UsageError,
    add_sample_arguments,
    add_text_data_arguments,
    add_training_arguments,
    new_parser,
    positive_int,
    probability,
    run_script,
)

MERGE_TOLERANCE = 1e-4  # largest |logit difference| accepted between the adapter model and the merged one (fp32)


def build_parser() -> argparse.ArgumentParser:
    parser = new_parser(__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model-name-or-path", default="./turner-quickstart", help="the saved Turner causal LM to adapt"
    )
    add_training_arguments(
        parser, output_dir="./turner-lora", max_steps=150, learning_rate=3e-3, per_device_train_batch_size=16
    )
    add_text_data_arguments(parser, default="source code of Python's standard library")
    group = parser.add_argument_group("LoRA (as in peft.LoraConfig)")
    group.add_argument("--lora-r", type=positive_int, default=8, help="rank of each adapter")
    group.add_argument("--lora-alpha", type=positive_int, default=16, help="scale: alpha / r")
    group.add_argument("--lora-dropout", type=probability, default=0.0)
    group.add_argument("--target-modules", nargs="+", default=["qkv_proj"], help="module names to adapt")
    add_sample_arguments(parser, prompt="def ")
    return parser


def main(argv: list[str] | None = None) -> None:
    run_script(build_parser(), run, argv, model_hint="Run examples/quickstart.py first, or pass one.")


def run(args: argparse.Namespace) -> None:
    # torch and transformers load once the flags are checked, so --help and a bad flag answer at once
    import _common
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer, set_seed

    set_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)
    model = AutoModelForCausalLM.from_pretrained(args.model_name_or_path)
    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = sorted(set(args.target_modules) - names)
    if missing:
        raise UsageError(
            f"argument --target-modules: {missing} is not valid: the model's linear layers are "
            "qkv_proj (the stacked query, key and value projections), o_proj, up_proj, down_proj"
        )
    if args.block_size > model.config.max_position_embeddings:
        raise UsageError(
            f"argument --block-size: {args.block_size} is not valid: {args.model_name_or_path} has "
            f"{model.config.max_position_embeddings} positions"
        )
    _common.check_sample_length(args, tokenizer, model.config)
    text, dataset_name, dataset_id = _common.load_text_corpus(args, default="code")
    train_text, eval_text = _common.split_text(text, args.validation_split_percentage)

    lora = LoraConfig(
        r=args.lora_r,
        lora_alpha=args.lora_alpha,
        lora_dropout=args.lora_dropout,
        target_modules=args.target_modules,
        task_type="CAUSAL_LM",
    )
    peft_model = get_peft_model(model, lora)
    peft_model.print_trainable_parameters()
    trainer = _common.causal_lm_trainer(args, peft_model, tokenizer, train_text, eval_text)
    before = trainer.evaluate()["eval_loss"]
    _common.announce(f"held-out loss of {args.model_name_or_path} on {dataset_name}: {before:.3f} before LoRA")
    train_runtime = _common.train(trainer)
    peft_model.save_pretrained(f"{args.output_dir}/adapter")
    _common.announce(f"adapter saved to {args.output_dir}/adapter")

    peft_model.eval()
    probe = torch.tensor([trainer.eval_dataset[i]["input_ids"] for i in range(min(4, len(trainer.eval_dataset)))])
    with torch.no_grad():
        adapter_logits = peft_model(input_ids=probe).logits
        merged = peft_model.merge_and_unload()
        merged_logits = merged(input_ids=probe).logits
    difference = (adapter_logits - merged_logits).abs().max().item()
    if difference > MERGE_TOLERANCE:
        raise RuntimeError(f"merge_and_unload changed the logits by up to {difference:.2e} (> {MERGE_TOLERANCE})")
    _common.announce(f"merged model matches the adapter model: max |logit difference| {difference:.1e}")

    trainer.model = trainer.model_wrapped = merged
    _common.finish_causal_lm(
        trainer,
        args,
        train_runtime,
        dataset_name=dataset_name,
        dataset_id=dataset_id,
        base_model=args.model_name_or_path,
        notes={
            "LoRA": f"r={args.lora_r}, alpha={args.lora_alpha} on {', '.join(args.target_modules)}, then merged",
            "held-out loss before LoRA": f"{before:.4f}",
        },
    )


if __name__ == "__main__":
    sys.exit(main())
