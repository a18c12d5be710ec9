/*
GELU (tanh approximation) forward and backward, checked against the CPU backend.
  make dev/cuda/gelu && ./dev/cuda/gelu
v1: one element per thread (llmc/cuda/gelu.cuh).
v2: the forward with 16-byte loads and stores (8 bf16 or 4 fp32 per access): fewer, wider memory
    transactions for a kernel whose speed is set by memory bandwidth alone.
*/
#include "common.h"
namespace cpu {
#include "llmc/cpu/gelu.h"
}
#include "llmc/cuda/gelu.cuh"

#define PACK (16 / (int)sizeof(floatX))
typedef struct __align__(16) { floatX v[16 / sizeof(floatX)]; } Pack16;

__global__ void gelu_forward_v2(floatX* out, const floatX* inp, size_t N) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * PACK;
    if (i >= N) return;
    Pack16 x = *(const Pack16*)(inp + i), y;
    #pragma unroll
    for (int k = 0; k < PACK; k++) {
        float a = (float)x.v[k];
        y.v[k] = (floatX)(0.5f * a * (1.0f + tanhf(GELU_SCALE * (a + 0.044715f * a * a * a))));
    }
    *(Pack16*)(out + i) = y;
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

    gelu_forward(d_y, d_x, N);
    ok &= validate("v1 forward", d_y, y, N, tol);
    TIME_KERNEL(ms, 20, gelu_forward(d_y, d_x, N));
    report("v1 forward", ms, 2.0 * N * sizeof(floatX), 0);

    gelu_forward_v2<<<ceil_div(N / PACK, 256), 256>>>(d_y, d_x, N);
    cudaCheckLaunch();
    ok &= validate("v2 forward 16B", d_y, y, N, tol);
    TIME_KERNEL(ms, 20, (gelu_forward_v2<<<ceil_div(N / PACK, 256), 256>>>(d_y, d_x, N)));
    report("v2 forward 16B", ms, 2.0 * N * sizeof(floatX), 0);

    gelu_backward(d_dx, d_x, d_dy, N);
    ok &= validate("backward", d_dx, dx, N, tol);
    TIME_KERNEL(ms, 20, gelu_backward(d_dx, d_x, d_dy, N));
    report("backward", ms, 3.0 * N * sizeof(floatX), 0);
    return finish(ok);
}
