// Softmax + cross-entropy fused with its gradient on CUDA: one block per row of logits, an online
// softmax (running max and sum in one pass, Milakov & Gimelshein 2018), then the gradient is
// written over the logits. The probabilities are never stored.
#ifndef LLMC_CUDA_CLASSIFIER_CUH
#define LLMC_CUDA_CLASSIFIER_CUH

#include "device.cuh"

// block-wide reduction of (max, sum of exp relative to max) pairs
__device__ inline void online_softmax_merge(float* m, float* s, float m2, float s2) {
    float m_new = fmaxf(*m, m2);
    *s = (*m == -INFINITY ? 0.0f : *s * expf(*m - m_new)) + (m2 == -INFINITY ? 0.0f : s2 * expf(m2 - m_new));
    *m = m_new;
}

__global__ void fused_classifier_kernel(floatX* logits, float* losses, const int* targets,
                                        float dloss, int V, int Vp) {
    __shared__ float shared_m[32], shared_s[32];
    int n = blockIdx.x, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    floatX* row = logits + (size_t)n * Vp;
    float m = -INFINITY, s = 0.0f;
    for (int v = threadIdx.x; v < V; v += blockDim.x) online_softmax_merge(&m, &s, (float)row[v], 1.0f);
    for (int o = 16; o > 0; o /= 2) {
        float m2 = __shfl_xor_sync(0xffffffff, m, o), s2 = __shfl_xor_sync(0xffffffff, s, o);
        online_softmax_merge(&m, &s, m2, s2);
    }
    if (lane == 0) { shared_m[warp] = m; shared_s[warp] = s; }
    __syncthreads();
    m = -INFINITY;
    s = 0.0f;
    for (int w = 0; w < (int)blockDim.x / 32; w++) online_softmax_merge(&m, &s, shared_m[w], shared_s[w]);
    int target = targets[n];
    if (threadIdx.x == 0) losses[n] = logf(s) - ((float)row[target] - m);
    __syncthreads();  // every thread has read row[target] before any overwrites it
    if (dloss == 0.0f) return;
    float inv = 1.0f / s;
    for (int v = threadIdx.x; v < Vp; v += blockDim.x) {
        float grad = v < V ? (expf((float)row[v] - m) * inv - (v == target ? 1.0f : 0.0f)) * dloss : 0.0f;
        row[v] = (floatX)grad;
    }
}

// logits (N, Vp), real tokens in the first V columns. losses (N) = -log softmax[target]; when
// dloss != 0 each row becomes dloss * (softmax - onehot(target)), zero over the padding.
static inline void fused_classifier(floatX* logits, float* losses, const int* targets, float dloss,
                                    int N, int V, int Vp) {
    fused_classifier_kernel<<<N, 1024>>>(logits, losses, targets, dloss, V, Vp);
    cudaCheckLaunch();
}

#endif
