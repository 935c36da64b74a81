"""torch names the project uses beyond torch's documented API, checked as the project uses them: when a torch release
moves or changes one, the failure says what moved and which file of ours to change, instead of a failure deep inside
a two-process tensor-parallel run or a benchmark."""

import warnings

import pytest
import torch
from torch.distributed.tensor import placement_types

from benchmarks.bench_attention_memory import peak_allocated_bytes
from benchmarks.devices import drop_cublas_workspaces

MIB = 2**20


@pytest.mark.torch_2_10(reason="tensor parallel, the placement's one user, is refused below it")
def test_strided_shard_is_where_pretrained_turner_imports_it_and_takes_its_arguments():
    """`turner_tfm/pretrained_turner.py` places the stacked `qkv_proj` as `_StridedShard(dim=0, split_factor=k)`."""
    where = f"torch {torch.__version__}: turner_tfm/pretrained_turner.py imports it for the stacked qkv_proj"
    assert hasattr(placement_types, "_StridedShard"), (
        f"torch.distributed.tensor.placement_types._StridedShard is gone ({where}): import its successor there, or "
        "a public strided placement"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a deprecation of the call pretrained_turner.py makes
        placement = placement_types._StridedShard(dim=0, split_factor=3)
    assert isinstance(placement, placement_types.Placement), f"_StridedShard is no longer a Placement ({where})"
    assert (placement.dim, placement.split_factor) == (0, 3), f"_StridedShard's dim or split_factor changed ({where})"
    assert placement != placement_types.Shard(0), f"_StridedShard(dim=0, split_factor=3) equals Shard(0) ({where})"


def test_the_profiler_trace_carries_the_running_total_of_cpu_allocations():
    """`benchmarks/bench_attention_memory.py` reads peaks from `Total Allocated` of the trace's `[memory]` events."""
    peak, _ = peak_allocated_bytes(lambda: torch.empty(MIB, dtype=torch.uint8))
    assert MIB <= peak < 2 * MIB, (
        f"torch {torch.__version__}: a 1 MiB allocation peaks at {peak} bytes in the profiler's trace: "
        "benchmarks/bench_attention_memory.py reads `Total Allocated` of its CPU `[memory]` events"
    )


def test_a_cuda_build_frees_cublas_workspaces_by_the_name_the_benchmarks_call():
    """`benchmarks/devices.py` frees cuBLAS's workspaces (`drop_cublas_workspaces`) before it counts CUDA memory; a
    CUDA build of torch has the name and runs it without a GPU; a CPU build (never counting CUDA memory) has none."""
    name = "_cuda_clearCublasWorkspaces"
    built = torch.backends.cuda.is_built()
    assert hasattr(torch._C, name) == built, (
        f"torch {torch.__version__} (CUDA build: {built}): torch._C.{name} moved; benchmarks/devices.py calls it"
    )
    if built:
        drop_cublas_workspaces()
