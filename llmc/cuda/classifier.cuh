// Softmax + cross-entropy fused with its gradient on CUDA: one block per row of logits, the row
// read once into registers (16 bytes per access), its max, the sum of exponentials, the loss, then
// the gradient written over the logits from the registers. The probabilities are never stored.
// A vocabulary too wide for the registers of one block takes an online softmax (running max and
// sum in one pass, Milakov & Gimelshein 2018) and reads the row a second time for the gradient.
// By default a row that fits is held partly in shared memory instead, so that two rows share an
// SM (fused_classifier_split_kernel below; LLMC_CLASSIFIER=registers keeps the register kernel).
#ifndef LLMC_CUDA_CLASSIFIER_CUH
#define LLMC_CUDA_CLASSIFIER_CUH

#include "device.cuh"
#include "mma.cuh"  // cp_async16

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

// a pack of logits, its first column v0, into the thread's running (max, sum): the pack's max and
// its sum of exponentials (base 2), then one merge; columns from V on are padding
__device__ inline void classifier_fold_pack(float* m, float* s, uint4 x, int v0, int V) {
    float pack_max = -INFINITY, pack_sum = 0.0f;
    for (int k = 0; k < PACK16; k++) {
        if (v0 + k < V) pack_max = fmaxf(pack_max, pack_element(x, k));
    }
    for (int k = 0; k < PACK16; k++) {
        if (v0 + k < V) pack_sum += exp2f((pack_element(x, k) - pack_max) * CLASSIFIER_LOG2E);
    }
    online_softmax_merge(m, s, pack_max, pack_sum);
}

// the gradient of a pack of logits from the row's max (m2 = max log2 e) and scale = dloss / sum:
// dloss softmax - dloss at the target, 0 over the padding
__device__ inline Pack16 classifier_gradient_pack(uint4 x, int v0, int V, int target, float m2, float scale,
                                                  float dloss) {
    Pack16 grad;
    for (int k = 0; k < PACK16; k++) {
        int v = v0 + k;
        float prob_scaled = exp2f(pack_element(x, k) * CLASSIFIER_LOG2E - m2) * scale;
        grad.v[k] = (floatX)(v < V ? prob_scaled - (v == target ? dloss : 0.0f) : 0.0f);
    }
    return grad;
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
    // (a pack past the row's end has v0 >= Vp > V: nothing of it is folded)
    float m = -INFINITY, s = 0.0f;
#pragma unroll
    for (int i = 0; i < CLASSIFIER_PACKS; i++) classifier_fold_pack(&m, &s, x[i], (threadIdx.x + i * blockDim.x) * PACK16, V);
    block_online_softmax_merge(&m, &s);
    float m2 = m * CLASSIFIER_LOG2E;
    if (threadIdx.x == 0) losses[n] = logf(s) - (target_logit - m);
    if (dloss == 0.0f) return;
    float scale = dloss / s;
#pragma unroll
    for (int i = 0; i < CLASSIFIER_PACKS; i++) {
        int p = threadIdx.x + i * blockDim.x;
        if (p < packs) store16(row + p * PACK16, classifier_gradient_pack(x[i], p * PACK16, V, target, m2, scale, dloss));
    }
}

// the threads fused_classifier_kernel takes for a row of Vp: CLASSIFIER_PACKS packs each, whole
// warps; more than 1024 (Vp above 65536 in bf16) and the row does not fit one block's registers
static inline int classifier_threads(int Vp) {
    int threads = ceil_div((size_t)Vp / PACK16, CLASSIFIER_PACKS);
    return ceil_div((size_t)threads, 32) * 32;
}

// Block n: row n again, split so that two blocks fit an SM (the default; dev/cuda/classifier
// v5). fused_classifier_kernel holds GPT-2's 100 KB bf16 row in the registers of 800 threads, 64
// registers each: one block an SM, whose loads, exponentials, block-wide reduction and stores run one
// after another with nothing to overlap them (about 16 us a row on an H200, where the row's 200 KB
// of traffic take 5.5 us at an SM's share of the bandwidth). Here 768 threads hold 5 packs each in
// registers (the row's first 3840 packs) and the other 2448 sit in a 39 KB static shared array,
// filled by cp.async without passing through registers. __launch_bounds__(768, 2) holds a thread
// to 40 registers (no spills, sm_90), so two blocks fit an SM's 64 K registers and 228 KB of shared
// memory, and one row's loads overlap the other's arithmetic. A thread copies and reads only its own
// shared packs (pack 3840 + t + 768 j for thread t), so its own cp.async wait orders them; no
// barrier is needed but the reduction's.
#define CLASSIFIER_SPLIT_THREADS 768
#define CLASSIFIER_SPLIT_REGISTER_PACKS 5
#define CLASSIFIER_SPLIT_SHARED_PACKS 2448
__global__ void __launch_bounds__(CLASSIFIER_SPLIT_THREADS, 2) fused_classifier_split_kernel(floatX* logits,
        float* losses, const int* targets, float dloss, int V, int Vp) {
    __shared__ uint4 rest[CLASSIFIER_SPLIT_SHARED_PACKS];
    const int threads = CLASSIFIER_SPLIT_THREADS, held = CLASSIFIER_SPLIT_REGISTER_PACKS * CLASSIFIER_SPLIT_THREADS;
    int n = blockIdx.x, packs = Vp / PACK16;
    floatX* row = logits + (size_t)n * Vp;
    int target = targets[n];
    float target_logit = threadIdx.x == 0 ? (float)row[target] : 0.0f;  // (read before any thread writes)
    // the shared part on its way first, then every load of the registers' part
    for (int p = held + threadIdx.x; p < packs; p += threads) cp_async16(&rest[p - held], row + (size_t)p * PACK16, 1);
    cp_async_commit();
    uint4 x[CLASSIFIER_SPLIT_REGISTER_PACKS];
#pragma unroll
    for (int i = 0; i < CLASSIFIER_SPLIT_REGISTER_PACKS; i++) {
        int p = threadIdx.x + i * threads;
        if (p < packs) x[i] = *(const uint4*)(row + (size_t)p * PACK16);
    }
    float m = -INFINITY, s = 0.0f;
#pragma unroll
    for (int i = 0; i < CLASSIFIER_SPLIT_REGISTER_PACKS; i++) {
        int p = threadIdx.x + i * threads;
        if (p < packs) classifier_fold_pack(&m, &s, x[i], p * PACK16, V);
    }
    cp_async_wait<0>();  // this thread's copies have landed (no other thread reads them)
    for (int p = held + threadIdx.x; p < packs; p += threads) classifier_fold_pack(&m, &s, rest[p - held], p * PACK16, V);
    block_online_softmax_merge(&m, &s);
    if (threadIdx.x == 0) losses[n] = logf(s) - (target_logit - m);
    if (dloss == 0.0f) return;
    float m2 = m * CLASSIFIER_LOG2E, scale = dloss / s;
#pragma unroll
    for (int i = 0; i < CLASSIFIER_SPLIT_REGISTER_PACKS; i++) {
        int p = threadIdx.x + i * threads;
        if (p < packs)
            store16(row + (size_t)p * PACK16, classifier_gradient_pack(x[i], p * PACK16, V, target, m2, scale, dloss));
    }
    for (int p = held + threadIdx.x; p < packs; p += threads)
        store16(row + (size_t)p * PACK16, classifier_gradient_pack(rest[p - held], p * PACK16, V, target, m2, scale, dloss));
}

// the split kernel (the default; LLMC_CLASSIFIER=registers, read once, asks for the register
// kernel) where the row fits its registers and shared memory (GPT-2's bf16 row exactly: 6288
// packs; fp32 rows are twice that). A d12 step on an H200 (2026-11-27): 6.1 against 7.9-8.3 ms.
static inline int classifier_split_asked(void) {
    static int asked = -1;
    if (asked < 0) asked = env_choice("LLMC_CLASSIFIER", 0) == 0;
    return asked;
}
static inline int classifier_split_fits(int Vp) {
    return Vp / PACK16 <= CLASSIFIER_SPLIT_REGISTER_PACKS * CLASSIFIER_SPLIT_THREADS + CLASSIFIER_SPLIT_SHARED_PACKS;
}
// the calls the split kernel took, and those whose rows did not fit it
static long classifier_split_calls[2];

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
    if (classifier_split_asked()) classifier_split_calls[!classifier_split_fits(Vp)]++;
    if (classifier_split_asked() && classifier_split_fits(Vp))
        fused_classifier_split_kernel<<<N, CLASSIFIER_SPLIT_THREADS>>>(logits, losses, targets, dloss, V, Vp);
    else if (threads <= 1024) fused_classifier_kernel<<<N, threads>>>(logits, losses, targets, dloss, V, Vp);
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
