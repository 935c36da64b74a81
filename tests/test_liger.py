"""Liger's kernels for Turner (`turner_tfm.liger`): `TrainingArguments(use_liger_kernel=True)` patches Turner, as it
patches Llama, where `turner_tfm` is installed: the patch is installed-only (a saved folder does not carry it), and it
patches a model loaded as remote code as well as an installed one.

Liger's kernels are Triton kernels. On the CPU, triton's interpreter (`TRITON_INTERPRET=1`, read when triton is first
imported, so in a fresh process) runs the fused linear cross-entropy on CPU tensors, not the norm kernels: the loss is
checked number for number against the unpatched model there, the norms by which modules are patched (their numbers:
tests/test_cuda.py, `pytest -m gpu`)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

from turner_tfm import TurnerForCausalLM, TurnerForSequenceClassification
from turner_tfm.liger import apply_liger_kernel_to_turner

from .tiny import random_ids, text_config

NO_TRITON = "liger-kernel needs triton, which the floors lane's CPU build of torch does not bring"


def liger():
    """transformers' own `apply_liger_kernel` (what the Trainer calls), where liger-kernel can be imported."""
    pytest.importorskip("triton", reason=NO_TRITON)
    pytest.importorskip("liger_kernel", reason="liger-kernel is not installed (the `liger` extra)")
    from transformers.integrations.liger import apply_liger_kernel

    return apply_liger_kernel


def patched_parts(model: nn.Module) -> dict[str, object]:
    """What Liger replaced in `model`: the norms by name, and whether the head's loss is the fused one."""
    norms = {name: module._get_name() for name, module in model.named_modules() if "Liger" in module._get_name()}
    return {"norms": norms, "fused_loss": "_logits_and_loss" in vars(model)}  # the instance's own head, Liger's


NORM_NAMES = {"model.norm", *(f"model.layers.{i}.{norm}" for i in range(2) for norm in ("attn_norm", "mlp_norm"))}


@pytest.mark.parametrize(
    ("normalization", "liger_name"), [("layernorm", "LigerLayerNorm"), ("rmsnorm", "LigerRMSNorm")]
)
def test_the_trainers_liger_switch_patches_the_head_and_every_norm_the_config_selects(normalization, liger_name):
    apply_liger_kernel = liger()
    model = TurnerForCausalLM(text_config(normalization=normalization))
    apply_liger_kernel(model, None)  # TrainingArguments(use_liger_kernel=True), no liger_kernel_config
    assert patched_parts(model) == {"norms": dict.fromkeys(NORM_NAMES, liger_name), "fused_loss": True}


def test_batchnorm_has_no_liger_kernel_and_stays_as_it_is():
    apply_liger_kernel = liger()
    model = TurnerForCausalLM(text_config(normalization="batchnorm"))
    apply_liger_kernel(model, None)
    assert patched_parts(model) == {"norms": {}, "fused_loss": True}


@pytest.mark.parametrize(
    ("config", "fused", "norms"),
    [
        ({"fused_linear_cross_entropy": False}, False, True),
        ({"layer_norm": False}, True, False),
        ({"layer_norm": False, "fused_linear_cross_entropy": False}, False, False),
        ({"rope": True, "swiglu": True, "cross_entropy": False}, True, True),  # keys with nothing to act on: dropped
    ],
)
def test_liger_kernel_config_keys_turn_parts_off(config, fused, norms):
    apply_liger_kernel = liger()
    model = TurnerForCausalLM(text_config(embedding_layer_norm=True))
    apply_liger_kernel(model, config)
    expected = {"model.embeddings.norm", *NORM_NAMES} if norms else set()
    assert set(patched_parts(model)["norms"]) == expected
    assert patched_parts(model)["fused_loss"] is fused


def test_a_classifier_gets_the_norms_and_keeps_its_head():
    apply_liger_kernel = liger()
    model = TurnerForSequenceClassification(text_config(is_causal=False, num_labels=3))
    head_forward = model.forward
    apply_liger_kernel(model, None)
    assert set(patched_parts(model)["norms"]) == NORM_NAMES
    assert model.forward == head_forward


def test_a_model_not_patched_is_unchanged_and_the_patched_ones_keys_are_too(tmp_path):
    liger()
    config = text_config()
    patched, other = TurnerForCausalLM(config), TurnerForCausalLM(config)
    before = other(input_ids=random_ids(2, 8), labels=random_ids(2, 8))
    keys = list(patched.state_dict())
    apply_liger_kernel_to_turner(model=patched)
    assert patched_parts(other) == {"norms": {}, "fused_loss": False}
    after = other(input_ids=random_ids(2, 8), labels=random_ids(2, 8))
    torch.testing.assert_close(after.logits, before.logits, rtol=0, atol=0)
    assert list(patched.state_dict()) == keys
    patched.save_pretrained(tmp_path)
    reloaded = TurnerForCausalLM.from_pretrained(tmp_path)
    assert list(reloaded.state_dict()) == keys and patched_parts(reloaded) == {"norms": {}, "fused_loss": False}
    for name, tensor in patched.state_dict().items():
        torch.testing.assert_close(reloaded.state_dict()[name], tensor, rtol=0, atol=0, msg=name)


def test_asking_for_the_loss_alone_without_labels_is_refused_by_name():
    liger()
    model = TurnerForCausalLM(text_config())
    apply_liger_kernel_to_turner(model=model, layer_norm=False)
    with pytest.raises(ValueError, match="`skip_logits`=True needs `labels`"):
        model(input_ids=random_ids(2, 8), skip_logits=True)


def test_patching_without_a_model_is_refused_by_name():
    liger()
    with pytest.raises(ValueError, match="`model`=None"):
        apply_liger_kernel_to_turner()


# ---- the loss itself, under triton's interpreter; installed and as remote code -------------------------------------

# In a fresh interpreter with TRITON_INTERPRET=1, turner_tfm imported: loads the folder (argv[1]) installed or as remote
# code (argv[2]),
# patches one copy with the fused loss only (Liger's norm kernels do not run in the interpreter), and writes what
# differs from the unpatched copy: loss and gradients (labels of -100 included, mean and the Trainer's sum over
# `num_items_in_batch`), evaluation, and (installed) two Trainer steps with use_liger_kernel=True.
INTERPRETED = textwrap.dedent(
    """
    import json, sys
    import turner_tfm  # noqa: F401  (registers Turner with Liger)
    import torch, transformers
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments
    from transformers.dynamic_module_utils import get_class_from_dynamic_module
    from transformers.integrations.liger import apply_liger_kernel
    torch.set_num_threads(1)
    folder, report = sys.argv[1], {}
    LOSS_ONLY = {"layer_norm": False, "rms_norm": False}

    def load():
        if sys.argv[2] == "remote":  # the folder's own code (the Auto class would pick the installed one)
            model_class = get_class_from_dynamic_module("modeling_turner.TurnerForCausalLM", folder)
            return model_class.from_pretrained(folder).train()
        return AutoModelForCausalLM.from_pretrained(folder).train()

    def grad_diff(a, b):
        return max((x.grad - y.grad).abs().max().item() for x, y in zip(a.parameters(), b.parameters()))

    ids = torch.randint(3, 99, (2, 12), generator=torch.Generator().manual_seed(0))
    labels = ids.clone()
    labels[0, :4] = -100
    labels[1, -3:] = -100
    report["module"] = type(load()).__module__
    for name, extra in (("mean", {}), ("sum", {"num_items_in_batch": torch.tensor(14)})):
        reference, patched = load(), load()
        apply_liger_kernel(patched, LOSS_ONLY)
        expected, got = reference(input_ids=ids, labels=labels, **extra), patched(input_ids=ids, labels=labels, **extra)
        expected.loss.backward()
        got.loss.backward()
        report[name] = {"loss": (got.loss - expected.loss).abs().item(), "grad": grad_diff(patched, reference),
                        "logits": got.logits is None, "value": expected.loss.item()}
    with torch.no_grad():
        expected, got = reference.eval()(input_ids=ids, labels=labels), patched.eval()(input_ids=ids, labels=labels)
    report["eval"] = {"loss": (got.loss - expected.loss).abs().item(),
                      "logits": (got.logits - expected.logits).abs().max().item()}

    def train(liger):
        torch.manual_seed(0)
        rows = [{"input_ids": row, "labels": label} for row, label in zip(ids.repeat(2, 1), labels.repeat(2, 1))]
        args = TrainingArguments(
            output_dir=sys.argv[3], use_cpu=True, report_to="none", save_strategy="no", disable_tqdm=True,
            per_device_train_batch_size=2, max_steps=2, logging_steps=1, learning_rate=0.1, optim="sgd",
            prediction_loss_only=True,
            use_liger_kernel=liger, liger_kernel_config=LOSS_ONLY if liger else None,
        )
        trainer = Trainer(model=load(), args=args, train_dataset=rows, eval_dataset=rows)
        trainer.train()
        losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
        return trainer.model, losses, trainer.evaluate()["eval_loss"]

    if sys.argv[2] == "remote":  # the Trainer's path is the same as remote code: run once, installed
        print(json.dumps(report))
        raise SystemExit
    (plain, plain_losses, plain_eval), (fused, fused_losses, fused_eval) = train(False), train(True)
    report["trainer"] = {
        "fused": "_logits_and_loss" in vars(fused),
        "losses": max(abs(a - b) for a, b in zip(plain_losses, fused_losses)), "steps": len(fused_losses),
        "weights": max((a - b).abs().max().item() for a, b in zip(plain.parameters(), fused.parameters())),
        "eval": abs(plain_eval - fused_eval),
    }
    print(json.dumps(report))
    """
)


@pytest.fixture(scope="module")
def saved_causal_lm(tmp_path_factory):
    folder = tmp_path_factory.mktemp("liger") / "causal-lm"
    TurnerForCausalLM(text_config()).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("loaded", ["installed", "remote"])
def test_the_fused_loss_and_its_gradients_equal_the_unpatched_models_under_tritons_interpreter(
    saved_causal_lm, loaded, tmp_path
):
    liger()
    environment = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf_home"), "PATH": "/usr/bin:/bin"}
    environment |= {"TRITON_INTERPRET": "1", "TRITON_CACHE_DIR": str(tmp_path / "triton"), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-c", INTERPRETED, str(saved_causal_lm), loaded, str(tmp_path / "out")]
    environment["PYTHONPATH"] = os.pathsep.join(sys.path)
    result = subprocess.run(command, cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["module"].startswith("transformers_modules" if loaded == "remote" else "turner_tfm"), report
    for reduction in ("mean", "sum"):
        assert report[reduction]["logits"], "the fused loss built logits"
        assert report[reduction]["loss"] <= 1e-5 and report[reduction]["grad"] <= 1e-5, report
    assert report["eval"]["loss"] <= 1e-5 and report["eval"]["logits"] == 0, report
    if loaded == "remote":
        return
    trainer = report["trainer"]
    assert trainer["fused"] and trainer["steps"] == 2, report
    print(report)  # the differences measured
    assert trainer["losses"] <= 1e-5 and trainer["weights"] <= 1e-5 and trainer["eval"] <= 1e-5, report


# ---- without liger-kernel: transformers' own error; importing Turner never imports Liger ---------------------------

WITHOUT_LIGER = textwrap.dedent(
    """
    import sys
    sys.modules["liger_kernel"] = None  # not installed, as far as this process can tell
    import torch, turner_tfm
    from transformers import Trainer, TrainingArguments
    from tests.tiny import text_config
    args = TrainingArguments(output_dir=sys.argv[1], use_cpu=True, report_to="none", use_liger_kernel=True, max_steps=1)
    trainer = Trainer(model=turner_tfm.TurnerForCausalLM(text_config()), args=args, train_dataset=[])
    try:
        trainer.train()
    except ImportError as error:
        print("ImportError:", error)
    """
)


def test_without_liger_kernel_the_trainer_raises_transformers_own_import_error(tmp_path):
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    command = [sys.executable, "-c", WITHOUT_LIGER, str(tmp_path)]
    result = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ImportError: You have set `use_liger_kernel` to `True` but liger-kernel" in result.stdout, result.stdout


IMPORT_COST = textwrap.dedent(
    """
    import sys, turner_tfm
    assert not [name for name in sys.modules if name.startswith("liger_kernel")], "importing Turner imported Liger"
    from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN
    from turner_tfm.liger import apply_liger_kernel_to_turner
    assert MODEL_TYPE_TO_APPLY_LIGER_FN["turner"] is apply_liger_kernel_to_turner
    print("registered")
    """
)


def test_importing_turner_does_not_import_liger_which_finds_turner_when_it_loads():
    liger()
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    result = subprocess.run([sys.executable, "-c", IMPORT_COST], env=environment, capture_output=True, text=True)
    assert result.returncode == 0 and "registered" in result.stdout, result.stderr[-3000:]
