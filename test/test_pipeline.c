// Unit tests of the pipeline schedules (llmc/pipeline.h) for p = 1..8 stages and m = 1..16
// micro-batches, on the timeline that unit-time actions give (forward 1, backward 2):
//   - every stage runs each micro-batch's forward and backward exactly once, forward first;
//   - a forward starts after the previous stage's forward of that micro-batch ended, a backward
//     after the next stage's backward (the last stage's after its own forward), and a stage runs
//     one action at a time;
//   - the step lasts 3 (m + p - 1) units: the bubble is the formula's (p - 1) / (m + p - 1);
//   - stage s holds at most m micro-batches under afab and min(p - s, m) under 1f1b.
// Prints the charts of p = 4, m = 8. Checked values come from the formulas, not from a run.
#include <stdio.h>
#include "llmc/pipeline.h"

static int failures = 0;
#define CHECK(cond, ...) do { if (!(cond)) { failures++; printf("FAIL: " __VA_ARGS__); printf("\n"); } } while (0)

static void check_schedule(PipeSchedule sched, int p, int m) {
    const char* name = pipe_schedule_names[sched];
    int per_stage = 2 * m;
    PipeAction* actions = (PipeAction*)malloc_check((size_t)p * per_stage * sizeof(PipeAction));
    int* start = (int*)malloc_check((size_t)p * per_stage * sizeof(int));
    int* end = (int*)malloc_check((size_t)p * per_stage * sizeof(int));
    int length = pipeline_simulate(sched, p, m, actions, start, end);
    // where (index into the arrays) each stage's forward and backward of each micro-batch sits
    int* at_forward = (int*)malloc_check((size_t)p * m * sizeof(int));
    int* at_backward = (int*)malloc_check((size_t)p * m * sizeof(int));
    for (int i = 0; i < p * m; i++) at_forward[i] = at_backward[i] = -1;
    for (int s = 0; s < p; s++) {
        for (int k = 0; k < per_stage; k++) {
            int i = s * per_stage + k;
            PipeAction a = actions[i];
            CHECK(a.micro >= 0 && a.micro < m, "%s p=%d m=%d stage %d: micro-batch %d", name, p, m, s, a.micro);
            int* at = a.op == PIPE_FORWARD ? at_forward : at_backward;
            CHECK(at[s * m + a.micro] < 0, "%s p=%d m=%d stage %d: micro-batch %d twice", name, p, m, s, a.micro);
            at[s * m + a.micro] = i;
            CHECK(k == 0 || start[i] >= end[i - 1], "%s p=%d m=%d stage %d: two actions at once", name, p, m, s);
        }
    }
    for (int s = 0; s < p; s++) {
        for (int mb = 0; mb < m; mb++) {
            int f = at_forward[s * m + mb], b = at_backward[s * m + mb];
            CHECK(f >= 0 && b >= 0 && f < b, "%s p=%d m=%d stage %d micro %d: forward must precede backward", name, p, m, s, mb);
            if (f < 0 || b < 0) continue;
            if (s > 0) CHECK(start[f] >= end[at_forward[(s - 1) * m + mb]], "%s p=%d m=%d stage %d micro %d: forward before its input", name, p, m, s, mb);
            if (s < p - 1) CHECK(start[b] >= end[at_backward[(s + 1) * m + mb]], "%s p=%d m=%d stage %d micro %d: backward before its gradient", name, p, m, s, mb);
        }
        int peak = pipeline_peak_in_flight(actions + (size_t)s * per_stage, per_stage);
        int bound = sched == SCHEDULE_AFAB ? m : (p - s < m ? p - s : m);
        CHECK(peak == bound, "%s p=%d m=%d stage %d: holds %d micro-batches, the schedule promises %d", name, p, m, s, peak, bound);
    }
    CHECK(length == 3 * (m + p - 1), "%s p=%d m=%d: the step lasts %d units, the formula 3 (m + p - 1) = %d", name, p, m, length, 3 * (m + p - 1));
    free(actions);
    free(start);
    free(end);
    free(at_forward);
    free(at_backward);
}

int main(void) {
    int cases = 0;
    for (int sched = SCHEDULE_AFAB; sched <= SCHEDULE_1F1B; sched++) {
        for (int p = 1; p <= 8; p++) {
            for (int m = 1; m <= 16; m++, cases++) check_schedule((PipeSchedule)sched, p, m);
        }
    }
    CHECK(pipeline_schedule_from_name("1f1b") == SCHEDULE_1F1B && pipeline_schedule_from_name("gpipe") == -1, "schedule names");
    pipeline_print_chart(SCHEDULE_AFAB, 4, 8);
    pipeline_print_chart(SCHEDULE_1F1B, 4, 8);
    printf("%d schedules checked, %d failures\n", cases, failures);
    if (failures == 0) printf("pipeline ok\n");
    return failures != 0;
}
