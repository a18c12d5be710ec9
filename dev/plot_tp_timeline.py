"""
Draws one layer of tensor parallelism as train_gpt2_tp records it with -tp_timeline S -o DIR (the
layer 0 of step S on each rank: every GEMM block and every exchange or collective, from its post
to its completion, host-timed on the CPU backend), as a PNG: for each run given, its forward and
its backward side by side, a row of GEMMs over a row of communication, so that the exchanges of
-tp_overlap 1 show under the GEMMs they hide behind, and the collectives of -tp_overlap 0 after
the GEMMs that wait for them.

    /usr/bin/python3 dev/plot_tp_timeline.py "overlap 0=DIR0" "overlap 1=DIR1" [--rank 0] [-o out/tp_timeline.png]

Needs matplotlib (apt-get install python3-matplotlib).
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from plot_runs import output_path  # noqa: E402  (the -o rule of the other plot scripts)

GEMM_COLOR, COMM_COLOR = "#4c8bd6", "#e07b39"


def read_spans(run_dir, rank):
    path = os.path.join(run_dir, "tp_timeline_%d.jsonl" % rank)
    if not os.path.exists(path):
        sys.exit("error: no %s (train_gpt2_tp -tp_timeline S -o %s writes it)" % (path, run_dir))
    with open(path) as f:
        spans = [json.loads(line) for line in f if line.strip()]
    if not spans:
        sys.exit("error: %s holds no spans" % path)
    return spans


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="LABEL=DIR: a run's -o directory and its label")
    parser.add_argument("--rank", type=int, default=0, help="the tensor-parallel rank whose timeline to draw")
    parser.add_argument("-o", "--out", default=None, help="the PNG (default out/tp_timeline.png)")
    args = parser.parse_args()
    runs = []
    for run in args.runs:
        if "=" not in run:
            sys.exit("error: '%s': expected LABEL=DIR" % run)
        label, run_dir = run.split("=", 1)
        runs.append((label, read_spans(run_dir, args.rank)))
    import matplotlib
    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(runs), 2, figsize=(13, 1.6 * len(runs) + 1.0), squeeze=False)
    for phase, name in ((0, "forward"), (1, "backward")):  # one time axis per phase, shared by the runs
        end = max(s["end_ms"] for _, spans in runs for s in spans if s["backward"] == phase)
        for row, (label, spans) in enumerate(runs):
            ax = axes[row][phase]
            mine = [s for s in spans if s["backward"] == phase]
            for s in mine:
                y = 0 if s["comm"] else 1
                width = s["end_ms"] - s["start_ms"]
                ax.barh(y, width, left=s["start_ms"], height=0.7, color=COMM_COLOR if s["comm"] else GEMM_COLOR,
                        edgecolor="black", linewidth=0.5)
                if width > 0.04 * end:
                    ax.text(s["start_ms"] + width / 2, y, s["what"], ha="center", va="center", fontsize=6.5)
            layer = max(s["end_ms"] for s in mine)
            ax.set_yticks([0, 1])
            ax.set_yticklabels(["comm", "GEMMs"])
            ax.set_xlim(0, end * 1.02)
            ax.set_title("%s: layer 0 %s, %.1f ms" % (label, name, layer), fontsize=9)
            if row == len(runs) - 1:
                ax.set_xlabel("ms from the start of the layer's %s" % name)
    fig.tight_layout()
    out = output_path(args.out, "tp_timeline.png")
    fig.savefig(out, dpi=120)
    print("wrote %s (%d runs, rank %d)" % (out, len(runs), args.rank))


if __name__ == "__main__":
    main()
