"""The Turner transformer: the block of Turner, *An Introduction to Transformers* (2023), for Hugging Face.

Notation. The paper writes the token matrix X as D x N (features down, tokens across, footnote 2). Tensors here are
laid out `(batch, N, D)`: token n of sequence b is `hidden_states[b, n]`, and `X A` of eq. 2 becomes `A^T X^T`.

Data flows one way: config -> `TurnerModel` (token or patch embeddings, M blocks, final norm) -> a head. The heads
own their projection, pooling and loss; the backbone knows nothing of tasks. The checks of user inputs come last.

This file imports only torch, transformers (with safetensors, which transformers requires) and
`.configuration_turner`, so the copy `save_pretrained` writes next to the weights runs without `turner_tfm`. It reads
and writes no files itself: loading and saving go through `transformers`, and only ever as safetensors.
"""

import contextlib
import os
import threading
from collections.abc import Callable, Iterator

import torch
from safetensors import SafetensorError
from torch import nn
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer
from transformers.conversion_mapping import register_checkpoint_conversion_mapping
from transformers.core_model_loading import Concatenate, WeightConverter, WeightRenaming
from transformers.distributed import DistributedConfig
from transformers.distributed.utils import is_dtensor
from transformers.generation import GenerationConfig, GenerationMixin
from transformers.masking_utils import (
    create_bidirectional_mask,
    create_causal_mask,
    find_packed_sequence_indices,
    packed_sequence_mask_function,
)
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutputWithPoolingAndCrossAttentions,
    CausalLMOutputWithPast,
    ImageClassifierOutput,
    SequenceClassifierOutputWithPast,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, PreTrainedModel
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs, can_return_tuple
from transformers.utils.generic import merge_with_config_defaults
from transformers.utils.import_utils import is_torch_distributed_available, is_torchdynamo_compiling
from transformers.utils.output_capturing import capture_outputs

from .configuration_turner import TurnerConfig


class TurnerSinusoidalPositionEmbedding(nn.Module):
    """Fixed sinusoids of different frequencies (§3, Vaswani et al. 2017), computed for any position.

    Called like `nn.Embedding`: position ids in, one vector per position out. Nothing is stored, so models with these
    positions run past the length they were trained on. The sinusoids are scaled so each feature has the standard
    deviation of a freshly initialised token embedding (`scale`); unscaled, their norm sqrt(D/2) would drown the
    tokens and the model would learn from positions alone.
    """

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


def build_position_embedding(config: TurnerConfig) -> nn.Module | None:
    """The §3 position vector given to each token: learned or fixed sinusoids (None for rotary and none).

    Its width is D when added to the token, `position_embedding_size` when concatenated to it (footnote 19).
    """
    concatenated = config.position_embedding_combine == "concat"
    width = config.position_embedding_size if concatenated else config.hidden_size
    if config.position_embedding_type == "learned":
        return nn.Embedding(config.max_position_embeddings, width)
    if config.position_embedding_type == "sinusoidal":  # sin and cos have std 1/sqrt(2) over positions
        return TurnerSinusoidalPositionEmbedding(width, scale=config.initializer_range * 2**0.5)
    return None


def combine_positions(tokens: torch.Tensor, positions: torch.Tensor, combine: str) -> torch.Tensor:
    """x_n + e_n, or [x_n; e_n] when positions are concatenated (§3)."""
    positions = positions.to(tokens.dtype)
    if combine == "add":
        return tokens + positions
    return torch.cat([tokens, positions.expand(*tokens.shape[:-1], -1)], dim=-1)


class TurnerRotaryEmbedding(nn.Module):
    """Relative positions (§3, "relative distance information between pairs of tokens"), as rotations (RoPE).

    Each pair of query and key features is rotated by an angle proportional to the token's position, so the score
    `k_n^T q_n'` depends on the positions only through n' - n. Returns the cosines and sines for `position_ids`.
    """

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


def build_norm(config: TurnerConfig) -> nn.Module:
    """Token normalisation (§2.3): LayerNorm (TokenNorm, the default), RMSNorm, or BatchNorm (figure 5)."""
    if config.normalization == "rmsnorm":
        return nn.RMSNorm(config.hidden_size, eps=config.layer_norm_eps)
    if config.normalization == "batchnorm":
        return TurnerBatchNorm(config.hidden_size, eps=config.layer_norm_eps)
    return nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)


class TurnerBatchNorm(nn.BatchNorm1d):
    """BatchNorm over the batch and the tokens together, per feature (figure 5, right): statistics are shared
    across sequences, so padding tokens count towards them while training."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return super().forward(hidden_states.reshape(-1, hidden_states.shape[-1])).reshape(hidden_states.shape)


class TurnerEmbeddings(nn.Module):
    """X^(0) for text: one vector per token (§1.1), plus its position (§3) and, optionally, a token type."""

    def __init__(self, config: TurnerConfig):
        super().__init__()
        self.combine = config.position_embedding_combine
        self.embed_tokens = nn.Embedding(config.vocab_size, config.token_embedding_size)
        self.embed_positions = build_position_embedding(config)
        self.token_type_embeddings = (
            nn.Embedding(config.type_vocab_size, config.hidden_size) if config.type_vocab_size else None
        )
        self.norm = build_norm(config) if config.embedding_layer_norm else None
        self.dropout = nn.Dropout(config.hidden_dropout)

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

    def __init__(self, config: TurnerConfig):
        super().__init__()
        self.image_size = config.image_size
        self.patch_size = config.patch_size
        self.num_channels = config.num_channels
        self.combine = config.position_embedding_combine
        width = config.token_embedding_size
        self.patch_embed = nn.Conv2d(
            config.num_channels, width, kernel_size=config.patch_size, stride=config.patch_size
        )
        self.cls_token = nn.Parameter(torch.zeros(1, 1, width))
        self.embed_positions = build_position_embedding(config)
        self.dropout = nn.Dropout(config.hidden_dropout)

    def forward(self, pixel_values: torch.Tensor, interpolate_pos_encoding: bool = False) -> torch.Tensor:
        self._check_pixel_values(pixel_values, interpolate_pos_encoding)
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
        table = self.embed_positions.weight
        patch_table = table[1:].reshape(1, trained_grid, trained_grid, -1).permute(0, 3, 1, 2)
        resized = nn.functional.interpolate(patch_table.float(), size=tuple(grid), mode="bicubic", align_corners=False)
        resized = resized.to(table.dtype).permute(0, 2, 3, 1).reshape(-1, table.shape[-1])
        return torch.cat([table[:1], resized])

    def _check_pixel_values(self, pixel_values: torch.Tensor, interpolate_pos_encoding: bool) -> None:
        channels, size, patch = self.num_channels, self.image_size, self.patch_size
        if pixel_values.ndim != 4 or pixel_values.shape[0] == 0 or pixel_values.shape[1] != channels:
            raise _invalid_input(
                "pixel_values", _shape(pixel_values), f"expected (batch >= 1, {channels}, height, width)"
            )
        height, width = pixel_values.shape[2:]
        if interpolate_pos_encoding:
            if height % patch or width % patch or height == 0 or width == 0:
                raise _invalid_input(
                    "pixel_values",
                    _shape(pixel_values),
                    f"height and width must be positive multiples of patch_size={patch}",
                )
        elif (height, width) != (size, size):
            raise _invalid_input(
                "pixel_values",
                _shape(pixel_values),
                f"the model was built for {size}x{size} images (image_size); resize them, or pass "
                "interpolate_pos_encoding=True to resize the position embeddings instead",
            )


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: Unpack[TransformersKwargs],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 5 written out: A = softmax over keys of `k^T q / sqrt(K)`, then the values weighted by A (eq. 2).

    The softmax runs in fp32 whatever the input dtype, so half-precision scores cannot overflow.
    """
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask
    attn_weights = nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    attn_weights = nn.functional.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value).transpose(1, 2).contiguous()
    return attn_output, attn_weights


class TurnerAttention(nn.Module):
    """Multi-head self-attention, eq. 4-6: `sum_h V_h X A_h`.

    `qkv_proj` stacks, one above the other, the H matrices U_q,h, then the U_k,h, then the U_v,h (each K x D), so one
    matrix product gives every head's queries, keys and values; `V_h = U_h U_v,h` (footnote 13) is the value part
    followed by `o_proj` acting on the concatenated heads. With `share_query_key` there is no key part: U_k = U_q,
    the symmetric attention of the paper's first construction (footnote 9). Checkpoints of earlier Turners, with
    separate `q_proj`, `k_proj` and `v_proj`, load stacked (`StackProjections`).
    """

    def __init__(self, config: TurnerConfig, layer_idx: int):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.scaling = self.head_dim**-0.5  # footnote 8
        self.is_causal = config.is_causal
        self.attention_dropout = config.attention_dropout
        inner_size = config.num_attention_heads * config.head_dim
        self.projections = 2 if config.share_query_key else 3
        self.qkv_proj = nn.Linear(config.hidden_size, self.projections * inner_size, bias=config.attention_bias)
        self.o_proj = nn.Linear(inner_size, config.hidden_size, bias=config.attention_bias)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        input_shape = hidden_states.shape[:-1]
        heads_shape = (*input_shape, -1, self.head_dim)
        query, *key, value = self.qkv_proj(hidden_states).view(heads_shape).transpose(1, 2).chunk(self.projections, 1)
        key = key[0] if key else query
        if position_embeddings is not None:  # rotary: relative positions enter through the scores alone
            cos, sin = position_embeddings
            query, key = apply_rotary(query, cos, sin), apply_rotary(key, cos, sin)

        if past_key_values is not None:  # §4.1 incremental property: earlier keys and values never change
            key, value = past_key_values.update(key, value, self.layer_idx)

        attention_interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward
        )
        attn_output, attn_weights = attention_interface(
            self,
            query,
            key,
            value,
            attention_mask,
            dropout=self.attention_dropout if self.training else 0.0,
            scaling=self.scaling,
            **kwargs,
        )
        attn_output = self.o_proj(attn_output.reshape(*input_shape, -1).contiguous())
        return attn_output, attn_weights


class TurnerMLP(nn.Module):
    """Stage 2 (§2.2): the same MLP applied to every token's features, with one or two hidden layers (footnote 14)."""

    def __init__(self, config: TurnerConfig):
        super().__init__()
        width, bias = config.intermediate_size, config.mlp_bias
        self.up_proj = nn.Linear(config.hidden_size, width, bias=bias)
        self.hidden_proj = nn.Linear(width, width, bias=bias) if config.mlp_hidden_layers == 2 else None
        self.act_fn = ACT2FN[config.hidden_act]
        self.down_proj = nn.Linear(width, config.hidden_size, bias=bias)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        hidden_states = self.act_fn(self.up_proj(hidden_states))
        if self.hidden_proj is not None:
            hidden_states = self.act_fn(self.hidden_proj(hidden_states))
        return self.down_proj(hidden_states)


class TurnerBlock(GradientCheckpointingLayer):
    """The transformer block of §2.3: MHSA then MLP, each inside a residual connection with token normalisation.

    `norm_position="pre"` (the paper's figure, Xiong et al. 2020): `x + MHSA(norm(x))`, then `x + MLP(norm(x))`.
    `norm_position="post"` (BERT, footnote 18): `norm(x + MHSA(x))`, then `norm(x + MLP(x))`.
    """

    def __init__(self, config: TurnerConfig, layer_idx: int):
        super().__init__()
        self.pre_norm = config.norm_position == "pre"
        self.self_attn = TurnerAttention(config, layer_idx)
        self.attn_norm = build_norm(config)
        self.mlp = TurnerMLP(config)
        self.mlp_norm = build_norm(config)
        self.dropout = nn.Dropout(config.hidden_dropout)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> torch.Tensor:
        def self_attention(x: torch.Tensor) -> torch.Tensor:
            return self.self_attn(
                x,
                attention_mask=attention_mask,
                past_key_values=past_key_values,
                position_embeddings=position_embeddings,
                **kwargs,
            )[0]

        hidden_states = self._residual(hidden_states, self_attention, self.attn_norm)
        return self._residual(hidden_states, self.mlp, self.mlp_norm)

    def _residual(self, x: torch.Tensor, sublayer: Callable, norm: nn.Module) -> torch.Tensor:
        """`x + res(x)` (§2.3), with the norm on the residual branch's input or after the sum."""
        if self.pre_norm:
            return x + self.dropout(sublayer(norm(x)))
        return norm(x + self.dropout(sublayer(x)))


class TurnerDynamicLayer(DynamicLayer):
    """A `DynamicCache` layer that appends in place (§4.1's incremental property: earlier keys and values never
    change, so a new token need not copy them).

    `DynamicLayer` concatenates, copying the whole cache for every new token (O(N^2) copying over a generation, a
    fresh allocation each step). Here keys and values are views of the first N rows of a buffer that doubles when
    full, so a token costs one write and total copying stays under twice the final length. Whatever else replaces
    `keys` (crop, beam reordering, batch selection, offloading) is respected: a prefix of the buffer keeps it, anything
    else starts a new one. Steps that autograd records, or that dynamo traces, concatenate as `DynamicLayer` does.
    """

    min_capacity = 256
    _key_buffer: torch.Tensor | None = None  # set by the first update
    _value_buffer: torch.Tensor | None = None

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if is_torchdynamo_compiling() or (torch.is_grad_enabled() and key_states.requires_grad):
            return super().update(key_states, value_states, *args, **kwargs)
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        length = self.get_seq_length()
        if not self._buffers_hold(length, key_states, value_states):
            self._new_buffers(length, key_states, value_states)
        end = length + key_states.shape[-2]
        self._key_buffer[..., length:end, :] = key_states
        self._value_buffer[..., length:end, :] = value_states
        self.keys, self.values = self._key_buffer[..., :end, :], self._value_buffer[..., :end, :]
        return self.keys, self.values

    def _buffers_hold(self, length: int, key_states: torch.Tensor, value_states: torch.Tensor) -> bool:
        """The buffers hold the cache as their first `length` rows, with room for the new states."""
        buffers = self._key_buffer, self._value_buffer
        if buffers[0] is None or length + key_states.shape[-2] > buffers[0].shape[-2]:
            return False
        if buffers[0].is_inference() and not torch.is_inference_mode_enabled():
            return False  # an inference tensor cannot be written outside inference mode
        return all(
            _is_prefix(cached, buffer, new)
            for cached, buffer, new in zip((self.keys, self.values), buffers, (key_states, value_states), strict=True)
        )

    def _new_buffers(self, length: int, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        capacity = max(2 * (length + key_states.shape[-2]), self.min_capacity)
        self._key_buffer, self._value_buffer = (
            new.new_empty((*new.shape[:-2], capacity, new.shape[-1])) for new in (key_states, value_states)
        )
        if length:
            self._key_buffer[..., :length, :] = self.keys
            self._value_buffer[..., :length, :] = self.values


def _is_prefix(cached: torch.Tensor, buffer: torch.Tensor, new: torch.Tensor) -> bool:
    """`cached` is empty or the buffer's first rows (same storage, start and strides), and `new` fits beside it."""
    fits = (
        new.shape[:-2] == buffer.shape[:-2]
        and new.shape[-1] == buffer.shape[-1]
        and (new.dtype, new.device) == (buffer.dtype, buffer.device)
    )
    if not fits or cached.numel() == 0:
        return fits
    return (
        cached.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()
        and cached.storage_offset() == buffer.storage_offset()
        and cached.stride() == buffer.stride()
        and cached.shape[:-2] == buffer.shape[:-2]
        and cached.shape[-1] == buffer.shape[-1]
    )


def appending_cache(cache: Cache) -> Cache:
    """`cache` with its empty `DynamicLayer`s replaced by `TurnerDynamicLayer`s (other layer kinds are kept)."""
    cache.layers = [
        TurnerDynamicLayer() if type(layer) is DynamicLayer and not layer.is_initialized else layer
        for layer in cache.layers
    ]
    return cache


_layout_lock = threading.Lock()
INPUT_MAJOR_MIN_NEW_TOKENS = 16


def widening_cpu_weights(model: nn.Module) -> list[nn.Parameter]:
    """The plain CPU weights of the blocks' `nn.Linear`s with at least as many outputs as inputs."""
    return [
        linear.weight
        for module in model.modules()
        if isinstance(module, (TurnerAttention, TurnerMLP))
        for linear in module.children()
        if type(linear) is nn.Linear
        and linear.out_features >= linear.in_features
        and type(linear.weight.data) is torch.Tensor
        and linear.weight.device.type == "cpu"
    ]


@contextlib.contextmanager
def input_major_widening_weights(model: nn.Module) -> Iterator[None]:
    """On the CPU, the blocks' widening (and square) `nn.Linear` weights stored input-major while inside, as GPT-2's
    `Conv1D` stores them: same values, shapes and parameters, memory laid out as W^T; restored on exit.

    A decoding step multiplies one row per sequence by every weight. On MKL the product `x @ W^T` is faster when W^T
    is contiguous and W has at least as many outputs as inputs (`qkv_proj`, `o_proj`, `up_proj`); the narrowing
    `down_proj` is faster as it is. The copy costs about one pass over those weights per `generate()` call and is
    held only while the loop runs. Sharded, quantized and adapter-wrapped layers are left alone; nested or
    concurrent `generate()` calls share one copy (the last to leave restores the weights).
    """
    with _layout_lock:
        users = getattr(model, "_input_major_users", 0)
        if users == 0:
            model._row_major_weights = [(weight, weight.data) for weight in widening_cpu_weights(model)]
            for weight, data in model._row_major_weights:
                weight.data = data.t().contiguous().t()
        model._input_major_users = users + 1
    try:
        yield
    finally:
        with _layout_lock:
            model._input_major_users -= 1
            if model._input_major_users == 0:
                for weight, data in model.__dict__.pop("_row_major_weights"):
                    weight.data = data


def gather_attention_heads(module: TurnerAttention, args: tuple, output: tuple) -> tuple:
    """Under tensor parallelism each rank computes A for its own heads: the attention weights it returns (eager
    attention, `output_attentions=True`) are every head's, gathered from all ranks, as in one process."""
    attn_output, attn_weights = output
    if attn_weights is None:
        return output
    from torch.distributed.tensor import DTensor, Shard

    mesh = module.qkv_proj.weight.device_mesh
    return attn_output, DTensor.from_local(attn_weights, mesh, [Shard(1)], run_check=False).full_tensor()


class StackProjections(Concatenate):
    """Loading a checkpoint of an earlier Turner, which held `q_proj`, `k_proj` and `v_proj` (no `k_proj` with
    `share_query_key`) as separate matrices: they are stacked into `qkv_proj`. A projection missing, or present
    where the config has no place for it, is an error naming it; so is loading such a checkpoint sharded, since
    transformers would shard each matrix alone and stack the shards out of order."""

    def convert(self, input_dict: dict, source_patterns: list[str], target_patterns: list[str], **kwargs) -> dict:
        config, target = kwargs["config"], kwargs["full_layer_name"]
        expected = [pattern for pattern in source_patterns if not (config.share_query_key and "k_proj" in pattern)]
        if missing := [pattern for pattern in expected if pattern not in input_dict]:
            raise ValueError(f"the checkpoint has no {missing} to stack into {target}")
        if extra := sorted(set(input_dict) - set(expected)):
            raise ValueError(f"the checkpoint has {extra}, but the config has share_query_key=True (U_k = U_q)")
        if is_dtensor(kwargs["model"].get_parameter(target)):
            raise ValueError(
                f"the checkpoint holds {expected} as separate matrices, which cannot be loaded sharded into {target}: "
                "load it in one process and save_pretrained it once (which stores them stacked), then load that"
            )
        return super().convert(input_dict, source_patterns, target_patterns, **kwargs)


class SeparateProjections(WeightConverter):
    """`StackProjections` on loading; saving writes `qkv_proj` as it is (nothing to reverse)."""

    def reverse_transform(self) -> WeightRenaming:
        return WeightRenaming(self._original_target_patterns, self._original_target_patterns)


register_checkpoint_conversion_mapping(
    TurnerConfig.model_type,
    [
        SeparateProjections(
            source_patterns=["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"],
            target_patterns="self_attn.qkv_proj",
            operations=[StackProjections(dim=0)],
        )
    ],
    overwrite=True,
)

if is_torch_distributed_available():
    from torch.distributed.tensor import distribute_tensor
    from torch.distributed.tensor.placement_types import _StridedShard
    from transformers.distributed.tensor_parallel import ALL_PARALLEL_STYLES, PackedColwiseParallel

    class StackedHeadsColwiseParallel(PackedColwiseParallel):
        """Tensor-parallel style of `qkv_proj`: rank r holds the same whole heads (chunk r) of each of the
        `split_factor` stacked projections, weights and bias alike, and computes its heads' q, k and v."""

        def shard_param(self, module: nn.Module, param: str, mesh) -> None:
            meta = module._parameters.get(param)
            if meta is not None:
                placement = _StridedShard(dim=0, split_factor=self.split_factor)
                sharded = distribute_tensor(meta, mesh, [placement], src_data_rank=None)
                module._parameters[param] = nn.Parameter(sharded, requires_grad=meta.requires_grad)

    for projections in (2, 3):
        ALL_PARALLEL_STYLES.register(
            f"stacked_heads_colwise_{projections}", StackedHeadsColwiseParallel(split_factor=projections)
        )


# The class each Auto class loads from a checkpoint, per modality (`config.is_image_model`). `turner_tfm` registers
# them all, and every saved folder names its modality's in `auto_map`, whichever class was saved.
AUTO_CLASSES = {
    False: {
        "AutoModel": "TurnerModel",
        "AutoModelForCausalLM": "TurnerForCausalLM",
        "AutoModelForSequenceClassification": "TurnerForSequenceClassification",
    },
    True: {"AutoModel": "TurnerModel", "AutoModelForImageClassification": "TurnerForImageClassification"},
}


class TurnerPreTrainedModel(PreTrainedModel):
    config: TurnerConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["TurnerBlock"]
    _skip_keys_device_placement = ["past_key_values"]
    _supports_flash_attn = True
    _supports_sdpa = True
    _supports_flex_attn = True
    _can_compile_fullgraph = True
    _supports_attention_backend = True
    _can_record_outputs = {"hidden_states": TurnerBlock, "attentions": TurnerAttention}

    def __init_subclass__(cls, **kwargs) -> None:
        """A class torch makes at run time around a Turner model (FSDP2's `FSDP<Name>`) keeps the model's module and
        name, so `save_pretrained` of a sharded model copies this file and writes the model's own class into
        `auto_map`, not torch's FSDP sources and a class nobody can import."""
        super().__init_subclass__(**kwargs)
        if cls.__module__.startswith("torch."):
            model_class = next(base for base in cls.__mro__[1:] if issubclass(base, TurnerPreTrainedModel))
            cls.__module__, cls.__name__, cls.__qualname__ = (
                model_class.__module__,
                model_class.__name__,
                model_class.__qualname__,
            )

    @classmethod
    def from_pretrained(
        cls, pretrained_model_name_or_path: str | os.PathLike, *args, **kwargs
    ) -> "TurnerPreTrainedModel":
        """`PreTrainedModel.from_pretrained`, with a damaged weights file reported as such and where it is."""
        try:
            return super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        except SafetensorError as error:
            raise ValueError(
                f"The weights of {str(pretrained_model_name_or_path)!r} cannot be read: the safetensors file is "
                f"truncated or corrupted ({error}). Save or download the checkpoint again."
            ) from error

    def _resolve_parallel_plans(self, distributed_config: DistributedConfig) -> tuple[dict, dict, dict]:
        """transformers' plan resolution for `from_pretrained(distributed_config=...)`, run before any weight loads:
        first refuse a sharding this config cannot take without changing its numbers.

        Under FSDP a tied `lm_head` is tied here, before sharding: FSDP2 must see one shared parameter (transformers
        ties only after loading, by which time FSDP would hold, and train, a second, stale copy of the head).
        """
        self.config.check_parallelism(distributed_config.tp_size, distributed_config.dp_size)
        if distributed_config.dp_size > 1:
            self.tie_weights()
        if distributed_config.tp_size > 1:
            for module in self.modules():
                if isinstance(module, TurnerAttention):
                    module.register_forward_hook(gather_attention_heads, prepend=True)
        return super()._resolve_parallel_plans(distributed_config)

    def save_pretrained(self, save_directory: str | os.PathLike, *args, **kwargs) -> None:
        """`PreTrainedModel.save_pretrained`, with `auto_map` naming every Auto class of the model's modality, so
        `AutoModel` (feature extraction, sentence-transformers, serving engines) and every head load the folder with
        `trust_remote_code=True`, whichever class saved it."""
        if self.is_remote_code():
            module = type(self).__module__.rsplit(".", 1)[-1]
            classes = AUTO_CLASSES[self.config.is_image_model]
            self.config.auto_map = {
                **(getattr(self.config, "auto_map", None) or {}),
                **{auto: f"{module}.{name}" for auto, name in classes.items()},
            }
        super().save_pretrained(save_directory, *args, **kwargs)

    def _require_modality(self, config: TurnerConfig, image: bool) -> None:
        """A text head needs a text config and the image head an image config (`image_size` set)."""
        if config.is_image_model != image:
            wanted = "an image config (set image_size)" if image else "a text config (image_size=None)"
            raise ValueError(f"{type(self).__name__} needs {wanted}; got image_size={config.image_size!r}.")

    def _init_weights(self, module: nn.Module) -> None:
        """Normal(0, initializer_range) for every matrix, ones and zeros for the norms (HF's defaults)."""
        super()._init_weights(module)
        if isinstance(module, TurnerPatchEmbeddings):
            init.trunc_normal_(module.cls_token, mean=0.0, std=self.config.initializer_range)


class TurnerModel(TurnerPreTrainedModel):
    """The backbone: X^(0) from tokens or patches, M transformer blocks, then a final norm (pre-norm only).

    Returns X^(M) as `last_hidden_state`, shape `(batch, N, D)`: the input's shape (§1.2).
    """

    def __init__(self, config: TurnerConfig):
        super().__init__(config)
        self.embeddings = TurnerPatchEmbeddings(config) if config.is_image_model else TurnerEmbeddings(config)
        self.rotary_emb = TurnerRotaryEmbedding(config) if config.position_embedding_type == "rotary" else None
        self.layers = nn.ModuleList([TurnerBlock(config, i) for i in range(config.num_hidden_layers)])
        self.norm = build_norm(config) if config.norm_position == "pre" else None
        self.pooler = TurnerPooler(config) if config.use_pooler else None
        self.gradient_checkpointing = False
        self.decoding = False  # inside generate()'s decoding loop, which feeds back the model's own tokens
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        """The token embedding table, or for images the patch embedding W (§4.2, as ViT returns its own), whose
        output adapters and gradient checkpointing make require grad."""
        return getattr(self.embeddings, self._input_embedding_name)

    def set_input_embeddings(self, value: nn.Module) -> None:
        setattr(self.embeddings, self._input_embedding_name, value)

    @property
    def _input_embedding_name(self) -> str:
        return "patch_embed" if self.config.is_image_model else "embed_tokens"

    @merge_with_config_defaults
    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        pixel_values: torch.Tensor | None = None,
        interpolate_pos_encoding: bool = False,
        use_cache: bool | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> BaseModelOutputWithPoolingAndCrossAttentions:
        r"""
        pixel_values (`torch.Tensor` of shape `(batch, num_channels, height, width)`, *optional*):
            Images, for an image model (`config.image_size` set) in place of `input_ids`.
        interpolate_pos_encoding (`bool`, *optional*, defaults to `False`):
            Resize learned patch positions to accept images of another size than `config.image_size`.
        """
        packed = position_ids is not None and attention_mask is None  # a packed row: positions restart per sequence
        if self.config.is_image_model:
            hidden_states = self._embed_image(pixel_values, input_ids, inputs_embeds, interpolate_pos_encoding)
            use_cache = False
        else:
            hidden_states, past_key_values, position_ids = self._embed_text(
                input_ids, inputs_embeds, attention_mask, position_ids, token_type_ids, past_key_values, use_cache
            )
        mask = self._attention_mask(hidden_states, attention_mask, past_key_values, position_ids, packed)
        rotations = self._rotations(hidden_states, position_ids)

        for block in self.layers:
            hidden_states = block(
                hidden_states,
                attention_mask=mask,
                past_key_values=past_key_values,
                position_embeddings=rotations,
                **kwargs,
            )
        if self.norm is not None:
            hidden_states = self.norm(hidden_states)

        return BaseModelOutputWithPoolingAndCrossAttentions(
            last_hidden_state=hidden_states,
            pooler_output=self.pooler(hidden_states, attention_mask) if self.pooler is not None else None,
            past_key_values=past_key_values if use_cache else None,
        )

    def _embed_text(
        self,
        input_ids: torch.LongTensor | None,
        inputs_embeds: torch.Tensor | None,
        attention_mask: torch.Tensor | None,
        position_ids: torch.LongTensor | None,
        token_type_ids: torch.LongTensor | None,
        past_key_values: Cache | None,
        use_cache: bool | None,
    ) -> tuple[torch.Tensor, Cache | None, torch.LongTensor]:
        check_text_inputs(self.config, input_ids, inputs_embeds, values=not self.decoding)
        check_token_type_ids(
            self.config,
            token_type_ids,
            (input_ids if input_ids is not None else inputs_embeds).shape[:2],
            values=not self.decoding,
        )
        if input_ids is not None:
            inputs_embeds = self.embeddings.embed_tokens(input_ids)
        if use_cache and past_key_values is None and not self.training:  # training never reads a cache back
            past_key_values = appending_cache(DynamicCache(config=self.config))
        past_seen = past_key_values.get_seq_length() if past_key_values is not None else 0
        total_length = _host_int(past_seen + inputs_embeds.shape[1])
        if total_length is not None:
            check_attention_mask(attention_mask, inputs_embeds.shape[0], total_length)
        derived_positions = position_ids is None or self.decoding
        if position_ids is None:
            position_ids = torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device) + past_seen
            position_ids = position_ids.unsqueeze(0)
        self._check_positions(position_ids, total_length, derived_positions)
        hidden_states = self.embeddings(inputs_embeds, position_ids, token_type_ids)
        return hidden_states, past_key_values, position_ids

    def _embed_image(
        self,
        pixel_values: torch.Tensor | None,
        input_ids: torch.Tensor | None,
        inputs_embeds: torch.Tensor | None,
        interpolate_pos_encoding: bool,
    ) -> torch.Tensor:
        if pixel_values is None or input_ids is not None or inputs_embeds is not None:
            raise ValueError(
                "This is an image model (config.image_size is set): pass `pixel_values` only, not `input_ids` or "
                "`inputs_embeds`."
            )
        return self.embeddings(pixel_values, interpolate_pos_encoding)

    def _rotations(
        self, hidden_states: torch.Tensor, position_ids: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Cosines and sines of the rotary positions, shared by every block (None without rotary positions)."""
        if self.rotary_emb is None:
            return None
        if position_ids is None:  # image tokens: the class token, then the patches in raster order
            position_ids = torch.arange(hidden_states.shape[1], device=hidden_states.device).unsqueeze(0)
        return self.rotary_emb(position_ids, hidden_states.dtype)

    def _attention_mask(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None,
        past_key_values: Cache | None,
        position_ids: torch.Tensor | None,
        packed: bool = False,
    ) -> torch.Tensor | None:
        """The §4.1 auto-regressive mask when `is_causal`, else full attention; both combined with the padding. In a
        packed row (`packed`: the caller's positions restart at each sequence, no padding mask) every token attends
        only within its own sequence: transformers finds the sequences for the causal mask, here for the full one."""
        if self.config.is_causal:
            return create_causal_mask(
                config=self.config,
                inputs_embeds=hidden_states,
                attention_mask=attention_mask,
                past_key_values=past_key_values,
                position_ids=position_ids,
            )
        sequences = None
        if packed and (past_key_values is None or past_key_values.get_seq_length() == 0):
            sequences = find_packed_sequence_indices(position_ids.expand(hidden_states.shape[0], -1))
        return create_bidirectional_mask(
            config=self.config,
            inputs_embeds=hidden_states,
            attention_mask=attention_mask,
            past_key_values=past_key_values,
            and_mask_function=None if sequences is None else packed_sequence_mask_function(sequences),
        )

    def _check_positions(self, position_ids: torch.Tensor, total_length: int | None, derived: bool) -> None:
        """Learned positions stop at `max_position_embeddings`. Positions derived from the sequence (here, or by
        generate()) never exceed its length, so within the table they need no read."""
        if self.config.position_embedding_type != "learned":
            return
        limit = self.config.max_position_embeddings
        if derived and total_length is not None and total_length <= limit:
            return
        _check_range(
            "position_ids",
            position_ids,
            0,
            limit,
            f"learned position embeddings cover positions 0..{limit - 1} (max_position_embeddings): shorten the "
            "input (with the cache: prompt + generated tokens), or use position_embedding_type='sinusoidal'",
        )


class TurnerPooler(nn.Module):
    """BERT's pooler: a dense layer and tanh on the first (real) token's final representation."""

    def __init__(self, config: TurnerConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = nn.Tanh()

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.activation(self.dense(first_real_token(hidden_states, attention_mask)))


def first_real_token(hidden_states: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """Each row's first token (§4.2's x_0), or in a left-padded row (a 2-D `attention_mask`) its first real one."""
    if attention_mask is None or attention_mask.ndim != 2:
        return hidden_states[:, 0]
    first = attention_mask.to(torch.long).argmax(dim=-1)
    return hidden_states[torch.arange(hidden_states.shape[0], device=hidden_states.device), first]


class TurnerForCausalLM(TurnerPreTrainedModel, GenerationMixin):
    """§4.1: the masked body and the head `p(w_n = w | x_{n-1}) = softmax(g_w^T x_{n-1})`, `lm_head` holding g_w."""

    _tied_weights_keys = {"lm_head.weight": "model.embeddings.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}
    _fsdp_plan = {"lm_head": "keep_full_weight"}
    _pp_plan = {"lm_head": (["hidden_states"], ["logits"])}

    def __init__(self, config: TurnerConfig):
        super().__init__(config)
        self._require_modality(config, image=False)
        self.model = TurnerModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def init_parallel_plans(self) -> None:
        """The plans of the backbone and the head; a tied embedding and `lm_head` share one weight, which FSDP2
        keeps in one group: the root's, not a group of the embedding's own."""
        super().init_parallel_plans()
        if self.config.tie_word_embeddings:
            self._fsdp_plan.pop("model.embeddings.embed_tokens", None)
            self._fsdp_plan.pop("lm_head", None)

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs: Unpack[TransformersKwargs],
    ) -> CausalLMOutputWithPast:
        r"""
        labels (`torch.LongTensor` of shape `(batch, sequence)`, *optional*):
            Next-token targets, aligned with `input_ids` (the shift happens inside); `-100` is ignored.
        logits_to_keep (`int` or `torch.Tensor`, *optional*):
            Compute logits for the last `logits_to_keep` positions only (0: all), or for the given indices.
        """
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            inputs_embeds=inputs_embeds,
            token_type_ids=token_type_ids,
            use_cache=use_cache,
            **kwargs,
        )
        hidden_states = outputs.last_hidden_state
        kept = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.lm_head(hidden_states[:, kept, :])

        loss = None
        if labels is not None:
            check_causal_lm_labels(labels, hidden_states.shape[:2], self.config.vocab_size)
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)
        return CausalLMOutputWithPast(
            loss=loss,
            logits=logits,
            past_key_values=outputs.past_key_values,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )

    def _prepare_cache_for_generation(
        self, generation_config: GenerationConfig, model_kwargs: dict, *args, **kwargs
    ) -> None:
        """generate()'s own cache, with `TurnerDynamicLayer`s where it would have made `DynamicLayer`s (the default
        and `cache_implementation="offloaded"`); a cache the caller passes is used as given."""
        super()._prepare_cache_for_generation(generation_config, model_kwargs, *args, **kwargs)
        self._new_tokens = generation_config.max_new_tokens  # for _optimize_model_for_decode
        cache = model_kwargs.get("past_key_values")
        if isinstance(cache, DynamicCache) and not getattr(cache, "_is_user_defined", False):
            appending_cache(cache)

    @contextlib.contextmanager
    def _optimize_model_for_decode(self) -> Iterator[None]:
        """generate()'s decoding loop feeds back ids drawn from the model's own `vocab_size` logits: their values need
        no check, which on an accelerator would stall every token on a device sync. The prompt is checked as usual.

        When it will decode at least `INPUT_MAJOR_MIN_NEW_TOKENS` tokens (or an unstated number), the loop runs with
        `input_major_widening_weights`: their copy costs about two tokens' products and saves about a tenth of each
        token's."""
        new_tokens = getattr(self, "_new_tokens", None)
        long_enough = new_tokens is None or new_tokens >= INPUT_MAJOR_MIN_NEW_TOKENS
        layout = input_major_widening_weights(self) if long_enough else contextlib.nullcontext()
        decoding, self.model.decoding = self.model.decoding, True
        try:
            with super()._optimize_model_for_decode(), layout:
                yield
        finally:
            self.model.decoding = decoding


def pool_hidden_states(hidden_states: torch.Tensor, attention_mask: torch.Tensor | None, pooling: str) -> torch.Tensor:
    """One vector per sequence: the first real token (`cls`, §4.2's x_0), the mean over real tokens (`mean`, §4.2's
    spatial pooling), or the last real token (`last`, the only one that has seen the whole sequence under §4.1).

    Padding is read from `attention_mask`, so left- and right-padded batches pool the same tokens.
    """
    if pooling == "cls":
        return first_real_token(hidden_states, attention_mask)
    if attention_mask is None:
        return hidden_states.mean(dim=1) if pooling == "mean" else hidden_states[:, -1]
    mask = attention_mask.to(hidden_states.dtype)
    if pooling == "mean":
        total = (hidden_states * mask.unsqueeze(-1)).sum(dim=1)
        return total / mask.sum(dim=1, keepdim=True).clamp(min=1.0)
    positions = torch.arange(mask.shape[1], device=mask.device)
    last_real = (positions * attention_mask.to(torch.long)).argmax(dim=-1)
    return hidden_states[torch.arange(hidden_states.shape[0], device=hidden_states.device), last_real]


def pool_packed_sequences(hidden_states: torch.Tensor, sequence_index: torch.Tensor, pooling: str) -> torch.Tensor:
    """`pool_hidden_states` for a packed row (`hidden_states` of shape `(1, total, D)`): one vector per sequence, each
    pooled from its own tokens alone. `sequence_index` `(1, total)` numbers the sequence of each token, as transformers'
    `find_packed_sequence_indices` reads it from positions that restart at every sequence."""
    tokens, index = hidden_states[0], sequence_index[0]
    members = index == torch.arange(int(index[-1]) + 1, device=index.device).unsqueeze(1)  # (sequences, total)
    if pooling == "mean":
        weights = members.to(tokens.dtype)
        return weights @ tokens / weights.sum(dim=1, keepdim=True)
    first = members.to(torch.long).argmax(dim=1)
    return tokens[first] if pooling == "cls" else tokens[first + members.sum(dim=1) - 1]


def packed_sequence_index(
    position_ids: torch.Tensor | None,
    attention_mask: torch.Tensor | None,
    input_ids: torch.Tensor | None,
    inputs_embeds: torch.Tensor | None,
) -> torch.Tensor | None:
    """The sequence of each token when the input is a packed row (`DataCollatorWithFlattening`: one row, positions
    restarting at every sequence, no attention mask), else None."""
    inputs = input_ids if input_ids is not None else inputs_embeds
    if position_ids is None or attention_mask is not None or inputs is None:
        return None
    sequence_index = find_packed_sequence_indices(position_ids.reshape(-1, position_ids.shape[-1]))
    batch_size = inputs.shape[0]
    if sequence_index is not None and batch_size * sequence_index.shape[0] != 1:
        raise _invalid_input(
            "position_ids",
            f"{_shape(position_ids)} for a batch of {batch_size}, restarting inside a row,",
            "a packed batch is one row (batch 1) of sequences end to end; pad several rows and pass an attention_mask",
        )
    return sequence_index


class _TurnerClassifierMixin:
    """What the two classifiers share: a backbone, pooling (`config.classifier_pooling`), a linear head, the loss."""

    def _build_classifier(self, config: TurnerConfig, image: bool) -> None:
        self._require_modality(config, image)
        self.num_labels = config.num_labels
        self.model = TurnerModel(config)
        self.dropout = nn.Dropout(config.classifier_dropout)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)

    def _classify(
        self,
        outputs: BaseModelOutputWithPoolingAndCrossAttentions,
        attention_mask: torch.Tensor | None,
        sequence_index: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits for each sequence: each row's, or each of a packed row's sequences (`sequence_index`)."""
        if sequence_index is not None:
            pooled = pool_packed_sequences(outputs.last_hidden_state, sequence_index, self.config.classifier_pooling)
            if self.model.pooler is not None:  # the pooler reads the first token of each row: one row per sequence
                pooled = self.model.pooler(pooled.unsqueeze(1))
        elif outputs.pooler_output is not None:
            pooled = outputs.pooler_output
        else:
            pooled = pool_hidden_states(outputs.last_hidden_state, attention_mask, self.config.classifier_pooling)
        return self.classifier(self.dropout(pooled))

    def _classification_loss(self, logits: torch.Tensor, labels: torch.Tensor | None) -> torch.Tensor | None:
        if labels is None:
            return None
        check_classification_labels(labels, self.config, logits.shape[0])
        return self.loss_function(labels=labels, pooled_logits=logits, config=self.config)


class TurnerForSequenceClassification(_TurnerClassifierMixin, TurnerPreTrainedModel):
    """Sequence classification or regression on a pooled representation of X^(M) (§1.2: "global classification
    of the entire sequence by pooling across the whole representation").

    A packed row (`DataCollatorWithFlattening`: `input_ids` of shape `(1, total)`, `position_ids` restarting at 0 at
    each sequence, no attention mask, no padding token) is classified sequence by sequence: logits `(num_sequences,
    num_labels)`, and `labels` one per sequence, as for a padded batch of the same sequences.
    """

    def __init__(self, config: TurnerConfig):
        super().__init__(config)
        self._build_classifier(config, image=False)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        labels: torch.LongTensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> SequenceClassifierOutputWithPast:
        r"""
        labels (`torch.LongTensor` of shape `(batch,)` or `(batch, num_labels)`, *optional*):
            Class ids (single-label), floats (regression when `num_labels == 1`) or multi-hot floats (multi-label);
            for a packed row, `batch` is its number of sequences.
        """
        pad_token_id = self.config.pad_token_id
        if attention_mask is None and input_ids is not None and pad_token_id is not None:
            padding = input_ids == pad_token_id  # positions with neither a mask nor padding may be a packed row
            attention_mask = (~padding).long() if position_ids is None or bool(padding.any()) else None
        sequence_index = packed_sequence_index(position_ids, attention_mask, input_ids, inputs_embeds)
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            token_type_ids=token_type_ids,
            use_cache=False,
            **kwargs,
        )
        logits = self._classify(outputs, attention_mask, sequence_index)
        return SequenceClassifierOutputWithPast(
            loss=self._classification_loss(logits, labels),
            logits=logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )


class TurnerForImageClassification(_TurnerClassifierMixin, TurnerPreTrainedModel):
    """§4.2: patches and a class token through the body, the softmax head on `x_0^(M)`."""

    main_input_name = "pixel_values"

    def __init__(self, config: TurnerConfig):
        super().__init__(config)
        self._build_classifier(config, image=True)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        interpolate_pos_encoding: bool = False,
        **kwargs: Unpack[TransformersKwargs],
    ) -> ImageClassifierOutput:
        r"""
        interpolate_pos_encoding (`bool`, *optional*, defaults to `False`):
            Resize learned patch positions to accept images of another size than `config.image_size`.
        labels (`torch.LongTensor` of shape `(batch,)`, *optional*):
            Class ids (single-label), floats (regression when `num_labels == 1`) or multi-hot floats (multi-label).
        """
        outputs = self.model(pixel_values=pixel_values, interpolate_pos_encoding=interpolate_pos_encoding, **kwargs)
        logits = self._classify(outputs, None)
        return ImageClassifierOutput(
            loss=self._classification_loss(logits, labels),
            logits=logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )


# --- input checks: clear errors for what users pass in (the model above calls them) ---------------------------


def _invalid_input(name: str, value: object, allowed: str) -> ValueError:
    return ValueError(f"`{name}` {value} is invalid: {allowed}.")


def _shape(tensor: torch.Tensor) -> str:
    return f"of shape {tuple(tensor.shape)}"


def _shape_and_dtype(tensor: torch.Tensor) -> str:
    return f"{_shape(tensor)} and dtype {tensor.dtype}"


def _checks_enabled(tensor: torch.Tensor) -> bool:
    """Value checks read the tensor, so they run only where that is free: on the CPU (on an accelerator a read is a
    device sync, and the embedding lookup's own bounds check stands in), and never while tracing for torch.compile."""
    return tensor.device.type == "cpu" and tensor.numel() > 0 and not is_torchdynamo_compiling()


def _host_int(value: int | torch.Tensor) -> int | None:
    """A length as a Python int, or None while tracing or where reading it would sync a device (a static cache's
    counter on an accelerator)."""
    if is_torchdynamo_compiling():
        return None
    if isinstance(value, torch.Tensor):
        return int(value) if value.device.type == "cpu" else None
    return value


def _check_range(name: str, values: torch.Tensor, low: int, high: int, allowed: str, ignore: int | None = None) -> None:
    """Raise unless every value (other than `ignore`) lies in [low, high)."""
    if not _checks_enabled(values):
        return
    if ignore is not None:
        values = values.masked_fill(values == ignore, low)
    smallest, largest = (int(extreme) for extreme in torch.aminmax(values))
    if smallest < low or largest >= high:
        raise _invalid_input(name, f"contains {smallest if smallest < low else largest}", allowed)


def check_text_inputs(
    config: TurnerConfig, input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor | None, values: bool = True
) -> None:
    """Exactly one of `input_ids` (batch, N) and `inputs_embeds` (batch, N, D), non-empty, ids in the vocabulary
    (unless `values` is False: ids the model produced itself)."""
    if (input_ids is None) == (inputs_embeds is None):
        given = "both" if input_ids is not None else "neither"
        raise ValueError(f"Pass exactly one of `input_ids` and `inputs_embeds`; got {given}.")
    if input_ids is not None:
        if input_ids.ndim != 2 or 0 in input_ids.shape or input_ids.is_floating_point():
            raise _invalid_input(
                "input_ids",
                _shape_and_dtype(input_ids),
                "expected integer token ids of shape (batch, sequence) with batch >= 1 and sequence >= 1",
            )
        if values:
            _check_range("input_ids", input_ids, 0, config.vocab_size, f"token ids must be in [0, {config.vocab_size})")
    elif (
        inputs_embeds.ndim != 3 or 0 in inputs_embeds.shape[:2] or inputs_embeds.shape[2] != config.token_embedding_size
    ):
        raise _invalid_input(
            "inputs_embeds",
            _shape(inputs_embeds),
            f"expected (batch >= 1, sequence >= 1, {config.token_embedding_size}), the token embedding width",
        )


def check_token_type_ids(
    config: TurnerConfig, token_type_ids: torch.Tensor | None, input_shape: torch.Size, values: bool = True
) -> None:
    """Token types index `token_type_embeddings`; a model without them accepts only all-zero types (one segment).

    `values=False` checks the shape only (generate() repeats the types it was given, checked on the first step)."""
    if token_type_ids is None:
        return
    if tuple(token_type_ids.shape) != tuple(input_shape) or token_type_ids.is_floating_point():
        raise _invalid_input(
            "token_type_ids", _shape(token_type_ids), f"expected integer ids of shape {tuple(input_shape)}"
        )
    if config.type_vocab_size:
        allowed = f"types must be in [0, {config.type_vocab_size})"
    else:
        allowed = "this model has no token type embeddings (type_vocab_size=0): pass none, or zeros"
    if values:
        _check_range("token_type_ids", token_type_ids, 0, max(config.type_vocab_size, 1), allowed)


def check_attention_mask(attention_mask: torch.Tensor | None, batch_size: int, total_length: int) -> None:
    """A 2-D padding mask must be (batch, past + current tokens); 4-D masks are taken as prepared by the caller."""
    if attention_mask is None or attention_mask.ndim == 4:
        return
    if attention_mask.ndim != 2 or tuple(attention_mask.shape) != (batch_size, total_length):
        raise _invalid_input(
            "attention_mask",
            _shape(attention_mask),
            f"expected (batch, past + current tokens) = ({batch_size}, {total_length}), 1 for real tokens and 0 "
            "for padding",
        )


def check_causal_lm_labels(labels: torch.Tensor, input_shape: torch.Size, vocab_size: int) -> None:
    """Labels align with the input tokens: same (batch, N), integer ids in the vocabulary or -100 (ignored)."""
    if tuple(labels.shape) != tuple(input_shape) or labels.is_floating_point():
        raise _invalid_input(
            "labels",
            _shape_and_dtype(labels),
            f"expected integer token ids of shape {tuple(input_shape)}, like input_ids",
        )
    _check_range("labels", labels, 0, vocab_size, f"ids must be in [0, {vocab_size}) or -100 (ignored)", ignore=-100)


def check_classification_labels(labels: torch.Tensor, config: TurnerConfig, batch_size: int) -> None:
    """The label forms `transformers`' classification loss accepts, checked before it sees them."""
    num_labels, problem = config.num_labels, config.problem_type
    if problem == "regression" or (problem is None and num_labels == 1):
        if labels.numel() != batch_size * num_labels or not labels.is_floating_point():
            raise _invalid_input(
                "labels",
                _shape_and_dtype(labels),
                f"regression expects {batch_size} x {num_labels} floats",
            )
    elif problem == "multi_label_classification" or (problem is None and labels.is_floating_point()):
        if tuple(labels.shape) != (batch_size, num_labels) or not labels.is_floating_point():
            raise _invalid_input(
                "labels",
                _shape_and_dtype(labels),
                f"multi-label classification expects floats of shape ({batch_size}, {num_labels})",
            )
        if _checks_enabled(labels) and bool(((labels < 0) | (labels > 1)).any()):
            raise _invalid_input("labels", "contains values outside [0, 1]", "multi-label targets must be in [0, 1]")
    else:
        if labels.numel() != batch_size or labels.is_floating_point():
            raise _invalid_input(
                "labels",
                _shape_and_dtype(labels),
                f"single-label classification expects {batch_size} integer class ids",
            )
        _check_range("labels", labels, 0, num_labels, f"class ids must be in [0, {num_labels})", ignore=-100)


__all__ = [
    "TurnerForCausalLM",
    "TurnerForImageClassification",
    "TurnerForSequenceClassification",
    "TurnerModel",
    "TurnerPreTrainedModel",
]
