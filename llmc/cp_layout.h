// Context parallelism's split of a sequence: which positions of each sequence of T tokens a rank
// of the cp group holds, and what causal attention between two ranks' tokens then costs.
// The sequence is cut into chunks of equal length; a rank holds one or two of them:
//   contiguous  cp chunks of T/cp: rank r holds chunk r
//   zigzag      2 cp chunks of T/(2 cp): rank r holds chunks r and 2cp-1-r (Megatron-LM's and
//               torchtitan's load balancing for causal attention: an early chunk, little work,
//               paired with a late one, much work)
// A rank's tokens are its chunks one after another: local position t is in its chunk t / len.
#ifndef LLMC_CP_LAYOUT_H
#define LLMC_CP_LAYOUT_H

#include <string.h>
#include "utils.h"

// the mask functions below run in the CUDA kernels too
#ifdef __CUDACC__
#define CP_HOST_DEVICE __host__ __device__
#else
#define CP_HOST_DEVICE
#endif

// the largest head size the block-attention kernels hold in registers (GPT-2's is 64)
#define RING_MAX_HEAD 128

typedef enum { CP_CONTIGUOUS = 0, CP_ZIGZAG = 1 } CpSplit;
static inline const char* cp_split_name(CpSplit s) { return s == CP_ZIGZAG ? "zigzag" : "contiguous"; }

typedef struct {
    int n;         // the rank's chunks: 1 or 2
    int len;       // positions per chunk
    int index[2];  // which chunks: chunk i holds positions [index[i] len, (index[i] + 1) len)
} CpChunks;

static inline CpChunks cp_chunks_of(CpSplit split, int T, int cp, int rank) {
    CpChunks c;
    c.n = split == CP_ZIGZAG ? 2 : 1;
    c.len = T / (c.n * cp);
    c.index[0] = rank;
    c.index[1] = 2 * cp - 1 - rank;  // (zigzag only)
    return c;
}

// -cp_layout and -cp_comm, read alike by every program that takes them (every rank at the same
// point: an error is printed once, check_every_rank)
static inline CpSplit cp_split_of(const char* name) {
    check_every_rank(strcmp(name, "zigzag") == 0 || strcmp(name, "contiguous") == 0, "-cp_layout %s: expected zigzag or contiguous", name);
    return strcmp(name, "zigzag") == 0 ? CP_ZIGZAG : CP_CONTIGUOUS;
}
static inline int cp_allgather_of(const char* name) {
    check_every_rank(strcmp(name, "ring") == 0 || strcmp(name, "allgather") == 0, "-cp_comm %s: expected ring or allgather", name);
    return strcmp(name, "allgather") == 0;
}

// the block-attention kernels hold a head's hs values in registers (RING_MAX_HEAD at most)
static inline void cp_check_head_size(int hs) {
    if (hs > RING_MAX_HEAD) fail("head size C/NH = %d: the block-attention kernels hold at most %d", hs, RING_MAX_HEAD);
}

// T must cut into whole chunks (2 cp for zigzag, cp for contiguous) and, with -sp splitting each
// rank's T/cp tokens over seq_shards tp ranks, T/cp into whole shards: T a multiple of the least
// common multiple of the chunks and cp seq_shards (what a sample is padded to, too)
static inline int cp_tokens_multiple(CpSplit split, int cp, int seq_shards) {
    int chunks = (split == CP_ZIGZAG ? 2 : 1) * cp, shards = cp * seq_shards, a = chunks, b = shards;
    while (b != 0) {  // (Euclid: a becomes the greatest common divisor)
        int r = a % b;
        a = b, b = r;
    }
    return chunks / a * shards;
}

// the chunks `split` cuts each sequence into over cp ranks (`ranks_name` says which), after
// checking that T divides by them: a clear error naming the rule otherwise
static inline int cp_check_split(CpSplit split, int cp, int T, const char* ranks_name) {
    int chunks = (split == CP_ZIGZAG ? 2 : 1) * cp;
    check_every_rank(T % chunks == 0, "-t %d: the %s split cuts each sequence into %d chunks (%s, over the %d %s), so T "
                     "must divide by %d", T, cp_split_name(split), chunks, split == CP_ZIGZAG ? "2 cp" : "cp", cp, ranks_name, chunks);
    return chunks;
}

// the global position of local token t (0 <= t < n len)
static inline int cp_position(CpChunks c, int t) { return c.index[t / c.len] * c.len + t % c.len; }

// How a chunk of queries sees a chunk of keys of the same length under the causal mask: every key
// before every query (whole), the same positions (diagonal: key <= query), or every key after
// every query (masked: no work, skipped)
typedef enum { TILE_WHOLE, TILE_DIAGONAL, TILE_MASKED } CpTile;
CP_HOST_DEVICE static inline CpTile cp_tile(int query_chunk, int key_chunk) {
    return key_chunk < query_chunk ? TILE_WHOLE : key_chunk == query_chunk ? TILE_DIAGONAL : TILE_MASKED;
}

// The mask as loop bounds (both ranks split alike: chunks of one length). How many keys of key
// chunk j, from its first, local query t sees: all (whole), up to its own offset (diagonal), none
// (masked: the tile is skipped, not a score computed)
CP_HOST_DEVICE static inline int cp_keys_seen(CpChunks q, int t, CpChunks k, int j) {
    CpTile tile = cp_tile(q.index[t / q.len], k.index[j]);
    return tile == TILE_WHOLE ? k.len : tile == TILE_DIAGONAL ? t % q.len + 1 : 0;
}
// ... and the other way: the first query of query chunk i that sees local key t2 (q.len: none)
CP_HOST_DEVICE static inline int cp_first_query_seeing(CpChunks q, int i, CpChunks k, int t2) {
    CpTile tile = cp_tile(q.index[i], k.index[t2 / k.len]);
    return tile == TILE_WHOLE ? 0 : tile == TILE_DIAGONAL ? t2 % k.len : q.len;
}

// the (query, key) score products one rank's queries do against another's keys, per sequence and
// head: len^2 per whole tile, len (len + 1) / 2 per diagonal one, none per masked one
static inline double cp_attention_work(CpChunks q, CpChunks k) {
    double work = 0.0, len = q.len;
    for (int i = 0; i < q.n; i++) {
        for (int j = 0; j < k.n; j++) {
            CpTile tile = cp_tile(q.index[i], k.index[j]);
            work += tile == TILE_WHOLE ? len * len : tile == TILE_DIAGONAL ? len * (len + 1) / 2 : 0.0;
        }
    }
    return work;
}

// The device buffers of context-parallel attention, in bytes, for micro-batches of B x T on cp
// ranks (Tl = T / cp tokens each), the model's width C, the attention's A (C / tp with tensor
// parallelism) and NH heads, floatX of X bytes; allgather: -cp_comm allgather. In order:
//   kv   ring: two (B, Tl, 2A) blocks of keys and values, the one computed on and the one
//        arriving; allgather: this rank's block and the whole sequence's (B, T, 2A)
//   dkv  the same shapes in fp32: the gradients of keys and values, summed over the ranks' queries
//   o, dq  (B, Tl, A) fp32 each: the output merged so far; the queries' gradient
//   D    (B, NH, Tl) fp32: the softmax backward's row sums
//   wpe  two (Tl, C): the position embeddings of this rank's positions, and their gradient
static inline uint64_t cp_scratch_bytes(int B, int T, int cp, int C, int A, int NH, int X, int allgather) {
    uint64_t BTl = (uint64_t)B * (T / cp), blocks = allgather ? BTl + (uint64_t)B * T : 2 * BTl;
    return blocks * 2 * A * (X + sizeof(float)) + 2 * BTl * A * sizeof(float) + BTl * NH * sizeof(float) +
           2 * (uint64_t)(T / cp) * C * X;
}

#endif
