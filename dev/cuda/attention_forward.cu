/*
Causal self-attention forward, checked against the CPU backend.
  make dev/cuda/attention_forward && ./dev/cuda/attention_forward
  (v7-v11 in sm_90a builds: make dev/cuda/attention_forward GPU_COMPUTE_CAPABILITY=90 on other GPUs;
  without a GPU: make build/emu_BF16/dev/cuda/attention_forward, CUDA_EMU_ORDER=forward and reverse)
v1: one warp per query row: scores, softmax, then att @ v, all in CUDA cores; the (T, T)
    probabilities are written to memory for the backward pass.
v2: one warp per query row with an online softmax (Milakov & Gimelshein 2018; the idea behind
    FlashAttention, Dao et al. 2022): keys are visited in chunks of 32, the running max and sum
    rescale the partial output, and no T x T matrix is ever stored; only the log-sum-exp of each
    row (B, NH, T) is kept, which is what a flash-style backward needs to recompute the scores.
v3: cuBLAS batched GEMMs for q k^T and att v on tensor cores, a softmax kernel between them
    (llmc/cuda/attention.cuh): stores the probabilities like v1, much faster. llmc's path in fp32.
v4: flash attention on tensor cores through WMMA (dev/cuda/flash_wmma.cuh, bf16 builds): v2's
    online softmax with whole tiles: a warp takes 16 queries, the block 64, keys come 32 at a
    time, q k^T and p v are 16 x 16 x 16 WMMA products; scores and outputs go through shared
    memory every step, since WMMA fragments are opaque.
v5: FlashAttention-2 with mma.sync (llmc/cuda/flash_attention.cuh at MT = 1): the score tile
    and the output stay in registers (the fragment layouts are documented, mma.cuh), k/v tiles
    of 64 come in by cp.async into padded, double-buffered shared tiles, softmax in base 2 with
    the scale folded in, only the diagonal tile masked. A warp takes 16 queries, the block 64.
v6: the same kernel at MT = 2, llmc's path in bf16: a warp takes two row tiles of 16 queries,
    the block 128 (FlashAttention-2's block). Each k/v tile loaded from memory serves twice the
    queries, and each B fragment read from shared memory feeds 4 mma instead of 2, which at
    2 mma per ldmatrix.x4 (512 bytes, 4 shared-memory wavefronts) would have left the tensor
    cores waiting on shared memory. The cost: twice the score and output registers (forward<64>
    on sm_90: 141 -> 239 per thread, so 2 blocks of 4 warps fit an SM instead of 3), and half
    as many blocks per head, fewer to spread over the SMs at small B * NH * T.
v7: the same algorithm on Hopper's warpgroup MMA (LLMC_FLASH=wgmma; sm_90a builds, head size 64;
    FlashAttention-3's first step): a warpgroup of 4 warps computes s = q k^T and o += p v for 64
    queries with wgmma, k and v read by the tensor cores straight from shared memory (wgmma's
    interleaved layout) instead of ldmatrix into registers; the softmax is v6's, per warp. 128
    queries a block in 2 warpgroups, 123 registers a thread against v6's 239 (with the copy of q
    each product reads: ptxas before CUDA 13.3 reused q's registers; llmc/cuda/flash_attention.cuh).
    On an H200 (2026-11-27, B=4, T=1024): 0.057 ms against v6's 0.054.
v8-v11: FlashAttention-3's machinery (Shah et al. 2024) on v7, one rung each (llmc/cuda/flash_hopper.cuh;
    sm_90a builds, head size 64; not yet timed on a GPU). Registers and shared memory from ptxas -v
    for sm_90a (CUDA 13.0), no spills; the tiles' 80 KB are dynamic shared memory (q 16 KB, a ring of
    4 slots of k and v, 16 KB each):
v8: TMA loads: q, k and v come in by the tensor memory accelerator (a tensor map over qkv as a
    (B T, 3C) matrix, a (64, 64) tile as 8 boxes of 64 rows x 16 bytes, which land in wgmma's
    interleaved layout) into the ring, each slot with a "full" mbarrier (the bytes landed) and an
    "empty" one (every thread done with it); q k^T reads q from shared memory too (wgmma with both
    operands by descriptor), so no q registers. Every warp computes; thread 0 also refills a slot
    once everyone is done with it. 256 threads, 96 registers, 128 B static + 80 KB dynamic.
v9: warp specialization: warpgroup 0 only loads (one thread issues the TMA copies, running ahead as
    far as the ring's "empty" barriers let it; the group gives its registers back, setmaxnreg 40),
    warpgroups 1 and 2 only compute (setmaxnreg 232), 64 queries each: a consumer waits for tiles,
    never for the other consumer. 384 threads; ptxas reports 168 registers (the cap of 65,536 / 384,
    which a kernel with setmaxnreg is compiled at), 128 B static + 80 KB dynamic.
v10: pingpong: the two consumer warpgroups take turns at the tensor cores, ordered by two named
    barriers (one waits with bar.sync, the other lets it go with bar.arrive once its own products
    are issued); a turn issues the p v of the warpgroup's previous tile and the q k^T of this one,
    so one warpgroup's softmax runs while the other's products do. 168 registers (the cap), 16
    named barriers reserved (their ids are run-time values), 128 B static + 80 KB dynamic.
v11: pingpong and, inside a warpgroup, the softmax under the product before it (FlashAttention-3
    section 3.2): a turn issues tile t's q k^T and tile t-1's p v as two commit groups, waits for
    the first only (wgmma_wait<1>) and runs tile t's softmax while the p v runs; o's rescale and
    p's rounding wait for it. 168 registers (the cap), 16 named barriers, 128 B static + 80 KB
    dynamic. (ptxas serialized the products of the first drafts: llmc/cuda/flash_hopper.cuh says
    why.) attention_forward_flash_hopper launches v11.
Roofline of the flash forwards at the GPU shape (B=4, T=1024, C=768, NH=12, causal): 4 B NH T^2 HS / 2
= 6.4 GFLOP of products (6.5 us at the H200's 989 TFLOP/s of dense bf16), and at least 3 B T C + B T C
bf16 (q, k, v read, out written) plus B NH T lse floats = 25 MB (5.3 us at 4.8 TB/s); and one exp2
a score, B NH T^2 / 2 = 25 M (6.5 us at the 3.9 T/s of the special-function units, 16 a clock an
SM, that FlashAttention-3 quotes): at head size 64 the softmax's exponentials take as long as the
products, which is why v10 and v11 overlap them.
*/
#include "common.h"
namespace cpu {
#include "llmc/cpu/attention.h"
}
#include "llmc/cuda/attention.cuh"
#include "llmc/cuda/flash_hopper.cuh"
#include "flash_wmma.cuh"

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
__global__ void attention_forward_v1(floatX* out, floatX* att, const floatX* qkv, int B, int T,
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



#define V2_MAX_HS 128  // head size up to 128: 4 output values per lane
__global__ void attention_forward_v2(floatX* out, float* lse, const floatX* qkv, int B, int T, int C, int NH) {
    int lane = threadIdx.x % 32;
    size_t row = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;  // (b, h, t)
    if (row >= (size_t)B * NH * T) return;
    int t = (int)(row % T), h = (int)((row / T) % NH), b = (int)(row / ((size_t)T * NH));
    int hs = C / NH;
    float scale = rsqrtf((float)hs);
    const floatX* q = qkv + ((size_t)b * T + t) * 3 * C + h * hs;
    float acc[V2_MAX_HS / 32];
    #pragma unroll
    for (int k = 0; k < V2_MAX_HS / 32; k++) acc[k] = 0.0f;
    float running_max = -INFINITY, running_sum = 0.0f;
    for (int chunk = 0; chunk <= t; chunk += 32) {
        int t2 = chunk + lane;
        float s = -INFINITY;
        if (t2 <= t) {  // each lane scores one key of the chunk
            const floatX* k = qkv + ((size_t)b * T + t2) * 3 * C + C + h * hs;
            s = 0.0f;
            for (int i = 0; i < hs; i++) s += (float)q[i] * (float)k[i];
            s *= scale;
        }
        float new_max = fmaxf(running_max, warp_max(s));
        float p = t2 <= t ? expf(s - new_max) : 0.0f;
        float correction = expf(running_max - new_max);  // rescales what was summed so far
        running_sum = running_sum * correction + warp_sum(p);
        running_max = new_max;
        #pragma unroll
        for (int k = 0; k < V2_MAX_HS / 32; k++) acc[k] *= correction;
        int valid = min(32, t - chunk + 1);
        for (int j = 0; j < valid; j++) {  // out += p_j v_j, lanes over the head's channels
            float pj = __shfl_sync(0xffffffff, p, j);
            const floatX* v = qkv + ((size_t)b * T + chunk + j) * 3 * C + 2 * C + h * hs;
            #pragma unroll
            for (int k = 0; k < V2_MAX_HS / 32; k++) {
                int i = lane + 32 * k;
                if (i < hs) acc[k] += pj * (float)v[i];
            }
        }
    }
    floatX* o = out + ((size_t)b * T + t) * C + h * hs;
    #pragma unroll
    for (int k = 0; k < V2_MAX_HS / 32; k++) {
        int i = lane + 32 * k;
        if (i < hs) o[i] = (floatX)(acc[k] / running_sum);
    }
    if (lane == 0) lse[row] = running_max + logf(running_sum);
}

#if !FLOATX_IS_FLOAT
// v5: llmc's flash forward kernel with one row tile per warp (MT = 1): 64-query blocks
static void attention_forward_flash_64_queries(floatX* out, float* lse, const floatX* qkv, int B, int T,
                                               int C, int NH) {
    dim3 grid(ceil_div(T, FLASH_TILE), B * NH);
    int hs = C / NH, threads = FLASH_WARPS * 32;
    if (hs == 16) flash_attention_forward_kernel<16, 1><<<grid, threads>>>(out, lse, qkv, B, T, C, NH);
    else if (hs == 32) flash_attention_forward_kernel<32, 1><<<grid, threads>>>(out, lse, qkv, B, T, C, NH);
    else flash_attention_forward_kernel<64, 1><<<grid, threads>>>(out, lse, qkv, B, T, C, NH);
    cudaCheckLaunch();
}
#endif

// the log-sum-exp (B, NH, T) of each query row's scaled scores, in double: what flash keeps
static void cpu_lse(float* lse, const float* qkv, int B, int T, int C, int NH) {
    int hs = C / NH;
    double* s = (double*)malloc_check(T * sizeof(double));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const float* q = qkv + ((size_t)b * T + t) * 3 * C + h * hs;
                double m = -INFINITY, sum = 0.0;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float* k = qkv + ((size_t)b * T + t2) * 3 * C + C + h * hs;
                    s[t2] = 0.0;
                    for (int i = 0; i < hs; i++) s[t2] += (double)q[i] * k[i];
                    s[t2] /= sqrt((double)hs);
                    m = fmax(m, s[t2]);
                }
                for (int t2 = 0; t2 <= t; t2++) sum += exp(s[t2] - m);
                lse[((size_t)b * NH + h) * T + t] = (float)(m + log(sum));
            }
    free(s);
}

#if !FLOATX_IS_FLOAT
typedef void (*FlashForward)(floatX* out, float* lse, const floatX* qkv, int B, int T, int C, int NH);

#if defined(LLMC_WGMMA)
static void attention_forward_flash_wgmma(floatX* out, float* lse, const floatX* qkv, int B, int T, int C, int NH) {
    dim3 grid(ceil_div(T, FLASH_WG_QUERIES), B * NH);
    flash_attention_forward_wgmma_kernel<<<grid, FLASH_WG_WARPS * 32>>>(out, lse, qkv, B, T, C, NH);
    cudaCheckLaunch();
}
// v8 .. v11: llmc/cuda/flash_hopper.cuh's rungs
template <int version>
static void attention_forward_flash_hopper_rung(floatX* out, float* lse, const floatX* qkv, int B, int T, int C, int NH) {
    flash_hopper_forward(version, out, lse, qkv, B, T, C, NH);
}
#endif

// one flash variant into cleared buffers (no row may pass on a value an earlier variant left):
// out against the CPU's, lse against the CPU's in double, then timed
static int check_flash(const char* name, FlashForward launch, floatX* d_out, float* d_lse, const floatX* d_qkv,
                       const float* out, const float* lse, int B, int T, int C, int NH, double flops) {
    char what[64];
    int tag = (int)strcspn(name, " ");  // "v10 ...": the version, v10
    device_memset_zero(d_out, (size_t)B * T * C * sizeof(floatX));
    device_memset_zero(d_lse, (size_t)B * NH * T * sizeof(float));
    launch(d_out, d_lse, d_qkv, B, T, C, NH);
    snprintf(what, sizeof(what), "%.*s out", tag, name);
    int ok = validate(what, d_out, out, (size_t)B * T * C, default_tolerance());
    snprintf(what, sizeof(what), "%.*s lse", tag, name);
    ok &= validate_f32(what, d_lse, lse, (size_t)B * NH * T, 1e-4f);
#ifndef CUDA_EMU  // (under the emulator a timed run repeats the validated one: the same bits, no time)
    float ms;
    TIME_KERNEL(ms, 10, launch(d_out, d_lse, d_qkv, B, T, C, NH));
    report(name, ms, 0, flops);
#endif
    (void)flops;
    return ok;
}
#endif

// every variant at one shape; returns 1 when all validate. spikes: every 64th key from key 40 on
// is 32 times larger, so that its scores pass a row's running max by more than FLASH_RESCALE_SLACK
// on a later tile (the flash forward's rescale runs there, and is skipped on the tiles between);
// with keys all alike, only the first tile rescales
static int check(int B, int T, int C, int NH, int spikes = 0) {
    float* qkv = random_floats((size_t)B * T * 3 * C, 1.0f);
    for (int t = 40; spikes && t < B * T; t += 64)
        for (int c = C; c < 2 * C; c++) qkv[(size_t)t * 3 * C + c] *= 32.0f;  // (token t of the flat B T)
    round_like_floatX(qkv, (size_t)B * T * 3 * C);
    float* out = (float*)malloc_check((size_t)B * T * C * sizeof(float));
    float* att = (float*)malloc_check((size_t)B * NH * T * T * sizeof(float));
    cpu::attention_forward(out, att, qkv, B, T, C, NH);

    floatX* d_qkv = to_device(qkv, (size_t)B * T * 3 * C);
    floatX* d_out = (floatX*)device_malloc((size_t)B * T * C * sizeof(floatX));
    floatX* d_att = (floatX*)device_malloc((size_t)B * NH * T * T * sizeof(floatX));
    float* d_lse = (float*)device_malloc((size_t)B * NH * T * sizeof(float));
    double flops = 4.0 * B * NH * (double)T * T / 2 * (C / NH);  // q k^T and att v, causal half
    float tol = default_tolerance(), ms;
    int ok = 1;
    printf("attention_forward B=%d T=%d C=%d NH=%d (%s)%s\n", B, T, C, NH, PRECISION_NAME,
           spikes ? ", spiked keys" : "");

    size_t rows = (size_t)B * NH * T;
    attention_forward_v1<<<ceil_div(rows, 8), 256>>>(d_out, d_att, d_qkv, B, T, C, NH);
    cudaCheckLaunch();
    ok &= validate("v1 out", d_out, out, (size_t)B * T * C, tol);
    ok &= validate("v1 att", d_att, att, (size_t)B * NH * T * T, tol);
    TIME_KERNEL(ms, 5, (attention_forward_v1<<<ceil_div(rows, 8), 256>>>(d_out, d_att, d_qkv, B, T, C, NH)));
    report("v1 warp per row", ms, 0, flops);

    attention_forward_v2<<<ceil_div(rows, 8), 256>>>(d_out, d_lse, d_qkv, B, T, C, NH);
    cudaCheckLaunch();
    ok &= validate("v2 out", d_out, out, (size_t)B * T * C, tol);
    TIME_KERNEL(ms, 5, (attention_forward_v2<<<ceil_div(rows, 8), 256>>>(d_out, d_lse, d_qkv, B, T, C, NH)));
    report("v2 online softmax", ms, 0, flops);

    if (spikes && !FLOATX_IS_FLOAT) {  // its scores pass through memory as bf16: 40 is off by up to 0.125
        printf("  v3 cuBLAS batched      not with spiked keys in bf16 (scores rounded before the softmax)\n");
    } else {
        attention_forward_cublas(d_out, d_att, d_qkv, B, T, C, NH);
        ok &= validate("v3 out", d_out, out, (size_t)B * T * C, tol);
        ok &= validate("v3 att", d_att, att, (size_t)B * NH * T * T, tol);
        TIME_KERNEL(ms, 10, attention_forward_cublas(d_out, d_att, d_qkv, B, T, C, NH));
        report("v3 cuBLAS batched", ms, 0, flops);
    }

#if FLOATX_IS_FLOAT
    printf("  v4, v5, v6 flash       bf16 builds only\n");
#else
    float* lse = (float*)malloc_check((size_t)B * NH * T * sizeof(float));
    cpu_lse(lse, qkv, B, T, C, NH);
    ok &= check_flash("v4 flash (WMMA)", attention_forward_flash_wmma, d_out, d_lse, d_qkv, out, lse, B, T, C, NH, flops);
    ok &= check_flash("v5 flash, 64 queries", attention_forward_flash_64_queries, d_out, d_lse, d_qkv, out, lse, B, T,
                      C, NH, flops);
    ok &= check_flash("v6 flash, 128 queries", attention_forward_flash, d_out, d_lse, d_qkv, out, lse, B, T, C, NH,
                      flops);
#if defined(LLMC_WGMMA)
    if (C / NH == 64) {
        ok &= check_flash("v7 flash, wgmma", attention_forward_flash_wgmma, d_out, d_lse, d_qkv, out, lse, B, T, C, NH,
                          flops);
        ok &= check_flash("v8 hopper, TMA ring", attention_forward_flash_hopper_rung<8>, d_out, d_lse, d_qkv, out, lse, B,
                          T, C, NH, flops);
        ok &= check_flash("v9 warp-specialized", attention_forward_flash_hopper_rung<9>, d_out, d_lse, d_qkv, out, lse, B,
                          T, C, NH, flops);
        ok &= check_flash("v10 pingpong", attention_forward_flash_hopper_rung<10>, d_out, d_lse, d_qkv, out, lse, B, T, C,
                          NH, flops);
        ok &= check_flash("v11 pingpong + overlap", attention_forward_flash_hopper_rung<11>, d_out, d_lse, d_qkv, out, lse,
                          B, T, C, NH, flops);
    } else {
        printf("  v7-v11 flash, wgmma    head size 64 only\n");
    }
#else
    printf("  v7-v11 flash, wgmma    sm_90a builds only (make GPU_COMPUTE_CAPABILITY=90)\n");
#endif
    free(lse);
#endif
    return ok;
}

int main(void) {
    int ok = check(GPU_OR_EMU(4, 2), GPU_OR_EMU(1024, 100), GPU_OR_EMU(768, 128), GPU_OR_EMU(12, 2));
#ifdef CUDA_EMU  // head sizes 32 and 16 too (the others flash attention supports), T over three
    // tiles (the double-buffered loop's steady state) and T under one tile
    // (and head size 64 over five tiles and three blocks of 128 queries, for v7-v11: the fifth
    // tile refills the first slot of v8-v11's 4-slot ring; T = 37, one warpgroup with no queries)
    ok &= check(2, 100, 128, 4) & check(1, 200, 128, 8) & check(1, 37, 128, 2) & check(1, 300, 128, 2);
    ok &= check(2, 300, 128, 2, 1);  // the rescale taken on later tiles, and skipped
#else
    ok &= check(1, 1024, 768, 12, 1);
#endif
    return finish(ok);
}
