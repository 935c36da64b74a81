"""The paper's design choices as config switches, each alone and together, through every model path."""

import pytest
import torch
from transformers import AutoModelForCausalLM, StaticCache

from turner_tfm import TurnerForCausalLM, TurnerForImageClassification, TurnerForSequenceClassification, TurnerModel
from turner_tfm.compat_turner import output_cache

from .test_remote_code import load_without_the_package
from .tiny import image_config, random_ids, text_config

SWITCHES = {
    "share_query_key": {"share_query_key": True},
    "rotary": {"position_embedding_type": "rotary"},
    "concat_learned": {"position_embedding_combine": "concat"},
    "concat_sinusoidal": {"position_embedding_type": "sinusoidal", "position_embedding_combine": "concat"},
    "rmsnorm": {"normalization": "rmsnorm"},
    "batchnorm": {"normalization": "batchnorm"},
    "post_norm": {"norm_position": "post"},
    "two_hidden_layers": {"mlp_hidden_layers": 2},
    "combined": {
        "share_query_key": True,
        "position_embedding_type": "rotary",
        "normalization": "rmsnorm",
        "norm_position": "post",
        "mlp_hidden_layers": 2,
    },
    "combined_concat": {
        "share_query_key": True,
        "position_embedding_type": "sinusoidal",
        "position_embedding_combine": "concat",
        "normalization": "batchnorm",
        "mlp_hidden_layers": 2,
    },
}


def causal_lm(switch: str, **overrides) -> TurnerForCausalLM:
    torch.manual_seed(0)
    return TurnerForCausalLM(text_config(**{**SWITCHES[switch], **overrides})).eval()


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("switch", list(SWITCHES))
def test_cached_logits_equal_full_logits(switch, implementation):
    model = causal_lm(switch, attn_implementation=implementation)
    ids = random_ids(2, 10)
    with torch.no_grad():
        full = model(ids).logits
        prefix = model(ids[:, :6], use_cache=True)
        rest = model(ids[:, 6:], cache=output_cache(prefix), use_cache=True).logits
    torch.testing.assert_close(torch.cat([prefix.logits, rest], dim=1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("switch", list(SWITCHES))
def test_generation_with_static_and_dynamic_caches_and_left_padding(switch):
    model = causal_lm(switch)
    prompt, short = random_ids(1, 6, seed=1), random_ids(1, 3, seed=2)
    greedy = {"max_new_tokens": 8, "do_sample": False, "pad_token_id": 0}
    alone = model.generate(prompt, **greedy)
    assert torch.equal(model.generate(prompt, cache_implementation="static", **greedy), alone)
    batch = torch.cat([prompt, torch.nn.functional.pad(short, (3, 0), value=0)])
    together = model.generate(batch, attention_mask=(batch != 0).long(), **greedy)
    assert torch.equal(together[0], alone[0])
    assert torch.equal(together[1, 6:], model.generate(short, **greedy)[0, 3:])


@pytest.mark.parametrize("switch", list(SWITCHES))
def test_classification_heads_train(switch):
    text = TurnerForSequenceClassification(text_config(**{**SWITCHES[switch], "is_causal": False, "num_labels": 3}))
    loss = text(random_ids(2, 7), labels=torch.tensor([0, 2])).loss
    image = TurnerForImageClassification(image_config(**SWITCHES[switch]))
    loss = loss + image(torch.randn(2, 3, 16, 16), labels=torch.tensor([1, 2])).loss
    loss.backward()
    for model in (text, image):
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize("switch", list(SWITCHES))
def test_save_and_load_round_trip(switch, tmp_path):
    model = causal_lm(switch)
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert loaded.config.to_diff_dict() == model.config.to_diff_dict()
    ids = random_ids(2, 6)
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits, rtol=1e-6, atol=1e-7)


def test_every_switch_loads_with_trust_remote_code_without_the_package(tmp_path):
    ids = random_ids(2, 6)
    jobs, expected = [], []
    for switch in SWITCHES:
        model = causal_lm(switch)
        folder = tmp_path / switch
        model.save_pretrained(folder)
        torch.save({"input_ids": ids}, folder / "inputs.pt")
        jobs.append([str(folder), "AutoModelForCausalLM", str(folder / "inputs.pt"), str(folder / "remote.pt")])
        with torch.no_grad():
            expected.append(model(ids).logits)
    for (logits, _), reference in zip(load_without_the_package(jobs, tmp_path), expected, strict=True):
        torch.testing.assert_close(logits, reference, rtol=1e-6, atol=1e-7)


# --- what each switch means -------------------------------------------------------------------------------------


def test_shared_query_key_has_one_projection_and_symmetric_scores():
    bidirectional = {"is_causal": False, "position_embedding_type": "none", "attn_implementation": "eager"}
    model = causal_lm("share_query_key", **bidirectional)
    attention = model.model.layers[0].self_attn
    assert attention.qkv_proj.out_features == 2 * 32  # U_q and U_v stacked, no U_k
    separate = causal_lm("share_query_key", share_query_key=False, **bidirectional)
    assert separate.num_parameters() - model.num_parameters() == 2 * (32 * 32 + 32)

    def log_attention_is_symmetric_up_to_row_constants(model: TurnerForCausalLM) -> bool:
        # log A[i, j] = s[i, j] - c_i; with s symmetric, D = log A - log A^T satisfies D[i, j] = D[0, j] - D[0, i].
        with torch.no_grad():
            weights = model(random_ids(1, 6), output_attentions=True).attentions[0][0]
        difference = weights.log() - weights.log().transpose(-1, -2)
        from_first_row = difference[:, :1, :] - difference[:, 0, :, None]
        return torch.allclose(difference, from_first_row, atol=1e-4)

    assert log_attention_is_symmetric_up_to_row_constants(model)
    assert not log_attention_is_symmetric_up_to_row_constants(separate)


def test_rotary_positions_are_relative_and_run_past_the_trained_length():
    model = causal_lm("rotary")
    ids = random_ids(1, 8)
    with torch.no_grad():
        at_zero = model(ids, position_ids=torch.arange(8)[None]).logits
        shifted = model(ids, position_ids=torch.arange(8)[None] + 500).logits
        reversed_order = model(ids.flip(1)).logits
    torch.testing.assert_close(shifted, at_zero, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(reversed_order[:, -1], at_zero[:, -1], atol=1e-3)
    long_ids = random_ids(1, 100)  # max_position_embeddings is 64
    cache = StaticCache(config=model.config, max_cache_len=100)
    with torch.no_grad():
        assert torch.isfinite(model(long_ids, cache=cache, use_cache=True).logits).all()


def test_concatenated_positions_fill_the_last_features():
    model = TurnerModel(text_config(**SWITCHES["concat_learned"])).eval()
    assert model.embeddings.embed_tokens.weight.shape == (99, 24)
    with torch.no_grad():
        first = model(random_ids(2, 5), output_hidden_states=True).hidden_states[0]
    table = model.embeddings.embed_positions.weight
    torch.testing.assert_close(first[..., 24:], table[:5].expand(2, -1, -1))
    image = TurnerForImageClassification(image_config(position_embedding_combine="concat")).model
    assert image.embeddings.patch_embed.out_channels == 24 and image.embeddings.cls_token.shape[-1] == 24


def test_batchnorm_shares_statistics_across_the_batch_while_training():
    model = causal_lm("batchnorm")
    assert isinstance(model.model.layers[0].attn_norm, torch.nn.BatchNorm1d)
    ids, others = random_ids(1, 6, seed=1), random_ids(3, 6, seed=2)
    with torch.no_grad():
        model.train()
        alone_train = model(ids).logits
        with_others_train = model(torch.cat([ids, others])).logits[:1]
        model.eval()
        alone_eval = model(ids).logits
        with_others_eval = model(torch.cat([ids, others])).logits[:1]
    assert not torch.allclose(alone_train, with_others_train, atol=1e-4)
    torch.testing.assert_close(alone_eval, with_others_eval, atol=1e-5, rtol=1e-5)
    assert int(model.model.layers[0].attn_norm.num_batches_tracked) == 2


def test_rmsnorm_and_two_hidden_layer_mlp_build_what_they_say():
    rms = causal_lm("rmsnorm")
    assert all(isinstance(m, torch.nn.RMSNorm) for m in (rms.model.norm, rms.model.layers[0].mlp_norm))
    deep = causal_lm("two_hidden_layers")
    assert deep.model.layers[0].mlp.hidden_proj.weight.shape == (37, 37)
    assert causal_lm("rmsnorm").model.layers[0].mlp.hidden_proj is None


# --- every switch alone ----------------------------------------------------------------------------------------

# Each field a user may set, at a non-default value, alone on the default text or image config: the defaults it
# implies (tied embeddings, the mask, the pooling) must follow it. Fields that only mean something for text are
# text-only; `is_causal` is flipped against each modality's default.
SHARED_ALONE = {
    "share_query_key": True,
    "position_embedding_type=sinusoidal": ("position_embedding_type", "sinusoidal"),
    "position_embedding_type=rotary": ("position_embedding_type", "rotary"),
    "position_embedding_type=none": ("position_embedding_type", "none"),
    "position_embedding_combine": "concat",
    "position_embedding_size": 8,
    "normalization=rmsnorm": ("normalization", "rmsnorm"),
    "normalization=batchnorm": ("normalization", "batchnorm"),
    "norm_position": "post",
    "mlp_hidden_layers": 2,
    "attention_bias": False,
    "mlp_bias": False,
    "head_dim": 16,
    "hidden_act": "relu",
    "intermediate_size": 20,
    "hidden_dropout": 0.1,
    "attention_dropout": 0.1,
    "classifier_dropout": 0.1,
    "classifier_pooling=mean": ("classifier_pooling", "mean"),
    "use_pooler": True,
}
TEXT_ALONE = {
    **SHARED_ALONE,
    "is_causal": False,
    "classifier_pooling=cls": ("classifier_pooling", "cls"),
    "embedding_layer_norm": True,
    "type_vocab_size": 2,
    "tie_word_embeddings": False,
    "max_position_embeddings": 16,
    "rope_theta": 500.0,
}
IMAGE_ALONE = {**SHARED_ALONE, "is_causal": True, "classifier_pooling=last": ("classifier_pooling", "last")}
ALONE = [("text", name, value) for name, value in TEXT_ALONE.items()] + [
    ("image", name, value) for name, value in IMAGE_ALONE.items()
]
# The default run: the switches that imply another's default, and the paper's block switches; `-m slow` runs all.
IMPLYING = {"position_embedding_combine", "position_embedding_size", "use_pooler", "classifier_pooling=cls"}
IMPLYING |= {"is_causal", "share_query_key", "position_embedding_type=rotary", "normalization=batchnorm"}
IMPLYING |= {"norm_position", "mlp_hidden_layers"}


def alone_model(modality: str, name: str, value: object) -> torch.nn.Module:
    field, value = value if isinstance(value, tuple) else (name, value)
    torch.manual_seed(0)
    if modality == "text":
        return TurnerForCausalLM(text_config(**{field: value}))
    return TurnerForImageClassification(image_config(**{field: value}))


def alone_inputs(modality: str) -> dict[str, torch.Tensor]:
    if modality == "text":
        return {"input_ids": random_ids(2, 7)}
    return {"pixel_values": torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))}


def train_one_step(model: torch.nn.Module, inputs: dict[str, torch.Tensor], name: str) -> None:
    """One SGD step on the model's own loss: finite, and it moves the weights."""
    labels = inputs.get("input_ids", torch.tensor([0, 2]))
    before = [p.detach().clone() for p in model.parameters()]
    loss = model.train()(**inputs, labels=labels).loss
    loss.backward()
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    assert torch.isfinite(loss) and all(torch.isfinite(p).all() for p in model.parameters()), name
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True)), name


@pytest.mark.parametrize(
    "switches",
    [
        pytest.param([case for case in ALONE if case[1] in IMPLYING], id="implying-and-paper"),
        pytest.param(ALONE, id="every-field", marks=pytest.mark.slow),
    ],
)
def test_every_switch_alone_builds_trains_runs_saves_and_loads_as_remote_code(switches, tmp_path):
    jobs, expected = [], []
    for modality, name, value in switches:
        model, inputs = alone_model(modality, name, value), alone_inputs(modality)
        train_one_step(model, inputs, name)
        model.eval()
        if modality == "text":
            generated = model.generate(inputs["input_ids"][:1, :4], max_new_tokens=3, do_sample=False, pad_token_id=0)
            assert generated.shape == (1, 7), name
        folder = tmp_path / f"{modality}-{name}"
        model.save_pretrained(folder)
        torch.save(inputs, folder / "inputs.pt")
        with torch.no_grad():
            logits = model(**inputs).logits
            reloaded = type(model).from_pretrained(folder).eval()
            torch.testing.assert_close(reloaded(**inputs).logits, logits, rtol=1e-6, atol=1e-6, msg=name)
        assert logits.shape == ((2, 7, 99) if modality == "text" else (2, 3)), name
        auto_name = "AutoModelForCausalLM" if modality == "text" else "AutoModelForImageClassification"
        jobs.append([str(folder), auto_name, str(folder / "inputs.pt"), str(folder / "remote.pt")])
        expected.append(logits)
    for job, (remote, _), logits in zip(jobs, load_without_the_package(jobs, tmp_path), expected, strict=True):
        torch.testing.assert_close(remote, logits, rtol=1e-6, atol=1e-6, msg=job[0])
