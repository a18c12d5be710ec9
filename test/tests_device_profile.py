# Device profiles (llmc/device_profile.h) and the CPU's calibration (dev/bench/calibrate): the
# numbers the step-time model (issue 61) turns a step's kernels and messages into seconds with.
# The built-in GPU profiles are held to the datasheets' figures, written here from NVIDIA's pages
# (not from the header); a profile with any one thing wrong is refused with its file, line and
# field named; calibrate's two-rank run writes a profile that reads back with plausible numbers
# (its times are this machine's and are never asserted); its alpha-beta fit is held to a float64
# least-squares reference. Read by run_tests.py into its namespace (its helpers: @test, make,
# mpirun, fresh_dir).

CALIBRATE = "./dev/bench/calibrate"


def calibrate_built():
    p = make(["dev/bench/calibrate"])
    assert p.returncode == 0, p.stdout.decode("utf-8", "replace")[-3000:]


def calibrate_cli(*args):
    """(exit code, stdout + stderr) of calibrate without MPI (-check, -fit)"""
    p = subprocess.run([CALIBRATE] + list(args), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=60)
    return p.returncode, p.stdout.decode("utf-8", "replace")


def check_profile_lines(d, label, lines):
    """(path, exit code, output) of calibrate -check on a profile of these lines, written to d"""
    path = os.path.join(d, label.replace(" ", "_") + ".txt")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    code, out = calibrate_cli("-check", path)
    return path, code, out


def assert_out_of_range_refused(d, base, given, cases):
    """each (field, value, allowed) of cases, written after base and the lines of given (but the
    field's own), is refused by calibrate -check naming the file, the line, the field, the value
    and the range allowed"""
    for field, value, allowed in cases:
        extra = [t for t in given if t.split()[0] != field] + ["%s %s" % (field, value)]
        path, code, out = check_profile_lines(d, "range %s" % field, base + extra)
        want = "%s:%d: %s %s is out of range %s" % (path, len(base) + len(extra), field, value, allowed)
        assert code == 1 and want in out, "%s %s: exit %d, expected %r:\n%s" % (field, value, code, want, out)


def profile_values(text):
    """{key: value} of a profile as calibrate -check prints it (numbers as floats)"""
    values = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        try:
            values[key] = float(value)
        except ValueError:
            values[key] = value
    return values


# The datasheets (NVIDIA's H100, H200 and A100 pages; llmc/device_profile.h cites them):
# dense bf16 is half the "with sparsity" figure; NVLink's total over both directions is halved
# to one direction; InfiniBand per GPU: NDR 400 Gb/s = 50 GB/s, HDR 200 Gb/s = 25 GB/s.
DATASHEETS = {
    "h100-sxm": dict(peak_flops_bf16=1979e12 / 2, peak_flops_fp32=67e12, memory_bandwidth_bytes_per_s=3.35e12,
                     memory_bytes=80e9, intra_node_bandwidth_bytes_per_s=900e9 / 2,
                     inter_node_bandwidth_bytes_per_s=400e9 / 8),
    "h200": dict(peak_flops_bf16=1979e12 / 2, peak_flops_fp32=67e12, memory_bandwidth_bytes_per_s=4.8e12,
                 memory_bytes=141e9, intra_node_bandwidth_bytes_per_s=900e9 / 2,
                 inter_node_bandwidth_bytes_per_s=400e9 / 8),
    "a100-80gb": dict(peak_flops_bf16=624e12 / 2, peak_flops_fp32=19.5e12, memory_bandwidth_bytes_per_s=2.039e12,
                      memory_bytes=80e9, intra_node_bandwidth_bytes_per_s=600e9 / 2,
                      inter_node_bandwidth_bytes_per_s=200e9 / 8),
}
EFFICIENCIES = ["efficiency_matmul_large", "efficiency_matmul_small", "efficiency_attention", "efficiency_memory",
                "efficiency_link"]


@test
def device_profile_builtins_are_the_datasheets():
    """h100-sxm, h200 and a100-80gb read, each peak, bandwidth and memory equal to the datasheet's
    figure (1979 / 2 = 989.5 TFLOP/s against the header's 989.4, NVIDIA's own rounding of the dense
    rate: relative 1e-3), every efficiency in (0, 1], 8 GPUs a node; and a profile printed by
    -check reads back to the same print (the format's printer and parser agree)"""
    calibrate_built()
    d = fresh_dir("profile_builtins")
    for name, sheet in DATASHEETS.items():
        code, out = calibrate_cli("-check", name)
        assert code == 0, out
        v = profile_values(out)
        assert v["kind"] == "cuda" and v["gpus_per_node"] == 8, out
        for key, want in sheet.items():
            assert abs(v[key] - want) <= 1e-3 * want, "%s: %s %g, the datasheet %g" % (name, key, v[key], want)
        for key in EFFICIENCIES:
            assert 0 < v[key] <= 1, "%s: %s %g" % (name, key, v[key])
        assert 0 < v["intra_node_latency_s"] < v["inter_node_latency_s"] < 1e-4, out
        assert v["matmul_small_flops"] > 0, out
        path = os.path.join(d, name + ".txt")
        with open(path, "w") as f:
            f.write(out)
        code, again = calibrate_cli("-check", path)
        assert code == 0 and again == out, "%s printed and read back:\n%s\nagainst\n%s" % (name, again, out)
    # the three differ where their chips differ
    h100, h200, a100 = (profile_values(calibrate_cli("-check", n)[1]) for n in DATASHEETS)
    assert h100["peak_flops_bf16"] == h200["peak_flops_bf16"] > a100["peak_flops_bf16"]
    print("    h100-sxm, h200, a100-80gb: datasheet peaks, bandwidths, memory and links; efficiencies in (0, 1]")


@test
def a100_attention_efficiency_is_the_flash_kernels_measured_fraction():
    """the a100-80gb profile's efficiency_attention prices only flash attention (the unfused path,
    Megatron's, is priced by its GEMMs and passes): it is this project's flash kernels' measured
    fraction, the H200's (and H100's) 0.13, not a figure for the unfused path. On an A100 a d12
    layout's attention part is then the useful causal FLOPs over 312e12 x 0.13 with -attention
    flash, and with -attention cublas the same whatever efficiency_attention says"""
    calibrate_built()
    make(["dev/memory_planner"])
    eff = {name: profile_values(calibrate_cli("-check", name)[1])["efficiency_attention"] for name in DATASHEETS}
    assert eff["a100-80gb"] == eff["h200"] == eff["h100-sxm"] == 0.13, eff
    L, C, NH, B, T = 12, 768, 12, 4, 1024
    useful = 3 * 2 * T * (T + 1) * C * B * L  # forward and twice it backward (no -r)
    base = ["-e", "d12", "-b", B, "-t", T, "-precision", "bf16", "-format", "json"]
    code, text = planner(*(base + ["-profile", "a100-80gb", "-attention", "flash"]))
    assert code == 0, text[-1000:]
    got, want = json.loads(text)["time_parts"]["attention"], useful / (312e12 * 0.13)
    assert abs(got / want - 1) <= 1e-6, (got, want)
    code, good = calibrate_cli("-check", "a100-80gb")
    d = fresh_dir("a100_attention")
    parts = []
    for e in ("0.13", "0.5"):
        path = os.path.join(d, "a100_%s.txt" % e)
        with open(path, "w") as f:
            f.write("".join(("efficiency_attention %s\n" % e) if l.startswith("efficiency_attention") else l + "\n"
                            for l in good.splitlines()))
        code, text = planner(*(base + ["-profile", path, "-attention", "cublas"]))
        assert code == 0, text[-1000:]
        parts.append(json.loads(text)["time_parts"]["attention"])
    assert parts[0] == parts[1] > 0, parts
    print("    a100 flash attention %.2f ms a step (useful FLOPs at 0.13 of 312 TFLOP/s); cublas %.2f ms at any efficiency" % (
        got * 1e3, parts[0] * 1e3))


@test
def device_profile_refused_with_file_line_and_field():
    """a profile with one thing wrong (a missing field, an unknown key, a negative bandwidth, an
    efficiency over 1 or of 0, a key twice, a value that is not a plain number: units, nan, inf,
    hex, a comma; a kind other than cpu or cuda; half a GPU a node; an all-reduce latency without
    its bandwidth) is refused: exit 1, the message names the file, the line the defect is on and
    the field; a name that is neither a built-in nor a file is named too"""
    calibrate_built()
    d = fresh_dir("profile_refused")
    code, good = calibrate_cli("-check", "h100-sxm")
    assert code == 0, good
    lines = good.splitlines()

    def line_of(key):
        return next(i for i, l in enumerate(lines) if l.split()[0] == key)

    def replaced(key, value):
        """the profile with key's value replaced: (text, its 1-based line)"""
        i = line_of(key)
        return "\n".join(lines[:i] + ["%s %s" % (key, value)] + lines[i + 1:]) + "\n", i + 1

    cases = []  # (label, text, line or None, words the message must hold)
    i = line_of("memory_bytes")
    cases.append(("missing field", "\n".join(lines[:i] + lines[i + 1:]) + "\n", None, ["missing field memory_bytes"]))
    cases.append(("unknown key", good + "peak_flops_fp16 1e15\n", len(lines) + 1, ["unknown key 'peak_flops_fp16'"]))
    text, n = replaced("memory_bandwidth_bytes_per_s", "-3.35e12")
    cases.append(("negative", text, n, ["memory_bandwidth_bytes_per_s", "out of range"]))
    text, n = replaced("efficiency_matmul_large", "1.2")
    cases.append(("efficiency over 1", text, n, ["efficiency_matmul_large", "out of range [0.001, 1]"]))
    text, n = replaced("efficiency_attention", "0")
    cases.append(("efficiency 0", text, n, ["efficiency_attention", "out of range [0.001, 1]"]))
    cases.append(("duplicate", good + "# again\nkind cuda\n", len(lines) + 2,
                  ["kind given twice (first on line %d)" % (line_of("kind") + 1)]))
    for bad in ("989.4TFLOPs", "nan", "inf", "0x1p50", "989,4e12", "1e12 2e12"):
        text, n = replaced("peak_flops_bf16", bad)
        cases.append(("not a number: %s" % bad, text, n, ["peak_flops_bf16 '%s' is not a number" % bad]))
    text, n = replaced("kind", "tpu")
    cases.append(("kind", text, n, ["kind 'tpu': expected cpu or cuda"]))
    text, n = replaced("gpus_per_node", "2.5")
    cases.append(("half a GPU", text, n, ["gpus_per_node 2.5 is not a whole number"]))
    text, n = replaced("intra_node_latency_s", "2")  # (microseconds written as seconds)
    cases.append(("latency of seconds", text, n, ["intra_node_latency_s 2 is out of range"]))
    cases.append(("all-reduce half given", good + "intra_node_allreduce_latency_s 1e-6\n", len(lines) + 1,
                  ["intra_node_allreduce_latency_s without intra_node_allreduce_bandwidth_bytes_per_s"]))
    for k, (label, text, n, words) in enumerate(cases):
        path = os.path.join(d, "bad_%d.txt" % k)
        with open(path, "w") as f:
            f.write(text)
        code, out = calibrate_cli("-check", path)
        assert code == 1, "%s: exit %d, expected 1:\n%s" % (label, code, out)
        where = "%s:%d: " % (path, n) if n else "%s: " % path
        assert ("error: " + where) in out, "%s: the message does not start with %r:\n%s" % (label, where, out)
        for w in words:
            assert w in out, "%s: %r not in the message:\n%s" % (label, w, out)
    code, out = calibrate_cli("-check", "h300")
    assert code == 1 and "h300: not a built-in profile (h100-sxm, h200, a100-80gb) and not a file" in out, out
    print("    %d bad profiles refused, each with its file, line and field" % len(cases))


@test
def device_profile_absurd_values_refused_and_the_bounds_give_finite_times():
    """values that would turn the step-time model's seconds into inf or nan are refused on reading,
    with the file, the line, the field and its allowed range: a bandwidth of 1e300 or 1e-300, a peak
    of 0, -1 or 1e-300, an efficiency over 1 or of 1e-300, a fraction of a lone rank's rate of 0,
    nan (not a number). A profile with every field at the slow end of its range (the least peak,
    bandwidth and efficiency, the longest latency) still gives the planner a finite, positive step
    on a d12 layout of every group (dp x tp x pp, -z 1), and the fastest end a positive one"""
    calibrate_built()
    make(["dev/memory_planner"])
    d = fresh_dir("profile_absurd")
    code, good = calibrate_cli("-check", "h100-sxm")
    assert code == 0, good
    lines = good.splitlines()

    def replaced(key, value):
        i = next(k for k, l in enumerate(lines) if l.split()[0] == key)
        return "\n".join(lines[:i] + ["%s %s" % (key, value)] + lines[i + 1:]) + "\n", i + 1

    cases = [("memory_bandwidth_bytes_per_s", "1e300", "[1e+06, 1e+15]"),
             ("memory_bandwidth_bytes_per_s", "1e-300", "[1e+06, 1e+15]"),
             ("inter_node_bandwidth_bytes_per_s", "1e300", "[1, 1e+15]"),
             ("peak_flops_bf16", "0", "[1e+06, 1e+18]"), ("peak_flops_fp32", "-1", "[1e+06, 1e+18]"),
             ("peak_flops_fp32", "1e-300", "[1e+06, 1e+18]"), ("efficiency_memory", "1.5", "[0.001, 1]"),
             ("efficiency_matmul_small", "1e-300", "[0.001, 1]"), ("host_flops_fp32", "0", "[1e+06, 1e+18]")]
    for k, (key, value, allowed) in enumerate(cases):
        text, n = replaced(key, value)
        path = os.path.join(d, "absurd_%d.txt" % k)
        with open(path, "w") as f:
            f.write(text)
        code, out = calibrate_cli("-check", path)
        want = "error: %s:%d: %s %s is out of range %s" % (path, n, key, value, allowed)
        assert code == 1 and want in out, "%s %s: exit %d, expected %r in:\n%s" % (key, value, code, want, out)
    text, n = replaced("efficiency_link", "nan")
    path = os.path.join(d, "nan.txt")
    with open(path, "w") as f:
        f.write(text)
    code, out = calibrate_cli("-check", path)
    assert code == 1 and "%s:%d: efficiency_link 'nan' is not a number" % (path, n) in out, out
    cpu = "kind cpu\ncpu_cores 2\ncpu_threads 1\ncpu_gemm_fraction_2_ranks 0\n"
    path = os.path.join(d, "fraction.txt")
    with open(path, "w") as f:
        f.write("".join(l + "\n" for l in lines if l.split()[0] not in ("kind",) and not l.startswith(("host_", "pcie_"))) + cpu)
    code, out = calibrate_cli("-check", path)
    assert code == 1 and "cpu_gemm_fraction_2_ranks 0 is out of range [0.001, 1]" in out, out
    # every field at its slow end, then at its fast end: finite, positive steps
    ends = {"slow": dict(peak_flops_fp32=1e6, peak_flops_bf16=1e6, memory_bandwidth_bytes_per_s=1e6,
                         efficiency_matmul_large=1e-3, efficiency_matmul_small=1e-3, efficiency_attention=1e-3,
                         efficiency_memory=1e-3, intra_node_latency_s=1, intra_node_bandwidth_bytes_per_s=1,
                         inter_node_latency_s=1, inter_node_bandwidth_bytes_per_s=1, efficiency_link=1e-3,
                         host_flops_fp32=1e6, host_memory_bandwidth_bytes_per_s=1e6, pcie_latency_s=1,
                         pcie_bandwidth_bytes_per_s=1),
            "fast": dict(peak_flops_fp32=1e18, peak_flops_bf16=1e18, memory_bandwidth_bytes_per_s=1e15,
                         efficiency_matmul_large=1, efficiency_matmul_small=1, efficiency_attention=1,
                         efficiency_memory=1, intra_node_latency_s=1e-300, intra_node_bandwidth_bytes_per_s=1e15,
                         inter_node_latency_s=1e-300, inter_node_bandwidth_bytes_per_s=1e15, efficiency_link=1,
                         host_flops_fp32=1e18, host_memory_bandwidth_bytes_per_s=1e15, pcie_latency_s=1e-300,
                         pcie_bandwidth_bytes_per_s=1e15)}
    for end, values in ends.items():
        path = os.path.join(d, end + ".txt")
        with open(path, "w") as f:
            f.write("".join("%s %s\n" % (l.split()[0], values[l.split()[0]]) if l.split()[0] in values else l + "\n"
                            for l in lines))
        code, text = planner("-e", "d12", "-b", 4, "-t", 1024, "-dp", 2, "-tp", 2, "-pp", 2, "-z", 1, "-d", 4 * 1024 * 2 * 4,
                             "-offload", 0, "-profile", path, "-format", "json")
        assert code in (0, 2), text[-2000:]
        step = json.loads(text)["step_seconds"]
        assert math.isfinite(step) and step > 0, (end, step)
        print("    %s end of every range: a d12 step of %.3g s" % (end, step))
    print("    %d absurd values refused with their range, nan and a fraction of 0 too" % len(cases))


@test
def device_profile_sharing_fields_refused_missing_or_out_of_range():
    """calibrate's fields for what sharing the host does beyond the fractions (a collective's wait
    for ranks arriving apart, the cache and the in-cache fraction of the triad, the GEMM beyond the
    cache), and the optimizer's efficiency: each out of its range is refused with file, line, field
    and range; cpu_cache_bytes, efficiency_matmul_beyond_cache and cpu_memory_cached_fraction_2_ranks
    come together, so one without the others is refused naming the one missing; a profile without
    any of them (as written before they existed) reads, printing none of them (the model then
    prices as before)"""
    calibrate_built()
    d = fresh_dir("profile_sharing_fields")
    with open("dev/profiles/cpu-this-machine.txt") as f:
        base = [l.rstrip("\n") for l in f if not l.startswith("#") and l.split()[0] not in (
            "cpu_meeting_fraction_2_ranks", "cpu_meeting_fraction_4_ranks", "cpu_meeting_fraction_8_ranks",
            "cpu_cache_bytes", "efficiency_matmul_beyond_cache", "cpu_memory_cached_fraction_2_ranks",
            "cpu_memory_cached_fraction_4_ranks", "cpu_memory_cached_fraction_8_ranks", "efficiency_optimizer")]
    trio = ["cpu_cache_bytes 33554432", "efficiency_matmul_beyond_cache 0.8", "cpu_memory_cached_fraction_2_ranks 0.9"]

    def check(label, extra):
        return check_profile_lines(d, label, base + extra)

    path, code, out = check("older", [])
    assert code == 0 and "cpu_cache_bytes" not in out and "cpu_meeting_fraction" not in out, out
    assert "efficiency_optimizer" not in out, out
    path, code, out = check("all", trio + ["cpu_meeting_fraction_2_ranks 1e-3", "cpu_memory_cached_fraction_8_ranks 0.2",
                                           "efficiency_optimizer 1.25"])
    assert code == 0 and "cpu_meeting_fraction_2_ranks 0.001" in out and "cpu_cache_bytes 33554432" in out, out
    assert "efficiency_optimizer 1.25" in out, out  # (past 1: the triad's bandwidth does not count its write's reads)
    for k, field in enumerate(trio):
        given = [t for t in trio if t != field]
        path, code, out = check("without %d" % k, given)
        first_given = next(t.split()[0] for t in trio if t != field)  # (the message names the first given ...)
        want = "%s without %s" % (first_given, field.split()[0])  # (... and the one missing)
        assert code == 1 and ("error: %s:" % path) in out and want in out, "without %s: exit %d, expected %r:\n%s" % (
            field, code, want, out)
    # a measured collective's two numbers come together: ZeRO's reduce-scatter over 4 ranks without its bandwidth
    rs_base = [l for l in base if not l.startswith("reducescatter_4_ranks_")]
    path = os.path.join(d, "reduce_scatter_half.txt")
    with open(path, "w") as f:
        f.write("\n".join(rs_base + ["reducescatter_4_ranks_latency_s 2e-5"]) + "\n")
    code, out = calibrate_cli("-check", path)
    assert code == 1 and "reducescatter_4_ranks_latency_s without reducescatter_4_ranks_bandwidth_bytes_per_s" in out, out
    assert_out_of_range_refused(d, base, trio, (("cpu_meeting_fraction_4_ranks", "2", "[0, 1]"),
                                                ("cpu_meeting_fraction_8_ranks", "-1e-3", "[0, 1]"),
                                                ("cpu_cache_bytes", "1e300", "[10000, 1e+12]"),
                                                ("efficiency_matmul_beyond_cache", "1.5", "[0.001, 1]"),
                                                ("cpu_memory_cached_fraction_2_ranks", "0", "[0.001, 1]"),
                                                ("cpu_memory_cached_fraction_4_ranks", "1.01", "[0.001, 1]"),
                                                ("efficiency_optimizer", "5", "[0.001, 4]"),
                                                ("efficiency_optimizer", "0", "[0.001, 4]")))
    print("    the newer fields: an older profile reads; 3 halves of the cache's trio and 8 values out of range refused")


@test
def device_profile_group_fields_need_their_world_and_cores():
    """the collectives of groups smaller than the world (X_groups_of_G_{across_cores,on_one_core}):
    with cpu_groups_world and cpu_groups_cores they read back as given; one without either is
    refused with file, line, the field and the one missing; a bandwidth of 0 or a world of 1 is
    refused with its range; a profile without any reads and prints none (the model then prices a
    group by the world's ring step)"""
    calibrate_built()
    d = fresh_dir("profile_group_fields")
    with open("dev/profiles/cpu-this-machine.txt") as f:
        base = [l.rstrip("\n") for l in f if not l.startswith("#") and "groups" not in l.split()[0]]

    def check(label, extra):
        return check_profile_lines(d, label, base + extra)

    path, code, out = check("none", [])
    assert code == 0 and "groups" not in out, out
    where = ["cpu_groups_world 8", "cpu_groups_cores 2"]
    fields = ["reducescatter_groups_of_2_across_cores_bytes_per_s 4.5e8", "allgather_groups_of_4_on_one_core_bytes_per_s 3e9"]
    path, code, out = check("all", where + fields)
    assert code == 0 and all(l in out for l in where) and "reducescatter_groups_of_2_across_cores_bytes_per_s 450000000" in out \
        and "allgather_groups_of_4_on_one_core_bytes_per_s 3000000000" in out, out
    for k, missing in enumerate(where):
        extra = [w for w in where if w != missing] + fields
        path, code, out = check("without %d" % k, extra)
        want = "%s:%d: %s without %s" % (path, len(base) + 2, fields[0].split()[0], missing.split()[0])
        assert code == 1 and want in out, "without %s: exit %d, expected %r:\n%s" % (missing, code, want, out)
    assert_out_of_range_refused(d, base, where, (("allreduce_groups_of_2_on_one_core_bytes_per_s", "0", "[1, 1e+15]"),
                                                 ("cpu_groups_world", "1", "[2, 1e+06]")))
    print("    groups' fields read back with their world and cores; 2 without one of them and 2 out of range refused")


@test
def calibrate_fit_is_the_relative_least_squares_line():
    """calibrate -fit: exact points of t = alpha + bytes / beta (alpha 3 us, beta 5 GB/s, 2 KB to
    8 MB) give back alpha and beta (relative 1e-9: float64 normal equations over sizes three
    decades apart lose a few digits, not nine); points off the line give the line numpy's float64
    least squares finds with each residual divided by its t (relative errors: the weights the fit
    documents), to 1e-9; one size alone, or a line that is not two numbers, is refused"""
    calibrate_built()
    d = fresh_dir("calibrate_fit")
    sizes = [2048 * 4 ** i for i in range(7)]
    alpha, beta = 3e-6, 5e9

    def fit(points):
        path = os.path.join(d, "points.txt")
        with open(path, "w") as f:
            f.writelines("%.17g %.17g\n" % p for p in points)
        code, out = calibrate_cli("-fit", path)
        assert code == 0, out
        m = re.match(r"alpha (\S+) s, beta (\S+) bytes/s", out)
        assert m, out
        return float(m.group(1)), float(m.group(2))

    a, b = fit([(n, alpha + n / beta) for n in sizes])
    assert abs(a - alpha) <= 1e-9 * alpha and abs(b - beta) <= 1e-9 * beta, (a, b)
    # off the line: a protocol's step, noise; the reference minimises sum ((a + n / beta - t) / t)^2
    rng = np.random.default_rng(7)
    points = [(n, (alpha + n / beta) * f) for n, f in zip(sizes, rng.uniform(0.6, 1.6, len(sizes)))]
    n_ = np.array([p[0] for p in points]), np.array([p[1] for p in points])
    rows = np.stack([np.ones(len(sizes)), n_[0]], axis=1) / n_[1][:, None]
    (ref_a, ref_slope), *_ = np.linalg.lstsq(rows, np.ones(len(sizes)), rcond=None)
    a, b = fit(points)
    assert abs(a - ref_a) <= 1e-9 * ref_a and abs(b - 1 / ref_slope) <= 1e-9 / ref_slope, (a, b, ref_a, 1 / ref_slope)
    path = os.path.join(d, "one.txt")
    with open(path, "w") as f:
        f.write("4096 1e-5\n4096 1e-5\n")
    code, out = calibrate_cli("-fit", path)
    assert code == 1 and "fewer than two different sizes" in out, out
    with open(path, "w") as f:
        f.write("4096 1e-5\n8192 2us\n")
    code, out = calibrate_cli("-fit", path)
    assert code == 1 and "not \"bytes seconds\"" in out, out
    print("    exact points: alpha and beta back to 1e-9; noisy points: numpy's weighted line to 1e-9")


@test
def calibrate_two_ranks_writes_a_profile_that_reads_back():
    """mpirun -np 2 dev/bench/calibrate -o FILE: exits 0 and writes a kind cpu profile that
    -check reads; its numbers are positive and plausible for a CPU core (GEMM 1e8-1e13 FLOP/s,
    bandwidths 1e8-1e13 bytes/s, latencies 10 ns to 1 ms: ranges, never a time), efficiency of
    the large GEMMs 1 by definition and every other in (0, 1], the host's memory as /proc/meminfo
    says, its cores as os.cpu_count(), the fitted figures it printed the ones it wrote (the
    all-reduce's and ZeRO's reduce-scatter and all-gather alike), the rates scaled to the median of
    the lone rank's times as it printed (the drift) and those medians written for -probe, which
    prints the same work's times; the optimizer's efficiency in (0, 4] as printed, the host's
    bandwidth its rate; on 1 rank it stops with the reason and writes nothing"""
    calibrate_built()
    d = fresh_dir("calibrate_run")
    path = os.path.join(d, "cpu.txt")
    out = run_ok(2, ["-o", path], program=CALIBRATE, timeout=240)
    code, text = calibrate_cli("-check", path)
    assert code == 0, text
    v = profile_values(text)
    assert v["kind"] == "cpu" and v["cpu_threads"] == 1 and v["cpu_cores"] == os.cpu_count(), text
    for key in ("peak_flops_fp32", "peak_flops_bf16"):
        assert 1e8 <= v[key] <= 1e13, "%s %g" % (key, v[key])
    for key in ("memory_bandwidth_bytes_per_s", "intra_node_bandwidth_bytes_per_s", "inter_node_bandwidth_bytes_per_s",
                "intra_node_allreduce_bandwidth_bytes_per_s"):
        assert 1e8 <= v[key] <= 1e13, "%s %g" % (key, v[key])
    for key in ("intra_node_latency_s", "inter_node_latency_s", "intra_node_allreduce_latency_s"):
        assert 1e-8 <= v[key] <= 1e-3, "%s %g" % (key, v[key])
    assert v["efficiency_matmul_large"] == 1, text
    for key in EFFICIENCIES:
        assert 0 < v[key] <= 1, "%s %g" % (key, v[key])
    mem_kb = int(re.search(r"MemTotal:\s+(\d+) kB", open("/proc/meminfo").read()).group(1))
    assert abs(v["memory_bytes"] - mem_kb * 1024) <= 0.01 * mem_kb * 1024, (v["memory_bytes"], mem_kb)
    m = re.search(r"send/recv: alpha (\S+) us, beta (\S+) GB/s; all-reduce: alpha (\S+) us, beta (\S+) GB/s", out)
    assert m, out[-3000:]
    printed = [float(x) for x in m.groups()]
    written = [v["intra_node_latency_s"] * 1e6, v["intra_node_bandwidth_bytes_per_s"] / 1e9,
               v["intra_node_allreduce_latency_s"] * 1e6, v["intra_node_allreduce_bandwidth_bytes_per_s"] / 1e9]
    for p_, w in zip(printed, written):
        assert abs(p_ - w) <= 0.006 * w + 0.006, (printed, written)  # (printed to 2 decimals)
    # ZeRO's reduce-scatter and all-gather, measured as the all-reduce is: on 2 ranks, latencies and
    # bandwidths in the same plausible ranges, printed as written; the bytes past 2 MB of each
    # collective, where written, at a bandwidth in the same range
    m = re.search(r"reduce-scatter: alpha (\S+) us, beta (\S+) GB/s; all-gather: alpha (\S+) us, beta (\S+) GB/s", out)
    assert m, out[-3000:]
    printed_zero = [float(x) for x in m.groups()]
    written_zero = []
    for kind in ("reducescatter", "allgather"):
        latency, bandwidth = v["%s_2_ranks_latency_s" % kind], v["%s_2_ranks_bandwidth_bytes_per_s" % kind]
        assert 1e-8 <= latency <= 1e-3 and 1e8 <= bandwidth <= 1e13, (kind, latency, bandwidth)
        written_zero += [latency * 1e6, bandwidth / 1e9]
    for p_, w in zip(printed_zero, written_zero):
        assert abs(p_ - w) <= 0.006 * w + 0.006, (printed_zero, written_zero)
    beyond = [k for k in v if k.endswith("_beyond_2mb_bytes_per_s")]
    assert all(1e7 <= v[k] <= 1e13 for k in beyond), [(k, v[k]) for k in beyond]
    assert not any(k.startswith(("reducescatter_4", "allgather_4", "allreduce_4")) for k in v), text  # (2 ranks: none of 4)
    # the optimizer's passes: an efficiency in (0, 4] (it may pass the triad's, which does not count
    # its write's reads), as printed (to 2 decimals); the host's bandwidth (-offload's AdamW) its rate
    m = re.search(r"the optimizer \(gradient norm and AdamW over \d+ M parameters, in place\): (\S+) of the triad's", out)
    assert m and 0 < v["efficiency_optimizer"] <= 4, (out[-3000:], text)
    assert abs(float(m.group(1)) - v["efficiency_optimizer"]) <= 0.006, (m.group(0), v["efficiency_optimizer"])
    host = v["memory_bandwidth_bytes_per_s"] * v["efficiency_optimizer"]
    assert abs(v["host_memory_bandwidth_bytes_per_s"] - host) <= 1e-6 * host, (v["host_memory_bandwidth_bytes_per_s"], host)
    # what sharing the host does beyond that: the cache as sysfs gives it (lscpu's figure), the
    # GEMM beyond it and the in-cache fraction in (0, 1], the 2 ranks' wait a time under a second
    # (0, not written, where the two arrived together)
    caches = []
    for size_file in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        text_size = open(size_file).read().strip()
        caches.append(float(text_size[:-1]) * {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}[text_size[-1]]
                      if text_size[-1] in "KMG" else float(text_size))
    if caches:
        assert v["cpu_cache_bytes"] == max(caches), (v["cpu_cache_bytes"], caches)
    assert 0 < v["efficiency_matmul_beyond_cache"] <= 1 and 0 < v["cpu_memory_cached_fraction_2_ranks"] <= 1, text
    assert 0 <= v.get("cpu_meeting_fraction_2_ranks", 0.0) <= 1, text
    assert "beyond the cache" in out and "each collective waits" in out, out[-3000:]
    # the drift: rank 0's lone GEMMs timed 5 times on 2 ranks (step 2, 1 rank at once, 3 in turn with
    # 2 ranks), the profile's peak the step 2 rate scaled by step 2's time over their median (as
    # printed, to its 3 decimals), and their medians written for calibrate -probe
    m = re.search(r"GEMMs timed (\d+) times over the calibration, (\S+) to (\S+) s \(step 2's (\S+)\): its\n"
                  r"  rates x (\S+), (\S+) GFLOP/s; its triads (\d+) times, (\S+) to (\S+) s", out)
    assert m, out[-3000:]
    assert (int(m.group(1)), int(m.group(7))) == (5, 4), m.group(0)
    assert abs(float(m.group(6)) - v["peak_flops_fp32"] / 1e9) <= 0.05 + 1e-3 * float(m.group(6)), (m.group(0), v["peak_flops_fp32"])
    profile_text = open(path).read()
    medians = re.search(r"lone medians: gemm_seconds (\S+) triad_seconds (\S+)", profile_text)
    assert medians, profile_text[:3000]
    gemm_median, triad_median = float(medians.group(1)), float(medians.group(2))
    # (each median lies between the least and the most of its times, printed to 3 decimals)
    assert float(m.group(2)) - 5e-4 <= gemm_median <= float(m.group(3)) + 5e-4, (m.group(0), gemm_median)
    assert float(m.group(8)) - 5e-4 <= triad_median <= float(m.group(9)) + 5e-4, (m.group(0), triad_median)
    # step 2's time over the median is the factor the rates were scaled by
    assert abs(float(m.group(4)) / gemm_median - float(m.group(5))) <= 2e-3 + 1e-3 / gemm_median, (m.group(0), gemm_median)
    # -probe, no MPI: the same work timed now, one line of two positive times
    p = subprocess.run([CALIBRATE, "-probe", "-threads", "1"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    probe = re.fullmatch(r"gemm_seconds (\S+) triad_seconds (\S+)\n", p.stdout)
    assert p.returncode == 0 and probe and all(float(x) > 0 for x in probe.groups()), (p.returncode, p.stdout, p.stderr)
    # one rank: no link to measure
    lone = os.path.join(d, "lone.txt")
    code, out1 = mpirun(1, ["-o", lone], program=CALIBRATE, timeout=60)
    assert code != 0 and "between 2 ranks" in out1 and not os.path.exists(lone), out1
    print("    %s: GEMM %.1f GFLOP/s, small %.2f, attention %.2f, triad %.1f GB/s, memory %.2f, "
          "send %.2f us + %.2f GB/s, all-reduce %.2f us + %.2f GB/s" % (
              os.path.basename(path), v["peak_flops_fp32"] / 1e9, v["efficiency_matmul_small"],
              v["efficiency_attention"], v["memory_bandwidth_bytes_per_s"] / 1e9, v["efficiency_memory"], *printed))


@test
def calibrate_four_ranks_times_groups_only_when_pinned():
    """mpirun -np 4 dev/bench/calibrate with the ranks pinned round robin (--bind-to
    core:overload-allowed --map-by core, as dev/bench/sweep.sh runs it): the profile holds
    cpu_groups_world 4, cpu_groups_cores K (1 < K <= 4: the cores the ranks landed on), the
    groups of 2 across the cores and, where each core holds two ranks (K = 2), on one core,
    each bandwidth in a plausible range (1e7-1e13 bytes/s) and the one printed; the same run
    left unpinned (--bind-to none) says the groups were not measured and why, and writes none
    (a group's placement is then unknown). Skipped on one CPU, or where mpirun cannot pin (no
    binding support)"""
    if (os.cpu_count() or 1) < 2:
        raise Skip("one CPU: no cores to pin ranks round robin to")
    calibrate_built()
    d = fresh_dir("calibrate_groups")
    probe = subprocess.run(["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "core:overload-allowed",
                            "--map-by", "core", "-np", "4", shutil.which("true") or "/bin/true"], cwd=ROOT,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    if probe.returncode != 0:
        raise Skip("mpirun cannot pin 4 ranks here: %s" % probe.stdout.decode("utf-8", "replace")[-300:])
    runs = {}
    for label, binding in (("pinned", ["--bind-to", "core:overload-allowed", "--map-by", "core"]),
                           ("unpinned", ["--bind-to", "none"])):
        path = os.path.join(d, label + ".txt")
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe"] + binding + ["-np", "4", CALIBRATE, "-o", path]
        # (calibrate stops when its 2-rank timings do not fit a line, as they may not while another
        # test's ranks, a calibration's in particular, take the same pinned cores: up to 3 tries)
        for attempt in range(3):
            p = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, timeout=300)
            out = p.stdout.decode("utf-8", "replace")
            if p.returncode == 0 or not re.search(r"error: the \S+ fit: ", out):
                break
            print("    %s: calibrate's fit failed on a busy machine (%s), again" % (
                label, re.search(r"error: (.*)", out).group(1)))
        assert p.returncode == 0, "%s: exit %d\n%s" % (" ".join(cmd), p.returncode, out[-3000:])
        code, text = calibrate_cli("-check", path)
        assert code == 0, text
        runs[label] = (out, profile_values(text))
    out, v = runs["pinned"]
    K = v.get("cpu_groups_cores", 0)
    assert v.get("cpu_groups_world") == 4 and 1 < K <= 4, out[-3000:]
    m = re.search(r"pinned round robin to (\d+) cores", out)
    assert m and int(m.group(1)) == K, out[-3000:]
    places = ["across_cores"] + (["on_one_core"] if K == 2 else [])  # (pairs on one core: 4 ranks, 2 a core)
    for place in places:
        printed = re.search(r"2 ranks %s +all-reduce \S+ / \S+, (\S+) GB/s; reduce-scatter \S+ / \S+, (\S+) GB/s; "
                            r"all-gather \S+ / \S+, (\S+) GB/s" % place.replace("_", " "), out)
        assert printed, (place, out[-3000:])
        for kind, shown in zip(("allreduce", "reducescatter", "allgather"), printed.groups()):
            key = "%s_groups_of_2_%s_bytes_per_s" % (kind, place)
            if float(shown) == 0:  # (the 32 MB took no longer than the 2 MB: left out, as a measured collective's)
                assert key not in v, (key, v.get(key))
                continue
            assert 1e7 <= v[key] <= 1e13 and abs(v[key] / 1e9 - float(shown)) <= 6e-4, (key, v[key], shown)
    assert not any("_groups_of_4_" in k for k in v) and ("on_one_core" in " ".join(v)) == (K == 2), sorted(v)
    out, v = runs["unpinned"]
    assert "not measured, the ranks are not pinned to the cores round robin" in out, out[-3000:]
    assert not any("groups" in k for k in v), sorted(v)
    print("    pinned to %d cores: pairs %s; unpinned: none" % (K, ", ".join(
        "%s %.2f GB/s (reduce-scatter)" % (pl, runs["pinned"][1]["reducescatter_groups_of_2_%s_bytes_per_s" % pl] / 1e9)
        for pl in places if "reducescatter_groups_of_2_%s_bytes_per_s" % pl in runs["pinned"][1])))


@test
def device_profile_header_compiles_as_c99_and_cxx():
    """llmc/device_profile.h alone, in a driver that loads and prints a profile: gcc -std=c99
    -pedantic and g++ -std=c++17 (nvcc's host language), warnings as errors; both print h200 as
    calibrate -check does"""
    calibrate_built()
    d = fresh_dir("profile_header")
    src = os.path.join(d, "driver.c")
    with open(src, "w") as f:
        f.write('#include "llmc/device_profile.h"\n'
                "int main(int argc, char** argv) {\n"
                "    DeviceProfile p;\n    char why[1024];\n"
                "    if (argc < 2 || !device_profile_load(argv[1], &p, why, sizeof(why))) return 1;\n"
                "    device_profile_print(stdout, &p);\n    return 0;\n}\n")
    _, want = calibrate_cli("-check", "h200")
    for compiler, flags in (("gcc", ["-std=c99", "-pedantic"]), ("g++", ["-x", "c++", "-std=c++17"])):
        exe = os.path.join(d, "driver_" + compiler)
        p = subprocess.run([compiler] + flags + ["-Wall", "-Wextra", "-Werror", "-I", ROOT, src, "-o", exe, "-lm"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert p.returncode == 0, "%s: %s" % (compiler, p.stdout)
        p = subprocess.run([exe, "h200"], stdout=subprocess.PIPE, text=True)
        assert p.returncode == 0 and p.stdout == want, "%s:\n%s" % (compiler, p.stdout)
    print("    gcc -std=c99 -pedantic and g++ -std=c++17, -Werror: built, and print h200 as calibrate does")
