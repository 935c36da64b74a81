"""Train a Turner text classifier, from scratch or from a saved Turner model, and report its test accuracy.

Data: a CSV or JSON (lines) file with a text column and a label column, or by default a task that ships with
Python: is a line from the standard library Python code or English prose (a docstring's first line)? The script
trains `TurnerForSequenceClassification` with the `Trainer`, reports accuracy on held-out data, runs
`pipeline("text-classification")` on a few test lines, and saves model, code, tokenizer and card.

    python -m examples.train_text_classifier
    python -m examples.train_text_classifier --train_file reviews.csv --text_column review --label_column stars
    python -m examples.train_text_classifier --model_name_or_path ./turner-quickstart   # start from the LM
    python -m examples.train_text_classifier --padding_free   # each batch's texts packed in one row, no padding

Every field of `TrainingArguments`, of the dataclasses below and of `TurnerConfig` is a flag (`--help`); a JSON or
YAML file of them works too. Run from the repository root.
"""

from dataclasses import dataclass, field
from pathlib import Path

from datasets import Dataset, Value, load_dataset
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    Trainer,
    TrainingArguments,
)

from examples.helpers import callbacks, data, distributed, model_card, padding_free, training
from turner_tfm import TurnerForSequenceClassification

DATA_FORMATS = {".csv": "csv", ".json": "json", ".jsonl": "json"}


@dataclass
class ScriptModelArguments:
    model_name_or_path: str | None = field(
        default=None, metadata={"help": "start from this saved Turner model and its tokenizer"}
    )
    fsdp_size: int = field(default=1, metadata={"help": "processes that each hold 1/N of every weight (FSDP2)"})

    def __post_init__(self) -> None:
        training.check_saved_model("model_name_or_path", self.model_name_or_path)


ModelArguments = training.config_arguments(
    ScriptModelArguments, exclude=("tie_word_embeddings",), hidden_size=64, num_hidden_layers=2, num_attention_heads=4
)


@dataclass
class DataTrainingArguments:
    train_file: str | None = field(default=None, metadata={"help": "CSV or JSON lines of text and label"})
    test_file: str | None = field(default=None, metadata={"help": "held-out data in the same format"})
    test_split_percentage: float = field(
        default=20.0, metadata={"help": "share held out for the test accuracy, without a test_file"}
    )
    text_column: str = "text"
    label_column: str = "label"
    examples_per_class: int = field(default=1000, metadata={"help": "size of the built-in code-or-prose task"})
    max_length: int = field(default=128, metadata={"help": "tokens per text; longer is cut"})
    padding_free: bool = field(
        default=False, metadata={"help": "train on the texts packed in one row per batch, without padding"}
    )

    def __post_init__(self) -> None:
        for name in ("train_file", "test_file"):
            path = getattr(self, name)
            if path is not None and not path.lower().endswith(tuple(DATA_FORMATS)):
                raise ValueError(f"--{name} {path!r} is not valid: expected a {', '.join(DATA_FORMATS)} file")
        if self.test_file is not None and self.train_file is None:
            raise ValueError("--test_file needs --train_file (the built-in data makes its own split)")


def load_data(args: DataTrainingArguments, seed: int) -> tuple[Dataset, Dataset, str]:
    """(train, test) datasets with `text` and `label` columns (labels as class ids), and the data's name."""
    if args.train_file is None:
        train, name = data.code_or_prose(args.examples_per_class, seed), "stdlib code-or-prose"
    else:
        train, name = read_table(args, args.train_file), Path(args.train_file).stem
    test = read_table(args, args.test_file) if args.test_file is not None else None
    return *data.train_and_test("text", Value("string"), train, test, args.test_split_percentage, seed), name


def read_table(args: DataTrainingArguments, path: str) -> tuple[list[str], list[str]]:
    """Texts and labels (as strings) from a CSV or JSON file."""
    table = load_dataset(DATA_FORMATS[Path(path).suffix.lower()], data_files=path, split="train")
    for name, column in (("text_column", args.text_column), ("label_column", args.label_column)):
        if column not in table.column_names:
            raise ValueError(f"--{name} {column!r} is not valid: {path!r} has columns {table.column_names}")
    if len(table) == 0:
        raise ValueError(f"{path!r} has no rows")
    return [str(text) for text in table[args.text_column]], [str(label) for label in table[args.label_column]]


def main() -> None:
    model_args, data_args, training_args = training.parse_arguments(
        (ModelArguments, DataTrainingArguments, TrainingArguments),
        output_dir="turner-text-classifier", num_train_epochs=3, learning_rate=1e-3, logging_steps=20,
    )  # fmt: skip
    train_set, test_set, dataset_name = load_data(data_args, training_args.seed)
    names = train_set.features["label"].names
    labels = training.label_fields(names)
    if model_args.model_name_or_path:
        tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path)
        if tokenizer.pad_token is None:
            raise ValueError(f"the tokenizer of {model_args.model_name_or_path!r} has no pad token")
        model = AutoModelForSequenceClassification.from_pretrained(model_args.model_name_or_path, **labels)
        model.config.pad_token_id = tokenizer.pad_token_id
    else:
        tokenizer = data.char_tokenizer(train_set["text"], model_max_length=data_args.max_length)
        config = training.text_config(tokenizer, data_args.max_length, model_args, is_causal=False, **labels)
        model = TurnerForSequenceClassification(config)
    distributed.announce(
        f"data: {dataset_name}, {len(train_set)} training and {len(test_set)} test texts, labels {names}; "
        f"model: {model_card.count_parameters(model):,} parameters"
    )
    max_length = min(data_args.max_length, model.config.max_position_embeddings)

    def tokenize(batch: dict) -> dict:
        return tokenizer(batch["text"], truncation=True, max_length=max_length)

    trainer = Trainer(
        model=distributed.shard(model, model_args.fsdp_size, training_args),  # fsdp_size N: 1/N of each weight
        args=training_args,
        train_dataset=train_set.map(tokenize, batched=True),
        eval_dataset=test_set.map(tokenize, batched=True),
        data_collator=padding_free.classification_collator(data_args.padding_free, tokenizer),  # padded, or packed
        processing_class=tokenizer,
        compute_metrics=training.accuracy,
        callbacks=callbacks.checkpoint_callbacks(),
    )
    training.train(trainer)

    classify = distributed.pipeline_of("text-classification", trainer.model, tokenizer=tokenizer)
    results = model_card.evaluate_and_classify(trainer, classify, test_set["text"][:4], repr, truncation=True)

    model_card.save_with_card(
        trainer,
        task="text-classification",
        results=results,
        dataset_name=dataset_name,
        base_model=model_args.model_name_or_path,
        example_input=test_set["text"][0],
    )


if __name__ == "__main__":
    training.run(main)
