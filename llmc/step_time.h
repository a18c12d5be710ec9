// How long a training step takes, predicted: the step's kernels (llmc/step_kernels.h) priced on a
// device (llmc/device_profile.h), its collectives on the links between the ranks that run them
// (llmc/comm_time.h), and a pipeline's schedule played with those times (llmc/pipeline.h,
// pipeline_play), so that the bubble is what the play leaves idle rather than a formula's.
//
// The model, part by part (each a function below, each checked against a hand-worked case in
// test/test_step_time.c):
//   1. a kernel: max(FLOPs / (peak x efficiency), bytes / (bandwidth x efficiency_memory)), a
//      roofline with the achievable rates of the profile: a GEMM's efficiency by its size class,
//      attention's on its useful causal FLOPs (the profile's definition: device_profile.h), the
//      elementwise kernels and memsets bound by their bytes;
//   2. a collective: comm_time.h's alpha-beta time on the group's placement (which ranks share a
//      node follows from the grid order and gpus_per_node); one that the layout overlaps with
//      compute (the row's hidden_by: -overlap's buckets, -tp_overlap's GEMMs) costs what outlasts
//      that compute, every other one is exposed whole;
//   3. a pipeline stage's actions: a chunk's forward (F), its backward's input half (B) and weight
//      half (W) are the sums of the rows each runs, tp's and cp's collectives inside them
//      included; a message between stages takes the send's time; pipeline_play runs every
//      stage's list with those durations and returns the schedule's length;
//   4. the step: the schedule, then the once-a-step work of the slowest stage (the gradients'
//      reduction over dp, the tied embedding's, the norm, AdamW).
// What it leaves out, as the rows do: launch latency, the host's own work inside a step, the tail
// of a grid that does not fill the device, and collectives' contention with compute for the
// memory system. On the CPU every rank's compute is scaled by the cores it gets when the ranks
// outnumber the host's cores (the profile's cpu_cores and cpu_threads).
#ifndef LLMC_STEP_TIME_H
#define LLMC_STEP_TIME_H

#include <string.h>
#include "memory_plan.h"  // (first: step_kernels_run takes its RunLayout)
#include "step_kernels.h"
#include "comm_time.h"
#include "pipeline.h"

// the parts a step's time is reported in (rank 0's stage: stage 0, dp, cp, tp rank 0)
typedef enum { TIME_GEMM, TIME_ATTENTION, TIME_MEMORY, TIME_HOST, TIME_COMPUTE_KINDS } TimeComputeKind;
static const char* time_compute_names[TIME_COMPUTE_KINDS] = {"gemm", "attention", "memory", "host"};
#define TIME_GROUPS 9
static const char* time_group_names[TIME_GROUPS] = {"tp", "cp", "pp", "dp", "edp", "ep", "embedding", "across", "pcie"};

typedef struct {
    double seconds;                         // the step
    double compute[TIME_COMPUTE_KINDS];     // stage 0's compute a step, by kind
    double comm_exposed[TIME_GROUPS];       // stage 0's collectives a step, what waits in the open
    double comm_total[TIME_GROUPS];         // ... and before overlap
    double schedule;                        // the pipeline's length (every micro-batch's F, B, W)
    double bubble;                          // of it, stage 0's idle time (0 without stages)
    double once;                            // the slowest stage's once-a-step part after the schedule
    double tokens_per_second, mfu;          // the global batch's tokens over the step; model FLOPs / peak
} StepTime;

static inline int time_group_index(const char* comm) {
    for (int i = 0; i < TIME_GROUPS; i++) {
        if (comm && strcmp(comm, time_group_names[i]) == 0) return i;
    }
    return -1;
}

// 1. A kernel's seconds for one call. FLOPs: a row's own, except attention's, which the caller
// has turned into useful FLOPs (time_attention_useful_scale). X: the floats' bytes (the GEMMs'
// peak). slowdown >= 1: ranks sharing a core
static inline double time_kernel_seconds(const DeviceProfile* p, const StepKernel* r, double flops, int X,
                                         double slowdown) {
    double bandwidth = p->memory_bandwidth_bytes_per_s * p->efficiency_memory, rate = 0.0;
    switch (r->engine) {
        case STEP_GEMM: rate = device_profile_peak_flops(p, X) * device_profile_matmul_efficiency(p, flops); break;
        case STEP_ATTN: rate = device_profile_peak_flops(p, X) * p->efficiency_attention; break;
        // (-offload's host AdamW: at the device's rates, since profiles do not describe the host
        // yet: too fast for a GPU's host, which the planner says where it ranks layouts)
        case STEP_HOST: rate = p->peak_flops_fp32 * p->efficiency_memory; break;
        default: rate = 0.0;  // vector and memset rows: their bytes
    }
    double by_flops = rate > 0.0 ? flops / rate : 0.0, by_bytes = r->bytes / bandwidth;
    return (by_flops > by_bytes ? by_flops : by_bytes) * slowdown;
}

// which part a compute row's time is reported under
static inline TimeComputeKind time_kind_of(const StepKernel* r) {
    if (r->engine == STEP_HOST) return TIME_HOST;
    if (strcmp(r->op, "attention") == 0 && (r->engine == STEP_ATTN || r->engine == STEP_GEMM)) return TIME_ATTENTION;
    return r->engine == STEP_GEMM ? TIME_GEMM : TIME_MEMORY;
}

// Attention's rows count the FLOPs the kernels execute (flash's whole diagonal tiles and its
// second pass for dq; cuBLAS's full T x T squares), the profile's efficiency the useful ones: q k^T
// and p v over the causal pairs, 2 T (T + 1) hs a head and sequence forward, twice that backward.
// The factor that turns one into the other, for the rows of one phase (F: forward; B: backward,
// with a recomputed forward where the layout reruns attention before its backward)
static inline double time_attention_useful_scale(const StepKernel* rows, int n, GPT2Config c, const StepLayout* o,
                                                 StepPhase phase) {
    double executed = 0.0;
    for (int i = 0; i < n; i++) {
        if (rows[i].phase == phase && time_kind_of(&rows[i]) == TIME_ATTENTION) executed += rows[i].flops * rows[i].calls;
    }
    if (executed <= 0.0) return 1.0;
    int tp = o->tp > 1 ? o->tp : 1, cp = o->cp > 1 ? o->cp : 1, pp = o->pp > 1 ? o->pp : 1;
    int m = o->micro_batches > 1 ? o->micro_batches : 1;
    double hs = (double)c.channels / c.num_heads, heads = (double)c.num_heads / tp;
    double forward = 2.0 * o->T * (o->T + 1.0) * hs * heads * o->B / cp * (c.num_layers / pp) * m;  // (zigzag: 1/cp each)
    int rerun = o->recompute == 2 || (o->recompute == 1 && !o->flash);  // (-r 1 keeps flash's outputs)
    double useful = phase == STEP_PHASE_FORWARD ? forward : (2.0 + rerun) * forward;
    return useful / executed;
}

// 2. A collective's group as comm_time.h places it: the members of rank r's group on the grid,
// as many as the row says its group has (a pipeline message: the pair of stages it crosses;
// DiLoCo's across: one rank of each worker, the workers being consecutive blocks of ranks)
static inline GroupPlacement time_placement(const StepKernel* row, GridShape g, int r, int gpus_per_node) {
    int S = g.dp * g.cp * g.tp, world = grid_world(g);
    if (strcmp(row->comm, "pp") == 0) return pair_placement(r, r + S < world ? r + S : r - S, gpus_per_node);
    GridGroup kind = GRID_DP;
    if (strcmp(row->comm, "tp") == 0) kind = GRID_TP;
    else if (strcmp(row->comm, "cp") == 0) kind = GRID_CP;
    else if (strcmp(row->comm, "edp") == 0) kind = GRID_EDP;
    else if (strcmp(row->comm, "ep") == 0) kind = GRID_EP;
    else if (strcmp(row->comm, "embedding") == 0) kind = GRID_EMBEDDING;
    RankPattern members = grid_group(g, r, kind);
    if (strcmp(row->comm, "across") == 0 && row->ranks > 0) {
        members.first = r, members.stride = world / row->ranks;
    }
    if (row->ranks > 0) members.size = row->ranks;  // (DiLoCo's dp: a worker's ranks, not the world's)
    return group_placement(members, gpus_per_node);
}

// a link row's seconds a call: its payload through the collective it names, over its group
// (-offload's "pcie" copies: the host link, priced as a node's link until profiles carry one)
static inline double time_link_seconds(const DeviceProfile* p, const StepKernel* r, GridShape g, int rank,
                                       int gpus_per_node) {
    if (strcmp(r->comm, "pcie") == 0) {
        LinkCost l = link_cost(p, LINK_INTRA_NODE);
        return l.alpha + r->payload / l.beta;
    }
    return coll_time(p, collective_of_name(r->collective), time_placement(r, g, rank, gpus_per_node), r->payload).seconds;
}

// the compute a link row may hide behind: the rows named by its hidden_by, a kernel or a group
static inline double time_hiding_seconds(const StepKernel* rows, const double* seconds, int n, const char* hidden_by) {
    double total = 0.0;
    for (int i = 0; i < n; i++) {
        if (rows[i].engine == STEP_LINK) continue;
        if (strcmp(rows[i].kernel, hidden_by) == 0 || strcmp(rows[i].group, hidden_by) == 0) total += seconds[i];
    }
    return total;
}

// 3. One stage: its rows priced, each action's duration (seconds[op]: one chunk's F, B and W of
// one micro-batch, the stage's V chunks averaged), the message's send time, and its once-a-step
// part. The parts of the step are filled for stage 0.
typedef struct {
    double action[3];  // F, B, W of one chunk and micro-batch
    double send;       // one pipeline message
    double once;       // after the schedule: the reductions, the norm, AdamW
} StageTime;

static inline StageTime time_stage(const DeviceProfile* p, GPT2Config c, const StepLayout* o, GridShape g, int rank,
                                   int gpus_per_node, double slowdown, StepTime* parts) {
    StepKernel rows[STEP_KERNELS_MAX];
    double seconds[STEP_KERNELS_MAX];
    int n = step_kernels(rows, STEP_KERNELS_MAX, c, *o);
    if (n > STEP_KERNELS_MAX) n = STEP_KERNELS_MAX;  // (STEP_KERNELS_MAX holds the largest step's rows)
    double scale_f = time_attention_useful_scale(rows, n, c, o, STEP_PHASE_FORWARD);
    double scale_b = time_attention_useful_scale(rows, n, c, o, STEP_PHASE_BACKWARD_INPUT);
    StageTime st = {{0.0, 0.0, 0.0}, 0.0, 0.0};
    for (int i = 0; i < n; i++) {  // the compute rows first: the links may hide behind them
        const StepKernel* r = &rows[i];
        seconds[i] = 0.0;
        if (r->engine == STEP_LINK) continue;
        double flops = r->flops;
        if (time_kind_of(r) == TIME_ATTENTION) flops *= r->phase == STEP_PHASE_FORWARD ? scale_f : scale_b;
        seconds[i] = time_kernel_seconds(p, r, flops, o->X, slowdown) * r->calls;
        if (parts) parts->compute[time_kind_of(r)] += seconds[i];
    }
    for (int i = 0; i < n; i++) {
        const StepKernel* r = &rows[i];
        if (r->engine != STEP_LINK) continue;
        double per_call = time_link_seconds(p, r, g, rank, gpus_per_node);
        if (strcmp(r->comm, "pp") == 0) {  // (a message: the play waits for it where the receiver must)
            st.send = per_call > st.send ? per_call : st.send;
            continue;
        }
        double total = per_call * r->calls, exposed = total;
        if (r->hidden_by[0]) exposed = comm_exposed(total, time_hiding_seconds(rows, seconds, n, r->hidden_by));
        seconds[i] = exposed;
        int k = time_group_index(r->comm);
        if (parts && k >= 0) parts->comm_total[k] += total, parts->comm_exposed[k] += exposed;
    }
    int m = o->micro_batches > 1 ? o->micro_batches : 1, V = o->V > 1 ? o->V : 1;
    for (int i = 0; i < n; i++) {
        StepPhase ph = rows[i].phase;
        if (ph == STEP_PHASE_STEP) st.once += seconds[i];
        else st.action[ph == STEP_PHASE_FORWARD ? PIPE_FORWARD : ph == STEP_PHASE_BACKWARD_INPUT ? PIPE_BACKWARD : PIPE_WEIGHT] +=
                 seconds[i] / ((double)m * V);
    }
    return st;
}

// 4. The step of a layout: every stage priced at its dp, cp and tp rank 0 (the replicas and the
// ranks of one stage do the same work), the schedule played with their durations, then the
// slowest stage's once-a-step part. Without zero bubble a backward holds its weight half (B + W
// is the action); one stage is a pipeline of p = 1 (its micro-batches one after another).
static inline StepTime step_time_predict(const DeviceProfile* p, GPT2Config c, const RunLayout* r, StepOptions opt,
                                         int gpus_per_node) {
    StepTime t;
    memset(&t, 0, sizeof(t));
    GridShape g = {r->dp, r->pp, layout_cp(r), r->tp, layout_ep(r)};
    int S = g.dp * g.cp * g.tp, world = grid_world(g), pp = r->pp > 1 ? r->pp : 1;
    double slowdown = 1.0;  // (CPU ranks that outnumber the cores share them)
    if (p->kind == DEVICE_CPU && p->cpu_cores > 0) {
        double threads = (double)world * (p->cpu_threads > 0 ? p->cpu_threads : 1);
        if (threads > p->cpu_cores) slowdown = threads / p->cpu_cores;
    }
    PipeSpec spec = {pp > 1 ? r->sched : SCHEDULE_AFAB, pp, r->m > 1 ? r->m : 1, r->V > 1 ? r->V : 1};
    int zb = spec.sched == SCHEDULE_ZB, n = pipeline_actions_per_stage(spec);
    double* seconds = (double*)malloc_check((size_t)pp * 3 * sizeof(double));
    double send = 0.0;
    for (int s = 0; s < pp; s++) {
        StepLayout o = step_layout_of_run(r, s, opt);
        StageTime st = time_stage(p, c, &o, g, s * S, gpus_per_node, slowdown, s == 0 ? &t : NULL);
        seconds[s * 3 + PIPE_FORWARD] = st.action[PIPE_FORWARD];
        seconds[s * 3 + PIPE_BACKWARD] = st.action[PIPE_BACKWARD] + (zb ? 0.0 : st.action[PIPE_WEIGHT]);
        seconds[s * 3 + PIPE_WEIGHT] = zb ? st.action[PIPE_WEIGHT] : 0.0;
        send = st.send > send ? st.send : send;
        t.once = st.once > t.once ? st.once : t.once;
    }
    PipeAction* actions = (PipeAction*)malloc_check((size_t)pp * n * sizeof(PipeAction));
    double* start = (double*)malloc_check((size_t)pp * n * sizeof(double));
    double* end = (double*)malloc_check((size_t)pp * n * sizeof(double));
    t.schedule = pipeline_play(spec, actions, seconds, send, start, end);
    double busy = 0.0;  // stage 0's
    for (int k = 0; k < n; k++) busy += end[k] - start[k];
    t.bubble = t.schedule - busy;
    t.seconds = t.schedule + t.once;
    double tokens = (double)r->dp * spec.m * r->B * r->T;  // the global batch (cp and tp ranks share sequences)
    t.tokens_per_second = tokens / t.seconds;
    double peak = device_profile_peak_flops(p, opt.X) * world;
    t.mfu = gpt2_flops_per_token(c, r->T) * tokens / t.seconds / peak;
    free(seconds);
    free(actions);
    free(start);
    free(end);
    return t;
}

#endif  // LLMC_STEP_TIME_H
