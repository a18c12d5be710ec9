"""
Draws a pipeline timeline, as train_gpt2_pp (or train_gpt2_3d) writes it with -timeline N -o DIR,
as a PNG: one row per stage, one box per action, idle time left white. F is a forward, B a
backward (with zb, zbv and dualpipev only the input gradient: the stage before waits for it), W a
weight gradient (nobody waits for it). With more than one chunk a stage (interleaved, and the V of
zbv and dualpipev) each label ends in the chunk's letter, a, b, ..., as the text chart prints it,
and the chunks after the first are drawn lighter and hatched: in the V, chunk a is the way down
and chunk b the way back up.

    /usr/bin/python3 dev/plot_timeline.py DIR/timeline.jsonl [--step N] [--title TEXT] [--out timeline.png]

Needs matplotlib (apt-get install python3-matplotlib). Without --step it draws the last step.
The trainer appends to timeline.jsonl, so a second run into the same -o adds its steps after the
first's: a step that appears more than once is drawn from the run that wrote it last.
"""
import argparse
import json

COLORS = {"F": "#4c8bd6", "B": "#e07b39", "W": "#5aa55a"}
NAMES = {"F": "F forward", "B": "B backward (input gradient when W is apart)", "W": "W weight gradient"}


def last_run_of_step(records, step):
    """the records of one step, from the last run that wrote it: a run writes a step's actions
    together, each (stage, op, micro, chunk) once, so a repeated one, or the step again after
    others, starts another run's"""
    blocks, seen, in_step = [], set(), False
    for r in records:
        if r["step"] != step:
            in_step = False
            continue
        key = (r["stage"], r["op"], r["micro"], r["chunk"])
        if not in_step or key in seen:
            blocks.append([])
            seen = set()
        seen.add(key)
        blocks[-1].append(r)
        in_step = True
    return blocks[-1] if blocks else []


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("timeline", help="timeline.jsonl from train_gpt2_pp -timeline N -o DIR")
    parser.add_argument("--step", type=int, default=None, help="the step to draw (default: the last one)")
    parser.add_argument("--title", default=None, help="the figure's title (default: 'pipeline timeline, step N')")
    parser.add_argument("--out", default="timeline.png", help="the PNG to write")
    args = parser.parse_args()
    with open(args.timeline) as f:
        records = [json.loads(line) for line in f if line.strip()]
    if not records:
        raise SystemExit("%s holds no actions" % args.timeline)
    unknown = sorted({r["op"] for r in records} - set(COLORS))
    if unknown:
        raise SystemExit("%s: op %s is none of F, B, W" % (args.timeline, ", ".join(unknown)))
    step = args.step if args.step is not None else max(r["step"] for r in records)
    records = last_run_of_step(records, step)
    if not records:
        raise SystemExit("%s has no step %d" % (args.timeline, step))
    import matplotlib
    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    stages = max(r["stage"] for r in records) + 1
    chunks = max(r["chunk"] for r in records) + 1
    end = max(r["end_ms"] for r in records)
    fig, ax = plt.subplots(figsize=(12, 0.6 * stages + 1.6))
    for r in records:
        y = stages - 1 - r["stage"]  # stage 0 on top, as the text chart prints it
        width = r["end_ms"] - r["start_ms"]
        later_chunk = r["chunk"] > 0
        ax.barh(y, width, left=r["start_ms"], height=0.8, color=COLORS[r["op"]], edgecolor="black", linewidth=0.5,
                alpha=0.55 if later_chunk else 1.0, hatch="///" if later_chunk else None)
        label = "%s%d%s" % (r["op"], r["micro"], chr(ord("a") + r["chunk"]) if chunks > 1 else "")
        if width > end / 90:  # a label only where it fits inside its box
            ax.text(r["start_ms"] + width / 2, y, label, ha="center", va="center", fontsize=6)
    for s in range(stages):
        busy = sum(r["end_ms"] - r["start_ms"] for r in records if r["stage"] == s)
        ax.text(end * 1.01, stages - 1 - s, "busy %.0f%%" % (100 * busy / end), va="center", fontsize=8)
    ax.set_yticks(range(stages))
    ax.set_yticklabels(["stage %d" % s for s in reversed(range(stages))])
    ax.set_xlabel("ms from the start of step %d" % step)
    ax.set_xlim(0, end * 1.1)
    ax.set_title(args.title or "pipeline timeline, step %d" % step)
    ops = [op for op in "FBW" if any(r["op"] == op for r in records)]
    handles = [Patch(facecolor=COLORS[op], edgecolor="black", label=NAMES[op]) for op in ops]
    if chunks > 1:
        handles.append(Patch(facecolor="white", edgecolor="black", hatch="///", label="chunks b, c, ... (the V: b, the way up)"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.2 if stages > 2 else -0.35), ncol=len(handles),
              fontsize=7, frameon=False)
    fig.tight_layout()
    fig.savefig(args.out, dpi=100)
    print("wrote %s (%d actions, %d stages, %d chunks a stage)" % (args.out, len(records), stages, chunks))


if __name__ == "__main__":
    main()
