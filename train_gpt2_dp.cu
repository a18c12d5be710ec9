/*
GPT-2 training with data parallelism (DDP).

Every rank holds a full replica of the model and the optimizer. Each step:
  1. each rank runs forward + backward on its own slice of the global batch (micro-batches of
     B x T tokens, accumulated `accum` times),
  2. one all-reduce averages the flattened gradient buffer over the ranks,
  3. every rank applies the same AdamW step to the same averaged gradient, so the replicas stay
     identical without ever sending a parameter.
The result is the same as one process training on the whole global batch (checked in test/).

Build: make train_gpt2_dp          Run: mpirun -np 2 ./train_gpt2_dp -e d6 -x 100 -o out
The same source compiles as C for the CPU backend and as CUDA with nvcc (llmc/ops.h).
*/
#include <math.h>
#include <stdint.h>
#include "llmc/utils.h"
#include "llmc/args.h"
#include "llmc/comm.h"
#include "llmc/gpt2.h"
#include "llmc/dataloader.h"
#include "llmc/tokenizer.h"
#include "llmc/schedule.h"
#include "llmc/logger.h"
#include "llmc/checkpoint.h"
#include "llmc/rng.h"
#include "llmc/watchdog.h"
#include "llmc/ops.h"
#include "llmc/memory.h"
#include "llmc/model.h"
#include "llmc/block.h"
#include "llmc/optimizer.h"
#include "llmc/train.h"

// ----------------------------------------------------------------------------------------------
// forward and backward of the whole model on one micro-batch. B and T may be smaller than the
// allocated shape (sampling uses B = 1): per-layer slices are laid out with the actual B, T.

static void gpt2_forward(GPT2* model, const int* inputs_host, int B, int T) {
    GPT2Config c = model->config;
    LayerDims d = model->dims;
    int L = c.num_layers, C = c.channels;
    ParameterTensors p = model->params;
    Activations* a = &model->acts;
    copy_host_to_device(model->inputs, inputs_host, (size_t)B * T * sizeof(int));

    encoder_forward(a->encoded, model->inputs, p.wte, p.wpe, B, T, C);
    LayerActs first = layer_acts(a, d, B, T, 0);
    layernorm_forward(first.ln1, first.ln1_mean, first.ln1_rstd, a->encoded, p.ln1w, p.ln1b, B * T, C);
    for (int l = 0; l < L; l++) {
        LayerWeights w = layer_weights(p, d, l);
        LayerActs x = layer_acts(a, d, B, T, l);
        floatX* residual = l == 0 ? a->encoded : layer_acts(a, d, B, T, l - 1).residual3;
        // attention half (block.h), its residual add fused with ln2: residual2 = x + attproj
        attention_half_forward(x, w, B, T, d);
        fused_residual_layernorm_forward(x.residual2, x.ln2, x.ln2_mean, x.ln2_rstd, residual,
                                         x.attproj, w.ln2w, w.ln2b, B * T, C);
        // MLP half, its residual add fused with the next LayerNorm (the next layer's ln1, or
        // lnf after the last layer): residual3 = residual2 + fcproj
        mlp_half_forward(x, w, B, T, d);
        if (l + 1 < L) {
            LayerWeights wn = layer_weights(p, d, l + 1);
            LayerActs xn = layer_acts(a, d, B, T, l + 1);
            fused_residual_layernorm_forward(x.residual3, xn.ln1, xn.ln1_mean, xn.ln1_rstd, x.residual2,
                                             x.fcproj, wn.ln1w, wn.ln1b, B * T, C);
        } else {
            fused_residual_layernorm_forward(x.residual3, a->lnf, a->lnf_mean, a->lnf_rstd,
                                             x.residual2, x.fcproj, p.lnfw, p.lnfb, B * T, C);
        }
    }
    // LM head tied to the token embedding: logits (B, T, Vp) = lnf @ wte^T
    matmul_forward(a->logits, a->lnf, p.wte, NULL, B * T, C, d.Vp);
}

// accumulates parameter gradients into model->grads; expects gpt2_loss to have left dlogits
static void gpt2_backward(GPT2* model, int B, int T) {
    GPT2Config c = model->config;
    LayerDims d = model->dims;
    int L = c.num_layers, C = c.channels;
    ParameterTensors p = model->params, g = model->grads;
    Activations* a = &model->acts;

    // LM head and final LayerNorm: dresidual = gradient w.r.t. the last layer's output
    matmul_backward(a->dbuf, g.wte, NULL, a->logits, a->lnf, p.wte, B * T, C, d.Vp);
    device_memset_zero(a->dresidual, (size_t)B * T * C * sizeof(floatX));
    layernorm_backward(a->dresidual, g.lnfw, g.lnfb, a->dbuf, layer_acts(a, d, B, T, L - 1).residual3,
                       p.lnfw, a->lnf_mean, a->lnf_rstd, B * T, C);
    for (int l = L - 1; l >= 0; l--) {
        LayerWeights w = layer_weights(p, d, l), gw = layer_weights(g, d, l);
        LayerActs x = layer_acts(a, d, B, T, l);
        floatX* residual = l == 0 ? a->encoded : layer_acts(a, d, B, T, l - 1).residual3;
        // a residual add passes dresidual to both of its inputs unchanged: to the MLP half's
        // output, and on down the stream, where each LayerNorm's input gradient is added to it
        mlp_half_backward(a->dbuf, a->dfch, a->dresidual, x, w, gw, B, T, d);
        layernorm_backward(a->dresidual, gw.ln2w, gw.ln2b, a->dbuf, x.residual2, w.ln2w, x.ln2_mean,
                           x.ln2_rstd, B * T, C);
        attention_half_backward(a->dbuf, a->dbuf, a->dqkv, a->dresidual, x, w, gw, B, T, d);
        layernorm_backward(a->dresidual, gw.ln1w, gw.ln1b, a->dbuf, residual, w.ln1w, x.ln1_mean,
                           x.ln1_rstd, B * T, C);
    }
    encoder_backward(g.wte, g.wpe, a->dresidual, model->inputs, B, T, C);
}

// ----------------------------------------------------------------------------------------------


static float evaluate(GPT2* model, DataLoader* val, int batches, CommGroup* world) {
    double sum = 0.0;
    for (int i = 0; i < batches; i++) {
        dataloader_seek(val, (size_t)i);
        dataloader_load_chunk(val, world->rank, model->config.vocab_size);  // one chunk per rank
        gpt2_forward(model, val->inputs, model->B, model->T);
        sum += gpt2_loss(model, val->targets, model->B, model->T, 0.0f);
    }
    float loss = (float)(sum / batches);
    comm_all_reduce_scalar(world, &loss, COMM_AVG);  // every rank saw different validation tokens
    return loss;
}

// autoregressive sampling from <|endoftext|>, one sequence on rank 0 (the tokenizer's end-of-text
// id was checked to be inside the model's vocabulary)
static void sample(GPT2* model, const Tokenizer* tok, Rng* rng, int gen_tokens, int step) {
    int V = model->config.vocab_size, Vp = model->config.padded_vocab_size;
    int* tokens = (int*)malloc_check((size_t)gen_tokens * sizeof(int));
    float* logits = (float*)malloc_check((size_t)Vp * sizeof(float));  // one row, as fp32
    tokens[0] = tok->eot_token;
    printf("---- sample at step %d ----\n", step);
    for (int t = 1; t < gen_tokens; t++) {
        gpt2_forward(model, tokens, 1, t);
        copy_device_to_floats(logits, model->acts.logits + (size_t)(t - 1) * Vp, Vp);
        int next = sample_next_token(logits, V, rng);
        tokens[t] = next;
        watchdog_beat();  // one token is progress: a long sample is not a hang
        tokenizer_print(tok, next);
        fflush(stdout);
    }
    printf("\n----------------\n");
    free(tokens);
    free(logits);
}

int main(int argc, char** argv) {
    // the common flags (llmc/train.h) and this trainer's own
    TrainArgs args;
    const char* dump_grads = NULL;
    ArgSpec specs[TRAIN_MAX_SPECS];
    int num_specs = train_args_common(&args, specs);
    int check_replicas = 0;
    ArgSpec dump = {"-dump_grads", ARG_STRING, &dump_grads, 0, 0, "write the averaged gradients of the first step here (tests)"};
    ArgSpec check = {"-check_replicas", ARG_INT, &check_replicas, 0, ARG_NO_MAX, "every N steps check that all replicas hold the same parameters (their stored bits; not the master weights or moments) (0: never)"};
    specs[num_specs++] = dump;
    specs[num_specs++] = check;
    if (!args_parse(argc, argv, specs, num_specs)) return 0;

    CommGroup world;
    comm_init(&world, &argc, &argv);
    int rank = world.rank;
    watchdog_start(args.watchdog);

    // ---- model: a model file, or a descriptor for a random init. Only its config for now: the
    // memory check comes before the first large allocation
    GPT2Config config;
    int from_descriptor = gpt2_config_from_descriptor(args.model, &config);
    if (!from_descriptor) gpt2_read_model_config(args.model, &config);

    // ---- the batch layout: B x T per micro-batch, `accum` micro-batches per rank per step,
    // every rank on its own data
    train_check_flags(&args, config);
    int accum = train_accumulation_steps(&args, world.size, "ranks");

    // ---- memory: predicted before allocating, so a batch too large for this machine is a
    // message rather than a kill by the out-of-memory killer mid-run (llmc/memory.h). Host
    // buffers at their largest: the fp32 weights while building, and on resume the weights plus
    // the AdamW moments (and the bf16 parameter bits) read from the checkpoint.
    size_t P = gpt2_num_parameters(config);
    size_t state_extra = FLOATX_IS_FLOAT ? 0 : P * sizeof(floatX);
    size_t host_bytes = P * sizeof(float) * (args.resume ? 3 : args.checkpoint_every > 0 ? 2 : 1) +
                        (args.resume || args.checkpoint_every > 0 ? state_extra : 0);
    char layout[128];
    snprintf(layout, sizeof(layout), "%zu parameters, -b %d -t %d", P, args.B, args.T);
    LayerDims dims = layer_dims(config, 1, 0);  // every rank holds whole layers
    ParameterLayout whole = parameter_layout(config, 1, 0);  // ... and the whole model
    memory_check_fits(gpt2_memory_bytes(dims, &whole, ACTS_ALL, args.B, args.T), host_bytes, world.ranks_sharing_memory, layout);
    comm_barrier(&world);  // every rank checked before any allocates (ranks may share memory)

    // the weights: read (checksum verified, non-finite values refused) or drawn from the seed
    float* params_host = from_descriptor ? gpt2_init_random(config, (uint64_t)args.seed)
                                         : gpt2_read_model_file(args.model, &config, NULL);

    DataLoader train, val;
    // a global batch is accum x ranks chunks of B x T tokens; which rank reads which: see the loop
    dataloader_init(&train, args.train_path, args.B, args.T, accum * world.size, args.shuffle, (uint64_t)args.seed);
    if (args.val_every > 0) {
        dataloader_init(&val, args.val_path, args.B, args.T, world.size, 0, 0);
        if ((size_t)args.val_batches > val.batches_per_epoch) args.val_batches = (int)val.batches_per_epoch;
    }
    int max_steps = args.max_steps >= 0 ? args.max_steps : (int)train.batches_per_epoch;
    // samples come from rank 0, with the tokenizer's decode table (checked against the model)
    Tokenizer tok;
    int can_sample = rank == 0 && args.sample_every > 0 && train_open_tokenizer(&tok, args.tokenizer_path, config);
    int gen_tokens = args.gen_tokens < args.T ? args.gen_tokens : args.T;

    // ---- the run's identity: everything that determines the training trajectory. A checkpoint
    // stores it, and a resume with anything different is refused (checkpoint.h). DDP's layout:
    // every rank a data-parallel replica, accum micro-batches of B x T each
    RunIdentity identity;
    char dp_layout[96];
    snprintf(dp_layout, sizeof(dp_layout), "dp=%d tp=1 pp=1, %d micro-batches of %d x %d", world.size, accum, args.B, args.T);
    train_run_identity(&identity, &args, config, params_host, &train, max_steps, dp_layout, &world);

    // ---- the output dir: rank 0 holds its lock for the whole run; a fresh run refuses a dir
    // that holds checkpoints already, instead of mixing them with its own
    if (args.out_dir != NULL) {
        if (rank == 0) output_dir_claim(args.out_dir, args.resume);
        comm_barrier(&world);
    }

    GPT2 model;
    gpt2_build(&model, config, dims, whole, params_host, args.B, args.T, ACTS_ALL);
    free(params_host);

    if (rank == 0) {
        BannerRow rows[16];
        int n = train_banner_model(rows, "train_gpt2_dp (DDP)", args.model, config);
        banner_row(&rows[n++], "ranks (data parallel)", "%d", world.size);
        banner_row(&rows[n++], "micro-batch B x T", "%d x %d", args.B, args.T);
        banner_row(&rows[n++], "accumulation steps", "%d", accum);
        banner_row(&rows[n++], "total batch (tokens)", "%d", args.total_batch);
        banner_row(&rows[n++], "steps", "%d", max_steps);
        banner_row(&rows[n++], "train / val tokens", "%zu / %zu", train.num_tokens, args.val_every > 0 ? val.num_tokens : (size_t)0);
        train_print_banner(rows, n);
        train_print_parameter_layout(config, &model.layout);
        size_t master = model.master_memory ? P * sizeof(float) : 0;
        // 16 bytes per parameter either way: fp32 params 4 + grads 4 + m 4 + v 4, or bf16
        // params 2 + grads 2 + fp32 master 4 + m 4 + v 4. DDP keeps all 16 on every rank; ZeRO
        // divides them by the rank count, stage by stage.
        size_t X = sizeof(floatX), BT = (size_t)args.B * args.T, L = config.num_layers;
        printf("memory per rank (every rank holds a full replica; %zu + %zu + %zu + 4 + 4 = 16 bytes per parameter):\n",
               X, X, master ? sizeof(float) : (size_t)0);
        char note[160];
        train_print_memory_row("parameters", (double)P * X, PRECISION_NAME);
        train_print_memory_row("master weights", (double)master, "");
        train_print_memory_row("gradients", (double)P * X, "");
        train_print_memory_row("AdamW m, v", (double)P * 2 * sizeof(float), "");
        snprintf(note, sizeof(note), "of which logits %.1f MB (B T Vp), MLP %.1f MB (2 L B T 4C), attention state %.1f MB",
                 BT * config.padded_vocab_size * X / 1e6, 2 * L * BT * 4 * config.channels * X / 1e6,
                 L * attention_state_bytes(args.B, args.T, config.channels, config.num_heads) / 1e6);
        train_print_memory_row("activations", (double)model.acts.arena_bytes, note);
        train_print_memory_row("comm buffers", 0, "the all-reduce works in place; ranks sharing a GPU stage it through host memory");
        snprintf(note, sizeof(note), "x %d ranks sharing this memory", world.ranks_sharing_memory);
        train_print_memory_row("total", (double)gpt2_memory_bytes(dims, &whole, ACTS_ALL, args.B, args.T), note);
        train_print_memory_row("host buffers", (double)host_bytes, "at most (weights; on resume also the AdamW moments)");
    }

    // ---- with -y 1, resume from the newest complete checkpoint: rank 0 picks the step, every
    // rank checks that its files are of that step, of its rank, of this layout and of this run
    Rng sample_rng;
    int start_step = train_start(&model, &args, &world, max_steps, &identity, &sample_rng, &train);
    Logger logger;
    logger_init(&logger, args.out_dir, rank, args.resume ? start_step : -1);

    // ---- training loop; `step` counts completed optimizer steps
    double flops_per_token = train_flops_per_token(config, args.T);
    DevicePeak peak = train_device_peak(rank);
    StepStats stats = {0, 0, 0, 0};
    for (int step = start_step; step <= max_steps; step++) {
        int last = step == max_steps;
        // The checkpoint of a step holds the state before that step's validation and sample
        // (the sampling rng included), so a resumed run redoes them exactly as an uninterrupted
        // run with its flags would: same values, same samples, and the log was cut back to match
        uint64_t rng_before_sample = sample_rng.state;
        if (train_due(args.val_every, step, last)) {
            watchdog_phase("validation", step);
            train_report_val(&logger, rank, step, evaluate(&model, &val, args.val_batches, &world));
        }
        if (can_sample && step > 0 && train_due(args.sample_every, step, last)) {
            watchdog_phase("sampling", step);
            sample(&model, &tok, &sample_rng, gen_tokens, step);
        }
        if (train_checkpoint_due(&args, step, start_step, last)) {
            watchdog_phase("checkpoint write", step);
            write_checkpoint(&model, args.out_dir, &world, NULL, step, &identity, rng_before_sample);
        }
        if (last) break;

        double t0 = wall_time_s();
        comm_reset_counters(&world);
        // 1. forward + backward over this rank's micro-batches; gradients accumulate
        watchdog_phase("forward and backward", step);
        device_memset_zero(model.grads_memory, model.num_parameters * sizeof(floatX));
        float loss = 0.0f;
        // Loss scaling, in two halves: each token's gradient is weighted 1/(B*T*accum) here (the
        // mean over this rank's tokens), and the all-reduce below divides by the rank count
        // (COMM_AVG). Together: 1/total_batch, the gradient of the mean loss over the global batch,
        // whatever the layout. A plain sum over ranks would multiply the gradient, and with it
        // the effective learning rate, by the number of ranks.
        float dloss = 1.0f / (float)((size_t)args.B * args.T * accum);
        for (int micro = 0; micro < accum; micro++) {
            watchdog_beat();
            // the DDP slice: micro-step `micro` of rank r is chunk micro * ranks + r, so the ranks
            // and micro-steps together read the global batch once (llmc/dataloader.h)
            dataloader_load_chunk(&train, micro * world.size + rank, config.vocab_size);
            gpt2_forward(&model, train.inputs, args.B, args.T);
            loss += gpt2_loss(&model, train.targets, args.B, args.T, dloss) / (float)accum;
            gpt2_backward(&model, args.B, args.T);
        }
        dataloader_advance(&train);
        // 2. DDP: average the gradients (all P values, one flat buffer: (P) floatX, all-reduce
        // with AVG) and the loss (one float) over the ranks. After it every rank holds the same
        // gradient; the replicas stay identical because they also started identical (the same
        // seed or model file on every rank, where PyTorch's DDP broadcasts rank 0's weights) and
        // round alike (the same stochastic-rounding seed in AdamW below).
        watchdog_phase("gradient all-reduce", step);
        comm_all_reduce(&world, model.grads_memory, model.num_parameters, COMM_FLOATX, COMM_AVG);
        comm_all_reduce_scalar(&world, &loss, COMM_AVG);
        if (dump_grads != NULL && step == 0 && rank == 0) {
            float* g = (float*)malloc_check(model.num_parameters * sizeof(float));
            copy_device_to_floats(g, model.grads_memory, model.num_parameters);
            gpt2_write_model_file(dump_grads, config, g);
            free(g);
        }
        // 3. the same clipped AdamW step on every rank (clip as torch.nn.utils.clip_grad_norm_)
        watchdog_phase("AdamW update", step);
        float grad_norm = sqrtf(global_norm_squared(model.grads_memory, model.num_parameters));
        // A nan or inf anywhere on any rank reaches every rank through the all-reduced sums, so
        // all ranks stop here together, before this step updates, logs or checkpoints anything
        train_stop_if_not_finite(step, loss, grad_norm);
        // AdamW (llmc/train.h), with the same rounding seed on every rank: stochastic rounding
        // must round the replicas alike
        float clip_scale, lr = train_adamw_step(&model, &args, step, max_steps, grad_norm, &clip_scale);
        device_synchronize();
        double dt = wall_time_s() - t0;
        step_stats_add(&stats, step == start_step, dt, &world);
        double tokens_per_s = args.total_batch / dt;
        if (rank == 0) {
            char line[256], comm[160];
            // the communication of the step: the bytes are payload, what this rank handed to the
            // all-reduce; a ring all-reduce puts 2(p-1)/p of it on each rank's link
            double comm_s = world.seconds[COMM_ALL_REDUCE];
            double grad_bytes = (double)model.num_parameters * sizeof(floatX);
            if (world.size == 1) snprintf(comm, sizeof(comm), "no communication (1 rank)");
            else if (comm_s <= 0) snprintf(comm, sizeof(comm), "all-reduce %.2f MB grads + 4 B loss (NCCL, asynchronous: not timed)", grad_bytes / 1e6);
            else snprintf(comm, sizeof(comm), "all-reduce %.2f MB grads + 4 B loss in %.1f ms (%.2f GB/s payload)",
                          grad_bytes / 1e6, comm_s * 1e3, (grad_bytes + 4) / comm_s / 1e9);
            double mfu = train_mfu(flops_per_token, tokens_per_s, world.size, peak);
            train_format_step(line, sizeof(line), step + 1, max_steps, loss, lr, grad_norm, clip_scale, dt, tokens_per_s, mfu);
            printf("%s | %s\n", line, comm);
        }
        logger_train(&logger, step + 1, loss, lr, grad_norm, tokens_per_s, comm_total_bytes(&world));
        if (check_replicas > 0 && (step + 1) % check_replicas == 0) {
            train_check_replicas(&model, &world, step + 1, NULL, "replicas");
        }
    }
    if (rank == 0) step_stats_print(&stats, args.total_batch, flops_per_token, peak, world.size);

    watchdog_phase("shutdown", max_steps);
    logger_close(&logger);
    if (can_sample) tokenizer_free(&tok);
    dataloader_free(&train);
    if (args.val_every > 0) dataloader_free(&val);
    gpt2_free(&model);
    comm_finalize();
    return 0;
}
