// Context parallelism's attention (train_gpt2_cp.cu's chapter explains it; the 3D trainer runs
// the same code inside each pipeline stage, on its tp rank's heads): the queries of this rank's
// tokens attend to the keys and values of the whole sequence, which the cp ranks hold in blocks,
// either passed around a ring (Liu et al. 2023, "Ring Attention", arXiv:2310.01889) or all-gathered
// (Llama 3, arXiv:2407.21783). The split of the sequence is llmc/cp_layout.h's; the block kernels
// are llmc/cpu/ring_attention.h and llmc/cuda/ring_attention.cuh. Everything else in a layer works
// on each token alone and needs nothing of this file but the rank's tokens and their positions.
#ifndef LLMC_CONTEXT_PARALLEL_H
#define LLMC_CONTEXT_PARALLEL_H

#include <string.h>
#include "comm.h"
#include "cp_layout.h"
#include "model.h"
#include "ops.h"

// This rank's place in the sequence and the buffers its attention needs (cp_scratch_bytes). In
// the shapes, Tl = T / cp tokens of each sequence on this rank, A the attention's width (C, or
// C / tp: the rank's heads under tensor parallelism), NH its heads.
typedef struct {
    CommGroup* cp;   // the ranks a sequence is split over
    CpSplit split;   // -cp_layout
    int allgather;   // -cp_comm allgather (else ring)
    floatX* kv[2];   // ring: two (B, Tl, 2A) blocks whose roles alternate: at step s the block
                     // computed on is kv[s % 2], the next one arrives in the other;
                     // allgather: kv[0] this rank's block
    floatX* kv_all;  // allgather: every rank's block, (cp, B, Tl, 2A), in rank order (with zigzag
                     // not the sequence's order: the chunks say where each token is)
    float* dkv[2];   // their gradients, fp32, the same shapes and roles
    float* dkv_all;
    float* o;        // (B, Tl, A) the attention output merged so far, fp32
    float* dq;       // (B, Tl, A) the queries' gradient, fp32
    float* D;        // (B, NH, Tl) the softmax backward's row sums (in the forward, the CUDA
                     // kernels' merged lse on its way)
    floatX* wpe;     // (Tl, C) wpe's rows at this rank's positions ...
    floatX* dwpe;    // ... and their gradient
    int* inputs;     // (B, Tl) host: this rank's tokens of a micro-batch (cp_take_tokens)
    int* targets;
    double work;     // the (query, key) score products of this rank's attention so far (every
                     // layer's, micro-batch's and head's)
    DeviceSpans attention_time;  // the time computing attention blocks, forward and backward
} ContextParallel;

// micro-batches of B x T on the group's ranks, the model's width C, the attention's A and NH
static inline void cp_alloc(ContextParallel* cp, CommGroup* group, CpSplit split, int allgather, int B, int T, int C,
                            int A, int NH) {
    memset(cp, 0, sizeof(*cp));
    cp->cp = group;
    cp->split = split;
    cp->allgather = allgather;
    int Tl = T / group->size;
    size_t BTl = (size_t)B * Tl, X = sizeof(floatX), kv = BTl * 2 * A, all = (size_t)B * T * 2 * A;
    allocation_kind(ALLOC_COMM);
    char* p = (char*)device_malloc(cp_scratch_bytes(B, T, group->size, C, A, NH, (int)X, allgather));
    cp->kv[0] = (floatX*)p, p += kv * X;
    cp->kv[1] = cp->kv_all = (floatX*)p, p += (allgather ? all : kv) * X;
    cp->dkv[0] = (float*)p, p += kv * sizeof(float);
    cp->dkv[1] = cp->dkv_all = (float*)p, p += (allgather ? all : kv) * sizeof(float);
    cp->o = (float*)p, p += BTl * A * sizeof(float);
    cp->dq = (float*)p, p += BTl * A * sizeof(float);
    cp->D = (float*)p, p += BTl * NH * sizeof(float);
    cp->wpe = (floatX*)p, p += (size_t)Tl * C * X;
    cp->dwpe = (floatX*)p;
    cp->inputs = (int*)malloc_check(BTl * sizeof(int));
    cp->targets = (int*)malloc_check(BTl * sizeof(int));
}

static inline void cp_free(ContextParallel* cp) {
    device_free(cp->kv[0]);  // (the first of the one allocation)
    free(cp->inputs);
    free(cp->targets);
}

// this rank's chunks of a sequence of Tl tokens per rank
static inline CpChunks cp_mine(const ContextParallel* cp, int Tl) {
    return cp_chunks_of(cp->split, Tl * cp->cp->size, cp->cp->size, cp->cp->rank);
}

// a micro-batch's tokens: this rank's of each of the B sequences (B, T) -> (B, Tl), in its order
static inline void cp_take_tokens(int* mine, const int* all, CpChunks c, int B, int T) {
    int Tl = c.n * c.len;
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < Tl; t++) mine[b * Tl + t] = all[b * T + cp_position(c, t)];
    }
}

// The position embeddings of this rank's Tl tokens: wpe's rows of each of its chunks, copied into
// cp->wpe (Tl, C), which the embedding reads in place of wpe ...
static inline const floatX* cp_positions(ContextParallel* cp, const floatX* wpe, int Tl, int C) {
    CpChunks mine = cp_mine(cp, Tl);
    for (int i = 0; i < mine.n; i++) {
        copy_device_to_device(cp->wpe + (size_t)i * mine.len * C, wpe + (size_t)mine.index[i] * mine.len * C,
                              (size_t)mine.len * C * sizeof(floatX));
    }
    return cp->wpe;
}

// ... and the way back: the embedding's backward writes the gradient of those rows into
// cp->dwpe (zeroed here), which cp_add_position_grads then adds into wpe's gradient at them
static inline floatX* cp_position_grads(ContextParallel* cp, int Tl, int C) {
    device_memset_zero(cp->dwpe, (size_t)Tl * C * sizeof(floatX));
    return cp->dwpe;
}
static inline void cp_add_position_grads(ContextParallel* cp, floatX* dwpe, int Tl, int C) {
    CpChunks mine = cp_mine(cp, Tl);
    for (int i = 0; i < mine.n; i++) {
        floatX* rows = dwpe + (size_t)mine.index[i] * mine.len * C;
        residual_forward(rows, rows, cp->dwpe + (size_t)i * mine.len * C, mine.len, C);
    }
}

// where position `position` of a T-token sample is: the cp rank holding it (in owner) and its row
// there (-1 on the other ranks)
static inline int cp_row_of_position(const ContextParallel* cp, int T, int position, int* owner) {
    int n = cp->cp->size;
    for (int r = 0; r < n; r++) {
        CpChunks c = cp_chunks_of(cp->split, T, n, r);
        for (int i = 0; i < c.n; i++) {
            if (position / c.len == c.index[i]) {
                *owner = r;
                return r == cp->cp->rank ? i * c.len + position % c.len : -1;
            }
        }
    }
    fail("sample position %d of %d on no rank", position, T);
    return -1;
}

// ----------------------------------------------------------------------------------------------
// Attention over the whole sequence from this rank's queries

// atty (B, Tl, A) and lse (B, NH, Tl): attention of this rank's queries (q of qkv (B, Tl, 3A)) to
// every earlier key of the sequence, block by block
static inline void cp_attention_forward(ContextParallel* cp, floatX* atty, float* lse, const floatX* qkv, int B, int Tl,
                                        int A, int NH) {
    CommGroup* g = cp->cp;
    int r = g->rank, n = g->size, T = Tl * n;
    size_t block = (size_t)B * Tl * 2 * A;
    CpChunks mine = cp_mine(cp, Tl);
    kv_pack(cp->kv[0], qkv, B, Tl, A);  // the K and V of this rank's tokens: what travels
    if (cp->allgather && n > 1) {  // (one rank: nothing to gather, the ring's single step)
        // all-gather of the K,V blocks, (B, Tl, 2A) from each rank into (cp, B, Tl, 2A): the
        // whole sequence's keys and values on every rank at once (memory: B T 2A X)
        comm_all_gather(g, cp->kv[0], cp->kv_all, block, COMM_FLOATX);
        for (int s = 0; s < n; s++) {  // own block first: its queries see at least themselves
            int owner = (r + n - s) % n;
            CpChunks theirs = cp_chunks_of(cp->split, T, n, owner);
            device_span_begin(&cp->attention_time);
            attention_block_forward(cp->o, lse, cp->D, qkv, cp->kv_all + owner * block, mine, theirs, B, A, NH, s == 0);
            device_span_end(&cp->attention_time);
            cp->work += B * NH * cp_attention_work(mine, theirs);
        }
    } else {
        // step 0 is this rank's own block: under the causal mask every query sees at least
        // itself there, so the merge (`first`, s == 0) starts every row from a finite max and lse
        for (int s = 0; s < n; s++) {
            floatX* here = cp->kv[s % 2];  // the block of rank r - s
            int owner = (r + n - s) % n;
            CommRequest next;
            memset(&next, 0, sizeof(next));  // (none posted at the last step: comm_wait returns)
            if (s < n - 1) {
                // the ring: send this block (B, Tl, 2A) on to rank r + 1 and receive the next,
                // rank r - s - 1's, from rank r - 1 into the other buffer (free: last step's
                // compute on it was issued before this post, and a post waits for what was
                // issued before it). Posted, not waited for: the next block travels while this
                // one is computed (both only read `here`)
                CommMessage msgs[2] = {comm_message(here, block, (r + 1) % n, 1),
                                       comm_message(cp->kv[(s + 1) % 2], block, (r + n - 1) % n, 0)};
                comm_exchange_start(g, msgs, 2, COMM_FLOATX, &next);
            }
            CpChunks theirs = cp_chunks_of(cp->split, T, n, owner);
            device_span_begin(&cp->attention_time);  // (the blocks' compute, without the exchanges)
            attention_block_forward(cp->o, lse, cp->D, qkv, here, mine, theirs, B, A, NH, s == 0);
            device_span_end(&cp->attention_time);
            cp->work += B * NH * cp_attention_work(mine, theirs);
            comm_wait(&next);  // the next block has arrived; `here` may be overwritten
        }
    }
    attention_block_output(atty, cp->o, (size_t)B * Tl * A);
}

// dqkv (B, Tl, 3A): the gradient at qkv from datty (B, Tl, A), with the forward's atty and lse
static inline void cp_attention_backward(ContextParallel* cp, floatX* dqkv, const floatX* datty, const floatX* atty,
                                         const float* lse, const floatX* qkv, int B, int Tl, int A, int NH) {
    CommGroup* g = cp->cp;
    int r = g->rank, n = g->size, T = Tl * n;
    size_t block = (size_t)B * Tl * 2 * A;
    CpChunks mine = cp_mine(cp, Tl);
    attention_block_backward_prepare(cp->D, datty, atty, B, Tl, A, NH);
    device_memset_zero(cp->dq, (size_t)B * Tl * A * sizeof(float));
    kv_pack(cp->kv[0], qkv, B, Tl, A);
    float* own_dkv = cp->dkv[0];  // where this rank's block's dK, dV end up, summed over every
                                  // rank's queries (one rank: where its block stays)
    if (cp->allgather && n > 1) {
        // the keys and values again (all-gather of (B, Tl, 2A) per rank), and their gradient for
        // the whole sequence, summed over the ranks and scattered to the owners: reduce-scatter of
        // (cp, B, Tl, 2A) fp32, each rank left with its block's
        comm_all_gather(g, cp->kv[0], cp->kv_all, block, COMM_FLOATX);
        device_memset_zero(cp->dkv_all, (size_t)n * block * sizeof(float));
        for (int owner = 0; owner < n; owner++) {
            device_span_begin(&cp->attention_time);
            attention_block_backward(cp->dq, cp->dkv_all + owner * block, datty, lse, cp->D, qkv, cp->kv_all + owner * block,
                                     mine, cp_chunks_of(cp->split, T, n, owner), B, A, NH);
            device_span_end(&cp->attention_time);
        }
        comm_reduce_scatter(g, cp->dkv_all, own_dkv, block, COMM_FLOAT, COMM_SUM);
    } else {
        device_memset_zero(cp->dkv[0], block * sizeof(float));
        for (int s = 0; s < n; s++) {
            int here = s % 2, owner = (r + n - s) % n;
            CommRequest next;
            memset(&next, 0, sizeof(next));  // (none posted at the last step: comm_wait returns)
            if (s < n - 1) {
                // the ring again: the block (B, Tl, 2A) on to rank r + 1, the next from r - 1,
                // posted to travel while this one is computed (not after the last step: every
                // rank has seen the block then)
                CommMessage kv[2] = {comm_message(cp->kv[here], block, (r + 1) % n, 1),
                                     comm_message(cp->kv[1 - here], block, (r + n - 1) % n, 0)};
                comm_exchange_start(g, kv, 2, COMM_FLOATX, &next);
            }
            device_span_begin(&cp->attention_time);
            attention_block_backward(cp->dq, cp->dkv[here], datty, lse, cp->D, qkv, cp->kv[here], mine,
                                     cp_chunks_of(cp->split, T, n, owner), B, A, NH);
            device_span_end(&cp->attention_time);
            comm_wait(&next);
            if (n == 1) break;
            // the block's gradient so far, (B, Tl, 2A) fp32, follows it to rank r + 1 once this
            // rank has added its queries' part (so this exchange cannot overlap: it waits for
            // the compute); the gradient of the next block, rank r - s - 1's, arrives from rank
            // r - 1. Every step: after cp passes each gradient is back with its owner
            CommMessage dkv[2] = {comm_message(cp->dkv[here], block, (r + 1) % n, 1),
                                  comm_message(cp->dkv[1 - here], block, (r + n - 1) % n, 0)};
            comm_exchange(g, dkv, 2, COMM_FLOAT);
            own_dkv = cp->dkv[1 - here];  // after the last pass (s = cp - 1): this rank's own, home
        }
    }
    attention_block_grads(dqkv, cp->dq, own_dkv, B, Tl, A);
}

// ----------------------------------------------------------------------------------------------
// The attention half of a layer (block.h's) with attention over the whole sequence: the same
// matmuls on the rank's B x Tl tokens, the ring or the all-gather between them. att_state keeps
// lse, (B, NH, Tl) fp32, as flash attention does (the trainers set LayerDims' target.flash).

static inline void cp_attention_half_forward(ContextParallel* cp, LayerActs a, LayerWeights w, int B, int Tl,
                                             LayerDims d) {
    matmul_forward(a.qkv, a.ln1, w.qkvw, w.qkvb, B * Tl, d.C, d.qkv);
    cp_attention_forward(cp, a.atty, (float*)a.att_state, a.qkv, B, Tl, d.att, d.NH);
    matmul_forward(a.attproj, a.atty, w.attprojw, w.attprojb, B * Tl, d.att, d.C);
}

// block.h's attention_half_backward_input: the gradient at ln1 into dln1 (may be datty), the
// gradient at qkv left in dqkv for the weight pass
static inline void cp_attention_half_backward_input(ContextParallel* cp, floatX* dln1, floatX* datty, floatX* dqkv,
                                                    const floatX* dout, LayerActs a, LayerWeights w, int B, int Tl,
                                                    LayerDims d) {
    matmul_backward_input(datty, dout, w.attprojw, B * Tl, d.att, d.C);
    cp_attention_backward(cp, dqkv, datty, a.atty, (const float*)a.att_state, a.qkv, B, Tl, d.att, d.NH);
    matmul_backward_input(dln1, dqkv, w.qkvw, B * Tl, d.C, d.qkv);
}

// ----------------------------------------------------------------------------------------------
// The bytes of one step's attention exchanges on a rank, from the layout alone, for `layers`
// layers and `micro` micro-batches: a block is K,V of B Tl 2A elements. Ring: forward (cp - 1)
// blocks sent and as many received (again with -r 2's rerun, `passes` 3), backward (cp - 1)
// blocks, plus cp blocks of dK,dV in fp32. Allgather: per pass one all-gather of cp blocks,
// backward one reduce-scatter of cp fp32 blocks.
typedef struct {
    double send, recv, all_gather, reduce_scatter;
} CpBytes;

static inline CpBytes cp_attention_bytes(int B, int Tl, int A, int cp, double layers, double micro, int allgather,
                                         int rerun) {
    double X = sizeof(floatX), kv = (double)B * Tl * 2 * A, passes = 2 + (rerun ? 1 : 0);
    CpBytes b = {0, 0, 0, 0};
    if (cp == 1) return b;
    if (allgather) {
        b.all_gather = micro * layers * passes * cp * kv * X;
        b.reduce_scatter = micro * layers * cp * kv * 4;
    } else {
        b.send = b.recv = micro * layers * (passes * (cp - 1) * kv * X + cp * kv * 4);
    }
    return b;
}

#endif
