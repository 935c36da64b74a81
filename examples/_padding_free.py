"""Padding-free training for the causal-LM scripts (`--padding-free`): each paragraph of the text is one sequence,
and a batch is those sequences packed end to end in one row by `DataCollatorWithFlattening`, with `position_ids`
restarting at every sequence and no attention mask. The model reads the sequence boundaries from the positions, so
no token attends across them and no compute is spent on padding. The same sequences padded to the longest in each
batch (`DataCollatorForLanguageModeling`) are the comparison `benchmarks/bench_padding_free.py` measures.
"""

import argparse

from _cli import UsageError
from _common import training_arguments
from datasets import Dataset
from transformers import (
    DataCollatorForLanguageModeling,
    DataCollatorWithFlattening,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Trainer,
)


def paragraph_sequences(tokenizer: PreTrainedTokenizerFast, text: str, block_size: int, what: str) -> Dataset:
    """Each blank-line separated paragraph as one sequence of token ids, cut into pieces of at most `block_size`;
    pieces shorter than 2 tokens (nothing to predict) are dropped."""
    paragraphs = [p for p in text.split("\n\n") if p.strip()]
    encoded = tokenizer.backend_tokenizer.encode_batch(paragraphs)
    pieces = [e.ids[i : i + block_size] for e in encoded for i in range(0, len(e.ids), block_size)]
    pieces = [piece for piece in pieces if len(piece) > 1]
    if not pieces:
        raise UsageError(f"the {what} text has no paragraph of 2 tokens or more to train on")
    return Dataset.from_dict({"input_ids": pieces})


def collator(padding_free: bool, tokenizer: PreTrainedTokenizerFast):
    """One packed row (`padding_free`), or the sequences padded to the longest, padding masked out of the loss."""
    if padding_free:
        return DataCollatorWithFlattening()
    return DataCollatorForLanguageModeling(tokenizer, mlm=False)


def causal_lm_trainer(
    args: argparse.Namespace,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerFast,
    train_text: str,
    eval_text: str,
) -> Trainer:
    """`_common.causal_lm_trainer` for `--padding-free`: paragraph sequences packed in one row per batch."""
    return Trainer(
        model=model,
        args=training_arguments(args),
        train_dataset=paragraph_sequences(tokenizer, train_text, args.block_size, "training"),
        eval_dataset=paragraph_sequences(tokenizer, eval_text, args.block_size, "held-out"),
        data_collator=collator(True, tokenizer),
        processing_class=tokenizer,
    )
