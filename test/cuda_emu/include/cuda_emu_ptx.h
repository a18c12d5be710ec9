// cuda_emu: the PTX wrappers of llmc/cuda/mma.cuh (mma.sync m16n8k16 bf16, ldmatrix .x4 plain
// and transposed, cp.async with commit/wait groups), after the PTX ISA's fragment tables that
// mma.cuh lists. Each lane puts its registers (or its row address) in the warp's exchange,
// waits at a warp barrier, then takes what the table gives it from every lane's entries, so a
// kernel that places a value in the wrong lane or register computes a wrong result here, as on a
// GPU. cp.async copies are held back until a cp_async_wait releases their group: a tile read
// before its wait (or before the __syncthreads after it) holds the previous tile's data.
#ifndef CUDA_EMU_PTX_H
#define CUDA_EMU_PTX_H

#include <cuda.h>
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
// element (m, k) of a 64 x 16 K-major A tile in the same layout (rows m, 8 rows a core matrix):
// sbo between core matrices 8 apart in m, lbo between the two 8-wide halves of k
static inline float wgmma_a_shared(const WgmmaOp& op, int m, int k) {
    size_t at = (size_t)(m % 8) * 16 + (m / 8) * op.a_sbo + (k / 8) * op.a_lbo + (k % 8) * 2;
    __nv_bfloat16 h;
    memcpy(&h.bits, op.a_tile + at, 2);
    return (float)h;
}
static inline void wgmma_run(WgmmaOp op, int lane) {
    int g = lane / 4, t = lane % 4;
    if (op.a_tile != NULL) {  // A from shared memory: this lane's two rows, read now
        for (int k = 0; k < 16; k++) {
            op.a[0][k] = wgmma_a_shared(op, op.a_row + g, k);
            op.a[1][k] = wgmma_a_shared(op, op.a_row + g + 8, k);
        }
    }
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
    op.a_tile = NULL;
    op.d = d;
    op.tile = b.tile;
    op.lbo = b.lbo;
    op.sbo = b.sbo;
    op.trans_b = trans_b;
    op.accumulate = accumulate;
    op.group = state.wgmma_group[me];
}
// the same product with A (64 x 16, K-major) from shared memory through a descriptor too: read
// at the wait, as B, so that refilling either tile before the wait gives a wrong result
template <int trans_b>
static inline void wgmma_m64n64k16_ss(float* d, WgmmaDesc a, WgmmaDesc b, int accumulate) {
    using namespace cuda_emu;
    int me = thread_index();
    if (state.threads % 128 != 0) die("wgmma: the block is not whole warpgroups of 128 threads");
    if (state.wgmma_count[me] == max_wgmma_ops) die("wgmma: too many products in flight");
    WgmmaOp& op = state.wgmma_ops[me][state.wgmma_count[me]++];
    op.a_tile = a.tile;
    op.a_lbo = a.lbo;
    op.a_sbo = a.sbo;
    op.a_row = 16 * (me / 32 % 4);
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

// ---- Hopper's asynchronous machinery (mma.cuh says what the kernels see): mbarriers, TMA loads
// through a tensor map, named barriers, setmaxnreg.
//
// A thread that waits (an mbarrier phase not yet complete, a named barrier not yet full) gives the
// CPU back, and the scheduler runs the other threads and warps (cuda_runtime.h); when no thread
// can go on, the run stops with a deadlock naming where they wait. Each order takes one extreme
// of what a GPU may do:
//   forward: a TMA load lands at the latest moment: its phase, once its arrivals and bytes are
//     in, is only due, and completes (the load lands) when a thread next waits on that barrier or
//     uses it (a tile read before the wait that covers it holds old data, even when the thread
//     waited on another barrier whose loads were issued later); a TMA store reads its shared-memory
//     source at the latest moment, the tma_store_wait that covers it (a source overwritten
//     before that wait is stored overwritten); and a release (the phase completing,
//     a named barrier filling) lets the thread that made it go on first;
//   reverse: a TMA load lands at once, a TMA store reads and writes at once (a store issued
//     before every thread has written its source stores what is there), and a release by a thread (its arrival completing a phase,
//     a named barrier filling) hands the CPU to the warps it woke before that thread goes on: a
//     consumer that arrives on its slot's "empty" barrier before it has read the slot finds it
//     refilled. A phase completed by a load's bytes lets the issuing thread go on (a producer
//     fills the ring ahead of its consumers, so that it waits on "empty" when they release).
namespace cuda_emu {

static inline Mbarrier& mbarrier_of(const uint64_t* bar) {
    auto it = state.mbarriers.find(bar);
    if (it == state.mbarriers.end()) die("an mbarrier used before mbarrier_init in this block");
    if (*bar != mbarrier_magic) die("an mbarrier's 8 bytes of shared memory were overwritten after its init");
    if (it->second.due) mbarrier_complete(it->second);  // used again: its due phase completes first
    return it->second;
}

// the phase completes once its arrivals are in and its bytes have landed. Forward order: a phase
// with loads becomes due, and completes (its loads land) only when a thread next waits on it or
// uses the barrier (mbarrier_passed, mbarrier_of); in reverse order it completes now, and when a
// thread's arrival completed it, its waiters run at once
static inline void mbarrier_progress(const uint64_t* bar, Mbarrier& m, int by_arrival) {
    if (m.tx <= -(1 << 20) || m.tx >= (1 << 20)) die("an mbarrier's transaction count left -(2^20-1)..2^20-1");
    if (m.pending != 0 || m.tx != 0) return;
    if (!state.reverse && !m.landing.empty()) {
        m.due = true;
        return;
    }
    mbarrier_complete(m);
    if (state.reverse && by_arrival) {
        hand_over([bar](int i) {
            const Fiber& f = state.fibers[i];
            return f.state == AT_MBARRIER && f.wait_on == bar && mbarrier_passed(bar, f.wait_parity);
        });
    }
}

// bar.sync (wait = 1) and bar.arrive (wait = 0): the barrier opens when `count` threads have come
static inline void named_barrier(int id, int count, int wait) {
    if (id < 1 || id >= named_barriers) die("a named barrier's id is outside 1..15 (0 is __syncthreads')");
    if (count <= 0 || count % 32 != 0 || count > state.threads)
        die("a named barrier's thread count is not a multiple of 32 up to the block's threads");
    note_sync();
    if (++state.named_arrived[id] < count) {
        if (wait) {
            state.current->wait_id = id;
            yield_to_scheduler(AT_NAMED_BARRIER);
        }
        return;
    }
    state.named_arrived[id] = 0;
    std::vector<char> released(state.threads, 0);
    for (int i = 0; i < state.threads; i++) {
        if (state.fibers[i].state == AT_NAMED_BARRIER && state.fibers[i].wait_id == id) {
            state.fibers[i].state = RUNNABLE;
            released[i] = 1;
        }
    }
    if (state.reverse) hand_over([&released](int i) { return released[i] != 0; });
}

// setmaxnreg: every warp of the warpgroup executes it (checked as the block ends), each warp's
// lanes together
static inline void setmaxnreg(int signed_regs) {
    if (state.threads % 128 != 0) die("setmaxnreg: the block is not whole warpgroups of 128 threads");
    note_sync();
    int me = thread_index();
    state.setmaxnreg_count[me]++;
    state.setmaxnreg_sign[me] = state.setmaxnreg_sign[me] * 31u + (uint32_t)(signed_regs + 512);
    barrier(AT_WARP_BARRIER);
}

}  // namespace cuda_emu

// mbarrier.init: `count` arrivals complete a phase (with the bytes announced by expect_tx)
static inline void mbarrier_init(uint64_t* bar, int count) {
    using namespace cuda_emu;
    if ((uintptr_t)bar % 8 != 0) die("mbarrier_init: the mbarrier is not 8-byte aligned");
    if (count < 1 || count >= (1 << 20)) die("mbarrier_init: the count is outside 1..2^20-1");
    note_sync();
    auto it = state.mbarriers.find(bar);
    if (it != state.mbarriers.end() && it->second.due) mbarrier_complete(it->second);
    if (it != state.mbarriers.end() && !it->second.landing.empty()) die("mbarrier_init: TMA loads are still landing on it");
    Mbarrier& m = state.mbarriers[bar];
    m = Mbarrier();
    m.count = m.pending = (uint32_t)count;
    *bar = mbarrier_magic;
}
// (makes the init visible to the TMA unit on a GPU; nothing to do here, and not checked)
static inline void mbarrier_init_fence(void) {}
static inline void mbarrier_arrive(uint64_t* bar) {
    using namespace cuda_emu;
    note_sync();
    Mbarrier& m = mbarrier_of(bar);
    if (m.pending == 0) die("mbarrier_arrive: more arrivals than the mbarrier's count in one phase");
    m.pending--;
    mbarrier_progress(bar, m, 1);
}
static inline void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
    cuda_emu::mbarrier_of(bar).tx += bytes;
    mbarrier_arrive(bar);
}
// 1 once the phase of this parity has completed; here a thread whose phase is not complete waits
// for it (a GPU's try_wait may also give up after a while and answer 0: callers loop)
static inline int mbarrier_try_wait_parity(uint64_t* bar, uint32_t parity) {
    using namespace cuda_emu;
    note_sync();
    if (parity > 1) die("mbarrier_try_wait_parity: the parity is not 0 or 1");
    mbarrier_of(bar);
    if (mbarrier_passed(bar, parity)) return 1;
    state.current->wait_on = bar;
    state.current->wait_parity = parity;
    yield_to_scheduler(AT_MBARRIER);
    return mbarrier_passed(bar, parity);
}
static inline void mbarrier_wait(uint64_t* bar, uint32_t parity) {
    while (!mbarrier_try_wait_parity(bar, parity)) {}
}

namespace cuda_emu {
// a TMA copy's tensor map, checked as the hardware would refuse it: made by the encoder, 2D, and
// its shared-memory end (`side`: destination or source) 128-byte aligned
static inline TensorMap tma_checked_map(const CUtensorMap* map, const void* shared, const char* op, const char* side) {
    TensorMap m;
    memcpy(&m, map, sizeof(m));
    char why[160];
    if (m.magic != tensor_map_magic) snprintf(why, sizeof(why), "%s: not a tensor map made by cuTensorMapEncodeTiled", op);
    else if (m.rank != 2) snprintf(why, sizeof(why), "%s: the tensor map's rank is not 2", op);
    else if ((uintptr_t)shared % 128 != 0) snprintf(why, sizeof(why), "%s: the shared-memory %s is not 128-byte aligned", op, side);
    else return m;
    die(why);
}
}  // namespace cuda_emu

// cp.async.bulk.tensor.2d: the box at column c0, row c1 of the map's tensor into shared memory at
// dst, its bytes counted against bar's phase (the order says when they land: above)
static inline void tma_load_2d(void* dst, const CUtensorMap* map, int c0, int c1, uint64_t* bar) {
    using namespace cuda_emu;
    note_sync();
    TmaLoad l;
    l.map = tma_checked_map(map, dst, "tma_load_2d", "destination");
    l.dst = dst;
    l.c0 = c0;
    l.c1 = c1;
    Mbarrier& m = mbarrier_of(bar);
    m.tx -= (long long)l.map.box[0] * l.map.box[1] * l.map.element_bytes;
    if (state.reverse) tma_land(l);
    else m.landing.push_back(l);
    mbarrier_progress(bar, m, 0);
}

namespace cuda_emu {
// a TMA store: the box of shared memory at src, row after row, into the tensor at column c0,
// row c1; the parts outside the tensor are not written
static inline void tma_store_land(const TmaStore& st) {
    const TensorMap& m = st.map;
    const unsigned char* src = (const unsigned char*)st.src;
    for (uint32_t r = 0; r < m.box[1]; r++) {
        for (uint32_t c = 0; c < m.box[0]; c++, src += m.element_bytes) {
            long long row = (long long)st.c1 + r, col = (long long)st.c0 + c;
            if (row >= 0 && row < (long long)m.dims[1] && col >= 0 && col < (long long)m.dims[0])
                memcpy((unsigned char*)m.base + row * m.strides[1] + col * m.element_bytes, src, m.element_bytes);
        }
    }
}
}  // namespace cuda_emu

// cp.async.bulk.tensor.2d global <- shared: the box at src (128-byte aligned) to column c0, row
// c1 of the map's tensor; its group (tma_store_commit) is waited for by tma_store_wait
static inline void tma_store_2d(const CUtensorMap* map, int c0, int c1, const void* src) {
    using namespace cuda_emu;
    note_sync();
    TmaStore st;
    st.map = tma_checked_map(map, src, "tma_store_2d", "source");
    st.src = src;
    st.c0 = c0;
    st.c1 = c1;
    int me = thread_index();
    st.group = state.tma_store_group[me];
    if (state.reverse) tma_store_land(st);
    else state.tma_stores[me].push_back(st);
}
static inline void tma_store_commit(void) { cuda_emu::state.tma_store_group[cuda_emu::thread_index()]++; }
// cp.async.bulk.wait_group.read: every committed group but the newest `newest` has read its
// source (here: read it and written the tensor, in issue order)
template <int newest> static inline void tma_store_wait(void) {
    using namespace cuda_emu;
    note_sync();
    int me = thread_index();
    std::vector<TmaStore>& stores = state.tma_stores[me];
    size_t kept = 0;
    for (size_t i = 0; i < stores.size(); i++) {
        if (stores[i].group < state.tma_store_group[me] - newest) tma_store_land(stores[i]);
        else stores[kept++] = stores[i];
    }
    stores.resize(kept);
}

static inline void named_barrier_sync(int id, int count) { cuda_emu::named_barrier(id, count, 1); }
static inline void named_barrier_arrive(int id, int count) { cuda_emu::named_barrier(id, count, 0); }

// the registers of each thread of the warpgroup raised to / lowered to `regs` (a GPU's register
// file is not emulated: only the rules are checked, here and when the block ends)
template <int regs> static inline void setmaxnreg_inc(void) {
    static_assert(regs % 8 == 0 && regs >= 24 && regs <= 256, "setmaxnreg: a multiple of 8 in 24..256");
    cuda_emu::setmaxnreg(regs);
}
template <int regs> static inline void setmaxnreg_dec(void) {
    static_assert(regs % 8 == 0 && regs >= 24 && regs <= 256, "setmaxnreg: a multiple of 8 in 24..256");
    cuda_emu::setmaxnreg(-regs);
}

#endif
