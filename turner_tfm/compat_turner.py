"""What differs between the transformers releases a saved Turner folder runs on, detected by feature in this one place:
5.23 and 5.24 (pyproject's range), and 5.19, which vLLM 0.32 pins when it serves a folder (the engines lane).

transformers 5.24 renamed the cache a model takes and returns from `past_key_values` to `cache`, and moved the update of
continuous batching's paged cache out of the attention functions into the model. Turner's forwards take `cache`,
accept `past_key_values` from callers that still use it, and refuse any keyword they would not read, so that the next
rename fails loudly instead of decoding without context.
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
# Before 5.24 the paged attention functions write continuous batching's cache (handed to them as `cache`)
ATTENTION_WRITES_PAGED_CACHE = CACHE_NAME == OLD_CACHE_NAME
# A keyword a forward does not take flows on to the attention function (a serving engine's own, or generate()'s
# extras, as in transformers' models), unless it names a cache, a mask or a position: nothing would read those.
NEVER_PASSED_ON = re.compile(r"cache|mask|position|past")
# Read from the keyword arguments, not declared (generate() hands a declared one to remote code with a deprecation
# notice): checked against the positions the model derives
TAKEN_FROM_KWARGS = frozenset({"cache_position"})


def named_cache(cache: Cache | PagedAttentionCache | None) -> dict:
    """`cache` under this release's name, for transformers' outputs and mask builders."""
    return {CACHE_NAME: cache}


def output_cache(outputs: object) -> Cache | None:
    """The cache a transformers output carries, under this release's name."""
    return getattr(outputs, CACHE_NAME)


def cached_length(cache: Cache | PagedAttentionCache | None) -> int | torch.Tensor:
    """Tokens already in the cache: 0 without one, and for a paged cache, whose requests carry their own positions."""
    if cache is None or isinstance(cache, PagedAttentionCache):
        return 0
    return cache.get_seq_length()


def update_cache(
    cache: Cache | PagedAttentionCache, key: torch.Tensor, value: torch.Tensor, layer_idx: int, kwargs: dict
) -> tuple[torch.Tensor, torch.Tensor]:
    """Write this step's keys and values; every cached key and value of the layer (§4.1's incremental property)."""
    if ATTENTION_WRITES_PAGED_CACHE and isinstance(cache, PagedAttentionCache):
        kwargs["cache"] = cache  # before 5.24: the paged attention function writes it
        return key, value
    return cache.update(key, value, layer_idx, kwargs=kwargs)


def takes_cache(forward: Callable) -> Callable:
    """Decorate a forward that takes `cache`: `past_key_values=` is read as `cache` (both given: `one_cache`), and a
    cache, mask or position under a name the forward does not take is refused by name. From 5.24 the old name gets
    transformers' own `deprecate_kwarg` notice, outermost, as its models (GPT-2, Llama) give it."""
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

    if CACHE_NAME != OLD_CACHE_NAME:  # the notice only: given both names, transformers would drop one unread
        notice = deprecate_kwarg(OLD_CACHE_NAME, version="5.40.0", additional_message="Use `cache` instead.")
        forward_taking_cache = notice(forward_taking_cache)
    # Kept on the innermost function (no wrapper may carry it: torch's full-graph capture binds each function's own):
    # generate() reads the signature at every step, and inspect stops here instead of rebuilding it
    inspect.unwrap(forward).__signature__ = signature
    return forward_taking_cache


def one_cache(model_name: str, cache: object | None, old: object | None) -> object | None:
    """The cache a forward reads when a caller names one `cache` and one `past_key_values`; never one dropped unread.

    PEFT's prefix tuning hands its prefix over as a `Cache` under `past_key_values`, while 5.24's generate() passes its
    own cache as `cache`, empty at the first step and, later, already holding the prefix PEFT hands over again. So:
    one missing or both the same object, that one; `cache` empty, the prefix written into it first; `cache` starting
    with the prefix's tokens (read once to compare), `cache`; otherwise two contexts, refused."""
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
    held = {
        name: f"{c.get_seq_length()} tokens" if isinstance(c, Cache) else type(c).__name__
        for name, c in (("cache", cache), ("old", old))
    }
    raise ValueError(
        f"{model_name}.forward got two different caches, `cache` ({held['cache']}) and `past_key_values` "
        f"({held['old']}): they name the same argument, and reading one would drop the other's context. Pass "
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
        pairs = zip(_held(layer, length), _held(start, length), strict=True)
        if length and not all(a.shape == b.shape and torch.equal(a, b.to(a.device)) for a, b in pairs):
            return False
    return True


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
