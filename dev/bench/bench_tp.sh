#!/usr/bin/env bash
# Tensor parallelism on one CPU machine: GPT-2 124M (d12), B=4, T=64, fp32. tp=2 (two MPI ranks,
# 1 OpenMP thread each, each rank half of every matmul) beside tp=1 (one process, 2 threads),
# and tp=2 with -sp 1. Prints ms/step averaged over the steps after the first and the share of
# the step spent inside collectives (host time in MPI calls; on one machine that is mostly the
# wait for the slower rank plus the copies).
#   ./dev/bench/bench_tp.sh [steps]
set -euo pipefail
cd "$(dirname "$0")/../.."
steps=${1:-6}
[ -x ./train_gpt2_tp ] || make -s train_gpt2_tp
MPI="mpirun --allow-run-as-root --oversubscribe --bind-to none"
args="-e d12 -b 4 -t 64 -x $steps -v 0 -s 0"
echo "d12, B=4, T=64, fp32, $steps steps"
echo "== tp=1, 2 threads"
OMP_NUM_THREADS=2 $MPI -np 1 ./train_gpt2_tp $args | grep -E "^average"
echo "== tp=2, 1 thread per rank"
OMP_NUM_THREADS=1 $MPI -np 2 ./train_gpt2_tp $args | grep -E "^communication|^average"
echo "== tp=2 -sp 1, 1 thread per rank"
OMP_NUM_THREADS=1 $MPI -np 2 ./train_gpt2_tp $args -sp 1 | grep -E "^communication|^average"
