"""FSDP2 by hand on the CPU, in each process of a gloo group (the `fully-shard:fsdp` check of
tests/parallel_worker.py): each process holds a shard of every Turner block (`fully_shard`), trains on its half of a
fixed batch, and the main process gathers the full weights and saves them with `save_pretrained`; the test trains
the same model on the whole batch in one process and compares.
"""

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import fully_shard

import turner_tfm  # noqa: F401  (registers "turner" with the Auto classes)
from turner_tfm import TurnerConfig, TurnerForCausalLM

STEPS = 3
LEARNING_RATE = 0.5


def tiny_model() -> TurnerForCausalLM:
    """The same initial weights in every process, and in the test's single-process reference."""
    torch.manual_seed(0)
    config = TurnerConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=16
    )
    return TurnerForCausalLM(config)


def global_batch() -> torch.Tensor:
    """Four sequences of 16 tokens; process r trains on rows 2r and 2r + 1."""
    return torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(1))


def train(model: torch.nn.Module, input_ids: torch.Tensor) -> None:
    """`STEPS` plain SGD steps of next-token loss on `input_ids`."""
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    for _ in range(STEPS):
        model(input_ids=input_ids, labels=input_ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def shard_train_and_save(output_dir: str) -> None:
    """This process's part of the run, in a process group already started."""
    rank, world = dist.get_rank(), dist.get_world_size()
    model = tiny_model()
    for block in model.model.layers:
        fully_shard(block)
    fully_shard(model)
    weight = model.model.layers[0].self_attn.qkv_proj.weight
    print(f"rank {rank}: holds {weight.to_local().numel()} of {weight.numel()} qkv_proj weights of block 0", flush=True)

    rows = global_batch().chunk(world)[rank]
    train(model, rows)

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        unsharded = tiny_model()
        unsharded.load_state_dict(state)
        unsharded.save_pretrained(output_dir)
        print(f"saved the gathered weights to {output_dir}", flush=True)
    dist.barrier()
