"""Tiny configs and inputs for the tests, built locally."""

import torch

from turner_tfm import TurnerConfig

TEXT_DEFAULTS = dict(
    vocab_size=99,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=37,
    max_position_embeddings=64,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
IMAGE_DEFAULTS = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=37,
    image_size=16,
    patch_size=4,
    num_channels=3,
    is_causal=False,
    num_labels=3,
)


def text_config(**overrides) -> TurnerConfig:
    return TurnerConfig(**{**TEXT_DEFAULTS, **overrides})


def image_config(**overrides) -> TurnerConfig:
    return TurnerConfig(**{**IMAGE_DEFAULTS, **overrides})


def random_ids(batch: int, length: int, vocab_size: int = 99, seed: int = 0) -> torch.Tensor:
    """Token ids that avoid the special ids 0-2, so no token is mistaken for padding."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab_size, (batch, length), generator=generator)
