// Softmax + cross-entropy fused with its gradient, on the CPU: the probabilities are never
// stored; each row of logits is overwritten with its gradient.
#ifndef LLMC_CPU_CLASSIFIER_H
#define LLMC_CPU_CLASSIFIER_H

#include <math.h>

// logits (N, Vp) with N = B*T rows; only the first V columns are real tokens.
// losses (N) = -log softmax(logits)[target]. When dloss != 0 each row becomes
// dloss * (softmax - onehot(target)) over the V real columns and 0 over the padding.
static inline void fused_classifier(float* logits, float* losses, const int* targets, float dloss,
                             int N, int V, int Vp) {
    #pragma omp parallel for
    for (int n = 0; n < N; n++) {
        float* row = logits + (size_t)n * Vp;
        int target = targets[n];
        float maxval = -INFINITY;
        for (int v = 0; v < V; v++) maxval = row[v] > maxval ? row[v] : maxval;
        float target_logit = row[target];
        float sum = 0.0f;
        if (dloss == 0.0f) {  // the loss only: leave the logits as they are
            for (int v = 0; v < V; v++) sum += expf(row[v] - maxval);
        } else {              // keep each exponential in place for the gradient pass
            for (int v = 0; v < V; v++) {
                row[v] = expf(row[v] - maxval);
                sum += row[v];
            }
        }
        losses[n] = logf(sum) - (target_logit - maxval);
        if (dloss == 0.0f) continue;
        float scale = dloss / sum;
        for (int v = 0; v < V; v++) row[v] *= scale;
        row[target] -= dloss;
        for (int v = V; v < Vp; v++) row[v] = 0.0f;
    }
}

#endif
