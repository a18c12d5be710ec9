#!/usr/bin/env bash
# GPU training throughput of GPT-2 124M (d12, random init) at T=1024: train_gpt2_dp in bf16 at
# B = 16, 32, 64 (tokens/s, MFU against the GPU's bf16 peak, peak memory), with flash attention
# and with the cuBLAS attention path, then the same model in PyTorch (test/reference.py's GPT2,
# eager and torch.compile) on the same GPU.
#   ./dev/bench/bench_gpu.sh [steps]
set -euo pipefail
cd "$(dirname "$0")/../.."
steps=${1:-10}
make -s build/cuda_BF16/train_gpt2_dp
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
for attention in flash cublas; do
    for B in 16 32 64; do
        echo "train_gpt2_dp bf16 d12 B=$B T=1024, $attention attention"
        LLMC_ATTENTION=$attention ./build/cuda_BF16/train_gpt2_dp -e d12 -b "$B" -t 1024 -x "$steps" -v 0 -s 0 \
            | grep -E "^average" || echo "  (failed)"
    done
done
python3 dev/bench/bench_pytorch.py --batch 16 32 64 --steps "$steps"
