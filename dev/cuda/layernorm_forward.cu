/*
LayerNorm forward: variants from naive to fast, checked against the CPU backend.
  make dev/cuda/layernorm_forward && ./dev/cuda/layernorm_forward
v1: one thread per row. Simple, but each thread walks its own row: the 32 threads of a warp touch
    32 different rows, so no load is coalesced.
v2: one warp per row: lanes read consecutive channels, coalesced, and warp shuffles do the sums;
    but x is read three times (mean, variance, output), 2 bytes per load.
v3: one warp per row, the row kept in registers after the first read, so x is read from memory
    once instead of three times.
v4: v3 with 16-byte loads and stores, the row as packs of 8 bf16 in registers, the kernel
    templated on the packs per lane so the loops unroll for any C (llmc/cuda/layernorm.cuh);
    checked also at C = 768 and 1600 (GPT-2 small and XL) and with the residual add fused in.
*/
#include "common.h"
namespace cpu {
#include "llmc/cpu/layernorm.h"
}
#include "llmc/cuda/layernorm.cuh"

__global__ void layernorm_v1(floatX* out, float* mean, float* rstd, const floatX* inp,
                             const floatX* weight, const floatX* bias, int N, int C) {
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    const floatX* x = inp + (size_t)n * C;
    float m = 0.0f, v = 0.0f;
    for (int c = 0; c < C; c++) m += (float)x[c];
    m /= C;
    for (int c = 0; c < C; c++) v += ((float)x[c] - m) * ((float)x[c] - m);
    float s = rsqrtf(v / C + LAYERNORM_EPS);
    for (int c = 0; c < C; c++) out[(size_t)n * C + c] = (floatX)(((float)x[c] - m) * s * (float)weight[c] + (float)bias[c]);
    mean[n] = m;
    rstd[n] = s;
}

__global__ void layernorm_v2(floatX* out, float* mean, float* rstd, const floatX* x_all, const floatX* weight,
                             const floatX* bias, int N, int C) {
    int lane = threadIdx.x % 32, n = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (n >= N) return;
    const floatX* x = x_all + (size_t)n * C;
    float sum = 0.0f;
    for (int c = lane; c < C; c += 32) sum += (float)x[c];
    float m = warp_sum(sum) / (float)C, var = 0.0f;
    for (int c = lane; c < C; c += 32) var += ((float)x[c] - m) * ((float)x[c] - m);
    float s = rsqrtf(warp_sum(var) / (float)C + LAYERNORM_EPS);
    for (int c = lane; c < C; c += 32) out[(size_t)n * C + c] = (floatX)(((float)x[c] - m) * s * (float)weight[c] + (float)bias[c]);
    if (lane == 0) { mean[n] = m; rstd[n] = s; }
}

#define V3_MAX_PER_LANE 32  // C up to 1024
__global__ void layernorm_v3(floatX* out, float* mean, float* rstd, const floatX* inp,
                             const floatX* weight, const floatX* bias, int N, int C) {
    int lane = threadIdx.x % 32;
    int n = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (n >= N) return;
    const floatX* x = inp + (size_t)n * C;
    float xs[V3_MAX_PER_LANE];
    float sum = 0.0f;
    #pragma unroll
    for (int k = 0; k < V3_MAX_PER_LANE; k++) {
        int c = lane + 32 * k;
        xs[k] = c < C ? (float)x[c] : 0.0f;
        sum += xs[k];
    }
    float m = warp_sum(sum) / C;
    float var = 0.0f;
    #pragma unroll
    for (int k = 0; k < V3_MAX_PER_LANE; k++) {
        int c = lane + 32 * k;
        if (c < C) var += (xs[k] - m) * (xs[k] - m);
    }
    float s = rsqrtf(warp_sum(var) / C + LAYERNORM_EPS);
    #pragma unroll
    for (int k = 0; k < V3_MAX_PER_LANE; k++) {
        int c = lane + 32 * k;
        if (c < C) out[(size_t)n * C + c] = (floatX)((xs[k] - m) * s * (float)weight[c] + (float)bias[c]);
    }
    if (lane == 0) { mean[n] = m; rstd[n] = s; }
}

// v4 with the residual add fused in (x = a + b, written out and normalised, as every layer's
// LayerNorms run), at N rows of C channels, against the CPU
static int check_v4_fused(int N, int C) {
    float* a = random_floats((size_t)N * C, 1.0f);
    float* b = random_floats((size_t)N * C, 1.0f);
    float* w = random_floats(C, 1.0f);
    float* bias = random_floats(C, 1.0f);
    round_like_floatX(a, (size_t)N * C);
    round_like_floatX(b, (size_t)N * C);
    round_like_floatX(w, C);
    round_like_floatX(bias, C);
    float* x = (float*)malloc_check((size_t)N * C * sizeof(float));
    for (size_t i = 0; i < (size_t)N * C; i++) x[i] = a[i] + b[i];
    round_like_floatX(x, (size_t)N * C);  // the kernel normalises the residual as stored
    float* out = (float*)malloc_check((size_t)N * C * sizeof(float));
    float *mean = (float*)malloc_check(N * sizeof(float)), *rstd = (float*)malloc_check(N * sizeof(float));
    cpu::layernorm_forward(out, mean, rstd, x, w, bias, N, C);
    floatX *d_a = to_device(a, (size_t)N * C), *d_b = to_device(b, (size_t)N * C);
    floatX *d_w = to_device(w, C), *d_bias = to_device(bias, C);
    floatX* d_res = (floatX*)device_malloc((size_t)N * C * sizeof(floatX));
    floatX* d_out = (floatX*)device_malloc((size_t)N * C * sizeof(floatX));
    float *d_mean = (float*)device_malloc(N * sizeof(float)), *d_rstd = (float*)device_malloc(N * sizeof(float));
    fused_residual_layernorm_forward(d_res, d_out, d_mean, d_rstd, d_a, d_b, d_w, d_bias, N, C);
    char name[64];
    snprintf(name, sizeof(name), "v4 fused, C=%d", C);
    int ok = validate(name, d_res, x, (size_t)N * C, default_tolerance()) &
             validate(name, d_out, out, (size_t)N * C, default_tolerance()) &
             validate_f32(name, d_rstd, rstd, N, 1e-4f);
    device_free(d_a), device_free(d_b), device_free(d_w), device_free(d_bias);
    device_free(d_res), device_free(d_out), device_free(d_mean), device_free(d_rstd);
    free(a), free(b), free(w), free(bias), free(x), free(out), free(mean), free(rstd);
    return ok;
}

int main(void) {
    int B = GPU_OR_EMU(8, 2), T = GPU_OR_EMU(1024, 64), C = GPU_OR_EMU(768, 200), N = B * T;
    float* x = random_floats((size_t)N * C, 1.0f);
    float* w = random_floats(C, 1.0f);
    float* b = random_floats(C, 1.0f);
    round_like_floatX(x, (size_t)N * C);
    round_like_floatX(w, C);
    round_like_floatX(b, C);
    float* out = (float*)malloc_check((size_t)N * C * sizeof(float));
    float* mean = (float*)malloc_check(N * sizeof(float));
    float* rstd = (float*)malloc_check(N * sizeof(float));
    cpu::layernorm_forward(out, mean, rstd, x, w, b, N, C);

    floatX *d_x = to_device(x, (size_t)N * C), *d_w = to_device(w, C), *d_b = to_device(b, C);
    floatX* d_out = (floatX*)device_malloc((size_t)N * C * sizeof(floatX));
    float* d_mean = (float*)device_malloc(N * sizeof(float));
    float* d_rstd = (float*)device_malloc(N * sizeof(float));
    // one read of x and one write of out dominate the traffic
    double bytes = 2.0 * N * C * sizeof(floatX);
    float tol = default_tolerance(), ms;
    int ok = 1;
    printf("layernorm_forward N=%d C=%d (%s)\n", N, C, PRECISION_NAME);

    layernorm_v1<<<ceil_div(N, 256), 256>>>(d_out, d_mean, d_rstd, d_x, d_w, d_b, N, C);
    ok &= validate("v1 out", d_out, out, (size_t)N * C, tol) & validate_f32("v1 rstd", d_rstd, rstd, N, 1e-4f);
    TIME_KERNEL(ms, 20, (layernorm_v1<<<ceil_div(N, 256), 256>>>(d_out, d_mean, d_rstd, d_x, d_w, d_b, N, C)));
    report("v1 thread per row", ms, bytes, 0);

    layernorm_v2<<<ceil_div(N, 8), 256>>>(d_out, d_mean, d_rstd, d_x, d_w, d_b, N, C);
    ok &= validate("v2 out", d_out, out, (size_t)N * C, tol) & validate_f32("v2 rstd", d_rstd, rstd, N, 1e-4f);
    TIME_KERNEL(ms, 20, (layernorm_v2<<<ceil_div(N, 8), 256>>>(d_out, d_mean, d_rstd, d_x, d_w, d_b, N, C)));
    report("v2 warp per row", ms, bytes, 0);

    layernorm_v3<<<ceil_div(N, 8), 256>>>(d_out, d_mean, d_rstd, d_x, d_w, d_b, N, C);
    ok &= validate("v3 out", d_out, out, (size_t)N * C, tol) & validate_f32("v3 rstd", d_rstd, rstd, N, 1e-4f);
    TIME_KERNEL(ms, 20, (layernorm_v3<<<ceil_div(N, 8), 256>>>(d_out, d_mean, d_rstd, d_x, d_w, d_b, N, C)));
    report("v3 row in registers", ms, bytes, 0);

    layernorm_forward(d_out, d_mean, d_rstd, d_x, d_w, d_b, N, C);
    ok &= validate("v4 out", d_out, out, (size_t)N * C, tol) & validate_f32("v4 rstd", d_rstd, rstd, N, 1e-4f);
    TIME_KERNEL(ms, 20, layernorm_forward(d_out, d_mean, d_rstd, d_x, d_w, d_b, N, C));
    report("v4 16-byte packs in registers", ms, bytes, 0);
    // the kernel instances d12 (C = 768: 4 packs a lane in bf16, 8 in fp32) and d48 (1600) run
    ok &= check_v4_fused(GPU_OR_EMU(8 * 1024, 64), C) & check_v4_fused(GPU_OR_EMU(8 * 1024, 64), 768) &
          check_v4_fused(GPU_OR_EMU(8 * 1024, 64), 1600);
    return finish(ok);
}
