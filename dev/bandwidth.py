"""
How much of a step is compute, across datacenters: the compute utilization of data parallelism,
DiLoCo and streaming DiLoCo for a model size, a step's compute time and a link (bandwidth and
latency), printed as a table over bandwidths from 1 to 400 Gbit/s and drawn as a plot, so that a
learner sees where each pays. The formulas (README, DiLoCo chapter, "Which link for which
method"):

  a ring all-reduce of n values of b bits over W workers:
      t(n, b) = 2 (W - 1)/W n b / bandwidth  +  2 (W - 1) latency
  DDP: every step all-reduces the P gradients (b = 16, bf16), after the step (not overlapped):
      utilization = T / (T + t(P, 16))
  DiLoCo, H inner steps a round: one all-reduce of the P pseudo-gradient values (-outer_dtype bits),
  every worker waiting for it:
      utilization = H T / (H T + t(P, bits))
  streaming DiLoCo, F fragments taking turns, each exchange overlapping tau inner steps: every
  H/F steps one fragment of P/F values, of which only what tau steps do not cover is exposed:
      utilization = (H/F) T / ((H/F) T + max(0, t(P/F, bits) - tau T))

T is the compute time of a step on a worker; a worker's own DDP inside a datacenter is taken as
free; each fragment is taken as P/F values (in GPT-2 the first also carries the embeddings, so its
exchange is larger and the streaming row a little optimistic). The bandwidth each needs to stay
above a utilization u follows from the same lines.

    /usr/bin/python3 dev/bandwidth.py [-e d48 | -params N] [-step 1.0] [-workers 2] [-latency 0.01]
        [-H 100] [-fragments 4] [-tau 2] [-outer_dtype e3m0] [-o out/bandwidth.png]
"""
import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench"))
from plot_runs import output_path  # noqa: E402  (the -o rule of the other plot scripts)
from roofline import num_parameters, parse_model  # noqa: E402  (GPT-2's shapes, as the trainers build them)

BANDWIDTHS = [1, 2, 5, 10, 25, 50, 100, 200, 400]  # Gbit/s, the table's columns
BITS = {"fp32": 32, "bf16": 16, "int8": 8, "e3m0": 4}


def all_reduce_seconds(n, bits, workers, bandwidth_bits, latency):
    """a ring all-reduce of n values of `bits` bits over `workers` workers"""
    if workers <= 1:
        return 0.0
    share = 2.0 * (workers - 1) / workers
    return share * n * bits / bandwidth_bits + 2 * (workers - 1) * latency


def utilizations(P, step, workers, latency, H, fragments, tau, bits, gbits):
    """{method: utilization} at a bandwidth of gbits Gbit/s"""
    bw = gbits * 1e9
    ddp = step / (step + all_reduce_seconds(P, 16, workers, bw, latency))
    diloco = H * step / (H * step + all_reduce_seconds(P, bits, workers, bw, latency))
    every = H / fragments * step  # compute between two fragment exchanges
    exposed = max(0.0, all_reduce_seconds(P / fragments, bits, workers, bw, latency) - tau * step)
    streaming = every / (every + exposed)
    return {"DDP (bf16 gradients, every step)": ddp,
            "DiLoCo (H = %d, %d-bit)" % (H, bits): diloco,
            "streaming DiLoCo (H = %d, F = %d, tau = %d, %d-bit)" % (H, fragments, tau, bits): streaming}


def bandwidth_for(target, P, step, workers, latency, H, fragments, tau, bits, method):
    """the least bandwidth (Gbit/s) at which `method` reaches `target` utilization, by bisection
    on a log scale from 1 Mbit/s to 10 Tbit/s: 0.0 where even 1 Mbit/s does, None where 10 Tbit/s
    does not"""
    lo, hi = 1e-3, 1e4
    if list(utilizations(P, step, workers, latency, H, fragments, tau, bits, lo).values())[method] >= target:
        return 0.0
    if list(utilizations(P, step, workers, latency, H, fragments, tau, bits, hi).values())[method] < target:
        return None
    for _ in range(100):
        mid = math.sqrt(lo * hi)
        if list(utilizations(P, step, workers, latency, H, fragments, tau, bits, mid).values())[method] >= target:
            hi = mid
        else:
            lo = mid
    return hi


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-e", default="d48", help="GPT-2 descriptor dL or L/C/NH for the parameter count (d48: 1.56B)")
    ap.add_argument("-params", type=float, default=None, help="the parameter count instead of -e (e.g. 1e9)")
    ap.add_argument("-step", type=float, default=1.0, help="compute seconds of one step on a worker")
    ap.add_argument("-workers", type=int, default=2, help="workers (datacenters)")
    ap.add_argument("-latency", type=float, default=0.01, help="one-way latency of the link in seconds")
    ap.add_argument("-H", type=int, default=100, help="inner steps between outer steps")
    ap.add_argument("-fragments", type=int, default=4, help="streaming DiLoCo's fragments F")
    ap.add_argument("-tau", type=int, default=2, help="inner steps each fragment's exchange overlaps")
    ap.add_argument("-outer_dtype", default="e3m0", choices=sorted(BITS), help="the pseudo-gradient on the link")
    ap.add_argument("-o", default=None, help="the plot (default out/bandwidth.png)")
    args = ap.parse_args()
    if args.step <= 0:
        sys.exit("error: -step %g: expected a step's compute time in seconds, > 0" % args.step)
    if args.latency < 0:
        sys.exit("error: -latency %g: expected a value >= 0" % args.latency)
    if args.params is not None and args.params <= 0:
        sys.exit("error: -params %g: expected a positive parameter count" % args.params)
    for name in ("workers", "H", "fragments"):
        if getattr(args, name) < 1:
            sys.exit("error: -%s %d: expected a value >= 1" % (name, getattr(args, name)))
    if args.H % args.fragments:
        sys.exit("error: -fragments %d: the fragments take turns every H/F steps, so F must divide -H %d"
                 % (args.fragments, args.H))
    if args.tau < 0 or args.tau >= args.H // args.fragments:
        sys.exit("error: -tau %d: an exchange must land before the next fragment's is posted, H/F = %d steps later, "
                 "so tau < H/F" % (args.tau, args.H // args.fragments))
    if args.params is None:
        try:
            P = num_parameters(parse_model(args.e))
        except ValueError as e:
            sys.exit("error: %s" % e)
    else:
        P = args.params
    bits = BITS[args.outer_dtype]
    print("P = %.3g parameters, a step's compute %.3g s, %d workers, latency %.3g s" % (P, args.step, args.workers,
                                                                                        args.latency))
    rows = {}
    for g in BANDWIDTHS:
        for name, u in utilizations(P, args.step, args.workers, args.latency, args.H, args.fragments, args.tau, bits,
                                    g).items():
            rows.setdefault(name, []).append(u)
    width = max(len(n) for n in rows)
    print("compute utilization at each link bandwidth (Gbit/s):")
    print("  %-*s %s" % (width, "", " ".join("%6d" % g for g in BANDWIDTHS)))
    for name, us in rows.items():
        print("  %-*s %s" % (width, name, " ".join("%5.1f%%" % (100 * u) for u in us)))
    print("the least bandwidth for 90% utilization:")
    for i, name in enumerate(rows):
        need = bandwidth_for(0.9, P, args.step, args.workers, args.latency, args.H, args.fragments, args.tau, bits, i)
        text = ("none below 10 Tbit/s" if need is None else "any (1 Mbit/s suffices)" if need == 0.0 else
                "%.3g Gbit/s" % need)
        print("  %-*s %s" % (width, name, text))
    import matplotlib
    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt
    sweep = [10 ** (k / 20) for k in range(0, 53)]  # 1 to 400 Gbit/s
    fig, ax = plt.subplots(figsize=(8, 4.5))
    curves = {}
    for g in sweep:
        for name, u in utilizations(P, args.step, args.workers, args.latency, args.H, args.fragments, args.tau, bits,
                                    g).items():
            curves.setdefault(name, []).append(100 * u)
    for name, us in curves.items():
        ax.plot(sweep, us, label=name)
    ax.set_xscale("log")
    ax.set_xlabel("link bandwidth between workers (Gbit/s)")
    ax.set_ylabel("compute utilization (%)")
    ax.set_ylim(0, 101)
    ax.set_title("P = %.3g, step %.3g s, %d workers, latency %.3g s" % (P, args.step, args.workers, args.latency))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = output_path(args.o, "bandwidth.png")
    fig.savefig(out, dpi=120)
    print("wrote %s" % out)


if __name__ == "__main__":
    main()
