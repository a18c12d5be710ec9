/*
Fused classifier: softmax + cross-entropy + its gradient written over the logits, checked
against the CPU backend.
  make dev/cuda/classifier && ./dev/cuda/classifier
v1: one thread per row: three serial passes over 50257 logits (max, sum, gradient).
v2: one block per row with an online softmax: the max and the sum in a single pass, block-wide
    reductions, then the gradient pass; 2-byte loads in bf16.
v3: v2 with 16-byte loads and stores, one online-softmax merge per pack of 8 logits
    (llmc/cuda/classifier.cuh).
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

int main(void) {
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

    fused_classifier(d_logits, d_losses, d_targets, dloss, N, V, Vp);
    ok &= validate_f32("v3 losses", d_losses, losses, N, 1e-4f);
    copy_device_to_floats(got, d_logits, (size_t)N * Vp);
    for (size_t i = 0; i < (size_t)N * Vp; i++) got[i] *= (float)N;
    ok &= compare_arrays("v3 gradient x N", got, grads, (size_t)N * Vp, tol);
    copy_floats_to_device(d_logits, logits, (size_t)N * Vp);
    TIME_KERNEL(ms, 10, fused_classifier(d_logits, d_losses, d_targets, 0.0f, N, V, Vp));
    report("v3 losses only", ms, bytes / 2, 0);
    // with the gradient: the row read twice, written once (repeats work on earlier gradients)
    TIME_KERNEL(ms, 10, fused_classifier(d_logits, d_losses, d_targets, dloss, N, V, Vp));
    report("v3 with gradient", ms, 1.5 * bytes, 0);
    return finish(ok);
}
