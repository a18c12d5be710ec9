/*
AdamW update and the global gradient norm, checked against the CPU backend.
  make dev/cuda/adamw && ./dev/cuda/adamw
AdamW is one elementwise kernel (llmc/cuda/adamw.cuh); with bf16 parameters it updates the fp32
master weights and rounds them stochastically to bf16, so the check compares the master weights
(exact fp32 arithmetic) and the bf16 parameters within one bf16 step of them.
A step's runs (llmc/adamw_run.h, a tensor's piece each) take one launch per 48 runs
(adamw_update_runs) instead of one each (adamw_update): checked bit for bit against adamw_update
run by run, over 100 runs of 1 to thousands of elements with gaps between them, and timed both
ways over GPT-2 124M's 148 pieces.
Global norm variants:
v1: atomicAdd of every block's sum into one float: run-to-run differences in the last bits.
v2: a fixed grid writes partial sums that the host adds in order (llmc): the same bits every run.
*/
#include "common.h"
namespace cpu {
#include "llmc/cpu/adamw.h"
}
#include "llmc/cuda/adamw.cuh"

__global__ void norm_squared_v1(float* out, const floatX* x, size_t n) {
    float sum = 0.0f;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float v = (float)x[i];
        sum += v * v;
    }
    sum = warp_sum(sum);
    if (threadIdx.x % 32 == 0) atomicAdd(out, sum);
}

#if !FLOATX_IS_FLOAT
// Stochastic rounding, through adamw_update with lr = 0 (the parameter is the master weight,
// rounded): n copies of x = 1 + 0.3 bf16 spacings (2^-7 at 1) must round up 30% of the time,
// so their mean is x (round-to-nearest would give 1 every time: 0.3 spacings off); two tensors
// of the same values must not round alike (before the rounding bits depended on the global
// index, element i of every tensor drew the same bits); a NaN master weight stays NaN.
static int check_stochastic_rounding(void) {
    size_t n = GPU_OR_EMU((size_t)1 << 20, (size_t)1 << 14);
    float spacing = 1.0f / 128.0f, x = 1.0f + 0.3f * spacing;
    float* master = (float*)malloc_check(2 * n * sizeof(float));
    for (size_t i = 0; i < 2 * n; i++) master[i] = x;
    unsigned int canonical_nan = 0x7FFFFFFFu;  // the NaN a GPU's arithmetic produces
    memcpy(&master[2 * n - 1], &canonical_nan, sizeof(float));
    float *d_master = (float*)device_malloc(2 * n * sizeof(float)), *d_zeros = (float*)device_malloc(2 * n * sizeof(float));
    float* d_v = (float*)device_malloc(2 * n * sizeof(float));
    floatX *d_params = (floatX*)device_malloc(2 * n * sizeof(floatX)), *d_grads = (floatX*)device_malloc(2 * n * sizeof(floatX));
    copy_host_to_device(d_master, master, 2 * n * sizeof(float));
    device_memset_zero(d_zeros, 2 * n * sizeof(float));
    device_memset_zero(d_v, 2 * n * sizeof(float));
    device_memset_zero(d_grads, 2 * n * sizeof(floatX));
    for (int tensor = 0; tensor < 2; tensor++) {  // two tensors, one after the other in the model
        size_t o = tensor * n;
        adamw_update(d_params + o, d_master + o, d_grads + o, d_zeros + o, d_v + o, n, 0.0f, 0.9f,
                     0.95f, 1e-8f, 0.0f, 1, 1.0f, 7, o);
    }
    float* rounded = (float*)malloc_check(2 * n * sizeof(float));
    copy_device_to_floats(rounded, d_params, 2 * n);
    double sum = 0.0;
    size_t differ = 0;
    for (size_t i = 0; i < n; i++) {
        sum += rounded[i];
        differ += rounded[i] != rounded[n + i];
    }
    // a rounding of x is off by 0.3 or 0.7 spacings, standard deviation 0.46: the mean of n is
    // off by 0.46 / sqrt(n) spacings (0.004 under the emulator, 0.0005 on a GPU); allow 0.02
    double bias = (sum / n - x) / spacing;
    int ok_bias = fabs(bias) < 0.02;
    // independent bits: the two copies differ with probability 2 * 0.3 * 0.7 = 0.42
    double differ_fraction = (double)differ / n;
    int ok_differ = differ_fraction > 0.35 && differ_fraction < 0.49;
    int ok_nan = isnan(rounded[2 * n - 1]);
    printf("  %-22s %s: mean of %zu roundings of 1 + 0.3 spacings is off by %.4f spacings (< 0.02)\n",
           "stochastic rounding", ok_bias ? "ok" : "FAIL", n, bias);
    printf("  %-22s %s: two tensors of equal values round differently at %.3f of elements (0.42 expected)\n",
           "independent bits", ok_differ ? "ok" : "FAIL", differ_fraction);
    printf("  %-22s %s: a NaN master weight gives %g\n", "NaN stays NaN", ok_nan ? "ok" : "FAIL", rounded[2 * n - 1]);
    device_free(d_master), device_free(d_zeros), device_free(d_v), device_free(d_params), device_free(d_grads);
    free(master), free(rounded);
    return ok_bias && ok_differ && ok_nan;
}
#endif

// every element of a float buffer and a floatX buffer, bit for bit
static int same_bits(const char* name, const void* a, const void* b, size_t bytes) {
    int same = memcmp(a, b, bytes) == 0;
    printf("  %-22s %s: %s\n", name, same ? "ok" : "FAIL", same ? "the same bits" : "the bits differ");
    return same;
}

// an AdamW problem on the device: the parameters and grads in floatX, the master weights (a copy
// of the parameters), m and v in fp32
typedef struct {
    floatX *params, *grads;
    float *master, *m, *v;
} AdamWBuffers;

static AdamWBuffers adamw_buffers(const float* params, const float* grads, const float* m, const float* v, size_t n) {
    AdamWBuffers b = {to_device(params, n), to_device(grads, n), (float*)device_malloc(n * sizeof(float)),
                      (float*)device_malloc(n * sizeof(float)), (float*)device_malloc(n * sizeof(float))};
    copy_host_to_device(b.master, params, n * sizeof(float));
    copy_host_to_device(b.m, m, n * sizeof(float));
    copy_host_to_device(b.v, v, n * sizeof(float));
    return b;
}

// the step as it was before adamw_update_runs, a launch a run: what that is checked and timed against
static void adamw_run_by_run(AdamWBuffers b, const AdamWRun* runs, int count, float lr, int t, float scale) {
    float* master = FLOATX_IS_FLOAT ? NULL : b.master;
    for (int r = 0; r < count; r++) {
        size_t o = runs[r].offset;
        adamw_update(b.params + o, master ? master + o : NULL, b.grads + o, b.m + o, b.v + o, runs[r].n, lr, 0.9f, 0.95f,
                     1e-8f, runs[r].weight_decay, t, scale, 42, runs[r].first_index);
    }
}

// adamw_update_runs against adamw_update on each run: 100 runs (three launches), sizes from 1 to a
// few thousand, a gap after each, weight decay on every other run, rounding indices out of order
static int check_runs(void) {
    int count = 100;
    AdamWRun runs[100];
    size_t end = 0;
    for (int r = 0; r < count; r++) {
        size_t n = r % 7 == 0 ? 1 + r : (size_t)(rng_u64(&dev_rng) % GPU_OR_EMU(200000, 3000)) + 1;
        runs[r] = (AdamWRun){end + 5, n, (size_t)(count - r) * 1000003, r % 2 ? 0.1f : 0.0f};
        end += n + 5 + r % 3;
    }
    float* params = random_floats(end, 0.02f);
    float* grads = random_floats(end, 1e-3f);
    float* m = random_floats(end, 1e-4f);
    float* v = (float*)malloc_check(end * sizeof(float));
    for (size_t i = 0; i < end; i++) v[i] = m[i] * m[i] * 2.0f;
    float *got[4], *want[4];  // params (as floats), master, m, v after each way
    for (int way = 0; way < 2; way++) {
        AdamWBuffers b = adamw_buffers(params, grads, m, v, end);
        if (way == 0) {
            adamw_update_runs(b.params, FLOATX_IS_FLOAT ? NULL : b.master, b.grads, b.m, b.v, runs, count, 3e-4f, 0.9f,
                              0.95f, 1e-8f, 7, 0.5f, 42);
        } else {
            adamw_run_by_run(b, runs, count, 3e-4f, 7, 0.5f);
        }
        float** out = way == 0 ? got : want;
        for (int k = 0; k < 4; k++) out[k] = (float*)malloc_check(end * sizeof(float));
        copy_device_to_floats(out[0], b.params, end);
        copy_device_to_host(out[1], b.master, end * sizeof(float));
        copy_device_to_host(out[2], b.m, end * sizeof(float));
        copy_device_to_host(out[3], b.v, end * sizeof(float));
        device_free(b.params), device_free(b.grads), device_free(b.master), device_free(b.m), device_free(b.v);
    }
    int ok = same_bits("runs: parameters", got[0], want[0], end * sizeof(float)) &
             same_bits("runs: master weights", got[1], want[1], end * sizeof(float)) &
             same_bits("runs: m", got[2], want[2], end * sizeof(float)) & same_bits("runs: v", got[3], want[3], end * sizeof(float));
    for (int k = 0; k < 4; k++) free(got[k]), free(want[k]);
    free(params), free(grads), free(m), free(v);
    return ok;
}

int main(void) {
    size_t n = GPU_OR_EMU((size_t)124475904, (size_t)1 << 20);  // GPT-2 124M's parameters (Vp = 50304)
    float* params = random_floats(n, 0.02f);
    float* grads = random_floats(n, 1e-3f);
    round_like_floatX(params, n);
    round_like_floatX(grads, n);
    float* m = random_floats(n, 1e-4f);
    float* v = (float*)malloc_check(n * sizeof(float));
    for (size_t i = 0; i < n; i++) v[i] = m[i] * m[i] * 2.0f;
    float lr = 3e-4f, wd = 0.1f, scale = 0.5f;
    int t = 10;

    AdamWBuffers b = adamw_buffers(params, grads, m, v, n);
    floatX *d_params = b.params, *d_grads = b.grads;
    float *d_master = b.master, *d_m = b.m, *d_v = b.v;
    float* cpu_master = (float*)malloc_check(n * sizeof(float));
    memcpy(cpu_master, params, n * sizeof(float));
    cpu::adamw_update(params, cpu_master, grads, m, v, n, lr, 0.9f, 0.95f, 1e-8f, wd, t, scale, 0, 0);
    int ok = 1;
    float ms;
    printf("adamw n=%zu (%s)\n", n, PRECISION_NAME);

    adamw_update(d_params, FLOATX_IS_FLOAT ? NULL : d_master, d_grads, d_m, d_v, n, lr, 0.9f, 0.95f, 1e-8f, wd, t, scale, 42, 0);
    ok &= validate_f32("m", d_m, m, n, 1e-5f);
    ok &= validate_f32("v", d_v, v, n, 1e-5f);
    if (!FLOATX_IS_FLOAT) ok &= validate_f32("master weights", d_master, cpu_master, n, 1e-5f);
    // parameters: fp32 exact up to rounding order; bf16 within one bf16 spacing (2^-7 relative)
    ok &= validate("parameters", d_params, cpu_master, n, FLOATX_IS_FLOAT ? 1e-5f : 8e-3f);
    // bytes: read params/master, grads, m, v; write params/master, m, v
    double bytes = (double)n * (3 * sizeof(float) + 2 * sizeof(floatX) + 3 * sizeof(float) + (FLOATX_IS_FLOAT ? 0 : 2 * sizeof(float)));
    TIME_KERNEL(ms, 10, adamw_update(d_params, FLOATX_IS_FLOAT ? NULL : d_master, d_grads, d_m, d_v, n, lr, 0.9f, 0.95f, 1e-8f, wd, t, scale, 42, 0));
    report("adamw", ms, bytes, 0);
    ok &= check_runs();
    // GPT-2 124M's pieces (wte, wpe, 12 layers x 12 tensors, lnf's 2) over the same n: a launch
    // each, then adamw_update_runs' launches (at GPT-2's 124M elements on a GPU)
    if (n == 124475904) {
        int C = 768, L = 12, count = 0;
        size_t layer[12] = {(size_t)C, (size_t)C, (size_t)3 * C * C, (size_t)3 * C, (size_t)C * C, (size_t)C, (size_t)C,
                            (size_t)C, (size_t)4 * C * C, (size_t)4 * C, (size_t)4 * C * C, (size_t)C};
        AdamWRun pieces[148];
        size_t at = 0;
        pieces[count++] = (AdamWRun){at, (size_t)50304 * C, at, wd}, at += (size_t)50304 * C;
        pieces[count++] = (AdamWRun){at, (size_t)1024 * C, at, wd}, at += (size_t)1024 * C;
        for (int l = 0; l < L; l++)
            for (int i = 0; i < 12; i++) pieces[count++] = (AdamWRun){at, layer[i], at, wd}, at += layer[i];
        pieces[count++] = (AdamWRun){at, (size_t)C, at, 0.0f}, at += C;
        pieces[count++] = (AdamWRun){at, (size_t)C, at, 0.0f}, at += C;
        if (at != n || count != 148) fail("GPT-2 124M's pieces: %zu elements in %d, expected %zu in 148", at, count, n);
        TIME_KERNEL(ms, 10, adamw_run_by_run(b, pieces, count, lr, t, scale));
        report("adamw, 148 launches", ms, bytes * at / n, 0);
        TIME_KERNEL(ms, 10, adamw_update_runs(d_params, FLOATX_IS_FLOAT ? NULL : d_master, d_grads, d_m, d_v, pieces, count,
                                              lr, 0.9f, 0.95f, 1e-8f, t, scale, 42));
        report("adamw_update_runs", ms, bytes * at / n, 0);
    }

    float cpu_norm = cpu::global_norm_squared(grads, n);
    float gpu_norm = global_norm_squared(d_grads, n);
    int norm_ok = fabsf(gpu_norm - cpu_norm) <= 1e-4f * cpu_norm;  // fp32 partial sums, reordered
    printf("  %-22s %s: gpu %.7g, cpu %.7g\n", "v2 norm^2 (ordered)", norm_ok ? "ok" : "FAIL", gpu_norm, cpu_norm);
    ok &= norm_ok;
    TIME_KERNEL(ms, 10, global_norm_squared(d_grads, n));
    report("v2 norm^2 (ordered)", ms, (double)n * sizeof(floatX), 0);
    float* d_sum = (float*)device_malloc(sizeof(float));
    device_memset_zero(d_sum, sizeof(float));
    norm_squared_v1<<<1024, 512>>>(d_sum, d_grads, n);
    float v1;
    copy_device_to_host(&v1, d_sum, sizeof(float));
    norm_ok = fabsf(v1 - cpu_norm) <= 1e-4f * cpu_norm;
    printf("  %-22s %s: gpu %.7g\n", "v1 norm^2 (atomics)", norm_ok ? "ok" : "FAIL", v1);
    ok &= norm_ok;
    TIME_KERNEL(ms, 10, (norm_squared_v1<<<1024, 512>>>(d_sum, d_grads, n)));
    report("v1 norm^2 (atomics)", ms, (double)n * sizeof(floatX), 0);
#if !FLOATX_IS_FLOAT
    ok &= check_stochastic_rounding();
#endif
    return finish(ok);
}
