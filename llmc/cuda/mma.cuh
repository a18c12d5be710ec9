// Tensor-core building blocks of the flash attention kernels, one small wrapper per PTX
// instruction (sm_80 and later):
//   mma_bf16_16816     d (16 x 8, fp32) += a (16 x 16, bf16) b (16 x 8, bf16), one warp together
//   ldmatrix_x4        four 8 x 8 bf16 matrices from shared memory into the fragments mma expects
//   ldmatrix_x4_trans  the same, transposed on the way (for a B operand stored k-major)
//   cp_async16         a 16-byte copy global -> shared that does not wait for the data
//                      (cp.async, with commit/wait groups), so a tile loads while another computes
//   exp2_approx        2^x in one MUFU.EX2 (ex2.approx.ftz), for the softmax
//   ld_acquire_gpu, st_release_gpu   a flag one block sets after its writes and another waits on
// and, on Hopper (sm_90a, below), wgmma and the asynchronous machinery of warp-specialized kernels:
// mbarriers, TMA loads through a tensor map, named barriers and setmaxnreg.
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
#include <stdio.h>
#include <stdlib.h>
#include "../precision.h"
#if defined(LLMC_WGMMA) || defined(CUDA_EMU)
#include <cudaTypedefs.h>  // CUtensorMap and the pointer type of cuTensorMapEncodeTiled (cuda.h: the driver API)
#endif

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

// A flag between blocks (the one-kernel flash backward's turns, flash_attention.cuh): one block
// sets it with release semantics after its writes, another reads it with acquire semantics
// before reading them (PTX ISA, "Memory Consistency Model"; .gpu: every SM of the device)
__device__ inline int ld_acquire_gpu(const int* p) {
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ inline void st_release_gpu(int* p, int v) {
    asm volatile("st.release.gpu.global.b32 [%0], %1;\n" :: "l"(p), "r"(v) : "memory");
}

// ---- Hopper's warpgroup MMA (wgmma, sm_90a), for the flash kernels' LLMC_FLASH=wgmma path
// A warpgroup (4 consecutive warps, the first a multiple of 4) multiplies together:
//   wgmma_m64n64k16  d (64 x 64, fp32) += a (64 x 16, bf16, registers) b (16 x 64, bf16, shared)
// Warp w of the group holds rows 16 w .. 16 w + 15 of d and a, in mma_bf16_16816's layouts: its
// a[0..3] are an A fragment of its 16 rows, and d[4 j .. 4 j + 3] the D fragment of columns
// 8 j .. 8 j + 7. B never passes through registers: the tensor cores read it from shared memory
// through a descriptor (its address, and two strides). The product is asynchronous: it runs
// after the instruction returns, until a wgmma_wait covers its group, and until then neither d
// nor the shared tile may be touched. The sequence is
//   wgmma_fence(); several wgmma_m64n64k16; wgmma_commit(); ... wgmma_wait<0>(); read d.
// Shared tiles use the "interleaved" layout (no swizzle): 8 x 8 bf16 core matrices of 8 rows of
// 16 bytes, each 128 contiguous bytes (flash_core_offset in flash_attention.cuh). For a B tile
// (16 x 64) the descriptor gives, in bytes (PTX ISA, "Matrix Descriptor Format"):
//   K-major (trans_b = 0: b[k][n] with the k of one n adjacent, as the keys of k^T): sbo
//     between core matrices 8 apart in n, lbo between the two 8-wide halves of k;
//   MN-major (trans_b = 1: the n of one k adjacent, as v): sbo between core matrices 8 apart
//     in n, lbo between those 8 apart in k.
#if defined(LLMC_WGMMA)
typedef uint64_t WgmmaDesc;
// bits 0-13 the shared address / 16, 16-29 lbo / 16, 32-45 sbo / 16, 62-63 the swizzle (0: none)
__device__ __forceinline__ WgmmaDesc wgmma_desc(const void* tile, uint32_t lbo, uint32_t sbo) {
    uint32_t address = (uint32_t)__cvta_generic_to_shared(tile);
    return (uint64_t)((address >> 4) & 0x3fff) | (uint64_t)((lbo >> 4) & 0x3fff) << 16 |
           (uint64_t)((sbo >> 4) & 0x3fff) << 32;
}
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define LLMC_WGMMA_ASM(x) asm volatile(x ::: "memory")
template <int trans_b>
__device__ __forceinline__ void wgmma_m64n64k16(float* d, const uint32_t* a, WgmmaDesc b, int accumulate) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %38, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
                 "{%32, %33, %34, %35}, %36, p, 1, 1, %37;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(trans_b), "r"(accumulate));
}
// the same with A from shared memory too, K-major in the same layout (rows m: sbo between core
// matrices 8 apart in m, lbo between the two 8-wide halves of k): the tensor cores read both
// operands, the registers hold only d (FlashAttention-3's q k^T)
template <int trans_b>
__device__ __forceinline__ void wgmma_m64n64k16_ss(float* d, WgmmaDesc a, WgmmaDesc b, int accumulate) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
                 "%32, %33, p, 1, 1, 0, %35;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "l"(a), "l"(b), "r"(accumulate), "n"(trans_b));
}
#else  // a device pass for a GPU without wgmma: the host never launches these kernels there
#define LLMC_WGMMA_ASM(x) __trap()
template <int trans_b>
__device__ __forceinline__ void wgmma_m64n64k16(float* d, const uint32_t* a, WgmmaDesc b, int accumulate) { __trap(); }
template <int trans_b>
__device__ __forceinline__ void wgmma_m64n64k16_ss(float* d, WgmmaDesc a, WgmmaDesc b, int accumulate) { __trap(); }
#endif
// (forced inline: a wrapper left a call, as at -O0, makes ptxas serialize the products)
// the registers about to be read or written by wgmma are ready (before a group's first product)
__device__ __forceinline__ void wgmma_fence(void) { LLMC_WGMMA_ASM("wgmma.fence.sync.aligned;\n"); }
// the products issued since the last commit form one group
__device__ __forceinline__ void wgmma_commit(void) { LLMC_WGMMA_ASM("wgmma.commit_group.sync.aligned;\n"); }
// wait until at most `newest` groups are still running: the others' d are written
template <int newest> __device__ __forceinline__ void wgmma_wait(void) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(newest) : "memory");
#else
    __trap();
#endif
}
// after a wait: the compiler sees wgmma write d at the issue, so without this it could read d
// (or reuse its registers) before the wait; an empty asm that "rewrites" each one pins them here.
// Before the fence of products that accumulate into d, the same pins keep the compiler's own
// writes of d (a rescale) ahead of the fence.
__device__ __forceinline__ void wgmma_pin(float* d, int n) {
    for (int i = 0; i < n; i++) asm volatile("" : "+f"(d[i]) :: "memory");
}
// shared memory written by this thread's ordinary stores or cp.async copies is visible to the
// tensor cores' reads (the "async proxy") after this fence and a barrier
__device__ __forceinline__ void fence_proxy_async(void) { LLMC_WGMMA_ASM("fence.proxy.async.shared::cta;\n"); }

// ---- Hopper's asynchronous machinery (sm_90a), for warp-specialized kernels (dev/cuda/tma.cu):
// a producer warp copies tiles into a ring of shared-memory slots while consumer warps compute.
//   mbarrier (8 bytes of shared memory): counts arrivals and bytes. mbarrier_init(bar, n): a phase
//     completes when n threads have arrived (mbarrier_arrive) and every byte announced by
//     mbarrier_arrive_expect_tx (an arrival that also announces bytes) has landed; then the next
//     phase begins. A thread waits for the phase of parity p (0, 1, 0, ...: phase k has parity
//     k % 2) with mbarrier_wait(bar, p); on a fresh barrier the phase of parity 1 counts as
//     complete, so a producer's first wait on an "empty" slot passes at once.
//   tma_load_2d(dst, map, col, row, bar): the TMA unit copies the box (map's box rows x columns)
//     whose first element is (row, col) into shared memory at dst (128-byte aligned), row after
//     row, zeros outside the tensor, and counts its bytes against bar's current phase: the data
//     may be read once that phase has completed, not before. One thread issues it.
//   tma_store_2d(map, col, row, src): the other way, a box of shared memory (128-byte aligned,
//     written by the threads and made visible with fence_proxy_async and a barrier first) into
//     the tensor, the parts outside it not written. tma_store_commit() closes a group of them;
//     tma_store_wait<n>() returns when all but the newest n groups have read their source, which
//     may then be overwritten.
//   named_barrier_sync(id, n) / named_barrier_arrive(id, n): barrier id (1-15; 0 is
//     __syncthreads') opens when n threads (a multiple of 32) have come; arrive does not wait.
//     Two consumer warpgroups meet there without stopping the producer.
//   setmaxnreg_dec<r>() / setmaxnreg_inc<r>(): a warpgroup gives registers back (a producer needs
//     few) or takes them (consumers), r a multiple of 8 in 24..256, every warp of the group.
// The tensor map is made on the host (tma_map_2d, below) and passed to the kernel by value as a
// `const __grid_constant__ CUtensorMap` parameter, whose address the copies take.
__device__ __forceinline__ uint32_t shared_address(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(shared_address(bar)), "r"(count) : "memory");
}
// the inits visible to the TMA unit's arrivals (before the __syncthreads that publishes them)
__device__ __forceinline__ void mbarrier_init_fence(void) { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(shared_address(bar)) : "memory");
}
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" :: "r"(shared_address(bar)), "r"(bytes) : "memory");
}
// 1 once the phase of this parity has completed (the hardware may give up waiting and answer 0)
__device__ __forceinline__ int mbarrier_try_wait_parity(uint64_t* bar, uint32_t parity) {
    uint32_t done;
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done) : "r"(shared_address(bar)), "r"(parity) : "memory");
    return (int)done;
}
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, int col, int row, uint64_t* bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
                 :: "r"(shared_address(dst)), "l"(map), "r"(col), "r"(row), "r"(shared_address(bar)) : "memory");
}
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, int col, int row, const void* src) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n"
                 :: "l"(map), "r"(shared_address(src)), "r"(col), "r"(row) : "memory");
}
__device__ __forceinline__ void tma_store_commit(void) { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
template <int newest> __device__ __forceinline__ void tma_store_wait(void) {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" :: "n"(newest) : "memory");
}
__device__ __forceinline__ void named_barrier_sync(int id, int count) { asm volatile("bar.sync %0, %1;\n" :: "r"(id), "r"(count) : "memory"); }
__device__ __forceinline__ void named_barrier_arrive(int id, int count) { asm volatile("bar.arrive %0, %1;\n" :: "r"(id), "r"(count) : "memory"); }
template <int regs> __device__ __forceinline__ void setmaxnreg_inc(void) {
    static_assert(regs % 8 == 0 && regs >= 24 && regs <= 256, "setmaxnreg: a multiple of 8 in 24..256");
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" :: "n"(regs));
}
template <int regs> __device__ __forceinline__ void setmaxnreg_dec(void) {
    static_assert(regs % 8 == 0 && regs >= 24 && regs <= 256, "setmaxnreg: a multiple of 8 in 24..256");
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" :: "n"(regs));
}
#else  // a device pass for a GPU without them: the host never launches these kernels there
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, int count) { __trap(); }
__device__ __forceinline__ void mbarrier_init_fence(void) { __trap(); }
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) { __trap(); }
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) { __trap(); }
__device__ __forceinline__ int mbarrier_try_wait_parity(uint64_t* bar, uint32_t parity) { __trap(); return 1; }
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, int col, int row, uint64_t* bar) { __trap(); }
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, int col, int row, const void* src) { __trap(); }
__device__ __forceinline__ void tma_store_commit(void) { __trap(); }
template <int newest> __device__ __forceinline__ void tma_store_wait(void) { __trap(); }
__device__ __forceinline__ void named_barrier_sync(int id, int count) { __trap(); }
__device__ __forceinline__ void named_barrier_arrive(int id, int count) { __trap(); }
template <int regs> __device__ __forceinline__ void setmaxnreg_inc(void) { __trap(); }
template <int regs> __device__ __forceinline__ void setmaxnreg_dec(void) { __trap(); }
#endif
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
    while (!mbarrier_try_wait_parity(bar, parity)) {}
}
#endif  // LLMC_WGMMA

#endif  // CUDA_EMU

#if defined(LLMC_WGMMA)
// A TMA tensor map of a (rows, cols) row-major floatX matrix whose rows are ld elements apart,
// copied in boxes of (box_rows, box_cols), no swizzle. The driver's encoder is reached through the
// runtime (no -lcuda); the emulator's (test/cuda_emu/include/cuda.h) checks the same rules: the
// base 16-byte aligned, ld * sizeof(floatX) a multiple of 16, box sides at most 256 and a box row
// a multiple of 16 bytes.
static inline void tma_map_2d(CUtensorMap* map, const floatX* base, int rows, int cols, int ld, int box_rows, int box_cols) {
    static PFN_cuTensorMapEncodeTiled_v12000 encode = NULL;
    if (encode == NULL) {
        cudaDriverEntryPointQueryResult found;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void**)&encode, 12000, cudaEnableDefault, &found) !=
                cudaSuccess || found != cudaDriverEntryPointSuccess) {
            fprintf(stderr, "tma_map_2d: the driver has no cuTensorMapEncodeTiled (CUDA 12 or later is needed)\n");
            exit(1);
        }
    }
    cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)ld * sizeof(floatX)};
    cuuint32_t box[2] = {(cuuint32_t)box_cols, (cuuint32_t)box_rows}, element_strides[2] = {1, 1};
    CUresult r = encode(map, FLOATX_IS_FLOAT ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2,
                        (void*)base, dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                        CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "tma_map_2d: cuTensorMapEncodeTiled refused a (%d, %d) matrix (ld %d) in boxes of (%d, %d): error %d\n",
                rows, cols, ld, box_rows, box_cols, (int)r);
        exit(1);
    }
}
#endif
#endif
