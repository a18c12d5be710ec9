// LayerNorm (Ba, Kiros & Hinton 2016) and the residual add, on the CPU.
#ifndef LLMC_CPU_LAYERNORM_H
#define LLMC_CPU_LAYERNORM_H

#include <math.h>

#define LAYERNORM_EPS 1e-5f

// out (N, C) = (inp - mean) * rstd * weight + bias; saves mean (N) and rstd (N) for backward
static inline void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                              const float* weight, const float* bias, int N, int C) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* x = inp + (size_t)n * C;
        float m = 0.0f;
        for (int c = 0; c < C; c++) m += x[c];
        m /= (float)C;
        float v = 0.0f;
        for (int c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
        v /= (float)C;
        float s = 1.0f / sqrtf(v + LAYERNORM_EPS);
        float* o = out + (size_t)n * C;
        for (int c = 0; c < C; c++) o[c] = (x[c] - m) * s * weight[c] + bias[c];
        mean[n] = m;
        rstd[n] = s;
    }
}

// dinp (N, C) += gradient through the normalisation; dweight, dbias (C) += their gradients.
// dinp accumulates because it is the residual stream's gradient, which also gets the skip path.
static inline void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                               const float* inp, const float* weight, const float* mean,
                               const float* rstd, int N, int C) {
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
}

// out (N) = a + b: the residual connection. Its backward is the identity on both inputs, so the
// trainer adds no op for it: the residual gradient flows on in the same buffer.
static inline void residual_forward(float* out, const float* a, const float* b, size_t N) {
    #pragma omp parallel for
    for (size_t i = 0; i < N; i++) out[i] = a[i] + b[i];
}

#endif
