/*
Matmul backward: dinp = dout @ weight, dweight += dout^T @ inp, dbias += column sums of dout,
checked against the CPU backend.
  make dev/cuda/matmul_backward && ./dev/cuda/matmul_backward
Bias gradient variants (the two GEMMs are cuBLASLt in every variant):
v1: one thread per column walks all N rows: few threads, long serial loops.
v2: row blocks write partial sums, a second pass adds them in order: many more threads, and still
    deterministic (no atomics). llmc/cuda/matmul.cuh keeps it for when v3 has no algorithm.
v3: no kernel of its own: the weight-gradient GEMM reads all of dout anyway, and cuBLASLt's
    BGRADB epilogue sums its columns on the way (llmc/cuda/matmul.cuh's matmul_backward_weight).
    v2 reads N x OC elements once more; v3 reads nothing extra.
*/
#include "common.h"
namespace cpu {
#include "llmc/cpu/matmul.h"
}
#include "llmc/cuda/matmul.cuh"

__global__ void bias_backward_v1(floatX* dbias, const floatX* dout, int N, int OC) {
    int o = blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= OC) return;
    float sum = 0.0f;
    for (int n = 0; n < N; n++) sum += (float)dout[(size_t)n * OC + o];
    dbias[o] = (floatX)((float)dbias[o] + sum);
}

int main(void) {
    int N = GPU_OR_EMU(4 * 1024, 600), C = GPU_OR_EMU(768, 96), OC = GPU_OR_EMU(3072, 200);
    float* inp = random_floats((size_t)N * C, 1.0f);
    float* weight = random_floats((size_t)OC * C, 0.02f);
    float* dout = random_floats((size_t)N * OC, 0.01f);
    round_like_floatX(inp, (size_t)N * C);
    round_like_floatX(weight, (size_t)OC * C);
    round_like_floatX(dout, (size_t)N * OC);
    float* dinp = (float*)malloc_check((size_t)N * C * sizeof(float));
    float* dweight = (float*)calloc_check((size_t)OC * C, sizeof(float));
    float* dbias = (float*)calloc_check(OC, sizeof(float));
    cpu::matmul_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC);

    floatX *d_inp = to_device(inp, (size_t)N * C), *d_w = to_device(weight, (size_t)OC * C);
    floatX* d_dout = to_device(dout, (size_t)N * OC);
    floatX* d_dinp = (floatX*)device_malloc((size_t)N * C * sizeof(floatX));
    floatX* d_dw = (floatX*)device_malloc((size_t)OC * C * sizeof(floatX));
    floatX* d_db = (floatX*)device_malloc(OC * sizeof(floatX));
    float tol = default_tolerance(), ms;
    int ok = 1;
    printf("matmul_backward N=%d C=%d OC=%d (%s)\n", N, C, OC, PRECISION_NAME);

    device_memset_zero(d_dw, (size_t)OC * C * sizeof(floatX));
    device_memset_zero(d_db, OC * sizeof(floatX));
    matmul_backward(d_dinp, d_dw, d_db, d_dout, d_inp, d_w, N, C, OC);
    ok &= validate("dinp", d_dinp, dinp, (size_t)N * C, tol);
    ok &= validate("dweight", d_dw, dweight, (size_t)OC * C, tol);
    ok &= validate("v3 dbias (epilogue)", d_db, dbias, OC, tol);
    TIME_KERNEL(ms, 10, matmul_backward(d_dinp, d_dw, d_db, d_dout, d_inp, d_w, N, C, OC));
    report("both GEMMs, v3 dbias in the epilogue", ms, 0, 4.0 * N * C * OC);
    // the same gradients with the bias gradient accumulated twice: the epilogue writes, the
    // launcher must add (dbias accumulates over micro-batches)
    matmul_backward(d_dinp, d_dw, d_db, d_dout, d_inp, d_w, N, C, OC);
    float* twice = (float*)malloc_check((size_t)OC * sizeof(float));
    for (int o = 0; o < OC; o++) twice[o] = 2.0f * dbias[o];
    device_memset_zero(d_db, OC * sizeof(floatX));
    matmul_backward(d_dinp, d_dw, d_db, d_dout, d_inp, d_w, N, C, OC);
    matmul_backward(d_dinp, d_dw, d_db, d_dout, d_inp, d_w, N, C, OC);
    ok &= validate("v3 dbias accumulated over two calls", d_db, twice, OC, tol);

    device_memset_zero(d_db, OC * sizeof(floatX));
    bias_backward_kernels(d_db, d_dout, N, OC);
    ok &= validate("v2 dbias", d_db, dbias, OC, tol);
    TIME_KERNEL(ms, 10, bias_backward_kernels(d_db, d_dout, N, OC));
    report("v2 dbias alone", ms, (double)N * OC * sizeof(floatX), 0);

    device_memset_zero(d_db, OC * sizeof(floatX));
    bias_backward_v1<<<ceil_div(OC, 256), 256>>>(d_db, d_dout, N, OC);
    ok &= validate("v1 dbias", d_db, dbias, OC, tol);
    TIME_KERNEL(ms, 10, (bias_backward_v1<<<ceil_div(OC, 256), 256>>>(d_db, d_dout, N, OC)));
    report("v1 dbias alone", ms, (double)N * OC * sizeof(floatX), 0);
    return finish(ok);
}
