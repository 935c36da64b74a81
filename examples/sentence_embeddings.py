"""Train a Turner from scratch as a sentence-embedding model, and use it through sentence-transformers.

The model is a bidirectional Turner encoder (`is_causal=False`, §1.2's "global classification ... by pooling") with
sentence-transformers' mean Pooling and Normalize on top. It learns from the text alone: each paragraph is cut in
two, and the two halves must embed closer to each other than to the other paragraphs' halves in the batch (in-batch
negatives, MultipleNegativesRankingLoss). Reports top-1 retrieval accuracy on held-out paragraphs before and after
training, saves a folder that `SentenceTransformer(folder, trust_remote_code=True)` loads anywhere, and searches it.

    python -m examples.sentence_embeddings --train_file my_notes.txt --max_steps 300
    python -m examples.sentence_embeddings --dataset_name ./my_data_folder --text_column body

Every field of `TrainingArguments`, of the dataclasses below and of `TurnerConfig` is a flag (`--help`); this script
measures retrieval itself, so the Trainer's own evaluation flags do nothing here. Run from the repository root.
"""

import tempfile
from dataclasses import dataclass, field

import torch
from datasets import Dataset
from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments
from sentence_transformers.base.training_args import BatchSamplers
from sentence_transformers.sentence_transformer import losses, modules

from examples.helpers import data, distributed, model_card, training
from turner_tfm import TurnerModel


@dataclass
class ScriptModelArguments:
    vocab_size: int = field(default=2000, metadata={"help": "tokens of the BPE tokenizer"})


ModelArguments = training.config_arguments(  # sentence-transformers pools the backbone's output: no head
    ScriptModelArguments, exclude=("tie_word_embeddings", *training.CLASSIFIER_FIELDS),
    hidden_size=128, num_hidden_layers=4, num_attention_heads=4, hidden_dropout=0.1,
)  # fmt: skip


@dataclass
class DataTrainingArguments(training.TextDataArguments):
    min_words: int = field(default=8, metadata={"help": "shortest paragraph that makes a pair"})
    query: str = field(default="Return the absolute value", metadata={"help": "searched among held-out paragraphs"})


def halves(text: str, min_words: int) -> tuple[list[str], list[str]]:
    """Each paragraph (text between blank lines) of at least `min_words` words, cut into its two halves."""
    firsts, seconds = [], []
    for paragraph in text.split("\n\n"):
        words = paragraph.split()
        if len(words) >= min_words:
            firsts.append(" ".join(words[: len(words) // 2]))
            seconds.append(" ".join(words[len(words) // 2 :]))
    return firsts, seconds


def retrieval_accuracy(model: SentenceTransformer, anchors: list[str], positives: list[str]) -> float:
    """How often an anchor's own other half is the most similar of all held-out halves (top-1)."""
    scores = model.similarity(model.encode(anchors), model.encode(positives))
    return (scores.argmax(dim=1) == torch.arange(len(anchors))).float().mean().item()


def main() -> None:
    model_args, data_args, training_args = training.parse_arguments(
        (ModelArguments, DataTrainingArguments, SentenceTransformerTrainingArguments),
        output_dir="turner-sentence-embeddings", max_steps=200, learning_rate=1e-3, warmup_steps=0.1,
        batch_sampler=BatchSamplers.NO_DUPLICATES,
    )  # fmt: skip
    text, dataset_name, _ = data.load_text(**data_args.text_source())
    firsts, seconds = halves(text, data_args.min_words)
    held_out = max(2, int(len(firsts) * data_args.validation_split_percentage / 100))
    if len(firsts) - held_out < 2:
        raise ValueError(
            f"the text has {len(firsts)} paragraphs of at least min_words={data_args.min_words} words (separated by "
            "blank lines); it needs a few more than the held-out share to train"
        )
    train = Dataset.from_dict({"anchor": firsts[:-held_out], "positive": seconds[:-held_out]})
    block_size = data_args.block_size
    tokenizer = data.bpe_tokenizer(firsts + seconds, model_args.vocab_size, model_max_length=block_size)
    # every token sees the whole sentence before pooling
    config = training.text_config(tokenizer, block_size, model_args, is_causal=False)
    with tempfile.TemporaryDirectory() as backbone:  # sentence-transformers' Transformer module loads a folder
        TurnerModel(config).save_pretrained(backbone)
        tokenizer.save_pretrained(backbone)
        transformer = modules.Transformer(backbone, max_seq_length=block_size)
    pooling = modules.Pooling(transformer.get_embedding_dimension(), "mean")
    model = SentenceTransformer(modules=[transformer, pooling, modules.Normalize()])
    distributed.announce(
        f"text: {dataset_name}, {len(firsts):,} paragraph pairs ({held_out} held out); tokenizer: {len(tokenizer)} "
        f"tokens; model: {model_card.count_parameters(model):,} parameters"
    )

    anchors, positives = firsts[-held_out:], seconds[-held_out:]
    before = retrieval_accuracy(model, anchors, positives)
    trainer = SentenceTransformerTrainer(
        model=model, args=training_args, train_dataset=train, loss=losses.MultipleNegativesRankingLoss(model)
    )
    training.train(trainer)
    after = retrieval_accuracy(model, anchors, positives)
    print(f"held-out retrieval accuracy (top-1 of {held_out}): {before:.3f} before training -> {after:.3f} after")

    model.save(training_args.output_dir)
    loaded = SentenceTransformer(training_args.output_dir, trust_remote_code=True)
    scores = loaded.similarity(loaded.encode([data_args.query]), loaded.encode(positives))[0]
    best = int(scores.argmax())
    usage = f"SentenceTransformer({training_args.output_dir!r}, trust_remote_code=True)"
    print(f"saved to {training_args.output_dir}; load it anywhere: {usage}")
    print(f"closest held-out paragraph to {data_args.query!r} (cosine {scores[best]:.3f}): {positives[best][:80]!r}")


if __name__ == "__main__":
    training.run(main)
