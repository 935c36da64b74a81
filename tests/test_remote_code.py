"""trust_remote_code: a saved folder carries its own code and loads in a process that cannot import turner_tfm,
through every Auto class of its modality whichever class saved it."""

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import transformers
from transformers import PreTrainedModel

import turner_tfm
from turner_tfm import TurnerConfig
from turner_tfm.pretrained_turner import AUTO_CLASSES, auto_classes

from .convert_helpers import word_tokenizer
from .isolated import run_isolated
from .tiny import image_config, random_ids, text_config

# Every class a folder can be saved as, with a config of its modality. Each folder must load through every Auto class
# of that modality its mask serves (`auto_classes`: a causal model is no masked LM); a head it was not saved with gets
# fresh weights, the same ones under the same seed.
SAVED_CLASSES = {
    "text-TurnerModel": (turner_tfm.TurnerModel, text_config()),
    "text-TurnerForCausalLM": (turner_tfm.TurnerForCausalLM, text_config()),
    "text-TurnerForSequenceClassification": (
        turner_tfm.TurnerForSequenceClassification,
        text_config(is_causal=False, norm_position="post", type_vocab_size=2, embedding_layer_norm=True),
    ),
    "text-TurnerForMaskedLM": (turner_tfm.TurnerForMaskedLM, text_config(is_causal=False, type_vocab_size=2)),
    "text-TurnerForTokenClassification": (
        turner_tfm.TurnerForTokenClassification,
        text_config(is_causal=False, num_labels=5),
    ),
    "text-TurnerForQuestionAnswering": (turner_tfm.TurnerForQuestionAnswering, text_config()),
    "text-TurnerForMultipleChoice": (turner_tfm.TurnerForMultipleChoice, text_config(is_causal=False, use_pooler=True)),
    "image-TurnerModel": (turner_tfm.TurnerModel, image_config()),
    "image-TurnerForImageClassification": (turner_tfm.TurnerForImageClassification, image_config()),
}
AUTO_NAMES = {name: auto for classes in AUTO_CLASSES.values() for auto, name in classes.items()}
# A classifier's `classifier` (num_labels outputs) and the multiple-choice head's (one) share a name, as BERT's do:
# loading one's folder as the other is refused as a size mismatch, as BERT's is (test_a_classifiers_folder_loaded_...)
CLASSIFIERS = {"AutoModelForSequenceClassification", "AutoModelForTokenClassification"}
CHOICE = "AutoModelForMultipleChoice"


def shares_classifier(saved: str, auto_name: str) -> bool:
    saved_auto = next(auto for auto, name in auto_classes(SAVED_CLASSES[saved][1]).items() if saved.endswith(name))
    return {saved_auto, auto_name} & CLASSIFIERS and CHOICE in {saved_auto, auto_name}


PAIRS = [
    (saved, auto_name)
    for saved, (_, config) in SAVED_CLASSES.items()
    for auto_name in auto_classes(config)
    if not shares_classifier(saved, auto_name)
]
# Runs in a fresh interpreter, outside the repository, where `import turner_tfm` fails. For each job (folder, Auto
# class, inputs file, outputs file) it loads the folder as remote code, seeded (a head the folder lacks gets the same
# fresh weights as under the same seed here), and saves its main output and the last block's hidden states.
REMOTE_LOADER = textwrap.dedent(
    """
    import json, sys
    sys.modules["turner_tfm"] = None
    import torch, transformers
    jobs = json.loads(sys.argv[1])
    torch.set_num_threads(int(sys.argv[2]))
    try:
        import turner_tfm  # noqa: F401
        raise SystemExit("turner_tfm should not be importable here")
    except ImportError:
        pass
    for folder, auto_name, inputs_file, outputs_file in jobs:
        torch.manual_seed(0)
        model = getattr(transformers, auto_name).from_pretrained(folder, trust_remote_code=True).eval()
        assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
        with torch.no_grad():
            outputs = model(**torch.load(inputs_file), output_hidden_states=True)
        torch.save([outputs[0], outputs.hidden_states[-1]], outputs_file)
    """
)


def load_without_the_package(jobs: list[list[str]], cwd: Path) -> list[list[torch.Tensor]]:
    """Run `REMOTE_LOADER` on `jobs` ([folder, Auto class name, inputs file, outputs file]); each job's outputs."""
    run_isolated(REMOTE_LOADER, [json.dumps(jobs), str(torch.get_num_threads())], cwd)
    return [torch.load(job[3]) for job in jobs]


def pair_inputs(config: TurnerConfig, auto_name: str = "AutoModel") -> dict[str, torch.Tensor]:
    """The same tokens (or images) for every class; a multiple-choice head reads each row as one choice."""
    if config.is_image_model:
        return {"pixel_values": torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))}
    ids = random_ids(2, 6)
    return {"input_ids": ids.unsqueeze(1) if auto_name == "AutoModelForMultipleChoice" else ids}


def main_and_last_hidden(model: PreTrainedModel, inputs: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    with torch.no_grad():
        outputs = model.eval()(**inputs, output_hidden_states=True)
    return [outputs[0], outputs.hidden_states[-1]]


@dataclass
class PairRuns:
    root: Path  # the saved folders: root / saved
    saved: dict[str, list[torch.Tensor]]  # the saving model's outputs
    local: dict[tuple[str, str], list[torch.Tensor]]  # each pair loaded with the package
    remote: dict[tuple[str, str], list[torch.Tensor]]  # each pair loaded as remote code, without it


@pytest.fixture(scope="module")
def pair_runs(tmp_path_factory) -> PairRuns:
    root = tmp_path_factory.mktemp("auto_pairs")
    saved_outputs, local, jobs = {}, {}, []
    for saved, (model_class, config) in SAVED_CLASSES.items():
        torch.manual_seed(0)
        model = model_class(config)
        model.save_pretrained(root / saved)
        saved_outputs[saved] = main_and_last_hidden(model, pair_inputs(config, AUTO_NAMES[model_class.__name__]))
    for saved, auto_name in PAIRS:
        torch.manual_seed(0)
        model = getattr(transformers, auto_name).from_pretrained(root / saved)
        inputs = pair_inputs(SAVED_CLASSES[saved][1], auto_name)
        local[saved, auto_name] = main_and_last_hidden(model, inputs)
        torch.save(inputs, root / f"{saved}.{auto_name}.inputs.pt")
        jobs.append(
            [
                str(root / saved),
                auto_name,
                str(root / f"{saved}.{auto_name}.inputs.pt"),
                str(root / f"{saved}.{auto_name}.pt"),
            ]
        )
    remote = dict(zip(PAIRS, load_without_the_package(jobs, root), strict=True))
    return PairRuns(root, saved_outputs, local, remote)


@pytest.mark.parametrize(("saved", "auto_name"), PAIRS)
def test_every_auto_class_of_the_modality_loads_whichever_class_was_saved(saved, auto_name, pair_runs):
    model_class, config = SAVED_CLASSES[saved]
    files = {path.name for path in (pair_runs.root / saved).iterdir()}
    assert {"modeling_turner.py", "configuration_turner.py", "model.safetensors"} <= files
    auto_map = json.loads((pair_runs.root / saved / "config.json").read_text())["auto_map"]
    classes = auto_classes(config)
    assert auto_map == {"AutoConfig": "configuration_turner.TurnerConfig"} | {
        auto: f"modeling_turner.{name}" for auto, name in classes.items()
    }
    remote_output, remote_hidden = pair_runs.remote[saved, auto_name]
    local_output, _ = pair_runs.local[saved, auto_name]
    saved_output, saved_hidden = pair_runs.saved[saved]
    # the backbone carried over whichever class loads it; the output is the package's, to float noise
    torch.testing.assert_close(remote_hidden, saved_hidden, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(remote_output, local_output, rtol=1e-6, atol=1e-6)
    if classes[auto_name] == model_class.__name__:
        torch.testing.assert_close(remote_output, saved_output, rtol=1e-6, atol=1e-6)


# Loads a saved folder's tokenizer where `import turner_tfm` fails, with `trust_remote_code=False`, and prints the ids
# of argv[2].
TOKENIZER_LOADER = textwrap.dedent(
    """
    import json, sys
    sys.modules["turner_tfm"] = None
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(sys.argv[1], trust_remote_code=False)
    print(json.dumps(tokenizer(sys.argv[2])["input_ids"]))
    """
)


def test_a_saved_tokenizer_loads_without_the_package_and_without_a_prompt(tmp_path):
    """A tokenizer needs no model code. transformers' `AutoTokenizer` (5.23 and 5.24) reads the folder's config first,
    whose `auto_map` names `AutoConfig` (which every Auto model class needs): with `trust_remote_code` unset and an
    open stdin it asks, and waits 15 s. `trust_remote_code=False` reads the config as a plain one and asks nothing;
    the tokenizer is the one saved."""
    turner_tfm.TurnerForCausalLM(text_config()).save_pretrained(tmp_path / "lm")
    word_tokenizer({"pad_token": "<pad>", "unk_token": "<unk>"}).save_pretrained(tmp_path / "lm")
    text = "the big cat sat on a red mat"
    read_end, write_end = os.pipe()  # a stdin that stays open (as a notebook's) until the loader is done
    try:
        result = subprocess.run(
            [sys.executable, "-I", "-c", TOKENIZER_LOADER, str(tmp_path / "lm"), text],
            cwd=tmp_path,
            env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf_home"), "PATH": "/usr/bin:/bin"},
            stdin=read_end,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        os.close(read_end)
        os.close(write_end)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Do you wish to run the custom code" not in result.stdout + result.stderr
    expected = transformers.AutoTokenizer.from_pretrained(tmp_path / "lm")(text)["input_ids"]
    assert json.loads(result.stdout.splitlines()[-1]) == expected


def test_the_saved_code_asks_a_user_for_no_package_beyond_turners_own_requirements(tmp_path):
    """Loading a folder from the Hub, transformers' remote-code loader asks the user to install every package that
    a saved file imports in a statement (`get_imports`): the code must ask for nothing an optional extra brings
    (Liger, say), or the folder loads only where that extra is installed."""
    from transformers.dynamic_module_utils import get_imports

    turner_tfm.TurnerForCausalLM(text_config()).save_pretrained(tmp_path)
    requirements = {"torch", "transformers", "huggingface_hub", "safetensors"}
    asked = {path.name: set(get_imports(path)) - set(sys.stdlib_module_names) for path in tmp_path.glob("*.py")}
    assert "modeling_turner.py" in asked and "liger.py" not in asked, sorted(asked)  # Liger's patch: installed only
    assert {name: packages for name, packages in asked.items() if packages - requirements} == {}


@pytest.mark.parametrize(
    ("saved", "loaded"), [("SequenceClassification", "MultipleChoice"), ("MultipleChoice", "TokenClassification")]
)
def test_a_classifiers_folder_loaded_for_multiple_choice_is_refused_by_its_shape_as_berts_is(saved, loaded, tmp_path):
    """Both families name the head `classifier`: the other head takes the folder only with
    `ignore_mismatched_sizes=True`, which gives it a fresh classifier of its own shape."""
    shapes = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_labels=3)
    models = {
        "turner": getattr(turner_tfm, f"TurnerFor{saved}")(text_config(is_causal=False, use_pooler=True, num_labels=3)),
        "bert": getattr(transformers, f"BertFor{saved}")(transformers.BertConfig(vocab_size=99, **shapes)),
    }
    auto_class = getattr(transformers, f"AutoModelFor{loaded}")
    for name, model in models.items():
        model.save_pretrained(tmp_path / name)
        with pytest.raises(RuntimeError, match="ignore_mismatched_sizes"):
            auto_class.from_pretrained(tmp_path / name)
        other = auto_class.from_pretrained(tmp_path / name, ignore_mismatched_sizes=True)
        assert other.classifier.weight.shape == (1 if loaded == "MultipleChoice" else 3, 32)
