// cuda_emu: the NCCL calls this project makes, carried out by MPI on the emulator's device memory
// (which is host memory). A communicator is an MPI communicator: ncclCommInitRank duplicates
// MPI_COMM_WORLD (so the emulated job must be launched by mpirun, or be a single rank), and
// ncclCommSplit splits it. bf16 data is reduced in fp32 and rounded once.
#ifndef CUDA_EMU_NCCL_H
#define CUDA_EMU_NCCL_H

#include <cuda_bf16.h>
#include <cuda_runtime.h>
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
typedef enum { ncclChar = 0, ncclInt8 = 0, ncclFloat = 7, ncclFloat32 = 7, ncclBfloat16 = 9 } ncclDataType_t;
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
};

// point-to-point calls between ncclGroupStart and ncclGroupEnd, posted together at the end
struct PendingP2P { int send; void* buf; size_t bytes; int peer; NcclComm* comm; };
static std::vector<PendingP2P> nccl_group;
static int nccl_group_depth = 0;

static inline size_t nccl_type_bytes(ncclDataType_t t) { return t == ncclFloat ? 4 : t == ncclBfloat16 ? 2 : 1; }

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

}  // namespace cuda_emu

typedef cuda_emu::NcclComm* ncclComm_t;

static inline const char* ncclGetErrorString(ncclResult_t r) {
    switch (r) {
        case ncclSuccess: return "no error";
        case ncclInvalidArgument: return "invalid argument (cuda_emu)";
        case ncclInvalidUsage: return "invalid usage (cuda_emu: NCCL needs mpirun, or a world of 1)";
        default: return "internal error (cuda_emu)";
    }
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
        if (world_rank != rank || world_size != nranks) return ncclInvalidUsage;
        if (MPI_Comm_dup(MPI_COMM_WORLD, &(*comm)->mpi) != MPI_SUCCESS) return ncclSystemError;
        return ncclSuccess;
    }
#endif
    return nranks == 1 ? ncclSuccess : ncclInvalidUsage;
}

static inline ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* out, ncclConfig_t* config) {
    (void)config;
    *out = NULL;
#ifdef USE_MPI
    if (comm->mpi != MPI_COMM_NULL) {
        MPI_Comm split;
        if (MPI_Comm_split(comm->mpi, color == NCCL_SPLIT_NOCOLOR ? MPI_UNDEFINED : color, key, &split) != MPI_SUCCESS) return ncclSystemError;
        if (split == MPI_COMM_NULL) return ncclSuccess;
        *out = new cuda_emu::NcclComm();
        (*out)->mpi = split;
        MPI_Comm_rank(split, &(*out)->rank);
        MPI_Comm_size(split, &(*out)->size);
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
static inline ncclResult_t cuda_emu_reduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                                           ncclRedOp_t op, ncclComm_t comm, int scatter) {
    size_t in_count = scatter ? count * comm->size : count;
    if (in_count > (size_t)1 << 30) return ncclInvalidArgument;
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
    (void)stream;
    return cuda_emu_reduce(send, recv, count, type, op, comm, 0);
}
static inline ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                                             ncclComm_t comm, cudaStream_t stream) {
    (void)stream;
    return cuda_emu_reduce(send, recv, count, type, op, comm, 1);
}

static inline ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t type, ncclComm_t comm,
                                         cudaStream_t stream) {
    (void)stream;
    size_t bytes = count * cuda_emu::nccl_type_bytes(type);
    if (bytes * comm->size > (size_t)1 << 30) return ncclInvalidArgument;
#ifdef USE_MPI
    if (CUDA_EMU_MPI(comm)) {
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
    (void)stream;
    size_t bytes = count * cuda_emu::nccl_type_bytes(type);
    if (bytes > (size_t)1 << 30 || root < 0 || root >= comm->size) return ncclInvalidArgument;
    if (comm->rank == root && send != recv) memmove(recv, send, bytes);
#ifdef USE_MPI
    if (CUDA_EMU_MPI(comm) && MPI_Bcast(recv, (int)bytes, MPI_BYTE, root, comm->mpi) != MPI_SUCCESS) return ncclSystemError;
#endif
    return ncclSuccess;
}

static inline ncclResult_t ncclGroupStart(void) {
    cuda_emu::nccl_group_depth++;
    return ncclSuccess;
}

static inline ncclResult_t cuda_emu_p2p(int send, void* buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm) {
    size_t bytes = count * cuda_emu::nccl_type_bytes(type);
    if (bytes > (size_t)1 << 30 || peer < 0 || peer >= comm->size) return ncclInvalidArgument;
    if (cuda_emu::nccl_group_depth > 0) {
        cuda_emu::nccl_group.push_back({send, buf, bytes, peer, comm});
        return ncclSuccess;
    }
#ifdef USE_MPI
    if (CUDA_EMU_MPI(comm)) {
        int err = send ? MPI_Send(buf, (int)bytes, MPI_BYTE, peer, 0, comm->mpi)
                       : MPI_Recv(buf, (int)bytes, MPI_BYTE, peer, 0, comm->mpi, MPI_STATUS_IGNORE);
        return err == MPI_SUCCESS ? ncclSuccess : ncclSystemError;
    }
#endif
    return ncclInvalidUsage;
}
static inline ncclResult_t ncclSend(const void* buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm, cudaStream_t stream) {
    (void)stream;
    return cuda_emu_p2p(1, (void*)buf, count, type, peer, comm);
}
static inline ncclResult_t ncclRecv(void* buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm, cudaStream_t stream) {
    (void)stream;
    return cuda_emu_p2p(0, buf, count, type, peer, comm);
}

static inline ncclResult_t ncclGroupEnd(void) {
    using cuda_emu::nccl_group;
    if (cuda_emu::nccl_group_depth == 0) return ncclInvalidUsage;
    if (--cuda_emu::nccl_group_depth > 0) return ncclSuccess;
    ncclResult_t result = ncclSuccess;
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
    std::vector<MPI_Request> requests;
    for (cuda_emu::PendingP2P& p : nccl_group) {
        if (!CUDA_EMU_MPI(p.comm)) continue;
        requests.push_back(MPI_REQUEST_NULL);
        int err = p.send ? MPI_Isend(p.buf, (int)p.bytes, MPI_BYTE, p.peer, 0, p.comm->mpi, &requests.back())
                         : MPI_Irecv(p.buf, (int)p.bytes, MPI_BYTE, p.peer, 0, p.comm->mpi, &requests.back());
        if (err != MPI_SUCCESS) result = ncclSystemError;
    }
    if (!requests.empty() && MPI_Waitall((int)requests.size(), requests.data(), MPI_STATUSES_IGNORE) != MPI_SUCCESS) result = ncclSystemError;
#endif
    nccl_group.clear();
    return result;
}


#endif
