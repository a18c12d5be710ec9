// Token + position embedding on CUDA.
#ifndef LLMC_CUDA_ENCODER_CUH
#define LLMC_CUDA_ENCODER_CUH

#include "device.cuh"

// out (B, T, C) = wte[inp[b, t]] + wpe[t]; one thread per output element. A token of -1 reads a
// row of zeros and wpe may be NULL: a vocabulary-parallel embedding passes -1 for the tokens whose
// rows live on another rank, and adds wpe on one rank only (train_gpt2_tp.cu).
__global__ void encoder_forward_kernel(floatX* out, const int* inp, const floatX* wte,
                                       const floatX* wpe, int B, int T, int C) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)B * T * C) return;
    size_t bt = idx / C;
    int c = (int)(idx % C), t = (int)(bt % T);
    int token = inp[bt];
    float tok = token < 0 ? 0.0f : (float)wte[(size_t)token * C + c];
    float pos = wpe != NULL ? (float)wpe[(size_t)t * C + c] : 0.0f;
    out[idx] = (floatX)(tok + pos);
}

static inline void encoder_forward(floatX* out, const int* inp, const floatX* wte,
                                   const floatX* wpe, int B, int T, int C) {
    size_t n = (size_t)B * T * C;
    encoder_forward_kernel<<<ceil_div(n, 256), 256>>>(out, inp, wte, wpe, B, T, C);
    cudaCheckLaunch();
}

// dwte: the positions are grouped by token on the host (a counting sort of B*T ints); one block
// per distinct token then sums that token's rows of dout in a fixed order and adds them to its
// row of dwte. Every row has one writer: deterministic, no atomics. Tokens of -1 (rows on another
// rank of a vocabulary-parallel embedding) are left out of the sort, so they add nothing to dwte.
__global__ void encoder_backward_wte_kernel(floatX* dwte, const floatX* dout,
                                            const int* bucket_token, const int* bucket_start,
                                            const int* positions, int C) {
    int bucket = blockIdx.x;
    int token = bucket_token[bucket];
    int begin = bucket_start[bucket], end = bucket_start[bucket + 1];
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float sum = 0.0f;
        for (int i = begin; i < end; i++) sum += (float)dout[(size_t)positions[i] * C + c];
        size_t idx = (size_t)token * C + c;
        dwte[idx] = (floatX)((float)dwte[idx] + sum);
    }
}

// dwpe (T, C) += sum over the batch of dout (B, T, C); one thread per (t, c)
__global__ void encoder_backward_wpe_kernel(floatX* dwpe, const floatX* dout, int B, int T, int C) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)T * C) return;
    float sum = 0.0f;
    for (int b = 0; b < B; b++) sum += (float)dout[(size_t)b * T * C + idx];
    dwpe[idx] = (floatX)((float)dwpe[idx] + sum);
}

static DeviceScratch encoder_scratch;

// (the backward's buckets handed to the GPU: encoder_scratch_bytes, llmc/target.h)

static inline void encoder_backward(floatX* dwte, floatX* dwpe, const floatX* dout, const int* inp,
                                    int B, int T, int C) {
    int BT = B * T;
    // counting sort of the positions by token, on the host; tokens of -1 are left out
    int* tokens = (int*)malloc_check((size_t)BT * sizeof(int));
    copy_device_to_host(tokens, inp, (size_t)BT * sizeof(int));
    int max_token = -1;  // stays -1 when every token is -1: no bucket, no dwte launch
    for (int i = 0; i < BT; i++) max_token = tokens[i] > max_token ? tokens[i] : max_token;
    int* count = (int*)calloc_check((size_t)max_token + 2, sizeof(int));
    for (int i = 0; i < BT; i++) {
        if (tokens[i] >= 0) count[tokens[i] + 1]++;
    }
    for (int v = 0; v <= max_token; v++) count[v + 1] += count[v];  // count[v] = first slot of v
    // host layout: [bucket_token (BT) | bucket_start (BT + 1) | positions (BT)]
    int* host = (int*)malloc_check((size_t)(3 * BT + 1) * sizeof(int));
    int* bucket_token = host;
    int* bucket_start = host + BT;
    int* positions = host + 2 * BT + 1;
    int buckets = 0;
    for (int v = 0; v <= max_token; v++) {
        if (count[v + 1] == count[v]) continue;
        bucket_token[buckets] = v;
        bucket_start[buckets] = count[v];
        buckets++;
    }
    int sorted = max_token >= 0 ? count[max_token + 1] : 0;  // positions with a token of this rank
    bucket_start[buckets] = sorted;
    // positions in increasing order within each token: the summation order is fixed
    for (int i = 0; i < BT; i++) {
        if (tokens[i] >= 0) positions[count[tokens[i]]++] = i;
    }
    if (buckets > 0) {  // a grid of 0 blocks is a launch error
        int* dev = (int*)scratch_get(&encoder_scratch, encoder_scratch_bytes(BT));
        copy_host_to_device(dev, bucket_token, (size_t)buckets * sizeof(int));
        copy_host_to_device(dev + BT, bucket_start, (size_t)(buckets + 1) * sizeof(int));
        copy_host_to_device(dev + 2 * BT + 1, positions, (size_t)sorted * sizeof(int));
        encoder_backward_wte_kernel<<<buckets, 256>>>(dwte, dout, dev, dev + BT, dev + 2 * BT + 1, C);
        cudaCheckLaunch();
    }
    // dwpe is summed over every position, whichever rank holds its token
    encoder_backward_wpe_kernel<<<ceil_div((size_t)T * C, 256), 256>>>(dwpe, dout, B, T, C);
    cudaCheckLaunch();
    free(tokens);
    free(count);
    free(host);
}

#endif
