// dev/cuda's earlier flash attention (v4 of attention_forward.cu and attention_backward.cu): the
// FlashAttention-2 algorithm through WMMA, the portable tensor-core API (16 x 16 x 16 bf16 tiles,
// fp32 accumulation). WMMA fragments are opaque, so every score tile goes through shared memory
// between the products and the softmax; on an H100 this ran at 8-10 TFLOP/s, slower than cuBLAS
// attention. llmc/cuda/flash_attention.cuh replaces it with mma.sync fragments kept in registers.
//
// A block has 4 warps; a warp owns 16 rows (queries, or keys in the dK/dV kernel), so a block
// covers 64 rows and walks the other side 32 at a time. Every output element has one writer.
#ifndef DEV_CUDA_FLASH_WMMA_CUH
#define DEV_CUDA_FLASH_WMMA_CUH

#include <mma.h>
#include "llmc/cuda/flash_attention.cuh"  // the backward's D kernel is shared

#if !FLOATX_IS_FLOAT

namespace wmma = nvcuda::wmma;

#define WMMA_FLASH_WARPS 4
#define WMMA_FLASH_ROWS 16                             // rows per warp: one WMMA tile
#define WMMA_FLASH_BLOCK_ROWS (WMMA_FLASH_WARPS * WMMA_FLASH_ROWS)  // 64 rows per block
#define WMMA_FLASH_STEP 32                             // keys (or queries) per step of the inner loop
#define WMMA_FLASH_LDS (WMMA_FLASH_STEP + 4)  // row stride of score tiles in shared memory: the padding
                                    // spreads the rows the lanes read over more banks

typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, floatX, wmma::row_major> WmmaFragA;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, floatX, wmma::row_major> WmmaFragB;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, floatX, wmma::col_major> WmmaFragBT;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> WmmaWmmaFragAcc;

// 8 bf16 values: one 16-byte load or store. Rows of q, k, v and dout start at multiples of 8
// elements (C is a multiple of the head size), so every access below is 16-byte aligned.
typedef struct __align__(16) { floatX v[8]; } WmmaPack8;

// tile (rows, HS) <- rows t0.. of head h of q, k or v (part 0, 1, 2) of qkv (B, T, 3C), or of a
// (B, T, C) tensor when width == C; rows past T are zero
template <int HS>
__device__ void wmma_flash_load(floatX* tile, const floatX* x, int width, int offset, int b, int h,
                           int t0, int rows, int T) {
    for (int idx = threadIdx.x * 8; idx < rows * HS; idx += blockDim.x * 8) {
        int r = idx / HS, i = idx % HS, t = t0 + r;
        WmmaPack8 pack;
        if (t < T) pack = *(const WmmaPack8*)&x[((size_t)b * T + t) * width + offset + h * HS + i];
        else for (int j = 0; j < 8; j++) pack.v[j] = (floatX)0.0f;
        *(WmmaPack8*)&tile[idx] = pack;
    }
}

// s (16, 32), row stride WMMA_FLASH_LDS = a (16, HS) b^T, with b (32, HS) row-major (so b^T is b read
// column-major)
template <int HS>
__device__ void wmma_flash_abt(float* s, const floatX* a, const floatX* b) {
    for (int n = 0; n < WMMA_FLASH_STEP; n += 16) {
        WmmaWmmaFragAcc acc;
        wmma::fill_fragment(acc, 0.0f);
        for (int k = 0; k < HS; k += 16) {
            WmmaFragA fa;
            WmmaFragBT fb;
            wmma::load_matrix_sync(fa, a + k, HS);
            wmma::load_matrix_sync(fb, b + n * HS + k, HS);
            wmma::mma_sync(acc, fa, fb, acc);
        }
        wmma::store_matrix_sync(s + n, acc, WMMA_FLASH_LDS, wmma::mem_row_major);
    }
}

// acc (16, HS) += a (16, 32) b (32, HS), both row-major; acc as HS / 16 fragments
template <int HS>
__device__ void wmma_flash_ab(WmmaWmmaFragAcc* acc, const floatX* a, const floatX* b) {
    for (int n = 0; n < HS / 16; n++) {
        for (int k = 0; k < WMMA_FLASH_STEP; k += 16) {
            WmmaFragA fa;
            WmmaFragB fb;
            wmma::load_matrix_sync(fa, a + k, WMMA_FLASH_STEP);
            wmma::load_matrix_sync(fb, b + k * HS + n * 16, HS);
            wmma::mma_sync(acc[n], fa, fb, acc[n]);
        }
    }
}

// the warp's (16, HS) result, times scale, to rows row0.. of (B, T, width) at offset; staged
// through the warp's float buffer (16, HS)
template <int HS>
__device__ void wmma_flash_store(floatX* x, int width, int offset, const WmmaWmmaFragAcc* acc, float* stage,
                            float scale, int b, int h, int row0, int T) {
    for (int n = 0; n < HS / 16; n++) wmma::store_matrix_sync(stage + n * 16, acc[n], HS, wmma::mem_row_major);
    __syncwarp();
    for (int idx = threadIdx.x % 32; idx < WMMA_FLASH_ROWS * HS; idx += 32) {
        int r = idx / HS, i = idx % HS, t = row0 + r;
        if (t < T) x[((size_t)b * T + t) * width + offset + h * HS + i] = (floatX)(stage[idx] * scale);
    }
}

// block (query tile, b * NH + h). Lane l of a warp owns row l / 2 of the warp's 16 queries and
// half l % 2 of each step's 32 keys, and the same half of the row's output.
template <int HS>
__global__ void wmma_flash_forward_kernel(floatX* out, float* lse, const floatX* qkv, int B,
                                               int T, int C, int NH) {
    __shared__ __align__(32) floatX q[WMMA_FLASH_BLOCK_ROWS * HS];
    __shared__ __align__(32) floatX k[WMMA_FLASH_STEP * HS];
    __shared__ __align__(32) floatX v[WMMA_FLASH_STEP * HS];
    __shared__ __align__(32) float s[WMMA_FLASH_WARPS][WMMA_FLASH_ROWS * WMMA_FLASH_LDS];
    __shared__ __align__(32) floatX p[WMMA_FLASH_WARPS][WMMA_FLASH_ROWS * WMMA_FLASH_STEP];
    __shared__ __align__(32) float o[WMMA_FLASH_WARPS][WMMA_FLASH_ROWS * HS];
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, half = lane % 2;
    int b = blockIdx.y / NH, h = blockIdx.y % NH;
    int q0 = blockIdx.x * WMMA_FLASH_BLOCK_ROWS, row0 = q0 + warp * WMMA_FLASH_ROWS, t = row0 + lane / 2;
    float scale = rsqrtf((float)HS);
    float* srow = s[warp] + (lane / 2) * WMMA_FLASH_LDS + half * 16;
    floatX* prow = p[warp] + (lane / 2) * WMMA_FLASH_STEP + half * 16;
    float* orow = o[warp] + (lane / 2) * HS + half * (HS / 2);
    wmma_flash_load<HS>(q, qkv, 3 * C, 0, b, h, q0, WMMA_FLASH_BLOCK_ROWS, T);
    for (int i = 0; i < HS / 2; i++) orow[i] = 0.0f;
    float m = -INFINITY, l = 0.0f;  // running max and sum of exponentials of row t
    int keys = min(q0 + WMMA_FLASH_BLOCK_ROWS, T);  // causal: no query of the block sees a later key
    for (int k0 = 0; k0 < keys; k0 += WMMA_FLASH_STEP) {
        __syncthreads();  // every warp is done with the previous k, v
        wmma_flash_load<HS>(k, qkv, 3 * C, C, b, h, k0, WMMA_FLASH_STEP, T);
        wmma_flash_load<HS>(v, qkv, 3 * C, 2 * C, b, h, k0, WMMA_FLASH_STEP, T);
        __syncthreads();
        if (k0 > row0 + WMMA_FLASH_ROWS - 1) continue;  // every key after every query of the warp
        wmma_flash_abt<HS>(s[warp], q + warp * WMMA_FLASH_ROWS * HS, k);
        __syncwarp();
        float step_max = -INFINITY;
        for (int j = 0; j < 16; j++) {
            int key = k0 + half * 16 + j;
            if (key <= t && key < T) step_max = fmaxf(step_max, srow[j] * scale);
        }
        step_max = fmaxf(step_max, __shfl_xor_sync(0xffffffff, step_max, 1));
        float m_new = fmaxf(m, step_max);  // finite: the first step holds key 0, seen by every row
        float rescale = expf(m - m_new), sum = 0.0f;
        for (int j = 0; j < 16; j++) {
            int key = k0 + half * 16 + j;
            float pj = key <= t && key < T ? expf(srow[j] * scale - m_new) : 0.0f;
            prow[j] = (floatX)pj;
            sum += pj;
        }
        sum += __shfl_xor_sync(0xffffffff, sum, 1);
        l = l * rescale + sum;
        m = m_new;
        for (int i = 0; i < HS / 2; i++) orow[i] *= rescale;
        __syncwarp();
        WmmaWmmaFragAcc acc[HS / 16];  // o (16, HS) += p (16, 32) v (32, HS)
        for (int n = 0; n < HS / 16; n++) wmma::load_matrix_sync(acc[n], o[warp] + n * 16, HS, wmma::mem_row_major);
        wmma_flash_ab<HS>(acc, p[warp], v);
        for (int n = 0; n < HS / 16; n++) wmma::store_matrix_sync(o[warp] + n * 16, acc[n], HS, wmma::mem_row_major);
        __syncwarp();
    }
    if (t >= T) return;
    floatX* y = out + ((size_t)b * T + t) * C + h * HS + half * (HS / 2);
    for (int i = 0; i < HS / 2; i++) y[i] = (floatX)(orow[i] / l);
    if (half == 0) lse[((size_t)b * NH + h) * T + t] = m + logf(l);
}

// dK, dV: block (64 keys, b * NH + h); queries visited 32 at a time from the block's first key on.
// Warp w owns keys key0..key0+15 and accumulates, over queries u >= key:
//   dv += p^T dout,  dk += ds^T q * scale,  p^T = K_w Q^T scaled, exp'd;  dp^T = V_w dout^T
template <int HS>
__global__ void wmma_flash_backward_dkdv_kernel(floatX* dqkv, const floatX* dout,
                                                     const floatX* qkv, const float* lse,
                                                     const float* D, int B, int T, int C, int NH) {
    __shared__ __align__(32) floatX kv[2 * WMMA_FLASH_BLOCK_ROWS * HS];  // the block's k, then v; at the end, staging
    __shared__ __align__(32) floatX q[WMMA_FLASH_STEP * HS];
    __shared__ __align__(32) floatX dy[WMMA_FLASH_STEP * HS];
    __shared__ __align__(32) float s[WMMA_FLASH_WARPS][WMMA_FLASH_ROWS * WMMA_FLASH_LDS];
    __shared__ __align__(32) floatX pt[WMMA_FLASH_WARPS][WMMA_FLASH_ROWS * WMMA_FLASH_STEP];
    __shared__ __align__(32) floatX dst[WMMA_FLASH_WARPS][WMMA_FLASH_ROWS * WMMA_FLASH_STEP];
    __shared__ float lse_step[WMMA_FLASH_STEP], D_step[WMMA_FLASH_STEP];
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, half = lane % 2;
    int b = blockIdx.y / NH, h = blockIdx.y % NH;
    int block_key0 = blockIdx.x * WMMA_FLASH_BLOCK_ROWS, key0 = block_key0 + warp * WMMA_FLASH_ROWS;
    int key = key0 + lane / 2;
    float scale = rsqrtf((float)HS);
    floatX* k = kv;
    floatX* v = kv + WMMA_FLASH_BLOCK_ROWS * HS;
    wmma_flash_load<HS>(k, qkv, 3 * C, C, b, h, block_key0, WMMA_FLASH_BLOCK_ROWS, T);
    wmma_flash_load<HS>(v, qkv, 3 * C, 2 * C, b, h, block_key0, WMMA_FLASH_BLOCK_ROWS, T);
    WmmaWmmaFragAcc dk[HS / 16], dv[HS / 16];
    for (int n = 0; n < HS / 16; n++) {
        wmma::fill_fragment(dk[n], 0.0f);
        wmma::fill_fragment(dv[n], 0.0f);
    }
    float* srow = s[warp] + (lane / 2) * WMMA_FLASH_LDS + half * 16;
    floatX* ptrow = pt[warp] + (lane / 2) * WMMA_FLASH_STEP + half * 16;
    floatX* dstrow = dst[warp] + (lane / 2) * WMMA_FLASH_STEP + half * 16;
    for (int u0 = block_key0; u0 < T; u0 += WMMA_FLASH_STEP) {
        __syncthreads();  // every warp is done with the previous q, dy
        wmma_flash_load<HS>(q, qkv, 3 * C, 0, b, h, u0, WMMA_FLASH_STEP, T);
        wmma_flash_load<HS>(dy, dout, C, 0, b, h, u0, WMMA_FLASH_STEP, T);
        for (int j = threadIdx.x; j < WMMA_FLASH_STEP; j += blockDim.x) {
            int u = u0 + j;
            lse_step[j] = u < T ? lse[((size_t)b * NH + h) * T + u] : 0.0f;
            D_step[j] = u < T ? D[((size_t)b * NH + h) * T + u] : 0.0f;
        }
        __syncthreads();
        if (u0 + WMMA_FLASH_STEP - 1 < key0) continue;  // every query before every key of the warp
        int valid = 0;  // bit j: query u0 + half * 16 + j sees this lane's key
        for (int j = 0; j < 16; j++) {
            int u = u0 + half * 16 + j;
            valid |= (u >= key && u < T && key < T) << j;
        }
        float p_values[16];
        wmma_flash_abt<HS>(s[warp], k + warp * WMMA_FLASH_ROWS * HS, q);  // s^T (keys, queries)
        __syncwarp();
        for (int j = 0; j < 16; j++) {
            float lj = lse_step[half * 16 + j];
            p_values[j] = (valid >> j) & 1 ? expf(srow[j] * scale - lj) : 0.0f;
            ptrow[j] = (floatX)p_values[j];
        }
        __syncwarp();
        wmma_flash_ab<HS>(dv, pt[warp], dy);
        wmma_flash_abt<HS>(s[warp], v + warp * WMMA_FLASH_ROWS * HS, dy);  // dp^T (keys, queries)
        __syncwarp();
        for (int j = 0; j < 16; j++) dstrow[j] = (floatX)(p_values[j] * (srow[j] - D_step[half * 16 + j]));
        __syncwarp();
        wmma_flash_ab<HS>(dk, dst[warp], q);
        __syncwarp();
    }
    __syncthreads();  // k and v are no longer read: their space stages the results
    float* stage = (float*)kv + warp * WMMA_FLASH_ROWS * HS;
    wmma_flash_store<HS>(dqkv, 3 * C, C, dk, stage, scale, b, h, key0, T);
    __syncwarp();
    wmma_flash_store<HS>(dqkv, 3 * C, 2 * C, dv, stage, 1.0f, b, h, key0, T);
}

// dQ: block (64 queries, b * NH + h); keys visited 32 at a time up to the causal limit.
// Warp w owns queries row0..row0+15: dq += ds k * scale, ds = p (dp - D), dp = dout v^T
template <int HS>
__global__ void wmma_flash_backward_dq_kernel(floatX* dqkv, const floatX* dout,
                                                   const floatX* qkv, const float* lse,
                                                   const float* D, int B, int T, int C, int NH) {
    __shared__ __align__(32) floatX qdy[2 * WMMA_FLASH_BLOCK_ROWS * HS];  // the block's q, then dout; at the end, staging
    __shared__ __align__(32) floatX k[WMMA_FLASH_STEP * HS];
    __shared__ __align__(32) floatX v[WMMA_FLASH_STEP * HS];
    __shared__ __align__(32) float s[WMMA_FLASH_WARPS][WMMA_FLASH_ROWS * WMMA_FLASH_LDS];
    __shared__ __align__(32) floatX ds[WMMA_FLASH_WARPS][WMMA_FLASH_ROWS * WMMA_FLASH_STEP];
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, half = lane % 2;
    int b = blockIdx.y / NH, h = blockIdx.y % NH;
    int q0 = blockIdx.x * WMMA_FLASH_BLOCK_ROWS, row0 = q0 + warp * WMMA_FLASH_ROWS, t = row0 + lane / 2;
    float scale = rsqrtf((float)HS);
    floatX* q = qdy;
    floatX* dy = qdy + WMMA_FLASH_BLOCK_ROWS * HS;
    wmma_flash_load<HS>(q, qkv, 3 * C, 0, b, h, q0, WMMA_FLASH_BLOCK_ROWS, T);
    wmma_flash_load<HS>(dy, dout, C, 0, b, h, q0, WMMA_FLASH_BLOCK_ROWS, T);
    float lse_t = t < T ? lse[((size_t)b * NH + h) * T + t] : 0.0f;
    float D_t = t < T ? D[((size_t)b * NH + h) * T + t] : 0.0f;
    WmmaWmmaFragAcc dq[HS / 16];
    for (int n = 0; n < HS / 16; n++) wmma::fill_fragment(dq[n], 0.0f);
    float* srow = s[warp] + (lane / 2) * WMMA_FLASH_LDS + half * 16;
    floatX* dsrow = ds[warp] + (lane / 2) * WMMA_FLASH_STEP + half * 16;
    int keys = min(q0 + WMMA_FLASH_BLOCK_ROWS, T);
    for (int k0 = 0; k0 < keys; k0 += WMMA_FLASH_STEP) {
        __syncthreads();
        wmma_flash_load<HS>(k, qkv, 3 * C, C, b, h, k0, WMMA_FLASH_STEP, T);
        wmma_flash_load<HS>(v, qkv, 3 * C, 2 * C, b, h, k0, WMMA_FLASH_STEP, T);
        __syncthreads();
        if (k0 > row0 + WMMA_FLASH_ROWS - 1) continue;
        float p_values[16];
        wmma_flash_abt<HS>(s[warp], q + warp * WMMA_FLASH_ROWS * HS, k);  // scores (queries, keys)
        __syncwarp();
        for (int j = 0; j < 16; j++) {
            int key = k0 + half * 16 + j;
            p_values[j] = key <= t && t < T ? expf(srow[j] * scale - lse_t) : 0.0f;
        }
        __syncwarp();
        wmma_flash_abt<HS>(s[warp], dy + warp * WMMA_FLASH_ROWS * HS, v);  // dp (queries, keys)
        __syncwarp();
        for (int j = 0; j < 16; j++) dsrow[j] = (floatX)(p_values[j] * (srow[j] - D_t));
        __syncwarp();
        wmma_flash_ab<HS>(dq, ds[warp], k);
        __syncwarp();
    }
    __syncthreads();  // q and dout are no longer read: their space stages the result
    wmma_flash_store<HS>(dqkv, 3 * C, 0, dq, (float*)qdy + warp * WMMA_FLASH_ROWS * HS, scale, b, h, row0, T);
}

static DeviceScratch wmma_flash_scratch;

// out (B, T, C), lse (B, NH, T) from qkv (B, T, 3C)
static inline void attention_forward_flash_wmma(floatX* out, float* lse, const floatX* qkv, int B, int T,
                                           int C, int NH) {
    dim3 grid(ceil_div(T, WMMA_FLASH_BLOCK_ROWS), B * NH);
    int hs = C / NH, threads = WMMA_FLASH_WARPS * 32;
    if (hs == 16) wmma_flash_forward_kernel<16><<<grid, threads>>>(out, lse, qkv, B, T, C, NH);
    else if (hs == 32) wmma_flash_forward_kernel<32><<<grid, threads>>>(out, lse, qkv, B, T, C, NH);
    else wmma_flash_forward_kernel<64><<<grid, threads>>>(out, lse, qkv, B, T, C, NH);
    cudaCheckLaunch();
}

// dqkv (B, T, 3C) (overwritten) from dout and out (B, T, C), qkv and the forward's lse
static inline void attention_backward_flash_wmma(floatX* dqkv, const floatX* dout, const floatX* qkv,
                                            const floatX* out, const float* lse, int B, int T,
                                            int C, int NH) {
    size_t rows = (size_t)B * NH * T;
    float* D = (float*)scratch_get(&wmma_flash_scratch, rows * sizeof(float));
    attention_row_dot(D, dout, out, B, T, C, NH);
    dim3 grid(ceil_div(T, WMMA_FLASH_BLOCK_ROWS), B * NH);
    int hs = C / NH, threads = WMMA_FLASH_WARPS * 32;
    if (hs == 16) {
        wmma_flash_backward_dkdv_kernel<16><<<grid, threads>>>(dqkv, dout, qkv, lse, D, B, T, C, NH);
        wmma_flash_backward_dq_kernel<16><<<grid, threads>>>(dqkv, dout, qkv, lse, D, B, T, C, NH);
    } else if (hs == 32) {
        wmma_flash_backward_dkdv_kernel<32><<<grid, threads>>>(dqkv, dout, qkv, lse, D, B, T, C, NH);
        wmma_flash_backward_dq_kernel<32><<<grid, threads>>>(dqkv, dout, qkv, lse, D, B, T, C, NH);
    } else {
        wmma_flash_backward_dkdv_kernel<64><<<grid, threads>>>(dqkv, dout, qkv, lse, D, B, T, C, NH);
        wmma_flash_backward_dq_kernel<64><<<grid, threads>>>(dqkv, dout, qkv, lse, D, B, T, C, NH);
    }
    cudaCheckLaunch();
}

#endif  // !FLOATX_IS_FLOAT
#endif
