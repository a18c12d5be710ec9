// Tensor-core building blocks of the flash attention kernels, one small wrapper per PTX
// instruction (sm_80 and later):
//   mma_bf16_16816     d (16 x 8, fp32) += a (16 x 16, bf16) b (16 x 8, bf16), one warp together
//   ldmatrix_x4        four 8 x 8 bf16 matrices from shared memory into the fragments mma expects
//   ldmatrix_x4_trans  the same, transposed on the way (for a B operand stored k-major)
//   cp_async16         a 16-byte copy global -> shared that does not wait for the data
//                      (cp.async, with commit/wait groups), so a tile loads while another computes
//   exp2_approx        2^x in one MUFU.EX2 (ex2.approx.ftz), for the softmax
// Unlike WMMA, whose fragments are opaque, these fragments have a layout the PTX ISA documents
// ("Matrix fragments for mma.m16n8k16"), so a score tile can stay in registers from the product
// q k^T through the softmax into the product p v. Lane l of a warp is in group g = l / 4 (a row)
// at place t = l % 4 (a pair of columns); a 32-bit register holds two bf16, the lower index low:
//   a[0..3]  A (row, col): (g, 2t..2t+1)  (g+8, 2t..2t+1)  (g, 2t+8..2t+9)  (g+8, 2t+8..2t+9)
//   b[0..1]  B (k, n):     (2t..2t+1, g)  (2t+8..2t+9, g)
//   d[0..3]  D (row, col): (g, 2t)  (g, 2t+1)  (g+8, 2t)  (g+8, 2t+1)
// ldmatrix_x4: lanes 8i..8i+7 give the addresses of the 8 rows (16 bytes each) of matrix i, and
// lane l receives r[i] = matrix i's elements (g, 2t..2t+1); transposed, (2t, g) and (2t+1, g).
// test/cuda_emu implements these same tables (cuda_emu_ptx.h), so a wrong lane mapping gives
// wrong numbers under the emulator, as it would on a GPU.
#ifndef LLMC_CUDA_MMA_CUH
#define LLMC_CUDA_MMA_CUH

#include <stdint.h>
#include "../precision.h"

#ifdef CUDA_EMU
#include <cuda_emu_ptx.h>
#else

// two floats as a bf16 pair, lo in the low half: one row of two columns of an A fragment
__device__ inline uint32_t pack_bf16x2(float lo, float hi) {
    __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&pair);
}

__device__ inline void mma_bf16_16816(float* d, const uint32_t* a, const uint32_t* b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// row: this lane's row address (see above); 16-byte aligned, in shared memory
__device__ inline void ldmatrix_x4(uint32_t* r, const floatX* row) {
    unsigned int address = (unsigned int)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(address));
}
__device__ inline void ldmatrix_x4_trans(uint32_t* r, const floatX* row) {
    unsigned int address = (unsigned int)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(address));
}

// 16 bytes global -> shared, without waiting; valid = 0 writes 16 zero bytes instead (src is
// then not read). .cg: cached in L2 only, as the data goes straight to shared memory.
__device__ inline void cp_async16(void* dst, const void* src, int valid) {
    unsigned int address = (unsigned int)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(address), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
// the copies issued since the last commit form one group
__device__ inline void cp_async_commit(void) { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// wait until at most `newest` groups (the most recently committed) are still in flight; the
// data is then visible to this thread, and to the block after a __syncthreads
template <int newest> __device__ inline void cp_async_wait(void) {
    asm volatile("cp.async.wait_group %0;\n" :: "n"(newest) : "memory");
}

// 2^x as the special-function unit computes it (relative error ~2^-22, far below bf16's 2^-8),
// with denormal inputs and results flushed to zero. exp2f would wrap the same MUFU.EX2 in a
// compare and two multiplies that rescue denormals: a softmax never needs them, and in the flash
// kernels they were a sixth of the instructions of a tile step (dev/cuda/flash_sass.sh counts).
// 2^-inf = +0, so masked scores of -inf give probability 0.
__device__ inline float exp2_approx(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

#endif  // CUDA_EMU
#endif
