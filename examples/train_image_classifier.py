"""Train a Turner image classifier (the paper's §4.2 vision transformer) from scratch and report its test accuracy.

Data: a folder with one sub-folder of images per class (`root/<label>/<image>`), or by default scikit-learn's bundled
handwritten digits (1,797 images of 8x8 pixels, nothing to download). Images pass through a `ViTImageProcessor`
configured here (resize to --image-size, normalise), which is saved with the model. The script trains
`TurnerForImageClassification` with the `Trainer`, reports accuracy on held-out images, runs
`pipeline("image-classification")` on a few of them, and saves model, code, processor and card.

    python examples/train_image_classifier.py
    python examples/train_image_classifier.py --train-dir photos/ --image-size 32 --patch-size 4
"""

import argparse
import sys

from _cli import (
    UsageError,
    add_classification_data_arguments,
    add_model_arguments,
    add_parallel_arguments,
    add_training_arguments,
    existing_dir,
    new_parser,
    positive_int,
    run_script,
)

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")


def build_parser() -> argparse.ArgumentParser:
    parser = new_parser(__doc__.split("\n\n")[0])
    add_training_arguments(  # weight decay: the 40 epochs drive the training loss to 0.01 on 1437 images
        parser,
        output_dir="./turner-image-classifier",
        num_train_epochs=40,
        learning_rate=2e-3,
        weight_decay=0.1,
        logging_steps=100,
    )
    add_parallel_arguments(parser)
    group = add_classification_data_arguments(parser)
    group.add_argument("--train-dir", type=existing_dir, default=None, help="folder of class sub-folders of images")
    group.add_argument("--test-dir", type=existing_dir, default=None, help="held-out images, laid out the same")
    group.add_argument("--image-size", type=positive_int, default=8, help="images are resized to this square")
    group.add_argument("--patch-size", type=positive_int, default=2, help="side of each square patch (§4.2)")
    add_model_arguments(
        parser,
        task="image-classification",
        hidden_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        hidden_dropout=0.1,
    )
    return parser


def main(argv: list[str] | None = None) -> None:
    run_script(build_parser(), run, argv, requires={"test_dir": "train_dir"})


def digits() -> tuple[list, list[str]]:
    """scikit-learn's 8x8 digits as greyscale PIL images (0..16 scaled to 0..255) and their labels "0".."9"."""
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits

    data = load_digits()
    images = [Image.fromarray((pixels * 255 / 16).astype(np.uint8), mode="L") for pixels in data.images]
    return images, [str(label) for label in data.target]


def image_folder(root: object, flag: str) -> tuple[list[str], list[str]]:
    """Image paths and labels from `root/<label>/<image>`; a folder without images is named with its flag."""
    paths, labels = [], []
    for class_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        for path in sorted(class_dir.iterdir()):
            if path.suffix.lower() in IMAGE_SUFFIXES:
                paths.append(str(path))
                labels.append(class_dir.name)
    if not paths:
        raise UsageError(
            f"argument {flag}: {str(root)!r} is not valid: no images ({', '.join(IMAGE_SUFFIXES)}) in class "
            "sub-folders; expected root/<label>/<image>"
        )
    return paths, labels


def load_data(args: argparse.Namespace) -> tuple[object, object, str]:
    """(train, test) datasets with `image` and `label` columns, and the data's name."""
    import _common

    if args.train_dir is None:
        dataset = _common.labelled_dataset("image", *digits())
        return (*_common.split_train_test(dataset, args.test_split_percentage, args.seed), "scikit-learn digits")
    train = _common.labelled_dataset("image", *image_folder(args.train_dir, "--train-dir"))
    name = args.train_dir.resolve().name
    if args.test_dir is None:
        return (*_common.split_train_test(train, args.test_split_percentage, args.seed), name)
    names = train.features["label"].names
    return train, _common.labelled_dataset("image", *image_folder(args.test_dir, "--test-dir"), names), name


def run(args: argparse.Namespace) -> None:
    # torch and transformers load once the flags are checked, so --help and a bad flag answer at once
    import _common
    import torch
    from transformers import ViTImageProcessorPil, set_seed

    from turner_tfm import TurnerForImageClassification

    set_seed(args.seed)
    train, test, dataset_name = load_data(args)
    processor = ViTImageProcessorPil(
        size={"height": args.image_size, "width": args.image_size},
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
        do_convert_rgb=True,
    )
    config = _common.turner_config(
        args,
        image_size=args.image_size,
        patch_size=args.patch_size,
        num_channels=3,
        is_causal=False,
        **_common.label_maps(train),
    )
    model = TurnerForImageClassification(config)
    _common.announce(
        f"data: {dataset_name}, {len(train)} training and {len(test)} test images, {config.num_labels} classes; "
        f"model: {_common.count_parameters(model):,} parameters, {config.num_patches} patches + class token"
    )

    def to_pixels(batch: dict) -> dict:
        pixels = processor(images=batch["image"], return_tensors="pt")["pixel_values"]
        return {"pixel_values": pixels, "labels": torch.tensor(batch["label"])}

    _common.train_classifier(
        args,
        model,
        train.with_transform(to_pixels),
        test.with_transform(to_pixels),
        processor,
        training_overrides={"remove_unused_columns": False},  # the transform needs the image column
        task="image-classification",
        examples=test["image"][:4],
        dataset_name=dataset_name,
        example_input="image.png",
    )


if __name__ == "__main__":
    sys.exit(main())
