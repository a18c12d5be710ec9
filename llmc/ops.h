// The ops a trainer calls, from the backend the compiler picks: nvcc builds the CUDA kernels,
// a C compiler builds the CPU loops. Both halves have the same launcher signatures.
#ifndef LLMC_OPS_H
#define LLMC_OPS_H

#ifdef __CUDACC__
#error "the CUDA backend is not written yet: build with BACKEND=cpu"
#else
#include "cpu/device.h"
#include "cpu/encoder.h"
#include "cpu/layernorm.h"
#include "cpu/matmul.h"
#include "cpu/attention.h"
#include "cpu/gelu.h"
#include "cpu/classifier.h"
#include "cpu/adamw.h"
#endif

#endif
