// Flash attention on tensor cores (FlashAttention-2, Dao 2023), bf16 builds, head sizes 16/32/64.
// No T x T matrix is ever in memory: the forward pass visits the keys in tiles with an online
// softmax and keeps only each query row's log-sum-exp lse (B, NH, T); the backward pass recomputes
// the probabilities p = exp(q.k / sqrt(hs) - lse) tile by tile.
//
// What makes it fast (the earlier WMMA version, now dev/cuda/flash_wmma.cuh, ran at ~10 TFLOP/s):
// - mma.sync fragments with a documented layout (mma.cuh): a warp's score tile s = q k^T stays
//   in registers through the softmax, is rounded to bf16 in place, and is the A operand of p v;
//   the output accumulator stays in registers across the whole key loop. Only k, v (or q, dout)
//   tiles pass through shared memory, and ldmatrix hands them to the tensor cores.
// - k and v tiles come in by cp.async, double-buffered: tile i+1 loads while tile i computes,
//   in unrolled rounds whose addresses are a row offset each (flash_load_async).
// - tiles are rows of HS + 8 elements: the 8 rows an ldmatrix reads fall in 8 different groups
//   of 4 banks, so no bank conflicts (HS + 0 would put all 8 rows in the same banks).
// - the softmax works in base 2 with the 1/sqrt(hs) scale folded in: exp(x) = exp2(x log2 e),
//   one FFMA and one MUFU.EX2 per score; the forward rescales its output only when a row's max
//   has grown by more than 8 in base 2, so that p stays under 2^8 (flash_online_softmax).
// - the forward's blocks take 128 queries, 32 per warp (FLASH_Q_TILES): each k, v tile and each
//   fragment read from shared memory serves twice the queries it would with 16 per warp.
// - causal: a block never loads a tile that lies wholly after its last query, a warp skips the
//   tiles after its own last query, and only the diagonal tile is masked.
// Every output element has one writer: dk and dv come from one kernel (a block owns 64 keys and
// walks the queries), dq from another (64 queries, walking the keys), no atomics, the same bits
// on every run. (LLMC_FLASH_BACKWARD=one_kernel: dq from the dK dV kernel too, its shares added
// in a fixed order; after the dQ kernel below.)
// On Hopper (sm_90a builds, LLMC_FLASH=wgmma; after the forward below): the same kernels with their
// products on wgmma, a warpgroup of 4 warps multiplying 64 rows, B read from shared memory.
#ifndef LLMC_CUDA_FLASH_ATTENTION_CUH
#define LLMC_CUDA_FLASH_ATTENTION_CUH

#include "device.cuh"
#include "mma.cuh"

// (the head sizes the kernels below are built for, flash_attention_supports, and the backward's
// scratch D = rowsum(dO * O), flash_scratch_bytes: llmc/target.h)

// D (B, NH, T) = per token and head, dout . out over the head's hs values: the backward of
// softmax needs, per query row, the sum over keys of p * dp, and that sum equals dout . out
// (FlashAttention-2's preprocessing step). Both precisions: the flash backward and context
// parallelism's ring (llmc/cuda/ring_attention.cuh) take it.
// Memory-bound: 2 B T C values read, B NH T floats written. A thread reads `per_thread`
// contiguous values (one 16-byte pack when the head divides into packs), a group of
// lanes = hs / per_thread adjacent threads covers one (token, head), and shuffles sum the group:
// the threads walk dout and out in address order, whole sectors per warp. lanes is a power of two
// at most 32, so a group never straddles a warp. (The first version gave a warp each row and
// read 2 bytes a lane, with three 64-bit divisions per row: 12% of peak bandwidth on an H200.)
__global__ void attention_row_dot_kernel(float* D, const floatX* dout, const floatX* out, size_t pieces, int T, int C,
                                         int NH, int per_thread) {
    int hs = C / NH, lanes = hs / per_thread;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x, e = i * per_thread;  // e: element of (B, T, C)
    float sum = 0.0f;
    if (i < pieces) {
        if (per_thread == PACK16) {
            Pack16 a = load16(dout + e), b = load16(out + e);
            for (int k = 0; k < PACK16; k++) sum += (float)a.v[k] * (float)b.v[k];
        } else {
            for (int k = 0; k < per_thread; k++) sum += (float)dout[e + k] * (float)out[e + k];
        }
    }
    for (int o = lanes / 2; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffff, sum, o);  // every lane takes part
    if (i < pieces && i % lanes == 0) {
        size_t bt = e / C;
        int h = (int)(e % C) / hs, t = (int)(bt % T), b = (int)(bt / T);
        D[((size_t)b * NH + h) * T + t] = sum;
    }
}
// dout, out (B, T, C) -> D (B, NH, T)
static inline void attention_row_dot(float* D, const floatX* dout, const floatX* out, int B, int T, int C, int NH) {
    int hs = C / NH, lanes = 1;
    while (lanes < 32 && hs % (2 * lanes) == 0) lanes *= 2;  // the largest power of two <= 32 dividing hs
    if (hs % PACK16 == 0 && lanes % (hs / PACK16) == 0) lanes = hs / PACK16;  // then a pack a thread
    int per_thread = hs / lanes;
    size_t pieces = (size_t)B * T * C / per_thread;
    attention_row_dot_kernel<<<ceil_div(pieces, 256), 256>>>(D, dout, out, pieces, T, C, NH, per_thread);
    cudaCheckLaunch();
}

#if !FLOATX_IS_FLOAT

#define FLASH_WARPS 4
#define FLASH_ROWS 16                              // rows per warp: the M of one mma tile
#define FLASH_TILE (FLASH_WARPS * FLASH_ROWS)      // 64 rows per block, 64 columns per step
#define FLASH_Q_TILES 2                            // forward: row tiles per warp, 128 queries per block
#define FLASH_LOG2E 1.4426950408889634f
#define FLASH_RESCALE_SLACK 8.0f  // the forward's m moves when a row's max passes it by more than this (base 2)

// blocks per SM each kernel is compiled for (the second number of its __launch_bounds__): more
// blocks hide more latency (the kernels issue an instruction every 4-6 cycles a warp at 2 warps a
// scheduler) but leave a thread fewer registers, and past a point ptxas spills. A build can set
// them (-DFLASH_DQ_BLOCKS=4) to time the trade on a GPU (LLMC_KERNEL_TIMES=1 in a trainer).
// Measured in train_gpt2_dp, d12 B=64 on an H200 (2026-11-26): dK dV at 3 blocks (168 registers,
// 68 bytes spilled) took the backward from 24.9 to 23.8 ms a step; dQ at 4 (128 registers, 104
// bytes spilled) cost 0.6 ms, the forward at 3 (312 bytes spilled) 0.8 ms.
#ifndef FLASH_FORWARD_BLOCKS
#define FLASH_FORWARD_BLOCKS 1  // 239 registers on sm_90, 2 blocks
#endif
#ifndef FLASH_DKDV_BLOCKS
#define FLASH_DKDV_BLOCKS 3  // 168 registers, no spills on sm_90 (flash_sass.sh); 1: 2 blocks
#endif
#ifndef FLASH_DQ_BLOCKS
#define FLASH_DQ_BLOCKS 0  // 0: no minimum, ptxas chooses (168 registers on sm_90, 3 blocks; 1 gives about 190, 2 blocks)
#endif

// row stride of a shared tile, in elements: HS + 8 (see the bank note above)
#define FLASH_LD(HS) ((HS) + 8)

// start loading tile (ROWS, HS) <- rows t0.. of head h of a (B, T, width) tensor, at column
// offset (q, k, v: 0, C, 2C of qkv; dout: 0 of a (B, T, C) tensor). Rows past T become zeros.
// 16 bytes per copy. Threads 8j..8j+7 copy the same 16 bytes of 8 consecutive rows, the pattern
// an ldmatrix phase reads back: with the HS + 8 padding those 8 pieces land in 8 different groups
// of 4 banks, so the shared-memory writes are conflict-free too (row-major order, 8 threads along
// one row, made 2-way conflicts at HS 16 and 32; dev/cuda/bank_conflicts.py). The
// next 8 threads take the next 16 bytes of the same rows, so in global memory a warp still reads
// whole 32-byte sectors. Rows run from row `base` of each sequence of T for `rows` rows (the
// whole sequence: 0 and T; context parallelism's chunks, llmc/cuda/ring_attention.cuh: a chunk's
// first row and length), t0 counted from base; rows past the run become zeros.
// The block has FLASH_WARPS warps (every kernel that loads this way), so the rounds are known at
// compile time (ROWS HS / 8 copies, 128 a round: 4 for a (64, 64) tile) and unrolled, and in each
// a thread copies the same column c, 128 * 8 / HS rows further down: its column's address is
// worked out once and a round adds a row offset. (The first version looped over blockDim.x: 35
// instructions of 64-bit index arithmetic a copy, a third of what a tile of the mma.sync kernels
// issued; flash_sass.sh prints the tile loops' instructions.)
// (A block of other than FLASH_WARPS warps would leave rows unloaded or write past the tile: the
// emulator, which runs every launch the tests make, checks it; a GPU build spends no instruction.)
__device__ inline void flash_check_block_size(int threads) {
#ifdef CUDA_EMU
    if ((int)blockDim.x != threads) cuda_emu::die("a flash tile load in a block of other than the threads it is unrolled for");
#endif
}
template <int HS, int ROWS = FLASH_TILE>
__device__ inline void flash_load_async(floatX* tile, const floatX* x, int width, int offset, int b, int h, int t0, int T,
                                        int base, int rows) {
    constexpr int THREADS = FLASH_WARPS * 32, ROUNDS = ROWS * HS / 8 / THREADS, ROW_STEP = THREADS * 8 / HS;
    static_assert(ROWS * HS / 8 % THREADS == 0 && THREADS % HS == 0, "whole rounds, the same column in each");
    flash_check_block_size(THREADS);
    int r0 = threadIdx.x % 8 + threadIdx.x / HS * 8, c = threadIdx.x / 8 % (HS / 8) * 8;
    int column = offset + h * HS + c;  // this thread's column in a token's row
#pragma unroll
    for (int round = 0; round < ROUNDS; round++) {
        int r = r0 + round * ROW_STEP, t = t0 + r;
        int token = b * T + base + min(t, rows - 1);  // (B T fits an int: the tensors' row counts do)
        cp_async16(tile + r * FLASH_LD(HS) + c, x + ((size_t)token * width + column), t < rows);
    }
}

// A fragments (16 rows, HS) of this warp's rows row0.. of a shared tile, HS / 16 of them:
// lanes 0-15 point at rows 0-15 (columns 0-7 of each 16), lanes 16-31 at the same rows, 8 on
template <int HS>
__device__ inline void flash_rows_to_a(uint32_t (*a)[4], const floatX* tile, int row0) {
    int lane = threadIdx.x % 32;
    for (int kk = 0; kk < HS / 16; kk++)
        ldmatrix_x4(a[kk], tile + (row0 + lane % 16) * FLASH_LD(HS) + kk * 16 + lane / 16 * 8);
}

// s[mt] (16, 64) = a[mt] (16, HS) x^T, mt < MT, for a shared tile x (64 rows, HS): the columns
// of s are x's rows. One ldmatrix gives B for two 8-column tiles j, j+1 at one 16-wide slice kk
// of HS: matrix i (lanes 8i..8i+7) is rows 8j + 8 (i / 2).., columns 16 kk + 8 (i % 2)..
// Each B fragment serves the warp's MT row tiles: with MT = 2 a warp makes 4 mma per ldmatrix,
// not 2, which halves the shared-memory reads per tensor-core operation (the backward kernels,
// with more live registers, keep MT = 1 and pass &s, &k: one row tile)
template <int HS, int MT>
__device__ inline void flash_a_xt(float (*s)[FLASH_TILE / 8][4], const uint32_t (*a)[HS / 16][4], const floatX* x) {
    int lane = threadIdx.x % 32, i = lane / 8;
    for (int mt = 0; mt < MT; mt++)
        for (int j = 0; j < FLASH_TILE / 8; j++) s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.0f;
    for (int kk = 0; kk < HS / 16; kk++) {
        for (int j = 0; j < FLASH_TILE / 8; j += 2) {
            uint32_t bx[4];
            ldmatrix_x4(bx, x + (8 * j + i / 2 * 8 + lane % 8) * FLASH_LD(HS) + 16 * kk + i % 2 * 8);
            for (int mt = 0; mt < MT; mt++) {
                mma_bf16_16816(s[mt][j], a[mt][kk], bx);
                mma_bf16_16816(s[mt][j + 1], a[mt][kk], bx + 2);
            }
        }
    }
}

// acc[mt] (16, HS) += p[mt] (16, 64) x, mt < MT, for a shared tile x (64 rows, HS), p as 4 A
// fragments of 16 columns. x is stored k-major, so ldmatrix transposes: matrix i is rows
// 16 kk + 8 (i % 2).., columns 8 d + 8 (i / 2)..; again one ldmatrix serves the MT row tiles
template <int HS, int MT>
__device__ inline void flash_p_x(float (*acc)[HS / 8][4], const uint32_t (*p)[FLASH_TILE / 16][4], const floatX* x) {
    int lane = threadIdx.x % 32, i = lane / 8;
    for (int kk = 0; kk < FLASH_TILE / 16; kk++) {
        for (int d = 0; d < HS / 8; d += 2) {
            uint32_t bx[4];
            ldmatrix_x4_trans(bx, x + (16 * kk + i % 2 * 8 + lane % 8) * FLASH_LD(HS) + 8 * d + i / 2 * 8);
            for (int mt = 0; mt < MT; mt++) {
                mma_bf16_16816(acc[mt][d], p[mt][kk], bx);
                mma_bf16_16816(acc[mt][d + 1], p[mt][kk], bx + 2);
            }
        }
    }
}

// a score tile (16, 64) in mma's D layout, rounded to bf16 A fragments for the next product:
// the D tiles j = 2 kk, 2 kk + 1 (8 columns each) are exactly A fragment kk's two halves
__device__ inline void flash_scores_to_a(uint32_t (*a)[4], const float (*s)[4]) {
    for (int kk = 0; kk < FLASH_TILE / 16; kk++) {
        a[kk][0] = pack_bf16x2(s[2 * kk][0], s[2 * kk][1]);
        a[kk][1] = pack_bf16x2(s[2 * kk][2], s[2 * kk][3]);
        a[kk][2] = pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        a[kk][3] = pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
    }
}

// the warp's (16, HS) result times scale, in D layout, to rows row0.. of (B, T, width) at
// column offset + h HS: two bf16 (4 bytes) per store
template <int HS>
__device__ inline void flash_store(floatX* x, int width, int offset, const float (*acc)[4], float scale,
                                   int b, int h, int row0, int T) {
    int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    for (int half = 0; half < 2; half++) {
        int row = row0 + g + 8 * half;
        if (row >= T) continue;
        floatX* dst = x + ((size_t)b * T + row) * width + offset + h * HS + 2 * t;
        for (int d = 0; d < HS / 8; d++)
            *(uint32_t*)(dst + 8 * d) = pack_bf16x2(acc[d][2 * half] * scale, acc[d][2 * half + 1] * scale);
    }
}

// One key tile of the forward's online softmax, for a warp's 16 queries first.. against the
// keys k0.. (the same in the mma.sync and the wgmma kernels, whose accumulators share mma's D
// layout, and in context parallelism's chunk pairs, llmc/cuda/ring_attention.cuh): s (16, 64)
// scores become probabilities p = 2^(s scale log2 e - m), the running max m (base-2 units; see
// below) and sum l of rows g, g + 8 move on, and the output rows o are rescaled to m. Masked: a key
// past the T keys there are, and with `causal` a key after its query.
template <int HS>
__device__ inline void flash_online_softmax(float (*s)[4], float* m, float* l, float (*o)[4], int first, int k0, int T,
                                            float scale_log2, bool causal = true) {
    int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    // the masked scores become -inf (only the diagonal tile and the last, past T, need the mask:
    // the others skip its compares, since the whole warp takes the same branch)
    if ((causal && k0 + FLASH_TILE - 1 > first) || k0 + FLASH_TILE > T) {
        for (int j = 0; j < FLASH_TILE / 8; j++) {
            for (int e = 0; e < 4; e++) {
                int key = k0 + 8 * j + 2 * t + e % 2, query = first + g + e / 2 * 8;
                if ((causal && key > query) || key >= T) s[j][e] = -INFINITY;
            }
        }
    }
    // the max of the raw scores: scale > 0, so it is the max of the scaled ones too, and the
    // scale goes into the exponent's FFMA below (one instruction a score, not a multiply and a
    // subtract; FlashAttention-2 does the same)
    float tile_max[2] = {-INFINITY, -INFINITY};
    for (int j = 0; j < FLASH_TILE / 8; j++)
        for (int e = 0; e < 4; e++) tile_max[e / 2] = fmaxf(tile_max[e / 2], s[j][e]);
    float m_new[2];
    bool grown = false;
    for (int r = 0; r < 2; r++) {  // the 4 lanes of the group hold the row between them
        tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffff, tile_max[r], 1));
        tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffff, tile_max[r], 2));
        // finite from the first tile on: key 0 is in it, and every query sees key 0
        m_new[r] = fmaxf(m[r], tile_max[r] * scale_log2);
        grown |= m_new[r] > m[r] + FLASH_RESCALE_SLACK;  // (the first tile: m = -inf, always)
    }
    // m need not be the row's max, only a value that keeps p = 2^(s - m) from overflowing: the
    // output is o / l and lse = m + log2 l whichever m the tiles shared. So m moves, and o and l
    // are rescaled to it, only when a row's max passes it by more than FLASH_RESCALE_SLACK (p then
    // stays under 2^8); the whole warp takes the same branch (FlashAttention-4's conditional
    // rescaling, Dao et al. 2025: after the first tiles the max rarely grows that much, and the
    // rescale was a multiply per output value and two exponentials a row each tile)
    if (__any_sync(0xffffffff, grown)) {
        float rescale[2];
        for (int r = 0; r < 2; r++) {
            rescale[r] = exp2_approx(m[r] - m_new[r]);  // what the sums so far are worth at the new m
            m[r] = m_new[r];
            l[r] *= rescale[r];
        }
        for (int d = 0; d < HS / 8; d++) {
            o[d][0] *= rescale[0], o[d][1] *= rescale[0];
            o[d][2] *= rescale[1], o[d][3] *= rescale[1];
        }
    }
    for (int j = 0; j < FLASH_TILE / 8; j++) {  // p = 2^(s scale log2 e - m), l += this lane's part
        for (int e = 0; e < 4; e++) {
            s[j][e] = exp2_approx(fmaf(s[j][e], scale_log2, -m[e / 2]));
            l[e / 2] += s[j][e];
        }
    }
}

// the forward's end for a warp's 16 queries first..: o divided by the row sums l (gathered from
// the group's 4 lanes) into out (B, T, C), and each row's log-sum-exp into lse (B, NH, T)
template <int HS>
__device__ inline void flash_forward_finish(floatX* out, float* lse, float (*o)[4], const float* m, float* l, int b,
                                            int h, int first, int T, int C, int NH) {
    int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffff, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffff, l[r], 2);
    }
    float inv_l[2] = {1.0f / l[0], 1.0f / l[1]};  // two divisions, then multiplies
    for (int d = 0; d < HS / 8; d++) {
        o[d][0] *= inv_l[0], o[d][1] *= inv_l[0];
        o[d][2] *= inv_l[1], o[d][3] *= inv_l[1];
    }
    flash_store<HS>(out, C, 0, o, 1.0f, b, h, first, T);
    for (int r = 0; r < 2; r++) {  // natural-log lse = ln 2 (m + log2 l), m in base-2 units
        int row = first + g + 8 * r;
        if (t == 0 && row < T) lse[((size_t)b * NH + h) * T + row] = (m[r] + log2f(l[r])) / FLASH_LOG2E;
    }
}

// the dQ kernels' per-row values for the warp's queries row0..: lse in base 2 and D, rows g, g + 8
__device__ inline void flash_row_statistics(float* lse_log2, float* D_row, const float* lse, const float* D, int b,
                                            int h, int NH, int row0, int T) {
    int g = threadIdx.x % 32 / 4;
    for (int r = 0; r < 2; r++) {
        int row = row0 + g + 8 * r;
        lse_log2[r] = row < T ? lse[((size_t)b * NH + h) * T + row] * FLASH_LOG2E : 0.0f;
        D_row[r] = row < T ? D[((size_t)b * NH + h) * T + row] : 0.0f;
    }
}

// The backward's probabilities, recomputed from the forward's lse: p = 2^(s scale log2 e - lse
// log2 e), 0 where masked (a key past the T there are; with `causal`, a key after its query: context
// parallelism's chunk pairs, llmc/cuda/ring_attention.cuh, pass the chunk's length and whether the
// pair is diagonal). flash_query_probabilities: a (16, 64) tile of the dQ kernels, rows the warp's
// queries row0.. (lse_log2: rows g, g + 8, in base 2), columns the keys k0..
__device__ inline void flash_query_probabilities(float (*s)[4], const float* lse_log2, int row0, int k0, int T,
                                                 float scale_log2, bool causal = true) {
    int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    for (int j = 0; j < FLASH_TILE / 8; j++)
        for (int e = 0; e < 4; e++) s[j][e] = exp2_approx(s[j][e] * scale_log2 - lse_log2[e / 2]);
    if ((causal && k0 + FLASH_TILE - 1 > row0) || k0 + FLASH_TILE > T) {  // the diagonal tile, or past T
        for (int j = 0; j < FLASH_TILE / 8; j++) {
            for (int e = 0; e < 4; e++) {
                int key = k0 + 8 * j + 2 * t + e % 2, query = row0 + g + e / 2 * 8;
                if ((causal && key > query) || key >= T) s[j][e] = 0.0f;
            }
        }
    }
}
// flash_key_probabilities: the transposed tile of the dK dV kernels, rows the warp's keys
// key0.., columns the queries u0.. (lse_log2_tile: their 64 lse in base 2, in shared memory, where
// flash_load_row_values put them times log2 e: one multiply a query, not one a score)
__device__ inline void flash_key_probabilities(float (*s)[4], const float* lse_log2_tile, int key0, int u0, int T,
                                               float scale_log2, bool causal = true) {
    int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    for (int j = 0; j < FLASH_TILE / 8; j++) {
        for (int e = 0; e < 4; e++)
            s[j][e] = exp2_approx(s[j][e] * scale_log2 - lse_log2_tile[8 * j + 2 * t + e % 2]);
    }
    if ((causal && u0 < key0 + FLASH_ROWS - 1) || u0 + FLASH_TILE > T) {  // the diagonal tile, or past T
        for (int j = 0; j < FLASH_TILE / 8; j++) {
            for (int e = 0; e < 4; e++) {
                int query = u0 + 8 * j + 2 * t + e % 2, key = key0 + g + e / 2 * 8;
                if ((causal && query < key) || query >= T) s[j][e] = 0.0f;
            }
        }
    }
}

// block (64 MT queries, b * NH + h), 4 warps of 16 MT queries: MT row tiles of 16 per warp.
// The library runs MT = 2 (FLASH_Q_TILES), 128-query blocks as in FlashAttention-2: each k, v
// tile a block loads from memory serves twice the queries, and each fragment a warp reads from
// shared memory feeds twice the mma (flash_a_xt). dev/cuda/attention_forward times MT = 1 too.
// Lane (g, t) holds, for rows g and g + 8 of each of its row tiles, the running max m and sum l
// of the softmax and columns 2t, 2t+1 of every 8-wide output tile; the 4 lanes of a group
// together hold the whole rows.
// (__launch_bounds__ with 1 block per SM lets ptxas use the registers the output accumulator and
// the score tile need: held to 4 blocks per SM, the 64-query forward<64, 1> spilled on sm_90;
// at MT = 2, forward<64, 2> takes 239 registers, no spills; dev/cuda/flash_sass.sh)
template <int HS, int MT>
__global__ void __launch_bounds__(FLASH_WARPS * 32, FLASH_FORWARD_BLOCKS)
flash_attention_forward_kernel(floatX* out, float* lse, const floatX* qkv, int B, int T, int C, int NH) {
    // k and v, double-buffered: kv_s[buf][0] is k, kv_s[buf][1] is v. The block's q (64 MT rows)
    // passes through kv_s[1] into registers before the loop first fills it: a q tile of its own
    // would take the static shared memory past its 48 KiB limit (54 KiB at HS 64 and MT 2; this
    // way 36 KiB). Its rows 64-127 run on from kv_s[1][0] into kv_s[1][1], next in memory.
    static_assert(MT == 1 || MT == 2, "q borrows the second k, v buffers: room for 2 tiles of rows");
    __shared__ __align__(16) floatX kv_s[2][2][FLASH_TILE * FLASH_LD(HS)];
    int warp = threadIdx.x / 32;
    int b = blockIdx.y / NH, h = blockIdx.y % NH;
    // the last queries see the most keys: their blocks start first, short ones fill the tail
    int q0 = (gridDim.x - 1 - blockIdx.x) * FLASH_TILE * MT, row0 = q0 + warp * FLASH_ROWS * MT;
    int tiles = (min(q0 + FLASH_TILE * MT, T) + FLASH_TILE - 1) / FLASH_TILE;  // causal: keys up to the last query
    float scale_log2 = rsqrtf((float)HS) * FLASH_LOG2E;  // scores in base-2 units
    // two commit groups: q, then the first k, v, which keep landing while the warps read q
    flash_load_async<HS, FLASH_TILE * MT>(kv_s[1][0], qkv, 3 * C, 0, b, h, q0, T, 0, T);
    cp_async_commit();
    flash_load_async<HS>(kv_s[0][0], qkv, 3 * C, C, b, h, 0, T, 0, T);
    flash_load_async<HS>(kv_s[0][1], qkv, 3 * C, 2 * C, b, h, 0, T, 0, T);
    cp_async_commit();
    cp_async_wait<1>();  // groups complete in order: all but the newest is q
    __syncthreads();
    uint32_t q[MT][HS / 16][4];  // the warp's queries as A fragments, for the whole key loop
    for (int mt = 0; mt < MT; mt++) flash_rows_to_a<HS>(q[mt], kv_s[1][0], warp * FLASH_ROWS * MT + mt * FLASH_ROWS);
    __syncthreads();  // every warp holds its q: kv_s[1] is free for the second k, v tile
    float o[MT][HS / 8][4];
    float m[MT][2], l[MT][2];  // rows g, g + 8 of each row tile
    for (int mt = 0; mt < MT; mt++) {
        for (int d = 0; d < HS / 8; d++) o[mt][d][0] = o[mt][d][1] = o[mt][d][2] = o[mt][d][3] = 0.0f;
        m[mt][0] = m[mt][1] = -INFINITY;
        l[mt][0] = l[mt][1] = 0.0f;
    }
    for (int tile = 0; tile < tiles; tile++) {
        int k0 = tile * FLASH_TILE, buf = tile % 2;
        if (tile + 1 < tiles) {  // the next k, v stream in while this tile computes
            flash_load_async<HS>(kv_s[buf ^ 1][0], qkv, 3 * C, C, b, h, k0 + FLASH_TILE, T, 0, T);
            flash_load_async<HS>(kv_s[buf ^ 1][1], qkv, 3 * C, 2 * C, b, h, k0 + FLASH_TILE, T, 0, T);
            cp_async_commit();
            cp_async_wait<1>();  // all but the newest group: this tile has landed
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();  // ... for every thread's copies
        // causal, per warp: with MT = 2 and T past the block's first 64 queries, the block's
        // last tile lies wholly after the queries of its first two warps; a warp past T has no
        // queries. Such warps only wait at the barriers
        if (k0 <= row0 + FLASH_ROWS * MT - 1 && row0 < T) {
            float s[MT][FLASH_TILE / 8][4];
            flash_a_xt<HS, MT>(s, q, kv_s[buf][0]);  // s = q k^T
            uint32_t p[MT][FLASH_TILE / 16][4];
            // unrolled: a register array indexed by a runtime value lives in local memory. nvcc
            // unrolls the short loops over mt by itself; this one and the last it left rolled
            // (flash_sass.sh fails on any LDL/STL)
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                flash_online_softmax<HS>(s[mt], m[mt], l[mt], o[mt], row0 + mt * FLASH_ROWS, k0, T, scale_log2);
                flash_scores_to_a(p[mt], s[mt]);
            }
            flash_p_x<HS, MT>(o, p, kv_s[buf][1]);  // o += p v
        }
        __syncthreads();  // every warp is done with kv_s[buf] before it is refilled
    }
#pragma unroll
    for (int mt = 0; mt < MT; mt++) flash_forward_finish<HS>(out, lse, o[mt], m[mt], l[mt], b, h, row0 + mt * FLASH_ROWS, T, C, NH);
}

// 64 floats of a (B, NH, T) row-vector for positions t0.. times `scale` (0 past T), by threads
// 0-63 or 64-127 (lse times log2 e: base 2, as the probabilities take it; D as it is)
__device__ inline void flash_load_row_values(float* dst, const float* src, int t0, int T, int first_thread,
                                             float scale = 1.0f) {
    int j = (int)threadIdx.x - first_thread;
    if (j >= 0 && j < FLASH_TILE) dst[j] = t0 + j < T ? src[t0 + j] * scale : 0.0f;
}

#if defined(LLMC_WGMMA)
// ---- Flash attention on Hopper's warpgroup MMA (LLMC_FLASH=wgmma, sm_90a builds, head size 64)
// FlashAttention-3 (Shah et al. 2024) runs attention on wgmma: a warpgroup of 4 warps multiplies
// 64 rows at once, and B comes to the tensor cores straight from shared memory. The kernels
// below are its first step: the same algorithms as the mma.sync kernels with the products moved.
// The forward (flash_attention_forward_wgmma_kernel; the backward's two follow it):
// - block: 2 warpgroups, 128 queries; each warpgroup 64 queries, each warp 16 of them;
// - s (64, 64) = q k^T: 4 wgmma (k16 steps over HS), A = the warp's q fragments in registers,
//   B = the k tile in shared memory, K-major (a key's 64 values adjacent);
// - the online softmax per warp exactly as before: the accumulators have mma.sync's D layout;
// - o (64, 64) += p v: 4 wgmma (k16 steps over the keys), A = p rounded to bf16 in registers (the
//   D tiles of s are A fragments, flash_scores_to_a), B = the v tile, MN-major;
// - k, v tiles in the interleaved layout (flash_core_offset), double-buffered by cp.async.
// Not yet here (FlashAttention-3's other steps): loads by the tensor memory accelerator, one
// warpgroup loading while the others compute, and softmax overlapped with the next product.
// Per thread: 16 registers of q (and 16 of the copy each product reads, flash_wg_copy_a), 32 of s, 32
// of o, 16 of p: 123 registers on sm_90a, against 239 for the mma.sync kernel. On an H200 (2026-11-27)
// it is correct and, with the backward below, slower than mma.sync (dev/cuda/README.md: "Flash attention on wgmma").
#define FLASH_WG_WARPS 8  // 2 warpgroups
#define FLASH_WG_QUERIES (FLASH_WG_WARPS * FLASH_ROWS)  // 128 queries a block
// wgmma's interleaved layout of a (ROWS, HS) tile (mma.cuh): 8 x 8 core matrices of 128
// contiguous bytes, a row of 8 elements every 16 bytes; the core matrices of one 8 columns
// follow each other down the rows, then the next 8 columns. So the core matrices 8 rows apart are
// 128 bytes apart, those 8 columns apart ROWS * 16 bytes. Returns an element index.
template <int ROWS>
__device__ constexpr int flash_core_offset(int r, int c) {
    return ((c / 8) * (ROWS / 8) + r / 8) * 64 + (r % 8) * 8 + c % 8;
}
// flash_load_async into the interleaved layout (rows t0.. of the whole sequence): the same
// threads copy the same 16 bytes in the same unrolled rounds (a block of FLASH_WG_WARPS warps:
// 256 copies a round), and the 8 rows that threads 8j..8j+7 copy are now one core matrix, 128
// contiguous bytes: conflict-free (dev/cuda/bank_conflicts.py reads the mma.sync kernels only)
template <int HS, int ROWS>
__device__ inline void flash_load_async_core(floatX* tile, const floatX* x, int width, int offset, int b, int h, int t0,
                                             int T) {
    constexpr int THREADS = FLASH_WG_WARPS * 32, ROUNDS = ROWS * HS / 8 / THREADS, ROW_STEP = THREADS * 8 / HS;
    static_assert(ROWS * HS / 8 % THREADS == 0 && THREADS % HS == 0, "whole rounds, the same column in each");
    flash_check_block_size(THREADS);
    int r0 = threadIdx.x % 8 + threadIdx.x / HS * 8, c = threadIdx.x / 8 % (HS / 8) * 8, column = offset + h * HS + c;
#pragma unroll
    for (int round = 0; round < ROUNDS; round++) {
        int r = r0 + round * ROW_STEP, t = t0 + r;
        cp_async16(tile + flash_core_offset<ROWS>(r, c), x + ((size_t)(b * T + min(t, T - 1)) * width + column), t < T);
    }
}
// the wgmma descriptor of the k16 step kk of a (64, 64) interleaved tile, as B of q k^T
// (K-major: the 16 values of a key at step kk are columns 16 kk..; lbo: 8 columns on, 1024
// bytes; sbo: 8 keys on, 128) or of p v (MN-major: keys 16 kk..; lbo: 8 keys on; sbo: 8 columns)
__device__ inline WgmmaDesc flash_desc_keys(const floatX* tile, int kk) {
    return wgmma_desc(tile + flash_core_offset<FLASH_TILE>(0, 16 * kk), FLASH_TILE * 16, 128);
}
__device__ inline WgmmaDesc flash_desc_values(const floatX* tile, int kk) {
    return wgmma_desc(tile + flash_core_offset<FLASH_TILE>(16 * kk, 0), 128, FLASH_TILE * 16);
}

// The fragments a warp holds across the loop over tiles (q, or k and v) are A of a product on
// every tile, and ptxas before CUDA 13.3 gives a register that wgmma reads as A to other values
// once the product is issued, although the next tile's product reads it again (on an H200 the q
// fragments were overwritten by p from the second tile on; dev/cuda/flash_sass.sh checks the SASS
// for it). So the products read a copy made in each iteration, before its wgmma_fence (a register
// a product reads is written before the fence): copy = a ^ zero with zero = flash_wg_loop_zero(tile,
// T), 0 for any sequence length T >= 0, but not to ptxas, which does not know T's sign, and a new
// value on each tile, so that ptxas can neither fold the copy away nor lift it out of the loop; a
// itself stays an ordinary, live register. FLASH_WGMMA_COPY_A=0 (a build-time switch) leaves the
// copy out, to show that the SASS check catches the reuse.
#ifndef FLASH_WGMMA_COPY_A
#define FLASH_WGMMA_COPY_A 1
#endif
__device__ inline uint32_t flash_wg_loop_zero(int tile, int T) { return (uint32_t)tile * ((uint32_t)T >> 31); }
__device__ inline void flash_wg_copy_a(uint32_t (*copy)[4], const uint32_t (*a)[4], uint32_t zero) {
    for (int kk = 0; kk < 4; kk++)
        for (int i = 0; i < 4; i++) copy[kk][i] = FLASH_WGMMA_COPY_A ? a[kk][i] ^ zero : a[kk][i];
}
// s (the warpgroup's 64 rows, 64) = a x^T over HS = 64: a the warp's A fragments, x a (64, 64)
// interleaved tile whose rows are the columns of s
__device__ inline void flash_wg_a_xt(float (*s)[4], const uint32_t (*a)[4], const floatX* x) {
    for (int kk = 0; kk < 4; kk++) wgmma_m64n64k16<0>(&s[0][0], a[kk], flash_desc_keys(x, kk), kk > 0);
}
// acc (the warpgroup's 64 rows, 64) += p x: p the warp's A fragments over x's 64 rows
__device__ inline void flash_wg_p_x(float (*acc)[4], const uint32_t (*p)[4], const floatX* x) {
    for (int kk = 0; kk < 4; kk++) wgmma_m64n64k16<1>(&acc[0][0], p[kk], flash_desc_values(x, kk), 1);
}
// the warp's 16 rows row0.. of an interleaved (ROWS, 64) tile as A fragments: ldmatrix's matrix i
// is rows 8 (i % 2).., columns 16 kk + 8 (i / 2).., one core matrix, whose row l % 8 lane l gives
template <int ROWS>
__device__ inline void flash_core_rows_to_a(uint32_t (*a)[4], const floatX* tile, int row0) {
    int lane = threadIdx.x % 32, i = lane / 8;
    for (int kk = 0; kk < 4; kk++)
        ldmatrix_x4(a[kk], tile + flash_core_offset<ROWS>(row0 + i % 2 * 8 + lane % 8, 16 * kk + i / 2 * 8));
}

// the forward: block (128 queries, b * NH + h), the longest blocks first as in the mma.sync kernel
__global__ void __launch_bounds__(FLASH_WG_WARPS * 32, 2)
flash_attention_forward_wgmma_kernel(floatX* out, float* lse, const floatX* qkv, int B, int T, int C, int NH) {
    const int HS = 64;
    // k and v, double-buffered (kv_s[buf][0] k, kv_s[buf][1] v); q (128, 64) passes through
    // kv_s[1] (both tiles, 16 KB) into registers first, in the interleaved layout too
    __shared__ __align__(128) floatX kv_s[2][2][FLASH_TILE * HS];
    int warp = threadIdx.x / 32;
    int b = blockIdx.y / NH, h = blockIdx.y % NH;
    int q0 = (gridDim.x - 1 - blockIdx.x) * FLASH_WG_QUERIES;  // the longest blocks first
    int group0 = q0 + warp / 4 * 64, row0 = q0 + warp * FLASH_ROWS;  // the warpgroup's and warp's first query
    int tiles = (min(q0 + FLASH_WG_QUERIES, T) + FLASH_TILE - 1) / FLASH_TILE;
    float scale_log2 = rsqrtf((float)HS) * FLASH_LOG2E;
    flash_load_async_core<HS, FLASH_WG_QUERIES>(kv_s[1][0], qkv, 3 * C, 0, b, h, q0, T);
    cp_async_commit();
    flash_load_async_core<HS, FLASH_TILE>(kv_s[0][0], qkv, 3 * C, C, b, h, 0, T);
    flash_load_async_core<HS, FLASH_TILE>(kv_s[0][1], qkv, 3 * C, 2 * C, b, h, 0, T);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    uint32_t q[HS / 16][4];  // the warp's 16 queries as A fragments
    flash_core_rows_to_a<FLASH_WG_QUERIES>(q, kv_s[1][0], warp * FLASH_ROWS);
    __syncthreads();  // every warp holds its q: kv_s[1] is free
    float o[HS / 8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    for (int d = 0; d < HS / 8; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
    for (int tile = 0; tile < tiles; tile++) {
        int k0 = tile * FLASH_TILE, buf = tile % 2;
        if (tile + 1 < tiles) {
            flash_load_async_core<HS, FLASH_TILE>(kv_s[buf ^ 1][0], qkv, 3 * C, C, b, h, k0 + FLASH_TILE, T);
            flash_load_async_core<HS, FLASH_TILE>(kv_s[buf ^ 1][1], qkv, 3 * C, 2 * C, b, h, k0 + FLASH_TILE, T);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        fence_proxy_async();  // this thread's copies are visible to the tensor cores' reads...
        __syncthreads();      // ... every thread's
        // causal, per warpgroup (wgmma needs all 4 warps): its 64 queries against this tile
        if (k0 <= group0 + 63 && group0 < T) {
            float s[FLASH_TILE / 8][4];
            uint32_t q_copy[HS / 16][4];
            flash_wg_copy_a(q_copy, q, flash_wg_loop_zero(tile, T));
            wgmma_fence();
            flash_wg_a_xt(s, q_copy, kv_s[buf][0]);  // s = q k^T
            wgmma_commit();
            wgmma_wait<0>();
            wgmma_pin(&s[0][0], FLASH_TILE / 2);
            flash_online_softmax<HS>(s, m, l, o, row0, k0, T, scale_log2);
            uint32_t p[FLASH_TILE / 16][4];
            flash_scores_to_a(p, s);
            // o was rescaled by ordinary instructions: pinned there (as CUTLASS fences its
            // accumulators), then the fence orders those writes before the products read them
            wgmma_pin(&o[0][0], HS / 2);
            wgmma_fence();
            flash_wg_p_x(o, p, kv_s[buf][1]);  // o += p v
            wgmma_commit();
            wgmma_wait<0>();
            wgmma_pin(&o[0][0], HS / 2);
        }
        __syncthreads();  // every warpgroup's products have read kv_s[buf] before it is refilled
    }
    flash_forward_finish<HS>(out, lse, o, m, l, b, h, row0, T, C, NH);
}
// The backward on wgmma (LLMC_FLASH=wgmma): flash_attention_backward_dkdv_kernel and _dq_kernel
// with their products moved to wgmma as in the forward above. Each warpgroup owns 64 rows (keys
// for dK dV, queries for dQ) as A fragments in registers; the tiles it walks (q and dout, or k
// and v) are B operands in shared memory, each read by two products: once K-major (a product over
// the head's 64 values) and once MN-major (a product over the tile's 64 rows), from the same
// interleaved tile. A block is 2 warpgroups: 128 keys (or queries) share each loaded tile.
// dK, dV: block (128 keys, b * NH + h); warpgroup w owns keys group0 = block_key0 + 64 w .. + 63,
// warp its 16, and walks the query tiles from its first key on:
//   s^T = k q^T, p^T = exp(s^T scale - lse), dv += p^T dout, dp^T = v dout^T,
//   ds^T = p^T (dp^T - D), dk += ds^T q scale
__global__ void __launch_bounds__(FLASH_WG_WARPS * 32, 1)
flash_attention_backward_dkdv_wgmma_kernel(floatX* dqkv, const floatX* dout, const floatX* qkv, const float* lse,
                                           const float* D, int B, int T, int C, int NH) {
    const int HS = 64;
    // q and dout tiles, double-buffered; the block's k (128 rows) passes through q_s, its v through dy_s
    __shared__ __align__(128) floatX q_s[2][FLASH_TILE * HS];
    __shared__ __align__(128) floatX dy_s[2][FLASH_TILE * HS];
    __shared__ float lse_s[2][FLASH_TILE], D_s[2][FLASH_TILE];  // lse in base 2
    int warp = threadIdx.x / 32, t = threadIdx.x % 4;  // t: the lane's place in its group (mma.cuh)
    int b = blockIdx.y / NH, h = blockIdx.y % NH;
    int block_key0 = blockIdx.x * FLASH_WG_QUERIES;  // the first keys see the most queries: first
    int group0 = block_key0 + warp / 4 * 64, key0 = block_key0 + warp * FLASH_ROWS;
    int tiles = (T - block_key0 + FLASH_TILE - 1) / FLASH_TILE;  // causal: queries from the first key on
    float scale = rsqrtf((float)HS), scale_log2 = scale * FLASH_LOG2E;
    const float* lse_bh = lse + ((size_t)b * NH + h) * T;
    const float* D_bh = D + ((size_t)b * NH + h) * T;
    flash_load_async_core<HS, FLASH_WG_QUERIES>(q_s[0], qkv, 3 * C, C, b, h, block_key0, T);
    flash_load_async_core<HS, FLASH_WG_QUERIES>(dy_s[0], qkv, 3 * C, 2 * C, b, h, block_key0, T);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    uint32_t k[HS / 16][4], v[HS / 16][4];
    flash_core_rows_to_a<FLASH_WG_QUERIES>(k, q_s[0], warp * FLASH_ROWS);
    flash_core_rows_to_a<FLASH_WG_QUERIES>(v, dy_s[0], warp * FLASH_ROWS);
    __syncthreads();  // every warp has its k, v: the buffers are free
    flash_load_async_core<HS, FLASH_TILE>(q_s[0], qkv, 3 * C, 0, b, h, block_key0, T);
    flash_load_async_core<HS, FLASH_TILE>(dy_s[0], dout, C, 0, b, h, block_key0, T);
    cp_async_commit();
    flash_load_row_values(lse_s[0], lse_bh, block_key0, T, 0, FLASH_LOG2E);
    flash_load_row_values(D_s[0], D_bh, block_key0, T, FLASH_TILE);
    float dk[HS / 8][4], dv[HS / 8][4];
    for (int d = 0; d < HS / 8; d++)
        for (int e = 0; e < 4; e++) dk[d][e] = dv[d][e] = 0.0f;
    for (int tile = 0; tile < tiles; tile++) {
        int u0 = block_key0 + tile * FLASH_TILE, buf = tile % 2;
        if (tile + 1 < tiles) {
            flash_load_async_core<HS, FLASH_TILE>(q_s[buf ^ 1], qkv, 3 * C, 0, b, h, u0 + FLASH_TILE, T);
            flash_load_async_core<HS, FLASH_TILE>(dy_s[buf ^ 1], dout, C, 0, b, h, u0 + FLASH_TILE, T);
            cp_async_commit();
            flash_load_row_values(lse_s[buf ^ 1], lse_bh, u0 + FLASH_TILE, T, 0, FLASH_LOG2E);
            flash_load_row_values(D_s[buf ^ 1], D_bh, u0 + FLASH_TILE, T, FLASH_TILE);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        fence_proxy_async();
        __syncthreads();
        if (u0 + FLASH_TILE - 1 >= group0 && group0 < T) {  // the warpgroup's keys see some of these queries
            float s[FLASH_TILE / 8][4], dp[FLASH_TILE / 8][4];  // s^T then p^T then ds^T; dp^T
            uint32_t k_copy[HS / 16][4], v_copy[HS / 16][4];
            flash_wg_copy_a(k_copy, k, flash_wg_loop_zero(tile, T));
            flash_wg_copy_a(v_copy, v, flash_wg_loop_zero(tile, T));
            wgmma_fence();
            flash_wg_a_xt(s, k_copy, q_s[buf]);   // s^T = k q^T
            flash_wg_a_xt(dp, v_copy, dy_s[buf]);  // dp^T = v dout^T, in the same group
            wgmma_commit();
            wgmma_wait<0>();
            wgmma_pin(&s[0][0], FLASH_TILE / 2);
            wgmma_pin(&dp[0][0], FLASH_TILE / 2);
            flash_key_probabilities(s, lse_s[buf], key0, u0, T, scale_log2);  // p^T
            uint32_t a[FLASH_TILE / 16][4];
            flash_scores_to_a(a, s);
            for (int j = 0; j < FLASH_TILE / 8; j++)
                for (int e = 0; e < 4; e++) s[j][e] *= dp[j][e] - D_s[buf][8 * j + 2 * t + e % 2];
            uint32_t ds[FLASH_TILE / 16][4];
            flash_scores_to_a(ds, s);
            wgmma_pin(&dv[0][0], HS / 2);
            wgmma_pin(&dk[0][0], HS / 2);
            wgmma_fence();
            flash_wg_p_x(dv, a, dy_s[buf]);  // dv += p^T dout
            flash_wg_p_x(dk, ds, q_s[buf]);  // dk += ds^T q
            wgmma_commit();
            wgmma_wait<0>();
            wgmma_pin(&dv[0][0], HS / 2);
            wgmma_pin(&dk[0][0], HS / 2);
        }
        __syncthreads();  // every warpgroup's products have read the tiles before they are refilled
    }
    flash_store<HS>(dqkv, 3 * C, C, dk, scale, b, h, key0, T);
    flash_store<HS>(dqkv, 3 * C, 2 * C, dv, 1.0f, b, h, key0, T);
}

// dQ: block (128 queries, b * NH + h); warpgroup w owns queries group0 .. + 63, warp its 16, and
// walks the key tiles up to its causal limit:
//   p = exp(q k^T scale - lse), dp = dout v^T, ds = p (dp - D), dq += ds k scale
__global__ void __launch_bounds__(FLASH_WG_WARPS * 32, 1)
flash_attention_backward_dq_wgmma_kernel(floatX* dqkv, const floatX* dout, const floatX* qkv, const float* lse,
                                         const float* D, int B, int T, int C, int NH) {
    const int HS = 64;
    __shared__ __align__(128) floatX k_s[2][FLASH_TILE * HS];
    __shared__ __align__(128) floatX v_s[2][FLASH_TILE * HS];
    int warp = threadIdx.x / 32;
    int b = blockIdx.y / NH, h = blockIdx.y % NH;
    int q0 = (gridDim.x - 1 - blockIdx.x) * FLASH_WG_QUERIES;  // the longest blocks first
    int group0 = q0 + warp / 4 * 64, row0 = q0 + warp * FLASH_ROWS;
    int tiles = (min(q0 + FLASH_WG_QUERIES, T) + FLASH_TILE - 1) / FLASH_TILE;
    float scale = rsqrtf((float)HS), scale_log2 = scale * FLASH_LOG2E;
    // the block's q (128 rows) through k_s, its dout through v_s
    flash_load_async_core<HS, FLASH_WG_QUERIES>(k_s[0], qkv, 3 * C, 0, b, h, q0, T);
    flash_load_async_core<HS, FLASH_WG_QUERIES>(v_s[0], dout, C, 0, b, h, q0, T);
    cp_async_commit();
    float lse_log2[2], D_row[2];  // rows g, g + 8
    flash_row_statistics(lse_log2, D_row, lse, D, b, h, NH, row0, T);
    cp_async_wait<0>();
    __syncthreads();
    uint32_t q[HS / 16][4], dy[HS / 16][4];
    flash_core_rows_to_a<FLASH_WG_QUERIES>(q, k_s[0], warp * FLASH_ROWS);
    flash_core_rows_to_a<FLASH_WG_QUERIES>(dy, v_s[0], warp * FLASH_ROWS);
    __syncthreads();
    flash_load_async_core<HS, FLASH_TILE>(k_s[0], qkv, 3 * C, C, b, h, 0, T);
    flash_load_async_core<HS, FLASH_TILE>(v_s[0], qkv, 3 * C, 2 * C, b, h, 0, T);
    cp_async_commit();
    float dq[HS / 8][4];
    for (int d = 0; d < HS / 8; d++) dq[d][0] = dq[d][1] = dq[d][2] = dq[d][3] = 0.0f;
    for (int tile = 0; tile < tiles; tile++) {
        int k0 = tile * FLASH_TILE, buf = tile % 2;
        if (tile + 1 < tiles) {
            flash_load_async_core<HS, FLASH_TILE>(k_s[buf ^ 1], qkv, 3 * C, C, b, h, k0 + FLASH_TILE, T);
            flash_load_async_core<HS, FLASH_TILE>(v_s[buf ^ 1], qkv, 3 * C, 2 * C, b, h, k0 + FLASH_TILE, T);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        fence_proxy_async();
        __syncthreads();
        if (k0 <= group0 + 63 && group0 < T) {
            float s[FLASH_TILE / 8][4], dp[FLASH_TILE / 8][4];  // s then p then ds; dp
            uint32_t q_copy[HS / 16][4], dy_copy[HS / 16][4];
            flash_wg_copy_a(q_copy, q, flash_wg_loop_zero(tile, T));
            flash_wg_copy_a(dy_copy, dy, flash_wg_loop_zero(tile, T));
            wgmma_fence();
            flash_wg_a_xt(s, q_copy, k_s[buf]);    // s = q k^T
            flash_wg_a_xt(dp, dy_copy, v_s[buf]);  // dp = dout v^T
            wgmma_commit();
            wgmma_wait<0>();
            wgmma_pin(&s[0][0], FLASH_TILE / 2);
            wgmma_pin(&dp[0][0], FLASH_TILE / 2);
            flash_query_probabilities(s, lse_log2, row0, k0, T, scale_log2);  // p
            for (int j = 0; j < FLASH_TILE / 8; j++)
                for (int e = 0; e < 4; e++) s[j][e] *= dp[j][e] - D_row[e / 2];
            uint32_t a[FLASH_TILE / 16][4];
            flash_scores_to_a(a, s);
            wgmma_pin(&dq[0][0], HS / 2);
            wgmma_fence();
            flash_wg_p_x(dq, a, k_s[buf]);  // dq += ds k
            wgmma_commit();
            wgmma_wait<0>();
            wgmma_pin(&dq[0][0], HS / 2);
        }
        __syncthreads();
    }
    flash_store<HS>(dqkv, 3 * C, 0, dq, scale, b, h, row0, T);
}
#endif  // LLMC_WGMMA


// One query tile of a dK dV walk, for the warp's 16 keys key0.. (k: their A fragments; v: the
// block's v tile) against the queries u0.. (the q and dout tiles, their lse in base 2 and D):
// dv += p^T dout and dk += ds^T q (dk unscaled); ds^T is left in ds_t as bf16 A fragments, for the
// one-kernel backward's dq
template <int HS>
__device__ inline void flash_dkdv_tile(float (&dk)[HS / 8][4], float (&dv)[HS / 8][4], uint32_t (&ds_t)[FLASH_TILE / 16][4],
                                       const uint32_t (&k)[HS / 16][4], const floatX* v_s, const floatX* q_tile,
                                       const floatX* dy_tile, const float* lse_tile, const float* D_tile, int key0, int u0,
                                       int T, float scale_log2) {
    int warp = threadIdx.x / 32, t = threadIdx.x % 4;  // t: the lane's place in its group (mma.cuh)
    float s[FLASH_TILE / 8][4];  // s^T, then p^T, then ds^T
    flash_a_xt<HS, 1>(&s, &k, q_tile);
    flash_key_probabilities(s, lse_tile, key0, u0, T, scale_log2);  // p^T
    flash_scores_to_a(ds_t, s);  // (p^T here)
    flash_p_x<HS, 1>(&dv, &ds_t, dy_tile);  // dv += p^T dout
    float dp[FLASH_TILE / 8][4];
    uint32_t v[HS / 16][4];
    flash_rows_to_a<HS>(v, v_s, warp * FLASH_ROWS);
    flash_a_xt<HS, 1>(&dp, &v, dy_tile);  // dp^T = v dout^T
    for (int j = 0; j < FLASH_TILE / 8; j++)
        for (int e = 0; e < 4; e++) s[j][e] *= dp[j][e] - D_tile[8 * j + 2 * t + e % 2];
    flash_scores_to_a(ds_t, s);
    flash_p_x<HS, 1>(&dk, &ds_t, q_tile);  // dk += ds^T q
}

// dK, dV: block (64 keys, b * NH + h), warp w owns keys key0 = block_key0 + 16 w ... + 15 and
// walks the queries from the block's first key on, 64 at a time, holding in registers
//   s^T = k q^T (16, 64), p^T = exp(s^T scale - lse),  dv += p^T dout,
//   dp^T = v dout^T,  ds^T = p^T (dp^T - D),  dk += ds^T q scale
template <int HS>
__global__ void __launch_bounds__(FLASH_WARPS * 32, FLASH_DKDV_BLOCKS)
flash_attention_backward_dkdv_kernel(floatX* dqkv, const floatX* dout, const floatX* qkv,
                                     const float* lse, const float* D, int B, int T, int C, int NH) {
    __shared__ __align__(16) floatX q_s[2][FLASH_TILE * FLASH_LD(HS)];
    __shared__ __align__(16) floatX dy_s[2][FLASH_TILE * FLASH_LD(HS)];
    __shared__ float lse_s[2][FLASH_TILE], D_s[2][FLASH_TILE];  // lse in base 2
    // the block's v, read by each warp as A fragments when the tile's dp^T needs them: held in
    // registers across the loop (16 a thread) it made ptxas spill 104 bytes at 168 registers,
    // here none (4 more ldmatrix a tile; static shared memory 46 KB of the 48)
    __shared__ __align__(16) floatX v_s[FLASH_TILE * FLASH_LD(HS)];
    int warp = threadIdx.x / 32;
    int b = blockIdx.y / NH, h = blockIdx.y % NH;
    int block_key0 = blockIdx.x * FLASH_TILE, key0 = block_key0 + warp * FLASH_ROWS;  // first keys: most queries
    int tiles = (T - block_key0 + FLASH_TILE - 1) / FLASH_TILE;  // causal: queries from the first key on
    float scale = rsqrtf((float)HS), scale_log2 = scale * FLASH_LOG2E;
    const float* lse_bh = lse + ((size_t)b * NH + h) * T;
    const float* D_bh = D + ((size_t)b * NH + h) * T;
    // the block's k passes through the second q buffer into registers, before the loop uses it
    flash_load_async<HS>(q_s[1], qkv, 3 * C, C, b, h, block_key0, T, 0, T);
    flash_load_async<HS>(v_s, qkv, 3 * C, 2 * C, b, h, block_key0, T, 0, T);
    flash_load_async<HS>(q_s[0], qkv, 3 * C, 0, b, h, block_key0, T, 0, T);
    flash_load_async<HS>(dy_s[0], dout, C, 0, b, h, block_key0, T, 0, T);
    cp_async_commit();
    flash_load_row_values(lse_s[0], lse_bh, block_key0, T, 0, FLASH_LOG2E);
    flash_load_row_values(D_s[0], D_bh, block_key0, T, FLASH_TILE);
    cp_async_wait<0>();
    __syncthreads();
    uint32_t k[HS / 16][4];
    flash_rows_to_a<HS>(k, q_s[1], warp * FLASH_ROWS);
    __syncthreads();  // every warp has its k: the second q buffer is free
    float dk[HS / 8][4], dv[HS / 8][4];
    for (int d = 0; d < HS / 8; d++)
        for (int e = 0; e < 4; e++) dk[d][e] = dv[d][e] = 0.0f;
    for (int tile = 0; tile < tiles; tile++) {
        int u0 = block_key0 + tile * FLASH_TILE, buf = tile % 2;
        if (tile + 1 < tiles) {
            flash_load_async<HS>(q_s[buf ^ 1], qkv, 3 * C, 0, b, h, u0 + FLASH_TILE, T, 0, T);
            flash_load_async<HS>(dy_s[buf ^ 1], dout, C, 0, b, h, u0 + FLASH_TILE, T, 0, T);
            cp_async_commit();
            flash_load_row_values(lse_s[buf ^ 1], lse_bh, u0 + FLASH_TILE, T, 0, FLASH_LOG2E);
            flash_load_row_values(D_s[buf ^ 1], D_bh, u0 + FLASH_TILE, T, FLASH_TILE);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        uint32_t ds_t[FLASH_TILE / 16][4];  // (the one-kernel backward's; unused here)
        flash_dkdv_tile<HS>(dk, dv, ds_t, k, v_s, q_s[buf], dy_s[buf], lse_s[buf], D_s[buf], key0, u0, T, scale_log2);
        __syncthreads();  // every warp is done with the tiles of buf before they are refilled
    }
    flash_store<HS>(dqkv, 3 * C, C, dk, scale, b, h, key0, T);
    flash_store<HS>(dqkv, 3 * C, 2 * C, dv, 1.0f, b, h, key0, T);
}

// dQ: block (64 queries, b * NH + h), warp w owns queries row0 .. row0 + 15 and walks the keys
// up to its causal limit, 64 at a time:
//   p = exp(q k^T scale - lse),  dp = dout v^T,  ds = p (dp - D),  dq += ds k scale
template <int HS>
__global__ void __launch_bounds__(FLASH_WARPS * 32, FLASH_DQ_BLOCKS)
flash_attention_backward_dq_kernel(floatX* dqkv, const floatX* dout, const floatX* qkv,
                                   const float* lse, const float* D, int B, int T, int C, int NH) {
    __shared__ __align__(16) floatX k_s[2][FLASH_TILE * FLASH_LD(HS)];
    __shared__ __align__(16) floatX v_s[2][FLASH_TILE * FLASH_LD(HS)];
    int warp = threadIdx.x / 32;
    int b = blockIdx.y / NH, h = blockIdx.y % NH;
    int q0 = (gridDim.x - 1 - blockIdx.x) * FLASH_TILE, row0 = q0 + warp * FLASH_ROWS;
    int tiles = (min(q0 + FLASH_TILE, T) + FLASH_TILE - 1) / FLASH_TILE;
    float scale = rsqrtf((float)HS), scale_log2 = scale * FLASH_LOG2E;
    // q and dout of the block pass through the second buffers into registers
    flash_load_async<HS>(k_s[1], qkv, 3 * C, 0, b, h, q0, T, 0, T);
    flash_load_async<HS>(v_s[1], dout, C, 0, b, h, q0, T, 0, T);
    flash_load_async<HS>(k_s[0], qkv, 3 * C, C, b, h, 0, T, 0, T);
    flash_load_async<HS>(v_s[0], qkv, 3 * C, 2 * C, b, h, 0, T, 0, T);
    cp_async_commit();
    float lse_log2[2], D_row[2];  // rows g, g + 8
    flash_row_statistics(lse_log2, D_row, lse, D, b, h, NH, row0, T);
    cp_async_wait<0>();
    __syncthreads();
    uint32_t q[HS / 16][4], dy[HS / 16][4];
    flash_rows_to_a<HS>(q, k_s[1], warp * FLASH_ROWS);
    flash_rows_to_a<HS>(dy, v_s[1], warp * FLASH_ROWS);
    __syncthreads();
    float dq[HS / 8][4];
    for (int d = 0; d < HS / 8; d++) dq[d][0] = dq[d][1] = dq[d][2] = dq[d][3] = 0.0f;
    for (int tile = 0; tile < tiles; tile++) {
        int k0 = tile * FLASH_TILE, buf = tile % 2;
        if (tile + 1 < tiles) {
            flash_load_async<HS>(k_s[buf ^ 1], qkv, 3 * C, C, b, h, k0 + FLASH_TILE, T, 0, T);
            flash_load_async<HS>(v_s[buf ^ 1], qkv, 3 * C, 2 * C, b, h, k0 + FLASH_TILE, T, 0, T);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        float s[FLASH_TILE / 8][4];  // s, then p, then ds
        flash_a_xt<HS, 1>(&s, &q, k_s[buf]);
        flash_query_probabilities(s, lse_log2, row0, k0, T, scale_log2);  // p
        float dp[FLASH_TILE / 8][4];
        flash_a_xt<HS, 1>(&dp, &dy, v_s[buf]);  // dp = dout v^T
        for (int j = 0; j < FLASH_TILE / 8; j++)
            for (int e = 0; e < 4; e++) s[j][e] *= dp[j][e] - D_row[e / 2];
        uint32_t a[FLASH_TILE / 16][4];
        flash_scores_to_a(a, s);
        flash_p_x<HS, 1>(&dq, &a, k_s[buf]);  // dq += ds k
        __syncthreads();
    }
    flash_store<HS>(dqkv, 3 * C, 0, dq, scale, b, h, row0, T);
}

// ---- The backward in one kernel (LLMC_FLASH_BACKWARD=one_kernel): dQ summed in a fixed order
// The two kernels above compute 7 products a tile between them: the dQ kernel recomputes s and dp,
// which the dK dV kernel had (and its exponentials). FlashAttention-2's backward (Dao 2023,
// algorithm 2) computes 5: the dK dV kernel also multiplies its ds by its k, each key block adding
// its share of a query tile's dq into memory with atomic adds, in whatever order the blocks come:
// the sums, and so the bits, change from run to run. Here the shares are added in a fixed order
// instead, so every run gives the same bits:
//   1. The block of key block kb walks the query tiles that see its keys (causal: qt >= kb), from
//      the diagonal on: qt = kb, kb + 1, ..., nkb - 1. Each tile as the dK dV kernel's: s^T, p^T,
//      dv, dp^T, ds^T, dk.
//   2. Its 4 warps put their ds^T (16 keys x 64 queries each) in shared memory, and each warp
//      multiplies ds (its 16 queries x the block's 64 keys) by k (64 keys x HS) from shared
//      memory: the tile's dq share.
//   3. Query tile qt takes the shares of key blocks qt, qt - 1, ..., 0 in that order: a counter
//      per (b, h, qt) in memory says how many have been added, and a warp of block kb waits until
//      it reads qt - kb. The diagonal block kb = qt writes its share into an fp32 buffer, the next
//      add theirs, and the last, key block 0, adds its own and writes dq (times the scale) into
//      dqkv. Only the adds and the handover wait in turn: the products are done before.
//   4. A block waits only for blocks that started before it: each takes a ticket when it starts
//      (an atomic counter), and the ticket picks its head, ticket / nkb, and its key block, the
//      diagonal-most first: kb = nkb - 1 - ticket % nkb. So the block whose share comes before
//      its own, kb + 1, is always running or done (blocks scheduled in grid order would do it
//      too, but CUDA does not promise that order; tickets are how a decoupled look-back scan
//      keeps the same promise, Merrill & Garland 2016). At step i of their walks key block kb is
//      on tile kb + i, which key block kb + 1 finished at step i - 1: the blocks of a head form a
//      pipeline, each a step behind the one before it in the order, and seldom wait. A head's
//      blocks run side by side, so its q, dout and dq sums (512 KB at T = 1024, HS = 64) are read
//      from L2, not memory. (The first version walked the tiles from the last down, all of a
//      head's blocks on one tile at a time, and took key block 0 of every head first: the blocks
//      in flight then touched hundreds of heads, too many for L2, and an H200 read q, dout and the
//      sums from memory for every tile: 1.8x the two kernels' time, 5.3 GB of DRAM traffic a
//      call, its warps stalled on loads.)
// Per (key block, query tile): 5 products, not 7, and half the exponentials; in exchange ds
// passes through shared memory, dq's shares through L2 (16 KB read and written a tile), 3
// barriers a tile, not 2, and 64 KB of shared memory a block at HS = 64 (dynamic: over the 48 KB
// a static array may take; 3 blocks an SM on Hopper, 2 on an A100). The fp32 buffer is
// (B, NH, T, HS), the counters B NH nkb + 1 ints (the last the tickets'), zeroed before each
// launch. The pattern of the handover (acquire, barrier, ..., barrier, release) is CUTLASS's
// GenericBarrier's; the emulator runs one block at a time, so it checks the order of the turns
// but not the memory ordering between blocks: a GPU's repeated runs (dev/cuda v7) do.
#define FLASH_ONE_KERNEL_TILES 6  // q and dout double-buffered, v, k: tiles of FLASH_TILE x FLASH_LD(HS)
// blocks an SM, for the registers: 3 (168 registers) where 3 blocks' shared memory fits, Hopper's
// 228 KB; an A100's 164 KB hold 2, and at 3 its 168 registers spilled 24 bytes (flash_sass.sh)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define FLASH_ONE_KERNEL_BLOCKS 2
#else
#define FLASH_ONE_KERNEL_BLOCKS 3
#endif
template <int HS>
static inline size_t flash_one_kernel_shared_bytes(void) {  // the tiles, ds^T (64 x 64), lse and D
    return (FLASH_ONE_KERNEL_TILES * FLASH_TILE * FLASH_LD(HS) + FLASH_TILE * FLASH_LD(FLASH_TILE)) * sizeof(floatX) +
           4 * FLASH_TILE * sizeof(float);
}
// a warp waits until a query tile's counter says the key blocks before this one have added their
// shares: lane 0 reads it (acquire), then the warp's barrier lets every lane read the sums. The
// emulator runs one block at a time, in ticket order, so a wait there would never end; on a GPU,
// a wait of many seconds is a bug, and a trap fails the launch instead of hanging the device.
__device__ inline void flash_wait_turn(const int* counter, int turn) {
    if (threadIdx.x % 32 == 0) {
#ifdef CUDA_EMU
        if (ld_acquire_gpu(counter) != turn) cuda_emu::die("a flash backward block waits for a key block that has not run");
#endif
        for (int spins = 0; ld_acquire_gpu(counter) != turn; spins++) {
            if (spins == 1 << 30) __trap();
            __nanosleep(64);
        }
    }
    __syncwarp();
}
// the warp's (16, HS) share of dq, rows row0.. (D layout), into the query tile's sums: written
// (first), added (the others), or added and stored in bf16 times scale into dqkv (last). The
// sums are read and written with .cg, past the L1 cache, which may hold an older copy.
template <int HS>
__device__ inline void flash_dq_add_share(floatX* dqkv, float* dq_sums, const float (*dq)[4], float scale, int first,
                                          int last, int b, int h, int NH, int row0, int T, int C) {
    int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    for (int half = 0; half < 2; half++) {
        int row = row0 + g + 8 * half;
        if (row >= T) continue;
        float* sums = dq_sums + (((size_t)b * NH + h) * T + row) * HS + 2 * t;
        floatX* dst = dqkv + ((size_t)b * T + row) * 3 * C + h * HS + 2 * t;
        for (int d = 0; d < HS / 8; d++) {
            float2 x = make_float2(dq[d][2 * half], dq[d][2 * half + 1]);
            if (!first) {
                float2 before = __ldcg((const float2*)(sums + 8 * d));
                x.x = before.x + x.x, x.y = before.y + x.y;
            }
            if (last) *(uint32_t*)(dst + 8 * d) = pack_bf16x2(x.x * scale, x.y * scale);
            else __stcg((float2*)(sums + 8 * d), x);
        }
    }
}
template <int HS>
__global__ void __launch_bounds__(FLASH_WARPS * 32, FLASH_ONE_KERNEL_BLOCKS)
flash_attention_backward_one_kernel(floatX* dqkv, float* dq_sums, int* counters, const floatX* dout, const floatX* qkv,
                                    const float* lse, const float* D, int B, int T, int C, int NH) {
    extern __shared__ __align__(16) unsigned char flash_shared[];
    __shared__ int ticket_s[1];  // (an array: the emulator poisons arrays)
    const int TILE = FLASH_TILE * FLASH_LD(HS);
    floatX* q_s = (floatX*)flash_shared;  // [2][TILE]
    floatX* dy_s = q_s + 2 * TILE;        // [2][TILE]
    floatX* v_s = dy_s + 2 * TILE;        // the block's v, read as A fragments each tile
    floatX* k_s = v_s + TILE;             // the block's k: A fragments once, B of ds k each tile
    floatX* ds_s = k_s + TILE;            // the tile's ds^T, keys x queries (64 x 64)
    float* lse_s = (float*)(ds_s + FLASH_TILE * FLASH_LD(FLASH_TILE));  // [2][FLASH_TILE], lse in base 2
    float* D_s = lse_s + 2 * FLASH_TILE;  // [2][FLASH_TILE]
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    int nkb = (T + FLASH_TILE - 1) / FLASH_TILE, BH = B * NH;
    if (threadIdx.x == 0) ticket_s[0] = atomicAdd(&counters[BH * nkb], 1);  // (step 4)
    __syncthreads();
    int kb = nkb - 1 - ticket_s[0] % nkb, b = ticket_s[0] / nkb / NH, h = ticket_s[0] / nkb % NH;
    int block_key0 = kb * FLASH_TILE, key0 = block_key0 + warp * FLASH_ROWS;
    float scale = rsqrtf((float)HS), scale_log2 = scale * FLASH_LOG2E;
    const float* lse_bh = lse + ((size_t)b * NH + h) * T;
    const float* D_bh = D + ((size_t)b * NH + h) * T;
    int* turns = counters + ((size_t)b * NH + h) * nkb;
    flash_load_async<HS>(k_s, qkv, 3 * C, C, b, h, block_key0, T, 0, T);
    flash_load_async<HS>(v_s, qkv, 3 * C, 2 * C, b, h, block_key0, T, 0, T);
    flash_load_async<HS>(q_s, qkv, 3 * C, 0, b, h, block_key0, T, 0, T);  // the first tile walked
    flash_load_async<HS>(dy_s, dout, C, 0, b, h, block_key0, T, 0, T);
    cp_async_commit();
    flash_load_row_values(lse_s, lse_bh, block_key0, T, 0, FLASH_LOG2E);
    flash_load_row_values(D_s, D_bh, block_key0, T, FLASH_TILE);
    cp_async_wait<0>();
    __syncthreads();
    uint32_t k[HS / 16][4];
    flash_rows_to_a<HS>(k, k_s, warp * FLASH_ROWS);
    float dk[HS / 8][4], dv[HS / 8][4];
    for (int d = 0; d < HS / 8; d++)
        for (int e = 0; e < 4; e++) dk[d][e] = dv[d][e] = 0.0f;
    for (int qt = kb; qt < nkb; qt++) {  // the query tiles from the diagonal on
        int tile = qt - kb, u0 = qt * FLASH_TILE, buf = tile % 2;
        floatX *q_buf = q_s + buf * TILE, *dy_buf = dy_s + buf * TILE;
        float *lse_buf = lse_s + buf * FLASH_TILE, *D_buf = D_s + buf * FLASH_TILE;
        if (qt + 1 < nkb) {  // the tile after this one streams in
            flash_load_async<HS>(q_s + (buf ^ 1) * TILE, qkv, 3 * C, 0, b, h, u0 + FLASH_TILE, T, 0, T);
            flash_load_async<HS>(dy_s + (buf ^ 1) * TILE, dout, C, 0, b, h, u0 + FLASH_TILE, T, 0, T);
            cp_async_commit();
            flash_load_row_values(lse_s + (buf ^ 1) * FLASH_TILE, lse_bh, u0 + FLASH_TILE, T, 0, FLASH_LOG2E);
            flash_load_row_values(D_s + (buf ^ 1) * FLASH_TILE, D_bh, u0 + FLASH_TILE, T, FLASH_TILE);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        uint32_t ds_t[FLASH_TILE / 16][4];  // (step 1: the dK dV kernel's tile) ds^T
        flash_dkdv_tile<HS>(dk, dv, ds_t, k, v_s, q_buf, dy_buf, lse_buf, D_buf, key0, u0, T, scale_log2);
        // (step 2) the warp's ds^T rows: A fragment kk holds columns 16 kk.. of rows g, g + 8
        // (the other warps read ds_s only after the barrier below, and were done with the last
        // tile's at the barrier that ended it)
        for (int kk = 0; kk < FLASH_TILE / 16; kk++) {
            uint32_t* row = (uint32_t*)(ds_s + (warp * FLASH_ROWS + g) * FLASH_LD(FLASH_TILE) + 16 * kk + 2 * t);
            row[0] = ds_t[kk][0], row[4] = ds_t[kk][2];  // (4 words: 8 columns on)
            row[4 * FLASH_LD(FLASH_TILE)] = ds_t[kk][1], row[4 * FLASH_LD(FLASH_TILE) + 4] = ds_t[kk][3];  // (8 rows on)
        }
        __syncthreads();  // every warp's ds^T is in
        // ds (the warp's 16 queries, the block's 64 keys) as A fragments: ds^T read transposed,
        // matrix i = queries 8 (i % 2).., keys 16 kk + 8 (i / 2)..
        uint32_t ds[FLASH_TILE / 16][4];
        for (int kk = 0; kk < FLASH_TILE / 16; kk++)
            ldmatrix_x4_trans(ds[kk], ds_s + (16 * kk + lane / 16 * 8 + lane % 8) * FLASH_LD(FLASH_TILE) +
                                          warp * FLASH_ROWS + lane / 8 % 2 * 8);
        float dq[HS / 8][4];
        for (int d = 0; d < HS / 8; d++) dq[d][0] = dq[d][1] = dq[d][2] = dq[d][3] = 0.0f;
        flash_p_x<HS, 1>(&dq, &ds, k_s);  // the share: ds k
        // (step 3) key blocks qt .. kb + 1, as many as the tiles walked so far, have added theirs
        flash_wait_turn(&turns[qt], tile);
        flash_dq_add_share<HS>(dqkv, dq_sums, dq, scale, tile == 0, kb == 0, b, h, NH, u0 + warp * FLASH_ROWS, T, C);
        __syncthreads();  // every warp's rows are in; every warp is done with ds_s and the buffers
        if (threadIdx.x == 0) st_release_gpu(&turns[qt], tile + 1);  // the next key block's turn
    }
    flash_store<HS>(dqkv, 3 * C, C, dk, scale, b, h, key0, T);
    flash_store<HS>(dqkv, 3 * C, 2 * C, dv, 1.0f, b, h, key0, T);
}

static DeviceScratch flash_scratch;

// LLMC_FLASH=wgmma (read once) asks for the wgmma kernels; they run where the build has them (an
// sm_90a build, which runs only on Hopper) and the head size is 64, and the calls that fell back
// to mma.sync are counted (paths_print)
static inline int flash_wgmma_asked(void) {
    static int asked = -1;
    if (asked < 0) asked = env_choice("LLMC_FLASH", 0) == 1;
    return asked;
}
static long flash_wgmma_calls[2];  // taken, fell back
// LLMC_FLASH_BACKWARD=one_kernel (read once) asks for the one-kernel backward (above); a call that
// LLMC_FLASH=wgmma takes is counted as fallen back
static inline int flash_one_kernel_asked(void) {
    static int asked = -1;
    if (asked < 0) asked = env_choice("LLMC_FLASH_BACKWARD", 0) == 1;
    return asked;
}
static long flash_one_kernel_calls[2];  // taken, fell back
static DeviceScratch flash_one_kernel_scratch;

// one launch of the one-kernel backward: its counters zeroed, then a block a (key block, head)
template <int HS>
static inline void flash_backward_one_kernel(floatX* dqkv, const floatX* dout, const floatX* qkv, const float* lse,
                                             const float* D, int B, int T, int C, int NH) {
    static int allowed = 0;  // (the kernel's dynamic shared memory, over 48 KB, allowed once)
    size_t shared = flash_one_kernel_shared_bytes<HS>();
    if (!allowed) {
        cudaCheck(cudaFuncSetAttribute(flash_attention_backward_one_kernel<HS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)shared));
        allowed = 1;
    }
    int nkb = ceil_div(T, FLASH_TILE);
    char* scratch = (char*)scratch_get(&flash_one_kernel_scratch, flash_one_kernel_scratch_bytes(B, T, NH, HS));
    float* dq_sums = (float*)scratch;
    int* counters = (int*)(scratch + (size_t)B * NH * T * HS * sizeof(float));
    cudaCheck(cudaMemset(counters, 0, ((size_t)B * NH * nkb + 1) * sizeof(int)));
    flash_attention_backward_one_kernel<HS><<<nkb * B * NH, FLASH_WARPS * 32, shared>>>(dqkv, dq_sums, counters, dout, qkv,
                                                                                         lse, D, B, T, C, NH);
    cudaCheckLaunch();
}

// out (B, T, C), lse (B, NH, T) from qkv (B, T, 3C); 128-query blocks
static inline void attention_forward_flash(floatX* out, float* lse, const floatX* qkv, int B, int T,
                                           int C, int NH) {
    int hs = C / NH, threads = FLASH_WARPS * 32;
    if (flash_wgmma_asked()) {
#if defined(LLMC_WGMMA)
        if (hs == 64) {
            flash_wgmma_calls[0]++;
            dim3 wg_grid(ceil_div(T, FLASH_WG_QUERIES), B * NH);
            flash_attention_forward_wgmma_kernel<<<wg_grid, FLASH_WG_WARPS * 32>>>(out, lse, qkv, B, T, C, NH);
            cudaCheckLaunch();
            return;
        }
#endif
        flash_wgmma_calls[1]++;
    }
    dim3 grid(ceil_div(T, FLASH_TILE * FLASH_Q_TILES), B * NH);
    if (hs == 16) flash_attention_forward_kernel<16, FLASH_Q_TILES><<<grid, threads>>>(out, lse, qkv, B, T, C, NH);
    else if (hs == 32) flash_attention_forward_kernel<32, FLASH_Q_TILES><<<grid, threads>>>(out, lse, qkv, B, T, C, NH);
    else flash_attention_forward_kernel<64, FLASH_Q_TILES><<<grid, threads>>>(out, lse, qkv, B, T, C, NH);
    cudaCheckLaunch();
}

// dqkv (B, T, 3C) (overwritten) from dout and out (B, T, C), qkv and the forward's lse
static inline void attention_backward_flash(floatX* dqkv, const floatX* dout, const floatX* qkv,
                                            const floatX* out, const float* lse, int B, int T,
                                            int C, int NH) {
    float* D = (float*)scratch_get(&flash_scratch, flash_scratch_bytes(B, T, NH));
    attention_row_dot(D, dout, out, B, T, C, NH);
    int hs = C / NH, threads = FLASH_WARPS * 32;
    if (flash_wgmma_asked()) {
#if defined(LLMC_WGMMA)
        if (hs == 64) {
            flash_wgmma_calls[0]++;
            dim3 wg_grid(ceil_div(T, FLASH_WG_QUERIES), B * NH);
            flash_attention_backward_dkdv_wgmma_kernel<<<wg_grid, FLASH_WG_WARPS * 32>>>(dqkv, dout, qkv, lse, D, B, T, C, NH);
            flash_attention_backward_dq_wgmma_kernel<<<wg_grid, FLASH_WG_WARPS * 32>>>(dqkv, dout, qkv, lse, D, B, T, C, NH);
            cudaCheckLaunch();
            if (flash_one_kernel_asked()) flash_one_kernel_calls[1]++;
            return;
        }
#endif
        flash_wgmma_calls[1]++;
    }
    if (flash_one_kernel_asked()) {
        flash_one_kernel_calls[0]++;
        if (hs == 16) flash_backward_one_kernel<16>(dqkv, dout, qkv, lse, D, B, T, C, NH);
        else if (hs == 32) flash_backward_one_kernel<32>(dqkv, dout, qkv, lse, D, B, T, C, NH);
        else flash_backward_one_kernel<64>(dqkv, dout, qkv, lse, D, B, T, C, NH);
        return;
    }
    dim3 grid(ceil_div(T, FLASH_TILE), B * NH);
    if (hs == 16) {
        flash_attention_backward_dkdv_kernel<16><<<grid, threads>>>(dqkv, dout, qkv, lse, D, B, T, C, NH);
        flash_attention_backward_dq_kernel<16><<<grid, threads>>>(dqkv, dout, qkv, lse, D, B, T, C, NH);
    } else if (hs == 32) {
        flash_attention_backward_dkdv_kernel<32><<<grid, threads>>>(dqkv, dout, qkv, lse, D, B, T, C, NH);
        flash_attention_backward_dq_kernel<32><<<grid, threads>>>(dqkv, dout, qkv, lse, D, B, T, C, NH);
    } else {
        flash_attention_backward_dkdv_kernel<64><<<grid, threads>>>(dqkv, dout, qkv, lse, D, B, T, C, NH);
        flash_attention_backward_dq_kernel<64><<<grid, threads>>>(dqkv, dout, qkv, lse, D, B, T, C, NH);
    }
    cudaCheckLaunch();
}

#endif  // !FLOATX_IS_FLOAT
#endif
