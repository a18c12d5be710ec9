// Unit tests of the step-time model (llmc/step_time.h) on a device of round numbers, each part
// against a case worked by hand:
//   - a kernel: compute-bound, max(F / (peak x efficiency), ...), and memory-bound, bytes /
//     (bandwidth x efficiency_memory);
//   - attention's useful FLOPs: cuBLAS's rows multiply full T x T squares, 4 B NH T^2 hs a layer
//     forward against the useful 2 B NH T (T + 1) hs, so their factor is (T + 1) / (2 T);
//   - data parallelism: two ranks of one node take exactly one ring all-reduce of the gradients
//     (2 alpha + P X / beta) longer than one rank, the compute being the same; over two nodes
//     the inter-node link's; with -overlap shorter by what the backward hides of it;
//   - ranks sharing the cores of a CPU: 4 ranks on 2 cores compute at half the speed;
//   - a pipeline message across nodes costs its latency and bytes where the receiver waits;
//   - the step's throughput and MFU from their definitions.
// Expected values come from the formulas written here, not from a run of the model.
#include <math.h>
#include <stdio.h>
#include "llmc/step_time.h"

static int failures = 0;
#define CHECK(cond, ...) do { if (!(cond)) { failures++; printf("FAIL: " __VA_ARGS__); printf("\n"); } } while (0)

static int close_to(double a, double b, double rel) { return fabs(a - b) <= rel * fabs(b) + 1e-300; }

// a device of round numbers: 1e12 FLOP/s at efficiency 0.5 (GEMMs and attention alike), 1e9
// bytes/s at 0.5, links of 1 us and 1e9 bytes/s inside a node, 10 us and 1e8 across
static DeviceProfile round_device(void) {
    DeviceProfile p;
    memset(&p, 0, sizeof(p));
    snprintf(p.name, sizeof(p.name), "round");
    p.kind = DEVICE_CUDA;
    p.peak_flops_fp32 = p.peak_flops_bf16 = 1e12;
    p.memory_bandwidth_bytes_per_s = 1e9, p.memory_bytes = 1e12;
    p.efficiency_matmul_large = p.efficiency_matmul_small = 0.5, p.matmul_small_flops = 1.0;
    p.efficiency_attention = 0.5, p.efficiency_memory = 0.5;
    p.intra_node_latency_s = 1e-6, p.intra_node_bandwidth_bytes_per_s = 1e9;
    p.inter_node_latency_s = 1e-5, p.inter_node_bandwidth_bytes_per_s = 1e8;
    p.gpus_per_node = 8, p.efficiency_link = 1.0;
    return p;
}

static GPT2Config tiny_model(void) {
    GPT2Config c;
    memset(&c, 0, sizeof(c));
    c.max_seq_len = 64, c.vocab_size = 1000, c.padded_vocab_size = 1024;
    c.num_layers = 2, c.num_heads = 4, c.channels = 64;
    return c;
}

static RunLayout layout(TrainerKind trainer, int dp, int pp, int m) {
    RunLayout r;
    memset(&r, 0, sizeof(r));
    r.trainer = trainer, r.dp = dp, r.tp = 1, r.pp = pp, r.V = 1, r.sched = SCHEDULE_1F1B, r.m = m, r.B = 4, r.T = 64;
    return r;
}

static StepOptions fp32_kernels(void) {
    StepOptions o;
    memset(&o, 0, sizeof(o));
    o.X = 4, o.flash = 0, o.bias_epilogue = 1, o.gelu_epilogue = 0, o.ln_backward_fused = 1;
    return o;
}

int main(void) {
    DeviceProfile p = round_device();
    GPT2Config c = tiny_model();

    // a kernel: 2e9 FLOPs on 1e3 bytes is compute-bound, 2e9 / (1e12 x 0.5) = 4 ms; a vector pass
    // of 1e6 bytes memory-bound, 1e6 / (1e9 x 0.5) = 2 ms
    StepKernel gemm, vec;
    memset(&gemm, 0, sizeof(gemm));
    gemm.engine = STEP_GEMM, gemm.op = "matmul", gemm.flops = 2e9, gemm.bytes = 1e3;
    vec = gemm;
    vec.engine = STEP_VECTOR, vec.op = "layernorm", vec.flops = 1e6, vec.bytes = 1e6;
    CHECK(close_to(time_kernel_seconds(&p, &gemm, gemm.flops, 4, 1.0), 4e-3, 1e-12), "a compute-bound GEMM: %g s, expected 4 ms",
          time_kernel_seconds(&p, &gemm, gemm.flops, 4, 1.0));
    CHECK(close_to(time_kernel_seconds(&p, &vec, vec.flops, 4, 1.0), 2e-3, 1e-12), "a memory-bound pass: %g s, expected 2 ms",
          time_kernel_seconds(&p, &vec, vec.flops, 4, 1.0));

    // attention's factor on cuBLAS's squares
    RunLayout one = layout(TRAINER_DP, 1, 1, 1);
    StepLayout o = step_layout_of_run(&one, 0, fp32_kernels());
    StepKernel rows[STEP_KERNELS_MAX];
    int n = step_kernels(rows, STEP_KERNELS_MAX, c, o);
    double scale = time_attention_useful_scale(rows, n, c, &o, STEP_PHASE_FORWARD), T = one.T;
    CHECK(close_to(scale, (T + 1) / (2 * T), 1e-12), "cuBLAS attention's useful share forward: %g, expected (T+1)/(2T) = %g",
          scale, (T + 1) / (2 * T));
    double backward = time_attention_useful_scale(rows, n, c, &o, STEP_PHASE_BACKWARD_INPUT);
    CHECK(backward > 0.0 && backward < 1.0, "cuBLAS attention's useful share backward: %g, expected in (0, 1)", backward);

    // two ranks against one: the same compute, and one ring all-reduce of the P X gradient bytes
    // (two ranks in one node: 2 steps of alpha + (n/2) / beta)
    StepTime t1 = step_time_predict(&p, c, &one, fp32_kernels(), 8);
    RunLayout two_ranks = layout(TRAINER_DP, 2, 1, 1);
    StepTime t2 = step_time_predict(&p, c, &two_ranks, fp32_kernels(), 8);
    double n_bytes = (double)gpt2_num_parameters(c) * 4, all_reduce = 2 * p.intra_node_latency_s + n_bytes / 1e9;
    CHECK(close_to(t2.seconds - t1.seconds, all_reduce, 1e-9), "dp 2 - dp 1: %g s, expected the all-reduce's 2 alpha + P X / beta = %g",
          t2.seconds - t1.seconds, all_reduce);
    CHECK(close_to(t2.comm_exposed[3], all_reduce, 1e-9) && t1.comm_total[3] == 0.0, "dp's exposed time %g, expected %g",
          t2.comm_exposed[3], all_reduce);
    for (int k = 0; k < TIME_COMPUTE_KINDS; k++) {
        CHECK(close_to(t2.compute[k], t1.compute[k], 1e-12), "%s compute differs between dp 1 and dp 2: %g, %g",
              time_compute_names[k], t1.compute[k], t2.compute[k]);
    }
    // the same ranks on nodes of one GPU: the all-reduce crosses nodes, 2 (10 us) + P X / 1e8
    StepTime t2_apart = step_time_predict(&p, c, &two_ranks, fp32_kernels(), 1);
    double apart = 2 * p.inter_node_latency_s + n_bytes / 1e8;
    CHECK(close_to(t2_apart.seconds - t1.seconds, apart, 1e-9), "dp 2 over two nodes - dp 1: %g s, expected %g",
          t2_apart.seconds - t1.seconds, apart);

    // -overlap: the buckets' all-reduces run under the backward (their rows' hidden_by), so the
    // step is shorter by what the backward hides and the rest stays exposed. Inside a node (1e9
    // bytes/s) the backward hides all of it; across nodes of a link a thousand times slower
    // (1e5 bytes/s) a part, at most the step's compute
    RunLayout overlapped = two_ranks;
    overlapped.overlap = 1;
    DeviceProfile slow = p;
    slow.inter_node_bandwidth_bytes_per_s = 1e5;
    for (int gpus_per_node = 8; gpus_per_node >= 1; gpus_per_node /= 8) {
        StepTime plain = step_time_predict(&slow, c, &two_ranks, fp32_kernels(), gpus_per_node);
        StepTime hidden = step_time_predict(&slow, c, &overlapped, fp32_kernels(), gpus_per_node);
        double total = hidden.comm_total[3], exposed = hidden.comm_exposed[3], compute = 0.0;
        for (int k = 0; k < TIME_COMPUTE_KINDS; k++) compute += hidden.compute[k];
        CHECK(close_to(total, plain.comm_total[3], 1e-12), "-overlap changed the all-reduce itself: %g, %g", total,
              plain.comm_total[3]);
        CHECK(gpus_per_node == 8 ? exposed == 0.0 : exposed > 0.0 && exposed < total && total - exposed <= compute,
              "-overlap, %d GPUs a node: dp exposed %g of %g", gpus_per_node, exposed, total);
        CHECK(close_to(plain.seconds - hidden.seconds, total - exposed, 1e-9), "-overlap shortens the step by %g s, expected "
              "the hidden %g", plain.seconds - hidden.seconds, total - exposed);
    }

    // throughput and MFU: B T tokens a replica and micro-batch; the model's FLOPs a token
    double tokens = 2.0 * one.B * one.T;
    CHECK(close_to(t2.tokens_per_second, tokens / t2.seconds, 1e-12), "tokens/s %g, expected %g", t2.tokens_per_second,
          tokens / t2.seconds);
    CHECK(close_to(t2.mfu, gpt2_flops_per_token(c, one.T) * tokens / t2.seconds / (2 * 1e12), 1e-12), "MFU %g", t2.mfu);

    // ranks that share a CPU's cores: 4 ranks of one thread on 2 cores compute at half the speed
    DeviceProfile cpu = p;
    cpu.kind = DEVICE_CPU, cpu.cpu_cores = 2, cpu.cpu_threads = 1;
    RunLayout four = layout(TRAINER_DP, 4, 1, 1);
    StepTime alone = step_time_predict(&cpu, c, &one, fp32_kernels(), 1024);
    StepTime shared = step_time_predict(&cpu, c, &four, fp32_kernels(), 1024);
    CHECK(close_to(shared.compute[TIME_GEMM], 2 * alone.compute[TIME_GEMM], 1e-12), "4 ranks on 2 cores: GEMMs %g s, expected twice %g",
          shared.compute[TIME_GEMM], alone.compute[TIME_GEMM]);

    // a pipeline of two stages, one micro-batch: F on stage 0, the message, F and B on stage 1, the
    // message back, B on stage 0. On nodes of one GPU each message costs inter-node alpha + bytes
    // / beta more than inside a node (alpha 1 us, 1e9): twice the difference, B T C X bytes each
    RunLayout pipe = layout(TRAINER_PP, 1, 2, 1);
    StepTime near = step_time_predict(&p, c, &pipe, fp32_kernels(), 8), far = step_time_predict(&p, c, &pipe, fp32_kernels(), 1);
    double message = (double)pipe.B * pipe.T * c.channels * 4;
    double extra = 2 * ((p.inter_node_latency_s + message / 1e8) - (p.intra_node_latency_s + message / 1e9));
    CHECK(close_to(far.schedule - near.schedule, extra, 1e-9), "pp 2 across nodes: the schedule %g s longer, expected %g",
          far.schedule - near.schedule, extra);
    CHECK(near.bubble > 0.0 && near.bubble < near.schedule, "pp 2: stage 0's idle time %g of %g", near.bubble, near.schedule);

    printf("%d failures\n", failures);
    if (failures == 0) printf("step time ok\n");
    return failures != 0;
}
