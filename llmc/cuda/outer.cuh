// DiLoCo's outer step (train_gpt2_diloco.cu) on CUDA: the same element-wise steps as
// llmc/cpu/outer.h (read that file first), a thread per element, fp32 throughout; the
// parameters themselves are floatX, rounded to nearest from the fp32 outer ones.
#ifndef LLMC_CUDA_OUTER_CUH
#define LLMC_CUDA_OUTER_CUH

#include "device.cuh"

__global__ void outer_from_params_kernel(float* outer, const floatX* params, const float* master, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) outer[i] = master ? master[i] : (float)params[i];
}
static inline void outer_from_params(float* outer, const floatX* params, const float* master, size_t n) {
    outer_from_params_kernel<<<ceil_div(n, 256), 256>>>(outer, params, master, n);
    cudaCheckLaunch();
}

__global__ void pseudo_gradient_kernel(float* delta, const float* outer, const floatX* params, const float* master, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) delta[i] = outer[i] - (master ? master[i] : (float)params[i]);
}
static inline void pseudo_gradient(float* delta, const float* outer, const floatX* params, const float* master, size_t n) {
    pseudo_gradient_kernel<<<ceil_div(n, 256), 256>>>(delta, outer, params, master, n);
    cudaCheckLaunch();
}

__global__ void outer_nesterov_step_kernel(float* outer, float* momentum, const float* delta, size_t n, float lr, float mu) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float m = mu * momentum[i] + delta[i];
    momentum[i] = m;
    outer[i] -= lr * (delta[i] + mu * m);
}
static inline void outer_nesterov_step(float* outer, float* momentum, const float* delta, size_t n, float lr, float mu) {
    outer_nesterov_step_kernel<<<ceil_div(n, 256), 256>>>(outer, momentum, delta, n, lr, mu);
    cudaCheckLaunch();
}

__global__ void outer_to_params_kernel(floatX* params, float* master, const float* outer, size_t n) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    params[i] = (floatX)outer[i];
    if (master) master[i] = outer[i];
}
static inline void outer_to_params(floatX* params, float* master, const float* outer, size_t n) {
    outer_to_params_kernel<<<ceil_div(n, 256), 256>>>(params, master, outer, n);
    cudaCheckLaunch();
}

#endif
