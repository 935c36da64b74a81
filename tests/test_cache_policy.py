"""When a Turner model makes, keeps or refuses a cache (issue 35 items 2, 3, 7 and 8), each as the user action that
once gave a different answer without an error: GPT-2 (`transformers`' own) answers the same way where it is right."""

import pytest
import torch
from transformers import DataCollatorWithFlattening, DynamicCache

from turner_tfm import TurnerForCausalLM, TurnerModel
from turner_tfm.compat_turner import named_cache, output_cache

from .tiny import random_ids, text_config


def test_use_cache_in_train_mode_returns_a_cache_that_continues_exactly():
    model = TurnerForCausalLM(text_config(hidden_dropout=0.0)).train()
    ids = random_ids(2, 9, seed=1)
    out = model(ids[:, :5], use_cache=True)
    cache = output_cache(out)
    assert cache is not None and cache.get_seq_length() == 5
    rest = model(ids[:, 5:], use_cache=True, **named_cache(cache)).logits
    torch.testing.assert_close(rest, model(ids).logits[:, 5:], atol=1e-5, rtol=1e-5)
    rest.sum().backward()  # a training step through the cache still has its gradients
    assert model.lm_head.weight.grad is not None


def test_gradient_checkpointing_in_training_still_turns_the_cache_off():
    """As transformers' models: checkpointed blocks run twice, so while training they keep no cache."""
    model = TurnerForCausalLM(text_config()).train()
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable  # 5.24
    enable()
    assert output_cache(model(random_ids(1, 6), use_cache=True)) is None


def test_a_bidirectional_lm_generates_as_without_a_cache():
    model = TurnerForCausalLM(text_config(is_causal=False)).eval()
    ids = random_ids(2, 5, seed=2)
    kwargs = dict(max_new_tokens=6, do_sample=False, pad_token_id=0, output_logits=True, return_dict_in_generate=True)
    cached, uncached = model.generate(ids, **kwargs), model.generate(ids, use_cache=False, **kwargs)
    assert torch.equal(cached.sequences, uncached.sequences)
    step = ids  # one token at a time, the whole sequence each time, as an uncached loop does
    for logits in cached.logits:
        expected = model(step).logits[:, -1]
        torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5)
        step = torch.cat([step, expected.argmax(-1, keepdim=True)], dim=1)


def test_a_bidirectional_model_returns_no_cache_and_refuses_a_filled_one():
    model = TurnerModel(text_config(is_causal=False)).eval()
    ids = random_ids(1, 6, seed=3)
    assert output_cache(model(ids, use_cache=True)) is None
    filled = DynamicCache(config=model.config)
    filled.update(torch.zeros(1, 4, 3, 8), torch.zeros(1, 4, 3, 8), 0)
    with pytest.raises(ValueError, match=r"`cache` holding 3 tokens is invalid: this model is bidirectional"):
        model(ids, **named_cache(filled))


@pytest.mark.parametrize("is_causal", [True, False])
def test_packed_rows_in_eval_mode_keep_their_sequences_apart(is_causal):
    model = TurnerForCausalLM(text_config(is_causal=is_causal)).eval()
    first, second = random_ids(1, 5, seed=4)[0].tolist(), random_ids(1, 7, seed=5)[0].tolist()
    batch = DataCollatorWithFlattening(return_position_ids=True)([{"input_ids": first}, {"input_ids": second}])
    with torch.no_grad():
        packed = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits[0]
        alone = [model(torch.tensor([ids])).logits[0] for ids in (first, second)]
    torch.testing.assert_close(packed, torch.cat(alone), atol=1e-5, rtol=1e-5)


def test_cache_position_is_accepted_when_it_agrees_and_refused_when_not():
    model = TurnerForCausalLM(text_config()).eval()
    ids = random_ids(1, 7, seed=6)
    with torch.no_grad():
        cache = output_cache(model(ids[:, :4], cache_position=torch.arange(4)))
        rest = model(ids[:, 4:], cache_position=torch.arange(4, 7), **named_cache(cache)).logits
        torch.testing.assert_close(rest, model(ids).logits[:, 4:], atol=1e-5, rtol=1e-5)
        with pytest.raises(
            ValueError, match=r"`cache_position` is \[0, 1, 2\]; it must be the cache slots of this step, 7"
        ):
            model(ids[:, :3], cache_position=torch.arange(3), **named_cache(cache))
