#!/usr/bin/python3
"""
DiLoCo against DDP (dev/diloco_vs_ddp.sh): each run's validation loss against the step and
against the bytes it sent over the link between datacenters, on one PNG, and the table of
dev/bench/README.md: the validation loss at equal tokens (the last step), the bytes, and DDP's validation
loss once it had sent as many bytes as each DiLoCo run did in all.

The link's bytes come from each run's main.log (its counters, per group and kind of call) as
what a rank sends on a ring: an all-reduce 2 (n-1)/n of its payload, a reduce-scatter or an
all-gather (n-1)/n of the whole buffer, a send all of it; the group "worker" (DDP inside a
datacenter) does not cross the link, every other group does. n is the group's rank count
(--link-ranks: the datacenters, W).

    /usr/bin/python3 dev/plot_diloco.py [-o out/diloco_vs_ddp/diloco_vs_ddp.png] --link-ranks 4 LABEL=RUN_DIR ...

The PNG goes under the repository's out/ by default, and never into the repository's root (as
dev/plot_runs.py's -o); dev/diloco_vs_ddp.sh names dev/bench/README.md's figure when it redraws it.
"""
import argparse
import os

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
from plot_runs import output_path, read_records  # noqa: E402  (the same main.log reader and -o rule)


def read_run(run_dir, n):
    """{step: val loss}, {step: bytes sent on the link by the end of that step}"""
    share = {"all_reduce": 2.0 * (n - 1) / n, "reduce_scatter": (n - 1.0) / n, "all_gather": (n - 1.0) / n, "send": 1.0}
    val, sent, total = {}, {0: 0.0}, 0.0
    for rec in read_records(run_dir):
        if "val_loss" in rec:
            val[rec["step"]] = rec["val_loss"]
        elif "train_loss" in rec:
            for group, kinds in rec["comm"].items():
                if group != "worker":
                    total += sum(share.get(kind, 0.0) * b for kind, b in kinds.items())
            sent[rec["step"]] = total
    return val, sent


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="LABEL=DIR (the last = splits them); the first is the baseline (DDP)")
    ap.add_argument("-o", "--out", help="the PNG to write (default out/diloco_vs_ddp/diloco_vs_ddp.png)")
    ap.add_argument("--link-ranks", type=int, required=True, help="ranks of a group that crosses the link (W)")
    ap.add_argument("--title", default="DiLoCo against DDP")
    args = ap.parse_args()
    out = output_path(args.out, os.path.join("diloco_vs_ddp", "diloco_vs_ddp.png"))

    runs = []
    for run in args.runs:
        label, run_dir = run.rsplit("=", 1)  # (a label may hold "=", a directory does not)
        val, sent = read_run(run_dir, args.link_ranks)
        runs.append((label, val, sent))
    fig, (by_step, by_bytes) = plt.subplots(1, 2, figsize=(12, 4.5))
    for label, val, sent in runs:
        steps = sorted(val)
        by_step.plot(steps, [val[s] for s in steps], marker=".", label=label)
        by_bytes.plot([max(sent[s], 1e5) for s in steps], [val[s] for s in steps], marker=".", label=label)
    by_step.set_xlabel("step (every run sees the same tokens)")
    by_bytes.set_xlabel("bytes sent on the link per rank (log scale; less than 1e5 drawn at 1e5)")
    by_bytes.set_xscale("log")
    for ax in (by_step, by_bytes):
        ax.set_ylabel("validation loss")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(args.title)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print("wrote %s" % os.path.relpath(out))

    # the table: equal tokens (the last validation) and equal bytes (DDP when it had sent as much)
    base_label, base_val, base_sent = runs[0]
    last = max(base_val)
    print("| run | val loss at step %d | bytes sent on the link | %s's bytes / these | most in one step | %s's val loss "
          "at these bytes |" % (last, base_label, base_label))
    print("| --- | --- | --- | --- | --- | --- |")
    for label, val, sent in runs:
        steps = sorted(sent)
        total = sent[steps[-1]]
        # the burst the link must carry: the most a step sends, the last step's (every fragment) aside
        peak = max(sent[b] - sent[a] for a, b in zip(steps[:-2], steps[1:-1]))
        ratio = "%.1fx" % (base_sent[max(base_sent)] / total) if total > 0 else "-"
        reached = [s for s in sorted(base_val) if base_sent.get(s, 0.0) <= total]
        at_bytes = "%.3f (step %d)" % (base_val[reached[-1]], reached[-1]) if reached else "-"
        print("| %s | %.3f | %.3g | %s | %.3g | %s |" % (label, val.get(last, float("nan")), total, ratio, peak, at_bytes))


if __name__ == "__main__":
    main()
