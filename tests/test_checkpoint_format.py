"""The stacked `qkv_proj` on disk, read and written as it is."""

import pytest
import torch
from safetensors.torch import load_file
from transformers.conversion_mapping import get_model_conversion_mapping

from turner_tfm import TurnerForCausalLM, TurnerForSequenceClassification, TurnerModel

from .tiny import text_config, write_separate_projections


def saved(tmp_path, **overrides) -> tuple[TurnerForCausalLM, object]:
    torch.manual_seed(0)
    model = TurnerForCausalLM(text_config(**overrides)).eval()
    model.save_pretrained(tmp_path / "model")
    return model, tmp_path / "model"


@pytest.mark.parametrize("share_query_key", [False, True])
def test_qkv_proj_is_saved_stacked_in_q_k_v_order(tmp_path, share_query_key):
    model, folder = saved(tmp_path, share_query_key=share_query_key)
    tensors = load_file(folder / "model.safetensors")
    attention = model.model.layers[1].self_attn
    assert not any("q_proj" in name or "k_proj" in name or "v_proj" in name for name in tensors if "qkv" not in name)
    assert torch.equal(tensors["model.layers.1.self_attn.qkv_proj.weight"], attention.qkv_proj.weight)
    assert attention.qkv_proj.out_features == (2 if share_query_key else 3) * 32


def test_no_conversion_mapping_is_registered_for_turner_checkpoints(tmp_path):
    """Checkpoints hold `qkv_proj` as saved, with nothing renamed or stacked on the way in or out: a file with
    separate `q_proj`, `k_proj` and `v_proj` (a layout no published Turner checkpoint used) is reported by the load
    as missing and unexpected keys, not converted."""
    _, folder = saved(tmp_path)
    write_separate_projections(folder)
    _, info = TurnerForCausalLM.from_pretrained(folder, output_loading_info=True)
    assert "model.layers.1.self_attn.qkv_proj.weight" in info["missing_keys"]
    assert "model.layers.1.self_attn.v_proj.weight" in info["unexpected_keys"]


@pytest.mark.parametrize("model_class", [TurnerModel, TurnerForCausalLM, TurnerForSequenceClassification])
def test_transformers_finds_no_conversion_mapping_for_any_turner_class(model_class):
    """transformers' reverse-loading test (`ModelTesterMixin.test_reverse_loading_mapping`) requires every registered
    mapping to change the saved keys; Turner registers none, so the saved keys are the model's own."""
    model = model_class(text_config(is_causal=model_class is TurnerForCausalLM))
    assert get_model_conversion_mapping(model, add_legacy=False) == []
