"""Train a Turner from scratch as a sentence-embedding model, and use it through sentence-transformers.

The model is a bidirectional Turner encoder (`is_causal=False`, §1.2's "global classification ... by pooling") with
sentence-transformers' mean Pooling and Normalize on top. It learns from the text alone: each paragraph is cut in
two, and the two halves must embed closer to each other than to the other paragraphs' halves in the batch (in-batch
negatives, MultipleNegativesRankingLoss). Reports top-1 retrieval accuracy on held-out paragraphs before and after
training, saves a folder that `SentenceTransformer(folder, trust_remote_code=True)` loads anywhere, and searches it.

    python examples/sentence_embeddings.py --train-file my_notes.txt --max-steps 300
    python examples/sentence_embeddings.py --dataset-name ./my_data_folder --text-column body
"""

import argparse
import sys
import tempfile

from _cli import (
    UsageError,
    add_model_arguments,
    add_text_data_arguments,
    add_training_arguments,
    new_parser,
    positive_int,
    run_script,
)


def build_parser() -> argparse.ArgumentParser:
    parser = new_parser(__doc__.split("\n\n")[0])
    add_training_arguments(
        parser, output_dir="./turner-sentence-embeddings", max_steps=200, learning_rate=1e-3, warmup_steps=0.1
    )
    add_text_data_arguments(parser, default="docstrings of Python's standard library")
    group = parser.add_argument_group("tokenizer and pairs")
    group.add_argument("--vocab-size", type=positive_int, default=2000, help="tokens of the BPE tokenizer")
    group.add_argument("--min-words", type=positive_int, default=8, help="shortest paragraph that makes a pair")
    sizes = {"hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4, "hidden_dropout": 0.1}
    add_model_arguments(parser, task="sentence-embedding", **sizes)
    parser.add_argument("--query", default="Return the absolute value", help="searched among held-out paragraphs")
    return parser


def main(argv: list[str] | None = None) -> None:
    run_script(build_parser(), run, argv)


def halves(text: str, min_words: int) -> tuple[list[str], list[str]]:
    """Each paragraph (text between blank lines) of at least `min_words` words, cut into its two halves."""
    firsts, seconds = [], []
    for paragraph in text.split("\n\n"):
        words = paragraph.split()
        if len(words) >= min_words:
            firsts.append(" ".join(words[: len(words) // 2]))
            seconds.append(" ".join(words[len(words) // 2 :]))
    return firsts, seconds


def retrieval_accuracy(model, anchors: list[str], positives: list[str]) -> float:
    """How often an anchor's own other half is the most similar of all held-out halves (top-1)."""
    import torch

    scores = model.similarity(model.encode(anchors), model.encode(positives))
    return (scores.argmax(dim=1) == torch.arange(len(anchors))).float().mean().item()


def run(args: argparse.Namespace) -> None:
    # torch, transformers and sentence-transformers load once the flags are checked
    import _common
    from datasets import Dataset
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
    )
    from sentence_transformers.base.training_args import BatchSamplers
    from sentence_transformers.sentence_transformer import losses, modules
    from transformers import set_seed

    from turner_tfm import TurnerModel

    set_seed(args.seed)
    text, dataset_name, _ = _common.load_text_corpus(args)
    firsts, seconds = halves(text, args.min_words)
    held_out = max(2, int(len(firsts) * args.validation_split_percentage / 100))
    if len(firsts) - held_out < 2:
        raise UsageError(
            f"the text has {len(firsts)} paragraphs of at least --min-words={args.min_words} words (separated by "
            "blank lines); it needs a few more than the held-out share to train"
        )
    train = Dataset.from_dict({"anchor": firsts[:-held_out], "positive": seconds[:-held_out]})
    tokenizer = _common.bpe_tokenizer(firsts + seconds, args.vocab_size, model_max_length=args.block_size)
    config = _common.turner_config(
        args,
        vocab_size=len(tokenizer),
        max_position_embeddings=args.block_size,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        is_causal=False,  # every token sees the whole sentence before pooling
    )
    with tempfile.TemporaryDirectory() as backbone:  # sentence-transformers' Transformer module loads a folder
        TurnerModel(config).save_pretrained(backbone)
        tokenizer.save_pretrained(backbone)
        transformer = modules.Transformer(backbone, max_seq_length=args.block_size)
    pooling = modules.Pooling(transformer.get_embedding_dimension(), "mean")
    model = SentenceTransformer(modules=[transformer, pooling, modules.Normalize()])
    _common.announce(
        f"text: {dataset_name}, {len(firsts):,} paragraph pairs ({held_out} held out); tokenizer: {len(tokenizer)} "
        f"tokens; model: {_common.count_parameters(model):,} parameters"
    )

    anchors, positives = firsts[-held_out:], seconds[-held_out:]
    before = retrieval_accuracy(model, anchors, positives)
    training_args = _common.training_arguments(
        args, SentenceTransformerTrainingArguments, batch_sampler=BatchSamplers.NO_DUPLICATES
    )
    loss = losses.MultipleNegativesRankingLoss(model)
    trainer = SentenceTransformerTrainer(model=model, args=training_args, train_dataset=train, loss=loss)
    _common.train(trainer)
    _common.print_loss_curve(trainer)
    after = retrieval_accuracy(model, anchors, positives)
    print(f"held-out retrieval accuracy (top-1 of {held_out}): {before:.3f} before training -> {after:.3f} after")

    model.save(args.output_dir)
    loaded = SentenceTransformer(args.output_dir, trust_remote_code=True)
    scores = loaded.similarity(loaded.encode([args.query]), loaded.encode(positives))[0]
    best = int(scores.argmax())
    usage = f"SentenceTransformer({args.output_dir!r}, trust_remote_code=True)"
    print(f"saved to {args.output_dir}; load it anywhere: {usage}")
    print(f"closest held-out paragraph to {args.query!r} (cosine {scores[best]:.3f}): {positives[best][:80]!r}")


if __name__ == "__main__":
    sys.exit(main())
