"""Train a Turner from scratch as a sentence-embedding model, and use it through sentence-transformers.

The model is a bidirectional Turner encoder (`is_causal=False`, §1.2's "global classification ... by pooling") with
sentence-transformers' mean Pooling and Normalize on top. It learns from the text alone: each paragraph is cut in
two, and the two halves must embed closer to each other than to the other paragraphs' halves in the batch (in-batch
negatives, MultipleNegativesRankingLoss). Reports top-1 retrieval accuracy on held-out paragraphs before and after
training, saves a folder that `SentenceTransformer(folder, trust_remote_code=True)` loads anywhere, and searches it.

    python examples/sentence_embeddings.py --train-file my_notes.txt --max-steps 300
    python examples/sentence_embeddings.py --dataset-name ./my_data_folder --text-column body

Every `TrainingArguments` field is a flag (`--help` lists them all), but those of the Trainer's own evaluation and Hub
upload: this script measures retrieval itself and saves a sentence-transformers folder, which the Trainer does not.
"""

import argparse
import sys
import tempfile

from helpers import flags

NO_EVALUATION = "this script measures retrieval itself, before and after training: its Trainer evaluates nothing"
NO_UPLOAD = "the Trainer would upload its own folder, not the sentence-transformers one this script saves"
REFUSED = {
    **dict.fromkeys(("eval_*", "*_eval", "*_eval_batch_size", "load_best_model_at_end"), NO_EVALUATION),
    **dict.fromkeys(("metric_for_best_model", "greater_is_better", "prediction_loss_only"), NO_EVALUATION),
    **dict.fromkeys(("batch_eval_metrics", "include_for_metrics"), NO_EVALUATION),
    **dict.fromkeys(("push_to_hub", "hub_*"), NO_UPLOAD),
}


def build_parser() -> argparse.ArgumentParser:
    parser = flags.training_parser(
        __doc__,
        output_dir="./turner-sentence-embeddings",
        max_steps=200,
        learning_rate=1e-3,
        warmup_steps=0.1,
        refuse=REFUSED,
    )
    flags.add_text_data_arguments(parser, default="docstrings of Python's standard library")
    group = parser.add_argument_group("tokenizer and pairs")
    group.add_argument(
        *flags.options("vocab_size"), type=flags.positive_int, default=2000, help="tokens of the BPE tokenizer"
    )
    group.add_argument(
        *flags.options("min_words"), type=flags.positive_int, default=8, help="shortest paragraph that makes a pair"
    )
    sizes = {"hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4, "hidden_dropout": 0.1}
    flags.add_model_arguments(parser, task="sentence-embedding", **sizes)
    parser.add_argument("--query", default="Return the absolute value", help="searched among held-out paragraphs")
    return parser


def main(argv: list[str] | None = None) -> None:
    flags.run_script(build_parser(), train, argv)


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


def train(args: argparse.Namespace) -> None:
    # torch, transformers and sentence-transformers load once the flags are checked
    from datasets import Dataset
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
    )
    from sentence_transformers.base.training_args import BatchSamplers
    from sentence_transformers.sentence_transformer import losses, modules
    from transformers import set_seed

    from helpers import data, distributed, model_card
    from turner_tfm import TurnerConfig, TurnerModel

    set_seed(args.seed)
    text, dataset_name, _ = data.load_text_corpus(args)
    firsts, seconds = halves(text, args.min_words)
    held_out = max(2, int(len(firsts) * args.validation_split_percentage / 100))
    if len(firsts) - held_out < 2:
        raise flags.UsageError(
            f"the text has {len(firsts)} paragraphs of at least --min-words={args.min_words} words (separated by "
            "blank lines); it needs a few more than the held-out share to train"
        )
    train = Dataset.from_dict({"anchor": firsts[:-held_out], "positive": seconds[:-held_out]})
    tokenizer = data.bpe_tokenizer(firsts + seconds, args.vocab_size, model_max_length=args.block_size)
    with flags.usage_error("the model flags make no valid model"):
        config = TurnerConfig(
            vocab_size=len(tokenizer),
            max_position_embeddings=args.block_size,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            is_causal=False,  # every token sees the whole sentence before pooling
            **flags.model_arguments(args),
        )
    with tempfile.TemporaryDirectory() as backbone:  # sentence-transformers' Transformer module loads a folder
        TurnerModel(config).save_pretrained(backbone)
        tokenizer.save_pretrained(backbone)
        transformer = modules.Transformer(backbone, max_seq_length=args.block_size)
    pooling = modules.Pooling(transformer.get_embedding_dimension(), "mean")
    model = SentenceTransformer(modules=[transformer, pooling, modules.Normalize()])
    distributed.announce(
        f"text: {dataset_name}, {len(firsts):,} paragraph pairs ({held_out} held out); tokenizer: {len(tokenizer)} "
        f"tokens; model: {model_card.count_parameters(model):,} parameters"
    )

    anchors, positives = firsts[-held_out:], seconds[-held_out:]
    before = retrieval_accuracy(model, anchors, positives)
    distributed.start_process_group(args.ddp_timeout)  # before TrainingArguments: gloo with --ddp-timeout
    with flags.usage_error("the training flags do not go together"):
        training_args = SentenceTransformerTrainingArguments(
            **flags.training_arguments(args), batch_sampler=BatchSamplers.NO_DUPLICATES
        )
    trainer = SentenceTransformerTrainer(
        model=model, args=training_args, train_dataset=train, loss=losses.MultipleNegativesRankingLoss(model)
    )
    if training_args.resume_from_checkpoint is not None:
        distributed.announce(f"resuming from {training_args.resume_from_checkpoint}")
    with distributed.ProcessWatch.start():  # a failed collective names the processes that are gone
        trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    model_card.print_loss_curve(trainer)
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
