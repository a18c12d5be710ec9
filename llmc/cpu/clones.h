// A portable build that still vectorizes for the CPU it runs on: CPU_CLONES before a function has
// GCC compile it three times, for AVX-512 (x86-64-v4), AVX2 + FMA (x86-64-v3) and the x86-64
// baseline (SSE2), and the loader pick the widest this CPU runs (an ifunc: one indirect call per
// call of the function). The build itself needs no -march=native. Elsewhere (other compilers, other
// CPUs, C++ such as dev/cuda's CPU references) it is empty and the build's own flags decide.
// The GEMM's micro-kernel chooses its instruction set itself (matmul.h, LLMC_GEMM_ISA).
#ifndef LLMC_CPU_CLONES_H
#define LLMC_CPU_CLONES_H

#if defined(__GNUC__) && !defined(__clang__) && !defined(__cplusplus) && defined(__x86_64__)
#define CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define CPU_CLONES
#endif

#endif
