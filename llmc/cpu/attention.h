// Causal multi-head self-attention on the CPU (Vaswani et al. 2017), softmax(q k^T / sqrt(hs)) v.
#ifndef LLMC_CPU_ATTENTION_H
#define LLMC_CPU_ATTENTION_H

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
                float* o = out + ((size_t)b * T + t) * C + h * hs;
                for (int i = 0; i < hs; i++) o[i] = 0.0f;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float* v = qkv + ((size_t)b * T + t2) * 3 * C + 2 * C + h * hs;
                    for (int i = 0; i < hs; i++) o[i] += p[t2] * v[i];
                }
            }
        }
    }
}

// dqkv (B, T, 3C) = gradient of the attention output dout (B, T, C) (overwritten). out, the
// forward's output, is used by the CUDA flash path only. Threads own whole (batch, head) pairs,
// so their writes into dqkv never overlap.
CPU_CLONES static inline void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                               const void* state, int B, int T, int C, int NH) {
    const float* att = (const float*)state;
    (void)out;
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            float* dscore = (float*)malloc_check((size_t)T * sizeof(float));
            for (int t = 0; t < T; t++) {
                float* dq = dqkv + ((size_t)b * T + t) * 3 * C + h * hs;
                memset(dq, 0, (size_t)hs * sizeof(float));
                memset(dq + C, 0, (size_t)hs * sizeof(float));
                memset(dq + 2 * C, 0, (size_t)hs * sizeof(float));
            }
            for (int t = 0; t < T; t++) {
                const float* p = att + (((size_t)b * NH + h) * T + t) * T;
                const float* dy = dout + ((size_t)b * T + t) * C + h * hs;
                const float* q = qkv + ((size_t)b * T + t) * 3 * C + h * hs;
                float* dq = dqkv + ((size_t)b * T + t) * 3 * C + h * hs;
                // through out = p v: dp = dy . v, dv += p dy
                float dot = 0.0f;  // sum over t2 of p * dp, for the softmax backward
                for (int t2 = 0; t2 <= t; t2++) {
                    const float* v = qkv + ((size_t)b * T + t2) * 3 * C + 2 * C + h * hs;
                    float* dv = dqkv + ((size_t)b * T + t2) * 3 * C + 2 * C + h * hs;
                    float dp = dot_in_lanes(dy, v, hs);
                    for (int i = 0; i < hs; i++) dv[i] += p[t2] * dy[i];
                    dscore[t2] = dp;
                    dot += p[t2] * dp;
                }
                // through the softmax: ds = p (dp - sum p dp); then through s = q k scale
                for (int t2 = 0; t2 <= t; t2++) {
                    float ds = p[t2] * (dscore[t2] - dot) * scale;
                    const float* k = qkv + ((size_t)b * T + t2) * 3 * C + C + h * hs;
                    float* dk = dqkv + ((size_t)b * T + t2) * 3 * C + C + h * hs;
                    for (int i = 0; i < hs; i++) {
                        dq[i] += ds * k[i];
                        dk[i] += ds * q[i];
                    }
                }
            }
            free(dscore);
        }
    }
}

#endif
