/*
Encoder (token + position embedding) forward and backward, checked against the CPU backend.
  make dev/cuda/encoder_backward && ./dev/cuda/encoder_backward
Backward variants for dwte, where several positions hold the same token:
v1: one thread per (position, channel) with atomicAdd: fast, but floating-point additions land in
    whatever order the threads arrive, so two runs can differ in the last bits.
v2: positions grouped by token on the host (a counting sort of the batch the host loaded itself, so
    no device sync), one block per token sums its rows in a fixed order, its 8 warps splitting a
    frequent token's positions, 16-byte loads (llmc/cuda/encoder.cuh): deterministic, which
    bit-identical resumes and tests rely on. Checked also with half the batch one token.
Then the vocabulary-parallel embedding of tensor parallelism: tokens of -1 (rows on another rank)
read zeros forward and add nothing to dwte backward, and wpe is NULL (added on one rank only);
checked with a third of the tokens -1, and with every token -1 (no dwte launch at all).
*/
#include "common.h"
namespace cpu {
#include "llmc/cpu/encoder.h"
}
#include "llmc/cuda/encoder.cuh"

__global__ void encoder_backward_wte_v1(float* dwte, const floatX* dout, const int* inp, int BT, int C) {
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)BT * C) return;
    size_t bt = idx / C;
    int c = (int)(idx % C);
    atomicAdd(&dwte[(size_t)inp[bt] * C + c], (float)dout[idx]);
}

// forward without wpe and backward, with inp (B, T) holding tokens of -1, against the CPU;
// d_inp, d_out, d_dwte and d_dwpe are overwritten
static int check_other_rank_tokens(const char* name, const int* inp, const float* wte, const float* dout,
                                   int* d_inp, const floatX* d_wte, const floatX* d_dout, floatX* d_out,
                                   floatX* d_dwte, floatX* d_dwpe, int B, int T, int C, int V) {
    float* out = (float*)malloc_check((size_t)B * T * C * sizeof(float));
    float* dwte = (float*)calloc_check((size_t)V * C, sizeof(float));
    float* dwpe = (float*)calloc_check((size_t)T * C, sizeof(float));
    cpu::encoder_forward(out, inp, wte, NULL, B, T, C);
    cpu::encoder_backward(dwte, dwpe, dout, inp, B, T, C);
    copy_host_to_device(d_inp, inp, (size_t)B * T * sizeof(int));
    float tol = default_tolerance();
    int ok = 1;
    printf("  %s\n", name);
    encoder_forward(d_out, d_inp, d_wte, NULL, B, T, C);
    ok &= validate("forward, wpe NULL", d_out, out, (size_t)B * T * C, tol);
    device_memset_zero(d_dwte, (size_t)V * C * sizeof(floatX));
    device_memset_zero(d_dwpe, (size_t)T * C * sizeof(floatX));
    encoder_backward(d_dwte, d_dwpe, d_dout, inp, B, T, C);
    ok &= validate("v2 dwte", d_dwte, dwte, (size_t)V * C, tol);
    ok &= validate("v2 dwpe", d_dwpe, dwpe, (size_t)T * C, tol);
    free(out);
    free(dwte);
    free(dwpe);
    return ok;
}

int main(void) {
    int B = GPU_OR_EMU(8, 2), T = GPU_OR_EMU(1024, 64), C = GPU_OR_EMU(768, 384), V = 50304;  // (C: two chunks of 32 lanes x 16 bytes, bf16)
    int* inp = (int*)malloc_check((size_t)B * T * sizeof(int));
    for (int i = 0; i < B * T; i++) inp[i] = (int)(rng_u64(&dev_rng) % 2000);  // many repeats
    float* wte = random_floats((size_t)V * C, 0.02f);
    float* wpe = random_floats((size_t)T * C, 0.02f);
    float* dout = random_floats((size_t)B * T * C, 1.0f);
    round_like_floatX(wte, (size_t)V * C);
    round_like_floatX(wpe, (size_t)T * C);
    round_like_floatX(dout, (size_t)B * T * C);
    float* out = (float*)malloc_check((size_t)B * T * C * sizeof(float));
    float* dwte = (float*)calloc_check((size_t)V * C, sizeof(float));
    float* dwpe = (float*)calloc_check((size_t)T * C, sizeof(float));
    cpu::encoder_forward(out, inp, wte, wpe, B, T, C);
    cpu::encoder_backward(dwte, dwpe, dout, inp, B, T, C);

    int* d_inp = (int*)device_malloc((size_t)B * T * sizeof(int));
    copy_host_to_device(d_inp, inp, (size_t)B * T * sizeof(int));
    floatX *d_wte = to_device(wte, (size_t)V * C), *d_wpe = to_device(wpe, (size_t)T * C);
    floatX* d_dout = to_device(dout, (size_t)B * T * C);
    floatX* d_out = (floatX*)device_malloc((size_t)B * T * C * sizeof(floatX));
    floatX* d_dwte = (floatX*)device_malloc((size_t)V * C * sizeof(floatX));
    floatX* d_dwpe = (floatX*)device_malloc((size_t)T * C * sizeof(floatX));
    float* d_dwte_f32 = (float*)device_malloc((size_t)V * C * sizeof(float));
    float tol = default_tolerance(), ms;
    int ok = 1;
    printf("encoder B=%d T=%d C=%d (%s)\n", B, T, C, PRECISION_NAME);

    encoder_forward(d_out, d_inp, d_wte, d_wpe, B, T, C);
    ok &= validate("forward", d_out, out, (size_t)B * T * C, tol);
    TIME_KERNEL(ms, 20, encoder_forward(d_out, d_inp, d_wte, d_wpe, B, T, C));
    report("forward", ms, 3.0 * B * T * C * sizeof(floatX), 0);

    device_memset_zero(d_dwte_f32, (size_t)V * C * sizeof(float));
    encoder_backward_wte_v1<<<ceil_div((size_t)B * T * C, 256), 256>>>(d_dwte_f32, d_dout, d_inp, B * T, C);
    cudaCheckLaunch();
    ok &= validate_f32("v1 dwte (atomics)", d_dwte_f32, dwte, (size_t)V * C, tol);
    TIME_KERNEL(ms, 10, (encoder_backward_wte_v1<<<ceil_div((size_t)B * T * C, 256), 256>>>(d_dwte_f32, d_dout, d_inp, B * T, C)));
    report("v1 dwte (atomics)", ms, 0, 0);

    device_memset_zero(d_dwte, (size_t)V * C * sizeof(floatX));
    device_memset_zero(d_dwpe, (size_t)T * C * sizeof(floatX));
    encoder_backward(d_dwte, d_dwpe, d_dout, inp, B, T, C);
    ok &= validate("v2 dwte (buckets)", d_dwte, dwte, (size_t)V * C, tol);
    ok &= validate("v2 dwpe", d_dwpe, dwpe, (size_t)T * C, tol);
    TIME_KERNEL(ms, 10, encoder_backward(d_dwte, d_dwpe, d_dout, inp, B, T, C));
    report("v2 dwte + dwpe", ms, 0, 0);

    // one token in half the positions (as a space or a newline can be): its bucket, far longer
    // than the others, is split over the block's warps
    int* frequent = (int*)malloc_check((size_t)B * T * sizeof(int));
    for (int i = 0; i < B * T; i++) frequent[i] = i % 2 ? 220 : inp[i];
    memset(dwte, 0, (size_t)V * C * sizeof(float));
    memset(dwpe, 0, (size_t)T * C * sizeof(float));
    cpu::encoder_backward(dwte, dwpe, dout, frequent, B, T, C);
    device_memset_zero(d_dwte, (size_t)V * C * sizeof(floatX));
    device_memset_zero(d_dwpe, (size_t)T * C * sizeof(floatX));
    encoder_backward(d_dwte, d_dwpe, d_dout, frequent, B, T, C);
    ok &= validate("v2 dwte, half the batch one token", d_dwte, dwte, (size_t)V * C, tol);

    // a vocabulary-parallel embedding: a third of the tokens on another rank, then all of them
    for (int i = 0; i < B * T; i++) {
        if (rng_u64(&dev_rng) % 3 == 0) inp[i] = -1;
    }
    ok &= check_other_rank_tokens("tokens of -1 (a third of them), no wpe", inp, wte, dout, d_inp, d_wte, d_dout,
                                  d_out, d_dwte, d_dwpe, B, T, C, V);
    for (int i = 0; i < B * T; i++) inp[i] = -1;
    ok &= check_other_rank_tokens("every token -1, no wpe", inp, wte, dout, d_inp, d_wte, d_dout, d_out, d_dwte,
                                  d_dwpe, B, T, C, V);
    return finish(ok);
}
