"""The pieces the block and its inputs are built from: X^(0), a vector a token (§1.1) or a patch (§4.2); the position
encodings of §3 (vectors added to or concatenated with each token, or rotations of queries and keys); the token norms of
§2.3 (figure 5). `modeling_turner.py` builds the block and the model from them.
"""

from collections.abc import Callable

import torch
from torch import nn

from .configuration_turner import TurnerConfig


class TurnerSinusoidalPositionEmbedding(nn.Module):
    """Fixed sinusoids of different frequencies (§3, Vaswani et al. 2017), called like `nn.Embedding`. Computed for
    any position (nothing stored: a model runs past its training length), and scaled (`scale`) to the spread of a fresh
    token embedding: unscaled, their norm sqrt(D/2) would drown the tokens and the model learn from positions alone."""

    def __init__(self, embedding_dim: int, scale: float = 1.0, base: float = 10000.0):
        super().__init__()
        self.embedding_dim = embedding_dim
        self.scale = scale
        self.base = base

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        half = self.embedding_dim // 2
        exponent = torch.arange(half, device=position_ids.device, dtype=torch.float32) / half
        angles = position_ids.float().unsqueeze(-1) * self.base**-exponent
        sinusoids = torch.cat([angles.sin(), angles.cos()], dim=-1) * self.scale
        return nn.functional.pad(sinusoids, (0, self.embedding_dim - 2 * half))


# §3: the position vector each `position_embedding_type` gives a token, built for a width (one home per choice, like
# `ACT2FN`); the other types give none ("rotary" rotates queries and keys instead: `ROTATIONS`, below)
POSITION_VECTORS: dict[str, Callable[[TurnerConfig, int], nn.Module]] = {
    "learned": lambda config, width: nn.Embedding(config.max_position_embeddings, width),
    # sin and cos have std 1/sqrt(2) over positions
    "sinusoidal": lambda config, width: TurnerSinusoidalPositionEmbedding(width, config.initializer_range * 2**0.5),
}


def build_position_embedding(config: TurnerConfig) -> nn.Module | None:
    """The §3 position vector given to each token (None for types that give none): D wide when added to the token,
    `position_embedding_size` when concatenated to it (footnote 19)."""
    build = POSITION_VECTORS.get(config.position_embedding_type)
    if build is None:
        return None
    concatenated = config.position_embedding_combine == "concat"
    return build(config, config.position_embedding_size if concatenated else config.hidden_size)


def combine_positions(tokens: torch.Tensor, positions: torch.Tensor, combine: str) -> torch.Tensor:
    """x_n + e_n, or [x_n; e_n] when positions are concatenated (§3)."""
    positions = positions.to(tokens.dtype)
    if combine == "add":
        return tokens + positions
    return torch.cat([tokens, positions.expand(*tokens.shape[:-1], -1)], dim=-1)


class TurnerRotaryEmbedding(nn.Module):
    """Relative positions (§3, "relative distance information between pairs of tokens"), as rotations (RoPE): each
    pair of query and key features is rotated by an angle proportional to the token's position, so the score
    `k_n^T q_n'` depends on the positions only through n' - n. Returns the cosines and sines for `position_ids`."""

    def __init__(self, config: TurnerConfig):
        super().__init__()
        self.head_dim = config.head_dim
        self.base = config.rope_theta

    def forward(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        exponent = torch.arange(0, self.head_dim, 2, device=position_ids.device, dtype=torch.float32) / self.head_dim
        angles = position_ids.float().unsqueeze(-1) * self.base**-exponent
        angles = torch.cat([angles, angles], dim=-1).unsqueeze(1)  # (batch, 1 head, N, K)
        return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate feature i with feature i + K/2 of every head by the position's angle."""
    first, second = states.chunk(2, dim=-1)
    return states * cos + torch.cat([-second, first], dim=-1) * sin


# §3's relative positions, by `position_embedding_type`: the cosines and sines every block rotates queries and keys by
ROTATIONS: dict[str, type[nn.Module]] = {"rotary": TurnerRotaryEmbedding}


class TurnerBatchNorm(nn.BatchNorm1d):
    """BatchNorm over the batch and the tokens together, per feature (figure 5, right): statistics are shared
    across sequences, so padding tokens count towards them while training."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return super().forward(hidden_states.reshape(-1, hidden_states.shape[-1])).reshape(hidden_states.shape)


# Token normalisation (§2.3) by `normalization`: LayerNorm (TokenNorm, the default), RMSNorm, or BatchNorm (figure 5)
NORMS: dict[str, type[nn.Module]] = {"layernorm": nn.LayerNorm, "rmsnorm": nn.RMSNorm, "batchnorm": TurnerBatchNorm}


def build_dropout(probability: float) -> nn.Module:
    """Dropout, or where its probability is 0 (the default) the identity, which launches no operator."""
    return nn.Dropout(probability) if probability else nn.Identity()


def build_norm(config: TurnerConfig) -> nn.Module:
    return NORMS[config.normalization](config.hidden_size, eps=config.layer_norm_eps)


class TurnerEmbeddings(nn.Module):
    """X^(0) for text: one vector per token (§1.1), plus its position (§3) and, optionally, a token type."""

    input_embedding_name = "embed_tokens"  # the module `get_input_embeddings` returns

    def __init__(self, config: TurnerConfig):
        super().__init__()
        self.combine = config.position_embedding_combine
        pad = config.pad_token_id
        padding_idx = pad if config.use_padding_idx and pad is not None and 0 <= pad < config.vocab_size else None
        self.embed_tokens = nn.Embedding(config.vocab_size, config.token_embedding_size, padding_idx=padding_idx)
        self.embed_positions = build_position_embedding(config)
        self.token_type_embeddings = (
            nn.Embedding(config.type_vocab_size, config.hidden_size) if config.type_vocab_size else None
        )
        self.norm = build_norm(config) if config.embedding_layer_norm else None
        self.dropout = build_dropout(config.hidden_dropout)

    def forward(
        self,
        inputs_embeds: torch.Tensor,
        position_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        hidden_states = inputs_embeds
        if self.embed_positions is not None:
            hidden_states = combine_positions(hidden_states, self.embed_positions(position_ids), self.combine)
        if self.token_type_embeddings is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(position_ids)
            hidden_states = hidden_states + self.token_type_embeddings(token_type_ids)
        if self.norm is not None:
            hidden_states = self.norm(hidden_states)
        return self.dropout(hidden_states)


class TurnerPatchEmbeddings(nn.Module):
    """X^(0) for images (§4.2): `W p_n + e_n` for each vectorised patch p_n, after a class token at n = 0.

    A convolution with stride equal to its kernel applies the same matrix W to every patch.
    """

    input_embedding_name = "patch_embed"  # the module `get_input_embeddings` returns (W, as ViT's)

    def __init__(self, config: TurnerConfig):
        super().__init__()
        self.image_size = config.image_size
        self.patch_size = config.patch_size
        self.combine = config.position_embedding_combine
        width = config.token_embedding_size
        self.patch_embed = nn.Conv2d(
            config.num_channels, width, kernel_size=config.patch_size, stride=config.patch_size
        )
        self.cls_token = nn.Parameter(torch.zeros(1, 1, width))
        self.embed_positions = build_position_embedding(config)
        self.dropout = build_dropout(config.hidden_dropout)

    def forward(self, pixel_values: torch.Tensor, interpolate_pos_encoding: bool = False) -> torch.Tensor:
        pixel_values = pixel_values.to(self.patch_embed.weight.dtype)
        patch_grid = self.patch_embed(pixel_values)
        patches = patch_grid.flatten(2).transpose(1, 2)
        cls_tokens = self.cls_token.expand(patches.shape[0], -1, -1).to(patches.dtype)
        hidden_states = torch.cat([cls_tokens, patches], dim=1)
        if self.embed_positions is not None:
            positions = self._positions(hidden_states, patch_grid.shape[-2:])
            hidden_states = combine_positions(hidden_states, positions, self.combine)
        return self.dropout(hidden_states)

    def _positions(self, hidden_states: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        """e_n for the class token and each patch; learned ones are resized (bicubic) to another patch grid."""
        position_ids = torch.arange(hidden_states.shape[1], device=hidden_states.device)
        trained_grid = self.image_size // self.patch_size
        if not isinstance(self.embed_positions, nn.Embedding) or tuple(grid) == (trained_grid, trained_grid):
            return self.embed_positions(position_ids)
        table = self.embed_positions.weight  # the class token's row, then a row a patch: the patch rows resized
        patch_table = table[1:].reshape(1, trained_grid, trained_grid, -1).permute(0, 3, 1, 2)
        resized = nn.functional.interpolate(patch_table.float(), size=tuple(grid), mode="bicubic", align_corners=False)
        return torch.cat([table[:1], resized.to(table.dtype).permute(0, 2, 3, 1).reshape(-1, table.shape[-1])])
