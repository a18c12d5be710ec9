// GELU with the tanh approximation (Hendrycks & Gimpel 2016) on CUDA; elementwise, in fp32.
#ifndef LLMC_CUDA_GELU_CUH
#define LLMC_CUDA_GELU_CUH

#include "device.cuh"
#include "matmul.cuh"

#define GELU_SCALE 0.7978845608028654f  // sqrt(2 / pi)

// GELU's speed is set by memory bandwidth alone, so each thread moves 16 bytes (PACK16 elements)
// per load and store; N is a multiple of PACK16 (it is B T 4C).
// In bf16 builds cuBLASLt's GELU epilogues (matmul_forward_gelu and matmul_backward_input_gelu
// below) take their place by default, saving a read of (B, T, 4C) forward and a read and a write
// of it backward; these kernels remain for fp32 builds, LLMC_GELU=kernels, a GEMM cuBLASLt has no
// epilogue algorithm for, the forward that -r 1 and 2 recompute, and the tensor-parallel trainers. NVIDIA documents the epilogues as "apply GELU
// point-wise transform" (cublasLt.h, the cuBLAS guide) without saying which GELU, and GPT-2 trains
// with the tanh approximation: dev/cuda/gelu measures which formula they compute (tanh, forward and
// backward, fp32 and bf16, on an H200 on 2026-11-27: mean distance to tanh GELU 1e-7, to erf 2e-4).
__global__ void gelu_forward_kernel(floatX* out, const floatX* inp, size_t N) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * PACK16;
    if (i >= N) return;
    Pack16 x = load16(inp + i), y;
    for (int k = 0; k < PACK16; k++) {
        float a = (float)x.v[k];
        float u = GELU_SCALE * (a + 0.044715f * a * a * a);
        y.v[k] = (floatX)(a / (1.0f + expf(fminf(-2.0f * u, 80.0f))));  // 0.5 a (1 + tanh u), as llmc/cpu/gelu.h
    }
    store16(out + i, y);
}

__global__ void gelu_backward_kernel(floatX* dinp, const floatX* inp, const floatX* dout, size_t N) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * PACK16;
    if (i >= N) return;
    Pack16 x = load16(inp + i), dy = load16(dout + i), dx;
    for (int k = 0; k < PACK16; k++) {
        float a = (float)x.v[k];
        float e = expf(fminf(-2.0f * GELU_SCALE * (a + 0.044715f * a * a * a), 80.0f));
        float s = 1.0f / (1.0f + e);  // 0.5 (1 + tanh u); e s = 0.5 (1 - tanh u)
        float du = GELU_SCALE * (1.0f + 3.0f * 0.044715f * a * a);
        float grad = s + 2.0f * a * s * (e * s) * du;
        dx.v[k] = (floatX)((float)dy.v[k] * grad);
    }
    store16(dinp + i, dx);
}

static inline void gelu_forward(floatX* out, const floatX* inp, size_t N) {
    int kernel_span = kernel_time_begin("gelu forward", 0, 0);
    check_whole_packs("gelu_forward", "N", N);
    gelu_forward_kernel<<<ceil_div(N / PACK16, 256), 256>>>(out, inp, N);
    cudaCheckLaunch();
    kernel_time_end(kernel_span);
}

// dinp may be the same buffer as dout
static inline void gelu_backward(floatX* dinp, const floatX* inp, const floatX* dout, size_t N) {
    int kernel_span = kernel_time_begin("gelu backward", 0, 0);
    check_whole_packs("gelu_backward", "N", N);
    gelu_backward_kernel<<<ceil_div(N / PACK16, 256), 256>>>(dinp, inp, dout, N);
    cudaCheckLaunch();
    kernel_time_end(kernel_span);
}

// ---------------------------------------------------------------------------------------------
// The fc layer and its GELU as one GEMM each way: the forward's GEMM writes the GELU output and,
// as its aux matrix, GELU's input (GELU_AUX_BIAS); the backward's input-gradient GEMM of fcproj
// multiplies its product by GELU' of that input (DGELU) before it rounds. The forward computes
// GELU of the fp32 product, where the kernel reads it rounded to floatX; the backward multiplies
// the fp32 product (the kernel: rounded) by GELU' of fch as stored. Where cuBLASLt has no algorithm
// for the epilogue, the GEMM and the kernel. The choice is read once:
// - bf16 builds take the epilogues (LLMC_GELU=kernels: the kernels). A d12 step on an H200
//   (2026-11-27, LLMC_KERNEL_TIMES=1): fc GEMM and GELU 7.2 against 8.4 ms, fcproj's input
//   gradient and GELU' 7.6 against 9.6;
// - fp32 builds take the kernels (LLMC_GELU=epilogue: the epilogues), where cuBLASLt's fp32 GEMMs
//   with the epilogue measured slower (dev/cuda/gelu on the H200: fc 0.86 against 0.82 ms with
//   the kernel, fcproj's input gradient 1.01 against 0.88).
static inline int gelu_in_epilogue(void) {
    static int asked = -1;
    if (asked < 0)
        asked = env_choice("LLMC_GELU", FLOATX_IS_FLOAT ? 1 : 0) == 0;  // (1: kernels, fp32's default)
    return asked;
}
// the GEMMs whose epilogue computed GELU, and those that fell back to the kernels (cuBLASLt had no
// algorithm), for the run's last lines (ops.h's paths_print)
static long gelu_epilogue_gemms[2];

// one GEMM with a GELU epilogue (cublaslt_gemm's arguments, op(B) untransposed, beta 0), timed as
// the launch `op` C -> OC and counted; 0 when cuBLASLt has no algorithm for it: nothing ran, and no
// time is counted (the kernels that run instead time themselves)
static inline int gelu_epilogue_gemm(const char* op, int C, int OC, floatX* d, const floatX* a, const floatX* b,
                                     int epilogue, const floatX* bias, const floatX* aux, int m, int n, int k,
                                     int transa, int lda, int ldb, int ldd) {
    int kernel_span = kernel_time_begin(op, C, OC);
    int done = cublaslt_gemm(d, a, b, epilogue, bias, aux, m, n, k, transa, 0, lda, ldb, ldd, 0.0f);
    gelu_epilogue_gemms[!done]++;
    if (done) kernel_time_end(kernel_span);
    else kernel_time_drop(kernel_span);
    return done;
}

// fch (N, OC) = inp (N, C) @ weight (OC, C)^T + bias (OC; may be NULL), fch_gelu (N, OC) = GELU(fch).
// Returns 1 when the epilogue computed it (dev/cuda/gelu asks), 0 when the kernels did.
static inline int matmul_forward_gelu(floatX* fch_gelu, floatX* fch, const floatX* inp, const floatX* weight,
                                      const floatX* bias, int N, int C, int OC) {
    // column-major as matmul_forward: D = fch_gelu^T (OC, N), aux = fch^T, the same layout
    int epilogue = bias != NULL ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    if (gelu_in_epilogue() &&
        gelu_epilogue_gemm("matmul forward", C, OC, fch_gelu, weight, inp, epilogue, bias, fch, OC, N, C, 1, C, C, OC))
        return 1;
    matmul_forward(fch, inp, weight, bias, N, C, OC);
    gelu_forward(fch_gelu, fch, (size_t)N * OC);
    return 0;
}

// dfch (N, C) = (dout (N, OC) @ weight (OC, C)) * GELU'(fch (N, C)): the gradient at the GELU's
// input, from the gradient at fcproj's output (C is fcproj's input width, 4 x the model's); returns
// 1 when the epilogue computed it
static inline int matmul_backward_input_gelu(floatX* dfch, const floatX* dout, const floatX* weight, const floatX* fch,
                                             int N, int C, int OC) {
    // column-major as matmul_backward_input: D = dfch^T (C, N), aux = fch^T, the same layout
    if (gelu_in_epilogue() &&
        gelu_epilogue_gemm("matmul dinp", C, OC, dfch, weight, dout, CUBLASLT_EPILOGUE_DGELU, NULL, fch, C, N, OC, 0, C, OC, C))
        return 1;
    matmul_backward_input(dfch, dout, weight, N, C, OC);
    gelu_backward(dfch, fch, dfch, (size_t)N * C);
    return 0;
}

#endif
