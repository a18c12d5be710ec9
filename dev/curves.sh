#!/bin/bash
# The README's figure: the four trainers trained from the same initial weights on the same data
# as PyTorch (dev/compare_with_pytorch.py, 40 steps of a 4-layer model), their loss curves on one
# PNG (dev/plot_runs.py). Each run also prints its comparison table's PASS or FAIL line.
#   bash dev/curves.sh                 the figure into out/curves/losses_vs_pytorch.png
#   bash dev/curves.sh OUT.png         the figure into OUT.png
#   bash dev/curves.sh --readme        redraws the README's committed figure, dev/images/losses_vs_pytorch.png
# Four runs of up to 8 MPI ranks (the 3D run: 2x2x2), oversubscribed where the machine has fewer
# cores: about 8 minutes on 2 cores. The runs stay in out/curves/.
set -e
cd "$(dirname "$0")/.."
case "${1:-}" in
    -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --readme) out=dev/images/losses_vs_pytorch.png ;;
    -*) echo "curves.sh: unknown option '$1' (--readme, --help, or the PNG to write)" >&2; exit 1 ;;
    "") out=out/curves/losses_vs_pytorch.png ;;
    *) out=$1 ;;
esac
echo "curves.sh: 4 trainers against PyTorch, 40 steps each: DP 2 ranks, TP 2, PP 4, 3D 8 (2x2x2);" \
     "about 8 minutes on 2 cores ($(nproc) here); the figure: $out"
mkdir -p "$(dirname "$out")" out/curves
make -s train_gpt2_dp train_gpt2_tp train_gpt2_pp train_gpt2_3d
compare() {  # name ranks trainer flags...
    local name=$1 ranks=$2 trainer=$3
    shift 3
    echo "$name ($ranks ranks): $(/usr/bin/python3 dev/compare_with_pytorch.py --steps 40 --out out/curves/$name --ranks $ranks $trainer -- "$@" | grep -E '^(PASS|FAIL)')"
}
compare dp 2 ./train_gpt2_dp -z 1 -b 4
compare tp 2 ./train_gpt2_tp -sp 1 -b 8
compare pp 4 ./train_gpt2_pp -sched 1f1b -b 2
compare 3d 8 ./train_gpt2_3d -dp 2 -pp 2 -tp 2 -sp 1 -b 2
/usr/bin/python3 dev/plot_runs.py -o "$out" --reference out/curves/dp/reference \
    --title "GPT-2 (L=4, C=64) on tiny Shakespeare: four trainers and PyTorch" \
    "DP 2 ranks, ZeRO-1=out/curves/dp/run" "TP 2 ranks, -sp=out/curves/tp/run" \
    "PP 4 stages, 1f1b=out/curves/pp/run" "3D 2x2x2, -sp=out/curves/3d/run"
