#!/usr/bin/env bash
# The commands behind docs/benchmarks.md's main table, in its order; each prints its Markdown table and writes JSON to
# benchmarks/results/. Run it on a quiet machine: every figure records the load average before and after it and is
# marked noisy when the load was above the core count. One torch thread: with more, OpenMP spin-waits on a busy
# machine swing single steps by 20x. Takes about an hour on 2 cores (the compiled rows compile for minutes).
# The GPU column is one command of its own, run on a machine with an NVIDIA GPU (docs/benchmarks.md, "The GPU column"):
#   python -m benchmarks.gpu_column --json benchmarks/results/gpu/gpu_column.json
set -euo pipefail
cd "$(dirname "$0")/.."  # the repository root: each benchmark runs there as a module
out=benchmarks/results
python -m benchmarks.bench_train --threads 1 --shapes nanogpt-cpu --precisions fp32 bf16 --repeats 40 --json $out/train_cpu.json
python -m benchmarks.bench_train --threads 1 --shapes nanogpt-gpu --precisions fp32 bf16 --repeats 15 --json $out/train_gpu.json
python -m benchmarks.bench_train --threads 1 --shapes nanogpt-cpu --modes compiled --repeats 40 --json $out/train_cpu_compiled.json
python -m benchmarks.bench_trainer --threads 1 --modes eager compiled --json $out/trainer.json
python -m benchmarks.bench_generate --threads 1 --modes dynamic --repeats 12 --json $out/generate_dynamic.json
python -m benchmarks.bench_generate --threads 1 --modes static-compile --repeats 8 --json $out/generate_static.json
python -m benchmarks.bench_vision --threads 1 --repeats 30 --json $out/vision.json
python -m benchmarks.bench_attention_memory --threads 1 --lengths 256 512 1024 2048 4096 8192 --json $out/memory.json
