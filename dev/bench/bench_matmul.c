// CPU matmul benchmark on the linear layers of GPT-2 124M (d12) at B x T = 4 x 64 tokens: each
// of a layer's three products (forward out = inp W^T; backward dinp = dout W and dW += dout^T inp)
// timed alone, in GFLOP/s, ours (llmc/cpu/matmul.h) beside OpenBLAS's sgemm on the same shapes
// when it is installed (its OpenMP build, libopenblas0-openmp: `make bench` installs it through
// dev/setup.sh --bench; one pool of threads then serves both),
// and the step's total at both speeds. Ours is checked against a naive loop.
//   make dev/bench/bench_matmul && OMP_NUM_THREADS=2 ./dev/bench/bench_matmul [N]
#include <math.h>
#include <omp.h>
#include "llmc/utils.h"
#include "llmc/rng.h"
#include "llmc/cpu/matmul.h"
#include "dev/bench/best_seconds.h"
#ifdef HAVE_OPENBLAS
// OpenBLAS's C interface: the two functions used, declared here (its cblas.h lives in a directory
// of its own on each distribution); the CBLAS enums are ints with these values
enum { CblasRowMajor = 101, CblasNoTrans = 111, CblasTrans = 112 };
void cblas_sgemm(int order, int trans_a, int trans_b, int M, int N, int K, float alpha, const float* A, int lda,
                 const float* B, int ldb, float beta, float* C, int ldc);
void openblas_set_num_threads(int threads);
#endif

// largest |out - naive| over a sample of outputs, relative to the largest output
static double check_forward(const float* out, const float* inp, const float* w, int N, int C, int OC) {
    double err = 0.0, scale = 1e-30;
    for (int n = 0; n < N; n += 7) {
        for (int o = 0; o < OC; o += 13) {
            double s = 0.0;
            for (int c = 0; c < C; c++) s += (double)inp[(size_t)n * C + c] * w[(size_t)o * C + c];
            err = fmax(err, fabs(s - out[(size_t)n * OC + o]));
            scale = fmax(scale, fabs(s));
        }
    }
    return err / scale;
}

// the three products of a linear layer (N tokens, C in, OC out), by ours or by OpenBLAS
typedef struct {
    float *inp, *w, *out, *dout, *dinp, *dw;
    int N, C, OC;
} Layer;

static void ours(const Layer* l, int product) {
    if (product == 0) matmul_forward(l->out, l->inp, l->w, NULL, l->N, l->C, l->OC);
    if (product == 1) matmul_backward_input(l->dinp, l->dout, l->w, l->N, l->C, l->OC);
    if (product == 2) matmul_backward_weight(l->dw, NULL, l->dout, l->inp, l->N, l->C, l->OC);
}

#ifdef HAVE_OPENBLAS
static void openblas(const Layer* l, int product) {
    int N = l->N, C = l->C, OC = l->OC;
    if (product == 0) {  // out (N, OC) = inp (N, C) W^T, W (OC, C)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, l->inp, C, l->w, C, 0.0f, l->out, OC);
    } else if (product == 1) {  // dinp (N, C) = dout (N, OC) W
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, l->dout, OC, l->w, C, 0.0f, l->dinp, C);
    } else {  // dW (OC, C) += dout^T (OC, N) inp (N, C)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, l->dout, OC, l->inp, C, 1.0f, l->dw, C);
    }
}
#endif

// The micro-kernel alone on every thread, each on its own panels in L1, `calls` times: the most
// this GEMM can do here. Each shape's GFLOP/s is this less packing, C's traffic and waiting.
static void kernel_on_every_thread(int calls) {
    GemmIsa isa = gemm_isa();
    #pragma omp parallel
    {
        float a[GEMM_KC * GEMM_MR] __attribute__((aligned(64)));
        float b[GEMM_KC * 32] __attribute__((aligned(64)));  // (NR is at most 32)
        float c[GEMM_MR * 32] = {0};
        for (int i = 0; i < GEMM_KC * GEMM_MR; i++) a[i] = 1e-3f * (i % 7);
        for (int i = 0; i < GEMM_KC * isa.nr; i++) b[i] = 1e-3f * (i % 5);
        for (int i = 0; i < calls; i++) isa.kernel(GEMM_KC, a, b, c, isa.nr, GEMM_MR, isa.nr, 1);
    }
}

// one phase: every product of every shape by `run`, each time kept when it beats the last pass's
static void time_every_shape(void (*run)(const Layer*, int), const Layer* layers, double best[5][3], int pass) {
    for (int i = 0; i < 5; i++) {
        for (int p = 0; p < 3; p++) {
            double t;
            BEST_SECONDS(t, 3, run(&layers[i], p));
            best[i][p] = pass == 0 ? t : fmin(best[i][p], t);
        }
    }
}

int main(int argc, char** argv) {
    int N = argc > 1 ? atoi(argv[1]) : 256;  // tokens: B * T
    const char* names[] = {"qkv", "attproj", "fc", "fcproj", "classifier"};
    const char* products[] = {"forward", "dinp", "dweight"};
    int Cs[] = {768, 768, 768, 3072, 768};
    int OCs[] = {2304, 768, 3072, 768, 50304};
    int calls_per_step[] = {12, 12, 12, 12, 1};
    Rng rng;
    rng_init(&rng, 1);
    int threads = omp_get_max_threads();
#ifdef HAVE_OPENBLAS
    openblas_set_num_threads(threads);
    const char* blas = "OpenBLAS";
#else
    const char* blas = "OpenBLAS not installed (make bench installs it: dev/setup.sh --bench)";
#endif
    printf("matmul, N = %d tokens, %d threads, our %s micro-kernel (LLMC_GEMM_ISA to choose); GFLOP/s of ours and of %s\n", N,
           threads, gemm_isa().name, blas);
    double kernel_s;
    BEST_SECONDS(kernel_s, 1, kernel_on_every_thread(20000));
    printf("the micro-kernel alone on %d threads, its panels in L1: %.1f GFLOP/s (the most any shape can reach)\n", threads,
           2.0 * GEMM_MR * gemm_isa().nr * GEMM_KC * 20000 * threads / kernel_s / 1e9);
    printf("%-11s %6s %6s %-8s | %9s %9s | %9s %9s | %7s\n", "layer", "C", "OC", "product", "ours ms", "GFLOP/s",
           "BLAS ms", "GFLOP/s", "ours/BLAS");
    // The shapes' operands, all allocated first, so that each library is timed over every shape in
    // one phase of its own: neither then runs just after the other (the pthreads build of OpenBLAS,
    // linked before, has workers that busy-wait after each call: timed in turns, they took cycles
    // from ours, up to 1.15x on a shape).
    Layer layers[5];
    double worst_err = 0.0;
    for (int i = 0; i < 5; i++) {
        Layer* l = &layers[i];
        int C = Cs[i], OC = OCs[i];
        *l = (Layer){NULL, NULL, NULL, NULL, NULL, NULL, N, C, OC};
        l->inp = (float*)malloc_check((size_t)N * C * sizeof(float));
        l->w = (float*)malloc_check((size_t)OC * C * sizeof(float));
        l->out = (float*)malloc_check((size_t)N * OC * sizeof(float));
        l->dout = (float*)malloc_check((size_t)N * OC * sizeof(float));
        l->dinp = (float*)malloc_check((size_t)N * C * sizeof(float));
        l->dw = (float*)calloc_check((size_t)OC * C, sizeof(float));
        rng_normal_fill(&rng, l->inp, (size_t)N * C, 0.0f, 1.0f);
        rng_normal_fill(&rng, l->w, (size_t)OC * C, 0.0f, 0.02f);
        rng_normal_fill(&rng, l->dout, (size_t)N * OC, 0.0f, 1.0f);
        matmul_forward(l->out, l->inp, l->w, NULL, N, C, OC);
        worst_err = fmax(worst_err, check_forward(l->out, l->inp, l->w, N, C, OC));
    }
    // Three passes of both phases, each shape's best kept: a shared VM slows down for seconds at a
    // time, which in a single pass lands on one library's phase only.
    double ours_s[5][3];
#ifdef HAVE_OPENBLAS
    double blas_s[5][3], step_blas = 0.0;
#endif
    for (int pass = 0; pass < 3; pass++) {
        time_every_shape(ours, layers, ours_s, pass);
#ifdef HAVE_OPENBLAS
        time_every_shape(openblas, layers, blas_s, pass);
#endif
    }
    double step_ours = 0.0;
    for (int i = 0; i < 5; i++) {
        double flop = 2.0 * N * Cs[i] * OCs[i];  // each of the three products
        for (int p = 0; p < 3; p++) {
            double t = ours_s[i][p];
            step_ours += t * calls_per_step[i];
            printf("%-11s %6d %6d %-8s | %9.2f %9.1f |", names[i], Cs[i], OCs[i], products[p], t * 1e3, flop / t / 1e9);
#ifdef HAVE_OPENBLAS
            double tb = blas_s[i][p];
            step_blas += tb * calls_per_step[i];
            printf(" %9.2f %9.1f | %6.2fx\n", tb * 1e3, flop / tb / 1e9, t / tb);
#else
            printf(" %9s %9s | %7s\n", "-", "-", "-");
#endif
        }
    }
    for (int i = 0; i < 5; i++) {
        Layer* l = &layers[i];
        free(l->inp); free(l->w); free(l->out); free(l->dout); free(l->dinp); free(l->dw);
    }
    printf("forward against a float64 loop: largest relative error %.1e\n", worst_err);
    printf("all matmuls of one d12 training step: ours %.0f ms", step_ours * 1e3);
#ifdef HAVE_OPENBLAS
    printf(", at OpenBLAS's speed %.0f ms (ours %.2fx its time)", step_blas * 1e3, step_ours / step_blas);
#endif
    printf("\n");
    return 0;
}
