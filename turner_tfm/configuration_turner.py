"""Configuration of the Turner transformer (Turner, *An Introduction to Transformers*, 2023).

Every hyper-parameter of the block is a field here, with Hugging Face's standard names. Like transformers' own
configs (`LlamaConfig`) it is a `@strict` dataclass: each field declares its type (a `Literal` for a choice) and its
range (`transformers.utils.type_validators`), checked on every assignment, and each rule across fields is a
`validate_*` method, run when the config is built and again by `save_pretrained`, so a config changed after it was
built cannot be saved in a form `from_pretrained` would refuse. A refusal names the field, the value and what is
allowed; it is the huggingface_hub `StrictDataclass*Error` that `@strict` raises and also a `ValueError`, as it
always was here.

The class and its fields come first, as in transformers' `configuration_llama.py`; how a refusal is worded follows
it, and the tensor-parallel and FSDP plans are built in `parallel_turner.py`, beside the rest of the parallelism.
"""

# No `from __future__ import annotations`: `@strict` skips the type check of a field annotated with a string (as it
# does for `PreTrainedConfig`'s own fields, which are).
import copy
import dataclasses
import difflib
import functools
import types
from typing import Literal, Union, get_args, get_origin

from huggingface_hub.dataclasses import strict
from huggingface_hub.errors import StrictDataclassClassValidationError, StrictDataclassFieldValidationError
from transformers import GenerationConfig, PreTrainedConfig
from transformers.activations import ACT2FN
from transformers.utils import logging
from transformers.utils.type_validators import activation_fn_key, interval, positive_int_field

from .parallel_turner import fsdp_plan, tensor_parallel_plan

logger = logging.get_logger(__name__)

_DEFAULT_TEXT_POSITIONS = 1024


# What each kind of field allows, declared beside its validator; `_refusals_name_the_field` (below) says it.


def _positive_int(default: int | None) -> int | None:
    return positive_int_field(default=default, metadata={"allowed": "it must be a positive integer"})


def _probability(default: float) -> float:
    check = interval(min=0.0, max=1.0, exclude_max=True)
    return check(default=default, metadata={"allowed": "it must be a probability in [0, 1)"})


def _positive_number(default: float) -> float:
    return interval(min=0.0, exclude_min=True)(default=default, metadata={"allowed": "it must be a positive number"})


def _token_id(allowed: str = "it must be None or a token id (an integer in [0, vocab_size))") -> int | None:
    """A special token id: its type is checked on assignment, its range against `vocab_size` by `validate_token_ids`."""
    return dataclasses.field(default=None, metadata={"allowed": allowed})


@strict
class TurnerConfig(PreTrainedConfig):
    r"""Configuration for [`TurnerModel`] and its heads.

    A config with `image_size` set describes an image model (§4.2 of the paper: patches plus a class token);
    otherwise tokens come from `input_ids`. `is_causal=True` applies the auto-regressive mask of §4.1; it defaults
    to True for text and False for images. A switch that needs another field's value sets that field's default (an
    explicit contradiction is refused): concatenated positions untie the LM head, `position_embedding_size` asks for
    concatenated positions, and `use_pooler` or `classifier_pooling="cls"` make a text model bidirectional. A value is
    checked whenever it is assigned, the rules across fields when the config is built and when it is saved; a refusal
    is a `ValueError` (and huggingface_hub's `StrictDataclassFieldValidationError` or
    `StrictDataclassClassValidationError`, as transformers' own configs raise).

    The paper's design choices and open questions are switches (defaults give the standard block):
    `share_query_key` (U_q = U_k, footnote 9), `position_embedding_type` (`"learned"`, `"sinusoidal"`, `"rotary"`
    relative positions, or `"none"`, §3), `position_embedding_combine` (`"add"` or `"concat"` with a width of
    `position_embedding_size`, footnote 19), `normalization` (`"layernorm"` = TokenNorm, `"rmsnorm"`,
    `"batchnorm"`, figure 5) with `norm_position` (`"pre"` or `"post"`), and `mlp_hidden_layers` (1 or 2,
    footnote 14).

    Example:

    ```python
    >>> from turner_tfm import TurnerConfig, TurnerForCausalLM
    >>> config = TurnerConfig(vocab_size=1000, hidden_size=128, num_hidden_layers=4, num_attention_heads=4)
    >>> model = TurnerForCausalLM(config)
    ```
    """

    model_type = "turner"
    keys_to_ignore_at_inference = ["cache", "past_key_values"]  # the cache, from transformers 5.24 and before

    vocab_size: int = _positive_int(32000)
    hidden_size: int = _positive_int(768)
    num_hidden_layers: int = _positive_int(12)
    num_attention_heads: int = _positive_int(12)
    head_dim: int | None = _positive_int(None)
    intermediate_size: int | None = _positive_int(None)
    hidden_act: str = activation_fn_key(default="gelu", metadata={"allowed": f"choose one of {sorted(ACT2FN)}"})
    max_position_embeddings: int | None = _positive_int(None)
    layer_norm_eps: int | float = _positive_number(1e-5)
    initializer_range: int | float = _positive_number(0.02)
    hidden_dropout: int | float = _probability(0.0)
    attention_dropout: int | float = _probability(0.0)
    classifier_dropout: int | float = _probability(0.0)
    attention_bias: bool = True
    mlp_bias: bool = True
    is_causal: bool | None = None
    position_embedding_type: Literal["learned", "sinusoidal", "rotary", "none"] = "learned"
    position_embedding_combine: Literal["add", "concat"] | None = None
    position_embedding_size: int | None = _positive_int(None)
    rope_theta: int | float = _positive_number(10000.0)
    share_query_key: bool = False
    normalization: Literal["layernorm", "rmsnorm", "batchnorm"] = "layernorm"
    norm_position: Literal["pre", "post"] = "pre"
    mlp_hidden_layers: Literal[1, 2] = 1
    embedding_layer_norm: bool = False
    type_vocab_size: int = interval(min=0)(default=0, metadata={"allowed": "it must be an integer >= 0"})
    classifier_pooling: Literal["cls", "mean", "last"] | None = None
    use_pooler: bool = False
    image_size: int | None = _positive_int(None)
    patch_size: int = _positive_int(16)
    num_channels: int = _positive_int(3)
    use_cache: bool = True
    tie_word_embeddings: bool | None = None
    pad_token_id: int | None = _token_id()
    bos_token_id: int | None = _token_id()
    eos_token_id: int | list[int] | None = _token_id("it must be None, a token id or a non-empty list of token ids")

    def __post_init__(self, **kwargs):
        if built := sorted(set(kwargs) & {"base_model_tp_plan", "base_model_fsdp_plan"}):
            raise ValueError(
                f"TurnerConfig: {built} are built from the config's own fields, so every rule names a module it has; "
                "to change a plan pass `distributed_config=DistributedConfig(tp_plan=..., fsdp_plan=...)` to "
                "from_pretrained"
            )
        self._warn_about_unknown_fields(kwargs)
        self._derive_defaults()
        if self.is_causal and self.normalization == "batchnorm":
            logger.warning(
                "TurnerConfig: normalization='batchnorm' shares statistics across all tokens of a batch, so while "
                "training later tokens change earlier outputs and the causal mask is not airtight (eval is exact)."
            )
        super().__post_init__(**kwargs)

    @property
    def base_model_tp_plan(self) -> dict[str, str]:
        """Tensor-parallel plan of the backbone, built from this config so every rule names a module it has
        (`parallel_turner.tensor_parallel_plan`)."""
        return tensor_parallel_plan(self)

    @base_model_tp_plan.setter
    def base_model_tp_plan(self, plan: dict[str, str]) -> None:
        """Refuse a plan, but for the one transformers 5.16 to 5.20 assign when building a config with tied
        embeddings: the built plan with a rule for `embed_tokens`, which Turner's plan already has under the module's
        real name (`embeddings.embed_tokens`). Serving engines pinned to those releases (vLLM) build Turner configs."""
        if plan != {**tensor_parallel_plan(self), "embed_tokens": "embedding_rowwise"}:
            raise ValueError(
                "TurnerConfig.base_model_tp_plan is built from the config's own fields, so every rule names a module "
                "it has; to change the plan pass `distributed_config=DistributedConfig(tp_plan=...)` to from_pretrained"
            )

    @property
    def base_model_fsdp_plan(self) -> dict[str, str]:
        """FSDP2 plan of the backbone, built from this config (`parallel_turner.fsdp_plan`)."""
        return fsdp_plan(self)

    def check_parallelism(self, tp_size: int = 1, data_parallel_size: int = 1) -> None:
        """Refuse, before any weight is loaded, a sharding under which this config would not give one process's
        numbers: heads split across tensor-parallel ranks, or batch statistics split across data-parallel ones."""
        if tp_size > 1 and self.num_attention_heads % tp_size:
            raise _invalid(
                "num_attention_heads",
                self.num_attention_heads,
                f"tensor parallelism gives each of the tp_size={tp_size} ranks whole heads; use a tp_size that "
                "divides it",
            )
        if data_parallel_size > 1 and self.normalization == "batchnorm":
            raise _invalid(
                "normalization",
                self.normalization,
                f"sharded over {data_parallel_size} data-parallel processes, each would normalise with the statistics "
                "of its own part of the batch, not the whole batch's; use 'layernorm' or 'rmsnorm', or tensor "
                "parallelism (whose ranks all see the whole batch)",
            )

    @property
    def is_image_model(self) -> bool:
        """True when the config describes the §4.2 image classifier (patches + class token)."""
        return self.image_size is not None

    @property
    def token_embedding_size(self) -> int:
        """Width of the token (or patch) embedding: D, less the position part when positions are concatenated."""
        if self.position_embedding_combine == "concat":
            return self.hidden_size - self.position_embedding_size
        return self.hidden_size

    @property
    def num_patches(self) -> int:
        """N in §4.2: the number of image patches (the class token is not counted)."""
        return (self.image_size // self.patch_size) ** 2 if self.is_image_model else 0

    def save_pretrained(self, save_directory, push_to_hub: bool = False, **kwargs) -> None:
        """As `PreTrainedConfig.save_pretrained`, with the rules checked first: transformers creates the folder and
        copies this file into it before it calls `validate()`, so a refused config would leave them behind."""
        self.validate()
        super().save_pretrained(save_directory, push_to_hub=push_to_hub, **kwargs)

    def _warn_about_unknown_fields(self, kwargs: dict) -> None:
        """Warn about a keyword that is neither a field nor a key transformers keeps on a config: a typo
        (`hiden_size`, with the field it looks like) or a field of a newer turner_tfm, which this version would keep
        on the config and never read, so the model would silently differ from the one that was saved."""
        fields = [field.name for field in dataclasses.fields(self)]
        unknown = sorted(set(kwargs) - set(fields) - _transformers_config_keys())
        if not unknown:
            return
        close = {name: match[0] for name in unknown if (match := difflib.get_close_matches(name, fields, 1, 0.8))}
        hint = f" (did you mean {list(close.values())}?)" if close else " (from a newer turner_tfm?)"
        logger.warning(f"TurnerConfig: unknown fields {unknown}{hint} are kept on the config but nothing reads them.")

    def _derive_defaults(self) -> None:
        """Fill the derived fields left None (the mask, K = D / H, the MLP width, the positions) from the others."""
        if self.is_causal is None:  # text: the §4.1 language model; images: §4.2, every patch sees every patch;
            # a classifier reading the first token (the pooler, 'cls' pooling) needs it to see the others
            self.is_causal = not (self.is_image_model or self.use_pooler or self.classifier_pooling == "cls")
        if self.position_embedding_combine is None:  # a width for concatenated positions asks for them
            self.position_embedding_combine = "add" if self.position_embedding_size is None else "concat"
        if self.tie_word_embeddings is None:  # concatenated positions leave the token embedding narrower than D
            self.tie_word_embeddings = self.is_image_model or self.position_embedding_combine != "concat"
        if self.head_dim is None and self.hidden_size % self.num_attention_heads == 0:  # else `validate_attention`
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.intermediate_size is None:
            self.intermediate_size = 4 * self.hidden_size
        if self.max_position_embeddings is None:  # an image model: its patches and the class token
            self.max_position_embeddings = self.num_patches + 1 if self.is_image_model else _DEFAULT_TEXT_POSITIONS
        if self.classifier_pooling is None:
            first = self.use_pooler or self.is_image_model
            self.classifier_pooling = "last" if self.is_causal else ("cls" if first else "mean")
        if self.position_embedding_combine == "concat" and self.position_embedding_size is None:
            self.position_embedding_size = max(1, self.hidden_size // 4)

    def _resolved(self) -> "TurnerConfig":
        """This config as `from_pretrained` rebuilds it from what `save_pretrained` writes: a derived field set back to
        None after the config was built is derived again. The rules judge this, not the fields as they stand."""
        resolved = copy.copy(self)  # shallow: only the derived fields left None are set on it
        resolved._derive_defaults()
        return resolved

    # The rules across fields. `@strict` runs every `validate_*` method when the config is built and in `validate()`,
    # which `save_pretrained` calls.

    def validate_attention(self) -> None:
        """K = D / H unless `head_dim` is set; rotary positions rotate pairs of features."""
        config = self._resolved()
        if config.head_dim is None:  # left unset and not derivable
            raise _invalid(
                "hidden_size",
                config.hidden_size,
                f"it must be divisible by num_attention_heads={config.num_attention_heads}, or set head_dim",
            )
        if config.position_embedding_type == "rotary" and config.head_dim % 2:
            raise _invalid(
                "head_dim", config.head_dim, "rotary positions rotate pairs of features; use an even head_dim"
            )

    def validate_classifier(self) -> None:
        """A classifier reading the first token needs the mask to let it see the others."""
        config = self._resolved()
        if config.is_causal and config.classifier_pooling == "cls":
            raise _invalid(
                "classifier_pooling",
                "cls",
                "under the causal mask the first token attends only to itself, so a classifier reading it would "
                "ignore the input; use 'last' or 'mean', or is_causal=False",
            )
        if config.use_pooler and config.classifier_pooling != "cls":
            raise _invalid(
                "use_pooler", config.use_pooler, "the pooler reads the first token; it needs classifier_pooling='cls'"
            )

    def validate_image(self) -> None:
        """An image model (§4.2) tiles its image into whole patches, has one position per patch plus the class token,
        and has no token types or embedding norm."""
        config = self._resolved()
        if not config.is_image_model:
            return
        if config.image_size % config.patch_size:
            raise _invalid("patch_size", config.patch_size, f"it must divide image_size={config.image_size}")
        if config.max_position_embeddings != (needed := config.num_patches + 1):
            raise _invalid(
                "max_position_embeddings",
                config.max_position_embeddings,
                f"an image model has (image_size / patch_size)^2 + 1 = {needed} positions; leave it unset",
            )
        if config.type_vocab_size:
            raise _invalid("type_vocab_size", config.type_vocab_size, "an image model has no token types; use 0")
        if config.embedding_layer_norm:
            raise _invalid(
                "embedding_layer_norm", config.embedding_layer_norm, "image models have no embedding norm; use False"
            )

    def validate_position_embeddings(self) -> None:
        """Concatenated positions (footnote 19) need a position vector and leave the token embedding narrower."""
        config = self._resolved()
        if config.position_embedding_combine == "add":
            if config.position_embedding_size is not None:
                raise _invalid(
                    "position_embedding_size",
                    config.position_embedding_size,
                    "it sets the width of concatenated positions; leave it None with position_embedding_combine='add'",
                )
            return
        if config.position_embedding_type not in ("learned", "sinusoidal"):
            raise _invalid(
                "position_embedding_combine",
                config.position_embedding_combine,
                f"position_embedding_type={config.position_embedding_type!r} adds no vector to concatenate; use "
                "'learned' or 'sinusoidal' positions, or 'add'",
            )
        if config.position_embedding_size >= config.hidden_size:
            raise _invalid(
                "position_embedding_size",
                config.position_embedding_size,
                f"concatenated positions must leave room for token features: below hidden_size={config.hidden_size}",
            )
        if config.tie_word_embeddings and not config.is_image_model:
            raise _invalid(
                "tie_word_embeddings",
                config.tie_word_embeddings,
                "with concatenated positions the token embedding is narrower than the output head; leave it "
                "unset (it then defaults to False) or set tie_word_embeddings=False",
            )

    def validate_token_ids(self) -> None:
        """The special tokens are ids in the vocabulary (transformers only warns; here the embedding would fail)."""
        for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
            value = getattr(self, name)
            ids = value if isinstance(value, list) else [value]
            if value is not None and not (ids and all(0 <= i < self.vocab_size for i in ids)):
                raise _invalid(name, value, f"it must be None or a token id in [0, {self.vocab_size})")
        super().validate_token_ids()


# ------------------------------------------------------------------------------- what a refusal says, and to whom


class InvalidFieldError(StrictDataclassFieldValidationError, ValueError):
    """A value a `TurnerConfig` field refuses, on any assignment (so also while the config is built): what `@strict`
    raises, and a `ValueError`."""

    def __init__(self, message: str):  # one argument, so the error pickles (e.g. out of a DataLoader worker)
        ValueError.__init__(self, message)


class InvalidConfigError(StrictDataclassClassValidationError, ValueError):
    """A combination of fields a `TurnerConfig` refuses (one of its `validate_*` rules), when it is built or saved:
    what `@strict` raises, and a `ValueError`."""

    def __init__(self, message: str):
        ValueError.__init__(self, message)


# Keys transformers itself passes a config beyond `PreTrainedConfig`'s own attributes (found by logging every unknown
# key across the test suite): the implementations `PreTrainedConfig.__init__` pops, the Hub revision, remote code's
# `auto_map`, the quantizers' and `from_pretrained(distributed_config=...)`'s settings.
_TRANSFORMERS_EXTRA_KEYS = {
    "attn_implementation",
    "experts_implementation",
    "_commit_hash",
    "auto_map",
    "quantization_config",
    "distributed_config",
}


@functools.cache
def _transformers_config_keys() -> frozenset[str]:
    """Every key a config may carry for transformers' sake: `PreTrainedConfig`'s fields, attributes and properties,
    what a bare config saves, the generation parameters and the keys above."""
    generation = GenerationConfig._get_default_generation_params()
    bare = PreTrainedConfig().to_dict()
    return frozenset({*dir(PreTrainedConfig), *bare, *generation, *_TRANSFORMERS_EXTRA_KEYS})


def _message(name: str, value: object, allowed: str) -> str:
    return f"TurnerConfig: `{name}`={value!r} is invalid; {allowed}."


def _invalid(name: str, value: object, allowed: str) -> ValueError:
    return ValueError(_message(name, value, allowed))


def _kinds(annotation: object) -> list[object]:
    """The types a field annotation allows, less None."""
    union = get_origin(annotation) in (Union, types.UnionType)
    return [kind for kind in (get_args(annotation) if union else (annotation,)) if kind is not type(None)]


def _choices(annotation: object) -> tuple | None:
    """The values of a `Literal` field (or `Literal | None`), else None."""
    kinds = _kinds(annotation)
    if kinds and all(get_origin(kind) is Literal for kind in kinds):
        return tuple(choice for kind in kinds for choice in get_args(kind))
    return None


def _allowed(field: dataclasses.Field) -> str | None:
    """What a field accepts, in words: declared next to its validator, or read from its type."""
    if "allowed" in field.metadata:
        return field.metadata["allowed"]
    if _kinds(field.type) == [bool]:
        return "it must be True or False"
    if (choices := _choices(field.type)) is not None:
        return f"choose one of {list(choices)}"
    return None


def _refusals_name_the_field(cls: type[PreTrainedConfig]) -> type[PreTrainedConfig]:
    """Re-raise what `@strict` refuses on `cls` as our errors: an assignment's names the field, the value and what the
    field allows (instead of the validator's generic words, e.g. "expected int, got str"), a rule's keeps the rule's
    own message. Both stay the `StrictDataclass*Error` that `@strict` raised, and become `ValueError`s."""
    strict_setattr, strict_validate = cls.__setattr__, cls.validate
    allowed = {field.name: _allowed(field) for field in dataclasses.fields(cls)}

    @functools.wraps(strict_setattr)
    def __setattr__(self, name: str, value: object) -> None:
        try:
            strict_setattr(self, name, value)
        except StrictDataclassFieldValidationError as error:
            cause = error.__cause__
            raise InvalidFieldError(_message(name, value, allowed.get(name) or str(cause))) from cause

    @functools.wraps(strict_validate)  # keeps its `@strict` mark, so a `@strict` subclass may replace it
    def validate(self) -> None:
        try:
            strict_validate(self)
        except StrictDataclassClassValidationError as error:
            raise InvalidConfigError(str(error.__cause__)) from error.__cause__

    cls.__setattr__, cls.validate = __setattr__, validate
    return cls


TurnerConfig = _refusals_name_the_field(TurnerConfig)

# The choices and the switches among the fields, as the example scripts' flags must offer them
_CHOICES = {name: choices for name, kind in TurnerConfig.__annotations__.items() if (choices := _choices(kind))}
_BOOLS = tuple(name for name, kind in TurnerConfig.__annotations__.items() if _kinds(kind) == [bool])

__all__ = ["TurnerConfig"]
