// The flash attention backward on Hopper's machinery (sm_90a, bf16, head size 64, causal): TMA
// loads through tensor maps into a ring of shared-memory slots guarded by mbarriers, a producer
// warp that only loads, consumer warpgroups that only compute (warp specialization, setmaxnreg),
// and wgmma with both operands of the score products in shared memory. FlashAttention-3 (Shah et
// al. 2024, arXiv:2407.08608): section 3.1's warp specialization and pingpong, applied to the
// backward pass its appendix describes.
//
// The same mathematics as the mma.sync and wgmma backward of flash_attention.cuh: from the
// forward's lse (B, NH, T) and D = dout . out (B, NH, T), each tile of probabilities is
// recomputed, p = exp(q k^T / sqrt(HS) - lse), and ds = p (dp - D) with dp = dout v^T.
//
// dK dV (flash_hopper_backward_dkdv_kernel): block (128 keys, b * NH + h), 3 warpgroups:
//   warpgroup 0, the producer (setmaxnreg_dec<40>: it needs few registers), warp 0 only: it walks
//     the query tiles u0 = the block's first key, + 64, ... to T: for each, it waits until the
//     ring slot tile % STAGES is free (mbarrier empty), and lane 0 loads q and dout into it by
//     TMA (mbarrier full: 16 KB announced by arrive.expect_tx; with the first tile also the
//     block's k and v, 4 tiles of (64, 64), loaded once); the 32 lanes copy the tile's 64 lse
//     (times log2 e) and D into the slot with ordinary loads and stores, and each arrives on full
//     after its stores (full counts 32 arrivals and the bytes). lse and D go by the lanes, not by
//     TMA, because a row of T floats is a multiple of 16 bytes, as a tensor map's stride must be,
//     only when T % 4 == 0 (the emulated checks run T = 37 too).
//   warpgroups 1 and 2, consumers 0 and 1 (setmaxnreg_inc<232>), keys group0 = block key 0 + 64 c
//     .. + 63, warp w % 4 its 16 of them; for each tile, after waiting on full:
//       s^T = k q^T and dp^T = v dout^T: 8 wgmma with A and B from shared memory (the k and v
//         tiles K-major as A, the q and dout tiles K-major as B: flash_desc_keys for both), one
//         commit group; no k or v fragments in registers at all, so ptxas cannot hand their
//         registers to other values across the loop (the copy flash_wg_copy_a makes in the
//         wgmma kernels of flash_attention.cuh is not needed);
//       p^T and ds^T in registers (mma's D layout = wgmma's; flash_key_probabilities);
//       dv += p^T dout, dk += ds^T q: 8 wgmma, A = p^T, ds^T as bf16 registers, B = the dout and q
//         tiles MN-major (flash_desc_values), one commit group;
//       then every consumer thread arrives on the slot's empty (count 256) after the wait for
//       the products that read the slot.
//   dk (times 1/sqrt(HS)) and dv go from registers to dqkv as in the other kernels.
// dQ (flash_hopper_backward_dq_kernel): the same machinery the other way: block (128 queries),
//   the producer loads its q and dout with the first key tile and streams the key tiles' k and v
//   through the ring; the consumers hold their rows' lse and D in registers, s = q k^T and
//   dp = dout v^T by wgmma from shared memory, ds in registers, dq += ds k (A = ds registers,
//   B = the k tile MN-major).
// These are VERSION 8 (dev/cuda/attention_backward v8). VERSION 9 adds pingpong (FlashAttention-3
// section 3.1, there in the forward): the two consumers take turns at the tensor cores through
// two named barriers (HOPPER_TURN + c: consumer c waits there, bar.sync, and the other arrives
// when its turn's products are issued, bar.arrive). A turn issues the previous tile's dv, dk (or
// dq) products and this tile's s^T, dp^T (or s, dp); after waiting for them the consumer computes
// this tile's p^T and ds^T while the other's turn keeps the tensor cores busy. A tile's slot is
// released one turn later, so v9's ring has 3 slots. Both versions give the same products in the
// same order: the same bits (the emulator checks v6's).
// dQ by a separate pass, not ordered accumulation: the choice. The dK dV kernel owns keys; its ds^T
// tile (keys x queries) gives dq = ds k only as a product whose rows are queries, so each key block
// would add a (64, 64) share into every query tile's dq: FlashAttention-3 adds them with fp32 atomics
// (another order, another sum, other bits on every run), and the one-kernel backward of
// flash_attention.cuh (LLMC_FLASH_BACKWARD=one_kernel) in a fixed order through an fp32 buffer in
// L2 and a counter per tile that a block waits on. Here that would need ds^T transposed through
// shared memory to become wgmma's A (the _ss wrapper of mma.cuh takes A K-major only), 16 KB of dq
// shares read and written a tile in L2, and turns between blocks that also stall the producer's
// ring. The separate pass recomputes s and dp (7 products a tile pair, not 5, and twice the
// exponentials) but needs nothing between blocks: every element of dqkv has one writer, the same
// bits on every run, as the two-kernel backward gives today, and each kernel is one readable
// loop on the same ring. (The one-kernel order's time on a GPU is still to be measured, issue 63
// item 6: if it wins there, the same handover can be added to this dK dV kernel later.)
//
// Roofline at d12 (B = 64, NH = 12, T = 1024): 136 (key tile, query tile) pairs a head, 7
// products of 2 * 64^3 FLOPs each: 383 GFLOP on the tensor cores (the dev/cuda report counts the
// 4 products of the textbook backward, 206 GFLOP), 0.39 ms at the H200's 989 TFLOP/s (dense
// bf16). DRAM at least qkv, dout, lse, D read and dqkv written, 0.71 GB, 0.15 ms at 4.8 TB/s:
// compute-bound (q, dout, k, v tiles re-read per block come from L2).
// Shared memory: 66,560 bytes a block in v8, 83,456 in v9 (dynamic: k, v (or q, dout) 32 KB, a
// ring of 2 or 3 slots of 16 KB and their lse and D, 512 bytes a slot), 1 block an SM (384
// threads: the launch bound's 168 registers a thread at the start, 40 and 232 after setmaxnreg:
// 128 x 40 + 256 x 232 = 64,512 of the 65,536; at 24 the producer's loop spilled 24 bytes).
// v9's turns take named barriers by a run-time id (HOPPER_TURN + c), so ptxas reserves all 16 of
// an SM's: harmless at 1 block an SM.
#ifndef LLMC_CUDA_FLASH_HOPPER_BACKWARD_CUH
#define LLMC_CUDA_FLASH_HOPPER_BACKWARD_CUH

#include "flash_attention.cuh"

#if defined(LLMC_WGMMA) && !FLOATX_IS_FLOAT

#define HOPPER_BWD_THREADS 384               // a producer warpgroup, two consumer warpgroups
#define HOPPER_TILE_ELEMS (FLASH_TILE * 64)  // a (64, 64) bf16 tile: 8 KB
#define HOPPER_TILE_BYTES (HOPPER_TILE_ELEMS * (int)sizeof(floatX))
// ring slots (q and dout, or k and v, of one tile each): v9's consumers hold a tile's slot until
// their next turn, so a third slot keeps the producer a tile ahead
#define HOPPER_BWD_STAGES(VERSION) ((VERSION) == 9 ? 3 : 2)
// dynamic shared memory: 4 tiles held the whole block (k, v of both warpgroups; or q, dout), the
// ring's 2 tiles a slot, and a slot's 64 lse and 64 D
#define HOPPER_BWD_SHARED(VERSION) \
    (4 * HOPPER_TILE_BYTES + HOPPER_BWD_STAGES(VERSION) * (2 * HOPPER_TILE_BYTES + 2 * FLASH_TILE * (int)sizeof(float)))
// v9's named barriers: consumer c (0, 1) waits on HOPPER_TURN + c for its turn at the tensor cores
#define HOPPER_TURN 1

// a (64, 64) tile of a tensor map's rows row0.., columns col0.. (a head's 64) into the interleaved
// layout of flash_core_offset, by 8 TMA boxes of (64 rows, 8 columns = 16 bytes): in that layout the
// 64 rows of one 8-column group are 64 rows of 16 bytes one after the other, exactly what a box
// lands (row after row), 512 elements per group. The bytes count against bar.
__device__ inline void hopper_load_tile(floatX* tile, const CUtensorMap* map, int col0, int row0, uint64_t* bar) {
    for (int cg = 0; cg < 8; cg++) tma_load_2d(tile + flash_core_offset<FLASH_TILE>(0, 8 * cg), map, col0 + 8 * cg, row0, bar);
}

// d (the warpgroup's 64 rows, 64) = a b^T over HS = 64, both (64, 64) interleaved tiles in shared
// memory, both K-major (a row's 64 values adjacent by 8s): 4 wgmma over k16 steps
__device__ inline void hopper_a_bt(float (*d)[4], const floatX* a, const floatX* b) {
    for (int kk = 0; kk < 4; kk++) wgmma_m64n64k16_ss<0>(&d[0][0], flash_desc_keys(a, kk), flash_desc_keys(b, kk), kk > 0);
}

// where a dK dV block's tiles lie in its dynamic shared memory: k, v of both consumers (held), then
// the ring's STAGES slots of q, dout and their 64 lse (base 2) and D
struct HopperDkdvShared {
    floatX *k, *v, *q, *dy;  // [2], [2], [STAGES], [STAGES] tiles
    float *lse, *D;          // [STAGES][64]
};
template <int STAGES>
__device__ inline HopperDkdvShared hopper_dkdv_shared(void* smem) {
    HopperDkdvShared m;
    m.k = (floatX*)smem;
    m.v = m.k + 2 * HOPPER_TILE_ELEMS;
    m.q = m.v + 2 * HOPPER_TILE_ELEMS;
    m.dy = m.q + STAGES * HOPPER_TILE_ELEMS;
    m.lse = (float*)(m.dy + STAGES * HOPPER_TILE_ELEMS);
    m.D = m.lse + STAGES * FLASH_TILE;
    return m;
}
// and a dQ block's: q, dout of both consumers (held), then the ring's slots of k and v
struct HopperDqShared {
    floatX *q, *dy, *k, *v;  // [2], [2], [STAGES], [STAGES] tiles
};
template <int STAGES>
__device__ inline HopperDqShared hopper_dq_shared(void* smem) {
    HopperDqShared m;
    m.q = (floatX*)smem;
    m.dy = m.q + 2 * HOPPER_TILE_ELEMS;
    m.k = m.dy + 2 * HOPPER_TILE_ELEMS;
    m.v = m.k + STAGES * HOPPER_TILE_ELEMS;
    return m;
}

// the ring's barriers, made by one thread before anyone uses them
template <int STAGES>
__device__ inline void hopper_init_barriers(uint64_t* full, uint64_t* empty) {
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) {
            mbarrier_init(&full[s], 32);    // the producer warp's lanes (lane 0's with the bytes)
            mbarrier_init(&empty[s], 256);  // every consumer thread
        }
        mbarrier_init_fence();
    }
    __syncthreads();
}

// where tiles land in shared memory, and the tensor map and column (a head's first) they come from
struct HopperTiles {
    floatX* s;
    const CUtensorMap* map;
    int col;
};

// The producer warp, its 32 lanes. Lane 0 loads `tiles` tiles of x and y (q and dout, or k and v)
// into the ring, tile i at rows row + ring0 + 64 i, and with the first the block's own rows (rows
// row + block0 + 64 w, w = 0, 1: a and b, the k and v of dK dV or the q and dout of dQ); with
// lse_bh (dK dV) the lanes copy each tile's 64 lse (times log2 e) and D, before their arrivals.
template <int STAGES>
__device__ inline void hopper_produce(HopperTiles a, HopperTiles b, HopperTiles x, HopperTiles y, int row, int block0,
                                      int ring0, int tiles, uint64_t* full, uint64_t* empty, float* lse_s,
                                      float* D_s, const float* lse_bh, const float* D_bh, int T) {
    int lane = threadIdx.x % 32;
    // rows of the maps are tokens b T + t: a tile's rows past T are the next sequence's (or TMA's
    // zeros past the tensor), finite values whose probabilities the consumers mask to 0
    for (int tile = 0; tile < tiles; tile++) {
        int slot = tile % STAGES, t0 = ring0 + tile * FLASH_TILE;
        mbarrier_wait(&empty[slot], ((tile / STAGES) & 1) ^ 1);  // the slot's last tile was read
        if (lse_bh != NULL) {
            for (int i = lane; i < FLASH_TILE; i += 32) {
                lse_s[slot * FLASH_TILE + i] = t0 + i < T ? lse_bh[t0 + i] * FLASH_LOG2E : 0.0f;
                D_s[slot * FLASH_TILE + i] = t0 + i < T ? D_bh[t0 + i] : 0.0f;
            }
        }
        if (lane == 0) {
            // the block's own rows ride with the first tile: their bytes count in its phase, and
            // the consumers' first wait on full covers them. (With an mbarrier of their own the
            // emulator could not catch its wait missing: the loads, issued before tile 0's, land
            // before any consumer passes that wait, in either order; the sweep missed it.)
            mbarrier_arrive_expect_tx(&full[slot], (tile == 0 ? 6 : 2) * HOPPER_TILE_BYTES);
            for (int w = 0; w < 2 && tile == 0; w++) {
                hopper_load_tile(a.s + w * HOPPER_TILE_ELEMS, a.map, a.col, row + block0 + 64 * w, &full[0]);
                hopper_load_tile(b.s + w * HOPPER_TILE_ELEMS, b.map, b.col, row + block0 + 64 * w, &full[0]);
            }
            hopper_load_tile(x.s + slot * HOPPER_TILE_ELEMS, x.map, x.col, row + t0, &full[slot]);
            hopper_load_tile(y.s + slot * HOPPER_TILE_ELEMS, y.map, y.col, row + t0, &full[slot]);
        } else {
            mbarrier_arrive(&full[slot]);  // (after this lane's stores of lse and D)
        }
    }
}

// One query tile of a dK dV consumer, its first products: s^T = k q^T and dp^T = v dout^T, both
// operands from shared memory (issued, not waited for)
__device__ inline void hopper_dkdv_scores(float (*s)[4], float (*dp)[4], const floatX* k_tile, const floatX* v_tile,
                                          const floatX* q_tile, const floatX* dy_tile) {
    hopper_a_bt(s, k_tile, q_tile);    // s^T = k q^T
    hopper_a_bt(dp, v_tile, dy_tile);  // dp^T = v dout^T
}
// then, in registers: p^T (into p) and ds^T = p^T (dp^T - D) (into ds), as bf16 A fragments; p is 0
// for a query past len and, with `causal`, a query before its key
__device__ inline void hopper_dkdv_gradients(uint32_t (*p)[4], uint32_t (*ds)[4], float (*s)[4], const float (*dp)[4],
                                             const float* lse_tile, const float* D_tile, int key0, int u0, int len,
                                             float scale_log2, bool causal = true) {
    int t = threadIdx.x % 4;  // the lane's place in its group (mma.cuh)
    flash_key_probabilities(s, lse_tile, key0, u0, len, scale_log2, causal);  // p^T
    flash_scores_to_a(p, s);
    for (int j = 0; j < FLASH_TILE / 8; j++)
        for (int e = 0; e < 4; e++) s[j][e] *= dp[j][e] - D_tile[8 * j + 2 * t + e % 2];
    flash_scores_to_a(ds, s);
}

// v9's dK dV consumer c (0, 1): its turns over the ring's query tiles u0 = query0 + 64 tile ..,
// tiles of them, into dk, dv (its keys group0 .., this warp's key0 ..); the probabilities 0 for a
// query past len and, with `causal`, before its key. The trainer's kernel passes T and causal; a
// ring's chunk pair (ring_attention.cuh) its chunk's len and whether the pair is diagonal.
template <int STAGES>
__device__ inline void hopper_dkdv_turns(float (*dk)[4], float (*dv)[4], const floatX* k_tile, const floatX* v_tile,
                                         const floatX* q_s, const floatX* dy_s, const float* lse_s, const float* D_s,
                                         uint64_t* full, uint64_t* empty, int c, int tiles, int query0, int group0,
                                         int key0, int len, bool causal, float scale_log2) {
    const int HS = 64;
    // v9, pingpong: a turn of consumer c issues tile i - 1's dv, dk products and tile i's s^T,
    // dp^T products in one group, then lets the other consumer take its turn (named barrier
    // HOPPER_TURN + 1 - c, bar.arrive) and waits for its products; its exponentials and ds^T
    // for tile i then run while the other's products occupy the tensor cores. Consumer 0 takes
    // the first turn (consumer 1 arrives on its barrier first); tiles + 1 turns each (the last
    // only tile tiles - 1's dv, dk); consumer 1 does not hand over after its last. A tile's
    // slot is released after the turn that read it last, the next one.
    uint32_t p[FLASH_TILE / 16][4], ds[FLASH_TILE / 16][4];  // the previous tile's p^T and ds^T
    int previous_active = 0;
    if (c == 1) named_barrier_arrive(HOPPER_TURN + 0, 256);
    for (int tile = 0; tile <= tiles; tile++) {
        int slot = tile % STAGES, previous = (tile + STAGES - 1) % STAGES, u0 = query0 + tile * FLASH_TILE;
        int active = tile < tiles && (!causal || u0 + FLASH_TILE - 1 >= group0) && group0 < len;  // its keys see some
        if (tile < tiles) mbarrier_wait(&full[slot], (tile / STAGES) & 1);
        float s[FLASH_TILE / 8][4], dp[FLASH_TILE / 8][4];
        named_barrier_sync(HOPPER_TURN + c, 256);  // this consumer's turn at the tensor cores
        if (previous_active) {
            wgmma_pin(&dv[0][0], HS / 2);
            wgmma_pin(&dk[0][0], HS / 2);
            wgmma_fence();
            flash_wg_p_x(dv, p, dy_s + previous * HOPPER_TILE_ELEMS);  // dv += p^T dout (tile - 1)
            flash_wg_p_x(dk, ds, q_s + previous * HOPPER_TILE_ELEMS);  // dk += ds^T q (tile - 1)
            wgmma_commit();
        }
        if (active) {
            wgmma_fence();
            hopper_dkdv_scores(s, dp, k_tile, v_tile, q_s + slot * HOPPER_TILE_ELEMS, dy_s + slot * HOPPER_TILE_ELEMS);
            wgmma_commit();
        }
        if (c == 0 || tile < tiles) named_barrier_arrive(HOPPER_TURN + 1 - c, 256);  // the other's turn
        wgmma_wait<0>();
        wgmma_pin(&dv[0][0], HS / 2);
        wgmma_pin(&dk[0][0], HS / 2);
        wgmma_pin(&s[0][0], FLASH_TILE / 2);
        wgmma_pin(&dp[0][0], FLASH_TILE / 2);
        if (tile > 0) mbarrier_arrive(&empty[previous]);  // tile - 1's slot has been read
        if (active)
            hopper_dkdv_gradients(p, ds, s, dp, lse_s + slot * FLASH_TILE, D_s + slot * FLASH_TILE, key0, u0, len,
                                  scale_log2, causal);
        previous_active = active;
    }
}

// dK dV: block (128 keys, b * NH + h); see the top of the file. VERSION 8: each consumer warpgroup
// on its own; 9: the two in turns (pingpong)
template <int VERSION>
__global__ void __launch_bounds__(HOPPER_BWD_THREADS, 1)
flash_hopper_backward_dkdv_kernel(floatX* dqkv, const __grid_constant__ CUtensorMap qkv_map,
                                  const __grid_constant__ CUtensorMap dout_map, const float* lse, const float* D,
                                  int B, int T, int C, int NH) {
    const int HS = 64, STAGES = HOPPER_BWD_STAGES(VERSION);
    extern __shared__ __align__(128) floatX hopper_smem[];
    __shared__ __align__(8) uint64_t full[HOPPER_BWD_STAGES(VERSION)], empty[HOPPER_BWD_STAGES(VERSION)];
    HopperDkdvShared m = hopper_dkdv_shared<STAGES>(hopper_smem);
    floatX *k_s = m.k, *v_s = m.v, *q_s = m.q, *dy_s = m.dy;
    float *lse_s = m.lse, *D_s = m.D;
    int group = threadIdx.x / 128, warp = threadIdx.x / 32;
    int b = blockIdx.y / NH, h = blockIdx.y % NH;
    int block_key0 = blockIdx.x * 2 * FLASH_TILE;  // the first keys see the most queries: first
    int tiles = (T - block_key0 + FLASH_TILE - 1) / FLASH_TILE;  // causal: queries from the first key on
    hopper_init_barriers<STAGES>(full, empty);
    if (group == 0) {  // the producer
        setmaxnreg_dec<40>();
        if (warp == 0)
            hopper_produce<STAGES>({k_s, &qkv_map, C + h * HS}, {v_s, &qkv_map, 2 * C + h * HS}, {q_s, &qkv_map, h * HS},
                                   {dy_s, &dout_map, h * HS}, b * T, block_key0, block_key0, tiles, full, empty,
                                   lse_s, D_s, lse + ((size_t)b * NH + h) * T, D + ((size_t)b * NH + h) * T, T);
        return;
    }
    setmaxnreg_inc<232>();
    int c = group - 1;  // the consumer: 0 or 1
    int group0 = block_key0 + 64 * c, key0 = group0 + 16 * (warp % 4);
    const floatX* k_tile = k_s + c * HOPPER_TILE_ELEMS;
    const floatX* v_tile = v_s + c * HOPPER_TILE_ELEMS;
    float scale = rsqrtf((float)HS), scale_log2 = scale * FLASH_LOG2E;
    float dk[HS / 8][4], dv[HS / 8][4];
    for (int d = 0; d < HS / 8; d++)
        for (int e = 0; e < 4; e++) dk[d][e] = dv[d][e] = 0.0f;
    if (VERSION == 8) {
        for (int tile = 0; tile < tiles; tile++) {
            int slot = tile % STAGES, u0 = block_key0 + tile * FLASH_TILE;
            const floatX* q_tile = q_s + slot * HOPPER_TILE_ELEMS;
            const floatX* dy_tile = dy_s + slot * HOPPER_TILE_ELEMS;
            mbarrier_wait(&full[slot], (tile / STAGES) & 1);  // q, dout, lse, D of the tile (and k, v) are there
            if (u0 + FLASH_TILE - 1 >= group0 && group0 < T) {  // the warpgroup's keys see some of these queries
                float s[FLASH_TILE / 8][4], dp[FLASH_TILE / 8][4];  // s^T then p^T then ds^T; dp^T
                wgmma_fence();
                hopper_dkdv_scores(s, dp, k_tile, v_tile, q_tile, dy_tile);
                wgmma_commit();
                wgmma_wait<0>();
                wgmma_pin(&s[0][0], FLASH_TILE / 2);
                wgmma_pin(&dp[0][0], FLASH_TILE / 2);
                uint32_t p[FLASH_TILE / 16][4], ds[FLASH_TILE / 16][4];
                hopper_dkdv_gradients(p, ds, s, dp, lse_s + slot * FLASH_TILE, D_s + slot * FLASH_TILE, key0, u0, T,
                                      scale_log2);
                wgmma_pin(&dv[0][0], HS / 2);
                wgmma_pin(&dk[0][0], HS / 2);
                wgmma_fence();
                flash_wg_p_x(dv, p, dy_tile);  // dv += p^T dout
                flash_wg_p_x(dk, ds, q_tile);  // dk += ds^T q
                wgmma_commit();
                wgmma_wait<0>();
                wgmma_pin(&dv[0][0], HS / 2);
                wgmma_pin(&dk[0][0], HS / 2);
            }
            mbarrier_arrive(&empty[slot]);  // this thread's products have read the slot
        }
    } else {
        hopper_dkdv_turns<STAGES>(dk, dv, k_tile, v_tile, q_s, dy_s, lse_s, D_s, full, empty, c, tiles, block_key0, group0,
                                  key0, T, true, scale_log2);  // v9: the two in turns (pingpong)
    }
    flash_store<HS>(dqkv, 3 * C, C, dk, scale, b, h, key0, T);
    flash_store<HS>(dqkv, 3 * C, 2 * C, dv, 1.0f, b, h, key0, T);
}

// One key tile of a dQ consumer, its first products: s = q k^T and dp = dout v^T (issued)
__device__ inline void hopper_dq_scores(float (*s)[4], float (*dp)[4], const floatX* q_tile, const floatX* dy_tile,
                                        const floatX* k_tile, const floatX* v_tile) {
    hopper_a_bt(s, q_tile, k_tile);    // s = q k^T
    hopper_a_bt(dp, dy_tile, v_tile);  // dp = dout v^T
}
// then ds = p (dp - D) as bf16 A fragments (p 0 for a key past len; with `causal`, after its query)
__device__ inline void hopper_dq_gradients(uint32_t (*ds)[4], float (*s)[4], const float (*dp)[4], const float* lse_log2,
                                           const float* D_row, int row0, int k0, int len, float scale_log2,
                                           bool causal = true) {
    flash_query_probabilities(s, lse_log2, row0, k0, len, scale_log2, causal);  // p
    for (int j = 0; j < FLASH_TILE / 8; j++)
        for (int e = 0; e < 4; e++) s[j][e] *= dp[j][e] - D_row[e / 2];
    flash_scores_to_a(ds, s);
}

// v9's dQ consumer c (0, 1): the turns of hopper_dkdv_turns over the ring's key tiles k0 = 64 tile ..,
// tiles of them, with tile - 1's dq += ds k, into dq (its queries group0 .., this warp's row0 ..);
// the probabilities 0 for a key past len and, with `causal`, after its query
template <int STAGES>
__device__ inline void hopper_dq_turns(float (*dq)[4], const floatX* q_tile, const floatX* dy_tile, const floatX* k_s,
                                       const floatX* v_s, const float* lse_log2, const float* D_row, uint64_t* full,
                                       uint64_t* empty, int c, int tiles, int group0, int row0, int len, bool causal,
                                       float scale_log2) {
    const int HS = 64;
    uint32_t ds[FLASH_TILE / 16][4];
    int previous_active = 0;
    if (c == 1) named_barrier_arrive(HOPPER_TURN + 0, 256);
    for (int tile = 0; tile <= tiles; tile++) {
        int slot = tile % STAGES, previous = (tile + STAGES - 1) % STAGES, k0 = tile * FLASH_TILE;
        int active = tile < tiles && (!causal || k0 <= group0 + 63) && group0 < len;
        if (tile < tiles) mbarrier_wait(&full[slot], (tile / STAGES) & 1);
        float s[FLASH_TILE / 8][4], dp[FLASH_TILE / 8][4];
        named_barrier_sync(HOPPER_TURN + c, 256);
        if (previous_active) {
            wgmma_pin(&dq[0][0], HS / 2);
            wgmma_fence();
            flash_wg_p_x(dq, ds, k_s + previous * HOPPER_TILE_ELEMS);  // dq += ds k (tile - 1)
            wgmma_commit();
        }
        if (active) {
            wgmma_fence();
            hopper_dq_scores(s, dp, q_tile, dy_tile, k_s + slot * HOPPER_TILE_ELEMS, v_s + slot * HOPPER_TILE_ELEMS);
            wgmma_commit();
        }
        if (c == 0 || tile < tiles) named_barrier_arrive(HOPPER_TURN + 1 - c, 256);
        wgmma_wait<0>();
        wgmma_pin(&dq[0][0], HS / 2);
        wgmma_pin(&s[0][0], FLASH_TILE / 2);
        wgmma_pin(&dp[0][0], FLASH_TILE / 2);
        if (tile > 0) mbarrier_arrive(&empty[previous]);
        if (active) hopper_dq_gradients(ds, s, dp, lse_log2, D_row, row0, k0, len, scale_log2, causal);
        previous_active = active;
    }
}

// dQ: block (128 queries, b * NH + h), the longest blocks first; consumer c (0, 1) owns queries
// group0 = q0 + 64 c .. + 63 and walks the key tiles up to its causal limit (VERSION as dK dV's)
template <int VERSION>
__global__ void __launch_bounds__(HOPPER_BWD_THREADS, 1)
flash_hopper_backward_dq_kernel(floatX* dqkv, const __grid_constant__ CUtensorMap qkv_map,
                                const __grid_constant__ CUtensorMap dout_map, const float* lse, const float* D,
                                int B, int T, int C, int NH) {
    const int HS = 64, STAGES = HOPPER_BWD_STAGES(VERSION);
    extern __shared__ __align__(128) floatX hopper_smem[];
    __shared__ __align__(8) uint64_t full[HOPPER_BWD_STAGES(VERSION)], empty[HOPPER_BWD_STAGES(VERSION)];
    HopperDqShared m = hopper_dq_shared<STAGES>(hopper_smem);
    floatX *q_s = m.q, *dy_s = m.dy, *k_s = m.k, *v_s = m.v;
    int group = threadIdx.x / 128, warp = threadIdx.x / 32;
    int b = blockIdx.y / NH, h = blockIdx.y % NH;
    int q0 = (gridDim.x - 1 - blockIdx.x) * 2 * FLASH_TILE;
    int tiles = (min(q0 + 2 * FLASH_TILE, T) + FLASH_TILE - 1) / FLASH_TILE;  // causal: keys up to the last query
    hopper_init_barriers<STAGES>(full, empty);
    if (group == 0) {  // the producer (no lse, D: the consumers hold their rows' in registers)
        setmaxnreg_dec<40>();
        if (warp == 0)
            hopper_produce<STAGES>({q_s, &qkv_map, h * HS}, {dy_s, &dout_map, h * HS}, {k_s, &qkv_map, C + h * HS},
                                   {v_s, &qkv_map, 2 * C + h * HS}, b * T, q0, 0, tiles, full, empty, NULL,
                                   NULL, NULL, NULL, T);
        return;
    }
    setmaxnreg_inc<232>();
    int c = group - 1;
    int group0 = q0 + 64 * c, row0 = group0 + 16 * (warp % 4);
    const floatX* q_tile = q_s + c * HOPPER_TILE_ELEMS;
    const floatX* dy_tile = dy_s + c * HOPPER_TILE_ELEMS;
    float scale = rsqrtf((float)HS), scale_log2 = scale * FLASH_LOG2E;
    float lse_log2[2], D_row[2];  // rows g, g + 8 of the warp's 16
    flash_row_statistics(lse_log2, D_row, lse, D, b, h, NH, row0, T);
    float dq[HS / 8][4];
    for (int d = 0; d < HS / 8; d++) dq[d][0] = dq[d][1] = dq[d][2] = dq[d][3] = 0.0f;
    if (VERSION == 8) {
        for (int tile = 0; tile < tiles; tile++) {
            int slot = tile % STAGES, k0 = tile * FLASH_TILE;
            const floatX* k_tile = k_s + slot * HOPPER_TILE_ELEMS;
            mbarrier_wait(&full[slot], (tile / STAGES) & 1);
            if (k0 <= group0 + 63 && group0 < T) {
                float s[FLASH_TILE / 8][4], dp[FLASH_TILE / 8][4];  // s then p then ds; dp
                wgmma_fence();
                hopper_dq_scores(s, dp, q_tile, dy_tile, k_tile, v_s + slot * HOPPER_TILE_ELEMS);
                wgmma_commit();
                wgmma_wait<0>();
                wgmma_pin(&s[0][0], FLASH_TILE / 2);
                wgmma_pin(&dp[0][0], FLASH_TILE / 2);
                uint32_t ds[FLASH_TILE / 16][4];
                hopper_dq_gradients(ds, s, dp, lse_log2, D_row, row0, k0, T, scale_log2);
                wgmma_pin(&dq[0][0], HS / 2);
                wgmma_fence();
                flash_wg_p_x(dq, ds, k_tile);  // dq += ds k
                wgmma_commit();
                wgmma_wait<0>();
                wgmma_pin(&dq[0][0], HS / 2);
            }
            mbarrier_arrive(&empty[slot]);
        }
    } else {  // v9: the two in turns (pingpong)
        hopper_dq_turns<STAGES>(dq, q_tile, dy_tile, k_s, v_s, lse_log2, D_row, full, empty, c, tiles, group0, row0, T, true,
                                scale_log2);
    }
    flash_store<HS>(dqkv, 3 * C, 0, dq, scale, b, h, row0, T);
}

// dqkv (B, T, 3C) (overwritten) from dout and out (B, T, C), qkv and the forward's lse: the
// contract of attention_backward_flash (flash_attention.cuh), which takes the head sizes other
// than 64. The tensor maps hold the pointers, so they are made on each call (host work only).
// VERSION 8 or 9 (dev/cuda/attention_backward's); attention_backward_flash_hopper runs v9.
template <int VERSION>
static inline void attention_backward_flash_hopper_version(floatX* dqkv, const floatX* dout, const floatX* qkv,
                                                           const floatX* out, const float* lse, int B, int T, int C, int NH) {
    if (C / NH != 64) {
        attention_backward_flash(dqkv, dout, qkv, out, lse, B, T, C, NH);
        return;
    }
    float* D = (float*)scratch_get(&flash_scratch, flash_scratch_bytes(B, T, NH));
    attention_row_dot(D, dout, out, B, T, C, NH);
    static int allowed = 0;  // (the kernels' dynamic shared memory, over 48 KB, allowed once)
    const int shared = HOPPER_BWD_SHARED(VERSION);
    if (!allowed) {
        cudaCheck(cudaFuncSetAttribute(flash_hopper_backward_dkdv_kernel<VERSION>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       shared));
        cudaCheck(cudaFuncSetAttribute(flash_hopper_backward_dq_kernel<VERSION>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       shared));
        allowed = 1;
    }
    // boxes of (64 rows, 8 columns): the tiles' column groups (hopper_load_tile)
    CUtensorMap qkv_map, dout_map;
    tma_map_2d(&qkv_map, qkv, B * T, 3 * C, 3 * C, FLASH_TILE, 8);
    tma_map_2d(&dout_map, dout, B * T, C, C, FLASH_TILE, 8);
    dim3 grid(ceil_div(T, 2 * FLASH_TILE), B * NH);
    flash_hopper_backward_dkdv_kernel<VERSION><<<grid, HOPPER_BWD_THREADS, shared>>>(dqkv, qkv_map, dout_map, lse, D, B, T, C, NH);
    flash_hopper_backward_dq_kernel<VERSION><<<grid, HOPPER_BWD_THREADS, shared>>>(dqkv, qkv_map, dout_map, lse, D, B, T, C, NH);
    cudaCheckLaunch();
}
static inline void attention_backward_flash_hopper(floatX* dqkv, const floatX* dout, const floatX* qkv, const floatX* out,
                                                   const float* lse, int B, int T, int C, int NH) {
    attention_backward_flash_hopper_version<9>(dqkv, dout, qkv, out, lse, B, T, C, NH);
}

#endif  // LLMC_WGMMA && !FLOATX_IS_FLOAT
#endif
