"""Which position encodings still work on sequences twice as long as those seen in training?

§3 of the paper offers learned position embeddings (a table, one vector per position), fixed sinusoids, and relative
positions inside attention; and with the auto-regressive mask, footnote 21 notes, the mask itself "encodes position
information". This script trains a character language model on windows of N characters with each of
`position_embedding_type` = learned, sinusoidal, rotary (relative) and none, then measures held-out loss at N and at
2N, position by position. Learned positions have no vector past N - 1: the model refuses the longer input with a
ValueError, reported as such.

    python -m examples.experiments.position_length              # about 3 minutes on one CPU thread
    python -m examples.experiments.position_length --full       # 5 seeds, longer training
"""

import argparse
import sys

from examples.experiments import _shared

NAME = "position_length"
TYPES = ("learned", "sinusoidal", "rotary", "none")
BIN = 4  # positions averaged together in the plot


def build_parser() -> argparse.ArgumentParser:
    return _shared.experiment_parser(__doc__, NAME, block_size=32)


def main(argv: list[str] | None = None) -> None:
    args = _shared.parse(build_parser(), argv)
    with _shared.torch_threads(args.threads):
        run(args)


def run(args: argparse.Namespace) -> None:
    n = args.block_size
    task = _shared.CharLM(block_size=n)
    print(task.description)

    def measure(model: object) -> dict[str, object]:
        within = task.position_losses(model, n)
        metrics: dict[str, object] = {
            "val_loss": float(within.mean()),
            "loss_late_within_n": float(within[n // 2 :].mean()),
        }
        try:
            per_position = task.position_losses(model, 2 * n)
        except ValueError as error:  # learned positions: no embedding past N - 1
            return {**metrics, "per_position": within.tolist(), "refused": str(error)}
        metrics["loss_beyond_n"] = float(per_position[n:].mean())
        metrics["loss_2n"] = float(per_position.mean())
        return {**metrics, "per_position": per_position.tolist()}

    variants = {kind: {**_shared.model_size(args), "position_embedding_type": kind} for kind in TYPES}
    training = _shared.Training(args.steps, args.learning_rate, args.batch_size)
    runs = _shared.run_variants(task, variants, args.seeds, training, measure)

    rows = []
    for kind in TYPES:
        refused = any("refused" in r.metrics for r in runs if r.variant == kind)
        cells = [_shared.cell(_shared.values(runs, kind, m)) for m in ("val_loss", "loss_late_within_n")]
        beyond = [_shared.cell(_shared.values(runs, kind, m)) for m in ("loss_beyond_n", "loss_2n")]
        rows.append([kind, *cells, *(["n/a (refuses: ValueError)"] * 2 if refused else beyond)])
    headers = [
        "positions",
        f"loss at N={n} (positions 0..{n - 1})",
        f"positions {n // 2}..{n - 1}",
        f"at 2N: positions {n}..{2 * n - 1} (unseen)",
        f"at 2N={2 * n}: all positions",
    ]
    table = _shared.markdown_table(headers, rows)

    fig, (ax,) = _shared.figure(1, height=4.2, width=8.0)
    starts = list(range(0, 2 * n, BIN))
    curves = {}
    for kind in TYPES:
        per_seed = [r.metrics["per_position"] for r in runs if r.variant == kind]
        name = f"{kind} (refuses past N)" if len(per_seed[0]) == n else kind
        curves[name] = [[sum(c[s : s + BIN]) / BIN for c in per_seed if len(c) > s] for s in starts]
    _shared.error_bars(ax, [s + (BIN - 1) / 2 for s in starts], curves, marker=".")
    ax.axvline(n - 0.5, color="grey", linestyle="--", linewidth=1, label=f"training length N={n}")
    ax.set_xlabel(f"input position (mean of {BIN})")
    ax.set_ylabel("held-out loss (nats/char)")
    ax.legend(fontsize=8)
    fig.suptitle(f"§3: held-out loss by position at twice the training length (N={n}); mean ± std over seeds")
    setup = [
        task.description,
        f"TurnerForCausalLM, D={args.hidden_size}, M={args.num_hidden_layers} blocks, "
        f"H={args.num_attention_heads} heads, MLP 4D, trained on windows of N={n}",
        f"AdamW, batch {args.batch_size}, peak rate {args.learning_rate:g}, warm-up 5% then cosine, clip 1.0",
        f"evaluation: {task.eval_windows} held-out windows at N and at 2N; the loss at position t is the prediction "
        "of character t+1 from characters 0..t",
    ]
    _shared.write_results(args, NAME, "§3: position encodings at twice the training length", setup, [table], fig, runs)


if __name__ == "__main__":
    sys.exit(main())
