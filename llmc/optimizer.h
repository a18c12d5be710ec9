// The optimizer step of every trainer: gradient clipping by the global norm (its square is
// ops.h's global_norm_squared over the gradients a rank owns; a sharded trainer sums the ranks'
// shares with one all-reduce before the square root), then AdamW with weight decay on the 2-D
// weights only. It works on a range [lo, hi) of a rank's flat parameter buffer (model.h's
// ParameterLayout: the model file's tensor order, with tensor parallelism the rank's slices), so
// one function serves a full DDP replica (the whole range), a tensor-parallel rank (its whole
// buffer), a ZeRO shard and a pipeline stage (their parts): each passes the part it owns.
#ifndef LLMC_OPTIMIZER_H
#define LLMC_OPTIMIZER_H

#include "model.h"
#include "adamw_run.h"

typedef struct {
    float lr;            // this step's learning rate (schedule.h)
    float beta1, beta2, eps;
    float weight_decay;  // applied to the tensors parameter_is_matrix marks
    unsigned int seed;   // stochastic rounding: the same on every rank, so replicas stay equal
} AdamWConfig;

// the factor that clips the gradient to the global norm grad_clip, as
// torch.nn.utils.clip_grad_norm_: grad_clip / (norm + 1e-6), at most 1
static inline float optimizer_clip_scale(float grad_norm, float grad_clip) {
    if (grad_clip <= 0.0f) return 1.0f;
    float coef = grad_clip / (grad_norm + 1e-6f);
    return coef < 1.0f ? coef : 1.0f;
}

// One AdamW step (step counts from 1) over the parameters [lo, hi) of a rank's layout.
// params, master, grads, m, v point at element lo of their buffers, or at its place in a shard
// (master is NULL when the parameters are fp32); padding between buckets is skipped. Each tensor that overlaps the range gets its own weight decay; the
// stochastic-rounding stream is indexed by the layout's rounding index (model.h), so a ZeRO
// shard rounds each element exactly as a full replica would, and replicated tensors round alike
// on every tensor-parallel rank.
#ifndef __CUDACC__
// -offload on the CPU backend: the host's step is the device's own (its "device" is the host)
#define adamw_update_host adamw_update
#endif

// A step over [lo, hi) as runs (llmc/adamw_run.h): each tensor's pieces that overlap the range, one
// per layer for the layers' tensors (apart in a layout in buckets, adjacent otherwise), offsets
// counted from lo. Returns the runs, count in *count; the caller frees them.
static inline AdamWRun* optimizer_adamw_runs(size_t lo, size_t hi, const ParameterLayout* layout, float weight_decay,
                                             int* count) {
    if (hi > layout->count || lo > hi) fail("optimizer: range [%zu, %zu) outside the model", lo, hi);
    AdamWRun* runs = (AdamWRun*)malloc_check((size_t)NUM_PARAMETER_TENSORS * (layout->layers + 1) * sizeof(AdamWRun));
    *count = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        if (layout->sizes[i] == 0) continue;
        size_t pieces = tensor_is_per_layer(i) ? (size_t)layout->layers : 1, piece = layout->sizes[i] / pieces;
        float wd = parameter_is_matrix[i] ? weight_decay : 0.0f;
        for (size_t j = 0; j < pieces; j++) {
            size_t start = layout->offsets[i] + j * layout->layer_stride[i], end = start + piece;
            size_t a = start > lo ? start : lo, b = end < hi ? end : hi;  // this piece within [lo, hi)
            if (a >= b) continue;
            runs[(*count)++] = (AdamWRun){a - lo, b - a, layout->rounding[i] + j * piece + (a - start), wd};
        }
    }
    return runs;
}

// update: a per-run step, here adamw_update_host (-offload: the buffers are in host memory)
typedef void (*AdamWUpdate)(floatX* params, float* master, const floatX* grads, float* m, float* v, size_t n, float lr,
                            float beta1, float beta2, float eps, float weight_decay, int t, float grad_scale,
                            unsigned int seed, size_t first_index);
static inline void optimizer_adamw_step_with(AdamWUpdate update, floatX* params, float* master, const floatX* grads,
                                             float* m, float* v, size_t lo, size_t hi, const ParameterLayout* layout,
                                             AdamWConfig opt, float grad_scale, int step) {
    int count;
    AdamWRun* runs = optimizer_adamw_runs(lo, hi, layout, opt.weight_decay, &count);
    for (int r = 0; r < count; r++) {
        size_t k = runs[r].offset;
        update(params + k, master ? master + k : NULL, grads + k, m + k, v + k, runs[r].n, opt.lr, opt.beta1, opt.beta2,
               opt.eps, runs[r].weight_decay, step, grad_scale, opt.seed, runs[r].first_index);
    }
    free(runs);
}

// the step on the backend's device: on CUDA every run in one launch (per ADAMW_RUNS_PER_LAUNCH),
// on the CPU one run after another
static inline void optimizer_adamw_step(floatX* params, float* master, const floatX* grads, float* m, float* v,
                                        size_t lo, size_t hi, const ParameterLayout* layout, AdamWConfig opt,
                                        float grad_scale, int step) {
#ifdef __CUDACC__
    int count;
    AdamWRun* runs = optimizer_adamw_runs(lo, hi, layout, opt.weight_decay, &count);
    adamw_update_runs(params, master, grads, m, v, runs, count, opt.lr, opt.beta1, opt.beta2, opt.eps, step, grad_scale,
                      opt.seed);
    free(runs);
#else
    int kernel_span = kernel_time_begin("adamw", 0, 0);  // (one kind of launch a step, as on CUDA)
    optimizer_adamw_step_with(adamw_update, params, master, grads, m, v, lo, hi, layout, opt, grad_scale, step);
    kernel_time_end(kernel_span);
#endif
}

#endif
