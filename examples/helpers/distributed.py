"""Several processes on machines without a GPU: the workarounds the training scripts need under torchrun or
`accelerate launch` (gloo), sharding with `--fsdp_size`, and messages said once.

- `start_process_group`: transformers passes no `--ddp_timeout` to gloo, and torchrun's own store misleads gloo after
  a restart (pytorch/pytorch#167288);
- `ProcessWatch`: a failed collective says only that it failed; this names the processes that are gone;
- `leave_process_group`: a process that exits while gloo's threads run aborts the whole `accelerate launch`;
- `shard`: `fsdp_size` N through transformers' own plan (`DistributedConfig(fsdp_size=N)`);
- `pipeline_of`: transformers' pipelines check a model's class by its name, which FSDP2 changes.
"""

import contextlib
import datetime
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Iterator

import torch
from transformers import DistributedConfig, Pipeline, PreTrainedModel, TrainingArguments, pipeline


def is_main_process() -> bool:
    """False in every process but the first under a multi-process launcher; for messages printed once."""
    return int(os.environ.get("RANK", "0")) == 0


def announce(message: str) -> None:
    """Print `message` once, from the main process, however many processes run the script."""
    if is_main_process():
        print(message)


def distributed_without_gpu() -> bool:
    """True under a multi-process launcher (torchrun, `accelerate launch`) on a machine without CUDA: the processes
    then train on the CPU and talk through gloo."""
    return not torch.cuda.is_available() and int(os.environ.get("WORLD_SIZE", "1")) > 1


def start_process_group(ddp_timeout: int) -> None:
    """Under a launcher without a GPU, join the gloo process group with --ddp-timeout (seconds) before transformers or
    accelerate do: `TrainingArguments(use_cpu=True)` passes no timeout on (gloo's default is 30 minutes) and
    `from_pretrained(distributed_config=...)` uses two hours, so a process whose peer is gone without a word (a
    machine switched off, a network cut) would wait that long in its next collective.

    Under torchrun the group meets in a store of the first process's own (`_fresh_store`), not in torchrun's: torchrun
    keeps its store across `--max-restarts`, and gloo, meeting there again, reads the addresses of the processes
    that died (torch 2.13, pytorch/pytorch#167288: "Connection refused" and no restart)."""
    if not distributed_without_gpu() or torch.distributed.is_initialized():
        return
    timeout = datetime.timedelta(seconds=ddp_timeout)
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":  # not torchrun's workers: its own rendezvous
        torch.distributed.init_process_group("gloo", timeout=timeout)
        return
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = _fresh_store(rank, world_size, timeout)
    torch.distributed.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=timeout)


def _fresh_store(rank: int, world_size: int, timeout: datetime.timedelta) -> torch.distributed.Store:
    """A store that only this attempt's processes use: the first serves it on a free port and says where in
    torchrun's store, with a word of its own; the others connect where it says until the store there answers with
    that word (what an earlier attempt left there points to a process that is gone)."""
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    launcher = torch.distributed.TCPStore(host, port, is_master=False, timeout=timeout, wait_for_workers=False)
    if rank == 0:
        store = torch.distributed.TCPStore(host, 0, world_size, is_master=True, timeout=timeout, wait_for_workers=False)
        word = f"{socket.gethostname()}-{os.getpid()}-{time.time_ns()}"
        store.set("turner/word", word)
        launcher.set("turner/process-group-store", f"{store.port} {word}")
        return store
    deadline = time.monotonic() + timeout.total_seconds()
    while True:
        store_port, word = launcher.get("turner/process-group-store").decode().split()
        with contextlib.suppress(torch.distributed.DistError):
            store = torch.distributed.TCPStore(
                host, int(store_port), is_master=False, timeout=datetime.timedelta(seconds=2), wait_for_workers=False
            )
            if store.get("turner/word").decode() == word:
                store.set_timeout(timeout)
                return store
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"process 0 did not open the process group's store within --ddp-timeout {timeout.total_seconds():g}"
            )
        time.sleep(0.1)


class ProcessWatch:
    """Names the processes of a multi-process run that are gone when a collective fails.

    Each process counts up a key of its own in the launchers' store (torchrun's TCPStore at MASTER_ADDR:MASTER_PORT,
    which the launcher of every node reaches) from a thread, every `BEAT` seconds, and says there where it runs.
    When a collective fails, the counts that do not move within `LISTEN` seconds are the processes that died or froze;
    a store that does not answer means the node that serves it (the first node) is gone. torchrun keeps its store
    across restarts, so each process counts under a name of its own, which its rank's entry gives.
    """

    BEAT, LISTEN = 0.25, 3.0

    def __init__(self, rank: int, world_size: int) -> None:
        self.prefix = f"turner-watch/{os.environ.get('TORCHELASTIC_RUN_ID', 'run')}"
        self.rank, self.world_size = rank, world_size
        self.address = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
        store = self._store()
        name = f"{socket.gethostname()}-{os.getpid()}-{time.time_ns()}"
        where = f"node {os.environ.get('GROUP_RANK', '?')} (host {socket.gethostname()}, launcher pid {os.getppid()})"
        store.set(f"{self.prefix}/where/{rank}", f"{name} pid {os.getpid()} on {where}")
        self.stopped = threading.Event()
        threading.Thread(target=self._beat, args=(store, name), daemon=True, name="turner-heartbeat").start()

    @classmethod
    @contextlib.contextmanager
    def start(cls) -> Iterator[None]:
        """Watch the other processes while the block runs (a no-op outside a multi-process launcher)."""
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        if world_size == 1 or "MASTER_ADDR" not in os.environ or "MASTER_PORT" not in os.environ:
            yield
            return
        watch = cls(int(os.environ["RANK"]), world_size)
        try:
            yield
        except Exception as error:
            if isinstance(error, torch.distributed.DistError) or "gloo" in str(error):  # a collective failed
                print(f"\n{watch.lost()}", file=sys.stderr, flush=True)
            raise
        finally:
            watch.stopped.set()

    def _store(self) -> torch.distributed.Store:
        host, port = self.address.rsplit(":", 1)
        timeout = datetime.timedelta(seconds=self.LISTEN)
        return torch.distributed.TCPStore(host, int(port), is_master=False, timeout=timeout, wait_for_workers=False)

    def _beat(self, store: torch.distributed.Store, name: str) -> None:
        while not self.stopped.wait(self.BEAT):
            try:
                store.add(f"{self.prefix}/beat/{name}", 1)
            except torch.distributed.DistError:  # the store is gone: `lost` says so
                return

    def lost(self) -> str:
        """One line: which processes stopped beating, and where they ran."""
        try:
            store = self._store()
            where = {}
            for rank in range(self.world_size):
                key = f"{self.prefix}/where/{rank}"
                where[rank] = store.get(key).decode().split(" ", 1) if store.check([key]) else ["", "not started"]
            before = {rank: store.add(f"{self.prefix}/beat/{name}", 0) for rank, (name, _) in where.items()}
            time.sleep(self.LISTEN)
            gone = [
                rank
                for rank, (name, _) in where.items()
                if rank != self.rank and store.add(f"{self.prefix}/beat/{name}", 0) == before[rank]
            ]
        except torch.distributed.DistError as error:  # the store client cannot reach the store
            return (
                f"lost the launchers' store at {self.address} ({type(error).__name__}): the node that serves it (the "
                "first node) is gone, or its launcher has stopped"
            )
        if not gone:
            return f"a collective failed, but every other process of {self.world_size} is still running"
        names = "; ".join(f"process {rank} ({where[rank][1]})" for rank in gone)
        return f"lost {len(gone)} of {self.world_size} processes, silent for {self.LISTEN:g} s: {names}"


def leave_process_group(wait_for_the_others: bool) -> None:
    """Under `accelerate launch`, close the group: a process that exits while gloo's threads still run aborts
    ("terminate called without an active exception") and fails the whole launch. After a success every process waits
    for the others first; after a failure none does (the others may be inside a collective that will never finish),
    so this process exits at once and the launcher stops the rest, naming the failed one."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        if wait_for_the_others:
            torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def shard(model: PreTrainedModel, fsdp_size: int, training_args: TrainingArguments) -> PreTrainedModel:
    """With `fsdp_size` N > 1, the model loaded again from its own weights sharded by transformers' FSDP2 plan
    (`DistributedConfig(fsdp_size=N)`): each of the N processes holds 1/N of every weight, and the `Trainer` trains it
    as it is. The same seed made the same weights in every process, so nothing is shared through the file system."""
    if fsdp_size == 1:
        return model
    if fsdp_size != training_args.world_size:
        raise ValueError(
            f"fsdp_size={fsdp_size} is not valid: it must equal the number of processes, {training_args.world_size} "
            f"(start {fsdp_size} with torchrun --nproc_per_node {fsdp_size})"
        )
    if training_args.save_strategy != "no":
        raise ValueError(
            f"fsdp_size={fsdp_size} is not valid with save_strategy={training_args.save_strategy.value!r}: "
            "transformers cannot save the optimiser of a model sharded at load time, so no checkpoint could be "
            "resumed from (the trained model is saved at the end all the same)"
        )
    distributed_config = DistributedConfig(fsdp_size=fsdp_size)
    return type(model).from_pretrained(
        None, config=model.config, state_dict=model.state_dict(), distributed_config=distributed_config
    )


class _ShardedClassNameFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("The model 'FSDP")


def pipeline_of(task: str, model: PreTrainedModel, **kwargs) -> Pipeline:
    """`pipeline(task, model=model, **kwargs)` for a model `shard` may have sharded. Workaround: the pipeline checks
    the model's class by name (`Pipeline.check_model_type`), and FSDP2 renames it `FSDP<Name>`, so transformers logs
    that the model "is not supported" and then runs it as usual; that one record is dropped. Stands in for the check
    accepting a subclass of a supported class."""
    pipelines_logger = logging.getLogger("transformers.pipelines.base")
    sharded_names = _ShardedClassNameFilter()
    pipelines_logger.addFilter(sharded_names)
    try:
        return pipeline(task, model=model, **kwargs)
    finally:
        pipelines_logger.removeFilter(sharded_names)
