#!/bin/bash
# The DiLoCo chapter's experiment (dev/bench/README.md, "DiLoCo against DDP"): a 4-layer GPT-2
# (d4) trained from the same random init on tiny Shakespeare by DDP over 4 ranks and by DiLoCo
# with 4 workers of one rank (each rank standing for a datacenter) with H = 1, 10, 50, and
# streaming DiLoCo with F = 4 fragments (H = 48: F must divide H), all with the same tokens per
# step and the same inner AdamW settings, the outer ones the paper's (lr 0.7, momentum 0.9); then
# H = 1 again as plain parameter averaging (outer lr 1, momentum 0). dev/plot_diloco.py draws the validation loss against
# the step and against the bytes sent on the link, and prints dev/bench/README.md's table.
# With --streaming, streaming DiLoCo's own choices at F = 2, H = 48 (so tau < H/F = 24): the
# fragments contiguous or strided, the exchange applied at once or tau = 1 or 2 steps later, the
# merge alpha 0 or 0.5, and the link in fp32, bf16, int8 or e3m0 (dev/images/diloco_streaming.png).
# Every curve is the validation loss of theta_outer, the model DiLoCo trains and writes (the
# trainer validates it, not the workers' own weights, which drift from it between outer steps).
#   bash dev/diloco_vs_ddp.sh [out.png]      (default out/diloco_vs_ddp/diloco_vs_ddp.png)
#   bash dev/diloco_vs_ddp.sh --readme       redraws dev/bench/README.md's figure, dev/images/diloco_vs_ddp.png
#   bash dev/diloco_vs_ddp.sh --streaming    the streaming runs (add --readme after it for dev/bench/README.md's)
#   STEPS=400 by default; on 2 cores about 30 minutes for the six runs, 21 for the eight streaming ones
set -e
cd "$(dirname "$0")/.."
streaming=0
if [ "${1:-}" = --streaming ]; then streaming=1; shift; fi
case "${1:-}" in
    --readme) out=dev/images/diloco_vs_ddp.png; [ $streaming = 1 ] && out=dev/images/diloco_streaming.png ;;
    -*) echo "dev/diloco_vs_ddp.sh: unknown option '$1' (expected --streaming, --readme or an output .png)" >&2; exit 2 ;;
    *) out=${1:-out/diloco_vs_ddp/diloco_vs_ddp.png}; [ $streaming = 1 ] && out=${1:-out/diloco_vs_ddp/diloco_streaming.png} ;;
esac
steps=${STEPS:-400}
[ $streaming = 1 ] && echo "8 runs of 4 ranks, $steps steps each (about 21 minutes on 2 cores at 400); the figure: $out"
[ $streaming = 0 ] && echo "6 runs of 4 ranks, $steps steps each (about 30 minutes on 2 cores at 400); the figure: $out"
mkdir -p "$(dirname "$out")"
make -s train_gpt2_dp train_gpt2_diloco
# 4 ranks x B 2 x T 64 = 512 tokens a step; validation every 10 steps on 4 batches of each rank
common=(-e d4 -b 2 -t 64 -x "$steps" -l 1e-3 -u 20 -q 0.1 -v 10 -m 4 -s 0 -seed 1337)
mpi=(mpirun -np 4)
[ "$(id -u)" = 0 ] && mpi+=(--allow-run-as-root)
# more ranks than cores: one thread each, or their OpenMP threads fight over the cores
if [ "$(nproc)" -lt 4 ]; then
    mpi+=(--oversubscribe)
    export OMP_NUM_THREADS=1
fi
run() {  # name program flags...
    local name=$1 program=$2
    shift 2
    rm -rf "out/diloco_vs_ddp/$name"
    echo "$name: $program $*"
    "${mpi[@]}" "$program" "${common[@]}" -o "out/diloco_vs_ddp/$name" "$@" | grep -E "^average step time"
}
if [ $streaming = 1 ]; then
    stream=(-H 48 -fragments 2)  # (with 4 layers and F = 4 both layouts would be one layer a fragment)
    run f2 ./train_gpt2_diloco "${stream[@]}"
    run f2_strided ./train_gpt2_diloco "${stream[@]}" -fragment_layout strided
    run f2_strided_tau1 ./train_gpt2_diloco "${stream[@]}" -fragment_layout strided -tau 1
    run f2_strided_tau2 ./train_gpt2_diloco "${stream[@]}" -fragment_layout strided -tau 2
    merged=("${stream[@]}" -fragment_layout strided -tau 2 -alpha 0.5)
    run f2_strided_tau2_a05 ./train_gpt2_diloco "${merged[@]}"
    for dtype in bf16 int8 e3m0; do
        run "f2_strided_tau2_a05_$dtype" ./train_gpt2_diloco "${merged[@]}" -outer_dtype $dtype
    done
    /usr/bin/python3 dev/plot_diloco.py -o "$out" --link-ranks 4 \
        --title "GPT-2 d4, 4 datacenters, streaming DiLoCo (F = 2, H = 48): layout, tau, alpha, link dtype" \
        "contiguous=out/diloco_vs_ddp/f2" "strided=out/diloco_vs_ddp/f2_strided" \
        "strided, tau 1=out/diloco_vs_ddp/f2_strided_tau1" "strided, tau 2=out/diloco_vs_ddp/f2_strided_tau2" \
        "strided, tau 2, alpha 0.5=out/diloco_vs_ddp/f2_strided_tau2_a05" \
        "strided, tau 2, alpha 0.5, bf16=out/diloco_vs_ddp/f2_strided_tau2_a05_bf16" \
        "strided, tau 2, alpha 0.5, int8=out/diloco_vs_ddp/f2_strided_tau2_a05_int8" \
        "strided, tau 2, alpha 0.5, e3m0=out/diloco_vs_ddp/f2_strided_tau2_a05_e3m0"
    exit 0
fi
run ddp ./train_gpt2_dp
run h1 ./train_gpt2_diloco -H 1
run h10 ./train_gpt2_diloco -H 10
run h50 ./train_gpt2_diloco -H 50
run h48_f4 ./train_gpt2_diloco -H 48 -fragments 4
# and H = 1 as plain parameter averaging (the outer step without its momentum and learning rate)
run h1_avg ./train_gpt2_diloco -H 1 -outer_lr 1 -outer_momentum 0
/usr/bin/python3 dev/plot_diloco.py -o "$out" --link-ranks 4 \
    --title "GPT-2 d4 on tiny Shakespeare, 4 datacenters of one rank: DDP and DiLoCo" \
    "DDP=out/diloco_vs_ddp/ddp" "DiLoCo H=1=out/diloco_vs_ddp/h1" "DiLoCo H=10=out/diloco_vs_ddp/h10" \
    "DiLoCo H=50=out/diloco_vs_ddp/h50" "streaming F=4, H=48=out/diloco_vs_ddp/h48_f4" \
    "H=1, averaging (lr 1, mu 0)=out/diloco_vs_ddp/h1_avg"
