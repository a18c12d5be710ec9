// The link between DiLoCo's workers (train_gpt2_diloco.cu): how a fragment's pseudo-gradient
// crosses it and comes back as the workers' mean. In fp32 that is one all-reduce (AVG); below
// fp32 (-outer_dtype bf16, int8, e3m0) the all-reduce written out as exchanges of 16-bit words,
// whose messages this header lays out, codes and sends. With -tau the exchange travels under
// the inner steps, and the struct below (OuterLink) is its state, its comment the timeline.
// The kernels (the pseudo-gradient, its codes, the owner's mean, the Nesterov step) are the
// backend's: llmc/cpu/outer.h, llmc/cuda/outer.cuh; the codes themselves llmc/precision.h.
#ifndef LLMC_OUTER_LINK_H
#define LLMC_OUTER_LINK_H

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "utils.h"
#include "comm.h"
#include "gpt2.h"
#include "model.h"
#include "ops.h"

// A run of the flat parameter buffer: `count` parameters from `offset`, part of tensor `tensor`
// of layer `layer` (-1: not a per-layer tensor) where it is one tensor of one layer
typedef struct {
    size_t offset, count;
    int tensor, layer;
} Span;

// What crosses the link at a fragment's outer step below fp32: the fragment's P_f packed values
// in W shards, worker w owning shard w; shard s's message is what any worker sends its owner and
// the owner sends back (its mean). In bf16 a message is the shard's values, a word each. In int8
// and e3m0 the shard is cut further into pieces, each a tensor of one layer as the model file
// stores it (wte, ln1w of layer 3, ...) or the part of one inside the shard, with a scale each
// (llmc/precision.h's codes): the message holds its pieces' scales (an fp32 each, two words),
// then each piece's codes from a word of its own, 16 / bits to a word, padded to an even number
// of words so that the next message's scales stay 4-byte aligned. A scale per tensor and layer,
// not one per shard: LayerNorm gains and matrices move by different amounts, and e3m0's 64x
// range could not hold both.
typedef struct {
    size_t flat, count;         // the piece's parameters in the flat buffer
    int shard;                  // the exchange's shard it lies in
    size_t scale_at, codes_at;  // its scale's and first code's word within its shard's message
    int tensor, layer;          // what it is part of (the message a non-finite value stops with)
} Piece;
typedef struct {
    Piece* pieces;          // in packed order (so by shard); none in bf16
    int num_pieces;
    size_t* message_at;     // (W) shard s's message: where it starts in the link buffer, in words
    size_t* message_words;  // (W) and how long it is
    size_t words;           // every shard's message one after another: what a worker sends out
} LinkLayout;

// The link's state. In fp32 the pseudo-gradient's buffer (delta, P fp32) is what the all-reduce
// averages in place; below fp32 its bytes are the link buffer, 2P 16-bit words: the messages
// this worker sends (every shard's, LinkLayout), then the W - 1 other workers' messages of its
// own shard, then the scales of their mean.
//
// -tau t: the timeline of fragment f's exchange, due after step s (outer_steps, in the trainer;
// a step's outer steps run at its end, after its AdamW step; a., b., c.: the exchange's three
// parts, described at link_exchanges below):
//   end of step s      the pseudo-gradient coded into the link buffer, and the first half
//                      posted: fp32 the whole all-reduce; below, a.'s rounds (the reduce-scatter)
//                      -> phase 1; fragment = f, apply_after = s + t
//   end of step s + 1  below fp32: wait for a., the owner's mean of its shard (b.), post the
//                      second half, c.'s rounds (the all-gather) -> phase 2
//   end of step s + t  wait for what is in flight (fp32 the all-reduce, below c.) -> phase 0,
//                      and apply: the outer Nesterov step, the workers' merge (with t = 1 the
//                      two lines before happen at the same step's end, in this order)
// Every rank takes the same steps at the same ends, so every exchange pairs up. One exchange is
// in flight at a time (t < H/F: it is applied before the next fragment's is posted). The run's
// last step applies what is in flight whatever its apply_after; a checkpoint waits for the
// average in flight (phase 0) and records it with the fragment and apply_after (pending), so
// that a resume applies it at the same step.
typedef struct {
    int bits;               // a value's bits on the link (-outer_dtype): 32 (fp32), 16 (bf16), 8 (int8), 4 (e3m0)
    LinkLayout* layouts;    // (F) each fragment's messages, below fp32; NULL in fp32
    int fragments;
    CommGroup* across;      // the W ranks at this place in every worker, one a worker
    float* buffer;          // (P) fp32 the pseudo-gradient's buffer; below fp32 the link buffer's bytes
    int tau;                // -tau
    int fragment;           // the fragment whose average is in flight, -1: none
    int apply_after;        // ... applied at the end of this step
    int phase;              // below fp32: 1 a.'s rounds in flight, 2 c.'s, 0 neither
    CommRequest all_reduce; // fp32: the all-reduce in flight
    CommRequest* rounds;    // (W - 1) below fp32: the rounds in flight, a send and a receive each
    float* pending;         // (2) fp32 on the device: fragment + 1 and apply_after, for checkpoints
} OuterLink;

// worker w's shard of a fragment's P_f values, for the exchanges below fp32: [w P_f / W, (w + 1) P_f / W)
static inline size_t shard_start(size_t P_f, int w, int W) { return (size_t)w * P_f / (size_t)W; }
static inline size_t shard_size(size_t P_f, int w, int W) { return shard_start(P_f, w + 1, W) - shard_start(P_f, w, W); }

// -outer_dtype's bits a value (0: not a dtype the link carries), and back
static inline int link_bits_of(const char* outer_dtype) {
    const char* names[4] = {"fp32", "bf16", "int8", "e3m0"};
    const int bits[4] = {32, 16, LINK_INT8_BITS, LINK_E3M0_BITS};
    for (int i = 0; i < 4; i++) {
        if (strcmp(outer_dtype, names[i]) == 0) return bits[i];
    }
    return 0;
}
static inline const char* link_name(int bits) { return bits == 32 ? "fp32" : bits == 16 ? "bf16" : bits == 8 ? "int8" : "e3m0"; }

// A fragment's messages for W workers, from its units (its tensors of a layer, in packed order,
// P_f values in all): in bf16 each shard's values; in int8 and e3m0 the pieces (the units cut at
// the shards' boundaries) and each shard's scales and codes. Returns the words of the link buffer
// the exchange needs on worker `me`: the messages sent, the W - 1 received (its own shard's), the
// mean's scales.
static inline size_t link_layout(LinkLayout* k, const Span* units, int num_units, size_t P_f, int bits, int W, int me) {
    k->message_at = (size_t*)malloc_check((size_t)W * sizeof(size_t));
    k->message_words = (size_t*)malloc_check((size_t)W * sizeof(size_t));
    k->pieces = (Piece*)malloc_check(((size_t)num_units + W) * sizeof(Piece));
    k->num_pieces = 0;
    size_t packed = 0;  // (the first value of the unit in the fragment's packed order)
    for (int u = 0; u < num_units && bits < 16; u++) {
        for (size_t done = 0; done < units[u].count;) {  // the unit's parts in each shard it crosses
            int s = 0;
            while (shard_start(P_f, s + 1, W) <= packed + done) s++;
            size_t take = shard_start(P_f, s + 1, W) - (packed + done);
            if (take > units[u].count - done) take = units[u].count - done;
            k->pieces[k->num_pieces++] = (Piece){units[u].offset + done, take, s, 0, 0, units[u].tensor, units[u].layer};
            done += take;
        }
        packed += units[u].count;
    }
    size_t at = 0, mean_scales = 0;
    for (int s = 0, i = 0; s < W; s++) {
        size_t words = shard_size(P_f, s, W);  // (bf16: a word a value)
        if (bits < 16) {
            int first = i;
            while (i < k->num_pieces && k->pieces[i].shard == s) i++;
            words = 2 * (size_t)(i - first);  // the scales, then each piece's codes from a word of its own
            for (int j = first; j < i; j++) {
                k->pieces[j].scale_at = 2 * (size_t)(j - first);
                k->pieces[j].codes_at = words;
                words += (k->pieces[j].count + 16 / bits - 1) / (16 / bits);
            }
            words += words % 2;
            if (s == me) mean_scales = 2 * (size_t)(i - first);
        }
        k->message_at[s] = at;
        k->message_words[s] = words;
        at += words;
    }
    k->words = at;
    return k->words + (size_t)(W - 1) * k->message_words[me] + mean_scales;
}

// The link of a rank's DiLoCo, nothing in flight: `across` the group it averages over, buffer the
// pseudo-gradient's (P) fp32 buffer it lives in. Below fp32 each fragment's layouts[f] is then
// filled by link_layout (the trainer knows the fragments' tensors); link_free frees what both allocate
static inline void link_init(OuterLink* link, int bits, int fragments, CommGroup* across, float* buffer, int tau) {
    memset(link, 0, sizeof(*link));
    link->bits = bits;
    link->fragments = fragments;
    link->across = across;
    link->buffer = buffer;
    link->tau = tau;
    link->fragment = -1;
    link->rounds = (CommRequest*)calloc_check((size_t)across->size, sizeof(CommRequest));  // (W - 1 used)
    link->pending = (float*)device_malloc(2 * sizeof(float));
    device_memset_zero(link->pending, 2 * sizeof(float));
    link->layouts = bits < 32 ? (LinkLayout*)malloc_check((size_t)fragments * sizeof(LinkLayout)) : NULL;
}

static inline void link_free(OuterLink* link) {
    for (int f = 0; link->layouts && f < link->fragments; f++) {
        free(link->layouts[f].pieces), free(link->layouts[f].message_at), free(link->layouts[f].message_words);
    }
    free(link->layouts);
    free(link->rounds);
    device_free(link->pending);
}

// A pseudo-gradient holding a value that is not finite has no scale to code it in, and one beyond
// FLT_MAX / W would overflow the owner's sum of W workers: stop, naming the tensor. Every rank
// posts the same fragment at the same step, so they check together (check_every_rank: one rank's
// bad value stops them all in order). The scales come to the host, each shard's in one copy
static inline void link_check_scales(const OuterLink* link, int f) {
    const uint16_t* buffer = (const uint16_t*)link->buffer;
    const LinkLayout* k = &link->layouts[f];
    int W = link->across->size;
    float* scales = (float*)malloc_check(((size_t)k->num_pieces + 1) * sizeof(float));
    for (int i = 0, s = 0; s < W; s++) {  // (a shard's message opens with its pieces' scales, in order)
        int first = i;
        while (i < k->num_pieces && k->pieces[i].shard == s) i++;
        copy_device_to_host(scales + first, buffer + k->message_at[s], (size_t)(i - first) * sizeof(float));
    }
    float largest = FLT_MAX / (float)W;
    int bad = -1;
    for (int i = 0; i < k->num_pieces && bad < 0; i++) bad = scales[i] <= largest ? -1 : i;  // (a NaN fails too)
    const Piece* piece = &k->pieces[bad < 0 ? 0 : bad];
    float scale = scales[bad < 0 ? 0 : bad];
    char layer[32] = "";
    if (piece->layer >= 0) snprintf(layer, sizeof(layer), " of layer %d", piece->layer);
    free(scales);
    check_every_rank(bad < 0, "-outer_dtype %s: the pseudo-gradient of fragment %d holds %s in %s%s (its largest |value| "
                     "is %g): a worker's weights have left the range the link can code and the workers' sum can hold "
                     "(FLT_MAX / W = %g)", link_name(link->bits), f, isfinite(scale) ? "a value too large" : "a non-finite value",
                     parameter_names[piece->tensor], layer, scale, largest);
}

// Fragment f's pseudo-gradient outer - theta (its spans, packed one after another) written as
// what crosses the link, into the pseudo-gradient's buffer: fp32 values (the all-reduce averages
// them in place); in bf16 each value rounded to a word; in int8 and e3m0 coded piece by piece
// into the messages, each piece's scale (the largest |delta|: a non-finite one stops the job),
// then its codes. master: the fp32 master weights of a bf16 build (else NULL), theta's true values
static inline void link_code_pseudo_gradient(const OuterLink* link, int f, const Span* spans, int num_spans,
                                             const float* outer, const floatX* params, const float* master) {
    if (link->bits == 32 || link->bits == 16) {
        size_t packed = 0;
        for (int s = 0; s < num_spans; s++) {
            size_t o = spans[s].offset;
            const float* m = master ? master + o : NULL;
            if (link->bits == 16) pseudo_gradient_bf16((bfloat16*)link->buffer + packed, outer + o, params + o, m, spans[s].count);
            else pseudo_gradient(link->buffer + packed, outer + o, params + o, m, spans[s].count);
            packed += spans[s].count;
        }
        return;
    }
    uint16_t* buffer = (uint16_t*)link->buffer;
    const LinkLayout* k = &link->layouts[f];
    for (int i = 0; i < k->num_pieces; i++) {
        const Piece* p = &k->pieces[i];
        float* scale = (float*)(buffer + k->message_at[p->shard] + p->scale_at);
        link_scale(scale, outer + p->flat, params + p->flat, master ? master + p->flat : NULL, p->count);
    }
    link_check_scales(link, f);
    for (int i = 0; i < k->num_pieces; i++) {
        const Piece* p = &k->pieces[i];
        uint16_t* message = buffer + k->message_at[p->shard];
        link_quantize(message + p->codes_at, (float*)(message + p->scale_at), outer + p->flat, params + p->flat,
                      master ? master + p->flat : NULL, p->count, link->bits);
    }
}

// The outer Nesterov step of fragment f on the workers' mean as it came back: span by span on its
// fp32 or bf16 values, or in int8 and e3m0 piece by piece with its scale
static inline void link_nesterov_step(const OuterLink* link, int f, const Span* spans, int num_spans, float* outer,
                                      float* momentum, float lr, float mu) {
    if (link->bits == 32 || link->bits == 16) {
        size_t packed = 0;
        for (int s = 0; s < num_spans; s++) {
            size_t o = spans[s].offset, count = spans[s].count;
            outer_nesterov_step(outer + o, momentum + o, link->bits == 32 ? link->buffer + packed : NULL,
                                link->bits == 16 ? (const bfloat16*)link->buffer + packed : NULL, count, lr, mu);
            packed += count;
        }
        return;
    }
    const uint16_t* buffer = (const uint16_t*)link->buffer;
    const LinkLayout* k = &link->layouts[f];
    for (int i = 0; i < k->num_pieces; i++) {
        const Piece* p = &k->pieces[i];
        outer_nesterov_step_link(outer + p->flat, momentum + p->flat, buffer + k->message_at[p->shard], p->scale_at,
                                 p->codes_at, p->count, link->bits, lr, mu);
    }
}

// Below fp32 (-outer_dtype bf16, int8, e3m0): the mean over the workers of this worker's
// pseudo-gradient of fragment f, coded for the link in the link buffer (in bf16 the P_f values;
// in int8 and e3m0 each shard's message of scales and codes). An all-reduce is a reduce-scatter
// and an all-gather; written out as W - 1 rounds of exchanges each, the values cross the link in
// 16-bit words while the sum is taken in fp32:
//  a. reduce-scatter: worker w owns shard w; in round k every worker sends its message of shard
//     (me + k) % W to that shard's owner and receives its own shard's from worker (me - k) % W;
//  b. the owner sums the W values of each element in fp32, in worker order, divides by W and codes
//     the mean for the way back (outer_mean_bf16; link_mean_scale and link_mean_quantize, whose
//     scales then replace the owner's own in its message);
//  c. all-gather: in round k every worker sends its mean's message to worker (me + k) % W and
//     receives worker (me - k) % W's in its place.
// Each rank sends 2 (W - 1)/W of the fragment's messages, as a ring all-reduce would: a half of
// the fp32 all-reduce's bytes in bf16, a quarter in int8, an eighth in e3m0 (and the scales, 4
// bytes a piece). Two roundings: each worker's pseudo-gradient, and the mean on its way back.
// Every rank posts the rounds in the same order, so each pair's messages match.

// a. (gather 0) or c. (gather 1): the W - 1 rounds, each a send and a receive; posted into
// link->rounds and left in flight, or waited for
static inline void link_exchanges(OuterLink* link, int f, int gather, int posted) {
    uint16_t* buffer = (uint16_t*)link->buffer;
    const LinkLayout* k = &link->layouts[f];
    CommGroup* g = link->across;
    int W = g->size, me = g->rank;
    size_t stride = k->message_words[me];
    uint16_t *mine = buffer + k->message_at[me], *others = buffer + k->words;
    for (int round = 1; round < W; round++) {
        int to = (me + round) % W, from = (me - round + W) % W;
        uint16_t* from_slot = gather ? buffer + k->message_at[from] : others + (size_t)(from < me ? from : from - 1) * stride;
        CommMessage msgs[2] = {comm_message(gather ? mine : buffer + k->message_at[to], k->message_words[gather ? me : to], to, 1),
                               comm_message(from_slot, k->message_words[gather ? from : me], from, 0)};
        // (16-bit words: bf16 values, or codes and scales)
        if (posted) comm_exchange_start(g, msgs, 2, COMM_BF16, &link->rounds[round - 1]);
        else comm_exchange(g, msgs, 2, COMM_BF16);
    }
}

// b.: the owner's mean of its shard, coded for the way back
static inline void link_mean_of_shard(OuterLink* link, int f) {
    uint16_t* buffer = (uint16_t*)link->buffer;
    const LinkLayout* k = &link->layouts[f];
    int W = link->across->size, me = link->across->rank, bits = link->bits;
    size_t stride = k->message_words[me];
    uint16_t *mine = buffer + k->message_at[me], *others = buffer + k->words;
    if (bits == 16) {
        outer_mean_bf16((bfloat16*)mine, (const bfloat16*)others, W, me, stride);
        return;
    }
    float* mean_scales = (float*)(others + (size_t)(W - 1) * stride);  // (this shard's pieces, in order)
    int first = 0, count = 0;
    while (first < k->num_pieces && k->pieces[first].shard < me) first++;
    for (int i = first; i < k->num_pieces && k->pieces[i].shard == me; i++, count++) {
        const Piece* p = &k->pieces[i];
        link_mean_scale(mean_scales + count, mine, others, stride, p->scale_at, p->codes_at, W, me, p->count, bits);
        link_mean_quantize(mine, others, stride, p->scale_at, p->codes_at, mean_scales + count, W, me, p->count, bits);
    }
    copy_device_to_device(mine, mean_scales, (size_t)count * sizeof(float));  // (the message opens with them)
}

// Step 3 of the outer step: fragment f's P_f values in the buffer (fp32: the pseudo-gradient;
// below: its messages) become the workers' mean. in_flight (-tau): only the first half posted
// (the timeline above); otherwise the whole average, waited for
static inline void link_post(OuterLink* link, int f, size_t P_f, int in_flight) {
    if (link->bits == 32) {
        if (in_flight) comm_all_reduce_start(link->across, link->buffer, P_f, COMM_FLOAT, COMM_AVG, &link->all_reduce);
        else comm_all_reduce(link->across, link->buffer, P_f, COMM_FLOAT, COMM_AVG);
        return;
    }
    link_exchanges(link, f, /*gather*/ 0, in_flight);
    if (in_flight) {
        link->phase = 1;
        return;
    }
    link_mean_of_shard(link, f);
    link_exchanges(link, f, /*gather*/ 1, 0);
}

// below fp32, the average in flight one half further: a.'s rounds arrived, b., c. posted
// (phase 1 -> 2); c.'s rounds arrived (2 -> 0)
static inline void link_advance(OuterLink* link) {
    for (int round = 1; round < link->across->size; round++) comm_wait(&link->rounds[round - 1]);
    if (link->phase == 2) {
        link->phase = 0;
        return;
    }
    link_mean_of_shard(link, link->fragment);
    link_exchanges(link, link->fragment, /*gather*/ 1, /*posted*/ 1);
    link->phase = 2;
}

// the average in flight, landed: the buffer holds the workers' mean (nothing in flight: returns)
static inline void link_wait(OuterLink* link) {
    comm_wait(&link->all_reduce);
    while (link->phase != 0) link_advance(link);
}

// The bytes of fragment f's exchange (P_f values) on this rank, as the step line counts them
// (fp32: the all-reduce's payload; below: every word sent and received in the exchanges), and
// those that leave the rank on the link (fp32: a ring all-reduce's 2 (W-1)/W P_f 4; below: the
// messages of the other shards, then its own W - 1 times)
static inline void link_bytes(const OuterLink* link, int f, size_t P_f, double* counted, double* sent) {
    int W = link->across->size;
    if (link->bits == 32) {
        *counted = 4.0 * P_f;
        *sent = 2.0 * (W - 1) / W * 4.0 * P_f;
        return;
    }
    const LinkLayout* k = &link->layouts[f];
    size_t own = k->message_words[link->across->rank];
    *sent = 2.0 * ((k->words - own) + (double)(W - 1) * own);  // a.: the other shards; c.: its mean W - 1 times
    *counted = 2 * *sent;                                     // (each word sent is received by another)
}

#endif
