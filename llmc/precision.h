// floatX: the type of parameters, gradients and activations. The CUDA backend trains in BF16 by
// default (FP32 master weights and AdamW state stay in float) or in FP32 with PRECISION=FP32;
// the CPU backend is always FP32.
#ifndef LLMC_PRECISION_H
#define LLMC_PRECISION_H

#if defined(__CUDACC__) && !defined(ENABLE_FP32)
#include <cuda_bf16.h>
typedef __nv_bfloat16 floatX;
#define PRECISION_NAME "bf16"
#define FLOATX_IS_FLOAT 0
#else
typedef float floatX;
#define PRECISION_NAME "fp32"
#define FLOATX_IS_FLOAT 1
#endif

#endif
