// The pieces of Megatron-LM's tensor parallelism (Shoeybi et al. 2019, arXiv:1909.08053) that the
// tensor-parallel trainers share (train_gpt2_tp.cu, and inside each pipeline stage
// train_gpt2_3d.cu): the two collectives at the ends of a parallel half-block, with sequence
// parallelism (Korthikanti et al. 2022, arXiv:2205.05198) or without, and the vocabulary-parallel
// embedding lookup and cross-entropy. Where each is called, and why, is the trainers' chapter.
#ifndef LLMC_TENSOR_PARALLEL_H
#define LLMC_TENSOR_PARALLEL_H

#include "block.h"
#include "comm.h"
#include "context_parallel.h"
#include "model.h"

// ----------------------------------------------------------------------------------------------
// The two collectives of tensor parallelism. Each is the forward of one of Megatron's operators
// and the backward of the other, so the forward and backward passes call the same two.

// Sums partial (B, T, C), of which every rank holds a share, over the ranks. Without -sp an
// all-reduce in place: returns partial, now whole on every rank. With -sp a reduce-scatter:
// returns `reduced`, this rank's B*T/tp tokens of the sum. (tp NULL: one rank holds it all.)
static inline floatX* sum_over_ranks(CommGroup* tp, floatX* partial, floatX* reduced, size_t BT, int C, int sp) {
    if (tp == NULL) return partial;  // (no tensor parallelism: a pipeline stage of train_gpt2_pp)
    if (!sp) {
        comm_all_reduce(tp, partial, BT * C, COMM_FLOATX, COMM_SUM);
        return partial;
    }
    comm_reduce_scatter(tp, partial, reduced, BT / tp->size * C, COMM_FLOATX, COMM_SUM);
    return reduced;
}

// With -sp: every rank's B*T/tp tokens (shard) all-gathered into whole (B, T, C), in rank order.
// Without -sp every rank holds all tokens already (the identity): returns shard itself.
static inline floatX* gather_tokens(CommGroup* tp, floatX* shard, floatX* whole, size_t BT, int C, int sp) {
    if (!sp) return shard;
    comm_all_gather(tp, shard, whole, BT / tp->size * C, COMM_FLOATX);
    return whole;
}

// ----------------------------------------------------------------------------------------------
// -tp_overlap 1: the collectives of a half decomposed into ring steps under the GEMMs next to
// them (Wang et al. 2023, "Overlap Communication with Dependent Computation via Decomposition in
// Large Deep Learning Models"; Megatron-LM's tp-comm-overlap and PyTorch's async TP do the same).
// A GEMM's rows are tokens, and tokens are independent: the GEMM of a block of B*T/tp tokens
// needs only that block's input. So instead of waiting for a whole collective, a rank multiplies
// the block it has while the next one travels. The bytes are the collective's: tp - 1 blocks of
// B T/tp rows leave each rank, what a ring all-gather or reduce-scatter sends; they are counted
// as the sends and receives they are (ring_bytes, what leaves a rank, is unchanged).

// One GEMM of a half, on a block of rows: forward, out (rows, OC) = in (rows, IC) W^T + b; or the
// backward's input gradient, out (rows, IC) = in (rows, OC) W
typedef struct {
    const char* name;  // what it computes, for -tp_timeline
    int backward;
    const floatX* w;
    const floatX* b;  // forward only (NULL: none)
    int IC, OC;
} TpGemm;

static inline TpGemm tp_gemm(const char* name, const floatX* w, const floatX* b, int IC, int OC) {
    TpGemm g = {name, 0, w, b, IC, OC};
    return g;
}
static inline TpGemm tp_gemm_backward(const char* name, const floatX* w, int IC, int OC) {
    TpGemm g = {name, 1, w, NULL, IC, OC};
    return g;
}

// -tp_timeline (train_gpt2_tp, CPU backend): one layer's forward and backward on this rank as
// host-timed spans, each GEMM block and each exchange or collective from its post to its
// completion, which dev/plot_tp_timeline.py draws. (On the CPU the host's times are the work's.)
typedef struct {
    const char* what;
    int comm;            // 1: communication, 0: a GEMM
    int backward;        // 0: in the layer's forward, 1: in its backward
    double start, end;   // seconds since the layer's forward (backward) began
} TpSpan;
#define TP_TIMELINE_SPANS 512
typedef struct {
    int recording, backward;
    double origin;
    int n;
    TpSpan spans[TP_TIMELINE_SPANS];
} TpTimeline;
static TpTimeline tp_timeline;
static inline double tp_span_start(void) { return tp_timeline.recording ? wall_time_s() : 0.0; }
// the trainer records a layer: armed for this micro-batch, its forward (the spans start anew)
// and later its backward, each timed from its own start
static inline void tp_timeline_record(int armed, int forward) {
    if (armed && forward) tp_timeline.n = 0;
    if (armed) tp_timeline.origin = wall_time_s(), tp_timeline.backward = !forward;
    tp_timeline.recording = armed;
}
// the spans as JSON lines, {"what", "comm", "backward", "start_ms", "end_ms"}, into
// DIR/tp_timeline_RANK.jsonl
static inline void tp_timeline_write(const char* dir, int rank) {
    char path[4096], tmp[4200];
    snprintf(path, sizeof(path), "%s/tp_timeline_%d.jsonl", dir, rank);
    FILE* f = fopen_temp(path, tmp, sizeof(tmp));
    for (int i = 0; i < tp_timeline.n; i++) {
        const TpSpan* s = &tp_timeline.spans[i];
        fprintf(f, "{\"what\": \"%s\", \"comm\": %d, \"backward\": %d, \"start_ms\": %.4f, \"end_ms\": %.4f}\n",
                s->what, s->comm, s->backward, s->start * 1e3, s->end * 1e3);
    }
    file_commit(f, tmp, path);
}
// -tp_timeline S: the host's times are the work's on the CPU backend only, and the file goes into -o
static inline void tp_timeline_check(int step, const char* out_dir) {
    check_every_rank(step == 0 || (strcmp(BACKEND_NAME, "cpu") == 0 && out_dir != NULL),
                     "-tp_timeline %d: the timeline is host-timed, so it is the CPU backend's, and it is written into -o "
                     "(give an output directory)", step);
}
static inline void tp_span(const char* what, int comm, double start) {
    if (!tp_timeline.recording || tp_timeline.n == TP_TIMELINE_SPANS) return;
    TpSpan* s = &tp_timeline.spans[tp_timeline.n++];
    s->what = what, s->comm = comm, s->backward = tp_timeline.backward;
    s->start = start - tp_timeline.origin, s->end = wall_time_s() - tp_timeline.origin;
}
static inline int tp_gemm_in(TpGemm g) { return g.backward ? g.OC : g.IC; }
static inline int tp_gemm_out(TpGemm g) { return g.backward ? g.IC : g.OC; }
static inline void tp_gemm_rows(TpGemm g, floatX* out, const floatX* in, size_t rows) {
    double start = tp_span_start();
    if (g.backward) matmul_backward_input(out, in, g.w, (int)rows, g.IC, g.OC);
    else matmul_forward(out, in, g.w, g.b, (int)rows, g.IC, g.OC);
    tp_span(g.name, 0, start);
}

// All-gather + GEMM (with -sp, before a column-parallel GEMM: f's forward, g's backward). shard
// (BT/tp, in) is this rank's tokens; whole (BT, in) receives every rank's, in rank order (the
// backward's weight gradient reads it); out (BT, out) = GEMM(whole). tp steps: at step s this rank
// multiplies the block of rank r - s (its own first) while it passes that block on to rank r + 1
// and receives rank r - s - 1's from rank r - 1. For tp = 2:
//     step 0: GEMM(own block)         | send own block to r+1, receive r-1's
//     step 1: GEMM(r-1's block)       |
// The products are the collective-then-GEMM's, bit for bit: each row is the same dot products.
static inline void tp_gather_gemm(CommGroup* tp, TpGemm g, floatX* out, floatX* whole, const floatX* shard, size_t BT) {
    int n = tp->size, r = tp->rank;
    size_t rows = BT / n, in = (size_t)tp_gemm_in(g), out_w = (size_t)tp_gemm_out(g);
    if (shard != whole + r * rows * in) copy_device_to_device(whole + r * rows * in, shard, rows * in * sizeof(floatX));
    for (int s = 0; s < n; s++) {
        int block = (r - s + n) % n;  // rank r - s's tokens, which arrived at the last step
        CommRequest next;
        memset(&next, 0, sizeof(next));  // (none posted at the last step: comm_wait returns)
        double posted = tp_span_start();
        if (s < n - 1) {
            // send: the block (B T/tp, in) on to rank r + 1; receive: rank r - s - 1's from rank r - 1
            CommMessage msgs[2] = {comm_message(whole + block * rows * in, rows * in, (r + 1) % n, 1),
                                   comm_message(whole + ((block + n - 1) % n) * rows * in, rows * in, (r + n - 1) % n, 0)};
            comm_exchange_start(tp, msgs, 2, COMM_FLOATX, &next);
        }
        tp_gemm_rows(g, out + block * rows * out_w, whole + block * rows * in, rows);  // under the exchange
        comm_wait(&next);
        if (s < n - 1) tp_span("ring step (gather)", 1, posted);
    }
}

// GEMM + reduce-scatter (with -sp, after a row-parallel GEMM: g's forward, f's backward). in (BT,
// in) is this rank's partial-width input; out (BT/tp, out) receives this rank's tokens of the sum
// over ranks of GEMM(in). tp steps: at step s this rank computes its partial product of the block
// of rank r - s - 1 (its own last), adds the running sum of that block that rank r - 1 sent, and
// passes it on to rank r + 1, which adds its own, and so on around the ring; at the last step the
// sum of its own block arrives, and it adds its own part. For tp = 2:
//     step 0: GEMM(block of r-1) -> P | send P to r+1, receive r-1's partial of my block
//     step 1: GEMM(own block) -> out  | (wait) out += received
// The GEMMs run while the previous step's sum travels. The sum of a block is taken in ring order,
// rank r+1's part first and its owner's last: another order than the collective's (MPI's or
// NCCL's algorithm), so the bits differ from -tp_overlap 0 by fp32 rounding (at tp = 2 both add
// the two parts, and a + b = b + a: the same bits). scratch: 3 blocks of (BT/tp, out) (2 at tp = 2)
#define TP_OVERLAP_CHUNKS 4  // (without -sp: the all-reduce's pieces, tp_gemm_all_reduce)

// What a decomposed row-parallel collective leaves in flight once its GEMMs are done: the ring's
// last step (the sum of this rank's block still arriving, to add to its own part) or the chunks'
// all-reduces. tp_pending_finish waits for them; between the two the caller runs work that does
// not read the sum (the backward's weight gradients), under the last exchange.
typedef struct {
    int n;                                     // requests in flight
    CommRequest requests[TP_OVERLAP_CHUNKS];   // (posted in place: the comm layer tracks them by address)
    double posted[TP_OVERLAP_CHUNKS];
    const char* what;
    floatX* sum;                               // ring: sum += received, once it has arrived
    const floatX* received;
    size_t rows;
    int out_w;
} TpPending;

static inline void tp_pending_finish(TpPending* p) {
    for (int i = 0; i < p->n; i++) {
        comm_wait(&p->requests[i]);
        tp_span(p->what, 1, p->posted[i]);
    }
    if (p->sum) residual_forward(p->sum, p->sum, p->received, (int)p->rows, p->out_w);
    p->n = 0, p->sum = NULL;
}

static inline void tp_gemm_scatter(CommGroup* tp, TpGemm g, floatX* out, const floatX* in, floatX* scratch, size_t BT,
                                   TpPending* p) {
    int n = tp->size, r = tp->rank;
    size_t rows = BT / n, in_w = (size_t)tp_gemm_in(g), out_w = (size_t)tp_gemm_out(g), block_size = rows * out_w;
    floatX *sums[2] = {scratch, scratch + 2 * block_size}, *received = scratch + block_size;
    CommRequest* prev = &p->requests[0];  // the exchange in flight
    memset(p, 0, sizeof(*p));
    p->what = "ring step (scatter)";
    for (int s = 0; s < n; s++) {
        int block = (r - s - 1 + n) % n;
        floatX* sum = s == n - 1 ? out : sums[s % 2];  // (the buffer sent two steps ago: its send is done)
        tp_gemm_rows(g, sum, in + block * rows * in_w, rows);  // this rank's partial, under the last exchange
        if (s == n - 1) break;  // the sum of its own block is still arriving: tp_pending_finish adds it
        tp_pending_finish(p);  // the sum of this block so far, from rank r - 1 (nothing at step 0)
        if (s > 0) residual_forward(sum, sum, received, (int)rows, (int)out_w);
        // send: the block's running sum (B T/tp, out) on to rank r + 1; receive: the next block's from rank r - 1
        CommMessage msgs[2] = {comm_message(sum, block_size, (r + 1) % n, 1),
                               comm_message(received, block_size, (r + n - 1) % n, 0)};
        p->posted[0] = tp_span_start();
        comm_exchange_start(tp, msgs, 2, COMM_FLOATX, prev);
        p->n = 1;
    }
    if (p->n) p->sum = out, p->received = received, p->rows = rows, p->out_w = (int)out_w;
}

// GEMM + all-reduce (without -sp, after a row-parallel GEMM: g's forward, f's backward): the rows
// in TP_OVERLAP_CHUNKS chunks of tokens, each chunk's all-reduce posted as soon as its GEMM is
// done, so that it travels under the next chunk's GEMM (and the last under what the caller does
// before tp_pending_finish). out (BT, out) = the sum over ranks of GEMM(in). Every element is
// summed by the same collective as without overlap: the same bits when the collective's order
// does not depend on the message size.
static inline void tp_gemm_all_reduce(CommGroup* tp, TpGemm g, floatX* out, const floatX* in, size_t BT, TpPending* p) {
    size_t in_w = (size_t)tp_gemm_in(g), out_w = (size_t)tp_gemm_out(g);
    memset(p, 0, sizeof(*p));
    p->what = "all-reduce (a chunk)";
    for (int i = 0; i < TP_OVERLAP_CHUNKS; i++) {
        size_t first = BT * i / TP_OVERLAP_CHUNKS, rows = BT * (i + 1) / TP_OVERLAP_CHUNKS - first;
        tp_gemm_rows(g, out + first * out_w, in + first * in_w, rows);
        // all-reduce SUM of this chunk (rows, out), posted: it travels under the next chunk's GEMM
        p->posted[i] = tp_span_start();
        comm_all_reduce_start(tp, out + first * out_w, rows * out_w, COMM_FLOATX, COMM_SUM, &p->requests[i]);
        p->n = i + 1;
        comm_progress(tp);
    }
}

// A row-parallel GEMM and the sum after it, as the layer calls it: with -tp_overlap, decomposed
// (reduce-scatter with -sp into `reduced`, all-reduce without in place); else the GEMM, then the
// collective (sum_over_ranks). Returns where the sum will be; with pending non-NULL the last of a
// decomposed collective may still be in flight (tp_pending_finish), else it is complete.
static inline floatX* tp_row_parallel(CommGroup* tp, LayerDims d, TpGemm g, floatX* out, const floatX* in,
                                      floatX* reduced, floatX* scratch, size_t BT, TpPending* pending) {
    int sp = d.seq_shards > 1;
    TpPending mine;
    TpPending* p = pending ? pending : &mine;
    memset(p, 0, sizeof(*p));
    floatX* sum = out;
    if (tp == NULL || !d.tp_overlap) {
        tp_gemm_rows(g, out, in, BT);
        double start = tp_span_start();
        sum = sum_over_ranks(tp, out, reduced, BT, tp_gemm_out(g), sp);
        if (tp) tp_span(sp ? "reduce-scatter" : "all-reduce", 1, start);
    } else if (sp) {
        tp_gemm_scatter(tp, g, reduced, in, scratch, BT, p);
        sum = reduced;
    } else {
        tp_gemm_all_reduce(tp, g, out, in, BT, p);
    }
    if (!pending) tp_pending_finish(p);
    return sum;
}

// A column-parallel GEMM and the gather before it: with -sp and -tp_overlap, decomposed; else the
// all-gather (or with no -sp nothing: every rank holds all tokens), then the GEMM
static inline void tp_column_parallel(CommGroup* tp, LayerDims d, TpGemm g, floatX* out, floatX* whole,
                                      const floatX* shard, size_t BT) {
    int sp = d.seq_shards > 1;
    if (tp != NULL && sp && d.tp_overlap) {
        tp_gather_gemm(tp, g, out, whole, shard, BT);
        return;
    }
    double start = tp_span_start();
    const floatX* in = gather_tokens(tp, (floatX*)shard, whole, BT, tp_gemm_in(g), sp);
    if (tp && sp) tp_span("all-gather", 1, start);
    tp_gemm_rows(g, out, in, BT);
}

// ----------------------------------------------------------------------------------------------
// The vocabulary-parallel embedding: this rank holds rows [lo, lo + Vp/tp) of wte. Its lookup
// table of the B*T tokens, written to the host stage (for encoder_backward, which reads the tokens
// on the host) and returned; with a `device` buffer also copied there (for encoder_forward). A token
// of another rank becomes -1, a row of zeros in the forward pass and no gradient in the backward.
static inline const int* vocab_parallel_tokens(int* device, HostStage* stage, const int* tokens_host, size_t BT,
                                               int tp_rank, int Vp_rank) {
    int lo = tp_rank * Vp_rank;
    int* local = (int*)host_stage_take(stage, BT * sizeof(int));
    for (size_t i = 0; i < BT; i++) local[i] = tokens_host[i] >= lo && tokens_host[i] < lo + Vp_rank ? tokens_host[i] - lo : -1;
    if (device != NULL) host_stage_to_device(stage, device, BT * sizeof(int));
    return local;
}

// Vocabulary-parallel cross-entropy: the mean loss of the micro-batch from this rank's logits
// (B, T, Vp/tp) in head->logits, which are never gathered. With dloss != 0 they become their
// gradient, each token weighted by dloss. Every rank returns the same loss. `head` holds the
// head's activations (logits, losses, row statistics): the model's arena, or a pipeline slot.
static inline float vocab_parallel_loss(GPT2* model, CommGroup* tp, Activations* head, const int* targets_host, int B,
                                        int T, float dloss) {
    GPT2Config c = model->config;
    LayerDims d = model->dims;
    int BT = B * T, lo = tp->rank * d.Vp_rank, real = vocab_real_columns(c, d, tp->rank);
    tokens_to_device(model->targets, &model->target_stage, targets_host, (size_t)BT);
    // each row's maximum over the whole vocabulary: all-reduce MAX of (B, T) fp32
    classifier_shard_max(head->row_max, head->logits, BT, d.Vp_rank, real);
    comm_all_reduce(tp, head->row_max, (size_t)BT, COMM_FLOAT, COMM_MAX);
    // each row's sum of exp(logit - max) and its target's logit (held by one rank, 0 on the
    // others): one all-reduce SUM of (B, T, 2) fp32 for both
    classifier_shard_sums(head->row_sums, head->logits, head->row_max, model->targets, BT, d.Vp_rank, real, lo);
    comm_all_reduce(tp, head->row_sums, (size_t)BT * 2, COMM_FLOAT, COMM_SUM);
    // loss = log(sum) - (target - max) on every rank; dlogits = dloss (softmax - onehot), local
    classifier_shard_loss(head->logits, head->losses, head->row_max, head->row_sums, model->targets, dloss, BT, d.Vp_rank,
                          real, lo);
    const float* losses = losses_to_host(model, head->losses, (size_t)BT);
    double sum = 0.0;
    for (int i = 0; i < BT; i++) sum += losses[i];
    return (float)(sum / BT);
}

// ----------------------------------------------------------------------------------------------
// One transformer layer on this rank's slices: Megatron's column-parallel first matmul and
// row-parallel second matmul in each half (block.h), with f before each half and g after it.
// The TP trainer runs them over its layers, the 3D trainer over each pipeline chunk's; and with
// tp NULL (no tensor parallelism) they are the plain layer that train_gpt2_pp's stages run. With
// cp (the 3D trainer's -cp; NULL: none) the rank holds T = T/cp tokens of each sequence, and
// its attention, on its NH/tp heads, reaches the rest of the sequence over the cp group
// (llmc/context_parallel.h, train_gpt2_cp.cu's chapter); nothing else in the layer changes.
//
// The residual stream between the halves is replicated on every tp rank (with -sp split along
// the tokens), so the residual add, the LayerNorms and their statistics are computed on every
// rank alike. Its backward: dresidual, the gradient of the stream, is whole on every rank; each
// LayerNorm's backward adds its input gradient into it, and the residual adds pass it on
// unchanged. That is why g's backward is the identity (each rank already holds the whole
// gradient its half needs) and f's backward is the all-reduce: each rank's half computed only a
// partial input gradient from its slices.

// a layer's widths on one of tp ranks (model.h: the heads, 4C and Vp must divide by tp); with
// -sp the T tokens of a sequence are split over them too, so T must divide by tp
static inline LayerDims tp_layer_dims(GPT2Config c, int tp, int sp, int T, const char* ranks_name) {
    char why[256];
    check_every_rank(!layer_dims_problem(c, tp, build_target(c), why, sizeof(why)), "%s", why);
    LayerDims d = layer_dims(c, tp, sp);
    {
        check_every_rank(!(d.seq_shards > 1 && T % tp != 0), "-sp 1 splits the tokens over the %d %s: -t %d must be a multiple of %d", tp, ranks_name, T, tp);
    }
    return d;
}

// The attention half of a layer's forward, then the residual add and ln2 after it: from ln1 (with
// -sp this rank's tokens of it, in the scratch's ln_shard) to residual2 and ln2 on this rank's
// B T/seq_shards tokens. Returns where ln2 is: with -sp a dense layer's goes to ln_shard, whence
// its MLP all-gathers it into x.ln2; a Mixture-of-Experts layer (d.fc == 0: no dense MLP) routes
// its rank's tokens from x.ln2 itself, where the router's backward finds them (llmc/chunk.h).
static inline floatX* tp_attention_forward(GPT2* model, CommGroup* tp, ContextParallel* cp, LayerActs x, LayerWeights w,
                                           const floatX* residual, int B, int T) {
    LayerDims d = model->dims;
    // the -sp staging buffers (model.h), one set for every layer: ln_shard (BTs, C) a LayerNorm's
    // output on this rank's tokens, before the all-gather; reduced (BTs, C) a reduce-scatter's
    // output, this rank's tokens of a sum (without -sp neither exists: BTs = B*T and both
    // collectives work in place)
    Activations* scratch = &model->acts;
    int C = d.C, sp = d.seq_shards > 1;
    size_t BT = (size_t)B * T;
    int BTs = (int)(BT / d.seq_shards);
    // f before the column-parallel qkv: the identity (the LayerNorm wrote all of x.ln1), or
    // with -sp the all-gather of ln1 from (B*T/tp, C) on each rank (in ln_shard) into x.ln1
    // (B, T, C); then qkv (B, T, 3C/tp) = ln1 Wqkv^T on this rank's NH/tp heads. With
    // -tp_overlap the all-gather runs in ring steps under the GEMM's blocks (tp_column_parallel)
    floatX* ln1_mine = sp ? scratch->ln_shard : x.ln1;  // what this rank's LayerNorm wrote
    LayerWeights slices = w;
    if (tp) slices.attprojb = NULL;  // (a row-parallel bias: added once, after the sum)
    tp_column_parallel(tp, d, tp_gemm("qkv", w.qkvw, w.qkvb, C, d.qkv), x.qkv, x.ln1, ln1_mine, BT);
    // attention on this rank's heads (with cp the queries attend to the whole sequence: the ring,
    // or the all-gather, of K,V over cp)
    if (cp) cp_attention_forward(cp, x.atty, (float*)x.att_state, x.qkv, B, T, d.att, d.NH);
    else attention_forward(x.atty, x.att_state, x.qkv, B, T, d.att, d.NH);
    // the row-parallel projection leaves a partial sum (B, T, C); g after it: all-reduce, with
    // -sp reduce-scatter (tp_row_parallel; with -tp_overlap in pieces under the GEMM). Its bias is
    // added once, after the sum, not per rank (the backward pass needs no such care: a bias
    // gradient sums dout over all tokens, which every rank holds whole, so it comes out whole and
    // equal on every rank)
    floatX* attproj = tp_row_parallel(tp, d, tp_gemm("attproj", slices.attprojw, slices.attprojb, d.att, C), x.attproj, x.atty,
                                      scratch->reduced, scratch->dbuf, BT, NULL);
    if (tp) bias_add(attproj, w.attprojb, BTs, C);
    // replicated (or with -sp, this rank's tokens): residual2 = residual + attproj, then ln2
    floatX* ln2_mine = sp && d.fc > 0 ? scratch->ln_shard : x.ln2;
    fused_residual_layernorm_forward(x.residual2, ln2_mine, x.ln2_mean, x.ln2_rstd, residual, attproj, w.ln2w, w.ln2b,
                                     BTs, C);
    return ln2_mine;
}

// One dense layer's forward from its ln1 to the summed fcproj (B T/seq_shards tokens, bias added),
// which the caller adds to the residual stream, fused with the next LayerNorm. rerun (-r 2): the
// same again before the layer's backward, as far as the backward reads (block.h), with the
// collectives on the way.
static inline floatX* tp_layer_forward(GPT2* model, CommGroup* tp, ContextParallel* cp, LayerActs x, LayerWeights w,
                                       const floatX* residual, int B, int T, int rerun) {
    LayerDims d = model->dims;
    Activations* scratch = &model->acts;
    int C = d.C;
    size_t BT = (size_t)B * T;
    int BTs = (int)(BT / d.seq_shards);
    floatX* ln2_mine = tp_attention_forward(model, tp, cp, x, w, residual, B, T);
    // f before the column-parallel fc (identity, or with -sp the all-gather of ln2 to (B, T, C)),
    // fch (B, T, 4C/tp) on this rank's columns, GELU
    tp_column_parallel(tp, d, tp_gemm("fc", w.fcw, w.fcb, C, d.fc), x.fch, x.ln2, ln2_mine, BT);
    gelu_forward(x.fch_gelu, x.fch, BT * d.fc);
    if (rerun) return NULL;  // the sum of fcproj is not repeated: only residual3 needed it, and it was kept
    // the row-parallel fcproj: a partial sum (B, T, C) again, and g after it (its bias, as
    // attproj's, added once after the sum)
    floatX* fcproj = tp_row_parallel(tp, d, tp_gemm("fcproj", w.fcprojw, tp ? NULL : w.fcprojb, d.fc, C), x.fcproj,
                                     x.fch_gelu, scratch->reduced, scratch->dbuf, BT, NULL);
    if (tp) bias_add(fcproj, w.fcprojb, BTs, C);
    return fcproj;
}

// -r 1 and 2: what the layer's forward did not keep (`kept`, model.h), computed again right before
// its backward; residual is the layer's input (this rank's tokens of it with -sp)
static inline void tp_layer_recompute(GPT2* model, CommGroup* tp, ContextParallel* cp, LayerActs x, LayerWeights w,
                                      unsigned kept, const floatX* residual, int B, int T) {
    LayerDims d = model->dims;
    if (kept == KEEP_ALL) return;
    device_span_begin(&recompute_spans);
    if (layer_rerun_needed(kept)) {
        int sp = d.seq_shards > 1;
        layernorm_forward(sp ? model->acts.ln_shard : x.ln1, x.ln1_mean, x.ln1_rstd, residual, w.ln1w, w.ln1b,
                          B * T / d.seq_shards, d.C);
        tp_layer_forward(model, tp, cp, x, w, residual, B, T, 1);
    } else {
        layer_recompute_selective(x, kept, B, T, d);  // (with cp lse is always kept: no attention)
    }
    device_span_end(&recompute_spans);
}

// The attention half's backward, from the gradient at residual2 (in dresidual, B T/seq_shards
// tokens) to the gradient at the layer's input (in dresidual again); the weight gradients
// accumulate into gw (with split, zero bubble's B action, the matmuls' wait for W:
// tp_layer_backward says where they are left).
static inline void tp_attention_backward(GPT2* model, CommGroup* tp, ContextParallel* cp, LayerActs x, LayerWeights w,
                                         LayerWeights gw, const floatX* residual, floatX* dresidual, int B, int T,
                                         int split) {
    LayerDims d = model->dims;
    Activations* scratch = &model->acts;
    int C = d.C, sp = d.seq_shards > 1;
    size_t BT = (size_t)B * T, X = sizeof(floatX);
    int BTs = (int)(BT / d.seq_shards);
    floatX* dout = sp ? scratch->dgathered : dresidual;
    // g's backward at attproj (identity, or with -sp all-gather of dresidual to (B, T, C)) and
    // the gradient at the attention output, datty (B, T, C/tp) = dout Wattproj, in dbuf
    tp_column_parallel(tp, d, tp_gemm_backward("d atty", w.attprojw, d.att, C), scratch->dbuf, dout, dresidual, BT);
    if (cp) cp_attention_backward(cp, scratch->dqkv, scratch->dbuf, x.atty, (const float*)x.att_state, x.qkv, B, T, d.att, d.NH);
    else attention_backward(scratch->dqkv, scratch->dbuf, x.qkv, x.atty, x.att_state, B, T, d.att, d.NH);
    // this rank's partial dln1 (B, T, C) = dqkv Wqkv (datty in dbuf is used up), and f's
    // backward at ln1: all-reduce; with -sp reduce-scatter; the attention's weight gradients
    // under the last of it, as in the MLP
    TpPending in_flight;
    floatX* dln1 = tp_row_parallel(tp, d, tp_gemm_backward("d ln1", w.qkvw, C, d.qkv), scratch->dbuf, scratch->dqkv,
                                   scratch->reduced, scratch->dbuf, BT, &in_flight);
    if (split) {  // kept for W: the gradients at attproj and qkv
        copy_device_to_device(x.attproj, dout, BT * C * X);
        copy_device_to_device(x.qkv, scratch->dqkv, BT * d.qkv * X);
    } else {
        attention_half_backward_weight(gw, scratch->dqkv, dout, x, B, T, d);
    }
    tp_pending_finish(&in_flight);
    layernorm_backward(dresidual, gw.ln1w, gw.ln1b, dln1, residual, w.ln1w, x.ln1_mean, x.ln1_rstd, BTs, C);
}

// One dense layer's backward: dresidual (B T/seq_shards, C) holds the gradient at the layer's
// output and on return at its input; the weight gradients accumulate into gw. First what -r
// dropped is recomputed. With split (zero bubble's B action) the matmuls' weight gradients wait
// for the W action, which finds in the slot what it needs, each in the place of an activation B
// has used up and that has its shape: the gradient at attproj (B,T,C) in attproj, at qkv
// (B,T,3C/tp) in qkv, at fcproj (B,T,C) in fcproj, at fch (B,T,4C/tp) in fch (with -sp the
// gathered ones).
static inline void tp_layer_backward(GPT2* model, CommGroup* tp, ContextParallel* cp, LayerActs x, LayerWeights w,
                                     LayerWeights gw, unsigned kept, const floatX* residual, floatX* dresidual, int B,
                                     int T, int split) {
    LayerDims d = model->dims;
    // the backward's buffers, shared by every layer (model.h): dbuf (B, T, C) a half's partial
    // input gradient, dfch (B, T, 4C/tp) and dqkv (B, T, 3C/tp) inside the halves; with -sp
    // dgathered (B, T, C) the all-gathered dresidual and reduced (BTs, C) a reduce-scatter's
    // output
    Activations* scratch = &model->acts;
    int C = d.C, sp = d.seq_shards > 1;
    size_t BT = (size_t)B * T, X = sizeof(floatX);
    int BTs = (int)(BT / d.seq_shards);
    tp_layer_recompute(model, tp, cp, x, w, kept, residual, B, T);
    // g's backward at fcproj: the identity (dresidual is whole on every rank), or with -sp the
    // all-gather of dresidual (B*T/tp, C) into dgathered (B, T, C); then the gradient at the GELU
    // output, dfch (B, T, 4C/tp) = dout Wfcproj, this rank's columns (with -tp_overlap the two
    // decomposed, as in the forward)
    floatX* dout = sp ? scratch->dgathered : dresidual;
    tp_column_parallel(tp, d, tp_gemm_backward("d fch", w.fcprojw, d.fc, C), scratch->dfch, dout, dresidual, BT);
    gelu_backward(scratch->dfch, x.fch, scratch->dfch, BT * d.fc);
    // this rank's partial dln2 (B, T, C) = dfch Wfc, and f's backward after it: all-reduce; with
    // -sp reduce-scatter (with -tp_overlap in pieces under the GEMM, the last of them in flight
    // while the MLP's weight gradients, which read neither, are computed)
    TpPending in_flight;
    floatX* dln2 = tp_row_parallel(tp, d, tp_gemm_backward("d ln2", w.fcw, C, d.fc), scratch->dbuf, scratch->dfch,
                                   scratch->reduced, scratch->dbuf, BT, &in_flight);
    if (split) {  // kept for W: the gradients at fcproj and fch
        copy_device_to_device(x.fcproj, dout, BT * C * X);
        copy_device_to_device(x.fch, scratch->dfch, BT * d.fc * X);
    } else {
        mlp_half_backward_weight(gw, scratch->dfch, dout, x, B, T, d);
    }
    tp_pending_finish(&in_flight);
    layernorm_backward(dresidual, gw.ln2w, gw.ln2b, dln2, x.residual2, w.ln2w, x.ln2_mean, x.ln2_rstd, BTs, C);
    tp_attention_backward(model, tp, cp, x, w, gw, residual, dresidual, B, T, split);
}

// With -sp each rank's LayerNorm weights saw only its own tokens, so their gradients are partial
// sums: all-reduce each of ln1w, ln1b, ln2w, ln2b ((layers, C) each) and, where the rank holds
// them, lnfw, lnfb ((C) each). Forgetting this is the classic sequence-parallel bug: every rank
// would update its LayerNorm copy with its own part of the gradient. A Mixture-of-Experts model's
// routers (layers, E, C) are the same case: replicated over tp, each copy routing only its
// rank's tokens (in a dense model routerw is empty).
static inline void layernorm_grads_all_reduce(GPT2* model, CommGroup* tp) {
    const ParameterLayout* p = &model->layout;
    const int layernorms[7] = {PARAM_LN1W, PARAM_LN1B, PARAM_LN2W, PARAM_LN2B, PARAM_LNFW, PARAM_LNFB, PARAM_ROUTERW};
    for (int i = 0; i < 7; i++) {
        int t = layernorms[i];
        if (p->sizes[t] > 0) comm_all_reduce(tp, model->grads_memory + p->offsets[t], p->sizes[t], COMM_FLOATX, COMM_SUM);
    }
}

#endif
