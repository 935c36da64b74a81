"""generate()'s decoding loop on the CPU runs with the blocks' widening weights stored input-major
(`input_major_widening_weights`): the same tokens and scores, the same parameters before and after, and no copy
for a generation too short to pay for it."""

import threading

import pytest
import torch
from transformers import StoppingCriteria, StoppingCriteriaList

import turner_tfm.modeling_turner as modeling
from turner_tfm import TurnerForCausalLM

from .tiny import random_ids, text_config

PAD = 0


def lm(**overrides) -> TurnerForCausalLM:
    torch.manual_seed(0)
    return TurnerForCausalLM(text_config(**overrides)).eval()


def widening_and_narrowing(model: TurnerForCausalLM) -> tuple[list[torch.nn.Parameter], list[torch.nn.Parameter]]:
    widening, narrowing = [], []
    for block in model.model.layers:
        for linear in (block.self_attn.qkv_proj, block.self_attn.o_proj, block.mlp.up_proj, block.mlp.down_proj):
            (widening if linear.out_features >= linear.in_features else narrowing).append(linear.weight)
    return widening, narrowing


def record_decoding_layouts(model: TurnerForCausalLM) -> list[bool]:
    """For every one-token forward pass of block 0's `qkv_proj`: whether its weight is stored input-major."""
    layouts = []
    weight = model.model.layers[0].self_attn.qkv_proj.weight

    def record(module, args):
        if args[0].shape[-2] == 1:
            layouts.append(weight.stride() == (1, weight.shape[0]))

    model.model.layers[0].self_attn.qkv_proj.register_forward_pre_hook(record)
    return layouts


def greedy(model: TurnerForCausalLM, new_tokens: int, **kwargs):
    return model.generate(
        random_ids(2, 7),
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        pad_token_id=PAD,
        output_scores=True,
        return_dict_in_generate=True,
        **kwargs,
    )


def test_decoding_runs_input_major_and_gives_the_same_tokens_and_scores(monkeypatch):
    model = lm(intermediate_size=64)  # up_proj widens (32 -> 64) and down_proj narrows
    widening, narrowing = widening_and_narrowing(model)
    before = [(weight.data_ptr(), weight.detach().clone()) for weight in widening]
    layouts = record_decoding_layouts(model)

    generated = greedy(model, 20)
    assert len(layouts) == 19 and all(layouts)  # every decoding step; the prompt's pass is as stored
    for weight, (pointer, values) in zip(widening, before, strict=True):  # the very same storage back
        assert weight.is_contiguous() and weight.data_ptr() == pointer and torch.equal(weight, values)
    assert all(weight.is_contiguous() for weight in narrowing)

    monkeypatch.setattr(modeling, "INPUT_MAJOR_MIN_NEW_TOKENS", 10**9)  # the same call, weights as stored
    layouts.clear()
    as_stored = greedy(model, 20)
    assert len(layouts) == 19 and not any(layouts)
    assert torch.equal(generated.sequences, as_stored.sequences)
    for scores, expected in zip(generated.scores, as_stored.scores, strict=True):
        torch.testing.assert_close(scores, expected, atol=1e-5, rtol=1e-5)


def test_a_short_generation_does_not_copy_the_weights():
    model = lm()
    layouts = record_decoding_layouts(model)
    greedy(model, modeling.INPUT_MAJOR_MIN_NEW_TOKENS - 1)
    assert layouts and not any(layouts)
    greedy(model, modeling.INPUT_MAJOR_MIN_NEW_TOKENS)
    assert any(layouts)


class StopWithError(StoppingCriteria):
    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        raise KeyboardInterrupt


def test_weights_are_restored_when_generation_is_interrupted():
    model = lm()
    widening, _ = widening_and_narrowing(model)
    pointers = [weight.data_ptr() for weight in widening]
    with pytest.raises(KeyboardInterrupt):
        greedy(model, 20, stopping_criteria=StoppingCriteriaList([StopWithError()]))
    assert [weight.data_ptr() for weight in widening] == pointers
    assert all(weight.is_contiguous() for weight in widening)


def test_nested_and_concurrent_generations_share_one_copy_and_restore_it():
    model = lm()
    widening, _ = widening_and_narrowing(model)
    pointers = [weight.data_ptr() for weight in widening]
    with modeling.input_major_widening_weights(model):
        copied = [weight.data_ptr() for weight in widening]
        assert copied != pointers
        with modeling.input_major_widening_weights(model):
            assert [weight.data_ptr() for weight in widening] == copied
        assert [weight.data_ptr() for weight in widening] == copied  # the inner exit keeps the outer's copy
    assert [weight.data_ptr() for weight in widening] == pointers

    expected = greedy(model, 24).sequences
    results = [None] * 4

    def generate(index: int) -> None:
        results[index] = greedy(model, 24).sequences

    threads = [threading.Thread(target=generate, args=(index,)) for index in range(len(results))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(torch.equal(result, expected) for result in results)
    assert [weight.data_ptr() for weight in widening] == pointers
    assert all(weight.is_contiguous() for weight in widening)
