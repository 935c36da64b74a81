"""Does the auto-regressive mask cost representational power, and does a wider model (larger D) win it back?

Footnote 22 of the paper: masking attention to make it causal (§4.1) "will cause a loss of representational power.
It's an open question as to how significant this is and whether increasing the capacity of the model can mitigate
it e.g. by using higher dimensional tokens, i.e. increasing D." This script trains the same image classifier on
scikit-learn's digits (16 patches of 2x2 pixels) with and without the causal mask at several widths D, and reports
test accuracy over seeds. Both read the last token (`classifier_pooling="last"`): under the mask it is the only
token that has seen every patch.

    python -m examples.experiments.masking_width              # about 3 minutes on one CPU thread
    python -m examples.experiments.masking_width --full       # 5 seeds, longer training, D up to 128
"""

import argparse
import sys

from examples.experiments import _shared
from examples.helpers.argtypes import positive_int

NAME = "masking_width"
MASKS = {"bidirectional": False, "causal": True}
ACCURACY = "test_accuracy"


def build_parser() -> argparse.ArgumentParser:
    parser = _shared.experiment_parser(__doc__, NAME, steps=400, full_steps=1500, batch_size=64, model_flags=False)
    group = parser.add_argument_group("model (as in turner_tfm.TurnerConfig)")
    group.add_argument(
        "--widths",
        type=positive_int,
        nargs="+",
        default=None,
        help=_shared.computed_default("D values (default: 8 16 32 64)"),
    )
    group.add_argument("--num-hidden-layers", type=positive_int, default=2, help="M, blocks")
    group.add_argument("--num-attention-heads", type=positive_int, default=2, help="H, heads (K = D / H)")
    group.add_argument("--pooling", choices=("last", "mean"), default="last", help="which tokens the classifier reads")
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = _shared.parse(parser, argv)
    if args.widths is None:
        args.widths = [8, 16] if args.quick else [8, 16, 32, 64, 128] if args.full else [8, 16, 32, 64]
    bad = [d for d in args.widths if d % args.num_attention_heads]
    if bad:
        parser.error(f"argument --widths: {bad} are not valid: each D must be divisible by --num-attention-heads")
    with _shared.torch_threads(args.threads):
        run(args)


def variant(mask: str, width: int) -> str:
    return f"{mask}, D={width}"


def run(args: argparse.Namespace) -> None:
    task = _shared.Digits()
    print(task.description)
    size = {"num_hidden_layers": args.num_hidden_layers, "num_attention_heads": args.num_attention_heads}
    variants = {
        variant(mask, width): {"hidden_size": width, "is_causal": causal, "classifier_pooling": args.pooling, **size}
        for width in args.widths
        for mask, causal in MASKS.items()
    }
    training = _shared.Training(args.steps, args.learning_rate, args.batch_size)
    runs = _shared.run_variants(task, variants, args.seeds, training)

    def metric(mask: str, width: int, name: str) -> list[float]:
        return _shared.values(runs, variant(mask, width), name)

    def gap(width: int) -> list[float]:
        return _shared.paired_differences(runs, variant("causal", width), variant("bidirectional", width), ACCURACY)

    rows = []
    for width in args.widths:
        params = next(r.parameters for r in runs if r.variant == variant("causal", width))
        rows.append(
            [
                width,
                f"{params:,}",
                *(_shared.cell(metric(mask, width, ACCURACY), 1, 100) for mask in MASKS),
                _shared.cell(gap(width), 1, 100),
                *(_shared.cell(metric(mask, width, "test_loss")) for mask in MASKS),
            ]
        )
    headers = ["D", "parameters", "bidirectional accuracy %", "causal accuracy %", "gap (points)"]
    headers += ["bidirectional test loss", "causal test loss"]
    table = _shared.markdown_table(headers, rows)

    fig, (left, right) = _shared.figure(2)
    percent = {m: [[100 * a for a in metric(m, d, ACCURACY)] for d in args.widths] for m in MASKS}
    _shared.error_bars(left, args.widths, percent)
    gaps = {"bidirectional - causal": [[100 * g for g in gap(d)] for d in args.widths]}
    _shared.error_bars(right, args.widths, gaps)
    for ax, ylabel in ((left, "test accuracy %"), (right, "accuracy gap (points)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("width D")
        ax.set_ylabel(ylabel)
        ax.legend()
    right.axhline(0.0, color="grey", linewidth=0.8)
    fig.suptitle(f"Footnote 22: causal mask vs width (digits, pooling '{args.pooling}', mean ± std over seeds)")
    setup = [
        task.description,
        f"TurnerForImageClassification, M={args.num_hidden_layers} blocks, H={args.num_attention_heads} heads, "
        f"MLP 4D, learned positions, classifier_pooling={args.pooling!r}",
        f"AdamW, batch {args.batch_size}, peak rate {args.learning_rate:g}, warm-up 5% then cosine, clip 1.0",
        "gap: bidirectional minus causal accuracy, seed by seed",
    ]
    title = "Footnote 22: the causal mask's cost vs width D"
    _shared.write_results(args, NAME, title, setup, [table], fig, runs)


if __name__ == "__main__":
    sys.exit(main())
