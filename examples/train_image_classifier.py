"""Train a Turner image classifier (the paper's §4.2 vision transformer) from scratch and report its test accuracy.

Data: a folder with one sub-folder of images per class (`root/<label>/<image>`), or by default scikit-learn's bundled
handwritten digits (1,797 images of 8x8 pixels, nothing to download). Images pass through a `ViTImageProcessor`
configured here (resize to --image-size, normalise), which is saved with the model. The script trains
`TurnerForImageClassification` with the `Trainer`, reports accuracy on held-out images, runs
`pipeline("image-classification")` on a few of them, and saves model, code, processor and card.

    python examples/train_image_classifier.py
    python examples/train_image_classifier.py --train-dir photos/ --image-size 32 --patch-size 4

Every `TrainingArguments` field is a flag (`--help` lists them all); a JSON or YAML file of them works too.
"""

import argparse
import sys

from helpers import flags

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")


def build_parser() -> argparse.ArgumentParser:
    parser = flags.training_parser(  # weight decay: the 40 epochs drive the training loss to 0.01 on 1437 images
        __doc__,
        output_dir="./turner-image-classifier",
        num_train_epochs=40,
        learning_rate=2e-3,
        weight_decay=0.1,
        logging_steps=100,
        refuse={"remove_unused_columns": "the images become pixels on the fly, from a column the model does not take"},
    )
    flags.add_fsdp_size(parser)
    group = parser.add_argument_group("data")
    group.add_argument(
        *flags.options("train_dir"), type=flags.existing_dir, help="folder of class sub-folders of images"
    )
    group.add_argument(*flags.options("test_dir"), type=flags.existing_dir, help="held-out images, laid out the same")
    group.add_argument(
        *flags.options("test_split_percentage"),
        type=flags.percentage,
        default=20.0,
        help="share of the data held out for the test accuracy, when no separate test data is given",
    )
    group.add_argument(
        *flags.options("image_size"), type=flags.positive_int, default=8, help="images are resized to this square"
    )
    group.add_argument(
        *flags.options("patch_size"), type=flags.positive_int, default=2, help="side of each square patch (§4.2)"
    )
    sizes = {"hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4, "hidden_dropout": 0.1}
    flags.add_model_arguments(parser, task="image-classification", **sizes)
    return parser


def main(argv: list[str] | None = None) -> None:
    flags.run_script(build_parser(), train, argv, requires={"test_dir": "train_dir"})


def image_folder(root: object, flag: str) -> tuple[list[str], list[str]]:
    """Image paths and labels from `root/<label>/<image>`; a folder without images is named with its flag."""
    paths, labels = [], []
    for class_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        for path in sorted(class_dir.iterdir()):
            if path.suffix.lower() in IMAGE_SUFFIXES:
                paths.append(str(path))
                labels.append(class_dir.name)
    if not paths:
        raise flags.UsageError(
            f"argument {flag}: {str(root)!r} is not valid: no images ({', '.join(IMAGE_SUFFIXES)}) in class "
            "sub-folders; expected root/<label>/<image>"
        )
    return paths, labels


def load_data(args: argparse.Namespace) -> tuple[object, object, str]:
    """(train, test) datasets with `image` and `label` columns (labels as class ids), and the data's name."""
    from helpers import data

    if args.train_dir is None:
        train, name = labelled(*data.digits()), "scikit-learn digits"
    else:
        train, name = labelled(*image_folder(args.train_dir, "--train-dir")), args.train_dir.resolve().name
    if args.test_dir is None:  # a stratified split: each class keeps its share in both parts
        parts = train.train_test_split(args.test_split_percentage / 100, seed=args.seed, stratify_by_column="label")
        return parts["train"], parts["test"], name
    return train, labelled(*image_folder(args.test_dir, "--test-dir"), train.features["label"].names), name


def labelled(images: list, labels: list[str], names: list[str] | None = None) -> object:
    """A `Dataset` of `image` (PIL images or file paths) and `label` (class ids of `names`, by default the sorted
    labels)."""
    from datasets import ClassLabel, Dataset, Features, Image

    names = names if names is not None else sorted(set(labels))
    unknown = sorted(set(labels) - set(names))
    if unknown:
        lacking = f"the test data has labels the training data lacks: {unknown[:5]}"
        raise flags.UsageError(f"{lacking}; known labels: {names}")
    features = Features({"image": Image(), "label": ClassLabel(names=names)})
    return Dataset.from_dict({"image": images, "label": [names.index(label) for label in labels]}, features=features)


def train(args: argparse.Namespace) -> None:
    # torch and transformers load once the flags are checked, so --help and a bad flag answer at once
    import numpy as np
    import torch
    from transformers import Trainer, TrainingArguments, ViTImageProcessorPil, set_seed

    from helpers import callbacks, distributed, model_card
    from turner_tfm import TurnerConfig, TurnerForImageClassification

    set_seed(args.seed)
    train_set, test_set, dataset_name = load_data(args)
    processor = ViTImageProcessorPil(
        size={"height": args.image_size, "width": args.image_size},
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
        do_convert_rgb=True,
    )
    names = train_set.features["label"].names
    with flags.usage_error("the model flags make no valid model"):
        config = TurnerConfig(
            image_size=args.image_size,
            patch_size=args.patch_size,
            num_channels=3,
            is_causal=False,
            id2label=dict(enumerate(names)),
            label2id={name: i for i, name in enumerate(names)},
            **flags.model_arguments(args),
        )
    model = TurnerForImageClassification(config)
    distributed.announce(
        f"data: {dataset_name}, {len(train_set)} training and {len(test_set)} test images, {config.num_labels} "
        f"classes; model: {model_card.count_parameters(model):,} parameters, {config.num_patches} patches + class token"
    )

    def to_pixels(batch: dict) -> dict:
        pixels = processor(images=batch["image"], return_tensors="pt")["pixel_values"]
        return {"pixel_values": pixels, "labels": torch.tensor(batch["label"])}

    def accuracy(eval_prediction: tuple) -> dict[str, float]:
        logits, label_ids = eval_prediction
        return {"accuracy": float((np.argmax(logits, axis=-1) == label_ids).mean())}

    model = distributed.shard(model, args.fsdp_size, args.ddp_timeout)  # --fsdp-size N: 1/N of each weight a process
    distributed.start_process_group(args.ddp_timeout)  # before TrainingArguments: gloo with --ddp-timeout
    with flags.usage_error("the training flags do not go together"):
        training_args = TrainingArguments(**flags.training_arguments(args), remove_unused_columns=False)
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=train_set.with_transform(to_pixels),
        eval_dataset=test_set.with_transform(to_pixels),
        processing_class=processor,
        compute_metrics=accuracy,
        callbacks=callbacks.checkpoint_callbacks(),
    )
    if training_args.resume_from_checkpoint is not None:
        distributed.announce(f"resuming from {training_args.resume_from_checkpoint}")
    with distributed.ProcessWatch.start():  # a failed collective names the processes that are gone
        train_result = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)

    model_card.print_loss_curve(trainer)
    results = {"accuracy": trainer.evaluate()["eval_accuracy"]}
    examples = test_set["image"][:4]
    classify = distributed.pipeline_of("image-classification", trainer.model, image_processor=processor)
    predicted = classify(examples, top_k=1)  # every process: a sharded model's forward pass needs them all
    if trainer.is_world_process_zero():
        print(f"test accuracy: {results['accuracy']:.4f} on {len(trainer.eval_dataset)} held-out examples")
        print("\npipeline('image-classification'):")
        for image, predictions in zip(examples, predicted, strict=True):
            label, score = predictions[0]["label"], predictions[0]["score"]
            print(f"  <image {image.size[0]}x{image.size[1]}> -> {label} ({score:.2f})")
        print()

    model_card.save_with_card(
        trainer,
        task="image-classification",
        results=results,
        train_runtime=train_result.metrics["train_runtime"],
        dataset_name=dataset_name,
        example_input="image.png",
    )


if __name__ == "__main__":
    sys.exit(main())
