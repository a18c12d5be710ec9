// DiLoCo's outer step (train_gpt2_diloco.cu) on the CPU: the pseudo-gradient of a worker, the
// outer optimizer's Nesterov momentum step on the averaged one, and the workers starting again
// from the outer parameters. Element by element (OpenMP threads over the elements; a scale, the
// largest of its values, is the same in any order, so every thread count gives the same bits),
// fp32, except what crosses the link in bf16 (-outer_dtype bf16: the pseudo-gradient rounded to
// bf16, and the workers' mean of it) or as int8 / e3m0 codes with a scale a piece (-outer_dtype
// int8, e3m0; the codes: llmc/precision.h).
#ifndef LLMC_CPU_OUTER_H
#define LLMC_CPU_OUTER_H

#include "device.h"  // (kernel_times.h: the launchers time themselves with LLMC_KERNEL_TIMES=1)

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "../precision.h"

// outer (n) = this worker's parameters, fp32 (master: the fp32 master weights when the
// parameters are kept in a lower precision, else NULL)
static inline void outer_from_params(float* outer, const float* params, const float* master, size_t n) {
    int kernel_span = kernel_time_begin("diloco: outer weights from the parameters", 0, 0);
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) outer[i] = master ? master[i] : params[i];
    kernel_time_end(kernel_span);
}

// delta (n) = outer - theta: how far this worker's parameters moved from the outer ones, with
// the sign of a gradient (the direction the outer optimizer steps against)
static inline void pseudo_gradient(float* delta, const float* outer, const float* params, const float* master, size_t n) {
    int kernel_span = kernel_time_begin("diloco: pseudo-gradient", 0, 0);
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) delta[i] = outer[i] - (master ? master[i] : params[i]);
    kernel_time_end(kernel_span);
}

// the same rounded to bf16 for the link (-outer_dtype bf16): q (n) = bf16(outer - theta)
static inline void pseudo_gradient_bf16(bfloat16* q, const float* outer, const float* params, const float* master, size_t n) {
    int kernel_span = kernel_time_begin("diloco: pseudo-gradient (bf16)", 0, 0);
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) q[i] = bf16_from_float(outer[i] - (master ? master[i] : params[i]));
    kernel_time_end(kernel_span);
}

// The mean over W workers of one shard of n bf16 pseudo-gradient values, which this rank (worker
// `me`) owns: its own values in mine (n), the other workers' in others ((W - 1) x n, worker w's at
// slot w, or w - 1 past me). Summed in fp32 in worker order, divided by W, rounded to bf16 for
// the way back; written over mine (each element read before it is written)
static inline void outer_mean_bf16(bfloat16* mine, const bfloat16* others, int W, int me, size_t n) {
    int kernel_span = kernel_time_begin("diloco: mean of bf16 pseudo-gradients", 0, 0);
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        float sum = 0.0f;
        for (int w = 0; w < W; w++) sum += bf16_to_float(w == me ? mine[i] : others[(size_t)(w < me ? w : w - 1) * n + i]);
        mine[i] = bf16_from_float(sum / (float)W);
    }
    kernel_time_end(kernel_span);
}

// Nesterov momentum SGD on the averaged pseudo-gradient delta, as torch.optim.SGD(nesterov=True)
// writes it: momentum = mu momentum + delta, outer -= lr (delta + mu momentum). delta is fp32,
// or (delta NULL) the bf16 mean in delta_bf16
static inline void outer_nesterov_step(float* outer, float* momentum, const float* delta, const bfloat16* delta_bf16,
                                       size_t n, float lr, float mu) {
    int kernel_span = kernel_time_begin("diloco: outer Nesterov step", 0, 0);
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        float g = delta ? delta[i] : bf16_to_float(delta_bf16[i]);
        momentum[i] = mu * momentum[i] + g;
        outer[i] -= lr * (g + mu * momentum[i]);
    }
    kernel_time_end(kernel_span);
}

// every worker starts again from the outer parameters, merged with its own (-alpha, Streaming
// DiLoCo's merge): params (and master) = alpha theta_local + (1 - alpha) outer, theta_local the
// worker's weights now (its fp32 master weights where it has them); alpha = 0: outer exactly
static inline void outer_to_params(float* params, float* master, const float* outer, size_t n, float alpha) {
    int kernel_span = kernel_time_begin("diloco: parameters from the outer weights", 0, 0);
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        float local = master ? master[i] : params[i], merged = alpha * local + (1.0f - alpha) * outer[i];
        params[i] = merged;
        if (master) master[i] = merged;
    }
    kernel_time_end(kernel_span);
}

// ---- -outer_dtype int8 / e3m0: a piece of the pseudo-gradient (n values, one tensor of one
// layer within one shard of the exchange, llmc/precision.h's codes) as the link carries it

// the bits of |x|, which order as |x| does (a NaN above infinity): the largest of a piece's is
// its scale, and a NaN or an infinity anywhere shows in it
static inline uint32_t abs_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u & 0x7fffffffu;
}

// a worker's first pass: scale = the largest |outer - theta| of the piece
static inline void link_scale(float* scale, const float* outer, const float* params, const float* master, size_t n) {
    int kernel_span = kernel_time_begin("diloco: link scale (largest |pseudo-gradient|)", 0, 0);
    uint32_t largest = 0;
    #pragma omp parallel for reduction(max : largest)
    for (size_t i = 0; i < n; i++) {
        uint32_t b = abs_bits(outer[i] - (master ? master[i] : params[i]));
        largest = b > largest ? b : largest;
    }
    memcpy(scale, &largest, 4);
    kernel_time_end(kernel_span);
}

// its second: the codes of outer - theta in steps of the scale, 16 / bits to a word
static inline void link_quantize(uint16_t* codes, const float* scale, const float* outer, const float* params,
                                 const float* master, size_t n, int bits) {
    int kernel_span = kernel_time_begin("diloco: link codes of the pseudo-gradient", 0, 0);
    size_t k = 16 / (size_t)bits;
    #pragma omp parallel for
    for (size_t word = 0; word < (n + k - 1) / k; word++) {
        unsigned packed = 0;
        for (size_t j = 0, i = word * k; j < k && i < n; j++, i++) {
            packed |= link_code(outer[i] - (master ? master[i] : params[i]), *scale, bits) << (j * (size_t)bits);
        }
        codes[word] = (uint16_t)packed;
    }
    kernel_time_end(kernel_span);
}

// The owner of a shard, for each of its pieces: the workers' mean (llmc/precision.h's link_mean:
// its own message, the others' stride words apart, the piece's scale and codes at the same places
// in each), coded again for the way back. Two passes, as a worker's: the mean's scale into
// mean_scale, then the codes written over the owner's own (each word read before it is written;
// its old scale, still read, is replaced by mean_scale afterwards)
static inline void link_mean_scale(float* mean_scale, const uint16_t* mine, const uint16_t* others, size_t stride,
                                   size_t scale_at, size_t codes_at, int W, int me, size_t n, int bits) {
    int kernel_span = kernel_time_begin("diloco: link scale of the workers' mean", 0, 0);
    uint32_t largest = 0;
    #pragma omp parallel for reduction(max : largest)
    for (size_t i = 0; i < n; i++) {
        uint32_t b = abs_bits(link_mean(mine, others, stride, scale_at, codes_at, W, me, i, bits));
        largest = b > largest ? b : largest;
    }
    memcpy(mean_scale, &largest, 4);
    kernel_time_end(kernel_span);
}
static inline void link_mean_quantize(uint16_t* mine, const uint16_t* others, size_t stride, size_t scale_at,
                                      size_t codes_at, const float* mean_scale, int W, int me, size_t n, int bits) {
    int kernel_span = kernel_time_begin("diloco: link codes of the workers' mean", 0, 0);
    size_t k = 16 / (size_t)bits;
    #pragma omp parallel for
    for (size_t word = 0; word < (n + k - 1) / k; word++) {
        unsigned packed = 0;
        for (size_t j = 0, i = word * k; j < k && i < n; j++, i++) {
            packed |= link_code(link_mean(mine, others, stride, scale_at, codes_at, W, me, i, bits), *mean_scale, bits)
                      << (j * (size_t)bits);
        }
        mine[codes_at + word] = (uint16_t)packed;
    }
    kernel_time_end(kernel_span);
}

// Nesterov momentum SGD, as outer_nesterov_step, on the mean as it came back: the piece's values
// in message (llmc/precision.h's link_read)
static inline void outer_nesterov_step_link(float* outer, float* momentum, const uint16_t* message, size_t scale_at,
                                            size_t codes_at, size_t n, int bits, float lr, float mu) {
    int kernel_span = kernel_time_begin("diloco: outer Nesterov step", 0, 0);
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) {
        float g = link_read(message, scale_at, codes_at, i, bits);
        momentum[i] = mu * momentum[i] + g;
        outer[i] -= lr * (g + mu * momentum[i]);
    }
    kernel_time_end(kernel_span);
}

#endif
