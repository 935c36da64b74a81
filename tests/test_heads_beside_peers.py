"""Every head takes what its in-library peer takes (issue 66, item 7), each beside that peer: `use_cache`, which TRL's
trainers pass to every model; a masked LM's folder loaded as a causal LM, which BERT warns about; a pooler built only
where a head reads it, as BERT builds its own."""

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    BertConfig,
    BertForMaskedLM,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    GPT2Config,
    GPT2ForSequenceClassification,
    ViTConfig,
    ViTForImageClassification,
)
from transformers.testing_utils import CaptureLogger
from transformers.utils import logging

import turner_tfm

from .tiny import image_config, random_ids, text_config

SHAPES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)
BERT = BertConfig(vocab_size=99, num_labels=2, **SHAPES)
GPT2 = GPT2Config(vocab_size=99, n_embd=32, n_layer=2, n_head=4, pad_token_id=0)
VIT = ViTConfig(image_size=16, patch_size=4, num_labels=3, **SHAPES)
BIDIRECTIONAL = dict(is_causal=False, use_pooler=True, classifier_pooling="cls", num_labels=2)
# each Turner head and its peer, with the inputs both take
PAIRS = {
    "sequence classification (causal)": (
        lambda: turner_tfm.TurnerForSequenceClassification(text_config()),
        lambda: GPT2ForSequenceClassification(GPT2),
    ),
    "sequence classification (bidirectional)": (
        lambda: turner_tfm.TurnerForSequenceClassification(text_config(**BIDIRECTIONAL)),
        lambda: BertForSequenceClassification(BERT),
    ),
    "masked LM": (lambda: turner_tfm.TurnerForMaskedLM(text_config(**BIDIRECTIONAL)), lambda: BertForMaskedLM(BERT)),
    "token classification": (
        lambda: turner_tfm.TurnerForTokenClassification(text_config(**BIDIRECTIONAL)),
        lambda: BertForTokenClassification(BERT),
    ),
    "question answering": (
        lambda: turner_tfm.TurnerForQuestionAnswering(text_config(**BIDIRECTIONAL)),
        lambda: BertForQuestionAnswering(BERT),
    ),
}


def first_output(output) -> torch.Tensor:
    return output.logits if "logits" in output else output.start_logits


@pytest.mark.parametrize("pair", list(PAIRS))
@pytest.mark.parametrize("use_cache", [False, True])
def test_every_text_head_takes_use_cache_as_its_peer_does(pair, use_cache):
    """TRL's RewardTrainer calls a reward model with `use_cache=False`: the head answers as without it."""
    ids = random_ids(2, 6)
    for build in PAIRS[pair]:
        model = build().eval()
        with torch.no_grad():
            torch.testing.assert_close(first_output(model(ids, use_cache=use_cache)), first_output(model(ids)))


def test_a_masked_lm_folder_loaded_as_a_causal_lm_warns_as_berts_does(tmp_path):
    turner_tfm.TurnerForMaskedLM(text_config(is_causal=False)).save_pretrained(tmp_path / "turner")
    BertForMaskedLM(BERT).save_pretrained(tmp_path / "bert")
    with CaptureLogger(logging.get_logger("turner_tfm.checks_turner")) as turner:
        AutoModelForCausalLM.from_pretrained(tmp_path / "turner")
    assert "built from a config saved by TurnerForMaskedLM" in turner.out
    assert "load the folder with AutoModelForMaskedLM" in turner.out
    with CaptureLogger(logging.get_logger("transformers.models.bert.modeling_bert")) as bert:
        AutoModelForCausalLM.from_pretrained(tmp_path / "bert")
    assert "is_decoder=True" in bert.out
    with CaptureLogger(logging.get_logger("turner_tfm.checks_turner")) as causal:
        turner_tfm.TurnerForCausalLM(text_config())
    assert causal.out == ""


def test_a_pooler_is_built_only_where_a_head_reads_it_as_berts():
    """Heads that never read the pooler build none (an unused parameter has no gradient: DDP and transformers'
    gradient-checkpointing tests refuse it); the classifiers reading the first token keep it."""
    config = text_config(**BIDIRECTIONAL)
    for model in (
        turner_tfm.TurnerForMaskedLM(config),
        turner_tfm.TurnerForTokenClassification(config),
        turner_tfm.TurnerForQuestionAnswering(config),
    ):
        assert model.model.pooler is None, type(model).__name__
    for model in (BertForMaskedLM(BERT), BertForTokenClassification(BERT), BertForQuestionAnswering(BERT)):
        assert model.bert.pooler is None, type(model).__name__
    assert turner_tfm.TurnerForSequenceClassification(config).model.pooler is not None
    assert BertForSequenceClassification(BERT).bert.pooler is not None
    assert turner_tfm.TurnerForImageClassification(image_config(use_pooler=True)).model.pooler is not None
    assert ViTForImageClassification(VIT).vit.pooler is None  # ViT's classifier reads the class token directly
