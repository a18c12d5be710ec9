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

// The paths a GPU run takes where they can (GELU in the GEMMs' epilogues, the split classifier,
// the fused LayerNorm backward: the defaults; LLMC_FLASH=wgmma and LLMC_FLASH_BACKWARD=one_kernel
// when asked for; dev/cuda/README.md): where a path's kernel cannot take a shape it falls back to the other
// without a word, so the run ends by saying how often each path that is on was taken.
static inline void paths_print(void) {
    if (gelu_in_epilogue())
        printf("LLMC_GELU=epilogue: %ld GEMMs computed GELU in their epilogue, %ld fell back to the kernels\n",
               gelu_epilogue_gemms[0], gelu_epilogue_gemms[1]);
    if (classifier_split_asked())
        printf("LLMC_CLASSIFIER=split: %ld classifier calls took the split kernel, %ld fell back (rows too wide)\n",
               classifier_split_calls[0], classifier_split_calls[1]);
    if (layernorm_backward_fused_asked())
        printf("LLMC_LAYERNORM_BACKWARD=fused: %ld calls took the fused kernel, %ld fell back (rows too wide)\n",
               layernorm_fused_calls[0], layernorm_fused_calls[1]);
#if !FLOATX_IS_FLOAT
    if (flash_wgmma_asked())
        printf("LLMC_FLASH=wgmma: %ld flash calls (forward or backward) ran on wgmma, %ld fell back to mma.sync "
               "(not an sm_90a build, or a head size other than 64)\n", flash_wgmma_calls[0], flash_wgmma_calls[1]);
    if (flash_fa3_asked())
        printf("LLMC_FLASH=fa3: %ld flash calls (forward or backward) ran on FlashAttention-3's machinery, %ld fell back "
               "to mma.sync (not an sm_90a build, or a head size other than 64)\n", flash_fa3_calls[0], flash_fa3_calls[1]);
    if (flash_one_kernel_asked())
        printf("LLMC_FLASH_BACKWARD=one_kernel: %ld flash backward calls took the one kernel, %ld fell back "
               "(LLMC_FLASH=wgmma or fa3 took them)\n", flash_one_kernel_calls[0], flash_one_kernel_calls[1]);
#endif
}
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
static inline void paths_print(void) {}  // (the CPU backend has one path)
#endif

#endif
