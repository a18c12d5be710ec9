# The trainers' end-of-run line, the predicted step beside the measured one (llmc/run.h,
# run_print_step_time), and dev/memory_planner's -maxvio (the EP all-to-all at the routed loads,
# llmc/step_kernels.h). Read into test/run_tests.py's namespace (run_ok, mpirun, planner, make,
# fresh_dir, reference_run, moe_reference, trainer_args, data_args, REF, MOE, read_log, ...).
#
# The predicted figure is checked against the planner's step_seconds for the same layout and
# profile: the two programs compile the one model (llmc/step_time.h), so a trainer that hands the
# model another layout than it runs (its micro-batches, its schedule, its ep, its -tp_overlap) or
# another profile prints another figure. The measured figure is checked against the median of the
# step times the run itself logged, worked here.

STEP_TIME_LINE = re.compile(r"^step time: measured (\d+\.\d+) ms \(median of steps (\d+)\.\.(\d+)\), predicted (\d+\.\d+) ms "
                            r"on (\S+) \((.*); (\d+) ranks a node; llmc/step_time.h\)$", re.M)
CPU_PROFILE = os.path.join(ROOT, "dev", "profiles", "cpu-this-machine.txt")


def step_time_line(out):
    """the end-of-run line's figures: {measured, first, last, predicted, profile, parts, per_node}"""
    found = STEP_TIME_LINE.findall(out)
    assert len(found) == 1, "expected one 'step time:' line, found %d:\n%s" % (len(found), out[-3000:])
    measured, first, last, predicted, profile, parts, per_node = found[0]
    return dict(measured=float(measured), first=int(first), last=int(last), predicted=float(predicted), profile=profile,
                parts=parts, per_node=int(per_node))


def median(xs):
    xs = sorted(xs)
    h = len(xs) // 2
    return xs[h] if len(xs) % 2 else (xs[h - 1] + xs[h]) / 2


def check_trainer_step_time(name, program, ranks, trainer_flags, planner_flags, ref, cfg, B, steps=4):
    """one trainer's run: its predicted step equals the planner's for the same layout on the same
    profile file; its measured step is the median of its steps after the first; main.log's step
    records carry the same prediction"""
    d = fresh_dir("step_time_" + name)
    args = trainer_args(ref, B, d, list(trainer_flags), cfg=cfg)
    args[args.index("-x") + 1] = steps
    out = run_ok(ranks, args, program=program)
    line = step_time_line(out)
    # the profile: the CPU's measured file, found beside the program (no -profile given)
    assert os.path.realpath(line["profile"]) == os.path.realpath(CPU_PROFILE), line["profile"]
    # the ranks a node: the profile's (the CPU's: one host holds every rank)
    with open(CPU_PROFILE) as f:
        per_node = int(float(re.search(r"^gpus_per_node (\S+)", f.read(), re.M).group(1)))
    assert line["per_node"] == per_node and per_node >= ranks, (line["per_node"], per_node)
    # the planner, told the same layout, the same file and the same ranks a node
    total = cfg["batch"] * cfg["seq_len"]
    code, text = planner("-e", os.path.join(ref["dir"], "model.bin"), "-device", "cpu", "-b", B, "-t", cfg["seq_len"],
                         "-d", total, "-profile", CPU_PROFILE, "-gpus_per_node", per_node, "-format", "json", *planner_flags)
    assert code in (0, 2), text[-2000:]
    planned = json.loads(text)["step_seconds"] * 1e3
    # (the line prints %.2f ms: within 0.005 of the model's figure, and 1e-9 of it relative for
    # the two programs' floating point, the same C compiled twice)
    assert abs(line["predicted"] - planned) <= 0.005 + 1e-9 * planned, \
        "%s: the trainer predicts %.2f ms, the planner %.4f ms for %s" % (name, line["predicted"], planned, planner_flags)
    # the measured: the median of the steps after the first, from main.log's "ms" (%.3f) and from
    # the step lines (%.1f); the line's %.2f adds 0.005
    train, _ = read_log(d)
    assert sorted(train) == list(range(1, steps + 1)), sorted(train)
    assert (line["first"], line["last"]) == (2, steps), line
    logged = median([train[s]["ms"] for s in range(2, steps + 1)])
    assert abs(line["measured"] - logged) <= 0.0005 + 0.005, "%s: measured %.2f ms, the median of main.log's %.3f" % (
        name, line["measured"], logged)
    printed = [float(x) for s, x in re.findall(r"^step +(\d+)/\d+ \|.*\| (\d+\.\d) ms \|", out, re.M) if int(s) >= 2]
    assert len(printed) == steps - 1, printed
    assert abs(line["measured"] - median(printed)) <= 0.05 + 0.005, (line["measured"], printed)
    # main.log: every step record carries the prediction (%.3f), the same each step
    for s in train:
        assert abs(train[s]["predicted_ms"] - planned) <= 0.0005 + 1e-9 * planned, (s, train[s]["predicted_ms"], planned)
    print("    %-26s measured %8.2f ms, predicted %8.2f ms (planner %.2f); %s" % (name, line["measured"], line["predicted"],
                                                                                  planned, line["parts"]))
    return out


@test
def trainers_print_the_predicted_step_beside_the_measured():
    """every trainer ends its run with 'step time: measured M ms (median of steps 2..N), predicted
    P ms on <profile> (parts)': P equal to dev/memory_planner's step_seconds for the layout the
    trainer ran (the same profile file, the same ranks a node), M the median of its logged step
    times after the first; main.log's step records carry P. dp (2 micro-batches a step), tp,
    pp (afab, 4 micro-batches), cp, ep, DiLoCo (its outer step's share) and the grid trainer with
    experts (dp 2 x pp 2, ep 2). A run whose program has no profile beside it says how to make one"""
    make(["train_gpt2_dp", "train_gpt2_tp", "train_gpt2_pp", "train_gpt2_cp", "train_gpt2_ep", "train_gpt2_diloco",
          "train_gpt2_3d", "dev/memory_planner"])
    ref, cfg = reference_run(REF), REF
    check_trainer_step_time("dp", "./train_gpt2_dp", 2, [], ["-trainer", "dp", "-dp", 2], ref, cfg, B=2)
    check_trainer_step_time("tp", "./train_gpt2_tp", 2, ["-sp", 1], ["-trainer", "tp", "-tp", 2, "-sp", 1], ref, cfg, B=8)
    check_trainer_step_time("pp_afab", "./train_gpt2_pp", 2, ["-sched", "afab"],
                            ["-trainer", "pp", "-pp", 2, "-sched", "afab"], ref, cfg, B=2)
    check_trainer_step_time("cp", "./train_gpt2_cp", 2, [], ["-trainer", "cp", "-cp", 2], ref, cfg, B=8)
    check_trainer_step_time("diloco", "./train_gpt2_diloco", 2, ["-H", 2],
                            ["-trainer", "diloco", "-dp", 2, "-H", 2], ref, cfg, B=4)
    moe = moe_reference(4, 2)
    check_trainer_step_time("ep", "./train_gpt2_ep", 2, ["-ep", 2], ["-trainer", "ep", "-dp", 2, "-ep", 2], moe, MOE, B=4)
    check_trainer_step_time("3d_dp2_pp2_ep2", "./train_gpt2_3d", 4, ["-dp", 2, "-pp", 2, "-ep", 2],
                            ["-trainer", "3d", "-dp", 2, "-pp", 2, "-ep", 2], moe, MOE, B=2)
    # the program alone in a directory: no dev/profiles/ beside it, so no prediction, and the line
    # says how to make the profile
    d = fresh_dir("step_time_no_profile")
    lonely = os.path.join(d, "train_gpt2_dp")
    shutil.copy(os.path.join(ROOT, "train_gpt2_dp"), lonely)
    args = trainer_args(ref, 4, d, cfg=REF)
    args[args.index("-x") + 1] = 2
    out = run_ok(1, args, program=lonely)
    lines = [l for l in out.splitlines() if l.startswith("step time:")]
    assert len(lines) == 1 and "not predicted" in lines[0] and "dev/bench/calibrate" in lines[0], lines


@test
def planner_maxvio_prices_the_all_to_all_at_the_busiest_rank():
    """dev/memory_planner -maxvio v: the EP all-to-alls carry the busiest rank's bytes, (1 + v)
    times the balanced share, so on a profile of known link (alpha, beta) train_gpt2_ep's exposed
    ep time is, worked by hand, 4 L m (ep - 1) (alpha + (1 + v) a / (ep - 1) / beta) with a = N k C X
    (ep - 1) / ep the balanced bytes a rank sends to the others, a / (ep - 1) to each (4 all-to-alls
    a layer and micro-batch: the tokens out, the outputs back and the backward's two; comm_time.h's
    pairwise all-to-all, a message to each peer in turn, the group on one node).
    With -capacity_factor 1 the experts are full when balanced, so no v moves more bytes. The JSON
    and the text say which v; v above E/k - 1 and v on a dense model are refused"""
    make(["dev/memory_planner"])
    d = fresh_dir("planner_maxvio")
    # the CPU profile with a link of round figures (alpha 2 us, 1 GB/s; every rank on one node)
    alpha, beta = 2e-6, 1e9
    profile = os.path.join(d, "link.txt")
    with open(CPU_PROFILE) as f:
        lines = [l for l in f if not l.split(" ")[0] in ("intra_node_latency_s", "intra_node_bandwidth_bytes_per_s",
                                                          "efficiency_link")]
    with open(profile, "w") as f:
        f.write("".join(lines) + "intra_node_latency_s %g\nintra_node_bandwidth_bytes_per_s %g\nefficiency_link 1\n" % (alpha, beta))
    L, C, NH, E, k, ep, B, T = 2, 64, 4, 8, 2, 2, 4, 32
    common = ["-e", "%d/%d/%d" % (L, C, NH), "-experts", E, "-topk", k, "-trainer", "ep", "-dp", ep, "-ep", ep, "-device", "cpu",
              "-b", B, "-t", T, "-profile", profile, "-gpus_per_node", 8]
    X, m, N = 4, 1, B * T  # fp32; one micro-batch; a rank routes its B T tokens
    balanced = N * k * C * X * (ep - 1) / ep

    def ep_seconds(v, extra=()):
        code, text = planner(*(common + ["-maxvio", v, "-format", "json"] + list(extra)))
        assert code == 0, text[-2000:]
        j = json.loads(text)
        assert j["maxvio"] == v, j.get("maxvio")
        return j["time_parts"]["comm_exposed"]["ep"]

    for v in (0, 0.5, 1, 3):  # (3 = E/k - 1: every token on the same k experts)
        expected = 4 * L * m * (ep - 1) * (alpha + (1 + v) * balanced / (ep - 1) / beta)
        got = ep_seconds(v)
        # (1e-9 relative: the same sums in double, in another order)
        assert abs(got - expected) <= 1e-9 * expected, "maxvio %g: ep %.9g s, by hand %.9g s" % (v, got, expected)
    # the payload alone: the step's ep time less its latency terms scales as 1 + v
    latency = 4 * L * m * (ep - 1) * alpha
    ratio = (ep_seconds(1) - latency) / (ep_seconds(0) - latency)
    assert abs(ratio - 2.0) <= 1e-9, ratio
    # at -capacity_factor 1 (cap = N k / E slots an expert, every expert full when balanced) the
    # busiest rank takes no more
    full = ["-capacity_factor", 1]
    assert abs(ep_seconds(1, full) - ep_seconds(0, full)) <= 1e-15, (ep_seconds(1, full), ep_seconds(0, full))
    code, text = planner(*(common + ["-maxvio", 0.5]))
    assert code == 0 and "all-to-alls at MaxVio 0.5" in text, text[-2000:]
    code, text = planner(*(common + ["-maxvio", 3.5]))
    assert code == 1 and "-maxvio 3.5: at most E/k - 1 = 3" in text, text[-2000:]
    code, text = planner("-e", "d2", "-device", "cpu", "-maxvio", 1)
    assert code == 1 and "-maxvio 1" in text and "-experts" in text, text[-2000:]
