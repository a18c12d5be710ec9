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
#include "memory.h"
#include "memory_plan.h"
#include "train.h"

// What the run layer needs of the trainer's model, for validation, samples and checkpoints
typedef struct {
    GPT2* model;
    void* trainer;  // the trainer's own state, handed to the two functions below
    // one validation batch (the loader is at it): this rank's mean loss (0 where a pipeline
    // rank has no head: the last stage's is broadcast)
    float (*val_loss)(void* trainer, DataLoader* val);
    // one forward pass of (1, T) tokens for a sample: this rank's logits (1, T, Vp) on the device,
    // Vp its share of the vocabulary; NULL on a pipeline stage without the head
    const floatX* (*sample_logits)(void* trainer, const int* tokens, int T);
    CommGroup* val_replicas;  // data parallelism: the ranks evaluate different batches; their mean
    CommGroup* pipe;          // pipelines: the last stage has the loss and the logits, and broadcasts
    CommGroup* vocab;         // tensor parallelism: the vocabulary is split over these ranks
    int sample_pad;           // a sample's length is padded to a multiple of this (-sp: tp tokens)
    CommGroup* split;         // checkpoints: the ranks the model's tensors are split over (DP: its ZeRO
                              // group), gathered into the model file by rank 0 of it
    CommGroup* replicas;      // checkpoints of any grid (3D): the dp group; the training state is
                              // gathered into the model file's layout, so that any grid resumes it
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
    double flops_per_token;   // the step's figures: MFU, averages, the step line
    DevicePeak peak;
    StepStats stats;
    StepReport report;
    double step_start;        // wall time at run_step_begin
} Run;

// The flags (the common ones of train.h, then the trainer's own), the communication layer, the
// watchdog, and the model's config: from a descriptor, or the header of a model file, so that
// the memory check comes before the first large allocation. Returns 0 after --help.
static inline int run_start(Run* r, int* argc, char*** argv, const ArgSpec* own, int num_own) {
    memset(r, 0, sizeof(*r));
    ArgSpec specs[TRAIN_MAX_SPECS];
    int n = train_args_common(&r->args, specs);
    if (n + num_own > TRAIN_MAX_SPECS) fail("%d flags, at most %d (TRAIN_MAX_SPECS)", n + num_own, TRAIN_MAX_SPECS);
    for (int i = 0; i < num_own; i++) specs[n++] = own[i];
    if (!args_parse(*argc, *argv, specs, n)) return 0;
    comm_init(&r->world, argc, argv);
    r->rank = r->world.rank;
    watchdog_start(r->args.watchdog);
    r->from_descriptor = gpt2_config_from_descriptor(r->args.model, &r->config);
    if (!r->from_descriptor) gpt2_read_model_config(r->args.model, &r->config);
    train_check_flags(&r->args, r->config);
    return 1;
}

// The layout fields every trainer fills alike (one rank of everything, the batch, -r, -n, -y);
// the trainer then sets its own: dp, tp, pp, V, sched, zero, sp, offload, overlap, dump_grads
static inline RunLayout run_layout(const Run* r, TrainerKind trainer, int micro_batches) {
    RunLayout l;
    memset(&l, 0, sizeof(l));
    l.trainer = trainer;
    l.dp = l.tp = l.pp = l.V = 1;
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
    float* weights = r->from_descriptor ? gpt2_init_random(r->config, (uint64_t)a->seed)
                                        : gpt2_read_model_file(a->model, &r->config, NULL);
    dataloader_init(&r->train, a->train_path, a->B, a->T, train_chunks, a->shuffle, (uint64_t)a->seed);
    if (a->val_every > 0) {
        dataloader_init(&r->val, a->val_path, a->B, a->T, val_chunks, 0, 0);
        if ((size_t)a->val_batches > r->val.batches_per_epoch) a->val_batches = (int)r->val.batches_per_epoch;
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
    banner_row(&rows[n++], "train / val tokens", "%zu / %zu", r->train.num_tokens,
               r->args.val_every > 0 ? r->val.num_tokens : 0);
    return n;
}

// Where the run starts (train.h's train_start_from: step 0, or with -y 1 the newest checkpoint in -o,
// read as the trainer's checkpoints are written), then main.log (cut back to that step), and the
// step's figures. groups: every group this rank communicates in during a step (the step line
// and main.log report their bytes and times).
static inline void run_begin(Run* r, RunModel hooks, CommGroup** groups, int num_groups) {
    r->hooks = hooks;
    r->start_step = train_start_from(hooks.model, &r->args, &r->world, r->max_steps, &r->identity, &r->sample_rng,
                                     &r->train, hooks.replicas ? read_checkpoint_gathered : read_checkpoint);
    logger_init(&r->logger, r->args.out_dir, r->rank, r->args.resume ? r->start_step : -1);
    r->flops_per_token = train_flops_per_token(r->config, r->args.T);  // each rank does its share
    r->peak = train_device_peak(r->rank);
    memset(&r->stats, 0, sizeof(r->stats));
    r->report = step_report_init(groups, num_groups);
}

// Validation: the mean loss over -m batches, every rank on the same batches (each on its
// val_loss's chunk of them); data-parallel replicas that read different chunks average theirs
// (an all-reduce of one float), a pipeline's last stage broadcasts its loss (4 bytes), so that
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
    if (h->pipe) comm_broadcast_host(h->pipe, &loss, sizeof(float), h->pipe->size - 1);
    return loss;
}

// Autoregressive sampling from <|endoftext|> (its id was checked to be inside the model's
// vocabulary), one forward pass of B = 1 per new token. Every rank takes part (the model may be
// split over them, or under -z 3 gathered from them) and, with the same rng state everywhere,
// draws the same tokens; rank 0 prints them.
//   - the vocabulary split over tp ranks: each holds the logits of its columns, and they draw
//     together without gathering the row (train.h, sample_next_token_sharded);
//   - a pipeline: the last stage draws and broadcasts the token (4 bytes) over the pipe, since
//     the first stage needs it for the next pass;
//   - -sp: the sequence is padded to a multiple of tp; causal attention never lets a position
//     see the ones after it, so the padding changes no logit we read.
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
        if (logits) {
            copy_device_to_floats(row, logits + (size_t)(t - 1) * d.Vp_rank, d.Vp_rank);
            token = (float)(h->vocab ? sample_next_token_sharded(row, real, lo, &r->sample_rng, h->vocab)
                                     : sample_next_token(row, real, &r->sample_rng));
        }
        if (h->pipe) comm_broadcast_host(h->pipe, &token, sizeof(float), h->pipe->size - 1);
        tokens[t] = (int)token;
        sample_token_drawn(tok, tokens[t]);
    }
    if (tok) printf("\n----------------\n");
    // a gathered checkpoint (3D) is written by rank 0, and only the last stage drew from the rng:
    // hand its state to the other stages (8 bytes), so that rank 0's is where the samples left it
    if (h->pipe && h->replicas) comm_broadcast_host(h->pipe, &r->sample_rng.state, sizeof(r->sample_rng.state), h->pipe->size - 1);
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
    if (r->can_sample && step > 0 && train_due(r->args.sample_every, step, last)) {
        watchdog_phase("sampling", step);
        run_sample(r, step);
    }
    if (train_checkpoint_due(&r->args, step, r->start_step, last)) {
        watchdog_phase("checkpoint write", step);
        RunModel* h = &r->hooks;
        if (h->replicas) {
            write_checkpoint_gathered(h->model, r->args.out_dir, &r->world, h->replicas, h->split, step, &r->identity,
                                      rng_before_sample);
        } else {
            write_checkpoint(h->model, r->args.out_dir, &r->world, h->split, step, &r->identity, rng_before_sample);
        }
    }
    return last;
}

// the step's clock starts, and every group's byte counters
static inline void run_step_begin(Run* r) {
    r->step_start = wall_time_s();
    for (int i = 0; i < r->report.num_groups; i++) comm_reset_counters(r->report.groups[i]);
}

// The step's end: wait for the device, then its time, its collectives' time (CUDA: the GPU's
// timing of NCCL's calls, read after the sync) and its recomputation's (-r), into the run's
// averages, the step line and main.log (train.h: step_report)
static inline void run_step_end(Run* r, int step, float loss, float lr, float grad_norm, float clip_scale) {
    device_synchronize();
    double recompute_s = device_spans_collect(&recompute_spans);
    double dt = wall_time_s() - r->step_start, comm_s = 0.0;
    for (int i = 0; i < r->report.num_groups; i++) {
        comm_collect_times(r->report.groups[i]);
        comm_s += comm_seconds(r->report.groups[i]);
    }
    step_stats_add(&r->stats, step == r->start_step, dt, comm_s, recompute_s);
    double tokens_per_s = r->args.total_batch / dt;
    StepFigures f = {step + 1, r->max_steps, loss, lr, grad_norm, clip_scale, dt, recompute_s, tokens_per_s,
                     train_mfu(r->flops_per_token, tokens_per_s, r->world.size, r->peak)};
    step_report(&r->report, &r->logger, r->rank, f);
}

// The run's averages and, beside the memory table's prediction, the most this rank allocated;
// then the log, the tokenizer and the loaders are closed. The trainer frees its own state and
// ends with comm_finalize().
static inline void run_end(Run* r) {
    if (r->rank == 0) {
        step_stats_print(&r->stats, r->args.total_batch, r->flops_per_token, r->peak, r->world.size);
        train_print_high_water(r->plan.total);
    }
    watchdog_phase("shutdown", r->max_steps);
    logger_close(&r->logger);
    if (r->rank == 0 && r->can_sample) tokenizer_free(&r->tok);
    dataloader_free(&r->train);
    if (r->args.val_every > 0) dataloader_free(&r->val);
}

#endif
