// cuda_emu: the PTX wrappers of llmc/cuda/mma.cuh (mma.sync m16n8k16 bf16, ldmatrix .x4 plain
// and transposed, cp.async with commit/wait groups), after the PTX ISA's fragment tables that
// mma.cuh lists. Each lane puts its registers (or its row address) in the warp's exchange,
// waits at a warp barrier, then takes what the table gives it from every lane's entries, so a
// kernel that places a value in the wrong lane or register computes a wrong result here, as on a
// GPU. cp.async copies are held back until a cp_async_wait releases their group: a tile read
// before its wait (or before the __syncthreads after it) holds the previous tile's data.
#ifndef CUDA_EMU_PTX_H
#define CUDA_EMU_PTX_H

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace cuda_emu {

static inline int thread_index(void) { return linear_thread(state.current->thread_idx); }

static inline float bf16_half(uint32_t word, int high) {
    __nv_bfloat16 h;
    h.bits = (uint16_t)(high ? word >> 16 : word & 0xffffu);
    return (float)h;
}

// the 8 x 8 matrices of ldmatrix: rows given by lanes 8i..8i+7 of the warp, 16 bytes each
static inline void ldmatrix(uint32_t* r, const void* row, int transposed) {
    if ((uintptr_t)row % 16 != 0) die("ldmatrix: a row address is not 16-byte aligned");
    int me = thread_index(), warp = me - me % 32, g = me % 32 / 4, t = me % 4;
    memcpy(state.words[me], &row, sizeof(row));
    barrier(AT_WARP_BARRIER);  // every lane has given its row
    for (int i = 0; i < 4; i++) {
        const uint16_t* rows[8];
        for (int j = 0; j < 8; j++) memcpy(&rows[j], state.words[warp + 8 * i + j], sizeof(rows[j]));
        uint16_t lo = transposed ? rows[2 * t][g] : rows[g][2 * t];
        uint16_t hi = transposed ? rows[2 * t + 1][g] : rows[g][2 * t + 1];
        r[i] = (uint32_t)lo | (uint32_t)hi << 16;
    }
    barrier(AT_WARP_BARRIER);  // every lane has read before the next exchange
}

// the warp's A (16 x 16) from every lane's words 0-3, after mma.cuh's A table:
// (g, 2t..2t+1) (g+8, 2t..2t+1) (g, 2t+8..2t+9) (g+8, 2t+8..2t+9); mma.sync and wgmma share it
static inline void gather_a(float (*A)[16], int warp) {
    for (int lane = 0; lane < 32; lane++) {
        const uint32_t* w = state.words[warp + lane];
        int g = lane / 4, t = lane % 4;
        for (int half = 0; half < 2; half++) {
            A[g][2 * t + half] = bf16_half(w[0], half);
            A[g + 8][2 * t + half] = bf16_half(w[1], half);
            A[g][2 * t + 8 + half] = bf16_half(w[2], half);
            A[g + 8][2 * t + 8 + half] = bf16_half(w[3], half);
        }
    }
}

}  // namespace cuda_emu

static inline uint32_t pack_bf16x2(float lo, float hi) {
    return (uint32_t)__nv_bfloat16(lo).bits | (uint32_t)__nv_bfloat16(hi).bits << 16;
}

// d (16 x 8) += a (16 x 16) b (16 x 8): the warp's A and B rebuilt from every lane's registers,
// then this lane's four elements of D, each summed over k in fp32
static inline void mma_bf16_16816(float* d, const uint32_t* a, const uint32_t* b) {
    using namespace cuda_emu;
    int me = thread_index(), warp = me - me % 32;
    memcpy(state.words[me], a, 4 * sizeof(uint32_t));
    memcpy(state.words[me] + 4, b, 2 * sizeof(uint32_t));
    barrier(AT_WARP_BARRIER);  // every lane has given its fragments
    float A[16][16], B[16][8];
    gather_a(A, warp);
    for (int lane = 0; lane < 32; lane++) {  // B (2t..2t+1, g) (2t+8..2t+9, g)
        const uint32_t* w = state.words[warp + lane];
        int g = lane / 4, t = lane % 4;
        for (int half = 0; half < 2; half++) {
            B[2 * t + half][g] = bf16_half(w[4], half);
            B[2 * t + 8 + half][g] = bf16_half(w[5], half);
        }
    }
    barrier(AT_WARP_BARRIER);  // every lane has read before the next exchange
    int g = me % 32 / 4, t = me % 4;
    for (int e = 0; e < 4; e++) {
        int row = g + (e / 2) * 8, col = 2 * t + e % 2;
        float acc = d[e];
        for (int k = 0; k < 16; k++) acc += A[row][k] * B[k][col];
        d[e] = acc;
    }
}

// ex2.approx.ftz: exact here (the GPU's is within ~2^-22 relative)
static inline float exp2_approx(float x) { return exp2f(x); }
static inline void ldmatrix_x4(uint32_t* r, const __nv_bfloat16* row) { cuda_emu::ldmatrix(r, row, 0); }
static inline void ldmatrix_x4_trans(uint32_t* r, const __nv_bfloat16* row) { cuda_emu::ldmatrix(r, row, 1); }

// A copy may land at any moment between its issue and the wait that covers it. The emulator
// takes the two extremes, one per order: threads first to last (forward), the copy lands at the
// wait, so a tile read before its wait reads stale data; last to first (reverse), it lands at
// once, so a copy into a buffer that another warp is still reading (a missing barrier before
// the refill) overwrites what that warp reads next.
static inline void cp_async16(void* dst, const void* src, int valid) {
    using namespace cuda_emu;
    int me = thread_index();
    if ((uintptr_t)dst % 16 != 0 || (valid && (uintptr_t)src % 16 != 0))
        die("cp.async: an address is not 16-byte aligned");
    if (state.reverse) {
        if (valid) memcpy(dst, src, 16);
        else memset(dst, 0, 16);
        return;
    }
    if (state.async_count[me] == max_async_copies) die("cp.async: too many copies in flight");
    state.async_copies[me][state.async_count[me]++] = {dst, valid ? src : NULL, state.async_group[me]};
}
static inline void cp_async_commit(void) { cuda_emu::state.async_group[cuda_emu::thread_index()]++; }
// the copies of every committed group but the newest `newest` land now, in issue order
template <int newest> static inline void cp_async_wait(void) {
    using namespace cuda_emu;
    int me = thread_index(), kept = 0;
    for (int i = 0; i < state.async_count[me]; i++) {
        AsyncCopy c = state.async_copies[me][i];
        if (c.group < state.async_group[me] - newest) {
            if (c.src) memcpy(c.dst, c.src, 16);
            else memset(c.dst, 0, 16);
        } else {
            state.async_copies[me][kept++] = c;
        }
    }
    state.async_count[me] = kept;
}

// wgmma (Hopper's warpgroup MMA; mma.cuh says what the kernels see). The emulator takes the
// latest moment the GPU may run a product: at the wgmma_wait that covers its group. So a kernel
// that reads d before that wait reads the old accumulators, and one that refills the B tile in
// shared memory before it has the product read the new data: either gives a wrong result. A at
// issue: each lane gives its registers and takes its rows from its warp's, as mma_bf16_16816.
#define LLMC_WGMMA 1
struct WgmmaDesc {
    const unsigned char* tile;
    uint32_t lbo, sbo;
};
static inline WgmmaDesc wgmma_desc(const void* tile, uint32_t lbo, uint32_t sbo) {
    // the descriptor holds address, lbo and sbo in units of 16 bytes, 14 bits each
    if ((uintptr_t)tile % 16 != 0 || lbo % 16 != 0 || sbo % 16 != 0 || lbo >= (1u << 18) || sbo >= (1u << 18))
        cuda_emu::die("wgmma: a descriptor's address or stride is not a multiple of 16 bytes below 256 KB");
    return {(const unsigned char*)tile, lbo, sbo};
}

namespace cuda_emu {
// element (k, n) of a 16 x 64 B tile in the interleaved layout (8 x 8 core matrices of 128
// contiguous bytes, 16 bytes a row): K-major rows are n, MN-major rows are k
static inline float wgmma_b(const WgmmaOp& op, int k, int n) {
    size_t at = op.trans_b ? (size_t)(k % 8) * 16 + (k / 8) * op.lbo + (n / 8) * op.sbo + (n % 8) * 2
                           : (size_t)(n % 8) * 16 + (n / 8) * op.sbo + (k / 8) * op.lbo + (k % 8) * 2;
    __nv_bfloat16 h;
    memcpy(&h.bits, op.tile + at, 2);
    return (float)h;
}
static inline void wgmma_run(const WgmmaOp& op, int lane) {
    int g = lane / 4, t = lane % 4;
    for (int e = 0; e < 32; e++) {  // d[4 j + e]: row g + 8 (e / 2 % 2), column 8 j + 2 t + e % 2
        int half = e / 2 % 2, col = 8 * (e / 4) + 2 * t + e % 2;
        float acc = op.accumulate ? op.d[e] : 0.0f;
        for (int k = 0; k < 16; k++) acc += op.a[half][k] * wgmma_b(op, k, col);
        op.d[e] = acc;
    }
}
}  // namespace cuda_emu

template <int trans_b>
static inline void wgmma_m64n64k16(float* d, const uint32_t* a, WgmmaDesc b, int accumulate) {
    using namespace cuda_emu;
    int me = thread_index(), warp = me - me % 32, g = me % 32 / 4;
    if (state.threads % 128 != 0) die("wgmma: the block is not whole warpgroups of 128 threads");
    if (state.wgmma_count[me] == max_wgmma_ops) die("wgmma: too many products in flight");
    memcpy(state.words[me], a, 4 * sizeof(uint32_t));
    barrier(AT_WARP_BARRIER);  // every lane has given its A registers
    WgmmaOp& op = state.wgmma_ops[me][state.wgmma_count[me]++];
    float A[16][16];
    gather_a(A, warp);
    barrier(AT_WARP_BARRIER);  // every lane has read before the next exchange
    memcpy(op.a[0], A[g], sizeof(op.a[0]));  // this lane's rows g and g + 8
    memcpy(op.a[1], A[g + 8], sizeof(op.a[1]));
    op.d = d;
    op.tile = b.tile;
    op.lbo = b.lbo;
    op.sbo = b.sbo;
    op.trans_b = trans_b;
    op.accumulate = accumulate;
    op.group = state.wgmma_group[me];
}
static inline void wgmma_fence(void) {}
static inline void wgmma_commit(void) { cuda_emu::state.wgmma_group[cuda_emu::thread_index()]++; }
// the products of every committed group but the newest `newest` run now, in issue order
template <int newest> static inline void wgmma_wait(void) {
    using namespace cuda_emu;
    int me = thread_index(), kept = 0;
    for (int i = 0; i < state.wgmma_count[me]; i++) {
        WgmmaOp op = state.wgmma_ops[me][i];
        if (op.group < state.wgmma_group[me] - newest) wgmma_run(op, me % 32);
        else state.wgmma_ops[me][kept++] = op;
    }
    state.wgmma_count[me] = kept;
}
// one block runs at a time: a flag another block set is in memory already
static inline int ld_acquire_gpu(const int* p) { return *p; }
static inline void st_release_gpu(int* p, int v) { *p = v; }
static inline void wgmma_pin(float*, int) {}
static inline void fence_proxy_async(void) {}

#endif
