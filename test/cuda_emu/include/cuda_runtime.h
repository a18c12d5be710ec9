// cuda_emu: runs this project's CUDA code on the CPU, so that the CUDA backend's kernels, launchers
// and comm layer are tested on machines without a GPU. Not a general CUDA emulator: it covers the
// subset this project uses, and says so loudly when a kernel steps outside it.
//
// Each CUDA thread of a block is a fiber (a small stack and a saved stack pointer) on one OS
// thread. A block runs its fibers one after another; a fiber gives the CPU back only at
// __syncthreads (all live threads of the block), at __syncwarp, the shuffles and votes (all live lanes of
// its warp), at Hopper's waits (an mbarrier phase not yet complete, a named barrier not yet full:
// cuda_emu_ptx.h), and when it returns. Blocks run one after another, so __shared__ variables are plain
// statics. Kernels that reach no barrier in their first block run the rest as plain calls.
// CUDA_EMU_ORDER=reverse runs threads and blocks last to first: a kernel whose result depends on
// the order (a missing barrier, a race between blocks) gives a different answer one way or the other.
// Device memory is host memory; every call is synchronous; streams and events only keep time.
//
// Build (see the Makefile's build/emu_* rules): test/cuda_emu/translate.py rewrites each
// `kernel<<<grid, block>>>(args)` into `cuda_emu::launch("kernel", cuda_emu::Config(grid, block),
// kernel)(args)`, then g++ compiles the .cu file as C++ with -D__CUDACC__ -DCUDA_EMU and these
// headers in front of the real ones.
#ifndef CUDA_EMU_RUNTIME_H
#define CUDA_EMU_RUNTIME_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <functional>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

// ---- what the CUDA language adds to C++
#define __global__
#define __device__
#define __host__
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static  // one block runs at a time: a static is the block's shared memory
#define __launch_bounds__(...)
#define __grid_constant__  // (a by-value kernel parameter read in place: a copy here, as every argument)

struct uint3 { unsigned int x, y, z; };
struct alignas(16) uint4 { unsigned int x, y, z, w; };  // (16-byte loads and stores as one value)
struct alignas(8) float2 { float x, y; };
static inline float2 make_float2(float x, float y) { return {x, y}; }
// loads and stores past the L1 cache (.cg), and a pause in a wait: plain here
template <class T> static inline T __ldcg(const T* p) { return *p; }
template <class T> static inline void __stcg(T* p, T v) { *p = v; }
static inline void __nanosleep(unsigned int) {}
[[noreturn]] static inline void __trap(void) { fprintf(stderr, "cuda_emu: __trap\n"); exit(3); }
struct dim3 {
    unsigned int x, y, z;
    dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
};

template <class A, class B> static inline auto min(A a, B b) -> decltype(a + b) { return a < b ? a : b; }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline unsigned int __float_as_uint(float x) { unsigned int u; memcpy(&u, &x, 4); return u; }
static inline float __uint_as_float(unsigned int u) { float x; memcpy(&x, &u, 4); return x; }
// one OS thread runs every CUDA thread, and switches only at barriers: atomics are plain
template <class T> static inline T atomicAdd(T* address, T value) { T old = *address; *address = old + value; return old; }
template <class T> static inline T atomicMax(T* address, T value) { T old = *address; *address = old > value ? old : value; return old; }

// ---- the runtime API, synchronous (but for NCCL's point-to-point work: CUstream_st below)
typedef enum {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevice = 101,
    cudaErrorNoDevice = 100,
} cudaError_t;
typedef cudaError_t cudaError;
typedef enum { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 } cudaFuncAttribute;
typedef enum { cudaMemcpyHostToHost, cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost, cudaMemcpyDeviceToDevice, cudaMemcpyDefault } cudaMemcpyKind;
// A stream runs each kernel and copy at once, in the order the host makes them. What it cannot
// finish at once is NCCL's point-to-point work (nccl.h), which waits for its peers: each such
// piece is posted on its stream and finished, in the stream's order, when something must see its
// end (an event it is recorded before, waited for or synchronized; a later call on its stream; a
// stream or device synchronize). So a send posted on a stream of its own moves beside the host's
// work, as on a GPU, and one posted on a busy stream waits for what is queued ahead of it.
struct CUstream_st {
    std::vector<std::function<void()>> work;  // posted, in order
    size_t finished = 0;                       // work[0 .. finished) is done ...
    std::vector<double> finished_ms;           // ... each at this time (ms)
};
typedef struct CUstream_st* cudaStream_t;
// an event is a time: at its record, or, recorded behind unfinished work, when that finishes
typedef struct cuda_emu_event {
    double ms;
    cudaStream_t stream;  // not NULL: recorded behind work of `stream` not yet finished ...
    size_t upto;          // ... its first `upto` pieces
}* cudaEvent_t;
#define cudaStreamNonBlocking 1
#define cudaEventDisableTiming 2
typedef struct {
    char name[256];
    int major, minor, multiProcessorCount, maxThreadsPerBlock, warpSize;
    size_t totalGlobalMem, sharedMemPerBlock;
} cudaDeviceProp;

namespace cuda_emu {

static const size_t device_bytes = (size_t)80 << 30;  // what cudaMemGetInfo reports as total
static const int stack_bytes = 64 << 10;              // per fiber
static const int max_threads = 1024;
static const size_t guard_bytes = 256;                // before and after every allocation
static const unsigned char guard_value = 0xa5;

struct Fiber {
    void* sp;  // saved stack pointer while the fiber is switched out
    int state;
    uint3 thread_idx;
    const void* wait_on;   // AT_MBARRIER: the mbarrier ...
    uint32_t wait_parity;  // ... and the parity of the phase it waits to see complete
    int wait_id;           // AT_NAMED_BARRIER: the barrier's id
};
enum { RUNNABLE, AT_WARP_BARRIER, AT_BLOCK_BARRIER, AT_MBARRIER, AT_NAMED_BARRIER, DONE };

// cp.async (cuda_emu_ptx.h): a copy issued but not yet waited for; it lands at cp_async_wait
struct AsyncCopy {
    void* dst;
    const void* src;  // NULL: 16 zero bytes
    int group;
};
static const int max_async_copies = 64;  // per thread

// wgmma (cuda_emu_ptx.h): a product issued but not yet waited for; it runs at wgmma_wait, reading
// its B tile from shared memory then
struct WgmmaOp {
    float* d;                    // the issuing thread's 32 accumulators
    float a[2][16];              // rows g and g + 8 of its warp's A, gathered at issue (A in registers)
    const unsigned char* a_tile; // A in shared memory (not NULL): its K-major tile and strides, read
    uint32_t a_lbo, a_sbo;       // at the wait, rows 16 (warp % 4) + g and + 8
    int a_row;
    const unsigned char* tile;   // B: the descriptor's tile and strides
    uint32_t lbo, sbo;
    int trans_b, accumulate, group;
};
static const int max_wgmma_ops = 16;  // per thread

// A tensor map (cuda.h's CUtensorMap, made by cuTensorMapEncodeTiled): what TMA needs to copy a box
// of a tensor in global memory, held in the 128 bytes of the real one
struct TensorMap {
    uint64_t magic;                  // tensor_map_magic: made by the emulator's cuTensorMapEncodeTiled
    const unsigned char* base;
    uint32_t rank, element_bytes;
    uint64_t dims[5], strides[5];    // elements; bytes (strides[0] = one element)
    uint32_t box[5];                 // elements
};
static const uint64_t tensor_map_magic = 0x50414d524f534e45ull;
// a TMA load (cp.async.bulk.tensor) of a 2D box into shared memory, not yet landed
struct TmaLoad {
    void* dst;
    TensorMap map;
    int c0, c1;  // the box's first column and row (may lie outside the tensor: zeros there)
};
// a TMA store of a 2D box from shared memory, issued but not yet waited for
struct TmaStore {
    const void* src;
    TensorMap map;
    int c0, c1, group;
};
// Hopper's mbarrier (cuda_emu_ptx.h): a phase completes when its arrivals are in and the bytes
// it expects have landed; then the next phase begins with the same count
struct Mbarrier {
    uint32_t count, pending;        // arrivals a phase expects; still to come in this one
    long long tx;                   // bytes expected (arrive.expect_tx) less bytes landed
    uint32_t phase;                 // phases completed
    std::vector<TmaLoad> landing;   // forward order: loads whose data lands when this phase completes
    bool due;                       // forward order: arrivals and bytes all in, the phase (and its loads'
                                    // landing) held back until a thread next waits on it or uses the barrier
};
static const uint64_t mbarrier_magic = 0x5245495252414272ull;  // an mbarrier's 8 bytes while initialized
static const int named_barriers = 16;  // bar.sync ids 0-15; 0 is __syncthreads'

struct State {
    uint3 block_idx;
    dim3 block_dim, grid_dim;
    const char* kernel;
    Fiber fibers[max_threads];
    Fiber* current;
    int threads, fibered;       // threads in a block; whether the block runs as fibers
    int reverse;                // CUDA_EMU_ORDER=reverse: threads and blocks last to first
    int warp_serial;            // CUDA_EMU_SCHEDULE: warp-serial (default) or lockstep
    int order_read;             // CUDA_EMU_ORDER and CUDA_EMU_SCHEDULE are read at the first launch
    long block_serial;          // counts blocks run: shared memory is poisoned once per block
    std::unordered_map<void*, long> shared_poisoned;  // each __shared__ array: the block it was poisoned for
    // dynamic shared memory (extern __shared__, which translate.py makes a dynamic_shared() call):
    // the launch's bytes, poisoned for each block; and each kernel's limit (cudaFuncSetAttribute)
    unsigned char* dynamic_shared;
    size_t dynamic_shared_bytes;
    std::unordered_map<const void*, size_t> dynamic_shared_limit;
    long barriers;              // barriers reached in the block being run
    void* scheduler_sp;
    unsigned char* stacks;
    void (*body)(void*);        // runs the kernel for the current thread
    void* body_arg;
    uint64_t exchange[max_threads];  // shuffles and votes: each lane's value, by thread index
    uint32_t words[max_threads][8];  // mma and ldmatrix: each lane's registers or row address
    AsyncCopy async_copies[max_threads][max_async_copies];
    int async_count[max_threads], async_group[max_threads];
    WgmmaOp wgmma_ops[max_threads][max_wgmma_ops];
    int wgmma_count[max_threads], wgmma_group[max_threads];
    std::unordered_map<const void*, Mbarrier> mbarriers;  // the block's, by address (cleared as it ends)
    std::vector<TmaStore> tma_stores[max_threads];         // each thread's, not yet waited for ...
    int tma_store_group[max_threads];                      // ... and its bulk groups committed
    int named_arrived[named_barriers];                     // threads at each named barrier
    std::vector<int> woken;     // reverse order: warps a release hands the CPU to before its thread goes on
    int setmaxnreg_count[max_threads];      // setmaxnreg: how many each thread executed ...
    uint32_t setmaxnreg_sign[max_threads];  // ... and a signature of their values
    cudaError_t last_error;
    int device;
    size_t allocated;
    std::unordered_map<void*, size_t> allocations;
};
static State state;

[[noreturn]] static inline void die(const char* what) {
    fprintf(stderr, "cuda_emu: kernel %s: %s\n", state.kernel ? state.kernel : "(none)", what);
    exit(3);
}

// A __shared__ array is a static here, so without this a block would find the previous block's
// values in it, often close enough to pass. translate.py puts a call after every __shared__
// declaration; the first thread of each block to pass it fills the array with 0xff bytes (NaN as
// float or bf16, -1 as an integer), so a read before any write of this block shows.
static inline void shared_poison(void* array, size_t bytes) {
    long& block = state.shared_poisoned[array];
    if (block == state.block_serial) return;
    memset(array, 0xff, bytes);
    block = state.block_serial;
}
// the block's dynamic shared memory (poisoned as above when the block starts)
static inline unsigned char* dynamic_shared(void) {
    if (state.dynamic_shared_bytes == 0) die("extern __shared__ memory used by a launch that asked for none");
    return state.dynamic_shared;
}
// a GPU refuses a launch that asks for more than 48 KB of dynamic shared memory unless the kernel
// was allowed more (cudaFuncSetAttribute), and an allowance past what an SM has (227 KB on Hopper)
static const size_t default_dynamic_shared = 48 << 10, max_dynamic_shared = 227 << 10;

// every allocation sits between two guard zones; a kernel, GEMM or collective that writes past
// either end of a buffer is named as soon as it returns
static inline void check_guards(const char* what) {
    for (auto& a : state.allocations) {
        const unsigned char* p = (const unsigned char*)a.first;
        for (size_t i = 0; i < guard_bytes; i++) {
            if (p[-1 - (long)i] != guard_value || p[a.second + i] != guard_value) {
                fprintf(stderr, "cuda_emu: %s wrote outside a device buffer of %zu bytes (%zu bytes %s it)\n", what,
                        a.second, i + 1, p[-1 - (long)i] != guard_value ? "before" : "after");
                exit(3);
            }
        }
    }
}

static inline double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

}  // namespace cuda_emu

// ---- fibers: a context switch saves the callee-saved registers on the old stack and loads the new
#if defined(__x86_64__)
extern "C" void cuda_emu_switch(void** save_sp, void* load_sp);
extern "C" void cuda_emu_fiber_main(void);
asm(".text\n"
    ".globl cuda_emu_switch\n"
    ".type cuda_emu_switch,@function\n"
    "cuda_emu_switch:\n"
    "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
    "  movq %rsp, (%rdi)\n"
    "  movq %rsi, %rsp\n"
    "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
    "  ret\n"
    ".size cuda_emu_switch, .-cuda_emu_switch\n");
namespace cuda_emu {
// a new fiber's stack, as if it had been switched out just before entering cuda_emu_fiber_main
static inline void* fiber_stack(unsigned char* stack) {
    uintptr_t top = ((uintptr_t)stack + stack_bytes) & ~(uintptr_t)15;
    void** sp = (void**)top;
    *--sp = NULL;                           // return address slot: entered as if called
    *--sp = (void*)&cuda_emu_fiber_main;    // where `ret` goes
    for (int i = 0; i < 6; i++) *--sp = NULL;  // rbp rbx r12 r13 r14 r15
    return sp;
}
static inline void switch_to(void** save, void* load) { cuda_emu_switch(save, load); }
}  // namespace cuda_emu
#else
#error "cuda_emu: fibers are written for x86-64 only"
#endif

namespace cuda_emu {

static inline void yield_to_scheduler(int new_state) {
    state.current->state = new_state;
    switch_to(&state.current->sp, state.scheduler_sp);
}

// every synchronizing call counts: a block that makes one runs as fibers, and so must every block
static inline void note_sync(void) {
    if (!state.fibered) die("reached a barrier, but its first block reached none; this emulator "
                            "assumes every block of a launch synchronises alike");
    state.barriers++;
}
// all live threads of the block, or all live lanes of the current warp, meet here
static inline void barrier(int kind) {
    note_sync();
    yield_to_scheduler(kind);
}

static inline int linear_thread(uint3 t) {
    return (int)(t.x + state.block_dim.x * (t.y + state.block_dim.y * t.z));
}

template <class T> static inline T shuffle(T value, int src_lane, int valid) {
    static_assert(sizeof(T) <= 8, "shuffle of a value over 8 bytes");
    int me = linear_thread(state.current->thread_idx);
    int warp_base = me - me % 32;
    uint64_t bits = 0;
    memcpy(&bits, &value, sizeof(T));
    state.exchange[me] = bits;
    barrier(AT_WARP_BARRIER);  // every lane has written
    int src = warp_base + src_lane;
    if (valid && src < state.threads) memcpy(&value, &state.exchange[src], sizeof(T));
    barrier(AT_WARP_BARRIER);  // every lane has read before the next shuffle writes
    return value;
}

}  // namespace cuda_emu

static inline void __syncthreads(void) { cuda_emu::barrier(cuda_emu::AT_BLOCK_BARRIER); }
static inline void __syncwarp(unsigned int mask = 0xffffffffu) {
    if (mask != 0xffffffffu) cuda_emu::die("__syncwarp with a partial mask is not emulated");
    cuda_emu::barrier(cuda_emu::AT_WARP_BARRIER);
}
template <class T> static inline T __shfl_xor_sync(unsigned int mask, T v, int lane_mask) {
    if (mask != 0xffffffffu) cuda_emu::die("shuffle with a partial mask is not emulated");
    int lane = (int)(cuda_emu::linear_thread(cuda_emu::state.current->thread_idx) % 32);
    return cuda_emu::shuffle(v, lane ^ lane_mask, 1);
}
template <class T> static inline T __shfl_sync(unsigned int mask, T v, int src_lane) {
    if (mask != 0xffffffffu) cuda_emu::die("shuffle with a partial mask is not emulated");
    return cuda_emu::shuffle(v, src_lane % 32, 1);
}
// the warp's votes: bit i of the ballot is lane i's predicate (0 for lanes past the block's
// threads and lanes that have returned)
static inline unsigned int __ballot_sync(unsigned int mask, int predicate) {
    if (mask != 0xffffffffu) cuda_emu::die("a vote with a partial mask is not emulated");
    int me = cuda_emu::linear_thread(cuda_emu::state.current->thread_idx), warp_base = me - me % 32;
    cuda_emu::state.exchange[me] = predicate != 0;
    cuda_emu::barrier(cuda_emu::AT_WARP_BARRIER);  // every live lane has voted
    unsigned int ballot = 0;
    for (int i = 0; i < 32 && warp_base + i < cuda_emu::state.threads; i++)
        if (cuda_emu::state.fibers[warp_base + i].state != cuda_emu::DONE)
            ballot |= (unsigned int)(cuda_emu::state.exchange[warp_base + i] & 1) << i;
    cuda_emu::barrier(cuda_emu::AT_WARP_BARRIER);  // every lane has counted before the next vote writes
    return ballot;
}
static inline int __any_sync(unsigned int mask, int predicate) { return __ballot_sync(mask, predicate) != 0; }
#define threadIdx (cuda_emu::state.current->thread_idx)
#define blockIdx (cuda_emu::state.block_idx)
#define blockDim (cuda_emu::state.block_dim)
#define gridDim (cuda_emu::state.grid_dim)

extern "C" inline void cuda_emu_fiber_main(void) {
    cuda_emu::state.body(cuda_emu::state.body_arg);
    cuda_emu::yield_to_scheduler(cuda_emu::DONE);
    cuda_emu::die("a finished fiber was resumed");
}

namespace cuda_emu {

// a TMA box of a 2D tensor lands in shared memory: rows c1.., columns c0.. of the tensor, dense
// and row after row (no swizzle), zeros where the box leaves the tensor
static inline void tma_land(const TmaLoad& l) {
    const TensorMap& m = l.map;
    unsigned char* dst = (unsigned char*)l.dst;
    for (uint32_t r = 0; r < m.box[1]; r++) {
        for (uint32_t c = 0; c < m.box[0]; c++, dst += m.element_bytes) {
            long long row = (long long)l.c1 + r, col = (long long)l.c0 + c;
            if (row >= 0 && row < (long long)m.dims[1] && col >= 0 && col < (long long)m.dims[0])
                memcpy(dst, m.base + row * m.strides[1] + col * m.element_bytes, m.element_bytes);
            else
                memset(dst, 0, m.element_bytes);
        }
    }
}

// a phase completes: its loads land, the next phase begins with the same count
static inline void mbarrier_complete(Mbarrier& m) {
    for (const TmaLoad& l : m.landing) tma_land(l);
    m.landing.clear();
    m.due = false;
    m.phase++;
    m.pending = m.count;
}

// a thread waiting on an mbarrier for the phase of parity p may go on once that phase has
// completed: when the barrier's current phase has the other parity (PTX's try_wait.parity). A
// due phase (forward order) completes now, as the thread looks at it: the latest moment its loads
// may land, so that a thread reading a tile whose own barrier it never waited on (only another's)
// finds it not there
static inline int mbarrier_passed(const void* bar, uint32_t parity) {
    auto it = state.mbarriers.find(bar);
    if (it == state.mbarriers.end()) return 0;
    if (it->second.due && (it->second.phase & 1) == parity) mbarrier_complete(it->second);
    return (it->second.phase & 1) != parity;
}

static int run_warp_alone(int w, int n, int* live);

// runs every runnable fiber among threads [first, end) once, in order (or reversed); returns how
// many ran and lowers *live for each that finished. A fiber waiting on an mbarrier whose phase
// has completed is runnable again. A fiber whose release woke other warps (reverse order, below)
// has given the CPU back to hand it to them: they run before it goes on.
static int run_fibers_once(int first, int end, int* live) {
    int ran = 0;
    for (int j = first; j < end; j++) {
        int i = state.reverse ? first + end - 1 - j : j;
        Fiber& f = state.fibers[i];
        if (f.state == AT_MBARRIER && mbarrier_passed(f.wait_on, f.wait_parity)) f.state = RUNNABLE;
        if (f.state != RUNNABLE) continue;
        state.current = &f;
        switch_to(&state.scheduler_sp, f.sp);
        ran++;
        if (f.state == DONE) (*live)--;
        if (!state.woken.empty()) {
            std::vector<int> woken;
            woken.swap(state.woken);
            for (int w : woken) ran += run_warp_alone(w, state.threads, live);
        }
    }
    return ran;
}

// a warp barrier opens when every live lane of the warp waits at one
static int release_warp_barrier(int w, int n) {
    int waiting = 0, alive = 0;
    for (int i = w; i < w + 32 && i < n; i++) {
        alive += state.fibers[i].state != DONE;
        waiting += state.fibers[i].state == AT_WARP_BARRIER;
    }
    if (waiting == 0 || waiting != alive) return 0;
    for (int i = w; i < w + 32 && i < n; i++)
        if (state.fibers[i].state == AT_WARP_BARRIER) state.fibers[i].state = RUNNABLE;  // (not the lanes that returned)
    return 1;
}

// warp w alone, its lanes interleaving at warp barriers, until none of them can go on
static int run_warp_alone(int w, int n, int* live) {
    int ran = 0;
    for (;;) {
        int r = run_fibers_once(w, w + 32 < n ? w + 32 : n, live);
        ran += r;
        if (!release_warp_barrier(w, n) && r == 0) return ran;
    }
}

// In reverse order a release hands the CPU over: the warps it let go on (but the releasing
// thread's), last to first, run before the releasing thread goes on (cuda_emu_ptx.h says why).
// released(i): whether thread i was let go on
template <class F> static inline void hand_over(F released) {
    int me = linear_thread(state.current->thread_idx);
    for (int i = state.threads - 1; i >= 0; i--) {
        int w = i - i % 32;
        if (w != me - me % 32 && (state.woken.empty() || state.woken.back() != w) && released(i)) state.woken.push_back(w);
    }
    if (!state.woken.empty()) yield_to_scheduler(RUNNABLE);
}

// nobody can go on: say where every live thread waits
[[noreturn]] static void deadlock(int n) {
    int at[DONE] = {0};
    for (int i = 0; i < n; i++) {
        if (state.fibers[i].state != DONE) at[state.fibers[i].state]++;
    }
    char what[256];
    snprintf(what, sizeof(what), "deadlock: no thread can go on (%d at __syncthreads, %d at warp barriers, %d waiting on "
             "an mbarrier phase, %d at named barriers)", at[AT_BLOCK_BARRIER], at[AT_WARP_BARRIER], at[AT_MBARRIER],
             at[AT_NAMED_BARRIER]);
    die(what);
}

// One block: every thread as a fiber, released from barriers when all it waits for have arrived.
// Warp-serial (the default): between two block barriers each warp runs alone, its lanes
// interleaving at warp barriers, until all its live lanes wait at the block barrier or have
// finished; then the next warp. So a warp that reads shared memory another warp writes, with no
// block barrier in between, reads it before (forward order) or after (reverse) the write, and
// one of the two orders gives a wrong answer. Lock-step (CUDA_EMU_SCHEDULE=lockstep) runs all
// runnable threads of the block round-robin: all warps advance together, which hides such races.
static void run_block_fibers(void) {
    int n = state.threads;
    if (state.stacks == NULL) {
        state.stacks = (unsigned char*)malloc((size_t)max_threads * stack_bytes);
        if (state.stacks == NULL) die("no memory for fiber stacks");
    }
    for (int i = 0; i < n; i++) {
        state.fibers[i].sp = fiber_stack(state.stacks + (size_t)i * stack_bytes);
        state.fibers[i].state = RUNNABLE;
        state.async_count[i] = state.async_group[i] = 0;
        state.wgmma_count[i] = state.wgmma_group[i] = 0;
        state.setmaxnreg_count[i] = 0;
        state.setmaxnreg_sign[i] = 0;
        state.tma_stores[i].clear();
        state.tma_store_group[i] = 0;
    }
    memset(state.named_arrived, 0, sizeof(state.named_arrived));
    state.mbarriers.clear();
    int live = n, warps = (n + 31) / 32;
    while (live > 0) {
        int ran = 0, released = 0;
        if (state.warp_serial) {
            for (int k = 0; k < warps; k++)  // each warp alone, until it waits at a barrier or ends
                ran += run_warp_alone(32 * (state.reverse ? warps - 1 - k : k), n, &live);
        } else {
            ran = run_fibers_once(0, n, &live);
            for (int w = 0; w < n; w += 32) released |= release_warp_barrier(w, n);
        }
        if (!released && live > 0) {  // the block barrier: every live thread waits at it
            int waiting = 0;
            for (int i = 0; i < n; i++) waiting += state.fibers[i].state == AT_BLOCK_BARRIER;
            if (waiting == live) {
                for (int i = 0; i < n; i++) {
                    if (state.fibers[i].state == AT_BLOCK_BARRIER) state.fibers[i].state = RUNNABLE;
                }
                released = 1;
            }
        }
        if (!released && !ran && live > 0) deadlock(n);
    }
    for (int i = 0; i < n; i++) {
        if (state.async_count[i] > 0) die("a thread ended with cp.async copies it never waited for");
        if (state.wgmma_count[i] > 0) die("a thread ended with wgmma products it never waited for");
        if (!state.tma_stores[i].empty()) die("a thread ended with TMA stores it never waited for (their source may be gone)");
        // setmaxnreg is warpgroup-wide: all 128 threads execute the same ones
        int lead = i - i % 128;
        if (state.setmaxnreg_count[i] != state.setmaxnreg_count[lead] || state.setmaxnreg_sign[i] != state.setmaxnreg_sign[lead]) {
            char what[160];
            snprintf(what, sizeof(what), "setmaxnreg: threads %d and %d of one warpgroup executed different setmaxnreg "
                     "(%d and %d of them): the whole warpgroup must", lead, i, state.setmaxnreg_count[lead], state.setmaxnreg_count[i]);
            die(what);
        }
    }
    for (auto& b : state.mbarriers) {
        if (b.second.due) mbarrier_complete(b.second);  // (complete on a GPU, though nobody waited)
        if (!b.second.landing.empty()) die("the block ended with TMA loads whose mbarrier phase never completed");
    }
    for (int id = 1; id < named_barriers; id++) {
        if (state.named_arrived[id] > 0) die("the block ended with threads arrived at a named barrier that never filled");
    }
    state.mbarriers.clear();
}

// the i-th of n ordered (x fastest) indices of extent d, or the i-th from the end when reversed
static inline uint3 index_3d(size_t i, dim3 d, size_t n) {
    if (state.reverse) i = n - 1 - i;
    return {(unsigned)(i % d.x), (unsigned)(i / d.x % d.y), (unsigned)(i / d.x / d.y)};
}

static void run_block_plain(void) {
    Fiber* f = &state.fibers[0];
    state.current = f;
    for (int i = 0; i < state.threads; i++) {
        f->thread_idx = index_3d(i, state.block_dim, state.threads);
        state.body(state.body_arg);
    }
}

static void run_grid(void) {
    dim3 g = state.grid_dim, b = state.block_dim;
    if (!state.order_read) {
        const char* order = getenv("CUDA_EMU_ORDER");
        if (order != NULL && *order && strcmp(order, "forward") != 0 && strcmp(order, "reverse") != 0) {
            fprintf(stderr, "cuda_emu: CUDA_EMU_ORDER=%s: expected forward or reverse\n", order);
            exit(3);
        }
        state.reverse = order != NULL && strcmp(order, "reverse") == 0;
        const char* schedule = getenv("CUDA_EMU_SCHEDULE");
        if (schedule != NULL && *schedule && strcmp(schedule, "warp-serial") != 0 && strcmp(schedule, "lockstep") != 0) {
            fprintf(stderr, "cuda_emu: CUDA_EMU_SCHEDULE=%s: expected warp-serial or lockstep\n", schedule);
            exit(3);
        }
        state.warp_serial = schedule == NULL || !*schedule || strcmp(schedule, "warp-serial") == 0;
        state.order_read = 1;
    }
    for (unsigned z = 0; z < b.z; z++)
        for (unsigned y = 0; y < b.y; y++)
            for (unsigned x = 0; x < b.x; x++) state.fibers[x + b.x * (y + b.y * z)].thread_idx = {x, y, z};
    int first = 1;
    size_t blocks = (size_t)g.x * g.y * g.z;
    for (size_t blk = 0; blk < blocks; blk++) {
        state.block_idx = index_3d(blk, g, blocks);
        state.block_serial++;
        if (state.dynamic_shared_bytes > 0) memset(state.dynamic_shared, 0xff, state.dynamic_shared_bytes);
        if (first || state.fibered) {
            state.fibered = 1;
            state.barriers = 0;
            run_block_fibers();
            if (first) state.fibered = state.barriers > 0;
            first = 0;
        } else {
            run_block_plain();
        }
    }
}

struct Config {
    dim3 grid, block;
    size_t shared_bytes;
    Config(dim3 g, dim3 b, size_t shared = 0, cudaStream_t stream = 0) : grid(g), block(b), shared_bytes(shared) { (void)stream; }
};

// the launch: arguments are converted to the kernel's parameter types once, as CUDA does
template <class... P> struct Launch {
    const char* name;
    Config config;
    void (*kernel)(P...);
    std::tuple<P...> args;
    Launch(const char* n, Config c, void (*k)(P...)) : name(n), config(c), kernel(k) {}
    static void call(void* self) {
        Launch* l = (Launch*)self;
        std::apply(l->kernel, l->args);
    }
    void operator()(P... p) {
        args = std::tuple<P...>(p...);
        dim3 g = config.grid, b = config.block;
        size_t threads = (size_t)b.x * b.y * b.z;
        if (threads == 0 || threads > (size_t)max_threads || g.x == 0 || g.y == 0 || g.z == 0 ||
            g.y > 65535 || g.z > 65535) {
            state.last_error = cudaErrorInvalidConfiguration;
            return;
        }
        auto limit = state.dynamic_shared_limit.find((const void*)kernel);
        if (config.shared_bytes > (limit == state.dynamic_shared_limit.end() ? default_dynamic_shared : limit->second)) {
            state.last_error = cudaErrorInvalidValue;  // (as a GPU answers)
            return;
        }
        if (config.shared_bytes > state.dynamic_shared_bytes) {
            free(state.dynamic_shared);
            state.dynamic_shared = (unsigned char*)aligned_alloc(128, (config.shared_bytes + 127) / 128 * 128);
            if (state.dynamic_shared == NULL) die("no memory for dynamic shared memory");
        }
        state.dynamic_shared_bytes = config.shared_bytes;
        state.kernel = name;
        state.grid_dim = g;
        state.block_dim = b;
        state.threads = (int)threads;
        state.body = &Launch::call;
        state.body_arg = this;
        run_grid();
        check_guards(name);
        state.kernel = NULL;
    }
};
template <class... P> static inline Launch<P...> launch(const char* name, Config config, void (*kernel)(P...)) {
    return Launch<P...>(name, config, kernel);
}

}  // namespace cuda_emu

// the one attribute this project sets: how much dynamic shared memory a kernel may ask for
template <class F> static inline cudaError_t cudaFuncSetAttribute(F* kernel, cudaFuncAttribute attribute, int value) {
    if (attribute != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 || (size_t)value > cuda_emu::max_dynamic_shared)
        return cudaErrorInvalidValue;
    cuda_emu::state.dynamic_shared_limit[(const void*)kernel] = (size_t)value;
    return cudaSuccess;
}

static inline cudaError_t cudaGetLastError(void) {
    cudaError_t e = cuda_emu::state.last_error;
    cuda_emu::state.last_error = cudaSuccess;
    return e;
}
static inline const char* cudaGetErrorString(cudaError_t e) {
    switch (e) {
        case cudaSuccess: return "no error";
        case cudaErrorInvalidValue: return "invalid argument";
        case cudaErrorMemoryAllocation: return "out of memory";
        case cudaErrorInvalidConfiguration: return "invalid configuration argument";
        case cudaErrorInvalidDevice: return "invalid device ordinal";
        case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    }
    return "unknown error";
}

// CUDA_EMU_DEVICES (default 1) emulated GPUs, so tests can choose one GPU per rank or a shared one
static inline cudaError_t cudaGetDeviceCount(int* count) {
    const char* v = getenv("CUDA_EMU_DEVICES");
    *count = v && *v ? atoi(v) : 1;
    return cudaSuccess;
}
static inline cudaError_t cudaSetDevice(int device) {
    int count;
    cudaGetDeviceCount(&count);
    if (device < 0 || device >= count) return cudaErrorInvalidDevice;
    cuda_emu::state.device = device;
    return cudaSuccess;
}
static inline cudaError_t cudaGetDevice(int* device) { *device = cuda_emu::state.device; return cudaSuccess; }
static inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
    (void)device;
    memset(prop, 0, sizeof(*prop));
    snprintf(prop->name, sizeof(prop->name), "cuda_emu (CPU)");
    prop->multiProcessorCount = 1;
    prop->maxThreadsPerBlock = cuda_emu::max_threads;
    prop->warpSize = 32;
    prop->totalGlobalMem = cuda_emu::device_bytes;
    prop->sharedMemPerBlock = 48 << 10;
    return cudaSuccess;  // major.minor 0.0: no peak FLOP/s is known, so no MFU is printed
}

static inline cudaError_t cudaMalloc(void** p, size_t bytes) {
    using cuda_emu::state;
    *p = NULL;
    if (state.allocated + bytes > cuda_emu::device_bytes) return cudaErrorMemoryAllocation;
    size_t guard = cuda_emu::guard_bytes;
    unsigned char* base = (unsigned char*)aligned_alloc(256, guard + (bytes + guard + 255) / 256 * 256);
    if (base == NULL) return cudaErrorMemoryAllocation;
    unsigned char* q = base + guard;
    memset(base, cuda_emu::guard_value, guard);
    memset(q, 0xff, bytes);  // NaN bytes: a kernel that reads memory nobody wrote shows it
    memset(q + bytes, cuda_emu::guard_value, guard);
    state.allocations[q] = bytes;
    state.allocated += bytes;
    *p = q;
    return cudaSuccess;
}
template <class T> static inline cudaError_t cudaMalloc(T** p, size_t bytes) { return cudaMalloc((void**)p, bytes); }
static inline cudaError_t cudaFree(void* p) {
    using cuda_emu::state;
    if (p == NULL) return cudaSuccess;
    auto it = state.allocations.find(p);
    if (it == state.allocations.end()) return cudaErrorInvalidValue;
    state.allocated -= it->second;
    state.allocations.erase(it);
    free((unsigned char*)p - cuda_emu::guard_bytes);
    return cudaSuccess;
}
static inline cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
    *total_bytes = cuda_emu::device_bytes;
    *free_bytes = cuda_emu::device_bytes - cuda_emu::state.allocated;
    return cudaSuccess;
}
static inline cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
    (void)kind;
    if (bytes) memmove(dst, src, bytes);
    return cudaSuccess;
}
namespace cuda_emu {
static std::vector<cudaStream_t> streams;  // every stream made, for cudaDeviceSynchronize

// finish stream s's work up to its first `upto` pieces, in order (NCCL's waits happen here)
static inline void stream_finish(cudaStream_t s, size_t upto) {
    while (s != NULL && s->finished < upto) {
        std::function<void()> piece = std::move(s->work[s->finished]);
        s->work[s->finished] = nullptr;
        piece();
        s->finished++;
        s->finished_ms.push_back(now_ms());
    }
}
static inline void stream_finish_all(cudaStream_t s) {
    if (s != NULL) stream_finish(s, s->work.size());
}
// a piece of work that finishes later; on the default stream (0), at once
static inline void stream_post(cudaStream_t s, std::function<void()> piece) {
    if (s == NULL) {
        piece();
        return;
    }
    s->work.push_back(std::move(piece));
}
// what event e marks is done: its time is known
static inline void event_finish(cudaEvent_t e) {
    if (e->stream == NULL) return;
    stream_finish(e->stream, e->upto);
    e->ms = e->stream->finished_ms[e->upto - 1];
    e->stream = NULL;
}
}  // namespace cuda_emu

// the emulator's streams run each call at once, in the order the host makes them
static inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s = 0) {
    cuda_emu::stream_finish_all(s);  // (after the stream's unfinished work, in its order)
    return cudaMemcpy(dst, src, bytes, kind);
}
// pinned host memory is plain host memory here (the device's is too)
static inline cudaError_t cudaMallocHost(void** p, size_t bytes) {
    *p = malloc(bytes ? bytes : 1);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
static inline cudaError_t cudaFreeHost(void* p) { free(p); return cudaSuccess; }
static inline cudaError_t cudaMemset(void* p, int value, size_t bytes) { memset(p, value, bytes); return cudaSuccess; }
static inline cudaError_t cudaDeviceSynchronize(void) {
    for (cudaStream_t s : cuda_emu::streams) cuda_emu::stream_finish_all(s);
    return cudaSuccess;
}

static inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) {
    (void)flags;
    *s = new CUstream_st();
    cuda_emu::streams.push_back(*s);
    return cudaSuccess;
}
static inline cudaError_t cudaStreamDestroy(cudaStream_t s) {
    cuda_emu::stream_finish_all(s);  // (a GPU finishes a destroyed stream's work, too)
    for (size_t i = 0; i < cuda_emu::streams.size(); i++) {
        if (cuda_emu::streams[i] == s) cuda_emu::streams.erase(cuda_emu::streams.begin() + i);
    }
    delete s;
    return cudaSuccess;
}
static inline cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    cuda_emu::stream_finish_all(s);
    return cudaSuccess;
}
static inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int flags) {
    (void)flags;
    *e = (cudaEvent_t)calloc(1, sizeof(**e));
    return cudaSuccess;
}
static inline cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, 0); }
static inline cudaError_t cudaEventDestroy(cudaEvent_t e) { free(e); return cudaSuccess; }
static inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = 0) {
    e->stream = NULL;
    if (s != NULL && s->finished < s->work.size()) {  // behind unfinished work: its time comes later
        e->stream = s;
        e->upto = s->work.size();
        return cudaSuccess;
    }
    e->ms = cuda_emu::now_ms();
    return cudaSuccess;
}
static inline cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    cuda_emu::event_finish(e);
    return cudaSuccess;
}
// (a GPU answers cudaErrorNotReady for unfinished work; the project asks after a synchronize)
static inline cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t stop) {
    cuda_emu::event_finish(start);
    cuda_emu::event_finish(stop);
    *ms = (float)(stop->ms - start->ms);
    return cudaSuccess;
}
// stream s's next calls run at once here, so what they wait for finishes now (the host waits)
static inline cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags) {
    (void)s, (void)flags;
    cuda_emu::event_finish(e);
    return cudaSuccess;
}

#endif
