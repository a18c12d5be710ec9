#!/usr/bin/env bash
# Tensor parallelism on one CPU machine, fp32, one OpenMP thread a rank:
#   1. GPT-2 124M (d12), B=4, T=64: tp=1 (one process, 2 threads) beside tp=2 and tp=4 (4 ranks on
#      2 cores: oversubscribed), each without and with -sp, each with -tp_overlap 0 and 1;
#   2. layers of d36's width (C=1280, 20 heads of 64: d20, 20 such layers), tp=2 -sp 1, B=2,
#      T=128, -tp_overlap 0 and 1: GEMMs large enough for a ring step to hide behind.
# Prints ms/step averaged over the steps after the first and the exposed communication per step
# (the host's time inside MPI calls the computation waited for). What one CPU machine can show:
# MPI moves a posted exchange only while a rank is inside MPI (no progress thread, copies by the
# cores that compute), so the ring steps of -tp_overlap 1 do not run under the GEMMs here; what
# changes is that each rank waits for a neighbour's block rather than for the whole collective.
#   ./dev/bench/bench_tp.sh [steps]
set -euo pipefail
cd "$(dirname "$0")/../.."
steps=${1:-6}
[ -x ./train_gpt2_tp ] || make -s train_gpt2_tp
MPI="mpirun --allow-run-as-root --oversubscribe --bind-to none"

# one run: "ms/step exposed-ms/step", averaged over the steps after the first (main.log)
measure() {
    local ranks=$1 threads=$2 dir
    shift 2
    dir=$(mktemp -d)
    OMP_NUM_THREADS=$threads $MPI -np "$ranks" ./train_gpt2_tp "$@" -o "$dir" > "$dir/stdout.txt"
    /usr/bin/python3 - "$dir/main.log" <<'EOF'
import json, sys
steps = [json.loads(line) for line in open(sys.argv[1])]
steps = [r for r in steps if "train_loss" in r][1:]
print("%9.1f %12.1f" % (sum(r["ms"] for r in steps) / len(steps), sum(r["exposed_ms"] for r in steps) / len(steps)))
EOF
    rm -rf "$dir"
}

echo "d12, B=4, T=64, fp32, $steps steps (the first not counted), 1 thread a rank"
printf "%-28s %9s %12s\n" "layout" "ms/step" "exposed ms"
printf "%-28s %s\n" "tp=1 (2 threads)" "$(measure 1 2 -e d12 -b 4 -t 64 -x "$steps" -v 0 -s 0)"
for tp in 2 4; do
    for sp in 0 1; do
        for overlap in 0 1; do
            printf "%-28s %s\n" "tp=$tp -sp $sp -tp_overlap $overlap" \
                "$(measure $tp 1 -e d12 -b 4 -t 64 -x "$steps" -v 0 -s 0 -sp $sp -tp_overlap $overlap)"
        done
    done
done
echo
echo "d20 (d36's layer: C=1280, 20 heads), B=2, T=128, tp=2 -sp 1, $steps steps"
for overlap in 0 1; do
    printf "%-28s %s\n" "tp=2 -sp 1 -tp_overlap $overlap" \
        "$(measure 2 1 -e d20 -b 2 -t 128 -x "$steps" -v 0 -s 0 -sp 1 -tp_overlap $overlap)"
done
