"""Tensor parallel against one process: forward and greedy decoding of one Turner LM, and each rank's parameters.

Run with two processes (one torch thread each):

    torchrun --standalone --nproc_per_node 2 -m benchmarks.bench_parallel --json benchmarks/results/parallel.json

Rank 0 saves a randomly initialised `TurnerForCausalLM` (by default 4 blocks, D=1024, 16 heads, MLP 4096,
vocabulary 32000, tied head: 83 M parameters); every rank loads it twice, whole and with
`DistributedConfig(tp_size=2)`. The contenders run interleaved in the same processes:

* `one process, 1 thread`: rank 0 runs the whole model while the other ranks wait at a barrier;
* `one process, N threads`: the same, with as many torch threads as there are ranks (the same cores as TP);
* `tensor parallel`: every rank runs its shard (1 thread each), with gloo all-reduces between them.

Forward: batch 4 x 256 tokens, no gradient. Decode: `generate()` of 32 new tokens after a 64-token prompt, batch 1,
greedy, dynamic cache. Before timing, the sharded logits are checked against the whole model's (1e-4). The machine's
load average is recorded before and after (`benchutils.finish_run`); above the number of cores, the run is noisy.
"""

from __future__ import annotations

import argparse
import atexit
import datetime
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from transformers import AutoModelForCausalLM, DistributedConfig

import turner_tfm
from benchmarks import benchutils


def model_shape(args: argparse.Namespace) -> dict[str, int]:
    """The benchmarked config: heads of 64 features, an MLP 4 x D wide."""
    return {
        "vocab_size": args.vocab_size,
        "hidden_size": args.hidden_size,
        "num_hidden_layers": args.num_hidden_layers,
        "num_attention_heads": args.hidden_size // 64,
        "intermediate_size": 4 * args.hidden_size,
        "max_position_embeddings": 1024,
    }


def parameter_megabytes(model: torch.nn.Module) -> float:
    """Bytes this process holds of the model's parameters (its shard of each sharded one), in MiB."""
    total = 0
    for parameter in model.parameters():
        local = parameter.to_local() if isinstance(parameter, DTensor) else parameter
        total += local.numel() * local.element_size()
    return total / 2**20


def alone_on_rank_zero(fn: Callable[[], object], threads: int) -> Callable[[], None]:
    """Rank 0 runs `fn` with `threads` torch threads; the other ranks wait for it at a barrier."""

    def run() -> None:
        if dist.get_rank() == 0:
            torch.set_num_threads(threads)
            fn()
            torch.set_num_threads(1)
        dist.barrier()

    return run


def saved_model(shape: dict[str, int], seed: int) -> Path:
    """Rank 0 saves a fresh model to a temporary folder (removed at exit) and tells the other ranks where."""
    folder = [None]
    if dist.get_rank() == 0:
        folder = [tempfile.mkdtemp(prefix="bench-parallel-")]
        atexit.register(shutil.rmtree, folder[0], ignore_errors=True)
        torch.manual_seed(seed)
        AutoModelForCausalLM.from_config(turner_tfm.TurnerConfig(**shape)).save_pretrained(folder[0])
    dist.broadcast_object_list(folder)
    return Path(folder[0])


def load_models(folder: Path, world: int) -> tuple[torch.nn.Module, torch.nn.Module]:
    whole = AutoModelForCausalLM.from_pretrained(folder).eval()
    sharded = AutoModelForCausalLM.from_pretrained(folder, distributed_config=DistributedConfig(tp_size=world)).eval()
    return whole, sharded


def workloads(model: torch.nn.Module, args: argparse.Namespace) -> dict[str, Callable[[], object]]:
    generator = torch.Generator().manual_seed(args.seed)
    batch = torch.randint(0, args.vocab_size, (4, args.tokens), generator=generator)
    prompt = torch.randint(0, args.vocab_size, (1, args.prompt), generator=generator)
    settings = {"max_new_tokens": args.new_tokens, "min_new_tokens": args.new_tokens, "do_sample": False}

    def forward() -> None:
        with torch.no_grad():
            model(batch)

    return {"forward": forward, "decode": lambda: model.generate(prompt, **settings)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    benchutils.add_run_arguments(parser, repeats=10, warmup=2)
    parser.add_argument("--tokens", type=int, default=256, help="tokens per sequence in the forward pass")
    parser.add_argument("--prompt", type=int, default=64, help="prompt length for decoding")
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens generated per decode call")
    parser.add_argument("--hidden-size", type=int, default=1024, help="D (heads of 64 features)")
    parser.add_argument("--num-hidden-layers", type=int, default=4)
    parser.add_argument("--vocab-size", type=int, default=32000)
    args = parser.parse_args()
    shape = model_shape(args)

    dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=10))
    rank, world = dist.get_rank(), dist.get_world_size()
    env = benchutils.start_run(1)
    whole, sharded = load_models(saved_model(shape, args.seed), world)

    check = torch.randint(0, args.vocab_size, (2, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        difference = (whole(check).logits - sharded(check).logits).abs().max().item()
    assert difference < 1e-4, f"the sharded logits differ from the whole model's by {difference}"

    memory = {"one process": parameter_megabytes(whole), "tensor parallel": parameter_megabytes(sharded)}
    whole_work, sharded_work = workloads(whole, args), workloads(sharded, args)
    results: dict[str, dict] = {}
    for name in ("forward", "decode"):
        contenders = {
            "one process, 1 thread": alone_on_rank_zero(whole_work[name], 1),
            f"one process, {world} threads": alone_on_rank_zero(whole_work[name], world),
            "tensor parallel": sharded_work[name],
        }
        times, record = benchutils.timed(contenders, args.repeats, args.warmup)
        results[name] = record | {"speedup": benchutils.speedups(times, of="tensor parallel")}
    benchutils.finish_run(env)
    if rank == 0:
        report(env, args, shape, world, memory, results, difference)
    dist.barrier()
    dist.destroy_process_group()


def report(env, args, shape, world, memory, results, difference) -> None:
    rows = []
    for name, result in results.items():
        for label, timing in result["times"].items():
            speedup = result["speedup"].get(f"vs_{label}")
            ratio = benchutils.fmt_ratio(speedup["median"]) if speedup else "—"
            rows.append([name, label, benchutils.fmt_ms(timing["median_s"]), ratio])
    times = benchutils.markdown_table(["workload", "contender", "median time", "TP speed-up (contender / TP)"], rows)
    rows = [[label, f"{megabytes:.1f} MiB"] for label, megabytes in memory.items()]
    sizes = benchutils.markdown_table(["parameters held by rank 0", "size"], rows)
    intro = f"sharded logits vs whole model: max |difference| = {difference:.2e}\n"
    benchutils.print_report(env, f"{times}\n\n{sizes}", intro)
    benchutils.save_run(
        args,
        "tensor_parallel",
        env,
        world_size=world,
        shape=shape,
        max_logit_difference=difference,
        parameter_mib_rank0=memory,
        results=results,
    )


if __name__ == "__main__":
    main()
