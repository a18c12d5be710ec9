// A run of one AdamW step: n elements at `offset` of a rank's buffers (parameters, master weights,
// gradients, moments) with one weight decay, their stochastic-rounding indices first_index,
// first_index + 1, ... (their places in the model file). llmc/optimizer.h cuts a step into runs,
// a tensor's piece each; the CUDA backend's adamw_update_runs takes all of them in one launch per
// ADAMW_RUNS_PER_LAUNCH, where a launch per run cost each small tensor a launch.
#ifndef LLMC_ADAMW_RUN_H
#define LLMC_ADAMW_RUN_H

#include <stddef.h>

typedef struct {
    size_t offset, n, first_index;
    float weight_decay;
} AdamWRun;

#endif
