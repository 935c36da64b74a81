"""transformers' own model test suites, unmodified, over every Turner head beside the in-library anchors (issue 66).

The suites come from the sdist of the installed transformers release on the package index: `.ci/run` downloads it
(`pip download --no-binary :all:`) and unpacks its `tests/` as the package `upstream_tests` in a folder it puts on
`PYTHONPATH`; nothing of it is in this repository, and no helper of it is patched.
Run by hand as docs/testing.md says; `tests/conftest.py` leaves this file out of a run without that variable.

What this module adds is what an in-library model's own test file adds: a model tester (tiny shapes, as
`GPT2ModelTester`'s and `BertModelTester`'s), one `unittest.TestCase` per family and config over the mixins, and the
model's names in transformers' static task tables (`MODEL_FOR_*_MAPPING_NAMES`), where the mixins look a class up by
name to give it labels; an in-library model is listed there, a plugin is not.

Two files the mixins import are not in the sdist: `tests/exporters/test_export.py` (`ExportTesterMixin`, whose tests
are all `@slow`) and `tests/generation/test_utils.py` (`GenerationTesterMixin`). They stand in as empty mixins, and
every class here, anchors included, sets `all_generative_model_classes = ()` as transformers' own
`test_generation_tester_mixin_inheritance` asks of a tester that runs no generate tests (Turner's generation is held
against GPT-2's by tests/test_generation.py and tests/test_like_in_library.py). `TensorParallelTesterMixin` and
`FSDPTesterMixin` import `tests/distributed_testing_utils.py`, also not in the sdist: they are not run here
(tests/test_parallel.py shards every config against one process instead).
"""

import importlib
import importlib.util
import sys
import types
import unittest

import pytest
import torch
import transformers
from transformers import BertConfig, GPT2Config, ViTConfig
from transformers.models.auto import modeling_auto

import turner_tfm
from turner_tfm import TurnerConfig

from .test_switches import SWITCHES

pytestmark = pytest.mark.upstream

UPSTREAM = "upstream_tests"  # the sdist's tests/, under a name that is not this repository's `tests`
STAND_INS = {
    f"{UPSTREAM}.exporters.test_export": "ExportTesterMixin",
    f"{UPSTREAM}.generation.test_utils": "GenerationTesterMixin",
}
# Turner's classes in the tables the mixins read by name, as an in-library model's are
TURNER_TASKS = {
    "MODEL_MAPPING_NAMES": "TurnerModel",
    "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES": "TurnerForCausalLM",
    "MODEL_FOR_MASKED_LM_MAPPING_NAMES": "TurnerForMaskedLM",
    "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES": "TurnerForSequenceClassification",
    "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES": "TurnerForTokenClassification",
    "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES": "TurnerForQuestionAnswering",
    "MODEL_FOR_MULTIPLE_CHOICE_MAPPING_NAMES": "TurnerForMultipleChoice",
    "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES": "TurnerForImageClassification",
}


def import_upstream_suites() -> types.ModuleType:
    if importlib.util.find_spec(UPSTREAM) is None:
        raise RuntimeError(
            f"no package {UPSTREAM!r} on the path: unpack the `tests/` of the installed transformers' sdist as "
            f"`{UPSTREAM}` in a folder on PYTHONPATH (docs/testing.md)"
        )
    for name, mixin in STAND_INS.items():
        if importlib.util.find_spec(name.rpartition(".")[0]) is None:
            sys.modules[name.rpartition(".")[0]] = types.ModuleType(name.rpartition(".")[0])
        stand_in = types.ModuleType(name)
        setattr(stand_in, mixin, type(mixin, (), {}))
        sys.modules[name] = stand_in
    for table, name in TURNER_TASKS.items():
        getattr(modeling_auto, table)["turner"] = name
    return importlib.import_module(f"{UPSTREAM}.test_modeling_common")


common = import_upstream_suites()
training = importlib.import_module(f"{UPSTREAM}.test_training_mixin")
ModelTesterMixin, TrainingTesterMixin = common.ModelTesterMixin, training.TrainingTesterMixin
floats_tensor, ids_tensor, random_attention_mask = common.floats_tensor, common.ids_tensor, common.random_attention_mask

# The tiny shapes of transformers' own GPT-2 and BERT testers
SHAPES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)
VOCAB, TOKEN_TYPES, LABELS = 99, 16, 2  # 2 labels: BERT's question answering reads num_labels as its 2 outputs
BERT_LIKE = dict(
    is_causal=False,
    norm_position="post",
    embedding_layer_norm=True,
    type_vocab_size=TOKEN_TYPES,
    use_pooler=True,
    classifier_pooling="cls",
)


def gpt2_config() -> GPT2Config:
    return GPT2Config(
        vocab_size=VOCAB,
        n_embd=32,
        n_layer=2,
        n_head=4,
        n_inner=37,
        n_positions=512,
        pad_token_id=VOCAB - 1,
        bos_token_id=VOCAB - 1,
        eos_token_id=VOCAB - 1,
        num_labels=LABELS,
    )


def bert_config() -> BertConfig:
    return BertConfig(
        vocab_size=VOCAB, type_vocab_size=TOKEN_TYPES, max_position_embeddings=512, num_labels=LABELS, **SHAPES
    )


def vit_config() -> ViTConfig:
    return ViTConfig(image_size=16, patch_size=4, num_channels=3, num_labels=LABELS, **SHAPES)


def turner_config(**switches) -> TurnerConfig:
    text = {} if "image_size" in switches else dict(vocab_size=VOCAB, max_position_embeddings=512, pad_token_id=0)
    return TurnerConfig(num_labels=LABELS, **SHAPES, **text, **switches)


class SideBySideTester:
    """A model tester, as an in-library model's test file has one: the config and the inputs every mixin test takes."""

    batch_size, seq_length, is_training, num_choices = 13, 7, True, 4
    image_size, patch_size, num_channels = 16, 4, 3
    hidden_size, num_hidden_layers, num_attention_heads = SHAPES["hidden_size"], 2, 4

    def __init__(self, parent, make_config, token_types: bool = False, causal_lm_class=None, classifier=None):
        self.parent = parent
        self.make_config = make_config
        self.token_types = token_types
        self.causal_lm_class = causal_lm_class
        self.sequence_classification_class = classifier
        config = make_config()
        self.vocab_size = getattr(config, "vocab_size", None)
        self.images = getattr(config, "image_size", None) is not None and not hasattr(config, "vocab_size")
        self.images = self.images or getattr(config, "is_image_model", False)
        if self.images:  # the class token, then the patches; half of them masked where a model takes a mask (ViT's)
            self.mask_length = (self.image_size // self.patch_size) ** 2
            self.seq_length = self.mask_length + 1
            self.num_masks = self.seq_length // 2

    def get_config(self):
        return self.make_config()

    def prepare_config_and_inputs_for_common(self) -> tuple:
        if self.images:
            pixels = floats_tensor([self.batch_size, self.num_channels, self.image_size, self.image_size])
            return self.get_config(), {"pixel_values": pixels}
        # no padding id in the ids (GPT-2's and Turner's pad is a real id here), so every row keeps its last token
        input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size - 2) + 1
        inputs = {"input_ids": input_ids, "attention_mask": random_attention_mask([self.batch_size, self.seq_length])}
        if self.token_types:
            inputs["token_type_ids"] = ids_tensor([self.batch_size, self.seq_length], TOKEN_TYPES)
        return self.get_config(), inputs


def side_by_side(name: str, classes: tuple, make_config, **tester) -> type:
    """One `unittest.TestCase` over transformers' mixins for `classes`, built from `make_config`: `ModelTesterMixin`,
    and `TrainingTesterMixin` for text (its training batch is text only)."""

    def setUp(self):
        self.model_tester = SideBySideTester(self, make_config, **tester)

    attributes = {
        "all_model_classes": classes,
        # no generate tests here (module docstring): as upstream's inheritance test asks of such a tester
        "all_generative_model_classes": (),
        "pipeline_model_mapping": {},
        "setUp": setUp,
        "test_config": lambda self: self.assertEqual(
            type(make_config()).from_dict(make_config().to_dict()).to_dict(), make_config().to_dict()
        ),
    }
    mixins = (ModelTesterMixin, TrainingTesterMixin)
    if SideBySideTester(None, make_config).images:
        attributes.update(IMAGE_TEST_FILE)
        mixins = (ModelTesterMixin,)
    return type(name, (*mixins, unittest.TestCase), attributes)


def image_embeddings_are_modules(self) -> None:
    """An image model's input embedding is its patch embedding, a module but no `nn.Embedding`; it has no output
    embedding (as ViT's own test file checks it)."""
    config, _ = self.model_tester.prepare_config_and_inputs_for_common()
    for model_class in self.all_model_classes:
        model = model_class(config)
        self.assertIsInstance(model.get_input_embeddings(), torch.nn.Module)
        self.assertIsNone(model.get_output_embeddings())


def takes_no_inputs_embeds(self) -> None:
    self.skipTest(reason="an image model takes pixel_values, not inputs_embeds (as ViT's own test file says)")


# What ViT's own test file changes of the mixin for an image model, for ViT and Turner's image classifier alike
IMAGE_TEST_FILE = {
    "test_resize_embeddings": False,
    "test_model_get_set_embeddings": image_embeddings_are_modules,
    "test_inputs_embeds": takes_no_inputs_embeds,
    "test_inputs_embeds_matches_input_ids": takes_no_inputs_embeds,
}


GPT2_CLASSES = (
    transformers.GPT2Model,
    transformers.GPT2LMHeadModel,
    transformers.GPT2ForSequenceClassification,
    transformers.GPT2ForTokenClassification,
    transformers.GPT2ForQuestionAnswering,
)
TURNER_CAUSAL = (
    turner_tfm.TurnerModel,
    turner_tfm.TurnerForCausalLM,
    turner_tfm.TurnerForSequenceClassification,
    turner_tfm.TurnerForTokenClassification,
    turner_tfm.TurnerForQuestionAnswering,
)
BERT_CLASSES = (
    transformers.BertModel,
    transformers.BertForMaskedLM,
    transformers.BertForSequenceClassification,
    transformers.BertForTokenClassification,
    transformers.BertForQuestionAnswering,
    transformers.BertForMultipleChoice,
)
TURNER_BIDIRECTIONAL = (
    turner_tfm.TurnerModel,
    turner_tfm.TurnerForMaskedLM,
    turner_tfm.TurnerForSequenceClassification,
    turner_tfm.TurnerForTokenClassification,
    turner_tfm.TurnerForQuestionAnswering,
    turner_tfm.TurnerForMultipleChoice,
)

# the anchors
GPT2Test = side_by_side(
    "GPT2Test",
    GPT2_CLASSES,
    gpt2_config,
    causal_lm_class=transformers.GPT2LMHeadModel,
    classifier=transformers.GPT2ForSequenceClassification,
)
# The masked LM is what the training mixin trains of a bidirectional family: its text batch has token labels
BertTest = side_by_side(
    "BertTest", BERT_CLASSES, bert_config, token_types=True, causal_lm_class=transformers.BertForMaskedLM
)
ViTTest = side_by_side("ViTTest", (transformers.ViTModel, transformers.ViTForImageClassification), vit_config)

# Turner beside them: causal beside GPT-2 (the default config and the switches that change the block), bidirectional
# and BERT-like beside BERT, the image classifier beside ViT
TurnerCausalTest = side_by_side(
    "TurnerCausalTest",
    TURNER_CAUSAL,
    turner_config,
    causal_lm_class=turner_tfm.TurnerForCausalLM,
    classifier=turner_tfm.TurnerForSequenceClassification,
)
TurnerSwitchesTest = side_by_side(
    "TurnerSwitchesTest",
    TURNER_CAUSAL,
    lambda: turner_config(**SWITCHES["combined"]),
    causal_lm_class=turner_tfm.TurnerForCausalLM,
    classifier=turner_tfm.TurnerForSequenceClassification,
)
TurnerBidirectionalTest = side_by_side(
    "TurnerBidirectionalTest",
    TURNER_BIDIRECTIONAL,
    lambda: turner_config(**BERT_LIKE),
    token_types=True,
    causal_lm_class=turner_tfm.TurnerForMaskedLM,
)
TurnerImageTest = side_by_side(
    "TurnerImageTest",
    (turner_tfm.TurnerModel, turner_tfm.TurnerForImageClassification),
    lambda: turner_config(image_size=16, patch_size=4, num_channels=3),
)
