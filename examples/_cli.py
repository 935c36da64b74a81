"""Command-line pieces every example shares: the same flag names (as in `TrainingArguments` and `TurnerConfig`,
with dashes), argument types that reject bad values with a clear message, and nothing heavy to import.

The scripts parse their arguments with these before they import torch or transformers, so `--help` and a bad flag
answer at once.
"""

import argparse
import json
import os
import re
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

LR_SCHEDULERS = ("linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup")
POSITION_EMBEDDING_TYPES = ("learned", "sinusoidal", "rotary", "none")


def _number(kind: type, low: float, low_inclusive: bool, high: float | None = None) -> Callable[[str], float]:
    """An argparse type that parses `kind` and checks it lies in the range; the message says what is valid."""
    bound = f">= {low}" if low_inclusive else f"> {low}"
    valid = f"a number in [{low}, {high})" if high is not None else f"{'an integer' if kind is int else 'a number'}"
    valid = valid if high is not None else f"{valid} {bound}"

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


class _ShowDefaults(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each flag's default after its help, but not `None`: an unset flag's help says what happens."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        return action.help if action.default is None else super()._get_help_string(action)


def new_parser(description: str) -> argparse.ArgumentParser:
    """A parser that shows each flag's default in `--help`."""
    return argparse.ArgumentParser(description=description, formatter_class=_ShowDefaults)


# The `TrainingArguments` fields every training script exposes: the flag is the field's name with dashes, the value
# goes to `TrainingArguments` as it is (`_common.training_arguments`), and tests/test_example_flags.py checks each
# against `TrainingArguments` itself. Exposing one more field is one more entry: its argparse keywords.
TRAINING_FLAGS: dict[str, dict[str, object]] = {
    "output_dir": {"help": "where checkpoints, the model, tokenizer and card are saved"},
    "max_steps": {"type": int, "default": -1, "help": "optimiser steps; -1 trains for --num-train-epochs"},
    "num_train_epochs": {"type": positive_float, "default": 3.0},
    "learning_rate": {"type": positive_float, "default": 1e-3},
    "per_device_train_batch_size": {"type": positive_int, "default": 32},
    "per_device_eval_batch_size": {"type": positive_int, "default": 64},
    "gradient_accumulation_steps": {"type": positive_int, "default": 1},
    "warmup_steps": {
        "type": non_negative_float,
        "default": 0.05,
        "help": "warm-up steps, or a fraction of all steps if below 1",
    },
    "weight_decay": {"type": non_negative_float, "default": 0.01},
    "lr_scheduler_type": {"choices": LR_SCHEDULERS, "default": "cosine"},
    "logging_steps": {"type": positive_int, "default": 25},
    "eval_steps": {"type": positive_int, "default": None, "help": "evaluate every N steps (default: at the end)"},
    "save_steps": {"type": positive_int, "default": None, "help": "save a checkpoint every N steps (default: never)"},
    "save_total_limit": {"type": positive_int, "default": None, "help": "keep only the newest N checkpoints"},
    "resume_from_checkpoint": {
        "default": None,
        "metavar": "PATH|true|auto",
        "help": "continue a run from its checkpoint-N folder; `true`: from the newest complete one in --output-dir; "
        "`auto`: the same, or start afresh where there is none (one command for the first start and every restart, "
        "e.g. under torchrun --max-restarts)",
    },
    "seed": {"type": non_negative_int, "default": 42},
    "bf16": {"action": "store_true", "help": "bfloat16 mixed precision"},
    "torch_compile": {"action": "store_true", "help": "compile the model with torch.compile"},
    "use_cpu": {
        "action": "store_true",
        "help": "train on the CPU even if a GPU is there (automatic for several processes without a GPU)",
    },
    "ddp_timeout": {
        "type": positive_int,
        "default": 1800,
        "help": "seconds a process waits for the others in a collective before it gives up",
    },
    "report_to": {"default": "none", "help": "experiment tracker(s) for the Trainer, e.g. tensorboard"},
}

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
    "position_embedding_type": {"choices": POSITION_EMBEDDING_TYPES, "help": "§3; rotary: relative positions"},
    "position_embedding_combine": {"choices": ("add", "concat"), "help": "add positions, or concatenate them"},
    "position_embedding_size": {"type": positive_int, "help": "width of concatenated positions (default: D / 4)"},
    "rope_theta": {"type": positive_float, "help": "base of the rotary frequencies"},
    "share_query_key": {"action": argparse.BooleanOptionalAction, "help": "U_q = U_k (footnote 9)"},
    "normalization": {"choices": ("layernorm", "rmsnorm", "batchnorm"), "help": "layernorm is TokenNorm (§2.3)"},
    "norm_position": {"choices": ("pre", "post"), "help": "norm on the inputs of MHSA and MLP, or after the sum"},
    "layer_norm_eps": {"type": positive_float},
    "initializer_range": {"type": positive_float, "help": "standard deviation of the initial weights"},
    "attention_bias": {"action": argparse.BooleanOptionalAction},
    "mlp_bias": {"action": argparse.BooleanOptionalAction},
    "embedding_layer_norm": {"action": argparse.BooleanOptionalAction, "help": "a norm after the embeddings"},
    "tie_word_embeddings": {"action": argparse.BooleanOptionalAction, "help": "lm_head shares the input embedding"},
    "classifier_pooling": {"choices": ("cls", "mean", "last"), "help": "which token(s) the classifier reads"},
    "classifier_dropout": {"type": probability},
    "use_pooler": {"action": argparse.BooleanOptionalAction, "help": "a tanh layer on the pooled token (needs cls)"},
}
# The fields of `MODEL_FLAGS` that make no sense for a task, and why.
MODEL_FLAGS_NOT_FOR = {
    "causal-lm": ("classifier_pooling", "classifier_dropout", "use_pooler"),  # no classifier head
    "text-classification": ("tie_word_embeddings",),  # no language-model head to tie
    "image-classification": ("tie_word_embeddings", "embedding_layer_norm"),  # TurnerConfig refuses both for images
    # sentence-transformers pools the backbone's output itself: no head to tie, no classifier
    "sentence-embedding": ("tie_word_embeddings", "classifier_pooling", "classifier_dropout", "use_pooler"),
}


def _add_flags(group: argparse._ArgumentGroup, specs: dict[str, dict], names: list[str], defaults: dict) -> None:
    unknown = sorted(set(defaults) - set(names))
    if unknown:
        raise TypeError(f"no such flag to set a default for: {unknown}")
    for name in names:
        spec = {**specs[name], **({"default": defaults[name]} if name in defaults else {})}
        group.add_argument(_flag(name), **spec)


def add_training_arguments(parser: argparse.ArgumentParser, *, output_dir: str, **defaults: object) -> None:
    """Every flag of `TRAINING_FLAGS`, spelled as in `TrainingArguments` with dashes; `defaults` per script."""
    group = parser.add_argument_group("training (as in transformers.TrainingArguments)")
    _add_flags(group, TRAINING_FLAGS, list(TRAINING_FLAGS), {"output_dir": output_dir, **defaults})


# The `transformers.DistributedConfig` fields a training script exposes: the model is sharded by transformers' own plan
# (`from_pretrained(distributed_config=...)`), over as many processes (torchrun) as the sizes multiply to.
PARALLEL_FLAGS: dict[str, dict[str, object]] = {
    "fsdp_size": {
        "type": positive_int,
        "default": 1,
        "help": "processes that each hold 1/N of every weight (FSDP2, with Turner's plan); start N with torchrun",
    },
}


def add_parallel_arguments(parser: argparse.ArgumentParser) -> None:
    """Every flag of `PARALLEL_FLAGS`, spelled as in `DistributedConfig` with dashes."""
    group = parser.add_argument_group("sharding (as in transformers.DistributedConfig)")
    _add_flags(group, PARALLEL_FLAGS, list(PARALLEL_FLAGS), {})


def add_model_arguments(parser: argparse.ArgumentParser, *, task: str = "causal-lm", **defaults: object) -> None:
    """The `TurnerConfig` fields that make sense for `task` (a key of `MODEL_FLAGS_NOT_FOR`); `defaults` per script,
    the other flags default to TurnerConfig's own."""
    group = parser.add_argument_group(
        "model from scratch (as in turner_tfm.TurnerConfig; a flag left unset keeps the config's default)"
    )
    _add_flags(group, MODEL_FLAGS, [name for name in MODEL_FLAGS if name not in MODEL_FLAGS_NOT_FOR[task]], defaults)


def run_script(
    parser: argparse.ArgumentParser,
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
    args = parser.parse_args(argv)
    check_arguments(parser, args)
    if getattr(args, "model_name_or_path", None) is not None:
        check_model_path(parser, "--model-name-or-path", args.model_name_or_path, model_hint)
    for flag, needed in (requires or {}).items():
        if getattr(args, flag) is not None and getattr(args, needed) is None:
            parser.error(f"argument {_flag(flag)}: it needs {_flag(needed)} (the built-in data makes its own split)")
    finished = False
    try:
        run(args)
        finished = True
    except UsageError as error:
        parser.error(str(error))
    finally:
        _leave_process_group(wait_for_the_others=finished)


def _leave_process_group(wait_for_the_others: bool) -> None:
    """Under `accelerate launch`, close the group: a process that exits while gloo's threads still run aborts
    ("terminate called without an active exception") and fails the whole launch. After a success every process waits
    for the others first; after a failure none does (the others may be inside a collective that will never finish),
    so this process exits at once and the launcher stops the rest, naming the failed one."""
    torch_module = sys.modules.get("torch")
    if torch_module is None or not torch_module.distributed.is_available():
        return
    if torch_module.distributed.is_initialized():
        if wait_for_the_others:
            torch_module.distributed.barrier()
        torch_module.distributed.destroy_process_group()


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Checks that span several flags; a failure exits with a message naming the flags, values and what is valid."""
    max_steps = getattr(args, "max_steps", -1)
    if max_steps == 0 or max_steps < -1:
        parser.error(f"argument --max-steps: {max_steps} is not valid: expected an integer >= 1, or -1")
    hidden, heads = getattr(args, "hidden_size", None), getattr(args, "num_attention_heads", None)
    if hidden is not None and heads is not None and hidden % heads:
        parser.error(
            f"argument --hidden-size: {hidden} is not valid: it must be divisible by --num-attention-heads {heads}"
        )
    image, patch = getattr(args, "image_size", None), getattr(args, "patch_size", None)
    if image is not None and patch is not None and image % patch:
        parser.error(f"argument --patch-size: {patch} is not valid: it must divide --image-size {image}")
    if getattr(args, "resume_from_checkpoint", None) is not None:
        args.resume_from_checkpoint = _checkpoint_to_resume(parser, args.resume_from_checkpoint, args.output_dir)
    world_size, fsdp_size = int(os.environ.get("WORLD_SIZE", "1")), getattr(args, "fsdp_size", 1)
    if fsdp_size > 1 and fsdp_size != world_size:
        parser.error(
            f"argument --fsdp-size: {fsdp_size} is not valid: it must equal the number of processes, {world_size} "
            f"(start {fsdp_size} with: torchrun --nproc_per_node {fsdp_size} {parser.prog} ...)"
        )
    if fsdp_size > 1 and getattr(args, "save_steps", None) is not None:
        parser.error(
            f"argument --save-steps: {args.save_steps} is not valid with --fsdp-size {fsdp_size}: transformers cannot "
            "save the optimiser of a model sharded at load time, so no checkpoint could be resumed from; leave "
            "--save-steps out (the trained model is saved at the end all the same)"
        )


def complete_checkpoints(output_dir: str | os.PathLike) -> list[Path]:
    """The Trainer's checkpoint-N folders in `output_dir` whose save finished, oldest first.

    The Trainer writes trainer_state.json last (after the weights, optimiser, scheduler and RNG states), so a folder
    without a readable one is a save that was cut short: it is never resumed from. The main process writes that file
    without waiting for the others, so where it records that several processes saved (`_common.RecordProcesses`),
    each of their RNG states must be there and whole too.
    """
    folder = Path(output_dir)
    found = [path for path in folder.iterdir() if _CHECKPOINT.match(path.name)] if folder.is_dir() else []
    return sorted((path for path in found if _is_complete(path)), key=lambda path: int(path.name.split("-")[1]))


_CHECKPOINT = re.compile(r"^checkpoint-\d+$")  # as transformers.trainer_utils names them


def _is_complete(checkpoint: Path) -> bool:
    try:
        state = json.loads((checkpoint / "trainer_state.json").read_text())
    except (OSError, ValueError):
        return False
    processes = saved_by_processes(state)
    if processes == 1:
        return True
    # torch.save writes a zip archive, its directory last: a file cut short is no zip
    return all(zipfile.is_zipfile(checkpoint / f"rng_state_{rank}.pth") for rank in range(processes))


PROCESSES_KEY = "RecordProcesses"  # where trainer_state.json's `stateful_callbacks` records the processes that saved


def saved_by_processes(trainer_state: dict) -> int:
    """How many processes saved the checkpoint whose trainer_state.json is `trainer_state` (1 when not recorded)."""
    record = trainer_state.get("stateful_callbacks", {}).get(PROCESSES_KEY, {})
    return int(record.get("attributes", {}).get("processes", 1))


def _checkpoint_to_resume(parser: argparse.ArgumentParser, value: str, output_dir: str) -> str | None:
    """--resume-from-checkpoint as a folder: `true` is the newest complete checkpoint in --output-dir, `auto` the same
    or None (start afresh) where there is none."""
    checkpoints = complete_checkpoints(output_dir)
    newest = f"; the newest complete one in --output-dir is {str(checkpoints[-1])!r}" if checkpoints else ""
    if value.lower() == "auto":
        if checkpoints:
            return str(checkpoints[-1])
        if int(os.environ.get("RANK", "0")) == 0:  # said once, however many processes run the script
            print(f"no complete checkpoint-N folder in --output-dir {output_dir!r}: starting afresh", flush=True)
        return None
    if value.lower() == "true":
        if not checkpoints:
            parser.error(
                f"argument --resume-from-checkpoint: 'true' is not valid: no complete checkpoint-N folder in "
                f"--output-dir {output_dir!r} (leave the flag out to start afresh, or use `auto` to resume when there "
                "is one and start afresh when not)"
            )
        return str(checkpoints[-1])
    if not _is_complete(Path(value)):
        parser.error(
            f"argument --resume-from-checkpoint: {value!r} is not valid: not a complete checkpoint (no readable "
            f"trainer_state.json: the save was cut short, or it is no checkpoint-N folder){newest}"
        )
    return value


class UsageError(ValueError):
    """Bad input found once the data is read (a missing column, an empty folder); the script reports it like a bad
    flag: usage, then the message, exit status 2."""


def check_model_path(parser: argparse.ArgumentParser, flag: str, path: str | None, hint: str = "") -> None:
    """A checkpoint named on the command line must be a saved model folder, unless it looks like a Hub repo id."""
    if path is None:
        return
    looks_like_repo_id = path.count("/") == 1 and not path.startswith((".", "/", "~")) and not os.path.exists(path)
    if not looks_like_repo_id and not os.path.isfile(os.path.join(path, "config.json")):
        parser.error(
            f"argument {flag}: {path!r} is not valid: no saved model folder (with a config.json) there. {hint}"
        )


def add_padding_free_argument(parser: argparse.ArgumentParser, sequences: str) -> None:
    """--padding-free: each batch's `sequences` packed end to end in one row (`_padding_free`), no padding."""
    parser.add_argument(
        "--padding-free",
        action="store_true",
        help=f"train on {sequences} packed in one row per batch (DataCollatorWithFlattening), without padding",
    )


def add_text_data_arguments(parser: argparse.ArgumentParser, default: str) -> None:
    """Where a language model's text comes from: a file, a `datasets` dataset, or the built-in `default` corpus."""
    group = parser.add_argument_group(f"text data (default: {default})")
    source = group.add_mutually_exclusive_group()
    source.add_argument("--train-file", type=existing_file, default=None, help="a UTF-8 text file")
    source.add_argument(
        "--dataset-name", default=None, help="a `datasets` dataset: a Hub id or a local folder of data files"
    )
    group.add_argument("--dataset-config-name", default=None, help="the dataset's configuration, if it has several")
    group.add_argument("--dataset-split", default="train", help="the split to read")
    group.add_argument("--text-column", default="text", help="the dataset column that holds the text")
    group.add_argument("--validation-split-percentage", type=percentage, default=5.0, help="held-out share of the text")
    group.add_argument("--block-size", type=positive_int, default=128, help="tokens per training sequence")


def add_sample_arguments(parser: argparse.ArgumentParser, prompt: str) -> None:
    """The sample a language-model script prints at the end."""
    group = parser.add_argument_group("sample")
    group.add_argument("--prompt", default=prompt, help="start of the sample printed at the end")
    group.add_argument("--max-new-tokens", type=positive_int, default=100, help="length of the sample")


def add_classification_data_arguments(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """The held-out split every classifier script shares; returns the group for the script's own data flags."""
    group = parser.add_argument_group("data")
    group.add_argument(
        "--test-split-percentage",
        type=percentage,
        default=20.0,
        help="share of the data held out for the test accuracy, when no separate test data is given",
    )
    return group
