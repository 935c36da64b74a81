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

from dataclasses import dataclass

import torch
from transformers import GPT2Config, GPT2LMHeadModel, ViTConfig, ViTForImageClassification

from benchmarks.minimal_gpt import MinimalGPT, MinimalGPTConfig
from turner_tfm import TurnerConfig, TurnerForCausalLM, TurnerForImageClassification


@dataclass(frozen=True)
class LMShape:
    """A language-model shape: layers, heads, features D, context N, vocabulary V."""

    layers: int
    heads: int
    features: int
    context: int
    vocab: int = 65

    def describe(self) -> str:
        return f"L={self.layers} H={self.heads} D={self.features} N={self.context} V={self.vocab}"


def turner_lm(shape: LMShape, attn_implementation: str = "sdpa") -> TurnerForCausalLM:
    config = TurnerConfig(
        vocab_size=shape.vocab,
        hidden_size=shape.features,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        intermediate_size=4 * shape.features,
        max_position_embeddings=shape.context,
        hidden_act="gelu",
        layer_norm_eps=1e-5,
        attention_bias=True,
        mlp_bias=True,
        tie_word_embeddings=True,
        attn_implementation=attn_implementation,
    )
    return TurnerForCausalLM(config)


def gpt2_lm(shape: LMShape, attn_implementation: str = "sdpa") -> GPT2LMHeadModel:
    config = GPT2Config(
        vocab_size=shape.vocab,
        n_embd=shape.features,
        n_layer=shape.layers,
        n_head=shape.heads,
        n_inner=4 * shape.features,
        n_positions=shape.context,
        activation_function="gelu",
        layer_norm_epsilon=1e-5,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=None,
        attn_implementation=attn_implementation,
    )
    return GPT2LMHeadModel(config)


def minimal_lm(shape: LMShape) -> MinimalGPT:
    return MinimalGPT(
        MinimalGPTConfig(
            vocab_size=shape.vocab,
            context=shape.context,
            layers=shape.layers,
            heads=shape.heads,
            features=shape.features,
            bias=True,
        )
    )


@dataclass(frozen=True)
class ImageShape:
    """An image-classifier shape (ViT-Tiny-like by default)."""

    layers: int = 12
    heads: int = 3
    features: int = 192
    image_size: int = 224
    patch_size: int = 16
    labels: int = 1000

    def describe(self) -> str:
        return (
            f"L={self.layers} H={self.heads} D={self.features} image {self.image_size} patch {self.patch_size} "
            f"labels {self.labels}"
        )


def turner_image(shape: ImageShape, attn_implementation: str = "sdpa") -> TurnerForImageClassification:
    config = TurnerConfig(
        hidden_size=shape.features,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        intermediate_size=4 * shape.features,
        image_size=shape.image_size,
        patch_size=shape.patch_size,
        num_channels=3,
        is_causal=False,
        hidden_act="gelu",
        layer_norm_eps=1e-12,
        num_labels=shape.labels,
        attn_implementation=attn_implementation,
    )
    return TurnerForImageClassification(config)


def vit_image(shape: ImageShape, attn_implementation: str = "sdpa") -> ViTForImageClassification:
    config = ViTConfig(
        hidden_size=shape.features,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        intermediate_size=4 * shape.features,
        image_size=shape.image_size,
        patch_size=shape.patch_size,
        num_channels=3,
        hidden_act="gelu",
        layer_norm_eps=1e-12,
        qkv_bias=True,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        num_labels=shape.labels,
        attn_implementation=attn_implementation,
    )
    return ViTForImageClassification(config)  # no pooler: ViTModel(add_pooling_layer=False)


def parameter_count(model: torch.nn.Module) -> int:
    """Distinct parameters (a tied head counts once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
