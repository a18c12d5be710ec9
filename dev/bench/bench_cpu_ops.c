// The CPU training step's other passes, beside the machine's memory bandwidth: every op of a d12
// step (GPT-2 124M, B x T = 4 x 64 tokens) that is not a matmul, timed alone on the step's shapes,
// with the bytes it must move at the least (each input read once, each output written once), the
// GB/s that makes and the share of a STREAM-style triad's bandwidth measured here first; then the
// step's total of these ops (each times its calls per step) and that total at the triad's speed.
// Small tensors stay in the caches between calls, so they can beat the triad (which streams from
// memory): AdamW and the gradient norm, over 124M parameters, are the ones bound by memory.
//   make dev/bench/bench_cpu_ops && OMP_NUM_THREADS=2 ./dev/bench/bench_cpu_ops
#include <math.h>
#include <omp.h>
#include "llmc/utils.h"
#include "llmc/rng.h"
#include "llmc/cpu/adamw.h"
#include "llmc/cpu/attention.h"
#include "llmc/cpu/classifier.h"
#include "llmc/cpu/encoder.h"
#include "llmc/cpu/gelu.h"
#include "llmc/cpu/layernorm.h"
#include "dev/bench/best_seconds.h"

enum { B = 4, T = 64, C = 768, NH = 12, L = 12, V = 50257, VP = 50304, MAXT = 1024 };
#define N ((size_t)B * T)

// the d12 parameter count (llm.c's GPT-2 124M with the padded vocabulary)
static size_t d12_parameters(void) {
    size_t layer = 2 * C + 3 * (size_t)C * C + 3 * C + (size_t)C * C + C + 2 * C + 4 * (size_t)C * C + 4 * C +
                   4 * (size_t)C * C + C;
    return (size_t)VP * C + (size_t)MAXT * C + L * layer + 2 * C;
}

static float* floats(Rng* rng, size_t n, float std) {
    float* x = (float*)malloc_check(n * sizeof(float));
    rng_normal_fill(rng, x, n, 0.0f, std);
    return x;
}

// the buffers every op reads or writes, d12-sized
typedef struct {
    float *x, *y, *dy, *dx;              // (N, C) activations and gradients
    float *h, *gh, *dh;                  // (N, 4C): GELU's input, output, gradient
    float *w, *b, *dw, *db, *mean, *rstd;
    float *qkv, *dqkv, *att, *atty;      // attention: (N, 3C), (B, NH, T, T), (N, C)
    float *logits, *losses;              // (N, Vp), (N)
    int* tokens;                         // (N)
    float *wte, *wpe, *dwte, *dwpe;      // (Vp, C), (T, C)
    float *params, *grads, *m, *v;       // (P)
    size_t P;
} Bufs;

static void op_attention_forward(Bufs* s) { attention_forward(s->atty, s->att, s->qkv, B, T, C, NH); }
static void op_attention_backward(Bufs* s) { attention_backward(s->dqkv, s->dy, s->qkv, s->atty, s->att, B, T, C, NH); }
static void op_layernorm_forward(Bufs* s) { layernorm_forward(s->y, s->mean, s->rstd, s->x, s->w, s->b, N, C); }
static void op_residual_layernorm(Bufs* s) {
    fused_residual_layernorm_forward(s->dx, s->y, s->mean, s->rstd, s->x, s->atty, s->w, s->b, N, C);
}
static void op_layernorm_backward(Bufs* s) {
    layernorm_backward(s->dx, s->dw, s->db, s->dy, s->x, s->w, s->mean, s->rstd, N, C);
}
static void op_gelu_forward(Bufs* s) { gelu_forward(s->gh, s->h, N * 4 * C); }
static void op_gelu_backward(Bufs* s) { gelu_backward(s->dh, s->h, s->gh, N * 4 * C); }
static void op_classifier(Bufs* s) { fused_classifier(s->logits, s->losses, s->tokens, 1.0f / N, N, V, VP); }
static void op_encoder_forward(Bufs* s) { encoder_forward(s->y, s->tokens, s->wte, s->wpe, B, T, C); }
static void op_encoder_backward(Bufs* s) { encoder_backward(s->dwte, s->dwpe, s->dy, s->tokens, B, T, C); }
static void op_norm(Bufs* s) {
    volatile float sink = global_norm_squared(s->grads, s->P);
    (void)sink;
}
static void op_adamw(Bufs* s) {
    adamw_update(s->params, NULL, s->grads, s->m, s->v, s->P, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 2, 1.0f, 0, 0);
}

typedef struct {
    const char* name;
    void (*run)(Bufs*);
    double bytes;  // the least a call must move
    int calls;     // per training step (forward, backward and the update; -r 0)
} Op;

// STREAM's triad a = b + s c over three arrays far larger than the caches: GB/s counting 12
// bytes an element (the write-allocate read of a is not counted, as STREAM does not)
static double triad_gbs(void) {
    size_t n = (size_t)64 << 20;  // 256 MB an array
    float* a = (float*)malloc_check(n * sizeof(float));
    float* b = (float*)malloc_check(n * sizeof(float));
    float* c = (float*)malloc_check(n * sizeof(float));
    #pragma omp parallel for
    for (size_t i = 0; i < n; i++) a[i] = 0.0f, b[i] = 1.0f, c[i] = 2.0f;
    double best = 1e30;
    for (int round = 0; round < 4; round++) {
        double t0 = wall_time_s();
        #pragma omp parallel for
        for (size_t i = 0; i < n; i++) a[i] = b[i] + 3.0f * c[i];
        best = fmin(best, wall_time_s() - t0);
    }
    volatile float sink = a[n / 2];
    (void)sink;
    free(a), free(b), free(c);
    return 12.0 * n / best / 1e9;
}

int main(void) {
    Rng rng;
    rng_init(&rng, 1);
    Bufs s;
    s.P = d12_parameters();
    s.x = floats(&rng, N * C, 1.0f), s.y = floats(&rng, N * C, 1.0f);
    s.dy = floats(&rng, N * C, 1.0f), s.dx = floats(&rng, N * C, 1.0f);
    s.h = floats(&rng, N * 4 * C, 1.0f), s.gh = floats(&rng, N * 4 * C, 1.0f), s.dh = floats(&rng, N * 4 * C, 1.0f);
    s.w = floats(&rng, C, 1.0f), s.b = floats(&rng, C, 0.1f), s.dw = floats(&rng, C, 0.1f), s.db = floats(&rng, C, 0.1f);
    s.mean = floats(&rng, N, 0.1f), s.rstd = floats(&rng, N, 0.1f);
    s.qkv = floats(&rng, N * 3 * C, 1.0f), s.dqkv = floats(&rng, N * 3 * C, 1.0f);
    s.att = floats(&rng, (size_t)B * NH * T * T, 0.1f), s.atty = floats(&rng, N * C, 1.0f);
    s.logits = floats(&rng, N * VP, 1.0f), s.losses = floats(&rng, N, 1.0f);
    s.tokens = (int*)malloc_check(N * sizeof(int));
    for (size_t i = 0; i < N; i++) s.tokens[i] = (int)(rng_u64(&rng) % V);
    s.wte = floats(&rng, (size_t)VP * C, 0.02f), s.wpe = floats(&rng, (size_t)MAXT * C, 0.02f);
    s.dwte = floats(&rng, (size_t)VP * C, 0.0f), s.dwpe = floats(&rng, (size_t)MAXT * C, 0.0f);
    s.params = floats(&rng, s.P, 0.02f), s.grads = floats(&rng, s.P, 1e-3f);
    s.m = floats(&rng, s.P, 1e-4f), s.v = floats(&rng, s.P, 1e-8f);
    for (size_t i = 0; i < s.P; i++) s.v[i] = fabsf(s.v[i]);
    layernorm_forward(s.y, s.mean, s.rstd, s.x, s.w, s.b, N, C);  // real statistics for the backward

    double nc = (double)N * C, x4 = 4.0, att = (double)B * NH * T * T;
    Op ops[] = {
        // reads qkv, writes out and the probabilities
        {"attention forward", op_attention_forward, x4 * (3 * nc + nc + att), L},
        // reads dout, qkv, the probabilities; writes dqkv
        {"attention backward", op_attention_backward, x4 * (nc + 3 * nc + att + 3 * nc), L},
        // reads x, writes out (mean and rstd: N floats, not counted)
        {"layernorm forward", op_layernorm_forward, x4 * 2 * nc, 1},
        // reads a and b, writes the residual and the normalized output: 2 a layer (ln1 of the next, ln2)
        {"residual + layernorm", op_residual_layernorm, x4 * 4 * nc, 2 * L},
        // reads dout and x, reads and writes dinp (it accumulates)
        {"layernorm backward", op_layernorm_backward, x4 * 4 * nc, 2 * L + 1},
        {"gelu forward", op_gelu_forward, x4 * 2 * 4 * nc, L},
        {"gelu backward", op_gelu_backward, x4 * 3 * 4 * nc, L},
        // reads the logits, writes their gradient in place
        {"softmax + cross-entropy", op_classifier, x4 * 2 * (double)N * VP, 1},
        // reads the rows of wte and wpe it needs, writes (N, C)
        {"encoder forward", op_encoder_forward, x4 * 3 * nc, 1},
        // reads dout, reads and writes those rows of dwte and dwpe
        {"encoder backward", op_encoder_backward, x4 * 5 * nc, 1},
        // reads every gradient once
        {"gradient norm", op_norm, x4 * (double)s.P, 1},
        // reads parameters, gradients, m, v; writes parameters, m, v
        {"AdamW", op_adamw, x4 * 7 * (double)s.P, 1},
    };
    int threads = omp_get_max_threads();
    double triad = triad_gbs();
    printf("the CPU step's other passes, d12 at B = %d, T = %d, %d threads; triad bandwidth %.1f GB/s\n", B, T, threads,
           triad);
    printf("%-24s | %9s %9s %7s %6s | %5s %9s\n", "op", "ms/call", "MB/call", "GB/s", "triad", "calls", "ms/step");
    double step = 0.0, step_at_triad = 0.0;
    for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
        // the big passes (classifier, AdamW, norm) a few times; the per-layer ones more
        int reps = ops[i].bytes > 1e8 ? 3 : 20;
        double t;
        BEST_SECONDS(t, reps, ops[i].run(&s));
        double gbs = ops[i].bytes / t / 1e9;
        step += t * ops[i].calls;
        step_at_triad += ops[i].bytes / (triad * 1e9) * ops[i].calls;
        printf("%-24s | %9.3f %9.1f %7.1f %5.0f%% | %5d %9.1f\n", ops[i].name, t * 1e3, ops[i].bytes / 1e6, gbs,
               100.0 * gbs / triad, ops[i].calls, t * ops[i].calls * 1e3);
    }
    printf("these ops in one d12 step: %.0f ms; their bytes at the triad's bandwidth: %.0f ms\n", step * 1e3,
           step_at_triad * 1e3);
    return 0;
}
