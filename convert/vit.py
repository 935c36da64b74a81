"""ViT <-> Turner: `ViTModel` (with or without its pooler) and `ViTForImageClassification`.

ViT is the paper's image classifier (§4.2): a strided convolution applies W to every patch, a class token sits at
n = 0, learned positions are added, pre-norm blocks run without a mask, a final norm follows, and the head reads
`x_0^(M)`. ViT stores its positions as one `(1, N + 1, D)` parameter; Turner as an `nn.Embedding` of N + 1 rows.

Refused (no Turner counterpart): `qkv_bias=False` (Turner's `attention_bias` covers the output projection too),
non-square `image_size` or `patch_size`, a `head_dim` other than hidden_size / num_attention_heads, and a pooler
with `pooler_act` other than "tanh" or `pooler_output_size` other than `hidden_size`. `encoder_stride` only
drives `ViTForMaskedImageModeling`, which is not converted.
"""

from collections.abc import Sequence

import torch
from transformers import ViTConfig, ViTForImageClassification, ViTModel

from turner_tfm import TurnerConfig, TurnerForImageClassification, TurnerModel

from ._common import (
    ENCODER_FIELDS,
    LABEL_FIELDS,
    QKV,
    QKV_PROJ,
    TURNER,
    Converter,
    Head,
    Rule,
    first_token_classifier,
    rename,
    rename_module,
    rename_modules,
    same_names,
    stacked_projections,
    unsupported,
)


def _drop_batch_axis(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return [tensor.squeeze(0) for tensor in tensors]


def _add_batch_axis(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return [tensor.unsqueeze(0) for tensor in tensors]


def _square(option: str, value: int | Sequence[int]) -> int:
    """ViT allows (height, width) pairs; Turner takes one side."""
    if isinstance(value, int):
        return value
    if isinstance(value, Sequence) and len(value) == 2 and value[0] == value[1] and isinstance(value[0], int):
        return value[0]
    raise unsupported(option, value, "ViT", "Turner takes square images and patches: give one integer")


class ViTConverter(Converter):
    name = "ViT"
    config_class = ViTConfig
    base_class = ViTModel
    heads = {
        "ViTModel": Head(ViTModel, TurnerModel, pooler=None),
        "ViTForImageClassification": first_token_classifier(ViTForImageClassification, TurnerForImageClassification),
    }
    fields = {**LABEL_FIELDS, **ENCODER_FIELDS, **same_names("num_channels")}
    source_required = {"qkv_bias": True}
    turner_required = {
        "norm_position": "pre",
        "is_causal": False,
        "attention_bias": True,
        "mlp_bias": True,
        "classifier_dropout": 0.0,
    }
    embedding_rules = (
        rename("embeddings.cls_token", "embeddings.cls_token"),
        Rule(
            ("embeddings.position_embeddings",),
            ("embeddings.embed_positions.weight",),
            _drop_batch_axis,
            _add_batch_axis,
        ),
        *rename_module("embeddings.patch_embeddings.projection", "embeddings.patch_embed"),
    )
    layer_rules = (
        *stacked_projections({part: f"layers.{{i}}.attention.{part[0]}_proj" for part in QKV}, QKV_PROJ),
        *rename_modules(
            {
                "layers.{i}.attention.o_proj": "layers.{i}.self_attn.o_proj",
                "layers.{i}.layernorm_before": "layers.{i}.attn_norm",
                "layers.{i}.layernorm_after": "layers.{i}.mlp_norm",
                "layers.{i}.mlp.fc1": "layers.{i}.mlp.up_proj",
                "layers.{i}.mlp.fc2": "layers.{i}.mlp.down_proj",
            }
        ),
    )
    final_rules = rename_module("layernorm", "norm")

    def turner_fields(self, config: ViTConfig, use_pooler: bool) -> dict[str, object]:
        default_head_dim = config.hidden_size // config.num_attention_heads
        head_dim = getattr(config, "head_dim", default_head_dim)
        if head_dim != default_head_dim:
            raise unsupported(
                "head_dim", head_dim, self.name, f"only hidden_size / num_attention_heads = {default_head_dim} converts"
            )
        if use_pooler and config.pooler_act != "tanh":
            raise unsupported("pooler_act", config.pooler_act, self.name, "Turner's pooler uses 'tanh'")
        if use_pooler and config.pooler_output_size != config.hidden_size:
            raise unsupported(
                "pooler_output_size",
                config.pooler_output_size,
                self.name,
                f"Turner's pooler keeps {config.hidden_size}",
            )
        return {
            "image_size": _square("image_size", config.image_size),
            "patch_size": _square("patch_size", config.patch_size),
            "is_causal": False,
            "norm_position": "pre",
            "classifier_pooling": "cls",
        }

    def source_fields(self, config: TurnerConfig) -> dict[str, object]:
        if not config.is_image_model:
            raise unsupported("image_size", config.image_size, TURNER, "a ViT is an image model: set image_size")
        return {"image_size": config.image_size, "patch_size": config.patch_size, "qkv_bias": True}


CONVERTER = ViTConverter()
to_turner = CONVERTER.to_turner
from_turner = CONVERTER.from_turner
