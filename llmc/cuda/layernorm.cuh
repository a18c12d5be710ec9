// LayerNorm (Ba, Kiros & Hinton 2016) on CUDA, fused with the residual add in the forward pass.
// One warp per row of C channels, the row in registers; statistics in fp32.
#ifndef LLMC_CUDA_LAYERNORM_CUH
#define LLMC_CUDA_LAYERNORM_CUH

#include "device.cuh"

#define LAYERNORM_EPS 1e-5f

// One warp per row of C channels, the row held in the warp's registers: lane l holds the row's
// 16-byte packs l, l + 32, l + 64, ... (LN_PACKS of them at most), so the row is read from memory
// once and the mean, the variance and the output are computed from registers. The launcher picks
// the smallest LN_PACKS that holds a row (C / PACK16 / 32, rounded up to a power of two), so
// that the loops over packs unroll and the packs stay in registers.
#define LN_MAX_PACKS 32  // a row of up to 32 * 32 packs: 8192 channels in bf16, 4096 in fp32

// one warp normalises row n of x (N, C): out = (x - mean) * rstd * weight + bias.
// When a and b are given, x = a + b is computed first and written to `residual` (fused add);
// the statistics are taken of x as stored (rounded to floatX), as the CPU backend does.
template <int LN_PACKS>
__global__ void layernorm_forward_kernel(floatX* __restrict__ residual, floatX* __restrict__ out, float* mean,
                                         float* rstd, const floatX* __restrict__ a, const floatX* __restrict__ b,
                                         const floatX* __restrict__ inp, const floatX* __restrict__ weight,
                                         const floatX* __restrict__ bias, int N, int C) {
    int warps_per_block = blockDim.x / 32, lane = threadIdx.x % 32;
    int n = blockIdx.x * warps_per_block + threadIdx.x / 32;
    if (n >= N) return;
    size_t row = (size_t)n * C;
    Pack16 x[LN_PACKS];
    float sum = 0.0f;
#pragma unroll
    for (int p = 0; p < LN_PACKS; p++) {
        int c = (lane + 32 * p) * PACK16;
        if (c >= C) break;
        if (a != NULL) {
            Pack16 pa = load16(a + row + c), pb = load16(b + row + c);
            for (int k = 0; k < PACK16; k++) x[p].v[k] = (floatX)((float)pa.v[k] + (float)pb.v[k]);
            store16(residual + row + c, x[p]);
        } else {
            x[p] = load16(inp + row + c);
        }
        for (int k = 0; k < PACK16; k++) sum += (float)x[p].v[k];
    }
    float m = warp_sum(sum) / (float)C;
    float var = 0.0f;  // from the registers, around the mean: no cancellation
#pragma unroll
    for (int p = 0; p < LN_PACKS; p++) {
        if ((lane + 32 * p) * PACK16 >= C) break;
        for (int k = 0; k < PACK16; k++) {
            float d = (float)x[p].v[k] - m;
            var += d * d;
        }
    }
    float s = rsqrtf(warp_sum(var) / (float)C + LAYERNORM_EPS);
#pragma unroll
    for (int p = 0; p < LN_PACKS; p++) {
        int c = (lane + 32 * p) * PACK16;
        if (c >= C) break;
        Pack16 w = load16(weight + c), bb = load16(bias + c), y;
        for (int k = 0; k < PACK16; k++) y.v[k] = (floatX)(((float)x[p].v[k] - m) * s * (float)w.v[k] + (float)bb.v[k]);
        store16(out + row + c, y);
    }
    if (lane == 0) {
        mean[n] = m;
        rstd[n] = s;
    }
}

// LN_PACKS for rows of C channels: the smallest power of two with 32 * LN_PACKS packs >= C / PACK16
static inline int layernorm_packs(const char* op, int C) {
    check_whole_packs(op, "C", (size_t)C);
    int packs = 1;
    while (32 * packs * PACK16 < C) packs *= 2;
    if (packs > LN_MAX_PACKS) fail("%s: C = %d channels, more than the %d a warp holds in registers", op, C, 32 * LN_MAX_PACKS * PACK16);
    return packs;
}

// a kernel templated on LN_PACKS, launched with the instance for `packs`
#define LN_LAUNCH(kernel, packs, grid, block, ...)                                   \
    switch (packs) {                                                                 \
        case 1: kernel<1><<<grid, block>>>(__VA_ARGS__); break;                      \
        case 2: kernel<2><<<grid, block>>>(__VA_ARGS__); break;                      \
        case 4: kernel<4><<<grid, block>>>(__VA_ARGS__); break;                      \
        case 8: kernel<8><<<grid, block>>>(__VA_ARGS__); break;                      \
        case 16: kernel<16><<<grid, block>>>(__VA_ARGS__); break;                    \
        default: kernel<LN_MAX_PACKS><<<grid, block>>>(__VA_ARGS__); break;          \
    }

static inline void layernorm_forward(floatX* out, float* mean, float* rstd, const floatX* inp,
                                     const floatX* weight, const floatX* bias, int N, int C) {
    int kernel_span = kernel_time_begin("layernorm forward", 0, 0);
    int packs = layernorm_packs("layernorm_forward", C);
    LN_LAUNCH(layernorm_forward_kernel, packs, ceil_div(N, 8), 256, NULL, out, mean, rstd, NULL, NULL, inp, weight,
              bias, N, C);
    cudaCheckLaunch();
    kernel_time_end(kernel_span);
}

// out (N, C) = a + b, 16 bytes per thread: a residual connection alone (a pipeline stage's last
// layer, whose next LayerNorm is on the next stage)
__global__ void residual_forward_kernel(floatX* out, const floatX* a, const floatX* b, size_t packs) {
    size_t pack = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (pack >= packs) return;
    size_t i = pack * PACK16;
    Pack16 x = load16(a + i), y = load16(b + i);
    for (int k = 0; k < PACK16; k++) x.v[k] = (floatX)((float)x.v[k] + (float)y.v[k]);
    store16(out + i, x);
}

static inline void residual_forward(floatX* out, const floatX* a, const floatX* b, int N, int C) {
    check_whole_packs("residual_forward", "C", (size_t)C);
    size_t packs = (size_t)N * C / PACK16;
    if (packs == 0) return;
    int kernel_span = kernel_time_begin("residual forward", 0, 0);
    residual_forward_kernel<<<ceil_div(packs, 256), 256>>>(out, a, b, packs);
    cudaCheckLaunch();
    kernel_time_end(kernel_span);
}

// residual (N, C) = a + b, then out = layernorm(residual), in one pass
static inline void fused_residual_layernorm_forward(floatX* residual, floatX* out, float* mean,
                                                    float* rstd, const floatX* a, const floatX* b,
                                                    const floatX* weight, const floatX* bias,
                                                    int N, int C) {
    int kernel_span = kernel_time_begin("residual + layernorm forward", 0, 0);
    int packs = layernorm_packs("fused_residual_layernorm_forward", C);
    LN_LAUNCH(layernorm_forward_kernel, packs, ceil_div(N, 8), 256, residual, out, mean, rstd, a, b, NULL, weight,
              bias, N, C);
    cudaCheckLaunch();
    kernel_time_end(kernel_span);
}

// dinp (N, C) += s * (g - mean(g) - xhat * mean(g * xhat)), g = dout * weight; one warp per row,
// in one pass over memory: the row's dout and x packs stay in registers (as in the forward pass)
// between the two sums and the output. 16-byte loads, and __restrict__ tells the compiler that
// the stores to dinp cannot change dout or inp, so it may issue the loads ahead of them.
// One warp's row n, its mean m and rstd s: dinp += its input gradient, the row's dout and x packs
// left in d and x (the lane's packs) for a caller that needs them again (the fused kernel below).
template <int LN_PACKS>
__device__ inline void layernorm_backward_row(floatX* __restrict__ dinp, const floatX* __restrict__ dout,
                                              const floatX* __restrict__ inp, const floatX* __restrict__ weight,
                                              float m, float s, int n, int C, Pack16 (&d)[LN_PACKS],
                                              Pack16 (&x)[LN_PACKS]) {
    int lane = threadIdx.x % 32;
    size_t row = (size_t)n * C;
    float g_sum = 0.0f, gx_sum = 0.0f;
#pragma unroll
    for (int p = 0; p < LN_PACKS; p++) {
        int c = (lane + 32 * p) * PACK16;
        if (c >= C) break;
        d[p] = load16(dout + row + c), x[p] = load16(inp + row + c);
        Pack16 w = load16(weight + c);
        for (int k = 0; k < PACK16; k++) {
            float g = (float)d[p].v[k] * (float)w.v[k];
            g_sum += g;
            gx_sum += g * ((float)x[p].v[k] - m) * s;
        }
    }
    float g_mean = warp_sum(g_sum) / (float)C, gx_mean = warp_sum(gx_sum) / (float)C;
#pragma unroll
    for (int p = 0; p < LN_PACKS; p++) {
        int c = (lane + 32 * p) * PACK16;
        if (c >= C) break;
        Pack16 w = load16(weight + c), di = load16(dinp + row + c);  // (weight: C values, cached)
        for (int k = 0; k < PACK16; k++) {
            float xhat = ((float)x[p].v[k] - m) * s, g = (float)d[p].v[k] * (float)w.v[k];
            di.v[k] = (floatX)((float)di.v[k] + s * (g - g_mean - xhat * gx_mean));
        }
        store16(dinp + row + c, di);
    }
}

template <int LN_PACKS>
__global__ void layernorm_backward_input_kernel(floatX* __restrict__ dinp, const floatX* __restrict__ dout,
                                                const floatX* __restrict__ inp, const floatX* __restrict__ weight,
                                                const float* mean, const float* rstd, int N, int C) {
    int n = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (n >= N) return;
    Pack16 d[LN_PACKS], x[LN_PACKS];
    layernorm_backward_row<LN_PACKS>(dinp, dout, inp, weight, mean[n], rstd[n], n, C, d, x);
}

// weight and bias gradients in two deterministic stages: block (x, y) sums rows
// y*LN_ROWS_PER_BLOCK.. for 32 lanes' packs of PACK16 channels (16-byte loads of dout and inp, a
// warp reading 512 contiguous bytes of a row) into partial (gridDim.y, 2, C); then one thread per
// channel adds the partials in order (LN_ROWS_PER_BLOCK and layernorm_scratch_bytes: llmc/target.h)
__global__ void layernorm_backward_params_partial(float* partial, const floatX* __restrict__ dout,
                                                  const floatX* __restrict__ inp, const float* mean,
                                                  const float* rstd, int N, int C) {
    int lane = threadIdx.x % 32, c = (blockIdx.x * 32 + lane) * PACK16;
    int sub = threadIdx.x / 32, subs = blockDim.x / 32;  // row groups inside the block
    __shared__ float dw_shared[8][32 * PACK16], db_shared[8][32 * PACK16];
    float dw[PACK16] = {0.0f}, db[PACK16] = {0.0f};
    int row_begin = blockIdx.y * LN_ROWS_PER_BLOCK;
    int row_end = min(row_begin + LN_ROWS_PER_BLOCK, N);
    if (c < C) {
        for (int n = row_begin + sub; n < row_end; n += subs) {
            Pack16 d = load16(dout + (size_t)n * C + c), x = load16(inp + (size_t)n * C + c);
            float m = mean[n], s = rstd[n];
            for (int k = 0; k < PACK16; k++) {
                dw[k] += (float)d.v[k] * ((float)x.v[k] - m) * s;
                db[k] += (float)d.v[k];
            }
        }
    }
    for (int k = 0; k < PACK16; k++) {
        dw_shared[sub][lane * PACK16 + k] = dw[k];
        db_shared[sub][lane * PACK16 + k] = db[k];
    }
    __syncthreads();
    if (sub == 0 && c < C) {  // the row groups added in order
        for (int j = 1; j < subs; j++) {
            for (int k = 0; k < PACK16; k++) {
                dw[k] += dw_shared[j][lane * PACK16 + k];
                db[k] += db_shared[j][lane * PACK16 + k];
            }
        }
        for (int k = 0; k < PACK16; k++) {
            partial[((size_t)blockIdx.y * 2) * C + c + k] = dw[k];
            partial[((size_t)blockIdx.y * 2 + 1) * C + c + k] = db[k];
        }
    }
}

__global__ void layernorm_backward_params_final(floatX* dweight, floatX* dbias, const float* partial,
                                                int parts, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float dw = 0.0f, db = 0.0f;
    for (int p = 0; p < parts; p++) {
        dw += partial[((size_t)p * 2) * C + c];
        db += partial[((size_t)p * 2 + 1) * C + c];
    }
    dweight[c] = (floatX)((float)dweight[c] + dw);
    dbias[c] = (floatX)((float)dbias[c] + db);
}

// The input gradient and the parameter gradients' partial sums in one pass (the default;
// dev/cuda/layernorm_backward v4). The two kernels above each read dout and inp: 2 N C elements read
// twice, a third of the backward's traffic (d12, B=64: 0.2 GB a call, 25 calls a step). Here block y
// takes rows y LN_ROWS_PER_BLOCK.., warp w its rows w, w + 8, ... of them (the partial kernel's row
// groups), and each lane adds its channels' dw = dout xhat and db = dout into registers as it goes
// (2 LN_PACKS PACK16 of them); the warps' sums then meet in shared memory in warp order and the block
// writes the same partial (parts, 2, C) as layernorm_backward_params_partial, in the same order of
// additions, for layernorm_backward_params_final. The accumulators take registers, so the kernel is
// templated on the packs a row needs (3 at C = 768, not the power of two above it), and rows of up
// to 5 packs a lane take it (1280 channels in bf16: GPT-2 124M's 768, 350M's 1024 and 774M's 1280;
// wider rows keep the two kernels). ptxas on sm_90: up to 3 packs in 128 registers, two blocks
// an SM, no spills; 4 and 5 packs spill there (52 and 260 bytes), so they run one block an SM, in
// 168 and 213 registers: 8 warps an SM whose 16-byte loads of a row (10 a lane at 5 packs, 40 KB
// an SM) are still about what the memory's latency times its bandwidth needs in flight.
#define LN_FUSED_MAX_PACKS 5
template <int LN_PACKS>
__global__ void __launch_bounds__(256, LN_PACKS <= 3 ? 2 : 1) layernorm_backward_fused_kernel(floatX* __restrict__ dinp, float* __restrict__ partial,
        const floatX* __restrict__ dout, const floatX* __restrict__ inp, const floatX* __restrict__ weight,
        const float* mean, const float* rstd, int N, int C) {
    __shared__ float block_sums[2][32 * LN_PACKS * PACK16];  // the warps' dw and db, added in warp order
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    int row_end = min((int)(blockIdx.x + 1) * LN_ROWS_PER_BLOCK, N);
    float dw[LN_PACKS][PACK16], db[LN_PACKS][PACK16];
#pragma unroll
    for (int p = 0; p < LN_PACKS; p++)
        for (int k = 0; k < PACK16; k++) dw[p][k] = db[p][k] = 0.0f;
    for (int n = blockIdx.x * LN_ROWS_PER_BLOCK + warp; n < row_end; n += warps) {
        float m = mean[n], s = rstd[n];
        Pack16 d[LN_PACKS], x[LN_PACKS];
        layernorm_backward_row<LN_PACKS>(dinp, dout, inp, weight, m, s, n, C, d, x);
#pragma unroll
        for (int p = 0; p < LN_PACKS; p++) {
            if ((lane + 32 * p) * PACK16 >= C) break;
            for (int k = 0; k < PACK16; k++) {
                dw[p][k] += (float)d[p].v[k] * ((float)x[p].v[k] - m) * s;  // (as layernorm_backward_params_partial)
                db[p][k] += (float)d[p].v[k];
            }
        }
    }
    // warp 0 writes its sums, then each warp in turn adds its own: the partial kernel's order
    for (int w = 0; w < warps; w++) {
        if (warp == w) {
#pragma unroll
            for (int p = 0; p < LN_PACKS; p++) {
                int c = (lane + 32 * p) * PACK16;
                if (c >= C) break;
                for (int k = 0; k < PACK16; k++) {
                    block_sums[0][c + k] = w == 0 ? dw[p][k] : block_sums[0][c + k] + dw[p][k];
                    block_sums[1][c + k] = w == 0 ? db[p][k] : block_sums[1][c + k] + db[p][k];
                }
            }
        }
        __syncthreads();  // this warp's sums are in before the next warp adds to them
    }
    for (int i = threadIdx.x; i < 2 * C; i += blockDim.x)
        partial[(size_t)blockIdx.x * 2 * C + i] = block_sums[i / C][i % C];
}

// the fused kernel's launch, with the instance a row of C needs; 0 (nothing launched) when the row
// is too wide for it
static inline int layernorm_backward_fused(floatX* dinp, float* partial, const floatX* dout, const floatX* inp,
                                           const floatX* weight, const float* mean, const float* rstd, int N, int C) {
    int parts = ceil_div(N, LN_ROWS_PER_BLOCK);
    switch (ceil_div(C / PACK16, 32)) {  // 16-byte packs a lane
        case 1: layernorm_backward_fused_kernel<1><<<parts, 256>>>(dinp, partial, dout, inp, weight, mean, rstd, N, C); break;
        case 2: layernorm_backward_fused_kernel<2><<<parts, 256>>>(dinp, partial, dout, inp, weight, mean, rstd, N, C); break;
        case 3: layernorm_backward_fused_kernel<3><<<parts, 256>>>(dinp, partial, dout, inp, weight, mean, rstd, N, C); break;
        case 4: layernorm_backward_fused_kernel<4><<<parts, 256>>>(dinp, partial, dout, inp, weight, mean, rstd, N, C); break;
        case LN_FUSED_MAX_PACKS:
            layernorm_backward_fused_kernel<LN_FUSED_MAX_PACKS><<<parts, 256>>>(dinp, partial, dout, inp, weight, mean, rstd, N, C);
            break;
        default: return 0;
    }
    cudaCheckLaunch();
    return 1;
}

// the fused kernel (the default; LLMC_LAYERNORM_BACKWARD=separate, read once, asks for the two
// kernels) where the row fits it. A d12 step on an H200 (2026-11-27): 25 LayerNorm backwards in
// 4.4 against 5.5 ms.
static inline int layernorm_backward_fused_asked(void) {
    static int asked = -1;
    if (asked < 0) asked = env_choice("LLMC_LAYERNORM_BACKWARD", 0) == 0;
    return asked;
}
// the calls the fused kernel took, and those whose rows were too wide
static long layernorm_fused_calls[2];

static DeviceScratch layernorm_scratch;

static inline void layernorm_backward(floatX* dinp, floatX* dweight, floatX* dbias,
                                      const floatX* dout, const floatX* inp, const floatX* weight,
                                      const float* mean, const float* rstd, int N, int C) {
    int kernel_span = kernel_time_begin("layernorm backward", 0, 0);
    int packs = layernorm_packs("layernorm_backward", C);
    int parts = ceil_div(N, LN_ROWS_PER_BLOCK);
    float* partial = (float*)scratch_get(&layernorm_scratch, layernorm_scratch_bytes(N, C));
    int fused = layernorm_backward_fused_asked() && layernorm_backward_fused(dinp, partial, dout, inp, weight, mean, rstd, N, C);
    if (layernorm_backward_fused_asked()) layernorm_fused_calls[!fused]++;
    if (!fused) {
        LN_LAUNCH(layernorm_backward_input_kernel, packs, ceil_div(N, 8), 256, dinp, dout, inp, weight, mean, rstd, N, C);
        cudaCheckLaunch();
        dim3 grid(ceil_div(C, 32 * PACK16), parts);
        layernorm_backward_params_partial<<<grid, 256>>>(partial, dout, inp, mean, rstd, N, C);
        cudaCheckLaunch();
    }
    layernorm_backward_params_final<<<ceil_div(C, 256), 256>>>(dweight, dbias, partial, parts, C);
    cudaCheckLaunch();
    kernel_time_end(kernel_span);
}

#endif
