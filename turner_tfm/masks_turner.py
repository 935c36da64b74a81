"""The attention mask every block gets: the §4.1 auto-regressive mask or full attention, with the padding and, in a
packed row, each sequence kept to itself. transformers' mask builders make it; this module decides which, and when none
is needed. `modeling_turner.py` imports this module; `save_pretrained` copies it beside it.
"""

import torch
from transformers.cache_utils import Cache
from transformers.masking_utils import (
    create_bidirectional_mask,
    create_causal_mask,
    find_packed_sequence_indices,
    packed_sequence_mask_function,
)
from transformers.utils.import_utils import is_torchdynamo_compiling

from .compat_turner import cached_length, named_cache
from .configuration_turner import TurnerConfig


def mask_for_blocks(
    config: TurnerConfig,
    hidden_states: torch.Tensor,
    attention_mask: torch.Tensor | None,
    cache: Cache | None,
    position_ids: torch.Tensor | None,
    packed: bool,
    fresh_cache: bool,
) -> torch.Tensor | None:
    """The §4.1 auto-regressive mask when `config.is_causal`, else full attention; both combined with the padding.

    In a packed row (`packed`: the caller's positions restart at each sequence, no padding mask) every token attends
    only within its own sequence. transformers finds the sequences for the causal mask when no cache is passed; here
    they are found for the full mask, and on the first pass of a fresh cache (the model makes one in eval mode) unless
    a tracer runs, which cannot tell a packed row from one sequence (export passes positions).

    With no padding, no packing and no cache passed in (`fresh_cache`: queries and keys are this call's tokens, traced
    or not), causal sdpa needs no mask: None, and sdpa's `is_causal`. transformers decides the same outside a tracer,
    but keeps the mask under torch.compile before torch 2.14 (pytorch#176499: `torch.compiler.is_exporting()` is
    constant True there), twice the attention work; this stands in for that fix.
    """
    causal = config.is_causal
    if causal and attention_mask is None and not packed and fresh_cache and config._attn_implementation == "sdpa":
        return None
    ours = not causal or (cache is not None and not is_torchdynamo_compiling())
    sequences = None
    if packed and ours and cached_length(cache) == 0:
        sequences = find_packed_sequence_indices(position_ids.expand(hidden_states.shape[0], -1))
    make_mask = create_causal_mask if causal else create_bidirectional_mask
    return make_mask(
        config=config,
        inputs_embeds=hidden_states,
        attention_mask=attention_mask,
        **named_cache(cache),
        and_mask_function=None if sequences is None else packed_sequence_mask_function(sequences),
        **({"position_ids": position_ids if packed else None} if causal else {}),  # transformers' detection
    )


__all__ = ["mask_for_blocks"]
