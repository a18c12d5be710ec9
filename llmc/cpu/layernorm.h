// LayerNorm (Ba, Kiros & Hinton 2016) and the residual add, on the CPU.
#ifndef LLMC_CPU_LAYERNORM_H
#define LLMC_CPU_LAYERNORM_H

#include "device.h"  // (kernel_times.h: the launchers time themselves with LLMC_KERNEL_TIMES=1)

#include <math.h>
#include "clones.h"

#define LAYERNORM_EPS 1e-5f

// one row: out (C) = (x - mean) * rstd * weight + bias
static inline void layernorm_row(float* out, float* mean, float* rstd, const float* x,
                                 const float* weight, const float* bias, int C) {
    float m = 0.0f;
    for (int c = 0; c < C; c++) m += x[c];
    m /= (float)C;
    float v = 0.0f;
    for (int c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
    v /= (float)C;
    float s = 1.0f / sqrtf(v + LAYERNORM_EPS);
    for (int c = 0; c < C; c++) out[c] = (x[c] - m) * s * weight[c] + bias[c];
    *mean = m;
    *rstd = s;
}

// out (N, C) = layernorm of each row of inp; saves mean (N) and rstd (N) for backward
CPU_CLONES static inline void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                     const float* weight, const float* bias, int N, int C) {
    int kernel_span = kernel_time_begin("layernorm forward", 0, 0);
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        layernorm_row(out + (size_t)n * C, mean + n, rstd + n, inp + (size_t)n * C, weight, bias, C);
    }
    kernel_time_end(kernel_span);
}

// dinp (N, C) += gradient through the normalisation; dweight, dbias (C) += their gradients.
// dinp accumulates because it is the residual stream's gradient, which also gets the skip path.
CPU_CLONES static inline void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                               const float* inp, const float* weight, const float* mean,
                               const float* rstd, int N, int C) {
    int kernel_span = kernel_time_begin("layernorm backward", 0, 0);
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* x = inp + (size_t)n * C;
        const float* dy = dout + (size_t)n * C;
        float* dx = dinp + (size_t)n * C;
        float m = mean[n], s = rstd[n];
        // dx = s * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * weight
        float g_mean = 0.0f, gx_mean = 0.0f;
        for (int c = 0; c < C; c++) {
            float g = dy[c] * weight[c];
            g_mean += g;
            gx_mean += g * (x[c] - m) * s;
        }
        g_mean /= (float)C;
        gx_mean /= (float)C;
        for (int c = 0; c < C; c++) {
            float xhat = (x[c] - m) * s;
            dx[c] += s * (dy[c] * weight[c] - g_mean - xhat * gx_mean);
        }
    }
    // parameter gradients: threads split the channels, each sums its rows in order
    #pragma omp parallel for
    for (int c = 0; c < C; c++) {
        float dw = 0.0f, db = 0.0f;
        for (int n = 0; n < N; n++) {
            float xhat = (inp[(size_t)n * C + c] - mean[n]) * rstd[n];
            dw += dout[(size_t)n * C + c] * xhat;
            db += dout[(size_t)n * C + c];
        }
        dweight[c] += dw;
        dbias[c] += db;
    }
    kernel_time_end(kernel_span);
}

// out (N, C) = a + b: a residual connection alone, where no LayerNorm follows on this rank (the
// last layer of a pipeline stage: the next LayerNorm is on the next stage)
static inline void residual_forward(float* out, const float* a, const float* b, int N, int C) {
    int kernel_span = kernel_time_begin("residual forward", 0, 0);
    size_t n = (size_t)N * C;
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
    kernel_time_end(kernel_span);
}

// residual (N, C) = a + b, then out = layernorm(residual): the residual connection followed by
// the next LayerNorm, in one pass over each row. The residual add's backward is the identity on
// both inputs, so the trainer needs no backward op for it: its gradient flows on in place.
CPU_CLONES static inline void fused_residual_layernorm_forward(float* residual, float* out, float* mean,
                                                    float* rstd, const float* a, const float* b,
                                                    const float* weight, const float* bias, int N,
                                                    int C) {
    int kernel_span = kernel_time_begin("residual + layernorm forward", 0, 0);
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        size_t row = (size_t)n * C;
        for (int c = 0; c < C; c++) residual[row + c] = a[row + c] + b[row + c];
        layernorm_row(out + row, mean + n, rstd + n, residual + row, weight, bias, C);
    }
    kernel_time_end(kernel_span);
}

#endif
