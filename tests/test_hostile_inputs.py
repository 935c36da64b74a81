"""Hostile and broken inputs: clear errors naming the argument, finite numbers, nothing valid silently changed."""

import ast
import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers.testing_utils import CaptureLogger, set_config_for_less_flaky_test
from transformers.utils import logging

import turner_tfm
from turner_tfm import (
    TurnerConfig,
    TurnerForCausalLM,
    TurnerForImageClassification,
    TurnerForSequenceClassification,
    TurnerModel,
)
from turner_tfm.checks_turner import check_text_call
from turner_tfm.compat_turner import output_cache

from .tiny import image_config, random_ids, text_config


@pytest.fixture(scope="module")
def causal_lm() -> TurnerForCausalLM:
    return TurnerForCausalLM(text_config()).eval()


@pytest.fixture(scope="module")
def image_classifier() -> TurnerForImageClassification:
    return TurnerForImageClassification(image_config()).eval()


# --- config -----------------------------------------------------------------------------------------------------


def test_config_from_a_newer_version_loads_with_a_warning(tmp_path):
    text_config().save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**saved, "quantum_attention": True}))
    logger = logging.get_logger("turner_tfm.configuration_turner")
    with CaptureLogger(logger) as captured:
        config = TurnerConfig.from_pretrained(tmp_path)
    assert "unknown fields ['quantum_attention'] are kept in the config but no Turner model reads them" in captured.out
    assert config.hidden_size == 32


OTHER_FAMILIES = [
    ({"num_heads": 4}, {"num_attention_heads": 4}),
    ({"n_head": 4, "n_embd": 64}, {"hidden_size": 64, "num_attention_heads": 4}),
    ({"n_layer": 3}, {"num_hidden_layers": 3}),
    ({"d_model": 64}, {"hidden_size": 64}),
    ({"n_positions": 128}, {"max_position_embeddings": 128}),
    ({"n_inner": 48}, {"intermediate_size": 48}),
    ({"layer_norm_epsilon": 1e-6}, {"layer_norm_eps": 1e-6}),
    ({"rms_norm_eps": 1e-6, "normalization": "rmsnorm"}, {"layer_norm_eps": 1e-6, "normalization": "rmsnorm"}),
]


@pytest.mark.parametrize(("theirs", "ours"), OTHER_FAMILIES)
def test_another_familys_config_names_build_the_model_turners_names_build(theirs, ours, tmp_path):
    """GPT-2's, BERT's or T5's names for a field mean Turner's field, as `GPT2Config` reads `hidden_size` as `n_embd`:
    given to the constructor, assigned afterwards, or saved (under Turner's name) and loaded, derived fields
    (`head_dim`, `intermediate_size`) included."""
    expected = text_config(**ours).to_dict()
    assigned = text_config()
    for name, value in theirs.items():
        setattr(assigned, name, value)
    for config in (text_config(**theirs), assigned):
        assert config.to_dict() == expected
        assert all(getattr(config, name) == value for name, value in theirs.items())
    text_config(**theirs).save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert not set(saved) & set(TurnerConfig.attribute_map), saved
    loaded = TurnerConfig.from_pretrained(tmp_path).to_dict()
    assert {name: loaded[name] for name in expected} == expected
    torch.manual_seed(0)
    state = TurnerForCausalLM(text_config(**theirs)).state_dict()
    torch.manual_seed(0)
    assert {name: t.shape for name, t in state.items()} == {
        name: t.shape for name, t in TurnerForCausalLM(text_config(**ours)).state_dict().items()
    }


def test_transformers_test_helper_sets_every_familys_epsilon_and_the_config_saves(tmp_path):
    """transformers' `set_config_for_less_flaky_test` sets each family's epsilon name on any config: each is Turner's
    `layer_norm_eps`, and the folder saves and loads."""
    config = text_config()
    set_config_for_less_flaky_test(config)
    assert config.layer_norm_eps == 1.0
    config.save_pretrained(tmp_path)
    assert TurnerConfig.from_pretrained(tmp_path).layer_norm_eps == 1.0
    assert TurnerForCausalLM(config).model.layers[0].attn_norm.eps == 1.0


def test_a_bad_value_under_another_familys_name_is_refused_naming_turners_field():
    with pytest.raises(
        ValueError, match=re.escape("`num_attention_heads`=0 is invalid; it must be a positive integer")
    ):
        text_config(n_head=0)


def test_a_plain_saved_config_loads_without_warnings(tmp_path):
    text_config().save_pretrained(tmp_path)
    logger = logging.get_logger("turner_tfm.configuration_turner")
    with CaptureLogger(logger) as captured:
        TurnerConfig.from_pretrained(tmp_path)
    assert captured.out == ""


# --- inputs -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "argument", "hint"),
    [
        ({"input_ids": torch.tensor([[5, 99]])}, "input_ids", "[0, 99)"),
        ({"input_ids": torch.tensor([[5, -1]])}, "input_ids", "[0, 99)"),
        ({"input_ids": torch.zeros(0, 4, dtype=torch.long)}, "input_ids", "batch >= 1"),
        ({"input_ids": torch.zeros(2, 0, dtype=torch.long)}, "input_ids", "sequence >= 1"),
        ({"input_ids": torch.ones(2, 3)}, "input_ids", "integer token ids"),
        ({"input_ids": torch.ones(3, dtype=torch.long)}, "input_ids", "(batch, sequence)"),
        ({"input_ids": random_ids(1, 65)}, "input_ids", "max_position_embeddings"),
        ({"input_ids": random_ids(1, 5), "position_ids": torch.tensor([[0, 1, 2, 3, 64]])}, "position_ids", "0..63"),
        ({"input_ids": random_ids(2, 5), "attention_mask": torch.ones(2, 4)}, "attention_mask", "(2, 5)"),
        ({"input_ids": random_ids(2, 5), "attention_mask": torch.ones(3, 5)}, "attention_mask", "(2, 5)"),
        ({"input_ids": random_ids(2, 5), "attention_mask": torch.ones(10)}, "attention_mask", "(2, 5)"),
        (
            {"input_ids": random_ids(2, 5), "position_ids": torch.arange(4)[None]},
            "position_ids",
            "(2, 5) or (1, 5) or (5,)",
        ),
        (
            {"input_ids": random_ids(2, 5), "position_ids": torch.zeros(3, 5, dtype=torch.long)},
            "position_ids",
            "(1, 5)",
        ),
        ({"input_ids": random_ids(2, 5), "position_ids": torch.ones(2, 5)}, "position_ids", "integer positions"),
        ({"inputs_embeds": torch.randn(2, 5, 31)}, "inputs_embeds", "32"),
        ({"inputs_embeds": torch.randn(0, 5, 32)}, "inputs_embeds", "batch >= 1"),
        ({"input_ids": random_ids(2, 5), "labels": random_ids(2, 4)}, "labels", "(2, 5)"),
        ({"input_ids": random_ids(2, 5), "labels": torch.rand(2, 5)}, "labels", "integer"),
        ({"input_ids": random_ids(2, 5), "labels": torch.full((2, 5), 99)}, "labels", "-100"),
    ],
)
def test_bad_text_inputs_get_a_value_error_naming_the_argument(causal_lm, kwargs, argument, hint):
    with pytest.raises(ValueError) as error:
        causal_lm(**kwargs)
    assert f"`{argument}`" in str(error.value)
    assert hint in str(error.value)


@pytest.mark.parametrize("ids", [random_ids(2, 5).numpy(), random_ids(2, 5).tolist()], ids=["numpy", "list"])
@pytest.mark.parametrize("call", ["forward", "generate"])
def test_ids_that_are_not_a_tensor_get_a_type_error_saying_to_pass_one(causal_lm, ids, call):
    method = causal_lm if call == "forward" else causal_lm.generate
    with pytest.raises(TypeError, match=r"^`input_ids` must be a torch.Tensor, got a (numpy.ndarray|list): pass torch"):
        method(ids)


@pytest.mark.parametrize(
    ("kwargs", "argument", "shape"),
    [
        ({"attention_mask": torch.ones(2, 4, dtype=torch.long)}, "attention_mask", "(2, 4)"),
        ({"attention_mask": torch.ones(1, 5, dtype=torch.long)}, "attention_mask", "(1, 5)"),
        ({"position_ids": torch.arange(4)[None]}, "position_ids", "(1, 4)"),
    ],
)
def test_generate_names_a_mask_or_positions_of_the_wrong_shape(causal_lm, kwargs, argument, shape):
    """generate() derives the positions from the mask before the model sees either: both are checked by name."""
    with pytest.raises(ValueError, match=rf"^`{argument}` of shape \{shape[:-1]}\).* is invalid: expected .*\(2, 5\)"):
        causal_lm.generate(random_ids(2, 5), max_new_tokens=2, **kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"input_ids": random_ids(1, 3), "inputs_embeds": torch.randn(1, 3, 32)}],
    ids=["neither", "both"],
)
def test_input_ids_and_inputs_embeds_both_or_neither(causal_lm, kwargs):
    with pytest.raises(ValueError, match="exactly one of `input_ids` and `inputs_embeds`"):
        causal_lm(**kwargs)


def test_cached_decoding_past_the_learned_positions_is_refused(causal_lm):
    with torch.no_grad():
        cache = output_cache(causal_lm(random_ids(1, 63), use_cache=True))
        causal_lm(random_ids(1, 1), cache=cache)  # position 63: the last learned one
        with pytest.raises(ValueError, match=r"`input_ids` of 64 cached \+ 1 new tokens \(positions up to 64\)"):
            causal_lm(random_ids(1, 1), cache=cache)


def test_token_ids_passed_with_a_cache_are_still_checked(causal_lm):
    with torch.no_grad():
        cache = output_cache(causal_lm(random_ids(1, 4), use_cache=True))
        with pytest.raises(
            ValueError,
            match=r"^`input_ids` has 99 at row 0, position 0; token ids must be in \[0, 99\) \(vocab_size\)\.$",
        ):
            causal_lm(torch.tensor([[99]]), cache=cache)


def test_value_checks_never_read_a_meta_tensor():
    """Meta tensors stand in for data (reading one raises): the value checks read nothing of them."""
    config = text_config()
    on_meta = torch.full((1, 3), 99, device="meta")
    check_text_call(config, on_meta, None, token_labels=on_meta)
    with pytest.raises(ValueError, match="`input_ids` has 99 at row 0"):
        check_text_call(config, torch.full((1, 3), 99), None)  # the same ids on the CPU


def test_sinusoidal_positions_run_past_max_position_embeddings():
    model = TurnerForCausalLM(text_config(position_embedding_type="sinusoidal")).eval()
    with torch.no_grad():
        assert torch.isfinite(model(random_ids(1, 100)).logits).all()


@pytest.mark.parametrize(
    ("pixel_values", "hint"),
    [
        (torch.randn(2, 3, 32, 32), "16x16"),
        (torch.randn(2, 1, 16, 16), "(batch >= 1, 3, height, width)"),
        (torch.randn(3, 16, 16), "(batch >= 1, 3, height, width)"),
        (torch.randn(0, 3, 16, 16), "batch >= 1"),
    ],
)
def test_bad_images_get_a_value_error_naming_pixel_values(image_classifier, pixel_values, hint):
    with pytest.raises(ValueError) as error:
        image_classifier(pixel_values)
    assert "`pixel_values`" in str(error.value) and hint in str(error.value)


def test_images_of_another_size_run_with_interpolated_positions(image_classifier):
    with torch.no_grad():
        logits = image_classifier(torch.randn(2, 3, 24, 32), interpolate_pos_encoding=True).logits
        same_size = image_classifier(torch.ones(1, 3, 16, 16), interpolate_pos_encoding=True).logits
        plain = image_classifier(torch.ones(1, 3, 16, 16)).logits
    assert logits.shape == (2, 3) and torch.isfinite(logits).all()
    torch.testing.assert_close(same_size, plain)  # the trained size is left exactly as it was
    with pytest.raises(ValueError, match="multiples of patch_size=4"):
        image_classifier(torch.randn(1, 3, 18, 16), interpolate_pos_encoding=True)


def test_image_model_refuses_token_inputs(image_classifier):
    with pytest.raises(ValueError, match="pass `pixel_values` only"):
        image_classifier.model(input_ids=random_ids(1, 4))


@pytest.mark.parametrize(
    ("config_overrides", "labels", "hint"),
    [
        ({}, torch.tensor([0, 3]), "[0, 3)"),
        ({}, torch.tensor([[0], [1], [2]]), "2 integer class ids"),
        ({"problem_type": "multi_label_classification"}, torch.ones(2, 2), "(2, 3)"),
        ({"problem_type": "multi_label_classification"}, torch.ones(2, 3, dtype=torch.long), "floats"),
        ({"problem_type": "multi_label_classification"}, torch.full((2, 3), 2.0), "[0, 1]"),
        ({"problem_type": "multi_label_classification"}, torch.full((2, 3), 1.5), "[0, 1]"),
        ({"problem_type": "multi_label_classification"}, torch.full((2, 3), -0.5), "[0, 1]"),
        ({"problem_type": "regression"}, torch.ones(2, 2), "2 x 3 floats"),
        ({"num_labels": 1}, torch.tensor([1, 0]), "2 x 1 floats"),
    ],
)
def test_bad_classification_labels_get_a_value_error(config_overrides, labels, hint):
    model = TurnerForSequenceClassification(text_config(**{"is_causal": False, "num_labels": 3, **config_overrides}))
    with pytest.raises(ValueError) as error:
        model(random_ids(2, 5), labels=labels)
    assert "`labels`" in str(error.value) and hint in str(error.value)


def test_image_labels_are_checked_too(image_classifier):
    with pytest.raises(ValueError, match="class ids must be in"):
        image_classifier(torch.randn(2, 3, 16, 16), labels=torch.tensor([0, 7]))


# --- numbers ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("implementation", ["eager", "sdpa", "flex_attention"])
@pytest.mark.parametrize("causal", [True, False])
def test_rows_that_are_all_padding_stay_finite(implementation, causal):
    config = text_config(is_causal=causal, attn_implementation=implementation, num_labels=2)
    model = TurnerForSequenceClassification(config).eval()
    ids = random_ids(2, 5)
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 0, 0, 0]])
    with torch.no_grad():
        outputs = model(ids, attention_mask=mask, output_hidden_states=True)
    assert torch.isfinite(outputs.logits).all()
    assert all(torch.isfinite(hidden).all() for hidden in outputs.hidden_states)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_half_precision_stays_finite_with_large_attention_scores(dtype, implementation):
    model = TurnerForCausalLM(text_config(attn_implementation=implementation)).eval()
    with torch.no_grad():
        for block in model.model.layers:  # scores of order 1e4: exp() overflows unless softmax runs in fp32
            for U_q_or_k in block.self_attn.qkv_proj.weight.chunk(3)[:2]:
                U_q_or_k.mul_(40.0)
            block.attn_norm.weight.mul_(3.0)
    model = model.to(dtype)
    ids = random_ids(2, 12)
    with torch.no_grad():
        logits = model(ids).logits
        generated = model.generate(
            ids, max_new_tokens=6, do_sample=False, pad_token_id=0, output_scores=True, return_dict_in_generate=True
        )
    assert torch.isfinite(logits).all()
    assert all(torch.isfinite(score).all() for score in generated.scores)


def test_loss_ignores_minus_100_labels(causal_lm):
    ids = random_ids(2, 6)
    labels = ids.clone()
    labels[0] = -100
    with torch.no_grad():
        masked_loss = causal_lm(ids, labels=labels).loss
        second_row_only = causal_lm(ids[1:], labels=ids[1:]).loss
    torch.testing.assert_close(masked_loss, second_row_only)


# --- weights ----------------------------------------------------------------------------------------------------


@pytest.fixture
def saved_lm(tmp_path) -> Path:
    TurnerForCausalLM(text_config()).save_pretrained(tmp_path)
    return tmp_path


def test_truncated_weights_fail_with_a_clear_error(saved_lm):
    weights = saved_lm / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ValueError, match="truncated or corrupted"):
        TurnerForCausalLM.from_pretrained(saved_lm)


def test_corrupted_weights_fail_with_a_clear_error(saved_lm):
    weights = saved_lm / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:8] + b"\x00garbage" + data[16:])
    with pytest.raises(ValueError, match=str(saved_lm)):
        TurnerForCausalLM.from_pretrained(saved_lm)


def test_wrongly_shaped_tensor_fails_unless_mismatches_are_ignored(saved_lm):
    weights = saved_lm / "model.safetensors"
    tensors = load_file(weights)
    tensors["model.layers.0.mlp.up_proj.weight"] = torch.zeros(40, 32)
    save_file(tensors, weights, metadata={"format": "pt"})
    with pytest.raises(RuntimeError, match="ignore_mismatched_sizes"):
        TurnerForCausalLM.from_pretrained(saved_lm)


def test_config_sizes_that_disagree_with_the_weights_fail(saved_lm):
    config = json.loads((saved_lm / "config.json").read_text())
    (saved_lm / "config.json").write_text(json.dumps({**config, "intermediate_size": 50}))
    with pytest.raises(RuntimeError, match="ignore_mismatched_sizes"):
        TurnerForCausalLM.from_pretrained(saved_lm)


def test_missing_tensors_are_reported_never_silently_filled(saved_lm):
    weights = saved_lm / "model.safetensors"
    tensors = load_file(weights)
    del tensors["model.layers.1.self_attn.qkv_proj.weight"]
    save_file(tensors, weights, metadata={"format": "pt"})
    _, info = TurnerForCausalLM.from_pretrained(saved_lm, output_loading_info=True)
    assert info["missing_keys"] == {"model.layers.1.self_attn.qkv_proj.weight"}


def test_only_safetensors_are_written(tmp_path):
    TurnerForCausalLM(text_config()).save_pretrained(tmp_path)
    suffixes = {path.suffix for path in tmp_path.iterdir()}
    assert suffixes == {".safetensors", ".json", ".py"}


def test_the_code_copied_next_to_the_weights_does_no_io():
    package = Path(turner_tfm.__file__).parent
    forbidden_calls = {"open", "load", "save", "urlopen", "system", "popen", "exec", "eval", "__import__"}
    forbidden_modules = {"os.path", "pickle", "subprocess", "socket", "urllib", "requests", "shutil", "pathlib"}
    for name in ("modeling_turner.py", "configuration_turner.py"):
        tree = ast.parse((package / name).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                assert called not in forbidden_calls, f"{name}:{node.lineno} calls {called}"
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                modules = [node.module] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                assert not set(modules) & forbidden_modules, f"{name}:{node.lineno} imports {modules}"


def test_backbone_checkpoint_in_a_head_keeps_the_backbone_exact(tmp_path):
    backbone = TurnerModel(text_config())
    backbone.save_pretrained(tmp_path)
    head = TurnerForCausalLM.from_pretrained(tmp_path)
    for name, tensor in backbone.state_dict().items():
        assert torch.equal(head.model.state_dict()[name], tensor), name


@pytest.mark.parametrize(
    ("overrides", "token_type_ids", "hint"),
    [
        ({}, torch.ones(2, 5, dtype=torch.long), "type_vocab_size=0"),
        ({"type_vocab_size": 2}, torch.full((2, 5), 2), "[0, 2)"),
        ({"type_vocab_size": 2}, torch.zeros(2, 4, dtype=torch.long), "(2, 5)"),
    ],
)
def test_bad_token_type_ids_get_a_value_error(overrides, token_type_ids, hint):
    model = TurnerModel(text_config(**overrides))
    with pytest.raises(ValueError) as error:
        model(random_ids(2, 5), token_type_ids=token_type_ids)
    assert "`token_type_ids`" in str(error.value) and hint in str(error.value)


def test_zero_token_types_are_accepted_without_token_type_embeddings():
    model = TurnerModel(text_config()).eval()
    ids = random_ids(2, 5)
    with torch.no_grad():
        torch.testing.assert_close(
            model(ids, token_type_ids=torch.zeros_like(ids)).last_hidden_state, model(ids).last_hidden_state
        )
