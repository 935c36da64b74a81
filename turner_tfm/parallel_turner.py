"""Tensor parallelism and FSDP for Turner models: the tensor-parallel style of the stacked `qkv_proj`, and the steps
`from_pretrained(distributed_config=...)` runs before sharding. The plans themselves are built from the config
(`TurnerConfig.base_model_tp_plan`, `base_model_fsdp_plan`). `modeling_turner.py` imports this module;
`save_pretrained` copies it beside it.
"""

from torch import nn
from transformers.distributed import DistributedConfig
from transformers.utils.import_utils import is_torch_distributed_available

if is_torch_distributed_available():
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
        """transformers' plan resolution, run before any weight loads: first refuse a sharding this config cannot
        take without changing its numbers (`TurnerConfig.check_parallelism`).

        Under FSDP a tied `lm_head` is tied here, before sharding: FSDP2 must see one shared parameter (transformers
        ties only after loading, by which time FSDP would hold, and train, a second, stale copy of the head).
        """
        self.config.check_parallelism(distributed_config.tp_size, distributed_config.dp_size)
        if distributed_config.dp_size > 1:
            self.tie_weights()
        if distributed_config.tp_size > 1:
            for module in self.modules():
                if hasattr(module, "qkv_proj"):
                    module.register_forward_hook(gather_attention_heads, prepend=True)
        return super()._resolve_parallel_plans(distributed_config)

    def init_parallel_plans(self) -> None:
        """The plans of the backbone and the head; a tied embedding and `lm_head` share one weight, which FSDP2
        keeps in one group: the root's, not a group of the embedding's own."""
        super().init_parallel_plans()
        if getattr(self, "lm_head", None) is not None and self.config.tie_word_embeddings:
            self._fsdp_plan.pop("model.embeddings.embed_tokens", None)
            self._fsdp_plan.pop("lm_head", None)


__all__ = ["TurnerParallelMixin", "gather_attention_heads"]
