// Causal multi-head self-attention on CUDA, the straightforward version: the softmax
// probabilities (B, NH, T, T) are stored for the backward pass, exactly as on the CPU.
// qkv (B, T, 3C) holds q, k, v side by side, each split into NH heads of size hs = C / NH.
#ifndef LLMC_CUDA_ATTENTION_CUH
#define LLMC_CUDA_ATTENTION_CUH

#include "device.cuh"

// q . k of query row t and key row t2 of head h, scaled by 1/sqrt(hs), in fp32
__device__ inline float attention_score(const floatX* qkv, int b, int t, int t2, int h, int T, int C, int hs) {
    const floatX* q = qkv + ((size_t)b * T + t) * 3 * C + h * hs;
    const floatX* k = qkv + ((size_t)b * T + t2) * 3 * C + C + h * hs;
    float s = 0.0f;
    for (int i = 0; i < hs; i++) s += (float)q[i] * (float)k[i];
    return s * rsqrtf((float)hs);
}

// one warp per query row (b, h, t): scores over t2 <= t, softmax, then out = att @ v. The scores
// are computed twice (for the max, then for the exponentials) so that only probabilities in
// [0, 1], never raw scores, are rounded to floatX
__global__ void attention_forward_kernel(floatX* out, floatX* att, const floatX* qkv, int B, int T,
                                         int C, int NH) {
    int lane = threadIdx.x % 32;
    size_t row = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;  // (b, h, t)
    if (row >= (size_t)B * NH * T) return;
    int t = (int)(row % T), h = (int)((row / T) % NH), b = (int)(row / ((size_t)T * NH));
    int hs = C / NH;
    floatX* p = att + row * T;
    float maxval = -INFINITY;
    for (int t2 = lane; t2 <= t; t2 += 32) maxval = fmaxf(maxval, attention_score(qkv, b, t, t2, h, T, C, hs));
    maxval = warp_max(maxval);
    float sum = 0.0f;
    for (int t2 = lane; t2 <= t; t2 += 32) sum += expf(attention_score(qkv, b, t, t2, h, T, C, hs) - maxval);
    float inv = 1.0f / warp_sum(sum);
    for (int t2 = lane; t2 < T; t2 += 32) {
        p[t2] = (floatX)(t2 <= t ? expf(attention_score(qkv, b, t, t2, h, T, C, hs) - maxval) * inv : 0.0f);
    }
    __syncwarp();
    floatX* o = out + ((size_t)b * T + t) * C + h * hs;
    for (int i = lane; i < hs; i += 32) {
        float acc = 0.0f;
        for (int t2 = 0; t2 <= t; t2++) acc += (float)p[t2] * (float)qkv[((size_t)b * T + t2) * 3 * C + 2 * C + h * hs + i];
        o[i] = (floatX)acc;
    }
}

static inline void attention_forward(floatX* out, floatX* att, const floatX* qkv, int B, int T,
                                     int C, int NH) {
    size_t rows = (size_t)B * NH * T;
    attention_forward_kernel<<<ceil_div(rows, 8), 256>>>(out, att, qkv, B, T, C, NH);
    cudaCheckLaunch();
}

// Backward, without atomics. With dp[t][t2] = dout_t . v_t2 and D_t = sum_t2 att[t][t2] dp[t][t2],
// the score gradient is ds = att (dp - D_t) / sqrt(hs), kept in a (B, NH, T, T) scratch.
// Pass 1, one warp per query row t: the row ds[t][.], then dq_t = sum_t2 ds k_t2.
// Pass 2, one warp per key row t2: dk_t2 = sum_t ds q_t and dv_t2 = sum_t att dout_t (t >= t2).
__global__ void attention_backward_query_kernel(floatX* dqkv, float* dscores, const floatX* dout,
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

__global__ void attention_backward_key_kernel(floatX* dqkv, const float* dscores, const floatX* dout,
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

static DeviceScratch attention_scratch;

// dqkv (B, T, 3C) = gradient of the attention output dout (B, T, C) (overwritten)
static inline void attention_backward(floatX* dqkv, const floatX* dout, const floatX* qkv,
                                      const floatX* att, int B, int T, int C, int NH) {
    size_t rows = (size_t)B * NH * T;
    float* dscores = (float*)scratch_get(&attention_scratch, rows * T * sizeof(float));
    attention_backward_query_kernel<<<ceil_div(rows, 8), 256>>>(dqkv, dscores, dout, qkv, att, B, T, C, NH);
    cudaCheckLaunch();
    attention_backward_key_kernel<<<ceil_div(rows, 8), 256>>>(dqkv, dscores, dout, qkv, att, B, T, C, NH);
    cudaCheckLaunch();
}

#endif
