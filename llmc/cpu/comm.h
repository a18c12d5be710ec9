// The MPI code path of the communication layer: collectives on host fp32 buffers. The CPU backend
// uses it for everything; the CUDA backend for ranks that share a GPU (host-staged: copy to the
// host, the same functions, copy back), so both paths agree on every count, piece and check.
// MPI counts are ints: all-reduce, broadcast, send and recv go in pieces of 2^30 elements;
// reduce-scatter and all-gather, whose blocks cannot be cut into pieces without strided
// layouts, and the non-blocking calls (one request each), stop above 2^30 elements per rank
// with a message. Included by comm.h.
#ifndef LLMC_CPU_COMM_H
#define LLMC_CPU_COMM_H

#define COMM_MPI_PIECE ((size_t)1 << 30)

static inline int mpi_piece(size_t n, size_t done) {
    return (int)(n - done < COMM_MPI_PIECE ? n - done : COMM_MPI_PIECE);
}

static inline void mpi_check_count(const CommGroup* g, size_t n, const char* op) {
    if (n > COMM_MPI_PIECE) fail("%s on group '%s': %zu elements per rank, more than MPI's int counts allow", op, g->name, n);
}

// buf (n) *= s, the 1/ranks of an average; nothing to do at one rank (x * 1 == x), where the
// pass over a d12's 124M gradients took 25 ms of each 1.1 s step
static inline void mpi_scale(float* buf, size_t n, float s) {
    if (s == 1.0f) return;
    for (size_t i = 0; i < n; i++) buf[i] *= s;
}

// buf (n) <- op over the ranks of buf, in place
static inline void mpi_all_reduce(CommGroup* g, float* buf, size_t n, CommOp op) {
    for (size_t done = 0; done < n; done += COMM_MPI_PIECE) {
        comm_check(MPI_Allreduce(MPI_IN_PLACE, buf + done, mpi_piece(n, done), MPI_FLOAT,
                                 comm_mpi_op(op), g->mpi), g, "all_reduce");
    }
    if (op == COMM_AVG) mpi_scale(buf, n, 1.0f / (float)g->size);
}

// send (size * n) reduced over the ranks; this rank receives its block of n into recv
static inline void mpi_reduce_scatter(CommGroup* g, const float* send, float* recv, size_t n, CommOp op) {
    mpi_check_count(g, n, "reduce_scatter");
    comm_check(MPI_Reduce_scatter_block(send, recv, (int)n, MPI_FLOAT, comm_mpi_op(op), g->mpi), g,
               "reduce_scatter");
    if (op == COMM_AVG) mpi_scale(recv, n, 1.0f / (float)g->size);
}

// every rank's n elements, concatenated in rank order, into recv (size * n)
static inline void mpi_all_gather(CommGroup* g, const float* send, float* recv, size_t n) {
    mpi_check_count(g, n, "all_gather");
    comm_check(MPI_Allgather(send, (int)n, MPI_FLOAT, recv, (int)n, MPI_FLOAT, g->mpi), g, "all_gather");
}

// the same in place: buf (size * n) holds this rank's n at its block already
static inline void mpi_all_gather_in_place(CommGroup* g, float* buf, size_t n) {
    mpi_check_count(g, n, "all_gather");
    comm_check(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, (int)n, MPI_FLOAT, g->mpi), g, "all_gather");
}

static inline void mpi_broadcast(CommGroup* g, void* buf, size_t bytes, int root) {
    for (size_t done = 0; done < bytes; done += COMM_MPI_PIECE) {
        comm_check(MPI_Bcast((char*)buf + done, mpi_piece(bytes, done), MPI_BYTE, root, g->mpi), g, "broadcast");
    }
}

static inline void mpi_send(CommGroup* g, const float* buf, size_t n, int dest) {
    for (size_t done = 0; done < n; done += COMM_MPI_PIECE) {
        comm_check(MPI_Send(buf + done, mpi_piece(n, done), MPI_FLOAT, dest, 0, g->mpi), g, "send");
    }
}

static inline void mpi_recv(CommGroup* g, float* buf, size_t n, int src) {
    for (size_t done = 0; done < n; done += COMM_MPI_PIECE) {
        comm_check(MPI_Recv(buf + done, mpi_piece(n, done), MPI_FLOAT, src, 0, g->mpi, MPI_STATUS_IGNORE),
                   g, "recv");
    }
}

// Messages to and from other ranks, all posted at once (non-blocking), then waited for together:
// an exchange completes once every partner has posted its side, whatever order the ranks call
// their exchanges in. Messages between two ranks pair up in the order they are posted (MPI's
// non-overtaking rule), so both sides must post them in the same order; a message's channel
// (comm.h) is its tag, and messages of different tags never pair. An exchange only moves
// values, so it takes bf16 words too (MPI has no bf16 type: 16-bit integers, moved untouched).
static inline MPI_Datatype mpi_type(CommDtype dtype) { return dtype == COMM_FLOAT ? MPI_FLOAT : MPI_UINT16_T; }
static inline void mpi_exchange_post(CommGroup* g, const CommMessage* msgs, int count, void** host_bufs,
                                     CommDtype dtype, MPI_Request* requests) {
    if (count > COMM_EXCHANGE_MAX) fail("exchange on group '%s': %d messages, at most %d", g->name, count, COMM_EXCHANGE_MAX);
    for (int i = 0; i < count; i++) {
        mpi_check_count(g, msgs[i].n, "exchange");
        int n = (int)msgs[i].n;
        if (msgs[i].is_send) {
            comm_check(MPI_Isend(host_bufs[i], n, mpi_type(dtype), msgs[i].peer, msgs[i].channel, g->mpi, &requests[i]), g, "send");
        } else {
            comm_check(MPI_Irecv(host_bufs[i], n, mpi_type(dtype), msgs[i].peer, msgs[i].channel, g->mpi, &requests[i]), g, "recv");
        }
    }
}
static inline void mpi_exchange(CommGroup* g, const CommMessage* msgs, int count, void** host_bufs, CommDtype dtype) {
    MPI_Request requests[COMM_EXCHANGE_MAX];
    mpi_exchange_post(g, msgs, count, host_bufs, dtype, requests);
    comm_check(MPI_Waitall(count, requests, MPI_STATUSES_IGNORE), g, "exchange");
}

// Non-blocking collectives (MPI-3) on host fp32 buffers: the post returns at once, with an
// MPI request in r; AVG is a SUM whose result comm_wait scales (MPI has no average)
static inline void mpi_average_later(CommRequest* r, float* buf, size_t n, CommOp op) {
    r->average = op == COMM_AVG ? buf : NULL;
    r->average_n = n;
}

static inline void mpi_all_reduce_start(CommGroup* g, float* buf, size_t n, CommOp op, CommRequest* r) {
    mpi_check_count(g, n, "all_reduce");
    r->num_mpi = 1;
    comm_check(MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, comm_mpi_op(op), g->mpi, &r->mpi[0]), g, "all_reduce");
    mpi_average_later(r, buf, n, op);
}

static inline void mpi_reduce_scatter_start(CommGroup* g, const float* send, float* recv, size_t n, CommOp op,
                                            CommRequest* r) {
    mpi_check_count(g, n, "reduce_scatter");
    r->num_mpi = 1;
    comm_check(MPI_Ireduce_scatter_block(send, recv, (int)n, MPI_FLOAT, comm_mpi_op(op), g->mpi, &r->mpi[0]), g,
               "reduce_scatter");
    mpi_average_later(r, recv, n, op);
}

// send == NULL: in place (recv holds this rank's n at its block already)
static inline void mpi_all_gather_start(CommGroup* g, const float* send, float* recv, size_t n, CommRequest* r) {
    mpi_check_count(g, n, "all_gather");
    r->num_mpi = 1;
    if (send) comm_check(MPI_Iallgather(send, (int)n, MPI_FLOAT, recv, (int)n, MPI_FLOAT, g->mpi, &r->mpi[0]), g, "all_gather");
    else comm_check(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, recv, (int)n, MPI_FLOAT, g->mpi, &r->mpi[0]), g, "all_gather");
    mpi_average_later(r, NULL, 0, COMM_SUM);
}

// blocks until r is complete, then applies the average
static inline void mpi_wait(CommRequest* r) {
    comm_check(MPI_Waitall(r->num_mpi, r->mpi, MPI_STATUSES_IGNORE), r->g, comm_kind_names[r->kind]);
    if (r->average) mpi_scale(r->average, r->average_n, 1.0f / (float)r->g->size);
    if (r->kind == COMM_ALL_TO_ALL) free(r->counts);  // (mpi_all_to_all_start's)
}

// Open MPI (like most MPI libraries) moves a non-blocking collective only while the rank is inside
// an MPI call: a test of every pending request lets each take its next steps (and notes the
// ones that are done), so that the compute between two tests hides the communication
static inline void mpi_progress(CommGroup* g) {
    for (int i = g->num_pending - 1; i >= 0; i--) {
        CommRequest* r = g->pending[i];
        int done = 0;
        double t0 = wall_time_s();
        comm_check(MPI_Testall(r->num_mpi, r->mpi, &done, MPI_STATUSES_IGNORE), g, comm_kind_names[r->kind]);
        double t1 = wall_time_s();
        g->seconds[r->kind] += t1 - t0;  // the host's time in MPI is exposed, however short
        if (done) comm_completed(r, t1);  // (MPI_Testall set the requests to MPI_REQUEST_NULL: the wait returns at once)
    }
}

// All-to-all with counts on host buffers (comm_all_to_all below; the CUDA backend's host-staged
// path takes it too): MPI_Alltoallv, and MPI_Alltoall of the counts. MPI takes int counts and
// displacements, 4 arrays of size: what mpi_all_to_all_counts_of returns (malloc'd)
static inline int* mpi_all_to_all_counts_of(CommGroup* g, const size_t* send_counts, const size_t* recv_counts) {
    int* counts = (int*)malloc_check(4 * (size_t)g->size * sizeof(int));
    int *sc = counts, *sd = counts + g->size, *rc = counts + 2 * g->size, *rd = counts + 3 * g->size;
    size_t s_at = 0, r_at = 0;
    for (int p = 0; p < g->size; p++) {
        mpi_check_count(g, s_at + send_counts[p], "all_to_all");
        mpi_check_count(g, r_at + recv_counts[p], "all_to_all");
        sc[p] = (int)send_counts[p], sd[p] = (int)s_at, rc[p] = (int)recv_counts[p], rd[p] = (int)r_at;
        s_at += send_counts[p], r_at += recv_counts[p];
    }
    return counts;
}
static inline void mpi_all_to_all(CommGroup* g, const float* send, const size_t* send_counts, float* recv,
                                  const size_t* recv_counts) {
    int* c = mpi_all_to_all_counts_of(g, send_counts, recv_counts);
    int n = g->size;
    comm_check(MPI_Alltoallv(send, c, c + n, MPI_FLOAT, recv, c + 2 * n, c + 3 * n, MPI_FLOAT, g->mpi), g,
               "all_to_all");
    free(c);
}
// the same, posted (MPI_Ialltoallv): MPI reads the counts until the operation completes, so the
// request keeps them, and mpi_wait frees them
static inline void mpi_all_to_all_start(CommGroup* g, const float* send, const size_t* send_counts, float* recv,
                                        const size_t* recv_counts, CommRequest* r) {
    int* c = r->counts = mpi_all_to_all_counts_of(g, send_counts, recv_counts);
    int n = g->size;
    r->num_mpi = 1;
    comm_check(MPI_Ialltoallv(send, c, c + n, MPI_FLOAT, recv, c + 2 * n, c + 3 * n, MPI_FLOAT, g->mpi, &r->mpi[0]), g,
               "all_to_all");
    mpi_average_later(r, NULL, 0, COMM_SUM);
}
static inline void mpi_all_to_all_counts(CommGroup* g, const int* send, int* recv, int n) {
    comm_check(MPI_Alltoall(send, n, MPI_INT, recv, n, MPI_INT, g->mpi), g, "all_to_all");
}

#ifndef __CUDACC__
// ---------------------------------------------------------------------------------------------
// the CPU backend's comm layer: every buffer is host fp32, every call the MPI path above
#include <omp.h>

static inline void comm_group_from_mpi(CommGroup* g, MPI_Comm mpi, const char* name) {
    memset(g, 0, sizeof(*g));
    g->mpi = mpi;
    snprintf(g->name, sizeof(g->name), "%s", name);
    MPI_Comm_set_errhandler(mpi, MPI_ERRORS_RETURN);
    comm_check(MPI_Comm_rank(mpi, &g->rank), g, "comm_rank");
    comm_check(MPI_Comm_size(mpi, &g->size), g, "comm_size");
}

static inline void comm_finalize(void);
// utils.h's check_every_rank: how many ranks of the world have flag 1 (an all-reduce), and their number
static inline int comm_world_count(int flag, int* ranks) {
    int total = -1;
    MPI_Comm_size(MPI_COMM_WORLD, ranks);
    if (MPI_Allreduce(&flag, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD) != MPI_SUCCESS) return -1;
    return total;
}

// Ranks that share a machine and were not told how many threads to compute on: OpenMP gives
// each as many threads as the machine has cores, so N ranks run N x cores threads that spin on
// the same cores (8 ranks on 2 cores ran a step 5 times slower than with a thread each). As
// torchrun does, each rank then takes cores / ranks threads, at least 1, and rank 0 says so;
// OMP_NUM_THREADS, when set, is left as it is.
static inline void comm_share_cores(const CommGroup* world) {
    const char* asked = getenv("OMP_NUM_THREADS");
    if ((asked != NULL && *asked != '\0') || world->ranks_sharing_memory <= 1) return;
    int cores = omp_get_num_procs(), threads = cores / world->ranks_sharing_memory;
    if (threads < 1) threads = 1;
    omp_set_num_threads(threads);
    if (world->rank == 0) {  // (what OpenMP will now use, read back)
        int now = omp_get_max_threads();
        printf("OMP_NUM_THREADS is not set: %d thread%s a rank, the %d cores rank 0 may run on over the %d ranks on "
               "this machine\n", now, now > 1 ? "s" : "", cores, world->ranks_sharing_memory);
    }
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
    comm_share_cores(world);
    llmc_abort_hook = comm_abort;
    llmc_count_hook = comm_world_count;
    llmc_finalize_hook = comm_finalize;
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

// side channel c of the group (comm.h), a collective of the group: on MPI, tag c of the group's
// communicator, which needs nothing made or connected (peers: unused here, see cuda/comm.cuh)
static inline void comm_open_channel(CommGroup* g, int c, const int* peers, int num_peers) {
    (void)peers, (void)num_peers;
    if (c != g->side_channels + 1 || c >= COMM_CHANNELS) fail("group '%s': side channel %d opened after %d, at most %d",
                                                              g->name, c, g->side_channels, COMM_CHANNELS - 1);
    g->side_channels = c;
}

static inline void comm_finalize(void) {
    llmc_abort_hook = NULL;
    MPI_Finalize();
}

// the CPU backend holds every buffer in fp32 (an exchange, below, also moves bf16 words)
static inline void comm_check_dtype(const CommGroup* g, CommDtype dtype, const char* op) {
    if (dtype != COMM_FLOAT) fail("%s on group '%s': the CPU backend communicates fp32 only", op, g->name);
}

static inline void comm_all_reduce(CommGroup* g, void* buf, size_t n, CommDtype dtype, CommOp op) {
    comm_check_dtype(g, dtype, "all_reduce");
    comm_count(g, COMM_ALL_REDUCE, n * sizeof(float));
    mpi_all_reduce(g, (float*)buf, n, op);
    comm_done(g);
}

static inline void comm_reduce_scatter(CommGroup* g, const void* send, void* recv, size_t n,
                                       CommDtype dtype, CommOp op) {
    comm_check_dtype(g, dtype, "reduce_scatter");
    comm_count(g, COMM_REDUCE_SCATTER, n * g->size * sizeof(float));
    mpi_reduce_scatter(g, (const float*)send, (float*)recv, n, op);
    comm_done(g);
}

static inline void comm_all_gather(CommGroup* g, const void* send, void* recv, size_t n, CommDtype dtype) {
    comm_check_dtype(g, dtype, "all_gather");
    comm_count(g, COMM_ALL_GATHER, n * g->size * sizeof(float));
    mpi_all_gather(g, (const float*)send, (float*)recv, n);
    comm_done(g);
}

static inline void comm_all_gather_in_place(CommGroup* g, void* buf, size_t n, CommDtype dtype) {
    comm_check_dtype(g, dtype, "all_gather");
    comm_count(g, COMM_ALL_GATHER, n * g->size * sizeof(float));
    mpi_all_gather_in_place(g, (float*)buf, n);
    comm_done(g);
}

// one host float (a loss) reduced over the group
static inline void comm_all_reduce_scalar(CommGroup* g, float* value, CommOp op) {
    comm_all_reduce(g, value, 1, COMM_FLOAT, op);
}

// n host floats (counts, a step's figures): on this backend every buffer is the host's
static inline void comm_all_reduce_host(CommGroup* g, float* values, size_t n, CommOp op) {
    comm_all_reduce(g, values, n, COMM_FLOAT, op);
}

static inline void comm_broadcast(CommGroup* g, void* buf, size_t bytes, int root) {
    comm_count(g, COMM_BROADCAST, bytes);
    mpi_broadcast(g, buf, bytes, root);
    comm_done(g);
}

// host bytes from root to every rank (small values such as a step number)
static inline void comm_broadcast_host(CommGroup* g, void* buf, size_t bytes, int root) {
    comm_broadcast(g, buf, bytes, root);
}

static inline void comm_send(CommGroup* g, const void* buf, size_t n, CommDtype dtype, int dest) {
    comm_check_dtype(g, dtype, "send");
    comm_count(g, COMM_SEND, n * sizeof(float));
    mpi_send(g, (const float*)buf, n, dest);
    comm_done(g);
}

static inline void comm_recv(CommGroup* g, void* buf, size_t n, CommDtype dtype, int src) {
    comm_check_dtype(g, dtype, "recv");
    comm_count(g, COMM_RECV, n * sizeof(float));
    mpi_recv(g, (float*)buf, n, src);
    comm_done(g);
}

// All-to-all with counts (MPI_Alltoallv): block p of send (send_counts[p] elements, the blocks
// one after another in rank order) goes to rank p, and rank p's block for this rank lands in
// recv at block p (recv_counts[p] elements, in rank order). Each pair's counts must agree, which
// is why a caller exchanges the counts first (comm_all_to_all_counts). Counted: the elements
// sent to the other ranks (this rank's own block is a local copy).
static inline void comm_all_to_all(CommGroup* g, const void* send, const size_t* send_counts, void* recv,
                                   const size_t* recv_counts, CommDtype dtype) {
    comm_check_dtype(g, dtype, "all_to_all");
    comm_count(g, COMM_ALL_TO_ALL, comm_all_to_all_sent(g, send_counts) * sizeof(float));
    mpi_all_to_all(g, (const float*)send, send_counts, (float*)recv, recv_counts);
    comm_done(g);
}

// the same, posted: comm_wait(r) finishes it (recv filled, send free again). Posted in the same
// order on every rank of the group, as every collective: MPI pairs non-blocking collectives of
// one communicator in the order they are posted (the MoE overlap posts two micro-batches' in
// turn, the same turn on every rank of a stage: llmc/pipeline_walk.h). channel: the one NCCL
// runs it on (cuda/comm.cuh); an MPI request moves on its own, and a collective has no tag, so
// here it is only checked
static inline void comm_all_to_all_start(CommGroup* g, const void* send, const size_t* send_counts, void* recv,
                                         const size_t* recv_counts, CommDtype dtype, int channel, CommRequest* r) {
    comm_check_dtype(g, dtype, "all_to_all");
    comm_check_channel(g, channel, "all_to_all");
    comm_count(g, COMM_ALL_TO_ALL, comm_all_to_all_sent(g, send_counts) * sizeof(float));
    mpi_all_to_all_start(g, (const float*)send, send_counts, (float*)recv, recv_counts, r);
    comm_posted(g, r, 1);
}

// n ints for each rank, host memory: send (size * n), block p to rank p; recv (size * n), block
// p from rank p. What an all-to-all with counts needs first: how much each pair will exchange.
static inline void comm_all_to_all_counts(CommGroup* g, const int* send, int* recv, int n) {
    comm_count(g, COMM_ALL_TO_ALL, (size_t)n * (g->size - 1) * sizeof(int));
    mpi_all_to_all_counts(g, send, recv, n);
    comm_done(g);
}

// sends and receives of host buffers to and from several ranks at once (mpi_exchange): fp32, or
// bf16 words (uint16_t, DiLoCo's low-precision pseudo-gradients: the only bf16 of this backend)
static inline void comm_exchange(CommGroup* g, const CommMessage* msgs, int count, CommDtype dtype) {
    if (count == 0) return;
    comm_count_exchange(g, msgs, count, comm_dtype_bytes(dtype));
    void* bufs[COMM_EXCHANGE_MAX];
    for (int i = 0; i < count && i < COMM_EXCHANGE_MAX; i++) bufs[i] = msgs[i].buf;
    mpi_exchange(g, msgs, count, bufs, dtype);
    comm_done(g);
}

// the same, posted: comm_wait(r) finishes it (the receive buffers filled, the send buffers free)
static inline void comm_exchange_start(CommGroup* g, const CommMessage* msgs, int count, CommDtype dtype, CommRequest* r) {
    if (count == 0) {
        r->active = 0;
        return;
    }
    comm_count_exchange(g, msgs, count, comm_dtype_bytes(dtype));
    void* bufs[COMM_EXCHANGE_MAX];
    for (int i = 0; i < count && i < COMM_EXCHANGE_MAX; i++) bufs[i] = msgs[i].buf;
    mpi_exchange_post(g, msgs, count, bufs, dtype, r->mpi);
    r->num_mpi = count;
    r->average = NULL;
    comm_posted(g, r, 1);
}

// the non-blocking forms of the three collectives data parallelism overlaps with its compute
static inline void comm_all_reduce_start(CommGroup* g, void* buf, size_t n, CommDtype dtype, CommOp op, CommRequest* r) {
    comm_check_dtype(g, dtype, "all_reduce");
    comm_count(g, COMM_ALL_REDUCE, n * sizeof(float));
    mpi_all_reduce_start(g, (float*)buf, n, op, r);
    comm_posted(g, r, 1);
}

static inline void comm_reduce_scatter_start(CommGroup* g, const void* send, void* recv, size_t n, CommDtype dtype,
                                             CommOp op, CommRequest* r) {
    comm_check_dtype(g, dtype, "reduce_scatter");
    comm_count(g, COMM_REDUCE_SCATTER, n * g->size * sizeof(float));
    mpi_reduce_scatter_start(g, (const float*)send, (float*)recv, n, op, r);
    comm_posted(g, r, 1);
}

// send == NULL: in place, as comm_all_gather_in_place
static inline void comm_all_gather_start(CommGroup* g, const void* send, void* recv, size_t n, CommDtype dtype,
                                         CommRequest* r) {
    comm_check_dtype(g, dtype, "all_gather");
    comm_count(g, COMM_ALL_GATHER, n * g->size * sizeof(float));
    mpi_all_gather_start(g, (const float*)send, (float*)recv, n, r);
    comm_posted(g, r, 1);
}

// lets the group's pending operations move (mpi_progress); call it between pieces of compute
static inline void comm_progress(CommGroup* g) { mpi_progress(g); }

// the host timed every call already (the CUDA backend reads its GPU timing events here)
static inline void comm_collect_times(CommGroup* g) { (void)g; }

// blocks until r's operation is complete (its output ready, its input free again)
static inline void comm_wait(CommRequest* r) {
    if (!r->active) return;
    CommGroup* g = r->g;
    double t0 = wall_time_s();
    watchdog_enter(comm_kind_names[r->kind], g->name);
    mpi_wait(r);
    double t1 = wall_time_s();
    g->seconds[r->kind] += t1 - t0;  // exposed: the rank waited
    if (!r->complete) comm_completed(r, t1);
    r->active = 0;
    watchdog_leave();
}

static inline void comm_barrier(CommGroup* g) {
    comm_count(g, COMM_BARRIER, 0);
    comm_check(MPI_Barrier(g->mpi), g, "barrier");
    comm_done(g);
}
#endif  // the CPU backend

#endif
