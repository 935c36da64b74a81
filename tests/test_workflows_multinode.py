"""Past one machine, on one machine: two `accelerate launch --num_machines 2` launchers from a config file train to the
weights of one `accelerate launch` with two workers, whose result loads and generates; a worker killed mid-run is
restarted by torchrun (`--max-restarts`) and the run resumes by itself (`--resume-from-checkpoint auto`) to the
weights and losses of a run never stopped; a node that is lost stops the other within seconds (one that hangs, within
--ddp-timeout), naming it, and both restarted (torchrun `--nnodes 2`, c10d rendezvous) resume from the last complete
checkpoint to the weights and losses of a run never stopped.

The run never stopped is one launch shared by the tests of this module (each worker pays some 10 s of imports).
Every launcher runs in a session of its own with its output in a log; a test waits with a timeout, kills what is
left, and shows every launcher's output (each prints its workers' tracebacks) when something fails."""

import json
import re
import signal
import sys
import time
import zipfile
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
from huggingface_hub import ModelCard
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainingArguments
from transformers.trainer_utils import IntervalStrategy

from examples.helpers import distributed, training

from .workflow_utils import (
    LM_RUN,
    accelerate_launch,
    assert_same_run,
    assert_same_weights,
    complete_checkpoints,
    example,
    free_port,
    kill_run,
    logs,
    start,
    torchrun,
    wait_all,
    worker_pids,
    write_text,
)

SCRIPT = example("train_causal_lm.py")  # -m examples.train_causal_lm
AUTO = ("--resume-from-checkpoint", "auto")
# 40 steps, a checkpoint every 8: a run killed after its first checkpoint still has most of its steps ahead of it
RUN = (*LM_RUN, "--max-steps", "40", *AUTO)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory):
    """RUN never stopped, in `accelerate launch` with two workers on this machine: the run that the tests of this
    module compare with (`--output-dir whole` in its folder). Started when first asked for, alongside that test's own
    runs; wait for it with `finished`."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    write_text(folder)
    run = start([*accelerate_launch("train_causal_lm.py"), *RUN, "--output-dir", "whole"], folder)
    run.folder = folder / "whole"
    yield run
    if run.poll() is None:
        kill_run(run)


def finished(run) -> str:
    """The output of a reference run (`uninterrupted`, or the slow FSDP case's own) once it ended; fails if it did."""
    (output,) = wait_all(run, timeout=600)
    return output


def two_torchrun_nodes(tmp_path: Path, *args: str, port: int | None = None, static: bool = False) -> list:
    """Two torchrun launchers, one worker each, as two machines would start them: meeting at a c10d rendezvous on
    127.0.0.1, or (`static`) at node 0's, which then serves the store."""
    port = port or free_port()
    commands = [torchrun(nodes=2, processes=1, port=port, node_rank=rank if static else None) for rank in range(2)]
    return [start([*command, *SCRIPT, *args], tmp_path) for command in commands]


def two_accelerate_machines(tmp_path: Path, *args: str) -> list:
    """`accelerate launch --machine_rank 0|1` from a config file for two machines (one process each), as the file
    `accelerate config` writes for "multi-GPU, 2 machines". On a machine without a GPU the launcher starts torchrun
    all the same and the script trains on the CPU over gloo (distributed_type MULTI_CPU would want mpirun)."""
    config = tmp_path / "two-machines.yaml"
    config.write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nnum_machines: 2\nnum_processes: 2\n"
        f"machine_rank: 0\nmain_process_ip: 127.0.0.1\nmain_process_port: {free_port()}\nrdzv_backend: static\n"
        "same_network: true\nmixed_precision: 'no'\ngpu_ids: all\nuse_cpu: false\n"
    )
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config)]
    return [start([*launch, "--machine_rank", str(rank), *SCRIPT, *args], tmp_path) for rank in range(2)]


@pytest.mark.parametrize("parallel", ["ddp", pytest.param("fsdp", marks=pytest.mark.slow)])
def test_two_nodes_train_to_the_weights_of_one_launcher(parallel: str, tmp_path: Path, request) -> None:
    """Two `accelerate launch --machine_rank 0|1` from a two-machine config file against one `accelerate launch
    --multi_gpu --num_processes 2`, whose result also loads and generates in one process. (Two torchrun launchers
    as two nodes: c10d in test_a_lost_node_..., static there and in accelerate's launchers here.)"""
    write_text(tmp_path)
    if parallel == "fsdp":  # without checkpoints: transformers 5.23 cannot resume a model sharded at load time
        run = (*LM_RUN, "--max-steps", "6")
        run = (*run[: run.index("--save-steps")], *run[run.index("--save-steps") + 2 :], "--fsdp-size", "2")
        one = start([*accelerate_launch("train_causal_lm.py"), *run, "--output-dir", "one"], tmp_path)
        one.folder = tmp_path / "one"
    else:
        run, one = RUN, request.getfixturevalue("uninterrupted")
    machines = two_accelerate_machines(tmp_path, *run, "--output-dir", "machines")
    outputs = wait_all(*machines, timeout=600)
    one_output = finished(one)

    assert one_output.count("text: text, ") == 1, f"said by the main process only:\n{one_output[-3000:]}"
    assert sum(output.count("text: text, ") for output in outputs) == 1, f"said by machine 0 only:\n{logs(*machines)}"
    expected = "FSDP2 over 2 processes" if parallel == "fsdp" else "DDP over 2 processes (gloo)"
    for folder in (one.folder, tmp_path / "machines"):
        card = ModelCard.load(folder / "README.md").text
        assert f"| parallelism | {expected}" in card, f"{folder.name}'s model card:\n{card}"
    card = ModelCard.load(one.folder / "README.md").text
    assert "| batch size | 4 per process x 2 process(es) x 1 accumulation |" in card, card
    assert_same_weights(tmp_path / "machines", one.folder)

    tokenizer = AutoTokenizer.from_pretrained(one.folder)
    model = AutoModelForCausalLM.from_pretrained(one.folder)
    generated = model.generate(**tokenizer("Simple is", return_tensors="pt"), max_new_tokens=5, do_sample=False)
    assert generated.shape == (1, len("Simple is") + 5), "the saved model does not load and generate"


def resume_value(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[str | None, str]:
    """What `--resume-from-checkpoint` becomes once a training script's flags are checked, and what it printed."""
    (training_args,) = training.parse_arguments((TrainingArguments,), argv)
    return training_args.resume_from_checkpoint, capsys.readouterr().out


def test_auto_starts_afresh_without_a_complete_checkpoint_and_resumes_from_the_newest_one(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert resume_value(["--output-dir", "out", *AUTO], capsys) == (
        None,
        "no complete checkpoint-N folder in --output-dir 'out': starting afresh\n",
    )
    for step in (2, 4, 6):
        (tmp_path / "out" / f"checkpoint-{step}").mkdir(parents=True)
    (tmp_path / "out" / "checkpoint-2" / "trainer_state.json").write_text("{}")
    assert resume_value(["--output-dir", "out", *AUTO], capsys) == ("out/checkpoint-2", "")  # 4, 6: cut short

    # a save by two processes: the main one wrote trainer_state.json, the other's RNG state is missing, then cut short
    two = json.dumps({"stateful_callbacks": {"RecordProcesses": {"args": {}, "attributes": {"processes": 2}}}})
    for step in (4, 6):
        (tmp_path / "out" / f"checkpoint-{step}" / "trainer_state.json").write_text(two)
        with zipfile.ZipFile(tmp_path / "out" / f"checkpoint-{step}" / "rng_state_0.pth", "w") as archive:
            archive.writestr("rng", "state")
    (tmp_path / "out" / "checkpoint-6" / "rng_state_1.pth").write_bytes(b"PK\x03\x04 cut short")
    assert complete_checkpoints(tmp_path / "out") == [tmp_path / "out" / "checkpoint-2"]
    (tmp_path / "out" / "checkpoint-4" / "rng_state_1.pth").write_bytes(
        (tmp_path / "out" / "checkpoint-4" / "rng_state_0.pth").read_bytes()
    )
    assert resume_value(["--output-dir", "out", *AUTO], capsys) == ("out/checkpoint-4", "")
    assert resume_value(["--output-dir", "out", "--resume-from-checkpoint", "AUTO"], capsys)[0] == "out/checkpoint-4"


def test_a_sharding_the_run_cannot_take_is_refused_by_name() -> None:
    model = object()  # refused before it is read
    with pytest.raises(ValueError, match=r"fsdp_size=2 is not valid: it must equal the number of processes, 1"):
        distributed.shard(model, 2, SimpleNamespace(world_size=1, save_strategy=IntervalStrategy.NO))
    with pytest.raises(ValueError, match=r"save_strategy='steps': transformers cannot save the optimiser"):
        distributed.shard(model, 2, SimpleNamespace(world_size=2, save_strategy=IntervalStrategy.STEPS))


def resumed_from(output: str, output_dir: str) -> int:
    """The step of the checkpoint the run said it resumed from (said once, by the main process)."""
    steps = re.findall(rf"^resuming from {output_dir}/checkpoint-(\d+)$", output, flags=re.MULTILINE)
    assert len(steps) == 1, output[-3000:]
    return int(steps[0])


@pytest.mark.parametrize("kill", ["after a checkpoint", pytest.param("during a save", marks=pytest.mark.slow)])
def test_torchrun_restarts_a_killed_worker_and_the_run_resumes_by_itself(kill: str, tmp_path: Path, request) -> None:
    """One command, `--resume-from-checkpoint auto` under `torchrun --max-restarts 1`: the first start trains afresh,
    a worker is killed (SIGKILL), torchrun starts the group again and the run resumes from the newest complete
    checkpoint, to the weights and logged losses of the same command never interrupted. Killed during a save (its
    weights written, the optimiser not yet), the checkpoint being written is not the one resumed."""
    write_text(tmp_path)
    if kill == "during a save":  # 11M parameters: writing the optimiser's 85 MB takes a while
        big = ("--hidden-size", "384", "--num-hidden-layers", "6", "--num-attention-heads", "6")
        run = (*LM_RUN, "--max-steps", "6", "--save-steps", "2", "--per-device-train-batch-size", "2", *big, *AUTO)
        whole = start([*torchrun(port=free_port()), *SCRIPT, *run, "--output-dir", "whole"], tmp_path)
        whole.folder = tmp_path / "whole"
    else:
        run, whole = RUN, request.getfixturevalue("uninterrupted")
    restarted = start([*torchrun(port=free_port(), max_restarts=1), *SCRIPT, *run, "--output-dir", "out"], tmp_path)
    workers = worker_pids(restarted)
    cut_short = tmp_path / "out" / "checkpoint-4"
    deadline = time.monotonic() + 300
    while not (complete_checkpoints(tmp_path / "out") if kill == "after a checkpoint" else
               (cut_short / "model.safetensors").exists()):  # fmt: skip
        assert restarted.poll() is None and time.monotonic() < deadline, logs(restarted)
        time.sleep(0.001)
    killed = 0 if kill == "during a save" else 1  # process 0 writes the checkpoint
    psutil.Process(workers[killed]).kill()
    if kill == "during a save":
        assert not (cut_short / "trainer_state.json").exists(), "the kill came after the save: nothing was tested"
    (output,) = wait_all(restarted, timeout=600)
    finished(whole)

    assert "no complete checkpoint-N folder in --output-dir 'out': starting afresh" in output, output[-3000:]
    assert f"failed (exitcode: -9) local_rank: {killed}" in output, output[-3000:]  # torchrun saw the kill
    assert output.count("text: text, ") == 2, output[-3000:]  # and started the script again
    step = resumed_from(output, "out")
    assert step == 2 if kill == "during a save" else step >= 8, f"resumed from step {step}"
    assert_same_run(tmp_path / "out", whole.folder, step)


NODE_1_NAMED = r"lost 1 of 2 processes, silent for 3 s: process 1 \(pid \d+ on node 1 \(host .*, launcher pid {pid}\)\)"
LOST = {  # how a node is lost -> (that node's --node-rank, what the other says)
    "killed": (1, NODE_1_NAMED),
    "killed, serving the store": (
        0,
        r"lost the launchers' store at 127\.0\.0\.1:{port} \(DistNetworkError\): the node",
    ),
    "frozen": (1, NODE_1_NAMED),
}


@pytest.mark.parametrize(
    "how", ["killed", *(pytest.param(how, marks=pytest.mark.slow) for how in ("killed, serving the store", "frozen"))]
)
def test_a_lost_node_stops_the_other_naming_it_and_both_restarted_resume(
    how: str, tmp_path: Path, uninterrupted
) -> None:
    """Two nodes (torchrun's static rendezvous: node 0 at 127.0.0.1 serves the store) train with
    `--resume-from-checkpoint auto`; after the first checkpoint one node's launcher and its worker are killed
    (SIGKILL: the machine is gone, its sockets closed) or frozen (SIGSTOP: a machine that hangs or is cut off, its
    sockets open; --ddp-timeout 10 bounds the wait). The other node stops by itself, naming the lost one, in a time
    printed here; both started again (now meeting at a c10d rendezvous, as `torchrun --nnodes 2 --rdzv-backend c10d`
    on two machines) resume from the newest complete checkpoint and end with the weights and losses of a run never
    interrupted."""
    write_text(tmp_path)
    run = (*RUN, "--ddp-timeout", "10") if how == "frozen" else RUN  # the timeout changes no number
    port = free_port()
    nodes = two_torchrun_nodes(tmp_path, *run, "--output-dir", "out", port=port, static=True)
    lost_rank, message = LOST[how]
    lost, survivor = nodes[lost_rank], nodes[1 - lost_rank]
    deadline = time.monotonic() + 300
    while not complete_checkpoints(tmp_path / "out"):
        assert survivor.poll() is None and lost.poll() is None and time.monotonic() < deadline, logs(*nodes)
        time.sleep(0.01)
    kill_run(lost, signal.SIGSTOP if how == "frozen" else signal.SIGKILL)
    stopped_at = time.monotonic()
    try:
        (output,) = wait_all(survivor, timeout=120, expect_failure=True)
        print(f"\n{how}: the other node stopped {time.monotonic() - stopped_at:.1f} s after the loss")
    finally:
        kill_run(lost)  # a frozen node is killed now
    assert re.search(message.format(pid=lost.pid, port=port), output), output[-3000:]

    checkpoint = complete_checkpoints(tmp_path / "out")[-1]
    again = two_torchrun_nodes(tmp_path, *run, "--output-dir", "out")
    outputs = wait_all(*again, timeout=600)
    finished(uninterrupted)
    step = int(checkpoint.name.split("-")[1])
    assert resumed_from("".join(outputs), "out") == step
    assert sum(output.count("text: text, ") for output in outputs) == 1, f"said by node 0 only:\n{logs(*again)}"
    card = ModelCard.load(tmp_path / "out" / "README.md").text
    assert "| parallelism | DDP over 2 processes (gloo)" in card, f"the two nodes' model card:\n{card}"
    assert_same_run(tmp_path / "out", uninterrupted.folder, step)
