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
// Each schedule is checked (test/test_pipeline.c) by playing it out with unit-time actions and by
// playing out its sends and receives (pipeline_check_exchanges): it finishes, in the formula's time.
#ifndef LLMC_PIPELINE_H
#define LLMC_PIPELINE_H

#include <stdio.h>
#include <string.h>
#include "utils.h"

typedef enum { PIPE_FORWARD, PIPE_BACKWARD, PIPE_WEIGHT } PipeOp;
typedef enum { SCHEDULE_AFAB, SCHEDULE_1F1B, SCHEDULE_INTERLEAVED, SCHEDULE_ZB, SCHEDULE_COUNT } PipeSchedule;

static const char* pipe_schedule_names[SCHEDULE_COUNT] = {"afab", "1f1b", "interleaved", "zb"};
static const char pipe_op_letters[3] = {'F', 'B', 'W'};

typedef struct {
    PipeOp op;
    int micro;  // the micro-batch, 0 .. m-1
    int chunk;  // which of the stage's V chunks of layers, 0 .. V-1 (0 without interleaving)
    int joins;  // 1: runs right after the action before, with no exchange of messages between
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
    return a;
}

// -sched's value; -1 when it names no schedule
static inline int pipeline_schedule_from_name(const char* name) {
    for (int i = 0; i < SCHEDULE_COUNT; i++) {
        if (strcmp(name, pipe_schedule_names[i]) == 0) return i;
    }
    return -1;
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
    if (s.V != 1) {
        snprintf(why, cap, "-vp %d: only -sched interleaved splits a stage into chunks (-sched %s)", s.V,
                 pipe_schedule_names[s.sched]);
        return why;
    }
    return NULL;
}

// each stage runs every micro-batch through every chunk once forward and once backward, and with
// zb once more for the weight gradients
static inline int pipeline_actions_per_stage(PipeSpec s) { return s.m * s.V * (s.sched == SCHEDULE_ZB ? 3 : 2); }

static inline int pipeline_min(int a, int b) { return a < b ? a : b; }

// Megatron-LM's interleaved order: micro-batches go through in groups of p; a stage's k-th
// forward is micro-batch (k / pV) p + k % p of chunk (k / p) % V, its backwards the same with
// the chunks in reverse. Its warm-up: pipeline_stage_actions says why.
static inline PipeAction interleaved_action(PipeSpec s, int k, PipeOp op) {
    int group = k / (s.p * s.V), chunk = (k / s.p) % s.V;
    return pipe_action(op, group * s.p + k % s.p, op == PIPE_FORWARD ? chunk : s.V - 1 - chunk);
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

// the virtual stage that runs chunk c of stage s, and the rank that runs virtual stage v
static inline int pipeline_virtual_stage(PipeSpec s, int stage, int chunk) { return chunk * s.p + stage; }

// Who sends stage s's action its input, and who gets its output: a rank, or -1 for none (the
// first virtual stage's forward reads tokens, the last one's backward starts from its own loss,
// and W's neither receive nor send).
static inline int pipeline_input_from(PipeSpec s, int stage, PipeAction a) {
    int v = pipeline_virtual_stage(s, stage, a.chunk), last = s.p * s.V - 1;
    if (a.op == PIPE_FORWARD) return v == 0 ? -1 : (v - 1) % s.p;
    if (a.op == PIPE_BACKWARD) return v == last ? -1 : (v + 1) % s.p;
    return -1;
}
static inline int pipeline_output_to(PipeSpec s, int stage, PipeAction a) {
    int v = pipeline_virtual_stage(s, stage, a.chunk), last = s.p * s.V - 1;
    if (a.op == PIPE_FORWARD) return v == last ? -1 : (v + 1) % s.p;
    if (a.op == PIPE_BACKWARD) return v == 0 ? -1 : (v - 1) % s.p;
    return -1;
}

// ---------------------------------------------------------------------------------------------
// The schedule played out in time: each stage runs its list in order; an action starts once its
// stage is free and its input is there, a message from another stage arriving send_seconds after
// the action that made it ended. seconds (p, 3): how long stage s's forward, backward and weight
// gradient of one chunk take, at [s 3 + op] (without zb the backward holds both gradients). start
// and end are (p, n): stage s's action k at [s n + k] (n = pipeline_actions_per_stage), as is
// `actions`, which this fills. Returns the step's length: with measured or predicted times (the
// step-time model) the bubble is what the stages' busy time leaves of it. Stops the program if
// the schedule deadlocks (a wrong schedule, never a valid one).
static inline double pipeline_play(PipeSpec s, PipeAction* actions, const double* seconds, double send_seconds,
                                   double* start, double* end) {
    int n = pipeline_actions_per_stage(s), per_op = s.m * s.V;  // per op: each (micro, chunk)
    // when each (stage, op, micro, chunk) ended; -1: not yet
    double* done = (double*)malloc_check((size_t)s.p * 3 * per_op * sizeof(double));
    int* next = (int*)calloc_check((size_t)s.p, sizeof(int));
    double* free_at = (double*)calloc_check((size_t)s.p, sizeof(double));
    for (int i = 0; i < s.p * 3 * per_op; i++) done[i] = -1.0;
#define PIPE_DONE(stage, op, micro, chunk) done[(((stage) * 3 + (op)) * s.m + (micro)) * s.V + (chunk)]
    for (int st = 0; st < s.p; st++) pipeline_stage_actions(s, st, actions + (size_t)st * n);
    int remaining = s.p * n, last = s.p * s.V - 1;
    double length = 0.0;
    while (remaining > 0) {
        int progress = 0;
        for (int st = 0; st < s.p; st++) {
            if (next[st] == n) continue;
            PipeAction a = actions[st * n + next[st]];
            int v = pipeline_virtual_stage(s, st, a.chunk), from = st;  // (from: the stage its input comes from)
            double ready;
            if (a.op == PIPE_FORWARD) {
                from = v == 0 ? st : (v - 1) % s.p;
                ready = v == 0 ? 0.0 : PIPE_DONE(from, PIPE_FORWARD, a.micro, (v - 1) / s.p);
            } else if (a.op == PIPE_WEIGHT) {
                ready = PIPE_DONE(st, PIPE_BACKWARD, a.micro, a.chunk);
            } else if (v == last) {
                ready = PIPE_DONE(st, PIPE_FORWARD, a.micro, a.chunk);
            } else {
                from = (v + 1) % s.p;
                ready = PIPE_DONE(from, PIPE_BACKWARD, a.micro, (v + 1) / s.p);
            }
            if (ready < 0.0) continue;
            if (from != st) ready += send_seconds;
            int k = st * n + next[st];
            start[k] = ready > free_at[st] ? ready : free_at[st];
            end[k] = start[k] + seconds[st * 3 + a.op];
            PIPE_DONE(st, a.op, a.micro, a.chunk) = end[k];
            free_at[st] = end[k];
            length = end[k] > length ? end[k] : length;
            next[st]++;
            remaining--;
            progress = 1;
        }
        if (!progress) fail("pipeline schedule %s deadlocks at p=%d, m=%d, V=%d", pipe_schedule_names[s.sched], s.p, s.m, s.V);
    }
#undef PIPE_DONE
    free(done);
    free(next);
    free(free_at);
    return length;
}

// The play in units: a chunk's forward takes 1 unit, its backward 2 (the gradients of the inputs
// and of the weights), or with zb B and W 1 each; messages take no time. start and end in units
// (whole numbers); returns the step's length in units.
static inline int pipe_units(PipeSpec s, PipeOp op) { return op == PIPE_BACKWARD && s.sched != SCHEDULE_ZB ? 2 : 1; }

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
static inline int pipeline_length_formula(PipeSpec s) {
    if (s.sched == SCHEDULE_ZB) return 3 * s.m + s.p - 1 + (s.m < s.p ? s.p - s.m : 0);
    return 3 * (s.m * s.V + s.p - 1);
}

// the most (micro-batch, chunk) activations stage s holds at once: forwards done whose backward
// (with zb: whose W) is not
static inline int pipeline_peak_in_flight(PipeSpec s, const PipeAction* stage_actions, int count) {
    PipeOp frees = s.sched == SCHEDULE_ZB ? PIPE_WEIGHT : PIPE_BACKWARD;
    int held = 0, peak = 0;
    for (int k = 0; k < count; k++) {
        held += stage_actions[k].op == PIPE_FORWARD ? 1 : stage_actions[k].op == frees ? -1 : 0;
        peak = held > peak ? held : peak;
    }
    return peak;
}

// ... and by formula: afab all m V; 1f1b p - s; interleaved its warm-up plus one; zb p on every
// stage (ZB-H1 lets each stage hold what 1F1B's first stage holds); never more than m V
static inline int pipeline_peak_formula(PipeSpec s, int stage) {
    int total = s.m * s.V;
    switch (s.sched) {
        case SCHEDULE_AFAB: return total;
        case SCHEDULE_1F1B: return pipeline_min(total, s.p - stage);
        case SCHEDULE_INTERLEAVED: return pipeline_min(total, 2 * (s.p - stage - 1) + (s.V - 1) * s.p + 1);
        default: return pipeline_min(total, s.p);
    }
}

// ---------------------------------------------------------------------------------------------
// Sends and receives. A stage's actions run in groups, one action each, except that interleaved
// runs its steady state's forward and backward as one group (joins: pipeline_stage_actions says
// why one action per group would deadlock there). Between two groups the
// stage makes one exchange: it sends the outputs of the group before and receives the inputs of
// the group after, all posted together and waited for together (MPI_Isend and MPI_Irecv, then
// MPI_Waitall; NCCL's ncclSend and ncclRecv in one group). Sends and receives between two ranks
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
            if (to >= 0) sends[st * n + num_sends[st]++] = pipe_message(to, exchange[k] + 1, a);
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
    printf(" (F: forward, 1 unit; %s):\n", s.sched == SCHEDULE_ZB ? "B: input gradient, 1 unit; W: weight gradient, 1 unit"
                                                                   : "B: backward, 2 units");
    pipeline_draw(stdout, s, actions, t0, t1, 1.0, "  ");
    double busy = 3.0 * s.m * s.V;
    const char* formula = s.sched == SCHEDULE_ZB ? "(p-1)/(3m+p-1) for m >= p" : s.V > 1 ? "(p-1)/(mV+p-1)" : "(p-1)/(m+p-1)";
    double predicted = s.sched == SCHEDULE_ZB ? (double)(s.p - 1) / (3 * s.m + s.p - 1)
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
    check_every_rank(sched >= 0, "-sched %s: unknown schedule; expected afab, 1f1b, interleaved or zb", sched_name);
    check_every_rank(L % (p * V) == 0, "the model's L = %d layers cannot be split into pp x vp = %d x %d = %d equal "
                     "chunks; choose %s (and -vp) whose product divides %d", L, p, V, p * V, stages_flag, L);
    PipeSpec spec = {(PipeSchedule)sched, p, m, V};
    return spec;
}

// Every stage's list of actions for a run, n each (the whole pipeline's, so that each stage can
// report the others' counts): the spec checked first, then the exchanges of all the lists proven
// to pair up and finish, so that a wrong schedule stops here with the reason, not in a hang
static inline PipeAction* pipeline_plan(PipeSpec spec, const char* sched_name, int* n_out) {
    char why[256];
    if (pipeline_spec_problem(spec, why, sizeof(why))) fail("%s", why);
    int n = pipeline_actions_per_stage(spec);
    PipeAction* all_actions = (PipeAction*)malloc_check((size_t)spec.p * n * sizeof(PipeAction));
    for (int s = 0; s < spec.p; s++) pipeline_stage_actions(spec, s, all_actions + (size_t)s * n);
    if (pipeline_check_exchanges(spec, all_actions, n, why, sizeof(why))) fail("schedule %s: %s", sched_name, why);
    *n_out = n;
    return all_actions;
}

#endif
