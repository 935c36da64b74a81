"""Tiny configs and inputs for the tests, built locally."""

import torch

from turner_tfm import TurnerConfig

# The blocks every tiny model has, text or image
BLOCK_DEFAULTS = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)
TEXT_DEFAULTS = dict(
    **BLOCK_DEFAULTS,
    vocab_size=99,
    max_position_embeddings=64,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
IMAGE_DEFAULTS = dict(
    **BLOCK_DEFAULTS,
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


def write_separate_projections(folder, share_query_key: bool = False) -> None:
    """Rewrite a saved Turner checkpoint as an earlier Turner saved it: `q_proj`, `k_proj` and `v_proj` (no `k_proj`
    with `share_query_key`) as separate matrices instead of the stacked `qkv_proj`."""
    from pathlib import Path

    from safetensors.torch import load_file, save_file

    weights = Path(folder) / "model.safetensors"
    tensors = load_file(weights)
    parts = "qv" if share_query_key else "qkv"
    for name in [name for name in tensors if ".qkv_proj." in name]:
        for part, tensor in zip(parts, tensors.pop(name).chunk(len(parts)), strict=True):
            tensors[name.replace(".qkv_proj.", f".{part}_proj.")] = tensor.contiguous()
    save_file(tensors, weights, metadata={"format": "pt"})
