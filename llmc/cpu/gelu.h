// GELU with the tanh approximation used by GPT-2 (Hendrycks & Gimpel 2016), on the CPU.
#ifndef LLMC_CPU_GELU_H
#define LLMC_CPU_GELU_H

#include "device.h"  // (kernel_times.h: the launchers time themselves with LLMC_KERNEL_TIMES=1)

#include <math.h>
#include "clones.h"
#include "vector_math.h"
#include "matmul.h"

#define GELU_SCALE 0.7978845608028654f  // sqrt(2 / pi)

// With u = sqrt(2/pi) (x + 0.044715 x^3), GELU is 0.5 x (1 + tanh u) = x s, s = 1 / (1 + e^(-2u)).
// The second form is the one computed: for x below about -4, 1 + tanh u cancels (tanh u =
// -0.9999...) and fp32 keeps only a few bits of it, while s has no cancellation (its error is that
// of u and of one exponential; below x = -8.4 it is clamped at 1.8e-35, see vector_math.h); and
// it costs one exponential, vectorized, in place of a call to tanhf per element.

// out (N) = GELU(inp)
CPU_CLONES static inline void gelu_forward(float* out, const float* inp, size_t N) {
    int kernel_span = kernel_time_begin("gelu forward", 0, 0);
    #pragma omp parallel for
    for (size_t i = 0; i < N; i++) {
        float x = inp[i];
        float u = GELU_SCALE * (x + 0.044715f * x * x * x);
        out[i] = x / (1.0f + exp_vectorizable(-2.0f * u));
    }
    kernel_time_end(kernel_span);
}

// dinp (N) = dout * GELU'(inp); dinp may be the same buffer as dout.
// GELU' = s + x s (1 - s) 2 du/dx, and 1 - s = e s with e = e^(-2u)
CPU_CLONES static inline void gelu_backward(float* dinp, const float* inp, const float* dout, size_t N) {
    int kernel_span = kernel_time_begin("gelu backward", 0, 0);
    #pragma omp parallel for
    for (size_t i = 0; i < N; i++) {
        float x = inp[i];
        float u = GELU_SCALE * (x + 0.044715f * x * x * x);
        float e = exp_vectorizable(-2.0f * u);
        float s = 1.0f / (1.0f + e);
        float du = GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] = dout[i] * (s + 2.0f * x * s * (e * s) * du);
    }
    kernel_time_end(kernel_span);
}

// The fc layer and its GELU (the CUDA backend can fuse the two into cuBLASLt's epilogues; here
// they are the matmul, then the elementwise pass):
// fch (N, OC) = inp (N, C) @ weight (OC, C)^T + bias, fch_gelu (N, OC) = GELU(fch)
static inline void matmul_forward_gelu(float* fch_gelu, float* fch, const float* inp, const float* weight,
                                       const float* bias, int N, int C, int OC) {
    matmul_forward(fch, inp, weight, bias, N, C, OC);
    gelu_forward(fch_gelu, fch, (size_t)N * OC);
}

// dfch (N, C) = (dout (N, OC) @ weight (OC, C)) * GELU'(fch (N, C))
static inline void matmul_backward_input_gelu(float* dfch, const float* dout, const float* weight, const float* fch,
                                              int N, int C, int OC) {
    matmul_backward_input(dfch, dout, weight, N, C, OC);
    gelu_backward(dfch, fch, dfch, (size_t)N * C);
}

#endif
