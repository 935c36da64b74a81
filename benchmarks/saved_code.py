"""The code a saved Turner folder carries (what `trust_remote_code=True` runs), beside the model code of Llama, GPT-2
and BERT in the installed transformers: files and lines, each file listed.

    python -m benchmarks.saved_code [--json OUT]

Turner's count is of a folder `save_pretrained` writes (a tiny causal LM; every head saves the same files); the peers'
are their `modeling_*.py` and `configuration_*.py`.
"""

import argparse
import json
import tempfile
from pathlib import Path

import transformers

from turner_tfm import TurnerConfig, TurnerForCausalLM

PEERS = ("llama", "gpt2", "bert")


def line_counts(files: list[Path]) -> dict[str, int]:
    """Lines of each file, by name."""
    return {path.name: len(path.read_text(encoding="utf-8").splitlines()) for path in sorted(files)}


def saved_turner_code() -> dict[str, int]:
    """Lines of each Python file in a folder `save_pretrained` writes."""
    with tempfile.TemporaryDirectory() as folder:
        TurnerForCausalLM(
            TurnerConfig(vocab_size=16, hidden_size=8, num_attention_heads=2, num_hidden_layers=1)
        ).save_pretrained(folder)
        return line_counts(list(Path(folder).glob("*.py")))


def peer_code(family: str) -> dict[str, int]:
    """Lines of an in-library family's model and config files."""
    folder = Path(transformers.__file__).parent / "models" / family
    return line_counts([folder / f"modeling_{family}.py", folder / f"configuration_{family}.py"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="also write the counts here")
    args = parser.parse_args()
    counts = {"turner (saved folder)": saved_turner_code()} | {family: peer_code(family) for family in PEERS}
    print(f"transformers {transformers.__version__}")
    print(f"{'model':<22} {'files':>5} {'lines':>6}")
    for name, files in counts.items():
        print(
            f"{name:<22} {len(files):>5} {sum(files.values()):>6}   " + ", ".join(f"{f} {n}" for f, n in files.items())
        )
    if args.json:
        args.json.write_text(json.dumps({"transformers": transformers.__version__, "files": counts}, indent=2) + "\n")


if __name__ == "__main__":
    main()
