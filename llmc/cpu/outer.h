// DiLoCo's outer step (train_gpt2_diloco.cu) on the CPU: the pseudo-gradient of a worker, the
// outer optimizer's Nesterov momentum step on the averaged one, and the workers starting again
// from the outer parameters. Element by element, fp32, except what crosses the link in bf16
// (-outer_dtype bf16): the pseudo-gradient rounded to bf16, and the workers' mean of it.
#ifndef LLMC_CPU_OUTER_H
#define LLMC_CPU_OUTER_H

#include "device.h"  // (kernel_times.h: the launchers time themselves with LLMC_KERNEL_TIMES=1)

#include <stddef.h>
#include "../precision.h"

// outer (n) = this worker's parameters, fp32 (master: the fp32 master weights when the
// parameters are kept in a lower precision, else NULL)
static inline void outer_from_params(float* outer, const float* params, const float* master, size_t n) {
    int kernel_span = kernel_time_begin("diloco: outer weights from the parameters", 0, 0);
    for (size_t i = 0; i < n; i++) outer[i] = master ? master[i] : params[i];
    kernel_time_end(kernel_span);
}

// delta (n) = outer - theta: how far this worker's parameters moved from the outer ones, with
// the sign of a gradient (the direction the outer optimizer steps against)
static inline void pseudo_gradient(float* delta, const float* outer, const float* params, const float* master, size_t n) {
    int kernel_span = kernel_time_begin("diloco: pseudo-gradient", 0, 0);
    for (size_t i = 0; i < n; i++) delta[i] = outer[i] - (master ? master[i] : params[i]);
    kernel_time_end(kernel_span);
}

// the same rounded to bf16 for the link (-outer_dtype bf16): q (n) = bf16(outer - theta)
static inline void pseudo_gradient_bf16(bfloat16* q, const float* outer, const float* params, const float* master, size_t n) {
    int kernel_span = kernel_time_begin("diloco: pseudo-gradient (bf16)", 0, 0);
    for (size_t i = 0; i < n; i++) q[i] = bf16_from_float(outer[i] - (master ? master[i] : params[i]));
    kernel_time_end(kernel_span);
}

// The mean over W workers of one shard of n bf16 pseudo-gradient values, which this rank (worker
// `me`) owns: its own values in mine (n), the other workers' in others ((W - 1) x n, worker w's at
// slot w, or w - 1 past me). Summed in fp32 in worker order, divided by W, rounded to bf16 for
// the way back; written over mine (each element read before it is written)
static inline void outer_mean_bf16(bfloat16* mine, const bfloat16* others, int W, int me, size_t n) {
    int kernel_span = kernel_time_begin("diloco: mean of bf16 pseudo-gradients", 0, 0);
    for (size_t i = 0; i < n; i++) {
        float sum = 0.0f;
        for (int w = 0; w < W; w++) sum += bf16_to_float(w == me ? mine[i] : others[(size_t)(w < me ? w : w - 1) * n + i]);
        mine[i] = bf16_from_float(sum / (float)W);
    }
    kernel_time_end(kernel_span);
}

// Nesterov momentum SGD on the averaged pseudo-gradient delta, as torch.optim.SGD(nesterov=True)
// writes it: momentum = mu momentum + delta, outer -= lr (delta + mu momentum). delta is fp32,
// or (delta NULL) the bf16 mean in delta_bf16
static inline void outer_nesterov_step(float* outer, float* momentum, const float* delta, const bfloat16* delta_bf16,
                                       size_t n, float lr, float mu) {
    int kernel_span = kernel_time_begin("diloco: outer Nesterov step", 0, 0);
    for (size_t i = 0; i < n; i++) {
        float g = delta ? delta[i] : bf16_to_float(delta_bf16[i]);
        momentum[i] = mu * momentum[i] + g;
        outer[i] -= lr * (g + mu * momentum[i]);
    }
    kernel_time_end(kernel_span);
}

// every worker starts again from the outer parameters, merged with its own (-alpha, Streaming
// DiLoCo's merge): params (and master) = alpha theta_local + (1 - alpha) outer, theta_local the
// worker's weights now (its fp32 master weights where it has them); alpha = 0: outer exactly
static inline void outer_to_params(float* params, float* master, const float* outer, size_t n, float alpha) {
    int kernel_span = kernel_time_begin("diloco: parameters from the outer weights", 0, 0);
    for (size_t i = 0; i < n; i++) {
        float local = master ? master[i] : params[i], merged = alpha * local + (1.0f - alpha) * outer[i];
        params[i] = merged;
        if (master) master[i] = merged;
    }
    kernel_time_end(kernel_span);
}

#endif
