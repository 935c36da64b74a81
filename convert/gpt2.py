"""GPT-2 <-> Turner: `GPT2Model`, `GPT2LMHeadModel`, `GPT2ForSequenceClassification`, `GPT2ForTokenClassification`
and `GPT2ForQuestionAnswering`.

GPT-2 is the paper's block as drawn (§2.3, §4.1): pre-norm, causal, learned positions, a final norm and a head tied
to the token embedding. What differs is storage: GPT-2's `Conv1D` keeps a Linear's weight transposed (`c_attn`
stacks the q, k and v projections in one matrix, as Turner's `qkv_proj` does). `GPT2ForSequenceClassification`
scores the last non-pad token with a bias-free `score`; Turner's `classifier` gets a zero bias and
`classifier_pooling="last"`. The token classifier and the span scorer (`qa_outputs`) carry over by name, and the
token classifier's dropout (`classifier_dropout` when the config has one, else 0.1) becomes `classifier_dropout`.

Refused (no Turner counterpart): `scale_attn_weights=False`, `scale_attn_by_inverse_layer_idx=True`,
`reorder_and_upcast_attn=True`, `add_cross_attention=True`, and `embd_pdrop != resid_pdrop` (Turner has one
`hidden_dropout`). The `summary_*` fields only drive `GPT2DoubleHeadsModel`, which is not converted.
"""

import torch
import transformers
from transformers import GPT2Config

import turner_tfm
from turner_tfm import TurnerConfig

from ._common import (
    LABEL_FIELDS,
    QKV_PROJ,
    TOKEN_FIELDS,
    Converter,
    Head,
    Rule,
    every_token_head,
    rename,
    rename_module,
    same_names,
    unsupported,
)


def _transposed(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Conv1D weight (in, out) <-> Linear weight (out, in); the map is its own inverse."""
    return [tensor.t().contiguous() for tensor in tensors]


def _conv1d(source: str, turner: str) -> list[Rule]:
    """A GPT-2 Conv1D as a Turner Linear."""
    return [
        Rule((f"{source}.weight",), (f"{turner}.weight",), _transposed, _transposed),
        rename(f"{source}.bias", f"{turner}.bias"),
    ]


def _score_with_zero_bias(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    (weight,) = tensors
    return [weight, weight.new_zeros(weight.shape[0])]


def _score_without_bias(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    weight, bias = tensors
    if bias.any():
        raise ValueError(
            f"Cannot convert: the Turner `classifier.bias` is non-zero (max |b| = {bias.abs().max().item():.3g}) but "
            "GPT-2's `score` has no bias; only an all-zero bias converts."
        )
    return [weight]


class GPT2Converter(Converter):
    name = "GPT-2"
    config_class = GPT2Config
    base_class = transformers.GPT2Model
    heads = {
        "GPT2Model": Head(transformers.GPT2Model, turner_tfm.TurnerModel),
        "GPT2LMHeadModel": Head(
            transformers.GPT2LMHeadModel,
            turner_tfm.TurnerForCausalLM,
            rules=(rename("lm_head.weight", "lm_head.weight"),),
        ),
        "GPT2ForSequenceClassification": Head(
            transformers.GPT2ForSequenceClassification,
            turner_tfm.TurnerForSequenceClassification,
            rules=(
                Rule(
                    ("score.weight",),
                    ("classifier.weight", "classifier.bias"),
                    _score_with_zero_bias,
                    _score_without_bias,
                ),
            ),
            turner_options={"classifier_pooling": "last", "classifier_dropout": 0.0},  # GPT-2's score has none
        ),
        "GPT2ForTokenClassification": every_token_head(
            transformers.GPT2ForTokenClassification, turner_tfm.TurnerForTokenClassification, "classifier"
        ),
        "GPT2ForQuestionAnswering": every_token_head(
            transformers.GPT2ForQuestionAnswering, turner_tfm.TurnerForQuestionAnswering, "qa_outputs"
        ),
    }
    fields = {
        **LABEL_FIELDS,
        **TOKEN_FIELDS,
        **same_names("vocab_size", "initializer_range", "use_cache"),
        "n_embd": "hidden_size",
        "n_layer": "num_hidden_layers",
        "n_head": "num_attention_heads",
        "n_inner": "intermediate_size",
        "activation_function": "hidden_act",
        "n_positions": "max_position_embeddings",
        "layer_norm_epsilon": "layer_norm_eps",
        "resid_pdrop": "hidden_dropout",
        "attn_pdrop": "attention_dropout",
    }
    source_required = {
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "add_cross_attention": False,
    }
    turner_required = {
        "norm_position": "pre",
        "is_causal": True,
        "embedding_layer_norm": False,
        "type_vocab_size": 0,
        "attention_bias": True,
        "mlp_bias": True,
        "image_size": None,
    }
    embedding_rules = (
        rename("wte.weight", "embeddings.embed_tokens.weight"),
        rename("wpe.weight", "embeddings.embed_positions.weight"),
    )
    layer_rules = (
        *rename_module("h.{i}.ln_1", "layers.{i}.attn_norm"),
        *_conv1d("h.{i}.attn.c_attn", QKV_PROJ),
        *_conv1d("h.{i}.attn.c_proj", "layers.{i}.self_attn.o_proj"),
        *rename_module("h.{i}.ln_2", "layers.{i}.mlp_norm"),
        *_conv1d("h.{i}.mlp.c_fc", "layers.{i}.mlp.up_proj"),
        *_conv1d("h.{i}.mlp.c_proj", "layers.{i}.mlp.down_proj"),
    )
    final_rules = rename_module("ln_f", "norm")

    def turner_fields(self, config: GPT2Config, use_pooler: bool) -> dict[str, object]:
        if config.embd_pdrop != config.resid_pdrop:
            raise unsupported(
                "embd_pdrop",
                config.embd_pdrop,
                self.name,
                f"Turner has one hidden_dropout for embeddings and residual branches: it must equal "
                f"resid_pdrop={config.resid_pdrop}",
            )
        # GPT2ForTokenClassification's dropout: the config's `classifier_dropout` where it has one, else 0.1
        classifier_dropout = getattr(config, "classifier_dropout", None)
        return {
            "is_causal": True,
            "norm_position": "pre",
            "classifier_dropout": 0.1 if classifier_dropout is None else classifier_dropout,
        }

    def source_fields(self, config: TurnerConfig) -> dict[str, object]:
        return {"embd_pdrop": config.hidden_dropout, "classifier_dropout": config.classifier_dropout}


CONVERTER = GPT2Converter()
to_turner = CONVERTER.to_turner
from_turner = CONVERTER.from_turner
