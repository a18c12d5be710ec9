// The communication layer on CUDA: NCCL moves device buffers; MPI (when the program is built
// with it and launched by mpirun/srun) or environment variables bring the ranks together.
//
// Bootstrap without MPI: RANK, WORLD_SIZE and LOCAL_RANK, plus LLMC_NCCL_ID_FILE, a path on a
// filesystem every rank sees, through which rank 0 hands out NCCL's unique id.
//
// Several ranks on one GPU: NCCL refuses two ranks on one device in one communicator. With MPI,
// such a world uses the host-staged path (copy to the host, MPI collective, copy back). Without
// MPI each rank gets its own NCCL_HOSTID, which makes NCCL treat the ranks as separate hosts.
// Included by comm.h.
#ifndef LLMC_CUDA_COMM_CUH
#define LLMC_CUDA_COMM_CUH

#include <unistd.h>
#ifdef USE_MPI
#include "../cpu/comm.h"  // the MPI code path, for ranks that share a GPU
#endif

static int comm_use_mpi = 0;  // set by comm_init: launched under an MPI launcher

// The NCCL communicators this rank holds (the world's, then comm_split's), in the order they were
// made, so that a job every rank of which stops on the same error can end them before MPI (past
// COMM_MAX_NCCL a communicator is left to the process's exit)
#define COMM_MAX_NCCL 64
static ncclComm_t comm_live_nccl[COMM_MAX_NCCL];
static int comm_num_live_nccl = 0;
static inline void comm_remember_nccl(ncclComm_t c) {
    if (c != NULL && comm_num_live_nccl < COMM_MAX_NCCL) comm_live_nccl[comm_num_live_nccl++] = c;
}
static inline void comm_forget_nccl(ncclComm_t c) {
    for (int i = 0; i < comm_num_live_nccl; i++) {
        if (comm_live_nccl[i] != c) continue;
        for (int j = i + 1; j < comm_num_live_nccl; j++) comm_live_nccl[j - 1] = comm_live_nccl[j];
        comm_num_live_nccl--;
        return;
    }
}

static inline void comm_exit(int code) {
#ifdef USE_MPI
    if (comm_use_mpi) comm_abort(code);
#endif
    exit(code);
}

#ifdef USE_MPI
// utils.h's check_every_rank, under mpirun: how many ranks of the world have flag 1, and their
// number. An MPI all-reduce of host ints on the world: no device buffer, no stream, and it works
// whether or not NCCL is up (a check may come before the world's communicator exists)
static inline int comm_count_on_world(int flag, int* ranks) {
    int total = -1;
    MPI_Comm_size(MPI_COMM_WORLD, ranks);
    if (MPI_Allreduce(&flag, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD) != MPI_SUCCESS) return -1;
    return total;
}
// ... and when every rank failed it: every rank ends its NCCL communicators, newest first (every
// rank is at the same check, so none is left waiting in a collective), then MPI, so that the
// launcher reports an exit code, not an abort
static inline void comm_finalize_on_error(void) {
    while (comm_num_live_nccl > 0) ncclCommDestroy(comm_live_nccl[--comm_num_live_nccl]);
    MPI_Finalize();
}
#endif

// the error, and NCCL's own account of it (its last warning: which rank, what message)
static inline void nccl_check(ncclResult_t r, const CommGroup* g, const char* op) {
    if (r != ncclSuccess) {
        fail("NCCL failed in %s on group '%s' (rank %d of %d): %s: %s", op, g->name, g->rank, g->size,
             ncclGetErrorString(r), ncclGetLastError(g->nccl));
    }
}

static inline int env_int(const char* name, int fallback) {
    const char* v = getenv(name);
    return v && *v ? atoi(v) : fallback;
}

// rank 0 writes the id to a temporary name and renames it; the others wait for the file
static inline void nccl_id_through_file(ncclUniqueId* id, int rank, const char* path) {
    if (rank == 0) {
        char tmp[4200];
        snprintf(tmp, sizeof(tmp), "%s.tmp", path);
        FILE* f = fopen_check(tmp, "wb");
        fwrite_check(id, sizeof(*id), 1, f, tmp);
        fclose_check(f, tmp);
        rename_check(tmp, path);
        return;
    }
    for (int waited = 0;; waited++) {
        FILE* f = fopen(path, "rb");
        if (f != NULL) {
            fread_check(id, sizeof(*id), 1, f, path);
            fclose(f);
            return;
        }
        if (waited > 600) fail("no NCCL id in '%s' (LLMC_NCCL_ID_FILE) after 60 s", path);
        usleep(100000);
    }
}

static inline void comm_group_streams(CommGroup* g) {
    cudaCheck(cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking));
    cudaCheck(cudaEventCreateWithFlags(&g->ready, cudaEventDisableTiming));
    cudaCheck(cudaEventCreateWithFlags(&g->done, cudaEventDisableTiming));
    for (int i = 0; i < COMM_EVENTS; i++) cudaCheck(cudaEventCreateWithFlags(&g->events[i], cudaEventDisableTiming));
    AllocationKind was = allocation_kind(ALLOC_COMM);  // (72 bytes a group: too small for the table's row)
    g->scalar = (float*)device_malloc(64 + 2 * sizeof(float));
    allocation_kind(was);
    g->connected = (unsigned char*)calloc((size_t)g->size, 1);
    if (g->connected == NULL) fail("out of host memory for group '%s'", g->name);
}

static inline void comm_init(CommGroup* world, int* argc, char*** argv) {
    memset(world, 0, sizeof(*world));
    snprintf(world->name, sizeof(world->name), "world");
    int local_rank = 0, local_size = 1;
#ifdef USE_MPI
    world->mpi = MPI_COMM_NULL;
    // launched by mpirun (Open MPI, MPICH/PMI) or srun
    comm_use_mpi = getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
    if (comm_use_mpi) {
        if (MPI_Init(argc, argv) != MPI_SUCCESS) fail("MPI_Init failed");
        world->mpi = MPI_COMM_WORLD;
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
        MPI_Comm_rank(MPI_COMM_WORLD, &world->rank);
        MPI_Comm_size(MPI_COMM_WORLD, &world->size);
        MPI_Comm node;
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world->rank, MPI_INFO_NULL, &node);
        MPI_Comm_rank(node, &local_rank);
        MPI_Comm_size(node, &local_size);
        MPI_Comm_free(&node);
    }
#else
    (void)argc;
    (void)argv;
#endif
    if (!comm_use_mpi) {
        world->rank = env_int("RANK", 0);
        world->size = env_int("WORLD_SIZE", 1);
        local_rank = env_int("LOCAL_RANK", world->rank);
        local_size = env_int("LOCAL_WORLD_SIZE", world->size);
    }
    llmc_rank = world->rank;
    llmc_abort_hook = comm_exit;
    // An error every rank meets alike is printed once (check_every_rank) where the ranks can count
    // their verdicts over MPI. The env bootstrap (RANK, WORLD_SIZE, LLMC_NCCL_ID_FILE) has no host
    // channel: the ranks' only link is NCCL, and counting a flag there would take a device buffer,
    // a stream and a wait at every check, called from utils.h, which knows nothing of devices. So
    // there every failing rank prints its own message and exits 1 (comm_exit); without MPI there
    // is no abort report to spare, the launcher (torchrun) reports an exit code either way.
#ifdef USE_MPI
    if (comm_use_mpi) {
        llmc_count_hook = comm_count_on_world;
        llmc_finalize_hook = comm_finalize_on_error;
    }
#endif
    int devices = 0;
    cudaCheck(cudaGetDeviceCount(&devices));
    if (devices == 0) fail("no CUDA device");
    cudaCheck(cudaSetDevice(local_rank % devices));
    comm_group_streams(world);
    int shared_gpu = local_size > devices;
    world->ranks_sharing_memory = (local_size + devices - 1) / devices;
#ifdef USE_MPI
    if (shared_gpu && comm_use_mpi) {  // several ranks per GPU: host-staged MPI collectives
        world->staged = 1;
        return;
    }
#endif
    if (shared_gpu) {  // a distinct host id per rank makes NCCL connect them like separate hosts,
        char host_id[64];  // through its socket transport on the loopback interface
        snprintf(host_id, sizeof(host_id), "llmc-rank-%d", world->rank);
        setenv("NCCL_HOSTID", host_id, 1);
        setenv("NCCL_SOCKET_IFNAME", "lo", 0);
    }
    ncclUniqueId id;
    if (world->rank == 0) nccl_check(ncclGetUniqueId(&id), world, "get_unique_id");
    if (world->size > 1) {
#ifdef USE_MPI
        if (comm_use_mpi) comm_check(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD), world, "broadcast of the NCCL id");
#endif
        if (!comm_use_mpi) {
            const char* path = getenv("LLMC_NCCL_ID_FILE");
            if (path == NULL) fail("WORLD_SIZE=%d without MPI: set LLMC_NCCL_ID_FILE to a path all ranks see", world->size);
            nccl_id_through_file(&id, world->rank, path);
        }
    }
    nccl_check(ncclCommInitRank(&world->nccl, world->size, id, world->rank), world, "comm_init_rank");
    comm_remember_nccl(world->nccl);
}

// ranks with the same color form a group, ordered by key
static inline void comm_split(CommGroup* out, CommGroup* parent, int color, int key, const char* name) {
    memset(out, 0, sizeof(*out));
    snprintf(out->name, sizeof(out->name), "%s", name);
    out->staged = parent->staged;
#ifdef USE_MPI
    out->mpi = MPI_COMM_NULL;
    if (comm_use_mpi) {
        comm_check(MPI_Comm_split(parent->mpi, color, key, &out->mpi), parent, "split");
        MPI_Comm_set_errhandler(out->mpi, MPI_ERRORS_RETURN);
    }
#endif
    if (!parent->staged) {
        nccl_check(ncclCommSplit(parent->nccl, color, key, &out->nccl, NULL), parent, "split");
        comm_remember_nccl(out->nccl);
        nccl_check(ncclCommUserRank(out->nccl, &out->rank), out, "user_rank");
        nccl_check(ncclCommCount(out->nccl, &out->size), out, "count");
    }
#ifdef USE_MPI
    else {
        MPI_Comm_rank(out->mpi, &out->rank);
        MPI_Comm_size(out->mpi, &out->size);
    }
#endif
    comm_group_streams(out);
}

static inline void comm_group_free(CommGroup* g) {
    for (int c = g->side_channels; c >= 1 && !g->staged; c--) {  // (newest first)
        CommChannel* ch = &g->side[c - 1];
        cudaStreamDestroy(ch->stream);
        comm_forget_nccl(ch->nccl);
        ncclCommDestroy(ch->nccl);
        for (int i = 0; i < COMM_EVENTS; i++) cudaEventDestroy(ch->events[i]);
        free(ch->connected);
    }
    if (g->nccl) {
        comm_forget_nccl(g->nccl);
        ncclCommDestroy(g->nccl);
    }
#ifdef USE_MPI
    if (g->mpi != MPI_COMM_NULL && g->mpi != MPI_COMM_WORLD) MPI_Comm_free(&g->mpi);
#endif
    cudaStreamDestroy(g->stream);
    for (int i = 0; i < COMM_EVENTS; i++) cudaEventDestroy(g->events[i]);
    for (int i = 0; i < 2 * g->timing_capacity; i++) cudaEventDestroy(g->timing[i]);
    free(g->timing);
    free(g->timing_what);
    free(g->connected);
    device_free(g->scalar);
}

// Side channel c of group g (comm.h), a collective of the group: every rank opens the same
// channels in the same order. On NCCL: a communicator of the group's ranks in the group's order
// (ncclCommSplit, one color, keyed by rank) and a stream of its own, which connects `peers` now,
// both directions of each in one group (every rank names the ranks that name it), so that no call
// on it later waits on the host for a peer's first call there. On the host-staged path, an MPI
// tag, as on the CPU backend.
static inline void comm_open_channel(CommGroup* g, int c, const int* peers, int num_peers) {
    if (c != g->side_channels + 1 || c >= COMM_CHANNELS) fail("group '%s': side channel %d opened after %d, at most %d",
                                                              g->name, c, g->side_channels, COMM_CHANNELS - 1);
    if (!g->staged) {
        CommChannel* ch = &g->side[c - 1];
        memset(ch, 0, sizeof(*ch));
        nccl_check(ncclCommSplit(g->nccl, 0, g->rank, &ch->nccl, NULL), g, "split");
        comm_remember_nccl(ch->nccl);
        cudaCheck(cudaStreamCreateWithFlags(&ch->stream, cudaStreamNonBlocking));
        for (int i = 0; i < COMM_EVENTS; i++) cudaCheck(cudaEventCreateWithFlags(&ch->events[i], cudaEventDisableTiming));
        ch->connected = (unsigned char*)calloc((size_t)g->size, 1);
        if (ch->connected == NULL) fail("out of host memory for group '%s'", g->name);
        nccl_check(ncclGroupStart(), g, "connect");
        for (int i = 0; i < num_peers; i++) {  // (one float each way: no data, not counted)
            if (peers[i] < 0 || peers[i] >= g->size || peers[i] == g->rank) fail("group '%s': no peer %d to connect", g->name, peers[i]);
            ch->connected[peers[i]] = 1;
            nccl_check(ncclSend(g->scalar + 16, 1, ncclFloat, peers[i], ch->nccl, ch->stream), g, "connect");
            nccl_check(ncclRecv(g->scalar + 17, 1, ncclFloat, peers[i], ch->nccl, ch->stream), g, "connect");
        }
        nccl_check(ncclGroupEnd(), g, "connect");
        cudaCheck(cudaStreamSynchronize(ch->stream));
    }
    g->side_channels = c;
}

static inline void comm_finalize(void) {
    llmc_abort_hook = NULL;
    llmc_count_hook = NULL;  // (a check after this point is this rank's alone: fail())
    llmc_finalize_hook = NULL;
#ifdef USE_MPI
    if (comm_use_mpi) MPI_Finalize();
#endif
}

static inline ncclDataType_t comm_nccl_type(CommDtype dtype) {
    return dtype == COMM_FLOAT ? ncclFloat : ncclBfloat16;
}
static inline ncclRedOp_t comm_nccl_op(CommOp op) {
    return op == COMM_SUM ? ncclSum : op == COMM_AVG ? ncclAvg : ncclMax;
}

// NCCL returns once a call is enqueued, so the host cannot time it; the GPU can, with pairs of
// timing events: one pair around each collective on the comm stream (its duration: the total),
// one around each wait of the compute stream for a collective (the time the compute stream
// stood still: the exposed part). comm_collect_times reads them once the device is synchronized.
static inline int comm_timing_start(CommGroup* g, cudaStream_t stream, int kind, int is_wait) {
    if (g->timing_used == g->timing_capacity) {  // grow the pool: two events per pair
        int cap = g->timing_capacity ? 2 * g->timing_capacity : 64;
        g->timing = (cudaEvent_t*)realloc(g->timing, (size_t)cap * 2 * sizeof(cudaEvent_t));
        g->timing_what = (int*)realloc(g->timing_what, (size_t)cap * sizeof(int));
        if (!g->timing || !g->timing_what) fail("out of host memory for the comm layer's timing events");
        for (int i = 2 * g->timing_capacity; i < 2 * cap; i++) cudaCheck(cudaEventCreate(&g->timing[i]));
        g->timing_capacity = cap;
    }
    int pair = g->timing_used++;
    g->timing_what[pair] = is_wait ? -1 - kind : kind;
    cudaCheck(cudaEventRecord(g->timing[2 * pair], stream));
    return pair;
}
static inline void comm_timing_stop(CommGroup* g, int pair, cudaStream_t stream) {
    cudaCheck(cudaEventRecord(g->timing[2 * pair + 1], stream));
}

// after device_synchronize: the timed collectives' durations into flight_seconds (total), the
// compute stream's waits into seconds (exposed)
static inline void comm_collect_times(CommGroup* g) {
    for (int pair = 0; pair < g->timing_used; pair++) {
        float ms = 0.0f;
        cudaCheck(cudaEventElapsedTime(&ms, g->timing[2 * pair], g->timing[2 * pair + 1]));
        int what = g->timing_what[pair];
        if (what < 0) g->seconds[-1 - what] += ms * 1e-3;
        else g->flight_seconds += ms * 1e-3;
    }
    g->timing_used = 0;
}

// the compute stream waits for `done` (a collective's end on the comm stream), timed
static inline void comm_compute_waits(CommGroup* g, cudaEvent_t done, int kind) {
    int pair = comm_timing_start(g, 0, kind, 1);
    cudaCheck(cudaStreamWaitEvent(0, done, 0));
    comm_timing_stop(g, pair, 0);
}

// the comm stream waits for the kernels issued so far; later kernels wait for the collective
static inline void comm_begin(CommGroup* g) {
    cudaCheck(cudaEventRecord(g->ready, 0));
    cudaCheck(cudaStreamWaitEvent(g->stream, g->ready, 0));
    g->timing_op = comm_timing_start(g, g->stream, g->op_kind, 0);
}
static inline void comm_end(CommGroup* g) {
    comm_timing_stop(g, g->timing_op, g->stream);
    cudaCheck(cudaEventRecord(g->done, g->stream));
    comm_compute_waits(g, g->done, g->op_kind);
    // a hang shows at the next wait for the device
    watchdog_leave();
}

#ifdef USE_MPI
// host-staged path: device -> host floats, the CPU backend's MPI code path (cpu/comm.h), host ->
// device
static inline float* staged_to_host(const void* dev, size_t n, CommDtype dtype) {
    if (dtype != COMM_FLOAT && dtype != COMM_FLOATX) fail("host-staged collective: a bf16 buffer in an fp32 build");
    float* host = (float*)malloc_check(n * sizeof(float));
    if (dtype == COMM_FLOAT) copy_device_to_host(host, dev, n * sizeof(float));
    else copy_device_to_floats(host, (const floatX*)dev, n);
    return host;
}
static inline void staged_to_device(void* dev, float* host, size_t n, CommDtype dtype) {
    if (dtype == COMM_FLOAT) copy_host_to_device(dev, host, n * sizeof(float));
    else copy_floats_to_device((floatX*)dev, host, n);
    free(host);
}
#endif

// buf (n) <- op over ranks of buf, in place (device memory)
static inline void comm_all_reduce(CommGroup* g, void* buf, size_t n, CommDtype dtype, CommOp op) {
    comm_count(g, COMM_ALL_REDUCE, n * comm_dtype_bytes(dtype));
#ifdef USE_MPI
    if (g->staged) {
        float* host = staged_to_host(buf, n, dtype);
        mpi_all_reduce(g, host, n, op);
        staged_to_device(buf, host, n, dtype);
        comm_done(g);
        return;
    }
#endif
    comm_begin(g);
    nccl_check(ncclAllReduce(buf, buf, n, comm_nccl_type(dtype), comm_nccl_op(op), g->nccl, g->stream), g, "all_reduce");
    comm_end(g);
}

// send (size * n) reduced over ranks; this rank receives its block of n into recv
static inline void comm_reduce_scatter(CommGroup* g, const void* send, void* recv, size_t n,
                                       CommDtype dtype, CommOp op) {
    comm_count(g, COMM_REDUCE_SCATTER, n * g->size * comm_dtype_bytes(dtype));
#ifdef USE_MPI
    if (g->staged) {
        float* host_send = staged_to_host(send, n * g->size, dtype);
        float* host_recv = (float*)malloc_check(n * sizeof(float));
        mpi_reduce_scatter(g, host_send, host_recv, n, op);
        free(host_send);
        staged_to_device(recv, host_recv, n, dtype);
        comm_done(g);
        return;
    }
#endif
    comm_begin(g);
    nccl_check(ncclReduceScatter(send, recv, n, comm_nccl_type(dtype), comm_nccl_op(op), g->nccl, g->stream), g, "reduce_scatter");
    comm_end(g);
}

// every rank's n elements, concatenated in rank order, into recv (size * n) on every rank
static inline void comm_all_gather(CommGroup* g, const void* send, void* recv, size_t n, CommDtype dtype) {
    comm_count(g, COMM_ALL_GATHER, n * g->size * comm_dtype_bytes(dtype));
#ifdef USE_MPI
    if (g->staged) {
        float* host_send = staged_to_host(send, n, dtype);
        float* host_recv = (float*)malloc_check(n * g->size * sizeof(float));
        mpi_all_gather(g, host_send, host_recv, n);
        free(host_send);
        staged_to_device(recv, host_recv, n * g->size, dtype);
        comm_done(g);
        return;
    }
#endif
    comm_begin(g);
    nccl_check(ncclAllGather(send, recv, n, comm_nccl_type(dtype), g->nccl, g->stream), g, "all_gather");
    comm_end(g);
}

// the same in place: buf (size * n) holds this rank's n at its block already (ZeRO's parameters)
static inline void comm_all_gather_in_place(CommGroup* g, void* buf, size_t n, CommDtype dtype) {
    comm_count(g, COMM_ALL_GATHER, n * g->size * comm_dtype_bytes(dtype));
#ifdef USE_MPI
    if (g->staged) {
        float* host = staged_to_host(buf, n * g->size, dtype);
        mpi_all_gather_in_place(g, host, n);
        staged_to_device(buf, host, n * g->size, dtype);
        comm_done(g);
        return;
    }
#endif
    comm_begin(g);
    const char* mine = (const char*)buf + (size_t)g->rank * n * comm_dtype_bytes(dtype);
    nccl_check(ncclAllGather(mine, buf, n, comm_nccl_type(dtype), g->nccl, g->stream), g, "all_gather");
    comm_end(g);
}

// bytes of device memory from root to every rank
static inline void comm_broadcast(CommGroup* g, void* buf, size_t bytes, int root) {
    comm_count(g, COMM_BROADCAST, bytes);
#ifdef USE_MPI
    if (g->staged) {
        char* host = (char*)malloc_check(bytes);
        copy_device_to_host(host, buf, bytes);
        mpi_broadcast(g, host, bytes, root);
        copy_host_to_device(buf, host, bytes);
        free(host);
        comm_done(g);
        return;
    }
#endif
    comm_begin(g);
    nccl_check(ncclBroadcast(buf, buf, bytes, ncclChar, root, g->nccl, g->stream), g, "broadcast");
    comm_end(g);
}

// one host float (a loss) reduced over the group, through the group's device scratch
static inline void comm_all_reduce_scalar(CommGroup* g, float* value, CommOp op) {
    copy_host_to_device(g->scalar, value, sizeof(float));
    comm_all_reduce(g, g->scalar, 1, COMM_FLOAT, op);
    copy_device_to_host(value, g->scalar, sizeof(float));
}

// n host floats reduced over the group in place (counts, a step's figures), through a device
// buffer: NCCL moves device memory only
static inline void comm_all_reduce_host(CommGroup* g, float* values, size_t n, CommOp op) {
    static DeviceScratch staging;
    float* dev = (float*)scratch_get(&staging, n * sizeof(float));
    copy_host_to_device(dev, values, n * sizeof(float));
    comm_all_reduce(g, dev, n, COMM_FLOAT, op);
    copy_device_to_host(values, dev, n * sizeof(float));
}

// host bytes (at most 64: a step number) from root to every rank
static inline void comm_broadcast_host(CommGroup* g, void* buf, size_t bytes, int root) {
    if (bytes > 64) fail("comm_broadcast_host: %zu bytes, at most 64", bytes);
    copy_host_to_device(g->scalar, buf, bytes);
    comm_broadcast(g, g->scalar, bytes, root);
    copy_device_to_host(buf, g->scalar, bytes);
}

// Channel c's communicator and stream (comm.h): the group's own for 0, else side channel c's
static inline ncclComm_t comm_channel_nccl(const CommGroup* g, int c) { return c ? g->side[c - 1].nccl : g->nccl; }
static inline cudaStream_t comm_channel_stream(const CommGroup* g, int c) { return c ? g->side[c - 1].stream : g->stream; }
// ... and its next completion event (round-robin from its stream's pool, comm_nccl_posted below)
static inline cudaEvent_t comm_channel_event(CommGroup* g, int c) {
    return c ? g->side[c - 1].events[g->side[c - 1].next_event++ % COMM_EVENTS] : g->events[g->next_event++ % COMM_EVENTS];
}

// An exchange's messages of one channel as one NCCL group on that channel's stream.
// NCCL connects two ranks lazily, on the host, in the group of their first send/recv; where one
// bootstrap message carries both directions' connection info (a group of 2, or ranks size/2
// apart), both ranks must connect the same directions in that group. A pipeline's first exchange
// breaks that: stage 0 sends an activation and receives a gradient, stage 1 only receives
// (NCCL: "Message truncated : received 1024 bytes instead of 512", then a hang). So on channel 0
// the group of a pair's first use also carries one float each way, on both ranks, whatever they
// exchange: both connect both directions at once. (Not counted: it carries no data.) A side
// channel connected its peers when it opened (comm_open_channel): a send posted ahead must not
// wait on the host for its peer's first call there.
// Inside an open NCCL group on channel c: a peer this rank talks to for the first time on channel
// 0 gets the one-float connect exchange first (both directions at once, as NCCL's bootstrap
// needs); a side channel connected its peers when it opened, and a peer it did not connect is an
// error (comm_open_channel's peers). `what`: the operation, for the message
static inline void nccl_connect_peer(CommGroup* g, int c, int peer, ncclComm_t nccl, cudaStream_t stream, const char* what) {
    if (c > 0 && !g->side[c - 1].connected[peer]) {
        fail("%s on group '%s': a message to or from rank %d on side channel %d, which did not connect that rank when it "
             "opened (comm_open_channel's peers)", what, g->name, peer, c);
    }
    if (c > 0 || g->connected[peer]) return;
    g->connected[peer] = 1;
    nccl_check(ncclSend(g->scalar + 16, 1, ncclFloat, peer, nccl, stream), g, "connect");
    nccl_check(ncclRecv(g->scalar + 17, 1, ncclFloat, peer, nccl, stream), g, "connect");
}
static inline void nccl_post_messages(CommGroup* g, int c, const CommMessage* msgs, int count, CommDtype dtype) {
    ncclComm_t nccl = comm_channel_nccl(g, c);
    cudaStream_t stream = comm_channel_stream(g, c);
    nccl_check(ncclGroupStart(), g, "exchange");
    for (int i = 0; i < count; i++) {
        if (msgs[i].channel != c || msgs[i].peer == g->rank) continue;
        nccl_connect_peer(g, c, msgs[i].peer, nccl, stream, "exchange");
    }
    for (int i = 0; i < count; i++) {
        if (msgs[i].channel != c) continue;
        if (msgs[i].is_send) nccl_check(ncclSend(msgs[i].buf, msgs[i].n, comm_nccl_type(dtype), msgs[i].peer, nccl, stream), g, "send");
        else nccl_check(ncclRecv(msgs[i].buf, msgs[i].n, comm_nccl_type(dtype), msgs[i].peer, nccl, stream), g, "recv");
    }
    nccl_check(ncclGroupEnd(), g, "exchange");
}

// n elements of dtype (bf16 activations, fp32 gradients) to rank dest, and from rank src
static inline void comm_send(CommGroup* g, const void* buf, size_t n, CommDtype dtype, int dest) {
    comm_count(g, COMM_SEND, n * comm_dtype_bytes(dtype));
#ifdef USE_MPI
    if (g->staged) {
        float* host = staged_to_host(buf, n, dtype);
        mpi_send(g, host, n, dest);
        free(host);
        comm_done(g);
        return;
    }
#endif
    comm_begin(g);
    CommMessage msg = comm_message((void*)buf, n, dest, 1);
    nccl_post_messages(g, 0, &msg, 1, dtype);
    comm_end(g);
}

static inline void comm_recv(CommGroup* g, void* buf, size_t n, CommDtype dtype, int src) {
    comm_count(g, COMM_RECV, n * comm_dtype_bytes(dtype));
#ifdef USE_MPI
    if (g->staged) {
        float* host = (float*)malloc_check(n * sizeof(float));
        mpi_recv(g, host, n, src);
        staged_to_device(buf, host, n, dtype);
        comm_done(g);
        return;
    }
#endif
    comm_begin(g);
    CommMessage msg = comm_message(buf, n, src, 0);
    nccl_post_messages(g, 0, &msg, 1, dtype);
    comm_end(g);
}

// An exchange on NCCL: each channel's messages (comm.h) as one group on that channel's stream,
// channel 0 first and the side channels in order (every rank posts them so), all after the
// kernels issued so far and all posted before anything waits for one: every message of the
// exchange is out at once, as MPI's requests are, and no channel's part waits for another's.
// Each part is timed on its stream (its flight) and ends in an event of its stream, which the
// compute stream waits for, timed (the exposed part): at once (r NULL), or at comm_wait(r).
// (Events round-robin, as comm_nccl_posted below says, from a pool per stream.)
static inline void nccl_post_exchange(CommGroup* g, const CommMessage* msgs, int count, CommDtype dtype, CommRequest* r) {
    cudaEvent_t done[COMM_CHANNELS];
    int parts = 0;
    cudaCheck(cudaEventRecord(g->ready, 0));
    for (int c = 0; c <= g->side_channels; c++) {
        int used = 0;
        for (int i = 0; i < count; i++) used |= msgs[i].channel == c;
        if (!used) continue;
        cudaStream_t stream = comm_channel_stream(g, c);
        cudaCheck(cudaStreamWaitEvent(stream, g->ready, 0));
        int pair = comm_timing_start(g, stream, g->op_kind, 0);
        nccl_post_messages(g, c, msgs, count, dtype);
        comm_timing_stop(g, pair, stream);
        done[parts] = comm_channel_event(g, c);
        cudaCheck(cudaEventRecord(done[parts++], stream));
    }
    for (int i = 0; i < parts; i++) {
        if (r) r->done[i] = done[i];
        else comm_compute_waits(g, done[i], g->op_kind);
    }
    if (r) r->num_done = parts;
}

// sends and receives of device buffers to and from several ranks at once: NCCL's group call
// posts them together, so the exchange completes once every partner has posted its side (the
// host-staged path: the same through MPI's non-blocking calls, cpu/comm.h)
static inline void comm_exchange(CommGroup* g, const CommMessage* msgs, int count, CommDtype dtype) {
    if (count == 0) return;
    comm_count_exchange(g, msgs, count, comm_dtype_bytes(dtype));
#ifdef USE_MPI
    if (g->staged) {  // an exchange moves values: the device's bytes as they are, through MPI
        size_t elem = comm_dtype_bytes(dtype);
        void* host[COMM_EXCHANGE_MAX];
        for (int i = 0; i < count; i++) {
            host[i] = malloc_check(msgs[i].n * elem);
            if (msgs[i].is_send) copy_device_to_host(host[i], msgs[i].buf, msgs[i].n * elem);
        }
        mpi_exchange(g, msgs, count, host, dtype);
        for (int i = 0; i < count; i++) {
            if (!msgs[i].is_send) copy_host_to_device(msgs[i].buf, host[i], msgs[i].n * elem);
            free(host[i]);
        }
        comm_done(g);
        return;
    }
#endif
    nccl_post_exchange(g, msgs, count, dtype, NULL);
    watchdog_leave();  // (a hang shows at the next wait for the device)
}

// The non-blocking forms of the three collectives data parallelism overlaps with its compute.
// The NCCL call goes onto the comm stream after the kernels issued so far, as always, but the
// compute stream goes on without it: it waits for the call's event only at comm_wait, so the
// kernels issued in between run beside the collective. The completion events are reused
// round-robin (COMM_EVENTS of them): should one be recorded again before an older call's wait,
// that wait waits for the newer call, later on the same in-order stream: longer, never too
// short. The host-staged path runs the blocking call.
static inline void comm_nccl_posted(CommGroup* g, CommRequest* r) {
    comm_timing_stop(g, g->timing_op, g->stream);
    r->done[0] = g->events[g->next_event++ % COMM_EVENTS];
    r->num_done = 1;
    cudaCheck(cudaEventRecord(r->done[0], g->stream));
    comm_posted(g, r, 0);
}

static inline void comm_all_reduce_start(CommGroup* g, void* buf, size_t n, CommDtype dtype, CommOp op, CommRequest* r) {
    if (g->staged) {
        comm_all_reduce(g, buf, n, dtype, op);
        r->active = 0;
        return;
    }
    comm_count(g, COMM_ALL_REDUCE, n * comm_dtype_bytes(dtype));
    comm_begin(g);
    nccl_check(ncclAllReduce(buf, buf, n, comm_nccl_type(dtype), comm_nccl_op(op), g->nccl, g->stream), g, "all_reduce");
    comm_nccl_posted(g, r);
}

static inline void comm_reduce_scatter_start(CommGroup* g, const void* send, void* recv, size_t n, CommDtype dtype,
                                             CommOp op, CommRequest* r) {
    if (g->staged) {
        comm_reduce_scatter(g, send, recv, n, dtype, op);
        r->active = 0;
        return;
    }
    comm_count(g, COMM_REDUCE_SCATTER, n * g->size * comm_dtype_bytes(dtype));
    comm_begin(g);
    nccl_check(ncclReduceScatter(send, recv, n, comm_nccl_type(dtype), comm_nccl_op(op), g->nccl, g->stream), g, "reduce_scatter");
    comm_nccl_posted(g, r);
}

// send == NULL: in place, as comm_all_gather_in_place
static inline void comm_all_gather_start(CommGroup* g, const void* send, void* recv, size_t n, CommDtype dtype,
                                         CommRequest* r) {
    if (g->staged) {
        if (send) comm_all_gather(g, send, recv, n, dtype);
        else comm_all_gather_in_place(g, recv, n, dtype);
        r->active = 0;
        return;
    }
    comm_count(g, COMM_ALL_GATHER, n * g->size * comm_dtype_bytes(dtype));
    comm_begin(g);
    if (send == NULL) send = (const char*)recv + (size_t)g->rank * n * comm_dtype_bytes(dtype);
    nccl_check(ncclAllGather(send, recv, n, comm_nccl_type(dtype), g->nccl, g->stream), g, "all_gather");
    comm_nccl_posted(g, r);
}

// comm_exchange posted: NCCL's grouped sends and receives on their channels' streams, which the
// compute stream waits for at comm_wait. The host-staged path posts MPI's own non-blocking calls
// on host copies (the CPU backend's, cpu/comm.h: they move at comm_progress and comm_wait), and
// comm_wait puts the receives on the device: so a send posted ahead of its exchange (the F&B
// overlap) leaves at once on this path too, and waits for nothing queued behind it.
static inline void comm_exchange_start(CommGroup* g, const CommMessage* msgs, int count, CommDtype dtype, CommRequest* r) {
    if (count == 0) {
        r->active = 0;
        return;
    }
    comm_count_exchange(g, msgs, count, comm_dtype_bytes(dtype));
#ifdef USE_MPI
    if (g->staged) {
        r->staged_elem = comm_dtype_bytes(dtype);
        for (int i = 0; i < count; i++) {
            r->staged[i] = malloc_check(msgs[i].n * r->staged_elem);
            r->staged_msgs[i] = msgs[i];
            if (msgs[i].is_send) copy_device_to_host(r->staged[i], msgs[i].buf, msgs[i].n * r->staged_elem);
        }
        r->num_staged = count;
        mpi_exchange_post(g, msgs, count, r->staged, dtype, r->mpi);
        r->num_mpi = count;
        r->average = NULL;
        comm_posted(g, r, 1);
        return;
    }
#endif
    nccl_post_exchange(g, msgs, count, dtype, r);
    comm_posted(g, r, 0);
}

// NCCL moves on its own; the host-staged path's MPI requests move only while this rank is in MPI
static inline void comm_progress(CommGroup* g) {
#ifdef USE_MPI
    if (g->staged) mpi_progress(g);
#endif
    (void)g;
}

// the compute stream waits for r's collective, or for each channel's part of r's exchange (the
// host does not); on the host-staged path the host waits, as on the CPU backend (exposed), and
// copies what was received to the device
static inline void comm_wait(CommRequest* r) {
    if (!r->active) return;
#ifdef USE_MPI
    if (r->g->staged) {
        CommGroup* g = r->g;
        double t0 = wall_time_s();
        watchdog_enter(comm_kind_names[r->kind], g->name);
        mpi_wait(r);
        for (int i = 0; i < r->num_staged; i++) {
            CommMessage* m = &r->staged_msgs[i];
            if (!m->is_send) copy_host_to_device(m->buf, r->staged[i], m->n * r->staged_elem);
            free(r->staged[i]);
        }
        r->num_staged = 0;
        double t1 = wall_time_s();
        g->seconds[r->kind] += t1 - t0;
        if (!r->complete) comm_completed(r, t1);
        r->active = 0;
        watchdog_leave();
        return;
    }
#endif
    for (int i = 0; i < r->num_done; i++) comm_compute_waits(r->g, r->done[i], r->kind);
    r->active = 0;
}

// All-to-all with counts on channel c's communicator and stream (comm.h), posted as one NCCL
// group: block p of send (send_counts[p] elements, the blocks in rank order) to rank p, rank p's
// block for this rank into block p of recv. NCCL has no all-to-all call: it is a group of
// ncclSend and ncclRecv, one pair per rank, which NCCL runs together (its own documentation's
// example); this rank's own block is a copy on the same stream. On channel 0 a pair's first use
// also connects both directions (nccl_post_messages says why); a side channel connected its peers
// when it opened, every other rank of the group for an all-to-all.
static inline void nccl_post_all_to_all(CommGroup* g, int c, const void* send, const size_t* send_counts, void* recv,
                                        const size_t* recv_counts, CommDtype dtype) {
    ncclComm_t nccl = comm_channel_nccl(g, c);
    cudaStream_t stream = comm_channel_stream(g, c);
    size_t elem = comm_dtype_bytes(dtype), s_at = 0, r_at = 0;
    nccl_check(ncclGroupStart(), g, "all_to_all");
    for (int p = 0; p < g->size; p++) {
        if (p != g->rank) nccl_connect_peer(g, c, p, nccl, stream, "all_to_all");
    }
    for (int p = 0; p < g->size; p++) {
        const char* from = (const char*)send + s_at * elem;
        char* to = (char*)recv + r_at * elem;
        if (p == g->rank && send_counts[p] > 0) {
            cudaCheck(cudaMemcpyAsync(to, from, send_counts[p] * elem, cudaMemcpyDeviceToDevice, stream));
        } else if (p != g->rank) {
            if (send_counts[p]) nccl_check(ncclSend(from, send_counts[p], comm_nccl_type(dtype), p, nccl, stream), g, "all_to_all");
            if (recv_counts[p]) nccl_check(ncclRecv(to, recv_counts[p], comm_nccl_type(dtype), p, nccl, stream), g, "all_to_all");
        }
        s_at += send_counts[p], r_at += recv_counts[p];
    }
    nccl_check(ncclGroupEnd(), g, "all_to_all");
}

// The all-to-all (Mixture-of-Experts' tokens, llmc/moe.h), blocking: on the comm stream after the
// kernels issued so far, the compute stream waiting for it
static inline void comm_all_to_all(CommGroup* g, const void* send, const size_t* send_counts, void* recv,
                                   const size_t* recv_counts, CommDtype dtype) {
    comm_count(g, COMM_ALL_TO_ALL, comm_all_to_all_sent(g, send_counts) * comm_dtype_bytes(dtype));
#ifdef USE_MPI
    if (g->staged) {
        size_t s_total = 0, r_total = 0;
        for (int p = 0; p < g->size; p++) s_total += send_counts[p], r_total += recv_counts[p];
        float* host_send = staged_to_host(send, s_total, dtype);
        float* host_recv = (float*)malloc_check((r_total ? r_total : 1) * sizeof(float));
        mpi_all_to_all(g, host_send, send_counts, host_recv, recv_counts);
        free(host_send);
        staged_to_device(recv, host_recv, r_total, dtype);
        comm_done(g);
        return;
    }
#endif
    comm_begin(g);
    nccl_post_all_to_all(g, 0, send, send_counts, recv, recv_counts, dtype);
    comm_end(g);
}

// ... and posted (the CPU backend's MPI_Ialltoallv): the group goes onto channel `channel`'s
// stream after the kernels issued so far (an event recorded on the compute stream, which that
// stream waits for: the send buffer is written by then), and its end is an event of that stream,
// which the compute stream waits for only at comm_wait(r), before anything reads recv or writes
// send again; the kernels issued in between run beside it. The MoE overlap (llmc/moe.h) posts its
// rows on a side channel of the ep group, so that the counts' all-to-all, blocking on channel 0,
// never queues behind rows still waiting for a peer; every rank of the group posts the same
// all-to-alls on it in the same order (llmc/pipeline_walk.h), as NCCL requires of a communicator.
// The host-staged path stays blocking (complete at once, comm_wait returns): its MPI_Alltoallv
// runs on host copies, fp32 of the device's bf16, that comm_wait would have to keep and convert.
static inline void comm_all_to_all_start(CommGroup* g, const void* send, const size_t* send_counts, void* recv,
                                         const size_t* recv_counts, CommDtype dtype, int channel, CommRequest* r) {
    comm_check_channel(g, channel, "all_to_all");
    if (g->staged) {
        comm_all_to_all(g, send, send_counts, recv, recv_counts, dtype);
        r->active = 0;
        return;
    }
    comm_count(g, COMM_ALL_TO_ALL, comm_all_to_all_sent(g, send_counts) * comm_dtype_bytes(dtype));
    cudaStream_t stream = comm_channel_stream(g, channel);
    cudaCheck(cudaEventRecord(g->ready, 0));
    cudaCheck(cudaStreamWaitEvent(stream, g->ready, 0));
    int pair = comm_timing_start(g, stream, COMM_ALL_TO_ALL, 0);
    nccl_post_all_to_all(g, channel, send, send_counts, recv, recv_counts, dtype);
    comm_timing_stop(g, pair, stream);
    r->done[0] = comm_channel_event(g, channel);
    r->num_done = 1;
    cudaCheck(cudaEventRecord(r->done[0], stream));
    comm_posted(g, r, 0);
}

// n host ints for each rank, block p to rank p, block p from rank p: the sizes of the all-to-all
// that follows, which the host needs before it can post it (so this one waits for the GPU)
static inline void comm_all_to_all_counts(CommGroup* g, const int* send, int* recv, int n) {
    comm_count(g, COMM_ALL_TO_ALL, (size_t)n * (g->size - 1) * sizeof(int));
#ifdef USE_MPI
    if (g->staged) {
        mpi_all_to_all_counts(g, send, recv, n);
        comm_done(g);
        return;
    }
#endif
    static DeviceScratch counts;  // what is sent, then what is received (2 n size ints)
    size_t bytes = (size_t)n * g->size * sizeof(int);
    int* dev = (int*)scratch_get(&counts, 2 * bytes);
    copy_host_to_device(dev, send, bytes);
    comm_begin(g);
    nccl_check(ncclGroupStart(), g, "all_to_all");
    for (int p = 0; p < g->size; p++) {
        if (p != g->rank && !g->connected[p]) {
            g->connected[p] = 1;
            nccl_check(ncclSend(g->scalar + 16, 1, ncclFloat, p, g->nccl, g->stream), g, "connect");
            nccl_check(ncclRecv(g->scalar + 17, 1, ncclFloat, p, g->nccl, g->stream), g, "connect");
        }
        nccl_check(ncclSend(dev + (size_t)p * n, n, ncclInt32, p, g->nccl, g->stream), g, "all_to_all");
        nccl_check(ncclRecv(dev + (size_t)(g->size + p) * n, n, ncclInt32, p, g->nccl, g->stream), g, "all_to_all");
    }
    nccl_check(ncclGroupEnd(), g, "all_to_all");
    comm_end(g);
    copy_device_to_host(recv, dev + (size_t)n * g->size, bytes);  // (waits for the exchange)
}

static inline void comm_barrier(CommGroup* g) {
    comm_count(g, COMM_BARRIER, 0);
#ifdef USE_MPI
    if (g->staged) {
        comm_check(MPI_Barrier(g->mpi), g, "barrier");
        comm_done(g);
        return;
    }
#endif
    // an all-reduce of one float that every rank waits for, timed by the host (comm_done) as
    // it blocks: after the kernels issued so far, without comm_begin's timing events
    cudaCheck(cudaEventRecord(g->ready, 0));
    cudaCheck(cudaStreamWaitEvent(g->stream, g->ready, 0));
    nccl_check(ncclAllReduce(g->scalar, g->scalar, 1, ncclFloat, ncclSum, g->nccl, g->stream), g, "barrier");
    cudaCheck(cudaStreamSynchronize(g->stream));
    comm_done(g);
}

#endif
