#!/usr/bin/env bash
# Everything a machine with a GPU should check, in one command: where a d12 step's time goes,
# kernel by kernel beside the roofline (LLMC_KERNEL_TIMES=1), the GPU tests (every trainer's
# CUDA backend against the PyTorch reference in FP32 and BF16: DDP at 1 and 2 ranks, ZeRO-1/2/3,
# TP with and without SP, PP 1f1b and zero bubble, CP ring and all-gather, DiLoCo with an fp32 and a
# bf16 link; bf16 resume, NCCL collectives, every dev/cuda validation), memcheck and racecheck
# of the trainer, then the throughput benchmark beside PyTorch.
# Needs nvcc, a GPU and a python3 with PyTorch; MPI is not needed. Logs go to $OUT or /tmp.
#   ./dev/gpu_check.sh [benchmark steps]
# GPU_CHECK_SECONDS=N stops each part at the time left of N seconds (a lent GPU's time is short):
# the parts run in order of what they tell, the benchmark last.
set -uo pipefail
cd "$(dirname "$0")/.."
logs=${OUT:-/tmp}
deadline=$((SECONDS + ${GPU_CHECK_SECONDS:-86400}))
left() { echo $((deadline - SECONDS > 1 ? deadline - SECONDS : 1)); }
# at most $1 seconds, and never past the deadline: one run that hangs (a new kernel on a GPU it was
# never run on) must not take the time of all the parts after it
upto() { local n; n=$(left); echo $((n < $1 ? n : $1)); }
nvidia-smi --query-gpu=name,compute_cap,memory.total,driver_version --format=csv
# every CUDA program the tests run, built side by side on all cores first (the test runner's own
# make runs two at a time)
programs="train_gpt2_dp train_gpt2_tp train_gpt2_pp train_gpt2_cp train_gpt2_diloco train_gpt2_ep train_gpt2_3d $(ls dev/cuda/*.cu | sed 's/\.cu$//')"
targets="build/cuda_FP32/test/test_comm dev/bench/step_kernels"  # (step_kernels: roofline.py's rows, llmc/step_kernels.h)
for precision in FP32 BF16; do
    for p in $programs; do targets="$targets build/cuda_$precision/$p"; done
done
time timeout "$(left)" make -s -j"$(nproc)" $targets 2>&1 | tail -20
# where the step's time goes: d12 at the benchmark's shape, each kind of launch timed
# (LLMC_KERNEL_TIMES=1, llmc/kernel_times.h) beside its roofline, the largest gap first
LLMC_KERNEL_TIMES=1 timeout "$(left)" ./build/cuda_BF16/train_gpt2_dp -e d12 -b 64 -t 1024 -x 6 -v 0 -s 0 > "$logs/gpu_kernel_times.log" 2>&1
grep -A60 "^kernel times" "$logs/gpu_kernel_times.log"
python3 dev/bench/roofline.py -e d12 -b 64 -t 1024 -precision bf16 -device auto -measured "$logs/gpu_kernel_times.log"
# the code paths beside the defaults, each step timed in turns (the defaults first and last: the
# spread between those two is the noise), with the launches each path changes (LLMC_KERNEL_TIMES=1:
# a whole step moves by about 1 ms from run to run, more than one path saves). A path that is
# faster, and whose GPU tests pass, becomes the default; on an H200 on 2026-11-27 the GELU,
# classifier and LayerNorm paths below were the defaults' losers, and wgmma and the one-kernel
# backward's first version too. LLMC_GELU=kernels: GELU in kernels of its own, not in the fc GEMMs' epilogues
# (dev/cuda/gelu tells which GELU those compute); LLMC_CLASSIFIER=registers: one classifier row an
# SM, in registers (dev/cuda/classifier v4 against v5); LLMC_LAYERNORM_BACKWARD=separate: dout and
# x read twice (dev/cuda/layernorm_backward v3 against v4); LLMC_FLASH=wgmma: flash attention on
# Hopper's warpgroup MMA (dev/cuda/attention_forward v7, attention_backward v6); LLMC_FLASH=fa3:
# FlashAttention-3's machinery, TMA loads, warp specialization, pingpong (llmc/cuda/flash_hopper.cuh,
# attention_forward v8-v11, never run on a GPU before this script);
# LLMC_FLASH_BACKWARD=one_kernel: the flash backward in one kernel, dq summed in a fixed order
# (dev/cuda/attention_backward v7 beside v5; its first version on an H200 on 2026-11-27: 40.9 ms
# a step against 22.7, its blocks in an order that L2 could not hold, since changed);
# LLMC_BIAS_GRAD=kernels: the bias gradients outside the GEMMs.
echo "paths side by side (d12, B=64, T=1024, 8 steps; ms a step, the mean after the first; then the launches"
echo "the paths change, ms a step: fc GEMM + GELU, fcproj input gradient + GELU', classifier, LayerNorm"
echo "backward, attention forward and backward):"
# (an empty variant is the defaults; each run's last lines say how often each counted path was
# taken, llmc/ops.h's paths_print)
turn=0
for variant in "" LLMC_GELU=kernels LLMC_CLASSIFIER=registers LLMC_LAYERNORM_BACKWARD=separate \
    LLMC_FLASH=wgmma LLMC_FLASH=fa3 LLMC_FLASH_BACKWARD=one_kernel LLMC_BIAS_GRAD=kernels ""; do
    turn=$((turn + 1))
    log="$logs/gpu_path_$turn.log"
    # shellcheck disable=SC2086  # the variant splits into its assignments
    env $variant LLMC_KERNEL_TIMES=1 timeout "$(upto 90)" ./build/cuda_BF16/train_gpt2_dp -e d12 -b 64 -t 1024 -x 8 -v 0 \
        -s 0 > "$log" 2>&1
    step=$(grep -E "^average step time" "$log" || echo "failed: $(tail -n 1 "$log")")
    printf "  %-34s %s\n" "${variant:-the defaults}" "${step%%,*}"
    # the kernel-times table (llmc/kernel_times.h): "  <launch>  calls  ms  share"; the fc GEMM is
    # "matmul forward C->4C", fcproj's input gradient "matmul dinp 4C->C"
    awk '/^  / && NF >= 4 { ms = $(NF - 1); name = $0; sub(/ +[0-9.]+ +[0-9.]+ +[0-9.]+%$/, "", name); sub(/^ +/, "", name)
             if (match(name, /^matmul forward [0-9]+->[0-9]+$/)) { split(substr(name, 16), d, "->"); if (d[2] == 4 * d[1]) fc += ms }
             else if (match(name, /^matmul dinp [0-9]+->[0-9]+$/)) { split(substr(name, 13), d, "->"); if (d[1] == 4 * d[2]) proj += ms }
             else if (name == "gelu forward") fc += ms; else if (name == "gelu backward") proj += ms
             else if (name ~ /^classifier/) cls += ms; else if (name == "layernorm backward") ln += ms
             else if (name == "attention forward") af += ms; else if (name == "attention backward") ab += ms }
         END { if (fc + proj) printf "    fc+GELU %.2f  fcproj dinp+GELU%s %.2f  classifier %.2f  LN backward %.2f  attention %.2f + %.2f\n",
                                  fc, "\047", proj, cls, ln, af, ab }' "$log"
    grep -E "fell back" "$log" | sed 's/^/    /'
done
# d24's LayerNorm backward at C = 1024, where the fused kernel (the default, one block an SM at 4
# packs a lane) timed slower alone than the two kernels (dev/cuda/layernorm_backward: 0.181 against
# 0.141 ms at 32768 x 1024): the d24 step with each, in turns, decides d24's default
echo "d24 (B=32, T=1024, 6 steps): the fused LayerNorm backward beside the two kernels, ms a step and the launches'"
for variant in "" LLMC_LAYERNORM_BACKWARD=separate ""; do
    log="$logs/gpu_d24_layernorm_${variant:-fused}.log"
    # shellcheck disable=SC2086  # the variant splits into its assignment
    env $variant LLMC_KERNEL_TIMES=1 timeout "$(upto 120)" ./build/cuda_BF16/train_gpt2_dp -e d24 -b 32 -t 1024 -x 6 -v 0 \
        -s 0 > "$log" 2>&1
    step=$(grep -E "^average step time" "$log" || echo "failed: $(tail -n 1 "$log")")
    printf "  %-34s %s %s\n" "${variant:-the defaults (fused)}" "${step%%,*}" \
        "$(awk '/^  layernorm backward / { print "LN backward " $(NF - 1) " ms" }' "$log")"
done
# the same paths' kernels alone (dev/cuda): whether wgmma's layouts are the emulator's (v1-v3: each
# layout against the CPU) and its rate beside mma.sync's, the wgmma forward (v7) beside the
# mma.sync one (v6), FlashAttention-3's ladder (v8 TMA, v9 warp specialization, v10 pingpong, v11
# the softmax under the next product: each rung's time is the README's ladder table), the wgmma
# backward (v6) and the one-kernel backward (v7) beside the mma.sync one (v5), which GELU
# cuBLASLt's epilogues compute (tanh or erf), the classifier's split kernel (v5) beside the
# register kernel (v4), the fused LayerNorm backward (v4) beside the two kernels (v3) at d12's, d24's and d36's widths
for program in build/cuda_BF16/dev/cuda/wgmma build/cuda_BF16/dev/cuda/attention_forward \
    build/cuda_BF16/dev/cuda/attention_backward build/cuda_FP32/dev/cuda/gelu build/cuda_BF16/dev/cuda/gelu \
    build/cuda_BF16/dev/cuda/classifier build/cuda_BF16/dev/cuda/layernorm_backward; do
    echo "$program:"
    timeout "$(upto 90)" "./$program" 2>&1 |
        grep -E "^gelu in|v1 K|v2 .*GEMM|v2 MN|v3 [a-z]|v3, |v4|v5|v6|v7|v8|v9|v1[01]|other reading|wgmma|mma.sync|valid|FAIL"
done
# why the flash kernels run below their roofline (the largest gap above): Nsight Compute on one
# call of each (the second step's last forward, then its first backward: D, dK dV, dQ; a step
# launches 48 of them), their throughput against the
# peaks, occupancy and what the warps stall on
if command -v ncu >/dev/null; then
    timeout "$(( $(left) / 6 + 1 ))" ncu --kernel-name regex:flash_attention --launch-skip 59 --launch-count 4 \
        --section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis \
        ./build/cuda_BF16/train_gpt2_dp -e d12 -b 64 -t 1024 -x 2 -v 0 -s 0 > "$logs/gpu_flash_ncu.log" 2>&1
    echo "ncu of the flash kernels: exit $? ($logs/gpu_flash_ncu.log)"
    grep -E "flash_attention|Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Shared Memory|Stall" \
        "$logs/gpu_flash_ncu.log" | head -60
    # the one-kernel backward (LLMC_FLASH_BACKWARD=one_kernel) on one call of the second step:
    # whether its blocks' order keeps a head's q, dout and dq sums in L2 (its first version read
    # them from memory every tile: 5.3 GB a call) and how long its warps wait on loads
    LLMC_FLASH_BACKWARD=one_kernel timeout "$(( $(left) / 8 + 1 ))" ncu --kernel-name regex:backward_one_kernel \
        --launch-skip 12 --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis \
        --section WarpStateStats --metrics dram__bytes.sum,lts__t_sector_hit_rate.pct \
        ./build/cuda_BF16/train_gpt2_dp -e d12 -b 64 -t 1024 -x 2 -v 0 -s 0 > "$logs/gpu_one_kernel_ncu.log" 2>&1
    echo "ncu of the one-kernel backward: exit $? ($logs/gpu_one_kernel_ncu.log)"
    grep -E "Duration|DRAM Throughput|dram__bytes|hit_rate|L2 Hit Rate|Warp Cycles Per Issued|Compute \(SM\) Throughput" \
        "$logs/gpu_one_kernel_ncu.log" | head -12
fi
PYTHONUNBUFFERED=1 TEST_JOBS=${TEST_JOBS:-4} timeout "$(left)" python3 test/run_tests.py gpu 2>&1 | tee "$logs/gpu_tests.log"
# out-of-bounds accesses and shared-memory races that a numerical test can miss: two steps of a
# small model. API errors are not reported: NCCL probes for kernel images it was not built with
# (cudaFuncGetAttributes fails, harmlessly), and the trainer checks every CUDA call it makes itself.
# racecheck names cuBLAS's own split-K kernels too (nvjet_*); only this project's kernels count.
# The defaults with the wgmma flash kernels on, then FlashAttention-3's (TMA and mbarriers: a slot
# read before its load landed is a race only racecheck sees; the mma.sync ones were clean on 2026-11-26); d2 has
# GPT-2's vocabulary, so the split classifier's shared memory is used, and heads of 64, so the
# wgmma kernels run; T = 256 gives them four key tiles and both warpgroups of a block (at T = 64
# one tile and one warpgroup, the shape that hid their register bug).
if command -v compute-sanitizer >/dev/null; then
    for flash in wgmma fa3; do
        for tool in memcheck racecheck; do
            LLMC_FLASH=$flash timeout "$(( $(left) / 6 + 1 ))" compute-sanitizer --tool $tool --report-api-errors no \
                --print-limit 20 ./build/cuda_BF16/train_gpt2_dp -e d2 -b 2 -t 256 -x 2 -v 1 -m 1 -s 2 -g 8 \
                > "$logs/gpu_${tool}_$flash.log" 2>&1
            echo "compute-sanitizer $tool, LLMC_FLASH=$flash: exit $?"
            grep "=====" "$logs/gpu_${tool}_$flash.log" | head -40
        done
    done
fi
timeout "$(left)" ./dev/bench/bench_gpu.sh "${1:-10}" 2>&1 | tee "$logs/gpu_bench.log"
