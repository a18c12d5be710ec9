/*
Causal self-attention backward, checked against the CPU backend.
  make dev/cuda/attention_backward && ./dev/cuda/attention_backward
v1: without atomics in two passes, in CUDA cores: one warp per query row computes the score
    gradients ds = att (dout.v - D) / sqrt(hs), with D = sum att (dout.v), and dq; then one warp
    per key row sums dk and dv over the queries that saw it.
v2: cuBLAS batched GEMMs for datt = dout v^T, dv = att^T dout, dq = ds k, dk = ds^T q on tensor
    cores, with the softmax backward as a kernel between them (llmc/cuda/attention.cuh).
v3: flash-style (Dao et al. 2022): no T x T matrix at all. From each query row's log-sum-exp
    (what an online-softmax forward keeps) the probabilities are recomputed where needed,
    p = exp(q.k / sqrt(hs) - lse); D = dout . out replaces the row sums of v1. One warp per query
    row accumulates dq, one warp per key row accumulates dk and dv, 32 keys or queries at a time.
v4: flash attention backward on tensor cores through WMMA (dev/cuda/flash_wmma.cuh, bf16 builds;
    after FlashAttention-2): v3's recomputation with whole tiles. One kernel gives dk and dv (a
    block owns 64 keys and walks the queries 32 at a time), another dq (64 queries, keys 32 at a
    time); every product is a 16 x 16 x 16 WMMA, and every score tile passes through shared memory.
v5: v4 with mma.sync fragments kept in registers (llmc/cuda/flash_attention.cuh, llmc's path in
    bf16): p^T, dp^T and ds^T never leave registers, dk and dv (or dq) accumulate in registers,
    q/dout (or k/v) tiles of 64 come in by cp.async, double-buffered. v2 is llmc's path in fp32.
v6: v5's products on Hopper's warpgroup MMA (LLMC_FLASH=wgmma; sm_90a builds, head size 64): a
    warpgroup owns 64 keys (or queries) as A fragments; the q and dout (or k and v) tiles are read
    by the tensor cores from shared memory, each by two products (K-major and MN-major views of
    one interleaved tile); s^T and dp^T in one commit group, dv and dk in another. 128 keys (or
    queries) a block in 2 warpgroups.
v7: v5 in one kernel (LLMC_FLASH_BACKWARD=one_kernel; after FlashAttention-2's algorithm 2):
    the dK dV kernel also multiplies its ds by its k, and each query tile's dq takes the key
    blocks' shares in a fixed order (the diagonal block first, key block 0 last, a counter per
    tile in memory), so no atomic adds and the same bits on every run: 5 products a tile, not 7.
v8: v6 on Hopper's asynchronous machinery (llmc/cuda/flash_hopper_backward.cuh; sm_90a, head size
    64; after FlashAttention-3's backward): a block of 3 warpgroups, one producer warp that loads
    by TMA (each query tile's q and dout into a 2-slot ring with full and empty mbarriers, the
    block's k and v once with the first; the tile's lse and D copied by its lanes) and two consumer warpgroups
    (setmaxnreg: 40 registers for the producer, 232 for them) whose s^T = k q^T and dp^T = v dout^T
    read both operands from shared memory (wgmma_m64n64k16_ss); p^T, ds^T in registers as A of
    dv and dk. dQ by a second kernel on the same ring (the block's q and dout once, key tiles
    streamed), not by ordered accumulation: no turns between blocks, the same bits on every run
    (the header says why). Under the emulator v8 gives v6's bits (the same products in the same
    order), checked there, reported on a GPU; a second run gives the first's bits.
v9: v8's two consumer warpgroups in pingpong (FlashAttention-3 section 3.1, there in the
    forward): they take turns at the tensor cores through two named barriers, a turn issuing the
    previous tile's dv and dk (or dq) products with this tile's s^T and dp^T (or s and dp), so
    that one warpgroup's exponentials and ds run while the other's products do; a 3-slot ring
    (a tile's slot is held until the turn after). The same bits as v6 under the emulator.
The emulator runs each version once (plus a second run for v7, v8 and v9's determinism): its times
mean nothing, so only a GPU times them.
*/
#include "common.h"
namespace cpu {
#include "llmc/cpu/attention.h"
}
#include "llmc/cuda/attention.cuh"
#include "llmc/cuda/flash_hopper_backward.cuh"
#include "flash_wmma.cuh"

// The emulator's times mean nothing, and each timing loop would cost two more runs of a kernel
// there (the program must stay under a minute an order): only a GPU times and reports
#ifdef CUDA_EMU
#define TIME_AND_REPORT(name, repeat, flops, launch) do {} while (0)
#else
#define TIME_AND_REPORT(name, repeat, flops, launch) do { \
    float ms_; TIME_KERNEL(ms_, repeat, launch); report(name, ms_, 0, flops); } while (0)
#endif

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

#define V3_MAX_HS 128  // up to 4 channels of a head per lane

// head channel i of row t of the q (part 0), k (1) or v (2) block of qkv
__device__ inline const floatX* v3_row(const floatX* qkv, int part, int b, int t, int h, int T, int C, int hs) {
    return qkv + ((size_t)b * T + t) * 3 * C + (size_t)part * C + (size_t)h * hs;
}

__device__ inline float v3_dot(const floatX* x, const floatX* y, int hs) {
    float s = 0.0f;
    for (int i = 0; i < hs; i++) s += (float)x[i] * (float)y[i];
    return s;
}

// per query row: lse = log sum exp of its scaled scores (online softmax), D = dout . out
__global__ void attention_backward_v3_prepare(float* lse, float* D, const floatX* qkv, const floatX* out,
                                              const floatX* dout, int B, int T, int C, int NH) {
    int lane = threadIdx.x % 32;
    size_t row = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= (size_t)B * NH * T) return;
    int t = (int)(row % T), h = (int)((row / T) % NH), b = (int)(row / ((size_t)T * NH));
    int hs = C / NH;
    float scale = rsqrtf((float)hs);
    const floatX* q = v3_row(qkv, 0, b, t, h, T, C, hs);
    float m = -INFINITY, sum = 0.0f;
    for (int chunk = 0; chunk <= t; chunk += 32) {
        int t2 = chunk + lane;
        float s = t2 <= t ? v3_dot(q, v3_row(qkv, 1, b, t2, h, T, C, hs), hs) * scale : -INFINITY;
        float m_new = fmaxf(m, warp_max(s));
        sum = sum * expf(m - m_new) + warp_sum(t2 <= t ? expf(s - m_new) : 0.0f);
        m = m_new;
    }
    const floatX* o = out + ((size_t)b * T + t) * C + (size_t)h * hs;
    const floatX* dy = dout + ((size_t)b * T + t) * C + (size_t)h * hs;
    float d = 0.0f;
    for (int i = lane; i < hs; i += 32) d += (float)dy[i] * (float)o[i];
    d = warp_sum(d);
    if (lane == 0) {
        lse[row] = m + logf(sum);
        D[row] = d;
    }
}

// one warp per query row t: dq = sum over keys t2 <= t of ds k_t2, ds = p (dout.v_t2 - D) / sqrt(hs)
__global__ void attention_backward_v3_dq(floatX* dqkv, const float* lse, const float* D, const floatX* qkv,
                                         const floatX* dout, int B, int T, int C, int NH) {
    int lane = threadIdx.x % 32;
    size_t row = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= (size_t)B * NH * T) return;
    int t = (int)(row % T), h = (int)((row / T) % NH), b = (int)(row / ((size_t)T * NH));
    int hs = C / NH;
    float scale = rsqrtf((float)hs);
    const floatX* q = v3_row(qkv, 0, b, t, h, T, C, hs);
    const floatX* dy = dout + ((size_t)b * T + t) * C + (size_t)h * hs;
    float acc[V3_MAX_HS / 32] = {0};
    for (int chunk = 0; chunk <= t; chunk += 32) {
        int t2 = chunk + lane;  // each lane scores one key of the chunk
        float ds = 0.0f;
        if (t2 <= t) {
            float p = expf(v3_dot(q, v3_row(qkv, 1, b, t2, h, T, C, hs), hs) * scale - lse[row]);
            ds = p * (v3_dot(dy, v3_row(qkv, 2, b, t2, h, T, C, hs), hs) - D[row]) * scale;
        }
        int valid = min(32, t - chunk + 1);
        for (int j = 0; j < valid; j++) {
            float dsj = __shfl_sync(0xffffffff, ds, j);
            const floatX* k = v3_row(qkv, 1, b, chunk + j, h, T, C, hs);
            #pragma unroll
            for (int a = 0; a < V3_MAX_HS / 32; a++) {
                int i = lane + 32 * a;
                if (i < hs) acc[a] += dsj * (float)k[i];
            }
        }
    }
    floatX* dq = dqkv + ((size_t)b * T + t) * 3 * C + (size_t)h * hs;
    #pragma unroll
    for (int a = 0; a < V3_MAX_HS / 32; a++) {
        int i = lane + 32 * a;
        if (i < hs) dq[i] = (floatX)acc[a];
    }
}

// one warp per key row t2: dk = sum over queries t >= t2 of ds q_t, dv = sum of p dout_t
__global__ void attention_backward_v3_dkdv(floatX* dqkv, const float* lse, const float* D, const floatX* qkv,
                                           const floatX* dout, int B, int T, int C, int NH) {
    int lane = threadIdx.x % 32;
    size_t row = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;  // (b, h, t2)
    if (row >= (size_t)B * NH * T) return;
    int t2 = (int)(row % T), h = (int)((row / T) % NH), b = (int)(row / ((size_t)T * NH));
    int hs = C / NH;
    float scale = rsqrtf((float)hs);
    size_t head = row - t2;  // the (b, h, 0) row: lse and D of query t are at head + t
    const floatX* k = v3_row(qkv, 1, b, t2, h, T, C, hs);
    const floatX* v = v3_row(qkv, 2, b, t2, h, T, C, hs);
    float dk[V3_MAX_HS / 32] = {0}, dv[V3_MAX_HS / 32] = {0};
    for (int chunk = t2; chunk < T; chunk += 32) {
        int t = chunk + lane;  // each lane takes one query of the chunk
        float p = 0.0f, ds = 0.0f;
        if (t < T) {
            const floatX* dy = dout + ((size_t)b * T + t) * C + (size_t)h * hs;
            p = expf(v3_dot(v3_row(qkv, 0, b, t, h, T, C, hs), k, hs) * scale - lse[head + t]);
            ds = p * (v3_dot(dy, v, hs) - D[head + t]) * scale;
        }
        int valid = min(32, T - chunk);
        for (int j = 0; j < valid; j++) {
            float pj = __shfl_sync(0xffffffff, p, j), dsj = __shfl_sync(0xffffffff, ds, j);
            const floatX* q = v3_row(qkv, 0, b, chunk + j, h, T, C, hs);
            const floatX* dy = dout + ((size_t)b * T + chunk + j) * C + (size_t)h * hs;
            #pragma unroll
            for (int a = 0; a < V3_MAX_HS / 32; a++) {
                int i = lane + 32 * a;
                if (i < hs) {
                    dk[a] += dsj * (float)q[i];
                    dv[a] += pj * (float)dy[i];
                }
            }
        }
    }
    floatX* out_k = dqkv + ((size_t)b * T + t2) * 3 * C + C + (size_t)h * hs;
    #pragma unroll
    for (int a = 0; a < V3_MAX_HS / 32; a++) {
        int i = lane + 32 * a;
        if (i < hs) {
            out_k[i] = (floatX)dk[a];
            out_k[C + i] = (floatX)dv[a];
        }
    }
}

static void attention_backward_v3(floatX* dqkv, float* lse, float* D, const floatX* dout, const floatX* qkv,
                                  const floatX* out, int B, int T, int C, int NH) {
    size_t rows = (size_t)B * NH * T;
    attention_backward_v3_prepare<<<ceil_div(rows, 8), 256>>>(lse, D, qkv, out, dout, B, T, C, NH);
    attention_backward_v3_dq<<<ceil_div(rows, 8), 256>>>(dqkv, lse, D, qkv, dout, B, T, C, NH);
    attention_backward_v3_dkdv<<<ceil_div(rows, 8), 256>>>(dqkv, lse, D, qkv, dout, B, T, C, NH);
    cudaCheckLaunch();
}

#if defined(LLMC_WGMMA) && !FLOATX_IS_FLOAT
static void attention_backward_flash_wgmma(floatX* dqkv, const floatX* dout, const floatX* qkv, const floatX* out,
                                           const float* lse, int B, int T, int C, int NH) {
    float* D = (float*)scratch_get(&flash_scratch, flash_scratch_bytes(B, T, NH));
    attention_row_dot(D, dout, out, B, T, C, NH);
    dim3 grid(ceil_div(T, FLASH_WG_QUERIES), B * NH);
    flash_attention_backward_dkdv_wgmma_kernel<<<grid, FLASH_WG_WARPS * 32>>>(dqkv, dout, qkv, lse, D, B, T, C, NH);
    flash_attention_backward_dq_wgmma_kernel<<<grid, FLASH_WG_WARPS * 32>>>(dqkv, dout, qkv, lse, D, B, T, C, NH);
    cudaCheckLaunch();
}
#endif

#if !FLOATX_IS_FLOAT
// v7: D, then the one kernel
static void attention_backward_flash_one_kernel(floatX* dqkv, const floatX* dout, const floatX* qkv, const floatX* out,
                                                const float* lse, int B, int T, int C, int NH) {
    float* D = (float*)scratch_get(&flash_scratch, flash_scratch_bytes(B, T, NH));
    attention_row_dot(D, dout, out, B, T, C, NH);
    int hs = C / NH;
    if (hs == 16) flash_backward_one_kernel<16>(dqkv, dout, qkv, lse, D, B, T, C, NH);
    else if (hs == 32) flash_backward_one_kernel<32>(dqkv, dout, qkv, lse, D, B, T, C, NH);
    else flash_backward_one_kernel<64>(dqkv, dout, qkv, lse, D, B, T, C, NH);
}
#endif

// run a backward again (its output still in d_dqkv from the run before): returns 1 when it gives
// the same bits as that run. (first, second: host buffers of n floatX)
template <typename F>
static int same_bits_again(const char* name, floatX* first, floatX* second, const floatX* d_dqkv, size_t n, F launch) {
    cudaCheck(cudaMemcpy(first, d_dqkv, n * sizeof(floatX), cudaMemcpyDeviceToHost));
    launch();
    cudaCheck(cudaMemcpy(second, d_dqkv, n * sizeof(floatX), cudaMemcpyDeviceToHost));
    int same = memcmp(first, second, n * sizeof(floatX)) == 0;
    printf("  %s: a second run gives %s as the first\n", name, same ? "the same bits" : "OTHER bits (FAIL)");
    return same;
}

// every variant at one shape; returns 1 when all validate
static int check(int B, int T, int C, int NH) {
    float* qkv = random_floats((size_t)B * T * 3 * C, 1.0f);
    float* dout = random_floats((size_t)B * T * C, 1.0f);
    round_like_floatX(qkv, (size_t)B * T * 3 * C);
    round_like_floatX(dout, (size_t)B * T * C);
    float* out = (float*)malloc_check((size_t)B * T * C * sizeof(float));
    float* att = (float*)malloc_check((size_t)B * NH * T * T * sizeof(float));
    float* dqkv = (float*)malloc_check((size_t)B * T * 3 * C * sizeof(float));
    cpu::attention_forward(out, att, qkv, B, T, C, NH);
    cpu::attention_backward(dqkv, dout, qkv, out, att, B, T, C, NH);

    floatX *d_qkv = to_device(qkv, (size_t)B * T * 3 * C), *d_dout = to_device(dout, (size_t)B * T * C);
    floatX* d_out = (floatX*)device_malloc((size_t)B * T * C * sizeof(floatX));
    floatX* d_att = (floatX*)device_malloc((size_t)B * NH * T * T * sizeof(floatX));
    floatX* d_dqkv = (floatX*)device_malloc((size_t)B * T * 3 * C * sizeof(floatX));
    attention_forward_cublas(d_out, d_att, d_qkv, B, T, C, NH);
    double flops = 8.0 * B * NH * (double)T * T / 2 * (C / NH);  // (the emulator reports no times)
    (void)flops;
    float tol = FLOATX_IS_FLOAT ? 1e-4f : 5e-2f;  // bf16: att itself is rounded to 8 bits
    int ok = 1;
    printf("attention_backward B=%d T=%d C=%d NH=%d (%s)\n", B, T, C, NH, PRECISION_NAME);

    size_t rows = (size_t)B * NH * T;
    float* d_dscores = (float*)scratch_get(&v1_scratch, rows * T * sizeof(float));
    attention_backward_v1_queries<<<ceil_div(rows, 8), 256>>>(d_dqkv, d_dscores, d_dout, d_qkv, d_att, B, T, C, NH);
    attention_backward_v1_keys<<<ceil_div(rows, 8), 256>>>(d_dqkv, d_dscores, d_dout, d_qkv, d_att, B, T, C, NH);
    cudaCheckLaunch();
    ok &= validate("v1 dqkv", d_dqkv, dqkv, (size_t)B * T * 3 * C, tol);
    TIME_AND_REPORT("v1 two passes", 3, flops,
                    (attention_backward_v1_queries<<<ceil_div(rows, 8), 256>>>(d_dqkv, d_dscores, d_dout, d_qkv, d_att, B, T, C, NH),
                     attention_backward_v1_keys<<<ceil_div(rows, 8), 256>>>(d_dqkv, d_dscores, d_dout, d_qkv, d_att, B, T, C, NH)));

    attention_backward_cublas(d_dqkv, d_dout, d_qkv, d_att, B, T, C, NH);
    ok &= validate("v2 dqkv", d_dqkv, dqkv, (size_t)B * T * 3 * C, tol);
    TIME_AND_REPORT("v2 cuBLAS batched", 10, flops, attention_backward_cublas(d_dqkv, d_dout, d_qkv, d_att, B, T, C, NH));

    float* d_lse = (float*)device_malloc(rows * sizeof(float));
    float* d_D = (float*)device_malloc(rows * sizeof(float));
    device_memset_zero(d_dqkv, (size_t)B * T * 3 * C * sizeof(floatX));
    attention_backward_v3(d_dqkv, d_lse, d_D, d_dout, d_qkv, d_out, B, T, C, NH);
    ok &= validate("v3 dqkv (flash)", d_dqkv, dqkv, (size_t)B * T * 3 * C, tol);
    TIME_AND_REPORT("v3 flash-style", 3, flops, attention_backward_v3(d_dqkv, d_lse, d_D, d_dout, d_qkv, d_out, B, T, C, NH));

#if FLOATX_IS_FLOAT
    printf("  v4, v5 flash           bf16 builds only\n");
#else
    attention_forward_flash_wmma(d_out, d_lse, d_qkv, B, T, C, NH);  // the lse it keeps
    device_memset_zero(d_dqkv, (size_t)B * T * 3 * C * sizeof(floatX));
    attention_backward_flash_wmma(d_dqkv, d_dout, d_qkv, d_out, d_lse, B, T, C, NH);
    ok &= validate("v4 dqkv (flash WMMA)", d_dqkv, dqkv, (size_t)B * T * 3 * C, tol);
    TIME_AND_REPORT("v4 flash (WMMA)", 10, flops, attention_backward_flash_wmma(d_dqkv, d_dout, d_qkv, d_out, d_lse, B, T, C, NH));

    attention_forward_flash(d_out, d_lse, d_qkv, B, T, C, NH);
    device_memset_zero(d_dqkv, (size_t)B * T * 3 * C * sizeof(floatX));
    attention_backward_flash(d_dqkv, d_dout, d_qkv, d_out, d_lse, B, T, C, NH);
    ok &= validate("v5 dqkv (flash mma)", d_dqkv, dqkv, (size_t)B * T * 3 * C, tol);
    TIME_AND_REPORT("v5 flash (mma.sync)", 10, flops, attention_backward_flash(d_dqkv, d_dout, d_qkv, d_out, d_lse, B, T, C, NH));
    // v7: the same products and roundings as v5, dq's sums in another order (over the key blocks,
    // 64 keys a share), so within a bf16 rounding or two of v5, much closer than to the CPU: a
    // share lost or added twice (a handover out of order on a GPU) moves dq by far more. dk and dv
    // are v5's dK dV kernel's tile by tile, the query tiles walked in the same order (from the
    // diagonal on), so they have v5's bits. A second run gives the first run's bits (a fixed order).
    size_t n = (size_t)B * T * 3 * C;
    float* v5 = (float*)malloc_check(n * sizeof(float));
    copy_device_to_floats(v5, d_dqkv, n);
    floatX *first = (floatX*)malloc_check(n * sizeof(floatX)), *second = (floatX*)malloc_check(n * sizeof(floatX));
    device_memset_zero(d_dqkv, n * sizeof(floatX));
    attention_backward_flash_one_kernel(d_dqkv, d_dout, d_qkv, d_out, d_lse, B, T, C, NH);
    ok &= validate("v7 dqkv (one kernel)", d_dqkv, dqkv, n, tol);
    ok &= validate("v7 dqkv against v5", d_dqkv, v5, n, 1e-2f);  // (bf16: 2^-8 = 4e-3 a rounding)
    float* v7 = (float*)malloc_check(n * sizeof(float));
    copy_device_to_floats(v7, d_dqkv, n);
    int dkdv_same = 1;  // each row of dqkv is (dq, dk, dv), C each
    for (size_t row = 0; row < (size_t)B * T; row++)
        dkdv_same &= !memcmp(v7 + row * 3 * C + C, v5 + row * 3 * C + C, 2 * C * sizeof(float));
    printf("  v7: dk and dv %s v5's bits\n", dkdv_same ? "have" : "differ from");
#ifdef CUDA_EMU
    ok &= dkdv_same;  // (g++ contracts both kernels' products alike; nvcc may not, so on a GPU it is reported)
#endif
    free(v5), free(v7);
    ok &= same_bits_again("v7", first, second, d_dqkv, n,
                          [&]() { attention_backward_flash_one_kernel(d_dqkv, d_dout, d_qkv, d_out, d_lse, B, T, C, NH); });
    TIME_AND_REPORT("v7 flash (one kernel)", 10, flops,
                    attention_backward_flash_one_kernel(d_dqkv, d_dout, d_qkv, d_out, d_lse, B, T, C, NH));
#if defined(LLMC_WGMMA)
    if (C / NH == 64) {
        device_memset_zero(d_dqkv, (size_t)B * T * 3 * C * sizeof(floatX));
        attention_backward_flash_wgmma(d_dqkv, d_dout, d_qkv, d_out, d_lse, B, T, C, NH);
        ok &= validate("v6 dqkv (flash wgmma)", d_dqkv, dqkv, (size_t)B * T * 3 * C, tol);
        TIME_AND_REPORT("v6 flash (wgmma)", 10, flops, attention_backward_flash_wgmma(d_dqkv, d_dout, d_qkv, d_out, d_lse, B, T, C, NH));
        // v8, v9: v6's products, roundings and order (s^T, dp^T, dv, dk; s, dp, dq), with k, v (or
        // q, dout) read by the tensor cores from shared memory instead of registers, v9's issued a
        // turn later: under the emulator the same bits as v6, a stronger check than the CPU's
        // tolerance (a tile from the wrong slot or phase, lse and D of another tile, or a product
        // of v9's given the next tile's operands, moves them); on a GPU reported
        float* v6 = (float*)malloc_check(n * sizeof(float));
        float* hopper = (float*)malloc_check(n * sizeof(float));
        copy_device_to_floats(v6, d_dqkv, n);
        for (int version = 8; version <= 9; version++) {
            const char* name = version == 8 ? "v8 flash (TMA, warp-specialized)" : "v9 flash (TMA, pingpong)";
            auto run = [&]() {
                if (version == 8) attention_backward_flash_hopper_version<8>(d_dqkv, d_dout, d_qkv, d_out, d_lse, B, T, C, NH);
                else attention_backward_flash_hopper_version<9>(d_dqkv, d_dout, d_qkv, d_out, d_lse, B, T, C, NH);
            };
            device_memset_zero(d_dqkv, n * sizeof(floatX));
            run();
            ok &= validate(name, d_dqkv, dqkv, n, tol);
            copy_device_to_floats(hopper, d_dqkv, n);
            int same_as_v6 = !memcmp(v6, hopper, n * sizeof(float));
            printf("  v%d: dqkv %s v6's bits\n", version, same_as_v6 ? "has" : "differs from");
#ifdef CUDA_EMU
            ok &= same_as_v6;
#endif
            ok &= same_bits_again(version == 8 ? "v8" : "v9", first, second, d_dqkv, n, run);
            TIME_AND_REPORT(name, 10, flops, run());
        }
        free(v6), free(hopper);
    } else {
        printf("  v6, v8, v9 (Hopper)    head size 64 only\n");
    }
#else
    printf("  v6, v8, v9 (Hopper)    sm_90a builds only (make GPU_COMPUTE_CAPABILITY=90)\n");
#endif
    free(first), free(second);
#endif
    return ok;
}

int main(void) {
    int ok = check(GPU_OR_EMU(4, 2), GPU_OR_EMU(1024, 100), GPU_OR_EMU(768, 128), GPU_OR_EMU(12, 2));
#ifdef CUDA_EMU  // head sizes 32 and 16 too (the others flash attention supports), T over three
    // tiles (the double-buffered loop's steady state) and T under one tile
    // (and head size 64 over five tiles and three blocks of 128, for v6)
    ok &= check(2, 100, 128, 4) & check(1, 200, 128, 8) & check(1, 37, 128, 2) & check(1, 300, 128, 2);
#endif
    return finish(ok);
}
