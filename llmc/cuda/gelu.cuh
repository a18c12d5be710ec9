// GELU with the tanh approximation (Hendrycks & Gimpel 2016) on CUDA; elementwise, in fp32.
#ifndef LLMC_CUDA_GELU_CUH
#define LLMC_CUDA_GELU_CUH

#include "device.cuh"

#define GELU_SCALE 0.7978845608028654f  // sqrt(2 / pi)

__global__ void gelu_forward_kernel(floatX* out, const floatX* inp, size_t N) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) return;
    float x = (float)inp[i];
    out[i] = (floatX)(0.5f * x * (1.0f + tanhf(GELU_SCALE * (x + 0.044715f * x * x * x))));
}

__global__ void gelu_backward_kernel(floatX* dinp, const floatX* inp, const floatX* dout, size_t N) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) return;
    float x = (float)inp[i];
    float th = tanhf(GELU_SCALE * (x + 0.044715f * x * x * x));
    float du = GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
    float grad = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du;
    dinp[i] = (floatX)((float)dout[i] * grad);
}

static inline void gelu_forward(floatX* out, const floatX* inp, size_t N) {
    gelu_forward_kernel<<<ceil_div(N, 256), 256>>>(out, inp, N);
    cudaCheckLaunch();
}

// dinp may be the same buffer as dout
static inline void gelu_backward(floatX* dinp, const floatX* inp, const floatX* dout, size_t N) {
    gelu_backward_kernel<<<ceil_div(N, 256), 256>>>(dinp, inp, dout, N);
    cudaCheckLaunch();
}

#endif
