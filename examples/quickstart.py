"""Train a small character-level language model from scratch, in about three minutes on a laptop CPU.

The corpus is the docstrings of Python's own standard library (about 0.5 MB of English and examples, nothing to
download). The script trains a `TurnerForCausalLM` with the `Trainer`, shows the loss falling, measures perplexity
on held-out text, prints a sample from `pipeline("text-generation")`, and saves the model, its code, the tokenizer
and a model card to --output-dir.

    python examples/quickstart.py
    python examples/quickstart.py --max-steps 1000 --hidden-size 256   # longer, bigger
    python examples/quickstart.py args.yaml   # the flags from a JSON or YAML file, as transformers' run_clm.py

Every `TrainingArguments` field is a flag (`--help` lists them). For your own text, a BPE tokenizer or several
processes, see train_causal_lm.py.
"""

import argparse
import math
import sys

from helpers import flags


def build_parser() -> argparse.ArgumentParser:
    # 1000 steps of 8 x 128 characters: the CPU time of 600 steps of 16 x 128, with more, smaller updates. Rotary
    # positions: 1.78 against 1.88 nats for learned ones on Shakespeare (docs/benchmarks.md, docs/experiments.md).
    parser = flags.training_parser(
        __doc__, output_dir="./turner-quickstart", max_steps=1000, learning_rate=3e-3, per_device_train_batch_size=8
    )
    sizes = {"hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4}
    flags.add_model_arguments(parser, **sizes, position_embedding_type="rotary")
    parser.add_argument(
        *flags.options("block_size"), type=flags.positive_int, default=128, help="characters per training sequence"
    )
    flags.add_sample_arguments(parser, prompt="Return the")
    return parser


def main(argv: list[str] | None = None) -> None:
    flags.run_script(build_parser(), train, argv)


def train(args: argparse.Namespace) -> None:
    # torch and transformers load once the flags are checked, so --help and a bad flag answer at once
    from transformers import Trainer, TrainingArguments, default_data_collator, pipeline, set_seed

    from helpers import callbacks, data, distributed, model_card
    from turner_tfm import TurnerConfig, TurnerForCausalLM

    set_seed(args.seed)
    text = data.stdlib_docstrings()
    train_text, eval_text = data.split_text(text, validation_percentage=5)
    tokenizer = data.char_tokenizer([train_text], model_max_length=args.block_size)
    distributed.announce(f"corpus: {data.STDLIB_DOCS_NAME}, {len(text):,} characters, {len(tokenizer)} distinct tokens")

    with flags.usage_error("the model flags make no valid model"):
        config = TurnerConfig(
            vocab_size=len(tokenizer),
            max_position_embeddings=args.block_size,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            **flags.model_arguments(args),
        )
    flags.check_sample_length(args, tokenizer, config)
    model = TurnerForCausalLM(config)
    distributed.announce(f"model: TurnerForCausalLM, {model_card.count_parameters(model):,} parameters")

    distributed.start_process_group(args.ddp_timeout)  # before TrainingArguments: gloo with --ddp-timeout
    with flags.usage_error("the training flags do not go together"):
        training_args = TrainingArguments(**flags.training_arguments(args))
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=data.token_blocks(tokenizer, train_text, args.block_size, "training"),
        eval_dataset=data.token_blocks(tokenizer, eval_text, args.block_size, "held-out"),
        data_collator=default_data_collator,
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
    set_seed(args.seed)
    generator = pipeline("text-generation", model=trainer.model, tokenizer=tokenizer)
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
        dataset_name=data.STDLIB_DOCS_NAME,
        dataset_id=data.STDLIB_DOCS_ID,
    )


if __name__ == "__main__":
    sys.exit(main())
