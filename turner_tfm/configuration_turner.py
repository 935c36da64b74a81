"""Configuration of the Turner transformer (Turner, *An Introduction to Transformers*, 2023).

Every hyper-parameter of the block is a field here, with Hugging Face's standard names, and every value is checked
when the config is built: a wrong one raises `ValueError` naming the field, the value and what is allowed.
"""

import ast
import functools
import inspect
import textwrap

from transformers import GenerationConfig, PreTrainedConfig
from transformers.activations import ACT2FN
from transformers.utils import logging

logger = logging.get_logger(__name__)

POSITION_EMBEDDING_TYPES = ("learned", "sinusoidal", "rotary", "none")
POSITION_EMBEDDING_COMBINES = ("add", "concat")
CLASSIFIER_POOLINGS = ("cls", "mean", "last")
NORM_POSITIONS = ("pre", "post")
NORMALIZATIONS = ("layernorm", "rmsnorm", "batchnorm")
MLP_HIDDEN_LAYERS = (1, 2)

_POSITIVE_INTS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
    "head_dim",
    "image_size",
    "patch_size",
    "num_channels",
    "position_embedding_size",
)
_OPTIONAL = (
    "head_dim",
    "intermediate_size",
    "max_position_embeddings",
    "image_size",
    "classifier_pooling",
    "position_embedding_size",
    "is_causal",
    "tie_word_embeddings",
    "position_embedding_combine",
)
_NON_NEGATIVE_INTS = ("type_vocab_size",)
_PROBABILITIES = ("hidden_dropout", "attention_dropout", "classifier_dropout")
_POSITIVE_FLOATS = ("layer_norm_eps", "initializer_range", "rope_theta")
_BOOLS = (
    "attention_bias",
    "mlp_bias",
    "is_causal",
    "tie_word_embeddings",
    "embedding_layer_norm",
    "use_pooler",
    "share_query_key",
)
_CHOICES = {
    "position_embedding_type": POSITION_EMBEDDING_TYPES,
    "position_embedding_combine": POSITION_EMBEDDING_COMBINES,
    "classifier_pooling": CLASSIFIER_POOLINGS,
    "norm_position": NORM_POSITIONS,
    "normalization": NORMALIZATIONS,
    "mlp_hidden_layers": MLP_HIDDEN_LAYERS,
}
_TOKEN_IDS = ("pad_token_id", "bos_token_id", "eos_token_id")
_DEFAULT_TEXT_POSITIONS = 1024


@functools.cache
def _transformers_config_keys() -> frozenset[str]:
    """Every key `transformers` itself gives a config, derived from `PreTrainedConfig` so it cannot go stale: its
    fields, properties and parallel plans, what a bare config saves, every name its own code reads or writes
    (`quantization_config`, `attn_implementation`, ...), the generation parameters it sets aside, and the `auto_map`
    that remote code adds."""
    source = ast.parse(textwrap.dedent(inspect.getsource(PreTrainedConfig)))
    named = {node.value for node in ast.walk(source) if isinstance(node, ast.Constant) and isinstance(node.value, str)}
    generation = GenerationConfig._get_default_generation_params()
    return frozenset({*dir(PreTrainedConfig), *PreTrainedConfig().to_dict(), *named, *generation, "auto_map"})


def _invalid(name: str, value: object, allowed: str) -> ValueError:
    return ValueError(f"TurnerConfig: `{name}`={value!r} is invalid; {allowed}.")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class TurnerConfig(PreTrainedConfig):
    r"""Configuration for [`TurnerModel`] and its heads.

    A config with `image_size` set describes an image model (§4.2 of the paper: patches plus a class token);
    otherwise tokens come from `input_ids`. `is_causal=True` applies the auto-regressive mask of §4.1; it defaults
    to True for text and False for images. A switch that needs another field's value sets that field's default (an
    explicit contradiction is a ValueError): concatenated positions untie the LM head, `position_embedding_size`
    asks for concatenated positions, and `use_pooler` or `classifier_pooling="cls"` make a text model bidirectional.

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
    keys_to_ignore_at_inference = ["past_key_values"]

    vocab_size: int = 32000
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    head_dim: int | None = None
    intermediate_size: int | None = None
    hidden_act: str = "gelu"
    max_position_embeddings: int | None = None
    layer_norm_eps: float = 1e-5
    initializer_range: float = 0.02
    hidden_dropout: float = 0.0
    attention_dropout: float = 0.0
    classifier_dropout: float = 0.0
    attention_bias: bool = True
    mlp_bias: bool = True
    is_causal: bool | None = None
    position_embedding_type: str = "learned"
    position_embedding_combine: str | None = None
    position_embedding_size: int | None = None
    rope_theta: float = 10000.0
    share_query_key: bool = False
    normalization: str = "layernorm"
    norm_position: str = "pre"
    mlp_hidden_layers: int = 1
    embedding_layer_norm: bool = False
    type_vocab_size: int = 0
    classifier_pooling: str | None = None
    use_pooler: bool = False
    image_size: int | None = None
    patch_size: int = 16
    num_channels: int = 3
    use_cache: bool = True
    tie_word_embeddings: bool | None = None
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None

    def __post_init__(self, **kwargs):
        if built := sorted(set(kwargs) & {"base_model_tp_plan", "base_model_fsdp_plan"}):
            raise ValueError(
                f"TurnerConfig: {built} are built from the config's own fields, so every rule names a module it has; "
                "to change a plan pass `distributed_config=DistributedConfig(tp_plan=..., fsdp_plan=...)` to "
                "from_pretrained"
            )
        unknown = sorted(set(kwargs) - _transformers_config_keys())
        if unknown:
            logger.warning(
                f"TurnerConfig: unknown fields {unknown} (from a newer turner_tfm, or a typo?) are kept on the config "
                "but nothing in this version reads them."
            )
        self._check_field_values()
        self._resolve_defaults()
        self._check_combinations()
        super().__post_init__(**kwargs)

    @property
    def base_model_tp_plan(self) -> dict[str, str]:
        """Tensor parallel plan of the backbone, built from this config so every rule names a module it has.

        Megatron-style: the vocabulary is split across ranks (so a tied `lm_head` shards against a sharded
        embedding), each rank holds whole heads of each projection stacked in `qkv_proj` (q, k and v; q and v with
        `share_query_key`, where U_k = U_q) and the matching columns of `o_proj`, and a slice of the MLP's hidden
        features. With two hidden layers the second is row-split and the last column-split and gathered. Everything
        else (norms, positions, token types, patches, pooler) is replicated.
        """
        projections = 2 if self.share_query_key else 3
        attention = {"qkv_proj": f"stacked_heads_colwise_{projections}", "o_proj": "rowwise"}
        mlp = {"up_proj": "colwise", "down_proj": "rowwise"}
        if self.mlp_hidden_layers == 2:
            mlp = {"up_proj": "colwise", "hidden_proj": "rowwise", "down_proj": "colwise_gather_output"}
        plan = {} if self.is_image_model else {"embeddings.embed_tokens": "embedding_rowwise"}
        plan |= {f"layers.*.self_attn.{name}": style for name, style in attention.items()}
        return plan | {f"layers.*.mlp.{name}": style for name, style in mlp.items()}

    @property
    def base_model_fsdp_plan(self) -> dict[str, str]:
        """FSDP2 plan of the backbone: the token (or patch) embedding and every block free their gathered weights
        after use; the final norm keeps them (it runs last in the forward pass and first in the backward pass). A
        tied `lm_head` is wrapped with the token embedding, whose weight it is."""
        embedding = "embeddings" if self.is_image_model else "embeddings.embed_tokens"
        plan = {embedding: "free_full_weight", "layers.*": "free_full_weight"}
        return plan | ({"norm": "keep_full_weight"} if self.norm_position == "pre" else {})

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

    def _check_field_values(self) -> None:
        """Types and ranges, one field at a time."""
        for name in _POSITIVE_INTS:
            value = getattr(self, name)
            if (value is not None or name not in _OPTIONAL) and (not _is_int(value) or value < 1):
                raise _invalid(name, value, "it must be a positive integer")
        for name in _NON_NEGATIVE_INTS:
            value = getattr(self, name)
            if not _is_int(value) or value < 0:
                raise _invalid(name, value, "it must be an integer >= 0")
        for name in _PROBABILITIES:
            value = getattr(self, name)
            if not _is_number(value) or not 0.0 <= value < 1.0:
                raise _invalid(name, value, "it must be a probability in [0, 1)")
        for name in _POSITIVE_FLOATS:
            value = getattr(self, name)
            if not _is_number(value) or not value > 0:
                raise _invalid(name, value, "it must be a positive number")
        for name in _BOOLS:
            value = getattr(self, name)
            if not isinstance(value, bool) and not (value is None and name in _OPTIONAL):
                raise _invalid(name, value, "it must be True or False")
        for name, choices in _CHOICES.items():
            value = getattr(self, name)
            if (value is not None or name not in _OPTIONAL) and (value not in choices or isinstance(value, bool)):
                raise _invalid(name, value, f"choose one of {list(choices)}")
        if not isinstance(self.hidden_act, str) or self.hidden_act not in ACT2FN:
            raise _invalid("hidden_act", self.hidden_act, f"choose one of {sorted(ACT2FN)}")
        self._check_token_ids()

    def _check_token_ids(self) -> None:
        for name in _TOKEN_IDS:
            value = getattr(self, name)
            ids = value if isinstance(value, list) else [value]
            if value is None:
                continue
            if not ids or not all(_is_int(i) and 0 <= i < self.vocab_size for i in ids):
                raise _invalid(name, value, f"it must be None or a token id in [0, {self.vocab_size})")

    def _resolve_defaults(self) -> None:
        """Fill the fields whose default depends on others (the mask, K = D / H, the MLP width, the positions)."""
        if self.is_causal is None:  # text: the §4.1 language model; images: §4.2, every patch sees every patch;
            # a classifier reading the first token (the pooler, 'cls' pooling) needs it to see the others
            self.is_causal = not (self.is_image_model or self.use_pooler or self.classifier_pooling == "cls")
        if self.position_embedding_combine is None:  # a width for concatenated positions asks for them
            self.position_embedding_combine = "add" if self.position_embedding_size is None else "concat"
        if self.tie_word_embeddings is None:  # concatenated positions leave the token embedding narrower than D
            self.tie_word_embeddings = self.is_image_model or self.position_embedding_combine != "concat"
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                raise _invalid(
                    "hidden_size",
                    self.hidden_size,
                    f"it must be divisible by num_attention_heads={self.num_attention_heads}, or set head_dim",
                )
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.intermediate_size is None:
            self.intermediate_size = 4 * self.hidden_size
        if self.is_image_model:
            if self.image_size % self.patch_size:
                raise _invalid("patch_size", self.patch_size, f"it must divide image_size={self.image_size}")
            needed = self.num_patches + 1
            if self.max_position_embeddings is None:
                self.max_position_embeddings = needed
            elif self.max_position_embeddings != needed:
                raise _invalid(
                    "max_position_embeddings",
                    self.max_position_embeddings,
                    f"an image model has (image_size / patch_size)^2 + 1 = {needed} positions; leave it unset",
                )
        elif self.max_position_embeddings is None:
            self.max_position_embeddings = _DEFAULT_TEXT_POSITIONS
        if self.classifier_pooling is None:
            first = self.use_pooler or self.is_image_model
            self.classifier_pooling = "last" if self.is_causal else ("cls" if first else "mean")
        if self.position_embedding_combine == "concat" and self.position_embedding_size is None:
            self.position_embedding_size = self.hidden_size // 4

    def _check_combinations(self) -> None:
        self._check_position_combinations()
        if self.is_causal and self.classifier_pooling == "cls":
            raise _invalid(
                "classifier_pooling",
                "cls",
                "under the causal mask the first token attends only to itself, so a classifier reading it would "
                "ignore the input; use 'last' or 'mean', or is_causal=False",
            )
        if self.is_causal and self.normalization == "batchnorm":
            logger.warning(
                "TurnerConfig: normalization='batchnorm' shares statistics across all tokens of a batch, so while "
                "training later tokens change earlier outputs and the causal mask is not airtight (eval is exact)."
            )
        if self.use_pooler and self.classifier_pooling != "cls":
            raise _invalid(
                "use_pooler", self.use_pooler, "the pooler reads the first token; it needs classifier_pooling='cls'"
            )
        if self.is_image_model and self.type_vocab_size:
            raise _invalid("type_vocab_size", self.type_vocab_size, "an image model has no token types; use 0")
        if self.is_image_model and self.embedding_layer_norm:
            raise _invalid(
                "embedding_layer_norm", self.embedding_layer_norm, "image models have no embedding norm; use False"
            )

    def _check_position_combinations(self) -> None:
        if self.position_embedding_type == "rotary" and self.head_dim % 2:
            raise _invalid("head_dim", self.head_dim, "rotary positions rotate pairs of features; use an even head_dim")
        if self.position_embedding_combine == "add":
            if self.position_embedding_size is not None:
                raise _invalid(
                    "position_embedding_size",
                    self.position_embedding_size,
                    "it sets the width of concatenated positions; leave it None with position_embedding_combine='add'",
                )
            return
        if self.position_embedding_type not in ("learned", "sinusoidal"):
            raise _invalid(
                "position_embedding_combine",
                self.position_embedding_combine,
                f"position_embedding_type={self.position_embedding_type!r} adds no vector to concatenate; use "
                "'learned' or 'sinusoidal' positions, or 'add'",
            )
        if self.position_embedding_size >= self.hidden_size:
            raise _invalid(
                "position_embedding_size",
                self.position_embedding_size,
                f"concatenated positions must leave room for token features: below hidden_size={self.hidden_size}",
            )
        if self.tie_word_embeddings and not self.is_image_model:
            raise _invalid(
                "tie_word_embeddings",
                self.tie_word_embeddings,
                "with concatenated positions the token embedding is narrower than the output head; leave it "
                "unset (it then defaults to False) or set tie_word_embeddings=False",
            )


__all__ = ["TurnerConfig"]
