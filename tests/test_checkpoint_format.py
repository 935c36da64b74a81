"""The stacked `qkv_proj` on disk, and checkpoints of earlier Turners (separate `q_proj`, `k_proj`, `v_proj`):
they load stacked, give the same numbers, and are re-saved stacked; a projection missing or out of place is
refused by name."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers.testing_utils import CaptureLogger, LoggingLevel
from transformers.utils import logging

from turner_tfm import TurnerForCausalLM

from .tiny import random_ids, text_config, write_separate_projections


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


@pytest.mark.parametrize("share_query_key", [False, True])
def test_an_earlier_turners_separate_projections_load_stacked(tmp_path, share_query_key):
    model, folder = saved(tmp_path, share_query_key=share_query_key)
    stacked_names = set(load_file(folder / "model.safetensors"))
    write_separate_projections(folder, share_query_key)
    assert "model.layers.0.self_attn.q_proj.weight" in load_file(folder / "model.safetensors")
    loaded, info = TurnerForCausalLM.from_pretrained(folder, output_loading_info=True)
    assert not any(info.values()), info
    ids = random_ids(2, 10)
    with torch.no_grad():
        assert torch.equal(loaded.eval()(ids).logits, model(ids).logits)
    loaded.save_pretrained(tmp_path / "again")
    assert set(load_file(tmp_path / "again" / "model.safetensors")) == stacked_names


@pytest.mark.parametrize(
    ("share_query_key", "dropped", "reported"),
    [
        (False, "v_proj", "the checkpoint has no ['self_attn.v_proj'] to stack into model.layers.1.self_attn.qkv_proj"),
        (True, None, "the checkpoint has ['self_attn.k_proj'], but the config has share_query_key=True"),
    ],
)
def test_separate_projections_that_do_not_fit_the_config_are_refused_by_name(
    tmp_path, share_query_key, dropped, reported
):
    """Stacked, a missing projection (or a k_proj that shared queries and keys have no place for) would make a
    matrix of the wrong height: loading stops, and the load report names the projection."""
    _, folder = saved(tmp_path)
    write_separate_projections(folder)
    if dropped:
        tensors = load_file(folder / "model.safetensors")
        del tensors[f"model.layers.1.self_attn.{dropped}.weight"]
        save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "share_query_key": share_query_key}))
    logger = logging.get_logger("transformers.modeling_utils")
    refused = pytest.raises(RuntimeError, match="conversion")
    with LoggingLevel(logging.WARNING), CaptureLogger(logger) as report, refused:  # the load report is a warning
        TurnerForCausalLM.from_pretrained(folder)
    assert reported in report.out
