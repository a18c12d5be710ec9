// Attention in blocks of keys, for context parallelism (train_gpt2_cp.cu), on CUDA: the same
// launchers and the same math as llmc/cpu/ring_attention.h (read that file first), one thread
// per query row (forward, dq) or key row (dk, dv), its head's hs values in registers and fp32
// sums. A plain kernel, correct at every tile case, not yet the tensor-core flash kernels of
// flash_attention.cuh: those are what a long sequence needs on a GPU.
#ifndef LLMC_CUDA_RING_ATTENTION_CUH
#define LLMC_CUDA_RING_ATTENTION_CUH

#include "device.cuh"
#include "../cp_layout.h"


// kv (B, T, 2C) = the keys and values of qkv (B, T, 3C)
__global__ void kv_pack_kernel(floatX* kv, const floatX* qkv, size_t BT, int C) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;  // over (token, 2C)
    if (idx >= BT * 2 * C) return;
    size_t token = idx / (2 * C), j = idx % (2 * C);
    kv[idx] = qkv[token * 3 * C + C + j];
}
static inline void kv_pack(floatX* kv, const floatX* qkv, int B, int T, int C) {
    size_t n = (size_t)B * T * 2 * C;
    kv_pack_kernel<<<ceil_div(n, 256), 256>>>(kv, qkv, (size_t)B * T, C);
    cudaCheckLaunch();
}

// one thread per (b, h, query t): its attention to the block's visible keys, merged into o, lse
__global__ void attention_block_forward_kernel(float* o, float* lse, const floatX* qkv, const floatX* kv, CpChunks q,
                                               CpChunks k, int B, int C, int NH, int first) {
    int hs = C / NH, Tq = q.n * q.len, Tk = k.n * k.len;
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;  // over (b, h, t)
    if (idx >= (size_t)B * NH * Tq) return;
    int t = (int)(idx % Tq), h = (int)((idx / Tq) % NH), b = (int)(idx / ((size_t)Tq * NH));
    float scale = rsqrtf((float)hs);
    const floatX* qt = qkv + ((size_t)b * Tq + t) * 3 * C + h * hs;
    float m = -INFINITY, sum = 0.0f, ob[RING_MAX_HEAD];
    for (int i = 0; i < hs; i++) ob[i] = 0.0f;
    for (int j = 0; j < k.n; j++) for (int t2 = j * k.len; t2 < j * k.len + cp_keys_seen(q, t, k, j); t2++) {
        const floatX* kt = kv + ((size_t)b * Tk + t2) * 2 * C + h * hs;
        const floatX* vt = kt + C;
        float s = 0.0f;
        for (int i = 0; i < hs; i++) s += (float)qt[i] * (float)kt[i];
        s *= scale;
        float m_new = fmaxf(s, m), rescale = expf(m - m_new), p = expf(s - m_new);
        sum = sum * rescale + p;
        for (int i = 0; i < hs; i++) ob[i] = ob[i] * rescale + p * (float)vt[i];
        m = m_new;
    }
    if (sum == 0.0f) return;
    float* l = lse + ((size_t)b * NH + h) * Tq + t;
    float* ot = o + ((size_t)b * Tq + t) * C + h * hs;
    float lse_b = m + logf(sum);
    float lse_new = first ? lse_b : fmaxf(*l, lse_b) + log1pf(expf(-fabsf(*l - lse_b)));
    float keep = first ? 0.0f : expf(*l - lse_new), add = expf(lse_b - lse_new) / sum;
    for (int i = 0; i < hs; i++) ot[i] = (first ? 0.0f : ot[i] * keep) + ob[i] * add;
    *l = lse_new;
}
static inline void attention_block_forward(float* o, float* lse, const floatX* qkv, const floatX* kv, CpChunks q,
                                           CpChunks k, int B, int C, int NH, int first) {
    size_t n = (size_t)B * NH * q.n * q.len;
    attention_block_forward_kernel<<<ceil_div(n, 128), 128>>>(o, lse, qkv, kv, q, k, B, C, NH, first);
    cudaCheckLaunch();
}

// D (B, NH, Tq) = per head, the sum of datty * atty
__global__ void attention_block_backward_prepare_kernel(float* D, const floatX* datty, const floatX* atty, int B,
                                                        int Tq, int C, int NH) {
    int hs = C / NH;
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;  // over (b, h, t)
    if (idx >= (size_t)B * NH * Tq) return;
    int t = (int)(idx % Tq), h = (int)((idx / Tq) % NH), b = (int)(idx / ((size_t)Tq * NH));
    const floatX* dy = datty + ((size_t)b * Tq + t) * C + h * hs;
    const floatX* y = atty + ((size_t)b * Tq + t) * C + h * hs;
    float s = 0.0f;
    for (int i = 0; i < hs; i++) s += (float)dy[i] * (float)y[i];
    D[idx] = s;
}
static inline void attention_block_backward_prepare(float* D, const floatX* datty, const floatX* atty, int B, int Tq,
                                                    int C, int NH) {
    size_t n = (size_t)B * NH * Tq;
    attention_block_backward_prepare_kernel<<<ceil_div(n, 128), 128>>>(D, datty, atty, B, Tq, C, NH);
    cudaCheckLaunch();
}

// dq: one thread per (b, h, query t), over the block's visible keys
__global__ void attention_block_dq_kernel(float* dq, const floatX* datty, const float* lse, const float* D,
                                          const floatX* qkv, const floatX* kv, CpChunks q, CpChunks k, int B, int C,
                                          int NH) {
    int hs = C / NH, Tq = q.n * q.len, Tk = k.n * k.len;
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;  // over (b, h, t) = the row of lse
    if (idx >= (size_t)B * NH * Tq) return;
    int t = (int)(idx % Tq), h = (int)((idx / Tq) % NH), b = (int)(idx / ((size_t)Tq * NH));
    float scale = rsqrtf((float)hs);
    const floatX* qt = qkv + ((size_t)b * Tq + t) * 3 * C + h * hs;
    const floatX* dy = datty + ((size_t)b * Tq + t) * C + h * hs;
    float* dqt = dq + ((size_t)b * Tq + t) * C + h * hs;
    for (int j = 0; j < k.n; j++) for (int t2 = j * k.len; t2 < j * k.len + cp_keys_seen(q, t, k, j); t2++) {
        const floatX* kt = kv + ((size_t)b * Tk + t2) * 2 * C + h * hs;
        const floatX* vt = kt + C;
        float s = 0.0f, dp = 0.0f;
        for (int i = 0; i < hs; i++) {
            s += (float)qt[i] * (float)kt[i];
            dp += (float)dy[i] * (float)vt[i];
        }
        float p = expf(s * scale - lse[idx]), ds = p * (dp - D[idx]) * scale;
        for (int i = 0; i < hs; i++) dqt[i] += ds * (float)kt[i];
    }
}

// dk, dv: one thread per (b, h, key t2), over this rank's queries that see it
__global__ void attention_block_dkv_kernel(float* dkv, const floatX* datty, const float* lse, const float* D,
                                           const floatX* qkv, const floatX* kv, CpChunks q, CpChunks k, int B, int C,
                                           int NH) {
    int hs = C / NH, Tq = q.n * q.len, Tk = k.n * k.len;
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;  // over (b, h, t2)
    if (idx >= (size_t)B * NH * Tk) return;
    int t2 = (int)(idx % Tk), h = (int)((idx / Tk) % NH), b = (int)(idx / ((size_t)Tk * NH));
    float scale = rsqrtf((float)hs);
    const floatX* kt = kv + ((size_t)b * Tk + t2) * 2 * C + h * hs;
    const floatX* vt = kt + C;
    float dk[RING_MAX_HEAD], dv[RING_MAX_HEAD];
    for (int i = 0; i < hs; i++) dk[i] = dv[i] = 0.0f;
    for (int qc = 0; qc < q.n; qc++) for (int t = qc * q.len + cp_first_query_seeing(q, qc, k, t2); t < (qc + 1) * q.len; t++) {
        const floatX* qt = qkv + ((size_t)b * Tq + t) * 3 * C + h * hs;
        const floatX* dy = datty + ((size_t)b * Tq + t) * C + h * hs;
        size_t row = ((size_t)b * NH + h) * Tq + t;
        float s = 0.0f, dp = 0.0f;
        for (int i = 0; i < hs; i++) {
            s += (float)qt[i] * (float)kt[i];
            dp += (float)dy[i] * (float)vt[i];
        }
        float p = expf(s * scale - lse[row]), ds = p * (dp - D[row]) * scale;
        for (int i = 0; i < hs; i++) {
            dv[i] += p * (float)dy[i];
            dk[i] += ds * (float)qt[i];
        }
    }
    float* dkt = dkv + ((size_t)b * Tk + t2) * 2 * C + h * hs;
    for (int i = 0; i < hs; i++) {
        dkt[i] += dk[i];
        dkt[C + i] += dv[i];
    }
}

static inline void attention_block_backward(float* dq, float* dkv, const floatX* datty, const float* lse,
                                            const float* D, const floatX* qkv, const floatX* kv, CpChunks q,
                                            CpChunks k, int B, int C, int NH) {
    size_t nq = (size_t)B * NH * q.n * q.len, nk = (size_t)B * NH * k.n * k.len;
    attention_block_dq_kernel<<<ceil_div(nq, 128), 128>>>(dq, datty, lse, D, qkv, kv, q, k, B, C, NH);
    cudaCheckLaunch();
    attention_block_dkv_kernel<<<ceil_div(nk, 128), 128>>>(dkv, datty, lse, D, qkv, kv, q, k, B, C, NH);
    cudaCheckLaunch();
}

// dqkv (B, T, 3C) floatX = dq (B, T, C) beside dkv (B, T, 2C), fp32
__global__ void attention_block_grads_kernel(floatX* dqkv, const float* dq, const float* dkv, size_t BT, int C) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;  // over (token, 3C)
    if (idx >= BT * 3 * C) return;
    size_t token = idx / (3 * C), j = idx % (3 * C);
    dqkv[idx] = (floatX)(j < (size_t)C ? dq[token * C + j] : dkv[token * 2 * C + j - C]);
}
static inline void attention_block_grads(floatX* dqkv, const float* dq, const float* dkv, int B, int T, int C) {
    size_t n = (size_t)B * T * 3 * C;
    attention_block_grads_kernel<<<ceil_div(n, 256), 256>>>(dqkv, dq, dkv, (size_t)B * T, C);
    cudaCheckLaunch();
}

// atty = o, rounded to the activations' precision
__global__ void attention_block_output_kernel(floatX* atty, const float* o, size_t n) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < n) atty[idx] = (floatX)o[idx];
}
static inline void attention_block_output(floatX* atty, const float* o, size_t n) {
    attention_block_output_kernel<<<ceil_div(n, 256), 256>>>(atty, o, n);
    cudaCheckLaunch();
}

#endif
