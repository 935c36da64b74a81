"""Checks of what users pass to a Turner model: each bad input is a `ValueError` that names the argument, the value
and what is valid, before torch would fail deep inside with a shape or index error (or, for an index past a table on
an accelerator, a device-side assert).

Value checks read tensors, so they run only where that costs nothing (`_checks_enabled`). `modeling_turner.py` calls
these functions; `save_pretrained` copies this file beside it.
"""

import torch
from transformers.cache_utils import Cache
from transformers.utils.import_utils import is_torchdynamo_compiling

from .configuration_turner import TurnerConfig


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


def check_text_inputs(config: TurnerConfig, input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor | None) -> None:
    """Exactly one of `input_ids` (batch, N) and `inputs_embeds` (batch, N, D), non-empty, ids in the vocabulary."""
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
        _check_range("input_ids", input_ids, 0, config.vocab_size, f"token ids must be in [0, {config.vocab_size})")
    elif (
        inputs_embeds.ndim != 3 or 0 in inputs_embeds.shape[:2] or inputs_embeds.shape[2] != config.token_embedding_size
    ):
        raise _invalid_input(
            "inputs_embeds",
            _shape(inputs_embeds),
            f"expected (batch >= 1, sequence >= 1, {config.token_embedding_size}), the token embedding width",
        )


def check_token_type_ids(config: TurnerConfig, token_type_ids: torch.Tensor | None, input_shape: torch.Size) -> None:
    """Token types index `token_type_embeddings`; a model without them accepts only all-zero types (one segment)."""
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
    _check_range("token_type_ids", token_type_ids, 0, max(config.type_vocab_size, 1), allowed)


def check_attention_mask(attention_mask: torch.Tensor | None, batch_size: int, total_length: int) -> None:
    """A 2-D padding mask must be (batch, past + current tokens); 4-D masks, and continuous batching's masks per
    layer type (a dict), are taken as prepared by the caller."""
    if attention_mask is None or isinstance(attention_mask, dict) or attention_mask.ndim == 4:
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


def check_image_inputs(
    config: TurnerConfig,
    pixel_values: torch.Tensor | None,
    input_ids: torch.Tensor | None,
    inputs_embeds: torch.Tensor | None,
    interpolate_pos_encoding: bool,
) -> None:
    """`pixel_values` alone, of shape (batch, channels, image_size, image_size); any positive multiple of the patch
    size when the positions are interpolated."""
    if pixel_values is None or input_ids is not None or inputs_embeds is not None:
        raise ValueError(
            "This is an image model (config.image_size is set): pass `pixel_values` only, not `input_ids` or "
            "`inputs_embeds`."
        )
    channels, size, patch = config.num_channels, config.image_size, config.patch_size
    if pixel_values.ndim != 4 or pixel_values.shape[0] == 0 or pixel_values.shape[1] != channels:
        raise _invalid_input("pixel_values", _shape(pixel_values), f"expected (batch >= 1, {channels}, height, width)")
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


def check_position_ids(
    config: TurnerConfig, position_ids: torch.Tensor, total_length: int | None, derived: bool
) -> None:
    """Learned positions stop at `max_position_embeddings`. Positions derived from the sequence (by the model, or by
    generate()) never exceed its length, so within the table they need no read."""
    limit = config.max_positions
    if limit is None or (derived and total_length is not None and total_length <= limit):
        return
    _check_range(
        "position_ids",
        position_ids,
        0,
        limit,
        f"learned position embeddings cover positions 0..{limit - 1} (max_position_embeddings): shorten the "
        "input (with the cache: prompt + generated tokens), or use position_embedding_type='sinusoidal'",
    )


def check_text_forward(
    config: TurnerConfig,
    input_ids: torch.Tensor | None,
    inputs_embeds: torch.Tensor | None,
    token_type_ids: torch.Tensor | None,
    attention_mask: torch.Tensor | None,
    past_length: int | torch.Tensor,
) -> int | None:
    """Everything a text forward pass takes, before it is used. Returns the length of past and current tokens
    together, or None where reading it would sync a device (`_host_int`)."""
    check_text_inputs(config, input_ids, inputs_embeds)
    input_shape = (input_ids if input_ids is not None else inputs_embeds).shape[:2]
    check_token_type_ids(config, token_type_ids, input_shape)
    total_length = _host_int(past_length + input_shape[1])
    if total_length is not None:
        check_attention_mask(attention_mask, input_shape[0], total_length)
    return total_length


def check_modality(model_name: str, config: TurnerConfig, image: bool) -> None:
    """A text head needs a text config and the image head an image config (`image_size` set)."""
    if config.is_image_model != image:
        wanted = "an image config (set image_size)" if image else "a text config (image_size=None)"
        raise ValueError(f"{model_name} needs {wanted}; got image_size={config.image_size!r}.")


def check_cache(config: TurnerConfig, cache: object | None) -> object | None:
    """The cache a forward pass may use. A bidirectional model (`is_causal=False`) keeps none: each new token would
    change the keys and values of every earlier one (the incremental property of §4.1 needs the causal mask), so an
    empty cache is left unused, as BERT's encoder does, and one that already holds tokens is refused."""
    if config.is_causal or not isinstance(cache, Cache):  # continuous batching's paged cache keeps its own rules
        return cache
    if cache.get_seq_length() == 0:
        return None
    raise _invalid_input(
        "cache",
        f"holding {cache.get_seq_length()} tokens",
        "this model is bidirectional (is_causal=False): a new token changes every earlier token's keys and values, "
        "so it cannot continue from a cache; pass the whole sequence",
    )


def check_cache_position(cache_position: torch.Tensor | None, past_length: int | torch.Tensor, length: int) -> None:
    """`cache_position`, which older decoding loops pass, must be where the model writes this step's keys and values
    anyway: `past_length, ..., past_length + length - 1`. The model derives them itself, so nothing else reads it."""
    if cache_position is None:
        return
    expected = f"the cache slots of this step, {past_length}..{past_length + length - 1} (or leave it out)"
    if not isinstance(cache_position, torch.Tensor) or cache_position.shape != (length,):
        raise _invalid_input(
            "cache_position",
            _shape(cache_position) if isinstance(cache_position, torch.Tensor) else repr(cache_position),
            f"expected a tensor of shape ({length},): {expected}",
        )
    if _checks_enabled(cache_position):
        slots = torch.arange(length) + past_length
        if not torch.equal(cache_position.cpu().long(), slots):
            raise _invalid_input("cache_position", f"{cache_position.tolist()}", expected)
