// Mixture-of-Experts on the CPU: the row moves of a layer's dispatch and combine (llmc/moe.h
// decides which row goes where; these move them). Rows are C floats; an index of -1 is a slot
// that capacity dropped.
#ifndef LLMC_CPU_MOE_H
#define LLMC_CPU_MOE_H

#include "../kernel_times.h"

// dst row i = src row index[i], for n rows of C (a dispatch: tokens into send order; a regroup:
// rows from source-rank order into expert order, or back)
static inline void moe_gather_rows(float* dst, const float* src, const int* index, int n, int C) {
    int kernel_span = kernel_time_begin("moe: gather rows", 0, 0);
    #pragma omp parallel for
    for (int i = 0; i < n; i++) memcpy(dst + (size_t)i * C, src + (size_t)index[i] * C, (size_t)C * sizeof(float));
    kernel_time_end(kernel_span);
}

// each token's slots into the send order, weighted or not: rows[row[t, j]] = h[t] (scale 0) or
// gate[t, j] * h[t] (scale 1: the backward's gradient of an expert's output)
static inline void moe_dispatch(float* rows, const float* h, const int* row, const float* gate, int N, int k, int C,
                                int weighted) {
    int kernel_span = kernel_time_begin("moe: dispatch", 0, 0);
    #pragma omp parallel for
    for (int t = 0; t < N; t++) {
        for (int j = 0; j < k; j++) {
            int r = row[(size_t)t * k + j];
            if (r < 0) continue;
            float g = weighted ? gate[(size_t)t * k + j] : 1.0f;
            for (int c = 0; c < C; c++) rows[(size_t)r * C + c] = g * h[(size_t)t * C + c];
        }
    }
    kernel_time_end(kernel_span);
}

// out[t] = sum over the token's kept slots, in slot order, of gate[t, j] * rows[row[t, j]] (the
// combine; weighted 0: the plain sum, the gradient at h from the experts' input gradients)
static inline void moe_combine(float* out, const float* rows, const int* row, const float* gate, int N, int k, int C,
                               int weighted) {
    int kernel_span = kernel_time_begin("moe: combine", 0, 0);
    #pragma omp parallel for
    for (int t = 0; t < N; t++) {
        float* o = out + (size_t)t * C;
        for (int c = 0; c < C; c++) o[c] = 0.0f;
        for (int j = 0; j < k; j++) {
            int r = row[(size_t)t * k + j];
            if (r < 0) continue;
            float g = weighted ? gate[(size_t)t * k + j] : 1.0f;
            for (int c = 0; c < C; c++) o[c] += g * rows[(size_t)r * C + c];
        }
    }
    kernel_time_end(kernel_span);
}

// dgate[t, j] = dout[t] . rows[row[t, j]]: how the loss moves with each gate (0 for a dropped slot)
static inline void moe_gate_grads(float* dgate, const float* dout, const float* rows, const int* row, int N, int k,
                                  int C) {
    int kernel_span = kernel_time_begin("moe: gate gradients", 0, 0);
    #pragma omp parallel for
    for (int t = 0; t < N; t++) {
        for (int j = 0; j < k; j++) {
            int r = row[(size_t)t * k + j];
            float dot = 0.0f;
            for (int c = 0; r >= 0 && c < C; c++) dot += dout[(size_t)t * C + c] * rows[(size_t)r * C + c];
            dgate[(size_t)t * k + j] = dot;
        }
    }
    kernel_time_end(kernel_span);
}

#endif
