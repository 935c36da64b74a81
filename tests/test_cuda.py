"""The CUDA paths, on a machine with an NVIDIA GPU: `python -m pytest -m gpu` (CI has none; the default run
deselects these, and on a machine without CUDA they fail rather than pass unseen).

Each check compares the GPU against the CPU or against another GPU path: attention implementations, the decoding
loop (appending cache, static cache, compiled), mixed precision training, loading with `device_map`, and that the
decoding loop forces no device sync."""

import pytest
import torch
from transformers import AutoModelForCausalLM, CompileConfig

from turner_tfm import TurnerForCausalLM, TurnerForImageClassification, TurnerForSequenceClassification
from turner_tfm.compat_turner import output_cache

from .tiny import image_config, random_ids, text_config

pytestmark = pytest.mark.gpu

CUDA = torch.device("cuda")


@pytest.fixture(autouse=True)
def _needs_cuda():
    assert torch.cuda.is_available(), "the gpu tests need a CUDA device (run them with -m gpu on a GPU machine)"


def causal_lm(**overrides) -> TurnerForCausalLM:
    torch.manual_seed(0)
    return TurnerForCausalLM(text_config(initializer_range=0.3, **overrides)).eval()


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("position_embedding_type", ["learned", "rotary"])
def test_cuda_logits_equal_the_cpus(implementation, position_embedding_type):
    model = causal_lm(position_embedding_type=position_embedding_type)
    model.config._attn_implementation = implementation
    ids, mask = random_ids(3, 12), torch.ones(3, 12, dtype=torch.long)
    mask[0, :4] = 0  # a left-padded row
    with torch.no_grad():
        expected = model(ids, attention_mask=mask).logits
        logits = model.to(CUDA)(ids.to(CUDA), attention_mask=mask.to(CUDA)).logits
    torch.testing.assert_close(logits.cpu(), expected, rtol=1e-4, atol=1e-4)


def test_cuda_classifiers_equal_the_cpus():
    torch.manual_seed(0)
    text = TurnerForSequenceClassification(text_config(is_causal=False, num_labels=3)).eval()
    image = TurnerForImageClassification(image_config()).eval()
    ids, pixels = random_ids(2, 9), torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        expected = text(ids).logits, image(pixels).logits
        got = text.to(CUDA)(ids.to(CUDA)).logits, image.to(CUDA)(pixels.to(CUDA)).logits
    for logits, reference in zip(got, expected, strict=True):
        torch.testing.assert_close(logits.cpu(), reference, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cache_implementation", [None, "static"])
def test_cuda_greedy_generation_gives_the_cpus_tokens(cache_implementation):
    model = causal_lm()
    prompt = random_ids(2, 6)
    kwargs = dict(max_new_tokens=20, do_sample=False, pad_token_id=0, cache_implementation=cache_implementation)
    expected = model.generate(prompt, **kwargs)
    assert torch.equal(model.to(CUDA).generate(prompt.to(CUDA), **kwargs).cpu(), expected)


def test_compiled_static_generation_gives_the_eager_tokens():
    model = causal_lm().to(CUDA)
    prompt = random_ids(2, 6).to(CUDA)
    kwargs = dict(max_new_tokens=16, do_sample=False, pad_token_id=0, cache_implementation="static")
    eager = model.generate(prompt, disable_compile=True, **kwargs)
    compiled = model.generate(prompt, compile_config=CompileConfig(fullgraph=True), **kwargs)
    assert torch.equal(compiled, eager)


def test_a_forward_pass_forces_no_device_sync():
    """On an accelerator the model reads no tensor values back (its value checks run on the CPU only), so a prompt's
    forward pass and a decoding step with the cache queue their kernels without waiting for the GPU: torch's sync
    debug mode turns any sync into an error (the first check shows it catches one)."""
    model = causal_lm().to(CUDA)
    prompt, step = random_ids(2, 6).to(CUDA), torch.full((2, 1), 5, device=CUDA)
    torch.cuda.set_sync_debug_mode("error")
    try:
        with pytest.raises(RuntimeError, match="synchroniz"):
            prompt.sum().item()
        with torch.no_grad():
            cache = output_cache(model(prompt, use_cache=True))
            model(step, cache=cache, use_cache=True)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_bf16_autocast_training_step_on_cuda_is_finite_and_learns():
    torch.manual_seed(0)
    model = TurnerForCausalLM(text_config()).to(CUDA).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids = random_ids(4, 16).to(CUDA)
    losses = []
    for _ in range(20):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(ids, labels=ids).loss
        loss.backward()
        assert all(p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters())
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0] / 2, losses


@pytest.mark.parametrize("trust_remote_code", [False, True])
def test_a_saved_folder_loads_onto_the_gpu_with_device_map(tmp_path, trust_remote_code):
    model = causal_lm()
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, device_map="cuda", trust_remote_code=trust_remote_code)
    assert {p.device.type for p in loaded.parameters()} == {"cuda"}
    ids = random_ids(2, 8)
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids.to(CUDA)).logits.cpu(), model(ids).logits, rtol=1e-4, atol=1e-4)
