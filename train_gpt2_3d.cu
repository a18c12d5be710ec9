/*
GPT-2 training with 3D parallelism: data, pipeline and tensor parallelism at once, on a grid of
dp x pp x tp ranks, as Megatron-LM composes them (Narayanan et al. 2021, "Efficient Large-Scale
Language Model Training on GPU Clusters Using Megatron-LM", arXiv:2104.04473), context
parallelism as a fourth axis (-cp: dp x pp x cp x tp, Megatron-LM's context parallelism), and
with experts expert parallelism as a fifth (-ep, folded over each stage's ranks: 5D, below).

This trainer is the sum of the other four chapters; read them first. It runs their code: each
pipeline stage's chunk of layers is llmc/chunk.h's (the PP trainer's), here with a tp group inside
it, so that every layer is llmc/tensor_parallel.h's (the TP trainer's: column- and row-parallel
halves with f and g, -sp, the vocabulary-parallel embedding and loss on the first and last
stage); with -cp each rank holds T/cp tokens of every sequence and its attention, on its tp
rank's heads, reaches the rest over the cp group (llmc/context_parallel.h, the CP trainer's ring
or all-gather); the schedules are the PP trainer's (the V ones, zbv and dualpipev, included: their first
stage holds the embedding and the head, one wte), walked by its pipeline_walk
(llmc/pipeline_walk.h), each message going from a tp rank of one stage to the same tp and cp rank of the
next (B T C, T the rank's tokens, or with -sp its B T / tp of them). What this chapter adds, each
explained where it is written:
  1. The grid (grid_coordinates, grid_init): world rank r at tp rank r % tp, cp rank
     (r / tp) % cp, dp rank (r / (tp cp)) % dp, stage r / (tp cp dp), and its groups, each split
     from the world by a colour that its members share: tp (the tp ranks of one stage of one
     replica), cp (the ranks one replica's sequences are split over, at one stage and tp rank),
     pp (the stages of one replica at one cp and tp rank), dp (the ranks that hold the same
     parameters: the replicas and their cp ranks), the embedding group (the first and last stage
     at one dp, cp and tp rank), and the model group (the tp x pp ranks of one replica and cp
     rank, which gather the model file).
  2. The reductions across groups after the schedule: -sp's LayerNorm gradients over tp, the
     tied wte's over the embedding group, every gradient's mean over dp x cp (DDP: all-reduce;
     -z 1: reduce-scatter), the loss broadcast over pp and averaged over dp x cp.
  3. The gradient norm's ownership (owned_norm_squared, replica_shard): each element counted by
     exactly one rank of the world (its dp shard's rank, tp rank 0 for what tp replicates, the
     first stage for the tied wte), so one all-reduce over the world sums the squares.
  4. ZeRO-1 over the dp group (-z 1, Rajbhandari et al. 2020, arXiv:1910.02054;
     zero1_adamw_step): each of its ranks updates a 1/(dp cp) shard of its buffer and all-gathers
     (with experts theirs a 1/edp shard over edp: two sets of shards, llmc/model.h).
  5. Checkpoints that any grid resumes (below), and a memory table and byte formulas per group.
The step's gradient is the mean over all tokens of the dp*m micro-batches: each of a rank's
tokens weighs 1/(B T m) in the walk (T its tokens of a sequence), then the reduction averages
over dp x cp.

5D: with a Mixture-of-Experts model (-experts E -topk k, or an MoE model file; the EP chapter,
train_gpt2_ep.cu, first) expert parallelism is a fifth axis, as Megatron-LM composes it ("parallel
folding", arXiv:2504.14960). Attention keeps its dp x cp x tp layout in each stage; the stage's
MoE layers regroup the same ranks as ep x edp, so experts take no ranks of their own:
  a. The fold (grid_fold_experts): ep consecutive ranks of a stage hold its E experts between
     them (E/ep each, whole: expert tp = 1); the ranks holding the same experts are an edp group.
  b. Each MoE layer (llmc/chunk.h, moe_layer_forward: the EP chapter's moe_forward, in its
     parts, called from the stage's layer) routes the tokens its rank holds, T/cp of each
     sequence and with -sp its tp share (so no token is routed twice; -tp without -sp is
     refused), by the EP chapter's two all-to-alls over the ep group; each micro-batch in flight
     keeps its routing in its slot's record. The aux loss is a whole sequence's: its figures
     summed over the cp x tp ranks that hold its tokens (the seq group), so the loss does not
     depend on the grid.
  c. The reductions (reduce_dense_and_experts): the dense tensors over dp x cp as before, the
     experts over edp (-z 1: each reduce-scattered, updated in shards and all-gathered over its
     own group), read scaled by tp/ep (expert_grad_scale says why); the routers' gradients
     over tp with -sp, as the LayerNorms'; the norm counts each expert once; the loads of the
     global batch (all-reduced over the world) print, and move -balance bias's biases.
  d. With -pp_overlap 1 in a V (dualpipev's F&B pairs; interleaved's too), DualPipe's main
     overlap: the pair's forward and backward step in turn, layer part by layer part, so that
     each one's all-to-alls of rows (dispatch and combine, forward and backward) move while the
     other computes (llmc/pipeline_walk.h; the backward's rows in a second lane of buffers). The
     step's moe line prints the all-to-alls' exposed time and how many moved under the other
     micro-batch; the same run with -pp_overlap 0 gives the cost.

How the four axes compose, and which to reach for: tp splits each layer's width (heads, 4C, the
vocabulary) and talks most, 4 activation-sized collectives per layer: inside a machine. cp
splits the sequence and only attention talks, K,V blocks that hide behind attention's compute
when T is long: next to tp. dp replicates the model and talks once a step; pp splits the layers
and sends one activation per micro-batch per boundary: across machines. For long sequences,
activations are what runs out (B T C per layer, and attention's T^2 without flash): -sp divides
them by tp but tp is bounded by the heads and costs collectives on every matmul; -cp divides
every activation by cp at the price of attention's K,V traffic, and -r trades compute for them.
Reach for tp (with -sp) inside a machine first, then cp for the sequence, then pp and dp.

Checkpoints: the model file is the whole model in llm.c's layout, and the training state (AdamW
moments, and bf16 parameter bits) is gathered into the same layout (llmc/train.h,
write_checkpoint_gathered), so that a run saved on one grid resumes on any other: 2x2x2 -> 1x1x1
or 1x2x4, a cp run of the CP trainer at any cp here, and bit for bit on the grid that wrote it.

The result matches one process training the whole model to fp32 rounding (checked against
PyTorch in test/).

Build: make train_gpt2_3d        Run: mpirun -np 8 ./train_gpt2_3d -e d8 -dp 2 -pp 2 -tp 2 -b 2 -d 1024 -x 20 -o out
           long sequences:        mpirun -np 8 ./train_gpt2_3d -e d8 -pp 2 -cp 2 -tp 2 -sp 1 -t 1024 -x 20 -o out
           5D, 8 experts:         mpirun -np 8 ./train_gpt2_3d -e d8 -experts 8 -pp 2 -cp 2 -tp 2 -sp 1 -ep 4 -x 20 -o out
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
#include "llmc/context_parallel.h"
#include "llmc/pipeline.h"
#include "llmc/stage.h"
#include "llmc/chunk.h"
#include "llmc/pipeline_walk.h"
#include "llmc/allocations.h"
#include "llmc/train.h"
#include "llmc/run.h"
#include "llmc/memory_plan.h"
#include "llmc/moe.h"

// ----------------------------------------------------------------------------------------------
// The grid. World rank r sits at tp rank r % tp, cp rank (r / tp) % cp, dp rank
// (r / (tp cp)) % dp and stage r / (tp cp dp): tp varies fastest, then cp, then dp, then pp, the
// order Megatron-LM uses. Consecutive ranks share a machine, and the group that talks most should
// be the one whose ranks are closest: the tp group does 4 collectives of a whole (B, T, C)
// activation per layer per micro-batch, on the critical path, so it belongs on one machine's
// NVLink. The cp group comes next: per layer and micro-batch it passes K,V blocks, (B, T/cp, 2C/tp)
// each, cp - 1 times forward and again backward with their gradients, hidden behind attention's
// compute when T is long. Then dp: one reduction of the gradients per step, which can overlap
// the backward pass (train_gpt2_dp.cu's -overlap; this trainer reduces after the schedule, to
// keep the step readable). The pp group talks least (one activation message per micro-batch per
// stage boundary, point to point), so stages can sit on different machines.

typedef struct {
    int dp, pp, cp, tp;                      // the grid's sides, dp * pp * cp * tp = world size
    int dp_rank, stage, cp_rank, tp_rank;    // this rank's coordinates
    CommGroup tp_group;             // the tp ranks of this stage of this replica and cp rank
    CommGroup cp_group;             // the cp ranks: this stage's and tp rank's share of one
                                    // replica's sequences, split over them
    CommGroup pp_group;             // the stages of this replica at this cp and tp rank
    CommGroup dp_group;             // the ranks holding the same parameters: the replicas and
                                    // their cp ranks (dp x cp ranks) at this stage and tp rank
    CommGroup embedding;            // the first and last stage at this dp, cp and tp rank (tied wte)
    CommGroup model_group;          // the tp x pp ranks of this replica and cp rank, in the order
                                    // parameter_layout_of_rank numbers them (to gather the model);
                                    // with experts each stage's first max(tp, ep) ranks
    int in_embedding;
    int pp_head;                    // the stage with the head: the last, or in a V the first
    // 5D, with experts (parallel folding, below); a dense model has ep = 1 and none of these groups
    int moe, ep, ep_rank;               // the ep ranks of a stage that hold its E experts between them,
                                    // this rank's place among them: experts [ep_rank E/ep, ...)
    CommGroup ep_group;             // those ep ranks: the MoE layers' all-to-alls
    CommGroup edp_group;            // the stage's ranks holding the same experts (their gradients' mean)
    CommGroup seq_group;            // the cp x tp ranks of this replica at this stage: one micro-batch's
                                    // tokens (the aux loss's figures are its sequences')
    CommGroup gathering;            // a flag as a group: its rank 0 is one of the ranks that gather
                                    // the model (the model group); its ranks are not copies
} Grid;

static void grid_coordinates(int rank, int dp, int cp, int tp, int* dp_rank, int* stage, int* cp_rank, int* tp_rank) {
    *tp_rank = rank % tp;
    *cp_rank = rank / tp % cp;
    *dp_rank = rank / (tp * cp) % dp;
    *stage = rank / (tp * cp * dp);
}

// The groups. comm_split(out, world, colour, key) puts the ranks that pass the same colour in one
// group, numbered by their keys (MPI_Comm_split, ncclCommSplit): the colour is what the members
// share, the key their order inside the group. A replica's cp ranks hold the same parameters
// and each a part of its tokens, so "replica" below is the pair (dp rank, cp rank), numbered
// dp_rank cp + cp_rank.
//   tp     colour r / tp (tp consecutive ranks), key the tp rank
//   cp     colour (stage dp + dp_rank) tp + tp_rank (the same stage, replica and tp rank), key the
//          cp rank
//   pp     colour replica tp + tp_rank (the same replica, cp and tp rank), key the stage
//   dp     colour stage tp + tp_rank (the same place in the model), key the replica: the dp x cp
//          ranks whose gradients are averaged and, with -z 1, over which the state is sharded
//          (Megatron-LM's data-parallel group with context parallelism)
//   model  colour replica (its tp x pp ranks), key stage tp + tp_rank: the order
//          parameter_layout_of_rank numbers a replica's pieces in, so that rank 0 of it can
//          gather the model file (gpt2_gather_full)
//   embedding  colour replica tp + tp_rank on the first and last stage (the two wte copies of one
//          replica and tp rank; with pp = 1 the one stage is both, a group of that rank alone, as
//          in a V (v_shape: zbv, dualpipev), whose first stage holds the head and the only wte),
//          key the stage. Every rank must call
//          comm_split, so each rank of a middle stage gets a colour no other rank has,
//          dp cp tp + r (above every real colour): a group of its own, which it never uses
static void grid_init(Grid* g, CommGroup* world, int dp, int pp, int cp, int tp, int v_shape) {
    g->dp = dp;
    g->pp = pp;
    g->cp = cp;
    g->tp = tp;
    int r = world->rank;
    grid_coordinates(r, dp, cp, tp, &g->dp_rank, &g->stage, &g->cp_rank, &g->tp_rank);
    int replica = g->dp_rank * cp + g->cp_rank;
    comm_split(&g->tp_group, world, r / tp, g->tp_rank, "tp");
    comm_split(&g->cp_group, world, (g->stage * dp + g->dp_rank) * tp + g->tp_rank, g->cp_rank, "cp");
    comm_split(&g->pp_group, world, replica * tp + g->tp_rank, g->stage, "pp");
    comm_split(&g->dp_group, world, g->stage * tp + g->tp_rank, replica, "dp");
    comm_split(&g->model_group, world, replica, g->stage * tp + g->tp_rank, "model");
    g->pp_head = v_shape ? 0 : pp - 1;  // (pipeline_head_stage)
    g->in_embedding = g->stage == 0 || g->stage == g->pp_head;
    g->moe = 0, g->ep = 1, g->ep_rank = 0;  // (grid_fold_experts, for a model with experts)
    comm_split(&g->embedding, world, g->in_embedding ? replica * tp + g->tp_rank : dp * cp * tp + r, g->stage, "embedding");
}

// the replicas: -dp, or with -dp 0 as many as fill the world. Every rank checks the same flags
// against the same world, so a bad grid stops every rank, printed once (utils.h, check_every_rank)
static int grid_replicas(int dp, int pp, int cp, int tp, int world) {
    int model = pp * cp * tp;  // the ranks of one replica
    char sides[64];
    if (cp > 1) snprintf(sides, sizeof(sides), "-pp %d x -cp %d x -tp %d", pp, cp, tp);
    else snprintf(sides, sizeof(sides), "-pp %d x -tp %d", pp, tp);
    if (dp == 0) {
        check_every_rank(world % model == 0, "%s = %d does not divide the %d ranks, so no number of data-parallel "
                         "replicas fills the world; launch a multiple of %d ranks", sides, model, world, model);
        dp = world / model;
    }
    check_every_rank(dp * model == world, "-dp %d x %s = %d ranks, but the job has %d: the grid must hold every rank "
                     "exactly once (launch with mpirun -np %d%s)", dp, sides, dp * model, world, dp * model,
                     world % model == 0 ? ", or leave -dp out" : "");
    return dp;
}

// 5D: Megatron-LM's parallel folding (arXiv:2504.14960). The S = dp cp tp ranks of a stage hold
// its attention as dp x cp x tp; its MoE layers regroup the same S ranks as ep x edp, ep varying
// fastest over the stage's ranks in grid order: stage-local rank q = r mod S is at ep rank q mod ep
// of ep group q / ep. An ep group of tp ranks (or of cp x tp, or more) exchanges its tokens
// inside the machine where the tp group already talks, and experts take no ranks of their own:
// Megatron's example is CP 8 with EP 8 on 8 GPUs, where giving each its own axis would take 64.
//   ep     colour stage (S/ep) + q / ep, key q mod ep
//   edp    colour stage ep + q mod ep, key q / ep: the S/ep ranks whose experts are the same
//   seq    colour stage dp + dp_rank, key cp_rank tp + tp_rank: where one replica's sequences are
//   model  (replacing the one above) the stage's first M = max(tp, ep) ranks, key stage M + q:
//          their first tp hold one replica's dense slices, their first ep every expert once
//   gathering  colour stage M + q mod M, key q / M: rank 0 exactly for those M ranks (the run
//          layer asks only that; its members hold different pieces, so nothing reduces over it)
static void grid_fold_experts(Grid* g, CommGroup* world, int ep) {
    int r = world->rank, S = g->dp * g->cp * g->tp, q = r % S, M = g->tp > ep ? g->tp : ep;
    g->moe = 1, g->ep = ep;
    g->ep_rank = q % ep;
    comm_split(&g->ep_group, world, g->stage * (S / ep) + q / ep, q % ep, "ep");
    comm_split(&g->edp_group, world, g->stage * ep + q % ep, q / ep, "expert_dp");
    comm_split(&g->seq_group, world, g->stage * g->dp + g->dp_rank, g->cp_rank * g->tp + g->tp_rank, "seq");
    comm_group_free(&g->model_group);
    comm_split(&g->model_group, world, q < M ? 0 : 1 + r, g->stage * M + q, "model");
    comm_split(&g->gathering, world, g->stage * M + q % M, q / M, "gather");
}

static void grid_free(Grid* g) {
    comm_group_free(&g->tp_group);
    comm_group_free(&g->cp_group);
    comm_group_free(&g->pp_group);
    comm_group_free(&g->dp_group);
    comm_group_free(&g->model_group);
    comm_group_free(&g->embedding);
    if (g->moe) {
        comm_group_free(&g->ep_group);
        comm_group_free(&g->edp_group);
        comm_group_free(&g->seq_group);
        comm_group_free(&g->gathering);
    }
}

// the members of rank r's groups, from the numbering alone: "{0,1}"
static void grid_group_members(char* out, size_t cap, const Grid* g, int r, char which) {
    int d, s, c, t, n = 0;
    grid_coordinates(r, g->dp, g->cp, g->tp, &d, &s, &c, &t);
    size_t used = (size_t)snprintf(out, cap, "{");
    for (int q = 0; q < g->dp * g->pp * g->cp * g->tp; q++) {
        int qd, qs, qc, qt;
        grid_coordinates(q, g->dp, g->cp, g->tp, &qd, &qs, &qc, &qt);
        int same = which == 't' ? qd == d && qs == s && qc == c : which == 'c' ? qd == d && qs == s && qt == t
                 : which == 'p' ? qd == d && qc == c && qt == t : which == 'd' ? qs == s && qt == t
                 : qd == d && qc == c && qt == t && (qs == 0 || (qs == g->pp - 1 && g->pp_head == g->pp - 1));
        if (same && used < cap) used += (size_t)snprintf(out + used, cap - used, "%s%d", n++ ? "," : "", q);
    }
    if (used < cap) snprintf(out + used, cap - used, "}");
}

// what decides a rank's memory on this grid (llmc/memory_plan.h)
static RunLayout grid_run_layout(const Run* run, const Grid* g, PipeSpec spec, int zero, int sp, int allgather,
                                 int dump_grads, float capacity_factor, int pp_overlap) {
    RunLayout l = run_layout(run, TRAINER_3D, spec.m);
    l.ep = g->ep;
    l.capacity_factor = capacity_factor;
    l.dp = g->dp;
    l.cp = g->cp;
    l.cp_allgather = allgather;
    l.tp = g->tp;
    l.pp = g->pp;
    l.V = spec.V;
    l.sched = spec.sched;
    l.zero = zero;
    l.sp = sp;
    l.dump_grads = dump_grads;
    l.pp_overlap = g->moe ? pp_overlap : 0;  // (the MoE overlap's second lane)
    return l;
}

// ----------------------------------------------------------------------------------------------

// Validation and samples run forward-only walks through this replica's pipe, with the tp
// collectives inside; the run layer (llmc/run.h) calls these two with the model, the stage and
// the grid. Every replica evaluates and samples alike (same weights, same batches, same rng); with
// -cp each of its cp ranks on its part of the tokens.
typedef struct {
    GPT2* model;
    Stage* st;
    Grid* g;
    ContextParallel* cp;  // NULL without -cp
    Moe* moe;             // NULL for a dense model
} Grid3D;

// one validation batch, one micro-batch forward through the pipe: its loss on the stage with the
// head (0 elsewhere; the run layer broadcasts it over the pipe), with -cp the mean of this rank's
// tokens (the run layer averages over cp)
static float val_loss(void* trainer, DataLoader* val) {
    Grid3D* t = (Grid3D*)trainer;
    return stage_forward_pass(t->model, t->st, &t->g->pp_group, &t->g->tp_group, t->cp, val, NULL, t->model->B,
                              t->model->T).loss;
}

// a sample's forward pass through the pipe: this tp rank's slice of the logits, (1, T, Vp/tp)
// (with -cp its T/cp positions' rows), on the stage with the head, where its slot is free again but
// nothing has overwritten it; NULL elsewhere
static const floatX* sample_logits(void* trainer, const int* tokens, int T) {
    Grid3D* t = (Grid3D*)trainer;
    Walk w = stage_forward_pass(t->model, t->st, &t->g->pp_group, &t->g->tp_group, t->cp, NULL, tokens, 1, T / t->g->cp);
    return t->g->stage == t->g->pp_head ? w.head->logits : NULL;
}

// -cp: the cp rank holding position `position` of a T-token sample, and its row there
static int sample_row(void* trainer, int T, int position, int* owner) {
    return cp_row_of_position(((Grid3D*)trainer)->cp, T, position, owner);
}

// What the run layer (llmc/run.h) needs of this trainer, then the run's start: with -y 1 the
// resume, whatever grid wrote the checkpoint (its state is gathered into the model file's layout
// over dp and the model group); validation and samples as forward-only walks through the pipe,
// the vocabulary split over tp, the positions over cp; each step's bytes reported for the six
// groups (with experts nine: ep, edp and seq too).
static void grid_run_begin(Run* run, Grid3D* trainer, int sample_pad) {
    Grid* g = trainer->g;
    RunModel hooks = run_model(trainer->model, trainer, val_loss, sample_logits);
    hooks.pipe = &g->pp_group;         // the loss and the logits on the stage with the head
    hooks.pipe_head = g->pp_head;
    hooks.vocab = &g->tp_group;        // the vocabulary split over tp
    if (trainer->cp) {
        hooks.val_replicas = &g->cp_group;  // each cp rank its tokens' mean: the mean over cp
        hooks.seq = &g->cp_group;           // a sample's positions split over cp
        hooks.seq_row = sample_row;
    }
    hooks.sample_pad = sample_pad;     // (-sp: a multiple of tp tokens on each rank; -cp: whole chunks)
    hooks.split = &g->model_group;     // checkpoints gathered over the model group ...
    hooks.replicas = &g->dp_group;     // ... and the optimizer state over dp x cp: any grid resumes
    if (g->moe) {  // (with experts: by each stage's first max(tp, ep) ranks; the bias with them;
                   // -z 1's shards first over dp x cp, the experts' over edp)
        hooks.replicas = &g->gathering;
        hooks.state_shards = (StateShards){&g->dp_group, &g->edp_group};
        hooks.own.buffers[0] = trainer->moe->bias;  // (L, E) floats on the device, the same on every rank
        hooks.own.counts[0] = (size_t)trainer->moe->L * trainer->moe->E;
        hooks.own.num = 1;
    }
    CommGroup* groups[9] = {&g->tp_group, &g->cp_group, &g->pp_group, &g->dp_group, &g->embedding, &run->world,
                            &g->ep_group, &g->edp_group, &g->seq_group};
    run_begin(run, hooks, groups, g->moe ? 9 : 6);
    if (g->moe) run_bytes_on_own_line(run, &g->ep_group, COMM_ALL_TO_ALL);  // (moe_print_line prints them every step)
}

// the run's end: what main() allocated for this rank, freed (the comm layer last, in main())
static void grid_trainer_free(Grid3D* t, floatX* grad_shard, PipeAction* all_actions) {
    stage_free(t->st);
    if (t->cp) cp_free(t->cp);
    if (grad_shard) device_free(grad_shard);
    if (t->moe) moe_free(t->moe);
    free(all_actions);
    gpt2_free(t->model);
    grid_free(t->g);
}

// ----------------------------------------------------------------------------------------------
// The global gradient norm's share of this rank: the squares of the gradient elements it owns.
// Each element of the model is owned by exactly one rank of the world: of the dp replicas, the
// one whose shard [lo, hi) of the flat buffer holds it (with -z 1 the only one that has it
// reduced); of the tp ranks, each for its own slices, and rank 0 alone for a tensor tp replicates
// (LayerNorms, wpe, the row-parallel biases); of the stages, each for its own layers, and the
// first alone for the tied wte, of which the last stage holds a copy.
static float owned_norm_squared(const GPT2* model, const floatX* grads, size_t lo, size_t hi, int tp_rank) {
    const ParameterLayout* p = &model->layout;
    double sum = 0.0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        if (tensor_is_expert(model->config, i)) continue;  // (experts: expert_norm_squared)
        if (!p->sharded[i] && tp_rank != 0) continue;
        if (i == PARAM_WTE && !p->embedding) continue;  // the last stage's wte copy
        size_t a = p->offsets[i] > lo ? p->offsets[i] : lo, b = p->offsets[i] + p->sizes[i];
        b = b < hi ? b : hi;
        if (a < b) sum += global_norm_squared(grads + (a - lo), b - a);
    }
    return (float)sum;
}

// 5D: the experts' gradients. A token's gradient weighs 1/(B T m), T a rank's T/cp tokens: dp cp
// times its weight in the global batch's mean, which the dense tensors' mean over dp x cp undoes.
// An expert gathers, through the all-to-all, the tokens of the ep ranks of its group, each token
// of the stage routed by exactly one rank (with -sp by one tp rank), so that its copies over edp
// (S/ep of them, S = dp cp tp) hold between them every token of the step once: their mean is
// dp cp ep / S = ep/tp times the global gradient. Read scaled by tp/ep (the norm, AdamW,
// -dump_grads), it is the gradient one process would compute.
static float expert_grad_scale(const Grid* g) { return (float)g->tp / (float)g->ep; }

// the gradients' means: the dense tensors as a dense model's, all-reduced (AVG) over dp x cp,
// the buffer's first range; each rank's experts, its last, over the ranks that hold the same ones
// (edp, AVG). With -z 1 each a reduce-scatter over the same group instead, which leaves the rank
// the shard of each that it updates (llmc/model.h, layout_flat_shards): the dense shard of N_dense
// / (dp cp) elements, then the experts' of N_experts / edp, one after the other in grad_shard
static void reduce_dense_and_experts(GPT2* model, Grid* g, floatX* grad_shard) {
    const ParameterLayout* p = &model->layout;
    size_t lo, hi;
    moe_expert_range(p, &lo, &hi);
    if (grad_shard) {
        uint64_t dense_lo, n_dense, experts_lo, n_experts;
        layout_flat_shards(p, &dense_lo, &n_dense, &experts_lo, &n_experts);
        comm_reduce_scatter(&g->dp_group, model->grads_memory, grad_shard, n_dense, COMM_FLOATX, COMM_AVG);
        comm_reduce_scatter(&g->edp_group, model->grads_memory + lo, grad_shard + n_dense, n_experts, COMM_FLOATX, COMM_AVG);
        return;
    }
    comm_all_reduce(&g->dp_group, model->grads_memory, lo, COMM_FLOATX, COMM_AVG);
    if (g->edp_group.size > 1) comm_all_reduce(&g->edp_group, model->grads_memory + lo, hi - lo, COMM_FLOATX, COMM_AVG);
}

// the experts' share of the gradient norm, read as the optimizer reads them: each expert counted
// by one of its copies (edp rank 0), or with -z 1 each shard by the rank that holds it (grad_shard)
static float expert_norm_squared(const GPT2* model, const Grid* g, const floatX* grad_shard) {
    float scale = expert_grad_scale(g);
    if (grad_shard) {
        uint64_t dense_lo, n_dense, experts_lo, n_experts;
        layout_flat_shards(&model->layout, &dense_lo, &n_dense, &experts_lo, &n_experts);
        return global_norm_squared(grad_shard + n_dense, n_experts) * scale * scale;
    }
    size_t lo, hi;
    moe_expert_range(&model->layout, &lo, &hi);
    return g->edp_group.rank == 0 ? global_norm_squared(model->grads_memory + lo, hi - lo) * scale * scale : 0.0f;
}

// This replica's walk over its pipe (llmc/stage.h): the tp collectives inside each chunk (and
// with -cp the ring over cp inside attention), the messages over pp; micro-batch i of the step
// is chunk i dp + dp_rank of the loader's batch (its cp ranks read the same one and keep each
// its tokens), and each token's gradient weighs 1/(B T m), T this rank's tokens of a sequence: the
// mean of its share (the dp reduction averages the dp x cp shares, all of equal size: the mean
// of every token's, as Megatron-LM scales it)
static Walk replica_walk(GPT2* model, Stage* st, Grid* g, ContextParallel* cp, DataLoader* train, int m) {
    Walk w = walk_init(model, st, &g->pp_group, &g->tp_group, cp, model->B, model->T);
    w.data = train;
    w.data_ranks = g->dp;
    w.data_rank = g->dp_rank;
    w.dloss = 1.0f / (float)((size_t)model->B * model->T * m);
    return w;
}

// With -z 1 (ZeRO-1 over the dp group): AdamW on this replica's shard of the rank's buffer,
// whose reduced gradient the reduce-scatter left in grad_shard, then the updated parameters
// all-gathered in place over dp (N floatX), so that every replica holds them all. With experts
// twice: the dense shard so, then the experts' shard, its gradient read scaled by
// expert_grad_scale and its parameters all-gathered over edp. Returns the learning rate.
static float zero1_adamw_step(GPT2* model, const Run* run, Grid* g, const floatX* grad_shard, int step, float grad_norm,
                              float* clip_scale) {
    AdamWConfig opt = train_adamw_config(&run->args, step, run->max_steps, grad_norm, clip_scale);
    uint64_t lo[2], n[2];  // the dense shard's first element and size; the experts' (n 0 without)
    layout_flat_shards(&model->layout, &lo[0], &n[0], &lo[1], &n[1]);
    for (int r = 0; r < 2 && n[r] > 0; r++) {
        // the range [lo, lo + n) of the rank's flat buffer (llmc/optimizer.h): its parameters are
        // at lo in the whole buffer (every replica holds them all); the gradients, and the master
        // weights and moments (layout_shard_flat allocated only the shards of those), at `at` in
        // theirs; lo itself says which tensor each element is of (weight decay) and its place in
        // the model file (the rounding index, so that the replicas round alike)
        size_t at = r == 0 ? 0 : n[0];
        float scale = r == 0 ? *clip_scale : *clip_scale * expert_grad_scale(g);
        float* master = model->master_memory ? model->master_memory + at : NULL;
        optimizer_adamw_step(model->params_memory + lo[r], master, grad_shard + at, model->m_memory + at,
                             model->v_memory + at, lo[r], lo[r] + n[r], &model->layout, opt, scale, step + 1);
    }
    comm_all_gather_in_place(&g->dp_group, model->params_memory, n[0], COMM_FLOATX);
    if (n[1] > 0) {
        comm_all_gather_in_place(&g->edp_group, model->params_memory + model->layout.count - model->layout.expert_region,
                                 n[1], COMM_FLOATX);
    }
    return opt.lr;
}

// with -z 1 the reduce-scatter's output: the replica's shard of the rank's reduced gradients, S
// elements (layout_state_held), one of the memory table's communication buffers
static floatX* zero1_grad_shard_alloc(const ParameterLayout* layout) {
    allocation_kind(ALLOC_COMM);
    return (floatX*)device_malloc(layout_state_held(layout) * sizeof(floatX));
}

// The replica's shard [lo, hi) of this rank's flat buffer over the dp group (dp x cp ranks):
// with -z 1 the elements it updates (the reduce-scatter's output, S each); without, the elements
// whose squares it counts for the gradient norm (every replica has all of them reduced, so each
// counts a 1/(dp cp) share and the world's sum counts every element once)
static void replica_shard(const ParameterLayout* layout, int zero, const Grid* g, size_t* lo, size_t* hi) {
    int n = g->dp_group.size;
    size_t N = layout->count, shard = zero ? (N - layout->expert_region) / n : (N + n - 1) / n;
    *lo = (size_t)g->dp_group.rank * shard;
    *hi = *lo + shard < N ? *lo + shard : N;
    *lo = *lo < *hi ? *lo : *hi;
}

// -dump_grads: the first step's gradients as a model file. With -z 1 each replica has only its
// shard reduced: all-gather the shards (N floatX) over dp (x cp) first, with experts theirs over
// edp; then replica 0's model group gathers its pieces to world rank 0, which writes the file
static void dump_gradients(GPT2* model, Grid* g, const floatX* grad_shard, const char* path) {
    if (grad_shard) {
        uint64_t dense_lo, n_dense, experts_lo, n_experts;
        layout_flat_shards(&model->layout, &dense_lo, &n_dense, &experts_lo, &n_experts);
        comm_all_gather(&g->dp_group, grad_shard, model->grads_memory, n_dense, COMM_FLOATX);
        if (n_experts > 0) {
            comm_all_gather(&g->edp_group, grad_shard + n_dense,
                            model->grads_memory + model->layout.count - model->layout.expert_region, n_experts, COMM_FLOATX);
        }
    }
    if (!g->moe) {
        if (g->dp_group.rank == 0) gpt2_write_gathered(model, &g->model_group, model->grads_memory, path);
        return;
    }
    // with experts: theirs read as the optimizer reads them (expert_grad_scale), in a copy, then
    // gathered by each stage's first max(tp, ep) ranks (grid_fold_experts)
    if (g->gathering.rank != 0) return;
    floatX* scaled = moe_scaled_grads_copy(model, expert_grad_scale(g));
    gpt2_write_gathered(model, &g->model_group, scaled, path);
    device_free(scaled);
}

// -check_replicas: every copy of a tensor identical, over tp (the tensors tp replicates), the
// embedding group (the tied wte) and dp (everything, over the dp x cp ranks)
static void check_copies(const GPT2* model, Grid* g, int step) {
    unsigned wte_only = 1u, everything = (1u << NUM_PARAMETER_TENSORS) - 1, experts = 0, replicated = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        if (tensor_is_expert(model->config, i)) experts |= 1u << i;
        else if (!model->layout.sharded[i]) replicated |= 1u << i;
    }
    train_check_replicas(model, &g->tp_group, step, &replicated, "tp copies of the replicated tensors");
    if (g->embedding.size > 1) train_check_replicas(model, &g->embedding, step, &wte_only, "wte copies of the first and last stage");
    unsigned dense = everything & ~experts;
    train_check_replicas(model, &g->dp_group, step, &dense, "dp replicas");
    if (g->moe) train_check_replicas(model, &g->edp_group, step, &experts, "experts' copies");
}

// The communication of one step of world rank 0 (dp 0, stage 0, cp 0, tp 0), payload per group
// from the layout alone (the README derives it). m micro-batches of B x T on this replica, T the
// rank's tokens of a sequence (T/cp of -t); Ls = L/pp layers on this stage; first = 1 (stage 0
// holds the embedding), last = 1 when pp = 1 or in a V (it holds the head too); a = B T C X, one
// activation.
//   tp   per micro-batch 4 Ls + first + last collectives of a: all-reduces, or with -sp each of
//        them a reduce-scatter plus an all-gather; the loss's 3 B T fp32 (last);
//        with -sp per step the LayerNorm gradients, (4 Ls + 2 last) C X. -r 2 reruns each layer's
//        forward before its backward: m Ls a more all-reduced, or with -sp m Ls a more
//        reduce-scattered and 2 m Ls a more all-gathered
//   cp   per layer of the stage and micro-batch, attention's K,V blocks of B T 2C/tp X:
//        cp_attention_bytes (llmc/context_parallel.h) with Ls layers and m micro-batches
//   pp   (2V - 1) m messages of a / (tp with -sp) each way (pp > 1; in a V 2 m: chunk 0's
//        activations and chunk 1's gradients, with stage 1); the loss broadcast, 4 bytes
//   dp   the gradients: an all-reduce of the rank's N parameters X, or with -z 1 a reduce-scatter
//        and an all-gather of N X (N padded to dp cp x 128); the loss's average, 4 bytes
//   embedding  the tied wte's gradient on this rank, Vp/tp C X (pp > 1, not in a V)
//   world      the gradient norm's float
// With experts (5D) an MoE layer has no tp collective (2 Ls + first + last a micro-batch, not
// 4 Ls + ...); with -sp the routers' gradients (Ls E C X) join the LayerNorms' over tp; dp
// reduces the dense tensors only (N_dense X), edp the experts (N_experts X, edp > 1; with -z 1
// reduce-scattered and all-gathered, N_experts padded to edp x 128); the MoE layers' all-to-alls
// over ep follow the routing and print on the step's MoE line
typedef struct {
    double tp_all_reduce, tp_reduce_scatter, tp_all_gather, pp_send, pp_recv, pp_broadcast;
    double dp_all_reduce, dp_reduce_scatter, dp_all_gather, edp_all_reduce, edp_reduce_scatter, embedding, world;
    CpBytes cp;
} StepBytes;

static StepBytes step_bytes(GPT2Config c, LayerDims d, PipeSpec s, const ParameterLayout* p, int B, int T, int cp,
                            int allgather, int zero, int rerun) {
    double X = sizeof(floatX), a = (double)B * T * c.channels * X, m = s.m, Ls = (double)c.num_layers / s.p;
    int sp = d.seq_shards > 1, v_shape = pipeline_is_v(s), last = s.p == 1 || v_shape, moe = gpt2_is_moe(c);
    double collectives = (moe ? 2 : 4) * Ls + 1 + last, routers = moe ? Ls * c.experts * c.channels * X : 0;
    double experts = (double)p->expert_region;  // (0 in a dense model)
    StepBytes b;
    memset(&b, 0, sizeof(b));
    b.tp_all_reduce = last * m * 3.0 * B * T * 4 + (sp ? (4 * Ls + 2 * last) * c.channels * X + routers : m * collectives * a);
    b.tp_reduce_scatter = b.tp_all_gather = sp ? m * collectives * a : 0;
    if (rerun) {  // -r 2 reruns each layer's forward: attproj's sum again, with -sp both gathers
        if (sp) b.tp_reduce_scatter += m * Ls * a, b.tp_all_gather += 2 * m * Ls * a;
        else b.tp_all_reduce += m * Ls * a;
    }
    b.pp_send = b.pp_recv = s.p > 1 ? (v_shape ? 2.0 : 2.0 * s.V - 1) * m * a / d.seq_shards : 0;
    b.pp_broadcast = 4;
    b.dp_all_reduce = (zero ? 0 : ((double)p->count - experts) * X) + 4;
    b.edp_all_reduce = zero ? 0 : experts * X;  // (counted where edp > 1)
    b.edp_reduce_scatter = zero ? experts * X : 0;  // (and as much all-gathered)
    b.dp_reduce_scatter = b.dp_all_gather = zero ? ((double)p->count - experts) * X : 0;
    b.embedding = s.p > 1 && !v_shape ? (double)d.Vp_rank * c.channels * X : 0;
    b.world = 4 + (moe ? 4.0 * (c.num_layers * c.experts + 3) : 0);  // (experts: the step's MoE figures)
    b.cp = cp_attention_bytes(B, T, d.att, cp, Ls, m, allgather, rerun);
    return b;
}

// what rank 0 prints at the start: the grid and every rank's groups, each stage's layers, the
// schedule's chart, the memory of each stage's ranks and of rank 0 part by part, and rank 0's
// communication per step beside the formulas

static void print_layout(const Run* run, const GPT2* model, const Stage* st, const Grid* g, const ContextParallel* cp,
                         int zero) {
    const TrainArgs* args = &run->args;
    GPT2Config c = model->config;
    LayerDims d = model->dims;
    PipeSpec s = st->spec;
    int sp = d.seq_shards > 1, world = g->dp * g->pp * g->cp * g->tp, Tl = args->T / g->cp;
    BannerRow rows[20];
    int n = train_banner_model(rows, g->moe ? "train_gpt2_3d (5D)" : "train_gpt2_3d (3D)", args->model, c);
    banner_row(&rows[n++], "dp x pp x cp x tp", "%d x %d x %d x %d = %d ranks", g->dp, g->pp, g->cp, g->tp, world);
    banner_row(&rows[n++], "tensor parallel", "%d of the %d heads a rank%s", d.NH, c.num_heads, sp ? ", sequence parallel" : "");
    if (g->cp > 1) {
        banner_row(&rows[n++], "context parallel", "%d of T per rank, %s, %s", Tl, cp_split_name(cp->split),
                   cp->allgather ? "all-gather of K,V" : "ring of K,V");
    }
    banner_row(&rows[n++], "pipeline", "%s, %d stage%s%s", pipe_schedule_names[s.sched], s.p, s.p > 1 ? "s" : "",
               pipeline_is_v(s) ? ", two chunks each in a V" : s.V > 1 ? ", interleaved" : "");
    banner_row(&rows[n++], "data parallel", "%d replica%s%s", g->dp, g->dp > 1 ? "s" : "", zero ? ", ZeRO-1" : "");
    if (g->moe) {
        int S = g->dp * g->cp * g->tp;
        banner_row(&rows[n++], "experts, top-k", "%d experts, each token to %d", c.experts, c.topk);
        banner_row(&rows[n++], "expert parallel", "ep %d x edp %d, folded over a stage's %d dp x cp x tp ranks; %d experts a rank",
                   g->ep, S / g->ep, S, c.experts / g->ep);
    }
    banner_row(&rows[n++], "micro-batches", "%d per replica of B x T = %d x %d", s.m, args->B, args->T);
    banner_row(&rows[n++], "recomputation", "%s", recompute_names[args->recompute]);
    n = run_banner_rows(run, rows, n);
    train_print_banner(rows, n);
    printf("the grid (tp fastest, then cp, dp, pp) and each rank's groups:\n");
    for (int r = 0; r < world && r < 64; r++) {
        int dr, sr, cr, tr;
        grid_coordinates(r, g->dp, g->cp, g->tp, &dr, &sr, &cr, &tr);
        char groups[5][160];
        const char which[5] = {'t', 'c', 'p', 'd', 'e'};
        for (int k = 0; k < 5; k++) grid_group_members(groups[k], sizeof(groups[k]), g, r, which[k]);
        int embeds = sr == 0 || (sr == g->pp - 1 && g->pp_head == g->pp - 1);
        printf("  rank %2d  dp %d pp %d cp %d tp %d   tp %-10s cp %-10s pp %-10s dp %-10s%s%s", r, dr, sr, cr, tr,
               groups[0], groups[1], groups[2], groups[3], embeds && g->pp_head > 0 ? "embedding " : "",
               embeds && g->pp_head > 0 ? groups[4] : "");
        if (g->moe) {  // the fold: ep consecutive ranks of the stage, edp every ep-th
            int S = g->dp * g->cp * g->tp, q = r % S, first = r - q;
            printf("  ep {%d..%d} edp {", first + q / g->ep * g->ep, first + q / g->ep * g->ep + g->ep - 1);
            for (int e = q % g->ep; e < S; e += g->ep) printf("%s%d", e < g->ep ? "" : ",", first + e);
            printf("}");
        }
        printf("\n");
    }
    if (world > 64) printf("  ... (%d ranks)\n", world);
    printf("stages (each split over its %d tp ranks; device memory predicted for each of their ranks):\n", g->tp);
    for (int stage = 0; stage < s.p; stage++) {
        size_t unpadded = parameter_layout_grid(c, g->tp, 0, s.p, stage, s.V, pipeline_is_v(s)).count;
        MemoryPlan plan = memory_plan(c, d.target, &run->layout, stage, 0);
        const ParameterLayout l = plan.layout;
        stage_print_layers(stage, &l, s.V, st->chunk_layers);
        printf("  %zu parameters per tp rank, %.1f MB (activations %.1f MB)\n", unpadded, plan.total / 1e6,
               plan.activations / 1e6);
    }
    pipeline_print_chart(s);
    printf("memory of rank 0 (dp 0, stage 0, cp 0, tp 0), Psi = its parameters:\n");
    memory_plan_print(&run->plan, c, &run->layout);
    int rerun = layer_rerun_needed(stage_kept(args->recompute, s, d));
    StepBytes b = step_bytes(c, d, s, &model->layout, args->B, Tl, g->cp, cp && cp->allgather, zero, rerun);
    double a = (double)args->B * Tl * c.channels * sizeof(floatX);
    printf("communication per step of rank 0 (payload per group; a = B T C X = %.0f bytes%s, Ls = L/pp = %d layers):\n", a,
           g->cp > 1 ? " with T = T/cp" : "", c.num_layers / s.p);
    int head_here = s.p == 1 || pipeline_is_v(s);  // (stage 0 holds the head too)
    const char* last = head_here ? " + 1 (head)" : "";
    int per_layer = g->moe ? 2 : 4;  // (an MoE layer's MLP half has no tp collective)
    if (sp) {
        printf("  tp all-gather      %12.0f bytes  m (%d Ls + 1%s) a\n", b.tp_all_gather, per_layer, last);
        printf("  tp reduce-scatter  %12.0f bytes  m (%d Ls + 1%s) a\n", b.tp_reduce_scatter, per_layer, last);
        printf("  tp all-reduce      %12.0f bytes  %s(4 Ls%s) C X (LayerNorm gradients)%s\n", b.tp_all_reduce,
               head_here ? "m 3 B T 4 (loss) + " : "", head_here ? " + 2" : "", g->moe ? " + Ls E C X (routers)" : "");
    } else {
        printf("  tp all-reduce      %12.0f bytes  m (%d Ls + 1%s) a%s\n", b.tp_all_reduce, per_layer, last,
               head_here ? " + m 3 B T 4 (loss)" : "");
    }
    if (layer_rerun_needed(stage_kept(args->recompute, s, d))) {
        printf("  (tp, -r 2: + m Ls a %s for the forward rerun before each layer's backward)\n",
               sp ? "reduce-scattered and 2 m Ls a all-gathered" : "all-reduced");
    }
    if (g->cp > 1 && cp->allgather) {
        printf("  cp all-gather      %12.0f bytes  %d m Ls cp B T 2C/tp X (K,V forward, %sbackward)\n", b.cp.all_gather,
               2 + rerun, rerun ? "again before the backward, " : "");
        printf("  cp reduce-scatter  %12.0f bytes  m Ls cp B T 2C/tp 4 (dK, dV in fp32)\n", b.cp.reduce_scatter);
    } else if (g->cp > 1) {
        printf("  cp send, recv      %12.0f bytes  each: m Ls (%d (cp-1) B T 2C/tp X + cp B T 2C/tp 4) (K,V; dK,dV)\n",
               b.cp.send, 2 + rerun);
    }
    printf("  pp send, recv      %12.0f bytes  each: %s m a%s; + 4 (loss broadcast)\n", b.pp_send,
           pipeline_is_v(s) ? "2" : "(2V-1)", sp ? " / tp" : "");
    const char* over = g->cp > 1 ? " (over dp x cp)" : "";
    const char* dense = g->moe ? "_dense" : "";
    if (zero) printf("  dp reduce-scatter  %12.0f bytes  N%s X, and as much all-gathered; + 4 (loss)%s\n", b.dp_reduce_scatter, dense, over);
    else printf("  dp all-reduce      %12.0f bytes  N%s X + 4 (loss)%s\n", b.dp_all_reduce, dense, over);
    if (g->moe && zero) {
        printf("  edp reduce-scatter %12.0f bytes  N_experts X, and as much all-gathered (this rank's %d experts, over the %d ranks "
               "holding them)\n", b.edp_reduce_scatter, c.experts / g->ep, g->edp_group.size);
    } else if (g->moe && g->edp_group.size > 1) {
        printf("  edp all-reduce     %12.0f bytes  N_experts X (this rank's %d experts, over the %d ranks holding them)\n",
               b.edp_all_reduce, c.experts / g->ep, g->edp_group.size);
    }
    printf("  embedding          %12.0f bytes  Vp/tp C X (the tied wte's gradient%s)\n", b.embedding,
           pipeline_is_v(s) ? "; none in a V: one wte, on stage 0" : "");
    printf("  world all-reduce   %12.0f bytes  4 (the gradient norm)%s\n", b.world,
           g->moe ? " + 4 (L E + 2) (the loads, kept and dropped slots) + 4 (the aux loss)" : "");
    if (g->moe && st->moe->tokens.seq_group && st->moe->balance == BALANCE_AUX) {  // (moe_route: each layer's f and P)
        printf("  seq all-reduce     %12.0f bytes  m Ls B 2E 4 (the aux loss's f and P of each sequence, over cp x tp)\n",
               (double)s.m * c.num_layers / s.p * args->B * 2 * c.experts * 4);
    }
}

// A layer's widths on this rank (tp slices; with -sp its T/cp tokens split over tp), checked
// against the grid: cp whole chunks of the split, tp dividing the heads, 4C and Vp. A sequence's
// tokens on this rank (and a sample's, padded to this multiple) are whole chunks, and with -sp
// whole shards of T/cp over tp: that multiple in *tokens_multiple
static LayerDims grid_dims(GPT2Config config, int cp_size, int tp, int sp, CpSplit split, int T, int* tokens_multiple) {
    if (cp_size > 1) cp_check_split(split, cp_size, T, "cp ranks");
    LayerDims dims = tp_layer_dims(config, tp, sp, T, "tp ranks");
    *tokens_multiple = cp_size > 1 ? cp_tokens_multiple(split, cp_size, dims.seq_shards) : dims.seq_shards;
    if (T % *tokens_multiple != 0) {
        fail("-sp 1 splits each rank's T/cp = %d tokens over the %d tp ranks: -t %d must be a multiple of %d (cp x tp = %d, "
             "and the %s split's chunks)", T / cp_size, tp, T, *tokens_multiple, cp_size * tp, cp_split_name(split));
    }
    if (cp_size > 1) {
        cp_check_head_size(dims.att / dims.NH);
        dims.target.flash = 1;  // attention keeps lse, (B, NH/tp, Tl) fp32, as flash attention does
    }
    return gpt2_is_moe(config) ? layer_dims_moe(dims) : dims;  // (experts: no dense MLP in the arenas)
}

// 5D: the checks of a model with experts on this grid (every rank checks; all stop together),
// then the fold (grid_fold_experts)
static void grid_add_experts(Grid* g, CommGroup* world, const Run* run, MoeFlags f, int sp) {
    GPT2Config c = run->config;
    int S = g->dp * g->cp * g->tp;
    check_every_rank(c.experts % f.ep == 0 && S % f.ep == 0, "-ep %d: the E = %d experts are split over ep of a stage's "
                     "dp x cp x tp = %d ranks, so ep must divide both", f.ep, c.experts, S);
    check_every_rank(g->tp == 1 || sp, "-tp %d with experts needs -sp 1: each rank routes the tokens it holds, and "
                     "without sequence parallelism every tp rank holds all of them, so each token would be routed %d "
                     "times", g->tp, g->tp);
    check_every_rank(run->args.recompute == 0, "-r %d with experts: MoE layers keep every activation (-r 0); their "
                     "recomputation is not written yet", run->args.recompute);
    grid_fold_experts(g, world, f.ep);
}

// ... and its MoE state: one record a slot of the stage (each micro-batch in flight keeps its
// routing), the tokens a rank routes (its T/cp of each sequence, with -sp its tp share), the
// sequence group that adds up the aux loss's figures, with -pp_overlap the MoE overlap's second
// lane of rows (llmc/moe.h: MoeLane); the run's identity gains the MoE settings
// (they decide the trajectory; the grid does not, except through the capacity, which counts a
// rank's tokens)
static void grid_moe_alloc(Moe* moe, Stage* st, Grid* g, Run* run, MoeFlags f, int Tl, int BTs, int pp_overlap) {
    GPT2Config c = run->config;
    MoeBalance balance = moe_balance_of(f.balance);
    int sp = BTs < run->args.B * Tl;
    MoeTokens tokens = {run->args.B, Tl, BTs, sp ? g->tp_rank * BTs : 0, run->args.T, g->cp * g->tp > 1 ? &g->seq_group : NULL};
    moe_alloc(moe, c, g->ep, g->ep_rank, &g->ep_group, tokens, st->num_slots, st->chunk_layers, balance, f.aux_alpha,
              f.bias_rate, f.capacity_factor);
    if (pp_overlap) moe_add_lane(moe);
    st->moe = moe;
    run_identity_add(&run->identity, "moe", "E=%d k=%d balance=%s alpha=%.9g gamma=%.9g cf=%.9g", c.experts, c.topk,
                     moe_balance_name(balance), f.aux_alpha, f.bias_rate, f.capacity_factor);
    if (f.capacity_factor > 0) run_identity_add(&run->identity, "capacity", "%d tokens a rank", BTs);
}

// One training step of this rank (the header's steps 1-7, and with experts c.), after run_step_begin: the schedule
// over the replica's micro-batches, then the reductions across groups, the norm, AdamW, the step
// line. timed: the walk records each action's times (-timeline, on replica 0's pipeline)
static void grid_step(Run* run, Grid3D* t, Walk* walk, const PipeAction* actions, int n, floatX* grad_shard, int zero,
                      int step, int timed) {
    GPT2* model = t->model;
    Grid* g = t->g;
    const ParameterLayout* layout = &model->layout;
    size_t lo, hi;  // this rank's shard of its buffer over dp x cp (replica_shard)
    replica_shard(layout, zero, g, &lo, &hi);
    // 1. the schedule over this replica's m micro-batches: each stage's forwards and
    // backwards with the exchanges between them (pp group), the tp collectives inside each
    // chunk, with -cp attention's K,V exchanges over cp inside each layer. Each of this
    // rank's tokens' gradient is weighted 1/(B T m), T its T/cp tokens of a sequence: the
    // mean of its share; the mean over the shares follows in 4.
    watchdog_phase("pipeline schedule", step);
    if (t->moe) moe_step_begin(t->moe);
    device_memset_zero(model->grads_memory, layout->count * sizeof(floatX));
    walk->loss = 0.0f;
    walk->times = timed ? t->st->times : NULL;
    walk->t0 = run->step_start;
    pipeline_walk(walk, actions, n);  // (llmc/pipeline_walk.h, the PP chapter's walk)
    dataloader_advance(&run->train);
    // 2. -sp: the LayerNorm weights of this stage saw only this rank's tokens: all-reduce
    // their gradients over tp ((Ls, C) each of ln1w, ln1b, ln2w, ln2b; (C) each of lnfw,
    // lnfb on the last stage)
    watchdog_phase("gradient reductions", step);
    if (model->dims.seq_shards > 1) layernorm_grads_all_reduce(model, &g->tp_group);
    // 3. the tied embedding: the first stage's wte rows (this tp rank's Vp/tp) have their
    // gradient from the lookups, the last stage's copy from the LM head. All-reduce
    // (Vp/tp, C) over the embedding group, so both copies get the sum and the same update.
    // A SUM: the two are parts of one tensor's gradient (as two uses of it in one process
    // add); the replicas' gradients below are whole estimates of the same one, so an AVG.
    // (In a V the first stage holds the head too, and its one wte has both parts already.)
    if (g->embedding.size > 1) {
        comm_all_reduce(&g->embedding, model->grads.wte, layout->sizes[PARAM_WTE], COMM_FLOATX, COMM_SUM);
    }
    // 4. data parallelism: the mean of the replicas' gradients. An all-reduce (AVG) of this
    // rank's whole buffer (N) over dp; with -z 1 a reduce-scatter (AVG) that leaves this rank
    // its 1/(dp cp) shard, the part of the buffer it updates. With -cp the group holds the
    // replicas' cp ranks too (dp x cp): each holds the gradient of its tokens' mean loss, the
    // ring having carried every token's part to the keys' owners, so the mean over the dp x cp
    // equal shares is the mean over every token of the step, as one process would compute.
    // With experts, theirs over edp instead (reduce_dense_and_experts)
    if (t->moe) reduce_dense_and_experts(model, g, grad_shard);
    else if (zero) comm_reduce_scatter(&g->dp_group, model->grads_memory, grad_shard, layout_state_held(layout), COMM_FLOATX, COMM_AVG);
    else comm_all_reduce(&g->dp_group, model->grads_memory, layout->count, COMM_FLOATX, COMM_AVG);
    // 5. the loss lives on the stage with the head (walk.loss is 0 on the others): broadcast
    // over the pipe, then averaged over the replicas and their cp ranks (one float each, each a
    // mean of as many tokens), so that every rank prints and checks the same value
    float loss = walk->loss / (float)t->st->spec.m;
    comm_broadcast_host(&g->pp_group, &loss, sizeof(float), g->pp_head);
    comm_all_reduce_scalar(&g->dp_group, &loss, COMM_AVG);
    // 6. the global gradient norm: each rank's owned squares (owned_norm_squared), summed
    // over the world (all-reduce of one float)
    watchdog_phase("AdamW update", step);
    float squares = owned_norm_squared(model, zero ? grad_shard : model->grads_memory + lo, lo, hi, g->tp_rank);
    if (t->moe) squares += expert_norm_squared(model, g, grad_shard);
    comm_all_reduce_scalar(&run->world, &squares, COMM_SUM);
    float grad_norm = sqrtf(squares);
    // the loss and the norm are the same on every rank, so every rank stops here together
    train_stop_if_not_finite(step, loss, grad_norm);
    // 7. AdamW. Without ZeRO on the whole buffer (every replica the same update; replicated
    // tensors and both wte copies round alike: the layout's rounding index); with -z 1 on
    // this replica's shard [lo, hi), then all-gathered over dp (zero1_adamw_step). With experts,
    // theirs read scaled by expert_grad_scale (moe_adamw_step)
    float clip_scale, lr;
    if (zero) lr = zero1_adamw_step(model, run, g, grad_shard, step, grad_norm, &clip_scale);
    else if (!t->moe) lr = train_adamw_step(model, &run->args, step, run->max_steps, grad_norm, &clip_scale);
    else {
        AdamWConfig opt = train_adamw_config(&run->args, step, run->max_steps, grad_norm, &clip_scale);
        moe_adamw_step(model, opt, clip_scale, expert_grad_scale(g), step);
        lr = opt.lr;
    }
    // 8. (c.) with experts, the step's balance over the global batch (llmc/moe.h: the loads, L x E
    // counts, and the aux loss all-reduced over the world; -balance bias's update from them)
    MoeFigures figures;
    if (t->moe) {
        double aux_copies = (double)g->dp * t->st->spec.m * g->cp * g->tp;  // (each micro-batch's, on its cp x tp ranks)
        figures = moe_step_figures(t->moe, &run->world, aux_copies);
        moe_log_fields(run->step_extra, sizeof(run->step_extra), figures);
    }
    // the step line and main.log (llmc/run.h): rank 0's bytes per group equal the formulas
    // printed at the start
    run_step_end(run, step, loss, lr, grad_norm, clip_scale);
    if (t->moe && run->rank == 0) moe_print_line(t->moe, step, figures);
    if (t->moe && run->rank == 0) moe_print_overlap(t->moe, step);  // (what the MoE overlap hides)
}

int main(int argc, char** argv) {
    // ---- the flags: the common ones (llmc/train.h) and this trainer's own; then the
    // communication layer and the model's config (llmc/run.h)
    Run run;
    const char *dump_grads = NULL, *sched_name = "1f1b", *split_name = "zigzag", *cp_comm = "ring";
    MoeFlags moe_flags = MOE_FLAGS_DEFAULT;  // (-experts and the rest: a model with experts, 5D)
    int dp = 0, pp = 1, cp_size = 1, tp = 1, sp = 0, tp_overlap = 0, vp = 1, zero = 0, timeline = 0, check_replicas = 0, pp_overlap = 0;
    const ArgSpec own[] = {
        {"-dp", ARG_INT, &dp, 0, ARG_NO_MAX, "data-parallel replicas (0: the number of ranks / (pp x cp x tp))"},
        {"-pp", ARG_INT, &pp, 1, ARG_NO_MAX, "pipeline stages; L must divide by pp x vp"},
        {"-cp", ARG_INT, &cp_size, 1, ARG_NO_MAX, "context-parallel ranks: each holds T/cp tokens of every sequence"},
        {"-cp_layout", ARG_STRING, &split_name, 0, 0, "with -cp, how a sequence is split: zigzag (chunks r and 2cp-1-r of 2cp) or contiguous"},
        {"-cp_comm", ARG_STRING, &cp_comm, 0, 0, "with -cp, how attention gets the other ranks' keys and values: ring or allgather"},
        {"-tp", ARG_INT, &tp, 1, ARG_NO_MAX, "tensor-parallel ranks per stage; NH, 4C and Vp must divide by it"},
        {"-sp", ARG_INT, &sp, 0, 1, "1: sequence parallelism inside the tp group (T/cp must divide by tp)"},
        {"-tp_overlap", ARG_INT, &tp_overlap, 0, 1, "1: tp's collectives in ring steps under their GEMMs (train_gpt2_tp's -tp_overlap)"},
        {"-sched", ARG_STRING, &sched_name, 0, 0, "pipeline schedule: afab (GPipe), 1f1b, interleaved (with -vp), zb (ZB-H1), zbv (ZB-V), dualpipev (DualPipeV)"},
        {"-vp", ARG_INT, &vp, 1, ARG_NO_MAX, "chunks of layers per stage (virtual stages) for -sched interleaved (zbv and dualpipev: 2, their V)"},
        {"-z", ARG_INT, &zero, 0, 1, "1: ZeRO-1, the AdamW state sharded over the dp replicas (and their cp ranks)"},
        {"-pp_overlap", ARG_INT, &pp_overlap, 0, 1, "1: a group that joins a forward and a backward (dualpipev's F&B pairs, interleaved's steady state) sends the forward's output while the backward computes (CUDA: on side NCCL communicators); with experts also steps the pair's two micro-batches in turn, each one's MoE all-to-alls under the other's compute (CUDA: on a side NCCL communicator of the ep group)"},
        {"-timeline", ARG_INT, &timeline, 0, ARG_NO_MAX, "every N steps print the measured timeline of replica 0's pipeline at tp rank 0 (0: never)"},
        {"-dump_grads", ARG_OUTPUT_FILE, &dump_grads, 0, 0, "write the gradients of the first step here, gathered into the whole model (tests)"},
        {"-check_replicas", ARG_INT, &check_replicas, 0, ARG_NO_MAX, "every N steps check that every copy of a tensor is identical: over tp (replicated tensors), the embedding group (wte), dp x cp (everything but experts) and edp (experts) (0: never)"},
        MOE_ARG_SPECS(moe_flags),
    };
    if (!run_start_model(&run, &argc, &argv, own, sizeof(own) / sizeof(own[0]), /*moe*/ 1)) return 0;
    CommGroup* world = &run.world;
    int rank = world->rank;
    GPT2Config config = run.config = moe_model_config(run.config, run.from_descriptor, run.args.model, moe_flags,
                                                      /*dense_too*/ 1);

    // ---- the grid: dp x pp x cp x tp ranks (grid_replicas: -dp 0 fills the world), tp slices of
    // each stage's layers, whose heads, 4C and Vp divide by tp; cp ranks holding Tl = T/cp
    // tokens of each sequence (whole chunks of the split); with -sp those split over tp too
    dp = grid_replicas(dp, pp, cp_size, tp, world->size);
    CpSplit split = cp_split_of(split_name);
    int allgather = cp_allgather_of(cp_comm);
    int B = run.args.B, T = run.args.T, Tl = T / cp_size, tokens_multiple;
    LayerDims dims = grid_dims(config, cp_size, tp, sp, split, T, &tokens_multiple);
    sp = dims.seq_shards > 1;  // with one tp rank there is nothing to split
    dims.tp_overlap = run.tp_overlap = tp_overlap;  // (run's too: its predicted step, llmc/run.h)
    // the batch: a step is m micro-batches of B x T on each of the dp replicas
    int m = train_accumulation_steps(&run.args, dp, "dp");
    PipeSpec spec = pipeline_spec_of(sched_name, pp, m, vp, config.num_layers, "-pp");
    int n;
    PipeAction* all_actions = pipeline_plan(spec, sched_name, &n);  // every stage's actions (pipeline.h)
    Grid grid;
    grid_init(&grid, world, dp, pp, cp_size, tp, pipeline_is_v(spec));
    if (gpt2_is_moe(config)) grid_add_experts(&grid, world, &run, moe_flags, sp);  // 5D: ep x edp folded in
    PipeAction* actions = all_actions + (size_t)grid.stage * n;  // (every stage's list has n actions)

    // ---- this rank's parameters: its tp slices of its stage's tensors (and its E/ep experts),
    // with -z 1 padded so that the dp x cp ranks holding them can split its state into equal shards
    ParameterLayout layout = parameter_layout_experts(config, tp, grid.tp_rank, pp, grid.stage, spec.V, pipeline_is_v(spec), grid.ep,
                                                     grid.ep_rank);
    layout_shard_flat(&layout, zero, grid.dp_group.size, grid.dp_group.rank, grid.moe ? grid.edp_group.size : 1,
                      grid.moe ? grid.edp_group.rank : 0);

    // ---- memory, checked before allocating: the rank's pieces of the model states, its stage's
    // slots of micro-batches in flight at its tp widths and T/cp tokens, the pipeline's, ZeRO-1's
    // and context parallelism's buffers (llmc/memory_plan.h)
    size_t N = layout.count, P = gpt2_num_parameters(config);
    RunLayout grid_layout = grid_run_layout(&run, &grid, spec, zero, sp, allgather, dump_grads != NULL,
                                              moe_flags.capacity_factor, pp_overlap);
    run_check_memory(&run, grid_layout, grid.stage,
                     "%zu of %zu parameters on rank %d (dp %d, stage %d, cp %d, tp %d), -b %d -t %d", N, P, rank,
                     grid.dp_rank, grid.stage, grid.cp_rank, grid.tp_rank, B, T);

    // ---- the weights, the data (a step is dp x m chunks of B x T tokens: micro-batch i of
    // replica r is chunk i dp + r, so that the replicas and micro-batches cover the global batch
    // once; its cp ranks read the same chunk and keep each its tokens), the run's identity without
    // the layout (any grid resumes it), the output dir. Validation: every replica evaluates the
    // same chunk (val_chunks 1), as one model would
    float* weights = run_load(&run, dp * m, /*val_chunks*/ 1, NULL);
    GPT2 model;
    gpt2_build(&model, config, dims, layout, weights, B, Tl, ACTS_SCRATCH | ACTS_RECOMPUTE,
               stage_kept(run.args.recompute, spec, dims), 0);
    free(weights);
    Stage stage;
    stage_alloc(&stage, spec, grid.stage, stage_num_slots(spec, actions, n), pipeline_num_grads(spec, grid.stage, actions, n), &model, B,
                Tl);
    Moe moe;  // 5D: the MoE layers' state, a record per slot (grid_moe_alloc)
    if (grid.moe) grid_moe_alloc(&moe, &stage, &grid, &run, moe_flags, Tl, B * Tl / dims.seq_shards, pp_overlap);
    // with -z 1 the reduce-scatter's output: this rank's 1/(dp cp) shard of the reduced gradients
    floatX* grad_shard = zero ? zero1_grad_shard_alloc(&layout) : NULL;
    // with -cp: this rank's chunks of each sequence, and the buffers of attention over the cp
    // group, on the rank's NH/tp heads (llmc/context_parallel.h)
    ContextParallel context, *cp = cp_size > 1 ? &context : NULL;
    if (cp) cp_alloc(cp, &grid.cp_group, split, allgather, B, T, config.channels, dims.att, dims.NH);
    if (rank == 0) print_layout(&run, &model, &stage, &grid, cp, zero);

    // ---- resume with -y 1 from any grid's checkpoint; validation and samples through the pipe
    Grid3D trainer = {&model, &stage, &grid, cp, grid.moe ? &moe : NULL};
    grid_run_begin(&run, &trainer, tokens_multiple);

    // ---- training loop; `step` counts completed optimizer steps
    Walk walk = replica_walk(&model, &stage, &grid, cp, &run.train, m);
    walk.overlap_pairs = pp_overlap;  // (the F&B overlap, llmc/pipeline_walk.h)
    // the replica of world rank 0's pipeline, at cp and tp rank 0: where the timeline is measured
    int in_timeline = grid.dp_rank == 0 && grid.cp_rank == 0 && grid.tp_rank == 0;
    for (int step = run.start_step; step <= run.max_steps; step++) {
        if (run_between_steps(&run, step)) break;  // validation, a sample, a checkpoint: when due
        int timed = timeline > 0 && (step + 1) % timeline == 0;
        if (timed) comm_barrier(world);  // a common start, so that the stages' clocks line up
        run_step_begin(&run);
        grid_step(&run, &trainer, &walk, actions, n, grad_shard, zero, step, timed && in_timeline);  // (above)
        if (cp) device_spans_collect(&cp->attention_time);  // (the CP chapter reports them; here read, not kept)
        if (check_replicas > 0 && (step + 1) % check_replicas == 0) check_copies(&model, &grid, step + 1);
        // (after the step's count; AdamW left the gradients as they were)
        if (dump_grads != NULL && step == 0) dump_gradients(&model, &grid, grad_shard, dump_grads);
        if (timed && in_timeline) stage_report_timeline(&stage, &grid.pp_group, step + 1, run.args.out_dir);
    }
    run_end(&run);
    if (run.max_steps > run.start_step && in_timeline) stage_report_peak(&stage, &grid.pp_group, all_actions, n);
    grid_trainer_free(&trainer, grad_shard, all_actions);
    comm_finalize();
    return 0;
}
