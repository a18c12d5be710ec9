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
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for z in 0 1 2 3; do
    for overlap in 0 1; do
        rm -rf "$out/run"
        # main.log holds every figure of a step (step time, comm and exposed ms, ring bytes)
        peak=$(OMP_NUM_THREADS=1 $MPI -np 2 ./train_gpt2_dp $args -z "$z" -overlap "$overlap" -o "$out/run" |
               awk '/^device memory high-water mark/ { print $5, $9 }')
        awk -v z="$z" -v o="$overlap" -v peak="$peak" '
            function field(name) { match($0, "\"" name "\": [0-9.]+"); return substr($0, RSTART + length(name) + 4, RLENGTH - length(name) - 4) }
            /"train_loss"/ && !/"step": 1,/ { n++; t += field("ms"); comm += field("comm_ms"); exposed += field("exposed_ms"); ring = field("ring_bytes") }
            END {
                split(peak, p, " ")
                printf "%-4s %-8s %10.0f %10.0f %12.0f %14.1f %14.1f %14.1f\n", z, o, t / n, comm / n, exposed / n,
                       ring / 1e6, p[1] / 1e6, p[2] / 1e6
            }' "$out/run/main.log"
    done
done
