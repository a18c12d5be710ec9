"""
When does each axis pay? The step-time model's answer for GPT-2-shaped models on H100s: for each
case below, dev/memory_planner -search N -rank time lists every layout that fits in 80 GB with its
predicted step (llmc/step_time.h on the built-in h100-sxm profile, 8 GPUs a node), and this script
prints the fastest, then for each axis (tp, pp, cp, ep and ZeRO) the fastest layout with it and the
fastest without it. An axis pays in a case when the fastest layout that uses it beats every layout
that does not; the ratio says by how much. Nothing is modelled here: every number is the planner's.

    /usr/bin/python3 dev/bench/rules_of_thumb.py [--format text|json]

The cases keep GPT-2's shape (heads of 64, an MLP of 4C, learned positions, tied embeddings) and
grow it: GPT-2 XL (d48, 1.56B) on one node, a 13B model on 8 nodes, GPT-3 175B's width and depth
on 128 nodes, d48 at a 32k context, and a d24-shaped Mixture-of-Experts (64 experts, top-2) on 8
nodes. Each case fixes the micro-batch (the search varies the grid, ZeRO, -sp, -r and -offload, and
with experts -ep, not -b), and the total batch, in tokens, is a power of two near what such runs use.
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLANNER = os.path.join(ROOT, "dev", "memory_planner")

# (name, GPUs, the planner's flags for the model and the batch)
CASES = [
    ("GPT-2 XL (d48, 1.6B), T 1024, 2^19 tokens", 8, ["-e", "d48", "-b", "4", "-t", "1024", "-d", str(2 ** 19)]),
    ("13B (40/5120/80), T 2048, 2^21 tokens", 64, ["-e", "40/5120/80/2048", "-b", "1", "-t", "2048", "-d", str(2 ** 21)]),
    ("175B (96/12288/192), T 2048, 2^22 tokens", 1024,
     ["-e", "96/12288/192/2048", "-b", "1", "-t", "2048", "-d", str(2 ** 22)]),
    ("d48 at a 32k context, 2^21 tokens", 64, ["-e", "48/1600/25/32768", "-b", "1", "-t", "32768", "-d", str(2 ** 21)]),
    ("MoE d24, 64 experts top-2 (13B), T 1024, 2^20 tokens", 64,
     ["-e", "d24", "-experts", "64", "-topk", "2", "-b", "8", "-t", "1024", "-d", str(2 ** 20)]),
]

# an axis: its name, and whether a layout of the search uses it
AXES = [("tp", lambda l: l["tp"] > 1), ("pp", lambda l: l["pp"] > 1), ("cp", lambda l: l["cp"] > 1),
        ("ep", lambda l: l["ep"] > 1), ("ZeRO", lambda l: l["z"] > 0)]


def search(gpus, flags):
    cmd = [PLANNER, "-device", "cuda", "-profile", "h100-sxm", "-gpus_per_node", "8", "-mem", "80"] + flags + [
        "-search", str(gpus), "-rank", "time", "-format", "json"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit("error: %s failed (exit %d): %s" % (" ".join(cmd), p.returncode, (p.stdout + p.stderr)[-1000:]))
    return json.loads(p.stdout), cmd


def case_result(name, gpus, flags):
    plan, cmd = search(gpus, flags)
    layouts = plan["layouts"]  # (the fastest first)
    result = {"case": name, "gpus": gpus, "command": " ".join(cmd[:-2] + ["-format", "text"]), "fit": len(layouts),
              "possible": plan["possible"], "best": layouts[0] if layouts else None, "axes": {}}
    for axis, uses in AXES:
        with_it = [l for l in layouts if uses(l)]
        without = [l for l in layouts if not uses(l)]
        result["axes"][axis] = {"with": with_it[0] if with_it else None, "without": without[0] if without else None}
    return result


def layout_text(l):
    return l["layout"] + " (m=%d)" % l["m"] if l else "none fits"


def step_text(l):
    return "%8.1f ms" % (l["step_seconds"] * 1e3) if l else "%11s" % "-"


def verdict(axis, a):
    w, wo = a["with"], a["without"]
    if w is None:
        return "no layout with %s fits" % axis
    if wo is None:
        return "needed: no layout without %s fits" % axis
    ratio = wo["step_seconds"] / w["step_seconds"]
    return ("pays: %.2fx faster than the best without" % ratio if ratio > 1 else
            "does not pay: the best without is %.2fx faster" % (1 / ratio))


def print_case(r):
    best = r["best"]
    print("%s on %d H100s: %d of %d layouts fit" % (r["case"], r["gpus"], r["fit"], r["possible"]))
    print("  %s" % r["command"])
    if best is None:
        print("  none fits")
        return
    print("  fastest: %s  %s, %.0f tokens/s" % (step_text(best).strip(), layout_text(best), best["tokens_per_second"]))
    for axis, _ in AXES:
        a = r["axes"][axis]
        print("  %-5s %s" % (axis, verdict(axis, a)))
        print("        with:    %s  %s" % (step_text(a["with"]), layout_text(a["with"])))
        print("        without: %s  %s" % (step_text(a["without"]), layout_text(a["without"])))


def main():
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--format", choices=("text", "json"), default="text")
    a = ap.parse_args()
    if not os.access(PLANNER, os.X_OK):
        sys.exit("error: %s is not built: make BACKEND=cpu dev/memory_planner" % PLANNER)
    results = [case_result(*case) for case in CASES]
    if a.format == "json":
        print(json.dumps(results, indent=1))
        return
    for r in results:
        print_case(r)
        print()


if __name__ == "__main__":
    main()
