"""Train a Turner causal language model on any text: a file, a `datasets` dataset, or the built-in corpus.

The tokenizer is character-level or a byte-level BPE trained here on the same text (`--tokenizer bpe`); or continue
training a saved Turner model with its own tokenizer (`--model-name-or-path`). Reports held-out loss and
perplexity, prints a sample from `pipeline("text-generation")`, and saves model, code, tokenizer and card.

    python examples/train_causal_lm.py --train-file my_book.txt --tokenizer bpe --vocab-size 2000
    python examples/train_causal_lm.py --dataset-name ./my_data_folder --text-column body
    accelerate launch --cpu --num_processes 2 examples/train_causal_lm.py --max-steps 100   # DDP on 2 processes
"""

import argparse
import sys

from _cli import (
    UsageError,
    add_model_arguments,
    add_padding_free_argument,
    add_parallel_arguments,
    add_sample_arguments,
    add_text_data_arguments,
    add_training_arguments,
    new_parser,
    positive_int,
    run_script,
)


def build_parser() -> argparse.ArgumentParser:
    parser = new_parser(__doc__.split("\n\n")[0])
    add_training_arguments(
        parser, output_dir="./turner-causal-lm", max_steps=300, learning_rate=2e-3, per_device_train_batch_size=16
    )
    add_parallel_arguments(parser)
    add_text_data_arguments(parser, default="docstrings of Python's standard library")
    group = parser.add_argument_group("tokenizer")
    group.add_argument("--tokenizer", choices=("char", "bpe"), default="char", help="trained here on the text")
    group.add_argument("--vocab-size", type=positive_int, default=1000, help="tokens of the BPE tokenizer")
    add_model_arguments(parser, hidden_size=128, num_hidden_layers=4, num_attention_heads=4)
    parser.add_argument(
        "--model-name-or-path", default=None, help="continue training this saved Turner model (and its tokenizer)"
    )
    add_padding_free_argument(parser, "paragraphs, not fixed blocks,")
    add_sample_arguments(parser, prompt="Return the")
    return parser


def main(argv: list[str] | None = None) -> None:
    run_script(build_parser(), run, argv)


def run(args: argparse.Namespace) -> None:
    # torch and transformers load once the flags are checked, so --help and a bad flag answer at once
    import _common
    from transformers import AutoModelForCausalLM, AutoTokenizer, set_seed

    from turner_tfm import TurnerForCausalLM

    set_seed(args.seed)
    text, dataset_name, dataset_id = _common.load_text_corpus(args)
    train_text, eval_text = _common.split_text(text, args.validation_split_percentage)
    if args.model_name_or_path:
        tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)
        model = AutoModelForCausalLM.from_pretrained(args.model_name_or_path)
    else:
        if args.tokenizer == "bpe":
            lines = train_text.splitlines(keepends=True)
            tokenizer = _common.bpe_tokenizer(lines, args.vocab_size, model_max_length=args.block_size)
        else:
            tokenizer = _common.char_tokenizer([train_text], model_max_length=args.block_size)
        config = _common.turner_config(
            args,
            vocab_size=len(tokenizer),
            max_position_embeddings=args.block_size,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
        model = TurnerForCausalLM(config)
    if args.block_size > model.config.max_position_embeddings and model.config.position_embedding_type == "learned":
        raise UsageError(
            f"argument --block-size: {args.block_size} is not valid: the model has "
            f"{model.config.max_position_embeddings} positions"
        )
    _common.check_sample_length(args, tokenizer, model.config)
    _common.announce(
        f"text: {dataset_name}, {len(text):,} characters; tokenizer: {len(tokenizer)} tokens; "
        f"model: {_common.count_parameters(model):,} parameters"
    )

    trainer = _common.causal_lm_trainer(args, model, tokenizer, train_text, eval_text)
    train_runtime = _common.train(trainer)
    _common.finish_causal_lm(
        trainer,
        args,
        train_runtime,
        dataset_name=dataset_name,
        dataset_id=dataset_id,
        base_model=args.model_name_or_path,
    )


if __name__ == "__main__":
    sys.exit(main())
