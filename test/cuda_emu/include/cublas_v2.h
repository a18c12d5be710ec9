// cuda_emu: cuBLAS's strided batched GEMM, on the loops of cublasLt.h. For each of `batch`
// problems i: C_i = alpha op(A_i) op(B_i) + beta C_i, X_i = X + i * stride_x, column-major.
#ifndef CUDA_EMU_CUBLAS_V2_H
#define CUDA_EMU_CUBLAS_V2_H

#include <cublasLt.h>

typedef struct cuda_emu::LtHandle* cublasHandle_t;

static inline cublasStatus_t cublasCreate(cublasHandle_t* h) { *h = new cuda_emu::LtHandle(); return CUBLAS_STATUS_SUCCESS; }

static inline cublasStatus_t cublasGemmStridedBatchedEx(
    cublasHandle_t h, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k, const void* alpha,
    const void* a, cudaDataType_t at, int lda, long long stride_a, const void* b, cudaDataType_t bt, int ldb,
    long long stride_b, const void* beta, void* c, cudaDataType_t ct, int ldc, long long stride_c, int batch,
    cublasComputeType_t compute, cublasGemmAlgo_t algo) {
    (void)h, (void)algo;
    if (compute != CUBLAS_COMPUTE_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    int ta = transa == CUBLAS_OP_T, tb = transb == CUBLAS_OP_T;
    // leading dimensions hold a column: rows of A as stored are m (N) or k (T)
    if (m < 0 || n < 0 || k < 0 || batch < 0 || lda < (ta ? k : m) || ldb < (tb ? n : k) || ldc < m) {
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    size_t sa = at == CUDA_R_32F ? 4 : 2, sb = bt == CUDA_R_32F ? 4 : 2, sc = ct == CUDA_R_32F ? 4 : 2;
    for (int i = 0; i < batch; i++) {
        cuda_emu::gemm(ta, tb, m, n, k, *(const float*)alpha, (const char*)a + i * stride_a * sa, at, lda,
                       (const char*)b + i * stride_b * sb, bt, ldb, *(const float*)beta,
                       (const char*)c + i * stride_c * sc, ct, ldc, (char*)c + i * stride_c * sc, ct, ldc, NULL, CUDA_R_32F);
    }
    return CUBLAS_STATUS_SUCCESS;
}

#endif
