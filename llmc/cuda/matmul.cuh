// Matmul on CUDA through cuBLASLt, with the bias added in the forward GEMM's epilogue and the
// bias gradient summed in the weight-gradient GEMM's epilogue (GELU's epilogues: gelu.cuh).
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

// Everything cuBLASLt's heuristic looks at that changes from call to call: the shapes, the
// transposes, the epilogue and each pointer's alignment (the types, the compute type and the
// workspace are fixed for a build). Two calls that agree on all of it can share one algorithm.
typedef struct {
    int m, n, k, transa, transb, lda, ldb, ldd;
    int epilogue;       // CUBLASLT_EPILOGUE_DEFAULT, _BIAS (add a bias), _BGRADB (sum op(B) over k), or
                        // GELU's: _GELU_AUX(_BIAS) (D = GELU(the product), aux = its input), _DGELU
    uint32_t align[5];  // of A, B, D (also C: the same matrix), the bias vector and the aux matrix
} GemmKey;

// the epilogues that read or write the bias vector, and those that write (GELU_AUX, GELU_AUX_BIAS)
// or read (DGELU) the aux matrix: GELU's input, of D's shape, type and leading dimension
static inline int epilogue_uses_bias(int e) {
    return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_BGRADB || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}
static inline int epilogue_uses_aux(int e) {
    return e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || e == CUBLASLT_EPILOGUE_DGELU;
}

// A GEMM's descriptors and the algorithm the heuristic chose, kept for the next call with the
// same key. Creating descriptors and asking the heuristic costs microseconds of host time per call,
// as much as a small GEMM itself; a training step repeats the same few dozen shapes, layer after
// layer, so they are set up once.
typedef struct {
    GemmKey key;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulAlgo_t algo;
    int found;          // 0: cuBLASLt has no algorithm for this key (allowed for BGRADB and GELU's, see below)
    long long used;     // when it was last used (the GEMM count then): the least recent goes first
} GemmPlan;

#define GEMM_PLANS 64  // a step of any trainer uses far fewer; when full, the least recently used goes
static GemmPlan gemm_plans[GEMM_PLANS];
static int gemm_plans_made = 0;
static long long gemm_calls = 0;

static void gemm_plan_destroy(GemmPlan* p) {
    cublasCheck(cublasLtMatrixLayoutDestroy(p->la));
    cublasCheck(cublasLtMatrixLayoutDestroy(p->lb));
    cublasCheck(cublasLtMatrixLayoutDestroy(p->ld));
    cublasCheck(cublasLtMatmulDescDestroy(p->desc));
}

// the plan for this key: found in the cache, or made (descriptors, layouts, heuristic) and kept.
// bias: the bias (BIAS) or bias-gradient (BGRADB) vector; aux: GELU's input matrix; the heuristic
// reads their alignments.
static GemmPlan* gemm_plan(const GemmKey* key, const void* bias, const void* aux) {
    gemm_calls++;
    int cached = gemm_plans_made < GEMM_PLANS ? gemm_plans_made : GEMM_PLANS, oldest = 0;
    for (int i = 0; i < cached; i++) {
        if (memcmp(&gemm_plans[i].key, key, sizeof(GemmKey)) == 0) {
            gemm_plans[i].used = gemm_calls;
            return &gemm_plans[i];
        }
        if (gemm_plans[i].used < gemm_plans[oldest].used) oldest = i;
    }
    if (cublaslt_handle == NULL) {
        cublasCheck(cublasLtCreate(&cublaslt_handle));
        AllocationKind was = allocation_kind(ALLOC_KERNELS);  // (made on first use: the memory table's kernel scratch)
        cublaslt_workspace = device_malloc(CUBLASLT_WORKSPACE_BYTES);
        allocation_kind(was);
    }
    GemmPlan* p = &gemm_plans[gemm_plans_made < GEMM_PLANS ? gemm_plans_made : oldest];
    if (gemm_plans_made >= GEMM_PLANS) gemm_plan_destroy(p);
    gemm_plans_made++;
    p->key = *key;
    p->used = gemm_calls;
    cublasCheck(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t opa = key->transa ? CUBLAS_OP_T : CUBLAS_OP_N, opb = key->transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
    cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
    if (key->epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
        cublasLtEpilogue_t epilogue = (cublasLtEpilogue_t)key->epilogue;
        cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    }
    if (epilogue_uses_bias(key->epilogue)) {
        // the vector has D's type: for a bias as NVIDIA documents the default, and for a bias
        // gradient the only type cuBLASLt writes (CUBLASLT_MATMUL_DESC_BIAS_POINTER in cublasLt.h)
        cudaDataType_t bias_type = CUBLAS_FLOATX;
        cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
        cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    }
    if (epilogue_uses_aux(key->epilogue)) {
        // the aux matrix is laid out as D (its type by default D's, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE)
        int64_t aux_ld = key->ldd;
        cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)));
        cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
    }
    int m = key->m, n = key->n, k = key->k;
    cublasCheck(cublasLtMatrixLayoutCreate(&p->la, CUBLAS_FLOATX, key->transa ? k : m, key->transa ? m : k, key->lda));
    cublasCheck(cublasLtMatrixLayoutCreate(&p->lb, CUBLAS_FLOATX, key->transb ? n : k, key->transb ? k : n, key->ldb));
    cublasCheck(cublasLtMatrixLayoutCreate(&p->ld, CUBLAS_FLOATX, m, n, key->ldd));
    cublasLtMatmulPreference_t pref;
    cublasCheck(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = CUBLASLT_WORKSPACE_BYTES;
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &key->align[0], sizeof(uint32_t)));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &key->align[1], sizeof(uint32_t)));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &key->align[2], sizeof(uint32_t)));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &key->align[2], sizeof(uint32_t)));
    cublasLtMatmulHeuristicResult_t heuristic;
    p->found = 0;
    // "no algorithm" comes back as found = 0, or as CUBLAS_STATUS_NOT_SUPPORTED when no heuristic
    // covers the configuration at all (cublasLt.h): both are an answer, not an error, here
    cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(cublaslt_handle, p->desc, p->la, p->lb, p->ld, p->ld, pref, 1,
                                                           &heuristic, &p->found);
    if (status == CUBLAS_STATUS_NOT_SUPPORTED) p->found = 0;
    else cublasCheck(status);
    if (p->found && heuristic.state != CUBLAS_STATUS_SUCCESS) p->found = 0;
    if (p->found) p->algo = heuristic.algo;
    cublasCheck(cublasLtMatmulPreferenceDestroy(pref));
    return p;
}

// D (m, n) = alpha op(A) op(B) + beta D, column-major, with an epilogue on `bias` (m values):
// none (DEFAULT), D += bias broadcast over the columns (BIAS), or bias = the sums of op(B) over k,
// one per column of D (BGRADB, n values; written, not added); or GELU's on `aux`, a matrix laid
// out as D: GELU_AUX_BIAS (aux = the product + bias, D = GELU(aux); GELU_AUX without the bias)
// and DGELU (D = the product times GELU'(aux)). Returns 0, having done nothing, when cuBLASLt has
// no algorithm for a BGRADB or GELU call (the caller then does the work in its own kernels); for
// any other call that is an error.
// FP32 builds compute in strict fp32 (no TF32), so they can be compared with the CPU tightly.
static int cublaslt_gemm(floatX* d, const floatX* a, const floatX* b, int epilogue, const floatX* bias, const floatX* aux,
                         int m, int n, int k, int transa, int transb, int lda, int ldb, int ldd, float beta) {
    GemmKey key;
    memset(&key, 0, sizeof(key));  // compared with memcmp: no stray bytes
    key.m = m, key.n = n, key.k = k, key.transa = transa, key.transb = transb;
    key.lda = lda, key.ldb = ldb, key.ldd = ldd, key.epilogue = epilogue;
    key.align[0] = pointer_alignment(a), key.align[1] = pointer_alignment(b), key.align[2] = pointer_alignment(d);
    key.align[3] = epilogue_uses_bias(epilogue) ? pointer_alignment(bias) : 0;
    key.align[4] = epilogue_uses_aux(epilogue) ? pointer_alignment(aux) : 0;
    GemmPlan* p = gemm_plan(&key, bias, aux);
    if (!p->found) {
        if (epilogue != CUBLASLT_EPILOGUE_DEFAULT && epilogue != CUBLASLT_EPILOGUE_BIAS) return 0;
        fail("cuBLASLt has no algorithm for a %d x %d x %d matmul (transa %d, transb %d, epilogue %d)", m, n, k, transa,
             transb, epilogue);
    }
    // this call's vector and aux matrix (the plan's have the same alignments)
    if (epilogue_uses_bias(epilogue))
        cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    if (epilogue_uses_aux(epilogue))
        cublasCheck(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
    float alpha = 1.0f;
    cublasCheck(cublasLtMatmul(cublaslt_handle, p->desc, &alpha, a, p->la, b, p->lb, &beta, d, p->ld, d, p->ld, &p->algo,
                               cublaslt_workspace, CUBLASLT_WORKSPACE_BYTES, 0));
    return 1;
}

// out (N, OC) = inp (N, C) @ weight (OC, C)^T + bias (OC); bias may be NULL.
// Column-major view: out^T (OC, N) = op_T(weight as (C, OC)) @ inp^T (C, N).
static inline void matmul_forward(floatX* out, const floatX* inp, const floatX* weight,
                                  const floatX* bias, int N, int C, int OC) {
    int kernel_span = kernel_time_begin("matmul forward", C, OC);
    cublaslt_gemm(out, weight, inp, bias != NULL ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT, bias, NULL, OC, N,
                  C, 1, 0, C, C, OC, 0.0f);
    kernel_time_end(kernel_span);
}

// dbias (OC) += column sums of dout (N, OC) as separate kernels, for where cuBLASLt's epilogue
// has no algorithm: partial sums of row blocks, then one ordered pass (BIAS_ROWS_PER_BLOCK and the
// scratch size, bias_scratch_bytes: llmc/target.h). They read all of dout once more: at d12, B=64,
// T=1024, 0.9 GB per layer, about 3.6 ms of a step on an H100 (dev/bench/roofline.py -epilogue 0).
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

static inline void bias_backward_kernels(floatX* dbias, const floatX* dout, int N, int OC) {
    int parts = ceil_div(N, BIAS_ROWS_PER_BLOCK);
    float* partial = (float*)scratch_get(&matmul_scratch, bias_scratch_bytes(N, OC));
    bias_backward_partial<<<dim3(ceil_div(OC, 256), parts), 256>>>(partial, dout, N, OC);
    cudaCheckLaunch();
    bias_backward_final<<<ceil_div(OC, 256), 256>>>(dbias, partial, parts, OC);
    cudaCheckLaunch();
}

// the bias gradient in the GEMM's epilogue, unless LLMC_BIAS_GRAD=kernels (read once): both paths
// can then be timed on a GPU (dev/bench/bench_gpu.sh), and tested under the emulator
static inline int bias_grad_in_epilogue(void) {
    static int asked = -1;
    if (asked < 0) asked = env_choice("LLMC_BIAS_GRAD", 0) == 0;
    return asked;
}

// dbias (OC) += this pass's bias gradient (OC), which the epilogue wrote (it cannot add). In
// bf16 that is a second rounding (the sum to bf16, then the addition), where the kernels round
// their fp32 sum once: as PyTorch, which also accumulates a bf16 gradient into a bf16 .grad.
__global__ void bias_accumulate_kernel(floatX* dbias, const floatX* step, int OC) {
    int o = blockIdx.x * blockDim.x + threadIdx.x;
    if (o < OC) dbias[o] = (floatX)((float)dbias[o] + (float)step[o]);
}

// The backward pass in its two halves, which a zero-bubble pipeline runs at different times
// (train_gpt2_pp.cu): the input gradient, which the layer below waits for, and the weight
// gradient, which nothing waits for.
// dinp (N, C) = dout (N, OC) @ weight (OC, C)            (overwritten)
static inline void matmul_backward_input(floatX* dinp, const floatX* dout, const floatX* weight, int N, int C, int OC) {
    int kernel_span = kernel_time_begin("matmul dinp", C, OC);
    // dinp^T (C, N) = weight as (C, OC) @ dout^T (OC, N)
    cublaslt_gemm(dinp, weight, dout, CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL, C, N, OC, 0, 0, C, OC, C, 0.0f);
    kernel_time_end(kernel_span);
}

// dweight (OC, C) += dout^T @ inp; dbias (OC) += column sums of dout   (accumulated; dbias may be NULL)
static inline void matmul_backward_weight(floatX* dweight, floatX* dbias, const floatX* dout, const floatX* inp, int N,
                                          int C, int OC) {
    // dweight^T (C, OC) += inp^T (C, N) @ op_T(dout^T as (OC, N)). The GEMM reads all of dout
    // anyway, so the bias gradient, dout's column sums, comes almost free from its epilogue:
    // BGRADB sums op(B) = dout (N, OC) over k = N, one value per column of D, that is per output
    // channel. It writes this pass's sums (in floatX, D's type) to scratch; a tiny kernel adds them
    // to dbias, which accumulates over micro-batches.
    int kernel_span = kernel_time_begin("matmul dweight", C, OC), epilogue_done = 0;
    if (dbias != NULL && bias_grad_in_epilogue()) {
        // the scratch is bias_scratch_bytes, which the fallback needs (>= OC floatX): one size
        floatX* step = (floatX*)scratch_get(&matmul_scratch, bias_scratch_bytes(N, OC));
        epilogue_done = cublaslt_gemm(dweight, inp, dout, CUBLASLT_EPILOGUE_BGRADB, step, NULL, C, OC, N, 0, 1, C, OC, C,
                                      1.0f);
        if (epilogue_done) {
            bias_accumulate_kernel<<<ceil_div(OC, 256), 256>>>(dbias, step, OC);
            cudaCheckLaunch();
        }
    }
    if (!epilogue_done) {  // no bias, or no epilogue algorithm: the plain GEMM, then the bias's kernels
        cublaslt_gemm(dweight, inp, dout, CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL, C, OC, N, 0, 1, C, OC, C, 1.0f);
        if (dbias != NULL) bias_backward_kernels(dbias, dout, N, OC);
    }
    kernel_time_end(kernel_span);
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
    int kernel_span = kernel_time_begin("bias add", 0, 0);
    bias_add_kernel<<<ceil_div(packs, 256), 256>>>(out, bias, packs, OC);
    cudaCheckLaunch();
    kernel_time_end(kernel_span);
}

#endif
