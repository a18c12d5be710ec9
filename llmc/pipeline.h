// Pipeline schedules as pure functions: which action each stage takes next. A pipeline of p
// stages runs m micro-batches per step; stage s holds a contiguous range of layers, or with
// interleaving V chunks of layers (chunk c of stage s is virtual stage c p + s). The trainer
// (train_gpt2_pp.cu) walks its stage's list of actions, receiving a micro-batch's activations from
// the virtual stage before its forward and its gradient from the virtual stage after its backward.
//   afab         all forward, all backward (GPipe, Huang et al. 2019, arXiv:1811.06965): every
//                stage keeps the activations of all m micro-batches until the backwards start
//   1f1b         one forward, one backward (PipeDream-Flush, Narayanan et al. 2021,
//                arXiv:2006.09503): stage s runs p - s - 1 warm-up forwards, then alternates,
//                so it holds at most p - s micro-batches
//   interleaved  1F1B over V chunks per stage (Narayanan et al. 2021, arXiv:2104.04473): the
//                pipe fills V times faster, so the bubble shrinks V-fold, for V times the sends
//   zb           ZB-H1 (Qi et al. 2023, arXiv:2401.10241): the backward split into B (the input
//                gradient, which the stage before waits for) and W (the weight gradient, which
//                nobody waits for); W's are held back to fill the bubble, a third of 1F1B's
//   zbv          ZB-V (Qi et al., arXiv:2401.10241 v2, and the V-shape building blocks of
//                arXiv:2405.15362): two chunks a stage in a V, B and W split; no idle time in a
//                stage's span at equal F, B, W, holding what 1F1B's first stage holds
//   dualpipev    DualPipeV (DeepSeek-V3, arXiv:2412.19437 section 3.2.1, and DeepSeek's DualPipe
//                repository's V variant): the same V, its steady state in F&B pairs, one
//                micro-batch's forward beside another's backward, so that one's communication can
//                hide under the other's compute (the overlap is the trainer's; here, their order)
// The V (zbv, dualpipev). Chunk 0 of stage s is virtual stage s, going down; chunk 1 is virtual
// stage 2p - 1 - s, coming back up. So stage 0 holds the first and the last virtual stage (it
// reads the tokens and computes the loss), and stage p - 1 hands chunk 0's output to its own chunk
// 1 without a message. Units: F, B (input gradient) and W (weight gradient) of a chunk 1 each, so
// a full backward is B + W = 2 and a stage works 6m units a step.
//   - zbv's order, stage r: 2(p - r) - 1 forwards of chunk 0 (micro-batch 0 goes down and comes
//     back to stage r at 2p - 1 - r, the time those take); r pairs F1 F0 while chunk 1's first
//     micro-batches come back up; p - r rounds F1 B1 W1 (chunk 1's backward starts first: it is
//     the nearer the loss); then rounds F0 B0 W0 F1 B1 W1, 6 units each, until every forward ran;
//     a cool-down of r pairs B0 B1, then B0 W0 while B's are left, then the W's. It holds 2p - 1
//     chunks after the warm-up and each round adds one (F) and frees one (W): at most 2p, p
//     micro-batches of a whole stage (a chunk is half of one), 1F1B's first stage's. It needs
//     m >= 2p - 1 (stage 0's warm-up). Stage r's first input arrives at r and it never waits
//     after: it ends at r + 6m (the test checks its span has no idle time: the ZB-V paper's zero
//     bubble at T_F = T_B = T_W, the repository's table). The step, all stages starting together,
//     lasts 6m + p - 1: the lower bound (stage p - 1 cannot start before p - 1), the p - 1 coming
//     from the staggered start alone, what the paper's parallelogram tiles away across steps.
//   - dualpipev's order, stage r, DualPipeV's eight steps: (1) 2(p - r - 1) forwards of chunk 0;
//     (2) r + 1 pairs F0 F1; (3) p - r - 1 rounds B1, its W, F1; (4) m - 2p + r + 1 rounds of two
//     F&B pairs, F0 & B1 then F1 & B0 (the bottom stage runs its first pair's two apart); (5)
//     p - r - 1 rounds B1, F1 & B0; (6) r + 1 pairs B1 B0, the W's deferred from the middle pair
//     on; (7) p - r - 1 rounds: a deferred W, then B0 deferring its own; (8) the W's left. In
//     steps 4-5 backwards are full (B with its W right after); steps 3, 6-8 split them to fill
//     the ramps (zero bubble). An F&B pair is a forward and a full backward joined (joins: one
//     exchange before the three; pipeline_play runs them one after the other, F & B = F + B = 3
//     units, no compute overlap). It needs m >= 2p (step 4 runs at least once on stage 0). Held:
//     steps 1-2 leave 2p chunks, each F&B pair's forward adds one before its backward frees one:
//     at most 2p + 1, DualPipe's PP + 1 with PP = 2p virtual stages. Time: 6m + p - 1, the same
//     lower bound, with every stage ending at the step's end, so stage r idles p - 1 - r in its
//     span: stage 0, which starts at once, the whole p - 1, in its cool-down (step 7: each B0
//     waits for its gradient to come up from stage 1; the W's deferred fill only part of it).
//     Playing the F&B pairs as one (their forward waiting for the backward's input too) moves
//     that idle time into step 5 but leaves its total p - 1. DualPipe's README puts
//     DualPipe's bubble at (PP/2 - 1)(F&B + B - 3W); on p stages of the V with these units
//     (F&B = 3, full B = 2, W = 1) that is 2(p - 1): the unit play's p - 1 is below it, and is
//     the lower bound, so the README's figure bounds this play rather than counts it.
//   - timed sends. Both V schedules send activations AND gradients each way between neighbours
//     (chunk 0's forward and chunk 1's backward go down, the others up), and a stage often sends
//     an output many groups before its neighbour runs the action that uses it (zbv's stage 0
//     runs 2p - 1 forwards while stage 1 runs fewer). A send posted right after its action then
//     waits, inside its exchange, for a receive posted much later, while the receiver waits for
//     something the sender sends only after that exchange: p = 2 deadlocks in exchange 3. So a V
//     stage posts each send at its last exchange that comes, on the unit-time timeline, no later
//     than the exchange where the receiver posts the receive (sends_later), and both sides post
//     each pair's messages in the same order (one channel, as NCCL matches them).
// Each schedule is checked (test/test_pipeline.c) by playing it out with unit-time actions and by
// playing out its sends and receives (pipeline_check_exchanges): it finishes, in the formula's time.
#ifndef LLMC_PIPELINE_H
#define LLMC_PIPELINE_H

#include <stdio.h>
#include <string.h>
#include "utils.h"

typedef enum { PIPE_FORWARD, PIPE_BACKWARD, PIPE_WEIGHT } PipeOp;
typedef enum {
    SCHEDULE_AFAB, SCHEDULE_1F1B, SCHEDULE_INTERLEAVED, SCHEDULE_ZB, SCHEDULE_ZBV, SCHEDULE_DUALPIPEV, SCHEDULE_COUNT
} PipeSchedule;

static const char* pipe_schedule_names[SCHEDULE_COUNT] = {"afab", "1f1b", "interleaved", "zb", "zbv", "dualpipev"};
static const char pipe_op_letters[3] = {'F', 'B', 'W'};

typedef struct {
    PipeOp op;
    int micro;  // the micro-batch, 0 .. m-1
    int chunk;  // which of the stage's V chunks of layers, 0 .. V-1 (0 without interleaving)
    int joins;  // 1: runs right after the action before, with no exchange of messages between
    int sends_later;  // its output is sent this many exchanges after the one right after it (the V)
} PipeAction;

typedef struct {
    PipeSchedule sched;
    int p;  // stages
    int m;  // micro-batches per step
    int V;  // chunks per stage: 1, or with interleaving the -vp value
} PipeSpec;

static inline PipeAction pipe_action(PipeOp op, int micro, int chunk) {
    PipeAction a;
    a.op = op;
    a.micro = micro;
    a.chunk = chunk;
    a.joins = 0;
    a.sends_later = 0;
    return a;
}

// any schedule's number by name; -1 when it names none
static inline int pipeline_schedule_from_name(const char* name) {
    for (int i = 0; i < SCHEDULE_COUNT; i++) {
        if (strcmp(name, pipe_schedule_names[i]) == 0) return i;
    }
    return -1;
}

// zbv and dualpipev place a stage's two chunks in a V (the header comment); zb, zbv and
// dualpipev split the backward into B and W
static inline int pipeline_is_v(PipeSpec s) { return s.sched == SCHEDULE_ZBV || s.sched == SCHEDULE_DUALPIPEV; }
static inline int pipeline_splits_backward(PipeSpec s) { return s.sched == SCHEDULE_ZB || pipeline_is_v(s); }

// the V schedules' rules (why each: the header comment)
static inline const char* pipeline_v_problem(PipeSpec s, char* why, size_t cap) {
    const char* name = pipe_schedule_names[s.sched];
    if (s.V != 2) {
        snprintf(why, cap, "-sched %s places exactly 2 chunks on each stage, in a V (V = %d)", name, s.V);
    } else if (s.sched == SCHEDULE_ZBV && s.m < 2 * s.p - 1) {
        snprintf(why, cap, "-sched zbv: stage 0's warm-up runs 2p - 1 = %d forwards of its first chunk, so the number "
                 "of micro-batches m = %d (-d / (B*T)) must be at least 2p - 1", 2 * s.p - 1, s.m);
    } else if (s.sched == SCHEDULE_DUALPIPEV && s.m < 2 * s.p) {
        snprintf(why, cap, "-sched dualpipev: stage 0 runs m - 2p + 1 rounds of F&B pairs (the steady state), at least "
                 "one, so the number of micro-batches m = %d (-d / (B*T)) must be at least 2p = %d", s.m, 2 * s.p);
    } else return NULL;
    return why;
}

// NULL when the schedule can run p stages, m micro-batches and V chunks; else why not (in why).
// A schedule is a list of 2 or 3 actions per micro-batch chunk and stage, so m V stays below 2^20
// (a step of more micro-batches than that is a -d typo, and its list would not fit an int)
#define PIPELINE_MAX_CHUNKS (1 << 20)
static inline const char* pipeline_spec_problem(PipeSpec s, char* why, size_t cap) {
    if ((long long)s.m * s.V > PIPELINE_MAX_CHUNKS || (long long)s.p * s.m * s.V > 8LL * PIPELINE_MAX_CHUNKS) {
        snprintf(why, cap, "%d micro-batches a step (-d / (B*T)) of %d chunks on %d stages: a pipeline schedules at most "
                 "%d micro-batch chunks a stage and %d in all; a smaller -d or a larger -b", s.m, s.V, s.p,
                 PIPELINE_MAX_CHUNKS, 8 * PIPELINE_MAX_CHUNKS);
        return why;
    }
    if (s.sched == SCHEDULE_INTERLEAVED) {
        if (s.V < 2) snprintf(why, cap, "-sched interleaved needs -vp 2 or more chunks per stage (-vp %d)", s.V);
        else if (s.p < 2) snprintf(why, cap, "-sched interleaved needs 2 or more stages (there is %d)", s.p);
        else if (s.m % s.p != 0) {
            snprintf(why, cap, "-sched interleaved runs the micro-batches in groups of p = %d, so their number m = %d "
                     "(-d / (B*T)) must be a multiple of %d", s.p, s.m, s.p);
        } else return NULL;
        return why;
    }
    if (pipeline_is_v(s)) return pipeline_v_problem(s, why, cap);
    if (s.V != 1) {
        snprintf(why, cap, "-vp %d: only -sched interleaved splits a stage into chunks (-sched %s)", s.V,
                 pipe_schedule_names[s.sched]);
        return why;
    }
    return NULL;
}

// each stage runs every micro-batch through every chunk once forward and once backward, and with
// zb once more for the weight gradients
static inline int pipeline_actions_per_stage(PipeSpec s) { return s.m * s.V * (pipeline_splits_backward(s) ? 3 : 2); }

static inline int pipeline_min(int a, int b) { return a < b ? a : b; }

// Megatron-LM's interleaved order: micro-batches go through in groups of p; a stage's k-th
// forward is micro-batch (k / pV) p + k % p of chunk (k / p) % V, its backwards the same with
// the chunks in reverse. Its warm-up: pipeline_stage_actions says why.
static inline PipeAction interleaved_action(PipeSpec s, int k, PipeOp op) {
    int group = k / (s.p * s.V), chunk = (k / s.p) % s.V;
    return pipe_action(op, group * s.p + k % s.p, op == PIPE_FORWARD ? chunk : s.V - 1 - chunk);
}

// the stage holding the last virtual stage (the LM head and the loss): the last stage, or in the V
// the first, which holds the first and the last virtual stage both (and so the one wte)
static inline int pipeline_head_stage(PipeSpec s) { return pipeline_is_v(s) ? 0 : s.p - 1; }

// the virtual stage that runs chunk c of stage s; and the stage, and its chunk, that run virtual
// stage v. Interleaved: chunk c of stage s is c p + s, going down the stages V times. The V: chunk
// 0 of stage s is s going down, chunk 1 is 2p - 1 - s coming back up.
static inline int pipeline_virtual_stage(PipeSpec s, int stage, int chunk) {
    return pipeline_is_v(s) && chunk == 1 ? 2 * s.p - 1 - stage : chunk * s.p + stage;
}
static inline int pipeline_stage_of(PipeSpec s, int v) { return pipeline_is_v(s) && v >= s.p ? 2 * s.p - 1 - v : v % s.p; }
static inline int pipeline_chunk_of(PipeSpec s, int v) { return v / s.p; }

// Who sends stage s's action its input, and who gets its output: a rank, or -1 for none (the
// first virtual stage's forward reads tokens, the last one's backward starts from its own loss,
// W's neither receive nor send, and at the V's bottom stage p - 1 hands chunk 0's output to its
// own chunk 1, and chunk 1's gradient to its chunk 0, without a message).
static inline int pipeline_other_rank(int stage, int rank) { return rank == stage ? -1 : rank; }
static inline int pipeline_input_from(PipeSpec s, int stage, PipeAction a) {
    int v = pipeline_virtual_stage(s, stage, a.chunk), last = s.p * s.V - 1;
    if (a.op == PIPE_FORWARD) return v == 0 ? -1 : pipeline_other_rank(stage, pipeline_stage_of(s, v - 1));
    if (a.op == PIPE_BACKWARD) return v == last ? -1 : pipeline_other_rank(stage, pipeline_stage_of(s, v + 1));
    return -1;
}
static inline int pipeline_output_to(PipeSpec s, int stage, PipeAction a) {
    int v = pipeline_virtual_stage(s, stage, a.chunk), last = s.p * s.V - 1;
    if (a.op == PIPE_FORWARD) return v == last ? -1 : pipeline_other_rank(stage, pipeline_stage_of(s, v + 1));
    if (a.op == PIPE_BACKWARD) return v == 0 ? -1 : pipeline_other_rank(stage, pipeline_stage_of(s, v - 1));
    return -1;
}
// 1 when action a's input is made by this stage itself, by its other chunk: at the V's bottom
// (stage p - 1) chunk 1's forward takes chunk 0's output, and chunk 0's backward chunk 1's input
// gradient, from the stage's own memory
static inline int pipeline_input_is_local(PipeSpec s, int stage, PipeAction a) {
    int v = pipeline_virtual_stage(s, stage, a.chunk), last = s.p * s.V - 1;
    if (a.op == PIPE_FORWARD) return v > 0 && pipeline_stage_of(s, v - 1) == stage;
    if (a.op == PIPE_BACKWARD) return v < last && pipeline_stage_of(s, v + 1) == stage;
    return 0;
}

// ZB-V, stage r of p (the header comment derives each count), F/B/W per chunk 0 and 1, each
// chunk's micro-batches in order
static inline int zbv_stage_actions(PipeSpec s, int r, PipeAction* out) {
    int p = s.p, m = s.m, n = 0, forwards[2] = {0, 0}, backwards[2] = {0, 0}, weights[2] = {0, 0};
#define ZBV_F(c) (out[n++] = pipe_action(PIPE_FORWARD, forwards[c]++, c))
#define ZBV_B(c) (out[n++] = pipe_action(PIPE_BACKWARD, backwards[c]++, c))
#define ZBV_W(c) (out[n++] = pipe_action(PIPE_WEIGHT, weights[c]++, c))
    for (int i = 0; i < 2 * (p - r) - 1; i++) ZBV_F(0);  // fill the way down
    for (int i = 0; i < r; i++) {  // chunk 1's first forwards come back up, one per chunk-0 forward
        ZBV_F(1);
        ZBV_F(0);
    }
    for (int i = 0; i < p - r; i++) {  // the first backwards start: chunk 1 as soon as it can
        ZBV_F(1);
        ZBV_B(1);
        ZBV_W(1);
    }
    while (forwards[1] < m) {  // steady state: F B W on each chunk, 6 units a round
        if (forwards[0] < m) ZBV_F(0);
        ZBV_B(0);
        ZBV_W(0);
        ZBV_F(1);
        ZBV_B(1);
        ZBV_W(1);
    }
    for (int i = 0; i < r; i++) {  // cool-down: the B's first, the W's fill the gaps after
        ZBV_B(0);
        ZBV_B(1);
    }
    while (backwards[0] < m) {
        ZBV_B(0);
        ZBV_W(0);
    }
    while (weights[1] < m) ZBV_W(1);
    while (weights[0] < m) ZBV_W(0);
#undef ZBV_F
#undef ZBV_B
#undef ZBV_W
    return n;
}

// DualPipeV, stage r of p: the eight steps of DeepSeek's DualPipeV (the header comment). A full
// backward is B with its W joined right after; an F&B pair is a forward with another micro-batch's
// full backward joined to it (one exchange before the three, pipeline_check_exchanges).
// Deferred W's (the zero-bubble steps) run later, oldest first.
static inline int dualpipev_stage_actions(PipeSpec s, int r, PipeAction* out) {
    int p = s.p, m = s.m, n = 0, forwards[2] = {0, 0}, backwards[2] = {0, 0};
    PipeAction* deferred = (PipeAction*)malloc_check((size_t)2 * m * sizeof(PipeAction));
    int deferred_head = 0, deferred_tail = 0;
#define DPV_F(c, join) (out[n] = pipe_action(PIPE_FORWARD, forwards[c]++, c), out[n++].joins = (join))
    // a backward: with W right after (full), or W deferred
#define DPV_B(c, join, defer) do {                                                        \
        PipeAction b_ = pipe_action(PIPE_BACKWARD, backwards[c]++, c);                   \
        b_.joins = (join);                                                               \
        out[n++] = b_;                                                                   \
        PipeAction w_ = pipe_action(PIPE_WEIGHT, b_.micro, c);                           \
        if (defer) deferred[deferred_tail++] = w_;                                       \
        else { w_.joins = 1; out[n++] = w_; }                                            \
    } while (0)
#define DPV_W() (out[n++] = deferred[deferred_head++])
    for (int i = 0; i < 2 * (p - r - 1); i++) DPV_F(0, 0);  // step 1: chunk 0 fills the way down
    for (int i = 0; i < r + 1; i++) {  // step 2: chunk 0 and chunk 1 forwards in turn
        DPV_F(0, 0);
        DPV_F(1, 0);
    }
    for (int i = 0; i < p - r - 1; i++) {  // step 3: B1, its W, F1 (zero bubble)
        DPV_B(1, 0, 1);
        DPV_W();
        DPV_F(1, 1);
    }
    for (int i = 0; i < m - 2 * p + r + 1; i++) {  // step 4: F0 & B1, then F1 & B0
        DPV_F(0, 0);
        // (the bottom stage's first pair runs apart, as in DualPipeV, which leaves it unoverlapped
        // to shorten the bubble; with no overlap, as in the unit play, the two orders time alike)
        DPV_B(1, !(i == 0 && r == p - 1), 0);
        DPV_F(1, 0);
        DPV_B(0, 1, 0);
    }
    for (int i = 0; i < p - r - 1; i++) {  // step 5: B1, then F1 & B0
        DPV_B(1, 0, 0);
        DPV_F(1, 0);
        DPV_B(0, 1, 0);
    }
    for (int i = 0; i < r + 1; i++) {  // step 6: B1, B0; from the middle on, W's deferred
        int half = (r + 1) / 2;
        DPV_B(1, 0, i > half || (i == half && r % 2 == 1));
        DPV_B(0, 0, i >= half);
    }
    for (int i = 0; i < p - r - 1; i++) {  // step 7: a deferred W, then B0 deferring its own
        DPV_W();
        DPV_B(0, 0, 1);
    }
    while (deferred_head < deferred_tail) DPV_W();  // step 8: the W's left
#undef DPV_F
#undef DPV_B
#undef DPV_W
    free(deferred);
    return n;
}

// (pipeline_play_lists: below)
static inline double pipeline_play_lists(PipeSpec s, const PipeAction* actions, const double* seconds,
                                         double send_seconds, double* start, double* end);

// Is a stage's action k (of its list of n) the forward of an F&B pair? A group that opens with a
// forward and joins to it a backward of another micro-batch or chunk: DualPipeV's F&B pairs and
// interleaved's steady state. (Interleaved's last stage joins a forward with its own micro-batch's
// backward, which needs the forward's loss: not a pair.) The grid trainer's -pp_overlap steps a
// pair's two passes in turn (pipeline_walk.h); the step-time model prices what that hides.
static inline int pipeline_fb_pair(const PipeAction* list, int k, int n) {
    return k + 1 < n && (k == 0 || !list[k].joins) && list[k].op == PIPE_FORWARD && list[k + 1].op == PIPE_BACKWARD &&
           list[k + 1].joins && (list[k].micro != list[k + 1].micro || list[k].chunk != list[k + 1].chunk);
}

// A V schedule's stage: its order (above) with each send timed (sends_later; the header comment
// says why). Every stage's list is played with unit times; a message is posted on the receiving
// stage at the exchange before the group that uses it, at time t, and on the sending stage at its
// last exchange at time t or before (never before the one right after the action that made it).
static inline int pipeline_v_stage_actions(PipeSpec s, int stage, PipeAction* out) {
    int p = s.p, n = pipeline_actions_per_stage(s), per_op = s.m * s.V;
    PipeAction* all = (PipeAction*)malloc_check((size_t)p * n * sizeof(PipeAction));
    double* start = (double*)malloc_check((size_t)p * n * sizeof(double));
    double* end = (double*)malloc_check((size_t)p * n * sizeof(double));
    double* exchange_time = (double*)malloc_check((size_t)(n + 1) * sizeof(double));
    int* group_first = (int*)malloc_check((size_t)p * n * sizeof(int));  // its group's first action
    int* where = (int*)malloc_check((size_t)p * 3 * per_op * sizeof(int));  // (stage, op, micro, chunk) -> index
    double* unit = (double*)malloc_check((size_t)p * 3 * sizeof(double));  // F, B, W: 1 unit each
    for (int i = 0; i < 3 * p; i++) unit[i] = 1.0;
    for (int st = 0; st < p; st++) {
        PipeAction* list = all + (size_t)st * n;
        if (s.sched == SCHEDULE_ZBV) zbv_stage_actions(s, st, list);
        else dualpipev_stage_actions(s, st, list);
        for (int k = 0; k < n; k++) {
            group_first[st * n + k] = k > 0 && list[k].joins ? group_first[st * n + k - 1] : st * n + k;
            where[((st * 3 + list[k].op) * s.m + list[k].micro) * s.V + list[k].chunk] = st * n + k;
        }
    }
    pipeline_play_lists(s, all, unit, 0.0, start, end);
    // this stage's exchange times: before each group, and after the last
    int groups = 0;
    for (int k = 0; k < n; k++) {
        if (k == 0 || !all[stage * n + k].joins) exchange_time[groups++] = start[stage * n + k];
    }
    exchange_time[groups] = end[stage * n + n - 1];
    for (int k = 0, group = -1; k < n; k++) {
        PipeAction* a = &all[stage * n + k];
        if (k == 0 || !a->joins) group++;
        int to = pipeline_output_to(s, stage, *a);
        if (to < 0) continue;
        int v = pipeline_virtual_stage(s, stage, a->chunk) + (a->op == PIPE_FORWARD ? 1 : -1);
        int user = where[((to * 3 + a->op) * s.m + a->micro) * s.V + pipeline_chunk_of(s, v)];
        double needed_at = start[group_first[user]];
        int e = group + 1;
        while (e < groups && exchange_time[e + 1] <= needed_at) e++;
        a->sends_later = e - (group + 1);
    }
    memcpy(out, all + (size_t)stage * n, (size_t)n * sizeof(PipeAction));
    free(all);
    free(start);
    free(end);
    free(exchange_time);
    free(group_first);
    free(where);
    free(unit);
    return n;
}

// Stage `stage`'s actions in the order it runs them (pipeline_actions_per_stage of them). Where
// the numbers come from:
//   - 1F1B's warm-up, p - s - 1 forwards. Stage s's first backward waits for micro-batch 0 to go
//     forward through the p - s - 1 stages after it and for its gradient to come back through
//     them. Counted in groups of actions (each with its exchange), that round trip is
//     2 (p - s - 1) groups, and in 1F1B's steady state every other group is a forward: p - s - 1
//     forwards, one for each later stage to work on meanwhile. From then on each forward admits
//     a micro-batch and each backward retires the oldest, so the stage holds at most p - s.
//   - interleaved's warm-up, 2 (p - s - 1) + (V - 1) p. A stage sends its forwards of a chunk in
//     groups of p micro-batches (interleaved_action), so before micro-batch 0 reaches the stage's
//     last chunk it has run the groups of its other V - 1 chunks: (V - 1) p forwards. From there
//     the round trip is again 2 (p - s - 1) groups, but now every group of the steady state holds
//     a forward AND a backward (they join, below), so every one of those groups is a forward.
//   - joins. In interleaved's steady state a forward and a backward run as one group, with one
//     exchange before them, as Megatron-LM runs them. With one exchange per action the stages
//     wait on each other in a cycle: pipeline_check_exchanges finds, for p = 2, m = 4, V = 2
//     unjoined, rank 0 waiting forever in exchange 6 of 16, for a message its neighbour posts only
//     after an exchange that waits for rank 0's next. Joined, the forward's and the backward's
//     inputs arrive in one exchange and their outputs leave in the next.
//   - zero bubble's W. A micro-batch keeps its slot from its F until its W (W reads the
//     activations), so the stage holds forwards - weights micro-batches. ZB-H1 caps that at p,
//     what 1F1B's first stage holds: W waits while the stage has room (the next B, which the stage
//     before waits for, comes sooner) and runs once the cap is reached; when no forward is left
//     (the cool-down, 1F1B's bubble) the W's run between the B's, filling the time the stage would
//     have waited for its next input gradient.
// test/test_pipeline.c plays every schedule out and checks its time and peak against these.
static inline int pipeline_stage_actions(PipeSpec s, int stage, PipeAction* out) {
    if (pipeline_is_v(s)) return pipeline_v_stage_actions(s, stage, out);
    int n = 0, total = s.m * s.V;
    int warmup = s.sched == SCHEDULE_AFAB          ? total
                 : s.sched == SCHEDULE_INTERLEAVED ? pipeline_min(total, 2 * (s.p - stage - 1) + (s.V - 1) * s.p)
                                                   : pipeline_min(total, s.p - stage - 1);
    int forwards = 0, backwards = 0, weights = 0;
    if (s.sched == SCHEDULE_INTERLEAVED) {
        for (; forwards < warmup; forwards++) out[n++] = interleaved_action(s, forwards, PIPE_FORWARD);
        while (forwards < total) {  // steady state: a forward and a backward between two exchanges
            out[n++] = interleaved_action(s, forwards++, PIPE_FORWARD);
            out[n] = interleaved_action(s, backwards++, PIPE_BACKWARD);
            out[n++].joins = 1;
        }
        while (backwards < total) out[n++] = interleaved_action(s, backwards++, PIPE_BACKWARD);
        return n;
    }
    for (; forwards < warmup; forwards++) out[n++] = pipe_action(PIPE_FORWARD, forwards, 0);
    while (backwards < s.m) {  // steady state: one forward, then the oldest backward
        if (forwards < s.m) out[n++] = pipe_action(PIPE_FORWARD, forwards++, 0);
        out[n++] = pipe_action(PIPE_BACKWARD, backwards++, 0);
        // zb: the weight gradient waits while the stage has room, so that the stage's next B (the
        // critical path) comes sooner. Room is p micro-batches, as stage 0 of 1F1B holds (ZB-H1:
        // every stage holds as many as the first); without forwards left, W's fill the gaps
        // between the B's of the cool-down.
        if (s.sched == SCHEDULE_ZB && (forwards - weights >= s.p || forwards == s.m)) {
            out[n++] = pipe_action(PIPE_WEIGHT, weights++, 0);
        }
    }
    while (s.sched == SCHEDULE_ZB && weights < s.m) out[n++] = pipe_action(PIPE_WEIGHT, weights++, 0);
    return n;
}

// Forward passes alone (validation, sampling): each micro-batch through every chunk in turn, the
// same list on every stage (m V actions)
static inline int pipeline_forward_actions(PipeSpec s, PipeAction* out) {
    int n = 0;
    for (int i = 0; i < s.m; i++) {
        for (int c = 0; c < s.V; c++) out[n++] = pipe_action(PIPE_FORWARD, i, c);
    }
    return n;
}

// ---------------------------------------------------------------------------------------------
// The schedule played out in time: each stage runs its list in order; an action starts once its
// stage is free and its input is there, a message from another stage arriving send_seconds after
// the action that made it ended. seconds (p, 3): how long stage s's forward, backward and weight
// gradient of one chunk take, at [s 3 + op] (unless split, as zb, zbv and dualpipev split it, the
// backward holds both gradients). start and end are (p, n): stage s's action k at [s n + k]
// (n = pipeline_actions_per_stage), as is `actions`, which this fills. Joined actions (an F&B
// pair) run one after the other, each once its own input is there. Returns the step's length: with measured or predicted times (the
// step-time model) the bubble is what the stages' busy time leaves of it. Stops the program if
// the schedule deadlocks (a wrong schedule, never a valid one).
static inline double pipeline_play(PipeSpec s, PipeAction* actions, const double* seconds, double send_seconds,
                                   double* start, double* end) {
    int n = pipeline_actions_per_stage(s);
    for (int st = 0; st < s.p; st++) pipeline_stage_actions(s, st, actions + (size_t)st * n);
    return pipeline_play_lists(s, actions, seconds, send_seconds, start, end);
}

// when the input of stage st's action a is ready: the end of the action that makes it (the
// virtual stage before's forward, the one after's backward, its own B for a W, its own forward
// for the last virtual stage's backward) and, from another stage, the message's send_seconds; -1
// while that action has not run. done: when each (stage, op, micro, chunk) ended, -1 if not yet
static inline double pipeline_input_ready(PipeSpec s, int st, PipeAction a, const double* done, double send_seconds) {
#define PIPE_DONE(stage, op, micro, chunk) done[(((stage) * 3 + (op)) * s.m + (micro)) * s.V + (chunk)]
    int v = pipeline_virtual_stage(s, st, a.chunk), from = st, last = s.p * s.V - 1;
    double ready;
    if (a.op == PIPE_FORWARD) {
        from = v == 0 ? st : pipeline_stage_of(s, v - 1);
        ready = v == 0 ? 0.0 : PIPE_DONE(from, PIPE_FORWARD, a.micro, pipeline_chunk_of(s, v - 1));
    } else if (a.op == PIPE_WEIGHT) {
        ready = PIPE_DONE(st, PIPE_BACKWARD, a.micro, a.chunk);
    } else if (v == last) {
        ready = PIPE_DONE(st, PIPE_FORWARD, a.micro, a.chunk);
    } else {
        from = pipeline_stage_of(s, v + 1);
        ready = PIPE_DONE(from, PIPE_BACKWARD, a.micro, pipeline_chunk_of(s, v + 1));
    }
#undef PIPE_DONE
    return ready >= 0.0 && from != st ? ready + send_seconds : ready;
}

static inline double* pipeline_done_slot(PipeSpec s, double* done, int st, PipeAction a) {
    return &done[((st * 3 + a.op) * s.m + a.micro) * s.V + a.chunk];
}

// ... the lists given (p of n actions each in `actions`). paired (p, or NULL): the seconds stage
// s's F&B pairs take off their backward (pipeline_fb_pair; the step-time model's MoE overlap)
static inline double pipeline_play_paired(PipeSpec s, const PipeAction* actions, const double* seconds,
                                          const double* paired, double send_seconds, double* start, double* end) {
    int n = pipeline_actions_per_stage(s), per_op = s.m * s.V;  // per op: each (micro, chunk)
    // when each (stage, op, micro, chunk) ended; -1: not yet
    double* done = (double*)malloc_check((size_t)s.p * 3 * per_op * sizeof(double));
    int* next = (int*)calloc_check((size_t)s.p, sizeof(int));
    double* free_at = (double*)calloc_check((size_t)s.p, sizeof(double));
    for (int i = 0; i < s.p * 3 * per_op; i++) done[i] = -1.0;
    int remaining = s.p * n;
    double length = 0.0;
    while (remaining > 0) {
        int progress = 0;
        for (int st = 0; st < s.p; st++) {
            if (next[st] == n) continue;
            PipeAction a = actions[st * n + next[st]];
            double ready = pipeline_input_ready(s, st, a, done, send_seconds);
            if (ready < 0.0) continue;
            int k = st * n + next[st];
            start[k] = ready > free_at[st] ? ready : free_at[st];
            end[k] = start[k] + seconds[st * 3 + a.op];
            if (paired && next[st] > 0 && pipeline_fb_pair(actions + (size_t)st * n, next[st] - 1, n)) end[k] -= paired[st];
            *pipeline_done_slot(s, done, st, a) = end[k];
            free_at[st] = end[k];
            length = end[k] > length ? end[k] : length;
            next[st]++;
            remaining--;
            progress = 1;
        }
        if (!progress) fail("pipeline schedule %s deadlocks at p=%d, m=%d, V=%d", pipe_schedule_names[s.sched], s.p, s.m, s.V);
    }
    free(done);
    free(next);
    free(free_at);
    return length;
}

static inline double pipeline_play_lists(PipeSpec s, const PipeAction* actions, const double* seconds,
                                         double send_seconds, double* start, double* end) {
    return pipeline_play_paired(s, actions, seconds, NULL, send_seconds, start, end);
}

// The play when the stages share one machine's cores (ranks on a CPU): an action's duration
// depends on how many stages compute while it runs. seconds_at[((k - 1) * p + st) * 3 + op] is
// stage st's action op when k stages compute at once (k = 1..p): a stage idle in the bubble
// leaves its share of the cores to the others, so the stage that runs alone runs fastest. The
// play goes from event to event (an action ends, an input arrives); between two events each
// running action gets through dt / seconds_at[k] of its work. With durations that do not depend
// on k it is pipeline_play_lists' play.
static inline double pipeline_play_shared(PipeSpec s, const PipeAction* actions, const double* seconds_at,
                                          double send_seconds, double* start, double* end) {
    int n = pipeline_actions_per_stage(s), per_op = s.m * s.V, p = s.p;
    double* done = (double*)malloc_check((size_t)p * 3 * per_op * sizeof(double));
    double* left = (double*)malloc_check((size_t)p * sizeof(double));  // the running action's work left, 1 at its start
    double* ready = (double*)malloc_check((size_t)p * sizeof(double)); // the next action's input; -1: not yet made
    int* next = (int*)calloc_check((size_t)p, sizeof(int));
    int* running = (int*)calloc_check((size_t)p, sizeof(int));
    for (int i = 0; i < p * 3 * per_op; i++) done[i] = -1.0;
    int remaining = p * n;
    double now = 0.0;
    while (remaining > 0) {
        // a free stage starts its next action once its input is there
        int busy = 0;
        for (int st = 0; st < p; st++) {
            ready[st] = -1.0;
            if (!running[st] && next[st] < n) {
                ready[st] = pipeline_input_ready(s, st, actions[st * n + next[st]], done, send_seconds);
                if (ready[st] >= 0.0 && ready[st] <= now) {
                    running[st] = 1, left[st] = 1.0, start[st * n + next[st]] = now;
                }
            }
            busy += running[st];
        }
        // the next event: the first running action to end at this count, or the first input to arrive
        double dt = -1.0;
        for (int st = 0; st < p; st++) {
            double until = -1.0;
            if (running[st]) until = left[st] * seconds_at[((busy - 1) * p + st) * 3 + actions[st * n + next[st]].op];
            else if (ready[st] > now) until = ready[st] - now;
            if (until >= 0.0 && (dt < 0.0 || until < dt)) dt = until;
        }
        if (dt < 0.0) fail("pipeline schedule %s deadlocks at p=%d, m=%d, V=%d", pipe_schedule_names[s.sched], p, s.m, s.V);
        now += dt;
        for (int st = 0; st < p; st++) {
            if (!running[st]) continue;
            int k = st * n + next[st];
            double d = seconds_at[((busy - 1) * p + st) * 3 + actions[k].op];
            // (ends now: its work left fits in dt, to rounding; an action of no time ends at once)
            if (left[st] * d <= dt * (1.0 + 1e-12)) {
                end[k] = now, running[st] = 0;
                *pipeline_done_slot(s, done, st, actions[k]) = now;
                next[st]++, remaining--;
            } else {
                left[st] -= dt / d;
            }
        }
    }
    free(done);
    free(left);
    free(ready);
    free(next);
    free(running);
    return now;
}

// The play in units: a chunk's forward takes 1 unit, its backward 2 (the gradients of the inputs
// and of the weights), or split (zb, zbv, dualpipev) B and W 1 each; messages take no time. start
// and end in units (whole numbers); returns the step's length in units.
static inline int pipe_units(PipeSpec s, PipeOp op) { return op == PIPE_BACKWARD && !pipeline_splits_backward(s) ? 2 : 1; }

static inline int pipeline_simulate(PipeSpec s, PipeAction* actions, int* start, int* end) {
    int n = pipeline_actions_per_stage(s);
    double* seconds = (double*)malloc_check((size_t)s.p * 3 * sizeof(double));
    double* t0 = (double*)malloc_check((size_t)s.p * n * sizeof(double));
    double* t1 = (double*)malloc_check((size_t)s.p * n * sizeof(double));
    for (int st = 0; st < s.p; st++) {
        for (int op = 0; op < 3; op++) seconds[st * 3 + op] = pipe_units(s, (PipeOp)op);
    }
    double length = pipeline_play(s, actions, seconds, 0.0, t0, t1);
    for (int i = 0; i < s.p * n; i++) {  // (sums of whole numbers: exact in a double)
        start[i] = (int)t0[i];
        end[i] = (int)t1[i];
    }
    free(seconds);
    free(t0);
    free(t1);
    return (int)length;
}

// The step's length in units by formula. Every stage is busy 3 m V units; the rest is the bubble:
//   afab, 1f1b    3 (p - 1): the first forward takes p - 1 units to reach the last stage, the
//                 last backward 2 (p - 1) to come back
//   interleaved   3 (p - 1) too, but in units of a chunk: V times smaller against the busy time
//   zb            p - 1 (for m >= p): only F and B travel; the W's fill what 1F1B leaves idle.
//                 With m < p the first B starts only after all p forwards of micro-batch 0 and
//                 reaches stage 0 after p more units: 2p + 2m - 1, that is p - m more
//   zbv, dualpipev 6m + p - 1: a stage works 6m units (2 chunks, F B W of m micro-batches);
//                 stage p - 1's first input arrives at p - 1 (micro-batch 0 down p - 1 chunks),
//                 so no step is shorter, and both schedules reach that bound (the header comment)
static inline int pipeline_length_formula(PipeSpec s) {
    if (pipeline_is_v(s)) return 6 * s.m + s.p - 1;
    if (s.sched == SCHEDULE_ZB) return 3 * s.m + s.p - 1 + (s.m < s.p ? s.p - s.m : 0);
    return 3 * (s.m * s.V + s.p - 1);
}

// the most (micro-batch, chunk) activations stage s holds at once: forwards done whose backward
// (with zb: whose W) is not
static inline int pipeline_peak_in_flight(PipeSpec s, const PipeAction* stage_actions, int count) {
    PipeOp frees = pipeline_splits_backward(s) ? PIPE_WEIGHT : PIPE_BACKWARD;
    int held = 0, peak = 0;
    for (int k = 0; k < count; k++) {
        held += stage_actions[k].op == PIPE_FORWARD ? 1 : stage_actions[k].op == frees ? -1 : 0;
        peak = held > peak ? held : peak;
    }
    return peak;
}

// The LM head's buffers (lnf, the logits and their gradient, the losses: model.h's ACTS_HEAD)
// belong to the last virtual stage alone. A micro-batch's F there writes them, its B reads the
// dlogits and lnf's statistics, and with a split backward its W reads the dlogits and lnf again
// (the wte copy's gradient, llmc/chunk.h): so it holds them to its B, or its W. It takes them
// with its slot: when its input is received, at the exchange before its F's group (the walk,
// llmc/pipeline_walk.h, receives a group's inputs before it computes any of its actions), else at
// the F. The most micro-batches stage s holds so at once; 0 on a stage without the head. (In a V
// the head sits on stage 0 beside chunk 0, whose slots never need it.)
static inline int pipeline_peak_heads(PipeSpec s, int stage, const PipeAction* stage_actions, int count) {
    if (stage != pipeline_head_stage(s)) return 0;
    int last_chunk = pipeline_chunk_of(s, s.p * s.V - 1);
    PipeOp frees = pipeline_splits_backward(s) ? PIPE_WEIGHT : PIPE_BACKWARD;
    int held = 0, peak = 0;
    for (int k = 0; k < count; k++) {
        PipeAction a = stage_actions[k];
        if (k == 0 || !a.joins) {  // a group's exchange: its forwards' received inputs take their heads
            for (int j = k; j < count && (j == k || stage_actions[j].joins); j++) {
                PipeAction f = stage_actions[j];
                held += f.op == PIPE_FORWARD && f.chunk == last_chunk && pipeline_input_from(s, stage, f) >= 0;
            }
            peak = held > peak ? held : peak;
        }
        if (a.chunk != last_chunk) continue;
        held += a.op == PIPE_FORWARD && pipeline_input_from(s, stage, a) < 0 ? 1 : a.op == frees ? -1 : 0;
        peak = held > peak ? held : peak;
    }
    return peak;
}

// The V schedules' idle time inside stage s's own span (its first action's start to its last
// one's end), the bubble as the papers count it (the header comment): zbv none, dualpipev p - 1 - s
static inline int pipeline_v_span_idle_formula(PipeSpec s, int stage) {
    return s.sched == SCHEDULE_DUALPIPEV ? s.p - 1 - stage : 0;
}

// ... and by formula: afab all m V; 1f1b p - s; interleaved its warm-up plus one; zb p on every
// stage (ZB-H1 lets each stage hold what 1F1B's first stage holds); zbv 2p chunks (p micro-batches
// of a whole stage, again 1F1B's first stage's), dualpipev 2p + 1 (DualPipe's PP + 1 with
// PP = 2p: an F&B pair's forward runs before its backward frees); never more than m V
static inline int pipeline_peak_formula(PipeSpec s, int stage) {
    int total = s.m * s.V;
    switch (s.sched) {
        case SCHEDULE_AFAB: return total;
        case SCHEDULE_1F1B: return pipeline_min(total, s.p - stage);
        case SCHEDULE_INTERLEAVED: return pipeline_min(total, 2 * (s.p - stage - 1) + (s.V - 1) * s.p + 1);
        case SCHEDULE_ZBV: return pipeline_min(total, 2 * s.p);
        case SCHEDULE_DUALPIPEV: return pipeline_min(total, 2 * s.p + 1);
        default: return pipeline_min(total, s.p);
    }
}

// ---------------------------------------------------------------------------------------------
// Sends and receives. A stage's actions run in groups, one action each, except that interleaved
// runs its steady state's forward and backward as one group (joins: pipeline_stage_actions says
// why one action per group would deadlock there). Between two groups the
// stage makes one exchange: it sends the outputs of the group before and receives the inputs of
// the group after, all posted together and waited for together (MPI_Isend and MPI_Irecv, then
// MPI_Waitall; NCCL's ncclSend and ncclRecv in one group); a V schedule's send put off
// (sends_later) goes in that many exchanges later, after the sends made there. Sends and receives between two ranks
// pair up in the order they were posted. pipeline_check_exchanges plays this out with instant
// computation: an exchange completes once the partner of each of its messages has posted its own
// exchange with the matching one. It returns NULL when every exchange completes and every
// message pairs with the one its receiver expects; else what went wrong (in why).

// the exchange before each action's group (0, 1, ...); returns the number of groups. The
// exchange after the last group, which sends its outputs, is number `groups`.
static inline int pipeline_exchange_index(const PipeAction* stage_actions, int count, int* exchange) {
    int group = -1;
    for (int k = 0; k < count; k++) {
        if (k == 0 || !stage_actions[k].joins) group++;
        exchange[k] = group;
    }
    return group + 1;
}

typedef struct {
    int peer;           // the other rank, -1 for none
    int exchange;       // the exchange that carries it on this rank (pipeline_exchange_index)
    PipeAction action;  // the action whose input (receive) or output (send) it is
} PipeMessage;

static inline PipeMessage pipe_message(int peer, int exchange, PipeAction action) {
    PipeMessage msg;
    msg.peer = peer;
    msg.exchange = exchange;
    msg.action = action;
    return msg;
}

static inline const char* pipeline_check_exchanges(PipeSpec s, const PipeAction* actions, int n, char* why, size_t cap) {
    // every rank's sends and receives in posting order
    PipeMessage* sends = (PipeMessage*)malloc_check((size_t)s.p * n * sizeof(PipeMessage));
    PipeMessage* recvs = (PipeMessage*)malloc_check((size_t)s.p * n * sizeof(PipeMessage));
    int* num_sends = (int*)calloc_check((size_t)s.p, sizeof(int));
    int* num_recvs = (int*)calloc_check((size_t)s.p, sizeof(int));
    int* groups = (int*)malloc_check((size_t)s.p * sizeof(int));
    int* exchange = (int*)malloc_check((size_t)n * sizeof(int));
    for (int st = 0; st < s.p; st++) {
        groups[st] = pipeline_exchange_index(actions + (size_t)st * n, n, exchange);
        // an exchange posts the sends of the group before, then the receives of the group after
        // (the order of posting within an exchange does not matter for completion, only for
        // pairing, and both sides post in action order)
        for (int k = 0; k < n; k++) {
            PipeAction a = actions[st * n + k];
            int from = pipeline_input_from(s, st, a), to = pipeline_output_to(s, st, a);
            if (from >= 0) recvs[st * n + num_recvs[st]++] = pipe_message(from, exchange[k], a);
            if (to >= 0) sends[st * n + num_sends[st]++] = pipe_message(to, exchange[k] + 1 + a.sends_later, a);
        }
        // sends put off (sends_later) are posted in their later exchange, after those made there:
        // sort by exchange, keeping the action order within one (insertion: nearly sorted)
        for (int j = 1; j < num_sends[st]; j++) {
            PipeMessage msg = sends[st * n + j];
            int i = j;
            for (; i > 0 && sends[st * n + i - 1].exchange > msg.exchange; i--) sends[st * n + i] = sends[st * n + i - 1];
            sends[st * n + i] = msg;
        }
    }
    // pair them: the j-th send from a to b with the j-th receive of b from a. partner[i]: the
    // exchange on the other rank that posts the pair of message i (sends at st n + j, receives
    // after them at p n + st n + j)
    int* partner = (int*)malloc_check((size_t)2 * s.p * n * sizeof(int));
    const char* problem = NULL;
    for (int a = 0; a < s.p && !problem; a++) {
        for (int b = 0; b < s.p && !problem; b++) {
            int js = 0, jr = 0;
            for (;;) {
                while (js < num_sends[a] && sends[a * n + js].peer != b) js++;
                while (jr < num_recvs[b] && recvs[b * n + jr].peer != a) jr++;
                if (js == num_sends[a] || jr == num_recvs[b]) {
                    if (js != num_sends[a] || jr != num_recvs[b]) {
                        snprintf(why, cap, "rank %d and rank %d post different numbers of messages to each other", a, b);
                        problem = why;
                    }
                    break;
                }
                PipeAction out = sends[a * n + js].action, in = recvs[b * n + jr].action;
                // the receiver expects the output of the same micro-batch's same pass, one virtual
                // stage before (forward) or after (backward) its own
                int va = pipeline_virtual_stage(s, a, out.chunk), vb = pipeline_virtual_stage(s, b, in.chunk);
                if (out.op != in.op || out.micro != in.micro || va + (in.op == PIPE_FORWARD ? 1 : -1) != vb) {
                    snprintf(why, cap, "rank %d's message %c%d (chunk %d) reaches rank %d while it waits for %c%d (chunk %d)",
                             a, pipe_op_letters[out.op], out.micro, out.chunk, b, pipe_op_letters[in.op], in.micro, in.chunk);
                    problem = why;
                    break;
                }
                partner[a * n + js] = recvs[b * n + jr].exchange;
                partner[s.p * n + b * n + jr] = sends[a * n + js].exchange;
                js++;
                jr++;
            }
        }
    }
    // play out: at[st] is the exchange rank st has posted and waits in (n + 1 of them)
    int* at = (int*)calloc_check((size_t)s.p, sizeof(int));  // 0 .. groups
    int* next_send = (int*)calloc_check((size_t)s.p, sizeof(int));
    int* next_recv = (int*)calloc_check((size_t)s.p, sizeof(int));
    for (int finished = 0; !problem && finished < s.p;) {
        int progress = 0;
        finished = 0;
        for (int st = 0; st < s.p; st++) {
            if (at[st] > groups[st]) {
                finished++;
                continue;
            }
            int ok = 1, js = next_send[st], jr = next_recv[st];
            for (; js < num_sends[st] && sends[st * n + js].exchange == at[st]; js++) {
                if (at[sends[st * n + js].peer] < partner[st * n + js]) ok = 0;
            }
            for (; jr < num_recvs[st] && recvs[st * n + jr].exchange == at[st]; jr++) {
                if (at[recvs[st * n + jr].peer] < partner[s.p * n + st * n + jr]) ok = 0;
            }
            if (!ok) continue;
            next_send[st] = js;
            next_recv[st] = jr;
            at[st]++;  // the exchange is done, and so (instantly) is the group after it
            progress = 1;
        }
        if (!progress && finished < s.p) {
            int st = 0;
            while (at[st] > groups[st]) st++;
            snprintf(why, cap, "the exchanges deadlock: rank %d waits in exchange %d of %d", st, at[st], groups[st]);
            problem = why;
        }
    }
    free(sends);
    free(recvs);
    free(num_sends);
    free(num_recvs);
    free(groups);
    free(exchange);
    free(partner);
    free(at);
    free(next_send);
    free(next_recv);
    return problem;
}

// Which gradient buffer each backward of a walk uses (grad_index, 0 for the other actions), and
// how many buffers that takes (returned). A backward receives the gradient at its chunk's output
// into its buffer in the exchange before its group, computes the gradient at its input in place,
// and sends it back sends_later exchanges after the one right after its group (the V): the
// buffer is busy from that receive to that send, and a later backward may receive into it only in
// an exchange after the send (not in the same one: MPI and NCCL forbid writing a buffer that a
// posted send still reads). Each backward takes the lowest-numbered buffer free by then. In 1F1B
// and its kin a buffer is busy for two exchanges and a group holds one backward: two buffers,
// used in turn. In a V a send may wait several exchanges, so more can be busy at once; and at the
// V's bottom chunk 0's backward starts from the gradient chunk 1's backward of the same
// micro-batch left in its buffer (no message): it takes that buffer, kept for it till then.
static inline int pipeline_grad_indices(PipeSpec spec, int stage, const PipeAction* actions, int n, int* grad_index) {
    int* group = (int*)malloc_check((size_t)n * sizeof(int));
    int* busy_until = (int*)malloc_check((size_t)(n + 2) * sizeof(int));  // the last exchange that uses it
    int* local_buffer = (int*)malloc_check((size_t)spec.m * sizeof(int));  // micro-batch -> its hand-off's buffer
    pipeline_exchange_index(actions, n, group);
    int buffers = 2;  // (at least two, as the memory plan counts: one sending, one receiving)
    for (int b = 0; b < n + 2; b++) busy_until[b] = -1;
    for (int k = 0; k < n; k++) {
        PipeAction a = actions[k];
        grad_index[k] = 0;
        if (a.op != PIPE_BACKWARD) continue;
        int b = 0;
        if (pipeline_input_is_local(spec, stage, a)) b = local_buffer[a.micro];
        else while (busy_until[b] >= group[k]) b++;
        grad_index[k] = b;
        buffers = b + 1 > buffers ? b + 1 : buffers;
        int sends_at = group[k] + 1 + a.sends_later;
        if (pipeline_output_to(spec, stage, a) >= 0) busy_until[b] = sends_at;  // until its send
        else if (pipeline_virtual_stage(spec, stage, a.chunk) > 0) {             // a hand-off: held
            busy_until[b] = n + 1;                                               // for the other chunk
            local_buffer[a.micro] = b;
        } else busy_until[b] = group[k];  // the first virtual stage's: used by its own group only
    }
    free(group);
    free(busy_until);
    free(local_buffer);
    return buffers;
}

// ... the count alone (the memory plan's, and the trainers' before they allocate)
static inline int pipeline_num_grads(PipeSpec spec, int stage, const PipeAction* actions, int n) {
    int* grad_index = (int*)malloc_check((size_t)(n > 0 ? n : 1) * sizeof(int));
    int buffers = pipeline_grad_indices(spec, stage, actions, n, grad_index);
    free(grad_index);
    return buffers;
}

// ---------------------------------------------------------------------------------------------
// A timeline as a chart, one row per stage, as the Ultra-Scale Playbook draws it: F3 is
// micro-batch 3's forward, B3 its backward, W3 its weight gradient (zb), with a chunk letter
// (F3a, F3b) when stages hold several chunks; '.' is idle. start and end (p, n) are in any unit;
// one column is `unit` of them. An action takes the columns its times round to, but at least
// one of its own: one that would share a column with the action before it (two short actions of
// a measured timeline) starts after it, and the row grows. Each row ends with the stage's busy
// share. Written to `out` (stdout, or a file in the tests).
static inline void pipeline_draw(FILE* out, PipeSpec s, const PipeAction* actions, const double* start,
                                 const double* end, double unit, const char* indent) {
    int n = pipeline_actions_per_stage(s), width = s.V > 1 ? 5 : 4;
    double length = 0.0;
    for (int i = 0; i < s.p * n; i++) length = end[i] > length ? end[i] : length;
    // each action's first and last + 1 column; a stage's actions are in the order it ran them
    int* c0 = (int*)malloc_check((size_t)s.p * n * sizeof(int));
    int* c1 = (int*)malloc_check((size_t)s.p * n * sizeof(int));
    int columns = (int)(length / unit + 0.5);
    for (int st = 0; st < s.p; st++) {
        int next_free = 0;
        for (int k = 0; k < n; k++) {
            int i = st * n + k, first = (int)(start[i] / unit + 0.5), last = (int)(end[i] / unit + 0.5);
            c0[i] = first > next_free ? first : next_free;
            c1[i] = last > c0[i] ? last : c0[i] + 1;  // a short action still shows
            next_free = c1[i];
        }
        columns = next_free > columns ? next_free : columns;
    }
    char* row = (char*)malloc_check((size_t)columns * width + 1);
    for (int st = 0; st < s.p; st++) {
        memset(row, ' ', (size_t)columns * width);
        for (int t = 0; t < columns; t++) row[t * width + 1] = '.';
        double busy = 0.0;
        for (int k = 0; k < n; k++) {
            int i = st * n + k;
            busy += end[i] - start[i];
            char cell[16], chunk[2] = {(char)('a' + actions[i].chunk), '\0'};
            snprintf(cell, sizeof(cell), "%c%d%s", pipe_op_letters[actions[i].op], actions[i].micro, s.V > 1 ? chunk : "");
            for (int t = c0[i]; t < c1[i]; t++) {
                memset(row + t * width, ' ', (size_t)width);
                memcpy(row + t * width, cell, strlen(cell) < (size_t)width ? strlen(cell) : (size_t)width);
            }
        }
        row[columns * width] = '\0';
        fprintf(out, "%sstage %d |%s| busy %3.0f%%\n", indent, st, row, 100.0 * busy / length);
    }
    free(row);
    free(c0);
    free(c1);
}

// The schedule as the unit-time chart, with the idle share beside its formula and each stage's
// peak of held activations beside its formula
static inline void pipeline_print_chart(PipeSpec s) {
    int n = pipeline_actions_per_stage(s);
    PipeAction* actions = (PipeAction*)malloc_check((size_t)s.p * n * sizeof(PipeAction));
    int* start = (int*)malloc_check((size_t)s.p * n * sizeof(int));
    int* end = (int*)malloc_check((size_t)s.p * n * sizeof(int));
    double* t0 = (double*)malloc_check((size_t)s.p * n * sizeof(double));
    double* t1 = (double*)malloc_check((size_t)s.p * n * sizeof(double));
    int length = pipeline_simulate(s, actions, start, end);
    for (int i = 0; i < s.p * n; i++) {
        t0[i] = start[i];
        t1[i] = end[i];
    }
    printf("schedule %s, p=%d stages, m=%d micro-batches", pipe_schedule_names[s.sched], s.p, s.m);
    if (s.V > 1) printf(", V=%d chunks per stage (a, b, ...)", s.V);
    printf(" (F: forward, 1 unit; %s):\n", pipeline_splits_backward(s) ? "B: input gradient, 1 unit; W: weight gradient, 1 unit"
                                                                        : "B: backward, 2 units");
    pipeline_draw(stdout, s, actions, t0, t1, 1.0, "  ");
    double busy = 3.0 * s.m * s.V;
    const char* formula = pipeline_is_v(s)          ? "(p-1)/(6m+p-1)"
                          : s.sched == SCHEDULE_ZB ? "(p-1)/(3m+p-1) for m >= p"
                          : s.V > 1                ? "(p-1)/(mV+p-1)"
                                                   : "(p-1)/(m+p-1)";
    double predicted = pipeline_is_v(s)          ? (double)(s.p - 1) / (6 * s.m + s.p - 1)
                       : s.sched == SCHEDULE_ZB ? (double)(s.p - 1) / (3 * s.m + s.p - 1)
                                                : (double)(s.p - 1) / (s.m * s.V + s.p - 1);
    printf("  idle: %.1f%% of the step; formula %s = %.1f%%\n", 100.0 * (1.0 - busy / length), formula, 100.0 * predicted);
    printf("  activations held at most (micro-batch%s):", s.V > 1 ? " chunks" : "es");
    for (int st = 0; st < s.p; st++) printf(" stage %d: %d", st, pipeline_peak_in_flight(s, actions + (size_t)st * n, n));
    printf("\n");
    free(actions);
    free(start);
    free(end);
    free(t0);
    free(t1);
}

// A run's pipeline from its flags: the schedule by name, p stages with V chunks of L / (p V)
// layers each, m micro-batches; a bad name, or L not splitting, stops the run with what to change
// (stages_flag: the flag or the launch that sets p)
static inline PipeSpec pipeline_spec_of(const char* sched_name, int p, int m, int V, int L, const char* stages_flag) {
    // (every rank reads the same flags here: check_every_rank prints the error once)
    int sched = pipeline_schedule_from_name(sched_name);
    check_every_rank(sched >= 0, "-sched %s: unknown schedule; expected afab, 1f1b, interleaved, zb, zbv or dualpipev",
                     sched_name);
    // the V schedules hold 2 chunks a stage: -vp 1 (the default) means theirs
    PipeSpec spec = {(PipeSchedule)sched, p, m, V};
    check_every_rank(!pipeline_is_v(spec) || V <= 2, "-vp %d: -sched %s places exactly 2 chunks on each stage, in a V "
                     "(leave -vp out, or give 2)", V, sched_name);
    if (pipeline_is_v(spec)) spec.V = 2;
    check_every_rank(L % (p * spec.V) == 0, "the model's L = %d layers cannot be split into pp x vp = %d x %d = %d equal "
                     "chunks; choose %s (and -vp) whose product divides %d", L, p, spec.V, p * spec.V, stages_flag, L);
    return spec;
}

// Every stage's list of actions for a run, n each (the whole pipeline's, so that each stage can
// report the others' counts): the spec checked first, then the exchanges of all the lists proven
// to pair up and finish, so that a wrong schedule stops here with the reason, not in a hang
static inline PipeAction* pipeline_plan(PipeSpec spec, const char* sched_name, int* n_out) {
    char why[256];
    // (every rank plans the same spec: check_every_rank prints the rule once)
    check_every_rank(pipeline_spec_problem(spec, why, sizeof(why)) == NULL, "%s", why);
    int n = pipeline_actions_per_stage(spec);
    PipeAction* all_actions = (PipeAction*)malloc_check((size_t)spec.p * n * sizeof(PipeAction));
    for (int s = 0; s < spec.p; s++) pipeline_stage_actions(spec, s, all_actions + (size_t)s * n);
    if (pipeline_check_exchanges(spec, all_actions, n, why, sizeof(why))) fail("schedule %s: %s", sched_name, why);
    *n_out = n;
    return all_actions;
}

#endif
