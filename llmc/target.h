// The machine a rank's memory is counted for. Besides the model, the layout and the batch, a
// rank's device memory depends on how the build stores things: the width of floatX, what
// attention keeps for its backward pass, and the CUDA kernels' own buffers. A trainer counts for
// its own build (build_target in model.h); dev/memory_planner, a CPU program, fills a target in
// for the machine it plans for, a CUDA bf16 run on an H100 say, and every size function of
// model.h, stage.h and memory_plan.h then answers for that machine.
//
// The CUDA kernels' buffer sizes live here rather than in llmc/cuda/, so that a CPU build can
// count them too; the kernels allocate exactly these.
#ifndef LLMC_TARGET_H
#define LLMC_TARGET_H

#include <stddef.h>

typedef struct {
    int cuda;   // the CUDA backend: cuBLASLt's workspace and the kernels' scratch buffers
    int X;      // bytes of floatX: 4 (fp32) or 2 (bf16, trained from fp32 master weights)
    int flash;  // attention keeps flash attention's (B, NH, T) fp32 row statistics for its
                // backward pass, rather than the (B, NH, T, T) probabilities in floatX
    int flash_one_kernel;  // LLMC_FLASH_BACKWARD=one_kernel: its dq sums' scratch (below)
} DeviceTarget;

#define CUBLASLT_WORKSPACE_BYTES (32u << 20)  // cuBLASLt's workspace: 32 MiB, as llm.c gives it
#define BIAS_ROWS_PER_BLOCK 512               // rows summed by one block of a bias gradient
#define LN_ROWS_PER_BLOCK 256                 // rows summed by one block of a LayerNorm's dweight
#define NORM_BLOCKS 1024                      // blocks of the gradient norm's first pass

// the head sizes the flash kernels are built for, in bf16 only (llmc/cuda/flash_attention.cuh)
static inline int flash_attention_supports(int X, int hs) { return X == 2 && (hs == 16 || hs == 32 || hs == 64); }

// what attention_forward keeps for attention_backward, per layer, on a rank with NH heads
static inline uint64_t attention_state_size(DeviceTarget t, int B, int T, int NH) {
    return t.flash ? (uint64_t)B * NH * T * sizeof(float) : (uint64_t)B * NH * T * T * t.X;
}

// the bias gradient's scratch: a partial column sum (OC) per block of BIAS_ROWS_PER_BLOCK rows
static inline uint64_t bias_scratch_bytes(uint64_t N, int OC) {
    return (N + BIAS_ROWS_PER_BLOCK - 1) / BIAS_ROWS_PER_BLOCK * OC * sizeof(float);
}
// a LayerNorm's weight and bias gradients: partial sums (2 C) per block of LN_ROWS_PER_BLOCK rows
static inline uint64_t layernorm_scratch_bytes(uint64_t N, int C) {
    return (N + LN_ROWS_PER_BLOCK - 1) / LN_ROWS_PER_BLOCK * 2 * C * sizeof(float);
}
// the encoder backward's buckets handed to the GPU: tokens, starts and positions (3 BT + 1 ints)
static inline uint64_t encoder_scratch_bytes(uint64_t BT) { return (3 * BT + 1) * sizeof(int); }
// the gradient norm's partial sums, one per block
static inline uint64_t norm_scratch_bytes(void) { return NORM_BLOCKS * sizeof(float); }
// the flash backward's D = rowsum(dO * O): one float per (batch, head, query)
static inline uint64_t flash_scratch_bytes(int B, int T, int NH) { return (uint64_t)B * NH * T * sizeof(float); }
// the one-kernel flash backward's (LLMC_FLASH_BACKWARD=one_kernel): dq's sums (B, NH, T, hs) in
// fp32, and its counters, one a head and query tile of 64 (FLASH_TILE) and the tickets' one
static inline uint64_t flash_one_kernel_scratch_bytes(int B, int T, int NH, int hs) {
    return (uint64_t)B * NH * T * hs * sizeof(float) + ((uint64_t)B * NH * ((T + 63) / 64) + 1) * sizeof(int);
}
// the cuBLAS attention path: q, k, v and one more (B, NH, T, hs) tensor, and a (B, NH, T, T) score
// matrix, in floatX of X bytes
static inline uint64_t attention_cublas_scratch_bytes(int B, int T, int C, int NH, int X) {
    return (4 * (uint64_t)B * T * C + (uint64_t)B * NH * T * T) * X;
}

#endif
