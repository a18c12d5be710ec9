// DiLoCo's outer step (train_gpt2_diloco.cu) on CUDA: the same element-wise steps as
// llmc/cpu/outer.h (read that file first), a thread per element, fp32 but for the bf16 that
// crosses the link (bfloat16: CUDA's __nv_bfloat16, rounded to nearest even); the parameters
// themselves are floatX, rounded to nearest from the fp32 outer ones.
#ifndef LLMC_CUDA_OUTER_CUH
#define LLMC_CUDA_OUTER_CUH

#include "device.cuh"

__global__ void outer_from_params_kernel(float* outer, const floatX* params, const float* master, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) outer[i] = master ? master[i] : (float)params[i];
}
static inline void outer_from_params(float* outer, const floatX* params, const float* master, size_t n) {
    int kernel_span = kernel_time_begin("diloco: outer weights from the parameters", 0, 0);
    outer_from_params_kernel<<<ceil_div(n, 256), 256>>>(outer, params, master, n);
    cudaCheckLaunch();
    kernel_time_end(kernel_span);
}

__global__ void pseudo_gradient_kernel(float* delta, const float* outer, const floatX* params, const float* master, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) delta[i] = outer[i] - (master ? master[i] : (float)params[i]);
}
static inline void pseudo_gradient(float* delta, const float* outer, const floatX* params, const float* master, size_t n) {
    int kernel_span = kernel_time_begin("diloco: pseudo-gradient", 0, 0);
    pseudo_gradient_kernel<<<ceil_div(n, 256), 256>>>(delta, outer, params, master, n);
    cudaCheckLaunch();
    kernel_time_end(kernel_span);
}

__global__ void pseudo_gradient_bf16_kernel(bfloat16* q, const float* outer, const floatX* params, const float* master, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) q[i] = (bfloat16)(outer[i] - (master ? master[i] : (float)params[i]));
}
static inline void pseudo_gradient_bf16(bfloat16* q, const float* outer, const floatX* params, const float* master, size_t n) {
    int kernel_span = kernel_time_begin("diloco: pseudo-gradient (bf16)", 0, 0);
    pseudo_gradient_bf16_kernel<<<ceil_div(n, 256), 256>>>(q, outer, params, master, n);
    cudaCheckLaunch();
    kernel_time_end(kernel_span);
}

__global__ void outer_mean_bf16_kernel(bfloat16* mine, const bfloat16* others, int W, int me, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float sum = 0.0f;
    for (int w = 0; w < W; w++) sum += (float)(w == me ? mine[i] : others[(size_t)(w < me ? w : w - 1) * n + i]);
    mine[i] = (bfloat16)(sum / (float)W);
}
static inline void outer_mean_bf16(bfloat16* mine, const bfloat16* others, int W, int me, size_t n) {
    int kernel_span = kernel_time_begin("diloco: mean of bf16 pseudo-gradients", 0, 0);
    outer_mean_bf16_kernel<<<ceil_div(n, 256), 256>>>(mine, others, W, me, n);
    cudaCheckLaunch();
    kernel_time_end(kernel_span);
}

__global__ void outer_nesterov_step_kernel(float* outer, float* momentum, const float* delta, const bfloat16* delta_bf16,
                                           size_t n, float lr, float mu) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float g = delta ? delta[i] : (float)delta_bf16[i];
    float m = mu * momentum[i] + g;
    momentum[i] = m;
    outer[i] -= lr * (g + mu * m);
}
static inline void outer_nesterov_step(float* outer, float* momentum, const float* delta, const bfloat16* delta_bf16,
                                       size_t n, float lr, float mu) {
    int kernel_span = kernel_time_begin("diloco: outer Nesterov step", 0, 0);
    outer_nesterov_step_kernel<<<ceil_div(n, 256), 256>>>(outer, momentum, delta, delta_bf16, n, lr, mu);
    cudaCheckLaunch();
    kernel_time_end(kernel_span);
}

// (llmc/cpu/outer.h says what: outer merged with the worker's own weights by -alpha)
__global__ void outer_to_params_kernel(floatX* params, float* master, const float* outer, size_t n, float alpha) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float local = master ? master[i] : (float)params[i], merged = alpha * local + (1.0f - alpha) * outer[i];
    params[i] = (floatX)merged;
    if (master) master[i] = merged;
}
static inline void outer_to_params(floatX* params, float* master, const float* outer, size_t n, float alpha) {
    int kernel_span = kernel_time_begin("diloco: parameters from the outer weights", 0, 0);
    outer_to_params_kernel<<<ceil_div(n, 256), 256>>>(params, master, outer, n, alpha);
    cudaCheckLaunch();
    kernel_time_end(kernel_span);
}

// ---- -outer_dtype int8 / e3m0 (llmc/cpu/outer.h says what each step computes; the codes are
// llmc/precision.h's, the same functions on both backends). A scale is the largest |x| of a piece,
// taken as the largest of the bits of |x| (which order as |x| does, a NaN above infinity): each
// warp's largest by shuffles, then one atomicMax a warp on the scale's bits, zeroed before

// (a grid of at most 1024 blocks of 256 threads, each thread striding over the piece)
static inline int link_blocks(size_t n) { return ceil_div(n, 256) < 1024 ? ceil_div(n, 256) : 1024; }

__device__ inline unsigned warp_max_bits(unsigned v) {
    for (int o = 16; o > 0; o /= 2) {
        unsigned other = __shfl_xor_sync(0xffffffff, v, o);
        v = other > v ? other : v;
    }
    return v;
}

__global__ void link_scale_kernel(float* scale, const float* outer, const floatX* params, const float* master, size_t n) {
    unsigned largest = 0;  // (a grid-stride loop: every lane reaches the shuffles)
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned b = __float_as_uint(outer[i] - (master ? master[i] : (float)params[i])) & 0x7fffffffu;
        largest = b > largest ? b : largest;
    }
    largest = warp_max_bits(largest);
    if (threadIdx.x % 32 == 0) atomicMax((unsigned*)scale, largest);
}
static inline void link_scale(float* scale, const float* outer, const floatX* params, const float* master, size_t n) {
    int kernel_span = kernel_time_begin("diloco: link scale (largest |pseudo-gradient|)", 0, 0);
    cudaCheck(cudaMemset(scale, 0, sizeof(float)));
    link_scale_kernel<<<link_blocks(n), 256>>>(scale, outer, params, master, n);
    cudaCheckLaunch();
    kernel_time_end(kernel_span);
}

// a thread a 16-bit word: its 16 / bits codes
__global__ void link_quantize_kernel(uint16_t* codes, const float* scale, const float* outer, const floatX* params,
                                     const float* master, size_t n, int bits) {
    size_t word = (size_t)blockIdx.x * blockDim.x + threadIdx.x, k = 16 / bits;
    if (word >= (n + k - 1) / k) return;
    unsigned packed = 0;
    for (size_t j = 0, i = word * k; j < k && i < n; j++, i++) {
        packed |= link_code(outer[i] - (master ? master[i] : (float)params[i]), *scale, bits) << (j * bits);
    }
    codes[word] = (uint16_t)packed;
}
static inline void link_quantize(uint16_t* codes, const float* scale, const float* outer, const floatX* params,
                                 const float* master, size_t n, int bits) {
    int kernel_span = kernel_time_begin("diloco: link codes of the pseudo-gradient", 0, 0);
    size_t words = (n + 16 / bits - 1) / (16 / bits);
    link_quantize_kernel<<<ceil_div(words, 256), 256>>>(codes, scale, outer, params, master, n, bits);
    cudaCheckLaunch();
    kernel_time_end(kernel_span);
}

__global__ void link_mean_scale_kernel(float* mean_scale, const uint16_t* mine, const uint16_t* others, size_t stride,
                                       size_t scale_at, size_t codes_at, int W, int me, size_t n, int bits) {
    unsigned largest = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned b = __float_as_uint(link_mean(mine, others, stride, scale_at, codes_at, W, me, i, bits)) & 0x7fffffffu;
        largest = b > largest ? b : largest;
    }
    largest = warp_max_bits(largest);
    if (threadIdx.x % 32 == 0) atomicMax((unsigned*)mean_scale, largest);
}
static inline void link_mean_scale(float* mean_scale, const uint16_t* mine, const uint16_t* others, size_t stride,
                                   size_t scale_at, size_t codes_at, int W, int me, size_t n, int bits) {
    int kernel_span = kernel_time_begin("diloco: link scale of the workers' mean", 0, 0);
    cudaCheck(cudaMemset(mean_scale, 0, sizeof(float)));
    link_mean_scale_kernel<<<link_blocks(n), 256>>>(mean_scale, mine, others, stride, scale_at,
                                                                       codes_at, W, me, n, bits);
    cudaCheckLaunch();
    kernel_time_end(kernel_span);
}

// a thread a word of the owner's codes, read (with the other workers') before it is written
__global__ void link_mean_quantize_kernel(uint16_t* mine, const uint16_t* others, size_t stride, size_t scale_at,
                                          size_t codes_at, const float* mean_scale, int W, int me, size_t n, int bits) {
    size_t word = (size_t)blockIdx.x * blockDim.x + threadIdx.x, k = 16 / bits;
    if (word >= (n + k - 1) / k) return;
    unsigned packed = 0;
    for (size_t j = 0, i = word * k; j < k && i < n; j++, i++) {
        packed |= link_code(link_mean(mine, others, stride, scale_at, codes_at, W, me, i, bits), *mean_scale, bits) << (j * bits);
    }
    mine[codes_at + word] = (uint16_t)packed;
}
static inline void link_mean_quantize(uint16_t* mine, const uint16_t* others, size_t stride, size_t scale_at,
                                      size_t codes_at, const float* mean_scale, int W, int me, size_t n, int bits) {
    int kernel_span = kernel_time_begin("diloco: link codes of the workers' mean", 0, 0);
    size_t words = (n + 16 / bits - 1) / (16 / bits);
    link_mean_quantize_kernel<<<ceil_div(words, 256), 256>>>(mine, others, stride, scale_at, codes_at, mean_scale, W, me,
                                                            n, bits);
    cudaCheckLaunch();
    kernel_time_end(kernel_span);
}

__global__ void outer_nesterov_step_link_kernel(float* outer, float* momentum, const uint16_t* message, size_t scale_at,
                                                size_t codes_at, size_t n, int bits, float lr, float mu) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float g = link_read(message, scale_at, codes_at, i, bits);
    float m = mu * momentum[i] + g;
    momentum[i] = m;
    outer[i] -= lr * (g + mu * m);
}
static inline void outer_nesterov_step_link(float* outer, float* momentum, const uint16_t* message, size_t scale_at,
                                            size_t codes_at, size_t n, int bits, float lr, float mu) {
    int kernel_span = kernel_time_begin("diloco: outer Nesterov step", 0, 0);
    outer_nesterov_step_link_kernel<<<ceil_div(n, 256), 256>>>(outer, momentum, message, scale_at, codes_at, n, bits, lr, mu);
    cudaCheckLaunch();
    kernel_time_end(kernel_span);
}

#endif
