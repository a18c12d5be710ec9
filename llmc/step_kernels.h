// The kernels of one training step on a GPU, one row per kind of kernel: what it computes (its
// FLOPs), what it must move through the GPU's memory (its bytes), how often a step runs it and
// which part of the chip bounds it. This is the step's inventory for train_gpt2_dp.cu (and a
// rank of train_gpt2_cp.cu and train_gpt2_ep.cu), kept once, here: dev/bench/roofline.py prints
// each row at its roofline, max(FLOPs / FLOP/s, bytes / bandwidth), and a model of the step's
// time reads the same rows.
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
// - for a collective ("link" rows): the bytes one rank sends on its link, and no FLOPs.
// Launch latency, the host's work inside the step and a grid's tail are not rows: a sum of the
// rows' times is a lower bound on the step.
//
// The rows are those of one rank: under context parallelism (cp > 1) its T/cp tokens of each
// sequence (zigzag: an equal share of the causal attention), the ring's K,V blocks and the
// gradients' all-reduce over cp; with experts (GPT2Config's experts E and topk k, split over ep
// ranks) each MLP is E experts of which a token takes k, the routing balanced and dropless: a
// rank's experts take N k rows a layer, and (ep - 1)/ep of its N k slots cross the link each way.
//
// A step may accumulate several micro-batches (StepLayout.micro_batches, train_gpt2_dp's -d with
// -z 0): each runs the forward and backward, the rest runs once a step.
//
// Not generalized yet (a model of the step's time needs them; each is a change of the shapes
// below, and the comments mark where): tensor parallelism (a rank's qkv 3C/tp and fc 4C/tp
// outputs, attproj's C/tp and fcproj's 4C/tp inputs, NH/tp heads, the vocabulary-parallel LM head
// Vp/tp and its loss, and -sp's N/tp rows for the LayerNorms and residuals, with their
// all-reduces or all-gathers and reduce-scatters); a pipeline stage (its Ls layers, the
// embedding on the first stage only and the head on the last, the sends between stages); ZeRO's
// reduce-scatters and all-gathers; recomputation's second forward; DiLoCo's outer step; a
// capacity factor's dropped slots.
#ifndef LLMC_STEP_KERNELS_H
#define LLMC_STEP_KERNELS_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
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
    STEP_LINK,    // a collective or a send: the bytes one rank puts on its link
} StepEngine;

static inline const char* step_engine_name(StepEngine e) {
    switch (e) {
        case STEP_GEMM: return "gemm";
        case STEP_ATTN: return "attn";
        case STEP_VECTOR: return "vector";
        case STEP_MEMSET: return "memset";
        case STEP_LINK: return "link";
    }
    return "?";
}

#define STEP_NAME_CHARS 64
#define STEP_KERNELS_MAX 96  // rows of the largest step: 71 (experts over ep ranks, cuBLAS attention, every kernel separate)

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
} StepKernel;

// how the step is run: what roofline.py's flags choose
typedef struct {
    int B, T;               // sequences of a micro-batch on this rank, and their length (the whole T, also under cp)
    int X;                  // bytes of floatX: 2 (bf16) or 4 (fp32)
    int flash;              // attention: 1 the flash kernels, 0 cuBLAS's batched GEMMs and a softmax kernel
    int bias_epilogue;      // 1: bias gradients from the weight-gradient GEMMs' BGRADB epilogue; 0: kernels
    int gelu_epilogue;      // 1: GELU in the fc GEMM's epilogue (and DGELU in fcproj's dinp); 0: kernels
    int ln_backward_fused;  // 1: the LayerNorm backward in one kernel where a row fits (else separate kernels)
    int dp, cp, ep;         // data-parallel ranks, context-parallel ranks, ranks the experts are split over
    int micro_batches;      // micro-batches a step accumulates (train_gpt2_dp's -d / (B T dp), -z 0): each
                            // runs the forward and backward; the gradients' memset, their all-reduce, the
                            // norm and AdamW stay once a step (0 or 1: one)
} StepLayout;

// where the rows go while step_kernels fills them
typedef struct {
    StepKernel* rows;
    int capacity, count;  // count may pass capacity: the rows past it are counted, not written
    const char* group;
    int repeat;           // a step's calls for each call a micro-batch makes: 1, or the micro-batches
} StepRows;

static inline int64_t step_ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// a row, unless the step never calls it (calls = 0: the "next layer" LayerNorm of a 1-layer model).
// calls (and launches, 0 for one a call) are a micro-batch's, or the step's in a once-a-step
// group; launch NULL: no launcher runs it
static inline void step_row(StepRows* s, int64_t calls, int64_t launches, double flops, double bytes, StepEngine engine,
                            const char* op, const char* launch, const char* kernel_fmt, ...) {
    if (calls <= 0) return;
    calls *= s->repeat;
    launches = launches ? launches * s->repeat : calls;
    if (s->count < s->capacity) {
        StepKernel* r = &s->rows[s->count];
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
    }
    s->count++;
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
// the step, kernel by kernel, in the order train_gpt2_dp.cu launches it. Fills rows[0..capacity)
// and returns the number of rows the step has (more than capacity: the rest were not written).
// The model c: its experts and topk make it train_gpt2_ep's (o.ep of o.dp ranks hold the experts)
static inline int step_kernels(StepKernel* rows, int capacity, GPT2Config c, StepLayout o) {
    StepRows s = {.rows = rows, .capacity = capacity, .count = 0, .group = NULL, .repeat = 1};
    int micro_batches = o.micro_batches > 1 ? o.micro_batches : 1;
    int64_t L = c.num_layers, C = c.channels, NH = c.num_heads, V = c.vocab_size, Vp = c.padded_vocab_size;
    int64_t B = o.B, T = o.T, cp = o.cp, ep = o.ep, X = o.X;
    int64_t hs = C / NH;
    int64_t N = B * T / cp;                       // rows of every activation matrix (tp: -sp divides the LayerNorms' by tp)
    int64_t P = step_rank_parameters(c, o.ep);    // what this rank holds
    int64_t E = gpt2_is_moe(c) ? c.experts : 0, k = c.topk;
    int64_t R = E ? N * k : N;                    // rows of the MLPs' matrices: a rank's experts take N k (balanced)
    double a2a = (double)(R * C * X * (ep - 1)) / ep;  // the bytes an all-to-all sends from a rank (balanced)
    int64_t distinct = N < V ? N : V;             // rows of wte a batch touches: at most one per distinct token

    // the attention's FLOPs: one (64 x hs) x (hs x 64) tile product is 2 64 64 hs FLOPs; under
    // context parallelism this rank's share of the causal triangle, 1/cp of it (zigzag)
    double tile_matmul = (double)(B * NH * step_flash_tiles(T) * 2 * STEP_FLASH_TILE * STEP_FLASH_TILE * hs) / cp;
    double forward_matmul = (double)(B * NH) * step_flash_forward_tiles(T) * 2 * STEP_FLASH_TILE * STEP_FLASH_TILE * hs / cp;
    int64_t square_matmul = B * NH * 2 * T * T * hs;  // a full T x T x hs product (cuBLAS)
    int64_t lse = B * NH * (T / cp) * 4;              // flash's log-sum-exp per query, and D: (B, NH, T/cp) fp32
    int64_t scores = B * NH * T * T;                  // elements of a (B, NH, T, T) score or probability matrix
    int64_t causal = B * NH * T * (T + 1) / 2;        // of which on or below the diagonal
    int64_t act = N * C * X;                          // an activation (N, C) in floatX
    // context parallelism's ring (train_gpt2_cp.cu): per layer, cp - 1 blocks of K,V (B, T/cp, 2C)
    // sent forward, as many again backward with cp blocks of dK, dV in fp32
    int64_t kv_block = N * 2 * C;

    s.group = "step start";
    step_row(&s, 1, 0, 0, (double)(P * X), STEP_MEMSET, "memset", "memset", "memset grads");  // device_memset_zero(grads)

    s.group = "embedding", s.repeat = micro_batches;  // (from here to the backward's end, once a micro-batch)
    // one thread per output element: the token's row of wte (distinct rows read once) plus wpe
    step_row(&s, 1, 0, (double)(STEP_FLOPS_ADD * N * C), (double)(N * 4 + distinct * C * X + (T / cp) * C * X + act),
             STEP_VECTOR, "embedding", "encoder forward", "encoder_forward");
    step_layernorm_forward(&s, X, N, C, "layernorm_forward (ln1 of layer 0)", 1, 0);

    s.group = "layer forward";
    step_matmul(&s, X, "matmul qkv (+bias epilogue)", N, C, 3 * C, L, 1, 0, 0, NULL);  // (tp: out 3C/tp)
    if (cp > 1) {
        step_row(&s, L, 0, 0, (double)((cp - 1) * kv_block * X), STEP_LINK, "comm", NULL,
                 "ring: K,V blocks to the next rank (%lld steps)", (long long)(cp - 1));
    }
    if (o.flash) {
        // flash_attention_forward_kernel: s = q k^T and o += p v per tile, 2 tile products; reads
        // qkv once, writes out and lse; the T x T scores never leave the chip
        step_row(&s, L, 0, 2 * forward_matmul, (double)(4 * act + lse), STEP_ATTN, "attention", "attention forward",
                 "flash_attention_forward");
    } else {
        // q, k, v rearranged into heads, two batched GEMMs around a softmax over the (T, T)
        // scores in memory, the result rearranged back
        const char* fwd = "attention forward";
        step_row(&s, 3 * L, 0, 0, (double)(2 * act), STEP_VECTOR, "attention", fwd, "attention_to_heads (q, k, v)");
        step_row(&s, L, 0, (double)square_matmul, (double)(2 * act + scores * X), STEP_GEMM, "attention", fwd,
                 "gemm_batched scores = q k^T");
        step_row(&s, L, 0, (double)(STEP_FLOPS_SOFTMAX * causal), (double)(causal * X + scores * X), STEP_VECTOR,
                 "attention", fwd, "attention_softmax");
        step_row(&s, L, 0, (double)square_matmul, (double)(scores * X + 2 * act), STEP_GEMM, "attention", fwd,
                 "gemm_batched y = att v");
        step_row(&s, L, 0, 0, (double)(2 * act), STEP_VECTOR, "attention", fwd, "attention_from_heads (y)");
    }
    step_matmul(&s, X, "matmul attproj (+bias epilogue)", N, C, C, L, 1, 0, 0, NULL);  // (tp: input C/tp)
    step_layernorm_forward(&s, X, N, C, "residual + layernorm (ln2)", L, 1);
    if (E) {  // the router, the tokens to their experts (llmc/moe.h: row moves read and write C each)
        step_matmul(&s, X, "matmul router, s = ln2 Wr^T", N, C, E, L, 0, 0, 0, NULL);
        step_row(&s, L, 0, 0, (double)((N + R) * C * X + R * 4), STEP_VECTOR, "moe", "moe: dispatch",
                 "moe dispatch (kept slots into send order)");
        if (ep > 1) step_row(&s, L, 0, 0, a2a, STEP_LINK, "comm", NULL, "all-to-all: the tokens to their experts' ranks");
        step_row(&s, L, 0, 0, (double)(2 * R * C * X + R * 4), STEP_VECTOR, "moe", "moe: gather rows",
                 "moe gather rows (into expert order)");
    }
    if (o.gelu_epilogue) {  // GELU_AUX_BIAS writes GELU's input (aux) and its output
        step_matmul(&s, X, "matmul fc (+bias, GELU epilogue)", R, C, 4 * C, L, 1, 0, 1, NULL);  // (tp: out 4C/tp)
    } else {
        step_matmul(&s, X, "matmul fc (+bias epilogue)", R, C, 4 * C, L, 1, 0, 0, NULL);
        step_row(&s, L, 0, (double)(STEP_FLOPS_GELU * R * 4 * C), (double)(2 * R * 4 * C * X), STEP_VECTOR, "gelu",
                 "gelu forward", "gelu_forward");
    }
    step_matmul(&s, X, "matmul fcproj (+bias epilogue)", R, 4 * C, C, L, 1, 0, 0, NULL);  // (tp: input 4C/tp)
    if (E) {  // the outputs home, and each token's gate-weighted sum
        step_row(&s, L, 0, 0, (double)(2 * R * C * X + R * 4), STEP_VECTOR, "moe", "moe: gather rows",
                 "moe gather rows (back to source order)");
        if (ep > 1) step_row(&s, L, 0, 0, a2a, STEP_LINK, "comm", NULL, "all-to-all: the outputs back");
        step_row(&s, L, 0, (double)(STEP_FLOPS_ADD * R * C), (double)((R + N) * C * X + R * 8), STEP_VECTOR, "moe",
                 "moe: combine", "moe combine (gate-weighted sum)");
    }
    step_layernorm_forward(&s, X, N, C, "residual + layernorm (ln1 of the next layer)", L - 1, 1);

    s.group = "final layernorm";
    step_layernorm_forward(&s, X, N, C, "residual + layernorm (lnf)", 1, 1);

    s.group = "classifier";
    step_matmul(&s, X, "matmul LM head, logits = lnf wte^T", N, C, Vp, 1, 0, 0, 0, NULL);
    // one block per row: an online softmax over the row, then dlogits written over the logits
    step_row(&s, 1, 0, (double)(STEP_FLOPS_CLASSIFIER * N * V), (double)(2 * N * Vp * X + 2 * N * 4), STEP_VECTOR,
             "classifier", "classifier (softmax, loss, dlogits)", "fused_classifier (softmax, loss, dlogits)");
    step_matmul_dinp(&s, X, "matmul LM head dinp = dlogits wte", N, Vp, C, 1, 0);
    step_matmul(&s, X, "matmul LM head dwte += dlogits^T lnf", N, C, Vp, 1, 0, 1, 0, NULL);

    s.group = "final layernorm backward";
    step_row(&s, 1, 0, 0, (double)act, STEP_MEMSET, "memset", "memset", "memset dresidual");
    step_layernorm_backward(&s, o, N, C, "lnf", 1);

    s.group = "layer backward";
    // the MLP half (block.h): the input pass, then the weight pass (MoE: the gates' gradients and
    // the output gradients to the experts first, the input gradients home after, then the router's)
    if (E) {
        step_row(&s, L, 0, (double)(2 * R * C), (double)((2 * N + 2 * R) * C * X + R * 12), STEP_VECTOR, "moe",
                 "moe: dispatch", "moe gate gradients, dispatch (gate-weighted)");
        if (ep > 1) step_row(&s, L, 0, 0, a2a, STEP_LINK, "comm", NULL, "all-to-all: the output gradients to the experts");
        step_row(&s, L, 0, 0, (double)(2 * R * C * X + R * 4), STEP_VECTOR, "moe", "moe: gather rows",
                 "moe gather rows (into expert order)");
    }
    if (o.gelu_epilogue) {  // DGELU reads GELU's input (aux) and multiplies the product by GELU'
        step_matmul_dinp(&s, X, "matmul fcproj dinp (DGELU epilogue)", R, C, 4 * C, L, 1);
    } else {
        step_matmul_dinp(&s, X, "matmul fcproj dinp", R, C, 4 * C, L, 0);
        step_row(&s, L, 0, (double)(STEP_FLOPS_GELU_BACKWARD * R * 4 * C), (double)(3 * R * 4 * C * X), STEP_VECTOR,
                 "gelu", "gelu backward", "gelu_backward");
    }
    step_matmul_dinp(&s, X, "matmul fc dinp", R, 4 * C, C, L, 0);
    if (E) {
        step_matmul(&s, X, "matmul expert fcproj dweight", R, 4 * C, C, L, o.bias_epilogue, 1, 0, NULL);
        step_matmul(&s, X, "matmul expert fc dweight", R, C, 4 * C, L, o.bias_epilogue, 1, 0, NULL);
        step_row(&s, L, 0, 0, (double)(2 * R * C * X + R * 4), STEP_VECTOR, "moe", "moe: gather rows",
                 "moe gather rows (back to source order)");
        if (ep > 1) step_row(&s, L, 0, 0, a2a, STEP_LINK, "comm", NULL, "all-to-all: the input gradients back");
        step_row(&s, L, 0, (double)(STEP_FLOPS_ADD * R * C), (double)((R + N) * C * X + R * 4), STEP_VECTOR, "moe",
                 "moe: combine", "moe combine (sum of the input gradients)");
        step_matmul(&s, X, "matmul router dweight", N, C, E, L, 0, 1, 0, NULL);
        step_matmul_dinp(&s, X, "matmul router dinp", N, E, C, L, 0);
    } else {
        step_weight_gradient(&s, o, N, "fcproj", 4 * C, C, L);
        step_weight_gradient(&s, o, N, "fc", C, 4 * C, L);
    }
    step_layernorm_backward(&s, o, N, C, "ln2", L);
    // the attention half
    step_matmul_dinp(&s, X, "matmul attproj dinp", N, C, C, L, 0);
    if (cp > 1) {
        step_row(&s, L, 0, 0, (double)((cp - 1) * kv_block * X + cp * kv_block * 4), STEP_LINK, "comm", NULL,
                 "ring: K,V again and dK,dV (fp32) to the next rank");
    }
    if (o.flash) {
        // D = rowsum(dO * O); then dK, dV (a block owns 64 keys and walks the queries: s^T = k q^T,
        // dv += p^T dO, dp^T = v dO^T, dk += ds^T q: 4 tile products) and dQ (a block owns 64
        // queries: s = q k^T, dp = dO v^T, dq += ds k: 3). Both recompute p from q, k and lse, and
        // both compute dp: 7 tile products against FlashAttention-2's 5, the price of one writer
        // per output
        const char* bwd = "attention backward";
        step_row(&s, L, 0, (double)(STEP_FLOPS_DOT * N * C), (double)(2 * act + lse), STEP_VECTOR, "attention", bwd,
                 "attention_row_dot (D)");
        step_row(&s, L, 0, 4 * tile_matmul, (double)(6 * act + 2 * lse), STEP_ATTN, "attention", bwd,
                 "flash_attention_backward_dkdv");
        step_row(&s, L, 0, 3 * tile_matmul, (double)(5 * act + 2 * lse), STEP_ATTN, "attention", bwd,
                 "flash_attention_backward_dq");
    } else {
        // q, k, v and dy into heads, four batched GEMMs (each a full square) around the softmax's
        // backward, dq, dk, dv back
        const char* bwd = "attention backward";
        step_row(&s, 4 * L, 0, 0, (double)(2 * act), STEP_VECTOR, "attention", bwd, "attention_to_heads (q, k, v, dy)");
        step_row(&s, L, 0, (double)square_matmul, (double)(2 * act + scores * X), STEP_GEMM, "attention", bwd,
                 "gemm_batched datt = dy v^T");
        step_row(&s, L, 0, (double)square_matmul, (double)(scores * X + 2 * act), STEP_GEMM, "attention", bwd,
                 "gemm_batched dv = att^T dy");
        step_row(&s, L, 0, (double)(STEP_FLOPS_SOFTMAX_BACKWARD * causal), (double)(2 * causal * X + scores * X),
                 STEP_VECTOR, "attention", bwd, "attention_softmax_backward");
        step_row(&s, L, 0, (double)square_matmul, (double)(scores * X + 2 * act), STEP_GEMM, "attention", bwd,
                 "gemm_batched dq = ds k");
        step_row(&s, L, 0, (double)square_matmul, (double)(scores * X + 2 * act), STEP_GEMM, "attention", bwd,
                 "gemm_batched dk = ds^T q");
        step_row(&s, 3 * L, 0, 0, (double)(2 * act), STEP_VECTOR, "attention", bwd, "attention_from_heads (dq, dk, dv)");
    }
    step_matmul_dinp(&s, X, "matmul qkv dinp", N, 3 * C, C, L, 0);
    step_weight_gradient(&s, o, N, "attproj", C, C, L);
    step_weight_gradient(&s, o, N, "qkv", C, 3 * C, L);
    step_layernorm_backward(&s, o, N, C, "ln1", L);

    s.group = "encoder backward";
    // dwte: one block per distinct token sums its rows of dout (positions sorted on the host
    // first), then adds into that token's row of dwte (read and written)
    step_row(&s, 1, 0, (double)(STEP_FLOPS_ADD * N * C), (double)(act + (N + 2 * distinct + 1) * 4 + 2 * distinct * C * X),
             STEP_VECTOR, "embedding", "encoder backward", "encoder_backward_wte");
    step_row(&s, 1, 0, (double)(STEP_FLOPS_ADD * N * C), (double)(act + 2 * (T / cp) * C * X), STEP_VECTOR, "embedding",
             "encoder backward", "encoder_backward_wpe");

    int64_t ranks = (int64_t)o.dp * cp;
    if (ranks > 1) {
        s.group = "gradient all-reduce", s.repeat = 1;  // (-z 0: once a step, after the last micro-batch)
        // NCCL's ring all-reduce sends and receives 2 (n - 1)/n of the payload on each GPU's link
        // (train_gpt2_cp: a SUM over the cp ranks; train_gpt2_ep: the experts over their dp/ep copies)
        int64_t held_experts = E ? L * (E / ep) * step_mlp_parameters(C) : 0;
        step_row(&s, 1, 0, 0, (double)(2 * (ranks - 1)) / ranks * (double)(P - held_experts) * X, STEP_LINK, "comm",
                 NULL, "all-reduce grads (NCCL ring, %lld ranks)", (long long)ranks);
        int64_t copies = o.dp / ep;
        if (E && copies > 1) {
            step_row(&s, 1, 0, 0, (double)(2 * (copies - 1)) / copies * (double)held_experts * X, STEP_LINK, "comm",
                     NULL, "all-reduce expert grads (NCCL ring, %lld copies)", (long long)copies);
        }
    }

    s.group = "global norm + AdamW", s.repeat = 1;
    step_row(&s, 1, 0, (double)(STEP_FLOPS_DOT * P), (double)(P * X + NORM_BLOCKS * 4), STEP_VECTOR, "optimizer",
             "gradient norm", "norm_squared_partial");
    // adamw_runs_kernel over every tensor's pieces (one per layer for the layers' tensors:
    // optimizer.h), up to ADAMW_RUNS_PER_LAUNCH of them a launch. Per parameter: the gradient read
    // (X), the fp32 master weight (bf16) or the parameter itself (fp32) read and written, m and v
    // read and written (fp32), the parameter written (X): 28 bytes either way
    int64_t per_param = X == 2 ? 2 + 8 + 8 + 8 + 2 : 4 + 8 + 8 + 8;
    int64_t pieces = 2 + 12 * L + 2;
    step_row(&s, 1, step_ceil_div(pieces, STEP_ADAMW_RUNS_PER_LAUNCH), (double)(STEP_FLOPS_ADAMW * P),
             (double)(per_param * P), STEP_VECTOR, "optimizer", "adamw", "adamw_runs_kernel (%lld tensors' pieces)",
             (long long)pieces);
    return s.count;
}

#endif  // LLMC_STEP_KERNELS_H
