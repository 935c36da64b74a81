"""What a Turner model adds to `PreTrainedModel`: saving and loading (the code and `auto_map` a saved folder carries,
a clear error for a damaged weights file) and sharding (the tensor-parallel and FSDP plans, built from the config, the
tensor-parallel style of the stacked `qkv_proj`, and the steps `from_pretrained(distributed_config=...)` runs before
sharding). `configuration_turner.py` and `modeling_turner.py` import this module (it imports neither).
"""

import importlib
import os

import torch
from safetensors import SafetensorError
from torch import nn
from transformers import PreTrainedConfig
from transformers.distributed import DistributedConfig
from transformers.dynamic_module_utils import custom_object_save
from transformers.utils.import_utils import is_torch_distributed_available

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


# The oldest torch tensor parallelism is right on. Before it, torch's `_StridedShard` is a subclass of `Shard` (2.9:
# `is_shard()` is True), and transformers' checkpoint slicer (`distributed/sharding_utils.py`, which asks
# `placement.is_shard()`) then reads each rank's part of the stacked `qkv_proj` weight as one contiguous block instead
# of its heads of q, k and v: logits off by up to 0.3 on torch 2.9, with no error. From 2.10 the placements are C++
# classes and `StridedShard` derives from `Placement` alone, whose `is_shard()` is False (torch 2.10.0, 2.11.0,
# 2.12.1: `torch/include/torch/csrc/distributed/Placement.h`); tests/test_parallel.py ran on 2.10.0 once by hand, and
# runs in CI on 2.13 and the newest.
TENSOR_PARALLEL_TORCH = "2.10"


def check_tensor_parallel_torch(tp_size: int) -> None:
    """Refuse tensor parallelism (`tp_size` > 1) on a torch older than `TENSOR_PARALLEL_TORCH`, naming it."""
    if tp_size > 1 and torch.__version__ < TENSOR_PARALLEL_TORCH:
        raise RuntimeError(
            f"Tensor parallelism (tp_size={tp_size}) needs torch >= {TENSOR_PARALLEL_TORCH}; this is torch "
            f"{torch.__version__}, on which transformers loads the stacked qkv_proj weight into the wrong heads "
            f"(torch's _StridedShard is a Shard there). Upgrade torch, or use FSDP or one process."
        )


def tensor_parallel_plan(config: PreTrainedConfig) -> dict[str, str]:
    """Tensor parallel plan of a Turner backbone, built from its config so every rule names a module it has.

    Megatron-style: the vocabulary is split across ranks (so a tied `lm_head` shards against a sharded embedding),
    each rank holds whole heads of each projection stacked in `qkv_proj` (q, k and v; q and v with
    `share_query_key`, where U_k = U_q) and the matching columns of `o_proj`, and a slice of the MLP's hidden
    features. With two hidden layers the second is row-split and the last column-split and gathered. Everything else
    (norms, positions, token types, patches, pooler) is replicated.
    """
    projections = 2 if config.share_query_key else 3
    attention = {"qkv_proj": f"stacked_heads_colwise_{projections}", "o_proj": "rowwise"}
    mlp = {"up_proj": "colwise", "down_proj": "rowwise"}
    if config.mlp_hidden_layers == 2:
        mlp = {"up_proj": "colwise", "hidden_proj": "rowwise", "down_proj": "colwise_gather_output"}
    plan = {} if config.is_image_model else {"embeddings.embed_tokens": "embedding_rowwise"}
    plan |= {f"layers.*.self_attn.{name}": style for name, style in attention.items()}
    return plan | {f"layers.*.mlp.{name}": style for name, style in mlp.items()}


def fsdp_plan(config: PreTrainedConfig) -> dict[str, str]:
    """FSDP2 plan of a Turner backbone: the token (or patch) embedding and every block free their gathered weights
    after use; the final norm keeps them (it runs last in the forward pass and first in the backward pass). A tied
    `lm_head` is wrapped with the token embedding, whose weight it is."""
    embedding = "embeddings" if config.is_image_model else "embeddings.embed_tokens"
    plan = {embedding: "free_full_weight", "layers.*": "free_full_weight"}
    return plan | ({"norm": "keep_full_weight"} if config.norm_position == "pre" else {})


if is_torch_distributed_available():
    # `_StridedShard`: torch's private strided placement (no public one as of 2.15; transformers' packed styles use it
    # too), the one private torch name the package uses, checked by tests/test_torch_private_apis.py
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor
    from torch.distributed.tensor.placement_types import _StridedShard
    from transformers.distributed.tensor_parallel import ALL_PARALLEL_STYLES, PackedColwiseParallel

    class StackedHeadsColwiseParallel(PackedColwiseParallel):
        """Tensor-parallel style of `qkv_proj`: rank r holds the same whole heads (chunk r) of each of the
        `split_factor` stacked projections, weights and bias alike, and computes its heads' q, k and v.

        transformers' `packed_colwise` shards a 1-D bias contiguously, which is wrong for a stacked bias; this style
        places both as `_StridedShard` (torch's private placement for a strided split: there is no public one)."""

        def shard_param(self, module: nn.Module, param: str, mesh) -> None:
            meta = module._parameters.get(param)
            if meta is not None:
                placement = _StridedShard(dim=0, split_factor=self.split_factor)
                sharded = distribute_tensor(meta, mesh, [placement], src_data_rank=None)
                module._parameters[param] = nn.Parameter(sharded, requires_grad=meta.requires_grad)

    for projections in (2, 3):
        ALL_PARALLEL_STYLES.register(
            f"stacked_heads_colwise_{projections}", StackedHeadsColwiseParallel(split_factor=projections)
        )


def gather_attention_heads(module: nn.Module, args: tuple, output: tuple) -> tuple:
    """Under tensor parallelism each rank computes A for its own heads: the attention weights it returns (eager
    attention, `output_attentions=True`) are every head's, gathered from all ranks, as in one process."""
    attn_output, attn_weights = output
    if attn_weights is None:
        return output
    mesh = module.qkv_proj.weight.device_mesh
    return attn_output, DTensor.from_local(attn_weights, mesh, [Shard(1)], run_check=False).full_tensor()


class TurnerParallelMixin:
    """What a Turner model adds to transformers' plan-driven sharding (`from_pretrained(distributed_config=...)`)."""

    def _resolve_parallel_plans(self, distributed_config: DistributedConfig) -> tuple[dict, dict, dict]:
        """transformers' plan resolution, run before any weight loads: first refuse a sharding this torch or this
        config cannot take without changing its numbers (`check_tensor_parallel_torch`,
        `TurnerConfig.check_parallelism`).

        Under FSDP a tied `lm_head` is tied here, before sharding: FSDP2 must see one shared parameter (transformers
        ties only after loading, by which time FSDP would hold, and train, a second, stale copy of the head).
        """
        check_tensor_parallel_torch(distributed_config.tp_size)
        self.config.check_parallelism(distributed_config.tp_size, distributed_config.dp_size)
        if distributed_config.dp_size > 1:
            self.tie_weights()
        if distributed_config.tp_size > 1:
            for module in self.modules():
                if hasattr(module, "qkv_proj"):
                    module.inner_size //= distributed_config.tp_size  # each rank computes its own heads
                    module.register_forward_hook(gather_attention_heads, prepend=True)
        return super()._resolve_parallel_plans(distributed_config)

    def init_parallel_plans(self) -> None:
        """The plans of the backbone and the head; a tied embedding and `lm_head` share one weight, which FSDP2
        keeps in one group: the root's, not a group of the embedding's own."""
        super().init_parallel_plans()
        if getattr(self, "lm_head", None) is not None and self.config.tie_word_embeddings:
            self._fsdp_plan.pop("model.embeddings.embed_tokens", None)
            self._fsdp_plan.pop("lm_head", None)


__all__ = [
    "AUTO_CLASSES",
    "TurnerHubMixin",
    "TurnerParallelMixin",
    "auto_classes",
    "check_tensor_parallel_torch",
    "fsdp_plan",
    "tensor_parallel_plan",
]
