// The flash attention backward on Hopper's machinery (sm_90a, bf16, head size 64, causal): TMA
// loads through tensor maps into a ring of shared-memory slots guarded by mbarriers, a producer
// warp that only loads, consumer warpgroups that only compute (warp specialization, setmaxnreg),
// and wgmma with both operands of the score products in shared memory. FlashAttention-3 (Shah et
// al. 2024, arXiv:2407.08608) section 3.3 and its appendix's backward algorithm.
//
// The same mathematics as the mma.sync and wgmma backward of flash_attention.cuh: from the
// forward's lse (B, NH, T) and D = dout . out (B, NH, T), each tile of probabilities is
// recomputed, p = exp(q k^T / sqrt(HS) - lse), and ds = p (dp - D) with dp = dout v^T.
//
// dK dV (flash_hopper_backward_dkdv_kernel): block (128 keys, b * NH + h), 3 warpgroups:
//   warpgroup 0, the producer (setmaxnreg_dec<24>: it needs few registers), warp 0 only: lane 0
//     loads the block's k and v once (4 tiles of (64, 64), 32 KB, mbarrier kv_full), then walks
//     the query tiles u0 = the block's first key, + 64, ... to T: for each, it waits until the
//     ring slot tile % STAGES is free (mbarrier empty), and loads q and dout into it by TMA
//     (mbarrier full: 16 KB announced by arrive.expect_tx); the 32 lanes copy the tile's 64 lse
//     (times log2 e) and D into the slot with ordinary loads and stores, and each arrives on full
//     after its stores (full counts 32 arrivals and the bytes). lse and D go by the lanes, not by
//     TMA, because a row of T floats is a multiple of 16 bytes, as a tensor map's stride must be,
//     only when T % 4 == 0 (the emulated checks run T = 37 and 100 too).
//   warpgroups 1 and 2, the consumers (setmaxnreg_inc<240>), keys group0 = block key 0 + 64 (w - 1)
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
//   the producer loads its q and dout once and streams the key tiles' k and v through the ring;
//   the consumers hold their rows' lse and D in registers, s = q k^T and dp = dout v^T by wgmma
//   from shared memory, ds in registers, dq += ds k (A = ds registers, B = the k tile MN-major).
//
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
// Shared memory: 66,560 bytes a block (dynamic: k, v 32 KB, a ring of 2 slots of 16 KB and the
// slots' lse and D, 1 KB), 1 block an SM (384 threads, 168 registers at entry).
#ifndef LLMC_CUDA_FLASH_HOPPER_BACKWARD_CUH
#define LLMC_CUDA_FLASH_HOPPER_BACKWARD_CUH

#include "flash_attention.cuh"

#if defined(LLMC_WGMMA) && !FLOATX_IS_FLOAT

#define HOPPER_BWD_STAGES 2                  // ring slots (q and dout, or k and v, of one tile each)
#define HOPPER_BWD_THREADS 384               // a producer warpgroup, two consumer warpgroups
#define HOPPER_TILE_ELEMS (FLASH_TILE * 64)  // a (64, 64) bf16 tile: 8 KB
#define HOPPER_TILE_BYTES (HOPPER_TILE_ELEMS * (int)sizeof(floatX))
// dynamic shared memory: 4 tiles held the whole block (k, v of both warpgroups; or q, dout), the
// ring's 2 tiles a slot, and a slot's 64 lse and 64 D
#define HOPPER_BWD_SHARED (4 * HOPPER_TILE_BYTES + HOPPER_BWD_STAGES * (2 * HOPPER_TILE_BYTES + 2 * FLASH_TILE * (int)sizeof(float)))

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

// the ring's barriers and the once-loaded tiles' one, made by one thread before anyone uses them
__device__ inline void hopper_init_barriers(uint64_t* full, uint64_t* empty, uint64_t* once) {
    if (threadIdx.x == 0) {
        for (int s = 0; s < HOPPER_BWD_STAGES; s++) {
            mbarrier_init(&full[s], 32);    // the producer warp's lanes (lane 0's with the bytes)
            mbarrier_init(&empty[s], 256);  // every consumer thread
        }
        mbarrier_init(once, 1);
        mbarrier_init_fence();
    }
    __syncthreads();
}

// dK dV: block (128 keys, b * NH + h); see the top of the file
__global__ void __launch_bounds__(HOPPER_BWD_THREADS, 1)
flash_hopper_backward_dkdv_kernel(floatX* dqkv, const __grid_constant__ CUtensorMap qkv_map,
                                  const __grid_constant__ CUtensorMap dout_map, const float* lse, const float* D,
                                  int B, int T, int C, int NH) {
    const int HS = 64;
    extern __shared__ __align__(128) floatX hopper_smem[];
    __shared__ __align__(8) uint64_t full[HOPPER_BWD_STAGES], empty[HOPPER_BWD_STAGES], kv_full;
    floatX* k_s = hopper_smem;                                 // [2]: warpgroup 1's keys, then 2's
    floatX* v_s = k_s + 2 * HOPPER_TILE_ELEMS;                 // [2]
    floatX* q_s = v_s + 2 * HOPPER_TILE_ELEMS;                 // [STAGES]
    floatX* dy_s = q_s + HOPPER_BWD_STAGES * HOPPER_TILE_ELEMS;  // [STAGES]
    float* lse_s = (float*)(dy_s + HOPPER_BWD_STAGES * HOPPER_TILE_ELEMS);  // [STAGES][64], base 2
    float* D_s = lse_s + HOPPER_BWD_STAGES * FLASH_TILE;                   // [STAGES][64]
    int group = threadIdx.x / 128, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int b = blockIdx.y / NH, h = blockIdx.y % NH;
    int block_key0 = blockIdx.x * 2 * FLASH_TILE;  // the first keys see the most queries: first
    int tiles = (T - block_key0 + FLASH_TILE - 1) / FLASH_TILE;  // causal: queries from the first key on
    hopper_init_barriers(full, empty, &kv_full);
    if (group == 0) {  // the producer
        setmaxnreg_dec<24>();
        if (warp != 0) return;
        // rows of the maps are tokens b T + t: a tile's rows past T are the next sequence's (or
        // TMA's zeros past the tensor), finite values whose probabilities the consumers mask to 0
        int row = b * T;
        if (lane == 0) {
            mbarrier_arrive_expect_tx(&kv_full, 4 * HOPPER_TILE_BYTES);
            for (int w = 0; w < 2; w++) {
                hopper_load_tile(k_s + w * HOPPER_TILE_ELEMS, &qkv_map, C + h * HS, row + block_key0 + 64 * w, &kv_full);
                hopper_load_tile(v_s + w * HOPPER_TILE_ELEMS, &qkv_map, 2 * C + h * HS, row + block_key0 + 64 * w, &kv_full);
            }
        }
        const float* lse_bh = lse + ((size_t)b * NH + h) * T;
        const float* D_bh = D + ((size_t)b * NH + h) * T;
        for (int tile = 0; tile < tiles; tile++) {
            int slot = tile % HOPPER_BWD_STAGES, u0 = block_key0 + tile * FLASH_TILE;
            mbarrier_wait(&empty[slot], ((tile / HOPPER_BWD_STAGES) & 1) ^ 1);  // the slot's last tile was read
            for (int i = lane; i < FLASH_TILE; i += 32) {
                lse_s[slot * FLASH_TILE + i] = u0 + i < T ? lse_bh[u0 + i] * FLASH_LOG2E : 0.0f;
                D_s[slot * FLASH_TILE + i] = u0 + i < T ? D_bh[u0 + i] : 0.0f;
            }
            if (lane == 0) {
                mbarrier_arrive_expect_tx(&full[slot], 2 * HOPPER_TILE_BYTES);
                hopper_load_tile(q_s + slot * HOPPER_TILE_ELEMS, &qkv_map, h * HS, row + u0, &full[slot]);
                hopper_load_tile(dy_s + slot * HOPPER_TILE_ELEMS, &dout_map, h * HS, row + u0, &full[slot]);
            } else {
                mbarrier_arrive(&full[slot]);  // (after this lane's stores of lse and D)
            }
        }
        return;
    }
    setmaxnreg_inc<240>();
    int t = lane % 4;  // the lane's place in its group (mma.cuh)
    int group0 = block_key0 + 64 * (group - 1), key0 = group0 + 16 * (warp % 4);
    const floatX* k_tile = k_s + (group - 1) * HOPPER_TILE_ELEMS;
    const floatX* v_tile = v_s + (group - 1) * HOPPER_TILE_ELEMS;
    float scale = rsqrtf((float)HS), scale_log2 = scale * FLASH_LOG2E;
    float dk[HS / 8][4], dv[HS / 8][4];
    for (int d = 0; d < HS / 8; d++)
        for (int e = 0; e < 4; e++) dk[d][e] = dv[d][e] = 0.0f;
    mbarrier_wait(&kv_full, 0);  // k and v have landed
    for (int tile = 0; tile < tiles; tile++) {
        int slot = tile % HOPPER_BWD_STAGES, u0 = block_key0 + tile * FLASH_TILE;
        const floatX* q_tile = q_s + slot * HOPPER_TILE_ELEMS;
        const floatX* dy_tile = dy_s + slot * HOPPER_TILE_ELEMS;
        mbarrier_wait(&full[slot], (tile / HOPPER_BWD_STAGES) & 1);  // q, dout, lse, D of the tile are there
        if (u0 + FLASH_TILE - 1 >= group0 && group0 < T) {  // the warpgroup's keys see some of these queries
            float s[FLASH_TILE / 8][4], dp[FLASH_TILE / 8][4];  // s^T then p^T then ds^T; dp^T
            wgmma_fence();
            hopper_a_bt(s, k_tile, q_tile);    // s^T = k q^T
            hopper_a_bt(dp, v_tile, dy_tile);  // dp^T = v dout^T
            wgmma_commit();
            wgmma_wait<0>();
            wgmma_pin(&s[0][0], FLASH_TILE / 2);
            wgmma_pin(&dp[0][0], FLASH_TILE / 2);
            flash_key_probabilities(s, lse_s + slot * FLASH_TILE, key0, u0, T, scale_log2);  // p^T
            uint32_t p[FLASH_TILE / 16][4], ds[FLASH_TILE / 16][4];
            flash_scores_to_a(p, s);
            for (int j = 0; j < FLASH_TILE / 8; j++)
                for (int e = 0; e < 4; e++) s[j][e] *= dp[j][e] - D_s[slot * FLASH_TILE + 8 * j + 2 * t + e % 2];
            flash_scores_to_a(ds, s);
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
    flash_store<HS>(dqkv, 3 * C, C, dk, scale, b, h, key0, T);
    flash_store<HS>(dqkv, 3 * C, 2 * C, dv, 1.0f, b, h, key0, T);
}

// dQ: block (128 queries, b * NH + h), the longest blocks first; warpgroup w (1, 2) owns queries
// group0 = q0 + 64 (w - 1) .. + 63 and walks the key tiles up to its causal limit
__global__ void __launch_bounds__(HOPPER_BWD_THREADS, 1)
flash_hopper_backward_dq_kernel(floatX* dqkv, const __grid_constant__ CUtensorMap qkv_map,
                                const __grid_constant__ CUtensorMap dout_map, const float* lse, const float* D,
                                int B, int T, int C, int NH) {
    const int HS = 64;
    extern __shared__ __align__(128) floatX hopper_smem[];
    __shared__ __align__(8) uint64_t full[HOPPER_BWD_STAGES], empty[HOPPER_BWD_STAGES], rows_full;
    floatX* q_s = hopper_smem;                                 // [2]: warpgroup 1's queries, then 2's
    floatX* dy_s = q_s + 2 * HOPPER_TILE_ELEMS;                // [2]
    floatX* k_s = dy_s + 2 * HOPPER_TILE_ELEMS;                // [STAGES]
    floatX* v_s = k_s + HOPPER_BWD_STAGES * HOPPER_TILE_ELEMS;  // [STAGES]
    int group = threadIdx.x / 128, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int b = blockIdx.y / NH, h = blockIdx.y % NH;
    int q0 = (gridDim.x - 1 - blockIdx.x) * 2 * FLASH_TILE;
    int tiles = (min(q0 + 2 * FLASH_TILE, T) + FLASH_TILE - 1) / FLASH_TILE;  // causal: keys up to the last query
    hopper_init_barriers(full, empty, &rows_full);
    if (group == 0) {  // the producer: lane 0 of warp 0 (the ring's full barriers count 32 arrivals)
        setmaxnreg_dec<24>();
        if (warp != 0) return;
        int row = b * T;
        if (lane == 0) {
            mbarrier_arrive_expect_tx(&rows_full, 4 * HOPPER_TILE_BYTES);
            for (int w = 0; w < 2; w++) {
                hopper_load_tile(q_s + w * HOPPER_TILE_ELEMS, &qkv_map, h * HS, row + q0 + 64 * w, &rows_full);
                hopper_load_tile(dy_s + w * HOPPER_TILE_ELEMS, &dout_map, h * HS, row + q0 + 64 * w, &rows_full);
            }
        }
        for (int tile = 0; tile < tiles; tile++) {
            int slot = tile % HOPPER_BWD_STAGES, k0 = tile * FLASH_TILE;
            mbarrier_wait(&empty[slot], ((tile / HOPPER_BWD_STAGES) & 1) ^ 1);
            if (lane == 0) {
                mbarrier_arrive_expect_tx(&full[slot], 2 * HOPPER_TILE_BYTES);
                hopper_load_tile(k_s + slot * HOPPER_TILE_ELEMS, &qkv_map, C + h * HS, row + k0, &full[slot]);
                hopper_load_tile(v_s + slot * HOPPER_TILE_ELEMS, &qkv_map, 2 * C + h * HS, row + k0, &full[slot]);
            } else {
                mbarrier_arrive(&full[slot]);
            }
        }
        return;
    }
    setmaxnreg_inc<240>();
    int group0 = q0 + 64 * (group - 1), row0 = group0 + 16 * (warp % 4);
    const floatX* q_tile = q_s + (group - 1) * HOPPER_TILE_ELEMS;
    const floatX* dy_tile = dy_s + (group - 1) * HOPPER_TILE_ELEMS;
    float scale = rsqrtf((float)HS), scale_log2 = scale * FLASH_LOG2E;
    float lse_log2[2], D_row[2];  // rows g, g + 8 of the warp's 16
    flash_row_statistics(lse_log2, D_row, lse, D, b, h, NH, row0, T);
    float dq[HS / 8][4];
    for (int d = 0; d < HS / 8; d++) dq[d][0] = dq[d][1] = dq[d][2] = dq[d][3] = 0.0f;
    mbarrier_wait(&rows_full, 0);  // q and dout have landed
    for (int tile = 0; tile < tiles; tile++) {
        int slot = tile % HOPPER_BWD_STAGES, k0 = tile * FLASH_TILE;
        const floatX* k_tile = k_s + slot * HOPPER_TILE_ELEMS;
        const floatX* v_tile = v_s + slot * HOPPER_TILE_ELEMS;
        mbarrier_wait(&full[slot], (tile / HOPPER_BWD_STAGES) & 1);
        if (k0 <= group0 + 63 && group0 < T) {
            float s[FLASH_TILE / 8][4], dp[FLASH_TILE / 8][4];  // s then p then ds; dp
            wgmma_fence();
            hopper_a_bt(s, q_tile, k_tile);    // s = q k^T
            hopper_a_bt(dp, dy_tile, v_tile);  // dp = dout v^T
            wgmma_commit();
            wgmma_wait<0>();
            wgmma_pin(&s[0][0], FLASH_TILE / 2);
            wgmma_pin(&dp[0][0], FLASH_TILE / 2);
            flash_query_probabilities(s, lse_log2, row0, k0, T, scale_log2);  // p
            for (int j = 0; j < FLASH_TILE / 8; j++)
                for (int e = 0; e < 4; e++) s[j][e] *= dp[j][e] - D_row[e / 2];
            uint32_t ds[FLASH_TILE / 16][4];
            flash_scores_to_a(ds, s);
            wgmma_pin(&dq[0][0], HS / 2);
            wgmma_fence();
            flash_wg_p_x(dq, ds, k_tile);  // dq += ds k
            wgmma_commit();
            wgmma_wait<0>();
            wgmma_pin(&dq[0][0], HS / 2);
        }
        mbarrier_arrive(&empty[slot]);
    }
    flash_store<HS>(dqkv, 3 * C, 0, dq, scale, b, h, row0, T);
}

// dqkv (B, T, 3C) (overwritten) from dout and out (B, T, C), qkv and the forward's lse: the
// contract of attention_backward_flash (flash_attention.cuh), which takes the head sizes other
// than 64. The tensor maps hold the pointers, so they are made on each call (host work only).
static inline void attention_backward_flash_hopper(floatX* dqkv, const floatX* dout, const floatX* qkv, const floatX* out,
                                                   const float* lse, int B, int T, int C, int NH) {
    if (C / NH != 64) {
        attention_backward_flash(dqkv, dout, qkv, out, lse, B, T, C, NH);
        return;
    }
    float* D = (float*)scratch_get(&flash_scratch, flash_scratch_bytes(B, T, NH));
    attention_row_dot(D, dout, out, B, T, C, NH);
    static int allowed = 0;  // (the kernels' dynamic shared memory, over 48 KB, allowed once)
    if (!allowed) {
        cudaCheck(cudaFuncSetAttribute(flash_hopper_backward_dkdv_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       HOPPER_BWD_SHARED));
        cudaCheck(cudaFuncSetAttribute(flash_hopper_backward_dq_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       HOPPER_BWD_SHARED));
        allowed = 1;
    }
    // boxes of (64 rows, 8 columns): the tiles' column groups (hopper_load_tile)
    CUtensorMap qkv_map, dout_map;
    tma_map_2d(&qkv_map, qkv, B * T, 3 * C, 3 * C, FLASH_TILE, 8);
    tma_map_2d(&dout_map, dout, B * T, C, C, FLASH_TILE, 8);
    dim3 grid(ceil_div(T, 2 * FLASH_TILE), B * NH);
    flash_hopper_backward_dkdv_kernel<<<grid, HOPPER_BWD_THREADS, HOPPER_BWD_SHARED>>>(dqkv, qkv_map, dout_map, lse, D, B,
                                                                                        T, C, NH);
    flash_hopper_backward_dq_kernel<<<grid, HOPPER_BWD_THREADS, HOPPER_BWD_SHARED>>>(dqkv, qkv_map, dout_map, lse, D, B,
                                                                                      T, C, NH);
    cudaCheckLaunch();
}

#endif  // LLMC_WGMMA && !FLOATX_IS_FLOAT
#endif
