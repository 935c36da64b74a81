"""Adapt a saved Turner language model to new text with LoRA (PEFT) on `qkv_proj`, then merge it.

By default the quickstart model (trained on the standard library's docstrings) learns the standard library's code.
Only the low-rank adapters train, through the `Trainer`; held-out loss is measured before and after. The adapter is
saved to --output-dir/adapter, then `merge_and_unload()` folds it into the weights, the script checks that the
merged model gives the same logits as the adapter model, and saves the merged model (plain Turner weights, code,
tokenizer, card) to --output-dir.

    python examples/quickstart.py && python examples/finetune_lora.py
    python examples/finetune_lora.py --model-name-or-path ./my-lm --train-file notes.txt --lora-r 16

Every `TrainingArguments` field is a flag (`--help` lists them all); a JSON or YAML file of them works too.
"""

import argparse
import math
import sys

from helpers import flags

MERGE_TOLERANCE = 1e-4  # largest |logit difference| accepted between the adapter model and the merged one (fp32)


def build_parser() -> argparse.ArgumentParser:
    parser = flags.training_parser(
        __doc__, output_dir="./turner-lora", max_steps=150, learning_rate=3e-3, per_device_train_batch_size=16
    )
    parser.add_argument(
        *flags.options("model_name_or_path"), default="./turner-quickstart", help="the saved Turner causal LM to adapt"
    )
    flags.add_text_data_arguments(parser, default="source code of Python's standard library")
    group = parser.add_argument_group("LoRA (as in peft.LoraConfig)")
    group.add_argument(*flags.options("lora_r"), type=flags.positive_int, default=8, help="rank of each adapter")
    group.add_argument(*flags.options("lora_alpha"), type=flags.positive_int, default=16, help="scale: alpha / r")
    group.add_argument(*flags.options("lora_dropout"), type=flags.probability, default=0.0)
    group.add_argument(*flags.options("target_modules"), nargs="+", default=["qkv_proj"], help="module names to adapt")
    flags.add_sample_arguments(parser, prompt="def ")
    return parser


def main(argv: list[str] | None = None) -> None:
    flags.run_script(build_parser(), train, argv, model_hint="Run examples/quickstart.py first, or pass one.")


def train(args: argparse.Namespace) -> None:
    # torch and transformers load once the flags are checked, so --help and a bad flag answer at once
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        Trainer,
        TrainingArguments,
        default_data_collator,
        pipeline,
        set_seed,
    )

    from helpers import callbacks, data, distributed, model_card

    set_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)
    model = AutoModelForCausalLM.from_pretrained(args.model_name_or_path)
    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = sorted(set(args.target_modules) - names)
    if missing:
        raise flags.UsageError(
            f"argument --target-modules: {missing} is not valid: the model's linear layers are "
            "qkv_proj (the stacked query, key and value projections), o_proj, up_proj, down_proj"
        )
    if args.block_size > model.config.max_position_embeddings:
        raise flags.UsageError(
            f"argument --block-size: {args.block_size} is not valid: {args.model_name_or_path} has "
            f"{model.config.max_position_embeddings} positions"
        )
    flags.check_sample_length(args, tokenizer, model.config)
    text, dataset_name, dataset_id = data.load_text_corpus(args, default="code")
    train_text, eval_text = data.split_text(text, args.validation_split_percentage)

    lora = LoraConfig(
        r=args.lora_r,
        lora_alpha=args.lora_alpha,
        lora_dropout=args.lora_dropout,
        target_modules=args.target_modules,
        task_type="CAUSAL_LM",
    )
    peft_model = get_peft_model(model, lora)
    peft_model.print_trainable_parameters()
    distributed.start_process_group(args.ddp_timeout)  # before TrainingArguments: gloo with --ddp-timeout
    with flags.usage_error("the training flags do not go together"):
        training_args = TrainingArguments(**flags.training_arguments(args))
    trainer = Trainer(
        model=peft_model,
        args=training_args,
        train_dataset=data.token_blocks(tokenizer, train_text, args.block_size, "training"),
        eval_dataset=data.token_blocks(tokenizer, eval_text, args.block_size, "held-out"),
        data_collator=default_data_collator,
        processing_class=tokenizer,
        callbacks=callbacks.checkpoint_callbacks(),
    )
    before = trainer.evaluate()["eval_loss"]
    distributed.announce(f"held-out loss of {args.model_name_or_path} on {dataset_name}: {before:.3f} before LoRA")
    if training_args.resume_from_checkpoint is not None:
        distributed.announce(f"resuming from {training_args.resume_from_checkpoint}")
    with distributed.ProcessWatch.start():  # a failed collective names the processes that are gone
        train_result = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    peft_model.save_pretrained(f"{args.output_dir}/adapter")
    distributed.announce(f"adapter saved to {args.output_dir}/adapter")

    peft_model.eval()
    probe = torch.tensor([trainer.eval_dataset[i]["input_ids"] for i in range(min(4, len(trainer.eval_dataset)))])
    with torch.no_grad():
        adapter_logits = peft_model(input_ids=probe).logits
        merged = peft_model.merge_and_unload()
        merged_logits = merged(input_ids=probe).logits
    difference = (adapter_logits - merged_logits).abs().max().item()
    if difference > MERGE_TOLERANCE:
        raise RuntimeError(f"merge_and_unload changed the logits by up to {difference:.2e} (> {MERGE_TOLERANCE})")
    distributed.announce(f"merged model matches the adapter model: max |logit difference| {difference:.1e}")

    trainer.model = trainer.model_wrapped = merged
    model_card.print_loss_curve(trainer)
    eval_loss = trainer.evaluate()["eval_loss"]
    results = {"eval_loss": eval_loss, "perplexity": math.exp(eval_loss)}
    set_seed(args.seed)
    generator = pipeline("text-generation", model=merged, tokenizer=tokenizer)
    sample = generator(args.prompt, max_new_tokens=args.max_new_tokens, do_sample=True, top_k=10)[0]["generated_text"]
    if trainer.is_world_process_zero():
        print(f"held-out loss {eval_loss:.3f} nats/token, perplexity {results['perplexity']:.2f}")
        print(f"\nsample from pipeline('text-generation'):\n{sample}\n")

    model_card.save_with_card(
        trainer,
        task="text-generation",
        results=results,
        train_runtime=train_result.metrics["train_runtime"],
        example_input=args.prompt,
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
