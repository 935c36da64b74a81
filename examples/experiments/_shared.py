"""What the experiment scripts share: two small real tasks, a plain PyTorch training loop, variants run over seeds,
and the results written as a Markdown table, a plot and the raw numbers.

Tasks (nothing to download):
- `CharLM`: next-character prediction on the docstrings of Python's standard library (`examples/helpers/data.py`),
  the last 10% held out; loss in nats per character.
- `Digits`: scikit-learn's 1,797 handwritten digits (8x8 pixels) as 16 patches of 2x2 (§4.2), a fixed stratified
  20% held out; accuracy and loss.

Every run with the same seed sees the same initial weights where shapes allow and the same batches, so variants
are compared pairwise. torch, transformers and matplotlib load only once the flags are parsed, so `--help` answers
at once.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
import textwrap
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from examples.helpers.argtypes import non_negative_int, positive_float, positive_int

if TYPE_CHECKING:
    import torch
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from transformers import PreTrainedModel

    from turner_tfm import TurnerConfig

QUICK_STEPS = 20
NAN = float("nan")


# ----------------------------------------------------------------------------------------------------------- flags


def experiment_parser(
    doc: str,
    name: str,
    *,
    steps: int = 300,
    full_steps: int = 1000,
    learning_rate: float | None = 3e-3,
    batch_size: int = 32,
    model_flags: bool = True,
    model: tuple[int, int, int] = (64, 2, 4),
    block_size: int | None = None,
) -> argparse.ArgumentParser:
    """The flags every experiment takes; `doc` is the script's docstring (its first paragraph is the description),
    `model` the default (D, M, H) for the model flags, `block_size` the language model's window (None: no LM)."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.set_defaults(default_steps=steps, full_steps=full_steps)
    group = parser.add_argument_group("runs")
    group.add_argument(
        "--seeds", type=non_negative_int, nargs="+", default=None, help=computed_default("seeds (default: 0 1 2)")
    )
    group.add_argument(
        "--steps", type=positive_int, default=None, help=computed_default(f"optimiser steps per run (default: {steps})")
    )
    group.add_argument("--batch-size", type=positive_int, default=batch_size, help="sequences or images per step")
    if learning_rate is not None:  # None: the script sweeps rates itself
        group.add_argument("--learning-rate", type=positive_float, default=learning_rate, help="AdamW peak rate")
    group.add_argument("--output-dir", default=f"experiments-results/{name}", help="where the table and plot go")
    group.add_argument("--threads", type=positive_int, default=1, help="torch threads (small models: 1 is enough)")
    size = group.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help=f"smoke run: seed 0, {QUICK_STEPS} steps, fewer variants")
    size.add_argument("--full", action="store_true", help=f"longer: seeds 0-4, {full_steps} steps")
    if block_size is not None:
        group.add_argument("--block-size", type=positive_int, default=block_size, help="N, characters per LM window")
    if model_flags:
        sizes = parser.add_argument_group("model (as in turner_tfm.TurnerConfig)")
        sizes.add_argument("--hidden-size", type=positive_int, default=model[0], help="D, features per token")
        sizes.add_argument("--num-hidden-layers", type=positive_int, default=model[1], help="M, blocks")
        sizes.add_argument("--num-attention-heads", type=positive_int, default=model[2], help="H, heads")
    return parser


def computed_default(text: str) -> str:
    """Help for a flag whose default depends on --quick / --full: `text` says it, and argparse's own
    "(default: None)" is left out (a help string that mentions %(default) gets none added; `.0s` prints nothing)."""
    return f"{text}%(default).0s"


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse the flags and fill `seeds` and `steps` from --quick / --full when not given."""
    args = parser.parse_args(argv)
    if args.seeds is None:
        args.seeds = [0] if args.quick else list(range(5 if args.full else 3))
    if args.steps is None:
        args.steps = QUICK_STEPS if args.quick else (args.full_steps if args.full else args.default_steps)
    hidden, heads = getattr(args, "hidden_size", None), getattr(args, "num_attention_heads", None)
    if hidden is not None and hidden % heads:
        parser.error(f"argument --hidden-size: {hidden} is not valid: it must be divisible by --num-attention-heads")
    return args


def model_size(args: argparse.Namespace) -> dict[str, int]:
    """The `TurnerConfig` size fields from the model flags."""
    return {
        "hidden_size": args.hidden_size,
        "num_hidden_layers": args.num_hidden_layers,
        "num_attention_heads": args.num_attention_heads,
    }


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Run with `count` torch threads, then restore the previous number (the scripts also run inside tests)."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


# ----------------------------------------------------------------------------------------------------------- tasks


class CharLM:
    """Next-character prediction on the standard library's docstrings (§4.1), in windows of `block_size`.

    The loss is computed on all `block_size` predictions of a window of `block_size + 1` characters, so every
    position the model is trained at also predicts. `unigram_loss` is the held-out loss of predicting every
    character from the letter frequencies alone: a model at or above it has learned nothing from the context.
    """

    name = "char LM (stdlib docstrings)"

    def __init__(self, block_size: int = 64, eval_windows: int = 128):
        import torch

        from examples.helpers import data

        train_text, val_text = data.split_text(data.stdlib_docstrings(), validation_percentage=10)
        self.vocab = {char: i + 1 for i, char in enumerate(sorted(set(train_text)))}  # 0: a character never seen
        self.train_ids = torch.tensor([self.vocab.get(c, 0) for c in train_text])
        self.val_ids = torch.tensor([self.vocab.get(c, 0) for c in val_text])
        self.block_size = block_size
        self.eval_windows = eval_windows
        counts = torch.bincount(self.train_ids, minlength=len(self.vocab) + 1).double() + 1.0  # add-one smoothing
        self.unigram_loss = float(-(counts / counts.sum()).log()[self.val_ids].mean())
        self.description = (
            f"{self.name}: {len(train_text):,} training and {len(val_text):,} held-out characters, "
            f"{len(self.vocab) + 1} symbols, windows of {block_size}"
        )

    def config(self, **fields: Any) -> TurnerConfig:
        from turner_tfm import TurnerConfig

        return TurnerConfig(vocab_size=len(self.vocab) + 1, max_position_embeddings=self.block_size, **fields)

    def model(self, config: TurnerConfig) -> PreTrainedModel:
        from turner_tfm import TurnerForCausalLM

        return TurnerForCausalLM(config)

    def batch(self, generator: torch.Generator, batch_size: int) -> torch.Tensor:
        import torch

        starts = torch.randint(0, len(self.train_ids) - self.block_size - 1, (batch_size,), generator=generator)
        return torch.stack([self.train_ids[s : s + self.block_size + 1] for s in starts.tolist()])

    def loss(self, model: PreTrainedModel, windows: torch.Tensor) -> torch.Tensor:
        return self.token_losses(model, windows).mean()

    @staticmethod
    def token_losses(model: PreTrainedModel, windows: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of each next-character prediction: (windows, length - 1), in nats."""
        import torch

        logits = model(input_ids=windows[:, :-1], use_cache=False).logits
        return torch.nn.functional.cross_entropy(logits.transpose(1, 2).float(), windows[:, 1:], reduction="none")

    def eval_set(self, length: int) -> torch.Tensor:
        """`eval_windows` held-out windows of `length` + 1 characters at evenly spaced starts (the same for all)."""
        import torch

        starts = torch.linspace(0, len(self.val_ids) - length - 2, self.eval_windows).long()
        return torch.stack([self.val_ids[s : s + length + 1] for s in starts.tolist()])

    def position_losses(self, model: PreTrainedModel, length: int) -> torch.Tensor:
        """Held-out loss at each input position 0..length-1, averaged over the evaluation windows."""
        return evaluating(model, lambda: self.token_losses(model, self.eval_set(length)).mean(dim=0))

    def evaluate(self, model: PreTrainedModel) -> dict[str, float]:
        return {"val_loss": float(self.position_losses(model, self.block_size).mean())}


class Digits:
    """scikit-learn's handwritten digits as images of 16 patches of 2x2 pixels plus a class token (§4.2)."""

    name = "digits (scikit-learn, 8x8)"

    def __init__(self, test_fraction: float = 0.2):
        import torch
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split

        data = load_digits()
        pixels = torch.tensor(data.images / 8.0 - 1.0, dtype=torch.float32).unsqueeze(1)  # 0..16 -> -1..1
        labels = torch.tensor(data.target)
        rows = range(len(labels))
        train, test = train_test_split(rows, test_size=test_fraction, stratify=data.target, random_state=0)
        self.train_x, self.train_y = pixels[train], labels[train]
        self.test_x, self.test_y = pixels[test], labels[test]
        self.description = f"{self.name}: {len(train)} training and {len(test)} test images, 10 classes"

    def config(self, **fields: Any) -> TurnerConfig:
        from turner_tfm import TurnerConfig

        fields = {"is_causal": False, **fields}
        return TurnerConfig(image_size=8, patch_size=2, num_channels=1, num_labels=10, **fields)

    def model(self, config: TurnerConfig) -> PreTrainedModel:
        from turner_tfm import TurnerForImageClassification

        return TurnerForImageClassification(config)

    def batch(self, generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        rows = torch.randint(0, len(self.train_y), (batch_size,), generator=generator)
        return self.train_x[rows], self.train_y[rows]

    @staticmethod
    def loss(model: PreTrainedModel, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return model(pixel_values=batch[0], labels=batch[1]).loss

    def evaluate(self, model: PreTrainedModel) -> dict[str, float]:
        import torch

        logits = evaluating(model, lambda: model(pixel_values=self.test_x).logits.float())
        return {
            "test_accuracy": float((logits.argmax(-1) == self.test_y).float().mean()),
            "test_loss": float(torch.nn.functional.cross_entropy(logits, self.test_y)),
        }


Task = CharLM | Digits


def evaluating(model: PreTrainedModel, compute: Callable[[], Any]) -> Any:
    """`compute()` in eval mode (no dropout, BatchNorm's running statistics) without gradients; mode restored."""
    import torch

    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            return compute()
    finally:
        model.train(was_training)


# -------------------------------------------------------------------------------------------------------- training


@dataclass
class Training:
    """How one run trains: AdamW, linear warm-up then cosine decay to 10% (or a constant rate), optional clipping."""

    steps: int
    learning_rate: float
    batch_size: int
    warmup_fraction: float = 0.05
    schedule: str = "cosine"
    clip: float | None = 1.0
    weight_decay: float = 0.01

    def rate(self, step: int) -> float:
        warmup = int(self.warmup_fraction * self.steps)
        if step < warmup:
            return self.learning_rate * (step + 1) / warmup
        if self.schedule == "constant":
            return self.learning_rate
        progress = (step - warmup) / max(1, self.steps - warmup)
        return self.learning_rate * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))


@dataclass
class Run:
    """One trained model: which variant and seed, its size, its training losses and what it scored."""

    variant: str
    seed: int
    parameters: int
    initial_loss: float
    final_loss: float
    diverged: bool
    seconds: float
    metrics: dict[str, Any] = field(default_factory=dict)


def train(task: Task, model: PreTrainedModel, training: Training, seed: int) -> tuple[float, float, bool]:
    """Train `model` on `task`; returns (initial loss, final loss, diverged).

    The final loss is the mean training loss over the last 10% of steps. A run has diverged when a loss turned NaN
    or infinite (training stops there) or when its final loss is above its initial loss.
    """
    import torch

    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=training.learning_rate, weight_decay=training.weight_decay)
    model.train()
    losses: list[float] = []
    for step in range(training.steps):
        for group in optimizer.param_groups:
            group["lr"] = training.rate(step)
        loss = task.loss(model, task.batch(generator, training.batch_size))
        losses.append(loss.item())
        if not math.isfinite(losses[-1]):
            return losses[0], NAN, True
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if training.clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), training.clip)
        optimizer.step()
    tail = losses[-max(1, len(losses) // 10) :]
    final = sum(tail) / len(tail)
    return losses[0], final, not math.isfinite(final) or final > losses[0]


def progress_flag(initial: float, final: float, diverged: bool) -> str:
    """What a run's progress line says of its training loss beside its metrics: what was measured, when it did not
    fall (a NaN or infinite loss, or a final loss above the first)."""
    if not diverged:
        return ""
    if not math.isfinite(final):
        return " DIVERGED: the training loss became NaN or infinite"
    return f" the training loss rose: {initial:.3f} at the first step, {final:.3f} over the last 10% of steps"


def run_variants(
    task: Task,
    variants: dict[str, dict[str, Any]],
    seeds: Sequence[int],
    training: Training | Callable[[str], Training],
    measure: Callable[[PreTrainedModel], dict[str, Any]] | None = None,
) -> list[Run]:
    """Train every variant (its `TurnerConfig` fields) with every seed and measure it (default: `task.evaluate`).

    `training` may depend on the variant's name. Progress goes to stdout, one line per run.
    """
    import torch

    runs, total = [], len(variants) * len(seeds)
    for seed in seeds:
        for name, fields in variants.items():
            torch.manual_seed(seed)
            model = task.model(task.config(**fields))
            setup = training(name) if callable(training) else training
            start = time.perf_counter()
            initial, final, diverged = train(task, model, setup, seed)
            metrics = (measure or task.evaluate)(model)
            parameters = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
            runs.append(Run(name, seed, parameters, initial, final, diverged, time.perf_counter() - start, metrics))
            shown = ", ".join(f"{k} {v:.4f}" for k, v in metrics.items() if isinstance(v, float))
            flag = progress_flag(initial, final, diverged)
            print(f"[{len(runs)}/{total}] {name}, seed {seed}: {shown}{flag} ({runs[-1].seconds:.0f} s)", flush=True)
    return runs


# ------------------------------------------------------------------------------------------------ tables and plots


def values(runs: Sequence[Run], variant: str, metric: str) -> list[float]:
    """The finite values of `metric` over the runs of `variant` (one per seed)."""
    found = [run.metrics.get(metric, NAN) for run in runs if run.variant == variant]
    return [float(v) for v in found if isinstance(v, (int, float)) and math.isfinite(v)]


def paired_differences(runs: Sequence[Run], first: str, second: str, metric: str) -> list[float]:
    """`metric` of `second` minus `metric` of `first`, seed by seed (both finite)."""
    by_seed = {(run.variant, run.seed): run.metrics.get(metric, NAN) for run in runs}
    seeds = sorted({run.seed for run in runs})
    pairs = [(by_seed.get((first, s), NAN), by_seed.get((second, s), NAN)) for s in seeds]
    return [b - a for a, b in pairs if math.isfinite(a) and math.isfinite(b)]


def mean_std(numbers: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value; NaN for none)."""
    if not numbers:
        return NAN, NAN
    return statistics.fmean(numbers), statistics.stdev(numbers) if len(numbers) > 1 else 0.0


def cell(numbers: Sequence[float], digits: int = 3, scale: float = 1.0, empty: str = "n/a") -> str:
    """`mean ± std` over seeds for a table cell (just the value for one seed, `empty` for none)."""
    if not numbers:
        return empty
    mean, std = mean_std([scale * n for n in numbers])
    return f"{mean:.{digits}f}" if len(numbers) == 1 else f"{mean:.{digits}f} ± {std:.{digits}f}"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub Markdown table; numbers right-aligned."""
    align = ["---:" if i else ":---" for i in range(len(headers))]
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def figure(columns: int, height: float = 3.4, width: float = 4.6) -> tuple[Figure, list[Axes]]:
    """A figure of `columns` side-by-side panels `width` inches wide (matplotlib's object API: no GUI, no pyplot)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * columns, height), layout="constrained")
    return fig, list(fig.subplots(1, columns, squeeze=False)[0])


def error_bars(
    ax: Axes,
    xs: Sequence[float],
    series: dict[str, list[list[float]]],
    marker: str = "o",
    styles: dict[str, dict[str, Any]] | None = None,
) -> None:
    """One line per series: the mean over seeds at each x, with a bar of ± one standard deviation; `styles` adds
    matplotlib keywords per series."""
    for label, per_x in series.items():
        points = [(x, *mean_std(v)) for x, v in zip(xs, per_x, strict=True) if v]
        if points:
            x, mean, std = zip(*points, strict=True)
            style = {"marker": marker, "capsize": 3, **(styles or {}).get(label, {})}
            ax.errorbar(x, mean, yerr=std, label=label, **style)
    ax.grid(alpha=0.3)


def seed_strip(ax: Axes, groups: dict[str, list[float]], ylabel: str) -> None:
    """Each variant's per-seed values as dots with its mean as a bar: small samples shown, not hidden."""
    for i, numbers in enumerate(groups.values()):
        ax.scatter([i] * len(numbers), numbers, color=f"C{i}", alpha=0.8, zorder=3)
        if numbers:
            ax.hlines(statistics.fmean(numbers), i - 0.25, i + 0.25, color=f"C{i}", linewidth=2.5)
    ax.set_xticks(range(len(groups)), [textwrap.fill(label, 22) for label in groups], fontsize=8)
    ax.set_xlim(-0.6, len(groups) - 0.4)
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)


def write_results(
    args: argparse.Namespace,
    name: str,
    title: str,
    setup: Sequence[str],
    tables: Sequence[str],
    fig: Figure,
    runs: Sequence[Run],
) -> Path:
    """Write `results.md` (title, setup lines, tables, the plot), `<name>.png` and `runs.json` to --output-dir;
    print the tables. Returns the Markdown file."""
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    fig.savefig(out / f"{name}.png", dpi=100)
    seeds = " ".join(str(s) for s in args.seeds)
    lines = [f"# {title}", "", *[f"- {line}" for line in setup], f"- seeds: {seeds}; {args.steps} steps per run", ""]
    for table in tables:
        lines += [table, ""]
    lines += [f"![{title}]({name}.png)", ""]
    markdown = out / "results.md"
    markdown.write_text("\n".join(lines))
    (out / "runs.json").write_text(json.dumps([asdict(run) for run in runs], indent=1))
    print("\n" + "\n\n".join(tables) + f"\n\nwritten: {markdown}, {out / (name + '.png')}, {out / 'runs.json'}")
    return markdown


# ------------------------------------------------------------------------------- variants compared on both tasks

# per task: the metric reported, its heading, decimals and scale
HEADLINE = {
    "CharLM": ("val_loss", "held-out loss (nats/char)", 3, 1.0),
    "Digits": ("test_accuracy", "test accuracy %", 1, 100.0),
}


def compare_on_tasks(
    args: argparse.Namespace,
    name: str,
    title: str,
    variants: dict[str, dict[str, Any]],
    task_fields: dict[str, dict[str, Any]] | None = None,
    notes: Sequence[str] = (),
) -> list[Run]:
    """Train each variant on the character LM and on the digits, every seed; one table row per task and variant,
    with the seed-by-seed difference from the first variant, and one panel of per-seed values per task.

    `task_fields` adds `TurnerConfig` fields per task class name (e.g. untied embeddings for the LM only).
    """
    training = Training(args.steps, args.learning_rate, args.batch_size)
    runs, rows, panels = [], [], {}
    baseline = next(iter(variants))
    size = f"D={args.hidden_size}, M={args.num_hidden_layers} blocks, H={args.num_attention_heads} heads"
    setup = [f"{size}, MLP 4D, pre-norm LayerNorm, learned positions"]
    setup += [f"AdamW, batch {args.batch_size}, peak rate {args.learning_rate:g}, warm-up 5% then cosine, clip 1.0"]
    for task in (CharLM(args.block_size), Digits()):
        kind = type(task).__name__
        print(task.description)
        setup.append(task.description)
        extra = (task_fields or {}).get(kind, {})
        fields = {label: {**model_size(args), **extra, **change} for label, change in variants.items()}
        task_runs = run_variants(task, fields, args.seeds, training)
        runs += task_runs
        metric, heading, digits, scale = HEADLINE[kind]
        panels[task.name] = ({v: [scale * x for x in values(task_runs, v, metric)] for v in variants}, heading)
        for label in variants:
            params = next(r.parameters for r in task_runs if r.variant == label)
            diff = paired_differences(task_runs, baseline, label, metric) if label != baseline else []
            value = cell(values(task_runs, label, metric), digits, scale)
            rows.append([task.name, label, f"{params:,}", heading, value, cell(diff, digits, scale, empty="—")])
    table = markdown_table(["task", "variant", "parameters", "metric", "value", f"minus {baseline!r}"], rows)
    fig, axes = figure(len(panels))
    for ax, (task_name, (groups, heading)) in zip(axes, panels.items(), strict=True):
        seed_strip(ax, groups, heading)
        ax.set_title(task_name, fontsize=10)
    fig.suptitle(f"{title} (dots: seeds, bars: means)")
    write_results(args, name, title, [*setup, *notes], [table], fig, runs)
    return runs
