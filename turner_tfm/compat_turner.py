"""What differs between the transformers releases a Turner model runs on, detected by feature in this one place.

transformers 5.24 renamed the cache a model takes and returns from `past_key_values` to `cache` (in forwards, outputs,
mask builders and `GradientCheckpointingLayer`), and moved the update of continuous batching's paged cache out of the
attention functions into the model (`cache.update(key, value, layer_idx, kwargs=kwargs)`). Turner follows the newest
convention: its forwards take `cache`, accept `past_key_values` from callers that still use it (with `cache` beside
it, as PEFT's prefix tuning passes them under 5.24's generate(): `one_cache`), and refuse any keyword they would not
read, so the next rename fails loudly instead of decoding without context. `modeling_turner.py`
imports this module; `save_pretrained` copies it beside it, so a folder saved under one release runs under the other.
"""

import dataclasses
import functools
import inspect
import re
from collections.abc import Callable

import torch
from transformers.cache_utils import Cache
from transformers.generation.continuous_batching.cache import PagedAttentionCache
from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.utils.deprecation import deprecate_kwarg

# The name this release gives the cache in model inputs and outputs: "cache" from 5.24, "past_key_values" before.
CACHE_NAME = (
    "cache" if "cache" in {field.name for field in dataclasses.fields(CausalLMOutputWithPast)} else "past_key_values"
)
OLD_CACHE_NAME = "past_key_values"

# Before 5.24, continuous batching handed its paged cache to the model as `cache`, for transformers' paged attention
# functions to write (they take it from their keyword arguments); from 5.24 the model writes it like any other cache.
ATTENTION_WRITES_PAGED_CACHE = CACHE_NAME == OLD_CACHE_NAME


# A keyword a Turner forward does not take flows on to the attention function (a serving engine's own, or generate()'s
# extras, as in transformers' models), unless it holds a cache or names one, a mask or a position: nothing reads those.
NEVER_PASSED_ON = re.compile(r"cache|mask|position|past")
# Read from the keyword arguments by the backbone, not declared (generate() hands a declared `cache_position` to remote
# code with a deprecation notice): `cache_position`, checked against the positions the model derives.
TAKEN_FROM_KWARGS = frozenset({"cache_position"})


def named_cache(cache: Cache | PagedAttentionCache | None) -> dict:
    """`cache` under this release's name, for transformers' outputs and mask builders."""
    return {CACHE_NAME: cache}


def output_cache(outputs: object) -> Cache | None:
    """The cache a transformers output carries, under this release's name."""
    return getattr(outputs, CACHE_NAME)


def cached_length(cache: Cache | PagedAttentionCache | None) -> int | torch.Tensor:
    """Tokens already in the cache: 0 without one, and for continuous batching's paged cache, whose requests carry
    their own positions."""
    if cache is None or isinstance(cache, PagedAttentionCache):
        return 0
    return cache.get_seq_length()


def update_cache(
    cache: Cache | PagedAttentionCache, key: torch.Tensor, value: torch.Tensor, layer_idx: int, kwargs: dict
) -> tuple[torch.Tensor, torch.Tensor]:
    """Write this step's keys and values; returns every cached key and value of the layer (§4.1's incremental
    property). A paged cache reads, and may rewrite, the attention keywords (`kwargs`, updated in place)."""
    if ATTENTION_WRITES_PAGED_CACHE and isinstance(cache, PagedAttentionCache):
        kwargs["cache"] = cache  # transformers before 5.24: the paged attention function writes it
        return key, value
    return cache.update(key, value, layer_idx, kwargs=kwargs)


def takes_cache(forward: Callable) -> Callable:
    """Decorate a Turner forward that takes `cache`: `past_key_values=` is read as `cache` (both given: `one_cache`),
    and a cache, mask or position passed under a name that the forward does not take raises a `ValueError` naming it:
    nothing would read it, and decoding without a cache (or attending without a mask) is silently wrong.

    Where this release already says `cache`, the old name goes through transformers' own `deprecate_kwarg`, outermost,
    as in its models (GPT-2, Llama): the same FutureWarning, attributed to the caller, on every call. Before,
    `past_key_values` is the current name (generate() passes it) and is read silently."""
    signature = inspect.signature(forward)
    reads = frozenset(signature.parameters) | TAKEN_FROM_KWARGS

    @functools.wraps(forward)
    def forward_taking_cache(self, *args, **kwargs):
        if OLD_CACHE_NAME in kwargs:
            kwargs["cache"] = one_cache(type(self).__name__, kwargs.get("cache"), kwargs.pop(OLD_CACHE_NAME))
        for name in kwargs:  # a loop, not a set difference: torch 2.11's dynamo cannot trace `kwargs.keys() - reads`
            if name not in reads:
                _refuse_if_unread(type(self).__name__, name, kwargs[name])
        return forward(self, *args, **kwargs)

    if CACHE_NAME != OLD_CACHE_NAME:
        # The notice only (no `new_name`: given both names, transformers would drop `past_key_values` unread, PEFT's
        # prefix with it); `one_cache` reads them. Its words are those of transformers' models.
        notice = deprecate_kwarg(OLD_CACHE_NAME, version="5.40.0", additional_message="Use `cache` instead.")
        forward_taking_cache = notice(forward_taking_cache)
    # The forward's own signature, worked out once and kept on the innermost function (after wrapping, so that no
    # wrapper copies it): generate() reads it at every step (is `cache_position` still taken?), and inspect, unwrapping
    # down to it, stops there instead of rebuilding it. No wrapper may carry it: torch's full-graph capture binds
    # arguments with each function's own signature (follow_wrapped=False)
    inspect.unwrap(forward).__signature__ = signature
    return forward_taking_cache


def one_cache(model_name: str, cache: object | None, old: object | None) -> object | None:
    """The cache a forward reads when a caller names one `cache` and one `past_key_values`; never one dropped unread.

    This stands in for PEFT reading and writing the cache under transformers 5.24's name: PEFT's prefix tuning (0.20,
    0.21) hands its prefix over as a `Cache` already holding the virtual tokens, under `past_key_values`, while 5.24's
    generate() passes its own cache as `cache`, empty at the first step; at later steps PEFT, not seeing that cache,
    hands over a new copy of the prefix beside it. transformers' `deprecate_kwarg` would read `cache` and drop the
    prefix (GPT-2 decodes as if it had none). Here:
    - one of them missing, or the same object twice: that one;
    - `cache` empty: the tokens of `past_key_values` are written into it first (generate() keeps its own cache);
    - `cache` already starting with the tokens of `past_key_values` (PEFT's copy of a prefix it holds): `cache`, read
      once to compare (a host sync, only on this path);
    - otherwise two different contexts: a `ValueError`, since reading either would silently lose the other."""
    if cache is None or old is None or cache is old:
        return old if cache is None else cache
    if isinstance(cache, Cache) and isinstance(old, Cache):
        if cache.get_seq_length() == 0:
            for layer_idx, layer in enumerate(old.layers):
                if layer.get_seq_length():
                    cache.update(*_held(layer, layer.get_seq_length()), layer_idx)
            return cache
        if _starts_with(cache, old):
            return cache
    raise ValueError(
        f"{model_name}.forward got two different caches, `cache` ({_held_tokens(cache)}) and `past_key_values` "
        f"({_held_tokens(old)}): they name the same argument, and reading one would drop the other's context. Pass "
        "one (an empty `cache` beside a filled `past_key_values`, as PEFT's prefix tuning passes them, is read as one)."
    )


def _held(layer: object, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first `length` keys and values a cache layer holds (a static layer's tensors are its whole buffer)."""
    return layer.keys[..., :length, :], layer.values[..., :length, :]


def _starts_with(cache: Cache, prefix: Cache) -> bool:
    """Whether every layer of `cache` begins with exactly the keys and values of the same layer of `prefix`."""
    if len(prefix.layers) > len(cache.layers):
        return False
    for layer, start in zip(cache.layers, prefix.layers, strict=False):
        length = start.get_seq_length()
        if layer.get_seq_length() < length:
            return False
        if length and not all(
            held.shape == expected.shape and torch.equal(held, expected.to(held.device))
            for held, expected in zip(_held(layer, length), _held(start, length), strict=True)
        ):
            return False
    return True


def _held_tokens(cache: object) -> str:
    return f"{cache.get_seq_length()} tokens" if isinstance(cache, Cache) else type(cache).__name__


def _refuse_if_unread(model_name: str, name: str, value: object) -> None:
    if isinstance(value, (Cache, PagedAttentionCache)):
        raise ValueError(
            f"{model_name}.forward got a cache as `{name}`, a name it does not read: pass it as `cache`. Decoding "
            "without its cache, each new token would be read without its context."
        )
    if NEVER_PASSED_ON.search(name):
        raise ValueError(
            f"{model_name}.forward does not take `{name}`: a cache, mask or position under a name the model does not "
            "read would be ignored. If a newer transformers renamed an argument, this turner_tfm does not support "
            "that release yet (see the transformers range in its requirements)."
        )
