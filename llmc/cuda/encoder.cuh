// Token + position embedding on CUDA.
#ifndef LLMC_CUDA_ENCODER_CUH
#define LLMC_CUDA_ENCODER_CUH

#include "device.cuh"

// out (B, T, C) = wte[inp[b, t]] + wpe[t]; one thread per 16 bytes of the output (C is whole
// packs, so a pack never straddles two rows). A token of -1 reads a row of zeros and wpe may be
// NULL: a vocabulary-parallel embedding passes -1 for the tokens whose rows live on another rank,
// and adds wpe on one rank only (train_gpt2_tp.cu).
__global__ void encoder_forward_kernel(floatX* out, const int* inp, const floatX* wte, const floatX* wpe, size_t packs,
                                       int T, int C) {
    size_t pack = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (pack >= packs) return;
    size_t idx = pack * PACK16, bt = idx / C;
    int c = (int)(idx % C), t = (int)(bt % T), token = inp[bt];
    Pack16 x, tok, pos;
    if (token >= 0) tok = load16(wte + (size_t)token * C + c);
    if (wpe != NULL) pos = load16(wpe + (size_t)t * C + c);
    for (int k = 0; k < PACK16; k++)
        x.v[k] = (floatX)((token >= 0 ? (float)tok.v[k] : 0.0f) + (wpe != NULL ? (float)pos.v[k] : 0.0f));
    store16(out + idx, x);
}

static inline void encoder_forward(floatX* out, const int* inp, const floatX* wte,
                                   const floatX* wpe, int B, int T, int C) {
    int kernel_span = kernel_time_begin("encoder forward", 0, 0);
    check_whole_packs("encoder_forward", "C", (size_t)C);
    size_t packs = (size_t)B * T * C / PACK16;
    encoder_forward_kernel<<<ceil_div(packs, 256), 256>>>(out, inp, wte, wpe, packs, T, C);
    cudaCheckLaunch();
    kernel_time_end(kernel_span);
}

// dwte: the positions are grouped by token on the host (a counting sort of the B*T tokens, which
// the host has: it loaded them); one block per distinct token then sums that token's rows of dout
// and adds them to its row of dwte. Every row has one writer and a fixed order: deterministic, no
// atomics. A frequent token (a space, a newline) can own thousands of positions, so the block's
// ENCODER_WARPS warps split them (warp w takes every ENCODER_WARPS-th); their sums meet in shared
// memory and are added in warp order. Lanes own PACK16 consecutive channels (16-byte loads), a
// warp 32 * PACK16 channels at a time. Tokens of -1 (rows on another rank of a
// vocabulary-parallel embedding) are left out of the sort, so they add nothing to dwte.
#define ENCODER_WARPS 8
__global__ void encoder_backward_wte_kernel(floatX* dwte, const floatX* dout, const int* bucket_token,
                                            const int* bucket_start, const int* positions, int C) {
    __shared__ float warp_sums[ENCODER_WARPS][32 * PACK16];
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int token = bucket_token[blockIdx.x];
    int begin = bucket_start[blockIdx.x], end = bucket_start[blockIdx.x + 1];
    for (int c0 = 0; c0 < C; c0 += 32 * PACK16) {
        int c = c0 + lane * PACK16;
        float sum[PACK16] = {0.0f};
        if (c < C) {
            for (int i = begin + warp; i < end; i += ENCODER_WARPS) {
                Pack16 d = load16(dout + (size_t)positions[i] * C + c);
                for (int k = 0; k < PACK16; k++) sum[k] += (float)d.v[k];
            }
        }
        for (int k = 0; k < PACK16; k++) warp_sums[warp][lane * PACK16 + k] = sum[k];
        __syncthreads();
        // thread j adds channel c0 + j over the warps, in warp order
        for (int j = threadIdx.x; j < 32 * PACK16 && c0 + j < C; j += blockDim.x) {
            float total = 0.0f;
            for (int w = 0; w < ENCODER_WARPS; w++) total += warp_sums[w][j];
            size_t idx = (size_t)token * C + c0 + j;
            dwte[idx] = (floatX)((float)dwte[idx] + total);
        }
        __syncthreads();  // warp_sums is written again for the next channels
    }
}

// dwpe (T, C) += sum over the batch of dout (B, T, C); one thread per 16 bytes of (T, C)
__global__ void encoder_backward_wpe_kernel(floatX* dwpe, const floatX* dout, int B, size_t TC) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * PACK16;
    if (i >= TC) return;
    float sum[PACK16] = {0.0f};
    for (int b = 0; b < B; b++) {
        Pack16 d = load16(dout + (size_t)b * TC + i);
        for (int k = 0; k < PACK16; k++) sum[k] += (float)d.v[k];
    }
    Pack16 w = load16(dwpe + i);
    for (int k = 0; k < PACK16; k++) w.v[k] = (floatX)((float)w.v[k] + sum[k]);
    store16(dwpe + i, w);
}

static DeviceScratch encoder_scratch;  // the buckets on the device (encoder_scratch_bytes, llmc/target.h)
static HostStage encoder_stage;        // the buckets on the host, pinned, on their way there

// tokens_host: the micro-batch's (B, T) tokens in host memory. No device sync: the sort runs on
// the host while the GPU works through the layers' backward, and the buckets go to the device
// by an asynchronous copy queued before the kernel.
static inline void encoder_backward(floatX* dwte, floatX* dwpe, const floatX* dout, const int* tokens_host,
                                    int B, int T, int C) {
    int kernel_span = kernel_time_begin("encoder backward", 0, 0);
    check_whole_packs("encoder_backward", "C", (size_t)C);
    int BT = B * T;
    // counting sort of the positions by token; tokens of -1 are left out
    int max_token = -1;  // stays -1 when every token is -1: no bucket, no dwte launch
    for (int i = 0; i < BT; i++) max_token = tokens_host[i] > max_token ? tokens_host[i] : max_token;
    int* count = (int*)calloc_check((size_t)max_token + 2, sizeof(int));
    for (int i = 0; i < BT; i++) {
        if (tokens_host[i] >= 0) count[tokens_host[i] + 1]++;
    }
    for (int v = 0; v <= max_token; v++) count[v + 1] += count[v];  // count[v] = first slot of v
    // layout (host and device alike): [bucket_token (BT) | bucket_start (BT + 1) | positions (BT)]
    size_t bytes = encoder_scratch_bytes(BT);
    int* host = (int*)host_stage_take(&encoder_stage, bytes);
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
    bucket_start[buckets] = max_token >= 0 ? count[max_token + 1] : 0;  // positions of this rank's tokens
    // positions in increasing order within each token: the summation order is fixed
    for (int i = 0; i < BT; i++) {
        if (tokens_host[i] >= 0) positions[count[tokens_host[i]]++] = i;
    }
    free(count);
    if (buckets > 0) {  // a grid of 0 blocks is a launch error
        int* dev = (int*)scratch_get(&encoder_scratch, bytes);
        host_stage_to_device(&encoder_stage, dev, bytes);
        encoder_backward_wte_kernel<<<buckets, 32 * ENCODER_WARPS>>>(dwte, dout, dev, dev + BT, dev + 2 * BT + 1, C);
        cudaCheckLaunch();
    }
    // dwpe is summed over every position, whichever rank holds its token
    size_t TC = (size_t)T * C;
    encoder_backward_wpe_kernel<<<ceil_div(TC / PACK16, 256), 256>>>(dwpe, dout, B, TC);
    cudaCheckLaunch();
    kernel_time_end(kernel_span);
}

#endif
