/*
Matmul forward, out (N, OC) = inp (N, C) @ weight (OC, C)^T + bias, checked against the CPU backend.
  make dev/cuda/matmul_forward && ./dev/cuda/matmul_forward
v1: one thread per output element, reading a row of inp and a row of weight from global memory.
v2: 32x32 tiles of inp and weight staged in shared memory, so each value loaded from global
    memory is used 32 times.
v3: cuBLASLt with the bias in the epilogue (llmc/cuda/matmul.cuh): tensor cores, the production path.
*/
#include "common.h"
namespace cpu {
#include "llmc/cpu/matmul.h"
}
#include "llmc/cuda/matmul.cuh"

__global__ void matmul_v1(floatX* out, const floatX* inp, const floatX* weight, const floatX* bias,
                          int N, int C, int OC) {
    int o = blockIdx.x * blockDim.x + threadIdx.x, n = blockIdx.y;
    if (o >= OC) return;
    float acc = bias ? (float)bias[o] : 0.0f;
    for (int c = 0; c < C; c++) acc += (float)inp[(size_t)n * C + c] * (float)weight[(size_t)o * C + c];
    out[(size_t)n * OC + o] = (floatX)acc;
}

#define TILE 32
__global__ void matmul_v2(floatX* out, const floatX* inp, const floatX* weight, const floatX* bias,
                          int N, int C, int OC) {
    __shared__ float a[TILE][TILE + 1], w[TILE][TILE + 1];  // +1: no bank conflicts on columns
    int tx = threadIdx.x, ty = threadIdx.y;
    int n = blockIdx.y * TILE + ty, o = blockIdx.x * TILE + tx;
    float acc = 0.0f;
    for (int c0 = 0; c0 < C; c0 += TILE) {
        int row_w = blockIdx.x * TILE + ty;  // this thread loads weight row row_w, column c0 + tx
        a[ty][tx] = n < N && c0 + tx < C ? (float)inp[(size_t)n * C + c0 + tx] : 0.0f;
        w[ty][tx] = row_w < OC && c0 + tx < C ? (float)weight[(size_t)row_w * C + c0 + tx] : 0.0f;
        __syncthreads();
        for (int k = 0; k < TILE; k++) acc += a[ty][k] * w[tx][k];
        __syncthreads();
    }
    if (n < N && o < OC) out[(size_t)n * OC + o] = (floatX)(acc + (bias ? (float)bias[o] : 0.0f));
}

int main(void) {
    int N = GPU_OR_EMU(4 * 1024, 130), C = GPU_OR_EMU(768, 96), OC = GPU_OR_EMU(3072, 200);
    float* inp = random_floats((size_t)N * C, 1.0f);
    float* weight = random_floats((size_t)OC * C, 0.02f);
    float* bias = random_floats(OC, 0.1f);
    round_like_floatX(inp, (size_t)N * C);
    round_like_floatX(weight, (size_t)OC * C);
    round_like_floatX(bias, OC);
    float* out = (float*)malloc_check((size_t)N * OC * sizeof(float));
    cpu::matmul_forward(out, inp, weight, bias, N, C, OC);

    floatX *d_inp = to_device(inp, (size_t)N * C), *d_w = to_device(weight, (size_t)OC * C), *d_b = to_device(bias, OC);
    floatX* d_out = (floatX*)device_malloc((size_t)N * OC * sizeof(floatX));
    double flops = 2.0 * N * C * OC;
    float tol = default_tolerance(), ms;
    int ok = 1;
    printf("matmul_forward N=%d C=%d OC=%d (%s)\n", N, C, OC, PRECISION_NAME);

    dim3 grid1(ceil_div(OC, 256), N);
    matmul_v1<<<grid1, 256>>>(d_out, d_inp, d_w, d_b, N, C, OC);
    ok &= validate("v1 naive", d_out, out, (size_t)N * OC, tol);
    TIME_KERNEL(ms, 5, (matmul_v1<<<grid1, 256>>>(d_out, d_inp, d_w, d_b, N, C, OC)));
    report("v1 naive", ms, 0, flops);

    dim3 grid2(ceil_div(OC, TILE), ceil_div(N, TILE)), block2(TILE, TILE);
    matmul_v2<<<grid2, block2>>>(d_out, d_inp, d_w, d_b, N, C, OC);
    ok &= validate("v2 shared tiles", d_out, out, (size_t)N * OC, tol);
    TIME_KERNEL(ms, 10, (matmul_v2<<<grid2, block2>>>(d_out, d_inp, d_w, d_b, N, C, OC)));
    report("v2 shared tiles", ms, 0, flops);

    matmul_forward(d_out, d_inp, d_w, d_b, N, C, OC);
    ok &= validate("v3 cuBLASLt", d_out, out, (size_t)N * OC, tol);
    TIME_KERNEL(ms, 20, matmul_forward(d_out, d_inp, d_w, d_b, N, C, OC));
    report("v3 cuBLASLt", ms, 0, flops);

    // the same shapes with the bias 16 bytes off a 256-byte boundary (as one layer's slice of a
    // stacked bias can be): the launcher keeps one algorithm per shape and alignment, and one
    // chosen for the aligned bias must not be reused here (the emulator stops if it is)
    floatX* d_b_shifted = (floatX*)device_malloc((OC + 16 / sizeof(floatX)) * sizeof(floatX)) + 16 / sizeof(floatX);
    copy_device_to_device(d_b_shifted, d_b, OC * sizeof(floatX));
    matmul_forward(d_out, d_inp, d_w, d_b_shifted, N, C, OC);
    ok &= validate("v3, bias 16-byte aligned", d_out, out, (size_t)N * OC, tol);
    return finish(ok);
}
