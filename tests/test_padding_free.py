"""Padding-free training (`train_causal_lm.py --padding-free`): sequences packed in one row by
`DataCollatorWithFlattening` train exactly as the same sequences padded to the longest: same loss, same gradients."""

import sys

import pytest
import torch

from turner_tfm import TurnerForCausalLM

from .tiny import random_ids, text_config
from .workflow_utils import EXAMPLES, TINY_MODEL, printed_number, run_example, training_losses


@pytest.fixture(scope="module")
def padding_free():
    sys.path.insert(0, str(EXAMPLES))
    try:
        import _padding_free

        yield _padding_free
    finally:
        sys.path.remove(str(EXAMPLES))


class _PadOnly:
    """The one thing `DataCollatorForLanguageModeling` asks of a tokenizer here: pad a batch of ids."""

    pad_token_id = 0
    padding_side = "right"

    def pad(self, features, return_tensors="pt", pad_to_multiple_of=None, **_):
        width = max(len(f["input_ids"]) for f in features)
        ids = torch.tensor([f["input_ids"] + [0] * (width - len(f["input_ids"])) for f in features])
        mask = torch.tensor([[1] * len(f["input_ids"]) + [0] * (width - len(f["input_ids"])) for f in features])
        return {"input_ids": ids, "attention_mask": mask}


@pytest.mark.parametrize("position_embedding_type", ["learned", "rotary"])
def test_a_packed_batch_trains_exactly_like_the_padded_batch(padding_free, position_embedding_type):
    sequences = [{"input_ids": random_ids(1, length, seed=length)[0].tolist()} for length in (7, 3, 12, 5)]
    packed = padding_free.collator(True, None)(sequences)
    padded = padding_free.collator(False, _PadOnly())(sequences)
    assert packed["input_ids"].shape == (1, 27) and "attention_mask" not in packed
    assert padded["input_ids"].shape == (4, 12) and (padded["labels"] == -100).sum() == 4 * 12 - 27

    torch.manual_seed(0)
    model = TurnerForCausalLM(text_config(position_embedding_type=position_embedding_type))
    losses, gradients = [], []
    for batch in (packed, padded):
        model.zero_grad()
        loss = model(**batch).loss
        loss.backward()
        losses.append(loss.detach())
        gradients.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    torch.testing.assert_close(losses[0], losses[1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gradients[0], gradients[1], atol=1e-5, rtol=1e-4)


def test_paragraphs_become_sequences_of_at_most_the_block_size(padding_free):
    import _common  # on the path while the fixture lasts

    text = "Return the sum.\n\n\n\nA much longer paragraph, cut in pieces.\n\nX"
    tokenizer = _common.char_tokenizer([text], model_max_length=16)
    dataset = padding_free.paragraph_sequences(tokenizer, text, 16, "training")
    assert [len(ids) for ids in dataset["input_ids"]] == [15, 16, 16, 7]  # "X" has nothing to predict


def test_the_script_trains_padding_free(tmp_path):
    output = run_example(
        "train_causal_lm.py",
        *("--padding-free", "--output-dir", "lm", "--max-steps", "20", "--logging-steps", "5"),
        *("--learning-rate", "5e-3", "--block-size", "64", "--max-new-tokens", "5", *TINY_MODEL),
        tmp_path=tmp_path,
    )
    losses = training_losses(output)
    assert losses[-1] < losses[0] - 0.5, losses
    assert printed_number(output, "held-out loss") < losses[0]
    assert (tmp_path / "lm" / "model.safetensors").is_file()
