// cuda_emu: bfloat16 as CUDA defines it: the upper 16 bits of an IEEE float. Conversions from
// float round to nearest, ties to even (NaN stays NaN); arithmetic goes through float.
#ifndef CUDA_EMU_BF16_H
#define CUDA_EMU_BF16_H

#include <stdint.h>
#include <string.h>

struct __nv_bfloat16 {
    uint16_t bits;
    __nv_bfloat16() = default;
    __nv_bfloat16(float f) {
        uint32_t u;
        memcpy(&u, &f, 4);
        if ((u & 0x7fffffffu) > 0x7f800000u) bits = (uint16_t)((u >> 16) | 0x40);  // quiet NaN
        else bits = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
    __nv_bfloat16(double d) : __nv_bfloat16((float)d) {}
    __nv_bfloat16(int i) : __nv_bfloat16((float)i) {}
    operator float() const {
        uint32_t u = (uint32_t)bits << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
};

static inline __nv_bfloat16 __float2bfloat16_rz(float f) {  // truncation: round toward zero
    uint32_t u;
    memcpy(&u, &f, 4);
    __nv_bfloat16 b;
    b.bits = (uint16_t)(u >> 16);
    return b;
}

#endif
