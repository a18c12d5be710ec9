// The run around the training step, the same in every trainer: the common flags, the model's
// config, the memory check, the data, the run's identity and the output dir's lock, resuming,
// the log, validation, samples and checkpoints between steps, the step's timing and its line,
// and the teardown. A trainer's main() calls these in order and writes in between only what its
// strategy does differently: its groups, its layout of the model, and the step itself.
//
//   Run run;
//   if (!run_start(&run, &argc, &argv, own_flags, n)) return 0;  // flags, MPI/NCCL, the config
//   RunLayout layout = run_layout(&run, TRAINER_TP, accum);          // + the trainer's own fields
//   run_check_memory(&run, layout, stage, "what this rank holds");   // before any allocation
//   float* weights = run_load(&run, train_chunks, val_chunks, "the layout, for resumes");
//   ... build the model, print the layout ...
//   run_begin(&run, model_hooks, groups, num_groups);                // resume, log, step report
//   for (int step = run.start_step; step <= run.max_steps; step++) {
//       if (run_between_steps(&run, step)) break;                    // validation, sample, checkpoint
//       run_step_begin(&run);
//       ... forward, backward, the collectives, AdamW ...
//       run_step_end(&run, step, loss, lr, grad_norm, clip_scale);   // the step line, main.log
//   }
//   run_end(&run);
#ifndef LLMC_RUN_H
#define LLMC_RUN_H

#include <stdarg.h>
#include "block.h"
#include "hellaswag.h"
#include "memory.h"
#include "memory_plan.h"
#include "profile_default.h"
#include "step_time.h"
#include "train.h"

// ---------------------------------------------------------------------------------------------
// what a trainer prints: the banner (label | value rows), the parameter layout and the step line
// (the memory table: memory_plan.h). Each trainer chooses its rows; the formatting is shared.

typedef struct {
    const char* label;
    char value[96];
} BannerRow;

static inline void banner_row(BannerRow* row, const char* label, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    row->label = label;
    vsnprintf(row->value, sizeof(row->value), fmt, ap);
    va_end(ap);
}

// (the value column 50 characters wide, or as wide as its longest value)
static inline void train_print_banner(const BannerRow* rows, int n) {
    int width = 50;
    for (int i = 0; i < n; i++) width = (int)strlen(rows[i].value) > width ? (int)strlen(rows[i].value) : width;
    char rule[160] = "+-----------------------+";
    for (int i = 0; i < width + 2; i++) strcat(rule, "-");
    strcat(rule, "+");
    printf("%s\n", rule);
    for (int i = 0; i < n; i++) printf("| %-21s | %-*s |\n", rows[i].label, width, rows[i].value);
    printf("%s\n", rule);
}

// the model rows every trainer's banner starts with
static inline int train_banner_model(BannerRow* rows, const char* title, const char* model, GPT2Config c) {
    banner_row(&rows[0], title, "backend %s, precision %s", BACKEND_NAME, PRECISION_NAME);
    banner_row(&rows[1], "model", "%s", model);
    banner_row(&rows[2], "L, NH, C", "%d, %d, %d", c.num_layers, c.num_heads, c.channels);
    banner_row(&rows[3], "maxT, V, Vp", "%d, %d, %d", c.max_seq_len, c.vocab_size, c.padded_vocab_size);
    banner_row(&rows[4], "parameters", "%zu", gpt2_num_parameters(c));
    return 5;
}

// one row per tensor: its size in the model, and with tensor parallelism this rank's part of it
// and how the tensor is split
static inline void train_print_parameter_layout(GPT2Config c, const ParameterLayout* p) {
    static const char* how[NUM_PARAMETER_TENSORS] = {
        "rows: this rank's vocabulary (embedding and LM head)", "", "", "",
        "rows: q, k, v of this rank's heads (column-parallel)", "rows: q, k, v of this rank's heads",
        "input columns: this rank's heads (row-parallel)", "", "", "", "",
        "rows: this rank's 4C/tp (column-parallel)", "rows: this rank's 4C/tp",
        "input columns: this rank's 4C/tp (row-parallel)", "", "", ""};
    size_t sizes[NUM_PARAMETER_TENSORS];
    gpt2_parameter_sizes(sizes, c);
    printf("parameter layout (one flat buffer per rank; gradients and AdamW moments share it):\n");
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        if (sizes[i] == 0) continue;  // (the router of a dense model)
        const char* wd = parameter_is_matrix[i] ? "  (weight decay)" : "";
        if (p->tp == 1) printf("  %-9s %12zu%s\n", parameter_names[i], sizes[i], wd);
        else printf("  %-9s %12zu  this rank %12zu  %s%s\n", parameter_names[i], sizes[i], p->sizes[i],
                    p->sharded[i] ? how[i] : "replicated", wd);
    }
}

// The step's report. On the terminal one line of what a user watches every step: the loss, the
// gradient norm (and the clip factor when clipping acts), the learning rate, the step's time and
// throughput, and with several ranks the time the rank waited in collectives (exposed: not hidden
// behind computation). About 100 characters; under 120 while steps < 10^5, a step < 10 s, the
// norm < 100 and tok/s < 10^7. The bytes of each collective, per group, print after the first
// step (beside the formula the trainer printed at the start) and again only when they change.
// main.log keeps every figure of every step (logger.h).
typedef struct {
    int step, max_steps;
    float loss, lr, grad_norm, clip_scale;
    double seconds, recompute_seconds;  // the step, and its part recomputing activations (-r)
    double tokens_per_s, mfu_percent;   // over all ranks; MFU 0 where the peak is unknown (CPU)
    const char* extra;                  // the trainer's own figures, JSON fields for main.log ("" if none)
    uint64_t memory_peak, memory_predicted;  // this rank's device allocations at their most so far, and
                                             // the memory table's total (main.log: what dev/memory.html reads)
    double predicted_seconds;  // the step as llmc/step_time.h predicts it (0: no profile; null in main.log)
} StepFigures;

#define STEP_MAX_GROUPS 12
typedef struct {
    CommGroup* groups[STEP_MAX_GROUPS];  // the groups this rank communicates in during a step
    int num_groups;
    long long printed[STEP_MAX_GROUPS][COMM_NUM_KINDS];  // the bytes printed last, -1 before
    unsigned own_line[STEP_MAX_GROUPS];  // bit k: kind k's bytes, which the trainer prints on a line
                                         // of its own every step, left out (run_bytes_on_own_line)
} StepReport;

static inline StepReport step_report_init(CommGroup** groups, int num_groups) {
    StepReport r;
    memset(&r, 0, sizeof(r));
    if (num_groups > STEP_MAX_GROUPS) fail("step report: %d groups, at most %d", num_groups, STEP_MAX_GROUPS);
    for (int i = 0; i < num_groups; i++) r.groups[i] = groups[i];
    r.num_groups = num_groups;
    memset(r.printed, 0xff, sizeof(r.printed));  // -1: nothing printed yet
    return r;
}

// the step's communication, summed over the groups: bytes handed to collectives and sends, bytes
// the rank puts on the link (comm_ring_bytes: collectives as rings, sends whole), time from post
// to completion (flight) and time the rank waited (exposed)
static inline void step_comm_totals(const StepReport* r, long long* bytes, double* ring, double* flight,
                                    double* exposed) {
    *bytes = 0, *ring = 0.0, *flight = 0.0, *exposed = 0.0;
    for (int i = 0; i < r->num_groups; i++) {
        *bytes += comm_total_bytes(r->groups[i]);
        *ring += comm_ring_bytes(r->groups[i]);
        *flight += r->groups[i]->flight_seconds;
        *exposed += comm_seconds(r->groups[i]);
    }
}

// the per-collective bytes of every group with traffic, when they differ from those printed last
// (a group of one rank moves nothing over a link, whatever its calls count: its line is left out,
// and a run of one process says so instead of "(ring 0 B)")
static inline void step_print_bytes_if_changed(StepReport* r, int step) {
    // the bytes as shown: a kind the trainer prints on a line of its own counts as 0 here
    long long shown[STEP_MAX_GROUPS][COMM_NUM_KINDS];
    int changed = 0, linked = 0;
    for (int i = 0; i < r->num_groups; i++) {
        const CommGroup* g = r->groups[i];
        long long total = 0;
        for (int k = 0; k < COMM_NUM_KINDS; k++) {
            shown[i][k] = (r->own_line[i] >> k & 1) ? 0 : g->bytes[k];
            total += shown[i][k];
        }
        changed |= memcmp(r->printed[i], shown[i], sizeof(r->printed[i])) != 0;
        linked |= g->size > 1 && total > 0;
    }
    if (!changed) return;
    printf("bytes this rank moved per step, from step %d %s:\n", step,
           linked ? "(ring: what it sends, every collective a ring)" : "(none crosses a link: every group here is of one rank)");
    for (int i = 0; i < r->num_groups; i++) {
        const CommGroup* g = r->groups[i];
        memcpy(r->printed[i], shown[i], sizeof(r->printed[i]));
        long long total = 0;
        for (int k = 0; k < COMM_NUM_KINDS; k++) total += shown[i][k];
        if (total == 0 || g->size == 1) continue;
        printf("  %-9s", g->name);
        const char* separator = "";  // (a comma before every kind but the group's first)
        for (int k = 0; k < COMM_NUM_KINDS; k++) {
            if (shown[i][k] == 0) continue;
            printf("%s %s %lld B", separator, comm_kind_names[k], shown[i][k]);
            separator = ",";
        }
        // (sends and all-to-alls pass whole in the ring figure: one printed elsewhere leaves it)
        double ring = comm_ring_bytes(g) - (double)(g->bytes[COMM_SEND] - shown[i][COMM_SEND]) -
                      (double)(g->bytes[COMM_ALL_TO_ALL] - shown[i][COMM_ALL_TO_ALL]);
        printf(" (ring %.0f B)\n", ring);
    }
}

// the step line on rank 0, and the step's record in main.log (the logger is open on rank 0 only)
static inline void step_report(StepReport* r, Logger* log, int rank, StepFigures f) {
    long long bytes;
    double ring, flight, exposed;
    step_comm_totals(r, &bytes, &ring, &flight, &exposed);
    if (rank == 0) {
        char clip[32] = "", comm[48] = "";
        if (f.clip_scale < 1.0f) snprintf(clip, sizeof(clip), " (clip %.2f)", f.clip_scale);
        int ranks = 0;
        for (int i = 0; i < r->num_groups; i++) ranks = r->groups[i]->size > ranks ? r->groups[i]->size : ranks;
        if (ranks > 1) snprintf(comm, sizeof(comm), " | exposed %.1f ms", exposed * 1e3);
        printf("step %4d/%d | loss %.6f | norm %.4f%s | lr %.2e | %.1f ms | %.0f tok/s%s\n", f.step, f.max_steps, f.loss,
               f.grad_norm, clip, f.lr, f.seconds * 1e3, f.tokens_per_s, comm);
        step_print_bytes_if_changed(r, f.step);
    }
    if (!log->file) return;
    char loss[32], lr[32], norm[32], predicted[32] = "null", kinds[STEP_MAX_GROUPS * 160] = "";
    if (f.predicted_seconds > 0) snprintf(predicted, sizeof(predicted), "%.3f", f.predicted_seconds * 1e3);
    size_t used = 0;
    for (int i = 0; i < r->num_groups; i++) {
        const CommGroup* g = r->groups[i];
        used += snprintf(kinds + used, sizeof(kinds) - used, "%s\"%s\": {", i ? ", " : "", g->name);
        int first = 1;
        for (int k = 0; k < COMM_NUM_KINDS; k++) {
            if (g->bytes[k] == 0) continue;
            used += snprintf(kinds + used, sizeof(kinds) - used, "%s\"%s\": %lld", first ? "" : ", ", comm_kind_names[k], g->bytes[k]);
            first = 0;
        }
        used += snprintf(kinds + used, sizeof(kinds) - used, "}");
    }
    logger_line(log, "{\"step\": %d, \"train_loss\": %s, \"lr\": %s, \"grad_norm\": %s, \"clip_scale\": %.9g, "
                "\"ms\": %.3f, \"recompute_ms\": %.3f, \"tokens_per_s\": %.1f, \"mfu_percent\": %.2f, "
                "\"comm_bytes\": %lld, \"comm\": {%s}, \"ring_bytes\": %.0f, \"comm_ms\": %.3f, \"exposed_ms\": %.3f, "
                "\"memory_peak\": %llu, \"memory_predicted\": %llu, \"predicted_ms\": %s%s%s}\n",
                f.step, json_float(loss, 32, f.loss), json_float(lr, 32, f.lr), json_float(norm, 32, f.grad_norm),
                f.clip_scale, f.seconds * 1e3, f.recompute_seconds * 1e3, f.tokens_per_s, f.mfu_percent, bytes, kinds,
                ring, flight * 1e3, exposed * 1e3, (unsigned long long)f.memory_peak, (unsigned long long)f.memory_predicted,
                predicted, f.extra[0] ? ", " : "", f.extra);
}


// this device's dense peak for MFU (none on the CPU), named by rank 0
static inline DevicePeak train_device_peak(int rank) {
    DevicePeak peak = device_peak();
    if (rank == 0 && peak.flops > 0)
        printf("MFU against the %s dense %s peak, %.0f TFLOP/s\n", peak.part, PRECISION_NAME, peak.flops / 1e12);
    return peak;
}

// MFU in percent: the model FLOPs of tokens_per_s, shared by `ranks` devices, against one
// device's dense peak (0 where the peak is unknown: CPUs, other GPUs)
static inline double train_mfu(double flops_per_token, double tokens_per_s, int ranks, DevicePeak peak) {
    return peak.flops > 0 ? 100.0 * flops_per_token * tokens_per_s / ranks / peak.flops : 0.0;
}

// the run's averages: step times after the first (which warms caches), the time inside
// collectives (host time in the comm layer's calls; NCCL's asynchronous calls count 0) and the
// bytes a ring would send in them, the peak device memory
typedef struct {
    double seconds, comm_seconds, recompute_seconds, ring_bytes;
    int steps;
    size_t peak_memory;
    double rate;  // bytes per second between two ranks, measured before the first step (0: none)
    double* times;  // each counted step's seconds, for the median (step_stats_median)
    int times_cap;
} StepStats;

// collective_seconds: the step's time in collectives (comm_seconds of each group it used, summed);
// ring_bytes: what this rank puts on the link (comm_ring_bytes: collectives as rings, sends
// whole); recompute_seconds: its time recomputing activations (-r; block.h's recompute_spans)
static inline void step_stats_add(StepStats* s, int first, double seconds, double collective_seconds,
                                  double ring_bytes, double recompute_seconds) {
    size_t memory = device_memory_used();
    s->peak_memory = memory > s->peak_memory ? memory : s->peak_memory;
    if (first) return;
    if (s->steps == s->times_cap) {
        s->times_cap = s->times_cap ? 2 * s->times_cap : 64;
        s->times = (double*)realloc(s->times, (size_t)s->times_cap * sizeof(double));
        if (s->times == NULL) fail("out of host memory keeping the step times");
    }
    s->times[s->steps] = seconds;
    s->seconds += seconds;
    s->comm_seconds += collective_seconds;
    s->ring_bytes += ring_bytes;
    s->recompute_seconds += recompute_seconds;
    s->steps++;
}

// The measured step, the one figure a prediction is checked against (the end-of-run line here,
// dev/bench/sweep.sh's runs): the median of the steps after the run's first, which warms caches,
// the allocator and the communicator's connections. The median, not the mean: one step slowed by
// another process on the machine moves it little. 0 when the run had no step after its first.
static inline double step_stats_median(const StepStats* s) {
    if (s->steps == 0) return 0.0;
    double* sorted = (double*)malloc_check((size_t)s->steps * sizeof(double));
    memcpy(sorted, s->times, (size_t)s->steps * sizeof(double));
    for (int i = 1; i < s->steps; i++) {  // (insertion sort: a run's steps are few)
        double x = sorted[i];
        int j = i;
        for (; j > 0 && sorted[j - 1] > x; j--) sorted[j] = sorted[j - 1];
        sorted[j] = x;
    }
    int h = s->steps / 2;
    double median = s->steps % 2 ? sorted[h] : 0.5 * (sorted[h - 1] + sorted[h]);
    free(sorted);
    return median;
}

// The averages after the run. The time in collectives splits in two: moving, the bytes the rank
// puts on the link (collectives as rings, point-to-point sends whole) at the measured rate, and waiting, the rest, in which a partner had not yet posted its
// part (a pipeline stage waiting for its neighbour, a rank for the slowest). Busy is the time
// outside collectives, computing.
static inline void step_stats_print(const StepStats* s, int total_batch, double flops_per_token, DevicePeak peak,
                                    int ranks) {
    if (s->steps == 0) return;
    double tokens_per_s = total_batch / (s->seconds / s->steps);
    printf("average step time %.1f ms, %.0f tokens/s", s->seconds / s->steps * 1e3, tokens_per_s);
    if (s->comm_seconds > 0 && s->rate > 0) {
        double moving = s->ring_bytes / s->rate < s->comm_seconds ? s->ring_bytes / s->rate : s->comm_seconds;
        printf(": busy %.0f%%, waiting %.0f%%, moving %.0f%% at the measured %.2f GB/s",
               100.0 * (1.0 - s->comm_seconds / s->seconds), 100.0 * (s->comm_seconds - moving) / s->seconds,
               100.0 * moving / s->seconds, s->rate / 1e9);
    } else if (s->comm_seconds > 0) {
        printf(", %.0f%% of it in collectives", 100.0 * s->comm_seconds / s->seconds);
    }
    if (s->recompute_seconds > 0) printf(", %.0f%% recomputing activations (-r)", 100.0 * s->recompute_seconds / s->seconds);
    if (peak.flops > 0) printf(", MFU %.1f%%", train_mfu(flops_per_token, tokens_per_s, ranks, peak));
    if (s->peak_memory > 0) printf(", peak device memory %.2f GB", s->peak_memory / 1e9);
    printf("\n");
}

// The rate the transport moves bytes between two ranks, measured once before the first step:
// ranks in pairs (2k, 2k + 1; with an odd count the last sits out) exchange n floatX both ways at
// once (as a pipeline's exchange does), one round to warm up, then 3 timed; every rank takes the
// slowest pair's time (an all-reduce MAX). n is at most 1M elements and fits the scratch of every
// rank: 2 n elements of device memory the step does not need yet (the gradient buffer, zeroed
// before each step). Returns bytes per second, 0 with one rank.
static inline double measure_exchange_rate(CommGroup* world, floatX* scratch, size_t scratch_elements) {
    if (world->size < 2) return 0.0;
    float fewest = -(float)(scratch_elements / 2 < (1u << 20) ? scratch_elements / 2 : (1u << 20));
    comm_all_reduce_scalar(world, &fewest, COMM_MAX);  // (the smallest scratch of all ranks)
    size_t n = (size_t)-fewest;
    int partner = (world->rank ^ 1) < world->size ? world->rank ^ 1 : -1;
    double seconds = 0.0;
    for (int round = 0; round < 4; round++) {
        comm_barrier(world);
        double t0 = wall_time_s();
        CommMessage msgs[2] = {comm_message(scratch, n, partner, 1), comm_message(scratch + n, n, partner, 0)};
        if (partner >= 0 && n > 0) comm_exchange(world, msgs, 2, COMM_FLOATX);
        device_synchronize();
        if (round > 0) seconds += wall_time_s() - t0;
    }
    float slowest = (float)seconds;
    comm_all_reduce_scalar(world, &slowest, COMM_MAX);
    comm_reset_counters(world);
    return slowest > 0 ? 3.0 * n * sizeof(floatX) / slowest : 0.0;
}

// at the end of a run: what was allocated at most on this rank's device (allocations.h), beside
// the memory table's prediction
static inline void train_print_high_water(size_t predicted) {
    printf("device memory high-water mark %zu bytes allocated, predicted %zu (%+.2f%%)\n", device_allocated_peak(), predicted,
           100.0 * ((double)device_allocated_peak() / (double)predicted - 1.0));
}

// the next token of a sample: softmax over the V real entries of one row of logits, then the
// token where the cumulative probability first exceeds a uniform draw
static inline int sample_next_token(const float* logits, int V, Rng* rng) {
    float maxval = -INFINITY, sum = 0.0f;
    for (int v = 0; v < V; v++) maxval = logits[v] > maxval ? logits[v] : maxval;
    for (int v = 0; v < V; v++) sum += expf(logits[v] - maxval);
    float r = rng_uniform(rng) * sum, cdf = 0.0f;
    for (int v = 0; v < V; v++) {
        cdf += expf(logits[v] - maxval);
        if (r < cdf) return v;
    }
    return V - 1;
}

// sample_next_token with the vocabulary split over the ranks of `group`: this rank holds the
// logits of tokens [lo, lo + real). The ranks agree on the maximum (all-reduce MAX) and learn each
// other's sums of exponentials (one all-reduce per rank, the others adding 0); with the same rng
// state everywhere they draw the same number, and the rank whose range it falls in finds the
// token; an all-reduce MAX (-1 elsewhere) tells the others. The row of logits is never
// gathered; every rank returns the same token.
static inline int sample_next_token_sharded(const float* logits, int real, int lo, Rng* rng, CommGroup* group) {
    float maxval = -INFINITY, sum = 0.0f;
    for (int v = 0; v < real; v++) maxval = logits[v] > maxval ? logits[v] : maxval;
    comm_all_reduce_scalar(group, &maxval, COMM_MAX);
    for (int v = 0; v < real; v++) sum += expf(logits[v] - maxval);
    float before = 0.0f, total = 0.0f;  // the sums of the ranks below this one, and of all
    for (int r = 0; r < group->size; r++) {
        float sum_r = r == group->rank ? sum : 0.0f;
        comm_all_reduce_scalar(group, &sum_r, COMM_SUM);
        if (r < group->rank) before += sum_r;
        total += sum_r;
    }
    float u = rng_uniform(rng) * total;
    // the ranks' ranges [before, before + sum) tile [0, total); u rounded up to total goes last
    int owner = u >= before && (u < before + sum || group->rank == group->size - 1);
    int token = -1;
    if (owner) {
        float cdf = before;
        for (int v = 0; v < real && token < 0; v++) {
            cdf += expf(logits[v] - maxval);
            if (u < cdf) token = lo + v;
        }
        if (token < 0) token = lo + real - 1;  // rounding left u just past the last cdf step
    }
    float found = (float)token;  // the owner's token, -1 elsewhere: their maximum is the token
    comm_all_reduce_scalar(group, &found, COMM_MAX);  // (token ids are exact in a float)
    return (int)found;
}

// a sample's new token drawn: progress for the watchdog (a long sample is not a hang), and the
// printing rank (the one with the tokenizer, NULL elsewhere) prints it at once
static inline void sample_token_drawn(const Tokenizer* tok, int token) {
    watchdog_beat();
    if (tok) {
        tokenizer_print(tok, token);
        fflush(stdout);
    }
}

// A file flag left at its default (a path from the repository's root) that is not there from the
// working directory: the same path beside the program (/proc/self/exe), the repository's root
// where the trainers are built, when it is there. Returns the path to open: beside, or path.
static inline const char* default_path_beside_program(const char* path, const char* default_path, char* beside,
                                                      size_t cap) {
    FILE* f = fopen(path, "rb");
    if (f != NULL) fclose(f);
    ssize_t n = f == NULL && strcmp(path, default_path) == 0 ? readlink("/proc/self/exe", beside, cap - 1) : -1;
    if (n <= 0) return path;
    beside[n] = '\0';
    char* slash = strrchr(beside, '/');
    if (slash == NULL || (size_t)(slash + 1 - beside) + strlen(path) >= cap) return path;
    strcpy(slash + 1, path);
    f = fopen(beside, "rb");
    if (f == NULL) return path;
    fclose(f);
    return beside;
}

// A file flag left at its default (value: the flag's variable, as args_parse registered it in
// llmc_path_flags): that path, or the same beside the program (above), written into beside. A
// path the user gave is taken as given, even one that spells the default
static inline const char* default_flag_beside_program(const char* const* value, char* beside, size_t cap) {
    for (int i = 0; i < llmc_num_path_flags; i++) {
        const PathFlag* p = &llmc_path_flags[i];
        if (p->value == value && !p->given) return default_path_beside_program(*value, *value, beside, cap);
    }
    return *value;
}

// the decode table for samples; 0 (samples off, with a warning) when there is none, or when its
// end-of-text id, where every sample starts, is not a row of the model's embedding. -tok left at
// its default is looked for at the repository's root too, beside the program (/proc/self/exe),
// so that a run from another directory with its own -i and -j still samples, without a warning
static inline int train_open_tokenizer(Tokenizer* tok, const char* path, GPT2Config c) {
    char beside[4096];
    path = default_path_beside_program(path, TRAIN_DEFAULT_TOKENIZER, beside, sizeof(beside));
    FILE* f = fopen(path, "rb");
    if (f == NULL) {
        printf("warning: no tokenizer at '%s' (-tok): samples are off\n", path);
        return 0;
    }
    fclose(f);
    tokenizer_init(tok, path);
    if (tok->eot_token >= c.vocab_size) {
        printf("warning: the tokenizer's end-of-text id %d is outside the model's vocabulary of %d "
               "(-tok '%s' does not fit -e): samples are off\n", tok->eot_token, c.vocab_size, path);
        tokenizer_free(tok);
        return 0;
    }
    return 1;
}

// Samples that every rank takes part in drawing (DP, TP, PP): rank 0 opens the tokenizer (checked
// against the model) and prints; it tells the others whether it could, and the end-of-text id
// every sample starts from. Returns 1 when samples are on.
static inline int train_open_shared_sampling(const TrainArgs* args, GPT2Config c, CommGroup* world, Tokenizer* tok,
                                             int* eot) {
    int on = world->rank == 0 && args->sample_every > 0 && train_open_tokenizer(tok, args->tokenizer_path, c);
    *eot = on ? tok->eot_token : 0;
    comm_broadcast_host(world, &on, sizeof(int), 0);
    comm_broadcast_host(world, eot, sizeof(int), 0);
    return on;
}

// What the run layer needs of the trainer's model, for validation, samples and checkpoints
typedef struct {
    GPT2* model;
    void* trainer;  // the trainer's own state, handed to the two functions below
    // one validation batch (the loader is at it): this rank's mean loss (0 where a pipeline
    // rank has no head: the head stage's is broadcast)
    float (*val_loss)(void* trainer, DataLoader* val);
    // one forward pass of (1, T) tokens for a sample: this rank's logits (1, T, Vp) on the device,
    // Vp its share of the vocabulary; NULL on a pipeline stage without the head
    const floatX* (*sample_logits)(void* trainer, const int* tokens, int T);
    CommGroup* val_replicas;  // data parallelism: the ranks evaluate different batches; their mean
    CommGroup* pipe;          // pipelines: the stage with the head has the loss and the logits, and
    int pipe_head;            // broadcasts them: this rank of pipe (the last stage; in a V, the first)
    CommGroup* vocab;         // tensor parallelism: the vocabulary is split over these ranks
    CommGroup* seq;           // context parallelism: a sequence's positions are split over these ranks;
                              // the one holding the position sampled from draws and broadcasts
    int (*seq_row)(void* trainer, int T, int position, int* owner);  // (its rank, and row there or -1)
    // HellaSwag (-h 1, hellaswag.h): one forward pass of a (B, T) batch of host tokens, its (B, T)
    // per-token losses on the host (gpt2_loss leaves them in model->losses_host), the whole rows on
    // every rank that scores them; the examples are split over val_replicas. NULL: no -h here
    const float* (*token_losses)(void* trainer, const int* inputs, const int* targets);
    int sample_pad;           // a sample's length is padded to a multiple of this (-sp: tp tokens)
    CommGroup* split;         // checkpoints: the ranks the model's tensors are split over (DP: its ZeRO
                              // group), gathered into the model file by rank 0 of it
    CommGroup* replicas;      // checkpoints of any grid (3D): the dp group; the training state is
                              // gathered into the model file's layout, so that any grid resumes it
    StateShards state_shards; // ... with -z 1 first all-gathered over these (train.h; NULL: replicas)
    TrainerState own;         // checkpoints: the trainer's own state, in every rank's state file
    // resume: the trainer's check of the checkpoint it resumed from, before anything is written
    // (DiLoCo: a run's last step took outer steps that an extended run would not); NULL: none
    void (*check_resume)(void* trainer, const char* dir, int step, int max_steps);
} RunModel;

// the hooks every trainer has; the groups (NULL: none) are set by name after it
static inline RunModel run_model(GPT2* model, void* trainer, float (*val_loss)(void*, DataLoader*),
                                 const floatX* (*sample_logits)(void*, const int*, int)) {
    RunModel h;
    memset(&h, 0, sizeof(h));
    h.model = model;
    h.trainer = trainer;
    h.val_loss = val_loss;
    h.sample_logits = sample_logits;
    h.sample_pad = 1;
    return h;
}

typedef struct {
    TrainArgs args;           // the common flags (train.h)
    CommGroup world;
    int rank;
    GPT2Config config;        // read before anything is allocated
    int from_descriptor;      // -e dL: a random init from -seed; else a model file
    RunLayout layout;         // what decides this rank's memory (memory_plan.h) ...
    MemoryPlan plan;          // ... and that memory, part by part
    DataLoader train, val;
    int max_steps, start_step;
    Tokenizer tok;            // on rank 0, when samples are on
    int eot, can_sample, gen_tokens;
    RunIdentity identity;     // what a resume must match (checkpoint.h)
    Rng sample_rng;
    Logger logger;            // main.log, on rank 0
    RunModel hooks;
    HellaSwag hellaswag;      // -h 1: the examples, read and checked by run_load
    char train_found[4096];   // -i and -j left at their defaults and found beside the program:
    char val_found[4096];     // the paths (args.train_path and val_path then point here)
    double flops_per_token;   // the step's figures: MFU, averages, the step line
    DevicePeak peak;
    StepStats stats;
    StepReport report;
    double step_start;        // wall time at run_step_begin
    char step_extra[512];     // the trainer's own figures of the step, JSON fields for its main.log
                              // record (train_gpt2_ep: the MoE balance); "" for none
    // the step's time predicted (llmc/step_time.h), beside the measured one at the run's end and in
    // main.log's step records: what the trainer runs that its RunLayout does not say (set after
    // run_start; 0: none), the device's profile and the prediction (run_begin, on the layout that
    // run_check_memory took)
    int tp_overlap, diloco_workers, diloco_H;
    DeviceProfile profile;
    int has_profile;          // 0: the CPU has no measured profile (no prediction; the end says how)
    char profile_label[4096];
    StepTime predicted;
} Run;

// The flags (the common ones of train.h, then the trainer's own), the communication layer, the
// watchdog, and the model's config: from a descriptor, or the header of a model file, so that
// the memory check comes before the first large allocation. Returns 0 after --help.
static inline int run_start_model(Run* r, int* argc, char*** argv, const ArgSpec* own, int num_own, int moe);
static inline int run_start(Run* r, int* argc, char*** argv, const ArgSpec* own, int num_own) {
    return run_start_model(r, argc, argv, own, num_own, 0);
}
// (every_rank_alike's work: every rank reads the same files, and a refusal is printed once)
static inline void run_read_model_config(void* run) {
    Run* r = (Run*)run;
    gpt2_read_model_config(r->args.model, &r->config);
}
typedef struct {
    Run* run;
    float* weights;
    int train_chunks, val_chunks;
} RunFiles;
static inline void run_read_files(void* arg) {
    RunFiles* f = (RunFiles*)arg;
    Run* r = f->run;
    TrainArgs* a = &r->args;
    f->weights = r->from_descriptor ? gpt2_init_random(r->config, (uint64_t)a->seed) : gpt2_read_model_file(a->model, &r->config, NULL);
    // -i and -j left at their defaults (tiny Shakespeare, from the repository's root) are looked
    // for beside the program too, as -tok and -hellaswag are: a run from another directory finds
    // them (-x 0 -v 0 -h 1, scoring a model, still opens -i). The dataloader keeps the pointer
    // and a file error names the flag by it (path_origin), hence the Run's buffers
    a->train_path = default_flag_beside_program(&a->train_path, r->train_found, sizeof(r->train_found));
    a->val_path = default_flag_beside_program(&a->val_path, r->val_found, sizeof(r->val_found));
    dataloader_init(&r->train, a->train_path, a->B, a->T, f->train_chunks, a->shuffle, (uint64_t)a->seed);
    if (a->val_every > 0) dataloader_init(&r->val, a->val_path, a->B, a->T, f->val_chunks, 0, 0);
    if (r->hellaswag.on) {
        HellaSwag* hs = &r->hellaswag;
        hs->path = default_path_beside_program(hs->path, HELLASWAG_DEFAULT_PATH, hs->found, sizeof(hs->found));
        hellaswag_open(hs, a->B, a->T, r->config.vocab_size);
    }
}
typedef struct {
    Run* run;
    int step;
} ResumeCheck;
static inline void run_check_resume(void* arg) {
    ResumeCheck* c = (ResumeCheck*)arg;
    RunModel* h = &c->run->hooks;
    h->check_resume(h->trainer, c->run->args.out_dir, c->step, c->run->max_steps);
}

// The device profile the step's time is predicted on (llmc/profile_default.h, the planner's rule):
// -profile, else on CUDA the built-in of this device's kind (by its name), on the CPU this
// machine's measured file, dev/profiles/cpu-this-machine.txt beside the program (none: no
// prediction). Read on every rank, so that a bad -profile is one message before anything runs.
static inline void run_load_profile(Run* r) {
    char device_name[256] = "", program[4096] = "", why[8192];
#ifdef __CUDACC__
    int device;
    cudaDeviceProp prop;
    cudaCheck(cudaGetDevice(&device));
    cudaCheck(cudaGetDeviceProperties(&prop, device));
    snprintf(device_name, sizeof(device_name), "%s", prop.name);
    int cuda = 1;
#else
    int cuda = 0;
#endif
    ssize_t n = readlink("/proc/self/exe", program, sizeof(program) - 1);  // (the program's own path)
    program[n > 0 ? n : 0] = '\0';
    int found = profile_load_default(r->args.profile, cuda, device_name, program, PROFILE_CPU_FILE, &r->profile,
                                     r->profile_label, sizeof(r->profile_label), why, sizeof(why));
    // (the label is filled only for a profile that loads: a refused -profile is named as given)
    check_every_rank(found >= 0, "%s%s: %s", r->args.profile ? "-profile " : "the profile ",
                     r->args.profile ? r->args.profile : r->profile_label, why);
    r->has_profile = found > 0;
    // (a profile of the other backend's kind would price this build's kernels on another device:
    // a prediction of no device, refused as the planner refuses it)
    check_every_rank(!r->has_profile || (r->profile.kind == DEVICE_CUDA) == cuda,
                     "-profile %s is a kind %s profile, and this build runs the %s backend: give a %s profile (%s), or "
                     "leave -profile out", r->profile_label, r->profile.kind == DEVICE_CUDA ? "cuda" : "cpu",
                     cuda ? "CUDA" : "CPU", cuda ? "kind cuda" : "kind cpu",
                     cuda ? "h100-sxm, h200, a100-80gb or a file of kind cuda"
                          : "dev/profiles/cpu-this-machine.txt, dev/bench/calibrate's, or a file of kind cpu");
}

// What the step runs beyond its RunLayout (step_kernels.h's StepOptions): this build's floats and
// kernels (on CUDA the LLMC_* choices this run took; the CPU's own, as the planner's -device cpu
// takes them) and the trainer's flags that change no buffer (-tp_overlap, DiLoCo's -workers and -H)
static inline StepOptions run_step_options(const Run* r) {
    DeviceTarget t = build_target(r->config);
    StepOptions o = {t.X, t.flash, 0, 0, 1, r->tp_overlap, r->diloco_workers, r->diloco_H, 0};  // (0: no -megatron)
#ifdef __CUDACC__
    o.bias_epilogue = bias_grad_in_epilogue(), o.gelu_epilogue = gelu_in_epilogue();
    o.ln_backward_fused = layernorm_backward_fused_asked();
#endif
    return o;
}

// the ranks a node the prediction places the run's groups with: the profile's (the planner's
// default, 8 where a profile leaves it out), a node's GPUs, or the CPU profile's large figure: one
// host holds every rank
static inline int run_gpus_per_node(const Run* r) { return r->profile.gpus_per_node > 0 ? r->profile.gpus_per_node : 8; }

// The predicted step against the measured, once at the end of the run on rank 0: the median of
// the steps after the first (step_stats_median) beside llmc/step_time.h's step for the layout the
// run took, on the profile, with its parts (stage 0's compute by kind, its exposed collectives,
// its idle time in the pipeline, the once-a-step part); ms, a step
static inline void run_print_step_time(const Run* r) {
    const StepStats* s = &r->stats;
    char measured[96] = "measured: no step after the first (the warm-up)";
    if (s->steps > 0) {  // (the step lines number from 1: the run's first is start_step + 1)
        snprintf(measured, sizeof(measured), "measured %.2f ms (median of steps %d..%d)", step_stats_median(s) * 1e3,
                 r->start_step + 2, r->start_step + 1 + s->steps);
    }
    if (!r->has_profile) {
        printf("step time: %s; not predicted: %s\n", measured, profile_missing_hint());
        return;
    }
    const StepTime* t = &r->predicted;
    char kinds[160] = "";  // (the host's part only where -offload runs AdamW there)
    for (int k = 0, used = 0; k < TIME_COMPUTE_KINDS; k++) {
        if (k == TIME_HOST && t->compute[k] <= 0.0) continue;
        used += snprintf(kinds + used, sizeof(kinds) - used, "%s %.2f, ", time_compute_names[k], t->compute[k] * 1e3);
    }
    double exposed = 0.0;
    for (int k = 0; k < TIME_GROUPS; k++) exposed += t->comm_exposed[k];
    printf("step time: %s, predicted %.2f ms on %s (%scomm exposed %.2f, bubble %.2f, once %.2f; %d ranks a node; "
           "llmc/step_time.h)\n", measured, t->seconds * 1e3, r->profile_label, kinds, exposed * 1e3, t->bubble * 1e3,
           t->once * 1e3, run_gpus_per_node(r));
}

// moe: 1 for the trainer of Mixture-of-Experts models (train_gpt2_ep), which sets the experts
// itself; every other refuses an MoE model file here, before anything is allocated
static inline int run_start_model(Run* r, int* argc, char*** argv, const ArgSpec* own, int num_own, int moe) {
    memset(r, 0, sizeof(*r));
    r->hellaswag.path = HELLASWAG_DEFAULT_PATH;  // (-hellaswag's default, in the trainers that take it)
    ArgSpec specs[TRAIN_MAX_SPECS];
    int n = train_args_common(&r->args, specs);
    if (n + num_own > TRAIN_MAX_SPECS) fail("%d flags, at most %d (TRAIN_MAX_SPECS)", n + num_own, TRAIN_MAX_SPECS);
    for (int i = 0; i < num_own; i++) specs[n++] = own[i];
    if (!args_parse(*argc, *argv, specs, n)) return 0;
    comm_init(&r->world, argc, argv);
    env_check_all(BACKEND_NAME);  // (the LLMC_* choices: utils.h)
    r->rank = r->world.rank;
    watchdog_start(r->args.watchdog);
    r->from_descriptor = gpt2_config_from_descriptor(r->args.model, &r->config);
    if (!r->from_descriptor) {  // (opened by every rank first: a missing file is one message, not one a rank)
        fclose(fopen_every_rank(r->args.model, "rb"));
        every_rank_alike(run_read_model_config, r);  // (a bad header: one message)
    }
    if (!moe) {
        const char* slash = strrchr((*argv)[0], '/');
        gpt2_require_dense(r->config, r->args.model, slash ? slash + 1 : (*argv)[0]);
    }
    train_check_flags(&r->args, r->config);
    run_load_profile(r);
    return 1;
}

// A trainer whose ranks all form one group (TP, PP, CP): its size flag (-tp, -pp, -cp) may only
// repeat the number of ranks; 0 means "the number of ranks"
static inline void run_check_one_group(const Run* r, const char* flag, int value, const char* group) {
    int ranks = r->world.size;
    {
        check_every_rank(value == 0 || value == ranks, "%s %d: this trainer puts every rank in %s, so %s must equal the number of ranks, %d (launch with mpirun "
             "-np %d, or leave %s out)", flag, value, group, flag, ranks, value, flag);
    }
}

// The layout fields every trainer fills alike (one rank of everything, the batch, -r, -n, -y);
// the trainer then sets its own: dp, tp, pp, V, sched, zero, sp, offload, overlap, dump_grads
static inline RunLayout run_layout(const Run* r, TrainerKind trainer, int micro_batches) {
    RunLayout l;
    memset(&l, 0, sizeof(l));
    l.trainer = trainer;
    l.dp = l.tp = l.pp = l.V = l.cp = 1;
    l.sched = SCHEDULE_1F1B;
    l.m = micro_batches;
    l.B = r->args.B;
    l.T = r->args.T;
    l.recompute = r->args.recompute;
    l.checkpoint = r->args.checkpoint_every > 0;
    l.resume = r->args.resume;
    return l;
}

// Memory, predicted before allocating (memory_plan.h: every buffer the trainer will allocate,
// part by part, for this rank's pipeline `stage`), so that a batch too large for the machine is a
// message naming what this rank holds (what, printf-style) rather than a kill by the
// out-of-memory killer mid-run. The barrier: every rank checked before any allocates (ranks may
// share the memory).
static inline void run_check_memory(Run* r, RunLayout layout, int stage, const char* what, ...) {
    char note[192];
    va_list ap;
    va_start(ap, what);
    vsnprintf(note, sizeof(note), what, ap);
    va_end(ap);
    r->layout = layout;
    r->plan = memory_plan(r->config, build_target(r->config), &r->layout, stage, r->rank == 0);
    memory_check_fits(r->plan.total, r->plan.host + r->plan.host_optimizer, r->world.ranks_sharing_memory, note);
    comm_barrier(&r->world);
}

// The weights of the whole model, on the host: read (checksum verified, non-finite values refused)
// or drawn from -seed; the caller builds its model from them and frees them. Also the data: a
// step is train_chunks chunks of B x T tokens (the trainer's loop says which rank reads which),
// a validation batch val_chunks; -m is lowered to the validation file's batches. The samples'
// tokenizer (rank 0). The run's identity: everything that decides the training trajectory, so a
// resume with anything different is refused (checkpoint.h); layout (printf-style) is the ranks'
// arrangement a resume must match, or NULL where any layout resumes (3D). Then rank 0 takes the
// output dir's lock for the whole run; a fresh run refuses a dir that holds checkpoints already.
static inline float* run_load(Run* r, int train_chunks, int val_chunks, const char* layout, ...) {
    TrainArgs* a = &r->args;
    // (every rank reads the same files: a refusal, a corrupt model file say, is printed once)
    RunFiles files = {r, NULL, train_chunks, val_chunks};
    every_rank_alike(run_read_files, &files);
    float* weights = files.weights;
    if (a->val_every > 0) {
        if ((size_t)a->val_batches > r->val.batches_per_epoch) {  // (said, so that -m's figure is not taken for what ran)
            if (r->rank == 0) {
                printf("-m %d: the validation file holds %zu batches of this shape (-b, -t, the ranks); each evaluation "
                       "reads those\n", a->val_batches, r->val.batches_per_epoch);
            }
            a->val_batches = (int)r->val.batches_per_epoch;
        }
    }
    r->max_steps = a->max_steps >= 0 ? a->max_steps : (int)r->train.batches_per_epoch;
    r->can_sample = train_open_shared_sampling(a, r->config, &r->world, &r->tok, &r->eot);
    r->gen_tokens = a->gen_tokens < a->T ? a->gen_tokens : a->T;
    char text[192];
    if (layout) {
        va_list ap;
        va_start(ap, layout);
        vsnprintf(text, sizeof(text), layout, ap);
        va_end(ap);
    }
    train_run_identity(&r->identity, a, r->config, weights, &r->train, r->max_steps, layout ? text : NULL, &r->world);
    if (a->out_dir != NULL) {
        if (r->rank == 0) output_dir_claim(a->out_dir, a->resume);
        comm_barrier(&r->world);
    }
    return weights;
}

// the last rows of every trainer's banner: the batch, the steps, the data
static inline int run_banner_rows(const Run* r, BannerRow* rows, int n) {
    banner_row(&rows[n++], "total batch (tokens)", "%d", r->args.total_batch);
    banner_row(&rows[n++], "steps", "%d", r->max_steps);
    // (with shards, -i or -j a glob or a list: how many)
    char train_shards[32] = "", val_shards[32] = "";
    if (r->train.num_shards > 1) snprintf(train_shards, sizeof(train_shards), " in %d shards", r->train.num_shards);
    if (r->args.val_every > 0 && r->val.num_shards > 1) snprintf(val_shards, sizeof(val_shards), " in %d shards", r->val.num_shards);
    banner_row(&rows[n++], "train / val tokens", "%zu%s / %zu%s", r->train.num_tokens, train_shards,
               r->args.val_every > 0 ? r->val.num_tokens : 0, val_shards);
    return n;
}

// Where the run starts (train.h's train_start_from: step 0, or with -y 1 the newest checkpoint in -o,
// read as the trainer's checkpoints are written), then main.log (cut back to that step), and the
// step's figures. groups: every group this rank communicates in during a step (the step line
// and main.log report their bytes and times).
static inline void run_begin(Run* r, RunModel hooks, CommGroup** groups, int num_groups) {
    // (what the run allocates from here on, the trainer's buffers all made: a checkpoint's gathers,
    // -dump_grads': the memory table's "file gather")
    allocation_kind(ALLOC_FILE_GATHER);
    r->hooks = hooks;
    r->start_step = train_start_from(hooks.model, &r->args, &r->world, r->max_steps, &r->identity, &r->sample_rng,
                                     &r->train, hooks.replicas ? read_checkpoint_gathered : read_checkpoint, &hooks.own);
    if (r->args.resume && hooks.check_resume) {  // (the trainer's own checks, before "resumed from step")
        ResumeCheck check = {r, r->start_step};
        every_rank_alike(run_check_resume, &check);
    }
    if (r->args.resume) train_report_resume(&r->world, r->args.out_dir, r->start_step, r->max_steps);
    logger_init(&r->logger, r->args.out_dir, r->rank, r->args.resume ? r->start_step : -1);
    r->flops_per_token = gpt2_flops_per_token(r->config, r->args.T);  // each rank does its share
    r->peak = train_device_peak(r->rank);
    memset(&r->stats, 0, sizeof(r->stats));
    if (r->rank == 0 && r->has_profile) {
        r->predicted = step_time_predict(&r->profile, r->config, &r->layout, run_step_options(r), run_gpus_per_node(r));
    }
    r->stats.rate = measure_exchange_rate(&r->world, hooks.model->grads_memory, layout_grads_held(&hooks.model->layout));
    r->report = step_report_init(groups, num_groups);
    if (r->hellaswag.on) hellaswag_split(&r->hellaswag, hooks.val_replicas);
}

// Bytes of one kind in one group that change from step to step with the data (MoE's all-to-all
// follows the routing): the trainer prints them on a line of its own every step, and the bytes
// block, printed only when the bytes change, leaves them out. main.log keeps every kind.
// (after run_begin, which names the groups)
static inline void run_bytes_on_own_line(Run* r, const CommGroup* g, CommKind kind) {
    for (int i = 0; i < r->report.num_groups; i++) {
        if (r->report.groups[i] == g) r->report.own_line[i] |= 1u << kind;
    }
}

// Validation: the mean loss over -m batches, every rank on the same batches (each on its
// val_loss's chunk of them); data-parallel replicas that read different chunks average theirs
// (an all-reduce of one float), a pipeline's head stage broadcasts its loss (4 bytes), so that
// every rank reports the same
static inline float run_validate(Run* r) {
    RunModel* h = &r->hooks;
    double sum = 0.0;
    for (int i = 0; i < r->args.val_batches; i++) {
        dataloader_seek(&r->val, (size_t)i);
        sum += h->val_loss(h->trainer, &r->val);
    }
    float loss = (float)(sum / r->args.val_batches);
    if (h->val_replicas) comm_all_reduce_scalar(h->val_replicas, &loss, COMM_AVG);
    if (h->pipe) comm_broadcast_host(h->pipe, &loss, sizeof(float), h->pipe_head);
    return loss;
}

// Autoregressive sampling from <|endoftext|> (its id was checked to be inside the model's
// vocabulary), one forward pass of B = 1 per new token. Every rank takes part (the model may be
// split over them, or under -z 3 gathered from them) and, with the same rng state everywhere,
// draws the same tokens; rank 0 prints them.
//   - the vocabulary split over tp ranks: each holds the logits of its columns, and they draw
//     together without gathering the row (sample_next_token_sharded, above);
//   - a pipeline: the stage with the head (the last; in a V the first) draws and broadcasts the
//     token (4 bytes) over the pipe, since the first stage needs it for the next pass;
//   - -sp: the sequence is padded to a multiple of tp; causal attention never lets a position
//     see the ones after it, so the padding changes no logit we read;
//   - context parallelism: the sequence is split (and padded to whole chunks) as training's; the
//     rank holding the last position draws and broadcasts the token (4 bytes); the others draw
//     the same uniform number unused, so that every rank's rng stays where the owner's is.
static inline void run_sample(Run* r, int step) {
    RunModel* h = &r->hooks;
    LayerDims d = h->model->dims;
    int T = r->args.T, lo = h->vocab ? h->vocab->rank * d.Vp_rank : 0;
    int real = h->vocab ? vocab_real_columns(r->config, d, h->vocab->rank) : r->config.vocab_size;
    int* tokens = (int*)malloc_check((size_t)T * sizeof(int));
    float* row = (float*)malloc_check((size_t)d.Vp_rank * sizeof(float));  // one row of logits, as fp32
    for (int t = 0; t < T; t++) tokens[t] = r->eot;
    const Tokenizer* tok = r->rank == 0 ? &r->tok : NULL;
    if (tok) printf("---- sample at step %d ----\n", step);
    for (int t = 1; t < r->gen_tokens; t++) {
        int padded = (t + h->sample_pad - 1) / h->sample_pad * h->sample_pad;
        const floatX* logits = h->sample_logits(h->trainer, tokens, padded);
        float token = 0.0f;  // (token ids are exact in a float)
        int at = t - 1, owner = 0;  // the row of the last position's logits, and who holds it
        if (h->seq) at = h->seq_row(h->trainer, padded, t - 1, &owner);
        if (logits && at >= 0) {
            copy_device_to_floats(row, logits + (size_t)at * d.Vp_rank, d.Vp_rank);
            token = (float)(h->vocab ? sample_next_token_sharded(row, real, lo, &r->sample_rng, h->vocab)
                                     : sample_next_token(row, real, &r->sample_rng));
        } else if (h->seq) {
            rng_uniform(&r->sample_rng);  // the owner's one draw: every rank's rng stays the same
        }
        if (h->pipe) comm_broadcast_host(h->pipe, &token, sizeof(float), h->pipe_head);
        if (h->seq) comm_broadcast_host(h->seq, &token, sizeof(float), owner);
        tokens[t] = (int)token;
        sample_token_drawn(tok, tokens[t]);
    }
    if (tok) printf("\n----------------\n");
    // a gathered checkpoint (3D) is written by rank 0, and only the head's stage drew from the rng:
    // hand its state to the other stages (8 bytes), so that rank 0's is where the samples left it
    if (h->pipe && h->replicas) comm_broadcast_host(h->pipe, &r->sample_rng.state, sizeof(r->sample_rng.state), h->pipe_head);
    free(tokens);
    free(row);
}

// What happens between two steps, when due (train.h, train_due): validation, a sample, a
// checkpoint. The checkpoint of a step holds the state before that step's validation and sample
// (the sampling rng included), so a resumed run redoes them exactly as an uninterrupted run with
// its flags would: same values, same samples, and the log was cut back to match. Returns 1 after
// the last step's: the loop ends.
static inline int run_between_steps(Run* r, int step) {
    int last = step == r->max_steps;
    uint64_t rng_before_sample = r->sample_rng.state;
    if (train_due(r->args.val_every, step, last)) {
        watchdog_phase("validation", step);
        train_report_val(&r->logger, r->rank, step, run_validate(r));
    }
    if (r->hellaswag.on && (last || train_due(r->args.val_every, step, last))) {  // (with -v 0: at the end)
        RunModel* h = &r->hooks;
        hellaswag_evaluate(&r->hellaswag, h->val_replicas, r->rank, step, &r->logger, h->token_losses, h->trainer);
    }
    if (r->can_sample && step > 0 && train_due(r->args.sample_every, step, last)) {
        watchdog_phase("sampling", step);
        run_sample(r, step);
    }
    if (train_checkpoint_due(&r->args, step, r->start_step, last)) {
        watchdog_phase("checkpoint write", step);
        RunModel* h = &r->hooks;
        if (h->replicas) {
            StateShards shards = h->state_shards;
            if (shards.dense == NULL) shards.dense = h->replicas;
            write_checkpoint_gathered(h->model, r->args.out_dir, &r->world, shards, h->replicas, h->split, step, &r->identity,
                                      rng_before_sample, &h->own, &r->train);
        } else {
            write_checkpoint(h->model, r->args.out_dir, &r->world, h->split, step, &r->identity, rng_before_sample, &h->own, &r->train);
        }
    }
    return last;
}

// the step's clock starts, every group's byte counters, and the kernel times' spans (kernel_times.h)
static inline void run_step_begin(Run* r) {
    r->step_start = wall_time_s();
    for (int i = 0; i < r->report.num_groups; i++) comm_reset_counters(r->report.groups[i]);
    kernel_times_step_begin();
}

// The step's end: wait for the device, then its time, its collectives' time (CUDA: the GPU's
// timing of NCCL's calls, read after the sync), its recomputation's (-r) and its kernels' (with
// LLMC_KERNEL_TIMES=1), into the run's
// averages, the step line and main.log (step_report, above)
static inline void run_step_end(Run* r, int step, float loss, float lr, float grad_norm, float clip_scale) {
    device_synchronize();
    double recompute_s = device_spans_collect(&recompute_spans);
    double dt = wall_time_s() - r->step_start, comm_s = 0.0, ring = 0.0;
    for (int i = 0; i < r->report.num_groups; i++) {
        comm_collect_times(r->report.groups[i]);
        comm_s += comm_seconds(r->report.groups[i]);
        ring += comm_ring_bytes(r->report.groups[i]);
    }
    step_stats_add(&r->stats, step == r->start_step, dt, comm_s, ring, recompute_s);
    kernel_times_step_end(step != r->start_step, dt);
    double tokens_per_s = r->args.total_batch / dt;
    StepFigures f = {step + 1, r->max_steps, loss, lr, grad_norm, clip_scale, dt, recompute_s, tokens_per_s,
                     train_mfu(r->flops_per_token, tokens_per_s, r->world.size, r->peak), r->step_extra,
                     device_allocated_peak(), r->plan.total, r->has_profile ? r->predicted.seconds : 0.0};
    step_report(&r->report, &r->logger, r->rank, f);
    r->step_extra[0] = '\0';
}

// The run's averages and, beside the memory table's prediction, the most this rank allocated;
// then the log, the tokenizer and the loaders are closed. The trainer frees its own state and
// ends with comm_finalize().
static inline void run_end(Run* r) {
    if (r->rank == 0) {
        step_stats_print(&r->stats, r->args.total_batch, r->flops_per_token, r->peak, r->world.size);
        run_print_step_time(r);
        train_print_high_water(r->plan.total);
        kernel_times_print(r->rank);
        paths_print();
    }
    watchdog_phase("shutdown", r->max_steps);
    free(r->stats.times);
    logger_close(&r->logger);
    if (r->rank == 0 && r->can_sample) tokenizer_free(&r->tok);
    dataloader_free(&r->train);
    if (r->args.val_every > 0) dataloader_free(&r->val);
    if (r->hellaswag.on) hellaswag_free(&r->hellaswag);
}

#endif
