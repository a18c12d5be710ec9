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
              on to rank r + 1 and receiving the next from rank r - 1 (send/recv, cp - 1 of them).
              Step 0's block is the rank's own: under the causal mask every query sees at least
              itself there, so the merge starts from a finite max and lse for every row
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
forward, which hides behind the block computation when T is long. The balance, in tiles of
len x len score products (len the chunk length): query chunk i does i whole tiles (the keys of
chunks 0..i-1) and one diagonal (its own keys, half a tile: len (len + 1) / 2). Zigzag cuts the
sequence into 2cp chunks and gives rank r chunks r and 2cp-1-r: r + (2cp-1-r) = 2cp - 1 whole tiles
and two diagonals on every rank. Contiguous gives rank r chunk r of cp: r whole tiles and one
diagonal, so the last rank does (cp-1) len^2 + len (len+1)/2 against the first's len (len+1)/2,
which tends to 2cp - 1 times as len = T/cp grows (at cp 4, T 32: 228 against 36, 6.3 times; the
start's table prints each rank's).

The result matches one process training the whole model to fp32 rounding (checked against
PyTorch in test/).

The 3D trainer's -cp (train_gpt2_3d.cu) runs the same attention code: llmc/chunk.h's pass over a
pipeline stage's layers, given the cp group, calls llmc/context_parallel.h's ring or all-gather
inside each llmc/tensor_parallel.h layer (on the rank's tp heads) and takes wpe's rows at the
rank's positions as here (cp_positions, cp_position_grads). Of its own this file has the DP
trainer's layers around that attention and the step of 1-6 above.

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
#include "llmc/context_parallel.h"
#include "llmc/train.h"
#include "llmc/run.h"
#include "llmc/memory_plan.h"

// ----------------------------------------------------------------------------------------------
// forward and backward of the model on one micro-batch of this rank's tokens, (B, Tl) of the
// sequences' T: the layers of the DP trainer, with attention over the whole sequence in the
// attention half (llmc/context_parallel.h: the ring, or the all-gather, of steps 2 and 4).
// What differs from the other trainers' passes (DP's, TP's, llmc/chunk.h's of PP, 3D and
// DiLoCo): only the attention half, ring attention (or an all-gather) over the sequence's
// other ranks, and the positions: a rank holds Tl = T/cp tokens of each sequence, so the
// embedding adds wpe's rows of its own positions and its backward adds their gradients back
// there (cp_positions, cp_position_grads).

static void layer_forward(GPT2* model, ContextParallel* cp, LayerActs x, LayerWeights w, const floatX* residual,
                          int B, int T, int rerun) {
    LayerDims d = model->dims;
    int Tl = T / cp->cp->size, C = d.C;
    // the attention half, its queries against the keys and values of the whole sequence
    // (llmc/context_parallel.h's cp_attention_forward, read it next). Ring: the rank packs its
    // K,V (B, Tl, 2C) into kv[0]; then cp steps, at step s computing against the block in
    // kv[s % 2] (rank r - s's; step 0 its own, which every query's merge must start from) while
    // that block is posted on to rank r + 1 and the next received from rank r - 1 into the other
    // buffer; each step's partial output merges into o (fp32) by log-sum-exp. All-gather: one
    // collective of every rank's block into kv_all (cp, B, Tl, 2C), then the same merge.
    // att_state keeps lse, (B, NH, Tl) fp32. Then residual2 = residual + attproj, fused with ln2
    cp_attention_half_forward(cp, x, w, B, Tl, d);
    fused_residual_layernorm_forward(x.residual2, x.ln2, x.ln2_mean, x.ln2_rstd, residual, x.attproj, w.ln2w, w.ln2b,
                                     B * Tl, C);
    // the MLP half, token by token
    if (rerun) mlp_half_forward_to_gelu(x, w, B, Tl, d);
    else mlp_half_forward(x, w, B, Tl, d);
}

// -r 1 and 2: what layer l's forward did not keep, again before its backward (model.h). -r 2
// reruns the layer whole: its attention's K,V go round the ring again.
static void layer_recompute(GPT2* model, ContextParallel* cp, LayerActs x, LayerWeights w, const floatX* residual,
                            int B, int T) {
    unsigned kept = model->acts.kept;
    int Tl = T / cp->cp->size;
    if (kept == KEEP_ALL) return;
    device_span_begin(&recompute_spans);
    if (layer_rerun_needed(kept)) {
        double work = cp->work;  // (the step's attention work counts each forward once)
        layernorm_forward(x.ln1, x.ln1_mean, x.ln1_rstd, residual, w.ln1w, w.ln1b, B * Tl, model->dims.C);
        layer_forward(model, cp, x, w, residual, B, T, 1);
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
    tokens_to_device(model->inputs, &model->input_stage, inputs_host, (size_t)B * Tl);
    // the position embeddings of this rank's positions: wpe's rows of each of its chunks
    encoder_forward(a->encoded, model->inputs, p.wte, cp_positions(cp, p.wpe, Tl, C), B, Tl, C);
    LayerActs first = layer_acts(a, d, B, Tl, 0);
    layernorm_forward(first.ln1, first.ln1_mean, first.ln1_rstd, a->encoded, p.ln1w, p.ln1b, B * Tl, C);
    for (int l = 0; l < L; l++) {
        LayerActs x = layer_acts(a, d, B, Tl, l);
        floatX* residual = l == 0 ? a->encoded : layer_acts(a, d, B, Tl, l - 1).residual3;
        layer_forward(model, cp, x, gpt2_layer_params(model, l), residual, B, T, 0);
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
    // LM head (a->logits holds dlogits) and the final LayerNorm
    matmul_backward(a->dbuf, g.wte, NULL, a->logits, a->lnf, p.wte, B * Tl, C, c.padded_vocab_size);
    device_memset_zero(a->dresidual, (size_t)B * Tl * C * sizeof(floatX));
    layernorm_backward(a->dresidual, g.lnfw, g.lnfb, a->dbuf, layer_acts(a, d, B, Tl, L - 1).residual3, p.lnfw,
                       a->lnf_mean, a->lnf_rstd, B * Tl, C);
    for (int l = L - 1; l >= 0; l--) {
        LayerWeights w = gpt2_layer_params(model, l), gw = gpt2_layer_grads(model, l);
        LayerActs x = layer_acts(a, d, B, Tl, l);
        floatX* residual = l == 0 ? a->encoded : layer_acts(a, d, B, Tl, l - 1).residual3;
        layer_recompute(model, cp, x, w, residual, B, T);
        // a residual add passes dresidual to both of its inputs unchanged
        mlp_half_backward(a->dbuf, a->dfch, a->dresidual, x, w, gw, B, Tl, d);
        layernorm_backward(a->dresidual, gw.ln2w, gw.ln2b, a->dbuf, x.residual2, w.ln2w, x.ln2_mean, x.ln2_rstd, B * Tl,
                           C);
        // the attention half's backward (block.h's two passes, attention over the sequence in
        // the first: cp_attention_backward). Ring: the K,V blocks go round a second time, and
        // with each its gradient dK,dV (B, Tl, 2C) fp32 in dkv, to which every rank adds its
        // queries' part before passing it on; after cp passes each block's gradient is home with
        // its owner. All-gather: K,V gathered again, then a reduce-scatter of the whole
        // sequence's dK,dV to the owners. datty in dbuf, dqkv, then dln1 into dbuf (datty is
        // used up by then)
        cp_attention_half_backward_input(cp, a->dbuf, a->dbuf, a->dqkv, a->dresidual, x, w, B, Tl, d);
        attention_half_backward_weight(gw, a->dqkv, a->dresidual, x, B, Tl, d);
        layernorm_backward(a->dresidual, gw.ln1w, gw.ln1b, a->dbuf, residual, w.ln1w, x.ln1_mean, x.ln1_rstd, B * Tl, C);
    }
    // the embeddings: wte's rows of this rank's tokens; the gradient of its positions' wpe rows,
    // then added into wpe's gradient at those positions
    encoder_backward(g.wte, cp_position_grads(cp, Tl, C), a->dresidual, inputs_host, B, Tl, C);
    cp_add_position_grads(cp, g.wpe, Tl, C);
}

// ----------------------------------------------------------------------------------------------
// Validation and samples (the run layer, llmc/run.h, calls these)

typedef struct {
    GPT2* model;
    ContextParallel* cp;
} Context;

// one validation batch: every rank reads the same sequences and evaluates its tokens' mean loss;
// the run layer averages over the ranks (val_replicas: equal token counts, so the global mean)
static float val_loss(void* trainer, DataLoader* val) {
    Context* t = (Context*)trainer;
    GPT2* m = t->model;
    ContextParallel* cp = t->cp;
    int T = m->T * cp->cp->size;  // (the model holds B x Tl tokens: Tl = T / cp)
    CpChunks mine = cp_mine(cp, m->T);
    dataloader_load_chunk(val, 0, m->config.vocab_size);
    cp_take_tokens(cp->inputs, val->inputs, mine, m->B, T);
    cp_take_tokens(cp->targets, val->targets, mine, m->B, T);
    gpt2_forward(m, cp, cp->inputs, m->B, T);
    return gpt2_loss(m, cp->targets, m->B, m->T, 0.0f);
}

// a sample's forward pass, (1, T) split as training's (T at most training's: run.h keeps a
// sample within -t, so the buffers sized for it hold): this rank's logits, (1, Tl, Vp)
static const floatX* sample_logits(void* trainer, const int* tokens, int T) {
    Context* t = (Context*)trainer;
    cp_take_tokens(t->cp->inputs, tokens, cp_mine(t->cp, T / t->cp->cp->size), 1, T);
    gpt2_forward(t->model, t->cp, t->cp->inputs, 1, T);
    return t->model->acts.logits;
}

static int sample_row(void* trainer, int T, int position, int* owner) {
    return cp_row_of_position(((Context*)trainer)->cp, T, position, owner);
}

// ----------------------------------------------------------------------------------------------
// what rank 0 prints at the start: the layout, the split of the sequence and each rank's
// attention work, the memory per rank and the communication per step with its formula: the
// attention's K,V blocks (cp_attention_bytes, llmc/context_parallel.h) per layer and micro-batch;
// per step the gradient all-reduce P X and the loss's 4 bytes (the norm needs none: every rank
// holds the whole summed gradient)
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
    CpBytes b = cp_attention_bytes(args->B, T / n, c.channels, n, c.num_layers, accum, cp->allgather, rerun);
    double all_reduce = gpt2_num_parameters(c) * sizeof(floatX) + 4.0;
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
    printf("  all-reduce     %12.0f bytes  P X (the gradients, SUM) + 4 (the loss)\n", all_reduce);
    // on the link (the step line's "ring"): a ring all-reduce sends 2 (cp-1)/cp of its payload,
    // an all-gather or reduce-scatter (cp-1)/cp, a send its whole message
    double share = (n - 1.0) / n;
    printf("  on the link    %12.0f bytes  2 (cp-1)/cp all-reduce + %s\n",
           2 * share * all_reduce + (cp->allgather ? share * (b.all_gather + b.reduce_scatter) : b.send),
           cp->allgather ? "(cp-1)/cp (all-gather + reduce-scatter)" : "send");
}

// After the run: each rank's attention work (the forward's score products; the backward redoes
// each) and its time computing blocks forward and backward in the last step, gathered to rank 0
// (one float each per rank): the balance of the split, measured (the exchanges' waiting is in the
// step line's "exposed")
static void report_attention_work(CommGroup* world, double step_work, double step_attention_s) {
    for (int r = 0; r < world->size; r++) {
        float figures[2] = {r == world->rank ? (float)step_work : 0.0f, r == world->rank ? (float)step_attention_s : 0.0f};
        comm_all_reduce_scalar(world, &figures[0], COMM_SUM);
        comm_all_reduce_scalar(world, &figures[1], COMM_SUM);
        if (world->rank == 0) {
            printf("rank %d: attention work %.0f score products a step (forward), %.1f ms computing blocks forward and "
                   "backward\n", r, figures[0], 1e3 * figures[1]);
        }
    }
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
        {"-dump_grads", ARG_OUTPUT_FILE, &dump_grads, 0, 0, "write the gradients of the first step here, as a model file (tests)"},
        {"-check_replicas", ARG_INT, &check_replicas, 0, ARG_NO_MAX, "every N steps check that all ranks hold the same model (0: never)"},
    };
    if (!run_start(&run, &argc, &argv, own, sizeof(own) / sizeof(own[0]))) return 0;
    CommGroup* world = &run.world;  // one context-parallel group of every rank (the 3D trainer splits it)
    int rank = world->rank, ranks = world->size;
    GPT2Config config = run.config;

    // ---- the layout: every rank the whole model and T/cp tokens of each sequence
    run_check_one_group(&run, "-cp", cp_flag, "one context-parallel group");
    CpSplit split = cp_split_of(split_name);
    // all-gather wins where one collective beats cp - 1 exchanges: K,V blocks too small to hide
    // each exchange behind a block's compute (short T/cp); the ring holds 2 blocks, not cp
    int allgather = cp_allgather_of(comm_name);
    int B = run.args.B, T = run.args.T, chunks = cp_check_split(split, ranks, T, "cp ranks");
    cp_check_head_size(config.channels / config.num_heads);
    int Tl = T / ranks;
    LayerDims dims = layer_dims(config, /*tp*/ 1, /*sp*/ 0);
    dims.target.flash = 1;  // attention keeps lse, (B, NH, Tl) fp32, as flash attention does
    int accum = train_accumulation_steps(&run.args, /*readers*/ 1, NULL);

    // ---- memory, checked before allocating: the whole model's states, the activations of
    // B x Tl tokens, the attention's blocks (llmc/memory_plan.h)
    ParameterLayout layout = parameter_layout(config, 1, 0);
    RunLayout plan = run_layout(&run, TRAINER_CP, accum);
    plan.cp = ranks;
    plan.cp_allgather = allgather;
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
    ContextParallel cp;  // this rank's place in the sequence and its attention's buffers
    cp_alloc(&cp, world, split, allgather, B, T, config.channels, config.channels, config.num_heads);
    if (rank == 0) print_layout(&run, &cp, accum);

    // ---- resume with -y 1 (a checkpoint of any cp); validation and samples with the sequence split
    // as in training
    Context trainer = {&model, &cp};
    RunModel hooks = run_model(&model, &trainer, val_loss, sample_logits);
    hooks.val_replicas = world;     // each rank the mean of its tokens: the mean over the ranks
    hooks.seq = world;              // a sample's positions split over the ranks
    hooks.seq_row = sample_row;
    hooks.sample_pad = chunks;      // (a sample padded to whole chunks; causal: the padding is unseen)
    hooks.replicas = world;         // checkpoints: every rank a replica; rank 0 writes the state in
    hooks.split = world;            // the model file's layout, which any cp reads (the split: none)
    run_begin(&run, hooks, &world, 1);  // (world: the group whose bytes each step reports)

    // ---- training loop; `step` counts completed optimizer steps
    CpChunks mine = cp_mine(&cp, Tl);
    double step_work = 0.0, step_attention_s = 0.0;  // the last step's attention: its score products, its time
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
            cp_take_tokens(cp.inputs, run.train.inputs, mine, B, T);
            cp_take_tokens(cp.targets, run.train.targets, mine, B, T);
            gpt2_forward(&model, &cp, cp.inputs, B, T);
            loss += gpt2_loss(&model, cp.targets, B, Tl, dloss) / (float)accum;
            gpt2_backward(&model, &cp, cp.inputs, B, T);
        }
        dataloader_advance(&run.train);
        step_work = cp.work;
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
        step_attention_s = device_spans_collect(&cp.attention_time);  // (the step has finished)
        if (check_replicas > 0 && (step + 1) % check_replicas == 0) {
            train_check_replicas(&model, world, step + 1, NULL, "replicas");
        }
        // after the step's count (AdamW left the gradients): rank 0's, the whole model's
        if (dump_grads != NULL && step == 0 && rank == 0) gpt2_write_gathered(&model, NULL, model.grads_memory, dump_grads);
    }
    run_end(&run);
    if (run.max_steps > run.start_step) report_attention_work(world, step_work, step_attention_s);
    cp_free(&cp);
    gpt2_free(&model);
    comm_finalize();
    return 0;
}
