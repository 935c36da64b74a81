"""What the accelerators no one here has (MPS, XPU, NPU, HPU) need of the model, checked on the CPU: no float64 tensor
in a forward, backward or generate() (MPS has no float64), for every config switch and head, and no CUDA-only call
outside a CUDA branch."""

import ast
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from turner_tfm import TurnerForCausalLM, TurnerForImageClassification, TurnerForSequenceClassification

from .test_switches import SWITCHES
from .tiny import image_config, random_ids, text_config

PACKAGE = Path(__file__).resolve().parents[1] / "turner_tfm"


class DtypesSeen(TorchDispatchMode):
    """Every dtype of every tensor an op takes or returns, with the ops that used float64."""

    def __init__(self) -> None:
        super().__init__()
        self.float64_ops: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        tensors = [value for value in torch.utils._pytree.tree_leaves((args, kwargs, result))]
        if any(isinstance(value, torch.Tensor) and value.dtype == torch.float64 for value in tensors):
            self.float64_ops.add(str(func))
        return result


@pytest.mark.parametrize("switch", ["default", *SWITCHES])
def test_no_float64_in_a_training_step_or_generate(switch: str) -> None:
    torch.manual_seed(0)
    model = TurnerForCausalLM(text_config(**SWITCHES.get(switch, {})))
    ids = random_ids(2, 6)
    with DtypesSeen() as seen:
        model(input_ids=ids, labels=ids).loss.backward()
        model.eval().generate(ids, max_new_tokens=3, do_sample=False)
        model.generate(ids, max_new_tokens=3, do_sample=False, cache_implementation="static")
    assert not seen.float64_ops, f"{switch}: float64 in {sorted(seen.float64_ops)}"


def test_no_float64_in_the_classifier_heads() -> None:
    torch.manual_seed(0)
    text = TurnerForSequenceClassification(text_config(is_causal=False, num_labels=3, use_pooler=True))
    image = TurnerForImageClassification(image_config())
    with DtypesSeen() as seen:
        text(input_ids=random_ids(2, 6), labels=torch.tensor([0, 2])).loss.backward()
        image(pixel_values=torch.randn(2, 3, 16, 16), labels=torch.tensor([1, 2])).loss.backward()
    assert not seen.float64_ops, f"float64 in {sorted(seen.float64_ops)}"


def test_every_cuda_only_call_sits_behind_a_cuda_condition() -> None:
    """`torch.cuda.*` fails or lies on other devices: each use in the package is the right operand of an `and`
    whose left operand asks about CUDA (`tensor.is_cuda`, `device.type == "cuda"`)."""
    unguarded = []
    for path in PACKAGE.glob("*.py"):
        tree = ast.parse(path.read_text())
        guarded = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.And) and "cuda" in ast.unparse(node.values[0]):
                guarded |= {id(inner) for value in node.values[1:] for inner in ast.walk(value)}
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and ast.unparse(node).startswith("torch.cuda.")
                and id(node) not in guarded
            ):
                unguarded.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    assert not unguarded, f"CUDA-only calls outside a CUDA branch: {unguarded}"
