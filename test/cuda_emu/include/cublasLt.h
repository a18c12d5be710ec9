// cuda_emu: the part of cuBLASLt (and, in cublas_v2.h, of cuBLAS) this project calls, as plain
// loops. Semantics from the cuBLAS documentation: column-major matrices, op(A) is m x k, op(B) is
// k x n, D = alpha op(A) op(B) + beta C, then the epilogue (a bias of m values added to every
// column, or BGRADB: the sums of op(B) over k, one per column of D, written to the bias pointer;
// GELU_AUX(_BIAS): the result, bias added, to the aux matrix and its GELU to D; DGELU: the result
// times GELU' of the aux matrix). NVIDIA does not say which GELU its epilogues compute; this one
// computes GPT-2's tanh approximation, which dev/cuda/gelu checks the real one against on a GPU.
// Products accumulate in fp32 as CUBLAS_COMPUTE_32F does; the shapes in each call are
// checked against its layouts, and a mismatch is an error, as it would be on a GPU.
#ifndef CUDA_EMU_CUBLASLT_H
#define CUDA_EMU_CUBLASLT_H

#include <cuda_bf16.h>
#include <cuda_runtime.h>

typedef enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
} cublasStatus_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;
typedef enum { CUDA_R_32F = 0, CUDA_R_16BF = 14 } cudaDataType_t;
typedef cudaDataType_t cudaDataType;
typedef enum { CUBLAS_COMPUTE_32F = 68 } cublasComputeType_t;
typedef enum { CUBLAS_GEMM_DEFAULT = -1 } cublasGemmAlgo_t;

namespace cuda_emu {

static inline float load(const void* p, cudaDataType_t type, size_t i) {
    return type == CUDA_R_32F ? ((const float*)p)[i] : (float)((const __nv_bfloat16*)p)[i];
}
static inline void store(void* p, cudaDataType_t type, size_t i, float v) {
    if (type == CUDA_R_32F) ((float*)p)[i] = v;
    else ((__nv_bfloat16*)p)[i] = __nv_bfloat16(v);
}

// GELU (tanh approximation) and its derivative in fp32, written from the formula
// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), not from the project's kernels
static inline float gelu_tanh(float x) {
    float t = tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x));
    return 0.5f * x * (1.0f + t);
}
static inline float gelu_tanh_grad(float x) {
    float t = tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x));
    return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * 0.7978845608028654f * (1.0f + 3.0f * 0.044715f * x * x);
}
enum GeluEpilogue { GELU_NONE, GELU_FORWARD, GELU_BACKWARD };

// D (m, n) = alpha op(A) op(B) + beta C + bias, column-major; C may be D. With GELU_FORWARD the
// sum goes to aux (laid out as D, leading dimension ldaux) and its GELU to D; with GELU_BACKWARD
// D = the sum times GELU'(aux). The emulator's own loops need no alignment checks (they would keep
// the inner loop from vectorizing).
__attribute__((no_sanitize("alignment"))) static inline void gemm(int transa, int transb, int m, int n, int k, float alpha,
                        const void* a, cudaDataType_t at, long lda, const void* b, cudaDataType_t bt,
                        long ldb, float beta, const void* c, cudaDataType_t ct, long ldc, void* d,
                        cudaDataType_t dt, long ldd, const void* bias, cudaDataType_t biast,
                        GeluEpilogue gelu = GELU_NONE, void* aux = NULL, long ldaux = 0) {
    // rows of op(A) and columns of op(B), each made contiguous over k
    float* ar = (float*)malloc((size_t)m * k * sizeof(float) + 1);
    float* bc = (float*)malloc((size_t)n * k * sizeof(float) + 1);
    if (ar == NULL || bc == NULL) die("no host memory for a GEMM");
    for (int i = 0; i < m; i++)
        for (int p = 0; p < k; p++) ar[(size_t)i * k + p] = load(a, at, transa ? (size_t)i * lda + p : (size_t)p * lda + i);
    for (int j = 0; j < n; j++)
        for (int p = 0; p < k; p++) bc[(size_t)j * k + p] = load(b, bt, transb ? (size_t)p * ldb + j : (size_t)j * ldb + p);
    #pragma omp parallel for schedule(static)
    for (int j = 0; j < n; j++) {
        for (int i = 0; i < m; i++) {
            const float* x = ar + (size_t)i * k;
            const float* y = bc + (size_t)j * k;
            float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            int p = 0;
            for (; p + 8 <= k; p += 8)
                for (int l = 0; l < 8; l++) lanes[l] += x[p + l] * y[p + l];
            float acc = 0.0f;
            for (; p < k; p++) acc += x[p] * y[p];
            for (int l = 0; l < 8; l++) acc += lanes[l];
            float v = alpha * acc;
            if (beta != 0.0f) v += beta * load(c, ct, (size_t)j * ldc + i);
            if (bias != NULL) v += load(bias, biast, i);
            if (gelu == GELU_FORWARD) {
                store(aux, dt, (size_t)j * ldaux + i, v);
                v = gelu_tanh(v);  // from the fp32 sum, not from its rounding in aux
            } else if (gelu == GELU_BACKWARD) {
                v *= gelu_tanh_grad(load(aux, dt, (size_t)j * ldaux + i));
            }
            store(d, dt, (size_t)j * ldd + i, v);
        }
    }
    free(ar);
    free(bc);
    check_guards("a cuBLAS GEMM");
}

struct LtHandle { int unused; };
struct MatmulDesc {
    cublasComputeType_t compute;
    cudaDataType_t scale;
    cublasOperation_t transa, transb;
    int epilogue;
    const void* bias;
    cudaDataType_t bias_type;
    void* aux;       // GELU's input matrix (GELU_AUX, GELU_AUX_BIAS write it, DGELU reads it)
    int64_t aux_ld;  // its leading dimension, in elements
};
struct MatrixLayout { cudaDataType_t type; uint64_t rows, cols; int64_t ld; };
// alignments in bytes the chosen algorithm may assume for A, B, C, D (cuBLASLt's default: 256)
struct MatmulPreference { size_t max_workspace; uint32_t min_alignment[4]; };

}  // namespace cuda_emu

typedef cuda_emu::LtHandle* cublasLtHandle_t;
typedef cuda_emu::MatmulDesc* cublasLtMatmulDesc_t;
typedef cuda_emu::MatrixLayout* cublasLtMatrixLayout_t;
typedef cuda_emu::MatmulPreference* cublasLtMatmulPreference_t;
typedef struct { uint64_t data[8]; } cublasLtMatmulAlgo_t;
typedef struct {
    cublasLtMatmulAlgo_t algo;
    size_t workspaceSize;
    cublasStatus_t state;
    float wavesCount;
    int reserved[4];
} cublasLtMatmulHeuristicResult_t;
typedef enum {
    CUBLASLT_EPILOGUE_DEFAULT = 1,
    CUBLASLT_EPILOGUE_BIAS = 4,
    CUBLASLT_EPILOGUE_GELU_AUX = 160,
    CUBLASLT_EPILOGUE_GELU_AUX_BIAS = 164,
    CUBLASLT_EPILOGUE_DGELU = 192,
    CUBLASLT_EPILOGUE_BGRADB = 512,
} cublasLtEpilogue_t;
typedef enum {
    CUBLASLT_MATMUL_DESC_TRANSA = 3,
    CUBLASLT_MATMUL_DESC_TRANSB = 4,
    CUBLASLT_MATMUL_DESC_EPILOGUE = 7,
    CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8,
    CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER = 11,
    CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD = 12,
    CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE = 26,
} cublasLtMatmulDescAttributes_t;
typedef enum {
    CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8,
} cublasLtMatmulPreferenceAttributes_t;

static inline cublasStatus_t cublasLtCreate(cublasLtHandle_t* h) { *h = new cuda_emu::LtHandle(); return CUBLAS_STATUS_SUCCESS; }
static inline cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* d, cublasComputeType_t compute, cudaDataType_t scale) {
    if (compute != CUBLAS_COMPUTE_32F || scale != CUDA_R_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
    *d = new cuda_emu::MatmulDesc{compute, scale, CUBLAS_OP_N, CUBLAS_OP_N, CUBLASLT_EPILOGUE_DEFAULT, NULL, CUDA_R_32F, NULL, 0};
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) { delete d; return CUBLAS_STATUS_SUCCESS; }
static inline cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                                            const void* buf, size_t size) {
    switch (attr) {
        case CUBLASLT_MATMUL_DESC_TRANSA:
            if (size != sizeof(cublasOperation_t)) return CUBLAS_STATUS_INVALID_VALUE;
            memcpy(&d->transa, buf, size);
            return CUBLAS_STATUS_SUCCESS;
        case CUBLASLT_MATMUL_DESC_TRANSB:
            if (size != sizeof(cublasOperation_t)) return CUBLAS_STATUS_INVALID_VALUE;
            memcpy(&d->transb, buf, size);
            return CUBLAS_STATUS_SUCCESS;
        case CUBLASLT_MATMUL_DESC_EPILOGUE:
            if (size != sizeof(cublasLtEpilogue_t)) return CUBLAS_STATUS_INVALID_VALUE;
            memcpy(&d->epilogue, buf, size);
            return CUBLAS_STATUS_SUCCESS;
        case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
            if (size != sizeof(void*)) return CUBLAS_STATUS_INVALID_VALUE;
            memcpy(&d->bias, buf, size);
            return CUBLAS_STATUS_SUCCESS;
        case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER:
            if (size != sizeof(void*)) return CUBLAS_STATUS_INVALID_VALUE;
            memcpy(&d->aux, buf, size);
            return CUBLAS_STATUS_SUCCESS;
        case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD:
            if (size != sizeof(int64_t)) return CUBLAS_STATUS_INVALID_VALUE;
            memcpy(&d->aux_ld, buf, size);
            return CUBLAS_STATUS_SUCCESS;
        case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
            if (size != sizeof(cudaDataType_t)) return CUBLAS_STATUS_INVALID_VALUE;
            memcpy(&d->bias_type, buf, size);
            return CUBLAS_STATUS_SUCCESS;
    }
    return CUBLAS_STATUS_NOT_SUPPORTED;
}
static inline cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* l, cudaDataType_t type, uint64_t rows,
                                                        uint64_t cols, int64_t ld) {
    if (ld < (int64_t)rows) return CUBLAS_STATUS_INVALID_VALUE;  // column-major: ld >= rows
    *l = new cuda_emu::MatrixLayout{type, rows, cols, ld};
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) { delete l; return CUBLAS_STATUS_SUCCESS; }
static inline cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* p) {
    *p = new cuda_emu::MatmulPreference{0, {256, 256, 256, 256}};
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) { delete p; return CUBLAS_STATUS_SUCCESS; }
static inline cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr,
                                                                  const void* buf, size_t size) {
    if (attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES) {
        if (size != sizeof(size_t)) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&p->max_workspace, buf, size);
        return CUBLAS_STATUS_SUCCESS;
    }
    if (attr >= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES && attr <= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES) {
        if (size != sizeof(uint32_t)) return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&p->min_alignment[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES], buf, size);
        return CUBLAS_STATUS_SUCCESS;
    }
    return CUBLAS_STATUS_NOT_SUPPORTED;
}
static inline cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a,
                                                            cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dl,
                                                            cublasLtMatmulPreference_t p, int requested,
                                                            cublasLtMatmulHeuristicResult_t* results, int* found) {
    (void)h, (void)a, (void)b, (void)c, (void)dl;
    if (requested < 1) return CUBLAS_STATUS_INVALID_VALUE;
    memset(results, 0, sizeof(*results));
    // the "algorithm" remembers the alignments it was chosen for, as a real one relies on them:
    // A-D's from the preference, the bias vector's from its pointer's value, which the heuristic
    // reads without dereferencing it (CUBLASLT_MATMUL_DESC_BIAS_POINTER in NVIDIA's cublasLt.h)
    for (int i = 0; i < 4; i++) results->algo.data[i] = p->min_alignment[i];
    uint32_t bias_alignment = 256, aux_alignment = 256;
    while ((uintptr_t)d->bias % bias_alignment != 0) bias_alignment /= 2;
    while ((uintptr_t)d->aux % aux_alignment != 0) aux_alignment /= 2;
    results->algo.data[4] = d->bias != NULL ? bias_alignment : 1;
    results->algo.data[5] = d->aux != NULL ? aux_alignment : 1;
    *found = 1;
    return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t desc, const void* alpha,
                                            const void* a, cublasLtMatrixLayout_t la, const void* b, cublasLtMatrixLayout_t lb,
                                            const void* beta, const void* c, cublasLtMatrixLayout_t lc, void* d,
                                            cublasLtMatrixLayout_t ld, const cublasLtMatmulAlgo_t* algo, void* workspace,
                                            size_t workspace_bytes, cudaStream_t stream) {
    (void)h, (void)workspace, (void)workspace_bytes, (void)stream;
    // an algorithm chosen for 256-byte-aligned matrices (the default) may fault on a pointer
    // aligned to less, such as one layer's slice of a tensor stacked over layers
    const void* pointers[4] = {a, b, c, d};
    for (int i = 0; i < 4; i++) {
        if ((uintptr_t)pointers[i] % algo->data[i] != 0) {
            char what[160];
            snprintf(what, sizeof(what), "cublasLtMatmul: matrix %c is not %u-byte aligned, the alignment its "
                     "algorithm was chosen for (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_%c_BYTES)", "ABCD"[i],
                     (unsigned)algo->data[i], "ABCD"[i]);
            cuda_emu::die(what);
        }
    }
    if (desc->bias != NULL && (uintptr_t)desc->bias % algo->data[4] != 0) {
        char what[160];
        snprintf(what, sizeof(what), "cublasLtMatmul: the bias vector is not %u-byte aligned, the alignment of the "
                 "pointer its algorithm was chosen with", (unsigned)algo->data[4]);
        cuda_emu::die(what);
    }
    uint64_t m = ld->rows, n = ld->cols;
    int ta = desc->transa == CUBLAS_OP_T, tb = desc->transb == CUBLAS_OP_T;
    uint64_t k = ta ? la->rows : la->cols;
    // op(A) must be m x k, op(B) k x n, C like D
    if ((ta ? la->cols : la->rows) != m || (tb ? lb->cols : lb->rows) != k || (tb ? lb->rows : lb->cols) != n ||
        lc->rows != m || lc->cols != n) {
        return CUBLAS_STATUS_INVALID_VALUE;
    }
    int epilogue = desc->epilogue;
    int uses_bias = epilogue == CUBLASLT_EPILOGUE_BIAS || epilogue == CUBLASLT_EPILOGUE_BGRADB ||
                    epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    int uses_aux = epilogue == CUBLASLT_EPILOGUE_GELU_AUX || epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
                   epilogue == CUBLASLT_EPILOGUE_DGELU;
    if (epilogue != CUBLASLT_EPILOGUE_DEFAULT && !uses_bias && !uses_aux) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (uses_bias && desc->bias == NULL) return CUBLAS_STATUS_INVALID_VALUE;
    // a bias gradient has the output's type (CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE)
    if (epilogue == CUBLASLT_EPILOGUE_BGRADB && desc->bias_type != ld->type) return CUBLAS_STATUS_NOT_SUPPORTED;
    // GELU's input matrix: D's type (the default of CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE),
    // its leading dimension a multiple of 8 and at least D's rows (CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD)
    if (uses_aux && (desc->aux == NULL || desc->aux_ld % 8 != 0 || desc->aux_ld < (int64_t)m))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (uses_aux && (uintptr_t)desc->aux % algo->data[5] != 0) {
        char what[160];
        snprintf(what, sizeof(what), "cublasLtMatmul: the aux matrix is not %u-byte aligned, the alignment of the "
                 "pointer its algorithm was chosen with", (unsigned)algo->data[5]);
        cuda_emu::die(what);
    }
    const void* bias = epilogue == CUBLASLT_EPILOGUE_BIAS || epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ? desc->bias : NULL;
    cuda_emu::GeluEpilogue gelu = epilogue == CUBLASLT_EPILOGUE_DGELU ? cuda_emu::GELU_BACKWARD
                                  : uses_aux                           ? cuda_emu::GELU_FORWARD
                                                                       : cuda_emu::GELU_NONE;
    cuda_emu::gemm(ta, tb, (int)m, (int)n, (int)k, *(const float*)alpha, a, la->type, la->ld, b, lb->type, lb->ld,
                   *(const float*)beta, c, lc->type, lc->ld, d, ld->type, ld->ld, bias, desc->bias_type, gelu, desc->aux,
                   (long)desc->aux_ld);
    if (epilogue == CUBLASLT_EPILOGUE_BGRADB) {
        // column j of op(B) summed over its k rows, in fp32, stored once in the vector's type
        for (uint64_t j = 0; j < n; j++) {
            float sum = 0.0f;
            for (uint64_t p = 0; p < k; p++) sum += cuda_emu::load(b, lb->type, tb ? p * lb->ld + j : j * lb->ld + p);
            cuda_emu::store((void*)desc->bias, desc->bias_type, j, sum);
        }
    }
    return CUBLAS_STATUS_SUCCESS;
}

#endif
