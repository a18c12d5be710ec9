#!/usr/bin/env bash
# Context parallelism on one CPU machine: a small GPT-2 (d2) at the longest sequence the model
# takes (T = 1024, B = 1, fp32). cp = 1 (one process, 2 threads), cp = 2 (two ranks, 1 thread
# each) and cp = 4 (four ranks on the 2 cores, oversubscribed: for the balance, not the speed),
# each split contiguous and zigzag, ring and all-gather. Prints for each run the averages line
# (ms a step; busy, waiting and moving), the step line's exposed ms (the time a rank waited in
# collectives), and each rank's attention work (score products a step) and its time computing
# the blocks: contiguous leaves the first ranks idle while the last computes, zigzag evens it.
#   ./dev/bench/bench_cp.sh [steps]
set -euo pipefail
cd "$(dirname "$0")/../.."
steps=${1:-4}
[ -x ./train_gpt2_cp ] || make -s train_gpt2_cp
MPI="mpirun --allow-run-as-root --oversubscribe --bind-to none"
args="-e d2 -b 1 -t 1024 -x $steps -v 0 -s 0"
echo "d2, B=1, T=1024, fp32, $steps steps"
echo "== cp=1, 2 threads"
OMP_NUM_THREADS=2 $MPI -np 1 ./train_gpt2_cp $args | grep -E "^average|^rank"
for ranks in 2 4; do
  for layout in contiguous zigzag; do
    for comm in ring allgather; do
      echo "== cp=$ranks $layout $comm, 1 thread per rank"
      OMP_NUM_THREADS=1 $MPI -np $ranks ./train_gpt2_cp $args -cp_layout $layout -cp_comm $comm |
        grep -E "^average|^rank|^step +$steps/" | sed -E 's/^step .*\| (exposed .*)$/last step: \1/'
    done
  done
done
