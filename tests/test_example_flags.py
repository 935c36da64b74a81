"""The example scripts' flags checked against what they stand for: every training script takes every field of
`TrainingArguments`, spelled and parsed as transformers' own `HfArgumentParser(TrainingArguments)` spells and parses
it, and `TrainingArguments` accepts what they pass on; each model flag is a `TurnerConfig` field with the config's own
choices; an arguments file means what its flags mean. A new field or choice upstream fails here until the scripts
have it (or say why not: `SET_BY_THE_SCRIPT` here, `flags.MODEL_FLAGS_NOT_FOR`)."""

import enum
import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import HfArgumentParser, TrainingArguments

from examples.helpers import flags
from turner_tfm import TurnerConfig, configuration_turner

from .workflow_utils import EXAMPLES, run_example, script_flags

TRAINING_SCRIPTS = (
    *("finetune_lora", "quickstart", "sentence_embeddings"),
    *("train_causal_lm", "train_image_classifier", "train_text_classifier"),
)
# the script that trains a model from scratch -> its task
SCRATCH_TASKS = {
    "quickstart": "causal-lm",
    "train_causal_lm": "causal-lm",
    "train_text_classifier": "text-classification",
    "train_image_classifier": "image-classification",
    "sentence_embeddings": "sentence-embedding",
}
# TurnerConfig fields no model flag sets: the script derives them from its data or task, or they concern inference
SET_BY_THE_SCRIPT = {
    *("vocab_size", "pad_token_id", "bos_token_id", "eos_token_id", "max_position_embeddings", "is_causal"),
    *("image_size", "patch_size", "num_channels"),  # the image script's own data flags, or fixed (RGB)
    "type_vocab_size",  # token types (BERT's segments): no script feeds token_type_ids
    "use_cache",  # generation, not training
}
# Where the scripts' parser differs from HfArgumentParser(TrainingArguments) on purpose, read from the source before
# transformers loads: choices and defaults transformers computes as it loads (its log levels; the optimiser, from
# the torch version) are left to TrainingArguments.
UNREAD_CHOICES = {"log_level", "log_level_replica"}
UNREAD_DEFAULTS = {"optim"}


@functools.cache
def hf_parser() -> HfArgumentParser:
    return HfArgumentParser(TrainingArguments)


def by_field(actions: list[dict] | list) -> dict[str, set[str]]:
    """{field: every option string that sets it} (a switch on by default has a `--no_` form too)."""
    options: dict[str, set[str]] = {}
    for action in actions:
        if not isinstance(action, dict):  # an argparse action
            action = {"dest": action.dest, "options": action.option_strings}
        options.setdefault(action["dest"], set()).update(action["options"])
    return options


def plain(value: object) -> object:
    """An Enum member as its value, inside lists too."""
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value.value if isinstance(value, enum.Enum) else value


@pytest.mark.parametrize("script", TRAINING_SCRIPTS)
def test_every_training_script_takes_every_training_arguments_field_by_its_hf_argument_parser_names(script):
    expected = by_field([a for a in hf_parser()._actions if a.dest != "help"])
    assert by_field(script_flags(script)["training"]) == expected
    help_text = run_example(f"{script}.py", "--help", tmp_path=Path.cwd())  # the dashed spellings of today's commands
    for flag in ("--output-dir", "--max-steps", "--learning-rate", "--eval-strategy", "--push-to-hub", "--bf16"):
        assert flag in help_text, (script, flag)


def test_the_training_flags_are_hf_argument_parsers_own_read_without_importing_transformers():
    real = {a.dest: a for a in hf_parser()._actions if a.dest != "help" and not a.option_strings[0].startswith("--no_")}
    read = flags.training_flags()
    assert set(read) == set(real)
    for name, action in real.items():
        keywords = read[name]
        assert keywords["options"] == action.option_strings
        assert (keywords.get("nargs"), keywords.get("const")) == (action.nargs, action.const), name
        if name not in UNREAD_CHOICES | {"debug"}:  # debug: its choices (the real one converts to DebugOption)
            assert keywords.get("choices") == (list(action.choices) if action.choices else None), name
        if name not in UNREAD_DEFAULTS:
            assert plain(keywords.get("default")) == plain(action.default), name
    assert read["log_level"].get("choices") is None and read["optim"]["default"] is None

    # the same command line gives the same values
    argv = ["--bf16", "--use_cpu", "--fp16", "false", "--no_dataloader_pin_memory", "--activation_checkpointing"]
    argv += ["--eval_strategy", "epoch", "--lr-scheduler-type", "cosine", "--label_names", "a", "b"]
    argv += ["--max_grad_norm", "0.5", "--dataloader_num_workers", "2", "--include_num_input_tokens_seen", "true"]
    argv += ["--hub_model_id", "me/x", "--optim", "sgd", "--disable_tqdm", "true", "--fsdp", "full_shard"]
    argv += ["--save_total_limit", "3", "--seed", "7", "--debug", "underflow_overflow", "--log_level", "info"]
    argv += ["--lr_scheduler_kwargs", '{"num_cycles": 2}']
    expected = vars(hf_parser().parse_args(argv))
    args = flags.parse(flags.training_parser("", output_dir="out"), argv)
    names = {token[2:].replace("-", "_").removeprefix("no_") for token in argv if token.startswith("--")}
    given = {name: plain(args.training_arguments[name]) for name in names}
    assert given.pop("lr_scheduler_kwargs") == json.loads(expected["lr_scheduler_kwargs"])  # a dict: read as JSON
    assert given == {name: plain(expected[name]) for name in given}

    built = TrainingArguments(**flags.training_arguments(args))  # it takes every value as the flags hand it on
    assert built.max_grad_norm == 0.5 and built.lr_scheduler_kwargs == {"num_cycles": 2} and built.optim == "sgd"
    assert built.label_names == ["a", "b"] and not built.dataloader_pin_memory and built.bf16 and built.seed == 7
    assert built.learning_rate == flags.TRAINING_DEFAULTS["learning_rate"]  # the scripts' default, not transformers'


@pytest.mark.parametrize("script", sorted(SCRATCH_TASKS))
def test_model_flags_are_every_turner_config_field_that_makes_sense_for_the_task(script: str) -> None:
    model = next(actions for title, actions in script_flags(script).items() if title == "model")
    fields = set(TurnerConfig.__annotations__)
    expected = fields - SET_BY_THE_SCRIPT - set(flags.MODEL_FLAGS_NOT_FOR[SCRATCH_TASKS[script]])
    options = by_field(model)
    assert set(options) == expected, f"missing {expected - set(options)}, not config fields {set(options) - expected}"
    for action in model:
        name = action["dest"]
        if action["options"][0].startswith("--no_"):
            continue
        assert action["options"][:1] == ["--" + name]
        if "_" in name:
            assert "--" + name.replace("_", "-") in action["options"]  # the spelling of today's commands
        if name in configuration_turner._CHOICES:
            assert tuple(action["choices"]) == configuration_turner._CHOICES[name], name
        if name in configuration_turner._BOOLS:  # `--x`, `--x false`, `--no_x`, `--no-x`
            assert action["nargs"] == "?" and action["const"] is True, name
            assert {f"--no_{name}", f"--no-{name.replace('_', '-')}"} <= options[name], name
    assert "rotary" in next(a for a in model if a["dest"] == "position_embedding_type")["choices"]


def causal_lm_parser() -> flags.ScriptParser:
    parser = flags.training_parser("", output_dir="out", max_steps=300)
    flags.add_model_arguments(parser, hidden_size=128, num_hidden_layers=4, num_attention_heads=4)
    return parser


def test_unset_model_flags_keep_the_config_defaults_and_set_ones_reach_the_config() -> None:
    config = TurnerConfig(vocab_size=50, **flags.model_arguments(flags.parse(causal_lm_parser(), [])))
    assert config.position_embedding_type == "learned" and config.attention_bias and not config.share_query_key
    argv = ["--position-embedding-type", "rotary", "--rope-theta", "500", "--share-query-key", "--no-mlp-bias"]
    args = flags.parse(causal_lm_parser(), [*argv, "--normalization", "rmsnorm", "--attention_bias", "false"])
    config = TurnerConfig(vocab_size=50, **flags.model_arguments(args))
    assert (config.position_embedding_type, config.rope_theta, config.normalization) == ("rotary", 500, "rmsnorm")
    assert config.share_query_key and not config.mlp_bias and not config.attention_bias and config.hidden_size == 128
    contradictory = ["--position-embedding-combine", "concat", "--tie-word-embeddings"]
    with (
        pytest.raises(flags.UsageError, match=r"the model flags make no valid model: .*tie_word_embeddings"),
        flags.usage_error("the model flags make no valid model"),
    ):
        TurnerConfig(vocab_size=50, **flags.model_arguments(flags.parse(causal_lm_parser(), contradictory)))


def test_an_arguments_file_means_what_its_flags_mean_and_flags_after_it_win(tmp_path: Path) -> None:
    values = {
        "learning_rate": 0.01,
        "bf16": True,
        "dataloader_pin_memory": False,
        "label_names": ["a", "b"],
        "lr_scheduler_kwargs": {"num_cycles": 2},
        "eval_strategy": "steps",
        "share_query_key": False,
        "hidden-size": 64,  # dashes too, as on the command line
    }
    argv = ["--learning_rate", "0.01", "--bf16", "--no_dataloader_pin_memory", "--label_names", "a", "b"]
    argv += ["--lr_scheduler_kwargs", '{"num_cycles": 2}', "--eval_strategy", "steps", "--no_share_query_key"]
    from_flags = flags.parse(causal_lm_parser(), [*argv, "--hidden-size", "64"])
    (tmp_path / "args.json").write_text(json.dumps(values))
    (tmp_path / "args.yaml").write_text("\n".join(f"{key}: {json.dumps(value)}" for key, value in values.items()))
    for name in ("args.json", "args.yaml"):
        from_file = flags.parse(causal_lm_parser(), [str(tmp_path / name)])
        assert from_file.training_arguments == from_flags.training_arguments
        assert (
            flags.model_arguments(from_file)
            == flags.model_arguments(from_flags)
            == {
                "hidden_size": 64,
                "num_hidden_layers": 4,
                "num_attention_heads": 4,
                "share_query_key": False,
            }
        )
    overridden = flags.parse(causal_lm_parser(), [str(tmp_path / "args.yaml"), "--learning-rate", "0.5"])
    assert overridden.training_arguments["learning_rate"] == 0.5 and overridden.training_arguments["bf16"]


def test_a_bad_value_in_a_file_or_a_field_the_script_sets_itself_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "args.json").write_text(json.dumps({"learning_rate": -2, "hidden_size": 64}))
    output = run_example("quickstart.py", str(tmp_path / "args.json"), tmp_path=tmp_path, expect_failure=True)
    assert f"argument learning_rate in {tmp_path / 'args.json'}: '-2' is not valid: expected a number > 0.0" in output
    cases = {
        ("train_image_classifier.py", "--remove-unused-columns", "true"): "argument --remove-unused-columns: refused "
        "by this script: the images become pixels on the fly",
        ("sentence_embeddings.py", "--eval_steps", "10"): "argument --eval_steps: refused by this script: this script "
        "measures retrieval itself",
        ("quickstart.py", "--do_train"): "argument --do_train: refused by this script: this script always trains",
        ("quickstart.py", "--parallelism_config", "x"): "argument --parallelism_config: refused by this script: a "
        "ParallelismConfig object",
        ("quickstart.py", "--lr_scheduler_kwargs", "2"): "argument --lr_scheduler_kwargs: '2' is not valid: expected a "
        "JSON object",
        ("quickstart.py", "--eval-strategy", "sometimes"): "argument --eval-strategy: invalid choice: 'sometimes'",
        # choices transformers computes as it loads: checked once it has, before any data is read
        ("quickstart.py", "--log_level", "loud"): "argument --log_level: 'loud' is not valid: choose one of detail",
    }
    for (script, *argv), message in cases.items():
        output = run_example(script, *argv, tmp_path=tmp_path, expect_failure=True)
        assert message in output and "Traceback" not in output, output[-2000:]


@pytest.mark.parametrize("argv", [["--help"], ["--learning_rate", "-1"], ["--bf16", "maybe"]])
def test_help_and_a_bad_flag_answer_before_torch_loads(argv: list[str]) -> None:
    """As a user runs it, in the examples folder; `atexit` reports what was imported when the script stopped."""
    code = (
        "import atexit, runpy, sys\n"
        "atexit.register(lambda: print('torch imported:', 'torch' in sys.modules))\n"
        f"sys.argv = ['train_causal_lm.py', *{argv!r}]\n"
        "runpy.run_path('train_causal_lm.py', run_name='__main__')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=EXAMPLES, capture_output=True, text=True, timeout=120)
    assert result.returncode == (0 if argv == ["--help"] else 2), result.stderr[-2000:]
    assert "torch imported: False" in result.stdout
