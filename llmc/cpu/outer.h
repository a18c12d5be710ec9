// DiLoCo's outer step (train_gpt2_diloco.cu) on the CPU: the pseudo-gradient of a worker, the
// outer optimizer's Nesterov momentum step on the averaged one, and the workers starting again
// from the outer parameters. Element by element, fp32 throughout.
#ifndef LLMC_CPU_OUTER_H
#define LLMC_CPU_OUTER_H

#include <stddef.h>

// outer (n) = this worker's parameters, fp32 (master: the fp32 master weights when the
// parameters are kept in a lower precision, else NULL)
static inline void outer_from_params(float* outer, const float* params, const float* master, size_t n) {
    for (size_t i = 0; i < n; i++) outer[i] = master ? master[i] : params[i];
}

// delta (n) = outer - theta: how far this worker's parameters moved from the outer ones, with
// the sign of a gradient (the direction the outer optimizer steps against)
static inline void pseudo_gradient(float* delta, const float* outer, const float* params, const float* master, size_t n) {
    for (size_t i = 0; i < n; i++) delta[i] = outer[i] - (master ? master[i] : params[i]);
}

// Nesterov momentum SGD on the averaged pseudo-gradient delta, as torch.optim.SGD(nesterov=True)
// writes it: momentum = mu momentum + delta, outer -= lr (delta + mu momentum)
static inline void outer_nesterov_step(float* outer, float* momentum, const float* delta, size_t n, float lr, float mu) {
    for (size_t i = 0; i < n; i++) {
        momentum[i] = mu * momentum[i] + delta[i];
        outer[i] -= lr * (delta[i] + mu * momentum[i]);
    }
}

// every worker starts again from the outer parameters: params (and master) = outer
static inline void outer_to_params(float* params, float* master, const float* outer, size_t n) {
    for (size_t i = 0; i < n; i++) {
        params[i] = outer[i];
        if (master) master[i] = outer[i];
    }
}

#endif
