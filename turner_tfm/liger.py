"""Liger's kernels for Turner: what `TrainingArguments(use_liger_kernel=True)` (and TRL's `use_liger_kernel`) apply.

transformers hands the model to Liger, which looks up the model type in its table `MODEL_TYPE_TO_APPLY_LIGER_FN` and
calls the function found there with the keys of `liger_kernel_config` that the function takes. Turner's entry is
`apply_liger_kernel_to_turner`, registered when `turner_tfm` is imported (installed only: a saved folder does not
carry this file), but only once Liger's table is loaded: importing liger-kernel costs seconds, so a user who does not
ask for it does not pay for it (see `_RegisterWhenLigerLoads`).
"""

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import MethodType, ModuleType

import torch
from torch import nn

# Liger's module holding `MODEL_TYPE_TO_APPLY_LIGER_FN`, imported by transformers' `apply_liger_kernel`
LIGER_TABLE_MODULE = "liger_kernel.transformers.monkey_patch"


def apply_liger_kernel_to_turner(
    fused_linear_cross_entropy: bool = True,
    layer_norm: bool = True,
    rms_norm: bool = True,
    model: nn.Module | None = None,
) -> None:
    """Patch one Turner model with Liger's kernels, as Liger's `apply_liger_kernel_to_llama(model=...)` does.

    Args:
        fused_linear_cross_entropy: a causal LM's training loss through Liger's fused linear cross-entropy, which
            never builds the (tokens x vocabulary) logits: taken when labels are given in training (or the Trainer
            asks for the loss alone, `skip_logits=True`); logits and loss as before otherwise and in evaluation.
        layer_norm: every `nn.LayerNorm` of the model (`normalization="layernorm"`, and the embedding norm) runs
            Liger's LayerNorm kernel.
        rms_norm: every `nn.RMSNorm` (`normalization="rmsnorm"`) runs Liger's RMSNorm kernel, computed in float32
            as torch's is. BatchNorm has no Liger kernel and stays as it is.
        model: the model to patch, in place; its parameters, their names and its saved checkpoints do not change.

    Liger's other keys have nothing to act on in Turner and are dropped by Liger before the call: `swiglu`, `geglu`
    (Turner's MLP is not gated), `cross_entropy` (Liger's version swaps torch's cross-entropy for every model in the
    process) and `rope` (Turner's rotation is Liger's, feature i with feature i + K/2, but Turner's attention applies
    it to the queries and the keys one at a time, and Liger swaps the function for every model of a type).
    """
    if model is None:
        raise ValueError(
            "apply_liger_kernel_to_turner: `model`=None is not supported; Turner is patched one model at a time: "
            "pass the model (TrainingArguments(use_liger_kernel=True) does)."
        )
    table = liger_module("transformers.monkey_patch")
    for module in model.modules():
        if layer_norm and type(module) is nn.LayerNorm:
            table._patch_layer_norm_module(module)
        elif rms_norm and type(module) is nn.RMSNorm:
            table._patch_rms_norm_module(module, casting_mode="gemma", in_place=False)
    if fused_linear_cross_entropy and hasattr(model, "_logits_and_loss"):  # the causal LM's head
        model._logits_and_loss = MethodType(fused_logits_and_loss, model)


def fused_logits_and_loss(
    self: nn.Module,
    hidden_states: torch.Tensor,
    labels: torch.LongTensor | None,
    logits_to_keep: int | torch.Tensor = 0,
    skip_logits: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """`TurnerForCausalLM._logits_and_loss` with the loss through Liger's fused linear cross-entropy, without logits,
    where only the loss is needed: in training with labels, or when the caller says so (`skip_logits=True`)."""
    has_labels = labels is not None or kwargs.get("shift_labels") is not None
    if skip_logits and not has_labels:
        raise ValueError("`skip_logits`=True needs `labels` (or `shift_labels`): without them there is no loss.")
    if skip_logits is None:
        skip_logits = self.training and has_labels
    if not skip_logits:
        return type(self)._logits_and_loss(self, hidden_states, labels, logits_to_keep, **kwargs)
    kept = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
    shift_labels = kwargs.pop("shift_labels", None)
    result = liger_module("transformers.model.llama").lce_maybe_trainable_lm_head(
        self, hidden_states[:, kept, :], self.config.hidden_size, labels, shift_labels, **kwargs
    )
    return None, liger_module("transformers.model.loss_utils").unpack_cross_entropy_result(result)[0]


def liger_module(name: str) -> ModuleType:
    """`liger_kernel.<name>`, imported by name where it is used: transformers' remote-code loader asks the user for
    every package a saved file imports in an `import` statement, and a Turner folder must load without Liger."""
    return importlib.import_module(f"liger_kernel.{name}")


def register_with_liger(table_module: ModuleType) -> None:
    """Turner's entry in Liger's table of model types."""
    table_module.MODEL_TYPE_TO_APPLY_LIGER_FN["turner"] = apply_liger_kernel_to_turner


class _RegisterWhenLigerLoads(importlib.abc.MetaPathFinder):
    """Registers Turner in Liger's table when Liger loads it, so importing Turner never imports Liger.

    Workaround: Liger keeps its table in a module that imports every model it knows, and has no entry point through
    which a model registers itself; this import hook stands in for such a registration hook upstream.
    """

    def find_spec(self, name: str, path=None, target=None) -> importlib.machinery.ModuleSpec | None:
        if name != LIGER_TABLE_MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        load = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            load(module)
            register_with_liger(module)

        spec.loader.exec_module = exec_module
        return spec


def register_when_liger_loads() -> None:
    """Register Turner with Liger now if its table is loaded, or when it is (once per process); nothing without
    liger-kernel installed."""
    if LIGER_TABLE_MODULE in sys.modules:
        register_with_liger(sys.modules[LIGER_TABLE_MODULE])
        return
    hooked = any(type(finder).__name__ == _RegisterWhenLigerLoads.__name__ for finder in sys.meta_path)
    if not hooked and importlib.util.find_spec("liger_kernel") is not None:
        sys.meta_path.insert(0, _RegisterWhenLigerLoads())


__all__ = ["apply_liger_kernel_to_turner", "register_when_liger_loads"]
