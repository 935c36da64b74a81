"""Train a Turner causal language model on any text: a file, a `datasets` dataset, or the built-in corpus.

The tokenizer is character-level or a byte-level BPE trained here on the same text (`--tokenizer bpe`); or continue
training a saved Turner model with its own tokenizer (`--model_name_or_path`). Reports held-out loss and
perplexity, prints a sample from `pipeline("text-generation")`, and saves model, code, tokenizer and card.
From the repository root:

    python -m examples.train_causal_lm --train_file my_book.txt --tokenizer bpe --vocab_size 2000
    python -m examples.train_causal_lm --dataset_name ./my_data_folder --text_column body
    python -m examples.train_causal_lm args.yaml   # the arguments from a JSON or YAML file, as run_clm.py
    accelerate launch --cpu --num_processes 2 -m examples.train_causal_lm --max_steps 100   # DDP on 2 processes

Every field of `TrainingArguments`, of the dataclasses below and of `TurnerConfig` is a flag (`--help`).
"""

from dataclasses import dataclass, field

from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    Trainer,
    TrainingArguments,
    default_data_collator,
)

from examples.helpers import callbacks, data, distributed, model_card, padding_free, training
from turner_tfm import TurnerForCausalLM


@dataclass
class ScriptModelArguments(training.LanguageModelArguments):
    fsdp_size: int = field(default=1, metadata={"help": "processes that each hold 1/N of every weight (FSDP2)"})


ModelArguments = training.config_arguments(
    ScriptModelArguments, exclude=training.CLASSIFIER_FIELDS, **training.LANGUAGE_MODEL_SIZE
)


@dataclass
class DataTrainingArguments(training.SampleArguments):
    padding_free: bool = field(
        default=False, metadata={"help": "train on paragraphs packed in one row per batch, without padding"}
    )


def main() -> None:
    model_args, data_args, training_args = training.parse_arguments(
        (ModelArguments, DataTrainingArguments, TrainingArguments),
        output_dir="turner-causal-lm", max_steps=300, learning_rate=2e-3, per_device_train_batch_size=16,
    )  # fmt: skip
    text, dataset_name, dataset_id = data.load_text(**data_args.text_source())
    train_text, eval_text = data.split_text(text, data_args.validation_split_percentage)
    if model_args.model_name_or_path:
        tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path)
        model = AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path)
    else:
        tokenizer = data.text_tokenizer(model_args.tokenizer, train_text, model_args.vocab_size, data_args.block_size)
        config = training.text_config(tokenizer, data_args.block_size, model_args)
        model = TurnerForCausalLM(config)
    distributed.announce(
        f"text: {dataset_name}, {len(text):,} characters; tokenizer: {len(tokenizer)} tokens; "
        f"model: {model_card.count_parameters(model):,} parameters"
    )

    # blocks of block_size tokens; padding-free: whole paragraphs packed end to end in one row per batch
    if data_args.padding_free:
        sequences, collator = padding_free.paragraph_sequences, padding_free.collator(True, tokenizer)
    else:
        sequences, collator = data.token_blocks, default_data_collator
    trainer = Trainer(
        model=distributed.shard(model, model_args.fsdp_size, training_args),  # fsdp_size N: 1/N of each weight
        args=training_args,
        train_dataset=sequences(tokenizer, train_text, data_args.block_size, "training"),
        eval_dataset=sequences(tokenizer, eval_text, data_args.block_size, "held-out"),
        data_collator=collator,
        processing_class=tokenizer,
        callbacks=callbacks.checkpoint_callbacks(),
    )
    training.train(trainer)

    # every process samples: a sharded model's forward pass needs them all
    results = model_card.evaluate_and_sample(trainer, data_args.prompt, data_args.max_new_tokens)
    model_card.save_with_card(
        trainer,
        task="text-generation",
        results=results,
        example_input=data_args.prompt,
        dataset_name=dataset_name,
        dataset_id=dataset_id,
        base_model=model_args.model_name_or_path,
    )


if __name__ == "__main__":
    training.run(main)
