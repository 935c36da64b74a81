"""The block's projections are stored input-major (`layout_turner.py`): still `nn.Linear` of shape `(out, in)`, and
every tool a weight goes through keeps working beside a normally laid twin of the same values. Tensor parallel,
FSDP, quantization, export and the converters are checked in their own files."""

import copy
import json
import textwrap

import pytest
import torch
from accelerate import Accelerator
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file, save_model
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel

from convert import gpt2
from turner_tfm import TurnerForCausalLM, TurnerModel
from turner_tfm.layout_turner import BLOCK_PROJECTIONS, is_input_major

from .isolated import run_isolated
from .tiny import random_ids, text_config


def laid_out(model: nn.Module) -> dict[str, nn.Module]:
    """The block projections, stored input-major: `qkv_proj`, `o_proj`, `up_proj`, `down_proj` (and `hidden_proj`)."""
    return {name: module for name, module in model.named_modules() if name.rpartition(".")[2] in BLOCK_PROJECTIONS}


def assert_stored_input_major(model: nn.Module, per_block: int = 4) -> None:
    projections = laid_out(model)
    assert len(projections) == per_block * model.config.num_hidden_layers, sorted(projections)
    for name, module in projections.items():
        assert type(module) is nn.Linear, (name, type(module))
        assert module.weight.shape == (module.out_features, module.in_features), name
        assert is_input_major(module.weight) and not module.weight.is_contiguous(), (name, module.weight.stride())
    weights = {f"{name}.weight" for name in projections}
    others = [name for name, p in model.named_parameters() if name not in weights and not p.is_contiguous()]
    assert not others, others


def normally_laid(model: TurnerForCausalLM) -> TurnerForCausalLM:
    """A copy of `model` whose block projections are contiguous `(out, in)`, as `nn.Linear` makes them."""
    twin = copy.deepcopy(model)
    for module in laid_out(twin).values():
        module.weight = nn.Parameter(module.weight.detach().contiguous())
    return twin


@pytest.fixture
def model() -> TurnerForCausalLM:
    torch.manual_seed(0)
    return TurnerForCausalLM(text_config())


def test_block_projections_are_linear_out_in_stored_input_major_and_nothing_else(model):
    assert_stored_input_major(model)
    assert_stored_input_major(TurnerModel(text_config(mlp_hidden_layers=2)), per_block=5)


def test_saved_files_are_a_normally_laid_models_bytes_and_a_reload_is_laid_again(model, tmp_path):
    model.save_pretrained(tmp_path / "input_major")
    normally_laid(model).save_pretrained(tmp_path / "normal")
    saved = (tmp_path / "input_major" / "model.safetensors").read_bytes()
    assert saved == (tmp_path / "normal" / "model.safetensors").read_bytes()

    reloaded, info = TurnerForCausalLM.from_pretrained(tmp_path / "input_major", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert_stored_input_major(reloaded)
    ids = random_ids(2, 7)
    torch.testing.assert_close(reloaded(ids).logits, model.eval()(ids).logits, rtol=0, atol=0)


def test_every_state_dict_writer_takes_the_model(model, tmp_path):
    """safetensors' own writer and accelerate's `save_model` refuse a non-contiguous tensor: the state dict hands out
    contiguous copies, and the parameters (`keep_vars=True`) as they are."""
    save_model(model, tmp_path / "plain.safetensors", force_contiguous=False)
    Accelerator(cpu=True).save_model(model, tmp_path / "accelerate")
    expected = {name: tensor.contiguous() for name, tensor in normally_laid(model).state_dict().items()}
    for written in (tmp_path / "plain.safetensors", tmp_path / "accelerate" / "model.safetensors"):
        tensors = load_file(written)
        assert tensors.keys() <= expected.keys()
        assert all(torch.equal(tensors[name], expected[name]) for name in tensors), written
    assert all(not p.is_contiguous() for p in model.state_dict(keep_vars=True).values() if is_input_major(p))
    assert_stored_input_major(model)


REMOTE_LAYOUT = textwrap.dedent(
    """
    import json, sys
    sys.modules["turner_tfm"] = None
    import torch, transformers
    model = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True)
    assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
    strides = {name: list(p.stride()) for name, p in model.named_parameters()}
    with torch.no_grad():
        logits = model(torch.tensor(json.loads(sys.argv[2]))).logits
    torch.save({"strides": strides, "logits": logits}, sys.argv[3])
    """
)


def test_remote_code_stores_the_block_projections_input_major_too(model, tmp_path):
    model.save_pretrained(tmp_path / "saved")
    ids = random_ids(2, 5)
    run_isolated(REMOTE_LAYOUT, [str(tmp_path / "saved"), json.dumps(ids.tolist()), str(tmp_path / "out.pt")], tmp_path)
    remote = torch.load(tmp_path / "out.pt")
    assert remote["strides"] == {name: list(p.stride()) for name, p in model.named_parameters()}
    torch.testing.assert_close(remote["logits"], model.eval()(ids).logits)


def train(model: TurnerForCausalLM, steps: int = 3) -> torch.optim.AdamW:
    torch.manual_seed(1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for step in range(steps):
        ids = random_ids(4, 9, seed=step)
        model(ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
    return optimizer


def test_training_steps_match_a_normally_laid_twin_and_keep_the_layout(model):
    twin = normally_laid(model)
    optimizer, twin_optimizer = train(model), train(twin)
    assert_stored_input_major(model)
    for (name, p), q in zip(model.named_parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(p, q, msg=name)
        state = optimizer.state[p]
        for tensor in (p.grad, state["exp_avg"], state["exp_avg_sq"]):  # each follows its parameter's layout
            assert tensor.stride() == p.stride(), (name, tensor.stride(), p.stride())
        torch.testing.assert_close(state["exp_avg_sq"], twin_optimizer.state[q]["exp_avg_sq"], msg=name)


@pytest.mark.parametrize("convert", ["half", "bfloat16", "to"])
def test_dtype_conversions_keep_the_layout(model, convert):
    ids = random_ids(1, 6)
    expected = model.eval()(ids).logits
    converted = model.to(torch.bfloat16) if convert == "to" else getattr(model, convert)()
    assert_stored_input_major(converted)
    torch.testing.assert_close(converted(ids).logits.float(), expected, rtol=0.05, atol=0.05)


def test_resizing_the_vocabulary_leaves_the_block_laid_out(model):
    model.resize_token_embeddings(131)
    assert model.get_input_embeddings().weight.shape == (131, model.config.hidden_size)
    assert model.lm_head.weight.shape == (131, model.config.hidden_size)
    assert_stored_input_major(model)


def test_lora_trains_and_merges_like_on_a_normally_laid_twin(model):
    def lora(base: TurnerForCausalLM) -> nn.Module:
        config = LoraConfig(r=4, lora_alpha=8, target_modules=sorted(BLOCK_PROJECTIONS - {"hidden_proj"}))
        torch.manual_seed(2)
        peft_model = get_peft_model(base, config)
        train(peft_model)
        return peft_model.merge_and_unload()

    twin = lora(normally_laid(model))
    merged = lora(model)
    assert_stored_input_major(merged)
    ids = random_ids(2, 6)
    torch.testing.assert_close(merged.eval()(ids).logits, twin.eval()(ids).logits)


@pytest.mark.torch_2_13(reason="the quant extra's torchao needs it")
def test_torchao_quantizes_a_built_model_as_it_does_a_normally_laid_twin(model):
    """From a checkpoint the quantizers see contiguous tensors (tests/test_quantization.py); `quantize_` on a model in
    memory sees the input-major ones."""
    import torchao

    twin = normally_laid(model)
    for quantized in (model, twin):
        torchao.quantization.quantize_(quantized, torchao.quantization.Int8WeightOnlyConfig())
    for name, module in laid_out(model).items():
        assert "Int8" in type(module.weight).__name__, name
        twin_weight = twin.get_submodule(name).weight
        torch.testing.assert_close(module.weight.dequantize(), twin_weight.dequantize(), rtol=0, atol=0, msg=name)
    ids = random_ids(2, 6)
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(ids).logits, twin.eval()(ids).logits)


def test_under_a_process_group_the_weights_keep_linears_layout_for_fsdp(tmp_path):
    """FSDP2's `fully_shard` refuses non-contiguous parameters: a model made or loaded in a distributed job keeps
    `nn.Linear`'s layout (tests/test_parallel.py shards such models across processes)."""
    torch.manual_seed(0)
    TurnerForCausalLM(text_config()).save_pretrained(tmp_path)
    store = torch.distributed.FileStore(str(tmp_path / "store"), 1)
    torch.distributed.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        for model in (TurnerForCausalLM(text_config()), TurnerForCausalLM.from_pretrained(tmp_path)):
            assert all(module.weight.is_contiguous() for module in laid_out(model).values())
            torch.distributed.fsdp.fully_shard(model)
    finally:
        torch.distributed.destroy_process_group()
    assert_stored_input_major(TurnerForCausalLM.from_pretrained(tmp_path))


def test_a_model_built_under_a_launcher_before_the_group_starts_keeps_linears_layout(monkeypatch):
    """torchrun and accelerate launch set WORLD_SIZE before a script builds its model, which may come before the
    `Trainer`'s arguments start the process group and FSDP wraps it."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    model = TurnerForCausalLM(text_config())
    assert all(module.weight.is_contiguous() for module in laid_out(model).values())
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert_stored_input_major(TurnerForCausalLM(text_config()))


def test_converted_models_are_stored_input_major_and_convert_back_exactly():
    torch.manual_seed(0)
    source = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_embd=16, n_layer=2, n_head=2))
    turner = gpt2.CONVERTER.model_to_turner(source)
    assert_stored_input_major(turner)
    back = gpt2.CONVERTER.model_from_turner(turner, "GPT2LMHeadModel")
    assert all(torch.equal(back.state_dict()[name], t) for name, t in source.state_dict().items())
