"""What the three converters share: tensor rules that run both ways, option checks, model-level conversion.

A converter is a table. Each `Rule` names tensors of the source's state dict, the Turner tensors they become and the
transform each way (a rename, a transpose, a split). Running the table consumes every source tensor exactly once;
a tensor with no rule, or a rule with no tensor, is an error, so nothing is dropped or invented on the way.
"""

import copy
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import torch
from transformers import PreTrainedConfig, PreTrainedModel

from turner_tfm import TurnerConfig, TurnerModel

StateDict = dict[str, torch.Tensor]
Transform = Callable[[list[torch.Tensor]], list[torch.Tensor]]

TURNER = "Turner"


def same_names(*names: str) -> dict[str, str]:
    """Config fields spelled the same in the source family and in TurnerConfig."""
    return {name: name for name in names}


LABEL_FIELDS = same_names("id2label", "label2id", "problem_type")
TOKEN_FIELDS = same_names("pad_token_id", "bos_token_id", "eos_token_id", "tie_word_embeddings")
ENCODER_FIELDS = {  # BERT and ViT: the standard names, and dropout as BERT spells it
    **same_names(
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "hidden_act",
        "layer_norm_eps",
        "initializer_range",
    ),
    "hidden_dropout_prob": "hidden_dropout",
    "attention_probs_dropout_prob": "attention_dropout",
}


def _unchanged(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return tensors


@dataclass(frozen=True)
class Rule:
    """Tensors `source` of the foreign model <-> tensors `turner`, with the transform for each direction."""

    source: tuple[str, ...]
    turner: tuple[str, ...]
    to_turner: Transform = _unchanged
    to_source: Transform = _unchanged

    def prefixed(self, source_prefix: str, turner_prefix: str) -> "Rule":
        """The rule for a model whose backbone sits under these prefixes (e.g. "transformer." and "model.")."""
        return replace(
            self,
            source=tuple(source_prefix + key for key in self.source),
            turner=tuple(turner_prefix + key for key in self.turner),
        )

    def for_layer(self, index: int) -> "Rule":
        """The rule with `{i}` in its keys replaced by the layer index."""
        return replace(
            self,
            source=tuple(key.format(i=index) for key in self.source),
            turner=tuple(key.format(i=index) for key in self.turner),
        )


def rename(source: str, turner: str) -> Rule:
    """One tensor, same values, new name."""
    return Rule((source,), (turner,))


def rename_module(source: str, turner: str) -> list[Rule]:
    """The weight and bias of a module (a Linear, a LayerNorm, a Conv2d) under a new module name."""
    return [rename(f"{source}.{param}", f"{turner}.{param}") for param in ("weight", "bias")]


def rename_modules(names: Mapping[str, str]) -> list[Rule]:
    """`rename_module` for each source module -> Turner module pair of `names`."""
    return [rule for source, turner in names.items() for rule in rename_module(source, turner)]


QKV = ("query", "key", "value")
QKV_PROJ = "layers.{i}.self_attn.qkv_proj"  # Turner's stacked projections (`TurnerAttention.qkv_proj`)


def _stack(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return [torch.cat(tensors, dim=0)]


def _unstack(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    (stacked,) = tensors
    return [part.clone() for part in stacked.chunk(len(QKV), dim=0)]


def stacked_projections(sources: Mapping[str, str], turner: str) -> list[Rule]:
    """The source's separate query, key and value Linears (`sources` maps each of `QKV` to a module name) as
    Turner's `qkv_proj` (module `turner`), which stacks them in that order, weights and biases."""
    return [
        Rule(tuple(f"{sources[part]}.{param}" for part in QKV), (f"{turner}.{param}",), _stack, _unstack)
        for param in ("weight", "bias")
    ]


def per_layer(num_layers: int, rules: Sequence[Rule]) -> list[Rule]:
    """`rules` written with `{i}` for the layer index, repeated for layers 0 .. num_layers - 1."""
    return [rule.for_layer(index) for index in range(num_layers) for rule in rules]


POOLER_RULES = rename_module("pooler.dense", "pooler.dense")


def unsupported(option: str, value: object, where: str, valid: str) -> ValueError:
    """The error for an option that the other side cannot express."""
    return ValueError(f"Cannot convert: `{option}`={value!r} in the {where} config has no counterpart; {valid}.")


def require(config: PreTrainedConfig, required: Mapping[str, object], where: str) -> None:
    """Refuse a config whose options differ from the only values the other side can express.

    An option the config does not have counts as having its required value (it cannot change the model).
    """
    for option, expected in required.items():
        value = getattr(config, option, expected)
        if value != expected:
            raise unsupported(option, value, where, f"only {expected!r} converts")


def carry(config: PreTrainedConfig, names: Mapping[str, str]) -> dict[str, object]:
    """The fields that mean the same on both sides, copied from `config` under the names `names` maps them to."""
    return {new: getattr(config, old) for old, new in names.items() if hasattr(config, old)}


def drop_out_of_vocab_ids(fields: dict[str, object], where: str) -> dict[str, object]:
    """`fields` without the special-token ids outside [0, vocab_size): the source library keeps them (GPT-2's
    default bos/eos of 50256 in a small vocabulary), Turner cannot hold them, and no weight depends on them."""
    kept, dropped, vocab_size = dict(fields), {}, fields.get("vocab_size", TurnerConfig.vocab_size)
    for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
        value = fields.get(name)
        ids = value if isinstance(value, list) else [value]
        valid = [i for i in ids if i is not None and 0 <= i < vocab_size]
        if value is not None and len(valid) < len(ids):
            dropped[name] = value
            kept[name] = (valid or None) if isinstance(value, list) else None
    if dropped:
        shown = ", ".join(f"{name}={value!r}" for name, value in dropped.items())
        warnings.warn(
            f"Dropped special-token ids outside the vocabulary (vocab_size={vocab_size}) of the {where} "
            f"config: {shown}; Turner cannot hold them, and no weight depends on them.",
            stacklevel=3,
        )
    return kept


def apply_rules(state_dict: Mapping[str, torch.Tensor], rules: Sequence[Rule], to_turner: bool, what: str) -> StateDict:
    """Run `rules` one way over `state_dict`; every input tensor must be used by exactly one rule."""
    remaining = dict(state_dict)
    converted: StateDict = {}
    for rule in rules:
        inputs, outputs, transform = (
            (rule.source, rule.turner, rule.to_turner) if to_turner else (rule.turner, rule.source, rule.to_source)
        )
        missing = [key for key in inputs if key not in remaining]
        if missing:
            raise ValueError(f"Cannot convert {what}: the state dict lacks {missing}.")
        converted.update(zip(outputs, transform([remaining.pop(key) for key in inputs]), strict=True))
    if remaining:
        raise ValueError(
            f"Cannot convert {what}: the state dict holds tensors with no counterpart: {sorted(remaining)}."
        )
    return converted


@dataclass(frozen=True)
class Head:
    """One class of the foreign family and the Turner class it becomes.

    `pooler`: True or False when the class always or never has BERT's pooler, None when it is optional (the
    class takes `add_pooling_layer`; the state dict says which). `turner_options`: TurnerConfig fields this head
    implies; they are set on the way in and required on the way back. `check_source`: refuses a source config
    this head cannot convert (raises ValueError).
    """

    source_class: type[PreTrainedModel]
    turner_class: type[PreTrainedModel]
    rules: Sequence[Rule] = ()
    pooler: bool | None = False
    turner_options: Mapping[str, object] = field(default_factory=dict)
    check_source: Callable[[PreTrainedConfig], None] | None = None


def first_token_classifier(
    source_class: type[PreTrainedModel], turner_class: type[PreTrainedModel], pooler: bool = False
) -> Head:
    """A head whose `classifier` (so named on both sides) reads the first token, through BERT's pooler when `pooler`:
    BERT's sequence classifier and multiple-choice scorer, ViT's image classifier."""
    rules = rename_module("classifier", "classifier")
    return Head(source_class, turner_class, rules, pooler=pooler, turner_options={"classifier_pooling": "cls"})


def every_token_head(
    source_class: type[PreTrainedModel],
    turner_class: type[PreTrainedModel],
    module: str,
    check_source: Callable[[PreTrainedConfig], None] | None = None,
) -> Head:
    """A head whose `module` (so named on both sides) scores every token, without a pooler: BERT's and GPT-2's token
    classifier (`classifier`) and span scorer (`qa_outputs`)."""
    return Head(source_class, turner_class, rename_module(module, module), check_source=check_source)


# The paper's research switches at the values GPT-2, ViT and BERT all share (a family's own table may override).
STANDARD_BLOCK = {
    "position_embedding_type": "learned",
    "position_embedding_combine": "add",
    "share_query_key": False,
    "normalization": "layernorm",
    "mlp_hidden_layers": 1,
}


class Converter:
    """Weight maps between one foreign family and Turner; subclasses fill in the family's tables."""

    name: str
    config_class: type[PreTrainedConfig]
    base_class: type[PreTrainedModel]
    heads: Mapping[str, Head]
    fields: Mapping[str, str] = LABEL_FIELDS  # source config field -> TurnerConfig field, same meaning
    source_required: Mapping[str, object] = {}
    turner_required: Mapping[str, object] = {}
    # the base model -> TurnerModel, pooler excluded: embeddings, each layer (keys with `{i}`), after the layers
    embedding_rules: Sequence[Rule] = ()
    layer_rules: Sequence[Rule] = ()
    final_rules: Sequence[Rule] = ()

    def turner_fields(self, config: PreTrainedConfig, use_pooler: bool) -> dict[str, object]:
        """TurnerConfig fields beyond `fields`; raises ValueError for what Turner cannot express."""
        raise NotImplementedError

    def source_fields(self, config: TurnerConfig) -> dict[str, object]:
        """Source config fields beyond `fields`; raises ValueError for what the family cannot express."""
        raise NotImplementedError

    def head(self, architecture: str) -> Head:
        """The head for a class name of this family, e.g. "GPT2LMHeadModel"."""
        if architecture not in self.heads:
            raise ValueError(
                f"`architecture`={architecture!r} is not a {self.name} class that converts; choose one of "
                f"{list(self.heads)}."
            )
        return self.heads[architecture]

    def architecture_for(self, turner_class_name: str) -> str:
        """The class of this family that a Turner class converts back into."""
        for architecture, head in self.heads.items():
            if head.turner_class.__name__ == turner_class_name:
                return architecture
        turner_classes = [head.turner_class.__name__ for head in self.heads.values()]
        raise ValueError(
            f"Turner class {turner_class_name!r} has no {self.name} counterpart; {self.name} converts {turner_classes}."
        )

    def to_turner(
        self, state_dict: Mapping[str, torch.Tensor], config: PreTrainedConfig, architecture: str
    ) -> tuple[StateDict, TurnerConfig]:
        """A state dict (as `model.state_dict()` gives it) and config of class `architecture`, in Turner's terms."""
        head = self.head(architecture)
        if not isinstance(config, self.config_class):
            raise ValueError(f"`config` is a {type(config).__name__}; expected a {self.config_class.__name__}.")
        require(config, self.source_required, self.name)
        if head.check_source is not None:
            head.check_source(config)
        source_prefix = self._prefix(head.source_class, self.base_class)
        use_pooler = head.pooler if head.pooler is not None else f"{source_prefix}pooler.dense.weight" in state_dict
        fields = {
            **carry(config, self.fields),
            **self.turner_fields(config, use_pooler),
            **head.turner_options,
            "use_pooler": use_pooler,
            "architectures": [head.turner_class.__name__],
        }
        turner_config = TurnerConfig(**drop_out_of_vocab_ids(fields, self.name))
        rules = self._rules(head, turner_config)
        return apply_rules(state_dict, rules, True, f"{architecture} to {TURNER}"), turner_config

    def from_turner(
        self, state_dict: Mapping[str, torch.Tensor], config: TurnerConfig, architecture: str
    ) -> tuple[StateDict, PreTrainedConfig]:
        """A Turner state dict and config back into class `architecture` of this family (the inverse map)."""
        head = self.head(architecture)
        if not isinstance(config, TurnerConfig):
            raise ValueError(f"`config` is a {type(config).__name__}; expected a TurnerConfig.")
        self._check_turner(config, head)
        back = {turner: source for source, turner in self.fields.items()}
        fields = {**carry(config, back), **self.source_fields(config), "architectures": [architecture]}
        source_config = self.config_class(**fields)
        rules = self._rules(head, config)
        return apply_rules(state_dict, rules, False, f"{TURNER} to {architecture}"), source_config

    def model_to_turner(self, model: PreTrainedModel) -> PreTrainedModel:
        """A loaded model of this family as the equivalent Turner model (same dtype, same generation config)."""
        state_dict, config = self.to_turner(model.state_dict(), model.config, type(model).__name__)
        head = self.head(type(model).__name__)
        return _filled(head.turner_class(config), state_dict, model)

    def model_from_turner(self, model: PreTrainedModel, architecture: str) -> PreTrainedModel:
        """A loaded Turner model as the equivalent model of class `architecture` of this family."""
        head = self.head(architecture)
        if type(model) is not head.turner_class:
            raise ValueError(
                f"`model` is a {type(model).__name__}; {architecture} converts from {head.turner_class.__name__}."
            )
        state_dict, config = self.from_turner(model.state_dict(), model.config, architecture)
        pooler_arg = {"add_pooling_layer": model.config.use_pooler} if head.pooler is None else {}
        return _filled(head.source_class(config, **pooler_arg), state_dict, model)

    def _rules(self, head: Head, turner_config: TurnerConfig) -> list[Rule]:
        backbone = [
            *self.embedding_rules,
            *per_layer(turner_config.num_hidden_layers, self.layer_rules),
            *self.final_rules,
            *(POOLER_RULES if turner_config.use_pooler else ()),
        ]
        source_prefix = self._prefix(head.source_class, self.base_class)
        turner_prefix = self._prefix(head.turner_class, TurnerModel)
        return [rule.prefixed(source_prefix, turner_prefix) for rule in backbone] + list(head.rules)

    def _check_turner(self, config: TurnerConfig, head: Head) -> None:
        where = f"{TURNER} (to {head.source_class.__name__})"
        require(config, {**STANDARD_BLOCK, **self.turner_required, **head.turner_options}, where)
        if head.pooler is not None and config.use_pooler != head.pooler:
            raise unsupported(
                "use_pooler", config.use_pooler, where, f"{head.source_class.__name__} needs {head.pooler}"
            )
        if config.head_dim * config.num_attention_heads != config.hidden_size:
            raise unsupported(
                "head_dim",
                config.head_dim,
                where,
                f"{self.name} needs head_dim = hidden_size / num_attention_heads = "
                f"{config.hidden_size / config.num_attention_heads:g}",
            )

    @staticmethod
    def _prefix(model_class: type[PreTrainedModel], base_class: type[PreTrainedModel]) -> str:
        """Where the backbone's tensors sit in a state dict of `model_class`."""
        return "" if model_class is base_class else f"{model_class.base_model_prefix}."


def _filled(target: PreTrainedModel, state_dict: StateDict, source: PreTrainedModel) -> PreTrainedModel:
    """`target` holding `state_dict`, on `source`'s device, in its dtype and train/eval mode, with its generation
    config."""
    target.to(device=source.device, dtype=source.dtype)
    target.load_state_dict(state_dict, strict=True)
    if source.can_generate() and target.can_generate():
        target.generation_config = copy.deepcopy(source.generation_config)
    return target.train(source.training)
