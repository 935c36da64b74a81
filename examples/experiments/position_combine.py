"""Add the position embedding to each token, or concatenate it?

Footnote 19 of the paper: ViT adds the learned position embedding, x_n = W p_n + e_n, although "arguably it would
be more intuitive to append" it; a linear map of the concatenation [W p_n; e_n] is again of the additive form
W' p_n + e'_n, "one hint as to why the additive construction works". This script compares, with learned positions
(`position_embedding_combine`), on a character language model and on digit images, several seeds each:
adding at width D; concatenating P = D/4 position features to D - P token features (same width D); and
concatenating P position features to D token features (width D + P). Attention (H heads of K = D/H) and the MLP
(4D wide) are the same size in all three, so only how positions enter changes. The language model's output head is
untied from its input embedding in all three (concatenation needs it).

    python -m examples.experiments.position_combine              # about 4 minutes on one CPU thread
    python -m examples.experiments.position_combine --full       # 5 seeds, longer training
"""

import argparse
import sys

from examples.experiments import _shared

NAME = "position_combine"


def build_parser() -> argparse.ArgumentParser:
    return _shared.experiment_parser(__doc__, NAME, block_size=32)


def variants(width: int, heads: int) -> dict[str, dict]:
    """The three ways positions enter, at the same attention and MLP sizes."""
    position, wide = width // 4, width + width // 4
    same = {"head_dim": width // heads, "intermediate_size": 4 * width, "position_embedding_type": "learned"}
    concat = {**same, "position_embedding_combine": "concat", "position_embedding_size": position}
    return {
        f"add (D={width})": {**same, "position_embedding_combine": "add"},
        f"concat (D={width}: {width - position} token + {position} position)": concat,
        f"concat (D={wide}: {width} token + {position} position)": {**concat, "hidden_size": wide},
    }


def main(argv: list[str] | None = None) -> None:
    args = _shared.parse(build_parser(), argv)
    with _shared.torch_threads(args.threads):
        _shared.compare_on_tasks(
            args,
            NAME,
            "Footnote 19: adding vs concatenating positions",
            variants(args.hidden_size, args.num_attention_heads),
            task_fields={"CharLM": {"tie_word_embeddings": False}},
            notes=["learned positions; attention H x K = D and MLP 4D fixed across variants; LM head untied"],
        )


if __name__ == "__main__":
    sys.exit(main())
