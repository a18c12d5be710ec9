// Attention in blocks of keys, for context parallelism (train_gpt2_cp.cu) on the CPU: this rank's
// queries against one rank's keys and values at a time, the partial results merged by their
// log-sum-exp (Milakov and Gimelshein 2018; the merge flash attention and ring attention use).
// Positions come from the two ranks' chunks (llmc/cp_layout.h), both split alike (chunks of the
// same length): a query chunk against a key chunk is whole (every key visible), diagonal (keys up
// to the query's own position) or masked, skipped without a single score computed.
#ifndef LLMC_CPU_RING_ATTENTION_H
#define LLMC_CPU_RING_ATTENTION_H

#include "device.h"  // (kernel_times.h: the launchers time themselves with LLMC_KERNEL_TIMES=1)

#include <math.h>
#include <string.h>
#include "../cp_layout.h"

// kv (B, T, 2C): the keys and values of qkv (B, T, 3C), the part of it that travels
static inline void kv_pack(float* kv, const float* qkv, int B, int T, int C) {
    int kernel_span = kernel_time_begin("ring attention: pack k,v", 0, 0);
    for (size_t i = 0; i < (size_t)B * T; i++) memcpy(kv + i * 2 * C, qkv + i * 3 * C + C, 2 * (size_t)C * sizeof(float));
    kernel_time_end(kernel_span);
}

// o (B, Tq, C) and lse (B, NH, Tq), fp32: this rank's queries' attention output so far and the
// log of its softmax denominator, merged with their attention to the block of keys and values kv
// (B, Tk, 2C) at positions k: for each query row the block's own output o_b and log-sum-exp
// lse_b, then lse' = log(e^lse + e^lse_b), o' = o e^(lse - lse') + o_b e^(lse_b - lse'). The
// first block (first = 1) is written, not merged: it must be the rank's own, where every query
// sees at least itself. scratch (B, NH, Tq) fp32 is for the CUDA kernels (the merged lse waits
// there until every reader of the old one is done); the CPU merges in place.
static inline void attention_block_forward(float* o, float* lse, float* scratch, const float* qkv, const float* kv,
                                           CpChunks q, CpChunks k, int B, int C, int NH, int first) {
    int kernel_span = kernel_time_begin("ring attention: block forward", 0, 0);
    (void)scratch;
    int hs = C / NH, Tq = q.n * q.len, Tk = k.n * k.len;
    float scale = 1.0f / sqrtf((float)hs);
    #pragma omp parallel for collapse(3)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            for (int t = 0; t < Tq; t++) {
                const float* qt = qkv + ((size_t)b * Tq + t) * 3 * C + h * hs;
                float m = -INFINITY, sum = 0.0f, ob[RING_MAX_HEAD];  // (the trainer checks hs)
                for (int i = 0; i < hs; i++) ob[i] = 0.0f;
                // one pass over the keys the causal mask lets it see: the running max rescales the sum
                for (int j = 0; j < k.n; j++) for (int t2 = j * k.len; t2 < j * k.len + cp_keys_seen(q, t, k, j); t2++) {
                    const float* kt = kv + ((size_t)b * Tk + t2) * 2 * C + h * hs;
                    const float* vt = kt + C;
                    float s = 0.0f;
                    for (int i = 0; i < hs; i++) s += qt[i] * kt[i];
                    s *= scale;
                    float m_new = s > m ? s : m, rescale = expf(m - m_new), p = expf(s - m_new);
                    sum = sum * rescale + p;
                    for (int i = 0; i < hs; i++) ob[i] = ob[i] * rescale + p * vt[i];
                    m = m_new;
                }
                if (sum == 0.0f) continue;  // every key of the block after this query
                float* l = lse + ((size_t)b * NH + h) * Tq + t;
                float* ot = o + ((size_t)b * Tq + t) * C + h * hs;
                float lse_b = m + logf(sum);
                float lse_new = first ? lse_b : fmaxf(*l, lse_b) + log1pf(expf(-fabsf(*l - lse_b)));
                float keep = first ? 0.0f : expf(*l - lse_new), add = expf(lse_b - lse_new) / sum;
                for (int i = 0; i < hs; i++) ot[i] = (first ? 0.0f : ot[i] * keep) + ob[i] * add;
                *l = lse_new;
            }
        }
    }
    kernel_time_end(kernel_span);
}

// D (B, NH, Tq) = the sum over each head's channels of datty * atty: the softmax backward's
// sum_j p_j dp_j, from the output alone (flash attention's trick: no probabilities kept)
static inline void attention_block_backward_prepare(float* D, const float* datty, const float* atty, int B, int Tq,
                                                    int C, int NH) {
    int kernel_span = kernel_time_begin("ring attention: backward's D", 0, 0);
    int hs = C / NH;
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            for (int t = 0; t < Tq; t++) {
                const float* dy = datty + ((size_t)b * Tq + t) * C + h * hs;
                const float* y = atty + ((size_t)b * Tq + t) * C + h * hs;
                float s = 0.0f;
                for (int i = 0; i < hs; i++) s += dy[i] * y[i];
                D[((size_t)b * NH + h) * Tq + t] = s;
            }
        }
    }
    kernel_time_end(kernel_span);
}

// The gradients through one block: dq (B, Tq, C) += and dkv (B, Tk, 2C) += (fp32), from the
// output's gradient datty (B, Tq, C), the final lse and D of this rank's queries, and the block
// kv. Each probability is recomputed, p = e^(s - lse); then dv += p dy, dp = dy . v,
// ds = p (dp - D) / sqrt(hs), dq += ds k, dk += ds q. Threads own whole (batch, head) pairs, so
// their writes never overlap.
static inline void attention_block_backward(float* dq, float* dkv, const float* datty, const float* lse,
                                            const float* D, const float* qkv, const float* kv, CpChunks q,
                                            CpChunks k, int B, int C, int NH) {
    int kernel_span = kernel_time_begin("ring attention: block backward", 0, 0);
    int hs = C / NH, Tq = q.n * q.len, Tk = k.n * k.len;
    float scale = 1.0f / sqrtf((float)hs);
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            for (int t = 0; t < Tq; t++) {
                const float* qt = qkv + ((size_t)b * Tq + t) * 3 * C + h * hs;
                const float* dy = datty + ((size_t)b * Tq + t) * C + h * hs;
                float* dqt = dq + ((size_t)b * Tq + t) * C + h * hs;
                size_t row = ((size_t)b * NH + h) * Tq + t;
                for (int j = 0; j < k.n; j++) for (int t2 = j * k.len; t2 < j * k.len + cp_keys_seen(q, t, k, j); t2++) {
                    const float* kt = kv + ((size_t)b * Tk + t2) * 2 * C + h * hs;
                    const float* vt = kt + C;
                    float* dkt = dkv + ((size_t)b * Tk + t2) * 2 * C + h * hs;
                    float* dvt = dkt + C;
                    float s = 0.0f, dp = 0.0f;
                    for (int i = 0; i < hs; i++) {
                        s += qt[i] * kt[i];
                        dp += dy[i] * vt[i];
                    }
                    float p = expf(s * scale - lse[row]), ds = p * (dp - D[row]) * scale;
                    for (int i = 0; i < hs; i++) {
                        dvt[i] += p * dy[i];
                        dqt[i] += ds * kt[i];
                        dkt[i] += ds * qt[i];
                    }
                }
            }
        }
    }
    kernel_time_end(kernel_span);
}

// dqkv (B, T, 3C) = dq (B, T, C) beside dkv (B, T, 2C): the gradient at qkv, from fp32 sums
static inline void attention_block_grads(float* dqkv, const float* dq, const float* dkv, int B, int T, int C) {
    int kernel_span = kernel_time_begin("ring attention: dq, dk, dv to dqkv", 0, 0);
    for (size_t i = 0; i < (size_t)B * T; i++) {
        memcpy(dqkv + i * 3 * C, dq + i * C, (size_t)C * sizeof(float));
        memcpy(dqkv + i * 3 * C + C, dkv + i * 2 * C, 2 * (size_t)C * sizeof(float));
    }
    kernel_time_end(kernel_span);
}

// atty (B, T, C) = o, the merged fp32 output, in the activations' precision
static inline void attention_block_output(float* atty, const float* o, size_t n) {
    int kernel_span = kernel_time_begin("ring attention: output", 0, 0);
    memcpy(atty, o, n * sizeof(float));
    kernel_time_end(kernel_span);
}

#endif
