"""Train a Turner text classifier, from scratch or from a saved Turner model, and report its test accuracy.

Data: a CSV or JSON (lines) file with a text column and a label column, or by default a task that ships with
Python: is a line from the standard library Python code or English prose (a docstring's first line)? The script
trains `TurnerForSequenceClassification` with the `Trainer`, reports accuracy on held-out data, runs
`pipeline("text-classification")` on a few test lines, and saves model, code, tokenizer and card.

    python examples/train_text_classifier.py
    python examples/train_text_classifier.py --train-file reviews.csv --text-column review --label-column stars
    python examples/train_text_classifier.py --model-name-or-path ./turner-quickstart   # start from the LM
    python examples/train_text_classifier.py --padding-free   # each batch's texts packed in one row, no padding
"""

import argparse
import sys

from _cli import (
    UsageError,
    add_classification_data_arguments,
    add_model_arguments,
    add_padding_free_argument,
    add_parallel_arguments,
    add_training_arguments,
    existing_file,
    new_parser,
    positive_int,
    run_script,
)

DATA_SUFFIXES = {".csv": "csv", ".json": "json", ".jsonl": "json"}


def data_file(text: str) -> object:
    """An argparse type: an existing .csv, .json or .jsonl file."""
    path = existing_file(text)
    if path.suffix.lower() not in DATA_SUFFIXES:
        raise argparse.ArgumentTypeError(f"{text!r} is not valid: expected a {', '.join(DATA_SUFFIXES)} file")
    return path


def build_parser() -> argparse.ArgumentParser:
    parser = new_parser(__doc__.split("\n\n")[0])
    add_training_arguments(
        parser, output_dir="./turner-text-classifier", num_train_epochs=3, learning_rate=1e-3, logging_steps=20
    )
    add_parallel_arguments(parser)
    group = add_classification_data_arguments(parser)
    group.add_argument("--train-file", type=data_file, default=None, help="CSV or JSON lines of text and label")
    group.add_argument("--test-file", type=data_file, default=None, help="held-out data in the same format")
    group.add_argument("--text-column", default="text")
    group.add_argument("--label-column", default="label")
    group.add_argument(
        "--examples-per-class", type=positive_int, default=1000, help="size of the built-in code-or-prose task"
    )
    group.add_argument("--max-length", type=positive_int, default=128, help="tokens per text; longer is cut")
    parser.add_argument(
        "--model-name-or-path", default=None, help="start from this saved Turner model and its tokenizer"
    )
    add_model_arguments(parser, task="text-classification", hidden_size=64, num_hidden_layers=2, num_attention_heads=4)
    add_padding_free_argument(parser, "the texts")
    return parser


def main(argv: list[str] | None = None) -> None:
    run_script(build_parser(), run, argv, requires={"test_file": "train_file"})


def load_data(args: argparse.Namespace) -> tuple[object, object, str]:
    """(train, test) datasets with `text` and `label` columns, and the data's name."""
    import _common

    if args.train_file is None:
        texts, labels = _common.code_or_prose(args.examples_per_class, args.seed)
        dataset = _common.labelled_dataset("text", texts, labels)
        return (*_common.split_train_test(dataset, args.test_split_percentage, args.seed), "stdlib code-or-prose")
    train_texts, train_labels = read_table(args, args.train_file, "--train-file")
    train = _common.labelled_dataset("text", train_texts, train_labels)
    if args.test_file is None:
        return (*_common.split_train_test(train, args.test_split_percentage, args.seed), args.train_file.stem)
    test_texts, test_labels = read_table(args, args.test_file, "--test-file")
    names = train.features["label"].names
    return train, _common.labelled_dataset("text", test_texts, test_labels, names), args.train_file.stem


def read_table(args: argparse.Namespace, path: object, flag: str) -> tuple[list[str], list[str]]:
    """Texts and labels (as strings) from a CSV or JSON file; a missing column is named with its flag."""
    from datasets import load_dataset

    table = load_dataset(DATA_SUFFIXES[path.suffix.lower()], data_files=str(path), split="train")
    for option, column in (("--text-column", args.text_column), ("--label-column", args.label_column)):
        if column not in table.column_names:
            raise UsageError(
                f"argument {option}: {column!r} is not valid: {flag} {str(path)!r} has columns {table.column_names}"
            )
    if len(table) == 0:
        raise UsageError(f"argument {flag}: {str(path)!r} is not valid: it has no rows")
    return [str(text) for text in table[args.text_column]], [str(label) for label in table[args.label_column]]


def run(args: argparse.Namespace) -> None:
    # torch and transformers load once the flags are checked, so --help and a bad flag answer at once
    import _common
    import _padding_free
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from turner_tfm import TurnerForSequenceClassification

    _common.set_seed(args.seed)
    train, test, dataset_name = load_data(args)
    labels = _common.label_maps(train)
    if args.model_name_or_path:
        tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)
        if tokenizer.pad_token is None:
            raise UsageError(
                f"argument --model-name-or-path: {args.model_name_or_path!r}: its tokenizer has no pad token"
            )
        model = AutoModelForSequenceClassification.from_pretrained(args.model_name_or_path, **labels)
        model.config.pad_token_id = tokenizer.pad_token_id
    else:
        tokenizer = _common.char_tokenizer(train["text"], model_max_length=args.max_length)
        config = _common.turner_config(
            args,
            vocab_size=len(tokenizer),
            max_position_embeddings=args.max_length,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            is_causal=False,
            **labels,
        )
        model = TurnerForSequenceClassification(config)
    _common.announce(
        f"data: {dataset_name}, {len(train)} training and {len(test)} test texts, labels {list(labels['label2id'])}; "
        f"model: {_common.count_parameters(model):,} parameters"
    )

    def tokenize(batch: dict) -> dict:
        return tokenizer(
            batch["text"], truncation=True, max_length=min(args.max_length, model.config.max_position_embeddings)
        )

    _common.train_classifier(
        args,
        model,
        train.map(tokenize, batched=True),
        test.map(tokenize, batched=True),
        tokenizer,
        data_collator=_padding_free.classification_collator(args.padding_free, tokenizer),
        task="text-classification",
        examples=test["text"][:4],
        dataset_name=dataset_name,
        base_model=args.model_name_or_path,
        example_input=test["text"][0],
    )


if __name__ == "__main__":
    sys.exit(main())
