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

#endif
