"""
A roofline model of one training step of train_gpt2_dp.cu on a GPU: every CUDA kernel the step
launches, what it computes, what it must move, and how long that takes.

    /usr/bin/python3 dev/bench/roofline.py -e d12 -b 64 -t 1024 -device h100-sxm
    /usr/bin/python3 dev/bench/roofline.py -e d12 -b 64 -t 1024 -attention cublas -epilogue 0
    /usr/bin/python3 dev/bench/roofline.py -e 12/768/12 -b 4 -t 64 -json
    /usr/bin/python3 dev/bench/roofline.py -e d12 -device h100-sxm -profile my_cluster.txt

Nothing here is a model of its own: the step's kernels are llmc/step_kernels.h's rows and their
prices llmc/step_time.h's on a device profile (llmc/device_profile.h: h100-sxm, h200, a100-80gb
built in, or a profile file you write), the one copy of the step-time model that
dev/memory_planner, dev/memory.html and the trainers' predicted step read too.
dev/bench/step_kernels -profile prints both (make dev/bench/step_kernels); this script lays them out
as a table, with the datasheet peaks of -device for the ridge point and MFU.

What a roofline is (Williams, Waterman & Patterson, "Roofline", CACM 52(4), 2009). A kernel does
some arithmetic (F floating-point operations) on data it must bring from the GPU's memory (HBM)
and write back (M bytes). The chip has two speeds, a peak arithmetic rate P (FLOP/s, from the
tensor cores for matmuls, from the ordinary fp32 units for everything else) and a memory
bandwidth W (bytes/s). Neither can go faster than its own limit, and in the best case the two
overlap completely, so the kernel takes at least

    time >= max(F / P, M / W).

Which term wins depends on the kernel's arithmetic intensity I = F / M (FLOP per byte) against the
machine's ridge point P / W. On an H100 SXM in bf16: P / W = 989e12 / 3.35e12 = 295 FLOP/byte.
- A matmul (N, K) x (K, M) does 2 N K M FLOPs on N K + K M + N M elements. For the MLP's first
  layer at B=64, T=1024 (N = 65536, K = 768, M = 3072) that is 309 GFLOP on 0.51 GB in bf16,
  I ~ 610 FLOP/byte, right of the ridge: compute-bound. Every element is reused ~K times from
  registers and shared memory, so the bytes grow as N^2 while the FLOPs grow as N^3.
- LayerNorm does ~8 FLOPs per element and reads 2 bytes and writes 2 more: I ~ 2 FLOP/byte, a
  hundred times left of the ridge (and left of the fp32 units' ridge, 67e12 / 3.35e12 = 20 too):
  memory-bound. So are GELU, the residual adds, the softmax of the loss and AdamW. Making them
  faster means moving fewer bytes (fusing kernels, keeping data in registers), not fewer FLOPs.
Nobody reaches a datasheet peak, so llmc/step_time.h uses achievable rates: the profile's
efficiencies, a fraction of each peak (a GEMM's by its size class, attention's on its useful causal
FLOPs, the memory system's for every kernel's bytes). The roofline's lower bound above is the
special case of efficiencies 1 (a profile file with every efficiency 1 prints it).

What the rows count, per kernel (llmc/step_kernels.h says how, kernel by kernel):
- FLOPs: matmuls exactly (2 m n k); attention as the kernels execute it (the causal flash kernels
  visit whole 64 x 64 tiles up to the diagonal; the cuBLAS path multiplies full T x T squares);
  elementwise kernels by an approximate count of fp32 operations per element (stated there).
- bytes: the minimum a kernel must move: each input read once and each output written once, at
  its element width (bf16 = 2 bytes for parameters, activations and gradients; fp32 for master
  weights, AdamW's m and v, LayerNorm's mean and rstd, attention's lse). Re-reads served by the
  caches are free here, and a kernel that reads an input twice from HBM is slower than its row.
- time (llmc/step_time.h): max(FLOPs / achievable FLOP/s, bytes / achievable bandwidth) for a
  GEMM; bytes / achievable bandwidth for the elementwise kernels; attention's rows of a phase share
  its useful FLOPs / (peak x efficiency_attention). Launch latency, the host's own work (the
  encoder backward's sort, the loss's copy to the host) and the tail of a grid that does not fill
  the GPU are not counted. The predicted step is the kernels' sum; a collective's row is its time
  on a group inside one node, before any overlap hides it (how much does: dev/memory_planner's
  time_parts, which play the whole layout).
- bound: which side of the datasheet ridge the row is on (FLOPs / peak against bytes / HBM).
MFU is computed as the trainer does (llmc/gpt2.h, gpt2_flops_per_token): 6 x parameters +
12 L C T FLOPs per token (the attention term counted without the causal half), times B T, over
the step time, over the device's dense peak for the precision (llmc/cuda/device.cuh).
"""
import argparse
import json
import os
import re
import subprocess
import sys

# ---------------------------------------------------------------------------------------------
# devices: dense peaks and HBM bandwidth from NVIDIA's datasheets, the same peaks as
# llmc/cuda/device.cuh's device_peak (the trainers' MFU), for the ridge point and MFU printed
# here; profile: the built-in device profile (llmc/device_profile.h) that prices the rows by
# default (none for the PCIe and NVL parts: give -profile FILE)
DEVICES = {
    # H100 datasheet (SXM5): bf16 1979 TFLOP/s with sparsity = 989 dense, fp32 67, HBM3 3.35 TB/s
    "h100-sxm": dict(name="H100 SXM", bf16=989e12, fp32=67e12, hbm=3.35e12, profile="h100-sxm"),
    # H100 datasheet (PCIe): bf16 756 dense, fp32 51, HBM2e 2.0 TB/s
    "h100-pcie": dict(name="H100 PCIe", bf16=756e12, fp32=51e12, hbm=2.0e12, profile=None),
    # H100 datasheet (NVL): bf16 835 dense, fp32 60, HBM3 3.9 TB/s
    "h100-nvl": dict(name="H100 NVL", bf16=835e12, fp32=60e12, hbm=3.9e12, profile=None),
    # H200 datasheet (SXM): the H100 SXM's compute (989 / 67) with HBM3e at 4.8 TB/s
    "h200": dict(name="H200 SXM", bf16=989e12, fp32=67e12, hbm=4.8e12, profile="h200"),
    # A100 datasheet (SXM 80GB): bf16 312 dense, fp32 19.5, HBM2e 2.039 TB/s
    "a100": dict(name="A100 SXM 80GB", bf16=312e12, fp32=19.5e12, hbm=2.039e12, profile="a100-80gb"),
}


def ceil_div(a, b):
    return (a + b - 1) // b


# ---------------------------------------------------------------------------------------------
# the model: GPT-2 shapes as llmc/gpt2.h builds them

def parse_model(desc):
    """'d12' (as gpt2_config_from_descriptor) or 'L/C/NH'; returns dict(L, C, NH, V, Vp, maxT)"""
    if desc.startswith("d") and desc[1:].isdigit():
        L = int(desc[1:])
        C, NH = {24: (1024, 16), 36: (1280, 20), 48: (1600, 25)}.get(L, (64 * L, L))
    else:
        parts = desc.split("/")
        if len(parts) != 3 or not all(p.isdigit() for p in parts):
            raise ValueError("-e %s: expected dL (d12, d24, d36, d48, ...) or L/C/NH such as 12/768/12" % desc)
        L, C, NH = (int(p) for p in parts)
    if L <= 0 or C <= 0 or NH <= 0 or C % NH != 0:
        raise ValueError("-e %s: L, C, NH must be positive and NH must divide C" % desc)
    V = 50257
    return dict(L=L, C=C, NH=NH, V=V, Vp=ceil_div(V, 128) * 128, maxT=1024)  # Vp = 50304, as the trainers pad


def mlp_parameters(C):
    """one MLP (an expert): fc (4C x C + 4C), fcproj (C x 4C + C)"""
    return 8 * C * C + 5 * C


def num_parameters(m):
    """gpt2_parameter_sizes summed for a dense GPT-2: wte, wpe, and per layer ln1, qkv, attproj,
    ln2, fc, fcproj, then lnf"""
    L, C = m["L"], m["C"]
    per_layer = 2 * C + (3 * C * C + 3 * C) + (C * C + C) + 2 * C
    return m["Vp"] * C + m["maxT"] * C + L * (per_layer + mlp_parameters(C)) + 2 * C


# ---------------------------------------------------------------------------------------------
# the step, kernel by kernel: llmc/step_kernels.h's rows, as dev/bench/step_kernels prints them

STEP_KERNELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "step_kernels")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def step_rows(args, attention):
    """the rows of one rank's step from the C (llmc/step_kernels.h): each kernel's group, name,
    calls, launches, FLOPs and bytes of one call, engine ('gemm' for cuBLAS on tensor cores, or
    strict fp32 in fp32 builds, 'attn' for the flash kernels, 'vector' for the fp32 CUDA cores,
    'memset', 'link'), op and launch (its name in the LLMC_KERNEL_TIMES=1 table, None for the
    collectives), phase and its seconds a step on args.profile (llmc/step_time.h); then the
    parameters the rank holds and the kernels' seconds (the compute rows' sum)"""
    sources = [os.path.join(ROOT, f) for f in ("dev/bench/step_kernels.c", "llmc/step_kernels.h", "llmc/gpt2.h",
                                                "llmc/target.h", "llmc/step_time.h", "llmc/device_profile.h",
                                                "llmc/comm_time.h")]
    if not os.path.exists(STEP_KERNELS):
        raise ValueError("dev/bench/step_kernels is not built (the step's kernels, from llmc/step_kernels.h): run "
                         "make dev/bench/step_kernels")
    newer = [os.path.relpath(f, ROOT) for f in sources if os.path.getmtime(f) > os.path.getmtime(STEP_KERNELS)]
    if newer:
        raise ValueError("dev/bench/step_kernels is older than %s: run make dev/bench/step_kernels" % ", ".join(newer))
    flags = ["-e", args.e, "-b", args.b, "-t", args.t, "-precision", args.precision, "-attention", attention,
             "-epilogue", args.epilogue, "-dp", args.dp, "-cp", args.cp, "-experts", args.experts, "-topk", args.topk,
             "-ep", args.ep, "-gelu", args.gelu, "-ln_backward", args.ln_backward, "-profile", args.profile]
    p = subprocess.run([STEP_KERNELS] + [str(f) for f in flags], capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        raise ValueError("dev/bench/step_kernels: " + (p.stderr.strip() or "exit %d" % p.returncode))
    out = json.loads(p.stdout)
    rows = [dict(group=r["group"], kernel=r["kernel"], calls=r["calls"], launches=r["launches"], flops=float(r["flops"]),
                 bytes=float(r["bytes"]), engine=r["engine"], op=r["op"], launch=r["launch"], phase=r["phase"],
                 seconds=float(r["seconds"])) for r in out["rows"]]
    return rows, out["parameters"], float(out["seconds"])


# ---------------------------------------------------------------------------------------------

def roofline(args):
    m = parse_model(args.e)
    dev = DEVICES[args.device]
    hs = m["C"] // m["NH"]
    flash_ok = args.precision == "bf16" and hs in (16, 32, 64)  # llmc/target.h flash_attention_supports
    attention = args.attention
    if attention == "auto":  # as the trainer picks without LLMC_ATTENTION
        attention = "flash" if flash_ok else "cublas"
    if attention == "flash" and not flash_ok:
        raise ValueError("-attention flash needs -precision bf16 and a head size of 16, 32 or 64 (this one: %s, %d), "
                         "as the trainer's LLMC_ATTENTION=flash" % (args.precision, hs))
    if not 1 <= args.t <= m["maxT"]:
        raise ValueError("-t %d: expected 1..%d (the model's maxT)" % (args.t, m["maxT"]))
    if args.cp > 1 and (args.dp > 1 or args.t % (2 * args.cp) != 0):
        raise ValueError("-cp %d: train_gpt2_cp alone (-dp 1), with -t a multiple of 2 cp (zigzag)" % args.cp)
    if args.experts and (args.experts < 2 or not 1 <= args.topk <= args.experts or args.experts % args.ep
                         or args.dp % args.ep or args.cp > 1):
        raise ValueError("-experts %d -topk %d -ep %d: expected E >= 2, 1 <= k <= E, ep dividing E and -dp, -cp 1 "
                         "(train_gpt2_ep)" % (args.experts, args.topk, args.ep))
    rows, P, step = step_rows(args, attention)

    # each row's time is llmc/step_time.h's price of it (the row's "seconds", all its calls); the
    # peaks of -device say which side of the ridge it is on. In bf16 the matmuls run on the tensor
    # cores; fp32 builds compute in strict fp32 (no TF32: llmc/cuda/matmul.cuh) on the ordinary
    # fp32 units, as does all the elementwise arithmetic in both builds
    peak = dev[args.precision]
    peaks = dict(gemm=peak, attn=peak, vector=dev["fp32"])
    for r in rows:
        t_flops = r["flops"] / peaks[r["engine"]] if r["engine"] in peaks else 0.0
        r.update(time_s=r["seconds"] / r["calls"], total_time_s=r["seconds"],
                 bound=("link" if r["engine"] == "link" else "compute" if t_flops > r["bytes"] / dev["hbm"] else "memory"),
                 intensity=r["flops"] / r["bytes"] if r["bytes"] else 0.0,
                 total_flops=r["flops"] * r["calls"], total_bytes=r["bytes"] * r["calls"])
    # the predicted step is the kernels' (step_kernels' "seconds"); a share is of that
    for r in rows:
        r["share"] = r["total_time_s"] / step
    comm = sum(r["total_time_s"] for r in rows if r["engine"] == "link")
    B, T, L, C = args.b, args.t, m["L"], m["C"]
    active = num_parameters(m) + (L * args.experts * C if args.experts else 0)  # a token's: k MLPs a layer
    if args.experts:
        active += L * (args.topk - 1) * mlp_parameters(C)
    per_token = 6.0 * active + 12.0 * L * C * T  # llmc/gpt2.h gpt2_flops_per_token
    model_flops = per_token * B * T / args.cp  # (one rank's share: the cp ranks split each sequence)
    summary = dict(step_time_s=step, compute_time_s=step, comm_time_s=comm,
                   tokens_per_s=args.dp * B * T / step,  # (cp ranks share B T)
                   model_flops_per_token=per_token, model_flops=model_flops,
                   executed_flops=sum(r["total_flops"] for r in rows),
                   mfu=model_flops / step / peak, launches=sum(r["launches"] for r in rows))
    assumptions = dict(device=args.device, device_name=dev["name"], precision=args.precision, profile=args.profile,
                       peak_flops=peak, peak_vector_flops=dev["fp32"], hbm_bytes_per_s=dev["hbm"],
                       ridge_peak=peak / dev["hbm"], ridge_vector=dev["fp32"] / dev["hbm"])
    config = dict(model=args.e, L=L, C=C, NH=m["NH"], hs=hs, V=m["V"], Vp=m["Vp"], maxT=m["maxT"], B=B, T=T,
                  precision=args.precision, attention=attention, epilogue=args.epilogue, gelu=args.gelu,
                  ln_backward=args.ln_backward, dp=args.dp, cp=args.cp,
                  experts=args.experts, topk=args.topk, ep=args.ep, parameters=P)
    return dict(config=config, assumptions=assumptions, rows=rows, summary=summary)


def si(x, unit):
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return "%.3g %s%s" % (x / scale, prefix, unit)
    return "%.3g %s" % (x, unit)


def print_table(res):
    c, a, s = res["config"], res["assumptions"], res["summary"]
    moe = ", %d experts (top-%d), %d a rank (-ep %d)" % (c["experts"], c["topk"], c["experts"] // c["ep"], c["ep"]) \
        if c["experts"] else ""
    print("Roofline of one %s step: %s (L=%d C=%d NH=%d%s, %.1fM parameters a rank), B=%d T=%d, %s, %s attention, "
          "bias gradients %s%s%s%s" % ("train_gpt2_ep" if c["experts"] else "train_gpt2_dp", c["model"], c["L"], c["C"], c["NH"],
                                   moe, c["parameters"] / 1e6, c["B"], c["T"],
                                   c["precision"], c["attention"],
                                   "in the GEMMs' BGRADB epilogue" if c["epilogue"] else "as separate kernels",
                                   ", GELU in the fc GEMMs' epilogues" if c["gelu"] == "epilogue" else ", GELU in kernels",
                                   ", the LayerNorm backward fused" if any(
                                       r["kernel"].startswith("layernorm_backward_fused") for r in res["rows"]) else
                                   ", the LayerNorm backward in separate kernels",
                                   ", %d data-parallel ranks" % c["dp"] if c["dp"] > 1 else ""))
    print("device %s: %s dense %s peak, fp32 (non-tensor) %s, HBM %s (datasheets; llmc/cuda/device.cuh)"
          % (a["device_name"], si(a["peak_flops"], "FLOP/s"), c["precision"], si(a["peak_vector_flops"], "FLOP/s"),
             si(a["hbm_bytes_per_s"], "B/s")))
    print("priced by llmc/step_time.h on profile %s (its achievable rates: the profile's efficiencies of the peaks; "
          "dev/bench/step_kernels -profile)" % a["profile"])
    print("ridge point (FLOP/byte where compute and memory take equally long): %.0f at the datasheet peaks; %.0f for "
          "fp32 elementwise work" % (a["ridge_peak"], a["ridge_vector"]))
    print("time = max(FLOPs / achievable FLOP/s, bytes / achievable bandwidth), attention's rows sharing its useful "
          "FLOPs' time; bound: the side of the datasheet ridge a kernel is on")
    print()
    w = 52
    header = "%-*s %6s %9s %9s %7s %9s %9s %-7s %6s" % (w, "kernel", "calls", "GFLOP", "MB", "FLOP/B", "us/call",
                                                         "total ms", "bound", "share")
    print(header)
    print("-" * len(header))
    L = c["L"]
    group = None
    totals = {}
    for r in res["rows"]:
        totals.setdefault(r["group"], 0.0)
        totals[r["group"]] += r["total_time_s"]
    for r in res["rows"]:
        if r["group"] != group:
            group = r["group"]
            per = " (x %d layers: per call, then the total)" % L if group.startswith("layer") else ""
            print("%s%s: %.2f ms, %.1f%%" % (group, per, totals[group] * 1e3, 100 * totals[group] / s["step_time_s"]))
        calls = ("x %d" % r["calls"]) if r["calls"] > 1 else "1"
        if r["launches"] != r["calls"]:
            calls += "*"
        print("  %-*s %6s %9.2f %9.1f %7.1f %9.1f %9.3f %-7s %5.1f%%"
              % (w - 2, r["kernel"], calls, r["flops"] / 1e9, r["bytes"] / 1e6, r["intensity"], r["time_s"] * 1e6,
                 r["total_time_s"] * 1e3, r["bound"], 100 * r["share"]))
    print("-" * len(header))
    print("(* a call is several launches of the same kind: %s)" % ", ".join(
        "%s %d launches" % (r["kernel"], r["launches"]) for r in res["rows"] if r["launches"] != r["calls"]))
    by_engine = {}
    for r in res["rows"]:
        key = {"gemm": "GEMMs (cuBLASLt)", "attn": "flash attention",
               "link": "all-reduce" if c["cp"] == 1 else "communication"}.get(r["engine"],
                                                                                               "memory-bound kernels")
        if r["engine"] in ("gemm", "attn") and r["bound"] == "memory":
            key = "memory-bound kernels"
        by_engine[key] = by_engine.get(key, 0.0) + r["total_time_s"]
    print("by kind: " + ", ".join("%s %.2f ms (%.0f%%)" % (k, v * 1e3, 100 * v / s["step_time_s"])
                                  for k, v in sorted(by_engine.items(), key=lambda kv: -kv[1])))
    print("executed %.2f TFLOP (attention as the kernels run it) against the model's %.2f TFLOP (6 P + 12 L C T per "
          "token, llmc/run.h); %d kernel launches" % (s["executed_flops"] / 1e12, s["model_flops"] / 1e12,
                                                       s["launches"]))
    print("not counted: launch latency and grid tails (small kernels such as bias_accumulate take a few us, not "
          "0.0), the host's work inside the step (the loss copied to the host after fused_classifier, the encoder "
          "backward's token sort and its copies, the gradient norm read back before AdamW), which leave the GPU idle")
    print()
    print("predicted step time (the kernels, profile %s): %.2f ms, %.0f tokens/s%s, MFU %.1f%% (of the %s dense %s peak)"
          % (a["profile"], s["step_time_s"] * 1e3, s["tokens_per_s"],
             " over %d ranks" % (c["dp"] * c["cp"]) if c["dp"] * c["cp"] > 1 else "",
             100 * s["mfu"], a["device_name"], c["precision"]))
    if c["dp"] * c["cp"] > 1:
        print("  plus the collectives' %.2f ms before any overlap hides them (%s; what stays exposed: dev/memory_planner's "
              "time_parts)" % (s["comm_time_s"] * 1e3, "the ring's K,V and the gradients' all-reduce" if c["cp"] > 1
                               else "the gradients' all-reduce"))


def this_gpu():
    """the DEVICES key of the GPU nvidia-smi names (the parts told apart as llmc/cuda/device.cuh
    does), for -device auto"""
    try:
        name = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=30).stdout.splitlines()[0]
    except (OSError, IndexError, subprocess.TimeoutExpired):
        raise ValueError("-device auto: nvidia-smi names no GPU here; give one of " + ", ".join(sorted(DEVICES)))
    for key, words in (("h100-pcie", ("H100", "PCIe")), ("h100-nvl", ("H100", "NVL")), ("h100-sxm", ("H100",)),
                       ("h200", ("H200",)), ("a100", ("A100",))):
        if all(w in name for w in words):
            return key
    raise ValueError("-device auto: no roofline for the %s; give one of %s" % (name, ", ".join(sorted(DEVICES))))


def read_kernel_times(path):
    """the LLMC_KERNEL_TIMES=1 table of a trainer's output (llmc/kernel_times.h): {kind: (calls, ms)}
    per step, the time outside the launchers, and the step's time"""
    kinds, outside, step, inside = {}, None, None, False
    row = re.compile(r"^  (.+?)\s+([0-9.]+)?\s+([0-9.]+)\s+-?[0-9.]+%$")
    with open(path) as f:
        for line in f:
            if line.startswith("kernel times on rank"):
                kinds, inside = {}, True  # (the last table in the file, if there are several)
                continue
            m = row.match(line.rstrip("\n")) if inside else None
            if m is None:
                inside = inside and line.startswith("  ")
                continue
            name, calls, ms = m.group(1), m.group(2), float(m.group(3))
            if name.startswith("outside the launchers"):
                outside = ms
            elif name == "step":
                step = ms
            elif calls is not None:
                kinds[name] = (float(calls), ms)
    if step is None:
        raise ValueError("%s: no LLMC_KERNEL_TIMES=1 table (run the trainer with LLMC_KERNEL_TIMES=1 and keep its output)"
                         % path)
    return kinds, outside, step


def print_measured(res, path):
    """the measured table beside the predicted rows (llmc/step_time.h's prices) for the same kinds of
    launch: where the step's time above its prediction goes, the largest gap first"""
    kinds, outside, step = read_kernel_times(path)
    predicted = {}
    for r in res["rows"]:
        if r["launch"] is not None:
            predicted[r["launch"]] = predicted.get(r["launch"], 0.0) + r["total_time_s"] * 1e3
    c, s = res["config"], res["summary"]
    print("measured (%s, LLMC_KERNEL_TIMES=1) beside the prediction of %s B=%d T=%d %s %s attention on %s "
          "(profile %s); per step, largest gap first" % (path, c["model"], c["B"], c["T"], c["precision"], c["attention"],
                                                         res["assumptions"]["device_name"], res["assumptions"]["profile"]))
    w = 44
    header = "%-*s %7s %11s %11s %9s %9s %7s" % (w, "kind of launch", "calls", "measured ms", "predicted",
                                                  "measured/", "gap ms", "share")
    print(header)
    print("%-*s %7s %11s %11s %9s %9s %7s" % (w, "", "", "", "ms", "predicted", "", "of step"))
    print("-" * len(header))
    rows = [(name, calls, ms, predicted.get(name)) for name, (calls, ms) in kinds.items()]
    rows += [(name, None, 0.0, ms) for name, ms in predicted.items() if name not in kinds]
    rows.append(("outside the launchers (host, waits, gaps)", None, outside or 0.0, 0.0))
    rows.sort(key=lambda r: -(r[2] - (r[3] or 0.0)))
    for name, calls, ms, pred in rows:
        print("%-*s %7s %11.3f %11s %9s %9.3f %6.1f%%" % (
            w, name, "%.0f" % calls if calls is not None else "", ms, "%.3f" % pred if pred is not None else "-",
            "%.2f" % (ms / pred) if pred else "-", ms - (pred or 0.0), 100.0 * ms / step))
    print("-" * len(header))
    print("%-*s %7s %11.3f %11.3f %9.2f %9.3f" % (w, "step", "", step, s["step_time_s"] * 1e3,
                                                  step / (s["step_time_s"] * 1e3), step - s["step_time_s"] * 1e3))
    print("(a kind the model has no row for shows '-': it is not in train_gpt2_dp's step as modelled; a row "
          "measured 0 was not launched)")


def main(argv=None):
    p = argparse.ArgumentParser(prog="roofline.py", allow_abbrev=False,
                                description="roofline model of one train_gpt2_dp training step on a GPU")
    p.add_argument("-e", default="d12", help="model: d12, d24, d36, d48, dL, or L/C/NH such as 12/768/12")
    p.add_argument("-b", type=int, default=64, help="micro-batch size B per rank")
    p.add_argument("-t", type=int, default=1024, help="sequence length T (at most maxT = 1024)")
    p.add_argument("-precision", choices=("bf16", "fp32"), default="bf16")
    p.add_argument("-attention", choices=("auto", "flash", "cublas"), default="auto",
                   help="auto: flash in bf16 with head size 16/32/64, else cublas (as the trainer)")
    p.add_argument("-device", choices=sorted(DEVICES) + ["auto"], default="h100-sxm",
                   help="the datasheet peaks printed (ridge point, MFU); auto: the GPU nvidia-smi names")
    p.add_argument("-profile", metavar="NAME|FILE", default=None,
                   help="the device profile llmc/step_time.h prices the rows on: h100-sxm, h200, a100-80gb or a "
                   "profile file (default: the built-in of -device)")
    p.add_argument("-dp", type=int, default=1, help="data-parallel ranks: adds the gradient all-reduce")
    p.add_argument("-cp", type=int, default=1, help="context-parallel ranks (train_gpt2_cp, zigzag): T/cp tokens a rank, "
                   "its share of attention, the ring's K,V and the gradients' all-reduce")
    p.add_argument("-experts", type=int, default=0, help="Mixture-of-Experts (train_gpt2_ep): E experts a layer (0: dense)")
    p.add_argument("-topk", type=int, default=2, help="with -experts: the experts a token takes")
    p.add_argument("-ep", type=int, default=1, help="with -experts: the ranks the experts are split over (of -dp)")
    p.add_argument("-epilogue", type=int, choices=(0, 1), default=1,
                   help="1: bias gradients from the weight-gradient GEMMs' BGRADB epilogue; 0: separate kernels")
    p.add_argument("-gelu", choices=("epilogue", "kernels"), default=None,
                   help="GELU in the fc GEMMs' epilogues (the trainer's default in bf16; LLMC_GELU=epilogue in fp32), "
                   "or in its own kernels (the default in fp32; LLMC_GELU=kernels in bf16) [as the trainer]")
    p.add_argument("-ln_backward", choices=("fused", "separate"), default="fused",
                   help="the LayerNorm backward's input and parameter gradients in one kernel (the trainer's "
                   "default), or in separate kernels (as the trainer with LLMC_LAYERNORM_BACKWARD=separate)")
    p.add_argument("-json", action="store_true", help="print everything as JSON")
    p.add_argument("-brief", action="store_true", help="print one line: the predicted step (for bench_gpu.sh)")
    p.add_argument("-measured", metavar="LOG", help="a trainer's output with its LLMC_KERNEL_TIMES=1 table (run at the "
                   "same -e, -b, -t and precision): print each kind of launch, measured, beside its roofline")
    args = p.parse_args(argv)
    if args.gelu is None:  # the trainer's default for the precision (llmc/cuda/gelu.cuh)
        args.gelu = "epilogue" if args.precision == "bf16" else "kernels"
    if args.b < 1 or args.dp < 1:
        p.error("-b and -dp must be at least 1")
    try:
        if args.device == "auto":
            args.device = this_gpu()
        if args.profile is None:
            args.profile = DEVICES[args.device]["profile"]
        if args.profile is None:
            raise ValueError("-device %s: no built-in profile prices it; give -profile FILE (llmc/device_profile.h's "
                             "format)" % args.device)
        res = roofline(args)
    except ValueError as e:
        p.error(str(e))
    if args.json:
        json.dump(res, sys.stdout, indent=1)
        print()
    elif args.measured:
        try:
            print_measured(res, args.measured)
        except (OSError, ValueError) as e:
            p.error(str(e))
    elif args.brief:
        s, a = res["summary"], res["assumptions"]
        print("roofline: %.1f ms predicted (the kernels, llmc/step_time.h on profile %s), %.0f tokens/s, MFU %.1f%% "
              "on %s" % (s["step_time_s"] * 1e3, a["profile"], s["tokens_per_s"], 100 * s["mfu"], a["device_name"]))
    else:
        print_table(res)


if __name__ == "__main__":
    main()
