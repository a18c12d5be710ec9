// Mixture-of-Experts on CUDA: a layer's routing and the row moves of its dispatch and combine, the
// same functions as llmc/cpu/moe.h (which says what each computes). Routing is a thread a token
// (E and k are small), but for the capacity's scan, a block an expert; the row moves are
// memory-bound copies and sums, a block a row, its threads along the C values. Rows are C values
// of floatX; a row index of -1 is a slot that capacity dropped.
#ifndef LLMC_CUDA_MOE_CUH
#define LLMC_CUDA_MOE_CUH

#include "device.cuh"

// ---- routing

// thread t: token t's top-k of s + b (repeated argmax, a strict > keeping the lower index on a
// tie), its gates (softmax of the k picked s) and its P (softmax of all E s); fp32 arithmetic
__global__ void moe_topk_kernel(int* expert, float* gate, float* probs, const floatX* s, const float* bias, int N, int E,
                                int k) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= N) return;
    const floatX* st = s + (size_t)t * E;
    int* picked = expert + (size_t)t * k;
    for (int j = 0; j < k; j++) {
        int best = -1;
        float best_score = 0.0f;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int i = 0; i < j; i++) taken |= picked[i] == e;
            float score = (float)st[e] + bias[e];
            if (!taken && (best < 0 || score > best_score)) best = e, best_score = score;
        }
        picked[j] = best;
    }
    float top = (float)st[picked[0]], sum = 0.0f;
    for (int j = 0; j < k; j++) sum += expf((float)st[picked[j]] - top);
    for (int j = 0; j < k; j++) gate[(size_t)t * k + j] = expf((float)st[picked[j]] - top) / sum;
    float most = (float)st[0], all = 0.0f;
    for (int e = 1; e < E; e++) most = fmaxf(most, (float)st[e]);
    for (int e = 0; e < E; e++) all += expf((float)st[e] - most);
    for (int e = 0; e < E; e++) probs[(size_t)t * E + e] = expf((float)st[e] - most) / all;
}
static inline void moe_topk(int* expert, float* gate, float* probs, const floatX* s, const float* bias, int N, int E,
                            int k) {
    int kernel_span = kernel_time_begin("moe: top-k", 0, 0);
    moe_topk_kernel<<<ceil_div(N, 128), 128>>>(expert, gate, probs, s, bias, N, E, k);
    cudaCheckLaunch();
    kernel_time_end(kernel_span);
}

// block e: expert e's slots in slot order (i = j N + t: first choices before second, each in token
// order), blockDim at a time. Each chunk counts its slots of e by a prefix sum (within each warp
// by shuffles, across warps through shared memory), so that every slot learns its place among
// e's slots: kept below the capacity (its place, for now), dropped (-1) from there.
// counts[e] = kept, counts[E + e] = routed before drops. Only E blocks, so a block is as wide as
// it can be (1024 threads): a micro-batch of 64 x 1024 tokens top-2 is 128 chunks a block, each a
// read of 4 KB and a few dozen instructions; an order-free count (atomics) would be faster, but
// "first come, first kept" needs the order.
__global__ void moe_assign_rows_kernel(int* row, int* counts, const int* expert, int N, int k, int E, int capacity) {
    __shared__ int warp_totals[32];
    int e = blockIdx.x, lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    int routed = 0;  // e's slots in the chunks before this one (the same on every thread)
    size_t S = (size_t)N * k;
    for (size_t chunk = 0; chunk < S; chunk += blockDim.x) {
        size_t i = chunk + threadIdx.x;
        size_t slot = i < S ? (i % N) * k + i / N : 0;  // slot i's place in (N, k) order
        int mine = i < S && expert[slot] == e;
        int upto = mine;  // inclusive prefix sum over the warp's lanes
        for (int d = 1; d < 32; d *= 2) {
            int below = __shfl_sync(0xffffffff, upto, lane >= d ? lane - d : lane);
            if (lane >= d) upto += below;
        }
        if (lane == 31) warp_totals[warp] = upto;
        __syncthreads();
        int place = routed + upto - 1;
        for (int w = 0; w < warps; w++) {
            if (w < warp) place += warp_totals[w];
            routed += warp_totals[w];
        }
        __syncthreads();  // every warp has read the totals before the next chunk writes them
        if (mine) row[slot] = place < capacity ? place : -1;
    }
    if (threadIdx.x == 0) counts[e] = routed < capacity ? routed : capacity, counts[E + e] = routed;
}
// thread i: a kept slot's place among its expert's rows becomes its row in send order, after the
// kept rows of every lower expert
__global__ void moe_offset_rows_kernel(int* row, const int* counts, const int* expert, size_t S) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= S || row[i] < 0) return;
    int first = 0;
    for (int e = 0; e < expert[i]; e++) first += counts[e];
    row[i] += first;
}
static inline void moe_assign_rows(int* row, int* counts, const int* expert, int N, int k, int E, int capacity) {
    int kernel_span = kernel_time_begin("moe: rows", 0, 0);
    moe_assign_rows_kernel<<<E, 1024>>>(row, counts, expert, N, k, E, capacity);
    cudaCheckLaunch();
    moe_offset_rows_kernel<<<ceil_div((size_t)N * k, 256), 256>>>(row, counts, expert, (size_t)N * k);
    cudaCheckLaunch();
    kernel_time_end(kernel_span);
}

// block q (sequence q), thread e: this rank's part of f_e (the share of the sequence's T_seq k
// slots routed to e) and of P_e (the mean of its tokens' softmax(s)_e), from its tokens among the
// rank's flattened (B, T) tokens first .. first + N - 1 (llmc/cpu/moe.h says when that is not all
// of them); shares (B, 2E)
__global__ void moe_sequence_shares_kernel(float* shares, const int* expert, const float* probs, int T, int first, int N,
                                           int T_seq, int k, int E) {
    int q = blockIdx.x;
    int lo = q * T - first, hi = (q + 1) * T - first;  // sequence q's tokens on this rank
    lo = lo < 0 ? 0 : lo, hi = hi > N ? N : hi;
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        int routed = 0;
        float p = 0.0f;
        for (int t = lo; t < hi; t++) {
            for (int j = 0; j < k; j++) routed += expert[(size_t)t * k + j] == e;
            p += probs[(size_t)t * E + e];
        }
        shares[(size_t)q * 2 * E + e] = (float)routed / (float)(T_seq * k);
        shares[(size_t)q * 2 * E + E + e] = p / (float)T_seq;
    }
}
static inline void moe_sequence_shares(float* shares, const int* expert, const float* probs, int B, int T, int first,
                                       int N, int T_seq, int k, int E) {
    moe_sequence_shares_kernel<<<B, 128>>>(shares, expert, probs, T, first, N, T_seq, k, E);
    cudaCheckLaunch();
}

// thread t: token t's row of ds (N, E), the gates' softmax backward at its picked experts and,
// with aux_scale > 0, the aux loss's through P (llmc/cpu/moe.h writes the formulas)
__global__ void moe_router_grad_kernel(floatX* ds, const int* expert, const float* gate, const float* dgate,
                                       const float* probs, const float* shares, float aux_scale, int N, int T, int first,
                                       int k, int E) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= N) return;
    const float *g = gate + (size_t)t * k, *dg = dgate + (size_t)t * k;
    const int* picked = expert + (size_t)t * k;
    float dot = 0.0f, pdot = 0.0f;
    for (int j = 0; j < k; j++) dot += g[j] * dg[j];
    const float *p = probs + (size_t)t * E, *f = aux_scale > 0.0f ? shares + (size_t)((first + t) / T) * 2 * E : NULL;
    for (int e = 0; f && e < E; e++) pdot += p[e] * aux_scale * f[e];
    for (int e = 0; e < E; e++) {
        float d = 0.0f;
        for (int j = 0; j < k; j++) d = picked[j] == e ? g[j] * (dg[j] - dot) : d;
        if (f) d += p[e] * (aux_scale * f[e] - pdot);
        ds[(size_t)t * E + e] = (floatX)d;
    }
}
static inline void moe_router_grad(floatX* ds, const int* expert, const float* gate, const float* dgate,
                                   const float* probs, const float* shares, float aux_scale, int N, int T, int first, int k,
                                   int E) {
    int kernel_span = kernel_time_begin("moe: router gradient", 0, 0);
    moe_router_grad_kernel<<<ceil_div(N, 128), 128>>>(ds, expert, gate, dgate, probs, shares, aux_scale, N, T, first, k, E);
    cudaCheckLaunch();
    kernel_time_end(kernel_span);
}

// ---- the row moves

// dst row i = src row index[i]
__global__ void moe_gather_rows_kernel(floatX* dst, const floatX* src, const int* index, int C) {
    const floatX* from = src + (size_t)index[blockIdx.x] * C;
    floatX* to = dst + (size_t)blockIdx.x * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) to[c] = from[c];
}
static inline void moe_gather_rows(floatX* dst, const floatX* src, const int* index, int n, int C) {
    int kernel_span = kernel_time_begin("moe: gather rows", 0, 0);
    if (n > 0) moe_gather_rows_kernel<<<n, 128>>>(dst, src, index, C);
    cudaCheckLaunch();
    kernel_time_end(kernel_span);
}

// block t: token t's slots into send order, rows[row[t, j]] = h[t] (weighted 0) or
// gate[t, j] * h[t] (weighted 1)
__global__ void moe_dispatch_kernel(floatX* rows, const floatX* h, const int* row, const float* gate, int k, int C,
                                    int weighted) {
    int t = blockIdx.x;
    for (int j = 0; j < k; j++) {
        int r = row[(size_t)t * k + j];
        if (r < 0) continue;
        float g = weighted ? gate[(size_t)t * k + j] : 1.0f;
        for (int c = threadIdx.x; c < C; c += blockDim.x) rows[(size_t)r * C + c] = (floatX)(g * (float)h[(size_t)t * C + c]);
    }
}
static inline void moe_dispatch(floatX* rows, const floatX* h, const int* row, const float* gate, int N, int k, int C,
                                int weighted) {
    int kernel_span = kernel_time_begin("moe: dispatch", 0, 0);
    moe_dispatch_kernel<<<N, 128>>>(rows, h, row, gate, k, C, weighted);
    cudaCheckLaunch();
    kernel_time_end(kernel_span);
}

// block t: out[t] = sum over its kept slots, in slot order, of gate[t, j] rows[row[t, j]] (fp32 sums)
__global__ void moe_combine_kernel(floatX* out, const floatX* rows, const int* row, const float* gate, int k, int C,
                                   int weighted) {
    int t = blockIdx.x;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float sum = 0.0f;
        for (int j = 0; j < k; j++) {
            int r = row[(size_t)t * k + j];
            if (r >= 0) sum += (weighted ? gate[(size_t)t * k + j] : 1.0f) * (float)rows[(size_t)r * C + c];
        }
        out[(size_t)t * C + c] = (floatX)sum;
    }
}
static inline void moe_combine(floatX* out, const floatX* rows, const int* row, const float* gate, int N, int k, int C,
                               int weighted) {
    int kernel_span = kernel_time_begin("moe: combine", 0, 0);
    moe_combine_kernel<<<N, 128>>>(out, rows, row, gate, k, C, weighted);
    cudaCheckLaunch();
    kernel_time_end(kernel_span);
}

// block t, warp w: dgate[t, j] = dout[t] . rows[row[t, j]] for slots j = w, w + warps, ... (0 for a
// dropped slot)
__global__ void moe_gate_grads_kernel(float* dgate, const floatX* dout, const floatX* rows, const int* row, int k, int C) {
    int t = blockIdx.x, lane = threadIdx.x % 32;
    for (int j = threadIdx.x / 32; j < k; j += blockDim.x / 32) {
        int r = row[(size_t)t * k + j];
        float dot = 0.0f;
        for (int c = lane; r >= 0 && c < C; c += 32) dot += (float)dout[(size_t)t * C + c] * (float)rows[(size_t)r * C + c];
        dot = warp_sum(dot);
        if (lane == 0) dgate[(size_t)t * k + j] = dot;
    }
}
static inline void moe_gate_grads(float* dgate, const floatX* dout, const floatX* rows, const int* row, int N, int k,
                                  int C) {
    int kernel_span = kernel_time_begin("moe: gate gradients", 0, 0);
    moe_gate_grads_kernel<<<N, 32 * (k < 8 ? k : 8)>>>(dgate, dout, rows, row, k, C);
    cudaCheckLaunch();
    kernel_time_end(kernel_span);
}

#endif
