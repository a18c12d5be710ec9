// Pipeline schedules as pure functions: which action each stage takes next. A pipeline of p
// stages runs m micro-batches per step; stage s holds a contiguous range of layers. The trainer
// (train_gpt2_pp.cu) walks its stage's list of actions, receiving a micro-batch's activations from
// stage s-1 before its forward and its gradient from stage s+1 before its backward.
//   afab   all forward, all backward (GPipe, Huang et al. 2019): every stage keeps the
//          activations of all m micro-batches until the backward passes start
//   1f1b   one forward, one backward (PipeDream-Flush, Narayanan et al. 2021): stage s runs
//          p - s - 1 warm-up forwards, then alternates, so it holds at most p - s micro-batches
// Both leave the same bubble: with a forward taking 1 unit and a backward 2, a step lasts
// 3 (m + p - 1) units of which each stage is busy 3 m, so (p - 1) / (m + p - 1) of the time idles.
// 1F1B's gain is memory, not time. (Interleaved 1F1B and zero-bubble schedules come next.)
#ifndef LLMC_PIPELINE_H
#define LLMC_PIPELINE_H

#include <stdio.h>
#include <string.h>
#include "utils.h"

typedef enum { PIPE_FORWARD, PIPE_BACKWARD } PipeOp;
typedef enum { SCHEDULE_AFAB, SCHEDULE_1F1B } PipeSchedule;

typedef struct {
    PipeOp op;
    int micro;  // the micro-batch, 0 .. m-1
} PipeAction;

static const char* pipe_schedule_names[] = {"afab", "1f1b"};

static inline PipeAction pipe_action(PipeOp op, int micro) {
    PipeAction a;
    a.op = op;
    a.micro = micro;
    return a;
}

// -sched's value; -1 when it names no schedule
static inline int pipeline_schedule_from_name(const char* name) {
    for (int i = 0; i < (int)(sizeof(pipe_schedule_names) / sizeof(pipe_schedule_names[0])); i++) {
        if (strcmp(name, pipe_schedule_names[i]) == 0) return i;
    }
    return -1;
}

// Stage s's actions in the order it runs them: 2 m of them, each micro-batch's forward and
// backward once. Returns the count.
static inline int pipeline_stage_actions(PipeSchedule sched, int p, int s, int m, PipeAction* out) {
    int n = 0;
    // afab: no backward until every forward is done; 1f1b: the forwards that fill the pipe below
    // this stage (the last stage needs none, its first forward can go straight back)
    int warmup = sched == SCHEDULE_AFAB ? m : (p - s - 1 < m ? p - s - 1 : m);
    int forwards = 0, backwards = 0;
    for (; forwards < warmup; forwards++) out[n++] = pipe_action(PIPE_FORWARD, forwards);
    while (forwards < m) {  // steady state: one forward, then the oldest backward
        out[n++] = pipe_action(PIPE_FORWARD, forwards++);
        out[n++] = pipe_action(PIPE_BACKWARD, backwards++);
    }
    while (backwards < m) out[n++] = pipe_action(PIPE_BACKWARD, backwards++);  // cool-down
    return n;
}

// ---------------------------------------------------------------------------------------------
// The schedule played out with a forward taking 1 time unit and a backward 2 (it computes the
// gradients of both the inputs and the weights): each stage runs its list in order, and an
// action starts once its stage is free and its input is there (a forward after the previous
// stage's forward of that micro-batch, a backward after the next stage's backward). start and
// end are (p, 2 m): the times of stage s's action k at [s * 2m + k]. Returns the step's length
// in units; stops the program if the schedule deadlocks (a wrong schedule, never a valid one).

#define PIPE_FORWARD_UNITS 1
#define PIPE_BACKWARD_UNITS 2

static inline int pipeline_simulate(PipeSchedule sched, int p, int m, PipeAction* actions, int* start, int* end) {
    int per_stage = 2 * m;
    int* forward_done = (int*)malloc_check((size_t)p * m * sizeof(int));   // end time, -1: not yet
    int* backward_done = (int*)malloc_check((size_t)p * m * sizeof(int));
    int* next = (int*)calloc_check((size_t)p, sizeof(int));                // each stage's next action
    int* free_at = (int*)calloc_check((size_t)p, sizeof(int));
    for (int i = 0; i < p * m; i++) forward_done[i] = backward_done[i] = -1;
    for (int s = 0; s < p; s++) pipeline_stage_actions(sched, p, s, m, actions + (size_t)s * per_stage);
    int remaining = p * per_stage, length = 0;
    while (remaining > 0) {
        int progress = 0;
        for (int s = 0; s < p; s++) {
            if (next[s] == per_stage) continue;
            PipeAction a = actions[s * per_stage + next[s]];
            int ready;  // when its input arrives: from the stage before (forward) or after (backward)
            if (a.op == PIPE_FORWARD) ready = s == 0 ? 0 : forward_done[(s - 1) * m + a.micro];
            else ready = s == p - 1 ? forward_done[s * m + a.micro] : backward_done[(s + 1) * m + a.micro];
            if (ready < 0) continue;
            int k = s * per_stage + next[s];
            start[k] = ready > free_at[s] ? ready : free_at[s];
            end[k] = start[k] + (a.op == PIPE_FORWARD ? PIPE_FORWARD_UNITS : PIPE_BACKWARD_UNITS);
            (a.op == PIPE_FORWARD ? forward_done : backward_done)[s * m + a.micro] = end[k];
            free_at[s] = end[k];
            length = end[k] > length ? end[k] : length;
            next[s]++;
            remaining--;
            progress = 1;
        }
        if (!progress) fail("pipeline schedule %s deadlocks at p=%d, m=%d", pipe_schedule_names[sched], p, m);
    }
    free(forward_done);
    free(backward_done);
    free(next);
    free(free_at);
    return length;
}

// the most micro-batches whose activations stage s holds at once (forwards done, backwards not)
static inline int pipeline_peak_in_flight(const PipeAction* stage_actions, int count) {
    int held = 0, peak = 0;
    for (int k = 0; k < count; k++) {
        held += stage_actions[k].op == PIPE_FORWARD ? 1 : -1;
        peak = held > peak ? held : peak;
    }
    return peak;
}

// The schedule as a chart, one row per stage and one column per time unit, as the Ultra-Scale
// Playbook draws it: F3 is micro-batch 3's forward, B3 its backward (two units), . an idle unit.
// Below it the idle share beside the schedule's formula.
static inline void pipeline_print_chart(PipeSchedule sched, int p, int m) {
    PipeAction* actions = (PipeAction*)malloc_check((size_t)p * 2 * m * sizeof(PipeAction));
    int* start = (int*)malloc_check((size_t)p * 2 * m * sizeof(int));
    int* end = (int*)malloc_check((size_t)p * 2 * m * sizeof(int));
    int length = pipeline_simulate(sched, p, m, actions, start, end);
    printf("schedule %s, p=%d stages, m=%d micro-batches (F: forward, 1 unit; B: backward, 2 units):\n",
           pipe_schedule_names[sched], p, m);
    char* row = (char*)malloc_check((size_t)length * 4 + 1);
    for (int s = 0; s < p; s++) {
        for (int t = 0; t < length; t++) memcpy(row + 4 * t, " .  ", 4);
        for (int k = 0; k < 2 * m; k++) {
            int i = s * 2 * m + k;
            for (int t = start[i]; t < end[i]; t++) {
                char cell[8];
                snprintf(cell, sizeof(cell), "%c%-3d", actions[i].op == PIPE_FORWARD ? 'F' : 'B', actions[i].micro);
                memcpy(row + 4 * t, cell, 4);
            }
        }
        row[4 * length] = '\0';
        printf("  stage %d |%s| holds at most %d\n", s, row, pipeline_peak_in_flight(actions + (size_t)s * 2 * m, 2 * m));
    }
    double busy = (double)m * (PIPE_FORWARD_UNITS + PIPE_BACKWARD_UNITS);
    printf("  idle: %.1f%% of the step; formula (p-1)/(m+p-1) = %.1f%%\n", 100.0 * (1.0 - busy / length),
           100.0 * (p - 1) / (m + p - 1));
    free(row);
    free(actions);
    free(start);
    free(end);
}

#endif
