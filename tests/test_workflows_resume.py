"""Interrupted runs, as a user meets them: a run killed (SIGKILL) right after a checkpoint resumes with
`--resume-from-checkpoint true` to the very weights and losses of a run never stopped; one process of several that
dies takes the others down at once, naming what happened; a save cut short is never resumed from."""

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from transformers import Trainer, TrainerCallback, TrainingArguments, default_data_collator
from transformers.trainer_utils import get_last_checkpoint

from examples.helpers import callbacks, data, training
from turner_tfm import TurnerConfig, TurnerForCausalLM

from .workflow_utils import (
    LM_RUN,
    TINY_MODEL,
    accelerate_launch,
    assert_same_run,
    complete_checkpoints,
    example,
    kill_after_first_checkpoint,
    kill_run,
    launch_env,
    run_example,
    run_module,
    start,
    worker_pids,
    write_text,
)


def assert_resumes_exactly(command: Callable[[], list[str]], run: tuple[str, ...], tmp_path: Path) -> Path:
    """Run `command()` with `run` twice side by side (the machine has 2 cores): one killed right after its first
    checkpoint and resumed with `--resume-from-checkpoint true`, one never stopped; both must end alike. Returns
    the checkpoint the run resumed from. `command` is called for each run, so launchers get ports of their own."""
    killed = start([*command(), *run, "--output-dir", "killed"], tmp_path)
    uninterrupted = start([*command(), *run, "--output-dir", "whole"], tmp_path)
    checkpoint = kill_after_first_checkpoint(killed, tmp_path / "killed")
    assert uninterrupted.wait(timeout=600) == 0, uninterrupted.log.read_text()[-3000:]
    assert not (tmp_path / "killed" / "model.safetensors").exists()  # the killed run did not finish

    resume = ("--output-dir", "killed", "--resume-from-checkpoint", "true")
    output = run_example(command(), *run, *resume, tmp_path=tmp_path, env=launch_env(tmp_path))
    assert output.count(f"resuming from {checkpoint.relative_to(tmp_path)}") == 1  # said by the main process only
    assert_same_run(tmp_path / "killed", tmp_path / "whole", int(checkpoint.name.split("-")[1]))
    return checkpoint


def test_a_killed_run_resumes_to_the_weights_and_losses_of_one_never_stopped(tmp_path: Path) -> None:
    write_text(tmp_path)
    assert_resumes_exactly(lambda: [sys.executable, *example("train_causal_lm.py")], LM_RUN, tmp_path)


def refusal(args: tuple[str, ...], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> str:
    """What `python -m examples.train_causal_lm ARGS`, run in `tmp_path`, prints as it refuses ARGS (its exit status
    must not be 0). Run in this process: the refusal comes as the arguments are parsed, before any training, so a
    fresh interpreter would only add ~8 s of imports."""
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:  # an uncaught exception (a traceback) fails here
        run_module("examples.train_causal_lm", list(args), monkeypatch)
    captured = capsys.readouterr()
    assert exited.value.code not in (None, 0), f"the run was not refused:\n{(captured.out + captured.err)[-3000:]}"
    return captured.out + captured.err


def test_resume_flag_names_what_is_wrong(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    (tmp_path / "out" / "checkpoint-5").mkdir(parents=True)
    empty, incomplete = (
        refusal(("--resume-from-checkpoint", "true", "--output-dir", "empty"), tmp_path, monkeypatch, capsys),
        refusal(("--resume-from-checkpoint", "out/checkpoint-5"), tmp_path, monkeypatch, capsys),
    )
    assert "--resume_from_checkpoint 'true' is not valid: no complete checkpoint-N folder" in empty, empty[-2000:]
    expected = "--resume_from_checkpoint 'out/checkpoint-5' is not valid: not a complete checkpoint"
    assert expected in incomplete, incomplete[-2000:]
    assert "Traceback" not in incomplete, incomplete[-2000:]


@pytest.mark.slow
def test_a_killed_two_process_run_resumes_exactly(tmp_path: Path) -> None:
    write_text(tmp_path)
    checkpoint = assert_resumes_exactly(lambda: accelerate_launch("train_causal_lm.py"), LM_RUN, tmp_path)
    assert sorted(path.name for path in checkpoint.glob("rng_state_*.pth")) == ["rng_state_0.pth", "rng_state_1.pth"]


RUNS = {
    "train_text_classifier.py": ("--examples-per-class", "60", "--max-length", "48", *TINY_MODEL),
    "train_image_classifier.py": ("--image-size", "8", "--patch-size", "4", *TINY_MODEL),
    "finetune_lora.py": ("--model-name-or-path", "base", "--block-size", "32", "--max-new-tokens", "5"),
}


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(RUNS))
def test_a_killed_classifier_or_lora_run_resumes_exactly(script: str, tmp_path: Path) -> None:
    if script == "finetune_lora.py":  # a base model to adapt, and dropout in the adapters
        write_text(tmp_path)
        run_example("train_causal_lm.py", *LM_RUN, "--max-steps", "2", "--output-dir", "base", tmp_path=tmp_path)
    dropout = ("--lora-dropout", "0.1") if script == "finetune_lora.py" else ("--hidden-dropout", "0.1")
    run = (*RUNS[script], *dropout, "--max-steps", "24", "--save-steps", "8", "--logging-steps", "2")
    assert_resumes_exactly(
        lambda: [sys.executable, *example(script)], (*run, "--per-device-train-batch-size", "8"), tmp_path
    )


def wait_for_training(launcher: subprocess.Popen) -> None:
    while "'loss'" not in launcher.log.read_text():
        assert launcher.poll() is None, launcher.log.read_text()[-3000:]
        time.sleep(0.1)


@pytest.mark.parametrize("failure", ["exception", pytest.param("SIGKILL", marks=pytest.mark.slow)])
def test_when_one_process_fails_the_others_stop_at_once_naming_it(failure: str, tmp_path: Path) -> None:
    write_text(tmp_path)
    run = [*LM_RUN, "--max-steps", "100000", "--save-steps", "100000", "--output-dir", "out"]  # hours, unless stopped
    launch = accelerate_launch(Path(__file__).with_name("failing_worker.py"))
    fail_rank = "1" if failure == "exception" else "none"
    launcher = start([*launch, *example("train_causal_lm.py"), *run], tmp_path, FAIL_RANK=fail_rank, FAIL_AT_STEP="5")
    workers = worker_pids(launcher)
    if failure == "SIGKILL":
        wait_for_training(launcher)
        os.kill(workers[1], signal.SIGKILL)
    try:
        status = launcher.wait(timeout=120)
    finally:
        if launcher.poll() is None:
            kill_run(launcher)
    output = launcher.log.read_text()
    named = "RuntimeError: failure injected in process 1 at step 5" if failure == "exception" else "(SIGKILL)"
    assert status != 0 and named in output, output[-3000:]
    assert "Root Cause (first observed failure)" in output and "rank      : 1 (local_rank: 1)" in output
    assert not [pid for pid in workers.values() if psutil.pid_exists(pid)], "a process was left behind"


def test_a_save_cut_short_is_never_resumed_from(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """Killed while checkpoint-4 of an 11M-parameter model is being written (its weights are there, the optimiser's
    85 MB not yet): the Trainer's own `get_last_checkpoint` would pick that folder, `true` picks checkpoint-2. (The
    weights in it are whole: safetensors writes a temporary file and renames it.)"""
    write_text(tmp_path)
    big = ("--hidden-size", "384", "--num-hidden-layers", "6", "--num-attention-heads", "6")
    run = ("--train-file", "text.txt", "--max-steps", "6", "--save-steps", "2", "--block-size", "32")
    run += ("--max-new-tokens", "10", "--per-device-train-batch-size", "2", *big, "--output-dir", "out")
    process = start([sys.executable, *example("train_causal_lm.py"), *run], tmp_path)
    cut_short = tmp_path / "out" / "checkpoint-4"
    while not (cut_short / "model.safetensors").exists():
        assert process.poll() is None, process.log.read_text()[-3000:]
        time.sleep(0.001)
    kill_run(process)
    assert not (cut_short / "trainer_state.json").exists(), "the kill came after the save: nothing was tested"
    assert get_last_checkpoint(tmp_path / "out") == str(cut_short)
    assert complete_checkpoints(tmp_path / "out") == [tmp_path / "out" / "checkpoint-2"]

    output = refusal((*run, "--resume-from-checkpoint", "out/checkpoint-4"), tmp_path, monkeypatch, capsys)
    assert "'out/checkpoint-4' is not valid: not a complete checkpoint" in output, output[-2000:]
    # what `true` resumes from
    assert "the newest complete one in --output-dir is 'out/checkpoint-2'" in output, output[-2000:]


def test_a_checkpoint_saved_over_counts_as_complete_only_once_the_new_save_is_whole(tmp_path: Path) -> None:
    """Resumed from checkpoint-2, a run saves checkpoint-4 again over the one it left before: while that save runs
    the folder is not complete, so a kill then cannot leave old trainer state beside new weights."""
    write_text(tmp_path)
    argv = ["--output-dir", str(tmp_path / "out"), "--max-steps", "4", "--save-steps", "2"]
    (training_args,) = training.parse_arguments((TrainingArguments,), [*argv, "--per-device-train-batch-size", "2"])
    text = (tmp_path / "text.txt").read_text()
    tokenizer = data.char_tokenizer([text], model_max_length=16)
    complete_when_saving = []

    class SeeWhatIsCompleteWhenASaveBegins(TrainerCallback):
        def on_step_end(self, args: object, state: object, control: object, **kwargs: object) -> None:
            if control.should_save:
                complete_when_saving.append([path.name for path in complete_checkpoints(args.output_dir)])

    for resume in (None, str(tmp_path / "out" / "checkpoint-2")):
        config = TurnerConfig(vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=1, num_attention_heads=2)
        trainer = Trainer(  # as the scripts build it
            model=TurnerForCausalLM(config),
            args=training_args,
            train_dataset=data.token_blocks(tokenizer, text, 16, "training"),
            data_collator=default_data_collator,
            callbacks=[*callbacks.checkpoint_callbacks(), SeeWhatIsCompleteWhenASaveBegins()],
        )
        trainer.train(resume_from_checkpoint=resume)
    assert complete_when_saving == [[], ["checkpoint-2"], ["checkpoint-2"]]
    assert [path.name for path in complete_checkpoints(tmp_path / "out")] == ["checkpoint-2", "checkpoint-4"]
