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
# out-of-bounds accesses and shared-memory races that a numerical test can miss: two steps of a
# small model. API errors are not reported: NCCL probes for kernel images it was not built with
# (cudaFuncGetAttributes fails, harmlessly), and the trainer checks every CUDA call it makes itself.
# racecheck names cuBLAS's own split-K kernels too (nvjet_*); only this project's kernels count.
if command -v compute-sanitizer >/dev/null; then
    make -s build/cuda_BF16/train_gpt2_dp
    for tool in memcheck racecheck; do
        compute-sanitizer --tool $tool --report-api-errors no --print-limit 20 ./build/cuda_BF16/train_gpt2_dp \
            -e d2 -b 2 -t 64 -x 2 -v 1 -m 1 -s 2 -g 8 > "$logs/gpu_$tool.log" 2>&1
        grep "=====" "$logs/gpu_$tool.log" | head -40
    done
fi
./dev/bench/bench_gpu.sh "${1:-10}" 2>&1 | tee "$logs/gpu_bench.log"
