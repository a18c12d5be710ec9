// GELU with the tanh approximation used by GPT-2 (Hendrycks & Gimpel 2016), on the CPU.
#ifndef LLMC_CPU_GELU_H
#define LLMC_CPU_GELU_H

#include "device.h"  // (kernel_times.h: the launchers time themselves with LLMC_KERNEL_TIMES=1)

#include <math.h>
#include "clones.h"
#include "vector_math.h"

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

#endif
