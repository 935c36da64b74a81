"""Which token normalisation, placed where, keeps training stable as the learning rate rises?

Figure 5 of the paper: transformers normalise each token (LayerNorm, "TokenNorm"); batch normalisation, over the
batch and the tokens together, "is found to be far less stable [Shen et al., 2020]"; footnote 18: "the exact
configuration of the normalisation and residual layers can differ" (pre-norm, Xiong et al. 2020, or post-norm).
This script trains a character language model with each of LayerNorm, RMSNorm and BatchNorm (`normalization`)
before or after each residual sum (`norm_position`), at rising constant learning rates, without warm-up or gradient
clipping (the usual safety nets, left off to expose instability), and counts the runs that fail.

A run diverged when its training loss became NaN or infinite, or when its mean training loss over the last 10% of
steps is above its loss at the first step. A run that did not diverge but whose held-out loss is no better than
predicting every character from the letter frequencies (the unigram loss) is counted as "at unigram": it learned
nothing from the context in the steps it had.

    python -m examples.experiments.norm_stability              # about 6 minutes on one CPU thread
    python -m examples.experiments.norm_stability --full       # 5 seeds, longer training
"""

import argparse
import sys

from examples.experiments import _shared
from examples.helpers.argtypes import positive_float

NAME = "norm_stability"
NORMS = ("layernorm", "rmsnorm", "batchnorm")
PLACES = ("pre", "post")
RATES = {"quick": [1e-3, 1.0], "default": [3e-3, 3e-2, 1e-1, 3e-1, 1.0]}


def build_parser() -> argparse.ArgumentParser:
    parser = _shared.experiment_parser(
        __doc__, NAME, steps=150, full_steps=600, learning_rate=None, batch_size=16, model=(32, 2, 4), block_size=32
    )
    parser.add_argument_group("sweep").add_argument(
        "--learning-rates",
        type=positive_float,
        nargs="+",
        default=None,
        help=_shared.computed_default(f"constant AdamW rates (default: {' '.join(map(str, RATES['default']))})"),
    )
    return parser


def label(norm: str, place: str) -> str:
    return f"{norm}, {place}-norm"


def main(argv: list[str] | None = None) -> None:
    args = _shared.parse(build_parser(), argv)
    if args.learning_rates is None:
        args.learning_rates = RATES["quick" if args.quick else "default"]
    with _shared.torch_threads(args.threads):
        run(args)


def failures(runs: list[_shared.Run], baseline: float) -> str:
    """'—' when every run trained, else how many diverged and how many ended no better than letter frequencies."""
    diverged = sum(r.diverged for r in runs)
    stuck = sum(not r.diverged and r.metrics["val_loss"] >= baseline for r in runs)
    parts = [f"{diverged} diverged"] * bool(diverged) + [f"{stuck} at unigram"] * bool(stuck)
    return ", ".join(parts) if parts else "—"


def run(args: argparse.Namespace) -> None:
    task = _shared.CharLM(block_size=args.block_size)
    print(f"{task.description}; unigram (letter-frequency) loss {task.unigram_loss:.3f}")
    variants, trainings = {}, {}
    for rate in args.learning_rates:
        for norm in NORMS:
            for place in PLACES:
                name = f"{label(norm, place)}, lr {rate:g}"
                variants[name] = {**_shared.model_size(args), "normalization": norm, "norm_position": place}
                trainings[name] = _shared.Training(
                    args.steps, rate, args.batch_size, warmup_fraction=0.0, schedule="constant", clip=None
                )
    runs = _shared.run_variants(task, variants, args.seeds, trainings.__getitem__)

    def of(norm: str, place: str, rate: float) -> list[_shared.Run]:
        return [r for r in runs if r.variant == f"{label(norm, place)}, lr {rate:g}"]

    baseline = task.unigram_loss
    rates = [f"lr {rate:g}" for rate in args.learning_rates]
    failure_rows, loss_rows, failed, losses = [], [], {}, {}
    for norm in NORMS:
        for place in PLACES:
            name, cells = label(norm, place), [of(norm, place, rate) for rate in args.learning_rates]
            failure_rows.append([name, *(failures(c, baseline) for c in cells)])
            kept = [[r.metrics["val_loss"] for r in c if not r.diverged] for c in cells]
            loss_rows.append([name, *(_shared.cell(k, empty="all diverged") for k in kept)])
            failed[name] = [[sum(r.diverged or r.metrics["val_loss"] >= baseline for r in c) / len(c)] for c in cells]
            losses[name] = kept
    seeds = len(args.seeds)
    tables = [
        f"Failed runs of {seeds} (—: all {seeds} trained):\n\n"
        + _shared.markdown_table(["normalisation", *rates], failure_rows),
        f"Held-out loss (nats/char) of the runs that did not diverge; the unigram loss is {baseline:.3f}:\n\n"
        + _shared.markdown_table(["normalisation", *rates], loss_rows),
    ]

    fig, (left, right) = _shared.figure(2, height=4.0)
    styles = {
        label(norm, place): {"color": f"C{i}", "linestyle": "-" if place == "pre" else "--"}
        for i, norm in enumerate(NORMS)
        for place in PLACES
    }
    for shift, (name, fraction) in enumerate(failed.items()):  # nudged sideways so equal values stay visible
        nudged = [rate * 1.06 ** (shift - 2.5) for rate in args.learning_rates]
        _shared.error_bars(left, nudged, {name: fraction}, styles=styles)
    _shared.error_bars(right, args.learning_rates, losses, styles=styles)
    right.axhline(baseline, color="grey", linewidth=1, linestyle=":", label="unigram loss")
    left.set_ylim(-0.05, 1.05)
    ylabels = ("fraction of seeds diverged or at unigram", "held-out loss (nats/char), not diverged")
    for ax, ylabel in zip((left, right), ylabels, strict=True):
        ax.set_xscale("log")
        ax.set_xlabel("learning rate (constant, no warm-up, no clipping)")
        ax.set_ylabel(ylabel)
    right.legend(fontsize=7)
    fig.suptitle("Figure 5 / footnote 18: normalisation type and placement vs learning rate (mean ± std over seeds)")
    setup = [
        f"{task.description}; unigram loss {baseline:.3f} nats/char",
        f"TurnerForCausalLM, D={args.hidden_size}, M={args.num_hidden_layers} blocks, H={args.num_attention_heads} "
        "heads, MLP 4D, learned positions",
        f"AdamW (weight decay 0.01), batch {args.batch_size}, constant learning rate, no warm-up, no gradient clipping",
        "diverged: a NaN/inf training loss, or a final training loss (mean of the last 10% of steps) above the first",
        "at unigram: not diverged, but held-out loss at or above the unigram loss",
        "held-out loss measured in eval mode (BatchNorm uses its running statistics)",
    ]
    _shared.write_results(args, NAME, "Normalisation type and placement: stability", setup, tables, fig, runs)


if __name__ == "__main__":
    sys.exit(main())
