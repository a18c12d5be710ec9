// A pipeline stage at run time, shared by the pipeline trainers (train_gpt2_pp.cu and
// train_gpt2_3d.cu): the slots that hold the activations of micro-batches in flight, and the walk
// of a schedule (pipeline.h): before each group of actions one exchange of messages with the
// neighbouring stages, then the actions themselves. What an action computes (a chunk's forward,
// its backward, its weight gradients) is the trainer's: the walk calls it through a ChunkOps.
#ifndef LLMC_STAGE_H
#define LLMC_STAGE_H

#include "block.h"
#include "comm.h"
#include "dataloader.h"
#include "model.h"
#include "pipeline.h"
#include "watchdog.h"

// Each (micro-batch, chunk) whose forward has run keeps its layers' activations in a slot until
// its backward has run; the schedule says how many can be in flight at once (pipeline.h), and
// the stage allocates that many slots.
typedef struct {
    PipeSpec spec;
    int stage, chunk_layers;   // this rank's stage; layers per chunk, L / (p V)
    Activations* slots;        // num_slots arenas of chunk_layers layers (and, on the last
    int num_slots;             // stage, the head)
    int* slot_of;              // (m, V): the slot holding (micro-batch, chunk), -1 for none
    int* free_slots;           // a stack of free slots
    int num_free, peak_in_use;  // the most slots a training step held at once
    floatX* grad[2];           // (BTs, C) gradients at a chunk's output, then at its input:
                               // two, so that one can be sent while the next is received
    size_t message;            // elements of every message: B T C, or B T C / tp with -sp
} Stage;

// the slots a stage of this schedule needs: the most micro-batches its own actions hold at once,
// at least 2 (a forward-only pass receives into one while the last is sent)
static inline int stage_num_slots(PipeSpec spec, const PipeAction* actions, int n) {
    int slots = pipeline_peak_in_flight(spec, actions, n);
    return slots > 2 ? slots : 2;
}

// a slot's arena: chunk_layers layers of what the forward keeps (-r: `kept`, model.h), and on
// the last stage the head
static inline int stage_slot_parts(const ParameterLayout* layout) { return ACTS_LAYERS | (layout->head ? ACTS_HEAD : 0); }
static inline size_t stage_slot_bytes(LayerDims d, const ParameterLayout* layout, int chunk_layers, unsigned kept, int B,
                                      int T) {
    Activations unused;
    return gpt2_lay_out_activations(&unused, d, chunk_layers, stage_slot_parts(layout), kept, B, T, NULL, NULL);
}

// what a stage keeps for -r `recompute`: zero bubble's W reads its matmuls' inputs from the slot
static inline unsigned stage_kept(int recompute, PipeSpec spec, LayerDims d) {
    return activations_kept(recompute, spec.sched == SCHEDULE_ZB, d);
}

// what a stage keeps of its micro-batches in flight: num_slots slots, and the one-layer buffers
// of what they do not keep (which live in the model's scratch arena)
static inline size_t stage_activation_bytes(LayerDims d, const ParameterLayout* layout, int chunk_layers, int num_slots,
                                            unsigned kept, int B, int T) {
    Activations unused;
    return num_slots * stage_slot_bytes(d, layout, chunk_layers, kept, B, T) +
           gpt2_lay_out_activations(&unused, d, chunk_layers, ACTS_RECOMPUTE, kept, B, T, NULL, NULL);
}

// the slots and the second gradient buffer on the device; the first is the model's scratch
// dresidual. The slots keep what the model's scratch arena was laid out to keep (its `kept`),
// and share its one-layer buffers for the rest.
static inline void stage_alloc(Stage* st, PipeSpec spec, int stage, int num_slots, GPT2* model, int B, int T) {
    st->spec = spec;
    st->stage = stage;
    st->chunk_layers = model->layout.layers / spec.V;
    st->num_slots = num_slots;
    st->slots = (Activations*)malloc_check((size_t)num_slots * sizeof(Activations));
    st->free_slots = (int*)malloc_check((size_t)num_slots * sizeof(int));
    for (int i = 0; i < num_slots; i++) {
        activations_alloc(&st->slots[i], model->dims, st->chunk_layers, stage_slot_parts(&model->layout), model->acts.kept,
                          B, T);
        activations_share_recomputed(&st->slots[i], &model->acts, model->dims, B, T);
        st->free_slots[i] = num_slots - 1 - i;
    }
    st->num_free = num_slots;
    st->peak_in_use = 0;
    st->slot_of = (int*)malloc_check((size_t)spec.m * spec.V * sizeof(int));
    for (int i = 0; i < spec.m * spec.V; i++) st->slot_of[i] = -1;
    st->message = (size_t)B * T / model->dims.seq_shards * model->config.channels;
    st->grad[0] = model->acts.dresidual;
    st->grad[1] = (floatX*)device_malloc(st->message * sizeof(floatX));
}

static inline void stage_free(Stage* st) {
    for (int i = 0; i < st->num_slots; i++) activations_free(&st->slots[i]);
    free(st->slots);
    free(st->free_slots);
    free(st->slot_of);
    device_free(st->grad[1]);
}

static inline int is_first_virtual(const Stage* st, int chunk) { return pipeline_virtual_stage(st->spec, st->stage, chunk) == 0; }
static inline int is_last_virtual(const Stage* st, int chunk) {
    return pipeline_virtual_stage(st->spec, st->stage, chunk) == st->spec.p * st->spec.V - 1;
}

// the slot of (micro, chunk), taken from the free ones on first use
static inline Activations* stage_slot(Stage* st, int micro, int chunk) {
    int* at = &st->slot_of[micro * st->spec.V + chunk];
    if (*at < 0) {
        if (st->num_free == 0) fail("stage %d: more micro-batches in flight than the schedule allows", st->stage);
        *at = st->free_slots[--st->num_free];
    }
    return &st->slots[*at];
}

static inline void stage_release(Stage* st, int micro, int chunk) {
    int* at = &st->slot_of[micro * st->spec.V + chunk];
    st->free_slots[st->num_free++] = *at;
    *at = -1;
}

// ----------------------------------------------------------------------------------------------
// Walking a schedule. The stage runs its list of actions in groups (pipeline.h: one action, or
// interleaved's forward + backward); before each group one exchange sends the outputs of the
// group before and receives the inputs of this one, all at once (comm_exchange), so that no
// stage waits on a send its partner has not reached. pipeline_check_exchanges has proven, at
// start, that these exchanges pair up and finish for this schedule.

typedef struct Walk Walk;

// what the trainer's actions compute, on the slot of (micro-batch, chunk):
//   forward   the chunk's layers on the input in slot->encoded (the embedding on the first
//             virtual stage, computed from `inputs`); on the last virtual stage also the loss
//             against `targets`, returned (else 0), with the logits replaced by their gradient
//   backward  from the gradient at the chunk's output in dresidual (the last virtual stage: from
//             the dlogits) to the gradient at its input, left in dresidual; with split (zero
//             bubble's B) only the input gradients, the weight gradients left to `weights` (W)
typedef struct {
    float (*forward)(Walk* w, Activations* slot, int chunk, const int* inputs, const int* targets);
    void (*backward)(Walk* w, Activations* slot, floatX* dresidual, int chunk, const int* inputs, int split);
    void (*weights)(Walk* w, Activations* slot, int chunk);
} ChunkOps;

struct Walk {
    GPT2* model;
    Stage* st;
    ChunkOps ops;
    CommGroup* pp;      // the pipeline: this stage and its neighbours
    CommGroup* tp;      // the chunk's own collectives (tensor parallelism), or NULL
    DataLoader* data;   // micro-batch i is chunk i * data_ranks + data_rank of the loader's
    int data_ranks, data_rank;  // current batch (data-parallel replicas read their own) ...
    const int* tokens;  // ... or, without a loader (sampling), these B x T tokens
    int B, T;
    int forward_only;   // validation and sampling: a slot is free once its output is sent
    float dloss;        // each token's weight in the step's gradient: 1 / (B T m)
    float loss;         // out: the sum of the micro-batches' losses (last stage)
    Activations* head;  // out: the last slot the last virtual stage used (its logits stay)
    double* times;      // with a timeline: each action's start and end (seconds from `t0`)
    double t0;
};

// a training walk (forward_only 0) over the loader's current batch, or a forward-only one
static inline Walk walk_of(GPT2* model, Stage* st, ChunkOps ops, CommGroup* pp, CommGroup* tp, DataLoader* data,
                           int data_ranks, int data_rank, const int* tokens, int B, int T, int forward_only, float dloss) {
    Walk w = {model, st, ops, pp, tp, data, data_ranks, data_rank, tokens, B, T, forward_only, dloss, 0.0f, NULL, NULL, 0.0};
    return w;
}

// the buffer a message of action a lives in (its input: receive = 1; its output: 0)
static inline floatX* message_buffer(Walk* w, PipeAction a, int receive, int grad_index) {
    Stage* st = w->st;
    if (a.op == PIPE_FORWARD) {
        Activations* slot = stage_slot(st, a.micro, a.chunk);
        return receive ? slot->encoded : layer_acts(slot, w->model->dims, w->B, w->T, st->chunk_layers - 1).residual3;
    }
    return st->grad[grad_index];
}

// a training walk's slots in use, for the peak the trainer reports beside the schedule's
// (validation and sampling hold at most 2, which the allocation allows for, and are not counted)
static inline void note_slots_in_use(Walk* w) {
    int in_use = w->st->num_slots - w->st->num_free;
    if (!w->forward_only && in_use > w->st->peak_in_use) w->st->peak_in_use = in_use;
}

static inline void walk_actions(Walk* w, const PipeAction* actions, int n) {
    Stage* st = w->st;
    PipeSpec s = st->spec;
    size_t message = (size_t)w->B * w->T / w->model->dims.seq_shards * w->model->config.channels;
    int* group = (int*)malloc_check((size_t)n * sizeof(int));
    int* grad_index = (int*)malloc_check((size_t)n * sizeof(int));  // which grad buffer a B uses
    int groups = pipeline_exchange_index(actions, n, group);
    for (int k = 0, backwards = 0; k < n; k++) grad_index[k] = actions[k].op == PIPE_BACKWARD ? backwards++ % 2 : 0;
    int k = 0, prev = 0;  // this group starts at action k, the one before at prev
    for (int gi = 0; gi <= groups; gi++) {
        int end = k;
        while (end < n && group[end] == gi) end++;
        // the exchange: outputs of the group before (actions prev .. k-1), inputs of this group
        CommMessage msgs[8];
        int count = 0;
        for (int j = prev; j < k; j++) {
            int to = pipeline_output_to(s, st->stage, actions[j]);
            // (B, T, C), or this rank's (B T / tp, C) with -sp, to the next virtual stage
            // (forward: activations) or the one before (backward: their gradient)
            if (to >= 0) msgs[count++] = comm_message(message_buffer(w, actions[j], 0, grad_index[j]), message, to, 1);
        }
        for (int j = k; j < end; j++) {
            int from = pipeline_input_from(s, st->stage, actions[j]);
            if (from >= 0) msgs[count++] = comm_message(message_buffer(w, actions[j], 1, grad_index[j]), message, from, 0);
        }
        comm_exchange(w->pp, msgs, count, COMM_FLOATX);
        note_slots_in_use(w);
        // a forward-only walk frees a slot once its output is sent
        for (int j = prev; j < k && w->forward_only; j++) stage_release(st, actions[j].micro, actions[j].chunk);
        for (int j = k; j < end; j++) {  // the group's actions
            PipeAction a = actions[j];
            watchdog_beat();
            if (w->times) w->times[2 * j] = wall_time_s() - w->t0;
            int first = is_first_virtual(st, a.chunk), last = is_last_virtual(st, a.chunk);
            // the tokens of the micro-batch: its inputs for the embedding (forward and backward),
            // its targets for the loss (forward)
            if (w->data && ((first && a.op != PIPE_WEIGHT) || (last && a.op == PIPE_FORWARD))) {
                dataloader_load_chunk(w->data, a.micro * w->data_ranks + w->data_rank, w->model->config.vocab_size);
            }
            const int* inputs = w->data ? w->data->inputs : w->tokens;
            const int* targets = w->data ? w->data->targets : w->tokens;  // (sampling reads logits only)
            Activations* slot = stage_slot(st, a.micro, a.chunk);
            note_slots_in_use(w);
            if (a.op == PIPE_FORWARD) {
                w->loss += w->ops.forward(w, slot, a.chunk, inputs, targets);
                if (last) w->head = slot;
            } else if (a.op == PIPE_BACKWARD) {
                int split = s.sched == SCHEDULE_ZB;  // W follows later and needs the slot
                w->ops.backward(w, slot, st->grad[grad_index[j]], a.chunk, inputs, split);
                if (!split) stage_release(st, a.micro, a.chunk);
            } else {
                w->ops.weights(w, slot, a.chunk);
                stage_release(st, a.micro, a.chunk);
            }
            if (w->times) {
                device_synchronize();  // the GPU's work, not its launch
                w->times[2 * j + 1] = wall_time_s() - w->t0;
            }
        }
        prev = k;
        k = end;
    }
    free(group);
    free(grad_index);
}

// One micro-batch of B x T forward through the whole pipe (every chunk in turn), no backward:
// chunk 0 of the loader's current batch, or without a loader `tokens`. Returns the walk: its
// loss on the last stage, and the slot holding the logits there.
static inline Walk stage_forward_pass(GPT2* model, Stage* st, ChunkOps ops, CommGroup* pp, CommGroup* tp, DataLoader* data,
                                      const int* tokens, int B, int T) {
    PipeSpec one = st->spec;
    one.m = 1;
    PipeAction* actions = (PipeAction*)malloc_check((size_t)one.V * sizeof(PipeAction));
    int n = pipeline_forward_actions(one, actions);
    Walk w = walk_of(model, st, ops, pp, tp, data, 1, 0, tokens, B, T, 1, 0.0f);
    walk_actions(&w, actions, n);
    free(actions);
    return w;
}

// The measured timeline of a step: every stage's actions with their start and end (ms from the
// step's start, after a barrier), gathered on rank 0 of pp, drawn as the chart of the schedule
// with one column per average forward, and appended to -o's timeline.jsonl as one JSON line per
// action.
static inline void stage_report_timeline(const Stage* st, CommGroup* pp, int n, const double* times, int step,
                                         const char* out_dir) {
    PipeSpec s = st->spec;
    float* mine = (float*)malloc_check((size_t)2 * n * sizeof(float));
    for (int i = 0; i < 2 * n; i++) mine[i] = (float)(times[i] * 1e3);
    float* dev = (float*)device_malloc((size_t)2 * n * sizeof(float));
    if (pp->rank != 0) {
        copy_host_to_device(dev, mine, (size_t)2 * n * sizeof(float));
        comm_send(pp, dev, (size_t)2 * n, COMM_FLOAT, 0);  // (2n) fp32 times to rank 0
        device_free(dev);
        free(mine);
        return;
    }
    PipeAction* all = (PipeAction*)malloc_check((size_t)s.p * n * sizeof(PipeAction));
    double* start = (double*)malloc_check((size_t)s.p * n * sizeof(double));
    double* end = (double*)malloc_check((size_t)s.p * n * sizeof(double));
    float* got = (float*)malloc_check((size_t)2 * n * sizeof(float));
    double forward_sum = 0.0;
    int forwards = 0;
    FILE* json = NULL;
    if (out_dir) {
        char path[4200];
        snprintf(path, sizeof(path), "%s/timeline.jsonl", out_dir);
        json = fopen(path, "a");
    }
    for (int r = 0; r < s.p; r++) {
        pipeline_stage_actions(s, r, all + (size_t)r * n);
        if (r == 0) memcpy(got, mine, (size_t)2 * n * sizeof(float));
        else {
            comm_recv(pp, dev, (size_t)2 * n, COMM_FLOAT, r);
            copy_device_to_host(got, dev, (size_t)2 * n * sizeof(float));
        }
        for (int k = 0; k < n; k++) {
            PipeAction a = all[(size_t)r * n + k];
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
        int predicted = pipeline_peak_in_flight(st->spec, all_actions + (size_t)s * n, n);
        if (pp->rank == 0) printf(" stage %d: %d (%d)", s, (int)measured, predicted);
    }
    if (pp->rank == 0) printf("\n");
}

#endif
