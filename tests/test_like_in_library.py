"""Never silently different from a model inside transformers (issue 35): the same user action on a Turner model and
on the in-library anchor of the same shape (GPT-2 for causal LM and last-token classification, BERT for
bidirectional text, ViT for images), made number-for-number equal by the converters, gives the same answer.

Where Turner answers differently on purpose (a clear error where the anchor raises from inside torch or silently
ignores what it was given), the test says so and checks the message. The actions that run on the cache, the
classifier and the issue's items also run on a saved folder loaded as remote code, where `turner_tfm` cannot be
imported (`test_a_folder_loaded_as_remote_code_answers_as_gpt2`).
"""

import functools
import json
import tempfile
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import (
    AutoModelForCausalLM,
    AutoModelForImageClassification,
    AutoModelForSequenceClassification,
    BertConfig,
    BertForMaskedLM,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
    DataCollatorForLanguageModeling,
    GPT2Config,
    GPT2ForQuestionAnswering,
    GPT2ForSequenceClassification,
    GPT2ForTokenClassification,
    GPT2LMHeadModel,
    GPT2PreTrainedModel,
    PreTrainedModel,
    Trainer,
    TrainingArguments,
    ViTConfig,
    ViTForImageClassification,
    ViTImageProcessor,
    pipeline,
)

from convert import bert, gpt2, vit
from turner_tfm import TurnerConfig, TurnerForCausalLM

from . import anchors
from .anchors import padded, prompts
from .convert_helpers import word_tokenizer
from .isolated import run_isolated
from .test_heads_pipelines import best_span

TOLERANCE = 1e-5
VOCAB = 64
IMAGE = 8
SPECIALS = {"pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}  # ids 0 to 3

# Anchors: tiny, without dropout (train mode then computes what eval mode does), with weights large enough that
# greedy choices are clear. Each Turner model is the anchor converted.


def gpt2_config(**overrides) -> GPT2Config:
    settings = dict(vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=4, num_labels=3)
    settings |= dict(pad_token_id=0, bos_token_id=1, eos_token_id=2, initializer_range=0.3)
    settings |= dict(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, summary_first_dropout=0.0)
    return GPT2Config(**settings | overrides)


def bert_config(**overrides) -> BertConfig:
    settings = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)
    settings |= dict(
        max_position_embeddings=32, num_labels=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
    )
    return BertConfig(**settings | dict(pad_token_id=0, initializer_range=0.3) | overrides)


def vit_config(**overrides) -> ViTConfig:
    settings = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37, num_labels=3)
    settings |= dict(image_size=IMAGE, patch_size=4, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return ViTConfig(**settings | dict(initializer_range=0.3) | overrides)


def converted(anchor: PreTrainedModel, converter) -> tuple[PreTrainedModel, PreTrainedModel]:
    return anchor.eval(), converter.CONVERTER.model_to_turner(anchor).eval()


def causal_lm(**overrides):
    return converted(GPT2LMHeadModel(gpt2_config(**overrides)), gpt2)


def last_token_classifier(**overrides):
    return converted(GPT2ForSequenceClassification(gpt2_config(**overrides)), gpt2)


def bert_classifier(**overrides):
    return converted(BertForSequenceClassification(bert_config(**overrides)), bert)


def bert_backbone():
    return converted(BertModel(bert_config()), bert)


def image_classifier(**overrides):
    return converted(ViTForImageClassification(vit_config(**overrides)), vit)


def assert_same(actual, expected, tolerance: float = TOLERANCE) -> None:
    """Tensors (ids exactly), arrays, Python floats (a Trainer's losses) to `tolerance`, and nests of them; anything
    else (shapes, dtypes, flags) by `==`. Two models' floats are never compared exactly: the same sums in another
    order (GPT-2's `Conv1D` against `nn.Linear`, another CPU's SIMD width) differ in the last digits."""
    if isinstance(expected, (tuple, list)):
        assert len(actual) == len(expected)
        for one, other in zip(actual, expected, strict=True):
            assert_same(one, other, tolerance)
    elif isinstance(expected, (torch.Tensor, np.ndarray, float)):
        actual, expected = torch.as_tensor(actual), torch.as_tensor(expected)
        torch.testing.assert_close(actual, expected, atol=tolerance, rtol=tolerance, check_dtype=False)
    else:
        assert actual == expected


# Actions on any model of a pair, written once; the anchors' own are in anchors.py.


def logits(model: PreTrainedModel, **inputs) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs).logits


def forward(model: PreTrainedModel, what: str):
    batch = padded(model, "left")
    if what == "logits, right padding":
        return logits(model, **padded(model, "right"))
    if what == "loss with labels":
        return model(**batch, labels=batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)).loss
    if what == "inputs_embeds":
        return logits(model, inputs_embeds=model.get_input_embeddings()(batch["input_ids"]))
    if what == "logits_to_keep":
        return logits(model, **batch, logits_to_keep=1)
    if what == "hidden states":
        with torch.no_grad():
            return model(**batch, output_hidden_states=True).hidden_states[-1]
    if what == "eager attention weights":
        model.set_attn_implementation("eager")
        with torch.no_grad():
            return model(**batch, output_attentions=True).attentions
    if what == "tuple output":
        with torch.no_grad():
            return model(**batch, return_dict=False, use_cache=False)[0]
    raise AssertionError(what)


def in_dtype(model: PreTrainedModel, dtype: torch.dtype) -> torch.Tensor:
    return logits(model.to(dtype), **padded(model, "left")).float()


def embedding_gradient(model: PreTrainedModel, checkpointing: bool) -> torch.Tensor:
    if checkpointing:
        model.activation_checkpointing_enable()  # gradient_checkpointing_enable: deprecated in 5.24
    model.train()
    ids = prompts(model)
    model(ids, labels=ids).loss.backward()
    return model.get_input_embeddings().weight.grad


def resized(model: PreTrainedModel, size: int, multiple: int | None = None) -> list:
    """After resize_token_embeddings: the old ids' logits, the new shapes, and whether the head is still tied."""
    model.resize_token_embeddings(size, pad_to_multiple_of=multiple)
    head, embeddings = model.get_output_embeddings().weight, model.get_input_embeddings().weight
    ids = prompts(model) % min(size, VOCAB)
    return [logits(model, input_ids=ids)[..., : min(size, VOCAB)], head.shape, embeddings.shape, head is embeddings]


def reloaded(model: PreTrainedModel, auto_class, **overrides):
    """save_pretrained, then the Auto class's from_pretrained with the user's overrides."""
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder)
        torch.manual_seed(0)  # what the overrides leave uninitialised gets the same numbers
        return auto_class.from_pretrained(folder, **overrides).eval()


def reload_logits(model: PreTrainedModel, **overrides) -> list:
    again = reloaded(model, AutoModelForCausalLM, **overrides)
    tied = again.get_output_embeddings().weight is again.get_input_embeddings().weight
    return [logits(again, **padded(again, "left")).float(), again.dtype, tied]


def untied_then_edited(model: PreTrainedModel) -> torch.Tensor:
    """A head loaded untied stays as it is when the input embedding is edited."""
    again = reloaded(model, AutoModelForCausalLM, tie_word_embeddings=False)
    with torch.no_grad():
        again.get_input_embeddings().weight.mul_(2)
    return logits(again, **padded(again, "left"))


def untied(model: PreTrainedModel) -> list:
    return [
        logits(model, input_ids=prompts(model)),
        model.get_output_embeddings().weight is model.get_input_embeddings().weight,
    ]


def generation_config_edit(model: PreTrainedModel) -> torch.Tensor:
    model.generation_config.max_new_tokens, model.generation_config.do_sample = 3, False
    model.generation_config.no_repeat_ngram_size = 1
    return model.generate(**padded(model, "left"))


def text_generation_pipeline(model: PreTrainedModel) -> list:
    generator = pipeline("text-generation", model=model, tokenizer=word_tokenizer(SPECIALS))
    answers = generator(["the cat sat", "a big red dog ran"], max_new_tokens=5, do_sample=False, return_tensors=True)
    return [answer[0]["generated_token_ids"] for answer in answers]


def text_classification_pipeline(model: PreTrainedModel) -> list:
    classifier = pipeline("text-classification", model=model, tokenizer=word_tokenizer(SPECIALS), top_k=None)
    answers = classifier(["the cat sat on the mat", "a dog", "red"])
    return [torch.tensor([score["score"] for score in sorted(answer, key=lambda s: s["label"])]) for answer in answers]


def images(batch: int = 2, size: int = IMAGE) -> torch.Tensor:
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(0))


def image_classification_pipeline(model: PreTrainedModel) -> list:
    processor = ViTImageProcessor(size={"height": IMAGE, "width": IMAGE})
    classifier = pipeline("image-classification", model=model, image_processor=processor, top_k=None)
    pixels = (images(2, 12).permute(0, 2, 3, 1).sigmoid() * 255).to(torch.uint8).numpy()
    answers = classifier([Image.fromarray(picture) for picture in pixels])
    return [torch.tensor([score["score"] for score in sorted(answer, key=lambda s: s["label"])]) for answer in answers]


def trainer(model: PreTrainedModel, folder: str, **arguments) -> Trainer:
    """A Trainer on the CPU. transformers 5.24's Trainer reads a model's loss type from its class name, and
    `GPT2LMHeadModel`'s does not say `ForCausalLM`: without being told, it counts the unshifted labels and scales
    GPT-2's loss by 5/6 here (Turner's name says it); the anchor is told, so both get the mean over the tokens."""
    if isinstance(model, GPT2LMHeadModel):
        model.loss_type = "ForCausalLM"
    settings = dict(per_device_train_batch_size=2, per_device_eval_batch_size=2, learning_rate=1e-2, seed=0)
    settings |= dict(report_to="none", use_cpu=True, disable_tqdm=True, logging_steps=1, save_strategy="no")
    return Trainer(model=model, args=TrainingArguments(output_dir=folder, **settings | arguments))


def text_examples(model: PreTrainedModel, labels: str) -> list[dict]:
    ids = prompts(model, batch=4, length=6)
    return [{"input_ids": row, "labels": row if labels == "ids" else torch.tensor(i % 3)} for i, row in enumerate(ids)]


def trainer_evaluate_and_predict(model: PreTrainedModel, labels: str) -> list:
    with tempfile.TemporaryDirectory() as folder:
        run = trainer(model, folder)
        metrics = run.evaluate(text_examples(model, labels))
        predictions = run.predict(text_examples(model, labels)).predictions
    return [metrics["eval_loss"], predictions]


def trainer_train(model: PreTrainedModel) -> list:
    with tempfile.TemporaryDirectory() as folder:
        run = trainer(model, folder, max_steps=3)
        run.train_dataset = text_examples(model, "ids")
        run.train()
    return [entry["loss"] for entry in run.state.log_history if "loss" in entry]


def resized_trained_and_reloaded(model: PreTrainedModel, size: int) -> list:
    """resize_token_embeddings below a special id, a training step under a Trainer that checkpoints, the checkpoint
    loaded again: its logits and the ids it kept."""
    model.resize_token_embeddings(size)
    with tempfile.TemporaryDirectory() as folder:
        run = trainer(model, folder, max_steps=1, save_strategy="steps", save_steps=1)
        run.train_dataset = text_examples(model, "ids")
        run.train()
        again = AutoModelForCausalLM.from_pretrained(Path(folder, "checkpoint-1")).eval()
    return [logits(again, input_ids=prompts(again)), again.config.vocab_size, again.config.pad_token_id]


def classify_after_resize(model: PreTrainedModel, size: int) -> torch.Tensor:
    """A pad id outside the resized vocabulary matches no input id: every row is classified at its last token."""
    model.resize_token_embeddings(size)
    return classify(model, input_ids=prompts(model))


def smaller_vocabulary_on_load(model: PreTrainedModel, size: int) -> list:
    """from_pretrained(folder, vocab_size=size, ignore_mismatched_sizes=True): new, smaller embeddings and head."""
    again = reloaded(model, AutoModelForCausalLM, vocab_size=size, ignore_mismatched_sizes=True)
    head, embeddings = again.get_output_embeddings().weight, again.get_input_embeddings().weight
    return [logits(again, input_ids=prompts(again)), head.shape, embeddings.shape, again.config.eos_token_id]


def lora(model: PreTrainedModel, merge: bool) -> torch.Tensor:
    """LoRA on the attention's stacked projection (GPT-2's `c_attn`, Turner's `qkv_proj`), with random B so that
    the adapter changes the answer."""
    from peft import LoraConfig, get_peft_model

    target = "c_attn" if isinstance(model, GPT2PreTrainedModel) else "qkv_proj"
    torch.manual_seed(0)  # the same random A and B for both
    config = LoraConfig(r=4, target_modules=[target], init_lora_weights=False, fan_in_fan_out=target == "c_attn")
    adapted = get_peft_model(model, config)
    if merge:
        adapted = adapted.merge_and_unload()
    return logits(adapted, **padded(model, "left"))


def compiled(model: PreTrainedModel, backend: str) -> torch.Tensor:
    torch._dynamo.reset()
    return logits(torch.compile(model, backend=backend), **padded(model, "left"), use_cache=False)


def exported(model: PreTrainedModel) -> torch.Tensor:
    batch = padded(model, "left")
    program = torch.export.export(model, args=(), kwargs={**batch, "use_cache": False})
    return program.module()(**batch, use_cache=False).logits


def classify(model: PreTrainedModel, **inputs) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs).logits


def classifier_loss(model: PreTrainedModel, problem: str) -> torch.Tensor:
    batch = padded(model, "right")
    labels = {"single_label_classification": torch.tensor([2, 0]), "regression": torch.tensor([0.5, -1.0])}
    labels["multi_label_classification"] = torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0]])
    model.config.problem_type = problem
    if problem == "regression":
        return model(**batch).logits[:, :1]  # a regression head is num_labels=1: compare the first logit's path
    return model(**batch, labels=labels[problem]).loss


def with_token_types(model: PreTrainedModel) -> torch.Tensor:
    batch = padded(model, "right")
    return classify(model, **batch, token_type_ids=(torch.arange(8) >= 4).long().expand(2, 8) * batch["attention_mask"])


def bidirectional_4d_mask(model: PreTrainedModel) -> torch.Tensor:
    batch = padded(model, "right")
    allowed = batch["attention_mask"][:, None, None, :].bool().expand(2, 1, 8, 8)
    mask = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
    return classify(model, input_ids=batch["input_ids"], attention_mask=mask)


def pooled(model: PreTrainedModel) -> list:
    with torch.no_grad():
        out = model(**padded(model, "right"))
    return [out.last_hidden_state, out.pooler_output]


def classify_images(model: PreTrainedModel, size: int = IMAGE, **options) -> torch.Tensor:
    return classify(model, pixel_values=images(2, size), **options)


def image_loss(model: PreTrainedModel) -> torch.Tensor:
    return model(pixel_values=images(), labels=torch.tensor([2, 1])).loss


def image_attentions(model: PreTrainedModel) -> tuple:
    model.set_attn_implementation("eager")
    with torch.no_grad():
        return model(pixel_values=images(), output_attentions=True).attentions


@dataclass(frozen=True)
class Action:
    pair: Callable[[], tuple[PreTrainedModel, PreTrainedModel]]
    act: Callable[[PreTrainedModel], object]
    tolerance: float = TOLERANCE

    def assert_turner_answers_as_the_anchor(self) -> None:
        """`act` on the Turner model of `pair()` gives what it gives on the anchor (acted on first), to `tolerance`."""
        anchor, turner = self.pair()
        expected = self.act(anchor)
        assert_same(self.act(turner), expected, self.tolerance)


def on(pair, act, tolerance: float = TOLERANCE, **settings) -> Action:
    """`act(model, **settings)` on each model of `pair()`."""
    return Action(pair, functools.partial(act, **settings), tolerance)


CACHES = ["dynamic", "static", "user DynamicCache", "user StaticCache", "no cache"]
SEEDED = {
    "beam search": dict(num_beams=3, do_sample=False),
    "beam search, 2 returned, length penalty": dict(num_beams=3, num_return_sequences=2, length_penalty=0.5),
    "beam sampling": dict(num_beams=2, do_sample=True),
    "sampling top-k, temperature": dict(do_sample=True, top_k=10, temperature=0.7),
    "sampling top-p, 3 returned": dict(do_sample=True, top_p=0.9, num_return_sequences=3),
    "repetition penalty, no repeated bigram": dict(do_sample=False, repetition_penalty=1.5, no_repeat_ngram_size=2),
    "min-p, bad words": dict(do_sample=True, min_p=0.05, bad_words_ids=[[5], [6, 7]]),
}
CACHE_OPERATIONS = ["crop", "reorder_cache", "batch_select_indices", "batch_repeat_interleave"]

ACTIONS: dict[str, Action] = {
    **{
        f"generate, {cache} cache, {side} padding": on(causal_lm, anchors.generate_padded, cache=cache, side=side)
        for cache in CACHES
        for side in ("left", "right")
    },
    **{f"generate, {name}": on(causal_lm, anchors.generate_seeded, **settings) for name, settings in SEEDED.items()},
    "generate, scores": on(causal_lm, anchors.generate_scores),
    "generate from inputs_embeds": on(causal_lm, anchors.generate_from_embeddings),
    "generate, prompt lookup": on(causal_lm, anchors.generate_assisted, prompt_lookup_num_tokens=3),
    "generate from a prefix cache, twice": on(causal_lm, anchors.generate_from_a_prefix_cache),
    "generation_config edited": on(causal_lm, generation_config_edit),
    "cache: resume after exploring a deep copy": on(causal_lm, anchors.resume_after_exploring_a_deep_copy),
    "cache: reset, then another prompt": on(causal_lm, anchors.logits_after_a_reset),
    **{f"cache: {op}, then continue": on(causal_lm, anchors.continue_after, operation=op) for op in CACHE_OPERATIONS},
    "cache: decoding loop by hand, left padding": on(causal_lm, anchors.decode_by_hand),
    **{
        f"forward: {what}": on(causal_lm, forward, what=what)
        for what in (
            "logits, right padding",
            "loss with labels",
            "inputs_embeds",
            "logits_to_keep",
            "hidden states",
            "eager attention weights",
            "tuple output",
        )
    },
    "float64 forward": on(causal_lm, in_dtype, dtype=torch.float64),
    "bfloat16 forward": on(causal_lm, in_dtype, dtype=torch.bfloat16, tolerance=3e-2),
    "backward: embedding gradient": on(causal_lm, embedding_gradient, checkpointing=False),
    "backward: gradient checkpointing": on(causal_lm, embedding_gradient, checkpointing=True),
    "resize_token_embeddings up": on(causal_lm, resized, size=80),
    "resize_token_embeddings down": on(causal_lm, resized, size=50),
    "resize_token_embeddings, pad_to_multiple_of": on(causal_lm, resized, size=65, multiple=16),
    "untied head: logits, and the head kept apart": on(functools.partial(causal_lm, tie_word_embeddings=False), untied),
    "save, from_pretrained": on(causal_lm, reload_logits),
    "save, from_pretrained(dtype=bfloat16)": on(causal_lm, reload_logits, dtype=torch.bfloat16, tolerance=3e-2),
    "save, from_pretrained(tie_word_embeddings=False), edit": on(causal_lm, untied_then_edited),
    "pipeline: text-generation": on(causal_lm, text_generation_pipeline),
    "Trainer: evaluate and predict (causal LM)": on(causal_lm, trainer_evaluate_and_predict, labels="ids"),
    "Trainer: train 3 steps": on(causal_lm, trainer_train, tolerance=1e-4),
    "PEFT: LoRA with target_modules": on(causal_lm, lora, merge=False),
    "PEFT: LoRA merged and unloaded": on(causal_lm, lora, merge=True),
    "torch.export": on(causal_lm, exported),
    # sequence classification, GPT-2's last-token pooling
    **{
        f"classify, {side} padding, 2-D mask": on(
            last_token_classifier, anchors.classify_padded, side=side, with_mask=True
        )
        for side in ("left", "right")
    },
    **{
        f"classifier loss, {problem}": on(last_token_classifier, classifier_loss, problem=problem)
        for problem in ("single_label_classification", "multi_label_classification", "regression")
    },
    "pipeline: text-classification": on(last_token_classifier, text_classification_pipeline),
    "Trainer: evaluate and predict (classifier)": on(
        last_token_classifier, trainer_evaluate_and_predict, labels="classes"
    ),
    # BERT: bidirectional text, the pooler
    "BERT classify, right padding, 2-D mask": on(
        bert_classifier, anchors.classify_padded, side="right", with_mask=True
    ),
    "BERT classify, token types": on(bert_classifier, with_token_types),
    "BERT classify, 4-D mask": on(bert_classifier, bidirectional_4d_mask),
    "BERT backbone: hidden states and pooler": on(bert_backbone, pooled),
    # ViT
    "ViT classify": on(image_classifier, classify_images),
    "ViT classify, interpolate_pos_encoding": on(
        image_classifier, classify_images, size=16, interpolate_pos_encoding=True
    ),
    "ViT loss with labels": on(image_classifier, image_loss),
    "ViT eager attention weights": on(image_classifier, image_attentions),
    "ViT bfloat16": on(image_classifier, lambda m: classify_images(m.to(torch.bfloat16)).float(), tolerance=3e-2),
    "pipeline: image-classification": on(image_classifier, image_classification_pipeline),
}

# Issue 35, items 1, 2, 5, 6, 7 and 8: fail on the code the issue was filed against.
ISSUE_ACTIONS: dict[str, Action] = {
    "item 1: resume a branch kept as list(cache) after crop": on(causal_lm, anchors.resume_after_crop_and_branch),
    "item 1: resume generate()'s cache after crop": on(causal_lm, anchors.resume_generate_cache_after_branch),
    "item 1: keys read before cache.reset()": on(causal_lm, anchors.keys_read_before_a_reset),
    "item 2: use_cache=True in train mode": on(causal_lm, anchors.continue_a_cache_made_in_train_mode),
    "item 5: 4-D float mask, last-token classifier": on(last_token_classifier, anchors.classify_with_a_4d_mask),
    "item 6: pad = eos inside the text, classifier": on(
        functools.partial(last_token_classifier, pad_token_id=2), anchors.eos_inside_the_text
    ),
    "item 6: pad = eos inside the text, causal LM": on(
        functools.partial(causal_lm, pad_token_id=2), anchors.eos_inside_the_text
    ),
    # A batch padded with pad_token_id and no mask: GPT-2 and BERT attend to the padding as to any token (the
    # caller's mask is what hides it); GPT-2's classifier reads pad ids only to find the last real token.
    **{
        f"item 6: classify, {side} padding, no mask": on(
            last_token_classifier, anchors.classify_padded, side=side, with_mask=False
        )
        for side in ("left", "right")
    },
    "item 6: BERT classify, right padding, no mask": on(
        bert_classifier, anchors.classify_padded, side="right", with_mask=False
    ),
    "item 8: cache_position that agrees": on(causal_lm, anchors.forward_with_cache_position),
}


# Issue 44, item 2: a vocabulary made smaller than a special id (transformers warns about the id) saves and loads, as
# GPT-2's does; the input checks refuse the id where a model would look it up.
ISSUE_44_ACTIONS: dict[str, Action] = {
    "resize below the pad id, train a step, checkpoint, reload": on(
        functools.partial(causal_lm, pad_token_id=VOCAB - 1), resized_trained_and_reloaded, tolerance=1e-4, size=10
    ),
    "classify without a mask after a resize below the pad id": on(
        functools.partial(last_token_classifier, pad_token_id=VOCAB - 1), classify_after_resize, size=10
    ),
    "from_pretrained(vocab_size=4, ignore_mismatched_sizes=True), below the eos id": on(
        functools.partial(causal_lm, eos_token_id=VOCAB - 1), smaller_vocabulary_on_load, size=4
    ),
}


# Issue 58: the token-level heads (masked LM, token classification, extractive QA) beside BERT's and GPT-2's.


def bert_masked_lm(**overrides):
    return converted(BertForMaskedLM(bert_config(**overrides)), bert)


def token_tagger(family: str):
    if family == "BERT":
        return converted(BertForTokenClassification(bert_config()), bert)
    return converted(GPT2ForTokenClassification(gpt2_config(classifier_dropout=0.0)), gpt2)


def span_scorer(family: str):
    if family == "BERT":
        return converted(BertForQuestionAnswering(bert_config(num_labels=2)), bert)
    return converted(GPT2ForQuestionAnswering(gpt2_config()), gpt2)


def at_real_tokens(model: PreTrainedModel, side: str) -> torch.Tensor:
    """The logits of each real token of a padded batch (what a padded position holds is not defined)."""
    batch = padded(model, side)
    return logits(model, **batch)[batch["attention_mask"].bool()]


def per_token_loss(model: PreTrainedModel, side: str) -> torch.Tensor:
    """The loss with -100 on the padding and on a few real tokens (a masked LM's unmasked ones, a word's later
    sub-tokens), the labels the vocabulary or the classes."""
    batch = padded(model, side)
    classes = model.config.vocab_size if hasattr(model, "lm_head") or hasattr(model, "cls") else model.config.num_labels
    labels = (batch["input_ids"] * 7 % classes).masked_fill(batch["attention_mask"] == 0, -100)
    labels[0, ::3] = -100
    return model(**batch, labels=labels).loss


def span_loss(model: PreTrainedModel, side: str, positions_column: bool) -> list:
    """The span loss with one row's answer past the input (clamped and ignored, as BERT's), and the span scores."""
    batch = padded(model, side)
    starts, ends = torch.tensor([2, 30]), torch.tensor([5, 40])
    if positions_column:
        starts, ends = starts[:, None], ends[:, None]
    outputs = model(**batch, start_positions=starts, end_positions=ends)
    mask = batch["attention_mask"].bool()
    return [outputs.loss, outputs.start_logits[mask], outputs.end_logits[mask]]


def span_over_stride_windows(model: PreTrainedModel) -> tuple[str, float]:
    tokenizer = word_tokenizer(SPECIALS)
    context = " ".join(["the big red cat sat on a blue mat and a small dog ran far away"] * 4)
    return best_span(model, tokenizer, "where the cat sat", context)


def fill_mask_pipeline(model: PreTrainedModel) -> list:
    filler = pipeline("fill-mask", model=model, tokenizer=word_tokenizer({**SPECIALS, "mask_token": "<mask>"}), top_k=4)
    answers = filler(["the big <mask> sat on a mat", "a <mask> dog"])
    return [[(guess["token_str"], guess["score"]) for guess in answer] for answer in answers]


def masked_lm_trainer(model: PreTrainedModel) -> list:
    """Three steps of the Trainer (SGD) on DataCollatorForLanguageModeling(mlm=True)'s masked batches (the same masks:
    the Trainer seeds them), then the evaluation loss. The two models' gradients agree to 1e-6 (the same sums in
    another order); measured on this tiny model, the losses drift apart by ~1e-4 after two updates (~5e-4 under
    Adam, whose first steps follow the gradients' signs): hence SGD and the tolerance."""
    tokenizer = word_tokenizer({**SPECIALS, "mask_token": "<mask>"})
    collator = DataCollatorForLanguageModeling(tokenizer, mlm=True, mlm_probability=0.3)
    rows = [{"input_ids": row} for row in prompts(model, batch=4, length=8) % len(tokenizer)]
    with tempfile.TemporaryDirectory() as folder:
        run = trainer(model, folder, max_steps=3, learning_rate=0.1, optim="sgd")
        run.data_collator, run.train_dataset = collator, rows
        run.train()
        torch.manual_seed(0)
        evaluation = run.evaluate(rows)["eval_loss"]
    return [[entry["loss"] for entry in run.state.log_history if "loss" in entry], evaluation]


ISSUE_58_ACTIONS: dict[str, Action] = {
    **{
        f"masked LM: logits, {side} padding": on(bert_masked_lm, at_real_tokens, side=side)
        for side in ("left", "right")
    },
    "masked LM: loss, -100 on the padding and unmasked tokens": on(bert_masked_lm, per_token_loss, side="right"),
    "masked LM: resize_token_embeddings up (decoder bias too)": on(bert_masked_lm, resized, size=80),
    "masked LM: untied decoder": on(functools.partial(bert_masked_lm, tie_word_embeddings=False), untied),
    "pipeline: fill-mask": on(bert_masked_lm, fill_mask_pipeline),
    "Trainer: masked LM on DataCollatorForLanguageModeling(mlm=True)": on(
        bert_masked_lm, masked_lm_trainer, tolerance=1e-3
    ),
    **{
        f"{family} token classification: {what}, {side} padding": on(
            functools.partial(token_tagger, family), act, side=side
        )
        for family in ("BERT", "GPT-2")
        for side in ("left", "right")
        for what, act in (("logits", at_real_tokens), ("loss with -100", per_token_loss))
    },
    **{
        f"{family} question answering: span loss, an answer past the input, positions {shape}, {side} padding": on(
            functools.partial(span_scorer, family), span_loss, side=side, positions_column=shape == "(batch, 1)"
        )
        for family in ("BERT", "GPT-2")
        for side in ("left", "right")
        for shape in ("(batch,)", "(batch, 1)")
    },
    **{
        f"{family} question answering: the best span over a long context's stride windows": on(
            functools.partial(span_scorer, family), span_over_stride_windows
        )
        for family in ("BERT", "GPT-2")
    },
}


@pytest.mark.parametrize("action", list(ISSUE_58_ACTIONS))
def test_issue_58_the_token_level_heads_answer_as_the_anchor(action):
    ISSUE_58_ACTIONS[action].assert_turner_answers_as_the_anchor()


@pytest.mark.parametrize("action", list(ACTIONS))
def test_turner_answers_as_the_anchor(action):
    ACTIONS[action].assert_turner_answers_as_the_anchor()


@pytest.mark.parametrize("action", list(ISSUE_ACTIONS))
def test_issue_35_turner_answers_as_the_anchor(action):
    ISSUE_ACTIONS[action].assert_turner_answers_as_the_anchor()


@pytest.mark.parametrize("action", list(ISSUE_44_ACTIONS))
def test_issue_44_turner_answers_as_the_anchor(action):
    ISSUE_44_ACTIONS[action].assert_turner_answers_as_the_anchor()


def test_issue_44_item_2_generate_feeding_back_a_pad_id_outside_the_vocabulary_is_refused_by_name():
    """A row that ends early is padded with pad_token_id, which the next step looks up: GPT-2 fails inside torch."""
    anchor, turner = causal_lm(pad_token_id=VOCAB - 1)
    for model in (anchor, turner):
        model.resize_token_embeddings(10)
    ids = prompts(turner)
    first = turner.generate(ids, max_new_tokens=1, do_sample=False)[:, -1]
    assert first[0] != first[1]
    settings = dict(max_new_tokens=3, do_sample=False, eos_token_id=int(first[0]))  # the first row ends at once
    with pytest.raises(IndexError):
        anchor.generate(ids, **settings)
    with pytest.raises(ValueError, match=rf"`pad_token_id` {VOCAB - 1} is invalid"):  # names the id
        turner.generate(ids, **settings)
    turner.config.check_input_values = False  # the switch turns the refusal off: torch's error, as GPT-2's
    with pytest.raises(IndexError):
        turner.generate(ids, **settings)


@pytest.mark.parametrize("pad_token_id", [-1, VOCAB + 5])
def test_issue_50_item_1_a_pad_id_no_row_can_feed_back_generates_as_gpt2(pad_token_id):
    """An eos id outside the vocabulary ends no row, so the pad id is never fed back: Turner generates GPT-2's tokens
    (transformers' GenerationTesterMixin sets pad and eos to -1 for this)."""
    anchor, turner = causal_lm()
    ids = prompts(turner)
    settings = dict(max_new_tokens=6, do_sample=False, eos_token_id=-1, pad_token_id=pad_token_id)
    expected = anchor.generate(ids, **settings)
    assert expected.shape == (ids.shape[0], ids.shape[1] + 6)  # no row ended
    assert_same(turner.generate(ids, **settings), expected)


def test_issue_44_item_1_python_floats_are_compared_to_the_tolerance():
    """A Trainer's loss on an Intel Xeon (AVX-512) against GPT-2's: the same sums in another order."""
    assert_same([2.973121166229248], [2.973121404647827])
    with pytest.raises(AssertionError):
        assert_same([2.9731], [2.9732])


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
def test_issue_35_item_7_a_packed_row_answers_each_sequence_alone(training):
    """GPT-2 lets the second sequence attend into the first in eval mode (it makes a cache, and transformers skips
    its packing detection when a cache is passed); the answer to match is GPT-2 on each sequence alone."""
    anchor, turner = causal_lm()
    assert_same(anchors.packed_row(turner, training), anchors.each_sequence_alone(anchor))


def test_issue_35_item_4_mean_pooling_reads_a_4d_mask_as_its_2d_mask():
    """No anchor pools by the mean; the 4-D mask must mean what the 2-D mask it was made from means."""
    _, turner = last_token_classifier()
    turner.config.classifier_pooling = "mean"
    assert_same(anchors.classify_with_a_4d_mask(turner), anchors.classify_padded(turner, "right", with_mask=True))


def test_issue_35_item_3_bidirectional_lm_generates_the_same_with_and_without_a_cache():
    """A bidirectional model cannot reuse keys: each new token changes every earlier representation. There is no
    anchor to copy: `BertLMHeadModel(is_decoder=False)` returns no cache, but generate() still feeds it only the new
    token, so its cached generation decodes without context (transformers 5.24). Turner must decode with context."""
    settings = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4)
    settings |= dict(pad_token_id=0, bos_token_id=1, eos_token_id=2, initializer_range=0.3)
    lm = TurnerForCausalLM(TurnerConfig(**settings, is_causal=False, max_position_embeddings=32)).eval()
    cached = lm.generate(**padded(lm, "left"), **anchors.GREEDY, output_scores=True, return_dict_in_generate=True)
    uncached = lm.generate(
        **padded(lm, "left"), **anchors.GREEDY, use_cache=False, output_scores=True, return_dict_in_generate=True
    )
    assert_same(torch.stack(cached.scores), torch.stack(uncached.scores))


@pytest.mark.parametrize("family", ["GPT-2", "Turner"])
def test_issue_35_item_4_a_config_edited_after_construction_builds_the_model_the_constructor_would(family):
    """GPT-2 derives its MLP width when the model is built; Turner must not keep head_dim and intermediate_size
    derived from the values before the edit."""
    if family == "GPT-2":
        edited, direct = GPT2Config(n_embd=32, n_head=4, n_layer=1), GPT2Config(n_embd=48, n_head=4, n_layer=1)
        edited.n_embd = 48
        build = GPT2LMHeadModel
    else:
        edited = TurnerConfig(vocab_size=VOCAB, hidden_size=32, num_attention_heads=4, num_hidden_layers=1)
        direct = TurnerConfig(vocab_size=VOCAB, hidden_size=48, num_attention_heads=4, num_hidden_layers=1)
        edited.hidden_size, edited.num_attention_heads = 48, 4
        build = TurnerForCausalLM
    shapes = [{name: p.shape for name, p in build(config).named_parameters()} for config in (edited, direct)]
    assert shapes[0] == shapes[1]


@pytest.mark.parametrize("family", ["ViT", "Turner"])
def test_issue_35_item_4_an_image_classifier_loads_at_a_higher_resolution(family):
    """The usual recipe: from_pretrained(folder, image_size=..., ignore_mismatched_sizes=True), new positions."""
    anchor, turner = image_classifier()
    model = reloaded(
        anchor if family == "ViT" else turner,
        AutoModelForImageClassification,
        image_size=16,
        ignore_mismatched_sizes=True,
    )
    assert classify_images(model, size=16).shape == (2, 3)


# Deliberately different from the anchor: a refusal by name where the anchor ignores the input or fails in torch.


@pytest.mark.parametrize("override", [{"classifier_pooling": "cls"}, {"use_pooler": True}])
def test_issue_35_item_4_a_causal_folder_refuses_first_token_pooling_on_load(override):
    """GPT-2 has no such switch. Under the causal mask the first token sees only itself: every text would get the
    same logits, so Turner refuses the override as its constructor refuses the same values."""
    _, turner = causal_lm()
    with pytest.raises(ValueError, match=next(iter(override))):
        reloaded(turner, AutoModelForSequenceClassification, **override)


def test_issue_35_item_8_a_cache_position_that_disagrees_is_refused():
    """GPT-2 ignores `cache_position`; Turner checks it against the positions it derives."""
    anchor, turner = causal_lm()
    ids = prompts(turner)
    anchors.step(anchor, ids, cache_position=torch.arange(3, 11))  # the anchor says nothing
    with pytest.raises(ValueError, match="cache_position"):
        anchors.step(turner, ids, cache_position=torch.arange(3, 11))


@pytest.mark.parametrize(
    ("inputs", "name"),
    [
        ({"input_ids": torch.tensor([[5, VOCAB + 3]])}, "input_ids"),  # another tokenizer's ids
        ({"input_ids": torch.full((1, 40), 5)}, "max_position_embeddings"),  # longer than the positions
    ],
)
def test_out_of_range_input_is_refused_by_name_where_gpt2_fails_inside_torch(inputs, name):
    anchor, turner = causal_lm()
    with pytest.raises(IndexError):
        anchor(**inputs)
    with pytest.raises(ValueError, match=name):
        turner(**inputs)


def test_lora_without_target_modules_names_the_missing_argument():
    """Issue 35 item 9: PEFT knows GPT-2's attention by its model type and not Turner's, which needs
    `target_modules` (docs/workflows.md); PEFT's own error names it."""
    from peft import LoraConfig, get_peft_model

    anchor, turner = causal_lm()
    get_peft_model(anchor, LoraConfig(task_type="CAUSAL_LM"))
    with pytest.raises(ValueError, match="target_modules"):
        get_peft_model(turner, LoraConfig(task_type="CAUSAL_LM"))


@pytest.mark.parametrize("backend", ["eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_torch_compile_answers_as_gpt2(backend):
    """torch.compile(model) (dynamo alone with the eager backend: cheap; inductor: slow), against GPT-2 uncompiled."""
    anchor, turner = causal_lm()
    assert_same(compiled(turner, backend), logits(anchor, **padded(anchor, "left"), use_cache=False))


@pytest.mark.gpu
@pytest.mark.parametrize("side", ["left", "right"])
def test_generate_with_the_offloaded_cache_answers_as_gpt2(side):
    """`cache_implementation="offloaded"` needs CUDA (its prefetch uses CUDA streams)."""
    anchor, turner = (model.to("cuda") for model in causal_lm())
    expected = anchors.generate_padded(anchor, "offloaded", side)
    assert_same(anchors.generate_padded(turner, "offloaded", side), expected)


# The same actions on a saved folder loaded as remote code, in a process where `turner_tfm` cannot be imported.
REMOTE_LOADER = textwrap.dedent(
    """
    import copy, json, logging, sys
    sys.modules["turner_tfm"] = None
    import importlib.util, torch, transformers
    spec = importlib.util.spec_from_file_location("anchors", sys.argv[2])  # tests/anchors.py, by its path
    anchors = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(anchors)

    warned = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: warned.append(record.getMessage())
    logging.getLogger("transformers").addHandler(handler)
    loaded = {}
    for folder, auto_name, function, settings, outputs_file in json.loads(sys.argv[1]):
        if folder not in loaded:
            loaded[folder] = getattr(transformers, auto_name).from_pretrained(folder, trust_remote_code=True)
            assert type(loaded[folder]).__module__.startswith("transformers_modules"), type(loaded[folder])
        model = copy.deepcopy(loaded[folder]).eval()  # an action may change the model
        torch.manual_seed(0)
        try:
            answer = getattr(anchors, function)(model, **settings)
        except Exception as error:  # reported by the test that compares this action
            answer = f"{type(error).__name__}: {error}"
        torch.save({"answer": answer, "warned": warned[:]}, outputs_file)
        warned.clear()
    """
)
REMOTE_ACTIONS = {
    name: ((ACTIONS | ISSUE_ACTIONS)[name], (ACTIONS | ISSUE_ACTIONS)[name].act)
    for name in [
        "generate, dynamic cache, left padding",
        "generate, beam search",
        "cache: reorder_cache, then continue",
        *(name for name in ISSUE_ACTIONS if "BERT" not in name),
    ]
}
REMOTE_ACTIONS["item 7: packed row, eval"] = (
    Action(causal_lm, functools.partial(anchors.packed_row, training=False)),
    anchors.each_sequence_alone,
)


@pytest.fixture(scope="module")
def remote_answers(tmp_path_factory) -> dict[str, tuple[object, dict]]:
    """Each remote action's anchor answer and what the folder loaded as remote code answered (and logged)."""
    root = tmp_path_factory.mktemp("remote")
    folders, expected, jobs = {}, {}, []
    for index, (name, (action, anchor_act)) in enumerate(REMOTE_ACTIONS.items()):
        torch.manual_seed(0)
        anchor, turner = action.pair()
        if action.pair not in folders:
            folders[action.pair] = root / f"folder{len(folders)}"
            turner.save_pretrained(folders[action.pair])
        expected[name] = anchor_act(anchor)
        auto = "AutoModelForCausalLM" if isinstance(turner, TurnerForCausalLM) else "AutoModelForSequenceClassification"
        act = action.act
        jobs.append([str(folders[action.pair]), auto, act.func.__name__, act.keywords, str(root / f"{index}.pt")])
    run_isolated(REMOTE_LOADER, [json.dumps(jobs), str(Path(__file__).with_name("anchors.py"))], root)
    return {name: (expected[name], torch.load(job[-1])) for name, job in zip(REMOTE_ACTIONS, jobs, strict=True)}


@pytest.mark.parametrize("action", list(REMOTE_ACTIONS))
def test_a_folder_loaded_as_remote_code_answers_as_gpt2(action, remote_answers):
    expected, remote = remote_answers[action]
    assert not [message for message in remote["warned"] if "deprecat" in message.lower()], remote["warned"]
    assert not isinstance(remote["answer"], str), remote["answer"]
    assert_same(remote["answer"], expected, REMOTE_ACTIONS[action][0].tolerance)
