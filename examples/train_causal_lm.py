"""Train a Turner causal language model on any text: a file, a `datasets` dataset, or the built-in corpus.

The tokenizer is character-level or a byte-level BPE trained here on the same text (`--tokenizer bpe`); or continue
training a saved Turner model with its own tokenizer (`--model-name-or-path`). Reports held-out loss and
perplexity, prints a sample from `pipeline("text-generation")`, and saves model, code, tokenizer and card.

    python examples/train_causal_lm.py --train-file my_book.txt --tokenizer bpe --vocab-size 2000
    python examples/train_causal_lm.py --dataset-name ./my_data_folder --text-column body
    python examples/train_causal_lm.py args.json   # the flags from a JSON or YAML file, as transformers' run_clm.py
    accelerate launch --cpu --num_processes 2 examples/train_causal_lm.py --max-steps 100   # DDP on 2 processes

Every `TrainingArguments` field is a flag (`--help` lists them all), named as in transformers' run_clm.py.
"""

import argparse
import math
import sys

from helpers import flags


def build_parser() -> argparse.ArgumentParser:
    parser = flags.training_parser(
        __doc__, output_dir="./turner-causal-lm", max_steps=300, learning_rate=2e-3, per_device_train_batch_size=16
    )
    flags.add_fsdp_size(parser)
    flags.add_text_data_arguments(parser, default="docstrings of Python's standard library")
    group = parser.add_argument_group("tokenizer")
    group.add_argument("--tokenizer", choices=("char", "bpe"), default="char", help="trained here on the text")
    group.add_argument(
        *flags.options("vocab_size"), type=flags.positive_int, default=1000, help="tokens of the BPE tokenizer"
    )
    flags.add_model_arguments(parser, hidden_size=128, num_hidden_layers=4, num_attention_heads=4)
    parser.add_argument(
        *flags.options("model_name_or_path"), help="continue training this saved Turner model (and its tokenizer)"
    )
    parser.add_argument(
        *flags.options("padding_free"),
        action="store_true",
        help="train on paragraphs, not fixed blocks, packed in one row per batch (DataCollatorWithFlattening), "
        "without padding",
    )
    flags.add_sample_arguments(parser, prompt="Return the")
    return parser


def main(argv: list[str] | None = None) -> None:
    flags.run_script(build_parser(), train, argv)


def train(args: argparse.Namespace) -> None:
    # torch and transformers load once the flags are checked, so --help and a bad flag answer at once
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        Trainer,
        TrainingArguments,
        default_data_collator,
        set_seed,
    )

    from helpers import callbacks, data, distributed, model_card, padding_free
    from turner_tfm import TurnerConfig, TurnerForCausalLM

    set_seed(args.seed)
    text, dataset_name, dataset_id = data.load_text_corpus(args)
    train_text, eval_text = data.split_text(text, args.validation_split_percentage)
    if args.model_name_or_path:
        tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)
        model = AutoModelForCausalLM.from_pretrained(args.model_name_or_path)
    else:
        if args.tokenizer == "bpe":
            lines = train_text.splitlines(keepends=True)
            tokenizer = data.bpe_tokenizer(lines, args.vocab_size, model_max_length=args.block_size)
        else:
            tokenizer = data.char_tokenizer([train_text], model_max_length=args.block_size)
        with flags.usage_error("the model flags make no valid model"):
            config = TurnerConfig(
                vocab_size=len(tokenizer),
                max_position_embeddings=args.block_size,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
                **flags.model_arguments(args),
            )
        model = TurnerForCausalLM(config)
    if args.block_size > model.config.max_position_embeddings and model.config.position_embedding_type == "learned":
        raise flags.UsageError(
            f"argument --block-size: {args.block_size} is not valid: the model has "
            f"{model.config.max_position_embeddings} positions"
        )
    flags.check_sample_length(args, tokenizer, model.config)
    distributed.announce(
        f"text: {dataset_name}, {len(text):,} characters; tokenizer: {len(tokenizer)} tokens; "
        f"model: {model_card.count_parameters(model):,} parameters"
    )

    # blocks of --block-size tokens; with --padding-free, whole paragraphs packed end to end in one row per batch
    if args.padding_free:
        sequences, collator = padding_free.paragraph_sequences, padding_free.collator(True, tokenizer)
    else:
        sequences, collator = data.token_blocks, default_data_collator
    model = distributed.shard(model, args.fsdp_size, args.ddp_timeout)  # --fsdp-size N: 1/N of each weight a process
    distributed.start_process_group(args.ddp_timeout)  # before TrainingArguments: gloo with --ddp-timeout
    with flags.usage_error("the training flags do not go together"):
        training_args = TrainingArguments(**flags.training_arguments(args))
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=sequences(tokenizer, train_text, args.block_size, "training"),
        eval_dataset=sequences(tokenizer, eval_text, args.block_size, "held-out"),
        data_collator=collator,
        processing_class=tokenizer,
        callbacks=callbacks.checkpoint_callbacks(),
    )
    if training_args.resume_from_checkpoint is not None:
        distributed.announce(f"resuming from {training_args.resume_from_checkpoint}")
    with distributed.ProcessWatch.start():  # a failed collective names the processes that are gone
        train_result = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)

    model_card.print_loss_curve(trainer)
    eval_loss = trainer.evaluate()["eval_loss"]
    results = {"eval_loss": eval_loss, "perplexity": math.exp(eval_loss)}
    set_seed(args.seed)  # every process samples: a sharded model's forward pass needs them all
    generator = distributed.pipeline_of("text-generation", trainer.model, tokenizer=tokenizer)
    sample = generator(args.prompt, max_new_tokens=args.max_new_tokens, do_sample=True, top_k=10)[0]["generated_text"]
    if trainer.is_world_process_zero():
        print(f"held-out loss {eval_loss:.3f} nats/token, perplexity {results['perplexity']:.2f}")
        print(f"\nsample from pipeline('text-generation'):\n{sample}\n")

    model_card.save_with_card(
        trainer,
        task="text-generation",
        results=results,
        train_runtime=train_result.metrics["train_runtime"],
        example_input=args.prompt,
        dataset_name=dataset_name,
        dataset_id=dataset_id,
        base_model=args.model_name_or_path,
    )


if __name__ == "__main__":
    sys.exit(main())
