"""The sequence classifier with every form of attention mask (issue 35 items 5 and 6): a 4-D mask pools as the 2-D
mask it stands for, and padding ids choose the pooled token without hiding any token from attention, as GPT-2's
classifier does."""

import pytest
import torch

from turner_tfm import TurnerForSequenceClassification

from .tiny import random_ids, text_config

PAD = 0


def four_d(padding: torch.Tensor, causal: bool, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The additive (batch, 1, N, N) mask a 2-D padding mask and (optionally) the causal mask make together."""
    length = padding.shape[1]
    allowed = padding[:, None, None, :].bool().expand(-1, 1, length, -1)
    if causal:
        allowed = allowed & torch.ones(length, length, dtype=torch.bool).tril()
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)


@pytest.mark.parametrize(("is_causal", "pooling"), [(True, "last"), (True, "mean"), (False, "mean"), (False, "cls")])
def test_a_4d_mask_pools_as_the_2d_mask_it_stands_for(is_causal, pooling):
    config = text_config(is_causal=is_causal, classifier_pooling=pooling, num_labels=3)
    model = TurnerForSequenceClassification(config).eval()
    ids = random_ids(2, 6, seed=1)
    ids[0, 4:] = PAD  # right padding: the 4-D mask's pooled positions come from the padding ids
    padding = (ids != PAD).long()
    with torch.no_grad():
        expected = model(ids, attention_mask=padding).logits
        logits = model(ids, attention_mask=four_d(padding, is_causal)).logits
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5)


def test_a_pad_id_inside_the_text_stays_attended_without_a_mask():
    """pad_token_id = eos_token_id (GPT-2's setup) with an eos used as a separator inside the text: no mask gives
    the all-ones mask's logits, since a mask is never read from the ids."""
    config = text_config(pad_token_id=2, eos_token_id=2, num_labels=2)
    model = TurnerForSequenceClassification(config).eval()
    ids = random_ids(2, 8, seed=2)
    ids[:, 3] = 2  # a separator
    with torch.no_grad():
        unmasked = model(ids).logits
        ones = model(ids, attention_mask=torch.ones_like(ids)).logits
    torch.testing.assert_close(unmasked, ones, atol=1e-6, rtol=1e-6)


def test_right_padding_without_a_mask_pools_the_last_real_token_like_gpt2():
    """No mask, right padding, causal: the pooled token is the last one that is not padding, whose output the
    padding after it cannot change; the logits equal the masked call's."""
    model = TurnerForSequenceClassification(text_config(num_labels=2)).eval()
    ids = random_ids(2, 7, seed=3)
    ids[1, 5:] = PAD
    with torch.no_grad():
        torch.testing.assert_close(
            model(ids).logits, model(ids, attention_mask=(ids != PAD).long()).logits, atol=1e-5, rtol=1e-5
        )
