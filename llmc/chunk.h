// What a pipeline stage computes for one action of its schedule (pipeline.h): the forward (F) or
// backward (B) of one chunk of its layers on one micro-batch, and zero bubble's weight gradients
// (W). Shared by train_gpt2_pp.cu (each stage whole: tp NULL) and train_gpt2_3d.cu (each stage
// split over its tp ranks, Megatron's collectives inside: llmc/tensor_parallel.h). The walk that
// calls them, with the exchanges between stages, is llmc/pipeline_walk.h. A trainer whose ranks
// each hold the whole model (train_gpt2_diloco.cu) runs the same pass as one stage of one chunk
// (whole_model_walk, at the end).
//
// BTs is the number of tokens of the residual stream on this rank: B*T, or B*T/tp with -sp; it is
// also what travels between stages.
#ifndef LLMC_CHUNK_H
#define LLMC_CHUNK_H

#include "block.h"
#include "model.h"
#include "moe.h"
#include "stage.h"
#include "tensor_parallel.h"

// A pass of one chunk over one micro-batch: an F's forward or a B's backward, run to its end
// (chunk_forward, chunk_backward) or step by step (chunk_forward_step, chunk_backward_step): with
// experts each MoE layer stops where it has posted an all-to-all of rows (llmc/moe.h's three
// parts), and goes on, from that all-to-all's wait, at the next step. The walk's MoE overlap
// (pipeline_walk.h) steps an F&B pair's two passes in turn, so that one's all-to-all moves while
// the other computes; run to its end, a pass does exactly the same work in the same order.
typedef struct {
    int chunk;
    Activations* slot;    // the micro-batch's activations (its slot of the stage)
    floatX* dresidual;    // B: the gradient at the chunk's output, then at its input (stage.h's grad)
    const int *inputs, *targets;  // the micro-batch's tokens on the host (walk_tokens)
    int split;            // B: zero bubble's B (the matmuls' weight gradients left to W)
    int begun;            // the chunk's first step has run (the embedding, or the LM head's backward)
    int k;                // the layer the pass is in (the forward counts up, the backward down)
    int part;             // an MoE layer's next part: 0 dispatch, 1 the experts, 2 combine (moe.h)
    MoeLane* lane;        // where its rows wait while they travel (moe.h)
    CommRequest exchange; // its all-to-all in flight, between two parts
    float loss;           // F: the micro-batch's mean loss on the last virtual stage (else 0)
} ChunkPass;

static inline ChunkPass chunk_pass(Walk* walk, int chunk, Activations* slot, floatX* dresidual, const int* inputs,
                                   const int* targets, int split) {
    ChunkPass p;
    memset(&p, 0, sizeof(p));
    p.chunk = chunk, p.slot = slot, p.dresidual = dresidual, p.inputs = inputs, p.targets = targets, p.split = split;
    p.lane = walk->st->moe ? &walk->st->moe->lanes[0] : NULL;
    return p;
}

// A Mixture-of-Experts model's layer k of the chunk in slot `a` (the grid trainer with experts):
// the slot's record holds what the forward of its micro-batch leaves for the backward, as the
// slot holds its other activations; the model's layer says which bias it routes with
static inline MoeLayer chunk_moe_layer(const Walk* walk, const Activations* a, int chunk, int k) {
    const Stage* st = walk->st;
    int j = chunk * st->chunk_layers + k;  // the rank's layer (layers are stored chunk after chunk)
    return moe_layer(st->moe, &st->moe->records[a - st->slots], k, layout_layer(&walk->model->layout, j));
}

// An MoE layer's forward, one part a call (moe.h): the attention half as a dense layer's
// (tensor_parallel.h) and the routing up to the rows' all-to-all; the experts; the combine. The
// MoE layer stands in the MLP half's place on this rank's B T/seq_shards tokens. Nothing of it is
// split over tp: the experts are whole (expert tp = 1), and with -sp each tp rank routes its own
// share of the tokens, so no token is routed twice and no tp collective is needed around it; its
// output x.fcproj (BTs, C) goes straight to the residual add. Returns 1 when the part posted an
// all-to-all (the layer goes on at the next call), 0 when x.fcproj is ready.
static inline int moe_layer_forward(Walk* walk, ChunkPass* f, LayerActs x, LayerWeights w, const floatX* residual,
                                    int k) {
    GPT2* model = walk->model;
    Moe* moe = walk->st->moe;
    int BTs = (int)((size_t)walk->B * walk->T / model->dims.seq_shards);
    MoeLayer layer = chunk_moe_layer(walk, f->slot, f->chunk, k);
    if (f->part == 0) {
        tp_attention_forward(model, walk->tp, walk->cp, x, w, residual, walk->B, walk->T);
        moe_forward_dispatch(moe, layer, x.ln2, w, BTs, f->lane, &f->exchange);
    } else if (f->part == 1) {
        moe_forward_experts(moe, layer, w, f->lane, &f->exchange);
    } else {
        moe_forward_combine(moe, layer, x.fcproj, BTs, &f->exchange);
    }
    f->part = (f->part + 1) % 3;
    return f->part != 0;
}

// Its backward, the same way: the MoE layer's three parts (the gradient at the layer's output,
// b->dresidual, is the gradient at the MoE's output: the residual add passes it on), then with
// the last ln2's and the attention half's. The experts' weight gradients come with it even under
// zero bubble's split: they wait for the all-to-all's rows, which the B action has in hand.
// aux_weight 1/m: the aux loss of each of the step's m micro-batches weighs as its cross-entropy
// does. Returns 1 when the part posted an all-to-all, 0 when the layer is done.
static inline int moe_layer_backward(Walk* walk, ChunkPass* b, LayerActs x, LayerWeights w, LayerWeights gw,
                                     const floatX* residual, int k) {
    GPT2* model = walk->model;
    LayerDims d = model->dims;
    Moe* moe = walk->st->moe;
    Activations* scratch = &model->acts;
    int BTs = (int)((size_t)walk->B * walk->T / d.seq_shards);
    MoeLayer layer = chunk_moe_layer(walk, b->slot, b->chunk, k);
    if (b->part == 0) {
        moe_backward_dispatch(moe, layer, b->dresidual, BTs, b->lane, &b->exchange);
    } else if (b->part == 1) {
        moe_backward_experts(moe, layer, w, gw, b->lane, &b->exchange);
    } else {
        moe_backward_combine(moe, layer, scratch->dbuf, x.ln2, w, gw, BTs, 1.0f / (float)walk->st->spec.m, b->lane,
                             &b->exchange);
        layernorm_backward(b->dresidual, gw.ln2w, gw.ln2b, scratch->dbuf, x.residual2, w.ln2w, x.ln2_mean, x.ln2_rstd,
                           BTs, d.C);
        tp_attention_backward(model, walk->tp, walk->cp, x, w, gw, residual, b->dresidual, walk->B, walk->T, b->split);
    }
    b->part = (b->part + 1) % 3;
    return b->part != 0;
}

// The chunk's input is in a->encoded (BTs, C): the embedding (first virtual stage) or what the
// stage before sent. Its output stays in the last layer's residual3 (BTs, C), to be sent on; on
// the last virtual stage the loss is computed instead, and the logits (this rank's
// (B, T, Vp/tp) with tp) become their gradient, each token weighted by dloss, and f->loss is the
// micro-batch's mean loss there, else 0. Returns 1 when it stopped at an MoE layer's posted
// all-to-all (call it again to go on), 0 at the chunk's end.
static inline int chunk_forward_step(Walk* walk, ChunkPass* f) {
    GPT2* model = walk->model;
    Stage* st = walk->st;
    CommGroup* tp = walk->tp;
    GPT2Config c = model->config;
    LayerDims d = model->dims;
    Activations* a = f->slot;
    int chunk = f->chunk, B = walk->B, T = walk->T, C = c.channels, Lc = st->chunk_layers, sp = d.seq_shards > 1;
    size_t BT = (size_t)B * T;
    int BTs = (int)(BT / d.seq_shards);
    ParameterTensors p = model->params;
    Activations* scratch = &model->acts;  // the backward's buffers; the -sp staging buffers
    if (!f->begun) {
        f->begun = 1;
        // the position embeddings: wpe's first T rows, or with cp its rows at this rank's positions
        const floatX* wpe = walk->cp && is_first_virtual(st, chunk) ? cp_positions(walk->cp, p.wpe, T, C) : p.wpe;
        if (is_first_virtual(st, chunk) && tp == NULL) {
            tokens_to_device(model->inputs, &model->input_stage, f->inputs, BT);
            encoder_forward(a->encoded, model->inputs, p.wte, wpe, B, T, C);
        } else if (is_first_virtual(st, chunk)) {
            // the vocabulary-parallel embedding: this rank's Vp/tp rows of wte (other tokens look up
            // zeros), wpe added by tp rank 0 alone; then g: all-reduce of the partial (B, T, C) over
            // tp, or with -sp a reduce-scatter into this rank's tokens
            vocab_parallel_tokens(model->inputs, &model->input_stage, f->inputs, BT, tp->rank, d.Vp_rank);
            floatX* partial = sp ? scratch->dbuf : a->encoded;
            encoder_forward(partial, model->inputs, p.wte, tp->rank == 0 ? wpe : NULL, B, T, C);
            sum_over_ranks(tp, partial, a->encoded, BT, C, sp);
        }
        // the chunk's first LayerNorm on its own: the residual add before it ran on another stage
        LayerActs first = layer_acts(a, d, B, T, 0);
        LayerWeights w0 = gpt2_layer_params(model, chunk * Lc);
        layernorm_forward(sp ? scratch->ln_shard : first.ln1, first.ln1_mean, first.ln1_rstd, a->encoded, w0.ln1w,
                          w0.ln1b, BTs, C);
    }
    for (; f->k < Lc; f->k++) {
        int k = f->k;
        LayerActs x = layer_acts(a, d, B, T, k);  // the slot's layer
        floatX* residual = k == 0 ? a->encoded : layer_acts(a, d, B, T, k - 1).residual3;
        LayerWeights w = gpt2_layer_params(model, chunk * Lc + k);
        floatX* fcproj = x.fcproj;
        if (st->moe) {
            if (moe_layer_forward(walk, f, x, w, residual, k)) return 1;  // (an all-to-all on its way)
        } else {
            fcproj = tp_layer_forward(model, tp, walk->cp, x, w, residual, B, T, 0);
        }

        if (k + 1 < Lc) {  // the next layer's LayerNorm fused with this residual add
            LayerWeights wn = gpt2_layer_params(model, chunk * Lc + k + 1);
            LayerActs xn = layer_acts(a, d, B, T, k + 1);
            fused_residual_layernorm_forward(x.residual3, sp ? scratch->ln_shard : xn.ln1, xn.ln1_mean, xn.ln1_rstd,
                                             x.residual2, fcproj, wn.ln1w, wn.ln1b, BTs, C);
        } else if (is_last_virtual(st, chunk)) {  // the model's last layer: lnf follows
            fused_residual_layernorm_forward(x.residual3, sp ? scratch->ln_shard : a->lnf, a->lnf_mean, a->lnf_rstd,
                                             x.residual2, fcproj, p.lnfw, p.lnfb, BTs, C);
        } else {  // a stage boundary: the plain residual add, whose (BTs, C) output travels on
            residual_forward(x.residual3, x.residual2, fcproj, BTs, C);
        }
    }
    f->loss = 0.0f;
    if (!is_last_virtual(st, chunk)) return 0;
    // f before the LM head (column-parallel over the vocabulary): identity, or with -sp the
    // all-gather of lnf to (B, T, C); the logits (B, T, Vp/tp) from this rank's rows of wte, the
    // last stage's copy
    gather_tokens(tp, scratch->ln_shard, a->lnf, BT, C, sp);
    matmul_forward(a->logits, a->lnf, p.wte, NULL, (int)BT, C, d.Vp_rank);
    // with tp, the vocabulary-parallel loss: all-reduces over tp of (B, T) row maxima and
    // (B, T, 2) sums
    if (tp) {
        f->loss = vocab_parallel_loss(model, tp, a, f->targets, B, T, walk->dloss);
        return 0;
    }
    tokens_to_device(model->targets, &model->target_stage, f->targets, BT);
    fused_classifier(a->logits, a->losses, model->targets, walk->dloss, (int)BT, c.vocab_size, d.Vp_rank);
    const float* losses = losses_to_host(model, a->losses, BT);
    double sum = 0.0;
    for (size_t i = 0; i < BT; i++) sum += losses[i];
    f->loss = (float)(sum / BT);
    return 0;
}

// the forward of one chunk, to its end (the walk; a whole model's, whole_model_walk): returns the
// micro-batch's mean loss on the last virtual stage, else 0
static inline float chunk_forward(Walk* walk, Activations* a, int chunk, const int* inputs_host,
                                  const int* targets_host) {
    ChunkPass f = chunk_pass(walk, chunk, a, NULL, inputs_host, targets_host, 0);
    while (chunk_forward_step(walk, &f)) {}
    return f.loss;
}

// The backward of one chunk: b->dresidual (BTs, C) holds the gradient at the chunk's output (the
// stage after sent it), except on the last virtual stage, which starts from the dlogits. At the
// end dresidual holds the gradient at the chunk's input, to be sent back; the first virtual
// stage scatters it into wte (its rows) and wpe instead. Parameter gradients accumulate. With
// split (zero bubble's B action) only the input gradients are computed, the path the stage before
// waits for; the matmuls' weight gradients wait for W (chunk_weights), which finds what it needs
// in the slot (tp_layer_backward says where). LayerNorm and embedding gradients are cheap and
// come with the input gradient, so B computes them. Returns 1 when it stopped at an MoE layer's
// posted all-to-all, 0 at the chunk's end.
static inline int chunk_backward_step(Walk* walk, ChunkPass* b) {
    GPT2* model = walk->model;
    Stage* st = walk->st;
    CommGroup* tp = walk->tp;
    GPT2Config c = model->config;
    LayerDims d = model->dims;
    Activations* a = b->slot;
    floatX* dresidual = b->dresidual;
    int chunk = b->chunk, B = walk->B, T = walk->T, C = c.channels, Lc = st->chunk_layers, sp = d.seq_shards > 1;
    size_t BT = (size_t)B * T, X = sizeof(floatX);
    int BTs = (int)(BT / d.seq_shards);
    ParameterTensors p = model->params, g = model->grads;
    Activations* scratch = &model->acts;
    if (!b->begun) {
        b->begun = 1;
        b->k = Lc - 1;
        if (is_last_virtual(st, chunk)) {
            // the LM head: dlnf (B, T, C) (with tp a partial one, from this rank's vocabulary) and
            // the wte copy's gradient (its rows); f's backward: all-reduce of dlnf, with -sp
            // reduce-scatter; then lnf's backward starts dresidual
            matmul_backward_input(scratch->dbuf, a->logits, p.wte, (int)BT, C, d.Vp_rank);
            if (!b->split) matmul_backward_weight(g.wte, NULL, a->logits, a->lnf, (int)BT, C, d.Vp_rank);
            floatX* dlnf = sum_over_ranks(tp, scratch->dbuf, scratch->reduced, BT, C, sp);
            device_memset_zero(dresidual, (size_t)BTs * C * X);
            layernorm_backward(dresidual, g.lnfw, g.lnfb, dlnf, layer_acts(a, d, B, T, Lc - 1).residual3, p.lnfw,
                               a->lnf_mean, a->lnf_rstd, BTs, C);
        }
    }
    for (; b->k >= 0; b->k--) {
        int k = b->k;
        LayerWeights w = gpt2_layer_params(model, chunk * Lc + k), gw = gpt2_layer_grads(model, chunk * Lc + k);
        LayerActs x = layer_acts(a, d, B, T, k);
        floatX* residual = k == 0 ? a->encoded : layer_acts(a, d, B, T, k - 1).residual3;
        if (st->moe) {
            if (moe_layer_backward(walk, b, x, w, gw, residual, k)) return 1;  // (an all-to-all on its way)
        } else {
            tp_layer_backward(model, tp, walk->cp, x, w, gw, a->kept, residual, dresidual, B, T, b->split);
        }
        // (the F&B overlap: the pair's forward output, posted before this backward, moves between
        // its layers; an MPI request moves only while its rank is inside MPI)
        if (walk->overlap_pairs) comm_progress(walk->pp);
    }
    if (is_first_virtual(st, chunk)) {
        // g's backward at the embedding: identity, or with -sp all-gather of dresidual to
        // (B, T, C); the tokens scatter into wte (with tp this rank's rows), every position into
        // wpe (with cp into the rows of this rank's positions, added back at them). The tokens
        // are read on the host, where the buckets of positions per token are sorted (with tp
        // this rank's table of them, a stage of its own, never waiting for a copy)
        floatX* dencoded = gather_tokens(tp, dresidual, scratch->dgathered, BT, C, sp);
        const int* tokens = tp ? vocab_parallel_tokens(NULL, &model->token_table, b->inputs, BT, tp->rank, d.Vp_rank)
                               : b->inputs;
        encoder_backward(g.wte, walk->cp ? cp_position_grads(walk->cp, T, C) : g.wpe, dencoded, tokens, B, T, C);
        if (walk->cp) cp_add_position_grads(walk->cp, g.wpe, T, C);
    }
    return 0;
}

// the backward of one chunk, to its end, from and into dresidual (chunk_backward_step)
static inline void chunk_backward(Walk* walk, Activations* a, floatX* dresidual, int chunk, const int* inputs_host,
                                  int split) {
    ChunkPass b = chunk_pass(walk, chunk, a, dresidual, inputs_host, NULL, split);
    while (chunk_backward_step(walk, &b)) {}
}

// Zero bubble's W action: the matmuls' weight gradients of a chunk whose B has run, from each
// matmul's input and the gradient at its output, both left in the slot by B. It needs no
// collective, even with tensor parallelism: a slice's weight gradient needs only the slice's
// input and output gradient. Nothing waits for it: it fills the bubble.
static inline void chunk_weights(Walk* walk, Activations* a, int chunk) {
    GPT2* model = walk->model;
    LayerDims d = model->dims;
    int B = walk->B, T = walk->T, Lc = walk->st->chunk_layers;
    for (int k = Lc - 1; k >= 0; k--) {
        LayerWeights gw = gpt2_layer_grads(model, chunk * Lc + k);
        LayerActs x = layer_acts(a, d, B, T, k);
        if (!walk->st->moe) mlp_half_backward_weight(gw, x.fch, x.fcproj, x, B, T, d);  // (MoE: done in B)
        attention_half_backward_weight(gw, x.qkv, x.attproj, x, B, T, d);
    }
    if (is_last_virtual(walk->st, chunk)) {  // the LM head's wte (this rank's Vp rows): dlogits^T @ lnf
        matmul_backward_weight(model->grads.wte, NULL, a->logits, a->lnf, B * T, d.C, d.Vp_rank);
    }
}

// The whole model as one pipeline stage holding one chunk of every layer, with no tp or cp
// group: the walk with which chunk_forward and chunk_backward (chunk 0, the first and the last
// virtual stage at once) are a whole model's forward (embedding, layers, LM head, loss) and
// backward. The stage needs no slots: the caller hands the model's own activations as the slot.
// st is the caller's, filled here; dloss weights each token in the gradient (0: forward only).
static inline Walk whole_model_walk(GPT2* model, Stage* st, int B, int T, float dloss) {
    memset(st, 0, sizeof(*st));
    st->spec.p = st->spec.m = st->spec.V = 1;
    st->chunk_layers = model->layout.layers;
    Walk w = walk_init(model, st, /*pp*/ NULL, /*tp*/ NULL, /*cp*/ NULL, B, T);
    w.dloss = dloss;
    return w;
}

#endif
