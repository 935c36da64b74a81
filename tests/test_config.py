"""TurnerConfig: HF's standard fields, derived defaults, and a clear error for every invalid value (a ValueError and
huggingface_hub's strict-dataclass error), whether it is built with it, assigned it later, or saved with it."""

import dataclasses
import inspect
import json
import pickle
import re
import tempfile
from pathlib import Path

import pytest
import torch
from huggingface_hub.errors import StrictDataclassClassValidationError, StrictDataclassFieldValidationError
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from transformers import (
    AutoConfig,
    AutoModelForImageClassification,
    AutoModelForSequenceClassification,
    GPT2Config,
    PreTrainedConfig,
)
from transformers.activations import ACT2FN
from transformers.testing_utils import CaptureLogger
from transformers.utils import logging

from turner_tfm import TurnerConfig, TurnerForCausalLM, TurnerForImageClassification

from .tiny import image_config, random_ids, text_config


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
        ("pad_token_id", 1.5, "integer token id"),
        ("eos_token_id", [2, "3"], "integer token id"),
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
    assert "unknown fields ['hiden_size'] (did you mean ['hidden_size']?)" in captured.out


def test_refusals_are_value_errors_and_the_strict_dataclass_errors_transformers_configs_raise():
    with pytest.raises(StrictDataclassFieldValidationError) as field_error:
        text_config(hidden_dropout=7)
    with pytest.raises(StrictDataclassClassValidationError) as rule_error:
        text_config(hidden_size=30)
    for error in (field_error.value, rule_error.value):
        assert isinstance(error, ValueError)
        copied = pickle.loads(pickle.dumps(error))  # e.g. raised in a DataLoader worker
        assert type(copied) is type(error) and str(copied) == str(error)
    assert str(field_error.value) == "TurnerConfig: `hidden_dropout`=7 is invalid; it must be a probability in [0, 1)."


@pytest.mark.parametrize(
    ("field", "value", "allowed"),
    [
        ("hidden_dropout", 7, "probability in [0, 1)"),
        ("attention_dropout", -0.5, "probability in [0, 1)"),
        ("num_attention_heads", 0, "positive integer"),
        ("hidden_size", 32.0, "positive integer"),
        ("head_dim", -4, "positive integer"),
        ("norm_position", "middle", "choose one of ['pre', 'post']"),
        ("mlp_hidden_layers", 3, "choose one of [1, 2]"),
        ("classifier_pooling", "max", "choose one of ['cls', 'mean', 'last']"),
        ("use_pooler", "yes", "True or False"),
        ("hidden_act", "swishy", "gelu"),
        ("eos_token_id", "2", "token id"),
    ],
)
def test_an_invalid_assignment_after_construction_is_refused_at_once(field, value, allowed):
    config = text_config()
    before = getattr(config, field)
    with pytest.raises(StrictDataclassFieldValidationError) as error:
        setattr(config, field, value)
    assert isinstance(error.value, ValueError)
    assert f"`{field}`={value!r}" in str(error.value) and allowed in str(error.value)
    assert getattr(config, field) == before  # refused, not applied


@pytest.mark.parametrize(
    ("make", "changes", "field", "allowed"),
    [
        # the case: heads that no longer divide hidden_size=32, with K = D / H to be derived again
        (text_config, {"num_attention_heads": 5, "head_dim": None}, "hidden_size", "num_attention_heads=5"),
        (text_config, {"use_pooler": True}, "use_pooler", "classifier_pooling='cls'"),
        (text_config, {"classifier_pooling": "cls"}, "classifier_pooling", "is_causal=False"),
        (text_config, {"position_embedding_type": "rotary", "head_dim": 9}, "head_dim", "even head_dim"),
        (text_config, {"position_embedding_size": 8}, "position_embedding_size", "position_embedding_combine='add'"),
        (
            text_config,
            {"position_embedding_combine": "concat", "tie_word_embeddings": True},
            "tie_word_embeddings",
            "tie_word_embeddings=False",
        ),
        (image_config, {"patch_size": 5}, "patch_size", "divide image_size=16"),
        (image_config, {"max_position_embeddings": 64}, "max_position_embeddings", "17 positions"),
        (image_config, {"type_vocab_size": 2}, "type_vocab_size", "no token types"),
    ],
    ids=lambda value: "-".join(value) if isinstance(value, dict) else None,
)
def test_a_config_made_invalid_across_fields_is_refused_by_save_before_anything_is_written(
    make, changes, field, allowed, tmp_path
):
    config = make()
    for name, value in changes.items():
        setattr(config, name, value)  # each value alone is valid, so each assignment passes
    folder = tmp_path / "saved"
    with pytest.raises(StrictDataclassClassValidationError) as error:
        config.save_pretrained(folder)
    assert isinstance(error.value, ValueError)
    assert f"`{field}`" in str(error.value) and allowed in str(error.value)
    assert not (folder / "config.json").exists() and not folder.exists()
    with pytest.raises(ValueError, match=f"`{field}`"):
        config.validate()


@pytest.mark.parametrize("family", ["GPT-2", "Turner"])
def test_a_special_id_outside_the_vocabulary_gets_transformers_warning_and_saves_and_loads_as_gpt2s(family, tmp_path):
    """Issue 44, item 2: transformers warns of such an id (Hub configs hold pad_token_id=-1, a vocabulary resized below
    a special id keeps it); the input checks refuse it where a model would look it up."""
    make = GPT2Config if family == "GPT-2" else TurnerConfig
    logging.warning_once.cache_clear()  # transformers says each message once a process
    with CaptureLogger(logging.get_logger("transformers.configuration_utils")) as captured:
        config = make(vocab_size=10, pad_token_id=98, eos_token_id=[2, 3])
    assert "pad_token_id" in captured.out and "got 98" in captured.out
    config.vocab_size = 3  # as resize_token_embeddings sets it; transformers checks no id inside a list (eos 3)
    config.save_pretrained(tmp_path)
    loaded = AutoConfig.from_pretrained(tmp_path)
    assert (type(loaded), loaded.vocab_size, loaded.pad_token_id, loaded.eos_token_id) == (make, 3, 98, [2, 3])


def test_a_derived_field_set_back_to_none_is_derived_again_when_the_saved_config_loads(tmp_path):
    config = text_config()
    config.num_attention_heads, config.head_dim, config.intermediate_size = 8, None, None
    config.save_pretrained(tmp_path)
    loaded = AutoConfig.from_pretrained(tmp_path)
    assert (loaded.num_attention_heads, loaded.head_dim, loaded.intermediate_size) == (8, 4, 128)


# Issue 35, item 4: a config edited after it is built, or overridden by from_pretrained, builds the model the
# constructor builds from the same values, or is refused as the constructor refuses it.

TEXT = dict(vocab_size=99, num_hidden_layers=2, max_position_embeddings=64)


def fields_of(config: TurnerConfig) -> dict:
    """Turner's own fields (not `PreTrainedConfig`'s, such as `transformers_version`)."""
    base = {field.name for field in dataclasses.fields(PreTrainedConfig)}
    return {field.name: getattr(config, field.name) for field in dataclasses.fields(config) if field.name not in base}


def assert_same_model(edited: TurnerConfig, built: TurnerConfig) -> None:
    """Same parameter shapes, and the same logits once both hold the same weights."""
    torch.manual_seed(0)
    model, reference = TurnerForCausalLM(edited).eval(), TurnerForCausalLM(built).eval()
    shapes = {name: tensor.shape for name, tensor in reference.state_dict().items()}
    assert {name: tensor.shape for name, tensor in model.state_dict().items()} == shapes
    model.load_state_dict(reference.state_dict())
    ids = random_ids(2, 7)
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, reference(ids).logits, rtol=0, atol=0)


@pytest.mark.parametrize("loaded", [False, True], ids=["built", "saved-and-loaded"])
@pytest.mark.parametrize(
    "own",
    [{}, {"head_dim": 8}, {"intermediate_size": 37}, {"position_embedding_combine": "concat"}],
    ids=["all-derived", "own-head_dim", "own-intermediate_size", "concat"],
)
def test_assigning_width_and_heads_builds_the_model_the_constructor_builds(own, loaded, tmp_path):
    """`head_dim`, `intermediate_size` (and concatenated positions' width) follow D and H, unless they hold a value of
    their own; a folder saved with the derived values written out loads with them and follows edits the same way."""
    config = TurnerConfig(**TEXT, hidden_size=32, num_attention_heads=2, **own)
    if loaded:
        config.save_pretrained(tmp_path)
        assert json.loads((tmp_path / "config.json").read_text())["head_dim"] == config.head_dim
        config = AutoConfig.from_pretrained(tmp_path)
    config.hidden_size, config.num_attention_heads = 48, 4
    built = TurnerConfig(**TEXT, hidden_size=48, num_attention_heads=4, **own)
    assert (config.head_dim, config.intermediate_size) == (built.head_dim, built.intermediate_size)
    assert fields_of(config) == fields_of(built)
    assert_same_model(config, built)


def test_a_derived_field_assigned_none_is_derived_at_once():
    config = TurnerConfig(**TEXT, hidden_size=32, num_attention_heads=4, head_dim=16)
    config.head_dim = None
    assert config.head_dim == 8
    config.position_embedding_combine = None  # derived again from position_embedding_size (None): added positions
    assert config.position_embedding_combine == "add"


def test_from_pretrained_image_size_override_resizes_the_positions_as_vit_does(tmp_path):
    """The higher-resolution recipe: positions follow image_size / patch_size, and only they are re-initialised."""
    torch.manual_seed(0)
    source = TurnerForImageClassification(image_config()).eval()
    source.save_pretrained(tmp_path)
    model = AutoModelForImageClassification.from_pretrained(tmp_path, image_size=64, ignore_mismatched_sizes=True)
    assert (model.config.image_size, model.config.num_patches, model.config.max_position_embeddings) == (64, 256, 257)
    assert fields_of(model.config) == fields_of(image_config(image_size=64))
    with torch.no_grad():
        logits = model.eval()(pixel_values=torch.randn(2, 3, 64, 64)).logits
    assert logits.shape == (2, 3) and torch.isfinite(logits).all()
    weights = {name: tensor for name, tensor in source.state_dict().items() if "position" not in name}
    assert weights and all(torch.equal(model.state_dict()[name], tensor) for name, tensor in weights.items())


@pytest.fixture
def causal_lm_folder(tmp_path):
    TurnerForCausalLM(text_config()).save_pretrained(tmp_path)
    return tmp_path


@pytest.mark.parametrize(
    ("override", "field", "allowed"),
    [
        ({"classifier_pooling": "cls"}, "`classifier_pooling`='cls'", "attends only to itself"),
        ({"use_pooler": True}, "`use_pooler`=True", "it needs classifier_pooling='cls'"),
    ],
)
def test_a_classifier_reading_the_first_token_of_a_causal_folder_is_refused_on_load(
    causal_lm_folder, override, field, allowed
):
    """As `TurnerConfig(is_causal=True, **override)` is: the causal mask is the saved model's, and never flips."""
    with pytest.raises(ValueError) as constructor:
        text_config(is_causal=True, **override)
    with pytest.raises(ValueError) as loading:
        AutoModelForSequenceClassification.from_pretrained(causal_lm_folder, **override)
    assert field in str(loading.value) and allowed in str(loading.value)
    assert str(loading.value) == str(constructor.value)
    with pytest.raises(ValueError, match=field):
        AutoConfig.from_pretrained(causal_lm_folder, **override)


def test_a_bidirectional_override_lets_the_first_token_be_read(causal_lm_folder):
    config = AutoConfig.from_pretrained(causal_lm_folder, use_pooler=True, is_causal=False)
    assert (config.is_causal, config.classifier_pooling) == (False, "cls")
    assert fields_of(config) == fields_of(text_config(use_pooler=True))


@pytest.mark.parametrize(
    ("make", "positions"),
    [
        (text_config, 64),
        (lambda: text_config(position_embedding_type="sinusoidal"), None),
        (lambda: text_config(position_embedding_type="rotary"), None),
        (lambda: text_config(position_embedding_type="none"), None),
        (image_config, 17),
    ],
)
def test_max_positions_is_the_learned_table_or_no_limit(make, positions):
    assert make().max_positions == positions


# A strategy for each TurnerConfig field: values the field accepts on its own (some combinations are refused)
FIELD_VALUES = {
    "vocab_size": st.integers(3, 200),
    "hidden_size": st.sampled_from([8, 16, 24, 32, 48]),
    "num_hidden_layers": st.integers(1, 4),
    "num_attention_heads": st.sampled_from([1, 2, 4, 8]),
    "head_dim": st.none() | st.integers(1, 16),
    "intermediate_size": st.none() | st.integers(1, 100),
    "hidden_act": st.sampled_from(sorted(ACT2FN)),
    "max_position_embeddings": st.none() | st.integers(1, 4096),
    "layer_norm_eps": st.floats(min_value=1e-12, max_value=1.0) | st.integers(1, 3),
    "initializer_range": st.floats(min_value=1e-6, max_value=1.0) | st.just(1),
    "hidden_dropout": st.floats(min_value=0.0, max_value=1.0, exclude_max=True) | st.just(0),
    "attention_dropout": st.floats(min_value=0.0, max_value=1.0, exclude_max=True) | st.just(0),
    "classifier_dropout": st.floats(min_value=0.0, max_value=1.0, exclude_max=True) | st.just(0),
    "attention_bias": st.booleans(),
    "mlp_bias": st.booleans(),
    "is_causal": st.none() | st.booleans(),
    "position_embedding_type": st.sampled_from(["learned", "sinusoidal", "rotary", "none"]),
    "position_embedding_combine": st.sampled_from([None, "add", "concat"]),
    "position_embedding_size": st.none() | st.integers(1, 7),
    "rope_theta": st.floats(min_value=1.0, allow_infinity=True) | st.integers(1, 10**6),
    "share_query_key": st.booleans(),
    "normalization": st.sampled_from(["layernorm", "rmsnorm", "batchnorm"]),
    "norm_position": st.sampled_from(["pre", "post"]),
    "mlp_hidden_layers": st.sampled_from([1, 2]),
    "embedding_layer_norm": st.booleans(),
    "type_vocab_size": st.integers(0, 3),
    "use_padding_idx": st.booleans(),
    "classifier_pooling": st.sampled_from([None, "cls", "mean", "last"]),
    "use_pooler": st.booleans(),
    "image_size": st.none() | st.sampled_from([8, 16, 32]),
    "patch_size": st.sampled_from([1, 2, 4, 8]),
    "num_channels": st.integers(1, 4),
    "use_cache": st.booleans(),
    "check_input_values": st.booleans(),
    "tie_word_embeddings": st.none() | st.booleans(),
    "pad_token_id": st.none() | st.integers(0, 2),
    "bos_token_id": st.none() | st.integers(0, 2),
    "eos_token_id": st.none() | st.integers(0, 2) | st.lists(st.integers(0, 2), min_size=1, max_size=3),
}
FIELDS = sorted(FIELD_VALUES)
PROPERTY_SETTINGS = settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]
)


def test_every_field_has_a_strategy():
    ours = {field.name for field in dataclasses.fields(TurnerConfig)}
    assert set(FIELD_VALUES) == ours - {field.name for field in dataclasses.fields(PreTrainedConfig)}


def built(fields: dict) -> TurnerConfig | None:
    """TurnerConfig(**fields), or None where it refuses the combination."""
    try:
        return TurnerConfig(**fields)
    except ValueError:
        return None


@pytest.mark.parametrize("field", FIELDS)
@PROPERTY_SETTINGS
@given(data=st.data())
def test_whatever_a_valid_config_saves_loads_back_equal(field, data):
    """For every field, a valid config with it set (and a few others) round-trips save -> AutoConfig.from_pretrained."""
    others = data.draw(st.lists(st.sampled_from(FIELDS), max_size=3, unique=True), label="others")
    fields = {name: data.draw(FIELD_VALUES[name], label=name) for name in {field, *others}}
    config = built(fields)
    assume(config is not None)
    with tempfile.TemporaryDirectory() as folder:
        config.save_pretrained(folder)
        loaded = AutoConfig.from_pretrained(folder)
    assert isinstance(loaded, TurnerConfig)
    assert loaded.to_diff_dict() == config.to_diff_dict()


@pytest.mark.parametrize("field", FIELDS)
@PROPERTY_SETTINGS
@given(data=st.data())
def test_a_config_changed_after_construction_saves_only_what_loads(field, data):
    """Assign `field` any value it accepts on its own: save_pretrained either refuses, writing nothing, or writes a
    config that from_pretrained loads, with every field as it was (a derived one set to None is derived again)."""
    base = data.draw(st.lists(st.sampled_from(FIELDS), max_size=3, unique=True), label="fields built with")
    config = built({name: data.draw(FIELD_VALUES[name], label=name) for name in base})
    assume(config is not None)
    setattr(config, field, data.draw(FIELD_VALUES[field], label="new value"))
    with tempfile.TemporaryDirectory() as folder:
        try:
            config.save_pretrained(Path(folder) / "saved")
        except StrictDataclassClassValidationError as error:
            assert isinstance(error, ValueError) and str(error).startswith("TurnerConfig: `")
            assert not (Path(folder) / "saved").exists()
            with pytest.raises(ValueError):  # and only what from_pretrained would refuse
                TurnerConfig.from_dict(config.to_dict())
            return
        loaded = AutoConfig.from_pretrained(Path(folder) / "saved")
    for name in FIELDS:
        if getattr(config, name) is not None:
            assert getattr(loaded, name) == getattr(config, name), name


def test_the_docstring_documents_every_argument_in_order_with_its_default():
    """As LlamaConfig: `auto_docstring` puts each of Turner's fields under Args, in order, with its type, its default
    (none shown for None) and a meaning, in transformers' words for the standard fields and in ours for the rest; the
    arguments every config takes are documented by `PreTrainedConfig`. A field added without its entry (or an entry
    left behind) fails here, as does an argument neither documents (auto_docstring would leave it out)."""
    args = TurnerConfig.__doc__.split("\nArgs:\n", 1)[1].split("\n\n", 1)[0]
    entries = re.findall(r"^    (\w+) \((.+)\):\n((?:        .+\n?)+)", args, flags=re.MULTILINE)
    parameters = {
        name: parameter.default
        for name, parameter in inspect.signature(TurnerConfig.__init__).parameters.items()
        if name != "self"
    }
    common = [field.name for field in dataclasses.fields(PreTrainedConfig)]
    assert [name for name, _, _ in entries] == [name for name in parameters if name not in common]
    documented = [name for name in common if re.search(rf"^ +{name} \(", PreTrainedConfig.__doc__, re.MULTILINE)]
    assert set(common) - set(documented) == {"transformers_version"}  # written by save_pretrained, passed by no one
    for name, kind, meaning in entries:
        assert kind.startswith("`") and "*optional*" in kind and meaning.strip(), name
        shown = re.search(r"defaults to `(.*)`$", kind)
        default = parameters[name]  # transformers writes a string default without quotes, and None not at all
        allowed = {None, "None"} if default is None else {repr(default).replace("'", '"'), str(default)}
        assert (shown and shown.group(1)) in allowed, f"{name}: documented {shown and shown.group(1)}, is {default!r}"
