// Matmul on the CPU: one cache-blocked, packed GEMM (the BLIS/GotoBLAS structure: Goto & van de
// Geijn, "Anatomy of High-Performance Matrix Multiplication", 2008) serves all three products of
// a linear layer. Blocks of A (MC x KC) stay in L2, a panel of B (KC x NR) stays in L1, and a
// MR x NR tile of C lives in registers while the micro-kernel streams K through it.
#ifndef LLMC_CPU_MATMUL_H
#define LLMC_CPU_MATMUL_H

#include <omp.h>
#include <stddef.h>
#include "../utils.h"

// 6 x 16 fp32 accumulators = 12 AVX2 registers; the compiler vectorizes the j loop
#define GEMM_MR 6
#define GEMM_NR 16
#define GEMM_MC 96
#define GEMM_NC 128
#define GEMM_KC 256

static float* gemm_pack_buffer = NULL;  // per thread: MC*KC of A then KC*NC of B
#pragma omp threadprivate(gemm_pack_buffer)

// Packing copies a block of an operand into panels the micro-kernel reads contiguously:
// dst[panel][k][w] = src[(w0 + panel*width + w) * s_w + (k0 + k) * s_k], zero past `count`.
// A is packed with w = rows (width MR), B with w = columns (width NR).
static inline void gemm_pack(float* dst, const float* src, long s_w, long s_k, int w0, int count,
                             int k0, int kc, int width) {
    for (int p = 0; p < count; p += width) {
        float* panel = dst + (size_t)p * kc;
        int valid = count - p < width ? count - p : width;
        const float* base = src + (long)(w0 + p) * s_w + (long)k0 * s_k;
        if (s_w == 1) {  // the panel's row at each k is contiguous: copy it whole
            for (int k = 0; k < kc; k++) {
                for (int w = 0; w < width; w++) panel[k * width + w] = w < valid ? base[k * s_k + w] : 0.0f;
            }
        } else {         // walk along k for each w (contiguous when s_k == 1)
            for (int w = 0; w < width; w++) {
                for (int k = 0; k < kc; k++) panel[k * width + w] = w < valid ? base[w * s_w + k * s_k] : 0.0f;
            }
        }
    }
}

// 8 floats in one vector register (GCC/Clang vector extension; AVX2 on x86, two NEON on Arm)
typedef float vfloat8 __attribute__((vector_size(32)));

// C tile (mr x nr, row stride ldc) = (accumulate ? C : 0) + a_panel^T b_panel over kc.
// The 6 x 16 accumulator tile is 12 vector registers; each k step broadcasts 6 values of A
// and does 12 fused multiply-adds against two vectors of B.
static inline void gemm_micro_kernel(int kc, const float* __restrict__ a, const float* __restrict__ b,
                                     float* __restrict__ c, long ldc, int mr, int nr, int accumulate) {
    vfloat8 acc[GEMM_MR][2];
    for (int i = 0; i < GEMM_MR; i++) acc[i][0] = acc[i][1] = (vfloat8){0};
    for (int k = 0; k < kc; k++) {
        vfloat8 b0 = *(const vfloat8*)(b + k * GEMM_NR);
        vfloat8 b1 = *(const vfloat8*)(b + k * GEMM_NR + 8);
        for (int i = 0; i < GEMM_MR; i++) {
            float a_ik = a[k * GEMM_MR + i];
            acc[i][0] += a_ik * b0;
            acc[i][1] += a_ik * b1;
        }
    }
    float tile[GEMM_MR][GEMM_NR];
    memcpy(tile, acc, sizeof(tile));
    for (int i = 0; i < mr; i++) {
        for (int j = 0; j < nr; j++) c[i * ldc + j] = (accumulate ? c[i * ldc + j] : 0.0f) + tile[i][j];
    }
}

// C[m][n] = (accumulate ? C[m][n] : 0) + sum_k A(m,k) B(k,n), with A(m,k) = A[m*a_rs + k*a_cs]
// and B(k,n) = B[k*b_rs + n*b_cs], so transposed operands need no copy.
// A task owns NC columns of C (and, when there are few such blocks, a share of the rows): it packs
// each KC x NC block of B once and sweeps it over its rows. Each element of C is summed by one
// thread in a fixed order, so results do not depend on the number of threads.
static inline void gemm(int M, int N, int K, const float* A, long a_rs, long a_cs, const float* B,
                        long b_rs, long b_cs, float* C, long ldc, int accumulate) {
    int m_blocks = (M + GEMM_MC - 1) / GEMM_MC;
    int n_blocks = (N + GEMM_NC - 1) / GEMM_NC;
    int threads = omp_get_max_threads();
    // enough tasks to keep every thread busy: split the rows when there are few column blocks
    int m_groups = (2 * threads + n_blocks - 1) / n_blocks;
    if (m_groups > m_blocks) m_groups = m_blocks;
    #pragma omp parallel
    {
        if (gemm_pack_buffer == NULL) {
            // 32-byte aligned: the micro-kernel loads B panels as aligned vectors
            gemm_pack_buffer = (float*)aligned_alloc(32, sizeof(float) * (GEMM_MC + GEMM_NC) * GEMM_KC);
            if (gemm_pack_buffer == NULL) fail("allocation of the GEMM packing buffer failed");
        }
        float* a_pack = gemm_pack_buffer;
        float* b_pack = gemm_pack_buffer + GEMM_MC * GEMM_KC;
        #pragma omp for schedule(dynamic)
        for (int task = 0; task < n_blocks * m_groups; task++) {
            int jb = task / m_groups, group = task % m_groups;
            int ib_begin = group * m_blocks / m_groups, ib_end = (group + 1) * m_blocks / m_groups;
            int j0 = jb * GEMM_NC;
            int nc = N - j0 < GEMM_NC ? N - j0 : GEMM_NC;
            for (int k0 = 0; k0 < K; k0 += GEMM_KC) {
                int kc = K - k0 < GEMM_KC ? K - k0 : GEMM_KC;
                gemm_pack(b_pack, B, b_cs, b_rs, j0, nc, k0, kc, GEMM_NR);
                for (int ib = ib_begin; ib < ib_end; ib++) {
                    int i0 = ib * GEMM_MC;
                    int mc = M - i0 < GEMM_MC ? M - i0 : GEMM_MC;
                    gemm_pack(a_pack, A, a_rs, a_cs, i0, mc, k0, kc, GEMM_MR);
                    for (int q = 0; q < nc; q += GEMM_NR) {
                        for (int p = 0; p < mc; p += GEMM_MR) {
                            int mr = mc - p < GEMM_MR ? mc - p : GEMM_MR;
                            int nr = nc - q < GEMM_NR ? nc - q : GEMM_NR;
                            gemm_micro_kernel(kc, a_pack + (size_t)p * kc, b_pack + (size_t)q * kc,
                                              C + (long)(i0 + p) * ldc + (j0 + q), ldc, mr, nr,
                                              accumulate || k0 > 0);
                        }
                    }
                }
            }
        }
    }
}

// out (N, OC) = inp (N, C) @ weight (OC, C)^T + bias (OC); bias may be NULL
static inline void matmul_forward(float* out, const float* inp, const float* weight, const float* bias,
                           int N, int C, int OC) {
    if (bias != NULL) {
        #pragma omp parallel for
        for (int n = 0; n < N; n++) memcpy(out + (size_t)n * OC, bias, (size_t)OC * sizeof(float));
    }
    gemm(N, OC, C, inp, C, 1, weight, 1, C, out, OC, bias != NULL);
}

// The backward pass in its two halves, which a zero-bubble pipeline runs at different times
// (train_gpt2_pp.cu): the input gradient, which the layer below waits for, and the weight
// gradient, which nothing waits for.
// dinp (N, C) = dout (N, OC) @ weight (OC, C)            (overwritten)
static inline void matmul_backward_input(float* dinp, const float* dout, const float* weight, int N, int C, int OC) {
    gemm(N, C, OC, dout, OC, 1, weight, C, 1, dinp, C, 0);
}

// dweight (OC, C) += dout^T @ inp; dbias (OC) += column sums of dout   (accumulated; dbias may be NULL)
static inline void matmul_backward_weight(float* dweight, float* dbias, const float* dout, const float* inp, int N,
                                          int C, int OC) {
    gemm(OC, C, N, dout, 1, OC, inp, C, 1, dweight, C, 1);
    if (dbias != NULL) {
        #pragma omp parallel for
        for (int o = 0; o < OC; o++) {
            float sum = 0.0f;
            for (int n = 0; n < N; n++) sum += dout[(size_t)n * OC + o];
            dbias[o] += sum;
        }
    }
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
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        for (int o = 0; o < OC; o++) out[(size_t)n * OC + o] += bias[o];
    }
}

#endif
