// The communication layer: the only code that talks to MPI or NCCL. Groups are the world and
// sub-groups split from it; every call is checked, counted (calls and bytes per group and
// operation) and, on failure, ends the whole job with the rank and the operation named.
//
// CPU backend: MPI on host buffers (cpu/comm.h). CUDA backend: NCCL on device buffers,
// bootstrapped through MPI or through environment variables (cuda/comm.cuh); ranks that share a
// GPU copy to the host and take the same MPI code path as the CPU backend.
//
// Bytes counted per call are the payload this rank hands to the operation: all-reduce and
// broadcast n elements, reduce-scatter the full input, all-gather the full output, send/recv the
// message, all-to-all what it sends to the other ranks (its own block stays). The wire traffic
// of a ring all-reduce is 2(p-1)/p times its payload.
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
    COMM_SEND, COMM_RECV, COMM_BARRIER, COMM_ALL_TO_ALL, COMM_NUM_KINDS
} CommKind;

static const char* comm_kind_names[COMM_NUM_KINDS] = {
    "all_reduce", "reduce_scatter", "all_gather", "broadcast", "send", "recv", "barrier", "all_to_all"};

#define COMM_EXCHANGE_MAX 8    // messages in one exchange (comm_exchange) at most
#define COMM_MAX_PENDING 256  // non-blocking operations in flight on one group at a time
#ifdef __CUDACC__
#define COMM_EVENTS COMM_MAX_PENDING  // a group's completion events, used round-robin
#endif
// Channels. A group's exchanges may spread their messages over channels: channel 0 is the group's
// own, side channels 1 .. COMM_CHANNELS - 1 are opened by comm_open_channel (a collective of the
// group). Messages between two ranks pair up in the order they were posted, within a channel;
// messages of different channels never pair. Why more than one: NCCL runs a rank's operations on
// one communicator in turn, so a send posted ahead of its exchange (the pipeline's F&B overlap,
// llmc/pipeline_walk.h) would hold back, until its receiver posts, everything queued behind it,
// and if the receiver first waits for some of that (two neighbours sending to each other) neither
// goes on. On the CUDA backend a side channel is a communicator of its own (ncclCommSplit of the
// group: the same ranks in the same order) with a stream of its own, so what one channel holds
// back never stalls another; within a channel the caller keeps the order safe (the pipeline's
// rule, and why it cannot deadlock: llmc/pipeline_walk.h; the MoE overlap's all-to-alls of rows
// take a side channel of the ep group, so that the counts' blocking all-to-all on channel 0 never
// waits behind them: llmc/moe.h's moe_add_lane). (This asks the GPU to run two
// communicators' kernels at once, which NCCL's guide does not promise, "Using multiple NCCL
// communicators concurrently", and a GPU with SMs to spare does, as PyTorch's one communicator
// per process group relies on.) On MPI (the CPU backend, and the CUDA backend's host-staged path)
// every request moves on its own, and a channel is the messages' tag, so both backends pair
// messages by the same rule.
#define COMM_CHANNELS 4  // channel 0 and up to 3 side channels

#ifdef __CUDACC__
// a side channel on the CUDA backend: its communicator, its stream, and its completion events
typedef struct {
    ncclComm_t nccl;
    cudaStream_t stream;
    unsigned char* connected;          // per rank of the group: connected when the channel opened
    cudaEvent_t events[COMM_EVENTS];   // non-blocking calls' completions on this stream, round-robin
    unsigned next_event;
} CommChannel;
#endif

typedef struct {
    int rank;
    int size;
    int ranks_sharing_memory;  // world only: ranks of this job whose buffers share this rank's
                               // memory (CPU: this machine's RAM; CUDA: this rank's GPU)
    int side_channels;         // side channels open (comm_open_channel): 1 .. side_channels
    char name[32];
    long long calls[COMM_NUM_KINDS];
    long long bytes[COMM_NUM_KINDS];
    double seconds[COMM_NUM_KINDS];  // the time each kind of call held up the computation
                                     // (exposed): on the host, all of a blocking call, the post,
                                     // progress and wait of a non-blocking one; for NCCL, the
                                     // compute stream's waits, timed on the GPU, plus the
                                     // host's time posting non-blocking calls
    double flight_seconds;           // every operation from its start to its end (blocking: its
                                     // call; non-blocking on the host: until its completion was
                                     // seen, at a progress or a wait; NCCL: its run on the comm
                                     // stream), hidden or not: the total communication time
    double op_start;                 // the call in progress: when it started, and its kind
    int op_kind;
    struct CommRequest* pending[COMM_MAX_PENDING];  // non-blocking operations not seen complete
    int num_pending;
#ifdef USE_MPI
    MPI_Comm mpi;             // MPI_COMM_NULL when MPI is not in use
#endif
#ifdef __CUDACC__
    ncclComm_t nccl;          // NULL on the host-staged path
    cudaStream_t stream;      // collectives run here, ordered against the compute stream by events
    cudaEvent_t ready, done;
    float* scalar;            // device scratch for host values sent through NCCL (64 bytes),
                              // then 2 floats for a pair's first exchange (nccl_post_messages)
    unsigned char* connected;  // per rank of the group: 1 once this rank's NCCL has connected to it
    cudaEvent_t events[COMM_EVENTS];  // non-blocking calls' completions on the comm stream
    unsigned next_event;
    cudaEvent_t* timing;      // pairs of timing events (comm_timing_start), 2 per pair ...
    int* timing_what;         // ... per pair, a collective's kind, or -1 - kind for a wait
    int timing_used, timing_capacity, timing_op;  // pairs this step, allocated; the call's pair
    int staged;               // 1: copy to the host and use MPI (several ranks share one GPU)
    CommChannel side[COMM_CHANNELS - 1];  // side channel c is side[c - 1] (NCCL only)
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
    double dt = wall_time_s() - g->op_start;
    g->seconds[g->op_kind] += dt;
    g->flight_seconds += dt;
    watchdog_leave();
}

// one message of an exchange (comm_exchange): n elements sent to, or received from, rank `peer`
typedef struct {
    void* buf;
    size_t n;
    int peer;
    int is_send;  // 1: send buf; 0: receive into buf
    int channel;  // 0, the group's own, or a side channel (comm_open_channel)
} CommMessage;

static inline CommMessage comm_message(void* buf, size_t n, int peer, int is_send) {
    CommMessage m;
    m.buf = buf;
    m.n = n;
    m.peer = peer;
    m.is_send = is_send;
    m.channel = 0;
    return m;
}

// A non-blocking collective (comm_*_start): posted, it runs while the caller computes, and
// comm_wait finishes it before its output is read or its input overwritten. On the CPU it is an
// MPI request, which moves only while this rank is inside MPI (comm_progress, comm_wait); on the
// GPU an NCCL call on the comm stream, which the compute stream waits for at comm_wait through
// an event. (The host-staged path completes it at the start.)
typedef struct CommRequest {
    CommGroup* g;
    int active;         // posted and not yet waited for
    int complete;       // seen complete (by comm_progress or comm_wait)
    int kind;
    double posted;      // wall time of the post
    float* average;     // MPI has no average: SUM, then these `average_n` floats scaled by 1/size
    size_t average_n;
#ifdef USE_MPI
    MPI_Request mpi[COMM_EXCHANGE_MAX];  // one for a collective; an exchange's, one per message
    int num_mpi;
    int* counts;        // an all-to-all's counts and displacements (MPI reads them until it completes)
#endif
#ifdef __CUDACC__
    cudaEvent_t done[COMM_CHANNELS];  // NCCL: recorded on each channel's stream after its part
    int num_done;
#ifdef USE_MPI
    void* staged[COMM_EXCHANGE_MAX];  // the host-staged path's exchange: its host copies, the
    CommMessage staged_msgs[COMM_EXCHANGE_MAX];  // messages (receives go to the device at
    int num_staged;                              // comm_wait), and their element size
    size_t staged_elem;
#endif
#endif
} CommRequest;

// the post is over: the host time it took is exposed; the operation is pending from now on
// (pending = 0: the host does not track it, as NCCL's, which the GPU times)
static inline void comm_posted(CommGroup* g, CommRequest* r, int pending) {
    r->g = g;
    r->active = 1;
    r->complete = !pending;
    r->kind = g->op_kind;
    r->posted = g->op_start;
    g->seconds[g->op_kind] += wall_time_s() - g->op_start;
    if (pending) {
        if (g->num_pending == COMM_MAX_PENDING) fail("group '%s': more than %d operations in flight", g->name, COMM_MAX_PENDING);
        g->pending[g->num_pending++] = r;
    }
    watchdog_leave();
}

// r seen complete at wall time `now`: its flight time counts, and it leaves the pending list
static inline void comm_completed(CommRequest* r, double now) {
    CommGroup* g = r->g;
    r->complete = 1;
    g->flight_seconds += now - r->posted;
    for (int i = 0; i < g->num_pending; i++) {
        if (g->pending[i] == r) {
            g->pending[i] = g->pending[--g->num_pending];
            break;
        }
    }
}

// an all-to-all counts the elements it sends to the other ranks (its own block stays)
static inline size_t comm_all_to_all_sent(const CommGroup* g, const size_t* send_counts) {
    size_t sent = 0;
    for (int p = 0; p < g->size; p++) sent += p == g->rank ? 0 : send_counts[p];
    return sent;
}

// a channel named by a call must be open: one that is not is a mistake of the caller's
static inline void comm_check_channel(const CommGroup* g, int c, const char* op) {
    if (c < 0 || c > g->side_channels) {
        fail("%s on group '%s': channel %d, but the group has channels 0 .. %d (comm_open_channel)", op, g->name, c,
             g->side_channels);
    }
}

// an exchange counts each message as a send or a receive, and is timed as one operation (its
// messages' channels checked first)
static inline void comm_count_exchange(CommGroup* g, const CommMessage* msgs, int count, size_t elem_bytes) {
    if (count > COMM_EXCHANGE_MAX) fail("exchange on group '%s': %d messages, at most %d", g->name, count, COMM_EXCHANGE_MAX);
    for (int i = 0; i < count; i++) comm_check_channel(g, msgs[i].channel, "exchange");
    for (int i = 1; i < count; i++) {
        CommKind kind = msgs[i].is_send ? COMM_SEND : COMM_RECV;
        g->calls[kind] += 1;
        g->bytes[kind] += (long long)(msgs[i].n * elem_bytes);
    }
    comm_count(g, msgs[0].is_send ? COMM_SEND : COMM_RECV, msgs[0].n * elem_bytes);
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

#endif

#ifdef __CUDACC__
#include "cuda/comm.cuh"  // NCCL, and the MPI path of cpu/comm.h for ranks that share a GPU
#else
#include "cpu/comm.h"
#endif

static inline long long comm_total_bytes(const CommGroup* g) {
    long long total = 0;
    for (int k = 0; k < COMM_NUM_KINDS; k++) total += g->bytes[k];
    return total;
}

// What this rank sends over the wire for the counted calls if every collective is a ring (as
// NCCL's are on one node): an all-reduce of S bytes is a reduce-scatter then an all-gather, and
// each of those passes (N-1)/N of S through every rank's link; a point-to-point send (CP's K,V
// ring, PP's activations, DiLoCo's bf16 exchanges) and an all-to-all's blocks for the other ranks
// (MoE's tokens) pass whole. (Broadcasts, which
// carry only the loss here, are not counted.)
static inline double comm_ring_bytes(const CommGroup* g) {
    double share = g->size > 1 ? (double)(g->size - 1) / g->size : 0.0;
    return share * (2.0 * g->bytes[COMM_ALL_REDUCE] + g->bytes[COMM_REDUCE_SCATTER] + g->bytes[COMM_ALL_GATHER]) +
           (double)g->bytes[COMM_SEND] + (double)g->bytes[COMM_ALL_TO_ALL];
}

static inline void comm_reset_counters(CommGroup* g) {
    memset(g->calls, 0, sizeof(g->calls));
    memset(g->bytes, 0, sizeof(g->bytes));
    memset(g->seconds, 0, sizeof(g->seconds));
    g->flight_seconds = 0.0;
#ifdef __CUDACC__
    g->timing_used = 0;  // timed collectives not collected are dropped
#endif
}

// the host time spent waiting in collectives (exposed: not hidden behind computation)
static inline double comm_seconds(const CommGroup* g) {
    double total = 0.0;
    for (int k = 0; k < COMM_NUM_KINDS; k++) total += g->seconds[k];
    return total;
}

#endif
