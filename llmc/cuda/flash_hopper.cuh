// Flash attention forward on Hopper (sm_90a builds, bf16, head size 64, causal): FlashAttention-3's
// machinery (Shah et al. 2024, arXiv:2407.08608) one rung at a time, on the wgmma kernel of
// flash_attention.cuh (dev/cuda/attention_forward's v7: products on wgmma, tiles by cp.async):
//   v8  TMA: k and v tiles loaded by the tensor memory accelerator into a ring of
//       FLASH_HOPPER_STAGES shared-memory slots, each slot with a "full" and an "empty" mbarrier
//       (dev/cuda/tma.cu's ring); q loaded once by TMA and read by wgmma from shared memory too
//       (wgmma_m64n64k16_ss), so no q fragments in registers. Every warp computes; one thread also
//       issues the loads, STAGES tiles ahead.
//   v9  warp specialization: a producer warpgroup only loads (its registers given back,
//       setmaxnreg_dec), two consumer warpgroups only compute (setmaxnreg_inc). (FA3 section 3.1)
//   v10 pingpong: the two consumer warpgroups take turns at the tensor cores, ordered by two named
//       barriers, so that one's softmax runs while the other's products do. (FA3 section 3.1)
//   v11 intra-warpgroup overlap: a warpgroup issues tile j's q k^T and tile j-1's p v together and
//       waits for the first only (wgmma_wait<1>): tile j's softmax runs under tile j-1's p v.
//       (FA3 section 3.2) attention_forward_flash_hopper launches it.
// The same algorithm as the other flash forwards: 64-key tiles, the online softmax of
// flash_online_softmax (base 2, the rescale only when a row's max grows by more than
// FLASH_RESCALE_SLACK), only the diagonal tile and the tile past T masked, out (B, T, C) and lse
// (B, NH, T) written by flash_forward_finish: the same results as attention_forward_flash.
//
// TMA and the interleaved layout. qkv (B, T, 3C) is one tensor map: a (B T, 3C) matrix of bf16,
// boxes of 64 rows x 8 columns (16 bytes a row, 1 KB a box, landing row after row). A box is then
// exactly one column group of wgmma's interleaved layout (flash_core_offset: 8 x 8 core matrices,
// those of one 8 columns stacked down the rows), so a (64, 64) tile of q, k or v is 8 boxes side by
// side, and flash_desc_keys / flash_desc_values describe it as before. (One box a tile would need
// the 128-byte swizzle, CU_TENSOR_MAP_SWIZZLE_128B, with the descriptors' swizzle bits: not here.)
// Rows past the tensor's end come in as zeros; rows past T of batch b are batch b + 1's first
// tokens: keys there are masked (key >= T), queries there are computed and never stored.
#ifndef LLMC_CUDA_FLASH_HOPPER_CUH
#define LLMC_CUDA_FLASH_HOPPER_CUH

#include "flash_attention.cuh"

#if defined(LLMC_WGMMA) && !FLOATX_IS_FLOAT

#define FLASH_HOPPER_STAGES 4                              // ring slots, each a key tile's k and v
#define FLASH_HOPPER_QUERIES 128                           // a block: 2 warpgroups of 64 queries
#define FLASH_HOPPER_TILE (FLASH_TILE * 64)                // elements of a (64, 64) tile
#define FLASH_HOPPER_TILE_BYTES (FLASH_HOPPER_TILE * 2)    // 8 KB
#define FLASH_HOPPER_PRODUCER_REGS 40   // setmaxnreg: 128 x 40 + 256 x 232 = 64,512 of 65,536
#define FLASH_HOPPER_CONSUMER_REGS 232

// a block's tiles (dynamic shared memory: 80 KB, past the 48 KB a static array may take), every
// tile 128-byte aligned as TMA's destinations must be
struct FlashHopperTiles {
    floatX q[2][FLASH_HOPPER_TILE];                         // each warpgroup's 64 queries
    floatX kv[FLASH_HOPPER_STAGES][2][FLASH_HOPPER_TILE];  // the ring: slot s holds k, then v
};

// where a block is: (b, h), its first query q0 (the last queries see the most keys: their blocks
// start first, as in the other flash forwards), and the key tiles it needs of the len keys (causal:
// up to its last query; not causal, as a ring's whole chunk pair: all); a warpgroup w of it owns
// queries q0 + 64 w ..
struct FlashHopperBlock {
    int b, h, q0, tiles;
};
__device__ inline FlashHopperBlock flash_hopper_block(int len, int NH, bool causal = true) {
    FlashHopperBlock k;
    k.b = blockIdx.y / NH;
    k.h = blockIdx.y % NH;
    k.q0 = (gridDim.x - 1 - blockIdx.x) * FLASH_HOPPER_QUERIES;
    k.tiles = ((causal ? min(k.q0 + FLASH_HOPPER_QUERIES, len) : len) + FLASH_TILE - 1) / FLASH_TILE;
    return k;
}

// the ring's mbarriers and q's, made by one thread before anyone uses them:
//   full[s]   count 1: the loading thread arrives announcing the 16 KB of k and v (expect_tx); the
//             phase completes when they have landed. Tile t is slot t % STAGES's (t / STAGES)-th
//             fill: its phase has parity (t / STAGES) % 2.
//   empty[s]  count `readers`: every consumer thread arrives once it is done with the slot; a
//             refill waits for the phase before (a fresh barrier's parity-1 phase counts as done).
//   q_full    count 1: the two warpgroups' q tiles, 16 KB, loaded once.
__device__ inline void flash_hopper_init(uint64_t* full, uint64_t* empty, uint64_t* q_full, int readers) {
    if (threadIdx.x == 0) {
        for (int s = 0; s < FLASH_HOPPER_STAGES; s++) {
            mbarrier_init(&full[s], 1);
            mbarrier_init(&empty[s], readers);
        }
        mbarrier_init(q_full, 1);
        mbarrier_init_fence();
    }
    __syncthreads();
}

// a (64, 64) tile of the (B T, 3C) matrix, rows row0.., columns col0.., into the interleaved
// layout: 8 boxes of (64 rows, 8 columns), box i at column group i; bar's phase counts the bytes
__device__ inline void flash_hopper_load_tile(floatX* tile, const CUtensorMap* map, int col0, int row0, uint64_t* bar) {
    for (int i = 0; i < 8; i++) tma_load_2d(tile + flash_core_offset<FLASH_TILE>(0, 8 * i), map, col0 + 8 * i, row0, bar);
}
// the block's queries: warpgroup w's 64 into tiles.q[w]
__device__ inline void flash_hopper_load_q(FlashHopperTiles& tiles, const CUtensorMap* map, uint64_t* q_full,
                                           const FlashHopperBlock& k, int T) {
    mbarrier_arrive_expect_tx(q_full, 2 * FLASH_HOPPER_TILE_BYTES);
    for (int w = 0; w < 2; w++) flash_hopper_load_tile(tiles.q[w], map, k.h * 64, k.b * T + k.q0 + 64 * w, q_full);
}
// key tile t (keys 64 t..) into slot t % STAGES, once the slot's previous tile has been read
__device__ inline void flash_hopper_load_kv(FlashHopperTiles& tiles, const CUtensorMap* map, uint64_t* full,
                                            uint64_t* empty, int t, const FlashHopperBlock& k, int T, int C) {
    int slot = t % FLASH_HOPPER_STAGES, row = k.b * T + t * FLASH_TILE;
    mbarrier_wait(&empty[slot], ((t / FLASH_HOPPER_STAGES) & 1) ^ 1);
    mbarrier_arrive_expect_tx(&full[slot], 2 * FLASH_HOPPER_TILE_BYTES);
    flash_hopper_load_tile(tiles.kv[slot][0], map, C + k.h * 64, row, &full[slot]);
    flash_hopper_load_tile(tiles.kv[slot][1], map, 2 * C + k.h * 64, row, &full[slot]);
}
// v9-v11's producer (one thread): q, then every key tile the block needs, as slots free up
__device__ inline void flash_hopper_produce(FlashHopperTiles& tiles, const CUtensorMap* map, uint64_t* full,
                                            uint64_t* empty, uint64_t* q_full, const FlashHopperBlock& k, int T, int C) {
    flash_hopper_load_q(tiles, map, q_full, k, T);
    for (int t = 0; t < k.tiles; t++) flash_hopper_load_kv(tiles, map, full, empty, t, k, T, C);
}

// s (the warpgroup's 64 queries, 64 keys) = q k^T over HS = 64 in 4 k16 steps, both operands by
// descriptor from shared memory: q as A, K-major (a query's 64 values adjacent) in the same
// interleaved layout as the keys, so flash_desc_keys describes both
__device__ inline void flash_hopper_qk(float (*s)[4], const floatX* q, const floatX* k) {
    for (int kk = 0; kk < 4; kk++) wgmma_m64n64k16_ss<0>(&s[0][0], flash_desc_keys(q, kk), flash_desc_keys(k, kk), kk > 0);
}

// the per-warpgroup part of a consumer: its queries, its warp's, the softmax state and output
struct FlashHopperRows {
    int w, group0, row0;  // warpgroup w of the block's two, its first query, this warp's first
    float o[8][4], m[2], l[2];
};
__device__ inline void flash_hopper_rows_init(FlashHopperRows& r, int w, const FlashHopperBlock& k) {
    r.w = w;
    r.group0 = k.q0 + 64 * w;
    r.row0 = r.group0 + threadIdx.x % 128 / 32 * FLASH_ROWS;
    r.m[0] = r.m[1] = -INFINITY;
    r.l[0] = r.l[1] = 0.0f;
    for (int d = 0; d < 8; d++) r.o[d][0] = r.o[d][1] = r.o[d][2] = r.o[d][3] = 0.0f;
}
// per warpgroup (wgmma needs all 4 warps): its queries are among the len, and key tile t has keys
// they see (causal: a key at or before its last query)
__device__ inline bool flash_hopper_sees(const FlashHopperRows& r, int t, int len, bool causal = true) {
    return (!causal || t * FLASH_TILE <= r.group0 + 63) && r.group0 < len;
}

// v8 and v9's step: key tile t in `slot` (landed) against the warpgroup's queries, as v7's loop
// body: s = q k^T, wait, softmax (o rescaled), p v, wait
__device__ inline void flash_hopper_tile(FlashHopperRows& r, const FlashHopperTiles& tiles, int slot, int t, int T,
                                         float scale_log2) {
    float s[8][4];
    wgmma_fence();
    flash_hopper_qk(s, tiles.q[r.w], tiles.kv[slot][0]);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_pin(&s[0][0], 32);
    flash_online_softmax<64>(s, r.m, r.l, r.o, r.row0, t * FLASH_TILE, T, scale_log2);
    uint32_t p[4][4];
    flash_scores_to_a(p, s);
    wgmma_pin(&r.o[0][0], 32);  // the rescale's writes of o before the fence (flash_attention.cuh's v7)
    wgmma_fence();
    flash_wg_p_x(r.o, p, tiles.kv[slot][1]);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_pin(&r.o[0][0], 32);
}

// v8: 2 warpgroups, both computing; thread 0 also loads: q and the first STAGES tiles before the
// loop, then, once everyone is done with tile t's slot, tile t + STAGES into it. Simple, but that
// thread (and its warpgroup's products, which need all its warps) waits there for the other
// warpgroup every tile, as v7's __syncthreads did
__global__ void __launch_bounds__(256, 2)
flash_hopper_forward_tma_kernel(floatX* out, float* lse, const __grid_constant__ CUtensorMap map, int T, int C, int NH) {
    extern __shared__ __align__(128) unsigned char flash_hopper_shared[];
    FlashHopperTiles& tiles = *(FlashHopperTiles*)flash_hopper_shared;
    __shared__ __align__(8) uint64_t full[FLASH_HOPPER_STAGES], empty[FLASH_HOPPER_STAGES], q_full;
    FlashHopperBlock k = flash_hopper_block(T, NH);
    float scale_log2 = 0.125f * FLASH_LOG2E;  // 1 / sqrt(64), in base 2
    flash_hopper_init(full, empty, &q_full, 256);
    if (threadIdx.x == 0) {
        flash_hopper_load_q(tiles, &map, &q_full, k, T);
        for (int t = 0; t < min(FLASH_HOPPER_STAGES, k.tiles); t++) flash_hopper_load_kv(tiles, &map, full, empty, t, k, T, C);
    }
    FlashHopperRows r;
    flash_hopper_rows_init(r, threadIdx.x / 128, k);
    mbarrier_wait(&q_full, 0);
    for (int t = 0; t < k.tiles; t++) {
        int slot = t % FLASH_HOPPER_STAGES;
        mbarrier_wait(&full[slot], (t / FLASH_HOPPER_STAGES) & 1);  // tile t has landed
        if (flash_hopper_sees(r, t, T)) flash_hopper_tile(r, tiles, slot, t, T, scale_log2);
        mbarrier_arrive(&empty[slot]);  // this thread is done with the slot
        if (threadIdx.x == 0 && t + FLASH_HOPPER_STAGES < k.tiles)
            flash_hopper_load_kv(tiles, &map, full, empty, t + FLASH_HOPPER_STAGES, k, T, C);
    }
    flash_forward_finish<64>(out, lse, r.o, r.m, r.l, k.b, k.h, r.row0, T, C, NH);
}

// v9-v11's block: warpgroup 0 the producer, 1 and 2 the consumers. The producer gives back all
// but FLASH_HOPPER_PRODUCER_REGS registers a thread (one of its threads issues the loads, the
// others leave at once) and the consumers take them (FlashAttention-3's split); the
// kernel's own register count (ptxas -v) is what every warp starts with
__device__ inline bool flash_hopper_producer(FlashHopperTiles& tiles, const CUtensorMap* map, uint64_t* full,
                                             uint64_t* empty, uint64_t* q_full, const FlashHopperBlock& k, int T, int C) {
    if (threadIdx.x >= 128) {
        setmaxnreg_inc<FLASH_HOPPER_CONSUMER_REGS>();
        return false;
    }
    setmaxnreg_dec<FLASH_HOPPER_PRODUCER_REGS>();
    if (threadIdx.x == 0) flash_hopper_produce(tiles, map, full, empty, q_full, k, T, C);
    return true;
}

// v9: warp-specialized. The producer runs ahead as far as the ring lets it; a consumer warpgroup
// waits only for the tiles (not for the other warpgroup, as v8's loading thread did)
__global__ void __launch_bounds__(384, 1)
flash_hopper_forward_ws_kernel(floatX* out, float* lse, const __grid_constant__ CUtensorMap map, int T, int C, int NH) {
    extern __shared__ __align__(128) unsigned char flash_hopper_shared[];
    FlashHopperTiles& tiles = *(FlashHopperTiles*)flash_hopper_shared;
    __shared__ __align__(8) uint64_t full[FLASH_HOPPER_STAGES], empty[FLASH_HOPPER_STAGES], q_full;
    FlashHopperBlock k = flash_hopper_block(T, NH);
    float scale_log2 = 0.125f * FLASH_LOG2E;
    flash_hopper_init(full, empty, &q_full, 256);
    if (flash_hopper_producer(tiles, &map, full, empty, &q_full, k, T, C)) return;
    FlashHopperRows r;
    flash_hopper_rows_init(r, threadIdx.x / 128 - 1, k);
    mbarrier_wait(&q_full, 0);
    for (int t = 0; t < k.tiles; t++) {
        int slot = t % FLASH_HOPPER_STAGES;
        mbarrier_wait(&full[slot], (t / FLASH_HOPPER_STAGES) & 1);
        if (flash_hopper_sees(r, t, T)) flash_hopper_tile(r, tiles, slot, t, T, scale_log2);
        mbarrier_arrive(&empty[slot]);
    }
    flash_forward_finish<64>(out, lse, r.o, r.m, r.l, k.b, k.h, r.row0, T, C, NH);
}

// v10: pingpong (FlashAttention-3 section 3.1). The two consumer warpgroups take turns at the
// tensor cores: warpgroup w waits on named barrier 1 + w before it issues its products and, once
// they are issued, lets the other go (bar.arrive on barrier 2 - w; 256 threads a barrier: the
// warpgroup waiting and the one arriving). A turn issues the p v of the warpgroup's previous tile
// and the q k^T of this one, so that its softmax (next) runs while the other warpgroup's products
// do. Warpgroup 1 arrives once before its first turn (warpgroup 0 goes first) and not after its
// last, so every arrival has its wait. Both take tiles + 1 turns (the last only finishes p v),
// products or not: a turn skipped would leave the other waiting. A slot is released once its v
// has been read, a turn later than v9. Each group of products sits whole (fence to commit) in its
// own branch: with one fence and one commit around two conditional products, ptxas serialized
// every wgmma ("wgmma.mma_async instructions are serialized due to ... WG.AR in divergent path").
__global__ void __launch_bounds__(384, 1)
flash_hopper_forward_pingpong_kernel(floatX* out, float* lse, const __grid_constant__ CUtensorMap map, int T, int C, int NH) {
    extern __shared__ __align__(128) unsigned char flash_hopper_shared[];
    FlashHopperTiles& tiles = *(FlashHopperTiles*)flash_hopper_shared;
    __shared__ __align__(8) uint64_t full[FLASH_HOPPER_STAGES], empty[FLASH_HOPPER_STAGES], q_full;
    FlashHopperBlock k = flash_hopper_block(T, NH);
    float scale_log2 = 0.125f * FLASH_LOG2E;
    flash_hopper_init(full, empty, &q_full, 256);
    if (flash_hopper_producer(tiles, &map, full, empty, &q_full, k, T, C)) return;
    FlashHopperRows r;
    flash_hopper_rows_init(r, threadIdx.x / 128 - 1, k);
    int w = r.w, pending = -1;  // pending: the slot whose p v is still to be done (-1: none)
    uint32_t p[4][4];
    if (w == 1) named_barrier_arrive(1, 256);  // the first turn is warpgroup 0's
    mbarrier_wait(&q_full, 0);
    for (int t = 0; t <= k.tiles; t++) {
        int slot = t % FLASH_HOPPER_STAGES;
        bool scores = t < k.tiles && flash_hopper_sees(r, t, T);
        if (t < k.tiles) mbarrier_wait(&full[slot], (t / FLASH_HOPPER_STAGES) & 1);
        float s[8][4];
        named_barrier_sync(1 + w, 256);  // this warpgroup's turn
        if (pending >= 0) {
            wgmma_fence();
            flash_wg_p_x(r.o, p, tiles.kv[pending][1]);
            wgmma_commit();
        }
        if (scores) {
            wgmma_fence();
            flash_hopper_qk(s, tiles.q[w], tiles.kv[slot][0]);
            wgmma_commit();
        }
        if (w == 0 || t < k.tiles) named_barrier_arrive(2 - w, 256);  // the other's turn
        wgmma_wait<0>();
        wgmma_pin(&r.o[0][0], 32);
        if (pending >= 0) mbarrier_arrive(&empty[pending]);             // its v has been read
        if (t < k.tiles && !scores) mbarrier_arrive(&empty[slot]);      // a tile this warpgroup does not see
        pending = scores ? slot : -1;
        if (scores) {
            wgmma_pin(&s[0][0], 32);
            flash_online_softmax<64>(s, r.m, r.l, r.o, r.row0, t * FLASH_TILE, T, scale_log2);
            flash_scores_to_a(p, s);
            wgmma_pin(&r.o[0][0], 32);  // the rescale's writes of o before the next turn's fence
        }
    }
    flash_forward_finish<64>(out, lse, r.o, r.m, r.l, k.b, k.h, r.row0, T, C, NH);
}

// v11's two groups of products, each whole in one branch (as v10's)
__device__ inline void flash_hopper_issue_qk(float (*s)[4], const floatX* q, const floatX* k) {
    wgmma_fence();
    flash_hopper_qk(s, q, k);
    wgmma_commit();
}
__device__ inline void flash_hopper_issue_pv(float (*o)[4], const uint32_t (*p)[4], const floatX* v) {
    wgmma_fence();
    flash_wg_p_x(o, p, v);
    wgmma_commit();
}

// o's rows g, g + 8 times the factors flash_online_softmax found (v11: applied after the p v in
// flight has written o), when any row of the warp has a factor other than 1
__device__ inline void flash_hopper_rescale(float (*o)[4], const float (*factor)[4]) {
    if (__any_sync(0xffffffff, factor[0][0] != 1.0f || factor[0][2] != 1.0f)) {
        for (int d = 0; d < 8; d++) {
            o[d][0] *= factor[0][0], o[d][1] *= factor[0][1];
            o[d][2] *= factor[0][2], o[d][3] *= factor[0][3];
        }
    }
}

// v11: v10 with the softmax overlapped inside a warpgroup too (FlashAttention-3 section 3.2). A
// turn issues tile t's q k^T, then the previous tile's p v, as two commit groups, and waits for the
// first only (wgmma_wait<1>): tile t's softmax runs while that p v still does, then wgmma_wait<0>.
// Until then neither o (the running product's accumulators) nor p (its A registers) may be
// written: flash_online_softmax rescales a 1 x 4 stand-in of ones instead of o (its o at head size
// 8, one column tile), which then holds each row's factor, and leaves the probabilities in s; o
// is rescaled and s rounded into p after the wait (as FlashAttention-3 converts p after its wait).
// ptxas serializes every wgmma when it cannot see that no other instruction touches a product's
// registers in flight: it did for probabilities written to fresh registers before the wait (C7513),
// and for the softmax in a branch apart from the products' issue (C7514: it does not follow that
// two branches take the same condition). So each case of a turn is one straight branch.
// v11's consumer warpgroup, its turns over key tiles 0 .. tiles - 1 (the producer's) into r: the
// softmax masks keys past len and, with `causal`, a key after its query. The trainer's kernel
// passes T and causal; a ring's chunk pair (ring_attention.cuh) its chunk's len and whether the
// pair is diagonal
__device__ inline void flash_hopper_overlap_turns(FlashHopperRows& r, const FlashHopperTiles& ring, uint64_t* full,
                                                  uint64_t* empty, uint64_t* q_full, int tiles, int len, bool causal,
                                                  float scale_log2) {
    int w = r.w, pending = -1;  // pending: the slot whose p v is still to be done (-1: none)
    uint32_t p[4][4];
    if (w == 1) named_barrier_arrive(1, 256);  // the first turn is warpgroup 0's
    mbarrier_wait(q_full, 0);
    for (int t = 0; t <= tiles; t++) {
        int slot = t % FLASH_HOPPER_STAGES;
        bool scores = t < tiles && flash_hopper_sees(r, t, len, causal);
        if (t < tiles) mbarrier_wait(&full[slot], (t / FLASH_HOPPER_STAGES) & 1);
        float s[8][4];
        named_barrier_sync(1 + w, 256);  // this warpgroup's turn
        float factor[1][4] = {{1.0f, 1.0f, 1.0f, 1.0f}};
        if (scores && pending >= 0) {  // the steady state: tile t's softmax under the p v before it
            flash_hopper_issue_qk(s, ring.q[w], ring.kv[slot][0]);
            flash_hopper_issue_pv(r.o, p, ring.kv[pending][1]);
            if (w == 0 || t < tiles) named_barrier_arrive(2 - w, 256);  // the other's turn
            wgmma_wait<1>();  // s has landed; p v may still run
            wgmma_pin(&s[0][0], 32);
            flash_online_softmax<8>(s, r.m, r.l, factor, r.row0, t * FLASH_TILE, len, scale_log2, causal);
        } else if (scores) {  // the warpgroup's first tile: no p v yet
            flash_hopper_issue_qk(s, ring.q[w], ring.kv[slot][0]);
            if (w == 0 || t < tiles) named_barrier_arrive(2 - w, 256);
            wgmma_wait<0>();
            wgmma_pin(&s[0][0], 32);
            flash_online_softmax<8>(s, r.m, r.l, factor, r.row0, t * FLASH_TILE, len, scale_log2, causal);
        } else {  // no scores (the last turn, or a tile it does not see): only the p v, if any
            if (pending >= 0) flash_hopper_issue_pv(r.o, p, ring.kv[pending][1]);
            if (w == 0 || t < tiles) named_barrier_arrive(2 - w, 256);
        }
        wgmma_wait<0>();  // p v has run: o is whole, the slot's v read, p free
        wgmma_pin(&r.o[0][0], 32);
        if (pending >= 0) mbarrier_arrive(&empty[pending]);         // its v has been read
        if (t < tiles && !scores) mbarrier_arrive(&empty[slot]);  // a tile this warpgroup does not see
        pending = scores ? slot : -1;
        if (scores) {
            flash_hopper_rescale(r.o, factor);
            flash_scores_to_a(p, s);
            wgmma_pin(&r.o[0][0], 32);  // the rescale's writes of o before the next turn's fence
        }
    }
}
// v11's block: the producer, then those turns over the causal T keys
__global__ void __launch_bounds__(384, 1)
flash_hopper_forward_overlap_kernel(floatX* out, float* lse, const __grid_constant__ CUtensorMap map, int T, int C, int NH) {
    extern __shared__ __align__(128) unsigned char flash_hopper_shared[];
    FlashHopperTiles& tiles = *(FlashHopperTiles*)flash_hopper_shared;
    __shared__ __align__(8) uint64_t full[FLASH_HOPPER_STAGES], empty[FLASH_HOPPER_STAGES], q_full;
    FlashHopperBlock k = flash_hopper_block(T, NH);
    float scale_log2 = 0.125f * FLASH_LOG2E;
    flash_hopper_init(full, empty, &q_full, 256);
    if (flash_hopper_producer(tiles, &map, full, empty, &q_full, k, T, C)) return;
    FlashHopperRows r;
    flash_hopper_rows_init(r, threadIdx.x / 128 - 1, k);
    flash_hopper_overlap_turns(r, tiles, full, empty, &q_full, k.tiles, T, true, scale_log2);
    flash_forward_finish<64>(out, lse, r.o, r.m, r.l, k.b, k.h, r.row0, T, C, NH);
}

#define FLASH_HOPPER_FORWARD_VERSIONS 4  // v8 .. v8 + this - 1

// the launch of rung `version` (8 ..): out (B, T, C), lse (B, NH, T) from qkv (B, T, 3C), head
// size 64 (C = 64 NH). The tensor map over qkv is made on the host once for each buffer and shape.
static inline void flash_hopper_forward(int version, floatX* out, float* lse, const floatX* qkv, int B, int T, int C, int NH) {
    if (C != 64 * NH) {
        fprintf(stderr, "flash_hopper_forward: head size %d; these kernels are built for 64\n", C / NH);
        exit(1);
    }
    static CUtensorMap map;
    static const floatX* mapped = NULL;
    static int mapped_rows = 0, mapped_C = 0;
    if (qkv != mapped || B * T != mapped_rows || C != mapped_C) {
        tma_map_2d(&map, qkv, B * T, 3 * C, 3 * C, FLASH_TILE, 8);
        mapped = qkv, mapped_rows = B * T, mapped_C = C;
    }
    static int allowed[FLASH_HOPPER_FORWARD_VERSIONS];  // the dynamic shared memory, over 48 KB, allowed once
    int bytes = (int)sizeof(FlashHopperTiles), v = version - 8;
    dim3 grid(ceil_div(T, FLASH_HOPPER_QUERIES), B * NH);
    if (v == 0) {
        if (!allowed[v]) cudaCheck(cudaFuncSetAttribute(flash_hopper_forward_tma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
        flash_hopper_forward_tma_kernel<<<grid, 256, bytes>>>(out, lse, map, T, C, NH);
    } else if (v == 1) {
        if (!allowed[v]) cudaCheck(cudaFuncSetAttribute(flash_hopper_forward_ws_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
        flash_hopper_forward_ws_kernel<<<grid, 384, bytes>>>(out, lse, map, T, C, NH);
    } else if (v == 2) {
        if (!allowed[v]) cudaCheck(cudaFuncSetAttribute(flash_hopper_forward_pingpong_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
        flash_hopper_forward_pingpong_kernel<<<grid, 384, bytes>>>(out, lse, map, T, C, NH);
    } else if (v == 3) {
        if (!allowed[v]) cudaCheck(cudaFuncSetAttribute(flash_hopper_forward_overlap_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
        flash_hopper_forward_overlap_kernel<<<grid, 384, bytes>>>(out, lse, map, T, C, NH);
    } else {
        fprintf(stderr, "flash_hopper_forward: no version %d\n", version);
        exit(1);
    }
    allowed[v] = 1;
    cudaCheckLaunch();
}

// attention_forward_flash's contract on Hopper's last rung: out (B, T, C), lse (B, NH, T) from
// qkv (B, T, 3C), causal; head size 64 only
static inline void attention_forward_flash_hopper(floatX* out, float* lse, const floatX* qkv, int B, int T, int C, int NH) {
    flash_hopper_forward(8 + FLASH_HOPPER_FORWARD_VERSIONS - 1, out, lse, qkv, B, T, C, NH);
}

#endif  // LLMC_WGMMA && !FLOATX_IS_FLOAT
#endif
