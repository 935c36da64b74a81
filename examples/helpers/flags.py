"""The command line of the example scripts, checked before torch loads, so that `--help` and a bad value answer at
once (importing `TrainingArguments` loads torch: seconds).

- Every field of `transformers.TrainingArguments` is a flag of every training script, named as transformers'
  `HfArgumentParser` names it: `--learning_rate`, with `--learning-rate` as an alias; a switch takes an optional
  true/false (`--bf16`, `--bf16 false`), and one that is on by default also has `--no_<name>`. The fields are read
  from the installed transformers' own source (`training_fields.py`).
- Instead of flags, a single `.json` or `.yaml` file of them (`python examples/quickstart.py args.json`), as
  transformers' `run_clm.py` takes; flags after the file override it.
- The `TurnerConfig` fields a model trained from scratch can set (`MODEL_FLAGS`), spelled the same way.
- Every message names the flag as it was typed, the value, and what is allowed; a field a script sets itself is
  refused by name, with the reason.
"""

import argparse
import contextlib
import fnmatch
import json
import os
import re
import sys
import typing
from collections.abc import Callable, Iterator
from pathlib import Path

from .resume import checkpoint_to_resume
from .training_fields import boolean, options, training_flags


class UsageError(ValueError):
    """Bad input found once the data is read (a missing column, an empty folder); the script reports it like a bad
    flag: usage, then the message, exit status 2."""


# ------------------------------------------------------------------------------------------ values and their checks


def _number(kind: type, low: float, low_inclusive: bool, high: float | None = None) -> Callable[[str], float]:
    """An argparse type that parses `kind` and checks it lies in the range; the message says what is valid."""
    valid = f"a number in [{low}, {high})" if high is not None else "an integer" if kind is int else "a number"
    valid = valid if high is not None else f"{valid} {'>=' if low_inclusive else '>'} {low}"

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not valid: expected {valid}") from None
        too_low = value < low if low_inclusive else value <= low
        if too_low or (high is not None and value >= high):
            raise argparse.ArgumentTypeError(f"{text!r} is not valid: expected {valid}")
        return value

    parse.__name__ = kind.__name__
    return parse


positive_int = _number(int, 1, True)
non_negative_int = _number(int, 0, True)
positive_float = _number(float, 0.0, False)
non_negative_float = _number(float, 0.0, True)
probability = _number(float, 0.0, True, 1.0)
percentage = _number(float, 0.0, False, 100.0)


def existing_file(text: str) -> Path:
    """An argparse type for a file that must exist."""
    path = Path(text).expanduser()
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{text!r} is not valid: no such file")
    return path


def existing_dir(text: str) -> Path:
    """An argparse type for a folder that must exist."""
    path = Path(text).expanduser()
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is not valid: no such folder")
    return path


# --------------------------------------------------------------------------------------------------------- the parser

# What every training script sets unlike TrainingArguments' own defaults (a script adds its own on top); a flag wins.
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
    "eval_strategy": None,  # "steps" with --eval_steps, else "no" (`training_arguments`)
    "save_strategy": None,  # "steps" with --save_steps, else "no"
    "save_steps": None,
    "dataloader_pin_memory": None,  # where CUDA is
}
# Checks on top of the field's type, so a bad value stops the script before torch loads.
CHECKED_VALUES = {
    "learning_rate": positive_float,
    "num_train_epochs": positive_float,
    "per_device_train_batch_size": positive_int,
    "per_device_eval_batch_size": positive_int,
    "gradient_accumulation_steps": positive_int,
    "warmup_steps": non_negative_float,
    "weight_decay": non_negative_float,
    "logging_steps": positive_float,
    "eval_steps": positive_float,
    "save_steps": positive_float,
    "save_total_limit": positive_int,
    "seed": non_negative_int,
    "ddp_timeout": positive_int,
}
# Fields the Trainer does not read: transformers leaves them to scripts, and these always train and evaluate.
NOT_READ = {
    "do_train": "this script always trains (the Trainer does not read --do_train)",
    "do_eval": "this script always evaluates (the Trainer does not read --do_eval)",
    "do_predict": "this script predicts nothing on a test set (the Trainer does not read --do_predict)",
}
# The help of a field whose meaning the scripts' defaults change (TrainingArguments' own help says the rest).
HELP = {
    "eval_steps": "evaluate every N steps (default: at the end)",
    "eval_strategy": "when to evaluate (default: steps with --eval-steps, else only at the end)",
    "save_steps": "save a checkpoint every N steps (default: never)",
    "save_strategy": "when to save checkpoints (default: steps with --save-steps, else never)",
    "resume_from_checkpoint": "continue a run from its checkpoint-N folder; `true`: from the newest complete one in "
    "--output-dir; `auto`: the same, or start afresh where there is none (one command for the first start and every "
    "restart, e.g. under torchrun --max-restarts)",
    "use_cpu": "train on the CPU even if a GPU is there (automatic for several processes without a GPU)",
    "dataloader_pin_memory": "pin batches in memory for a faster copy to the GPU (default: where CUDA is)",
}
_UNSET = object()
ARGUMENTS_FILE_SUFFIXES = (".json", ".yaml", ".yml")


class ScriptParser(argparse.ArgumentParser):
    """An `ArgumentParser` that shows each flag's default in `--help` (but not `None`: an unset flag's help says what
    happens), and names a flag in an error the way it was given: as typed (`--learning-rate` or `--learning_rate`),
    or as the arguments file has it."""

    def __init__(self, description: str | None = None, **keywords: object) -> None:
        super().__init__(description=description, **{"formatter_class": _ShowDefaults, **keywords})
        self.training_fields: list[str] = []  # every TrainingArguments field (a training script's parser)
        self.training_defaults: dict[str, object] = {}  # those this script sets unlike TrainingArguments
        self.refused: dict[str, str] = {}  # field -> why this script refuses it
        self.typed: set[str] = set()  # the option strings of the command line being parsed
        self.arguments_file: Path | None = None
        self.from_file: set[str] = set()
        self.training_group: argparse._ArgumentGroup | None = None

    def format_help(self) -> str:
        """The help, with the script's own flags first and the long list of `TrainingArguments` fields after."""
        groups = self._action_groups
        self._action_groups = [g for g in groups if g is not self.training_group] + [self.training_group] * (
            self.training_group is not None
        )
        try:
            return super().format_help()
        finally:
            self._action_groups = groups

    def spelling(self, dest: str) -> str:
        """The flag of `dest` as it was given (the dashed spelling when it was not)."""
        dashed = f"--{dest.replace('_', '-')}"
        spellings = next((a.option_strings for a in self._actions if a.dest == dest and a.option_strings), [dashed])
        return self._given(spellings) or spellings[-1]

    def _given(self, spellings: list[str]) -> str | None:
        """The one of a flag's `spellings` the command line used, or "name in FILE" if the arguments file set it."""
        spellings = next((a.option_strings for a in self._actions if spellings[0] in a.option_strings), spellings)
        typed = next((s for s in spellings if s in self.typed), None)
        if typed is not None or self.arguments_file is None:
            return typed
        key = next((s for s in spellings if s in self.from_file), None)
        return f"{key.lstrip('-')} in {self.arguments_file}" if key else None

    def fail(self, dest: str, value: object, problem: str) -> typing.NoReturn:
        """Exit with usage and `argument --flag: value is not valid: problem`."""
        self.error(f"argument {self.spelling(dest)}: {value} is not valid: {problem}")

    def error(self, message: str) -> typing.NoReturn:
        match = re.match(r"argument (-[\w/-]+): ", message)
        if match:
            spellings = match.group(1).split("/")
            message = f"argument {self._given(spellings) or spellings[-1]}: {message[match.end() :]}"
        elif self.arguments_file is not None:
            message = f"{message} (arguments from {self.arguments_file} and the command line)"
        super().error(message)


class _ShowDefaults(argparse.ArgumentDefaultsHelpFormatter):
    def _get_help_string(self, action: argparse.Action) -> str | None:
        return action.help if action.default is None else super()._get_help_string(action)


def new_parser(description: str) -> ScriptParser:
    """A parser for a script with `description` (its docstring's first paragraph is used)."""
    return ScriptParser(description.split("\n\n")[0])


def training_parser(
    description: str, *, output_dir: str, refuse: dict[str, str] | None = None, **defaults: object
) -> ScriptParser:
    """A parser with every `TrainingArguments` field as a flag (in the group "training"), the script's `output_dir`
    and other `defaults` on top of `TRAINING_DEFAULTS`; `refuse` maps a field the script sets itself (or a pattern of
    fields, `eval_*`) to the reason it is refused."""
    parser = new_parser(description)
    parser.usage = "%(prog)s [-h] [ARGUMENTS.json|.yaml] [--flag [value] ...]"
    flags = training_flags()
    refused = {name: why for pattern, why in (refuse or {}).items() for name in fnmatch.filter(flags, pattern)}
    unknown = sorted(set(defaults) - set(flags)) + [p for p in refuse or {} if not fnmatch.filter(flags, p)]
    if unknown:
        raise TypeError(f"no TrainingArguments field: {unknown}")
    group = parser.training_group = parser.add_argument_group(
        "training (every field of transformers.TrainingArguments, as HfArgumentParser names it; dashes work too)"
    )
    parser.refused = {**NOT_READ, **refused}
    for name, keywords in flags.items():
        keywords = dict(keywords)
        spellings, negative = keywords.pop("options"), keywords.pop("negative", False)
        if keywords.pop("opaque", False):
            parser.refused[name] = f"a {keywords['type'].__name__} object, which no command line can give"
            keywords["type"] = str  # taken, then refused by name
        if name in CHECKED_VALUES:
            keywords["type"] = CHECKED_VALUES[name]
        if keywords.get("choices") and name not in HELP:  # listed once in the help, not after each spelling
            keywords["metavar"] = name.upper()
            keywords["help"] = f"{keywords.get('help', '')} One of: {', '.join(map(str, keywords['choices']))}."
        if name in parser.refused:
            keywords["help"] = f"refused by this script: {parser.refused[name]}"
        elif name in HELP:
            keywords["help"] = HELP[name]
        keywords["help"] = keywords.get("help", "").replace("%", "%%")
        group.add_argument(*spellings, **keywords)
        if negative:
            _add_negative(group, name)
    parser.training_fields = list(flags)
    parser.training_defaults = {**TRAINING_DEFAULTS, "output_dir": output_dir, **defaults}
    parser.set_defaults(**parser.training_defaults)
    return parser


def parse(parser: ScriptParser, argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line (or the arguments file it names first) and check it: what `run_script` does first."""
    argv = list(sys.argv[1:] if argv is None else argv)
    tokens = argv
    if parser.training_fields and argv and argv[0].endswith(ARGUMENTS_FILE_SUFFIXES):
        file_tokens = _file_arguments(parser, Path(argv[0]))
        parser.arguments_file = Path(argv[0])
        parser.from_file = {token for token in file_tokens if token.startswith("--")}
        tokens = [*file_tokens, *argv[1:]]
        argv = argv[1:]
    parser.typed = {token.split("=", 1)[0] for token in argv if token.startswith("-")}
    fields = set(parser.training_fields)  # which of them were given: those not left at this marker
    args = parser.parse_args(tokens, argparse.Namespace(**dict.fromkeys(fields, _UNSET)))
    given = {name for name in fields if getattr(args, name) is not _UNSET}
    for name in fields - given:
        setattr(args, name, parser.get_default(name))
    for name in sorted(given & set(parser.refused)):
        parser.error(f"argument {parser.spelling(name)}: refused by this script: {parser.refused[name]}")
    check_arguments(parser, args)
    args.training_arguments = {name: value for name, value in parser.training_defaults.items() if value is not None}
    args.training_arguments |= {name: getattr(args, name) for name in sorted(given)}
    return args


def _file_arguments(parser: ScriptParser, path: Path) -> list[str]:
    """The flags of an arguments file ({"learning_rate": 0.001, "bf16": true, ...}, as run_clm.py reads one), as
    command-line tokens, so the same parser checks them."""
    import yaml  # a dependency of transformers

    try:
        text = path.read_text(encoding="utf-8")
        values = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (OSError, ValueError, yaml.YAMLError) as error:
        parser.error(f"the arguments file {str(path)!r} is not valid: {error}")
    if not isinstance(values, dict):
        parser.error(f"the arguments file {str(path)!r} is not valid: expected a mapping of flag names to values")
    actions = {option: action for action in parser._actions for option in action.option_strings}
    tokens = []
    for key, value in values.items():
        option = f"--{key}"
        action = actions.get(option)
        if value is None:
            continue
        if action is not None and action.nargs == 0:  # store_true, a switch without a value
            tokens += [option] if value else []
        elif isinstance(value, list):
            tokens += [option, *(json.dumps(v) if isinstance(v, dict) else str(v) for v in value)]
        else:
            tokens += [option, json.dumps(value) if isinstance(value, (dict, bool)) else str(value)]
    return tokens


def check_arguments(parser: ScriptParser, args: argparse.Namespace) -> None:
    """Checks that span several flags; a failure exits with a message naming the flags, values and what is valid."""
    max_steps = getattr(args, "max_steps", -1)
    if max_steps == 0 or max_steps < -1:
        parser.fail("max_steps", max_steps, "expected an integer >= 1, or -1")
    hidden, heads = getattr(args, "hidden_size", None), getattr(args, "num_attention_heads", None)
    if hidden is not None and heads is not None and hidden % heads:
        parser.fail("hidden_size", hidden, f"it must be divisible by {parser.spelling('num_attention_heads')} {heads}")
    image, patch = getattr(args, "image_size", None), getattr(args, "patch_size", None)
    if image is not None and patch is not None and image % patch:
        parser.fail("patch_size", patch, f"it must divide {parser.spelling('image_size')} {image}")
    if getattr(args, "resume_from_checkpoint", None) is not None:
        try:
            args.resume_from_checkpoint = checkpoint_to_resume(args.resume_from_checkpoint, args.output_dir)
        except ValueError as error:
            parser.fail("resume_from_checkpoint", repr(args.resume_from_checkpoint), str(error))
    world_size, fsdp_size = int(os.environ.get("WORLD_SIZE", "1")), getattr(args, "fsdp_size", 1)
    if fsdp_size > 1 and fsdp_size != world_size:
        parser.fail(
            "fsdp_size",
            fsdp_size,
            f"it must equal the number of processes, {world_size} (start {fsdp_size} with: torchrun --nproc_per_node "
            f"{fsdp_size} {parser.prog} ...)",
        )
    if fsdp_size > 1 and getattr(args, "save_steps", None) is not None:
        parser.error(
            f"argument {parser.spelling('save_steps')}: {args.save_steps:g} is not valid with "
            f"{parser.spelling('fsdp_size')} {fsdp_size}: transformers cannot save the optimiser of a model sharded at "
            "load time, so no checkpoint could be resumed from; leave it out (the trained model is saved at the end "
            "all the same)"
        )


def training_arguments(args: argparse.Namespace) -> dict[str, object]:
    """The keywords of `TrainingArguments(...)`: every field given on the command line or in the arguments file, and
    the script's own defaults, with `eval_strategy`, `save_strategy`, `use_cpu` and `dataloader_pin_memory` following
    the other flags unless given. The rest keep TrainingArguments' defaults. A value outside choices transformers
    computes as it loads (its log levels), which the flags could not check, is refused here."""
    import torch
    from transformers import HfArgumentParser, TrainingArguments

    from .distributed import distributed_without_gpu

    kwargs = dict(args.training_arguments)
    for action in HfArgumentParser(TrainingArguments)._actions:
        value = kwargs.get(action.dest)
        if action.choices and isinstance(value, str) and value not in action.choices:
            choices = ", ".join(map(str, action.choices))
            raise UsageError(f"argument --{action.dest}: {value!r} is not valid: choose one of {choices}")
    kwargs.setdefault("eval_strategy", "steps" if args.eval_steps else "no")
    kwargs.setdefault("save_strategy", "steps" if args.save_steps else "no")
    kwargs.setdefault("dataloader_pin_memory", torch.cuda.is_available())
    kwargs["use_cpu"] = args.use_cpu or distributed_without_gpu()
    return kwargs


@contextlib.contextmanager
def usage_error(what: str) -> Iterator[None]:
    """Report a `ValueError` raised in the block (by `TurnerConfig` or `TrainingArguments` refusing a combination of
    flags) like a bad flag: `what: the error`."""
    try:
        yield
    except UsageError:
        raise
    except ValueError as error:
        raise UsageError(f"{what}: {error}") from None


def run_script(
    parser: ScriptParser,
    run: Callable[[argparse.Namespace], None],
    argv: list[str] | None = None,
    *,
    requires: dict[str, str] | None = None,
    model_hint: str = "",
) -> None:
    """Parse and check the flags, then `run(args)`. Bad input found later (a `UsageError`: a missing column, an empty
    folder) is reported like a bad flag: usage, the message, exit status 2.

    `requires` maps a flag to one it needs (`{"test_file": "train_file"}`); `model_hint` is added to the error for a
    --model-name-or-path that is not a saved model.
    """
    args = parse(parser, argv)
    if getattr(args, "model_name_or_path", None) is not None:
        check_model_path(parser, "model_name_or_path", args.model_name_or_path, model_hint)
    for flag, needed in (requires or {}).items():
        if getattr(args, flag) is not None and getattr(args, needed) is None:
            parser.error(
                f"argument {parser.spelling(flag)}: it needs {parser.spelling(needed)} (the built-in data makes its "
                "own split)"
            )
    finished = False
    try:
        run(args)
        finished = True
    except UsageError as error:
        parser.error(str(error))
    finally:
        if "torch" in sys.modules:  # a process group may be open
            from .distributed import leave_process_group

            leave_process_group(wait_for_the_others=finished)


def check_model_path(parser: ScriptParser, dest: str, path: str | None, hint: str = "") -> None:
    """A checkpoint named on the command line must be a saved model folder, unless it looks like a Hub repo id."""
    if path is None:
        return
    looks_like_repo_id = path.count("/") == 1 and not path.startswith((".", "/", "~")) and not os.path.exists(path)
    if not looks_like_repo_id and not os.path.isfile(os.path.join(path, "config.json")):
        flag = parser.spelling(dest)
        problem = "no saved model folder (with a config.json) there"
        parser.error(f"argument {flag}: {path!r} is not valid: {problem}. {hint}")


def check_sample_length(args: argparse.Namespace, tokenizer: object, config: object) -> None:
    """Before training: the prompt plus --max-new-tokens must fit the model's learned positions."""
    if config.position_embedding_type != "learned":
        return
    prompt_length = len(tokenizer(args.prompt)["input_ids"])
    room = config.max_position_embeddings - prompt_length
    if args.max_new_tokens > room:
        raise UsageError(
            f"argument --max-new-tokens: {args.max_new_tokens} is not valid: the model has "
            f"{config.max_position_embeddings} positions and the prompt takes {prompt_length}; use at most {room}"
        )


# ------------------------------------------------------------------------------------------ the script's own flags

# The `TurnerConfig` fields a model trained from scratch can set, by task. A flag left unset keeps TurnerConfig's own
# default; tests/test_example_flags.py checks the names, choices and switches against `TurnerConfig`.
MODEL_FLAGS: dict[str, dict[str, object]] = {
    "hidden_size": {"type": positive_int, "help": "D, features per token"},
    "num_hidden_layers": {"type": positive_int, "help": "M, blocks"},
    "num_attention_heads": {"type": positive_int, "help": "H, heads"},
    "head_dim": {"type": positive_int, "help": "K, features per query and key (default: D / H)"},
    "intermediate_size": {"type": positive_int, "help": "MLP width (default: 4 x --hidden-size)"},
    "mlp_hidden_layers": {"type": int, "choices": (1, 2), "help": "hidden layers of the MLP (footnote 14)"},
    "hidden_act": {"help": "the MLP's activation, a name in transformers' ACT2FN"},
    "hidden_dropout": {"type": probability},
    "attention_dropout": {"type": probability},
    "position_embedding_type": {
        "choices": ("learned", "sinusoidal", "rotary", "none"),
        "help": "§3; rotary: relative positions",
    },
    "position_embedding_combine": {"choices": ("add", "concat"), "help": "add positions, or concatenate them"},
    "position_embedding_size": {"type": positive_int, "help": "width of concatenated positions (default: D / 4)"},
    "rope_theta": {"type": positive_float, "help": "base of the rotary frequencies"},
    "share_query_key": {"type": boolean, "help": "U_q = U_k (footnote 9)"},
    "normalization": {"choices": ("layernorm", "rmsnorm", "batchnorm"), "help": "layernorm is TokenNorm (§2.3)"},
    "norm_position": {"choices": ("pre", "post"), "help": "norm on the inputs of MHSA and MLP, or after the sum"},
    "layer_norm_eps": {"type": positive_float},
    "initializer_range": {"type": positive_float, "help": "standard deviation of the initial weights"},
    "attention_bias": {"type": boolean},
    "mlp_bias": {"type": boolean},
    "embedding_layer_norm": {"type": boolean, "help": "a norm after the embeddings"},
    "tie_word_embeddings": {"type": boolean, "help": "lm_head shares the input embedding"},
    "classifier_pooling": {"choices": ("cls", "mean", "last"), "help": "which token(s) the classifier reads"},
    "classifier_dropout": {"type": probability},
    "use_pooler": {"type": boolean, "help": "a tanh layer on the pooled token (needs cls)"},
}
# The fields of `MODEL_FLAGS` that make no sense for a task, and why.
MODEL_FLAGS_NOT_FOR = {
    "causal-lm": ("classifier_pooling", "classifier_dropout", "use_pooler"),  # no classifier head
    "text-classification": ("tie_word_embeddings",),  # no language-model head to tie
    "image-classification": ("tie_word_embeddings", "embedding_layer_norm"),  # TurnerConfig refuses both for images
    # sentence-transformers pools the backbone's output itself: no head to tie, no classifier
    "sentence-embedding": ("tie_word_embeddings", "classifier_pooling", "classifier_dropout", "use_pooler"),
}


def add_switch(group: argparse._ActionsContainer, name: str, **keywords: object) -> None:
    """A true/false flag in the `HfArgumentParser` way: `--name` (true), `--name false`, and `--no_name`."""
    group.add_argument(*options(name), type=boolean, nargs="?", const=True, **keywords)
    _add_negative(group, name)


def _add_negative(group: argparse._ActionsContainer, name: str) -> None:
    """`--no_name`: the same as `--name false`."""
    group.add_argument(
        *options(f"no_{name}"), action="store_false", dest=name, default=argparse.SUPPRESS, help=f"--{name} false"
    )


def add_model_arguments(parser: argparse.ArgumentParser, *, task: str = "causal-lm", **defaults: object) -> None:
    """The `TurnerConfig` fields that make sense for `task` (a key of `MODEL_FLAGS_NOT_FOR`); `defaults` per script,
    the other flags default to TurnerConfig's own."""
    group = parser.add_argument_group(
        "model from scratch (as in turner_tfm.TurnerConfig; a flag left unset keeps the config's default)"
    )
    unknown = sorted(set(defaults) - set(MODEL_FLAGS))
    if unknown:
        raise TypeError(f"no such flag to set a default for: {unknown}")
    for name, spec in MODEL_FLAGS.items():
        if name in MODEL_FLAGS_NOT_FOR[task]:
            continue
        spec = {**spec, "default": defaults.get(name)}
        if spec.get("type") is boolean:
            add_switch(group, name, **{key: value for key, value in spec.items() if key != "type"})
        else:
            group.add_argument(*options(name), **spec)


def model_arguments(args: argparse.Namespace) -> dict[str, object]:
    """The `TurnerConfig` fields the model flags set (those left unset keep the config's defaults)."""
    return {name: getattr(args, name) for name in MODEL_FLAGS if getattr(args, name, None) is not None}


def add_fsdp_size(parser: argparse.ArgumentParser) -> None:
    """--fsdp_size, as in `transformers.DistributedConfig`: the model is sharded by transformers' own plan
    (`from_pretrained(distributed_config=...)`) over as many processes (torchrun)."""
    group = parser.add_argument_group("sharding (as in transformers.DistributedConfig)")
    group.add_argument(
        *options("fsdp_size"),
        type=positive_int,
        default=1,
        help="processes that each hold 1/N of every weight (FSDP2, with Turner's plan); start N with torchrun",
    )


def add_text_data_arguments(parser: argparse.ArgumentParser, default: str) -> None:
    """Where a language model's text comes from: a file, a `datasets` dataset, or the built-in `default` corpus."""
    group = parser.add_argument_group(f"text data (default: {default})")
    source = group.add_mutually_exclusive_group()
    source.add_argument(*options("train_file"), type=existing_file, help="a UTF-8 text file")
    source.add_argument(*options("dataset_name"), help="a `datasets` dataset: a Hub id or a local folder of data files")
    group.add_argument(*options("dataset_config_name"), help="the dataset's configuration, if it has several")
    group.add_argument(*options("dataset_split"), default="train", help="the split to read")
    group.add_argument(*options("text_column"), default="text", help="the dataset column that holds the text")
    group.add_argument(
        *options("validation_split_percentage"), type=percentage, default=5.0, help="held-out share of the text"
    )
    group.add_argument(*options("block_size"), type=positive_int, default=128, help="tokens per training sequence")


def add_sample_arguments(parser: argparse.ArgumentParser, prompt: str) -> None:
    """The sample a language-model script prints at the end."""
    group = parser.add_argument_group("sample")
    group.add_argument(*options("prompt"), default=prompt, help="start of the sample printed at the end")
    group.add_argument(*options("max_new_tokens"), type=positive_int, default=100, help="length of the sample")
