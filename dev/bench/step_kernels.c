// The kernels of one training step on a GPU (llmc/step_kernels.h), printed as JSON: one row per
// kind of kernel with its calls, the FLOPs and bytes of one call and the engine that bounds it.
// dev/bench/roofline.py reads these rows and prints each with its price.
//
//   make dev/bench/step_kernels
//   dev/bench/step_kernels -e d12 -b 64 -t 1024                       train_gpt2_dp's step, bf16, flash
//   dev/bench/step_kernels -e 12/768/12 -b 4 -t 64 -precision fp32   a strict-fp32 build's (cuBLAS attention)
//   dev/bench/step_kernels -e d12 -b 8 -t 1024 -cp 4                 one rank of train_gpt2_cp
//   dev/bench/step_kernels -e d12 -experts 8 -topk 2 -dp 4 -ep 2     one rank of train_gpt2_ep
//   dev/bench/step_kernels -e d12 -trainer tp -tp 4 -sp 1              a rank of train_gpt2_tp -sp 1
//   dev/bench/step_kernels -e d12 -trainer 3d -dp 2 -tp 2 -pp 2 -vp 2 -micro_batches 8 -stage 1   a rank of stage 1
//   dev/bench/step_kernels -e d12 -dp 8 -z 3 -overlap 1 -r 2         train_gpt2_dp with ZeRO-3, recomputing
//   dev/bench/step_kernels -e d12 -b 64 -t 1024 -profile h100-sxm    ... each row priced on a device
//
// The first flags are roofline.py's that choose the step; the rest choose the layout, by the trainers' flags of the
// same names (-trainer says whose layer: train_gpt2_tp, _pp, _3d and _diloco run tensor_parallel.h's).
// Each row also prints its action and chunks (phase, chunks) and, for a collective, its group,
// kind, payload, ranks and what it may hide behind (llmc/step_kernels.h's StepKernel).
// -profile NAME|FILE prices each row by the step-time model (llmc/step_time.h, the one copy the
// planner and roofline.py read too): the row's "seconds" a step, and the compute rows' sum.
#include <stdio.h>
#include <string.h>
#include "llmc/args.h"
#include "llmc/gpt2.h"
#include "llmc/step_time.h"  // (with llmc/step_kernels.h, llmc/device_profile.h and llmc/comm_time.h)

// Each row's seconds in one step on profile p, as llmc/step_time.h's time_stage prices them on a
// lone rank (TimeShare 1, 1: no ranks sharing a CPU): a compute row's calls at
// time_kernel_seconds, then attention's rows as one block a phase (time_attention_block); a link
// row's calls at time_link_seconds, its group placed inside one node, before any overlap hides it
// (what a hidden_by would hide depends on the other rows: the planner's time_parts say it).
static double price_rows(const DeviceProfile* p, GPT2Config c, const StepLayout* o, const StepKernel* rows, int n,
                         double* seconds) {
    TimeShare lone = time_share_lone();
    for (int i = 0; i < n; i++) {
        seconds[i] = rows[i].engine == STEP_LINK ? 0.0 : time_kernel_seconds(p, &rows[i], rows[i].flops, o->X, lone) * rows[i].calls;
    }
    time_attention_block(p, c, o, rows, seconds, n, lone.compute);
    double compute = 0.0;
    for (int i = 0; i < n; i++) {
        if (rows[i].engine != STEP_LINK) compute += seconds[i];
    }
    // the links: every group inside one node (a node as large as any rank number here), as a lone
    // rank's (a CPU's groups measured among ranks sharing its cores left out: time_group_measured)
    GridShape g = {o->dp, o->pp > 1 ? o->pp : 1, o->cp > 1 ? o->cp : 1, o->tp > 1 ? o->tp : 1, o->ep > 1 ? o->ep : 1};
    int one_node = 1 << 30;
    DeviceProfile links = *p;
    links.cpu_groups_world = 0;
    for (int i = 0; i < n; i++) {
        if (rows[i].engine == STEP_LINK) seconds[i] = time_link_seconds(&links, &rows[i], g, 0, one_node, lone) * rows[i].calls;
    }
    return compute;
}


int main(int argc, char** argv) {
    llmc_rank = -1;  // no ranks here: messages are "error: ...", without "[rank 0]"
    const char *model = "d12", *precision = "bf16", *attention = "auto", *gelu = NULL, *ln_backward = "fused";
    const char* trainer = "dp";
    const char* cp_comm = "ring";
    const char* profile = NULL;
    int B = 64, T = 1024, epilogue = 1, dp = 1, cp = 1, experts = 0, topk = 2, ep = 1, micro_batches = 1;
    int tp = 1, sp = 0, tp_overlap = 0, pp = 1, vp = 1, stage = 0, zero = 0, overlap = 0, offload = 0, recompute = 0;
    int zb = 0, workers = 1, H = 0;
    float capacity_factor = 0.0f;
    const ArgSpec specs[] = {
        {"-e", ARG_STRING, &model, 0, 0, "model: a descriptor dL (d12, d24, d36, d48, ...) or L/C/NH such as 12/768/12"},
        {"-b", ARG_INT, &B, 1, ARG_NO_MAX, "micro-batch size B per rank"},
        {"-t", ARG_INT, &T, 1, ARG_NO_MAX, "sequence length T (at most the model's maxT, 1024)"},
        {"-precision", ARG_STRING, &precision, 0, 0, "bf16 or fp32"},
        {"-attention", ARG_STRING, &attention, 0, 0, "auto (flash in bf16 with head size 16/32/64, else cublas, as the trainer), flash or cublas"},
        {"-epilogue", ARG_INT, &epilogue, 0, 1, "1: bias gradients from the weight-gradient GEMMs' BGRADB epilogue; 0: separate kernels"},
        {"-dp", ARG_INT, &dp, 1, ARG_NO_MAX, "data-parallel ranks: adds the gradient all-reduce"},
        {"-cp", ARG_INT, &cp, 1, ARG_NO_MAX, "context-parallel ranks (train_gpt2_cp, zigzag): T/cp tokens a rank"},
        {"-cp_comm", ARG_STRING, &cp_comm, 0, 0, "ring (K,V blocks passed around) or allgather (the sequence's K,V gathered)"},
        {"-experts", ARG_INT, &experts, 0, 1024, "Mixture-of-Experts (train_gpt2_ep): E experts a layer (0: dense)"},
        {"-topk", ARG_INT, &topk, 1, 1024, "with -experts: the experts a token takes"},
        {"-ep", ARG_INT, &ep, 1, 1024, "with -experts: the ranks the experts are split over (of -dp)"},
        {"-gelu", ARG_STRING, &gelu, 0, 0, "epilogue (GELU in the fc GEMMs' epilogues) or kernels (default: the trainer's, epilogue in bf16, kernels in fp32)"},
        {"-ln_backward", ARG_STRING, &ln_backward, 0, 0, "fused (the trainer's default) or separate (LLMC_LAYERNORM_BACKWARD=separate)"},
        {"-micro_batches", ARG_INT, &micro_batches, 1, ARG_NO_MAX, "micro-batches a step runs (train_gpt2_dp's -d / (B T dp), a pipeline's -m); not a roofline.py flag"},
        // the layout (not roofline.py's flags): the trainers' flags of these names
        {"-trainer", ARG_STRING, &trainer, 0, 0, "whose layer: dp, cp, ep (block.h's) or tp, pp, 3d, diloco (tensor_parallel.h's: GELU in kernels); -tp > 1 or -pp > 1 imply tp"},
        {"-tp", ARG_INT, &tp, 1, 1024, "tensor-parallel ranks"},
        {"-sp", ARG_INT, &sp, 0, 1, "1: sequence parallelism (with -tp > 1)"},
        {"-tp_overlap", ARG_INT, &tp_overlap, 0, 1, "1: tp's collectives under their GEMMs (the rows' hidden_by)"},
        {"-pp", ARG_INT, &pp, 1, 1024, "pipeline stages"},
        {"-vp", ARG_INT, &vp, 1, 32, "chunks a stage (interleaved schedules)"},
        {"-stage", ARG_INT, &stage, 0, 1023, "which stage this rank is (0 .. pp-1)"},
        {"-zb", ARG_INT, &zb, 0, 1, "1: the zero-bubble schedule (W apart from B: the forward keeps what W reads)"},
        {"-z", ARG_INT, &zero, 0, 3, "ZeRO: 0-3 in train_gpt2_dp, 0 or 1 in train_gpt2_3d"},
        {"-overlap", ARG_INT, &overlap, 0, 1, "train_gpt2_dp's -overlap: the buckets' collectives under the backward (hidden_by)"},
        {"-offload", ARG_INT, &offload, 0, 1, "train_gpt2_dp's -offload: AdamW on the host, the shard over PCIe"},
        {"-r", ARG_INT, &recompute, 0, 2, "recomputation: 0, 1 (selective), 2 (the layer's forward)"},
        {"-workers", ARG_INT, &workers, 1, ARG_NO_MAX, "train_gpt2_diloco's workers (-dp: a worker's ranks)"},
        {"-H", ARG_INT, &H, 0, ARG_NO_MAX, "train_gpt2_diloco's -H: the outer step's share, 1/H a step (0: none)"},
        {"-capacity_factor", ARG_FLOAT, &capacity_factor, 0, ARG_NO_MAX, "with -experts: each expert takes at most ceil(cf N k / E) slots of a rank's tokens (0: dropless)"},
        {"-profile", ARG_STRING, &profile, 0, 0, "h100-sxm, h200, a100-80gb or a profile file: each row's \"seconds\" a step by llmc/step_time.h (a lone rank; a collective on a group inside one node, before any overlap hides it), and the compute rows' sum"},
    };
    if (!args_parse(argc, argv, specs, (int)(sizeof(specs) / sizeof(specs[0])))) return 0;

    GPT2Config c;
    if (!gpt2_config_from_shape(model, &c)) {
        fail("-e %s: expected dL (d12, d24, d36, d48, ...) or L/C/NH such as 12/768/12", model);
    }
    StepLayout o = {.B = B, .T = T, .bias_epilogue = epilogue, .dp = dp, .cp = cp, .ep = ep, .micro_batches = micro_batches,
                    .tp = tp, .sp = sp, .tp_overlap = tp_overlap, .pp = pp, .V = vp, .stage = stage, .zero = zero,
                    .overlap = overlap, .offload = offload, .recompute = recompute, .weights_later = zb,
                    .diloco_workers = workers, .diloco_H = H, .capacity_factor = capacity_factor,
                    .cp_allgather = strcmp(cp_comm, "allgather") == 0};  // (X, flash, GELU, LayerNorm: below)
    if (strcmp(cp_comm, "ring") != 0 && strcmp(cp_comm, "allgather") != 0) fail("-cp_comm %s: expected ring or allgather", cp_comm);
    if (strcmp(trainer, "tp") == 0 || strcmp(trainer, "pp") == 0 || strcmp(trainer, "3d") == 0 || strcmp(trainer, "diloco") == 0) {
        o.tp_layer = 1;
    } else if (strcmp(trainer, "dp") != 0 && strcmp(trainer, "cp") != 0 && strcmp(trainer, "ep") != 0) {
        fail("-trainer %s: expected dp, cp, ep, tp, pp, 3d or diloco", trainer);
    }
    int tpl = o.tp_layer || tp > 1 || pp > 1;
    if (strcmp(precision, "bf16") == 0) o.X = 2;
    else if (strcmp(precision, "fp32") == 0) o.X = 4;
    else fail("-precision %s: expected bf16 or fp32", precision);
    int flash_ok = flash_attention_supports(o.X, c.channels / c.num_heads);
    if (strcmp(attention, "auto") == 0) o.flash = flash_ok;
    else if (strcmp(attention, "flash") == 0) o.flash = 1;
    else if (strcmp(attention, "cublas") == 0) o.flash = 0;
    else fail("-attention %s: expected auto, flash or cublas", attention);
    if (o.flash && !flash_ok) {
        fail("-attention flash needs -precision bf16 and a head size of 16, 32 or 64 (this one: %s, %d), as the "
             "trainer's LLMC_ATTENTION=flash", precision, c.channels / c.num_heads);
    }
    if (gelu == NULL) gelu = o.X == 2 ? "epilogue" : "kernels";  // the trainer's default (llmc/cuda/gelu.cuh)
    if (strcmp(gelu, "epilogue") == 0) o.gelu_epilogue = 1;
    else if (strcmp(gelu, "kernels") != 0) fail("-gelu %s: expected epilogue or kernels", gelu);
    if (strcmp(ln_backward, "fused") == 0) o.ln_backward_fused = 1;
    else if (strcmp(ln_backward, "separate") != 0) fail("-ln_backward %s: expected fused or separate", ln_backward);
    if (T > c.max_seq_len) fail("-t %d: expected 1..%d (the model's maxT)", T, c.max_seq_len);
    if (cp > 1 && ((!tpl && dp > 1) || T % (2 * cp) != 0)) {
        fail("-cp %d: train_gpt2_cp alone (-dp 1; with -dp, train_gpt2_3d: -trainer 3d), with -t a multiple of 2 cp (zigzag)", cp);
    }
    // the widths a tp rank holds must divide (model.h's layer_dims_problem), and the layers the stages
    if (c.num_heads % tp || c.padded_vocab_size % tp) {
        fail("-tp %d: must divide the heads (%d) and the padded vocabulary (%d)", tp, c.num_heads, c.padded_vocab_size);
    }
    if (sp && (tp == 1 || (B * T / cp) % tp)) fail("-sp 1: needs -tp > 1 dividing the rank's B T/cp tokens (%d)", B * T / cp);
    if (c.num_layers % (pp * vp) || stage >= pp) {
        fail("-pp %d -vp %d -stage %d: pp vp must divide the %d layers, and the stage be below pp", pp, vp, stage, c.num_layers);
    }
    if (vp > 1 && pp == 1) fail("-vp %d: chunks of a pipeline's stage (-pp > 1)", vp);
    if ((zero >= 2 || offload) && tpl) fail("-z %d -offload %d: ZeRO-2, 3 and -offload are train_gpt2_dp's (-trainer dp)", zero, offload);
    if (H && (!tpl || pp > 1 || cp > 1)) fail("-H %d: train_gpt2_diloco's (-trainer diloco, -pp 1, -cp 1)", H);
    if (experts) {
        // train_gpt2_ep: ep of the dp ranks; train_gpt2_3d (-trainer 3d): ep of a stage's dp cp tp ranks
        int stage_ranks = tpl ? dp * cp * tp : dp;
        if (experts < 2 || topk > experts || experts % ep || stage_ranks % ep || (!tpl && cp > 1) || recompute ||
            (!tpl && zero) || H || offload) {
            fail("-experts %d -topk %d -ep %d: expected E >= 2, 1 <= k <= E, ep dividing E and the ranks that hold the "
                 "experts (train_gpt2_ep: -dp; -trainer 3d: -dp x -cp x -tp), and no -r, -H, -offload or ZeRO beside "
                 "train_gpt2_3d's -z 1", experts, topk, ep);
        }
        c.experts = experts, c.topk = topk;
    }

    StepKernel rows[STEP_KERNELS_MAX];
    int n = step_kernels(rows, STEP_KERNELS_MAX, c, o);
    if (n > STEP_KERNELS_MAX) fail("the step has %d rows, more than STEP_KERNELS_MAX = %d", n, STEP_KERNELS_MAX);
    long long parameters = tpl ? step_stage_parameters(c, tp, pp, stage, ep, o.v_shape) : step_rank_parameters(c, ep);
    DeviceProfile device;
    static double seconds[STEP_KERNELS_MAX];
    double compute = 0.0;
    if (profile) {
        char why[2048];  // (a profile path and a field's text)
        if (!device_profile_load(profile, &device, why, sizeof(why))) fail("-profile %s", why);
        compute = price_rows(&device, c, &o, rows, n, seconds);
    }
    printf("{\"parameters\": %lld, ", parameters);
    if (profile) {
        printf("\"profile\": ");
        print_json_string(profile);
        printf(", \"seconds\": %.17g, ", compute);
    }
    printf("\"rows\": [\n");
    for (int i = 0; i < n; i++) {
        StepKernel* r = &rows[i];
        printf(" {\"group\": ");
        print_json_string(r->group);
        printf(", \"kernel\": ");
        print_json_string(r->kernel);
        // %.17g: every double printed so that reading it back gives the same double
        printf(", \"calls\": %lld, \"launches\": %lld, \"flops\": %.17g, \"bytes\": %.17g, \"engine\": \"%s\", \"op\": ",
               (long long)r->calls, (long long)r->launches, r->flops, r->bytes, step_engine_name(r->engine));
        print_json_string(r->op);
        printf(", \"launch\": ");
        if (r->launch[0]) print_json_string(r->launch);
        else printf("null");
        printf(", \"phase\": \"%s\", \"chunks\": %u", step_phase_name(r->phase), r->chunks);
        if (r->comm) {
            printf(", \"comm\": \"%s\", \"collective\": \"%s\", \"payload\": %.17g, \"ranks\": %d, \"hidden_by\": ",
                   r->comm, r->collective, r->payload, r->ranks);
            if (r->hidden_by[0]) print_json_string(r->hidden_by);
            else printf("null");
        } else {
            printf(", \"comm\": null, \"collective\": null, \"payload\": 0, \"ranks\": 0, \"hidden_by\": null");
        }
        if (profile) printf(", \"seconds\": %.17g", seconds[i]);
        printf("}%s\n", i + 1 < n ? "," : "");
    }
    printf("]}\n");
    return 0;
}
