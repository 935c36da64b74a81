"""examples/experiments/: each script runs end to end at smoke-test size and writes a table, a plot and its runs.

Only the structure of what they write is checked, never which variant wins or how long a run takes.
"""

import json
import re
from pathlib import Path

import matplotlib  # noqa: F401  (the dev extra: a missing or broken install fails here, it never skips)
import pytest
import sklearn  # noqa: F401
from PIL import Image

from .workflow_utils import run_module

SCRIPTS = ("masking_width", "shared_qk", "position_combine", "norm_stability", "position_length")
SMALL = ["--quick", "--hidden-size", "16", "--num-attention-heads", "2"]  # fewer features: faster smoke runs
MEAN_STD = r"-?\d+\.\d+ ± \d+\.\d+"


def run(name: str, args: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """`python -m examples.experiments.<name> ARGS`."""
    run_module(f"examples.experiments.{name}", args, monkeypatch)


def results(name: str, args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[list, list]:
    """Run the script into `tmp_path`; check the plot; return its Markdown tables (header + rows each) and runs."""
    run(name, [*args, "--output-dir", str(tmp_path)], monkeypatch)
    plot = tmp_path / f"{name}.png"
    assert plot.stat().st_size > 10_000
    with Image.open(plot) as image:
        assert image.format == "PNG" and image.size[0] > 400 and image.size[1] > 250
    markdown = (tmp_path / "results.md").read_text()
    assert "![" in markdown and f"]({name}.png)" in markdown
    tables, current = [], None
    for line in markdown.splitlines():
        if line.startswith("|"):
            cells = [cell.strip() for cell in line.strip("|").split("|")]
            if current is None:
                current = [cells]
                tables.append(current)
            elif not set("".join(cells)) <= set(":-"):
                assert len(cells) == len(current[0]), f"a row with {len(cells)} cells under {current[0]}"
                current.append(cells)
        else:
            current = None
    return tables, json.loads((tmp_path / "runs.json").read_text())


def test_masking_width_table_has_a_row_per_width_with_both_masks_and_their_gap(tmp_path, monkeypatch):
    args = ["--quick", "--widths", "8", "16", "--seeds", "0", "1"]
    [[header, *rows]], runs = results("masking_width", args, tmp_path, monkeypatch)
    assert header[:5] == ["D", "parameters", "bidirectional accuracy %", "causal accuracy %", "gap (points)"]
    assert [row[0] for row in rows] == ["8", "16"]
    assert all(re.fullmatch(MEAN_STD, cell) for row in rows for cell in row[2:]), "two seeds: mean ± std"
    assert len(runs) == 2 * 2 * 2  # widths x masks x seeds
    assert {run["seed"] for run in runs} == {0, 1}
    assert {"test_accuracy", "test_loss"} <= set(runs[0]["metrics"])


@pytest.mark.parametrize(
    ("name", "variants"),
    [
        ("shared_qk", ["U_q != U_k (separate)", "U_q = U_k (shared)"]),
        (
            "position_combine",
            ["add (D=16)", "concat (D=16: 12 token + 4 position)", "concat (D=20: 16 token + 4 position)"],
        ),
    ],
)
def test_variants_compared_on_both_tasks(name, variants, tmp_path, monkeypatch):
    [[header, *rows]], runs = results(name, SMALL, tmp_path, monkeypatch)
    assert header[:5] == ["task", "variant", "parameters", "metric", "value"]
    assert [row[1] for row in rows] == variants * 2
    assert [row[3] for row in rows] == ["held-out loss (nats/char)"] * len(variants) + ["test accuracy %"] * len(
        variants
    )
    assert all(row[5] == "—" for row in rows[:: len(variants)]), "the first variant is the baseline"
    assert all(re.fullmatch(r"-?\d+\.\d+", row[5]) for i, row in enumerate(rows) if i % len(variants))
    assert len(runs) == 2 * len(variants)


def test_norm_stability_counts_failed_runs_per_normalisation_and_learning_rate(tmp_path, monkeypatch):
    args = [*SMALL, "--learning-rates", "0.001", "0.1"]
    (failed, losses), runs = results("norm_stability", args, tmp_path, monkeypatch)
    for header, *rows in (failed, losses):
        assert header == ["normalisation", "lr 0.001", "lr 0.1"]
        assert [row[0] for row in rows] == [
            f"{norm}, {place}-norm" for norm in ("layernorm", "rmsnorm", "batchnorm") for place in ("pre", "post")
        ]
    assert all(re.fullmatch(r"—|1 diverged|1 at unigram", cell) for row in failed[1:] for cell in row[1:])
    assert all(re.fullmatch(r"\d+\.\d+|all diverged", cell) for row in losses[1:] for cell in row[1:])
    assert len(runs) == 6 * 2
    assert all(isinstance(run["diverged"], bool) for run in runs)


def test_position_length_reports_that_learned_positions_refuse_twice_the_length(tmp_path, monkeypatch):
    [[header, *rows]], runs = results("position_length", [*SMALL, "--block-size", "16"], tmp_path, monkeypatch)
    assert header[0] == "positions" and "N=16" in header[1] and "2N=32" in header[4]
    assert [row[0] for row in rows] == ["learned", "sinusoidal", "rotary", "none"]
    assert rows[0][3:] == ["n/a (refuses: ValueError)"] * 2
    assert all(re.fullmatch(r"\d+\.\d+", cell) for row in rows[1:] for cell in row[1:])
    learned, rotary = runs[0], runs[2]
    assert "max_position_embeddings" in learned["metrics"]["refused"]
    assert len(learned["metrics"]["per_position"]) == 16 and len(rotary["metrics"]["per_position"]) == 32


@pytest.mark.parametrize("name", SCRIPTS)
def test_help_describes_the_question(name, monkeypatch, capsys):
    run(name, ["--help"], monkeypatch)  # exits with status 0, or `run` raises
    out = capsys.readouterr().out
    assert "--seeds" in out and "--output-dir" in out and "--quick" in out and "--full" in out


def test_a_width_the_heads_cannot_split_is_a_usage_error(monkeypatch, capsys):
    with pytest.raises(SystemExit) as done:
        run("masking_width", ["--widths", "8", "9"], monkeypatch)
    assert done.value.code == 2
    assert "--widths: [9]" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("initial", "final", "diverged", "said"),
    [
        (2.302, 1.9, False, ""),
        (2.302, 2.313, True, " the training loss rose: 2.302 at the first step, 2.313 over the last 10% of steps"),
        (2.302, float("nan"), True, " DIVERGED: the training loss became NaN or infinite"),
    ],
)
def test_a_runs_progress_line_says_what_its_loss_did(initial, final, diverged, said):
    """A short run whose loss moved 2.302 -> 2.313 is not called diverged: the line says what was measured."""
    from examples.experiments._shared import progress_flag

    assert progress_flag(initial, final, diverged) == said
