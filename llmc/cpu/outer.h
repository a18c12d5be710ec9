// DiLoCo's outer step (train_gpt2_diloco.cu) on the CPU: the pseudo-gradient of a worker, the
// outer optimizer's Nesterov momentum step on the averaged one, and the workers starting again
// from the outer parameters. Element by element, fp32, except what crosses the link in bf16
// (-outer_dtype bf16): the pseudo-gradient rounded to bf16, and the workers' mean of it.
#ifndef LLMC_CPU_OUTER_H
#define LLMC_CPU_OUTER_H

#include <stddef.h>
#include "../precision.h"

// outer (n) = this worker's parameters, fp32 (master: the fp32 master weights when the
// parameters are kept in a lower precision, else NULL)
static inline void outer_from_params(float* outer, const float* params, const float* master, size_t n) {
    for (size_t i = 0; i < n; i++) outer[i] = master ? master[i] : params[i];
}

// delta (n) = outer - theta: how far this worker's parameters moved from the outer ones, with
// the sign of a gradient (the direction the outer optimizer steps against)
static inline void pseudo_gradient(float* delta, const float* outer, const float* params, const float* master, size_t n) {
    for (size_t i = 0; i < n; i++) delta[i] = outer[i] - (master ? master[i] : params[i]);
}

// the same rounded to bf16 for the link (-outer_dtype bf16): q (n) = bf16(outer - theta)
static inline void pseudo_gradient_bf16(bfloat16* q, const float* outer, const float* params, const float* master, size_t n) {
    for (size_t i = 0; i < n; i++) q[i] = bf16_from_float(outer[i] - (master ? master[i] : params[i]));
}

// The mean over W workers of one shard of n bf16 pseudo-gradient values, which this rank (worker
// `me`) owns: its own values in mine (n), the other workers' in others ((W - 1) x n, worker w's at
// slot w, or w - 1 past me). Summed in fp32 in worker order, divided by W, rounded to bf16 for
// the way back; written over mine (each element read before it is written)
static inline void outer_mean_bf16(bfloat16* mine, const bfloat16* others, int W, int me, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float sum = 0.0f;
        for (int w = 0; w < W; w++) sum += bf16_to_float(w == me ? mine[i] : others[(size_t)(w < me ? w : w - 1) * n + i]);
        mine[i] = bf16_from_float(sum / (float)W);
    }
}

// Nesterov momentum SGD on the averaged pseudo-gradient delta, as torch.optim.SGD(nesterov=True)
// writes it: momentum = mu momentum + delta, outer -= lr (delta + mu momentum). delta is fp32,
// or (delta NULL) the bf16 mean in delta_bf16
static inline void outer_nesterov_step(float* outer, float* momentum, const float* delta, const bfloat16* delta_bf16,
                                       size_t n, float lr, float mu) {
    for (size_t i = 0; i < n; i++) {
        float g = delta ? delta[i] : bf16_to_float(delta_bf16[i]);
        momentum[i] = mu * momentum[i] + g;
        outer[i] -= lr * (g + mu * momentum[i]);
    }
}

// every worker starts again from the outer parameters: params (and master) = outer
static inline void outer_to_params(float* params, float* master, const float* outer, size_t n) {
    for (size_t i = 0; i < n; i++) {
        params[i] = outer[i];
        if (master) master[i] = outer[i];
    }
}

#endif
