// A pipeline stage at run time, shared by the pipeline trainers (train_gpt2_pp.cu and
// train_gpt2_3d.cu): the slots that hold the activations of micro-batches in flight, the
// gradient buffers, which buffer each message of a walk lives in, and the reports of a step
// (its measured timeline, the slots it held). The walk itself, the loop over the stage's actions
// with its exchanges, is train_gpt2_pp.cu's chapter; what each action computes is llmc/chunk.h.
#ifndef LLMC_STAGE_H
#define LLMC_STAGE_H

#include "block.h"
#include "comm.h"
#include "context_parallel.h"
#include "dataloader.h"
#include "model.h"
#include "pipeline.h"
#include "watchdog.h"

// Each (micro-batch, chunk) whose forward has run keeps its layers' activations in a slot until
// its backward has run; the schedule says how many can be in flight at once (pipeline.h), and
// the stage allocates that many slots. The stage with the LM head also keeps, for each
// micro-batch of the last virtual stage in flight, the head's buffers (lnf, the logits, the
// losses) in an arena of a second, smaller pool: a head is taken with the slot of that chunk's
// F and given back with it (pipeline_peak_heads says how many are held at once).
typedef struct {
    PipeSpec spec;
    int stage, chunk_layers;   // this rank's stage; layers per chunk, L / (p V)
    Activations* slots;        // num_slots arenas of chunk_layers layers
    int num_slots;
    int* slot_of;              // (m, V): the slot holding (micro-batch, chunk), -1 for none
    int* free_slots;           // a stack of free slots
    int num_free, peak_in_use;  // the most slots a training step held at once
    Activations* heads;        // num_heads arenas of the head (ACTS_HEAD), on the head's stage
    int num_heads;             // (0 elsewhere)
    int* head_of;              // (num_slots): the head a slot's micro-batch holds, -1 for none
    int* free_heads;           // a stack of free heads
    int num_free_heads;
    LayerDims dims;            // the widths and the micro-batch the arenas were laid out for
    int B, T;
    floatX** grad;             // (BTs, C) gradients at a chunk's output, then at its input:
    int num_grads;             // at least two, so that one can be sent while the next is received
                               // (pipeline_grad_indices says how many a schedule needs)
    uint64_t message;            // elements of every message: B T C, or B T C / tp with -sp
    double* times;             // a measured timeline (-timeline): each action's start and end
    struct Moe* moe;           // a Mixture-of-Experts model's routing state, one record a slot (the
                               // grid trainer with experts, llmc/moe.h); NULL for a dense model
} Stage;

// the slots a stage of this schedule needs: the most micro-batches its own actions hold at once,
// at least 2 (a forward-only pass receives into one while the last is sent)
static inline int stage_num_slots(PipeSpec spec, const PipeAction* actions, int n) {
    int slots = pipeline_peak_in_flight(spec, actions, n);
    return slots > 2 ? slots : 2;
}

// the head's arenas a stage needs. In a V (zbv, dualpipev) the head sits on stage 0 beside
// chunk 0, whose slots never use it: as many arenas as pipeline_peak_heads counts, the most
// micro-batches of the last virtual stage held at once from their F's input to the W that last
// reads the head (zbv 1: chunk 1's F, B and W of one micro-batch run before the next one's F;
// dualpipev 2: a pair receives the next F's input before the W of the one before), and at least
// 1 (a forward-only pass holds one). Elsewhere the head is on the last stage and every slot keeps
// one, as many as its slots (with one chunk every slot there is the last virtual stage's). None
// on a stage without the head.
static inline int stage_num_heads(PipeSpec spec, int stage, const ParameterLayout* layout, int num_slots) {
    if (!layout->head) return 0;
    if (!pipeline_is_v(spec)) return num_slots;
    int n = pipeline_actions_per_stage(spec);
    PipeAction* actions = (PipeAction*)malloc_check((uint64_t)n * sizeof(PipeAction));
    pipeline_stage_actions(spec, stage, actions);
    int heads = pipeline_peak_heads(spec, stage, actions, n);
    free(actions);
    return heads > 1 ? heads : 1;
}

// what a stage keeps for -r `recompute`: zero bubble's W reads its matmuls' inputs from the slot
static inline unsigned stage_kept(int recompute, PipeSpec spec, LayerDims d) {
    return activations_kept(recompute, pipeline_splits_backward(spec), d);
}

// the slots, the heads (stage_num_heads) and the gradient buffers on the device (num_grads:
// pipeline_grad_indices's count); the first gradient buffer is the model's scratch dresidual. The
// slots keep what the model's scratch arena was laid out to keep (its `kept`), and share its
// one-layer buffers for the rest.
static inline void stage_alloc(Stage* st, PipeSpec spec, int stage, int num_slots, int num_grads, GPT2* model, int B,
                               int T) {
    st->spec = spec;
    st->stage = stage;
    st->chunk_layers = model->layout.layers / spec.V;
    st->num_slots = num_slots;
    st->moe = NULL;
    st->slots = (Activations*)malloc_check((uint64_t)num_slots * sizeof(Activations));
    st->free_slots = (int*)malloc_check((uint64_t)num_slots * sizeof(int));
    st->head_of = (int*)malloc_check((uint64_t)num_slots * sizeof(int));
    for (int i = 0; i < num_slots; i++) {
        activations_alloc(&st->slots[i], model->dims, st->chunk_layers, ACTS_LAYERS, model->acts.kept, B, T);
        activations_share_recomputed(&st->slots[i], &model->acts, model->dims, B, T);
        st->free_slots[i] = num_slots - 1 - i;
        st->head_of[i] = -1;
    }
    st->num_free = num_slots;
    st->num_heads = stage_num_heads(spec, stage, &model->layout, num_slots);
    st->heads = (Activations*)malloc_check((uint64_t)(st->num_heads > 0 ? st->num_heads : 1) * sizeof(Activations));
    st->free_heads = (int*)malloc_check((uint64_t)(st->num_heads > 0 ? st->num_heads : 1) * sizeof(int));
    for (int i = 0; i < st->num_heads; i++) {
        activations_alloc(&st->heads[i], model->dims, st->chunk_layers, ACTS_HEAD, model->acts.kept, B, T);
        st->free_heads[i] = st->num_heads - 1 - i;
    }
    st->num_free_heads = st->num_heads;
    st->dims = model->dims;
    st->B = B;
    st->T = T;
    st->peak_in_use = 0;
    st->slot_of = (int*)malloc_check((uint64_t)spec.m * spec.V * sizeof(int));
    for (int i = 0; i < spec.m * spec.V; i++) st->slot_of[i] = -1;
    st->message = (uint64_t)B * T / model->dims.seq_shards * model->config.channels;
    st->num_grads = num_grads;
    st->grad = (floatX**)malloc_check((uint64_t)num_grads * sizeof(floatX*));
    st->grad[0] = model->acts.dresidual;
    allocation_kind(ALLOC_COMM);
    for (int i = 1; i < num_grads; i++) st->grad[i] = (floatX*)device_malloc(st->message * sizeof(floatX));
    st->times = (double*)malloc_check((uint64_t)2 * pipeline_actions_per_stage(spec) * sizeof(double));
}

static inline void stage_free(Stage* st) {
    for (int i = 0; i < st->num_slots; i++) activations_free(&st->slots[i]);
    for (int i = 0; i < st->num_heads; i++) activations_free(&st->heads[i]);
    free(st->slots);
    free(st->free_slots);
    free(st->head_of);
    free(st->heads);
    free(st->free_heads);
    free(st->slot_of);
    for (int i = 1; i < st->num_grads; i++) device_free(st->grad[i]);
    free(st->grad);
    free(st->times);
}

static inline int is_first_virtual(const Stage* st, int chunk) { return pipeline_virtual_stage(st->spec, st->stage, chunk) == 0; }
static inline int is_last_virtual(const Stage* st, int chunk) {
    return pipeline_virtual_stage(st->spec, st->stage, chunk) == st->spec.p * st->spec.V - 1;
}

// the slot of (micro, chunk), taken from the free ones on first use; for the last virtual stage
// a head too, whose tensors (model.h's ACTS_HEAD part) the slot's head pointers then point into
static inline Activations* stage_slot(Stage* st, int micro, int chunk) {
    int* at = &st->slot_of[micro * st->spec.V + chunk];
    if (*at < 0) {
        if (st->num_free == 0) fail("stage %d: more micro-batches in flight than the schedule allows", st->stage);
        *at = st->free_slots[--st->num_free];
        if (is_last_virtual(st, chunk)) {
            if (st->num_free_heads == 0) fail("stage %d: more heads in flight than the schedule allows", st->stage);
            int h = st->head_of[*at] = st->free_heads[--st->num_free_heads];
            ActivationTensor mine[ACTIVATION_TENSORS], head[ACTIVATION_TENSORS];
            int n = activation_tensors(mine, &st->slots[*at], st->dims, 1, st->slots[*at].kept, st->B, st->T);
            activation_tensors(head, &st->heads[h], st->dims, 1, st->heads[h].kept, st->B, st->T);
            for (int i = 0; i < n; i++) {
                if (mine[i].part == ACTS_HEAD) *mine[i].ptr = *head[i].ptr;
            }
        }
    }
    return &st->slots[*at];
}

// (micro, chunk)'s slot, and its head, back to the free ones: after the last action that reads
// them (the backward, or zero bubble's W; a forward-only pass: the forward). A head's tensors
// keep their values until the next last-virtual forward takes it (a sample reads its logits).
static inline void stage_release(Stage* st, int micro, int chunk) {
    int* at = &st->slot_of[micro * st->spec.V + chunk];
    st->free_slots[st->num_free++] = *at;
    if (st->head_of[*at] >= 0) st->free_heads[st->num_free_heads++] = st->head_of[*at];
    st->head_of[*at] = -1;
    *at = -1;
}

// ----------------------------------------------------------------------------------------------
// A walk: one pass of this stage over a list of actions (a training step's, or a forward-only
// pass for validation and sampling), and what its actions need to know.

typedef struct {
    GPT2* model;
    Stage* st;
    CommGroup* pp;      // the pipeline: this stage and its neighbours
    CommGroup* tp;      // the chunk's own collectives (tensor parallelism), or NULL
    ContextParallel* cp;  // context parallelism (the 3D trainer's -cp), or NULL: the stage holds
                          // T = T/cp tokens of each sequence, and its attention reaches the rest
    DataLoader* data;   // micro-batch i is chunk i * data_ranks + data_rank of the loader's
    int data_ranks, data_rank;  // current batch (data-parallel replicas read their own) ...
    const int* tokens;  // ... or, without a loader (sampling), these B x T tokens
    int B, T;
    int forward_only;   // validation and sampling: a slot is free once its output is sent
    int overlap_pairs;  // -pp_overlap: an F&B group's forward output leaves under its backward
                        // (with experts, the two step in turn: the MoE overlap, pipeline_walk.h)
    float dloss;        // each token's weight in the step's gradient: 1 / (B T m)
    float loss;         // out: the sum of the micro-batches' losses (on the stage with the head)
    Activations* head;  // out: the last slot the last virtual stage used (its logits stay)
    double* times;      // with a timeline: each action's start and end (seconds from `t0`)
    double t0;
} Walk;

// a walk of this stage over micro-batches of B x T (the fields not named here start empty: the
// caller sets the data, dloss, forward_only, times)
static inline Walk walk_init(GPT2* model, Stage* st, CommGroup* pp, CommGroup* tp, ContextParallel* cp, int B, int T) {
    Walk w;
    memset(&w, 0, sizeof(w));
    w.model = model;
    w.st = st;
    w.pp = pp;
    w.tp = tp;
    w.cp = cp;
    w.data_ranks = 1;
    w.B = B;
    w.T = T;
    return w;
}

// The buffers a walk's messages live in. A forward's input is received into its slot's encoded
// (where the chunk's first LayerNorm reads it) and its output sent from its slot's last layer's
// residual3; a backward's input and output are one of the stage's gradient buffers
// (pipeline_grad_indices), so that a backward can receive into one while the gradient the one
// before computed is still being sent from another.
static inline floatX* stage_input_buffer(Walk* w, PipeAction a, int grad_index) {
    return a.op == PIPE_FORWARD ? stage_slot(w->st, a.micro, a.chunk)->encoded : w->st->grad[grad_index];
}
static inline floatX* stage_output_buffer(Walk* w, PipeAction a, int grad_index) {
    if (a.op != PIPE_FORWARD) return w->st->grad[grad_index];
    Activations* slot = stage_slot(w->st, a.micro, a.chunk);
    return layer_acts(slot, w->model->dims, w->B, w->T, w->st->chunk_layers - 1).residual3;
}

// the start's table: "  stage s  layers a-b ..." (one range per chunk, with -vp V of them) and
// what else the stage holds (the embeddings on the first, lnf and wte's copy on the last; in a V
// the first holds lnf too, and its one wte serves the head)
static inline void stage_print_layers(int stage, const ParameterLayout* l, int V, int chunk_layers) {
    printf("  stage %d  layers", stage);
    for (int chunk = 0; chunk < V; chunk++) {
        int first = layout_layer(l, chunk * chunk_layers);
        printf(" %d-%d", first, first + chunk_layers - 1);
    }
    printf("%s%s", l->embedding ? " + wte, wpe" : "", !l->head ? "" : l->embedding ? " + lnf" : " + lnf, wte copy");
}

// the elements of every message of a walk: (B, T, C), or this rank's (B T / tp, C) with -sp
static inline uint64_t walk_message(const Walk* w) {
    return (uint64_t)w->B * w->T / w->model->dims.seq_shards * w->model->config.channels;
}

// a training walk's slots in use, for the peak the trainer reports beside the schedule's
// (validation and sampling hold at most 2, which the allocation allows for, and are not counted)
static inline void note_slots_in_use(Walk* w) {
    int in_use = w->st->num_slots - w->st->num_free;
    if (!w->forward_only && in_use > w->st->peak_in_use) w->st->peak_in_use = in_use;
}

// The tokens of action a's micro-batch: its inputs for the embedding (a forward or backward of
// the first virtual stage), its targets for the loss (a forward of the last), read from the
// loader (or, for a sample, the walk's tokens). With cp the loader's sequences are whole, and
// this rank takes its T tokens of each (cp_take_tokens: its chunks of the T cp)
static inline void walk_tokens(Walk* w, PipeAction a, const int** inputs, const int** targets) {
    int first = is_first_virtual(w->st, a.chunk), last = is_last_virtual(w->st, a.chunk);
    int needed = (first && a.op != PIPE_WEIGHT) || (last && a.op == PIPE_FORWARD);
    if (w->data && needed) {
        dataloader_load_chunk(w->data, a.micro * w->data_ranks + w->data_rank, w->model->config.vocab_size);
    }
    *inputs = w->data ? w->data->inputs : w->tokens;
    *targets = w->data ? w->data->targets : w->tokens;  // (sampling reads logits only)
    if (w->cp && needed) {
        CpChunks mine = cp_mine(w->cp, w->T);
        cp_take_tokens(w->cp->inputs, *inputs, mine, w->B, w->T * w->cp->cp->size);
        cp_take_tokens(w->cp->targets, *targets, mine, w->B, w->T * w->cp->cp->size);
        *inputs = w->cp->inputs;
        *targets = w->cp->targets;
    }
}

// The measured timeline of a step: every stage's actions with their start and end (ms from the
// step's start, after a barrier), gathered on rank 0 of pp, drawn as the chart of the schedule
// with one column per average forward, and appended to -o's timeline.jsonl as one JSON line per
// action.
static inline void stage_report_timeline(const Stage* st, CommGroup* pp, int step, const char* out_dir) {
    PipeSpec s = st->spec;
    int n = pipeline_actions_per_stage(s);
    const double* times = st->times;
    float* mine = (float*)malloc_check((uint64_t)2 * n * sizeof(float));
    for (int i = 0; i < 2 * n; i++) mine[i] = (float)(times[i] * 1e3);
    // (a message buffer for the moment, not in the memory table: -timeline's steps hold 2n more floats)
    AllocationKind was = allocation_kind(ALLOC_COMM);
    float* dev = (float*)device_malloc((uint64_t)2 * n * sizeof(float));
    allocation_kind(was);
    if (pp->rank != 0) {
        copy_host_to_device(dev, mine, (uint64_t)2 * n * sizeof(float));
        comm_send(pp, dev, (uint64_t)2 * n, COMM_FLOAT, 0);  // (2n) fp32 times to rank 0
        device_free(dev);
        free(mine);
        return;
    }
    PipeAction* all = (PipeAction*)malloc_check((uint64_t)s.p * n * sizeof(PipeAction));
    double* start = (double*)malloc_check((uint64_t)s.p * n * sizeof(double));
    double* end = (double*)malloc_check((uint64_t)s.p * n * sizeof(double));
    float* got = (float*)malloc_check((uint64_t)2 * n * sizeof(float));
    double forward_sum = 0.0;
    int forwards = 0;
    FILE* json = NULL;
    if (out_dir) {
        char path[4200];
        snprintf(path, sizeof(path), "%s/timeline.jsonl", out_dir);
        json = fopen(path, "a");
    }
    for (int r = 0; r < s.p; r++) {
        pipeline_stage_actions(s, r, all + (uint64_t)r * n);
        if (r == 0) memcpy(got, mine, (uint64_t)2 * n * sizeof(float));
        else {
            comm_recv(pp, dev, (uint64_t)2 * n, COMM_FLOAT, r);
            copy_device_to_host(got, dev, (uint64_t)2 * n * sizeof(float));
        }
        for (int k = 0; k < n; k++) {
            PipeAction a = all[(uint64_t)r * n + k];
            start[r * n + k] = got[2 * k];
            end[r * n + k] = got[2 * k + 1];
            if (a.op == PIPE_FORWARD) {
                forward_sum += got[2 * k + 1] - got[2 * k];
                forwards++;
            }
            if (json) {
                fprintf(json, "{\"step\": %d, \"stage\": %d, \"op\": \"%c\", \"micro\": %d, \"chunk\": %d, \"start_ms\": %.3f, \"end_ms\": %.3f}\n",
                        step, r, pipe_op_letters[a.op], a.micro, a.chunk, got[2 * k], got[2 * k + 1]);
            }
        }
    }
    if (json) fclose(json);
    double unit = forward_sum / forwards;
    printf("timeline of step %d, measured (one column = a forward's mean, %.2f ms):\n", step, unit);
    pipeline_draw(stdout, s, all, start, end, unit > 0 ? unit : 1e-3, "  ");
    device_free(dev);
    free(mine);
    free(all);
    free(start);
    free(end);
    free(got);
}

// held activations: the schedule's count beside what each stage's slots measured (all_actions:
// every stage's list, n each), printed by rank 0 of pp
static inline void stage_report_peak(const Stage* st, CommGroup* pp, const PipeAction* all_actions, int n) {
    if (pp->rank == 0) printf("activations held at most, measured (schedule):");
    for (int s = 0; s < st->spec.p; s++) {
        float measured = s == pp->rank ? (float)st->peak_in_use : 0.0f;
        comm_all_reduce_scalar(pp, &measured, COMM_SUM);
        int predicted = pipeline_peak_in_flight(st->spec, all_actions + (uint64_t)s * n, n);
        if (pp->rank == 0) printf(" stage %d: %d (%d)", s, (int)measured, predicted);
    }
    if (pp->rank == 0) printf("\n");
}

#endif
