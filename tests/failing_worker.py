"""An example script run by a launcher with one process failing part-way, as a crash in user code would: the process
`FAIL_RANK` raises at optimiser step `FAIL_AT_STEP` while the others keep training (test_workflows_resume.py).

    FAIL_RANK=1 FAIL_AT_STEP=3 accelerate launch --num_processes 2 tests/failing_worker.py -m examples.quickstart
"""

import os
import runpy
import sys

from transformers import Trainer

_training_step = Trainer.training_step


def failing_training_step(self: Trainer, *args: object, **kwargs: object) -> object:
    if os.environ["RANK"] == os.environ["FAIL_RANK"] and self.state.global_step == int(os.environ["FAIL_AT_STEP"]):
        raise RuntimeError(f"failure injected in process {os.environ['RANK']} at step {self.state.global_step}")
    return _training_step(self, *args, **kwargs)


if __name__ == "__main__":
    Trainer.training_step = failing_training_step
    module = sys.argv[2]  # after -m, as `python -m MODULE` takes it
    sys.argv = sys.argv[2:]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
