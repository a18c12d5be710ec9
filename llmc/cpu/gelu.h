// GELU with the tanh approximation used by GPT-2 (Hendrycks & Gimpel 2016), on the CPU.
#ifndef LLMC_CPU_GELU_H
#define LLMC_CPU_GELU_H

#include <math.h>
#include <stdint.h>
#include <string.h>
#include "clones.h"

#define GELU_SCALE 0.7978845608028654f  // sqrt(2 / pi)

// e^x for any x, within 2 ulp, in plain arithmetic the compiler vectorizes (libm's expf is a call
// per element, which kept GELU at a fifth of memory speed). e^x = 2^n e^r with n = round(x / ln 2)
// and r = x - n ln 2 in [-0.35, 0.35]: ln 2 in two parts (0.693359375 has 9 bits, so n times it is
// exact), e^r by its Taylor series to r^7 (the rest, r^8 / 8!, is below 5e-9 of it), 2^n written
// straight into the exponent bits. x is clamped to [-87, 80]: e^x and 1 / (1 + e^x) stay normal
// floats (denormals are slow, and GELU's s below is then 0 or 1 to within 2e-35 anyway).
static inline float exp_vectorizable(float x) {
    x = x < -87.0f ? -87.0f : x > 80.0f ? 80.0f : x;  // (fminf and fmaxf would be calls)
    const float round_shift = 12582912.0f;  // 1.5 x 2^23: adding it rounds to an integer
    float n = (x * 1.4426950408889634f + round_shift) - round_shift;
    float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.0f + r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 +
              r * (1.0f / 720 + r * (1.0f / 5040)))))));
    int32_t bits = ((int32_t)n + 127) << 23;
    float two_n;
    memcpy(&two_n, &bits, sizeof two_n);
    return p * two_n;
}

// With u = sqrt(2/pi) (x + 0.044715 x^3), GELU is 0.5 x (1 + tanh u) = x s, s = 1 / (1 + e^(-2u)).
// The second form is the one computed: for x below about -4, 1 + tanh u cancels (tanh u =
// -0.9999...) and fp32 keeps only a few bits of it, while s keeps full precision for every x; and
// it costs one exponential, vectorized, in place of a call to tanhf per element.

// out (N) = GELU(inp)
CPU_CLONES static inline void gelu_forward(float* out, const float* inp, size_t N) {
    #pragma omp parallel for
    for (size_t i = 0; i < N; i++) {
        float x = inp[i];
        float u = GELU_SCALE * (x + 0.044715f * x * x * x);
        out[i] = x / (1.0f + exp_vectorizable(-2.0f * u));
    }
}

// dinp (N) = dout * GELU'(inp); dinp may be the same buffer as dout.
// GELU' = s + x s (1 - s) 2 du/dx, and 1 - s = e s with e = e^(-2u)
CPU_CLONES static inline void gelu_backward(float* dinp, const float* inp, const float* dout, size_t N) {
    #pragma omp parallel for
    for (size_t i = 0; i < N; i++) {
        float x = inp[i];
        float u = GELU_SCALE * (x + 0.044715f * x * x * x);
        float e = exp_vectorizable(-2.0f * u);
        float s = 1.0f / (1.0f + e);
        float du = GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] = dout[i] * (s + 2.0f * x * s * (e * s) * du);
    }
}

#endif
