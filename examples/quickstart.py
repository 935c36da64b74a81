"""Train a small character-level language model from scratch on Python's standard-library docstrings (0.5 MB,
nothing to download), in minutes on a laptop CPU: `python -m examples.quickstart`. Every TrainingArguments and
TurnerConfig field is a flag (`--max_steps 2000`, `--help`); for your own text or a BPE tokenizer: train_causal_lm.py"""

import math
from dataclasses import dataclass

from transformers import HfArgumentParser, Trainer, TrainingArguments, default_data_collator, pipeline, set_seed

from examples.helpers import data, model_card
from examples.helpers.training import CLASSIFIER_FIELDS, config_arguments
from turner_tfm import TurnerConfig, TurnerForCausalLM


@dataclass
class ScriptArguments:
    block_size: int = 128  # characters per training sequence
    prompt: str = "Return the"
    max_new_tokens: int = 100


# plus every TurnerConfig field; rotary positions: 1.78 against 1.88 nats for learned ones (docs/benchmarks.md)
ModelArguments = config_arguments(ScriptArguments, exclude=CLASSIFIER_FIELDS, hidden_size=128, num_hidden_layers=4,
                                  num_attention_heads=4, position_embedding_type="rotary")  # fmt: skip


def main() -> None:
    parser = HfArgumentParser((ModelArguments, TrainingArguments))
    parser.set_defaults(output_dir="turner-quickstart", max_steps=1000, learning_rate=3e-3, logging_first_step=True,
                        per_device_train_batch_size=8, warmup_steps=0.05, lr_scheduler_type="cosine",
                        logging_steps=25, save_strategy="no", dataloader_pin_memory=False)  # fmt: skip
    try:
        args, training_args = parser.parse_args_into_dataclasses()
    except ValueError as error:  # a value TurnerConfig or TrainingArguments refused: one line, as argparse says it
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    set_seed(training_args.seed)

    text, dataset_name, dataset_id = data.load_text()  # the built-in corpus
    train_text, eval_text = data.split_text(text, validation_percentage=5)
    tokenizer = data.char_tokenizer([train_text], model_max_length=args.block_size)  # one token per character
    print(f"corpus: {dataset_name}, {len(text):,} characters, {len(tokenizer)} distinct tokens")
    config = TurnerConfig(vocab_size=len(tokenizer), max_position_embeddings=args.block_size,
                          pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                          **args.config_kwargs())  # fmt: skip
    model = TurnerForCausalLM(config)
    print(f"model: TurnerForCausalLM, {model.num_parameters():,} parameters")

    train_set = data.token_blocks(tokenizer, train_text, args.block_size, "training")
    eval_set = data.token_blocks(tokenizer, eval_text, args.block_size, "held-out")
    trainer = Trainer(model=model, args=training_args, train_dataset=train_set, eval_dataset=eval_set,
                      data_collator=default_data_collator, processing_class=tokenizer)  # fmt: skip
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    model_card.print_loss_curve(trainer)
    eval_loss = trainer.evaluate()["eval_loss"]
    print(f"held-out loss {eval_loss:.3f} nats/token, perplexity {math.exp(eval_loss):.2f}")

    set_seed(training_args.seed)
    generator = pipeline("text-generation", model=model, tokenizer=tokenizer)
    sample = generator(args.prompt, max_new_tokens=args.max_new_tokens, do_sample=True, top_k=10)[0]["generated_text"]
    print(f"\nsample from pipeline('text-generation'):\n{sample}\n")

    results = {"eval_loss": eval_loss, "perplexity": math.exp(eval_loss)}
    model_card.save_with_card(trainer, task="text-generation", results=results, example_input=args.prompt,
                              dataset_name=dataset_name, dataset_id=dataset_id)  # fmt: skip


if __name__ == "__main__":
    main()
