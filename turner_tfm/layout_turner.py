"""How the block's weights are stored: input-major under `nn.Linear`'s `(out, in)` shape.

A weight of shape `(out, in)` stored input-major (the transpose of a contiguous `(in, out)` tensor, strides
`(1, out)`) is what GPT-2's `Conv1D` multiplies by. At one row (a decoding step, which reads every weight from memory
rather than from a cache it has outgrown), a CPU BLAS runs `x @ W^T` faster from it, for every product of the block.
The modules stay `nn.Linear` and the shape stays `(out, in)`, so every tool keyed on them sees nothing new. The layout
is set where a parameter is made (`post_init`) and where it is loaded (`from_pretrained`, which puts in new
parameters); in between, torch keeps it (`.to()`, `.half()`, in-place updates, gradients and optimizer states, which
follow their parameter's strides). `state_dict()` hands out contiguous copies, so a saved file is byte for byte a
normally laid model's and safetensors takes it from any tool. `modeling_turner.py` imports this module;
`save_pretrained` copies it beside it.
"""

import os

import torch
from torch import nn

# The block's projections: the products of every decoding step. Not `lm_head`, tied to the embedding (whose rows a
# lookup reads), nor the heads' small classifiers.
BLOCK_PROJECTIONS = frozenset({"qkv_proj", "o_proj", "up_proj", "hidden_proj", "down_proj"})


def is_input_major(weight: torch.Tensor) -> bool:
    """Whether the 2-D `weight` of shape `(out, in)` is stored as the transpose of a contiguous `(in, out)` one."""
    return weight.dim() == 2 and weight.t().is_contiguous()


def in_a_distributed_job() -> bool:
    """A process group is up, or a launcher (torchrun, accelerate launch, deepspeed) started several processes: a
    script may build its model before the `Trainer`'s arguments start the group, then wrap it in FSDP or DDP."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return True
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def store_input_major(model: nn.Module) -> None:
    """Put an input-major parameter of the same values in each block projection of `model` that holds a plain one.

    Parameters of another type (quantized, DTensor shards, bitsandbytes') and those on the meta device (not made yet,
    or offloaded) are left as they are; one already input-major is not copied again. In a distributed job nothing is
    changed (`in_a_distributed_job`): the layout is for one process's decoding, and FSDP2's `fully_shard` refuses
    non-contiguous parameters (DDP's gradient buckets want contiguous ones too).
    """
    if in_a_distributed_job():
        return
    for name, module in model.named_modules():
        if name.rpartition(".")[2] not in BLOCK_PROJECTIONS or not isinstance(module, nn.Linear):
            continue
        weight = module.weight
        if type(weight) is not nn.Parameter or weight.is_meta or is_input_major(weight):
            continue
        stored = nn.Parameter(weight.detach().t().contiguous().t(), requires_grad=weight.requires_grad)
        stored.__dict__.update(weight.__dict__)  # flags transformers sets on a parameter, such as `_is_hf_initialized`
        module.weight = stored


def contiguous_state(module: nn.Module, state_dict: dict, prefix: str, local_metadata: dict) -> None:
    """A `state_dict` post-hook: the input-major weights under `prefix` as contiguous copies (what safetensors and
    every `(out, in)` reader expect). Parameters themselves (`keep_vars=True`) and tensor subclasses (quantized,
    DTensor) are handed out as they are."""
    for key, value in state_dict.items():
        if key.startswith(prefix) and type(value) is torch.Tensor and is_input_major(value):
            state_dict[key] = value.contiguous()


class TurnerLayoutMixin:
    """What a Turner model adds to `PreTrainedModel` to store its block projections input-major."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register_state_dict_post_hook(contiguous_state)

    def post_init(self) -> None:
        """`PreTrainedModel.post_init`, then the block projections stored input-major (where they are made)."""
        super().post_init()
        store_input_major(self)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike, *args, **kwargs):
        """`PreTrainedModel.from_pretrained`, then the block projections stored input-major: loading replaces the
        parameters with new ones laid out as the checkpoint's tensors."""
        loaded = super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        store_input_major(loaded[0] if isinstance(loaded, tuple) else loaded)  # `output_loading_info=True`
        return loaded


__all__ = ["BLOCK_PROJECTIONS", "TurnerLayoutMixin", "is_input_major", "store_input_major"]
