"""The `TrainerCallback`s every training script adds, so that a checkpoint counts as complete (`resume.py`) only once
every process has saved its part.

They stand in for what the `Trainer` does not do: it writes trainer_state.json (the mark of a finished save) from the
main process without waiting for the others' RNG states, and it saves into a checkpoint-N folder an earlier run left
without unmarking it first (a run resumed from an older checkpoint passes that step again).
"""

from pathlib import Path

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_callback import ExportableState

from .resume import PROCESSES_KEY


class UnmarkCheckpointBeforeSaving(TrainerCallback):
    """Before the Trainer saves checkpoint-N into a folder an earlier run left, delete that folder's
    trainer_state.json, and each process its own RNG state: the Trainer writes trainer_state.json last, so the folder
    counts as complete again only once this save is whole."""

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs) -> None:
        if not control.should_save:
            return
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        rng_state = f"rng_state_{args.process_index}.pth" if args.world_size > 1 else "rng_state.pth"
        for name in ("trainer_state.json", rng_state) if args.should_save else (rng_state,):
            (folder / name).unlink(missing_ok=True)

    on_epoch_end = on_step_end


class RecordProcesses(TrainerCallback, ExportableState):
    """Records in every checkpoint's trainer_state.json how many processes saved it, so that `resume.is_complete`
    also wants each process's RNG state there."""

    def __init__(self, processes: int = 1) -> None:
        self.processes = processes

    def state(self) -> dict:
        return {"args": {}, "attributes": {"processes": self.processes}}

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs) -> None:
        self.processes = args.world_size
        state.stateful_callbacks[PROCESSES_KEY] = self.state()  # also in a state resumed from an older checkpoint


assert RecordProcesses.__name__ == PROCESSES_KEY  # the Trainer files a callback's state under its class name


def checkpoint_callbacks() -> list[TrainerCallback]:
    """The callbacks that keep a checkpoint from counting as complete before every process's part of it is saved."""
    return [UnmarkCheckpointBeforeSaving(), RecordProcesses()]
