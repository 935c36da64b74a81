#!/usr/bin/env bash
# The GPU checks of one lent GPU machine, prepared to fit its device time (15 minutes a session, machine start
# included; 10 a command): each stage is one command on the machine, its output and JSON written to $OUT (default:
# gpu-session/). The machine has no package index and an older transformers: the wheels in .whl/ (git-ignored; name
# it in the run's `carry`) are installed first, without dependencies, then `benchmarks/gpu_wheels.py check` stops the
# stage in seconds if a requirement is still unmet. Here, before the first run:
#   bash benchmarks/gpu_session.sh wheels      # this environment's transformers, datasets, liger-kernel, ... to .whl/
#   bash benchmarks/gpu_session.sh tests       # pytest -m gpu (24 tests took 130 s on an H200, 2026-11-27; more now)
#   bash benchmarks/gpu_session.sh training    # the column's training and Trainer rows (estimate: 5.5 min on an H100)
#   bash benchmarks/gpu_session.sh decoding    # its decoding rows (2.5 min), then a kernel profile of a static-cache
#                                              # generate() call per model at batch 1 and 64 (compiles 4 times)
#   bash benchmarks/gpu_session.sh batching    # the continuous-batching row (1.9 min)
# The first three together come near a session's 15 minutes: a session that runs them all has no time to run one
# again. Estimates: `python3 -m benchmarks.gpu_column` prints them before it starts (H100_SECONDS there).
set -euo pipefail
cd "$(dirname "$0")/.."
stage=${1:-}
if [[ ! $stage =~ ^(wheels|tests|training|decoding|batching)$ ]]; then
  echo "usage: bash benchmarks/gpu_session.sh wheels | tests | training | decoding | batching" >&2
  exit 2
fi
if [[ $stage == wheels ]]; then  # here, where pip reaches an index
  exec python3 -m benchmarks.gpu_wheels download
fi
out=${OUT:-gpu-session}
mkdir -p "$out"
export HF_HUB_OFFLINE=1
if compgen -G ".whl/*.whl" >/dev/null; then python3 -m pip install -q --no-index --no-deps .whl/*.whl; fi
# before anything imports transformers: an unmet requirement is named, not met as an import error
python3 -m benchmarks.gpu_wheels check 2>&1 | tee "$out/machine.txt"
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || echo "no nvidia-smi"
  python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
  uptime
} >>"$out/machine.txt"

case $stage in
  tests)
    # README's addopts deselect the gpu marker: the command line's -m replaces them
    python3 -m pytest -o addopts="" -m gpu -n 8 -p no:cacheprovider -rA tests/test_cuda.py >"$out/pytest_gpu.txt" 2>&1
    ;;
  training)
    python3 -m benchmarks.gpu_column --sections train train-compiled trainer --json "$out/gpu_column_training.json" \
      >"$out/gpu_column_training.txt" 2>&1
    ;;
  decoding)
    python3 -m benchmarks.gpu_column --sections decode decode-static --json "$out/gpu_column_decoding.json" \
      >"$out/gpu_column_decoding.txt" 2>&1
    for batch in 1 64; do
      python3 -m benchmarks.profile_generate --device cuda --dtype bf16 --shape gpt2-small --mode static-compile \
        --batch "$batch" --rows 25 --json "$out/profile_static_b$batch.json" >"$out/profile_static_b$batch.txt" 2>&1
    done
    ;;
  batching)
    python3 -m benchmarks.gpu_column --sections continuous-batching --json "$out/gpu_column_batching.json" \
      >"$out/gpu_column_batching.txt" 2>&1
    ;;
esac
uptime >>"$out/machine.txt"
