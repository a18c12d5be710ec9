/*
GPT-2 training with context parallelism (CP): every sequence split over the ranks, so that each
holds the activations of T/cp of its tokens. Ring attention (Liu et al. 2023, arXiv:2310.01889);
the zig-zag split that balances causal attention (Brandon et al. 2023, "Striped Attention",
arXiv:2311.09431, for the argument; Megatron-LM's and torchtitan's split); the all-gather variant
of Llama 3 (Dubey et al. 2024, arXiv:2407.21783).

Why: a layer's activations grow with B x T. Data parallelism cannot split one sequence, tensor
parallelism splits the model's width (and is bounded by the heads), pipelines split the layers:
at T = 32k a single sequence's activations still do not fit. Everything in a transformer but
attention works on each token alone, so the tokens of a sequence can be split over ranks like a
batch, and only attention, where every query needs the keys and values of every earlier token,
has to communicate.

One step, on each of the cp ranks (all ranks form one cp group; each holds the whole model):
1. Every rank reads the same global batch, B sequences of T tokens, and keeps its own T/cp tokens
   of each: contiguous (rank r the r-th T/cp) or zigzag (chunks r and 2cp-1-r of 2cp; -cp_layout).
   Its tokens keep their global positions: the position embeddings are wpe's rows at them.
2. Forward, layer by layer. The LayerNorms, the qkv and projection matmuls, the MLP and the
   residual adds run unchanged on the rank's B x T/cp tokens. Attention of its queries needs
   the keys and values of all the earlier tokens, which other ranks hold:
   ring       cp steps: at step s the rank holds the K,V block of rank r - s, computes its queries
              against it and merges the partial result by log-sum-exp, while passing the block
              on to rank r + 1 and receiving the next from rank r - 1 (send/recv, cp - 1 of them)
   allgather  one all-gather of every rank's K,V block into (cp, B, T/cp, 2C), rank after rank,
              then the same merge
   The causal mask decides per pair of chunks: keys wholly before the queries, wholly after
   (skipped: no work), or the same chunk (the diagonal).
3. The loss: cross-entropy of the rank's tokens, each token's gradient weighted 1/(B T accum),
   the global batch mean's weight; the printed loss is the ranks' mean (all-reduce of a float).
4. Backward, layers reversed. Attention's backward needs every (query, key) pair again: ring,
   the K,V blocks go round once more, and with each its gradient dK, dV (fp32), to which every
   rank adds its queries' part; after cp steps each returns to its owner. allgather: K,V
   gathered again, the dK, dV of the whole sequence reduce-scattered to their owners.
5. Each rank now has the gradient of its own tokens' loss terms: the model's gradient is their
   sum, an all-reduce (SUM, not AVG: the ranks' tokens are disjoint parts of one mean) of the
   whole gradient buffer over the cp group.
6. AdamW, the same on every rank: the replicas stay identical, as under data parallelism.

Choosing: CP divides every activation by cp (the weights and optimizer states not at all: with
ZeRO or TP beside it in a grid); it costs attention's K,V traffic, 2 (cp - 1)/cp B T C X per layer
forward, which hides behind the block computation when T is long. The zigzag split gives every
rank the same attention work; contiguous gives the last rank 2cp - 1 times the first's (-cp_layout
contiguous shows it).

The result matches one process training the whole model to fp32 rounding (checked against
PyTorch in test/).

Build: make train_gpt2_cp        Run: mpirun -np 2 ./train_gpt2_cp -e d6 -t 256 -x 20 -o out
The same source compiles as C for the CPU backend and as CUDA with nvcc (llmc/ops.h).
*/
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "llmc/utils.h"
#include "llmc/args.h"
#include "llmc/comm.h"
#include "llmc/gpt2.h"
#include "llmc/dataloader.h"
#include "llmc/ops.h"
#include "llmc/model.h"
#include "llmc/block.h"
#include "llmc/cp_layout.h"
#include "llmc/train.h"
#include "llmc/run.h"
#include "llmc/memory_plan.h"

// ----------------------------------------------------------------------------------------------
// This rank's place in the sequence and the buffers its attention needs (cp_scratch_bytes)

typedef struct {
    CommGroup* cp;   // every rank: the sequence is split over them
    CpSplit split;   // -cp_layout
    int allgather;   // -cp_comm allgather (else ring)
    floatX* kv[2];   // ring: two (B, Tl, 2C) blocks whose roles alternate: at step s the block
                     // computed on is kv[s % 2], the next one arrives in the other;
                     // allgather: kv[0] this rank's block
    floatX* kv_all;  // allgather: every rank's block, (cp, B, Tl, 2C), in rank order (with zigzag
                     // not the sequence's order: the chunks say where each token is)
    float* dkv[2];   // their gradients, fp32, the same shapes and roles
    float* dkv_all;
    float* o;        // (B, Tl, C) the attention output merged so far, fp32
    float* dq;       // (B, Tl, C) the queries' gradient, fp32
    float* D;        // (B, NH, Tl) the softmax backward's row sums
    floatX* wpe;     // (Tl, C) wpe's rows at this rank's positions ...
    floatX* dwpe;    // ... and their gradient
    double work;     // the (query, key) score products of this rank's attention so far (every
                     // layer's, micro-batch's and head's)
    double step_work;  // ... and in the last training step's forward passes
    DeviceSpans attention_time;  // the time computing attention blocks, forward and backward
    double step_attention_s;     // ... in the last training step
} ContextParallel;

static void cp_alloc(ContextParallel* cp, int B, int T, int C, int NH) {
    int Tl = T / cp->cp->size;
    size_t BTl = (size_t)B * Tl, X = sizeof(floatX), kv = BTl * 2 * C;
    char* p = (char*)device_malloc(cp_scratch_bytes(B, T, cp->cp->size, C, NH, (int)X, cp->allgather));
    cp->kv[0] = (floatX*)p, p += kv * X;
    cp->kv[1] = cp->kv_all = (floatX*)p, p += (cp->allgather ? (size_t)B * T * 2 * C : kv) * X;
    cp->dkv[0] = (float*)p, p += kv * sizeof(float);
    cp->dkv[1] = cp->dkv_all = (float*)p, p += (cp->allgather ? (size_t)B * T * 2 * C : kv) * sizeof(float);
    cp->o = (float*)p, p += BTl * C * sizeof(float);
    cp->dq = (float*)p, p += BTl * C * sizeof(float);
    cp->D = (float*)p, p += BTl * NH * sizeof(float);
    cp->wpe = (floatX*)p, p += (size_t)Tl * C * X;
    cp->dwpe = (floatX*)p;
}

// a micro-batch's tokens: this rank's of each of the B sequences (B, T) -> (B, Tl), in its order
static void cp_take_tokens(int* mine, const int* all, CpChunks c, int B, int T) {
    int Tl = c.n * c.len;
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < Tl; t++) mine[b * Tl + t] = all[b * T + cp_position(c, t)];
    }
}

// ----------------------------------------------------------------------------------------------
// Attention over the whole sequence from this rank's queries (step 2 of the header)

// atty (B, Tl, C) and lse (B, NH, Tl): attention of this rank's queries (q of qkv (B, Tl, 3C))
// to every earlier key of the sequence, block by block
static void cp_attention_forward(ContextParallel* cp, floatX* atty, float* lse, const floatX* qkv, CpChunks mine,
                                 int B, int T, int C, int NH) {
    CommGroup* g = cp->cp;
    int r = g->rank, n = g->size, Tl = T / n;
    size_t block = (size_t)B * Tl * 2 * C;
    kv_pack(cp->kv[0], qkv, B, Tl, C);  // the K and V of this rank's tokens: what travels
    if (cp->allgather && n > 1) {  // (one rank: nothing to gather, the ring's single step)
        // all-gather of the K,V blocks, (B, Tl, 2C) from each rank into (cp, B, Tl, 2C): the
        // whole sequence's keys and values on every rank at once (memory: B T 2C X)
        comm_all_gather(g, cp->kv[0], cp->kv_all, block, COMM_FLOATX);
        for (int s = 0; s < n; s++) {  // own block first: its queries see at least themselves
            int owner = (r + n - s) % n;
            CpChunks theirs = cp_chunks_of(cp->split, T, n, owner);
            device_span_begin(&cp->attention_time);
            attention_block_forward(cp->o, lse, qkv, cp->kv_all + owner * block, mine, theirs, B, C, NH, s == 0);
            device_span_end(&cp->attention_time);
            cp->work += B * NH * cp_attention_work(mine, theirs);
        }
    } else {
        for (int s = 0; s < n; s++) {  // (step 0: this rank's own block, which `first` needs)
            floatX* here = cp->kv[s % 2];  // the block of rank r - s
            int owner = (r + n - s) % n;
            CommRequest next;
            memset(&next, 0, sizeof(next));  // (none posted at the last step: comm_wait returns)
            if (s < n - 1) {
                // the ring: send this block (B, Tl, 2C) on to rank r + 1 and receive the next,
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
            attention_block_forward(cp->o, lse, qkv, here, mine, theirs, B, C, NH, s == 0);
            device_span_end(&cp->attention_time);
            cp->work += B * NH * cp_attention_work(mine, theirs);
            comm_wait(&next);  // the next block has arrived; `here` may be overwritten
        }
    }
    attention_block_output(atty, cp->o, (size_t)B * Tl * C);
}

// dqkv (B, Tl, 3C): the gradient at qkv from datty (B, Tl, C), with the forward's atty and lse
static void cp_attention_backward(ContextParallel* cp, floatX* dqkv, const floatX* datty, const floatX* atty,
                                  const float* lse, const floatX* qkv, CpChunks mine, int B, int T, int C, int NH) {
    CommGroup* g = cp->cp;
    int r = g->rank, n = g->size, Tl = T / n;
    size_t block = (size_t)B * Tl * 2 * C;
    attention_block_backward_prepare(cp->D, datty, atty, B, Tl, C, NH);
    device_memset_zero(cp->dq, (size_t)B * Tl * C * sizeof(float));
    kv_pack(cp->kv[0], qkv, B, Tl, C);
    float* own_dkv = cp->dkv[0];  // where this rank's block's dK, dV end up, summed over every
                                  // rank's queries (one rank: where its block stays)
    if (cp->allgather && n > 1) {
        // the keys and values again (all-gather of (B, Tl, 2C) per rank), and their gradient for
        // the whole sequence, summed over the ranks and scattered to the owners: reduce-scatter of
        // (cp, B, Tl, 2C) fp32, each rank left with its block's
        comm_all_gather(g, cp->kv[0], cp->kv_all, block, COMM_FLOATX);
        device_memset_zero(cp->dkv_all, (size_t)n * block * sizeof(float));
        for (int owner = 0; owner < n; owner++) {
            device_span_begin(&cp->attention_time);
            attention_block_backward(cp->dq, cp->dkv_all + owner * block, datty, lse, cp->D, qkv, cp->kv_all + owner * block,
                                     mine, cp_chunks_of(cp->split, T, n, owner), B, C, NH);
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
                // the ring again: the block (B, Tl, 2C) on to rank r + 1, the next from r - 1,
                // posted to travel while this one is computed (not after the last step: every
                // rank has seen the block then)
                CommMessage kv[2] = {comm_message(cp->kv[here], block, (r + 1) % n, 1),
                                     comm_message(cp->kv[1 - here], block, (r + n - 1) % n, 0)};
                comm_exchange_start(g, kv, 2, COMM_FLOATX, &next);
            }
            device_span_begin(&cp->attention_time);
            attention_block_backward(cp->dq, cp->dkv[here], datty, lse, cp->D, qkv, cp->kv[here], mine,
                                     cp_chunks_of(cp->split, T, n, owner), B, C, NH);
            device_span_end(&cp->attention_time);
            comm_wait(&next);
            if (n == 1) break;
            // the block's gradient so far, (B, Tl, 2C) fp32, follows it to rank r + 1 once this
            // rank has added its queries' part (so this exchange cannot overlap: it waits for
            // the compute); the gradient of the next block, rank r - s - 1's, arrives from rank
            // r - 1. Every step: after cp passes each gradient is back with its owner
            CommMessage dkv[2] = {comm_message(cp->dkv[here], block, (r + 1) % n, 1),
                                  comm_message(cp->dkv[1 - here], block, (r + n - 1) % n, 0)};
            comm_exchange(g, dkv, 2, COMM_FLOAT);
            own_dkv = cp->dkv[1 - here];  // after the last pass (s = cp - 1): this rank's own, home
        }
    }
    attention_block_grads(dqkv, cp->dq, own_dkv, B, Tl, C);
}

// ----------------------------------------------------------------------------------------------
// forward and backward of the model on one micro-batch of this rank's tokens, (B, Tl) of the
// sequences' T: the layers of the DP trainer, with cp_attention in the attention half

static void layer_forward(GPT2* model, ContextParallel* cp, LayerActs x, LayerWeights w, const floatX* residual,
                          CpChunks mine, int B, int T, int rerun) {
    LayerDims d = model->dims;
    int Tl = T / cp->cp->size, C = d.C;
    // the attention half (block.h's, with attention over the whole sequence): residual2 =
    // residual + attproj, fused with ln2. att_state keeps lse, (B, NH, Tl) fp32.
    matmul_forward(x.qkv, x.ln1, w.qkvw, w.qkvb, B * Tl, C, d.qkv);
    cp_attention_forward(cp, x.atty, (float*)x.att_state, x.qkv, mine, B, T, C, d.NH);
    matmul_forward(x.attproj, x.atty, w.attprojw, w.attprojb, B * Tl, C, C);
    fused_residual_layernorm_forward(x.residual2, x.ln2, x.ln2_mean, x.ln2_rstd, residual, x.attproj, w.ln2w, w.ln2b,
                                     B * Tl, C);
    // the MLP half, token by token
    if (rerun) mlp_half_forward_to_gelu(x, w, B, Tl, d);
    else mlp_half_forward(x, w, B, Tl, d);
}

// -r 1 and 2: what layer l's forward did not keep, again before its backward (model.h). -r 2
// reruns the layer whole: its attention's K,V go round the ring again.
static void layer_recompute(GPT2* model, ContextParallel* cp, LayerActs x, LayerWeights w, const floatX* residual,
                            CpChunks mine, int B, int T) {
    unsigned kept = model->acts.kept;
    int Tl = T / cp->cp->size;
    if (kept == KEEP_ALL) return;
    device_span_begin(&recompute_spans);
    if (layer_rerun_needed(kept)) {
        double work = cp->work;  // (the step's attention work counts each forward once)
        layernorm_forward(x.ln1, x.ln1_mean, x.ln1_rstd, residual, w.ln1w, w.ln1b, B * Tl, model->dims.C);
        layer_forward(model, cp, x, w, residual, mine, B, T, 1);
        cp->work = work;
    } else {
        layer_recompute_selective(x, kept, B, Tl, model->dims);  // (the GELU: lse is always kept)
    }
    device_span_end(&recompute_spans);
}

// inputs_host: this rank's (B, Tl) tokens of B sequences of T
static void gpt2_forward(GPT2* model, ContextParallel* cp, const int* inputs_host, int B, int T) {
    GPT2Config c = model->config;
    LayerDims d = model->dims;
    int L = c.num_layers, C = c.channels, Tl = T / cp->cp->size;
    ParameterTensors p = model->params;
    Activations* a = &model->acts;
    CpChunks mine = cp_chunks_of(cp->split, T, cp->cp->size, cp->cp->rank);
    tokens_to_device(model->inputs, &model->input_stage, inputs_host, (size_t)B * Tl);
    // the position embeddings of this rank's positions: wpe's rows of each of its chunks
    for (int i = 0; i < mine.n; i++) {
        copy_device_to_device(cp->wpe + (size_t)i * mine.len * C, p.wpe + (size_t)mine.index[i] * mine.len * C,
                              (size_t)mine.len * C * sizeof(floatX));
    }
    encoder_forward(a->encoded, model->inputs, p.wte, cp->wpe, B, Tl, C);
    LayerActs first = layer_acts(a, d, B, Tl, 0);
    layernorm_forward(first.ln1, first.ln1_mean, first.ln1_rstd, a->encoded, p.ln1w, p.ln1b, B * Tl, C);
    for (int l = 0; l < L; l++) {
        LayerActs x = layer_acts(a, d, B, Tl, l);
        floatX* residual = l == 0 ? a->encoded : layer_acts(a, d, B, Tl, l - 1).residual3;
        layer_forward(model, cp, x, gpt2_layer_params(model, l), residual, mine, B, T, 0);
        // residual3 = residual2 + fcproj, fused with the next LayerNorm (ln1 of l+1, or lnf)
        if (l + 1 < L) {
            LayerWeights wn = gpt2_layer_params(model, l + 1);
            LayerActs xn = layer_acts(a, d, B, Tl, l + 1);
            fused_residual_layernorm_forward(x.residual3, xn.ln1, xn.ln1_mean, xn.ln1_rstd, x.residual2, x.fcproj,
                                             wn.ln1w, wn.ln1b, B * Tl, C);
        } else {
            fused_residual_layernorm_forward(x.residual3, a->lnf, a->lnf_mean, a->lnf_rstd, x.residual2, x.fcproj, p.lnfw,
                                             p.lnfb, B * Tl, C);
        }
    }
    matmul_forward(a->logits, a->lnf, p.wte, NULL, B * Tl, C, c.padded_vocab_size);  // (B, Tl, Vp)
}

// accumulates this rank's tokens' share of every parameter's gradient; gpt2_loss left dlogits
static void gpt2_backward(GPT2* model, ContextParallel* cp, const int* inputs_host, int B, int T) {
    GPT2Config c = model->config;
    LayerDims d = model->dims;
    int L = c.num_layers, C = c.channels, Tl = T / cp->cp->size;
    ParameterTensors p = model->params, g = model->grads;
    Activations* a = &model->acts;
    CpChunks mine = cp_chunks_of(cp->split, T, cp->cp->size, cp->cp->rank);
    // LM head (a->logits holds dlogits) and the final LayerNorm
    matmul_backward(a->dbuf, g.wte, NULL, a->logits, a->lnf, p.wte, B * Tl, C, c.padded_vocab_size);
    device_memset_zero(a->dresidual, (size_t)B * Tl * C * sizeof(floatX));
    layernorm_backward(a->dresidual, g.lnfw, g.lnfb, a->dbuf, layer_acts(a, d, B, Tl, L - 1).residual3, p.lnfw,
                       a->lnf_mean, a->lnf_rstd, B * Tl, C);
    for (int l = L - 1; l >= 0; l--) {
        LayerWeights w = gpt2_layer_params(model, l), gw = gpt2_layer_grads(model, l);
        LayerActs x = layer_acts(a, d, B, Tl, l);
        floatX* residual = l == 0 ? a->encoded : layer_acts(a, d, B, Tl, l - 1).residual3;
        layer_recompute(model, cp, x, w, residual, mine, B, T);
        // a residual add passes dresidual to both of its inputs unchanged
        mlp_half_backward(a->dbuf, a->dfch, a->dresidual, x, w, gw, B, Tl, d);
        layernorm_backward(a->dresidual, gw.ln2w, gw.ln2b, a->dbuf, x.residual2, w.ln2w, x.ln2_mean, x.ln2_rstd, B * Tl,
                           C);
        // the attention half's backward (block.h's two passes, attention over the sequence
        // between them): datty in dbuf, dqkv, then dln1 into dbuf (datty is used up by then)
        matmul_backward_input(a->dbuf, a->dresidual, w.attprojw, B * Tl, C, C);
        cp_attention_backward(cp, a->dqkv, a->dbuf, x.atty, (const float*)x.att_state, x.qkv, mine, B, T, C, d.NH);
        matmul_backward_input(a->dbuf, a->dqkv, w.qkvw, B * Tl, C, d.qkv);
        attention_half_backward_weight(gw, a->dqkv, a->dresidual, x, B, Tl, d);
        layernorm_backward(a->dresidual, gw.ln1w, gw.ln1b, a->dbuf, residual, w.ln1w, x.ln1_mean, x.ln1_rstd, B * Tl, C);
    }
    // the embeddings: wte's rows of this rank's tokens; the gradient of its positions' wpe rows,
    // then added into wpe's gradient at those positions
    device_memset_zero(cp->dwpe, (size_t)Tl * C * sizeof(floatX));
    encoder_backward(g.wte, cp->dwpe, a->dresidual, inputs_host, B, Tl, C);
    for (int i = 0; i < mine.n; i++) {
        floatX* rows = g.wpe + (size_t)mine.index[i] * mine.len * C;
        residual_forward(rows, rows, cp->dwpe + (size_t)i * mine.len * C, mine.len, C);
    }
}

// ----------------------------------------------------------------------------------------------
// Validation and samples (the run layer, llmc/run.h, calls these)

typedef struct {
    GPT2* model;
    ContextParallel* cp;
    int* inputs;   // (B, Tl) this rank's tokens of a micro-batch
    int* targets;
} Context;

// one validation batch: every rank reads the same sequences and evaluates its tokens' mean loss;
// the run layer averages over the ranks (val_replicas: equal token counts, so the global mean)
static float val_loss(void* trainer, DataLoader* val) {
    Context* t = (Context*)trainer;
    GPT2* m = t->model;
    int T = m->T * t->cp->cp->size;  // (the model holds B x Tl tokens: Tl = T / cp)
    CpChunks mine = cp_chunks_of(t->cp->split, T, t->cp->cp->size, t->cp->cp->rank);
    dataloader_load_chunk(val, 0, m->config.vocab_size);
    cp_take_tokens(t->inputs, val->inputs, mine, m->B, T);
    cp_take_tokens(t->targets, val->targets, mine, m->B, T);
    gpt2_forward(m, t->cp, t->inputs, m->B, T);
    return gpt2_loss(m, t->targets, m->B, T / t->cp->cp->size, 0.0f);
}

// a sample's forward pass, (1, T) split as training's (T at most training's: run.h keeps a
// sample within -t, so the buffers sized for it hold): this rank's logits, (1, Tl, Vp)
static const floatX* sample_logits(void* trainer, const int* tokens, int T) {
    Context* t = (Context*)trainer;
    CpChunks mine = cp_chunks_of(t->cp->split, T, t->cp->cp->size, t->cp->cp->rank);
    cp_take_tokens(t->inputs, tokens, mine, 1, T);
    gpt2_forward(t->model, t->cp, t->inputs, 1, T);
    return t->model->acts.logits;
}

// where position `position` of a T-token sample is: the rank holding it (returned in owner) and
// its row there (-1 on the others)
static int sample_row(void* trainer, int T, int position, int* owner) {
    Context* t = (Context*)trainer;
    int n = t->cp->cp->size;
    for (int r = 0; r < n; r++) {
        CpChunks c = cp_chunks_of(t->cp->split, T, n, r);
        for (int i = 0; i < c.n; i++) {
            if (position / c.len == c.index[i]) {
                *owner = r;
                return r == t->cp->cp->rank ? i * c.len + position % c.len : -1;
            }
        }
    }
    fail("sample position %d of %d on no rank", position, T);
    return -1;
}

// ----------------------------------------------------------------------------------------------
// The communication of one step from the layout alone: per layer and micro-batch a = B Tl 2C
// bytes of K,V (floatX) per block. Ring: forward (cp - 1) blocks sent and as many received;
// backward (cp - 1) again, plus cp blocks of dK,dV in fp32. Allgather: per layer forward and
// backward one all-gather each of cp blocks, backward one reduce-scatter of cp fp32 blocks. Per
// step: the gradient all-reduce P X, the loss's (4 bytes), the norm's none (every
// rank holds the whole summed gradient).
typedef struct {
    double send, recv, all_gather, reduce_scatter, all_reduce;
} StepBytes;

static StepBytes cp_step_bytes(GPT2Config c, int B, int T, int cp, int accum, int allgather, int rerun) {
    double X = sizeof(floatX), L = c.num_layers, kv = (double)B * (T / cp) * 2 * c.channels;
    double passes = 2 + (rerun ? 1 : 0);  // attention runs forward, backward (and again with -r 2)
    StepBytes b = {0, 0, 0, 0, gpt2_num_parameters(c) * X + 4.0};
    if (cp == 1) return b;
    if (allgather) {
        b.all_gather = accum * L * passes * cp * kv * X;
        b.reduce_scatter = accum * L * cp * kv * 4;
    } else {
        b.send = b.recv = accum * L * (passes * (cp - 1) * kv * X + cp * kv * 4);
    }
    return b;
}

// what rank 0 prints at the start: the layout, the split of the sequence and each rank's
// attention work, the memory per rank and the communication per step with its formula
static void print_layout(const Run* run, const ContextParallel* cp, int accum) {
    const TrainArgs* args = &run->args;
    GPT2Config c = run->config;
    int n = cp->cp->size, T = args->T;
    BannerRow rows[16];
    int k = train_banner_model(rows, "train_gpt2_cp (CP)", args->model, c);
    banner_row(&rows[k++], "context parallel", "%d ranks, %s split, %s", n, cp_split_name(cp->split),
               cp->allgather ? "all-gather of K,V" : "ring of K,V");
    banner_row(&rows[k++], "micro-batch B x T", "%d x %d (%d tokens a sequence per rank)", args->B, T, T / n);
    banner_row(&rows[k++], "accumulation steps", "%d", accum);
    banner_row(&rows[k++], "recomputation", "%s", recompute_names[args->recompute]);
    k = run_banner_rows(run, rows, k);
    train_print_banner(rows, k);
    printf("the sequence's chunks on each rank, and its attention work (score products per sequence and head):\n");
    for (int r = 0; r < n && r < 16; r++) {
        CpChunks mine = cp_chunks_of(cp->split, T, n, r);
        double work = 0.0;
        for (int j = 0; j < n; j++) work += cp_attention_work(mine, cp_chunks_of(cp->split, T, n, j));
        printf("  rank %2d  positions", r);
        for (int i = 0; i < mine.n; i++) printf(" %d-%d", mine.index[i] * mine.len, (mine.index[i] + 1) * mine.len - 1);
        printf("  work %.0f (%.2f of the mean T (T+1) / 2cp)\n", work, work / ((double)T * (T + 1) / 2 / n));
    }
    printf("memory per rank, Psi = the model's parameters (every rank holds them all; activations of T/cp tokens):\n");
    memory_plan_print(&run->plan, c, &run->layout);
    int rerun = layer_rerun_needed(activations_kept(args->recompute, 0, run->plan.dims));  // (-r 2)
    StepBytes b = cp_step_bytes(c, args->B, T, n, accum, cp->allgather, rerun);
    double kv = (double)args->B * (T / n) * 2 * c.channels;
    printf("communication per step (payload per rank), blocks of K,V of B T/cp 2C X = %.0f bytes:\n", kv * sizeof(floatX));
    if (cp->allgather) {
        printf("  all-gather     %12.0f bytes  %d L cp B T/cp 2C X per micro-batch (forward, %sbackward)\n", b.all_gather,
               2 + rerun, rerun ? "again before the backward, " : "");
        printf("  reduce-scatter %12.0f bytes  L cp B T/cp 2C 4 per micro-batch (dK, dV in fp32)\n", b.reduce_scatter);
    } else {
        printf("  send, recv     %12.0f bytes  each: L (%d (cp-1) B T/cp 2C X + cp B T/cp 2C 4) per micro-batch\n", b.send,
               2 + rerun);
    }
    printf("  all-reduce     %12.0f bytes  P X (the gradients, SUM) + 4 (the loss)\n", b.all_reduce);
}

int main(int argc, char** argv) {
    // ---- the flags: the common ones (llmc/train.h) and this trainer's own; then the
    // communication layer and the model's config (llmc/run.h)
    Run run;
    const char* dump_grads = NULL;
    const char* split_name = "zigzag";
    const char* comm_name = "ring";
    int cp_flag = 0, check_replicas = 0;
    const ArgSpec own[] = {
        {"-cp", ARG_INT, &cp_flag, 0, ARG_NO_MAX, "context-parallel ranks; all ranks form one group, so it must equal the number of ranks (0: the number of ranks)"},
        {"-cp_layout", ARG_STRING, &split_name, 0, 0, "how a sequence is split: zigzag (chunks r and 2cp-1-r of 2cp: equal attention work) or contiguous"},
        {"-cp_comm", ARG_STRING, &comm_name, 0, 0, "how attention gets the other ranks' keys and values: ring (send/recv, cp-1 steps) or allgather"},
        {"-dump_grads", ARG_STRING, &dump_grads, 0, 0, "write the gradients of the first step here, as a model file (tests)"},
        {"-check_replicas", ARG_INT, &check_replicas, 0, ARG_NO_MAX, "every N steps check that all ranks hold the same model (0: never)"},
    };
    if (!run_start(&run, &argc, &argv, own, sizeof(own) / sizeof(own[0]))) return 0;
    CommGroup* world = &run.world;  // one context-parallel group of every rank (the 3D trainer splits it)
    int rank = world->rank, ranks = world->size;
    GPT2Config config = run.config;

    // ---- the layout: every rank the whole model and T/cp tokens of each sequence
    run_check_one_group(&run, "-cp", cp_flag, "one context-parallel group");
    ContextParallel cp;
    memset(&cp, 0, sizeof(cp));
    cp.cp = world;
    if (strcmp(split_name, "zigzag") != 0 && strcmp(split_name, "contiguous") != 0) {
        fail("-cp_layout %s: expected zigzag or contiguous", split_name);
    }
    if (strcmp(comm_name, "ring") != 0 && strcmp(comm_name, "allgather") != 0) {
        fail("-cp_comm %s: expected ring or allgather", comm_name);
    }
    cp.split = strcmp(split_name, "zigzag") == 0 ? CP_ZIGZAG : CP_CONTIGUOUS;
    cp.allgather = strcmp(comm_name, "allgather") == 0;
    int B = run.args.B, T = run.args.T, chunks = (cp.split == CP_ZIGZAG ? 2 : 1) * ranks;
    if (T % chunks != 0) {
        fail("-t %d: the %s split cuts each sequence into %d chunks (%s), so T must divide by %d", T, split_name, chunks,
             cp.split == CP_ZIGZAG ? "2 cp" : "cp", chunks);
    }
    if (config.channels / config.num_heads > RING_MAX_HEAD) {
        fail("head size C/NH = %d: the block-attention kernels hold at most %d", config.channels / config.num_heads,
             RING_MAX_HEAD);
    }
    int Tl = T / ranks;
    LayerDims dims = layer_dims(config, /*tp*/ 1, /*sp*/ 0);
    dims.target.flash = 1;  // attention keeps lse, (B, NH, Tl) fp32, as flash attention does
    int accum = train_accumulation_steps(&run.args, /*readers*/ 1, NULL);

    // ---- memory, checked before allocating: the whole model's states, the activations of
    // B x Tl tokens, the attention's blocks (llmc/memory_plan.h)
    ParameterLayout layout = parameter_layout(config, 1, 0);
    RunLayout plan = run_layout(&run, TRAINER_CP, accum);
    plan.cp = ranks;
    plan.cp_allgather = cp.allgather;
    plan.dump_grads = dump_grads != NULL;
    run_check_memory(&run, plan, 0, "the whole model and %d of %d tokens a sequence per rank, -b %d", Tl, T, B);

    // ---- the weights, the data (a step is accum chunks of B x T, each read by every rank, which
    // keeps its tokens), the run's identity without the layout (the ranks train one model whatever
    // the split: a checkpoint resumes at any cp, split or variant), the output dir
    float* weights = run_load(&run, accum, /*val_chunks*/ 1, NULL);
    GPT2 model;
    gpt2_build(&model, config, dims, layout, weights, B, Tl, ACTS_ALL,
               activations_kept(run.args.recompute, /*weights_later*/ 0, dims), /*offload*/ 0);
    free(weights);
    cp_alloc(&cp, B, T, config.channels, config.num_heads);
    if (rank == 0) print_layout(&run, &cp, accum);

    // ---- resume with -y 1 (a checkpoint of any cp); validation and samples with the sequence split
    // as in training
    Context trainer = {&model, &cp, (int*)malloc_check((size_t)B * Tl * sizeof(int)),
                       (int*)malloc_check((size_t)B * Tl * sizeof(int))};
    RunModel hooks = run_model(&model, &trainer, val_loss, sample_logits);
    hooks.val_replicas = world;     // each rank the mean of its tokens: the mean over the ranks
    hooks.seq = world;              // a sample's positions split over the ranks
    hooks.seq_row = sample_row;
    hooks.sample_pad = chunks;      // (a sample padded to whole chunks; causal: the padding is unseen)
    hooks.replicas = world;         // checkpoints: every rank a replica; rank 0 writes the state in
    hooks.split = world;            // the model file's layout, which any cp reads (the split: none)
    run_begin(&run, hooks, &world, 1);  // (world: the group whose bytes each step reports)

    // ---- training loop; `step` counts completed optimizer steps
    CpChunks mine = cp_chunks_of(cp.split, T, ranks, rank);
    for (int step = run.start_step; step <= run.max_steps; step++) {
        if (run_between_steps(&run, step)) break;  // validation, a sample, a checkpoint: when due
        run_step_begin(&run);
        device_spans_collect(&cp.attention_time);  // (validation's and samples' blocks are not the step's)
        // 1-4. forward + backward over the micro-batches, every rank on its tokens of the same
        // sequences; gradients accumulate. Each token's gradient is weighted 1/(B*T*accum), T the
        // whole sequence's: the step's loss is the mean over all B T accum tokens, of which this
        // rank holds B Tl accum.
        watchdog_phase("forward and backward", step);
        device_memset_zero(model.grads_memory, model.num_parameters * sizeof(floatX));
        cp.work = 0.0;
        float loss = 0.0f;
        float dloss = 1.0f / (float)((size_t)B * T * accum);
        for (int micro = 0; micro < accum; micro++) {
            watchdog_beat();
            dataloader_load_chunk(&run.train, micro, config.vocab_size);
            cp_take_tokens(trainer.inputs, run.train.inputs, mine, B, T);
            cp_take_tokens(trainer.targets, run.train.targets, mine, B, T);
            gpt2_forward(&model, &cp, trainer.inputs, B, T);
            loss += gpt2_loss(&model, trainer.targets, B, Tl, dloss) / (float)accum;
            gpt2_backward(&model, &cp, trainer.inputs, B, T);
        }
        dataloader_advance(&run.train);
        cp.step_work = cp.work;
        // 5. the model's gradient is the sum of the ranks' parts: all-reduce (SUM) of the whole
        // buffer, P floatX; the loss, the mean of the ranks' token means (AVG, one float)
        watchdog_phase("gradient all-reduce", step);
        comm_all_reduce(world, model.grads_memory, model.num_parameters, COMM_FLOATX, COMM_SUM);
        comm_all_reduce_scalar(world, &loss, COMM_AVG);  // (equal token counts: the global mean)
        // the norm of the summed gradient, the same on every rank
        float grad_norm = sqrtf(global_norm_squared(model.grads_memory, model.num_parameters));
        train_stop_if_not_finite(step, loss, grad_norm);
        // 6. AdamW, the same update on every rank
        watchdog_phase("AdamW update", step);
        float clip_scale, lr = train_adamw_step(&model, &run.args, step, run.max_steps, grad_norm, &clip_scale);
        run_step_end(&run, step, loss, lr, grad_norm, clip_scale);
        cp.step_attention_s = device_spans_collect(&cp.attention_time);  // (the step has finished)
        if (check_replicas > 0 && (step + 1) % check_replicas == 0) {
            train_check_replicas(&model, world, step + 1, NULL, "replicas");
        }
        // after the step's count (AdamW left the gradients): rank 0's, the whole model's
        if (dump_grads != NULL && step == 0 && rank == 0) gpt2_write_gathered(&model, NULL, model.grads_memory, dump_grads);
    }
    run_end(&run);
    // each rank's attention work (score products) and time computing it in the last step: the
    // balance of the split, measured (the exchanges' waiting is in the step line's "exposed")
    for (int r = 0; r < ranks && run.max_steps > run.start_step; r++) {
        float figures[2] = {r == rank ? (float)cp.step_work : 0.0f, r == rank ? (float)cp.step_attention_s : 0.0f};
        comm_all_reduce_scalar(world, &figures[0], COMM_SUM);
        comm_all_reduce_scalar(world, &figures[1], COMM_SUM);
        if (rank == 0) printf("rank %d: attention work %.0f score products a step, %.1f ms computing it\n", r, figures[0], 1e3 * figures[1]);
    }
    free(trainer.inputs);
    free(trainer.targets);
    gpt2_free(&model);
    comm_finalize();
    return 0;
}
