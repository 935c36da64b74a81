"""examples/sentence_embeddings.py end to end: a Turner trained from scratch as a sentence-embedding model, saved as a
sentence-transformers folder that loads back with `trust_remote_code=True`."""

import json
import random
from pathlib import Path

import torch
from sentence_transformers import SentenceTransformer

from .workflow_utils import TINY_MODEL, run_example, training_losses

KEYWORDS = [
    "apple",
    "river",
    "stone",
    "cloud",
    "tiger",
    "piano",
    "rocket",
    "garden",
    "silver",
    "candle",
    "harbor",
    "meadow",
    "violin",
    "desert",
    "comet",
]
FILLER = ["the", "a", "of", "and", "with", "on", "in", "under", "over", "near"]


def write_paragraphs(path: Path, count: int) -> None:
    """Paragraphs whose two halves share their two keywords, so a paragraph's halves can find each other."""
    rng = random.Random(0)
    paragraphs = []
    for _ in range(count):
        keys = rng.sample(KEYWORDS, 2)
        halves = [" ".join(rng.sample([*keys, *rng.sample(FILLER, 4)], 6)) for _ in range(2)]
        paragraphs.append(" ".join(halves))
    path.write_text("\n\n".join(paragraphs))


def test_sentence_embeddings_trains_from_scratch_and_saves_a_sentence_transformer(tmp_path: Path) -> None:
    write_paragraphs(tmp_path / "notes.txt", 200)
    output = run_example(
        "sentence_embeddings.py",
        *("--train-file", "notes.txt", "--output-dir", "emb", "--max-steps", "20", "--logging-steps", "5"),
        *("--vocab-size", "200", "--block-size", "32", "--per-device-train-batch-size", "16"),
        *("--validation-split-percentage", "10", "--query", "apple river", *TINY_MODEL),
        tmp_path=tmp_path,
    )
    losses = training_losses(output)
    assert losses[-1] < losses[0]
    assert "200 paragraph pairs (20 held out)" in output
    assert "held-out retrieval accuracy (top-1 of 20): " in output
    assert "load it anywhere: SentenceTransformer('emb', trust_remote_code=True)" in output
    assert "closest held-out paragraph to 'apple river'" in output

    folder = tmp_path / "emb"
    modules = json.loads((folder / "modules.json").read_text())
    assert [module["path"] for module in modules] == ["", "1_Pooling", "2_Normalize"]
    config = json.loads((folder / "config.json").read_text())
    assert config["auto_map"]["AutoModel"] == "modeling_turner.TurnerModel" and config["is_causal"] is False
    model = SentenceTransformer(str(folder), trust_remote_code=True, device="cpu")
    assert type(model[0].auto_model).__name__ == "TurnerModel"
    embeddings = model.encode(["apple river stone", "the piano"], convert_to_tensor=True)
    torch.testing.assert_close(embeddings.norm(dim=-1), torch.ones(2))
