"""TurnerConfig: HF's standard fields, derived defaults, and a clear ValueError for every invalid value."""

import json

import pytest
from transformers import AutoConfig
from transformers.testing_utils import CaptureLogger
from transformers.utils import logging

from turner_tfm import TurnerConfig

from .tiny import image_config, text_config


def test_auto_config_builds_a_turner_config_with_derived_defaults():
    config = AutoConfig.for_model(
        "turner", vocab_size=1000, hidden_size=128, num_hidden_layers=4, num_attention_heads=4
    )
    assert isinstance(config, TurnerConfig)
    assert config.head_dim == 32
    assert config.intermediate_size == 512
    assert config.max_position_embeddings == 1024
    assert config.classifier_pooling == "last"


def test_pooling_default_follows_the_task():
    assert text_config(is_causal=False).classifier_pooling == "mean"
    assert image_config().classifier_pooling == "cls"


def test_the_mask_defaults_to_causal_for_text_and_full_for_images():
    assert text_config().is_causal is True
    image = TurnerConfig(hidden_size=32, num_attention_heads=4, image_size=16, patch_size=4)
    assert image.is_causal is False and image.classifier_pooling == "cls"
    assert image_config(is_causal=True).classifier_pooling == "last"


def test_a_classifier_reading_the_first_token_under_the_causal_mask_is_refused():
    with pytest.raises(ValueError, match="attends only to itself"):
        text_config(is_causal=True, classifier_pooling="cls")


def test_batchnorm_under_the_causal_mask_warns_that_training_leaks():
    logger = logging.get_logger("turner_tfm.configuration_turner")
    with CaptureLogger(logger) as captured:
        text_config(normalization="batchnorm")
    assert "causal mask is not airtight" in captured.out


def test_image_config_derives_its_positions():
    config = image_config()
    assert config.is_image_model
    assert config.num_patches == 16
    assert config.max_position_embeddings == 17


def test_explicit_head_dim_lifts_the_divisibility_rule():
    config = text_config(hidden_size=30, num_attention_heads=4, head_dim=8)
    assert config.head_dim == 8


def test_save_and_load_round_trip(tmp_path):
    config = text_config(position_embedding_type="sinusoidal", norm_position="post", type_vocab_size=2)
    config.save_pretrained(tmp_path)
    loaded = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(loaded, TurnerConfig)
    assert loaded.to_diff_dict() == config.to_diff_dict()
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "turner"


@pytest.mark.parametrize(
    ("field", "value", "allowed"),
    [
        ("hidden_size", 30, "divisible by num_attention_heads"),
        ("hidden_size", -8, "positive integer"),
        ("hidden_size", "big", "positive integer"),
        ("num_hidden_layers", 0, "positive integer"),
        ("num_attention_heads", 2.0, "positive integer"),
        ("vocab_size", True, "positive integer"),
        ("head_dim", 0, "positive integer"),
        ("intermediate_size", -1, "positive integer"),
        ("max_position_embeddings", 0, "positive integer"),
        ("type_vocab_size", -1, "integer >= 0"),
        ("hidden_dropout", 1.0, "probability"),
        ("attention_dropout", -0.1, "probability"),
        ("layer_norm_eps", 0.0, "positive number"),
        ("initializer_range", -0.02, "positive number"),
        ("is_causal", "yes", "True or False"),
        ("attention_bias", 1, "True or False"),
        ("position_embedding_type", "rope", "learned"),
        ("classifier_pooling", "max", "cls"),
        ("norm_position", "middle", "pre"),
        ("hidden_act", "swishy", "gelu"),
        ("pad_token_id", 99, "token id in [0, 99)"),
        ("eos_token_id", [2, -1], "token id in [0, 99)"),
        ("classifier_dropout", 1.0, "probability"),
        ("normalization", "groupnorm", "layernorm"),
        ("mlp_hidden_layers", 3, "[1, 2]"),
        ("mlp_hidden_layers", True, "[1, 2]"),
        ("position_embedding_combine", "multiply", "add"),
        ("rope_theta", 0.0, "positive number"),
    ],
)
def test_invalid_text_values_name_the_field_the_value_and_what_is_allowed(field, value, allowed):
    with pytest.raises(ValueError) as error:
        text_config(**{field: value})
    message = str(error.value)
    assert f"`{field}`={value!r}" in message
    assert allowed in message


@pytest.mark.parametrize(
    ("field", "value", "allowed"),
    [
        ("patch_size", 5, "divide image_size=16"),
        ("image_size", 0, "positive integer"),
        ("num_channels", 0, "positive integer"),
        ("max_position_embeddings", 64, "17 positions"),
        ("type_vocab_size", 2, "no token types"),
        ("embedding_layer_norm", True, "no embedding norm"),
    ],
)
def test_invalid_image_values_are_rejected(field, value, allowed):
    with pytest.raises(ValueError) as error:
        image_config(**{field: value})
    assert f"`{field}`={value!r}" in str(error.value)
    assert allowed in str(error.value)


@pytest.mark.parametrize(
    ("overrides", "field", "allowed"),
    [
        ({"position_embedding_type": "rotary", "hidden_size": 36, "head_dim": 9}, "head_dim", "even head_dim"),
        (
            {"position_embedding_type": "rotary", "position_embedding_combine": "concat"},
            "position_embedding_combine",
            "adds no vector",
        ),
        (
            {"position_embedding_combine": "concat", "tie_word_embeddings": False, "position_embedding_size": 32},
            "position_embedding_size",
            "below hidden_size=32",
        ),
        (
            {"position_embedding_combine": "concat", "tie_word_embeddings": True},
            "tie_word_embeddings",
            "tie_word_embeddings=False",
        ),
        (
            {"position_embedding_combine": "add", "position_embedding_size": 8},
            "position_embedding_size",
            "leave it None with position_embedding_combine='add'",
        ),
        ({"use_pooler": True, "is_causal": True}, "use_pooler", "classifier_pooling='cls'"),
        ({"classifier_pooling": "cls", "is_causal": True}, "classifier_pooling", "is_causal=False"),
    ],
)
def test_contradictory_switches_are_rejected(overrides, field, allowed):
    with pytest.raises(ValueError) as error:
        text_config(**overrides)
    assert f"`{field}`" in str(error.value) and allowed in str(error.value)


@pytest.mark.parametrize(
    ("switch", "implied"),
    [
        ({"position_embedding_combine": "concat"}, {"tie_word_embeddings": False, "position_embedding_size": 8}),
        ({"position_embedding_size": 4}, {"position_embedding_combine": "concat", "tie_word_embeddings": False}),
        ({"use_pooler": True}, {"is_causal": False, "classifier_pooling": "cls"}),
        ({"classifier_pooling": "cls"}, {"is_causal": False, "use_pooler": False}),
        ({}, {"is_causal": True, "classifier_pooling": "last", "tie_word_embeddings": True}),
    ],
)
def test_a_switch_alone_sets_the_defaults_it_implies(switch, implied, tmp_path):
    config = text_config(**switch)
    assert {name: getattr(config, name) for name in implied} == implied
    config.save_pretrained(tmp_path)
    reloaded = TurnerConfig.from_pretrained(tmp_path)
    assert {name: getattr(reloaded, name) for name in implied} == implied


def test_an_image_model_keeps_its_defaults_under_concatenated_positions():
    config = image_config(position_embedding_combine="concat")
    assert (config.is_causal, config.classifier_pooling, config.tie_word_embeddings) == (False, "cls", True)


def test_concatenated_positions_default_to_a_quarter_of_the_width():
    config = text_config(position_embedding_combine="concat", tie_word_embeddings=False)
    assert config.position_embedding_size == 8
    assert config.token_embedding_size == 24


def test_the_parallel_plans_are_built_from_the_config_not_passed_to_it():
    with pytest.raises(ValueError, match=r"\['base_model_tp_plan'\] are built from the config's own fields"):
        text_config(base_model_tp_plan={"layers.*.mlp.up_proj": "colwise"})


@pytest.mark.parametrize(
    "key",
    [
        "quantization_config",  # written by every quantizer
        "base_model_pp_plan",  # parallel plans
        "base_model_ep_plan",
        "distributed_config",
        "max_length",  # a generation parameter
        "attn_implementation",
        "torch_dtype",
        "_commit_hash",
        "auto_map",
    ],
)
def test_keys_transformers_reads_are_not_reported_as_unknown(key):
    logger = logging.get_logger("turner_tfm.configuration_turner")
    with CaptureLogger(logger) as captured:
        text_config(**{key: None, "hiden_size": 3})  # and one typo, which must be reported
    assert "unknown fields ['hiden_size']" in captured.out
