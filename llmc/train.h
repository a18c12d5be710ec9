// The training state every trainer shares: the common flags (a trainer appends its own), the
// run's identity for checkpoints, the replicas' check, the model gathered from its ranks,
// checkpoint files (per rank, or gathered into the file's layout so that any grid resumes them),
// the AdamW step and where a run starts. The run around the step (what it prints, its samples,
// its order of events) is llmc/run.h.
#ifndef LLMC_TRAIN_H
#define LLMC_TRAIN_H

#include <math.h>
#include "args.h"
#include "checkpoint.h"
#include "comm.h"
#include "dataloader.h"
#include "logger.h"
#include "model.h"
#include "optimizer.h"
#include "rng.h"
#include "schedule.h"
#include "tokenizer.h"
#include "watchdog.h"

typedef struct {  // the common flags; see train_args_common for each one
    const char* train_path;
    const char* val_path;
    const char* model;
    const char* out_dir;
    const char* tokenizer_path;
    int B, T, total_batch;
    char total_batch_note[160];  // when -d was left at -1 on several readers: "-d -1: B*T*ranks, ranks = 2"
    float lr, final_lr_frac, weight_decay, grad_clip;
    int warmup, max_steps;
    int val_every, val_batches, sample_every, gen_tokens;
    int checkpoint_every, resume;
    int seed, shuffle;
    int watchdog;
    int recompute;
    const char* profile;  // the device profile the step's time is predicted on (NULL: this device's; run.h)
} TrainArgs;

#define TRAIN_MAX_SPECS 64
// -tok's default, relative to the repository's root (where the trainers are built): a run from
// another directory finds it beside the program (run.h, train_open_tokenizer)
#define TRAIN_DEFAULT_TOKENIZER "dev/data/gpt2_tokenizer.bin"

// the defaults (--help prints them beside each flag with the range it accepts), and the common
// flags' table into specs; returns how many it wrote, after which a trainer appends its own
static inline int train_args_common(TrainArgs* a, ArgSpec* specs) {
    a->train_path = "dev/data/tinyshakespeare/tiny_shakespeare_train.bin";
    a->val_path = "dev/data/tinyshakespeare/tiny_shakespeare_val.bin";
    a->model = "d12";
    a->out_dir = NULL;
    a->tokenizer_path = TRAIN_DEFAULT_TOKENIZER;
    a->B = 4;
    a->T = 64;
    a->total_batch = -1;
    a->lr = 3e-4f;
    a->final_lr_frac = 1.0f;
    a->weight_decay = 0.0f;
    a->grad_clip = 1.0f;
    a->warmup = 0;
    a->max_steps = -1;
    a->val_every = 20;
    a->val_batches = 20;
    a->sample_every = 20;
    a->gen_tokens = 64;
    a->checkpoint_every = 0;
    a->resume = 0;
    a->seed = 1337;
    a->shuffle = 0;
    a->watchdog = 0;
    a->recompute = 0;
    a->profile = NULL;
    const double MAX = ARG_NO_MAX;
    const ArgSpec common[] = {
        {"-i", ARG_STRING, &a->train_path, 0, 0, "train token file, or shards: a glob ('dir/train_*.bin', quoted) or a comma list of files, read in sorted path order as one stream of tokens (a batch may span two shards)"},
        {"-j", ARG_STRING, &a->val_path, 0, 0, "validation token file, or shards as for -i"},
        {"-e", ARG_STRING, &a->model, 0, 0, "model file, or descriptor dL for a random init (d12 = 124M)"},
        {"-o", ARG_STRING, &a->out_dir, 0, 0, "output dir for main.log and checkpoints; a fresh run needs one without checkpoints (-y 1 continues them; to start over, remove them or pick another dir)"},
        {"-b", ARG_INT, &a->B, 1, MAX, "micro-batch size in sequences, per data-parallel rank (tensor-parallel ranks share theirs)"},
        {"-t", ARG_INT, &a->T, 1, MAX, "sequence length"},
        {"-d", ARG_INT, &a->total_batch, -1, MAX, "total batch in tokens = B*T*(data-parallel ranks)*accumulation (-1: one micro-batch per step)"},
        {"-l", ARG_FLOAT, &a->lr, 0, MAX, "peak learning rate"},
        {"-u", ARG_INT, &a->warmup, 0, MAX, "warmup steps"},
        {"-q", ARG_FLOAT, &a->final_lr_frac, 0, 1, "final learning rate as a fraction of -l (cosine decay)"},
        {"-c", ARG_FLOAT, &a->weight_decay, 0, MAX, "AdamW weight decay (2-D weights only)"},
        {"-x", ARG_INT, &a->max_steps, -1, MAX, "optimizer steps (-1: one epoch)"},
        {"-v", ARG_INT, &a->val_every, 0, MAX, "validation loss every N steps (0: never)"},
        {"-m", ARG_INT, &a->val_batches, 1, MAX, "validation batches per evaluation"},
        {"-s", ARG_INT, &a->sample_every, 0, MAX, "sample text every N steps (0: never)"},
        {"-g", ARG_INT, &a->gen_tokens, 1, MAX, "tokens to generate per sample (capped at -t)"},
        {"-n", ARG_INT, &a->checkpoint_every, 0, MAX, "checkpoint every N steps and at the end (0: never)"},
        {"-y", ARG_INT, &a->resume, 0, 1, "1: resume from the newest checkpoint in -o"},
        {"-gc", ARG_FLOAT, &a->grad_clip, 0, MAX, "clip the global gradient norm to this (0: off)"},
        {"-seed", ARG_INT, &a->seed, 0, MAX, "seed of the random init, data shuffling and sampling"},
        {"-shuffle", ARG_INT, &a->shuffle, 0, 1, "1: shuffle the order of global batches every epoch"},
        {"-tok", ARG_STRING, &a->tokenizer_path, 0, 0, "tokenizer decode table, for samples"},
        {"-watchdog", ARG_INT, &a->watchdog, 0, MAX, "end the job when a rank makes no progress for this many seconds (0: off)"},
        {"-r", ARG_INT, &a->recompute, 0, RECOMPUTE_MAX, "activation recomputation: 0 keep every activation, 1 selective (drop the GELU output and attention's probabilities, recompute them in the backward pass), 2 full (keep each layer's output only, rerun the layer forward before its backward); same results bit for bit (on CUDA with LLMC_GELU=kernels)"},
        {"-profile", ARG_STRING, &a->profile, 0, 0, "the device profile the end-of-run line predicts the step on: h100-sxm, h200, a100-80gb or a file, of this build's kind (default: on CUDA this GPU's kind, on the CPU dev/profiles/cpu-this-machine.txt beside the program, dev/bench/calibrate's)"},
    };
    int n = (int)(sizeof(common) / sizeof(common[0]));
    for (int i = 0; i < n; i++) specs[i] = common[i];
    return n;
}

// the checks of the common flags that need the model's config
static inline void train_check_flags(const TrainArgs* args, GPT2Config config) {
    check_every_rank(args->T <= config.max_seq_len, "-t %d is longer than the model's maximum sequence length %d",
                     args->T, config.max_seq_len);
    check_every_rank(!((args->checkpoint_every > 0 || args->resume) && args->out_dir == NULL),
                     "-n and -y need an output dir (-o)");
}

// The batch layout: a micro-batch is B x T tokens on each of the `readers` ranks that read
// distinct data (DDP: every rank, readers_name "ranks"; tensor parallelism: its ranks share each
// micro-batch, readers 1 and no name), and a step accumulates -d / (B T readers) of them; -d -1
// means one micro-batch per step. Products are taken in 64 bits: -b 4194304 -t 1024 on 2 ranks
// is 2^33 tokens. Returns the accumulation steps, and sets -d when it was -1.
static inline int train_accumulation_steps(TrainArgs* args, int readers, const char* readers_name) {
    char what[64];
    snprintf(what, sizeof(what), readers_name ? "B*T*%s" : "B*T", readers_name);
    size_t tokens_per_pass = mul_check(mul_check(args->B, args->T, "-b x -t"), readers, "-b x -t x ranks");
    if (args->total_batch == -1) {
        if (tokens_per_pass > INT_MAX) fail("%s = %zu tokens does not fit -d's int range", what, tokens_per_pass);
        args->total_batch = (int)tokens_per_pass;
        // (the identity names the readers: a resume on another world then says so, not just -d)
        if (readers_name) snprintf(args->total_batch_note, sizeof(args->total_batch_note), "-d -1: %s, %s = %d", what,
                                   readers_name, readers);
    }
    {
        char factors[64];
        snprintf(factors, sizeof(factors), readers_name ? "%d*%d*%d" : "%d*%d", args->B, args->T, readers);
        check_every_rank(args->total_batch > 0 && args->total_batch % tokens_per_pass == 0, "-d %d must be a positive multiple of %s = %s = %zu%s", args->total_batch, what, factors,
             tokens_per_pass, readers_name ? "" : " (the ranks share every micro-batch)");
    }
    return (int)(args->total_batch / tokens_per_pass);
}

// what happens between two steps, and when: validation every -v steps, samples every -s, a
// checkpoint every -n, each also after the last step. A resumed run does not write again the
// checkpoint it started from.
static inline int train_due(int every, int step, int last) { return every > 0 && (step % every == 0 || last); }
static inline int train_checkpoint_due(const TrainArgs* args, int step, int start_step, int last) {
    int resumed_here = args->resume && step == start_step;  // this checkpoint exists already
    return args->checkpoint_every > 0 && !resumed_here &&
           (last || (step > start_step && step % args->checkpoint_every == 0));
}

// a validation loss, printed by rank 0 and logged; a non-finite one stops the run
// (every rank reports the same loss: an error every rank meets alike, printed once by rank 0)
static inline void train_report_val(Logger* logger, int rank, int step, float val_loss) {
    if (!isfinite(val_loss)) check_every_rank(0, "step %d: the validation loss is %g; stopping", step, val_loss);
    if (rank == 0) printf("val loss after %d steps: %.6f\n", step, val_loss);
    logger_val(logger, step, val_loss);
}

// A nan or inf loss or gradient norm stops the run before the update, so that nothing of this
// step is logged or checkpointed. Every trainer reduces both over its ranks first, so all ranks
// see the same values and stop together: an error every rank meets alike, printed once, by
// rank 0 (check_every_rank; its all-reduce is paid only on the way out).
// (lr_flags: the flags whose step sizes could have caused it, "-l" or DiLoCo's "-l or -outer_lr")
static inline void train_stop_if_not_finite_hint(int step, float loss, float grad_norm, const char* lr_flags) {
    if (!isfinite(loss) || !isfinite(grad_norm)) {
        check_every_rank(0, "step %d: the %s is %g; stopping before the update, so nothing of this step is "
             "written (any checkpoint written before stays intact; try a lower %s)", step + 1,
             isfinite(loss) ? "gradient norm" : "loss", isfinite(loss) ? grad_norm : loss, lr_flags);
    }
}
static inline void train_stop_if_not_finite(int step, float loss, float grad_norm) {
    train_stop_if_not_finite_hint(step, loss, grad_norm, "-l");
}

// the run's identity (checkpoint.h): everything that determines the training trajectory, common
// to every trainer; a trainer adds its layout. The train data is identified by content, so a moved
// or copied file still resumes; rank 0 reads it once.
// layout: how the ranks are arranged, e.g. "dp=2 tp=1 pp=1", which a resume must match; NULL for
// checkpoints that any layout loads (train_gpt2_3d.cu): the ranks, the layout and -b are left out,
// since -d (the global batch) and the data order alone fix what a step trains on
static inline void train_run_identity(RunIdentity* id, const TrainArgs* args, GPT2Config config,
                                      const float* initial_weights, DataLoader* train, int max_steps,
                                      const char* layout, CommGroup* world) {
    uint32_t train_crc = world->rank == 0 ? dataloader_file_crc(train) : 0;
    comm_broadcast_host(world, &train_crc, sizeof(train_crc), 0);
    id->len = 0;
    id->text[0] = '\0';
    run_identity_add(id, "-e", "L=%d NH=%d C=%d V=%d Vp=%d maxT=%d, initial weights CRC-32 %08x",
                     config.num_layers, config.num_heads, config.channels, config.vocab_size,
                     config.padded_vocab_size, config.max_seq_len,
                     crc32_update(0, initial_weights, gpt2_num_parameters(config) * sizeof(float)));
    if (train->num_shards == 1) run_identity_add(id, "-i", "%zu tokens, CRC-32 %08x", train->num_tokens, train_crc);
    else run_identity_add(id, "-i", "%d shards, %zu tokens, CRC-32 %08x", train->num_shards, train->num_tokens, train_crc);
    if (layout) {
        run_identity_add(id, "ranks", "%d", world->size);
        run_identity_add(id, "layout", "%s", layout);
        run_identity_add(id, "-b", "%d", args->B);
    }
    run_identity_add(id, "-t", "%d", args->T);
    if (args->total_batch_note[0]) run_identity_add(id, "-d", "%d (%s)", args->total_batch, args->total_batch_note);
    else run_identity_add(id, "-d", "%d", args->total_batch);
    run_identity_add(id, "-l", "%.9g", args->lr);
    run_identity_add(id, "-u", "%d", args->warmup);
    run_identity_add(id, "-q", "%.9g", args->final_lr_frac);
    if (args->final_lr_frac != 1.0f) run_identity_add(id, "-x", "%d", max_steps);  // the decay's length
    run_identity_add(id, "-c", "%.9g", args->weight_decay);
    run_identity_add(id, "-gc", "%.9g", args->grad_clip);
    run_identity_add(id, "-seed", "%d", args->seed);
    run_identity_add(id, "-shuffle", "%d", args->shuffle);
    run_identity_add(id, "precision", "%s", PRECISION_NAME);
}

// Data parallelism rests on every replica holding the same parameters, tensor parallelism on
// every copy of a replicated tensor (LayerNorms, biases, wpe) staying the same, and pipeline
// parallelism on the first and last stage's copies of the tied wte staying the same. This checks
// it: a CRC-32 of the bits of this rank's tensors `which` (1 << i for tensor i; NULL: those not
// split over tensor-parallel ranks, all of them without tensor parallelism), its two 16-bit
// halves reduced with max and min over the group (four 4-byte all-reduces; a float holds 16 bits
// exactly). Any difference stops every rank.
static inline void train_check_replicas(const GPT2* model, CommGroup* group, int step, const unsigned* which,
                                        const char* what) {
    const ParameterLayout* p = &model->layout;
    floatX* host = (floatX*)malloc_check(p->count * sizeof(floatX));
    copy_device_to_host(host, model->params_memory, p->count * sizeof(floatX));
    uint32_t crc = 0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        int checked = which ? (*which >> i) & 1 : !p->sharded[i];
        if (checked) crc = crc32_update(crc, host + p->offsets[i], p->sizes[i] * sizeof(floatX));
    }
    free(host);
    float half[2] = {(float)(crc >> 16), (float)(crc & 0xffff)}, lo[2], hi[2];
    for (int i = 0; i < 2; i++) {
        lo[i] = hi[i] = half[i];
        comm_all_reduce_scalar(group, &hi[i], COMM_MAX);
        lo[i] = -lo[i];  // min as the max of the negation: the comm layer reduces sum, avg, max
        comm_all_reduce_scalar(group, &lo[i], COMM_MAX);
        lo[i] = -lo[i];
    }
    if (lo[0] != hi[0] || lo[1] != hi[1]) {
        fail("step %d: the %s differ: this rank's have CRC-32 %08x; over the ranks the upper 16 "
             "bits range %04x..%04x, the lower %04x..%04x. Every rank must start from the same "
             "weights (same -e and -seed) and apply the same update", step, what, crc,
             (unsigned)lo[0], (unsigned)hi[0], (unsigned)lo[1], (unsigned)hi[1]);
    }
    if (group->rank == 0) printf("step %d: %s identical (parameter CRC-32 %08x on %d ranks)\n", step, what, crc, group->size);
}

// bf16 parameters are not a function of the fp32 master weights (stochastic rounding), so the
// state file keeps their exact bits; fp32 parameters are the model file itself
static inline size_t low_precision_param_bytes(const GPT2* model) {
    return model->master_memory ? layout_params_held(&model->layout) * sizeof(floatX) : 0;
}

// The whole model in the file's layout, fp32, into full (host) on rank 0 of `group`, from a
// device buffer of every rank's layout (src: weights or gradients, of type dtype). With the model
// split over the ranks of the group (tensor or pipeline parallelism: the ranks of
// parameter_layout_of_rank) each rank sends its pieces to rank 0, one rank after another, and
// rank 0 puts them in place (a tied wte comes from both its stages, identical); without (group
// may be NULL) the rank copies its own buffer. (A ZeRO rank's shards: zero_gather_full.)
static inline int layout_is_split(const ParameterLayout* p) { return layout_model_ranks(p) > 1; }

static inline void gpt2_gather_full(const GPT2* model, CommGroup* group, const void* src, CommDtype dtype,
                                    float* full) {
    const ParameterLayout* p = &model->layout;
    size_t elem = comm_dtype_bytes(dtype);
    int ranks = layout_model_ranks(p), rank = ranks > 1 ? group->rank : 0;
    if (rank != 0) {
        comm_send(group, src, p->count, dtype, 0);  // (this rank's parameters): its pieces to rank 0
        return;
    }
    size_t most = p->count;  // pipeline stages hold different counts
    for (int r = 1; r < ranks; r++) {
        size_t n = parameter_layout_of_rank(model->config, p, r).count;
        most = n > most ? n : most;
    }
    float* shard = (float*)malloc_check(most * sizeof(float));
    void* received = ranks > 1 ? device_malloc(most * elem) : NULL;
    for (int r = 0; r < ranks; r++) {
        ParameterLayout of_r = r == 0 ? *p : parameter_layout_of_rank(model->config, p, r);
        const void* from = src;
        if (r > 0) {
            comm_recv(group, received, of_r.count, dtype, r);
            from = received;
        }
        if (dtype == COMM_FLOAT) copy_device_to_host(shard, from, of_r.count * sizeof(float));
        else copy_device_to_floats(shard, (const floatX*)from, of_r.count);
        parameter_shard_copy(full, shard, &of_r, model->config, 0);
    }
    if (received) device_free(received);
    free(shard);
}

// The whole model in the file's layout, fp32, into full (host) on rank 0, from every rank's
// shards (ZeRO; src: a device buffer of shards, fp32 or floatX): each bucket is all-gathered over
// the data-parallel group into a bucket-sized device buffer, one bucket at a time, so that no
// rank ever holds more than one whole bucket on the device: that buffer's bytes are
// zero_gather_full_bytes (none without ZeRO).
// the same, written as a model file by rank 0 of the group (-dump_grads: the gradients)
static inline void gpt2_write_gathered(const GPT2* model, CommGroup* group, const void* src, const char* path) {
    int root = group == NULL || group->rank == 0;
    float* full = root ? (float*)malloc_check(gpt2_num_parameters(model->config) * sizeof(float)) : NULL;
    gpt2_gather_full(model, group, src, COMM_FLOATX, full);
    if (root) gpt2_write_model_file(path, model->config, full);
    free(full);
}

static inline size_t zero_gather_full_bytes(const ParameterLayout* p, CommDtype dtype) {
    return p->zero > 0 ? parameter_largest_bucket(p) * comm_dtype_bytes(dtype) : 0;
}
static inline void zero_gather_full(const GPT2* model, CommGroup* group, const void* src, CommDtype dtype, float* full) {
    const ParameterLayout* p = &model->layout;
    size_t elem = comm_dtype_bytes(dtype);
    void* bucket = device_malloc(zero_gather_full_bytes(p, dtype));
    float* whole = group->rank == 0 ? (float*)malloc_check(p->count * sizeof(float)) : NULL;
    for (int k = 0; k < parameter_num_buckets(p); k++) {
        size_t global, local, n;
        layout_bucket_shard(p, k, &global, &local, &n);
        // (bucket k): every rank's shard of it, in rank order. The rank's own is copied to its
        // place first and gathered in place: src may be host memory (-offload's master weights),
        // which a collective cannot read on every backend
        copy_host_to_device((char*)bucket + (size_t)group->rank * n * elem, (const char*)src + local * elem, n * elem);
        CommRequest gathering;
        comm_all_gather_start(group, NULL, bucket, n, dtype, &gathering);
        comm_wait(&gathering);
        if (!whole) continue;
        float* at = whole + parameter_bucket_offset(p, k);
        if (dtype == COMM_FLOAT) copy_device_to_host(at, bucket, n * p->shards * sizeof(float));
        else copy_device_to_floats(at, (const floatX*)bucket, n * p->shards);
    }
    if (whole) parameter_shard_copy(full, whole, p, model->config, 0);
    device_free(bucket);
    free(whole);
}

// A trainer's own state beyond the model's, per rank (DiLoCo: the outer parameters, their
// momentum and this worker's weights): fp32 device buffers that every rank's state file carries
// after its moments and parameter bits, and that a resume restores last, over what the model
// file and the moments set
#define TRAINER_STATE_MAX 6
typedef struct {
    float* buffers[TRAINER_STATE_MAX];
    size_t counts[TRAINER_STATE_MAX];
    int num;
} TrainerState;

static inline size_t trainer_state_bytes(const TrainerState* own) {
    size_t bytes = 0;
    for (int i = 0; own && i < own->num; i++) bytes += own->counts[i] * sizeof(float);
    return bytes;
}

// between the device buffers and the state file's extra bytes, after the parameter bits at `at`
static inline void trainer_state_to_host(const TrainerState* own, char* at) {
    for (int i = 0; own && i < own->num; i++) {
        copy_device_to_host(at, own->buffers[i], own->counts[i] * sizeof(float));
        at += own->counts[i] * sizeof(float);
    }
}
static inline void trainer_state_to_device(const TrainerState* own, const char* at) {
    for (int i = 0; own && i < own->num; i++) {
        copy_host_to_device(own->buffers[i], at, own->counts[i] * sizeof(float));
        at += own->counts[i] * sizeof(float);
    }
}

// Every rank writes its state file (its AdamW moments, its bf16 parameter bits and the trainer's
// own state), rank 0 the model file (the whole model, gathered over `group` when the model is
// split; NULL without), then DONE marks the checkpoint complete (checkpoint.h). Under DDP the
// AdamW moments are the same on every rank and one copy would do; each rank writes its own
// anyway, because in the sharded trainers (ZeRO, TP, PP) and DiLoCo's workers they differ, one
// format serves all, and a resume then checks every rank's state against the others'.
static inline void write_checkpoint(GPT2* model, const char* dir, CommGroup* world, CommGroup* group,
                                    int step, const RunIdentity* id, uint64_t sample_rng_state, const TrainerState* own,
                                    const DataLoader* train) {
    char path[4096];
    size_t n = layout_state_held(&model->layout), bits = low_precision_param_bytes(model);
    size_t extra = bits + trainer_state_bytes(own);
    TrainState s = {step, world->size, sample_rng_state, 0, 0, 0};
    dataloader_position(train, &s.data_shard, &s.data_offset);
    int sharded;
    const float* weights = gpt2_fp32_weights(model, &sharded);
    // unsplit and unsharded, the replicas are identical and rank 0 writes its own
    if (layout_is_split(&model->layout) || sharded || world->rank == 0) {
        float* full = world->rank == 0 ? (float*)malloc_check(gpt2_num_parameters(model->config) * sizeof(float)) : NULL;
        if (sharded) zero_gather_full(model, group, weights, COMM_FLOAT, full);
        else gpt2_gather_full(model, group, weights, COMM_FLOAT, full);
        if (world->rank == 0) {
            // an update can overflow the weights while its loss and gradient norm were finite;
            // such weights never become a checkpoint (the other ranks wait below and are stopped too)
            char what[64];
            snprintf(what, sizeof(what), "the weights after step %d (not checkpointed)", step);
            gpt2_check_finite(full, model->config, what);
            checkpoint_path(path, sizeof(path), dir, "model", step, -1);
            s.model_crc = gpt2_write_model_file(path, model->config, full);
            free(full);
        }
    }
    // every state file records the model file's checksum, so that a resume can tell a model
    // file of another checkpoint from the right one
    comm_broadcast_host(world, &s.model_crc, sizeof(s.model_crc), 0);
    float* host = (float*)malloc_check(n * sizeof(float) * 2);
    copy_device_to_host(host, model->m_memory, n * sizeof(float));
    copy_device_to_host(host + n, model->v_memory, n * sizeof(float));
    char* params = (char*)malloc_check(extra);
    if (bits > 0) copy_device_to_host(params, model->params_memory, bits);
    trainer_state_to_host(own, params + bits);
    checkpoint_path(path, sizeof(path), dir, "state", step, world->rank);
    state_write(path, &s, world->rank, id, host, host + n, n, params, extra);
    free(host);
    free(params);
    comm_barrier(world);  // DONE only once every rank's file is in place
    if (world->rank == 0) checkpoint_mark_done(dir, step);
}

// the model file of checkpoint `step`, checked against the checksum its state files recorded, into
// this rank's pieces of the weights
static inline void checkpoint_load_weights(GPT2* model, const char* dir, int step, uint32_t expected_crc) {
    char path[4096];
    GPT2Config c;
    uint32_t model_crc;
    checkpoint_path(path, sizeof(path), dir, "model", step, -1);
    float* weights = gpt2_read_model_file(path, &c, &model_crc);
    if (gpt2_num_parameters(c) != gpt2_num_parameters(model->config)) fail("checkpoint '%s' does not match the model of -e", path);
    if (model_crc != expected_crc) {
        fail("model file '%s' has CRC-32 %08x, but the state files of step %d were written with "
             "one of CRC-32 %08x: the files of this checkpoint do not belong together", path,
             model_crc, step, expected_crc);
    }
    gpt2_weights_from_full(model, weights);
    free(weights);
}

// Loads checkpoint `step` into the model; returns its state. Every rank checks its own state
// file against the step rank 0 chose, its rank, the world size and this run's identity, and the
// model file against the checksum its state file recorded: any mismatch stops every rank
// before anything is written. Every rank reads the whole model file and keeps its slices.
static inline TrainState read_checkpoint(GPT2* model, const char* dir, CommGroup* world, int step,
                                         const RunIdentity* id, const TrainerState* own) {
    char path[4096];
    size_t n = layout_state_held(&model->layout), bits = low_precision_param_bytes(model);
    size_t extra = bits + trainer_state_bytes(own);
    float* host = (float*)malloc_check(n * sizeof(float) * 2);
    char* params = (char*)malloc_check(extra);
    state_check_exists(dir, step, world->rank, world->size);  // a rank the checkpoint never had
    checkpoint_path(path, sizeof(path), dir, "state", step, world->rank);
    TrainState s = state_read(path, step, world->rank, world->size, id, host, host + n, n, params, extra);
    checkpoint_load_weights(model, dir, step, s.model_crc);
    copy_host_to_device(model->m_memory, host, n * sizeof(float));
    copy_host_to_device(model->v_memory, host + n, n * sizeof(float));
    if (bits > 0) copy_host_to_device(model->params_memory, params, bits);
    trainer_state_to_device(own, params + bits);
    free(host);
    free(params);
    return s;
}

// ---------------------------------------------------------------------------------------------
// Checkpoints that any layout loads (train_gpt2_3d.cu). Beside the model file, one state file
// state_S.bin holds the whole training state in the model file's layout, in fp32: the AdamW
// moments m and v (P each) and, with bf16 parameters, their exact bits (P more: every bf16 value
// is an fp32 value). Rank 0 gathers it from the ranks' pieces as it gathers the weights; on
// resume every rank reads the whole files and keeps its own pieces, whatever layout wrote them.
// The state file's header holds rank 0 and world 0: there is no rank or world size to match. A
// trainer's own state here must be the same on every rank (MoE's routing bias): rank 0 writes
// its copy after the bits, and every rank reads it back.

// The groups a ZeRO-1 state is sharded over (layout_shard_flat): the dense tensors' (the
// data-parallel group) and, with experts, theirs (the ranks holding the same experts; else NULL)
typedef struct {
    CommGroup* dense;
    CommGroup* experts;
} StateShards;

// One of this rank's device buffers (fp32, or floatX for the parameter bits), whole or with
// ZeRO-1 its shards (sharded), into `full` (host, the file's layout) on world rank 0: the shards
// are first all-gathered into `whole` (device, the layout's count: the rank's whole buffer), the
// dense one over shards.dense, the experts' over shards.experts; then rank 0 of `replicas` (of
// each set of copies, one) gathers its pieces over its model-parallel group mp (tp x pp ranks)
static inline void gather_state_full(const GPT2* model, StateShards shards, CommGroup* replicas, CommGroup* mp,
                                     const void* src, int sharded, CommDtype dtype, void* whole, float* full) {
    const ParameterLayout* p = &model->layout;
    if (sharded) {
        uint64_t dense_lo, n_dense, experts_lo, n_experts;
        size_t elem = comm_dtype_bytes(dtype), experts_at = (p->count - p->expert_region) * elem;
        layout_flat_shards(p, &dense_lo, &n_dense, &experts_lo, &n_experts);
        comm_all_gather(shards.dense, src, whole, n_dense, dtype);
        if (n_experts > 0) {
            comm_all_gather(shards.experts, (const char*)src + n_dense * elem, (char*)whole + experts_at, n_experts, dtype);
        }
        src = whole;
    }
    if (replicas->rank == 0) gpt2_gather_full(model, mp, src, dtype, full);
}

static inline void write_checkpoint_gathered(GPT2* model, const char* dir, CommGroup* world, StateShards shards,
                                             CommGroup* replicas, CommGroup* mp,
                                             int step, const RunIdentity* id, uint64_t sample_rng_state,
                                             const TrainerState* own, const DataLoader* train) {
    const ParameterLayout* p = &model->layout;
    size_t P = gpt2_num_parameters(model->config), bits = model->master_memory ? P * sizeof(float) : 0;
    size_t extra = bits + trainer_state_bytes(own);
    int root = world->rank == 0, weights_sharded, state_sharded = layout_state_held(p) < p->count;
    const float* weights = gpt2_fp32_weights(model, &weights_sharded);
    float* full = root ? (float*)malloc_check(P * sizeof(float) * 3 + extra) : NULL;  // weights, m, v, bits, own
    void* whole = weights_sharded || state_sharded ? device_malloc(p->count * sizeof(float)) : NULL;
    gather_state_full(model, shards, replicas, mp, weights, weights_sharded, COMM_FLOAT, whole, full);
    gather_state_full(model, shards, replicas, mp, model->m_memory, state_sharded, COMM_FLOAT, whole, root ? full + P : NULL);
    gather_state_full(model, shards, replicas, mp, model->v_memory, state_sharded, COMM_FLOAT, whole, root ? full + 2 * P : NULL);
    if (bits) gather_state_full(model, shards, replicas, mp, model->params_memory, 0, COMM_FLOATX, whole, root ? full + 3 * P : NULL);
    if (root) trainer_state_to_host(own, (char*)(full + 3 * P) + bits);
    if (whole) device_free(whole);
    TrainState s = {step, 0, sample_rng_state, 0, 0, 0};
    dataloader_position(train, &s.data_shard, &s.data_offset);
    if (root) {
        char path[4096], what[64];
        snprintf(what, sizeof(what), "the weights after step %d (not checkpointed)", step);
        gpt2_check_finite(full, model->config, what);  // (write_checkpoint says why)
        checkpoint_path(path, sizeof(path), dir, "model", step, -1);
        s.model_crc = gpt2_write_model_file(path, model->config, full);
        checkpoint_path(path, sizeof(path), dir, "state", step, -1);
        state_write(path, &s, 0, id, full + P, full + 2 * P, P, full + 3 * P, extra);
        free(full);
    }
    comm_barrier(world);  // DONE only once the files are in place (and every rank got here)
    if (root) checkpoint_mark_done(dir, step);
}

// this rank's pieces of a whole fp32 array in the file's layout (host), as it holds them: all of
// them, or with sharded its ZeRO shard
static inline float* layout_pieces_of_full(const GPT2* model, const float* full, int sharded) {
    const ParameterLayout* p = &model->layout;
    float* mine = (float*)calloc_check(p->count, sizeof(float));  // padding stays 0
    parameter_shard_copy((float*)full, mine, p, model->config, 1);
    if (!sharded) return mine;
    float* shard = (float*)malloc_check(layout_state_held(p) * sizeof(float));
    layout_take_shards(p, mine, shard);
    free(mine);
    return shard;
}

// a CheckpointReader (train_start_from): every rank reads the gathered state file and the model
// file, checks them as read_checkpoint does, and keeps its pieces
static inline TrainState read_checkpoint_gathered(GPT2* model, const char* dir, CommGroup* world, int step,
                                                  const RunIdentity* id, const TrainerState* own) {
    (void)world;
    const ParameterLayout* p = &model->layout;
    size_t P = gpt2_num_parameters(model->config), bits = model->master_memory ? P * sizeof(float) : 0;
    size_t extra = bits + trainer_state_bytes(own);
    float* full = (float*)malloc_check(P * sizeof(float) * 2 + extra);  // m, v, bits, own
    char path[4096];
    checkpoint_path(path, sizeof(path), dir, "state", step, -1);
    FILE* f = fopen(path, "rb");  // (missing: perhaps another trainer's kind of checkpoint)
    if (f == NULL) state_check_kind(dir, step, /*gathered*/ 1);
    else fclose(f);
    TrainState s = state_read(path, step, 0, 0, id, full, full + P, P, full + 2 * P, extra);
    checkpoint_load_weights(model, dir, step, s.model_crc);
    size_t held = layout_state_held(p);
    float* buffers[2] = {model->m_memory, model->v_memory};
    for (int i = 0; i < 2; i++) {
        float* mine = layout_pieces_of_full(model, full + i * P, held < p->count);
        copy_host_to_device(buffers[i], mine, held * sizeof(float));
        free(mine);
    }
    if (bits) {  // the bf16 bits, exact in fp32, back to bf16 (exact again)
        float* mine = layout_pieces_of_full(model, full + 2 * P, layout_params_held(p) < p->count);
        copy_floats_to_device(model->params_memory, mine, layout_params_held(p));
        free(mine);
    }
    trainer_state_to_device(own, (const char*)(full + 2 * P) + bits);
    free(full);
    return s;
}

// The AdamW settings of every trainer's step, after the gradient norm: clipping to -gc, the
// learning rate of the schedule, and a stochastic-rounding seed of (-seed, step), the same on
// every rank, so that whatever a layout replicates rounds alike; clip_scale receives the clipping
// factor. train_adamw_step runs it over this rank's whole buffer and returns the learning rate
// (a ZeRO rank runs it over its shards instead).
static inline AdamWConfig train_adamw_config(const TrainArgs* args, int step, int max_steps, float grad_norm,
                                             float* clip_scale) {
    float lr = learning_rate_at(step, args->lr, args->warmup, max_steps, args->final_lr_frac);
    AdamWConfig opt = {lr, 0.9f, 0.95f, 1e-8f, args->weight_decay,
                       (unsigned int)args->seed * 1000003u + (unsigned int)step};
    *clip_scale = optimizer_clip_scale(grad_norm, args->grad_clip);
    return opt;
}

static inline float train_adamw_step(GPT2* model, const TrainArgs* args, int step, int max_steps, float grad_norm,
                                     float* clip_scale) {
    AdamWConfig opt = train_adamw_config(args, step, max_steps, grad_norm, clip_scale);
    optimizer_adamw_step(model->params_memory, model->master_memory, model->grads_memory, model->m_memory,
                         model->v_memory, 0, model->num_parameters, &model->layout, opt, *clip_scale, step + 1);
    return opt.lr;
}

// "resumed from step S": said once the trainer's own checks of the checkpoint passed too (run.h)
static inline void train_report_resume(const CommGroup* world, const char* dir, int step, int max_steps) {
    if (world->rank != 0) return;
    printf("resumed from step %d in %s\n", step, dir);
    if (step == max_steps) {  // (validation and sampling as at any end, no step)
        printf("the checkpoint is at -x %d already: the run is complete, nothing to train (a larger -x goes on)\n", max_steps);
    }
}

// Where a run starts: step 0 with the sampling rng seeded from -seed, or with -y 1 the newest
// complete checkpoint in -o. Rank 0 picks its step (the newest DONE_) and broadcasts it; every
// rank checks that its files are of that step, of its rank, of this layout and of this run
// (read_checkpoint); a barrier then makes sure every rank's checks passed before anything
// (main.log first) is written. The sampling rng and the train loader continue from the
// checkpoint. Returns the step.
// read: how this trainer's checkpoints are read (read_checkpoint, or read_checkpoint_gathered)
// (own: the trainer's state of its own, or NULL)
typedef TrainState (*CheckpointReader)(GPT2* model, const char* dir, CommGroup* world, int step, const RunIdentity* id,
                                       const TrainerState* own);
// (the reader's arguments, for every_rank_alike)
typedef struct {
    CheckpointReader read;
    GPT2* model;
    const char* dir;
    CommGroup* world;
    int step;
    const RunIdentity* id;
    const TrainerState* own;
    TrainState state;
} CheckpointRead;
static inline void train_read_checkpoint(void* arg) {
    CheckpointRead* c = (CheckpointRead*)arg;
    c->state = c->read(c->model, c->dir, c->world, c->step, c->id, c->own);
}

static inline int train_start_from(GPT2* model, const TrainArgs* args, CommGroup* world, int max_steps,
                                   const RunIdentity* id, Rng* sample_rng, DataLoader* train, CheckpointReader read,
                                   const TrainerState* own) {
    rng_init(sample_rng, (uint64_t)args->seed + 1);
    if (!args->resume) return 0;
    watchdog_phase("resume", 0);
    const char* dir = args->out_dir;
    int latest = world->rank == 0 ? checkpoint_latest(dir) : 0;
    comm_broadcast_host(world, &latest, sizeof(int), 0);
    // (every rank knows latest now: an error is printed once)
    check_every_rank(latest >= 0, "-y 1: no complete checkpoint (DONE_ file) in '%s'", dir);
    check_every_rank(latest <= max_steps, "-x %d: the newest checkpoint in '%s' is already at step %d, so there is "
                     "nothing to train; raise -x", max_steps, dir, latest);
    // every rank reads its files; a refusal that every rank meets (another run's checkpoint, one
    // of another world) is printed once, by rank 0, one that some meet (a corrupt file) by those
    CheckpointRead c = {read, model, dir, world, latest, id, own, {0, 0, 0, 0, 0, 0}};
    every_rank_alike(train_read_checkpoint, &c);
    TrainState s = c.state;
    comm_barrier(world);
    sample_rng->state = s.rng;
    dataloader_seek(train, (size_t)s.step);
    // the step fixes the data position (the run identity holds the token files' CRC, so these
    // are the files the checkpoint was written with); the position it recorded must agree
    int shard;
    size_t offset;
    dataloader_position(train, &shard, &offset);
    check_every_rank(s.data_shard < 0 || (s.data_shard == shard && s.data_offset == (uint64_t)offset),
                     "the checkpoint of step %d in '%s' continues the data at shard %d, token %llu, but its step "
                     "gives shard %d ('%s'), token %zu of '%s'%s", s.step, dir, s.data_shard,
                     (unsigned long long)s.data_offset, shard, train->shards[shard], offset, train->spec,
                     path_origin(train->spec));
    return s.step;
}

#endif
