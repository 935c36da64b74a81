"""Where a benchmark runs: `--device cpu` or `--device cuda[:N]`, what that device is, and its timing and memory.

On CUDA a call returns before the GPU finishes, so every timed call ends with a device synchronisation (`synced`).
Memory is what torch's caching allocator counts (`torch.cuda.memory_allocated` / `max_memory_allocated`): a
contender's peak is the bytes it keeps between calls (weights, optimizer state, caches: `Held` around its set-up and
first call) plus the most one later call allocates on top (`peak_above`). Bytes a CUDA graph's private pool keeps
between replays are reserved, not allocated, and are not counted. The CPU keeps no such statistics: no memory figure.

MFU (model FLOPs utilisation) is measured FLOPs per second over the card's peak: a figure from its maker's datasheet,
looked up by the name CUDA reports (`PEAK_BF16_DENSE`), or given with `--peak-tflops`. A card not in the table gets
no MFU rather than a guessed one.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.peers import LMShape

# bf16 dense tensor-core peaks (TFLOP/s) from NVIDIA's datasheets: half the figure a datasheet gives with sparsity.
H100_DATASHEET = "NVIDIA H100 Tensor Core GPU datasheet (BF16 tensor core: SXM 1,979, PCIe 1,513 TFLOPS with sparsity)"
PEAK_BF16_DENSE: list[tuple[str, float, str]] = [
    (r"\bH100 80GB HBM3", 989.0, f"H100 SXM: {H100_DATASHEET}, halved for dense"),
    (r"\bH100 PCIe", 756.0, f"H100 PCIe: {H100_DATASHEET}, halved for dense"),
    (r"\bH200\b(?!.*NVL)", 989.0, "H200 SXM: NVIDIA H200 datasheet (BF16 1,979 TFLOPS with sparsity), halved"),
    (r"\bA100\b", 312.0, "A100: NVIDIA A100 datasheet (BF16 tensor core 312 TFLOPS dense, SXM and PCIe)"),
]


def parse_device(value: str) -> torch.device:
    """`--device`'s value as a torch device: `cpu`, or `cuda` / `cuda:N` where CUDA is available."""
    try:
        device = torch.device(value)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"{value!r}: expected `cpu`, `cuda` or `cuda:N`")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"{value!r}: torch.cuda.is_available() is False on this machine")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise argparse.ArgumentTypeError(f"{value!r}: this machine has {torch.cuda.device_count()} CUDA devices")
    return device


def add_device_arguments(parser: argparse.ArgumentParser, default: str = "cpu") -> None:
    """`--device` and `--peak-tflops` (the peak MFU is taken against)."""
    parser.add_argument("--device", type=parse_device, default=default, help="cpu, cuda or cuda:N (%(default)s)")
    parser.add_argument(
        "--peak-tflops",
        type=float,
        default=None,
        help="the device's bf16 dense peak for MFU (default: looked up by the GPU's name; none for the CPU)",
    )


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def synced(fn: Callable[[], Any], device: torch.device) -> Callable[[], Any]:
    """`fn` followed by a device synchronisation, so that a wall-clock timing covers the device's work."""
    if device.type == "cpu":
        return fn

    def call() -> Any:
        out = fn()
        synchronize(device)
        return out

    return call


def allocated(device: torch.device) -> int | None:
    """Bytes the caching allocator holds for tensors now, cuBLAS's workspaces left out (None on the CPU)."""
    if device.type != "cuda":
        return None
    drop_cublas_workspaces()
    return torch.cuda.memory_allocated(device)


def drop_cublas_workspaces() -> None:
    """Free cuBLAS's workspaces (32 MiB each on Hopper), which the caching allocator counts: the first matrix product
    after a clear allocates one, and a CUDA graph's capture clears them (torch's `cudagraph_trees`), so without this a
    contender's first call could be charged a workspace, or credited the one it freed (a negative peak, seen on an
    H200). torch's own CUDA leak check clears them the same way before it counts; no public API does it (torch 2.15)."""
    torch._C._cuda_clearCublasWorkspaces()


class Held:
    """`with Held(device) as held:` ... then `held.bytes`: the bytes allocated inside the block and still held after it
    (None on the CPU)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.bytes: int | None = None

    def __enter__(self) -> Held:
        synchronize(self.device)
        self._start = allocated(self.device)
        return self

    def __exit__(self, *exc: object) -> None:
        synchronize(self.device)
        if self._start is not None:
            self.bytes = allocated(self.device) - self._start


def held_by(call: Callable[[], Any], device: torch.device) -> tuple[Any, int | None]:
    """`call()`'s result (a model, say) and the bytes allocated for it that are still held (None on the CPU)."""
    with Held(device) as held:
        result = call()
    return result, held.bytes


def first_calls(
    fns: dict[str, Callable[[], Any]],
    held: dict[str, int | None],
    device: torch.device,
    check: Callable[[str, Any], None] = lambda key, result: None,
) -> dict[str, float]:
    """Seconds of each function's first call (compilation, CUDA-graph capture included). What a call leaves allocated
    (an optimizer's state, a cache) is added to its contender's entry in `held`; `check(key, result)` sees each
    result before it is dropped."""
    seconds = {}
    for key, fn in fns.items():
        with Held(device) as kept:
            start = time.perf_counter()
            result = fn()
            seconds[key] = time.perf_counter() - start
            check(key, result)
            del result
        if key in held:
            held[key] = None if kept.bytes is None else held[key] + kept.bytes
    return seconds


def peak_above(call: Callable[[], Any], device: torch.device) -> int | None:
    """The most `call` allocates at once on top of what is allocated when it starts (None on the CPU, where it is
    only called)."""
    if device.type != "cuda":
        call()
        return None
    synchronize(device)
    start = allocated(device)  # the call's own workspace is then part of what it allocates on top
    torch.cuda.reset_peak_memory_stats(device)
    call()
    synchronize(device)
    return torch.cuda.max_memory_allocated(device) - start


def peak_memory(
    fns: dict[str, Callable[[], Any]], held: dict[str, int | None], device: torch.device
) -> dict[str, int] | None:
    """Each contender's peak on a CUDA device: the bytes it holds between calls (`held`) plus the most one call of it
    allocates on top. Calls every function once, in order (an untimed warm-up round); a contender that shares another's
    model (no entry in `held`) gets no figure. None on the CPU, where nothing is called."""
    if device.type != "cuda":
        return None
    above = {key: peak_above(fn, device) for key, fn in fns.items()}
    return {key: held[key] + above[key] for key in fns if held.get(key) is not None}


def peak_bf16_dense(name: str) -> tuple[float, str] | None:
    """The bf16 dense peak (FLOP/s) of the GPU CUDA names `name`, and its source; None for a card not in the table."""
    for pattern, tflops, source in PEAK_BF16_DENSE:
        if re.search(pattern, name):
            return tflops * 1e12, source
    return None


def driver_version() -> str | None:
    """The NVIDIA driver's version, from `nvidia-smi` or else the kernel module's `/proc/driver/nvidia/version` (one
    driver serves every GPU of a host); None where neither says."""
    if shutil.which("nvidia-smi"):
        query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
        done = subprocess.run(query, capture_output=True, text=True, timeout=30, check=False)
        if done.returncode == 0 and done.stdout.strip():
            return done.stdout.splitlines()[0].strip()
    try:
        with open("/proc/driver/nvidia/version") as f:
            found = re.search(r"Kernel Module.*?\s(\d+\.\d+(?:\.\d+)?)\s", f.readline())
    except OSError:
        return None
    return found.group(1) if found else None


def describe(device: torch.device, peak_tflops: float | None = None) -> dict[str, Any]:
    """What a figure measured on `device` depends on: for CUDA the GPU's name, memory and compute capability, the
    driver, the CUDA and cuDNN versions torch was built with, and the bf16 peak MFU is taken against."""
    info: dict[str, Any] = {"type": device.type}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info |= {
            "name": props.name,
            "index": device.index if device.index is not None else torch.cuda.current_device(),
            "memory_gib": props.total_memory / 2**30,
            "compute_capability": f"{props.major}.{props.minor}",
            "multiprocessors": props.multi_processor_count,
            "driver": driver_version(),
            "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(),
        }
    if peak_tflops is not None:
        peak = (peak_tflops * 1e12, "given with --peak-tflops")
    else:
        peak = peak_bf16_dense(info["name"]) if device.type == "cuda" else None
    info["peak_bf16_flops"], info["peak_source"] = peak if peak else (None, None)
    return info


def matmul_bf16_flops(device: torch.device, size: int = 8192, repeats: int = 10) -> float | None:
    """A bf16 `size`^3 matrix product's FLOP/s on a CUDA device: what the card reaches in practice (None on the CPU)."""
    if device.type != "cuda":
        return None
    a, b, c = (torch.randn(size, size, device=device, dtype=torch.bfloat16) for _ in range(3))
    torch.matmul(a, b, out=c)  # the first product picks the kernel
    synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        torch.matmul(a, b, out=c)
    synchronize(device)
    return 2 * size**3 * repeats / (time.perf_counter() - start)


def training_flops_per_token(parameters: int, shape: LMShape) -> int:
    """6N + 12 L D T: a training step's FLOPs per token of a language model with N `parameters` (all, embeddings
    included) at `shape` (L layers, D features, context T): forward and backward through the parameters' products,
    and attention's two T x T products per layer, as nanoGPT and the PaLM paper's appendix count them."""
    return 6 * parameters + 12 * shape.layers * shape.features * shape.context


def mfu(tokens_per_second: float, flops_per_token: float, peak_flops: float | None) -> float | None:
    """The fraction of the peak that `tokens_per_second` uses (None without a peak)."""
    return None if peak_flops is None else tokens_per_second * flops_per_token / peak_flops
