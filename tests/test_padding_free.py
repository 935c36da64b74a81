"""Padding-free training (`train_causal_lm.py` and `train_text_classifier.py --padding-free`): sequences packed in
one row by `DataCollatorWithFlattening` train exactly as the same sequences padded to the longest: same loss, same
gradients; a classifier gives each packed sequence its own logits."""

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSequenceClassification, pipeline

from examples.helpers import data
from examples.helpers import padding_free as padding_free_module
from turner_tfm import TurnerForCausalLM, TurnerForSequenceClassification

from .once import made_once
from .test_parallel import TORCHRUN
from .tiny import random_ids, text_config
from .workflow_utils import (
    TINY_MODEL,
    example,
    printed_number,
    run_example,
    run_examples,
    script_env,
    training_losses,
)


@pytest.fixture(scope="module")
def padding_free():
    return padding_free_module


class _PadOnly:
    """The one thing `DataCollatorForLanguageModeling` and `DataCollatorWithPadding` ask of a tokenizer here: pad a
    batch of ids (other keys, such as labels, pass through)."""

    pad_token_id = 0
    padding_side = "right"

    def pad(self, features, return_tensors="pt", pad_to_multiple_of=None, **_):
        width = max(len(f["input_ids"]) for f in features)
        ids = torch.tensor([f["input_ids"] + [0] * (width - len(f["input_ids"])) for f in features])
        mask = torch.tensor([[1] * len(f["input_ids"]) + [0] * (width - len(f["input_ids"])) for f in features])
        others = {key: torch.tensor([f[key] for f in features]) for key in features[0] if key != "input_ids"}
        return {"input_ids": ids, "attention_mask": mask, **others}


def assert_same_loss_and_gradients(model: torch.nn.Module, packed: dict, padded: dict) -> None:
    losses, gradients = [], []
    for batch in (packed, padded):
        model.zero_grad()
        loss = model(**batch).loss
        loss.backward()
        losses.append(loss.detach())
        gradients.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    torch.testing.assert_close(losses[0], losses[1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gradients[0], gradients[1], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("position_embedding_type", ["learned", "rotary"])
def test_a_packed_batch_trains_exactly_like_the_padded_batch(padding_free, position_embedding_type):
    sequences = [{"input_ids": random_ids(1, length, seed=length)[0].tolist()} for length in (7, 3, 12, 5)]
    packed = padding_free.collator(True, None)(sequences)
    padded = padding_free.collator(False, _PadOnly())(sequences)
    assert packed["input_ids"].shape == (1, 27) and "attention_mask" not in packed
    assert padded["input_ids"].shape == (4, 12) and (padded["labels"] == -100).sum() == 4 * 12 - 27

    torch.manual_seed(0)
    model = TurnerForCausalLM(text_config(position_embedding_type=position_embedding_type))
    assert_same_loss_and_gradients(model, packed, padded)


def test_paragraphs_become_sequences_of_at_most_the_block_size(padding_free):
    text = "Return the sum.\n\n\n\nA much longer paragraph, cut in pieces.\n\nX"
    tokenizer = data.char_tokenizer([text], model_max_length=16)
    dataset = padding_free.paragraph_sequences(tokenizer, text, 16, "training")
    assert [len(ids) for ids in dataset["input_ids"]] == [15, 16, 16, 7]  # "X" has nothing to predict


@pytest.fixture(scope="module")
def script_runs(tmp_path_factory):
    """train_causal_lm.py and train_text_classifier.py, each with --padding-free, one after the other in one Python
    process (each run sets its own seed; two short runs, one interpreter and one `import torch, transformers`). The
    classifier has the settings of the padded run in test_workflows_classifiers.py. Their outputs, and the folder
    they saved to (lm/, cp/), made once for the session (`made_once`: not once per pytest-xdist worker)."""

    def make(folder: Path) -> dict[str, str]:
        lm = ("--padding-free", "--output-dir", "lm", "--max-steps", "20", "--logging-steps", "5")
        lm += ("--learning-rate", "5e-3", "--block-size", "64", "--max-new-tokens", "5", *TINY_MODEL)
        classifier = ("--padding-free", "--examples-per-class", "200", "--num-train-epochs", "3")
        classifier += ("--logging-steps", "5", "--output-dir", "cp", "--per-device-train-batch-size", "16")
        classifier += ("--max-length", "64", *TINY_MODEL)
        runs = [("train_causal_lm.py", *lm), ("train_text_classifier.py", *classifier)]
        return dict(zip(("lm", "cp"), run_examples(runs, tmp_path=folder), strict=True))

    folder, outputs = made_once(tmp_path_factory, "padding-free", make)
    return outputs, folder


def test_the_script_trains_padding_free(script_runs):
    outputs, folder = script_runs
    output = outputs["lm"]
    losses = training_losses(output)
    assert losses[-1] < losses[0] - 0.5, f"the loss fell by less than 0.5: {losses}"
    assert printed_number(output, "held-out loss") < losses[0], output[-3000:]
    assert (folder / "lm" / "model.safetensors").is_file(), "the trained model was not saved"


CLASSIFIER_SEQUENCES = [random_ids(1, length, seed=length)[0].tolist() for length in (6, 11, 3, 8)]
# every pooling each mask allows (the causal mask refuses 'cls'), and BERT's pooler on 'cls'
CLASSIFIERS = [
    {"is_causal": True, "classifier_pooling": "last"},
    {"is_causal": True, "classifier_pooling": "mean"},
    {"is_causal": False, "classifier_pooling": "cls"},
    {"is_causal": False, "classifier_pooling": "mean"},
    {"is_causal": False, "classifier_pooling": "last"},
    {"is_causal": False, "classifier_pooling": "cls", "use_pooler": True},
]


def packed_and_padded(padding_free, labels):
    features = [{"input_ids": ids, "label": label} for ids, label in zip(CLASSIFIER_SEQUENCES, labels, strict=True)]
    return [padding_free.classification_collator(packed, _PadOnly())(features) for packed in (True, False)]


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("overrides", CLASSIFIERS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_a_packed_row_classifies_each_sequence_as_if_alone(padding_free, overrides, implementation):
    packed, padded = packed_and_padded(padding_free, [2, 0, 1, 2])
    torch.manual_seed(0)
    config = text_config(num_labels=3, attn_implementation=implementation, **overrides)
    model = TurnerForSequenceClassification(config).eval()
    with torch.no_grad():
        output = model(**packed)
        alone = torch.cat([model(torch.tensor([ids])).logits for ids in CLASSIFIER_SEQUENCES])
        padded_output = model(**padded)
    assert output.logits.shape == (4, 3)
    torch.testing.assert_close(output.logits, alone, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(output.loss, padded_output.loss, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("overrides", "labels"),
    [
        ({"num_labels": 1}, [0.5, -1.0, 2.0, 0.0]),  # regression
        ({"num_labels": 2, "problem_type": "multi_label_classification"}, [[1.0, 0.0], [1.0, 1.0], [0, 0], [0, 1]]),
    ],
    ids=["regression", "multi-label"],
)
def test_a_packed_row_of_float_labels_has_the_padded_loss_and_gradients(padding_free, overrides, labels):
    packed, padded = packed_and_padded(padding_free, labels)
    assert packed["labels"].dtype == torch.float32 and len(packed["labels"]) == 4
    torch.manual_seed(0)
    model = TurnerForSequenceClassification(text_config(is_causal=False, **overrides))
    assert_same_loss_and_gradients(model, packed, padded)


def test_the_classification_collator_keeps_one_label_per_sequence(padding_free):
    features = [
        {"input_ids": [5, 6, 7], "attention_mask": [1, 1, 1], "label": 1},
        {"input_ids": [8, 9], "attention_mask": [1, 1], "label": 0},
    ]
    batch = padding_free.classification_collator(True, None)(features)
    assert set(batch) == {"input_ids", "position_ids", "labels"}
    assert batch["input_ids"].tolist() == [[5, 6, 7, 8, 9]] and batch["position_ids"].tolist() == [[0, 1, 2, 0, 1]]
    assert batch["labels"].tolist() == [1, 0] and batch["labels"].dtype == torch.long
    unlabelled = padding_free.classification_collator(True, None)([{"input_ids": [5, 6]}, {"input_ids": [7]}])
    assert set(unlabelled) == {"input_ids", "position_ids"}


def test_a_packed_classifier_batch_that_is_not_one_row_or_mislabelled_is_refused(padding_free):
    packed, _ = packed_and_padded(padding_free, [2, 0, 1, 2])
    model = TurnerForSequenceClassification(text_config(num_labels=3))
    two_rows = {key: packed[key].repeat(2, 1) for key in ("input_ids", "position_ids")}
    with pytest.raises(ValueError, match=r"`position_ids` of shape \(2, 28\) for a batch of 2.*one row \(batch 1\)"):
        model(**two_rows)
    with pytest.raises(ValueError, match=r"`position_ids` of shape \(1, 28\) for a batch of 2"):
        model(input_ids=two_rows["input_ids"], position_ids=packed["position_ids"])
    with pytest.raises(ValueError, match=r"`labels` of shape \(3,\).*expects 4 integer class ids"):
        model(**{**packed, "labels": packed["labels"][:3]})


def test_the_text_classifier_script_trains_padding_free_and_its_folder_reloads(padding_free, script_runs):
    """The settings of the padded run in test_workflows_classifiers.py, with the same accuracy bar."""
    outputs, folder = script_runs
    output = outputs["cp"]
    assert printed_number(output, "test accuracy:") >= 0.75, output[-3000:]
    losses = training_losses(output)
    assert losses[-1] < losses[0], f"the loss did not fall: {losses}"
    classifier = pipeline("text-classification", model=str(folder / "cp"))
    assert classifier("for key, value in items.items():")[0]["label"] in {"code", "prose"}

    model = AutoModelForSequenceClassification.from_pretrained(folder / "cp").eval()
    texts = ["x = 1", "Return the sum of the values.", "def f(a, b):"]
    ids = [classifier.tokenizer(text)["input_ids"] for text in texts]
    row = padding_free.classification_collator(True, None)([{"input_ids": i} for i in ids])
    with torch.no_grad():
        alone = torch.cat([model(torch.tensor([i])).logits for i in ids])
        torch.testing.assert_close(model(**row).logits, alone, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_the_text_classifier_trains_padding_free_and_fully_sharded(tmp_path):
    """The two paths together, three processes (torchrun and two workers): each is checked by a faster test of the
    default run, padding-free training in one process (`script_runs`, above) and a classifier script trained fully
    sharded (tests/test_parallel.py); FSDP passes a packed row's keys to the model as it passes a padded batch's."""
    output = run_example(
        [*TORCHRUN, *example("train_text_classifier.py")],
        *("--padding-free", "--fsdp-size", "2", "--examples-per-class", "40", "--num-train-epochs", "1"),
        *("--output-dir", "cp", "--per-device-train-batch-size", "8", "--max-length", "48", *TINY_MODEL),
        tmp_path=tmp_path,
        env=script_env(tmp_path, HF_HUB_DISABLE_PROGRESS_BARS="1"),
    )
    assert printed_number(output, "test accuracy:") > 0 and output.count("pipeline('text-classification'):") == 1
    assert "FSDP2 over 2 processes" in (tmp_path / "cp" / "README.md").read_text()
