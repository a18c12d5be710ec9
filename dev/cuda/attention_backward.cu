/*
Causal self-attention backward, checked against the CPU backend.
  make dev/cuda/attention_backward && ./dev/cuda/attention_backward
v1: without atomics in two passes, in CUDA cores: one warp per query row computes the score
    gradients ds = att (dout.v - D) / sqrt(hs), with D = sum att (dout.v), and dq; then one warp
    per key row sums dk and dv over the queries that saw it.
v2: cuBLAS batched GEMMs for datt = dout v^T, dv = att^T dout, dq = ds k, dk = ds^T q on tensor
    cores, with the softmax backward as a kernel between them (llmc/cuda/attention.cuh).
*/
#include "common.h"
namespace cpu {
#include "llmc/cpu/attention.h"
}
#include "llmc/cuda/attention.cuh"

// Backward, without atomics. With dp[t][t2] = dout_t . v_t2 and D_t = sum_t2 att[t][t2] dp[t][t2],
// the score gradient is ds = att (dp - D_t) / sqrt(hs), kept in a (B, NH, T, T) scratch.
// Pass 1, one warp per query row t: the row ds[t][.], then dq_t = sum_t2 ds k_t2.
// Pass 2, one warp per key row t2: dk_t2 = sum_t ds q_t and dv_t2 = sum_t att dout_t (t >= t2).
__global__ void attention_backward_v1_queries(floatX* dqkv, float* dscores, const floatX* dout,
                                                const floatX* qkv, const floatX* att, int B, int T,
                                                int C, int NH) {
    int lane = threadIdx.x % 32;
    size_t row = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= (size_t)B * NH * T) return;
    int t = (int)(row % T), h = (int)((row / T) % NH), b = (int)(row / ((size_t)T * NH));
    int hs = C / NH;
    float scale = rsqrtf((float)hs);
    const floatX* p = att + row * T;
    float* ds = dscores + row * T;
    const floatX* dy = dout + ((size_t)b * T + t) * C + h * hs;
    float d = 0.0f;
    for (int t2 = lane; t2 <= t; t2 += 32) {
        const floatX* v = qkv + ((size_t)b * T + t2) * 3 * C + 2 * C + h * hs;
        float dp = 0.0f;
        for (int i = 0; i < hs; i++) dp += (float)dy[i] * (float)v[i];
        ds[t2] = dp;
        d += (float)p[t2] * dp;
    }
    d = warp_sum(d);
    for (int t2 = lane; t2 < T; t2 += 32) ds[t2] = t2 <= t ? (float)p[t2] * (ds[t2] - d) * scale : 0.0f;
    __syncwarp();
    floatX* dq = dqkv + ((size_t)b * T + t) * 3 * C + h * hs;
    for (int i = lane; i < hs; i += 32) {
        float acc = 0.0f;
        for (int t2 = 0; t2 <= t; t2++) acc += ds[t2] * (float)qkv[((size_t)b * T + t2) * 3 * C + C + h * hs + i];
        dq[i] = (floatX)acc;
    }
}

__global__ void attention_backward_v1_keys(floatX* dqkv, const float* dscores, const floatX* dout,
                                              const floatX* qkv, const floatX* att, int B, int T,
                                              int C, int NH) {
    int lane = threadIdx.x % 32;
    size_t row = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;  // (b, h, t2)
    if (row >= (size_t)B * NH * T) return;
    int t2 = (int)(row % T), h = (int)((row / T) % NH), b = (int)(row / ((size_t)T * NH));
    int hs = C / NH;
    size_t head = ((size_t)b * NH + h) * T;  // first query row of this (b, h)
    for (int i = lane; i < hs; i += 32) {
        float dk = 0.0f, dv = 0.0f;
        for (int t = t2; t < T; t++) {
            dk += dscores[(head + t) * T + t2] * (float)qkv[((size_t)b * T + t) * 3 * C + h * hs + i];
            dv += (float)att[(head + t) * T + t2] * (float)dout[((size_t)b * T + t) * C + h * hs + i];
        }
        dqkv[((size_t)b * T + t2) * 3 * C + C + h * hs + i] = (floatX)dk;
        dqkv[((size_t)b * T + t2) * 3 * C + 2 * C + h * hs + i] = (floatX)dv;
    }
}

static DeviceScratch v1_scratch;

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

    size_t rows = (size_t)B * NH * T;
    float* d_dscores = (float*)scratch_get(&v1_scratch, rows * T * sizeof(float));
    attention_backward_v1_queries<<<ceil_div(rows, 8), 256>>>(d_dqkv, d_dscores, d_dout, d_qkv, d_att, B, T, C, NH);
    attention_backward_v1_keys<<<ceil_div(rows, 8), 256>>>(d_dqkv, d_dscores, d_dout, d_qkv, d_att, B, T, C, NH);
    cudaCheckLaunch();
    ok &= validate("v1 dqkv", d_dqkv, dqkv, (size_t)B * T * 3 * C, tol);
    TIME_KERNEL(ms, 3, (attention_backward_v1_queries<<<ceil_div(rows, 8), 256>>>(d_dqkv, d_dscores, d_dout, d_qkv, d_att, B, T, C, NH),
                        attention_backward_v1_keys<<<ceil_div(rows, 8), 256>>>(d_dqkv, d_dscores, d_dout, d_qkv, d_att, B, T, C, NH)));
    report("v1 two passes", ms, 0, flops);

    attention_backward(d_dqkv, d_dout, d_qkv, d_att, B, T, C, NH);
    ok &= validate("v2 dqkv", d_dqkv, dqkv, (size_t)B * T * 3 * C, tol);
    TIME_KERNEL(ms, 10, attention_backward(d_dqkv, d_dout, d_qkv, d_att, B, T, C, NH));
    report("v2 cuBLAS batched", ms, 0, flops);
    return finish(ok);
}
