# Megatron-LM's published weak-scaling table (Narayanan et al. 2021, arXiv:2104.04473, Table 1) as
# dev/bench/megatron_2021_weak_scaling.txt holds it, the numbers the step-time model is compared
# against. A typo there would move a comparison without anyone noticing, so the rows are checked
# against one another and against the paper's own formulas: the layout must divide the GPUs and
# the batch, the percentages must be the throughputs over the A100's 312 teraFLOP/s, equation (2)
# must give each row's parameter count, and equation (3) must give the paper's training-time
# estimate for the 1T row. Read by run_tests.py into its namespace (@test, ROOT, ...).

MEGATRON_TABLE = os.path.join(ROOT, "dev", "bench", "megatron_2021_weak_scaling.txt")
MEGATRON_COLUMNS = ("params_billions heads hidden layers tp pp gpus batch micro_batch seq vocab "
                    "interleaved_chunks achieved_tflops_per_gpu percent_of_peak").split()
A100_PEAK_TFLOPS = 312.0  # 16-bit dense peak of an A100, the paper's section 5


def megatron_rows(path=MEGATRON_TABLE):
    """the table's rows as dicts keyed by MEGATRON_COLUMNS (floats for the first and the last two,
    ints elsewhere), and the published aggregate petaFLOP/s that its header lists, in row order"""
    rows, aggregate = [], None
    for n, line in enumerate(open(path), 1):
        if line.startswith("# aggregate_petaflops:"):
            aggregate = [float(x) for x in line.split(":", 1)[1].split()]
        text = line.split("#", 1)[0].split()
        if not text:
            continue
        assert len(text) == len(MEGATRON_COLUMNS), "%s:%d: %d fields, expected %d (%s)" % (
            path, n, len(text), len(MEGATRON_COLUMNS), " ".join(MEGATRON_COLUMNS))
        row = {}
        for name, field in zip(MEGATRON_COLUMNS, text):
            floating = name in ("params_billions", "achieved_tflops_per_gpu", "percent_of_peak")
            row[name] = float(field) if floating else int(field)
        rows.append(row)
    return rows, aggregate


def megatron_flops(r):
    """FLOPs of one iteration, the paper's equation (3): GEMMs only, with the recomputed forward"""
    B, s, l, h, V = r["batch"], r["seq"], r["layers"], r["hidden"], r["vocab"]
    return 96.0 * B * s * l * h * h * (1 + s / (6.0 * h) + V / (16.0 * l * h))


def megatron_params(r):
    """parameters, the paper's equation (2)"""
    s, l, h, V = r["seq"], r["layers"], r["hidden"], r["vocab"]
    return 12.0 * l * h * h * (1 + 13.0 / (12 * h) + (V + s) / (12.0 * l * h))


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
