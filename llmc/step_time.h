// How long a training step takes, predicted: the step's kernels (llmc/step_kernels.h) priced on a
// device (llmc/device_profile.h), its collectives on the links between the ranks that run them
// (llmc/comm_time.h), and a pipeline's schedule played with those times (llmc/pipeline.h,
// pipeline_play), so that the bubble is what the play leaves idle rather than a formula's.
//
// The model, part by part (each a function below, each checked against a hand-worked case in
// test/test_step_time.c):
//   1. a kernel: max(FLOPs / (peak x efficiency), bytes / (bandwidth x efficiency_memory)), a
//      roofline with the achievable rates of the profile: a GEMM's efficiency by its size class,
//      fused attention's on its useful causal FLOPs (the profile's definition: device_profile.h;
//      the unfused path's GEMMs and passes as what they are), the
//      elementwise kernels and memsets bound by their bytes (the optimizer's passes at
//      efficiency_optimizer where the profile measured it); on a CPU the sum of the two (one
//      core does both: it packs a GEMM's operands between its FMAs);
//   2. a collective: comm_time.h's alpha-beta time on the group's placement (which ranks share a
//      node follows from the grid order and gpus_per_node); one that the layout overlaps with
//      compute (the row's hidden_by: -overlap's buckets, -tp_overlap's GEMMs) costs what outlasts
//      that compute, every other one is exposed whole (on a CPU every one: MPI's copies and sums
//      run on the rank's own core, inside its MPI calls);
//   3. a pipeline stage's actions: a chunk's forward (F), its backward's input half (B) and weight
//      half (W) are the sums of the rows each runs, tp's and cp's collectives inside them
//      included; a message between stages takes the send's time (on a GPU the receiver waits
//      for it where it must; on a CPU the sender's core copies it: time_stage); pipeline_play
//      runs every stage's list with those durations and returns the schedule's length, and what
//      the messages add to it, played again without them, is their exposed part; with the grid
//      trainer's -pp_overlap 1 and ep > 1 on a GPU, each F&B pair's MoE all-to-alls hide behind
//      the other micro-batch's compute (time_pair_hidden) and the pair's backward ends that much
//      sooner (pipeline_play_paired);
//   4. the step: the schedule, then the once-a-step work of the slowest stage (the gradients'
//      reduction over dp, the tied embedding's, the norm, AdamW);
//   5. ranks that share a CPU (a cpu profile; a GPU is a rank's own): while n ranks compute at once
//      each runs at the fraction of a lone rank's rate that calibrate measured for n (GEMMs and
//      attention at the GEMMs', memory-bound passes at the triad's); its collectives at the
//      all-reduce measured over as many ranks as the run has. Without stages every rank computes
//      at once; with stages a stage idle in the bubble waits in MPI, taking only what
//      cpu_wait_slowdown says of a core, so an action runs at the speed of the stages computing
//      at that moment (the stage that runs alone in the bubble runs fastest): the schedule is
//      played from event to event with each action's time at each count. Beyond those
//      fractions, where calibrate measured them: the compute takes cpu_meeting_fraction_N_ranks
//      longer, what ranks arriving apart at the collectives (taking turns on the cores) wait for
//      a share of the compute before each meeting; a pass whose bytes fit in a rank's share of
//      the cache takes the in-cache fraction; a GEMM whose bytes exceed the cache (a language
//      model head) its own efficiency; a collective of a group of 2 or 4 smaller than the world,
//      its bytes past 2 MB at what calibrate measured of such groups all at once, placed as this
//      one is on the cores (time_group_measured).
// -offload's host rows run on the profile's host (AdamW at its FLOP/s and memory bandwidth, the
// copies over its PCIe link); a CPU is its own host.
// What it leaves out, as the rows do: launch latency, the host's own work inside a step, the tail
// of a grid that does not fill the device, and collectives' contention with compute for the
// memory system; on a CPU, a GEMM's rate beyond its three classes (small and large by FLOPs, and
// beyond the cache by bytes), and whether the wait for ranks arriving apart stays a fraction of
// the compute between two collectives when that compute is far shorter or longer than the few
// milliseconds of GEMM calibrate measures it after.
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
// the links a collective's time is spent on (comm_time.h's classes: NVLink or one host's MPI
// inside a node, InfiniBand across nodes; -offload's copies over the host's PCIe link)
#define TIME_LINKS 3
static const char* const time_link_names[TIME_LINKS] = {"intra-node", "inter-node", "pcie"};

typedef struct {
    double seconds;                         // the step
    double compute[TIME_COMPUTE_KINDS];     // stage 0's compute a step, by kind
    double comm_exposed[TIME_GROUPS];       // stage 0's collectives a step, what waits in the open
    double comm_total[TIME_GROUPS];         // ... and before overlap
    double comm_exposed_link[TIME_GROUPS][TIME_LINKS];  // comm_exposed split by the link it is spent on
    // (pp: the pipeline's messages. Exposed: how much longer they make the schedule than messages
    // that take no time, after what the receivers' other work hides; total: every stage's sends)
    double schedule;                        // the pipeline's length (every micro-batch's F, B, W)
    double bubble;                          // of it, stage 0's idle time with messages that take no
                                            // time (0 without stages; the messages' part is pp's)
    double once;                            // the slowest stage's once-a-step part after the schedule
    double tokens_per_second, mfu;          // the global batch's tokens over the step; model FLOPs / peak
} StepTime;

static inline int time_group_index(const char* comm) {
    for (int i = 0; i < TIME_GROUPS; i++) {
        if (comm && strcmp(comm, time_group_names[i]) == 0) return i;
    }
    return -1;
}

// 5. Ranks sharing a CPU: how many times longer each of n ranks computing at once takes than a
// rank alone (n need not be whole: ranks busy part of the time). The host's throughput A(n), in
// lone ranks' worth, is n x the measured fraction at n = 2, 4, 8 (A(1) = 1), straight between
// them and flat past the last (more ranks than that take turns on what the host has); the
// slowdown is n / A(n). Without measured fractions, ranks of cpu_threads share cpu_cores evenly:
// A(n) = min(n, cpu_cores / cpu_threads). A GPU profile: 1 (each rank its own device).
// memory_bound: 0 GEMMs and attention (the GEMMs' fractions), 1 memory-bound passes beyond the
// cache (the triad's over large arrays), 2 passes whose bytes fit in the cache (the triad's over
// small arrays, where the profile has them; else as 1)
static inline double time_cpu_share_slowdown(const DeviceProfile* p, double n, int memory_bound) {
    if (p->kind != DEVICE_CPU || n <= 1.0) return 1.0;
    if (memory_bound == 2 && !(p->cpu_memory_cached_fraction_2_ranks > 0.0)) memory_bound = 1;
    double f2 = memory_bound == 2 ? p->cpu_memory_cached_fraction_2_ranks
                : memory_bound ? p->cpu_memory_fraction_2_ranks : p->cpu_gemm_fraction_2_ranks;
    double f4 = memory_bound == 2 ? p->cpu_memory_cached_fraction_4_ranks
                : memory_bound ? p->cpu_memory_fraction_4_ranks : p->cpu_gemm_fraction_4_ranks;
    double f8 = memory_bound == 2 ? p->cpu_memory_cached_fraction_8_ranks
                : memory_bound ? p->cpu_memory_fraction_8_ranks : p->cpu_gemm_fraction_8_ranks;
    if (f2 <= 0.0) {  // (not measured: even shares of the cores)
        double cores = p->cpu_cores > 0 ? (double)p->cpu_cores / (p->cpu_threads > 0 ? p->cpu_threads : 1) : n;
        return n > cores ? n / cores : 1.0;
    }
    double at[4] = {1.0, 2.0, 4.0, 8.0}, A[4] = {1.0, 2.0 * f2, 4.0 * f4, 8.0 * f8};
    int last = f4 <= 0.0 ? 1 : f8 <= 0.0 ? 2 : 3;
    double throughput = A[last];
    for (int i = 0; i < last; i++) {
        if (n <= at[i + 1]) {
            throughput = A[i] + (A[i + 1] - A[i]) * (n - at[i]) / (at[i + 1] - at[i]);
            break;
        }
    }
    return n / throughput;
}

// The share of their compute that n ranks sharing a CPU lose meeting in collectives: they arrive
// apart (taking turns on the cores), and the first ones wait for the last. Every compute row is
// followed, sooner or later, by a meeting (a collective, a pipeline's message, the next step's),
// and what ranks arriving apart wait is a share of what was computed since the last one, so the
// loss is a fraction of the compute, not a constant a call (a tp layout meets dozens of times a
// step, each after a fraction of a millisecond). Calibrate measured it at n = 2, 4, 8
// (cpu_meeting_fraction_N_ranks); 0 at one rank, straight between the measured counts, flat past
// the last. A count below the last whose field is absent measured no wait (calibrate leaves a 0
// out of the profile): 0 there, not the end of the measurements. 0 on a GPU, or where the profile
// has none measured
static inline double time_meeting_fraction(const DeviceProfile* p, double n) {
    if (p->kind != DEVICE_CPU || n <= 1.0) return 0.0;
    double at[4] = {1.0, 2.0, 4.0, 8.0};
    double w[4] = {0.0, p->cpu_meeting_fraction_2_ranks, p->cpu_meeting_fraction_4_ranks, p->cpu_meeting_fraction_8_ranks};
    int last = 0;  // (the largest count measured with a wait)
    for (int i = 1; i < 4; i++) {
        if (w[i] > 0.0) last = i;
    }
    for (int i = 0; i < last; i++) {
        if (n <= at[i + 1]) return w[i] + (w[i + 1] - w[i]) * (n - at[i]) / (at[i + 1] - at[i]);
    }
    return w[last];
}

// the slowdowns of a step's work while n ranks compute at once: GEMMs and attention, the
// memory-bound passes beyond the cache and within it (a pass within it: its bytes at most
// cache_bytes, the cache's share of each of the n ranks; 0 where the profile has no cache), each
// also by the share lost meeting (time_meeting_fraction; on a GPU 1, 1, 1 and 0)
typedef struct {
    double compute, memory, memory_cached, cache_bytes;
} TimeShare;

static inline TimeShare time_share_at(const DeviceProfile* p, double n) {
    double meeting = 1.0 + time_meeting_fraction(p, n);
    TimeShare s = {time_cpu_share_slowdown(p, n, 0) * meeting, time_cpu_share_slowdown(p, n, 1) * meeting,
                   time_cpu_share_slowdown(p, n, 2) * meeting, 0.0};
    if (p->kind == DEVICE_CPU && p->cpu_cache_bytes > 0.0) s.cache_bytes = p->cpu_cache_bytes / (n > 1.0 ? n : 1.0);
    return s;
}

// a lone rank's: nothing shared
static inline TimeShare time_share_lone(void) {
    TimeShare s = {1.0, 1.0, 1.0, 0.0};
    return s;
}

// The ranks computing at once, in lone ranks' worth, when `busy` of the `world` ranks compute on
// average and the rest wait in MPI: a waiting rank takes cpu_wait_slowdown - 1 of a core (not
// measured: a whole one, as a computing rank does)
static inline double time_ranks_at_once(const DeviceProfile* p, double busy, int world) {
    double waiting_share = p->cpu_wait_slowdown >= 1.0 ? p->cpu_wait_slowdown - 1.0 : 1.0;
    return busy + waiting_share * (world - busy);
}

// 1. A kernel's seconds for one call, by its own FLOPs and bytes (attention's rows are then
// priced together: time_attention_block). X: the floats' bytes (the GEMMs'
// peak). share: the slowdowns of ranks sharing a CPU (5; 1 and 1 on a GPU). -offload's host rows
// on the host's FLOP/s and memory bandwidth, as they are (a CPU: its optimizer's passes' bandwidth)
// A CPU's GEMM whose bytes exceed its cache (a language model head: few tokens against a wide
// weight) takes efficiency_matmul_beyond_cache where the profile has it; a row whose bytes fit in
// a rank's share of the cache takes the in-cache fraction for its bytes (TimeShare).
static inline double time_kernel_seconds(const DeviceProfile* p, const StepKernel* r, double flops, int X,
                                         TimeShare share) {
    double bandwidth = p->memory_bandwidth_bytes_per_s * p->efficiency_memory, rate = 0.0;
    int beyond_cache = p->kind == DEVICE_CPU && p->efficiency_matmul_beyond_cache > 0.0 && r->bytes > p->cpu_cache_bytes;
    double memory_share = share.cache_bytes > 0.0 && r->bytes <= share.cache_bytes ? share.memory_cached : share.memory;
    switch (r->engine) {
        case STEP_GEMM:
            rate = device_profile_peak_flops(p, X) *
                   (beyond_cache ? p->efficiency_matmul_beyond_cache : device_profile_matmul_efficiency(p, flops));
            break;
        case STEP_ATTN: rate = device_profile_peak_flops(p, X) * p->efficiency_attention; break;
        case STEP_HOST: rate = p->host_flops_fp32, bandwidth = p->host_memory_bandwidth_bytes_per_s; break;
        default: rate = 0.0;  // vector and memset rows: their bytes
    }
    // (the optimizer's passes stream the parameters in place: their own efficiency where measured)
    if (r->engine == STEP_VECTOR && strcmp(r->op, "optimizer") == 0) {
        bandwidth = p->memory_bandwidth_bytes_per_s * device_profile_optimizer_efficiency(p);
    }
    double by_flops = rate > 0.0 ? flops / rate * share.compute : 0.0, by_bytes = r->bytes / bandwidth * memory_share;
    // a CPU core that runs a GEMM's FMAs also packs its operands and streams its result: the two
    // add (calibrate's peak is the rate left once the bytes' time is taken out); a GPU's memory
    // system moves bytes beside its cores: the larger of the two
    if (p->kind == DEVICE_CPU) return by_flops + by_bytes;
    return by_flops > by_bytes ? by_flops : by_bytes;
}

// which part a compute row's time is reported under: every row of attention's (its kernels, and
// on the unfused path the softmax, the dropout and the layout changes around its GEMMs)
static inline TimeComputeKind time_kind_of(const StepKernel* r) {
    if (r->engine == STEP_HOST) return TIME_HOST;
    if (strcmp(r->op, "attention") == 0 && r->engine != STEP_LINK && r->engine != STEP_MEMSET) return TIME_ATTENTION;
    return r->engine == STEP_GEMM ? TIME_GEMM : TIME_MEMORY;
}

// Attention's useful FLOPs in one phase, the profile's measure (device_profile.h): q k^T and p v
// over the causal pairs, 2 T (T + 1) hs a head and sequence forward, twice that backward (F: the
// forward; B: the backward, with a recomputed forward where the layout reruns attention first)
static inline double time_attention_useful_flops(GPT2Config c, const StepLayout* o, StepPhase phase) {
    if (phase != STEP_PHASE_FORWARD && phase != STEP_PHASE_BACKWARD_INPUT) return 0.0;
    int tp = o->tp > 1 ? o->tp : 1, cp = o->cp > 1 ? o->cp : 1, pp = o->pp > 1 ? o->pp : 1;
    int m = o->micro_batches > 1 ? o->micro_batches : 1;
    double hs = (double)c.channels / c.num_heads, heads = (double)c.num_heads / tp;
    double forward = 2.0 * o->T * (o->T + 1.0) * hs * heads * o->B / cp * (c.num_layers / pp) * m;  // (zigzag: 1/cp each)
    int rerun = o->recompute == 2 || (o->recompute == 1 && !o->flash);  // (-r 1 keeps flash's outputs)
    return phase == STEP_PHASE_FORWARD ? forward : (2.0 + rerun) * forward;
}

// 1b. Fused attention, priced as the profile defines its efficiency: a phase's useful FLOPs over
// peak x efficiency_attention, whatever its kernels execute beyond them (flash's whole diagonal
// tiles and second pass for dq; on the CPU, llmc/cpu/attention.h's loops, which calibrate times
// whole). The phase's time is shared among its attention rows in proportion to each one's own
// roofline time, so that each action and part gets its share. The unfused GPU path (-attention
// cublas: batched GEMMs over full T x T squares, a softmax and its passes over the scores) is not
// one kernel of one efficiency: its rows keep their own prices, GEMMs on the FLOPs they execute,
// passes on their bytes (an H200 measured it at 2x flash's step time, which one efficiency for
// both could not say). compute: the ranks-sharing-a-CPU slowdown
static inline void time_attention_block(const DeviceProfile* p, GPT2Config c, const StepLayout* o,
                                        const StepKernel* rows, double* seconds, int n, double compute) {
    if (p->kind != DEVICE_CPU && !o->flash) return;  // (the unfused path: its parts)
    StepPhase phases[2] = {STEP_PHASE_FORWARD, STEP_PHASE_BACKWARD_INPUT};
    for (int k = 0; k < 2; k++) {
        double own = 0.0;
        for (int i = 0; i < n; i++) {
            if (rows[i].phase == phases[k] && time_kind_of(&rows[i]) == TIME_ATTENTION) own += seconds[i];
        }
        if (own <= 0.0) continue;
        double block = time_attention_useful_flops(c, o, phases[k]) /
                       (device_profile_peak_flops(p, o->X) * p->efficiency_attention) * compute;
        for (int i = 0; i < n; i++) {
            if (rows[i].phase == phases[k] && time_kind_of(&rows[i]) == TIME_ATTENTION) seconds[i] *= block / own;
        }
    }
}

// 2. A collective's group as comm_time.h places it: the members of rank r's group on the grid,
// as many as the row says its group has (a pipeline message: the pair of stages it crosses;
// DiLoCo's across: one rank of each worker, the workers being consecutive blocks of ranks)
static inline RankPattern time_members(const StepKernel* row, GridShape g, int r) {
    int world = grid_world(g);
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
    return members;
}

// the ranks that share rank 0's host: gpus_per_node of them, or the world when it is smaller
static inline int time_host_ranks(GridShape g, int gpus_per_node) {
    int world = grid_world(g);
    return world < gpus_per_node ? world : gpus_per_node;
}

static inline GroupPlacement time_placement(const StepKernel* row, GridShape g, int r, int gpus_per_node) {
    int S = g.dp * g.cp * g.tp, world = grid_world(g);
    if (strcmp(row->comm, "pp") == 0) return pair_placement(r, r + S < world ? r + S : r - S, gpus_per_node);
    return group_placement(time_members(row, g, r), gpus_per_node);
}

// A CPU's collective over a group of 2 or 4 of the `host` ranks sharing it, where the profile
// measured such groups among as many ranks (cpu_groups_world): its first 2 MB as the ring step
// prices them (t, from coll_time at 2 MB), the bytes past them at the bandwidth measured for groups
// placed as this one is. The ranks are pinned round robin (rank r on core r mod cpu_groups_cores,
// as dev/bench/sweep.sh runs them; the model cannot check that the run it predicts is), so a group
// whose ranks all fall on one core takes turns there (calibrate's groups K apart), one on as many
// cores as it has ranks (or the host has cores) waits for its ranks on the others (its consecutive
// ones); a group half-shared (4 ranks on 2 of 4 cores) was measured neither way. 0, t unchanged:
// not measured so.
static inline int time_group_measured(const DeviceProfile* p, Collective kind, RankPattern members, int host,
                                      int gpus_per_node, double n, CollTime* t) {
    double knee = DEVICE_PROFILE_COLLECTIVE_KNEE_BYTES;
    int G = members.size;
    GroupPlacement g = group_placement(members, gpus_per_node);
    if (p->kind != DEVICE_CPU || p->cpu_groups_world != host || p->cpu_groups_cores <= 0 || (G != 2 && G != 4) ||
        G >= host || g.nodes > 1 || n <= knee)
        return 0;
    int K = p->cpu_groups_cores, cores = 0, seen[4] = {-1, -1, -1, -1};  // (the group's distinct cores)
    for (int i = 0; i < G; i++) {
        int core = rank_pattern_member(members, i) % K, j = 0;
        while (j < cores && seen[j] != core) j++;
        if (j == cores) seen[cores++] = core;
    }
    int one_core = cores == 1;
    if (!one_core && cores != (G < K ? G : K)) return 0;
    const double measured[3][2][2] = {  // [kind][G = 2, 4][across cores, on one core]
        {{p->allreduce_groups_of_2_across_cores_bytes_per_s, p->allreduce_groups_of_2_on_one_core_bytes_per_s},
         {p->allreduce_groups_of_4_across_cores_bytes_per_s, p->allreduce_groups_of_4_on_one_core_bytes_per_s}},
        {{p->reducescatter_groups_of_2_across_cores_bytes_per_s, p->reducescatter_groups_of_2_on_one_core_bytes_per_s},
         {p->reducescatter_groups_of_4_across_cores_bytes_per_s, p->reducescatter_groups_of_4_on_one_core_bytes_per_s}},
        {{p->allgather_groups_of_2_across_cores_bytes_per_s, p->allgather_groups_of_2_on_one_core_bytes_per_s},
         {p->allgather_groups_of_4_across_cores_bytes_per_s, p->allgather_groups_of_4_on_one_core_bytes_per_s}}};
    int k = kind == COLL_ALL_REDUCE ? 0 : kind == COLL_REDUCE_SCATTER ? 1 : kind == COLL_ALL_GATHER ? 2 : -1;
    if (k < 0) return 0;
    double beyond = measured[k][G == 4][one_core];
    if (!(beyond > 0.0)) return 0;
    *t = coll_time(p, kind, g, knee);
    t->seconds += (n - knee) / beyond;
    t->intra_seconds = t->seconds, t->inter_seconds = 0.0;
    return 1;
}

// a link row's seconds a call, and the fraction of them spent on each link (time_link_names)
typedef struct {
    double seconds, on[TIME_LINKS];
} LinkSeconds;

// a link row's seconds a call: its payload through the collective it names, over its group (its
// steps inside a node and across, as comm_time.h splits them); -offload's "pcie" copies over the
// host's link (a CPU's: a copy in memory, as slow as its memory-bound passes are with the ranks
// computing at once: share)
static inline LinkSeconds time_link_split(const DeviceProfile* p, const StepKernel* r, GridShape g, int rank,
                                          int gpus_per_node, TimeShare share) {
    LinkSeconds l = {0.0, {0.0, 0.0, 0.0}};
    if (strcmp(r->comm, "pcie") == 0) {
        l.seconds = p->pcie_latency_s + r->payload / (p->pcie_bandwidth_bytes_per_s * p->efficiency_link) * share.memory;
        l.on[2] = 1.0;
        return l;
    }
    Collective kind = collective_of_name(r->collective);
    double n = r->payload;
    // (an all-to-all row's payload is what leaves for the other ranks, as the trainers count it;
    // comm_time.h's n is the whole send buffer, the rank's own block included)
    if (kind == COLL_ALL_TO_ALL && r->ranks > 1) n *= (double)r->ranks / (r->ranks - 1);
    CollTime t = coll_time(p, kind, time_placement(r, g, rank, gpus_per_node), n);
    if (strcmp(r->comm, "pp") != 0) {
        time_group_measured(p, kind, time_members(r, g, rank), time_host_ranks(g, gpus_per_node), gpus_per_node, n, &t);
    }
    l.seconds = t.seconds;
    if (t.seconds > 0.0) l.on[0] = t.intra_seconds / t.seconds, l.on[1] = t.inter_seconds / t.seconds;
    return l;
}

static inline double time_link_seconds(const DeviceProfile* p, const StepKernel* r, GridShape g, int rank,
                                       int gpus_per_node, TimeShare share) {
    return time_link_split(p, r, g, rank, gpus_per_node, share).seconds;
}

// One ring collective's step when `world` ranks share a CPU's host, from what calibrate measured
// over N = 2, 4, 8 of them (alpha[i] + n / beta[i] for n bytes in all; beta 0: not measured;
// beyond[i] the bandwidth past the first 2 MB, 0: beta's). A ring over N ranks is passes x (N - 1)
// steps of n / N bytes (an all-reduce 2 passes, a reduce-scatter or an all-gather 1), so a step
// takes
//   alpha_N / (passes (N - 1)) + (n / N) x N / (beta_N passes (N - 1));
// step->alpha its seconds, step->byte and step->byte_beyond its seconds a byte (before and past
// the knee), straight between the measured counts, flat past the last. 0 when the 2-rank one was
// not measured.
typedef struct {
    double alpha, byte, byte_beyond;
} SharedRingStep;

static inline int time_shared_ring_step(const double* alpha, const double* beta, const double* beyond, int passes,
                                        int world, SharedRingStep* step) {
    if (beta[0] <= 0.0) return 0;
    double at[3] = {2.0, 4.0, 8.0};
    SharedRingStep measured[3];
    int last = 0;
    for (int i = 0; i < 3; i++) {
        if (beta[i] <= 0.0) break;
        double steps = passes * (at[i] - 1.0);
        measured[i].alpha = alpha[i] / steps;
        measured[i].byte = at[i] / (beta[i] * steps);
        measured[i].byte_beyond = at[i] / ((beyond[i] > 0.0 ? beyond[i] : beta[i]) * steps);
        last = i;
    }
    *step = measured[last];
    for (int i = 0; i < last; i++) {
        if (world <= at[i + 1]) {
            double x = (world - at[i]) / (at[i + 1] - at[i]);
            step->alpha = measured[i].alpha + x * (measured[i + 1].alpha - measured[i].alpha);
            step->byte = measured[i].byte + x * (measured[i + 1].byte - measured[i].byte);
            step->byte_beyond = measured[i].byte_beyond + x * (measured[i + 1].byte_beyond - measured[i].byte_beyond);
            break;
        }
    }
    return 1;
}

// One measured collective of a CPU profile (its 2-, 4- and 8-rank latency, bandwidth and bandwidth
// past the knee, pointed at in q, a copy of the profile) as `world` ranks sharing the host see
// it: its step at `world` (time_shared_ring_step, *step) written back as the 2-rank figures
// comm_time.h reads (a ring over 2 ranks is passes steps of n / 2, so alpha = passes a and beta =
// 2 / (passes b), the same past the knee where one was measured). 0, q unchanged: not measured
static inline int time_share_collective(double* const latency[3], double* const bandwidth[3], double* const beyond[3],
                                        int passes, int world, SharedRingStep* step) {
    double alpha[3], beta[3], past[3];
    int any_beyond = 0;
    for (int i = 0; i < 3; i++) {
        alpha[i] = *latency[i], beta[i] = *bandwidth[i], past[i] = *beyond[i];
        any_beyond |= past[i] > 0.0;
    }
    if (!time_shared_ring_step(alpha, beta, past, passes, world, step)) return 0;
    *latency[0] = passes * step->alpha, *bandwidth[0] = 2.0 / (passes * step->byte);
    if (any_beyond) *beyond[0] = 2.0 / (passes * step->byte_beyond);
    return 1;
}

// The links of a CPU's ranks when `world` of them share the host: every all-reduce, reduce-scatter
// and all-gather as the same collective measured over that many ranks (time_share_collective);
// every message's link scaled by as much as the all-reduce's step changed from 2 ranks' (alpha / 2
// and 1 / beta: 2 steps of n / 2) to these. Unchanged on a GPU, at 2 ranks or fewer, or where the
// profile has no such collective measured.
static inline DeviceProfile time_links_shared(const DeviceProfile* p, int world) {
    DeviceProfile q = *p;
    if (p->kind != DEVICE_CPU || world <= 2) return q;
    SharedRingStep at;
    double* const ar_latency[3] = {&q.intra_node_allreduce_latency_s, &q.allreduce_4_ranks_latency_s,
                                   &q.allreduce_8_ranks_latency_s};
    double* const ar_bandwidth[3] = {&q.intra_node_allreduce_bandwidth_bytes_per_s,
                                     &q.allreduce_4_ranks_bandwidth_bytes_per_s, &q.allreduce_8_ranks_bandwidth_bytes_per_s};
    double* const ar_beyond[3] = {&q.intra_node_allreduce_bandwidth_beyond_2mb_bytes_per_s,
                                  &q.allreduce_4_ranks_bandwidth_beyond_2mb_bytes_per_s,
                                  &q.allreduce_8_ranks_bandwidth_beyond_2mb_bytes_per_s};
    if (time_share_collective(ar_latency, ar_bandwidth, ar_beyond, 2, world, &at)) {
        double latency_ratio = at.alpha / (p->intra_node_allreduce_latency_s / 2.0);
        double byte_ratio = at.byte * p->intra_node_allreduce_bandwidth_bytes_per_s;
        q.intra_node_latency_s *= latency_ratio, q.inter_node_latency_s *= latency_ratio;
        q.intra_node_bandwidth_bytes_per_s /= byte_ratio, q.inter_node_bandwidth_bytes_per_s /= byte_ratio;
    }
    double* const rs_latency[3] = {&q.reducescatter_2_ranks_latency_s, &q.reducescatter_4_ranks_latency_s,
                                   &q.reducescatter_8_ranks_latency_s};
    double* const rs_bandwidth[3] = {&q.reducescatter_2_ranks_bandwidth_bytes_per_s,
                                     &q.reducescatter_4_ranks_bandwidth_bytes_per_s,
                                     &q.reducescatter_8_ranks_bandwidth_bytes_per_s};
    double* const rs_beyond[3] = {&q.reducescatter_2_ranks_bandwidth_beyond_2mb_bytes_per_s,
                                  &q.reducescatter_4_ranks_bandwidth_beyond_2mb_bytes_per_s,
                                  &q.reducescatter_8_ranks_bandwidth_beyond_2mb_bytes_per_s};
    time_share_collective(rs_latency, rs_bandwidth, rs_beyond, 1, world, &at);
    double* const ag_latency[3] = {&q.allgather_2_ranks_latency_s, &q.allgather_4_ranks_latency_s,
                                   &q.allgather_8_ranks_latency_s};
    double* const ag_bandwidth[3] = {&q.allgather_2_ranks_bandwidth_bytes_per_s,
                                     &q.allgather_4_ranks_bandwidth_bytes_per_s, &q.allgather_8_ranks_bandwidth_bytes_per_s};
    double* const ag_beyond[3] = {&q.allgather_2_ranks_bandwidth_beyond_2mb_bytes_per_s,
                                  &q.allgather_4_ranks_bandwidth_beyond_2mb_bytes_per_s,
                                  &q.allgather_8_ranks_bandwidth_beyond_2mb_bytes_per_s};
    time_share_collective(ag_latency, ag_bandwidth, ag_beyond, 1, world, &at);
    return q;
}

// the compute a link row may hide behind: the rows named by its hidden_by, a kernel or a group
// (m > 1: for a once-a-step collective, of the micro-batches' compute the last one's share)
static inline double time_hiding_seconds(const StepKernel* rows, const double* seconds, int n, const char* hidden_by,
                                         int m) {
    double total = 0.0;
    for (int i = 0; i < n; i++) {
        if (rows[i].engine == STEP_LINK) continue;
        if (strcmp(rows[i].kernel, hidden_by) == 0 || strcmp(rows[i].group, hidden_by) == 0 ||
            strcmp(rows[i].launch, hidden_by) == 0) {  // (a kernel, a group, or a kind of launch)
            total += rows[i].phase == STEP_PHASE_STEP ? seconds[i] : seconds[i] / m;
        }
    }
    return total;
}

// The link rows that hide behind the same compute share it: they run one after another on one
// communicator (NCCL's stream; the overlap threads' MPI), so what the pool's collectives outlast
// the compute is exposed, split among them by their times. A once-a-step collective (DDP's
// buckets after the last micro-batch's backward, ZeRO's reduce-scatters) hides behind one micro-
// batch's share of per-micro-batch compute: the trainers post it in the last micro-batch only.
// seconds[i] of each link row holds its total on entry and its exposed part on return
// (b in a's pool: a link row hiding behind the same compute, both once a step or both not)
static inline int time_same_pool(const StepKernel* a, const StepKernel* b) {
    return b->engine == STEP_LINK && strcmp(a->hidden_by, b->hidden_by) == 0 &&
           (a->phase == STEP_PHASE_STEP) == (b->phase == STEP_PHASE_STEP);
}

static inline void time_hide_pooled(const StepKernel* rows, double* seconds, int n, int micro_batches) {
    for (int i = 0; i < n; i++) {
        if (rows[i].engine != STEP_LINK || !rows[i].hidden_by[0]) continue;
        int first = 1;  // (the pool is settled at its first row)
        for (int j = 0; j < i && first; j++) first = !time_same_pool(&rows[i], &rows[j]);
        if (!first) continue;
        double comm = 0.0;
        for (int j = i; j < n; j++) {
            if (time_same_pool(&rows[i], &rows[j])) comm += seconds[j];
        }
        double hiding = time_hiding_seconds(rows, seconds, n, rows[i].hidden_by,
                                            rows[i].phase == STEP_PHASE_STEP ? micro_batches : 1);
        double share = comm > 0.0 ? comm_exposed(comm, hiding) / comm : 1.0;
        for (int j = i; j < n; j++) {
            if (time_same_pool(&rows[i], &rows[j])) seconds[j] *= share;
        }
    }
}

// 3. One stage: its rows priced, each action's duration (seconds[op]: one chunk's F, B and W of
// one micro-batch, the stage's V chunks averaged), the message's send time, and its once-a-step
// part. The parts of the step are filled for stage 0. during: the ranks sharing a CPU while the
// schedule runs (5), once: while every rank does its once-a-step work.
// A pipeline message on a GPU is the copy engines' or NCCL's, beside the compute: the play counts
// it where the receiver waits for it (send). On a CPU nothing hides it: MPI copies it on the
// sending rank's core while the exchange after the action that made it waits (llmc/pipeline_walk.h
// posts the sends and receives together and waits for all), so its time is part of that action
// (sent, within action) and the receiver has it when that action ends (send 0)
typedef struct {
    double action[3];  // F, B, W of one chunk and micro-batch
    double sent[3];    // of action[], the pipeline messages it sends (a CPU's; 0 on a GPU)
    double a2a[3];     // of action[], the MoE all-to-alls of rows it waits for (ep > 1)
    double send;       // one pipeline message, as long as the receiver may wait for it (0 on a CPU)
    double sends;      // the stage's pipeline messages a step, each whole ...
    double sends_on[TIME_LINKS];  // ... and their seconds on each link
    double once;       // after the schedule: the reductions, the norm, AdamW
} StageTime;

static inline StageTime time_stage(const DeviceProfile* p, GPT2Config c, const StepLayout* o, GridShape g, int rank,
                                   int gpus_per_node, TimeShare during, TimeShare once, StepTime* parts) {
    StepKernel rows[STEP_KERNELS_MAX];
    double seconds[STEP_KERNELS_MAX];
    int n = step_kernels(rows, STEP_KERNELS_MAX, c, *o);
    // (STEP_KERNELS_MAX holds the largest step's rows: one past it is a bug, not a smaller step)
    if (n > STEP_KERNELS_MAX) fail("llmc/step_time.h: the step has %d kernel rows, more than STEP_KERNELS_MAX = %d", n,
                                   STEP_KERNELS_MAX);
    StageTime st;
    memset(&st, 0, sizeof(st));
    double on[STEP_KERNELS_MAX][TIME_LINKS];  // (a link row's seconds on each link, as fractions)
    for (int i = 0; i < n; i++) {  // the compute rows first: the links may hide behind them
        const StepKernel* r = &rows[i];
        seconds[i] = 0.0;
        if (r->engine == STEP_LINK) continue;
        seconds[i] = time_kernel_seconds(p, r, r->flops, o->X, r->phase == STEP_PHASE_STEP ? once : during) * r->calls;
    }
    time_attention_block(p, c, o, rows, seconds, n, during.compute);
    for (int i = 0; i < n; i++) {
        if (parts && rows[i].engine != STEP_LINK) parts->compute[time_kind_of(&rows[i])] += seconds[i];
    }
    int m = o->micro_batches > 1 ? o->micro_batches : 1, V = o->V > 1 ? o->V : 1;
    int cpu = p->kind == DEVICE_CPU;
    for (int i = 0; i < n; i++) {
        const StepKernel* r = &rows[i];
        if (r->engine != STEP_LINK) continue;
        TimeShare share = r->phase == STEP_PHASE_STEP ? once : during;
        LinkSeconds l = time_link_split(p, r, g, rank, gpus_per_node, share);
        for (int c = 0; c < TIME_LINKS; c++) on[i][c] = l.on[c];
        if (strcmp(r->comm, "pp") == 0) {  // (a message: the pipeline's, time_play counts what it exposes)
            st.sends += l.seconds * r->calls;
            for (int c = 0; c < TIME_LINKS; c++) st.sends_on[c] += l.seconds * r->calls * l.on[c];
            if (!cpu) {
                st.send = l.seconds > st.send ? l.seconds : st.send;
                continue;
            }
        }
        // (on a CPU nothing hides: MPI moves a rank's bytes and sums them on that rank's own core,
        // inside its MPI calls, so the trainers' overlap interleaves the two rather than running
        // them at once; on a GPU the copy engines and NCCL's kernels run beside the compute)
        seconds[i] = l.seconds * r->calls;
        int k = time_group_index(r->comm);
        if (parts && k >= 0 && strcmp(r->comm, "pp") != 0) parts->comm_total[k] += seconds[i];
    }
    if (!cpu) time_hide_pooled(rows, seconds, n, m);
    for (int i = 0; i < n; i++) {
        int k = rows[i].engine == STEP_LINK && strcmp(rows[i].comm, "pp") != 0 ? time_group_index(rows[i].comm) : -1;
        if (parts && k >= 0) {
            parts->comm_exposed[k] += seconds[i];
            for (int c = 0; c < TIME_LINKS; c++) parts->comm_exposed_link[k][c] += seconds[i] * on[i][c];
        }
    }
    for (int i = 0; i < n; i++) {
        StepPhase ph = rows[i].phase;
        if (ph == STEP_PHASE_STEP) {
            st.once += seconds[i];
            continue;
        }
        int op = ph == STEP_PHASE_FORWARD ? PIPE_FORWARD : ph == STEP_PHASE_BACKWARD_INPUT ? PIPE_BACKWARD : PIPE_WEIGHT;
        st.action[op] += seconds[i] / ((double)m * V);
        if (rows[i].engine == STEP_LINK && strcmp(rows[i].comm, "pp") == 0) st.sent[op] += seconds[i] / ((double)m * V);
        if (rows[i].engine == STEP_LINK && strcmp(rows[i].comm, "ep") == 0) st.a2a[op] += seconds[i] / ((double)m * V);
    }
    return st;
}

// 4. The step of a layout: every stage priced at its dp, cp and tp rank 0 (the replicas and the
// ranks of one stage do the same work), the schedule played with their durations, then the
// slowest stage's once-a-step part. Without a schedule that splits the backward (zb, zbv,
// dualpipev: pipeline_splits_backward) a backward holds its weight half (B + W is the action);
// one stage is a pipeline of p = 1 (its micro-batches one after another).
// time_stages prices every stage at one TimeShare: each one's F, B, W of a chunk and micro-batch
// (seconds, p x 3) and the same without the messages it sends (silent: a CPU's sender copies
// them inside the action); stage 0's parts into t when given; what the sends take and the
// slowest once-a-step part returned
typedef struct {
    double send, sends, sends_on[TIME_LINKS], once;
} StagesTime;

// DualPipe's main overlap (DeepSeek-V3, arXiv:2412.19437, section 3.2.1; the grid trainer's
// -pp_overlap 1 with experts, llmc/pipeline_walk.h): in an F&B pair the forward and the backward
// (its input half B, the weight half when joined to it) of two micro-batches step in turn, each
// all-to-all of rows one posts moving while the other computes. So the forward's all-to-alls
// (a2a_F) hide behind the backward's compute (B - a2a_B) and the backward's behind the
// forward's, each as far as that compute lasts:
//   hidden = min(a2a_F, B - a2a_B) + min(a2a_B, F - a2a_F)
// seconds a pair saves. An upper bound: in the trainer each all-to-all moves under one step of
// the other pass (up to that pass's next all-to-all), not under all of its compute. The play
// also keeps the forward's output leaving at the forward's end, where the trainer's forward ends
// a step of the backward later. On a CPU nothing hides (time_stage): MPI moves the rows inside
// the rank's calls, on its own core.
static inline double time_pair_hidden(const StageTime* st, int split) {
    double forward = st->action[PIPE_FORWARD], backward = st->action[PIPE_BACKWARD] + (split ? 0.0 : st->action[PIPE_WEIGHT]);
    double under_backward = backward - st->a2a[PIPE_BACKWARD], under_forward = forward - st->a2a[PIPE_FORWARD];
    return fmin(st->a2a[PIPE_FORWARD], under_backward) + fmin(st->a2a[PIPE_BACKWARD], under_forward);
}

static inline StagesTime time_stages(const DeviceProfile* p, GPT2Config c, const RunLayout* r, StepOptions opt,
                                     int gpus_per_node, int split, TimeShare during, TimeShare once, double* seconds,
                                     double* silent, double* paired, StepTime* t) {
    GridShape g = {r->dp, r->pp, layout_cp(r), r->tp, layout_ep(r)};
    int S = g.dp * g.cp * g.tp, pp = r->pp > 1 ? r->pp : 1;
    StagesTime all;
    memset(&all, 0, sizeof(all));
    for (int s = 0; s < pp; s++) {
        StepLayout o = step_layout_of_run(r, s, opt);
        StageTime st = time_stage(p, c, &o, g, s * S, gpus_per_node, during, once, s == 0 ? t : NULL);
        seconds[s * 3 + PIPE_FORWARD] = st.action[PIPE_FORWARD];
        seconds[s * 3 + PIPE_BACKWARD] = st.action[PIPE_BACKWARD] + (split ? 0.0 : st.action[PIPE_WEIGHT]);
        seconds[s * 3 + PIPE_WEIGHT] = split ? st.action[PIPE_WEIGHT] : 0.0;
        silent[s * 3 + PIPE_FORWARD] = seconds[s * 3 + PIPE_FORWARD] - st.sent[PIPE_FORWARD];
        silent[s * 3 + PIPE_BACKWARD] = seconds[s * 3 + PIPE_BACKWARD] - st.sent[PIPE_BACKWARD];
        silent[s * 3 + PIPE_WEIGHT] = seconds[s * 3 + PIPE_WEIGHT];
        // (the F&B pairs' MoE overlap: the grid trainer's -pp_overlap with ep > 1, on a GPU)
        paired[s] = r->pp_overlap && layout_ep(r) > 1 && p->kind != DEVICE_CPU ? time_pair_hidden(&st, split) : 0.0;
        all.send = st.send > all.send ? st.send : all.send;
        all.sends += st.sends;
        for (int k = 0; k < TIME_LINKS; k++) all.sends_on[k] += st.sends_on[k];
        all.once = st.once > all.once ? st.once : all.once;
    }
    return all;
}

// the TimeShare of `stages` stages computing at once (not whole: an average), their ranks on one
// host of `host` ranks in `pp` stages, the rest waiting in MPI (time_ranks_at_once)
typedef struct {
    int host, pp;
} TimeHostStages;

static inline TimeShare time_share_of_stages(const DeviceProfile* p, double stages, const TimeHostStages* h) {
    return time_share_at(p, time_ranks_at_once(p, stages * h->host / h->pp, h->host));
}

// stage 0's actions of a step without the messages they send (m V of each op), at one TimeShare
static inline double time_stage0_busy(const DeviceProfile* p, GPT2Config c, const RunLayout* r, StepOptions opt,
                                      int gpus_per_node, PipeSpec spec, TimeShare during, TimeShare once) {
    GridShape g = {r->dp, r->pp, layout_cp(r), r->tp, layout_ep(r)};
    StepLayout o = step_layout_of_run(r, 0, opt);
    StageTime st = time_stage(p, c, &o, g, 0, gpus_per_node, during, once, NULL);
    return (double)spec.m * spec.V * (st.action[PIPE_FORWARD] + st.action[PIPE_BACKWARD] + st.action[PIPE_WEIGHT] -
                                      st.sent[PIPE_FORWARD] - st.sent[PIPE_BACKWARD]);
}

// The pipeline's messages are priced by playing the schedule twice: with them (the step's
// schedule) and with messages that take no time; what the first is longer is their exposed part
// (pp's), and stage 0's idle time in the second is the bubble, so that stage 0's parts add up to
// the schedule. On a GPU (host = NULL) every action takes its own time, at `during`
// (pipeline_play). On a CPU whose cores the ranks share, a stage idle in the bubble waits in MPI
// and leaves the cores to the stages that compute, so an action's time depends on how many
// stages compute at once: every stage is priced at each count k = 1..pp
// (time_share_of_stages), and the play goes from event to event (pipeline_play_shared). Stage
// 0's parts are then priced at the one count of stages at once that gives its actions the time
// they took in the play, so that its parts still add up to the schedule. Fills t's parts and
// returns the schedule's length.
static inline double time_play(const DeviceProfile* p, GPT2Config c, const RunLayout* r, StepOptions opt, int gpus_per_node,
                               TimeShare during, TimeShare once, const TimeHostStages* host, StepTime* t) {
    int pp = r->pp > 1 ? r->pp : 1, levels = host ? pp : 1;
    // (one stage plays as AFAB of one chunk: its micro-batches in turn, whatever -sched names, the
    // V's two chunks at pp = 1 included)
    PipeSpec spec = {pp > 1 ? r->sched : SCHEDULE_AFAB, pp, r->m > 1 ? r->m : 1, pp > 1 && r->V > 1 ? r->V : 1};
    int split = pipeline_splits_backward(spec), n = pipeline_actions_per_stage(spec);
    double* seconds = (double*)malloc_check((size_t)levels * pp * 6 * sizeof(double));
    double* silent = seconds + levels * pp * 3;  // (the same actions without the messages they send: a CPU's)
    double* paired = (double*)malloc_check((size_t)levels * pp * sizeof(double));  // (a pair's MoE overlap)
    StagesTime all;
    memset(t, 0, sizeof(*t));
    for (int k = 0; k < levels; k++) {  // (on a GPU, one level: stage 0's parts priced with it)
        TimeShare at = host ? time_share_of_stages(p, k + 1, host) : during;
        all = time_stages(p, c, r, opt, gpus_per_node, split, at, once, seconds + k * pp * 3, silent + k * pp * 3,
                          paired + k * pp, host ? NULL : t);
    }
    PipeAction* actions = (PipeAction*)malloc_check((size_t)pp * n * sizeof(PipeAction));
    double* start = (double*)malloc_check((size_t)pp * n * 2 * sizeof(double));
    double* end = start + pp * n;
    for (int s = 0; s < pp; s++) pipeline_stage_actions(spec, s, actions + (size_t)s * n);
    double schedule = host ? pipeline_play_shared(spec, actions, seconds, all.send, start, end)
                             : pipeline_play_paired(spec, actions, seconds, paired, all.send, start, end);
    double free_schedule = host ? pipeline_play_shared(spec, actions, silent, 0.0, start, end)
                           : all.sends > 0.0 ? pipeline_play_paired(spec, actions, silent, paired, 0.0, start, end)
                                             : schedule;
    // stage 0's busy time in the play without messages: what is left of that play is the bubble
    double stage0 = 0.0;
    for (int k = 0; k < n; k++) stage0 += end[k] - start[k];
    if (host) {
        // stage 0's parts priced at the one count of stages at once (between 1 and pp: each of its
        // actions ran at counts in between, and an action takes longer the more compute beside
        // it) whose prices add up to the time its actions took in the play, found by halving
        double fewer = 1.0, more = pp;
        for (int i = 0; i < 60; i++) {
            double count = 0.5 * (fewer + more);
            if (time_stage0_busy(p, c, r, opt, gpus_per_node, spec, time_share_of_stages(p, count, host), once) < stage0) {
                fewer = count;
            } else {
                more = count;
            }
        }
        all = time_stages(p, c, r, opt, gpus_per_node, split, time_share_of_stages(p, fewer, host), once, seconds, silent,
                          paired, t);
    }
    // stage 0's MoE all-to-alls that its F&B pairs hid are no longer exposed (its busy time in
    // the play already lacks them, so the parts still add up to the schedule)
    int ep_group = time_group_index("ep"), pairs = 0;
    for (int k = 0; k < n; k++) pairs += pipeline_fb_pair(actions, k, n);
    double exposed_ep = t->comm_exposed[ep_group], hidden = pairs * paired[0];
    for (int k = 0; k < TIME_LINKS && hidden > 0.0; k++) t->comm_exposed_link[ep_group][k] *= 1.0 - hidden / exposed_ep;
    t->comm_exposed[ep_group] -= hidden;
    t->schedule = schedule;
    t->once = all.once;
    t->bubble = free_schedule - stage0;
    int pp_group = time_group_index("pp");
    t->comm_total[pp_group] = all.sends;
    t->comm_exposed[pp_group] = schedule - free_schedule;
    for (int k = 0; k < TIME_LINKS && all.sends > 0.0; k++) {
        t->comm_exposed_link[pp_group][k] = t->comm_exposed[pp_group] * all.sends_on[k] / all.sends;
    }
    free(seconds);
    free(paired);
    free(actions);
    free(start);
    return schedule;
}

static inline StepTime step_time_predict(const DeviceProfile* p, GPT2Config c, const RunLayout* r, StepOptions opt,
                                         int gpus_per_node) {
    StepTime t;
    GridShape g = {r->dp, r->pp, layout_cp(r), r->tp, layout_ep(r)};
    int world = grid_world(g), pp = r->pp > 1 ? r->pp : 1, m = r->m > 1 ? r->m : 1;
    // 5. on a CPU: the links as the ranks of one host share it (gpus_per_node of them, or the
    // world when it is smaller: the ranks of other hosts take none of this one's cores); every
    // rank computing at once outside a pipeline and in the once-a-step part; inside one, as many
    // as the stages that compute at that moment (a GPU: 1 and 1 throughout, the links as given)
    int host = time_host_ranks(g, gpus_per_node);
    DeviceProfile links = time_links_shared(p, host);
    TimeShare all = time_share_at(p, host);
    TimeHostStages h = {host, pp};
    time_play(&links, c, r, opt, gpus_per_node, all, all, pp > 1 && p->kind == DEVICE_CPU ? &h : NULL, &t);
    t.seconds = t.schedule + t.once;
    double tokens = (double)r->dp * m * r->B * r->T;  // the global batch (cp and tp ranks share sequences)
    t.tokens_per_second = tokens / t.seconds;
    double peak = device_profile_peak_flops(p, opt.X) * world;
    t.mfu = gpt2_flops_per_token(c, r->T) * tokens / t.seconds / peak;
    return t;
}

#endif  // LLMC_STEP_TIME_H
