// Shared helpers of the dev/cuda programs: random inputs, copies between fp32 host arrays and
// floatX device arrays, validation against the CPU backend's op, and a timing loop.
// Each program includes the CPU op it checks against inside `namespace cpu { ... }`, so the CPU
// and CUDA launchers (which share names) live side by side.
#ifndef DEV_CUDA_COMMON_H
#define DEV_CUDA_COMMON_H

#include <math.h>
#include <omp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "llmc/utils.h"
#include "llmc/rng.h"
#include "llmc/cuda/device.cuh"

// problem sizes and timing repeats: a GPT-2 124M layer on a GPU; a small problem under the CPU
// emulator (test/cuda_emu), which runs a kernel's threads one after another
#ifdef CUDA_EMU
#define GPU_OR_EMU(gpu, emu) (emu)
#else
#define GPU_OR_EMU(gpu, emu) (gpu)
#endif

static Rng dev_rng = {0x12345678ull};

static float* random_floats(size_t n, float std) {
    float* x = (float*)malloc_check(n * sizeof(float));
    rng_normal_fill(&dev_rng, x, n, 0.0f, std);
    return x;
}

// a floatX device copy of host floats
static floatX* to_device(const float* host, size_t n) {
    floatX* d = (floatX*)device_malloc(n * sizeof(floatX));
    copy_floats_to_device(d, host, n);
    return d;
}

// the precision the CPU result is rounded to on the way to the device: what a floatX input
// sees. Inputs are rounded once so CPU and GPU start from identical values.
static void round_like_floatX(float* x, size_t n) {
    floatX* d = to_device(x, n);
    copy_device_to_floats(x, d, n);
    device_free(d);
}

// the default tolerance for a floatX result: fp32 kernels differ from the CPU only in summation
// order; bf16 keeps 8 bits of mantissa (relative spacing 2^-8 = 0.4%)
static float default_tolerance(void) { return FLOATX_IS_FLOAT ? 1e-4f : 2e-2f; }

// |got - reference| <= tol * (1 + |reference|) everywhere; prints the worst element
static int compare_arrays(const char* name, const float* got, const float* reference, size_t n, float tol) {
    size_t worst = 0, bad = 0;
    double worst_ratio = 0.0;
    for (size_t i = 0; i < n; i++) {
        double ratio = fabs((double)got[i] - reference[i]) / (1.0 + fabs((double)reference[i]));
        if (!(ratio <= tol)) bad++;  // NaN counts as bad
        if (!(ratio <= worst_ratio)) { worst_ratio = ratio; worst = i; }
    }
    printf("  %-22s %s: worst |gpu-cpu|/(1+|cpu|) = %.2e at %zu (gpu %.6g, cpu %.6g), tolerance %.0e\n",
           name, bad ? "FAIL" : "ok", worst_ratio, worst, got[worst], reference[worst], tol);
    return bad == 0;
}

// a floatX device result against the CPU reference
static int validate(const char* name, const floatX* d_result, const float* reference, size_t n, float tol) {
    float* got = (float*)malloc_check(n * sizeof(float));
    copy_device_to_floats(got, d_result, n);
    int ok = compare_arrays(name, got, reference, n, tol);
    free(got);
    return ok;
}

// an fp32 device result (statistics, losses) against the CPU reference
static int validate_f32(const char* name, const float* d_result, const float* reference, size_t n, float tol) {
    float* got = (float*)malloc_check(n * sizeof(float));
    copy_device_to_host(got, d_result, n * sizeof(float));
    int ok = compare_arrays(name, got, reference, n, tol);
    free(got);
    return ok;
}

// runs `launch` repeat times between CUDA events; returns milliseconds per call
#define TIME_KERNEL(ms_out, repeat, launch) do {                       \
    cudaEvent_t start_, stop_;                                          \
    cudaCheck(cudaEventCreate(&start_));                                \
    cudaCheck(cudaEventCreate(&stop_));                                 \
    launch;                                                             \
    cudaCheck(cudaEventRecord(start_));                                 \
    for (int rep_ = 0; rep_ < GPU_OR_EMU(repeat, 1); rep_++) { launch; }             \
    cudaCheck(cudaEventRecord(stop_));                                  \
    cudaCheck(cudaEventSynchronize(stop_));                             \
    float total_ms_;                                                    \
    cudaCheck(cudaEventElapsedTime(&total_ms_, start_, stop_));         \
    ms_out = total_ms_ / GPU_OR_EMU(repeat, 1);                                      \
    cudaCheck(cudaEventDestroy(start_));                                \
    cudaCheck(cudaEventDestroy(stop_));                                 \
} while (0)

static void report(const char* name, float ms, double bytes, double flops) {
    printf("  %-22s %9.4f ms", name, ms);
    if (bytes > 0) printf("  %8.1f GB/s", bytes / ms / 1e6);
    if (flops > 0) printf("  %8.1f TFLOP/s", flops / ms / 1e9);
    printf("\n");
}

// the exit status of a dev/cuda program: 0 when every variant validated
static int finish(int all_ok) {
    printf("%s\n", all_ok ? "all variants valid" : "SOME VARIANTS FAILED VALIDATION");
    return all_ok ? 0 : 1;
}

#endif
