// floatX: the type of parameters, gradients and activations. The CUDA backend trains in BF16 by
// default (FP32 master weights and AdamW state stay in float) or in FP32 with PRECISION=FP32;
// the CPU backend is always FP32.
#ifndef LLMC_PRECISION_H
#define LLMC_PRECISION_H

#include <stdint.h>
#include <string.h>

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

#endif
