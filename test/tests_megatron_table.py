# Megatron-LM's published weak-scaling table (Narayanan et al. 2021, arXiv:2104.04473, Table 1) as
# dev/bench/megatron_2021_weak_scaling.txt holds it, the numbers the step-time model is compared
# against. A typo there would move a comparison without anyone noticing, so the rows are checked
# against one another and against the paper's own formulas: the layout must divide the GPUs and
# the batch, the percentages must be the throughputs over the A100's 312 teraFLOP/s, equation (2)
# must give each row's parameter count, and equation (3) must give the paper's training-time
# estimate for the 1T row. Then dev/bench/megatron_compare.py, which predicts every row with the
# step-time model: its arithmetic and its layouts, never its speeds. Read by run_tests.py into its
# namespace (@test, ROOT, make, ...).

# The table's reader and the paper's equations (2) and (3) live in dev/bench/megatron_compare.py,
# the comparison that uses them; the checks here read the same ones
sys.path.insert(0, os.path.join(ROOT, "dev", "bench"))
from megatron_compare import (MEGATRON_TABLE, MEGATRON_COLUMNS, A100_PEAK_TFLOPS, megatron_rows,  # noqa: E402
                              megatron_flops, megatron_params)


def check_megatron_layouts(path=MEGATRON_TABLE):
    rows, _ = megatron_rows(path)
    assert len(rows) == 10, "%s: %d rows, the paper's Table 1 has 10 (1.7B ... 1T)" % (path, len(rows))
    for r in rows:
        name = "%s: the %gB row" % (path, r["params_billions"])
        mp = r["tp"] * r["pp"]
        assert r["gpus"] % mp == 0, "%s: %d GPUs not a multiple of tp*pp = %d" % (name, r["gpus"], mp)
        dp = r["gpus"] // mp
        assert r["gpus"] % 8 == 0 and r["tp"] <= 8, "%s: whole 8-GPU nodes, tensor parallel inside one" % name
        assert r["hidden"] % r["heads"] == 0 and r["heads"] % r["tp"] == 0, (
            "%s: hidden %d, %d heads and tp %d do not split into whole heads" % (name, r["hidden"], r["heads"], r["tp"]))
        assert r["batch"] % (dp * r["micro_batch"]) == 0, "%s: batch %d is not dp %d x micro-batch %d x m" % (
            name, r["batch"], dp, r["micro_batch"])
        m = r["batch"] // (dp * r["micro_batch"])  # micro-batches a pipeline runs per iteration
        v = r["interleaved_chunks"]
        assert r["layers"] % (r["pp"] * v) == 0, "%s: %d layers do not split into pp %d x %d chunks" % (
            name, r["layers"], r["pp"], v)
        if v > 1:  # the interleaved schedule (section 2.2.2): pp > 2 in the code of the time, m a multiple of pp
            assert r["pp"] > 2 and m % r["pp"] == 0, "%s: interleaved with pp %d and %d micro-batches" % (
                name, r["pp"], m)
    # section 5.1: one vocabulary, "51,200 (multiple of 1024)", and one sequence length for all rows
    shared = sorted(set((r["seq"], r["vocab"]) for r in rows))
    assert len(shared) == 1 and shared[0][1] % 1024 == 0, "%s: (seq, vocab) differ between rows or the " \
        "vocabulary is not a multiple of 1024: %s" % (path, shared)
    sizes = [r["params_billions"] for r in rows]
    assert sizes == sorted(sizes), "%s: rows not in order of size: %s" % (path, sizes)


def check_megatron_throughputs(path=MEGATRON_TABLE):
    rows, aggregate = megatron_rows(path)
    assert aggregate and len(aggregate) == len(rows), "%s: the header's aggregate petaFLOP/s: %s" % (path, aggregate)
    for r, agg in zip(rows, aggregate):
        name = "%s: the %gB row" % (path, r["params_billions"])
        x = r["achieved_tflops_per_gpu"]
        # the percentage is printed whole (0.5) from a throughput that is printed whole
        # (0.5 teraFLOP/s = 0.16% of 312)
        pct = 100 * x / A100_PEAK_TFLOPS
        assert abs(pct - r["percent_of_peak"]) <= 0.5 + 100 * 0.5 / A100_PEAK_TFLOPS, (
            "%s: %g teraFLOP/s is %.2f%% of 312, the table says %g%%" % (name, x, pct, r["percent_of_peak"]))
        # aggregate = GPUs x per-GPU throughput, up to the per-GPU column's rounding (0.5 teraFLOP/s
        # a GPU) and the aggregate's own (0.05 petaFLOP/s)
        slack = r["gpus"] * 0.5 / 1000 + 0.05
        assert abs(r["gpus"] * x / 1000 - agg) <= slack, (
            "%s: %d GPUs x %g teraFLOP/s = %.1f petaFLOP/s, published %g" % (name, r["gpus"], x, r["gpus"] * x / 1000, agg))


def check_megatron_formulas(path=MEGATRON_TABLE):
    rows, _ = megatron_rows(path)
    for r in rows:
        name = "%s: the %gB row" % (path, r["params_billions"])
        p = megatron_params(r) / 1e9
        # within 5% (the smallest row: 1.652 printed as 1.7, 2.8%) ...
        assert abs(p / r["params_billions"] - 1) <= 0.05, "%s: equation (2) gives %.3fB" % (name, p)
        # ... and, closer, equation (2) rounds to the printed tenth in every row: a layer more or
        # less moves the count by one layer's 12 h^2 (0.064B in the smallest row, 7.9B in 1T)
        assert abs(p - r["params_billions"]) <= 0.05, "%s: equation (2) gives %.3fB, not %g to a tenth" % (
            name, p, r["params_billions"])
    # Section 5.1: the 1T model on 3072 GPUs at 163 teraFLOP/s trains on 450 billion tokens in
    # 84 days (the paper uses the shortcut 8TP/(nX)). With equation (3) itself: iterations
    # T/(B s) times F/(n X) seconds each. 3%: the shortcut drops terms worth 1.3% at this size,
    # the days are printed whole (0.6%), the throughput whole (0.3%).
    r = rows[-1]
    step = megatron_flops(r) / (r["gpus"] * r["achieved_tflops_per_gpu"] * 1e12)  # seconds an iteration
    days = 450e9 / (r["batch"] * r["seq"]) * step / 86400
    assert abs(days / 84 - 1) <= 0.03, "%s: equation (3) gives %.1f days for the 1T row, the paper 84" % (path, days)
    # what a step-time model is to predict for this row: F over gpus x the per-GPU throughput
    print("    1T row: F = %.3e FLOPs an iteration, %.1f s an iteration at %g teraFLOP/s a GPU, %.1f days "
          "for 450B tokens" % (megatron_flops(r), step, r["achieved_tflops_per_gpu"], days))


@test
def megatron_table_layouts_divide():
    """dev/bench/megatron_2021_weak_scaling.txt: every row's tp x pp divides its GPUs into whole
    8-GPU nodes, dp x micro-batch divides the batch, the layers split into pp x chunks, and an
    interleaved row has pp > 2 and a multiple of pp micro-batches; one sequence length and one
    vocabulary (a multiple of 1024) for all rows"""
    check_megatron_layouts()


@test
def megatron_table_throughputs_agree():
    """each row's percent of peak is its teraFLOP/s over 312, and GPUs x teraFLOP/s is the
    published aggregate petaFLOP/s, both up to the printed rounding"""
    check_megatron_throughputs()


@test
def megatron_table_paper_formulas():
    """equation (2) gives each row's parameter count within 5% (and to the printed tenth), and equation
    (3) gives the paper's 84 days for the 1T row on 450B tokens within 3%"""
    check_megatron_formulas()


# ---------------------------------------------------------------------------------------------
# dev/bench/megatron_compare.py: each row through dev/memory_planner on a100-80gb. What is checked
# is what can be known without the model: that each row ran with the row's own layout, that the
# teraFLOP/s column is equation (3) over the planner's step and the GPUs, that the summary counts
# the printed errors. How close the prediction lands is printed, never asserted.

def megatron_compare_run(fmt):
    make(["dev/memory_planner"])
    cmd = [sys.executable, os.path.join(ROOT, "dev", "bench", "megatron_compare.py"), "--format", fmt]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p.stdout


def paper_flops(r):
    """equation (3) written out from the paper's Appendix, term by term (not megatron_flops): a
    layer's forward GEMMs QKV 6Bsh^2, scores 2Bs^2h, over values 2Bs^2h, projection 2Bsh^2, MLP
    16Bsh^2, run 4 times (forward, recomputed forward, a backward of twice); the logits 6BshV"""
    B, s, l, h, V = r["batch"], r["seq"], r["layers"], r["hidden"], r["vocab"]
    layer = 6 * B * s * h * h + 2 * B * s * s * h + 2 * B * s * s * h + 2 * B * s * h * h + 16 * B * s * h * h
    return 4 * l * layer + 6 * B * s * h * V


def flag_value(cmd, flag):
    return cmd[cmd.index(flag) + 1] if flag in cmd else None


@test
def megatron_compare_rows_and_equation_3():
    """dev/bench/megatron_compare.py --format json: every row of the table accepted by the planner
    with the row's layout (tp, pp, dp = gpus/(tp pp), micro-batch, batch x 2048 tokens, -r 2,
    interleaved chunks where the row has them; the planner's ranks, micro-batches and parameter
    count those of the row, the last equation (2) + lnf's 2h), the planner's own step (the printed
    command run again), and teraFLOP/s = equation (3) FLOPs / (step x GPUs) with its error"""
    out = json.loads(megatron_compare_run("json"))
    rows, _ = megatron_rows()
    results = out["results"]
    assert len(results) == len(rows), "%d results for %d rows" % (len(results), len(rows))
    for r, res in zip(rows, results):
        name = "the %gB row" % r["params_billions"]
        assert res["row"] == r, "%s: the script compared %s" % (name, res["row"])
        assert res["refused"] is None, "%s: the planner refused its layout: %s" % (name, res["refused"])
        cmd = res["command"]
        dp = r["gpus"] // (r["tp"] * r["pp"])
        expected = {"-tp": r["tp"], "-pp": r["pp"], "-dp": dp, "-b": r["micro_batch"], "-t": r["seq"],
                    "-d": r["batch"] * r["seq"], "-r": 2, "-profile": "a100-80gb", "-gpus_per_node": 8, "-trainer": "3d",
                    "-vp": r["interleaved_chunks"] if r["interleaved_chunks"] > 1 else None,
                    "-sched": "interleaved" if r["interleaved_chunks"] > 1 else None}
        for flag, want in expected.items():
            got = flag_value(cmd, flag)
            assert got == (None if want is None else str(want)), "%s: %s %s, expected %s: %s" % (
                name, flag, got, want, " ".join(cmd))
        m = r["batch"] // (dp * r["micro_batch"])
        assert (res["ranks"], res["micro_batches"]) == (r["gpus"], m), "%s: the planner planned %d ranks and %d " \
            "micro-batches, the row has %d GPUs and %d" % (name, res["ranks"], res["micro_batches"], r["gpus"], m)
        model = res["model"]
        assert (model["layers"], model["channels"], model["heads"]) == (r["layers"], r["hidden"], r["heads"]), (name, model)
        # the model has the paper's vocabulary and sequence: equation (2)'s parameters
        # (12 l h^2 + 13 l h + (V + s) h, exact in integers) and the final LayerNorm's 2h
        eq2 = 12 * r["layers"] * r["hidden"] ** 2 + 13 * r["layers"] * r["hidden"] + (r["vocab"] + r["seq"]) * r["hidden"]
        assert model["parameters"] == eq2 + 2 * r["hidden"], "%s: %d parameters, equation (2) + 2h = %d" % (
            name, model["parameters"], eq2 + 2 * r["hidden"])
        # the planner itself, once more: the script reports its step unchanged
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
        step = json.loads(p.stdout)["step_seconds"]
        assert res["step_seconds"] == step, "%s: the script says %r s, the planner %r" % (name, res["step_seconds"], step)
        # 1e-12: two float roundings of one quotient (equation (3) in integers is exact)
        want = paper_flops(r) / (step * r["gpus"]) / 1e12
        assert abs(res["tflops"] / want - 1) <= 1e-12, "%s: %r teraFLOP/s, equation (3) / (%r s x %d GPUs) = %r" % (
            name, res["tflops"], step, r["gpus"], want)
        error = (want - r["achieved_tflops_per_gpu"]) / r["achieved_tflops_per_gpu"]
        assert abs(res["error"] - error) <= 1e-12, "%s: error %r, expected %r" % (name, res["error"], error)
        print("    %6gB  %8.3f s  predicted %6.1f  published %5g teraFLOP/s  (%+.1f%%)" % (
            r["params_billions"], step, want, r["achieved_tflops_per_gpu"], 100 * error))


@test
def megatron_compare_prints_the_table():
    """dev/bench/megatron_compare.py prints a line a row (its size, GPUs, layout, step, predicted and
    published teraFLOP/s, error and the parts) and a summary whose count within 15%, median and
    worst error are those of the JSON's errors"""
    text = megatron_compare_run("text")
    rows, _ = megatron_rows()
    results = json.loads(megatron_compare_run("json"))["results"]
    lines = text.splitlines()
    for r, res in zip(rows, results):
        dp = r["gpus"] // (r["tp"] * r["pp"])
        layout = "t%d p%d d%d b%d m%d v%d" % (r["tp"], r["pp"], dp, r["micro_batch"],
                                            r["batch"] // (dp * r["micro_batch"]), r["interleaved_chunks"])
        start = "%6gB %5d %s" % (r["params_billions"], r["gpus"], layout)
        found = [l for l in lines if l.startswith(start)]
        assert len(found) == 1, "no line (or several) starting %r:\n%s" % (start, text)
        fields = found[0][len(start):].split()
        # step, predicted, published, error, then | gemm attention memory | tp pp dp embedding | bubble once
        assert float(fields[0]) == round(res["step_seconds"], 3), (found[0], res["step_seconds"])
        assert float(fields[1]) == round(res["tflops"], 1) and float(fields[2]) == r["achieved_tflops_per_gpu"], found[0]
        assert fields[3] == "%+.1f%%" % (100 * res["error"]), found[0]
        parts = res["time_parts"]
        numbers = [float(x) for x in [x for x in fields[4:] if x != "|"][:9]]
        shown = [parts["gemm"], parts["attention"], parts["memory"], parts["comm_exposed"]["tp"],
                 parts["comm_exposed"]["pp"], parts["comm_exposed"]["dp"], parts["comm_exposed"]["embedding"],
                 parts["bubble"], parts["once"]]
        assert numbers == [round(x, 3) for x in shown], "%s: parts %s, the JSON's %s" % (found[0], numbers, shown)
    errors = sorted(abs(res["error"]) for res in results)
    within = sum(1 for e in errors if e <= 0.15)
    median = (errors[4] + errors[5]) / 2  # ten rows
    summary = [l for l in lines if l.startswith("megatron: ")]
    assert len(summary) == 1, text
    m = re.match(r"megatron: 10 rows, (\d+) within 15% of the published teraFLOP/s, median error ([\d.]+)%, "
                 r"worst ([\d.]+)% \(the ([\d.]+)B row\)$", summary[0])
    assert m, summary[0]
    assert int(m.group(1)) == within, (summary[0], errors)
    assert m.group(2) == "%.1f" % (100 * median) and m.group(3) == "%.1f" % (100 * errors[-1]), (summary[0], errors)
    print("    " + summary[0])


# ---------------------------------------------------------------------------------------------
# -megatron 1: the planner prices the step as Megatron-LM (2021) ran it. What it adds is known by
# hand: dropout on the attention probabilities (forward and backward, each reading and writing the
# B x NH x T x T probabilities in floatX and a 1-byte mask: attention's part, on the unfused path
# that Megatron ran priced by its bytes) and on the two residual branches (the same on the B T x C
# outputs: the memory part), and, with -r 2, the layer's last GEMM (fcproj, 2 N 4C C FLOPs) rerun
# before its backward. On a profile whose GEMMs run at 1e12 FLOP/s (every efficiency 1, every GEMM
# large) and whose memory moves MEMORY_RATE bytes a second, the planner's attention, memory and
# gemm parts must grow by exactly those bytes and FLOPs over those rates. (Two memory rates: at
# 1e9 the GEMMs of this small model are bound by their bytes, at 1e15 by their FLOPs.)
MEGATRON_TEST_PROFILE = """name round numbers for -megatron
kind cuda
peak_flops_fp32 1e12
peak_flops_bf16 1e12
memory_bandwidth_bytes_per_s MEMORY_RATE
memory_bytes 1e12
efficiency_matmul_large 1
efficiency_matmul_small 1
matmul_small_flops 0
efficiency_attention 1
efficiency_memory 1
intra_node_latency_s 1e-6
intra_node_bandwidth_bytes_per_s 1e11
inter_node_latency_s 1e-6
inter_node_bandwidth_bytes_per_s 1e11
"""


@test
def megatron_flag_adds_dropout_and_the_whole_layer_rerun():
    """dev/memory_planner -megatron 1 against -megatron 0, one rank, bf16, cuBLAS attention: the
    attention part grows by L 2 B NH T^2 (2X + 1) bytes over the bandwidth (the probabilities'
    dropout, forward and backward) and the memory part by L 4 B T C (2X + 1) (the residual
    dropouts'), each forward once more under -r 2's rerun; the gemm part by fcproj's rerun,
    L 2 (B T) 4C C FLOPs over the peak (nothing at -r 0)"""
    make(["dev/memory_planner"])
    d = os.path.join(TMP, "megatron_flag")
    os.makedirs(d, exist_ok=True)
    L, C, NH, B, T, X = 2, 128, 4, 2, 128, 2

    def parts(memory_rate, *flags):
        profile = os.path.join(d, "round_%g.txt" % memory_rate)
        with open(profile, "w") as f:
            f.write(MEGATRON_TEST_PROFILE.replace("MEMORY_RATE", "%g" % memory_rate))
        cmd = [os.path.join(ROOT, "dev", "memory_planner"), "-e", "%d/%d/%d/%d" % (L, C, NH, T), "-b", B, "-t", T,
               "-precision", "bf16", "-attention", "cublas", "-profile", profile, "-format", "json"] + list(flags)
        p = subprocess.run([str(a) for a in cmd], capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
        return json.loads(p.stdout)["time_parts"]

    scores, rows = B * NH * T * T, B * T
    forward_scores = scores * (2 * X + 1)                   # a layer's dropout on the probabilities, forward
    forward_bytes = 2 * rows * C * (2 * X + 1)              # a layer's two residual dropouts, forward
    backward_bytes = forward_bytes                            # and their backward: the same bytes
    for r, rerun in ((0, 0), (2, 1)):
        plain, megatron = parts(1e9, "-r", r, "-megatron", 0), parts(1e9, "-r", r, "-megatron", 1)
        want_memory = L * (forward_bytes * (1 + rerun) + backward_bytes) / 1e9
        got_memory = megatron["memory"] - plain["memory"]
        # (1e-6 of the parts: the JSON prints each with 6 significant digits, 5e-7 of it at most)
        assert abs(got_memory - want_memory) <= 1e-6 * (plain["memory"] + megatron["memory"]), \
            "-r %d: memory grew %.9g s, expected %.9g" % (r, got_memory, want_memory)
        want_attention = L * forward_scores * (2 + rerun) / 1e9
        got_attention = megatron["attention"] - plain["attention"]
        assert abs(got_attention - want_attention) <= 1e-6 * (plain["attention"] + megatron["attention"]), \
            "-r %d: attention grew %.9g s, expected %.9g" % (r, got_attention, want_attention)
        plain, megatron = parts(1e15, "-r", r, "-megatron", 0), parts(1e15, "-r", r, "-megatron", 1)
        want_gemm = L * rerun * 2 * rows * 4 * C * C / 1e12
        got_gemm = megatron["gemm"] - plain["gemm"]
        assert abs(got_gemm - want_gemm) <= 1e-6 * (plain["gemm"] + megatron["gemm"]), \
            "-r %d: gemm grew %.9g s, expected %.9g" % (r, got_gemm, want_gemm)
        print("    -r %d: -megatron 1 adds memory %.3f us, gemm %.3f us (by hand: %.3f, %.3f)" % (
            r, got_memory * 1e6, got_gemm * 1e6, want_memory * 1e6, want_gemm * 1e6))
