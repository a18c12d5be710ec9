/*
GELU (tanh approximation) forward and backward, checked against the CPU backend.
  make dev/cuda/gelu && ./dev/cuda/gelu
v1: one element per thread: 2-byte loads and stores in bf16.
v2: 16-byte loads and stores (8 bf16 or 4 fp32 per access; llmc/cuda/gelu.cuh): fewer, wider
    memory transactions for a kernel whose speed is set by memory bandwidth alone.
*/
#include "common.h"
namespace cpu {
#include "llmc/cpu/gelu.h"
}
#include "llmc/cuda/gelu.cuh"

__global__ void gelu_forward_v1(floatX* out, const floatX* inp, size_t N) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) return;
    float x = (float)inp[i];
    out[i] = (floatX)(0.5f * x * (1.0f + tanhf(GELU_SCALE * (x + 0.044715f * x * x * x))));
}

__global__ void gelu_backward_v1(floatX* dinp, const floatX* inp, const floatX* dout, size_t N) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) return;
    float x = (float)inp[i];
    float th = tanhf(GELU_SCALE * (x + 0.044715f * x * x * x));
    float du = GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
    float grad = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du;
    dinp[i] = (floatX)((float)dout[i] * grad);
}

int main(void) {
    size_t N = GPU_OR_EMU((size_t)8 * 1024 * 3072, (size_t)1 << 16);  // B*T*4C of a GPT-2 124M layer at B=8
    float* x = random_floats(N, 1.0f);
    float* dy = random_floats(N, 1.0f);
    round_like_floatX(x, N);
    round_like_floatX(dy, N);
    float* y = (float*)malloc_check(N * sizeof(float));
    float* dx = (float*)malloc_check(N * sizeof(float));
    cpu::gelu_forward(y, x, N);
    cpu::gelu_backward(dx, x, dy, N);

    floatX *d_x = to_device(x, N), *d_dy = to_device(dy, N);
    floatX* d_y = (floatX*)device_malloc(N * sizeof(floatX));
    floatX* d_dx = (floatX*)device_malloc(N * sizeof(floatX));
    float tol = default_tolerance(), ms;
    int ok = 1;
    printf("gelu N=%zu (%s)\n", N, PRECISION_NAME);

    gelu_forward_v1<<<ceil_div(N, 256), 256>>>(d_y, d_x, N);
    cudaCheckLaunch();
    ok &= validate("v1 forward", d_y, y, N, tol);
    TIME_KERNEL(ms, 20, (gelu_forward_v1<<<ceil_div(N, 256), 256>>>(d_y, d_x, N)));
    report("v1 forward", ms, 2.0 * N * sizeof(floatX), 0);

    gelu_backward_v1<<<ceil_div(N, 256), 256>>>(d_dx, d_x, d_dy, N);
    cudaCheckLaunch();
    ok &= validate("v1 backward", d_dx, dx, N, tol);
    TIME_KERNEL(ms, 20, (gelu_backward_v1<<<ceil_div(N, 256), 256>>>(d_dx, d_x, d_dy, N)));
    report("v1 backward", ms, 3.0 * N * sizeof(floatX), 0);

    device_memset_zero(d_y, N * sizeof(floatX));
    gelu_forward(d_y, d_x, N);
    ok &= validate("v2 forward 16B", d_y, y, N, tol);
    TIME_KERNEL(ms, 20, gelu_forward(d_y, d_x, N));
    report("v2 forward 16B", ms, 2.0 * N * sizeof(floatX), 0);

    device_memset_zero(d_dx, N * sizeof(floatX));
    gelu_backward(d_dx, d_x, d_dy, N);
    ok &= validate("v2 backward 16B", d_dx, dx, N, tol);
    TIME_KERNEL(ms, 20, gelu_backward(d_dx, d_x, d_dy, N));
    report("v2 backward 16B", ms, 3.0 * N * sizeof(floatX), 0);
    return finish(ok);
}
