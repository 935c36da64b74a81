"""Generation machinery of the Turner causal LM (as `models/parakeet/generation_parakeet.py` keeps its own): the
appending KV cache and the `generate()` hooks. `modeling_turner.py` imports it; `save_pretrained` copies it beside it.
"""

import copy
import functools

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer
from transformers.generation import (
    GenerationConfig,
    GenerationMixin,
    GenerationMode,
    MaxLengthCriteria,
    MaxTimeCriteria,
)
from transformers.modeling_outputs import ModelOutput
from transformers.utils import logging
from transformers.utils.import_utils import is_torchdynamo_compiling

from .checks_turner import (
    check_cache,
    check_generate_inputs,
    check_generated_pad,
    check_generation_length,
    current_generate,
    generate_call,
    inputs_checked_from_now,
)
from .compat_turner import CACHE_NAME
from .configuration_turner import TurnerConfig

logger = logging.get_logger(__name__)


class TurnerDynamicLayer(DynamicLayer):
    """A `DynamicCache` layer that appends in place (§4.1's incremental property: earlier keys and values never
    change, so a new token need not copy them).

    `DynamicLayer` concatenates, copying the whole cache for every new token (O(N^2) copying over a generation, a
    fresh allocation each step). Here keys and values are views of the first N rows of a buffer that doubles when
    full, so a token costs one write and total copying stays under twice the final length.

    As safe as `DynamicLayer`, whose tensors are never written after they are returned: a row of the buffer is written
    once, only if no tensor handed out so far covers it. The buffer remembers the keys and values it handed out last
    (shared with a shallow copy of the layer, which views the same buffer), and the next update appends in place only
    if the layer still holds exactly those: whatever replaced them (a crop, a reset, beam reordering, batch selection,
    offloading, another copy's update) starts a new buffer instead of writing over rows a caller may still hold.
    Steps that autograd records, or that dynamo traces, concatenate as `DynamicLayer` does, and so do steps on the CPU
    while the layer's keys and values are small (`concatenates_on_cpu_up_to`).
    """

    min_capacity = 256
    # Bytes of keys and values together up to which a layer on the CPU concatenates: the copy leaves them in a core's
    # L2 cache just before attention reads them, where appended ones come from memory (docs/benchmarks.md)
    concatenates_on_cpu_up_to = 1 << 20
    # The buffers, set by the first update and shared by shallow copies, live in a slot, outside the instance's
    # `__dict__`: transformers' exporters flatten a cache layer through vars() (`exporters/exporter_dynamo.py`), and
    # a rebuilt layer, without them, starts a new buffer at its first update.
    __slots__ = ("_buffers",)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        start = self.get_seq_length()
        end = start + key_states.shape[-2]
        if self._concatenates(key_states, end):
            if not start:  # as concatenating to nothing, without the copy (a training step's cache, a prompt)
                self.lazy_initialization(key_states, value_states)
                self.keys, self.values = key_states, value_states
                return self.keys, self.values
            return super().update(key_states, value_states, *args, **kwargs)
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        buffers = getattr(self, "_buffers", None)
        if buffers is None or not buffers.extend(self.keys, self.values, key_states, end):
            buffers = self._buffers = _AppendBuffers(self.keys, self.values, start, key_states, value_states, end)
        buffers.keys[..., start:end, :] = key_states
        buffers.values[..., start:end, :] = value_states
        self.keys = buffers.handed_keys = buffers.keys[..., :end, :]
        self.values = buffers.handed_values = buffers.values[..., :end, :]
        return self.keys, self.values

    def _concatenates(self, key_states: torch.Tensor, end: int) -> bool:
        """Whether this update concatenates as `DynamicLayer` does: autograd records it, dynamo traces it, or on the
        CPU the keys and values, `end` positions long, stay small enough (`concatenates_on_cpu_up_to`)."""
        if (key_states.requires_grad and torch.is_grad_enabled()) or is_torchdynamo_compiling():
            return True
        cache_bytes = 2 * _bytes_per_row(key_states) * end
        return key_states.device.type == "cpu" and cache_bytes <= self.concatenates_on_cpu_up_to

    def __deepcopy__(self, memo: dict) -> DynamicLayer:
        """A deep copy is a plain `DynamicLayer` owning compact copies of the keys and values (no buffer): it costs
        its length, not the buffer's capacity, and continues as GPT-2's cache does. transformers' exporters trace
        generate() on deep copies of its cache, so an exported program takes and returns GPT-2's caches
        (`DynamicCache(config=...)`) and loads without turner_tfm."""
        copied = DynamicLayer.__new__(DynamicLayer)
        memo[id(self)] = copied
        for name, value in vars(self).items():
            if isinstance(value, torch.Tensor) and not value.is_contiguous():  # a view of the buffer's first rows
                memo[id(value)] = value.contiguous()
            copied.__dict__[name] = copy.deepcopy(value, memo)
        return copied

    def reset(self) -> None:
        """As `DynamicLayer.reset`; the buffer is let go, since tensors read before the reset may view it."""
        self._buffers = None
        super().reset()


def _bytes_per_row(states: torch.Tensor) -> int:
    """The bytes of one position's keys (or values): every batch row and head."""
    return states.numel() // max(states.shape[-2], 1) * states.element_size()


class _AppendBuffers:
    """The buffers a `TurnerDynamicLayer` appends to, and the keys and values (views of their first rows) it handed
    out last."""

    __slots__ = ("handed_keys", "handed_values", "inference", "keys", "values")

    def __init__(
        self,
        keys: torch.Tensor,
        values: torch.Tensor,
        length: int,
        key_states: torch.Tensor,
        value_states: torch.Tensor,
        end: int,
    ):
        """Buffers for rows up to `end` at least, holding the first `length` rows (`keys`, `values`)."""
        capacity = max(2 * end, TurnerDynamicLayer.min_capacity)
        self.keys, self.values = (
            new.new_empty((*new.shape[:-2], capacity, new.shape[-1])) for new in (key_states, value_states)
        )
        if length:
            self.keys[..., :length, :] = keys
            self.values[..., :length, :] = values
        self.handed_keys, self.handed_values = keys, values
        self.inference = self.keys.is_inference()  # an inference tensor cannot be written outside inference mode

    def extend(self, keys: torch.Tensor, values: torch.Tensor, key_states: torch.Tensor, end: int) -> bool:
        """Whether rows up to `end` can be written in place: the layer holds what was handed out last, the new
        states are of the same batch, heads and dtype, and they fit."""
        return (
            keys is self.handed_keys
            and values is self.handed_values
            and end <= self.keys.shape[-2]
            and key_states.shape[:-2] == self.keys.shape[:-2]
            and key_states.dtype == self.keys.dtype
            and (not self.inference or torch.is_inference_mode_enabled())
        )


def appending_cache(cache: Cache) -> Cache:
    """`cache` with its empty `DynamicLayer`s replaced by `TurnerDynamicLayer`s (other layer kinds are kept)."""
    cache.layers = [
        TurnerDynamicLayer() if type(layer) is DynamicLayer and not layer.is_initialized else layer
        for layer in cache.layers
    ]
    return cache


def forward_cache(config: TurnerConfig, cache: Cache | None, use_cache: bool | None) -> Cache | None:
    """The cache a forward pass of the backbone uses: the caller's (`check_cache`), or with `use_cache` a fresh
    appending one, for a causal model only (only it reads keys back, §4.1)."""
    cache = check_cache(config, cache)
    if use_cache and cache is None and config.is_causal:
        cache = appending_cache(DynamicCache(config=config))
    return cache


# Decoding that feeds the model only tokens it chose from its own logits (and the pad id, checked up front): past the
# prompt, its forward passes are not checked. Assisted decoding feeds another model's candidates, and a decoding method
# from the Hub (`custom_generate`) may feed anything: each of their forward passes is checked.
OWN_TOKENS = frozenset(
    {GenerationMode.GREEDY_SEARCH, GenerationMode.SAMPLE, GenerationMode.BEAM_SEARCH, GenerationMode.BEAM_SAMPLE}
)


class _Generate:
    """What a Turner generate() call knows of itself: from its arguments, then from transformers' settings."""

    __slots__ = ("assistant", "criteria", "custom", "own_tokens", "prompt_length")

    def __init__(self, prompt: object, kwargs: dict):
        self.prompt_length = prompt.shape[-1] if isinstance(prompt, torch.Tensor) else 0  # generate()'s own count
        self.assistant = kwargs.get("assistant_model")
        self.custom = kwargs.get("custom_generate") is not None
        self.criteria = list(kwargs.get("stopping_criteria") or [])  # the caller's own
        self.own_tokens = False  # the decoding feeds the model only its own tokens (`OWN_TOKENS`)


class TurnerGenerationMixin(GenerationMixin):
    """`generate()` for the Turner causal LM: its own dynamic caches append in place, a bidirectional model decodes
    without a cache, a prompt that would outgrow learned positions is refused before the first step, and the tokens
    the model chose are not checked again. Nothing else changes, and the model's parameters are never touched."""

    def generate(self, *args, **kwargs):
        """`GenerationMixin.generate`, the prompt and its mask checked first (generate() derives positions from the
        mask before the model sees either). A bidirectional model decodes without a cache: every new token changes
        the keys and values of the earlier ones."""
        prompt = args[0] if args else kwargs.get("inputs", kwargs.get("input_ids"))
        check_generate_inputs(prompt, kwargs.get("attention_mask"))
        if not self.config.is_causal:
            logger.warning_once(
                f"{type(self).__name__} is bidirectional (is_causal=False): generate() runs without a cache, since "
                "every new token changes the keys and values of the earlier ones."
            )
            kwargs["use_cache"] = False
        with generate_call(_Generate(prompt, kwargs)):
            return super().generate(*args, **kwargs)

    def _prepare_cache_for_generation(
        self,
        generation_config: GenerationConfig,
        model_kwargs: dict,
        generation_mode: GenerationMode,
        batch_size: int,
        *args,
        **kwargs,
    ) -> None:
        """generate()'s own cache, with `TurnerDynamicLayer`s where it would have made `DynamicLayer`s (a cache the
        caller passes is used as given). First, with the settings resolved, what must be refused before any step: a
        prompt that would outgrow learned positions, and a pad id outside the vocabulary that greedy or sampled
        decoding would feed the model after a row ends early."""
        state = current_generate()
        if state is not None:
            check_generation_length(self.config, state.prompt_length, generation_config.max_length)
            state.own_tokens = generation_mode in OWN_TOKENS and not state.custom
            rows = batch_size * generation_config.num_return_sequences
            padded = generation_mode in (GenerationMode.GREEDY_SEARCH, GenerationMode.SAMPLE) and rows > 1
            if padded and generation_config.max_length - state.prompt_length > 1:  # a token is fed after the first
                row_end = functools.partial(_what_ends_a_row_early, generation_config, state, self.config)
                check_generated_pad(self.config, _pad_token_id(generation_config), row_end)
        super()._prepare_cache_for_generation(
            generation_config, model_kwargs, generation_mode, batch_size, *args, **kwargs
        )
        cache = model_kwargs.get(CACHE_NAME)
        if isinstance(cache, DynamicCache) and not getattr(cache, "_is_user_defined", False):
            appending_cache(cache)

    def _prefill(self, *args, **kwargs) -> ModelOutput:
        """The prompt's forward passes, checked as any other; the decoding steps after them, fed the model's own
        tokens (`OWN_TOKENS`), are not."""
        outputs = super()._prefill(*args, **kwargs)
        if (state := current_generate()) is not None and state.own_tokens:
            inputs_checked_from_now()
        return outputs


def _what_ends_a_row_early(generation_config: GenerationConfig, state: _Generate, config: TurnerConfig) -> str | None:
    """What can end one row of a batch before the others, so that greedy or sampled decoding feeds the pad id after
    it: a stop string, an end-of-sequence id the model can generate (one in the vocabulary), or a criterion of the
    caller's (it may stop any row). None where nothing can: `max_length` and `max_time` stop every row at once, and
    without an end-of-sequence criterion the decoding pads no row at all (as `GenerationMixin._sample` decides)."""
    eos = generation_config.eos_token_id
    eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    if not eos and not any(hasattr(criterion, "eos_token_id") for criterion in state.criteria):
        return None
    if generation_config.stop_strings:
        return "at a stop string"
    if generable := [token for token in eos if 0 <= token < config.vocab_size]:
        return f"the end-of-sequence id {generable[0]} can be generated"
    for criterion in state.criteria:
        if type(criterion) not in (MaxLengthCriteria, MaxTimeCriteria):
            return f"{type(criterion).__name__} may end one"
    return None


def _pad_token_id(generation_config: GenerationConfig) -> int | None:
    """The id greedy and sampled decoding write after a row ends: `pad_token_id`, else the first `eos_token_id`
    (none without an end of sequence)."""
    eos = generation_config.eos_token_id
    if eos is None or eos == []:
        return None
    if generation_config.pad_token_id is not None:
        return generation_config.pad_token_id
    return eos[0] if isinstance(eos, list) else eos
