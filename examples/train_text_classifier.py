"""Train a Turner text classifier, from scratch or from a saved Turner model, and report its test accuracy.

Data: a CSV or JSON (lines) file with a text column and a label column, or by default a task that ships with
Python: is a line from the standard library Python code or English prose (a docstring's first line)? The script
trains `TurnerForSequenceClassification` with the `Trainer`, reports accuracy on held-out data, runs
`pipeline("text-classification")` on a few test lines, and saves model, code, tokenizer and card.

    python examples/train_text_classifier.py
    python examples/train_text_classifier.py --train-file reviews.csv --text-column review --label-column stars
    python examples/train_text_classifier.py --model-name-or-path ./turner-quickstart   # start from the LM
    python examples/train_text_classifier.py --padding-free   # each batch's texts packed in one row, no padding

Every `TrainingArguments` field is a flag (`--help` lists them all); a JSON or YAML file of them works too.
"""

import argparse
import sys

from helpers import flags

DATA_SUFFIXES = {".csv": "csv", ".json": "json", ".jsonl": "json"}


def data_file(text: str) -> object:
    """An argparse type: an existing .csv, .json or .jsonl file."""
    path = flags.existing_file(text)
    if path.suffix.lower() not in DATA_SUFFIXES:
        raise argparse.ArgumentTypeError(f"{text!r} is not valid: expected a {', '.join(DATA_SUFFIXES)} file")
    return path


def build_parser() -> argparse.ArgumentParser:
    parser = flags.training_parser(
        __doc__, output_dir="./turner-text-classifier", num_train_epochs=3, learning_rate=1e-3, logging_steps=20
    )
    flags.add_fsdp_size(parser)
    group = parser.add_argument_group("data")
    group.add_argument(*flags.options("train_file"), type=data_file, help="CSV or JSON lines of text and label")
    group.add_argument(*flags.options("test_file"), type=data_file, help="held-out data in the same format")
    group.add_argument(
        *flags.options("test_split_percentage"),
        type=flags.percentage,
        default=20.0,
        help="share of the data held out for the test accuracy, when no separate test data is given",
    )
    group.add_argument(*flags.options("text_column"), default="text")
    group.add_argument(*flags.options("label_column"), default="label")
    group.add_argument(
        *flags.options("examples_per_class"),
        type=flags.positive_int,
        default=1000,
        help="size of the built-in code-or-prose task",
    )
    group.add_argument(
        *flags.options("max_length"), type=flags.positive_int, default=128, help="tokens per text; longer is cut"
    )
    parser.add_argument(
        *flags.options("model_name_or_path"), help="start from this saved Turner model and its tokenizer"
    )
    flags.add_model_arguments(
        parser, task="text-classification", hidden_size=64, num_hidden_layers=2, num_attention_heads=4
    )
    parser.add_argument(
        *flags.options("padding_free"),
        action="store_true",
        help="train on the texts packed in one row per batch (DataCollatorWithFlattening), without padding",
    )
    return parser


def main(argv: list[str] | None = None) -> None:
    flags.run_script(build_parser(), train, argv, requires={"test_file": "train_file"})


def load_data(args: argparse.Namespace) -> tuple[object, object, str]:
    """(train, test) datasets with `text` and `label` columns (labels as class ids), and the data's name."""
    from helpers import data

    if args.train_file is None:
        train = labelled(*data.code_or_prose(args.examples_per_class, args.seed))
        name = "stdlib code-or-prose"
    else:
        train, name = labelled(*read_table(args, args.train_file, "--train-file")), args.train_file.stem
    if args.test_file is None:  # a stratified split: each class keeps its share in both parts
        parts = train.train_test_split(args.test_split_percentage / 100, seed=args.seed, stratify_by_column="label")
        return parts["train"], parts["test"], name
    return train, labelled(*read_table(args, args.test_file, "--test-file"), train.features["label"].names), name


def labelled(texts: list[str], labels: list[str], names: list[str] | None = None) -> object:
    """A `Dataset` of `text` and `label` (class ids of `names`, by default the sorted labels)."""
    from datasets import ClassLabel, Dataset, Features, Value

    names = names if names is not None else sorted(set(labels))
    unknown = sorted(set(labels) - set(names))
    if unknown:
        lacking = f"the test data has labels the training data lacks: {unknown[:5]}"
        raise flags.UsageError(f"{lacking}; known labels: {names}")
    features = Features({"text": Value("string"), "label": ClassLabel(names=names)})
    return Dataset.from_dict({"text": texts, "label": [names.index(label) for label in labels]}, features=features)


def read_table(args: argparse.Namespace, path: object, flag: str) -> tuple[list[str], list[str]]:
    """Texts and labels (as strings) from a CSV or JSON file; a missing column is named with its flag."""
    from datasets import load_dataset

    table = load_dataset(DATA_SUFFIXES[path.suffix.lower()], data_files=str(path), split="train")
    for option, column in (("--text-column", args.text_column), ("--label-column", args.label_column)):
        if column not in table.column_names:
            raise flags.UsageError(
                f"argument {option}: {column!r} is not valid: {flag} {str(path)!r} has columns {table.column_names}"
            )
    if len(table) == 0:
        raise flags.UsageError(f"argument {flag}: {str(path)!r} is not valid: it has no rows")
    return [str(text) for text in table[args.text_column]], [str(label) for label in table[args.label_column]]


def train(args: argparse.Namespace) -> None:
    # torch and transformers load once the flags are checked, so --help and a bad flag answer at once
    import numpy as np
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        Trainer,
        TrainingArguments,
        set_seed,
    )

    from helpers import callbacks, data, distributed, model_card, padding_free
    from turner_tfm import TurnerConfig, TurnerForSequenceClassification

    set_seed(args.seed)
    train_set, test_set, dataset_name = load_data(args)
    names = train_set.features["label"].names
    labels = {"id2label": dict(enumerate(names)), "label2id": {name: i for i, name in enumerate(names)}}
    if args.model_name_or_path:
        tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)
        if tokenizer.pad_token is None:
            raise flags.UsageError(
                f"argument --model-name-or-path: {args.model_name_or_path!r}: its tokenizer has no pad token"
            )
        model = AutoModelForSequenceClassification.from_pretrained(args.model_name_or_path, **labels)
        model.config.pad_token_id = tokenizer.pad_token_id
    else:
        tokenizer = data.char_tokenizer(train_set["text"], model_max_length=args.max_length)
        with flags.usage_error("the model flags make no valid model"):
            config = TurnerConfig(
                vocab_size=len(tokenizer),
                max_position_embeddings=args.max_length,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
                is_causal=False,
                **labels,
                **flags.model_arguments(args),
            )
        model = TurnerForSequenceClassification(config)
    distributed.announce(
        f"data: {dataset_name}, {len(train_set)} training and {len(test_set)} test texts, labels {names}; "
        f"model: {model_card.count_parameters(model):,} parameters"
    )

    def tokenize(batch: dict) -> dict:
        return tokenizer(
            batch["text"], truncation=True, max_length=min(args.max_length, model.config.max_position_embeddings)
        )

    def accuracy(eval_prediction: tuple) -> dict[str, float]:
        logits, label_ids = eval_prediction
        return {"accuracy": float((np.argmax(logits, axis=-1) == label_ids).mean())}

    model = distributed.shard(model, args.fsdp_size, args.ddp_timeout)  # --fsdp-size N: 1/N of each weight a process
    distributed.start_process_group(args.ddp_timeout)  # before TrainingArguments: gloo with --ddp-timeout
    with flags.usage_error("the training flags do not go together"):
        training_args = TrainingArguments(**flags.training_arguments(args))
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=train_set.map(tokenize, batched=True),
        eval_dataset=test_set.map(tokenize, batched=True),
        data_collator=padding_free.classification_collator(args.padding_free, tokenizer),  # padded, or packed
        processing_class=tokenizer,
        compute_metrics=accuracy,
        callbacks=callbacks.checkpoint_callbacks(),
    )
    if training_args.resume_from_checkpoint is not None:
        distributed.announce(f"resuming from {training_args.resume_from_checkpoint}")
    with distributed.ProcessWatch.start():  # a failed collective names the processes that are gone
        train_result = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)

    model_card.print_loss_curve(trainer)
    results = {"accuracy": trainer.evaluate()["eval_accuracy"]}
    examples = test_set["text"][:4]
    classify = distributed.pipeline_of("text-classification", trainer.model, tokenizer=tokenizer)
    predicted = classify(examples, top_k=1, truncation=True)  # every process: a sharded model needs them all
    if trainer.is_world_process_zero():
        print(f"test accuracy: {results['accuracy']:.4f} on {len(trainer.eval_dataset)} held-out examples")
        print("\npipeline('text-classification'):")
        for example, predictions in zip(examples, predicted, strict=True):
            print(f"  {example!r} -> {predictions[0]['label']} ({predictions[0]['score']:.2f})")
        print()

    model_card.save_with_card(
        trainer,
        task="text-classification",
        results=results,
        train_runtime=train_result.metrics["train_runtime"],
        dataset_name=dataset_name,
        base_model=args.model_name_or_path,
        example_input=test_set["text"][0],
    )


if __name__ == "__main__":
    sys.exit(main())
