// floatX: the type of parameters, gradients and activations. The CUDA backend trains in BF16 by
// default (FP32 master weights and AdamW state stay in float) or in FP32 with PRECISION=FP32;
// the CPU backend is always FP32.
#ifndef LLMC_PRECISION_H
#define LLMC_PRECISION_H

#include <stdint.h>
#include <string.h>
#include <math.h>
#include <stddef.h>

#if defined(__CUDACC__) && !defined(ENABLE_FP32)
#include <cuda_bf16.h>
typedef __nv_bfloat16 floatX;
#define PRECISION_NAME "bf16"
#define FLOATX_IS_FLOAT 0
#else
typedef float floatX;
#define PRECISION_NAME "fp32"
#define FLOATX_IS_FLOAT 1
#endif

// bf16: what crosses a slow link in low precision (DiLoCo's -outer_dtype bf16) in builds of
// either precision: CUDA's type, or on the CPU the upper 16 bits of an fp32 (llmc/cpu/outer.h
// rounds to them)
#ifdef __CUDACC__
#include <cuda_bf16.h>
typedef __nv_bfloat16 bfloat16;
#else
typedef uint16_t bfloat16;
#endif

// bf16's bits on the host: the upper half of an fp32, 8 bits of exponent and 7 of mantissa.
// Rounding to nearest, ties to even (as PyTorch's .to(torch.bfloat16) and CUDA's conversion):
// add 0x7fff plus the lowest kept bit, then cut; a NaN stays a NaN (quieted) rather than rounding
// into infinity
static inline uint16_t bf16_from_float(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static inline float bf16_to_float(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}


// ---- the link's low-bit codes (DiLoCo's -outer_dtype int8 and e3m0), shared by both backends
// and the host: a value crosses the link as a code of `bits` bits beside a scale, the largest |x|
// of the piece it belongs to (an fp32), and both ends compute in fp32, so that every rank, and the
// reference (test/reference.py's link_round), gets the same bits:
//   int8 (8 bits): x in steps of scale / 127: (x / scale) 127, rounded to nearest, ties to even
//     (rintf), as a two's complement byte c in [-127, 127], read back as (c / 127) scale. x / scale
//     lies in [-1, 1] whatever the scale (a denormal one included, where scale / 127 would round
//     to 0), and +-127 reads back as the scale itself, so nothing overflows; the error is at most
//     half a step (in the normal range).
//   e3m0 (4 bits: a sign, a 3-bit exponent e, no mantissa): 0 when e = 0, else
//     +-scale 2^(e - 7), the powers of two from scale / 64 to scale. |x| rounds to the nearest level
//     in log space: e >= k (k = 2..7) once |x| >= scale 2^(k - 7.5), the geometric mean of the two
//     levels (each threshold one fp32 product of scale and the fp32 constant); between 0 and the
//     smallest level, where log space has no middle, to the nearer in value: e >= 1 once
//     |x| >= scale 2^-7. Above scale 2^-6.5 the error is at most a factor sqrt(2) (-29% .. +41%);
//     from scale / 128 up to there a value rounds to the smallest level, scale / 64 (up to twice
//     itself), and below scale / 128 to zero.
// Rounding to nearest, not stochastic: a run repeats bit for bit (a resume included) and the
// reference can round exactly as the trainer does. Stochastic rounding would be unbiased on
// average, but needs random bits that every rank and the reference agree on; the bias of nearest
// is small where the values spread over many levels, and the experiment measures what it costs.
#if defined(__CUDACC__)
#define LINK_HOST_DEVICE __host__ __device__
#else
#define LINK_HOST_DEVICE
#endif
#define LINK_E3M0_BITS 4
#define LINK_INT8_BITS 8

LINK_HOST_DEVICE static inline unsigned link_code(float x, float scale, int bits) {
    if (!(scale > 0.0f)) return 0;  // (a piece of zeros: scale 0, every code 0)
    if (bits == LINK_INT8_BITS) {
        float q = rintf((x / scale) * 127.0f);
        q = q > 127.0f ? 127.0f : q < -127.0f ? -127.0f : q;
        return (unsigned)(int)q & 0xffu;
    }
    float a = fabsf(x);
    unsigned e = a >= scale * 0.0078125f;  // 2^-7, halfway between 0 and the smallest level
    for (unsigned k = 2; k <= 7; k++) e += a >= scale * (1.41421356f * (float)(1u << k) / 256.0f);  // 2^(k - 7.5)
    return e == 0 ? 0u : (x < 0.0f ? 8u : 0u) | e;
}
LINK_HOST_DEVICE static inline float link_value(unsigned code, float scale, int bits) {
    if (bits == LINK_INT8_BITS) return ((float)(int)(signed char)(code & 0xffu) / 127.0f) * scale;
    unsigned e = code & 7u;
    if (e == 0) return 0.0f;
    float v = scale * ((float)(1u << e) * 0.0078125f);  // scale 2^(e - 7): a power of two, exact
    return code & 8u ? -v : v;
}

// A message on the link: 16-bit words, a piece's scale (fp32, two words) at scale_at and its n
// codes from codes_at on, k = 16 / bits to a word, code j in bits [(j % k) bits, (j % k + 1) bits)
// of word j / k. Value j of the piece as it crossed:
LINK_HOST_DEVICE static inline float link_read(const uint16_t* message, size_t scale_at, size_t codes_at, size_t j,
                                               int bits) {
    float scale;
    memcpy(&scale, message + scale_at, 4);
    unsigned k = 16u / (unsigned)bits, code = (message[codes_at + j / k] >> ((j % k) * (unsigned)bits)) & ((1u << bits) - 1u);
    return link_value(code, scale, bits);
}

// The mean over W workers of value j of a piece, as the owner of its shard takes it: its own
// message `mine`, the other workers' in `others` (worker w's at slot w, or w - 1 past me, stride
// words apart), each value as it crossed, summed in fp32 in worker order and divided by W. (On
// the GPU the sum is __fadd_rn, which nvcc never fuses with int8's product into an FMA: every
// value rounded once, as on the CPU, whose portable build has no FMA, and in the reference.)
LINK_HOST_DEVICE static inline float link_mean(const uint16_t* mine, const uint16_t* others, size_t stride, size_t scale_at,
                                               size_t codes_at, int W, int me, size_t j, int bits) {
    float sum = 0.0f;
    for (int w = 0; w < W; w++) {
        const uint16_t* message = w == me ? mine : others + (size_t)(w < me ? w : w - 1) * stride;
#ifdef __CUDA_ARCH__
        sum = __fadd_rn(sum, link_read(message, scale_at, codes_at, j, bits));
#else
        sum += link_read(message, scale_at, codes_at, j, bits);
#endif
    }
    return sum / (float)W;
}

#endif
