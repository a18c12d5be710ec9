/*
Causal self-attention backward, checked against the CPU backend.
  make dev/cuda/attention_backward && ./dev/cuda/attention_backward
v1 (llmc/cuda/attention.cuh), without atomics in two passes: one warp per query row computes the
score gradients ds = att (dout.v - D) / sqrt(hs), with D = sum att (dout.v), and dq; then one
warp per key row sums dk and dv over the queries that saw it.
*/
#include "common.h"
namespace cpu {
#include "llmc/cpu/attention.h"
}
#include "llmc/cuda/attention.cuh"

int main(void) {
    int B = 4, T = 512, C = 768, NH = 12;
    float* qkv = random_floats((size_t)B * T * 3 * C, 1.0f);
    float* dout = random_floats((size_t)B * T * C, 1.0f);
    round_like_floatX(qkv, (size_t)B * T * 3 * C);
    round_like_floatX(dout, (size_t)B * T * C);
    float* out = (float*)malloc_check((size_t)B * T * C * sizeof(float));
    float* att = (float*)malloc_check((size_t)B * NH * T * T * sizeof(float));
    float* dqkv = (float*)malloc_check((size_t)B * T * 3 * C * sizeof(float));
    cpu::attention_forward(out, att, qkv, B, T, C, NH);
    cpu::attention_backward(dqkv, dout, qkv, att, B, T, C, NH);

    floatX *d_qkv = to_device(qkv, (size_t)B * T * 3 * C), *d_dout = to_device(dout, (size_t)B * T * C);
    floatX* d_out = (floatX*)device_malloc((size_t)B * T * C * sizeof(floatX));
    floatX* d_att = (floatX*)device_malloc((size_t)B * NH * T * T * sizeof(floatX));
    floatX* d_dqkv = (floatX*)device_malloc((size_t)B * T * 3 * C * sizeof(floatX));
    attention_forward(d_out, d_att, d_qkv, B, T, C, NH);
    double flops = 8.0 * B * NH * (double)T * T / 2 * (C / NH);
    float tol = FLOATX_IS_FLOAT ? 1e-4f : 5e-2f, ms;  // bf16: att itself is rounded to 8 bits
    int ok = 1;
    printf("attention_backward B=%d T=%d C=%d NH=%d (%s)\n", B, T, C, NH, PRECISION_NAME);

    attention_backward(d_dqkv, d_dout, d_qkv, d_att, B, T, C, NH);
    ok &= validate("v1 dqkv", d_dqkv, dqkv, (size_t)B * T * 3 * C, tol);
    TIME_KERNEL(ms, 3, attention_backward(d_dqkv, d_dout, d_qkv, d_att, B, T, C, NH));
    report("v1 two passes", ms, 0, flops);
    return finish(ok);
}
