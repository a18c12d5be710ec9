#!/usr/bin/python3
"""
The loss curves of several runs on one PNG: each run's main.log (train loss per step, and the
validation loss where it was measured) and, with --reference, the PyTorch reference's losses
(reference.json of test/reference.py or dev/compare_with_pytorch.py). With a reference a second
panel shows each run's distance from it, |loss - reference loss| on a log scale: curves that lie
on top of each other in the first panel are told apart there.

    /usr/bin/python3 dev/plot_runs.py [-o out/losses.png] [--reference DIR] [LABEL=]RUN_DIR ...

The PNG goes under the repository's out/ (ignored by git): out/plots/losses.png by default, and a
-o that names a file directly in the repository's root is put into out/ instead (the root holds
the sources, the trainers and nothing else). With --reference it prints the range the lower
panel spans.
"""
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def output_path(out, default):
    """where a plot script writes: `default` (relative to the repository's out/) when -o is not
    given; a path directly in the repository's root moves into out/; the directory is made"""
    path = os.path.abspath(out) if out else os.path.join(ROOT, "out", default)
    if os.path.dirname(path) == ROOT:
        moved = os.path.join(ROOT, "out", os.path.basename(path))
        print("%s is in the repository's root; writing %s instead" % (out, os.path.relpath(moved)))
        path = moved
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return path


def read_records(run_dir):
    """the JSON records of a run's main.log, one a line (train steps, validations), in order"""
    path = os.path.join(run_dir, "main.log")
    if not os.path.exists(path):
        sys.exit("error: no main.log in %s (a trainer writes it into its -o dir)" % run_dir)
    with open(path) as f:
        return [json.loads(line) for line in f]


def read_log(run_dir):
    """{step: train loss}, {step: val loss} of a run's main.log"""
    train, val = {}, {}
    for rec in read_records(run_dir):
        if "train_loss" in rec:
            train[rec["step"]] = rec["train_loss"]
        elif "val_loss" in rec:
            val[rec["step"]] = rec["val_loss"]
    return train, val


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="run directories, each optionally LABEL=DIR")
    ap.add_argument("-o", "--out", help="the PNG to write (default out/plots/losses.png; never the repository's root)")
    ap.add_argument("--reference", help="a reference run's directory (reference.json)")
    ap.add_argument("--title", default="train loss per step")
    args = ap.parse_args()
    out = output_path(args.out, os.path.join("plots", "losses.png"))

    ref = None
    if args.reference:
        with open(os.path.join(args.reference, "reference.json")) as f:
            ref = {s + 1: loss for s, loss in enumerate(json.load(f)["losses"])}
    panels = 2 if ref else 1
    fig, axes = plt.subplots(panels, 1, figsize=(8, 4 + 3 * (panels - 1)), squeeze=False)
    curves, distance = axes[0][0], axes[-1][0]
    if ref:
        steps = sorted(ref)
        curves.plot(steps, [ref[s] for s in steps], color="black", linewidth=4, alpha=0.25, label="PyTorch reference")
    markers = "os^vD<>p"
    FLOOR = 1e-7  # an exact match has no place on a log scale: distances below are drawn at 1e-7
    distances = []
    for i, run in enumerate(args.runs):
        label, run_dir = run.split("=", 1) if "=" in run else (os.path.basename(os.path.normpath(run)), run)
        train, val = read_log(run_dir)
        steps = sorted(train)
        marker = markers[i % len(markers)]
        curves.plot(steps, [train[s] for s in steps], marker=marker, markersize=4, linewidth=1, label=label)
        if val:
            curves.plot(sorted(val), [val[s] for s in sorted(val)], marker=marker, linestyle=":", label=label + " (val)")
        if ref:
            common = [s for s in steps if s in ref]
            distances += [abs(train[s] - ref[s]) for s in common]
            distance.plot(common, [max(abs(train[s] - ref[s]), FLOOR) for s in common], marker=marker, markersize=4,
                          linewidth=1, label=label)
    curves.set_title(args.title)
    curves.set_xlabel("step")
    curves.set_ylabel("loss")
    curves.legend()
    curves.grid(alpha=0.3)
    if ref:
        distance.set_yscale("log")
        distance.set_xlabel("step")
        distance.set_ylabel("|loss - PyTorch loss|\n(below 1e-7 drawn at 1e-7)")
        distance.set_title("distance from the reference (fp32 rounding against float64)")
        distance.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    print("wrote %s" % os.path.relpath(out))
    if distances:
        print("lower panel: |loss - PyTorch loss| from %.2g to %.2g (%d of %d steps at or below the 1e-7 floor)"
              % (min(distances), max(distances), sum(d <= FLOOR for d in distances), len(distances)))


if __name__ == "__main__":
    main()
