"""The heads BERT has beside the sequence classifier: masked LM, token classification, extractive question answering,
multiple choice. Their losses against torch's cross-entropy written out, the tied output embedding, and the clear
errors for what they cannot take."""

import inspect
import json
import re

import pytest
import torch
from transformers import AutoModelForMaskedLM

import turner_tfm
from turner_tfm import (
    TurnerForMaskedLM,
    TurnerForMultipleChoice,
    TurnerForQuestionAnswering,
    TurnerForTokenClassification,
)

from .tiny import random_ids, text_config


def encoder_config(**overrides):
    return text_config(**{"is_causal": False, **overrides})


def test_masked_lm_loss_is_the_cross_entropy_of_the_masked_tokens_only():
    model = TurnerForMaskedLM(encoder_config()).eval()
    ids = random_ids(2, 8)
    labels = torch.full_like(ids, -100)
    labels[0, 2], labels[1, 5], labels[1, 7] = 17, 40, 3
    with torch.no_grad():
        outputs = model(input_ids=ids, labels=labels)
    logits = outputs.logits
    expected = torch.stack([logits[0, 2], logits[1, 5], logits[1, 7]])
    torch.testing.assert_close(outputs.loss, torch.nn.functional.cross_entropy(expected, torch.tensor([17, 40, 3])))
    assert logits.shape == (2, 8, 99)


def test_masked_lm_sees_both_sides_of_a_token():
    model = TurnerForMaskedLM(encoder_config()).eval()
    ids = random_ids(1, 8)
    changed = ids.clone()
    changed[0, -1] = 3 if ids[0, -1] != 3 else 4
    with torch.no_grad():
        assert not torch.allclose(model(changed).logits[0, 0], model(ids).logits[0, 0])


def test_masked_lm_ties_its_output_vectors_to_the_input_embedding_unless_told_not_to(tmp_path):
    tied = TurnerForMaskedLM(encoder_config())
    assert tied.get_output_embeddings() is tied.lm_head and tied.lm_head.bias is not None
    assert tied.lm_head.weight is tied.model.embeddings.embed_tokens.weight
    tied.save_pretrained(tmp_path)
    loaded = AutoModelForMaskedLM.from_pretrained(tmp_path)
    assert loaded.lm_head.weight is loaded.model.embeddings.embed_tokens.weight
    untied = TurnerForMaskedLM(encoder_config(tie_word_embeddings=False))
    assert untied.lm_head.weight is not untied.model.embeddings.embed_tokens.weight
    tied.resize_token_embeddings(120)
    assert tied.lm_head.weight.shape == (120, 32) and tied.lm_head.bias.shape == (120,)
    assert tied.lm_head.weight is tied.model.embeddings.embed_tokens.weight


def test_a_causal_config_is_refused_by_the_masked_lm_and_left_out_of_its_folders_auto_map(tmp_path):
    with pytest.raises(ValueError, match=re.escape("is_causal=True")):
        TurnerForMaskedLM(text_config())
    TurnerForTokenClassification(text_config()).save_pretrained(tmp_path / "causal")
    TurnerForTokenClassification(encoder_config()).save_pretrained(tmp_path / "encoder")
    auto_maps = {
        name: json.loads((tmp_path / name / "config.json").read_text())["auto_map"] for name in ("causal", "encoder")
    }
    assert "AutoModelForMaskedLM" not in auto_maps["causal"]
    assert auto_maps["encoder"]["AutoModelForMaskedLM"] == "modeling_turner.TurnerForMaskedLM"
    assert auto_maps["causal"]["AutoModelForQuestionAnswering"] == "modeling_turner.TurnerForQuestionAnswering"


@pytest.mark.parametrize("is_causal", [True, False])
def test_token_classification_loss_ignores_minus_100(is_causal):
    model = TurnerForTokenClassification(text_config(is_causal=is_causal, num_labels=4)).eval()
    ids = random_ids(2, 6)
    labels = torch.tensor([[0, 3, -100, 1, 2, -100], [-100, -100, 1, 1, 0, 3]])
    with torch.no_grad():
        outputs = model(input_ids=ids, labels=labels)
    kept = labels != -100
    expected = torch.nn.functional.cross_entropy(outputs.logits[kept], labels[kept])
    torch.testing.assert_close(outputs.loss, expected)
    assert outputs.logits.shape == (2, 6, 4)


def test_question_answering_ignores_a_span_outside_the_input_as_bert_does():
    model = TurnerForQuestionAnswering(encoder_config()).eval()
    ids = random_ids(3, 7)
    with torch.no_grad():
        outputs = model(input_ids=ids, start_positions=torch.tensor([1, 30, 2]), end_positions=torch.tensor([3, 40, 6]))
        start, end = outputs.start_logits, outputs.end_logits
    cross_entropy = torch.nn.functional.cross_entropy
    rows = [0, 2]  # row 1's span lies past the 7 tokens: clamped to the ignored index, as BERT's loss does
    expected = (cross_entropy(start[rows], torch.tensor([1, 2])) + cross_entropy(end[rows], torch.tensor([3, 6]))) / 2
    torch.testing.assert_close(outputs.loss, expected)
    assert start.shape == end.shape == (3, 7)
    with torch.no_grad():  # positions of shape (batch, 1), as a multi-GPU gather leaves them
        column = model(
            input_ids=ids, start_positions=torch.tensor([[1], [30], [2]]), end_positions=torch.tensor([[3], [40], [6]])
        )
    torch.testing.assert_close(column.loss, outputs.loss)


@pytest.mark.parametrize(
    ("model_class", "targets", "message"),
    [
        (
            TurnerForMaskedLM,
            {"labels": torch.full((2, 5), 99)},
            "`labels` has 99 at row 0, position 0; token ids must be in [0, 99)",
        ),
        (
            TurnerForMaskedLM,
            {"labels": torch.zeros(2, 4, dtype=torch.long)},
            "expected integer token ids of shape (2, 5)",
        ),
        (TurnerForTokenClassification, {"labels": torch.full((2, 5), 3)}, "class ids must be in [0, 3) (num_labels)"),
        (TurnerForTokenClassification, {"labels": torch.zeros(2, 5)}, "expected integer class ids of shape (2, 5)"),
        (TurnerForTokenClassification, {"labels": torch.zeros(2, dtype=torch.long)}, "expected integer class ids"),
        (TurnerForQuestionAnswering, {"start_positions": torch.tensor([1, 2])}, "`start_positions` was given without"),
        (TurnerForQuestionAnswering, {"end_positions": torch.tensor([1, 2])}, "`end_positions` was given without"),
        (
            TurnerForQuestionAnswering,
            {"start_positions": torch.tensor([1, 2, 3]), "end_positions": torch.tensor([1, 2, 3])},
            "`start_positions` of shape (3,) and dtype torch.int64 is invalid: expected 2 integer token positions",
        ),
        (
            TurnerForQuestionAnswering,
            {"start_positions": torch.tensor([1, 2]), "end_positions": torch.tensor([1.0, 2.0])},
            "`end_positions` of shape (2,) and dtype torch.float32 is invalid",
        ),
    ],
)
def test_targets_a_head_cannot_take_are_refused_by_name(model_class, targets, message):
    model = model_class(encoder_config(num_labels=3))
    with pytest.raises(ValueError, match=re.escape(message)):
        model(input_ids=random_ids(2, 5), **targets)


def choices(batch: int = 2, count: int = 4, length: int = 5) -> torch.Tensor:
    return random_ids(batch * count, length).view(batch, count, length)


def test_multiple_choice_scores_each_choice_alone_and_its_loss_is_the_cross_entropy_over_choices():
    model = TurnerForMultipleChoice(encoder_config(use_pooler=True)).eval()
    ids, labels = choices(3), torch.tensor([1, -100, 3])
    with torch.no_grad():
        outputs = model(input_ids=ids, labels=labels)
        alone = torch.stack([model(input_ids=ids[:, [choice]]).logits[:, 0] for choice in range(4)], dim=1)
    assert outputs.logits.shape == (3, 4)
    torch.testing.assert_close(outputs.logits, alone)  # a choice's score reads that choice only
    expected = torch.nn.functional.cross_entropy(outputs.logits[[0, 2]], torch.tensor([1, 3]))
    torch.testing.assert_close(outputs.loss, expected)


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ({"input_ids": random_ids(2, 5)}, "`input_ids` of shape (2, 5) is invalid: a multiple-choice head takes"),
        ({"labels": torch.tensor([0, 4])}, "`labels` has 4 at row 1; choice indices must be in [0, 4)"),
        ({"labels": torch.tensor([0.0, 1.0])}, "`labels` of shape (2,) and dtype torch.float32 is invalid"),
        ({"attention_mask": torch.ones(2, 5)}, "`attention_mask` of shape (2, 5) is invalid: expected (2, 4, 5)"),
        ({"input_ids": choices().tolist()}, "`input_ids` must be a torch.Tensor, got a list"),
        ({"input_ids": None}, "Pass exactly one of `input_ids` and `inputs_embeds`; got neither."),
        ({"input_ids": choices().masked_fill(choices() > -1, 99)}, "`input_ids` has 99 at row 0, position 0"),
    ],
)
def test_multiple_choice_inputs_it_cannot_take_are_refused_by_name(inputs, message):
    model = TurnerForMultipleChoice(encoder_config())
    with pytest.raises((ValueError, TypeError), match=re.escape(message)):
        model(**{"input_ids": choices(), **inputs})


HEADS = [name for name in turner_tfm.__all__ if name.startswith("TurnerFor")]


@pytest.mark.parametrize("name", HEADS)
def test_each_heads_forward_documents_every_argument(name):
    model_class = getattr(turner_tfm, name)
    parameters = [name for name in inspect.signature(model_class.forward).parameters if name not in ("self", "kwargs")]
    documented = re.findall(r"^ +(\w+) \(`", model_class.forward.__doc__.split("Returns:")[0], flags=re.MULTILINE)
    assert documented == parameters
