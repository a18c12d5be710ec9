#!/usr/bin/env bash
# CPU training-step benchmark: GPT-2 124M (d12), B=4, T=64, fp32, one process with 2 OpenMP
# threads; ms/step averaged over the steps after the first. Beside ours, where OpenBLAS is
# installed (make bench installs it), its peer: the same trainer with OpenBLAS's sgemm doing every
# matmul (dev/bench/train_gpt2_dp_openblas), so the two steps differ only in the GEMM. They run in
# turns, `rounds` times each, and the best of each is compared: a shared VM's speed drifts by
# 10-20% over minutes, which one run of each would read as a difference between them.
#   ./dev/bench/bench_cpu_step.sh [steps] [threads] [rounds]
set -euo pipefail
cd "$(dirname "$0")/../.."
steps=${1:-6}
threads=${2:-2}
rounds=${3:-3}
make -s train_gpt2_dp
peer=1
make -s dev/bench/train_gpt2_dp_openblas 2>/dev/null || peer=0

# one run's "average step time" in ms
step_ms() {
    "$@" -e d12 -b 4 -t 64 -x "$steps" -v 0 -s 0 | awk '/^average step time/ { print $4 }'
}

echo "d12, B=4, T=64, fp32, $threads threads, $steps steps a run, $rounds runs each"
best_ours=""
best_peer=""
for round in $(seq "$rounds"); do
    ours=$(OMP_NUM_THREADS=$threads step_ms ./train_gpt2_dp)
    best_ours=$(echo "$ours ${best_ours:-$ours}" | awk '{ print ($1 < $2) ? $1 : $2 }')
    line="run $round: ours $ours ms"
    if [ "$peer" = 1 ]; then
        # Two thread pools share this process: OpenBLAS's (its sgemm) and OpenMP's (our other
        # ops). Each busy-waits after its work and takes the cores from the other (2.3 s a step),
        # unless both are told to sleep at once: OpenBLAS's timeout at its least, OpenMP passive.
        theirs=$(OPENBLAS_THREAD_TIMEOUT=4 OMP_WAIT_POLICY=passive OMP_NUM_THREADS=$threads \
                 OPENBLAS_NUM_THREADS=$threads step_ms ./dev/bench/train_gpt2_dp_openblas)
        best_peer=$(echo "$theirs ${best_peer:-$theirs}" | awk '{ print ($1 < $2) ? $1 : $2 }')
        line="$line, with OpenBLAS's sgemm $theirs ms"
    fi
    echo "$line"
done
if [ "$peer" = 1 ]; then
    echo "best: ours $best_ours ms, with OpenBLAS's sgemm $best_peer ms (ours $(echo "$best_ours $best_peer" | awk '{ printf "%.2f", $1 / $2 }')x its time)"
else
    echo "best: ours $best_ours ms (OpenBLAS not installed: make bench installs it, for the step with its sgemm beside ours)"
fi
