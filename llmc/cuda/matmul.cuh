// Matmul on CUDA through cuBLASLt, with the bias added in the GEMM's epilogue.
// cuBLAS is column-major: a row-major (R, K) matrix is a column-major (K, R) one, so
// each launcher below states its column-major view.
#ifndef LLMC_CUDA_MATMUL_CUH
#define LLMC_CUDA_MATMUL_CUH

#include "device.cuh"

#if FLOATX_IS_FLOAT
#define CUBLAS_FLOATX CUDA_R_32F
#else
#define CUBLAS_FLOATX CUDA_R_16BF
#endif

static cublasLtHandle_t cublaslt_handle = NULL;
static void* cublaslt_workspace = NULL;

// the largest power of two up to 256 that divides the address. cuBLASLt's heuristic assumes
// 256-byte-aligned matrices unless told otherwise, and one layer's slice of a tensor stacked over
// layers is often less aligned (with C = 64 L and L odd, only 128 bytes): an algorithm chosen for
// 256 may then fail. So the preference states each pointer's true alignment.
static inline uint32_t pointer_alignment(const void* p) {
    uint32_t alignment = 256;
    while ((uintptr_t)p % alignment != 0) alignment /= 2;
    return alignment;
}

// D (m, n) = alpha op(A) op(B) + beta D, column-major, with an optional bias (m) epilogue.
// FP32 builds compute in strict fp32 (no TF32), so they can be compared with the CPU tightly.
static void cublaslt_gemm(floatX* d, const floatX* a, const floatX* b, const floatX* bias, int m,
                          int n, int k, int transa, int transb, int lda, int ldb, int ldd,
                          float beta) {
    if (cublaslt_handle == NULL) {
        cublasCheck(cublasLtCreate(&cublaslt_handle));
        cublaslt_workspace = device_malloc(CUBLASLT_WORKSPACE_BYTES);
    }
    cublasLtMatmulDesc_t desc;
    cublasCheck(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t opa = transa ? CUBLAS_OP_T : CUBLAS_OP_N, opb = transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
    if (bias != NULL) {
        cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
        cudaDataType_t bias_type = CUBLAS_FLOATX;
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    }
    cublasLtMatrixLayout_t la, lb, ld;
    cublasCheck(cublasLtMatrixLayoutCreate(&la, CUBLAS_FLOATX, transa ? k : m, transa ? m : k, lda));
    cublasCheck(cublasLtMatrixLayoutCreate(&lb, CUBLAS_FLOATX, transb ? n : k, transb ? k : n, ldb));
    cublasCheck(cublasLtMatrixLayoutCreate(&ld, CUBLAS_FLOATX, m, n, ldd));
    cublasLtMatmulPreference_t pref;
    cublasCheck(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = CUBLASLT_WORKSPACE_BYTES;
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    uint32_t align_a = pointer_alignment(a), align_b = pointer_alignment(b), align_d = pointer_alignment(d);
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof(align_a)));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof(align_b)));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d, sizeof(align_d)));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d, sizeof(align_d)));
    cublasLtMatmulHeuristicResult_t heuristic;
    int found = 0;
    cublasCheck(cublasLtMatmulAlgoGetHeuristic(cublaslt_handle, desc, la, lb, ld, ld, pref, 1, &heuristic, &found));
    if (found == 0) fail("cuBLASLt has no algorithm for a %d x %d x %d matmul (transa %d, transb %d, bias %d)", m, n, k, transa, transb, bias != NULL);
    float alpha = 1.0f;
    cublasCheck(cublasLtMatmul(cublaslt_handle, desc, &alpha, a, la, b, lb, &beta, d, ld, d, ld,
                               &heuristic.algo, cublaslt_workspace, CUBLASLT_WORKSPACE_BYTES, 0));
    cublasCheck(cublasLtMatmulPreferenceDestroy(pref));
    cublasCheck(cublasLtMatrixLayoutDestroy(la));
    cublasCheck(cublasLtMatrixLayoutDestroy(lb));
    cublasCheck(cublasLtMatrixLayoutDestroy(ld));
    cublasCheck(cublasLtMatmulDescDestroy(desc));
}

// out (N, OC) = inp (N, C) @ weight (OC, C)^T + bias (OC); bias may be NULL.
// Column-major view: out^T (OC, N) = op_T(weight as (C, OC)) @ inp^T (C, N).
static inline void matmul_forward(floatX* out, const floatX* inp, const floatX* weight,
                                  const floatX* bias, int N, int C, int OC) {
    cublaslt_gemm(out, weight, inp, bias, OC, N, C, 1, 0, C, C, OC, 0.0f);
}

// dbias (OC) += column sums of dout (N, OC): partial sums of row blocks, then one ordered pass
// (BIAS_ROWS_PER_BLOCK and the scratch size, bias_scratch_bytes: llmc/target.h)
__global__ void bias_backward_partial(float* partial, const floatX* dout, int N, int OC) {
    int o = blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= OC) return;
    int begin = blockIdx.y * BIAS_ROWS_PER_BLOCK, end = min(begin + BIAS_ROWS_PER_BLOCK, N);
    float sum = 0.0f;
    for (int n = begin; n < end; n++) sum += (float)dout[(size_t)n * OC + o];
    partial[(size_t)blockIdx.y * OC + o] = sum;
}

__global__ void bias_backward_final(floatX* dbias, const float* partial, int parts, int OC) {
    int o = blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= OC) return;
    float sum = 0.0f;
    for (int p = 0; p < parts; p++) sum += partial[(size_t)p * OC + o];
    dbias[o] = (floatX)((float)dbias[o] + sum);
}

static DeviceScratch matmul_scratch;

// The backward pass in its two halves, which a zero-bubble pipeline runs at different times
// (train_gpt2_pp.cu): the input gradient, which the layer below waits for, and the weight
// gradient, which nothing waits for.
// dinp (N, C) = dout (N, OC) @ weight (OC, C)            (overwritten)
static inline void matmul_backward_input(floatX* dinp, const floatX* dout, const floatX* weight, int N, int C, int OC) {
    // dinp^T (C, N) = weight as (C, OC) @ dout^T (OC, N)
    cublaslt_gemm(dinp, weight, dout, NULL, C, N, OC, 0, 0, C, OC, C, 0.0f);
}

// dweight (OC, C) += dout^T @ inp; dbias (OC) += column sums of dout   (accumulated; dbias may be NULL)
static inline void matmul_backward_weight(floatX* dweight, floatX* dbias, const floatX* dout, const floatX* inp, int N,
                                          int C, int OC) {
    // dweight^T (C, OC) += inp^T (C, N) @ op_T(dout^T as (OC, N))
    cublaslt_gemm(dweight, inp, dout, NULL, C, OC, N, 0, 1, C, OC, C, 1.0f);
    if (dbias != NULL) {
        int parts = ceil_div(N, BIAS_ROWS_PER_BLOCK);
        float* partial = (float*)scratch_get(&matmul_scratch, bias_scratch_bytes(N, OC));
        bias_backward_partial<<<dim3(ceil_div(OC, 256), parts), 256>>>(partial, dout, N, OC);
        cudaCheckLaunch();
        bias_backward_final<<<ceil_div(OC, 256), 256>>>(dbias, partial, parts, OC);
        cudaCheckLaunch();
    }
}

// both at once
static inline void matmul_backward(floatX* dinp, floatX* dweight, floatX* dbias,
                                   const floatX* dout, const floatX* inp, const floatX* weight,
                                   int N, int C, int OC) {
    matmul_backward_input(dinp, dout, weight, N, C, OC);
    matmul_backward_weight(dweight, dbias, dout, inp, N, C, OC);
}

// out (N, OC) += bias (OC): the bias of a row-parallel matmul, added once after the partial
// products of the ranks were summed (train_gpt2_tp.cu). Memory-bound (out read and written once),
// so one thread per 16-byte pack: OC is whole packs, so a pack never straddles two rows and its
// bias is one aligned pack too. Each element is added in fp32 and rounded to floatX once.
__global__ void bias_add_kernel(floatX* out, const floatX* bias, size_t packs, int OC) {
    size_t pack = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (pack >= packs) return;
    size_t i = pack * PACK16;
    int o = (int)(i % OC);
    Pack16 x = load16(out + i), b = load16(bias + o);
    for (int k = 0; k < PACK16; k++) x.v[k] = (floatX)((float)x.v[k] + (float)b.v[k]);
    store16(out + i, x);
}

static inline void bias_add(floatX* out, const floatX* bias, int N, int OC) {
    check_whole_packs("bias_add", "OC", (size_t)OC);
    size_t packs = (size_t)N * OC / PACK16;
    if (packs == 0) return;
    bias_add_kernel<<<ceil_div(packs, 256), 256>>>(out, bias, packs, OC);
    cudaCheckLaunch();
}

#endif
