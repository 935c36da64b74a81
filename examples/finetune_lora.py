"""Adapt a saved Turner language model to new text with LoRA (PEFT) on `qkv_proj`, then merge it.

By default the quickstart model (trained on the standard library's docstrings) learns the standard library's code.
Only the low-rank adapters train, through the `Trainer`; held-out loss is measured before and after. The adapter is
saved to output_dir/adapter, then `merge_and_unload()` folds it into the weights, the script checks that the
merged model gives the same logits as the adapter model, and saves the merged model (plain Turner weights, code,
tokenizer, card) to output_dir.

    python -m examples.quickstart && python -m examples.finetune_lora
    python -m examples.finetune_lora --model_name_or_path ./my-lm --train_file notes.txt --lora_r 16

Every field of `TrainingArguments` and of the dataclasses below is a flag (`--help`); a JSON or YAML file of them
works too. Run from the repository root.
"""

from dataclasses import dataclass, field

import torch
from peft import LoraConfig, get_peft_model
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    Trainer,
    TrainingArguments,
    default_data_collator,
)

from examples.helpers import callbacks, data, distributed, model_card, training

MERGE_TOLERANCE = 1e-4  # largest |logit difference| accepted between the adapter model and the merged one (fp32)


@dataclass
class ModelArguments:
    """The model to adapt, and the adapters (as in peft.LoraConfig)."""

    model_name_or_path: str = field(
        default="./turner-quickstart", metadata={"help": "the saved Turner causal LM to adapt"}
    )
    lora_r: int = field(default=8, metadata={"help": "rank of each adapter"})
    lora_alpha: int = field(default=16, metadata={"help": "scale: alpha / r"})
    lora_dropout: float = 0.0
    target_modules: list[str] = field(default_factory=lambda: ["qkv_proj"], metadata={"help": "module names to adapt"})


@dataclass
class DataTrainingArguments(training.SampleArguments):
    prompt: str = field(default="def ", metadata={"help": "start of the sample printed at the end"})


def main() -> None:
    model_args, data_args, training_args = training.parse_arguments(
        (ModelArguments, DataTrainingArguments, TrainingArguments),
        output_dir="turner-lora", max_steps=150, learning_rate=3e-3, per_device_train_batch_size=16,
    )  # fmt: skip
    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path)
    model = AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path)
    text, dataset_name, dataset_id = data.load_text(**data_args.text_source(), default="code")
    train_text, eval_text = data.split_text(text, data_args.validation_split_percentage)

    lora = LoraConfig(
        r=model_args.lora_r,
        lora_alpha=model_args.lora_alpha,
        lora_dropout=model_args.lora_dropout,
        target_modules=model_args.target_modules,  # PEFT names those the model lacks
        task_type="CAUSAL_LM",
    )
    peft_model = get_peft_model(model, lora)
    peft_model.print_trainable_parameters()
    trainer = Trainer(
        model=peft_model,
        args=training_args,
        train_dataset=data.token_blocks(tokenizer, train_text, data_args.block_size, "training"),
        eval_dataset=data.token_blocks(tokenizer, eval_text, data_args.block_size, "held-out"),
        data_collator=default_data_collator,
        processing_class=tokenizer,
        callbacks=callbacks.checkpoint_callbacks(),
    )
    before = trainer.evaluate()["eval_loss"]
    distributed.announce(
        f"held-out loss of {model_args.model_name_or_path} on {dataset_name}: {before:.3f} before LoRA"
    )
    training.train(trainer)
    peft_model.save_pretrained(f"{training_args.output_dir}/adapter")
    distributed.announce(f"adapter saved to {training_args.output_dir}/adapter")

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
    results = model_card.evaluate_and_sample(trainer, data_args.prompt, data_args.max_new_tokens)

    lora_note = f"r={lora.r}, alpha={lora.lora_alpha} on {', '.join(sorted(lora.target_modules))}, then merged"
    model_card.save_with_card(
        trainer,
        task="text-generation",
        results=results,
        example_input=data_args.prompt,
        dataset_name=dataset_name,
        dataset_id=dataset_id,
        base_model=model_args.model_name_or_path,
        notes={"LoRA": lora_note, "held-out loss before LoRA": f"{before:.4f}"},
    )


if __name__ == "__main__":
    training.run(main)
