// Softmax + cross-entropy fused with its gradient on CUDA: one block per row of logits, the row
// read once into registers (16 bytes per access), its max, the sum of exponentials, the loss, then
// the gradient written over the logits from the registers. The probabilities are never stored.
// A vocabulary too wide for the registers of one block takes an online softmax (running max and
// sum in one pass, Milakov & Gimelshein 2018) and reads the row a second time for the gradient.
#ifndef LLMC_CUDA_CLASSIFIER_CUH
#define LLMC_CUDA_CLASSIFIER_CUH

#include "device.cuh"

#define CLASSIFIER_LOG2E 1.4426950408889634f

// the block's max and sum of one value per thread: warps through shuffles, then the warps'
// results through shared memory; every thread ends with the result. Each is called once per
// kernel (a second call would need a barrier before its shared writes).
__device__ inline float block_max(float v) {
    __shared__ float warp_maxes[32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    v = warp_max(v);
    if (lane == 0) warp_maxes[warp] = v;
    __syncthreads();  // every warp's max is written before any thread reads them
    v = -INFINITY;
    for (int w = 0; w < (int)blockDim.x / 32; w++) v = fmaxf(v, warp_maxes[w]);
    return v;
}
__device__ inline float block_sum(float v) {
    __shared__ float warp_sums[32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    v = warp_sum(v);
    if (lane == 0) warp_sums[warp] = v;
    __syncthreads();  // every warp's sum is written before any thread reads them
    v = 0.0f;
    for (int w = 0; w < (int)blockDim.x / 32; w++) v += warp_sums[w];
    return v;
}

// block-wide reduction of (max, sum of exp relative to max) pairs
__device__ inline void online_softmax_merge(float* m, float* s, float m2, float s2) {
    float m_new = fmaxf(*m, m2);
    *s = (*m == -INFINITY ? 0.0f : *s * expf(*m - m_new)) + (m2 == -INFINITY ? 0.0f : s2 * expf(m2 - m_new));
    *m = m_new;
}

// every thread's (max, sum) merged over the block, warps through shuffles, then the warps'
// results through shared memory; every thread ends with the block's (max, sum)
__device__ inline void block_online_softmax_merge(float* m, float* s) {
    __shared__ float shared_m[32], shared_s[32];
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int o = 16; o > 0; o /= 2) {
        float m2 = __shfl_xor_sync(0xffffffff, *m, o), s2 = __shfl_xor_sync(0xffffffff, *s, o);
        online_softmax_merge(m, s, m2, s2);
    }
    if (lane == 0) { shared_m[warp] = *m; shared_s[warp] = *s; }
    __syncthreads();
    *m = -INFINITY;
    *s = 0.0f;
    for (int w = 0; w < (int)blockDim.x / 32; w++) online_softmax_merge(m, s, shared_m[w], shared_s[w]);
}

// block n: row n of logits (N, Vp), each thread holding CLASSIFIER_PACKS packs of 8 (bf16) or 4
// (fp32) logits in registers, pack i of thread t being pack t + i blockDim of the row: every load
// of a thread is issued before the first is used, and the row crosses the memory bus twice (read
// once, gradient written once) instead of three times. Vp is a multiple of 128, so a row is whole
// packs; columns from V on are padding (left out of the softmax, gradient 0). At GPT-2's
// Vp = 50304 that is 6288 packs over 800 threads (25 warps). The packs are held as four 32-bit
// words each (uint4): held as an array of 8 bf16 they took 8 registers a pack and spilled.
// __launch_bounds__(1024) gives a thread at most 64 registers: 32 for the row, no spills (sm_90).
#define CLASSIFIER_PACKS 8
// element k of a pack of floatX held as four 32-bit words: two bf16 each (the low half first; a
// bf16 is a float's upper 16 bits) or one float
__device__ inline float pack_element(uint4 w, int k) {
    int i = k / (PACK16 / 4);
    unsigned int word = i == 0 ? w.x : i == 1 ? w.y : i == 2 ? w.z : w.w;
    if (FLOATX_IS_FLOAT) return __uint_as_float(word);
    return __uint_as_float(k % 2 == 0 ? word << 16 : word & 0xffff0000u);
}

__global__ void __launch_bounds__(1024) fused_classifier_kernel(floatX* logits, float* losses, const int* targets,
                                                                float dloss, int V, int Vp) {
    int n = blockIdx.x, packs = Vp / PACK16;
    floatX* row = logits + (size_t)n * Vp;
    int target = targets[n];
    float target_logit = threadIdx.x == 0 ? (float)row[target] : 0.0f;  // (read before any thread writes)
    uint4 x[CLASSIFIER_PACKS];
#pragma unroll
    for (int i = 0; i < CLASSIFIER_PACKS; i++) {
        int p = threadIdx.x + i * blockDim.x;
        if (p < packs) x[i] = *(const uint4*)(row + (size_t)p * PACK16);
    }
    // each pack's max and sum of exponentials folded into the thread's (max, sum), then the block's
    float m = -INFINITY, s = 0.0f;
#pragma unroll
    for (int i = 0; i < CLASSIFIER_PACKS; i++) {
        int v0 = (threadIdx.x + i * blockDim.x) * PACK16;
        float pack_max = -INFINITY, pack_sum = 0.0f;
        for (int k = 0; k < PACK16; k++) {
            if (v0 + k < V) pack_max = fmaxf(pack_max, pack_element(x[i], k));
        }
        for (int k = 0; k < PACK16; k++) {
            if (v0 + k < V) pack_sum += exp2f((pack_element(x[i], k) - pack_max) * CLASSIFIER_LOG2E);
        }
        online_softmax_merge(&m, &s, pack_max, pack_sum);
    }
    block_online_softmax_merge(&m, &s);
    float m2 = m * CLASSIFIER_LOG2E;
    if (threadIdx.x == 0) losses[n] = logf(s) - (target_logit - m);
    if (dloss == 0.0f) return;
    float scale = dloss / s;
#pragma unroll
    for (int i = 0; i < CLASSIFIER_PACKS; i++) {
        int p = threadIdx.x + i * blockDim.x, v0 = p * PACK16;
        if (p >= packs) continue;
        Pack16 grad;
        for (int k = 0; k < PACK16; k++) {
            int v = v0 + k;
            float prob_scaled = exp2f(pack_element(x[i], k) * CLASSIFIER_LOG2E - m2) * scale;
            grad.v[k] = (floatX)(v < V ? prob_scaled - (v == target ? dloss : 0.0f) : 0.0f);
        }
        store16(row + v0, grad);
    }
}

// the threads fused_classifier_kernel takes for a row of Vp: CLASSIFIER_PACKS packs each, whole
// warps; more than 1024 (Vp above 65536 in bf16) and the row does not fit one block's registers
static inline int classifier_threads(int Vp) {
    int threads = ceil_div((size_t)Vp / PACK16, CLASSIFIER_PACKS);
    return ceil_div((size_t)threads, 32) * 32;
}

// block n: row n, for a vocabulary wider than the registers of a block. Memory-bound (the row is
// read twice and written once), 16 bytes per access. Each pack is folded into the running
// (max, sum) with one merge.
__global__ void fused_classifier_wide_kernel(floatX* logits, float* losses, const int* targets,
                                        float dloss, int V, int Vp) {
    int n = blockIdx.x;
    floatX* row = logits + (size_t)n * Vp;
    float m = -INFINITY, s = 0.0f;
    for (int v0 = threadIdx.x * PACK16; v0 < V; v0 += blockDim.x * PACK16) {
        Pack16 x = load16(row + v0);
        float pack_max = -INFINITY, pack_sum = 0.0f;
        for (int k = 0; k < PACK16; k++) {
            if (v0 + k < V) pack_max = fmaxf(pack_max, (float)x.v[k]);
        }
        for (int k = 0; k < PACK16; k++) {
            if (v0 + k < V) pack_sum += expf((float)x.v[k] - pack_max);
        }
        online_softmax_merge(&m, &s, pack_max, pack_sum);
    }
    block_online_softmax_merge(&m, &s);
    int target = targets[n];
    if (threadIdx.x == 0) losses[n] = logf(s) - ((float)row[target] - m);
    __syncthreads();  // every thread has read row[target] before any overwrites it
    if (dloss == 0.0f) return;
    float inv = 1.0f / s;
    for (int v0 = threadIdx.x * PACK16; v0 < Vp; v0 += blockDim.x * PACK16) {
        Pack16 x = load16(row + v0), grad;
        for (int k = 0; k < PACK16; k++) {
            int v = v0 + k;
            grad.v[k] = (floatX)(v < V ? (expf((float)x.v[k] - m) * inv - (v == target ? 1.0f : 0.0f)) * dloss : 0.0f);
        }
        store16(row + v0, grad);
    }
}

// logits (N, Vp), real tokens in the first V columns. losses (N) = -log softmax[target]; when
// dloss != 0 each row becomes dloss * (softmax - onehot(target)), zero over the padding.
static inline void fused_classifier(floatX* logits, float* losses, const int* targets, float dloss,
                                    int N, int V, int Vp) {
    int kernel_span = kernel_time_begin("classifier (softmax, loss, dlogits)", 0, 0);
    check_whole_packs("fused_classifier", "Vp", (size_t)Vp);
    int threads = classifier_threads(Vp);
    if (threads <= 1024) fused_classifier_kernel<<<N, threads>>>(logits, losses, targets, dloss, V, Vp);
    else fused_classifier_wide_kernel<<<N, 1024>>>(logits, losses, targets, dloss, V, Vp);
    cudaCheckLaunch();
    kernel_time_end(kernel_span);
}

// ---------------------------------------------------------------------------------------------
// The same loss with the vocabulary split over ranks (Megatron-LM's vocab-parallel
// cross-entropy, llmc/cpu/classifier.h): a rank holds the columns [lo, lo + Vl) of every row of
// logits (N, Vl), of which the first `real` are tokens and the rest padding. Three kernels, with
// an all-reduce of N (then 2N) floats over the ranks between them instead of a gather of the
// N x V logits:
//   1. classifier_shard_max    this rank's row maxima             -> all-reduce MAX
//   2. classifier_shard_sums   sum of exp(logit - max), target's logit - max -> all-reduce SUM
//   3. classifier_shard_loss   losses, and the logits' gradient with dloss != 0
// The max must be global before any exponential is summed, so the online softmax of
// fused_classifier (one pass) does not apply across ranks: the row is read once per kernel.
// Each kernel is one block per row, 16 bytes per access; Vl is whole packs, so the last pack that
// holds real columns is still inside the row, and its columns from `real` on are masked.
#define CLASSIFIER_SHARD_THREADS 512

// block n: maxes[n] = the max of the real columns of row n of logits (N, Vl); -inf when real = 0
__global__ void classifier_shard_max_kernel(float* maxes, const floatX* logits, int Vl, int real) {
    int n = blockIdx.x;
    const floatX* row = logits + (size_t)n * Vl;
    float m = -INFINITY;
    for (int v0 = threadIdx.x * PACK16; v0 < real; v0 += blockDim.x * PACK16) {
        Pack16 x = load16(row + v0);
        for (int k = 0; k < PACK16; k++) {
            if (v0 + k < real) m = fmaxf(m, (float)x.v[k]);
        }
    }
    m = block_max(m);
    if (threadIdx.x == 0) maxes[n] = m;
}

// block n: sums (N, 2)[n] = [sum over the real columns of exp(logit - maxes[n]), the target's
// logit - maxes[n] if this rank holds the target, else 0]. maxes are the all-reduced ones.
__global__ void classifier_shard_sums_kernel(float* sums, const floatX* logits, const float* maxes,
                                             const int* targets, int Vl, int real, int lo) {
    int n = blockIdx.x;
    const floatX* row = logits + (size_t)n * Vl;
    float m = maxes[n], s = 0.0f;
    for (int v0 = threadIdx.x * PACK16; v0 < real; v0 += blockDim.x * PACK16) {
        Pack16 x = load16(row + v0);
        for (int k = 0; k < PACK16; k++) {
            if (v0 + k < real) s += expf((float)x.v[k] - m);
        }
    }
    s = block_sum(s);
    if (threadIdx.x == 0) {
        int local = targets[n] - lo;  // the target's column on this rank, if it is here
        sums[2 * n] = s;
        sums[2 * n + 1] = local >= 0 && local < real ? (float)row[local] - m : 0.0f;
    }
}

// block n: losses[n] = log(sum) - (target logit - max) from the all-reduced sums (N, 2); with
// dloss != 0 row n of logits (N, Vl) becomes dloss * (softmax - onehot(target)) over the real
// columns, 0 over the padding. The target's logit was read by classifier_shard_sums, and each
// thread reads and writes only its own packs, so no barrier orders the overwrite.
__global__ void classifier_shard_loss_kernel(floatX* logits, float* losses, const float* maxes,
                                             const float* sums, const int* targets, float dloss,
                                             int Vl, int real, int lo) {
    int n = blockIdx.x;
    float sum = sums[2 * n];
    if (threadIdx.x == 0) losses[n] = logf(sum) - sums[2 * n + 1];
    if (dloss == 0.0f) return;
    floatX* row = logits + (size_t)n * Vl;
    float m = maxes[n], scale = dloss / sum;
    int local = targets[n] - lo;  // out of [0, real) when another rank holds the target
    for (int v0 = threadIdx.x * PACK16; v0 < Vl; v0 += blockDim.x * PACK16) {
        Pack16 x = load16(row + v0), grad;
        for (int k = 0; k < PACK16; k++) {
            int v = v0 + k;
            float g = v < real ? expf((float)x.v[k] - m) * scale : 0.0f;
            grad.v[k] = (floatX)(v == local ? g - dloss : g);
        }
        store16(row + v0, grad);
    }
}

static inline void classifier_shard_check(const char* op, int Vl, int real) {
    check_whole_packs(op, "Vl", (size_t)Vl);
    if (real < 0 || real > Vl) fail("%s: real = %d is not in [0, Vl = %d]", op, real, Vl);
}

// maxes (N) = the max of each row's real columns of logits (N, Vl) (-inf when real = 0)
static inline void classifier_shard_max(float* maxes, const floatX* logits, int N, int Vl, int real) {
    int kernel_span = kernel_time_begin("vocab-parallel classifier: row maxima", 0, 0);
    classifier_shard_check("classifier_shard_max", Vl, real);
    classifier_shard_max_kernel<<<N, CLASSIFIER_SHARD_THREADS>>>(maxes, logits, Vl, real);
    cudaCheckLaunch();
    kernel_time_end(kernel_span);
}

// sums (N, 2): [sum over real columns of exp(logit - maxes[n]), the target's logit - maxes[n]
// if lo <= target < lo + real, else 0]
static inline void classifier_shard_sums(float* sums, const floatX* logits, const float* maxes,
                                         const int* targets, int N, int Vl, int real, int lo) {
    int kernel_span = kernel_time_begin("vocab-parallel classifier: row sums", 0, 0);
    classifier_shard_check("classifier_shard_sums", Vl, real);
    classifier_shard_sums_kernel<<<N, CLASSIFIER_SHARD_THREADS>>>(sums, logits, maxes, targets, Vl, real, lo);
    cudaCheckLaunch();
    kernel_time_end(kernel_span);
}

// losses (N) = log(sum) - (target logit - max); with dloss != 0 each row of logits (N, Vl)
// becomes dloss * (softmax - onehot(target)) over its real columns and 0 over its padding
static inline void classifier_shard_loss(floatX* logits, float* losses, const float* maxes,
                                         const float* sums, const int* targets, float dloss, int N,
                                         int Vl, int real, int lo) {
    int kernel_span = kernel_time_begin("vocab-parallel classifier: loss, dlogits", 0, 0);
    classifier_shard_check("classifier_shard_loss", Vl, real);
    classifier_shard_loss_kernel<<<N, CLASSIFIER_SHARD_THREADS>>>(logits, losses, maxes, sums, targets, dloss, Vl,
                                                                  real, lo);
    cudaCheckLaunch();
    kernel_time_end(kernel_span);
}

#endif
