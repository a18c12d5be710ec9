#!/usr/bin/python3
"""
The Python side of dev/bench/sweep.sh: the statistics that say how well a model of step time
ranks and prices the layouts a sweep measured, the figure, and the small pieces of JSON and
main.log reading the shell script cannot do itself.

    /usr/bin/python3 dev/bench/sweep_stats.py self-test
    /usr/bin/python3 dev/bench/sweep_stats.py report RESULTS.tsv [--figure PNG --title TEXT]
    /usr/bin/python3 dev/bench/sweep_stats.py stats 'measured,...' 'predicted,...'   (seconds)

The statistics, over the n layouts that were both measured and predicted:

- Spearman's rank correlation: each side's times replaced by their ranks (1 = fastest), then
  Pearson's correlation of the two rank lists. Tied times share the mean of the ranks they span
  (two layouts tied for 2nd and 3rd place both get 2.5), so the statistic does not depend on the
  order the sweep listed them in. 1 means the model orders the layouts exactly as measured, -1
  exactly backwards. Undefined (nan) when either side has all its times equal: nothing to rank.
- the error of a layout: |predicted - measured| / measured, in percent; the median and the worst
  (largest) over the layouts. The median of an even count is the mean of the middle two.
- the measured rank of the predicted best: the layout the model predicts fastest, and where it
  placed among the measured, 1 + the number of layouts measured strictly faster (layouts measured
  equal share the better place). When several layouts tie for the fastest prediction, the one
  measured slowest counts: the model did not tell them apart, so it gets no credit for the luck
  of a tie.
- the measured best's lead: how much slower the predicted best ran than the fastest layout, in
  percent (0 when the model picked the winner); the issue's target is within 5%.

RESULTS.tsv is what sweep.sh writes (its -save): a header, then a row a layout with the columns
index, layout, measured_s (or "failed: why"), predicted_s (or "-"), warmup (the steps left out of
the median), steps_ms (every step's time, warm-up included, comma-separated), command.
"""
import json
import math
import os
import sys

# ---------------------------------------------------------------------------------------------
# the statistics


def ranks(values):
    """the rank of each value, 1 for the smallest; tied values get the mean of the ranks they span"""
    order = sorted(range(len(values)), key=lambda i: values[i])
    r = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        mean_rank = (i + j) / 2 + 1  # places i+1 .. j+1, shared
        for k in range(i, j + 1):
            r[order[k]] = mean_rank
        i = j + 1
    return r


def pearson(x, y):
    """Pearson's correlation of two equally long lists; nan when either has no spread"""
    n = len(x)
    mx, my = sum(x) / n, sum(y) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
    sxx = sum((a - mx) ** 2 for a in x)
    syy = sum((b - my) ** 2 for b in y)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else float("nan")


def spearman(measured, predicted):
    """Spearman's rank correlation with ties at their mean rank (Pearson's on the ranks)"""
    return pearson(ranks(measured), ranks(predicted)) if len(measured) >= 2 else float("nan")


def median(values):
    s = sorted(values)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def errors_percent(measured, predicted):
    return [abs(p - m) / m * 100 for m, p in zip(measured, predicted)]


def predicted_best(measured, predicted):
    """the index of the layout predicted fastest (of those tied for it, the one measured slowest)"""
    fastest = min(predicted)
    return max((i for i, p in enumerate(predicted) if p == fastest), key=lambda i: measured[i])


def measured_rank(measured, i):
    """layout i's place among the measured: 1 + how many ran strictly faster"""
    return 1 + sum(1 for m in measured if m < measured[i])


def sweep_stats(measured, predicted):
    """the summary's figures of paired lists of seconds (positive, the same layouts in order)"""
    if len(measured) != len(predicted) or not measured:
        raise ValueError("expected two equally long, non-empty lists of times")
    if min(measured) <= 0 or min(predicted) <= 0:
        raise ValueError("a time that is not positive: %s %s" % (measured, predicted))
    err = errors_percent(measured, predicted)
    best = predicted_best(measured, predicted)
    return {"n": len(measured), "spearman": spearman(measured, predicted), "median_error": median(err),
            "worst_error": max(err), "best": best, "best_rank": measured_rank(measured, best),
            "best_lead": (measured[best] / min(measured) - 1) * 100}


def summary_line(s):
    """the line sweep.sh ends with (its format is what tests and the README read)"""
    return "sweep: %d layouts, spearman %.3f, median error %.1f%%, worst error %.1f%%, predicted best ranks %d of %d measured" % (
        s["n"], s["spearman"], s["median_error"], s["worst_error"], s["best_rank"], s["n"])


# ---------------------------------------------------------------------------------------------
# sweep.sh's inputs: the planner's JSON, main.log, the sample


def planner_flags(layout):
    """a layout of the planner's -search JSON as the planner's flags for that one layout (its
    trainer from the label's first word, train_gpt2_X)"""
    trainer = layout["layout"].split()[0]
    if not trainer.startswith("train_gpt2_"):
        raise ValueError("a search layout whose label does not start with its trainer: %r" % layout["layout"])
    flags = ["-trainer", trainer[len("train_gpt2_"):]]
    for key in ("dp", "tp", "pp", "cp", "ep", "z", "sp", "r", "offload"):
        flags += ["-" + key, str(layout[key])]
    flags += ["-cp_comm", layout["cp_comm"]]
    return flags


def layouts(search_json_path):
    """each layout of the search as "planner flags<TAB>label", in the planner's order"""
    with open(search_json_path) as f:
        search = json.load(f)
    for layout in search["layouts"]:
        print("%s\t%s" % (" ".join(planner_flags(layout)), layout["layout"]))


def sample(n, k, seed):
    """k of the indices 0..n-1 drawn without replacement by a seeded generator, in order"""
    import random
    return sorted(random.Random(seed).sample(range(n), k))


def field(json_path, name):
    """a top-level field of a JSON file; exit 1 when it is not there"""
    with open(json_path) as f:
        value = json.load(f).get(name)
    if value is None:
        sys.exit(1)
    print(value)


def prediction(output_path):
    """the seconds a predictor printed: its JSON's "step_seconds" (the planner's -format json),
    else a lone number on its last non-empty line; exit 1 with the reason when neither"""
    text = open(output_path).read()
    try:
        doc = json.loads(text)
        if isinstance(doc, dict):
            if "step_seconds" not in doc:
                sys.exit("its JSON has no \"step_seconds\"")
            print(repr(float(doc["step_seconds"])))
            return
    except ValueError:
        pass
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    try:
        seconds = float(lines[-1])
    except (IndexError, ValueError):
        sys.exit("expected seconds on its last line, got %r" % (lines[-1] if lines else ""))
    if not seconds > 0:
        sys.exit("a prediction that is not positive: %r" % lines[-1])
    print(repr(seconds))


def step_times(main_log, warmup):
    """the median step time in seconds after `warmup` steps, and every step's ms, of a main.log"""
    ms = [rec["ms"] for rec in map(json.loads, open(main_log)) if "train_loss" in rec]
    if len(ms) <= warmup:
        sys.exit("%s has %d steps, not more than the %d warm-up steps" % (main_log, len(ms), warmup))
    print("%r\t%s" % (median(ms[warmup:]) / 1e3, ",".join("%.3f" % x for x in ms)))


# ---------------------------------------------------------------------------------------------
# the report: the table, the summary, the figure


def read_results(path):
    rows = []
    with open(path) as f:
        header = f.readline().rstrip("\n").split("\t")
        for line in f:
            row = dict(zip(header, line.rstrip("\n").split("\t")))
            row["index"] = int(row["index"])
            row["ok"] = not row["measured_s"].startswith("failed")
            row["measured"] = float(row["measured_s"]) if row["ok"] else None
            row["predicted"] = float(row["predicted_s"]) if row["predicted_s"] != "-" else None
            rows.append(row)
    return rows


def figure(rows, path, title):
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    m = [r["measured"] for r in rows]
    p = [r["predicted"] for r in rows]
    lo, hi = min(m + p) / 1.3, max(m + p) * 1.3
    fig, ax = plt.subplots(figsize=(6, 6))
    ax.fill_between([lo, hi], [lo / 1.15, hi / 1.15], [lo * 1.15, hi * 1.15], color="grey", alpha=0.15,
                    label="within 15%")
    ax.plot([lo, hi], [lo, hi], color="grey", linewidth=1, label="predicted = measured")
    ax.scatter(m, p, s=18, zorder=3)
    for r in rows:  # each point named by its row in the table
        ax.annotate(str(r["index"]), (r["measured"], r["predicted"]), fontsize=7, xytext=(3, 3),
                    textcoords="offset points")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured step time (s, median after warm-up)")
    ax.set_ylabel("predicted step time (s)")
    ax.set_title(title, fontsize=10)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)


def report(path, figure_path=None, title="sweep"):
    rows = read_results(path)
    ok = [r for r in rows if r["ok"]]
    predicted = [r for r in ok if r["predicted"] is not None]
    any_prediction = any(r["predicted"] is not None for r in rows)
    by_time = sorted(ok, key=lambda r: r["measured"])
    place = {r["index"]: measured_rank([x["measured"] for x in ok], ok.index(r)) for r in ok}
    print("%3s %5s %11s %7s%s  %s" % ("#", "rank", "measured ms", "spread",
                                      " %12s %7s" % ("predicted ms", "error") if any_prediction else "", "layout"))
    for r in by_time + [r for r in rows if not r["ok"]]:
        if r["ok"]:
            steps = [float(x) for x in r["steps_ms"].split(",") if x]
            kept = steps[int(r["warmup"]):]
            spread = "%6.0f%%" % ((max(kept) - min(kept)) / (r["measured"] * 1e3) * 100)
            cells = "%3d %5d %11.1f %7s" % (r["index"], place[r["index"]], r["measured"] * 1e3, spread)
        else:
            cells = "%3d %5s %11s %7s" % (r["index"], "-", "failed", "")
        if any_prediction:
            if r["predicted"] is None:
                cells += " %12s %7s" % ("-", "")
            elif r["ok"]:
                cells += " %12.1f %6.1f%%" % (r["predicted"] * 1e3, abs(r["predicted"] - r["measured"]) / r["measured"] * 100)
            else:
                cells += " %12.1f %7s" % (r["predicted"] * 1e3, "")
        print("%s  %s" % (cells, r["layout"]))
    for r in rows:
        if not r["ok"]:
            print("layout %d %s: %s" % (r["index"], r["layout"], r["measured_s"]))
    print("spread: (slowest - fastest) / median of the measured steps, the noise of the machine")
    if not predicted:
        print("no predictions were available: measured times alone (%d of %d layouts ran)" % (len(ok), len(rows)))
        return
    missing = len(ok) - len(predicted)
    if missing:
        print("%d measured layout%s had no prediction and %s left out of the statistics" % (
            missing, "s" if missing > 1 else "", "are" if missing > 1 else "is"))
    s = sweep_stats([r["measured"] for r in predicted], [r["predicted"] for r in predicted])
    best = predicted[s["best"]]
    print("predicted best: layout %d (%s), %.1f%% slower than the measured best" % (best["index"], best["layout"],
                                                                                     s["best_lead"]))
    if figure_path:
        figure(predicted, figure_path, "%s\nspearman %.3f, median error %.1f%%" % (title, s["spearman"], s["median_error"]))
        print("figure: %s" % figure_path)
    print(summary_line(s))


# ---------------------------------------------------------------------------------------------
# self-test: hand-worked cases, each of which a wrong formula fails


def self_test():
    def close(a, b, what, tol=1e-12):  # exact arithmetic on small rationals: rounding only
        assert abs(a - b) <= tol, "%s: %r, expected %r" % (what, a, b)

    # ranks: ties share the mean of their places (places 2 and 3 -> 2.5 each)
    assert ranks([3.0, 1.0, 2.0, 2.0]) == [4.0, 1.0, 2.5, 2.5], ranks([3.0, 1.0, 2.0, 2.0])
    # no ties: rho = 1 - 6 sum d^2 / (n (n^2 - 1)). Ranks (1,2,3,4,5) against (2,1,4,3,5):
    # d^2 = 1+1+1+1+0 = 4, rho = 1 - 24/120 = 0.8
    close(spearman([1, 2, 3, 4, 5], [20, 10, 40, 30, 50]), 0.8, "spearman without ties")
    close(spearman([1, 2, 3], [30, 20, 10]), -1.0, "spearman reversed")
    # with a tie: measured (1,2,3,4) ranks (1,2,3,4); predicted (10,20,20,40) ranks (1,2.5,2.5,4).
    # Pearson on ranks: means 2.5 both; deviations (-1.5,-.5,.5,1.5) and (-1.5,0,0,1.5):
    # sxy = 2.25+0+0+2.25 = 4.5, sxx = 5, syy = 4.5, rho = 4.5 / sqrt(22.5) = 0.9486832980505138
    # (the no-tie formula would give 1 - 6 * 0.5 / 60 = 0.95: ties need Pearson's form)
    close(spearman([1, 2, 3, 4], [10, 20, 20, 40]), 4.5 / math.sqrt(22.5), "spearman with a tie")
    assert math.isnan(spearman([1, 2, 3], [5, 5, 5])), "a constant side has no ranking"
    # errors: |0.11-0.1|/0.1 = 10%, |0.15-0.2|/0.2 = 25%, |0.32-0.4|/0.4 = 20%, |0.9-0.5|/0.5 = 80%
    m, p = [0.1, 0.2, 0.4, 0.5], [0.11, 0.15, 0.32, 0.9]
    s = sweep_stats(m, p)
    close(s["median_error"], 22.5, "median error (even count: mean of the middle two, 20 and 25)", 1e-9)
    close(s["worst_error"], 80.0, "worst error", 1e-9)
    close(median([3, 1, 2]), 2, "median of an odd count")
    close(median([4, 1, 3, 2]), 2.5, "median of an even count")
    # predicted best: 0.11 (layout 0), measured fastest: rank 1, lead 0
    assert (s["best"], s["best_rank"]) == (0, 1), s
    close(s["best_lead"], 0.0, "lead of a correct pick")
    # the model picks layout 2 (predicted 0.05), which ran 0.3 s: layouts at 0.1 and 0.2 were
    # faster, so it ranks 3rd; 0.3 / 0.1 - 1 = 200% slower than the best
    s = sweep_stats([0.1, 0.2, 0.3, 0.4], [0.2, 0.3, 0.05, 0.5])
    assert (s["best"], s["best_rank"]) == (2, 3), s
    close(s["best_lead"], 200.0, "lead", 1e-9)
    # a tie for the fastest prediction counts the slower measured of the tied (layout 2, 0.3 s,
    # rank 3 of 3; not layout 1, listed first); measured ties share the better place
    s = sweep_stats([0.1, 0.2, 0.3], [0.4, 0.1, 0.1])
    assert (s["best"], s["best_rank"]) == (2, 3), s
    assert measured_rank([0.2, 0.2, 0.1], 0) == 2 and measured_rank([0.2, 0.2, 0.3], 1) == 1
    line = summary_line(sweep_stats([1.0, 2.0], [1.1, 1.8]))
    assert line == "sweep: 2 layouts, spearman 1.000, median error 10.0%, worst error 10.0%, predicted best ranks 1 of 2 measured", line
    # the sample: seeded, sorted, without repeats
    a = sample(111, 24, 7)
    assert a == sample(111, 24, 7) and a == sorted(set(a)) and len(a) == 24 and a != sample(111, 24, 8)
    print("sweep_stats self-test: ok")


def main():
    args = sys.argv[1:]
    if not args or args[0] in ("-h", "--help"):
        print(__doc__)
        return
    cmd, rest = args[0], args[1:]
    if cmd == "self-test":
        self_test()
    elif cmd == "stats" and len(rest) == 2:
        measured, predicted = ([float(x) for x in a.split(",")] for a in rest)
        print(summary_line(sweep_stats(measured, predicted)))
    elif cmd == "report" and rest:
        opts = dict(zip(rest[1::2], rest[2::2]))
        unknown = set(opts) - {"--figure", "--title"}
        if unknown or len(rest) % 2 == 0:
            sys.exit("error: report RESULTS.tsv [--figure PNG] [--title TEXT]")
        report(rest[0], opts.get("--figure"), opts.get("--title", "sweep"))
    elif cmd == "layouts" and len(rest) == 1:
        layouts(rest[0])
    elif cmd == "sample" and len(rest) == 3:
        print(" ".join(str(i) for i in sample(*(int(x) for x in rest))))
    elif cmd == "field" and len(rest) == 2:
        field(*rest)
    elif cmd == "prediction" and len(rest) == 1:
        prediction(rest[0])
    elif cmd == "step-times" and len(rest) == 2:
        step_times(rest[0], int(rest[1]))
    else:
        sys.exit("error: unknown command or arguments %r; see --help" % " ".join(args))


if __name__ == "__main__":
    main()
