"""The contenders, built at exactly the same shapes: Turner, its `transformers` peer, and the minimal GPT floor.

Matching (language models): the same number of layers, heads and features, MLP width 4D, vocabulary, context,
learned positions, a final LayerNorm, biases in every linear and norm, LayerNorm eps 1e-5, exact (erf) GELU
(`GPT2Config(activation_function="gelu")`; GPT-2's own default is the tanh approximation), dropout 0, the output head
tied to the token embedding, and `sdpa` attention. What differs is only how each computes it: all three fuse Q, K and
V into one product; GPT-2's `Conv1D` stores weights in x out, Turner and the minimal GPT use `nn.Linear` (out x in).

Matching (image classifiers): ViT's patch embedding, class token, learned positions, pre-norm blocks, final
LayerNorm and a linear head on the class token; `ViTConfig(hidden_act="gelu")`, `qkv_bias=True`, no pooler.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedConfig, ViTConfig, ViTForImageClassification

from benchmarks.minimal_gpt import MinimalGPT, MinimalGPTConfig
from turner_tfm import TurnerConfig, TurnerForCausalLM, TurnerForImageClassification


@dataclass(frozen=True)
class Sizes:
    """A backbone's sizes: layers M, heads H, features D."""

    layers: int
    heads: int
    features: int

    def describe(self) -> str:
        return f"L={self.layers} H={self.heads} D={self.features}"

    def fields(self) -> dict[str, int]:
        """The sizes under transformers' standard config names (GPT-2 maps them to its own)."""
        return {"num_hidden_layers": self.layers, "num_attention_heads": self.heads, "hidden_size": self.features}


@dataclass(frozen=True)
class LMShape(Sizes):
    """A language-model shape: the sizes, context N and vocabulary V."""

    context: int
    vocab: int = 65

    def describe(self) -> str:
        return f"{super().describe()} N={self.context} V={self.vocab}"

    @classmethod
    def of(cls, config: PreTrainedConfig) -> LMShape:
        """The shape of a language model's config."""
        layers, heads, features = config.num_hidden_layers, config.num_attention_heads, config.hidden_size
        return cls(layers, heads, features, context=config.max_position_embeddings, vocab=config.vocab_size)

    def fields(self) -> dict[str, int]:
        return super().fields() | {"vocab_size": self.vocab, "max_position_embeddings": self.context}


def turner_config(shape: LMShape, **fields: object) -> TurnerConfig:
    """A Turner LM config of `shape` (learned positions, LayerNorm eps 1e-5, biases, tied head) with `fields` set."""
    return TurnerConfig(**shape.fields(), **fields)


def turner_lm(shape: LMShape, attn_implementation: str = "sdpa") -> TurnerForCausalLM:
    mlp = {"intermediate_size": 4 * shape.features, "hidden_act": "gelu"}
    return TurnerForCausalLM(turner_config(shape, **mlp, attn_implementation=attn_implementation))


def gpt2_lm(shape: LMShape, attn_implementation: str = "sdpa") -> GPT2LMHeadModel:
    config = GPT2Config(
        **shape.fields(),
        n_inner=4 * shape.features,
        activation_function="gelu",
        attn_implementation=attn_implementation,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=None,
        eos_token_id=None,
    )
    return GPT2LMHeadModel(config)


def minimal_lm(shape: LMShape) -> MinimalGPT:
    positions = {"vocab_size": shape.vocab, "context": shape.context}
    return MinimalGPT(MinimalGPTConfig(**positions, layers=shape.layers, heads=shape.heads, features=shape.features))


@dataclass(frozen=True)
class ImageShape(Sizes):
    """An image-classifier shape: the sizes, square RGB images cut into square patches, and the labels."""

    image_size: int
    patch_size: int
    labels: int = 1000

    def describe(self) -> str:
        return f"{super().describe()} image {self.image_size} patch {self.patch_size} labels {self.labels}"

    def fields(self) -> dict[str, int]:
        """The config fields both image classifiers read (an MLP 4D wide; ViT's dropout is 0 by default)."""
        image = {"image_size": self.image_size, "patch_size": self.patch_size, "num_labels": self.labels}
        mlp = {"intermediate_size": 4 * self.features, "layer_norm_eps": 1e-12, "num_channels": 3}
        return super().fields() | image | mlp


def turner_image(shape: ImageShape, attn_implementation: str = "sdpa") -> TurnerForImageClassification:
    config = TurnerConfig(**shape.fields(), hidden_act="gelu", attn_implementation=attn_implementation, is_causal=False)
    return TurnerForImageClassification(config)


def vit_image(shape: ImageShape, attn_implementation: str = "sdpa") -> ViTForImageClassification:
    config = ViTConfig(**shape.fields(), hidden_act="gelu", attn_implementation=attn_implementation, qkv_bias=True)
    return ViTForImageClassification(config)  # no pooler: ViTModel(add_pooling_layer=False)


Model = TypeVar("Model", bound=torch.nn.Module)


def build_on(device: torch.device | str, factory: Callable[..., Model], *args: object, **kwargs: object) -> Model:
    """`factory(*args, **kwargs)` with its parameters created and initialised on `device` (on the CPU, exactly what
    calling it does; on a GPU, without a CPU copy)."""
    with torch.device(device):
        return factory(*args, **kwargs)


def parameter_count(model: torch.nn.Module) -> int:
    """Distinct parameters (a tied head counts once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
