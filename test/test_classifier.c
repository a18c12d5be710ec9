// Unit test of the CPU cross-entropy (llmc/cpu/classifier.h): at one rank the vocabulary-parallel
// passes (row max, sums, loss and gradient: what train_gpt2_tp.cu and the 3D trainer run) must be
// fused_classifier operation for operation, so the same bits in every loss and gradient, with and
// without the gradient. Logits spread over +-10 so the exponentials span their range (a pass built
// for another instruction set, FMA or not, rounds some of them differently).
//   test_classifier
#include "llmc/utils.h"
#include "llmc/rng.h"
#include "llmc/cpu/classifier.h"

enum { N = 64, V = 1000, VP = 1024 };

// the number of floats of a and b (n) whose bits differ
static int differing(const float* a, const float* b, size_t n) {
    int count = 0;
    for (size_t i = 0; i < n; i++) count += memcmp(&a[i], &b[i], sizeof(float)) != 0;
    return count;
}

int main(void) {
    Rng rng;
    rng_init(&rng, 7);
    size_t n = (size_t)N * VP;
    float* logits = (float*)malloc_check(n * sizeof(float));
    for (size_t i = 0; i < n; i++) logits[i] = 20.0f * rng_uniform(&rng) - 10.0f;
    int targets[N];
    for (int i = 0; i < N; i++) targets[i] = (int)(rng_u64(&rng) % V);
    float* fused = (float*)malloc_check(n * sizeof(float));
    float* split = (float*)malloc_check(n * sizeof(float));
    float fused_losses[N], split_losses[N], maxes[N], sums[2 * N];
    int bad = 0;
    for (int with_gradient = 0; with_gradient <= 1; with_gradient++) {
        float dloss = with_gradient ? 1.0f / N : 0.0f;
        memcpy(fused, logits, n * sizeof(float));
        memcpy(split, logits, n * sizeof(float));
        fused_classifier(fused, fused_losses, targets, dloss, N, V, VP);
        // one rank holds every column: lo = 0, Vl = Vp, real = V
        classifier_shard_max(maxes, split, N, VP, V);
        classifier_shard_sums(sums, split, maxes, targets, N, VP, V, 0);
        classifier_shard_loss(split, split_losses, maxes, sums, targets, dloss, N, VP, V, 0);
        int losses = differing(fused_losses, split_losses, N), values = differing(fused, split, n);
        printf("dloss %g: %d of %d losses and %d of %zu logits or gradients differ\n", dloss, losses, N, values, n);
        bad += losses + values;
    }
    if (bad == 0) printf("classifier ok\n");
    free(logits), free(fused), free(split);
    return bad != 0;
}
