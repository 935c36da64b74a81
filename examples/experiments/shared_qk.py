"""Is it worth having separate query and key projections (U_q != U_k), or does U_q = U_k do as well?

Footnote 9 of the paper: the symmetric score x_n^T U^T U x_n' cannot say that 'caulking iron' points to 'tool' more
than the reverse, and U_q != U_k lifts that restriction, "However, I do not know of experimental evidence to support
using U_q != U_k." This script trains both (`share_query_key=False` / `True`) on a character language model
(causal, stdlib docstrings) and on digit images (bidirectional), several seeds each, and compares held-out loss and
accuracy. Sharing saves the D x D key projection of every block.

    python -m examples.experiments.shared_qk              # about 3 minutes on one CPU thread
    python -m examples.experiments.shared_qk --full       # 5 seeds, longer training
"""

import argparse
import sys

from examples.experiments import _shared

NAME = "shared_qk"
VARIANTS = {"U_q != U_k (separate)": {"share_query_key": False}, "U_q = U_k (shared)": {"share_query_key": True}}


def build_parser() -> argparse.ArgumentParser:
    return _shared.experiment_parser(__doc__, NAME, block_size=32)


def main(argv: list[str] | None = None) -> None:
    args = _shared.parse(build_parser(), argv)
    with _shared.torch_threads(args.threads):
        _shared.compare_on_tasks(args, NAME, "Footnote 9: U_q = U_k vs separate projections", VARIANTS)


if __name__ == "__main__":
    sys.exit(main())
