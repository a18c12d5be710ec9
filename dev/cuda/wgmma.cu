/*
wgmma, Hopper's warpgroup MMA (llmc/cuda/mma.cuh), alone against the CPU: the instruction under
the flash kernels' LLMC_FLASH=wgmma path. The emulator (test/cuda_emu) implements wgmma after
the PTX ISA's tables (the interleaved layout's strides, the fragments of A and D; its descriptor
holds a pointer and the strides, so the descriptor's bit encoding is checked here, on a GPU,
only); the flash kernels were developed against it. This program asks a GPU whether those tables
are the hardware's, one layout at a time, so that a wrong one is named rather than hidden in
attention's numbers.
  make dev/cuda/wgmma GPU_COMPUTE_CAPABILITY=90 && ./dev/cuda/wgmma
v1: d (64, 64) = a (64, 16) b (16, 64), B K-major (trans_b = 0: the 16 k of one n adjacent, as
    the keys of k^T in s = q k^T), strides lbo = 1024 bytes (8 k on), sbo = 128 (8 n on)
v2: the same with B MN-major (trans_b = 1: the n of one k adjacent, as v in o = p v), lbo = 128
    (8 k on), sbo = 256 (8 n on): other strides than the flash kernel's, so that swapped fields
    cannot pass by symmetry
v3: d = a b, then d += a b (scale-d 0, then 1) in one commit group
v4: A from shared memory too (wgmma_m64n64k16_ss, FlashAttention-3's q k^T: no A fragments in
    registers), K-major in the interleaved layout with lbo = 128 (8 k on) and sbo = 256 (8 m on),
    B as v1; the other reading of A's two fields is asked too
For the interleaved layout the emulator reads lbo as the stride between core matrices along k and
sbo as the one along n, for both majors, as CUTLASS's make_gmma_desc encodes them; one reading of
the PTX ISA (Triton's comments) has them the other way round for K-major. Each of v1 and v2 also
runs the same placement with the two fields swapped and says whether that matches instead, so a
GPU names the reading it follows. B's tile is 16 KB, its cells outside B hold 1000: a wrong
reading shows as a large error, not as a read past the array.
Timing (GPU only): 64 products m64n64k16 a warpgroup from one B tile, 132 x 8 blocks of 2
warpgroups, beside the same multiply-adds as mma.sync m16n8k16 (warps of 16 rows): the bf16
rate each reaches with the flash kernels' shapes.
*/
#include "common.h"
#include "llmc/cuda/mma.cuh"

#define WG_M 64
#define WG_N 64
#define WG_K 16

#if defined(LLMC_WGMMA) && !FLOATX_IS_FLOAT
#define B_TILE_BYTES 16384  // past what any reading of the strides below can reach (8.2 KB)
#define SENTINEL 1000.0f    // the tile's cells outside B: a read of one shows as an error of ~1000

// byte offset of element (k, n) of the (16, 64) B tile placed with core matrices k_stride bytes
// apart along k and n_stride apart along n (8 x 8 core matrices of 128 contiguous bytes, rows of
// 16 bytes): K-major rows are n, MN-major rows are k
__host__ __device__ inline int b_offset(int k, int n, int trans_b, int k_stride, int n_stride) {
    return trans_b ? (k % 8) * 16 + (k / 8) * k_stride + (n / 8) * n_stride + (n % 8) * 2
                   : (n % 8) * 16 + (n / 8) * n_stride + (k / 8) * k_stride + (k % 8) * 2;
}

// one warpgroup: d = a b (twice = 1: then d += a b). a (64, 16) and b (16, 64) row-major in
// global memory; b goes to shared memory placed with (k_stride, n_stride), the descriptor says
// (lbo, sbo); a goes to each warp's A fragment (16 rows)
template <int trans_b>
__global__ void __launch_bounds__(128) wgmma_check_kernel(float* d_out, const floatX* a, const floatX* b, int k_stride,
                                                         int n_stride, int lbo, int sbo, int twice) {
    __shared__ __align__(128) floatX b_s[B_TILE_BYTES / 2];
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    for (int i = threadIdx.x; i < B_TILE_BYTES / 2; i += blockDim.x) b_s[i] = (floatX)SENTINEL;
    __syncthreads();
    for (int i = threadIdx.x; i < WG_K * WG_N; i += blockDim.x) {
        int k = i / WG_N, n = i % WG_N;
        b_s[b_offset(k, n, trans_b, k_stride, n_stride) / 2] = b[i];
    }
    fence_proxy_async();  // the ordinary stores above, seen by the tensor cores
    __syncthreads();
    // A fragment of rows 16 warp..: (g, 2t..2t+1) (g+8, 2t..) (g, 2t+8..) (g+8, 2t+8..)
    const floatX* rows = a + (size_t)(16 * warp + g) * WG_K;
    uint32_t frag[4];
    frag[0] = pack_bf16x2((float)rows[2 * t], (float)rows[2 * t + 1]);
    frag[1] = pack_bf16x2((float)rows[8 * WG_K + 2 * t], (float)rows[8 * WG_K + 2 * t + 1]);
    frag[2] = pack_bf16x2((float)rows[2 * t + 8], (float)rows[2 * t + 9]);
    frag[3] = pack_bf16x2((float)rows[8 * WG_K + 2 * t + 8], (float)rows[8 * WG_K + 2 * t + 9]);
    float d[WG_N / 2];
    WgmmaDesc desc = wgmma_desc(b_s, lbo, sbo);
    wgmma_fence();
    wgmma_m64n64k16<trans_b>(d, frag, desc, 0);
    if (twice) wgmma_m64n64k16<trans_b>(d, frag, desc, 1);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_pin(d, WG_N / 2);
    for (int e = 0; e < WG_N / 2; e++) {  // D: row g + 8 (e / 2 % 2), column 8 (e / 4) + 2 t + e % 2
        int row = 16 * warp + g + 8 * (e / 2 % 2), col = 8 * (e / 4) + 2 * t + e % 2;
        d_out[row * WG_N + col] = d[e];
    }
}

// the largest |gpu - cpu| / (1 + |cpu|) of d = a b (2 a b when twice) with B placed and described
// as given
static double layout_error(int trans_b, int k_stride, int n_stride, int lbo, int sbo, int twice, const float* a,
                           const float* b, const floatX* d_a, const floatX* d_b, float* d_out) {
    static float ref[WG_M * WG_N], got[WG_M * WG_N];
    for (int m = 0; m < WG_M; m++) {
        for (int n = 0; n < WG_N; n++) {
            double s = 0.0;
            for (int k = 0; k < WG_K; k++) s += (double)a[m * WG_K + k] * b[k * WG_N + n];
            ref[m * WG_N + n] = (float)(s * (twice ? 2 : 1));
        }
    }
    device_memset_zero(d_out, sizeof(ref));
    if (trans_b) wgmma_check_kernel<1><<<1, 128>>>(d_out, d_a, d_b, k_stride, n_stride, lbo, sbo, twice);
    else wgmma_check_kernel<0><<<1, 128>>>(d_out, d_a, d_b, k_stride, n_stride, lbo, sbo, twice);
    cudaCheckLaunch();
    copy_device_to_host(got, d_out, sizeof(got));
    double worst = 0.0;
    for (int i = 0; i < WG_M * WG_N; i++) {
        double r = fabs((double)got[i] - ref[i]) / (1.0 + fabs((double)ref[i]));
        if (!(r <= worst)) worst = r;  // NaN is the worst
    }
    return worst;
}

// one layout, B placed with core matrices k_stride bytes apart along k and n_stride along n, and
// described as the emulator reads the descriptor (lbo: the k stride, sbo: the n stride, after
// CUTLASS's make_gmma_desc for the interleaved layout). Then the same placement described the
// other way round (lbo: the n stride), as one reading of the PTX ISA has it (Triton's comments):
// on a GPU exactly one of the two matches, and the second line says which.
static int check_layout(const char* name, int trans_b, int k_stride, int n_stride, int twice, const float* a,
                        const float* b, const floatX* d_a, const floatX* d_b, float* d_out) {
    // the products of bf16 values are exact in fp32 and 16 terms add with fp32 rounding: 1e-5;
    // a layout read wrongly gives errors of order 1 (or ~1000: a sentinel cell)
    double tol = 1e-5, worst = layout_error(trans_b, k_stride, n_stride, k_stride, n_stride, twice, a, b, d_a, d_b, d_out);
    int ok = worst <= tol;
    printf("  %-22s %s: worst |gpu-cpu|/(1+|cpu|) = %.2e, tolerance %.0e (lbo %d = the k stride, sbo %d)\n", name,
           ok ? "ok" : "FAIL", worst, tol, k_stride, n_stride);
    if (!twice) {
        double other = layout_error(trans_b, k_stride, n_stride, n_stride, k_stride, twice, a, b, d_a, d_b, d_out);
        printf("  %-22s the other reading (lbo %d = the n stride, sbo %d): %s\n", "", n_stride, k_stride,
               other <= tol ? "MATCHES: swap lbo and sbo in llmc/cuda's descriptors and the emulator's wgmma_b"
                            : "does not match");
    }
    return ok;
}

// v4: both operands from shared memory. A (64, 16) placed K-major with core matrices a_k_stride
// bytes apart along k and a_m_stride along m, described by (lbo, sbo); B as v1
#define A_TILE_BYTES 4096  // past what either reading of A's strides below can reach (2 KB)
__host__ __device__ inline int a_offset(int m, int k, int k_stride, int m_stride) {
    return (m % 8) * 16 + (m / 8) * m_stride + (k / 8) * k_stride + (k % 8) * 2;
}
__global__ void __launch_bounds__(128) wgmma_ss_check_kernel(float* d_out, const floatX* a, const floatX* b, int a_k_stride,
                                                            int a_m_stride, int lbo, int sbo) {
    __shared__ __align__(128) floatX a_s[A_TILE_BYTES / 2];
    __shared__ __align__(128) floatX b_s[B_TILE_BYTES / 2];
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    for (int i = threadIdx.x; i < A_TILE_BYTES / 2; i += blockDim.x) a_s[i] = (floatX)SENTINEL;
    for (int i = threadIdx.x; i < B_TILE_BYTES / 2; i += blockDim.x) b_s[i] = (floatX)SENTINEL;
    __syncthreads();
    for (int i = threadIdx.x; i < WG_M * WG_K; i += blockDim.x)
        a_s[a_offset(i / WG_K, i % WG_K, a_k_stride, a_m_stride) / 2] = a[i];
    for (int i = threadIdx.x; i < WG_K * WG_N; i += blockDim.x) b_s[b_offset(i / WG_N, i % WG_N, 0, 1024, 128) / 2] = b[i];
    fence_proxy_async();
    __syncthreads();
    float d[WG_N / 2];
    wgmma_fence();
    wgmma_m64n64k16_ss<0>(d, wgmma_desc(a_s, lbo, sbo), wgmma_desc(b_s, 1024, 128), 0);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_pin(d, WG_N / 2);
    for (int e = 0; e < WG_N / 2; e++) {
        int row = 16 * warp + g + 8 * (e / 2 % 2), col = 8 * (e / 4) + 2 * t + e % 2;
        d_out[row * WG_N + col] = d[e];
    }
}
static double ss_error(int lbo, int sbo, const float* a, const float* b, const floatX* d_a, const floatX* d_b, float* d_out) {
    static float ref[WG_M * WG_N], got[WG_M * WG_N];
    for (int m = 0; m < WG_M; m++) {
        for (int n = 0; n < WG_N; n++) {
            double s = 0.0;
            for (int k = 0; k < WG_K; k++) s += (double)a[m * WG_K + k] * b[k * WG_N + n];
            ref[m * WG_N + n] = (float)s;
        }
    }
    device_memset_zero(d_out, sizeof(ref));
    wgmma_ss_check_kernel<<<1, 128>>>(d_out, d_a, d_b, 128, 256, lbo, sbo);
    cudaCheckLaunch();
    copy_device_to_host(got, d_out, sizeof(got));
    double worst = 0.0;
    for (int i = 0; i < WG_M * WG_N; i++) {
        double r = fabs((double)got[i] - ref[i]) / (1.0 + fabs((double)ref[i]));
        if (!(r <= worst)) worst = r;
    }
    return worst;
}
static int check_ss(const float* a, const float* b, const floatX* d_a, const floatX* d_b, float* d_out) {
    double tol = 1e-5, worst = ss_error(128, 256, a, b, d_a, d_b, d_out);  // (check_layout's tolerance)
    int ok = worst <= tol;
    printf("  %-22s %s: worst |gpu-cpu|/(1+|cpu|) = %.2e, tolerance %.0e (A: lbo 128 = the k stride, sbo 256)\n",
           "v4 A in shared memory", ok ? "ok" : "FAIL", worst, tol);
    double other = ss_error(256, 128, a, b, d_a, d_b, d_out);
    printf("  %-22s the other reading of A (lbo 256 = the m stride, sbo 128): %s\n", "",
           other <= tol ? "MATCHES: swap A's lbo and sbo in the emulator's wgmma_a_shared" : "does not match");
    return ok;
}

#ifndef CUDA_EMU
// the rate: each warpgroup multiplies its registers' A by one B tile 64 times (4 commit groups of
// 16, the accumulators chained), as the flash kernel's k16 steps do
__global__ void __launch_bounds__(256) wgmma_rate_kernel(float* sink, int repeat) {
    __shared__ __align__(128) floatX b_s[WG_K * WG_N];
    for (int i = threadIdx.x; i < WG_K * WG_N; i += blockDim.x) b_s[i] = (floatX)(0.001f * (i % 7));
    fence_proxy_async();
    __syncthreads();
    uint32_t frag[4] = {threadIdx.x, threadIdx.x * 3u, threadIdx.x * 5u, threadIdx.x * 7u};
    float d[WG_N / 2] = {};
    WgmmaDesc desc = wgmma_desc(b_s, 1024, 128);
    for (int r = 0; r < repeat; r++) {
        wgmma_fence();
        for (int i = 0; i < 16; i++) wgmma_m64n64k16<0>(d, frag, desc, 1);
        wgmma_commit();
        wgmma_wait<0>();
    }
    wgmma_pin(d, WG_N / 2);
    float s = 0.0f;
    for (int e = 0; e < WG_N / 2; e++) s += d[e];
    if (s == 12345.0f) sink[0] = s;  // keeps the products alive
}
// the same multiply-adds as mma.sync: a warp's 16 rows x 64 columns are 8 m16n8k16 a k16 step
__global__ void __launch_bounds__(256) mma_rate_kernel(float* sink, int repeat) {
    uint32_t frag[4] = {threadIdx.x, threadIdx.x * 3u, threadIdx.x * 5u, threadIdx.x * 7u};
    uint32_t bfrag[2] = {threadIdx.x * 11u, threadIdx.x * 13u};
    float d[8][4] = {};
    for (int r = 0; r < repeat; r++)
        for (int i = 0; i < 16; i++)
            for (int j = 0; j < 8; j++) mma_bf16_16816(d[j], frag, bfrag);
    float s = 0.0f;
    for (int j = 0; j < 8; j++) s += d[j][0] + d[j][1] + d[j][2] + d[j][3];
    if (s == 12345.0f) sink[0] = s;
}
#endif
#endif  // LLMC_WGMMA && bf16

int main(void) {
#if !defined(LLMC_WGMMA) || FLOATX_IS_FLOAT
    printf("wgmma: nothing to check: bf16 sm_90a builds only (make dev/cuda/wgmma GPU_COMPUTE_CAPABILITY=90; the "
           "emulator's bf16 builds have it)\n");
    return 0;
#else
    float* a = random_floats(WG_M * WG_K, 1.0f);
    float* b = random_floats(WG_K * WG_N, 1.0f);
    round_like_floatX(a, WG_M * WG_K);
    round_like_floatX(b, WG_K * WG_N);
    floatX* d_a = to_device(a, WG_M * WG_K);
    floatX* d_b = to_device(b, WG_K * WG_N);
    float* d_out = (float*)device_malloc(WG_M * WG_N * sizeof(float));
    printf("wgmma m64n64k16, A in registers (v1-v3) or shared memory (v4), B in shared memory (interleaved layout)\n");
    int ok = check_layout("v1 K-major", 0, 1024, 128, 0, a, b, d_a, d_b, d_out);
    ok &= check_layout("v2 MN-major", 1, 128, 256, 0, a, b, d_a, d_b, d_out);
    ok &= check_layout("v3 accumulate", 0, 1024, 128, 1, a, b, d_a, d_b, d_out);
    ok &= check_ss(a, b, d_a, d_b, d_out);
#ifndef CUDA_EMU
    int blocks = 132 * 8, repeat = 256;
    double flops = 2.0 * blocks * 2 * repeat * 16 * WG_M * WG_N * WG_K;  // 2 warpgroups a block
    float ms;
    TIME_KERNEL(ms, 10, (wgmma_rate_kernel<<<blocks, 256>>>(d_out, repeat)));
    report("wgmma m64n64k16", ms, 0, flops);
    TIME_KERNEL(ms, 10, (mma_rate_kernel<<<blocks, 256>>>(d_out, repeat)));
    report("mma.sync m16n8k16", ms, 0, flops);
#endif
    device_free(d_out);
    device_free(d_a);
    device_free(d_b);
    free(a);
    free(b);
    return finish(ok);
#endif
}
