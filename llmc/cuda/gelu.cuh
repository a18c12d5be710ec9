// GELU with the tanh approximation (Hendrycks & Gimpel 2016) on CUDA; elementwise, in fp32.
#ifndef LLMC_CUDA_GELU_CUH
#define LLMC_CUDA_GELU_CUH

#include "device.cuh"

#define GELU_SCALE 0.7978845608028654f  // sqrt(2 / pi)

// GELU's speed is set by memory bandwidth alone, so each thread moves 16 bytes (PACK16 elements)
// per load and store; N is a multiple of PACK16 (it is B T 4C).
// Why not cuBLASLt's GELU epilogues (GELU_AUX_BIAS on the fc GEMM, DGELU on the fcproj input
// gradient), which would save a read and a write of (B, T, 4C) each way? NVIDIA documents them as
// "apply GELU point-wise transform" (cublasLt.h, the cuBLAS guide) without saying which GELU, and
// GPT-2 trains with the tanh approximation: an exact-erf epilogue would differ from PyTorch's
// reference in every activation. Until the formula is documented, the kernel stays.
__global__ void gelu_forward_kernel(floatX* out, const floatX* inp, size_t N) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * PACK16;
    if (i >= N) return;
    Pack16 x = load16(inp + i), y;
    for (int k = 0; k < PACK16; k++) {
        float a = (float)x.v[k];
        float u = GELU_SCALE * (a + 0.044715f * a * a * a);
        y.v[k] = (floatX)(a / (1.0f + expf(fminf(-2.0f * u, 80.0f))));  // 0.5 a (1 + tanh u), as llmc/cpu/gelu.h
    }
    store16(out + i, y);
}

__global__ void gelu_backward_kernel(floatX* dinp, const floatX* inp, const floatX* dout, size_t N) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * PACK16;
    if (i >= N) return;
    Pack16 x = load16(inp + i), dy = load16(dout + i), dx;
    for (int k = 0; k < PACK16; k++) {
        float a = (float)x.v[k];
        float e = expf(fminf(-2.0f * GELU_SCALE * (a + 0.044715f * a * a * a), 80.0f));
        float s = 1.0f / (1.0f + e);  // 0.5 (1 + tanh u); e s = 0.5 (1 - tanh u)
        float du = GELU_SCALE * (1.0f + 3.0f * 0.044715f * a * a);
        float grad = s + 2.0f * a * s * (e * s) * du;
        dx.v[k] = (floatX)((float)dy.v[k] * grad);
    }
    store16(dinp + i, dx);
}

static inline void gelu_forward(floatX* out, const floatX* inp, size_t N) {
    int kernel_span = kernel_time_begin("gelu forward", 0, 0);
    check_whole_packs("gelu_forward", "N", N);
    gelu_forward_kernel<<<ceil_div(N / PACK16, 256), 256>>>(out, inp, N);
    cudaCheckLaunch();
    kernel_time_end(kernel_span);
}

// dinp may be the same buffer as dout
static inline void gelu_backward(floatX* dinp, const floatX* inp, const floatX* dout, size_t N) {
    int kernel_span = kernel_time_begin("gelu backward", 0, 0);
    check_whole_packs("gelu_backward", "N", N);
    gelu_backward_kernel<<<ceil_div(N / PACK16, 256), 256>>>(dinp, inp, dout, N);
    cudaCheckLaunch();
    kernel_time_end(kernel_span);
}

#endif
