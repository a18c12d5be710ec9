// The ops a trainer calls, from the backend the compiler picks: nvcc builds the CUDA kernels,
// a C compiler builds the CPU loops. Both halves have the same launcher signatures.
#ifndef LLMC_OPS_H
#define LLMC_OPS_H

#ifdef __CUDACC__
#include "cuda/device.cuh"
#include "cuda/encoder.cuh"
#include "cuda/layernorm.cuh"
#include "cuda/matmul.cuh"
#include "cuda/attention.cuh"
#include "cuda/ring_attention.cuh"
#include "cuda/gelu.cuh"
#include "cuda/classifier.cuh"
#include "cuda/adamw.cuh"
#include "cuda/outer.cuh"
#include "cuda/moe.cuh"
#else
#include "cpu/device.h"
#include "cpu/encoder.h"
#include "cpu/layernorm.h"
#include "cpu/matmul.h"
#include "cpu/attention.h"
#include "cpu/ring_attention.h"
#include "cpu/gelu.h"
#include "cpu/classifier.h"
#include "cpu/adamw.h"
#include "cpu/outer.h"
#include "cpu/moe.h"
#endif

#endif
