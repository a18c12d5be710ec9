// Will it fit? The device memory of one rank of a training run, predicted before the run for
// any model, batch, machine and layout, with the trainers' own accounting (llmc/memory_plan.h):
// the table a trainer prints at its start, here without a GPU, without MPI ranks and without
// the model's weights. With -search N, every layout of N devices that fits, smallest first, as
// the Ultra-Scale Playbook's memory widget lists them.
//
//   make dev/memory_planner
//   dev/memory_planner -e d48 -b 4 -t 1024 -device cuda -dp 8 -z 3 -r 2    one layout's table
//   dev/memory_planner -e d48 -b 4 -t 1024 -device cuda -search 8          every layout of 8 GPUs
//   dev/memory_planner -e d4 -b 4 -t 64 -dp 2 -device cpu                  the quick start's run
//   dev/memory_planner -e d12 -experts 8 -pp 2 -cp 2 -tp 2 -sp 1 -ep 4       5D: 8 GPUs, experts folded
//
// Its defaults are a GPU's, not the trainers': -t 1024 (the trainers' -t is 64), -device cuda in
// bf16 (-device cpu plans the CPU backend, fp32), -mem 80 (GB, an H100). Ranks are -dp (-tp,
// -pp, -cp): "mpirun -np 2 ./train_gpt2_dp" is -dp 2. -e, -b, -d, -z, -r, -n mean what the trainers'
// flags of those letters mean, with the same defaults.
//
// A layout is run by the trainer that holds it: data parallelism alone (with ZeRO and -offload)
// by train_gpt2_dp, tensor parallelism alone by train_gpt2_tp, a pipeline alone by train_gpt2_pp,
// and any mix by train_gpt2_3d; each allocates a little differently, and the plan is that
// trainer's. A Mixture-of-Experts model (-experts E -topk k) is train_gpt2_ep's with data
// parallelism alone (-ep of the -dp ranks hold the experts), and train_gpt2_3d's on any other grid
// (5D: -ep of each stage's dp x cp x tp ranks hold them, folded over the ranks, none added). The
// plan is of the rank that needs the most (the pipeline stage with the largest total; every dp
// and tp rank of a stage needs the same, apart from rank 0's checkpoint gathers).
//
// How long will its step take? A layout's plan ends with its step time predicted by the step-time
// model (llmc/step_time.h) on a device profile (-profile: a built-in name, h100-sxm, h200,
// a100-80gb, or a profile file; by default h100-sxm for -device cuda, and for -device cpu this
// machine's as dev/bench/calibrate measured it, dev/profiles/cpu-this-machine.txt beside this
// program) with -gpus_per_node ranks a node: the step, tokens/s, MFU and its parts. The trainers
// end their runs with the same prediction beside the step they measured (llmc/run.h; the profile by
// the same rule, llmc/profile_default.h). With experts, -maxvio v prices the all-to-alls at routed
// loads rather than balanced ones: the busiest rank of the ep group receives 1 + v times its share
// (v: MaxVio as train_gpt2_ep prints it, llmc/moe.h).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../llmc/args.h"
#include "../llmc/gpt2.h"
#include "../llmc/memory_plan.h"
#include "../llmc/profile_default.h"
#include "../llmc/step_time.h"

static const char* trainer_names[TRAINER_COUNT] = {"train_gpt2_dp", "train_gpt2_tp", "train_gpt2_pp", "train_gpt2_3d",
                                                   "train_gpt2_cp", "train_gpt2_diloco", "train_gpt2_ep"};

// the trainer that runs a grid: the simplest that holds it (cp alone: train_gpt2_cp; cp with
// another axis: train_gpt2_3d). A model with experts: train_gpt2_ep with dp alone, else
// train_gpt2_3d (5D)
static TrainerKind trainer_for(int dp, int tp, int pp, int cp, int moe) {
    if (moe) return tp == 1 && pp == 1 && cp == 1 ? TRAINER_EP : TRAINER_3D;
    if (cp > 1) return dp == 1 && tp == 1 && pp == 1 ? TRAINER_CP : TRAINER_3D;
    if (tp == 1 && pp == 1) return TRAINER_DP;
    if (dp == 1 && pp == 1) return TRAINER_TP;
    if (dp == 1 && tp == 1) return TRAINER_PP;
    return TRAINER_3D;
}

// 0 when the trainer of r can run it with model c on machine t, else 1 with the reason (the
// checks the trainers make at their start, with the same messages where they share them)
static int layout_problem(GPT2Config c, DeviceTarget t, RunLayout* r, CpSplit split, uint64_t total_batch, char* why,
                          size_t n) {
    if (layer_dims_problem(c, r->tp, t, why, n)) return 1;
    if (r->trainer == TRAINER_DP && (r->tp > 1 || r->pp > 1)) return snprintf(why, n, "train_gpt2_dp holds whole layers: -tp 1 -pp 1"), 1;
    if (r->trainer == TRAINER_TP && (r->dp > 1 || r->pp > 1)) return snprintf(why, n, "train_gpt2_tp is one tp group: -dp 1 -pp 1"), 1;
    if (r->trainer == TRAINER_PP && (r->dp > 1 || r->tp > 1)) return snprintf(why, n, "train_gpt2_pp is one pipeline: -dp 1 -tp 1"), 1;
    if (r->trainer == TRAINER_DILOCO && (r->tp > 1 || r->pp > 1 || r->cp > 1)) {
        return snprintf(why, n, "train_gpt2_diloco holds whole models, -dp ranks of them: -tp 1 -pp 1 -cp 1"), 1;
    }
    if (r->trainer == TRAINER_CP && (r->dp > 1 || r->tp > 1 || r->pp > 1)) {
        return snprintf(why, n, "train_gpt2_cp is one context-parallel group: -dp 1 -tp 1 -pp 1"), 1;
    }
    if (r->trainer == TRAINER_EP) {
        if (!gpt2_is_moe(c)) return snprintf(why, n, "train_gpt2_ep trains Mixture-of-Experts models: -experts E >= 2"), 1;
        if (r->tp > 1 || r->pp > 1 || r->cp > 1) return snprintf(why, n, "train_gpt2_ep is data parallel with -ep: -tp 1 -pp 1 -cp 1"), 1;
        if (c.experts % layout_ep(r) != 0 || r->dp % layout_ep(r) != 0) {
            return snprintf(why, n, "-ep %d: expert parallelism splits the E = %d experts over ep of the %d ranks, so ep must "
                            "divide both", layout_ep(r), c.experts, r->dp), 1;
        }
        // (the trainer's own refusal, word for word: its MoE layers have no recomputation path)
        if (r->recompute != 0) {
            return snprintf(why, n, "-r %d: train_gpt2_ep keeps every activation (-r 0); recomputation of MoE layers is "
                            "not written yet", r->recompute), 1;
        }
    } else if (r->trainer == TRAINER_3D && gpt2_is_moe(c)) {
        // 5D: train_gpt2_3d's refusals (grid_add_experts), in its words. The experts are folded
        // over a stage's dp x cp x tp ranks: ep of them hold the E experts, E/ep each
        int stage_ranks = r->dp * layout_cp(r) * r->tp;
        if (c.experts % layout_ep(r) != 0 || stage_ranks % layout_ep(r) != 0) {
            return snprintf(why, n, "-ep %d: the E = %d experts are split over ep of a stage's dp x cp x tp = %d ranks, so ep "
                            "must divide both", layout_ep(r), c.experts, stage_ranks), 1;
        }
        if (r->tp > 1 && !r->sp) {
            return snprintf(why, n, "-tp %d with experts needs -sp 1: each rank routes the tokens it holds, and without "
                            "sequence parallelism every tp rank holds all of them, so each token would be routed %d times",
                            r->tp, r->tp), 1;
        }
        if (r->recompute != 0) {
            return snprintf(why, n, "-r %d with experts: MoE layers keep every activation (-r 0); their recomputation is "
                            "not written yet", r->recompute), 1;
        }
    } else if (gpt2_is_moe(c)) {
        return snprintf(why, n, "-experts %d: a Mixture-of-Experts model is train_gpt2_ep's or train_gpt2_3d's (-trainer ep "
                        "or 3d)", c.experts), 1;
    } else if (r->ep > 1) {  // (a dense model has no experts to split)
        return snprintf(why, n, "-ep %d splits the experts of a Mixture-of-Experts model: give -experts E (train_gpt2_ep, "
                        "train_gpt2_3d)", r->ep), 1;
    } else if (r->capacity_factor > 0) {  // (nor any to cap)
        return snprintf(why, n, "-capacity_factor %g caps the experts of a Mixture-of-Experts model: give -experts E "
                        "(train_gpt2_ep, train_gpt2_3d)", r->capacity_factor), 1;
    }
    if (r->trainer != TRAINER_CP && r->trainer != TRAINER_3D && r->cp > 1) {
        return snprintf(why, n, "-cp %d is train_gpt2_cp's or train_gpt2_3d's", r->cp), 1;
    }
    int chunks = (split == CP_ZIGZAG ? 2 : 1) * r->cp;
    if (r->cp > 1 && r->T % chunks != 0) {
        return snprintf(why, n, "-t %d: the %s split cuts each sequence into %d chunks, so T must divide by %d", r->T,
                        cp_split_name(split), chunks, chunks), 1;
    }
    int max_zero = r->trainer == TRAINER_DP ? 3 : r->trainer == TRAINER_3D ? 1 : 0;
    if (r->zero > max_zero) return snprintf(why, n, "-z %d: %s runs -z 0..%d", r->zero, trainer_names[r->trainer], max_zero), 1;
    if (r->offload && r->trainer != TRAINER_DP) return snprintf(why, n, "-offload 1 is train_gpt2_dp's"), 1;
    if (r->sp && r->tp == 1) r->sp = 0;  // nothing to split, as the trainers do
    if (r->sp && r->T % r->tp != 0) return snprintf(why, n, "-sp 1 splits the tokens over the %d tp ranks: -t %d must be a multiple of %d", r->tp, r->T, r->tp), 1;
    int multiple = cp_tokens_multiple(split, r->cp, r->sp ? r->tp : 1);
    if (r->sp && r->cp > 1 && r->T % multiple != 0) {
        return snprintf(why, n, "-sp 1 splits each rank's T/cp = %d tokens over the %d tp ranks: -t %d must be a multiple of %d",
                        r->T / r->cp, r->tp, r->T, multiple), 1;
    }
    if (c.num_layers % (r->pp * r->V) != 0) {
        return snprintf(why, n, "the model's L = %d layers cannot be split into pp x vp = %d x %d equal chunks", c.num_layers,
                        r->pp, r->V), 1;
    }
    int readers = r->trainer == TRAINER_DP || r->trainer == TRAINER_3D || r->trainer == TRAINER_DILOCO || r->trainer == TRAINER_EP;
    uint64_t per_step = mul_check(mul_check(r->B, r->T, "-b x -t"), readers ? r->dp : 1,
                                "-b x -t x dp");
    if (total_batch == 0) total_batch = per_step;  // -d -1, as the trainers: one micro-batch per replica
    if (total_batch % per_step != 0) {
        return snprintf(why, n, "-d %llu must be a positive multiple of B*T%s = %llu", (unsigned long long)total_batch,
                        r->dp > 1 ? "*dp" : "", (unsigned long long)per_step), 1;
    }
    r->m = (int)(total_batch / per_step);
    if (r->trainer == TRAINER_PP || r->trainer == TRAINER_3D) {
        PipeSpec spec = {r->sched, r->pp, r->m, r->V};
        if (pipeline_spec_problem(spec, why, n)) return 1;
    }
    return 0;
}

// "train_gpt2_3d -dp 2 -pp 4 -tp 1 -z 1 -r 2"; with experts "train_gpt2_3d -dp 2 -pp 2 -tp 2 -ep 4
// -sp 1 -r 0" (5D)
static void layout_flags(const RunLayout* r, GPT2Config c, char* out, size_t n) {
    int k = snprintf(out, n, "%s", trainer_names[r->trainer]);
    if (r->trainer == TRAINER_3D) k += snprintf(out + k, n - k, " -dp %d -pp %d -tp %d", r->dp, r->pp, r->tp);
    if (r->trainer == TRAINER_3D && r->cp > 1) {
        k += snprintf(out + k, n - k, " -cp %d%s", r->cp, r->cp_allgather ? " -cp_comm allgather" : "");
    }
    if (r->trainer == TRAINER_3D && gpt2_is_moe(c)) {
        k += snprintf(out + k, n - k, " -ep %d", layout_ep(r));
        if (r->capacity_factor > 0) k += snprintf(out + k, n - k, " -capacity_factor %g", r->capacity_factor);
    }
    if (r->trainer == TRAINER_DP || r->trainer == TRAINER_DILOCO) k += snprintf(out + k, n - k, " (%d ranks)", r->dp);
    if (r->trainer == TRAINER_EP) {
        k += snprintf(out + k, n - k, " -ep %d (%d ranks)", layout_ep(r), r->dp);
        if (r->capacity_factor > 0) k += snprintf(out + k, n - k, " -capacity_factor %g", r->capacity_factor);
    }
    if (r->trainer == TRAINER_TP) k += snprintf(out + k, n - k, " -tp %d", r->tp);
    if (r->trainer == TRAINER_PP) k += snprintf(out + k, n - k, " -pp %d", r->pp);
    if (r->trainer == TRAINER_CP) k += snprintf(out + k, n - k, " -cp %d%s", r->cp, r->cp_allgather ? " -cp_comm allgather" : "");
    if (r->pp > 1) k += snprintf(out + k, n - k, " -sched %s", pipe_schedule_names[r->sched]);
    if (r->V > 1) k += snprintf(out + k, n - k, " -vp %d", r->V);
    if (r->zero) k += snprintf(out + k, n - k, " -z %d", r->zero);
    if (r->sp) k += snprintf(out + k, n - k, " -sp 1");
    k += snprintf(out + k, n - k, " -r %d", r->recompute);
    if (r->offload) snprintf(out + k, n - k, " -offload 1");
}

// "mpirun -np 8 ./train_gpt2_3d -e d48 -b 4 -t 1024 -dp 2 -pp 4 -tp 1 -z 1 -r 2": the command that
// runs the layout, whose trainer prints this table at its start (the flags the planner took that
// the trainer reads; the build decides the backend and precision, the environment the attention)
static void layout_command(const RunLayout* r, GPT2Config c, const char* model, long long total_batch,
                           const char* attention, const char* cp_layout, int checkpoint, char* out, size_t n) {
    TrainerKind kind = r->trainer;
    int ranks = r->dp * r->tp * r->pp * layout_cp(r);
    int k = snprintf(out, n, "%smpirun -np %d ./%s -e %s -b %d -t %d", strcmp(attention, "cublas") == 0 ? "LLMC_ATTENTION=cublas " : "",
                     ranks, trainer_names[kind], model, r->B, r->T);
    if (total_batch > 0) k += snprintf(out + k, n - k, " -d %lld", total_batch);
    if (kind == TRAINER_3D) k += snprintf(out + k, n - k, " -dp %d -pp %d -tp %d", r->dp, r->pp, r->tp);
    if (kind == TRAINER_TP) k += snprintf(out + k, n - k, " -tp %d", r->tp);
    if (kind == TRAINER_PP) k += snprintf(out + k, n - k, " -pp %d", r->pp);
    if ((kind == TRAINER_CP || kind == TRAINER_3D) && layout_cp(r) > 1) {
        k += snprintf(out + k, n - k, " -cp %d -cp_comm %s -cp_layout %s", r->cp, r->cp_allgather ? "allgather" : "ring",
                      cp_layout);
    }
    if (gpt2_is_moe(c)) {  // (train_gpt2_ep, or train_gpt2_3d's fifth axis)
        k += snprintf(out + k, n - k, " -experts %d -topk %d -ep %d", c.experts, c.topk, layout_ep(r));
        if (r->capacity_factor > 0) k += snprintf(out + k, n - k, " -capacity_factor %g", r->capacity_factor);
    }
    if (r->pp > 1) k += snprintf(out + k, n - k, " -sched %s", pipe_schedule_names[r->sched]);
    if (r->V > 1) k += snprintf(out + k, n - k, " -vp %d", r->V);
    if (r->sp) k += snprintf(out + k, n - k, " -sp 1");
    if (r->zero) k += snprintf(out + k, n - k, " -z %d", r->zero);
    if (r->offload) k += snprintf(out + k, n - k, " -offload 1");
    if (kind == TRAINER_DP && !r->overlap) k += snprintf(out + k, n - k, " -overlap 0");
    if (r->recompute) k += snprintf(out + k, n - k, " -r %d", r->recompute);
    if (checkpoint > 0) snprintf(out + k, n - k, " -n %d", checkpoint);
}


typedef struct {
    RunLayout run;
    MemoryPlan plan;
    int stage;
    StepTime time;  // (with a profile: the predicted step)
} Candidate;

static int by_total(const void* a, const void* b) {
    uint64_t x = ((const Candidate*)a)->plan.total, y = ((const Candidate*)b)->plan.total;
    return x < y ? -1 : x > y;
}

// -rank time: the fastest predicted step first (the memory as the tie-break)
static int by_time(const void* a, const void* b) {
    double x = ((const Candidate*)a)->time.seconds, y = ((const Candidate*)b)->time.seconds;
    return x < y ? -1 : x > y ? 1 : by_total(a, b);
}

// why the fastest layout wins: its parts beside the runner-up's, a line each (ms a step)
static void time_compare(const Candidate* first, const Candidate* second, GPT2Config c) {
    char a[160], b[160];
    layout_flags(&first->run, c, a, sizeof(a));
    layout_flags(&second->run, c, b, sizeof(b));
    printf("why the first beats the second (ms a step; compute and collectives of stage 0):\n");
    printf("  %-22s %12s %12s\n", "", "first", "second");
    const StepTime *x = &first->time, *y = &second->time;
    printf("  %-22s %12.2f %12.2f\n", "step", x->seconds * 1e3, y->seconds * 1e3);
    for (int k = 0; k < TIME_COMPUTE_KINDS; k++) {
        printf("  %-22s %12.2f %12.2f\n", time_compute_names[k], x->compute[k] * 1e3, y->compute[k] * 1e3);
    }
    for (int k = 0; k < TIME_GROUPS; k++) {
        if (x->comm_total[k] > 0.0 || y->comm_total[k] > 0.0) {
            char label[40];
            snprintf(label, sizeof(label), "%s exposed", time_group_names[k]);
            printf("  %-22s %12.2f %12.2f\n", label, x->comm_exposed[k] * 1e3, y->comm_exposed[k] * 1e3);
        }
    }
    printf("  %-22s %12.2f %12.2f\n", "stage 0 idle", x->bubble * 1e3, y->bubble * 1e3);
    printf("  %-22s %12.2f %12.2f\n", "once a step", x->once * 1e3, y->once * 1e3);
    printf("  first:  %s\n  second: %s\n", a, b);
}

// -search: one layout; counted when its trainer can run it, kept in fits when it fits in memory
static void try_layout(Candidate** fits, int* count, int* capacity, int* tried, GPT2Config c, DeviceTarget target,
                       RunLayout run, CpSplit split, uint64_t batch, double memory) {
    char why[256];
    if (layout_problem(c, target, &run, split, batch, why, sizeof(why))) return;
    (*tried)++;
    Candidate cand;
    cand.run = run;
    cand.plan = memory_plan_largest(c, target, &run, &cand.stage);
    if (cand.plan.total > memory) return;
    if (*count == *capacity) *fits = (Candidate*)realloc(*fits, (size_t)(*capacity *= 2) * sizeof(Candidate));
    if (*fits == NULL) fail("out of host memory listing layouts");
    (*fits)[(*count)++] = cand;
}

// -format json: the plan as one JSON object, the numbers in bytes (what dev/memory.html draws)
static void plan_json(const MemoryPlan* plan, GPT2Config c, DeviceTarget t, const RunLayout* r, int stage, double memory,
                      const char* flags, const char* command, const StepTime* time, const char* profile) {
    static const char* kinds[3] = {"part", "sum", "host"};
    printf("{\"model\": {\"layers\": %d, \"channels\": %d, \"heads\": %d, \"parameters\": %llu, \"experts\": %d, \"topk\": %d},\n",
           c.num_layers, c.channels, c.num_heads, (unsigned long long)gpt2_num_parameters(c), c.experts, c.experts ? c.topk : 0);
    printf(" \"device\": \"%s\", \"precision\": \"%s\", \"attention\": \"%s\", \"memory\": %.0f,\n", t.cuda ? "cuda" : "cpu",
           t.X == 2 ? "bf16" : "fp32", t.flash ? "flash" : t.cuda ? "cublas" : "cpu", memory);
    printf(" \"trainer\": \"%s\", \"ranks\": %d, \"micro_batches\": %d, \"layout\": ", trainer_names[r->trainer],
           r->dp * r->tp * r->pp * layout_cp(r), r->m);
    print_json_string(flags);
    printf(",\n \"build\": \"make%s%s %s\", \"command\": ", t.cuda ? " BACKEND=cuda" : "", t.cuda && t.X == 4 ? " PRECISION=FP32" : "",
           trainer_names[r->trainer]);
    print_json_string(command);
    printf(",\n \"stage\": %d, \"stages\": [", stage);
    for (int s = 0; s < r->pp; s++) {
        MemoryPlan of_stage = memory_plan(c, t, r, s, s == 0);
        printf("%s{\"total\": %llu, \"activations\": %llu, \"slots\": %d}", s ? ", " : "", (unsigned long long)of_stage.total,
               (unsigned long long)of_stage.activations, of_stage.slots);
    }
    printf("],\n \"rows\": [\n");
    MemoryRow rows[MEMORY_ROWS_MAX];
    int n = memory_plan_rows(plan, c, r, rows);
    for (int i = 0; i < n; i++) {
        printf("  {\"label\": \"%s\", \"bytes\": %llu, \"kind\": \"%s\", \"indent\": %d, \"note\": ", rows[i].label,
               (unsigned long long)rows[i].bytes, kinds[rows[i].kind], rows[i].indent);
        print_json_string(rows[i].note);
        printf("}%s\n", i + 1 < n ? "," : "");
    }
    printf(" ],\n \"total\": %llu, \"fits\": %s", (unsigned long long)plan->total, plan->total <= memory ? "true" : "false");
    if (time) {  // the predicted step (llmc/step_time.h), its parts in seconds a step
        printf(",\n \"profile\": ");
        print_json_string(profile);
        printf(", \"maxvio\": %.9g, \"step_seconds\": %.9g, \"tokens_per_second\": %.9g, \"mfu\": %.6g,\n \"time_parts\": {", r->maxvio, time->seconds,
               time->tokens_per_second, time->mfu);
        for (int k = 0; k < TIME_COMPUTE_KINDS; k++) printf("\"%s\": %.9g, ", time_compute_names[k], time->compute[k]);
        printf("\"comm_exposed\": {");
        for (int k = 0; k < TIME_GROUPS; k++) printf("%s\"%s\": %.9g", k ? ", " : "", time_group_names[k], time->comm_exposed[k]);
        printf("}, \"comm_exposed_by_link\": {");  // (every group's exposed time on each link)
        for (int l = 0; l < TIME_LINKS; l++) {
            double sum = 0.0;
            for (int k = 0; k < TIME_GROUPS; k++) sum += time->comm_exposed_link[k][l];
            printf("%s\"%s\": %.9g", l ? ", " : "", time_link_names[l], sum);
        }
        printf("}, \"comm_exposed_by_group_and_link\": {");  // (each group's, split by link)
        for (int k = 0; k < TIME_GROUPS; k++) {
            printf("%s\"%s\": {", k ? ", " : "", time_group_names[k]);
            for (int l = 0; l < TIME_LINKS; l++) printf("%s\"%s\": %.9g", l ? ", " : "", time_link_names[l], time->comm_exposed_link[k][l]);
            printf("}");
        }
        printf("}, \"schedule\": %.9g, \"bubble\": %.9g, \"once\": %.9g}", time->schedule, time->bubble, time->once);
    }
    printf("}\n");
}

// the predicted step as text, after the memory table
static void time_print(const StepTime* t, const char* profile, int gpus_per_node, GPT2Config c, const RunLayout* r) {
    printf("step time predicted on %s (%d ranks a node; llmc/step_time.h): %.2f ms, %.0f tokens/s, MFU %.1f%%\n", profile,
           gpus_per_node, t->seconds * 1e3, t->tokens_per_second, 100.0 * t->mfu);
    if (gpt2_is_moe(c)) {  // (the routing the all-to-alls were priced at)
        printf("  all-to-alls at MaxVio %g (-maxvio; %s)\n", r->maxvio,
               r->maxvio > 0 ? "the busiest rank of the ep group receives 1 + maxvio times the balanced share" : "balanced routing");
    }
    printf("  compute (stage 0):");
    for (int k = 0; k < TIME_COMPUTE_KINDS; k++) printf(" %s %.2f ms", time_compute_names[k], t->compute[k] * 1e3);
    printf("\n  collectives exposed (of their total):");
    int any = 0;
    for (int k = 0; k < TIME_GROUPS; k++) {
        if (t->comm_total[k] > 0.0) {
            printf(" %s %.2f (%.2f) ms", time_group_names[k], t->comm_exposed[k] * 1e3, t->comm_total[k] * 1e3);
            any = 1;
        }
    }
    if (any) {  // (the same exposed time by the link it is spent on)
        printf("\n  exposed by link:");
        for (int l = 0; l < TIME_LINKS; l++) {
            double sum = 0.0;
            for (int k = 0; k < TIME_GROUPS; k++) sum += t->comm_exposed_link[k][l];
            printf(" %s %.2f ms", time_link_names[l], sum * 1e3);
        }
    }
    printf("%s\n  schedule %.2f ms (stage 0 idle %.2f ms), then once a step %.2f ms\n", any ? "" : " none", t->schedule * 1e3,
           t->bubble * 1e3, t->once * 1e3);
}

int main(int argc, char** argv) {
    llmc_rank = -1;  // no ranks here: messages are "error: ...", without "[rank 0]"
    const char *model = "d12", *device = "cuda", *precision = NULL, *attention = "flash", *sched_name = "1f1b";
    const char* trainer_name = NULL;
    const char* format = "text";
    const char* profile_name = NULL;
    int gpus_per_node = 0;
    const char* rank_by = "memory";
    int B = 4, T = 1024, total_batch = -1, dp = 1, tp = 1, pp = 1, vp = 1, zero = 0, sp = 0, recompute = 0, offload = 0, cp = 1;
    const char* cp_comm = "ring";
    const char* cp_layout = "zigzag";
    int overlap = 1, checkpoint = 0, search = 0, stage = -1, experts = 0, topk = 2, ep = 1, workers = 0, H = 10, megatron = 0;
    int pp_overlap = 0;
    float memory_gb = 80.0f, capacity_factor = 0.0f, maxvio = 0.0f;
    const ArgSpec specs[] = {
        {"-e", ARG_STRING, &model, 0, 0, "model: a descriptor dL (d12 = 124M, d48 = 1.5B), L/C/NH (48/1600/25), L/C/NH/maxT/V (96/12288/96/2048/51200), or a model file"},
        {"-b", ARG_INT, &B, 1, ARG_NO_MAX, "micro-batch size in sequences"},
        {"-t", ARG_INT, &T, 1, ARG_NO_MAX, "sequence length"},
        {"-d", ARG_INT, &total_batch, -1, ARG_NO_MAX, "total batch in tokens (-1: one micro-batch per step on each replica, as the trainers; with -search, B*T*N)"},
        {"-device", ARG_STRING, &device, 0, 0, "the backend planned for: cuda or cpu"},
        {"-precision", ARG_STRING, &precision, 0, 0, "bf16 or fp32 (default: bf16 on cuda, fp32 on cpu, the CPU backend's only)"},
        {"-attention", ARG_STRING, &attention, 0, 0, "flash or cublas (LLMC_ATTENTION; flash needs bf16 and a head size of 16, 32 or 64)"},
        {"-mem", ARG_FLOAT, &memory_gb, 0, ARG_NO_MAX, "device memory in GB (1e9 bytes): 80 for an H100, 141 for an H200"},
        {"-dp", ARG_INT, &dp, 1, ARG_NO_MAX, "data-parallel replicas"},
        {"-tp", ARG_INT, &tp, 1, ARG_NO_MAX, "tensor-parallel ranks"},
        {"-pp", ARG_INT, &pp, 1, ARG_NO_MAX, "pipeline stages"},
        {"-cp", ARG_INT, &cp, 1, ARG_NO_MAX, "context-parallel ranks (train_gpt2_cp, or train_gpt2_3d's fourth axis): each holds T/cp tokens of every sequence"},
        {"-cp_comm", ARG_STRING, &cp_comm, 0, 0, "ring or allgather (the whole sequence's K,V on every rank)"},
        {"-cp_layout", ARG_STRING, &cp_layout, 0, 0, "zigzag (2 cp chunks: T must divide by 2 cp) or contiguous"},
        {"-vp", ARG_INT, &vp, 1, ARG_NO_MAX, "chunks of layers per stage (-sched interleaved; zbv and dualpipev: 2, their V)"},
        {"-sched", ARG_STRING, &sched_name, 0, 0, "pipeline schedule: afab, 1f1b, interleaved, zb, zbv, dualpipev"},
        {"-z", ARG_INT, &zero, 0, 3, "ZeRO stage (train_gpt2_dp 0..3, train_gpt2_3d 0..1)"},
        {"-sp", ARG_INT, &sp, 0, 1, "1: sequence parallelism in the tp group"},
        {"-r", ARG_INT, &recompute, 0, RECOMPUTE_MAX, "activation recomputation: 0 none, 1 selective, 2 full"},
        {"-offload", ARG_INT, &offload, 0, 1, "1: master weights and AdamW state in host memory (train_gpt2_dp)"},
        {"-overlap", ARG_INT, &overlap, 0, 1, "train_gpt2_dp's -overlap (ZeRO-2/3 keep one more layer bucket with 1)"},
        {"-pp_overlap", ARG_INT, &pp_overlap, 0, 1, "train_gpt2_3d's -pp_overlap (with experts, the MoE overlap's second lane of rows)"},
        {"-n", ARG_INT, &checkpoint, 0, ARG_NO_MAX, "checkpoint every N steps (their gathers take memory; 0: never)"},
        {"-stage", ARG_INT, &stage, -1, ARG_NO_MAX, "the pipeline stage whose table to print (-1: the largest; stage 0 is rank 0's)"},
        {"-trainer", ARG_STRING, &trainer_name, 0, 0, "dp, tp, pp, 3d, cp, diloco or ep (default: the simplest trainer that runs the grid; diloco and ep: -dp ranks)"},
        {"-experts", ARG_INT, &experts, 0, 1024, "a Mixture-of-Experts model of E experts a layer (train_gpt2_ep, or train_gpt2_3d on a grid; 0: the model file's, dense for a descriptor)"},
        {"-topk", ARG_INT, &topk, 1, 1024, "with -experts: the experts each token goes to"},
        {"-ep", ARG_INT, &ep, 1, 1024, "the ranks the experts are split over: ep divides E and, in train_gpt2_ep, -dp; in train_gpt2_3d a stage's dp x cp x tp (folded: no ranks added)"},
        {"-capacity_factor", ARG_FLOAT, &capacity_factor, 0, ARG_NO_MAX, "with -experts: at most ceil(cf N k / E) slots an expert of a rank's micro-batch of N tokens (0: dropless)"},
        {"-workers", ARG_INT, &workers, 0, ARG_NO_MAX, "-trainer diloco: the workers the -dp ranks form (0: one a rank), for the step's share of the outer step"},
        {"-H", ARG_INT, &H, 1, ARG_NO_MAX, "-trainer diloco: inner steps between two outer steps (the outer step's 1/H a step)"},
        {"-maxvio", ARG_FLOAT, &maxvio, 0, ARG_NO_MAX, "with -experts: the routed loads' MaxVio the step is predicted at (the busiest expert over the mean, less 1; moe.h): the busiest rank of the ep group receives 1 + maxvio times the balanced all-to-all (0: balanced)"},
        {"-profile", ARG_STRING, &profile_name, 0, 0, "the device the step time is predicted on: h100-sxm, h200, a100-80gb or a profile file (default: h100-sxm on cuda; on cpu dev/profiles/cpu-this-machine.txt, dev/bench/calibrate's)"},
        {"-megatron", ARG_INT, &megatron, 0, 1, "1: price the step as Megatron-LM (2021) ran it, for comparing with its published table: dropout 0.1 on the attention probabilities and both residual branches, -r 2 rerunning the whole layer (fcproj and its sum too), and -overlap in any grid (its DDP's buckets); no trainer here runs these"},
        {"-gpus_per_node", ARG_INT, &gpus_per_node, 0, ARG_NO_MAX, "ranks that share a node's fast link (0: the profile's, 8 for a GPU)"},
        {"-rank", ARG_STRING, &rank_by, 0, 0, "with -search: memory (the smallest first) or time (the fastest predicted step first, with why it beats the second)"},
        {"-format", ARG_STRING, &format, 0, 0, "text (the trainers' table) or json (the same numbers in bytes, for dev/memory.html)"},
        {"-search", ARG_INT, &search, 0, ARG_NO_MAX, "N: list every layout of N devices that fits in -mem, smallest first, over every grid, -z, -sp, -r and -offload (with -experts: every -ep) (0: plan the one layout)"},
    };
    int num_specs = (int)(sizeof(specs) / sizeof(specs[0]));
    if (!args_parse(argc, argv, specs, num_specs)) return 0;

    GPT2Config c;
    if (!gpt2_config_from_shape(model, &c)) {
        FILE* file = fopen(model, "rb");  // (dev/memory.html's planner sees no files: descriptors only)
        if (file == NULL) {
            fail("-e %s: expected a descriptor dL (d12 = 124M, d48 = 1.5B), L/C/NH (48/1600/25), L/C/NH/maxT/V or a model file, and "
                 "no file has that name", model);
        }
        fclose(file);
        gpt2_read_model_config(model, &c);
    }
    if (T > c.max_seq_len) fail("-t %d is longer than the model's maximum sequence length %d", T, c.max_seq_len);
    if (experts > 0) {
        if (experts < 2 || topk > experts) fail("-experts %d -topk %d: expected E >= 2 and 1 <= k <= E", experts, topk);
        c.experts = experts, c.topk = topk;
    }
    // (MaxVio is at most E/k - 1: a token's k slots go to k different experts, so the busiest
    // expert takes at most every token, k / E times more than the mean; llmc/moe.h)
    if (maxvio > 0 && !gpt2_is_moe(c)) fail("-maxvio %g is the routing's imbalance of a Mixture-of-Experts model: give -experts E", maxvio);
    if (gpt2_is_moe(c) && maxvio > (double)c.experts / c.topk - 1.0 + 1e-6) {
        fail("-maxvio %g: at most E/k - 1 = %g (every token on the same k of the E = %d experts)", maxvio,
             (double)c.experts / c.topk - 1.0, c.experts);
    }
    DeviceTarget target = {0, 0, 0, 0};  // (the default paths: the one-kernel flash backward off)
    if (strcmp(device, "cuda") == 0) target.cuda = 1;
    else if (strcmp(device, "cpu") == 0) target.cuda = 0;
    else fail("-device %s: expected cuda or cpu", device);
    if (precision == NULL) precision = target.cuda ? "bf16" : "fp32";  // as the trainers' builds
    if (strcmp(precision, "bf16") == 0) target.X = 2;
    else if (strcmp(precision, "fp32") == 0) target.X = 4;
    else fail("-precision %s: expected bf16 or fp32", precision);
    if (!target.cuda && target.X != 4) fail("-device cpu trains in fp32 only: -precision bf16 is the CUDA backend's (leave -precision out)");
    int hs = c.channels / c.num_heads;
    if (strcmp(attention, "flash") == 0) target.flash = target.cuda && flash_attention_supports(target.X, hs);
    else if (strcmp(attention, "cublas") == 0) target.flash = 0;
    else fail("-attention %s: expected flash or cublas", attention);
    int sched = pipeline_schedule_from_name(sched_name);
    if (sched < 0) fail("-sched %s: unknown schedule; expected afab, 1f1b, interleaved, zb, zbv or dualpipev", sched_name);
    if (sched == SCHEDULE_ZBV || sched == SCHEDULE_DUALPIPEV) {  // (the V: two chunks a stage, as the trainers take it)
        if (vp > 2) fail("-vp %d: -sched %s places exactly 2 chunks on each stage, in a V (leave -vp out, or give 2)", vp, sched_name);
        vp = 2;
    }
    int allgather = cp_allgather_of(cp_comm);
    CpSplit split = cp_split_of(cp_layout);
    double memory = memory_gb * 1e9;
    if (search > 65536) fail("-search %d: at most 65536 devices (every grid of N is tried)", search);
    if (search > 0 && !gpt2_is_moe(c) && capacity_factor > 0) {  // (a dense model has no experts to cap)
        fail("-capacity_factor %g caps the experts of a Mixture-of-Experts model: give -experts E", capacity_factor);
    }
    int json = strcmp(format, "json") == 0;
    if (!json && strcmp(format, "text") != 0) fail("-format %s: expected text or json", format);
    if (!json) printf("model L=%d C=%d NH=%d, %llu parameters; micro-batch %d x %d; %s %s, %s attention; %.0f GB per device\n",
           c.num_layers, c.channels, c.num_heads, (unsigned long long)gpt2_num_parameters(c), B, T, target.cuda ? "CUDA" : "CPU",
           target.X == 2 ? "bf16" : "fp32", target.flash ? "flash" : target.cuda ? "cuBLAS" : "CPU", memory_gb);

    // the step's time on the profile, with the trainers' default kernels (in bf16 the bias and
    // GELU epilogues; the fused LayerNorm backward)
    // (-profile, or by default h100-sxm for cuda and this machine's measured file for cpu, found
    // beside this program: llmc/profile_default.h, the trainers' rule too)
    DeviceProfile device_profile;
    char profile_label[4096], why_profile[8192];
    int timed = profile_load_default(profile_name, target.cuda, NULL, argv[0], "profiles/cpu-this-machine.txt",
                                     &device_profile, profile_label, sizeof(profile_label), why_profile, sizeof(why_profile));
    if (timed < 0) fail("-profile %s: %s", profile_name ? profile_name : profile_label, why_profile);
    if (timed > 0 && !device_profile_kind_matches(&device_profile, target.cuda, profile_label, why_profile, sizeof(why_profile))) {
        fail("%s", why_profile);
    }
    StepOptions kernels = {target.X, target.flash, target.cuda && target.X == 2, target.cuda && target.X == 2, 1, 0, 0, 0, 0};
    if (trainer_name != NULL && strcmp(trainer_name, "diloco") == 0) {  // (its outer step, 1/H of it a step)
        if (workers == 0) workers = dp;
        if (dp % workers != 0) fail("-workers %d: DiLoCo's workers split the %d ranks (-dp) into equal groups", workers, dp);
        kernels.diloco_workers = workers, kernels.diloco_H = H;
    }
    kernels.megatron = megatron;
    int per_node = gpus_per_node > 0 ? gpus_per_node : timed ? device_profile.gpus_per_node : 8;
    int by_speed = strcmp(rank_by, "time") == 0;
    if (!by_speed && strcmp(rank_by, "memory") != 0) fail("-rank %s: expected memory or time", rank_by);
    if (by_speed && !timed) fail("-rank time needs a device profile: give -profile (h100-sxm, h200, a100-80gb or a file)");

    if (search == 0) {
        RunLayout r = {trainer_for(dp, tp, pp, cp, gpt2_is_moe(c)), dp, tp, pp, vp, (PipeSchedule)sched, 1, B, T, zero, sp,
                       recompute, offload, overlap, checkpoint > 0, 0, 0, cp, allgather, 1, 0.0f, 0.0, 0};
        if (trainer_name != NULL) {  // another trainer than the simplest, as train_gpt2_3d for any grid
            int k = 0;
            while (k < TRAINER_COUNT && strcmp(trainer_names[k] + strlen("train_gpt2_"), trainer_name) != 0) k++;
            if (k == TRAINER_COUNT) fail("-trainer %s: expected dp, tp, pp, 3d, cp, diloco or ep", trainer_name);
            r.trainer = (TrainerKind)k;
        }
        // (the others reduce after the backward, as their layouts say; Megatron-LM's DDP overlaps in any grid)
        r.overlap = r.trainer == TRAINER_DP || megatron ? overlap : 0;
        r.ep = ep;
        r.capacity_factor = capacity_factor;
        r.maxvio = maxvio;
        r.pp_overlap = r.trainer == TRAINER_3D ? pp_overlap : 0;
        char why[256], flags[160];
        if (total_batch == 0) fail("-d 0: expected a positive number of tokens, or -1");
        if (layout_problem(c, target, &r, split, total_batch == -1 ? 0 : (uint64_t)total_batch, why, sizeof(why))) fail("%s", why);
        if (stage >= r.pp) fail("-stage %d: the pipeline has stages 0..%d", stage, r.pp - 1);
        MemoryPlan plan = stage >= 0 ? memory_plan(c, target, &r, stage, stage == 0) : memory_plan_largest(c, target, &r, &stage);
        layout_flags(&r, c, flags, sizeof(flags));
        StepTime time;
        memset(&time, 0, sizeof(time));
        if (timed) time = step_time_predict(&device_profile, c, &r, kernels, per_node);
        if (json) {
            char command[512];
            layout_command(&r, c, model, total_batch, attention, cp_layout, checkpoint, command, sizeof(command));
            plan_json(&plan, c, target, &r, stage, memory, flags, command, timed ? &time : NULL, profile_label);
            return plan.total <= memory ? 0 : 2;
        }
        printf("%s, %d micro-batch%s per step:\n", flags, r.m, r.m > 1 ? "es" : "");
        if (r.pp > 1) {
            for (int s = 0; s < r.pp; s++) {
                MemoryPlan of_stage = memory_plan(c, target, &r, s, s == 0);
                printf("  stage %d  %.1f MB (activations %.1f MB in %d slots)\n", s, of_stage.total / 1e6,
                       of_stage.activations / 1e6, of_stage.slots);
            }
            printf("memory of a rank of stage %d%s:\n", stage, stage == 0 ? " (rank 0's, with its checkpoint gathers)" : "");
        }
        memory_plan_print(&plan, c, &r);
        printf("%s: %.1f GB of %.1f GB per device\n", plan.total <= memory ? "fits" : "does not fit", plan.total / 1e9, memory_gb);
        if (timed) time_print(&time, profile_label, per_node, c, &r);
        else printf("step time: %s\n", profile_missing_hint());
        return plan.total <= memory ? 0 : 2;  // (1: an error, from fail)
    }

    // -search N: every grid dp x tp x pp x cp = N, and on it every -z the trainer runs, -sp, -r,
    // -offload and with cp > 1 the ring or the all-gather (so -dp, -tp, -pp, -cp, -z, -sp, -r,
    // -offload and -cp_comm are not read); the pipeline schedule and -vp as given (-vp applies to
    // layouts with pp > 1). With experts also every ep dividing E and a stage's dp x cp x tp (-ep
    // is not read either): folded over those ranks, ep adds none, so the grids are the same N; the
    // layouts the trainers refuse (-r, tp without -sp) drop out in layout_problem
    int N = search, capacity = 4096, count = 0, tried = 0;
    uint64_t batch = total_batch == -1 ? mul_check(mul_check(B, T, "-b x -t"), N, "-b x -t x devices") : (uint64_t)total_batch;
    if (batch == 0) fail("-d 0: expected a positive number of tokens, or -1");
    Candidate* fits = (Candidate*)malloc_check((size_t)capacity * sizeof(Candidate));
    for (int t = 1; t <= N; t++) {
        for (int p = 1; t * p <= N; p++) {
            for (int q = 1; t * p * q <= N; q++) {  // (q: cp)
                if (N % (t * p * q) != 0) continue;
                int d = N / (t * p * q);
                TrainerKind kind = trainer_for(d, t, p, q, gpt2_is_moe(c));
                int max_zero = kind == TRAINER_DP ? 3 : kind == TRAINER_3D && d * q > 1 ? 1 : 0;
                int max_ep = gpt2_is_moe(c) ? c.experts : 1;
                for (int z = 0; z <= max_zero; z++)
                    for (int s = 0; s <= (t > 1); s++)
                        for (int r = 0; r <= RECOMPUTE_MAX; r++)
                            for (int o = 0; o <= (kind == TRAINER_DP); o++)
                                for (int a = 0; a <= (q > 1); a++)
                                    for (int e = 1; e <= max_ep; e++) {
                                        if (c.experts % e != 0 || (d * q * t) % e != 0) continue;  // (ep | E, dp cp tp)
                                        int V = p > 1 ? vp : 1;
                                        PipeSchedule sc = p > 1 ? (PipeSchedule)sched : SCHEDULE_1F1B;
                                        RunLayout run = {kind, d, t, p, V, sc, 1, B, T, z, s, r, o, kind == TRAINER_DP ? overlap : 0,
                                                         checkpoint > 0, 0, 0,
                                                         q, a, e, capacity_factor, maxvio,
                                                         kind == TRAINER_3D ? pp_overlap : 0};
                                        try_layout(&fits, &count, &capacity, &tried, c, target, run, split, batch, memory);
                                    }
            }
        }
    }
    for (int i = 0; i < count && timed; i++) {
        fits[i].time = step_time_predict(&device_profile, c, &fits[i].run, kernels, per_node);
    }
    qsort(fits, (size_t)count, sizeof(Candidate), by_speed ? by_time : by_total);
    if (json) {  // each layout's flags (what the page links to) and its figures in bytes
        printf("{\"search\": %d, \"batch\": %llu, \"possible\": %d, \"memory\": %.0f, \"layouts\": [\n", N,
               (unsigned long long)batch, tried, memory);
        for (int i = 0; i < count; i++) {
            const RunLayout* r = &fits[i].run;
            const MemoryPlan* m = &fits[i].plan;
            char flags[160];
            layout_flags(r, c, flags, sizeof(flags));
            printf("  {\"dp\": %d, \"tp\": %d, \"pp\": %d, \"cp\": %d, \"ep\": %d, \"z\": %d, \"sp\": %d, \"r\": %d, "
                   "\"offload\": %d, \"cp_comm\": \"%s\", \"m\": %d, \"total\": %llu, \"states\": %llu, \"activations\": %llu, "
                   "\"host\": %llu, \"layout\": ", r->dp, r->tp, r->pp, r->cp, layout_ep(r), r->zero, r->sp, r->recompute, r->offload,
                   r->cp_allgather ? "allgather" : "ring", r->m, (unsigned long long)m->total,
                   (unsigned long long)(m->params + m->grads + m->master + m->state), (unsigned long long)m->activations,
                   (unsigned long long)(m->host + m->host_optimizer));
            print_json_string(flags);
            char command[512];  // (the run that tries it: its trainer prints this plan at its start)
            layout_command(r, c, model, (long long)batch, attention, cp_layout, checkpoint, command, sizeof(command));
            printf(", \"sched\": \"%s\", \"vp\": %d, \"command\": ", pipe_schedule_names[r->sched], r->V);
            print_json_string(command);
            if (timed) printf(", \"step_seconds\": %.9g, \"tokens_per_second\": %.9g", fits[i].time.seconds, fits[i].time.tokens_per_second);
            printf("}%s\n", i + 1 < count ? "," : "");
        }
        printf("]}\n");
        free(fits);
        return 0;
    }
    printf("layouts of %d devices, total batch %llu tokens: %d possible, %d fit in %.1f GB (per device, the largest stage's):\n",
           N, (unsigned long long)batch, tried, count, memory_gb);
    if (timed) printf("  step times predicted on %s, %d ranks a node (llmc/step_time.h)%s\n", profile_label, per_node,
                      by_speed ? ", the fastest first" : "");
    printf("  %9s %9s %9s %9s %9s %10s %10s  %s\n", "total GB", "states", "acts", "other", "host", "step ms", "tokens/s",
           "layout (micro-batches per step)");
    for (int i = 0; i < count; i++) {
        const MemoryPlan* m = &fits[i].plan;
        char flags[160];
        layout_flags(&fits[i].run, c, flags, sizeof(flags));
        double states = (double)(m->params + m->grads + m->master + m->state);
        printf("  %9.2f %9.2f %9.2f %9.2f %9.2f", m->total / 1e9, states / 1e9, m->activations / 1e9,
               (m->total - states - m->activations) / 1e9, (m->host + m->host_optimizer) / 1e9);
        if (timed) printf(" %10.2f %10.0f", fits[i].time.seconds * 1e3, fits[i].time.tokens_per_second);
        else printf(" %10s %10s", "-", "-");
        printf("  %s (m=%d)\n", flags, fits[i].run.m);
    }
    if (count == 0) printf("  none: a smaller micro-batch (-b), more devices or a larger -mem\n");
    if (by_speed && count >= 2) time_compare(&fits[0], &fits[1], c);
    free(fits);
    return 0;
}
