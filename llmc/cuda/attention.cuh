// Causal multi-head self-attention on CUDA, two paths behind one launcher:
// - flash (flash_attention.cuh): fused kernels on tensor cores, no T x T matrix in memory; the
//   default in bf16 builds for head sizes 16, 32 and 64 (GPT-2's is 64);
// - cuBLAS (below): q k^T and att v as batched GEMMs on tensor cores (one GEMM per batch x head),
//   the causal softmax as a kernel between them, the probabilities att (B, NH, T, T) stored for the
//   backward pass as on the CPU. FP32 builds use it (strict fp32, for exact comparison with the
//   reference), as do other head sizes, and LLMC_ATTENTION=cublas in the environment.
// qkv (B, T, 3C) holds q, k, v side by side, each split into NH heads of size hs = C / NH.
//
// cuBLAS is column-major: a row-major (T, hs) matrix is a column-major (hs, T) one. Writing Xc
// for that view of X, scores^T = Kc^T Qc, y = att v is Yc = Vc attc, and so on below.
#ifndef LLMC_CUDA_ATTENTION_CUH
#define LLMC_CUDA_ATTENTION_CUH

#include <cublas_v2.h>
#include "device.cuh"
#include "matmul.cuh"
#include "flash_attention.cuh"
#include "flash_hopper.cuh"
#include "flash_hopper_backward.cuh"

static cublasHandle_t cublas_handle = NULL;

// for each of `batch` problems: C (m, n) = alpha op(A) op(B) + beta C, column-major, strided
static void gemm_batched(floatX* c, const floatX* a, const floatX* b, int m, int n, int k,
                         int transa, int transb, int lda, long stride_a, int ldb, long stride_b,
                         int ldc, long stride_c, int batch, float alpha, float beta) {
    if (cublas_handle == NULL) cublasCheck(cublasCreate(&cublas_handle));
    cublasCheck(cublasGemmStridedBatchedEx(
        cublas_handle, transa ? CUBLAS_OP_T : CUBLAS_OP_N, transb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k,
        &alpha, a, CUBLAS_FLOATX, lda, stride_a, b, CUBLAS_FLOATX, ldb, stride_b, &beta, c,
        CUBLAS_FLOATX, ldc, stride_c, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// heads (B, NH, T, hs) <- the columns offset..offset+C of rows of `width` in x (B, T, width):
// every head's rows made contiguous. qkv gives q, k, v with width 3C and offsets 0, C, 2C.
__global__ void attention_to_heads(floatX* heads, const floatX* x, int B, int T, int NH, int hs,
                                   int width, int offset) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;  // over (b, h, t, i)
    if (idx >= (size_t)B * NH * T * hs) return;
    int i = (int)(idx % hs), t = (int)((idx / hs) % T), h = (int)((idx / hs / T) % NH);
    int b = (int)(idx / ((size_t)hs * T * NH));
    heads[idx] = x[((size_t)b * T + t) * width + offset + (size_t)h * hs + i];
}

// the inverse: heads (B, NH, T, hs) -> columns offset..offset+C of x (B, T, width)
__global__ void attention_from_heads(floatX* x, const floatX* heads, int B, int T, int NH, int hs,
                                     int width, int offset) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * NH * T * hs) return;
    int i = (int)(idx % hs), t = (int)((idx / hs) % T), h = (int)((idx / hs / T) % NH);
    int b = (int)(idx / ((size_t)hs * T * NH));
    x[((size_t)b * T + t) * width + offset + (size_t)h * hs + i] = heads[idx];
}

static inline void attention_layout(floatX* dst, const floatX* src, int to_heads, int B, int T,
                                    int NH, int hs, int width, int offset) {
    size_t n = (size_t)B * T * NH * hs;
    if (to_heads) attention_to_heads<<<ceil_div(n, 256), 256>>>(dst, src, B, T, NH, hs, width, offset);
    else attention_from_heads<<<ceil_div(n, 256), 256>>>(dst, src, B, T, NH, hs, width, offset);
    cudaCheckLaunch();
}

// one warp per row of scores (already scaled by 1/sqrt(hs)): causal softmax into att
__global__ void attention_softmax(floatX* att, const floatX* scores, size_t rows, int T) {
    int lane = threadIdx.x % 32;
    size_t row = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= rows) return;
    int t = (int)(row % T);
    const floatX* s = scores + row * T;
    float maxval = -INFINITY;
    for (int t2 = lane; t2 <= t; t2 += 32) maxval = fmaxf(maxval, (float)s[t2]);
    maxval = warp_max(maxval);
    float sum = 0.0f;
    for (int t2 = lane; t2 <= t; t2 += 32) sum += expf((float)s[t2] - maxval);
    float inv = 1.0f / warp_sum(sum);
    for (int t2 = lane; t2 < T; t2 += 32) {
        att[row * T + t2] = (floatX)(t2 <= t ? expf((float)s[t2] - maxval) * inv : 0.0f);
    }
}

// softmax backward in place: datt -> dscores = att (datt - sum att datt) * scale, zero above the
// diagonal; one warp per row
__global__ void attention_softmax_backward(floatX* dscores, const floatX* att, size_t rows, int T,
                                           float scale) {
    int lane = threadIdx.x % 32;
    size_t row = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= rows) return;
    int t = (int)(row % T);
    floatX* d = dscores + row * T;
    const floatX* p = att + row * T;
    float dot = 0.0f;
    for (int t2 = lane; t2 <= t; t2 += 32) dot += (float)p[t2] * (float)d[t2];
    dot = warp_sum(dot);
    for (int t2 = lane; t2 < T; t2 += 32) {
        d[t2] = (floatX)(t2 <= t ? (float)p[t2] * ((float)d[t2] - dot) * scale : 0.0f);
    }
}

static DeviceScratch attention_scratch;

// scratch laid out as q, k, v and one more (B, NH, T, hs) tensor, then a (B, NH, T, T) score
// matrix (attention_cublas_scratch_bytes, llmc/target.h); q, k and v are filled from qkv.
// Returns q; the others follow at steps of B*T*C.
static floatX* attention_split_qkv(const floatX* qkv, int B, int T, int C, int NH) {
    size_t n = (size_t)B * T * C;
    floatX* q = (floatX*)scratch_get(&attention_scratch, attention_cublas_scratch_bytes(B, T, C, NH, sizeof(floatX)));
    for (int part = 0; part < 3; part++) attention_layout(q + part * n, qkv, 1, B, T, NH, C / NH, 3 * C, part * C);
    return q;
}

// out (B, T, C) = attention output; att (B, NH, T, T) = the probabilities, zero above the diagonal
static inline void attention_forward_cublas(floatX* out, floatX* att, const floatX* qkv, int B, int T,
                                            int C, int NH) {
    int hs = C / NH;
    size_t n = (size_t)B * T * C, rows = (size_t)B * NH * T;
    long head = (long)T * hs, square = (long)T * T;
    floatX* q = attention_split_qkv(qkv, B, T, C, NH);
    floatX *k = q + n, *v = k + n, *y = v + n, *scores = y + n;
    // scores (T, T) = q k^T / sqrt(hs), as scores^T = Kc^T Qc per (b, h)
    gemm_batched(scores, k, q, T, T, hs, 1, 0, hs, head, hs, head, T, square, B * NH,
                 1.0f / sqrtf((float)hs), 0.0f);
    attention_softmax<<<ceil_div(rows, 8), 256>>>(att, scores, rows, T);
    cudaCheckLaunch();
    // y (T, hs) = att v, as Yc = Vc attc
    gemm_batched(y, v, att, hs, T, T, 0, 0, hs, head, T, square, hs, head, B * NH, 1.0f, 0.0f);
    attention_layout(out, y, 0, B, T, NH, hs, C, 0);
}

// dqkv (B, T, 3C) = gradient of the attention output dout (B, T, C) (overwritten)
static inline void attention_backward_cublas(floatX* dqkv, const floatX* dout, const floatX* qkv,
                                             const floatX* att, int B, int T, int C, int NH) {
    int hs = C / NH;
    size_t n = (size_t)B * T * C, rows = (size_t)B * NH * T;
    long head = (long)T * hs, square = (long)T * T;
    floatX* q = attention_split_qkv(qkv, B, T, C, NH);
    floatX *k = q + n, *v = k + n, *dy = v + n, *dscores = dy + n;
    attention_layout(dy, dout, 1, B, T, NH, hs, C, 0);
    // datt (T, T) = dy v^T, as datt^T = Vc^T DYc
    gemm_batched(dscores, v, dy, T, T, hs, 1, 0, hs, head, hs, head, T, square, B * NH, 1.0f, 0.0f);
    // dv (T, hs) = att^T dy, as DVc = DYc attc^T; over v, which datt was the last to read
    gemm_batched(v, dy, att, hs, T, T, 0, 1, hs, head, T, square, hs, head, B * NH, 1.0f, 0.0f);
    // through the softmax and the 1/sqrt(hs) scale
    attention_softmax_backward<<<ceil_div(rows, 8), 256>>>(dscores, att, rows, T, 1.0f / sqrtf((float)hs));
    cudaCheckLaunch();
    // dq (T, hs) = ds k, as DQc = Kc dsc; over dy, no longer needed
    gemm_batched(dy, k, dscores, hs, T, T, 0, 0, hs, head, T, square, hs, head, B * NH, 1.0f, 0.0f);
    // dk (T, hs) = ds^T q, as DKc = Qc dsc^T; over k, which dq was the last to read
    gemm_batched(k, q, dscores, hs, T, T, 0, 1, hs, head, T, square, hs, head, B * NH, 1.0f, 0.0f);
    attention_layout(dqkv, dy, 0, B, T, NH, hs, 3 * C, 0);
    attention_layout(dqkv, k, 0, B, T, NH, hs, 3 * C, C);
    attention_layout(dqkv, v, 0, B, T, NH, hs, 3 * C, 2 * C);
}

// flash unless LLMC_ATTENTION=cublas, where the build and head size allow it; the environment is
// read once, and a value other than flash or cublas, or flash where it cannot run, is an error
static inline int attention_uses_flash(int C, int NH) {
    static int asked = -1;  // 0: nothing asked, 1: flash, 2: cublas
    if (asked < 0) asked = env_choice("LLMC_ATTENTION", -1) + 1;
    int supported = flash_attention_supports(sizeof(floatX), C / NH);
    if (asked == 1 && !supported) {
        fail("LLMC_ATTENTION=flash needs a bf16 build and a head size of 16, 32 or 64 (this one: %s, %d)",
             PRECISION_NAME, C / NH);
    }
    return supported && asked != 2;
}
// (what each path keeps for the backward pass, the flash path's log-sum-exp of each row
// (B, NH, T) or the cuBLAS path's probabilities (B, NH, T, T), and each path's scratch are
// counted in llmc/target.h and model.h)

// LLMC_FLASH=fa3 (read once) asks for FlashAttention-3's machinery (flash_hopper.cuh and
// flash_hopper_backward.cuh: TMA loads, a producer warpgroup, two consumer warpgroups in pingpong,
// the forward's softmax under the next product);
// it runs where the build has it (sm_90a) and the head size is 64, and the calls that fell back
// to mma.sync are counted (paths_print)
static inline int flash_fa3_asked(void) {
    static int asked = -1;
    if (asked < 0) asked = env_choice("LLMC_FLASH", 0) == 2;
    return asked;
}
static long flash_fa3_calls[2];  // taken, fell back

static inline void attention_forward(floatX* out, void* state, const floatX* qkv, int B, int T,
                                     int C, int NH) {
    int kernel_span = kernel_time_begin("attention forward", 0, 0);
#if !FLOATX_IS_FLOAT
    if (attention_uses_flash(C, NH) && flash_fa3_asked()) {
#if defined(LLMC_WGMMA)
        if (C == 64 * NH) {
            flash_fa3_calls[0]++;
            attention_forward_flash_hopper(out, (float*)state, qkv, B, T, C, NH);
            kernel_time_end(kernel_span);
            return;
        }
#endif
        flash_fa3_calls[1]++;
    }
    if (attention_uses_flash(C, NH)) {
        attention_forward_flash(out, (float*)state, qkv, B, T, C, NH);
        kernel_time_end(kernel_span);
        return;
    }
#endif
    attention_forward_cublas(out, (floatX*)state, qkv, B, T, C, NH);
    kernel_time_end(kernel_span);
}

// out: the forward's output (B, T, C), which the flash path needs
static inline void attention_backward(floatX* dqkv, const floatX* dout, const floatX* qkv,
                                      const floatX* out, const void* state, int B, int T, int C,
                                      int NH) {
    int kernel_span = kernel_time_begin("attention backward", 0, 0);
#if !FLOATX_IS_FLOAT
    if (attention_uses_flash(C, NH) && flash_fa3_asked()) {
#if defined(LLMC_WGMMA)
        if (C == 64 * NH) {
            flash_fa3_calls[0]++;
            attention_backward_flash_hopper(dqkv, dout, qkv, out, (const float*)state, B, T, C, NH);
            if (flash_one_kernel_asked()) flash_one_kernel_calls[1]++;
            kernel_time_end(kernel_span);
            return;
        }
#endif
        flash_fa3_calls[1]++;
    }
    if (attention_uses_flash(C, NH)) {
        attention_backward_flash(dqkv, dout, qkv, out, (const float*)state, B, T, C, NH);
        kernel_time_end(kernel_span);
        return;
    }
#endif
    (void)out;
    attention_backward_cublas(dqkv, dout, qkv, (const floatX*)state, B, T, C, NH);
    kernel_time_end(kernel_span);
}

#endif
