// A device profile: the handful of numbers that say how fast one rank's device computes, moves
// memory and talks to the other ranks. The step-time model (issue 61: llmc/step_time.h, beside
// memory_plan.h) turns a step's inventory of kernels and collectives into seconds with them:
//
//   a GEMM of F FLOPs          F / (peak x efficiency_matmul_large, or _small when F < matmul_small_flops)
//                              (a kernel takes the larger of its FLOPs' time and its bytes'; on a
//                              CPU, whose core packs a GEMM's operands between its FMAs, the sum,
//                              and calibrate's peak is the rate left once the bytes' time is out)
//   attention of F FLOPs       F / (peak x efficiency_attention)
//   a pass moving M bytes      M / (memory_bandwidth x efficiency_memory; the optimizer's passes
//                              x efficiency_optimizer where given)
//   a message of n bytes       alpha + n / (beta x efficiency_link), alpha and beta of the link it
//                              crosses: inside a node (NVLink; MPI on one host) or across (InfiniBand)
//
// Peaks are what a datasheet promises; efficiencies are the fractions of them that real kernels
// reach, measured. A profile is a small text file a user can write for their own cluster, one
// `key value` a line, `#` to the end of a line a comment, blank lines ignored, numbers plain or in
// e-notation (989.4e12), units in the keys' names:
//
//   name                              NVIDIA H100 SXM5 80GB   (free text, up to 63 characters)
//   kind                              cuda                    (cpu or cuda)
//   peak_flops_fp32                   67e12      FLOP/s of fp32 arithmetic (CUDA cores, no tensor cores)
//   peak_flops_bf16                   989.4e12   FLOP/s of dense bf16 matmuls on the tensor cores
//                                                (a CPU: the same as fp32, the CPU backend is fp32)
//   memory_bandwidth_bytes_per_s      3.35e12    the device memory's bandwidth (HBM; a CPU's DRAM)
//   memory_bytes                      80e9       the device memory (GB = 1e9 bytes, as -mem counts)
//   efficiency_matmul_large           0.69       fraction of the peak a large GEMM reaches ...
//   efficiency_matmul_small           0.51       ... and a small one: fewer FLOPs than
//   matmul_small_flops                5e10       (a GEMM too small to fill the device, or to hide its tail)
//   efficiency_attention              0.13       fraction of the peak causal attention reaches (below)
//   efficiency_memory                 0.53       fraction of the bandwidth that memory-bound kernels
//                                                (LayerNorm, GELU, softmax; AdamW, without the next) reach
//   efficiency_optimizer              ...        (optional, measured profiles) the same for the
//                                                optimizer's passes over the parameters (the gradient
//                                                norm, AdamW); absent: efficiency_memory. It may pass
//                                                1 on a CPU, whose memory_bandwidth is the triad's:
//                                                the triad writes a third array, whose lines the core
//                                                reads before it writes them and the triad does not
//                                                count, where AdamW writes back only what it read.
//                                                One figure for both passes: their sum is what was
//                                                timed (the norm alone runs slower, AdamW faster).
//                                                A GPU's HBM has no such uncounted reads: there a
//                                                value past 1 would be a mistake the range lets by
//   intra_node_latency_s              2e-6       alpha: a message's fixed cost inside a node
//   intra_node_bandwidth_bytes_per_s  450e9      beta: per direction, per GPU (NVLink; on a CPU,
//                                                MPI between two ranks of one host)
//   inter_node_latency_s              5e-6       the same across nodes ...
//   inter_node_bandwidth_bytes_per_s  50e9       ... per GPU (its InfiniBand adapter)
//   gpus_per_node                     8          (optional, 8) ranks that share a node's fast link
//   efficiency_link                   0.8        (optional, 1) fraction of the link bandwidths that
//                                                collectives reach (nccl-tests' bus bandwidth)
//   intra_node_allreduce_latency_s    ...        (optional, measured profiles) an all-reduce of n
//   intra_node_allreduce_bandwidth_bytes_per_s   bytes over 2 ranks of a node took alpha + n / beta
//   cpu_threads, cpu_cores            ...        (optional, kind cpu) the OpenMP threads of the rank
//                                                that was measured, and the host's cores
//   host_flops_fp32                   ...        (optional) the host CPU's FLOP/s and memory bandwidth a
//   host_memory_bandwidth_bytes_per_s ...        GPU (-offload's AdamW): the built-ins' from datasheets,
//                                                a CPU's as its optimizer's passes reach
//   pcie_latency_s, pcie_bandwidth_bytes_per_s   (optional) the link between the device and the host,
//                                                per direction (-offload's copies); the four are given
//                                                together. Absent on a cpu profile: the host is the
//                                                device (its GEMM rate, its optimizer's passes'
//                                                bandwidth, a copy in its memory); absent on a cuda
//                                                one: a DGX A100's host, the least of the built-ins'
//
// Ranks that share a CPU (optional, kind cpu; dev/bench/calibrate measures them when run on 4 or 8
// ranks: mpirun -np 8 --oversubscribe). When N ranks of one thread compute at once on a host of
// fewer cores, or of cores that share caches and memory, each is slower than a rank alone:
//   cpu_gemm_fraction_N_ranks         the fraction of a lone rank's GEMM rate each of N ranks
//                                     reaches while all N run GEMMs at once (N = 2, 4, 8)
//   cpu_memory_fraction_N_ranks       the same for the triad's bandwidth (memory-bound passes)
//   cpu_wait_slowdown                 how many times longer cpu_cores ranks took to compute while as
//                                     many more waited in a blocking MPI receive: MPI polls while
//                                     it waits, so a waiting rank takes (cpu_wait_slowdown - 1) of a
//                                     core from those computing (1: none; 2: as much as a computing one)
//   allreduce_N_ranks_latency_s       an all-reduce of n bytes over N ranks of the host (N = 4, 8)
//   allreduce_N_ranks_bandwidth_bytes_per_s   took alpha + n / beta (each pair given together)
//   reducescatter_N_ranks_latency_s   the same for a reduce-scatter whose input is n bytes and an
//   allgather_N_ranks_latency_s       all-gather whose output is n bytes (N = 2, 4, 8; each with its
//                                     _bandwidth_bytes_per_s): MPI's algorithms for these differ from
//                                     its all-reduce's (Open MPI's reduce-scatter took 1.2 to 4 times
//                                     an all-reduce of the same bytes here), so ZeRO is priced on what
//                                     they took; absent, on the send/recv link as a ring
//   ..._bandwidth_beyond_2mb_bytes_per_s   (each of the nine measured collectives, optional) the
//                                     bandwidth of its bytes past the first 2 MB
//                                     (DEVICE_PROFILE_COLLECTIVE_KNEE_BYTES): a collective of n > 2 MB
//                                     takes alpha + 2 MB / beta + (n - 2 MB) / this. MPI's copies and
//                                     sums of a large buffer run from memory rather than the cache:
//                                     here an all-reduce of 32 MB over 4 ranks took 1.7 times what
//                                     the line through 2 KB to 2 MB says. Absent: the line throughout
//   Absent, N ranks of cpu_threads threads each share cpu_cores evenly (a fraction of
//   cpu_cores / (N cpu_threads) when below 1), a waiting rank takes a whole core, and every
//   all-reduce is priced on the 2-rank one.
// What sharing the host does beyond that (optional, kind cpu; calibrate measures them on any run):
//   cpu_meeting_fraction_N_ranks      how much longer N ranks (N = 2, 4, 8) take to compute and
//                                     meet in a collective, round after round, than to compute
//                                     alone, as a fraction of the compute between two meetings:
//                                     ranks taking turns on the cores arrive apart, and the first
//                                     ones wait (polling, which takes a core from the last) for a
//                                     share of what the others still had to compute. [0, 1];
//                                     absent: 0, no wait (past the largest N given: that N's)
//   cpu_cache_bytes                   the host's last-level cache; the three below come with it
//   cpu_memory_cached_fraction_N_ranks   as cpu_memory_fraction_N_ranks, on arrays that fit in the
//                                     cache with N ranks' arrays together: a memory-bound pass
//                                     whose bytes, times the ranks computing at once, fit in
//                                     cpu_cache_bytes takes this fraction, a larger one the other
//   efficiency_matmul_beyond_cache    the fraction of the peak a GEMM reaches whose bytes exceed
//                                     cpu_cache_bytes (measured on a language model head's shape:
//                                     few tokens against a wide weight, streamed from memory)
//   cpu_cache_bytes, efficiency_matmul_beyond_cache and cpu_memory_cached_fraction_2_ranks are
//   given together or not at all (the 4- and 8-rank fractions optional, as the others); absent,
//   every pass takes the fractions beyond the cache and every GEMM its size class by FLOPs: a
//   profile written before these fields reads as it did.
// Collectives of groups smaller than the world (optional, kind cpu; calibrate measures them on 4
// or 8 ranks pinned to the cores round robin, as dev/bench/sweep.sh runs them):
//   cpu_groups_world                  the ranks running when they were measured: the world split
//                                     into groups of G, every group running the collective at once
//   cpu_groups_cores                  the cores they were pinned to, rank r on core r mod this
//   X_groups_of_G_across_cores_bytes_per_s   (X allreduce, reducescatter or allgather; G = 2, 4)
//   X_groups_of_G_on_one_core_bytes_per_s    the bandwidth of its bytes past the first 2 MB, in
//                                     groups of consecutive ranks (spread over the cores) or of
//                                     ranks cpu_groups_cores apart (all on one core, taking turns). Where
//                                     a group's ranks sit moved the time by up to 2 times here, and
//                                     Open MPI's 2-rank reduce-scatter is no ring: the model prices a
//                                     group of G ranks in a world of cpu_groups_world by these past
//                                     2 MB (llmc/step_time.h, time_group_measured); each needs
//                                     the two above. Absent: the world's ring step.
//
// Attention's FLOPs are counted one way for every profile, as useful work: q k^T and p v over
// the causal pairs (key t2 <= query t), 2 T (T + 1) hs FLOPs a head forward, twice that backward
// (dq, dk, dv and dp). What a fused implementation does beyond that (a flash kernel's
// recomputation and its whole tiles on the diagonal; the CPU's attention loops) lowers its
// efficiency_attention instead, so one formula serves every device. The unfused GPU path
// (LLMC_ATTENTION=cublas: batched GEMMs over whole T x T squares around a softmax) is not one
// kernel: llmc/step_time.h prices its GEMMs and its passes over the scores as what they are, and
// efficiency_attention does not enter (an H200 ran it at twice flash's step, which one efficiency
// for both could not say).
//
// Three profiles are built in, by name (h100-sxm, h200, a100-80gb: their text is below, so the
// WebAssembly page needs no files); this machine's CPU is measured by dev/bench/calibrate, which
// writes dev/profiles/cpu-this-machine.txt. device_profile_load takes a name or a file's path;
// a profile that lacks a field, names an unknown one, repeats one, or gives a value that is not
// a number or out of range is refused with its file, line and field named.
//
// Plain C99 (also compiled as C++ by nvcc and as C by emscripten); nothing is allocated but the
// text of a profile file while it is parsed.
#ifndef LLMC_DEVICE_PROFILE_H
#define LLMC_DEVICE_PROFILE_H

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { DEVICE_CPU = 0, DEVICE_CUDA = 1 };
// where a measured collective's bytes start moving at its _beyond_2mb bandwidth (the whole
// buffer's bytes: the all-reduce's, the reduce-scatter's input, the all-gather's output)
#define DEVICE_PROFILE_COLLECTIVE_KNEE_BYTES 2097152.0
#define DEVICE_PROFILE_NAME_MAX 64

typedef struct {
    char name[DEVICE_PROFILE_NAME_MAX];
    int kind;  // DEVICE_CPU or DEVICE_CUDA
    double peak_flops_fp32, peak_flops_bf16;
    double memory_bandwidth_bytes_per_s, memory_bytes;
    double efficiency_matmul_large, efficiency_matmul_small, matmul_small_flops;
    double efficiency_attention, efficiency_memory;
    double efficiency_optimizer;  // optional: 0, efficiency_memory (device_profile_optimizer_efficiency)
    double intra_node_latency_s, intra_node_bandwidth_bytes_per_s;
    double inter_node_latency_s, inter_node_bandwidth_bytes_per_s;
    int gpus_per_node;       // optional: 8
    double efficiency_link;  // optional: 1
    double intra_node_allreduce_latency_s, intra_node_allreduce_bandwidth_bytes_per_s;  // optional: 0, not measured
    int cpu_threads, cpu_cores;                                                         // optional: 0, not given
    double host_flops_fp32, host_memory_bandwidth_bytes_per_s;  // optional: 0 until filled in after parsing
    double pcie_latency_s, pcie_bandwidth_bytes_per_s;
    // ranks sharing a CPU, at N = 2, 4, 8 ranks computing at once (optional: 0, not measured)
    double cpu_gemm_fraction_2_ranks, cpu_gemm_fraction_4_ranks, cpu_gemm_fraction_8_ranks;
    double cpu_memory_fraction_2_ranks, cpu_memory_fraction_4_ranks, cpu_memory_fraction_8_ranks;
    double cpu_wait_slowdown;
    double allreduce_4_ranks_latency_s, allreduce_4_ranks_bandwidth_bytes_per_s;
    double allreduce_8_ranks_latency_s, allreduce_8_ranks_bandwidth_bytes_per_s;
    // ZeRO's and sequence parallelism's other collectives, measured the same way (optional: 0)
    double reducescatter_2_ranks_latency_s, reducescatter_2_ranks_bandwidth_bytes_per_s;
    double reducescatter_4_ranks_latency_s, reducescatter_4_ranks_bandwidth_bytes_per_s;
    double reducescatter_8_ranks_latency_s, reducescatter_8_ranks_bandwidth_bytes_per_s;
    double allgather_2_ranks_latency_s, allgather_2_ranks_bandwidth_bytes_per_s;
    double allgather_4_ranks_latency_s, allgather_4_ranks_bandwidth_bytes_per_s;
    double allgather_8_ranks_latency_s, allgather_8_ranks_bandwidth_bytes_per_s;
    // each measured collective's bytes past its first 2 MB (optional: 0, at the bandwidth above)
    double intra_node_allreduce_bandwidth_beyond_2mb_bytes_per_s;
    double allreduce_4_ranks_bandwidth_beyond_2mb_bytes_per_s, allreduce_8_ranks_bandwidth_beyond_2mb_bytes_per_s;
    double reducescatter_2_ranks_bandwidth_beyond_2mb_bytes_per_s, reducescatter_4_ranks_bandwidth_beyond_2mb_bytes_per_s;
    double reducescatter_8_ranks_bandwidth_beyond_2mb_bytes_per_s;
    double allgather_2_ranks_bandwidth_beyond_2mb_bytes_per_s, allgather_4_ranks_bandwidth_beyond_2mb_bytes_per_s;
    double allgather_8_ranks_bandwidth_beyond_2mb_bytes_per_s;
    // what sharing the host does beyond that (optional: 0, not measured)
    double cpu_meeting_fraction_2_ranks, cpu_meeting_fraction_4_ranks, cpu_meeting_fraction_8_ranks;
    double cpu_cache_bytes, efficiency_matmul_beyond_cache;
    double cpu_memory_cached_fraction_2_ranks, cpu_memory_cached_fraction_4_ranks, cpu_memory_cached_fraction_8_ranks;
    // collectives of groups smaller than the world, every group at once (optional: 0, not measured)
    int cpu_groups_world, cpu_groups_cores;
    double allreduce_groups_of_2_across_cores_bytes_per_s, allreduce_groups_of_2_on_one_core_bytes_per_s;
    double allreduce_groups_of_4_across_cores_bytes_per_s, allreduce_groups_of_4_on_one_core_bytes_per_s;
    double reducescatter_groups_of_2_across_cores_bytes_per_s, reducescatter_groups_of_2_on_one_core_bytes_per_s;
    double reducescatter_groups_of_4_across_cores_bytes_per_s, reducescatter_groups_of_4_on_one_core_bytes_per_s;
    double allgather_groups_of_2_across_cores_bytes_per_s, allgather_groups_of_2_on_one_core_bytes_per_s;
    double allgather_groups_of_4_across_cores_bytes_per_s, allgather_groups_of_4_on_one_core_bytes_per_s;
} DeviceProfile;

// ----------------------------------------------------------------------------------------------
// The fields, in the order a profile lists them: the parser, the printer and the messages all
// read this one table. A value must lie in [lo, hi], or (lo, hi] where lo_open. The bounds keep
// every time the model computes finite and every rate a device could have: a peak of a megaFLOP/s
// to an exaFLOP/s, a memory of a megabyte/s to a petabyte/s, a link of a byte a second (a test's
// profile counts bytes as seconds) to a petabyte, efficiencies and fractions of 0.001 to 1 (the
// optimizer's to 4: above), a latency up to a second. A rate of 1e-300, or an efficiency of 0,
// would divide a kernel's work into an infinite time, and one of 1e300 is a typo, not a device.

typedef enum { FIELD_TEXT, FIELD_KIND, FIELD_NUMBER, FIELD_COUNT } ProfileFieldType;

typedef struct {
    const char* key;
    size_t offset;  // in DeviceProfile
    ProfileFieldType type;
    int required;
    double lo, hi;
    int lo_open;
    const char* what;  // for messages: what the number is
} ProfileField;

#define PROFILE_FIELD(key, type, required, lo, hi, lo_open, what) \
    { #key, offsetof(DeviceProfile, key), type, required, lo, hi, lo_open, what }

static const ProfileField PROFILE_FIELDS[] = {
    PROFILE_FIELD(name, FIELD_TEXT, 1, 0, 0, 0, "the device's name, free text"),
    PROFILE_FIELD(kind, FIELD_KIND, 1, 0, 0, 0, "cpu or cuda"),
    PROFILE_FIELD(peak_flops_fp32, FIELD_NUMBER, 1, 1e6, 1e18, 0, "FLOP/s of fp32 arithmetic"),
    PROFILE_FIELD(peak_flops_bf16, FIELD_NUMBER, 1, 1e6, 1e18, 0, "FLOP/s of dense bf16 matmuls"),
    PROFILE_FIELD(memory_bandwidth_bytes_per_s, FIELD_NUMBER, 1, 1e6, 1e15, 0, "the device memory's bytes/s"),
    PROFILE_FIELD(memory_bytes, FIELD_NUMBER, 1, 1e6, 1e15, 0, "the device memory in bytes"),
    PROFILE_FIELD(efficiency_matmul_large, FIELD_NUMBER, 1, 1e-3, 1, 0, "the fraction of the peak a large GEMM reaches"),
    PROFILE_FIELD(efficiency_matmul_small, FIELD_NUMBER, 1, 1e-3, 1, 0, "the fraction of the peak a small GEMM reaches"),
    PROFILE_FIELD(matmul_small_flops, FIELD_NUMBER, 1, 0, 1e18, 0, "the FLOPs below which a GEMM counts as small"),
    PROFILE_FIELD(efficiency_attention, FIELD_NUMBER, 1, 1e-3, 1, 0, "the fraction of the peak attention reaches"),
    PROFILE_FIELD(efficiency_memory, FIELD_NUMBER, 1, 1e-3, 1, 0, "the fraction of the bandwidth memory-bound kernels reach"),
    PROFILE_FIELD(efficiency_optimizer, FIELD_NUMBER, 0, 1e-3, 4, 0, "the fraction of the bandwidth the optimizer's passes reach"),
    PROFILE_FIELD(intra_node_latency_s, FIELD_NUMBER, 1, 0, 1, 1, "a message's latency inside a node, in seconds"),
    PROFILE_FIELD(intra_node_bandwidth_bytes_per_s, FIELD_NUMBER, 1, 1, 1e15, 0, "bytes/s per direction inside a node"),
    PROFILE_FIELD(inter_node_latency_s, FIELD_NUMBER, 1, 0, 1, 1, "a message's latency across nodes, in seconds"),
    PROFILE_FIELD(inter_node_bandwidth_bytes_per_s, FIELD_NUMBER, 1, 1, 1e15, 0, "bytes/s per direction across nodes"),
    PROFILE_FIELD(gpus_per_node, FIELD_COUNT, 0, 1, 1e6, 0, "the ranks that share a node"),
    PROFILE_FIELD(efficiency_link, FIELD_NUMBER, 0, 1e-3, 1, 0, "the fraction of a link's bandwidth collectives reach"),
    PROFILE_FIELD(intra_node_allreduce_latency_s, FIELD_NUMBER, 0, 0, 1, 1, "a 2-rank all-reduce's latency, in seconds"),
    PROFILE_FIELD(intra_node_allreduce_bandwidth_bytes_per_s, FIELD_NUMBER, 0, 1, 1e15, 0, "a 2-rank all-reduce's bytes/s"),
    PROFILE_FIELD(cpu_threads, FIELD_COUNT, 0, 1, 1e6, 0, "the OpenMP threads of the measured rank"),
    PROFILE_FIELD(cpu_cores, FIELD_COUNT, 0, 1, 1e6, 0, "the host's cores"),
    PROFILE_FIELD(host_flops_fp32, FIELD_NUMBER, 0, 1e6, 1e18, 0, "the host's FLOP/s a GPU"),
    PROFILE_FIELD(host_memory_bandwidth_bytes_per_s, FIELD_NUMBER, 0, 1e6, 1e15, 0, "the host memory's bytes/s a GPU"),
    PROFILE_FIELD(pcie_latency_s, FIELD_NUMBER, 0, 0, 1, 1, "a copy's latency between device and host, in seconds"),
    PROFILE_FIELD(pcie_bandwidth_bytes_per_s, FIELD_NUMBER, 0, 1, 1e15, 0, "bytes/s per direction between device and host"),
    PROFILE_FIELD(cpu_gemm_fraction_2_ranks, FIELD_NUMBER, 0, 1e-3, 1, 0, "a lone rank's GEMM rate each of 2 ranks reaches"),
    PROFILE_FIELD(cpu_gemm_fraction_4_ranks, FIELD_NUMBER, 0, 1e-3, 1, 0, "a lone rank's GEMM rate each of 4 ranks reaches"),
    PROFILE_FIELD(cpu_gemm_fraction_8_ranks, FIELD_NUMBER, 0, 1e-3, 1, 0, "a lone rank's GEMM rate each of 8 ranks reaches"),
    PROFILE_FIELD(cpu_memory_fraction_2_ranks, FIELD_NUMBER, 0, 1e-3, 1, 0, "a lone rank's bandwidth each of 2 ranks reaches"),
    PROFILE_FIELD(cpu_memory_fraction_4_ranks, FIELD_NUMBER, 0, 1e-3, 1, 0, "a lone rank's bandwidth each of 4 ranks reaches"),
    PROFILE_FIELD(cpu_memory_fraction_8_ranks, FIELD_NUMBER, 0, 1e-3, 1, 0, "a lone rank's bandwidth each of 8 ranks reaches"),
    PROFILE_FIELD(cpu_wait_slowdown, FIELD_NUMBER, 0, 1, 2, 0, "computing ranks' slowdown beside as many waiting in MPI"),
    PROFILE_FIELD(allreduce_4_ranks_latency_s, FIELD_NUMBER, 0, 0, 1, 1, "a 4-rank all-reduce's latency, in seconds"),
    PROFILE_FIELD(allreduce_4_ranks_bandwidth_bytes_per_s, FIELD_NUMBER, 0, 1, 1e15, 0, "a 4-rank all-reduce's bytes/s"),
    PROFILE_FIELD(allreduce_8_ranks_latency_s, FIELD_NUMBER, 0, 0, 1, 1, "an 8-rank all-reduce's latency, in seconds"),
    PROFILE_FIELD(allreduce_8_ranks_bandwidth_bytes_per_s, FIELD_NUMBER, 0, 1, 1e15, 0, "an 8-rank all-reduce's bytes/s"),
    PROFILE_FIELD(reducescatter_2_ranks_latency_s, FIELD_NUMBER, 0, 0, 1, 1, "a 2-rank reduce-scatter's latency, in seconds"),
    PROFILE_FIELD(reducescatter_2_ranks_bandwidth_bytes_per_s, FIELD_NUMBER, 0, 1, 1e15, 0, "a 2-rank reduce-scatter's bytes/s"),
    PROFILE_FIELD(reducescatter_4_ranks_latency_s, FIELD_NUMBER, 0, 0, 1, 1, "a 4-rank reduce-scatter's latency, in seconds"),
    PROFILE_FIELD(reducescatter_4_ranks_bandwidth_bytes_per_s, FIELD_NUMBER, 0, 1, 1e15, 0, "a 4-rank reduce-scatter's bytes/s"),
    PROFILE_FIELD(reducescatter_8_ranks_latency_s, FIELD_NUMBER, 0, 0, 1, 1, "an 8-rank reduce-scatter's latency, in seconds"),
    PROFILE_FIELD(reducescatter_8_ranks_bandwidth_bytes_per_s, FIELD_NUMBER, 0, 1, 1e15, 0, "an 8-rank reduce-scatter's bytes/s"),
    PROFILE_FIELD(allgather_2_ranks_latency_s, FIELD_NUMBER, 0, 0, 1, 1, "a 2-rank all-gather's latency, in seconds"),
    PROFILE_FIELD(allgather_2_ranks_bandwidth_bytes_per_s, FIELD_NUMBER, 0, 1, 1e15, 0, "a 2-rank all-gather's bytes/s"),
    PROFILE_FIELD(allgather_4_ranks_latency_s, FIELD_NUMBER, 0, 0, 1, 1, "a 4-rank all-gather's latency, in seconds"),
    PROFILE_FIELD(allgather_4_ranks_bandwidth_bytes_per_s, FIELD_NUMBER, 0, 1, 1e15, 0, "a 4-rank all-gather's bytes/s"),
    PROFILE_FIELD(allgather_8_ranks_latency_s, FIELD_NUMBER, 0, 0, 1, 1, "an 8-rank all-gather's latency, in seconds"),
    PROFILE_FIELD(allgather_8_ranks_bandwidth_bytes_per_s, FIELD_NUMBER, 0, 1, 1e15, 0, "an 8-rank all-gather's bytes/s"),
    PROFILE_FIELD(intra_node_allreduce_bandwidth_beyond_2mb_bytes_per_s, FIELD_NUMBER, 0, 1, 1e15, 0, "a 2-rank all-reduce's bytes/s past its first 2 MB"),
    PROFILE_FIELD(allreduce_4_ranks_bandwidth_beyond_2mb_bytes_per_s, FIELD_NUMBER, 0, 1, 1e15, 0, "a 4-rank all-reduce's bytes/s past its first 2 MB"),
    PROFILE_FIELD(allreduce_8_ranks_bandwidth_beyond_2mb_bytes_per_s, FIELD_NUMBER, 0, 1, 1e15, 0, "an 8-rank all-reduce's bytes/s past its first 2 MB"),
    PROFILE_FIELD(reducescatter_2_ranks_bandwidth_beyond_2mb_bytes_per_s, FIELD_NUMBER, 0, 1, 1e15, 0, "a 2-rank reduce-scatter's bytes/s past its first 2 MB"),
    PROFILE_FIELD(reducescatter_4_ranks_bandwidth_beyond_2mb_bytes_per_s, FIELD_NUMBER, 0, 1, 1e15, 0, "a 4-rank reduce-scatter's bytes/s past its first 2 MB"),
    PROFILE_FIELD(reducescatter_8_ranks_bandwidth_beyond_2mb_bytes_per_s, FIELD_NUMBER, 0, 1, 1e15, 0, "an 8-rank reduce-scatter's bytes/s past its first 2 MB"),
    PROFILE_FIELD(allgather_2_ranks_bandwidth_beyond_2mb_bytes_per_s, FIELD_NUMBER, 0, 1, 1e15, 0, "a 2-rank all-gather's bytes/s past its first 2 MB"),
    PROFILE_FIELD(allgather_4_ranks_bandwidth_beyond_2mb_bytes_per_s, FIELD_NUMBER, 0, 1, 1e15, 0, "a 4-rank all-gather's bytes/s past its first 2 MB"),
    PROFILE_FIELD(allgather_8_ranks_bandwidth_beyond_2mb_bytes_per_s, FIELD_NUMBER, 0, 1, 1e15, 0, "an 8-rank all-gather's bytes/s past its first 2 MB"),
    PROFILE_FIELD(cpu_meeting_fraction_2_ranks, FIELD_NUMBER, 0, 0, 1, 0, "the compute 2 ranks lose meeting, as a fraction of it"),
    PROFILE_FIELD(cpu_meeting_fraction_4_ranks, FIELD_NUMBER, 0, 0, 1, 0, "the compute 4 ranks lose meeting, as a fraction of it"),
    PROFILE_FIELD(cpu_meeting_fraction_8_ranks, FIELD_NUMBER, 0, 0, 1, 0, "the compute 8 ranks lose meeting, as a fraction of it"),
    PROFILE_FIELD(cpu_cache_bytes, FIELD_NUMBER, 0, 1e4, 1e12, 0, "the host's last-level cache in bytes"),
    PROFILE_FIELD(efficiency_matmul_beyond_cache, FIELD_NUMBER, 0, 1e-3, 1, 0, "the fraction of the peak a GEMM beyond the cache reaches"),
    PROFILE_FIELD(cpu_memory_cached_fraction_2_ranks, FIELD_NUMBER, 0, 1e-3, 1, 0, "a lone rank's in-cache bandwidth each of 2 ranks reaches"),
    PROFILE_FIELD(cpu_memory_cached_fraction_4_ranks, FIELD_NUMBER, 0, 1e-3, 1, 0, "a lone rank's in-cache bandwidth each of 4 ranks reaches"),
    PROFILE_FIELD(cpu_memory_cached_fraction_8_ranks, FIELD_NUMBER, 0, 1e-3, 1, 0, "a lone rank's in-cache bandwidth each of 8 ranks reaches"),
    PROFILE_FIELD(cpu_groups_world, FIELD_COUNT, 0, 2, 1e6, 0, "the ranks whose groups' collectives were measured at once"),
    PROFILE_FIELD(cpu_groups_cores, FIELD_COUNT, 0, 1, 1e6, 0, "the cores those ranks were pinned to, round robin"),
    PROFILE_FIELD(allreduce_groups_of_2_across_cores_bytes_per_s, FIELD_NUMBER, 0, 1, 1e15, 0, "a 2-rank group's all-reduce bytes/s past 2 MB, across cores"),
    PROFILE_FIELD(allreduce_groups_of_2_on_one_core_bytes_per_s, FIELD_NUMBER, 0, 1, 1e15, 0, "a 2-rank group's all-reduce bytes/s past 2 MB, on one core"),
    PROFILE_FIELD(allreduce_groups_of_4_across_cores_bytes_per_s, FIELD_NUMBER, 0, 1, 1e15, 0, "a 4-rank group's all-reduce bytes/s past 2 MB, across cores"),
    PROFILE_FIELD(allreduce_groups_of_4_on_one_core_bytes_per_s, FIELD_NUMBER, 0, 1, 1e15, 0, "a 4-rank group's all-reduce bytes/s past 2 MB, on one core"),
    PROFILE_FIELD(reducescatter_groups_of_2_across_cores_bytes_per_s, FIELD_NUMBER, 0, 1, 1e15, 0, "a 2-rank group's reduce-scatter bytes/s past 2 MB, across cores"),
    PROFILE_FIELD(reducescatter_groups_of_2_on_one_core_bytes_per_s, FIELD_NUMBER, 0, 1, 1e15, 0, "a 2-rank group's reduce-scatter bytes/s past 2 MB, on one core"),
    PROFILE_FIELD(reducescatter_groups_of_4_across_cores_bytes_per_s, FIELD_NUMBER, 0, 1, 1e15, 0, "a 4-rank group's reduce-scatter bytes/s past 2 MB, across cores"),
    PROFILE_FIELD(reducescatter_groups_of_4_on_one_core_bytes_per_s, FIELD_NUMBER, 0, 1, 1e15, 0, "a 4-rank group's reduce-scatter bytes/s past 2 MB, on one core"),
    PROFILE_FIELD(allgather_groups_of_2_across_cores_bytes_per_s, FIELD_NUMBER, 0, 1, 1e15, 0, "a 2-rank group's all-gather bytes/s past 2 MB, across cores"),
    PROFILE_FIELD(allgather_groups_of_2_on_one_core_bytes_per_s, FIELD_NUMBER, 0, 1, 1e15, 0, "a 2-rank group's all-gather bytes/s past 2 MB, on one core"),
    PROFILE_FIELD(allgather_groups_of_4_across_cores_bytes_per_s, FIELD_NUMBER, 0, 1, 1e15, 0, "a 4-rank group's all-gather bytes/s past 2 MB, across cores"),
    PROFILE_FIELD(allgather_groups_of_4_on_one_core_bytes_per_s, FIELD_NUMBER, 0, 1, 1e15, 0, "a 4-rank group's all-gather bytes/s past 2 MB, on one core"),
};
#define PROFILE_FIELD_COUNT ((int)(sizeof(PROFILE_FIELDS) / sizeof(PROFILE_FIELDS[0])))

// ----------------------------------------------------------------------------------------------
// The built-in profiles. Peaks from NVIDIA's datasheets (the same figures as llmc/cuda/device.cuh's
// device_peak, which the trainers' MFU divides by, and dev/bench/roofline.py's devices):
//   H100 SXM5: 1979 TFLOP/s bf16 "with sparsity", so 989.4 dense; 67 fp32; HBM3 3.35 TB/s; 80 GB;
//     NVLink 4 900 GB/s, the total of both directions, so 450 GB/s each way.
//   H200 SXM: the H100's chip (the same 989.4 / 67), with HBM3e: 4.8 TB/s, 141 GB; NVLink 4.
//   A100 SXM4 80GB: 312 TFLOP/s bf16 dense (624 with sparsity), 19.5 fp32, HBM2e 2.039 TB/s, 80 GB;
//     NVLink 3 600 GB/s both directions, 300 each way.
//   InfiniBand, one adapter per GPU as in a DGX: NDR 400 Gb/s = 50 GB/s each way with H100 and H200
//     (DGX H100), HDR 200 Gb/s = 25 GB/s with A100 (DGX A100, and Selene, where Megatron-LM's
//     paper ran: Narayanan et al. 2021, arXiv:2104.04473, eight HDR adapters a node).
//
// Efficiencies of the H100 and H200, from this project's own measurements on an H200 (d12, B = 64,
// T = 1024, bf16; dev/cuda/README.md "Where a GPU step's time goes"); the H100 has the same chip,
// SMs and clocks, so it takes the same fractions. (The H100's d12 step, 139.3-140.1 ms against the
// H200's 121.4 in dev/bench/README.md, is then a check of the model: the two differ in bandwidth.)
//   matmul, large: every GEMM of the step (2026-11-26 table) took 56.9 + 14.4 = 71.3 ms where
//     roofline.py, at 70% of the bf16 peak, predicts 59.5 + 10.7 = 70.2 ms: 0.70 x 70.2 / 71.3 = 0.69.
//     The smallest of them is attproj's, 2 x 65536 x 768 x 768 = 7.7e10 FLOPs.
//   matmul, small: dev/cuda/gelu's fc GEMM at N = 8192 tokens (2 x 8192 x 768 x 3072 = 3.9e10 FLOPs,
//     with GELU in its epilogue) took 0.077 ms on the H200: 502 TFLOP/s, 0.51 of the peak. Below
//     5e10 FLOPs (between that GEMM and attproj's) a GEMM counts as small.
//   attention: the flash kernels took 6.4 ms forward and 22.7 ms backward a step (2026-11-27);
//     useful causal FLOPs 12 layers x 2 T (T + 1) C B = 1.24e12 forward and twice that backward,
//     3.71e12 in 29.1 ms: 128 TFLOP/s, 0.13 of the peak.
//   memory: the memory-bound rows of the 2026-11-26 table (LayerNorm backward 5.5 ms, the classifier
//     8.1, AdamW 1.8, GELU 6.8) took 22.2 ms where roofline.py, at 90% of the bandwidth, predicts
//     3.5 + 3.1 + 0.8 + 5.6 = 13.0: 0.90 x 13.0 / 22.2 = 0.53.
// Efficiencies of the A100, fixed from published measurements before any comparison with
// Megatron-LM's table (issue 61 compares against it; none of these was fitted to it):
//   matmul, large: 0.80. Stas Bekman's maximum-achievable-matmul-FLOPS finder (ml-engineering,
//     mamf-finder.py) found 267.9 TFLOP/s bf16 on an A100 SXM at its best shape, 0.86 of the
//     peak; the shapes of a training step are not all its best one (on the H100 the finder's best
//     is 792.1, 0.80, where a d12 step's GEMMs reached 0.69 above), and cuBLAS's large bf16 GEMMs on
//     an A100 are commonly quoted at about 80% of the peak.
//   matmul, small: 0.59, the large rate times the H200's small-to-large ratio above (0.51 / 0.69);
//     small below 1.6e10 FLOPs, a GEMM of 50 microseconds at the peak, as 5e10 is on the H100.
//   attention: 0.13, the fraction this project's flash kernels reached on the H200 (above), assumed
//     for the A100 as the H100 takes the H200's: no A100 has run them. It prices attention where a
//     layout runs flash (the planner's and the page's default in bf16, head sizes 16, 32 and 64).
//     Megatron-LM (2021) ran attention unfused: two batched cuBLAS GEMMs over the whole T x T
//     square around a fused scale-mask-softmax kernel; step_time.h prices that path (-attention
//     cublas, as the Megatron comparison runs) by its GEMMs at the matmul efficiencies and its
//     passes over the scores at the memory one, so efficiency_attention does not enter there (an
//     earlier 0.10 was chosen for that unfused path, from FlashAttention-2's 5-9x over PyTorch's
//     unfused attention, Dao 2023, arXiv:2307.08691, and then priced nothing the A100 runs).
//   memory: 0.70, an assumption: fused elementwise kernels (apex's LayerNorm, Megatron's fused
//     bias-GeLU and bias-dropout-add) at about three quarters of a streaming copy's ~90%.
// Links, for every GPU profile:
//   efficiency_link 0.8: NCCL's collectives reach about 80% of the per-direction link bandwidth
//     (nccl-tests' bus bandwidth; dev/bench/roofline.py's same assumption).
//   latencies, assumed: 2 us a message inside a node (NCCL's low-latency protocol over NVLink:
//     an 8-GPU ring all-reduce of a few bytes, 14 such steps, takes some tens of microseconds) and
//     5 us across nodes (an InfiniBand switch hop and NCCL's network proxy).

// The host of each built-in (-offload keeps the master weights and AdamW there), per GPU: a DGX's
// two CPUs and their memory split over its 8 GPUs, from the CPUs' datasheets; the peaks, so -offload's
// host part is a lower bound (a STREAM run reaches some 70-90% of a DRAM's peak):
//   DGX H100 and DGX H200: 2 Intel Xeon Platinum 8480C, each 8 channels of DDR5-4800 (8 x 4800e6 x 8
//     bytes = 307.2 GB/s) and 56 cores at 2.0 GHz of 64 fp32 FLOPs a cycle (two AVX-512 FMA units):
//     614.4 GB/s and 14.3 TFLOP/s a node, 76.8 GB/s and 1.79 TFLOP/s a GPU.
//   DGX A100: 2 AMD EPYC 7742, each 8 channels of DDR4-3200 (204.8 GB/s) and 64 cores at 2.25 GHz of
//     32 fp32 FLOPs a cycle (two 256-bit FMA units): 51.2 GB/s and 1.15 TFLOP/s a GPU.
//   PCIe, per direction: Gen5 x16 for H100 and H200 (NVIDIA's datasheets: 128 GB/s both ways), Gen4
//     x16 for A100 (64 GB/s both ways); efficiency_link applies as on the other links. Latency 5 us,
//     assumed: a cudaMemcpy's launch and a round trip over PCIe.
#define DGX_A100_HOST_FLOPS_PER_GPU 1.15e12
#define DGX_A100_HOST_BANDWIDTH_PER_GPU 51.2e9
#define PCIE_LATENCY_S 5e-6
#define PCIE_GEN4_X16_BYTES_PER_S 32e9

static const char DEVICE_PROFILE_H100_SXM[] =
    "# NVIDIA H100 SXM5 80GB (built in: llmc/device_profile.h says where each number comes from)\n"
    "name NVIDIA H100 SXM5 80GB\n"
    "kind cuda\n"
    "peak_flops_fp32 67e12\n"
    "peak_flops_bf16 989.4e12\n"
    "memory_bandwidth_bytes_per_s 3.35e12\n"
    "memory_bytes 80e9\n"
    "efficiency_matmul_large 0.69\n"
    "efficiency_matmul_small 0.51\n"
    "matmul_small_flops 5e10\n"
    "efficiency_attention 0.13\n"
    "efficiency_memory 0.53\n"
    "intra_node_latency_s 2e-6\n"
    "intra_node_bandwidth_bytes_per_s 450e9   # NVLink 4\n"
    "inter_node_latency_s 5e-6\n"
    "inter_node_bandwidth_bytes_per_s 50e9    # InfiniBand NDR 400 Gb/s\n"
    "gpus_per_node 8\n"
    "efficiency_link 0.8\n"
    "host_flops_fp32 1.79e12                  # DGX H100: 2 Xeon 8480C over 8 GPUs\n"
    "host_memory_bandwidth_bytes_per_s 76.8e9 # 16 channels of DDR5-4800 over 8 GPUs\n"
    "pcie_latency_s 5e-6\n"
    "pcie_bandwidth_bytes_per_s 64e9          # PCIe Gen5 x16\n";

static const char DEVICE_PROFILE_H200[] =
    "# NVIDIA H200 SXM 141GB (built in: llmc/device_profile.h says where each number comes from)\n"
    "name NVIDIA H200 SXM 141GB\n"
    "kind cuda\n"
    "peak_flops_fp32 67e12\n"
    "peak_flops_bf16 989.4e12\n"
    "memory_bandwidth_bytes_per_s 4.8e12\n"
    "memory_bytes 141e9\n"
    "efficiency_matmul_large 0.69\n"
    "efficiency_matmul_small 0.51\n"
    "matmul_small_flops 5e10\n"
    "efficiency_attention 0.13\n"
    "efficiency_memory 0.53\n"
    "intra_node_latency_s 2e-6\n"
    "intra_node_bandwidth_bytes_per_s 450e9   # NVLink 4\n"
    "inter_node_latency_s 5e-6\n"
    "inter_node_bandwidth_bytes_per_s 50e9    # InfiniBand NDR 400 Gb/s\n"
    "gpus_per_node 8\n"
    "efficiency_link 0.8\n"
    "host_flops_fp32 1.79e12                  # DGX H200: 2 Xeon 8480C over 8 GPUs\n"
    "host_memory_bandwidth_bytes_per_s 76.8e9 # 16 channels of DDR5-4800 over 8 GPUs\n"
    "pcie_latency_s 5e-6\n"
    "pcie_bandwidth_bytes_per_s 64e9          # PCIe Gen5 x16\n";

static const char DEVICE_PROFILE_A100_80GB[] =
    "# NVIDIA A100 SXM4 80GB (built in: llmc/device_profile.h says where each number comes from)\n"
    "name NVIDIA A100 SXM4 80GB\n"
    "kind cuda\n"
    "peak_flops_fp32 19.5e12\n"
    "peak_flops_bf16 312e12\n"
    "memory_bandwidth_bytes_per_s 2.039e12\n"
    "memory_bytes 80e9\n"
    "efficiency_matmul_large 0.80\n"
    "efficiency_matmul_small 0.59\n"
    "matmul_small_flops 1.6e10\n"
    "efficiency_attention 0.13                # this project's flash kernels, as on the H200\n"
    "efficiency_memory 0.70\n"
    "intra_node_latency_s 2e-6\n"
    "intra_node_bandwidth_bytes_per_s 300e9   # NVLink 3\n"
    "inter_node_latency_s 5e-6\n"
    "inter_node_bandwidth_bytes_per_s 25e9    # InfiniBand HDR 200 Gb/s\n"
    "gpus_per_node 8\n"
    "efficiency_link 0.8\n"
    "host_flops_fp32 1.15e12                  # DGX A100: 2 EPYC 7742 over 8 GPUs\n"
    "host_memory_bandwidth_bytes_per_s 51.2e9 # 16 channels of DDR4-3200 over 8 GPUs\n"
    "pcie_latency_s 5e-6\n"
    "pcie_bandwidth_bytes_per_s 32e9          # PCIe Gen4 x16\n";

typedef struct {
    const char* name;
    const char* text;
} BuiltinProfile;

static const BuiltinProfile BUILTIN_PROFILES[] = {
    {"h100-sxm", DEVICE_PROFILE_H100_SXM},
    {"h200", DEVICE_PROFILE_H200},
    {"a100-80gb", DEVICE_PROFILE_A100_80GB},
};
#define BUILTIN_PROFILE_COUNT ((int)(sizeof(BUILTIN_PROFILES) / sizeof(BUILTIN_PROFILES[0])))

// ----------------------------------------------------------------------------------------------
// Parsing

// "(0, 1]", "[1, 1e+06]": a field's allowed range, for its message
static inline void profile_range_text(const ProfileField* f, char* out, size_t cap) {
    snprintf(out, cap, "%s%g, %g]", f->lo_open ? "(" : "[", f->lo, f->hi);
}

// a number as a profile writes it: digits, a sign, a point and an exponent only (so no "inf",
// "nan", hex or units), all of it read by strtod, and finite
static inline int profile_number(const char* s, double* out) {
    if (*s == '\0') return 0;
    for (const char* c = s; *c; c++) {
        if (!isdigit((unsigned char)*c) && strchr("+-.eE", *c) == NULL) return 0;
    }
    char* end;
    errno = 0;
    double v = strtod(s, &end);
    if (*end != '\0' || errno == ERANGE || !isfinite(v)) return 0;
    *out = v;
    return 1;
}

// the row of PROFILE_FIELDS with this key, or PROFILE_FIELD_COUNT
static inline int profile_field_index(const char* key) {
    int i = 0;
    while (i < PROFILE_FIELD_COUNT && strcmp(PROFILE_FIELDS[i].key, key) != 0) i++;
    return i;
}

// the absent value of an optional field
static inline void profile_defaults(DeviceProfile* p) {
    memset(p, 0, sizeof(*p));
    p->gpus_per_node = 8;
    p->efficiency_link = 1.0;
}

// the fraction of the bandwidth the optimizer's passes reach: efficiency_optimizer where given
static inline double device_profile_optimizer_efficiency(const DeviceProfile* p) {
    return p->efficiency_optimizer > 0.0 ? p->efficiency_optimizer : p->efficiency_memory;
}

// The host where a profile does not describe it. A CPU is its own host: the host's FLOP/s its
// GEMM rate, its bandwidth what its optimizer's passes reach (the host's one kernel: -offload's
// AdamW), its "PCIe" a copy in its memory at its memory-bound passes' bandwidth (a read and a
// write a byte) after a message's latency. A GPU without host fields gets a DGX A100's host, the
// least of the three built-ins' (below): PCIe Gen4 x16 and a share of two EPYC 7742s
static inline void device_profile_fill_host(DeviceProfile* p) {
    if (p->host_memory_bandwidth_bytes_per_s > 0.0) return;
    if (p->kind == DEVICE_CPU) {
        p->host_flops_fp32 = p->peak_flops_fp32;
        p->host_memory_bandwidth_bytes_per_s = p->memory_bandwidth_bytes_per_s * device_profile_optimizer_efficiency(p);
        p->pcie_latency_s = p->intra_node_latency_s;
        p->pcie_bandwidth_bytes_per_s = p->memory_bandwidth_bytes_per_s * p->efficiency_memory / 2.0 / p->efficiency_link;
    } else {
        p->host_flops_fp32 = DGX_A100_HOST_FLOPS_PER_GPU;
        p->host_memory_bandwidth_bytes_per_s = DGX_A100_HOST_BANDWIDTH_PER_GPU;
        p->pcie_latency_s = PCIE_LATENCY_S;
        p->pcie_bandwidth_bytes_per_s = PCIE_GEN4_X16_BYTES_PER_S;
    }
}

// Reads a profile from text; source_name names it in messages (a path, or "built-in profile
// h200"). Returns 1, or 0 with why filled in: "<source>:<line>: <field>: what is wrong".
static inline int device_profile_parse(const char* text, const char* source_name, DeviceProfile* p, char* why,
                                       size_t cap) {
    int seen[PROFILE_FIELD_COUNT];  // the line each field was given on, 0: not yet
    memset(seen, 0, sizeof(seen));
    profile_defaults(p);
    int lineno = 0;
    for (const char* at = text; *at != '\0';) {
        const char* eol = strchr(at, '\n');
        size_t len = eol ? (size_t)(eol - at) : strlen(at);
        lineno++;
        char line[512];
        if (len >= sizeof(line)) {
            snprintf(why, cap, "%s:%d: a line of %zu characters (at most %zu)", source_name, lineno, len, sizeof(line) - 1);
            return 0;
        }
        memcpy(line, at, len);
        line[len] = '\0';
        at = eol ? eol + 1 : at + len;
        char* hash = strchr(line, '#');  // a comment runs to the end of the line
        if (hash) *hash = '\0';
        // key: the first word; value: the rest, trimmed
        char* key = line;
        while (isspace((unsigned char)*key)) key++;
        if (*key == '\0') continue;
        char* value = key;
        while (*value && !isspace((unsigned char)*value)) value++;
        if (*value) *value++ = '\0';
        while (isspace((unsigned char)*value)) value++;
        char* end = value + strlen(value);
        while (end > value && isspace((unsigned char)end[-1])) *--end = '\0';

        int i = profile_field_index(key);
        if (i == PROFILE_FIELD_COUNT) {
            int n = snprintf(why, cap, "%s:%d: unknown key '%s' (the keys:", source_name, lineno, key);
            for (int k = 0; k < PROFILE_FIELD_COUNT && n >= 0 && (size_t)n < cap; k++) {
                n += snprintf(why + n, cap - n, " %s", PROFILE_FIELDS[k].key);
            }
            if (n >= 0 && (size_t)n < cap) snprintf(why + n, cap - n, ")");
            return 0;
        }
        const ProfileField* f = &PROFILE_FIELDS[i];
        if (seen[i]) {
            snprintf(why, cap, "%s:%d: %s given twice (first on line %d)", source_name, lineno, key, seen[i]);
            return 0;
        }
        seen[i] = lineno;
        if (*value == '\0') {
            snprintf(why, cap, "%s:%d: %s has no value (%s)", source_name, lineno, key, f->what);
            return 0;
        }
        char* slot = (char*)p + f->offset;
        if (f->type == FIELD_TEXT) {
            if (strlen(value) >= DEVICE_PROFILE_NAME_MAX) {
                snprintf(why, cap, "%s:%d: %s is longer than %d characters", source_name, lineno, key,
                         DEVICE_PROFILE_NAME_MAX - 1);
                return 0;
            }
            strcpy(slot, value);
        } else if (f->type == FIELD_KIND) {
            if (strcmp(value, "cpu") != 0 && strcmp(value, "cuda") != 0) {
                snprintf(why, cap, "%s:%d: %s '%s': expected cpu or cuda", source_name, lineno, key, value);
                return 0;
            }
            *(int*)slot = strcmp(value, "cuda") == 0 ? DEVICE_CUDA : DEVICE_CPU;
        } else {
            double v;
            char range[64];
            profile_range_text(f, range, sizeof(range));
            if (!profile_number(value, &v)) {
                snprintf(why, cap, "%s:%d: %s '%s' is not a number (plain or e-notation, no units: %s)", source_name,
                         lineno, key, value, f->what);
                return 0;
            }
            if (v > f->hi || (f->lo_open ? v <= f->lo : v < f->lo)) {
                snprintf(why, cap, "%s:%d: %s %s is out of range %s (%s)", source_name, lineno, key, value, range,
                         f->what);
                return 0;
            }
            if (f->type == FIELD_COUNT) {
                if (v != floor(v)) {
                    snprintf(why, cap, "%s:%d: %s %s is not a whole number (%s)", source_name, lineno, key, value,
                             f->what);
                    return 0;
                }
                *(int*)slot = (int)v;
            } else {
                *(double*)slot = v;
            }
        }
    }
    for (int i = 0; i < PROFILE_FIELD_COUNT; i++) {
        if (PROFILE_FIELDS[i].required && !seen[i]) {
            snprintf(why, cap, "%s: missing field %s (%s)", source_name, PROFILE_FIELDS[i].key, PROFILE_FIELDS[i].what);
            return 0;
        }
    }
    // fields that are given together or not at all: a measured all-reduce's two numbers, the host's four
    static const char* const together[][5] = {
        {"cpu_cache_bytes", "efficiency_matmul_beyond_cache", "cpu_memory_cached_fraction_2_ranks", NULL,
         "the cache and what was measured against it are given together"},
        {"intra_node_allreduce_latency_s", "intra_node_allreduce_bandwidth_bytes_per_s", NULL, NULL, "a measured all-reduce gives both"},
        {"allreduce_4_ranks_latency_s", "allreduce_4_ranks_bandwidth_bytes_per_s", NULL, NULL, "a measured all-reduce gives both"},
        {"allreduce_8_ranks_latency_s", "allreduce_8_ranks_bandwidth_bytes_per_s", NULL, NULL, "a measured all-reduce gives both"},
        {"reducescatter_2_ranks_latency_s", "reducescatter_2_ranks_bandwidth_bytes_per_s", NULL, NULL, "a measured reduce-scatter gives both"},
        {"reducescatter_4_ranks_latency_s", "reducescatter_4_ranks_bandwidth_bytes_per_s", NULL, NULL, "a measured reduce-scatter gives both"},
        {"reducescatter_8_ranks_latency_s", "reducescatter_8_ranks_bandwidth_bytes_per_s", NULL, NULL, "a measured reduce-scatter gives both"},
        {"allgather_2_ranks_latency_s", "allgather_2_ranks_bandwidth_bytes_per_s", NULL, NULL, "a measured all-gather gives both"},
        {"allgather_4_ranks_latency_s", "allgather_4_ranks_bandwidth_bytes_per_s", NULL, NULL, "a measured all-gather gives both"},
        {"allgather_8_ranks_latency_s", "allgather_8_ranks_bandwidth_bytes_per_s", NULL, NULL, "a measured all-gather gives both"},
        {"host_flops_fp32", "host_memory_bandwidth_bytes_per_s", "pcie_latency_s", "pcie_bandwidth_bytes_per_s",
         "the host and its link are given together"},
    };
    for (size_t g = 0; g < sizeof(together) / sizeof(together[0]); g++) {
        int given = -1, missing = -1;
        for (int k = 0; k < 4 && together[g][k]; k++) {
            int i = profile_field_index(together[g][k]);
            if (seen[i] && given < 0) given = i;
            if (!seen[i] && missing < 0) missing = i;
        }
        if (given >= 0 && missing >= 0) {
            snprintf(why, cap, "%s:%d: %s without %s (%s)", source_name, seen[given], PROFILE_FIELDS[given].key,
                     PROFILE_FIELDS[missing].key, together[g][4]);
            return 0;
        }
    }
    // a group's measured collective names the world it ran in and the cores its ranks were pinned to
    int world_seen = seen[profile_field_index("cpu_groups_world")], cores_seen = seen[profile_field_index("cpu_groups_cores")];
    for (int i = 0; i < PROFILE_FIELD_COUNT; i++) {
        if (!seen[i] || strstr(PROFILE_FIELDS[i].key, "_groups_of_") == NULL || (world_seen && cores_seen)) continue;
        snprintf(why, cap, "%s:%d: %s without %s (a group's collective is priced by the world it was measured in and "
                 "where its ranks sat on the cores)", source_name, seen[i], PROFILE_FIELDS[i].key,
                 world_seen ? "cpu_groups_cores" : "cpu_groups_world");
        return 0;
    }
    device_profile_fill_host(p);
    return 1;
}

// Reads a built-in profile by name (h100-sxm, h200, a100-80gb) or else a profile file by path.
static inline int device_profile_load(const char* name_or_path, DeviceProfile* p, char* why, size_t cap) {
    for (int i = 0; i < BUILTIN_PROFILE_COUNT; i++) {
        if (strcmp(name_or_path, BUILTIN_PROFILES[i].name) == 0) {
            char source[64];
            snprintf(source, sizeof(source), "built-in profile %s", BUILTIN_PROFILES[i].name);
            return device_profile_parse(BUILTIN_PROFILES[i].text, source, p, why, cap);
        }
    }
    FILE* f = fopen(name_or_path, "rb");
    if (f == NULL) {
        snprintf(why, cap, "%s: not a built-in profile (h100-sxm, h200, a100-80gb) and not a file that opens: %s",
                 name_or_path, strerror(errno));
        return 0;
    }
    // the whole file, read into one buffer (a profile is a few hundred bytes; 1 MB is not one)
    char* text = NULL;
    size_t size = 0;
    long length = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (length >= 0 && length <= (1 << 20) && fseek(f, 0, SEEK_SET) == 0) {
        text = (char*)malloc((size_t)length + 1);
        if (text) size = fread(text, 1, (size_t)length, f);
    }
    fclose(f);
    if (text == NULL || size != (size_t)length) {
        snprintf(why, cap, "%s: could not read it as a profile (%s)", name_or_path,
                 length > (1 << 20) ? "over 1 MB" : "a read error");
        free(text);
        return 0;
    }
    text[size] = '\0';
    if (strlen(text) != size) {
        snprintf(why, cap, "%s: holds a zero byte: not a text profile", name_or_path);
        free(text);
        return 0;
    }
    int ok = device_profile_parse(text, name_or_path, p, why, cap);
    free(text);
    return ok;
}

// Writes a profile in the format above, one field a line (optional fields left out where absent),
// so that device_profile_parse reads it back.
static inline void device_profile_print(FILE* out, const DeviceProfile* p) {
    for (int i = 0; i < PROFILE_FIELD_COUNT; i++) {
        const ProfileField* f = &PROFILE_FIELDS[i];
        const char* slot = (const char*)p + f->offset;
        if (f->type == FIELD_TEXT) {
            fprintf(out, "%s %s\n", f->key, slot);
        } else if (f->type == FIELD_KIND) {
            fprintf(out, "%s %s\n", f->key, *(const int*)slot == DEVICE_CUDA ? "cuda" : "cpu");
        } else if (f->type == FIELD_COUNT) {
            if (f->required || *(const int*)slot != 0) fprintf(out, "%s %d\n", f->key, *(const int*)slot);
        } else if (f->required || *(const double*)slot != 0.0) {
            fprintf(out, "%s %.10g\n", f->key, *(const double*)slot);
        }
    }
}

// 1 when the profile describes the backend a plan is for (-device cpu: a kind cpu profile, whose
// ranks share a host's cores and whose kernels are the CPU backend's; -device cuda: a kind cuda
// one); else 0, with why naming both flags. A GPU's step priced on a CPU's numbers, or the
// reverse, is a number of no device, so it is refused rather than printed.
static inline int device_profile_kind_matches(const DeviceProfile* p, int cuda, const char* profile, char* why,
                                              size_t cap) {
    if ((p->kind == DEVICE_CUDA) == (cuda != 0)) return 1;
    snprintf(why, cap, "-profile %s is a kind %s profile, and -device %s plans the %s backend: give -device %s, or a "
             "%s profile (%s)", profile, p->kind == DEVICE_CUDA ? "cuda" : "cpu", cuda ? "cuda" : "cpu",
             cuda ? "CUDA" : "CPU", p->kind == DEVICE_CUDA ? "cuda" : "cpu", cuda ? "GPU" : "CPU",
             cuda ? "h100-sxm, h200, a100-80gb or a file of kind cuda"
                  : "dev/profiles/cpu-this-machine.txt, dev/bench/calibrate's, or a file of kind cpu");
    return 0;
}

// ----------------------------------------------------------------------------------------------
// Reading a profile the way its fields are defined

// the peak for matmuls in floats of X bytes: bf16 (2) on the tensor cores, fp32 (4) otherwise
static inline double device_profile_peak_flops(const DeviceProfile* p, int X) {
    return X == 2 ? p->peak_flops_bf16 : p->peak_flops_fp32;
}

// the fraction of the peak a GEMM of `flops` reaches: the small class below matmul_small_flops
static inline double device_profile_matmul_efficiency(const DeviceProfile* p, double flops) {
    return flops < p->matmul_small_flops ? p->efficiency_matmul_small : p->efficiency_matmul_large;
}

#endif
