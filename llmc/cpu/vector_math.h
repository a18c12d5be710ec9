// Loops the compiler vectorizes without -ffast-math, for the CPU ops: an exponential in plain
// arithmetic, and reductions in LANES running sums added in a fixed order. One running sum is a
// chain of dependent adds that the compiler may not reorder, so it stays scalar; the lanes are
// independent, so they vectorize, and the order stays fixed: the same result on every run and
// at any thread count.
#ifndef LLMC_CPU_VECTOR_MATH_H
#define LLMC_CPU_VECTOR_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#define LANES 16

// e^x for any x, within 2 ulp, in plain arithmetic the compiler vectorizes (libm's expf is a call
// per element, which kept GELU at a fifth of memory speed). e^x = 2^n e^r with n = round(x / ln 2)
// and r = x - n ln 2 in [-0.35, 0.35]: ln 2 in two parts (0.693359375 has 9 bits, so n times it is
// exact), e^r by its Taylor series to r^7 (the rest, r^8 / 8!, is below 8e-9 of it), 2^n written
// straight into the exponent bits. x is clamped to [-87, 80]: e^x and 1 / (1 + e^x) stay normal
// floats (denormals are slow; GELU's 1 / (1 + e^(-2u)) is then 0 or 1 to within 2e-35 anyway).
// Measured over every float in [-87, 80]: at most 1.2 ulp (SSE2), 0.94 ulp (with FMA). NaN stays
// NaN (through p).
static inline float exp_vectorizable(float x) {
    x = x < -87.0f ? -87.0f : x > 80.0f ? 80.0f : x;  // (fminf and fmaxf would be calls)
    const float round_shift = 12582912.0f;  // 1.5 x 2^23: adding it rounds to an integer
    float n = (x * 1.4426950408889634f + round_shift) - round_shift;
    float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.0f + r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 +
              r * (1.0f / 720 + r * (1.0f / 5040)))))));
    uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
    float two_n;
    memcpy(&two_n, &bits, sizeof two_n);
    return p * two_n;
}

// a . b over n elements (attention's q . k was most of its time as one running sum)
static inline float dot_in_lanes(const float* a, const float* b, int n) {
    float lane[LANES] = {0};
    int i = 0;
    for (; i + LANES <= n; i += LANES) {
        for (int j = 0; j < LANES; j++) lane[j] += a[i + j] * b[i + j];
    }
    float s = 0.0f;
    for (; i < n; i++) s += a[i] * b[i];
    for (int j = 0; j < LANES; j++) s += lane[j];
    return s;
}

// y (n) = the sum over r < rows, in order, of w[r * w_stride] x_r, the rows x_r = x + r * x_stride:
// LANES elements of y at a time, held in registers over all the rows (summed into y in memory,
// each row's update waited for the last one's store: 37% of attention's forward)
static inline void weighted_sum_of_rows(float* y, const float* w, size_t w_stride, const float* x, size_t x_stride,
                                        int rows, int n) {
    int i = 0;
    for (; i + LANES <= n; i += LANES) {
        float acc[LANES] = {0};
        for (int r = 0; r < rows; r++) {
            const float* xr = x + r * x_stride + i;
            for (int j = 0; j < LANES; j++) acc[j] += w[r * w_stride] * xr[j];
        }
        memcpy(y + i, acc, sizeof acc);
    }
    for (; i < n; i++) {
        float acc = 0.0f;
        for (int r = 0; r < rows; r++) acc += w[r * w_stride] * x[r * x_stride + i];
        y[i] = acc;
    }
}

// the largest of x (n): lanes too, but max is exact, so any order gives the same result
static inline float max_in_lanes(const float* x, int n) {
    float lane[LANES];
    for (int j = 0; j < LANES; j++) lane[j] = -INFINITY;
    int i = 0;
    for (; i + LANES <= n; i += LANES) {
        for (int j = 0; j < LANES; j++) lane[j] = x[i + j] > lane[j] ? x[i + j] : lane[j];
    }
    float m = -INFINITY;
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    for (int j = 0; j < LANES; j++) m = lane[j] > m ? lane[j] : m;
    return m;
}

// sum of e^(x - shift) over x (n), x left as it is
static inline float sum_exp_in_lanes(const float* x, float shift, int n) {
    float lane[LANES] = {0};
    int i = 0;
    for (; i + LANES <= n; i += LANES) {
        for (int j = 0; j < LANES; j++) lane[j] += exp_vectorizable(x[i + j] - shift);
    }
    float s = 0.0f;
    for (; i < n; i++) s += exp_vectorizable(x[i] - shift);
    for (int j = 0; j < LANES; j++) s += lane[j];
    return s;
}

// x (n) = e^(x - shift) in place; returns their sum, added as sum_exp_in_lanes adds it
static inline float exp_in_place_sum_in_lanes(float* x, float shift, int n) {
    float lane[LANES] = {0};
    int i = 0;
    for (; i + LANES <= n; i += LANES) {
        for (int j = 0; j < LANES; j++) {
            x[i + j] = exp_vectorizable(x[i + j] - shift);
            lane[j] += x[i + j];
        }
    }
    float s = 0.0f;
    for (; i < n; i++) {
        x[i] = exp_vectorizable(x[i] - shift);
        s += x[i];
    }
    for (int j = 0; j < LANES; j++) s += lane[j];
    return s;
}

#endif
