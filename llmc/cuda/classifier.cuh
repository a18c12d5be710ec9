// Softmax + cross-entropy fused with its gradient on CUDA: one block per row of logits, an online
// softmax (running max and sum in one pass, Milakov & Gimelshein 2018), then the gradient is
// written over the logits, 16 bytes per access. The probabilities are never stored.
#ifndef LLMC_CUDA_CLASSIFIER_CUH
#define LLMC_CUDA_CLASSIFIER_CUH

#include "device.cuh"

// block-wide reduction of (max, sum of exp relative to max) pairs
__device__ inline void online_softmax_merge(float* m, float* s, float m2, float s2) {
    float m_new = fmaxf(*m, m2);
    *s = (*m == -INFINITY ? 0.0f : *s * expf(*m - m_new)) + (m2 == -INFINITY ? 0.0f : s2 * expf(m2 - m_new));
    *m = m_new;
}

// every thread's (max, sum) merged over the block, warps through shuffles, then the warps'
// results through shared memory; every thread ends with the block's (max, sum)
__device__ inline void block_online_softmax_merge(float* m, float* s) {
    __shared__ float shared_m[32], shared_s[32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int o = 16; o > 0; o /= 2) {
        float m2 = __shfl_xor_sync(0xffffffff, *m, o), s2 = __shfl_xor_sync(0xffffffff, *s, o);
        online_softmax_merge(m, s, m2, s2);
    }
    if (lane == 0) { shared_m[warp] = *m; shared_s[warp] = *s; }
    __syncthreads();
    *m = -INFINITY;
    *s = 0.0f;
    for (int w = 0; w < (int)blockDim.x / 32; w++) online_softmax_merge(m, s, shared_m[w], shared_s[w]);
}

// block n: row n of logits (N, Vp). Memory-bound (the row is read twice and written once), so
// every access moves 16 bytes: Vp is a multiple of 128, so a row is whole packs, and columns
// from V on are padding. Each pack is folded into the running (max, sum) with one merge.
__global__ void fused_classifier_kernel(floatX* logits, float* losses, const int* targets,
                                        float dloss, int V, int Vp) {
    int n = blockIdx.x;
    floatX* row = logits + (size_t)n * Vp;
    float m = -INFINITY, s = 0.0f;
    for (int v0 = threadIdx.x * PACK16; v0 < V; v0 += blockDim.x * PACK16) {
        Pack16 x = load16(row + v0);
        float pack_max = -INFINITY, pack_sum = 0.0f;
        for (int k = 0; k < PACK16; k++) {
            if (v0 + k < V) pack_max = fmaxf(pack_max, (float)x.v[k]);
        }
        for (int k = 0; k < PACK16; k++) {
            if (v0 + k < V) pack_sum += expf((float)x.v[k] - pack_max);
        }
        online_softmax_merge(&m, &s, pack_max, pack_sum);
    }
    block_online_softmax_merge(&m, &s);
    int target = targets[n];
    if (threadIdx.x == 0) losses[n] = logf(s) - ((float)row[target] - m);
    __syncthreads();  // every thread has read row[target] before any overwrites it
    if (dloss == 0.0f) return;
    float inv = 1.0f / s;
    for (int v0 = threadIdx.x * PACK16; v0 < Vp; v0 += blockDim.x * PACK16) {
        Pack16 x = load16(row + v0), grad;
        for (int k = 0; k < PACK16; k++) {
            int v = v0 + k;
            grad.v[k] = (floatX)(v < V ? (expf((float)x.v[k] - m) * inv - (v == target ? 1.0f : 0.0f)) * dloss : 0.0f);
        }
        store16(row + v0, grad);
    }
}

// logits (N, Vp), real tokens in the first V columns. losses (N) = -log softmax[target]; when
// dloss != 0 each row becomes dloss * (softmax - onehot(target)), zero over the padding.
static inline void fused_classifier(floatX* logits, float* losses, const int* targets, float dloss,
                                    int N, int V, int Vp) {
    check_whole_packs("fused_classifier", "Vp", (size_t)Vp);
    fused_classifier_kernel<<<N, 1024>>>(logits, losses, targets, dloss, V, Vp);
    cudaCheckLaunch();
}

#endif
