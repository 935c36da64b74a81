"""Turner checkpoints as backbones: `pipeline("feature-extraction")` and `SentenceTransformer` load any Turner text
folder, and `convert` carries a sentence-transformers model's modules across, both ways, with the same embeddings."""

import contextlib
import io
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer import modules
from transformers import AutoModel, AutoTokenizer, BertConfig, BertModel

from convert.cli import main
from turner_tfm import TurnerForCausalLM, TurnerForSequenceClassification

from .convert_helpers import TOLERANCE, word_tokenizer
from .tiny import text_config

SENTENCES = ["the cat sat on the mat", "a big dog ran far away", "red", "the small blue cat ran"]
SPECIALS = {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]"}

# Runs where `turner_tfm` cannot be imported: each folder through the feature-extraction pipeline and through
# SentenceTransformer as remote code (no modules.json: the Transformer module, then its default pooling).
BACKBONE_LOADER = textwrap.dedent(
    """
    import json, sys
    sys.modules["turner_tfm"] = None
    import torch, transformers
    from sentence_transformers import SentenceTransformer
    folders, sentences = json.loads(sys.argv[1]), json.loads(sys.argv[2])
    torch.set_num_threads(int(sys.argv[3]))
    results = {}
    for folder in folders:
        extract = transformers.pipeline("feature-extraction", model=folder, trust_remote_code=True)
        assert type(extract.model).__module__.startswith("transformers_modules"), type(extract.model).__module__
        encoder = SentenceTransformer(folder, trust_remote_code=True, device="cpu")
        results[folder] = {
            "features": extract(sentences[0])[0],
            "embeddings": encoder.encode(sentences, convert_to_numpy=True).tolist(),
        }
    print("RESULT " + json.dumps(results))
    """
)


def pooled(folder: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """The backbone's features for the first sentence, and each sentence pooled as sentence-transformers does by
    default: the last real token under the causal mask (it alone has seen the whole sentence), else the masked mean.
    Computed here, with the package."""
    tokenizer, model = AutoTokenizer.from_pretrained(folder), AutoModel.from_pretrained(folder).eval()
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        features = model(**tokenizer(SENTENCES[0], return_tensors="pt")).last_hidden_state[0]
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"]
    if model.config.is_causal:
        return features, hidden[torch.arange(len(SENTENCES)), mask.sum(1) - 1]
    return features, (hidden * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True)


def test_any_turner_text_folder_is_a_feature_extractor_and_a_sentence_transformer(tmp_path):
    tokenizer = word_tokenizer(SPECIALS)
    heads = {
        "lm": TurnerForCausalLM(text_config(vocab_size=len(tokenizer))),
        "classifier": TurnerForSequenceClassification(text_config(vocab_size=len(tokenizer), is_causal=False)),
    }
    for name, model in heads.items():
        model.save_pretrained(tmp_path / name)
        tokenizer.save_pretrained(tmp_path / name)
    folders = [str(tmp_path / name) for name in heads]
    command = [sys.executable, "-I", "-c", BACKBONE_LOADER, json.dumps(folders), json.dumps(SENTENCES)]
    environment = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [*command, str(torch.get_num_threads())],
        cwd=tmp_path,
        env={**environment, "TOKENIZERS_PARALLELISM": "false"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    line = next((line for line in done.stdout.splitlines() if line.startswith("RESULT ")), None)
    assert done.returncode == 0 and line, done.stderr[-3000:]
    results = json.loads(line.removeprefix("RESULT "))
    for folder in folders:
        features, embeddings = pooled(Path(folder))
        torch.testing.assert_close(torch.tensor(results[folder]["features"]), features, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(torch.tensor(results[folder]["embeddings"]), embeddings, atol=1e-5, rtol=1e-5)


def build_sentence_bert(folder: Path) -> SentenceTransformer:
    """A tiny BERT sentence-transformer, built here: Transformer, mean Pooling, Normalize."""
    tokenizer = word_tokenizer(SPECIALS)
    sizes = dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=24)
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=len(tokenizer), max_position_embeddings=32, **sizes)).save_pretrained(
        folder / "bert"
    )
    tokenizer.save_pretrained(folder / "bert")
    transformer = modules.Transformer(str(folder / "bert"), max_seq_length=16)
    pooling = modules.Pooling(transformer.get_embedding_dimension(), "mean")
    model = SentenceTransformer(modules=[transformer, pooling, modules.Normalize()], device="cpu")
    model.save(str(folder / "source"))
    return model


def convert(*args: str) -> str:
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert main(list(args)) == 0
    return stdout.getvalue()


@pytest.fixture(scope="module")
def sentence_bert(tmp_path_factory) -> tuple[Path, SentenceTransformer]:
    root = tmp_path_factory.mktemp("sentence_bert")
    return root, build_sentence_bert(root)


def test_a_converted_sentence_transformer_embeds_the_same_both_ways(sentence_bert):
    root, source = sentence_bert
    expected = source.encode(SENTENCES, convert_to_tensor=True)
    assert torch.allclose(expected.norm(dim=-1), torch.ones(len(SENTENCES)))  # Normalize took part

    summary = convert("bert", str(root / "source"), str(root / "turner"))
    assert "sentence-transformers modules (modules.json, config_sentence_transformers.json" in summary
    assert "1_Pooling/config.json, 2_Normalize/config.json" in summary
    assert "files of SRC not carried to OUT: README.md" in summary  # the card describes the BERT model
    turner = SentenceTransformer(str(root / "turner"), trust_remote_code=True, device="cpu")
    assert type(turner[0].auto_model).__name__ == "TurnerModel"
    assert [type(module).__name__ for module in turner] == ["Transformer", "Pooling", "Normalize"]
    assert turner.max_seq_length == 16  # sentence_bert_config.json came along
    embeddings = turner.encode(SENTENCES, convert_to_tensor=True)
    torch.testing.assert_close(embeddings, expected, atol=TOLERANCE, rtol=TOLERANCE)

    convert("bert", str(root / "turner"), str(root / "back"), "--reverse")
    back = SentenceTransformer(str(root / "back"), device="cpu")
    assert type(back[0].auto_model) is BertModel
    torch.testing.assert_close(back.encode(SENTENCES, convert_to_tensor=True), expected, atol=TOLERANCE, rtol=TOLERANCE)


def test_without_its_modules_the_converted_model_pools_differently(sentence_bert, tmp_path):
    """What carrying the modules is for: the bare backbone falls back to unnormalised mean pooling."""
    root, source = sentence_bert
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors", "configuration_turner.py", "modeling_turner.py"):
        (bare / name).write_bytes((root / "turner" / name).read_bytes())
    AutoTokenizer.from_pretrained(root / "turner").save_pretrained(bare)
    fallback = SentenceTransformer(str(bare), trust_remote_code=True, device="cpu")
    difference = fallback.encode(SENTENCES, convert_to_tensor=True) - source.encode(SENTENCES, convert_to_tensor=True)
    assert difference.abs().max() > 0.1
