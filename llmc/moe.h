// Mixture-of-Experts layers for train_gpt2_ep.cu and, inside its pipeline stages, train_gpt2_3d.cu
// (5D, through llmc/chunk.h): the router, top-k routing with capacity, the balancing rules, and
// the expert MLPs behind an all-to-all. A trainer calls moe_forward in place of the MLP half
// (block.h) and moe_backward in place of its backward; everything between (LayerNorms, residual
// adds, the gradient reductions) stays in the trainer.
//
// One layer, forward, on a rank with N tokens (B x T) in its micro-batch:
//   1. router logits s = h Wr^T (N, E); each token picks the k experts of largest s + b (b the
//      balancing bias, zero unless -balance bias; ties to the lower index), and its gates are the
//      softmax of the k picked s (Shazeer et al. 2017; Mixtral's order: top-k, then softmax).
//   2. capacity (-capacity_factor cf > 0): each expert takes at most ceil(cf N k / E) of this
//      rank's slots, first choices before second, in token order; the rest are dropped (their
//      tokens pass by on the residual stream; GShard, Lepikhin et al. 2020). Every pass, a
//      sample's of fewer tokens too, routes with this capacity (moe_route says why).
//   3. the kept slots, grouped by expert (so by the rank that holds it), leave in "send order";
//      all-to-all of the counts, then all-to-all of the rows (C values each): each rank receives
//      the rows of its E/ep experts from every rank, regroups them expert by expert, and runs
//      each expert's MLP (fc, GELU, fcproj) as GEMMs over its rows;
//   4. the outputs go back by the reverse all-to-all, and each token sums gate x output over its
//      kept slots, in slot order (the same sum on any ep).
// The backward runs it in reverse: the gradients of the expert outputs travel to the experts and
// the gradients of their inputs back, the gates' gradients reach the router through the softmax.
// Both come in three parts cut at the two all-to-alls of rows, each posted non-blocking and
// waited for by the next part: run in a row by moe_forward and moe_backward, and with another
// micro-batch's parts in between by the grid trainer's MoE overlap (DualPipe's; -pp_overlap 1,
// llmc/pipeline_walk.h), so that the all-to-all moves under that compute.
// Routing runs where the rows are, on the device (cpu/moe.h, cuda/moe.cuh: the top-k, the capacity
// and the send order, which the CPU assigns in one serial loop over the slots and CUDA by a prefix
// sum per expert, the router's gradient); the host gets only what the all-to-all needs, each
// expert's count of kept slots, and decides from the counts where each rank's rows go
// (moe_regroup): plain loops a reader can follow.
#ifndef LLMC_MOE_H
#define LLMC_MOE_H

#include <math.h>
#include "comm.h"
#include "memory_plan.h"
#include "model.h"
#include "optimizer.h"

typedef enum { BALANCE_NONE, BALANCE_AUX, BALANCE_BIAS } MoeBalance;
static inline const char* moe_balance_name(MoeBalance b) { return b == BALANCE_AUX ? "aux" : b == BALANCE_BIAS ? "bias" : "none"; }

// What one micro-batch's forward leaves in its MoE layers for their backward: its routing and the
// rows its experts took, `layers` layers of them. The EP trainer holds one (a micro-batch at a
// time); a pipeline stage of the grid trainer one per slot (llmc/stage.h), beside the slot's
// other activations, since each micro-batch in flight keeps its own until its backward.
typedef struct {
    int layers;
    // device
    int* expert;               // (layers, N, k) each slot's expert, best first
    float* gate;               // (layers, N, k) its gate
    int* row;                  // (layers, N, k) its row in the layer's send order; -1: dropped
    float* probs;              // (layers, N, E) softmax over all E of s (the aux loss's P)
    float* shares;             // (layers, B, 2E) each sequence's f and P (-balance aux)
    int *to_experts_dev, *from_experts_dev;  // (layers, rows_max) the two row orders below
    floatX* xin;               // (layers, rows_max, C)   the rows this rank's experts took, expert order
    floatX* fch;               // (layers, rows_max, 4C)
    floatX* fch_gelu;          // (layers, rows_max, 4C)
    floatX* returned;          // (layers, N k, C)        the expert outputs, back in send order
    // host: what the all-to-all needs
    int* send_counts;          // (layers, E) kept slots this rank sends to each expert
    int* recv_counts;          // (layers, ep, E_local) rows it receives from each rank for each of its experts
    int* rows_taken;           // (layers) the rows this rank's experts took in the layer's forward (moe_regroup)
    int* to_experts;           // (layers, rows_max) expert order: row i comes from source-order row to_experts[i]
    int* from_experts;         // (layers, rows_max) source order: row i comes from expert-order row from_experts[i]
} MoeRecord;

// The tokens a rank routes in one micro-batch of B sequences of T tokens: N of its flattened
// (B, T) tokens, from token `first` on. The EP trainer's ranks route all of theirs (N = B T,
// first 0). In the grid trainer a rank holds T = T/cp tokens of each sequence, and with -sp only
// its B T / tp of those (first = tp rank x N), so that no token is routed twice; a sequence is
// then T_seq tokens in all, spread over seq_group (the cp x tp ranks of its replica at the stage,
// which add up their parts of the aux loss's figures; NULL when one rank holds whole sequences).
typedef struct {
    int B, T, N, first, T_seq;
    CommGroup* seq_group;
} MoeTokens;

// Where a layer's rows wait while an all-to-all moves them: the rows in send order (N k, C) and
// in source order (rows_max, C). One lane serves a pass at a time; the grid trainer's MoE overlap
// (-pp_overlap 1, llmc/pipeline_walk.h) runs two micro-batches' passes at once, in turn, and
// gives the backward a second lane, so that neither overwrites rows the other's all-to-all is
// still moving. (The rest of the scratch below lives within one part of a layer: moe_forward.)
typedef struct {
    floatX* send;              // (N k, C)           rows in send order
    floatX* recv;              // (rows_max, C)      rows in source-rank order
} MoeLane;

typedef struct Moe {
    int E, k, L, C;
    int ep, ep_rank, E_local;  // experts split over ep ranks: this rank holds [ep_rank E_local, ...)
    int N;                     // tokens of a micro-batch this rank routes, the most a layer routes
    MoeTokens tokens;          // which of the micro-batch's tokens they are (the aux loss is per sequence)
    MoeBalance balance;
    float aux_alpha, bias_rate, capacity_factor;
    int capacity;              // slots an expert takes of a micro-batch (N k: dropless)
    int rows_max;              // the most rows an expert rank can receive in a layer
    CommGroup* ep_group;       // the ranks this rank exchanges tokens with
    int rows_channel;          // the ep group's channel its all-to-alls of rows take (comm.h): 0, or
                               // with the MoE overlap a side channel of their own (moe_add_lane)
    MoeRecord* records;        // one per micro-batch in flight
    int num_records;
    // device
    float* bias;               // (L, E) DeepSeek-V3's balancing bias (-balance bias), a checkpoint's trainer state
    int* counts_dev;           // (2E) the layer's kept slots per expert, then its routed slots (before drops)
    float* dgate;              // (N, k) the gates' gradients
    // host: what the printed figures need
    int* counts;               // (2E) counts_dev, copied
    float* shares_host;        // (B, 2E) a layer's shares, for the aux loss's value
    float* bias_host;          // (L, E) the bias, for its update and the printed range
    // device scratch, one layer's
    MoeLane lanes[2];          // lane 0, and the MoE overlap's lane 1 (moe_add_lane; else NULLs)
    floatX* yout;              // (rows_max, C)      expert outputs (backward: their gradients), expert order
    floatX* dfch;              // (rows_max, 4C)
    floatX* scores;            // (N, E)             router logits; backward: their gradient
    floatX* dh;                // (N, C)             the router's part of the input gradient
    // this step's figures, summed over its micro-batches (before any reduction over ranks); the
    // layers are the model's (L): a rank adds to those it holds
    double* loads;             // (L, E) slots routed to each expert, before drops
    double aux;                // the aux loss: per micro-batch mean over sequences, summed over layers
    double kept_slots, dropped_slots;
    int hidden;                // the MoE overlap: this rank's all-to-alls of rows that moved while
                               // another micro-batch computed (llmc/pipeline_walk.h counts them)
    double counts_seconds;     // the time the counts' all-to-alls held up this rank (they block)
} Moe;

// (the buffers' sizes, moe_capacity, moe_rows_max and moe_device_bytes: llmc/memory_plan.h,
// which the memory table counts with)

static inline void moe_record_alloc(MoeRecord* r, const Moe* m, int layers) {
    memset(r, 0, sizeof(*r));
    r->layers = layers;
    size_t L = layers, N = m->N, k = m->k, E = m->E, C = m->C, R = m->rows_max, S = N * k;
    r->expert = (int*)device_malloc(L * S * sizeof(int));
    r->gate = (float*)device_malloc(L * S * sizeof(float));
    r->row = (int*)device_malloc(L * S * sizeof(int));
    r->probs = (float*)device_malloc(L * N * E * sizeof(float));
    r->shares = (float*)device_malloc(L * m->tokens.B * 2 * E * sizeof(float));
    r->to_experts_dev = (int*)device_malloc(L * R * sizeof(int));
    r->from_experts_dev = (int*)device_malloc(L * R * sizeof(int));
    r->xin = (floatX*)device_malloc(L * R * C * sizeof(floatX));
    r->fch = (floatX*)device_malloc(L * R * 4 * C * sizeof(floatX));
    r->fch_gelu = (floatX*)device_malloc(L * R * 4 * C * sizeof(floatX));
    r->returned = (floatX*)device_malloc(L * S * C * sizeof(floatX));
    r->send_counts = (int*)calloc_check(L * E, sizeof(int));
    r->recv_counts = (int*)calloc_check(L * E, sizeof(int));  // ep x E_local = E per layer
    r->rows_taken = (int*)calloc_check(L, sizeof(int));
    r->to_experts = (int*)malloc_check(L * R * sizeof(int));
    r->from_experts = (int*)malloc_check(L * R * sizeof(int));
}

static inline void moe_record_free(MoeRecord* r) {
    device_free(r->expert), device_free(r->gate), device_free(r->row), device_free(r->probs), device_free(r->shares);
    device_free(r->to_experts_dev), device_free(r->from_experts_dev);
    device_free(r->xin), device_free(r->fch), device_free(r->fch_gelu), device_free(r->returned);
    free(r->send_counts), free(r->recv_counts), free(r->rows_taken), free(r->to_experts), free(r->from_experts);
}

// records: how many micro-batches can be in flight, each with record_layers MoE layers
static inline void moe_alloc(Moe* m, GPT2Config c, int ep, int ep_rank, CommGroup* ep_group, MoeTokens tokens,
                             int records, int record_layers, MoeBalance balance, float aux_alpha, float bias_rate,
                             float capacity_factor) {
    memset(m, 0, sizeof(*m));
    m->E = c.experts, m->k = c.topk, m->L = c.num_layers, m->C = c.channels;
    m->ep = ep, m->ep_rank = ep_rank, m->E_local = c.experts / ep, m->ep_group = ep_group;
    m->N = tokens.N, m->tokens = tokens;
    m->balance = balance, m->aux_alpha = aux_alpha, m->bias_rate = bias_rate, m->capacity_factor = capacity_factor;
    m->capacity = moe_capacity(m->N, m->k, m->E, capacity_factor);
    m->rows_max = moe_rows_max(m->N, m->k, m->E, ep, m->capacity);
    size_t L = m->L, N = m->N, k = m->k, E = m->E, C = m->C, R = m->rows_max, S = N * k;
    allocation_kind(ALLOC_EXPERTS);  // (every device buffer below: the memory table's row "experts")
    m->num_records = records;
    m->records = (MoeRecord*)malloc_check((size_t)records * sizeof(MoeRecord));
    for (int i = 0; i < records; i++) moe_record_alloc(&m->records[i], m, record_layers);
    m->bias = (float*)device_malloc(L * E * sizeof(float));
    device_memset_zero(m->bias, L * E * sizeof(float));
    m->counts_dev = (int*)device_malloc(2 * E * sizeof(int));
    m->dgate = (float*)device_malloc(S * sizeof(float));
    m->counts = (int*)calloc_check(2 * E, sizeof(int));
    m->shares_host = (float*)malloc_check((size_t)tokens.B * 2 * E * sizeof(float));
    m->bias_host = (float*)calloc_check(L * E, sizeof(float));
    m->lanes[0].send = (floatX*)device_malloc(S * C * sizeof(floatX));
    m->lanes[0].recv = (floatX*)device_malloc(R * C * sizeof(floatX));
    m->yout = (floatX*)device_malloc(R * C * sizeof(floatX));
    m->dfch = (floatX*)device_malloc(R * 4 * C * sizeof(floatX));
    m->scores = (floatX*)device_malloc(N * E * sizeof(floatX));
    m->dh = (floatX*)device_malloc(N * C * sizeof(floatX));
    m->loads = (double*)calloc_check(L * E, sizeof(double));
}

// the MoE overlap's second lane (memory_plan.h counts it with -pp_overlap 1: moe_lane_bytes), and
// a side channel of the ep group for the all-to-alls of rows (a collective of the group: every
// rank of it adds the lane), connected to every other rank. On NCCL the rows then run on a
// communicator and stream of their own while the compute stream goes on, and the counts'
// all-to-all, blocking on channel 0, never waits behind rows still in flight (cuda/comm.cuh:
// comm_all_to_all_start); on MPI a request moves on its own, and the channel is only named.
static inline void moe_add_lane(Moe* m) {
    allocation_kind(ALLOC_EXPERTS);
    m->lanes[1].send = (floatX*)device_malloc((size_t)m->N * m->k * m->C * sizeof(floatX));
    m->lanes[1].recv = (floatX*)device_malloc((size_t)m->rows_max * m->C * sizeof(floatX));
    if (m->ep == 1) return;  // (the rows stay: no all-to-all)
    CommGroup* g = m->ep_group;
    int peers[1024], n = 0;  // (ep <= E <= 1024, as moe_exchange_start's)
    for (int p = 0; p < g->size; p++) {
        if (p != g->rank) peers[n++] = p;
    }
    m->rows_channel = g->side_channels + 1;
    comm_open_channel(g, m->rows_channel, peers, n);
}

static inline void moe_free(Moe* m) {
    for (int i = 0; i < m->num_records; i++) moe_record_free(&m->records[i]);
    free(m->records);
    device_free(m->bias), device_free(m->counts_dev), device_free(m->dgate);
    free(m->counts), free(m->shares_host), free(m->bias_host);
    for (int i = 0; i < 2; i++) device_free(m->lanes[i].send), device_free(m->lanes[i].recv);
    device_free(m->yout), device_free(m->dfch);
    device_free(m->scores), device_free(m->dh);
    free(m->loads);
}

// the step's figures start from zero
static inline void moe_step_begin(Moe* m) {
    memset(m->loads, 0, (size_t)m->L * m->E * sizeof(double));
    m->aux = m->kept_slots = m->dropped_slots = 0.0;
    m->hidden = 0;
    m->counts_seconds = 0.0;
}

// One MoE layer of one micro-batch in flight: layer j of its record, the model's layer l (whose
// bias it routes with and whose loads it counts); where its routing and rows live
typedef struct {
    int l;
    int *expert, *row, *to_experts_dev, *from_experts_dev;  // device
    float *gate, *probs, *shares;
    floatX *xin, *fch, *fch_gelu, *returned;
    int *send_counts, *recv_counts, *rows_taken, *to_experts, *from_experts;  // host
} MoeLayer;

static inline MoeLayer moe_layer(const Moe* m, MoeRecord* r, int j, int l) {
    size_t S = (size_t)m->N * m->k, R = (size_t)m->rows_max, E = (size_t)m->E, C = (size_t)m->C;
    MoeLayer x;
    x.l = l;
    x.expert = r->expert + j * S, x.gate = r->gate + j * S, x.row = r->row + j * S;
    x.probs = r->probs + j * m->N * E;
    x.shares = r->shares + j * m->tokens.B * 2 * E;
    x.to_experts_dev = r->to_experts_dev + j * R, x.from_experts_dev = r->from_experts_dev + j * R;
    x.xin = r->xin + j * R * C, x.fch = r->fch + j * R * 4 * C, x.fch_gelu = r->fch_gelu + j * R * 4 * C;
    x.returned = r->returned + j * S * C;
    x.send_counts = r->send_counts + j * E, x.recv_counts = r->recv_counts + j * E, x.rows_taken = r->rows_taken + j;
    x.to_experts = r->to_experts + j * R, x.from_experts = r->from_experts + j * R;
    return x;
}

// ---- 1, 2: routing. s: the router logits (N, E) of the layer (device). The device picks each
// token's experts and gates, applies the capacity and orders the kept slots (send order); the
// host copies back the counts, the one wait of the layer before its all-to-all, and adds the
// step's figures. Every pass routes with the training capacity, a sample's (1 x t tokens, t <= T)
// as well: the receiving buffers hold capacity x E/ep rows from each of the ep ranks
// (moe_rows_max), the size the memory table counts, and a pass of fewer tokens can only fill
// them less. A dropless sample would need room for every rank's t k slots on one rank, in every
// layer: the memory the capacity is there to save. And the sample then shows the model as it was
// trained, under the same budget; it drops less than a training micro-batch, since its t tokens
// share the slots a micro-batch's B T share.
static inline void moe_route(Moe* m, MoeLayer x, const floatX* s, int N) {
    int E = m->E, k = m->k;
    moe_topk(x.expert, x.gate, x.probs, s, m->bias + (size_t)x.l * E, N, E, k);
    moe_assign_rows(x.row, m->counts_dev, x.expert, N, k, E, m->capacity);
    if (m->balance == BALANCE_AUX && N == m->N) {
        // each sequence's f and P from this rank's tokens; where other ranks hold the rest of its
        // tokens (the grid trainer's cp and -sp), the sum of their parts: all-reduce (B, 2E) fp32
        // over them, so that the loss, and its gradient at every router, is the whole sequence's
        MoeTokens t = m->tokens;
        moe_sequence_shares(x.shares, x.expert, x.probs, t.B, t.T, t.first, N, t.T_seq, k, E);
        if (t.seq_group) comm_all_reduce(t.seq_group, x.shares, (size_t)t.B * 2 * E, COMM_FLOAT, COMM_SUM);
    }
    copy_device_to_host(m->counts, m->counts_dev, (size_t)2 * E * sizeof(int));
    for (int e = 0; e < E; e++) {
        int kept = m->counts[e], routed = m->counts[E + e];
        x.send_counts[e] = kept;
        m->loads[(size_t)x.l * E + e] += routed;  // counted before any drop: what the balancing rules look at
        m->kept_slots += kept, m->dropped_slots += routed - kept;
    }
}

// ---- 3: the exchange's bookkeeping. After the counts' all-to-all, recv_counts of the layer says
// how many rows each source rank sends for each of this rank's experts; the rows arrive source by
// source (each source's rows expert by expert), and the experts want theirs together.
// to_experts (expert order <- source order) and from_experts (its inverse); returns the rows.
static inline int moe_regroup(Moe* m, MoeLayer x) {
    const int* counts = x.recv_counts;  // [source][local expert]
    int at = 0;
    for (int e = 0; e < m->E_local; e++) {
        for (int p = 0; p < m->ep; p++) {
            int src = 0;  // where source p's rows for expert e start in source order
            for (int q = 0; q < p; q++) {
                for (int f = 0; f < m->E_local; f++) src += counts[q * m->E_local + f];
            }
            for (int f = 0; f < e; f++) src += counts[p * m->E_local + f];
            for (int i = 0; i < counts[p * m->E_local + e]; i++, at++) {
                x.to_experts[at] = src + i;
                x.from_experts[src + i] = at;
            }
        }
    }
    copy_host_to_device(x.to_experts_dev, x.to_experts, (size_t)at * sizeof(int));
    copy_host_to_device(x.from_experts_dev, x.from_experts, (size_t)at * sizeof(int));
    *x.rows_taken = at;  // (the backward's exchange brings as many)
    return at;
}

// rows of expert e (local) in expert order: first row and how many
static inline int moe_expert_rows(const Moe* m, MoeLayer x, int e, int* first) {
    int start = 0, n = 0;
    for (int f = 0; f <= e; f++) {
        int rows = 0;
        for (int p = 0; p < m->ep; p++) rows += x.recv_counts[p * m->E_local + f];
        if (f < e) start += rows;
        else n = rows;
    }
    *first = start;
    return n;
}

// The all-to-all of rows (C values each) between send order (this rank's slots, grouped by
// expert, so by destination rank) and source order (the rows this rank's experts take, from each
// rank in turn). back = 0: send -> recv (the tokens to their experts); back = 1: recv -> send
// (the outputs home), the same counts reversed. Over ep ranks a rank sends what is not its own:
// in a balanced layer (ep - 1)/ep of its N k slots, N k C (ep - 1)/ep values each way. Posted
// (comm_all_to_all_start, on the rows' channel): the part of the layer that reads `to` first
// waits for r; `from` is not written again before then.
static inline void moe_exchange_start(Moe* m, MoeLayer x, const floatX* from, floatX* to, int back, CommRequest* r) {
    int ep = m->ep, El = m->E_local;
    const int* sent = x.send_counts;      // [destination's expert]
    const int* received = x.recv_counts;  // [source][local expert]
    size_t to_rank[1024], from_rank[1024];  // rows x C per peer (ep <= E <= 1024)
    size_t total = 0;  // rows this rank sends (forward: its kept slots; back: what its experts took)
    for (int p = 0; p < ep; p++) {
        size_t out = 0, in = 0;
        for (int e = 0; e < El; e++) out += (size_t)sent[p * El + e], in += (size_t)received[p * El + e];
        to_rank[p] = (back ? in : out) * m->C;
        from_rank[p] = (back ? out : in) * m->C;
        total += to_rank[p] / m->C;
    }
    r->active = 0;  // (nothing to wait for, unless posted below)
    if (ep == 1) {  // every expert here: the rows stay
        copy_device_to_device(to, from, total * m->C * sizeof(floatX));
        return;
    }
    // all-to-all (variable sizes): block p of `from` to rank p, rank p's block for us into block p of `to`
    comm_all_to_all_start(m->ep_group, from, to_rank, to, from_rank, COMM_FLOATX, m->rows_channel, r);
}

// The aux loss of the layer's micro-batch (Switch Transformer, Fedus et al. 2021): per sequence,
// alpha E sum_e f_e P_e, f_e the share of its T k slots routed to e (before drops; a count, no
// gradient), P_e the mean over its tokens of softmax(s)_e; the mean over the micro-batch's
// sequences. (f and P per sequence come from the device, moe_route's moe_sequence_shares; the
// gradient, from the same shares: moe_backward.)
static inline double moe_aux_loss(const Moe* m, MoeLayer x) {
    int E = m->E, B = m->tokens.B;
    copy_device_to_host(m->shares_host, x.shares, (size_t)B * 2 * E * sizeof(float));
    double total = 0.0;
    for (int q = 0; q < B; q++) {
        const float *f = m->shares_host + (size_t)q * 2 * E, *P = f + E;
        for (int e = 0; e < E; e++) total += (double)m->aux_alpha * E * f[e] * P[e];
    }
    return total / B;
}

// ---- the layer, in three parts cut at its two all-to-alls of rows: a part posts one and returns,
// the next waits for it first. moe_forward and moe_backward run the three in a row; the grid
// trainer's MoE overlap (-pp_overlap 1, llmc/pipeline_walk.h) runs another micro-batch's part in
// between, the all-to-all moving under that compute (DualPipe, DeepSeek-V3 section 3.2.1). Each
// micro-batch's kernels are the same, in the same order, either way. A pass keeps its rows in
// its lane (MoeLane); what a part computes in the other scratch buffers it uses up before it
// returns (but dgate, which the backward keeps from its first part to its third: a pair holds
// one backward), and the routing lives in the micro-batch's record (x).
//
// The forward. h: ln2 (N, C) of the layer, this rank's tokens; out (N, C): the MoE's output,
// added to the residual stream by the trainer. w: the layer's weights (fcw .. fcprojb at this
// rank's first expert). With -balance aux the micro-batch's aux loss is added to the step's.
// Part 1: route, and post the rows to their experts (r).
static inline void moe_forward_dispatch(Moe* m, MoeLayer x, const floatX* h, LayerWeights w, int N, MoeLane* lane,
                                        CommRequest* r) {
    int C = m->C, E = m->E, k = m->k;
    // 1. router logits (N, E) = h Wr^T, routed (2.)
    matmul_forward(m->scores, h, w.routerw, NULL, N, C, E);
    moe_route(m, x, m->scores, N);
    if (m->balance == BALANCE_AUX && N == m->N) m->aux += moe_aux_loss(m, x);
    // 3. the kept slots in send order; counts first: all-to-all of E_local ints per rank pair, so
    // that each rank knows how many rows it will receive from each rank for each of its experts
    // before the rows come (MPI_Alltoallv and grouped NCCL send/recv both need the sizes up
    // front). Megatron-LM's all-to-all dispatcher does the same: the counts in their own
    // all-to-all, then the host waits for them (here too: a blocking one, also under the MoE
    // overlap). DeepEP's normal kernels exchange the counts in a small kernel of their own, the
    // CPU still waiting for them; its low-latency kernels skip the round trip: receive buffers
    // sized for the worst case, the counts travelling with the tokens, so the host never waits.
    // A fixed capacity with padding needs no counts at all.
    moe_dispatch(lane->send, h, x.row, NULL, N, k, C, /*weighted*/ 0);
    double t0 = wall_time_s();
    if (m->ep > 1) comm_all_to_all_counts(m->ep_group, x.send_counts, x.recv_counts, m->E_local);
    else memcpy(x.recv_counts, x.send_counts, (size_t)E * sizeof(int));
    m->counts_seconds += wall_time_s() - t0;
    moe_regroup(m, x);
    // all-to-all: (slots this rank keeps, C) out, (rows its experts take, C) in
    moe_exchange_start(m, x, lane->send, lane->recv, 0, r);
}

// Part 2: the experts on the rows that came, and their outputs posted home (r)
static inline void moe_forward_experts(Moe* m, MoeLayer x, LayerWeights w, MoeLane* lane, CommRequest* r) {
    int C = m->C, rows = *x.rows_taken;
    comm_wait(r);
    if (rows > 0) moe_gather_rows(x.xin, lane->recv, x.to_experts_dev, rows, C);
    // each local expert: a GPT-2 MLP over its rows (one GEMM per weight, as many rows as it took)
    for (int e = 0; e < m->E_local; e++) {
        int first, n = moe_expert_rows(m, x, e, &first);
        if (n == 0) continue;
        size_t f = (size_t)first;
        matmul_forward_gelu(x.fch_gelu + f * 4 * C, x.fch + f * 4 * C, x.xin + f * C, w.fcw + (size_t)e * 4 * C * C,
                            w.fcb + (size_t)e * 4 * C, n, C, 4 * C);
        matmul_forward(m->yout + f * C, x.fch_gelu + f * 4 * C, w.fcprojw + (size_t)e * C * 4 * C,
                       w.fcprojb + (size_t)e * C, n, 4 * C, C);
    }
    // 4. back to source order, all-to-all home (the reverse sizes) ...
    if (rows > 0) moe_gather_rows(lane->recv, m->yout, x.from_experts_dev, rows, C);
    moe_exchange_start(m, x, lane->recv, x.returned, 1, r);
}

// Part 3: ... and each token's weighted sum
static inline void moe_forward_combine(Moe* m, MoeLayer x, floatX* out, int N, CommRequest* r) {
    comm_wait(r);
    moe_combine(out, x.returned, x.row, x.gate, N, m->k, m->C, /*weighted*/ 1);
}

static inline void moe_forward(Moe* m, MoeLayer x, floatX* out, const floatX* h, LayerWeights w, int N) {
    CommRequest r;
    moe_forward_dispatch(m, x, h, w, N, &m->lanes[0], &r);
    moe_forward_experts(m, x, w, &m->lanes[0], &r);
    moe_forward_combine(m, x, out, N, &r);
}

// The backward. dout (N, C): the gradient at the MoE's output. Writes the gradient at h into
// dh_out (N, C); the expert gradients accumulate into g (this rank's experts), the router's into
// g.routerw. aux_weight: the loss's weight of one micro-batch's mean (the trainer's 1 / accum),
// used when -balance aux adds its loss. Part 1: the gates' gradients (for the router, part 3),
// then each kept slot's output gradient gate x dout posted to the experts (the same all-to-all
// as the forward's tokens).
static inline void moe_backward_dispatch(Moe* m, MoeLayer x, const floatX* dout, int N, MoeLane* lane, CommRequest* r) {
    moe_gate_grads(m->dgate, dout, x.returned, x.row, N, m->k, m->C);
    moe_dispatch(lane->send, dout, x.row, x.gate, N, m->k, m->C, /*weighted*/ 1);
    moe_exchange_start(m, x, lane->send, lane->recv, 0, r);
}

// Part 2: the experts' backward on the gradients that came, their input gradients posted home
static inline void moe_backward_experts(Moe* m, MoeLayer x, LayerWeights w, LayerWeights g, MoeLane* lane,
                                        CommRequest* r) {
    int C = m->C, rows = *x.rows_taken;
    comm_wait(r);
    if (rows > 0) moe_gather_rows(m->yout, lane->recv, x.to_experts_dev, rows, C);
    for (int e = 0; e < m->E_local; e++) {
        int first, n = moe_expert_rows(m, x, e, &first);
        if (n == 0) continue;
        size_t f = (size_t)first, w1 = (size_t)e * 4 * C * C, b1 = (size_t)e * 4 * C, w2 = (size_t)e * C * 4 * C,
               b2 = (size_t)e * C;
        floatX *dy = m->yout + f * C, *dfch = m->dfch + f * 4 * C;
        matmul_backward_input_gelu(dfch, dy, w.fcprojw + w2, x.fch + f * 4 * C, n, 4 * C, C);
        matmul_backward_weight(g.fcprojw + w2, g.fcprojb + b2, dy, x.fch_gelu + f * 4 * C, n, 4 * C, C);
        matmul_backward_input(dy, dfch, w.fcw + w1, n, C, 4 * C);  // dy is used up: the input gradient in its place
        matmul_backward_weight(g.fcw + w1, g.fcb + b1, dfch, x.xin + f * C, n, C, 4 * C);
    }
    // the input gradients home (the forward's way back) ...
    if (rows > 0) moe_gather_rows(lane->recv, m->yout, x.from_experts_dev, rows, C);
    moe_exchange_start(m, x, lane->recv, lane->send, 1, r);
}

// Part 3: ... summed per token over its kept slots; then the router's gradient
static inline void moe_backward_combine(Moe* m, MoeLayer x, floatX* dh_out, const floatX* h, LayerWeights w,
                                        LayerWeights g, int N, float aux_weight, MoeLane* lane, CommRequest* r) {
    int C = m->C, E = m->E, k = m->k;
    comm_wait(r);
    moe_combine(dh_out, lane->send, x.row, x.gate, N, k, C, /*weighted*/ 0);
    // the router: the logits' gradient ds (N, E) through the gates' softmax and, with -balance aux,
    // through the aux loss's P; the aux loss of the micro-batch is alpha E sum_e f_e P_e averaged
    // over its B sequences, P_e a mean over its tokens, so dP_e = aux_weight alpha E f_e / (B T):
    // T a cp rank's tokens of a sequence (T_seq / cp in the grid trainer, whose reduction then
    // averages over the cp ranks as it does the loss's gradient; with -sp a tp rank holds fewer,
    // and the routers' sum over tp adds up the rest)
    MoeTokens t = m->tokens;
    float aux_scale = m->balance == BALANCE_AUX ? aux_weight * m->aux_alpha * E / (float)((size_t)t.B * t.T) : 0.0f;
    moe_router_grad(m->scores, x.expert, x.gate, m->dgate, x.probs, x.shares, aux_scale, N, t.T, t.first, k, E);
    matmul_backward_weight(g.routerw, NULL, m->scores, h, N, C, E);
    matmul_backward_input(m->dh, m->scores, w.routerw, N, C, E);
    residual_forward(dh_out, dh_out, m->dh, N, C);
}

static inline void moe_backward(Moe* m, MoeLayer x, floatX* dh_out, const floatX* dout, const floatX* h, LayerWeights w,
                                LayerWeights g, int N, float aux_weight) {
    CommRequest r;
    moe_backward_dispatch(m, x, dout, N, &m->lanes[0], &r);
    moe_backward_experts(m, x, w, g, &m->lanes[0], &r);
    moe_backward_combine(m, x, dh_out, h, w, g, N, aux_weight, &m->lanes[0], &r);
}

// -balance bias (DeepSeek-V3, section 2.1.2: auxiliary-loss-free balancing): after the optimizer
// step, each expert's bias moves by gamma towards balance, b_e += gamma sign(mean load - load_e),
// the loads being the whole global batch's (this step's, all-reduced: identical on every rank).
static inline void moe_update_bias(Moe* m, const double* global_loads) {
    size_t n = (size_t)m->L * m->E;
    copy_device_to_host(m->bias_host, m->bias, n * sizeof(float));  // (a resumed run's, the first time)
    for (int l = 0; l < m->L; l++) {
        const double* load = global_loads + (size_t)l * m->E;
        double total = 0.0;  // (sign(mean - load_e) = sign(total - E load_e): exact in integers, where
        for (int e = 0; e < m->E; e++) total += load[e];  // a mean of E not a power of two rounds)
        for (int e = 0; e < m->E; e++) {
            double d = total - m->E * load[e];
            m->bias_host[(size_t)l * m->E + e] += m->bias_rate * (float)((d > 0) - (d < 0));
        }
    }
    copy_host_to_device(m->bias, m->bias_host, n * sizeof(float));
}

// the balance figures of a step's global loads (L, E): the fewest and most slots an expert got
// in any layer, the mean, and MaxVio = the largest over layers of max_e load / mean load - 1
static inline double moe_max_vio(const double* loads, int L, int E, double* least, double* most, double* mean) {
    double vio = 0.0;
    *least = INFINITY, *most = 0.0, *mean = 0.0;
    for (int l = 0; l < L; l++) {
        double layer_mean = 0.0, layer_most = 0.0;
        for (int e = 0; e < E; e++) {
            double x = loads[(size_t)l * E + e];
            layer_mean += x / E;
            layer_most = x > layer_most ? x : layer_most;
            *least = x < *least ? x : *least;
        }
        *most = layer_most > *most ? layer_most : *most;
        *mean += layer_mean / L;
        if (layer_mean > 0 && layer_most / layer_mean - 1.0 > vio) vio = layer_most / layer_mean - 1.0;
    }
    return vio;
}

// ----------------------------------------------------------------------------------------------
// What the trainers with experts share (train_gpt2_ep.cu, and train_gpt2_3d.cu with -experts)

// The flags of a model with experts, the same in both trainers: MOE_ARG_SPECS(flags) is their
// rows of a trainer's flag table (llmc/args.h)
typedef struct {
    int experts, topk, ep;
    const char* balance;
    float aux_alpha, bias_rate, capacity_factor;
} MoeFlags;
#define MOE_FLAGS_DEFAULT {0, 0, 1, "aux", 0.01f, 1e-3f, 0.0f}
#define MOE_ARG_SPECS(f)                                                                                                  \
    {"-experts", ARG_INT, &(f).experts, 0, 1024, "experts per layer, E >= 2 (0: the model file's); a descriptor (-e dL) needs it"}, \
    {"-topk", ARG_INT, &(f).topk, 0, 1024, "experts each token goes to, 1 <= k <= E (0: the model file's, or 2 with a descriptor)"}, \
    {"-ep", ARG_INT, &(f).ep, 1, 1024, "expert-parallel ranks: each holds E/ep experts; ep divides E and the ranks (train_gpt2_3d: a stage's dp x cp x tp)"}, \
    {"-balance", ARG_STRING, &(f).balance, 0, 0, "load balancing: aux (Switch's auxiliary loss), bias (DeepSeek-V3's routing bias) or none"}, \
    {"-aux_alpha", ARG_FLOAT, &(f).aux_alpha, 0, ARG_NO_MAX, "-balance aux: the aux loss's weight alpha"},                \
    {"-bias_rate", ARG_FLOAT, &(f).bias_rate, 0, ARG_NO_MAX, "-balance bias: the bias's step gamma"},                    \
    {"-capacity_factor", ARG_FLOAT, &(f).capacity_factor, 0, ARG_NO_MAX, "each expert takes at most ceil(cf N k / E) slots of a rank's micro-batch of N tokens (0: dropless)"}

static inline MoeBalance moe_balance_of(const char* name) {
    if (strcmp(name, "none") == 0) return BALANCE_NONE;
    if (strcmp(name, "bias") == 0) return BALANCE_BIAS;
    check_every_rank(strcmp(name, "aux") == 0, "-balance %s: expected aux, bias or none", name);
    return BALANCE_AUX;
}

// The model: a descriptor (-e dL) takes -experts and -topk (2 unless given); a model file brings
// its own, which the flags, when given, must repeat. dense_too: a dense model (a dense file, or a
// descriptor without -experts) is trained as one (the grid trainer); else it is refused. Every
// rank checks, and all stop together.
static inline GPT2Config moe_model_config(GPT2Config config, int from_descriptor, const char* model, MoeFlags f,
                                          int dense_too) {
    int experts = f.experts, topk = f.topk;
    if (dense_too && experts == 0 && !gpt2_is_moe(config)) {
        // a dense model takes none of the flags of experts: one given is named, not ignored
        MoeFlags d = MOE_FLAGS_DEFAULT;
        const char* given = topk != d.topk ? "-topk" : f.ep != d.ep ? "-ep" : strcmp(f.balance, d.balance) ? "-balance"
                          : f.aux_alpha != d.aux_alpha ? "-aux_alpha" : f.bias_rate != d.bias_rate ? "-bias_rate"
                          : f.capacity_factor != d.capacity_factor ? "-capacity_factor" : NULL;
        check_every_rank(given == NULL, "%s without -experts: -e %s is a dense model; give -experts E for a Mixture-of-"
                         "Experts one", given, model);
        return config;
    }
    if (from_descriptor) {
        check_every_rank(experts >= 2, "-e %s with -experts %d: a Mixture-of-Experts model needs -experts E >= 2 (E = 1 is "
                         "the dense GPT-2: train it with train_gpt2_dp)", model, experts);
        config.experts = experts;
        config.topk = topk > 0 ? topk : 2;
    } else {
        check_every_rank(gpt2_is_moe(config), "-e %s is a dense GPT-2 model file (no experts in its header): "
                         "train_gpt2_ep trains Mixture-of-Experts models (start one from a descriptor: -e d4 -experts 8)",
                         model);
        check_every_rank((experts == 0 || experts == config.experts) && (topk == 0 || topk == config.topk),
                         "-experts %d -topk %d: the model file %s has E=%d experts and top-k %d", experts, topk, model,
                         config.experts, config.topk);
    }
    check_every_rank(config.topk >= 1 && config.topk <= config.experts, "-topk %d: expected 1 <= k <= E = %d", config.topk,
                     config.experts);
    return config;
}

// the experts in a rank's flat buffer, its last region (model.h, expert_region): fcw .. fcprojb,
// each tensor's layers, each layer's E/ep experts; before them [0, lo) every dense tensor it
// holds, the replicated wte .. routerw and the final LayerNorm (or in a pipeline stage those of
// its stage, in tp slices)
static inline void moe_expert_range(const ParameterLayout* p, size_t* lo, size_t* hi) {
    *lo = p->count - p->expert_region;
    *hi = p->count;
}

// AdamW over the rank's buffer in its two ranges, the experts' gradients read scaled by
// expert_scale (each trainer says why its experts' gradients need one)
static inline void moe_adamw_step(GPT2* model, AdamWConfig opt, float clip_scale, float expert_scale, int step) {
    size_t lo, hi;
    moe_expert_range(&model->layout, &lo, &hi);
    float* master = model->master_memory;
    size_t ranges[2][2] = {{0, lo}, {lo, hi}};
    for (int r = 0; r < 2; r++) {
        size_t a = ranges[r][0], b = ranges[r][1];
        float scale = r == 1 ? clip_scale * expert_scale : clip_scale;
        optimizer_adamw_step(model->params_memory + a, master ? master + a : NULL, model->grads_memory + a,
                             model->m_memory + a, model->v_memory + a, a, b, &model->layout, opt, scale, step + 1);
    }
}

// -dump_grads: a copy of the rank's gradients with its experts' read as the optimizer reads them
// (scaled by expert_scale), on the device, for the trainer to gather into a model file and free
static inline floatX* moe_scaled_grads_copy(const GPT2* model, float expert_scale) {
    size_t lo, hi, n = model->layout.count;
    moe_expert_range(&model->layout, &lo, &hi);
    float* host = (float*)malloc_check(n * sizeof(float));
    copy_device_to_floats(host, model->grads_memory, n);
    for (size_t i = lo; i < hi; i++) host[i] *= expert_scale;
    floatX* scaled = (floatX*)device_malloc(n * sizeof(floatX));
    copy_floats_to_device(scaled, host, n);
    free(host);
    return scaled;
}

// The step's MoE figures over the whole global batch: the loads (L x E counts: each rank counted
// the tokens it routed in the layers it holds), the kept and dropped slots, summed over the world
// (an all-reduce of L E + 2 floats); the aux loss, every rank's sum over its layers and
// micro-batches summed over the world (one float) and divided by aux_copies, how many times the
// world counts each micro-batch's (the replicas' micro-batches, and every rank of a sequence's
// group holds its whole figures); -balance bias then moves the biases from the loads
typedef struct {
    double least, mean, most, max_vio, dropped_share, aux;
} MoeFigures;

static inline MoeFigures moe_step_figures(Moe* m, CommGroup* world, double aux_copies) {
    size_t n = (size_t)m->L * m->E;
    float* sums = (float*)malloc_check((n + 3) * sizeof(float));
    for (size_t i = 0; i < n; i++) sums[i] = (float)m->loads[i];  // (counts: exact in a float below 2^24)
    sums[n] = (float)m->kept_slots, sums[n + 1] = (float)m->dropped_slots;
    comm_all_reduce_host(world, sums, n + 2, COMM_SUM);  // (L E + 2) floats
    float aux = (float)m->aux;
    comm_all_reduce_scalar(world, &aux, COMM_SUM);
    double* loads = (double*)malloc_check(n * sizeof(double));
    for (size_t i = 0; i < n; i++) loads[i] = sums[i];
    MoeFigures f;
    f.max_vio = moe_max_vio(loads, m->L, m->E, &f.least, &f.most, &f.mean);
    f.dropped_share = sums[n + 1] / (sums[n] + sums[n + 1]);
    f.aux = aux / aux_copies;
    if (m->balance == BALANCE_BIAS) moe_update_bias(m, loads);
    free(sums);
    free(loads);
    return f;
}

// The step's MoE figures as JSON fields of its main.log record (the run layer writes them with
// the step's own)
static inline void moe_log_fields(char* out, size_t cap, MoeFigures f) {
    snprintf(out, cap, "\"moe\": {\"aux_loss\": %.9g, \"max_vio\": %.9g, \"dropped\": %.9g, \"tokens_per_expert\": "
             "[%.0f, %.9g, %.0f]}", f.aux, f.max_vio, f.dropped_share, f.least, f.mean, f.most);
}

// The grid trainer's second MoE line, rank 0's, every step: the time its all-to-alls over ep held
// up its compute (exposed: a blocking one whole, a posted one its post, progress and wait), the
// rows' and the counts' apart (the counts' still block: moe_forward_dispatch), and how many of
// its all-to-alls of rows moved while another micro-batch computed (the MoE overlap,
// -pp_overlap 1: llmc/pipeline_walk.h; else 0). The same run without the overlap shows what it
// hides.
static inline void moe_print_overlap(const Moe* m, int step) {
    double exposed = m->ep_group->seconds[COMM_ALL_TO_ALL];
    printf("step %d moe all-to-all: exposed %.3f ms (rows %.3f, counts %.3f) | %d under another "
           "micro-batch's compute\n", step + 1, exposed * 1e3, (exposed - m->counts_seconds) * 1e3,
           m->counts_seconds * 1e3, m->hidden);
}

// The step's MoE line, printed by rank 0: the balance figures, the step's all-to-all bytes (this
// rank's sends, tokens and counts: they follow the routing, so they change from step to step and
// are printed here, every step, rather than in the bytes block that prints only on a change)
// and, with -balance bias, the range of the biases after the step's update
static inline void moe_print_line(const Moe* m, int step, MoeFigures f) {
    printf("step %d moe: aux loss %.6f | tokens per expert min %.0f mean %.1f max %.0f | MaxVio %.6f | dropped %.4f%% | "
           "all-to-all %lld B", step + 1, f.aux, f.least, f.mean, f.most, f.max_vio, 100.0 * f.dropped_share,
           m->ep_group->bytes[COMM_ALL_TO_ALL]);
    if (m->balance == BALANCE_BIAS) {
        float lo = m->bias_host[0], hi = m->bias_host[0];  // (from the first bias: 0 is not one of them)
        for (int i = 1; i < m->L * m->E; i++) {
            lo = m->bias_host[i] < lo ? m->bias_host[i] : lo;
            hi = m->bias_host[i] > hi ? m->bias_host[i] : hi;
        }
        printf(" | bias %.4f..%.4f", lo, hi);
    }
    printf("\n");
}

#endif
