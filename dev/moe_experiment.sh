#!/bin/bash
# The Mixture-of-Experts chapter's experiment (dev/bench/README.md, "Mixture-of-Experts
# against dense"): on tiny Shakespeare, from the same seed and on the same tokens, the dense
# 4-layer GPT-2 (d4, train_gpt2_dp) against d4 with E = 8 experts in every MLP, each token to 2
# (train_gpt2_ep, the experts split over 2 ranks: -ep 2), once for each balance rule: none, aux
# (Switch's loss), bias (DeepSeek-V3's routing bias). dev/plot_moe.py draws the validation loss
# against the step and MaxVio (the busiest expert's load over the mean, less 1) against the step,
# and prints dev/bench/README.md's table.
#   bash dev/moe_experiment.sh [out.png]     (default out/moe/moe.png)
#   bash dev/moe_experiment.sh --readme      redraws dev/bench/README.md's figure, dev/images/moe.png
#   STEPS=300 by default; on 2 cores about 12 minutes for the four runs
set -e
cd "$(dirname "$0")/.."
case "${1:-}" in
    --readme) out=dev/images/moe.png ;;
    -*) echo "dev/moe_experiment.sh: unknown option '$1' (expected --readme or an output .png)" >&2; exit 2 ;;
    *) out=${1:-out/moe/moe.png} ;;
esac
steps=${STEPS:-300}
echo "4 runs of 2 ranks, $steps steps each (about 12 minutes on 2 cores at 300); the figure: $out"
mkdir -p "$(dirname "$out")"
make -s train_gpt2_dp train_gpt2_ep
# 2 ranks x B 4 x T 64 = 512 tokens a step; validation every 10 steps on 4 batches of each rank
common=(-e d4 -b 4 -t 64 -x "$steps" -l 1e-3 -u 20 -q 0.1 -v 10 -m 4 -s 0 -seed 1337)
mpi=(mpirun -np 2)
[ "$(id -u)" = 0 ] && mpi+=(--allow-run-as-root)
if [ "$(nproc)" -lt 2 ]; then
    mpi+=(--oversubscribe)
    export OMP_NUM_THREADS=1
fi
run() {  # name program flags...
    local name=$1 program=$2
    shift 2
    rm -rf "out/moe/$name"
    echo "$name: $program $*"
    "${mpi[@]}" "$program" "${common[@]}" -o "out/moe/$name" "$@" | grep -E "^average step time"
}
run dense ./train_gpt2_dp
for balance in none aux bias; do
    run "moe_$balance" ./train_gpt2_ep -experts 8 -topk 2 -ep 2 -balance "$balance"
done
/usr/bin/python3 dev/plot_moe.py -o "$out" \
    --title "GPT-2 d4 on tiny Shakespeare: dense, and 8 experts (top-2) under each balance rule" \
    "dense d4=out/moe/dense" "MoE E=8 k=2, no balancing=out/moe/moe_none" \
    "MoE, aux loss=out/moe/moe_aux" "MoE, routing bias=out/moe/moe_bias"
