/*
Fused classifier: softmax + cross-entropy + its gradient written over the logits, checked
against the CPU backend.
  make dev/cuda/classifier && ./dev/cuda/classifier
v1: one thread per row: three serial passes over 50257 logits (max, sum, gradient).
v2: one block per row with an online softmax: the max and the sum in a single pass, block-wide
    reductions, then the gradient pass; 2-byte loads in bf16.
v3: v2 with 16-byte loads and stores, one online-softmax merge per pack of 8 logits
    (llmc/cuda/classifier.cuh's fused_classifier_wide_kernel, for vocabularies above 65536).
v4: the row in registers, 8 packs a thread, every load issued before the first is used: read
    once, the max, the sum of exponentials (base 2), then the gradient from the registers; the row
    crosses the bus twice instead of three times (llmc/cuda/classifier.cuh's fused_classifier).
v5: v4's one block an SM (800 threads at 64 registers hold the row) made two: 768 threads hold 5
    packs each in registers, the row's other 2448 packs sit in 39 KB of static shared memory,
    filled by cp.async; 40 registers a thread, so two rows share an SM and one's loads overlap the
    other's arithmetic (fused_classifier_split_kernel, llmc's default where a row fits: GPT-2's
    vocabulary in bf16, not in fp32, whose row is twice as wide; this program runs it in bf16).
    On an H200 (2026-11-27): 0.38 ms against v4's 0.49 with the gradient.
shards: the vocabulary-parallel loss of tensor parallelism (classifier_shard_max, _sums, _loss in
    llmc/cuda/classifier.cuh): the Vp columns split over tp ranks, each rank's three kernels on its
    (N, Vp / tp) slice, and the two all-reduces between them (max, then sum) done on the host.
    Checked against the CPU's shard ops run the same way, for 2 and 3 ranks, for 3 ranks where the
    last holds padding only, and for 1 rank against fused_classifier.
*/
#include "common.h"
namespace cpu {
#include "llmc/cpu/classifier.h"
}
#include "llmc/cuda/classifier.cuh"

__global__ void classifier_v1(floatX* logits, float* losses, const int* targets, float dloss,
                              int N, int V, int Vp) {
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    floatX* row = logits + (size_t)n * Vp;
    float m = -INFINITY, s = 0.0f;
    for (int v = 0; v < V; v++) m = fmaxf(m, (float)row[v]);
    for (int v = 0; v < V; v++) s += expf((float)row[v] - m);
    int target = targets[n];
    losses[n] = logf(s) - ((float)row[target] - m);
    for (int v = 0; v < Vp; v++) {
        row[v] = (floatX)(v < V ? (expf((float)row[v] - m) / s - (v == target ? 1.0f : 0.0f)) * dloss : 0.0f);
    }
}

// v2: llmc's kernel before 16-byte accesses
__global__ void classifier_v2(floatX* logits, float* losses, const int* targets,
                                        float dloss, int V, int Vp) {
    int n = blockIdx.x;
    floatX* row = logits + (size_t)n * Vp;
    float m = -INFINITY, s = 0.0f;
    for (int v = threadIdx.x; v < V; v += blockDim.x) online_softmax_merge(&m, &s, (float)row[v], 1.0f);
    block_online_softmax_merge(&m, &s);
    int target = targets[n];
    if (threadIdx.x == 0) losses[n] = logf(s) - ((float)row[target] - m);
    __syncthreads();  // every thread has read row[target] before any overwrites it
    if (dloss == 0.0f) return;
    float inv = 1.0f / s;
    for (int v = threadIdx.x; v < Vp; v += blockDim.x) {
        float grad = v < V ? (expf((float)row[v] - m) * inv - (v == target ? 1.0f : 0.0f)) * dloss : 0.0f;
        row[v] = (floatX)grad;
    }
}

// ---------------------------------------------------------------------------------------------
// The vocabulary over tp ranks, all in this process: rank r holds the columns [r Vl, (r + 1) Vl)
// of logits (N, Vp), Vl = Vp / tp, stored as the r-th (N, Vl) block of an (N * Vp) buffer.

// rank r's first column and how many of its columns are real tokens (the rest is padding)
static int shard_lo(int r, int Vl) { return r * Vl; }
static int shard_real(int r, int Vl, int V) {
    int real = V - shard_lo(r, Vl);
    return real < 0 ? 0 : real > Vl ? Vl : real;
}

// shards (tp, N, Vl) <- logits (N, Vp), and back
static void split_columns(float* shards, const float* logits, int N, int Vp, int tp) {
    int Vl = Vp / tp;
    for (int r = 0; r < tp; r++) {
        for (int n = 0; n < N; n++) {
            float* dst = shards + ((size_t)r * N + n) * Vl;
            memcpy(dst, logits + (size_t)n * Vp + shard_lo(r, Vl), (size_t)Vl * sizeof(float));
        }
    }
}
static void join_columns(float* logits, const float* shards, int N, int Vp, int tp) {
    int Vl = Vp / tp;
    for (int r = 0; r < tp; r++) {
        for (int n = 0; n < N; n++) {
            const float* src = shards + ((size_t)r * N + n) * Vl;
            memcpy(logits + (size_t)n * Vp + shard_lo(r, Vl), src, (size_t)Vl * sizeof(float));
        }
    }
}

// the all-reduces of train_gpt2_tp.cu over the ranks' arrays x (tp, n), into out (n)
static void host_all_reduce_max(float* out, const float* x, int tp, size_t n) {
    for (size_t i = 0; i < n; i++) {
        out[i] = x[i];
        for (int r = 1; r < tp; r++) out[i] = fmaxf(out[i], x[(size_t)r * n + i]);
    }
}
static void host_all_reduce_sum(float* out, const float* x, int tp, size_t n) {
    for (size_t i = 0; i < n; i++) {
        out[i] = x[i];
        for (int r = 1; r < tp; r++) out[i] += x[(size_t)r * n + i];
    }
}

// the CPU reference: cpu::classifier_shard_* on each rank's columns of logits (N, Vp).
// Out: every rank's maxes (tp, N) before the all-reduce, every rank's losses (tp, N), and the
// gradient (N, Vp) joined from the ranks' slices.
static void shards_cpu(float* maxes, float* losses, float* grads, const float* logits,
                       const int* targets, float dloss, int N, int V, int Vp, int tp) {
    int Vl = Vp / tp;
    float* shards = (float*)malloc_check((size_t)N * Vp * sizeof(float));
    float* sums = (float*)malloc_check((size_t)tp * 2 * N * sizeof(float));
    float* max_all = (float*)malloc_check((size_t)N * sizeof(float));
    float* sums_all = (float*)malloc_check((size_t)2 * N * sizeof(float));
    split_columns(shards, logits, N, Vp, tp);
    for (int r = 0; r < tp; r++) {
        cpu::classifier_shard_max(maxes + (size_t)r * N, shards + (size_t)r * N * Vl, N, Vl, shard_real(r, Vl, V));
    }
    host_all_reduce_max(max_all, maxes, tp, N);
    for (int r = 0; r < tp; r++) {
        cpu::classifier_shard_sums(sums + (size_t)r * 2 * N, shards + (size_t)r * N * Vl, max_all, targets, N, Vl,
                                   shard_real(r, Vl, V), shard_lo(r, Vl));
    }
    host_all_reduce_sum(sums_all, sums, tp, 2 * (size_t)N);
    for (int r = 0; r < tp; r++) {
        cpu::classifier_shard_loss(shards + (size_t)r * N * Vl, losses + (size_t)r * N, max_all, sums_all, targets,
                                   dloss, N, Vl, shard_real(r, Vl, V), shard_lo(r, Vl));
    }
    join_columns(grads, shards, N, Vp, tp);
    free(shards);
    free(sums);
    free(max_all);
    free(sums_all);
}

// the same on the GPU: the three kernels of each rank on its (N, Vl) block of d_logits (N * Vp),
// the all-reduces on the host in between. Same outputs as shards_cpu, in host memory.
static void shards_gpu(float* maxes, float* losses, float* grads, const float* logits,
                       const int* targets, float dloss, int N, int V, int Vp, int tp) {
    int Vl = Vp / tp;
    float* shards = (float*)malloc_check((size_t)N * Vp * sizeof(float));
    float* sums = (float*)malloc_check((size_t)tp * 2 * N * sizeof(float));
    float* max_all = (float*)malloc_check((size_t)N * sizeof(float));
    float* sums_all = (float*)malloc_check((size_t)2 * N * sizeof(float));
    floatX* d_logits = (floatX*)device_malloc((size_t)N * Vp * sizeof(floatX));
    float* d_maxes = (float*)device_malloc((size_t)tp * N * sizeof(float));
    float* d_sums = (float*)device_malloc((size_t)tp * 2 * N * sizeof(float));
    float* d_losses = (float*)device_malloc((size_t)tp * N * sizeof(float));
    float* d_max_all = (float*)device_malloc((size_t)N * sizeof(float));
    float* d_sums_all = (float*)device_malloc((size_t)2 * N * sizeof(float));
    int* d_targets = (int*)device_malloc((size_t)N * sizeof(int));
    split_columns(shards, logits, N, Vp, tp);
    copy_floats_to_device(d_logits, shards, (size_t)N * Vp);
    copy_host_to_device(d_targets, targets, (size_t)N * sizeof(int));
    for (int r = 0; r < tp; r++) {
        classifier_shard_max(d_maxes + (size_t)r * N, d_logits + (size_t)r * N * Vl, N, Vl, shard_real(r, Vl, V));
    }
    copy_device_to_host(maxes, d_maxes, (size_t)tp * N * sizeof(float));
    host_all_reduce_max(max_all, maxes, tp, N);
    copy_host_to_device(d_max_all, max_all, (size_t)N * sizeof(float));
    for (int r = 0; r < tp; r++) {
        classifier_shard_sums(d_sums + (size_t)r * 2 * N, d_logits + (size_t)r * N * Vl, d_max_all, d_targets, N,
                              Vl, shard_real(r, Vl, V), shard_lo(r, Vl));
    }
    copy_device_to_host(sums, d_sums, (size_t)tp * 2 * N * sizeof(float));
    host_all_reduce_sum(sums_all, sums, tp, 2 * (size_t)N);
    copy_host_to_device(d_sums_all, sums_all, (size_t)2 * N * sizeof(float));
    for (int r = 0; r < tp; r++) {
        classifier_shard_loss(d_logits + (size_t)r * N * Vl, d_losses + (size_t)r * N, d_max_all, d_sums_all,
                              d_targets, dloss, N, Vl, shard_real(r, Vl, V), shard_lo(r, Vl));
    }
    copy_device_to_host(losses, d_losses, (size_t)tp * N * sizeof(float));
    copy_device_to_floats(shards, d_logits, (size_t)N * Vp);
    join_columns(grads, shards, N, Vp, tp);
    device_free(d_logits);
    device_free(d_maxes);
    device_free(d_sums);
    device_free(d_losses);
    device_free(d_max_all);
    device_free(d_sums_all);
    device_free(d_targets);
    free(shards);
    free(sums);
    free(max_all);
    free(sums_all);
}

// the shard kernels over tp ranks against the CPU's shard ops: every rank's maxes and losses,
// and the joined gradient scaled by N (as v1-v3). With one rank, the losses and gradient are
// also checked against fused_classifier's (fused_losses, fused_grads_xN, from the GPU).
static int check_shards(const char* label, int tp, const float* logits, const int* targets, float dloss,
                        int N, int V, int Vp,
                        const float* fused_losses, const float* fused_grads_xN) {
    size_t n_all = (size_t)N * Vp;
    size_t n_stats = (size_t)tp * N;
    float* maxes = (float*)malloc_check(n_stats * sizeof(float));
    float* maxes_ref = (float*)malloc_check(n_stats * sizeof(float));
    float* losses = (float*)malloc_check(n_stats * sizeof(float));
    float* losses_ref = (float*)malloc_check(n_stats * sizeof(float));
    float* grads = (float*)malloc_check(n_all * sizeof(float));
    float* grads_ref = (float*)malloc_check(n_all * sizeof(float));
    shards_cpu(maxes_ref, losses_ref, grads_ref, logits, targets, dloss, N, V, Vp, tp);
    shards_gpu(maxes, losses, grads, logits, targets, dloss, N, V, Vp, tp);
    for (size_t i = 0; i < n_all; i++) { grads[i] *= (float)N; grads_ref[i] *= (float)N; }
    int Vl = Vp / tp, ok = 1;
    char name[64];
    printf("  %s: V=%d, ranks x columns %d x %d, real columns per rank", label, V, tp, Vl);
    for (int r = 0; r < tp; r++) printf(" %d", shard_real(r, Vl, V));
    printf("\n");
    // a rank without real columns has a max of -inf, which the relative error cannot take:
    // the two must agree on where, and are compared as 0 there
    for (size_t i = 0; i < n_stats; i++) {
        if (maxes[i] == -INFINITY && maxes_ref[i] == -INFINITY) maxes[i] = maxes_ref[i] = 0.0f;
    }
    snprintf(name, sizeof(name), "%s maxes", label);
    ok &= compare_arrays(name, maxes, maxes_ref, n_stats, 1e-4f);
    snprintf(name, sizeof(name), "%s losses", label);
    ok &= compare_arrays(name, losses, losses_ref, n_stats, 1e-4f);
    snprintf(name, sizeof(name), "%s gradient x N", label);
    ok &= compare_arrays(name, grads, grads_ref, n_all, default_tolerance());
    if (fused_losses != NULL) {
        ok &= compare_arrays("tp=1 losses = fused_classifier's", losses, fused_losses, N, 1e-4f);
        ok &= compare_arrays("tp=1 gradient = fused_classifier's", grads, fused_grads_xN, n_all, default_tolerance());
    }
    free(maxes); free(maxes_ref);
    free(losses); free(losses_ref);
    free(grads); free(grads_ref);
    return ok;
}

int main(void) {
    // v4 is llmc's launcher on its register path, v5 the split kernel called by name: the
    // launcher's default is the split kernel where a row fits it, so without this "v4" would time
    // v5 again (it did from the day the split kernel became the default)
    setenv("LLMC_CLASSIFIER", "registers", 1);  // (before the launcher first reads it)
    int N = GPU_OR_EMU(4 * 1024, 16), V = 50257, Vp = 50304;
    float dloss = 1.0f / N;
    float* logits = random_floats((size_t)N * Vp, 2.0f);
    round_like_floatX(logits, (size_t)N * Vp);
    int* targets = (int*)malloc_check(N * sizeof(int));
    for (int i = 0; i < N; i++) targets[i] = (int)(rng_u64(&dev_rng) % V);
    float* grads = (float*)malloc_check((size_t)N * Vp * sizeof(float));
    memcpy(grads, logits, (size_t)N * Vp * sizeof(float));
    float* losses = (float*)malloc_check(N * sizeof(float));
    cpu::fused_classifier(grads, losses, targets, dloss, N, V, Vp);

    floatX* d_logits = (floatX*)device_malloc((size_t)N * Vp * sizeof(floatX));
    float* d_losses = (float*)device_malloc(N * sizeof(float));
    int* d_targets = (int*)device_malloc(N * sizeof(int));
    copy_host_to_device(d_targets, targets, N * sizeof(int));
    // gradients are of size dloss = 1/N: compare them scaled up, relative to 1/N
    float tol = default_tolerance(), ms;
    double bytes = 2.0 * N * Vp * sizeof(floatX);
    int ok = 1;
    printf("fused_classifier N=%d V=%d (%s)\n", N, V, PRECISION_NAME);
    for (size_t i = 0; i < (size_t)N * Vp; i++) grads[i] *= (float)N;

    copy_floats_to_device(d_logits, logits, (size_t)N * Vp);
    classifier_v1<<<ceil_div(N, 128), 128>>>(d_logits, d_losses, d_targets, dloss, N, V, Vp);
    cudaCheckLaunch();
    ok &= validate_f32("v1 losses", d_losses, losses, N, 1e-4f);
    float* got = (float*)malloc_check((size_t)N * Vp * sizeof(float));
    copy_device_to_floats(got, d_logits, (size_t)N * Vp);
    for (size_t i = 0; i < (size_t)N * Vp; i++) got[i] *= (float)N;
    ok &= compare_arrays("v1 gradient x N", got, grads, (size_t)N * Vp, tol);
    TIME_KERNEL(ms, 3, (classifier_v1<<<ceil_div(N, 128), 128>>>(d_logits, d_losses, d_targets, 0.0f, N, V, Vp)));
    report("v1 losses only", ms, bytes / 2, 0);

    copy_floats_to_device(d_logits, logits, (size_t)N * Vp);
    classifier_v2<<<N, 1024>>>(d_logits, d_losses, d_targets, dloss, V, Vp);
    cudaCheckLaunch();
    ok &= validate_f32("v2 losses", d_losses, losses, N, 1e-4f);
    copy_device_to_floats(got, d_logits, (size_t)N * Vp);
    for (size_t i = 0; i < (size_t)N * Vp; i++) got[i] *= (float)N;
    ok &= compare_arrays("v2 gradient x N", got, grads, (size_t)N * Vp, tol);
    copy_floats_to_device(d_logits, logits, (size_t)N * Vp);
    TIME_KERNEL(ms, 10, (classifier_v2<<<N, 1024>>>(d_logits, d_losses, d_targets, 0.0f, V, Vp)));
    report("v2 losses only", ms, bytes / 2, 0);

    copy_floats_to_device(d_logits, logits, (size_t)N * Vp);
    fused_classifier_wide_kernel<<<N, 1024>>>(d_logits, d_losses, d_targets, dloss, V, Vp);
    cudaCheckLaunch();
    ok &= validate_f32("v3 losses", d_losses, losses, N, 1e-4f);
    copy_device_to_floats(got, d_logits, (size_t)N * Vp);
    for (size_t i = 0; i < (size_t)N * Vp; i++) got[i] *= (float)N;
    ok &= compare_arrays("v3 gradient x N", got, grads, (size_t)N * Vp, tol);
    copy_floats_to_device(d_logits, logits, (size_t)N * Vp);
    TIME_KERNEL(ms, 10, (fused_classifier_wide_kernel<<<N, 1024>>>(d_logits, d_losses, d_targets, 0.0f, V, Vp)));
    report("v3 losses only", ms, bytes / 2, 0);
    // with the gradient: the row read twice, written once (repeats work on earlier gradients)
    TIME_KERNEL(ms, 10, (fused_classifier_wide_kernel<<<N, 1024>>>(d_logits, d_losses, d_targets, dloss, V, Vp)));
    report("v3 with gradient", ms, 1.5 * bytes, 0);

    // v4, llmc's (in fp32 builds a row of 50304 floats is 12576 packs: too wide for one block's
    // registers, so fused_classifier takes v3's kernel there)
    copy_floats_to_device(d_logits, logits, (size_t)N * Vp);
    fused_classifier(d_logits, d_losses, d_targets, dloss, N, V, Vp);
    ok &= validate_f32("v4 losses", d_losses, losses, N, 1e-4f);
    copy_device_to_floats(got, d_logits, (size_t)N * Vp);
    for (size_t i = 0; i < (size_t)N * Vp; i++) got[i] *= (float)N;
    ok &= compare_arrays("v4 gradient x N", got, grads, (size_t)N * Vp, tol);
    float* v4_losses = (float*)malloc_check(N * sizeof(float));  // for the one-rank shards below
    copy_device_to_host(v4_losses, d_losses, N * sizeof(float));
    copy_floats_to_device(d_logits, logits, (size_t)N * Vp);
    TIME_KERNEL(ms, 10, fused_classifier(d_logits, d_losses, d_targets, 0.0f, N, V, Vp));
    report("v4 losses only", ms, bytes / 2, 0);
    // with the gradient: the row read once, written once
    TIME_KERNEL(ms, 10, fused_classifier(d_logits, d_losses, d_targets, dloss, N, V, Vp));
    report("v4 with gradient", ms, bytes, 0);

    // v5: the row split between registers and shared memory (GPT-2's bf16 row fits exactly)
    if (classifier_split_fits(Vp)) {
        float* got5 = (float*)malloc_check((size_t)N * Vp * sizeof(float));
        copy_floats_to_device(d_logits, logits, (size_t)N * Vp);
        fused_classifier_split_kernel<<<N, CLASSIFIER_SPLIT_THREADS>>>(d_logits, d_losses, d_targets, dloss, V, Vp);
        cudaCheckLaunch();
        ok &= validate_f32("v5 losses", d_losses, losses, N, 1e-4f);
        copy_device_to_floats(got5, d_logits, (size_t)N * Vp);
        for (size_t i = 0; i < (size_t)N * Vp; i++) got5[i] *= (float)N;
        ok &= compare_arrays("v5 gradient x N", got5, grads, (size_t)N * Vp, tol);
        copy_floats_to_device(d_logits, logits, (size_t)N * Vp);
        TIME_KERNEL(ms, 10, (fused_classifier_split_kernel<<<N, CLASSIFIER_SPLIT_THREADS>>>(d_logits, d_losses, d_targets,
                                                                                           0.0f, V, Vp)));
        report("v5 losses only", ms, bytes / 2, 0);
        TIME_KERNEL(ms, 10, (fused_classifier_split_kernel<<<N, CLASSIFIER_SPLIT_THREADS>>>(d_logits, d_losses, d_targets,
                                                                                           dloss, V, Vp)));
        report("v5 with gradient", ms, bytes, 0);
        free(got5);
    } else {
        printf("  v5 skipped: a row of %d %s is %d packs, wider than the split kernel's %d\n", Vp, PRECISION_NAME,
               Vp / PACK16, CLASSIFIER_SPLIT_REGISTER_PACKS * CLASSIFIER_SPLIT_THREADS + CLASSIFIER_SPLIT_SHARED_PACKS);
    }

    printf("vocab-parallel loss (classifier_shard_*), the all-reduces on the host\n");
    ok &= check_shards("tp=1", 1, logits, targets, dloss, N, V, Vp, v4_losses, got);
    ok &= check_shards("tp=2", 2, logits, targets, dloss, N, V, Vp, NULL, NULL);
    ok &= check_shards("tp=3", 3, logits, targets, dloss, N, V, Vp, NULL, NULL);
    // a rank with padding only (real = 0: its max is -inf, its sum 0, its gradient all zero):
    // the vocabulary cut to the first two of three ranks' columns, targets below it
    int V_cut = 2 * (Vp / 3);
    int* targets_cut = (int*)malloc_check(N * sizeof(int));
    for (int i = 0; i < N; i++) targets_cut[i] = targets[i] % V_cut;
    ok &= check_shards("tp=3 cut", 3, logits, targets_cut, dloss, N, V_cut, Vp, NULL, NULL);
    // one rank's three kernels, with the gradient: the row read three times, written once
    // (repeats work on earlier gradients, as above)
    float* d_maxes = (float*)device_malloc(N * sizeof(float));
    float* d_sums = (float*)device_malloc(2 * N * sizeof(float));
    copy_floats_to_device(d_logits, logits, (size_t)N * Vp);
    TIME_KERNEL(ms, 10, (classifier_shard_max(d_maxes, d_logits, N, Vp, V),
                         classifier_shard_sums(d_sums, d_logits, d_maxes, d_targets, N, Vp, V, 0),
                         classifier_shard_loss(d_logits, d_losses, d_maxes, d_sums, d_targets, dloss, N, Vp, V, 0)));
    report("shards tp=1 with grad", ms, 2.0 * bytes, 0);
    return finish(ok);
}
