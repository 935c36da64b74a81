"""Quantized weights through `from_pretrained(..., quantization_config=...)`: torchao int8 weight-only and
bitsandbytes 8-bit on the CPU. Turner's projections are `nn.Linear`, so the quantizers find every one of them;
GPT-2's `Conv1D` layers are skipped by the same quantizer."""

import bitsandbytes  # noqa: F401  (the dev extra: a missing or broken install fails here, it never skips)
import pytest
import torch
import torchao
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    BitsAndBytesConfig,
    GPT2Config,
    GPT2LMHeadModel,
    TorchAoConfig,
)
from transformers.testing_utils import CaptureLogger
from transformers.utils import logging

from turner_tfm import TurnerForCausalLM, TurnerForSequenceClassification

from .tiny import random_ids, text_config

pytestmark = pytest.mark.torch_2_13(reason="the quant extra asks for it (pyproject)")

INT8 = {
    "torchao": lambda: TorchAoConfig(torchao.quantization.Int8WeightOnlyConfig()),
    "bitsandbytes": lambda: BitsAndBytesConfig(load_in_8bit=True),
}
PROJECTIONS = ("qkv_proj", "o_proj", "up_proj", "down_proj")


def is_quantized(module: torch.nn.Module) -> bool:
    """torchao swaps the weight for an int8 tensor subclass; bitsandbytes swaps the layer for `Linear8bitLt`."""
    return "Int8" in type(module.weight).__name__ or type(module).__name__ == "Linear8bitLt"


def quantized_layers(model: torch.nn.Module) -> dict[str, bool]:
    """Every layer with a matrix weight (Linear, Conv1D, Embedding): whether the quantizer replaced it."""
    return {
        name: is_quantized(module)
        for name, module in model.named_modules()
        if isinstance(getattr(module, "weight", None), torch.Tensor) and module.weight.dim() == 2
    }


def placement(method: str) -> dict:
    return {"device_map": "cpu"} if method == "bitsandbytes" else {}  # bitsandbytes asks where to put the weights


def load_quantized(auto_class, folder, method: str):
    return auto_class.from_pretrained(folder, quantization_config=INT8[method](), **placement(method)).eval()


@pytest.fixture(scope="module")
def saved_models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fp32")
    torch.manual_seed(0)
    TurnerForCausalLM(text_config(initializer_range=0.3)).save_pretrained(folder / "lm")
    TurnerForSequenceClassification(text_config(num_labels=3, initializer_range=0.3)).save_pretrained(folder / "cls")
    return folder


@pytest.mark.parametrize("method", list(INT8))
def test_quantized_language_model_loads_generates_saves_and_reloads_silently(method, saved_models, tmp_path):
    full = AutoModelForCausalLM.from_pretrained(saved_models / "lm").eval()
    model = load_quantized(AutoModelForCausalLM, saved_models / "lm", method)
    layers = quantized_layers(model)
    assert all(layers[name] for name in layers if name.endswith(PROJECTIONS)) and len(layers) > len(PROJECTIONS)
    prompt = random_ids(1, 6)
    with torch.no_grad():
        expected = full(prompt).logits
        torch.testing.assert_close(model(prompt).logits, expected, atol=0.05 * expected.abs().max().item(), rtol=0)
    greedy = {"max_new_tokens": 10, "do_sample": False, "pad_token_id": 0}
    generated = model.generate(prompt, **greedy)
    assert generated.shape == (1, 16)

    model.save_pretrained(tmp_path)
    logger = logging.get_logger("turner_tfm.configuration_turner")
    with CaptureLogger(logger) as captured:
        reloaded = AutoModelForCausalLM.from_pretrained(tmp_path, **placement(method))
    assert captured.out == ""  # no "unknown fields ['quantization_config']"
    quant_method = reloaded.config.quantization_config.quant_method
    assert getattr(quant_method, "value", quant_method) == method
    assert quantized_layers(reloaded) == layers
    assert torch.equal(reloaded.generate(prompt, **greedy), generated)


@pytest.mark.parametrize("method", list(INT8))
def test_quantized_classifier_classifies_like_the_full_one(method, saved_models):
    full = AutoModelForSequenceClassification.from_pretrained(saved_models / "cls").eval()
    model = load_quantized(AutoModelForSequenceClassification, saved_models / "cls", method)
    assert is_quantized(model.classifier) and is_quantized(model.model.layers[0].self_attn.qkv_proj)
    ids = random_ids(8, 12)
    with torch.no_grad():
        expected, logits = full(ids).logits, model(ids).logits
    torch.testing.assert_close(logits, expected, atol=0.05 * expected.abs().max().item(), rtol=0)
    assert torch.equal(logits.argmax(-1), expected.argmax(-1))


def test_the_same_quantizer_skips_every_gpt2_conv1d_but_takes_every_turner_linear(tmp_path):
    GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=99, n_positions=64)).save_pretrained(
        tmp_path / "gpt2"
    )
    gpt2 = quantized_layers(load_quantized(AutoModelForCausalLM, tmp_path / "gpt2", "torchao"))
    conv1d = [name for name in gpt2 if name.endswith(("c_attn", "c_proj", "c_fc"))]
    assert len(conv1d) == 2 * 4 and not any(gpt2[name] for name in conv1d)

    TurnerForCausalLM(text_config()).save_pretrained(tmp_path / "turner")
    turner = quantized_layers(load_quantized(AutoModelForCausalLM, tmp_path / "turner", "torchao"))
    linears = [name for name in turner if name.endswith(PROJECTIONS)]
    assert len(linears) == 2 * 4 and all(turner[name] for name in linears)


@pytest.mark.slow
@pytest.mark.parametrize("method", list(INT8))
def test_a_quickstart_model_keeps_its_held_out_loss_within_one_percent(method, tmp_path, monkeypatch):
    from benchmarks import bench_quantization

    from .workflow_utils import run_example

    run_example("quickstart.py", "--output-dir", "lm", "--max-steps", "100", "--max-new-tokens", "5", tmp_path=tmp_path)

    blocks = bench_quantization.held_out_blocks(tmp_path / "lm", 128)
    full = bench_quantization.held_out_loss(AutoModelForCausalLM.from_pretrained(tmp_path / "lm").eval(), blocks, 32)
    quantized = load_quantized(AutoModelForCausalLM, tmp_path / "lm", method)
    assert quantized_layers(quantized)["model.layers.0.self_attn.qkv_proj"]
    assert abs(bench_quantization.held_out_loss(quantized, blocks, 32) / full - 1) < 0.01
    assert full < 3.0  # it learned something: a uniform guess over ~100 characters costs 4.6
