/*
GELU (tanh approximation) forward and backward, checked against the CPU backend.
  make dev/cuda/gelu && ./dev/cuda/gelu
v1: one element per thread: 2-byte loads and stores in bf16.
v2: 16-byte loads and stores (8 bf16 or 4 fp32 per access; llmc/cuda/gelu.cuh): fewer, wider
    memory transactions for a kernel whose speed is set by memory bandwidth alone.
v3: no GELU kernel: cuBLASLt's epilogues in the fc layer's GEMMs (matmul_forward_gelu and
    matmul_backward_input_gelu, llmc's default): forward, GELU_AUX_BIAS writes the GELU
    output and its input (aux); backward, DGELU multiplies fcproj's input gradient by GELU' of
    aux before rounding. Timed beside v2's GEMM + kernel at the fc layer's shapes. NVIDIA does not
    document which GELU the epilogues compute, and GPT-2 needs the tanh approximation, so v3 also
    tells the formula: where tanh and erf GELU differ, the mean of (result - formula), signed by
    the sign of the difference, is about 0 for the formula computed (rounding is unbiased) and
    about the mean difference for the other. It fails unless tanh is the nearer. (Under the
    emulator the epilogue is the emulator's, tanh by construction: only the GPU's answer counts.)
*/
#include "common.h"
namespace cpu {
#include "llmc/cpu/gelu.h"
}
#include "llmc/cuda/gelu.cuh"

__global__ void gelu_forward_v1(floatX* out, const floatX* inp, size_t N) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) return;
    float x = (float)inp[i];
    out[i] = (floatX)(0.5f * x * (1.0f + tanhf(GELU_SCALE * (x + 0.044715f * x * x * x))));
}

__global__ void gelu_backward_v1(floatX* dinp, const floatX* inp, const floatX* dout, size_t N) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) return;
    float x = (float)inp[i];
    float th = tanhf(GELU_SCALE * (x + 0.044715f * x * x * x));
    float du = GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
    float grad = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * du;
    dinp[i] = (floatX)((float)dout[i] * grad);
}

// the two GELUs in double, and their derivatives: GPT-2's tanh approximation and the exact x Phi(x)
static double gelu_tanh_ref(double x) { return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }
static double gelu_erf_ref(double x) { return 0.5 * x * (1.0 + erf(x / sqrt(2.0))); }
static double gelu_tanh_grad_ref(double x) {
    double t = tanh(0.7978845608028654 * (x + 0.044715 * x * x * x));
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * x * x);
}
static double gelu_erf_grad_ref(double x) { return 0.5 * (1.0 + erf(x / sqrt(2.0))) + x * exp(-0.5 * x * x) / sqrt(2.0 * M_PI); }

// Which GELU a result holds, from n elements and both formulas' values: the mean of
// (result - formula) over the elements where the formulas differ by more than 1e-6, each signed
// by sign(tanh - erf); 1 when the tanh formula's mean is the nearer to 0
static int gelu_is_tanh(const char* name, const float* got, const double* by_tanh, const double* by_erf, size_t n) {
    double to_tanh = 0.0, to_erf = 0.0, gap = 0.0;
    size_t counted = 0;
    for (size_t i = 0; i < n; i++) {
        double d = by_tanh[i] - by_erf[i];
        if (fabs(d) <= 1e-6) continue;
        double sign = d > 0 ? 1.0 : -1.0;
        to_tanh += (got[i] - by_tanh[i]) * sign;
        to_erf += (got[i] - by_erf[i]) * sign;
        gap += fabs(d);
        counted++;
    }
    if (counted == 0) {
        printf("  %-22s FAIL: no element where the formulas differ\n", name);
        return 0;
    }
    int tanh_nearer = fabs(to_tanh) < fabs(to_erf);
    printf("  %-22s %s: over %zu elements (mean |tanh - erf| %.2e), mean signed distance to tanh GELU %.2e, "
           "to erf GELU %.2e: %s\n", name, tanh_nearer ? "ok" : "FAIL", counted, gap / counted, to_tanh / counted,
           to_erf / counted, tanh_nearer ? "tanh" : "erf");
    return tanh_nearer;
}

// v3: the fc layer forward (fch_gelu = GELU(inp W^T + b), fch = its input) and fcproj's input
// gradient through GELU' (dfch = (dout W2) GELU'(fch)) in cuBLASLt's epilogues, beside v2's
// GEMM + kernel. Inputs are spread so that GELU's input covers about [-8, 8], where the two
// formulas differ; the references are computed for every `stride`-th row.
static int check_epilogues(void) {
    int N = GPU_OR_EMU(8 * 1024, 64), C = GPU_OR_EMU(768, 64), F = 4 * C, stride = GPU_OR_EMU(16, 1);
    float* inp = random_floats((size_t)N * C, 1.0f);
    float* w = random_floats((size_t)F * C, 2.0f / sqrtf((float)C));
    float* b = random_floats(F, 0.5f);
    float* dout = random_floats((size_t)N * C, 1.0f);
    float* w2 = random_floats((size_t)C * F, 1.0f / sqrtf((float)F));
    round_like_floatX(inp, (size_t)N * C), round_like_floatX(w, (size_t)F * C), round_like_floatX(b, F);
    round_like_floatX(dout, (size_t)N * C), round_like_floatX(w2, (size_t)C * F);
    floatX *d_inp = to_device(inp, (size_t)N * C), *d_w = to_device(w, (size_t)F * C), *d_b = to_device(b, F);
    floatX *d_dout = to_device(dout, (size_t)N * C), *d_w2 = to_device(w2, (size_t)C * F);
    size_t NF = (size_t)N * F;
    floatX *d_fch = (floatX*)device_malloc(NF * sizeof(floatX)), *d_gelu = (floatX*)device_malloc(NF * sizeof(floatX));
    floatX* d_dfch = (floatX*)device_malloc(NF * sizeof(floatX));
    double flops = 2.0 * N * C * F;
    float ms;
    int ok = 1;
    printf("gelu in cuBLASLt's epilogues: fc N=%d C=%d -> %d (%s)\n", N, C, F, PRECISION_NAME);

    // v2 first (the times to beat), then v3
    TIME_KERNEL(ms, 20, (matmul_forward(d_fch, d_inp, d_w, d_b, N, C, F), gelu_forward(d_gelu, d_fch, NF)));
    report("v2 fc GEMM + kernel", ms, 0, flops);
    TIME_KERNEL(ms, 20, (matmul_backward_input(d_dfch, d_dout, d_w2, N, F, C), gelu_backward(d_dfch, d_fch, d_dfch, NF)));
    report("v2 dinp GEMM + kernel", ms, 0, flops);
    device_memset_zero(d_fch, NF * sizeof(floatX)), device_memset_zero(d_gelu, NF * sizeof(floatX));
    device_memset_zero(d_dfch, NF * sizeof(floatX));
    int fused = matmul_forward_gelu(d_gelu, d_fch, d_inp, d_w, d_b, N, C, F);
    fused &= matmul_backward_input_gelu(d_dfch, d_dout, d_w2, d_fch, N, F, C);
    if (!fused) {  // (not a failure: the trainer then takes the kernels, and says so at its end)
        printf("  v3 epilogues           skipped: cuBLASLt has no algorithm for GELU_AUX_BIAS or DGELU in %s\n",
               PRECISION_NAME);
        free(inp), free(w), free(b), free(dout), free(w2);
        device_free(d_inp), device_free(d_w), device_free(d_b), device_free(d_dout), device_free(d_w2);
        device_free(d_fch), device_free(d_gelu), device_free(d_dfch);
        return 1;
    }
    TIME_KERNEL(ms, 20, matmul_forward_gelu(d_gelu, d_fch, d_inp, d_w, d_b, N, C, F));
    report("v3 fc GELU_AUX_BIAS", ms, 0, flops);
    TIME_KERNEL(ms, 20, matmul_backward_input_gelu(d_dfch, d_dout, d_w2, d_fch, N, F, C));
    report("v3 dinp DGELU", ms, 0, flops);

    // the sampled rows: fch (the aux matrix) against the product in double; the GELU output
    // against both formulas applied to that product, dfch to fch as stored (what DGELU reads)
    int rows = ceil_div(N, stride);
    size_t n = (size_t)rows * F;
    float *fch = (float*)malloc_check(NF * sizeof(float)), *gelu = (float*)malloc_check(NF * sizeof(float));
    float* dfch = (float*)malloc_check(NF * sizeof(float));
    copy_device_to_floats(fch, d_fch, NF), copy_device_to_floats(gelu, d_gelu, NF), copy_device_to_floats(dfch, d_dfch, NF);
    float *pre = (float*)malloc_check(n * sizeof(float)), *got = (float*)malloc_check(n * sizeof(float));
    float *got_d = (float*)malloc_check(n * sizeof(float)), *fch_rows = (float*)malloc_check(n * sizeof(float));
    float* want = (float*)malloc_check(n * sizeof(float));
    double *by_tanh = (double*)malloc_check(n * sizeof(double)), *by_erf = (double*)malloc_check(n * sizeof(double));
    double *dby_tanh = (double*)malloc_check(n * sizeof(double)), *dby_erf = (double*)malloc_check(n * sizeof(double));
    #pragma omp parallel for
    for (int r = 0; r < rows; r++) {
        size_t row = (size_t)r * stride;
        for (int f = 0; f < F; f++) {
            double p = b[f], g = 0.0;
            for (int c = 0; c < C; c++) {
                p += (double)inp[row * C + c] * w[(size_t)f * C + c];
                g += (double)dout[row * C + c] * w2[(size_t)c * F + f];
            }
            size_t i = (size_t)r * F + f;
            double x = fch[row * F + f];
            pre[i] = (float)p, fch_rows[i] = (float)x;
            got[i] = gelu[row * F + f], got_d[i] = dfch[row * F + f];
            by_tanh[i] = gelu_tanh_ref(p), by_erf[i] = gelu_erf_ref(p);  // from the fp32 sum, as the epilogue
            dby_tanh[i] = g * gelu_tanh_grad_ref(x), dby_erf[i] = g * gelu_erf_grad_ref(x);
        }
    }
    float tol = default_tolerance();
    ok &= compare_arrays("v3 fch (aux)", fch_rows, pre, n, tol);
    for (size_t i = 0; i < n; i++) want[i] = (float)by_tanh[i];
    ok &= compare_arrays("v3 GELU (tanh)", got, want, n, tol);
    for (size_t i = 0; i < n; i++) want[i] = (float)dby_tanh[i];
    ok &= compare_arrays("v3 dfch (tanh)", got_d, want, n, tol);
    ok &= gelu_is_tanh("v3 forward formula", got, by_tanh, by_erf, n);
    ok &= gelu_is_tanh("v3 backward formula", got_d, dby_tanh, dby_erf, n);
    free(inp), free(w), free(b), free(dout), free(w2), free(fch), free(gelu), free(dfch), free(pre), free(got);
    free(got_d), free(fch_rows), free(want), free(by_tanh), free(by_erf), free(dby_tanh), free(dby_erf);
    device_free(d_inp), device_free(d_w), device_free(d_b), device_free(d_dout), device_free(d_w2);
    device_free(d_fch), device_free(d_gelu), device_free(d_dfch);
    return ok;
}

int main(void) {
    size_t N = GPU_OR_EMU((size_t)8 * 1024 * 3072, (size_t)1 << 16);  // B*T*4C of a GPT-2 124M layer at B=8
    float* x = random_floats(N, 1.0f);
    float* dy = random_floats(N, 1.0f);
    round_like_floatX(x, N);
    round_like_floatX(dy, N);
    float* y = (float*)malloc_check(N * sizeof(float));
    float* dx = (float*)malloc_check(N * sizeof(float));
    cpu::gelu_forward(y, x, N);
    cpu::gelu_backward(dx, x, dy, N);

    floatX *d_x = to_device(x, N), *d_dy = to_device(dy, N);
    floatX* d_y = (floatX*)device_malloc(N * sizeof(floatX));
    floatX* d_dx = (floatX*)device_malloc(N * sizeof(floatX));
    float tol = default_tolerance(), ms;
    int ok = 1;
    printf("gelu N=%zu (%s)\n", N, PRECISION_NAME);

    gelu_forward_v1<<<ceil_div(N, 256), 256>>>(d_y, d_x, N);
    cudaCheckLaunch();
    ok &= validate("v1 forward", d_y, y, N, tol);
    TIME_KERNEL(ms, 20, (gelu_forward_v1<<<ceil_div(N, 256), 256>>>(d_y, d_x, N)));
    report("v1 forward", ms, 2.0 * N * sizeof(floatX), 0);

    gelu_backward_v1<<<ceil_div(N, 256), 256>>>(d_dx, d_x, d_dy, N);
    cudaCheckLaunch();
    ok &= validate("v1 backward", d_dx, dx, N, tol);
    TIME_KERNEL(ms, 20, (gelu_backward_v1<<<ceil_div(N, 256), 256>>>(d_dx, d_x, d_dy, N)));
    report("v1 backward", ms, 3.0 * N * sizeof(floatX), 0);

    device_memset_zero(d_y, N * sizeof(floatX));
    gelu_forward(d_y, d_x, N);
    ok &= validate("v2 forward 16B", d_y, y, N, tol);
    TIME_KERNEL(ms, 20, gelu_forward(d_y, d_x, N));
    report("v2 forward 16B", ms, 2.0 * N * sizeof(floatX), 0);

    device_memset_zero(d_dx, N * sizeof(floatX));
    gelu_backward(d_dx, d_x, d_dy, N);
    ok &= validate("v2 backward 16B", d_dx, dx, N, tol);
    TIME_KERNEL(ms, 20, gelu_backward(d_dx, d_x, d_dy, N));
    report("v2 backward 16B", ms, 3.0 * N * sizeof(floatX), 0);

    setenv("LLMC_GELU", "epilogue", 1);  // (before the launchers first read it)
    ok &= check_epilogues();
    return finish(ok);
}
