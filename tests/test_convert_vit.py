"""ViT <-> Turner: the same numbers, bit-exact round trips, and clear refusals."""

import re

import pytest
import torch
from transformers import ViTConfig, ViTForImageClassification, ViTModel

from convert import vit
from turner_tfm import TurnerConfig, TurnerForImageClassification, TurnerModel

from .convert_helpers import assert_same_outputs, assert_same_state_dict

IMAGE = 8
SOURCES = {
    "ViTModel with pooler": (lambda config: ViTModel(config), ("last_hidden_state", "pooler_output")),
    "ViTModel without pooler": (lambda config: ViTModel(config, add_pooling_layer=False), ("last_hidden_state",)),
    "ViTForImageClassification": (lambda config: ViTForImageClassification(config), ("logits",)),
}


def vit_config(**overrides) -> ViTConfig:
    defaults = dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=24, num_labels=3)
    return ViTConfig(**{**defaults, "image_size": IMAGE, "patch_size": 4, **overrides})


def pixels(batch: int = 2, channels: int = 3) -> dict[str, torch.Tensor]:
    return {"pixel_values": torch.randn(batch, channels, IMAGE, IMAGE)}


@pytest.mark.parametrize("source", list(SOURCES))
def test_outputs_match(source):
    build, outputs = SOURCES[source]
    model = build(vit_config(hidden_act="gelu_new", layer_norm_eps=1e-6))
    turner = vit.CONVERTER.model_to_turner(model)
    assert turner.config.use_pooler is (model.state_dict().get("pooler.dense.weight") is not None)
    assert_same_outputs(model, turner, pixels(), outputs)


@pytest.mark.parametrize("source", list(SOURCES))
def test_round_trip_reproduces_every_tensor(source):
    model = SOURCES[source][0](vit_config())
    back = vit.CONVERTER.model_from_turner(vit.CONVERTER.model_to_turner(model), type(model).__name__)
    assert type(back) is type(model)
    assert_same_state_dict(model, back)


def test_pure_map_turns_positions_into_an_embedding_table():
    model = ViTForImageClassification(vit_config())
    state, config = vit.to_turner(model.state_dict(), model.config, "ViTForImageClassification")
    positions = model.vit.embeddings.position_embeddings
    assert positions.shape == (1, 5, 16)
    assert torch.equal(state["model.embeddings.embed_positions.weight"], positions[0])
    assert torch.equal(state["model.embeddings.cls_token"], model.vit.embeddings.cls_token)
    assert (config.image_size, config.patch_size, config.num_patches, config.max_position_embeddings) == (8, 4, 4, 5)
    assert (config.is_causal, config.classifier_pooling, config.use_pooler, config.num_labels) == (
        False,
        "cls",
        False,
        3,
    )
    back, back_config = vit.from_turner(state, config, "ViTForImageClassification")
    assert back["vit.embeddings.position_embeddings"].shape == (1, 5, 16)
    assert (back_config.image_size, back_config.qkv_bias, back_config.id2label) == (8, True, model.config.id2label)


def test_one_channel_images_and_square_pairs_convert():
    model = ViTForImageClassification(vit_config(num_channels=1, image_size=[IMAGE, IMAGE], patch_size=(4, 4)))
    turner = vit.CONVERTER.model_to_turner(model)
    assert (turner.config.num_channels, turner.config.image_size, turner.config.patch_size) == (1, IMAGE, 4)
    assert_same_outputs(model, turner, pixels(channels=1), ("logits",))


@pytest.mark.parametrize(
    ("option", "value", "source"),
    [
        ("qkv_bias", False, "ViTModel with pooler"),
        ("image_size", (8, 16), "ViTModel with pooler"),
        ("pooler_act", "relu", "ViTModel with pooler"),
        ("pooler_output_size", 8, "ViTModel with pooler"),
        ("head_dim", 4, "ViTModel with pooler"),
    ],
)
def test_options_turner_cannot_express_are_refused(option, value, source):
    config = vit_config(**{option: value})
    model = SOURCES[source][0](config)
    with pytest.raises(ValueError, match=re.escape(f"`{option}`={value!r}")):
        vit.to_turner(model.state_dict(), config, type(model).__name__)


def test_pooler_options_do_not_matter_without_a_pooler():
    model = ViTModel(vit_config(pooler_act="relu"), add_pooling_layer=False)
    assert vit.CONVERTER.model_to_turner(model).config.use_pooler is False


def test_mask_token_has_no_counterpart():
    model = ViTModel(vit_config(), use_mask_token=True)
    with pytest.raises(ValueError, match=r"no counterpart: \['embeddings.mask_token'\]"):
        vit.to_turner(model.state_dict(), model.config, "ViTModel")


def turner_image_config(**overrides) -> TurnerConfig:
    defaults = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, image_size=IMAGE, patch_size=4)
    return TurnerConfig(**{**defaults, "is_causal": False, **overrides})


@pytest.mark.parametrize(
    ("option", "value", "architecture"),
    [
        ("norm_position", "post", "ViTModel"),
        ("is_causal", True, "ViTModel"),
        ("attention_bias", False, "ViTModel"),
        ("mlp_bias", False, "ViTModel"),
        ("position_embedding_type", "none", "ViTModel"),
        ("use_pooler", True, "ViTForImageClassification"),
        ("classifier_pooling", "mean", "ViTForImageClassification"),
    ],
)
def test_reverse_refuses_what_vit_cannot_express(option, value, architecture):
    pooling = {"classifier_pooling": "cls"} if option == "use_pooler" else {}
    config = turner_image_config(**pooling, **{option: value})
    model = vit.CONVERTER.head(architecture).turner_class(config)
    with pytest.raises(ValueError, match=re.escape(f"`{option}`={value!r}")):
        vit.from_turner(model.state_dict(), config, architecture)


def test_reverse_refuses_a_text_model():
    config = TurnerConfig(vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, is_causal=False)
    with pytest.raises(ValueError, match=re.escape("`image_size`=None")):
        vit.from_turner(TurnerModel(config).state_dict(), config, "ViTModel")


def test_turner_classes_map_back_to_vit_classes():
    assert vit.CONVERTER.architecture_for(TurnerForImageClassification.__name__) == "ViTForImageClassification"
    with pytest.raises(ValueError, match=r"'TurnerForCausalLM' has no ViT counterpart"):
        vit.CONVERTER.architecture_for("TurnerForCausalLM")
