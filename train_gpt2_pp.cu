/*
GPT-2 training with pipeline parallelism: GPipe (Huang et al. 2019, arXiv:1811.06965), 1F1B
(PipeDream-Flush, Narayanan et al. 2021, arXiv:2006.09503), interleaved 1F1B (Narayanan et al.
2021, arXiv:2104.04473), zero bubble (ZB-H1 and ZB-V, Qi et al. 2023, arXiv:2401.10241) and
DeepSeek-V3's DualPipeV (arXiv:2412.19437 section 3.2.1); the schedules themselves are in
llmc/pipeline.h.

All ranks form one pipeline of p stages: the layers are cut into p contiguous ranges, and rank s
holds and runs only range s. A micro-batch's activations (B, T, C) travel down the pipe, stage to
stage, and their gradients travel back up. A lone micro-batch would keep one stage busy at a time,
so a step splits its batch into m micro-batches that follow each other through the pipe: while
stage 1 runs micro-batch 0, stage 0 already runs micro-batch 1. What is left idle, the bubble,
is the time the pipe takes to fill and to drain: (p - 1) / (m + p - 1) of the step for GPipe and
1F1B. The schedules differ in the order each stage runs its forwards and backwards:
  - afab (GPipe): all m forwards, then all m backwards; every stage keeps m micro-batches'
    activations.
  - 1f1b: stage s runs p - s - 1 forwards, then one forward and one backward in turn; the same
    bubble, but stage s never keeps more than p - s micro-batches.
  - interleaved (-vp V): each stage holds V chunks of layers, chunk c of stage s being virtual
    stage c p + s; a micro-batch loops through the pipe V times, each lap V times shorter, and the
    bubble shrinks V-fold for V times the messages.
  - zb (ZB-H1): the backward split in two, B (the input gradient, which the stage before waits
    for) and W (the weight gradient, which nobody waits for); W's are held back to run in what
    was the bubble, which shrinks to about a third of 1F1B's at 1F1B's peak memory.
  - zbv (ZB-V) and dualpipev (DualPipeV): two chunks a stage placed in a V, chunk 0 of stage s
    being virtual stage s (going down) and chunk 1 virtual stage 2p - 1 - s (coming back up), B
    and W split. Stage 0 holds the first and the last virtual stage, so the embedding and the
    head are on one rank (one wte, no embedding group), and stage p - 1 hands chunk 0's output to
    its own chunk 1 without a message. Both leave no bubble inside a stage's work at equal F, B
    and W times; DualPipeV runs one micro-batch's forward joined to another's backward (F&B), so
    that on a GPU one's communication can hide under the other's compute.
The embedding is on the first stage and the LM head on the last (in a V, both on the first).
GPT-2 ties them (the head is wte transposed): the last stage holds a copy of wte, and after each step's backward passes the
two copies' gradients are summed over an "embedding group" of the first and last rank (as
Megatron-LM does), so both copies take the same update and stay identical. A stage's last layer
cannot fuse the next LayerNorm into its residual add (that LayerNorm is on the next stage), so
stage boundaries use a plain residual add.

Every rank computes the gradients of its layers only, so the global gradient norm is the sum of
the stages' squares (one all-reduce of a float), the tied wte counted once. The loss exists on the
last stage only; it is broadcast for the step line. Each token's gradient is weighted 1/(B T m),
so the step's gradient is the mean over the whole batch, as one process computing it would get;
the printed loss is the mean of the micro-batches' mean losses.

The result matches one process training the whole model to fp32 rounding (checked against
PyTorch in test/).

Build: make train_gpt2_pp        Run: mpirun -np 4 ./train_gpt2_pp -e d8 -b 4 -t 64 -d 2048 -sched 1f1b -o out
                                      mpirun -np 4 ./train_gpt2_pp -e d8 -b 4 -t 64 -d 2048 -sched zbv
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
#include "llmc/pipeline.h"
#include "llmc/stage.h"
#include "llmc/chunk.h"
#include "llmc/pipeline_walk.h"
#include "llmc/train.h"
#include "llmc/run.h"
#include "llmc/memory_plan.h"

// The global gradient norm: each stage's sum of squares of its own gradients, summed over the
// pipeline (all-reduce of one float). The tied wte is counted once: a stage with the head but not
// the embedding (the last of several) leaves out its copy, whose gradient is the first stage's
// (in a V the first stage holds both, and its one wte).
static float stage_grad_norm(const GPT2* model, CommGroup* pp) {
    const ParameterLayout* layout = &model->layout;
    double squares = 0.0;
    for (int i = 0; i < NUM_PARAMETER_TENSORS; i++) {
        if (i == PARAM_WTE && layout->head && !layout->embedding) continue;
        if (layout->sizes[i] == 0) continue;  // (a dense model's empty router)
        squares += global_norm_squared(model->grads_memory + layout->offsets[i], layout->sizes[i]);
    }
    float norm_sum = (float)squares;
    comm_all_reduce_scalar(pp, &norm_sum, COMM_SUM);
    return sqrtf(norm_sum);
}

// Validation and samples run forward-only walks through the pipe; the run layer (llmc/run.h)
// calls these two with the model, the stage and the pipeline group
typedef struct {
    GPT2* model;
    Stage* st;
    CommGroup* pp;
} Pipeline;

// one validation batch, one micro-batch forward through the pipe: its loss on the stage with the
// head (0 elsewhere; the run layer broadcasts it)
static float val_loss(void* trainer, DataLoader* val) {
    Pipeline* t = (Pipeline*)trainer;
    return stage_forward_pass(t->model, t->st, t->pp, NULL, NULL, val, NULL, t->model->B, t->model->T).loss;
}

// a sample's forward pass through the pipe: the logits (1, T, Vp) on the stage with the head,
// where its slot is free again but nothing has overwritten it; NULL elsewhere
static const floatX* sample_logits(void* trainer, const int* tokens, int T) {
    Pipeline* t = (Pipeline*)trainer;
    Walk w = stage_forward_pass(t->model, t->st, t->pp, NULL, NULL, NULL, tokens, 1, T);
    return t->model->layout.head ? w.head->logits : NULL;
}

// The communication of one step, payload on rank 0 (stage 0), from the layout alone (the README
// derives it). Each micro-batch crosses every boundary between virtual stages twice: its
// activations forward, their gradient back, B*T*C floatX each way. Stage 0 holds V chunks: all V
// send activations on (the last virtual stage is on the last rank) and all but the first send a
// gradient back, and it receives as many: (2V - 1) messages each way per micro-batch. In a V
// stage 0 talks to stage 1 only: chunk 0's activations and chunk 1's gradient go down, 2 messages
// each way per micro-batch. Per step: the all-reduce of wte's gradient over the embedding group
// (Vp*C floatX; none in a V, whose one wte is on stage 0), the gradient norm's float, and the
// loss broadcast from the stage with the head.
typedef struct {
    double send, recv, all_reduce, broadcast;
} StepBytes;

static StepBytes pp_step_bytes(GPT2Config c, PipeSpec s, int B, int T) {
    double X = sizeof(floatX), message = (double)B * T * c.channels * X;
    double messages = s.p == 1 ? 0 : pipeline_is_v(s) ? 2.0 * s.m : (double)s.m * (2 * s.V - 1);
    int tied_copies = s.p > 1 && !pipeline_is_v(s);  // wte on two stages
    StepBytes b = {messages * message, messages * message, (tied_copies ? (double)c.padded_vocab_size * c.channels * X : 0) + 4,
                   4};
    return b;
}

// what rank 0 prints at the start: the layout, each stage's layers and parameters, the schedule's
// chart, the memory per rank and the communication per step with its formula
static void print_layout(const Run* run, const GPT2* model, const Stage* st) {
    const TrainArgs* args = &run->args;
    const MemoryPlan* plan = &run->plan;
    GPT2Config c = model->config;
    PipeSpec s = st->spec;
    size_t P = gpt2_num_parameters(c), X = sizeof(floatX);
    BannerRow rows[16];
    int n = train_banner_model(rows, "train_gpt2_pp (PP)", args->model, c);
    banner_row(&rows[n++], "pipeline stages", "%d%s", s.p, pipeline_is_v(s) ? ", two chunks each in a V" : s.V > 1 ? ", interleaved" : "");
    if (s.V > 1) banner_row(&rows[n++], "chunks per stage", "%d of %d layers each", s.V, st->chunk_layers);
    banner_row(&rows[n++], "schedule", "%s", pipe_schedule_names[s.sched]);
    banner_row(&rows[n++], "micro-batches m", "%d of B x T = %d x %d", s.m, args->B, args->T);
    banner_row(&rows[n++], "recomputation", "%s", recompute_names[args->recompute]);
    n = run_banner_rows(run, rows, n);
    train_print_banner(rows, n);
    printf("stages (%s; each one's device memory predicted):\n",
           pipeline_is_v(s) ? "the embedding, lnf and the tied LM head on the first, in the V's two ends"
                            : "the embedding on the first, lnf and the tied LM head, a copy of wte, on the last");
    for (int stage = 0; stage < s.p; stage++) {
        MemoryPlan of_stage = memory_plan(c, plan->dims.target, &run->layout, stage, stage == 0);
        const ParameterLayout l = of_stage.layout;
        stage_print_layers(stage, &l, s.V, st->chunk_layers);
        printf("  %zu parameters (%.1f%%), %.1f MB (activations %.1f MB in %d slots)\n", l.count, 100.0 * l.count / P,
               of_stage.total / 1e6, of_stage.activations / 1e6, of_stage.slots);
    }
    pipeline_print_chart(s);
    printf("memory of stage 0 (this rank), Psi = its parameters:\n");
    memory_plan_print(plan, c, &run->layout);
    StepBytes b = pp_step_bytes(c, s, args->B, args->T);
    double message = (double)args->B * args->T * c.channels * X;
    printf("communication per step (payload of stage 0), messages of B T C X = %.0f bytes:\n", message);
    int v = pipeline_is_v(s);
    printf("  send           %12.0f bytes  %s\n", b.send,
           v ? "2 m B T C X: chunk 0's activations and chunk 1's gradients, to stage 1"
             : "(2V-1) m B T C X: activations of V chunks, gradients of V-1");
    printf("  recv           %12.0f bytes  the same, the other way\n", b.recv);
    printf("  all-reduce     %12.0f bytes  %s4 (norm)\n", b.all_reduce, v ? "" : "Vp C X (wte's gradient, embedding group) + ");
    printf("  broadcast      %12.0f bytes  4 (the loss, from the stage with the head)\n", b.broadcast);
    // on the link (the step line's "ring"): the sends whole, the embedding group's all-reduce of 2
    // ranks as a ring (2 (2-1)/2 of it), the norm's over the pipe 2 (p-1)/p of 4 bytes
    if (s.p > 1)
        printf("  on the link    %12.0f bytes  send + %s2 (p-1)/p 4\n", b.send + (b.all_reduce - 4) + 2.0 * (s.p - 1) / s.p * 4,
               v ? "" : "Vp C X + ");
    // (the V's bottom boundary, between stage p - 1's two chunks, is a copy, not a message)
    int boundaries = s.p * s.V - 1 - (v && s.p > 1 ? 1 : 0);
    printf("  the whole pipeline sends %s boundaries x 2 m B T C X = %.0f bytes per step\n", v ? "(2p-2)" : "(pV-1)",
           (double)boundaries * 2 * s.m * message);
}

// One training step of this stage (steps 1-5 of the loop), after run_step_begin: the schedule
// with its exchanges, the tied embedding's all-reduce, the loss, the norm, AdamW, the step line.
// embed: the embedding group (the first and last stage; a group of one rank elsewhere, when
// p = 1 and in a V). timed: the walk records each action's times (-timeline)
static void pipeline_step(Run* run, Pipeline* t, Walk* walk, const PipeAction* actions, int n, CommGroup* embed, int step,
                          int timed) {
    GPT2* model = t->model;
    // 1. the schedule: this stage's forwards and backwards of the m micro-batches, with the
    // exchanges between them (llmc/pipeline_walk.h, read it next). The actions run in groups;
    // before each, ONE exchange (MPI_Isend + MPI_Irecv, or NCCL's send and recv in one group)
    // sends the group before's outputs, (B, T, C) floatX each: a forward's from its slot's last
    // residual3 down the pipe, a backward's input gradient (grad[k % 2]) up it; and receives
    // this group's inputs into a slot's encoded, or grad. Then each action computes
    // (llmc/chunk.h) on its micro-batch's slot. Each token's gradient is weighted 1/(B*T*m):
    // the 1/m of every micro-batch's loss makes the step's gradient the mean over the batch.
    watchdog_phase("pipeline schedule", step);
    device_memset_zero(model->grads_memory, model->num_parameters * sizeof(floatX));
    walk->loss = 0.0f;
    walk->times = timed ? t->st->times : NULL;
    walk->t0 = run->step_start;
    pipeline_walk(walk, actions, n);
    dataloader_advance(&run->train);
    // 2. the tied embedding: the first stage has wte's gradient from the lookups, the last
    // from the LM head. All-reduce (Vp, C) over the embedding group, so that both copies get
    // the sum and take the same update.
    watchdog_phase("embedding all-reduce", step);
    if (embed->size > 1) comm_all_reduce(embed, model->grads.wte, model->layout.sizes[PARAM_WTE], COMM_FLOATX, COMM_SUM);
    // 3. the loss lives on the stage with the head (the last; in a V the first): broadcast it
    // (one float) for the step line and for every rank's finite check
    float loss = walk->loss / (float)t->st->spec.m;
    comm_broadcast_host(t->pp, &loss, sizeof(float), pipeline_head_stage(t->st->spec));
    // 4. the global gradient norm: the stages' squares summed over the pipeline (all-reduce of
    // one float in stage_grad_norm), the last stage's wte copy left out: after step 2 it
    // equals the first stage's
    watchdog_phase("AdamW update", step);
    float grad_norm = stage_grad_norm(model, t->pp);
    // the loss and the norm are the same on every rank, so every rank stops here together
    train_stop_if_not_finite(step, loss, grad_norm);
    // 5. AdamW on this stage's parameters. Both wte copies have the same gradient, moments and
    // rounding index (the layout's), so they stay identical.
    float clip_scale, lr = train_adamw_step(model, &run->args, step, run->max_steps, grad_norm, &clip_scale);
    // the step line and main.log (llmc/run.h): stage 0's bytes of each kind (send, recv,
    // all-reduce, broadcast) equal the formula printed at the start
    run_step_end(run, step, loss, lr, grad_norm, clip_scale);
}

int main(int argc, char** argv) {
    // ---- the flags: the common ones (llmc/train.h) and this trainer's own; then the
    // communication layer and the model's config (llmc/run.h)
    Run run;
    const char* dump_grads = NULL;
    const char* sched_name = "1f1b";
    int pp_flag = 0, vp = 1, timeline = 0, check_replicas = 0, pp_overlap = 0;
    const ArgSpec own[] = {
        {"-pp", ARG_INT, &pp_flag, 0, ARG_NO_MAX, "pipeline stages; all ranks form one pipeline, so it must equal the number of ranks (0: the number of ranks)"},
        {"-sched", ARG_STRING, &sched_name, 0, 0, "pipeline schedule: afab (GPipe), 1f1b, interleaved (with -vp), zb (ZB-H1), zbv (ZB-V), dualpipev (DualPipeV)"},
        {"-vp", ARG_INT, &vp, 1, ARG_NO_MAX, "chunks of layers per stage (virtual stages) for -sched interleaved (zbv and dualpipev: 2, their V); L must divide by pp * vp"},
        {"-pp_overlap", ARG_INT, &pp_overlap, 0, 1, "1: a group that joins a forward and a backward (dualpipev's F&B pairs, interleaved's steady state) sends the forward's output while the backward computes (CUDA: on side NCCL communicators)"},
        {"-timeline", ARG_INT, &timeline, 0, ARG_NO_MAX, "every N steps print the measured timeline of the step (and append it to -o's timeline.jsonl) (0: never)"},
        {"-dump_grads", ARG_OUTPUT_FILE, &dump_grads, 0, 0, "write the gradients of the first step here, gathered into the whole model (tests)"},
        {"-check_replicas", ARG_INT, &check_replicas, 0, ARG_NO_MAX, "every N steps check that the first and last stage hold the same wte (0: never)"},
    };
    if (!run_start(&run, &argc, &argv, own, sizeof(own) / sizeof(own[0]))) return 0;
    CommGroup* pp = &run.world;  // one pipeline of every rank (the 3D trainer splits it)
    int rank = pp->rank, p = pp->size;
    GPT2Config config = run.config;

    // ---- the layout: stage s = rank s; its layers in vp chunks of L / (p vp) (2 in a V)
    run_check_one_group(&run, "-pp", pp_flag, "one pipeline");
    LayerDims dims = layer_dims(config, /*tp*/ 1, /*sp*/ 0);  // every stage holds whole layers
    // the batch: a step is m micro-batches of B x T, each through the whole pipe
    int B = run.args.B, T = run.args.T, m = train_accumulation_steps(&run.args, /*readers*/ 1, NULL);
    PipeSpec spec = pipeline_spec_of(sched_name, p, m, vp, config.num_layers, "a number of ranks");
    // every stage's list of actions (pipeline.h): this rank walks its own
    int n;
    PipeAction* all_actions = pipeline_plan(spec, sched_name, &n);
    PipeAction* actions = all_actions + (size_t)rank * n;

    // ---- memory, checked before allocating: the stage's parameters and scratch, a slot of
    // activations per micro-batch the schedule keeps in flight (at least 2: a forward-only pass
    // receives into one while the last is sent), a second gradient buffer (llmc/memory_plan.h)
    ParameterLayout layout = parameter_layout_grid(config, /*tp*/ 1, /*tp_rank*/ 0, p, rank, spec.V, pipeline_is_v(spec));
    RunLayout run_layout_pp = run_layout(&run, TRAINER_PP, m);
    run_layout_pp.pp = p;
    run_layout_pp.V = spec.V;
    run_layout_pp.sched = spec.sched;
    run_layout_pp.dump_grads = dump_grads != NULL;
    run_check_memory(&run, run_layout_pp, rank, "%zu of %zu parameters on stage %d, -b %d -t %d", layout.count,
                     gpt2_num_parameters(config), rank, B, T);

    // ---- the weights, the data (a step is m chunks of B x T tokens, each read by every rank:
    // the first stage uses their inputs, the last their targets), the run's identity with its
    // layout (a resume must match it), the output dir
    float* weights = run_load(&run, m, /*val_chunks*/ 1, "dp=1 tp=1 pp=%d vp=%d sched=%s, %d micro-batches of %d x %d", p, spec.V,
                              sched_name, m, B, T);
    // the embedding group: the first and the last stage, which both hold wte (a group of one
    // rank when p = 1 and in a V, where only the first holds it; the stages between form groups
    // of their own and never use them)
    CommGroup embed;
    int in_embed = layout.embedding || layout.head;
    // (comm_split's colour: 0 for the first and last stage, one of its own for each other)
    comm_split(&embed, &run.world, in_embed ? 0 : 1 + rank, rank, "embedding");
    GPT2 model;
    gpt2_build(&model, config, dims, layout, weights, B, T, ACTS_SCRATCH | ACTS_RECOMPUTE,
               stage_kept(run.args.recompute, spec, dims), 0);  // what a slot keeps (-r, model.h)
    free(weights);
    Stage stage;
    stage_alloc(&stage, spec, rank, stage_num_slots(spec, actions, n), pipeline_num_grads(spec, rank, actions, n), &model, B, T);
    if (rank == 0) print_layout(&run, &model, &stage);

    // ---- resume with -y 1; validation and samples as forward-only walks through the pipe
    Pipeline trainer = {&model, &stage, pp};
    RunModel hooks = run_model(&model, &trainer, val_loss, sample_logits);
    hooks.pipe = pp;   // the loss and the logits on the stage with the head, broadcast over the pipe
    hooks.pipe_head = pipeline_head_stage(spec);
    hooks.split = pp;  // checkpoints gathered from the stages
    CommGroup* step_groups[2] = {pp, &embed};
    run_begin(&run, hooks, step_groups, 2);  // (step_groups: whose bytes each step reports)

    // ---- training loop; `step` counts completed optimizer steps
    Walk walk = walk_init(&model, &stage, pp, NULL, NULL, B, T);  // (no tensor or context parallelism: tp, cp NULL)
    walk.data = &run.train;
    walk.dloss = 1.0f / (float)((size_t)B * T * m);
    walk.overlap_pairs = pp_overlap;  // (the F&B overlap, llmc/pipeline_walk.h)
    unsigned wte_only = 1u << PARAM_WTE;  // a mask of the tensors the embedding group's copies share
    for (int step = run.start_step; step <= run.max_steps; step++) {
        if (run_between_steps(&run, step)) break;  // validation, a sample, a checkpoint: when due
        int timed = timeline > 0 && (step + 1) % timeline == 0;
        if (timed) comm_barrier(pp);  // a common start, so that the stages' clocks line up
        run_step_begin(&run);
        pipeline_step(&run, &trainer, &walk, actions, n, &embed, step, timed);  // steps 1-5 (above)
        if (check_replicas > 0 && (step + 1) % check_replicas == 0 && embed.size > 1) {
            train_check_replicas(&model, &embed, step + 1, &wte_only, "wte copies of the first and last stage");
        }
        // after the step's count (AdamW left the gradients): the stages gathered into one file
        if (dump_grads != NULL && step == 0) gpt2_write_gathered(&model, pp, model.grads_memory, dump_grads);
        if (timed) stage_report_timeline(&stage, pp, step + 1, run.args.out_dir);
    }
    run_end(&run);
    // held activations: the schedule's count beside what each stage's slots measured
    if (run.max_steps > run.start_step) stage_report_peak(&stage, pp, all_actions, n);
    stage_free(&stage);
    free(all_actions);
    gpt2_free(&model);
    comm_group_free(&embed);
    comm_finalize();
    return 0;
}
