/*
Mixture-of-Experts on CUDA (llmc/cuda/moe.cuh), checked against the CPU backend (llmc/cpu/moe.h).
  make dev/cuda/moe && ./dev/cuda/moe
First the routing, on random router logits (N, E) and a random bias: each token's top-k, gates
and P (a thread a token), the capacity and the send order (a block an expert, scanning the slots
with a prefix sum, where the CPU runs one serial loop over them; the experts and rows must be
identical to the CPU's, counts included), each
sequence's f and P, and the router's gradient.
Then the row moves on a random routing: N tokens of C values, k slots each, some dropped (-1), the
kept ones at distinct rows of the send order.
v1 (the library's): a block a row, its threads along C; the combine sums a token's slots in fp32
    in slot order; the gates' gradients a warp a slot (a dot product of C over 32 lanes).
Memory-bound: each moves its rows once; the timing reports GB/s.
Then the experts' fc forward as llmc/moe.h runs it, one cuBLASLt GEMM an expert over the rows it
took (uneven counts, as routing leaves them), against the CPU's matmul, timed beside one GEMM over
all the rows (what the experts would cost as one dense MLP of the same rows: the gap is the price
of many small GEMMs of changing shapes).
*/
#include "common.h"
namespace cpu {
#include "llmc/cpu/moe.h"
#include "llmc/cpu/matmul.h"
}
#include "llmc/cuda/moe.cuh"
#include "llmc/cuda/matmul.cuh"

// the routing of N tokens over E experts, top-k, capacity cf (B sequences of N / B tokens)
static int check_routing(int N, int B, int E, int k, float cf) {
    size_t S = (size_t)N * k;
    // (llmc/memory_plan.h's moe_capacity: ceil(cf N k / E), N k when dropless)
    int T = N / B, capacity = cf > 0.0f ? (int)ceil((double)cf * N * k / E) : N * k, ok = 1;
    float* s = random_floats((size_t)N * E, 1.0f);
    float* bias = random_floats(E, 0.1f);
    round_like_floatX(s, (size_t)N * E);  // (the device's logits are floatX)
    int *expert = (int*)malloc_check(S * sizeof(int)), *row = (int*)malloc_check(S * sizeof(int));
    int* counts = (int*)malloc_check(2 * (size_t)E * sizeof(int));
    float *gate = (float*)malloc_check(S * sizeof(float)), *probs = (float*)malloc_check((size_t)N * E * sizeof(float));
    float* shares = (float*)malloc_check((size_t)B * 2 * E * sizeof(float));
    float* ds = (float*)malloc_check((size_t)N * E * sizeof(float));
    float* dgate = random_floats(S, 1.0f);
    float aux_scale = 0.01f * E / N;  // (aux_alpha 0.01, one micro-batch)
    cpu::moe_topk(expert, gate, probs, s, bias, N, E, k);
    cpu::moe_assign_rows(row, counts, expert, N, k, E, capacity);
    cpu::moe_sequence_shares(shares, expert, probs, B, T, 0, N, T, k, E);
    cpu::moe_router_grad(ds, expert, gate, dgate, probs, shares, aux_scale, N, T, 0, k, E);

    floatX* d_s = to_device(s, (size_t)N * E);
    float *d_bias = (float*)device_malloc(E * sizeof(float)), *d_dgate = (float*)device_malloc(S * sizeof(float));
    copy_host_to_device(d_bias, bias, E * sizeof(float));
    copy_host_to_device(d_dgate, dgate, S * sizeof(float));
    int *d_expert = (int*)device_malloc(S * sizeof(int)), *d_row = (int*)device_malloc(S * sizeof(int));
    int* d_counts = (int*)device_malloc(2 * (size_t)E * sizeof(int));
    float *d_gate = (float*)device_malloc(S * sizeof(float)), *d_probs = (float*)device_malloc((size_t)N * E * sizeof(float));
    float* d_shares = (float*)device_malloc((size_t)B * 2 * E * sizeof(float));
    floatX* d_ds = (floatX*)device_malloc((size_t)N * E * sizeof(floatX));
    int kept = 0;
    for (int e = 0; e < E; e++) kept += counts[e];
    printf("routing N=%d (%d sequences) E=%d k=%d, capacity %d slots an expert (cf %g): %d of %zu slots kept\n", N, B, E,
           k, capacity, cf, kept, S);
    float ms;
    moe_topk(d_expert, d_gate, d_probs, d_s, d_bias, N, E, k);
    moe_assign_rows(d_row, d_counts, d_expert, N, k, E, capacity);
    moe_sequence_shares(d_shares, d_expert, d_probs, B, T, 0, N, T, k, E);
    moe_router_grad(d_ds, d_expert, d_gate, d_dgate, d_probs, d_shares, aux_scale, N, T, 0, k, E);
    // the decisions are discrete and the same float comparisons on both sides: identical
    int* got = (int*)malloc_check(S * sizeof(int));
    const char* names[3] = {"v1 top-k experts", "v1 rows (capacity, send order)", "v1 counts (kept, routed)"};
    const int* want[3] = {expert, row, counts};
    const int* have[3] = {d_expert, d_row, d_counts};
    size_t sizes[3] = {S, S, 2 * (size_t)E};
    for (int a = 0; a < 3; a++) {
        copy_device_to_host(got, have[a], sizes[a] * sizeof(int));
        size_t wrong = 0, first = 0;
        for (size_t i = sizes[a]; i-- > 0;) {
            if (got[i] != want[a][i]) wrong++, first = i;
        }
        printf("%-40s %s", names[a], wrong ? "FAILED" : "ok");
        if (wrong) printf(" (%zu of %zu differ; first at %zu: %d, expected %d)", wrong, sizes[a], first, got[first], want[a][first]);
        printf("\n");
        ok &= wrong == 0;
    }
    // (exponentials and sums of E or T terms in fp32, the same order on both sides)
    ok &= validate_f32("v1 gates", d_gate, gate, S, 1e-5f);
    ok &= validate_f32("v1 P = softmax of all E", d_probs, probs, (size_t)N * E, 1e-5f);
    ok &= validate_f32("v1 sequence shares f, P", d_shares, shares, (size_t)B * 2 * E, 1e-5f);
    ok &= validate("v1 router gradient", d_ds, ds, (size_t)N * E, default_tolerance());
    TIME_KERNEL(ms, 20, moe_topk(d_expert, d_gate, d_probs, d_s, d_bias, N, E, k));
    report("v1 top-k, gates and P", ms, (double)N * E * (sizeof(floatX) + 4) + S * 8, 0);
    TIME_KERNEL(ms, 20, moe_assign_rows(d_row, d_counts, d_expert, N, k, E, capacity));
    report("v1 rows (E blocks scan N k slots each)", ms, (double)S * 4 * (E + 2), 0);
    TIME_KERNEL(ms, 20, moe_router_grad(d_ds, d_expert, d_gate, d_dgate, d_probs, d_shares, aux_scale, N, T, 0, k, E));
    report("v1 router gradient", ms, (double)N * E * (sizeof(floatX) + 4) + S * 12, 0);
    free(s), free(bias), free(expert), free(row), free(counts), free(gate), free(probs), free(shares), free(ds), free(dgate), free(got);
    device_free(d_s), device_free(d_bias), device_free(d_dgate), device_free(d_expert), device_free(d_row);
    device_free(d_counts), device_free(d_gate), device_free(d_probs), device_free(d_shares), device_free(d_ds);
    return ok;
}

int main(void) {
    // a d12 micro-batch of 8 x 1024 tokens over 8 experts, top-2: dropless, then capacity 1.0
    // (drops happen: the random logits are not balanced); the emulator a few sequences of 48
    int ok = 1;
    ok &= check_routing(GPU_OR_EMU(8192, 96), GPU_OR_EMU(8, 2), 8, 2, 0.0f);
    ok &= check_routing(GPU_OR_EMU(8192, 96), GPU_OR_EMU(8, 2), 8, 2, 1.0f);
    ok &= check_routing(GPU_OR_EMU(8192, 300), GPU_OR_EMU(8, 3), 64, 6, 1.25f);  // (wide: E > 32, the chunks cross warps)

    int N = GPU_OR_EMU(8192, 96), k = 2, C = GPU_OR_EMU(768, 64);
    size_t S = (size_t)N * k;
    float* h = random_floats((size_t)N * C, 1.0f);
    float* dout = random_floats((size_t)N * C, 1.0f);
    float* gate = random_floats(S, 1.0f);
    round_like_floatX(h, (size_t)N * C);
    round_like_floatX(dout, (size_t)N * C);
    // a routing: every 7th slot dropped, the others at the rows of a random permutation
    int* row = (int*)malloc_check(S * sizeof(int));
    int* order = (int*)malloc_check(S * sizeof(int));
    int kept = 0;
    for (size_t i = 0; i < S; i++) row[i] = i % 7 == 3 ? -1 : kept++;
    for (int i = 0; i < kept; i++) order[i] = i;
    for (int i = kept - 1; i > 0; i--) {  // Fisher-Yates with the dev rng
        int j = (int)(rng_uniform(&dev_rng) * (i + 1)) % (i + 1), t = order[i];
        order[i] = order[j], order[j] = t;
    }
    for (size_t i = 0; i < S; i++) row[i] = row[i] >= 0 ? order[row[i]] : -1;
    float* rows = (float*)calloc_check((size_t)kept * C, sizeof(float));
    float* weighted = (float*)calloc_check((size_t)kept * C, sizeof(float));
    float* gathered = (float*)malloc_check((size_t)kept * C * sizeof(float));
    float* combined = (float*)malloc_check((size_t)N * C * sizeof(float));
    float* dgate = (float*)malloc_check(S * sizeof(float));
    cpu::moe_dispatch(rows, h, row, gate, N, k, C, /*weighted*/ 0);
    cpu::moe_dispatch(weighted, dout, row, gate, N, k, C, /*weighted*/ 1);
    cpu::moe_gather_rows(gathered, rows, order, kept, C);
    cpu::moe_combine(combined, rows, row, gate, N, k, C, /*weighted*/ 1);
    cpu::moe_gate_grads(dgate, dout, rows, row, N, k, C);

    floatX *d_h = to_device(h, (size_t)N * C), *d_dout = to_device(dout, (size_t)N * C);
    floatX *d_rows = (floatX*)device_malloc((size_t)kept * C * sizeof(floatX)),
           *d_weighted = (floatX*)device_malloc((size_t)kept * C * sizeof(floatX)),
           *d_gathered = (floatX*)device_malloc((size_t)kept * C * sizeof(floatX)),
           *d_combined = (floatX*)device_malloc((size_t)N * C * sizeof(floatX));
    int *d_row = (int*)device_malloc(S * sizeof(int)), *d_order = (int*)device_malloc((size_t)kept * sizeof(int));
    float *d_gate = (float*)device_malloc(S * sizeof(float)), *d_dgate = (float*)device_malloc(S * sizeof(float));
    copy_host_to_device(d_row, row, S * sizeof(int));
    copy_host_to_device(d_order, order, (size_t)kept * sizeof(int));
    copy_host_to_device(d_gate, gate, S * sizeof(float));
    float tol = default_tolerance(), ms;
    double X = sizeof(floatX), moved = (double)kept * C * X * 2;  // each row read and written once
    printf("moe N=%d k=%d C=%d, %d of %zu slots kept (%s)\n", N, k, C, kept, S, PRECISION_NAME);

    moe_dispatch(d_rows, d_h, d_row, d_gate, N, k, C, /*weighted*/ 0);
    ok &= validate("v1 dispatch", d_rows, rows, (size_t)kept * C, 0.0f);  // (a copy: exact)
    TIME_KERNEL(ms, 20, moe_dispatch(d_rows, d_h, d_row, d_gate, N, k, C, /*weighted*/ 0));
    report("v1 dispatch", ms, moved, 0);
    moe_dispatch(d_weighted, d_dout, d_row, d_gate, N, k, C, /*weighted*/ 1);
    ok &= validate("v1 dispatch, gate-weighted", d_weighted, weighted, (size_t)kept * C, tol);
    moe_gather_rows(d_gathered, d_rows, d_order, kept, C);
    ok &= validate("v1 gather rows", d_gathered, gathered, (size_t)kept * C, 0.0f);
    TIME_KERNEL(ms, 20, moe_gather_rows(d_gathered, d_rows, d_order, kept, C));
    report("v1 gather rows", ms, moved, 0);
    moe_combine(d_combined, d_rows, d_row, d_gate, N, k, C, /*weighted*/ 1);
    ok &= validate("v1 combine", d_combined, combined, (size_t)N * C, tol);
    TIME_KERNEL(ms, 20, moe_combine(d_combined, d_rows, d_row, d_gate, N, k, C, /*weighted*/ 1));
    report("v1 combine", ms, moved + (double)N * C * X, 0);
    moe_gate_grads(d_dgate, d_dout, d_rows, d_row, N, k, C);
    // (dot products of C terms of floatX inputs, summed in fp32 in another order)
    ok &= validate_f32("v1 gate gradients", d_dgate, dgate, S, FLOATX_IS_FLOAT ? 1e-4f : 2e-2f);
    TIME_KERNEL(ms, 20, moe_gate_grads(d_dgate, d_dout, d_rows, d_row, N, k, C));
    report("v1 gate gradients", ms, moved / 2 + (double)N * C * X * k, 0);

    // the experts' fc: E experts, expert e taking counts[e] of the kept rows (uneven: 1 to 3 parts)
    int E = 8, F = 4 * C, counts[8], first[8], at = 0;
    for (int e = 0; e < E; e++) counts[e] = kept / 16 * (1 + e % 3);
    counts[E - 1] = 0;
    for (int e = 0; e < E - 1; e++) at += counts[e];
    counts[E - 1] = kept - at;  // (the rest: every row to some expert)
    for (int e = 0, f = 0; e < E; f += counts[e], e++) first[e] = f;
    float* w = random_floats((size_t)E * F * C, 0.02f);
    float* b = random_floats((size_t)E * F, 0.1f);
    round_like_floatX(w, (size_t)E * F * C);
    round_like_floatX(b, (size_t)E * F);
    float* fch = (float*)malloc_check((size_t)kept * F * sizeof(float));
    for (int e = 0; e < E; e++) {
        cpu::matmul_forward(fch + (size_t)first[e] * F, rows + (size_t)first[e] * C, w + (size_t)e * F * C, b + (size_t)e * F,
                            counts[e], C, F);
    }
    floatX *d_w = to_device(w, (size_t)E * F * C), *d_b = to_device(b, (size_t)E * F);
    floatX* d_fch = (floatX*)device_malloc((size_t)kept * F * sizeof(floatX));
    round_like_floatX(rows, (size_t)kept * C);  // (the device's rows are floatX)
    floatX* d_xin = to_device(rows, (size_t)kept * C);
    printf("experts' fc: %d experts, %d rows in all (%d to %d an expert), C=%d -> 4C=%d\n", E, kept, counts[0], counts[2], C, F);
#define EXPERTS_FC() do {                                                                                          \
        for (int e = 0; e < E; e++) {                                                                           \
            if (counts[e] == 0) continue;                                                                       \
            matmul_forward(d_fch + (size_t)first[e] * F, d_xin + (size_t)first[e] * C, d_w + (size_t)e * F * C, \
                           d_b + (size_t)e * F, counts[e], C, F);                                               \
        }                                                                                                       \
    } while (0)
    EXPERTS_FC();
    ok &= validate("v1 experts' fc, a GEMM an expert", d_fch, fch, (size_t)kept * F, tol);
    double flops = 2.0 * kept * C * F;
    TIME_KERNEL(ms, 10, EXPERTS_FC());
    report("v1 experts' fc, a GEMM an expert", ms, 0, flops);
    TIME_KERNEL(ms, 10, matmul_forward(d_fch, d_xin, d_w, d_b, kept, C, F));
    report("one GEMM over all the rows (one expert's weights)", ms, 0, flops);
    return finish(ok);
}
