// The device memory of one rank, predicted before anything is allocated, for any of the four
// trainers and any layout: data parallelism with ZeRO and offload, tensor and sequence
// parallelism, a pipeline with its schedule and chunks, and activation recomputation. Each
// trainer calls memory_plan for its own run and prints the table memory_plan_print makes; the
// run ends with the measured high-water mark beside it. dev/memory_planner calls the same two
// functions for a machine it is not running on (llmc/target.h), and searches the layouts of N
// devices for those that fit.
//
// Every number below is the size of a buffer the trainer allocates, from the same size
// functions its allocations use (model.h, stage.h), so the plan and the allocations cannot drift
// apart without the high-water test noticing. The model states follow the ZeRO paper's
// accounting (Rajbhandari et al. 2020): per parameter X bytes of weights, X of gradients, and
// with bf16 4 of fp32 master weights, plus 8 of AdamW moments (16 bytes with X = 2). Sizes are
// uint64_t (model.h says why).
#ifndef LLMC_MEMORY_PLAN_H
#define LLMC_MEMORY_PLAN_H

#include "model.h"
#include "pipeline.h"
#include "stage.h"
#include "target.h"
#include "cp_layout.h"

typedef enum { TRAINER_DP, TRAINER_TP, TRAINER_PP, TRAINER_3D, TRAINER_CP, TRAINER_DILOCO, TRAINER_EP, TRAINER_COUNT } TrainerKind;

// a run's layout: everything that decides a rank's memory (the trainers' flags of the same names)
typedef struct {
    TrainerKind trainer;
    int dp, tp, pp, V;   // the grid, dp x pp x tp ranks; V chunks of layers per stage (-vp)
    PipeSchedule sched;  // the pipeline's schedule (train_gpt2_pp, train_gpt2_3d)
    int m;               // micro-batches per step on each replica: accumulation or the pipeline's
    int B, T;            // a micro-batch
    int zero;            // -z: 0 to 3 in train_gpt2_dp, 0 or 1 in train_gpt2_3d
    int sp;              // -sp: sequence parallelism in the tp group
    int recompute;       // -r: 0, 1 selective, 2 full
    int offload;         // -offload (train_gpt2_dp)
    int overlap;         // -overlap (train_gpt2_dp): two layer buckets in flight rather than one
    int checkpoint;      // 1: checkpoints are written (-n), and with sharded weights gathered
    int dump_grads;      // -dump_grads (train_gpt2_dp): the gradients gathered once, for tests
    int resume;          // -y 1: the host reads a checkpoint's state
    int cp;              // context-parallel ranks (train_gpt2_cp; 0 or 1: none): activations of
                         // T / cp tokens
    int cp_allgather;    // -cp_comm allgather: the whole sequence's K,V on every rank
    int ep;              // Mixture-of-Experts: the ranks the experts are split over (0 or 1: none)
    float capacity_factor;  // train_gpt2_ep: -capacity_factor (0: dropless)
    double maxvio;          // experts: the routed loads' MaxVio (llmc/moe.h) the step's time is predicted at
                            // (llmc/step_time.h; 0: balanced). No buffer depends on it
    int pp_overlap;         // train_gpt2_3d's -pp_overlap 1: with experts, the MoE overlap's second lane
} RunLayout;

// the parts of a rank's device memory, in bytes, as the trainer allocates them
typedef struct {
    ParameterLayout layout;  // the rank's parameters (tp rank 0 of its stage, dp rank 0)
    LayerDims dims;
    int slots;               // micro-batches (or chunks) a pipeline stage holds in flight; 1 without one
    int heads;               // the head's arenas (stage.h's stage_num_heads): 1 without a pipeline, 0
                             // on a stage without the head
    int grad_buffers;        // a pipeline stage's (BTs, C) gradient messages (pipeline_grad_indices): 2,
                             // more in a V; 0 without a pipeline
    uint64_t params, grads, master, state;  // the model states
    uint64_t layers;           // activations the forward keeps for the backward, slots x layers
    uint64_t recomputed;       // one layer's buffers for what -r does not keep
    uint64_t head;             // the last layers' LayerNorm, the logits (B T Vp/tp X) and losses
    uint64_t backward;         // the gradients flowing down a layer, and the tokens
    uint64_t activations;      // layers + recomputed + head + backward
    uint64_t activations_for[RECOMPUTE_MAX + 1];  // the same for each -r
    uint64_t comm;             // ZeRO's reduce and gather buckets, a pipeline's second gradient message
    uint64_t outer;            // DiLoCo's outer state: the outer parameters, their momentum and the
                             // pseudo-gradient, fp32 each
    uint64_t experts;          // Mixture-of-Experts: the experts' activations and the exchange's buffers
    uint64_t kernels;          // cuBLASLt's workspace and the CUDA kernels' scratch (none on the CPU)
    uint64_t file_gather;      // while a checkpoint (or -dump_grads) gathers sharded weights
    uint64_t total;            // the sum: what the run's high-water mark should be
    uint64_t host;             // host memory at most, besides the optimizer's under -offload
    uint64_t host_optimizer;   // -offload: master weights, m, v, and the copies in transit
} MemoryPlan;

// ZeRO's buckets in train_gpt2_dp: the gather buffer of -z 3 holds the embeddings, or two layers
// (the one computing and the next arriving) and the final LayerNorm
static inline uint64_t zero_gather_buffer_size(const ParameterLayout* p) {
    uint64_t layers = 2 * p->bucket_sizes[1] + p->bucket_sizes[2];
    return p->bucket_sizes[0] > layers ? p->bucket_sizes[0] : layers;
}

// ZeRO's buffers besides the model's own (which gpt2_build shards as the layout says): -z 1 a
// reduce-scatter's output, the 1/N shard of the gradients; -z 2 and 3 whole buckets to reduce
// (two layers' with -overlap) and with accumulation a received shard to add; -z 3 the gather
static inline uint64_t zero_buffer_bytes(const ParameterLayout* p, int X, int accum, int overlap) {
    uint64_t bytes = 0;
    if (p->zero == 1) bytes = layout_state_held(p) * X;
    if (p->zero >= 2) bytes = (p->bucket_sizes[0] + (overlap ? 2 : 1) * p->bucket_sizes[1] + p->bucket_sizes[2]) * X +
                              (accum > 1 ? parameter_largest_bucket(p) / p->shards * X : 0);
    if (p->zero == 3) bytes += zero_gather_buffer_size(p) * X;
    return bytes;
}

// -offload's host memory besides the optimizer state: the gradients and the parameters in
// transit, X each per parameter of this rank's share
static inline uint64_t offload_host_bytes(const ParameterLayout* p, int X) { return 2 * layout_state_held(p) * X; }

static inline int layout_cp(const RunLayout* r) { return r->cp > 1 ? r->cp : 1; }
static inline int layout_ep(const RunLayout* r) { return r->ep > 1 ? r->ep : 1; }

// Mixture-of-Experts (llmc/moe.h), N tokens a micro-batch: the slots an expert takes of a rank's
// micro-batch (N k: dropless), and the most rows an expert rank can receive in a layer: every
// rank's slots (dropless, all routed to this rank's experts), or each of its experts full from
// every rank
static inline int moe_capacity(int N, int k, int E, float cf) {
    if (cf <= 0.0f) return N * k;
    // the flag's decimal value: 0.1 is 0.100000001 as a float, which must not take ceil(10.0000001)
    // = 11 slots where the formula's 0.1 N k / E is 10
    double cap = ceil((double)cf * N * k / E * (1.0 - 1e-7));
    return cap < (double)N * k ? (int)cap : N * k;
}
static inline int moe_rows_max(int N, int k, int E, int ep, int capacity) {
    long long dropless = (long long)ep * N * k, capped = (long long)capacity * (E / ep) * ep;
    return (int)(capped < dropless ? capped : dropless);
}
// the device bytes of llmc/moe.h's buffers, B sequences a micro-batch of which the rank routes N
// tokens: `records` micro-batches in flight (one in train_gpt2_ep, a stage's slots in the grid
// trainer), each with record_layers MoE layers of: the rows its experts took (C), their fc and
// GELU outputs (4C each) and the outputs back home (N k rows of C); the routing (4 bytes each):
// each slot's expert, row and gate, the two row orders, each token's P (E), each sequence's f and
// P (2E). Then one layer's scratch: the rows in send order, received, the experts' outputs, a 4C
// gradient, the router's logits (N, E), the router's input gradient (N, C); the bias of every one
// of the model's L layers (E), one layer's 2E counts and the gates' gradients (N k)
static inline uint64_t moe_device_bytes(int records, int record_layers, int L, int B, int N, int k, int C, int E,
                                        int rows_max, int X) {
    uint64_t S = (uint64_t)N * k, R = (uint64_t)rows_max, layers = (uint64_t)records * record_layers;
    return (layers * (R * C + 2 * R * 4 * C + S * C) + S * C + 2 * R * C + R * 4 * C + (uint64_t)N * E + (uint64_t)N * C) * X +
           (layers * (3 * S + 2 * R + (uint64_t)N * E + (uint64_t)B * 2 * E) + (uint64_t)L * E + 2 * (uint64_t)E + S) * 4;
}

// the MoE overlap's second lane (llmc/moe.h's MoeLane): rows in send order (N k, C) and in
// source order (rows_max, C)
static inline uint64_t moe_lane_bytes(int N, int k, int C, int rows_max, int X) {
    return ((uint64_t)N * k + (uint64_t)rows_max) * C * X;
}

// the rank's parameter layout, as each trainer builds it
static inline ParameterLayout memory_plan_layout(GPT2Config c, const RunLayout* r, int stage) {
    if (r->trainer == TRAINER_DP) return parameter_layout_buckets(c, r->zero, r->dp, 0);
    if (r->trainer == TRAINER_EP) return parameter_layout_experts(c, 1, 0, 1, 0, 1, 0, layout_ep(r), 0);
    if (r->trainer == TRAINER_TP || r->trainer == TRAINER_CP || r->trainer == TRAINER_DILOCO) return parameter_layout(c, r->tp, 0);
    // (the grid trainer's experts: ep of a stage's ranks hold them, its rank 0 experts 0 .. E/ep - 1)
    PipeSpec spec = {r->sched, r->pp, r->m, r->V};  // (zbv and dualpipev place the chunks in a V)
    ParameterLayout l = parameter_layout_experts(c, r->tp, 0, r->pp, stage, r->V, pipeline_is_v(spec), layout_ep(r), 0);
    // (ZeRO-1: the dense tensors over dp x cp, the experts over the S / ep ranks holding them, S =
    // dp cp tp the stage's ranks)
    int stage_ranks = r->dp * layout_cp(r) * r->tp;
    if (r->trainer == TRAINER_3D) layout_shard_flat(&l, r->zero, r->dp * layout_cp(r), 0, stage_ranks / layout_ep(r), 0);
    return l;
}

// the activations of -r `recompute` into plan: DP and TP keep one arena of every layer; PP and
// 3D a slot per micro-batch in flight of the stage's chunk, on the head's stage its heads
// (stage.h's pool), and the model's arena of the rest
static inline void memory_plan_activations(MemoryPlan* plan, const RunLayout* r, int recompute) {
    LayerDims d = plan->dims;
    const ParameterLayout* l = &plan->layout;
    Activations unused;
    uint64_t part[ACTS_ALL + 1], slot[ACTS_ALL + 1];
    int T = r->T / layout_cp(r);  // (context parallelism: each rank's tokens of a sequence)
    uint64_t tokens = (uint64_t)r->B * T * 2 * sizeof(int);  // inputs and targets
    if (r->trainer == TRAINER_DP || r->trainer == TRAINER_TP || r->trainer == TRAINER_CP || r->trainer == TRAINER_DILOCO ||
        r->trainer == TRAINER_EP) {
        gpt2_lay_out_activations(&unused, d, l->layers, ACTS_ALL, activations_kept(recompute, 0, d), r->B, T, NULL, part);
        plan->layers = part[ACTS_LAYERS];
        plan->head = part[ACTS_HEAD];
    } else {
        PipeSpec spec = {r->sched, r->pp, r->m, r->V};
        unsigned kept = stage_kept(recompute, spec, d);
        gpt2_lay_out_activations(&unused, d, l->layers, ACTS_SCRATCH | ACTS_RECOMPUTE, kept, r->B, T, NULL, part);
        gpt2_lay_out_activations(&unused, d, l->layers / r->V, ACTS_LAYERS | ACTS_HEAD, kept, r->B, T, NULL, slot);
        plan->layers = plan->slots * slot[ACTS_LAYERS];
        plan->head = plan->heads * slot[ACTS_HEAD];  // (its own pool: in a V fewer than the slots)
    }
    plan->recomputed = part[ACTS_RECOMPUTE];
    plan->backward = part[ACTS_SCRATCH] + tokens;
    plan->activations = plan->layers + plan->recomputed + plan->head + plan->backward;
}

// the plan of the rank at `stage` of run r on machine t (tp rank 0, dp rank 0); root: the plan of
// world rank 0, which receives the other ranks' pieces when a checkpoint is gathered
static inline MemoryPlan memory_plan(GPT2Config c, DeviceTarget t, const RunLayout* r, int stage, int root) {
    MemoryPlan plan;
    memset(&plan, 0, sizeof(plan));
    if (r->trainer == TRAINER_CP || layout_cp(r) > 1) t.flash = 1;  // (ring attention keeps flash attention's lse)
    plan.dims = layer_dims_for(c, r->tp, r->sp, t);
    if (gpt2_is_moe(c)) plan.dims = layer_dims_moe(plan.dims);  // (the experts' activations: below)
    plan.layout = memory_plan_layout(c, r, stage);
    const ParameterLayout* l = &plan.layout;
    uint64_t X = t.X, S = layout_state_held(l), P = gpt2_num_parameters(c), N = l->count;
    int pipelined = r->trainer == TRAINER_PP || r->trainer == TRAINER_3D;
    // the model states: parameters and gradients (floatX), fp32 master weights (bf16 only) and
    // AdamW m and v (fp32), each whole or this rank's shard (layout_held), the optimizer's
    // on the host under -offload
    plan.params = layout_params_held(l) * X;
    plan.grads = layout_grads_held(l) * X;
    plan.master = t.X < 4 && !r->offload ? S * sizeof(float) : 0;
    plan.state = r->offload ? 0 : 2 * S * sizeof(float);
    // a pipeline stage's slots: the most micro-batches its schedule holds at once (pipeline.h);
    // its gradient buffers: two, or in a V as many as its sends put off keep busy (stage.h)
    plan.slots = 1;
    plan.heads = 1;
    plan.grad_buffers = 0;
    if (pipelined) {
        PipeSpec spec = {r->sched, r->pp, r->m, r->V};
        int n = pipeline_actions_per_stage(spec);
        PipeAction* actions = (PipeAction*)malloc_check((uint64_t)n * sizeof(PipeAction));
        pipeline_stage_actions(spec, stage, actions);
        plan.slots = stage_num_slots(spec, actions, n);
        plan.heads = stage_num_heads(spec, stage, l, plan.slots);
        plan.grad_buffers = pipeline_num_grads(spec, stage, actions, n);
        free(actions);
    }
    for (int k = 0; k <= RECOMPUTE_MAX; k++) {
        memory_plan_activations(&plan, r, k);
        plan.activations_for[k] = plan.activations;
    }
    memory_plan_activations(&plan, r, r->recompute);
    // communication buffers: ZeRO's (train_gpt2_dp); a pipeline's second (BTs, C) gradient
    // message, and with ZeRO-1 the reduce-scatter's 1/(dp cp) shard of the gradients
    // (train_gpt2_3d); context parallelism's K,V blocks and their gradients, on the rank's heads
    int cp = layout_cp(r), Tl = r->T / cp;
    if (r->trainer == TRAINER_DP) plan.comm = zero_buffer_bytes(l, t.X, r->m, r->overlap);
    if (pipelined) {
        // (the first gradient buffer is the scratch arena's dresidual, counted in "backward")
        plan.comm = (uint64_t)(plan.grad_buffers - 1) * r->B * Tl / plan.dims.seq_shards * c.channels * X + (r->zero ? S * X : 0);
    }
    if (r->trainer == TRAINER_CP || cp > 1) {
        plan.comm += cp_scratch_bytes(r->B, r->T, cp, c.channels, plan.dims.att, plan.dims.NH, t.X, r->cp_allgather);
    }
    plan.kernels = kernel_workspace_bytes(plan.dims, r->B, Tl);
    // DiLoCo: theta_outer, the momentum and the pseudo-gradient (P fp32 each), and three floats:
    // the flag of a run whose last step took an outer step off its schedule, and -tau's fragment in
    // flight with its step to apply (train_gpt2_diloco.cu)
    if (r->trainer == TRAINER_DILOCO) plan.outer = 3 * N * sizeof(float) + 3 * sizeof(float);
    if (gpt2_is_moe(c)) {
        // the tokens a rank routes: a micro-batch's (B T; in the grid trainer its T/cp of each
        // sequence, with -sp a tp rank's share), in one record (train_gpt2_ep) or one a slot
        int tokens = r->B * (r->T / layout_cp(r)) / plan.dims.seq_shards;
        int rows = moe_rows_max(tokens, c.topk, c.experts, layout_ep(r), moe_capacity(tokens, c.topk, c.experts, r->capacity_factor));
        plan.experts = moe_device_bytes(plan.slots, l->layers / (pipelined ? r->V : 1), c.num_layers, r->B, tokens, c.topk,
                                        c.channels, c.experts, rows, t.X);
        if (r->pp_overlap) plan.experts += moe_lane_bytes(tokens, c.topk, c.channels, rows, t.X);
    }
    // gathers for files
    if (r->trainer == TRAINER_DP) {
        // sharded fp32 weights (bf16 master weights from -z 1, fp32 parameters from -z 3) and
        // -dump_grads' floatX gradients go through a device buffer of one bucket, never both at once
        uint64_t bucket = l->zero > 0 ? parameter_largest_bucket(l) : 0;
        uint64_t weights = r->checkpoint && fp32_weights_sharded(l, t) ? bucket * sizeof(float) : 0;
        uint64_t grads = r->dump_grads ? bucket * X : 0;
        plan.file_gather = weights > grads ? weights : grads;
    } else {
        // rank 0 receives each other model-parallel rank's piece into one device buffer, as large
        // as the largest piece (gpt2_gather_full): fp32 for a checkpoint, floatX for -dump_grads;
        // in train_gpt2_3d a sharded buffer is first all-gathered whole over dp (N fp32, every rank)
        uint64_t largest = 0;
        for (int k = 0; root && layout_model_ranks(l) > 1 && k < layout_model_ranks(l); k++) {
            uint64_t count = k == 0 ? N : parameter_layout_of_rank(c, l, k).count;
            largest = count > largest ? count : largest;
        }
        int sharded = r->trainer == TRAINER_3D && (fp32_weights_sharded(l, t) || S < N);
        uint64_t weights = r->checkpoint ? (sharded ? N * sizeof(float) : 0) + largest * sizeof(float) : 0;
        uint64_t grads = r->dump_grads ? largest * X + (gpt2_is_moe(c) ? N * X : 0) : 0;  // (experts: the scaled copy)
        plan.file_gather = weights > grads ? weights : grads;
    }
    plan.total = plan.params + plan.grads + plan.master + plan.state + plan.activations + plan.comm + plan.kernels +
                 plan.file_gather + plan.outer + plan.experts;
    // host memory at its largest: the whole model in fp32 while building (train_gpt2_dp: also in
    // buckets, 3 P) and this rank's part; on resume the state read from the checkpoint too
    uint64_t resume_state = t.X < 4 ? 2 * sizeof(float) + X : 2 * sizeof(float);  // m, v (and the bf16 bits)
    if (r->trainer == TRAINER_DP) {
        plan.host = P * sizeof(float) * (r->resume ? 5 : 3) + (r->resume || r->checkpoint ? (t.X < 4 ? P * X : 0) : 0);
        if (r->offload) plan.host_optimizer = gpt2_optimizer_state_bytes(l, t) + offload_host_bytes(l, t.X);
    } else if (r->trainer == TRAINER_3D) {
        plan.host = (P + N) * sizeof(float) + (r->resume ? (P + N) * (t.X < 4 ? 3 : 2) * sizeof(float) : 0);
        // rank 0 writing a gathered checkpoint: weights, m, v (and bf16 bits) whole, and a piece
        uint64_t writing = root && r->checkpoint ? P * sizeof(float) * (t.X < 4 ? 4 : 3) + N * sizeof(float) : 0;
        plan.host = writing > plan.host ? writing : plan.host;
    } else {
        plan.host = P * sizeof(float) + N * sizeof(float) + (r->resume ? N * resume_state : 0);
        if (r->trainer == TRAINER_CP && root && r->checkpoint) {  // rank 0 writing the gathered state
            uint64_t writing = P * sizeof(float) * (t.X < 4 ? 4 : 3);  // (weights, m, v and the bf16 bits)
            plan.host = writing > plan.host ? writing : plan.host;
        }
        if (r->trainer == TRAINER_DILOCO) {
            // every state file carries the trainer's own state too: theta_outer, the momentum and
            // the worker's weights (3 N fp32), read on resume and, writing, beside m, v (and the
            // bits) and on rank 0 the whole model
            uint64_t own = 3 * N * sizeof(float);
            if (r->resume) plan.host += own;
            uint64_t writing = r->checkpoint ? (root ? P * sizeof(float) : 0) + N * resume_state + own : 0;
            plan.host = writing > plan.host ? writing : plan.host;
        }
    }
    return plan;
}

// the rank whose device needs the most: the largest of the stages' plans (the same on every dp
// and tp rank of a stage), with its stage
static inline MemoryPlan memory_plan_largest(GPT2Config c, DeviceTarget t, const RunLayout* r, int* stage_out) {
    MemoryPlan best = memory_plan(c, t, r, 0, 1);
    int best_stage = 0;
    for (int s = 1; s < r->pp; s++) {
        MemoryPlan plan = memory_plan(c, t, r, s, 0);
        if (plan.total > best.total) best = plan, best_stage = s;
    }
    if (stage_out) *stage_out = best_stage;
    return best;
}

// The table's rows: a label, bytes, a note saying what they are and which formula; a part of the
// device's total (the picture of dev/memory.html stacks these), a sum of parts above it, or host
// memory. The trainers print them (memory_plan_print), dev/memory_planner prints them or writes
// them as JSON for the page.
typedef enum { MEMORY_PART, MEMORY_SUM, MEMORY_HOST } MemoryRowKind;
typedef struct {
    const char* label;
    uint64_t bytes;
    char note[256];
    MemoryRowKind kind;
    int indent;  // 1: a part of the activations
} MemoryRow;
#define MEMORY_ROWS_MAX 24

static inline void memory_row(MemoryRow* rows, int* n, const char* label, uint64_t bytes, MemoryRowKind kind,
                              const char* note) {
    MemoryRow* row = &rows[(*n)++];
    row->label = label, row->bytes = bytes, row->kind = kind, row->indent = 0;
    snprintf(row->note, sizeof(row->note), "%s", note);
}

// the rows of a rank's plan, in the table's order; returns how many
static inline int memory_plan_rows(const MemoryPlan* plan, GPT2Config c, const RunLayout* r, MemoryRow* rows) {
    int n = 0;
    const ParameterLayout* l = &plan->layout;
    DeviceTarget t = plan->dims.target;
    int X = t.X, dp_sharded = r->zero > 0 && r->dp > 1;
    uint64_t P = gpt2_num_parameters(c);
    char note[256];
    const char* shard = dp_sharded ? " / dp: this rank's shard" : "";
    snprintf(note, sizeof(note), "X Psi: %llu of %llu parameters (%.1f%%)%s, X = %d bytes (%s)",
             (unsigned long long)layout_params_held(l), (unsigned long long)P, 100.0 * layout_params_held(l) / P, r->zero >= 3 ? " / dp: this rank's shard" : "", X, X == 2 ? "bf16" : "fp32");
    memory_row(rows, &n, "parameters", plan->params, MEMORY_PART, note);
    memory_row(rows, &n, "gradients", plan->grads, MEMORY_PART, r->zero >= 2 ? "X Psi / dp: this rank's shards" : "X Psi");
    const char* on_host = "0 on the device: in host memory (-offload)";
    snprintf(note, sizeof(note), "4 Psi%s", shard);
    memory_row(rows, &n, "master weights", plan->master, MEMORY_PART, r->offload ? on_host : X == 4 ? "none in fp32" : note);
    snprintf(note, sizeof(note), "8 Psi%s", shard);
    memory_row(rows, &n, "AdamW m, v", plan->state, MEMORY_PART, r->offload ? on_host : note);
    // the ZeRO paper's formulas with Psi the rank's parameters (of its tp slice and stage)
    const char* formula[4] = {X == 2 && r->trainer == TRAINER_DP ? "16 Psi (the ZeRO paper's DDP)" : "16 Psi",
                              X == 2 ? "(2 + 2) Psi + 12 Psi / dp (the ZeRO paper's P_os)" : "(4 + 4) Psi + 8 Psi / dp",
                              X == 2 ? "2 Psi + 14 Psi / dp (P_os+g)" : "4 Psi + 12 Psi / dp",
                              "16 Psi / dp (P_os+g+p)"};
    snprintf(note, sizeof(note), "= %s%s", formula[dp_sharded ? r->zero : 0],
             r->offload ? (X == 2 ? ", less the optimizer's 12 Psi on the host" : ", less the optimizer's 8 Psi on the host") : "");
    memory_row(rows, &n, "model states", plan->params + plan->grads + plan->master + plan->state, MEMORY_SUM, note);
    snprintf(note, sizeof(note), "-r %d; -r 0 / 1 / 2: %.1f / %.1f / %.1f MB", r->recompute, plan->activations_for[0] / 1e6,
             plan->activations_for[1] / 1e6, plan->activations_for[2] / 1e6);
    if (r->trainer == TRAINER_EP) snprintf(note, sizeof(note), "-r 0: train_gpt2_ep keeps every activation (no -r 1 or 2)");
    memory_row(rows, &n, "activations", plan->activations, MEMORY_SUM, note);
    if (plan->slots > 1 || r->pp > 1) {
        snprintf(note, sizeof(note), "kept for the backward: %d slot%s (the schedule's micro-batch%s in flight) x %d layers",
                 plan->slots, plan->slots > 1 ? "s" : "", r->V > 1 ? " chunks" : "es", l->layers / r->V);
    } else {
        snprintf(note, sizeof(note), "kept for the backward: %d layers of one micro-batch", l->layers);
    }
    memory_row(rows, &n, "layers", plan->layers, MEMORY_PART, note);
    rows[n - 1].indent = 1;
    memory_row(rows, &n, "recomputed", plan->recomputed, MEMORY_PART,
               plan->recomputed ? "one layer's buffers for what -r does not keep" : "");
    rows[n - 1].indent = 1;
    const char* head = !plan->head ? "none: the head is on another stage"
                       : r->trainer == TRAINER_CP ? "final LayerNorm, logits (B T/cp Vp X), losses"
                                                  : "final LayerNorm, logits (B T Vp/tp X), losses";
    snprintf(note, sizeof(note), "%s", head);
    // (a pipeline's head stage: one a slot, or in a V the last virtual stage's micro-batches in flight)
    if (plan->head && (r->trainer == TRAINER_PP || r->trainer == TRAINER_3D)) {
        PipeSpec spec = {r->sched, r->pp, r->m, r->V};
        snprintf(note, sizeof(note), "%s: %d head%s (%s)", head, plan->heads, plan->heads > 1 ? "s" : "",
                 pipeline_is_v(spec) ? "the last chunk's micro-batches between F and W" : "one a slot");
    }
    memory_row(rows, &n, "head", plan->head, MEMORY_PART, note);
    rows[n - 1].indent = 1;
    memory_row(rows, &n, "backward", plan->backward, MEMORY_PART, "gradients flowing down a layer, the tokens");
    rows[n - 1].indent = 1;
    const char* comm = "none: the collectives work in place or on activations";
    if (r->trainer == TRAINER_DP && r->zero == 1) comm = "the reduce-scatter's output, X Psi / dp (the all-gather works in place)";
    if (r->trainer == TRAINER_DP && r->zero >= 2) {
        comm = r->zero == 3 ? "buckets before reduction, and the gathered parameters of 2 layers"
                            : "buckets before their reduction (and a shard to add, with accumulation)";
    }
    // (a pipeline's gradient messages beyond the scratch arena's: one, or in a V as many more as
    // its sends put off keep busy at once)
    char grads_note[96];
    if (plan->grad_buffers > 2) snprintf(grads_note, sizeof(grads_note), "%d more gradient messages (sends put off, the V)", plan->grad_buffers - 1);
    else snprintf(grads_note, sizeof(grads_note), "a second gradient message");
    if (r->trainer == TRAINER_PP || r->trainer == TRAINER_3D) {
        snprintf(note, sizeof(note), "%s%s", grads_note, r->zero ? ", and the reduce-scatter's 1/dp shard of the gradients"
                                                                : " (one is sent while the next arrives)");
        comm = note;
    }
    if (r->trainer == TRAINER_3D && layout_cp(r) > 1) {
        const char* kv = r->cp_allgather ? "the sequence's K,V" : "the ring's K,V blocks";
        snprintf(note, sizeof(note), "%s%s; %s (tp's heads) and grads, o, dq, wpe rows", grads_note,
                 r->zero ? ", the 1/(dp cp) gradient shard" : "", kv);
        comm = note;
    }
    if (r->trainer == TRAINER_CP) {
        comm = r->cp_allgather ? "K,V of the whole sequence (X) and their gradient (fp32); o, dq, wpe rows"
                               : "two K,V blocks of the ring (X) and their gradients (fp32); o, dq, wpe rows";
    }
    memory_row(rows, &n, "comm buffers", plan->comm, MEMORY_PART, comm);
    if (gpt2_is_moe(c)) {
        snprintf(note, sizeof(note), "%d experts of %d here (-ep %d): the rows they take, fc and GELU outputs, the way back",
                 c.experts / layout_ep(r), c.experts, layout_ep(r));
        memory_row(rows, &n, "experts", plan->experts, MEMORY_PART, note);
    }
    if (r->trainer == TRAINER_DILOCO) {
        memory_row(rows, &n, "outer state", plan->outer, MEMORY_PART, "12 Psi: the outer parameters, their momentum and the "
                                                             "pseudo-gradient (fp32; below fp32 on the link, its messages)");
    }
    memory_row(rows, &n, "kernel scratch", plan->kernels, MEMORY_PART, t.cuda ? "cuBLASLt's workspace and the kernels' scratch buffers"
                                                                      : "none on the CPU backend");
    memory_row(rows, &n, "file gather", plan->file_gather, MEMORY_PART,
               plan->file_gather ? "while a checkpoint gathers the shards or slices" : "none: no sharded files to gather");
    memory_row(rows, &n, "total", plan->total, MEMORY_SUM, "the high-water mark to expect");
    if (r->offload) {
        snprintf(note, sizeof(note), "%s m, v (%d bytes per parameter of this rank's share) + gradients and parameters in "
                 "transit (2 X)", X == 2 ? "master weights," : "", X == 2 ? 12 : 8);
        memory_row(rows, &n, "host: optimizer", plan->host_optimizer, MEMORY_HOST, note);
    }
    memory_row(rows, &n, "host buffers", plan->host, MEMORY_HOST, "at most (the whole model while loading; on resume its state)");
    return n;
}

// LLMC_MEMORY_MEASURED=1: at the run's end, each row of the table beside the bytes the allocator
// counted under it (allocations.h's kinds, named as the rows): held at a moment of the high-water
// mark, and the most held at once. The plan is kept here from the table's printing to then.
static struct {
    MemoryPlan plan;
    GPT2Config config;
    RunLayout layout;
} memory_measured_run;

static inline void memory_measured_print(void) {
    MemoryRow rows[MEMORY_ROWS_MAX];
    int n = memory_plan_rows(&memory_measured_run.plan, memory_measured_run.config, &memory_measured_run.layout, rows);
    const DeviceAllocations* a = &device_allocations;
    int shown[ALLOC_KINDS] = {0};
    printf("device memory per row (LLMC_MEMORY_MEASURED=1): predicted, measured at the high-water mark, measured at most\n");
    for (int i = 0; i < n; i++) {
        if (rows[i].kind != MEMORY_PART) continue;
        int k = 0;
        while (k < ALLOC_KINDS && strcmp(allocation_kind_names[k], rows[i].label) != 0) k++;
        if (k == ALLOC_KINDS) fail("memory table row \"%s\" has no allocation kind (allocations.h)", rows[i].label);
        shown[k] = 1;
        printf("  %-16s predicted %llu, at the high-water mark %zu, at most %zu\n", rows[i].label,
               (unsigned long long)rows[i].bytes, a->at_peak_of[k], a->peak_of[k]);
    }
    // what was allocated under a kind that has no row in this trainer's table (untagged)
    for (int k = 0; k < ALLOC_KINDS; k++) {
        if (shown[k] || a->peak_of[k] == 0) continue;
        printf("  %-16s predicted 0, at the high-water mark %zu, at most %zu (no row)\n", allocation_kind_names[k],
               a->at_peak_of[k], a->peak_of[k]);
    }
    printf("  %-16s predicted %llu, at the high-water mark %zu, at most %zu\n", "total",
           (unsigned long long)memory_measured_run.plan.total, a->peak, a->peak);
    fflush(stdout);
}

// the table every trainer prints at its start, and dev/memory_planner for any layout:
// "  activations    14.5 MB  note", a part of the activations indented. With
// LLMC_MEMORY_MEASURED=1, the rows with what was measured for each, as the process exits
static inline void memory_plan_print(const MemoryPlan* plan, GPT2Config c, const RunLayout* r) {
    MemoryRow rows[MEMORY_ROWS_MAX];
    int n = memory_plan_rows(plan, c, r, rows);
    for (int i = 0; i < n; i++) {
        printf("  %s%-*s %10.1f MB%s%s\n", rows[i].indent ? "  " : "", rows[i].indent ? 14 : 16, rows[i].label,
               rows[i].bytes / 1e6, rows[i].note[0] ? "  " : "", rows[i].note);
    }
    const char* measured = getenv("LLMC_MEMORY_MEASURED");
    if (measured != NULL && strcmp(measured, "1") == 0) {
        memory_measured_run.plan = *plan, memory_measured_run.config = c, memory_measured_run.layout = *r;
        atexit(memory_measured_print);
    }
}

#endif
