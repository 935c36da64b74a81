"""BERT <-> Turner: `BertModel` (with or without its pooler), `BertForSequenceClassification`, `BertForMaskedLM`,
`BertForTokenClassification`, `BertForQuestionAnswering` and `BertForMultipleChoice`.

BERT is the encoder of footnote 18: no mask, learned positions plus token-type embeddings, a LayerNorm on the
embeddings, and the norm after each residual sum (`norm_position="post"`, hence no final norm). Its pooler is a
dense layer and tanh on the first token, and the sequence classifier reads the pooler. Sentence-embedding models
built on `BertModel` (the MiniLM family) convert like any `BertModel`.

BERT's masked-LM head is Turner's: its transform (dense, activation, LayerNorm) becomes `transform`, its decoder
`lm_head`, whose bias BERT keeps twice (`decoder.bias` and `predictions.bias`, one tensor). The token classifier and
the span scorer (`qa_outputs`) carry over by name; BERT's three token-level heads have no pooler. The multiple-choice
head reads the pooler, as the sequence classifier does, and scores each choice with a one-output `classifier`.

Refused (no Turner counterpart): `is_decoder=True`, `add_cross_attention=True`, a `position_embedding_type`
other than "absolute" (older configs carry it; transformers v5 BERT ignores it). The dropout before BERT's
classifier (`classifier_dropout`, or `hidden_dropout_prob` when that is None) becomes Turner's `classifier_dropout`.
"""

import torch
import transformers
from transformers import BertConfig

import turner_tfm
from turner_tfm import TurnerConfig

from ._common import (
    ENCODER_FIELDS,
    LABEL_FIELDS,
    QKV,
    QKV_PROJ,
    TOKEN_FIELDS,
    TURNER,
    Converter,
    Head,
    Rule,
    every_token_head,
    first_token_classifier,
    rename,
    rename_module,
    rename_modules,
    same_names,
    stacked_projections,
    unsupported,
)


def _one_bias(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """BERT's decoder bias, held under two names (`decoder.bias`, `predictions.bias`), as `lm_head.bias`."""
    decoder_bias, bias = tensors
    if not torch.equal(decoder_bias, bias):
        raise ValueError(
            "Cannot convert: BERT's `cls.predictions.decoder.bias` and `cls.predictions.bias` differ; BertForMaskedLM "
            "ties them (one tensor), and Turner's lm_head has one bias."
        )
    return [decoder_bias]


def _bias_twice(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    (bias,) = tensors
    return [bias, bias.clone()]


def _two_span_scores(config: BertConfig) -> None:
    if config.num_labels != 2:
        raise ValueError(
            f"Cannot convert: `num_labels`={config.num_labels} in the BERT config of a BertForQuestionAnswering has no "
            "counterpart; its qa_outputs scores a span's start and end: only 2 converts."
        )


MASKED_LM_RULES = (
    *rename_modules(
        {
            "cls.predictions.transform.dense": "transform.dense",
            "cls.predictions.transform.LayerNorm": "transform.norm",
        }
    ),
    rename("cls.predictions.decoder.weight", "lm_head.weight"),
    Rule(("cls.predictions.decoder.bias", "cls.predictions.bias"), ("lm_head.bias",), _one_bias, _bias_twice),
)


class BertConverter(Converter):
    name = "BERT"
    config_class = BertConfig
    base_class = transformers.BertModel
    heads = {
        "BertModel": Head(transformers.BertModel, turner_tfm.TurnerModel, pooler=None),
        "BertForSequenceClassification": first_token_classifier(
            transformers.BertForSequenceClassification, turner_tfm.TurnerForSequenceClassification, pooler=True
        ),
        "BertForMaskedLM": Head(transformers.BertForMaskedLM, turner_tfm.TurnerForMaskedLM, rules=MASKED_LM_RULES),
        "BertForTokenClassification": every_token_head(
            transformers.BertForTokenClassification, turner_tfm.TurnerForTokenClassification, "classifier"
        ),
        "BertForQuestionAnswering": every_token_head(
            transformers.BertForQuestionAnswering, turner_tfm.TurnerForQuestionAnswering, "qa_outputs", _two_span_scores
        ),
        "BertForMultipleChoice": first_token_classifier(
            transformers.BertForMultipleChoice, turner_tfm.TurnerForMultipleChoice, pooler=True
        ),
    }
    fields = {
        **LABEL_FIELDS,
        **TOKEN_FIELDS,
        **ENCODER_FIELDS,
        **same_names("vocab_size", "max_position_embeddings", "type_vocab_size", "use_cache"),
    }
    source_required = {"add_cross_attention": False, "is_decoder": False, "position_embedding_type": "absolute"}
    turner_required = {
        "norm_position": "post",
        "is_causal": False,
        "embedding_layer_norm": True,
        "attention_bias": True,
        "mlp_bias": True,
        "image_size": None,
    }
    embedding_rules = (
        rename("embeddings.word_embeddings.weight", "embeddings.embed_tokens.weight"),
        rename("embeddings.position_embeddings.weight", "embeddings.embed_positions.weight"),
        rename("embeddings.token_type_embeddings.weight", "embeddings.token_type_embeddings.weight"),
        *rename_module("embeddings.LayerNorm", "embeddings.norm"),
    )
    layer_rules = (
        *stacked_projections({part: f"encoder.layer.{{i}}.attention.self.{part}" for part in QKV}, QKV_PROJ),
        *rename_modules(
            {
                "encoder.layer.{i}.attention.output.dense": "layers.{i}.self_attn.o_proj",
                "encoder.layer.{i}.attention.output.LayerNorm": "layers.{i}.attn_norm",
                "encoder.layer.{i}.intermediate.dense": "layers.{i}.mlp.up_proj",
                "encoder.layer.{i}.output.dense": "layers.{i}.mlp.down_proj",
                "encoder.layer.{i}.output.LayerNorm": "layers.{i}.mlp_norm",
            }
        ),
    )

    def turner_fields(self, config: BertConfig, use_pooler: bool) -> dict[str, object]:
        classifier_dropout = config.classifier_dropout
        return {
            "is_causal": False,
            "norm_position": "post",
            "embedding_layer_norm": True,
            "classifier_pooling": "cls",
            "use_padding_idx": True,  # BERT's word embeddings keep the pad row fixed (`padding_idx`)
            "classifier_dropout": config.hidden_dropout_prob if classifier_dropout is None else classifier_dropout,
        }

    def source_fields(self, config: TurnerConfig) -> dict[str, object]:
        if config.type_vocab_size == 0:
            raise unsupported("type_vocab_size", 0, TURNER, "BERT always adds token-type embeddings: use 1 or more")
        return {"classifier_dropout": config.classifier_dropout}


CONVERTER = BertConverter()
to_turner = CONVERTER.to_turner
from_turner = CONVERTER.from_turner
