#!/usr/bin/env bash
# CPU training-step benchmark: GPT-2 124M (d12), B=4, T=64, fp32, one process with 2 OpenMP
# threads (the issue's reference point: llm.c's CPU trainer takes 7.0 s per step on the 2-core
# development machine). Prints ms/step and tokens/s averaged over the steps after the first.
#   ./dev/bench/bench_cpu_step.sh [steps] [threads]
set -euo pipefail
cd "$(dirname "$0")/../.."
steps=${1:-6}
threads=${2:-2}
[ -x ./train_gpt2_dp ] || make -s train_gpt2_dp
echo "d12, B=4, T=64, fp32, $threads threads, $steps steps"
OMP_NUM_THREADS=$threads ./train_gpt2_dp -e d12 -b 4 -t 64 -x "$steps" -v 0 -s 0 | grep -E "^step|^average"
