"""Every parameter is what an in-library model's is (issue 66): `nn.Linear`'s `(out, in)` weight, contiguous, on every
path a model is made or loaded by, as transformers' own `test_load_contiguous_weights` asks; and the tools that
assume it (fused AdamW resumed into another build, `parameters_to_vector`, pruning, LBFGS) work as they do for GPT-2.
"""

import copy

import pytest
import torch
from safetensors.torch import load_file
from torch import nn
from torch.nn.utils import prune
from transformers import (
    AutoModelForCausalLM,
    BertConfig,
    BertForMaskedLM,
    GPT2Config,
    GPT2LMHeadModel,
    ViTConfig,
    ViTForImageClassification,
)

import turner_tfm
from convert import bert, gpt2, vit

from .tiny import image_config, random_ids, text_config

TEXT_CLASSES = [
    turner_tfm.TurnerModel,
    turner_tfm.TurnerForCausalLM,
    turner_tfm.TurnerForSequenceClassification,
    turner_tfm.TurnerForTokenClassification,
    turner_tfm.TurnerForQuestionAnswering,
]


def assert_contiguous(model: nn.Module) -> None:
    strided = {name: p.stride() for name, p in model.named_parameters() if not p.is_contiguous()}
    assert not strided, strided
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            assert module.weight.shape == (module.out_features, module.in_features), name


def built_models():
    """Every head, in the default config and with each switch that changes which weights are made."""
    for model_class in TEXT_CLASSES:
        yield model_class(text_config())
    yield turner_tfm.TurnerForMaskedLM(text_config(is_causal=False))
    yield turner_tfm.TurnerForImageClassification(image_config())
    yield turner_tfm.TurnerForCausalLM(
        text_config(share_query_key=True, mlp_hidden_layers=2, position_embedding_size=8)
    )


def test_every_parameter_is_contiguous_when_built_and_when_loaded(tmp_path):
    for index, model in enumerate(built_models()):
        assert_contiguous(model)
        model.save_pretrained(tmp_path / str(index))
        assert_contiguous(type(model).from_pretrained(tmp_path / str(index)))
        assert_contiguous(type(model)._from_config(model.config))


def test_the_remote_code_and_the_auto_class_load_contiguous_weights(tmp_path):
    turner_tfm.TurnerForCausalLM(text_config()).save_pretrained(tmp_path)
    for trust_remote_code in (False, True):
        assert_contiguous(AutoModelForCausalLM.from_pretrained(tmp_path, trust_remote_code=trust_remote_code))


def test_conversions_moves_and_resizes_keep_weights_contiguous():
    model = turner_tfm.TurnerForCausalLM(text_config())
    assert_contiguous(model.to(torch.bfloat16))
    assert_contiguous(model.half())
    model.resize_token_embeddings(131)
    assert_contiguous(model)
    gpt2_model = GPT2LMHeadModel(
        GPT2Config(vocab_size=64, bos_token_id=1, eos_token_id=2, n_positions=32, n_embd=16, n_layer=2, n_head=2)
    )
    bert_model = BertForMaskedLM(
        BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32)
    )
    vit_model = ViTForImageClassification(
        ViTConfig(image_size=8, patch_size=4, hidden_size=16, num_hidden_layers=2, num_attention_heads=2)
    )
    for converter, source in ((gpt2, gpt2_model), (bert, bert_model), (vit, vit_model)):
        assert_contiguous(converter.CONVERTER.model_to_turner(source))


def test_a_launchers_world_size_does_not_change_how_a_model_is_built(monkeypatch):
    torch.manual_seed(0)
    alone = turner_tfm.TurnerForCausalLM(text_config())
    monkeypatch.setenv("WORLD_SIZE", "2")
    torch.manual_seed(0)
    launched = turner_tfm.TurnerForCausalLM(text_config())
    for (name, p), q in zip(alone.named_parameters(), launched.parameters(), strict=True):
        assert p.stride() == q.stride() and torch.equal(p, q), name


def train_steps(model: nn.Module, optimizer: torch.optim.Optimizer, first: int, last: int) -> None:
    model.train()
    for step in range(first, last):
        ids = random_ids(4, 9, seed=step)
        model(ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def rebuilt(folder, build: str) -> turner_tfm.TurnerForCausalLM:
    """The saved model made again: by `from_pretrained` (a resumed `Trainer`), or on the meta device and then
    assigned its weights (`load_state_dict(assign=True)`, as FSDP and accelerate's big-model loading do)."""
    if build == "from_pretrained":
        return turner_tfm.TurnerForCausalLM.from_pretrained(folder)
    with torch.device("meta"):
        model = turner_tfm.TurnerForCausalLM(text_config())
    model.load_state_dict(load_file(folder / "model.safetensors"), strict=False, assign=True)
    model.tie_weights()
    return model


@pytest.mark.parametrize("build", ["from_pretrained", "meta_assign"])
@pytest.mark.parametrize("fused", [False, True])
def test_fused_adamw_resumed_into_another_build_trains_as_uninterrupted(tmp_path, fused, build):
    """The optimizer state saved from one model and loaded into another made by other means continues exactly:
    torch's fused kernel assumes a state laid out as its parameter."""
    torch.manual_seed(0)
    model = turner_tfm.TurnerForCausalLM(text_config())
    uninterrupted = copy.deepcopy(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=fused)
    train_steps(model, optimizer, 0, 3)
    model.save_pretrained(tmp_path)
    torch.save(optimizer.state_dict(), tmp_path / "optimizer.pt")

    resumed = rebuilt(tmp_path, build)
    resumed_optimizer = torch.optim.AdamW(resumed.parameters(), lr=1e-2, fused=fused)
    resumed_optimizer.load_state_dict(torch.load(tmp_path / "optimizer.pt"))
    train_steps(resumed, resumed_optimizer, 3, 6)
    reference = torch.optim.AdamW(uninterrupted.parameters(), lr=1e-2, fused=fused)
    train_steps(uninterrupted, reference, 0, 6)
    for (name, p), q in zip(resumed.named_parameters(), uninterrupted.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-6, msg=name)


def test_tools_that_view_parameters_flat_work_as_on_gpt2():
    model = turner_tfm.TurnerForCausalLM(text_config())
    ids = random_ids(2, 6)
    model(ids, labels=ids).loss.backward()
    flat = nn.utils.parameters_to_vector(model.parameters())
    assert flat.numel() == sum(p.numel() for p in model.parameters())
    assert all(p.grad is None or p.grad.view(-1).numel() == p.numel() for p in model.parameters())

    optimizer = torch.optim.LBFGS(model.parameters(), max_iter=2)

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = model(ids, labels=ids).loss
        loss.backward()
        return loss

    before = closure().item()
    optimizer.step(closure)
    assert model(ids, labels=ids).loss.item() < before

    projection = model.model.layers[0].mlp.up_proj
    prune.l1_unstructured(projection, "weight", amount=0.5)
    assert (projection.weight == 0).float().mean().item() == pytest.approx(0.5, abs=0.01)
