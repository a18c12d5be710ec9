/*
Hopper's asynchronous machinery (llmc/cuda/mma.cuh), alone against the CPU: TMA loads through a
tensor map, mbarriers, named barriers and setmaxnreg, the parts a warp-specialized kernel (a
producer warp that only loads, consumer warps that only compute; FlashAttention-3's layout) is
built from. The computation is small on purpose, y = X v (a matrix-vector product, fp32 sums), so
that what is checked is the pipeline: every tile read is the right one, read after it landed and
before it was overwritten.
  make dev/cuda/tma GPU_COMPUTE_CAPABILITY=90 && ./dev/cuda/tma
  make build/emu_BF16/dev/cuda/tma && ./build/emu_BF16/dev/cuda/tma     (CUDA_EMU_ORDER=reverse too)

A block owns 64 rows of X (R, C) and walks their columns in tiles of 64 rows x 128 bytes (64
bf16 or 32 fp32: TMA's box). The tiles pass through a ring of STAGES slots in shared memory, each
slot with two mbarriers:
  full[s]   count 1: the producer arrives announcing the tile's bytes (arrive.expect_tx), then
            issues the TMA load, whose bytes complete the phase when they land; a consumer
            waits on it before reading the slot.
  empty[s]  count 128: every thread of the consuming warpgroup arrives once it has read the slot;
            the producer waits on it before refilling the slot.
Tile t goes to slot t % STAGES and is the (t / STAGES)-th use of that slot: the phase to wait for
has parity (t / STAGES) % 2 on full, and the phase before it on empty (a fresh barrier's phase of
parity 1 counts as complete, so the first STAGES tiles are issued without waiting).
v1: a producer warp (warp 0; its lane 0 issues the copies) and one consumer warpgroup (warps
    1-4; thread i sums row i % 64 over half i / 64 of each tile's columns); the two halves meet
    through shared memory after a __syncthreads.
v2: three warpgroups, warp-specialized as FlashAttention-3: the producer warpgroup gives its
    registers back (setmaxnreg_dec<40>), the two consumer warpgroups take them (setmaxnreg_inc<232>:
    128 x 40 + 256 x 232 = 64,512 of the 65,536 registers) and take the tiles in turn (even tiles
    the first, odd the second). At the end the second warpgroup hands its sums to the first
    through shared memory and named barrier 1 (256 threads, the producer not among them: the
    second arrives without waiting, bar.arrive; the first waits, bar.sync), and the first adds
    its two halves after named barrier 2 (its own 128 threads).
v3: v1's ring the other way too: Z = X scaled by v's column (z[r][c] = x[r][c] v[c]), each tile
    written by the consumers into one of two staging tiles and stored to Z by TMA (one thread
    issues it after a fence and a named barrier of the 128 consumers; before a staging tile is
    written again, that thread waits until the store from it two tiles ago has read it, and a
    named barrier tells the others).
Under the emulator (test/cuda_emu) each order takes an extreme: forward, a TMA load lands as its
phase completes and the thread that completed a phase goes on first; reverse, a load lands at once
and a completed phase or a filled named barrier hands the CPU to the threads it releases. So a
consumer that reads a slot before waiting on full, a producer that refills a slot without waiting
on empty, a consumer that arrives on empty before its last read, or a missing named barrier gives
a wrong sum (or a deadlock the emulator names) in at least one order (dev/cuda/mutation_sweep.py
deletes each wait of this file in turn); and a TMA store reads its source at its wait (forward)
or at once (reverse), so a staging tile overwritten before the wait, or stored before every
thread wrote it, gives a wrong Z.
Timing (GPU only): the rate X (and Z) stream through, in GB/s, against the H200's 4.8 TB/s.
*/
#include "common.h"
#include "llmc/cuda/mma.cuh"

#define TILE_ROWS 64
#define TILE_COLS ((int)(128 / sizeof(floatX)))  // a box row of 128 bytes
#define TILE_BYTES (TILE_ROWS * 128)
#define STAGES 3

#if defined(LLMC_WGMMA)
// the producer: tile t of the block's rows into slot t % STAGES once its previous tile was read
__device__ void produce(const CUtensorMap* map, floatX* ring, uint64_t* full, uint64_t* empty, int tiles) {
    for (int t = 0; t < tiles; t++) {
        int slot = t % STAGES;
        uint32_t parity = (t / STAGES) & 1;
        mbarrier_wait(&empty[slot], parity ^ 1);  // the slot's previous tile has been read
        mbarrier_arrive_expect_tx(&full[slot], TILE_BYTES);
        tma_load_2d(ring + slot * TILE_ROWS * TILE_COLS, map, t * TILE_COLS, blockIdx.x * TILE_ROWS, &full[slot]);
    }
}

// a consumer thread (i of its warpgroup): row i % 64, half i / 64 of the columns of tiles first,
// first + step, ...; returns its part of y[row]
__device__ float consume(floatX* ring, uint64_t* full, uint64_t* empty, const floatX* v, int C, int tiles, int first,
                         int step, int i) {
    int row = i % TILE_ROWS, half = i / TILE_ROWS;
    float sum = 0.0f;
    for (int t = first; t < tiles; t += step) {
        int slot = t % STAGES;
        mbarrier_wait(&full[slot], (t / STAGES) & 1);  // the tile has landed
        const floatX* tile = ring + slot * TILE_ROWS * TILE_COLS + row * TILE_COLS;
        for (int c = half * TILE_COLS / 2; c < (half + 1) * TILE_COLS / 2; c++) {
            int col = t * TILE_COLS + c;  // (columns past C are zeros in the tile: TMA's fill)
            if (col < C) sum += (float)tile[c] * (float)v[col];
        }
        mbarrier_arrive(&empty[slot]);  // this thread is done with the slot
    }
    return sum;
}

// the ring's barriers, made by one thread before anyone uses them
__device__ void init_ring(uint64_t* full, uint64_t* empty) {
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) {
            mbarrier_init(&full[s], 1);
            mbarrier_init(&empty[s], 128);
        }
        mbarrier_init_fence();
    }
    __syncthreads();
}

// v1: 160 threads, warp 0 produces, warps 1-4 consume
__global__ void __launch_bounds__(160) gemv_tma_kernel1(float* y, const __grid_constant__ CUtensorMap map,
                                                        const floatX* v, int R, int C) {
    __shared__ __align__(128) floatX ring[STAGES * TILE_ROWS * 128 / sizeof(floatX)];
    __shared__ __align__(8) uint64_t full[STAGES], empty[STAGES];
    __shared__ float halves[2][TILE_ROWS];
    int tiles = (C + TILE_COLS - 1) / TILE_COLS;
    init_ring(full, empty);
    if (threadIdx.x < 32) {
        if (threadIdx.x == 0) produce(&map, ring, full, empty, tiles);
    } else {
        int i = threadIdx.x - 32;
        halves[i / TILE_ROWS][i % TILE_ROWS] = consume(ring, full, empty, v, C, tiles, 0, 1, i);
    }
    __syncthreads();
    int row = blockIdx.x * TILE_ROWS + threadIdx.x;
    if (threadIdx.x < TILE_ROWS && row < R) y[row] = halves[0][threadIdx.x] + halves[1][threadIdx.x];
}

// v2: 384 threads, warpgroup 0 produces, warpgroups 1 and 2 consume the even and the odd tiles
__global__ void __launch_bounds__(384, 1) gemv_tma_kernel2(float* y, const __grid_constant__ CUtensorMap map,
                                                           const floatX* v, int R, int C) {
    __shared__ __align__(128) floatX ring[STAGES * TILE_ROWS * 128 / sizeof(floatX)];
    __shared__ __align__(8) uint64_t full[STAGES], empty[STAGES];
    __shared__ float second[128], first[128];
    int tiles = (C + TILE_COLS - 1) / TILE_COLS, group = threadIdx.x / 128, i = threadIdx.x % 128;
    init_ring(full, empty);
    if (group == 0) {
        setmaxnreg_dec<40>();
        if (i == 0) produce(&map, ring, full, empty, tiles);
        return;
    }
    setmaxnreg_inc<232>();
    float sum = consume(ring, full, empty, v, C, tiles, group - 1, 2, i);
    if (group == 2) {
        second[i] = sum;
        named_barrier_arrive(1, 256);  // its sums are in shared memory (it has nothing to wait for)
        return;
    }
    named_barrier_sync(1, 256);  // the second warpgroup's sums are in shared memory
    first[i] = sum + second[i];
    named_barrier_sync(2, 128);  // both halves of every row are
    int row = blockIdx.x * TILE_ROWS + i;
    if (i < TILE_ROWS && row < R) y[row] = first[i] + first[i + TILE_ROWS];
}

// v3: 160 threads as v1; the consumers' thread 127 issues the stores. (Any one thread may; the
// last one has its warp run after the other consumer warps in the emulator's forward order, so
// that a missing barrier before a staging tile is rewritten shows there.)
__global__ void __launch_bounds__(160) scale_tma_kernel3(const __grid_constant__ CUtensorMap x_map,
                                                         const __grid_constant__ CUtensorMap z_map, const floatX* v, int C) {
    __shared__ __align__(128) floatX ring[STAGES * TILE_ROWS * 128 / sizeof(floatX)];
    __shared__ __align__(128) floatX staging[2 * TILE_ROWS * 128 / sizeof(floatX)];
    __shared__ __align__(8) uint64_t full[STAGES], empty[STAGES];
    const int issuer = 127;
    int tiles = (C + TILE_COLS - 1) / TILE_COLS;
    init_ring(full, empty);
    if (threadIdx.x < 32) {
        if (threadIdx.x == 0) produce(&x_map, ring, full, empty, tiles);
        return;
    }
    int i = threadIdx.x - 32, row = i % TILE_ROWS, half = i / TILE_ROWS;
    for (int t = 0; t < tiles; t++) {
        int slot = t % STAGES;
        floatX* out = staging + (t % 2) * TILE_ROWS * TILE_COLS;
        mbarrier_wait(&full[slot], (t / STAGES) & 1);
        if (i == issuer) tma_store_wait<1>();  // the store from `out` two tiles ago has read it ...
        named_barrier_sync(1, 128);            // ... so every consumer may write it again
        const floatX* tile = ring + slot * TILE_ROWS * TILE_COLS + row * TILE_COLS;
        for (int c = half * TILE_COLS / 2; c < (half + 1) * TILE_COLS / 2; c++) {
            int col = t * TILE_COLS + c;  // (columns past C: the store leaves them out)
            out[row * TILE_COLS + c] = (floatX)((float)tile[c] * (col < C ? (float)v[col] : 0.0f));
        }
        mbarrier_arrive(&empty[slot]);
        fence_proxy_async();         // this thread's writes of `out`, seen by the TMA unit ...
        named_barrier_sync(1, 128);  // ... once every consumer's are
        if (i == issuer) {
            tma_store_2d(&z_map, t * TILE_COLS, blockIdx.x * TILE_ROWS, out);
            tma_store_commit();
        }
    }
    if (i == issuer) tma_store_wait<0>();  // (the source must outlive its reads)
}

static void gemv_tma(int version, float* y, const CUtensorMap& map, const floatX* v, int R, int C) {
    int blocks = (R + TILE_ROWS - 1) / TILE_ROWS;
    if (version == 1) gemv_tma_kernel1<<<blocks, 160>>>(y, map, v, R, C);
    else gemv_tma_kernel2<<<blocks, 384>>>(y, map, v, R, C);
    cudaCheckLaunch();
}
#endif  // LLMC_WGMMA

int main(void) {
#if !defined(LLMC_WGMMA)
    printf("tma: nothing to check: sm_90a builds only (make dev/cuda/tma GPU_COMPUTE_CAPABILITY=90; the emulator's "
           "builds have it)\n");
    return 0;
#else
    // not multiples of the tile: the last row block and the last column tile leave the matrix (TMA
    // fills zeros there, and the kernels must not write past y); rows of 8 floatX keep the stride
    // a multiple of 16 bytes, as TMA requires
    int R = GPU_OR_EMU(16384, 200), C = GPU_OR_EMU(8192, 8 * 41);
    float* x = random_floats((size_t)R * C, 1.0f);
    float* v = random_floats(C, 1.0f);
    round_like_floatX(x, (size_t)R * C);
    round_like_floatX(v, C);
    float* ref = (float*)malloc_check(R * sizeof(float));
    for (int r = 0; r < R; r++) {
        double s = 0.0;
        for (int c = 0; c < C; c++) s += (double)x[(size_t)r * C + c] * v[c];
        ref[r] = (float)s;
    }
    floatX* d_x = to_device(x, (size_t)R * C);
    floatX* d_v = to_device(v, C);
    float* d_y = (float*)device_malloc(R * sizeof(float));
    floatX* d_z = (floatX*)device_malloc((size_t)R * C * sizeof(floatX));
    CUtensorMap map, z_map;
    tma_map_2d(&map, d_x, R, C, C, TILE_ROWS, TILE_COLS);
    tma_map_2d(&z_map, d_z, R, C, C, TILE_ROWS, TILE_COLS);
    float* z_ref = (float*)malloc_check((size_t)R * C * sizeof(float));
    for (size_t k = 0; k < (size_t)R * C; k++) z_ref[k] = x[k] * v[k % C];
    int blocks = (R + TILE_ROWS - 1) / TILE_ROWS;
    printf("tma: y = X v, X (%d, %d) through a %d-slot ring of (%d, %d) tiles\n", R, C, STAGES, TILE_ROWS, TILE_COLS);
    // fp32 sums of C products: rounding ~ sqrt(C) 2^-24 of the terms' size (1e-6 at C = 8192);
    // a stale, missing or misplaced tile gives errors of order 1
    float tol = 1e-4f;
    int ok = 1;
    const char* names[] = {"", "v1 producer warp", "v2 warp-specialized"};
    for (int version = 1; version <= 2; version++) {
        device_memset_zero(d_y, R * sizeof(float));
        gemv_tma(version, d_y, map, d_v, R, C);
        ok &= validate_f32(names[version], d_y, ref, R, tol);
    }
    // Z: one product a value, rounded to floatX on the way out (the reference is not: the
    // default tolerance, half a bf16 step); a stale or missing tile is off by order 1
    device_memset_zero(d_z, (size_t)R * C * sizeof(floatX));
    scale_tma_kernel3<<<blocks, 160>>>(map, z_map, d_v, C);
    cudaCheckLaunch();
    ok &= validate("v3 TMA stores", d_z, z_ref, (size_t)R * C, default_tolerance());
#ifndef CUDA_EMU
    for (int version = 1; version <= 2; version++) {
        float ms;
        TIME_KERNEL(ms, 20, gemv_tma(version, d_y, map, d_v, R, C));
        report(names[version], ms, (double)R * C * sizeof(floatX), 0);
    }
    float ms;
    TIME_KERNEL(ms, 20, (scale_tma_kernel3<<<blocks, 160>>>(map, z_map, d_v, C)));
    report("v3 TMA stores", ms, 2.0 * R * C * sizeof(floatX), 0);
#endif
    device_free(d_x);
    device_free(d_v);
    device_free(d_y);
    device_free(d_z);
    free(z_ref);
    free(x);
    free(v);
    free(ref);
    return finish(ok);
#endif
}
