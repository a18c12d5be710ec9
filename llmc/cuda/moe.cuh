// Mixture-of-Experts on CUDA: the row moves of a layer's dispatch and combine (llmc/moe.h decides
// which row goes where, on the host; these move them), the same functions as llmc/cpu/moe.h. Rows
// are C values of floatX; an index of -1 is a slot that capacity dropped. Memory-bound copies and
// sums: a block a row, its threads along the C values.
#ifndef LLMC_CUDA_MOE_CUH
#define LLMC_CUDA_MOE_CUH

#include "device.cuh"

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
