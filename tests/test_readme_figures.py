"""README's Speed section against the JSON it cites: every table row's figures, as printed, are the measurement's
(rounded as the README rounds them), so a figure cannot go stale unseen. A row added to a table must be wired below
(`ROWS`), and a table must cite the JSON files its rows come from in the text beside it."""

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = "benchmarks/results/"


def speed_section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("\n## Speed\n")
    return text[start : text.index("\n## ", start + 1)]


def tables_with_citations(section: str) -> list[tuple[list[list[str]], set[str]]]:
    """Each Markdown table of `section` (its body rows, cells stripped) with the JSON files cited in the text between
    it and the next table (or the section's end)."""
    lines = section.splitlines()
    spans, index = [], 0  # each table's first line and the line after its last
    while index < len(lines):
        if lines[index].startswith("|"):
            end = next((n for n in range(index, len(lines)) if not lines[n].startswith("|")), len(lines))
            spans.append((index, end))
            index = end
        index += 1
    tables = []
    for number, (start, end) in enumerate(spans):
        rows = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in lines[start + 2 : end]]
        after = "\n".join(lines[end : spans[number + 1][0] if number + 1 < len(spans) else len(lines)])
        tables.append((rows, set(re.findall(r"\((benchmarks/results/[\w./-]+\.json)\)", after))))
    return tables


def load(path: str) -> dict:
    return json.loads((ROOT / path).read_text())


def record(path: str, section: str | None = None, **match) -> dict:
    """The one result of `path` (in `section`, for the GPU column's JSON) whose fields equal `match`."""
    data = load(path)
    results = data["sections"][section] if section else data["results"]
    found = [r for r in results if all(r.get(key) == value for key, value in match.items())]
    assert len(found) == 1, f"{path}: {len(found)} results match {match}"
    return found[0]


def ratio(value: float) -> str:
    return f"{value:.2f}x"


def speedups(path: str, versus_minimal: bool = True, **match) -> tuple[str, str]:
    r = record(path, **match)["turner_speedup"]
    return ratio(r["vs_gpt2"]["median"]), ratio(r["vs_minimal"]["median"]) if versus_minimal else "n/a"


def host_cost(case: str) -> tuple[str, ...]:
    r = record(HOST_COST, case=case)["turner_ratio"]
    return tuple(ratio(r[axis]["gpt2"]) for axis in ("seconds", "aten_ops", "top_level_ops", "python_calls"))


def rate(tokens_per_second: float) -> str:
    return f"{tokens_per_second / 1000:.1f}k tok/s" if tokens_per_second >= 10_000 else f"{tokens_per_second:.0f} tok/s"


def gpu_row(section: str, batch: int, shape: str | None = None, own_loop: bool = False) -> tuple[str, ...]:
    path = CONTINUOUS if section == "continuous-batching" else GPU
    r = record(path, section, batch=batch, **({"shape": shape} if shape else {}))
    if section.startswith("train"):
        turner = f"{r['times']['turner']['median_s'] * 1000:.1f} ms"
        if shape == "gpt2-small":
            turner += f", {r['mfu']['turner'] * 100:.1f}% MFU"
    else:
        turner = rate(r["tokens_per_second"]["turner"])
    minimal = r["turner_speedup"].get("vs_minimal")
    versus_minimal = "n/a" if minimal is None else ratio(minimal["median"]) + (" (its own loop)" if own_loop else "")
    return turner, ratio(r["turner_speedup"]["vs_gpt2"]["median"]), versus_minimal


DAY = RESULTS + "2026-11-27/"
TRAIN, TRAIN_COMPILED = DAY + "train_cpu_no_cache.json", DAY + "train_cpu_compiled_no_cache.json"
HOST_COST = DAY + "host_cost_top_level.json"
XEON = RESULTS + "2026-11-28/xeon_"
XEON_TRAIN = XEON + "train.json"
DYNAMIC_B1, DYNAMIC_B8, STATIC = (
    XEON + "generate_dynamic_b1.json",
    XEON + "generate_dynamic_b8.json",
    XEON + "generate_static_b1.json",
)
GPU, CONTINUOUS = RESULTS + "gpu/gpu_column_h200.json", RESULTS + "gpu/continuous_batching_h200.json"

# README row (its first cell, per table in order) -> (the JSON files it reads, the cells after the first, from them)
ROWS = [
    {
        "training step (forward, backward, AdamW), L4 D128, 12 x 64 tokens": (
            {TRAIN},
            lambda: speedups(TRAIN, shape="nanogpt-cpu"),
        ),
        "the same, `torch.compile`": ({TRAIN_COMPILED}, lambda: speedups(TRAIN_COMPILED, shape="nanogpt-cpu")),
        "training step, L6 D384, 8 x 256 tokens": ({TRAIN}, lambda: speedups(TRAIN, shape="nanogpt-gpu")),
        "the same, `torch.compile` (L6 D384)": (
            {TRAIN_COMPILED},
            lambda: speedups(TRAIN_COMPILED, shape="nanogpt-gpu"),
        ),
    },
    {
        "training step (forward, backward, AdamW), L4 D128, 12 x 64 tokens": (
            {XEON_TRAIN},
            lambda: speedups(XEON_TRAIN, shape="nanogpt-cpu"),
        ),
        "training step, L6 D384, 8 x 256 tokens": ({XEON_TRAIN}, lambda: speedups(XEON_TRAIN, shape="nanogpt-gpu")),
        "`generate()` greedy, prompt 128 + 128 new tokens, L6 D384, dynamic cache, batch 1": (
            {DYNAMIC_B1},
            lambda: speedups(DYNAMIC_B1, batch=1),
        ),
        "the same, batch 8": ({DYNAMIC_B8}, lambda: speedups(DYNAMIC_B8, batch=8)),
        "the same, static cache + compiled decoding step, batch 1": (
            {STATIC},
            lambda: speedups(STATIC, versus_minimal=False, batch=1),
        ),
    },
    {
        "generated token, dynamic cache": ({HOST_COST}, lambda: host_cost("dynamic")),
        "generated token, static cache": ({HOST_COST}, lambda: host_cost("static")),
        "training forward": ({HOST_COST}, lambda: host_cost("forward")),
    },
    {
        "training step, batch 16 x 1024, eager": ({GPU}, lambda: gpu_row("train", 16, "gpt2-small")),
        "the same, `torch.compile`": ({GPU}, lambda: gpu_row("train-compiled", 16, "gpt2-small")),
        "training step, L6 D384, batch 64 x 256, eager": ({GPU}, lambda: gpu_row("train", 64, "nanogpt-gpu")),
        "the same, `torch.compile` (L6 D384)": ({GPU}, lambda: gpu_row("train-compiled", 64, "nanogpt-gpu")),
        "`generate()` greedy 128 + 128, dynamic cache, batch 1": ({GPU}, lambda: gpu_row("decode", 1, own_loop=True)),
        "the same, batch 64": ({GPU}, lambda: gpu_row("decode", 64, own_loop=True)),
        "static cache + compiled decoding step (CUDA graphs), batch 1": ({GPU}, lambda: gpu_row("decode-static", 1)),
        "the same, batch 64 (static)": ({GPU}, lambda: gpu_row("decode-static", 64)),
        "continuous batching, 64 requests": ({CONTINUOUS}, lambda: gpu_row("continuous-batching", 64)),
    },
]


def keyed_rows(rows: list[list[str]]) -> dict[str, list[str]]:
    """The rows by first cell; a label repeated in a table ("the same, ...") is told apart by the wiring's suffix."""
    keyed = {}
    for row in rows:
        label = row[0]
        while label in keyed:
            label = {
                "the same, `torch.compile`": "the same, `torch.compile` (L6 D384)",
                "the same, batch 64": "the same, batch 64 (static)",
            }[label]
        keyed[label] = row[1:]
    return keyed


def problems(section: str) -> list[str]:
    """Every way `section`'s tables differ from their wiring and their JSON (empty when all agree)."""
    tables = tables_with_citations(section)
    if len(tables) != len(ROWS):
        return [f"{len(tables)} tables, {len(ROWS)} wired: a table was added or removed, wire it in ROWS"]
    found = []
    for (rows, cited), wiring in zip(tables, ROWS, strict=True):
        printed, name = keyed_rows(rows), rows[0][0]
        if set(printed) != set(wiring):
            found.append(f"table of {name!r}: rows {sorted(set(printed) ^ set(wiring))} are not wired in ROWS")
            continue
        needed = set().union(*(files for files, _ in wiring.values()))
        if needed != cited:
            found.append(f"table of {name!r} cites {sorted(cited)}, its rows read {sorted(needed)}")
        for label, (_, measured) in wiring.items():
            if tuple(printed[label]) != measured():
                found.append(f"{label!r}: README {printed[label]}, JSON {list(measured())}")
    return found


def test_every_row_of_the_speed_section_is_the_json_it_cites():
    assert problems(speed_section()) == []


def test_a_stale_figure_or_a_missing_citation_is_caught():
    section = speed_section()
    first_row = next(line for line in section.splitlines() if line.startswith("| training step (forward"))
    stale = section.replace(first_row, first_row.replace("| 1.", "| 9.", 1))
    assert any("README" in problem for problem in problems(stale))
    uncited = section.replace("(benchmarks/results/2026-11-27/host_cost_top_level.json)", "(elsewhere)")
    assert any("cites []" in problem for problem in problems(uncited))
