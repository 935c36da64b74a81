"""Checks of what users pass to a Turner model: each bad input is a `ValueError` that names the argument, the value
and what is valid, before torch would fail deep inside with a shape or index error (on an accelerator, a device-side
assert that leaves the device unusable).

One seam: each forward is decorated with `checks_inputs`, which reads the call's arguments by name. The outermost
Turner forward checks; the forwards it calls (a head's backbone), and generate()'s steps that feed the model its own
tokens (`inputs_checked_from_now`), do not check again.

Functions named `check_*` raise at once (shapes, on the host, for free). Functions named `*_range` return a
`RangeCheck`, a deferred check of values (token ids, labels, positions): a call's range checks are read back together,
one host read (`raise_if_out_of_range`). On XLA the read joins the step's graph and is made when the step runs
(`torch_xla.sync()`), except within generate(), which never syncs and reads at once. Nothing is read while
torch.compile or torch.export traces or a CUDA graph is captured, and `config.check_input_values=False` turns the reads
off.
"""

import functools
import importlib
import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import NamedTuple

import torch
from torch.nn.attention.flex_attention import BlockMask
from transformers.cache_utils import Cache
from transformers.utils import logging
from transformers.utils.import_utils import is_torchdynamo_compiling

from .compat_turner import cached_length
from .configuration_turner import TurnerConfig

logger = logging.get_logger(__name__)


def _invalid_input(name: str, value: object, allowed: str) -> ValueError:
    return ValueError(f"`{name}` {value} is invalid: {allowed}.")


def _shape(tensor: torch.Tensor) -> str:
    return f"of shape {tuple(tensor.shape)}"


def _shape_and_dtype(tensor: torch.Tensor) -> str:
    return f"{_shape(tensor)} and dtype {tensor.dtype}"


def reads_values(config: TurnerConfig, tensor: torch.Tensor | None) -> bool:
    """Whether the range checks may read `tensor` back: they are on, and nothing traces (a value is a symbol there),
    captures a CUDA graph (a read cannot be captured) or stands in for data (meta tensors)."""
    if tensor is None or not config.check_input_values or is_torchdynamo_compiling() or tensor.device.type == "meta":
        return False
    return not (tensor.is_cuda and torch.cuda.is_current_stream_capturing())


class RangeCheck(NamedTuple):
    """`name`'s values must lie in [low, high); `extremes`: their smallest and largest, 0-d tensors on their device."""

    name: str
    extremes: tuple[torch.Tensor, torch.Tensor]
    low: int
    high: int
    allowed: str
    values: torch.Tensor | None = None  # where the error looks for the offending value
    shown: str | torch.Tensor | None = None  # what the error shows instead of it ("{value}": the offending value)


def value_range(
    name: str, values: torch.Tensor, low: int, high: int, allowed: str, ignore: int | None = None
) -> RangeCheck | None:
    """Every value of `values` (other than `ignore`) must lie in [low, high); None for an empty tensor."""
    if values.numel() == 0:
        return None
    if ignore is not None:
        values = values.masked_fill(values == ignore, low)
    return RangeCheck(name, _extremes(values), low, high, allowed, values)


def _extremes(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The smallest and the largest value, on their device: one kernel (aminmax), or min and max on XLA, which does
    not compile aminmax."""
    if values.device.type == "xla":
        return values.min(), values.max()
    return tuple(torch.aminmax(values))


# True while the inputs of a forward about to run are known to be checked: inside a checked Turner forward, and in
# generate() past the prompt when it feeds the model only its own tokens
_CHECKED: ContextVar[bool] = ContextVar("turner_inputs_checked", default=False)
# What generate() knows of the call it runs (`generation_turner`), for the length of the call; None outside it
_GENERATE: ContextVar[object | None] = ContextVar("turner_generate", default=None)


@contextmanager
def generate_call(state: object) -> Iterator[None]:
    """The length of a generate() call: its `state` (`current_generate()`), the checks on until it says otherwise."""
    tokens = _GENERATE.set(state), _CHECKED.set(False)
    try:
        yield
    finally:
        _CHECKED.reset(tokens[1])
        _GENERATE.reset(tokens[0])


def current_generate() -> object | None:
    """The state of the generate() call running (None outside one)."""
    return _GENERATE.get()


def inputs_checked_from_now() -> None:
    """Within generate() (`generate_call`), the forwards still to come are fed the model's own tokens: no checks."""
    _CHECKED.set(True)


# What a forward's inputs are checked for: (config, the call's arguments by name) -> the deferred range checks, and
# the shape the labels align with
InputCheck = Callable[[TurnerConfig, dict], tuple[list, tuple[int, ...]]]
# What its labels are checked for: (config, the call's arguments, the inputs' shape) -> a deferred range check
LabelCheck = Callable[[TurnerConfig, dict, tuple[int, ...]], "RangeCheck | None"]


def checks_inputs(inputs: InputCheck, labels: LabelCheck | None = None) -> Callable:
    """Decorate a Turner forward: its arguments, read by name, are checked by `inputs` and `labels` (shapes at once,
    values in one read) unless a Turner forward around it checked them already."""

    def decorate(forward: Callable) -> Callable:
        names = list(inspect.signature(forward).parameters)[1:]  # after `self`

        @functools.wraps(forward)
        def checked_forward(self, *args, **kwargs):
            if torch.compiler.is_compiling():  # shapes only, at every level: no context variable under a tracer
                check_call(self.config, names, args, kwargs, inputs, labels)
                return forward(self, *args, **kwargs)
            if _CHECKED.get():
                return forward(self, *args, **kwargs)
            check_call(self.config, names, args, kwargs, inputs, labels)
            token = _CHECKED.set(True)
            try:
                return forward(self, *args, **kwargs)
            finally:
                _CHECKED.reset(token)

        return checked_forward

    return decorate


def check_call(
    config: TurnerConfig, names: list, args: tuple, kwargs: dict, inputs: InputCheck, labels: LabelCheck | None
) -> None:
    # by index, not `zip(names, args, strict=False)`: torch 2.9's dynamo fails on a zip of unequal lengths
    call = {**{names[index]: arg for index, arg in enumerate(args)}, **kwargs} if args else kwargs
    ranges, shape = inputs(config, call)
    if labels is not None:
        ranges.append(labels(config, call, shape))
    raise_if_out_of_range(ranges)


def raise_if_out_of_range(checks: list[RangeCheck | None]) -> None:
    """Read every check's extremes back in one go (one device sync on an accelerator; on XLA when the step runs, or at
    once within generate()), then raise for the first check whose values leave their range, saying where."""
    checks = [check for check in checks if check is not None]
    if not checks:
        return
    device = checks[0].extremes[0].device
    extremes = torch.stack([extreme.to(device) for check in checks for extreme in check.extremes])
    if device.type == "xla" and _GENERATE.get() is None:
        # imported by name, so that a saved folder's remote code does not ask for torch_xla
        xla_model = importlib.import_module("torch_xla.core.xla_model")
        xla_model.add_step_closure(_raise_if_outside, (checks, extremes))
        return
    _raise_if_outside(checks, extremes)


def _raise_if_outside(checks: list[RangeCheck], extremes: torch.Tensor) -> None:
    extremes = extremes.tolist()
    for index, check in enumerate(checks):
        smallest, largest = extremes[2 * index : 2 * index + 2]
        if smallest < check.low or largest >= check.high:
            found = _offending(check, smallest if smallest < check.low else largest)
            raise ValueError(f"`{check.name}` {found}; {check.allowed}.")


def _offending(check: RangeCheck, value: int) -> str:
    """What `check.name` holds that left the range, and where (the error reads the tensor again: its own cost)."""
    if isinstance(check.shown, torch.Tensor):
        return f"is {check.shown.tolist()}"
    if check.shown is not None:
        return check.shown.format(value=value)
    row, *rest = (check.values == value).nonzero()[0].tolist()
    return f"has {value} at row {row}" + (f", position {rest[-1]}" if rest else "")


def backbone_inputs(config: TurnerConfig, call: dict) -> tuple[list, tuple[int, ...]]:
    """`TurnerModel`'s inputs: images for an image model, else text."""
    return (image_inputs if config.is_image_model else text_inputs)(config, call)


def text_inputs(config: TurnerConfig, call: dict) -> tuple[list, tuple[int, int]]:
    """Everything a text call takes, the cache included: shapes checked at once; the range checks of the values, and
    the inputs' (batch, N)."""
    input_ids, inputs_embeds, token_type_ids = (
        call.get("input_ids"),
        call.get("inputs_embeds"),
        call.get("token_type_ids"),
    )
    position_ids, cache_position = call.get("position_ids"), call.get("cache_position")
    check_text_shapes(config, input_ids, inputs_embeds)
    inputs = input_ids if input_ids is not None else inputs_embeds
    (batch_size, length), reads = tuple(inputs.shape[:2]), reads_values(config, inputs)
    past_length = cached_length(check_cache(config, call.get("cache")))  # tokens already in it
    if isinstance(past_length, torch.Tensor) and past_length.device.type == "cpu" and not is_torchdynamo_compiling():
        past_length = int(past_length)  # a static cache's count, free to read on the CPU
    check_token_type_ids(token_type_ids, (batch_size, length))
    check_position_ids(position_ids, (batch_size, length))
    if isinstance(past_length, int):
        check_attention_mask(call.get("attention_mask"), batch_size, past_length + length)
    ranges = [position_range(config, position_ids, past_length, length, reads)]
    if reads and input_ids is not None:
        allowed = f"token ids must be in [0, {config.vocab_size}) (vocab_size)"
        ranges.insert(0, value_range("input_ids", input_ids, 0, config.vocab_size, allowed))
    if reads and token_type_ids is not None:
        ranges.append(token_type_range(config, token_type_ids))
    if cache_position is not None:
        ranges.append(cache_position_range(cache_position, past_length, length, reads))
    return ranges, (batch_size, length)


def check_text_call(
    config: TurnerConfig,
    input_ids: torch.Tensor | None,
    inputs_embeds: torch.Tensor | None,
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    token_type_ids: torch.Tensor | None = None,
    *,
    token_labels: torch.Tensor | None = None,
) -> None:
    """A text call and its token-id labels checked now, in one read."""
    call = dict(input_ids=input_ids, inputs_embeds=inputs_embeds, attention_mask=attention_mask, labels=token_labels)
    check_call(
        config,
        [],
        (),
        call | dict(position_ids=position_ids, token_type_ids=token_type_ids),
        text_inputs,
        token_id_labels,
    )


def check_text_shapes(config: TurnerConfig, input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor | None) -> None:
    """Exactly one of `input_ids` (batch, N) and `inputs_embeds` (batch, N, D), non-empty tensors."""
    if (input_ids is None) == (inputs_embeds is None):
        given = "both" if input_ids is not None else "neither"
        raise ValueError(f"Pass exactly one of `input_ids` and `inputs_embeds`; got {given}.")
    check_is_tensor("input_ids", input_ids)
    check_is_tensor("inputs_embeds", inputs_embeds)
    if input_ids is not None:
        if input_ids.ndim != 2 or 0 in input_ids.shape or input_ids.is_floating_point():
            raise _invalid_input(
                "input_ids",
                _shape_and_dtype(input_ids),
                "expected integer token ids of shape (batch, sequence) with batch >= 1 and sequence >= 1",
            )
    elif (
        inputs_embeds.ndim != 3 or 0 in inputs_embeds.shape[:2] or inputs_embeds.shape[2] != config.token_embedding_size
    ):
        raise _invalid_input(
            "inputs_embeds",
            _shape(inputs_embeds),
            f"expected (batch >= 1, sequence >= 1, {config.token_embedding_size}), the token embedding width",
        )


def check_is_tensor(name: str, value: object) -> None:
    """A model input given as a list or a NumPy array is a TypeError that says to pass a tensor."""
    if value is not None and not isinstance(value, torch.Tensor):
        kind = type(value)
        kind = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
        raise TypeError(
            f"`{name}` must be a torch.Tensor, got a {kind}: pass "
            "torch.tensor(...) (or torch.from_numpy(...)), or call the tokenizer with return_tensors='pt'"
        )


def check_position_ids(position_ids: torch.Tensor | None, input_shape: tuple[int, int]) -> None:
    """Positions index the tokens of this call: one per token, per row or shared by every row."""
    if position_ids is None:
        return
    check_is_tensor("position_ids", position_ids)
    batch, length = input_shape
    shapes = [(batch, length), (1, length), (length,)]
    shape = tuple(position_ids.shape)  # compared, not hashed: under torch.export the sizes are symbolic
    if not any(shape == allowed for allowed in shapes) or position_ids.is_floating_point():
        allowed = " or ".join(map(str, dict.fromkeys(shapes)))  # in this order, once each
        raise _invalid_input(
            "position_ids", _shape_and_dtype(position_ids), f"expected integer positions of shape {allowed}"
        )


def check_generate_inputs(input_ids: object, attention_mask: object) -> None:
    """generate()'s prompt and its padding mask: tensors, the mask one entry a prompt token (checked before
    generate() derives positions from it)."""
    check_is_tensor("input_ids", input_ids)
    check_is_tensor("attention_mask", attention_mask)
    both = isinstance(input_ids, torch.Tensor) and isinstance(attention_mask, torch.Tensor)
    if both and attention_mask.shape != input_ids.shape:
        allowed = (
            f"expected the prompt's shape {tuple(input_ids.shape)} (input_ids), 1 for real tokens and 0 for padding"
        )
        raise _invalid_input("attention_mask", _shape(attention_mask), allowed)


def check_token_type_ids(token_type_ids: torch.Tensor | None, input_shape: tuple[int, int]) -> None:
    """Token types index `token_type_embeddings`, one per token."""
    if token_type_ids is None:
        return
    if tuple(token_type_ids.shape) != tuple(input_shape) or token_type_ids.is_floating_point():
        raise _invalid_input(
            "token_type_ids", _shape(token_type_ids), f"expected integer ids of shape {tuple(input_shape)}"
        )


def token_type_range(config: TurnerConfig, token_type_ids: torch.Tensor) -> RangeCheck | None:
    """Token types in the table (`type_vocab_size`); a model without one takes all-zero types (one segment)."""
    types = config.type_vocab_size
    if types:
        allowed = f"token types must be in [0, {types}) (type_vocab_size)"
        return value_range("token_type_ids", token_type_ids, 0, types, allowed)
    allowed = "this model has no token type embeddings (type_vocab_size=0): pass none, or zeros"
    return value_range("token_type_ids", token_type_ids, 0, 1, allowed)


def check_attention_mask(attention_mask: torch.Tensor | None, batch_size: int, total_length: int) -> None:
    """A 2-D padding mask must be (batch, past + current tokens); 4-D masks, flex attention's block masks and
    continuous batching's masks per layer type (a dict) are taken as prepared by the caller."""
    if attention_mask is None or isinstance(attention_mask, (dict, BlockMask)):
        return
    check_is_tensor("attention_mask", attention_mask)
    if attention_mask.ndim == 4:
        return
    if attention_mask.ndim != 2 or tuple(attention_mask.shape) != (batch_size, total_length):
        raise _invalid_input(
            "attention_mask",
            _shape(attention_mask),
            f"expected (batch, past + current tokens) = ({batch_size}, {total_length}), 1 for real tokens and 0 "
            "for padding",
        )


def position_range(
    config: TurnerConfig, position_ids: torch.Tensor | None, past_length: int | torch.Tensor, length: int, reads: bool
) -> RangeCheck | None:
    """Learned positions stop at `max_position_embeddings`. The positions the model derives (past + current tokens)
    are checked at once when the cache's length is a number; the caller's are read."""
    limit = config.max_positions
    if limit is None:
        return None
    allowed = (
        f"learned position embeddings cover positions 0..{limit - 1} (max_position_embeddings={limit}): shorten the "
        "input (with a cache: the tokens already in it count), or use position_embedding_type='sinusoidal' or 'rotary'"
    )
    if position_ids is not None:
        return value_range("position_ids", position_ids, 0, limit, allowed) if reads else None
    if isinstance(past_length, int):
        if past_length + length > limit:
            tokens = f"{past_length} cached + {length} new tokens" if past_length else f"{length} tokens"
            raise _invalid_input("input_ids", f"of {tokens} (positions up to {past_length + length - 1})", allowed)
        return None
    if not reads:
        return None
    end = past_length + length - 1  # the last position the model derives, on the cache's device
    return RangeCheck("input_ids", (end, end), 0, limit, allowed, shown="would reach position {value}")


def cache_position_range(
    cache_position: torch.Tensor, past_length: int | torch.Tensor, length: int, reads: bool
) -> RangeCheck | None:
    """`cache_position`, which older decoding loops pass, must be where the model writes this step's keys and values
    anyway: `past_length, ..., past_length + length - 1`. The model derives them itself, so nothing else reads it."""
    slots = f"{past_length}..{past_length + length - 1}" if isinstance(past_length, int) else "past.."
    expected = f"the cache slots of this step, {slots} (or leave it out)"
    if not isinstance(cache_position, torch.Tensor) or cache_position.shape != (length,):
        shown = _shape(cache_position) if isinstance(cache_position, torch.Tensor) else repr(cache_position)
        raise _invalid_input("cache_position", shown, f"expected a tensor of shape ({length},): {expected}")
    if not reads:
        return None
    offsets = cache_position - torch.arange(length, device=cache_position.device) - past_length  # all 0 when right
    return RangeCheck("cache_position", _extremes(offsets), 0, 1, f"it must be {expected}", shown=cache_position)


def token_label_range(
    config: TurnerConfig, labels: torch.Tensor, input_shape: tuple[int, int], what: str, size_field: str
) -> RangeCheck | None:
    """Labels one a token, of the inputs' (batch, N): integer `what` in [0, config.`size_field`), or -100 (ignored)."""
    if tuple(labels.shape) != tuple(input_shape) or labels.is_floating_point():
        raise _invalid_input(
            "labels", _shape_and_dtype(labels), f"expected integer {what} of shape {tuple(input_shape)}, like input_ids"
        )
    if not reads_values(config, labels):
        return None
    size = getattr(config, size_field)
    allowed = f"{what} must be in [0, {size}) ({size_field}), or -100 (ignored)"
    return value_range("labels", labels, 0, size, allowed, ignore=-100)


def class_label_range(config: TurnerConfig, labels: torch.Tensor, batch_size: int) -> RangeCheck | None:
    """The label forms `transformers`' classification loss accepts, checked before it sees them."""
    num_labels, problem, reads = config.num_labels, config.problem_type, reads_values(config, labels)
    if problem == "regression" or (problem is None and num_labels == 1):
        if labels.numel() != batch_size * num_labels or not labels.is_floating_point():
            raise _invalid_input(
                "labels", _shape_and_dtype(labels), f"regression expects {batch_size} x {num_labels} floats"
            )
        return None
    if problem == "multi_label_classification" or (problem is None and labels.is_floating_point()):
        if tuple(labels.shape) != (batch_size, num_labels) or not labels.is_floating_point():
            raise _invalid_input(
                "labels",
                _shape_and_dtype(labels),
                f"multi-label classification expects floats of shape ({batch_size}, {num_labels})",
            )
        if not reads:
            return None
        outside = ((labels < 0) | (labels > 1)).any()  # True: a value outside [0, 1]
        allowed = "multi-label targets must be in [0, 1]"
        return RangeCheck("labels", (outside, outside), 0, 1, allowed, shown="has values outside [0, 1]")
    if labels.numel() != batch_size or labels.is_floating_point():
        raise _invalid_input(
            "labels", _shape_and_dtype(labels), f"single-label classification expects {batch_size} integer class ids"
        )
    if not reads:
        return None
    allowed = f"class ids must be in [0, {num_labels}) (num_labels), or -100 (ignored)"
    return value_range("labels", labels, 0, num_labels, allowed, ignore=-100)


def token_id_labels(config: TurnerConfig, call: dict, shape: tuple[int, int]) -> RangeCheck | None:
    """A language model's labels: a token id a token (the causal LM shifts them inside)."""
    labels = call.get("labels")
    return None if labels is None else token_label_range(config, labels, shape, "token ids", "vocab_size")


def token_class_labels(config: TurnerConfig, call: dict, shape: tuple[int, int]) -> RangeCheck | None:
    """A token classifier's labels: a class id a token."""
    labels = call.get("labels")
    return None if labels is None else token_label_range(config, labels, shape, "class ids", "num_labels")


def sequence_labels(config: TurnerConfig, call: dict, shape: tuple[int, ...]) -> RangeCheck | None:
    """A classifier's labels, one a row; for a row that may be packed (positions, no mask), the head checks them once
    it has counted the sequences."""
    labels = call.get("labels")
    if labels is None or (call.get("position_ids") is not None and call.get("attention_mask") is None):
        return None
    return class_label_range(config, labels, shape[0])


def choice_labels(config: TurnerConfig, call: dict, shape: tuple[int, int, int]) -> RangeCheck | None:
    """A multiple-choice head's labels: the index of each row's right choice."""
    labels, (batch_size, choices, _) = call.get("labels"), shape
    if labels is None:
        return None
    if labels.numel() != batch_size or labels.is_floating_point():
        raise _invalid_input("labels", _shape_and_dtype(labels), f"expected {batch_size} integer choice indices")
    if not reads_values(config, labels):
        return None
    allowed = f"choice indices must be in [0, {choices}) (the number of choices), or -100 (ignored)"
    return value_range("labels", labels, 0, choices, allowed, ignore=-100)


def answer_span(config: TurnerConfig, call: dict, shape: tuple[int, int]) -> None:
    """Extractive QA targets: both or neither, each one integer position a row, `(batch,)` or `(batch, 1)`. A position
    outside the input is ignored by the loss, as BERT's (clamped to N, the ignored index): no value is read."""
    start_positions, end_positions, batch_size = call.get("start_positions"), call.get("end_positions"), shape[0]
    if (start_positions is None) != (end_positions is None):
        given, missing = ("start_positions", "end_positions")[:: 1 if start_positions is not None else -1]
        raise ValueError(f"`{given}` was given without `{missing}`: the span loss needs both (or neither).")
    for name, positions in (("start_positions", start_positions), ("end_positions", end_positions)):
        if positions is None:
            continue
        if positions.is_floating_point() or positions.numel() != batch_size or positions.ndim not in (1, 2):
            allowed = f"expected {batch_size} integer token positions, of shape ({batch_size},) or ({batch_size}, 1)"
            raise _invalid_input(name, _shape_and_dtype(positions), allowed)


def choice_inputs(config: TurnerConfig, call: dict) -> tuple[list, tuple[int, int, int]]:
    """A multiple-choice call: every input `(batch, choices, N)` (embeddings with their width after), checked as text
    of `batch * choices` rows."""
    input_ids, inputs_embeds = call.get("input_ids"), call.get("inputs_embeds")
    name, inputs = ("input_ids", input_ids) if input_ids is not None else ("inputs_embeds", inputs_embeds)
    if (input_ids is None) == (inputs_embeds is None) or not isinstance(inputs, torch.Tensor):
        check_text_shapes(config, input_ids, inputs_embeds)  # raises: neither, both, or not a tensor
    if inputs.ndim != (3 if name == "input_ids" else 4):
        raise _invalid_input(name, _shape(inputs), "a multiple-choice head takes (batch, choices, sequence) inputs")
    shape, flat = tuple(inputs.shape[:3]), {}
    for name in ("input_ids", "inputs_embeds", "attention_mask", "position_ids", "token_type_ids"):
        value = call.get(name)
        check_is_tensor(name, value)
        if value is not None and tuple(value.shape[:3]) != shape:
            raise _invalid_input(name, _shape(value), f"expected {shape}, the shape of the choices")
        flat[name] = None if value is None else value.flatten(0, 1)
    return text_inputs(config, flat)[0], shape


def image_inputs(config: TurnerConfig, call: dict) -> tuple[list, tuple[int, ...]]:
    """`pixel_values` alone, of shape (batch, channels, image_size, image_size); any positive multiple of the patch
    size when the positions are interpolated."""
    pixel_values = call.get("pixel_values")
    if pixel_values is None or call.get("input_ids") is not None or call.get("inputs_embeds") is not None:
        raise ValueError(
            "This is an image model (config.image_size is set): pass `pixel_values` only, not `input_ids` or "
            "`inputs_embeds`."
        )
    channels, size, patch = config.num_channels, config.image_size, config.patch_size
    if pixel_values.ndim != 4 or pixel_values.shape[0] == 0 or pixel_values.shape[1] != channels:
        raise _invalid_input("pixel_values", _shape(pixel_values), f"expected (batch >= 1, {channels}, height, width)")
    height, width = pixel_values.shape[2:]
    if call.get("interpolate_pos_encoding"):
        if height % patch or width % patch or height == 0 or width == 0:
            allowed = f"height and width must be positive multiples of patch_size={patch}"
            raise _invalid_input("pixel_values", _shape(pixel_values), allowed)
    elif (height, width) != (size, size):
        raise _invalid_input(
            "pixel_values",
            _shape(pixel_values),
            f"the model was built for {size}x{size} images (image_size); resize them, or pass "
            "interpolate_pos_encoding=True to resize the position embeddings instead",
        )
    return [], tuple(pixel_values.shape[:1])


def image_labels(config: TurnerConfig, call: dict, shape: tuple[int, ...]) -> RangeCheck | None:
    labels = call.get("labels")
    return None if labels is None else class_label_range(config, labels, shape[0])


def check_generation_length(config: TurnerConfig, prompt_length: int, max_length: int) -> None:
    """generate() feeds back every token but the last, so a model with learned positions (§3) can continue a prompt
    only while prompt + new tokens - 1 stays within `max_position_embeddings`: refused before the first step."""
    limit = config.max_positions
    if limit is None or max_length - 1 <= limit:
        return
    new_tokens = max_length - prompt_length
    ways_out = ["use a model with position_embedding_type='sinusoidal' or 'rotary'"]
    if prompt_length <= limit:
        ways_out.insert(0, f"ask for at most {limit + 1 - prompt_length} new tokens (max_new_tokens)")
    ways_out.insert(0, f"keep the prompt's last {max(limit + 1 - new_tokens, 1)} tokens or fewer (truncate it)")
    raise ValueError(
        f"generate() was asked for {new_tokens} new tokens after a prompt of {prompt_length} tokens (max_length="
        f"{max_length}): it would feed the model positions up to {max_length - 2}, but this model learned "
        f"{limit} positions (max_position_embeddings={limit}). To fit, {', or '.join(ways_out)}."
    )


def check_generated_pad(config: TurnerConfig, pad_token_id: int | None, row_end: Callable[[], str | None]) -> None:
    """Greedy and sampled decoding feed `pad_token_id` to the model once a row of the batch has ended before the
    others: then it must be a token of the vocabulary. `row_end`, asked only for an id outside the vocabulary, says
    what can end a row early (None: nothing can, and the pad id is never fed). Off with `check_input_values=False`."""
    if pad_token_id is None or not config.check_input_values or 0 <= pad_token_id < config.vocab_size:
        return
    if (reason := row_end()) is not None:
        raise _invalid_input(
            "pad_token_id",
            pad_token_id,
            f"generate() feeds it to the model after a row of the batch ends ({reason}), so it must be a token id "
            f"in [0, {config.vocab_size}) (vocab_size); set generation_config.pad_token_id (or pass pad_token_id=)",
        )


def check_modality(model_name: str, config: TurnerConfig, image: bool) -> None:
    """A text head needs a text config and the image head an image config (`image_size` set)."""
    if config.is_image_model != image:
        wanted = "an image config (set image_size)" if image else "a text config (image_size=None)"
        raise ValueError(f"{model_name} needs {wanted}; got image_size={config.image_size!r}.")


def check_bidirectional(model_name: str, config: TurnerConfig) -> None:
    """A masked language model predicts a token from both sides: it needs full attention (`is_causal=False`)."""
    if config.is_causal:
        raise ValueError(
            f"{model_name} predicts each masked token from the tokens on both sides, but the config has "
            "is_causal=True (the auto-regressive mask of §4.1: each token sees only its left); build the config with "
            "is_causal=False."
        )


def warn_if_saved_as_masked_lm(config: TurnerConfig) -> None:
    """A masked LM's folder loaded as a causal LM (`AutoModelForCausalLM`) keeps its bidirectional mask and loses its
    trained head (`transform`, the `lm_head` bias): say so, as BERT's `BertLMHeadModel` does."""
    if "TurnerForMaskedLM" in (config.architectures or ()):
        logger.warning(
            "TurnerForCausalLM built from a config saved by TurnerForMaskedLM: its trained head (`transform`, the "
            f"`lm_head` bias) is not loaded and every token sees both sides (is_causal={config.is_causal}); load the "
            "folder with AutoModelForMaskedLM, or train it as a causal LM with is_causal=True."
        )


def check_cache(config: TurnerConfig, cache: object | None) -> object | None:
    """The cache a forward pass may use. A bidirectional model (`is_causal=False`) keeps none: each new token would
    change the keys and values of every earlier one (§4.1's incremental property needs the causal mask), so an empty
    cache is left unused, as BERT's encoder does, and one that already holds tokens is refused."""
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
