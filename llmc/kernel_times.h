// Where a step's time goes, kernel by kernel: with LLMC_KERNEL_TIMES=1 in the environment, every
// op launcher (matmul, attention, LayerNorm, GELU, the classifier, AdamW, ...) puts a pair of
// marks on the device's timeline around its kernels, and the run ends with a table of each kind
// of launch: calls a step, milliseconds a step and its share of the step. What the table leaves
// over is time the device spent outside every launcher: waiting for the host (its copies, the
// loss read back, the encoder backward's sort), for collectives, or between launches.
//
// dev/bench/roofline.py -measured reads the table and prints each row beside the time that kind
// of kernel would take at its roofline, so the gap between a step and its lower bound is named
// kernel by kernel. On a GPU a mark is a CUDA event (recording ~1000 a step costs the host a few
// ms, which the GPU hides while it runs behind); on the CPU it is the wall time.
//
// A kind is the launcher's op and, for a matmul, its weight's shape (C -> OC: qkv is C -> 3C, the
// LM head C -> Vp): every layer's qkv forward is one row. Launchers nest (a weight gradient's
// bias kernels, a memset inside a launcher): only the outermost is timed, so no time counts twice.
// Included by the device headers (cuda/device.cuh, cpu/device.h), after DeviceMark.
#ifndef LLMC_KERNEL_TIMES_H
#define LLMC_KERNEL_TIMES_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KERNEL_KINDS_MAX 128

typedef struct {
    char name[64];
    long calls;      // in the counted steps
    double seconds;  // likewise
} KernelKind;

static struct {
    int asked, on;           // the environment was read; LLMC_KERNEL_TIMES=1 asks for the times
    int depth;               // launchers open now (only the outermost is timed)
    KernelKind kinds[KERNEL_KINDS_MAX];
    int num_kinds;           // in order of first launch: the step's order
    DeviceMark* marks;       // this step's spans: marks 2 i and 2 i + 1 around span i
    int* span_kind;
    int spans, capacity;
    int steps;               // counted steps (the first, which warms up, is not)
    double step_seconds;     // their total
} kernel_times;

static inline int kernel_times_on(void) {
    if (!kernel_times.asked) {
        kernel_times.on = env_choice("LLMC_KERNEL_TIMES", 0) == 1;  // (any other value: an error, not silently off)
        kernel_times.asked = 1;
    }
    return kernel_times.on;
}

// Before a launcher's kernels: returns the span to end, or -1 when not timing. op names the kind;
// C and OC (a matmul's weight: C inputs, OC outputs) join the name when OC > 0.
static inline int kernel_time_begin(const char* op, int C, int OC) {
    if (!kernel_times_on() || kernel_times.depth++ > 0) return -1;
    char name[64];
    if (OC > 0) snprintf(name, sizeof(name), "%s %d->%d", op, C, OC);
    else snprintf(name, sizeof(name), "%s", op);
    int kind = 0;
    while (kind < kernel_times.num_kinds && strcmp(kernel_times.kinds[kind].name, name) != 0) kind++;
    if (kind == kernel_times.num_kinds) {
        if (kind == KERNEL_KINDS_MAX) fail("LLMC_KERNEL_TIMES: more than %d kinds of launch", KERNEL_KINDS_MAX);
        snprintf(kernel_times.kinds[kind].name, sizeof(kernel_times.kinds[kind].name), "%s", name);
        kernel_times.num_kinds++;
    }
    if (kernel_times.spans == kernel_times.capacity) {  // grow the pool of marks, two a span
        int cap = kernel_times.capacity ? 2 * kernel_times.capacity : 1024;
        kernel_times.marks = (DeviceMark*)realloc(kernel_times.marks, (size_t)cap * 2 * sizeof(DeviceMark));
        kernel_times.span_kind = (int*)realloc(kernel_times.span_kind, (size_t)cap * sizeof(int));
        if (!kernel_times.marks || !kernel_times.span_kind) fail("LLMC_KERNEL_TIMES: out of host memory for marks");
        for (int i = 2 * kernel_times.capacity; i < 2 * cap; i++) device_mark_create(&kernel_times.marks[i]);
        kernel_times.capacity = cap;
    }
    int span = kernel_times.spans++;
    kernel_times.span_kind[span] = kind;
    device_mark_record(&kernel_times.marks[2 * span]);
    return span;
}

// after the launcher's kernels, with what kernel_time_begin returned
static inline void kernel_time_end(int span) {
    if (!kernel_times.on) return;
    kernel_times.depth--;
    if (span >= 0) device_mark_record(&kernel_times.marks[2 * span + 1]);
}

// a span opened for work that then did not happen there (a fused path that fell back to the
// separate launchers, which time themselves): it is forgotten, so that no call counts twice
static inline void kernel_time_drop(int span) {
    if (!kernel_times.on) return;
    kernel_times.depth--;
    if (span >= 0) kernel_times.spans--;  // the most recent span: nothing was opened after it
}

// a step begins: what was timed since the last step (validation, samples) is not a step's
static inline void kernel_times_step_begin(void) { kernel_times.spans = 0; }

// a step has ended and the device has finished it: its spans into the kinds' totals, unless it
// is the first step (cuBLASLt's first calls choose algorithms, memory is touched the first time)
static inline void kernel_times_step_end(int counted, double step_seconds) {
    if (!kernel_times.on) return;
    if (counted) {
        for (int i = 0; i < kernel_times.spans; i++) {
            KernelKind* k = &kernel_times.kinds[kernel_times.span_kind[i]];
            k->seconds += device_marks_seconds(&kernel_times.marks[2 * i], &kernel_times.marks[2 * i + 1]);
            k->calls++;
        }
        kernel_times.steps++;
        kernel_times.step_seconds += step_seconds;
    }
    kernel_times.spans = 0;
}

// the table, per step (kinds never launched inside a counted step are left out)
static inline void kernel_times_print(int rank) {
    if (!kernel_times.on) return;
    if (kernel_times.steps == 0) {  // (-x 1: the one step warmed up)
        printf("kernel times on rank %d (LLMC_KERNEL_TIMES=1): none, the run's one step warmed up and is not "
               "counted: run 2 steps or more (-x)\n", rank);
        return;
    }
    int n = kernel_times.steps;
    double step = kernel_times.step_seconds / n, timed = 0.0;
    printf("kernel times on rank %d (LLMC_KERNEL_TIMES=1), per step, the mean of %d steps after the first:\n", rank, n);
    printf("  %-44s %10s %10s %7s\n", "kind of launch (matmul: weight C->OC)", "calls", "ms", "share");
    for (int i = 0; i < kernel_times.num_kinds; i++) {
        const KernelKind* k = &kernel_times.kinds[i];
        if (k->calls == 0) continue;
        printf("  %-44s %10.1f %10.3f %6.1f%%\n", k->name, (double)k->calls / n, k->seconds / n * 1e3,
               100.0 * k->seconds / n / step);
        timed += k->seconds / n;
    }
    printf("  %-44s %10s %10.3f %6.1f%%\n", "outside the launchers (host, waits, gaps)", "", (step - timed) * 1e3,
           100.0 * (step - timed) / step);
    printf("  %-44s %10s %10.3f %6.1f%%\n", "step", "", step * 1e3, 100.0);
}

#endif
