// AdamW (Loshchilov & Hutter 2019) and the global gradient norm, on the CPU.
#ifndef LLMC_CPU_ADAMW_H
#define LLMC_CPU_ADAMW_H

#include "device.h"  // (kernel_times.h: the launchers time themselves with LLMC_KERNEL_TIMES=1)

#include <math.h>
#include "clones.h"

// One AdamW step on n parameters, the same arithmetic as torch.optim.AdamW: decoupled weight
// decay, then bias-corrected moments. grad_scale multiplies the gradient first (clipping).
// master: fp32 master weights when the parameters are kept in lower precision, else NULL.
// seed, first_index: for stochastic rounding to a lower precision; fp32 parameters need none.
CPU_CLONES static inline void adamw_update(float* params, float* master, const float* grads, float* m,
                                float* v, size_t n, float lr, float beta1, float beta2, float eps,
                                float weight_decay, int t, float grad_scale, unsigned int seed,
                                size_t first_index) {
    int kernel_span = kernel_time_begin("adamw", 0, 0);
    (void)seed, (void)first_index;
    float correction1 = 1.0f - powf(beta1, (float)t);
    float correction2 = 1.0f - powf(beta2, (float)t);
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        float g = grads[i] * grad_scale;
        float mi = beta1 * m[i] + (1.0f - beta1) * g;
        float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        float p = (master ? master[i] : params[i]) * (1.0f - lr * weight_decay);
        p -= lr * (mi / correction1) / (sqrtf(vi / correction2) + eps);
        if (master) master[i] = p;
        params[i] = p;
    }
    kernel_time_end(kernel_span);
}

// sum of squares of grads (n), in fixed chunks summed in order: the same result for any
// number of threads, which keeps training bit-reproducible. Within a chunk, 8 running sums
// (one per vector lane) let the compiler vectorize without reordering any addition. The lane
// sums are double: 8192 squares summed in float lose about 1e-5 of the total, which shows in
// the logged norm; in double the loss is ~1e-13 and the result is the float nearest the norm.
#define NORM_CHUNK 65536
#define NORM_LANES 8
CPU_CLONES static inline float global_norm_squared(const float* grads, size_t n) {
    int kernel_span = kernel_time_begin("gradient norm", 0, 0);
    size_t chunks = (n + NORM_CHUNK - 1) / NORM_CHUNK;
    double* partial = (double*)malloc_check((chunks ? chunks : 1) * sizeof(double));
    #pragma omp parallel for
    for (size_t c = 0; c < chunks; c++) {
        size_t begin = c * NORM_CHUNK, end = (c + 1) * NORM_CHUNK < n ? (c + 1) * NORM_CHUNK : n;
        double lane[NORM_LANES] = {0};
        size_t i = begin;
        for (; i + NORM_LANES <= end; i += NORM_LANES) {
            for (int j = 0; j < NORM_LANES; j++) lane[j] += (double)grads[i + j] * grads[i + j];
        }
        double s = 0.0;
        for (; i < end; i++) s += (double)grads[i] * grads[i];
        for (int j = 0; j < NORM_LANES; j++) s += lane[j];
        partial[c] = s;
    }
    double total = 0.0;
    for (size_t c = 0; c < chunks; c++) total += partial[c];
    free(partial);
    kernel_time_end(kernel_span);
    return (float)total;
}

#endif
