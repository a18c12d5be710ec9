// Matmul on the CPU: one cache-blocked, packed GEMM (the BLIS/GotoBLAS structure: Goto & van de
// Geijn, "Anatomy of High-Performance Matrix Multiplication", 2008) serves all three products of
// a linear layer. A block of one operand stays in L2, a panel of it (KC x MR of A or KC x NR of B)
// in L1, and a MR x NR tile of C lives in registers while the micro-kernel streams K through it.
#ifndef LLMC_CPU_MATMUL_H
#define LLMC_CPU_MATMUL_H

#include "device.h"  // (kernel_times.h: the launchers time themselves with LLMC_KERNEL_TIMES=1)

#include <omp.h>
#include <stddef.h>
#include "../utils.h"

// The blocking, with the numbers of the machine it was tuned on (a 2-core AMD EPYC Zen 4 VM: 32 KB
// of L1d and 1 MB of L2 a core, 32 MB of L3 shared; AVX-512 at one 16-float FMA a cycle):
// - MR x NR, the register tile: 6 rows x 2 vectors (6 x 32 floats with AVX-512, 6 x 16 with AVX2)
//   in 12 accumulators. Each k step loads 2 vectors of B and broadcasts 6 floats of A for 12 FMAs:
//   few enough loads that the FMAs need not wait (alone, on panels in L1, the kernel does 114
//   GFLOP/s a core here: bench_matmul prints it).
// - KC = 256, the k summed per visit to a tile of C: a KC x NR panel of B is 32 KB (AVX-512; 16 KB
//   with AVX2), L1's size, and a KC x MR panel of A 6 KB. A task's own panel stays in L1, mostly
//   (the shared panels and C's lines pass through it too), while the shared panels stream past it
//   from L2 (KC = 128 or 192 was slower: C visited more often).
// - MC x KC of A (96 x 256 floats, 96 KB) or KC x NC of B (256 x 128, 128 KB) is a task's block,
//   in L2 (1 MB) beside the shared side's slice: 256 tokens x 256 (256 KB) in a forward or dinp,
//   the C = 768 columns x 256 (768 KB) in a dweight.
#define GEMM_MR 6
#define GEMM_MC 96
#define GEMM_NC 128
#define GEMM_KC 256

static float* gemm_pack_buffer = NULL;  // per thread: a task's block, MC x KC of A or KC x NC of B
#pragma omp threadprivate(gemm_pack_buffer)

// Packing copies a block of an operand into panels the micro-kernel reads contiguously:
// dst[panel][k][w] = src[(w0 + panel*width + w) * s_w + (k0 + k) * s_k], zero past `count`.
// A is packed with w = rows (width MR), B with w = columns (width NR).

// The block's w are contiguous in src (s_w == 1): at each k, its `count` floats (a task's 128
// columns of B: 512 bytes) are read in order and dealt out to the panels, `width` floats each.
// Inlined with `width` a constant, each piece is a few vector moves, not a call to memcpy (a call
// per 24 bytes of an A panel cost 5% of a dweight). Row after row, not panel after panel, so
// each row's lines are read once, in order (the dinp packs the classifier's 154 MB weight so).
static inline __attribute__((always_inline)) void gemm_pack_rows(float* dst, const float* src, long s_k, int kc,
                                                                 int count, int width) {
    int full = count / width * width;  // the whole panels' w; an edge panel's were zeroed
    for (int k = 0; k < kc; k++) {
        const float* row = src + k * s_k;
        for (int w = 0; w < full; w += width) memcpy(dst + (size_t)w * kc + k * width, row + w, sizeof(float) * width);
        if (full < count) memcpy(dst + (size_t)full * kc + k * width, row + full, sizeof(float) * (count - full));
    }
}

// the packing of a block (above): contiguous w's or a transpose
static inline void gemm_pack(float* dst, const float* src, long s_w, long s_k, int w0, int count,
                             int k0, int kc, int width) {
    int full = count / width * width;
    if (full < count) memset(dst + (size_t)full * kc, 0, sizeof(float) * kc * width);  // the edge panel
    if (s_w == 1) {
        const float* base = src + w0 + (long)k0 * s_k;
        switch (width) {  // a constant for each width used: MR for A, NR for B (AVX-512, AVX2, generic)
            case GEMM_MR: gemm_pack_rows(dst, base, s_k, kc, count, GEMM_MR); break;
            case 32: gemm_pack_rows(dst, base, s_k, kc, count, 32); break;
            case 16: gemm_pack_rows(dst, base, s_k, kc, count, 16); break;
            case 8: gemm_pack_rows(dst, base, s_k, kc, count, 8); break;
            default: gemm_pack_rows(dst, base, s_k, kc, count, width);
        }
        return;
    }
    // a transpose (s_k == 1 in every product here), panel by panel, 16 k at a time: a cache line of each w
    for (int p = 0; p < count; p += width) {
        float* panel = dst + (size_t)p * kc;
        int valid = count - p < width ? count - p : width;
        const float* base = src + (long)(w0 + p) * s_w + (long)k0 * s_k;
        for (int kb = 0; kb < kc; kb += 16) {
            int kend = kc - kb < 16 ? kc : kb + 16;
            for (int w = 0; w < valid; w++) {
                // each w is a stream of its own (32 of them for a B panel), more than the
                // hardware prefetcher follows: ask for the line two ahead (the classifier's
                // forward packs its 154 MB weight this way: 109 -> 98 ms in bench_matmul)
                if (s_k == 1) __builtin_prefetch(base + w * s_w + kb + 32);
                for (int k = kb; k < kend; k++) panel[k * width + w] = base[w * s_w + k * s_k];
            }
        }
    }
}

// The micro-kernel, compiled for each instruction set (gemm_kernel.h) and chosen at run time, so
// the build needs no -march: AVX-512 (16 floats a register) where the CPU has it, AVX2 + FMA (8)
// otherwise, the compiler's baseline (SSE2 on x86-64: 4) elsewhere. LLMC_GEMM_ISA=avx2 (or
// generic) picks a narrower one, to compare or test them on one machine.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define GEMM_KERNEL gemm_kernel_avx512
#define GEMM_VEC_FLOATS 16
#define GEMM_TARGET __attribute__((target("avx512f,avx2,fma")))
#include "gemm_kernel.h"
#undef GEMM_KERNEL
#undef GEMM_VEC_FLOATS
#undef GEMM_TARGET
#define GEMM_KERNEL gemm_kernel_avx2
#define GEMM_VEC_FLOATS 8
#define GEMM_TARGET __attribute__((target("avx2,fma")))
#include "gemm_kernel.h"
#undef GEMM_KERNEL
#undef GEMM_VEC_FLOATS
#undef GEMM_TARGET
#endif
#define GEMM_KERNEL gemm_kernel_generic
#define GEMM_VEC_FLOATS 4
#define GEMM_TARGET
#include "gemm_kernel.h"
#undef GEMM_KERNEL
#undef GEMM_VEC_FLOATS
#undef GEMM_TARGET

typedef struct {
    void (*kernel)(int kc, const float* a, const float* b, float* c, long ldc, int mr, int nr, int accumulate);
    int nr;            // the tile's columns: 2 vectors
    const char* name;
} GemmIsa;

// the widest instruction set this CPU runs (or the one LLMC_GEMM_ISA names), decided once
static GemmIsa gemm_isa(void) {
    static const char* names[] = {"generic", "avx2", "avx512"};
    static GemmIsa isa = {NULL, 0, NULL};
    if (isa.kernel != NULL) return isa;
    int cpu = 0;  // 0 generic, 1 AVX2 + FMA, 2 AVX-512
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) cpu = 1;
    if (cpu == 1 && __builtin_cpu_supports("avx512f")) cpu = 2;
#endif
    int level = env_choice("LLMC_GEMM_ISA", cpu);  // (its values: names)
    if (level > cpu) fail("LLMC_GEMM_ISA=%s: this CPU does not run it (its widest: %s)", names[level], names[cpu]);
    isa = (GemmIsa){gemm_kernel_generic, 8, "generic"};
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (level == 1) isa = (GemmIsa){gemm_kernel_avx2, 16, "avx2"};
    if (level == 2) isa = (GemmIsa){gemm_kernel_avx512, 32, "avx512"};
#endif
    return isa;
}

// C[m][n] = (accumulate ? C[m][n] : 0) + sum_k A(m,k) B(k,n), with A(m,k) = A[m*a_rs + k*a_cs]
// and B(k,n) = B[k*b_rs + n*b_cs], so transposed operands need no copy.
// Every element of both operands is packed once. The smaller side (A's M rows or B's N columns:
// the B x T = 256 tokens of a linear layer's forward and dinp, the C = 768 columns of its dweight)
// is packed by all threads together into one shared buffer, whole when it holds at most
// GEMM_SHARED_MAX floats (then a task keeps its block of C in cache over all of K: the
// classifier's forward writes a 256 x 50304 C, 51 MB, once instead of once per KC), else one KC
// slice at a time (256 x 256 floats, 256 KB, in L2). The threads then split the other side into
// tasks of NC columns of B (or MC rows of A), each packed by the task that multiplies it with the
// shared panels. Each element of C is summed over k in the same order whichever thread computes
// it, so results do not depend on the number of threads.
#define GEMM_SHARED_MAX (1 << 20)
#define GEMM_SHARED_BLOCK 264  // the shared panels' rows (44 of A's) or columns a task takes at once
static float* gemm_shared_buffer = NULL;  // the smaller operand's panels, for every thread
static size_t gemm_shared_floats = 0;

static inline void gemm(int M, int N, int K, const float* A, long a_rs, long a_cs, const float* B,
                        long b_rs, long b_cs, float* C, long ldc, int accumulate) {
    GemmIsa isa = gemm_isa();  // (before the threads start: decided once)
    int share_a = M <= N;                         // whose panels the threads share
    int shared = share_a ? M : N;                 // its rows of A or columns of B
    int width = share_a ? GEMM_MR : isa.nr;       // its panels' width
    int other = share_a ? N : M;                  // the other side, split into tasks
    int other_width = share_a ? isa.nr : GEMM_MR;
    int block = share_a ? GEMM_NC : GEMM_MC;      // a task's columns of B (or rows of A)
    int threads = omp_get_max_threads();
    // at least two tasks a thread where the other side is small (a multiple of its panel width)
    while (block > other_width && (other + block - 1) / block < 2 * threads) {
        block = (block / 2 + other_width - 1) / other_width * other_width;
    }
    int tasks = (other + block - 1) / block;
    int panels = (shared + width - 1) / width;
    size_t slice_floats = (size_t)panels * width * GEMM_KC;  // one KC slice of the shared side
    int round_k = slice_floats * ((K + GEMM_KC - 1) / GEMM_KC) <= GEMM_SHARED_MAX ? K : GEMM_KC;  // k packed per round
    size_t need = slice_floats * ((round_k + GEMM_KC - 1) / GEMM_KC);
    if (need > gemm_shared_floats) {
        free(gemm_shared_buffer);  // 64-byte aligned: the micro-kernel loads B panels as aligned vectors
        gemm_shared_buffer = (float*)aligned_alloc(64, need * sizeof(float));
        if (gemm_shared_buffer == NULL) fail("allocation of the GEMM packing buffer failed");
        gemm_shared_floats = need;
    }
    float* shared_pack = gemm_shared_buffer;
    #pragma omp parallel
    {
        if (gemm_pack_buffer == NULL) {  // this thread's block of the other operand
            gemm_pack_buffer = (float*)aligned_alloc(64, sizeof(float) * GEMM_KC * (GEMM_MC > GEMM_NC ? GEMM_MC : GEMM_NC));
            if (gemm_pack_buffer == NULL) fail("allocation of the GEMM packing buffer failed");
        }
        float* own = gemm_pack_buffer;
        for (int r0 = 0; r0 < K; r0 += round_k) {
            int r_end = K - r0 < round_k ? K : r0 + round_k;
            // 1. the shared panels of this round's k, split over the threads (then all wait for them)
            #pragma omp for schedule(static)
            for (int p = 0; p < panels; p++) {
                int count = shared - p * width < width ? shared - p * width : width;
                for (int k0 = r0; k0 < r_end; k0 += GEMM_KC) {
                    int kc = r_end - k0 < GEMM_KC ? r_end - k0 : GEMM_KC;
                    float* dst = shared_pack + slice_floats * ((k0 - r0) / GEMM_KC) + (size_t)p * width * kc;
                    if (share_a) gemm_pack(dst, A, a_rs, a_cs, p * width, count, k0, kc, width);
                    else gemm_pack(dst, B, b_cs, b_rs, p * width, count, k0, kc, width);
                }
            }
            // 2. the tasks: a block of the other operand, packed one KC at a time, against the shared panels
            #pragma omp for schedule(dynamic)
            for (int t = 0; t < tasks; t++) {
                int o0 = t * block, count = other - o0 < block ? other - o0 : block;
                int i0 = share_a ? 0 : o0, rows = share_a ? M : count;
                int j0 = share_a ? o0 : 0, cols = share_a ? count : N;
                for (int k0 = r0; k0 < r_end; k0 += GEMM_KC) {
                    int kc = r_end - k0 < GEMM_KC ? r_end - k0 : GEMM_KC;
                    const float* slice = shared_pack + slice_floats * ((k0 - r0) / GEMM_KC);
                    if (share_a) gemm_pack(own, B, b_cs, b_rs, o0, count, k0, kc, isa.nr);
                    else gemm_pack(own, A, a_rs, a_cs, o0, count, k0, kc, GEMM_MR);
                    const float* a_pack = share_a ? slice : own;
                    const float* b_pack = share_a ? own : slice;
                    // The task's own panel stays in L1 while the shared panels stream past it from
                    // L2: sharing A, a panel of B (kc x nr, 32 KB) against every panel of A; sharing
                    // B (a dweight whose OC > C), a panel of A (kc x MR) against every panel of B,
                    // which walks C (MC rows x all of N) row by row, in the order it lies in memory,
                    // where a dweight's C comes from (classifier dweight: 95 -> 92 ms). The shared
                    // panels go by in blocks of GEMM_SHARED_BLOCK rows or columns (264 x 256 floats,
                    // 264 KB, or 256 x 256), each block past all of the task's own panels before the
                    // next, so that a block stays in L2: at 1024 tokens a whole slice of the shared
                    // side is 1 MB, L2's size, and streaming it from L3 took 1.14-1.27x OpenBLAS's
                    // time on the products that share A (1.00x in blocks).
                    int outer = share_a ? cols : rows, outer_step = share_a ? isa.nr : GEMM_MR;
                    int inner = share_a ? rows : cols, inner_step = share_a ? GEMM_MR : isa.nr;
                    int inner_block = GEMM_SHARED_BLOCK / inner_step * inner_step;
                    for (int v0 = 0; v0 < inner; v0 += inner_block) {
                        int v_end = inner - v0 < inner_block ? inner : v0 + inner_block;
                        for (int u = 0; u < outer; u += outer_step) {
                            for (int v = v0; v < v_end; v += inner_step) {
                                int p = share_a ? v : u, q = share_a ? u : v;  // A's panel, B's panel
                                int mr = rows - p < GEMM_MR ? rows - p : GEMM_MR;
                                int nr = cols - q < isa.nr ? cols - q : isa.nr;
                                isa.kernel(kc, a_pack + (size_t)p * kc, b_pack + (size_t)q * kc,
                                           C + (long)(i0 + p) * ldc + (j0 + q), ldc, mr, nr, accumulate || k0 > 0);
                            }
                        }
                    }
                }
            }
        }
    }
}

#ifdef LLMC_GEMM_OPENBLAS
// The peer for dev/bench/bench_cpu_step.sh (make dev/bench/train_gpt2_dp_openblas): the same
// trainer with OpenBLAS's sgemm doing every product, to time a step beside ours on one machine.
// It links OpenBLAS's OpenMP build, so that its sgemm and our other ops share one pool of threads.
// Not for training: its sums do not keep one order whatever the thread count.
void cblas_sgemm(int order, int trans_a, int trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                 const float* B, int ldb, float beta, float* C, int ldc);
static inline void gemm_openblas(int M, int N, int K, const float* A, long a_rs, long a_cs, const float* B,
                                 long b_rs, long b_cs, float* C, long ldc, int accumulate) {
    if ((a_cs != 1 && a_rs != 1) || (b_cs != 1 && b_rs != 1)) fail("gemm_openblas: an operand with no unit stride");
    // row-major (101); an operand whose rows are contiguous is used as it is (111), else transposed (112)
    cblas_sgemm(101, a_cs == 1 ? 111 : 112, b_cs == 1 ? 111 : 112, M, N, K, 1.0f, A, (int)(a_cs == 1 ? a_rs : a_cs),
                B, (int)(b_cs == 1 ? b_rs : b_cs), accumulate ? 1.0f : 0.0f, C, (int)ldc);
}
#define gemm gemm_openblas
#endif

// out (N, OC) = inp (N, C) @ weight (OC, C)^T + bias (OC); bias may be NULL
static inline void matmul_forward(float* out, const float* inp, const float* weight, const float* bias,
                           int N, int C, int OC) {
    int kernel_span = kernel_time_begin("matmul forward", C, OC);
    if (bias != NULL) {
        #pragma omp parallel for
        for (int n = 0; n < N; n++) memcpy(out + (size_t)n * OC, bias, (size_t)OC * sizeof(float));
    }
    gemm(N, OC, C, inp, C, 1, weight, 1, C, out, OC, bias != NULL);
    kernel_time_end(kernel_span);
}

// The backward pass in its two halves, which a zero-bubble pipeline runs at different times
// (train_gpt2_pp.cu): the input gradient, which the layer below waits for, and the weight
// gradient, which nothing waits for.
// dinp (N, C) = dout (N, OC) @ weight (OC, C)            (overwritten)
static inline void matmul_backward_input(float* dinp, const float* dout, const float* weight, int N, int C, int OC) {
    int kernel_span = kernel_time_begin("matmul dinp", C, OC);
    gemm(N, C, OC, dout, OC, 1, weight, C, 1, dinp, C, 0);
    kernel_time_end(kernel_span);
}

// dweight (OC, C) += dout^T @ inp; dbias (OC) += column sums of dout   (accumulated; dbias may be NULL)
static inline void matmul_backward_weight(float* dweight, float* dbias, const float* dout, const float* inp, int N,
                                          int C, int OC) {
    int kernel_span = kernel_time_begin("matmul dweight", C, OC);
    gemm(OC, C, N, dout, 1, OC, inp, C, 1, dweight, C, 1);
    if (dbias != NULL) {
        // dbias (OC) += the column sums of dout (N, OC), each summed over n in order; a task takes
        // 64 columns and walks the rows, so its loads are contiguous and the sums vectorize (one
        // column at a time strided through memory, OC floats apart, and cost 20 ms of a d12 step)
        #pragma omp parallel for
        for (int o0 = 0; o0 < OC; o0 += 64) {
            int width = OC - o0 < 64 ? OC - o0 : 64;
            float sum[64] = {0};
            for (int n = 0; n < N; n++) {
                const float* row = dout + (size_t)n * OC + o0;
                for (int j = 0; j < width; j++) sum[j] += row[j];
            }
            for (int j = 0; j < width; j++) dbias[o0 + j] += sum[j];
        }
    }
    kernel_time_end(kernel_span);
}

// both at once
static inline void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                            const float* inp, const float* weight, int N, int C, int OC) {
    matmul_backward_input(dinp, dout, weight, N, C, OC);
    matmul_backward_weight(dweight, dbias, dout, inp, N, C, OC);
}

// out (N, OC) += bias (OC): the bias of a row-parallel matmul, added once after the partial
// products of the ranks were summed (train_gpt2_tp.cu)
static inline void bias_add(float* out, const float* bias, int N, int OC) {
    int kernel_span = kernel_time_begin("bias add", 0, 0);
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        for (int o = 0; o < OC; o++) out[(size_t)n * OC + o] += bias[o];
    }
    kernel_time_end(kernel_span);
}

#endif
