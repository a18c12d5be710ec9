// Attention in blocks of keys, for context parallelism (llmc/context_parallel.h), on CUDA: the
// same launchers and the same math as llmc/cpu/ring_attention.h (read that file first), in two
// versions (dev/cuda/ring_attention.cu checks both against the CPU and times them):
//   plain  one thread per query row (forward, dq) or key row (dk, dv), its head's hs values in
//          registers and fp32 sums: any precision and head size, at every tile case
//   flash  flash_attention.cuh's tensor-core kernels (FlashAttention-2) on one pair of chunks at
//          a time, bf16 builds with head sizes 16, 32, 64: what a long sequence needs on a GPU
//   fa3    the same pairs on Hopper's machinery (TMA, mbarriers, wgmma, warp specialization:
//          flash_hopper.cuh's forward, flash_hopper_backward.cuh's backward), sm_90a builds with
//          head size 64, when LLMC_FLASH=fa3 asks for it
// The launchers at the end pick fa3 where asked and built, else flash where it is built, plain
// elsewhere.
#ifndef LLMC_CUDA_RING_ATTENTION_CUH
#define LLMC_CUDA_RING_ATTENTION_CUH

#include "device.cuh"
#include "flash_attention.cuh"
#include "attention.cuh"  // (flash_fa3_asked, and flash_hopper*.cuh: the fa3 kernels below)
#include "../cp_layout.h"


// kv (B, T, 2C) = the keys and values of qkv (B, T, 3C)
__global__ void kv_pack_kernel(floatX* kv, const floatX* qkv, size_t BT, int C) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;  // over (token, 2C)
    if (idx >= BT * 2 * C) return;
    size_t token = idx / (2 * C), j = idx % (2 * C);
    kv[idx] = qkv[token * 3 * C + C + j];
}
static inline void kv_pack(floatX* kv, const floatX* qkv, int B, int T, int C) {
    int kernel_span = kernel_time_begin("ring attention: pack k,v", 0, 0);
    size_t n = (size_t)B * T * 2 * C;
    kv_pack_kernel<<<ceil_div(n, 256), 256>>>(kv, qkv, (size_t)B * T, C);
    cudaCheckLaunch();
    kernel_time_end(kernel_span);
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
static inline void attention_block_forward_plain(float* o, float* lse, const floatX* qkv, const floatX* kv, CpChunks q,
                                                 CpChunks k, int B, int C, int NH, int first) {
    size_t n = (size_t)B * NH * q.n * q.len;
    attention_block_forward_kernel<<<ceil_div(n, 128), 128>>>(o, lse, qkv, kv, q, k, B, C, NH, first);
    cudaCheckLaunch();
}

// D (B, NH, Tq) = per head, the sum of datty * atty (the kernel the flash backward uses)
static inline void attention_block_backward_prepare(float* D, const floatX* datty, const floatX* atty, int B, int Tq,
                                                    int C, int NH) {
    int kernel_span = kernel_time_begin("ring attention: backward's D", 0, 0);
    attention_row_dot(D, datty, atty, B, Tq, C, NH);
    kernel_time_end(kernel_span);
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

static inline void attention_block_backward_plain(float* dq, float* dkv, const floatX* datty, const float* lse,
                                                  const float* D, const floatX* qkv, const floatX* kv, CpChunks q,
                                                  CpChunks k, int B, int C, int NH) {
    size_t nq = (size_t)B * NH * q.n * q.len, nk = (size_t)B * NH * k.n * k.len;
    attention_block_dq_kernel<<<ceil_div(nq, 128), 128>>>(dq, datty, lse, D, qkv, kv, q, k, B, C, NH);
    cudaCheckLaunch();
    attention_block_dkv_kernel<<<ceil_div(nk, 128), 128>>>(dkv, datty, lse, D, qkv, kv, q, k, B, C, NH);
    cudaCheckLaunch();
}

// ---------------------------------------------------------------------------------------------
// flash: the tensor-core kernels on one chunk pair. A rank's queries and a block's keys are
// chunks of one length `len` (cp_layout.h), and a pair of them is masked (skipped), whole (every
// key before every query: attention without a mask) or diagonal (the same positions: causal
// attention inside the chunk, flash_attention.cuh's very case). So each kernel below is the
// FlashAttention-2 kernel of that file it is named after, with three changes: its rows are the
// pair's (the query chunk from row q0row of the rank's Tq, the key chunk from row k0row of the
// block's Tk; flash_load_async), `causal` says diagonal or whole, and its results are fp32
// and accumulate across blocks: the forward merges its (o, lse) into what earlier blocks left
// by the log-sum-exp rule, dq and dk, dv add to theirs. Read flash_attention.cuh first: the
// comments here are on what differs.

#if !FLOATX_IS_FLOAT

static inline int ring_flash_supports(int hs) { return hs == 16 || hs == 32 || hs == 64; }

// the merge, in fp32 (attention_block_forward's rule), of a warp's 16 rows row0.. of the query
// chunk (those < len): this pair's lse_b = ln 2 (m + log2 l) and unnormalized output acc (mma's D
// layout, l this lane's part of the row sum), against the rows' lse and o so far. Each element of
// o has one writer, and the merged lse goes to lse_new (lane t = 0 of the row's four)
template <int HS>
__device__ inline void ring_flash_merge(float* o, float* lse_new, const float* lse, const float (*acc)[4], const float* m,
                                        float* l, int b, int h, int row0, int len, int q0row, int Tq, int C, int NH,
                                        int init) {
    int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffff, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffff, l[r], 2);
        int row = row0 + g + 8 * r;
        if (row >= len) continue;
        size_t at = ((size_t)b * NH + h) * Tq + q0row + row;
        float lse_b = (m[r] + log2f(l[r])) / FLASH_LOG2E;
        float merged = init ? lse_b : fmaxf(lse[at], lse_b) + log1pf(expf(-fabsf(lse[at] - lse_b)));
        float keep = init ? 0.0f : expf(lse[at] - merged), add = expf(lse_b - merged) / l[r];
        float* dst = o + ((size_t)b * Tq + q0row + row) * C + h * HS + 2 * t;
        for (int d = 0; d < HS / 8; d++) {
            for (int e = 0; e < 2; e++) {
                float before = init ? 0.0f : dst[8 * d + e] * keep;  // (init: o holds no number yet)
                dst[8 * d + e] = before + acc[d][2 * r + e] * add;
            }
        }
        if (t == 0) lse_new[at] = merged;
    }
}

// o (B, Tq, C) and lse (B, NH, Tq) fp32 merged with this pair's attention: block (128 queries
// of the chunk, MT = 2 row tiles per warp as the library's forward, b * NH + h). The merged lse
// goes to lse_new, not lse: the 4 lanes that hold a row each read its old lse (for their columns
// of o), in no promised order, and ring_lse_update copies it over once the kernel is done. init:
// the chunk's first pair, whose result is written, not merged.
template <int HS>
__global__ void __launch_bounds__(FLASH_WARPS * 32, 1)
ring_flash_forward_kernel(float* o, float* lse_new, const float* lse, const floatX* qkv, const floatX* kv, int q0row,
                          int k0row, int len, int Tq, int Tk, int C, int NH, int causal, int init) {
    const int MT = FLASH_Q_TILES;
    __shared__ __align__(16) floatX kv_s[2][2][FLASH_TILE * FLASH_LD(HS)];
    int warp = threadIdx.x / 32;
    int b = blockIdx.y / NH, h = blockIdx.y % NH;
    int q0 = (gridDim.x - 1 - blockIdx.x) * FLASH_TILE * MT, row0 = q0 + warp * FLASH_ROWS * MT;
    // diagonal: keys up to the block's last query; whole: every key of the chunk
    int keys = causal ? min(q0 + FLASH_TILE * MT, len) : len, tiles = (keys + FLASH_TILE - 1) / FLASH_TILE;
    float scale_log2 = rsqrtf((float)HS) * FLASH_LOG2E;
    // q from qkv (B, Tq, 3C); k and v from the block kv (B, Tk, 2C) at columns 0 and C
    flash_load_async<HS, FLASH_TILE * MT>(kv_s[1][0], qkv, 3 * C, 0, b, h, q0, Tq, q0row, len);
    cp_async_commit();
    flash_load_async<HS>(kv_s[0][0], kv, 2 * C, 0, b, h, 0, Tk, k0row, len);
    flash_load_async<HS>(kv_s[0][1], kv, 2 * C, C, b, h, 0, Tk, k0row, len);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    uint32_t q[MT][HS / 16][4];
    for (int mt = 0; mt < MT; mt++) flash_rows_to_a<HS>(q[mt], kv_s[1][0], warp * FLASH_ROWS * MT + mt * FLASH_ROWS);
    __syncthreads();  // every warp holds its q: kv_s[1] is free for the second k, v tile
    float acc[MT][HS / 8][4];
    float m[MT][2], l[MT][2];
    for (int mt = 0; mt < MT; mt++) {
        for (int d = 0; d < HS / 8; d++) acc[mt][d][0] = acc[mt][d][1] = acc[mt][d][2] = acc[mt][d][3] = 0.0f;
        m[mt][0] = m[mt][1] = -INFINITY;
        l[mt][0] = l[mt][1] = 0.0f;
    }
    for (int tile = 0; tile < tiles; tile++) {
        int k0 = tile * FLASH_TILE, buf = tile % 2;
        if (tile + 1 < tiles) {
            flash_load_async<HS>(kv_s[buf ^ 1][0], kv, 2 * C, 0, b, h, k0 + FLASH_TILE, Tk, k0row, len);
            flash_load_async<HS>(kv_s[buf ^ 1][1], kv, 2 * C, C, b, h, k0 + FLASH_TILE, Tk, k0row, len);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        if ((!causal || k0 <= row0 + FLASH_ROWS * MT - 1) && row0 < len) {
            float s[MT][FLASH_TILE / 8][4];
            flash_a_xt<HS, MT>(s, q, kv_s[buf][0]);
            uint32_t p[MT][FLASH_TILE / 16][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                // the library's online softmax, masked at the chunk's len keys, and on the
                // diagonal at each query's own; m finite from the first tile on: the chunk's
                // first key is in it, and every query sees it
                flash_online_softmax<HS>(s[mt], m[mt], l[mt], acc[mt], row0 + mt * FLASH_ROWS, k0, len, scale_log2, causal);
                flash_scores_to_a(p[mt], s[mt]);
            }
            flash_p_x<HS, MT>(acc, p, kv_s[buf][1]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
        ring_flash_merge<HS>(o, lse_new, lse, acc[mt], m[mt], l[mt], b, h, row0 + mt * FLASH_ROWS, len, q0row, Tq, C, NH, init);
}

// lse (B, NH, Tq) = lse_new at the len rows of a query chunk from q0row
__global__ void ring_lse_update_kernel(float* lse, const float* lse_new, int q0row, int len, int Tq, size_t n) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;  // over (b, h, row of the chunk)
    if (idx >= n) return;
    size_t at = idx / len * Tq + q0row + idx % len;
    lse[at] = lse_new[at];
}

// the warp's (16, HS) tile times scale, added to rows row0.. (< len) of a chunk from row `base`
// of (B, T, width) fp32 at column offset + h HS
template <int HS>
__device__ inline void ring_flash_add(float* x, int width, int offset, const float (*acc)[4], float scale, int b, int h,
                                      int row0, int len, int T, int base) {
    int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    for (int half = 0; half < 2; half++) {
        int row = row0 + g + 8 * half;
        if (row >= len) continue;
        float* dst = x + ((size_t)b * T + base + row) * width + offset + h * HS + 2 * t;
        for (int d = 0; d < HS / 8; d++) {
            dst[8 * d] += acc[d][2 * half] * scale;
            dst[8 * d + 1] += acc[d][2 * half + 1] * scale;
        }
    }
}

// dk, dv (added into dkv (B, Tk, 2C) fp32): block (64 keys of the key chunk, b * NH + h), walking
// the query chunk's queries that see them (diagonal: from the block's first key on; whole: all)
template <int HS>
__global__ void __launch_bounds__(FLASH_WARPS * 32, 1)
ring_flash_dkdv_kernel(float* dkv, const floatX* datty, const float* lse, const float* D, const floatX* qkv,
                       const floatX* kv, int q0row, int k0row, int len, int Tq, int Tk, int C, int NH, int causal) {
    __shared__ __align__(16) floatX q_s[2][FLASH_TILE * FLASH_LD(HS)];
    __shared__ __align__(16) floatX dy_s[2][FLASH_TILE * FLASH_LD(HS)];
    __shared__ float lse_s[2][FLASH_TILE], D_s[2][FLASH_TILE];  // lse in base 2
    int warp = threadIdx.x / 32, t = threadIdx.x % 4;  // t: the lane's place in its group (mma.cuh)
    int b = blockIdx.y / NH, h = blockIdx.y % NH;
    int block_key0 = blockIdx.x * FLASH_TILE, key0 = block_key0 + warp * FLASH_ROWS;
    int query0 = causal ? block_key0 : 0, tiles = (len - query0 + FLASH_TILE - 1) / FLASH_TILE;
    float scale = rsqrtf((float)HS), scale_log2 = scale * FLASH_LOG2E;
    const float* lse_bh = lse + ((size_t)b * NH + h) * Tq + q0row;  // the query chunk's rows
    const float* D_bh = D + ((size_t)b * NH + h) * Tq + q0row;
    flash_load_async<HS>(q_s[1], kv, 2 * C, 0, b, h, block_key0, Tk, k0row, len);
    flash_load_async<HS>(dy_s[1], kv, 2 * C, C, b, h, block_key0, Tk, k0row, len);
    flash_load_async<HS>(q_s[0], qkv, 3 * C, 0, b, h, query0, Tq, q0row, len);
    flash_load_async<HS>(dy_s[0], datty, C, 0, b, h, query0, Tq, q0row, len);
    cp_async_commit();
    flash_load_row_values(lse_s[0], lse_bh, query0, len, 0, FLASH_LOG2E);
    flash_load_row_values(D_s[0], D_bh, query0, len, FLASH_TILE);
    cp_async_wait<0>();
    __syncthreads();
    uint32_t k[HS / 16][4], v[HS / 16][4];
    flash_rows_to_a<HS>(k, q_s[1], warp * FLASH_ROWS);
    flash_rows_to_a<HS>(v, dy_s[1], warp * FLASH_ROWS);
    __syncthreads();
    float dk[HS / 8][4], dv[HS / 8][4];
    for (int d = 0; d < HS / 8; d++)
        for (int e = 0; e < 4; e++) dk[d][e] = dv[d][e] = 0.0f;
    for (int tile = 0; tile < tiles; tile++) {
        int u0 = query0 + tile * FLASH_TILE, buf = tile % 2;
        if (tile + 1 < tiles) {
            flash_load_async<HS>(q_s[buf ^ 1], qkv, 3 * C, 0, b, h, u0 + FLASH_TILE, Tq, q0row, len);
            flash_load_async<HS>(dy_s[buf ^ 1], datty, C, 0, b, h, u0 + FLASH_TILE, Tq, q0row, len);
            cp_async_commit();
            flash_load_row_values(lse_s[buf ^ 1], lse_bh, u0 + FLASH_TILE, len, 0, FLASH_LOG2E);
            flash_load_row_values(D_s[buf ^ 1], D_bh, u0 + FLASH_TILE, len, FLASH_TILE);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        float s[FLASH_TILE / 8][4];
        flash_a_xt<HS, 1>(&s, &k, q_s[buf]);
        flash_key_probabilities(s, lse_s[buf], key0, u0, len, scale_log2, causal);  // p^T
        uint32_t a[FLASH_TILE / 16][4];
        flash_scores_to_a(a, s);
        flash_p_x<HS, 1>(&dv, &a, dy_s[buf]);
        float dp[FLASH_TILE / 8][4];
        flash_a_xt<HS, 1>(&dp, &v, dy_s[buf]);
        for (int j = 0; j < FLASH_TILE / 8; j++)
            for (int e = 0; e < 4; e++) s[j][e] *= dp[j][e] - D_s[buf][8 * j + 2 * t + e % 2];
        flash_scores_to_a(a, s);
        flash_p_x<HS, 1>(&dk, &a, q_s[buf]);
        __syncthreads();
    }
    ring_flash_add<HS>(dkv, 2 * C, 0, dk, scale, b, h, key0, len, Tk, k0row);
    ring_flash_add<HS>(dkv, 2 * C, C, dv, 1.0f, b, h, key0, len, Tk, k0row);
}

// dq (added into dq (B, Tq, C) fp32): block (64 queries of the query chunk, b * NH + h), walking
// the key chunk's keys each query sees
template <int HS>
__global__ void __launch_bounds__(FLASH_WARPS * 32)
ring_flash_dq_kernel(float* dq, const floatX* datty, const float* lse, const float* D, const floatX* qkv,
                     const floatX* kv, int q0row, int k0row, int len, int Tq, int Tk, int C, int NH, int causal) {
    __shared__ __align__(16) floatX k_s[2][FLASH_TILE * FLASH_LD(HS)];
    __shared__ __align__(16) floatX v_s[2][FLASH_TILE * FLASH_LD(HS)];
    int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4;  // g: the lane's group (mma.cuh)
    int b = blockIdx.y / NH, h = blockIdx.y % NH;
    int q0 = (gridDim.x - 1 - blockIdx.x) * FLASH_TILE, row0 = q0 + warp * FLASH_ROWS;
    int keys = causal ? min(q0 + FLASH_TILE, len) : len, tiles = (keys + FLASH_TILE - 1) / FLASH_TILE;
    float scale = rsqrtf((float)HS), scale_log2 = scale * FLASH_LOG2E;
    flash_load_async<HS>(k_s[1], qkv, 3 * C, 0, b, h, q0, Tq, q0row, len);
    flash_load_async<HS>(v_s[1], datty, C, 0, b, h, q0, Tq, q0row, len);
    flash_load_async<HS>(k_s[0], kv, 2 * C, 0, b, h, 0, Tk, k0row, len);
    flash_load_async<HS>(v_s[0], kv, 2 * C, C, b, h, 0, Tk, k0row, len);
    cp_async_commit();
    float lse_log2[2], D_row[2];
    for (int r = 0; r < 2; r++) {
        int row = row0 + g + 8 * r;
        size_t at = ((size_t)b * NH + h) * Tq + q0row + row;
        lse_log2[r] = row < len ? lse[at] * FLASH_LOG2E : 0.0f;
        D_row[r] = row < len ? D[at] : 0.0f;
    }
    cp_async_wait<0>();
    __syncthreads();
    uint32_t q[HS / 16][4], dy[HS / 16][4];
    flash_rows_to_a<HS>(q, k_s[1], warp * FLASH_ROWS);
    flash_rows_to_a<HS>(dy, v_s[1], warp * FLASH_ROWS);
    __syncthreads();
    float acc[HS / 8][4];
    for (int d = 0; d < HS / 8; d++) acc[d][0] = acc[d][1] = acc[d][2] = acc[d][3] = 0.0f;
    for (int tile = 0; tile < tiles; tile++) {
        int k0 = tile * FLASH_TILE, buf = tile % 2;
        if (tile + 1 < tiles) {
            flash_load_async<HS>(k_s[buf ^ 1], kv, 2 * C, 0, b, h, k0 + FLASH_TILE, Tk, k0row, len);
            flash_load_async<HS>(v_s[buf ^ 1], kv, 2 * C, C, b, h, k0 + FLASH_TILE, Tk, k0row, len);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        float s[FLASH_TILE / 8][4];
        flash_a_xt<HS, 1>(&s, &q, k_s[buf]);
        flash_query_probabilities(s, lse_log2, row0, k0, len, scale_log2, causal);  // p
        float dp[FLASH_TILE / 8][4];
        flash_a_xt<HS, 1>(&dp, &dy, v_s[buf]);
        for (int j = 0; j < FLASH_TILE / 8; j++)
            for (int e = 0; e < 4; e++) s[j][e] *= dp[j][e] - D_row[e / 2];
        uint32_t a[FLASH_TILE / 16][4];
        flash_scores_to_a(a, s);
        flash_p_x<HS, 1>(&acc, &a, k_s[buf]);
        __syncthreads();
    }
    ring_flash_add<HS>(dq, C, 0, acc, scale, b, h, row0, len, Tq, q0row);
}

// the launchers of one pair (i, j): query chunk i's rows against key chunk j's
#define RING_FLASH_LAUNCH(kernel, grid, ...)                                                            \
    do {                                                                                                \
        if (hs == 16) kernel<16><<<grid, FLASH_WARPS * 32>>>(__VA_ARGS__);                              \
        else if (hs == 32) kernel<32><<<grid, FLASH_WARPS * 32>>>(__VA_ARGS__);                         \
        else kernel<64><<<grid, FLASH_WARPS * 32>>>(__VA_ARGS__);                                       \
        cudaCheckLaunch();                                                                              \
    } while (0)

// the forward of a block, pair by pair; first: the rank's own block (q and k the same chunks),
// each query chunk's diagonal pair first, which writes what the others then merge into
static inline void attention_block_forward_flash(float* o, float* lse, float* lse_new, const floatX* qkv, const floatX* kv,
                                                 CpChunks q, CpChunks k, int B, int C, int NH, int first) {
    int hs = C / NH, len = q.len, Tq = q.n * len, Tk = k.n * k.len;
    dim3 grid(ceil_div(len, FLASH_TILE * FLASH_Q_TILES), B * NH);
    size_t rows = (size_t)B * NH * len;
    for (int i = 0; i < q.n; i++) {
        int written = !first;  // (another block wrote these rows already)
        for (int n = 0; n < k.n; n++) {
            int j = first ? (i + n) % k.n : n;  // (first: j = i, the diagonal, comes first)
            CpTile tile = cp_tile(q.index[i], k.index[j]);
            if (tile == TILE_MASKED) continue;  // every key after every query: no work
            int causal = tile == TILE_DIAGONAL;
            RING_FLASH_LAUNCH(ring_flash_forward_kernel, grid, o, lse_new, lse, qkv, kv, i * len, j * len, len, Tq, Tk, C, NH,
                              causal, !written);
            ring_lse_update_kernel<<<ceil_div(rows, 256), 256>>>(lse, lse_new, i * len, len, Tq, rows);
            cudaCheckLaunch();
            written = 1;
        }
    }
}

// the backward of a block, pair by pair: dk, dv of key chunk j from query chunk i's queries, and
// dq of query chunk i from key chunk j's keys (pairs sharing a chunk add in launch order)
static inline void attention_block_backward_flash(float* dq, float* dkv, const floatX* datty, const float* lse,
                                                  const float* D, const floatX* qkv, const floatX* kv, CpChunks q,
                                                  CpChunks k, int B, int C, int NH) {
    int hs = C / NH, len = q.len, Tq = q.n * len, Tk = k.n * k.len;
    dim3 grid(ceil_div(len, FLASH_TILE), B * NH);
    for (int i = 0; i < q.n; i++) {
        for (int j = 0; j < k.n; j++) {
            CpTile tile = cp_tile(q.index[i], k.index[j]);
            if (tile == TILE_MASKED) continue;
            int causal = tile == TILE_DIAGONAL;
            RING_FLASH_LAUNCH(ring_flash_dkdv_kernel, grid, dkv, datty, lse, D, qkv, kv, i * len, j * len, len, Tq, Tk, C,
                              NH, causal);
            RING_FLASH_LAUNCH(ring_flash_dq_kernel, grid, dq, datty, lse, D, qkv, kv, i * len, j * len, len, Tq, Tk, C, NH,
                              causal);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// fa3: the chunk-pair kernels on Hopper's machinery (sm_90a builds, bf16, head size 64), taken
// when LLMC_FLASH=fa3 is asked (the dispatchers at the end), on the last rungs of the library's
// ladder (Shah et al. 2024, FlashAttention-3, sections 3.1-3.2):
//   forward  flash_hopper.cuh's v11: a producer warpgroup loading by TMA into a 4-slot ring of k,
//            v tiles guarded by full/empty mbarriers, two consumer warpgroups of 64 queries
//            (setmaxnreg) taking turns at the tensor cores (pingpong), tile t's softmax under tile
//            t-1's p v inside each (intra-warpgroup overlap)
//   backward flash_hopper_backward.cuh's v9: a producer warp, a 3-slot ring, two consumer
//            warpgroups in pingpong; dK dV per key block, dQ by a separate pass: every element of
//            dq and dkv has one writer, the same bits every run
// Read those files first: the comments here are on what differs, the same three changes as the
// flash kernels above:
//   rows: three tensor maps, q from qkv as (B Tq, 3C), k and v from the block kv as (B Tk, 2C),
//     dout as (B Tq, C); a chunk's row r of sequence b is map row b Tq + q0row + r (or b Tk +
//     k0row + r). A tile's rows past the chunk's len are the next chunk's (or the next sequence's,
//     or TMA's zeros past the tensor): finite values, masked as keys (key >= len) and never stored
//     as queries, their lse and D read as 0 (hopper_produce, given len for T);
//   causal: the diagonal pair masks a key after its query, a whole pair masks nothing;
//   the results are fp32 and accumulate across blocks: the forward's epilogue merges into o and
//     lse by ring_flash_merge (the merged lse to lse_new, copied over by ring_lse_update), dk, dv
//     and dq add by ring_flash_add.
// The kernels' consumer loops are the library's, shared: flash_hopper_overlap_turns (the forward's
// v11) and hopper_dkdv_turns, hopper_dq_turns (the backward's v9) take len and causal (the
// trainer's kernels pass T and 1); the producers and the epilogues are the ring's own.
// sm_90a (ptxas -v, the Makefile's flags; test/tests_ring_fa3.py checks the spills and the SASS):
//   ring_fa3_forward_kernel  168 registers (the launch bound's cap at 384 threads; setmaxnreg
//     then 40 / 232), no stack, 0 spills, no serialized wgmma; 81,920 bytes of dynamic shared
//     memory (FlashHopperTiles: 2 q tiles, a 4-slot k, v ring) and 128 static (the mbarriers);
//     16 HGMMA (q k^T and p v in each case of a turn that issues them)
//   ring_fa3_dkdv_kernel     168 registers, no stack, 0 spills; 83,456 bytes dynamic
//     (HOPPER_BWD_SHARED(9): k, v of both warpgroups, a 3-slot q, dout ring with its lse and D),
//     128 static; 16 HGMMA
//   ring_fa3_dq_kernel       168 registers, no stack, 0 spills; 83,456 bytes dynamic, 128 static;
//     12 HGMMA
// One block an SM (384 threads, 168 registers each); the turns' named barriers by a run-time id
// make ptxas reserve all 16. Not yet timed on a GPU.
#if defined(LLMC_WGMMA)

// the forward's producer (one thread): the block's two q tiles (rows q_row, q_row + 64 of the qkv
// map) announced on q_full, then key tiles 0.. of the chunk (rows k_row + 64 t of the kv map, k at
// column h 64, v at C + h 64) into the ring as its slots free up (flash_hopper_load_kv's protocol
// with a map of its own for the keys)
__device__ inline void ring_fa3_produce(FlashHopperTiles& tiles, const CUtensorMap* q_map, const CUtensorMap* kv_map,
                                        uint64_t* full, uint64_t* empty, uint64_t* q_full, int q_row, int k_row, int h,
                                        int C, int key_tiles) {
    mbarrier_arrive_expect_tx(q_full, 2 * FLASH_HOPPER_TILE_BYTES);
    for (int w = 0; w < 2; w++) flash_hopper_load_tile(tiles.q[w], q_map, h * 64, q_row + 64 * w, q_full);
    for (int t = 0; t < key_tiles; t++) {
        int slot = t % FLASH_HOPPER_STAGES;
        mbarrier_wait(&empty[slot], ((t / FLASH_HOPPER_STAGES) & 1) ^ 1);  // the slot's last tile was read
        mbarrier_arrive_expect_tx(&full[slot], 2 * FLASH_HOPPER_TILE_BYTES);
        flash_hopper_load_tile(tiles.kv[slot][0], kv_map, h * 64, k_row + t * FLASH_TILE, &full[slot]);
        flash_hopper_load_tile(tiles.kv[slot][1], kv_map, C + h * 64, k_row + t * FLASH_TILE, &full[slot]);
    }
}

// o, lse merged with a chunk pair's attention: block (128 queries of the query chunk, b * NH + h),
// warpgroup 0 the producer, 1 and 2 the consumers (queries q0 + 64 w ..); key tiles: on the
// diagonal up to the block's last query, else the whole chunk; flash_hopper_forward_overlap_kernel
// (v11) with the chunk's rows and mask, its result merged
__global__ void __launch_bounds__(384, 1)
ring_fa3_forward_kernel(float* o, float* lse_new, const float* lse, const __grid_constant__ CUtensorMap q_map,
                        const __grid_constant__ CUtensorMap kv_map, int q0row, int k0row, int len, int Tq, int Tk, int C,
                        int NH, int causal, int init) {
    extern __shared__ __align__(128) unsigned char ring_fa3_shared[];
    FlashHopperTiles& tiles = *(FlashHopperTiles*)ring_fa3_shared;
    __shared__ __align__(8) uint64_t full[FLASH_HOPPER_STAGES], empty[FLASH_HOPPER_STAGES], q_full;
    FlashHopperBlock k = flash_hopper_block(len, NH, causal);  // (the longest diagonal blocks first)
    float scale_log2 = 0.125f * FLASH_LOG2E;  // 1 / sqrt(64), in base 2
    flash_hopper_init(full, empty, &q_full, 256);
    if (threadIdx.x < 128) {  // the producer warpgroup: registers given back, one thread loads
        setmaxnreg_dec<FLASH_HOPPER_PRODUCER_REGS>();
        if (threadIdx.x == 0)
            ring_fa3_produce(tiles, &q_map, &kv_map, full, empty, &q_full, k.b * Tq + q0row + k.q0, k.b * Tk + k0row, k.h, C,
                             k.tiles);
        return;
    }
    setmaxnreg_inc<FLASH_HOPPER_CONSUMER_REGS>();
    FlashHopperRows r;
    flash_hopper_rows_init(r, threadIdx.x / 128 - 1, k);
    flash_hopper_overlap_turns(r, tiles, full, empty, &q_full, k.tiles, len, causal, scale_log2);  // v11's turns
    ring_flash_merge<64>(o, lse_new, lse, r.o, r.m, r.l, k.b, k.h, r.row0, len, q0row, Tq, C, NH, init);
}

#define RING_FA3_STAGES HOPPER_BWD_STAGES(9)  // the backward's ring (v9's: 3 slots)

// dk, dv added into dkv (B, Tk, 2C) fp32: block (128 keys of the key chunk, b * NH + h); the
// producer warp streams the query chunk's tiles (q, dout, their lse and D) from the block's first
// key on (diagonal) or from 0 (whole); consumer c owns keys block_key0 + 64 c ..
__global__ void __launch_bounds__(HOPPER_BWD_THREADS, 1)
ring_fa3_dkdv_kernel(float* dkv, const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap kv_map,
                     const __grid_constant__ CUtensorMap dout_map, const float* lse, const float* D, int q0row, int k0row,
                     int len, int Tq, int Tk, int C, int NH, int causal) {
    const int HS = 64, STAGES = RING_FA3_STAGES;
    extern __shared__ __align__(128) unsigned char ring_fa3_shared[];
    __shared__ __align__(8) uint64_t full[RING_FA3_STAGES], empty[RING_FA3_STAGES];
    HopperDkdvShared m = hopper_dkdv_shared<STAGES>(ring_fa3_shared);  // (flash_hopper_backward.cuh's layout)
    floatX *k_s = m.k, *v_s = m.v, *q_s = m.q, *dy_s = m.dy;
    float *lse_s = m.lse, *D_s = m.D;
    int group = threadIdx.x / 128, warp = threadIdx.x / 32;
    int b = blockIdx.y / NH, h = blockIdx.y % NH;
    int block_key0 = blockIdx.x * 2 * FLASH_TILE, query0 = causal ? block_key0 : 0;
    int tiles = (len - query0 + FLASH_TILE - 1) / FLASH_TILE;
    hopper_init_barriers<STAGES>(full, empty);
    if (group == 0) {
        setmaxnreg_dec<40>();
        // hopper_produce adds one row base to both: the query chunk's, with the key rows' offset
        // from it as the block's first row
        int q_row = b * Tq + q0row, k_row = b * Tk + k0row + block_key0;
        if (warp == 0)
            hopper_produce<STAGES>({k_s, &kv_map, h * HS}, {v_s, &kv_map, C + h * HS}, {q_s, &q_map, h * HS},
                                   {dy_s, &dout_map, h * HS}, q_row, k_row - q_row, query0, tiles, full, empty, lse_s, D_s,
                                   lse + ((size_t)b * NH + h) * Tq + q0row, D + ((size_t)b * NH + h) * Tq + q0row, len);
        return;
    }
    setmaxnreg_inc<232>();
    int c = group - 1, group0 = block_key0 + 64 * c, key0 = group0 + 16 * (warp % 4);
    const floatX* k_tile = k_s + c * HOPPER_TILE_ELEMS;
    const floatX* v_tile = v_s + c * HOPPER_TILE_ELEMS;
    float scale = rsqrtf((float)HS), scale_log2 = scale * FLASH_LOG2E;
    float dk[HS / 8][4], dv[HS / 8][4];
    for (int d = 0; d < HS / 8; d++)
        for (int e = 0; e < 4; e++) dk[d][e] = dv[d][e] = 0.0f;
    // v9's turns (flash_hopper_backward.cuh), over the query chunk's tiles from query0
    hopper_dkdv_turns<STAGES>(dk, dv, k_tile, v_tile, q_s, dy_s, lse_s, D_s, full, empty, c, tiles, query0, group0, key0,
                              len, causal, scale_log2);
    ring_flash_add<HS>(dkv, 2 * C, 0, dk, scale, b, h, key0, len, Tk, k0row);
    ring_flash_add<HS>(dkv, 2 * C, C, dv, 1.0f, b, h, key0, len, Tk, k0row);
}

// dq added into dq (B, Tq, C) fp32: block (128 queries of the query chunk, b * NH + h); the
// producer streams the key chunk's k, v tiles up to the block's last query (diagonal) or all
__global__ void __launch_bounds__(HOPPER_BWD_THREADS, 1)
ring_fa3_dq_kernel(float* dq, const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap kv_map,
                   const __grid_constant__ CUtensorMap dout_map, const float* lse, const float* D, int q0row, int k0row,
                   int len, int Tq, int Tk, int C, int NH, int causal) {
    const int HS = 64, STAGES = RING_FA3_STAGES;
    extern __shared__ __align__(128) unsigned char ring_fa3_shared[];
    __shared__ __align__(8) uint64_t full[RING_FA3_STAGES], empty[RING_FA3_STAGES];
    HopperDqShared m = hopper_dq_shared<STAGES>(ring_fa3_shared);
    floatX *q_s = m.q, *dy_s = m.dy, *k_s = m.k, *v_s = m.v;
    int group = threadIdx.x / 128, warp = threadIdx.x / 32;
    int b = blockIdx.y / NH, h = blockIdx.y % NH;
    int q0 = (gridDim.x - 1 - blockIdx.x) * 2 * FLASH_TILE;
    int tiles = ((causal ? min(q0 + 2 * FLASH_TILE, len) : len) + FLASH_TILE - 1) / FLASH_TILE;
    hopper_init_barriers<STAGES>(full, empty);
    if (group == 0) {  // the producer (no lse, D: the consumers hold their rows' in registers)
        setmaxnreg_dec<40>();
        int k_row = b * Tk + k0row, q_row = b * Tq + q0row + q0;
        if (warp == 0)
            hopper_produce<STAGES>({q_s, &q_map, h * HS}, {dy_s, &dout_map, h * HS}, {k_s, &kv_map, h * HS},
                                   {v_s, &kv_map, C + h * HS}, k_row, q_row - k_row, 0, tiles, full, empty, NULL, NULL,
                                   NULL, NULL, len);
        return;
    }
    setmaxnreg_inc<232>();
    int c = group - 1, group0 = q0 + 64 * c, row0 = group0 + 16 * (warp % 4), g = threadIdx.x % 32 / 4;
    const floatX* q_tile = q_s + c * HOPPER_TILE_ELEMS;
    const floatX* dy_tile = dy_s + c * HOPPER_TILE_ELEMS;
    float scale = rsqrtf((float)HS), scale_log2 = scale * FLASH_LOG2E;
    float lse_log2[2], D_row[2];  // rows g, g + 8 of the warp's 16 (0 past the chunk)
    for (int r = 0; r < 2; r++) {
        int row = row0 + g + 8 * r;
        size_t at = ((size_t)b * NH + h) * Tq + q0row + row;
        lse_log2[r] = row < len ? lse[at] * FLASH_LOG2E : 0.0f;
        D_row[r] = row < len ? D[at] : 0.0f;
    }
    float acc[HS / 8][4];
    for (int d = 0; d < HS / 8; d++) acc[d][0] = acc[d][1] = acc[d][2] = acc[d][3] = 0.0f;
    // v9's turns (flash_hopper_backward.cuh), over the key chunk's tiles
    hopper_dq_turns<STAGES>(acc, q_tile, dy_tile, k_s, v_s, lse_log2, D_row, full, empty, c, tiles, group0, row0, len, causal,
                            scale_log2);
    ring_flash_add<HS>(dq, C, 0, acc, scale, b, h, row0, len, Tq, q0row);
}

// the tensor maps of one block call: q from qkv (B Tq, 3C), k and v from kv (B Tk, 2C), dout
// (B Tq, C); boxes of (64 rows, 8 columns), a tile's column groups (flash_hopper_load_tile). They
// hold the pointers, so they are made on each call (host work only)
static inline void ring_fa3_maps(CUtensorMap* q_map, CUtensorMap* kv_map, CUtensorMap* dout_map, const floatX* qkv,
                                 const floatX* kv, const floatX* datty, int B, int Tq, int Tk, int C) {
    tma_map_2d(q_map, qkv, B * Tq, 3 * C, 3 * C, FLASH_TILE, 8);
    tma_map_2d(kv_map, kv, B * Tk, 2 * C, 2 * C, FLASH_TILE, 8);
    if (dout_map != NULL) tma_map_2d(dout_map, datty, B * Tq, C, C, FLASH_TILE, 8);
}

// attention_block_forward_flash's contract (head size 64) on the fa3 kernels
static inline void attention_block_forward_fa3(float* o, float* lse, float* lse_new, const floatX* qkv, const floatX* kv,
                                               CpChunks q, CpChunks k, int B, int C, int NH, int first) {
    int len = q.len, Tq = q.n * len, Tk = k.n * k.len, bytes = (int)sizeof(FlashHopperTiles);
    static int allowed = 0;  // (the dynamic shared memory, over 48 KB, allowed once)
    if (!allowed) cudaCheck(cudaFuncSetAttribute(ring_fa3_forward_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    allowed = 1;
    CUtensorMap q_map, kv_map;
    ring_fa3_maps(&q_map, &kv_map, NULL, qkv, kv, NULL, B, Tq, Tk, C);
    dim3 grid(ceil_div(len, FLASH_HOPPER_QUERIES), B * NH);
    size_t rows = (size_t)B * NH * len;
    for (int i = 0; i < q.n; i++) {
        int written = !first;
        for (int n = 0; n < k.n; n++) {
            int j = first ? (i + n) % k.n : n;  // (first: the diagonal first, as attention_block_forward_flash)
            CpTile tile = cp_tile(q.index[i], k.index[j]);
            if (tile == TILE_MASKED) continue;
            ring_fa3_forward_kernel<<<grid, 384, bytes>>>(o, lse_new, lse, q_map, kv_map, i * len, j * len, len, Tq, Tk, C, NH,
                                                          tile == TILE_DIAGONAL, !written);
            cudaCheckLaunch();
            ring_lse_update_kernel<<<ceil_div(rows, 256), 256>>>(lse, lse_new, i * len, len, Tq, rows);
            cudaCheckLaunch();
            written = 1;
        }
    }
}

// attention_block_backward_flash's contract (head size 64) on the fa3 kernels: pair by pair, dk,
// dv then dq, in launch order (every element one writer a kernel: deterministic)
static inline void attention_block_backward_fa3(float* dq, float* dkv, const floatX* datty, const float* lse, const float* D,
                                                const floatX* qkv, const floatX* kv, CpChunks q, CpChunks k, int B, int C,
                                                int NH) {
    int len = q.len, Tq = q.n * len, Tk = k.n * k.len, shared = HOPPER_BWD_SHARED(9);
    static int allowed = 0;
    if (!allowed) {
        cudaCheck(cudaFuncSetAttribute(ring_fa3_dkdv_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared));
        cudaCheck(cudaFuncSetAttribute(ring_fa3_dq_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared));
        allowed = 1;
    }
    CUtensorMap q_map, kv_map, dout_map;
    ring_fa3_maps(&q_map, &kv_map, &dout_map, qkv, kv, datty, B, Tq, Tk, C);
    dim3 grid(ceil_div(len, 2 * FLASH_TILE), B * NH);
    for (int i = 0; i < q.n; i++) {
        for (int j = 0; j < k.n; j++) {
            CpTile tile = cp_tile(q.index[i], k.index[j]);
            if (tile == TILE_MASKED) continue;
            int causal = tile == TILE_DIAGONAL;
            ring_fa3_dkdv_kernel<<<grid, HOPPER_BWD_THREADS, shared>>>(dkv, q_map, kv_map, dout_map, lse, D, i * len, j * len,
                                                                        len, Tq, Tk, C, NH, causal);
            cudaCheckLaunch();
            ring_fa3_dq_kernel<<<grid, HOPPER_BWD_THREADS, shared>>>(dq, q_map, kv_map, dout_map, lse, D, i * len, j * len, len,
                                                                      Tq, Tk, C, NH, causal);
            cudaCheckLaunch();
        }
    }
}
#endif  // LLMC_WGMMA

#else
static inline int ring_flash_supports(int hs) { (void)hs; return 0; }  // (fp32 builds: the plain kernels)
#endif  // !FLOATX_IS_FLOAT

// ---------------------------------------------------------------------------------------------
// The launchers the trainers call (llmc/context_parallel.h), as the CPU backend's: flash where it
// is built for the head size, plain elsewhere; with LLMC_FLASH=fa3 the fa3 kernels where the
// build is sm_90a and the head size 64. scratch (B, NH, Tq) fp32: the flash forward's merged lse,
// on its way

#if !FLOATX_IS_FLOAT
// LLMC_FLASH=fa3 asked (attention.cuh): 1 where the fa3 kernels take this call, counted in
// flash_fa3_calls as taken (paths_print), else 0, counted as fallen back to mma.sync
static inline int ring_fa3_takes(int C, int NH) {
    if (!flash_fa3_asked()) return 0;
#if defined(LLMC_WGMMA)
    if (C == 64 * NH) {
        flash_fa3_calls[0]++;
        return 1;
    }
#endif
    (void)C, (void)NH;
    flash_fa3_calls[1]++;
    return 0;
}
#endif

static inline void attention_block_forward(float* o, float* lse, float* scratch, const floatX* qkv, const floatX* kv,
                                           CpChunks q, CpChunks k, int B, int C, int NH, int first) {
    int kernel_span = kernel_time_begin("ring attention: block forward", 0, 0);
#if !FLOATX_IS_FLOAT
    if (ring_flash_supports(C / NH) && ring_fa3_takes(C, NH)) {
#if defined(LLMC_WGMMA)
        attention_block_forward_fa3(o, lse, scratch, qkv, kv, q, k, B, C, NH, first);
        kernel_time_end(kernel_span);
        return;
#endif
    }
    if (ring_flash_supports(C / NH)) {
        attention_block_forward_flash(o, lse, scratch, qkv, kv, q, k, B, C, NH, first);
        kernel_time_end(kernel_span);
        return;
    }
#endif
    (void)scratch;
    attention_block_forward_plain(o, lse, qkv, kv, q, k, B, C, NH, first);
    kernel_time_end(kernel_span);
}

static inline void attention_block_backward(float* dq, float* dkv, const floatX* datty, const float* lse,
                                            const float* D, const floatX* qkv, const floatX* kv, CpChunks q,
                                            CpChunks k, int B, int C, int NH) {
    int kernel_span = kernel_time_begin("ring attention: block backward", 0, 0);
#if !FLOATX_IS_FLOAT
    if (ring_flash_supports(C / NH) && ring_fa3_takes(C, NH)) {
#if defined(LLMC_WGMMA)
        attention_block_backward_fa3(dq, dkv, datty, lse, D, qkv, kv, q, k, B, C, NH);
        kernel_time_end(kernel_span);
        return;
#endif
    }
    if (ring_flash_supports(C / NH)) {
        attention_block_backward_flash(dq, dkv, datty, lse, D, qkv, kv, q, k, B, C, NH);
        kernel_time_end(kernel_span);
        return;
    }
#endif
    attention_block_backward_plain(dq, dkv, datty, lse, D, qkv, kv, q, k, B, C, NH);
    kernel_time_end(kernel_span);
}

// dqkv (B, T, 3C) floatX = dq (B, T, C) beside dkv (B, T, 2C), fp32
__global__ void attention_block_grads_kernel(floatX* dqkv, const float* dq, const float* dkv, size_t BT, int C) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;  // over (token, 3C)
    if (idx >= BT * 3 * C) return;
    size_t token = idx / (3 * C), j = idx % (3 * C);
    dqkv[idx] = (floatX)(j < (size_t)C ? dq[token * C + j] : dkv[token * 2 * C + j - C]);
}
static inline void attention_block_grads(floatX* dqkv, const float* dq, const float* dkv, int B, int T, int C) {
    int kernel_span = kernel_time_begin("ring attention: dq, dk, dv to dqkv", 0, 0);
    size_t n = (size_t)B * T * 3 * C;
    attention_block_grads_kernel<<<ceil_div(n, 256), 256>>>(dqkv, dq, dkv, (size_t)B * T, C);
    cudaCheckLaunch();
    kernel_time_end(kernel_span);
}

// atty = o, rounded to the activations' precision
__global__ void attention_block_output_kernel(floatX* atty, const float* o, size_t n) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < n) atty[idx] = (floatX)o[idx];
}
static inline void attention_block_output(floatX* atty, const float* o, size_t n) {
    int kernel_span = kernel_time_begin("ring attention: output", 0, 0);
    attention_block_output_kernel<<<ceil_div(n, 256), 256>>>(atty, o, n);
    cudaCheckLaunch();
    kernel_time_end(kernel_span);
}

#endif
