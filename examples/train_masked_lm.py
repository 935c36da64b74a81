"""Pretrain a Turner masked language model (BERT's objective, one of the block's uses in §4 of the paper) on any text:
a file, a `datasets` dataset, or the built-in corpus.

The body runs without the causal mask (`is_causal=False`), so every token sees both sides; the Trainer's batches come
from `DataCollatorForLanguageModeling(mlm=True)`, which hides 15% of the tokens (`--mlm_probability`) and asks the
model for them. The tokenizer is a byte-level BPE (or character-level) trained here on the same text, with a mask
token; or continue training a saved Turner masked LM with its own tokenizer (`--model_name_or_path`). Reports the
held-out loss, fills a mask with `pipeline("fill-mask")`, and saves model, code, tokenizer and card. From the
repository root:

    python -m examples.train_masked_lm --train_file my_book.txt --vocab_size 2000
    python -m examples.train_masked_lm --dataset_name ./my_data_folder --text_column body
    python -m examples.train_masked_lm args.yaml   # the arguments from a JSON or YAML file, as run_mlm.py

Every field of `TrainingArguments`, of the dataclasses below and of `TurnerConfig` is a flag (`--help`).
"""

from dataclasses import dataclass, field
from typing import Literal

from transformers import (
    AutoModelForMaskedLM,
    AutoTokenizer,
    DataCollatorForLanguageModeling,
    Trainer,
    TrainingArguments,
    set_seed,
)

from examples.helpers import callbacks, data, distributed, model_card, training
from turner_tfm import TurnerForMaskedLM

MASK_TOKEN = "<mask>"


@dataclass
class ScriptModelArguments(training.LanguageModelArguments):
    tokenizer: Literal["bpe", "char"] = field(default="bpe", metadata={"help": "trained here on the text"})


ModelArguments = training.config_arguments(
    ScriptModelArguments, exclude=training.CLASSIFIER_FIELDS, **training.LANGUAGE_MODEL_SIZE
)


@dataclass
class DataTrainingArguments(training.TextDataArguments):
    mlm_probability: float = field(default=0.15, metadata={"help": "share of the tokens hidden for the model to guess"})
    fill_mask_text: str = field(
        default=f"Return the {MASK_TOKEN} of the list.", metadata={"help": f"text with {MASK_TOKEN} to fill at the end"}
    )


def main() -> None:
    model_args, data_args, training_args = training.parse_arguments(
        (ModelArguments, DataTrainingArguments, TrainingArguments),
        output_dir="turner-masked-lm", max_steps=300, learning_rate=1e-3, per_device_train_batch_size=16,
    )  # fmt: skip
    text, dataset_name, dataset_id = data.load_text(**data_args.text_source())
    train_text, eval_text = data.split_text(text, data_args.validation_split_percentage)
    if model_args.model_name_or_path:
        tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path)
        model = AutoModelForMaskedLM.from_pretrained(model_args.model_name_or_path)
    else:
        tokenizer = data.text_tokenizer(model_args.tokenizer, train_text, model_args.vocab_size, data_args.block_size)
        tokenizer.add_special_tokens({"mask_token": MASK_TOKEN})  # the token the collator hides others behind
        # each masked token is guessed from both sides
        config = training.text_config(tokenizer, data_args.block_size, model_args, is_causal=False)
        model = TurnerForMaskedLM(config)
    distributed.announce(
        f"text: {dataset_name}, {len(text):,} characters; tokenizer: {len(tokenizer)} tokens; "
        f"model: {model_card.count_parameters(model):,} parameters"
    )

    def blocks(part: str, what: str):  # the collator makes the labels: the hidden tokens, -100 elsewhere
        return data.token_blocks(tokenizer, part, data_args.block_size, what).remove_columns("labels")

    collator = DataCollatorForLanguageModeling(tokenizer, mlm=True, mlm_probability=data_args.mlm_probability)
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=blocks(train_text, "training"),
        eval_dataset=blocks(eval_text, "held-out"),
        data_collator=collator,
        processing_class=tokenizer,
        callbacks=callbacks.checkpoint_callbacks(),
    )
    training.train(trainer)

    set_seed(training_args.seed)  # the same tokens hidden in every evaluation
    results = model_card.held_out_perplexity(trainer)
    filler = distributed.pipeline_of("fill-mask", trainer.model, tokenizer=tokenizer)
    guesses = filler(data_args.fill_mask_text, top_k=5)
    loss, perplexity = results["eval_loss"], results["perplexity"]
    distributed.announce(f"held-out loss {loss:.3f} nats/masked token, perplexity {perplexity:.2f}")
    shown = ", ".join(f"{guess['token_str']!r} {guess['score']:.3f}" for guess in guesses)
    distributed.announce(f"\npipeline('fill-mask') on {data_args.fill_mask_text!r}: {shown}\n")

    model_card.save_with_card(
        trainer,
        task="fill-mask",
        results=results,
        example_input=data_args.fill_mask_text,
        dataset_name=dataset_name,
        dataset_id=dataset_id,
        base_model=model_args.model_name_or_path,
    )


if __name__ == "__main__":
    training.run(main)
