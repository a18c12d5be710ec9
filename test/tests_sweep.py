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
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n", "the figure is no PNG"
    assert took < 60, "the 2-layout sweep took %.0f s (about 20 on an idle 2-core machine)" % took


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
    code, text, _ = sweep_run(out, "-np", 2, "-b", "two")
    assert code == 1 and "error: -b two: expected a positive whole number" in text, text
    code, text, _ = sweep_run(out, "-np", 2, "-filter", "no such layout")
    assert code == 1 and re.search(r"none of the search's \d+ layouts matches -filter 'no such layout'", text), text
    assert not sweep_left_behind(out), sweep_left_behind(out)


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
                            start_new_session=True)  # (its own session: the signal goes to the script, as a terminal's would)
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
