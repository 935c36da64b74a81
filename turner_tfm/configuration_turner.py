"""Configuration of the Turner transformer (Turner, *An Introduction to Transformers*, 2023): a `@strict` dataclass as
`LlamaConfig`, each field checked when set, and one `validate_*` per rule across fields, run on every build and save."""

# No `from __future__ import annotations`: `@strict` skips the type check of a field annotated with a string.
import dataclasses
import difflib
import functools
from typing import Literal, NoReturn, get_args, get_origin

from huggingface_hub.dataclasses import strict
from huggingface_hub.errors import StrictDataclassClassValidationError, StrictDataclassFieldValidationError
from transformers import GenerationConfig, PreTrainedConfig
from transformers.activations import ACT2FN
from transformers.utils import auto_docstring, logging
from transformers.utils.type_validators import activation_fn_key, interval, positive_int_field

from .pretrained_turner import fsdp_plan, tensor_parallel_plan

logger = logging.get_logger(__name__)


def _checked(field_factory, allowed: str):  # a field factory whose refusals say what it allows, in words
    return functools.partial(field_factory, metadata={"allowed": allowed})


_bool = _checked(dataclasses.field, "it must be True or False")
_positive_int = _checked(positive_int_field, "it must be a positive integer")
_positive = _checked(interval(min=0.0, exclude_min=True), "it must be a positive number")
_probability = _checked(interval(min=0.0, max=1.0, exclude_max=True), "it must be a probability in [0, 1)")
# A special id outside the vocabulary gets transformers' warning (`validate_token_ids`), as GPT-2's does: resizing the
# vocabulary below it must still save and load; the input checks refuse such an id where a model would look it up.
_token_id = _checked(dataclasses.field, "it must be None or an integer token id (eos_token_id: or a list of them)")
# Keys transformers passes a config that are no `PreTrainedConfig` attribute: any other is a typo or a newer field
_PASSED_BY_TRANSFORMERS = {"attn_implementation", "experts_implementation", "_commit_hash", "_name_or_path", "auto_map"}
_PASSED_BY_TRANSFORMERS |= {"quantization_config", "distributed_config"}
# Other families' names for fields Turner spells as HF's standard names, read and written as Turner's own (as
# `GPT2Config` maps `hidden_size` to `n_embd`); the epsilons are every name transformers' test helpers set
_OTHER_FAMILIES_NAMES = {
    **dict.fromkeys(["n_embd", "d_model"], "hidden_size"),
    **dict.fromkeys(["n_head", "n_heads", "num_heads"], "num_attention_heads"),
    **dict.fromkeys(["n_layer", "n_layers", "num_layers"], "num_hidden_layers"),
    **dict.fromkeys(["n_inner", "ffn_dim", "d_ff"], "intermediate_size"),
    **dict.fromkeys(["n_positions", "n_ctx"], "max_position_embeddings"),
    **dict.fromkeys(["layer_norm_epsilon", "rms_norm_eps", "norm_eps", "norm_epsilon"], "layer_norm_eps"),
    **dict.fromkeys(["post_norm_eps", "batch_norm_eps"], "layer_norm_eps"),
    "activation_function": "hidden_act",
    "hidden_dropout_prob": "hidden_dropout",
    "attention_probs_dropout_prob": "attention_dropout",
}
# A refusal is what `@strict` raises for a field or a rule, and a `ValueError` of one argument (so that it pickles)
_ONE_ARGUMENT = {"__init__": ValueError.__init__}
InvalidFieldError = type("InvalidFieldError", (StrictDataclassFieldValidationError, ValueError), _ONE_ARGUMENT)
InvalidConfigError = type("InvalidConfigError", (StrictDataclassClassValidationError, ValueError), _ONE_ARGUMENT)
_OWN_PLAN = "built from the config's own fields; pass from_pretrained distributed_config=DistributedConfig(tp_plan=...)"


def _refuse_plan(config: PreTrainedConfig, plan: dict[str, str]) -> None:
    """Refuse a plan, but for the one transformers 5.16-5.20 (vLLM's pins) give a tied config: ours + `embed_tokens`."""
    if plan != {**tensor_parallel_plan(config), "embed_tokens": "embedding_rowwise"}:
        raise ValueError(f"TurnerConfig.base_model_tp_plan is {_OWN_PLAN}")


@strict
class _TurnerFields(PreTrainedConfig):
    """`TurnerConfig`'s fields, derived values and rules; `TurnerConfig` (below) words what they refuse."""

    model_type = "turner"
    attribute_map = _OTHER_FAMILIES_NAMES
    keys_to_ignore_at_inference = ["cache", "past_key_values"]  # the cache, from transformers 5.24 and before
    base_model_tp_plan = property(tensor_parallel_plan, _refuse_plan)  # built from the config (pretrained_turner.py)
    base_model_fsdp_plan = property(fsdp_plan)
    is_image_model = property(lambda self: self.image_size is not None)  # the image classifier of §4.2
    # N in §4.2: the number of image patches (the class token is not counted)
    num_patches = property(lambda self: (self.image_size // self.patch_size) ** 2 if self.is_image_model else 0)

    vocab_size: int = _positive_int(default=32000)
    hidden_size: int = _positive_int(default=768)
    num_hidden_layers: int = _positive_int(default=12)
    num_attention_heads: int = _positive_int(default=12)
    head_dim: int | None = _positive_int(default=None)
    intermediate_size: int | None = _positive_int(default=None)
    hidden_act: str = _checked(activation_fn_key, f"choose one of {sorted(ACT2FN)}")(default="gelu")
    max_position_embeddings: int | None = _positive_int(default=None)
    layer_norm_eps: int | float = _positive(default=1e-5)
    initializer_range: int | float = _positive(default=0.02)
    hidden_dropout: int | float = _probability(default=0.0)
    attention_dropout: int | float = _probability(default=0.0)
    classifier_dropout: int | float = _probability(default=0.0)
    attention_bias: bool = _bool(default=True)
    mlp_bias: bool = _bool(default=True)
    is_causal: bool | None = _bool(default=None)
    position_embedding_type: Literal["learned", "sinusoidal", "rotary", "none"] = "learned"
    position_embedding_combine: Literal["add", "concat"] | None = None
    position_embedding_size: int | None = _positive_int(default=None)
    rope_theta: int | float = _positive(default=10000.0)
    share_query_key: bool = _bool(default=False)
    normalization: Literal["layernorm", "rmsnorm", "batchnorm"] = "layernorm"
    norm_position: Literal["pre", "post"] = "pre"
    mlp_hidden_layers: Literal[1, 2] = 1
    embedding_layer_norm: bool = _bool(default=False)
    type_vocab_size: int = _checked(interval(min=0), "it must be an integer >= 0")(default=0)
    use_padding_idx: bool = _bool(default=False)
    classifier_pooling: Literal["cls", "mean", "last"] | None = None
    use_pooler: bool = _bool(default=False)
    image_size: int | None = _positive_int(default=None)
    patch_size: int = _positive_int(default=16)
    num_channels: int = _positive_int(default=3)
    use_cache: bool = _bool(default=True)
    check_input_values: bool = _bool(default=True)  # value checks: ids, labels, positions, generate()'s pad id
    tie_word_embeddings: bool | None = _bool(default=None)
    pad_token_id: int | None = _token_id(default=None)
    bos_token_id: int | None = _token_id(default=None)
    eos_token_id: int | list[int] | None = _token_id(default=None)

    def __post_init__(self, **kwargs):
        if built := sorted(set(kwargs) & {"base_model_tp_plan", "base_model_fsdp_plan"}):
            raise ValueError(f"TurnerConfig: {built} are {_OWN_PLAN}")
        fields = [field.name for field in dataclasses.fields(self)]
        known = {*fields, *dir(PreTrainedConfig), *GenerationConfig._get_default_generation_params()}
        for name in sorted(set(kwargs) & set(self.attribute_map)):  # before deriving: they set what derives from them
            setattr(self, name, kwargs.pop(name))
        if unknown := sorted(set(kwargs) - known - _PASSED_BY_TRANSFORMERS):
            close = [match[0] for name in unknown if (match := difflib.get_close_matches(name, fields, 1, 0.8))]
            hint = f" (did you mean {close}?)" if close else ""
            logger.warning(
                f"TurnerConfig: unknown fields {unknown}{hint} are kept in the config but no Turner model reads them."
            )
        self._derive()
        if self.is_causal and self.normalization == "batchnorm":  # later tokens change earlier outputs in training
            logger.warning("TurnerConfig: batchnorm mixes tokens: the causal mask is not airtight in training")
        super().__post_init__(**kwargs)
        self.validate()

    def _derived(self) -> dict[str, object]:
        """Each derived field's value, in the order derived (images and first-token classifiers see every token)."""
        width, heads, image = self.hidden_size, self.num_attention_heads, self.is_image_model
        return {
            "is_causal": not (image or self.use_pooler or self.classifier_pooling == "cls"),
            "position_embedding_combine": "add" if self.position_embedding_size is None else "concat",
            "head_dim": None if width % heads else width // heads,  # K = D / H; refused where H does not divide D
            "intermediate_size": 4 * width,
            "max_position_embeddings": self.num_patches + 1 if image else 1024,
            "position_embedding_size": max(1, width // 4) if self.position_embedding_combine == "concat" else None,
            "tie_word_embeddings": image or self.position_embedding_combine != "concat",
            "classifier_pooling": "last" if self.is_causal else "cls" if self.use_pooler or image else "mean",
        }

    def _derive(self, assigned: str | None = None, before: dict | None = None) -> None:
        """Derive each field left None and, after `assigned` is set, each still at its value derived `before`."""
        for name, old in (before or self._derived()).items():  # but the mask and the position layout never flip
            value, follows = getattr(self, name), name not in (assigned, "is_causal", "position_embedding_combine")
            if value is None or (before and follows and value == old):
                _TurnerFields.__setattr__(self, name, self._derived()[name])

    @property
    def token_embedding_size(self) -> int:
        """Width of the token (or patch) embedding: D, less the position part when positions are concatenated."""
        return self.hidden_size - (self.position_embedding_size if self.position_embedding_combine == "concat" else 0)

    @property
    def max_positions(self) -> int | None:
        """How many positions a model of this config takes: None (no limit) unless positions are learned."""
        return self.max_position_embeddings if self.position_embedding_type == "learned" else None

    def check_parallelism(self, tp_size: int = 1, data_parallel_size: int = 1) -> None:
        """Refuse, before any weight is loaded, a sharding that would not give one process's numbers."""
        if tp_size > 1 and self.num_attention_heads % tp_size:
            allowed = f"tensor parallelism gives each of the tp_size={tp_size} ranks whole heads; use a tp_size that"
            _refuse("num_attention_heads", self.num_attention_heads, f"{allowed} divides it")
        if data_parallel_size > 1 and self.normalization == "batchnorm":
            allowed = f"each of {data_parallel_size} data-parallel processes would normalise with its part of the batch"
            _refuse("normalization", "batchnorm", allowed + "; use 'layernorm', 'rmsnorm' or tensor parallelism")

    def save_pretrained(self, save_directory, push_to_hub: bool = False, **kwargs) -> None:
        self.validate()  # first: transformers creates the folder and copies this file before its own `validate()`
        super().save_pretrained(save_directory, push_to_hub=push_to_hub, **kwargs)

    def validate_attention(self) -> None:
        """K = D / H (eq. 3) unless `head_dim` is set; rotary positions (§3) rotate pairs of features."""
        if self.head_dim is None:  # left unset and not derivable
            allowed = f"it must be divisible by num_attention_heads={self.num_attention_heads}, or set head_dim"
            _refuse("hidden_size", self.hidden_size, allowed)
        if self.position_embedding_type == "rotary" and self.head_dim % 2:
            _refuse("head_dim", self.head_dim, "rotary positions rotate pairs of features; use an even head_dim")

    def validate_classifier(self) -> None:
        """A classifier reading the first token needs a mask that lets it see the others (§4.1)."""
        if self.is_causal and self.classifier_pooling == "cls":
            allowed = "under the causal mask the first token attends only to itself, so a classifier reading it would "
            _refuse("classifier_pooling", "cls", allowed + "ignore the input; use 'last' or 'mean', or is_causal=False")
        if self.use_pooler and self.classifier_pooling != "cls":
            _refuse("use_pooler", True, "the pooler reads the first token; it needs classifier_pooling='cls'")

    def validate_image(self) -> None:
        """An image model (§4.2): whole patches, one position per patch plus the class token, no token types."""
        if self.is_image_model and self.image_size % self.patch_size:
            _refuse("patch_size", self.patch_size, f"it must divide image_size={self.image_size}")
        if self.is_image_model and self.max_position_embeddings != (needed := self.num_patches + 1):
            allowed = f"an image model has (image_size / patch_size)^2 + 1 = {needed} positions; leave it unset"
            _refuse("max_position_embeddings", self.max_position_embeddings, allowed)
        if self.is_image_model and self.type_vocab_size:
            _refuse("type_vocab_size", self.type_vocab_size, "an image model has no token types; use 0")
        if self.is_image_model and self.embedding_layer_norm:
            _refuse("embedding_layer_norm", True, "image models have no embedding norm; use False")

    def validate_position_embeddings(self) -> None:
        """Concatenated positions (footnote 19) need a position vector and leave the token embedding narrower."""
        size, kind = self.position_embedding_size, self.position_embedding_type
        if not (concat := self.position_embedding_combine == "concat") and size is not None:
            allowed = "it sets the width of concatenated positions; leave it None with position_embedding_combine"
            _refuse("position_embedding_size", size, f"{allowed}='add'")
        if concat and kind not in ("learned", "sinusoidal"):
            allowed = f"position_embedding_type={kind!r} adds no vector to concatenate; use 'learned' or 'sinusoidal'"
            _refuse("position_embedding_combine", "concat", f"{allowed} positions, or 'add'")
        if concat and size >= self.hidden_size:
            allowed = f"concatenated positions must leave room for token features: below hidden_size={self.hidden_size}"
            _refuse("position_embedding_size", size, allowed)
        if concat and self.tie_word_embeddings and not self.is_image_model:
            allowed = "with concatenated positions the token embedding is narrower than the output head; leave it"
            _refuse("tie_word_embeddings", True, f"{allowed} unset (it defaults to False) or tie_word_embeddings=False")


@auto_docstring(
    custom_intro="""Configuration for [`TurnerModel`] and its heads (Turner, *An Introduction to Transformers*, 2023), a
    [`PreTrainedConfig`]. D = `hidden_size` (§1), M = `num_hidden_layers` (§2.3), H = `num_attention_heads` (eq. 4),
    K = `head_dim` (eq. 3); an image model (§4.2) when `image_size` is set. A field left unset is derived from the
    others and follows them until given its own value: `intermediate_size` = 4 D, `max_position_embeddings` = 1024
    (images: patches + 1), `tie_word_embeddings` unless positions are concatenated. Refusals are `ValueError`s."""
)
class TurnerConfig(_TurnerFields):
    r"""
    is_causal (`bool`, *optional*):
        The auto-regressive mask of §4.1 (each token sees itself and its left); False: every token sees every token
        (images, BERT, the masked LM). Unset: False for images, with a pooler or a classifier reading the first token.
    position_embedding_type (`str`, *optional*, defaults to `"learned"`):
        §3: `"learned"` or `"sinusoidal"` position vectors, `"rotary"` (relative: rotated queries and keys) or `"none"`.
    position_embedding_combine (`str`, *optional*):
        How a position vector joins its token: `"add"`ed, or `"concat"`enated (footnote 19); unset: `"concat"` when
        `position_embedding_size` is set, else `"add"`.
    position_embedding_size (`int`, *optional*):
        Width of concatenated position vectors; unset with `"concat"`: D / 4.
    rope_theta (`float`, *optional*, defaults to `10000.0`):
        The base of the rotary angles.
    share_query_key (`bool`, *optional*, defaults to `False`):
        U_k = U_q, the symmetric attention of footnote 9.
    normalization (`str`, *optional*, defaults to `"layernorm"`):
        The token norm (§2.3, figure 5): `"layernorm"`, `"rmsnorm"` or `"batchnorm"`.
    norm_position (`str`, *optional*, defaults to `"pre"`):
        `"pre"`: the norm on the inputs of MHSA and MLP, plus a final norm (the paper's figure); `"post"`: after each
        residual sum (BERT, footnote 18).
    mlp_hidden_layers (`int`, *optional*, defaults to `1`):
        Hidden layers of the MLP, 1 or 2 (footnote 14).
    embedding_layer_norm (`bool`, *optional*, defaults to `False`):
        A token norm on X^(0), after positions and token types are added (BERT's).
    use_padding_idx (`bool`, *optional*, defaults to `False`):
        The token embedding's row for `pad_token_id` (where it is in the vocabulary) starts at zero and gets no
        gradient (`nn.Embedding`'s `padding_idx`), as BERT's; the BERT converter sets it.
    classifier_pooling (`str`, *optional*):
        What the sequence classifier reads: the first token (`"cls"`), the `"mean"` of the real tokens, or the `"last"`
        real token; unset: `"last"` under the causal mask, `"cls"` with a pooler or for images, else `"mean"`.
    use_pooler (`bool`, *optional*, defaults to `False`):
        BERT's pooler (a dense layer and tanh on the first token) on the backbone's output.
    check_input_values (`bool`, *optional*, defaults to `True`):
        Read token ids, labels and positions back to check their values (`checks_turner`); False: shapes only."""

    def __setattr__(self, name: str, value: object) -> None:
        """Check the value (wording what the field allows), then let the fields derived from this one follow it. Another
        family's name (`n_embd`, `layer_norm_epsilon`, ...) sets Turner's own field."""
        name = self.attribute_map.get(name, name)
        if name in self.__dict__ and self.__dict__[name] is value:
            return  # the same value set again changes nothing (`merge_with_config_defaults` sets `is_causal` to itself)
        before = self._derived() if getattr(self, "_post_init_done", False) else None  # once the config is built
        try:
            super().__setattr__(name, value)
        except StrictDataclassFieldValidationError as error:
            field = self.__dataclass_fields__[name]
            choices = [get_args(kind) for kind in (field.type, *get_args(field.type)) if get_origin(kind) is Literal]
            allowed = field.metadata.get("allowed") or (choices and f"choose one of {list(choices[0])}")
            _refuse(name, value, allowed or str(error.__cause__), InvalidFieldError)
        if before:
            self._derive(name, before)

    def validate(self) -> None:
        try:
            super().validate()
        except StrictDataclassClassValidationError as error:
            raise InvalidConfigError(str(error.__cause__)) from error.__cause__

    @classmethod
    def from_dict(cls, config_dict: dict, **kwargs):
        loaded = super().from_dict(config_dict, **kwargs)
        (loaded[0] if isinstance(loaded, tuple) else loaded).validate()  # its overrides were assigned unchecked
        return loaded


def _refuse(name: str, value: object, allowed: str, error: type[ValueError] = ValueError) -> NoReturn:
    raise error(f"TurnerConfig: `{name}`={value!r} is invalid; {allowed}.")


__all__ = ["TurnerConfig"]
