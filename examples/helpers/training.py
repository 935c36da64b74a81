"""What every multi-process training script does around its own `Trainer(...)`: its arguments through transformers'
`HfArgumentParser` (as run_clm.py), the `TurnerConfig` fields as flags, and the run itself (resume, watch, loss
curve, the process group left at the end).

- `config_arguments`: a script's model dataclass plus every field `TurnerConfig` declares (its type, `Literal`
  choices and default), read from the config class itself;
- `parse_arguments`: `HfArgumentParser` over the script's dataclasses, or a .json/.yaml file of the same names, then
  the seed set;
- `text_config`, `label_fields`: the `TurnerConfig` fields a script sets from its tokenizer and its labels;
- `train`: `trainer.train()`, resumed where --resume_from_checkpoint says, watching the other processes;
- `accuracy`: a classifier's `compute_metrics`;
- `run`: a script's `main`, then the process group left cleanly; a `UsageError` (a file, folder or dataset the user
  named that is not there) ends it in one line, as argparse ends a bad flag.
"""

import argparse
import dataclasses
import inspect
import sys
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import yaml
from transformers import (
    HfArgumentParser,
    PreTrainedConfig,
    PreTrainedTokenizerBase,
    Trainer,
    TrainingArguments,
    set_seed,
)
from transformers.trainer_utils import TrainOutput

from turner_tfm import TurnerConfig

from .argtypes import saved_model
from .distributed import (
    ProcessWatch,
    announce,
    distributed_without_gpu,
    leave_process_group,
    start_process_group,
)
from .model_card import print_loss_curve
from .resume import checkpoint_to_resume

# What the training scripts set unlike TrainingArguments' own defaults (a script adds its own; a flag wins).
# eval_strategy and save_strategy follow --eval_steps and --save_steps unless given: "steps" with them, else "no".
TRAINING_DEFAULTS = {
    "learning_rate": 1e-3,
    "per_device_train_batch_size": 32,
    "per_device_eval_batch_size": 64,
    "warmup_steps": 0.05,
    "weight_decay": 0.01,
    "lr_scheduler_type": "cosine",
    "logging_steps": 25,
    "logging_first_step": True,
    "ddp_find_unused_parameters": False,  # every parameter takes part in every forward pass
    "eval_strategy": None,
    "save_strategy": None,
    "save_steps": None,
}
ARGUMENTS_FILES = (".json", ".yaml", ".yml")
# TurnerConfig fields a script sets from its data or task, never from a flag
SET_FROM_DATA = {
    *("vocab_size", "pad_token_id", "bos_token_id", "eos_token_id", "max_position_embeddings", "is_causal"),
    *("image_size", "patch_size", "num_channels", "type_vocab_size", "use_cache"),
}
CLASSIFIER_FIELDS = ("classifier_pooling", "classifier_dropout", "use_pooler")
# The language-model scripts' model unless flags say otherwise: 4 blocks of D=128
LANGUAGE_MODEL_SIZE = {"hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4}


class UsageError(ValueError):
    """What the user named is not there or not usable (a file, a model folder, a dataset), found once the run reads it:
    `run` ends the script with it in one line, `PROG: error: MESSAGE`, not with a traceback."""


@dataclass
class NoScriptArguments:
    """The model arguments of a script that has none of its own: `config_arguments` adds the TurnerConfig fields."""


@dataclass
class LanguageModelArguments:
    """A language model's own arguments: a saved one to go on training, or a tokenizer to train on the text."""

    model_name_or_path: str | None = field(
        default=None, metadata={"help": "continue training this saved Turner model (and its tokenizer)"}
    )
    tokenizer: Literal["char", "bpe"] = field(default="char", metadata={"help": "trained here on the text"})
    vocab_size: int = field(default=1000, metadata={"help": "tokens of the BPE tokenizer"})

    def __post_init__(self) -> None:
        check_saved_model("model_name_or_path", self.model_name_or_path)


def check_file(flag: str, path: str | None, suffixes: Sequence[str] = ()) -> None:
    """Refuse --`flag` `path` (when given) unless it is a file, ending in one of `suffixes` when there are some."""
    if path is None:
        return
    if suffixes and not path.lower().endswith(tuple(suffixes)):
        raise ValueError(f"--{flag} {path!r} is not valid: expected a {', '.join(suffixes)} file")
    if not Path(path).expanduser().is_file():
        raise ValueError(f"--{flag} {path!r} is not valid: no such file in {Path.cwd()}; give the path of one")


def check_saved_model(flag: str, path: str | None) -> None:
    """Refuse --`flag` `path` unless it is a saved model folder (with a config.json) or looks like a Hub repo id
    (`namespace/name`), as `argtypes.saved_model` does for the scripts that train nothing."""
    if path is not None:
        try:
            saved_model(path)
        except argparse.ArgumentTypeError as error:
            raise ValueError(f"--{flag} {error}; give the --output_dir of a finished run, or a Hub id") from None


def config_arguments(base: type, *, exclude: Sequence[str] = (), include: Sequence[str] = (), **defaults) -> type:
    """`base` (a dataclass of the script's own model arguments) with a field for each field `TurnerConfig` declares,
    of the config's type and default (`defaults` per script), but those in `SET_FROM_DATA` (unless in `include`) and
    `exclude`. The result's `config_kwargs()` are those fields' values; a combination the config refuses fails as the
    arguments are parsed."""
    mro = TurnerConfig.__mro__
    declared = {name for cls in mro[: mro.index(PreTrainedConfig)] for name in inspect.get_annotations(cls)}
    fields = []
    for config_field in dataclasses.fields(TurnerConfig):
        name = config_field.name
        if name not in declared or name in exclude or (name in SET_FROM_DATA and name not in include):
            continue
        default = defaults.pop(name, config_field.default)
        help_text = f"TurnerConfig.{name}"
        fields.append((name, _flag_type(config_field.type), field(default=default, metadata={"help": help_text})))
    if defaults:
        raise TypeError(f"not a TurnerConfig field {base.__name__} takes: {sorted(defaults)}")
    names = tuple(name for name, _, _ in fields)

    def config_kwargs(self) -> dict[str, object]:
        return {name: getattr(self, name) for name in names}

    def __post_init__(self) -> None:
        if hasattr(base, "__post_init__"):  # the script's own checks first
            base.__post_init__(self)
        TurnerConfig(**self.config_kwargs())  # raises a ValueError naming the field, the value and what is valid

    namespace = {"config_kwargs": config_kwargs, "__post_init__": __post_init__}
    return dataclasses.make_dataclass(base.__name__, fields, bases=(base,), namespace=namespace)


def _flag_type(kind: object) -> object:
    """The config's type as `HfArgumentParser` takes it: a union of numbers is a float (it takes one type)."""
    members = typing.get_args(kind) if typing.get_origin(kind) in (typing.Union, types.UnionType) else ()
    if int in members and float in members:
        return float | None if type(None) in members else float
    return kind


@dataclass
class TextDataArguments:
    """Where a language model's text comes from: a file, a `datasets` dataset, or the script's built-in corpus."""

    _argument_group_name = "text data"
    train_file: str | None = field(default=None, metadata={"help": "a UTF-8 text file"})
    dataset_name: str | None = field(default=None, metadata={"help": "a `datasets` dataset: a Hub id or a folder"})
    dataset_config_name: str | None = field(default=None, metadata={"help": "the dataset's configuration"})
    dataset_split: str = field(default="train", metadata={"help": "the split to read"})
    text_column: str = field(default="text", metadata={"help": "the dataset column that holds the text"})
    validation_split_percentage: float = field(default=5.0, metadata={"help": "held-out share of the text"})
    block_size: int = field(default=128, metadata={"help": "tokens per training sequence"})

    def __post_init__(self) -> None:
        check_file("train_file", self.train_file)

    def text_source(self) -> dict[str, str | None]:
        """The keywords of `data.load_text`."""
        names = ("train_file", "dataset_name", "dataset_config_name", "dataset_split", "text_column")
        return {name: getattr(self, name) for name in names}


@dataclass
class SampleArguments(TextDataArguments):
    """A causal language model's text, and the sample it writes at the end (`model_card.evaluate_and_sample`)."""

    prompt: str = field(default="Return the", metadata={"help": "start of the sample printed at the end"})
    max_new_tokens: int = field(default=100, metadata={"help": "length of the sample"})


def parse_arguments(dataclass_types: tuple[type, ...], argv: list[str] | None = None, **defaults) -> tuple:
    """`HfArgumentParser(dataclass_types)` over the command line, as run_clm.py parses it, with `TRAINING_DEFAULTS` and
    the script's `defaults` for `TrainingArguments`; a .json or .yaml file of the same names first stands for flags
    (flags after it win). Joins the process group of a multi-process run on CPUs before `TrainingArguments` does, and
    resolves --resume_from_checkpoint true|auto. A bad value or combination exits with the usage and the error.
    Then sets --seed, as run_clm.py does before it builds anything."""
    parser = HfArgumentParser(dataclass_types)
    parser.set_defaults(dataloader_pin_memory=torch.cuda.is_available(), use_cpu=distributed_without_gpu())
    parser.set_defaults(**TRAINING_DEFAULTS)
    parser.set_defaults(**defaults)  # the script's own, over the common ones
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0].endswith(ARGUMENTS_FILES):
        parser.set_defaults(**yaml.safe_load(Path(argv.pop(0)).read_text(encoding="utf-8")))  # JSON is YAML too
    given, _ = parser.parse_known_args(argv)
    parser.set_defaults(
        eval_strategy=given.eval_strategy or ("steps" if given.eval_steps else "no"),
        save_strategy=given.save_strategy or ("steps" if given.save_steps else "no"),
        save_steps=given.save_steps or 500,
    )
    start_process_group(given.ddp_timeout)  # TrainingArguments joins it as it is built
    try:
        parsed = parser.parse_args_into_dataclasses(argv)
        training_args = next(args for args in parsed if isinstance(args, TrainingArguments))
        if training_args.resume_from_checkpoint is not None:
            resume = training_args.resume_from_checkpoint
            try:
                training_args.resume_from_checkpoint = checkpoint_to_resume(resume, training_args.output_dir)
            except ValueError as error:
                raise ValueError(f"--resume_from_checkpoint {resume!r} is not valid: {error}") from None
    except ValueError as error:  # a dataclass (TrainingArguments, TurnerConfig) refused a value or a combination
        parser.error(str(error))
    set_seed(training_args.seed)
    return parsed


def text_config(tokenizer: PreTrainedTokenizerBase, max_length: int, model_args: Any, **fields: object) -> TurnerConfig:
    """The `TurnerConfig` of a text model trained from scratch: the vocabulary and special tokens of `tokenizer`,
    `max_length` positions, the fields the flags set (`model_args.config_kwargs()`) and the task's `fields`."""
    return TurnerConfig(
        vocab_size=len(tokenizer),
        max_position_embeddings=max_length,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **fields,
        **model_args.config_kwargs(),
    )


def label_fields(names: Sequence[str]) -> dict[str, dict]:
    """The config's `id2label` and `label2id` for the class `names`, in order."""
    return {"id2label": dict(enumerate(names)), "label2id": {name: i for i, name in enumerate(names)}}


def train(trainer: Trainer) -> TrainOutput:
    """`trainer.train()`, resumed from --resume_from_checkpoint (said once), naming the processes that are gone if a
    collective fails; then the loss curve in one line."""
    resume = trainer.args.resume_from_checkpoint
    if resume is not None:
        announce(f"resuming from {resume}")
    with ProcessWatch.start():
        result = trainer.train(resume_from_checkpoint=resume)
    print_loss_curve(trainer)
    return result


def accuracy(eval_prediction: tuple) -> dict[str, float]:
    """The `Trainer`'s `compute_metrics` of a classifier: the share of labels predicted right (-100, a token without
    a label, does not count)."""
    logits, label_ids = eval_prediction
    labelled = label_ids != -100
    return {"accuracy": float((np.argmax(logits, axis=-1) == label_ids)[labelled].mean())}


def run(main: Callable[[], None]) -> None:
    """Run a training script's `main`, then leave the process group (every process waits for the others after a
    success; after a failure none does, so the launcher stops the rest)."""
    finished = False
    try:
        main()
        finished = True
    except UsageError as error:
        sys.exit(f"{Path(sys.argv[0]).name}: error: {error}")
    finally:
        leave_process_group(wait_for_the_others=finished)
