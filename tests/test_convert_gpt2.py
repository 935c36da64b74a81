"""GPT-2 <-> Turner: the same numbers and tokens, bit-exact round trips, and clear refusals."""

import re

import pytest
import torch
from transformers import (
    GPT2Config,
    GPT2ForQuestionAnswering,
    GPT2ForSequenceClassification,
    GPT2ForTokenClassification,
    GPT2LMHeadModel,
    GPT2Model,
)

from convert import gpt2
from convert.cli import main
from turner_tfm import (
    TurnerConfig,
    TurnerForCausalLM,
    TurnerForQuestionAnswering,
    TurnerForSequenceClassification,
    TurnerForTokenClassification,
    TurnerModel,
)

from .convert_helpers import assert_same_outputs, assert_same_state_dict, masked_ids

VOCAB = 64
HEADS = [
    (GPT2Model, TurnerModel, ("last_hidden_state",)),
    (GPT2LMHeadModel, TurnerForCausalLM, ("logits",)),
    (GPT2ForSequenceClassification, TurnerForSequenceClassification, ("logits",)),
    (GPT2ForTokenClassification, TurnerForTokenClassification, ("logits",)),
    (GPT2ForQuestionAnswering, TurnerForQuestionAnswering, ("start_logits", "end_logits")),
]
VARIANTS = {
    "defaults": {},
    "relu, n_inner, eps, untied head": {
        "activation_function": "relu",
        "n_inner": 24,
        "layer_norm_epsilon": 1e-3,
        "tie_word_embeddings": False,
    },
}


def gpt2_config(**overrides) -> GPT2Config:
    defaults = dict(vocab_size=VOCAB, n_positions=32, n_embd=16, n_layer=2, n_head=2, num_labels=3)
    return GPT2Config(**defaults, pad_token_id=0, bos_token_id=1, eos_token_id=2, **overrides)


def turner_text_config(**overrides) -> TurnerConfig:
    defaults = dict(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2)
    return TurnerConfig(**{**defaults, "max_position_embeddings": 32, **overrides})


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize(("source_class", "turner_class", "outputs"), HEADS)
def test_outputs_match_on_a_padded_batch(source_class, turner_class, outputs, variant):
    source = source_class(gpt2_config(**VARIANTS[variant]))
    turner = gpt2.CONVERTER.model_to_turner(source)
    assert type(turner) is turner_class
    assert_same_outputs(source, turner, masked_ids(VOCAB, 0, (7, 4, 1)), outputs)


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("source_class", [head[0] for head in HEADS])
def test_round_trip_reproduces_every_tensor(source_class, variant):
    source = source_class(gpt2_config(**VARIANTS[variant]))
    back = gpt2.CONVERTER.model_from_turner(gpt2.CONVERTER.model_to_turner(source), source_class.__name__)
    assert type(back) is source_class
    assert_same_state_dict(source, back)


def test_pure_map_stacks_c_attn_as_qkv_proj_and_transposes_conv1d():
    source = GPT2Model(gpt2_config())
    state, config = gpt2.to_turner(source.state_dict(), source.config, "GPT2Model")
    c_attn = source.h[1].attn.c_attn
    assert torch.equal(state["layers.1.self_attn.qkv_proj.weight"][16:32], c_attn.weight[:, 16:32].t())  # keys
    assert torch.equal(state["layers.1.self_attn.qkv_proj.bias"][32:], c_attn.bias[32:])  # values
    assert torch.equal(state["layers.1.mlp.up_proj.weight"], source.h[1].mlp.c_fc.weight.t())
    assert (config.hidden_act, config.intermediate_size, config.layer_norm_eps) == ("gelu_new", 64, 1e-5)
    assert (config.is_causal, config.norm_position, config.architectures) == (True, "pre", ["TurnerModel"])
    back, back_config = gpt2.from_turner(state, config, "GPT2Model")
    assert all(torch.equal(back[key], tensor) for key, tensor in source.state_dict().items())
    assert (back_config.n_embd, back_config.n_head, back_config.activation_function) == (16, 2, "gelu_new")


@pytest.mark.parametrize("tied", [True, False])
def test_head_is_tied_exactly_when_the_source_is(tied):
    turner = gpt2.CONVERTER.model_to_turner(GPT2LMHeadModel(gpt2_config(tie_word_embeddings=tied)))
    shared = turner.lm_head.weight.data_ptr() == turner.model.embeddings.embed_tokens.weight.data_ptr()
    assert shared is tied


def test_greedy_generation_gives_the_same_tokens():
    source = GPT2LMHeadModel(gpt2_config()).eval()
    source.generation_config.repetition_penalty = 1.3
    turner = gpt2.CONVERTER.model_to_turner(source)
    assert turner.generation_config.repetition_penalty == 1.3
    batch = {name: tensor.flip(1) for name, tensor in masked_ids(VOCAB, 0, (6, 3)).items()}  # left padding
    settings = dict(max_new_tokens=12, do_sample=False, min_new_tokens=12)
    expected = source.generate(**batch, **settings)
    assert torch.equal(turner.generate(**batch, **settings), expected)


def test_dtype_is_kept_both_ways():
    source = GPT2LMHeadModel(gpt2_config()).to(torch.bfloat16)
    turner = gpt2.CONVERTER.model_to_turner(source)
    assert turner.dtype == torch.bfloat16
    assert_same_state_dict(source, gpt2.CONVERTER.model_from_turner(turner, "GPT2LMHeadModel"))


def test_sequence_classifier_gets_a_zero_bias_and_last_token_pooling():
    turner = gpt2.CONVERTER.model_to_turner(GPT2ForSequenceClassification(gpt2_config()))
    assert not turner.classifier.bias.any()
    assert (turner.config.classifier_pooling, turner.config.pad_token_id, turner.config.num_labels) == ("last", 0, 3)


def test_reverse_refuses_a_non_zero_classifier_bias():
    turner = gpt2.CONVERTER.model_to_turner(GPT2ForSequenceClassification(gpt2_config()))
    with torch.no_grad():
        turner.classifier.bias[1] = 0.5
    with pytest.raises(ValueError, match=r"`classifier.bias` is non-zero.*only an all-zero bias converts"):
        gpt2.CONVERTER.model_from_turner(turner, "GPT2ForSequenceClassification")


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("scale_attn_weights", False),
        ("scale_attn_by_inverse_layer_idx", True),
        ("reorder_and_upcast_attn", True),
        ("add_cross_attention", True),
        ("embd_pdrop", 0.3),
    ],
)
def test_options_turner_cannot_express_are_refused(option, value):
    config = gpt2_config(**{option: value})
    with pytest.raises(ValueError, match=re.escape(f"`{option}`={value!r}")):
        gpt2.to_turner(GPT2Model(config).state_dict(), config, "GPT2Model")


@pytest.mark.parametrize(
    ("option", "value", "architecture"),
    [
        ("norm_position", "post", "GPT2Model"),
        ("is_causal", False, "GPT2Model"),
        ("embedding_layer_norm", True, "GPT2Model"),
        ("type_vocab_size", 2, "GPT2Model"),
        ("attention_bias", False, "GPT2Model"),
        ("mlp_bias", False, "GPT2Model"),
        ("position_embedding_type", "sinusoidal", "GPT2Model"),
        ("head_dim", 4, "GPT2Model"),
        ("share_query_key", True, "GPT2Model"),
        ("normalization", "batchnorm", "GPT2Model"),
        ("mlp_hidden_layers", 2, "GPT2Model"),
        ("classifier_pooling", "mean", "GPT2ForSequenceClassification"),
        ("classifier_dropout", 0.1, "GPT2ForSequenceClassification"),
    ],
)
def test_reverse_refuses_what_gpt2_cannot_express(option, value, architecture):
    head = gpt2.CONVERTER.head(architecture)
    config = turner_text_config(**{option: value})
    with pytest.raises(ValueError, match=re.escape(f"`{option}`={value!r}")):
        gpt2.from_turner(head.turner_class(config).state_dict(), config, architecture)


def test_bad_arguments_are_named():
    source = GPT2Model(gpt2_config())
    state = source.state_dict()
    with pytest.raises(ValueError, match=r"`architecture`='GPT2DoubleHeadsModel'.*GPT2LMHeadModel"):
        gpt2.to_turner(state, source.config, "GPT2DoubleHeadsModel")
    with pytest.raises(ValueError, match=r"`config` is a TurnerConfig; expected a GPT2Config"):
        gpt2.to_turner(state, turner_text_config(), "GPT2Model")
    with pytest.raises(ValueError, match=r"no counterpart: \['extra.weight'\]"):
        gpt2.to_turner({**state, "extra.weight": torch.zeros(1)}, source.config, "GPT2Model")
    with pytest.raises(ValueError, match=r"`model` is a TurnerModel; GPT2LMHeadModel converts from TurnerForCausalLM"):
        gpt2.CONVERTER.model_from_turner(gpt2.CONVERTER.model_to_turner(source), "GPT2LMHeadModel")
    del state["ln_f.bias"]
    with pytest.raises(ValueError, match=r"lacks \['ln_f.bias'\]"):
        gpt2.to_turner(state, source.config, "GPT2Model")


def test_special_token_ids_outside_a_small_vocabulary_are_dropped_with_a_warning(tmp_path):
    defaults = dict(vocab_size=VOCAB, n_positions=32, n_embd=16, n_layer=2, n_head=2)
    source = GPT2LMHeadModel(GPT2Config(**defaults))  # GPT-2's default bos/eos: 50256, outside this vocabulary
    assert (source.config.bos_token_id, source.config.eos_token_id) == (50256, 50256)
    with pytest.warns(UserWarning, match=r"vocab_size=64\) of the GPT-2 config: bos_token_id=50256, eos_token_id"):
        turner = gpt2.CONVERTER.model_to_turner(source)
    assert (turner.config.bos_token_id, turner.config.eos_token_id) == (None, None)
    assert_same_outputs(source, turner, masked_ids(VOCAB, 0, (7, 4)), ("logits",))
    listed = GPT2LMHeadModel(GPT2Config(**defaults, eos_token_id=[2, 50256]))
    with pytest.warns(UserWarning, match=r"eos_token_id=\[2, 50256\]"):
        assert gpt2.CONVERTER.model_to_turner(listed).config.eos_token_id == [2]
    source.save_pretrained(tmp_path / "gpt2")  # and the command line converts the saved folder
    with pytest.warns(UserWarning, match="bos_token_id=50256"):
        assert main(["gpt2", str(tmp_path / "gpt2"), str(tmp_path / "turner")]) == 0
    assert_same_outputs(
        source, TurnerForCausalLM.from_pretrained(tmp_path / "turner"), masked_ids(VOCAB, 0, (5,)), ("logits",)
    )


@pytest.mark.parametrize(("classifier_dropout", "expected"), [(None, 0.1), (0.3, 0.3)])
def test_the_token_classifiers_dropout_carries_over_both_ways(classifier_dropout, expected):
    extra = {} if classifier_dropout is None else {"classifier_dropout": classifier_dropout}
    source = GPT2ForTokenClassification(gpt2_config(**extra))
    turner = gpt2.CONVERTER.model_to_turner(source)
    assert turner.config.classifier_dropout == turner.dropout.p == source.dropout.p == expected
    assert gpt2.CONVERTER.model_from_turner(turner, "GPT2ForTokenClassification").dropout.p == expected
