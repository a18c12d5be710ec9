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
    for (int lane = 0; lane < 32; lane++) {
        const uint32_t* w = state.words[warp + lane];
        int g = lane / 4, t = lane % 4;
        for (int half = 0; half < 2; half++) {
            A[g][2 * t + half] = bf16_half(w[0], half);
            A[g + 8][2 * t + half] = bf16_half(w[1], half);
            A[g][2 * t + 8 + half] = bf16_half(w[2], half);
            A[g + 8][2 * t + 8 + half] = bf16_half(w[3], half);
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

#endif
