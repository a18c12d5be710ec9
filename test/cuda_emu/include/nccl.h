// cuda_emu: the NCCL calls this project makes, carried out by MPI on the emulator's device memory
// (which is host memory). A communicator is an MPI communicator: ncclCommInitRank duplicates
// MPI_COMM_WORLD (so the emulated job must be launched by mpirun, or be a single rank), and
// ncclCommSplit splits it. bf16 data is reduced in fp32 and rounded once. Collectives run at
// once; sends and receives are posted at ncclGroupEnd and finished as their stream's work
// (cuda_runtime.h's CUstream_st), so two streams' groups move independently, as on a GPU.
//
// MPI forgives what NCCL does not, so the calls are checked against NCCL's rules first (a broken
// rule is ncclInvalidUsage, with the reason in ncclGetLastError):
//   - every rank of a communicator issues the same collectives (and splits) in the same order,
//     with the same count, type, operation and root: before each one the members tell each
//     other what they are about to do (MPI would often match an all-reduce with a broadcast, or
//     two counts, and go on);
//   - a send and its recv have the same size;
//   - NCCL connects a pair of ranks lazily, at their first send/recv, on the host. Where it
//     carries both directions' connection info in one bootstrap message (the two ranks of a
//     2-rank communicator, or any two ranks size/2 apart), both must connect the same directions
//     in that first group: one rank posting a send and a recv while the other posts only a recv
//     ends in NCCL's "Message truncated : received 1024 bytes instead of 512", or a hang. The
//     pair compares the directions each connects, as NCCL's bootstrap exchange would.
#ifndef CUDA_EMU_NCCL_H
#define CUDA_EMU_NCCL_H

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <string>
#include <vector>
#ifdef USE_MPI
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>
#endif

typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
} ncclResult_t;
typedef enum { ncclChar = 0, ncclInt8 = 0, ncclInt32 = 2, ncclFloat = 7, ncclFloat32 = 7, ncclBfloat16 = 9 } ncclDataType_t;
typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 } ncclRedOp_t;
typedef struct { char internal[128]; } ncclUniqueId;
typedef struct { int unused; } ncclConfig_t;
#define NCCL_SPLIT_NOCOLOR -1

namespace cuda_emu {

struct NcclComm {
    int rank, size;
#ifdef USE_MPI
    MPI_Comm mpi;
#endif
    std::string members;                   // its ranks' world ranks, "{0,2}", for messages
    std::vector<unsigned char> connected;  // per peer: the point-to-point directions connected
};
enum { NCCL_SEND = 1, NCCL_RECV = 2 };     // (a direction, as this rank sees it)

static std::string nccl_last_error;        // what ncclGetLastError returns

// What a rank is about to do on a communicator, as its members compare it
enum { OP_SPLIT, OP_ALL_REDUCE, OP_REDUCE_SCATTER, OP_ALL_GATHER, OP_BROADCAST, OP_CONNECT };
struct NcclOp { int kind, type, op, root; long long count; };  // OP_CONNECT: root = the directions

static inline std::string nccl_op_text(NcclOp o, int peer) {
    static const char* kinds[] = {"a split", "an all-reduce", "a reduce-scatter", "an all-gather", "a broadcast"};
    static const char* ops[] = {"sum", "prod", "max", "min", "avg"};
    char text[256];
    if (o.kind == OP_CONNECT) {
        snprintf(text, sizeof(text), "its first send/recv with rank %d, connecting %s", peer,
                 o.root == (NCCL_SEND | NCCL_RECV) ? "a send to it and a recv from it"
                 : o.root == NCCL_SEND ? "only a send to it" : "only a recv from it");
    } else if (o.kind == OP_SPLIT) {
        snprintf(text, sizeof(text), "a split");
    } else {
        const char* type = o.type == ncclFloat ? "fp32" : o.type == ncclBfloat16 ? "bf16" : o.type == ncclInt32 ? "int32" : "bytes";
        int len = snprintf(text, sizeof(text), "%s of %lld %s", kinds[o.kind], o.count, type);
        if (o.kind == OP_ALL_REDUCE || o.kind == OP_REDUCE_SCATTER) snprintf(text + len, sizeof(text) - len, " (%s)", ops[o.op]);
        if (o.kind == OP_BROADCAST) snprintf(text + len, sizeof(text) - len, " from rank %d", o.root);
    }
    return text;
}

static inline ncclResult_t nccl_fail(std::string what) {
    nccl_last_error = "cuda_emu: " + what;
    return ncclInvalidUsage;
}

// point-to-point calls between ncclGroupStart and ncclGroupEnd, posted together at the end
struct PendingP2P { int send; void* buf; size_t bytes; int peer; NcclComm* comm; cudaStream_t stream; };
static std::vector<PendingP2P> nccl_group;
static int nccl_group_depth = 0;

static inline size_t nccl_type_bytes(ncclDataType_t t) { return t == ncclFloat || t == ncclInt32 ? 4 : t == ncclBfloat16 ? 2 : 1; }

// fp32 copies of float or bf16 data, for reductions
static inline float* nccl_to_floats(const void* p, size_t n, ncclDataType_t t) {
    float* f = (float*)malloc(n * sizeof(float) + 1);
    if (f == NULL) die("no host memory for an NCCL reduction");
    for (size_t i = 0; i < n; i++) f[i] = t == ncclFloat ? ((const float*)p)[i] : (float)((const __nv_bfloat16*)p)[i];
    return f;
}
static inline void nccl_from_floats(void* p, float* f, size_t n, ncclDataType_t t, float scale) {
    for (size_t i = 0; i < n; i++) {
        if (t == ncclFloat) ((float*)p)[i] = f[i] * scale;
        else ((__nv_bfloat16*)p)[i] = __nv_bfloat16(f[i] * scale);
    }
    free(f);
}

#ifdef USE_MPI
// a new communicator's members as world ranks, and no connections yet
static inline void nccl_comm_members(NcclComm* c) {
    MPI_Group group, world;
    MPI_Comm_group(c->mpi, &group);
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    std::vector<int> ranks(c->size), in_world(c->size);
    for (int i = 0; i < c->size; i++) ranks[i] = i;
    MPI_Group_translate_ranks(group, c->size, ranks.data(), world, in_world.data());
    MPI_Group_free(&group);
    MPI_Group_free(&world);
    c->members = "{";
    for (int i = 0; i < c->size; i++) c->members += (i ? "," : "") + std::to_string(in_world[i]);
    c->members += "}";
    c->connected.assign(c->size, 0);
}

// The members' check before an operation: this rank's `mine` goes to `peer` (-1: every other
// member), and theirs comes back, through MPI messages of their own tag, so that a member doing
// something else (another collective, a first send/recv) is caught at once rather than matched by
// MPI or left hanging. A collective's members must all do the same; a pair's first connect must
// mirror (one's send is the other's recv).
static const int NCCL_CHECK_TAG = 1;  // (the data travels with tag 0)
static inline ncclResult_t nccl_agree(NcclComm* c, NcclOp mine, int peer) {
    int lo = peer < 0 ? 0 : peer, hi = peer < 0 ? c->size : peer + 1;
    std::vector<NcclOp> theirs(c->size);
    std::vector<MPI_Request> requests;
    for (int r = lo; r < hi; r++) {
        if (r == c->rank) continue;
        requests.push_back(MPI_REQUEST_NULL);
        MPI_Isend(&mine, sizeof(mine), MPI_BYTE, r, NCCL_CHECK_TAG, c->mpi, &requests.back());
        requests.push_back(MPI_REQUEST_NULL);
        MPI_Irecv(&theirs[r], sizeof(mine), MPI_BYTE, r, NCCL_CHECK_TAG, c->mpi, &requests.back());
    }
    if (MPI_Waitall((int)requests.size(), requests.data(), MPI_STATUSES_IGNORE) != MPI_SUCCESS) return ncclSystemError;
    for (int r = lo; r < hi; r++) {
        if (r == c->rank) continue;
        NcclOp want = mine;
        if (mine.kind == OP_CONNECT) want.root = (mine.root & NCCL_SEND ? NCCL_RECV : 0) | (mine.root & NCCL_RECV ? NCCL_SEND : 0);
        NcclOp got = theirs[r];
        if (got.kind == want.kind && got.type == want.type && got.op == want.op && got.root == want.root && got.count == want.count) continue;
        std::string why = mine.kind == OP_CONNECT && got.kind == OP_CONNECT
            ? ": NCCL connects a pair of ranks lazily at their first send/recv and, where one bootstrap message carries "
              "both directions (a 2-rank communicator, or ranks size/2 apart), both must connect the same directions in "
              "that first group (else NCCL's 'Message truncated' or a hang). Make a pair's first exchange symmetric"
            : ": every rank of a communicator must issue the same collectives and splits in the same order, with the same "
              "count, type, operation and root, and a pair's first send/recv must meet its peer's";
        return nccl_fail("communicator of world ranks " + c->members + ": rank " + std::to_string(c->rank) + " issues " +
                         nccl_op_text(mine, r) + " where rank " + std::to_string(r) + " issues " +
                         nccl_op_text(got, c->rank) + why);
    }
    return ncclSuccess;
}
#endif

}  // namespace cuda_emu

typedef cuda_emu::NcclComm* ncclComm_t;

static inline const char* ncclGetErrorString(ncclResult_t r) {
    switch (r) {
        case ncclSuccess: return "no error";
        case ncclInvalidArgument: return "invalid argument (cuda_emu)";
        case ncclInvalidUsage: return "invalid usage (cuda_emu)";
        default: return "internal error (cuda_emu)";
    }
}

// the reason for the last error (a broken rule of NCCL's, above), as NCCL's own
static inline const char* ncclGetLastError(ncclComm_t comm) {
    (void)comm;
    return cuda_emu::nccl_last_error.c_str();
}

static inline ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
    memset(id, 0, sizeof(*id));
    snprintf(id->internal, sizeof(id->internal), "cuda_emu");
    return ncclSuccess;
}

static inline ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
    if (strcmp(id.internal, "cuda_emu") != 0) return ncclInvalidArgument;
    *comm = new cuda_emu::NcclComm();
    (*comm)->rank = rank;
    (*comm)->size = nranks;
#ifdef USE_MPI
    (*comm)->mpi = MPI_COMM_NULL;
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized) {
        int world_rank, world_size;
        MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
        MPI_Comm_size(MPI_COMM_WORLD, &world_size);
        if (world_rank != rank || world_size != nranks) return cuda_emu::nccl_fail("NCCL needs mpirun, or a world of 1");
        if (MPI_Comm_dup(MPI_COMM_WORLD, &(*comm)->mpi) != MPI_SUCCESS) return ncclSystemError;
        cuda_emu::nccl_comm_members(*comm);
        return ncclSuccess;
    }
#endif
    return nranks == 1 ? ncclSuccess : cuda_emu::nccl_fail("NCCL needs mpirun, or a world of 1");
}

static inline ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* out, ncclConfig_t* config) {
    (void)config;
    *out = NULL;
#ifdef USE_MPI
    if (comm->mpi != MPI_COMM_NULL) {
        ncclResult_t agreed = cuda_emu::nccl_agree(comm, {cuda_emu::OP_SPLIT, 0, 0, 0, 0}, -1);
        if (agreed != ncclSuccess) return agreed;
        MPI_Comm split;
        if (MPI_Comm_split(comm->mpi, color == NCCL_SPLIT_NOCOLOR ? MPI_UNDEFINED : color, key, &split) != MPI_SUCCESS) return ncclSystemError;
        if (split == MPI_COMM_NULL) return ncclSuccess;
        *out = new cuda_emu::NcclComm();
        (*out)->mpi = split;
        MPI_Comm_rank(split, &(*out)->rank);
        MPI_Comm_size(split, &(*out)->size);
        cuda_emu::nccl_comm_members(*out);
        return ncclSuccess;
    }
#endif
    (void)key;
    if (color == NCCL_SPLIT_NOCOLOR) return ncclSuccess;
    *out = new cuda_emu::NcclComm(*comm);
    return ncclSuccess;
}

static inline ncclResult_t ncclCommUserRank(ncclComm_t comm, int* rank) { *rank = comm->rank; return ncclSuccess; }
static inline ncclResult_t ncclCommCount(ncclComm_t comm, int* count) { *count = comm->size; return ncclSuccess; }
static inline ncclResult_t ncclCommDestroy(ncclComm_t comm) {
#ifdef USE_MPI
    if (comm->mpi != MPI_COMM_NULL) MPI_Comm_free(&comm->mpi);
#endif
    delete comm;
    return ncclSuccess;
}

#ifdef USE_MPI
#define CUDA_EMU_MPI(comm) ((comm)->mpi != MPI_COMM_NULL)
static inline MPI_Op cuda_emu_mpi_op(ncclRedOp_t op) {
    return op == ncclMax ? MPI_MAX : op == ncclMin ? MPI_MIN : op == ncclProd ? MPI_PROD : MPI_SUM;
}
#else
#define CUDA_EMU_MPI(comm) 0
#endif

// all-reduce (scatter 0) or reduce-scatter (scatter 1, each rank keeps its block of count)
// NCCL moves device memory. The emulator's host and "device" share one address space, so a host
// buffer handed to a collective would work here and fail on a GPU: each call checks that its
// buffers lie inside device allocations (cudaMalloc's) and refuses them otherwise
static inline int cuda_emu_on_device(const void* p, size_t bytes) {
    if (bytes == 0) return 1;
    for (auto& a : cuda_emu::state.allocations) {
        const char* base = (const char*)a.first;
        if ((const char*)p >= base && (const char*)p + bytes <= base + a.second) return 1;
    }
    fprintf(stderr, "cuda_emu: an NCCL call was given %zu bytes at %p, outside every device allocation (host memory?)\n",
            bytes, p);
    return 0;
}

static inline ncclResult_t cuda_emu_reduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                                           ncclRedOp_t op, ncclComm_t comm, int scatter) {
    size_t in_count = scatter ? count * comm->size : count;
    if (in_count > (size_t)1 << 30) return ncclInvalidArgument;
    size_t elem = cuda_emu::nccl_type_bytes(type);
    if (!cuda_emu_on_device(send, in_count * elem) || !cuda_emu_on_device(recv, count * elem)) return ncclInvalidArgument;
#ifdef USE_MPI
    if (CUDA_EMU_MPI(comm)) {
        cuda_emu::NcclOp mine = {scatter ? cuda_emu::OP_REDUCE_SCATTER : cuda_emu::OP_ALL_REDUCE, type, op, 0, (long long)count};
        ncclResult_t agreed = cuda_emu::nccl_agree(comm, mine, -1);
        if (agreed != ncclSuccess) return agreed;
    }
#endif
    float* f = cuda_emu::nccl_to_floats(send, in_count, type);
#ifdef USE_MPI
    if (CUDA_EMU_MPI(comm)) {
        int err = scatter ? MPI_Reduce_scatter_block(MPI_IN_PLACE, f, (int)count, MPI_FLOAT, cuda_emu_mpi_op(op), comm->mpi)
                          : MPI_Allreduce(MPI_IN_PLACE, f, (int)count, MPI_FLOAT, cuda_emu_mpi_op(op), comm->mpi);
        if (err != MPI_SUCCESS) {
            free(f);
            return ncclSystemError;
        }
    }
#endif
    cuda_emu::nccl_from_floats(recv, f, count, type, op == ncclAvg ? 1.0f / (float)comm->size : 1.0f);
    return ncclSuccess;
}
static inline ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                                         ncclComm_t comm, cudaStream_t stream) {
    cuda_emu::stream_finish_all(stream);  // (after the stream's unfinished work, in its order)
    return cuda_emu_reduce(send, recv, count, type, op, comm, 0);
}
static inline ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                                             ncclComm_t comm, cudaStream_t stream) {
    cuda_emu::stream_finish_all(stream);  // (after the stream's unfinished work, in its order)
    return cuda_emu_reduce(send, recv, count, type, op, comm, 1);
}

static inline ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t type, ncclComm_t comm,
                                         cudaStream_t stream) {
    cuda_emu::stream_finish_all(stream);  // (after the stream's unfinished work, in its order)
    size_t bytes = count * cuda_emu::nccl_type_bytes(type);
    if (bytes * comm->size > (size_t)1 << 30) return ncclInvalidArgument;
    if (!cuda_emu_on_device(send, bytes) || !cuda_emu_on_device(recv, bytes * comm->size)) return ncclInvalidArgument;
#ifdef USE_MPI
    if (CUDA_EMU_MPI(comm)) {
        ncclResult_t agreed = cuda_emu::nccl_agree(comm, {cuda_emu::OP_ALL_GATHER, type, 0, 0, (long long)count}, -1);
        if (agreed != ncclSuccess) return agreed;
        // in place, as NCCL allows: this rank's block already sits at its place in recv
        int in_place = send == (const char*)recv + (size_t)comm->rank * bytes;
        return MPI_Allgather(in_place ? MPI_IN_PLACE : send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE,
                             comm->mpi) == MPI_SUCCESS ? ncclSuccess : ncclSystemError;
    }
#endif
    memmove(recv, send, bytes);
    return ncclSuccess;
}

static inline ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type, int root,
                                         ncclComm_t comm, cudaStream_t stream) {
    cuda_emu::stream_finish_all(stream);  // (after the stream's unfinished work, in its order)
    size_t bytes = count * cuda_emu::nccl_type_bytes(type);
    if (bytes > (size_t)1 << 30 || root < 0 || root >= comm->size) return ncclInvalidArgument;
    if ((comm->rank == root && !cuda_emu_on_device(send, bytes)) || !cuda_emu_on_device(recv, bytes)) return ncclInvalidArgument;
    if (comm->rank == root && send != recv) memmove(recv, send, bytes);
#ifdef USE_MPI
    if (CUDA_EMU_MPI(comm)) {
        ncclResult_t agreed = cuda_emu::nccl_agree(comm, {cuda_emu::OP_BROADCAST, type, 0, root, (long long)count}, -1);
        if (agreed != ncclSuccess) return agreed;
        if (MPI_Bcast(recv, (int)bytes, MPI_BYTE, root, comm->mpi) != MPI_SUCCESS) return ncclSystemError;
    }
#endif
    return ncclSuccess;
}

static inline ncclResult_t ncclGroupStart(void) {
    cuda_emu::nccl_group_depth++;
    return ncclSuccess;
}

static inline ncclResult_t ncclGroupEnd(void);
static inline ncclResult_t cuda_emu_p2p(int send, void* buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                                        cudaStream_t stream) {
    size_t bytes = count * cuda_emu::nccl_type_bytes(type);
    if (bytes > (size_t)1 << 30 || peer < 0 || peer >= comm->size) return ncclInvalidArgument;
    if (!cuda_emu_on_device(buf, bytes)) return ncclInvalidArgument;
    if (!cuda_emu::nccl_group.empty() && cuda_emu::nccl_group[0].stream != stream) {
        return cuda_emu::nccl_fail("a group's sends and receives on two streams (this emulator takes one stream a group)");
    }
    cuda_emu::nccl_group.push_back({send, buf, bytes, peer, comm, stream});
    if (cuda_emu::nccl_group_depth > 0) return ncclSuccess;
    if (!CUDA_EMU_MPI(comm)) {  // (a single rank's send or recv outside a group has no partner)
        cuda_emu::nccl_group.clear();
        return ncclInvalidUsage;
    }
    cuda_emu::nccl_group_depth++;  // alone: a group of one
    return ncclGroupEnd();
}
static inline ncclResult_t ncclSend(const void* buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm, cudaStream_t stream) {
    return cuda_emu_p2p(1, (void*)buf, count, type, peer, comm, stream);
}
static inline ncclResult_t ncclRecv(void* buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm, cudaStream_t stream) {
    return cuda_emu_p2p(0, buf, count, type, peer, comm, stream);
}

// A group's sends and receives are posted (MPI_Isend, MPI_Irecv) when it ends, after the work
// queued ahead of them on their stream, and waited for as a piece of that stream's work
// (cuda_runtime.h's CUstream_st): when the compute waits for an event recorded after them, at a
// stream or device synchronize, or when the stream's next call comes. A recv that got fewer bytes
// than it asked for is found there, and ends the process with the reason (a GPU's NCCL would
// truncate or hang).
static inline ncclResult_t ncclGroupEnd(void) {
    using cuda_emu::nccl_group;
    if (cuda_emu::nccl_group_depth == 0) return ncclInvalidUsage;
    if (--cuda_emu::nccl_group_depth > 0) return ncclSuccess;
    ncclResult_t result = ncclSuccess;
    cudaStream_t stream = nccl_group.empty() ? NULL : nccl_group[0].stream;
    cuda_emu::stream_finish_all(stream);  // (a stream's calls run in order)
    // a communicator of one rank without MPI: its sends go to its own receives, in order
    size_t next_recv = 0;
    for (size_t i = 0; i < nccl_group.size(); i++) {
        cuda_emu::PendingP2P& p = nccl_group[i];
        if (CUDA_EMU_MPI(p.comm) || !p.send) continue;
        while (next_recv < nccl_group.size() && (nccl_group[next_recv].send || nccl_group[next_recv].comm != p.comm)) next_recv++;
        if (next_recv == nccl_group.size() || nccl_group[next_recv].bytes != p.bytes) { result = ncclInvalidUsage; break; }
        memmove(nccl_group[next_recv++].buf, p.buf, p.bytes);
    }
#ifdef USE_MPI
    // the group's first use of a pair connects it: the directions new to each peer, compared with
    // the peer's where NCCL's bootstrap carries both in one message (size/2 apart); on the host,
    // at once, as NCCL connects
    for (size_t i = 0; i < nccl_group.size() && result == ncclSuccess; i++) {
        cuda_emu::NcclComm* c = nccl_group[i].comm;
        int peer = nccl_group[i].peer, fresh = 0;
        if (!CUDA_EMU_MPI(c)) continue;
        for (cuda_emu::PendingP2P& q : nccl_group) {
            if (q.comm == c && q.peer == peer) fresh |= (q.send ? cuda_emu::NCCL_SEND : cuda_emu::NCCL_RECV) & ~c->connected[peer];
        }
        if (fresh == 0) continue;
        c->connected[peer] |= (unsigned char)fresh;
        if (2 * ((peer - c->rank + c->size) % c->size) == c->size) {
            result = cuda_emu::nccl_agree(c, {cuda_emu::OP_CONNECT, 0, 0, fresh, 0}, peer);
        }
    }
    std::vector<MPI_Request> requests;
    std::vector<cuda_emu::PendingP2P> posted;
    for (cuda_emu::PendingP2P& p : nccl_group) {
        if (!CUDA_EMU_MPI(p.comm) || result != ncclSuccess) continue;
        requests.push_back(MPI_REQUEST_NULL);
        posted.push_back(p);
        int err = p.send ? MPI_Isend(p.buf, (int)p.bytes, MPI_BYTE, p.peer, 0, p.comm->mpi, &requests.back())
                         : MPI_Irecv(p.buf, (int)p.bytes, MPI_BYTE, p.peer, 0, p.comm->mpi, &requests.back());
        if (err != MPI_SUCCESS) result = ncclSystemError;
    }
    if (!requests.empty() && result == ncclSuccess) {
        cuda_emu::stream_post(stream, [requests, posted]() mutable {
            std::vector<MPI_Status> statuses(requests.size());
            if (MPI_Waitall((int)requests.size(), requests.data(), statuses.data()) != MPI_SUCCESS) {
                fprintf(stderr, "cuda_emu: NCCL's sends and receives failed in MPI\n");
                exit(3);
            }
            // a recv must get as many bytes as it asked for (MPI takes a shorter message without a word)
            for (size_t i = 0; i < posted.size(); i++) {
                int got = 0;
                MPI_Get_count(&statuses[i], MPI_BYTE, &got);
                if (posted[i].send || (size_t)got == posted[i].bytes) continue;
                fprintf(stderr, "cuda_emu: communicator of world ranks %s: rank %d receives %zu bytes from rank %d, which "
                        "sent %d: a send and its recv must have the same size\n", posted[i].comm->members.c_str(),
                        posted[i].comm->rank, posted[i].bytes, posted[i].peer, got);
                exit(3);
            }
        });
    }
#endif
    nccl_group.clear();
    return result;
}

#endif
