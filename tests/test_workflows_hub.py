"""Publishing to the Hub and loading back, end to end against a real HTTP server on 127.0.0.1 (`hub_server.py`):
push_to_hub.py creates the repo and commits (small files inline, weights through LFS), then a process where
`turner_tfm` cannot be imported loads the repo by id with `trust_remote_code=True` and gets the same outputs."""

import json
import subprocess
import sys
from dataclasses import dataclass
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
from .workflow_utils import TINY_MODEL, WORKFLOWS_PAGE, listed_files, run_examples, script_env

# the machinery modeling_turner.py imports (`from .x import y`, its config aside), which save_pretrained copies with it
SIBLING_MODULES = {f"{name}.py" for name in get_relative_imports(modeling_turner.__file__)}
SIBLING_MODULES -= {"configuration_turner.py"}

TOKEN = "hf_test_token"

# Run in a fresh process, in a folder outside the repository, with turner_tfm made unimportable: everything the
# models need must come from the Hub repos. Loads each [repo_id, kind, example] of the JSON list in argv[1]; prints
# the outputs, by repo id, as JSON.
LOAD_FROM_HUB = """
import json, sys
sys.modules["turner_tfm"] = None
import torch
from PIL import Image
from transformers import pipeline, AutoConfig, AutoModel
from transformers import AutoModelForCausalLM, AutoModelForImageClassification, AutoTokenizer, AutoImageProcessor
from huggingface_hub import ModelCard

results = {}
for repo_id, kind, example in json.loads(sys.argv[1]):
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
    results[repo_id] = result
print("RESULT " + json.dumps(results))
"""


def hub_env(tmp_path: Path, hub: HubServer, token: str | None = TOKEN) -> dict[str, str]:
    """A user's environment pointed at the local Hub (HF_ENDPOINT must be set before huggingface_hub is imported,
    so only subprocesses use it). The local server speaks LFS but not Xet, so Xet is off."""
    extra = {"HF_ENDPOINT": hub.url, "HF_HUB_OFFLINE": "0", "HF_HUB_DISABLE_XET": "1"}
    if token is not None:
        extra["HF_TOKEN"] = token
    return script_env(tmp_path, **extra)


def load_from_hub(tmp_path: Path, hub: HubServer, loads: list[tuple[str, str, str]]) -> dict[str, dict]:
    """Run `LOAD_FROM_HUB` for each (repo_id, kind, example) of `loads` where turner_tfm is not importable, with a
    fresh cache; return its results by repo id."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = hub_env(elsewhere, hub)
    command = [sys.executable, "-c", LOAD_FROM_HUB, json.dumps(loads)]
    result = subprocess.run(command, cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)
    line = next((line for line in result.stdout.splitlines() if line.startswith("RESULT ")), None)
    assert result.returncode == 0 and line, result.stdout[-2000:] + result.stderr[-4000:]
    return json.loads(line.removeprefix("RESULT "))


@dataclass(frozen=True)
class Published:
    """What the publishing runs left: their folder, the Hub they pushed to, what each run printed (by name), and what
    a process without turner_tfm got from each repo (by repo id)."""

    folder: Path
    hub: HubServer
    printed: dict[str, str]
    remote: dict[str, dict]


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> Published:
    """The three publishing stories, run once for the tests below: a language model and an image classifier trained,
    then pushed with push_to_hub.py; a language model trained and pushed by the Trainer (`--push_to_hub`); then all
    three loaded by repo id where turner_tfm cannot be imported. The runs share one interpreter (`run_examples`) and
    the loads another: each interpreter costs ~8 s of imports, and they are not what is tested here."""
    folder = tmp_path_factory.mktemp("published")
    (folder / "text.txt").write_text("The Zen of Python, by Tim Peters. Beautiful is better than ugly.\n" * 30)
    write_digit_folder(folder / "digits", classes=(3, 8), per_class=10)
    lm_run = ("--train-file", "text.txt", "--block-size", "32", *TINY_MODEL)
    runs = {
        "train lm": ("train_causal_lm.py", *lm_run, "--output-dir", "lm", "--max-steps", "5", "--max-new-tokens", "10"),
        "train img": (
            "train_image_classifier.py",
            *("--train-dir", "digits", "--output-dir", "img", "--num-train-epochs", "1", "--patch-size", "4"),
            *TINY_MODEL,
        ),
        "train and push lm": (
            "train_causal_lm.py",
            *(*lm_run, "--output-dir", "trained-lm", "--max-steps", "3", "--max-new-tokens", "5"),
            *("--push_to_hub", "--hub_model_id", "alice/trained-lm"),
        ),
        "push lm": ("push_to_hub.py", "--model-dir", "lm", "--repo-id", "alice/tiny-lm"),
        "push img": ("push_to_hub.py", "--model-dir", "img", "--repo-id", "bob/digits"),
    }
    with HubServer(token=TOKEN) as hub:
        printed = run_examples(list(runs.values()), tmp_path=folder, env=hub_env(folder, hub), timeout=600)
        loads = [("alice/tiny-lm", "text", "Beautiful is"), ("alice/trained-lm", "text", "Beautiful is")]
        loads.append(("bob/digits", "image", str(folder / "digits" / "8" / "0.png")))
        yield Published(folder, hub, dict(zip(runs, printed, strict=True)), load_from_hub(folder, hub, loads))


def test_a_pushed_language_model_loads_by_repo_id_without_turner_tfm(published: Published) -> None:
    hub, output, remote = published.hub, published.printed["push lm"], published.remote["alice/tiny-lm"]
    assert f"pushed {9 + len(SIBLING_MODULES)} files to {hub.url}/alice/tiny-lm" in output, output[-2000:]
    page = WORKFLOWS_PAGE.read_text()
    documented = listed_files(page, "pushed ")
    assert listed_files(output, "pushed ") == documented, "push_to_hub.py pushed other files than the page shows"
    assert f"pushed {len(documented)} files" in page, "the page's count of pushed files is not its list's length"
    usage = 'load it anywhere: AutoModelForCausalLM.from_pretrained("alice/tiny-lm", trust_remote_code=True)'
    assert usage in output, output[-2000:]

    files = hub.repos["alice/tiny-lm"].snapshot("main")[1]
    expected = {"config.json", "configuration_turner.py", "modeling_turner.py", "model.safetensors", "README.md"}
    assert set(files) >= SIBLING_MODULES, "the modules modeling_turner.py imports were not pushed with it"
    assert expected | {"tokenizer.json", "tokenizer_config.json", ".gitattributes"} <= set(files), sorted(files)
    assert files["model.safetensors"].lfs and not files["config.json"].lfs, "the weights did not go through LFS"
    config = json.loads(files["config.json"].content)
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_turner.TurnerForCausalLM", config["auto_map"]
    assert config["auto_map"]["AutoModel"] == "modeling_turner.TurnerModel", config["auto_map"]
    classifier = "modeling_turner.TurnerForSequenceClassification"
    assert config["auto_map"]["AutoModelForSequenceClassification"] == classifier, config["auto_map"]
    assert ("POST", "/api/models/alice/tiny-lm/commit/main") in hub.requests, "no commit reached the Hub"

    assert remote["model_module"].startswith("transformers_modules."), "the model's code did not come from the repo"
    assert remote["pipeline_tag"] == "text-generation" and remote["card_loads"], "the card does not name the repo"
    lm = published.folder / "lm"
    tokenizer = AutoTokenizer.from_pretrained(lm)
    model = AutoModelForCausalLM.from_pretrained(lm).eval()
    inputs = tokenizer("Beautiful is", return_tensors="pt")
    with torch.no_grad():
        local_logits = model(**inputs).logits
        features = AutoModel.from_pretrained(lm).eval()(**inputs).last_hidden_state
    torch.testing.assert_close(torch.tensor(remote["logits"]), local_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.tensor(remote["features"]), features, atol=1e-5, rtol=1e-5)
    generated = remote["generated"]
    assert generated.startswith("Beautiful is") and len(generated) == len("Beautiful is") + 5, generated


def test_a_training_script_pushes_with_the_trainer_and_the_hub_gets_its_model_card(published: Published) -> None:
    """`--push_to_hub --hub_model_id`, TrainingArguments' own flags: the Trainer creates the repo and uploads the saved
    folder (with a card of its own), then the script's filled card replaces that one."""
    output, remote = published.printed["train and push lm"], published.remote["alice/trained-lm"]
    assert "pushed to the Hub: alice/trained-lm" in output, output[-2000:]
    files = published.hub.repos["alice/trained-lm"].snapshot("main")[1]
    expected = {"config.json", "model.safetensors", "tokenizer.json", "README.md"} | SIBLING_MODULES
    assert expected <= set(files), sorted(files)
    card = (published.folder / "trained-lm" / "README.md").read_bytes()
    assert files["README.md"].content == card, "the Hub's card is not the script's (pushed last)"
    assert remote["pipeline_tag"] == "text-generation" and remote["card_loads"], "the card does not name the repo"
    assert remote["model_module"].startswith("transformers_modules."), "the model's code did not come from the repo"


def test_a_pushed_image_classifier_brings_its_processor(published: Published) -> None:
    files = published.hub.repos["bob/digits"].snapshot("main")[1]
    assert "preprocessor_config.json" in files, sorted(files)

    remote, img = published.remote["bob/digits"], published.folder / "img"
    assert remote["pipeline_tag"] == "image-classification" and remote["top_label"] in {"3", "8"}, remote["top_label"]
    processor = AutoImageProcessor.from_pretrained(img)
    model = AutoModelForImageClassification.from_pretrained(img).eval()
    inputs = processor(images=Image.open(published.folder / "digits" / "8" / "0.png"), return_tensors="pt")
    with torch.no_grad():
        local_logits = model(**inputs).logits
        features = AutoModel.from_pretrained(img).eval()(**inputs).last_hidden_state
    torch.testing.assert_close(torch.tensor(remote["logits"]), local_logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.tensor(remote["features"]), features, atol=1e-5, rtol=1e-5)


@pytest.fixture
def hub() -> HubServer:
    with HubServer(token=TOKEN) as server:
        yield server


def test_push_to_hub_needs_a_valid_token_and_a_complete_folder(tmp_path: Path, hub: HubServer) -> None:
    """Four refused pushes, run in one interpreter (`run_examples`): a folder without the config's code, one without a
    module modeling_turner.py imports (both refused before the token is looked for), no token, a wrong token."""
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "config.json").write_text("{}")

    TurnerForCausalLM(text_config()).save_pretrained(tmp_path / "partial")
    (tmp_path / "partial" / "tokenizer.json").write_text("{}")
    ModelCard("---\nlicense: mit\n---\n# m\n").save(tmp_path / "partial" / "README.md")
    (tmp_path / "partial" / "checks_turner.py").unlink()

    folder = tmp_path / "model"
    folder.mkdir()
    for name in ("configuration_turner.py", "modeling_turner.py", "model.safetensors", "tokenizer.json"):
        (folder / name).write_text("x")
    (folder / "config.json").write_text(json.dumps({"model_type": "turner", "auto_map": {"AutoModel": "m.M"}}))
    ModelCard("---\nlicense: mit\n---\n# m\n").save(folder / "README.md")

    half, partial, no_token, wrong_token = run_examples(
        [
            ("push_to_hub.py", "--model-dir", "half", "--repo-id", "a/b"),
            ("push_to_hub.py", "--model-dir", "partial", "--repo-id", "a/b"),
            ("push_to_hub.py", "--model-dir", "model", "--repo-id", "a/b"),
            ("push_to_hub.py", "--model-dir", "model", "--repo-id", "a/b", "--token", "hf_wrong"),
        ],
        tmp_path=tmp_path,
        env=hub_env(tmp_path, hub, token=None),
        expect_failure=True,
    )
    assert "argument --model-dir: 'half' is not valid: it lacks configuration_turner.py" in half, half[-2000:]
    assert "it lacks checks_turner.py (imported by modeling_turner.py)" in partial, partial[-2000:]
    assert "argument --token: no Hub token found" in no_token, no_token[-2000:]
    refused = f"push_to_hub.py: the Hub at {hub.url} refused: Client error '401 Unauthorized'"
    assert refused in wrong_token, wrong_token[-2000:]
    assert "Invalid credentials" in wrong_token and "Traceback" not in wrong_token, wrong_token[-2000:]
    assert "a/b" not in hub.repos, "a repo was created without a valid token"
