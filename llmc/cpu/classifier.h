// Softmax + cross-entropy fused with its gradient, on the CPU: the probabilities are never
// stored; each row of logits is overwritten with its gradient.
#ifndef LLMC_CPU_CLASSIFIER_H
#define LLMC_CPU_CLASSIFIER_H

#include "device.h"  // (kernel_times.h: the launchers time themselves with LLMC_KERNEL_TIMES=1)

#include <math.h>
#include "clones.h"
#include "vector_math.h"

// logits (N, Vp) with N = B*T rows; only the first V columns are real tokens.
// losses (N) = -log softmax(logits)[target]. When dloss != 0 each row becomes
// dloss * (softmax - onehot(target)) over the V real columns and 0 over the padding.
CPU_CLONES static inline void fused_classifier(float* logits, float* losses, const int* targets, float dloss,
                             int N, int V, int Vp) {
    int kernel_span = kernel_time_begin("classifier (softmax, loss, dlogits)", 0, 0);
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        float* row = logits + (size_t)n * Vp;
        int target = targets[n];
        float maxval = max_in_lanes(row, V);
        float target_logit = row[target];
        // the loss only: leave the logits as they are; else keep each exponential in place for
        // the gradient pass
        float sum = dloss == 0.0f ? sum_exp_in_lanes(row, maxval, V) : exp_in_place_sum_in_lanes(row, maxval, V);
        losses[n] = logf(sum) - (target_logit - maxval);
        if (dloss == 0.0f) continue;
        float scale = dloss / sum;
        for (int v = 0; v < V; v++) row[v] *= scale;
        row[target] -= dloss;
        for (int v = V; v < Vp; v++) row[v] = 0.0f;
    }
    kernel_time_end(kernel_span);
}

// ---------------------------------------------------------------------------------------------
// The same loss with the vocabulary split over ranks (Megatron-LM's vocab-parallel
// cross-entropy): a rank holds the columns [lo, lo + Vl) of every row of logits (N, Vl) and never
// sees the others. Of its columns the first `real` are tokens (global index below V), the rest
// padding. Three passes, with a reduction over the ranks between them:
//   1. classifier_shard_max    this rank's row maxima         -> all-reduce MAX over the ranks
//   2. classifier_shard_sums   sum of exp(logit - max) and the target's logit (0 on every rank
//                              but the one holding it)       -> all-reduce SUM over the ranks
//   3. classifier_shard_loss   losses, and the logits' gradient with dloss != 0
// With one rank (lo = 0, Vl = Vp, real = V) the result is fused_classifier's, operation for
// operation.

// maxes (N) = the maximum of each row's real columns (-inf when the rank holds none)
CPU_CLONES static inline void classifier_shard_max(float* maxes, const float* logits, int N, int Vl, int real) {
    int kernel_span = kernel_time_begin("vocab-parallel classifier: row maxima", 0, 0);
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* row = logits + (size_t)n * Vl;
        maxes[n] = max_in_lanes(row, real);
    }
    kernel_time_end(kernel_span);
}

// sums (N, 2): [sum over real columns of exp(logit - maxes[n]), the target's logit - maxes[n]
// if the target is among this rank's columns, else 0]
CPU_CLONES static inline void classifier_shard_sums(float* sums, const float* logits, const float* maxes,
                                         const int* targets, int N, int Vl, int real, int lo) {
    int kernel_span = kernel_time_begin("vocab-parallel classifier: row sums", 0, 0);
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        const float* row = logits + (size_t)n * Vl;
        float sum = sum_exp_in_lanes(row, maxes[n], real);
        int local = targets[n] - lo;
        sums[2 * n] = sum;
        sums[2 * n + 1] = local >= 0 && local < real ? row[local] - maxes[n] : 0.0f;
    }
    kernel_time_end(kernel_span);
}

// losses (N) = log(sum) - (target logit - max), from the sums over all ranks. With dloss != 0
// each row becomes dloss * (softmax - onehot(target)) over the real columns, 0 over padding.
CPU_CLONES static inline void classifier_shard_loss(float* logits, float* losses, const float* maxes, const float* sums,
                                         const int* targets, float dloss, int N, int Vl, int real, int lo) {
    int kernel_span = kernel_time_begin("vocab-parallel classifier: loss, dlogits", 0, 0);
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        losses[n] = logf(sums[2 * n]) - sums[2 * n + 1];
        if (dloss == 0.0f) continue;
        float* row = logits + (size_t)n * Vl;
        float scale = dloss / sums[2 * n];
        for (int v = 0; v < real; v++) row[v] = exp_vectorizable(row[v] - maxes[n]) * scale;
        int local = targets[n] - lo;
        if (local >= 0 && local < real) row[local] -= dloss;
        for (int v = real; v < Vl; v++) row[v] = 0.0f;
    }
    kernel_time_end(kernel_span);
}

#endif
