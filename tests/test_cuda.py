"""The CUDA paths, on a machine with an NVIDIA GPU: `python -m pytest -m gpu` (CI has none; the default run
deselects these, and on a machine without CUDA they fail rather than pass unseen).

Each check compares the GPU against the CPU or against another GPU path: attention implementations, the decoding
loop (appending cache, static cache, compiled), mixed precision training, loading with `device_map`; that a user's
forward pass syncs once (its value checks) and a decoding step of generate() never; and that every bad input the CPU
refuses by name is refused the same way on the GPU, which stays usable afterwards (issue 43)."""

import re
import warnings

import pytest
import torch
from transformers import AutoModelForCausalLM, CompileConfig

from turner_tfm import TurnerForCausalLM, TurnerForImageClassification, TurnerForSequenceClassification
from turner_tfm.compat_turner import output_cache

from .tiny import image_config, random_ids, text_config

pytestmark = pytest.mark.gpu

CUDA = torch.device("cuda")


@pytest.fixture(autouse=True)
def _needs_cuda():
    assert torch.cuda.is_available(), "the gpu tests need a CUDA device (run them with -m gpu on a GPU machine)"


def causal_lm(**overrides) -> TurnerForCausalLM:
    torch.manual_seed(0)
    return TurnerForCausalLM(text_config(initializer_range=0.3, **overrides)).eval()


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("position_embedding_type", ["learned", "rotary"])
def test_cuda_logits_equal_the_cpus(implementation, position_embedding_type):
    model = causal_lm(position_embedding_type=position_embedding_type)
    model.config._attn_implementation = implementation
    ids, mask = random_ids(3, 12), torch.ones(3, 12, dtype=torch.long)
    mask[0, :4] = 0  # a left-padded row
    with torch.no_grad():
        expected = model(ids, attention_mask=mask).logits
        logits = model.to(CUDA)(ids.to(CUDA), attention_mask=mask.to(CUDA)).logits
    torch.testing.assert_close(logits.cpu(), expected, rtol=1e-4, atol=1e-4)


def test_cuda_classifiers_equal_the_cpus():
    torch.manual_seed(0)
    text = TurnerForSequenceClassification(text_config(is_causal=False, num_labels=3)).eval()
    image = TurnerForImageClassification(image_config()).eval()
    ids, pixels = random_ids(2, 9), torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        expected = text(ids).logits, image(pixels).logits
        got = text.to(CUDA)(ids.to(CUDA)).logits, image.to(CUDA)(pixels.to(CUDA)).logits
    for logits, reference in zip(got, expected, strict=True):
        torch.testing.assert_close(logits.cpu(), reference, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cache_implementation", [None, "static"])
def test_cuda_greedy_generation_gives_the_cpus_tokens(cache_implementation):
    model = causal_lm()
    prompt = random_ids(2, 6)
    kwargs = dict(max_new_tokens=20, do_sample=False, pad_token_id=0, cache_implementation=cache_implementation)
    expected = model.generate(prompt, **kwargs)
    assert torch.equal(model.to(CUDA).generate(prompt.to(CUDA), **kwargs).cpu(), expected)


def test_compiled_static_generation_gives_the_eager_tokens():
    model = causal_lm().to(CUDA)
    prompt = random_ids(2, 6).to(CUDA)
    kwargs = dict(max_new_tokens=16, do_sample=False, pad_token_id=0, cache_implementation="static")
    eager = model.generate(prompt, disable_compile=True, **kwargs)
    compiled = model.generate(prompt, compile_config=CompileConfig(fullgraph=True), **kwargs)
    assert torch.equal(compiled, eager)


def syncs(call) -> int:
    """How often `call` waits for the GPU: torch's sync debug mode warns at every device sync."""
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            call()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(warning.message) for warning in caught)


def test_a_users_forward_syncs_once_and_a_decoding_step_of_generate_never():
    """A user's forward pass reads its ids (and labels) back once, together; the steps generate() feeds the model's
    own tokens read nothing (the first check shows the count sees a sync)."""
    model = causal_lm().to(CUDA)
    prompt = random_ids(2, 6).to(CUDA)
    assert syncs(lambda: prompt.sum().item()) == 1
    with torch.no_grad():
        assert syncs(lambda: model(prompt, use_cache=True)) == 1
        cache = output_cache(model(prompt, use_cache=True))
        assert syncs(lambda: model(torch.full((2, 1), 5, device=CUDA), cache=cache, use_cache=True)) == 1
    assert syncs(lambda: model.train()(prompt, labels=prompt).loss.backward()) == 1
    model.eval()
    inside = []  # the syncs inside each forward pass of generate()
    model.register_forward_pre_hook(lambda module, args: inside.append(-syncs_so_far()))
    model.register_forward_hook(lambda module, args, output: inside.append(inside.pop() + syncs_so_far()))
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")

            def syncs_so_far() -> int:
                return sum("synchroniz" in str(warning.message) for warning in caught)

            model.generate(prompt, max_new_tokens=6, min_new_tokens=6, do_sample=False, pad_token_id=0)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert len(inside) == 6 and inside[1:] == [0] * 5, inside


BAD_INPUTS = {
    "a token id >= vocab_size": (
        lambda m, ids: m(torch.tensor([[5, 99]], device=CUDA)),
        "`input_ids` has 99 at row 0, position 1;",
    ),
    "a negative token id": (
        lambda m, ids: m(torch.tensor([[5, -1]], device=CUDA)),
        "`input_ids` has -1 at row 0, position 1;",
    ),
    "an out-of-range id in generate()'s prompt": (
        lambda m, ids: m.generate(torch.tensor([[5, 99]], device=CUDA), max_new_tokens=2),
        "`input_ids` has 99 at row 0, position 1;",
    ),
    "a prompt longer than max_position_embeddings": (
        lambda m, ids: m(random_ids(1, 65).to(CUDA)),
        "max_position_embeddings",
    ),
    "generate() running past the learned positions": (
        lambda m, ids: m.generate(random_ids(1, 60).to(CUDA), max_new_tokens=10),
        "after a prompt of 60 tokens",
    ),
    "position ids past the learned positions": (
        lambda m, ids: m(ids, position_ids=torch.tensor([[0, 1, 2, 3, 4, 64]], device=CUDA)),
        "`position_ids` has 64 at row 0, position 5;",
    ),
    "a label >= vocab_size": (lambda m, ids: m(ids, labels=torch.full_like(ids, 99)), "`labels` has 99 at row 0"),
    "a token type >= type_vocab_size": (
        lambda m, ids: m(ids, token_type_ids=torch.full_like(ids, 2)),
        "`token_type_ids` has 2 at row 0, position 0; token types must be in [0, 2)",
    ),
    "an attention mask of the wrong length": (
        lambda m, ids: m(ids, attention_mask=torch.ones(1, 5, device=CUDA)),
        "`attention_mask`",
    ),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_a_bad_input_on_cuda_gets_the_cpus_error_and_the_gpu_stays_usable(case):
    call, message = BAD_INPUTS[case]
    model = causal_lm(type_vocab_size=2).to(CUDA)
    ids = random_ids(1, 6).to(CUDA)
    with pytest.raises(ValueError, match=re.escape(message)):
        call(model, ids)
    assert torch.ones(3, device=CUDA).sum().item() == 3.0


def test_bad_classifier_inputs_on_cuda_get_the_cpus_errors_and_the_gpu_stays_usable():
    torch.manual_seed(0)
    text = TurnerForSequenceClassification(text_config(is_causal=False, num_labels=3)).to(CUDA)
    image = TurnerForImageClassification(image_config()).to(CUDA)
    with pytest.raises(ValueError, match=r"`labels` has 3 at row 1; class ids"):
        text(random_ids(2, 5).to(CUDA), labels=torch.tensor([0, 3], device=CUDA))
    with pytest.raises(ValueError, match="`pixel_values`"):
        image(torch.randn(2, 3, 32, 32, device=CUDA))
    with pytest.raises(ValueError, match=r"`labels` has -2 at row 0; class ids"):
        image(torch.randn(2, 3, 16, 16, device=CUDA), labels=torch.tensor([-2, 0], device=CUDA))
    assert torch.ones(3, device=CUDA).sum().item() == 3.0


def test_a_trainer_on_cuda_meeting_a_bad_batch_stops_by_name_and_keeps_its_checkpoint(tmp_path):
    from .test_value_checks import train_on_a_bad_batch  # needs `datasets`: a GPU image without it fails this test only

    train_on_a_bad_batch(tmp_path, "cuda")
    assert torch.ones(3, device=CUDA).sum().item() == 3.0


def test_bf16_autocast_training_step_on_cuda_is_finite_and_learns():
    torch.manual_seed(0)
    model = TurnerForCausalLM(text_config()).to(CUDA).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids = random_ids(4, 16).to(CUDA)
    losses = []
    for _ in range(20):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(ids, labels=ids).loss
        loss.backward()
        assert all(p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters())
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0] / 2, losses


@pytest.mark.parametrize("trust_remote_code", [False, True])
def test_a_saved_folder_loads_onto_the_gpu_with_device_map(tmp_path, trust_remote_code):
    model = causal_lm()
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, device_map="cuda", trust_remote_code=trust_remote_code)
    assert {p.device.type for p in loaded.parameters()} == {"cuda"}
    assert all(p.is_contiguous() for p in loaded.parameters())  # as an in-library model's, on any device
    ids = random_ids(2, 8)
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids.to(CUDA)).logits.cpu(), model(ids).logits, rtol=1e-4, atol=1e-4)


def test_the_decoding_profile_counts_each_models_kernels_per_token_on_cuda(tmp_path, monkeypatch):
    """`python -m benchmarks.profile_generate --device cuda`: the kernel profile of a compiled static decoding step
    (CUDA graphs), Turner beside GPT-2."""
    from .test_benchmarks_smoke import PROFILE_ARGS, check_profile, run_script

    args = [*PROFILE_ARGS, "--device", "cuda", "--dtype", "bf16", "--mode", "static-compile"]
    check_profile(run_script("profile_generate.py", args, tmp_path, monkeypatch), on_cuda=True)


def test_the_gpu_column_command_runs_every_section_on_cuda(tmp_path, monkeypatch):
    """`python -m benchmarks.gpu_column --device cuda --tiny`: every section of the GPU column at toy sizes, compiled
    for real (inductor; CUDA graphs for the static cache's decoding step and continuous batching), with the GPU's name,
    driver and CUDA version in its JSON and every contender's peak memory (about two minutes, most of it compiling)."""
    from .test_benchmarks_smoke import GPU_COLUMN_FAST, check_gpu_column, run_script

    payload = run_script("gpu_column.py", ["--device", "cuda", "--tiny", *GPU_COLUMN_FAST], tmp_path, monkeypatch)
    check_gpu_column(payload, "cuda")


# ---- Liger's kernels (`TrainingArguments(use_liger_kernel=True)`, turner_tfm/liger.py) ------------------------


def liger_pair(normalization: str) -> tuple[TurnerForCausalLM, TurnerForCausalLM]:
    """Two copies of one model on the GPU, the second patched with every Liger kernel Turner takes."""
    pytest.importorskip("liger_kernel", reason="the liger extra: pip install liger-kernel")
    from transformers.integrations.liger import apply_liger_kernel

    models = []
    for _ in range(2):
        torch.manual_seed(0)  # the same weights, initialised as a user's model is (not causal_lm's wide ones)
        models.append(TurnerForCausalLM(text_config(normalization=normalization)).train().to(CUDA))
    plain, patched = models
    apply_liger_kernel(patched, None)
    return plain, patched


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("normalization", ["layernorm", "rmsnorm"])
def test_liger_loss_and_gradients_on_cuda_equal_the_unpatched_models(normalization, precision):
    plain, patched = liger_pair(normalization)
    ids = random_ids(4, 32).to(CUDA)
    labels = ids.clone()
    labels[0, :8] = -100
    losses = []
    for model in (plain, patched):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16"):
            outputs = model(input_ids=ids, labels=labels)
        outputs.loss.backward()
        losses.append(outputs.loss.detach())
        assert (outputs.logits is None) == (model is patched), "the fused loss built the logits"
    tolerance = 1e-4 if precision == "fp32" else 2e-2  # relative: bf16 keeps 8 bits of mantissa
    torch.testing.assert_close(losses[1], losses[0], rtol=tolerance, atol=0)
    for (name, expected), got in zip(plain.named_parameters(), patched.parameters(), strict=True):
        error = (got.grad - expected.grad).norm() / expected.grad.norm().clamp_min(1e-12)
        assert error <= tolerance, f"{name}: gradient off by {error:.2e} (relative)"


@pytest.mark.parametrize("compiled", [False, True])
def test_the_trainer_with_liger_on_cuda_trains_as_without_it_and_generates_the_same_tokens(tmp_path, compiled):
    pytest.importorskip("liger_kernel", reason="the liger extra: pip install liger-kernel")
    from transformers import Trainer, TrainingArguments

    ids = random_ids(8, 32)
    rows = [{"input_ids": row, "labels": row} for row in ids]

    def train(liger: bool) -> tuple[TurnerForCausalLM, list[float]]:
        args = TrainingArguments(
            output_dir=str(tmp_path / str(liger)), bf16=True, use_liger_kernel=liger, torch_compile=compiled,
            per_device_train_batch_size=4, max_steps=4, logging_steps=1, learning_rate=0.1, optim="sgd",
            report_to="none", save_strategy="no", disable_tqdm=True, seed=0,
        )  # fmt: skip
        trainer = Trainer(model=causal_lm().train(), args=args, train_dataset=rows)
        trainer.train()
        return trainer.model, [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]

    (plain, plain_losses), (patched, patched_losses) = train(False), train(True)
    assert "_logits_and_loss" in vars(patched), "the Trainer did not patch the model"
    torch.testing.assert_close(patched_losses, plain_losses, rtol=2e-2, atol=2e-2)
    prompt = random_ids(2, 6).to(CUDA)
    tokens = {}
    for name, model in (("plain", plain), ("patched", patched)):
        model.load_state_dict(plain.state_dict())  # the same weights: generate() must give the same tokens
        tokens[name] = model.eval().generate(prompt, max_new_tokens=8, do_sample=False)
    assert torch.equal(tokens["patched"], tokens["plain"])
