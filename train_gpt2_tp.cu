/*
GPT-2 training with tensor parallelism (Megatron-LM, Shoeybi et al. 2019, arXiv:1909.08053) and
optional sequence parallelism (Korthikanti et al. 2022, arXiv:2205.05198).

All ranks form one tensor-parallel group of tp ranks, and together they hold one model: every
weight matrix of a block is split, so each rank stores and multiplies about 1/tp of it.
  - The attention half: qkvw is split by heads (column-parallel: each rank computes the q, k and
    v of its NH/tp heads, and attention runs on them alone), attprojw by its input columns
    (row-parallel: each rank multiplies its heads' output by its columns and gets a partial sum
    of the full (B, T, C) projection). The MLP half: fcw by output rows (column-parallel), GELU
    works element by element on the rank's 4C/tp columns, fcprojw by input columns
    (row-parallel). So a half needs no communication inside it, only at its two ends.
  - Those ends are Megatron's conjugate operators. f sits before a column-parallel matmul: the
    identity forward (every rank has the whole input) and an all-reduce backward (each rank's
    input gradient covers only its columns). g sits after a row-parallel matmul: an all-reduce
    forward (summing the partial products) and the identity backward. Two all-reduces of
    (B, T, C) per layer forward, two backward.
  - The embedding and the tied LM head are split by vocabulary: a rank holds Vp/tp rows of wte,
    looks up only its tokens (zeros for the rest) before an all-reduce, and computes only its
    Vp/tp columns of logits. The cross-entropy works on those sharded logits: all-reduces of
    each row's max, its sum of exponentials and its target's logit, never of the logits.
  - LayerNorms, residual adds and the biases of row-parallel matmuls are replicated: computed
    identically on every rank from identical inputs. wpe is replicated too, and added by rank 0
    alone before the embedding's sum.
With -sp 1 (sequence parallelism) the replicated regions are split along the tokens instead of
being repeated: each rank keeps B*T/tp tokens of the residual stream and runs the LayerNorms
and residual adds on those. Every all-reduce becomes a reduce-scatter (to this rank's tokens)
plus an all-gather (before the next column-parallel matmul needs all tokens): the same bytes on
the wire, and the residual stream and LayerNorm statistics shrink by tp (this trainer keeps the
gathered LayerNorm outputs whole). LayerNorm weights then see only this rank's tokens, so their
gradients must be summed over the ranks. Megatron's activations are (T, B, C), so its split
falls along the sequence; ours are (B, T, C), so a rank's B*T/tp tokens are consecutive rows:
when tp divides B, whole sequences (B/tp each). Nothing in those regions mixes tokens, so the split is free to
fall anywhere; T must divide by tp, as in Megatron.

The result matches one process training the whole model to fp32 rounding (checked against
PyTorch in test/).

Build: make train_gpt2_tp          Run: mpirun -np 2 ./train_gpt2_tp -e d6 -sp 1 -x 100 -o out
The same source compiles as C for the CPU backend and as CUDA with nvcc (llmc/ops.h).
*/
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
#include "llmc/tensor_parallel.h"
#include "llmc/train.h"
#include "llmc/run.h"
#include "llmc/memory_plan.h"

// ----------------------------------------------------------------------------------------------
// forward and backward of the model on one micro-batch, on this rank's slices: the
// vocabulary-parallel embedding and LM head here, and between them each layer with its f and g
// collectives in llmc/tensor_parallel.h (tp_layer_forward, tp_layer_backward: read them as part
// of this chapter; the 3D trainer runs the same). BTs is the number of tokens of the residual
// stream on this rank: B*T, or B*T/tp with -sp.
// What differs from the other trainers' passes (DP's, CP's, llmc/chunk.h's of PP and DiLoCo):
// only the layer and the two ends, each split over the tp ranks: the vocabulary-parallel
// embedding and LM head, and between them tp_layer_forward with f and g. The 3D trainer's
// stages run this same pass through llmc/chunk.h with their tp group; this copy adds
// -tp_timeline's records of layer 0.

// -tp_timeline: armed for the micro-batch whose layer 0 is recorded (tensor_parallel.h)
static int timeline_armed = 0;

static void gpt2_forward(GPT2* model, CommGroup* tp, const int* inputs_host, int B, int T) {
    GPT2Config c = model->config;
    LayerDims d = model->dims;
    int L = c.num_layers, C = c.channels, sp = d.seq_shards > 1;
    size_t BT = (size_t)B * T;
    int BTs = (int)(BT / d.seq_shards);
    ParameterTensors p = model->params;
    Activations* a = &model->acts;

    // vocabulary-parallel embedding: this rank holds rows [lo, lo + Vp/tp) of wte. A token of
    // another rank becomes -1, a row of zeros, and rank 0 alone adds wpe, so that the sum over
    // the ranks holds every token's row and its position's row exactly once.
    vocab_parallel_tokens(model->inputs, &model->input_stage, inputs_host, BT, tp->rank, d.Vp_rank);
    // (B, T, C): with -sp in dbuf (free until the backward), summed into this rank's tokens of
    // encoded (BTs, C); without, in encoded itself, summed in place
    floatX* partial = sp ? a->dbuf : a->encoded;
    encoder_forward(partial, model->inputs, p.wte, tp->rank == 0 ? p.wpe : NULL, B, T, C);
    // g after the vocabulary-parallel lookup: all-reduce of the partial embeddings (B, T, C);
    // with -sp reduce-scatter into this rank's tokens
    floatX* encoded = sum_over_ranks(tp, partial, a->encoded, BT, C, sp);

    LayerActs first = layer_acts(a, d, B, T, 0);
    layernorm_forward(sp ? a->ln_shard : first.ln1, first.ln1_mean, first.ln1_rstd, encoded, p.ln1w,
                      p.ln1b, BTs, C);
    for (int l = 0; l < L; l++) {
        LayerActs x = layer_acts(a, d, B, T, l);
        floatX* residual = l == 0 ? encoded : layer_acts(a, d, B, T, l - 1).residual3;
        // the layer (llmc/tensor_parallel.h): with -sp it starts by all-gathering ln_shard, this
        // rank's tokens of its ln1 written just below, into x.ln1 (B, T, C). It returns the MLP's
        // output after g: x.fcproj (all-reduced in place), or with -sp scratch `reduced`, this
        // rank's (BTs, C) tokens of it
        tp_timeline_record(timeline_armed && l == 0, 1);
        floatX* fcproj = tp_layer_forward(model, tp, /*cp*/ NULL, x, gpt2_layer_params(model, l), residual, B, T, 0);
        tp_timeline_record(0, 1);
        // residual3 = residual2 + fcproj, fused with the next LayerNorm (ln1 of l+1, or lnf);
        // with -sp the LayerNorm's output goes to ln_shard, for the next layer to gather
        if (l + 1 < L) {
            LayerWeights wn = gpt2_layer_params(model, l + 1);
            LayerActs xn = layer_acts(a, d, B, T, l + 1);
            fused_residual_layernorm_forward(x.residual3, sp ? a->ln_shard : xn.ln1, xn.ln1_mean, xn.ln1_rstd,
                                             x.residual2, fcproj, wn.ln1w, wn.ln1b, BTs, C);
        } else {
            fused_residual_layernorm_forward(x.residual3, sp ? a->ln_shard : a->lnf, a->lnf_mean, a->lnf_rstd,
                                             x.residual2, fcproj, p.lnfw, p.lnfb, BTs, C);
        }
    }
    // f before the LM head (column-parallel over the vocabulary): identity, or with -sp the
    // all-gather of lnf to (B, T, C). This rank's logits: (B, T, Vp/tp), its vocabulary only.
    gather_tokens(tp, a->ln_shard, a->lnf, BT, C, sp);
    matmul_forward(a->logits, a->lnf, p.wte, NULL, (int)BT, C, d.Vp_rank);
}

// accumulates this rank's parameter gradients; expects vocab_parallel_loss to have left dlogits.
// inputs_host: the micro-batch's tokens, for the embeddings.
static void gpt2_backward(GPT2* model, CommGroup* tp, const int* inputs_host, int B, int T) {
    GPT2Config c = model->config;
    LayerDims d = model->dims;
    int L = c.num_layers, C = c.channels, sp = d.seq_shards > 1;
    size_t BT = (size_t)B * T;
    int BTs = (int)(BT / d.seq_shards);
    ParameterTensors p = model->params, g = model->grads;
    Activations* a = &model->acts;

    // LM head: dwte's rows of this rank's vocabulary, and a partial dlnf (B, T, C) from them.
    // a->logits holds dlogits here: the loss wrote each row's gradient over its logits.
    matmul_backward(a->dbuf, g.wte, NULL, a->logits, a->lnf, p.wte, (int)BT, C, d.Vp_rank);
    // f's backward at the LM head's input: all-reduce of dlnf (B, T, C); with -sp reduce-scatter
    floatX* dlnf = sum_over_ranks(tp, a->dbuf, a->reduced, BT, C, sp);
    device_memset_zero(a->dresidual, (size_t)BTs * C * sizeof(floatX));
    layernorm_backward(a->dresidual, g.lnfw, g.lnfb, dlnf, layer_acts(a, d, B, T, L - 1).residual3,
                       p.lnfw, a->lnf_mean, a->lnf_rstd, BTs, C);
    for (int l = L - 1; l >= 0; l--) {
        LayerWeights w = gpt2_layer_params(model, l), gw = gpt2_layer_grads(model, l);
        LayerActs x = layer_acts(a, d, B, T, l);
        floatX* residual = l == 0 ? a->encoded : layer_acts(a, d, B, T, l - 1).residual3;
        // f and g's backwards around each half (llmc/tensor_parallel.h); -r recomputes first
        tp_timeline_record(timeline_armed && l == 0, 0);
        tp_layer_backward(model, tp, /*cp*/ NULL, x, w, gw, a->kept, residual, a->dresidual, B, T, 0);
        tp_timeline_record(0, 0);
    }
    // g's backward at the embedding: the identity, or with -sp (its forward a reduce-scatter)
    // the all-gather of dresidual to (B, T, C). Tokens of this rank's vocabulary scatter into its
    // wte rows; wpe gets every position's gradient, whole and equal on every rank.
    floatX* dencoded = gather_tokens(tp, a->dresidual, a->dgathered, BT, C, sp);
    // (this rank's table of the tokens, on the host only, where the positions are sorted by token)
    const int* tokens = vocab_parallel_tokens(NULL, &model->token_table, inputs_host, BT, tp->rank, d.Vp_rank);
    encoder_backward(g.wte, g.wpe, dencoded, tokens, B, T, C);
}

// ----------------------------------------------------------------------------------------------

// Validation and samples run this trainer's forward pass; the run layer (llmc/run.h) calls these
// two with the model and the tp group
typedef struct {
    GPT2* model;
    CommGroup* tp;
} TensorParallel;

// one validation batch: every rank evaluates the same tokens (they share one model), so their
// losses agree
static float val_loss(void* trainer, DataLoader* val) {
    TensorParallel* t = (TensorParallel*)trainer;
    dataloader_load_chunk(val, 0, t->model->config.vocab_size);
    gpt2_forward(t->model, t->tp, val->inputs, t->model->B, t->model->T);
    return vocab_parallel_loss(t->model, t->tp, &t->model->acts, val->targets, t->model->B, t->model->T, 0.0f);
}

// HellaSwag's batch (-h 1, llmc/hellaswag.h): the (B, T) per-token losses on the host, whole on
// every rank (the vocabulary-parallel loss all-reduces each row's sums), so every rank scores
// every example and no sum over ranks follows
static const float* token_losses(void* trainer, const int* inputs, const int* targets) {
    TensorParallel* t = (TensorParallel*)trainer;
    gpt2_forward(t->model, t->tp, inputs, t->model->B, t->model->T);
    vocab_parallel_loss(t->model, t->tp, &t->model->acts, targets, t->model->B, t->model->T, 0.0f);
    return t->model->losses_host;
}

// a sample's forward pass: this rank's slice of the logits, (1, T, Vp/tp)
static const floatX* sample_logits(void* trainer, const int* tokens, int T) {
    TensorParallel* t = (TensorParallel*)trainer;
    gpt2_forward(t->model, t->tp, tokens, 1, T);
    return t->model->acts.logits;
}

// The communication of one step from the layout alone (the README derives it), payload per rank
// of each kind of collective. Per micro-batch: 4L + 2 collectives of (B, T, C) activations (per
// layer two forward and two backward, the embedding, the LM head's input gradient), all-reduces,
// or with -sp as many all-gathers plus as many reduce-scatters; the loss's all-reduces of 3 B*T
// fp32. Per step: the gradient norm (4 bytes) and with -sp the LayerNorm gradients, (4L + 2) C.
// rerun (-r 2): each layer's forward again before its backward, with attproj's sum (and with -sp
// the two all-gathers): L more all-reduces per micro-batch, or L reduce-scatters and 2L gathers.
typedef struct {
    double all_reduce, reduce_scatter, all_gather;
} StepBytes;

static StepBytes tp_step_bytes(GPT2Config c, int B, int T, int accum, int sp, int rerun) {
    double X = sizeof(floatX), L = c.num_layers, C = c.channels, BT = (double)B * T;
    double activation = accum * BT * C * X, collectives = 4 * L + 2, again = rerun ? L : 0;
    double loss_and_norm = accum * 3 * BT * 4 + 4;
    StepBytes b = {sp ? loss_and_norm + (4 * L + 2) * C * X : (collectives + again) * activation + loss_and_norm,
                   sp ? (collectives + again) * activation : 0, sp ? (collectives + 2 * again) * activation : 0};
    return b;
}

// what rank 0 prints at the start: the layout, which tensor is split how, the memory per rank and
// the communication per step with its formula
static void print_layout(const Run* run, const GPT2* model, int accum) {
    const TrainArgs* args = &run->args;
    GPT2Config c = model->config;
    LayerDims d = model->dims;
    int sp = d.seq_shards > 1, ranks = run->world.size;
    size_t X = sizeof(floatX);
    double BT = (double)args->B * args->T, L = c.num_layers;
    BannerRow rows[16];
    int n = train_banner_model(rows, "train_gpt2_tp (TP)", args->model, c);
    banner_row(&rows[n++], "tensor-parallel ranks", "%d%s", ranks, sp ? ", sequence parallel" : "");
    banner_row(&rows[n++], "heads per rank", "%d of %d", d.NH, c.num_heads);
    banner_row(&rows[n++], "micro-batch B x T", "%d x %d (every rank)", args->B, args->T);
    banner_row(&rows[n++], "accumulation steps", "%d", accum);
    banner_row(&rows[n++], "recomputation", "%s", recompute_names[args->recompute]);
    n = run_banner_rows(run, rows, n);
    train_print_banner(rows, n);
    train_print_parameter_layout(c, &model->layout);
    printf("memory per rank, Psi = this rank's parameters (the block weights and wte split over %d ranks; wpe, "
           "LayerNorms and row-parallel biases replicated):\n", ranks);
    memory_plan_print(&run->plan, c, &run->layout);
    int rerun = layer_rerun_needed(model->acts.kept);
    StepBytes b = tp_step_bytes(c, args->B, args->T, accum, sp, rerun);
    double activation = BT * c.channels * X;
    printf("communication per step (payload per rank), %d micro-batch%s of 4L+2 = %.0f collectives of B T C X = %.0f bytes:\n",
           accum, accum > 1 ? "es" : "", 4 * L + 2, activation);
    if (sp) {
        printf("  all-gather     %12.0f bytes  (4L+2) B T C X per micro-batch\n", b.all_gather);
        printf("  reduce-scatter %12.0f bytes  (4L+2) B T C X per micro-batch\n", b.reduce_scatter);
        printf("  all-reduce     %12.0f bytes  3 B T 4 (loss) per micro-batch + 4 (norm) + (4L+2) C X (LayerNorm gradients)\n", b.all_reduce);
    } else {
        printf("  all-reduce     %12.0f bytes  ((4L+2) B T C X + 3 B T 4 (loss)) per micro-batch + 4 (norm)\n", b.all_reduce);
    }
    if (rerun) {
        printf("  (-r 2: + L B T C X per micro-batch %s, for the forward rerun before each layer's backward)\n",
               sp ? "reduce-scattered and 2 L B T C X all-gathered" : "all-reduced");
    }
    if (d.tp_overlap && sp) {
        // the layers' collectives as ring steps: each sends and receives tp - 1 blocks of B T/tp C X
        double ring = accum * (8 * L + 3 * L * rerun) * BT * c.channels * X * (ranks - 1) / ranks;
        printf("  -tp_overlap 1: the layers' %.0f all-gathers and reduce-scatters per micro-batch are tp - 1 ring steps\n"
               "  each under their GEMMs; of the above, all but the head's 2 B T C X of each kind go as\n"
               "  send %12.0f bytes  and as many received: (8L%s) B T C X (tp-1)/tp, what the ring collectives send\n",
               8 * L + 3 * L * rerun, ring, rerun ? " + 3L" : "");
    } else if (d.tp_overlap) {
        printf("  -tp_overlap 1: each row-parallel GEMM's all-reduce in %d chunks of tokens, each posted when its rows\n"
               "  are done: the same bytes\n", TP_OVERLAP_CHUNKS);
    }
}

// The global gradient norm counts every parameter once: the slices' squares summed over the
// ranks (all-reduce of one float), the replicated tensors' squares, equal on every rank (with -sp
// only after layernorm_grads_all_reduce), added once
static float tp_grad_norm(GPT2* model, CommGroup* tp) {
    double sliced = 0.0, replicated = 0.0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        if (model->layout.sizes[i] == 0) continue;  // (a dense model's empty router)
        float sq = global_norm_squared(model->grads_memory + model->layout.offsets[i], model->layout.sizes[i]);
        if (model->layout.sharded[i]) sliced += sq;
        else replicated += sq;
    }
    float sliced_sum = (float)sliced;
    comm_all_reduce_scalar(tp, &sliced_sum, COMM_SUM);
    return sqrtf(sliced_sum + (float)replicated);
}

int main(int argc, char** argv) {
    // ---- the flags: the common ones (llmc/train.h) and this trainer's own; then the
    // communication layer and the model's config (llmc/run.h)
    Run run;
    const char* dump_grads = NULL;
    int tp_flag = 0, sp = 0, tp_overlap = 0, timeline_step = 0, check_replicas = 0;
    const ArgSpec own[] = {
        {"-tp", ARG_INT, &tp_flag, 0, ARG_NO_MAX, "tensor-parallel ranks; all ranks form one group, so it must equal the number of ranks (0: the number of ranks)"},
        {"-sp", ARG_INT, &sp, 0, 1, "1: sequence parallelism, the LayerNorm and residual regions split along the tokens (T must divide by tp)"},
        {"-tp_overlap", ARG_INT, &tp_overlap, 0, 1, "1: each collective in tp - 1 ring steps under its GEMM's blocks (-sp), or the all-reduce in chunks under the GEMM (no -sp)"},
        {"-tp_timeline", ARG_INT, &timeline_step, 0, ARG_NO_MAX, "at step S record layer 0's forward and backward (each GEMM block, each exchange) into tp_timeline_RANK.jsonl in -o (CPU backend; 0: never)"},
        {"-dump_grads", ARG_OUTPUT_FILE, &dump_grads, 0, 0, "write the gradients of the first step here, gathered into the whole model (tests)"},
        {"-check_replicas", ARG_INT, &check_replicas, 0, ARG_NO_MAX, "every N steps check that all ranks hold the same replicated tensors (LayerNorms, row-parallel biases, wpe) (0: never)"},
        HELLASWAG_FLAGS(&run.hellaswag),
    };
    if (!run_start(&run, &argc, &argv, own, sizeof(own) / sizeof(own[0]))) return 0;
    CommGroup* tp = &run.world;  // one tensor-parallel group of every rank (the 3D trainer splits it)
    int rank = tp->rank, ranks = tp->size;
    GPT2Config config = run.config;

    // ---- the layout: every rank one tp slice of the same model. The heads, the MLP width and
    // the vocabulary must divide by tp (layer_dims); with -sp the sequence length too.
    run_check_one_group(&run, "-tp", tp_flag, "one tensor-parallel group");
    LayerDims dims = tp_layer_dims(config, ranks, sp, run.args.T, "ranks");
    sp = dims.seq_shards > 1;  // -sp 1 on one rank: nothing to split, so the run goes on without
    dims.tp_overlap = run.tp_overlap = tp_overlap;  // (run's too: its predicted step, llmc/run.h)
    tp_timeline_check(timeline_step, run.args.out_dir);
    // the batch: all ranks work on the same B x T tokens, `accum` micro-batches per step
    int B = run.args.B, T = run.args.T, accum = train_accumulation_steps(&run.args, /*readers*/ 1, NULL);

    // ---- memory, checked before allocating: this rank's slices of the model states, every
    // activation of a micro-batch at the rank's widths, and on rank 0 one more slice of fp32
    // through which a checkpoint is gathered (llmc/memory_plan.h)
    ParameterLayout rank_layout = parameter_layout(config, ranks, rank);
    RunLayout layout = run_layout(&run, TRAINER_TP, accum);
    layout.tp = ranks;
    layout.sp = sp;
    layout.dump_grads = dump_grads != NULL;
    run_check_memory(&run, layout, 0, "%zu of %zu parameters per rank, -b %d -t %d", rank_layout.count,
                     gpt2_num_parameters(config), B, T);

    // ---- the weights, the data (a step is accum chunks of B x T, each read by every rank), the
    // run's identity with its layout (a resume must match it), the output dir
    float* weights = run_load(&run, accum, /*val_chunks*/ 1, "dp=1 tp=%d pp=1 sp=%d, %d micro-batches of %d x %d", ranks, sp,
                              accum, B, T);
    GPT2 model;
    gpt2_build(&model, config, dims, rank_layout, weights, B, T, ACTS_ALL,
               activations_kept(run.args.recompute, /*weights_later*/ 0, dims), /*offload*/ 0);
    free(weights);
    if (rank == 0) print_layout(&run, &model, accum);

    // ---- resume with -y 1; validation, samples and checkpoints through the tp group
    TensorParallel trainer = {&model, tp};
    RunModel hooks = run_model(&model, &trainer, val_loss, sample_logits);
    hooks.vocab = tp;                     // samples drawn from the vocabulary's slices
    hooks.sample_pad = dims.seq_shards;   // (-sp: a sample padded to a multiple of tp tokens)
    hooks.split = tp;                     // checkpoints gathered from the slices
    hooks.token_losses = token_losses;    // -h 1: every rank scores every example (the batch is shared)
    check_every_rank(timeline_step <= run.max_steps, "-tp_timeline %d: past the run's last step, %d (-x)", timeline_step,
                     run.max_steps);  // (before -o is written; a resumed run's first step is known after)
    run_begin(&run, hooks, &tp, 1);  // (tp: the group whose bytes each step reports)
    check_every_rank(timeline_step == 0 || timeline_step > run.start_step, "-tp_timeline %d: the run resumes after it, at "
                     "step %d", timeline_step, run.start_step);

    // ---- training loop; `step` counts completed optimizer steps
    for (int step = run.start_step; step <= run.max_steps; step++) {
        if (run_between_steps(&run, step)) break;  // validation, a sample, a checkpoint: when due
        run_step_begin(&run);
        // 1. forward + backward over the micro-batches, every rank on the same tokens and its
        // own slices; gradients accumulate. Each token's gradient is weighted 1/(B*T*accum): no
        // rank count enters, as the ranks split the model, not the batch.
        watchdog_phase("forward and backward", step);
        device_memset_zero(model.grads_memory, model.num_parameters * sizeof(floatX));
        float loss = 0.0f;
        float dloss = 1.0f / (float)((size_t)B * T * accum);
        for (int micro = 0; micro < accum; micro++) {
            watchdog_beat();
            dataloader_load_chunk(&run.train, micro, config.vocab_size);
            timeline_armed = step + 1 == timeline_step && micro == 0;
            gpt2_forward(&model, tp, run.train.inputs, B, T);
            // the vocabulary-parallel loss (llmc/tensor_parallel.h) on this rank's (B, T, Vp/tp)
            // logits: all-reduces of each row's max, (B, T), and of its sum of exponentials with
            // its target's logit, (B, T, 2), in fp32; the logits are never gathered
            loss += vocab_parallel_loss(&model, tp, &model.acts, run.train.targets, B, T, dloss) / (float)accum;
            gpt2_backward(&model, tp, run.train.inputs, B, T);
        }
        dataloader_advance(&run.train);
        if (sp) {
            // -sp: each rank's LayerNorm weights saw only its own tokens, so their gradients are
            // partial sums: all-reduce each of ln1w, ln1b, ln2w, ln2b ((L, C) each) and lnfw,
            // lnfb ((C) each), 4LC + 2C in all. Forgetting this is the classic sequence-parallel
            // bug: every rank would update its LayerNorm copy with its own part of the gradient.
            watchdog_phase("LayerNorm gradient all-reduce", step);
            layernorm_grads_all_reduce(&model, tp);
        }
        // 2. the global gradient norm, each parameter counted once (tp_grad_norm: the slices'
        // squares all-reduced over the ranks, the replicated ones' added once)
        watchdog_phase("AdamW update", step);
        float grad_norm = tp_grad_norm(&model, tp);
        // the loss and the norm are the same on every rank, so every rank stops here together
        train_stop_if_not_finite(step, loss, grad_norm);
        // 3. AdamW on this rank's slices. Replicated tensors get identical gradients on every
        // rank and round alike (the layout's rounding index), so their copies stay identical.
        float clip_scale, lr = train_adamw_step(&model, &run.args, step, run.max_steps, grad_norm, &clip_scale);
        // the step line and main.log (llmc/run.h); the bytes of each collective equal the formula
        // printed at the start
        run_step_end(&run, step, loss, lr, grad_norm, clip_scale);
        if (step + 1 == timeline_step) tp_timeline_write(run.args.out_dir, rank);
        if (check_replicas > 0 && (step + 1) % check_replicas == 0) {
            train_check_replicas(&model, tp, step + 1, NULL, ranks > 1 ? "replicated tensors" : "replicas");
        }
        // after the step's count (AdamW left the gradients): the slices gathered into one file
        if (dump_grads != NULL && step == 0) gpt2_write_gathered(&model, tp, model.grads_memory, dump_grads);
    }
    run_end(&run);
    gpt2_free(&model);
    comm_finalize();
    return 0;
}
