#!/usr/bin/env bash
# Data parallelism on one CPU machine: d12 GPT-2 (124M parameters), B=1, T=64, fp32, on 2 ranks
# (1 OpenMP thread each), under DDP and ZeRO-1/2/3, each with and without overlap. Prints side
# by side, averaged over the steps after the first: ms/step, the communication time (every
# collective from post to completion) and the part of it the ranks waited for (exposed), the
# bytes each rank sends on a ring, and the allocated high-water mark beside its prediction.
#   ./dev/bench/bench_zero.sh [steps] [model]
set -euo pipefail
cd "$(dirname "$0")/../.."
steps=${1:-4}
model=${2:-d12}
[ -x ./train_gpt2_dp ] || make -s train_gpt2_dp
MPI="mpirun --allow-run-as-root --oversubscribe --bind-to none"
args="-e $model -b 1 -t 64 -d 128 -x $steps -v 0 -s 0"
echo "$model, B=1, T=64, 2 ranks x 1 thread, fp32, $steps steps (averages over steps 2..$steps)"
printf "%-4s %-8s %10s %10s %12s %14s %14s %14s\n" "-z" "overlap" "ms/step" "comm ms" "exposed ms" "ring MB/step" "peak MB" "predicted MB"
for z in 0 1 2 3; do
    for overlap in 0 1; do
        OMP_NUM_THREADS=1 $MPI -np 2 ./train_gpt2_dp $args -z "$z" -overlap "$overlap" |
            awk -v z="$z" -v o="$overlap" '
                /^step/ && !/^step +1\// {
                    n++
                    match($0, /\| [0-9.]+ ms \|/); t += substr($0, RSTART + 2, RLENGTH - 7)
                    match($0, /ring [0-9]+ B/); ring = substr($0, RSTART + 5, RLENGTH - 7)
                    match($0, /comm [0-9.]+ ms/); comm += substr($0, RSTART + 5, RLENGTH - 8)
                    match($0, /exposed [0-9.]+ ms/); exposed += substr($0, RSTART + 8, RLENGTH - 11)
                }
                /high-water mark/ { peak = $5; predicted = $9 }
                END {
                    printf "%-4s %-8s %10.0f %10.0f %12.0f %14.1f %14.1f %14.1f\n", z, o, t / n, comm / n,
                           exposed / n, ring / 1e6, peak / 1e6, predicted / 1e6
                }'
    done
done
