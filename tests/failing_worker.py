"""An example script run by a launcher with one process failing part-way, as a crash in user code would: the process
`FAIL_RANK` raises at optimiser step `FAIL_AT_STEP` while the others keep training (test_workflows_resume.py).

    FAIL_RANK=1 FAIL_AT_STEP=3 accelerate launch --num_processes 2 tests/failing_worker.py examples/quickstart.py
"""

import os
import runpy
import sys
from pathlib import Path

from transformers import Trainer

_training_step = Trainer.training_step


def failing_training_step(self: Trainer, *args: object, **kwargs: object) -> object:
    if os.environ["RANK"] == os.environ["FAIL_RANK"] and self.state.global_step == int(os.environ["FAIL_AT_STEP"]):
        raise RuntimeError(f"failure injected in process {os.environ['RANK']} at step {self.state.global_step}")
    return _training_step(self, *args, **kwargs)


if __name__ == "__main__":
    Trainer.training_step = failing_training_step
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path[0] = str(Path(script).parent)  # what `python SCRIPT` does: its folder first, not this launcher's
    runpy.run_path(script, run_name="__main__")
