// Causal multi-head self-attention on the CPU (Vaswani et al. 2017), softmax(q k^T / sqrt(hs)) v.
#ifndef LLMC_CPU_ATTENTION_H
#define LLMC_CPU_ATTENTION_H

#include "device.h"  // (kernel_times.h: the launchers time themselves with LLMC_KERNEL_TIMES=1)

#include <math.h>
#include <string.h>
#include "clones.h"
#include "vector_math.h"

// What attention_forward keeps for attention_backward (per layer) is the softmax probabilities
// att (B, NH, T, T), zero above the diagonal; the CUDA backend's flash path keeps less
// (attention_state_size, llmc/target.h).

// qkv (B, T, 3C) holds q, k, v side by side, each split into NH heads of size hs = C / NH.
// out (B, T, C) = attention output; state: the probabilities att, for the backward pass.
CPU_CLONES static inline void attention_forward(float* out, void* state, const float* qkv, int B, int T, int C,
                              int NH) {
    int kernel_span = kernel_time_begin("attention forward", 0, 0);
    float* att = (float*)state;
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    #pragma omp parallel for collapse(3)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            for (int t = 0; t < T; t++) {
                const float* q = qkv + ((size_t)b * T + t) * 3 * C + h * hs;
                float* p = att + (((size_t)b * NH + h) * T + t) * T;
                float maxval = -INFINITY;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float* k = qkv + ((size_t)b * T + t2) * 3 * C + C + h * hs;
                    float s = dot_in_lanes(q, k, hs) * scale;
                    p[t2] = s;
                    if (s > maxval) maxval = s;
                }
                float sum = exp_in_place_sum_in_lanes(p, maxval, t + 1);
                for (int t2 = 0; t2 <= t; t2++) p[t2] /= sum;
                for (int t2 = t + 1; t2 < T; t2++) p[t2] = 0.0f;
                // o = p v: the rows of v (3C apart) weighted by p, summed over t2 <= t
                const float* v = qkv + (size_t)b * T * 3 * C + 2 * C + h * hs;
                weighted_sum_of_rows(out + ((size_t)b * T + t) * C + h * hs, p, 1, v, 3 * C, t + 1, hs);
            }
        }
    }
    kernel_time_end(kernel_span);
}

// dqkv (B, T, 3C) = gradient of the attention output dout (B, T, C) (overwritten). out, the
// forward's output, is used by the CUDA flash path only. Threads own whole (batch, head) pairs,
// so their writes into dqkv never overlap. Two passes over a pair's T x T scores, each summing a
// gradient row in registers (weighted_sum_of_rows) rather than adding into rows of dqkv in memory
// at every (t, t2): by rows t, dq; then by columns t2, dk and dv.
CPU_CLONES static inline void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                               const void* state, int B, int T, int C, int NH) {
    int kernel_span = kernel_time_begin("attention backward", 0, 0);
    const float* att = (const float*)state;
    (void)out;
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    #pragma omp parallel
    {
        float* dscore = (float*)malloc_check((size_t)T * T * sizeof(float));  // this pair's ds, row t over t2 <= t
        #pragma omp for collapse(2)
        for (int b = 0; b < B; b++) {
            for (int h = 0; h < NH; h++) {
                const float* p_bh = att + ((size_t)b * NH + h) * T * T;
                const float* q0 = qkv + (size_t)b * T * 3 * C + h * hs;  // row t of q, k, v: + t 3C (+ C, + 2C)
                const float* k0 = q0 + C;
                const float* v0 = q0 + 2 * C;
                const float* dy0 = dout + (size_t)b * T * C + h * hs;   // row t: + t C
                float* dq0 = dqkv + (size_t)b * T * 3 * C + h * hs;
                // 1. by rows t: through out = p v, dp = dy . v; through the softmax,
                //    ds = p (dp - sum p dp) scale (scale: s = q . k scale); then dq = ds k
                for (int t = 0; t < T; t++) {
                    const float* p = p_bh + (size_t)t * T;
                    const float* dy = dy0 + (size_t)t * C;
                    float* ds = dscore + (size_t)t * T;
                    float dot = 0.0f;  // sum over t2 of p dp
                    for (int t2 = 0; t2 <= t; t2++) {
                        ds[t2] = dot_in_lanes(dy, v0 + (size_t)t2 * 3 * C, hs);
                        dot += p[t2] * ds[t2];
                    }
                    for (int t2 = 0; t2 <= t; t2++) ds[t2] = p[t2] * (ds[t2] - dot) * scale;
                    weighted_sum_of_rows(dq0 + (size_t)t * 3 * C, ds, 1, k0, 3 * C, t + 1, hs);
                }
                // 2. by columns t2, over the rows t >= t2 that saw it: dv = p^T dy, dk = ds^T q
                for (int t2 = 0; t2 < T; t2++) {
                    float* dk = dq0 + (size_t)t2 * 3 * C + C;
                    weighted_sum_of_rows(dk + C, p_bh + (size_t)t2 * T + t2, T, dy0 + (size_t)t2 * C, C, T - t2, hs);
                    weighted_sum_of_rows(dk, dscore + (size_t)t2 * T + t2, T, q0 + (size_t)t2 * 3 * C, 3 * C, T - t2, hs);
                }
            }
        }
        free(dscore);
    }
    kernel_time_end(kernel_span);
}

#endif
