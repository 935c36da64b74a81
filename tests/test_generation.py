"""generate() and the KV cache (§4.1 incremental property): dynamic and static caches, padding, decoding modes."""

import pytest
import torch
import transformers
from packaging import version
from transformers import DynamicCache, StaticCache
from transformers.generation import CompileConfig, StoppingCriteria

from turner_tfm import TurnerForCausalLM
from turner_tfm.compat_turner import CACHE_NAME, named_cache, output_cache

from .tiny import random_ids, text_config

PAD = 0


@pytest.fixture
def model() -> TurnerForCausalLM:
    return TurnerForCausalLM(text_config()).eval()


@pytest.mark.parametrize("position_embedding_type", ["learned", "sinusoidal", "none"])
@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_logits_with_and_without_the_dynamic_cache_are_equal(position_embedding_type, implementation):
    config = text_config(position_embedding_type=position_embedding_type, attn_implementation=implementation)
    model = TurnerForCausalLM(config).eval()
    ids = random_ids(2, 12)
    with torch.no_grad():
        full = model(ids).logits
        prefix = model(ids[:, :8], use_cache=True)
        assert isinstance(output_cache(prefix), DynamicCache)
        cache = output_cache(prefix)
        steps = [model(ids[:, i : i + 1], cache=cache, use_cache=True).logits for i in range(8, 12)]
    assert cache.get_seq_length() == 12
    torch.testing.assert_close(torch.cat([prefix.logits, *steps], dim=1), full, atol=1e-5, rtol=1e-5)


def test_logits_with_the_static_cache_are_equal(model):
    ids = random_ids(2, 10)
    cache = StaticCache(config=model.config, max_cache_len=16)
    with torch.no_grad():
        full = model(ids).logits
        prefix = model(ids[:, :6], cache=cache, use_cache=True).logits
        step = model(ids[:, 6:], cache=cache, use_cache=True).logits
    torch.testing.assert_close(torch.cat([prefix, step], dim=1), full, atol=1e-5, rtol=1e-5)


def test_use_cache_false_returns_no_cache(model):
    assert output_cache(model(random_ids(1, 4), use_cache=False)) is None


def greedy(model: TurnerForCausalLM, ids: torch.Tensor, **kwargs) -> torch.Tensor:
    return model.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=PAD, **kwargs)


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_left_padded_batch_generates_what_each_prompt_generates_alone(implementation):
    model = TurnerForCausalLM(text_config(attn_implementation=implementation)).eval()
    prompts = [random_ids(1, 7, seed=1), random_ids(1, 4, seed=2), random_ids(1, 1, seed=3)]
    width = max(p.shape[1] for p in prompts)
    batch = torch.cat([torch.nn.functional.pad(p, (width - p.shape[1], 0), value=PAD) for p in prompts])
    generated = greedy(model, batch, attention_mask=(batch != PAD).long())
    for row, prompt in enumerate(prompts):
        alone = greedy(model, prompt)
        assert torch.equal(generated[row, width:], alone[0, prompt.shape[1] :])


def test_static_cache_generates_what_the_dynamic_cache_generates(model):
    ids = random_ids(2, 5)
    assert torch.equal(greedy(model, ids, cache_implementation="static"), greedy(model, ids))


@pytest.mark.skipif(
    version.parse(transformers.__version__) < version.parse("5.24"),
    reason="transformers 5.23's generate() calls .contiguous() on flex attention's BlockMask with a static cache, "
    "for every model (AttributeError in generation/utils.py); 5.24 does not",
)
def test_flex_attention_with_the_static_cache_generates_what_sdpa_generates(model):
    """Flex attention's block masks reach the input checks (as Llama's do) with the static cache."""
    flex = TurnerForCausalLM(text_config(attn_implementation="flex_attention")).eval()
    flex.load_state_dict(model.state_dict())
    ids = random_ids(2, 5)
    expected = greedy(model, ids)
    assert torch.equal(greedy(flex, ids, cache_implementation="static"), expected)


def test_greedy_decoding_follows_the_argmax(model):
    ids = random_ids(1, 5)
    generated = greedy(model, ids)
    with torch.no_grad():
        next_tokens = model(generated[:, :-1]).logits.argmax(-1)
    assert torch.equal(generated[:, 5:], next_tokens[:, 4:])


def test_sampling_is_reproducible_and_uses_the_distribution(model):
    ids = random_ids(1, 5)
    torch.manual_seed(7)
    first = model.generate(ids, max_new_tokens=20, do_sample=True, top_k=0, pad_token_id=PAD)
    torch.manual_seed(7)
    second = model.generate(ids, max_new_tokens=20, do_sample=True, top_k=0, pad_token_id=PAD)
    assert torch.equal(first, second)
    samples = {
        tuple(model.generate(ids, max_new_tokens=8, do_sample=True, pad_token_id=PAD)[0].tolist()) for _ in range(5)
    }
    assert len(samples) > 1


def test_beam_search_scores_at_least_as_well_as_greedy(model):
    ids = random_ids(1, 5)

    def log_likelihood(sequence: torch.Tensor) -> float:
        with torch.no_grad():
            logprobs = model(sequence).logits[:, 4:-1].log_softmax(-1)
        return logprobs.gather(-1, sequence[:, 5:, None]).sum().item()

    beams = model.generate(ids, max_new_tokens=6, num_beams=4, do_sample=False, length_penalty=0.0, pad_token_id=PAD)
    plain = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=PAD)
    assert beams.shape == plain.shape == (1, 11)
    assert log_likelihood(beams) >= log_likelihood(plain) - 1e-5


def compiled_static_generate(model: TurnerForCausalLM, ids: torch.Tensor, backend: str, **kwargs) -> torch.Tensor:
    compile_config = CompileConfig(fullgraph=True, backend=backend, mode="default")
    compile_config._compile_all_devices = True  # transformers compiles on GPUs only unless asked
    if CACHE_NAME not in kwargs:  # the cache handed in, or one generate() makes
        kwargs["cache_implementation"] = "static"
    generated = greedy(model, ids, compile_config=compile_config, **kwargs)
    assert model._compiled_call is not None, "the decode step was not compiled"
    return generated


def test_static_cache_decode_step_compiles_with_fullgraph(model):
    ids = random_ids(2, 5)
    assert torch.equal(compiled_static_generate(model, ids, backend="eager"), greedy(model, ids))


def test_one_static_cache_reused_keeps_one_compiled_step_for_every_call(model):
    """Each generate() call makes a new static cache, and torch 2.9's dynamo guards the compiled step on the identity
    of its tensors: every call recompiles, and past dynamo's recompile limit (8) a `fullgraph` compile fails (GPT-2's
    too; torch 2.10 guards on their sizes). One `StaticCache` handed to every call, reset before each, is what works
    on every torch (README, "What works"): more calls than the limit, each the eager tokens."""
    ids = random_ids(2, 5)
    expected = greedy(model, ids)
    cache = StaticCache(config=model.config, max_cache_len=ids.shape[1] + 12)
    for _ in range(torch._dynamo.config.recompile_limit + 1):
        cache.reset()
        assert torch.equal(compiled_static_generate(model, ids, backend="eager", **named_cache(cache)), expected)


@pytest.mark.slow
def test_static_cache_decode_step_compiles_with_inductor(model):
    ids = random_ids(2, 5)
    assert torch.equal(compiled_static_generate(model, ids, backend="inductor"), greedy(model, ids))


class EditWeightsOnce(StoppingCriteria):
    """A stopping criterion that, at the third decoding step, records how every parameter is stored and zeroes
    `up_proj` of block 0 in place, as a user's hook might."""

    def __init__(self, model: TurnerForCausalLM):
        self.model, self.calls, self.storage_while_decoding = model, 0, None

    def __call__(self, input_ids, scores, **kwargs):
        self.calls += 1
        if self.calls == 3:
            self.storage_while_decoding = parameter_storage(self.model)
            with torch.no_grad():
                self.model.model.layers[0].mlp.up_proj.weight.zero_()
        return torch.zeros(input_ids.shape[0], dtype=torch.bool)


def parameter_storage(model: torch.nn.Module) -> dict[str, tuple]:
    return {name: (p.data_ptr(), p.stride()) for name, p in model.named_parameters()}


def test_generate_never_moves_or_restores_the_models_parameters():
    """The decoding loop runs on the parameters as the user holds them: the same storage and layout throughout, and
    an in-place edit made during generation is still there afterwards."""
    torch.manual_seed(0)
    model = TurnerForCausalLM(text_config()).eval()
    before = parameter_storage(model)
    editor = EditWeightsOnce(model)
    model.generate(random_ids(2, 5), max_new_tokens=32, do_sample=False, pad_token_id=PAD, stopping_criteria=[editor])
    assert editor.storage_while_decoding == before
    assert parameter_storage(model) == before
    assert not model.model.layers[0].mlp.up_proj.weight.any(), "the edit made during generate() was undone"
