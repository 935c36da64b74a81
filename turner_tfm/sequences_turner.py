"""Which tokens belong together: the attention mask every block gets (the §4.1 auto-regressive mask or full attention,
with the padding, and in a packed row each sequence kept to itself), and one vector per sequence for the classifiers
and BERT's pooler (§4.2's x_0, the mean, or the last real token), over a padded batch or a packed row
(`DataCollatorWithFlattening`: sequences end to end in one row, positions restarting at each, no attention mask).
"""

import torch
from torch import nn
from transformers.cache_utils import Cache
from transformers.masking_utils import (
    create_bidirectional_mask,
    create_causal_mask,
    find_packed_sequence_indices,
    packed_sequence_mask_function,
)
from transformers.modeling_outputs import BaseModelOutputWithPoolingAndCrossAttentions
from transformers.utils.import_utils import is_torchdynamo_compiling

from .checks_turner import _invalid_input, _shape
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
    """The §4.1 auto-regressive mask when `config.is_causal`, else full attention; both with the padding, made by
    transformers' mask builders.

    In a packed row (`packed`: positions restart at each sequence, no padding mask) every token attends only within
    its own sequence. transformers finds the sequences for the causal mask when no cache is passed; here they are found
    for the full mask, and on the first pass of a fresh cache unless a tracer runs (export passes positions).

    With no padding, no packing and no cache passed in, causal sdpa needs no mask: None, and sdpa's `is_causal`.
    transformers decides the same outside a tracer, but keeps the mask under torch.compile before torch 2.14
    (pytorch#176499), twice the attention work; this stands in for that fix.
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


def first_real_token(hidden_states: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """Each row's first token (§4.2's x_0), or in a left-padded row (a 2-D `attention_mask`) its first real one."""
    if attention_mask is None or attention_mask.ndim != 2:
        return hidden_states[:, 0]
    first = attention_mask.to(torch.long).argmax(dim=-1)
    return hidden_states[torch.arange(hidden_states.shape[0], device=hidden_states.device), first]


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


def pooling_mask(
    input_ids: torch.Tensor | None, attention_mask: torch.Tensor | None, pad: int | None
) -> torch.Tensor | None:
    """The tokens a classifier pools, as a 2-D padding mask: the caller's, else (no mask, or a 4-D one) those that are
    not `pad` (as GPT-2 finds its last token), else None (every token). Padding ids choose what is pooled only, never
    what is attended: a pad id inside the text (GPT-2's eos as a separator) stays visible to attention."""
    if attention_mask is not None and attention_mask.ndim == 2:
        return attention_mask
    if input_ids is None or pad is None:
        return None
    return (input_ids != pad).long()


def pool_sequences(
    outputs: BaseModelOutputWithPoolingAndCrossAttentions,
    attention_mask: torch.Tensor | None,
    sequence_index: torch.Tensor | None,
    pooling: str,
    pooler: nn.Module | None = None,
) -> torch.Tensor:
    """What a classifier's head reads: for each row, or each sequence of a packed row (`sequence_index`), the pooled
    final representation (`pooling`), through BERT's `pooler` where the backbone has one."""
    if sequence_index is not None:
        pooled = pool_packed_sequences(outputs.last_hidden_state, sequence_index, pooling)
        # the pooler reads the first token of each row: one row per sequence
        return pooled if pooler is None else pooler(pooled.unsqueeze(1))
    if outputs.pooler_output is not None:
        return outputs.pooler_output
    return pool_hidden_states(outputs.last_hidden_state, attention_mask, pooling)


class TurnerPooler(nn.Module):
    """BERT's pooler: a dense layer and tanh on the first (real) token's final representation."""

    def __init__(self, config: TurnerConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = nn.Tanh()

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.activation(self.dense(first_real_token(hidden_states, attention_mask)))
