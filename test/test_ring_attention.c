// Unit test of the block attention of context parallelism (llmc/cpu/ring_attention.h): for
// cp = 1..4 ranks, each split (contiguous, zigzag) and chunks of odd and even length, every rank's
// queries attend to every rank's keys block by block, merged by log-sum-exp; the output and the
// gradients of q, k and v must equal the whole-sequence causal attention of llmc/cpu/attention.h
// (an independent implementation: softmax over stored probabilities) on the same random inputs.
// The skipped (masked) tiles and the work count are checked against the formula too.
#include <stdio.h>
#include <stdlib.h>
#include "llmc/utils.h"
#include "llmc/cpu/attention.h"
#include "llmc/cpu/ring_attention.h"

static int failures = 0;
#define CHECK(cond, ...) do { if (!(cond)) { failures++; printf("FAIL: " __VA_ARGS__); printf("\n"); } } while (0)

static float uniform(unsigned* state) {
    *state = *state * 1664525u + 1013904223u;
    return (float)(*state >> 8) / (float)(1u << 24) * 2.0f - 1.0f;
}

// the largest |a - b| / (1 + |b|) over n values
static float max_error(const float* a, const float* b, size_t n) {
    float worst = 0.0f;
    for (size_t i = 0; i < n; i++) {
        float e = fabsf(a[i] - b[i]) / (1.0f + fabsf(b[i]));
        worst = e > worst ? e : worst;
    }
    return worst;
}

static void check_split(CpSplit split, int cp, int len, int B, int C, int NH) {
    int n = split == CP_ZIGZAG ? 2 : 1, T = n * cp * len, Tl = n * len;
    unsigned seed = 12345u + (unsigned)(cp * 7 + len);
    size_t BT = (size_t)B * T;
    float* qkv = (float*)malloc_check(BT * 3 * C * sizeof(float));
    float* dout = (float*)malloc_check(BT * C * sizeof(float));
    for (size_t i = 0; i < BT * 3 * C; i++) qkv[i] = uniform(&seed) * 2.0f;
    for (size_t i = 0; i < BT * C; i++) dout[i] = uniform(&seed);
    // the reference: the whole sequence at once
    float* out = (float*)malloc_check(BT * C * sizeof(float));
    float* att = (float*)malloc_check((size_t)B * NH * T * T * sizeof(float));
    float* dqkv = (float*)malloc_check(BT * 3 * C * sizeof(float));
    float* dcopy = (float*)malloc_check(BT * C * sizeof(float));
    memcpy(dcopy, dout, BT * C * sizeof(float));
    attention_forward(out, att, qkv, B, T, C, NH);
    attention_backward(dqkv, dcopy, qkv, out, att, B, T, C, NH);
    // each rank's tokens: its rows of qkv, out and dout, in its local order
    size_t per = (size_t)B * Tl;
    float *lqkv = (float*)malloc_check(cp * per * 3 * C * sizeof(float)), *kv = (float*)malloc_check(cp * per * 2 * C * sizeof(float));
    float *o = (float*)calloc_check(cp * per * C, sizeof(float)), *lse = (float*)malloc_check(cp * per * NH * sizeof(float));
    float *ldout = (float*)malloc_check(cp * per * C * sizeof(float)), *D = (float*)malloc_check(cp * per * NH * sizeof(float));
    float *dq = (float*)calloc_check(cp * per * C, sizeof(float)), *dkv = (float*)calloc_check(cp * per * 2 * C, sizeof(float));
    float *want_out = (float*)malloc_check(cp * per * C * sizeof(float)), *want_dqkv = (float*)malloc_check(cp * per * 3 * C * sizeof(float));
    float* got_dqkv = (float*)malloc_check(cp * per * 3 * C * sizeof(float));
    for (int r = 0; r < cp; r++) {
        CpChunks mine = cp_chunks_of(split, T, cp, r);
        for (int b = 0; b < B; b++) {
            for (int t = 0; t < Tl; t++) {
                size_t from = (size_t)b * T + cp_position(mine, t), to = r * per + (size_t)b * Tl + t;
                memcpy(lqkv + to * 3 * C, qkv + from * 3 * C, 3 * (size_t)C * sizeof(float));
                memcpy(ldout + to * C, dout + from * C, (size_t)C * sizeof(float));
                memcpy(want_out + to * C, out + from * C, (size_t)C * sizeof(float));
                memcpy(want_dqkv + to * 3 * C, dqkv + from * 3 * C, 3 * (size_t)C * sizeof(float));
            }
        }
        kv_pack(kv + r * per * 2 * C, lqkv + r * per * 3 * C, B, Tl, C);
    }
    // every rank against every rank's block (in ring order: its own first), then the backward
    double work_min = 1e300, work_max = 0.0;
    for (int r = 0; r < cp; r++) {
        CpChunks q = cp_chunks_of(split, T, cp, r);
        double work = 0.0;
        for (int s = 0; s < cp; s++) {
            int owner = (r - s + cp) % cp;
            CpChunks k = cp_chunks_of(split, T, cp, owner);
            attention_block_forward(o + r * per * C, lse + r * per * NH, NULL, lqkv + r * per * 3 * C, kv + owner * per * 2 * C,
                                    q, k, B, C, NH, s == 0);
            work += cp_attention_work(q, k);
        }
        work_min = work < work_min ? work : work_min;
        work_max = work > work_max ? work : work_max;
    }
    // the whole causal triangle is done once: T (T + 1) / 2 products per sequence and head
    double total = 0.0;
    for (int r = 0; r < cp; r++) {
        for (int j = 0; j < cp; j++) total += cp_attention_work(cp_chunks_of(split, T, cp, r), cp_chunks_of(split, T, cp, j));
    }
    CHECK(total == (double)T * (T + 1) / 2, "%s cp=%d: work %.0f, the triangle %.0f", cp_split_name(split), cp, total,
          (double)T * (T + 1) / 2);
    // zigzag: every rank the same work (its two chunks pair an early and a late one)
    if (split == CP_ZIGZAG) CHECK(work_min == work_max, "zigzag cp=%d: work from %.0f to %.0f", cp, work_min, work_max);
    for (int r = 0; r < cp; r++) {
        CpChunks q = cp_chunks_of(split, T, cp, r);
        attention_block_backward_prepare(D + r * per * NH, ldout + r * per * C, o + r * per * C, B, Tl, C, NH);
        for (int s = 0; s < cp; s++) {
            int owner = (r - s + cp) % cp;
            attention_block_backward(dq + r * per * C, dkv + owner * per * 2 * C, ldout + r * per * C, lse + r * per * NH,
                                     D + r * per * NH, lqkv + r * per * 3 * C, kv + owner * per * 2 * C, q,
                                     cp_chunks_of(split, T, cp, owner), B, C, NH);
        }
    }
    for (int r = 0; r < cp; r++) attention_block_grads(got_dqkv + r * per * 3 * C, dq + r * per * C, dkv + r * per * 2 * C, B, Tl, C);
    // fp32 sums in another order (and exp of a merged lse): about ten units in the last place of
    // values near 1 (6e-8 each), so 2e-6 relative to 1 + |value|; measured up to 3e-7
    float e_out = max_error(o, want_out, cp * per * C), e_grad = max_error(got_dqkv, want_dqkv, cp * per * 3 * C);
    CHECK(e_out < 2e-6f && e_grad < 2e-6f, "%s cp=%d len=%d: output off by %.2e, gradients by %.2e",
          cp_split_name(split), cp, len, e_out, e_grad);
    printf("%-10s cp=%d T=%2d: output %.1e, dqkv %.1e, work per rank %.0f to %.0f\n", cp_split_name(split), cp, T, e_out,
           e_grad, work_min, work_max);
    free(qkv); free(dout); free(out); free(att); free(dqkv); free(dcopy); free(lqkv); free(kv); free(o); free(lse);
    free(ldout); free(D); free(dq); free(dkv); free(want_out); free(want_dqkv); free(got_dqkv);
}

int main(void) {
    for (int cp = 1; cp <= 4; cp++) {
        for (int len = 3; len <= 4; len++) {  // odd and even chunks
            check_split(CP_CONTIGUOUS, cp, len, 2, 16, 2);
            check_split(CP_ZIGZAG, cp, len, 2, 16, 2);
        }
    }
    // contiguous: rank r's queries see r whole tiles and one diagonal, len^2 r + len (len+1)/2
    CpChunks first = cp_chunks_of(CP_CONTIGUOUS, 16, 4, 0), last = cp_chunks_of(CP_CONTIGUOUS, 16, 4, 3);
    double w_first = 0.0, w_last = 0.0;
    for (int j = 0; j < 4; j++) {
        w_first += cp_attention_work(first, cp_chunks_of(CP_CONTIGUOUS, 16, 4, j));
        w_last += cp_attention_work(last, cp_chunks_of(CP_CONTIGUOUS, 16, 4, j));
    }
    CHECK(w_first == 10 && w_last == 3 * 16 + 10, "contiguous cp=4 T=16: work %.0f and %.0f, expected 10 and 58", w_first, w_last);
    if (failures) {
        printf("%d failures\n", failures);
        return 1;
    }
    printf("ring attention ok\n");
    return 0;
}
