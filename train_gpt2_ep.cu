/*
GPT-2 with Mixture-of-Experts MLPs (Shazeer et al. 2017, arXiv:1701.06538), trained with expert
parallelism folded over data parallelism (GShard, Lepikhin et al. 2020, arXiv:2006.16668; Switch
Transformer, Fedus et al. 2021, arXiv:2101.03961; DeepSeek-V3, arXiv:2412.19437, section 2.1.2
for the bias balancing).

Every layer's MLP is E experts, each a GPT-2 MLP (fc C->4C, GELU, fcproj 4C->C), and a router
that sends each token to k of them (-experts E -topk k). A token's output is the gate-weighted sum
of its experts' outputs, so it pays for k MLPs while the model holds E. The experts are split over
-ep ranks (E/ep each); everything else (attention, LayerNorms, embeddings, routers) is replicated
on every rank, which is a data-parallel replica for it.

The ranks: N ranks in N/ep groups of ep consecutive ranks (an "EP group": together they hold all
E experts, each rank E/ep of them); the ranks holding the same experts (rank r, r + ep, ...) are
an expert-data-parallel group, whose copies of those experts stay identical.

Each step:
  1. every rank runs forward + backward on its own micro-batches (its own data, as DDP). In every
     layer the MLP half is an MoE layer; llmc/moe.h's moe_forward and moe_backward run it, and
     read in this order they are the chapter's code:
       a. route (moe_route): router logits s = h Wr^T; on the device each token's top-k experts
          and their gates (moe_topk: llmc/cpu/moe.h, llmc/cuda/moe.cuh), then the capacity
          assignment (moe_assign_rows): which slots each expert keeps, each kept slot's row in
          send order, and each expert's count;
       b. the counts all-to-all (comm_all_to_all_counts: how many rows each rank sends to each
          expert), then the tokens all-to-all (moe_exchange) to the ranks of their experts;
       c. the expert GEMMs: each rank runs its experts on the rows they received, one GEMM per
          weight per expert;
       d. back: the outputs by the reverse all-to-all (moe_exchange again), and the combine
          (moe_combine): each token sums gate x output over its kept slots.
     The backward (moe_backward) runs it in reverse, two more all-to-alls per layer, and ends with
     the router gradient (moe_router_grad): through the gates' softmax, and the aux loss's.
  2. the gradients: the replicated parameters' all-reduced (average) over all N ranks, as DDP;
     each expert's over its expert-data-parallel group (N/ep ranks); the optimizer reads the
     experts' scaled by 1/ep (expert_grad_scale says why).
  3. AdamW, the same update on every copy of each parameter.
  4. balancing: -balance aux adds the Switch loss to the loss (its gradient reaches the routers);
     -balance bias moves each expert's routing bias towards balance after the step, from the loads
     of the whole global batch (an all-reduce of E counts per layer).

Build: make train_gpt2_ep          Run: mpirun -np 2 ./train_gpt2_ep -e d4 -experts 8 -topk 2 -ep 2 -x 100 -o out
The same source compiles as C for the CPU backend and as CUDA with nvcc (llmc/ops.h).
*/
#include <float.h>
#include <math.h>
#include <stdint.h>
#include "llmc/utils.h"
#include "llmc/args.h"
#include "llmc/comm.h"
#include "llmc/gpt2.h"
#include "llmc/dataloader.h"
#include "llmc/tokenizer.h"
#include "llmc/schedule.h"
#include "llmc/logger.h"
#include "llmc/checkpoint.h"
#include "llmc/rng.h"
#include "llmc/watchdog.h"
#include "llmc/ops.h"
#include "llmc/memory.h"
#include "llmc/model.h"
#include "llmc/block.h"
#include "llmc/optimizer.h"
#include "llmc/train.h"
#include "llmc/run.h"
#include "llmc/memory_plan.h"
#include "llmc/moe.h"

typedef struct {
    GPT2* model;
    Moe* moe;
    CommGroup* world;      // every rank: the replicated parameters' data-parallel group
    CommGroup* ep_group;   // the ep ranks that hold all the experts between them
    CommGroup* edp_group;  // the ranks that hold the same experts
} ExpertParallel;

// ----------------------------------------------------------------------------------------------
// forward and backward of the whole model on one micro-batch: train_gpt2_dp.cu's passes (without
// its ZeRO buckets and recomputation), except in the MLP half of each layer. Where DP calls
// mlp_half_forward (block.h: fc, GELU, fcproj on this rank's tokens), this pass calls
// moe_forward; where DP calls mlp_half_backward, moe_backward; every other line is DP's. Every
// rank runs every layer on its own B x T tokens (data parallel); only inside the MoE layers do
// tokens leave their rank: to the ranks of the experts their router chose, and back. Between the
// MoE layers the ranks are independent, as in DDP.

static void gpt2_forward(ExpertParallel* t, const int* inputs_host, int B, int T) {
    GPT2* model = t->model;
    GPT2Config c = model->config;
    LayerDims d = model->dims;
    int L = c.num_layers, C = c.channels;
    Activations* a = &model->acts;
    ParameterTensors p = model->params;
    tokens_to_device(model->inputs, &model->input_stage, inputs_host, (size_t)B * T);
    encoder_forward(a->encoded, model->inputs, p.wte, p.wpe, B, T, C);
    LayerWeights w0 = gpt2_layer_params(model, 0);
    LayerActs first = layer_acts(a, d, B, T, 0);
    layernorm_forward(first.ln1, first.ln1_mean, first.ln1_rstd, a->encoded, w0.ln1w, w0.ln1b, B * T, C);
    for (int l = 0; l < L; l++) {
        LayerActs x = layer_acts(a, d, B, T, l);
        LayerWeights w = gpt2_layer_params(model, l);
        floatX* residual = l == 0 ? a->encoded : layer_acts(a, d, B, T, l - 1).residual3;
        // the attention half, replicated weights on this rank's tokens: no communication (block.h)
        attention_half_forward(x, w, B, T, d);
        fused_residual_layernorm_forward(x.residual2, x.ln2, x.ln2_mean, x.ln2_rstd, residual, x.attproj, w.ln2w,
                                         w.ln2b, B * T, C);
        // the MLP half: the router, then the experts behind the all-to-alls over the EP group,
        // counts first (E/ep ints a rank pair), then (slots, C) rows out and (slots, C) outputs
        // back, each a rank's kept slots for the other ranks' experts (llmc/moe.h). x.fcproj
        // receives the gate-weighted sum, where a dense layer's fcproj would be, for the residual
        moe_forward(t->moe, moe_layer(t->moe, t->moe->records, l, l), x.fcproj, x.ln2, w, B * T);
        if (l + 1 < L) {
            LayerWeights wn = gpt2_layer_params(model, l + 1);
            LayerActs xn = layer_acts(a, d, B, T, l + 1);
            fused_residual_layernorm_forward(x.residual3, xn.ln1, xn.ln1_mean, xn.ln1_rstd, x.residual2, x.fcproj,
                                             wn.ln1w, wn.ln1b, B * T, C);
        } else {
            fused_residual_layernorm_forward(x.residual3, a->lnf, a->lnf_mean, a->lnf_rstd, x.residual2, x.fcproj,
                                             p.lnfw, p.lnfb, B * T, C);
        }
    }
    matmul_forward(a->logits, a->lnf, p.wte, NULL, B * T, C, d.Vp_rank);  // the LM head, tied to wte
}

// accumulates one micro-batch's gradients into model->grads; aux_weight: the aux loss's weight
// of one micro-batch (1 / accum, as the cross-entropy's mean)
static void gpt2_backward(ExpertParallel* t, const int* inputs_host, int B, int T, float aux_weight) {
    GPT2* model = t->model;
    GPT2Config c = model->config;
    LayerDims d = model->dims;
    int L = c.num_layers, C = c.channels;
    Activations* a = &model->acts;
    ParameterTensors p = model->params, g = model->grads;
    // LM head (a->logits holds dlogits, from the loss) and the final LayerNorm
    matmul_backward(a->dbuf, g.wte, NULL, a->logits, a->lnf, p.wte, B * T, C, d.Vp_rank);
    device_memset_zero(a->dresidual, (size_t)B * T * C * sizeof(floatX));
    layernorm_backward(a->dresidual, g.lnfw, g.lnfb, a->dbuf, layer_acts(a, d, B, T, L - 1).residual3, p.lnfw,
                       a->lnf_mean, a->lnf_rstd, B * T, C);
    for (int l = L - 1; l >= 0; l--) {
        LayerWeights w = gpt2_layer_params(model, l), gw = gpt2_layer_grads(model, l);
        LayerActs x = layer_acts(a, d, B, T, l);
        floatX* residual = l == 0 ? a->encoded : layer_acts(a, d, B, T, l - 1).residual3;
        // the MoE layer's backward: the gates' gradients here; the outputs' gradients (slots, C)
        // to the experts by the forward's all-to-all, the experts' input gradients (slots, C)
        // home by its reverse; the router's gradient, with the aux loss's. Then ln2's. The
        // experts' weight gradients accumulate on the ranks that hold them, from every rank's tokens
        moe_backward(t->moe, moe_layer(t->moe, t->moe->records, l, l), a->dbuf, a->dresidual, x.ln2, w, gw, B * T, aux_weight);
        layernorm_backward(a->dresidual, gw.ln2w, gw.ln2b, a->dbuf, x.residual2, w.ln2w, x.ln2_mean, x.ln2_rstd, B * T, C);
        // a residual add passes dresidual on unchanged; the attention half as in DDP
        attention_half_backward(a->dbuf, a->dbuf, a->dqkv, a->dresidual, x, w, gw, B, T, d);
        layernorm_backward(a->dresidual, gw.ln1w, gw.ln1b, a->dbuf, residual, w.ln1w, x.ln1_mean, x.ln1_rstd, B * T, C);
    }
    // the embeddings (the tied wte takes the LM head's gradient and the lookups')
    encoder_backward(g.wte, g.wpe, a->dresidual, inputs_host, B, T, C);
}

// ----------------------------------------------------------------------------------------------
// the reduction and the update

// 2. the gradients reduced: the replicated tensors, the buffer's first lo floats, all-reduced
// (average) over all ranks, as DDP; this rank's experts after them (hi - lo) over the ranks
// holding the same experts. (Each expert's gradient is then ep x the average over all ranks:
// expert_grad_scale.)
static void reduce_gradients(ExpertParallel* t) {
    GPT2* model = t->model;
    size_t lo, hi;
    moe_expert_range(&model->layout, &lo, &hi);
    comm_all_reduce(t->world, model->grads_memory, lo, COMM_FLOATX, COMM_AVG);
    if (t->edp_group->size > 1) comm_all_reduce(t->edp_group, model->grads_memory + lo, hi - lo, COMM_FLOATX, COMM_AVG);
}

// The factor the optimizer (and the norm, and -dump_grads) reads the experts' gradients with:
// 1/ep. The loss is the mean over the global batch of N ranks' tokens, which the replicated
// parameters get by averaging their N gradients. An expert's gradient on its rank already sums
// the tokens of all ep ranks of its EP group (they came to it through the all-to-all), each
// weighted 1/(B T accum) as its own rank's mean; averaged over its N/ep copies it is then
// sum over N ranks / (N/ep) = ep x the average over all N ranks. Scaled by 1/ep, it is the
// gradient of the same global mean, the one a single GPU would compute.
static float expert_grad_scale(const ExpertParallel* t) { return 1.0f / (float)t->ep_group->size; }

// the global gradient norm: the replicated part once, plus every expert once (the sum of squares
// of this rank's experts, scaled by expert_grad_scale squared, all-reduced over the EP group: one float)
static float grad_norm(ExpertParallel* t) {
    GPT2* model = t->model;
    size_t lo, hi;
    moe_expert_range(&model->layout, &lo, &hi);
    float scale = expert_grad_scale(t);
    float experts = global_norm_squared(model->grads_memory + lo, hi - lo) * scale * scale;
    comm_all_reduce_scalar(t->ep_group, &experts, COMM_SUM);
    float replicated = global_norm_squared(model->grads_memory, lo);
    return sqrtf(replicated + experts);
}

// -dump_grads: the first step's gradients as the reference's grads.bin: the replicated ones as
// reduced, each expert's read as the optimizer reads it (expert_grad_scale), gathered over one EP group (the
// others hold copies) into the model file's layout
static void write_gradients(ExpertParallel* t, const char* path) {
    if (t->edp_group->rank != 0) return;
    floatX* scaled = moe_scaled_grads_copy(t->model, expert_grad_scale(t));
    gpt2_write_gathered(t->model, t->ep_group, scaled, path);
    device_free(scaled);
}

// ----------------------------------------------------------------------------------------------
// A nan or inf loss or gradient norm: where it first appears. A step computes the forward's
// activations, then the loss, then the gradients in the backward's order (the final LayerNorm,
// layers L-1 down to 0, the embeddings); a nan or inf spreads to everything computed from it,
// so the first place holding one is where to look. A loss: the last micro-batch's residual
// stream and each half's output, layer by layer (each rank its own tokens). A gradient norm:
// each tensor's gradient of each layer as the norm reads it (its experts' scaled), where a value
// is not finite or the tensor's own sum of squares overflows fp32, as a norm of inf needs. Each
// rank finds its first place; the earliest over all ranks is named (by rank 0), then the run
// stops as every trainer's does (train.h). (llmc/ has no such search; DiLoCo's link names the
// tensor and layer of a bad value in its own pieces, outer_link.h.)
#define PLACE_NONE 1000000  // (more places than any model has)
static const int forward_places = 8;  // a layer's, in the order it computes them (below)
static const int backward_order[PER_LAYER_TENSORS] = {PARAM_FCPROJW, PARAM_FCPROJB, PARAM_FCW, PARAM_FCB, PARAM_ROUTERW,
                                                      PARAM_LN2W, PARAM_LN2B, PARAM_ATTPROJW, PARAM_ATTPROJB, PARAM_QKVW,
                                                      PARAM_QKVB, PARAM_LN1W, PARAM_LN1B};

// place i of the forward: its values (B T `width` of them) and its name
static const floatX* forward_place(const GPT2* model, int i, char* name, size_t size, int* width) {
    const Activations* a = &model->acts;
    LayerDims d = model->dims;
    int L = model->config.num_layers;
    static const char* names[8] = {"ln1 (its input, normalised)", "qkv", "atty (attention's output)",
                                   "attproj (the attention half's output)", "residual2 (the stream after attention)",
                                   "ln2 (the MoE layer's input)", "fcproj (the MoE layer's output)",
                                   "residual3 (the layer's output)"};
    *width = d.C;
    if (i == 0) {
        snprintf(name, size, "encoded (the embeddings' output)");
        return a->encoded;
    }
    if (i == 1 + forward_places * L) {
        snprintf(name, size, "lnf (the final LayerNorm's output)");
        return a->lnf;
    }
    int l = (i - 1) / forward_places, j = (i - 1) % forward_places;
    LayerActs x = layer_acts(a, d, model->B, model->T, l);
    const floatX* values[8] = {x.ln1, x.qkv, x.atty, x.attproj, x.residual2, x.ln2, x.fcproj, x.residual3};
    *width = j == 1 ? d.qkv : j == 2 ? d.att : d.C;
    snprintf(name, size, "layer %d's %s", l, names[j]);
    return values[j];
}

// place i of the backward: tensor, layer (-1: not per layer), and this rank's values of it
static int backward_place(const GPT2* model, int i, int* layer, size_t* first, size_t* count) {
    const ParameterLayout* p = &model->layout;
    int L = model->config.num_layers, per_layer = PER_LAYER_TENSORS * L, tensor;
    *layer = -1;
    if (i < 2) {  // the final LayerNorm
        tensor = i == 0 ? PARAM_LNFW : PARAM_LNFB;
    } else if (i < 2 + per_layer) {  // layers L-1 .. 0, each in backward_order
        tensor = backward_order[(i - 2) % PER_LAYER_TENSORS];
        *layer = L - 1 - (i - 2) / PER_LAYER_TENSORS;
    } else {  // the embeddings: wpe, then wte (the lookups' gradient comes last)
        tensor = i == 2 + per_layer ? PARAM_WPE : PARAM_WTE;
    }
    *first = p->offsets[tensor] + (*layer >= 0 ? (size_t)*layer * p->layer_stride[tensor] : 0);
    *count = *layer >= 0 ? p->layer_stride[tensor] : p->sizes[tensor];
    return tensor;
}

// rank 0's line: what it found (found: a place number, or PLACE_NONE)
static void print_first_non_finite(const GPT2* model, int step, float loss, int found) {
    char name[128];
    if (!isfinite(loss)) {
        int width;
        if (found == PLACE_NONE) snprintf(name, sizeof(name), "none of the last micro-batch's (an earlier one's?)");
        else forward_place(model, found, name, sizeof(name), &width);
        fprintf(stderr, "step %d: the loss is %g; the forward pass's first non-finite values: %s\n", step + 1, loss, name);
        return;
    }
    int layer = -1, tensor = -1;
    size_t first, count;
    if (found != PLACE_NONE) tensor = backward_place(model, found, &layer, &first, &count);
    char of_layer[32] = "";
    if (layer >= 0) snprintf(of_layer, sizeof(of_layer), " of layer %d", layer);
    fprintf(stderr, "step %d: the gradient norm is not finite; the backward's first gradient that is not, or whose "
            "squares overflow fp32: %s%s\n", step + 1, tensor >= 0 ? parameter_names[tensor] : "none alone (their sum overflows)",
            of_layer);
}

// every rank: its first place, the earliest over the ranks, rank 0's line
static void name_first_non_finite(ExpertParallel* t, int step, float loss) {
    GPT2* model = t->model;
    int L = model->config.num_layers, in_forward = !isfinite(loss);
    int places = in_forward ? 2 + forward_places * L : 4 + PER_LAYER_TENSORS * L, found = PLACE_NONE;
    size_t lo, hi, tokens = (size_t)model->B * model->T, most = tokens * model->dims.qkv;
    moe_expert_range(&model->layout, &lo, &hi);
    for (int i = 0; i < places && !in_forward; i++) {  // (the largest tensor, for the host buffer)
        int layer;
        size_t first, count;
        backward_place(model, i, &layer, &first, &count);
        most = count > most ? count : most;
    }
    float* host = (float*)malloc_check(most * sizeof(float));
    for (int i = 0; i < places && found == PLACE_NONE; i++) {
        double squares = 0.0, scale = 1.0;
        int layer, bad = 0;
        size_t first = 0, count;
        if (in_forward) {
            char name[128];
            int width;
            const floatX* values = forward_place(model, i, name, sizeof(name), &width);
            count = tokens * width;
            copy_device_to_floats(host, values, count);
        } else {
            backward_place(model, i, &layer, &first, &count);
            if (first >= lo && first < hi) scale = expert_grad_scale(t);
            copy_device_to_floats(host, model->grads_memory + first, count);
        }
        for (size_t j = 0; j < count; j++) {
            bad |= !isfinite(host[j]);
            squares += (double)host[j] * host[j] * scale * scale;
        }
        if (bad || (!in_forward && squares > FLT_MAX)) found = i;
    }
    free(host);
    float earliest = -(float)found;  // (place numbers are small integers: exact in a float)
    comm_all_reduce_scalar(t->world, &earliest, COMM_MAX);
    if (t->world->rank == 0) print_first_non_finite(model, step, loss, (int)-earliest);
}

// A non-finite loss or gradient norm stops every rank: where it first appears, then the flags
// whose steps could have caused it: -l, and with -balance aux its alpha, which scales the aux
// loss's gradient at the routers
static void stop_if_not_finite(ExpertParallel* t, int step, float loss, float norm) {
    if (isfinite(loss) && isfinite(norm)) return;
    name_first_non_finite(t, step, loss);
    train_stop_if_not_finite_hint(step, loss, norm, t->moe->balance == BALANCE_AUX ? "-l, or -aux_alpha (the aux "
                                  "loss's weight: it scales the aux loss's gradient at every router)" : "-l");
}

// ----------------------------------------------------------------------------------------------
// validation and samples run the same forward pass (every rank: the experts are split over them)

static float val_loss(void* trainer, DataLoader* val) {
    ExpertParallel* t = (ExpertParallel*)trainer;
    GPT2* model = t->model;
    dataloader_load_chunk(val, t->world->rank, model->config.vocab_size);
    gpt2_forward(t, val->inputs, model->B, model->T);
    return gpt2_loss(model, val->targets, model->B, model->T, 0.0f);
}

static const floatX* sample_logits(void* trainer, const int* tokens, int T) {
    ExpertParallel* t = (ExpertParallel*)trainer;
    gpt2_forward(t, tokens, 1, T);
    return t->model->acts.logits;
}

// ----------------------------------------------------------------------------------------------

static void print_layout(const Run* run, const GPT2* model, const Moe* moe, int accum) {
    const TrainArgs* args = &run->args;
    GPT2Config c = model->config;
    BannerRow rows[20];
    int n = train_banner_model(rows, "train_gpt2_ep (MoE)", args->model, c);
    banner_row(&rows[n++], "experts, top-k", "%d experts, each token to %d", c.experts, c.topk);
    banner_row(&rows[n++], "ranks", "%d: %d EP group%s of %d (%d experts a rank)", run->world.size,
               run->world.size / moe->ep, run->world.size / moe->ep > 1 ? "s" : "", moe->ep, moe->E_local);
    banner_row(&rows[n++], "micro-batch B x T", "%d x %d", args->B, args->T);
    banner_row(&rows[n++], "accumulation steps", "%d", accum);
    banner_row(&rows[n++], "recomputation", "%s", recompute_names[args->recompute]);
    banner_row(&rows[n++], "balancing", "%s", moe->balance == BALANCE_AUX ? "aux loss (-balance aux)"
                                              : moe->balance == BALANCE_BIAS ? "routing bias (-balance bias)" : "none");
    if (moe->capacity_factor > 0) {
        banner_row(&rows[n++], "capacity", "%d slots an expert per micro-batch (-capacity_factor %g)", moe->capacity,
                   moe->capacity_factor);
    } else {
        banner_row(&rows[n++], "capacity", "dropless (-capacity_factor 0)");
    }
    n = run_banner_rows(run, rows, n);
    train_print_banner(rows, n);
    // the all-to-all's bytes: per MoE layer and micro-batch, each way (tokens out, outputs back;
    // the backward the same again), a rank sends the slots routed off-rank, (ep - 1)/ep of its
    // N k when the routing is balanced, C values each
    double N = (double)args->B * args->T, X = sizeof(floatX);
    printf("all-to-all per MoE layer and micro-batch, each of 4 (forward out and back, backward out and back), "
           "balanced: N k C X (ep-1)/ep = %.0f bytes (N = %.0f tokens)\n",
           N * c.topk * c.channels * X * (moe->ep - 1) / moe->ep, N);
    printf("memory per rank, Psi = this rank's parameters (the replicated ones and its %d experts of each layer: %zu "
           "of the model's %zu):\n", moe->E_local, (size_t)model->num_parameters, (size_t)gpt2_num_parameters(c));
    memory_plan_print(&run->plan, c, &run->layout);
}

// The model (llmc/moe.h: a descriptor and -experts, or an MoE model file), and ep dividing E and
// the ranks. Every rank checks, and all stop together.
static GPT2Config moe_config(const Run* run, MoeFlags flags, int ep) {
    GPT2Config config = moe_model_config(run->config, run->from_descriptor, run->args.model, flags, /*dense_too*/ 0);
    check_every_rank(config.experts % ep == 0 && run->world.size % ep == 0, "-ep %d: expert parallelism splits the E = %d "
                     "experts over ep ranks of the %d, so ep must divide both", ep, config.experts, run->world.size);
    return config;
}

// -check_replicas: every copy of each parameter the same, the replicated ones over all ranks
// (their CRC-32s all-reduced), each rank's experts over the ranks that hold the same ones
static void check_copies(ExpertParallel* t, int step) {
    unsigned experts = (1u << PARAM_FCW) | (1u << PARAM_FCB) | (1u << PARAM_FCPROJW) | (1u << PARAM_FCPROJB);
    unsigned replicated = ((1u << NUM_PARAMETER_TENSORS) - 1) & ~experts;
    train_check_replicas(t->model, t->world, step, &replicated, "replicated parameters");
    train_check_replicas(t->model, t->edp_group, step, &experts, "experts' copies");
}

int main(int argc, char** argv) {
    // ---- the flags: the common ones and this trainer's own; then the communication layer and
    // the model's config (llmc/run.h)
    Run run;
    const char* dump_grads = NULL;
    MoeFlags flags = MOE_FLAGS_DEFAULT;
    int check_replicas = 0;
    const ArgSpec own[] = {
        MOE_ARG_SPECS(flags),
        {"-dump_grads", ARG_OUTPUT_FILE, &dump_grads, 0, 0, "write the averaged gradients of the first step here, gathered into the whole model (tests)"},
        {"-check_replicas", ARG_INT, &check_replicas, 0, ARG_NO_MAX, "every N steps check that every copy of each parameter is the same: the replicated ones over all ranks, each expert over the ranks holding it (0: never)"},
    };
    if (!run_start_model(&run, &argc, &argv, own, sizeof(own) / sizeof(own[0]), /*moe*/ 1)) return 0;
    CommGroup* world = &run.world;
    int rank = world->rank, ranks = world->size;
    MoeBalance balance = moe_balance_of(flags.balance);
    GPT2Config config = run.config = moe_config(&run, flags, flags.ep);

    // ---- the groups: EP groups of ep consecutive ranks; the ranks holding the same experts
    int ep = flags.ep;
    CommGroup ep_group, edp_group;
    comm_split(&ep_group, world, rank / ep, rank % ep, "ep");
    comm_split(&edp_group, world, rank % ep, rank / ep, "expert_dp");

    // ---- the batch: B x T per micro-batch on every rank, accumulated as DDP's
    int B = run.args.B, T = run.args.T, accum = train_accumulation_steps(&run.args, ranks, "ranks");
    RunLayout layout = run_layout(&run, TRAINER_EP, accum);
    layout.dp = ranks;
    layout.ep = ep;
    layout.capacity_factor = flags.capacity_factor;
    layout.dump_grads = dump_grads != NULL;
    check_every_rank(run.args.recompute == 0, "-r %d: train_gpt2_ep keeps every activation (-r 0); recomputation of "
                     "MoE layers is not written yet", run.args.recompute);
    run_check_memory(&run, layout, 0, "%zu parameters (E=%d experts, %d a rank), -b %d -t %d", gpt2_num_parameters(config),
                     config.experts, config.experts / ep, B, T);

    // ---- the weights (every rank keeps the replicated tensors and its experts), the data (each
    // rank its own chunks, as DDP), the run's identity: the MoE settings decide the trajectory,
    // the layout (ep, ranks) does not: a checkpoint resumes on any ep
    float* weights = run_load(&run, accum * ranks, /*val_chunks*/ ranks, NULL);
    run_identity_add(&run.identity, "moe", "E=%d k=%d balance=%s alpha=%.9g gamma=%.9g cf=%.9g", config.experts,
                     config.topk, moe_balance_name(balance), flags.aux_alpha, flags.bias_rate, flags.capacity_factor);
    if (flags.capacity_factor > 0) run_identity_add(&run.identity, "capacity", "%d tokens a rank", B * T);  // (as 5D's)
    LayerDims dims = layer_dims_moe(layer_dims(config, 1, 0));
    ParameterLayout rank_layout = parameter_layout_experts(config, 1, 0, 1, 0, 1, 0, ep, rank % ep);
    GPT2 model;
    gpt2_build(&model, config, dims, rank_layout, weights, B, T, ACTS_ALL, KEEP_ALL, 0);
    free(weights);
    Moe moe;
    MoeTokens tokens = {B, T, B * T, /*first*/ 0, /*T_seq*/ T, /*seq_group*/ NULL};  // (every rank routes all its tokens)
    moe_alloc(&moe, config, ep, rank % ep, &ep_group, tokens, /*records*/ 1, config.num_layers, balance, flags.aux_alpha,
              flags.bias_rate, flags.capacity_factor);
    ExpertParallel trainer = {&model, &moe, world, &ep_group, &edp_group};
    if (rank == 0) print_layout(&run, &model, &moe, accum);

    // ---- resume, validation, samples, checkpoints: gathered into the file's layout (the
    // experts over the EP group, whichever ep wrote them), the routing bias with them
    RunModel hooks = run_model(&model, &trainer, val_loss, sample_logits);
    hooks.val_replicas = world;
    hooks.split = &ep_group;
    hooks.replicas = &edp_group;
    hooks.own.buffers[0] = moe.bias;  // (L, E) floats on the device
    hooks.own.counts[0] = (size_t)config.num_layers * config.experts;
    hooks.own.num = 1;
    CommGroup* groups[3] = {world, &ep_group, &edp_group};
    run_begin(&run, hooks, groups, 3);
    run_bytes_on_own_line(&run, &ep_group, COMM_ALL_TO_ALL);  // (moe_print_line prints them every step)

    for (int step = run.start_step; step <= run.max_steps; step++) {
        if (run_between_steps(&run, step)) break;
        run_step_begin(&run);
        moe_step_begin(&moe);
        // 1. forward + backward over this rank's micro-batches (its own chunks of the global
        // batch, as DDP); each MoE layer exchanges tokens with the EP group (llmc/moe.h)
        watchdog_phase("forward and backward", step);
        device_memset_zero(model.grads_memory, model.num_parameters * sizeof(floatX));
        float loss = 0.0f, dloss = 1.0f / (float)((size_t)B * T * accum);
        for (int micro = 0; micro < accum; micro++) {
            watchdog_beat();
            dataloader_load_chunk(&run.train, micro * ranks + rank, config.vocab_size);
            gpt2_forward(&trainer, run.train.inputs, B, T);
            loss += gpt2_loss(&model, run.train.targets, B, T, dloss) / (float)accum;
            gpt2_backward(&trainer, run.train.inputs, B, T, 1.0f / (float)accum);
        }
        dataloader_advance(&run.train);
        // 2. the gradients: replicated ones over all ranks, experts over their copies; the loss
        // (one float) averaged
        watchdog_phase("gradient reduction", step);
        reduce_gradients(&trainer);
        comm_all_reduce_scalar(world, &loss, COMM_AVG);
        // 3. the norm and AdamW
        watchdog_phase("AdamW update", step);
        float norm = grad_norm(&trainer);
        stop_if_not_finite(&trainer, step, loss, norm);
        float clip_scale;
        AdamWConfig opt = train_adamw_config(&run.args, step, run.max_steps, norm, &clip_scale);
        moe_adamw_step(&model, opt, clip_scale, expert_grad_scale(&trainer), step);  // (experts read x 1/ep)
        // 4. the balance: loads over the global batch (an all-reduce of L x E counts), -balance
        // bias's update from them; then the step line and the step's MoE line
        MoeFigures figures = moe_step_figures(&moe, world, (double)ranks * accum);  // (each rank's micro-batches' aux)
        moe_log_fields(run.step_extra, sizeof(run.step_extra), figures);
        run_step_end(&run, step, loss, opt.lr, norm, clip_scale);
        if (rank == 0) moe_print_line(&moe, step, figures);
        if (dump_grads != NULL && step == 0) write_gradients(&trainer, dump_grads);
        if (check_replicas > 0 && (step + 1) % check_replicas == 0) check_copies(&trainer, step + 1);
    }
    run_end(&run);
    moe_free(&moe);
    gpt2_free(&model);
    comm_group_free(&ep_group);
    comm_group_free(&edp_group);
    comm_finalize();
    return 0;
}
