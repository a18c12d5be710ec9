#!/usr/bin/python3
"""
The Python side of dev/bench/sweep.sh: the statistics that say how well a model of step time
ranks and prices the layouts a sweep measured, the figure, and the small pieces of JSON and
main.log reading the shell script cannot do itself.

    /usr/bin/python3 dev/bench/sweep_stats.py self-test
    /usr/bin/python3 dev/bench/sweep_stats.py report RESULTS.tsv [--figure PNG --title TEXT]
    /usr/bin/python3 dev/bench/sweep_stats.py stats 'measured,...' 'predicted,...'   (seconds)
    /usr/bin/python3 dev/bench/sweep_stats.py summary RESULTS.tsv       (the summary line alone)
    /usr/bin/python3 dev/bench/sweep_stats.py drift PROFILE PROBES OUT [median|fastest]
                                                        (a profile scaled for the drift)
    /usr/bin/python3 dev/bench/sweep_stats.py combine OUT PROFILE PROFILE...
                                                        (several calibrations as one profile)

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

How well the machine agrees with itself, when the sweep measured its layouts in R >= 2 passes
(sweep.sh -repeat R), on the line before the summary:

    repeatability: R passes, spearman between passes S, median difference between passes D%

- S: Spearman's correlation between two passes' times of the layouts measured in every pass, the
  mean over all pairs of passes: how well the machine repeats its own ranking, the noise ceiling
  a model's spearman is to be read against (not against 1). A model at S ranks the layouts as
  well as a second pass of this machine would. (Not quite the most a model can reach: were each
  pass the layouts' true times plus noise independent between passes, a model that knew the true
  times would reach about the square root of S against one pass, more against the median of
  several, which the summary's spearman uses; above that is luck: the next line.)
- D: a layout's difference, (slowest pass - fastest pass) / its measured time (the median of its
  passes' times), in percent; the median over the layouts. With two passes a layout's passes lie
  half its difference from their mean, and with noise independent between them the mean lies as
  far from the true time, as often: a model's median error well below D/2 is finer than this
  machine measures.

and then the most a model can be expected to reach against those passes:

    noise ceiling: a model that knew each layout's true time would reach a spearman of about C

- C = sqrt(R S / (1 + (R - 1) S)), 0 when S <= 0. Were each pass the true times plus noise
  independent between passes, S estimates the reliability of one pass (the share of the times'
  variance that is the layouts' and not the noise's); the mean of R passes has the reliability
  R S / (1 + (R - 1) S) (the Spearman-Brown formula: the noise averages down, the layouts' part
  does not), and a measurement of reliability r correlates with the true times at sqrt(r) at
  best (Spearman's correction for attenuation, 1904). The summary compares a model with the
  passes' median (their mean at R = 2), so C is an estimate, on ranks rather than times; at S
  0.5 two passes give 0.82, six 0.93: a target of 0.9 needs the passes to agree at
  0.9^2 / (R - (R - 1) 0.9^2) or better, 0.68 at R = 2.

A layout's measured time is one of two measures (sweep.sh -measure):

- median: the median of its steps after the warm-up, and with R passes the median of the passes'
  (the issue's measure; the summary line by default);
- fastest: its fastest step after the warm-up, of all its passes. A shared machine only ever adds
  time to a step (another tenant, a slow phase, a rank's turn on its core come late): the fastest
  step is the nearest to what the layout costs on the machine undisturbed, which is what a model
  of it predicts. On this project's 2-core VM two 4-rank sweeps an hour apart ranked the same 24
  layouts alike at a spearman of 0.92 by their fastest steps, 0.37 by their medians.

The report gives the summary by the measure the sweep took and, on the line before it, the rank
figures (spearman, the predicted best's place) by the other, from the same steps: a model that
ranks well by one and not the other is reading the noise. (The errors are left out of that line:
with -calibrate the predictions are scaled to the probes' median or fastest, the sweep's measure,
which moves the ranks a little too: the GEMMs and the bandwidths are scaled by different factors.)
The repeatability and noise-ceiling lines below are the passes' medians' with either measure (so
labelled with the fastest).

RESULTS.tsv is what sweep.sh writes (its -save): a header, then a row a layout with the columns
index, layout, measured_s (or "failed: why"; by the sweep's measure: with R passes the median of
the passes' medians or the fastest step of them all; or "failed in pass P: why"), predicted_s (or
"-"), warmup (the steps each pass left out), steps_ms (every step's time, warm-up included,
comma-separated; the passes separated by ';'), command, passes_s (each pass's median,
comma-separated; a TSV without the column has one pass), measure (median or fastest; a TSV
without the column: median).
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


def repeatability(passes):
    """how well R passes agree (the docstring's S and D): passes[i] is layout i's time in each
    pass (R >= 2 a layout, the same R for every layout, the passes in the same order)"""
    R = len(passes[0])
    if R < 2 or any(len(p) != R for p in passes):
        raise ValueError("expected every layout's times of the same R >= 2 passes: %s" % passes)
    # S: the mean of Spearman's correlation over every pair of passes (a, b), a < b
    pairs = [(a, b) for a in range(R) for b in range(a + 1, R)]
    rho = sum(spearman([p[a] for p in passes], [p[b] for p in passes]) for a, b in pairs) / len(pairs)
    # D: each layout's slowest pass less its fastest, over its measured time (its passes' median)
    difference = median([(max(p) - min(p)) / median(p) * 100 for p in passes])
    return {"passes": R, "n": len(passes), "spearman": rho, "difference": difference}


def noise_ceiling(S, R):
    """the spearman a model that knew the true times could expect against the mean of R passes
    that agree at S (the docstring's C)"""
    if not S > 0:
        return 0.0
    return math.sqrt(R * S / (1 + (R - 1) * S))


def of_medians(measure):
    """the repeatability lines' note when the sweep's measure is not the passes' medians they use"""
    return "" if measure == "median" else " (of the passes' medians)"


def noise_ceiling_line(r, measure="median"):
    """the line after the repeatability line"""
    return "noise ceiling: a model that knew each layout's true time would reach a spearman of about %.3f%s" % (
        noise_ceiling(r["spearman"], r["passes"]), of_medians(measure))


def repeatability_line(r, measure="median"):
    """the line before the summary (the docstring says what it means)"""
    return "repeatability: %d passes, spearman between passes %.3f, median difference between passes %.1f%%%s" % (
        r["passes"], r["spearman"], r["difference"], of_medians(measure))


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


MEASURES = ("median", "fastest")


def kept_steps_ms(steps_ms, warmup):
    """every pass's steps after its own warm-up, in ms, those of all passes together (steps_ms as
    RESULTS.tsv has it: comma-separated, the passes separated by ';')"""
    kept = []
    for run in steps_ms.split(";"):
        kept += [float(x) for x in run.split(",") if x][warmup:]
    return kept


def merge(planned_path, warmup, measure, pass_paths):
    """RESULTS.tsv (on stdout) from sweep.sh's files: planned.tsv (index, layout, predicted_s,
    command: a row a layout, in the sweep's order) and each pass's runs, pass.P.tsv (index,
    seconds (the pass's median) or "failed...: why", steps_ms; a layout that failed is not run in
    later passes); a layout's time by `measure` (the docstring's median or fastest)"""
    if measure not in MEASURES:
        sys.exit("unknown measure %r (median or fastest)" % measure)
    passes = []
    for path in pass_paths:
        with open(path) as f:
            passes.append({int(row[0]): row[1:] for row in (line.rstrip("\n").split("\t") for line in f)})
    print("\t".join(("index", "layout", "measured_s", "predicted_s", "warmup", "steps_ms", "command", "passes_s",
                     "measure")))
    with open(planned_path) as f:
        for line in f:
            index, label, predicted, command = line.rstrip("\n").split("\t")
            runs = [p[int(index)] for p in passes if int(index) in p]  # pass 1, 2, ... up to a failure
            ok = [seconds for seconds, _ in runs if not seconds.startswith("failed")]
            steps_ms = ";".join(steps for _, steps in runs)
            if len(ok) < len(runs):  # failed in its last pass: that pass's reason
                measured = runs[-1][0]
            elif measure == "fastest":  # the fastest step after the warm-up, of every pass
                measured = repr(min(kept_steps_ms(steps_ms, warmup)) / 1e3)
            elif len(ok) == 1:  # one pass: its time as step-times printed it (the TSV as before -repeat)
                measured = ok[0]
            else:  # the median of its passes' times
                measured = repr(median([float(x) for x in ok]))
            print("\t".join((index, label, measured, predicted, str(warmup), steps_ms, command, ",".join(ok),
                             measure)))


# the profile's fields the drift scales: the GEMM rates by the GEMMs', the bandwidths by the triads'
DRIFT_GEMM_FIELDS = ("peak_flops_fp32", "peak_flops_bf16", "host_flops_fp32")
DRIFT_TRIAD_FIELDS = ("memory_bandwidth_bytes_per_s", "host_memory_bandwidth_bytes_per_s")


def drift(profile_path, probes_path, out_path, measure="median"):
    """The machine's drift between a calibration and the runs after it. The calibration's profile
    says how long rank 0's lone GEMMs and triads took, the median over the calibration ("lone
    medians: gemm_seconds G triad_seconds T"); calibrate -probe timed the same work before each
    run (a line "gemm_seconds G triad_seconds T" each, in probes_path). Writes to out_path the
    profile with its GEMM rates times G / (the probes' median G) and its bandwidths times T / (the
    probes' median T), everything else as measured, and prints the two factors and the probes'
    count. With measure "fastest" the probes' fastest G and T instead of their medians: the
    machine at its quickest during the runs, as a layout's fastest step is. Exit 1 with the reason
    when the profile has no lone medians or there are no probes."""
    import re
    text = open(profile_path).read()
    m = re.search(r"lone medians: gemm_seconds (\S+) triad_seconds (\S+)", text)
    if m is None:
        sys.exit("%s has no \"lone medians\" line (a profile from dev/bench/calibrate writes one)" % profile_path)
    calibrated = float(m.group(1)), float(m.group(2))
    probes = []
    for line in open(probes_path):
        w = line.split()
        if len(w) == 4 and w[0] == "gemm_seconds" and w[2] == "triad_seconds":
            probes.append((float(w[1]), float(w[3])))
    if not probes:
        sys.exit("%s: no probe (\"gemm_seconds G triad_seconds T\" lines)" % probes_path)
    if measure not in MEASURES:
        sys.exit("unknown measure %r (median or fastest)" % measure)
    of_probes = median if measure == "median" else min
    gemm = calibrated[0] / of_probes([p[0] for p in probes])
    triad = calibrated[1] / of_probes([p[1] for p in probes])
    lines = ["# %s scaled for the machine's drift (dev/bench/sweep_stats.py drift): the GEMM rates x %.4f, the\n"
             "# bandwidths x %.4f, the calibration's lone medians over the %s of %d probes taken with the runs\n"
             % (os.path.basename(profile_path), gemm, triad, "medians" if measure == "median" else "fastest",
                len(probes))]
    for line in text.splitlines(True):
        w = line.split()
        if len(w) == 2 and w[0] in DRIFT_GEMM_FIELDS + DRIFT_TRIAD_FIELDS:
            line = "%s %.10g\n" % (w[0], float(w[1]) * (gemm if w[0] in DRIFT_GEMM_FIELDS else triad))
        lines.append(line)
    with open(out_path, "w") as f:
        f.write("".join(lines))
    print("%.6f %.6f %d" % (gemm, triad, len(probes)))


def profile_fields(path):
    """a profile's fields in order, {name: the rest of its line} (the comments and blank lines left out)"""
    fields = {}
    for line in open(path):
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, value = line.strip().partition(" ")
            fields[name] = value.strip()
    return fields


def as_number(text):
    try:
        return float(text)
    except ValueError:
        return None


def combine(out_path, profile_paths):
    """One profile from K calibrations of one machine (sweep.sh -calibrations K, spread over the
    sweep's passes): each field the median of the K calibrations' (the mean of the middle two for
    an even K; of whole numbers, a count, the whole part), a field they all agree on (the name, the cores, the cache) as it is, and the lone
    medians (the drift's reference) the median of theirs. A field a calibration left out counts
    as 0 there: the format leaves out an optional field at 0 (calibrate measured none of a cost,
    e.g. no wait for ranks meeting at a collective), and a median of 0 is left out in turn. A
    calibration's minute catches the machine in one phase: its collectives' bandwidths moved by
    1.4-3.4x between calibrations an hour apart, and one in a fast phase priced some layouts
    18-28% under. (A field whose default is not 0, gpus_per_node or efficiency_link, calibrate
    always writes.) Comments: a header saying so, then the first calibration's notes (its own
    figures). Prints K, the field that differed most between the calibrations and that
    difference, (largest - smallest) / median in percent, of the rates (FLOP/s and bytes/s: a
    fraction near 0 differs by more and matters less). Exit 1 with the files and field named when
    a field that is not a number differs or is missing from one (another machine's calibration). One profile alone comes back with its fields as they were (sweep.sh, when
    the other calibrations failed)."""
    import re
    lone_re = re.compile(r"lone medians: gemm_seconds (\S+) triad_seconds (\S+)")
    profiles, lone = [], []
    for path in profile_paths:
        profiles.append(profile_fields(path))
        m = lone_re.search(open(path).read())
        if m is None:
            sys.exit("%s has no \"lone medians\" line (a profile from dev/bench/calibrate writes one)" % path)
        lone.append((float(m.group(1)), float(m.group(2))))
    names = list(dict.fromkeys(name for fields in profiles for name in fields))  # in the order first met
    combined, widest = {}, (0.0, "")
    for name in names:
        values = [fields.get(name) for fields in profiles]
        present = [v for v in values if v is not None]
        if all(v == present[0] for v in values):
            combined[name] = present[0]
            continue
        numbers = [as_number(v) for v in present]
        if None in numbers:
            sys.exit("%s: the calibrations' %r differ (%s) and it is not a number: not one machine's calibrations"
                     % (", ".join(profile_paths), name, " / ".join(v or "(left out)" for v in values)))
        numbers += [0.0] * (len(values) - len(present))  # (left out: 0)
        middle = median(numbers)
        if all(v.isdigit() for v in present):  # (a count, cpu_cores: whole, as the format wants it)
            middle = math.floor(middle)
        if middle != 0:
            combined[name] = "%.10g" % middle
        if middle > 0 and (name.endswith("_bytes_per_s") or name.startswith("peak_flops")):
            widest = max(widest, ((max(numbers) - min(numbers)) / middle * 100, name))
    gemm, triad = median([g for g, _ in lone]), median([t for _, t in lone])
    notes = [line.replace("lone medians:", "its lone medians:") for line in open(profile_paths[0])
             if line.lstrip().startswith("#")]
    header = ("# The median, field by field, of %d calibrations of this machine spread over a sweep's passes\n"
              "# (dev/bench/sweep.sh -calibrations; sweep_stats.py combine).\n"
              "#   lone medians: gemm_seconds %.6g triad_seconds %.6g (the calibrations' medians)\n"
              "# The first calibration's notes, with its own figures:\n" % (len(profiles), gemm, triad))
    with open(out_path, "w") as f:
        f.write(header + "".join(notes) + "".join("%s %s\n" % kv for kv in combined.items()))
    print("%d %s %.1f" % (len(profiles), widest[1] or "-", widest[0]))


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
            # each pass's median (a TSV from before -repeat has no passes_s: one pass, measured_s)
            row["passes"] = [float(x) for x in row.get("passes_s", row["measured_s"]).split(",")] if row["ok"] else []
            row["predicted"] = float(row["predicted_s"]) if row["predicted_s"] != "-" else None
            row["measure"] = row.get("measure", "median")  # (a TSV from before -measure: the median)
            rows.append(row)
    return rows


def figure(rows, path, title, measure="median"):
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
    ax.set_xlabel("measured step time (s, %s after warm-up)" % ("median" if measure == "median" else "fastest step"))
    ax.set_ylabel("predicted step time (s)")
    ax.set_title(title, fontsize=10)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=120)


def seconds_by(row, measure):
    """a layout's time by a measure, from its steps (a RESULTS.tsv row's steps_ms and warmup): the
    median of its passes' medians, or its fastest step, each pass's warm-up left out"""
    warmup = int(row["warmup"])
    if measure == "fastest":
        return min(kept_steps_ms(row["steps_ms"], warmup)) / 1e3
    return median([median(kept_steps_ms(run, warmup)) for run in row["steps_ms"].split(";")]) / 1e3


def other_measure_line(rows, measure):
    """the rank figures of the layouts (measured and predicted) by the measure the sweep did not
    take, from their steps"""
    other = "fastest" if measure == "median" else "median"
    name = "each layout's fastest step" if other == "fastest" else "the median of each layout's steps"
    s = sweep_stats([seconds_by(r, other) for r in rows], [r["predicted"] for r in rows])
    return "by %s (-measure %s): spearman %.3f, predicted best ranks %d of %d measured" % (
        name, other, s["spearman"], s["best_rank"], s["n"])


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
            kept = kept_steps_ms(r["steps_ms"], int(r["warmup"]))
            spread = "%6.0f%%" % ((max(kept) - min(kept)) / median(kept) * 100)
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
    passes = max((len(r["passes"]) for r in ok), default=1)
    print("spread: (slowest - fastest) / median of the measured steps%s, the noise of the machine" % (
        " (those of all %d passes, each pass's warm-up left out)" % passes if passes > 1 else ""))
    every_pass = [r["passes"] for r in ok if len(r["passes"]) == passes]
    measure = ok[0]["measure"] if ok else "median"
    if passes > 1 and every_pass:
        r = repeatability(every_pass)
        print(repeatability_line(r, measure))
        print(noise_ceiling_line(r, measure))
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
        figure(predicted, figure_path, "%s\nspearman %.3f, median error %.1f%%%s" % (
            title, s["spearman"], s["median_error"], "" if measure == "median" else " (fastest steps)"), measure)
        print("figure: %s" % figure_path)
    print(other_measure_line(predicted, measure))  # (on the line before the summary)
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
    # repeatability: two passes alike agree perfectly, spearman 1 and no difference
    r = repeatability([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])
    assert (r["passes"], r["n"]) == (2, 3), r
    close(r["spearman"], 1.0, "identical passes' spearman")
    close(r["difference"], 0.0, "identical passes' difference")
    # the 2nd and 3rd layouts swap places in pass 2: ranks (1,2,3) against (1,3,2), sum d^2 = 2,
    # rho = 1 - 6 * 2 / (3 * 8) = 0.5; differences 0, (3-2)/2.5 = 40%, 40%: the median 40%
    r = repeatability([[1.0, 1.0], [2.0, 3.0], [3.0, 2.0]])
    close(r["spearman"], 0.5, "a swapped pair's spearman")
    close(r["difference"], 40.0, "a swapped pair's difference", 1e-9)
    # three passes (1,2,3), (1,3,2), (1,2,4): pairs 1-2 0.5, 1-3 1 (the same order), 2-3 0.5, mean
    # 2/3; differences over each layout's median pass: 0, (3-2)/2 = 50%, (4-2)/3 = 66.7% (over the
    # mean, 7/3 and 3, they would be 42.9% and 66.7%): the median 50%
    r = repeatability([[1.0, 1.0, 1.0], [2.0, 3.0, 2.0], [3.0, 2.0, 4.0]])
    close(r["spearman"], 2 / 3, "three passes' spearman", 1e-12)
    close(r["difference"], 50.0, "three passes' difference", 1e-9)
    line = repeatability_line(r)
    assert line == "repeatability: 3 passes, spearman between passes 0.667, median difference between passes 50.0%", line
    # the ceiling: S = 0.5, R = 2: 2 * 0.5 / (1 + 0.5) = 2/3, sqrt 0.816496...; R = 6: 3 / 3.5 =
    # 6/7, sqrt 0.9258...; passes that agree perfectly, 1 at any R; no agreement, 0
    close(noise_ceiling(0.5, 2), math.sqrt(2 / 3), "ceiling of 2 passes at 0.5")
    close(noise_ceiling(0.5, 6), math.sqrt(6 / 7), "ceiling of 6 passes at 0.5")
    close(noise_ceiling(1.0, 3), 1.0, "ceiling of passes that agree")
    assert noise_ceiling(-0.2, 4) == 0.0 and noise_ceiling(0.0, 2) == 0.0
    assert noise_ceiling_line({"spearman": 0.5, "passes": 2}) == (
        "noise ceiling: a model that knew each layout's true time would reach a spearman of about 0.816")
    # the other measure's line: A's kept steps (each pass's warm-up left out) 10, 12 | 14, 16 ms,
    # B's 20, 20 | 9, 30 ms (its 5 ms warm-up left out). Taken by the median (A 13 ms of passes 11
    # and 15, B 19.75 of 20 and 19.5), the line ranks by the fastest steps: A 10, B 9, the reverse
    # of the predictions (A 0.1 s, B 0.2 s), spearman -1, the predicted best (A) 2nd of 2; taken by
    # the fastest, the line ranks by the medians, each pass's from its steps: A 13 < B 19.75 ms,
    # as predicted (with the warm-ups counted B's median would be 14.5 of 20 and 9, its fastest 5)
    two = [{"steps_ms": "100,10,12;200,14,16", "warmup": "1", "predicted": 0.1},
           {"steps_ms": "100,20,20;5,9,30", "warmup": "1", "predicted": 0.2}]
    assert kept_steps_ms(two[0]["steps_ms"], 1) == [10.0, 12.0, 14.0, 16.0]
    assert kept_steps_ms(two[1]["steps_ms"], 1) == [20.0, 20.0, 9.0, 30.0]
    for row, median_s, fastest_s in ((two[0], 0.013, 0.010), (two[1], 0.01975, 0.009)):
        close(seconds_by(row, "median"), median_s, "a layout's median of its passes' medians", 1e-15)
        close(seconds_by(row, "fastest"), fastest_s, "a layout's fastest step", 1e-15)
    line = other_measure_line(two, "median")
    assert line == "by each layout's fastest step (-measure fastest): spearman -1.000, predicted best ranks 2 of 2 measured", line
    line = other_measure_line(two, "fastest")
    assert line == "by the median of each layout's steps (-measure median): spearman 1.000, predicted best ranks 1 of 2 measured", line
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
    elif cmd == "merge" and len(rest) >= 4:
        merge(rest[0], int(rest[1]), rest[2], rest[3:])
    elif cmd == "drift" and len(rest) in (3, 4):
        drift(*rest)
    elif cmd == "combine" and len(rest) >= 2:
        combine(rest[0], rest[1:])
    elif cmd == "summary" and len(rest) == 1:
        rows = [r for r in read_results(rest[0]) if r["measured"] is not None and r["predicted"] is not None]
        print(summary_line(sweep_stats([r["measured"] for r in rows], [r["predicted"] for r in rows])))
    elif cmd == "step-times" and len(rest) == 2:
        step_times(rest[0], int(rest[1]))
    else:
        sys.exit("error: unknown command or arguments %r; see --help" % " ".join(args))


if __name__ == "__main__":
    main()
