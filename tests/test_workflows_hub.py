"""Publishing to the Hub and loading back, end to end against a real HTTP server on 127.0.0.1 (`hub_server.py`):
push_to_hub.py creates the repo and commits (small files inline, weights through LFS), then a process where
`turner_tfm` cannot be imported loads the repo by id with `trust_remote_code=True` and gets the same outputs."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard
from PIL import Image
from transformers import (
    AutoImageProcessor,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForImageClassification,
    AutoTokenizer,
)
from transformers.dynamic_module_utils import get_relative_imports

from turner_tfm import TurnerForCausalLM, modeling_turner

from .hub_server import HubServer
from .test_workflows_classifiers import write_digit_folder
from .tiny import text_config
from .workflow_utils import TINY_MODEL, WORKFLOWS_PAGE, listed_files, run_example, script_env

# the machinery modeling_turner.py imports (`from .x import y`, its config aside), which save_pretrained copies with it
SIBLING_MODULES = {f"{name}.py" for name in get_relative_imports(modeling_turner.__file__)}
SIBLING_MODULES -= {"configuration_turner.py"}

TOKEN = "hf_test_token"

# Run in a fresh process, in a folder outside the repository, with turner_tfm made unimportable: everything the
# model needs must come from the Hub repo. Prints the outputs as JSON.
LOAD_FROM_HUB = """
import json, sys
sys.modules["turner_tfm"] = None
import torch
from PIL import Image
from transformers import pipeline, AutoConfig, AutoModel
from transformers import AutoModelForCausalLM, AutoModelForImageClassification, AutoTokenizer, AutoImageProcessor
from huggingface_hub import ModelCard

repo_id, kind, example = sys.argv[1:4]
card = ModelCard.load(repo_id)
result = {"pipeline_tag": card.data.pipeline_tag, "card_loads": 'model_id = "' + repo_id + '"' in card.text}
if kind == "text":
    tokenizer = AutoTokenizer.from_pretrained(repo_id, trust_remote_code=True)
    model = AutoModelForCausalLM.from_pretrained(repo_id, trust_remote_code=True).eval()
    inputs = tokenizer(example, return_tensors="pt")
    generator = pipeline("text-generation", model=repo_id, trust_remote_code=True)
    result["generated"] = generator(example, max_new_tokens=5, do_sample=False)[0]["generated_text"]
else:
    processor = AutoImageProcessor.from_pretrained(repo_id, trust_remote_code=True)
    model = AutoModelForImageClassification.from_pretrained(repo_id, trust_remote_code=True).eval()
    inputs = processor(images=Image.open(example), return_tensors="pt")
    classifier = pipeline("image-classification", model=repo_id, trust_remote_code=True)
    result["top_label"] = classifier(Image.open(example))[0]["label"]
backbone = AutoModel.from_pretrained(repo_id, trust_remote_code=True).eval()  # auto_map names every Auto class
with torch.no_grad():
    result["logits"] = model(**inputs).logits.tolist()
    result["features"] = backbone(**inputs).last_hidden_state.tolist()
result["model_module"] = type(model).__module__
print("RESULT " + json.dumps(result))
"""


@pytest.fixture
def hub() -> HubServer:
    with HubServer(token=TOKEN) as server:
        yield server


def hub_env(tmp_path: Path, hub: HubServer, token: str | None = TOKEN) -> dict[str, str]:
    """A user's environment pointed at the local Hub (HF_ENDPOINT must be set before huggingface_hub is imported,
    so only subprocesses use it). The local server speaks LFS but not Xet, so Xet is off."""
    extra = {"HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "0", "HF_HUB_DISABLE_XET": "1"}
    if token is not None:
        extra["HF_TOKEN"] = token
    return script_env(tmp_path, **extra)


def load_from_hub(tmp_path: Path, hub: HubServer, repo_id: str, kind: str, example: str) -> dict:
    """Run `LOAD_FROM_HUB` where turner_tfm is not importable, with a fresh cache; return its result."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = hub_env(elsewhere, hub)
    command = [sys.executable, "-c", LOAD_FROM_HUB, repo_id, kind, example]
    result = subprocess.run(command, cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)
    line = next((line for line in result.stdout.splitlines() if line.startswith("RESULT ")), None)
    assert result.returncode == 0 and line, result.stdout[-2000:] + result.stderr[-4000:]
    return json.loads(line.removeprefix("RESULT "))


def test_a_pushed_language_model_loads_by_repo_id_without_turner_tfm(tmp_path: Path, hub: HubServer) -> None:
    (tmp_path / "text.txt").write_text("The Zen of Python, by Tim Peters. Beautiful is better than ugly.\n" * 30)
    run_example(
        "train_causal_lm.py",
        *("--train-file", "text.txt", "--output-dir", "lm", "--max-steps", "5", "--block-size", "32"),
        *("--max-new-tokens", "10", *TINY_MODEL),
        tmp_path=tmp_path,
    )
    output = run_example(
        "push_to_hub.py",
        "--model-dir",
        "lm",
        "--repo-id",
        "alice/tiny-lm",
        tmp_path=tmp_path,
        env=hub_env(tmp_path, hub),
    )
    assert f"pushed {9 + len(SIBLING_MODULES)} files to {hub.url}/alice/tiny-lm" in output
    page = WORKFLOWS_PAGE.read_text()
    documented = listed_files(page, "pushed ")
    assert listed_files(output, "pushed ") == documented and f"pushed {len(documented)} files" in page
    assert 'load it anywhere: AutoModelForCausalLM.from_pretrained("alice/tiny-lm", trust_remote_code=True)' in output

    files = hub.repos["alice/tiny-lm"].snapshot("main")[1]
    expected = {"config.json", "configuration_turner.py", "modeling_turner.py", "model.safetensors", "README.md"}
    assert set(files) >= SIBLING_MODULES, "the modules modeling_turner.py imports were not pushed with it"
    assert expected | {"tokenizer.json", "tokenizer_config.json", ".gitattributes"} <= set(files)
    assert files["model.safetensors"].lfs and not files["config.json"].lfs  # weights went through LFS
    config = json.loads(files["config.json"].content)
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_turner.TurnerForCausalLM"
    assert config["auto_map"]["AutoModel"] == "modeling_turner.TurnerModel"
    assert config["auto_map"]["AutoModelForSequenceClassification"] == "modeling_turner.TurnerForSequenceClassification"
    assert ("POST", "/api/models/alice/tiny-lm/commit/main") in hub.requests

    remote = load_from_hub(tmp_path, hub, "alice/tiny-lm", "text", "Beautiful is")
    assert remote["model_module"].startswith("transformers_modules.")  # the code came from the repo
    assert remote["pipeline_tag"] == "text-generation" and remote["card_loads"]
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "lm")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "lm").eval()
    inputs = tokenizer("Beautiful is", return_tensors="pt")
    with torch.no_grad():
        local_logits = model(**inputs).logits
        features = AutoModel.from_pretrained(tmp_path / "lm").eval()(**inputs).last_hidden_state
    torch.testing.assert_close(torch.tensor(remote["logits"]), local_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.tensor(remote["features"]), features, atol=1e-5, rtol=1e-5)
    assert remote["generated"].startswith("Beautiful is") and len(remote["generated"]) == len("Beautiful is") + 5


def test_a_training_script_pushes_with_the_trainer_and_the_hub_gets_its_model_card(tmp_path: Path, hub: HubServer):
    """`--push_to_hub --hub_model_id`, TrainingArguments' own flags: the Trainer creates the repo and uploads the saved
    folder (with a card of its own), then the script's filled card replaces that one."""
    (tmp_path / "text.txt").write_text("The Zen of Python, by Tim Peters. Beautiful is better than ugly.\n" * 30)
    output = run_example(
        "train_causal_lm.py",
        *("--train-file", "text.txt", "--output-dir", "lm", "--max-steps", "3", "--block-size", "32"),
        *("--max-new-tokens", "5", "--push_to_hub", "--hub_model_id", "alice/trained-lm", *TINY_MODEL),
        tmp_path=tmp_path,
        env=hub_env(tmp_path, hub),
    )
    assert "pushed to the Hub: alice/trained-lm" in output
    files = hub.repos["alice/trained-lm"].snapshot("main")[1]
    assert {"config.json", "model.safetensors", "tokenizer.json", "README.md"} | SIBLING_MODULES <= set(files)
    assert files["README.md"].content == (tmp_path / "lm" / "README.md").read_bytes()  # the script's card, last
    remote = load_from_hub(tmp_path, hub, "alice/trained-lm", "text", "Beautiful is")
    assert remote["pipeline_tag"] == "text-generation" and remote["card_loads"]  # its usage names the repo
    assert remote["model_module"].startswith("transformers_modules.")


def test_a_pushed_image_classifier_brings_its_processor(tmp_path: Path, hub: HubServer) -> None:
    write_digit_folder(tmp_path / "digits", classes=(3, 8), per_class=10)
    run_example(
        "train_image_classifier.py",
        *("--train-dir", "digits", "--output-dir", "img", "--num-train-epochs", "1", "--patch-size", "4", *TINY_MODEL),
        tmp_path=tmp_path,
    )
    run_example(
        "push_to_hub.py", "--model-dir", "img", "--repo-id", "bob/digits", tmp_path=tmp_path, env=hub_env(tmp_path, hub)
    )
    assert "preprocessor_config.json" in hub.repos["bob/digits"].snapshot("main")[1]

    example = str(tmp_path / "digits" / "8" / "0.png")
    remote = load_from_hub(tmp_path, hub, "bob/digits", "image", example)
    assert remote["pipeline_tag"] == "image-classification" and remote["top_label"] in {"3", "8"}
    processor = AutoImageProcessor.from_pretrained(tmp_path / "img")
    model = AutoModelForImageClassification.from_pretrained(tmp_path / "img").eval()
    inputs = processor(images=Image.open(example), return_tensors="pt")
    with torch.no_grad():
        local_logits = model(**inputs).logits
        features = AutoModel.from_pretrained(tmp_path / "img").eval()(**inputs).last_hidden_state
    torch.testing.assert_close(torch.tensor(remote["logits"]), local_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.tensor(remote["features"]), features, atol=1e-5, rtol=1e-5)


def test_push_to_hub_needs_a_valid_token_and_a_complete_folder(tmp_path: Path, hub: HubServer) -> None:
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "config.json").write_text("{}")
    output = run_example(
        "push_to_hub.py",
        "--model-dir",
        "half",
        "--repo-id",
        "a/b",
        tmp_path=tmp_path,
        env=hub_env(tmp_path, hub),
        expect_failure=True,
    )
    assert "argument --model-dir: 'half' is not valid: it lacks configuration_turner.py" in output

    TurnerForCausalLM(text_config()).save_pretrained(tmp_path / "partial")
    (tmp_path / "partial" / "tokenizer.json").write_text("{}")
    ModelCard("---\nlicense: mit\n---\n# m\n").save(tmp_path / "partial" / "README.md")
    (tmp_path / "partial" / "checks_turner.py").unlink()
    output = run_example(
        *("push_to_hub.py", "--model-dir", "partial", "--repo-id", "a/b"),
        tmp_path=tmp_path,
        env=hub_env(tmp_path, hub),
        expect_failure=True,
    )
    assert "it lacks checks_turner.py (imported by modeling_turner.py)" in output

    folder = tmp_path / "model"
    folder.mkdir()
    for name in ("configuration_turner.py", "modeling_turner.py", "model.safetensors", "tokenizer.json"):
        (folder / name).write_text("x")
    (folder / "config.json").write_text(json.dumps({"model_type": "turner", "auto_map": {"AutoModel": "m.M"}}))
    ModelCard("---\nlicense: mit\n---\n# m\n").save(folder / "README.md")
    output = run_example(
        "push_to_hub.py",
        *("--model-dir", "model", "--repo-id", "a/b"),
        tmp_path=tmp_path,
        env=hub_env(tmp_path, hub, token=None),
        expect_failure=True,
    )
    assert "argument --token: no Hub token found" in output
    output = run_example(
        "push_to_hub.py",
        *("--model-dir", "model", "--repo-id", "a/b", "--token", "hf_wrong"),
        tmp_path=tmp_path,
        env=hub_env(tmp_path, hub, token=None),
        expect_failure=True,
    )
    assert f"push_to_hub.py: the Hub at {hub.url} refused: Client error '401 Unauthorized'" in output
    assert "Invalid credentials" in output and "Traceback" not in output
    assert "a/b" not in hub.repos
