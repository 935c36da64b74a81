"""The tests run as CI runs them, whatever the shell says: one torch thread in every process (tests/conftest.py), the
pytest workers and the processes the tests start."""

import os
import subprocess
import sys

import torch


def test_this_process_and_the_processes_it_starts_use_one_torch_thread():
    assert os.environ["OMP_NUM_THREADS"] == "1" and torch.get_num_threads() == 1
    child = "import torch; print(torch.get_num_threads())"
    result = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True)
    assert result.stdout.split()[-1] == "1"
