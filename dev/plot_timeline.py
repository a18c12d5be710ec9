"""
Draws a pipeline timeline, as train_gpt2_pp writes it with -timeline N -o DIR, as a PNG: one row
per stage, one box per action (F forward, B backward; a chunk letter with interleaving), idle
time left white.

    /usr/bin/python3 dev/plot_timeline.py DIR/timeline.jsonl [--step N] [--out timeline.png]

Needs matplotlib (apt-get install python3-matplotlib). Without --step it draws the last step.
"""
import argparse
import json

COLORS = {"F": "#4c8bd6", "B": "#e07b39", "W": "#5aa55a"}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("timeline", help="timeline.jsonl from train_gpt2_pp -timeline N -o DIR")
    parser.add_argument("--step", type=int, default=None, help="the step to draw (default: the last one)")
    parser.add_argument("--out", default="timeline.png", help="the PNG to write")
    args = parser.parse_args()
    with open(args.timeline) as f:
        records = [json.loads(line) for line in f if line.strip()]
    if not records:
        raise SystemExit("%s holds no actions" % args.timeline)
    step = args.step if args.step is not None else max(r["step"] for r in records)
    records = [r for r in records if r["step"] == step]
    if not records:
        raise SystemExit("%s has no step %d" % (args.timeline, step))
    import matplotlib
    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt
    stages = max(r["stage"] for r in records) + 1
    chunks = max(r["chunk"] for r in records) + 1
    fig, ax = plt.subplots(figsize=(12, 0.6 * stages + 1.2))
    for r in records:
        y = stages - 1 - r["stage"]  # stage 0 on top, as the text chart prints it
        width = r["end_ms"] - r["start_ms"]
        ax.barh(y, width, left=r["start_ms"], height=0.8, color=COLORS[r["op"]], edgecolor="black", linewidth=0.5,
                alpha=1.0 if r["chunk"] == 0 else 0.6)
        label = "%s%d%s" % (r["op"], r["micro"], chr(ord("a") + r["chunk"]) if chunks > 1 else "")
        ax.text(r["start_ms"] + width / 2, y, label, ha="center", va="center", fontsize=7)
    end = max(r["end_ms"] for r in records)
    for s in range(stages):
        busy = sum(r["end_ms"] - r["start_ms"] for r in records if r["stage"] == s)
        ax.text(end * 1.01, stages - 1 - s, "busy %.0f%%" % (100 * busy / end), va="center", fontsize=8)
    ax.set_yticks(range(stages))
    ax.set_yticklabels(["stage %d" % s for s in reversed(range(stages))])
    ax.set_xlabel("ms from the start of step %d" % step)
    ax.set_xlim(0, end * 1.1)
    ax.set_title("pipeline timeline, step %d (F forward, B backward)" % step)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print("wrote %s (%d actions, %d stages)" % (args.out, len(records), stages))


if __name__ == "__main__":
    main()
