// The communication layer: the only code that talks to MPI or NCCL. Groups are the world and
// sub-groups split from it; every call is checked, counted (calls and bytes per group and
// operation) and, on failure, ends the whole job with the rank and the operation named.
//
// CPU backend: MPI on host buffers (below). CUDA backend: NCCL on device buffers, bootstrapped
// through MPI or through environment variables (cuda/comm.cuh).
//
// Bytes counted per call are the payload this rank hands to the operation: all-reduce and
// broadcast n elements, reduce-scatter the full input, all-gather the full output, send/recv the
// message. The wire traffic of a ring all-reduce is 2(p-1)/p times its payload.
#ifndef LLMC_COMM_H
#define LLMC_COMM_H

#ifndef __CUDACC__
#define USE_MPI  // the CPU backend always communicates through MPI
#endif
#ifdef USE_MPI
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>
#endif
#ifdef __CUDACC__
#include <nccl.h>
#include "cuda/device.cuh"
#endif
#include "precision.h"
#include "utils.h"
#include "watchdog.h"

typedef enum { COMM_SUM, COMM_AVG, COMM_MAX } CommOp;
typedef enum { COMM_FLOAT, COMM_BF16 } CommDtype;
#if FLOATX_IS_FLOAT
#define COMM_FLOATX COMM_FLOAT  // the type of floatX
#else
#define COMM_FLOATX COMM_BF16
#endif

typedef enum {
    COMM_ALL_REDUCE, COMM_REDUCE_SCATTER, COMM_ALL_GATHER, COMM_BROADCAST,
    COMM_SEND, COMM_RECV, COMM_BARRIER, COMM_NUM_KINDS
} CommKind;

static const char* comm_kind_names[COMM_NUM_KINDS] = {
    "all_reduce", "reduce_scatter", "all_gather", "broadcast", "send", "recv", "barrier"};

typedef struct {
    int rank;
    int size;
    int ranks_sharing_memory;  // world only: ranks of this job whose buffers share this rank's
                               // memory (CPU: this machine's RAM; CUDA: this rank's GPU)
    char name[32];
    long long calls[COMM_NUM_KINDS];
    long long bytes[COMM_NUM_KINDS];
    double seconds[COMM_NUM_KINDS];  // host time inside each kind of call (on the GPU: the time
                                     // to enqueue; the wait for NCCL shows in the step time)
    double op_start;                 // the call in progress: when it started, and its kind
    int op_kind;
#ifdef USE_MPI
    MPI_Comm mpi;             // MPI_COMM_NULL when MPI is not in use
#endif
#ifdef __CUDACC__
    ncclComm_t nccl;          // NULL on the host-staged path
    cudaStream_t stream;      // collectives run here, ordered against the compute stream by events
    cudaEvent_t ready, done;
    float* scalar;            // device scratch for host values sent through NCCL
    int staged;               // 1: copy to the host and use MPI (several ranks share one GPU)
#endif
} CommGroup;

static inline size_t comm_dtype_bytes(CommDtype dtype) { return dtype == COMM_FLOAT ? 4 : 2; }

// every operation starts here: counted, timed, and named to the watchdog until comm_done
static inline void comm_count(CommGroup* g, CommKind kind, size_t bytes) {
    g->calls[kind] += 1;
    g->bytes[kind] += (long long)bytes;
    g->op_start = wall_time_s();
    g->op_kind = kind;
    watchdog_enter(comm_kind_names[kind], g->name);
}

// ... and ends here
static inline void comm_done(CommGroup* g) {
    g->seconds[g->op_kind] += wall_time_s() - g->op_start;
    watchdog_leave();
}

#ifdef USE_MPI
static inline void comm_abort(int code) {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
    exit(code);
}

static inline void comm_check(int err, const CommGroup* g, const char* op) {
    if (err == MPI_SUCCESS) return;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(err, msg, &len);
    fail("communication failed in %s on group '%s' (rank %d of %d): %s", op, g->name, g->rank,
         g->size, msg);
}

static inline MPI_Op comm_mpi_op(CommOp op) { return op == COMM_MAX ? MPI_MAX : MPI_SUM; }

// MPI counts are ints: the CPU all-reduce goes in pieces of 2^30 elements, others stop here
#define COMM_MPI_PIECE ((size_t)1 << 30)
static inline void comm_check_count(const CommGroup* g, size_t n, const char* op) {
    if (n > COMM_MPI_PIECE) fail("%s on group '%s': %zu elements, more than MPI's int counts allow", op, g->name, n);
}
#endif

#ifdef __CUDACC__
#include "cuda/comm.cuh"
#else  // the CPU backend: MPI on host buffers

static inline void comm_group_from_mpi(CommGroup* g, MPI_Comm mpi, const char* name) {
    memset(g, 0, sizeof(*g));
    g->mpi = mpi;
    snprintf(g->name, sizeof(g->name), "%s", name);
    MPI_Comm_set_errhandler(mpi, MPI_ERRORS_RETURN);
    comm_check(MPI_Comm_rank(mpi, &g->rank), g, "comm_rank");
    comm_check(MPI_Comm_size(mpi, &g->size), g, "comm_size");
}

// MPI_Init works with mpirun/srun and also for a plain ./program, which is a world of size 1
static inline void comm_init(CommGroup* world, int* argc, char*** argv) {
    if (MPI_Init(argc, argv) != MPI_SUCCESS) fail("MPI_Init failed");
    comm_group_from_mpi(world, MPI_COMM_WORLD, "world");
    MPI_Comm node;  // the ranks on this machine
    comm_check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world->rank, MPI_INFO_NULL, &node), world, "split_type");
    comm_check(MPI_Comm_size(node, &world->ranks_sharing_memory), world, "comm_size");
    MPI_Comm_free(&node);
    llmc_rank = world->rank;
    llmc_abort_hook = comm_abort;
}

// ranks with the same color form a group, ordered by key (MPI_Comm_split)
static inline void comm_split(CommGroup* out, CommGroup* parent, int color, int key, const char* name) {
    MPI_Comm sub;
    comm_check(MPI_Comm_split(parent->mpi, color, key, &sub), parent, "split");
    comm_group_from_mpi(out, sub, name);
}

static inline void comm_group_free(CommGroup* g) {
    if (g->mpi != MPI_COMM_WORLD) MPI_Comm_free(&g->mpi);
}

static inline void comm_finalize(void) {
    llmc_abort_hook = NULL;
    MPI_Finalize();
}

// the CPU backend holds every buffer in fp32
static inline void comm_check_dtype(const CommGroup* g, CommDtype dtype, const char* op) {
    if (dtype != COMM_FLOAT) fail("%s on group '%s': the CPU backend communicates fp32 only", op, g->name);
}

static inline void comm_scale(float* buf, size_t n, float s) {
    for (size_t i = 0; i < n; i++) buf[i] *= s;
}

// buf (n) <- op over ranks of buf, in place
static inline void comm_all_reduce(CommGroup* g, void* buf, size_t n, CommDtype dtype, CommOp op) {
    comm_check_dtype(g, dtype, "all_reduce");
    comm_count(g, COMM_ALL_REDUCE, n * sizeof(float));
    for (size_t done = 0; done < n; done += COMM_MPI_PIECE) {
        int piece = (int)(n - done < COMM_MPI_PIECE ? n - done : COMM_MPI_PIECE);
        comm_check(MPI_Allreduce(MPI_IN_PLACE, (float*)buf + done, piece, MPI_FLOAT, comm_mpi_op(op), g->mpi),
                   g, "all_reduce");
    }
    if (op == COMM_AVG) comm_scale((float*)buf, n, 1.0f / (float)g->size);
    comm_done(g);
}

// send (size * n) reduced over ranks; this rank receives its block of n into recv
static inline void comm_reduce_scatter(CommGroup* g, const void* send, void* recv, size_t n,
                                       CommDtype dtype, CommOp op) {
    comm_check_dtype(g, dtype, "reduce_scatter");
    comm_check_count(g, n, "reduce_scatter");
    comm_count(g, COMM_REDUCE_SCATTER, n * g->size * sizeof(float));
    comm_check(MPI_Reduce_scatter_block(send, recv, (int)n, MPI_FLOAT, comm_mpi_op(op), g->mpi),
               g, "reduce_scatter");
    if (op == COMM_AVG) comm_scale((float*)recv, n, 1.0f / (float)g->size);
    comm_done(g);
}

// every rank's n elements, concatenated in rank order, into recv (size * n) on every rank
static inline void comm_all_gather(CommGroup* g, const void* send, void* recv, size_t n,
                                   CommDtype dtype) {
    comm_check_dtype(g, dtype, "all_gather");
    comm_check_count(g, n, "all_gather");
    comm_count(g, COMM_ALL_GATHER, n * g->size * sizeof(float));
    comm_check(MPI_Allgather(send, (int)n, MPI_FLOAT, recv, (int)n, MPI_FLOAT, g->mpi), g,
               "all_gather");
    comm_done(g);
}

// one host float (a loss) reduced over the group
static inline void comm_all_reduce_scalar(CommGroup* g, float* value, CommOp op) {
    comm_all_reduce(g, value, 1, COMM_FLOAT, op);
}

static inline void comm_broadcast(CommGroup* g, void* buf, size_t bytes, int root) {
    comm_count(g, COMM_BROADCAST, bytes);
    comm_check(MPI_Bcast(buf, (int)bytes, MPI_BYTE, root, g->mpi), g, "broadcast");
    comm_done(g);
}

static inline void comm_send(CommGroup* g, const float* buf, size_t n, int dest) {
    comm_count(g, COMM_SEND, n * sizeof(float));
    comm_check(MPI_Send(buf, (int)n, MPI_FLOAT, dest, 0, g->mpi), g, "send");
    comm_done(g);
}

static inline void comm_recv(CommGroup* g, float* buf, size_t n, int src) {
    comm_count(g, COMM_RECV, n * sizeof(float));
    comm_check(MPI_Recv(buf, (int)n, MPI_FLOAT, src, 0, g->mpi, MPI_STATUS_IGNORE), g, "recv");
    comm_done(g);
}

// a paired exchange that cannot deadlock, whatever order the two ranks call it in
static inline void comm_sendrecv(CommGroup* g, const float* send, size_t send_n, int dest, float* recv,
                          size_t recv_n, int src) {
    comm_count(g, COMM_SEND, send_n * sizeof(float));
    comm_count(g, COMM_RECV, recv_n * sizeof(float));
    comm_check(MPI_Sendrecv(send, (int)send_n, MPI_FLOAT, dest, 0, recv, (int)recv_n, MPI_FLOAT,
                            src, 0, g->mpi, MPI_STATUS_IGNORE), g, "sendrecv");
    comm_done(g);
}

// host bytes from root to every rank (small values such as a step number)
static inline void comm_broadcast_host(CommGroup* g, void* buf, size_t bytes, int root) {
    comm_broadcast(g, buf, bytes, root);
}

static inline void comm_barrier(CommGroup* g) {
    comm_count(g, COMM_BARRIER, 0);
    comm_check(MPI_Barrier(g->mpi), g, "barrier");
    comm_done(g);
}

#endif

static inline long long comm_total_bytes(const CommGroup* g) {
    long long total = 0;
    for (int k = 0; k < COMM_NUM_KINDS; k++) total += g->bytes[k];
    return total;
}

static inline void comm_reset_counters(CommGroup* g) {
    memset(g->calls, 0, sizeof(g->calls));
    memset(g->bytes, 0, sizeof(g->bytes));
    memset(g->seconds, 0, sizeof(g->seconds));
}

#endif
