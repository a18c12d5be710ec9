// CPU matmul benchmark on the linear layers of GPT-2 124M (d12) at B x T = 4 x 64 tokens:
// forward and backward of each layer shape, in GFLOP/s, checked against a naive loop.
//   make dev/bench/bench_matmul && OMP_NUM_THREADS=2 ./dev/bench/bench_matmul [N]
#include <math.h>
#include <omp.h>
#include "llmc/utils.h"
#include "llmc/rng.h"
#include "llmc/cpu/matmul.h"

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

int main(int argc, char** argv) {
    int N = argc > 1 ? atoi(argv[1]) : 256;  // tokens: B * T
    const char* names[] = {"qkv", "attproj", "fc", "fcproj", "classifier"};
    int Cs[] = {768, 768, 768, 3072, 768};
    int OCs[] = {2304, 768, 3072, 768, 50304};
    int calls_per_step[] = {12, 12, 12, 12, 1};
    Rng rng;
    rng_init(&rng, 1);
    printf("matmul, N = %d tokens, %d threads\n", N, omp_get_max_threads());
    printf("%-11s %6s %6s | %9s %9s | %9s %9s | %s\n", "layer", "C", "OC", "fwd ms", "GFLOP/s", "bwd ms", "GFLOP/s", "rel err");
    double total_ms = 0.0;
    for (int i = 0; i < 5; i++) {
        int C = Cs[i], OC = OCs[i];
        float* inp = (float*)malloc_check((size_t)N * C * sizeof(float));
        float* w = (float*)malloc_check((size_t)OC * C * sizeof(float));
        float* out = (float*)malloc_check((size_t)N * OC * sizeof(float));
        float* dinp = (float*)malloc_check((size_t)N * C * sizeof(float));
        float* dw = (float*)calloc_check((size_t)OC * C, sizeof(float));
        rng_normal_fill(&rng, inp, (size_t)N * C, 0.0f, 1.0f);
        rng_normal_fill(&rng, w, (size_t)OC * C, 0.0f, 0.02f);
        matmul_forward(out, inp, w, NULL, N, C, OC);  // warm up, and the output to check
        double err = check_forward(out, inp, w, N, C, OC);
        int reps = 5;
        double t0 = wall_time_s();
        for (int r = 0; r < reps; r++) matmul_forward(out, inp, w, NULL, N, C, OC);
        double fwd = (wall_time_s() - t0) / reps;
        t0 = wall_time_s();
        for (int r = 0; r < reps; r++) matmul_backward(dinp, dw, NULL, out, inp, w, N, C, OC);
        double bwd = (wall_time_s() - t0) / reps;
        double flop = 2.0 * N * C * OC;
        printf("%-11s %6d %6d | %9.2f %9.1f | %9.2f %9.1f | %.1e\n", names[i], C, OC, fwd * 1e3,
               flop / fwd / 1e9, bwd * 1e3, 2 * flop / bwd / 1e9, err);
        total_ms += (fwd + bwd) * 1e3 * calls_per_step[i];
        free(inp); free(w); free(out); free(dinp); free(dw);
    }
    printf("all matmuls of one d12 training step: %.0f ms\n", total_ms);
    return 0;
}
