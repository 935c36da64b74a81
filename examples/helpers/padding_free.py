"""Padding-free training (`--padding-free`): a batch is its sequences packed end to end in one row by
`DataCollatorWithFlattening`, with `position_ids` restarting at every sequence and no attention mask. The model reads
the sequence boundaries from the positions, so no token attends across them and no compute is spent on padding.

For the causal-LM scripts each paragraph of the text is one sequence; for the text classifier each text is one, with
one label per sequence and logits per sequence from `TurnerForSequenceClassification`. `ClassificationFlattening`
stands in for what transformers lacks: its `DataCollatorWithFlattening` keeps one label per token, a language model's.
The same sequences padded to the longest in each batch are the comparison `benchmarks/bench_padding_free.py`
measures.
"""

from datasets import Dataset
from transformers import (
    DataCollatorForLanguageModeling,
    DataCollatorWithFlattening,
    DataCollatorWithPadding,
    PreTrainedTokenizerFast,
    default_data_collator,
)

LABEL_KEYS = ("label", "labels")


def paragraph_sequences(tokenizer: PreTrainedTokenizerFast, text: str, block_size: int, what: str) -> Dataset:
    """Each blank-line separated paragraph as one sequence of token ids, cut into pieces of at most `block_size`;
    pieces shorter than 2 tokens (nothing to predict) are dropped."""
    paragraphs = [p for p in text.split("\n\n") if p.strip()]
    encoded = tokenizer.backend_tokenizer.encode_batch(paragraphs)
    pieces = [e.ids[i : i + block_size] for e in encoded for i in range(0, len(e.ids), block_size)]
    pieces = [piece for piece in pieces if len(piece) > 1]
    if not pieces:
        raise ValueError(f"the {what} text has no paragraph of 2 tokens or more to train on")
    return Dataset.from_dict({"input_ids": pieces})


def collator(padding_free: bool, tokenizer: PreTrainedTokenizerFast):
    """One packed row (`padding_free`), or the sequences padded to the longest, padding masked out of the loss."""
    if padding_free:
        return DataCollatorWithFlattening()
    return DataCollatorForLanguageModeling(tokenizer, mlm=False)


class ClassificationFlattening(DataCollatorWithFlattening):
    """`DataCollatorWithFlattening` for a classifier: `input_ids` and `position_ids` packed in one row, and one label
    per sequence (integer class ids, or floats for regression and multi-label) instead of one per token."""

    def __call__(self, features: list[dict], return_tensors: str | None = None) -> dict:
        batch = super().__call__([{"input_ids": feature["input_ids"]} for feature in features], return_tensors)
        del batch["labels"]  # the next token at each position: a language model's labels
        labels = [{key: feature[key] for key in LABEL_KEYS if key in feature} for feature in features]
        return batch | default_data_collator(labels, return_tensors or self.return_tensors)


def classification_collator(padding_free: bool, tokenizer: PreTrainedTokenizerFast):
    """One packed row with a label per sequence (`padding_free`), or the texts padded to the longest."""
    return ClassificationFlattening() if padding_free else DataCollatorWithPadding(tokenizer)
