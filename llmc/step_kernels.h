// The kernels of one training step on a GPU, one row per kind of kernel: what it computes (its
// FLOPs), what it must move through the GPU's memory (its bytes), how often a step runs it and
// which part of the chip bounds it. This is the step's inventory for one rank of any trainer's
// layout, kept once, here: dev/bench/roofline.py prints each row of train_gpt2_dp's step at its
// roofline, max(FLOPs / FLOP/s, bytes / bandwidth), and a model of the step's time reads the
// same rows for any layout (step_kernels, or step_kernels_run with memory_plan.h's RunLayout).
//
// What the rows count, per call:
// - FLOPs: matmuls exactly (2 m n k); attention as the kernels execute it (the causal flash
//   kernels visit whole 64 x 64 tiles up to the diagonal; the cuBLAS path multiplies full T x T
//   squares); elementwise kernels by an approximate count of fp32 operations per element
//   (STEP_FLOPS_* below: only their order matters, as all of them are memory-bound).
// - bytes: the minimum the kernel must move: each input read once and each output written once
//   at its element width (floatX, X = 2 bytes in bf16 and 4 in fp32, for parameters, activations
//   and gradients; fp32 for master weights, AdamW's m and v, LayerNorm's mean and rstd,
//   attention's log-sum-exp). Re-reads the caches serve are free here.
// - for a collective ("link" rows): the bytes one rank sends on its link, and no FLOPs; beside
//   them the payload the trainers count and print (StepKernel says how the two relate).
// Launch latency, the host's work inside the step, a grid's tail and the 4-byte scalars of the
// step line (the loss's average and broadcast, the norm's sum) are not rows: a sum of the rows'
// times is a lower bound on the step.
//
// The rows are those of one rank:
// - context parallelism (cp > 1): its T/cp tokens of each sequence (zigzag: an equal share of the
//   causal attention), the ring's K,V blocks and the gradients' all-reduce over cp;
// - experts (GPT2Config's experts E and topk k, split over ep ranks, train_gpt2_ep): each MLP is
//   E experts of which a token takes k, the routing balanced and dropless: a rank's experts take
//   N k rows a layer, and (ep - 1)/ep of its N k slots cross the link each way;
// - tensor parallelism (tp > 1, train_gpt2_tp and a stage of train_gpt2_3d): the matmuls on the
//   rank's widths (qkv 3C/tp and fc 4C/tp out, attproj C/tp and fcproj 4C/tp in, NH/tp heads,
//   the LM head's Vp/tp rows of wte and the vocabulary-parallel loss) over all N tokens; the
//   residual stream, its LayerNorms and the row-parallel biases on N tokens, or N/tp with -sp;
//   the f and g collectives of (N, C): 4 a layer, the embedding's and the head's, all-reduces or
//   with -sp as many all-gathers and reduce-scatters, and -sp's LayerNorm gradients once a step;
// - a pipeline stage (pp > 1, train_gpt2_pp and _3d): its Ls = L/pp layers in V chunks, the
//   embedding on the first stage and the final LayerNorm, head and loss on the last, a send per
//   chunk boundary and micro-batch each way (N C X, / tp with -sp), the tied wte's all-reduce
//   between the first and the last stage;
// - ZeRO (train_gpt2_dp's -z 1-3 on its padded buckets, train_gpt2_3d's -z 1 on its padded
//   buffer): reduce-scatters and all-gathers in place of the all-reduce, the norm and AdamW on the
//   rank's 1/dp shard; -offload's AdamW on the host, the shard's gradients and parameters over PCIe;
// - recomputation (-r 1, -r 2): what each layer's forward did not keep, again before its
//   backward (step_recompute);
// - DiLoCo's outer step, its 1/H share a step (train_gpt2_diloco's -workers and -H).
//
// A step runs m micro-batches (StepLayout.micro_batches: train_gpt2_dp's accumulation, a
// pipeline's -m): each runs the forward and backward, the rest runs once a step. Each row says
// which action of a pipeline's schedule runs it and on which chunks (StepKernel's phase and
// chunks), so that a time model prices one chunk's F, B and W for pipeline.h's pipeline_play.
//
// - experts in the grid trainer (5D): the fold (ep of a stage's dp cp tp ranks hold the experts,
//   whole), each rank routing its Ns tokens (with -sp its share), the all-to-alls over ep, the
//   dense tensors reduced over dp cp and the experts over their dp cp tp / ep copies (edp); a
//   capacity factor's cap on the slots an expert takes, under balanced routing.
//
// Not in the rows yet: experts with -r or with train_gpt2_dp's ZeRO (neither trainer runs them),
// the aux loss's small all-reduces (MoE's figures, each sequence's f and P over cp x tp), and
// DiLoCo's -outer_dtype below fp32 and its fragments.
#ifndef LLMC_STEP_KERNELS_H
#define LLMC_STEP_KERNELS_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include "gpt2.h"
#include "target.h"

// the launch constants the rows depend on, copied from the CUDA headers (which a CPU build cannot
// include); a test checks each copy against its #define
#define STEP_FLASH_TILE 64          // llmc/cuda/flash_attention.cuh: FLASH_TILE, 64 queries x 64 keys a tile
#define STEP_FLASH_Q_TILES 2        // llmc/cuda/flash_attention.cuh: FLASH_Q_TILES, the forward's row tiles of 16 a warp
#define STEP_LN_FUSED_MAX_PACKS 5   // llmc/cuda/layernorm.cuh: LN_FUSED_MAX_PACKS, the widest row of the fused backward
#define STEP_ADAMW_RUNS_PER_LAUNCH 96  // llmc/cuda/adamw.cuh: ADAMW_RUNS_PER_LAUNCH, tensor pieces one launch takes
// (BIAS_ROWS_PER_BLOCK, LN_ROWS_PER_BLOCK and NORM_BLOCKS come from target.h itself)

// approximate fp32 operations per element of the elementwise kernels
#define STEP_FLOPS_ADD 1                  // encoder_forward, the residual add, a bias sum
#define STEP_FLOPS_LAYERNORM 8            // mean (1), variance (2), normalise and scale (4), shift (1)
#define STEP_FLOPS_GELU 10                // cube, polynomial, tanh, product
#define STEP_FLOPS_GELU_BACKWARD 20       // tanh again, its derivative, the chain rule
#define STEP_FLOPS_LAYERNORM_BACKWARD 14  // g = dout w, two row sums, then the input gradient
#define STEP_FLOPS_LAYERNORM_PARAMS 5     // dw += d xhat, db += d
#define STEP_FLOPS_CLASSIFIER 9           // max, exp and sum in the first pass; exp, scale, subtract, scale in the second
#define STEP_FLOPS_SOFTMAX 7              // max, exp, sum, exp again and a scale (cuBLAS attention)
#define STEP_FLOPS_SOFTMAX_BACKWARD 5     // the dot p . d, then p (d - dot) scale
#define STEP_FLOPS_DOT 2                  // flash backward's D = rowsum(dO * O), the gradient norm's squares
#define STEP_FLOPS_ADAMW 20               // two moments, the bias corrections, sqrt, divide, decay, the rounding

// which rate bounds a row besides the memory's bandwidth
typedef enum {
    STEP_GEMM,    // cuBLASLt on the tensor cores (strict fp32 on the fp32 units in fp32 builds)
    STEP_ATTN,    // the flash attention kernels (tensor cores, at a rate of their own)
    STEP_VECTOR,  // elementwise work on the fp32 CUDA cores
    STEP_MEMSET,  // cudaMemset: bytes alone
    STEP_LINK,    // a collective or a send: the bytes one rank puts on its link (comm names which: a
                  // group of ranks, or "pcie", the host's copies under -offload)
    STEP_HOST,    // work on the host's CPU (-offload's AdamW): its FLOPs and host-memory bytes
} StepEngine;

static inline const char* step_engine_name(StepEngine e) {
    switch (e) {
        case STEP_GEMM: return "gemm";
        case STEP_ATTN: return "attn";
        case STEP_VECTOR: return "vector";
        case STEP_MEMSET: return "memset";
        case STEP_LINK: return "link";
        case STEP_HOST: return "host";
    }
    return "?";
}

// which action of a pipeline's schedule runs a row (llmc/pipeline.h): a micro-batch's forward of a
// chunk (F), the input-gradient half of its backward (B: what the stage before waits for), the
// weight-gradient half (W: zero bubble runs it apart, every other schedule right after B), or the
// step's once-only work after the last micro-batch (the gradients' reduction, the optimizer)
typedef enum { STEP_PHASE_STEP, STEP_PHASE_FORWARD, STEP_PHASE_BACKWARD_INPUT, STEP_PHASE_BACKWARD_WEIGHT } StepPhase;

static inline const char* step_phase_name(StepPhase p) {
    switch (p) {
        case STEP_PHASE_STEP: return "step";
        case STEP_PHASE_FORWARD: return "forward";
        case STEP_PHASE_BACKWARD_INPUT: return "backward_input";
        case STEP_PHASE_BACKWARD_WEIGHT: return "backward_weight";
    }
    return "?";
}

#define STEP_NAME_CHARS 64
#define STEP_KERNELS_MAX 128  // rows of the largest steps: 71 in train_gpt2_ep (cuBLAS attention, every kernel
                              // separate), 87 in a stage of train_gpt2_3d (dp x cp x tp -sp, -r 2, ZeRO-1),
                              // 99 with the planner's -megatron 1 (cuBLAS, -r 2)

// one kind of kernel of the step
typedef struct {
    const char* group;             // the part of the step: "embedding", "layer forward", ...
    char kernel[STEP_NAME_CHARS];  // what it is, e.g. "matmul qkv (+bias epilogue)"
    int64_t calls;                 // calls a step (L for a layer's kernel)
    int64_t launches;              // launches those calls take (AdamW: one call, ceil(pieces / 96) launches)
    double flops;                  // of one call
    double bytes;                  // of one call
    StepEngine engine;
    const char* op;                // what it belongs to: "matmul", "attention", "layernorm", "comm", ...
    char launch[STEP_NAME_CHARS];  // its kind of launch as LLMC_KERNEL_TIMES=1 names it (llmc/kernel_times.h);
                                   // "" for what no launcher runs (the collectives)
    // where in the schedule: the action that runs it, and which of the stage's V chunks (bit k:
    // chunk k; 0 for the step's once-only rows). Each chunk with its bit runs calls / (m n) of
    // the calls for each micro-batch's action, m the micro-batches and n the bits set: a layer's
    // rows spread over every chunk, the embedding's on chunk 0 of the first stage, the head's on
    // chunk V-1 of the last
    StepPhase phase;
    uint32_t chunks;
    // a link row's collective: comm the group ("tp", "cp", "pp", "dp", "edp", "ep", "embedding",
    // DiLoCo's "across" the workers, "pcie"), collective its kind ("all-reduce", "reduce-scatter", "all-gather", "send",
    // "all-to-all", "copy"), payload the bytes one call hands to it as the trainers count them
    // (their printed formulas and main.log's "comm": the whole tensor reduced or gathered; bytes
    // above is what of it crosses this rank's link: 2 (n-1)/n of an all-reduce's payload, (n-1)/n
    // of a reduce-scatter's or an all-gather's, all of a send's), ranks the group's size; NULL, 0
    // on every other row. hidden_by: the compute this link row may run under when its overlap flag
    // is on (-tp_overlap: a GEMM's kernel; -overlap: a group's rows, "layer backward"; cp's ring:
    // a kind of launch, "attention forward"); "" when it waits in the open. Whether it is hidden
    // is the time model's to decide
    const char* comm;
    const char* collective;
    double payload;
    int ranks;
    char hidden_by[STEP_NAME_CHARS];
} StepKernel;

// how the step is run: what roofline.py's flags choose, and the layout (the trainers' flags of
// the same names; llmc/memory_plan.h's RunLayout, which step_kernels_run below reads). Every new
// field's 0 is the layout of train_gpt2_dp (tp = pp = 1, no ZeRO, -r 0)
typedef struct {
    int B, T;               // sequences of a micro-batch on this rank, and their length (the whole T, also under cp)
    int X;                  // bytes of floatX: 2 (bf16) or 4 (fp32)
    int flash;              // attention: 1 the flash kernels, 0 cuBLAS's batched GEMMs and a softmax kernel
    int bias_epilogue;      // 1: bias gradients from the weight-gradient GEMMs' BGRADB epilogue; 0: kernels
    int gelu_epilogue;      // 1: GELU in the fc GEMM's epilogue (and DGELU in fcproj's dinp); 0: kernels
    int ln_backward_fused;  // 1: the LayerNorm backward in one kernel where a row fits (else separate kernels)
    int dp, cp, ep;         // data-parallel ranks, context-parallel ranks, ranks the experts are split over
    int cp_allgather;       // -cp_comm allgather: the whole sequence's K,V gathered (else the ring)
    int micro_batches;      // micro-batches a step runs, m (train_gpt2_dp's -d / (B T dp), a pipeline's -m):
                            // each runs the forward and backward; the gradients' memset, their reduction,
                            // the norm and AdamW stay once a step (0 or 1: one)
    // the layer of llmc/tensor_parallel.h (train_gpt2_tp, _pp, _3d and _diloco run it, through
    // llmc/chunk.h): GELU in kernels of its own, never in an epilogue, and with tp > 1 the
    // row-parallel biases added after the sum. 0: block.h's plain layer (train_gpt2_dp, _cp, _ep).
    // Implied by tp > 1 or pp > 1
    int tp_layer;
    int tp, sp, tp_overlap;  // tensor-parallel ranks (0 or 1: none), -sp, -tp_overlap
    int pp, V, stage;       // pipeline stages, chunks a stage (-vp), and which stage this rank is
    int v_shape;            // 1: the two chunks in a V (zbv, dualpipev, pp > 1): the head on stage 0 with
                            // the embedding, and stage pp - 1's chunk 0 hands its output to its chunk 1
    int zero, overlap, offload;  // train_gpt2_dp's -z (0-3), -overlap and -offload; train_gpt2_3d's -z 1
    int recompute;          // -r: 0, 1 (GELU, and cuBLAS attention's probabilities), 2 (the layer's forward)
    int weights_later;      // zero bubble (-s zb): W runs apart from B, so the forward keeps what W reads
    int diloco_workers, diloco_H;  // train_gpt2_diloco's -workers (dp: a worker's ranks) and -H: the outer
                                   // step's share, 1/H of it a step (0: none)
    float capacity_factor;  // experts: -capacity_factor (0: dropless)
    double maxvio;          // experts: the routed loads' MaxVio (llmc/moe.h; 0: balanced), which the
                            // all-to-alls' rows carry the busiest rank's bytes at
    int megatron;           // 1: the step as Megatron-LM (2021) runs it, to compare with its published
                            // table: dropout on the attention probabilities and on both residual
                            // branches (its default, 0.1), and -r 2 rerunning the whole layer
} StepLayout;

// where the rows go while step_kernels fills them
typedef struct {
    StepKernel* rows;
    int capacity, count;  // count may pass capacity: the rows past it are counted, not written
    const char* group;
    int repeat;           // a step's calls for each call a micro-batch makes: 1, or the micro-batches
    StepPhase phase;      // the rows' action and chunks (StepKernel), set with the group
    uint32_t chunks;
} StepRows;

static inline int64_t step_ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// a row, unless the step never calls it (calls = 0: the "next layer" LayerNorm of a 1-layer model).
// calls (and launches, 0 for one a call) are a micro-batch's, or the step's in a once-a-step
// group; launch NULL: no launcher runs it
static inline StepKernel* step_row(StepRows* s, int64_t calls, int64_t launches, double flops, double bytes,
                                   StepEngine engine, const char* op, const char* launch, const char* kernel_fmt, ...) {
    if (calls <= 0) return NULL;
    calls *= s->repeat;
    launches = launches ? launches * s->repeat : calls;
    StepKernel* r = NULL;
    if (s->count < s->capacity) {
        r = &s->rows[s->count];
        memset(r, 0, sizeof(*r));
        va_list ap;
        va_start(ap, kernel_fmt);
        vsnprintf(r->kernel, sizeof(r->kernel), kernel_fmt, ap);
        va_end(ap);
        r->group = s->group;
        r->calls = calls;
        r->launches = launches;
        r->flops = flops;
        r->bytes = bytes;
        r->engine = engine;
        r->op = op;
        snprintf(r->launch, sizeof(r->launch), "%s", launch ? launch : "");
        r->phase = s->phase;
        r->chunks = s->chunks;
    }
    s->count++;
    return r;
}

// a collective (or send) of the group comm of `ranks` ranks: one call hands it count elements of
// `width` bytes (the payload); the row's bytes are what crosses this rank's link, NCCL's ring:
// all-reduce 2 (n-1)/n of the payload, reduce-scatter and all-gather (n-1)/n, a send or an
// all-to-all's cross traffic all of it. hidden_by: see StepKernel (NULL or "": none)
static inline void step_link(StepRows* s, int64_t calls, const char* comm, const char* collective, int64_t ranks,
                             double count, double width, const char* hidden_by, const char* kernel_fmt, ...) {
    double share = 1.0;
    if (strcmp(collective, "all-reduce") == 0) share = (double)(2 * (ranks - 1)) / ranks;
    if (strcmp(collective, "reduce-scatter") == 0 || strcmp(collective, "all-gather") == 0) share = (double)(ranks - 1) / ranks;
    char kernel[STEP_NAME_CHARS];
    va_list ap;
    va_start(ap, kernel_fmt);
    vsnprintf(kernel, sizeof(kernel), kernel_fmt, ap);
    va_end(ap);
    StepKernel* r = step_row(s, calls, 0, 0, share == 1.0 ? count * width : share * count * width, STEP_LINK, "comm",
                             NULL, "%s", kernel);
    if (r == NULL) return;
    r->comm = comm, r->collective = collective, r->payload = count * width, r->ranks = (int)ranks;
    snprintf(r->hidden_by, sizeof(r->hidden_by), "%s", hidden_by ? hidden_by : "");
}

// one MLP (an expert): fc (4C x C + 4C), fcproj (C x 4C + C)
static inline int64_t step_mlp_parameters(int64_t C) { return 8 * C * C + 5 * C; }

// the parameters one rank holds: the model's (llmc/gpt2.h), of whose E experts a layer it holds E/ep
static inline int64_t step_rank_parameters(GPT2Config c, int ep) {
    int64_t P = (int64_t)gpt2_num_parameters(c);
    if (gpt2_is_moe(c)) P -= (int64_t)c.num_layers * (c.experts - c.experts / ep) * step_mlp_parameters(c.channels);
    return P;
}

// (query tile, key tile) pairs a causal flash backward kernel visits per (batch, head): the tiles
// on and below the diagonal, each a whole 64 x 64 tile (flash_attention.cuh skips the ones above)
static inline int64_t step_flash_tiles(int64_t T) {
    int64_t n = step_ceil_div(T, STEP_FLASH_TILE);
    return n * (n + 1) / 2;
}

// the same count for the forward, in 64 x 64 tiles: there a warp owns 16 * FLASH_Q_TILES queries
// and computes each 64-key tile up to its last query. Equal to step_flash_tiles(T) when T is a
// multiple of 64; a fraction of a tile otherwise
static inline double step_flash_forward_tiles(int64_t T) {
    int64_t rows = 16 * STEP_FLASH_Q_TILES, strip_tiles = 0;
    for (int64_t row0 = 0; row0 < T; row0 += rows) strip_tiles += (row0 + rows - 1) / STEP_FLASH_TILE + 1;
    return (double)(strip_tiles * rows) / STEP_FLASH_TILE;
}

// ---------------------------------------------------------------------------------------------
// the shapes' kernels. N: rows of the activations (B T/cp tokens), X: bytes of floatX

// one cuBLASLt GEMM (rows, k) x (k, out). Forward and input-gradient GEMMs read their two operands
// and write the result (+ the bias read, + aux: a GELU epilogue's matrix of the result's shape,
// written forward or read by DGELU). A weight-gradient GEMM (dweight) reads the activation
// (rows, k) and the gradient (rows, out) and adds into the weight gradient (out, k): read and
// written (beta = 1); with bias its BGRADB epilogue writes this pass's bias gradient (out) to
// scratch. launch NULL: named by the weight's shape, "matmul forward k->out" or "matmul dweight k->out"
static inline void step_matmul(StepRows* s, int X, const char* kernel, int64_t rows, int64_t k, int64_t out,
                               int64_t calls, int bias, int dweight, int aux, const char* launch) {
    int64_t nbytes;
    if (dweight) nbytes = (rows * k + rows * out + 2 * out * k) * X + (bias ? out * X : 0);
    else nbytes = (rows * k + k * out + rows * out + (bias ? out : 0) + (aux ? rows * out : 0)) * X;
    char name[STEP_NAME_CHARS];
    if (launch == NULL) {
        snprintf(name, sizeof(name), "matmul %s %lld->%lld", dweight ? "dweight" : "forward", (long long)k, (long long)out);
        launch = name;
    }
    step_row(s, calls, 0, (double)(2 * rows * k * out), (double)nbytes, STEP_GEMM, "matmul", launch, "%s", kernel);
}

// dinp (rows, out) = dout (rows, k) x weight, the weight being the forward's out -> k
static inline void step_matmul_dinp(StepRows* s, int X, const char* kernel, int64_t rows, int64_t k, int64_t out,
                                    int64_t calls, int aux) {
    char launch[STEP_NAME_CHARS];
    snprintf(launch, sizeof(launch), "matmul dinp %lld->%lld", (long long)out, (long long)k);
    step_matmul(s, X, kernel, rows, k, out, calls, 0, 0, aux, launch);
}

// the bias gradient of a weight-gradient GEMM, dbias (OC) += the column sums of dout (N, OC)
static inline void step_bias_grad(StepRows* s, StepLayout o, int64_t N, const char* name, int64_t OC, int64_t calls,
                                  const char* launch) {
    int X = o.X;
    if (o.bias_epilogue) {
        // the sums came from the GEMM's BGRADB epilogue; one tiny kernel adds them to dbias
        step_row(s, calls, 0, (double)OC, (double)(3 * OC * X), STEP_VECTOR, "bias", launch, "bias_accumulate (%s)", name);
        return;
    }
    // matmul.cuh's two kernels: partial column sums of 512-row blocks, then one ordered pass; the
    // first reads all of dout again (what the epilogue saves)
    int64_t parts = step_ceil_div(N, BIAS_ROWS_PER_BLOCK);
    step_row(s, calls, 0, (double)(N * OC), (double)(N * OC * X + parts * OC * 4), STEP_VECTOR, "bias", launch,
             "bias_backward_partial (%s)", name);
    step_row(s, calls, 0, (double)(parts * OC), (double)(parts * OC * 4 + 2 * OC * X), STEP_VECTOR, "bias", launch,
             "bias_backward_final (%s)", name);
}

// a layer's weight gradient dweight (OC, K) += dout^T inp over the N rows, and its bias gradient
// (OC), in the GEMM's epilogue or in kernels of their own
static inline void step_weight_gradient(StepRows* s, StepLayout o, int64_t N, const char* name, int64_t K, int64_t OC,
                                        int64_t calls) {
    char kernel[STEP_NAME_CHARS], bias[STEP_NAME_CHARS], launch[STEP_NAME_CHARS];
    snprintf(kernel, sizeof(kernel), "matmul %s dweight%s", name, o.bias_epilogue ? " (+dbias BGRADB)" : "");
    snprintf(bias, sizeof(bias), "%sb", name);
    snprintf(launch, sizeof(launch), "matmul dweight %lld->%lld", (long long)K, (long long)OC);
    step_matmul(s, o.X, kernel, N, K, OC, calls, o.bias_epilogue, 1, 0, NULL);
    step_bias_grad(s, o, N, bias, OC, calls, launch);
}

// one warp per row; with residual (fused_residual_layernorm_forward) it first adds a + b and writes
// the sum (the residual stream); writes out (N, C) and fp32 mean, rstd (N)
static inline void step_layernorm_forward(StepRows* s, int X, int64_t N, int64_t C, const char* kernel, int64_t calls,
                                          int residual) {
    int64_t reads = (residual ? 2 : 1) * N * C * X + 2 * C * X;
    int64_t writes = (residual ? 2 : 1) * N * C * X + 2 * N * 4;
    int64_t flops = (STEP_FLOPS_LAYERNORM + (residual ? STEP_FLOPS_ADD : 0)) * N * C;
    step_row(s, calls, 0, (double)flops, (double)(reads + writes), STEP_VECTOR, "layernorm",
             residual ? "residual + layernorm forward" : "layernorm forward", "%s", kernel);
}

// layernorm.cuh's kernels: where a lane holds at most LN_FUSED_MAX_PACKS 16-byte packs of a row
// (and ln_backward_fused, the trainer's default), the input gradient and the parameters' partial
// sums in one kernel that reads dout and x once, then the final sums; else the input gradient
// (added into dresidual: read and written), then the weight and bias gradients in two
// deterministic passes, the first reading dout and x again
static inline void step_layernorm_backward(StepRows* s, StepLayout o, int64_t N, int64_t C, const char* name,
                                           int64_t calls) {
    int X = o.X;
    int64_t parts = step_ceil_div(N, LN_ROWS_PER_BLOCK);
    const char* launch = "layernorm backward";
    if (o.ln_backward_fused && step_ceil_div(C * X / 16, 32) <= STEP_LN_FUSED_MAX_PACKS) {
        step_row(s, calls, 0, (double)((STEP_FLOPS_LAYERNORM_BACKWARD + STEP_FLOPS_LAYERNORM_PARAMS) * N * C),
                 (double)(4 * N * C * X + C * X + 2 * N * 4 + parts * 2 * C * 4), STEP_VECTOR, "layernorm", launch,
                 "layernorm_backward_fused (%s)", name);
    } else {
        step_row(s, calls, 0, (double)(STEP_FLOPS_LAYERNORM_BACKWARD * N * C),
                 (double)(4 * N * C * X + C * X + 2 * N * 4), STEP_VECTOR, "layernorm", launch,
                 "layernorm_backward_input (%s)", name);
        step_row(s, calls, 0, (double)(STEP_FLOPS_LAYERNORM_PARAMS * N * C),
                 (double)(2 * N * C * X + 2 * N * 4 + parts * 2 * C * 4), STEP_VECTOR, "layernorm", launch,
                 "layernorm_backward_params_partial (%s)", name);
    }
    step_row(s, calls, 0, (double)(2 * parts * C), (double)(parts * 2 * C * 4 + 4 * C * X), STEP_VECTOR, "layernorm",
             launch, "layernorm_backward_params_final (%s)", name);
}

// ---------------------------------------------------------------------------------------------
// the shapes of one rank's layer, which the parts below share
typedef struct {
    StepLayout o;
    int tpl;                 // the layer of tensor_parallel.h (StepLayout.tp_layer)
    int64_t tp, sp;          // tensor-parallel ranks, and 1 with -sp (tp > 1)
    int64_t B, T, X, cp, ep, C, NH, E, k;
    int64_t N;               // rows of the matmuls and attention: B T/cp tokens
    int64_t Ns;              // rows of the residual stream, its LayerNorms and residual adds: N, or N/tp with -sp
    int64_t Nm;              // tokens a rank routes to its experts: Ns (with -sp each tp rank routes its own share)
    int64_t R;               // rows of the MLPs' matrices: N, or with experts the slots a rank's experts take,
                             // min(Nm k, cap E) (balanced; cap: a capacity factor's slots an expert takes of
                             // a rank's micro-batch)
    int64_t NHr, att, qkv, fc;  // this rank's heads (NH/tp), widths C/tp, 3C/tp and 4C/tp
    double tile_matmul, forward_matmul;
    int64_t square_matmul, lse, scores, causal;
    int64_t act;             // an activation (N, C) in floatX
    int64_t act_att;         // one of the attention's width, (N, C/tp)
    int64_t kv_block;        // a K,V block of context parallelism's ring, (B, T/cp, 2C/tp)
    double a2a;              // the bytes an all-to-all moves at its busiest rank (balanced: every rank's)
} StepShapes;

static inline StepShapes step_shapes(GPT2Config c, StepLayout o) {
    StepShapes h;
    memset(&h, 0, sizeof(h));
    h.o = o;
    h.tp = o.tp > 1 ? o.tp : 1;
    h.sp = o.sp && h.tp > 1;
    h.tpl = o.tp_layer || h.tp > 1 || o.pp > 1;
    h.B = o.B, h.T = o.T, h.X = o.X, h.cp = o.cp, h.ep = o.ep, h.C = c.channels, h.NH = c.num_heads;
    h.E = gpt2_is_moe(c) ? c.experts : 0, h.k = c.topk;
    int64_t hs = h.C / h.NH;
    h.N = h.B * h.T / h.cp;
    h.Ns = h.N / (h.sp ? h.tp : 1);
    h.Nm = h.Ns;
    h.R = h.N;
    int64_t cap_slots = 0;  // (experts: the slots an expert takes of a rank's micro-batch, at most)
    if (h.E) {
        // balanced routing: each of the E experts gets Nm k / E of a rank's slots; with a capacity
        // factor an expert takes at most cap = ceil(cf Nm k / E) of them (llmc/memory_plan.h's
        // moe_capacity), so a rank's E/ep experts take min(Nm k, cap E) slots from its ep ranks
        int64_t cap = o.capacity_factor > 0.0f ? (int64_t)ceil((double)o.capacity_factor * h.Nm * h.k / h.E * (1.0 - 1e-7))
                                               : h.Nm * h.k;
        h.R = cap * h.E < h.Nm * h.k ? cap * h.E : h.Nm * h.k;
        cap_slots = cap;
    }
    // (experts are whole on their rank: expert tp = 1, their MLP 4C wide)
    h.NHr = h.NH / h.tp, h.att = h.C / h.tp, h.qkv = 3 * h.C / h.tp, h.fc = h.E ? 4 * h.C : 4 * h.C / h.tp;
    // The all-to-all at the routed loads. MaxVio v (moe.h: the busiest expert's load over the mean,
    // less 1) bounds a rank's E/ep experts at (1 + v) times their balanced slots, so the busiest
    // rank of the ep group receives (1 + v) times the balanced share from each of its ep - 1 peers,
    // as long as its experts' capacity holds them (cap slots an expert of a peer's micro-batch,
    // cap E/ep a rank). Every rank's part of the collective waits for that rank's, so the rows
    // carry its bytes: min((1 + v) Nm k, cap E) C X (ep - 1)/ep; v = 0, the balanced R C X (ep - 1)/ep
    double routed = (1.0 + o.maxvio) * (double)(h.Nm * h.k), held = (double)(cap_slots * h.E);
    h.a2a = h.E ? (routed < held ? routed : held) * (double)(h.C * h.X * (h.ep - 1)) / h.ep : 0.0;
    // the attention's FLOPs: one (64 x hs) x (hs x 64) tile product is 2 64 64 hs FLOPs; under
    // context parallelism this rank's share of the causal triangle, 1/cp of it (zigzag); on NH/tp heads
    h.tile_matmul = (double)(h.B * h.NHr * step_flash_tiles(h.T) * 2 * STEP_FLASH_TILE * STEP_FLASH_TILE * hs) / h.cp;
    h.forward_matmul = (double)(h.B * h.NHr) * step_flash_forward_tiles(h.T) * 2 * STEP_FLASH_TILE * STEP_FLASH_TILE * hs / h.cp;
    h.square_matmul = h.B * h.NHr * 2 * h.T * h.T * hs;  // a full T x T x hs product (cuBLAS)
    h.lse = h.B * h.NHr * (h.T / h.cp) * 4;              // flash's log-sum-exp per query, and D: (B, NH, T/cp) fp32
    h.scores = h.B * h.NHr * h.T * h.T;                  // elements of a (B, NH, T, T) score or probability matrix
    h.causal = h.B * h.NHr * h.T * (h.T + 1) / 2;        // of which on or below the diagonal
    h.act = h.N * h.C * h.X;
    h.act_att = h.N * h.att * h.X;
    // context parallelism's ring (train_gpt2_cp.cu): per layer, cp - 1 blocks of K,V (B, T/cp, 2C)
    // sent forward, as many again backward with cp blocks of dK, dV in fp32
    h.kv_block = h.N * 2 * h.att;
    return h;
}

// tensor parallelism's two collectives (tensor_parallel.h), on (N, C) activations in floatX:
// the sum after a row-parallel GEMM (an all-reduce, with -sp a reduce-scatter) and with -sp the
// all-gather before a column-parallel one. gemm: the GEMM that -tp_overlap runs them under (NULL:
// never decomposed, as the embedding's and the head's)
static inline void step_tp_sum(StepRows* s, const StepShapes* h, int64_t calls, const char* gemm, const char* what) {
    if (h->tp == 1) return;
    const char* kind = h->sp ? "reduce-scatter" : "all-reduce";
    step_link(s, calls, "tp", kind, h->tp, (double)(h->N * h->C), (double)h->X, h->o.tp_overlap ? gemm : NULL,
              "tp %s: %s", kind, what);
}
static inline void step_tp_gather(StepRows* s, const StepShapes* h, int64_t calls, const char* gemm, const char* what) {
    if (!h->sp) return;
    step_link(s, calls, "tp", "all-gather", h->tp, (double)(h->N * h->C), (double)h->X, h->o.tp_overlap ? gemm : NULL,
              "tp all-gather: %s", what);
}
// with tp the row-parallel bias, added once after the sum, to this rank's Ns rows
static inline void step_bias_add(StepRows* s, const StepShapes* h, int64_t calls, const char* name) {
    if (h->tp == 1) return;
    step_row(s, calls, 0, (double)(STEP_FLOPS_ADD * h->Ns * h->C), (double)((2 * h->Ns * h->C + h->C) * h->X), STEP_VECTOR,
             "bias", "bias add", "bias_add (%s)", name);
}

// a layer's attention forward on this rank's heads (with cp the ring's K,V blocks first)
static inline void step_attention_forward(StepRows* s, const StepShapes* h, int64_t calls) {
    int64_t X = h->X, act = h->act_att, cp = h->cp;
    if (cp > 1 && h->o.cp_allgather) {  // (every rank's block at once, before any is computed)
        step_link(s, calls, "cp", "all-gather", cp, (double)(cp * h->kv_block), (double)X, NULL,
                  "all-gather: every rank's K,V block");
    } else if (cp > 1) {  // (each block posted on before the one in hand is computed: under it)
        step_link(s, calls, "cp", "send", cp, (double)((cp - 1) * h->kv_block * X), 1, "attention forward",
                  "ring: K,V blocks to the next rank (%lld steps)", (long long)(cp - 1));
    }
    if (h->o.flash) {
        // flash_attention_forward_kernel: s = q k^T and o += p v per tile, 2 tile products; reads
        // qkv once, writes out and lse; the T x T scores never leave the chip
        step_row(s, calls, 0, 2 * h->forward_matmul, (double)(4 * act + h->lse), STEP_ATTN, "attention",
                 "attention forward", "flash_attention_forward");
    } else {
        // q, k, v rearranged into heads, two batched GEMMs around a softmax over the (T, T)
        // scores in memory, the result rearranged back
        const char* fwd = "attention forward";
        step_row(s, 3 * calls, 0, 0, (double)(2 * act), STEP_VECTOR, "attention", fwd, "attention_to_heads (q, k, v)");
        step_row(s, calls, 0, (double)h->square_matmul, (double)(2 * act + h->scores * X), STEP_GEMM, "attention", fwd,
                 "gemm_batched scores = q k^T");
        step_row(s, calls, 0, (double)(STEP_FLOPS_SOFTMAX * h->causal), (double)(h->causal * X + h->scores * X),
                 STEP_VECTOR, "attention", fwd, "attention_softmax");
        if (h->o.megatron) {  // (Megatron's attention dropout: the probabilities read, written, and a 1-byte mask)
            step_row(s, calls, 0, 0, (double)(h->scores * (2 * X + 1)), STEP_VECTOR, "attention", NULL,
                     "dropout on the probabilities (Megatron-LM)");
        }
        step_row(s, calls, 0, (double)h->square_matmul, (double)(h->scores * X + 2 * act), STEP_GEMM, "attention", fwd,
                 "gemm_batched y = att v");
        step_row(s, calls, 0, 0, (double)(2 * act), STEP_VECTOR, "attention", fwd, "attention_from_heads (y)");
    }
}

// GELU as a kernel of its own: fch (rows, 4C/tp) in, its GELU out
static inline void step_gelu_forward(StepRows* s, const StepShapes* h, int64_t rows, int64_t calls) {
    step_row(s, calls, 0, (double)(STEP_FLOPS_GELU * rows * h->fc), (double)(2 * rows * h->fc * h->X), STEP_VECTOR, "gelu",
             "gelu forward", "gelu_forward");
}

// Megatron-LM's dropout on a residual branch (its fused bias-dropout-add): the branch's Ns x C
// read and written once more, and a 1-byte mask written; its backward reads the gradient and the
// mask and writes the gradient (a dense layer's two branches; -megatron 1 only)
static inline void step_residual_dropout(StepRows* s, const StepShapes* h, int64_t calls, const char* branch) {
    if (h->o.megatron) {
        step_row(s, calls, 0, 0, (double)(h->Ns * h->C * (2 * h->X + 1)), STEP_VECTOR, "dropout", NULL,
                 "dropout on %s's output (Megatron-LM)", branch);
    }
}

static inline void step_residual_dropout_backward(StepRows* s, const StepShapes* h, int64_t calls, const char* branch) {
    if (h->o.megatron) {
        step_row(s, calls, 0, 0, (double)(h->Ns * h->C * (2 * h->X + 1)), STEP_VECTOR, "dropout", NULL,
                 "dropout backward on %s's output (Megatron-LM)", branch);
    }
}

// A dense layer's forward from its ln1 to fcproj's sum (the caller adds it to the residual
// stream with the next LayerNorm). rerun (-r 2): again before the layer's backward, as far as the
// backward reads (block.h): fcproj and its sum are not repeated. gelu_epilogue: GELU in the fc
// GEMM's epilogue (block.h's layer, when its output is kept). With experts (block.h's layer
// alone) the router, the exchanges and the experts' MLPs
static inline void step_layer_forward(StepRows* s, const StepShapes* h, int64_t calls, int rerun, int gelu_epilogue) {
    int64_t X = h->X, N = h->N, Ns = h->Ns, Nm = h->Nm, C = h->C, R = h->R, E = h->E, ep = h->ep;
    const char* qkv = "matmul qkv (+bias epilogue)";
    const char* attproj = h->tp > 1 ? "matmul attproj (bias after the sum)" : "matmul attproj (+bias epilogue)";
    const char* fcproj = h->tp > 1 ? "matmul fcproj (bias after the sum)" : "matmul fcproj (+bias epilogue)";
    step_tp_gather(s, h, calls, qkv, "ln1 before qkv");
    step_matmul(s, X, qkv, N, C, h->qkv, calls, 1, 0, 0, NULL);
    step_attention_forward(s, h, calls);
    step_matmul(s, X, attproj, N, h->att, C, calls, h->tp == 1, 0, 0, NULL);
    step_tp_sum(s, h, calls, attproj, "attproj");
    step_bias_add(s, h, calls, "attprojb");
    step_residual_dropout(s, h, calls, "attproj");
    step_layernorm_forward(s, X, Ns, C, "residual + layernorm (ln2)", calls, 1);
    if (E) {  // the router, the tokens to their experts (llmc/moe.h: row moves read and write C each)
        step_matmul(s, X, "matmul router, s = ln2 Wr^T", Nm, C, E, calls, 0, 0, 0, NULL);
        step_row(s, calls, 0, 0, (double)((Nm + R) * C * X + R * 4), STEP_VECTOR, "moe", "moe: dispatch",
                 "moe dispatch (kept slots into send order)");
        if (ep > 1) step_link(s, calls, "ep", "all-to-all", ep, h->a2a, 1, NULL, "all-to-all: the tokens to their experts' ranks");
        step_row(s, calls, 0, 0, (double)(2 * R * C * X + R * 4), STEP_VECTOR, "moe", "moe: gather rows",
                 "moe gather rows (into expert order)");
    }
    if (!E) step_tp_gather(s, h, calls, "matmul fc (+bias epilogue)", "ln2 before fc");  // (the experts route the rank's own tokens)
    if (gelu_epilogue) {  // GELU_AUX_BIAS writes GELU's input (aux) and its output
        step_matmul(s, X, "matmul fc (+bias, GELU epilogue)", R, C, h->fc, calls, 1, 0, 1, NULL);
    } else {
        step_matmul(s, X, "matmul fc (+bias epilogue)", R, C, h->fc, calls, 1, 0, 0, NULL);
        step_gelu_forward(s, h, R, calls);
    }
    if (rerun) return;
    step_matmul(s, X, E ? "matmul fcproj (+bias epilogue)" : fcproj, R, h->fc, C, calls, h->tp == 1 || E, 0, 0, NULL);
    if (!E) {
        step_tp_sum(s, h, calls, fcproj, "fcproj");
        step_bias_add(s, h, calls, "fcprojb");
        step_residual_dropout(s, h, calls, "fcproj");
    } else {  // the outputs home, and each token's gate-weighted sum
        step_row(s, calls, 0, 0, (double)(2 * R * C * X + R * 4), STEP_VECTOR, "moe", "moe: gather rows",
                 "moe gather rows (back to source order)");
        if (ep > 1) step_link(s, calls, "ep", "all-to-all", ep, h->a2a, 1, NULL, "all-to-all: the outputs back");
        step_row(s, calls, 0, (double)(STEP_FLOPS_ADD * R * C), (double)((R + Nm) * C * X + R * 8), STEP_VECTOR, "moe",
                 "moe: combine", "moe combine (gate-weighted sum)");
    }
}

// -r 1 and 2 (block.h, model.h's activations_kept): before each layer's backward, what its
// forward did not keep. -r 2 keeps only the layer's output (residual3): the layer's forward again
// from its input, ln1 on, with its collectives, up to GELU. -r 1 drops GELU's output (unless zero
// bubble's W needs it later) and with cuBLAS attention the (B, NH, T, T) probabilities (flash's
// lse is kept, and context parallelism always runs flash): GELU again, and that attention again
static inline void step_recompute(StepRows* s, const StepShapes* h, int64_t calls) {
    const StepLayout* o = &h->o;
    if (o->recompute == 2) {  // (Megatron-LM's checkpointed layer: its whole forward, fcproj and its sum too)
        step_layernorm_forward(s, h->X, h->Ns, h->C, "layernorm_forward (ln1, rerun)", calls, 0);
        step_layer_forward(s, h, calls, !o->megatron, 0);
    } else if (o->recompute == 1) {
        if (!o->weights_later) step_gelu_forward(s, h, h->R, calls);
        if (!o->flash && h->cp == 1) step_attention_forward(s, h, calls);
    }
}

// a layer's attention backward on this rank's heads, from datty to dqkv (with cp the ring's K,V
// again and dK, dV home)
static inline void step_attention_backward(StepRows* s, const StepShapes* h, int64_t calls) {
    int64_t X = h->X, act = h->act_att, cp = h->cp, lse = h->lse;
    if (cp > 1 && h->o.cp_allgather) {  // (the keys and values again; their gradients summed to their owners)
        step_link(s, calls, "cp", "all-gather", cp, (double)(cp * h->kv_block), (double)X, NULL,
                  "all-gather: every rank's K,V block again");
        step_link(s, calls, "cp", "reduce-scatter", cp, (double)(cp * h->kv_block), 4, NULL,
                  "reduce-scatter: dK,dV (fp32) to their owners");
    } else if (cp > 1) {
        // the blocks travel under the compute as forward; a block's dK,dV leaves only once this
        // rank's queries have added their part: that exchange waits for the compute
        step_link(s, calls, "cp", "send", cp, (double)((cp - 1) * h->kv_block * X), 1, "attention backward",
                  "ring: K,V again to the next rank");
        step_link(s, calls, "cp", "send", cp, (double)(cp * h->kv_block * 4), 1, NULL, "ring: dK,dV (fp32) to the next rank");
    }
    const char* bwd = "attention backward";
    if (h->o.flash) {
        // D = rowsum(dO * O); then dK, dV (a block owns 64 keys and walks the queries: s^T = k q^T,
        // dv += p^T dO, dp^T = v dO^T, dk += ds^T q: 4 tile products) and dQ (a block owns 64
        // queries: s = q k^T, dp = dO v^T, dq += ds k: 3). Both recompute p from q, k and lse, and
        // both compute dp: 7 tile products against FlashAttention-2's 5, the price of one writer
        // per output
        step_row(s, calls, 0, (double)(STEP_FLOPS_DOT * h->N * h->att), (double)(2 * act + lse), STEP_VECTOR, "attention",
                 bwd, "attention_row_dot (D)");
        step_row(s, calls, 0, 4 * h->tile_matmul, (double)(6 * act + 2 * lse), STEP_ATTN, "attention", bwd,
                 "flash_attention_backward_dkdv");
        step_row(s, calls, 0, 3 * h->tile_matmul, (double)(5 * act + 2 * lse), STEP_ATTN, "attention", bwd,
                 "flash_attention_backward_dq");
    } else {
        // q, k, v and dy into heads, four batched GEMMs (each a full square) around the softmax's
        // backward, dq, dk, dv back
        int64_t scores = h->scores, causal = h->causal, square = h->square_matmul;
        step_row(s, 4 * calls, 0, 0, (double)(2 * act), STEP_VECTOR, "attention", bwd, "attention_to_heads (q, k, v, dy)");
        step_row(s, calls, 0, (double)square, (double)(2 * act + scores * X), STEP_GEMM, "attention", bwd,
                 "gemm_batched datt = dy v^T");
        step_row(s, calls, 0, (double)square, (double)(scores * X + 2 * act), STEP_GEMM, "attention", bwd,
                 "gemm_batched dv = att^T dy");
        if (h->o.megatron) {  // (the gradient through the dropout: read it and the mask, write it)
            step_row(s, calls, 0, 0, (double)(scores * (2 * X + 1)), STEP_VECTOR, "attention", NULL,
                     "dropout backward on the probabilities (Megatron-LM)");
        }
        step_row(s, calls, 0, (double)(STEP_FLOPS_SOFTMAX_BACKWARD * causal), (double)(2 * causal * X + scores * X),
                 STEP_VECTOR, "attention", bwd, "attention_softmax_backward");
        step_row(s, calls, 0, (double)square, (double)(scores * X + 2 * act), STEP_GEMM, "attention", bwd,
                 "gemm_batched dq = ds k");
        step_row(s, calls, 0, (double)square, (double)(scores * X + 2 * act), STEP_GEMM, "attention", bwd,
                 "gemm_batched dk = ds^T q");
        step_row(s, 3 * calls, 0, 0, (double)(2 * act), STEP_VECTOR, "attention", bwd, "attention_from_heads (dq, dk, dv)");
    }
}

// the weight-gradient rows (zero bubble's W) of one half, between rows of B
#define STEP_WEIGHT_PASS(s, body) do { (s)->phase = STEP_PHASE_BACKWARD_WEIGHT; body; (s)->phase = STEP_PHASE_BACKWARD_INPUT; } while (0)

// A layer's backward, from the gradient at its output to the gradient at its input (block.h's
// halves, or tensor_parallel.h's with f and g): the MLP half, then the attention half, each its
// input pass (B) and its weight pass (W)
static inline void step_layer_backward(StepRows* s, const StepShapes* h, int64_t calls) {
    const StepLayout o = h->o;
    int64_t X = h->X, N = h->N, Ns = h->Ns, Nm = h->Nm, C = h->C, R = h->R, E = h->E, ep = h->ep;
    // the MLP half (block.h): the input pass, then the weight pass (MoE: the gates' gradients and
    // the output gradients to the experts first, the input gradients home after, then the router's)
    if (E) {
        step_row(s, calls, 0, (double)(2 * R * C), (double)((2 * Nm + 2 * R) * C * X + R * 12), STEP_VECTOR, "moe",
                 "moe: dispatch", "moe gate gradients, dispatch (gate-weighted)");
        if (ep > 1) step_link(s, calls, "ep", "all-to-all", ep, h->a2a, 1, NULL, "all-to-all: the output gradients to the experts");
        step_row(s, calls, 0, 0, (double)(2 * R * C * X + R * 4), STEP_VECTOR, "moe", "moe: gather rows",
                 "moe gather rows (into expert order)");
    }
    if (!E) step_residual_dropout_backward(s, h, calls, "fcproj");
    if (!E) step_tp_gather(s, h, calls, "matmul fcproj dinp", "dresidual before fcproj's dinp");
    if (o.gelu_epilogue && (!h->tpl || E)) {  // (moe.h's experts: block.h's GEMMs)  // DGELU reads GELU's input (aux) and multiplies the product by GELU'
        step_matmul_dinp(s, X, "matmul fcproj dinp (DGELU epilogue)", R, C, h->fc, calls, 1);
    } else {
        step_matmul_dinp(s, X, "matmul fcproj dinp", R, C, h->fc, calls, 0);
        step_row(s, calls, 0, (double)(STEP_FLOPS_GELU_BACKWARD * R * h->fc), (double)(3 * R * h->fc * X), STEP_VECTOR,
                 "gelu", "gelu backward", "gelu_backward");
    }
    step_matmul_dinp(s, X, "matmul fc dinp", R, h->fc, C, calls, 0);
    if (!E) step_tp_sum(s, h, calls, "matmul fc dinp", "dln2");
    if (E) {
        // (the experts' weight gradients stay in B even under zero bubble: they need the
        // all-to-all's rows, which B has in hand; chunk.h's moe_layer_backward)
        step_matmul(s, X, "matmul expert fcproj dweight", R, 4 * C, C, calls, o.bias_epilogue, 1, 0, NULL);
        step_matmul(s, X, "matmul expert fc dweight", R, C, 4 * C, calls, o.bias_epilogue, 1, 0, NULL);
        step_row(s, calls, 0, 0, (double)(2 * R * C * X + R * 4), STEP_VECTOR, "moe", "moe: gather rows",
                 "moe gather rows (back to source order)");
        if (ep > 1) step_link(s, calls, "ep", "all-to-all", ep, h->a2a, 1, NULL, "all-to-all: the input gradients back");
        step_row(s, calls, 0, (double)(STEP_FLOPS_ADD * R * C), (double)((R + Nm) * C * X + R * 4), STEP_VECTOR, "moe",
                 "moe: combine", "moe combine (sum of the input gradients)");
        step_matmul(s, X, "matmul router dweight", Nm, C, E, calls, 0, 1, 0, NULL);
        step_matmul_dinp(s, X, "matmul router dinp", Nm, E, C, calls, 0);
    } else {
        STEP_WEIGHT_PASS(s, {
            step_weight_gradient(s, o, N, "fcproj", h->fc, C, calls);
            step_weight_gradient(s, o, N, "fc", C, h->fc, calls);
        });
    }
    step_layernorm_backward(s, o, Ns, C, "ln2", calls);
    // the attention half
    step_residual_dropout_backward(s, h, calls, "attproj");
    step_tp_gather(s, h, calls, "matmul attproj dinp", "dresidual before attproj's dinp");
    step_matmul_dinp(s, X, "matmul attproj dinp", N, h->att, C, calls, 0);
    step_attention_backward(s, h, calls);
    step_matmul_dinp(s, X, "matmul qkv dinp", N, h->qkv, C, calls, 0);
    step_tp_sum(s, h, calls, "matmul qkv dinp", "dln1");
    STEP_WEIGHT_PASS(s, {
        step_weight_gradient(s, o, N, "attproj", h->att, C, calls);
        step_weight_gradient(s, o, N, "qkv", C, h->qkv, calls);
    });
    step_layernorm_backward(s, o, Ns, C, "ln1", calls);
}

// the parameters of a dense model's tp rank of a pipeline stage (model.h's parameter_layout_grid):
// its Ls layers of the per-layer tensors, the split ones (qkv, attproj's and fc's weights and
// qkv's and fc's biases) 1/tp each; the first stage's wte (Vp/tp rows) and wpe, the last's lnf and
// its own copy of the tied wte (in a V, v_shape, the first stage holds lnf and the head: its one wte)
// With experts (the grid's 5D) a layer's MLP is its E/ep experts, each whole, and a router (E, C)
// replicated over tp
static inline int64_t step_stage_parameters(GPT2Config c, int tp, int pp, int stage, int ep, int v_shape) {
    int64_t C = c.channels, Ls = c.num_layers / pp, wte = (int64_t)c.padded_vocab_size / tp * C;
    int64_t mlp = (4 * C * C + 4 * C) / tp + 4 * C * C / tp + C;
    if (gpt2_is_moe(c)) mlp = (int64_t)c.experts * C + c.experts / ep * step_mlp_parameters(C);
    int64_t layer = 2 * C + (3 * C * C + 3 * C) / tp + C * C / tp + C + 2 * C + mlp;
    int64_t P = Ls * layer;
    if (stage == 0) P += wte + (int64_t)c.max_seq_len * C;
    if (stage == (v_shape ? 0 : pp - 1)) P += 2 * C + (pp > 1 && !v_shape ? wte : 0);
    return P;
}

// ZeRO's padding (model.h): train_gpt2_dp pads each bucket (the embeddings, each layer, the final
// LayerNorm) to a multiple of the dp ranks x 128 elements; train_gpt2_3d pads its whole buffer to
// a multiple of dp cp x 128
static inline int64_t step_round_up(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }
static inline int64_t step_zero_buckets(GPT2Config c, int64_t ranks, int64_t* embedding, int64_t* layer, int64_t* lnf) {
    int64_t C = c.channels, pad = ranks * 128;
    *embedding = step_round_up(((int64_t)c.padded_vocab_size + c.max_seq_len) * C, pad);
    *layer = step_round_up(12 * C * C + 13 * C, pad);
    *lnf = step_round_up(2 * C, pad);
    return *embedding + c.num_layers * *layer + *lnf;
}

// ---------------------------------------------------------------------------------------------
// the step, kernel by kernel, in the order the trainer launches it. Fills rows[0..capacity)
// and returns the number of rows the step has (more than capacity: the rest were not written).
// The model c: its experts and topk make it train_gpt2_ep's (o.ep of o.dp ranks hold the experts).
// With tp > 1, pp > 1 or tp_layer, the rank of train_gpt2_tp, _pp or _3d (stage o.stage of o.pp,
// o.V chunks of L/(pp V) layers each, o.micro_batches of them a step); with zero, train_gpt2_dp's
// ZeRO (train_gpt2_3d's -z 1 where tp_layer)
static inline int step_kernels(StepKernel* rows, int capacity, GPT2Config c, StepLayout o) {
    // (every field named: the trainers include this header in C++, which warns of any left out)
    StepRows s = {.rows = rows, .capacity = capacity, .count = 0, .group = NULL, .repeat = 1,
                  .phase = STEP_PHASE_STEP, .chunks = 0};
    int micro_batches = o.micro_batches > 1 ? o.micro_batches : 1;
    StepShapes h = step_shapes(c, o);
    int64_t L = c.num_layers, C = c.channels, V = c.vocab_size, Vp = c.padded_vocab_size;
    int64_t T = o.T, cp = o.cp, ep = o.ep, X = o.X, N = h.N, Ns = h.Ns, tp = h.tp, E = h.E;
    int64_t pp = o.pp > 1 ? o.pp : 1, chunks = o.V > 1 ? o.V : 1, stage = pp > 1 ? o.stage : 0;
    // (in a V the head is on stage 0, and stage pp - 1's chunk 0 hands its output to its chunk 1,
    // and chunk 1 its gradient to chunk 0, without a message)
    int v_shape = pp > 1 && o.v_shape, first = stage == 0, last = stage == (v_shape ? 0 : pp - 1);
    int bottom = v_shape && stage == pp - 1;
    int64_t Ls = L / pp;                          // the stage's layers, Ls / V a chunk
    int64_t Vr = Vp / tp;                         // the vocabulary-parallel LM head's rows of wte on this rank
    uint32_t every_chunk = (uint32_t)((1ull << chunks) - 1), first_chunk = 1u, last_chunk = 1u << (chunks - 1);
    // the parameters this rank holds: the model's (llmc/gpt2.h), of whose E experts a layer it
    // holds E/ep; a stage's tp slice of it (step_stage_parameters)
    int64_t P = h.tpl ? step_stage_parameters(c, (int)tp, (int)pp, (int)stage, o.ep, v_shape) : step_rank_parameters(c, o.ep);
    int64_t dp_ranks = (int64_t)o.dp * cp;        // the ranks the gradients are reduced over (DiLoCo: a worker's)
    int zero = dp_ranks > 1 ? o.zero : 0;
    // with experts: the experts' gradients reduced apart, over the copies of them (edp): train_gpt2_ep's
    // dp/ep, the grid's dp cp tp / ep (the fold: ep of a stage's ranks hold them all)
    int64_t held_experts = E ? Ls * (E / ep) * step_mlp_parameters(C) : 0, copies = (int64_t)o.dp * cp * tp / ep;
    int64_t zero_emb = 0, zero_layer = 0, zero_lnf = 0;
    if (zero && !h.tpl) P = step_zero_buckets(c, dp_ranks, &zero_emb, &zero_layer, &zero_lnf);
    if (zero && h.tpl) {  // the dense region padded to dp cp x 128, the experts' to edp x 128
        int64_t experts = copies > 1 ? step_round_up(held_experts, copies * 128) : held_experts;
        P = step_round_up(P - held_experts, dp_ranks * 128) + experts, held_experts = experts;
    }
    // what the optimizer updates: ZeRO's shard (the grid's experts: their shard over edp)
    int64_t S = zero ? (P - held_experts) / dp_ranks + (E && copies > 1 ? held_experts / copies : held_experts) : P;
    int64_t distinct = N < V ? N : V;             // rows of wte a batch touches: at most one per distinct token
    if (tp > 1) distinct = N < Vr ? N : Vr;       // (tp: of this rank's vocabulary)
    int gelu_kept = o.recompute == 0 || o.weights_later;  // GELU's output kept for the backward (model.h)
    const char* overlap = o.overlap ? "layer backward" : NULL;  // -overlap: the buckets' collectives under the backward

    s.group = "step start", s.phase = STEP_PHASE_STEP, s.chunks = 0;
    // device_memset_zero(grads): -z 2 and 3 keep a shard of each bucket's gradient
    step_row(&s, 1, 0, 0, (double)((zero >= 2 ? S : P) * X), STEP_MEMSET, "memset", "memset", "memset grads");

    // (from here to the backward's end, once a micro-batch)
    s.group = "embedding", s.repeat = micro_batches, s.phase = STEP_PHASE_FORWARD, s.chunks = first_chunk;
    if (zero == 3) {  // -z 3: the embeddings' bucket gathered, then layer 0's
        step_link(&s, 1, "dp", "all-gather", dp_ranks, (double)zero_emb, (double)X, o.overlap ? "layer forward" : NULL,
                  "-z 3: all-gather the embeddings' parameters");
    }
    if (first) {
        // one thread per output element: the token's row of wte (distinct rows read once) plus wpe
        // (with tp each rank looks up its vocabulary's rows; the sum over tp makes the embedding)
        step_row(&s, 1, 0, (double)(STEP_FLOPS_ADD * N * C), (double)(N * 4 + distinct * C * X + (T / cp) * C * X + h.act),
                 STEP_VECTOR, "embedding", "encoder forward", "encoder_forward");
        step_tp_sum(&s, &h, 1, NULL, "the embedding's partial rows");
    }
    if (!h.tpl || (pp == 1 && chunks == 1)) {
        step_layernorm_forward(&s, X, Ns, C, "layernorm_forward (ln1 of layer 0)", 1, 0);
    } else {  // (chunk.h: every chunk starts with its own LayerNorm)
        s.group = "layer forward", s.chunks = every_chunk;
        step_layernorm_forward(&s, X, Ns, C, "layernorm_forward (ln1 of a chunk's first layer)", chunks, 0);
    }

    s.group = "layer forward", s.chunks = every_chunk;
    if (zero == 3) {
        step_link(&s, Ls, "dp", "all-gather", dp_ranks, (double)zero_layer, (double)X, o.overlap ? "layer forward" : NULL,
                  "-z 3: all-gather a layer's parameters");
    }
    step_layer_forward(&s, &h, Ls, 0, o.gelu_epilogue && !h.tpl && gelu_kept);
    step_layernorm_forward(&s, X, Ns, C, "residual + layernorm (ln1 of the next layer)", Ls - chunks, 1);
    if (h.tpl) {  // a chunk that ends at a stage boundary: the plain residual add, whose output is sent on
        int64_t ends = chunks - (last ? 1 : 0);
        s.chunks = last ? every_chunk & ~last_chunk : every_chunk;
        step_row(&s, ends, 0, (double)(STEP_FLOPS_ADD * Ns * C), (double)(3 * Ns * C * X), STEP_VECTOR, "residual",
                 "residual forward", "residual_forward (the chunk's output)");
        if (pp > 1) {  // the pipeline's sends: each chunk's output on to the next stage, but the model's last
            s.group = "pipeline", s.chunks &= bottom ? ~first_chunk : every_chunk;  // (the V's bottom: chunk 0's is a copy)
            step_link(&s, ends - bottom, "pp", "send", 2, (double)(Ns * C), (double)X, NULL, "pp send: activations to the next stage");
        }
    }

    if (last) {
        s.group = "final layernorm", s.chunks = last_chunk;
        if (zero == 3) {
            step_link(&s, 1, "dp", "all-gather", dp_ranks, (double)zero_lnf, (double)X, o.overlap ? "layer forward" : NULL,
                      "-z 3: all-gather the final LayerNorm's parameters");
        }
        step_layernorm_forward(&s, X, Ns, C, "residual + layernorm (lnf)", 1, 1);

        s.group = "classifier";
        if (zero == 3) {  // the embeddings again, for the LM head (kept for its backward)
            step_link(&s, 1, "dp", "all-gather", dp_ranks, (double)zero_emb, (double)X, NULL,
                      "-z 3: all-gather the embeddings' parameters (LM head)");
        }
        step_tp_gather(&s, &h, 1, NULL, "lnf before the LM head");
        step_matmul(&s, X, "matmul LM head, logits = lnf wte^T", N, C, Vr, 1, 0, 0, 0, NULL);
        if (tp == 1) {
            // one block per row: an online softmax over the row, then dlogits written over the logits
            step_row(&s, 1, 0, (double)(STEP_FLOPS_CLASSIFIER * N * V), (double)(2 * N * Vp * X + 2 * N * 4), STEP_VECTOR,
                     "classifier", "classifier (softmax, loss, dlogits)", "fused_classifier (softmax, loss, dlogits)");
        } else {
            // the vocabulary-parallel loss (tensor_parallel.h): each row's maximum over this rank's
            // Vp/tp logits, all-reduced (MAX, fp32); its sum of exponentials and its target's logit,
            // all-reduced (SUM, 2 fp32); then the loss and dlogits over the logits, locally
            const char* vp = "vocab-parallel classifier: ";
            step_row(&s, 1, 0, (double)(N * Vr), (double)(N * Vr * X + N * 4), STEP_VECTOR, "classifier",
                     "vocab-parallel classifier: row maxima", "%srow maxima", vp);
            step_link(&s, 1, "tp", "all-reduce", tp, (double)N, 4, NULL, "tp all-reduce: the rows' maxima (fp32)");
            step_row(&s, 1, 0, (double)(3 * N * Vr), (double)(N * Vr * X + 3 * N * 4 + N * 4), STEP_VECTOR, "classifier",
                     "vocab-parallel classifier: row sums", "%srow sums", vp);
            step_link(&s, 1, "tp", "all-reduce", tp, (double)(2 * N), 4, NULL, "tp all-reduce: the rows' sums (fp32)");
            step_row(&s, 1, 0, (double)(STEP_FLOPS_CLASSIFIER * N * Vr), (double)(2 * N * Vr * X + 5 * N * 4), STEP_VECTOR,
                     "classifier", "vocab-parallel classifier: loss, dlogits", "%sloss, dlogits", vp);
        }
        s.phase = STEP_PHASE_BACKWARD_INPUT;
        step_matmul_dinp(&s, X, "matmul LM head dinp = dlogits wte", N, Vr, C, 1, 0);
        STEP_WEIGHT_PASS(&s, step_matmul(&s, X, "matmul LM head dwte += dlogits^T lnf", N, C, Vr, 1, 0, 1, 0, NULL));
        step_tp_sum(&s, &h, 1, NULL, "dlnf");

        s.group = "final layernorm backward";
        step_row(&s, 1, 0, 0, (double)(Ns * C * X), STEP_MEMSET, "memset", "memset", "memset dresidual");
        step_layernorm_backward(&s, o, Ns, C, "lnf", 1);
        if (zero >= 2) {
            if (zero == 3) {
                step_link(&s, 1, "dp", "all-gather", dp_ranks, (double)zero_lnf, (double)X, overlap,
                          "-z 3: all-gather the final LayerNorm's parameters");
            }
            step_link(&s, 1, "dp", "reduce-scatter", dp_ranks, (double)zero_lnf, (double)X, overlap,
                      "-z %d: reduce-scatter the final LayerNorm's gradients", zero);
        }
    }

    s.group = "layer backward", s.phase = STEP_PHASE_BACKWARD_INPUT, s.chunks = every_chunk;
    if (pp > 1) {  // the gradient at each chunk's input back to the stage before, but the model's first
        s.group = "pipeline", s.chunks = (first ? every_chunk & ~first_chunk : every_chunk) & (bottom ? ~last_chunk : every_chunk);
        step_link(&s, chunks - (first ? 1 : 0) - bottom, "pp", "send", 2, (double)(Ns * C), (double)X, NULL,
                  "pp send: gradients to the stage before");
        s.group = "layer backward", s.chunks = every_chunk;
    }
    if (o.recompute) {
        s.group = "layer recompute";
        step_recompute(&s, &h, Ls);
        s.group = "layer backward";
    }
    if (zero == 3) {
        step_link(&s, Ls, "dp", "all-gather", dp_ranks, (double)zero_layer, (double)X, overlap,
                  "-z 3: all-gather a layer's parameters");
    }
    step_layer_backward(&s, &h, Ls);
    if (zero >= 2) {  // each layer's bucket reduce-scattered as soon as its gradient is complete
        step_link(&s, Ls, "dp", "reduce-scatter", dp_ranks, (double)zero_layer, (double)X, overlap,
                  "-z %d: reduce-scatter a layer's gradients", zero);
    }

    if (first) {
        s.group = "encoder backward", s.chunks = first_chunk;
        step_tp_gather(&s, &h, 1, NULL, "dresidual before the embedding's backward");
        // dwte: one block per distinct token sums its rows of dout (positions sorted on the host
        // first), then adds into that token's row of dwte (read and written)
        step_row(&s, 1, 0, (double)(STEP_FLOPS_ADD * N * C),
                 (double)(h.act + (N + 2 * distinct + 1) * 4 + 2 * distinct * C * X), STEP_VECTOR, "embedding",
                 "encoder backward", "encoder_backward_wte");
        step_row(&s, 1, 0, (double)(STEP_FLOPS_ADD * N * C), (double)(h.act + 2 * (T / cp) * C * X), STEP_VECTOR,
                 "embedding", "encoder backward", "encoder_backward_wpe");
        if (zero >= 2) {
            step_link(&s, 1, "dp", "reduce-scatter", dp_ranks, (double)zero_emb, (double)X, overlap,
                      "-z %d: reduce-scatter the embeddings' gradients", zero);
        }
    }

    // (once a step, after the last micro-batch)
    s.repeat = 1, s.phase = STEP_PHASE_STEP, s.chunks = 0;
    if (h.sp) {  // each rank's LayerNorm weights (and routers) saw its tokens only: their gradients summed over tp
        s.group = "tp LayerNorm gradients";
        step_link(&s, 1, "tp", "all-reduce", tp, (double)((4 * Ls + 2 * last) * C + (E ? Ls * E * C : 0)), (double)X, NULL,
                  "tp all-reduce: the LayerNorms' gradients (-sp)");
    }
    if (pp > 1 && !v_shape && (first || last)) {  // the tied wte: the first stage's copy and the last's, one gradient
                                                  // (in a V one stage holds both ends and the only wte)
        s.group = "embedding all-reduce";
        step_link(&s, 1, "embedding", "all-reduce", 2, (double)(Vr * C), (double)X, NULL,
                  "all-reduce wte's gradient (first and last stage)");
    }
    if (dp_ranks > 1 && zero == 0) {
        s.group = "gradient all-reduce";
        // NCCL's ring all-reduce sends and receives 2 (n - 1)/n of the payload on each GPU's link
        // (train_gpt2_cp: a SUM over the cp ranks; with experts the dense tensors, the experts below)
        step_link(&s, 1, "dp", "all-reduce", dp_ranks, (double)(P - held_experts), (double)X, overlap,
                  "all-reduce grads (NCCL ring, %lld ranks)", (long long)dp_ranks);
    }
    if (zero == 0 && E && copies > 1) {
        s.group = "gradient all-reduce";
        step_link(&s, 1, "edp", "all-reduce", copies, (double)held_experts, (double)X, overlap,
                  "all-reduce expert grads (NCCL ring, %lld copies)", (long long)copies);
    }
    if (zero == 1) {  // ZeRO-1: the whole gradient reduce-scattered once, each rank its shard's sum
        s.group = "gradient reduce-scatter";
        step_link(&s, 1, "dp", "reduce-scatter", dp_ranks, (double)(P - held_experts), (double)X, h.tpl ? NULL : overlap,
                  "-z 1: reduce-scatter grads (%lld ranks)", (long long)dp_ranks);
        if (E && copies > 1) {
            step_link(&s, 1, "edp", "reduce-scatter", copies, (double)held_experts, (double)X, NULL,
                      "-z 1: reduce-scatter expert grads (%lld copies)", (long long)copies);
        }
    }

    s.group = "global norm";
    step_row(&s, 1, 0, (double)(STEP_FLOPS_DOT * S), (double)(S * X + NORM_BLOCKS * 4), STEP_VECTOR, "optimizer",
             "gradient norm", "norm_squared_partial");
    // adamw_runs_kernel over every tensor's pieces (one per layer for the layers' tensors:
    // optimizer.h), up to ADAMW_RUNS_PER_LAUNCH of them a launch. Per parameter: the gradient read
    // (X), the fp32 master weight (bf16) or the parameter itself (fp32) read and written, m and v
    // read and written (fp32), the parameter written (X): 28 bytes either way
    int64_t per_param = X == 2 ? 2 + 8 + 8 + 8 + 2 : 4 + 8 + 8 + 8;
    int64_t pieces = (first ? 2 : 0) + 12 * Ls + (last ? 2 + (pp > 1 ? 1 : 0) : 0);
    s.group = "AdamW";
    if (o.offload) {
        // -offload (ZeRO-Offload): the shard's gradients to the host, X each over PCIe, a bucket's
        // as soon as it is final (under the last micro-batch's backward, with -overlap); AdamW on
        // the host's cores, its master weights, m and v in host memory; each bucket's parameters
        // back, copied while the host updates the next bucket
        step_link(&s, 1, "pcie", "copy", 1, (double)S, (double)X, overlap, "PCIe: gradients to the host");
        step_link(&s, 1, "pcie", "copy", 1, (double)S, (double)X, "AdamW", "PCIe: parameters back");
        step_row(&s, 1, 1, (double)(STEP_FLOPS_ADAMW * S), (double)(per_param * S), STEP_HOST, "optimizer",
                 "adamw on the host (-offload)", "adamw on the host (%lld tensors' pieces)", (long long)pieces);
    } else {
        step_row(&s, 1, step_ceil_div(pieces, STEP_ADAMW_RUNS_PER_LAUNCH), (double)(STEP_FLOPS_ADAMW * S),
                 (double)(per_param * S), STEP_VECTOR, "optimizer", "adamw", "adamw_runs_kernel (%lld tensors' pieces)",
                 (long long)pieces);
    }
    if (zero == 1 || zero == 2) {  // the updated shards all-gathered (-overlap: each bucket under the next one's update)
        s.group = "parameter all-gather";
        step_link(&s, 1, "dp", "all-gather", dp_ranks, (double)(P - held_experts), (double)X,
                  o.overlap && !h.tpl ? "AdamW" : NULL, "-z %d: all-gather the updated parameters", zero);
        if (E && copies > 1) {
            step_link(&s, 1, "edp", "all-gather", copies, (double)held_experts, (double)X, NULL,
                      "-z 1: all-gather the updated experts");
        }
    }
    if (o.diloco_H > 0 && o.diloco_workers > 1) {
        // DiLoCo's outer step (train_gpt2_diloco), every H inner steps: the pseudo-gradient (the
        // outer weights minus the parameters, fp32), its all-reduce over the workers (fp32 on the
        // link), the outer Nesterov step (the weights, momentum and pseudo-gradient read, the two
        // first written) and the parameters from the outer weights. Each row is a step's share, 1/H
        s.group = "diloco outer step (1/H a step)";
        double H = o.diloco_H;
        step_row(&s, 1, 0, P / H, P * (4 + X + 4) / H, STEP_VECTOR, "diloco", "diloco: pseudo-gradient",
                 "diloco pseudo-gradient (1/%d)", o.diloco_H);
        step_link(&s, 1, "across", "all-reduce", o.diloco_workers, (double)P / H, 4, NULL,
                  "all-reduce the pseudo-gradient (fp32, 1/%d)", o.diloco_H);
        step_row(&s, 1, 0, 6 * P / H, P * 4.0 * 5 / H, STEP_VECTOR, "diloco", "diloco: outer Nesterov step",
                 "diloco outer Nesterov step (1/%d)", o.diloco_H);
        step_row(&s, 1, 0, 0, P * (4.0 + X) / H, STEP_VECTOR, "diloco", "diloco: parameters from the outer weights",
                 "diloco parameters from the outer weights (1/%d)", o.diloco_H);
    }
    return s.count;
}

// ---------------------------------------------------------------------------------------------
// The same rows for the layout the memory planner plans: llmc/memory_plan.h's RunLayout (which
// the trainers fill for their own run and dev/memory_planner for any), at pipeline stage `stage`.
// What a RunLayout does not say comes in StepOptions: the build's and the kernels' choices, the
// flags that change no buffer (-tp_overlap) and DiLoCo's outer loop. Defined where memory_plan.h
// was included first: that header needs MPI's, and dev/bench/step_kernels builds without it.
typedef struct {
    int X, flash, bias_epilogue, gelu_epilogue, ln_backward_fused;  // as StepLayout's
    int tp_overlap;              // -tp_overlap
    int diloco_workers, diloco_H;  // train_gpt2_diloco: -workers (RunLayout's dp is every worker's ranks) and -H
    int megatron;                // StepLayout's: the planner's -megatron 1, no trainer's
} StepOptions;

#ifdef LLMC_MEMORY_PLAN_H
static inline StepLayout step_layout_of_run(const RunLayout* r, int stage, StepOptions opt) {
    StepLayout o;
    memset(&o, 0, sizeof(o));
    o.B = r->B, o.T = r->T, o.X = opt.X, o.flash = opt.flash || layout_cp(r) > 1;  // (ring attention runs flash)
    o.bias_epilogue = opt.bias_epilogue, o.gelu_epilogue = opt.gelu_epilogue, o.ln_backward_fused = opt.ln_backward_fused;
    o.dp = r->dp, o.cp = layout_cp(r), o.ep = layout_ep(r), o.micro_batches = r->m, o.cp_allgather = r->cp_allgather;
    o.tp_layer = r->trainer == TRAINER_TP || r->trainer == TRAINER_PP || r->trainer == TRAINER_3D ||
                 r->trainer == TRAINER_DILOCO;
    o.tp = r->tp, o.sp = r->sp, o.tp_overlap = opt.tp_overlap;
    PipeSpec spec = {r->sched, r->pp, r->m, r->V};  // (zb, zbv and dualpipev run W apart from B)
    o.pp = r->pp, o.V = r->V, o.stage = stage, o.weights_later = r->pp > 1 && pipeline_splits_backward(spec);
    o.v_shape = r->pp > 1 && pipeline_is_v(spec);
    o.zero = r->zero, o.overlap = r->overlap, o.offload = r->offload, o.recompute = r->recompute;
    o.capacity_factor = r->capacity_factor;
    o.maxvio = r->maxvio;
    o.megatron = opt.megatron;
    if (r->trainer == TRAINER_DILOCO && opt.diloco_workers > 1) {
        o.diloco_workers = opt.diloco_workers, o.diloco_H = opt.diloco_H, o.dp = r->dp / opt.diloco_workers;
    }
    return o;
}

static inline int step_kernels_run(StepKernel* rows, int capacity, GPT2Config c, const RunLayout* r, int stage,
                                   StepOptions opt) {
    return step_kernels(rows, capacity, c, step_layout_of_run(r, stage, opt));
}
#endif

#endif  // LLMC_STEP_KERNELS_H
