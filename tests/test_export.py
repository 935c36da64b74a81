"""Exported programs through transformers' own exporters (`transformers.exporters`): ONNX run by ONNX Runtime, and
torch.export. Each gives the eager logits, a language model's prefill and decode programs decode greedily to exactly
`generate()`'s tokens, and an exported folder reloads and runs where turner_tfm cannot be imported.

ExecuTorch and every config switch in every format are in the `slow` run (minutes of export on two cores)."""

import contextlib
import importlib
import json
import os
import runpy
import subprocess
import sys
import textwrap
from unittest import mock

import onnxruntime  # noqa: F401  (the dev extra: a missing or broken install fails here, it never skips)
import pytest
import torch
from transformers import DynamicCache
from transformers.exporters import ExportedModel

from turner_tfm import TurnerForCausalLM, TurnerForImageClassification, TurnerForSequenceClassification

from .test_switches import SWITCHES
from .tiny import image_config, random_ids, text_config
from .workflow_utils import EXAMPLES, run_examples

pytestmark = pytest.mark.torch_2_13(reason="the export extra asks for it (pyproject; executorch needs it)")

NEW_TOKENS = 20
CACHE = 40
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def export_script():
    """examples/export.py as a module: its exporting and decoding helpers are the ones under test."""
    return importlib.import_module("examples.export")


def language_model(**overrides) -> TurnerForCausalLM:
    """Weights spread wide enough that greedy decoding does not repeat one token (a stricter comparison)."""
    torch.manual_seed(0)
    return TurnerForCausalLM(text_config(initializer_range=0.3, eos_token_id=None, **overrides)).eval()


@contextlib.contextmanager
def unrestricted_unpickling_refused():
    """`torch.load` raises when asked for `weights_only=False`: torch.export's fallback to unrestricted unpickling
    (after a failed safe load) becomes an error, so a load that succeeds inside took the safe path."""
    safe_load = torch.load

    def load(*args, weights_only=True, **kwargs):
        if not weights_only:
            raise AssertionError("torch.load(weights_only=False): the exported folder is not tensors only")
        return safe_load(*args, weights_only=True, **kwargs)

    with mock.patch("torch.load", load):
        yield


def export_and_reload(export_script, model, export_format: str, sample: dict, folder) -> ExportedModel:
    export_script.export_model(model, export_format, sample, CACHE).save_pretrained(folder)
    with unrestricted_unpickling_refused():
        return ExportedModel.from_pretrained(folder, trust_remote_code=True)


def test_the_guard_refuses_a_program_that_pickles_its_cache(export_script, tmp_path):
    """Without `without_example_inputs` the saved language-model program pickles its `StaticCache`, and only an
    unrestricted unpickling reads it back: the guard above catches exactly that."""
    sample = {"input_ids": random_ids(1, 6)}
    with mock.patch.object(export_script, "without_example_inputs", lambda exported: exported):
        export_script.export_model(language_model(), "torch", sample, CACHE).save_pretrained(tmp_path)
    with unrestricted_unpickling_refused(), pytest.raises(AssertionError, match="weights_only=False"):
        ExportedModel.from_pretrained(tmp_path, trust_remote_code=True)


def greedy(model: TurnerForCausalLM, prompt: torch.Tensor) -> list[int]:
    generated = model.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
    return generated[0, prompt.shape[1] :].tolist()


def check_language_model(export_script, model, exported: ExportedModel, varied: bool = True) -> None:
    """A prompt of another length than the traced one: prefill logits (to 1e-4, relative to the logits' size where
    they are large), then greedy decoding; `varied`: the continuation is not a few tokens repeated."""
    prompt = random_ids(1, 9, seed=3)
    with torch.no_grad():
        expected = model(prompt).logits
    logits = exported.runners["prefill"](**export_script.prefill_inputs(exported, prompt)).logits
    torch.testing.assert_close(logits, expected, atol=TOLERANCE, rtol=TOLERANCE)
    tokens = export_script.generate_exported(exported, prompt, NEW_TOKENS).tolist()
    assert len(tokens) == NEW_TOKENS and (len(set(tokens)) > 3 or not varied)
    assert tokens == greedy(model, prompt)


@pytest.fixture(scope="module")
def onnx_language_model(export_script, tmp_path_factory):
    model = language_model()
    folder = tmp_path_factory.mktemp("onnx-lm")
    return model, folder, export_and_reload(export_script, model, "onnx", {"input_ids": random_ids(1, 6)}, folder)


def test_onnx_prefill_and_decode_give_the_eager_logits_and_generate_tokens(export_script, onnx_language_model):
    model, folder, exported = onnx_language_model
    assert {p.name for p in folder.glob("*.onnx")} == {"prefill.onnx", "decode.onnx"}
    assert type(exported.runners["decode"]).__name__ == "OnnxModelRunner"  # ONNX Runtime runs it, not torch
    check_language_model(export_script, model, exported)


def test_torch_export_prefill_and_decode_give_the_eager_logits_and_generate_tokens(export_script, tmp_path):
    model = language_model(position_embedding_type="rotary")
    exported = export_and_reload(export_script, model, "torch", {"input_ids": random_ids(1, 6)}, tmp_path)
    assert {p.name for p in tmp_path.glob("*.pt2")} == {"prefill.pt2", "decode.pt2"}
    check_language_model(export_script, model, exported)


def test_transformers_dynamo_exporter_exports_for_generation_with_generates_own_cache(export_script):
    """Issue 50: `DynamoExporter.export_for_generation` as a user calls it (generate()'s own dynamic cache, dynamic
    shapes), then its prefill and decode programs run as for GPT-2: an empty `DynamicCache`, then each step's cache
    fed back (under the cache's name in this release). They decode generate()'s greedy tokens, and the programs' inputs
    name no class of turner_tfm (a saved program loads where it is not installed)."""
    from transformers.exporters import DynamoConfig, DynamoExporter

    model, sample = language_model(), random_ids(1, 6)
    exported = DynamoExporter().export_for_generation(
        model, {"input_ids": sample, "attention_mask": torch.ones_like(sample)}, DynamoConfig(dynamic=True)
    )
    prompt = random_ids(1, 9, seed=3)
    positions = torch.arange(prompt.shape[1] + NEW_TOKENS).unsqueeze(0)
    cache = export_script.traced_cache_name(exported)
    outputs = exported.runners["prefill"](
        input_ids=prompt, position_ids=positions[:, :9], **{cache: DynamicCache(config=model.config)}
    )
    tokens = [outputs.logits[:, -1].argmax(-1, keepdim=True)]
    for position in range(9, 9 + NEW_TOKENS - 1):
        step = dict(input_ids=tokens[-1], position_ids=positions[:, position : position + 1])
        outputs = exported.runners["decode"](**step, **{cache: getattr(outputs, cache)})
        tokens.append(outputs.logits[:, -1].argmax(-1, keepdim=True))
    assert torch.cat(tokens, dim=1)[0].tolist() == greedy(model, prompt)
    specs = [str(component.program.call_spec.in_spec) for component in exported.components.values()]
    assert len(specs) == 2 and not any("turner" in spec.lower() for spec in specs)  # GPT-2's DynamicLayer


@pytest.mark.parametrize("export_format", ["onnx", "torch"])
def test_classifiers_export_with_the_eager_logits(export_script, export_format, tmp_path):
    torch.manual_seed(0)
    text = TurnerForSequenceClassification(text_config(is_causal=False, num_labels=3)).eval()
    ids = random_ids(1, 7)
    exported = export_and_reload(
        export_script, text, export_format, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, tmp_path / "t"
    )
    longer = random_ids(1, 11, seed=4)  # the sequence axis is dynamic
    for prompt in (ids, longer):
        inputs = {"input_ids": prompt, "attention_mask": torch.ones_like(prompt)}
        with torch.no_grad():
            torch.testing.assert_close(exported(**inputs).logits, text(**inputs).logits, atol=TOLERANCE, rtol=0)

    image = TurnerForImageClassification(image_config()).eval()
    pixels = torch.randn(1, 3, 16, 16)
    exported = export_and_reload(export_script, image, export_format, {"pixel_values": pixels}, tmp_path / "i")
    with torch.no_grad():
        torch.testing.assert_close(exported(pixel_values=pixels).logits, image(pixels).logits, atol=TOLERANCE, rtol=0)


def test_an_exported_folder_runs_where_turner_tfm_cannot_be_imported(onnx_language_model, tmp_path):
    model, folder, _ = onnx_language_model
    prompt = random_ids(1, 5, seed=7)
    (tmp_path / "expected.json").write_text(json.dumps({"prompt": prompt.tolist(), "tokens": greedy(model, prompt)}))
    script = textwrap.dedent(
        f"""
        import json, sys
        sys.modules["turner_tfm"] = None  # any `import turner_tfm` now fails
        import runpy
        import torch
        from transformers.exporters import ExportedModel
        generate_exported = runpy.run_path({str(EXAMPLES / "export.py")!r})["generate_exported"]

        expected = json.load(open({str(tmp_path / "expected.json")!r}))
        exported = ExportedModel.from_pretrained({str(folder)!r}, trust_remote_code=True)
        tokens = generate_exported(exported, torch.tensor(expected["prompt"]), {NEW_TOKENS}).tolist()
        assert tokens == expected["tokens"], (tokens, expected["tokens"])
        assert not any(name.startswith("turner_tfm") for name in sys.modules if sys.modules[name] is not None)
        print("ran", type(exported.config).__module__, len(tokens), "tokens")
        """
    )
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_OFFLINE": "1"}
    env.pop("PYTHONPATH", None)
    result = subprocess.run(
        [sys.executable, "-I", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    # the config class came from the code saved in the folder (transformers' remote-code modules), not turner_tfm
    assert "ran transformers_modules." in result.stdout and f"{NEW_TOKENS} tokens" in result.stdout


def run_export_script(monkeypatch, *args: str) -> None:
    monkeypatch.setattr(sys, "argv", [str(EXAMPLES / "export.py"), *args])
    try:
        runpy.run_path(str(EXAMPLES / "export.py"), run_name="__main__")
    except SystemExit as done:
        if done.code not in (None, 0):
            raise


def test_the_example_script_exports_checks_and_reports(export_script, tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(EXAMPLES))  # export.py runs below as a script: its folder first, as Python does
    from examples.helpers import data

    tokenizer = data.char_tokenizer(["Return the sum of the values."], model_max_length=64)
    config = text_config(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, eos_token_id=None)
    config.use_cache = False  # as the Trainer saves a trained model's config: the export still uses a cache
    torch.manual_seed(0)
    TurnerForCausalLM(config).save_pretrained(tmp_path / "lm")
    tokenizer.save_pretrained(tmp_path / "lm")
    with unrestricted_unpickling_refused():
        run_export_script(
            monkeypatch,
            "--model-name-or-path",
            str(tmp_path / "lm"),
            "--format",
            "torch",
            "--output-dir",
            str(tmp_path / "out"),
        )
    output = capsys.readouterr().out
    assert f"wrote {tmp_path / 'out'}/: config.json" in output and "decode.pt2" in output
    assert f"{NEW_TOKENS} greedy tokens through prefill + decode equal generate()'s" in output
    assert "check passed" in output


def test_the_example_script_answers_help_and_bad_flags(tmp_path):
    folder = ("--model-name-or-path", str(tmp_path))  # after the flag under test
    runs = [("export.py", "--help", *folder), ("export.py", "--format", "tflite", *folder)]
    help_text, refused = run_examples(runs, tmp_path=tmp_path, expect_failure=[False, True])
    assert "--format {onnx,torch,executorch}" in help_text
    assert "invalid choice" in refused


@pytest.mark.slow
@pytest.mark.parametrize("export_format", ["torch", "onnx"])
@pytest.mark.parametrize("switch", list(SWITCHES))
def test_every_switch_exports(export_script, switch, export_format, tmp_path):
    model = language_model(**SWITCHES[switch])
    exported = export_and_reload(export_script, model, export_format, {"input_ids": random_ids(1, 6)}, tmp_path / "lm")
    check_language_model(export_script, model, exported, varied=False)  # some switches settle into a short loop
    image_switches = {k: v for k, v in SWITCHES[switch].items() if k != "tie_word_embeddings"}
    image = TurnerForImageClassification(image_config(**image_switches)).eval()
    pixels = torch.randn(1, 3, 16, 16)
    exported = export_and_reload(export_script, image, export_format, {"pixel_values": pixels}, tmp_path / "i")
    with torch.no_grad():
        torch.testing.assert_close(exported(pixel_values=pixels).logits, image(pixels).logits, atol=TOLERANCE, rtol=0)


@pytest.mark.slow
def test_executorch_prefill_and_decode_give_the_eager_logits_and_generate_tokens(export_script, tmp_path):
    import executorch  # noqa: F401

    model = language_model()
    exported = export_and_reload(export_script, model, "executorch", {"input_ids": random_ids(1, 6)}, tmp_path)
    assert {p.name for p in tmp_path.glob("*.pte")} == {"prefill.pte", "decode.pte"}
    check_language_model(export_script, model, exported)
