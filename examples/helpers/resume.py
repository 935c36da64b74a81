"""Which checkpoint a run resumes from: the `Trainer`'s checkpoint-N folders whose save finished, and what
`--resume_from_checkpoint PATH|true|auto` means.

Stands in for transformers' `get_last_checkpoint`, which picks the newest checkpoint-N folder whether or not its save
finished: a run killed while it saved would resume from a folder without its optimiser or RNG states. Files only, no
torch: the flag is checked before anything heavy loads.
"""

import json
import os
import re
import zipfile
from pathlib import Path

_CHECKPOINT = re.compile(r"^checkpoint-\d+$")  # as transformers.trainer_utils names them
PROCESSES_KEY = "RecordProcesses"  # where trainer_state.json's `stateful_callbacks` records the processes that saved


def complete_checkpoints(output_dir: str | os.PathLike) -> list[Path]:
    """The checkpoint-N folders in `output_dir` whose save finished, oldest first.

    The Trainer writes trainer_state.json last (after the weights, optimiser, scheduler and RNG states), so a folder
    without a readable one is a save that was cut short. The main process writes that file without waiting for the
    others, so where it records that several processes saved (`callbacks.RecordProcesses`), each of their RNG states
    must be there and whole too.
    """
    folder = Path(output_dir)
    found = [path for path in folder.iterdir() if _CHECKPOINT.match(path.name)] if folder.is_dir() else []
    return sorted((path for path in found if is_complete(path)), key=lambda path: int(path.name.split("-")[1]))


def is_complete(checkpoint: Path) -> bool:
    """Whether the save of `checkpoint` finished (see `complete_checkpoints`)."""
    try:
        state = json.loads((checkpoint / "trainer_state.json").read_text())
    except (OSError, ValueError):
        return False
    processes = saved_by_processes(state)
    # torch.save writes a zip archive, its directory last: a file cut short is no zip
    return processes == 1 or all(zipfile.is_zipfile(checkpoint / f"rng_state_{rank}.pth") for rank in range(processes))


def saved_by_processes(trainer_state: dict) -> int:
    """How many processes saved the checkpoint whose trainer_state.json is `trainer_state` (1 when not recorded)."""
    record = trainer_state.get("stateful_callbacks", {}).get(PROCESSES_KEY, {})
    return int(record.get("attributes", {}).get("processes", 1))


def checkpoint_to_resume(value: str, output_dir: str) -> str | None:
    """The folder `--resume_from_checkpoint value` names: `true` is the newest complete checkpoint in `output_dir`,
    `auto` the same or None (start afresh) where there is none, anything else a checkpoint folder. Raises
    `ValueError` saying what is wrong with `value`."""
    checkpoints = complete_checkpoints(output_dir)
    if value.lower() == "auto":
        if checkpoints:
            return str(checkpoints[-1])
        if int(os.environ.get("RANK", "0")) == 0:  # said once, however many processes run the script
            print(f"no complete checkpoint-N folder in --output-dir {output_dir!r}: starting afresh", flush=True)
        return None
    if value.lower() == "true":
        if not checkpoints:
            raise ValueError(
                f"no complete checkpoint-N folder in --output-dir {output_dir!r} (leave the flag out to start afresh, "
                "or use `auto` to resume when there is one and start afresh when not)"
            )
        return str(checkpoints[-1])
    if not is_complete(Path(value)):
        newest = f"; the newest complete one in --output-dir is {str(checkpoints[-1])!r}" if checkpoints else ""
        raise ValueError(
            "not a complete checkpoint (no readable trainer_state.json: the save was cut short, or it is no "
            f"checkpoint-N folder){newest}"
        )
    return value
