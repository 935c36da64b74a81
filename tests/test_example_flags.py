"""The training scripts' arguments: `HfArgumentParser` over each script's dataclasses, with every field `TurnerConfig`
declares as a model flag (its choices and default read from the config class); a JSON or YAML file means what its
flags mean; a bad value or combination stops with the usage and a message naming the flag."""

import dataclasses
import importlib
import json
import typing
from pathlib import Path

import pytest
from transformers import HfArgumentParser, PreTrainedConfig, TrainingArguments

from examples.helpers import training
from turner_tfm import TurnerConfig

# the script that trains a model from scratch -> the TurnerConfig fields it leaves out (no such head, or set by data)
SCRATCH_SCRIPTS = {
    "quickstart": set(training.CLASSIFIER_FIELDS),
    "train_causal_lm": set(training.CLASSIFIER_FIELDS),
    "train_masked_lm": set(training.CLASSIFIER_FIELDS),
    "train_text_classifier": {"tie_word_embeddings"},
    "train_image_classifier": {"tie_word_embeddings", "embedding_layer_norm"},
    "sentence_embeddings": {"tie_word_embeddings", *training.CLASSIFIER_FIELDS},
    "train_token_classifier": {"tie_word_embeddings", "classifier_pooling", "use_pooler"},
    "train_question_answering": {"tie_word_embeddings", *training.CLASSIFIER_FIELDS},
}


@pytest.mark.parametrize("script", sorted(SCRATCH_SCRIPTS))
def test_every_turner_config_field_that_fits_the_task_is_a_flag_with_the_configs_choices(script: str) -> None:
    module = importlib.import_module(f"examples.{script}")
    script_fields = {field.name for field in dataclasses.fields(module.ModelArguments.__mro__[1])}  # its own
    config_fields = {field.name: field for field in dataclasses.fields(TurnerConfig)}
    expected = {field.name for field in dataclasses.fields(module.ModelArguments)} - script_fields
    inherited = {field.name for field in dataclasses.fields(PreTrainedConfig)} - {"tie_word_embeddings"}
    wanted = set(config_fields) - inherited - training.SET_FROM_DATA - SCRATCH_SCRIPTS[script]
    if script == "train_image_classifier":
        wanted |= {"image_size", "patch_size"}
    assert expected == wanted, f"missing {wanted - expected}, not wanted {expected - wanted}"

    parser = HfArgumentParser(module.ModelArguments)
    actions = {action.dest: action for action in parser._actions if not action.option_strings[0].startswith("--no_")}
    for name in wanted:
        kind = config_fields[name].type
        literal = next((a for a in (kind, *typing.get_args(kind)) if typing.get_origin(a) is typing.Literal), None)
        if literal is not None:
            assert tuple(actions[name].choices) == typing.get_args(literal), name
        assert f"--{name.replace('_', '-')}" in actions[name].option_strings  # the dashed spelling too
    assert "rotary" in actions["position_embedding_type"].choices
    defaults = parser.parse_args_into_dataclasses([])[0]
    assert defaults.normalization == TurnerConfig().normalization and defaults.hidden_size != TurnerConfig().hidden_size


def causal_lm_arguments(argv: list[str]) -> tuple:
    module = importlib.import_module("examples.train_causal_lm")
    types = (module.ModelArguments, module.DataTrainingArguments, TrainingArguments)
    return training.parse_arguments(types, argv, output_dir="out", max_steps=300, per_device_train_batch_size=16)


def test_flags_in_both_spellings_reach_the_config_and_unset_ones_keep_its_defaults() -> None:
    model_args, _, _ = causal_lm_arguments([])
    config = TurnerConfig(vocab_size=50, **model_args.config_kwargs())
    assert config.position_embedding_type == "learned" and config.attention_bias and not config.share_query_key
    argv = ["--position-embedding-type", "rotary", "--rope_theta", "500", "--share-query-key", "--no-mlp-bias"]
    model_args, _, training_args = causal_lm_arguments([*argv, "--normalization", "rmsnorm", "--max-steps", "7"])
    config = TurnerConfig(vocab_size=50, **model_args.config_kwargs())
    assert (config.position_embedding_type, config.rope_theta, config.normalization) == ("rotary", 500, "rmsnorm")
    assert config.share_query_key and not config.mlp_bias and config.hidden_size == 128
    assert training_args.max_steps == 7 and training_args.learning_rate == training.TRAINING_DEFAULTS["learning_rate"]
    assert training_args.per_device_train_batch_size == 16  # the script's default over the common one
    assert (training_args.eval_strategy, training_args.save_strategy) == ("no", "no")  # without --eval/save_steps
    _, _, training_args = causal_lm_arguments(["--save_steps", "8", "--eval-steps", "4"])
    assert (training_args.eval_strategy, training_args.save_strategy, training_args.save_steps) == ("steps", "steps", 8)


def test_a_json_or_yaml_file_means_what_its_flags_mean_and_flags_after_it_win(tmp_path: Path) -> None:
    values = {
        "learning_rate": 0.01,
        "disable_tqdm": True,
        "label_names": ["a", "b"],
        "lr_scheduler_kwargs": {"num_cycles": 2},
        "eval_strategy": "steps",
        "share_query_key": True,
        "hidden_size": 64,
        "block_size": 32,
    }
    argv = [
        "--learning_rate",
        "0.01",
        "--disable_tqdm",
        "true",
        "--label_names",
        "a",
        "b",
        "--lr_scheduler_kwargs",
        '{"num_cycles": 2}',
    ]
    argv += ["--eval_strategy", "steps", "--share_query_key", "--hidden_size", "64", "--block_size", "32"]
    from_flags = causal_lm_arguments(argv)
    (tmp_path / "args.json").write_text(json.dumps(values))
    (tmp_path / "args.yaml").write_text("\n".join(f"{key}: {json.dumps(value)}" for key, value in values.items()))
    for name in ("args.json", "args.yaml"):
        from_file = causal_lm_arguments([str(tmp_path / name)])
        assert from_file[:2] == from_flags[:2]
        assert from_file[2].to_dict() == from_flags[2].to_dict()
        assert from_file[2].lr_scheduler_kwargs == {"num_cycles": 2} and from_file[2].disable_tqdm
    overridden = causal_lm_arguments([str(tmp_path / "args.yaml"), "--learning-rate", "0.5"])
    assert overridden[2].learning_rate == 0.5 and overridden[2].disable_tqdm


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--position-embedding-type", "rope"],
            "argument --position_embedding_type/--position-embedding-type: invalid",
        ),
        (["--hidden_size", "30"], "`hidden_size`=30 is invalid; it must be divisible by num_attention_heads=4"),
        (["--lr_scheduler_type", "sometimes"], "argument --lr_scheduler_type/--lr-scheduler-type: invalid choice"),
        (["--no-such-flag", "1"], "Some specified arguments are not used by the HfArgumentParser: ['--no-such-flag'"),
        (["--resume_from_checkpoint", "true"], "--resume_from_checkpoint 'true' is not valid: no complete checkpoint"),
    ],
)
def test_a_bad_value_or_combination_stops_with_the_usage_naming_the_flag(argv, message, capsys, tmp_path) -> None:
    with pytest.raises(SystemExit) as stopped:
        causal_lm_arguments([*argv, "--output_dir", str(tmp_path / "out")])
    assert stopped.value.code == 2
    error = capsys.readouterr().err
    assert error.startswith("usage: ") and message in error, error[-2000:]


def test_the_quickstart_refuses_a_bad_value_in_one_line(capsys, monkeypatch) -> None:
    from examples import quickstart

    monkeypatch.setattr("sys.argv", ["quickstart.py", "--hidden-size", "30"])
    with pytest.raises(SystemExit) as stopped:
        quickstart.main()
    assert stopped.value.code == 2
    said = capsys.readouterr().err
    assert said == (
        "quickstart.py: error: TurnerConfig: `hidden_size`=30 is invalid; it must be divisible by "
        "num_attention_heads=4, or set head_dim.\n"
    )
    page = (Path(__file__).resolve().parents[1] / "docs" / "workflows.md").read_text()
    assert f"python -m examples.quickstart --hidden-size 30\n# {said}" in page, "docs/workflows.md shows another error"


def test_a_bad_value_in_a_file_is_refused_by_name(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "args.yaml").write_text("normalization: tokennorm\nhidden_size: 64\n")
    with pytest.raises(SystemExit):
        causal_lm_arguments([str(tmp_path / "args.yaml")])
    assert "`normalization`" in capsys.readouterr().err
