#!/usr/bin/env bash
# Everything a machine with a GPU should check, in one command: the GPU tests (the CUDA trainer
# against the PyTorch reference in FP32 and BF16 at 1 and 2 ranks, bf16 resume, NCCL collectives,
# every dev/cuda validation), then the throughput benchmark beside PyTorch.
# Needs nvcc, a GPU and a python3 with PyTorch; MPI is not needed. Logs go to $OUT or /tmp.
#   ./dev/gpu_check.sh [benchmark steps]
set -uo pipefail
cd "$(dirname "$0")/.."
logs=${OUT:-/tmp}
nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv
PYTHONUNBUFFERED=1 python3 test/run_tests.py gpu 2>&1 | tee "$logs/gpu_tests.log"
./dev/bench/bench_gpu.sh "${1:-10}" 2>&1 | tee "$logs/gpu_bench.log"
