// The kernels of one training step on a GPU (llmc/step_kernels.h), printed as JSON: one row per
// kind of kernel with its calls, the FLOPs and bytes of one call and the engine that bounds it.
// dev/bench/roofline.py reads these rows and prints each at its roofline.
//
//   make dev/bench/step_kernels
//   dev/bench/step_kernels -e d12 -b 64 -t 1024                       train_gpt2_dp's step, bf16, flash
//   dev/bench/step_kernels -e 12/768/12 -b 4 -t 64 -precision fp32   a strict-fp32 build's (cuBLAS attention)
//   dev/bench/step_kernels -e d12 -b 8 -t 1024 -cp 4                 one rank of train_gpt2_cp
//   dev/bench/step_kernels -e d12 -experts 8 -topk 2 -dp 4 -ep 2     one rank of train_gpt2_ep
//
// The flags are roofline.py's that choose the step (its device and efficiency flags choose rates,
// which are no part of the rows).
#include <stdio.h>
#include <string.h>
#include "llmc/args.h"
#include "llmc/gpt2.h"
#include "llmc/step_kernels.h"

// a JSON string of text (the rows' names hold no control characters)
static void json_string(const char* text) {
    putchar('"');
    for (const char* c = text; *c; c++) {
        if (*c == '"' || *c == '\\') putchar('\\');
        putchar(*c);
    }
    putchar('"');
}

int main(int argc, char** argv) {
    llmc_rank = -1;  // no ranks here: messages are "error: ...", without "[rank 0]"
    const char *model = "d12", *precision = "bf16", *attention = "auto", *gelu = NULL, *ln_backward = "fused";
    int B = 64, T = 1024, epilogue = 1, dp = 1, cp = 1, experts = 0, topk = 2, ep = 1, micro_batches = 1;
    const ArgSpec specs[] = {
        {"-e", ARG_STRING, &model, 0, 0, "model: a descriptor dL (d12, d24, d36, d48, ...) or L/C/NH such as 12/768/12"},
        {"-b", ARG_INT, &B, 1, ARG_NO_MAX, "micro-batch size B per rank"},
        {"-t", ARG_INT, &T, 1, ARG_NO_MAX, "sequence length T (at most the model's maxT, 1024)"},
        {"-precision", ARG_STRING, &precision, 0, 0, "bf16 or fp32"},
        {"-attention", ARG_STRING, &attention, 0, 0, "auto (flash in bf16 with head size 16/32/64, else cublas, as the trainer), flash or cublas"},
        {"-epilogue", ARG_INT, &epilogue, 0, 1, "1: bias gradients from the weight-gradient GEMMs' BGRADB epilogue; 0: separate kernels"},
        {"-dp", ARG_INT, &dp, 1, ARG_NO_MAX, "data-parallel ranks: adds the gradient all-reduce"},
        {"-cp", ARG_INT, &cp, 1, ARG_NO_MAX, "context-parallel ranks (train_gpt2_cp, zigzag): T/cp tokens a rank"},
        {"-experts", ARG_INT, &experts, 0, 1024, "Mixture-of-Experts (train_gpt2_ep): E experts a layer (0: dense)"},
        {"-topk", ARG_INT, &topk, 1, 1024, "with -experts: the experts a token takes"},
        {"-ep", ARG_INT, &ep, 1, 1024, "with -experts: the ranks the experts are split over (of -dp)"},
        {"-gelu", ARG_STRING, &gelu, 0, 0, "epilogue (GELU in the fc GEMMs' epilogues) or kernels (default: the trainer's, epilogue in bf16, kernels in fp32)"},
        {"-ln_backward", ARG_STRING, &ln_backward, 0, 0, "fused (the trainer's default) or separate (LLMC_LAYERNORM_BACKWARD=separate)"},
        {"-micro_batches", ARG_INT, &micro_batches, 1, ARG_NO_MAX, "micro-batches a step accumulates (train_gpt2_dp's -d / (B T dp), -z 0); not a roofline.py flag"},
    };
    if (!args_parse(argc, argv, specs, (int)(sizeof(specs) / sizeof(specs[0])))) return 0;

    GPT2Config c;
    int L, C, NH;
    char tail;
    if (sscanf(model, "%d/%d/%d%c", &L, &C, &NH, &tail) == 3) {
        if (L <= 0 || C <= 0 || NH <= 0 || C % NH != 0) fail("-e %s: L, C, NH must be positive and NH must divide C", model);
        gpt2_config_from_descriptor("d12", &c);  // GPT-2's vocabulary and maxT
        c.num_layers = L, c.channels = C, c.num_heads = NH;
    } else if (!gpt2_config_from_descriptor(model, &c)) {
        fail("-e %s: expected dL (d12, d24, d36, d48, ...) or L/C/NH such as 12/768/12", model);
    }
    StepLayout o = {.B = B, .T = T, .bias_epilogue = epilogue, .dp = dp, .cp = cp, .ep = ep, .micro_batches = micro_batches};  // (X, flash, GELU, LayerNorm: below)
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
    if (cp > 1 && (dp > 1 || T % (2 * cp) != 0)) {
        fail("-cp %d: train_gpt2_cp alone (-dp 1), with -t a multiple of 2 cp (zigzag)", cp);
    }
    if (experts) {
        if (experts < 2 || topk > experts || experts % ep || dp % ep || cp > 1) {
            fail("-experts %d -topk %d -ep %d: expected E >= 2, 1 <= k <= E, ep dividing E and -dp, -cp 1 (train_gpt2_ep)",
                 experts, topk, ep);
        }
        c.experts = experts, c.topk = topk;
    }

    StepKernel rows[STEP_KERNELS_MAX];
    int n = step_kernels(rows, STEP_KERNELS_MAX, c, o);
    if (n > STEP_KERNELS_MAX) fail("the step has %d rows, more than STEP_KERNELS_MAX = %d", n, STEP_KERNELS_MAX);
    printf("{\"parameters\": %lld, \"rows\": [\n", (long long)step_rank_parameters(c, ep));
    for (int i = 0; i < n; i++) {
        StepKernel* r = &rows[i];
        printf(" {\"group\": ");
        json_string(r->group);
        printf(", \"kernel\": ");
        json_string(r->kernel);
        // %.17g: every double printed so that reading it back gives the same double
        printf(", \"calls\": %lld, \"launches\": %lld, \"flops\": %.17g, \"bytes\": %.17g, \"engine\": \"%s\", \"op\": ",
               (long long)r->calls, (long long)r->launches, r->flops, r->bytes, step_engine_name(r->engine));
        json_string(r->op);
        printf(", \"launch\": ");
        if (r->launch[0]) json_string(r->launch);
        else printf("null");
        printf("}%s\n", i + 1 < n ? "," : "");
    }
    printf("]}\n");
    return 0;
}
