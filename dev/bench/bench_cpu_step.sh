#!/usr/bin/env bash
# CPU training-step benchmark: GPT-2 124M (d12), B=4, T=64, fp32, one process with 2 OpenMP
# threads; ms/step averaged over the steps after the first. Beside ours, where OpenBLAS is
# installed (make bench installs it), its peer: the same trainer with OpenBLAS's sgemm doing every
# matmul (dev/bench/train_gpt2_dp_openblas, linked with OpenBLAS's OpenMP build so that one pool
# of threads serves both), so the two steps differ only in the GEMM. They run in turns, `rounds`
# times each, and the best of each is compared: a shared VM's speed drifts by 10-20% over
# minutes, which one run of each would read as a difference between them.
#   ./dev/bench/bench_cpu_step.sh [steps >= 2] [threads] [rounds]
set -euo pipefail
cd "$(dirname "$0")/../.."
steps=${1:-6}
threads=${2:-2}
rounds=${3:-3}
if [ "$steps" -lt 2 ]; then echo "bench_cpu_step.sh: steps=$steps: at least 2 (the first is not timed)" >&2; exit 2; fi
make -s BACKEND=cpu train_gpt2_dp
peer=1
make -s BACKEND=cpu dev/bench/train_gpt2_dp_openblas || peer=0  # (its message says what is missing)

# one run's "average step time", in ms
step_ms() {
    OMP_NUM_THREADS=$threads "$@" -e d12 -b 4 -t 64 -x "$steps" -v 0 -s 0 | awk '/^average step time/ { print $4 }'
}
# the smaller of two numbers (the first when the second is empty)
smaller() {
    echo "$1 ${2:-$1}" | awk '{ print ($1 < $2) ? $1 : $2 }'
}

echo "d12, B=4, T=64, fp32, $threads threads, $steps steps a run, $rounds runs each"
best_ours=""
best_peer=""
round=1
while [ "$round" -le "$rounds" ]; do
    ours=$(step_ms ./train_gpt2_dp)
    best_ours=$(smaller "$ours" "$best_ours")
    line="run $round: ours $ours ms"
    if [ "$peer" = 1 ]; then
        theirs=$(step_ms ./dev/bench/train_gpt2_dp_openblas)
        best_peer=$(smaller "$theirs" "$best_peer")
        line="$line, with OpenBLAS's sgemm $theirs ms"
    fi
    echo "$line"
    round=$((round + 1))
done
if [ "$peer" = 1 ]; then
    ratio=$(echo "$best_ours $best_peer" | awk '{ printf "%.2f", $1 / $2 }')
    echo "best: ours $best_ours ms, with OpenBLAS's sgemm $best_peer ms (ours ${ratio}x its time)"
else
    echo "best: ours $best_ours ms (no peer: dev/setup.sh --bench installs OpenBLAS)"
fi
