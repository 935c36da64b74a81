"""README's Speed section against the JSON it cites: one table per machine, and every figure in it, as printed, is its
measurement's (a median over the run's paired repetitions, rounded as the README rounds it), so a figure cannot go
stale unseen. Each table is wired below (`TABLES`): its rows in order, each with the JSON results it reads. The text
after a table cites exactly the JSON files its rows read; the line before it names the machine those files were
measured on (the CPU model and its cores, or the GPU) and the torch and transformers they ran; no two tables are of one
machine, and no figure comes from a result its benchmark marked noisy (the load above the core count)."""

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = "benchmarks/results/"


def speed_section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("\n## Speed\n")
    return text[start : text.index("\n## ", start + 1)]


@dataclass
class Table:
    heading: str  # the paragraph just above the table
    rows: list[list[str]]  # its body rows, cells stripped
    cited: set[str]  # the JSON files cited between it and the next table


def tables(section: str) -> list[Table]:
    lines = section.splitlines()
    spans, index = [], 0  # each table's first line and the line after its last
    while index < len(lines):
        if lines[index].startswith("|"):
            end = next((n for n in range(index, len(lines)) if not lines[n].startswith("|")), len(lines))
            spans.append((index, end))
            index = end
        index += 1
    found = []
    for number, (start, end) in enumerate(spans):
        above = lines[:start]
        while above and not above[-1].strip():
            above.pop()
        paragraph_start = max((n + 1 for n, line in enumerate(above) if not line.strip()), default=0)
        rows = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line in lines[start + 2 : end]]
        after = "\n".join(lines[end : spans[number + 1][0] if number + 1 < len(spans) else len(lines)])
        cited = set(re.findall(r"\((benchmarks/results/[\w./-]+\.json)\)", after))
        found.append(Table(" ".join(above[paragraph_start:]), rows, cited))
    return found


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


EPYC = RESULTS + "2026-11-27/"
TRAIN, TRAIN_COMPILED = EPYC + "train_cpu_no_cache.json", EPYC + "train_cpu_compiled_no_cache.json"
XEON = RESULTS + "2026-11-28/xeon_"
XEON_TRAIN = XEON + "train.json"
DYNAMIC_B1, DYNAMIC_B8, STATIC = (
    XEON + "generate_dynamic_b1.json",
    XEON + "generate_dynamic_b8.json",
    XEON + "generate_static_b1.json",
)
GPU, CONTINUOUS = RESULTS + "gpu/gpu_column_h200.json", RESULTS + "gpu/continuous_batching_h200.json"


@dataclass
class Row:
    label: str  # its first cell
    reads: list[tuple]  # the results it is made of: (JSON path, section or None, the fields that pick the result)
    cells: Callable[[], tuple[str, ...]]  # the cells after the first, from them


def cpu_row(label: str, path: str, versus_minimal: bool = True, **match) -> Row:
    return Row(label, [(path, None, match)], lambda: speedups(path, versus_minimal, **match))


def gpu(label: str, section: str, batch: int, shape: str | None = None, own_loop: bool = False) -> Row:
    path = CONTINUOUS if section == "continuous-batching" else GPU
    match = {"batch": batch, **({"shape": shape} if shape else {})}
    return Row(label, [(path, section, match)], lambda: gpu_row(section, batch, shape, own_loop))


# README's tables in order, each its rows in order
TABLES = [
    [
        cpu_row("training step (forward, backward, AdamW), L4 D128, 12 x 64 tokens", TRAIN, shape="nanogpt-cpu"),
        cpu_row("the same, `torch.compile`", TRAIN_COMPILED, shape="nanogpt-cpu"),
        cpu_row("training step, L6 D384, 8 x 256 tokens", TRAIN, shape="nanogpt-gpu"),
        cpu_row("the same, `torch.compile`", TRAIN_COMPILED, shape="nanogpt-gpu"),
    ],
    [
        cpu_row("training step (forward, backward, AdamW), L4 D128, 12 x 64 tokens", XEON_TRAIN, shape="nanogpt-cpu"),
        cpu_row("training step, L6 D384, 8 x 256 tokens", XEON_TRAIN, shape="nanogpt-gpu"),
        cpu_row(
            "`generate()` greedy, prompt 128 + 128 new tokens, L6 D384, dynamic cache, batch 1", DYNAMIC_B1, batch=1
        ),
        cpu_row("the same, batch 8", DYNAMIC_B8, batch=8),
        cpu_row("the same, static cache + compiled decoding step, batch 1", STATIC, versus_minimal=False, batch=1),
    ],
    [
        gpu("training step, batch 16 x 1024, eager", "train", 16, "gpt2-small"),
        gpu("the same, `torch.compile`", "train-compiled", 16, "gpt2-small"),
        gpu("training step, L6 D384, batch 64 x 256, eager", "train", 64, "nanogpt-gpu"),
        gpu("the same, `torch.compile`", "train-compiled", 64, "nanogpt-gpu"),
        gpu("`generate()` greedy 128 + 128, dynamic cache, batch 1", "decode", 1, own_loop=True),
        gpu("the same, batch 64", "decode", 64, own_loop=True),
        gpu("static cache + compiled decoding step (CUDA graphs), batch 1", "decode-static", 1),
        gpu("the same, batch 64", "decode-static", 64),
        gpu("continuous batching, 64 requests", "continuous-batching", 64),
    ],
]


def machine(path: str) -> tuple[str, ...]:
    """How README names the machine of a JSON file: the GPU by its name, or the CPU model with its cores."""
    environment = load(path)["environment"]
    device = environment.get("device", {})
    if device.get("type") == "cuda":
        return (device["name"],)
    cpu = re.sub(r"\s+", " ", re.sub(r"\((R|TM)\)", "", environment["cpu"])).strip()
    return cpu, f"{environment['logical_cpus']} cores"


def versions(path: str) -> tuple[str, str]:
    environment = load(path)["environment"]
    return f"torch {environment['torch'].split('+')[0]}", f"transformers {environment['transformers']}"


def problems(section: str) -> list[str]:
    """Every way `section`'s tables differ from their wiring and their JSON (empty when all agree)."""
    found_tables = tables(section)
    if len(found_tables) != len(TABLES):
        return [f"{len(found_tables)} tables, {len(TABLES)} wired: a table was added or removed, wire it in TABLES"]
    found, machines = [], []
    for table, wiring in zip(found_tables, TABLES, strict=True):
        name = table.rows[0][0]
        labels = [row[0] for row in table.rows]
        if labels != [row.label for row in wiring]:
            found.append(f"table of {name!r}: rows {labels}, wired {[row.label for row in wiring]}")
            continue
        needed = {path for row in wiring for path, _, _ in row.reads}
        if needed != table.cited:
            found.append(f"table of {name!r} cites {sorted(table.cited)}, its rows read {sorted(needed)}")
        names = {machine(path) for path in needed}
        if len(names) != 1:
            found.append(f"table of {name!r} mixes machines: {sorted(names)}")
        for said in sorted(set().union(*names) | {v for path in needed for v in versions(path)}):
            if said not in table.heading:
                found.append(f"table of {name!r}: the line above it does not say {said!r}: {table.heading!r}")
        machines.extend(names)
        for printed, row in zip(table.rows, wiring, strict=True):
            if tuple(printed[1:]) != row.cells():
                found.append(f"{row.label!r}: README {printed[1:]}, JSON {list(row.cells())}")
            for path, part, match in row.reads:
                if record(path, part, **match).get("noisy"):
                    found.append(f"{row.label!r}: {path} marks that result noisy")
    if len(machines) != len(set(machines)):
        found.append(f"two tables of one machine: {machines}")
    return found


def test_every_row_of_the_speed_section_is_the_json_it_cites():
    assert problems(speed_section()) == []


def test_a_stale_figure_a_missing_citation_or_a_wrong_machine_is_caught():
    section = speed_section()
    first_row = next(line for line in section.splitlines() if line.startswith("| training step (forward"))
    stale = section.replace(first_row, first_row.replace("| 1.", "| 9.", 1))
    assert any("README" in problem for problem in problems(stale))
    cited = "(benchmarks/results/2026-11-28/xeon_train.json)"
    assert cited in section
    assert any("cites" in problem for problem in problems(section.replace(cited, "(elsewhere)")))
    assert any("does not say 'AMD EPYC'" in problem for problem in problems(section.replace("AMD EPYC", "Intel Xeon")))
    assert any("torch 2.15.0" in problem for problem in problems(section.replace("torch 2.15.0", "torch 2.14.1")))
