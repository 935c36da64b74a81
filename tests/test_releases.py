"""Right on every transformers release the requirements allow, and loud on the next rename.

transformers 5.24 renamed the cache a model takes and returns (`past_key_values` became `cache`). These tests hold on
both sides of the rename: a cache under a name the model does not read is refused, the old name is still read, outputs
carry the cache under the running release's name, and the tools around the model (gradient checkpointing, the
Trainer's evaluation, device placement, assisted decoding) find it. The last ones check that pyproject's ranges are
the ones CI runs, and that a deprecation reported about our calls fails the tests.
"""

import contextlib
import copy
import logging
import re
import tomllib
import warnings
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from packaging.requirements import Requirement
from packaging.version import Version
from transformers import (
    DynamicCache,
    LlamaConfig,
    LlamaForCausalLM,
    LlamaModel,
    StaticCache,
    Trainer,
    TrainingArguments,
)

from turner_tfm import TurnerForCausalLM, TurnerModel, TurnerPreTrainedModel
from turner_tfm.compat_turner import CACHE_NAME, OLD_CACHE_NAME, named_cache, output_cache

from .conftest import _DeprecatedCallRecorder
from .tiny import TEXT_DEFAULTS, random_ids, text_config

REPOSITORY = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def causal_lm() -> TurnerForCausalLM:
    torch.manual_seed(0)
    return TurnerForCausalLM(text_config()).eval()


@pytest.mark.parametrize("model_class", [TurnerForCausalLM, TurnerModel])
@pytest.mark.parametrize("name", ["kv_cache", "past_key_value", "cache_params", "layer_past"])
def test_a_forward_given_a_cache_under_a_name_it_does_not_read_raises(causal_lm, model_class, name):
    model = causal_lm if model_class is TurnerForCausalLM else causal_lm.model
    ids = random_ids(1, 6)
    with torch.no_grad():
        cache = output_cache(model(ids[:, :5], use_cache=True))
        with pytest.raises(ValueError, match=rf"got a cache as `{name}`.*pass it as `cache`"):
            model(ids[:, 5:], **{name: cache})


@pytest.mark.parametrize("name", ["mask", "padding_mask", "positions", "past_length"])
def test_a_mask_or_position_under_a_name_the_model_does_not_take_raises(causal_lm, name):
    with torch.no_grad(), pytest.raises(ValueError, match=rf"does not take `{name}`"):
        causal_lm(random_ids(1, 4), **{name: torch.ones(1, 4, dtype=torch.long)})


def test_a_cache_passed_under_either_name_gives_the_same_next_token_logits(causal_lm):
    ids = random_ids(2, 9)
    with torch.no_grad():
        whole = causal_lm(ids).logits[:, -1]
        for name in ("cache", OLD_CACHE_NAME):
            cache = output_cache(causal_lm(ids[:, :8], use_cache=True))
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                step = causal_lm(ids[:, 8:], **{name: cache}).logits[:, -1]
            torch.testing.assert_close(step, whole, atol=1e-5, rtol=1e-5)
            assert cache.get_seq_length() == 9
            deprecations = [w for w in caught if issubclass(w.category, FutureWarning)]
            # the old name is the current one before 5.24 (generate() passes it): a warning only where it is old
            assert len(deprecations) == (name == OLD_CACHE_NAME and CACHE_NAME != OLD_CACHE_NAME)


def llama_of_the_same_shape(model_class: type) -> torch.nn.Module:
    """The in-library anchor for a Turner class: Llama's model or causal LM of the tiny text config's shape."""
    config = LlamaConfig(**{name: TEXT_DEFAULTS[name] for name in LLAMA_FIELDS})
    return (LlamaForCausalLM if model_class is TurnerForCausalLM else LlamaModel)(config).eval()


LLAMA_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")


def old_name_warnings(model: torch.nn.Module, ids: torch.Tensor) -> list[tuple]:
    """What transformers' `test_bc_cache_name_forward` records: a call with `past_key_values` in a fresh
    `catch_warnings(record=True)` and no filter of its own (Python's "default" action: once per call site, until
    the filters change)."""
    with warnings.catch_warnings(record=True) as caught:
        outputs = model(ids, use_cache=True, past_key_values=DynamicCache(config=model.config))
    assert output_cache(outputs).get_seq_length() == ids.shape[1]  # the cache passed under the old name was used
    named = type(model).__name__
    return [(w.category, str(w.message).replace(named, "<model>"), w.filename, w.lineno) for w in caught]


@pytest.mark.parametrize("model_class", [TurnerModel, TurnerForCausalLM])
def test_the_old_cache_name_warns_on_every_call_as_llama_does(model_class):
    """On 5.24 a FutureWarning each time, from the same place as Llama's (transformers' `deprecate_kwarg`, outermost),
    also right after another call and twice in a row; before 5.24 `past_key_values` is the current name: silence."""
    torch.manual_seed(0)
    turner, llama = model_class(text_config()).eval(), llama_of_the_same_shape(model_class)
    ids = random_ids(2, 5)
    with torch.no_grad():
        for model in (turner, llama):
            model(ids, use_cache=True)  # a test-like call before, as in a full run
        calls = [(old_name_warnings(turner, ids), old_name_warnings(llama, ids)) for _ in range(2)]
    for turner_warnings, llama_warnings in calls:
        assert turner_warnings == llama_warnings
        assert len(turner_warnings) == (CACHE_NAME != OLD_CACHE_NAME)
        assert all(warning[1].startswith("`past_key_values` is deprecated") for warning in turner_warnings)


def old_name_notice():
    """What naming a cache `past_key_values` gives: from 5.24 transformers' FutureWarning, before it nothing."""
    if CACHE_NAME == OLD_CACHE_NAME:
        return contextlib.nullcontext()
    return pytest.warns(FutureWarning, match="`past_key_values` is deprecated .* Use `cache` instead")


def test_an_empty_cache_under_each_name_reads_cache_as_transformers_models_do(causal_lm):
    cache, other = DynamicCache(config=causal_lm.config), DynamicCache(config=causal_lm.config)
    with torch.no_grad(), old_name_notice():
        causal_lm(random_ids(1, 3), use_cache=True, cache=cache, past_key_values=other)
    assert (cache.get_seq_length(), other.get_seq_length()) == (3, 0)


def test_an_empty_cache_beside_a_filled_past_key_values_reads_its_tokens(causal_lm):
    """PEFT's prefix tuning under generate() from 5.24: the prefix as `past_key_values`, generate()'s empty cache as
    `cache`. The prefix is written into `cache` first: the same logits as the prefix alone, none dropped."""
    ids = random_ids(2, 7)
    with torch.no_grad():
        prefix = output_cache(causal_lm(ids[:, :4], use_cache=True))
        expected = causal_lm(ids[:, 4:], past_key_values=copy.deepcopy(prefix)).logits
        cache = DynamicCache(config=causal_lm.config)
        with old_name_notice():
            outputs = causal_lm(ids[:, 4:], use_cache=True, cache=cache, past_key_values=prefix)
    torch.testing.assert_close(outputs.logits, expected)
    assert output_cache(outputs) is cache and (cache.get_seq_length(), prefix.get_seq_length()) == (7, 4)


def test_a_cache_starting_with_the_tokens_of_past_key_values_is_read_once(causal_lm):
    """PEFT's later steps from 5.24: generate()'s cache, which begins with the prefix, and a new copy of the prefix."""
    ids = random_ids(2, 8)
    with torch.no_grad():
        prefix = output_cache(causal_lm(ids[:, :4], use_cache=True))
        cache = output_cache(causal_lm(ids[:, 4:7], use_cache=True, cache=copy.deepcopy(prefix)))
        expected = causal_lm(ids[:, 7:], cache=copy.deepcopy(cache)).logits
        with old_name_notice():
            outputs = causal_lm(ids[:, 7:], use_cache=True, cache=cache, past_key_values=prefix)
    torch.testing.assert_close(outputs.logits, expected)
    assert (cache.get_seq_length(), prefix.get_seq_length()) == (8, 4)


def test_two_caches_holding_different_tokens_are_refused_by_name(causal_lm):
    """transformers' models read `cache` and drop `past_key_values` (5.24): one context silently lost. Refused."""
    ids = random_ids(1, 6)
    with torch.no_grad():
        cache = output_cache(causal_lm(ids[:, :3], use_cache=True))
        other = output_cache(causal_lm(ids[:, 3:5], use_cache=True))
        refusal = r"two different caches, `cache` \(3 tokens\) and `past_key_values` \(2 tokens\)"
        with old_name_notice(), pytest.raises(ValueError, match=refusal):
            causal_lm(ids[:, 5:], cache=cache, past_key_values=other)
    assert (cache.get_seq_length(), other.get_seq_length()) == (3, 2)


def test_outputs_carry_the_cache_under_this_releases_name_only(causal_lm):
    with torch.no_grad():
        outputs = causal_lm(random_ids(1, 4), use_cache=True)
    assert list(outputs.keys()) == ["logits", CACHE_NAME]
    assert isinstance(outputs[CACHE_NAME], DynamicCache) and outputs[CACHE_NAME].get_seq_length() == 4


def test_a_static_cache_passed_by_name_decodes_as_generate_does(causal_lm):
    """generate() hands the cache over under the release's name: the same greedy tokens as stepping by hand."""
    prompt = random_ids(1, 5)
    generated = causal_lm.generate(prompt, max_new_tokens=6, do_sample=False, cache_implementation="static")
    cache, tokens = StaticCache(config=causal_lm.config, max_cache_len=16), prompt
    with torch.no_grad():
        step_input = prompt
        for _ in range(6):
            logits = causal_lm(step_input, use_cache=True, **named_cache(cache)).logits
            step_input = logits[:, -1:].argmax(-1)
            tokens = torch.cat([tokens, step_input], dim=1)
    assert tokens.tolist() == generated.tolist()


def test_gradient_checkpointing_never_writes_a_callers_cache_twice():
    """The backward pass replays each checkpointed block: a cache it wrote would get every key twice, and the replay
    would attend to them. transformers clears the cache under the name its release uses; the blocks get that name."""
    torch.manual_seed(0)
    model = TurnerForCausalLM(text_config()).train()
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    cache = DynamicCache(config=model.config)
    ids = random_ids(2, 6)
    model(ids, labels=ids, use_cache=True, cache=cache).loss.backward()
    assert cache.get_seq_length() in (0, 6)
    assert all(parameter.grad is not None for parameter in model.model.layers.parameters())


def test_device_placement_skips_the_cache_under_either_name():
    assert {"cache", "past_key_values"} <= set(TurnerPreTrainedModel._skip_keys_device_placement)


def test_the_trainers_predictions_are_logits_without_the_cache(tmp_path):
    torch.manual_seed(0)
    model = TurnerForCausalLM(text_config())
    data = Dataset.from_dict({"input_ids": random_ids(4, 6).tolist(), "labels": random_ids(4, 6).tolist()})
    args = TrainingArguments(output_dir=str(tmp_path), per_device_eval_batch_size=2, report_to="none", use_cpu=True)
    predictions = Trainer(model=model, args=args).predict(data).predictions
    assert predictions.shape == (4, 6, model.config.vocab_size)


# ---- the ranges CI proves --------------------------------------------------------------------------------------------


def _pins(path: Path) -> dict[str, Version]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            pins[_canonical(name)] = Version(version.split("+")[0])
    return pins


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirements(*extras: str) -> list[Requirement]:
    """The core's requirements and those of `extras` (with the extras they name); every extra's if none is given."""
    project = tomllib.loads((REPOSITORY / "pyproject.toml").read_text())["project"]
    groups, texts, todo = project["optional-dependencies"], list(project["dependencies"]), list(extras or [])
    if not extras:
        todo = list(groups)
    seen = set()
    while todo:
        if (extra := todo.pop()) not in seen:
            seen.add(extra)
            texts += groups[extra]
            todo += [e for text in groups[extra] if text.startswith("turner-tfm") for e in Requirement(text).extras]
    return [Requirement(text) for text in texts if not text.startswith("turner-tfm")]


def _lower_bound(requirement: Requirement) -> Version:
    lower = [Version(spec.version) for spec in requirement.specifier if spec.operator == ">="]
    assert lower, f"{requirement} has no lower bound: the floors lanes cannot test one"
    return lower[0]


def test_every_lower_bound_is_the_version_the_floors_lane_installs():
    """The floors lane installs every requirement at its lower bound together: where two name a package (torch: the
    core's and the export extra's), the higher of the two."""
    floors, highest = _pins(REPOSITORY / ".ci" / "floors.txt"), {}
    for requirement in _requirements():
        name = _canonical(requirement.name)
        highest[name] = max(highest.get(name, _lower_bound(requirement)), _lower_bound(requirement))
    for name, lower in highest.items():
        assert floors.get(name) == lower, (
            f"pyproject's floor for {name} is {lower}, .ci/floors.txt pins {floors.get(name)}"
        )


def test_the_core_lane_installs_the_cores_and_the_test_extras_lower_bounds():
    """The core lane: the core's requirements and the `test` extra's at their lower bounds, torch at the core's."""
    floors = _pins(REPOSITORY / ".ci" / "core-floors.txt")
    for requirement in _requirements("test"):
        assert floors.get(_canonical(requirement.name)) == _lower_bound(requirement), (
            f"pyproject says {requirement}, .ci/core-floors.txt pins {floors.get(_canonical(requirement.name))}"
        )
    torch_floors = sorted(_lower_bound(r) for r in _requirements() if r.name == "torch")
    assert floors["torch"] == torch_floors[0] < torch_floors[-1], f"the core lane tests no lower torch: {torch_floors}"


def test_the_newest_lane_pins_releases_the_ranges_allow_and_transformers_cap_is_the_next_minor():
    newest = _pins(REPOSITORY / ".ci" / "constraints.txt")
    for requirement in _requirements():
        version = newest.get(_canonical(requirement.name))
        assert version is not None and requirement.specifier.contains(version, prereleases=True), (
            f".ci/constraints.txt pins {requirement.name}=={version}, outside {requirement}"
        )
    transformers = next(r for r in _requirements() if r.name == "transformers" and "<" in str(r.specifier))
    cap = next(Version(spec.version) for spec in transformers.specifier if spec.operator == "<")
    tested = newest["transformers"]
    assert cap == Version(f"{tested.major}.{tested.minor + 1}"), f"cap {cap}: the newest tested is {tested}"


# ---- deprecations of our calls fail the tests ------------------------------------------------------------------------


@pytest.mark.parametrize("category", [FutureWarning, DeprecationWarning])
def test_a_deprecation_warning_about_our_call_is_an_error(category):
    for module in ("turner_tfm.modeling_turner", "transformers_modules.folder.modeling_turner", "convert.gpt2"):
        with pytest.raises(category, match="renamed"):
            warnings.warn_explicit("`x` is renamed", category, "caller.py", 1, module=module)


def test_a_deprecation_warning_about_someone_elses_call_is_not_an_error():
    with pytest.warns(FutureWarning, match="renamed"):
        warnings.warn_explicit("`x` is renamed", FutureWarning, "caller.py", 1, module="transformers.trainer")


def _log_through(modules: list[str], recorder: _DeprecatedCallRecorder, record: logging.LogRecord) -> None:
    """`recorder.emit(record)`, called through one frame per module, outermost first."""
    source, call = "def call():\n    emit(record)", None
    for module in reversed(modules):
        namespace = {"__name__": module, "emit": recorder.emit, "record": record, "inner": call}
        exec(source, namespace)
        source, call = "def call():\n    inner()", namespace["call"]
    call()


def test_a_deprecation_that_transformers_logs_about_our_call_is_caught():
    """The recorder keeps a deprecation transformers logs a few frames below a call from our modules; not one from
    anyone else's call, nor one deep inside a call transformers makes itself."""
    recorder = _DeprecatedCallRecorder()
    record = logging.makeLogRecord({"levelno": logging.WARNING, "msg": "`past_key_values` is deprecated."})
    modeling_output = ["transformers.utils.generic", "transformers.utils.generic"]  # __getitem__, then the rename
    calls = {
        "ours": ["turner_tfm.modeling_turner", *modeling_output],
        "remote code": ["transformers_modules.folder.modeling_turner", *modeling_output],
        "a test's": ["tests.test_releases", *modeling_output],
        "transformers' own": ["turner_tfm.generation_turner", *["transformers.generation.utils"] * 5],
    }
    caught = {}
    for caller, modules in calls.items():
        recorder.calls.clear()
        _log_through(modules, recorder, record)
        caught[caller] = bool(recorder.calls)
    assert caught == {"ours": True, "remote code": True, "a test's": False, "transformers' own": False}


def test_a_lora_adapter_folder_loads_through_transformers_as_through_peft(tmp_path):
    """transformers' PEFT integration (`from_pretrained` on an adapter folder) gives the adapted model PEFT gives."""
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    TurnerForCausalLM(text_config()).save_pretrained(tmp_path / "base")
    adapted = get_peft_model(
        TurnerForCausalLM.from_pretrained(tmp_path / "base"),
        LoraConfig(r=4, init_lora_weights=False, target_modules=["qkv_proj"]),
    )
    adapted.save_pretrained(tmp_path / "adapter")
    ids = random_ids(2, 7)
    with torch.no_grad():
        through_peft = PeftModel.from_pretrained(
            TurnerForCausalLM.from_pretrained(tmp_path / "base"), tmp_path / "adapter"
        )
        through_transformers = AutoModelForCausalLM.from_pretrained(tmp_path / "adapter")
        base = TurnerForCausalLM.from_pretrained(tmp_path / "base")(ids).logits
        expected = through_peft(ids).logits
        torch.testing.assert_close(through_transformers(ids).logits, expected)
    assert not torch.allclose(expected, base), "the adapter changes the logits"


def test_the_plan_transformers_516_to_520_assign_to_a_tied_config_is_accepted_and_any_other_refused():
    """transformers 5.16-5.20 (vLLM's pins) set `base_model_tp_plan` on every config with tied embeddings, adding an
    `embed_tokens` rule; Turner's plan keeps its own, and any other assignment is refused."""
    config = text_config(tie_word_embeddings=True)
    built = dict(config.base_model_tp_plan)
    assert built["embeddings.embed_tokens"] == "embedding_rowwise"
    config.base_model_tp_plan = {**built, "embed_tokens": "embedding_rowwise"}
    assert config.base_model_tp_plan == built
    with pytest.raises(ValueError, match="built from the config's own fields"):
        config.base_model_tp_plan = {**built, "layers.*.mlp.up_proj": "rowwise"}
