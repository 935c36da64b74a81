"""Generation machinery of the Turner causal LM (as `models/parakeet/generation_parakeet.py` keeps its own): the
appending KV cache and the `generate()` hooks. `modeling_turner.py` imports it; `save_pretrained` copies it beside it.
"""

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer
from transformers.generation import GenerationConfig, GenerationMixin
from transformers.utils import logging
from transformers.utils.import_utils import is_torchdynamo_compiling

from .compat_turner import CACHE_NAME

logger = logging.get_logger(__name__)


class TurnerDynamicLayer(DynamicLayer):
    """A `DynamicCache` layer that appends in place (§4.1's incremental property: earlier keys and values never
    change, so a new token need not copy them).

    `DynamicLayer` concatenates, copying the whole cache for every new token (O(N^2) copying over a generation, a
    fresh allocation each step). Here keys and values are views of the first N rows of a buffer that doubles when
    full, so a token costs one write and total copying stays under twice the final length.

    As safe as `DynamicLayer`, whose tensors are never written after they are returned: a row of the buffer is written
    once, only if no tensor handed out so far covers it. The buffer remembers how many rows it has exposed (shared
    with a shallow copy of the layer, which views the same buffer); after a crop, a reset or a copy that shrinks the
    cache below that mark, the next update starts a new buffer instead of writing over rows a caller may still hold.
    Whatever else replaces `keys` (beam reordering, batch selection, offloading) is not a prefix of the buffer and
    also starts a new one. Steps that autograd records, or that dynamo traces, concatenate as `DynamicLayer` does.
    """

    min_capacity = 256
    _buffers: list | None = None  # [keys, values, rows exposed], set by the first update; shared by shallow copies

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if is_torchdynamo_compiling() or (torch.is_grad_enabled() and key_states.requires_grad):
            if not self.get_seq_length():  # as concatenating to nothing, without the copy (a training step's cache)
                self.lazy_initialization(key_states, value_states)
                self.keys, self.values = key_states, value_states
                return self.keys, self.values
            return super().update(key_states, value_states, *args, **kwargs)
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        length = self.get_seq_length()
        if not self._buffers_hold(length, key_states, value_states):
            self._new_buffers(length, key_states, value_states)
        key_buffer, value_buffer, _ = self._buffers
        end = length + key_states.shape[-2]
        key_buffer[..., length:end, :] = key_states
        value_buffer[..., length:end, :] = value_states
        self._buffers[2] = end
        self.keys, self.values = key_buffer[..., :end, :], value_buffer[..., :end, :]
        return self.keys, self.values

    def reset(self) -> None:
        """As `DynamicLayer.reset`; the buffer is let go, since tensors read before the reset may view it."""
        self._buffers = None
        super().reset()

    def _buffers_hold(self, length: int, key_states: torch.Tensor, value_states: torch.Tensor) -> bool:
        """The buffers hold the cache as their first `length` rows, no row past them was ever handed out, and the new
        states fit beside them."""
        if self._buffers is None:
            return False
        key_buffer, value_buffer, exposed = self._buffers
        if length != exposed or length + key_states.shape[-2] > key_buffer.shape[-2]:
            return False
        if key_buffer.is_inference() and not torch.is_inference_mode_enabled():
            return False  # an inference tensor cannot be written outside inference mode
        return all(
            _is_prefix(cached, buffer, new)
            for cached, buffer, new in zip(
                (self.keys, self.values), (key_buffer, value_buffer), (key_states, value_states), strict=True
            )
        )

    def _new_buffers(self, length: int, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        capacity = max(2 * (length + key_states.shape[-2]), self.min_capacity)
        key_buffer, value_buffer = (
            new.new_empty((*new.shape[:-2], capacity, new.shape[-1])) for new in (key_states, value_states)
        )
        if length:
            key_buffer[..., :length, :] = self.keys
            value_buffer[..., :length, :] = self.values
        self._buffers = [key_buffer, value_buffer, length]


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


class TurnerGenerationMixin(GenerationMixin):
    """`generate()` for the Turner causal LM: its own dynamic caches append in place, and a bidirectional model
    decodes without a cache. Nothing else changes, and the model's parameters are never touched."""

    def _prepare_cache_for_generation(
        self, generation_config: GenerationConfig, model_kwargs: dict, *args, **kwargs
    ) -> None:
        """generate()'s own cache, with `TurnerDynamicLayer`s where it would have made `DynamicLayer`s (the default
        and `cache_implementation="offloaded"`); a cache the caller passes is used as given."""
        if not self.config.is_causal:
            logger.warning_once(
                f"{type(self).__name__} is bidirectional (is_causal=False): generate() runs without a cache, since "
                "every new token changes the keys and values of the earlier ones."
            )
            generation_config.use_cache = False
        super()._prepare_cache_for_generation(generation_config, model_kwargs, *args, **kwargs)
        cache = model_kwargs.get(CACHE_NAME)
        if isinstance(cache, DynamicCache) and not getattr(cache, "_is_user_defined", False):
            appending_cache(cache)
