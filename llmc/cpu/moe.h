// Mixture-of-Experts on the CPU: a layer's routing (each token's top-k experts, the capacity and
// the rows of the send order, the balance figures, the router's gradient) and the row moves of its
// dispatch and combine, the same functions as llmc/cuda/moe.cuh; llmc/moe.h calls them in order.
// Rows are C floats; a row index of -1 is a slot that capacity dropped.
#ifndef LLMC_CPU_MOE_H
#define LLMC_CPU_MOE_H

#include <math.h>
#include <string.h>
#include "../kernel_times.h"

// ---- routing

// each token's k experts of largest s + b (s: its router logits (N, E), b: the balancing bias
// (E)), best first, ties to the lower index; their gates, the softmax of the k picked s (without
// the bias, which only picks: Mixtral's order, top-k then softmax); and P = softmax of all E s
// (the aux loss's probabilities). expert, gate: (N, k); probs: (N, E)
static inline void moe_topk(int* expert, float* gate, float* probs, const float* s, const float* bias, int N, int E,
                            int k) {
    int kernel_span = kernel_time_begin("moe: top-k", 0, 0);
    #pragma omp parallel for
    for (int t = 0; t < N; t++) {
        const float* st = s + (size_t)t * E;
        int* picked = expert + (size_t)t * k;
        // top-k by repeated argmax: a strict > keeps the lower index on a tie
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int i = 0; i < j; i++) taken |= picked[i] == e;
                if (!taken && (best < 0 || st[e] + bias[e] > st[best] + bias[best])) best = e;
            }
            picked[j] = best;
        }
        float top = st[picked[0]], sum = 0.0f;
        for (int j = 0; j < k; j++) sum += expf(st[picked[j]] - top);
        for (int j = 0; j < k; j++) gate[(size_t)t * k + j] = expf(st[picked[j]] - top) / sum;
        float most = st[0], all = 0.0f;
        for (int e = 1; e < E; e++) most = st[e] > most ? st[e] : most;
        for (int e = 0; e < E; e++) all += expf(st[e] - most);
        for (int e = 0; e < E; e++) probs[(size_t)t * E + e] = expf(st[e] - most) / all;
    }
    kernel_time_end(kernel_span);
}

// capacity and the send order. The slots in the order first choices before second, each in token
// order: an expert keeps its first `capacity` slots and drops the rest (row -1); a kept slot's
// row is its place among its expert's kept rows, after all lower experts' rows (the send order:
// expert by expert, so destination rank by rank). counts: (2E) each expert's kept slots, then its
// routed slots before drops (the balancing rules' loads). On the CPU this is one serial loop over
// the N k slots, a running count per expert: "first come, first kept" is an order, and the loop
// is that order. (llmc/cuda/moe.cuh computes the same places with a block per expert and a prefix
// sum, a scan, over its slots.)
static inline void moe_assign_rows(int* row, int* counts, const int* expert, int N, int k, int E, int capacity) {
    int kernel_span = kernel_time_begin("moe: rows", 0, 0);
    int *kept = counts, *routed = counts + E;
    memset(counts, 0, (size_t)2 * E * sizeof(int));
    for (int j = 0; j < k; j++) {
        for (int t = 0; t < N; t++) {
            int e = expert[(size_t)t * k + j];
            row[(size_t)t * k + j] = routed[e]++ < capacity ? kept[e]++ : -1;
        }
    }
    int first[1024];  // each expert's first row in send order (E <= 1024: gpt2_check_config)
    for (int e = 0, start = 0; e < E; e++) first[e] = start, start += kept[e];
    for (size_t i = 0; i < (size_t)N * k; i++) {
        if (row[i] >= 0) row[i] += first[expert[i]];
    }
    kernel_time_end(kernel_span);
}

// the aux loss's figures of each of the B sequences, from the N tokens this rank holds: f_e, the
// share of the sequence's slots routed to e (before drops), and P_e, the mean over its tokens of
// softmax(s)_e. The rank's tokens are flattened (B, T) tokens first .. first + N - 1: all of them
// in the EP trainer (first = 0, N = B T), a tensor-parallel rank's share with -sp in the grid
// trainer. A sequence is T_seq tokens in all (T_seq = T unless context parallelism holds the rest
// on other ranks), so a rank writes its part of each sum, and the parts of the ranks that hold the
// sequence add up to f and P. shares: (B, 2E), a sequence's E f's then its E P's
static inline void moe_sequence_shares(float* shares, const int* expert, const float* probs, int B, int T, int first,
                                       int N, int T_seq, int k, int E) {
    #pragma omp parallel for
    for (int q = 0; q < B; q++) {
        float *f = shares + (size_t)q * 2 * E, *P = f + E;
        int lo = q * T - first, hi = (q + 1) * T - first;  // sequence q's tokens on this rank
        lo = lo < 0 ? 0 : lo, hi = hi > N ? N : hi;
        for (int e = 0; e < E; e++) {
            int routed = 0;
            float p = 0.0f;
            for (int t = lo; t < hi; t++) {
                for (int j = 0; j < k; j++) routed += expert[(size_t)t * k + j] == e;
                p += probs[(size_t)t * E + e];
            }
            f[e] = (float)routed / (float)(T_seq * k);
            P[e] = p / (float)T_seq;
        }
    }
}

// the router logits' gradient ds (N, E). The gates are the softmax of the picked s, so at a
// token's picked experts ds_j = g_j (dg_j - sum_i g_i dg_i) (dgate (N, k); a dropped slot has
// dg = 0, but its gate still shares the softmax); zero elsewhere. With aux_scale > 0 (-balance
// aux) also the aux loss's, through P = softmax of all E: dP_e = aux_scale f_e (its sequence's
// share, shares as moe_sequence_shares writes them: token t is flattened token first + t of the
// (B, T) micro-batch), ds_e += P_e (dP_e - sum_i P_i dP_i).
static inline void moe_router_grad(float* ds, const int* expert, const float* gate, const float* dgate,
                                   const float* probs, const float* shares, float aux_scale, int N, int T, int first,
                                   int k, int E) {
    int kernel_span = kernel_time_begin("moe: router gradient", 0, 0);
    #pragma omp parallel for
    for (int t = 0; t < N; t++) {
        float* d = ds + (size_t)t * E;
        const float *g = gate + (size_t)t * k, *dg = dgate + (size_t)t * k;
        for (int e = 0; e < E; e++) d[e] = 0.0f;
        float dot = 0.0f;
        for (int j = 0; j < k; j++) dot += g[j] * dg[j];
        for (int j = 0; j < k; j++) d[expert[(size_t)t * k + j]] = g[j] * (dg[j] - dot);
        if (aux_scale > 0.0f) {
            const float *p = probs + (size_t)t * E, *f = shares + (size_t)((first + t) / T) * 2 * E;
            float pdot = 0.0f;
            for (int e = 0; e < E; e++) pdot += p[e] * aux_scale * f[e];
            for (int e = 0; e < E; e++) d[e] += p[e] * (aux_scale * f[e] - pdot);
        }
    }
    kernel_time_end(kernel_span);
}

// ---- the row moves

// dst row i = src row index[i], for n rows of C (a dispatch: tokens into send order; a regroup:
// rows from source-rank order into expert order, or back)
static inline void moe_gather_rows(float* dst, const float* src, const int* index, int n, int C) {
    int kernel_span = kernel_time_begin("moe: gather rows", 0, 0);
    #pragma omp parallel for
    for (int i = 0; i < n; i++) memcpy(dst + (size_t)i * C, src + (size_t)index[i] * C, (size_t)C * sizeof(float));
    kernel_time_end(kernel_span);
}

// each token's slots into the send order, weighted or not: rows[row[t, j]] = h[t] (weighted 0: the
// forward's tokens) or gate[t, j] * h[t] (weighted 1: the backward's gradient of an expert's output)
static inline void moe_dispatch(float* rows, const float* h, const int* row, const float* gate, int N, int k, int C,
                                int weighted) {
    int kernel_span = kernel_time_begin("moe: dispatch", 0, 0);
    #pragma omp parallel for
    for (int t = 0; t < N; t++) {
        for (int j = 0; j < k; j++) {
            int r = row[(size_t)t * k + j];
            if (r < 0) continue;
            float g = weighted ? gate[(size_t)t * k + j] : 1.0f;
            for (int c = 0; c < C; c++) rows[(size_t)r * C + c] = g * h[(size_t)t * C + c];
        }
    }
    kernel_time_end(kernel_span);
}

// out[t] = sum over the token's kept slots, in slot order, of gate[t, j] * rows[row[t, j]] (the
// combine; weighted 0: the plain sum, the gradient at h from the experts' input gradients)
static inline void moe_combine(float* out, const float* rows, const int* row, const float* gate, int N, int k, int C,
                               int weighted) {
    int kernel_span = kernel_time_begin("moe: combine", 0, 0);
    #pragma omp parallel for
    for (int t = 0; t < N; t++) {
        float* o = out + (size_t)t * C;
        for (int c = 0; c < C; c++) o[c] = 0.0f;
        for (int j = 0; j < k; j++) {
            int r = row[(size_t)t * k + j];
            if (r < 0) continue;
            float g = weighted ? gate[(size_t)t * k + j] : 1.0f;
            for (int c = 0; c < C; c++) o[c] += g * rows[(size_t)r * C + c];
        }
    }
    kernel_time_end(kernel_span);
}

// dgate[t, j] = dout[t] . rows[row[t, j]]: how the loss moves with each gate (0 for a dropped slot)
static inline void moe_gate_grads(float* dgate, const float* dout, const float* rows, const int* row, int N, int k,
                                  int C) {
    int kernel_span = kernel_time_begin("moe: gate gradients", 0, 0);
    #pragma omp parallel for
    for (int t = 0; t < N; t++) {
        for (int j = 0; j < k; j++) {
            int r = row[(size_t)t * k + j];
            float dot = 0.0f;
            for (int c = 0; r >= 0 && c < C; c++) dot += dout[(size_t)t * C + c] * rows[(size_t)r * C + c];
            dgate[(size_t)t * k + j] = dot;
        }
    }
    kernel_time_end(kernel_span);
}

#endif
