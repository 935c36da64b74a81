"""The example scripts' flags checked against what they stand for: each training flag is a `TrainingArguments` field
spelled the same and accepted by it, each model flag a `TurnerConfig` field with the config's own choices, and every
script has the flags users reach for. A new config choice or field fails here until the scripts expose it (or say
why not: `SET_BY_THE_SCRIPT` here, `_cli.MODEL_FLAGS_NOT_FOR`)."""

import argparse
import dataclasses

import pytest
from transformers import TrainingArguments
from transformers.trainer_utils import SchedulerType

from turner_tfm import TurnerConfig, configuration_turner

from .workflow_utils import import_example

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
EXPECTED_TRAINING_FLAGS = {
    *("output_dir", "max_steps", "num_train_epochs", "learning_rate", "per_device_train_batch_size", "seed"),
    *("lr_scheduler_type", "warmup_steps", "weight_decay", "logging_steps", "eval_steps", "save_steps"),
    *("bf16", "torch_compile", "save_total_limit", "resume_from_checkpoint", "use_cpu", "report_to"),
}
# TurnerConfig fields no model flag sets: the script derives them from its data or task, or they concern inference
SET_BY_THE_SCRIPT = {
    *("vocab_size", "pad_token_id", "bos_token_id", "eos_token_id", "max_position_embeddings", "is_causal"),
    *("image_size", "patch_size", "num_channels"),  # the image script's own data flags, or fixed (RGB)
    "type_vocab_size",  # token types (BERT's segments): no script feeds token_type_ids
    "use_cache",  # generation, not training
}


def groups(script: str) -> dict[str, dict[str, argparse.Action]]:
    """{group title's first word: {dest: action}} of the script's parser."""
    parser = import_example(script).build_parser()
    return {
        group.title.split()[0]: {action.dest: action for action in group._group_actions}
        for group in parser._action_groups
    }


@pytest.mark.parametrize("script", TRAINING_SCRIPTS)
def test_training_flags_are_training_arguments_fields_with_their_names(script: str) -> None:
    training = groups(script)["training"]
    assert set(training) >= EXPECTED_TRAINING_FLAGS, EXPECTED_TRAINING_FLAGS - set(training)
    fields = {field.name: field for field in dataclasses.fields(TrainingArguments)}
    for name, action in training.items():
        assert name in fields, f"--{name} is no TrainingArguments field"
        assert action.option_strings == ["--" + name.replace("_", "-")]
        if fields[name].type is bool:
            assert action.nargs == 0 and action.default is False, name  # a switch, off unless given
    assert set(training["lr_scheduler_type"].choices) <= {scheduler.value for scheduler in SchedulerType}

    _common = import_example("_common")
    flags = ["--bf16", "--use-cpu", "--torch-compile", "--save-total-limit", "2"]
    args = import_example(script).build_parser().parse_args(flags)
    built = _common.training_arguments(args)  # TrainingArguments accepts every flag's value as it is
    assert built.bf16 and built.torch_compile and built.save_total_limit == 2
    assert built.learning_rate == args.learning_rate and built.seed == args.seed


@pytest.mark.parametrize("script", sorted(SCRATCH_TASKS))
def test_model_flags_are_every_turner_config_field_that_makes_sense_for_the_task(script: str) -> None:
    model = next(actions for title, actions in groups(script).items() if title == "model")
    fields = set(TurnerConfig.__annotations__)
    expected = fields - SET_BY_THE_SCRIPT - set(import_example("_cli").MODEL_FLAGS_NOT_FOR[SCRATCH_TASKS[script]])
    assert set(model) == expected, f"missing {expected - set(model)}, not config fields {set(model) - expected}"
    for name, action in model.items():
        assert action.option_strings[0] == "--" + name.replace("_", "-")
        if name in configuration_turner._CHOICES:
            assert tuple(action.choices) == configuration_turner._CHOICES[name], name
        if name in configuration_turner._BOOLS:
            assert isinstance(action, argparse.BooleanOptionalAction), name
    assert "rotary" in model["position_embedding_type"].choices


def test_unset_model_flags_keep_the_config_defaults_and_set_ones_reach_the_config() -> None:
    _common = import_example("_common")
    parser = import_example("train_causal_lm").build_parser()
    config = _common.turner_config(parser.parse_args([]), vocab_size=50)
    assert config.position_embedding_type == "learned" and config.attention_bias and not config.share_query_key
    flags = ["--position-embedding-type", "rotary", "--rope-theta", "500", "--share-query-key", "--no-mlp-bias"]
    config = _common.turner_config(parser.parse_args([*flags, "--normalization", "rmsnorm"]), vocab_size=50)
    assert (config.position_embedding_type, config.rope_theta, config.normalization) == ("rotary", 500, "rmsnorm")
    assert config.share_query_key and not config.mlp_bias and config.hidden_size == 128  # the script's default
    concat_and_tied = ["--position-embedding-combine", "concat", "--tie-word-embeddings"]  # contradictory
    with pytest.raises(_common.UsageError, match=r"the model flags make no valid model: .*tie_word_embeddings"):
        _common.turner_config(parser.parse_args(concat_and_tied), vocab_size=50)
