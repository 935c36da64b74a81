"""How the block's weights are stored: input-major under `nn.Linear`'s `(out, in)` shape.

A weight of shape `(out, in)` stored input-major (the transpose of a contiguous `(in, out)` tensor, strides
`(1, out)`) is what GPT-2's `Conv1D` multiplies by. At one row (a decoding step, which reads every weight from memory
rather than from a cache it has outgrown), a CPU BLAS runs `x @ W^T` faster from it, for every product of the block.
The modules stay `nn.Linear` and the shape stays `(out, in)`, so every tool keyed on them sees nothing new.

The layout follows the model's mode, as dropout does: `eval()` (and `from_pretrained`, which ends with it) stores the
block projections input-major for inference; `train()` gives them back `nn.Linear`'s contiguous layout, which training
tools take for granted (`parameters_to_vector`, `torch.optim.LBFGS` and every `weight.view(-1)` or `grad.view(-1)`,
`torch.nn.utils.prune`, FSDP2). Each switch re-lays the weights in place, one at a time: the parameters stay the
same objects, so an optimizer, tied weights and hooks keep holding the model's own. In between, torch keeps a layout
(`.to()`, `.half()`, in-place updates). `state_dict()` hands out contiguous copies, so a saved file is byte for byte a
normally laid model's and safetensors takes it from any tool. `modeling_turner.py` imports this module;
`save_pretrained` copies it beside it.
"""

import os
from collections.abc import Callable, Iterator

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


def _block_weights(model: nn.Module) -> Iterator[nn.Parameter]:
    """The plain, made 2-D weights of `model`'s block projections. Parameters of another type (quantized, DTensor
    shards, bitsandbytes') and those on the meta device (not made yet, or offloaded) are left alone."""
    for name, module in model.named_modules():
        if name.rpartition(".")[2] not in BLOCK_PROJECTIONS or not isinstance(module, nn.Linear):
            continue
        weight = module.weight
        if type(weight) is nn.Parameter and not weight.is_meta and weight.dim() == 2:
            yield weight


def _relay(weight: nn.Parameter, layout: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Give `weight` its own values laid out by `layout`, in place: the parameter stays the same object, so an
    optimizer, a hook or a tied reference holding it still holds the model's weight."""
    # A parameter made in inference mode is an inference tensor; one made outside must still train after a switch in it.
    with torch.no_grad(), torch.inference_mode(weight.is_inference()):
        weight.data = layout(weight.detach())


def _transposed_copy(weight: torch.Tensor) -> torch.Tensor:
    return weight.t().contiguous().t()


def store_input_major(model: nn.Module) -> None:
    """Store each block projection's weight of `model` input-major (same values, same parameter), for decoding.

    In a distributed job nothing is changed (`in_a_distributed_job`): the layout is for one process's decoding, and
    FSDP2's `fully_shard` refuses non-contiguous parameters (DDP's gradient buckets want contiguous ones too).
    """
    if in_a_distributed_job():
        return
    for weight in _block_weights(model):
        if not is_input_major(weight):
            _relay(weight, _transposed_copy)


def store_contiguous(model: nn.Module) -> None:
    """Store each block projection's weight of `model` as `nn.Linear` makes it, contiguous `(out, in)` (same values,
    same parameter): what every training tool expects (`weight.view(-1)`, `parameters_to_vector`, L-BFGS, pruning)."""
    for weight in _block_weights(model):
        if not weight.is_contiguous():
            _relay(weight, torch.Tensor.contiguous)


def contiguous_state(module: nn.Module, state_dict: dict, prefix: str, local_metadata: dict) -> None:
    """A `state_dict` post-hook: the input-major weights under `prefix` as contiguous copies (what safetensors and
    every `(out, in)` reader expect). Parameters themselves (`keep_vars=True`) and tensor subclasses (quantized,
    DTensor) are handed out as they are."""
    for key, value in state_dict.items():
        if key.startswith(prefix) and type(value) is torch.Tensor and is_input_major(value):
            state_dict[key] = value.contiguous()


class TurnerLayoutMixin:
    """What a Turner model adds to `PreTrainedModel` to store its block projections input-major while it infers."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register_state_dict_post_hook(contiguous_state)

    def train(self, mode: bool = True) -> nn.Module:
        """`PreTrainedModel.train`, then the block projections laid out for the mode: input-major in evaluation mode
        (`eval()`, and `from_pretrained`, which ends with it), `nn.Linear`'s contiguous layout in training mode."""
        switched = super().train(mode)
        (store_contiguous if mode else store_input_major)(self)
        return switched


__all__ = ["BLOCK_PROJECTIONS", "TurnerLayoutMixin", "is_input_major", "store_contiguous", "store_input_major"]
