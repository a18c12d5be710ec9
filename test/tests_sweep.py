# dev/bench/sweep.sh, the layouts of N ranks measured (and, with a model of step time, predicted),
# and dev/bench/sweep_stats.py, the statistics of its summary line: the statistics against
# hand-worked cases, and short sweeps whose summary is recomputed here from the saved times.
# (Read into run_tests.py: test, make, fresh_dir, ROOT, subprocess, os, re, math, signal, time come from there.)

SWEEP = os.path.join(ROOT, "dev", "bench", "sweep.sh")
SWEEP_SUMMARY = re.compile(r"^sweep: (\d+) layouts, spearman (\S+), median error ([\d.]+)%, worst error ([\d.]+)%, "
                           r"predicted best ranks (\d+) of (\d+) measured$", re.M)
# two quick layouts of d4 at 2 ranks (the planner's labels): data parallelism and tensor parallelism
SWEEP_TWO = r"^train_gpt2_dp \(2 ranks\) -r 0$|^train_gpt2_tp -tp 2 -sp 1 -r 0$"


def sweep_stats_module():
    sys.path.insert(0, os.path.join(ROOT, "dev", "bench"))
    try:
        import sweep_stats
    finally:
        sys.path.pop(0)
    return sweep_stats


def sweep_run(out, *flags, env=None, timeout=120):
    """dev/bench/sweep.sh with these flags, its temporary files under out (TMPDIR); (exit, output,
    the seconds it ran, the build before it not counted)"""
    p = make(["train_gpt2_dp", "train_gpt2_tp", "dev/memory_planner"])
    assert p.returncode == 0, p.stdout.decode()[-3000:]
    env = dict(os.environ, TMPDIR=out, **(env or {}))
    start = time.time()
    r = subprocess.run([SWEEP] + [str(f) for f in flags], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=timeout)
    return r.returncode, r.stdout + r.stderr, time.time() - start


def sweep_left_behind(out):
    """what a sweep left in its TMPDIR (Open MPI's own session directory aside)"""
    return [f for f in os.listdir(out) if not f.startswith("ompi.")]


@test
def sweep_stats_against_hand_worked_cases():
    """Spearman's rank correlation (ties at their mean rank), the median and worst error and the
    measured rank of the predicted best, each on numbers worked out by hand here"""
    s = sweep_stats_module()
    exact = 1e-12  # small rationals and one square root: only float rounding separates the sides
    # ranks (1..5) against (2,1,4,3,5): sum d^2 = 4, rho = 1 - 6 * 4 / (5 * 24) = 0.8
    assert abs(s.spearman([1, 2, 3, 4, 5], [20, 10, 40, 30, 50]) - 0.8) < exact
    assert abs(s.spearman([3, 2, 1], [1, 2, 3]) + 1) < exact
    # a tie in the predictions: ranks (1, 2.5, 2.5, 4) against (1, 2, 3, 4); Pearson on the ranks,
    # deviations (-1.5, 0, 0, 1.5) and (-1.5, -.5, .5, 1.5): 4.5 / sqrt(4.5 * 5) = 0.94868...;
    # the textbook shortcut 1 - 6 sum d^2 / (n (n^2 - 1)) = 0.95 holds without ties only
    assert s.ranks([10, 20, 20, 40]) == [1, 2.5, 2.5, 4]
    assert abs(s.spearman([1, 2, 3, 4], [10, 20, 20, 40]) - 4.5 / math.sqrt(22.5)) < exact
    # a tie among the measured: the same value from the other side (Pearson is symmetric)
    assert abs(s.spearman([10, 20, 20, 40], [1, 2, 3, 4]) - 4.5 / math.sqrt(22.5)) < exact
    assert math.isnan(s.spearman([1, 2], [7, 7])), "predictions all equal: no ranking to correlate"
    # errors 10%, 25%, 20%, 80% (|0.11-0.1|/0.1, |0.15-0.2|/0.2, |0.32-0.4|/0.4, |0.9-0.5|/0.5):
    # median of four = mean of the middle two, (20 + 25) / 2 = 22.5; worst 80
    r = s.sweep_stats([0.1, 0.2, 0.4, 0.5], [0.11, 0.15, 0.32, 0.9])
    assert abs(r["median_error"] - 22.5) < 1e-9 and abs(r["worst_error"] - 80) < 1e-9, r
    r = s.sweep_stats([0.1, 0.2, 0.4], [0.2, 0.1, 0.6])  # 100%, 50%, 50%: odd count, the middle one
    assert abs(r["median_error"] - 50) < 1e-9 and abs(r["worst_error"] - 100) < 1e-9, r
    # the predicted best: predicted 0.1 is layout 1, measured 0.2, behind 0.1: rank 2 of 3,
    # 0.2 / 0.1 - 1 = 100% slower than the measured best
    assert (r["best"], r["best_rank"], r["n"]) == (1, 2, 3) and abs(r["best_lead"] - 100) < 1e-9, r
    # tied for the fastest prediction (layouts 1 and 2, 0.1 each): the slower measured counts,
    # layout 2 at 0.3 s, rank 3 (not layout 1, listed first, rank 2)
    r = s.sweep_stats([0.1, 0.2, 0.3], [0.4, 0.1, 0.1])
    assert (r["best"], r["best_rank"]) == (2, 3), r
    # measured ties share the better place: 0.2 and 0.2 behind 0.1 are both 2nd
    assert s.measured_rank([0.2, 0.2, 0.1], 0) == 2 and s.measured_rank([0.2, 0.2, 0.1], 1) == 2
    assert s.summary_line(s.sweep_stats([1.0, 2.0, 4.0], [1.1, 1.8, 5.0])) == (
        "sweep: 3 layouts, spearman 1.000, median error 10.0%, worst error 25.0%, predicted best ranks 1 of 3 measured")
    p = subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "dev", "bench", "sweep_stats.py"), "self-test"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "self-test: ok" in p.stdout, p.stdout + p.stderr


@test
def sweep_repeatability_against_hand_worked_cases():
    """the repeatability line's figures (spearman between passes, the median difference between
    them) on numbers worked out by hand, and the report's reading of passes: a layout's spread over
    every pass's steps after its own warm-up, and a TSV from before -repeat read as one pass"""
    s = sweep_stats_module()
    # four layouts, two passes (0.1, 0.2, 0.3, 0.4) and (0.2, 0.1, 0.4, 0.3): ranks (1,2,3,4)
    # against (2,1,4,3), sum d^2 = 4, rho = 1 - 6 * 4 / (4 * 15) = 0.6; each layout's difference
    # 0.1 over its passes' mean (two passes: their median), 0.1/0.15 twice and 0.1/0.35 twice;
    # the median of the four, the mean of the middle two: (2/3 + 2/7) / 2 = 10/21 = 47.619%
    r = s.repeatability([[0.1, 0.2], [0.2, 0.1], [0.3, 0.4], [0.4, 0.3]])
    assert (r["passes"], r["n"]) == (2, 4), r
    assert abs(r["spearman"] - 0.6) < 1e-12 and abs(r["difference"] - 1000 / 21) < 1e-9, r
    assert s.repeatability_line(r) == (
        "repeatability: 2 passes, spearman between passes 0.600, median difference between passes 47.6%")
    # three passes, the third the first reversed: pairs 1-2 0.6, 1-3 -1, 2-3 (2,1,4,3) against
    # (4,3,2,1): d = (-2,-2,2,2), sum d^2 = 16, 1 - 96/60 = -0.6; the mean (0.6 - 1 - 0.6) / 3 = -1/3.
    # Differences over each layout's median pass: (0.1,0.2,0.4) 0.3/0.2 = 150%, (0.2,0.1,0.3) 0.2/0.2
    # = 100%, (0.3,0.4,0.2) 0.2/0.3 = 66.7%, (0.4,0.3,0.1) 0.3/0.3 = 100%: the median 100%
    r = s.repeatability([[0.1, 0.2, 0.4], [0.2, 0.1, 0.3], [0.3, 0.4, 0.2], [0.4, 0.3, 0.1]])
    assert r["passes"] == 3 and abs(r["spearman"] + 1 / 3) < 1e-12 and abs(r["difference"] - 100) < 1e-9, r
    out = fresh_dir("sweep_repeat_stats")
    header = "index\tlayout\tmeasured_s\tpredicted_s\twarmup\tsteps_ms\tcommand"
    # two passes, 1 warm-up each: kept 10, 12 | 14, 16 (not the 2nd pass's 200 warm-up), median of
    # the four 13, spread (16 - 10) / 13 = 46%; pass medians 11 and 15 ms, measured their mean 13;
    # the other layout 20 and 30 ms (25): 20 < 25 ms in both passes, spearman 1, differences
    # 4/13 = 30.8% and 10/25 = 40%, median 35.4%
    rows = ["1\tA\t0.013\t-\t1\t100,10,12;200,14,16\tcmd A\t0.011,0.015",
            "2\tB\t0.025\t-\t1\t100,20,20;100,30,30\tcmd B\t0.02,0.03"]
    new = os.path.join(out, "passes.tsv")
    with open(new, "w") as f:
        f.write(header + "\tpasses_s\n" + "\n".join(rows) + "\n")
    p = subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "dev", "bench", "sweep_stats.py"), "report", new],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert re.search(r"^ +1 +1 +13\.0 +46%  A$", p.stdout, re.M), p.stdout
    assert ("repeatability: 2 passes, spearman between passes 1.000, median difference between passes 35.4%"
            in p.stdout), p.stdout
    # passes that rank alike: the ceiling sqrt(2 * 1 / (1 + 1)) = 1, on the line after
    assert ("between passes 35.4%\nnoise ceiling: a model that knew each layout's true time would reach a spearman "
            "of about 1.000\n" in p.stdout), p.stdout
    # passes that agree at 0.6 (the four layouts above): sqrt(2 * 0.6 / 1.6) = sqrt(0.75) = 0.866
    assert s.noise_ceiling_line({"spearman": 0.6, "passes": 2}).endswith("about 0.866")
    # the same without passes_s (a TSV from before -repeat) and one pass's steps: no repeatability line
    old = os.path.join(out, "one_pass.tsv")
    with open(old, "w") as f:
        one_pass = [r.rsplit("\t", 1)[0].replace("100,10,12;200,14,16", "100,10,16") for r in rows]
        f.write(header + "\n" + "\n".join(one_pass) + "\n")
    p = subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "dev", "bench", "sweep_stats.py"), "report", old],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "repeatability" not in p.stdout, p.stdout + p.stderr
    # kept 10, 16: median 13, (16 - 10) / 13 = 46% again, now within one pass
    assert re.search(r"^ +1 +1 +13\.0 +46%  A$", p.stdout, re.M), p.stdout
    # with predictions (A 0.03 s, B 0.01: the reverse of both measures' order) and the measure
    # column: by the fastest (A 10 ms, B 20), the line before the summary ranks by the passes'
    # medians (A 13, B 25), spearman -1, the predicted best (B) 2nd, and the repeatability lines
    # say they are the medians'; a TSV without the column is the median's, its line by the fastest
    cases = (("\tmeasure", "\tfastest", "0.010", "0.020",
              "by the median of each layout's steps (-measure median): spearman -1.000, predicted best ranks 2 of 2 measured"),
             ("", "", "0.013", "0.025",
              "by each layout's fastest step (-measure fastest): spearman -1.000, predicted best ranks 2 of 2 measured"))
    for column, value, a, b, line in cases:
        path = os.path.join(out, "predicted.tsv")
        with open(path, "w") as f:
            f.write(header + "\tpasses_s" + column + "\n")
            f.write("1\tA\t%s\t0.03\t1\t100,10,12;200,14,16\tcmd A\t0.011,0.015%s\n" % (a, value))
            f.write("2\tB\t%s\t0.01\t1\t100,20,20;100,30,30\tcmd B\t0.02,0.03%s\n" % (b, value))
        p = subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "dev", "bench", "sweep_stats.py"), "report", path],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0 and line + "\nsweep: 2 layouts, spearman -1.000," in p.stdout, p.stdout + p.stderr
        labelled = "between passes 35.4% (of the passes' medians)\nnoise ceiling: a model that knew each layout's true " \
                   "time would reach a spearman of about 1.000 (of the passes' medians)\n"
        assert (labelled in p.stdout) == bool(column), p.stdout


@test
def sweep_two_layouts_with_stub_predictions_summary_recomputes():
    """two layouts at 2 ranks with a stub predictor (0.25 s for data parallelism, 0.5 s for the rest):
    each layout's median is that of its steps after the warm-up, the summary line's figures are
    those worked out here from the saved times (and sweep_stats' on the same data), the figure is
    written, and the sweep's temporary files are gone"""
    out = fresh_dir("sweep_stub")
    stub = os.path.join(out, "predict.sh")
    with open(stub, "w") as f:  # (the layout's planner flags arrive as arguments)
        f.write('#!/bin/sh\ncase " $* " in *" -trainer dp "*) echo 0.25 ;; *) echo 0.5 ;; esac\n')
    os.chmod(stub, 0o755)
    results, png = os.path.join(out, "results.tsv"), os.path.join(out, "sweep.png")
    code, text, took = sweep_run(out, "-np", 2, "-filter", SWEEP_TWO, "-warmup", 1, "-steps", 2, "-save", results,
                                 "-figure", png, env={"PREDICT_CMD": stub})
    assert code == 0, text
    assert sorted(sweep_left_behind(out)) == ["predict.sh", "results.tsv", "sweep.png"], sweep_left_behind(out)
    with open(results) as f:
        header = f.readline().rstrip("\n").split("\t")
        rows = [dict(zip(header, line.rstrip("\n").split("\t"))) for line in f]
    assert sorted(r["layout"] for r in rows) == ["train_gpt2_dp (2 ranks) -r 0", "train_gpt2_tp -tp 2 -sp 1 -r 0"], rows
    measured, predicted = [], []
    for r in rows:
        steps = [float(x) for x in r["steps_ms"].split(",")]
        assert len(steps) == 3, r  # 1 warm-up + 2 measured
        # the median of the 2 measured steps (the warm-up left out) is their mean, in seconds
        assert abs(float(r["measured_s"]) - (steps[1] + steps[2]) / 2e3) < 1e-6, r  # (steps_ms has 3 decimals)
        measured.append(float(r["measured_s"]))
        predicted.append(float(r["predicted_s"]))
        assert predicted[-1] == (0.25 if r["layout"].startswith("train_gpt2_dp") else 0.5), r
        assert "%.1f" % (measured[-1] * 1e3) in text, (r, text)  # the table shows it
    m = SWEEP_SUMMARY.search(text)
    assert m, text
    n, rho, med, worst, rank, of = m.groups()
    # by hand: two layouts rank the same way on both sides (rho 1) or opposite ways (-1); the two
    # errors' median is their mean; the predicted best is the dp layout (0.25 s), 1st when it ran faster
    dp = [i for i, r in enumerate(rows) if r["layout"].startswith("train_gpt2_dp")][0]
    tp = 1 - dp
    errors = [abs(p - x) / x * 100 for p, x in zip(predicted, measured)]
    assert measured[0] != measured[1], "equal medians to the microsecond: no ranking to check"
    assert (int(n), int(of)) == (2, 2), m.group(0)
    assert float(rho) == (1.0 if measured[dp] < measured[tp] else -1.0), (m.group(0), measured)
    assert abs(float(med) - sum(errors) / 2) <= 0.05 + 1e-9, (m.group(0), errors)  # printed to 0.1%
    assert abs(float(worst) - max(errors)) <= 0.05 + 1e-9, (m.group(0), errors)
    assert int(rank) == (1 if measured[dp] < measured[tp] else 2), (m.group(0), measured)
    assert m.group(0) == sweep_stats_module().summary_line(sweep_stats_module().sweep_stats(measured, predicted))
    # the ranks by the other measure (each layout's fastest step) on the line just before the
    # summary, after the figure's line
    assert re.search(r"^figure: .*\nby each layout's fastest step \(-measure fastest\): spearman -?1\.000, predicted best "
                     r"ranks [12] of 2 measured\n" + re.escape(m.group(0)), text, re.M), text
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n", "the figure is no PNG"
    assert took < 60, "the 2-layout sweep took %.0f s (about 20 on an idle 2-core machine)" % took


@test
def sweep_repeat_two_passes_the_second_reversed():
    """-repeat 2 -measure fastest on the two quick layouts: each runs once a pass, pass 2 in the
    reverse order of pass 1; the saved TSV has each pass's steps and median, the layout's time its
    fastest step after the warm-up of both passes; the repeatability line (by the passes'
    medians), the line ranking by the other measure (the median of the passes' medians, their
    mean) and the summary line are those worked out here from the saved times"""
    out = fresh_dir("sweep_repeat")
    stub = os.path.join(out, "predict.sh")
    with open(stub, "w") as f:
        f.write('#!/bin/sh\ncase " $* " in *" -trainer dp "*) echo 0.25 ;; *) echo 0.5 ;; esac\n')
    os.chmod(stub, 0o755)
    results = os.path.join(out, "results.tsv")
    code, text, took = sweep_run(out, "-np", 2, "-filter", SWEEP_TWO, "-warmup", 1, "-steps", 2, "-repeat", 2,
                                 "-measure", "fastest", "-save", results, "-figure", "none", env={"PREDICT_CMD": stub})
    assert code == 0, text
    progress = re.findall(r"^\[pass (\d)/2, (\d)/2\] #(\d+) .*: median [\d.]+ ms, fastest [\d.]+ ms, predicted ", text, re.M)
    assert [(p, k) for p, k, _ in progress] == [("1", "1"), ("1", "2"), ("2", "1"), ("2", "2")], text
    first = [i for p, _, i in progress if p == "1"]
    assert [i for p, _, i in progress if p == "2"] == first[::-1] and len(set(first)) == 2, text
    with open(results) as f:
        header = f.readline().rstrip("\n").split("\t")
        rows = [dict(zip(header, line.rstrip("\n").split("\t"))) for line in f]
    assert header[-2:] == ["passes_s", "measure"] and sorted(r["index"] for r in rows) == sorted(first), (header, rows)
    passes, measured, predicted = [], [], []
    for r in rows:
        medians = [float(x) for x in r["passes_s"].split(",")]
        assert len(medians) == 2 and r["measure"] == "fastest", r
        kept = []
        for run, seconds in zip(r["steps_ms"].split(";"), medians):  # each pass: 1 warm-up + 2 steps
            steps = [float(x) for x in run.split(",")]
            assert len(steps) == 3 and abs(seconds - (steps[1] + steps[2]) / 2e3) < 1e-6, r
            kept += steps[1:]
        assert abs(float(r["measured_s"]) - min(kept) / 1e3) < 1e-12, r  # the fastest of the 4 kept steps
        passes.append(medians)
        measured.append(float(r["measured_s"]))
        predicted.append(float(r["predicted_s"]))
    m = re.search(r"^repeatability: 2 passes, spearman between passes (\S+), "
                  r"median difference between passes ([\d.]+)% \(of the passes' medians\)$", text, re.M)
    assert m, text
    # by hand: two layouts in the same order in both passes (spearman 1) or not (-1); each one's
    # difference |pass 1 - pass 2| / their mean, and the median of two differences their mean
    assert passes[0][0] != passes[1][0] and passes[0][1] != passes[1][1], "ties to the microsecond: no order"
    same = (passes[0][0] < passes[1][0]) == (passes[0][1] < passes[1][1])
    assert float(m.group(1)) == (1.0 if same else -1.0), (m.group(0), passes)
    difference = sum(abs(a - b) / ((a + b) / 2) * 100 for a, b in passes) / 2
    assert abs(float(m.group(2)) - difference) <= 0.05 + 1e-9, (m.group(0), passes)  # printed to 0.1%
    summary = SWEEP_SUMMARY.search(text)
    assert summary and summary.start() > m.start(), text  # the repeatability line comes first
    assert summary.group(0) == sweep_stats_module().summary_line(sweep_stats_module().sweep_stats(measured, predicted))
    # ranked by the median (of two passes, their mean): the dp layout (predicted 0.25 s, faster)
    # first or not; two layouts: spearman 1 or -1, the predicted best 1st or 2nd
    dp = [i for i, r in enumerate(rows) if r["layout"].startswith("train_gpt2_dp")][0]
    by_median = [sum(p) / 2 for p in passes]
    assert by_median[0] != by_median[1], "equal medians to the microsecond: no order"
    right = by_median[dp] < by_median[1 - dp]
    line = "by the median of each layout's steps (-measure median): spearman %s, predicted best ranks %d of 2 measured" % (
        "1.000" if right else "-1.000", 1 if right else 2)
    assert line + "\n" + summary.group(0) in text, text  # on the line before the summary
    assert sorted(sweep_left_behind(out)) == ["predict.sh", "results.tsv"], sweep_left_behind(out)
    assert took < 90, "the 2-layout sweep of 2 passes took %.0f s (about 18 on an idle 2-core machine)" % took


@test
def sweep_without_predictions_failures_and_bad_flags():
    """a predictor that gives nothing: the measured times alone and the words "no predictions",
    no summary line and no figure; a layout that outruns -timeout is reported as failed and the
    sweep still ends with exit 0; a bad flag value is refused, naming it, before any run"""
    out = fresh_dir("sweep_none")
    png = os.path.join(out, "sweep.png")
    one = r"^train_gpt2_dp \(2 ranks\) -r 0$"
    code, text, _ = sweep_run(out, "-np", 2, "-filter", one, "-warmup", 0, "-steps", 1, "-figure", png,
                           env={"PREDICT_CMD": "false"})
    assert code == 0, text
    assert "no predictions were available: measured times alone (1 of 1 layouts ran)" in text, text
    assert not SWEEP_SUMMARY.search(text) and not os.path.exists(png), text
    assert re.search(r"^ +\d+ +1 +\d+\.\d +\d+%  train_gpt2_dp \(2 ranks\) -r 0$", text, re.M), text
    code, text, _ = sweep_run(out, "-np", 2, "-filter", one, "-warmup", 0, "-steps", 50, "-timeout", 2)
    assert code == 0, text
    assert "failed: still running after 2 s (-timeout)" in text and "(0 of 1 layouts ran)" in text, text
    # with passes: a layout that failed in pass 1 is reported so, and not run again in pass 2
    code, text, _ = sweep_run(out, "-np", 2, "-filter", one, "-warmup", 0, "-steps", 50, "-timeout", 2, "-repeat", 2)
    assert code == 0 and "failed in pass 1: still running after 2 s (-timeout)" in text, text
    assert re.search(r"^\[pass 2/2, 1/1\] #\d+ train_gpt2_dp \(2 ranks\) -r 0: skipped \(failed in pass 1\)$",
                     text, re.M), text
    assert "(0 of 1 layouts ran)" in text and "repeatability" not in text, text
    code, text, _ = sweep_run(out, "-np", 2, "-b", "two")
    assert code == 1 and "error: -b two: expected a positive whole number" in text, text
    for bad in ("0", "x"):
        code, text, _ = sweep_run(out, "-np", 2, "-repeat", bad)
        assert code == 1 and "error: -repeat %s: expected a positive whole number" % bad in text, text
    code, text, _ = sweep_run(out, "-np", 2, "-measure", "mean")
    assert code == 1 and "error: -measure mean: expected median or fastest" in text, text
    for flags, why in ((("-calibrations", 0), "-calibrations 0: expected a positive whole number"),
                       (("-calibrations", 2), "-calibrations 2: calibrations are taken with -calibrate"),
                       (("-calibrate", "-calibrations", 3, "-repeat", 2),
                        "-calibrations 3: expected at most one a pass (-repeat 2)"),
                       (("-calibrate", "-profile", "/nonexistent/cpu.txt"),
                        "-profile /nonexistent/cpu.txt: cannot write there (no such directory, or not writable)")):
        code, text, _ = sweep_run(out, "-np", 2, *flags)
        assert code == 1 and "error: " + why in text and "calibrating" not in text, (flags, text)
    code, text, _ = sweep_run(out, "-np", 2, "-filter", "no such layout")
    assert code == 1 and re.search(r"none of the search's \d+ layouts matches -filter 'no such layout'", text), text
    assert not sweep_left_behind(out), sweep_left_behind(out)


@test
def sweep_pins_its_ranks_or_says_it_cannot():
    """every run the sweep starts asks mpirun to pin its ranks to cores round robin (--bind-to
    core:overload-allowed --map-by core: the placement the model of ranks sharing a CPU assumes);
    where mpirun refuses to pin, the sweep says so, with mpirun's reason, and runs them unpinned,
    and the layout is measured. (A fake mpirun on PATH logs each call and runs the real one
    unpinned, so the test does not depend on this host's binding support.)"""
    import shlex
    import shutil
    real = shutil.which("mpirun")
    assert real, "mpirun not found on PATH: the multi-rank tests need Open MPI (apt-get install -y openmpi-bin)"
    out = fresh_dir("sweep_pin")
    fake, log = os.path.join(out, "bin"), os.path.join(out, "mpirun.log")
    os.makedirs(fake)
    with open(os.path.join(fake, "mpirun"), "w") as f:
        f.write('#!/bin/bash\necho "$*" >> %s\n'
                'if [[ " $* " == *" --bind-to core:overload-allowed "* ]]; then\n'
                '    [ -n "$REFUSE_PINNING" ] && { echo "binding not supported here" >&2; exit 1; }\n'
                '    args=(); for a in "$@"; do case "$a" in core:overload-allowed) a=none ;; esac; args+=("$a"); done\n'
                '    set -- "${args[@]}"\n'
                'fi\n'
                'exec %s "$@"\n' % (shlex.quote(log), shlex.quote(real)))
    os.chmod(os.path.join(fake, "mpirun"), 0o755)
    one = r"^train_gpt2_dp \(2 ranks\) -r 0$"
    path = fake + os.pathsep + os.environ["PATH"]
    for refuse in ("", "1"):
        if os.path.exists(log):
            os.remove(log)
        code, text, _ = sweep_run(out, "-np", 2, "-filter", one, "-warmup", 0, "-steps", 1, "-figure", "none",
                                  env={"PREDICT_CMD": "false", "PATH": path, "REFUSE_PINNING": refuse})
        assert code == 0, text
        with open(log) as f:
            runs = [line for line in f if "train_gpt2_dp" in line]  # (the layout's run; the others the sweep's probes)
        assert len(runs) == 1, (runs, text)
        said = "note: mpirun could not pin the ranks to cores here (--bind-to core: binding not supported here)" in text
        if not refuse:
            assert "--bind-to core:overload-allowed --map-by core" in runs[0] and "note:" not in text, (runs, text)
        else:
            assert "--bind-to none" in runs[0] and "--bind-to core" not in runs[0] and said, (runs, text)
        assert re.search(r"^ +\d+ +1 +\d+\.\d +\d+%  train_gpt2_dp \(2 ranks\) -r 0$", text, re.M), text


@test
def sweep_interrupted_stops_its_run_and_removes_its_files():
    """SIGINT (Ctrl-C) in the middle of a layout's run: the sweep exits 130 once the run has
    stopped (seconds on a quiet machine), no process of the run is left, and its temporary
    directory is gone"""
    out = fresh_dir("sweep_interrupt")
    p = make(["train_gpt2_dp", "dev/memory_planner"])
    assert p.returncode == 0, p.stdout.decode()[-3000:]
    proc = subprocess.Popen([SWEEP, "-np", "2", "-filter", r"^train_gpt2_dp \(2 ranks\) -r 0$", "-steps", "200"], cwd=ROOT,
                            env=dict(os.environ, TMPDIR=out), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True,  # (its own session: the signal goes to the script, as a terminal's would)
                            # (and SIGINT not ignored, as a terminal's shell has it: a suite started in the background
                            # of a shell without job control inherits it ignored, and bash cannot trap what it starts ignoring)
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.time() + 120
        while not glob.glob(os.path.join(out, "sweep.*", "run.*", "main.log")) and time.time() < deadline:
            time.sleep(0.2)
        runs = glob.glob(os.path.join(out, "sweep.*", "run.*"))
        assert runs, "no run started within 120 s"
        proc.send_signal(signal.SIGINT)
        # (mpirun ends its ranks on the TERM the sweep passes on, and the sweep waits up to 10 s
        # more for the last of them; under the suite's load that took over 30 s once: 90)
        text, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130 and "interrupted" in text, (proc.returncode, text)
    alive = [pid for pid in os.listdir("/proc") if pid.isdigit() and runs[0].encode() in
             open_quietly(os.path.join("/proc", pid, "cmdline"))]
    assert not alive, "processes of the run still alive: %s" % alive
    assert not sweep_left_behind(out), sweep_left_behind(out)


def open_quietly(path):
    """a /proc file's bytes, empty when the process has gone meanwhile"""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


@test
def sweep_stats_drift_scales_the_rates_by_the_probes():
    """sweep_stats.py drift PROFILE PROBES OUT (sweep.sh -calibrate's correction for the machine's
    speed during the runs): a hand-made profile whose lone medians are 0.4 s of GEMMs and 0.06 s of
    triads, probes of 0.5, 0.3, 0.2 s (median 0.3) and 0.05, 0.07, 0.03 s (median 0.05): the GEMM
    rates (the peaks and the host's) x 0.4 / 0.3, the bandwidths (the memory's and the host's)
    x 0.06 / 0.05, every other field as it was, a comment saying so; a profile without the medians,
    or no probe, refused with the reason and nothing written"""
    d = fresh_dir("sweep_drift")
    stats = os.path.join(ROOT, "dev", "bench", "sweep_stats.py")
    fields = {"peak_flops_fp32": 7e10, "peak_flops_bf16": 7e10, "host_flops_fp32": 7e10,
              "memory_bandwidth_bytes_per_s": 1e10, "host_memory_bandwidth_bytes_per_s": 6e9,
              "intra_node_bandwidth_bytes_per_s": 7e9, "cpu_gemm_fraction_2_ranks": 0.83}
    body = "".join("%s %r\n" % kv for kv in fields.items())
    profile = os.path.join(d, "cpu.txt")
    with open(profile, "w") as f:
        f.write("# measured\n#   lone medians: gemm_seconds 0.4 triad_seconds 0.06 (calibrate -probe ...)\nname x\n" + body)
    probes = os.path.join(d, "probes.txt")
    with open(probes, "w") as f:
        f.write("gemm_seconds 0.5 triad_seconds 0.05\ngemm_seconds 0.3 triad_seconds 0.07\n"
                "gemm_seconds 0.2 triad_seconds 0.03\n")
    out = os.path.join(d, "drifted.txt")
    p = subprocess.run(["/usr/bin/python3", stats, "drift", profile, probes, out], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    gemm, triad, count = p.stdout.split()
    assert abs(float(gemm) - 0.4 / 0.3) < 1e-6 and abs(float(triad) - 0.06 / 0.05) < 1e-6 and count == "3", p.stdout
    got = {l.split()[0]: float(l.split()[1]) for l in open(out) if not l.startswith("#") and l.split()[0] in fields}
    for key, value in fields.items():
        factor = (0.4 / 0.3 if key in ("peak_flops_fp32", "peak_flops_bf16", "host_flops_fp32") else
                  0.06 / 0.05 if key in ("memory_bandwidth_bytes_per_s", "host_memory_bandwidth_bytes_per_s") else 1.0)
        assert abs(got[key] - value * factor) <= 1e-9 * value, (key, got[key], value * factor)
    assert "scaled for the machine's drift" in open(out).read() and "name x\n" in open(out).read()
    # by the fastest probes (sweep.sh -measure fastest): 0.2 s and 0.03 s, the rates x 0.4 / 0.2
    # and x 0.06 / 0.03
    p = subprocess.run(["/usr/bin/python3", stats, "drift", profile, probes, out, "fastest"], capture_output=True,
                       text=True)
    gemm_f, triad_f, _ = p.stdout.split()
    assert p.returncode == 0 and abs(float(gemm_f) - 2) < 1e-6 and abs(float(triad_f) - 2) < 1e-6, p.stdout + p.stderr
    got = {l.split()[0]: float(l.split()[1]) for l in open(out) if not l.startswith("#") and l.split()[0] in fields}
    assert abs(got["peak_flops_fp32"] - 14e10) < 1 and abs(got["host_memory_bandwidth_bytes_per_s"] - 12e9) < 1, got
    assert abs(got["intra_node_bandwidth_bytes_per_s"] - 7e9) < 1, got
    # refused: no medians in the profile, no probe in the file
    bare = os.path.join(d, "bare.txt")
    with open(bare, "w") as f:
        f.write(body)
    for args, why in (([bare, probes], "no \"lone medians\" line"), ([profile, bare], "no probe"),
                      ([profile, probes], "unknown measure 'mean'")):
        target = os.path.join(d, "refused.txt")
        extra = ["mean"] if "measure" in why else []
        p = subprocess.run(["/usr/bin/python3", stats, "drift"] + args + [target] + extra, capture_output=True,
                           text=True)
        assert p.returncode == 1 and why in p.stderr and not os.path.exists(target), (args, p.returncode, p.stderr)
    print("    GEMM rates x %s, bandwidths x %s over %s probes; refusals named" % (gemm, triad, count))


@test
def sweep_stats_merge_takes_either_measure():
    """sweep_stats.py merge PLANNED WARMUP MEASURE PASS...: a layout's time from hand-made passes
    (1 warm-up step each): by the median, the median of its passes' medians (two passes: their
    mean); by the fastest, its fastest step after the warm-up of every pass (not a warm-up step,
    even the fastest); a layout that failed in its last pass keeps that pass's reason; the measure
    in its column; an unknown measure refused"""
    d = fresh_dir("sweep_merge")
    stats = os.path.join(ROOT, "dev", "bench", "sweep_stats.py")
    planned = os.path.join(d, "planned.tsv")
    with open(planned, "w") as f:
        f.write("1\tA\t0.5\tmpirun -np 2 ./a\n2\tB\t-\tmpirun -np 2 ./b\n")
    # A: pass 1 steps 5 (warm-up), 30, 20 ms (median 25), pass 2 9 (warm-up), 12, 40 (median 26);
    # B: 30, 31 in pass 1, then failed in pass 2
    one, two = os.path.join(d, "pass.1.tsv"), os.path.join(d, "pass.2.tsv")
    with open(one, "w") as f:
        f.write("1\t0.025\t5,30,20\n2\t0.0305\t1,30,31\n")
    with open(two, "w") as f:
        f.write("1\t0.026\t9,12,40\n2\tfailed in pass 2: exit 1: boom\t\n")
    rows = {}
    for measure in ("median", "fastest"):
        p = subprocess.run(["/usr/bin/python3", stats, "merge", planned, "1", measure, one, two], capture_output=True,
                           text=True)
        assert p.returncode == 0, p.stderr
        lines = [l.split("\t") for l in p.stdout.splitlines()]
        assert lines[0][-1] == "measure" and all(l[-1] == measure for l in lines[1:]), p.stdout
        rows[measure] = {l[1]: l for l in lines[1:]}
    # median: (0.025 + 0.026) / 2; fastest: 12 ms (pass 2's warm-up, 9 ms, left out)
    assert abs(float(rows["median"]["A"][2]) - 0.0255) < 1e-12, rows
    assert abs(float(rows["fastest"]["A"][2]) - 0.012) < 1e-12, rows
    for measure in rows:
        assert rows[measure]["B"][2] == "failed in pass 2: exit 1: boom", rows[measure]
        assert rows[measure]["A"][7] == "0.025,0.026" and rows[measure]["A"][5] == "5,30,20;9,12,40", rows[measure]
    p = subprocess.run(["/usr/bin/python3", stats, "merge", planned, "1", "mean", one, two], capture_output=True,
                       text=True)
    assert p.returncode != 0 and "unknown measure 'mean'" in p.stderr, (p.returncode, p.stderr)


@test
def sweep_stats_combine_takes_the_median_of_each_field():
    """sweep_stats.py combine OUT PROFILE... (sweep.sh -calibrations K: one profile from K
    calibrations): three hand-made profiles, each number the median of the three, a field they agree on as it is, the lone medians the median of
    theirs (which drift then reads: the first "lone medians" line), a field one left out counted
    0 there (and left out when its median is 0), the rate that differed most and by how much
    printed; an even count the mean of the middle two (a count its whole part); a field that is
    not a number differing or left out of one refused naming it, nothing written; one profile
    alone its fields as they were"""
    d = fresh_dir("sweep_combine")
    stats = os.path.join(ROOT, "dev", "bench", "sweep_stats.py")
    # the third calibration leaves out the meeting fraction (calibrate measured no wait: 0), the
    # second and third the 8 ranks' (0 in two of three: the median 0, left out)
    sets = [(0.45, 0.065, 7e10, 1e10, 5e9, "cpu_meeting_fraction_4_ranks 0.04\ncpu_meeting_fraction_8_ranks 0.1\n"),
            (0.30, 0.050, 9e10, 1.2e10, 2e9, "cpu_meeting_fraction_4_ranks 0.06\n"), (0.40, 0.060, 8e10, 0.8e10, 4e9, "")]
    paths = []
    for k, (gemm_s, triad_s, flops, bandwidth, link, optional) in enumerate(sets):
        path = os.path.join(d, "cal%d.txt" % k)
        with open(path, "w") as f:
            f.write("# calibration %d\n#   lone medians: gemm_seconds %r triad_seconds %r (calibrate -probe ...)\n"
                    "name CPU of vm, 1 thread a rank\nkind cpu\npeak_flops_fp32 %r\nmemory_bandwidth_bytes_per_s %r\n"
                    "intra_node_bandwidth_bytes_per_s %r\ncpu_cores 2\n%s" % (k, gemm_s, triad_s, flops, bandwidth, link,
                                                                             optional))
        paths.append(path)
    out = os.path.join(d, "combined.txt")
    p = subprocess.run(["/usr/bin/python3", stats, "combine", out] + paths, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    # the widest: the link, (5e9 - 2e9) / 4e9 = 75%; the GEMM rate's 25%, the bandwidth's 40%
    count, widest, spread = p.stdout.split()
    assert (count, widest, spread) == ("3", "intra_node_bandwidth_bytes_per_s", "75.0"), p.stdout
    text = open(out).read()
    got = {l.split()[0]: l.split(None, 1)[1].strip() for l in text.splitlines() if l and not l.startswith("#")}
    assert got["name"] == "CPU of vm, 1 thread a rank" and got["kind"] == "cpu" and got["cpu_cores"] == "2", got
    for key, want in (("peak_flops_fp32", 8e10), ("memory_bandwidth_bytes_per_s", 1e10),
                      ("intra_node_bandwidth_bytes_per_s", 4e9), ("cpu_meeting_fraction_4_ranks", 0.04)):
        assert abs(float(got[key]) - want) <= 1e-9 * want, (key, got[key], want)
    assert "cpu_meeting_fraction_8_ranks" not in got, got
    # the lone medians the median of theirs, 0.4 s and 0.06 s (the first calibration's own, 0.45 and
    # 0.065, kept in its notes as "its lone medians")
    assert re.search(r"^#   lone medians: gemm_seconds 0\.4 triad_seconds 0\.06 ", text, re.M), text
    assert "# calibration 0" in text and "its lone medians: gemm_seconds 0.45 " in text, text
    # drift reads the combined lone medians: probes at 0.2 s and 0.03 s, the rates x 2 and x 2
    probes = os.path.join(d, "probes.txt")
    with open(probes, "w") as f:
        f.write("gemm_seconds 0.2 triad_seconds 0.03\n")
    p = subprocess.run(["/usr/bin/python3", stats, "drift", out, probes, os.path.join(d, "drifted.txt")],
                       capture_output=True, text=True)
    assert p.returncode == 0 and [float(x) for x in p.stdout.split()[:2]] == [2.0, 2.0], p.stdout + p.stderr
    # an even count: the mean of the middle two (8.5e10 of the last two's 9e10 and 8e10), and a
    # count stays whole (cpu_cores 3 and 2: 2, the whole part of their mean, 2.5, which would not parse)
    three = os.path.join(d, "three.txt")
    with open(three, "w") as f:
        f.write(open(paths[1]).read().replace("cpu_cores 2", "cpu_cores 3"))
    p = subprocess.run(["/usr/bin/python3", stats, "combine", out, three, paths[2]], capture_output=True, text=True)
    got = {l.split()[0]: l.split()[1] for l in open(out) if not l.startswith("#") and l.split()}
    assert p.returncode == 0 and abs(float(got["peak_flops_fp32"]) - 8.5e10) < 1, (p.stderr, got)
    assert got["cpu_cores"] == "2", got
    # refused: a field that is not a number differing, or left out of one
    other = os.path.join(d, "other.txt")
    with open(other, "w") as f:
        f.write(open(paths[0]).read().replace("name CPU of vm, 1 thread a rank\n", ""))
    named = os.path.join(d, "named.txt")
    with open(named, "w") as f:
        f.write(open(paths[0]).read().replace("kind cpu", "kind gpu"))
    for bad, why in ((other, "'name' differ (CPU of vm, 1 thread a rank / (left out)) and it is not a number"),
                     (named, "'kind' differ (cpu / gpu)")):
        target = os.path.join(d, "refused.txt")
        p = subprocess.run(["/usr/bin/python3", stats, "combine", target, paths[1], bad], capture_output=True, text=True)
        assert p.returncode == 1 and why in p.stderr and not os.path.exists(target), (why, p.returncode, p.stderr)
    p = subprocess.run(["/usr/bin/python3", stats, "combine", out, paths[0]], capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout.split()[0] == "1", p.stdout + p.stderr
    fields = lambda path: [l.split(None, 1) for l in open(path).read().splitlines() if l and not l.startswith("#")]
    assert fields(out) == fields(paths[0]), (open(out).read(), open(paths[0]).read())
    print("    3 calibrations: each field their median, the link's 75% the widest; refusals named")


@test
def sweep_calibrations_spread_over_the_passes():
    """-calibrate -calibrations 2 -repeat 2 on the two quick layouts: the first calibration before
    the plan, the second before pass 2; -profile FILE their median (combine's header); the line
    "as calibrated" gives the figures of the planner's predictions from FILE against the saved
    times, and the table's predictions are FILE's scaled by the drift printed (worked out here:
    the planner run again on each layout); a line for each calibration alone; nothing left
    behind"""
    out = fresh_dir("sweep_calibrations")
    results, profile = os.path.join(out, "results.tsv"), os.path.join(out, "combined.txt")
    code, text, took = sweep_run(out, "-np", 2, "-filter", SWEEP_TWO, "-warmup", 1, "-steps", 1, "-repeat", 2,
                                 "-calibrate", "-calibrations", 2, "-profile", profile, "-save", results,
                                 "-figure", "none", timeout=300)
    assert code == 0, text
    order = [text.index(s) for s in ("calibrating (1 of 2): ", "[pass 1/2, 2/2]", "calibrating (2 of 2) before pass 2\n",
                                     "[pass 2/2, 1/2]", "calibrations: 2 of 2, the predictions from their median "
                                     "field by field (%s)" % profile)]
    assert order == sorted(order), text
    assert "The median, field by field, of 2 calibrations" in open(profile).read()
    for k, p in ((1, 1), (2, 2)):
        assert re.search(r"^calibration %d \(before pass %d\) alone, with its drift: sweep: 2 layouts, " % (k, p), text,
                         re.M), text
    with open(results) as f:
        header = f.readline().rstrip("\n").split("\t")
        rows = [dict(zip(header, line.rstrip("\n").split("\t"))) for line in f]
    # each layout predicted again from the combined profile, as the sweep's planner flags give it
    search = subprocess.run(["./dev/memory_planner", "-e", "d4", "-b", "2", "-t", "64", "-d", "256", "-device", "cpu",
                             "-search", "2", "-format", "json"], cwd=ROOT, capture_output=True, text=True)
    flags_of = {l["layout"]: sweep_stats_module().planner_flags(l) for l in json.loads(search.stdout)["layouts"]}
    def planner_seconds(layout, with_profile):
        p = subprocess.run(["./dev/memory_planner", "-e", "d4", "-b", "2", "-t", "64", "-d", "256", "-device", "cpu"] +
                           flags_of[layout] + ["-profile", with_profile, "-format", "json"], cwd=ROOT,
                           capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)["step_seconds"]
    measured = [float(r["measured_s"]) for r in rows]
    predicted = [planner_seconds(r["layout"], profile) for r in rows]
    as_calibrated = sweep_stats_module().summary_line(sweep_stats_module().sweep_stats(measured, predicted))
    assert "as calibrated, without the drift: " + as_calibrated + "\n" in text, (as_calibrated, text)
    # the table's predictions: the combined profile scaled by the drift the sweep printed (a probe
    # file made to give those factors against the combined lone medians; the factors have 6 decimals)
    m = re.search(r"^drift: 4 probes .*: the profile's GEMM rates x (\S+), its bandwidths x (\S+)$", text, re.M)
    lone = re.search(r"^#   lone medians: gemm_seconds (\S+) triad_seconds (\S+) ", open(profile).read(), re.M)
    assert m and lone, text
    probes, drifted = os.path.join(out, "probes.txt"), os.path.join(out, "drifted.txt")
    with open(probes, "w") as f:
        f.write("gemm_seconds %r triad_seconds %r\n" % (float(lone.group(1)) / float(m.group(1)),
                                                         float(lone.group(2)) / float(m.group(2))))
    stats = os.path.join(ROOT, "dev", "bench", "sweep_stats.py")
    assert subprocess.run(["/usr/bin/python3", stats, "drift", profile, probes, drifted]).returncode == 0
    for r in rows:
        want = planner_seconds(r["layout"], drifted)
        assert abs(float(r["predicted_s"]) - want) <= 1e-5 * want, (r["layout"], r["predicted_s"], want)
    os.remove(probes), os.remove(drifted)
    assert sorted(sweep_left_behind(out)) == ["combined.txt", "results.tsv"], sweep_left_behind(out)
    print("    two calibrations, before passes 1 and 2, as one profile: %s (%.0f s)" % (as_calibrated, took))
