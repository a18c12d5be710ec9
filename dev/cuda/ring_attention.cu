/*
Context parallelism's block attention (llmc/cuda/ring_attention.cuh), checked against the CPU
backend's (llmc/cpu/ring_attention.h): one rank's queries against each rank's block of keys and
values in ring order, merged by log-sum-exp, then the backward through every block. cp = 2, both
splits, chunks of odd length below a tile and past two: every tile case (whole, diagonal,
masked), a ragged last tile, and on the diagonal a chunk of several tiles.
  make dev/cuda/ring_attention && ./dev/cuda/ring_attention
v1 plain: one thread per query row (forward, dq) or key row (dk, dv), fp32 sums in registers;
   any precision and head size (the trainers' kernels in fp32 builds).
v2 flash: flash_attention.cuh's tensor-core kernels on one chunk pair at a time, the merge in
   fp32 in the forward's epilogue (bf16 builds, head sizes 16, 32, 64: the trainers' kernels
   there). p and ds are rounded to bf16 for the tensor cores, as in the library's flash
   attention: the tolerance is bf16's on o, dq, dk, dv.
v3 fa3: the pairs on Hopper's machinery (sm_90a bf16 builds, head size 64; the trainers' kernels
   there with LLMC_FLASH=fa3): flash_hopper.cuh's v11 forward (TMA ring, a producer warpgroup,
   two consumer warpgroups in pingpong, the softmax under the previous tile's p v) and
   flash_hopper_backward.cuh's v9 backward (a producer warp, two consumer warpgroups in pingpong,
   dK dV and a separate dQ pass), each pair's rows through three tensor maps. v2's
   tolerance; the backward run twice from zero gives the same bits (no atomics). Under the
   emulator it is validated (both orders) but not timed. sm_90a, ptxas -v: see the fa3 section
   of llmc/cuda/ring_attention.cuh (registers, shared memory, spills).
*/
#include "common.h"
#include "llmc/cp_layout.h"
namespace cpu {
#include "llmc/cpu/ring_attention.h"
}
#include "llmc/cuda/ring_attention.cuh"

// the versions: v1 everywhere, v2 where it is built, v3 in sm_90a bf16 builds at head size 64
static int last_version(int hs) {
#if !FLOATX_IS_FLOAT && defined(LLMC_WGMMA)
    if (hs == 64) return 3;
#endif
    return ring_flash_supports(hs) ? 2 : 1;
}
static const char* version_name(int v) { return v == 1 ? "plain" : v == 2 ? "flash" : "fa3 (TMA, pingpong, wgmma)"; }
static void forward_version(int v, float* o, float* lse, float* scratch, const floatX* qkv, const floatX* kv, CpChunks q,
                            CpChunks k, int B, int C, int NH, int first) {
#if !FLOATX_IS_FLOAT && defined(LLMC_WGMMA)
    if (v == 3) return attention_block_forward_fa3(o, lse, scratch, qkv, kv, q, k, B, C, NH, first);
#endif
#if !FLOATX_IS_FLOAT
    if (v == 2) return attention_block_forward_flash(o, lse, scratch, qkv, kv, q, k, B, C, NH, first);
#endif
    (void)v, (void)scratch;
    attention_block_forward_plain(o, lse, qkv, kv, q, k, B, C, NH, first);
}
static void backward_version(int v, float* dq, float* dkv, const floatX* datty, const float* lse, const float* D,
                             const floatX* qkv, const floatX* kv, CpChunks q, CpChunks k, int B, int C, int NH) {
#if !FLOATX_IS_FLOAT && defined(LLMC_WGMMA)
    if (v == 3) return attention_block_backward_fa3(dq, dkv, datty, lse, D, qkv, kv, q, k, B, C, NH);
#endif
#if !FLOATX_IS_FLOAT
    if (v == 2) return attention_block_backward_flash(dq, dkv, datty, lse, D, qkv, kv, q, k, B, C, NH);
#endif
    (void)v;
    attention_block_backward_plain(dq, dkv, datty, lse, D, qkv, kv, q, k, B, C, NH);
}

// one rank's attention over the whole sequence, forward and backward, on the CPU and the GPU.
// spikes: every 64th key from key 40 on (of each block's flat B Tl tokens) 32 times larger, so that
// the flash forward's running max moves on later tiles too (dev/cuda/attention_forward's spiked keys)
static int check(CpSplit split, int cp, int len, int B, int C, int NH, int rank, int spikes = 0) {
    int n = split == CP_ZIGZAG ? 2 : 1, T = n * cp * len, Tl = n * len;
    size_t qkv_n = (size_t)B * Tl * 3 * C, block = (size_t)B * Tl * 2 * C, out_n = (size_t)B * Tl * C;
    size_t rows = (size_t)B * NH * Tl;
    float* qkv = random_floats(qkv_n, 1.0f);  // this rank's q, k, v
    float* dout = random_floats(out_n, 1.0f);
    float* kv = random_floats(cp * block, 1.0f);  // every rank's block of keys and values
    for (size_t t = 40; spikes && t < (size_t)cp * B * Tl; t += 64) {
        for (int c = 0; c < C; c++) kv[t * 2 * C + c] *= 32.0f;  // k: columns 0.. of a block's (B, Tl, 2C)
        if (t < (size_t)B * Tl)
            for (int c = 0; c < C; c++) qkv[t * 3 * C + C + c] *= 32.0f;  // this rank's own k (kv_pack copies it)
    }
    round_like_floatX(qkv, qkv_n);
    round_like_floatX(dout, out_n);
    round_like_floatX(kv, cp * block);
    cpu::kv_pack(kv + rank * block, qkv, B, Tl, C);  // its own block is its qkv's
    CpChunks mine = cp_chunks_of(split, T, cp, rank);
    // the CPU: blocks in ring order (its own first), then the backward through each
    float *o = (float*)malloc_check(out_n * sizeof(float)), *lse = (float*)malloc_check(rows * sizeof(float));
    float *D = (float*)malloc_check(rows * sizeof(float)), *dq = (float*)calloc_check(out_n, sizeof(float));
    float* dkv = (float*)calloc_check(cp * block, sizeof(float));
    for (int s = 0; s < cp; s++) {
        int owner = (rank + cp - s) % cp;
        cpu::attention_block_forward(o, lse, NULL, qkv, kv + owner * block, mine, cp_chunks_of(split, T, cp, owner), B, C, NH,
                                     s == 0);
    }
    cpu::attention_block_backward_prepare(D, dout, o, B, Tl, C, NH);
    for (int owner = 0; owner < cp; owner++) {
        cpu::attention_block_backward(dq, dkv + owner * block, dout, lse, D, qkv, kv + owner * block, mine,
                                      cp_chunks_of(split, T, cp, owner), B, C, NH);
    }
    // the GPU, the same steps (the o it merges is fp32; atty, its floatX copy, feeds D as in the
    // trainer, so D is compared with a floatX tolerance)
    floatX *d_qkv = to_device(qkv, qkv_n), *d_dout = to_device(dout, out_n), *d_kv = to_device(kv, cp * block);
    floatX *d_atty = (floatX*)device_malloc(out_n * sizeof(floatX)), *d_packed = (floatX*)device_malloc(block * sizeof(floatX));
    float *d_o = (float*)device_malloc(out_n * sizeof(float)), *d_lse = (float*)device_malloc(rows * sizeof(float));
    float *d_D = (float*)device_malloc(rows * sizeof(float)), *d_dq = (float*)device_malloc(out_n * sizeof(float));
    float *d_scratch = (float*)device_malloc(rows * sizeof(float)), *d_dkv = (float*)device_malloc(cp * block * sizeof(float));
    int ok = 1;
    printf("%s cp=%d T=%d (chunks of %d), rank %d, B=%d C=%d NH=%d (%s)%s\n", cp_split_name(split), cp, T, len, rank, B, C,
           NH, PRECISION_NAME, spikes ? ", spiked keys" : "");
    kv_pack(d_packed, d_qkv, B, Tl, C);
    ok &= validate("kv_pack", d_packed, kv + rank * block, block, 0.0f);
    int last = last_version(C / NH);
    for (int v = 1; v <= last; v++) {
        // v1: fp32 sums of the same floatX inputs in another order; v2, v3: p and ds in bf16 on the
        // tensor cores (lse and D stay fp32 sums)
        float tol = v == 1 ? 1e-4f : default_tolerance(), tol_lse = v == 1 ? 1e-4f : 1e-3f;
        char name[64];
        printf(" v%d %s\n", v, version_name(v));
        for (int s = 0; s < cp; s++) {
            int owner = (rank + cp - s) % cp;
            forward_version(v, d_o, d_lse, d_scratch, d_qkv, d_kv + owner * block, mine, cp_chunks_of(split, T, cp, owner), B, C,
                            NH, s == 0);
        }
        ok &= validate_f32("forward o", d_o, o, out_n, tol);
        ok &= validate_f32("forward lse", d_lse, lse, rows, tol_lse);
        if (spikes) {  // (what the spikes test is the forward's rescale)
            printf("  backward, timing       not with spiked keys: dq and D from bf16 values this large are off by more than the tolerance, on both paths\n");
            continue;
        }
        attention_block_output(d_atty, d_o, out_n);
        attention_block_backward_prepare(d_D, d_dout, d_atty, B, Tl, C, NH);
        ok &= validate_f32("backward D", d_D, D, rows, FLOATX_IS_FLOAT ? 1e-4f : default_tolerance());
        // the backward from the CPU's lse and D, so that dq and dkv are checked alone
        cudaCheck(cudaMemcpy(d_D, D, rows * sizeof(float), cudaMemcpyHostToDevice));
        cudaCheck(cudaMemcpy(d_lse, lse, rows * sizeof(float), cudaMemcpyHostToDevice));
        device_memset_zero(d_dq, out_n * sizeof(float));
        device_memset_zero(d_dkv, cp * block * sizeof(float));
        for (int owner = 0; owner < cp; owner++) {
            backward_version(v, d_dq, d_dkv + owner * block, d_dout, d_lse, d_D, d_qkv, d_kv + owner * block, mine,
                             cp_chunks_of(split, T, cp, owner), B, C, NH);
        }
        ok &= validate_f32("backward dq", d_dq, dq, out_n, tol);
        ok &= validate_f32("backward dk, dv", d_dkv, dkv, cp * block, tol);
        if (v == 3) {  // deterministic: a second run from zero gives the same bits
            float *dq1 = (float*)malloc_check(out_n * sizeof(float)), *dkv1 = (float*)malloc_check(cp * block * sizeof(float));
            cudaCheck(cudaMemcpy(dq1, d_dq, out_n * sizeof(float), cudaMemcpyDeviceToHost));
            cudaCheck(cudaMemcpy(dkv1, d_dkv, cp * block * sizeof(float), cudaMemcpyDeviceToHost));
            device_memset_zero(d_dq, out_n * sizeof(float));
            device_memset_zero(d_dkv, cp * block * sizeof(float));
            for (int owner = 0; owner < cp; owner++) {
                backward_version(v, d_dq, d_dkv + owner * block, d_dout, d_lse, d_D, d_qkv, d_kv + owner * block, mine,
                                 cp_chunks_of(split, T, cp, owner), B, C, NH);
            }
            ok &= validate_f32("backward dq, 2nd run", d_dq, dq1, out_n, 0.0f);
            ok &= validate_f32("backward dk, dv, 2nd run", d_dkv, dkv1, cp * block, 0.0f);
            free(dq1), free(dkv1);
        }
#ifdef CUDA_EMU
        if (v == 3) continue;  // (not timed under the emulator: each timing loop is two more runs)
#endif
        // timing: one block forward and backward (the other rank's, the first step after its own)
        float ms;
        int other = (rank + cp - 1) % cp;
        CpChunks theirs = cp_chunks_of(split, T, cp, other);
        double flops = 4.0 * B * NH * cp_attention_work(mine, theirs) * (C / NH);  // q k and p v: 2 flops a product each
        TIME_KERNEL(ms, 10, forward_version(v, d_o, d_lse, d_scratch, d_qkv, d_kv + other * block, mine, theirs, B, C, NH, 0));
        snprintf(name, sizeof(name), "v%d block forward", v);
        report(name, ms, 0, flops);
        TIME_KERNEL(ms, 10, backward_version(v, d_dq, d_dkv + other * block, d_dout, d_lse, d_D, d_qkv, d_kv + other * block,
                                             mine, theirs, B, C, NH));
        snprintf(name, sizeof(name), "v%d block backward", v);
        report(name, ms, 0, 2.5 * flops);
    }
    free(qkv), free(dout), free(kv), free(o), free(lse), free(D), free(dq), free(dkv);
    device_free(d_qkv), device_free(d_dout), device_free(d_kv), device_free(d_atty), device_free(d_packed);
    device_free(d_o), device_free(d_lse), device_free(d_D), device_free(d_dq), device_free(d_dkv), device_free(d_scratch);
    return ok;
}

int main(void) {
    int B = GPU_OR_EMU(4, 2), C = GPU_OR_EMU(768, 128), NH = GPU_OR_EMU(12, 2);  // (emulated: head size 64, as the trainers)
    int ok = 1;
    // odd chunks; each rank of cp = 2 (its own block diagonal, the other's whole or masked); below
    // a tile (3, 5) and past two (131: three tiles of keys, the last ragged, so that a loop
    // prefetches into a buffer the tile before used: what its barriers guard, which the mutation
    // sweep deletes)
    for (int rank = 0; rank < 2; rank++) {
        ok &= check(CP_ZIGZAG, 2, GPU_OR_EMU(255, 3), B, C, NH, rank);
        ok &= check(CP_CONTIGUOUS, 2, GPU_OR_EMU(511, 5), B, C, NH, rank);
    }
    ok &= check(CP_ZIGZAG, 2, GPU_OR_EMU(1023, 131), B, C, NH, 1);
    ok &= check(CP_ZIGZAG, 2, GPU_OR_EMU(1023, 131), B, C, NH, 1, 1);  // spiked keys
    // the flash kernels' other head sizes, 16 and 32 (two tiles, the second ragged)
    ok &= check(CP_ZIGZAG, 2, GPU_OR_EMU(255, 67), B, 16 * NH, NH, 1);
    ok &= check(CP_CONTIGUOUS, 2, GPU_OR_EMU(255, 67), B, 32 * NH, NH, 1);
    // a head size no flash kernel takes (48: the plain path alone), where the row dot D gives each
    // head 16 threads of 3 values instead of packs of 16 bytes
    ok &= check(CP_ZIGZAG, 2, GPU_OR_EMU(63, 5), B, 48 * NH, NH, 0);
    return finish(ok);
}
