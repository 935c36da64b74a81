"""`python -m convert` end to end: real subprocesses on saved folders, and what they write loaded back three ways
(the family's class, the Auto classes after `import turner_tfm`, and `trust_remote_code=True` without it)."""

import contextlib
import io
import json
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    AutoModelForImageClassification,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    BertConfig,
    BertForSequenceClassification,
    GenerationConfig,
    GPT2Config,
    GPT2LMHeadModel,
    PreTrainedModel,
    ViTConfig,
    ViTForImageClassification,
    ViTImageProcessor,
)

from convert import gpt2
from convert.cli import main
from turner_tfm import TurnerConfig, TurnerForCausalLM, TurnerForImageClassification, TurnerForSequenceClassification

from .convert_helpers import TOLERANCE, assert_same_state_dict, masked_ids, run_convert, word_tokenizer

SIZES = dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=24)
AUTO_CLASSES = {
    "gpt2": (AutoModelForCausalLM, TurnerForCausalLM),
    "vit": (AutoModelForImageClassification, TurnerForImageClassification),
    "bert": (AutoModelForSequenceClassification, TurnerForSequenceClassification),
}
# Runs in a fresh interpreter, outside the repository, where `import turner_tfm` fails.
LOADER = textwrap.dedent(
    """
    import json, sys
    sys.modules["turner_tfm"] = None
    import numpy, PIL.Image, torch, transformers
    try:
        import turner_tfm  # noqa: F401
        raise SystemExit("turner_tfm should not be importable here")
    except ImportError:
        pass
    jobs, results = json.loads(sys.argv[1]), {}
    for family, (folder, auto_name, inputs_file) in jobs.items():
        model = getattr(transformers, auto_name).from_pretrained(folder, trust_remote_code=True).eval()
        assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
        backbone = transformers.AutoModel.from_pretrained(folder, trust_remote_code=True).eval()
        with torch.no_grad():
            torch.save(model(**torch.load(inputs_file)).logits, f"{inputs_file}.out")
            torch.save(backbone(**torch.load(inputs_file)).last_hidden_state, f"{inputs_file}.backbone")
    image = PIL.Image.fromarray(numpy.zeros((8, 8, 3), dtype=numpy.uint8))
    tasks = {"gpt2": ("text-generation", "the cat sat", {"max_new_tokens": 4}),
             "vit": ("image-classification", image, {}), "bert": ("text-classification", "the cat sat", {})}
    for family, (task, example, settings) in tasks.items():
        run = transformers.pipeline(task, model=jobs[family][0], trust_remote_code=True)
        results[family] = run(example, **settings)
    print(json.dumps(results))
    """
)


def save_sources(root: Path) -> dict[str, PreTrainedModel]:
    """Tiny GPT-2, ViT and BERT checkpoints with their tokenizer or image processor, saved under `root`."""
    gpt2_tokenizer = word_tokenizer({"pad_token": "<pad>", "unk_token": "<unk>", "eos_token": "<eos>"})
    gpt2_sizes = dict(vocab_size=len(gpt2_tokenizer), n_positions=32, n_embd=16, n_layer=2, n_head=2)
    gpt2_model = GPT2LMHeadModel(GPT2Config(**gpt2_sizes, pad_token_id=0, bos_token_id=2, eos_token_id=2))
    bert_tokenizer = word_tokenizer({"pad_token": "[PAD]", "unk_token": "[UNK]"})
    bert_model = BertForSequenceClassification(
        BertConfig(vocab_size=len(bert_tokenizer), max_position_embeddings=32, num_labels=2, **SIZES)
    )
    vit_model = ViTForImageClassification(ViTConfig(image_size=8, patch_size=4, num_labels=3, **SIZES))
    sources = {"gpt2": (gpt2_model, gpt2_tokenizer), "bert": (bert_model, bert_tokenizer)}
    sources["vit"] = (vit_model, ViTImageProcessor(size={"height": 8, "width": 8}))
    for family, (model, preprocessing) in sources.items():
        model.save_pretrained(root / family)
        preprocessing.save_pretrained(root / family)
    return {family: model.eval() for family, (model, _) in sources.items()}


def sample_inputs(family: str) -> dict[str, torch.Tensor]:
    if family == "vit":
        return {"pixel_values": torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(0))}
    return masked_ids(16, 0, (6, 3))


@dataclass
class Runs:
    root: Path  # SRC folders are root / family, OUT folders root / f"{family}-turner"
    sources: dict[str, PreTrainedModel]
    results: dict[str, tuple[int, str, str]]  # family -> (return code, stdout, stderr)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Runs:
    """The three forward conversions: GPT-2 by `python -m convert` in a subprocess, ViT and BERT by `main()`."""
    root = tmp_path_factory.mktemp("convert_cli")
    sources = save_sources(root)
    process = run_convert("gpt2", str(root / "gpt2"), str(root / "gpt2-turner"))
    results = {}  # while that interpreter starts, the same CLI converts the other two in this process
    for family, extra in (("vit", []), ("bert", ["--set", "classifier_dropout=0.0"])):
        stdout, stderr = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            returncode = main([family, str(root / family), str(root / f"{family}-turner"), *extra])
        results[family] = (returncode, stdout.getvalue(), stderr.getvalue())
    results["gpt2"] = (process.wait(timeout=300), *process.communicate())
    return Runs(root, sources, results)


@pytest.mark.parametrize("family", list(AUTO_CLASSES))
def test_cli_converts_a_saved_folder(runs, family):
    root, sources = runs.root, runs.sources
    returncode, stdout, stderr = runs.results[family]
    assert returncode == 0, stderr
    turner_class = AUTO_CLASSES[family][1].__name__
    assert f"{type(sources[family]).__name__} ({root / family}) -> {turner_class} ({root / family}-turner)" in stdout
    difference = float(re.search(r"max \|difference\| = (\S+) \(logits\)", stdout).group(1))
    assert difference <= TOLERANCE
    assert ("image processor" if family == "vit" else "tokenizer") in stdout.splitlines()[3]


@pytest.mark.parametrize("family", list(AUTO_CLASSES))
def test_output_loads_with_the_auto_classes(runs, family):
    root, sources = runs.root, runs.sources
    auto_class, turner_class = AUTO_CLASSES[family]
    model = auto_class.from_pretrained(root / f"{family}-turner")
    assert type(model) is turner_class
    inputs = sample_inputs(family)
    with torch.no_grad():
        torch.testing.assert_close(model(**inputs).logits, sources[family](**inputs).logits, atol=1e-5, rtol=1e-5)
    if family != "vit":
        assert AutoTokenizer.from_pretrained(root / f"{family}-turner")("the cat sat")["input_ids"]


def test_output_loads_with_remote_code_where_turner_tfm_is_missing(runs, tmp_path):
    root, sources = runs.root, runs.sources
    jobs = {}
    for family, (auto_class, _) in AUTO_CLASSES.items():
        inputs_file = tmp_path / f"{family}.pt"
        torch.save(sample_inputs(family), inputs_file)
        jobs[family] = (str(root / f"{family}-turner"), auto_class.__name__, str(inputs_file))
    environment = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "HOME": str(tmp_path)}
    command = [sys.executable, "-c", LOADER, json.dumps(jobs)]
    done = subprocess.run(command, cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    pipelines = json.loads(done.stdout.splitlines()[-1])
    assert pipelines["gpt2"][0]["generated_text"].startswith("the cat sat")
    assert {result["label"] for result in pipelines["vit"]} <= set(sources["vit"].config.id2label.values())
    assert pipelines["bert"][0]["label"] in sources["bert"].config.id2label.values()
    for family in AUTO_CLASSES:
        with torch.no_grad():
            expected = sources[family](**sample_inputs(family))
        torch.testing.assert_close(torch.load(tmp_path / f"{family}.pt.out"), expected.logits, atol=1e-5, rtol=1e-5)
        # AutoModel (feature extraction, sentence-transformers) loads the backbone of every converted head
        body = getattr(sources[family], sources[family].base_model_prefix)
        with torch.no_grad():
            hidden = body(**sample_inputs(family)).last_hidden_state
        torch.testing.assert_close(torch.load(tmp_path / f"{family}.pt.backbone"), hidden, atol=1e-5, rtol=1e-5)


def test_reverse_restores_the_source_tensors(runs, tmp_path, capsys):
    source = runs.sources["gpt2"]
    gpt2.CONVERTER.model_to_turner(source).save_pretrained(tmp_path / "turner")
    assert main(["gpt2", str(tmp_path / "turner"), str(tmp_path / "again"), "--reverse"]) == 0
    assert "TurnerForCausalLM" in capsys.readouterr().out
    assert_same_state_dict(source, GPT2LMHeadModel.from_pretrained(tmp_path / "again"))


def test_cli_names_the_wrong_family(runs, tmp_path, capsys):
    root = runs.root
    assert main(["vit", str(root / "gpt2"), str(tmp_path / "never")]) == 1
    assert "holds a 'gpt2' checkpoint, expected 'vit'" in capsys.readouterr().err
    assert main(["gpt2", str(root / "gpt2-turner"), str(tmp_path / "never")]) == 1
    assert "add --reverse" in capsys.readouterr().err


def test_help_explains_families_and_refusals(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    top_help = capsys.readouterr().out
    assert all(word in top_help for word in ("gpt2", "vit", "bert", "--reverse", "examples:"))
    with pytest.raises(SystemExit):
        main(["bert", "--help"])
    family_help = capsys.readouterr().out
    assert "is_decoder=True" in family_help and "--architecture" in family_help


def test_set_changes_the_source_config_before_converting(runs, tmp_path):
    root = runs.root
    assert TurnerConfig.from_pretrained(root / "bert-turner").classifier_dropout == 0.0  # set by --set
    assert main(["bert", str(root / "bert"), str(tmp_path / "out")]) == 0
    assert TurnerConfig.from_pretrained(tmp_path / "out").classifier_dropout == 0.1  # BERT's hidden_dropout_prob


def test_missing_weights_are_refused(runs, tmp_path, capsys):
    root = runs.root
    args = ["bert", str(root / "bert-turner"), str(tmp_path / "out"), "--reverse"]
    assert main([*args, "--architecture", "BertModel"]) == 0
    assert "left in SRC, unused by TurnerModel: classifier.bias, classifier.weight" in capsys.readouterr().out
    out = tmp_path / "out"
    assert main(["bert", str(out), str(tmp_path / "again"), "--architecture", "BertForSequenceClassification"]) == 1
    assert "lacks weights of BertForSequenceClassification: ['classifier.bias', 'classifier.weight']" in (
        capsys.readouterr().err
    )


def test_bad_set_is_named(capsys):
    with pytest.raises(SystemExit):
        main(["bert", "src", "out", "--set", "classifier_dropout"])
    assert "--set expects KEY=VALUE" in capsys.readouterr().err


def test_reverse_writes_a_folder_the_family_class_loads(runs, tmp_path):
    root = runs.root
    assert main(["vit", str(root / "vit-turner"), str(tmp_path / "vit"), "--reverse"]) == 0
    assert_same_state_dict(runs.sources["vit"], ViTForImageClassification.from_pretrained(tmp_path / "vit"))
    assert (tmp_path / "vit" / "preprocessor_config.json").is_file()


def test_companions_cross_even_when_the_converted_class_does_not_use_them(runs, tmp_path, capsys):
    """A base model writes no generation config of its own; SRC's is carried anyway, as is its tokenizer."""
    assert main(["gpt2", str(runs.root / "gpt2"), str(tmp_path / "base"), "--architecture", "GPT2Model"]) == 0
    assert "copied from SRC: tokenizer, generation config" in capsys.readouterr().out
    carried = GenerationConfig.from_pretrained(tmp_path / "base")
    assert carried.eos_token_id == GenerationConfig.from_pretrained(runs.root / "gpt2").eos_token_id == 2
    assert json.loads((tmp_path / "base" / "config.json").read_text())["architectures"] == ["TurnerModel"]


@pytest.mark.parametrize("src", ["openai-community/gpt2", "./no-such-folder"])
def test_a_source_it_cannot_reach_is_refused_in_one_line(src, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # offline (HF_HUB_OFFLINE=1): the Hub id is neither here nor in the cache
    assert main(["gpt2", src, "out"]) == 1
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith(f"python -m convert: error: cannot read SRC {src!r}: no folder")
    assert "Give a checkpoint folder, or a Hub id" in error and not (tmp_path / "out").exists()
