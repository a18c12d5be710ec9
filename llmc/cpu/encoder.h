// Token + position embedding on the CPU.
#ifndef LLMC_CPU_ENCODER_H
#define LLMC_CPU_ENCODER_H

#include "device.h"  // (kernel_times.h: the launchers time themselves with LLMC_KERNEL_TIMES=1)

// out (B, T, C) = wte[inp[b, t]] (Vp, C) + wpe[t] (maxT, C). A token id of -1 reads a row of
// zeros and wpe may be NULL: a vocabulary-parallel embedding passes -1 for the tokens whose rows
// live on another rank, and adds wpe on one rank only (train_gpt2_tp.cu).
static inline void encoder_forward(float* out, const int* inp, const float* wte, const float* wpe, int B,
                            int T, int C) {
    int kernel_span = kernel_time_begin("encoder forward", 0, 0);
    #pragma omp parallel for collapse(2)
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            float* o = out + ((size_t)b * T + t) * C;
            int token = inp[b * T + t];
            const float* tok = token < 0 ? NULL : wte + (size_t)token * C;
            const float* pos = wpe ? wpe + (size_t)t * C : NULL;
            for (int c = 0; c < C; c++) o[c] = (tok ? tok[c] : 0.0f) + (pos ? pos[c] : 0.0f);
        }
    }
    kernel_time_end(kernel_span);
}

// dwte (Vp, C) and dwpe (maxT, C) += dout (B, T, C) scattered by token and position. Threads
// split the channels, so rows hit by repeated tokens are summed in one fixed order. Tokens of -1
// (rows on another rank) add nothing to dwte.
static inline void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* inp, int B,
                             int T, int C) {
    int kernel_span = kernel_time_begin("encoder backward", 0, 0);
    #pragma omp parallel for
    for (int c = 0; c < C; c++) {
        for (int b = 0; b < B; b++) {
            for (int t = 0; t < T; t++) {
                float d = dout[((size_t)b * T + t) * C + c];
                int token = inp[b * T + t];
                if (token >= 0) dwte[(size_t)token * C + c] += d;
                dwpe[(size_t)t * C + c] += d;
            }
        }
    }
    kernel_time_end(kernel_span);
}

#endif
