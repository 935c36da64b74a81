"""BERT <-> Turner: the same numbers (padding and token types included), bit-exact round trips, clear refusals."""

import re

import pytest
import torch
from transformers import (
    BertConfig,
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
)

from convert import bert
from turner_tfm import TurnerConfig, TurnerForSequenceClassification, TurnerModel

from .convert_helpers import assert_same_outputs, assert_same_state_dict, masked_ids

VOCAB = 64
SOURCES = {
    "BertModel with pooler": (lambda config: BertModel(config), ("last_hidden_state", "pooler_output")),
    "BertModel without pooler": (lambda config: BertModel(config, add_pooling_layer=False), ("last_hidden_state",)),
    "BertForSequenceClassification": (lambda config: BertForSequenceClassification(config), ("logits",)),
    "BertForMaskedLM": (lambda config: BertForMaskedLM(config), ("logits",)),
    "BertForTokenClassification": (lambda config: BertForTokenClassification(config), ("logits",)),
    "BertForQuestionAnswering": (
        lambda config: BertForQuestionAnswering(scoring_spans(config)),
        ("start_logits", "end_logits"),
    ),
}


def scoring_spans(config: BertConfig) -> BertConfig:
    """`config` for BertForQuestionAnswering, whose `qa_outputs` scores a start and an end: two labels."""
    config.num_labels = 2
    return config


# The MiniLM sentence-embedding family (e.g. all-MiniLM-L6-v2) is a BertModel with 12 heads of width 32; here 12 of 2.
MINILM = dict(hidden_size=24, num_hidden_layers=3, num_attention_heads=12, intermediate_size=96)


def bert_config(**overrides) -> BertConfig:
    defaults = dict(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=24)
    return BertConfig(
        **{**defaults, "max_position_embeddings": 32, "num_labels": 3, "classifier_dropout": 0.0, **overrides}
    )


def batch_with_token_types() -> dict[str, torch.Tensor]:
    batch = masked_ids(VOCAB, 0, (7, 4, 2))
    batch["token_type_ids"] = (torch.arange(7) >= 3).long().expand(3, 7) * batch["attention_mask"]
    return batch


@pytest.mark.parametrize("source", list(SOURCES))
def test_outputs_match_with_padding_and_token_types(source):
    build, outputs = SOURCES[source]
    model = build(bert_config())
    turner = bert.CONVERTER.model_to_turner(model)
    assert (turner.config.norm_position, turner.config.embedding_layer_norm, turner.config.type_vocab_size) == (
        "post",
        True,
        2,
    )
    assert_same_outputs(model, turner, batch_with_token_types(), outputs)


@pytest.mark.parametrize("source", list(SOURCES))
def test_round_trip_reproduces_every_tensor(source):
    model = SOURCES[source][0](bert_config(type_vocab_size=3, hidden_act="gelu_new"))
    back = bert.CONVERTER.model_from_turner(bert.CONVERTER.model_to_turner(model), type(model).__name__)
    assert type(back) is type(model)
    assert_same_state_dict(model, back)


def train_padded(model: torch.nn.Module, steps: int = 5) -> list[float]:
    """AdamW steps on right-padded batches with a span to find, as a padded fine-tuning run takes them."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for step in range(steps):
        batch = {**masked_ids(VOCAB, 0, (7, 4, 2), seed=step), "start_positions": torch.tensor([1, 2, 0])}
        loss = model(**batch, end_positions=torch.tensor([3, 3, 1])).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def test_a_converted_model_fine_tunes_on_padded_batches_as_bert_does():
    """BERT keeps its pad embedding fixed (`padding_idx`); the converted model too (`use_padding_idx`), or padded
    training drifts from BERT's."""
    torch.manual_seed(0)
    no_dropout = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = BertForQuestionAnswering(scoring_spans(bert_config(pad_token_id=0, **no_dropout)))
    turner = bert.CONVERTER.model_to_turner(model)
    assert turner.config.use_padding_idx and turner.get_input_embeddings().padding_idx == 0
    pad_row = turner.get_input_embeddings().weight[0].detach().clone()
    torch.testing.assert_close(train_padded(turner), train_padded(model), rtol=1e-5, atol=1e-5)
    assert torch.equal(turner.get_input_embeddings().weight[0], pad_row)
    back = bert.CONVERTER.model_from_turner(turner, "BertForQuestionAnswering")
    assert back.get_input_embeddings().padding_idx == 0


def test_minilm_sentence_embeddings_match():
    """sentence-transformers' recipe: mean of the last hidden states over real tokens, then L2-normalised."""
    model = BertModel(bert_config(**MINILM)).eval()
    turner = bert.CONVERTER.model_to_turner(model)
    batch = masked_ids(VOCAB, 0, (9, 5, 3))
    mask = batch["attention_mask"].unsqueeze(-1).float()

    def embed(encoder: torch.nn.Module) -> torch.Tensor:
        with torch.no_grad():
            hidden = encoder(**batch).last_hidden_state
        return torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)

    torch.testing.assert_close(embed(turner), embed(model), atol=1e-5, rtol=1e-5)
    assert turner.config.head_dim == 2


def test_pure_map_names_and_config():
    labels = ["neg", "neutral", "pos"]
    model = BertForSequenceClassification(
        bert_config(id2label=dict(enumerate(labels)), label2id={label: index for index, label in enumerate(labels)})
    )
    state, config = bert.to_turner(model.state_dict(), model.config, "BertForSequenceClassification")
    attention = model.bert.encoder.layer[1].attention.self
    stacked = torch.cat([attention.query.bias, attention.key.bias, attention.value.bias])
    assert torch.equal(state["model.layers.1.self_attn.qkv_proj.bias"], stacked)
    assert torch.equal(
        state["model.layers.0.attn_norm.bias"], model.bert.encoder.layer[0].attention.output.LayerNorm.bias
    )
    assert torch.equal(state["model.pooler.dense.weight"], model.bert.pooler.dense.weight)
    assert (config.use_pooler, config.classifier_pooling, config.is_causal, config.pad_token_id) == (
        True,
        "cls",
        False,
        0,
    )
    assert (config.layer_norm_eps, config.hidden_dropout, config.id2label[2]) == (1e-12, 0.1, "pos")
    back, back_config = bert.from_turner(state, config, "BertForSequenceClassification")
    assert all(torch.equal(back[key], tensor) for key, tensor in model.state_dict().items())
    assert (back_config.hidden_dropout_prob, back_config.classifier_dropout, back_config.label2id["pos"]) == (
        0.1,
        0.0,
        2,
    )


@pytest.mark.parametrize(
    ("option", "value", "source"),
    [
        ("is_decoder", True, "BertModel with pooler"),
        ("add_cross_attention", True, "BertModel with pooler"),
        ("position_embedding_type", "relative_key", "BertModel with pooler"),
    ],
)
def test_options_turner_cannot_express_are_refused(option, value, source):
    config = bert_config(**{option: value}, **({"is_decoder": True} if option == "add_cross_attention" else {}))
    model = SOURCES[source][0](config)
    with pytest.raises(ValueError, match=re.escape(f"`{option}`={value!r}")):
        bert.to_turner(model.state_dict(), config, type(model).__name__)


@pytest.mark.parametrize(("classifier_dropout", "expected"), [(0.2, 0.2), (None, 0.1)])
def test_classifier_dropout_carries_over_both_ways(classifier_dropout, expected):
    config = bert_config(classifier_dropout=classifier_dropout, hidden_dropout_prob=0.1)
    model = BertForSequenceClassification(config)
    state, turner_config = bert.to_turner(model.state_dict(), config, "BertForSequenceClassification")
    assert turner_config.classifier_dropout == expected
    _, back = bert.from_turner(state, turner_config, "BertForSequenceClassification")
    assert back.classifier_dropout == expected


def turner_encoder_config(**overrides) -> TurnerConfig:
    defaults = dict(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, type_vocab_size=2)
    encoder = dict(is_causal=False, norm_position="post", embedding_layer_norm=True, classifier_pooling="cls")
    return TurnerConfig(**{**defaults, **encoder, "use_pooler": True, **overrides})


@pytest.mark.parametrize(
    ("option", "value", "architecture"),
    [
        ("norm_position", "pre", "BertModel"),
        ("embedding_layer_norm", False, "BertModel"),
        ("type_vocab_size", 0, "BertModel"),
        ("attention_bias", False, "BertModel"),
        ("position_embedding_type", "sinusoidal", "BertModel"),
        ("position_embedding_type", "rotary", "BertModel"),
        ("share_query_key", True, "BertModel"),
        ("normalization", "rmsnorm", "BertModel"),
        ("mlp_hidden_layers", 2, "BertModel"),
        ("use_pooler", False, "BertForSequenceClassification"),
    ],
)
def test_reverse_refuses_what_bert_cannot_express(option, value, architecture):
    config = turner_encoder_config(**{option: value})
    model = bert.CONVERTER.head(architecture).turner_class(config)
    with pytest.raises(ValueError, match=re.escape(f"`{option}`={value!r}")):
        bert.from_turner(model.state_dict(), config, architecture)


def test_reverse_refuses_a_causal_encoder():
    config = turner_encoder_config(is_causal=True, use_pooler=False, classifier_pooling="mean")
    with pytest.raises(ValueError, match=re.escape("`is_causal`=True")):
        bert.from_turner(TurnerModel(config).state_dict(), config, "BertModel")


def test_reverse_needs_cls_pooling_for_the_classifier():
    config = turner_encoder_config(use_pooler=False, classifier_pooling="mean")
    with pytest.raises(ValueError, match=re.escape("`classifier_pooling`='mean'")):
        bert.from_turner(TurnerForSequenceClassification(config).state_dict(), config, "BertForSequenceClassification")


def test_turner_model_without_pooler_goes_back_to_bert_without_pooler():
    turner = TurnerModel(turner_encoder_config(use_pooler=False))
    back = bert.CONVERTER.model_from_turner(turner, "BertModel")
    assert back.pooler is None
    assert_same_outputs(back, turner, batch_with_token_types(), ("last_hidden_state",))


def test_masked_lm_head_transform_and_decoder_bias_carry_over_and_a_separate_decoder_stays_separate():
    model = BertForMaskedLM(bert_config(hidden_act="relu", layer_norm_eps=1e-7))
    with torch.no_grad():
        model.cls.predictions.bias.normal_()  # trained biases are not zero
    turner = bert.CONVERTER.model_to_turner(model)
    assert torch.equal(turner.lm_head.bias, model.cls.predictions.decoder.bias)
    assert torch.equal(turner.transform.norm.weight, model.cls.predictions.transform.LayerNorm.weight)
    assert turner.lm_head.weight is turner.model.embeddings.embed_tokens.weight
    assert_same_outputs(model, turner, batch_with_token_types(), ("logits",))
    untied = BertForMaskedLM(bert_config(tie_word_embeddings=False))
    turner = bert.CONVERTER.model_to_turner(untied)
    assert turner.lm_head.weight is not turner.model.embeddings.embed_tokens.weight
    assert_same_outputs(untied, turner, batch_with_token_types(), ("logits",))
    assert_same_state_dict(untied, bert.CONVERTER.model_from_turner(turner, "BertForMaskedLM"))


def test_a_question_answering_head_scoring_more_than_start_and_end_is_refused():
    model = BertForQuestionAnswering(bert_config(num_labels=3))
    with pytest.raises(ValueError, match=re.escape("`num_labels`=3")):
        bert.to_turner(model.state_dict(), model.config, "BertForQuestionAnswering")


def choices_with_padding_and_token_types(batch: int = 3, choices: int = 4, length: int = 7) -> dict[str, torch.Tensor]:
    """`batch` rows of `choices` sequences (a question, then one answer: token type 1), right-padded."""
    rows = masked_ids(VOCAB, 0, tuple(length - row % 4 for row in range(batch * choices)))
    rows["token_type_ids"] = (torch.arange(length) >= 3).long() * rows["attention_mask"]
    return {name: value.view(batch, choices, length) for name, value in rows.items()}


def test_multiple_choice_converts_exactly_both_ways_and_fine_tunes_as_bert_does():
    """`BertForMultipleChoice` and `TurnerForMultipleChoice`: the same logits and loss with padding and token types,
    the same losses over AdamW steps, and every tensor back."""
    torch.manual_seed(0)
    model = BertForMultipleChoice(bert_config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    turner = bert.CONVERTER.model_to_turner(model)
    assert type(turner).__name__ == "TurnerForMultipleChoice" and turner.config.use_pooler
    batch = {**choices_with_padding_and_token_types(), "labels": torch.tensor([0, 3, 1])}
    assert_same_outputs(model.eval(), turner.eval(), batch, ("loss", "logits"))
    assert turner(**batch).logits.shape == (3, 4)

    def fine_tune(chooser: torch.nn.Module) -> list[float]:
        optimizer, losses = torch.optim.AdamW(chooser.parameters(), lr=1e-2), []
        for _ in range(4):
            loss = chooser.train()(**batch).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        return losses

    back = bert.CONVERTER.model_from_turner(bert.CONVERTER.model_to_turner(model), "BertForMultipleChoice")
    assert type(back) is BertForMultipleChoice
    assert_same_state_dict(model, back)
    torch.testing.assert_close(fine_tune(turner), fine_tune(model), rtol=1e-5, atol=1e-5)
