"""The Turner transformer: the block of Turner, *An Introduction to Transformers* (2023), for Hugging Face.

Notation. The paper writes the token matrix X as D x N (features down, tokens across, footnote 2). Tensors here are
laid out `(batch, N, D)`: token n of sequence b is `hidden_states[b, n]`, and `X A` of eq. 2 becomes `A^T X^T`.

Data flows one way: config -> `TurnerModel` (token or patch embeddings, M blocks, final norm) -> a head. The heads
own their projection, pooling and loss; the backbone knows nothing of tasks.

This file is the paper's block (§2), the backbone and the heads. The pieces the block is built from (embeddings,
positions, norms: `layers_turner.py`) and the machinery around it (input checks, the cache and generate() hooks, masks
and pooling, sharding plans, saving with the code) live in sibling `*_turner.py` modules, imported as `from .x import
y` so that `save_pretrained` copies them beside it and a saved folder runs without `turner_tfm`.
"""

import torch
from torch import nn
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutputWithPoolingAndCrossAttentions,
    CausalLMOutputWithPast,
    ImageClassifierOutput,
    MaskedLMOutput,
    MultipleChoiceModelOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutputWithPast,
    TokenClassifierOutput,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, PreTrainedModel
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs, auto_docstring, can_return_tuple
from transformers.utils.generic import merge_with_config_defaults
from transformers.utils.output_capturing import capture_outputs

from .checks_turner import (
    answer_span,
    backbone_inputs,
    check_bidirectional,
    check_modality,
    checks_inputs,
    choice_inputs,
    choice_labels,
    class_label_range,
    image_inputs,
    image_labels,
    raise_if_out_of_range,
    sequence_labels,
    text_inputs,
    token_class_labels,
    token_id_labels,
    warn_if_saved_as_masked_lm,
)
from .compat_turner import CACHE_NAME, cached_length, named_cache, output_cache, takes_cache, update_cache
from .configuration_turner import TurnerConfig
from .generation_turner import TurnerGenerationMixin, forward_cache
from .layers_turner import (
    ROTATIONS,
    TurnerEmbeddings,
    TurnerPatchEmbeddings,
    apply_rotary,
    build_dropout,
    build_norm,
)
from .pretrained_turner import TurnerHubMixin, TurnerParallelMixin
from .sequences_turner import TurnerPooler, mask_for_blocks, packed_sequence_index, pool_sequences, pooling_mask


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
    the symmetric attention of the paper's first construction (footnote 9).
    """

    def __init__(self, config: TurnerConfig, layer_idx: int):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.scaling = self.head_dim**-0.5  # footnote 8
        self.is_causal = config.is_causal
        self.attention_dropout = config.attention_dropout
        self.share_query_key = config.share_query_key
        # of U_q, U_k, U_v each: of this process's heads (1/N under N-way tensor parallel)
        self.inner_size = inner_size = config.num_attention_heads * config.head_dim
        projections = 2 if config.share_query_key else 3
        self.qkv_proj = nn.Linear(config.hidden_size, projections * inner_size, bias=config.attention_bias)
        self.o_proj = nn.Linear(inner_size, config.hidden_size, bias=config.attention_bias)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        input_shape = hidden_states.shape[:-1]
        heads_shape = (*input_shape, -1, self.head_dim)
        # The widths as a literal tuple on `self.qkv_proj(...)`: vLLM's Transformers backend finds this call in the
        # source and rewrites them per rank to shard a packed QKV (any other spelling breaks its tensor parallel)
        width = self.inner_size
        if self.share_query_key:
            query, value = self.qkv_proj(hidden_states).split((width, width), dim=-1)
            key = query
        else:
            query, key, value = self.qkv_proj(hidden_states).split((width, width, width), dim=-1)
        query = query.view(heads_shape).transpose(1, 2)
        key = key.view(heads_shape).transpose(1, 2)
        value = value.view(heads_shape).transpose(1, 2)
        if position_embeddings is not None:  # rotary: relative positions enter through the scores alone
            cos, sin = position_embeddings
            query, key = apply_rotary(query, cos, sin), apply_rotary(key, cos, sin)

        if cache is not None:  # §4.1 incremental property: earlier keys and values never change
            key, value = update_cache(cache, key, value, self.layer_idx, kwargs)

        # Looked up here, as in-library models do: vLLM's Transformers backend serves the model only if it finds this
        attention_interface = ALL_ATTENTION_FUNCTIONS.get_interface(
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
        attn_output = self.o_proj(attn_output.reshape(*input_shape, -1))
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
        self.dropout = build_dropout(config.hidden_dropout)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> torch.Tensor:
        """The cache comes under this release's name (`CACHE_NAME`): the one gradient checkpointing clears."""
        attention = (attention_mask, kwargs.pop(CACHE_NAME, None), position_embeddings)
        if self.pre_norm:
            attn_output, _ = self.self_attn(self.attn_norm(hidden_states), *attention, **kwargs)
            hidden_states = hidden_states + self.dropout(attn_output)
            return hidden_states + self.dropout(self.mlp(self.mlp_norm(hidden_states)))
        attn_output, _ = self.self_attn(hidden_states, *attention, **kwargs)
        hidden_states = self.attn_norm(hidden_states + self.dropout(attn_output))
        return self.mlp_norm(hidden_states + self.dropout(self.mlp(hidden_states)))


class TurnerPreTrainedModel(TurnerHubMixin, TurnerParallelMixin, PreTrainedModel):
    config: TurnerConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["TurnerBlock"]
    _skip_keys_device_placement = ["cache", "past_key_values"]  # the name from transformers 5.24, and before
    _supports_flash_attn = True
    _supports_sdpa = True
    _supports_flex_attn = True
    _can_compile_fullgraph = True
    _supports_attention_backend = True
    _can_record_outputs = {"hidden_states": TurnerBlock, "attentions": TurnerAttention}

    def __init__(self, config: TurnerConfig, *inputs, **kwargs):
        config.validate()  # the rules across fields, for a config edited or overridden since it was built
        super().__init__(config, *inputs, **kwargs)

    def _init_weights(self, module: nn.Module) -> None:
        """Normal(0, initializer_range) for every matrix, ones and zeros for the norms (HF's defaults)."""
        super()._init_weights(module)
        if isinstance(module, TurnerPatchEmbeddings):
            init.trunc_normal_(module.cls_token, mean=0.0, std=self.config.initializer_range)


class TurnerModel(TurnerPreTrainedModel):
    """The backbone: X^(0) from tokens or patches, M transformer blocks, then a final norm (pre-norm only). Returns
    X^(M) as `last_hidden_state`, shape `(batch, N, D)`: the input's shape (§1.2)."""

    def __init__(self, config: TurnerConfig, add_pooling_layer: bool = True):
        r"""
        add_pooling_layer (`bool`, *optional*, defaults to `True`):
            Build the pooler where `config.use_pooler` asks for one; heads that never read it pass False, as BERT's.
        """
        super().__init__(config)
        if config.is_image_model:  # what a caller feeds it (pipelines, transformers' tests), as ViTModel's
            self.main_input_name = "pixel_values"
        self.embeddings = TurnerPatchEmbeddings(config) if config.is_image_model else TurnerEmbeddings(config)
        rotations = ROTATIONS.get(config.position_embedding_type)
        self.rotary_emb = rotations(config) if rotations is not None else None
        self.layers = nn.ModuleList([TurnerBlock(config, i) for i in range(config.num_hidden_layers)])
        self.norm = build_norm(config) if config.norm_position == "pre" else None
        self.pooler = TurnerPooler(config) if config.use_pooler and add_pooling_layer else None
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        """The token embedding table, or for images the patch embedding W (§4.2, as ViT returns its own)."""
        return getattr(self.embeddings, self.embeddings.input_embedding_name)

    def set_input_embeddings(self, value: nn.Module) -> None:
        setattr(self.embeddings, self.embeddings.input_embedding_name, value)

    @takes_cache
    @checks_inputs(backbone_inputs)
    @merge_with_config_defaults
    @capture_outputs
    @auto_docstring
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        pixel_values: torch.FloatTensor | None = None,
        interpolate_pos_encoding: bool = False,
        use_cache: bool | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> BaseModelOutputWithPoolingAndCrossAttentions:
        r"""
        cache (`Cache`, *optional*):
            Keys and values of the tokens before these (§4.1's incremental property); `past_key_values` before
            transformers 5.24.
        pixel_values (`torch.FloatTensor` of shape `(batch_size, num_channels, height, width)`, *optional*):
            Images, for an image model (`config.image_size` set) in place of `input_ids`.
        """
        packed = position_ids is not None and attention_mask is None  # a packed row: positions restart per sequence
        if self.config.is_image_model:
            hidden_states = self.embeddings(pixel_values, interpolate_pos_encoding)
            cache, use_cache, fresh_cache = None, False, True
        else:
            fresh_cache = cache is None
            cache = forward_cache(self.config, cache, use_cache)
            hidden_states, position_ids = self._embed_text(
                input_ids, inputs_embeds, position_ids, token_type_ids, cache
            )
        kwargs.pop("cache_position", None)  # checked: the model derives the slots itself
        mask = mask_for_blocks(self.config, hidden_states, attention_mask, cache, position_ids, packed, fresh_cache)
        rotations = self._rotations(hidden_states, position_ids)

        block_cache = named_cache(cache)  # under the name this release's gradient checkpointing clears
        for block in self.layers:
            hidden_states = block(hidden_states, mask, rotations, **block_cache, **kwargs)
        if self.norm is not None:
            hidden_states = self.norm(hidden_states)

        return BaseModelOutputWithPoolingAndCrossAttentions(
            last_hidden_state=hidden_states,
            pooler_output=self.pooler(hidden_states, attention_mask) if self.pooler is not None else None,
            **named_cache(cache if use_cache else None),
        )

    def _embed_text(
        self,
        input_ids: torch.LongTensor | None,
        inputs_embeds: torch.Tensor | None,
        position_ids: torch.LongTensor | None,
        token_type_ids: torch.LongTensor | None,
        cache: Cache | None,
    ) -> tuple[torch.Tensor, torch.LongTensor]:
        """X^(0) of text and its positions: after the cached tokens, unless the caller gives them."""
        if input_ids is not None:
            inputs_embeds = self.embeddings.embed_tokens(input_ids)
        if position_ids is None:
            past_seen = cached_length(cache)
            position_ids = (torch.arange(inputs_embeds.shape[1], device=inputs_embeds.device) + past_seen).unsqueeze(0)
        return self.embeddings(inputs_embeds, position_ids, token_type_ids), position_ids

    def _rotations(
        self, hidden_states: torch.Tensor, position_ids: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Cosines and sines of the rotary positions, shared by every block (None without rotary positions)."""
        if self.rotary_emb is None:
            return None
        if position_ids is None:  # image tokens: the class token, then the patches in raster order
            position_ids = torch.arange(hidden_states.shape[1], device=hidden_states.device).unsqueeze(0)
        return self.rotary_emb(position_ids, hidden_states.dtype)


class TurnerForCausalLM(TurnerGenerationMixin, TurnerPreTrainedModel):
    """§4.1: the masked body and the head `p(w_n = w | x_{n-1}) = softmax(g_w^T x_{n-1})`, `lm_head` holding g_w."""

    _tied_weights_keys = {"lm_head.weight": "model.embeddings.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}
    _fsdp_plan = {"lm_head": "keep_full_weight"}

    def __init__(self, config: TurnerConfig):
        super().__init__(config)
        check_modality(type(self).__name__, config, image=False)
        warn_if_saved_as_masked_lm(config)
        self.model = TurnerModel(config, add_pooling_layer=False)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    @takes_cache
    @checks_inputs(text_inputs, token_id_labels)
    @can_return_tuple
    @auto_docstring
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs: Unpack[TransformersKwargs],
    ) -> CausalLMOutputWithPast:
        r"""
        cache (`Cache`, *optional*):
            Keys and values of the tokens before these (§4.1's incremental property); `past_key_values` before
            transformers 5.24.
        """
        outputs = self.model(
            input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            inputs_embeds=inputs_embeds,
            token_type_ids=token_type_ids,
            use_cache=use_cache,
            **kwargs,
        )
        logits, loss = self._logits_and_loss(outputs.last_hidden_state, labels, logits_to_keep, **kwargs)
        return CausalLMOutputWithPast(
            loss=loss,
            logits=logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
            **named_cache(output_cache(outputs)),
        )

    def _logits_and_loss(
        self, hidden_states: torch.Tensor, labels: torch.LongTensor | None, logits_to_keep: int | torch.Tensor, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The head on the kept positions and, given labels, the loss (Liger's fused version replaces this method:
        `turner_tfm.liger`)."""
        kept = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.lm_head(hidden_states[:, kept, :])
        if labels is None:
            return logits, None
        return logits, self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)


class TurnerForSequenceClassification(TurnerPreTrainedModel):
    """Sequence classification or regression on a pooled X^(M) (§1.2: "global classification of the entire sequence
    by pooling across the whole representation"), pooled as `config.classifier_pooling` says.

    A packed row (`DataCollatorWithFlattening`: `input_ids` of shape `(1, total)`, `position_ids` restarting at 0 at
    each sequence, no attention mask) is classified sequence by sequence: logits and labels one a sequence.
    """

    def __init__(self, config: TurnerConfig):
        super().__init__(config)
        check_modality(type(self).__name__, config, image=False)
        self.num_labels = config.num_labels
        self.model = TurnerModel(config)
        self.dropout = build_dropout(config.classifier_dropout)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    @checks_inputs(text_inputs, sequence_labels)
    @can_return_tuple
    @auto_docstring
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        labels: torch.LongTensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> SequenceClassifierOutputWithPast:
        r"""
        labels (`torch.LongTensor` of shape `(batch_size,)` or `(batch_size, num_labels)`, *optional*):
            Class ids (single-label), floats (regression when `num_labels == 1`) or multi-hot floats (multi-label);
            for a packed row, one a sequence.
        """
        sequence_index = packed_sequence_index(position_ids, attention_mask, input_ids, inputs_embeds)
        outputs = self.model(
            input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            token_type_ids=token_type_ids,
            **kwargs,
        )
        pooled_tokens = pooling_mask(input_ids, attention_mask, self.config.pad_token_id)
        pooled = pool_sequences(
            outputs, pooled_tokens, sequence_index, self.config.classifier_pooling, self.model.pooler
        )
        logits = self.classifier(self.dropout(pooled))
        loss = None
        if labels is not None:
            if position_ids is not None and attention_mask is None:  # maybe packed: checked once counted
                raise_if_out_of_range([class_label_range(self.config, labels, logits.shape[0])])
            loss = self.loss_function(labels=labels, pooled_logits=logits, config=self.config)
        return SequenceClassifierOutputWithPast(
            loss=loss,
            logits=logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
            **named_cache(output_cache(outputs)),
        )


class TurnerForImageClassification(TurnerPreTrainedModel):
    """§4.2: patches and a class token through the body, the softmax head on `x_0^(M)`."""

    main_input_name = "pixel_values"

    def __init__(self, config: TurnerConfig):
        super().__init__(config)
        check_modality(type(self).__name__, config, image=True)
        self.num_labels = config.num_labels
        self.model = TurnerModel(config)
        self.dropout = build_dropout(config.classifier_dropout)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    @checks_inputs(image_inputs, image_labels)
    @can_return_tuple
    @auto_docstring
    def forward(
        self,
        pixel_values: torch.FloatTensor | None = None,
        labels: torch.LongTensor | None = None,
        interpolate_pos_encoding: bool = False,
        **kwargs: Unpack[TransformersKwargs],
    ) -> ImageClassifierOutput:
        outputs = self.model(pixel_values=pixel_values, interpolate_pos_encoding=interpolate_pos_encoding, **kwargs)
        logits = self.classifier(self.dropout(pool_sequences(outputs, None, None, self.config.classifier_pooling)))
        loss = None
        if labels is not None:
            loss = self.loss_function(labels=labels, pooled_logits=logits, config=self.config)
        return ImageClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


class TurnerLMTransform(nn.Module):
    """What a masked LM (BERT's "transform") puts between X^(M) and the output head: a dense layer of width D, the
    activation, then the token norm."""

    def __init__(self, config: TurnerConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act_fn = ACT2FN[config.hidden_act]
        self.norm = build_norm(config)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.norm(self.act_fn(self.dense(hidden_states)))


class TurnerForMaskedLM(TurnerPreTrainedModel):
    """Masked language modelling (BERT): the body without the causal mask (`is_causal=False`: every token sees both
    sides), `transform` on each token of X^(M), then `lm_head`, the output vectors g_w (tied to the input embedding by
    default) with a bias a token."""

    _tied_weights_keys = {"lm_head.weight": "model.embeddings.embed_tokens.weight"}
    _tp_plan = {"lm_head": "colwise_gather_output"}

    def __init__(self, config: TurnerConfig):
        super().__init__(config)
        check_modality(type(self).__name__, config, image=False)
        check_bidirectional(type(self).__name__, config)
        self.model = TurnerModel(config, add_pooling_layer=False)
        self.transform = TurnerLMTransform(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size)
        self.post_init()

    @checks_inputs(text_inputs, token_id_labels)
    @can_return_tuple
    @auto_docstring
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        labels: torch.LongTensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> MaskedLMOutput:
        r"""
        labels (`torch.LongTensor` of shape `(batch_size, sequence_length)`, *optional*):
            The original token at each masked position (`DataCollatorForLanguageModeling(mlm=True)` masks them),
            `-100` elsewhere (ignored).
        """
        outputs = self.model(
            input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            token_type_ids=token_type_ids,
            **kwargs,
        )
        logits = self.lm_head(self.transform(outputs.last_hidden_state))
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)
        return MaskedLMOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


class TurnerForTokenClassification(TurnerPreTrainedModel):
    """Token classification (tagging, NER: §1.2's "local classification of each token"): a linear head on each
    token's column of X^(M), after `classifier_dropout`. Causal or not, as the config says."""

    def __init__(self, config: TurnerConfig):
        super().__init__(config)
        check_modality(type(self).__name__, config, image=False)
        self.num_labels = config.num_labels
        self.model = TurnerModel(config, add_pooling_layer=False)
        self.dropout = build_dropout(config.classifier_dropout)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    @checks_inputs(text_inputs, token_class_labels)
    @can_return_tuple
    @auto_docstring
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        labels: torch.LongTensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> TokenClassifierOutput:
        r"""
        labels (`torch.LongTensor` of shape `(batch_size, sequence_length)`, *optional*):
            A class id a token, in [0, `config.num_labels`), `-100` where no label counts (padding, a word's later
            sub-tokens).
        """
        outputs = self.model(
            input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            token_type_ids=token_type_ids,
            **kwargs,
        )
        logits = self.classifier(self.dropout(outputs.last_hidden_state))
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, config=self.config, **kwargs)
        return TokenClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


class TurnerForQuestionAnswering(TurnerPreTrainedModel):
    """Extractive question answering (SQuAD): `qa_outputs` gives each token of X^(M) a score for starting and one for
    ending the answer span. Causal or not, as the config says."""

    def __init__(self, config: TurnerConfig):
        super().__init__(config)
        check_modality(type(self).__name__, config, image=False)
        self.model = TurnerModel(config, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.post_init()

    @checks_inputs(text_inputs, answer_span)
    @can_return_tuple
    @auto_docstring
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        start_positions: torch.LongTensor | None = None,
        end_positions: torch.LongTensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> QuestionAnsweringModelOutput:
        outputs = self.model(
            input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            token_type_ids=token_type_ids,
            **kwargs,
        )
        start_logits, end_logits = self.qa_outputs(outputs.last_hidden_state).split(1, dim=-1)
        start_logits, end_logits = start_logits.squeeze(-1).contiguous(), end_logits.squeeze(-1).contiguous()
        loss = None
        if start_positions is not None and end_positions is not None:
            loss = self.loss_function(start_logits, end_logits, start_positions, end_positions, **kwargs)
        return QuestionAnsweringModelOutput(
            loss=loss,
            start_logits=start_logits,
            end_logits=end_logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )


class TurnerForMultipleChoice(TurnerPreTrainedModel):
    """Multiple choice (SWAG, as BERT's): each of a row's choices is read as a sequence of its own and pooled to one
    vector (§1.2's global classification), a linear layer scores it, and the softmax runs over the row's choices."""

    def __init__(self, config: TurnerConfig):
        super().__init__(config)
        check_modality(type(self).__name__, config, image=False)
        self.model = TurnerModel(config)
        self.dropout = build_dropout(config.classifier_dropout)
        self.classifier = nn.Linear(config.hidden_size, 1)
        self.post_init()

    @checks_inputs(choice_inputs, choice_labels)
    @can_return_tuple
    @auto_docstring
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.FloatTensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        labels: torch.LongTensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> MultipleChoiceModelOutput:
        r"""
        input_ids (`torch.LongTensor` of shape `(batch_size, num_choices, sequence_length)`):
            Each row's choices, each as its own sequence (the question and one answer, say); so are
            `attention_mask`, `position_ids`, `token_type_ids` and `inputs_embeds` (with the embedding width after).
        labels (`torch.LongTensor` of shape `(batch_size,)`, *optional*):
            The index of each row's right choice, in [0, `num_choices`); `-100` is ignored.
        """
        num_choices = (input_ids if input_ids is not None else inputs_embeds).shape[1]
        input_ids, attention_mask, position_ids, inputs_embeds, token_type_ids = (
            None if tensor is None else tensor.flatten(0, 1)
            for tensor in (input_ids, attention_mask, position_ids, inputs_embeds, token_type_ids)
        )
        outputs = self.model(
            input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            token_type_ids=token_type_ids,
            **kwargs,
        )
        pooled_tokens = pooling_mask(input_ids, attention_mask, self.config.pad_token_id)
        pooled = pool_sequences(outputs, pooled_tokens, None, self.config.classifier_pooling)
        logits = self.classifier(self.dropout(pooled)).view(-1, num_choices)
        loss = None if labels is None else nn.functional.cross_entropy(logits, labels.view(-1))
        return MultipleChoiceModelOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


__all__ = [
    "TurnerForCausalLM",
    "TurnerForImageClassification",
    "TurnerForMaskedLM",
    "TurnerForMultipleChoice",
    "TurnerForQuestionAnswering",
    "TurnerForSequenceClassification",
    "TurnerForTokenClassification",
    "TurnerModel",
    "TurnerPreTrainedModel",
]
