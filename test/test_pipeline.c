// Unit tests of the pipeline schedules (llmc/pipeline.h) for p = 1..8 stages and m = 1..16
// micro-batches (interleaved: V = 2, 3 chunks, m a multiple of p, p >= 2; zbv and dualpipev: the
// V of 2 chunks, m up to 20 so that every p has m = 2p and an odd m), on the timeline that
// unit-time actions give (a chunk's forward 1, backward 2; zb, zbv, dualpipev: F, B, W 1 each):
//   - every stage runs each (micro-batch, chunk)'s forward and backward (and W) exactly once,
//     forward first, W after B;
//   - a forward starts after the virtual stage before ended that micro-batch's forward, a
//     backward after the virtual stage after ended its backward (the last one's after its own
//     forward), and a stage runs one action at a time;
//   - the step lasts as long as the formula says (pipeline_length_formula), so the bubble is the
//     formula's;
//   - each stage holds at most the formula's activations: afab m, 1f1b min(p - s, m), zb
//     min(p, m), interleaved its warm-up plus one, zbv 2p chunks, dualpipev 2p + 1;
//   - the LM head's buffers (pipeline_peak_heads): the most micro-batches of the last virtual
//     stage a stage holds from the start of their F's group (where the walk receives the F's
//     input into its slot; a local input: the F itself) to the end of their B, or W with a split
//     backward, counted again on the timeline unit by unit; 0 off the head's stage. In a V, by
//     hand: zbv 1 (stage 0 runs chunk 1's F, B, W of a micro-batch, each a group of its own,
//     before the next one's F: the head's B waits for no other stage, its gradient is its own
//     loss's); dualpipev 2 (its warm-up pairs W0 of chunk 1 with F1 of chunk 1 in one group, so
//     F1's input arrives, into its slot and head, before W0 has read micro-batch 0's; at p = 1,
//     where F1's input is chunk 0's output copied at the F, 1);
//   - zbv and dualpipev: each stage's idle time inside its own span (the papers' bubble) is the
//     formula's, zbv none, dualpipev p - 1 - s; their rules on m (and V = 2) refused, named;
//   - the sends and receives between the actions pair up in order and never deadlock, and so do
//     those of the forward passes alone (validation and sampling);
//   - each backward's gradient buffer (pipeline_grad_indices) is not another's from its receive to
//     its send (at the V's bottom, to its chunk 0's send: the two share it), checked span by span;
//     two buffers for every schedule but the V's; at most 8 messages in one exchange (comm.h's
//     COMM_EXCHANGE_MAX);
//   - a chart of a measured timeline keeps every action, two in one column included;
//   - played with times instead of units (pipeline_play, the step-time model's bubble), AFAB and
//     1F1B last (m + p - 1)(a + b), and a message's latency counts where it waits (by hand);
//   - played on shared cores (pipeline_play_shared), the same play when durations do not depend
//     on the stages computing at once, and a case by hand where they do.
// Prints a chart of each schedule at p = 4. Checked values come from formulas, not from a run.
#include <math.h>
#include <stdio.h>
#include "llmc/pipeline.h"

static int failures = 0;
#define CHECK(cond, ...) do { if (!(cond)) { failures++; printf("FAIL: " __VA_ARGS__); printf("\n"); } } while (0)

// The gradient buffers of stage st's backwards, and its exchanges' sizes (the header's rules),
// from the exchange numbers alone: a backward's buffer is in use from the exchange before its
// group (its receive) to the exchange that sends its output, or, when its output is the V's
// hand-off to the stage's other chunk, to that chunk's send
static void check_buffers(PipeSpec s, int st, const PipeAction* a, int n) {
    const char* name = pipe_schedule_names[s.sched];
    int* group = (int*)malloc_check((size_t)n * sizeof(int));
    int* buffer = (int*)malloc_check((size_t)n * sizeof(int));
    int* last_use = (int*)malloc_check((size_t)n * sizeof(int));
    int* consumer = (int*)malloc_check((size_t)n * sizeof(int));
    int groups = pipeline_exchange_index(a, n, group);
    int buffers = pipeline_grad_indices(s, st, a, n, buffer);
    int* messages = (int*)calloc_check((size_t)groups + 1, sizeof(int));
    for (int j = 0; j < n; j++) {
        consumer[j] = -1;
        if (pipeline_input_from(s, st, a[j]) >= 0) messages[group[j]]++;
        if (pipeline_output_to(s, st, a[j]) >= 0) messages[group[j] + 1 + a[j].sends_later]++;
    }
    for (int k = 0; k < n; k++) {  // each hand-off's producer: the other chunk's B of the micro-batch
        if (a[k].op != PIPE_BACKWARD || !pipeline_input_is_local(s, st, a[k])) continue;
        int v = pipeline_virtual_stage(s, st, a[k].chunk);
        for (int j = 0; j < k; j++) {
            if (a[j].op == PIPE_BACKWARD && a[j].micro == a[k].micro && a[j].chunk == pipeline_chunk_of(s, v + 1)) consumer[j] = k;
        }
    }
    for (int j = n - 1; j >= 0; j--) {
        last_use[j] = pipeline_output_to(s, st, a[j]) >= 0 ? group[j] + 1 + a[j].sends_later : group[j];
        if (consumer[j] >= 0) last_use[j] = last_use[consumer[j]];
    }
    for (int j = 0; j < n; j++) {
        if (a[j].op != PIPE_BACKWARD) continue;
        CHECK(buffer[j] >= 0 && buffer[j] < buffers, "%s p=%d m=%d stage %d: buffer %d of %d", name, s.p, s.m, st, buffer[j], buffers);
        if (consumer[j] >= 0) {
            CHECK(buffer[consumer[j]] == buffer[j], "%s p=%d m=%d stage %d: B%d's hand-off in another buffer", name, s.p, s.m, st, a[j].micro);
        }
        for (int k = j + 1; k < n; k++) {
            if (a[k].op != PIPE_BACKWARD || buffer[k] != buffer[j] || k == consumer[j]) continue;
            CHECK(group[k] > last_use[j], "%s p=%d m=%d stage %d: B%d%c receives into buffer %d in exchange %d, which B%d%c "
                  "uses till exchange %d", name, s.p, s.m, st, a[k].micro, 'a' + a[k].chunk, buffer[k], group[k], a[j].micro,
                  'a' + a[j].chunk, last_use[j]);
        }
    }
    CHECK(pipeline_is_v(s) || buffers == 2, "%s p=%d m=%d stage %d: %d gradient buffers, 2 expected", name, s.p, s.m, st, buffers);
    for (int e = 0; e <= groups; e++) {
        CHECK(messages[e] <= 8, "%s p=%d m=%d stage %d: %d messages in exchange %d, comm.h takes 8", name, s.p, s.m, st, messages[e], e);
    }
    free(group);
    free(buffer);
    free(last_use);
    free(consumer);
    free(messages);
}

static void check_schedule(PipeSpec s) {
    const char* name = pipe_schedule_names[s.sched];
    int p = s.p, m = s.m, V = s.V, n = pipeline_actions_per_stage(s), per_op = m * V;
    PipeAction* actions = (PipeAction*)malloc_check((size_t)p * n * sizeof(PipeAction));
    int* start = (int*)malloc_check((size_t)p * n * sizeof(int));
    int* end = (int*)malloc_check((size_t)p * n * sizeof(int));
    int length = pipeline_simulate(s, actions, start, end);
    // where (index into the arrays) each stage's F, B and W of each (micro-batch, chunk) sits
    int* at = (int*)malloc_check((size_t)p * 3 * per_op * sizeof(int));
    for (int i = 0; i < p * 3 * per_op; i++) at[i] = -1;
#define AT(stage, op, micro, chunk) at[(((stage) * 3 + (op)) * m + (micro)) * V + (chunk)]
    for (int st = 0; st < p; st++) {
        for (int k = 0; k < n; k++) {
            int i = st * n + k;
            PipeAction a = actions[i];
            CHECK(a.micro >= 0 && a.micro < m && a.chunk >= 0 && a.chunk < V, "%s p=%d m=%d V=%d stage %d: micro-batch %d chunk %d",
                  name, p, m, V, st, a.micro, a.chunk);
            CHECK(a.op != PIPE_WEIGHT || pipeline_splits_backward(s), "%s: a W in a schedule without split backwards", name);
            CHECK(AT(st, a.op, a.micro, a.chunk) < 0, "%s p=%d m=%d V=%d stage %d: %c%d twice", name, p, m, V, st,
                  pipe_op_letters[a.op], a.micro);
            AT(st, a.op, a.micro, a.chunk) = i;
            CHECK(k == 0 || start[i] >= end[i - 1], "%s p=%d m=%d stage %d: two actions at once", name, p, m, st);
        }
    }
    int last = p * V - 1;
    for (int st = 0; st < p; st++) {
        for (int mb = 0; mb < m; mb++) {
            for (int c = 0; c < V; c++) {
                int f = AT(st, PIPE_FORWARD, mb, c), b = AT(st, PIPE_BACKWARD, mb, c), w = AT(st, PIPE_WEIGHT, mb, c);
                CHECK(f >= 0 && b >= 0 && f < b, "%s p=%d m=%d stage %d micro %d: forward must precede backward", name, p, m, st, mb);
                if (pipeline_splits_backward(s)) CHECK(w > b, "%s p=%d m=%d stage %d micro %d: W must follow B", name, p, m, st, mb);
                if (f < 0 || b < 0) continue;
                int v = pipeline_virtual_stage(s, st, c);
                if (v > 0) {
                    int before = AT(pipeline_stage_of(s, v - 1), PIPE_FORWARD, mb, pipeline_chunk_of(s, v - 1));
                    CHECK(start[f] >= end[before], "%s p=%d m=%d stage %d micro %d: forward before its input", name, p, m, st, mb);
                }
                int after = v < last ? AT(pipeline_stage_of(s, v + 1), PIPE_BACKWARD, mb, pipeline_chunk_of(s, v + 1)) : f;
                CHECK(start[b] >= end[after], "%s p=%d m=%d stage %d micro %d: backward before its gradient", name, p, m, st, mb);
            }
        }
        check_buffers(s, st, actions + (size_t)st * n, n);
        int peak = pipeline_peak_in_flight(s, actions + (size_t)st * n, n), bound = pipeline_peak_formula(s, st);
        CHECK(peak == bound, "%s p=%d m=%d V=%d stage %d: holds %d, the formula says %d", name, p, m, V, st, peak, bound);
        // the head's micro-batches in flight, on the timeline: at each unit, those of the last
        // virtual stage whose F's group has started (a received input: the group's first action,
        // back over the actions that join it; a local one: the F) and whose last reader (B, or
        // the split's W) has not ended
        int heads = 0;
        for (int c = 0; c < V; c++) {
            int v = pipeline_virtual_stage(s, st, c);
            if (v != last) continue;
            int received = v > 0 && pipeline_stage_of(s, v - 1) != st;
            for (int t = 0; t < length; t++) {
                int now = 0;
                for (int mb = 0; mb < m; mb++) {
                    int f = AT(st, PIPE_FORWARD, mb, c), r = AT(st, pipeline_splits_backward(s) ? PIPE_WEIGHT : PIPE_BACKWARD, mb, c);
                    int g = f;
                    while (received && g > st * n && actions[g].joins) g--;
                    now += f >= 0 && r >= 0 && start[g] <= t && t < end[r];
                }
                heads = now > heads ? now : heads;
            }
        }
        int counted = pipeline_peak_heads(s, st, actions + (size_t)st * n, n);
        CHECK(counted == heads, "%s p=%d m=%d V=%d stage %d: %d heads held, the timeline holds %d", name, p, m, V, st, counted, heads);
        int by_hand = st != 0 ? 0 : s.sched == SCHEDULE_ZBV || p == 1 ? 1 : 2;  // (p 1: F1's input is a local copy)
        CHECK(!pipeline_is_v(s) || heads == by_hand, "%s p=%d m=%d stage %d: %d heads held, by hand %d", name, p, m, st, heads,
              by_hand);
        if (pipeline_is_v(s)) {  // the idle time inside the stage's span: its span less its 6m units of work
            int idle = end[st * n + n - 1] - start[st * n] - 6 * m, expected = pipeline_v_span_idle_formula(s, st);
            CHECK(idle == expected, "%s p=%d m=%d stage %d: idles %d units in its span, the formula %d", name, p, m, st, idle, expected);
        }
    }
#undef AT
    int formula = pipeline_length_formula(s);
    CHECK(length == formula, "%s p=%d m=%d V=%d: the step lasts %d units, the formula %d", name, p, m, V, length, formula);
    char why[256];
    const char* problem = pipeline_check_exchanges(s, actions, n, why, sizeof(why));
    CHECK(problem == NULL, "%s p=%d m=%d V=%d: %s", name, p, m, V, problem);
    // the forward passes alone (validation, sampling) through the same exchanges
    for (int st = 0; st < p; st++) pipeline_forward_actions(s, actions + (size_t)st * per_op);
    problem = pipeline_check_exchanges(s, actions, per_op, why, sizeof(why));
    CHECK(problem == NULL, "forward only, p=%d m=%d V=%d: %s", p, m, V, problem);
    free(actions);
    free(start);
    free(end);
    free(at);
}

// A measured timeline can put two short actions into one column of the chart: both must show.
// Two stages, one micro-batch (afab): stage 0 runs F0 over [0, 0.3) and B0 over [0.35, 1.0), so
// both round to column 0 at one column a unit; stage 1 runs its F0 and B0 in columns 0 and 1.
static void check_draw_keeps_every_action(void) {
    PipeSpec s = {SCHEDULE_AFAB, 2, 1, 1};
    PipeAction actions[4];
    int unit_start[4], unit_end[4];
    pipeline_simulate(s, actions, unit_start, unit_end);
    double start[4] = {0.0, 0.35, 0.0, 1.0}, end[4] = {0.3, 1.0, 1.0, 2.0};
    FILE* f = tmpfile();
    pipeline_draw(f, s, actions, start, end, 1.0, "");
    char chart[512] = "";
    rewind(f);
    size_t got = fread(chart, 1, sizeof(chart) - 1, f);
    chart[got] = '\0';
    fclose(f);
    char* row0 = strstr(chart, "stage 0 |");
    char* row1 = strstr(chart, "stage 1 |");
    CHECK(row0 && row1 && strstr(row0, "F0") && strstr(row0, "F0") < strstr(row0, "B0") && strstr(row0, "B0") < row1,
          "a chart row lost an action of two in one column:\n%s", chart);
    // the rows stay aligned: both as long
    CHECK(row1 && strchr(row0, '\n') - row0 == (long)strlen(row1) - 1, "the chart's rows differ in length:\n%s", chart);
}

// The play with times instead of units (the step-time model's bubble): stages that each take a
// for a chunk's forward and b for its backward finish AFAB and 1F1B in (m + p - 1)(a + b), the
// m micro-batches' busy time of one stage plus the p - 1 forwards and backwards it waits for (the
// unit formula 3 (m + p - 1) is a = 1, b = 2). And by hand, p = 2 stages, one micro-batch,
// messages taking c: F0 on stage 0 [0, a], on stage 1 [a + c, 2a + c], B0 there until 2a + b + c,
// on stage 0 from 2a + b + 2c until 2a + 2b + 2c.
static void check_play_with_times(void) {
    const double a = 0.7, b = 1.9, c = 0.25;
    for (int sched = SCHEDULE_AFAB; sched <= SCHEDULE_1F1B; sched++) {
        for (int p = 1; p <= 6; p++) {
            for (int m = 1; m <= 9; m++) {
                PipeSpec s = {(PipeSchedule)sched, p, m, 1};
                int n = pipeline_actions_per_stage(s);
                PipeAction* actions = (PipeAction*)malloc(sizeof(PipeAction) * p * n);
                double *start = (double*)malloc(sizeof(double) * p * n), *end = (double*)malloc(sizeof(double) * p * n);
                double seconds[3 * 6];
                for (int st = 0; st < p; st++) seconds[st * 3] = a, seconds[st * 3 + 1] = b, seconds[st * 3 + 2] = 0.0;
                double length = pipeline_play(s, actions, seconds, 0.0, start, end), formula = (m + p - 1) * (a + b);
                CHECK(fabs(length - formula) < 1e-9, "%s p=%d m=%d with times %g, %g: %g, expected (m + p - 1)(a + b) = %g",
                      pipe_schedule_names[sched], p, m, a, b, length, formula);
                if (p == 2 && m == 1) {
                    length = pipeline_play(s, actions, seconds, c, start, end);
                    CHECK(fabs(length - (2 * a + 2 * b + 2 * c)) < 1e-9, "%s p=2 m=1 with messages of %g: %g, expected %g",
                          pipe_schedule_names[sched], c, length, 2 * a + 2 * b + 2 * c);
                }
                free(actions);
                free(start);
                free(end);
            }
        }
    }
}

// The play on shared cores (pipeline_play_shared: an action's duration depends on how many stages
// compute at once). With durations that do not depend on that count it is pipeline_play's play,
// every action's start and end, for every schedule (durations differing by stage and op, messages
// of c). By hand, AFAB p = 2, m = 2, an F taking 1 and a B 2 on a stage computing alone, twice
// that while both compute, messages of 0.5: stage 0's F0 [0, 1] alone; its F1 from 1, alone until
// stage 1's F0 starts at 1.5 (half done), then at half speed, done at 2.5; stage 1's F0 from 1.5,
// half of it done by 2.5 at half speed, the rest alone: 3; its F1 (input at 3) [3, 4], B0 [4, 6];
// its B1 from 6, alone until stage 0's B0 starts at 6.5 (a quarter done), then at half speed, 3
// more: 9.5; stage 0's B0 has 3 of its 4 done by then and ends alone at 10; its B1 (input at
// 9.5 + 0.5) [10, 12]. Every stage computing alone would give 9, both at once always 18.
static void check_play_shared(void) {
    const double c = 0.25;
    for (int sched = 0; sched < SCHEDULE_COUNT; sched++) {
        for (int p = 1; p <= 5; p++) {
            for (int m = 1; m <= 10; m++) {
                for (int V = 1; V <= 2; V++) {
                    PipeSpec s = {(PipeSchedule)sched, p, m, V};
                    char why[256];
                    if (pipeline_spec_problem(s, why, sizeof(why)) != NULL) continue;
                    int n = pipeline_actions_per_stage(s);
                    PipeAction* actions = (PipeAction*)malloc(sizeof(PipeAction) * p * n);
                    double* times = (double*)malloc(sizeof(double) * p * n * 4);
                    double *start = times, *end = times + p * n, *start2 = times + 2 * p * n, *end2 = times + 3 * p * n;
                    double seconds[3 * 5], seconds_at[5 * 5 * 3];
                    for (int st = 0; st < p; st++) {
                        for (int op = 0; op < 3; op++) seconds[st * 3 + op] = 0.5 + 0.3 * op + 0.1 * st;
                    }
                    if (!pipeline_splits_backward(s)) for (int st = 0; st < p; st++) seconds[st * 3 + PIPE_WEIGHT] = 0.0;
                    for (int k = 0; k < p; k++) memcpy(seconds_at + k * p * 3, seconds, sizeof(double) * p * 3);
                    double length = pipeline_play(s, actions, seconds, c, start, end);
                    double shared = pipeline_play_shared(s, actions, seconds_at, c, start2, end2);
                    int same = fabs(length - shared) < 1e-9;
                    for (int i = 0; i < p * n; i++) same = same && fabs(start[i] - start2[i]) < 1e-9 && fabs(end[i] - end2[i]) < 1e-9;
                    CHECK(same, "%s p=%d m=%d V=%d: the shared play with durations that do not depend on the stages at once "
                          "lasts %g, pipeline_play %g (or an action starts or ends elsewhere)", pipe_schedule_names[sched], p, m, V,
                          shared, length);
                    free(actions);
                    free(times);
                }
            }
        }
    }
    PipeSpec s = {SCHEDULE_AFAB, 2, 2, 1};
    PipeAction actions[8];
    double start[8], end[8];
    double seconds_at[2 * 2 * 3] = {1, 2, 0, 1, 2, 0, 2, 4, 0, 2, 4, 0};  // (k = 1: F 1, B 2; k = 2: twice)
    for (int st = 0; st < 2; st++) pipeline_stage_actions(s, st, actions + st * 4);
    double length = pipeline_play_shared(s, actions, seconds_at, 0.5, start, end);
    // stage 0's list F0 F1 B0 B1 is actions 0..3, stage 1's 4..7
    const double want_end[8] = {1, 2.5, 10, 12, 3, 4, 6, 9.5};
    for (int i = 0; i < 8; i++) {
        CHECK(fabs(end[i] - want_end[i]) < 1e-12, "shared play by hand: stage %d's action %d ends at %g, expected %g", i / 4, i % 4,
              end[i], want_end[i]);
    }
    CHECK(fabs(length - 12) < 1e-12, "shared play by hand: %g, expected 12", length);
}

int main(void) {
    int cases = 0;
    check_draw_keeps_every_action();
    check_play_with_times();
    check_play_shared();
    for (int sched = 0; sched < SCHEDULE_COUNT; sched++) {
        for (int p = 1; p <= 8; p++) {
            for (int m = 1; m <= (sched >= SCHEDULE_ZBV ? 20 : 16); m++) {
                for (int V = 1; V <= 3; V++) {
                    PipeSpec s = {(PipeSchedule)sched, p, m, V};
                    char why[256];
                    if (pipeline_spec_problem(s, why, sizeof(why)) != NULL) continue;
                    check_schedule(s);
                    cases++;
                }
            }
        }
    }
    char why[256];
    PipeSpec odd = {SCHEDULE_INTERLEAVED, 4, 6, 2}, chunked = {SCHEDULE_1F1B, 2, 4, 2};
    CHECK(pipeline_spec_problem(odd, why, sizeof(why)) != NULL && strstr(why, "multiple of 4"), "interleaved m=6 p=4 refused");
    CHECK(pipeline_spec_problem(chunked, why, sizeof(why)) != NULL && strstr(why, "-vp 2"), "1f1b with chunks refused");
    CHECK(pipeline_schedule_from_name("1f1b") == SCHEDULE_1F1B && pipeline_schedule_from_name("gpipe") == -1, "schedule names");
    // the V schedules' rules, each named; m = p is refused by both (p >= 2)
    PipeSpec short_zbv = {SCHEDULE_ZBV, 4, 6, 2}, short_dualpipev = {SCHEDULE_DUALPIPEV, 4, 7, 2}, one_chunk = {SCHEDULE_ZBV, 2, 8, 1};
    CHECK(pipeline_spec_problem(short_zbv, why, sizeof(why)) != NULL && strstr(why, "at least 2p - 1"), "zbv m=6 p=4 refused");
    CHECK(pipeline_spec_problem(short_dualpipev, why, sizeof(why)) != NULL && strstr(why, "at least 2p"), "dualpipev m=7 p=4 refused");
    CHECK(pipeline_spec_problem(one_chunk, why, sizeof(why)) != NULL && strstr(why, "exactly 2 chunks"), "zbv V=1 refused");
    for (int p = 2; p <= 8; p++) {
        PipeSpec zbv = {SCHEDULE_ZBV, p, p, 2}, dualpipev = {SCHEDULE_DUALPIPEV, p, p, 2};
        CHECK(pipeline_spec_problem(zbv, why, sizeof(why)) && pipeline_spec_problem(dualpipev, why, sizeof(why)), "m = p = %d refused", p);
    }
    CHECK(pipeline_schedule_from_name("zbv") == SCHEDULE_ZBV && pipeline_schedule_from_name("dualpipev") == SCHEDULE_DUALPIPEV,
          "the V schedules' names");
    PipeSpec shown[6] = {{SCHEDULE_AFAB, 4, 8, 1}, {SCHEDULE_1F1B, 4, 8, 1}, {SCHEDULE_INTERLEAVED, 4, 8, 2}, {SCHEDULE_ZB, 4, 8, 1},
                         {SCHEDULE_ZBV, 4, 8, 2}, {SCHEDULE_DUALPIPEV, 4, 8, 2}};
    for (int i = 0; i < 6; i++) pipeline_print_chart(shown[i]);
    printf("%d schedules checked, %d failures\n", cases, failures);
    if (failures == 0) printf("pipeline ok\n");
    return failures != 0;
}
