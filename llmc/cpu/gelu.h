// GELU with the tanh approximation used by GPT-2 (Hendrycks & Gimpel 2016), on the CPU.
#ifndef LLMC_CPU_GELU_H
#define LLMC_CPU_GELU_H

#include <math.h>
#include "clones.h"

#define GELU_SCALE 0.7978845608028654f  // sqrt(2 / pi)

// out (N) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
CPU_CLONES static inline void gelu_forward(float* out, const float* inp, size_t N) {
    #pragma omp parallel for
    for (size_t i = 0; i < N; i++) {
        float x = inp[i];
        out[i] = 0.5f * x * (1.0f + tanhf(GELU_SCALE * (x + 0.044715f * x * x * x)));
    }
}

// dinp (N) = dout * gelu'(inp); dinp may be the same buffer as dout
CPU_CLONES static inline void gelu_backward(float* dinp, const float* inp, const float* dout, size_t N) {
    #pragma omp parallel for
    for (size_t i = 0; i < N; i++) {
        float x = inp[i];
        float u = GELU_SCALE * (x + 0.044715f * x * x * x);
        float th = tanhf(u);
        float du = GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        float grad = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du;
        dinp[i] = dout[i] * grad;
    }
}

#endif
