#!/usr/bin/env bash
# Expert parallelism on one CPU machine: GPT-2 d4 with E = 8 experts, top-2 (fp32, B = 4, T =
# 256 a rank), over 4 ranks at ep = 1 (every rank all 8 experts: DDP with MoE layers), ep = 2
# and ep = 4 (2 experts a rank), oversubscribed on the machine's cores (one thread a rank): for
# the communication's shape, not the speed. Then ep = 4 again with the router collapsed (its
# weights zero: every score ties, and every token goes to experts 0 and 1, which rank 0 holds):
# rank 0 runs every token's expert MLPs while the others wait in the all-to-all. Prints for each
# run the averages line (ms a step; busy, waiting and moving), the last step's exposed ms (the
# time a rank waited in collectives) and its MoE line (MaxVio: 0 balanced, E/k - 1 = 3 collapsed;
# a random init routes unevenly for its first steps, before the aux loss levels it), and the
# all-to-all bytes of a step, beside the balanced formula 4 L m N k C X (ep-1)/ep.
#   ./dev/bench/bench_ep.sh [steps]
set -euo pipefail
cd "$(dirname "$0")/../.."
steps=${1:-4}
[ -x ./train_gpt2_ep ] || make -s train_gpt2_ep
MPI="mpirun --allow-run-as-root --oversubscribe --bind-to none -np 4"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
args="-e d4 -experts 8 -topk 2 -b 4 -t 256 -x $steps -v 0 -s 0"
# L = 4 layers, N = 4 x 256 tokens a rank, k = 2, C = 256, X = 4 bytes, one micro-batch
echo "d4, E=8 experts, top-2, B=4 x T=256 a rank, 4 ranks, fp32, $steps steps"
report() {  # the run's lines, and its all-to-all bytes beside the balanced formula
    local log=$1 ep=$2
    grep -E "^average|^step +$steps/|^step $steps moe" "$log" | sed -E 's/^step +[0-9]+\/.*\| (exposed .*)$/last step: \1/'
    /usr/bin/python3 - "$out/run/main.log" "$ep" <<'PY'
import json, sys
rec = [json.loads(l) for l in open(sys.argv[1]) if "train_loss" in l][-1]
ep = int(sys.argv[2])
a2a = rec["comm"].get("ep", {}).get("all_to_all", 0)
formula = 4 * 4 * 1 * 1024 * 2 * 256 * 4 * (ep - 1) / ep
print("all-to-all a step, rank 0: %d bytes; balanced formula 4 L m N k C X (ep-1)/ep = %.0f (+ the counts)" % (a2a, formula))
PY
}
for ep in 1 2 4; do
    echo "== ep=$ep (E/ep = $((8 / ep)) experts a rank), 1 thread a rank"
    rm -rf "$out/run"
    OMP_NUM_THREADS=1 $MPI ./train_gpt2_ep $args -ep $ep -o "$out/run" > "$out/log"
    report "$out/log" $ep
done
# a collapsed router: the initial model written by a 0-step run, its routerw zeroed
OMP_NUM_THREADS=1 $MPI ./train_gpt2_ep -e d4 -experts 8 -topk 2 -b 4 -t 256 -x 0 -v 0 -s 0 -n 1 -o "$out/init" > /dev/null
/usr/bin/python3 - "$out/init/model_00000000.bin" "$out/collapsed.bin" <<'PY'
import sys
import numpy as np
header = np.fromfile(sys.argv[1], dtype=np.int32, count=256).copy()
params = np.fromfile(sys.argv[1], dtype=np.float32, offset=1024)
maxT, V, L, NH, C, Vp, E = (int(x) for x in header[[2, 3, 4, 5, 6, 7, 10]])
router = (Vp + maxT) * C + L * (4 * C * C + 8 * C)  # wte, wpe, ln1, qkv, attproj, ln2 come first
params[router:router + L * E * C] = 0.0
header[8] = header[9] = 0  # (no checksum: the file changed)
with open(sys.argv[2], "wb") as f:
    f.write(header.tobytes())
    f.write(params.tobytes())
PY
echo "== ep=4, the router collapsed: every token to experts 0 and 1 (rank 0)"
rm -rf "$out/run"
OMP_NUM_THREADS=1 $MPI ./train_gpt2_ep -e "$out/collapsed.bin" -b 4 -t 256 -x "$steps" -v 0 -s 0 -balance none -ep 4 \
    -o "$out/run" > "$out/log"
report "$out/log" 4
