"""Saving and loading Turner checkpoints: the remote code a saved folder carries (`auto_map` for every Auto class of
its modality, this package's modeling code copied beside the weights) and a clear error for a damaged weights file.
`modeling_turner.py` imports this module; `save_pretrained` copies it beside it.
"""

import importlib
import os

import torch
from safetensors import SafetensorError
from transformers import PreTrainedConfig
from transformers.dynamic_module_utils import custom_object_save

# The class each Auto class loads from a checkpoint, per modality (`config.is_image_model`). `turner_tfm` registers
# them all, and every saved folder names its modality's in `auto_map`, whichever class was saved.
AUTO_CLASSES = {
    "text": {
        "AutoModel": "TurnerModel",
        "AutoModelForCausalLM": "TurnerForCausalLM",
        "AutoModelForSequenceClassification": "TurnerForSequenceClassification",
        "AutoModelForMaskedLM": "TurnerForMaskedLM",
        "AutoModelForTokenClassification": "TurnerForTokenClassification",
        "AutoModelForQuestionAnswering": "TurnerForQuestionAnswering",
        "AutoModelForMultipleChoice": "TurnerForMultipleChoice",
    },
    "image": {"AutoModel": "TurnerModel", "AutoModelForImageClassification": "TurnerForImageClassification"},
}
# Heads that need full attention: under the causal mask of §4.1 a masked token could not see its right-hand side
BIDIRECTIONAL_HEADS = {"AutoModelForMaskedLM"}


def auto_classes(config: PreTrainedConfig) -> dict[str, str]:
    """The Auto classes a folder of `config` loads as (its `auto_map`): its modality's, less a head its mask cannot
    serve (a causal model is no masked LM)."""
    classes = AUTO_CLASSES["image" if config.is_image_model else "text"]
    return {auto: name for auto, name in classes.items() if not (config.is_causal and auto in BIDIRECTIONAL_HEADS)}


def state_on_cpu(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state`, a state dict of `model` on XLA (its own, `accelerator.get_state_dict(model)`, or the CPU copies the
    Trainer makes), on the CPU, with one tensor for every name under which the model holds one tensor (the tied head):
    transformers finds ties by storage, and saves each once.

    Workaround: an XLA tensor has no storage, so on torch_xla 2.9 `save_pretrained` of a model on XLA fails inside
    safetensors, which reads storage addresses (`RuntimeError: Attempted to access the data pointer on an invalid python
    storage`; GPT-2's too). transformers' own XLA save (`integrations/tpu.py`, the Trainer's) hands `save_pretrained`
    CPU copies, separate ones for the head and the embedding, so its folder holds the tied head twice (GPT-2's too).
    This stands in for the upstream fix, huggingface/transformers#29608: `save_pretrained` of a model on XLA. The
    copies are computed in one graph execution (`torch_xla.sync()`, which also runs what the caller left pending), then
    transferred."""
    importlib.import_module("torch_xla").sync()  # by name: a saved folder's remote code asks for no torch_xla
    copies, on_cpu = {}, {}
    for name, value in state.items():
        if isinstance(value, torch.Tensor):
            try:
                source = model.get_parameter_or_buffer(name)
            except AttributeError:  # a name the model does not hold
                source = value
            if id(source) not in copies:
                copies[id(source)] = value.cpu()
            value = copies[id(source)]
        on_cpu[name] = value
    return on_cpu


def defining_class(cls: type) -> type:
    """The Turner class `cls` is, or the one torch wrapped at run time (FSDP2's `fully_shard` makes `FSDP<Name>`, a
    subclass defined in torch's own module)."""
    return next(base for base in cls.__mro__ if not base.__module__.startswith("torch."))


class TurnerHubMixin:
    """What a Turner model adds to `PreTrainedModel`'s saving and loading."""

    @classmethod
    def is_remote_code(cls) -> bool:
        """transformers' rule (a class registered for an Auto class), except for a class torch made around a Turner
        model at run time: its module is torch's, and its code is not the model's (see `save_pretrained`)."""
        return super().is_remote_code() and defining_class(cls) is cls

    def save_pretrained(self, save_directory: str | os.PathLike, is_main_process: bool = True, **kwargs) -> None:
        """`PreTrainedModel.save_pretrained`, with `auto_map` naming every Auto class of the model's modality, so
        `AutoModel` (feature extraction, sentence-transformers, serving engines) and every head load the folder with
        `trust_remote_code=True`, whichever class saved it.

        The code saved is the file defining the model's own class and its sibling modules. Workaround: transformers'
        `custom_object_save(model)` copies the file of `type(model)`, which for an FSDP2-sharded model is torch's
        `FSDP<Name>` (transformers strips that prefix for `architectures`, not for the code); here the defining class
        is saved instead. It stands in for the upstream fix: `save_pretrained` saving the code of the unwrapped class.

        A model on XLA is saved from CPU copies of its weights, its tied head once (`state_on_cpu`).
        """
        state = kwargs.get("state_dict")
        tensors = [*self.parameters(), *([] if state is None else state.values())]
        if any(isinstance(tensor, torch.Tensor) and tensor.device.type == "xla" for tensor in tensors):
            kwargs["state_dict"] = state_on_cpu(self, self.state_dict() if state is None else state)
        own_class = defining_class(type(self))
        if own_class.is_remote_code():
            module = own_class.__module__.rsplit(".", 1)[-1]
            self.config.auto_map = {
                **(getattr(self.config, "auto_map", None) or {}),
                **{auto: f"{module}.{name}" for auto, name in auto_classes(self.config).items()},
            }
        super().save_pretrained(save_directory, is_main_process=is_main_process, **kwargs)
        wrapped = own_class is not type(self)
        if wrapped and own_class.is_remote_code() and self.should_save_on_this_rank(is_main_process):
            custom_object_save(own_class, save_directory)  # the code only: `auto_map` is written above

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike, *args, **kwargs):
        """`PreTrainedModel.from_pretrained`, with a damaged weights file reported as such and where it is."""
        try:
            return super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        except SafetensorError as error:
            raise ValueError(
                f"The weights of {str(pretrained_model_name_or_path)!r} cannot be read: the safetensors file is "
                f"truncated or corrupted ({error}). Save or download the checkpoint again."
            ) from error


__all__ = ["AUTO_CLASSES", "TurnerHubMixin", "auto_classes"]
