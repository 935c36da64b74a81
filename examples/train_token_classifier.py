"""Train a Turner token classifier (every token gets a label, as named-entity tagging does) and report its accuracy.

Data: JSON lines of words and their tags (`{"tokens": ["Ada", "wrote", "it"], "tags": ["PER", "O", "O"]}`, the
format of transformers' run_ner.py and the CoNLL data sets), or by default a task that ships with Python: the kind of
each word in a line of the standard library's code, as Python's own `tokenize` reads it (`keyword`, `name`,
`number`, `string`, `op`). The script trains `TurnerForTokenClassification` with the `Trainer`, reports the share of
tokens labelled right on held-out lines, runs `pipeline("token-classification")` on one, and saves model, code,
tokenizer and card.

    python -m examples.train_token_classifier
    python -m examples.train_token_classifier --train_file ner.jsonl --tokens_column words --tags_column ner

Every field of `TrainingArguments`, of the dataclasses below and of `TurnerConfig` is a flag (`--help`). Run from the
repository root.
"""

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from datasets import Dataset, load_dataset
from transformers import DataCollatorForTokenClassification, Trainer, TrainingArguments

from examples.helpers import callbacks, data, distributed, model_card, training
from turner_tfm import TurnerForTokenClassification

ModelArguments = training.config_arguments(
    training.NoScriptArguments,
    exclude=("tie_word_embeddings", "classifier_pooling", "use_pooler"),  # a label per token: no pooling
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
)


@dataclass
class DataTrainingArguments:
    train_file: str | None = field(default=None, metadata={"help": "JSON lines of words and their tags"})
    tokens_column: str = "tokens"
    tags_column: str = "tags"
    lines: int = field(default=1000, metadata={"help": "size of the built-in Python-token task"})
    test_split_percentage: float = field(default=20.0, metadata={"help": "share held out for the test accuracy"})
    max_length: int = field(default=128, metadata={"help": "tokens per line; longer is cut"})

    def __post_init__(self) -> None:
        training.check_file("train_file", self.train_file, (".json", ".jsonl"))


def read_words(args: DataTrainingArguments) -> list[tuple[str, list[tuple[int, int, str]]]]:
    """Each row of `train_file` as its words joined by spaces, with the (start, end, tag) of every word."""
    table = load_dataset("json", data_files=args.train_file, split="train")
    for name, column in (("tokens_column", args.tokens_column), ("tags_column", args.tags_column)):
        if column not in table.column_names:
            raise training.UsageError(f"--{name} {column!r} is not valid: {args.train_file!r} has {table.column_names}")
    rows = []
    for words, tags in zip(table[args.tokens_column], table[args.tags_column], strict=True):
        starts = np.cumsum([0, *(len(word) + 1 for word in words)])
        spans = [(int(s), int(s) + len(w), str(t)) for s, w, t in zip(starts, words, tags, strict=False)]
        rows.append((" ".join(words), spans))
    return rows


def main() -> None:
    model_args, data_args, training_args = training.parse_arguments(
        (ModelArguments, DataTrainingArguments, TrainingArguments),
        output_dir="turner-token-classifier", num_train_epochs=10, learning_rate=2e-3, logging_steps=20,
    )  # fmt: skip
    if data_args.train_file is None:
        rows, dataset_name = data.python_token_tags(data_args.lines, training_args.seed), "stdlib Python tokens"
    else:
        rows, dataset_name = read_words(data_args), Path(data_args.train_file).stem
    names = sorted({tag for _, spans in rows for *_, tag in spans})
    tokenizer = data.char_tokenizer([text for text, _ in rows], model_max_length=data_args.max_length)

    texts = [text for text, _ in rows]
    encoded = tokenizer(texts, truncation=True, return_offsets_mapping=True)
    encoded["labels"] = [  # every token of a word gets the word's tag; spaces get -100 (no loss)
        [next((names.index(tag) for s, e, tag in spans if s <= start < e), -100) for start, _ in offsets]
        for offsets, (_, spans) in zip(encoded.pop("offset_mapping"), rows, strict=True)
    ]
    parts = Dataset.from_dict({"text": texts, **encoded}).train_test_split(
        data_args.test_split_percentage / 100, seed=0
    )
    labels = training.label_fields(names)  # a token's label depends on both sides: no causal mask
    config = training.text_config(tokenizer, data_args.max_length, model_args, is_causal=False, **labels)
    model = TurnerForTokenClassification(config)
    distributed.announce(
        f"data: {dataset_name}, {len(parts['train'])} training and {len(parts['test'])} test lines, tags {names}; "
        f"model: {model_card.count_parameters(model):,} parameters"
    )

    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=parts["train"].remove_columns("text"),
        eval_dataset=parts["test"].remove_columns("text"),
        data_collator=DataCollatorForTokenClassification(tokenizer),
        processing_class=tokenizer,
        compute_metrics=training.accuracy,  # of the tokens with a tag
        callbacks=callbacks.checkpoint_callbacks(),
    )
    training.train(trainer)

    results = {"accuracy": trainer.evaluate()["eval_accuracy"]}
    example = parts["test"]["text"][0]
    tagger = distributed.pipeline_of("token-classification", trainer.model, tokenizer=tokenizer)
    words = tagger(example, aggregation_strategy="simple")  # neighbouring tokens of one tag as one word
    shown = ", ".join(f"{word['word'].strip()!r} {word['entity_group']}" for word in words if word["word"].strip())
    distributed.announce(
        f"test accuracy: {results['accuracy']:.4f} of the tagged tokens of {len(parts['test'])} held-out lines\n\n"
        f"pipeline('token-classification') on {example!r}:\n  {shown}\n"
    )

    model_card.save_with_card(
        trainer,
        task="token-classification",
        results=results,
        dataset_name=dataset_name,
        example_input=example,
    )


if __name__ == "__main__":
    training.run(main)
