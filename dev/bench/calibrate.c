// Measures this machine's CPU and writes its device profile (llmc/device_profile.h), the numbers
// the step-time model runs the CPU backend's kernels and messages on:
//   - the GEMM rate of the project's own matmul (llmc/cpu/matmul.h: matmul_forward,
//     matmul_backward_input and matmul_backward_weight, as the trainers call them) on d12's
//     linear layers, a large class (512 tokens) and a small one (64 tokens);
//   - the memory bandwidth, by STREAM's triad over arrays 4x the last-level cache, and the share
//     of it that the step's memory-bound passes (GELU, LayerNorm) reach, and that the optimizer's
//     passes over the parameters (llmc/cpu/adamw.h: the gradient norm, AdamW) reach;
//   - the rate of the CPU's causal attention (llmc/cpu/attention.h);
//   - MPI between 2 ranks of this host, as the CPU backend's comm layer calls it: a message
//     (MPI_Send / MPI_Recv, a ping-pong), an all-reduce (MPI_Allreduce of floats), and ZeRO's
//     reduce-scatter and all-gather (MPI_Reduce_scatter_block, MPI_Allgather in place), each timed
//     over sizes of 8 bytes to 32 MB and fitted to t = alpha + bytes / beta from 2 KB to 2 MB, the
//     bytes past 2 MB (a small model's gradients, past the cache) at a bandwidth of their own;
//   - what ranks sharing the host do to each other, on 4 or 8 ranks (the sweeps run 4 and 8 ranks
//     of one thread on this machine's cores): the GEMM rate and the triad's bandwidth each of N
//     ranks reaches while N compute at once (N = 2, 4, 8: the cores, and caches and memory, shared),
//     the three collectives over N ranks (4, 8), and what ranks waiting in a blocking MPI receive (which
//     polls) take from as many computing; with the ranks pinned to the cores round robin (as
//     dev/bench/sweep.sh runs them), the three collectives over groups of 2 and 4 smaller than the
//     world, every group at once, placed across the cores and on one core;
//   - a copy in memory (memcpy), the CPU's "PCIe" to itself under -offload;
//   - what sharing the host does beyond that, which the sweeps showed the model missing: the
//     wait each collective adds when N ranks compute a fixed amount and then meet in it (they
//     arrive apart, taking turns on the cores), as a fraction of that compute, the triad's shared fraction again on arrays that
//     fit in the last-level cache (the step's passes at d4 do), and the GEMM rate of a language
//     model head's shape, few tokens against a weight larger than the cache (d4's: 128 x 256
//     times 256 x 50304), which runs below both size classes.
// A CPU has no datasheet peak that its kernels approach the way a GPU's GEMMs approach theirs,
// so the peak here is what was measured: the large GEMMs' rate is peak_flops_fp32 (and bf16: the
// CPU backend computes in fp32), efficiency_matmul_large is 1 by that definition, and the small
// class's efficiency is its measured rate over it. Likewise the triad's bandwidth is
// memory_bandwidth_bytes_per_s, and efficiency_memory is what the kernels reach of it.
//
//   make dev/bench/calibrate
//   mpirun --oversubscribe --bind-to none -np 8 ./dev/bench/calibrate -o dev/profiles/cpu-this-machine.txt [-threads 1]
//     (-np 2: no measurements of ranks sharing the host, -np 4: those of 2 and 4 ranks; the
//     profile names what it measured: llmc/device_profile.h; --bind-to core:overload-allowed
//     --map-by core in place of --bind-to none: the groups' collectives too, for runs pinned so)
//   ./dev/bench/calibrate -check FILE|NAME   read a profile (or a built-in: h100-sxm, h200,
//                                            a100-80gb), print it; exit 1 with the reason if refused
//   ./dev/bench/calibrate -fit FILE          fit t = alpha + bytes / beta to FILE's "bytes seconds" lines
// -threads: the OpenMP threads the measured rank computes with (default 1, as the tests and
// sweeps run each rank); the profile records it and the host's cores (cpu_threads, cpu_cores), so
// that a model of R ranks of t threads on this host can tell when they share cores.
// It takes about half a minute on an idle 2-core machine at 2 ranks and a minute and a half at 8 (longer when
// other work shares the cores).
#define _GNU_SOURCE  // (sched_getaffinity: where mpirun pinned this rank)
#include <math.h>
#include <mpi.h>
#include <sched.h>
#include <omp.h>
#include <stdarg.h>
#include <time.h>
#include <unistd.h>
#include "llmc/utils.h"
#include "llmc/rng.h"
#include "llmc/cpu/matmul.h"
#include "llmc/cpu/attention.h"
#include "llmc/cpu/gelu.h"
#include "llmc/cpu/layernorm.h"
#include "llmc/cpu/adamw.h"
#include "llmc/device_profile.h"
#include "dev/bench/best_seconds.h"

static int mpi_started = 0;

// an error ends every rank: printed, then MPI_Abort when there are others
static void die(const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "error: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    int size = 1;
    if (mpi_started) MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size > 1) MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
}

// ----------------------------------------------------------------------------------------------
// The alpha-beta fit. Least squares for t = alpha + n / beta over the points (n_i, t_i), each
// weighted by 1 / t_i^2, so that every point's relative error counts alike: the small messages,
// whose time is nearly all alpha, decide alpha as much as the large ones, nearly all n / beta,
// decide beta (unweighted, a microsecond off an 8 MB message would count as much as the whole
// of an 8-byte one). With a = alpha and b = 1 / beta the normal equations are two by two:
//   a S  + b Sn  = St        S = sum w, Sn = sum w n, Snn = sum w n^2,
//   a Sn + b Snn = Snt       St = sum w t, Snt = sum w n t.
// alpha_floor: the least alpha can be. A message pays at least what the smallest one does, so
// calibrate passes the 8-byte message's time: where the line through the larger sizes crosses
// below it (noise; a protocol that is faster a byte for large messages), alpha is that floor and
// b the best slope with it, b = (Snt - alpha Sn) / Snn. (-fit passes 0: plain least squares.)
// Returns 0 (and why) when the points do not fix a positive alpha and beta.
static int fit_alpha_beta(const double* n, const double* t, int count, double alpha_floor, double* alpha,
                          double* beta, const char** why) {
    double S = 0, Sn = 0, Snn = 0, St = 0, Snt = 0;
    for (int i = 0; i < count; i++) {
        if (!(t[i] > 0)) {
            *why = "a time that is not positive";
            return 0;
        }
        double w = 1.0 / (t[i] * t[i]);
        S += w, Sn += w * n[i], Snn += w * n[i] * n[i], St += w * t[i], Snt += w * n[i] * t[i];
    }
    int sizes = 0;  // (two or more different sizes: else the line could have any slope)
    for (int i = 0; i < count; i++) sizes += n[i] != n[0];
    double det = S * Snn - Sn * Sn;
    if (sizes == 0 || !(det > 0)) {
        *why = "fewer than two different sizes";
        return 0;
    }
    double a = (Snn * St - Sn * Snt) / det, b = (S * Snt - Sn * St) / det;
    if (alpha_floor > 0 && a < alpha_floor) a = alpha_floor, b = (Snt - a * Sn) / Snn;
    if (!(a > 0) || !(b > 0)) {
        *why = a > 0 ? "time that does not grow with the size" : "a latency that is not positive (too noisy?)";
        return 0;
    }
    *alpha = a, *beta = 1.0 / b;
    return 1;
}

// ----------------------------------------------------------------------------------------------
// MPI between 2 ranks. Both ranks run these in step; rank 0's clock is the one reported.

#define MESSAGE_SIZES 12  // 8 bytes, x4 each, to 32 MB
static size_t message_bytes(int i) { return (size_t)8 << (2 * i); }
// The fit takes the sizes from 2 KB to 2 MB (the 5th to the 10th): the sizes a trainer sends, a
// row of activations (C floats: 3 KB at d12) and up. Below that MPI copies a message through its
// eager buffers and takes less time than the line through the larger ones says; those are
// printed beside the line, not fitted: a model that predicts a step is only as good as its line
// where the step's bytes are. Past 2 MB (gradients: d4's are 65 MB) a collective's copies and
// sums stream from memory rather than the cache and each byte takes longer than the line says:
// the bytes past 2 MB get a bandwidth of their own, from the 2 MB and 32 MB times (beyond_2mb)
#define FIT_FROM 4
#define FIT_TO 9  // (2 MB: llmc/device_profile.h's DEVICE_PROFILE_COLLECTIVE_KNEE_BYTES)

// the bandwidth of a collective's bytes past 2 MB: between its 2 MB and 32 MB times (0 where the
// larger took no longer: a noisy measurement, left out of the profile)
static double beyond_2mb_bandwidth(const double* n, const double* t) {
    int last = MESSAGE_SIZES - 1;
    return t[last] > t[FIT_TO] ? (n[last] - n[FIT_TO]) / (t[last] - t[FIT_TO]) : 0.0;
}

// the time the profile then says for a collective of n bytes (as llmc/comm_time.h prices it)
static double collective_fit_seconds(double alpha, double beta, double beyond, double n) {
    double knee = DEVICE_PROFILE_COLLECTIVE_KNEE_BYTES;
    if (!(beyond > 0.0) || n <= knee) return alpha + n / beta;
    return alpha + knee / beta + (n - knee) / beyond;
}

// calls per timed round: many small messages, enough large ones to move ~32 MB
static int message_reps(size_t bytes) {
    size_t reps = ((size_t)32 << 20) / bytes;
    return reps < 4 ? 4 : reps > 2000 ? 2000 : (int)reps;
}

// seconds for one message of `bytes` one way: a ping-pong (rank 0 sends, rank 1 sends it back),
// half a round trip, the best of 4 rounds (a shared machine only ever adds time)
static double time_message(char* buf, size_t bytes, int rank, MPI_Comm pair) {
    int reps = message_reps(bytes);
    double best = 1e30;
    for (int round = 0; round < 5; round++) {  // (round 0 warms up)
        MPI_Barrier(pair);
        double t0 = wall_time_s();
        for (int r = 0; r < reps; r++) {
            if (rank == 0) {
                MPI_Send(buf, (int)bytes, MPI_BYTE, 1, 0, pair);
                MPI_Recv(buf, (int)bytes, MPI_BYTE, 1, 0, pair, MPI_STATUS_IGNORE);
            } else {
                MPI_Recv(buf, (int)bytes, MPI_BYTE, 0, 0, pair, MPI_STATUS_IGNORE);
                MPI_Send(buf, (int)bytes, MPI_BYTE, 0, 0, pair);
            }
        }
        double t = (wall_time_s() - t0) / (2.0 * reps);
        if (round > 0) best = fmin(best, t);
    }
    return best;
}

// the collectives timed: as llmc/cpu/comm.h calls them, on floats (bytes: the all-reduce's buffer,
// the reduce-scatter's input, the all-gather's output)
typedef enum { TIMED_ALL_REDUCE, TIMED_REDUCE_SCATTER, TIMED_ALL_GATHER, TIMED_KINDS } TimedCollective;
static const char* const timed_names[TIMED_KINDS] = {"all-reduce", "reduce-scatter", "all-gather"};

static void run_collective(TimedCollective kind, float* buf, float* out, int count, int size, MPI_Comm comm) {
    if (kind == TIMED_ALL_REDUCE) MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, comm);
    if (kind == TIMED_REDUCE_SCATTER) MPI_Reduce_scatter_block(buf, out, count / size, MPI_FLOAT, MPI_SUM, comm);
    if (kind == TIMED_ALL_GATHER) MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, count / size, MPI_FLOAT, comm);
}

// seconds for one collective of `bytes` of floats over the ranks of comm (out: the reduce-scatter's
// output, bytes / size of them); the buffer is zeros, so the sums stay zeros. Two ranks alone
// (turns 0): the best of 4 rounds; ranks that share the cores (turns 1), their median: taking
// turns on a core is part of what is measured there, and a best round would be the luckiest turns.
// Rounds of ~32 MB or, where that is slow (ranks taking turns), ~0.1 s, as the first call says,
// rank 0's count. `start`: the ranks that start each round together and share that count (comm
// itself; the world, where several groups time their collectives at once)
static double time_collective(TimedCollective kind, float* buf, float* out, size_t bytes, MPI_Comm comm, int turns,
                              MPI_Comm start) {
    int size;
    MPI_Comm_size(comm, &size);
    int count = (int)(bytes / 4), reps = message_reps(bytes);
    MPI_Barrier(start);
    double t0 = wall_time_s();
    run_collective(kind, buf, out, count, size, comm);
    double first = wall_time_s() - t0;
    if (first * reps > 0.1) reps = (int)fmax(2.0, 0.1 / first);
    MPI_Bcast(&reps, 1, MPI_INT, 0, start);
    double t[4];
    for (int round = 0; round < 4; round++) {
        MPI_Barrier(start);
        t0 = wall_time_s();
        for (int r = 0; r < reps; r++) run_collective(kind, buf, out, count, size, comm);
        t[round] = (wall_time_s() - t0) / reps;
    }
    for (int i = 1; i < 4; i++) {  // (sorted: 4 numbers)
        for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
            double x = t[j];
            t[j] = t[j - 1], t[j - 1] = x;
        }
    }
    return turns ? (t[1] + t[2]) / 2.0 : t[0];
}

// ----------------------------------------------------------------------------------------------
// Compute and memory, on rank 0 alone

typedef struct {
    const char* name;
    int N, C, OC;  // tokens, in, out: the layer's three products as the trainers call them
} GemmShape;

// A class of shapes timed: every product of every shape, their FLOPs, their least bytes (as
// llmc/step_kernels.h counts a GEMM row's: the two operands read and the result written, a weight
// gradient's also read, as it accumulates) and their seconds, added up
typedef struct {
    double flops, bytes, seconds;
} GemmClass;

// the large class, d12's fc and fcproj at 512 tokens: the peak's GEMMs, and each rank's in step 3
static const GemmShape large_shapes[2] = {{"fc", 512, 768, 3072}, {"fcproj", 512, 3072, 768}};

static GemmClass gemm_class(const GemmShape* shapes, int count, Rng* rng, double* largest_flops, double* smallest_flops) {
    double flops = 0, bytes = 0, seconds = 0;
    *largest_flops = 0, *smallest_flops = 1e300;
    for (int s = 0; s < count; s++) {
        int N = shapes[s].N, C = shapes[s].C, OC = shapes[s].OC;
        float* inp = (float*)malloc_check((size_t)N * C * sizeof(float));
        float* w = (float*)malloc_check((size_t)OC * C * sizeof(float));
        float* out = (float*)malloc_check((size_t)N * OC * sizeof(float));
        float* dinp = (float*)malloc_check((size_t)N * C * sizeof(float));
        float* dw = (float*)calloc_check((size_t)OC * C, sizeof(float));
        rng_normal_fill(rng, inp, (size_t)N * C, 0.0f, 1.0f);
        rng_normal_fill(rng, w, (size_t)OC * C, 0.0f, 0.02f);
        rng_normal_fill(rng, out, (size_t)N * OC, 0.0f, 1.0f);  // (read as dout by the backward)
        double f = 2.0 * N * C * OC;                                // each of the three products
        // calls a round: ~0.05 s of work at 50 GFLOP/s, at least 1
        int reps = (int)fmax(1.0, 2.5e9 / f);
        double t_fwd, t_dinp, t_dw;
        BEST_SECONDS(t_fwd, reps, matmul_forward(out, inp, w, NULL, N, C, OC));
        BEST_SECONDS(t_dinp, reps, matmul_backward_input(dinp, out, w, N, C, OC));
        BEST_SECONDS(t_dw, reps, matmul_backward_weight(dw, NULL, out, inp, N, C, OC));
        printf("  gemm %-8s N %5d, %4d -> %4d: %.2e FLOPs a product; forward %6.1f, dinp %6.1f, dweight %6.1f GFLOP/s\n",
               shapes[s].name, N, C, OC, f, f / t_fwd / 1e9, f / t_dinp / 1e9, f / t_dw / 1e9);
        double operands = 4.0 * ((double)N * C + (double)C * OC + (double)N * OC);
        flops += 3 * f, bytes += 3 * operands + 4.0 * C * OC, seconds += t_fwd + t_dinp + t_dw;
        *largest_flops = fmax(*largest_flops, f), *smallest_flops = fmin(*smallest_flops, f);
        free(inp), free(w), free(out), free(dinp), free(dw);
    }
    GemmClass k = {flops, bytes, seconds};
    return k;
}

// The rate of a class's arithmetic alone. On a CPU the core that runs a GEMM's FMAs also packs its
// operands and streams its result, so the step-time model adds a GEMM's bytes / bandwidth to its
// FLOPs / rate (llmc/step_time.h); the rate it needs is then the FLOPs over the time that is left
// once the bytes' time at the memory-bound passes' bandwidth is taken out (at least half the
// time left: a bandwidth too low to explain the GEMMs is a measurement gone wrong, not a faster core)
static double gemm_core_rate(GemmClass k, double bandwidth) {
    double left = k.seconds - k.bytes / bandwidth;
    return k.flops / fmax(left, 0.5 * k.seconds);
}

// The host's last-level cache in bytes: the largest cache sysfs lists for cpu 0 (what lscpu reads;
// a VM's sysconf may report another), else sysconf's level 3, else 32 MB
static double last_level_cache_bytes(void) {
    double best = 0.0;
    for (int index = 0; index < 8; index++) {
        char path[128], text[64];
        snprintf(path, sizeof(path), "/sys/devices/system/cpu/cpu0/cache/index%d/size", index);
        FILE* f = fopen(path, "r");
        if (f == NULL) continue;
        double v = 0.0;
        char unit = 0;
        if (fgets(text, sizeof(text), f) && sscanf(text, "%lf%c", &v, &unit) >= 1) {
            v *= unit == 'K' ? 1024.0 : unit == 'M' ? 1048576.0 : unit == 'G' ? 1073741824.0 : 1.0;
            best = fmax(best, v);
        }
        fclose(f);
    }
    if (best <= 0.0) best = (double)sysconf(_SC_LEVEL3_CACHE_SIZE);
    return best > 0.0 ? best : 32.0 * 1048576.0;
}

// STREAM's triad a = b + s c over three arrays of 32M floats (128 MB each, 4x this machine's
// 32 MB L3 and far beyond most), bytes/s counting 12 an element (the write-allocate read of a is
// not counted, as STREAM does not), the best of 5 rounds, with `threads` threads
static double triad_bandwidth(float* a, const float* b, const float* c, size_t n, int threads) {
    double best = 1e30;
    for (int round = 0; round < 6; round++) {
        double t0 = wall_time_s();
        #pragma omp parallel for num_threads(threads)
        for (size_t i = 0; i < n; i++) a[i] = b[i] + 3.0f * c[i];
        if (round > 0) best = fmin(best, wall_time_s() - t0);
    }
    return 12.0 * n / best;
}

// The kernels below run at the CPU step's own shape, d12 at B x T = 4 x 64 tokens (as
// dev/bench/bench_cpu_ops times them): their tensors sit in the caches there, as in the
// trainers' runs on this machine, and their rates differ from those over arrays beyond the
// caches (LayerNorm's parameter gradients walk a column at a time, a cache miss a row once
// the rows outgrow the caches).
enum { CAL_B = 4, CAL_T = 64, CAL_C = 768, CAL_NH = 12 };

// causal attention (llmc/cpu/attention.h): FLOP/s of useful work, the causal pairs' q k^T and
// p v, 2 T (T + 1) C B forward and twice that backward (the FLOPs every profile's
// efficiency_attention counts: llmc/device_profile.h)
static double attention_rate_measured(Rng* rng) {
    int B = CAL_B, T = CAL_T, C = CAL_C, NH = CAL_NH;
    size_t nt = (size_t)B * T;
    float* qkv = (float*)malloc_check(nt * 3 * C * sizeof(float));
    float* dqkv = (float*)malloc_check(nt * 3 * C * sizeof(float));
    float* att = (float*)malloc_check((size_t)B * NH * T * T * sizeof(float));
    float* y = (float*)malloc_check(nt * C * sizeof(float));
    float* dy = (float*)malloc_check(nt * C * sizeof(float));
    rng_normal_fill(rng, qkv, nt * 3 * C, 0.0f, 1.0f);
    rng_normal_fill(rng, dy, nt * C, 0.0f, 1.0f);
    double t_fwd, t_bwd;
    BEST_SECONDS(t_fwd, 20, attention_forward(y, att, qkv, B, T, C, NH));
    BEST_SECONDS(t_bwd, 20, attention_backward(dqkv, dy, qkv, y, att, B, T, C, NH));
    double useful = 2.0 * T * (T + 1) * C * B;
    printf("  attention B %d, T %d, C %d, %d heads: forward %.1f, backward %.1f GFLOP/s\n", B, T, C, NH,
           useful / t_fwd / 1e9, 2 * useful / t_bwd / 1e9);
    free(qkv), free(dqkv), free(att), free(y), free(dy);
    return 3 * useful / (t_fwd + t_bwd);
}

// the step's memory-bound passes: GELU forward (reads its input, writes its output) and
// backward (reads two, writes one) over (B T, 4C), LayerNorm forward (reads x, writes out) and
// backward (reads dout and x, reads and adds into dinp) over (B T, C); bytes/s of the least
// bytes each must move, the four together
static double kernels_bandwidth_measured(Rng* rng) {
    int rows = CAL_B * CAL_T, C = CAL_C;
    size_t nc = (size_t)rows * C, n4 = 4 * nc;
    float *h = (float*)malloc_check(n4 * sizeof(float)), *gh = (float*)malloc_check(n4 * sizeof(float));
    float* dh = (float*)malloc_check(n4 * sizeof(float));
    float *x = (float*)malloc_check(nc * sizeof(float)), *y = (float*)malloc_check(nc * sizeof(float));
    float* dx = (float*)calloc_check(nc, sizeof(float));
    float *w = (float*)malloc_check(C * sizeof(float)), *bias = (float*)calloc_check(C, sizeof(float));
    float *dw = (float*)calloc_check(C, sizeof(float)), *db = (float*)calloc_check(C, sizeof(float));
    float *mean = (float*)malloc_check(rows * sizeof(float)), *rstd = (float*)malloc_check(rows * sizeof(float));
    rng_normal_fill(rng, h, n4, 0.0f, 1.0f);
    rng_normal_fill(rng, gh, n4, 0.0f, 1.0f);
    rng_normal_fill(rng, x, nc, 0.0f, 1.0f);
    for (int i = 0; i < C; i++) w[i] = 1.0f;
    double t_gelu_f, t_gelu_b, t_ln_f, t_ln_b;
    BEST_SECONDS(t_gelu_f, 20, gelu_forward(gh, h, n4));
    BEST_SECONDS(t_gelu_b, 20, gelu_backward(dh, h, gh, n4));
    BEST_SECONDS(t_ln_f, 20, layernorm_forward(y, mean, rstd, x, w, bias, rows, C));
    BEST_SECONDS(t_ln_b, 20, layernorm_backward(dx, dw, db, y, x, w, mean, rstd, rows, C));
    double b_gelu_f = 8.0 * n4, b_gelu_b = 12.0 * n4, b_ln_f = 8.0 * nc, b_ln_b = 16.0 * nc;
    printf("  GELU forward %.1f, backward %.1f GB/s; LayerNorm forward %.1f, backward %.1f GB/s (B %d, T %d, C %d)\n",
           b_gelu_f / t_gelu_f / 1e9, b_gelu_b / t_gelu_b / 1e9, b_ln_f / t_ln_f / 1e9, b_ln_b / t_ln_b / 1e9, CAL_B,
           CAL_T, C);
    free(h), free(gh), free(dh), free(x), free(y), free(dx), free(w), free(bias), free(dw), free(db), free(mean), free(rstd);
    return (b_gelu_f + b_gelu_b + b_ln_f + b_ln_b) / (t_gelu_f + t_gelu_b + t_ln_f + t_ln_b);
}

// the median of n numbers (of the middle two when n is even), sorted in place
static double median_of(double* x, int n) {
    for (int i = 1; i < n; i++) {
        for (int j = i; j > 0 && x[j] < x[j - 1]; j--) {
            double t = x[j];
            x[j] = x[j - 1], x[j - 1] = t;
        }
    }
    return n % 2 ? x[n / 2] : (x[n / 2 - 1] + x[n / 2]) / 2.0;
}

// The optimizer's two passes, as a trainer's step ends (llmc/cpu/adamw.h), over d4's parameters
// (16M, as the CPU sweeps train; 256 MB of weights, gradients and moments): the gradient norm
// reads the gradients (4 bytes a parameter), AdamW reads gradient, weight, m and v and writes the
// last three back (28): step_kernels.h's bytes. They stream every array in place, which the triad
// does not (its third array's lines are read before they are written, and it does not count those
// reads), so they may pass the triad's bandwidth. Their share of it from OPTIMIZER_PAIRS pairs, the
// two passes then the triad (a, b, c: triad_n each), the median pair's ratio: two rates timed
// apart differ by the machine's drift between them (one calibration's 0.92 against 1.25 and 1.29).
#define OPTIMIZER_PARAMS ((size_t)16 << 20)
#define OPTIMIZER_PAIRS 5
static double optimizer_efficiency_measured(Rng* rng, float* a, const float* b, const float* c, size_t triad_n,
                                            int threads) {
    size_t n = OPTIMIZER_PARAMS;
    float* params = (float*)malloc_check(n * sizeof(float));
    float* grads = (float*)malloc_check(n * sizeof(float));
    float *m = (float*)calloc_check(n, sizeof(float)), *v = (float*)calloc_check(n, sizeof(float));
    rng_normal_fill(rng, params, n, 0.0f, 0.02f);
    rng_normal_fill(rng, grads, n, 0.0f, 1e-3f);
    volatile float norm_squared = 0.0f;  // (kept, so that the norm's pass is not optimized away)
    int t = 0;
    double ratio[OPTIMIZER_PAIRS];
    for (int i = 0; i < OPTIMIZER_PAIRS; i++) {
        double seconds;
        BEST_SECONDS(seconds, 1, (norm_squared = global_norm_squared(grads, n),
                                  adamw_update(params, NULL, grads, m, v, n, 3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, ++t, 1.0f, 0, 0)));
        ratio[i] = (4.0 + 28.0) * n / seconds / triad_bandwidth(a, b, c, triad_n, threads);
    }
    (void)norm_squared;
    free(params), free(grads), free(m), free(v);
    return median_of(ratio, OPTIMIZER_PAIRS);
}

// A barrier that waits without taking a core from the ranks still computing (MPI's blocking calls
// poll): asleep between tests, so that what a rank measures is its own work and not its waiting
// neighbours'
static void quiet_barrier(MPI_Comm comm) {
    int flag = 0;
    MPI_Request request;
    MPI_Ibarrier(comm, &request);
    while (!flag) {
        MPI_Test(&request, &flag, MPI_STATUS_IGNORE);
        if (!flag) usleep(1000);
    }
}

// ----------------------------------------------------------------------------------------------
// Ranks sharing the host. N ranks start together, each does the same work, and the time is the
// last one's (a step waits for its slowest rank); a rank done early waits quietly, so that the
// cores go to those still working. fraction = (work / that time) / (work / a lone rank's time).

typedef struct {
    GemmShape shapes[2];
    float *inp[2], *w[2], *out[2], *dinp[2], *dw[2];
    float *a, *b, *c;  // the triad's arrays
    size_t triad_n;
    float *ca, *cb, *cc;  // ... and arrays that fit in the cache, 8 ranks' together in half of it
    size_t cached_n;
    float* reduced;       // the spread's all-reduce, SPREAD_BYTES of floats
} ShareWork;

// every product of the large class (as gemm_rate times them), twice
static void share_gemms(ShareWork* k) {
    for (int rep = 0; rep < 2; rep++) {
        for (int s = 0; s < 2; s++) {
            int N = k->shapes[s].N, C = k->shapes[s].C, OC = k->shapes[s].OC;
            matmul_forward(k->out[s], k->inp[s], k->w[s], NULL, N, C, OC);
            matmul_backward_input(k->dinp[s], k->out[s], k->w[s], N, C, OC);
            matmul_backward_weight(k->dw[s], NULL, k->out[s], k->inp[s], N, C, OC);
        }
    }
}

// the triad over this rank's own arrays, 4 times
static void share_triads(ShareWork* k) {
    for (int rep = 0; rep < 4; rep++) {
        for (size_t i = 0; i < k->triad_n; i++) k->a[i] = k->b[i] + 3.0f * k->c[i];
    }
}

// the triad over this rank's arrays that fit in the cache, as many elements in all as share_triads
static void share_cached_triads(ShareWork* k) {
    size_t reps = 4 * k->triad_n / k->cached_n;
    for (size_t rep = 0; rep < reps; rep++) {
        for (size_t i = 0; i < k->cached_n; i++) k->ca[i] = k->cb[i] + 3.0f * k->cc[i];
    }
}

// The arrival spread: SPREAD_ROUNDS times, a fixed amount of compute (d12's fc forward at 64
// tokens, 3e8 FLOPs: a few milliseconds, the compute between two of a step's collectives at the
// CPU sweeps' shapes), then, in share_compute_and_meet, an all-reduce of SPREAD_BYTES
#define SPREAD_ROUNDS 16
#define SPREAD_BYTES 4096
#define SPREAD_PAIRS 15  // (the compute alone and with its meetings, taken in turn this many times)
static void share_compute(ShareWork* k) {
    for (int r = 0; r < SPREAD_ROUNDS; r++) matmul_forward(k->out[0], k->inp[0], k->w[0], NULL, 64, 768, 3072);
}

static MPI_Comm spread_comm;  // (the ranks meeting in share_compute_and_meet's all-reduces)
static void share_compute_and_meet(ShareWork* k) {
    for (int r = 0; r < SPREAD_ROUNDS; r++) {
        matmul_forward(k->out[0], k->inp[0], k->w[0], NULL, 64, 768, 3072);
        MPI_Allreduce(MPI_IN_PLACE, k->reduced, SPREAD_BYTES / 4, MPI_FLOAT, MPI_SUM, spread_comm);
    }
}

// each rank's arrays for the work above (the GEMMs of the large class's two shapes, the triads'
// 3 x 64 MB and the cached triads' 3 x cache / 192: 8 ranks' in half the cache), touched once
static void share_work_alloc(ShareWork* k, const GemmShape large[2], double cache_bytes, Rng* rng) {
    memcpy(k->shapes, large, sizeof(k->shapes));
    for (int s = 0; s < 2; s++) {
        int N = large[s].N, C = large[s].C, OC = large[s].OC;
        k->inp[s] = (float*)malloc_check((size_t)N * C * sizeof(float));
        k->w[s] = (float*)malloc_check((size_t)OC * C * sizeof(float));
        k->out[s] = (float*)malloc_check((size_t)N * OC * sizeof(float));
        k->dinp[s] = (float*)malloc_check((size_t)N * C * sizeof(float));
        k->dw[s] = (float*)calloc_check((size_t)OC * C, sizeof(float));
        rng_normal_fill(rng, k->inp[s], (size_t)N * C, 0.0f, 1.0f);
        rng_normal_fill(rng, k->w[s], (size_t)OC * C, 0.0f, 0.02f);
        rng_normal_fill(rng, k->out[s], (size_t)N * OC, 0.0f, 1.0f);
    }
    k->triad_n = (size_t)16 << 20;
    k->a = (float*)calloc_check(k->triad_n, sizeof(float));
    k->b = (float*)malloc_check(k->triad_n * sizeof(float));
    k->c = (float*)malloc_check(k->triad_n * sizeof(float));
    for (size_t i = 0; i < k->triad_n; i++) k->b[i] = 1.0f, k->c[i] = 2.0f;
    k->cached_n = (size_t)(cache_bytes / 2.0 / 8.0 / 12.0);
    k->ca = (float*)calloc_check(k->cached_n, sizeof(float));
    k->cb = (float*)malloc_check(k->cached_n * sizeof(float));
    k->cc = (float*)malloc_check(k->cached_n * sizeof(float));
    for (size_t i = 0; i < k->cached_n; i++) k->cb[i] = 1.0f, k->cc[i] = 2.0f;
    k->reduced = (float*)calloc_check(SPREAD_BYTES / 4, sizeof(float));
    share_gemms(k), share_triads(k), share_cached_triads(k);  // (warm: pages touched, caches filled)
}

static void share_work_free(ShareWork* k) {
    for (int s = 0; s < 2; s++) free(k->inp[s]), free(k->w[s]), free(k->out[s]), free(k->dinp[s]), free(k->dw[s]);
    free(k->a), free(k->b), free(k->c), free(k->ca), free(k->cb), free(k->cc), free(k->reduced);
}

// seconds until the last of comm's ranks has done `work`, the better of 2 rounds (other work on
// the machine only ever adds time)
static double together_seconds(MPI_Comm comm, void (*work)(ShareWork*), ShareWork* k) {
    double best = 1e30;
    for (int round = 0; round < 2; round++) {
        MPI_Barrier(comm);
        double t0 = wall_time_s();
        work(k);
        double mine = wall_time_s() - t0, last;
        quiet_barrier(comm);
        MPI_Allreduce(&mine, &last, 1, MPI_DOUBLE, MPI_MAX, comm);
        best = fmin(best, last);
    }
    return best;
}

// -probe: the machine's speed now, for a sweep that runs long after its calibration (this VM's
// speed wanders from one minute to the next; dev/bench/sweep.sh -calibrate probes before each
// run): rank 0's lone work of step 3, share_gemms and share_triads, each the better of 2 rounds
// as together_seconds times it, printed as "gemm_seconds G triad_seconds T", to be set against
// the medians the calibration wrote in its profile ("lone medians")
static double lone_seconds(void (*work)(ShareWork*), ShareWork* k) {
    double best = 1e30;
    for (int round = 0; round < 2; round++) {
        double t0 = wall_time_s();
        work(k);
        best = fmin(best, wall_time_s() - t0);
    }
    return best;
}

static int probe(int threads) {
    omp_set_num_threads(threads);
    Rng rng;
    rng_init(&rng, 1);
    ShareWork k;
    share_work_alloc(&k, large_shapes, last_level_cache_bytes(), &rng);
    double gemm_s = lone_seconds(share_gemms, &k), triad_s = lone_seconds(share_triads, &k);
    printf("gemm_seconds %.6g triad_seconds %.6g\n", gemm_s, triad_s);
    share_work_free(&k);
    return 0;
}

// The fraction of a lone rank's rate each of comm's ranks reaches running `work` all at once: rank
// 0's time alone (the others waiting quietly) over theirs together, the two taken in turn
// SHARE_PAIRS times and the median of the ratios, on rank 0 (this VM's rate drifts by as much as
// the fractions differ between two measurements minutes apart); *together_s their median time,
// lone_s rank 0's times alone
#define SHARE_PAIRS 3
static double shared_fraction(MPI_Comm comm, void (*work)(ShareWork*), ShareWork* k, double* together_s,
                              double lone_s[SHARE_PAIRS]) {
    int rank;
    MPI_Comm_rank(comm, &rank);
    double ratio[SHARE_PAIRS], together[SHARE_PAIRS];
    for (int i = 0; i < SHARE_PAIRS; i++) {
        lone_s[i] = rank == 0 ? together_seconds(MPI_COMM_SELF, work, k) : 0.0;  // (kept: the drift, below)
        quiet_barrier(comm);
        together[i] = together_seconds(comm, work, k);
        ratio[i] = lone_s[i] / together[i];
    }
    *together_s = median_of(together, SHARE_PAIRS);
    return median_of(ratio, SHARE_PAIRS);
}

// The cores a waiting rank takes: `computing` ranks (the cores) run the GEMMs while as many more wait
// in MPI_Recv for rank 0's word that they are done, as a pipeline's idle stage waits for its
// input; the computing ranks' time over their time alone (the 2-rank measurement). MPI polls
// while it waits, yielding the core when others want it (Open MPI does when it knows it is
// oversubscribed: mpirun --oversubscribe); how much it still takes is what this measures.
static double beside_waiting_seconds(MPI_Comm comm, int computing, ShareWork* k) {
    int rank, size;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    MPI_Comm workers;
    MPI_Comm_split(comm, rank < computing, rank, &workers);
    MPI_Barrier(comm);
    double last = 0.0;
    int word = 1;
    if (rank < computing) {
        last = together_seconds(workers, share_gemms, k);  // (both rounds beside the waiting ranks)
        if (rank == 0) {
            for (int r = computing; r < size; r++) MPI_Send(&word, 1, MPI_INT, r, 2, comm);
        }
    } else {
        MPI_Recv(&word, 1, MPI_INT, 0, 2, comm, MPI_STATUS_IGNORE);  // (blocking: it polls)
    }
    MPI_Comm_free(&workers);
    MPI_Bcast(&last, 1, MPI_DOUBLE, 0, comm);
    return last;
}

// bytes/s of memcpy over 64 MB (a read and a write each byte: its bytes counted once, as a
// copy's are), the best of 3 rounds, and the seconds of an 8-byte one (called through a volatile
// pointer, so that the compiler cannot turn it into a store or drop it)
static void* (*volatile copy_bytes)(void*, const void*, size_t) = memcpy;
static double memcpy_bandwidth(double* small_seconds) {
    size_t n = (size_t)64 << 20;
    char* src = (char*)malloc_check(n);
    char* dst = (char*)malloc_check(n);
    memset(src, 1, n), memset(dst, 0, n);
    double best;
    BEST_SECONDS(best, 2, copy_bytes(dst, src, n));
    BEST_SECONDS(*small_seconds, 100000, copy_bytes(dst, src, 8));
    free(src), free(dst);
    return n / best;
}

// ----------------------------------------------------------------------------------------------
// ----------------------------------------------------------------------------------------------
// Collectives of groups smaller than the world. A trainer's grid splits its ranks into groups (tp
// pairs, cp pairs, ZeRO's dp group) that all run their collectives at the same moment, and on a
// host whose cores the ranks share, where a group's ranks sit moves its time by up to 2 times:
// ranks on one core take turns, ranks on two wait for each other. Measured here as dev/bench/
// sweep.sh runs the trainers, every rank pinned to a core round robin (mpirun --bind-to core
// --map-by core): consecutive ranks are on different cores, ranks K apart (K cores) on the same.

// K, the cores the ranks are pinned to round robin (rank r on the same core as rank r mod K, the
// K cores' CPUs disjoint), from every rank's affinity; 0 when they are not pinned so (--bind-to
// none: every rank may run anywhere; or a map of another order), or all on one core
static int pinned_round_robin(MPI_Comm world) {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) != 0) CPU_ZERO(&set);  // (unknown: an empty set)
    int size;
    MPI_Comm_size(world, &size);
    cpu_set_t* sets = (cpu_set_t*)calloc_check((size_t)size, sizeof(cpu_set_t));
    MPI_Allgather(&set, (int)sizeof(cpu_set_t), MPI_BYTE, sets, (int)sizeof(cpu_set_t), MPI_BYTE, world);
    int K = 1;
    while (K < size && !CPU_EQUAL(&sets[K], &sets[0])) K++;  // (the first rank back on rank 0's core)
    int round_robin = K > 1;
    for (int r = 0; r < size; r++) {
        round_robin &= CPU_COUNT(&sets[r]) > 0 && CPU_EQUAL(&sets[r], &sets[r % K]);
        for (int q = 0; q < r && r < K; q++) {
            cpu_set_t both;
            CPU_AND(&both, &sets[q], &sets[r]);
            round_robin &= CPU_COUNT(&both) == 0;
        }
    }
    free(sets);
    return round_robin ? K : 0;
}

#define GROUP_SIZES 2
static const int group_sizes[GROUP_SIZES] = {2, 4};
static const char* const group_places[2] = {"across cores", "on one core"};

// Every group of G ranks at once, across the cores (consecutive ranks) or on one core (ranks K
// apart): each collective at 2 MB and 32 MB, every round started by the whole world together, the
// slowest group's (the world waits for it; each its median of 4 rounds), into t[kind][2 MB, 32 MB] and the bandwidth of the bytes past 2 MB, as
// a measured collective's beyond_2mb, into beyond[kind] (0: the larger took no longer). 0 when
// the world cannot be split so (G not below it, or no K-apart groups of G).
static int time_groups(int G, int on_one_core, int K, float* buf, float* out, double t[TIMED_KINDS][2],
                       double beyond[TIMED_KINDS]) {
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (G >= size || size % G != 0) return 0;
    if (on_one_core && (size <= K || size % K != 0 || (size / K) % G != 0)) return 0;
    int color = on_one_core ? (rank % K) * size + (rank / K) / G : rank / G;
    MPI_Comm group;
    MPI_Comm_split(MPI_COMM_WORLD, color, rank, &group);
    const size_t bytes[2] = {message_bytes(FIT_TO), message_bytes(MESSAGE_SIZES - 1)};
    for (int kind = 0; kind < TIMED_KINDS; kind++) {
        for (int b = 0; b < 2; b++) {
            double mine = time_collective((TimedCollective)kind, buf, out, bytes[b], group, 1, MPI_COMM_WORLD);
            MPI_Allreduce(&mine, &t[kind][b], 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        }
        beyond[kind] = t[kind][1] > t[kind][0] ? (double)(bytes[1] - bytes[0]) / (t[kind][1] - t[kind][0]) : 0.0;
    }
    MPI_Comm_free(&group);
    return 1;
}

// -check and -fit: no MPI

static int check(const char* name_or_path) {
    DeviceProfile p;
    char why[2048];
    if (!device_profile_load(name_or_path, &p, why, sizeof(why))) {
        fprintf(stderr, "error: %s\n", why);
        return 1;
    }
    device_profile_print(stdout, &p);
    return 0;
}

static int fit_file(const char* path) {
    FILE* f = fopen(path, "r");
    if (f == NULL) {
        fprintf(stderr, "error: -fit %s: %s\n", path, strerror(errno));
        return 1;
    }
    double n[256], t[256];
    int count = 0;
    while (count < 256 && fscanf(f, "%lf %lf", &n[count], &t[count]) == 2) count++;
    int trailing = fscanf(f, " %*s") != EOF;  // anything left that is not a pair of numbers
    fclose(f);
    double alpha, beta;
    const char* why = NULL;
    if (trailing) why = "a line that is not \"bytes seconds\" (or over 256 lines)";
    if (why != NULL || !fit_alpha_beta(n, t, count, 0.0, &alpha, &beta, &why)) {
        fprintf(stderr, "error: -fit %s: %s\n", path, why);
        return 1;
    }
    printf("alpha %.17g s, beta %.17g bytes/s\n", alpha, beta);
    return 0;
}

int main(int argc, char** argv) {
    const char* out_path = NULL;
    int threads = 1, probing = 0;
    for (int i = 1; i < argc; i++) {
        int has_value = i + 1 < argc;
        if (strcmp(argv[i], "-check") == 0 && has_value) return check(argv[i + 1]);
        if (strcmp(argv[i], "-fit") == 0 && has_value) return fit_file(argv[i + 1]);
        if (strcmp(argv[i], "-probe") == 0) {
            probing = 1;
        } else if (strcmp(argv[i], "-o") == 0 && has_value) {
            out_path = argv[++i];
        } else if (strcmp(argv[i], "-threads") == 0 && has_value) {
            char* end;
            long v = strtol(argv[++i], &end, 10);
            if (*end != '\0' || v < 1 || v > 1024) die("-threads %s: expected a whole number from 1 to 1024", argv[i]);
            threads = (int)v;
        } else {
            die("%s: unknown flag or a flag without its value. Usage:\n"
                "  mpirun --oversubscribe -np 8 %s -o FILE [-threads N]   measure this machine, write its profile to FILE\n"
                "  %s -probe [-threads N]                 time the lone rank's GEMMs and triads now (a sweep's drift)\n"
                "  %s -check FILE|NAME                    read a profile and print it\n"
                "  %s -fit FILE                           fit t = alpha + bytes / beta to \"bytes seconds\" lines",
                argv[i], argv[0], argv[0], argv[0], argv[0]);
        }
    }
    if (probing) return probe(threads);
    if (out_path == NULL) die("-o FILE: where to write the profile (e.g. dev/profiles/cpu-this-machine.txt)");
    MPI_Init(&argc, &argv);
    mpi_started = 1;
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != 2 && size != 4 && size != 8) {
        die("calibrate measures the link between 2 ranks of this host, and ranks sharing it on 4 or 8: run it as\n"
            "  mpirun --oversubscribe --bind-to none -np 8 %s -o %s   (or -np 2, -np 4; not %d ranks)", argv[0], out_path, size);
    }
    double t_start = wall_time_s();
    int cores = (int)sysconf(_SC_NPROCESSORS_ONLN);  // (the host's: mpirun binds a rank to fewer)

    // 1. MPI between ranks 0 and 1 (the others asleep)
    MPI_Comm pair;
    MPI_Comm_split(MPI_COMM_WORLD, rank < 2 ? 0 : MPI_UNDEFINED, rank, &pair);
    // (t_coll[kind][c][i]: collective `kind` over counts[c] = 1, 2, 4, 8 ranks at message_bytes(i))
    const int counts[4] = {1, 2, 4, 8};
    double n[MESSAGE_SIZES], t_msg[MESSAGE_SIZES], t_coll[TIMED_KINDS][4][MESSAGE_SIZES];
    size_t most = message_bytes(MESSAGE_SIZES - 1);
    char* buf = (char*)calloc_check(most, 1);
    float* scattered = (float*)calloc_check(most / 2, 1);  // (a reduce-scatter's output, over 2 ranks or more)
    for (int i = 0; i < MESSAGE_SIZES; i++) n[i] = (double)message_bytes(i);
    if (rank < 2) {
        for (int i = 0; i < MESSAGE_SIZES; i++) {
            t_msg[i] = time_message(buf, message_bytes(i), rank, pair);
            for (int kind = 0; kind < TIMED_KINDS; kind++) {
                t_coll[kind][1][i] = time_collective((TimedCollective)kind, (float*)buf, scattered, message_bytes(i), pair, 0, pair);
            }
        }
        MPI_Comm_free(&pair);
    }
    quiet_barrier(MPI_COMM_WORLD);
    double msg_alpha = 0, msg_beta = 0, coll_alpha[TIMED_KINDS][4] = {{0}}, coll_beta[TIMED_KINDS][4] = {{0}};
    const char* why = NULL;
    int fitted = FIT_TO + 1 - FIT_FROM;
    double coll_beyond[TIMED_KINDS][4] = {{0}};
    if (rank == 0) {
        if (!fit_alpha_beta(n + FIT_FROM, t_msg + FIT_FROM, fitted, t_msg[0], &msg_alpha, &msg_beta, &why)) {
            die("the messages' fit: %s", why);
        }
        for (int kind = 0; kind < TIMED_KINDS; kind++) {
            const double* t = t_coll[kind][1];
            if (!fit_alpha_beta(n + FIT_FROM, t + FIT_FROM, fitted, t[0], &coll_alpha[kind][1], &coll_beta[kind][1], &why)) {
                die("the %ss' fit: %s", timed_names[kind], why);
            }
            coll_beyond[kind][1] = beyond_2mb_bandwidth(n, t);
        }
        printf("MPI between 2 ranks of this host (best of 4 rounds; fit t = alpha + bytes / beta from %.0f to %.0f bytes,\n"
               "each point weighted by 1/t^2, alpha at least the %.0f-byte time; a collective's bytes past %.0f at its\n"
               "beyond_2mb bandwidth, from the last size's time):\n", n[FIT_FROM], n[FIT_TO], n[0], n[FIT_TO]);
        printf("  %10s %11s %9s %11s %9s %11s %9s %11s %9s\n", "bytes", "send us", "fit", "all-reduce", "fit",
               "red-scatter", "fit", "all-gather", "fit");
        for (int i = 0; i < MESSAGE_SIZES; i++) {
            printf("  %10.0f %11.2f %9.2f", n[i], t_msg[i] * 1e6, (msg_alpha + n[i] / msg_beta) * 1e6);
            for (int kind = 0; kind < TIMED_KINDS; kind++) {
                printf(" %11.2f %9.2f", t_coll[kind][1][i] * 1e6,
                       collective_fit_seconds(coll_alpha[kind][1], coll_beta[kind][1], coll_beyond[kind][1], n[i]) * 1e6);
            }
            printf("\n");
        }
        printf("  send/recv: alpha %.2f us, beta %.2f GB/s; all-reduce: alpha %.2f us, beta %.2f GB/s\n", msg_alpha * 1e6,
               msg_beta / 1e9, coll_alpha[TIMED_ALL_REDUCE][1] * 1e6, coll_beta[TIMED_ALL_REDUCE][1] / 1e9);
        printf("  reduce-scatter: alpha %.2f us, beta %.2f GB/s; all-gather: alpha %.2f us, beta %.2f GB/s (n: the whole\n"
               "  buffer, the reduce-scatter's input and the all-gather's output)\n",
               coll_alpha[TIMED_REDUCE_SCATTER][1] * 1e6, coll_beta[TIMED_REDUCE_SCATTER][1] / 1e9,
               coll_alpha[TIMED_ALL_GATHER][1] * 1e6, coll_beta[TIMED_ALL_GATHER][1] / 1e9);
        printf("  past 2 MB: all-reduce %.3f GB/s, reduce-scatter %.3f GB/s, all-gather %.3f GB/s\n",
               coll_beyond[TIMED_ALL_REDUCE][1] / 1e9, coll_beyond[TIMED_REDUCE_SCATTER][1] / 1e9,
               coll_beyond[TIMED_ALL_GATHER][1] / 1e9);
    }

    // 2. compute and memory, rank 0 alone (the others asleep), with `threads` threads
    omp_set_num_threads(threads);
    Rng rng;
    rng_init(&rng, 1 + rank);
    const GemmShape* large = large_shapes;
    GemmShape small[] = {{"qkv", 64, 768, 2304}, {"attproj", 64, 768, 768}};
    GemmShape wide[] = {{"lm head", 128, 256, 50304}};  // (d4's, at the sweeps' B 2 x T 64 tokens)
    double cache_bytes = last_level_cache_bytes(), wide_rate = 0, wide_eff = 0, wide_bytes = 0;
    double large_rate = 0, small_rate = 0, small_eff = 0, small_flops = 0, attention_rate = 0, large_seconds = 0;
    double bandwidth = 0, kernels_bandwidth = 0, memory_eff = 0, copy_bandwidth = 0, copy_small = 0;
    double optimizer_eff = 0, optimizer_bandwidth = 0;
    if (rank == 0) {
        if (threads > omp_get_num_procs()) {
            printf("warning: -threads %d, but this rank may run on %d core%s (mpirun binds ranks to cores: add --bind-to none)\n",
                   threads, omp_get_num_procs(), omp_get_num_procs() == 1 ? "" : "s");
        }
        printf("compute on %d thread%s (of %d cores), the %s GEMM micro-kernel:\n", threads, threads == 1 ? "" : "s", cores,
               gemm_isa().name);
        double large_max, large_min, small_max, small_min;
        GemmClass large_class = gemm_class(large, 2, &rng, &large_max, &large_min);
        large_seconds = large_class.seconds;
        GemmClass small_class = gemm_class(small, 2, &rng, &small_max, &small_min);
        double wide_max, wide_min;
        GemmClass wide_class = gemm_class(wide, 1, &rng, &wide_max, &wide_min);
        wide_bytes = wide_class.bytes / 3.0;  // (a product's, as the model compares with the cache)
        // the class boundary: halfway (geometrically) between the largest small GEMM and the smallest large one
        small_flops = sqrt(small_max * large_min);
        attention_rate = attention_rate_measured(&rng);

        size_t elements = (size_t)32 << 20;
        float* a = (float*)calloc_check(elements, sizeof(float));
        float* b = (float*)malloc_check(elements * sizeof(float));
        float* c = (float*)malloc_check(elements * sizeof(float));
        #pragma omp parallel for num_threads(cores)
        for (size_t i = 0; i < elements; i++) b[i] = 1.0f, c[i] = 2.0f;
        bandwidth = triad_bandwidth(a, b, c, elements, threads);
        optimizer_eff = optimizer_efficiency_measured(&rng, a, b, c, elements, threads);
        optimizer_bandwidth = optimizer_eff * bandwidth;
        free(a), free(b), free(c);
        kernels_bandwidth = kernels_bandwidth_measured(&rng);
        memory_eff = kernels_bandwidth / bandwidth;
        printf("memory: triad %.1f GB/s on %d thread%s; GELU and LayerNorm %.1f GB/s: %.2f of it%s\n", bandwidth / 1e9,
               threads, threads == 1 ? "" : "s", kernels_bandwidth / 1e9, memory_eff, memory_eff > 1 ? " (written as 1)" : "");
        printf("  the optimizer (gradient norm and AdamW over %zu M parameters, in place): %.2f of the triad's, %.1f GB/s\n"
               "  (the median of %d ratios, the two timed in turn)\n",
               OPTIMIZER_PARAMS >> 20, optimizer_eff, optimizer_bandwidth / 1e9, OPTIMIZER_PAIRS);
        // the GEMMs' rates with their bytes' time at the passes' bandwidth taken out (gemm_core_rate)
        large_rate = gemm_core_rate(large_class, fmin(kernels_bandwidth, bandwidth));
        small_rate = gemm_core_rate(small_class, fmin(kernels_bandwidth, bandwidth));
        small_eff = small_rate / large_rate;
        wide_rate = gemm_core_rate(wide_class, fmin(kernels_bandwidth, bandwidth));
        wide_eff = wide_rate / large_rate;
        printf("GEMMs: large class %.1f GFLOP/s as timed, %.1f with their %.0f MB at %.1f GB/s taken out (the peak, by\n"
               "  definition); small class %.1f as timed, %.1f taken out: %.2f of the peak%s\n",
               large_class.flops / large_class.seconds / 1e9, large_rate / 1e9, large_class.bytes / 1e6,
               fmin(kernels_bandwidth, bandwidth) / 1e9, small_class.flops / small_class.seconds / 1e9, small_rate / 1e9,
               small_eff, small_eff > 1 ? " (written as 1: an efficiency is at most 1)" : "");
        printf("  beyond the cache (%.0f MB): the LM head's GEMMs, %.0f MB a product, %.1f GFLOP/s as timed, %.1f taken out:\n"
               "  %.2f of the peak%s\n", cache_bytes / 1048576.0, wide_bytes / 1e6, wide_class.flops / wide_class.seconds / 1e9,
               wide_rate / 1e9, wide_eff, wide_eff > 1 ? " (written as 1)" : "");
        printf("  attention: %.1f GFLOP/s forward and backward (useful causal FLOPs): %.2f of the peak\n",
               attention_rate / 1e9, attention_rate / large_rate);
        copy_bandwidth = memcpy_bandwidth(&copy_small);
        printf("  a copy (memcpy, 64 MB): %.1f GB/s; of 8 bytes: %.3f us (-offload's copies to the host, here in memory)\n",
               copy_bandwidth / 1e9, copy_small * 1e6);
    }
    quiet_barrier(MPI_COMM_WORLD);

    // 3. ranks sharing the host: each rank its own GEMMs' and triad's arrays (the triad's 3 x 64 MB,
    // twice the last-level cache and more), then N = 1, 2, 4, 8 of them at once
    ShareWork k;
    MPI_Bcast(&cache_bytes, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    share_work_alloc(&k, large, cache_bytes, &rng);
    double gemm_s[4] = {0}, triad_s[4] = {0};
    double gemm_fraction[4] = {1, 0, 0, 0}, memory_fraction[4] = {1, 0, 0, 0}, cached_fraction[4] = {1, 0, 0, 0};
    double cached_s[4] = {0}, compute_s[4] = {0}, meet_s[4] = {0}, meet_ratio[4] = {0}, spread_ar_s[4] = {0};
    // rank 0's GEMMs and triads alone, timed again and again over the rest of the calibration (the
    // drift, after this loop): step 2's GEMMs first (each product twice, as share_gemms runs them)
    double gemm_lone[2 + 3 * SHARE_PAIRS], triad_lone[1 + 3 * SHARE_PAIRS];
    int gemm_lone_n = 0, triad_lone_n = 0;
    if (rank == 0) gemm_lone[gemm_lone_n++] = 2.0 * large_seconds;
    for (int c = 0; c < 4 && counts[c] <= size; c++) {
        MPI_Comm some;
        MPI_Comm_split(MPI_COMM_WORLD, rank < counts[c] ? 0 : MPI_UNDEFINED, rank, &some);
        if (rank < counts[c]) {
            if (counts[c] == 1) {  // (a lone rank's times, printed; its fractions are 1)
                gemm_s[c] = together_seconds(some, share_gemms, &k);
                triad_s[c] = together_seconds(some, share_triads, &k);
                cached_s[c] = together_seconds(some, share_cached_triads, &k);
                gemm_lone[gemm_lone_n++] = gemm_s[c], triad_lone[triad_lone_n++] = triad_s[c];
            } else {
                double lone[SHARE_PAIRS];
                gemm_fraction[c] = shared_fraction(some, share_gemms, &k, &gemm_s[c], lone);
                for (int i = 0; i < SHARE_PAIRS; i++) gemm_lone[gemm_lone_n++] = lone[i];
                memory_fraction[c] = shared_fraction(some, share_triads, &k, &triad_s[c], lone);
                for (int i = 0; i < SHARE_PAIRS; i++) triad_lone[triad_lone_n++] = lone[i];
                cached_fraction[c] = shared_fraction(some, share_cached_triads, &k, &cached_s[c], lone);
            }
            if (counts[c] >= 2) {  // the arrival spread: compute then meet, against the compute alone
                spread_comm = some;
                // (the two taken in turn, SPREAD_PAIRS times, and the median of each pair's ratio: the
                // wait is a few percent of either, and the machine's speed moves by more than that
                // from one second to the next, so a median of each taken apart would differ by the
                // drift between them; at 4 ranks such medians gave 0 to 0.31 minutes apart)
                double alone[SPREAD_PAIRS], meeting[SPREAD_PAIRS], ratio[SPREAD_PAIRS];
                for (int i = 0; i < SPREAD_PAIRS; i++) {
                    alone[i] = together_seconds(some, share_compute, &k);
                    meeting[i] = together_seconds(some, share_compute_and_meet, &k);
                    ratio[i] = meeting[i] / alone[i];
                }
                meet_ratio[c] = median_of(ratio, SPREAD_PAIRS);
                compute_s[c] = median_of(alone, SPREAD_PAIRS), meet_s[c] = median_of(meeting, SPREAD_PAIRS);
                spread_ar_s[c] = time_collective(TIMED_ALL_REDUCE, k.reduced, NULL, SPREAD_BYTES, some, counts[c] > 2, some);
            }
            if (counts[c] >= 4) {
                for (int kind = 0; kind < TIMED_KINDS; kind++) {
                    for (int i = 0; i < MESSAGE_SIZES; i++) {
                        t_coll[kind][c][i] = time_collective((TimedCollective)kind, (float*)buf, scattered, message_bytes(i), some, 1, some);
                    }
                }
            }
            MPI_Comm_free(&some);
        }
        quiet_barrier(MPI_COMM_WORLD);
    }
    // the waiting ranks' share: the cores computing beside as many waiting (when there are enough ranks)
    // (the two in turn, SHARE_PAIRS times, the median ratio on rank 0, as shared_fraction's)
    double alone_s = 0.0, beside_s = 0.0, beside_ratio = 0.0;
    int waiting = 2 * cores <= size;
    if (waiting) {
        MPI_Comm some, workers;
        MPI_Comm_split(MPI_COMM_WORLD, rank < 2 * cores ? 0 : MPI_UNDEFINED, rank, &some);
        if (rank < 2 * cores) {
            MPI_Comm_split(some, rank < cores ? 0 : MPI_UNDEFINED, rank, &workers);
            double alone[SHARE_PAIRS], beside[SHARE_PAIRS], ratio[SHARE_PAIRS];
            for (int i = 0; i < SHARE_PAIRS; i++) {
                alone[i] = rank < cores ? together_seconds(workers, share_gemms, &k) : 0.0;
                quiet_barrier(some);
                beside[i] = beside_waiting_seconds(some, cores, &k);
                ratio[i] = alone[i] > 0.0 ? beside[i] / alone[i] : 0.0;
            }
            if (rank < cores) MPI_Comm_free(&workers);
            alone_s = median_of(alone, SHARE_PAIRS), beside_s = median_of(beside, SHARE_PAIRS);
            beside_ratio = median_of(ratio, SHARE_PAIRS);
            MPI_Comm_free(&some);
        }
        quiet_barrier(MPI_COMM_WORLD);
    }
    // the groups' collectives (every rank; rank 0 prints them below)
    int pinned_cores = size >= 4 ? pinned_round_robin(MPI_COMM_WORLD) : 0;
    double group_t[GROUP_SIZES][2][TIMED_KINDS][2], group_beyond[GROUP_SIZES][2][TIMED_KINDS];
    int group_measured[GROUP_SIZES][2] = {{0}};
    for (int g = 0; g < GROUP_SIZES && pinned_cores; g++) {
        for (int place = 0; place < 2; place++) {
            group_measured[g][place] = time_groups(group_sizes[g], place, pinned_cores, (float*)buf, scattered,
                                                   group_t[g][place], group_beyond[g][place]);
        }
    }
    quiet_barrier(MPI_COMM_WORLD);
    free(buf), free(scattered);
    share_work_free(&k);
    if (rank != 0) {
        quiet_barrier(MPI_COMM_WORLD);  // (until rank 0 has written the profile)
        MPI_Finalize();
        return 0;
    }
    // The machine's drift. This VM's speed wanders by 10-20% from one minute to the next (two
    // calibrations a minute apart timed the large GEMMs at 71 and 83 GFLOP/s), and step 2 timed each
    // rate once, at one moment. Rank 0 timed the same GEMMs and triads alone again and again above,
    // in turn with the shared runs: step 2's rates are scaled to their median over the whole
    // calibration (the GEMM classes, attention and the host's rate by the GEMMs' drift, the
    // bandwidths by the triads'; the triads' first lone time, 1 rank at once, is the nearest to step
    // 2's triad). The efficiencies and fractions are ratios of times taken together or in turn:
    // the drift cancels in them.
    double gemm_first = gemm_lone[0], triad_first = triad_lone[0];
    double gemm_median = median_of(gemm_lone, gemm_lone_n), triad_median = median_of(triad_lone, triad_lone_n);
    double gemm_drift = gemm_first / gemm_median, triad_drift = triad_first / triad_median;
    printf("drift: the lone rank's GEMMs timed %d times over the calibration, %.3f to %.3f s (step 2's %.3f): its\n"
           "  rates x %.3f, %.1f GFLOP/s; its triads %d times, %.3f to %.3f s (the first %.3f): bandwidths x %.3f\n",
           gemm_lone_n, gemm_lone[0], gemm_lone[gemm_lone_n - 1], gemm_first, gemm_drift, large_rate * gemm_drift / 1e9,
           triad_lone_n, triad_lone[0], triad_lone[triad_lone_n - 1], triad_first, triad_drift);
    large_rate *= gemm_drift, small_rate *= gemm_drift, wide_rate *= gemm_drift, attention_rate *= gemm_drift;
    bandwidth *= triad_drift, kernels_bandwidth *= triad_drift, optimizer_bandwidth *= triad_drift;

    double meeting_fraction[4] = {0, 0, 0, 0};
    printf("ranks sharing this host (%d cores; each rank: d12's fc and fcproj GEMMs, %.1f GFLOP, and 4 triads over 3 x 64 MB;\n"
           "the time until the last rank is done, the better of 2 rounds; the fraction of a lone rank's rate each reaches:\n"
           "a lone rank's time over theirs, taken in turn 3 times, the median ratio):\n",
           cores, 2 * 2 * 3 * 2.0 * 512 * 768 * 3072 / 1e9);
    for (int c = 0; c < 4 && counts[c] <= size; c++) {
        printf("  %d rank%s at once: GEMMs %.3f s, %.2f of a lone rank's rate; triads %.3f s, %.2f of its bandwidth; in the\n"
               "    cache (3 x %.0f KB a rank) %.3f s, %.2f\n", counts[c], counts[c] == 1 ? "" : "s", gemm_s[c],
               gemm_fraction[c], triad_s[c], memory_fraction[c], k.cached_n * 4.0 / 1024.0, cached_s[c], cached_fraction[c]);
        gemm_fraction[c] = fmin(1.0, gemm_fraction[c]);
        memory_fraction[c] = fmin(1.0, memory_fraction[c]);
        cached_fraction[c] = fmin(1.0, cached_fraction[c]);
        if (counts[c] >= 2) {  // (what meeting costs beyond the compute and the all-reduce themselves)
            // (the wait a round over the compute a round: ranks arriving apart wait for a share of
            // what the others still compute, so the model takes it as a fraction of the compute;
            // a round's wait is the median pair's extra time at the compute's median, less the
            // all-reduce itself)
            double round_s = compute_s[c] / SPREAD_ROUNDS;
            double wait_s = fmax(0.0, (meet_ratio[c] - 1.0) * round_s - spread_ar_s[c]);
            meeting_fraction[c] = fmin(1.0, wait_s / round_s);
            printf("    %d x (fc forward at 64 tokens, then an all-reduce of %d bytes): %.2f ms a round, the compute alone\n"
                   "    %.2f, the all-reduce alone %.3f: each collective waits %.3f ms for the ranks arriving apart,\n"
                   "    %.1f%% of the compute before it (medians of %d of each taken in turn; the wait from the\n"
                   "    median of the pairs' ratios, %.3f)\n",
                   SPREAD_ROUNDS, SPREAD_BYTES, meet_s[c] / SPREAD_ROUNDS * 1e3, compute_s[c] / SPREAD_ROUNDS * 1e3,
                   spread_ar_s[c] * 1e3, wait_s * 1e3, meeting_fraction[c] * 100.0, SPREAD_PAIRS, meet_ratio[c]);
        }
        if (counts[c] >= 4) {
            // (alpha's floor: the quickest of the sizes below the fit's, rather than the 8-byte one's
            // alone: ranks taking turns on the cores make any one of them slow now and then)
            for (int kind = 0; kind < TIMED_KINDS; kind++) {
                const double* t = t_coll[kind][c];
                double floor_s = t[0];
                for (int i = 1; i < FIT_FROM; i++) floor_s = fmin(floor_s, t[i]);
                int fits = fit_alpha_beta(n + FIT_FROM, t + FIT_FROM, fitted, floor_s, &coll_alpha[kind][c],
                                          &coll_beta[kind][c], &why);
                printf("    %s over the %d (median of 4 rounds), us:", timed_names[kind], counts[c]);
                for (int i = 0; i < MESSAGE_SIZES; i++) printf(" %.0f", t[i] * 1e6);
                if (fits) {
                    coll_beyond[kind][c] = beyond_2mb_bandwidth(n, t);
                    printf("\n    fit from %.0f to %.0f bytes: alpha %.2f us, beta %.3f GB/s; past them %.3f GB/s\n", n[FIT_FROM],
                           n[FIT_TO], coll_alpha[kind][c] * 1e6, coll_beta[kind][c] / 1e9, coll_beyond[kind][c] / 1e9);
                } else {  // (left out of the profile: the model then takes the collective of the fewer ranks measured)
                    printf("\n    warning: no fit (%s: other work on the machine?), left out of the profile\n", why);
                    coll_alpha[kind][c] = coll_beta[kind][c] = 0.0;
                }
            }
        }
    }
    double wait_slowdown = 0.0;
    if (waiting) {
        wait_slowdown = fmin(2.0, fmax(1.0, beside_ratio));
        printf("  %d ranks computing: %.3f s alone, %.3f s beside %d ranks waiting in MPI_Recv (medians of %d in turn): %.2f\n"
               "  times%s\n", cores, alone_s, beside_s, cores, SHARE_PAIRS, beside_ratio,
               beside_ratio != wait_slowdown ? " (written within [1, 2])" : "");
    }
    if (size >= 4 && !pinned_cores) {
        printf("groups smaller than the world: not measured, the ranks are not pinned to the cores round robin (as\n"
               "  dev/bench/sweep.sh runs them: mpirun --bind-to core:overload-allowed --map-by core)\n");
    } else if (size >= 4) {
        printf("groups smaller than the world, every group at once, the %d ranks pinned round robin to %d cores (rank r on\n"
               "  core r mod %d): the slowest group's median of 4 rounds at 2 MB and 32 MB, ms, and the bandwidth past 2 MB:\n",
               size, pinned_cores, pinned_cores);
        for (int g = 0; g < GROUP_SIZES; g++) {
            for (int place = 0; place < 2; place++) {
                if (!group_measured[g][place]) continue;
                printf("  %d ranks %-13s", group_sizes[g], group_places[place]);
                for (int kind = 0; kind < TIMED_KINDS; kind++) {
                    printf(" %s %.2f / %.1f, %.3f GB/s%s", timed_names[kind], group_t[g][place][kind][0] * 1e3,
                           group_t[g][place][kind][1] * 1e3, group_beyond[g][place][kind] / 1e9,
                           kind + 1 < TIMED_KINDS ? ";" : "\n");
                }
            }
        }
    }

    // 4. the profile
    DeviceProfile p;
    memset(&p, 0, sizeof(p));
    char host[40] = "this machine";
    gethostname(host, sizeof(host) - 1);
    snprintf(p.name, sizeof(p.name), "CPU of %s, %d thread%s a rank", host, threads, threads == 1 ? "" : "s");
    p.kind = DEVICE_CPU;
    p.peak_flops_fp32 = p.peak_flops_bf16 = large_rate;
    p.memory_bandwidth_bytes_per_s = bandwidth;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    p.memory_bytes = pages > 0 && page > 0 ? (double)pages * page : 1e9;
    p.efficiency_matmul_large = 1.0;
    p.efficiency_matmul_small = fmin(1.0, small_eff);
    p.matmul_small_flops = small_flops;
    p.efficiency_attention = fmin(1.0, attention_rate / large_rate);
    p.efficiency_memory = fmin(1.0, memory_eff);
    p.efficiency_optimizer = fmin(4.0, optimizer_eff);
    // one host: every rank of a run here is "inside the node", so the link across is the same
    p.intra_node_latency_s = p.inter_node_latency_s = msg_alpha;
    p.intra_node_bandwidth_bytes_per_s = p.inter_node_bandwidth_bytes_per_s = msg_beta;
    p.gpus_per_node = 1024;
    p.efficiency_link = 1.0;
    p.cpu_threads = threads;
    p.cpu_cores = cores;
    // the host is the device: -offload's AdamW at the optimizer's passes' bandwidth, its copies memcpy's
    p.host_flops_fp32 = large_rate;
    p.host_memory_bandwidth_bytes_per_s = optimizer_bandwidth;
    p.pcie_latency_s = copy_small;
    p.pcie_bandwidth_bytes_per_s = copy_bandwidth;
    double* gemm_fields[4] = {NULL, &p.cpu_gemm_fraction_2_ranks, &p.cpu_gemm_fraction_4_ranks, &p.cpu_gemm_fraction_8_ranks};
    double* memory_fields[4] = {NULL, &p.cpu_memory_fraction_2_ranks, &p.cpu_memory_fraction_4_ranks,
                                &p.cpu_memory_fraction_8_ranks};
    for (int c = 1; c < 4 && counts[c] <= size; c++) *gemm_fields[c] = gemm_fraction[c], *memory_fields[c] = memory_fraction[c];
    p.cpu_wait_slowdown = wait_slowdown;
    // the collectives over 2, 4 and 8 ranks: each its latency, bandwidth and bandwidth past 2 MB
    // (the 2-rank all-reduce is the profile's intra_node_allreduce_*)
    double* coll_fields[TIMED_KINDS][4][3] = {
        {{NULL, NULL, NULL},
         {&p.intra_node_allreduce_latency_s, &p.intra_node_allreduce_bandwidth_bytes_per_s,
          &p.intra_node_allreduce_bandwidth_beyond_2mb_bytes_per_s},
         {&p.allreduce_4_ranks_latency_s, &p.allreduce_4_ranks_bandwidth_bytes_per_s,
          &p.allreduce_4_ranks_bandwidth_beyond_2mb_bytes_per_s},
         {&p.allreduce_8_ranks_latency_s, &p.allreduce_8_ranks_bandwidth_bytes_per_s,
          &p.allreduce_8_ranks_bandwidth_beyond_2mb_bytes_per_s}},
        {{NULL, NULL, NULL},
         {&p.reducescatter_2_ranks_latency_s, &p.reducescatter_2_ranks_bandwidth_bytes_per_s,
          &p.reducescatter_2_ranks_bandwidth_beyond_2mb_bytes_per_s},
         {&p.reducescatter_4_ranks_latency_s, &p.reducescatter_4_ranks_bandwidth_bytes_per_s,
          &p.reducescatter_4_ranks_bandwidth_beyond_2mb_bytes_per_s},
         {&p.reducescatter_8_ranks_latency_s, &p.reducescatter_8_ranks_bandwidth_bytes_per_s,
          &p.reducescatter_8_ranks_bandwidth_beyond_2mb_bytes_per_s}},
        {{NULL, NULL, NULL},
         {&p.allgather_2_ranks_latency_s, &p.allgather_2_ranks_bandwidth_bytes_per_s,
          &p.allgather_2_ranks_bandwidth_beyond_2mb_bytes_per_s},
         {&p.allgather_4_ranks_latency_s, &p.allgather_4_ranks_bandwidth_bytes_per_s,
          &p.allgather_4_ranks_bandwidth_beyond_2mb_bytes_per_s},
         {&p.allgather_8_ranks_latency_s, &p.allgather_8_ranks_bandwidth_bytes_per_s,
          &p.allgather_8_ranks_bandwidth_beyond_2mb_bytes_per_s}}};
    for (int kind = 0; kind < TIMED_KINDS; kind++) {
        for (int c = 1; c < 4 && counts[c] <= size; c++) {
            *coll_fields[kind][c][0] = coll_alpha[kind][c], *coll_fields[kind][c][1] = coll_beta[kind][c];
            *coll_fields[kind][c][2] = coll_beyond[kind][c];
        }
    }
    double* meeting_fields[4] = {NULL, &p.cpu_meeting_fraction_2_ranks, &p.cpu_meeting_fraction_4_ranks,
                                 &p.cpu_meeting_fraction_8_ranks};
    double* cached_fields[4] = {NULL, &p.cpu_memory_cached_fraction_2_ranks, &p.cpu_memory_cached_fraction_4_ranks,
                                &p.cpu_memory_cached_fraction_8_ranks};
    for (int c = 1; c < 4 && counts[c] <= size; c++) *meeting_fields[c] = meeting_fraction[c], *cached_fields[c] = cached_fraction[c];
    p.cpu_cache_bytes = cache_bytes;
    p.efficiency_matmul_beyond_cache = fmin(1.0, wide_eff);
    // the groups' bandwidths past 2 MB, with the world and the cores they were measured on
    double* group_fields[TIMED_KINDS][GROUP_SIZES][2] = {
        {{&p.allreduce_groups_of_2_across_cores_bytes_per_s, &p.allreduce_groups_of_2_on_one_core_bytes_per_s},
         {&p.allreduce_groups_of_4_across_cores_bytes_per_s, &p.allreduce_groups_of_4_on_one_core_bytes_per_s}},
        {{&p.reducescatter_groups_of_2_across_cores_bytes_per_s, &p.reducescatter_groups_of_2_on_one_core_bytes_per_s},
         {&p.reducescatter_groups_of_4_across_cores_bytes_per_s, &p.reducescatter_groups_of_4_on_one_core_bytes_per_s}},
        {{&p.allgather_groups_of_2_across_cores_bytes_per_s, &p.allgather_groups_of_2_on_one_core_bytes_per_s},
         {&p.allgather_groups_of_4_across_cores_bytes_per_s, &p.allgather_groups_of_4_on_one_core_bytes_per_s}}};
    for (int g = 0; g < GROUP_SIZES; g++) {
        for (int place = 0; place < 2; place++) {
            for (int kind = 0; kind < TIMED_KINDS && group_measured[g][place]; kind++) {
                *group_fields[kind][g][place] = group_beyond[g][place][kind];
                if (group_beyond[g][place][kind] > 0.0) p.cpu_groups_world = size, p.cpu_groups_cores = pinned_cores;
            }
        }
    }

    // written to a temporary name and renamed, so a failed run leaves no half-written profile
    char tmp[4096];
    snprintf(tmp, sizeof(tmp), "%s.tmp", out_path);
    FILE* f = fopen(tmp, "w");
    if (f == NULL) die("-o %s: cannot write %s: %s", out_path, tmp, strerror(errno));
    time_t now = time(NULL);
    char when[32];
    strftime(when, sizeof(when), "%Y-%m-%d %H:%M UTC", gmtime(&now));
    fprintf(f,
            "# This machine's CPU, measured by dev/bench/calibrate on %s (mpirun -np %d ./dev/bench/calibrate -o FILE\n"
            "# -threads %d; the format: llmc/device_profile.h). Measured, not from a datasheet:\n"
            "#   peak_flops: the project's GEMM (llmc/cpu/matmul.h) on d12's fc and fcproj at 512 tokens, forward,\n"
            "#     dinp and dweight: %.1f GFLOP/s on %d thread%s once their bytes' time at the memory-bound passes'\n"
            "#     bandwidth is taken out (on a CPU the model adds the two), so efficiency_matmul_large is 1 by definition;\n"
            "#     qkv and attproj at 64 tokens ran at %.1f GFLOP/s so (efficiency_matmul_small); below %.3g FLOPs a GEMM is small.\n"
            "#   attention: llmc/cpu/attention.h at d12's B 4, T 64, 12 heads, %.1f GFLOP/s of useful causal FLOPs.\n"
            "#   memory: STREAM's triad over 3 x 128 MB, %.1f GB/s; GELU and LayerNorm,\n"
            "#     forward and backward at d12's B 4, T 64, %.1f GB/s of their least bytes (efficiency_memory);\n"
            "#     the optimizer's passes (gradient norm, AdamW) over 16M parameters, %.1f GB/s (efficiency_optimizer).\n"
            "#   drift: each rate above is step 2's scaled to the median of the lone rank's GEMMs (%d times) and\n"
            "#     triads (%d times) timed in turn with the shared runs over the calibration: x %.3f and x %.3f.\n"
            "#   lone medians: gemm_seconds %.6g triad_seconds %.6g (calibrate -probe times the same work: a sweep\n"
            "#     long after the calibration scales the rates by them, dev/bench/sweep.sh)\n"
            "#   links: MPI between 2 ranks of this host, 2 KB to 2 MB, fit t = alpha + bytes / beta (weights 1/t^2):\n"
            "#     send/recv %.2f us + bytes / %.2f GB/s; all-reduce %.2f us + bytes / %.2f GB/s; reduce-scatter and\n"
            "#     all-gather the same way (bytes: the whole buffer), on 2 ranks and as many as below; each collective's\n"
            "#     bytes past 2 MB at the bandwidth between its 2 MB and 32 MB times (_beyond_2mb). One host, so the\n"
            "#     inter-node figures repeat the intra-node ones, and gpus_per_node is large: every rank shares it.\n"
            "#   the host (-offload): the GEMM rate, the optimizer's passes' bandwidth, memcpy %.1f GB/s after %.3f us.\n"
            "#   ranks sharing the host (%d ranks at most here): each of N ranks computing at once reached the\n"
            "#     fractions cpu_*_fraction_N_ranks of a lone rank's GEMM rate and triad bandwidth; the collectives\n"
            "#     over 4 and 8 ranks (the median of 4 rounds, fit as above); cpu_wait_slowdown: %d ranks'\n"
            "#     GEMMs beside as many ranks waiting in MPI_Recv over the same GEMMs alone.\n"
            "#   beyond that: cpu_meeting_fraction_N_ranks, N ranks %d times computing d12's fc forward at 64 tokens\n"
            "#     then an all-reduce of %d bytes, over the compute alone taken in turn (the median pair's ratio), less\n"
            "#     1 and the all-reduce alone's share;\n"
            "#     cpu_memory_cached_fraction_N_ranks, the triad's fractions on arrays of 8 ranks in half the\n"
            "#     cache (cpu_cache_bytes, sysfs's); efficiency_matmul_beyond_cache, the LM head of d4 (128 x 256\n"
            "#     times 256 x 50304, %.0f MB a product) at %.1f GFLOP/s, its bytes' time out, over the peak.\n",
            when, size, threads, large_rate / 1e9, threads, threads == 1 ? "" : "s", small_rate / 1e9, small_flops,
            attention_rate / 1e9, bandwidth / 1e9, kernels_bandwidth / 1e9, optimizer_bandwidth / 1e9, gemm_lone_n, triad_lone_n, gemm_drift, triad_drift,
            gemm_median, triad_median,
            msg_alpha * 1e6, msg_beta / 1e9, coll_alpha[TIMED_ALL_REDUCE][1] * 1e6, coll_beta[TIMED_ALL_REDUCE][1] / 1e9, copy_bandwidth / 1e9, copy_small * 1e6,
            size, cores, SPREAD_ROUNDS, SPREAD_BYTES, wide_bytes / 1e6, wide_rate / 1e9);
    if (p.cpu_groups_world > 0) {
        fprintf(f,
                "#   groups: X_groups_of_G_*, the world's %d ranks pinned round robin to %d cores (cpu_groups_*) and split\n"
                "#     into groups of G, consecutive ranks (across cores) or %d apart (on one core), every group running\n"
                "#     the collective at once: the bandwidth past 2 MB, between the slowest group's 2 MB and 32 MB times.\n",
                size, pinned_cores, pinned_cores);
    }
    device_profile_print(f, &p);
    if (fclose(f) != 0 || rename(tmp, out_path) != 0) die("-o %s: could not write it: %s", out_path, strerror(errno));
    // read back, as a user's run of the model will read it
    DeviceProfile back;
    char reason[2048];
    if (!device_profile_load(out_path, &back, reason, sizeof(reason))) die("the profile written does not read back: %s", reason);
    printf("wrote %s in %.1f s:\n", out_path, wall_time_s() - t_start);
    device_profile_print(stdout, &back);

    quiet_barrier(MPI_COMM_WORLD);  // the others may finish
    MPI_Finalize();
    return 0;
}
