"""Model cards: every template fills from a config and a run, parses with `huggingface_hub.ModelCard`, and ships in
the wheel so a normal (non-editable) install can write cards."""

import re
import sys
from pathlib import Path

import pytest
import yaml
from huggingface_hub import ModelCard

from turner_tfm import TurnerConfig
from turner_tfm.cards import TASKS, render_model_card, retarget_model_card, template_text, write_model_card

REPO = Path(__file__).resolve().parents[1]


SIZES = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4}


def config_for(task: str) -> TurnerConfig:
    sizes = SIZES
    if task == "image-classification":
        return TurnerConfig(image_size=8, patch_size=2, is_causal=False, id2label={0: "cat", 1: "dog"}, **sizes)
    if task == "text-classification":
        return TurnerConfig(vocab_size=50, is_causal=False, id2label={0: "code", 1: "prose"}, **sizes)
    if task == "token-classification":
        return TurnerConfig(vocab_size=50, is_causal=False, id2label={0: "cat", 1: "dog"}, **sizes)
    if task in ("fill-mask", "question-answering", "multiple-choice"):
        return TurnerConfig(vocab_size=50, is_causal=False, **sizes)
    return TurnerConfig(vocab_size=50, **sizes)


@pytest.mark.parametrize("task", TASKS)
def test_each_template_fills_and_parses_with_the_hub_metadata(task: str, tmp_path: Path) -> None:
    metric = {"question-answering": "exact_match"}.get(task, "accuracy" if "classification" in task else "perplexity")
    path = write_model_card(
        tmp_path,
        config_for(task),
        task=task,
        model_id="me/tiny",
        dataset_name="My data",
        dataset_id="me/my-data",
        results={metric: 0.9712345},
        training={"optimiser steps": 12, "learning rate": "0.001"},
        base_model="me/base",
        num_parameters=12345,
        example_input='say "hi"',
        example_context='a "quoted" context',
    )
    card = ModelCard.load(path)
    data = card.data
    assert (data.library_name, data.pipeline_tag, data.license) == ("transformers", task, "apache-2.0")
    assert {"turner", "custom_code"} <= set(data.tags)
    assert data.datasets == ["me/my-data"] and data.metrics == [metric] and data.base_model == "me/base"
    (result,) = data.eval_results
    assert (result.task_type, result.dataset_name, result.metric_type) == (task, "My data", metric)
    assert result.metric_value == 0.9712
    assert "${" not in card.text and 'model_id = "me/tiny"' in card.text and "trust_remote_code=True" in card.text
    assert "| parameters | 12,345 |" in card.text and "| optimiser steps | 12 |" in card.text
    assert "fine-tuned from `me/base`" in card.text
    assert 'say \\"hi\\"' in card.text  # quoted safely inside the usage snippet
    if task.endswith("classification"):
        assert "`cat`, `dog`" in card.text or "`code`, `prose`" in card.text
    if task == "question-answering":  # no pipeline in transformers 5: the snippet reads the span itself
        assert 'question, context = "say \\"hi\\"", "a \\"quoted\\" context"' in card.text, card.text


# the card task of each head (TurnerModel, the backbone, has none of its own)
HEAD_TASKS = {
    "TurnerForCausalLM": "text-generation",
    "TurnerForSequenceClassification": "text-classification",
    "TurnerForImageClassification": "image-classification",
    "TurnerForMaskedLM": "fill-mask",
    "TurnerForTokenClassification": "token-classification",
    "TurnerForQuestionAnswering": "question-answering",
    "TurnerForMultipleChoice": "multiple-choice",
}


def test_every_head_has_a_card_task() -> None:
    import turner_tfm

    assert {name for name in turner_tfm.__all__ if name.startswith("TurnerFor")} == set(HEAD_TASKS)
    assert sorted(HEAD_TASKS.values()) == sorted(TASKS)


def table_rows(text: str) -> dict[str, list[str]]:
    """Every Markdown table row of a card, keyed by its first cell (backticks dropped), the other cells as written."""
    rows = [line.strip("|").split("|") for line in text.splitlines() if line.startswith("| ")]
    return {cells[0].strip().strip("`"): [cell.strip().strip("`") for cell in cells[1:]] for cells in rows}


def test_the_model_section_is_read_from_the_config_and_names_the_switches_it_changes() -> None:
    config = TurnerConfig(
        vocab_size=50,
        hidden_size=48,
        num_hidden_layers=3,
        num_attention_heads=4,
        normalization="rmsnorm",
        position_embedding_type="rotary",
        share_query_key=True,
        norm_position="post",
        mlp_hidden_layers=2,
        intermediate_size=72,
    )
    card = render_model_card(config, task="text-generation", model_id="me/tiny", dataset_name="d")
    rows = table_rows(card.text)
    for name in ("num_hidden_layers", "hidden_size", "num_attention_heads", "head_dim", "intermediate_size"):
        (label,) = [key for key in rows if f"(`{name}`)" in key]
        assert rows[label] == [str(getattr(config, name))], label
    assert rows["head size K (`head_dim`)"] == ["12"] and rows["MLP width (`intermediate_size`)"] == ["72"]
    assert rows["inputs"] == ["50 tokens, up to 1024 positions"]
    switches = {
        "normalization": "rmsnorm",
        "norm_position": "post",
        "position_embedding_type": "rotary",
        "position_embedding_combine": "add",
        "share_query_key": "True",
        "mlp_hidden_layers": "2",
        "is_causal": "True",
    }
    for name, value in switches.items():
        assert rows[name][0] == value, (name, rows[name])
    assert rows["normalization"][1:] == ["layernorm", "figure 5, TokenNorm (LayerNorm) or another norm"]
    assert rows["is_causal"][1] == "derived"
    changed = re.search(r"The paper's switches changed from the standard block: (.*)\.", card.text).group(1)
    expected = ["position_embedding_type", "share_query_key", "normalization", "norm_position", "mlp_hidden_layers"]
    assert changed == ", ".join(f"`{name}`" for name in expected)
    assert "LayerNorm |" not in card.text and "use_cache" not in rows and "return_dict" not in rows


@pytest.mark.parametrize("task", TASKS)
def test_a_default_config_changes_no_switch(task: str) -> None:
    config = config_for(task)
    text = render_model_card(config, task=task, model_id="m", dataset_name="d").text
    rows = table_rows(text)
    assert "The paper's switches changed from the standard block: none." in text
    assert rows["normalization"][:2] == ["layernorm", "layernorm"] and rows["norm_position"][:2] == ["pre", "pre"]
    assert rows["is_causal"][0] == str(task == "text-generation")
    assert rows["head size K (`head_dim`)"] == [str(config.hidden_size // config.num_attention_heads)]
    assert rows["MLP width (`intermediate_size`)"] == [str(4 * config.hidden_size)]


def test_templates_keep_their_fixed_metadata_in_yaml_front_matter() -> None:
    for task in TASKS:
        text = template_text(task)
        front_matter = yaml.safe_load(text.split("---\n")[1])
        assert front_matter["pipeline_tag"] == task and front_matter["library_name"] == "transformers"


def test_bad_card_arguments_are_named() -> None:
    with pytest.raises(ValueError, match=r"`task`='translation' is invalid; choose one of"):
        template_text("translation")
    with pytest.raises(ValueError, match=r"`results` has unknown metrics \['bleu'\]"):
        render_model_card(
            config_for("text-generation"), task="text-generation", model_id="m", dataset_name="d", results={"bleu": 1.0}
        )


def test_retarget_points_the_usage_snippet_at_the_hub_repo() -> None:
    card = render_model_card(config_for("text-generation"), task="text-generation", model_id="./out", dataset_name="d")
    moved = retarget_model_card(card, "alice/model")
    assert 'model_id = "alice/model"' in moved.text and "./out" not in moved.text
    assert moved.data.pipeline_tag == "text-generation"


def test_the_wheel_ships_the_templates_and_a_plain_install_writes_cards(installed_wheel, tmp_path: Path) -> None:
    for task in TASKS:
        assert f"turner_tfm/model_cards/{task}.md" in installed_wheel.names
    assert "turner_tfm/model_cards/README.md" not in installed_wheel.names  # it documents the repository's folder
    site = installed_wheel.site
    script = (
        "import turner_tfm, turner_tfm.cards as c; "
        f"assert turner_tfm.__file__.startswith({str(site)!r}), turner_tfm.__file__; "
        "cfg = turner_tfm.TurnerConfig(vocab_size=9, hidden_size=8, num_hidden_layers=1, num_attention_heads=2); "
        "print(c.render_model_card(cfg, task='text-generation', model_id='m', dataset_name='d').data.pipeline_tag)"
    )
    result = installed_wheel.run([sys.executable, "-c", script], cwd=tmp_path)
    assert result.returncode == 0 and result.stdout.strip() == "text-generation", result.stderr[-3000:]


def test_the_multiple_choice_cards_snippet_picks_the_choice_the_model_scores_highest(tmp_path, monkeypatch, capsys):
    """The card's usage code, run as a user runs it on a saved folder: the choice it prints is the model's argmax."""
    import torch

    from turner_tfm import TurnerForMultipleChoice

    from .convert_helpers import word_tokenizer

    tokenizer = word_tokenizer({"pad_token": "[PAD]", "unk_token": "[UNK]"})
    torch.manual_seed(0)
    model = TurnerForMultipleChoice(TurnerConfig(vocab_size=len(tokenizer), is_causal=False, pad_token_id=0, **SIZES))
    model.save_pretrained(tmp_path / "chooser")
    tokenizer.save_pretrained(tmp_path / "chooser")
    question, choices = "the cat", ["sat on the mat", "the dog", "a cat sat"]
    card = render_model_card(
        model.config,
        task="multiple-choice",
        model_id="chooser",
        dataset_name="words",
        example_input=question,
        example_context=" | ".join(choices),
    )
    snippet = re.search(r"```python\n(.*?)```", card.text, re.DOTALL).group(1)
    monkeypatch.chdir(tmp_path)
    exec(compile(snippet, "card-snippet", "exec"), {})
    inputs = tokenizer([question] * 3, choices, padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = model.eval()(**{name: value.unsqueeze(0) for name, value in inputs.items()}).logits
    assert (
        capsys.readouterr().out.strip().splitlines()[-1] == choices[int(logits.argmax())]
    )  # (DeepSpeed may log first)
