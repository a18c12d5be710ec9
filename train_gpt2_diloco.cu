/*
GPT-2 training across datacenters with DiLoCo (Douillard et al. 2023, "DiLoCo: Distributed
Low-Communication Training of Language Models", arXiv:2311.08105): W workers, each a
data-parallel group of ranks, train on their own for H steps and only then exchange what they
learned, in one all-reduce across workers (or its two halves in bf16, int8 or 4 bits, -outer_dtype).

Why: data parallelism (train_gpt2_dp.cu) all-reduces every gradient every step, 2 (p-1)/p P X
bytes, which a link between datacenters cannot carry. DiLoCo all-reduces P fp32 values once every
H steps: in an fp32 build (X = 4) the same bytes as a DDP step, so the link needs H times less
bandwidth; in a bf16 build (X = 2, the CUDA default) an outer step's P 4 is twice a DDP step's
P 2, so H/2 times less, and -outer_dtype bf16 (P 2 again) gives back H. The price is that the
workers drift apart between outer steps, and how much that costs in loss is the experiment.

The ranks form W workers of R = ranks / W consecutive ranks (-workers). Every rank holds the
whole model, the workers' inner AdamW state (each rank its worker's, as DDP keeps it), and two
fp32 copies more: the outer parameters theta_outer, on which every worker agrees, and the outer
optimizer's momentum (12 bytes a parameter with the pseudo-gradient's buffer: the memory table's
"outer state"). One outer round, on every rank:
1. Inner steps, H of them (the forward and backward: llmc/chunk.h's pass over the whole model,
   whole_model_walk): the worker trains as DDP (its ranks read disjoint micro-batches of the
   global batch, exactly as the DP trainer's ranks do, and all-reduce their gradients over the
   worker), clips by the worker's gradient norm and takes an AdamW step: the inner optimizer.
   Only two floats cross workers (the step line's mean loss and norm, which also stop every
   rank together on a non-finite value): on a slow link, a round trip each step.
2. The pseudo-gradient: delta = theta_outer - theta, how far this worker moved.
3. Its mean over the workers: one all-reduce (AVG) of P fp32 values across workers, each rank
   with the ranks at its place in the other workers (R all-reduces side by side). With
   -outer_dtype bf16 the values cross the link in bf16, half the bytes: the all-reduce written
   out as a reduce-scatter and an all-gather of bf16 shards, summed in fp32 (llmc/outer_link.h).
   With int8 or e3m0 (a sign and a 3-bit exponent: 4 bits, an eighth of fp32's bytes) each value
   is a code beside an fp32 scale, the largest |value| of its piece (a tensor of a layer within a
   shard), rounded to nearest (e3m0 in log space; llmc/precision.h defines both); the same
   exchanges carry the codes, and the mean is summed in fp32 and coded again for the way back.
4. The outer optimizer, Nesterov momentum SGD (-outer_lr 0.7, -outer_momentum 0.9, the paper's):
   momentum = mu momentum + delta; theta_outer -= lr (delta + mu momentum).
5. Every worker starts again from theta_outer (its inner AdamW moments kept, as the paper does).
The run ends with an outer step, so that the model file written is theta_outer.

Streaming DiLoCo (Douillard et al. 2025, "Streaming DiLoCo with overlapping communication",
arXiv:2501.18512), -fragments F: the layers are cut into F fragments of L/F consecutive layers
(the embeddings go with the first, the final LayerNorm with the last), and fragment f takes its
outer step (2-5 above, on its parameters only) after the steps s with (s - f H/F) % H == 0. Each
fragment still synchronises every H steps, but they take turns: a step between the first and the
last sends one fragment, where plain DiLoCo sends all P values at once every H steps (fragment
f > 0's first round is shorter, f H/F steps: its first outer step follows step f H/F). The peak
drops by less than F: the first fragment carries the embeddings (for GPT-2 124M at F = 2 about
1.5 times less). -fragment_layout strided gives fragment f the layers l with l % F == f, the
paper's pattern, so that every fragment spans the depth (contiguous, the default, keeps blocks of
consecutive layers). -alpha a merges instead of replacing: after its outer step a fragment's
worker weights become a theta_local + (1 - a) theta_outer, theta_local being the worker's own at
that moment (the paper's alpha; 0, the default, is plain DiLoCo); the last step's outer steps take
theta_outer unmerged, so that every worker ends on it and the model file is theta_outer.
-tau t overlaps the exchange with t inner steps: a fragment's pseudo-gradient is taken and its
all-reduce posted at its outer step (non-blocking: on the GPU NCCL's comm stream, on the CPU an
MPI request), the inner steps go on, and t steps later the average is applied: the outer
Nesterov step with that (t steps old) pseudo-gradient, then the merge with the worker's weights
of now, which with -alpha 0 would throw those t steps away (the paper pairs tau with alpha 0.5). One exchange is in flight at a time
(tau < H/F: it lands before the next fragment's is posted); the last step applies what is in
flight and then takes every fragment's outer step at once; a checkpoint waits for the average in
flight and records it. Below fp32 the average is two halves of exchanges with the owner's mean
between them: the timeline, step by step, is the comment of llmc/outer_link.h's OuterLink, the
struct that holds tau and the exchange in flight. The paper sends its outer gradients in 4 bits
(E3M0): -outer_dtype e3m0.

The bytes a rank sends on the link at an outer step, which the start's table prints for the run:
2 (W-1)/W P_f b/8 for a fragment of P_f values of b bits (a ring all-reduce's share), below 16
bits plus 4 bytes of scale a piece and each piece's codes padded to whole 16-bit words. For
GPT-2 124M (-e d12, P = 124,475,904) and W = 4 workers, on rank 0:
                          P_f          fp32 (4 B)  bf16 (2 B)  int8 (1 B)      e3m0 (0.5 B)
  F = 1: the model        124,475,904  746.9 MB    373.4 MB    186.7 MB + 612  93.4 MB + 612
  F = 2: fragment 0        81,947,136  491.7 MB    245.8 MB    122.9 MB + 316  61.5 MB + 316
         fragment 1        42,528,768  255.2 MB    127.6 MB     63.8 MB + 476  31.9 MB + 476
(+ n: the bytes of scales and padding; F = 2 contiguous: fragment 0 is layers 0-5 with wte and
wpe, fragment 1 layers 6-11 with lnf.) Each fragment is sent every H steps; DDP over the same 4
ranks sends 2 (p-1)/p P X = 373.4 MB every step in bf16.

-H 1 -outer_lr 1 -outer_momentum 0 averages the workers' parameters after every step: theta_outer
becomes the mean of the workers' theta. That is not DDP: DDP averages the gradients before one
AdamW step, so every worker takes the same step; parameter averaging lets each worker's AdamW
take its own (normalized by its own moments), then averages the results.

The loss printed is the mean over the workers' losses (each the mean of its tokens: the global
batch's mean, as DDP's), and the gradient norm the mean of the workers' norms; the clip scale
beside it is rank 0's worker's own.

Checkpoints (-n, -y) hold what differs between workers: every rank's state file carries its
worker's AdamW moments and weights, theta_outer and the outer momentum, so a run resumes bit for
bit between two outer steps; the same W and rank count are required. A checkpoint's model file
(model_<step>.bin) holds worker 0's weights after that step's outer steps, as every trainer's
holds what its rank 0 trains (the run layer writes it, llmc/train.h). Fragment by fragment: in
each fragment whose outer step was just applied with -alpha 0, theta_outer (the whole file when
F = 1 and -tau 0, every H steps), and every fragment at the last step; after one with -alpha
a > 0, a theta_local + (1 - a) theta_outer; between outer steps (with -tau, until the average in
flight is applied) the worker's own. The
model to evaluate is theta_outer: validation measures it, the run's last model file is it, and
every state file holds it (the first of the trainer's own buffers, diloco_state). A finished
run extends (-y 1 with a larger -x) only where its last step was due for every fragment anyway:
otherwise that step's outer step is one the longer run would not take, and the resume is refused
(check_resume).

Build: make train_gpt2_diloco
Run:   mpirun -np 4 ./train_gpt2_diloco -e d6 -b 4 -t 64 -workers 2 -H 10 -x 100 -o out
       (2 workers of 2 ranks: DDP inside each worker every step, an outer step across them every 10)
The same source compiles as C for the CPU backend and as CUDA with nvcc (llmc/ops.h).
*/
#include <math.h>
#include <string.h>
#include "llmc/utils.h"
#include "llmc/args.h"
#include "llmc/comm.h"
#include "llmc/gpt2.h"
#include "llmc/dataloader.h"
#include "llmc/ops.h"
#include "llmc/model.h"
#include "llmc/block.h"
#include "llmc/tensor_parallel.h"
#include "llmc/chunk.h"
#include "llmc/outer_link.h"
#include "llmc/train.h"
#include "llmc/run.h"
#include "llmc/memory_plan.h"

// ----------------------------------------------------------------------------------------------
// The workers and the outer state

// Which layers fragment f holds: contiguous (the default), the L/F consecutive layers
// [f L/F, (f+1) L/F); strided (the paper's pattern, -fragment_layout strided), the layers l with
// l % F == f, so that every fragment spans the whole depth. The embeddings go with fragment 0 and
// the final LayerNorm with fragment F - 1 either way.
static int fragment_holds(int F, int strided, int f, int l, int L) { return strided ? l % F == f : l / (L / F) == f; }

// A fragment's parameters in the flat buffer: the layout stores each tensor for all layers one
// after another (ln1w of layer 0, 1, ..., then qkvw of layer 0, 1, ...), so a contiguous
// fragment's layers are one run of each per-layer tensor, and a strided fragment's L/F runs of one
// layer each; the embeddings (f = 0) and the final LayerNorm (f = F-1) are spans of their own.
// Fills runs (at most NUM_PARAMETER_TENSORS x L; llmc/outer_link.h's Span) and returns how many;
// their elements in *P_f. With merge 0, one run a tensor of a layer (the link's pieces are cut
// from them): tensor and layer (-1: not a per-layer tensor) name it.
static int fragment_spans(int F, int strided, const ParameterLayout* p, int f, Span* runs, size_t* P_f, int merge) {
    int n = 0;
    *P_f = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        if (p->sizes[i] == 0) continue;  // (a dense model's empty router: no span, no kernel of 0 threads)
        if (!tensor_is_per_layer(i)) {
            if ((i == PARAM_WTE || i == PARAM_WPE) ? f != 0 : f != F - 1) continue;
            runs[n++] = (Span){p->offsets[i], p->sizes[i], i, -1};
            *P_f += p->sizes[i];
            continue;
        }
        for (int l = 0; l < p->layers; l++) {
            if (!fragment_holds(F, strided, f, l, p->layers)) continue;
            size_t offset = p->offsets[i] + (size_t)l * p->layer_stride[i], count = p->layer_stride[i];
            if (merge && n > 0 && runs[n - 1].offset + runs[n - 1].count == offset) runs[n - 1].count += count;  // (the next layer)
            else runs[n++] = (Span){offset, count, i, l};
            *P_f += count;
        }
    }
    return n;
}

// A rank's DiLoCo: its worker and the ranks across, the schedule of the outer steps and their
// state (theta_outer, the momentum, the pseudo-gradient), and the link between workers
typedef struct {
    GPT2* model;                    // this rank's copy: its worker's
    int rank;                       // in the world: worker w's r-th rank is w R + r
    int workers, ranks_per_worker;  // W, R
    int H;                          // inner steps between outer steps
    int fragments;                  // F (streaming DiLoCo; 1: the whole model at once)
    int strided;                    // -fragment_layout strided: fragment f holds the layers l % F == f
    float outer_lr, outer_momentum;
    float alpha;                    // -alpha: a worker resumes from alpha theta_local + (1 - alpha) theta_outer
    Span** spans;                   // (F) each fragment's runs of the flat buffer (fragment_spans), once
    int* num_spans;                 // (F) how many
    size_t* fragment_size;          // (F) P_f, its parameters
    CommGroup worker;   // this worker's R ranks: DDP inside it, every inner step
    CommGroup across;   // the W ranks at this place in every worker: the outer all-reduce
    float* outer;       // (P) fp32 theta_outer: the same on every rank
    float* momentum;    // (P) fp32 the outer optimizer's momentum: the same on every rank
    float* delta;       // (P) fp32 the pseudo-gradient; below fp32 its bytes are the link buffer
    float* ended;       // (1) fp32 1 once the run's last step has taken an outer step off its
                        // schedule (fragment_due), 0 before: a checkpoint carries it (check_resume)
    OuterLink link;     // what crosses the link (-outer_dtype) and, with -tau, the exchange in
                        // flight: its timeline is llmc/outer_link.h's OuterLink comment
} Diloco;

// Worker w holds ranks w R .. w R + R - 1: consecutive ranks share a machine, and the worker's
// every-step all-reduce should be the fast one. comm_split (MPI_Comm_split, ncclCommSplit): the
// ranks passing the same colour form a group, ordered by the key.
static void diloco_init(Diloco* d, GPT2* model, CommGroup* world, int workers, int H, int fragments, int strided,
                        float outer_lr, float outer_momentum, float alpha, int tau, int link_bits) {
    int R = world->size / workers, r = world->rank;
    size_t P = model->num_parameters;
    d->model = model;
    d->H = H;
    d->fragments = fragments;
    d->strided = strided;
    d->alpha = alpha;
    d->outer_lr = outer_lr;
    d->outer_momentum = outer_momentum;
    d->rank = r;
    d->workers = workers;
    d->ranks_per_worker = R;
    comm_split(&d->worker, world, r / R, r % R, "worker");
    comm_split(&d->across, world, r % R, r / R, "across");
    allocation_kind(ALLOC_OUTER);  // (these four and the link's pending step: the table's "outer state")
    d->outer = (float*)device_malloc(P * sizeof(float));
    d->momentum = (float*)device_malloc(P * sizeof(float));
    d->delta = (float*)device_malloc(P * sizeof(float));
    d->ended = (float*)device_malloc(sizeof(float));
    device_memset_zero(d->momentum, P * sizeof(float));
    device_memset_zero(d->ended, sizeof(float));
    link_init(&d->link, link_bits, fragments, &d->across, d->delta, tau);
    d->spans = (Span**)malloc_check((size_t)fragments * sizeof(Span*));
    d->num_spans = (int*)malloc_check((size_t)fragments * sizeof(int));
    d->fragment_size = (size_t*)malloc_check((size_t)fragments * sizeof(size_t));
    Span* units = (Span*)malloc_check((size_t)NUM_PARAMETER_TENSORS * (model->layout.layers + 1) * sizeof(Span));
    for (int f = 0; f < fragments; f++) {
        d->spans[f] = (Span*)malloc_check((size_t)NUM_PARAMETER_TENSORS * (model->layout.layers + 1) * sizeof(Span));
        d->num_spans[f] = fragment_spans(fragments, strided, &model->layout, f, d->spans[f], &d->fragment_size[f], 1);
        // the link buffer lives in delta's bytes, 2P words: in bf16 the fragment's values and the
        // others' of this rank's shard, which fit while W is below about sqrt(P); int8 and e3m0 need less
        if (link_bits == 32) continue;
        size_t P_f;
        int num_units = fragment_spans(fragments, strided, &model->layout, f, units, &P_f, /*merge*/ 0);
        size_t needed = link_layout(&d->link.layouts[f], units, num_units, P_f, link_bits, workers, r / R);
        check_every_rank(needed <= 2 * P, "-workers %d: the exchanges of -outer_dtype below fp32 need %zu words of 16 "
                         "bits for fragment %d, its messages and the W - 1 others' of a shard, and the pseudo-gradient's "
                         "buffer holds 2P = %zu (fewer workers, or a larger model)", workers, needed, f, 2 * P);
    }
    free(units);
}

static void diloco_free(Diloco* d) {
    link_free(&d->link);
    device_free(d->outer);
    device_free(d->momentum);
    device_free(d->delta);
    device_free(d->ended);
    for (int f = 0; f < d->fragments; f++) free(d->spans[f]);
    free(d->spans), free(d->num_spans), free(d->fragment_size);
    comm_group_free(&d->worker);
    comm_group_free(&d->across);
}
// does fragment f take its outer step after `completed` steps by its schedule: every H steps from
// its offset f H/F (in 64 bits: f H overflows an int for -H near 2^31)
static int fragment_scheduled(const Diloco* d, int f, int completed) {
    long long offset = (long long)f * d->H / d->fragments;
    return completed >= offset && (completed - offset) % d->H == 0;
}

// ... and in this run: by its schedule, and after the last step every fragment (so that the model
// file written is theta_outer)
static int fragment_due(const Diloco* d, int f, int completed, int max_steps) {
    return completed == max_steps || fragment_scheduled(d, f, completed);
}

// A run extended past its end (-y 1 with a larger -x) must repeat the longer run. Its last step
// took the outer step of every fragment; where one was not scheduled then, the longer run would
// not have taken it, and theta_outer, the momentum and the workers' weights already differ from
// that run's: refuse, saying so. (A checkpoint before the last step, or a last step where every
// fragment was due anyway, continues exactly.)
static void check_resume(void* trainer, const char* dir, int step, int max_steps) {
    Diloco* d = (Diloco*)trainer;
    float ended = 0.0f;
    copy_device_to_host(&ended, d->ended, sizeof(float));
    if (ended == 0.0f || step == max_steps) return;
    int f = 0;
    while (f < d->fragments - 1 && fragment_scheduled(d, f, step)) f++;
    fail("-y 1 -x %d: the checkpoint of step %d in '%s' ends a run of -x %d, whose last step took an outer step off "
         "the schedule (-H %d: fragment %d was not due after step %d) so that its model file is theta_outer; a run of "
         "-x %d would not have taken it, so continuing cannot repeat that run. Train -x %d from a checkpoint before "
         "step %d, or from the start", max_steps, step, dir, step, d->H, f, step, max_steps, max_steps, step);
}

// Steps 2-5 of the header for fragment f (the whole model when F = 1), after an inner step has
// left this worker at theta: outer_post (2, 3: the pseudo-gradient and its average over the
// workers, which with -tau is left in flight) and outer_apply (4, 5: the outer optimizer and the
// workers' restart), right after or tau steps later.
static void outer_post(Diloco* d, GPT2* model, int f, int in_flight) {
    // 2. delta = theta_outer - theta, the fragment's spans packed one after another. HERE, below
    // fp32, the pseudo-gradient's buffer becomes the link's messages: written not as fp32 values
    // but as what crosses the link (llmc/outer_link.h's LinkLayout): in bf16 rounded, a word a
    // value; in int8 and e3m0 coded piece by piece, each piece's scale and codes in its message
    link_code_pseudo_gradient(&d->link, f, d->spans[f], d->num_spans[f], d->outer, model->params_memory,
                              model->master_memory /* (bf16 builds' fp32 master weights, else NULL) */);
    // 3. the mean pseudo-gradient over the workers: all-reduce (AVG) of (P_f) fp32 across workers
    // (below fp32: its exchanges of 16-bit words, llmc/outer_link.h). The worker's R ranks hold
    // the same delta and each averages it with its peers in the other workers: R all-reduces of W
    // ranks, side by side. With -tau posted, not waited for: it travels while the next tau inner
    // steps compute (they do not touch delta), as OuterLink's timeline says
    link_post(&d->link, f, d->fragment_size[f], in_flight);
}

static void outer_apply(Diloco* d, GPT2* model, int f, float alpha) {
    const Span* runs = d->spans[f];
    int n = d->num_spans[f];
    float* master = model->master_memory;
    link_wait(&d->link);  // (-tau: the average has arrived; nothing in flight otherwise)
    // 4. Nesterov momentum on it, the same on every rank (theta_outer stays agreed): span by span
    // (fp32, bf16), or piece by piece with its scale (int8, e3m0)
    link_nesterov_step(&d->link, f, runs, n, d->outer, d->momentum, d->outer_lr, d->outer_momentum);
    // 5. every worker starts again from theta_outer (with -alpha, merged with its own weights: with
    // -tau its weights of now, tau steps newer than the pseudo-gradient)
    for (int k = 0; k < n; k++) {
        size_t o = runs[k].offset;
        outer_to_params(model->params_memory + o, master ? master + o : NULL, d->outer + o, runs[k].count, alpha);
    }
}

// After `completed` inner steps: the outer steps that are due, on OuterLink's timeline
// (llmc/outer_link.h). With -tau the average posted tau steps ago lands first (at the last step
// whatever is in flight), and a fragment due now is posted and left in flight; the last step's
// outer steps complete at once, unmerged, so that every worker ends on theta_outer and the model
// file is theta_outer
static void outer_steps(Diloco* d, GPT2* model, const Run* run, int completed) {
    OuterLink* link = &d->link;
    int last = completed == run->max_steps;
    if (link->fragment >= 0 && link->phase == 1) link_advance(link);  // (below fp32: b., c. posted)
    if (link->fragment >= 0 && (completed == link->apply_after || last)) {
        outer_apply(d, model, link->fragment, d->alpha);
        link->fragment = -1;
    }
    for (int f = 0; f < d->fragments; f++) {
        if (!fragment_due(d, f, completed, run->max_steps)) continue;
        int in_flight = link->tau > 0 && !last;
        outer_post(d, model, f, in_flight);
        if (in_flight) link->fragment = f, link->apply_after = completed + link->tau;
        else outer_apply(d, model, f, last ? 0.0f : d->alpha);
        float one = 1.0f;  // (check_resume)
        if (!fragment_scheduled(d, f, completed)) copy_host_to_device(d->ended, &one, sizeof(float));
    }
    if (link->tau > 0) {
        // the fragment in flight, as a checkpoint records it (fragment + 1, 0: none; apply_after);
        // a checkpoint before the next step records the average itself, so it lands now
        float pending[2] = {(float)(link->fragment + 1), (float)link->apply_after};
        copy_host_to_device(link->pending, pending, sizeof(pending));
        if (train_checkpoint_due(&run->args, completed, run->start_step, last)) link_wait(link);
    }
}

// What every rank's state file carries besides the model's (llmc/train.h's TrainerState):
// theta_outer, the outer momentum, its worker's fp32 weights, the flag check_resume reads, and
// with -tau the averaged pseudo-gradient in flight and which fragment it is. A resumed run reads
// back the fragment in flight (diloco_resumed)
static TrainerState diloco_state(Diloco* d, GPT2* model) {
    size_t P = model->num_parameters;
    float* own_weights = model->master_memory ? model->master_memory : (float*)model->params_memory;
    TrainerState own = {{d->outer, d->momentum, own_weights, d->ended, d->delta, d->link.pending}, {P, P, P, 1, P, 2},
                        d->link.tau > 0 ? 6 : 4};
    return own;
}
static void diloco_resumed(Diloco* d) {
    if (d->link.tau == 0) return;
    float pending[2];
    copy_device_to_host(pending, d->link.pending, sizeof(pending));
    d->link.fragment = (int)pending[0] - 1, d->link.apply_after = (int)pending[1];
}

// an fp32 device buffer of the model's shape (theta_outer, its momentum) as a model file
static void write_outer_file(const GPT2* model, const float* values, const char* path) {
    float* full = (float*)malloc_check(model->num_parameters * sizeof(float));
    gpt2_gather_full(model, NULL, values, COMM_FLOAT, full);
    gpt2_write_model_file(path, model->config, full);
    free(full);
}

// ----------------------------------------------------------------------------------------------
// The model on one micro-batch: every rank holds the whole model, so its pass is llmc/chunk.h's,
// the pipeline stages', as one stage of one chunk with every layer and no tp or cp group
// (whole_model_walk): the embedding, the plain layers (llmc/tensor_parallel.h with no tp group),
// the LM head and the loss, each token weighted dloss in the gradient. Returns the micro-batch's
// mean loss; with backward its gradients are accumulated.

static float model_pass(GPT2* model, const int* inputs, const int* targets, int B, int T, float dloss, int backward) {
    Stage whole;
    Walk walk = whole_model_walk(model, &whole, B, T, dloss);
    float loss = chunk_forward(&walk, &model->acts, /*chunk*/ 0, inputs, targets);
    if (backward) chunk_backward(&walk, &model->acts, model->acts.dresidual, /*chunk*/ 0, inputs, /*split*/ 0);
    return loss;
}

// ----------------------------------------------------------------------------------------------
// Validation and samples (the run layer, llmc/run.h, calls these). The validation loss is
// theta_outer's, the model DiLoCo trains and writes (not the workers' own, which drift from it
// between outer steps): each rank runs theta_outer on its own validation batch, as DDP's ranks
// split them (so that both measure the same tokens), and the run layer averages over every rank.
// The worker's weights step aside meanwhile, into the gradients' buffer (free between steps:
// each step zeroes it first), and come back bit for bit. A sample is drawn from rank 0's worker's
// own model as it stands. HellaSwag (-h 1) is theta_outer's too, its examples split over every
// rank as the validation batches are.

// theta_outer's forward pass of a (B, T) batch: its mean loss; the (B, T) losses on the host
static float outer_pass(Diloco* d, const int* inputs, const int* targets) {
    GPT2* model = d->model;
    size_t P = model->num_parameters;
    copy_device_to_device(model->grads_memory, model->params_memory, P * sizeof(floatX));
    outer_to_params(model->params_memory, NULL, d->outer, P, 0.0f);  // (alpha 0: the parameters = theta_outer)
    float loss = model_pass(model, inputs, targets, model->B, model->T, 0.0f, /*backward*/ 0);
    copy_device_to_device(model->params_memory, model->grads_memory, P * sizeof(floatX));
    return loss;
}

static float val_loss(void* trainer, DataLoader* val) {
    Diloco* d = (Diloco*)trainer;
    dataloader_load_chunk(val, d->rank, d->model->config.vocab_size);
    return outer_pass(d, val->inputs, val->targets);
}

static const float* token_losses(void* trainer, const int* inputs, const int* targets) {
    outer_pass((Diloco*)trainer, inputs, targets);
    return ((Diloco*)trainer)->model->losses_host;
}

static const floatX* sample_logits(void* trainer, const int* tokens, int T) {
    GPT2* model = ((Diloco*)trainer)->model;
    model_pass(model, tokens, tokens, 1, T, 0.0f, /*backward*/ 0);  // (the loss of no use: the logits are)
    return model->acts.logits;
}

// ----------------------------------------------------------------------------------------------
// What rank 0 prints at the start: the workers, the memory of a rank (the outer state its own
// row), and the bytes: every inner step the worker's DDP all-reduce, every H steps the outer one

static void print_layout(const Run* run, const Diloco* d, int accum) {
    const TrainArgs* args = &run->args;
    GPT2Config c = run->config;
    BannerRow rows[16];
    int k = train_banner_model(rows, "train_gpt2_diloco", args->model, c);
    banner_row(&rows[k++], "workers", "%d of %d rank%s each (DDP inside a worker)", d->workers, d->ranks_per_worker,
               d->ranks_per_worker > 1 ? "s" : "");
    const char* dtype = link_name(d->link.bits);
    if (d->fragments > 1) {
        banner_row(&rows[k++], "outer step", "every %d steps, %d fragments in turn, %s on the link", d->H, d->fragments, dtype);
    } else {
        banner_row(&rows[k++], "outer step", "every %d steps, %s on the link", d->H, dtype);
    }
    banner_row(&rows[k++], "outer optimizer", "Nesterov SGD, lr %g, momentum %g", d->outer_lr, d->outer_momentum);
    if (d->fragments > 1) {
        banner_row(&rows[k++], "fragments", "%s: %s", d->strided ? "strided" : "contiguous",
                   d->strided ? "fragment f holds the layers l with l % F = f" : "fragment f holds L/F consecutive layers");
    }
    if (d->link.tau > 0) {
        banner_row(&rows[k++], "overlap", "each exchange applied %d step%s after its post (-tau)", d->link.tau,
                   d->link.tau > 1 ? "s" : "");
    }
    if (d->alpha > 0) {
        banner_row(&rows[k++], "merge", "after an outer step: %g theta_local + %g theta_outer (-alpha)", d->alpha, 1.0 - d->alpha);
    }
    banner_row(&rows[k++], "micro-batch B x T", "%d x %d, %d per rank and step", args->B, args->T, accum);
    banner_row(&rows[k++], "recomputation", "%s", recompute_names[args->recompute]);
    k = run_banner_rows(run, rows, k);
    train_print_banner(rows, k);
    printf("memory per rank, Psi = the model's parameters (every rank holds them all):\n");
    memory_plan_print(&run->plan, c, &run->layout);
    double P = (double)gpt2_num_parameters(c), X = sizeof(floatX);
    int R = d->ranks_per_worker, W = d->workers, p = W * R;
    printf("communication per rank, P = %.0f parameters (bytes as the step line counts them):\n", P);
    printf("  worker all-reduce  %12.0f bytes every step  P X (the gradients, AVG) + 4 (the loss)%s\n",
           R > 1 ? P * X + 4 : 0.0, R > 1 ? "" : " (one rank: none)");
    if (d->link.bits == 32) {
        printf("  across, the outer step (the pseudo-gradient, AVG, fp32: P_f 4), every %d steps%s:\n", d->H,
               d->fragments > 1 ? ", fragment f after the steps f H/F + k H" : "");
    } else {
        printf("  across, the outer step (the pseudo-gradient in %s%s: reduce-scatter and all-gather as W - 1 exchanges "
               "each, every word sent and received counted), every %d steps%s:\n", dtype,
               d->link.bits < 16 ? " codes with an fp32 scale a piece (a tensor of a layer in a shard)" : "", d->H,
               d->fragments > 1 ? ", fragment f after the steps f H/F + k H" : "");
    }
    double mean_sent = 0, peak_sent = 0;  // on the link per step: on average, and at most before the last
    for (int f = 0; f < d->fragments; f++) {
        double counted, sent;
        link_bytes(&d->link, f, d->fragment_size[f], &counted, &sent);
        char name[96] = "the model";
        const char* extra = f == 0 ? " + wte, wpe" : f == d->fragments - 1 ? " + lnf" : "";
        if (d->fragments > 1 && d->strided) {  // (its layers f, f + F, ...: the first three, then "...")
            int at = snprintf(name, sizeof(name), "fragment %d: layers", f), listed = 0;
            for (int l = f; l < c.num_layers && listed < 3; l += d->fragments, listed++) {
                at += snprintf(name + at, sizeof(name) - at, "%s %d", listed ? "," : "", l);
            }
            snprintf(name + at, sizeof(name) - at, "%s%s", f + 3 * d->fragments < c.num_layers ? ", ..." : "", extra);
        } else if (d->fragments > 1) {
            int first = f * c.num_layers / d->fragments, last = (f + 1) * c.num_layers / d->fragments - 1;
            if (first == last) snprintf(name, sizeof(name), "fragment %d: layer %d%s", f, first, extra);
            else snprintf(name, sizeof(name), "fragment %d: layers %d-%d%s", f, first, last, extra);
        }
        // beside the formula: a ring all-reduce's 2 (W-1)/W P_f values of b bits (below 16 bits
        // plus the scales, 4 bytes a piece, and each piece's codes from a word of its own)
        double formula = 2.0 * (W - 1) / W * (double)d->fragment_size[f] * d->link.bits / 8;
        char extra_bytes[64] = "";
        if (d->link.bits < 16) snprintf(extra_bytes, sizeof(extra_bytes), ", + %.0f of scales and padding", sent - formula);
        printf("    %-32s %12.0f bytes counted, %12.0f sent by the rank (2 (W-1)/W P_f %d/8 = %.0f%s)\n", name, counted,
               sent, d->link.bits, formula, extra_bytes);
        mean_sent += sent / d->H;
        peak_sent = sent > peak_sent ? sent : peak_sent;
    }
    double line = 2.0 * (W - 1) / W * 8;  // the step line's loss and norm, 8 bytes all-reduced every step
    mean_sent += line;
    peak_sent += line;
    printf("  across all-reduce  %12.0f bytes every step  8 (the loss and the norm, for the step line)\n", 8.0);
    printf("  the link between workers, sent per rank: %.0f bytes a step on average, at most %.0f in a step before "
           "the last (which sends every fragment); DDP over %d ranks: 2 (p-1)/p P X = %.0f every step\n",
           mean_sent, peak_sent, p, 2.0 * (p - 1) / p * P * X);
}

// DiLoCo's own flags against the job: W dividing the ranks (0: one worker per rank), F dividing
// L and H, the fragments' layout, alpha below 1, tau below H/F, the link's dtype (-dump_outer's
// directory is checked with every -dump_ flag's, run_start). Returns W.
static int diloco_check_flags(int workers, int ranks, int H, int fragments, const char* fragment_layout, int tau,
                              float alpha, GPT2Config c, const char* outer_dtype) {
    if (workers == 0) workers = ranks;
    // (every rank checks the same flags: a bad one is printed once, utils.h's check_every_rank)
    check_every_rank(ranks % workers == 0, "-workers %d does not divide the %d ranks: each worker is ranks / W ranks "
                     "(launch a multiple of %d)", workers, ranks, workers);
    check_every_rank(c.num_layers % fragments == 0 && H % fragments == 0, "-fragments %d: the fragments are L/F layers "
                     "each and take turns every H/F steps, so F must divide the model's L = %d layers and -H %d",
                     fragments, c.num_layers, H);
    check_every_rank(strcmp(fragment_layout, "contiguous") == 0 || strcmp(fragment_layout, "strided") == 0,
                     "-fragment_layout %s: expected contiguous or strided", fragment_layout);
    check_every_rank(alpha < 1.0f, "-alpha %g: a worker would keep its own weights and never take theta_outer; "
                     "expected 0 <= alpha < 1 (the paper's 0.5 with -tau)", alpha);
    check_every_rank(tau < H / fragments, "-tau %d: a fragment's exchange must be applied before the next fragment's "
                     "is posted, H/F = %d steps later, so tau < H/F (-H %d -fragments %d)", tau, H / fragments, H, fragments);
    check_every_rank(link_bits_of(outer_dtype) != 0, "-outer_dtype %s: expected fp32, bf16, int8 or e3m0", outer_dtype);
    return workers;
}

// on rank 0 after the run: theta_outer after the last outer step in -o (model_<step>.bin, as the
// other trainers' last checkpoint names it, which holds the same values when -n wrote it); with
// -dump_outer the outer momentum too
static void write_run_files(const Run* run, const Diloco* d, const char* dump_outer) {
    int checkpointed = train_checkpoint_due(&run->args, run->max_steps, run->start_step, 1);
    if (run->args.out_dir != NULL && run->max_steps > run->start_step && !checkpointed) {
        char path[4200];
        snprintf(path, sizeof(path), "%s/model_%08d.bin", run->args.out_dir, run->max_steps);
        write_outer_file(d->model, d->outer, path);
    }
    if (dump_outer != NULL) write_outer_file(d->model, d->momentum, dump_outer);
}

int main(int argc, char** argv) {
    // ---- the flags: the common ones (llmc/train.h) and this trainer's own; then the
    // communication layer and the model's config (llmc/run.h)
    Run run;
    int workers = 0, H = 10, fragments = 1;
    float outer_lr = 0.7f, outer_momentum = 0.9f, alpha = 0.0f;
    int tau = 0;
    const char* dump_outer = NULL;
    const char* outer_dtype = "fp32";
    const char* fragment_layout = "contiguous";
    const ArgSpec own[] = {
        {"-workers", ARG_INT, &workers, 0, ARG_NO_MAX, "DiLoCo workers W, each ranks / W ranks training as DDP (0: one per rank)"},
        {"-H", ARG_INT, &H, 1, ARG_NO_MAX, "inner steps between two outer steps"},
        {"-outer_lr", ARG_FLOAT, &outer_lr, 0, ARG_NO_MAX, "the outer optimizer's learning rate (Nesterov SGD)"},
        {"-outer_momentum", ARG_FLOAT, &outer_momentum, 0, 1, "the outer optimizer's momentum"},
        {"-fragments", ARG_INT, &fragments, 1, ARG_NO_MAX, "streaming DiLoCo: F fragments of layers taking turns (F divides L and H)"},
        {"-fragment_layout", ARG_STRING, &fragment_layout, 0, 0, "contiguous (fragment f: layers f L/F .. (f+1) L/F - 1) or strided (the layers l % F == f, the paper's)"},
        {"-tau", ARG_INT, &tau, 0, ARG_NO_MAX, "streaming DiLoCo: a fragment's exchange overlaps tau inner steps and is applied after them (tau < H/F; 0: at once)"},
        {"-alpha", ARG_FLOAT, &alpha, 0, 1, "after an outer step a worker resumes from alpha theta_local + (1 - alpha) theta_outer (0: theta_outer; below 1)"},
        {"-outer_dtype", ARG_STRING, &outer_dtype, 0, 0, "the pseudo-gradient on the link between workers: fp32, bf16 (half the bytes), int8 (a quarter) or e3m0 (4 bits: an eighth), the last two with a scale a tensor"},
        {"-dump_outer", ARG_OUTPUT_FILE, &dump_outer, 0, 0, "at the end, write the outer momentum here as a model file (tests)"},
        HELLASWAG_FLAGS(&run.hellaswag),
    };
    if (!run_start(&run, &argc, &argv, own, sizeof(own) / sizeof(own[0]))) return 0;
    CommGroup* world = &run.world;
    int rank = world->rank, ranks = world->size;
    GPT2Config config = run.config;

    // ---- the workers: W of R ranks, every rank the whole model
    workers = diloco_check_flags(workers, ranks, H, fragments, fragment_layout, tau, alpha, config, outer_dtype);
    int B = run.args.B, T = run.args.T;
    LayerDims dims = layer_dims(config, /*tp*/ 1, /*sp*/ 0);
    // a step is accum micro-batches of B x T on each of the ranks, as DDP over all of them
    int accum = train_accumulation_steps(&run.args, ranks, "ranks");

    // ---- memory, checked before allocating: the whole model's states, the activations, the
    // outer state (llmc/memory_plan.h)
    ParameterLayout layout = parameter_layout(config, 1, 0);
    RunLayout plan = run_layout(&run, TRAINER_DILOCO, accum);
    plan.dp = ranks, run.diloco_workers = workers, run.diloco_H = H;  // (run's: the predicted step's outer share)
    run_check_memory(&run, plan, 0, "the whole model and its outer state, -b %d -t %d", B, T);

    // ---- the weights, the data (a step is accum x ranks chunks of B x T: micro-batch i of rank r
    // is chunk i ranks + r, DDP's split, so that W workers see the tokens DDP over the ranks
    // would), the run's identity, the output dir
    float* weights = run_load(&run, accum * ranks, /*val_chunks*/ ranks, "-workers %d -H %d -fragments %d -fragment_layout "
                              "%s -outer_lr %g -outer_momentum %g -alpha %g -tau %d -outer_dtype %s", workers, H, fragments,
                              fragment_layout, outer_lr, outer_momentum, alpha, tau, outer_dtype);
    GPT2 model;
    gpt2_build(&model, config, dims, layout, weights, B, T, ACTS_ALL, activations_kept(run.args.recompute, 0, dims), 0);
    free(weights);
    Diloco d;
    diloco_init(&d, &model, world, workers, H, fragments, strcmp(fragment_layout, "strided") == 0, outer_lr, outer_momentum,
                alpha, tau, link_bits_of(outer_dtype));
    outer_from_params(d.outer, model.params_memory, model.master_memory, model.num_parameters);  // theta_outer = theta_0
    if (rank == 0) print_layout(&run, &d, accum);

    // ---- validation and samples on each worker's model (val_replicas: the mean over the ranks);
    // checkpoints: rank 0's model file holds worker 0's weights (the header's Checkpoints say
    // when they are theta_outer: with -alpha > 0 they are merged), and every rank's state file
    // its worker's AdamW moments and, as this trainer's own state, theta_outer, the outer
    // momentum and its worker's fp32 weights, which differ from worker to worker between outer
    // steps. A resume needs the same W: the run's identity holds it, and the rank count is checked
    RunModel hooks = run_model(&model, &d, val_loss, sample_logits);
    hooks.val_replicas = world;
    hooks.token_losses = token_losses;  // -h 1: theta_outer's, the examples split as validation's batches
    hooks.own = diloco_state(&d, &model);
    hooks.check_resume = check_resume;
    CommGroup* groups[3] = {&d.worker, &d.across, world};
    run_begin(&run, hooks, groups, 3);
    diloco_resumed(&d);  // (-tau: the fragment a checkpoint had in flight, if any)

    // ---- training loop; `step` counts completed optimizer steps
    for (int step = run.start_step; step <= run.max_steps; step++) {
        if (run_between_steps(&run, step)) break;  // validation, a sample: when due
        run_step_begin(&run);
        // 1. an inner step of this worker: forward and backward over this rank's micro-batches,
        // each token weighted 1/(B T accum), the rank's mean
        watchdog_phase("forward and backward", step);
        device_memset_zero(model.grads_memory, model.num_parameters * sizeof(floatX));
        float loss = 0.0f;
        float dloss = 1.0f / (float)((size_t)B * T * accum);
        for (int micro = 0; micro < accum; micro++) {
            watchdog_beat();
            dataloader_load_chunk(&run.train, micro * ranks + rank, config.vocab_size);
            loss += model_pass(&model, run.train.inputs, run.train.targets, B, T, dloss, /*backward*/ 1) / (float)accum;
        }
        dataloader_advance(&run.train);
        // DDP inside the worker: all-reduce (AVG) of the gradients, P floatX, over its R ranks
        // and of the loss (one float): the worker's mean. No gradient crosses workers.
        watchdog_phase("worker all-reduce", step);
        if (d.ranks_per_worker > 1) {
            comm_all_reduce(&d.worker, model.grads_memory, model.num_parameters, COMM_FLOATX, COMM_AVG);
            comm_all_reduce_scalar(&d.worker, &loss, COMM_AVG);
        }
        // the inner optimizer: clipping by the worker's own norm, AdamW. First the step line's
        // figures, the workers' mean loss and norm: all-reduce (AVG) across workers, one float
        // each (every rank of a worker holds its worker's). A non-finite value on any worker
        // reaches every rank through them, so every rank stops here together
        float grad_norm = sqrtf(global_norm_squared(model.grads_memory, model.num_parameters));
        float printed[2] = {loss, grad_norm};
        comm_all_reduce_scalar(&d.across, &printed[0], COMM_AVG);
        comm_all_reduce_scalar(&d.across, &printed[1], COMM_AVG);
        train_stop_if_not_finite_hint(step, printed[0], printed[1], "-l, or -outer_lr (the outer steps move the weights too)");
        watchdog_phase("inner AdamW", step);
        float clip_scale, lr = train_adamw_step(&model, &run.args, step, run.max_steps, grad_norm, &clip_scale);
        // 2-5. the outer step across workers of each fragment that is due (F = 1: every H steps);
        // at the last step of every fragment
        watchdog_phase("outer step", step);
        outer_steps(&d, &model, &run, step + 1);
        // (the workers' mean loss and norm; the clip beside them rank 0's worker's: -gc / its own norm)
        run_step_end(&run, step, printed[0], lr, printed[1], clip_scale);
    }
    run_end(&run);
    if (rank == 0) write_run_files(&run, &d, dump_outer);  // theta_outer as the run's model file
    diloco_free(&d);
    gpt2_free(&model);
    comm_finalize();
    return 0;
}
