"""Padding-free training for the causal-LM scripts (`--padding-free`): each paragraph of the text is one sequence,
and a batch is those sequences packed end to end in one row by `DataCollatorWithFlattening`, with `position_ids`
restarting at every sequence and no attention mask. The model reads the sequence boundaries from the positions, so
no token attends across them and no compute is spent on padding. The same sequences padded to the longest in each
batch (`DataCollatorForLanguageModeling`) are the comparison `benchmarks/bench_padding_free.py` measures.
"""

from _cli import UsageError
from datasets import Dataset
from transformers import (
    DataCollatorForLanguageModeling,
    DataCollatorWithFlattening,
    PreTrainedTokenizerFast,
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
