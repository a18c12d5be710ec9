// Unit tests of the step-time model (llmc/step_time.h) on a device of round numbers, each part
// against a case worked by hand:
//   - a kernel: compute-bound, max(F / (peak x efficiency), ...), and memory-bound, bytes /
//     (bandwidth x efficiency_memory), the optimizer's passes at efficiency_optimizer where given;
//     on a CPU the sum of the two;
//   - attention's useful FLOPs: cuBLAS's rows multiply full T x T squares, 4 B NH T^2 hs a layer
//     forward against the useful 2 B NH T (T + 1) hs, so their factor is (T + 1) / (2 T);
//   - data parallelism: two ranks of one node take exactly one ring all-reduce of the gradients
//     (2 alpha + P X / beta) longer than one rank, the compute being the same; over two nodes
//     the inter-node link's; with -overlap shorter by what the backward hides of it (on a GPU;
//     on a CPU not at all);
//   - ranks sharing the cores of a CPU: 4 ranks on 2 cores compute at half the speed (at full
//     speed on hosts of 2: ranks a host are min(world, gpus_per_node)); the share of the compute
//     lost meeting (ranks arriving apart), between its measured counts; passes within the cache at the
//     in-cache fraction, a GEMM beyond it at its own efficiency; with the
//     fractions calibrate measured, the host's throughput straight between them (3 ranks between 2
//     and 4, 16 past the last at 8's); the ranks computing at once when some wait in MPI; the
//     links as a step of the all-reduce measured over as many ranks, ZeRO's reduce-scatter and
//     all-gather as those measured (past 2 MB at their own bandwidth); a pipeline whose stages take
//     turns (pp 2, one micro-batch) computing at a lone rank's speed when waiting takes no core,
//     at the shared speed when it takes a whole one; a GPU profile ignoring all of it;
//   - -offload's host rows on the profile's host and its PCIe link;
//   - a pipeline message across nodes costs its latency and bytes where the receiver waits; the
//     messages' exposed time (pp's) is what they add to the schedule, the bubble stage 0's idle
//     with free messages, on a GPU and on a CPU (where the sender's core copies each one);
//   - the schedules that split the backward (zb, zbv, dualpipev) play W apart from B;
//   - each group's exposed time split by link (intra-node, inter-node, pcie) adds up to it;
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
    TimeShare lone = time_share_lone();
    memset(&gemm, 0, sizeof(gemm));
    gemm.engine = STEP_GEMM, gemm.op = "matmul", gemm.flops = 2e9, gemm.bytes = 1e3;
    vec = gemm;
    vec.engine = STEP_VECTOR, vec.op = "layernorm", vec.flops = 1e6, vec.bytes = 1e6;
    CHECK(close_to(time_kernel_seconds(&p, &gemm, gemm.flops, 4, lone), 4e-3, 1e-12), "a compute-bound GEMM: %g s, expected 4 ms",
          time_kernel_seconds(&p, &gemm, gemm.flops, 4, lone));
    CHECK(close_to(time_kernel_seconds(&p, &vec, vec.flops, 4, lone), 2e-3, 1e-12), "a memory-bound pass: %g s, expected 2 ms",
          time_kernel_seconds(&p, &vec, vec.flops, 4, lone));
    // on a CPU the two add (the core packs the operands between its FMAs): 4 ms + 1e3 / (1e9 x 0.5)
    // = 4.002 ms; the vector pass, of no FLOPs at a GEMM's rate, its 2 ms still
    DeviceProfile one_cpu = p;
    one_cpu.kind = DEVICE_CPU;
    CHECK(close_to(time_kernel_seconds(&one_cpu, &gemm, gemm.flops, 4, lone), 4.002e-3, 1e-12),
          "a GEMM on a CPU: %g s, expected 4.002 ms", time_kernel_seconds(&one_cpu, &gemm, gemm.flops, 4, lone));
    CHECK(close_to(time_kernel_seconds(&one_cpu, &vec, vec.flops, 4, lone), 2e-3, 1e-12), "a pass on a CPU: %g s, expected 2 ms",
          time_kernel_seconds(&one_cpu, &vec, vec.flops, 4, lone));
    // the optimizer's passes (the gradient norm, AdamW) at efficiency_optimizer where the profile
    // gives it: 1e6 bytes / (1e9 x 1.25) = 0.8 ms; a LayerNorm's beside it keeps its 2 ms; absent,
    // the optimizer's take efficiency_memory's 2 ms too
    StepKernel optimizer_pass = vec;
    optimizer_pass.op = "optimizer";
    CHECK(close_to(time_kernel_seconds(&one_cpu, &optimizer_pass, optimizer_pass.flops, 4, lone), 2e-3, 1e-12),
          "AdamW without efficiency_optimizer: %g s, expected efficiency_memory's 2 ms",
          time_kernel_seconds(&one_cpu, &optimizer_pass, optimizer_pass.flops, 4, lone));
    DeviceProfile measured_optimizer = one_cpu;
    measured_optimizer.efficiency_optimizer = 1.25;
    CHECK(close_to(time_kernel_seconds(&measured_optimizer, &optimizer_pass, optimizer_pass.flops, 4, lone), 0.8e-3, 1e-12),
          "AdamW at efficiency_optimizer 1.25: %g s, expected 0.8 ms",
          time_kernel_seconds(&measured_optimizer, &optimizer_pass, optimizer_pass.flops, 4, lone));
    CHECK(close_to(time_kernel_seconds(&measured_optimizer, &vec, vec.flops, 4, lone), 2e-3, 1e-12),
          "a LayerNorm beside efficiency_optimizer: %g s, expected 2 ms still",
          time_kernel_seconds(&measured_optimizer, &vec, vec.flops, 4, lone));

    // attention's useful FLOPs: 2 T (T + 1) hs a head, sequence and layer forward, twice that backward
    RunLayout one = layout(TRAINER_DP, 1, 1, 1);
    StepLayout o = step_layout_of_run(&one, 0, fp32_kernels());
    double T = one.T, useful = 2 * T * (T + 1) * c.channels * one.B * c.num_layers;  // (hs x heads = C)
    CHECK(close_to(time_attention_useful_flops(c, &o, STEP_PHASE_FORWARD), useful, 1e-12),
          "attention's useful FLOPs forward: %g, expected 2 T (T+1) C B L = %g", time_attention_useful_flops(c, &o, STEP_PHASE_FORWARD),
          useful);
    CHECK(close_to(time_attention_useful_flops(c, &o, STEP_PHASE_BACKWARD_INPUT), 2 * useful, 1e-12),
          "attention's useful FLOPs backward: %g, expected twice the forward's", time_attention_useful_flops(c, &o, STEP_PHASE_BACKWARD_INPUT));

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

    // on a CPU nothing hides (MPI's copies and sums run on the rank's own core): -overlap's step is
    // the plain one, its all-reduce exposed whole (8 cores: the 2 ranks share none)
    DeviceProfile cpu_links = p;
    cpu_links.kind = DEVICE_CPU, cpu_links.cpu_cores = 8, cpu_links.cpu_threads = 1;
    StepTime cpu_plain = step_time_predict(&cpu_links, c, &two_ranks, fp32_kernels(), 8);
    StepTime cpu_overlap = step_time_predict(&cpu_links, c, &overlapped, fp32_kernels(), 8);
    CHECK(cpu_overlap.seconds == cpu_plain.seconds && cpu_overlap.comm_exposed[3] == cpu_overlap.comm_total[3] &&
              cpu_overlap.comm_total[3] > 0.0,
          "-overlap on a CPU: %g s against %g without, dp exposed %g of %g", cpu_overlap.seconds, cpu_plain.seconds,
          cpu_overlap.comm_exposed[3], cpu_overlap.comm_total[3]);

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
    // the same 4 ranks on hosts of 2 (gpus_per_node 2 on a CPU: ranks a host): two hosts of 2 cores,
    // each core its own rank's, so the GEMMs take a lone rank's time; 1 rank a host likewise
    for (int per_host = 1; per_host <= 2; per_host++) {
        StepTime spread = step_time_predict(&cpu, c, &four, fp32_kernels(), per_host);
        CHECK(close_to(spread.compute[TIME_GEMM], alone.compute[TIME_GEMM], 1e-12),
              "4 ranks, %d a host of 2 cores: GEMMs %g s, expected a lone rank's %g", per_host, spread.compute[TIME_GEMM],
              alone.compute[TIME_GEMM]);
    }

    // the host's throughput in lone ranks' worth from measured fractions 0.8, 0.5, 0.3 at 2, 4, 8
    // ranks: A = 1.6, 2.0, 2.4, straight between. 3 ranks: A = 1.8, slowdown 3 / 1.8; 1.5 ranks:
    // A = 1 + 0.5 (1.6 - 1) = 1.3; 16 ranks: A stays 2.4. The memory-bound passes by their own
    // fractions (0.9 at 2 alone: A = 1.8 at 2 ranks and past)
    DeviceProfile shared_cpu = cpu;
    shared_cpu.cpu_gemm_fraction_2_ranks = 0.8, shared_cpu.cpu_gemm_fraction_4_ranks = 0.5;
    shared_cpu.cpu_gemm_fraction_8_ranks = 0.3, shared_cpu.cpu_memory_fraction_2_ranks = 0.9;
    const double ns[5] = {1.0, 1.5, 3.0, 8.0, 16.0}, slowdowns[5] = {1.0, 1.5 / 1.3, 3.0 / 1.8, 8.0 / 2.4, 16.0 / 2.4};
    for (int i = 0; i < 5; i++) {
        double got = time_cpu_share_slowdown(&shared_cpu, ns[i], 0);
        CHECK(close_to(got, slowdowns[i], 1e-12), "%g ranks at once: GEMMs slowed %g times, expected %g", ns[i], got, slowdowns[i]);
    }
    CHECK(close_to(time_cpu_share_slowdown(&shared_cpu, 2.0, 1), 2.0 / 1.8, 1e-12) &&
              close_to(time_cpu_share_slowdown(&shared_cpu, 4.0, 1), 4.0 / 1.8, 1e-12),
          "2 and 4 ranks' memory-bound passes: %g, %g, expected 2 / 1.8 and 4 / 1.8 (only 2 measured: A flat past it)",
          time_cpu_share_slowdown(&shared_cpu, 2.0, 1), time_cpu_share_slowdown(&shared_cpu, 4.0, 1));
    CHECK(time_cpu_share_slowdown(&p, 16.0, 0) == 1.0 && time_cpu_share_slowdown(&cpu, 4.0, 0) == 2.0,
          "a GPU slowed %g times by 16 ranks (expected 1); 4 ranks on 2 cores without fractions %g (expected 2)",
          time_cpu_share_slowdown(&p, 16.0, 0), time_cpu_share_slowdown(&cpu, 4.0, 0));
    // ranks at once: 1.5 of 4 busy, the other 2.5 waiting, each taking 0.2 of a core: 2.0; without
    // cpu_wait_slowdown a waiting rank counts whole: 4
    shared_cpu.cpu_wait_slowdown = 1.2;
    CHECK(close_to(time_ranks_at_once(&shared_cpu, 1.5, 4), 2.0, 1e-12) && close_to(time_ranks_at_once(&cpu, 1.5, 4), 4.0, 1e-12),
          "ranks at once: %g (expected 2), %g without a measured wait (expected 4)", time_ranks_at_once(&shared_cpu, 1.5, 4),
          time_ranks_at_once(&cpu, 1.5, 4));

    // what sharing the host does beyond that (calibrate's newer fields). The share of their compute
    // that ranks meeting in collectives lose: 0.1 at 2 ranks, 0.3 at 4, none at 8 measured: 0.2 at
    // 3 ranks, 0.3 at 16 (flat past the last measured), none alone or on a GPU; a dp 4 step on 2
    // cores computes 1.3 times as long (each kind), its all-reduce as long as without
    DeviceProfile waits = shared_cpu;
    waits.cpu_meeting_fraction_2_ranks = 0.1, waits.cpu_meeting_fraction_4_ranks = 0.3;
    CHECK(close_to(time_meeting_fraction(&waits, 3.0), 0.2, 1e-12) && close_to(time_meeting_fraction(&waits, 16.0), 0.3, 1e-12) &&
              time_meeting_fraction(&waits, 1.0) == 0.0 && time_meeting_fraction(&p, 4.0) == 0.0,
          "the share lost meeting: %g at 3 ranks (expected 0.2), %g at 16 (0.3), %g alone, %g on a GPU",
          time_meeting_fraction(&waits, 3.0), time_meeting_fraction(&waits, 16.0), time_meeting_fraction(&waits, 1.0),
          time_meeting_fraction(&p, 4.0));
    // a calibration of 8 ranks that measured no wait at 2 and 4 (fields left out) and 0.2 at 8:
    // 0 up to 4 ranks, then straight to 0.2 (0.1 at 6), not 0 throughout
    DeviceProfile late = shared_cpu;
    late.cpu_meeting_fraction_8_ranks = 0.2;
    CHECK(time_meeting_fraction(&late, 4.0) == 0.0 && close_to(time_meeting_fraction(&late, 6.0), 0.1, 1e-12) &&
              close_to(time_meeting_fraction(&late, 8.0), 0.2, 1e-12),
          "the share lost meeting, measured at 8 ranks only: %g at 4 (expected 0), %g at 6 (0.1), %g at 8 (0.2)",
          time_meeting_fraction(&late, 4.0), time_meeting_fraction(&late, 6.0), time_meeting_fraction(&late, 8.0));
    StepTime no_wait = step_time_predict(&shared_cpu, c, &four, fp32_kernels(), 1024);
    StepTime with_wait = step_time_predict(&waits, c, &four, fp32_kernels(), 1024);
    for (int k = 0; k < TIME_COMPUTE_KINDS; k++) {
        CHECK(close_to(with_wait.compute[k], 1.3 * no_wait.compute[k], 1e-9),
              "dp 4 on 2 cores, meeting: %s %g s, expected 1.3 x %g", time_compute_names[k], with_wait.compute[k],
              no_wait.compute[k]);
    }
    CHECK(close_to(with_wait.comm_exposed[3], no_wait.comm_exposed[3], 1e-12),
          "dp 4 on 2 cores, meeting: dp's all-reduce %g s, expected the same %g", with_wait.comm_exposed[3],
          no_wait.comm_exposed[3]);
    // passes in the cache: a cache of 1 MB shared by 2 ranks at once is 0.5 MB each; a pass of 0.4 MB
    // takes the in-cache fraction (0.95 at 2: A = 1.9, slowdown 2 / 1.9), one of 0.6 MB the one
    // beyond (0.9: 2 / 1.8); without the cache's fields both the one beyond
    DeviceProfile cached = shared_cpu;
    cached.cpu_cache_bytes = 1e6, cached.cpu_memory_cached_fraction_2_ranks = 0.95, cached.efficiency_matmul_beyond_cache = 0.25;
    TimeShare two_at_once = time_share_at(&cached, 2.0), two_plain = time_share_at(&shared_cpu, 2.0);
    StepKernel fits = vec, spills = vec;
    fits.flops = spills.flops = 0.0, fits.bytes = 0.4e6, spills.bytes = 0.6e6;
    double per_byte = 1.0 / (cached.memory_bandwidth_bytes_per_s * cached.efficiency_memory);
    CHECK(close_to(time_kernel_seconds(&cached, &fits, 0.0, 4, two_at_once), 0.4e6 * per_byte * 2.0 / 1.9, 1e-12) &&
              close_to(time_kernel_seconds(&cached, &spills, 0.0, 4, two_at_once), 0.6e6 * per_byte * 2.0 / 1.8, 1e-12) &&
              close_to(time_kernel_seconds(&shared_cpu, &fits, 0.0, 4, two_plain), 0.4e6 * per_byte * 2.0 / 1.8, 1e-12),
          "2 ranks' passes: 0.4 MB %g s (in the cache), 0.6 MB %g s (beyond), 0.4 MB without the cache's fields %g s",
          time_kernel_seconds(&cached, &fits, 0.0, 4, two_at_once), time_kernel_seconds(&cached, &spills, 0.0, 4, two_at_once),
          time_kernel_seconds(&shared_cpu, &fits, 0.0, 4, two_plain));
    // a GEMM beyond the cache: 2e9 FLOPs moving 2 MB, at 0.25 of the peak, its bytes added (a
    // CPU): 2e9 / (1e12 x 0.25) + 2e6 / (1e9 x 0.5) = 12 ms; moving 0.1 MB, the large class's 0.5
    StepKernel wide = gemm, narrow = gemm;
    wide.bytes = 2e6, narrow.bytes = 1e5;
    CHECK(close_to(time_kernel_seconds(&cached, &wide, wide.flops, 4, lone), 12e-3, 1e-12) &&
              close_to(time_kernel_seconds(&cached, &narrow, narrow.flops, 4, lone), 4e-3 + 1e5 * per_byte, 1e-12),
          "a GEMM beyond the cache %g s (expected 12 ms), within it %g s (expected %g)",
          time_kernel_seconds(&cached, &wide, wide.flops, 4, lone), time_kernel_seconds(&cached, &narrow, narrow.flops, 4, lone),
          4e-3 + 1e5 * per_byte);

    // the links of 4 ranks sharing a CPU: a 2-rank all-reduce of 2 us + n / 1e9 is 2 steps of 1 us
    // and 1e-9 s a byte; a 4-rank one of 30 us + n / 2.5e8 is 6 steps of 5 us and 4 / (2.5e8 x 6)
    // s a byte. At 4 ranks the ring all-reduce is then the measured one, a message's latency 5
    // times and its bandwidth 1 / 2.667 of the 2 ranks'; at 3 ranks each step is halfway
    DeviceProfile links_cpu = shared_cpu;
    links_cpu.intra_node_allreduce_latency_s = 2e-6, links_cpu.intra_node_allreduce_bandwidth_bytes_per_s = 1e9;
    links_cpu.allreduce_4_ranks_latency_s = 30e-6, links_cpu.allreduce_4_ranks_bandwidth_bytes_per_s = 2.5e8;
    DeviceProfile at4 = time_links_shared(&links_cpu, 4), at3 = time_links_shared(&links_cpu, 3);
    RankPattern four_ranks = {0, 1, 4};
    double bytes = 1e6, ring = all_reduce_ring_time(&at4, group_placement(four_ranks, 1024), bytes).seconds;
    CHECK(close_to(ring, 30e-6 + bytes / 2.5e8, 1e-12), "4 ranks' ring all-reduce of 1 MB: %g s, expected the measured %g",
          ring, 30e-6 + bytes / 2.5e8);
    double byte_ratio = (4.0 / (2.5e8 * 6.0)) / 1e-9;
    CHECK(close_to(at4.intra_node_latency_s, 5.0 * links_cpu.intra_node_latency_s, 1e-12) &&
              close_to(at4.intra_node_bandwidth_bytes_per_s, links_cpu.intra_node_bandwidth_bytes_per_s / byte_ratio, 1e-12),
          "4 ranks' message link: %g s, %g bytes/s, expected 5 x and 1 / %g of the 2 ranks'", at4.intra_node_latency_s,
          at4.intra_node_bandwidth_bytes_per_s, byte_ratio);
    CHECK(close_to(at3.intra_node_allreduce_latency_s, 2.0 * 3e-6, 1e-12) &&
              close_to(1.0 / at3.intra_node_allreduce_bandwidth_bytes_per_s, (1e-9 + 4.0 / (2.5e8 * 6.0)) / 2.0, 1e-12),
          "3 ranks' all-reduce step: %g s (expected 2 x 3 us), %g bytes/s", at3.intra_node_allreduce_latency_s,
          at3.intra_node_allreduce_bandwidth_bytes_per_s);
    // ZeRO's collectives on a CPU, as calibrate measured them (a reduce-scatter and an all-gather
    // over 2 and 4 ranks: a + n / b, the bytes past 2 MB at their own bandwidth). Over 4 ranks of
    // a world of 4 the ring reproduces the 4-rank measurement: a reduce-scatter of 8 MB takes
    // 20 us + 2 MB / 1e9 + 6 MB / 2.5e8 (the knee is 2 MB = 2097152 bytes); an all-gather of 1 MB,
    // below the knee, 20 us + 1 MB / 2e9. Over 2 ranks of a world of 2 the 2-rank ones, the
    // reduce-scatter below the knee 2 us + n / 4e9 (one ring step)
    DeviceProfile zero_cpu = links_cpu;
    zero_cpu.reducescatter_2_ranks_latency_s = 2e-6, zero_cpu.reducescatter_2_ranks_bandwidth_bytes_per_s = 4e9;
    zero_cpu.reducescatter_4_ranks_latency_s = 20e-6, zero_cpu.reducescatter_4_ranks_bandwidth_bytes_per_s = 1e9;
    zero_cpu.reducescatter_4_ranks_bandwidth_beyond_2mb_bytes_per_s = 2.5e8;
    zero_cpu.allgather_2_ranks_latency_s = 2e-6, zero_cpu.allgather_2_ranks_bandwidth_bytes_per_s = 8e9;
    zero_cpu.allgather_4_ranks_latency_s = 20e-6, zero_cpu.allgather_4_ranks_bandwidth_bytes_per_s = 2e9;
    DeviceProfile zero4 = time_links_shared(&zero_cpu, 4);
    GroupPlacement four_on_one = group_placement(four_ranks, 1024), two = group_placement((RankPattern){0, 1, 2}, 1024);
    double knee = 2097152.0, big = 8.0 * knee / 2.0, small = 1048576.0;
    double rs = coll_time(&zero4, COLL_REDUCE_SCATTER, four_on_one, big).seconds;
    double ag = coll_time(&zero4, COLL_ALL_GATHER, four_on_one, small).seconds;
    double rs2 = coll_time(&zero_cpu, COLL_REDUCE_SCATTER, two, small).seconds;
    CHECK(close_to(rs, 20e-6 + knee / 1e9 + (big - knee) / 2.5e8, 1e-12),
          "4 ranks' reduce-scatter of 8 MB: %g s, expected the measured %g", rs, 20e-6 + knee / 1e9 + (big - knee) / 2.5e8);
    CHECK(close_to(ag, 20e-6 + small / 2e9, 1e-12), "4 ranks' all-gather of 1 MB: %g s, expected the measured %g", ag,
          20e-6 + small / 2e9);
    CHECK(close_to(rs2, 2e-6 + small / 4e9, 1e-12), "2 ranks' reduce-scatter of 1 MB: %g s, expected the measured %g", rs2,
          2e-6 + small / 4e9);
    // without them (a GPU's profile, or an older CPU's): a ring on the message link, (p - 1) (alpha + (n / p) / beta)
    double plain = coll_time(&p, COLL_REDUCE_SCATTER, four_on_one, big).seconds;
    CHECK(close_to(plain, 3.0 * (1e-6 + big / 4.0 / 1e9), 1e-12), "a reduce-scatter on the message link: %g s, expected %g",
          plain, 3.0 * (1e-6 + big / 4.0 / 1e9));
    DeviceProfile gpu_links = time_links_shared(&p, 64);
    CHECK(memcmp(&gpu_links, &p, sizeof(p)) == 0, "a GPU's links changed by 64 ranks");
    // a group of 2 in a world of 4 where calibrate measured such groups (4 ranks pinned to 2
    // cores): ZeRO's reduce-scatter of 8 MB over the dp group. Its first 2 MB as before, one ring
    // step of the 4 ranks' reduce-scatter: 20 us / 3 + (2 MB / 2) x 4 / (1e9 x 3) s; the 6 MB past
    // them at the groups' bandwidth, 5e8 where the pair spans the cores (pp 2 x cp 2: the cp pair,
    // ranks 0 and 1) and 2e9 where it sits on one (dp 2 x tp 2: ranks 0 and 2). Measured in a world
    // of 8, or below the knee, the ring step prices it all (past the knee 2 / (4 / (2.5e8 x 3)) bytes/s:
    // the 4 ranks' beyond_2mb as a 2-rank step, half the bytes at half that)
    DeviceProfile groups_cpu = zero_cpu;
    groups_cpu.cpu_groups_world = 4, groups_cpu.cpu_groups_cores = 2;
    groups_cpu.reducescatter_groups_of_2_across_cores_bytes_per_s = 5e8;
    groups_cpu.reducescatter_groups_of_2_on_one_core_bytes_per_s = 2e9;
    DeviceProfile groups4 = time_links_shared(&groups_cpu, 4);
    StepKernel zero_rs;
    memset(&zero_rs, 0, sizeof(zero_rs));
    zero_rs.engine = STEP_LINK, zero_rs.comm = "dp", zero_rs.collective = "reduce-scatter", zero_rs.payload = big;
    GridShape pp_cp = {1, 2, 2, 1, 1}, dp_tp = {2, 1, 1, 2, 1};
    double first_knee = 20e-6 / 3.0 + knee / 2.0 * 4.0 / (1e9 * 3.0);
    double across = time_link_seconds(&groups4, &zero_rs, pp_cp, 0, 8, lone);
    double on_one_core = time_link_seconds(&groups4, &zero_rs, dp_tp, 0, 8, lone);
    CHECK(close_to(across, first_knee + (big - knee) / 5e8, 1e-12) && close_to(on_one_core, first_knee + (big - knee) / 2e9, 1e-12),
          "a pair's reduce-scatter of 8 MB in a world of 4: %g s across the cores (expected %g), %g on one core (expected %g)",
          across, first_knee + (big - knee) / 5e8, on_one_core, first_knee + (big - knee) / 2e9);
    double ring_beyond = 2.0 / (4.0 / (2.5e8 * 3.0));
    groups4.cpu_groups_world = 8;
    double elsewhere = time_link_seconds(&groups4, &zero_rs, pp_cp, 0, 8, lone);
    groups4.cpu_groups_world = 4;
    zero_rs.payload = knee / 2.0;
    double below = time_link_seconds(&groups4, &zero_rs, pp_cp, 0, 8, lone);
    CHECK(close_to(elsewhere, first_knee + (big - knee) / ring_beyond, 1e-12) &&
              close_to(below, 20e-6 / 3.0 + knee / 4.0 * 4.0 / (1e9 * 3.0), 1e-12),
          "measured in a world of 8: %g s (expected the ring step's %g); 1 MB: %g s (expected %g)", elsewhere,
          first_knee + (big - knee) / ring_beyond, below, 20e-6 / 3.0 + knee / 4.0 * 4.0 / (1e9 * 3.0));
    // where the groups' figures do not apply the ring step prices it, as without them: a GPU's
    // profile carrying them; a dp group that is the whole world (dp 4); a group of 4 half on one
    // core (ranks 0, 2, 4, 6 on cores 0, 2, 0, 2 of 4 cores: measured neither way)
    zero_rs.payload = big;
    DeviceProfile groups_gpu = groups4, plain4 = groups4, whole = groups4;
    groups_gpu.kind = DEVICE_CUDA, plain4.cpu_groups_world = 0;
    whole.reducescatter_groups_of_4_across_cores_bytes_per_s = whole.reducescatter_groups_of_4_on_one_core_bytes_per_s = 1e8;
    GridShape dp4 = {4, 1, 1, 1, 1}, dp4_tp2 = {4, 1, 1, 2, 1};
    CHECK(time_link_seconds(&groups_gpu, &zero_rs, pp_cp, 0, 8, lone) == time_link_seconds(&plain4, &zero_rs, pp_cp, 0, 8, lone) &&
              time_link_seconds(&whole, &zero_rs, dp4, 0, 8, lone) == time_link_seconds(&plain4, &zero_rs, dp4, 0, 8, lone),
          "the groups' figures applied to a GPU or to the whole world");
    DeviceProfile groups8 = groups4, plain8 = groups4;
    groups8.cpu_groups_world = 8, groups8.cpu_groups_cores = 4, plain8.cpu_groups_world = 0;
    groups8.reducescatter_groups_of_4_across_cores_bytes_per_s = 1e8, groups8.reducescatter_groups_of_4_on_one_core_bytes_per_s = 1e8;
    CHECK(time_link_seconds(&groups8, &zero_rs, dp4_tp2, 0, 8, lone) == time_link_seconds(&plain8, &zero_rs, dp4_tp2, 0, 8, lone),
          "a group of 4 on 2 of 4 cores priced by a measured placement");
    // an all-gather over the 4 consecutive ranks of a tp group in a world of 8 on 2 cores (spread:
    // 2 cores for 4 ranks, as calibrate's consecutive ones): the ring step's first 2 MB, then 3e8
    groups8.cpu_groups_cores = 2, groups8.allgather_groups_of_4_across_cores_bytes_per_s = 3e8;
    StepKernel tp_ag = zero_rs;
    tp_ag.comm = "tp", tp_ag.collective = "all-gather";
    GridShape tp4_dp2 = {2, 1, 1, 4, 1};
    RankPattern tp_members = {0, 1, 4};
    double ag_first = coll_time(&groups8, COLL_ALL_GATHER, group_placement(tp_members, 8), knee).seconds;
    double ag4 = time_link_seconds(&groups8, &tp_ag, tp4_dp2, 0, 8, lone);
    CHECK(close_to(ag4, ag_first + (big - knee) / 3e8, 1e-12), "a tp group's all-gather of 8 MB in a world of 8: %g s, expected %g",
          ag4, ag_first + (big - knee) / 3e8);

    // a pipeline of 2 stages and 1 micro-batch on a 1-core CPU: the stages take turns (F0, F1, B1,
    // B0), one rank busy at a time. When a waiting rank takes no core (cpu_wait_slowdown 1) the
    // schedule is a lone rank's, the GPU kind's of the same numbers; when it takes a whole core (2)
    // both ranks count, and the compute takes twice as long. The links are made free (1e-15 s,
    // 1e18 bytes/s) so the schedule is compute alone; the once-a-step part runs on both ranks at
    // once either way
    DeviceProfile one_core = p;
    one_core.kind = DEVICE_CPU, one_core.cpu_cores = 1, one_core.cpu_threads = 1;
    one_core.intra_node_latency_s = one_core.inter_node_latency_s = 1e-15;
    one_core.intra_node_bandwidth_bytes_per_s = one_core.inter_node_bandwidth_bytes_per_s = 1e18;
    DeviceProfile as_gpu = one_core;  // (a core each: nothing shared)
    as_gpu.cpu_cores = 2;
    RunLayout turns = layout(TRAINER_PP, 1, 2, 1);
    one_core.cpu_wait_slowdown = 1.0;
    StepTime lone_play = step_time_predict(&as_gpu, c, &turns, fp32_kernels(), 1024);
    StepTime free_wait = step_time_predict(&one_core, c, &turns, fp32_kernels(), 1024);
    one_core.cpu_wait_slowdown = 2.0;
    StepTime busy_wait = step_time_predict(&one_core, c, &turns, fp32_kernels(), 1024);
    CHECK(close_to(free_wait.schedule, lone_play.schedule, 1e-9), "pp 2, waiting free: schedule %g s, expected a lone rank's %g",
          free_wait.schedule, lone_play.schedule);
    CHECK(close_to(busy_wait.schedule, 2.0 * lone_play.schedule, 1e-9), "pp 2, waiting on a core: schedule %g s, expected twice %g",
          busy_wait.schedule, lone_play.schedule);
    CHECK(close_to(free_wait.once, 2.0 * lone_play.once, 1e-9), "pp 2: the once-a-step part %g s, expected both ranks' 2 x %g",
          free_wait.once, lone_play.once);

    // the same on 1 core, waiting free, with 4 micro-batches (1F1B): the stages compute at once in
    // the steady state, each at half speed, and alone in the ramps, at full speed. The core never
    // idles while either stage has work, so the schedule is both stages' work end to end at a lone
    // rank's speed: 4 (F + B) of each. (Spreading the stages' average busy share over the whole
    // schedule, as if they always computed together, would price the ramps at half speed too.)
    RunLayout four_micro = layout(TRAINER_PP, 1, 2, 4);
    one_core.cpu_wait_slowdown = 1.0;
    StepTime steady = step_time_predict(&one_core, c, &four_micro, fp32_kernels(), 1024);
    GridShape pair_of_stages = {1, 2, 1, 1, 1};
    double work = 0.0;
    for (int s = 0; s < 2; s++) {
        StepLayout o = step_layout_of_run(&four_micro, s, fp32_kernels());
        StageTime st = time_stage(&one_core, c, &o, pair_of_stages, s, 1024, lone, lone, NULL);
        work += 4 * (st.action[PIPE_FORWARD] + st.action[PIPE_BACKWARD] + st.action[PIPE_WEIGHT]);
    }
    CHECK(close_to(steady.schedule, work, 1e-9), "pp 2, 4 micro-batches on 1 core: schedule %g s, expected both stages' "
          "work %g", steady.schedule, work);

    // ... and where the host's throughput is not linear in the ranks (2 ranks at once reach 1.5 lone
    // ranks' worth: each runs 4/3 as long), the schedule is the shared play (pipeline_play_shared,
    // checked by hand in test_pipeline) of each stage's actions priced at 1 and at 2 stages at once,
    // and shorter than every action priced at both at once
    DeviceProfile uneven = one_core;
    uneven.cpu_gemm_fraction_2_ranks = uneven.cpu_memory_fraction_2_ranks = 0.75;
    StepTime uneven_steady = step_time_predict(&uneven, c, &four_micro, fp32_kernels(), 1024);
    PipeSpec one_f_one_b = {SCHEDULE_1F1B, 2, 4, 1};
    PipeAction pipe_actions[2 * 8];
    double at_count[2 * 2 * 3], pipe_start[2 * 8], pipe_end[2 * 8];
    for (int k = 1; k <= 2; k++) {
        for (int s = 0; s < 2; s++) {
            StepLayout o = step_layout_of_run(&four_micro, s, fp32_kernels());
            StageTime st = time_stage(&uneven, c, &o, pair_of_stages, s, 1024, time_share_at(&uneven, k), lone, NULL);
            at_count[((k - 1) * 2 + s) * 3 + PIPE_FORWARD] = st.action[PIPE_FORWARD];
            at_count[((k - 1) * 2 + s) * 3 + PIPE_BACKWARD] = st.action[PIPE_BACKWARD] + st.action[PIPE_WEIGHT];
            at_count[((k - 1) * 2 + s) * 3 + PIPE_WEIGHT] = 0.0;
        }
    }
    for (int s = 0; s < 2; s++) pipeline_stage_actions(one_f_one_b, s, pipe_actions + s * 8);
    double shared_play = pipeline_play_shared(one_f_one_b, pipe_actions, at_count, 0.0, pipe_start, pipe_end);
    double both_at_once = pipeline_play_lists(one_f_one_b, pipe_actions, at_count + 6, 0.0, pipe_start, pipe_end);
    CHECK(close_to(uneven_steady.schedule, shared_play, 1e-6) && uneven_steady.schedule < both_at_once * (1 - 1e-3),
          "pp 2 on 1 core reaching 1.5 at 2 ranks: schedule %g s, expected the shared play's %g (below %g, every action "
          "at 2 at once)", uneven_steady.schedule, shared_play, both_at_once);

    // a GPU profile ignores the CPU's fields: the same step with them set
    DeviceProfile measured_gpu = p;  // (a measured 2-rank all-reduce, which a GPU's links do use)
    measured_gpu.intra_node_allreduce_latency_s = 2e-6, measured_gpu.intra_node_allreduce_bandwidth_bytes_per_s = 1e9;
    DeviceProfile gpu_with_cpu_fields = measured_gpu;
    gpu_with_cpu_fields.cpu_cores = 1, gpu_with_cpu_fields.cpu_threads = 1, gpu_with_cpu_fields.cpu_wait_slowdown = 2.0;
    gpu_with_cpu_fields.cpu_gemm_fraction_2_ranks = gpu_with_cpu_fields.cpu_memory_fraction_2_ranks = 0.1;
    gpu_with_cpu_fields.allreduce_4_ranks_latency_s = 1.0, gpu_with_cpu_fields.allreduce_4_ranks_bandwidth_bytes_per_s = 1.0;
    RunLayout grid = layout(TRAINER_3D, 2, 2, 2);
    StepTime plain_gpu = step_time_predict(&measured_gpu, c, &grid, fp32_kernels(), 8);
    StepTime gpu_fields = step_time_predict(&gpu_with_cpu_fields, c, &grid, fp32_kernels(), 8);
    CHECK(plain_gpu.seconds == gpu_fields.seconds, "a GPU's step changed by CPU fields: %g, %g s", plain_gpu.seconds,
          gpu_fields.seconds);

    // -offload's host rows: AdamW of F FLOPs and M bytes takes max(F / host_flops, M /
    // host_memory_bandwidth) (1e6 FLOPs at 1e9 FLOP/s: 1 ms; 4e6 bytes at 1e9 bytes/s: 4 ms); a
    // PCIe copy of 1e6 bytes 5 us + 1e6 / (1e10 x efficiency_link 0.5) = 205 us
    DeviceProfile host = p;
    host.host_flops_fp32 = 1e9, host.host_memory_bandwidth_bytes_per_s = 1e9;
    host.pcie_latency_s = 5e-6, host.pcie_bandwidth_bytes_per_s = 1e10, host.efficiency_link = 0.5;
    StepKernel adamw = vec, copy;
    adamw.engine = STEP_HOST, adamw.op = "optimizer", adamw.flops = 1e6, adamw.bytes = 4e6;
    CHECK(close_to(time_kernel_seconds(&host, &adamw, adamw.flops, 4, lone), 4e-3, 1e-12), "the host's AdamW: %g s, expected 4 ms",
          time_kernel_seconds(&host, &adamw, adamw.flops, 4, lone));
    memset(&copy, 0, sizeof(copy));
    copy.engine = STEP_LINK, copy.comm = "pcie", copy.collective = "copy", copy.payload = 1e6;
    GridShape lone_grid = {1, 1, 1, 1, 1};
    CHECK(close_to(time_link_seconds(&host, &copy, lone_grid, 0, 8, lone), 205e-6, 1e-12), "a PCIe copy: %g s, expected 205 us",
          time_link_seconds(&host, &copy, lone_grid, 0, 8, lone));

    // the profile's new fields as a file gives them: the host and its link all four or none (one
    // alone refused, the first missing one named); a fraction of a lone rank's rate over 1 refused
    // with its field; a cuda profile without its host gets a DGX A100's (PCIe Gen4 x16: 32e9), a
    // cpu one the device's own (its memory-bound passes' bandwidth, 1e9 x 0.5)
    const char* base =
        "name test\npeak_flops_fp32 1e12\npeak_flops_bf16 1e12\nmemory_bandwidth_bytes_per_s 1e9\n"
        "memory_bytes 1e9\nefficiency_matmul_large 1\nefficiency_matmul_small 1\nmatmul_small_flops 0\n"
        "efficiency_attention 1\nefficiency_memory 0.5\nintra_node_latency_s 1e-6\n"
        "intra_node_bandwidth_bytes_per_s 1e9\ninter_node_latency_s 1e-6\ninter_node_bandwidth_bytes_per_s 1e9\n";
    char text[2048], why[2048];
    DeviceProfile read;
    snprintf(text, sizeof(text), "%skind cuda\nhost_flops_fp32 1e12\n", base);
    CHECK(!device_profile_parse(text, "t", &read, why, sizeof(why)) &&
              strstr(why, "t:16: host_flops_fp32 without host_memory_bandwidth_bytes_per_s") != NULL,
          "the host's FLOP/s alone: %s", why);
    snprintf(text, sizeof(text), "%skind cpu\ncpu_gemm_fraction_2_ranks 1.5\n", base);
    CHECK(!device_profile_parse(text, "t", &read, why, sizeof(why)) &&
              strstr(why, "t:16: cpu_gemm_fraction_2_ranks 1.5 is out of range [0.001, 1]") != NULL,
          "a fraction over 1: %s", why);
    snprintf(text, sizeof(text), "%skind cuda\n", base);
    CHECK(device_profile_parse(text, "t", &read, why, sizeof(why)) && read.pcie_bandwidth_bytes_per_s == 32e9 &&
              read.host_memory_bandwidth_bytes_per_s == 51.2e9, "a cuda profile's default host: PCIe %g, memory %g",
          read.pcie_bandwidth_bytes_per_s, read.host_memory_bandwidth_bytes_per_s);
    snprintf(text, sizeof(text), "%skind cpu\n", base);
    CHECK(device_profile_parse(text, "t", &read, why, sizeof(why)) && read.host_memory_bandwidth_bytes_per_s == 0.5e9 &&
              read.host_flops_fp32 == 1e12, "a cpu profile's host: memory %g, FLOP/s %g", read.host_memory_bandwidth_bytes_per_s,
          read.host_flops_fp32);
    // with the optimizer's passes measured, a cpu profile's host (-offload's AdamW) runs at their
    // bandwidth, 1e9 x 1.25, and its "PCIe" (a copy in memory, a read and a write a byte) stays at
    // the memory-bound passes': 1e9 x 0.5 / 2 / efficiency_link 1
    snprintf(text, sizeof(text), "%skind cpu\nefficiency_optimizer 1.25\n", base);
    CHECK(device_profile_parse(text, "t", &read, why, sizeof(why)) && read.host_memory_bandwidth_bytes_per_s == 1.25e9 &&
              read.pcie_bandwidth_bytes_per_s == 0.25e9, "a cpu profile's host beside efficiency_optimizer: memory %g, PCIe %g",
          read.host_memory_bandwidth_bytes_per_s, read.pcie_bandwidth_bytes_per_s);

    // a whole step: the trainer's optimizer rows (step_kernels.h's gradient norm, S X bytes and
    // NORM_BLOCKS partial sums, and AdamW, 28 bytes a parameter in fp32) are the ones that take
    // efficiency_optimizer. dp 1 updates all P parameters, so its memory part is shorter by their
    // bytes x (1 / (1e9 x 0.5) - 1 / (1e9 x 1.25)) and nothing else moves
    DeviceProfile fast_optimizer = p;
    fast_optimizer.efficiency_optimizer = 1.25;
    StepTime t_fast = step_time_predict(&fast_optimizer, c, &one, fp32_kernels(), 8);
    double optimizer_bytes = (double)gpt2_num_parameters(c) * (4 + 28) + NORM_BLOCKS * 4;
    double saved = optimizer_bytes * (1.0 / (1e9 * 0.5) - 1.0 / (1e9 * 1.25));
    CHECK(close_to(t1.compute[TIME_MEMORY] - t_fast.compute[TIME_MEMORY], saved, 1e-9) &&
              close_to(t1.seconds - t_fast.seconds, saved, 1e-9),
          "dp 1 with efficiency_optimizer 1.25: memory %g s and step %g s shorter, expected %g",
          t1.compute[TIME_MEMORY] - t_fast.compute[TIME_MEMORY], t1.seconds - t_fast.seconds, saved);

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

    // the pipeline's messages, exposed: what they add to the schedule over messages that take no
    // time (pp 2, one micro-batch: F0, the activations, F1 B1, the gradient, B0: nothing hides
    // either message, so both are exposed, 2 (alpha + B T C X / beta)), on the link between the
    // stages (inside a node at 8 a node, across at 1); their total, every stage's sends, the same
    // two; and the bubble, stage 0's idle time with free messages, the schedule less stage 0's F0
    // and B0 and the two messages. On a CPU (cores enough for both ranks) each message is copied
    // by the sender's core after its action, which puts it on the same path: exposed 2 messages
    // again, the bubble stage 1's F1 and B1 without the gradient it sends
    int pp_k = time_group_index("pp");
    GridShape pipe_grid = {1, 2, 1, 1, 1};
    StepLayout stage_of[2] = {step_layout_of_run(&pipe, 0, fp32_kernels()), step_layout_of_run(&pipe, 1, fp32_kernels())};
    StageTime s0 = time_stage(&p, c, &stage_of[0], pipe_grid, 0, 8, lone, lone, NULL);
    double near_message = p.intra_node_latency_s + message / 1e9, far_message = p.inter_node_latency_s + message / 1e8;
    CHECK(close_to(near.comm_exposed[pp_k], 2 * near_message, 1e-9) && close_to(near.comm_total[pp_k], 2 * near_message, 1e-9),
          "pp 2 in a node: messages exposed %g s of %g, expected both, 2 x %g", near.comm_exposed[pp_k], near.comm_total[pp_k],
          near_message);
    CHECK(close_to(far.comm_exposed[pp_k], 2 * far_message, 1e-9) &&
              close_to(far.comm_exposed_link[pp_k][1], far.comm_exposed[pp_k], 1e-12) && far.comm_exposed_link[pp_k][0] == 0.0 &&
              close_to(near.comm_exposed_link[pp_k][0], near.comm_exposed[pp_k], 1e-12),
          "pp 2: messages exposed across nodes %g s (expected 2 x %g), on the inter-node link %g; in a node on intra-node %g",
          far.comm_exposed[pp_k], far_message, far.comm_exposed_link[pp_k][1], near.comm_exposed_link[pp_k][0]);
    double stage0_busy = s0.action[PIPE_FORWARD] + s0.action[PIPE_BACKWARD] + s0.action[PIPE_WEIGHT];
    CHECK(close_to(near.bubble, near.schedule - stage0_busy - 2 * near_message, 1e-9), "pp 2: bubble %g s, expected "
          "the schedule %g less stage 0's %g and the two messages", near.bubble, near.schedule, stage0_busy);
    DeviceProfile pipe_cpu = p;
    pipe_cpu.kind = DEVICE_CPU, pipe_cpu.cpu_cores = 8, pipe_cpu.cpu_threads = 1;
    StepTime cpu_pipe = step_time_predict(&pipe_cpu, c, &pipe, fp32_kernels(), 8);
    StageTime cpu_s1 = time_stage(&pipe_cpu, c, &stage_of[1], pipe_grid, 1, 8, lone, lone, NULL);
    double s1_silent = cpu_s1.action[PIPE_FORWARD] + cpu_s1.action[PIPE_BACKWARD] + cpu_s1.action[PIPE_WEIGHT] -
                       cpu_s1.sent[PIPE_BACKWARD];
    CHECK(close_to(cpu_s1.sent[PIPE_BACKWARD], near_message, 1e-9) && cpu_s1.sent[PIPE_FORWARD] == 0.0 && cpu_s1.send == 0.0,
          "pp 2 on a CPU: stage 1's backward sends %g s (expected one message, %g), its forward %g (expected none)",
          cpu_s1.sent[PIPE_BACKWARD], near_message, cpu_s1.sent[PIPE_FORWARD]);
    CHECK(close_to(cpu_pipe.comm_exposed[pp_k], 2 * near_message, 1e-9) && close_to(cpu_pipe.bubble, s1_silent, 1e-9),
          "pp 2 on a CPU: messages exposed %g s (expected 2 x %g), bubble %g (expected stage 1's work %g)",
          cpu_pipe.comm_exposed[pp_k], near_message, cpu_pipe.bubble, s1_silent);

    // exposed time by link: each group's splits add up to its exposed time; dp 2 inside a node is
    // all intra-node, across nodes of one GPU all inter-node; -offload's copies all on pcie
    RunLayout offloaded = layout(TRAINER_DP, 2, 1, 1);
    offloaded.offload = 1;
    DeviceProfile with_host = host;
    with_host.intra_node_allreduce_latency_s = 0.0;
    StepTime split_near = step_time_predict(&p, c, &two_ranks, fp32_kernels(), 8);
    StepTime split_far = step_time_predict(&p, c, &two_ranks, fp32_kernels(), 1);
    StepTime split_host = step_time_predict(&with_host, c, &offloaded, fp32_kernels(), 8);
    const StepTime* splits_of[6] = {&split_near, &split_far, &split_host, &near, &far, &cpu_pipe};
    for (int i = 0; i < 6; i++) {
        for (int k = 0; k < TIME_GROUPS; k++) {
            double sum = 0.0;
            for (int l = 0; l < TIME_LINKS; l++) sum += splits_of[i]->comm_exposed_link[k][l];
            CHECK(close_to(sum, splits_of[i]->comm_exposed[k], 1e-12), "case %d: %s exposed %g s, by link %g", i,
                  time_group_names[k], splits_of[i]->comm_exposed[k], sum);
        }
    }
    int dp_k = time_group_index("dp"), pcie_k = time_group_index("pcie");
    CHECK(split_near.comm_exposed_link[dp_k][0] > 0.0 && split_near.comm_exposed_link[dp_k][1] == 0.0 &&
              split_far.comm_exposed_link[dp_k][1] > 0.0 && split_far.comm_exposed_link[dp_k][0] == 0.0,
          "dp 2: inside a node %g intra, %g inter; across nodes %g intra, %g inter", split_near.comm_exposed_link[dp_k][0],
          split_near.comm_exposed_link[dp_k][1], split_far.comm_exposed_link[dp_k][0], split_far.comm_exposed_link[dp_k][1]);
    CHECK(split_host.comm_total[pcie_k] > 0.0 &&
              close_to(split_host.comm_exposed_link[pcie_k][2], split_host.comm_exposed[pcie_k], 1e-12),
          "-offload: the copies' exposed %g s, on pcie %g", split_host.comm_exposed[pcie_k], split_host.comm_exposed_link[pcie_k][2]);

    // the schedules that split the backward into B and W (zb, zbv, dualpipev:
    // pipeline_splits_backward) are played with W apart: the step's schedule is pipeline_play's
    // length with each stage's F, B and W as time_stage prices them (and the message's time), and
    // the forward keeps what W reads (weights_later). Playing B + W as one backward instead, as
    // 1f1b does, gives another length (checked, so that the first check can tell them apart). A
    // 4-layer model, so that 2 stages of 2 chunks hold a layer each; m = 4 (zbv needs 2p - 1,
    // dualpipev 2p)
    GPT2Config c4 = c;
    c4.num_layers = 4;
    GridShape two_stages = {1, 2, 1, 1, 1};
    const PipeSchedule splits[3] = {SCHEDULE_ZB, SCHEDULE_ZBV, SCHEDULE_DUALPIPEV};
    for (int k = 0; k < 3; k++) {
        RunLayout v = layout(TRAINER_PP, 1, 2, 4);
        v.sched = splits[k], v.V = splits[k] == SCHEDULE_ZB ? 1 : 2;
        PipeSpec spec = {v.sched, v.pp, v.m, v.V};
        const char* name = pipe_schedule_names[v.sched];
        double split[6], joined[6], send = 0.0;
        for (int s = 0; s < 2; s++) {
            StepLayout so = step_layout_of_run(&v, s, fp32_kernels());
            CHECK(so.weights_later == 1, "-sched %s: stage %d's forward does not keep what W reads", name, s);
            StageTime st = time_stage(&p, c4, &so, two_stages, s, 8, lone, lone, NULL);
            CHECK(st.action[PIPE_WEIGHT] > 0.0, "-sched %s: stage %d has no W to play apart", name, s);
            split[s * 3 + PIPE_FORWARD] = joined[s * 3 + PIPE_FORWARD] = st.action[PIPE_FORWARD];
            split[s * 3 + PIPE_BACKWARD] = st.action[PIPE_BACKWARD];
            split[s * 3 + PIPE_WEIGHT] = st.action[PIPE_WEIGHT];
            joined[s * 3 + PIPE_BACKWARD] = st.action[PIPE_BACKWARD] + st.action[PIPE_WEIGHT];
            joined[s * 3 + PIPE_WEIGHT] = 0.0;
            send = st.send > send ? st.send : send;
        }
        int n = pipeline_actions_per_stage(spec);
        PipeAction* acts = (PipeAction*)malloc_check((size_t)2 * n * sizeof(PipeAction));
        double* t0 = (double*)malloc_check((size_t)2 * n * sizeof(double));
        double* t1 = (double*)malloc_check((size_t)2 * n * sizeof(double));
        double apart = pipeline_play(spec, acts, split, send, t0, t1);
        double together = pipeline_play(spec, acts, joined, send, t0, t1);
        StepTime got = step_time_predict(&p, c4, &v, fp32_kernels(), 8);
        CHECK(close_to(got.schedule, apart, 1e-12) && !close_to(apart, together, 1e-6),
              "-sched %s: the schedule %g s, expected the play with W apart %g (B + W together: %g)", name, got.schedule,
              apart, together);
        free(acts), free(t0), free(t1);
    }
    RunLayout plain_pipe = layout(TRAINER_PP, 1, 2, 4);
    CHECK(step_layout_of_run(&plain_pipe, 0, fp32_kernels()).weights_later == 0,
          "-sched 1f1b: the forward keeps what only a split backward reads");

    printf("%d failures\n", failures);
    if (failures == 0) printf("step time ok\n");
    return failures != 0;
}
