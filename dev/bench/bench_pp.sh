#!/usr/bin/env bash
# Pipeline parallelism on one CPU machine: a d8 GPT-2 (8 layers, C = 512), B=1, T=64, fp32, m = 8
# micro-batches per step. 2 stages (two MPI ranks, 1 OpenMP thread each) under afab, 1f1b,
# interleaved (-vp 2) and zb, beside one process with 2 threads. Prints ms/step averaged over the steps
# after the first, the measured timeline of the last step (each stage's busy share against the
# schedule's), and the activations each stage held.
#   ./dev/bench/bench_pp.sh [steps]
set -euo pipefail
cd "$(dirname "$0")/../.."
steps=${1:-4}
[ -x ./train_gpt2_pp ] || make -s train_gpt2_pp
MPI="mpirun --allow-run-as-root --oversubscribe --bind-to none"
args="-e d8 -b 1 -t 64 -d 512 -x $steps -v 0 -s 0"
echo "d8, B=1, T=64, m=8 micro-batches, fp32, $steps steps"
echo "== pp=1, 2 threads"
OMP_NUM_THREADS=2 $MPI -np 1 ./train_gpt2_pp $args | grep -E "^average"
for sched in afab 1f1b "interleaved -vp 2" zb; do
    echo "== pp=2, -sched $sched, 1 thread per rank"
    OMP_NUM_THREADS=1 $MPI -np 2 ./train_gpt2_pp $args -sched $sched -timeline "$steps" |
        grep -E "^  idle|^timeline|^  stage [0-9] \||^average|^activations held" | sed -n '/^  idle/p;/^timeline/,$p'
done
