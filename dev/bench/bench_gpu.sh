#!/usr/bin/env bash
# GPU training throughput of GPT-2 124M (d12, random init) at T=1024: train_gpt2_dp in bf16 at
# B = 16, 32, 64 (tokens/s, MFU against the GPU's bf16 peak, peak memory), with flash attention
# and with the cuBLAS attention path, each beside the step time dev/bench/roofline.py predicts for
# this GPU (a lower bound: every kernel at its roofline), then the same model in PyTorch
# (test/reference.py's GPT2, eager and torch.compile) on the same GPU.
#   ./dev/bench/bench_gpu.sh [steps]
set -euo pipefail
cd "$(dirname "$0")/../.."
steps=${1:-10}
# a GPU first: without one there is nothing to time (the roofline alone: dev/bench/roofline.py)
gpu=$( (nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null || true) | head -n 1)
if [ -z "$gpu" ]; then
    echo "bench_gpu.sh needs an NVIDIA GPU (nvidia-smi found none); for the predicted step without one:"
    echo "  python3 dev/bench/roofline.py -e d12 -b 64 -t 1024"
    exit 1
fi
make -s build/cuda_BF16/train_gpt2_dp
echo "$gpu"
# the roofline's device, from the GPU's name (as llmc/cuda/device.cuh tells the parts apart)
case "$gpu" in
    *H100*PCIe*) roofline_device=h100-pcie ;;
    *H100*NVL*) roofline_device=h100-nvl ;;
    *H100*) roofline_device=h100-sxm ;;
    *H200*) roofline_device=h200 ;;
    *A100*) roofline_device=a100 ;;
    *) roofline_device="" ;;
esac
[ -n "$roofline_device" ] || echo "(no roofline prediction: dev/bench/roofline.py does not know this GPU)"
for attention in flash cublas; do
    for B in 16 32 64; do
        echo "train_gpt2_dp bf16 d12 B=$B T=1024, $attention attention"
        measured=$(LLMC_ATTENTION=$attention ./build/cuda_BF16/train_gpt2_dp -e d12 -b "$B" -t 1024 -x "$steps" -v 0 -s 0 \
            | grep -E "^average") || measured=""
        echo "${measured:-  (failed)}"
        if [ -n "$roofline_device" ]; then
            predicted=$(python3 dev/bench/roofline.py -e d12 -b "$B" -t 1024 -precision bf16 -attention "$attention" \
                -device "$roofline_device" -brief) || predicted="roofline: (failed)"
            # measured / predicted: how far the step is from every kernel at its roofline
            ms=$(sed -n 's/^average step time \([0-9.]*\) ms.*/\1/p' <<< "$measured")
            ratio=$(awk -v m="$ms" -v p="$predicted" 'BEGIN { split(p, f, " "); if (m != "" && f[2] + 0 > 0) printf ", measured / predicted %.2f", m / f[2] }')
            echo "$predicted$ratio"
        fi
    done
done
python3 dev/bench/bench_pytorch.py --batch 16 32 64 --steps "$steps"
