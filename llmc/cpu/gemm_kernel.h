// One GEMM micro-kernel, written once and compiled once per instruction set: matmul.h includes
// this file with GEMM_KERNEL (the function's name), GEMM_VEC_FLOATS (floats in one vector
// register: 16 for AVX-512, 8 for AVX2) and GEMM_TARGET (the instruction set, for GCC/Clang's
// target attribute; empty for the build's own) defined, and picks one at run time.
// No include guard: included once per instruction set.

// C tile (mr x nr, row stride ldc) = (accumulate ? C : 0) + a_panel^T b_panel over kc, where a
// full tile is GEMM_MR x 2 vectors. The accumulators are 2 GEMM_MR vector registers (12 of AVX2's
// 16, 12 of AVX-512's 32); each k step loads two vectors of B, broadcasts GEMM_MR values of A and
// does 2 GEMM_MR fused multiply-adds.
GEMM_TARGET static void GEMM_KERNEL(int kc, const float* __restrict__ a, const float* __restrict__ b,
                                    float* __restrict__ c, long ldc, int mr, int nr, int accumulate) {
    typedef float vec __attribute__((vector_size(4 * GEMM_VEC_FLOATS)));                   // aligned
    typedef float vec_u __attribute__((vector_size(4 * GEMM_VEC_FLOATS), aligned(4)));     // any address
    enum { V = GEMM_VEC_FLOATS, NR = 2 * GEMM_VEC_FLOATS };
    vec acc[GEMM_MR][2];
    for (int i = 0; i < GEMM_MR; i++) acc[i][0] = acc[i][1] = (vec){0};
    // Ask for C's tile now, so its lines arrive while the k loop runs (kc x 2 MR FMAs, thousands of
    // cycles) instead of stalling the loads and stores at the end: in a dweight the tile comes from
    // memory (the classifier's gradient is 154 MB, read and written once a step). 1.10x -> 0.99x
    // OpenBLAS's time on that product (104 -> 94 ms); no change where C is in cache. Each line of
    // each of the tile's rows: one every 16 floats and the row's last (a row need not start a line).
    for (int i = 0; i < mr; i++) {
        for (int j = 0; j < nr; j += 16) __builtin_prefetch(c + i * ldc + j);
        __builtin_prefetch(c + i * ldc + nr - 1);
    }
    for (int k = 0; k < kc; k++) {
        vec b0 = *(const vec*)(b + k * NR);
        vec b1 = *(const vec*)(b + k * NR + V);
        for (int i = 0; i < GEMM_MR; i++) {
            float a_ik = a[k * GEMM_MR + i];
            acc[i][0] += a_ik * b0;
            acc[i][1] += a_ik * b1;
        }
    }
    if (mr == GEMM_MR && nr == NR) {  // a whole tile: the registers go to C as vectors
        for (int i = 0; i < GEMM_MR; i++) {
            vec_u* row = (vec_u*)(c + i * ldc);
            row[0] = accumulate ? row[0] + acc[i][0] : acc[i][0];
            row[1] = accumulate ? row[1] + acc[i][1] : acc[i][1];
        }
        return;
    }
    float tile[GEMM_MR][NR];  // an edge tile: only its mr x nr corner is C's
    memcpy(tile, acc, sizeof(tile));
    for (int i = 0; i < mr; i++) {
        for (int j = 0; j < nr; j++) c[i * ldc + j] = (accumulate ? c[i * ldc + j] : 0.0f) + tile[i][j];
    }
}
