#!/usr/bin/python3
"""
Mixture-of-Experts against the dense model (dev/moe_experiment.sh): each run's validation loss
against the step, and each MoE run's MaxVio (the most loaded expert's slots over the mean, less
1; the largest over the layers) against the step, on one PNG; then dev/bench/README.md's table: the last
validation loss, the parameters held and those a token uses (active), and MaxVio at the end.

Runs are LABEL=RUN_DIR; an MoE run's main.log step records carry its balance figures ("moe"),
which tell it from a dense run. The parameter counts are computed from the shape given here
(--layers, --channels, --experts, --topk; GPT-2's vocabulary and 1024 positions).

    /usr/bin/python3 dev/plot_moe.py [-o out/moe/moe.png] LABEL=RUN_DIR ...

The PNG goes under the repository's out/ by default, and never into the repository's root (as
dev/plot_runs.py's -o).
"""
import argparse
import os

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
from plot_runs import output_path, read_records  # noqa: E402  (the same main.log reader and -o rule)


def read_run(run_dir):
    """{step: val loss}, {step: MaxVio} (empty for a dense run)"""
    val, vio = {}, {}
    for rec in read_records(run_dir):
        if "val_loss" in rec:
            val[rec["step"]] = rec["val_loss"]
        elif "moe" in rec:
            vio[rec["step"]] = rec["moe"]["max_vio"]
    return val, vio


def parameters(L, C, V, maxT, E, k):
    """(held, active a token) of a GPT-2 with E experts of which a token uses k (E = 0: dense)"""
    Vp = (V + 127) // 128 * 128
    shared = (Vp + maxT) * C + L * (4 * C * C + 8 * C) + 2 * C
    mlp = 8 * C * C + 5 * C
    if E == 0:
        return shared + L * mlp, shared + L * mlp
    return shared + L * (E * C + E * mlp), shared + L * (E * C + k * mlp)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-o", help="the PNG (default out/moe/moe.png)")
    ap.add_argument("--title", default="")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--channels", type=int, default=256)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--topk", type=int, default=2)
    ap.add_argument("runs", nargs="+", help="LABEL=RUN_DIR")
    args = ap.parse_args()
    fig, (loss_ax, vio_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
    rows, lows, highs = [], [], []
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, spec in enumerate(args.runs):
        label, run_dir = spec.rsplit("=", 1)  # (a label may hold "=": E=8)
        val, vio = read_run(run_dir)
        steps = sorted(val)
        color = colors[i % len(colors)]  # (a run's color the same in both panels)
        loss_ax.plot(steps, [val[s] for s in steps], label=label, color=color)
        later = [val[s] for s in steps if s >= steps[-1] // 5]  # (the first fifth falls from 10.9: off the scale)
        lows.append(min(later))
        highs.append(max(later))
        E = args.experts if vio else 0
        held, active = parameters(args.layers, args.channels, 50257, 1024, E, args.topk)
        if vio:
            vsteps = sorted(vio)
            vio_ax.plot(vsteps, [vio[s] for s in vsteps], label=label, color=color, linewidth=0.8)
        rows.append((label, val[steps[-1]], steps[-1], held, active, vio[max(vio)] if vio else None))
    margin = 0.05 * (max(highs) - min(lows))
    loss_ax.set_ylim(min(lows) - margin, max(highs) + margin)
    loss_ax.set_xlabel("step (512 tokens each)")
    loss_ax.set_ylabel("validation loss")
    loss_ax.set_title("validation loss")
    loss_ax.legend()
    vio_ax.set_xlabel("step")
    vio_ax.set_ylabel("MaxVio = max load / mean load - 1")
    vio_ax.set_ylim(0, args.experts / args.topk - 1 + 0.2)
    vio_ax.set_title("balance (E/k - 1 = %g: every token to the same k experts)" % (args.experts / args.topk - 1))
    vio_ax.legend()
    if args.title:
        fig.suptitle(args.title)
    fig.tight_layout()
    out = output_path(args.o, "moe/moe.png")
    fig.savefig(out, dpi=110)
    print("wrote %s" % out)
    print("| run | val loss (step) | parameters | active a token | MaxVio at the end |")
    print("| --- | --- | --- | --- | --- |")
    for label, loss, step, held, active, vio in rows:
        print("| %s | %.3f (%d) | %.1fM | %.1fM | %s |" % (label, loss, step, held / 1e6, active / 1e6,
                                                          "-" if vio is None else "%.2f" % vio))


if __name__ == "__main__":
    main()
