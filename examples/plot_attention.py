"""Draw what a Turner model attends to, as PNG: attention maps per layer and head for text, and the class token's
attention over the patches laid on the image for images.

Text: a saved causal language model with its tokenizer (e.g. the folder examples/quickstart.py writes), or, without
--model, a fresh untrained tiny model with a character tokenizer. Each panel is one head's attention matrix A
(eq. 5), drawn the paper's way round: output token n across, input token n' down, each column summing to 1.

Images: a saved image classifier with its image processor (e.g. the folder examples/train_image_classifier.py
writes), or, without --model, a fresh untrained tiny one; the picture is --image, or one of scikit-learn's digits.
The class token's row of attention (§4.2) is reshaped to the patch grid, upsampled to the image and overlaid.

    python -m examples.plot_attention text --model ./turner-quickstart --text "Return the sum"
    python -m examples.plot_attention image --model ./turner-image-classifier --digit 7
    python -m examples.plot_attention text          # fresh tiny model: maps of an untrained network

The model is loaded with attn_implementation="eager", the attention implementation that returns the weights.
"""

import argparse
import sys

from examples.helpers.argtypes import existing_file, non_negative_int, probability, saved_model

# without --model: a tiny untrained network, with the attention that returns its weights
FRESH_MODEL = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "attn_implementation": "eager"}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    modes = parser.add_subparsers(dest="mode", required=True, metavar="{text,image}")
    text = modes.add_parser("text", help="attention maps of a causal language model over a text")
    text.add_argument(
        "--model", type=saved_model, default=None, help="saved causal LM + tokenizer folder (default: fresh tiny model)"
    )
    text.add_argument("--text", default="Return the sum of a and b.", help="the text to run through the model")
    text.add_argument("--output", default="attention-text.png", help="PNG to write")
    image = modes.add_parser("image", help="class-token attention of an image classifier over an image")
    image.add_argument(
        "--model", type=saved_model, default=None, help="saved image classifier folder (default: fresh tiny model)"
    )
    source = image.add_mutually_exclusive_group()
    source.add_argument("--image", type=existing_file, default=None, help="an image file")
    source.add_argument("--digit", type=non_negative_int, default=0, help="index of a scikit-learn digit (default)")
    image.add_argument("--alpha", type=probability, default=0.8, help="opacity of the overlay where attention peaks")
    image.add_argument("--output", default="attention-image.png", help="PNG to write")
    for sub in (text, image):
        sub.add_argument("--layers", type=non_negative_int, nargs="+", default=None, help="layers to draw (all)")
        sub.add_argument("--heads", type=non_negative_int, nargs="+", default=None, help="heads to draw (all)")
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        figure = plot_text(args) if args.mode == "text" else plot_image(args)
    except ValueError as error:  # a layer or head out of range, a text longer than the model's positions, ...
        parser.error(str(error))
    panels = sum(1 for ax in figure.axes if ax.images)
    print(f"wrote {args.output}: {panels} panels")


def plot_text(args: argparse.Namespace) -> object:
    # torch and transformers load once the flags are checked, so --help and a bad flag answer at once
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from examples.helpers import data
    from turner_tfm import TurnerConfig, TurnerForCausalLM
    from turner_tfm.plotting import plot_text_attention

    if args.model is None:
        tokenizer = data.char_tokenizer([args.text], model_max_length=128)
        config = TurnerConfig(vocab_size=len(tokenizer), max_position_embeddings=128, **FRESH_MODEL)
        model, name = TurnerForCausalLM(config), "fresh untrained model"
    else:
        tokenizer = AutoTokenizer.from_pretrained(args.model)
        model, name = AutoModelForCausalLM.from_pretrained(args.model, attn_implementation="eager"), args.model
    ids = tokenizer(args.text, add_special_tokens=False)["input_ids"]
    limit = model.config.max_positions  # None: positions without a limit
    if limit is not None and len(ids) > limit:
        raise ValueError(f"--text has {len(ids)} tokens; the model's learned positions cover {limit}")
    tokens = [tokenizer.decode([i]) for i in ids]
    title = f"{name}: attention per layer and head"
    return plot_text_attention(model, ids, tokens, layers=args.layers, heads=args.heads, title=title, path=args.output)


def plot_image(args: argparse.Namespace) -> object:
    import torch
    from PIL import Image
    from transformers import AutoImageProcessor, AutoModelForImageClassification, ViTImageProcessorPil

    from examples.helpers import data
    from turner_tfm import TurnerConfig, TurnerForImageClassification
    from turner_tfm.plotting import plot_image_attention

    if args.model is None:
        processor = ViTImageProcessorPil(
            size={"height": 8, "width": 8}, image_mean=[0.5] * 3, image_std=[0.5] * 3, do_convert_rgb=True
        )
        config = TurnerConfig(image_size=8, patch_size=2, num_channels=3, is_causal=False, num_labels=10, **FRESH_MODEL)
        model, name = TurnerForImageClassification(config), "fresh untrained model"
    else:
        processor = AutoImageProcessor.from_pretrained(args.model)
        model = AutoModelForImageClassification.from_pretrained(args.model, attn_implementation="eager")
        name = args.model
    if args.image is not None:
        picture = Image.open(args.image)
    else:
        images, _ = data.digits()
        if args.digit >= len(images):
            raise ValueError(f"--digit {args.digit} is out of range: there are {len(images)} digits")
        picture = images[args.digit]
    picture = picture.convert("RGB")
    model.eval()
    pixel_values = processor(images=picture, return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        probabilities = model(pixel_values=pixel_values).logits.softmax(-1)[0]
    best = int(probabilities.argmax())
    title = f"{name}: predicts {model.config.id2label[best]!r} ({float(probabilities[best]):.2f})"
    return plot_image_attention(
        model,
        pixel_values,
        image=picture,
        layers=args.layers,
        heads=args.heads,
        alpha=args.alpha,
        title=title,
        path=args.output,
    )


if __name__ == "__main__":
    sys.exit(main())
