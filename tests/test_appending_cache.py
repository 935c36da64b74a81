"""Turner's dynamic cache layer (`TurnerDynamicLayer`): it appends in place (on the CPU once its keys and values
outgrow `concatenates_on_cpu_up_to`), and behaves as transformers' `DynamicLayer` (which concatenates) under every
operation generate() and users apply to a cache."""

import copy
import random

import pytest
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from turner_tfm import TurnerForCausalLM
from turner_tfm.compat_turner import named_cache, output_cache
from turner_tfm.generation_turner import TurnerDynamicLayer

from .tiny import random_ids, text_config

PAD = 0
# Bytes of 20 positions of `states(3, ...)`'s keys and values: batch 3, 2 heads, 4 features, float32.
TWENTY_POSITIONS = 2 * 3 * 2 * 4 * 4 * 20


@pytest.fixture(autouse=True)
def appending_at_any_size(monkeypatch):
    """The tests' caches are tiny, and on the CPU a small cache concatenates: here the layer appends from the first
    position, unless a test sets the threshold itself."""
    monkeypatch.setattr(TurnerDynamicLayer, "concatenates_on_cpu_up_to", 0)


def states(batch: int, length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(batch, 2, length, 4, generator=generator) for _ in range(2))


def apply(layer: DynamicLayer, operation: str, seed: int) -> None:
    batch = layer.keys.shape[0] if layer.is_initialized and layer.keys.ndim == 4 else 3
    if operation == "append":
        layer.update(*states(batch, 1 + seed % 5, seed))
    elif operation == "crop":
        layer.crop(-min(1 + seed % 3, layer.get_seq_length()))
    elif operation == "reorder":
        layer.reorder_cache(torch.tensor([(i + seed) % batch for i in range(batch)]))
    elif operation == "select":
        layer.batch_select_indices(torch.arange(batch - 1) if batch > 1 else torch.arange(1))
    elif operation == "repeat":
        layer.batch_repeat_interleave(2)
    elif operation == "offload":
        layer.offload()
        layer.prefetch()


@pytest.mark.parametrize("concatenates_up_to", [0, TWENTY_POSITIONS])
def test_every_sequence_of_cache_operations_leaves_what_concatenation_leaves(concatenates_up_to, monkeypatch):
    monkeypatch.setattr(TurnerDynamicLayer, "concatenates_on_cpu_up_to", concatenates_up_to)
    rng = random.Random(0)
    for trial in range(30):
        ours, reference = TurnerDynamicLayer(), DynamicLayer()
        for seed in range(trial * 100, trial * 100 + 40):
            operation = rng.choice(["append"] * 4 + ["crop", "reorder", "select", "repeat", "offload"])
            if operation != "append" and ours.get_seq_length() == 0:
                operation = "append"
            if operation == "repeat" and ours.keys.shape[0] > 6:
                operation = "select"
            for layer in (ours, reference):
                apply(layer, operation, seed)
            assert ours.get_seq_length() == reference.get_seq_length(), operation
            assert torch.equal(ours.keys, reference.keys) and torch.equal(ours.values, reference.values), operation


def buffer_of(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


def test_on_the_cpu_a_small_cache_concatenates_and_appends_once_it_outgrows_the_threshold(monkeypatch):
    monkeypatch.setattr(TurnerDynamicLayer, "concatenates_on_cpu_up_to", TWENTY_POSITIONS)
    ours, reference = TurnerDynamicLayer(), DynamicLayer()
    handed = []
    for seed, length in enumerate([12, 8, 1, 1, 1]):  # 12 and 20 positions concatenate; 21 to 23 append
        keys, values = ours.update(*states(3, length, seed))
        reference.update(*states(3, length, seed))
        handed.append(buffer_of(keys))
        assert torch.equal(keys, reference.keys) and torch.equal(values, reference.values)
        concatenated = ours.get_seq_length() <= 20
        assert (getattr(ours, "_buffers", None) is None) == concatenated, ours.get_seq_length()
        assert keys.is_contiguous() == concatenated, ours.get_seq_length()
    assert len(set(handed[:3])) == 3 and len(set(handed[2:])) == 1  # fresh tensors, then one buffer from 21 on


def test_appending_writes_in_place_until_the_buffer_is_full_then_doubles():
    layer = TurnerDynamicLayer()
    keys, values = layer.update(*states(2, 100, 0))
    buffers = buffer_of(keys), buffer_of(values)
    assert keys.shape[-2] == 100 and layer._buffers.keys.shape[-2] == TurnerDynamicLayer.min_capacity
    for step in range(156):
        keys, values = layer.update(*states(2, 1, step + 1))
        assert (buffer_of(keys), buffer_of(values)) == buffers, f"step {step} copied the cache"
    keys, _ = layer.update(*states(2, 1, 999))
    assert buffer_of(keys) != buffers[0] and layer._buffers.keys.shape[-2] == 2 * 257


SHRINKING = {
    "crop": lambda layer: layer.crop(-3),
    "reset": lambda layer: layer.reset(),
    "select": lambda layer: layer.batch_select_indices(torch.tensor([1, 0])),
    "reorder": lambda layer: layer.reorder_cache(torch.tensor([1, 0])),
}


@pytest.mark.parametrize("operation", SHRINKING)
def test_tensors_handed_out_are_never_written_again(operation):
    """As with `DynamicLayer`, whose update concatenates: keys and values a caller holds keep their values whatever
    the cache does next (a crop, a reset, batch selection, then new tokens)."""
    for layer in (TurnerDynamicLayer(), DynamicLayer()):
        held = [tensor.clone() for tensor in layer.update(*states(2, 6, 0))]
        handed_out = (layer.keys, layer.values)
        SHRINKING[operation](layer)
        layer.update(*states(2, 4, 1))
        layer.update(*states(2, 1, 2))
        for tensor, before in zip(handed_out, held, strict=True):
            assert torch.equal(tensor, before), f"{type(layer).__name__}: {operation} then update wrote over it"


def test_a_shallow_copy_of_a_layer_and_its_original_grow_apart():
    """Two layer objects that view one buffer (`copy.copy`) each keep their own rows: the first to append owns the
    next rows, the other starts a buffer of its own, as two concatenating layers would."""
    original = TurnerDynamicLayer()
    original.update(*states(1, 5, 0))
    branch = copy.copy(original)
    branch_keys, _ = branch.update(*states(1, 2, 1))
    kept = branch_keys.clone()
    original_keys, _ = original.update(*states(1, 2, 2))
    assert torch.equal(branch_keys, kept)
    assert not torch.equal(original_keys[..., 5:, :], branch_keys[..., 5:, :])


def test_a_deep_copy_is_a_compact_dynamic_layer_and_the_original_keeps_appending():
    """Issue 50: a deep copy owns its rows only (GPT-2's `DynamicLayer`, contiguous, no buffer: transformers'
    exporters trace deep copies of generate()'s cache), and it and the original each continue with their own rows."""
    original = TurnerDynamicLayer()
    original.update(*states(1, 5, 0))
    copied = copy.deepcopy(original)
    assert type(copied) is DynamicLayer and copied.keys.is_contiguous() and copied.values.is_contiguous()
    assert torch.equal(copied.keys, original.keys)
    assert copied.keys.untyped_storage().nbytes() < original.keys.untyped_storage().nbytes()  # 5 rows, not 256
    copied_keys, _ = copied.update(*states(1, 2, 1))
    original_keys, _ = original.update(*states(1, 2, 2))
    assert buffer_of(original_keys) == buffer_of(original.keys) and not torch.equal(original_keys, copied_keys)
    expected = DynamicLayer()
    for step in (states(1, 5, 0), states(1, 2, 1)):
        expected_keys, _ = expected.update(*step)
    assert torch.equal(copied_keys, expected_keys)


def test_a_cropped_prefix_branches_without_changing_the_first_branch():
    """Issue 35 item 1 as a user meets it: keep a branch's cache tensors, crop back to the prefix, run another
    continuation, then resume the first branch from what was kept: the logits equal a run without the detour."""
    model = TurnerForCausalLM(text_config()).eval()
    ids, other = random_ids(1, 10, seed=5), random_ids(1, 4, seed=6)
    with torch.no_grad():
        cache = output_cache(model(ids[:, :8], use_cache=True))
        kept = copy.copy(cache)  # a second cache over the same tensors, not copies of them
        kept.layers = [copy.copy(layer) for layer in cache.layers]
        cache.crop(-3)  # back to the first 5 tokens
        model(other, cache=cache, use_cache=True)
        resumed = model(ids[:, 8:], cache=kept, use_cache=True).logits
        expected = model(ids).logits[:, 8:]
    torch.testing.assert_close(resumed, expected, atol=1e-5, rtol=1e-5)


def generate(model: TurnerForCausalLM, ids: torch.Tensor, cache: DynamicCache | None, **kwargs):
    torch.manual_seed(0)
    out = model.generate(
        ids,
        attention_mask=(ids != PAD).long(),
        **named_cache(cache),
        pad_token_id=PAD,
        return_dict_in_generate=True,
        **kwargs,
    )
    return out.sequences, output_cache(out)


DECODING = {
    "greedy past the first buffer": {"max_new_tokens": 300, "do_sample": False},
    "beam search": {"max_new_tokens": 12, "num_beams": 3, "do_sample": False},
    "sampling, 2 per prompt": {"max_new_tokens": 12, "do_sample": True, "top_k": 5, "num_return_sequences": 2},
}


@pytest.mark.parametrize("decoding", DECODING)
def test_generate_uses_the_appending_cache_and_gives_the_concatenating_caches_tokens(decoding):
    model = TurnerForCausalLM(text_config(max_position_embeddings=512)).eval()
    ids = random_ids(3, 7, seed=1)
    ids[0, :2] = PAD  # left padding
    given = DynamicCache(config=model.config)
    expected, used = generate(model, ids, given, **DECODING[decoding])
    tokens, cache = generate(model, ids, None, **DECODING[decoding])
    assert torch.equal(tokens, expected)
    assert used is given and all(type(layer) is DynamicLayer for layer in given.layers), "a caller's cache is kept"
    if cache is not None:  # beam search returns no cache
        assert all(isinstance(layer, TurnerDynamicLayer) for layer in cache.layers)


def test_assisted_decoding_crops_the_appending_cache_and_gives_the_same_tokens():
    config = text_config()
    model, assistant = TurnerForCausalLM(config).eval(), TurnerForCausalLM(config).eval()
    ids = random_ids(1, 6, seed=2)
    expected, _ = generate(model, ids, DynamicCache(config=config), max_new_tokens=24, do_sample=False)
    tokens, cache = generate(model, ids, None, max_new_tokens=24, do_sample=False, assistant_model=assistant)
    assert torch.equal(tokens, expected) and isinstance(cache.layers[0], TurnerDynamicLayer)


def test_forward_cache_continues_across_inference_and_no_grad_and_from_a_deep_copy():
    model = TurnerForCausalLM(text_config()).eval()
    ids = random_ids(2, 12, seed=3)
    with torch.no_grad():
        full = model(ids).logits
    with torch.inference_mode():
        prefix = output_cache(model(ids[:, :8], use_cache=True))
    assert isinstance(prefix.layers[0], TurnerDynamicLayer)
    for cache in (copy.deepcopy(prefix), prefix):  # the copy first: continuing it must leave the original intact
        with torch.no_grad():
            rest = model(ids[:, 8:], cache=cache, use_cache=True).logits
        torch.testing.assert_close(rest, full[:, 8:], atol=1e-5, rtol=1e-5)
        assert cache.get_seq_length() == 12


def test_gradients_flow_through_cached_steps_as_without_a_cache():
    model = TurnerForCausalLM(text_config()).eval()
    ids = random_ids(2, 10, seed=4)
    model(ids).logits[:, 6:].sum().backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    cache = output_cache(model(ids[:, :6], use_cache=True))
    steps = [model(ids[:, i : i + 1], cache=cache, use_cache=True).logits for i in range(6, 10)]
    torch.cat(steps, dim=1).sum().backward()
    for parameter, grad in zip(model.parameters(), expected, strict=True):
        torch.testing.assert_close(parameter.grad, grad, atol=1e-5, rtol=1e-4)
