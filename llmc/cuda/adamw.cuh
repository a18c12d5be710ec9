// AdamW (Loshchilov & Hutter 2019) and the global gradient norm on CUDA.
#ifndef LLMC_CUDA_ADAMW_CUH
#define LLMC_CUDA_ADAMW_CUH

#include "device.cuh"
#include "../adamw_run.h"

// a counter-based hash (a few rounds of multiply-xorshift): random bits from (seed, index)
// with no state, so every element gets its own stream and a rerun gets the same bits (host code
// calls it too: -offload's AdamW on the CPU)
__host__ __device__ inline unsigned int hash_u32(unsigned int seed, unsigned int index) {
    unsigned int x = index * 0x9E3779B9u ^ seed;
    x ^= x >> 16; x *= 0x7FEB352Du;
    x ^= x >> 15; x *= 0x846CA68Bu;
    x ^= x >> 16;
    return x;
}

// fp32 -> floatX. For bf16, stochastic rounding: add random bits below bf16's 16 kept bits and
// truncate, so the rounding is unbiased on average and small updates are not lost
__host__ __device__ inline floatX round_to_floatX(float x, unsigned int random) {
#if FLOATX_IS_FLOAT
    (void)random;
    return x;
#else
    // a NaN's mantissa plus the random bits would carry into the sign and give -0.0, hiding a
    // diverged weight: NaN stays NaN
    if (isnan(x)) return (floatX)x;
    unsigned int bits;
    memcpy(&bits, &x, sizeof(bits));
    bits = (bits + (random & 0xFFFFu)) & 0xFFFF0000u;
    float kept;
    memcpy(&kept, &bits, sizeof(kept));
    return (floatX)kept;  // exact: its low 16 bits are zero
#endif
}

// element i's step: the kernel's, and the host's under -offload (the same arithmetic and bits)
__host__ __device__ inline void adamw_element(floatX* params, float* master, const floatX* grads, float* m, float* v,
                                              size_t i, float lr, float beta1, float beta2, float eps,
                                              float weight_decay, float correction1, float correction2,
                                              float grad_scale, unsigned int seed, size_t first_index) {
    float g = (float)grads[i] * grad_scale;
    float mi = beta1 * m[i] + (1.0f - beta1) * g;
    float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    float p = (master ? master[i] : (float)params[i]) * (1.0f - lr * weight_decay);
    p -= lr * (mi / correction1) / (sqrtf(vi / correction2) + eps);
    if (master) master[i] = p;
    size_t index = first_index + i;  // the element's place in the whole model: its own bits
    params[i] = round_to_floatX(p, hash_u32(seed ^ (unsigned int)(index >> 32), (unsigned int)index));
}

__global__ void adamw_kernel(floatX* params, float* master, const floatX* grads, float* m, float* v,
                             size_t n, float lr, float beta1, float beta2, float eps,
                             float weight_decay, float correction1, float correction2,
                             float grad_scale, unsigned int seed, size_t first_index) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    adamw_element(params, master, grads, m, v, i, lr, beta1, beta2, eps, weight_decay, correction1, correction2,
                  grad_scale, seed, first_index);
}

// One AdamW step on n parameters, as torch.optim.AdamW. master: fp32 master weights when the
// parameters are bf16 (else NULL); seed: for the stochastic rounding of bf16 parameters, which
// draws element i's random bits from (seed, first_index + i). first_index is params[0]'s index
// in the model's flat parameter buffer, so that no two elements of the model (in two tensors, or
// two shards of one) share their bits.
static inline void adamw_update(floatX* params, float* master, const floatX* grads, float* m,
                                float* v, size_t n, float lr, float beta1, float beta2, float eps,
                                float weight_decay, int t, float grad_scale, unsigned int seed,
                                size_t first_index) {
    int kernel_span = kernel_time_begin("adamw", 0, 0);
    float correction1 = 1.0f - powf(beta1, (float)t);
    float correction2 = 1.0f - powf(beta2, (float)t);
    adamw_kernel<<<ceil_div(n, 256), 256>>>(params, master, grads, m, v, n, lr, beta1, beta2, eps,
                                           weight_decay, correction1, correction2, grad_scale, seed,
                                           first_index);
    cudaCheckLaunch();
    kernel_time_end(kernel_span);
}

// All of a step's runs (llmc/adamw_run.h) in one launch for each ADAMW_RUNS_PER_LAUNCH of them,
// the same elements, arithmetic and rounding bits as adamw_update on each run. One launch per run
// (d12: 148, most of them LayerNorm and bias vectors of 768 to 3072 elements) left the GPU waiting
// on launch latency and a wave's tail per tensor: 1.8 ms of AdamW against the 0.8 ms its bytes take
// on an H200. Block b of a launch belongs to the last run whose first block is <= b; the table is a
// __grid_constant__ parameter (read from the constant bank, not copied per thread), 3 KB of the
// 4 KB a launch's parameters may take: d12's 148 runs in 2 launches.
#define ADAMW_RUNS_PER_LAUNCH 96
typedef struct {
    unsigned long long offset[ADAMW_RUNS_PER_LAUNCH], n[ADAMW_RUNS_PER_LAUNCH], first_index[ADAMW_RUNS_PER_LAUNCH];
    float weight_decay[ADAMW_RUNS_PER_LAUNCH];
    unsigned int first_block[ADAMW_RUNS_PER_LAUNCH];
    int runs;
} AdamWRunTable;

__global__ void adamw_runs_kernel(floatX* params, float* master, const floatX* grads, float* m, float* v,
                                  const __grid_constant__ AdamWRunTable table, float lr, float beta1, float beta2,
                                  float eps, float correction1, float correction2, float grad_scale, unsigned int seed) {
    int lo = 0, hi = table.runs - 1;  // binary search: the last run that starts at or before this block
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (table.first_block[mid] <= blockIdx.x) lo = mid;
        else hi = mid - 1;
    }
    size_t i = (size_t)(blockIdx.x - table.first_block[lo]) * blockDim.x + threadIdx.x;
    if (i >= table.n[lo]) return;
    size_t o = table.offset[lo];
    adamw_element(params + o, master ? master + o : NULL, grads + o, m + o, v + o, i, lr, beta1, beta2, eps,
                  table.weight_decay[lo], correction1, correction2, grad_scale, seed, table.first_index[lo]);
}

static inline void adamw_update_runs(floatX* params, float* master, const floatX* grads, float* m, float* v,
                                     const AdamWRun* runs, int count, float lr, float beta1, float beta2, float eps,
                                     int t, float grad_scale, unsigned int seed) {
    int kernel_span = kernel_time_begin("adamw", 0, 0);
    float correction1 = 1.0f - powf(beta1, (float)t);
    float correction2 = 1.0f - powf(beta2, (float)t);
    for (int first = 0; first < count; first += ADAMW_RUNS_PER_LAUNCH) {
        AdamWRunTable table;
        memset(&table, 0, sizeof(table));
        size_t blocks = 0;
        for (int r = first; r < count && r < first + ADAMW_RUNS_PER_LAUNCH; r++) {
            int j = table.runs++;
            table.offset[j] = runs[r].offset, table.n[j] = runs[r].n, table.first_index[j] = runs[r].first_index;
            table.weight_decay[j] = runs[r].weight_decay;
            table.first_block[j] = (unsigned int)blocks;
            blocks += ceil_div(runs[r].n, (size_t)256);
        }
        if (blocks > 0x7fffffff) fail("adamw_update_runs: %zu blocks in one launch", blocks);
        adamw_runs_kernel<<<(unsigned int)blocks, 256>>>(params, master, grads, m, v, table, lr, beta1, beta2, eps,
                                                       correction1, correction2, grad_scale, seed);
        cudaCheckLaunch();
    }
    kernel_time_end(kernel_span);
}

// -offload (ZeRO-Offload): the same step on the host, over pinned host buffers, in the kernel's
// arithmetic and with its rounding bits, threads from OpenMP
static inline void adamw_update_host(floatX* params, float* master, const floatX* grads, float* m, float* v, size_t n,
                                     float lr, float beta1, float beta2, float eps, float weight_decay, int t,
                                     float grad_scale, unsigned int seed, size_t first_index) {
    int kernel_span = kernel_time_begin("adamw on the host (-offload)", 0, 0);
    float correction1 = 1.0f - powf(beta1, (float)t);
    float correction2 = 1.0f - powf(beta2, (float)t);
    #pragma omp parallel for
    for (long long i = 0; i < (long long)n; i++) {
        adamw_element(params, master, grads, m, v, (size_t)i, lr, beta1, beta2, eps, weight_decay, correction1,
                      correction2, grad_scale, seed, first_index);
    }
    kernel_time_end(kernel_span);
}

// sum of squares: a grid of blocks fixed by n writes partial sums, the host adds them in order,
// so the result is the same on every run. Each thread sums at least NORM_PER_THREAD elements:
// a bias of 64 gets one block, not NORM_BLOCKS of idle threads (the trainers call this per
// tensor or per shard); past 512 x 16 x NORM_BLOCKS elements the grid stays NORM_BLOCKS
// (NORM_BLOCKS and norm_scratch_bytes: llmc/target.h)
#define NORM_PER_THREAD 16
__global__ void norm_squared_partial(float* partial, const floatX* x, size_t n) {
    __shared__ float shared[32];
    float sum = 0.0f;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float v = (float)x[i];
        sum += v * v;
    }
    sum = warp_sum(sum);
    if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
        float total = 0.0f;
        for (int w = 0; w < (int)blockDim.x / 32; w++) total += shared[w];
        partial[blockIdx.x] = total;
    }
}

static DeviceScratch norm_scratch;

static inline float global_norm_squared(const floatX* grads, size_t n) {
    int kernel_span = kernel_time_begin("gradient norm", 0, 0);
    float* partial = (float*)scratch_get(&norm_scratch, norm_scratch_bytes());
    size_t wanted = ceil_div(n, (size_t)512 * NORM_PER_THREAD);
    int blocks = wanted < 1 ? 1 : wanted > NORM_BLOCKS ? NORM_BLOCKS : (int)wanted;
    norm_squared_partial<<<blocks, 512>>>(partial, grads, n);
    cudaCheckLaunch();
    float host[NORM_BLOCKS];
    copy_device_to_host(host, partial, blocks * sizeof(float));
    double total = 0.0;
    for (int i = 0; i < blocks; i++) total += host[i];
    kernel_time_end(kernel_span);
    return (float)total;
}

#endif
