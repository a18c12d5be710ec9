# The step-time model (llmc/step_time.h): the hand-worked cases of test/test_step_time.c (a
# kernel's roofline, attention's useful FLOPs, the data-parallel all-reduce inside and across
# nodes and under -overlap, ranks sharing a CPU's cores, a pipeline message across nodes, the
# throughput and MFU). Read into test/run_tests.py's namespace.


@test
def step_time_parts_against_hand_worked_cases():
    """test/test_step_time: each part of the step-time model against its formula worked by hand"""
    p = make(["test/test_step_time"])
    assert p.returncode == 0, p.stdout.decode(errors="replace")[-3000:]
    out = run_ok(1, [], program="test/test_step_time")
    assert "step time ok" in out, out[-2000:]


@test
def planner_predicts_the_step_on_a_profile():
    """dev/memory_planner ends a layout's plan with the predicted step (llmc/step_time.h): its JSON
    carries step_seconds, tokens_per_second (the global batch's tokens over the step), mfu and the
    parts; the same layout on the slower device (an A100's 312 TFLOP/s against an H100's 989) takes
    longer; a profile that lacks a field is refused with the file, line and field named"""
    make(["dev/memory_planner"])
    args = ["-e", "d12", "-b", 8, "-t", 1024, "-dp", 2, "-format", "json"]
    times = {}
    for profile in ("h100-sxm", "a100-80gb"):
        code, text = planner(*(args + ["-profile", profile]))
        assert code == 0, text[-2000:]
        d = json.loads(text)
        assert d["profile"] == profile and d["step_seconds"] > 0, d.get("profile")
        tokens = 2 * 8 * 1024  # dp x B x T, one micro-batch a replica
        assert abs(d["tokens_per_second"] * d["step_seconds"] - tokens) <= 1e-6 * tokens, (d["tokens_per_second"], d["step_seconds"])
        parts = d["time_parts"]
        assert parts["gemm"] > 0 and parts["attention"] > 0 and parts["comm_exposed"]["dp"] >= 0, parts
        assert d["step_seconds"] >= parts["schedule"] and abs(parts["schedule"] + parts["once"] - d["step_seconds"]) <= 1e-9, parts
        times[profile] = d["step_seconds"]
    assert times["a100-80gb"] > times["h100-sxm"], times
    bad = os.path.join(fresh_dir("planner_profile"), "bad.txt")
    with open("dev/profiles/cpu-this-machine.txt") as f:
        text = "".join(line for line in f if not line.startswith("memory_bytes"))
    with open(bad, "w") as f:
        f.write(text)
    code, out = planner(*(args + ["-profile", bad]))
    assert code == 1 and "memory_bytes" in out and bad in out, out[-2000:]


@test
def planner_time_parts_give_exposed_time_by_group_and_link():
    """the planner's time_parts split the exposed collectives by group (comm_exposed, as before) and
    by link: comm_exposed_by_group_and_link (each group's on intra-node, inter-node and pcie, adding
    up to its comm_exposed) and comm_exposed_by_link (each link's over the groups). dp 2 x pp 2 on
    nodes of 2 GPUs: dp's all-reduce inside a node, the pipeline's messages across (pp exposed > 0:
    one micro-batch, nothing hides them), the embedding's all-reduce across; stage 0's parts
    (compute, exposed collectives, bubble) add up to the schedule and its own once-a-step part, at
    most the step; the text prints the links' line"""
    make(["dev/memory_planner"])
    args = ["-e", "d12", "-b", 4, "-t", 1024, "-dp", 2, "-pp", 2, "-gpus_per_node", 2, "-profile", "h100-sxm"]
    code, text = planner(*(args + ["-format", "json"]))
    assert code == 0, text[-2000:]
    d = json.loads(text)
    parts = d["time_parts"]
    exposed, split, links = parts["comm_exposed"], parts["comm_exposed_by_group_and_link"], parts["comm_exposed_by_link"]
    assert sorted(links) == ["inter-node", "intra-node", "pcie"], links
    close = lambda a, b: abs(a - b) <= 1e-8 * max(abs(a), abs(b)) + 1e-15  # (each printed with %.9g)
    for g, seconds in exposed.items():
        assert close(sum(split[g].values()), seconds), (g, split[g], seconds)
    for l, seconds in links.items():
        assert close(sum(split[g][l] for g in split), seconds), (l, seconds)
    assert split["dp"]["intra-node"] > 0 and split["dp"]["inter-node"] == 0, split["dp"]
    assert split["pp"]["inter-node"] > 0 and split["pp"]["intra-node"] == 0, split["pp"]
    assert split["embedding"]["inter-node"] > 0, split["embedding"]
    stage0 = sum(parts[k] for k in ("gemm", "attention", "memory", "host")) + sum(exposed.values()) + parts["bubble"]
    assert parts["schedule"] * (1 - 1e-8) <= stage0 <= d["step_seconds"] * (1 + 1e-8), (stage0, parts)
    code, text = planner(*args)
    assert code == 0 and "exposed by link: intra-node" in text, text[-1500:]


@test
def step_time_cpu_pipeline_parts_add_up_to_the_schedule():
    """on a CPU the pipeline is played with each action's time at the stages computing beside it
    (llmc/pipeline.h's pipeline_play_shared), and stage 0's parts are priced at the count that
    gives its actions the time they took: its compute, exposed collectives and bubble still add
    up to the schedule and its once-a-step part, and the bubble is not negative, for every kind of
    schedule, V ones included (a review found zbv and dualpipev's parts over the step by up to 8%
    when they were priced at the average count)"""
    make(["dev/memory_planner"])
    profile = os.path.join(ROOT, "dev", "profiles", "cpu-this-machine.txt")
    base = ["-e", "d12", "-b", 2, "-t", 256, "-device", "cpu", "-profile", profile, "-format", "json"]
    layouts = [["-pp", 2, "-sched", "zbv", "-d", 1536], ["-pp", 2, "-sched", "zbv", "-d", 4096],
               ["-pp", 3, "-sched", "dualpipev", "-d", 3072], ["-pp", 2, "-sched", "1f1b", "-d", 4096],
               ["-pp", 4, "-sched", "1f1b", "-d", 4096], ["-pp", 4, "-sched", "interleaved", "-vp", 3, "-d", 4096],
               ["-pp", 2, "-tp", 2, "-sched", "zb", "-d", 2048]]
    for flags in layouts:
        code, text = planner(*(base + flags))
        assert code == 0, (flags, text[-2000:])
        d = json.loads(text)
        parts = d["time_parts"]
        stage0 = sum(parts[k] for k in ("gemm", "attention", "memory", "host")) + sum(parts["comm_exposed"].values()) + parts["bubble"]
        # (each printed with %.9g; the count is found by halving to far below that)
        assert parts["bubble"] >= 0, (flags, parts)
        assert parts["schedule"] * (1 - 1e-8) <= stage0 <= d["step_seconds"] * (1 + 1e-8), (flags, stage0, parts)


@test
def planner_search_ranks_layouts_by_predicted_time():
    """dev/memory_planner -search N -rank time: the layouts that fit, the fastest predicted step
    first, each row's step equal to the planner's prediction for that layout alone, and the first
    layout's parts beside the second's; -rank refuses other words, and time without a profile"""
    make(["dev/memory_planner"])
    common = ["-e", "d12", "-b", 16, "-t", 1024, "-search", 4, "-profile", "h100-sxm"]
    code, text = planner(*(common + ["-rank", "time", "-format", "json"]))
    assert code == 0, text[-2000:]
    layouts = json.loads(text)["layouts"]
    steps = [l["step_seconds"] for l in layouts]
    assert len(steps) >= 10 and steps == sorted(steps), steps[:10]
    for l in (layouts[0], layouts[len(layouts) // 2], layouts[-1]):  # each row is that layout's own prediction
        flags = ["-e", "d12", "-b", 16, "-t", 1024, "-d", 16 * 1024 * 4, "-profile", "h100-sxm", "-format", "json", "-dp", l["dp"],
                 "-tp", l["tp"], "-pp", l["pp"], "-cp", l["cp"], "-z", l["z"], "-sp", l["sp"], "-r", l["r"], "-offload", l["offload"],
                 "-cp_comm", l["cp_comm"]]
        code, one = planner(*flags)
        assert code in (0, 2) and abs(json.loads(one)["step_seconds"] - l["step_seconds"]) <= 1e-9 * l["step_seconds"], (
            l["layout"], one[-500:])
    code, text = planner(*(common + ["-rank", "time"]))
    assert code == 0 and "why the first beats the second" in text and "first:  " + layouts[0]["layout"] in text, text[-3000:]
    code, text = planner(*(common + ["-rank", "speed"]))
    assert code == 1 and "-rank speed: expected memory or time" in text, text[-500:]


# A profile on which a link's seconds are its bytes: every link moves 1 byte a second, a message's
# latency is 1e-300 s (the format's least is above 0), and compute is all but free (1e18 FLOP/s,
# 1e15 bytes/s: a d2 step's kernels take under a microsecond, so what they hide of a collective
# is below a byte). The planner's time_parts then read, in seconds, the bytes the model puts on
# each group's links: comm_time.h prices a collective of payload n over p ranks of one node at
# 2 (p - 1)/p n / beta (all-reduce, the ring beating the tree's 2 n), (p - 1)/p n (reduce-scatter,
# all-gather, all-to-all), n (broadcast, a send). No measured all-reduce is given, so every
# collective takes the link above.
STEP_TIME_BYTES_PROFILE = """name links of one byte a second
kind cpu
peak_flops_fp32 1e18
peak_flops_bf16 1e18
memory_bandwidth_bytes_per_s 1e15
memory_bytes 1e15
efficiency_matmul_large 1
efficiency_matmul_small 1
matmul_small_flops 0
efficiency_attention 1
efficiency_memory 1
intra_node_latency_s 1e-300
intra_node_bandwidth_bytes_per_s 1
inter_node_latency_s 1e-300
inter_node_bandwidth_bytes_per_s 1
gpus_per_node 1024
"""

# what crosses a rank's links of a collective's payload over p ranks, by the textbook ring
# (Patarasuk and Yuan 2009; nccl-tests' doc/PERFORMANCE.md, its bus bandwidth factors)
STEP_TIME_LINK_SHARE = {"all-reduce": lambda p: 2.0 * (p - 1) / p, "reduce-scatter": lambda p: (p - 1) / p,
                        "all-gather": lambda p: (p - 1) / p,
                        # (the trainers count an all-to-all's bytes to the other ranks, comm.h: all of them cross)
                        "all-to-all": lambda p: 1.0,
                        "broadcast": lambda p: 1.0, "send": lambda p: 1.0}


def planner_command_run(command, d, steps=1):
    """runs the command line the planner printed for a layout ("mpirun -np N ./train_gpt2_X
    flags") for `steps` steps on the tiny model's data, writing into d, with no validation or
    samples; returns its output (a non-zero exit fails the test)"""
    words = command.split()
    assert words[:2] == ["mpirun", "-np"] and words[3].startswith("./train_gpt2_"), command
    flags = words[4:] + ["-x", steps, "-v", 0, "-s", 0, "-o", d]
    return run_ok(int(words[2]), flags, program=words[3])


def trainer_counted(d, names, scalars):
    """rank 0's payloads of step 1 (main.log's "comm": the trainer's communication layer counts every
    collective) as {(model group, collective): bytes}: names maps (trainer group, kind) to the
    model's group, scalars the bytes of the 4-byte figures the model leaves out (the loss, the norm,
    the routing's counts), taken off; receives are the sends' other half and left out"""
    train, _ = read_log(d)
    counted = {}
    for group, kinds in train[1]["comm"].items():
        for kind, n in kinds.items():
            n -= scalars.get((group, kind), 0)
            if n and kind != "recv":
                key = (names[(group, kind)], kind.replace("_", "-"))
                counted[key] = counted.get(key, 0) + n
    return counted


@test
def step_time_bytes_are_the_trainers_counters():
    """the bytes the time model prices, read back through the planner's JSON on a profile whose links
    move a byte a second (its time_parts' comm_exposed by group is then the bytes on the group's
    links), equal what the trainers' communication layer counted in a step of the same layout, the
    planner's own command run for one step, rank 0's, on five layouts: train_gpt2_dp ZeRO-2 (two
    micro-batches: a reduce-scatter each), train_gpt2_tp -sp 1 -r 2 (the rerun's collectives),
    train_gpt2_pp's 1F1B over 2 stages (the tied wte's all-reduce; the sends: on a CPU each is
    copied by the sender's core after its action, so with free compute the 2-stage play of 2
    micro-batches is F0's activations, then stage 0's second activations and stage 1's first
    gradient at once, then the last gradient: 3 messages, the whole schedule, all of it pp's
    exposed time), train_gpt2_cp's ring, and train_gpt2_ep's experts (dp 4, ep 2) at a
    capacity every expert fills (dropped 1 - E cap / (N k) = 50%: the routed loads are the balanced
    ones the model prices). The same counts, collective by collective, equal dev/bench/step_kernels'
    link rows for the layout (the planner's JSON gives no bytes per collective)"""
    p = make(["dev/memory_planner", "dev/bench/step_kernels", "train_gpt2_dp", "train_gpt2_tp", "train_gpt2_pp",
              "train_gpt2_cp", "train_gpt2_ep"])
    assert p.returncode == 0, p.stdout.decode(errors="replace")[-3000:]
    d = fresh_dir("bytes_profile")
    profile = os.path.join(d, "bytes.txt")
    with open(profile, "w") as f:
        f.write(STEP_TIME_BYTES_PROFILE)
    B, T, C, L, E, k = 1, 32, 128, 2, 4, 2  # d2; the MoE layout's E experts, top-k
    layouts = [  # name, the planner's flags, {(trainer group, kind): model group}, scalars, {model group: ranks}
        ("dp ZeRO-2", ["-trainer", "dp", "-dp", 2, "-z", 2, "-d", 2 * 2 * B * T],
         {("world", "all_reduce"): "dp", ("world", "reduce_scatter"): "dp", ("world", "all_gather"): "dp"},
         {("world", "all_reduce"): 8}, {"dp": 2}),  # (the loss and the norm's sum of squares)
        ("tp -sp 1 -r 2", ["-trainer", "tp", "-tp", 2, "-sp", 1, "-r", 2],
         {("world", "all_reduce"): "tp", ("world", "reduce_scatter"): "tp", ("world", "all_gather"): "tp"},
         {("world", "all_reduce"): 4}, {"tp": 2}),  # (the norm's sum of squares)
        ("pp 1f1b", ["-trainer", "pp", "-pp", 2, "-sched", "1f1b", "-d", 2 * B * T],
         {("world", "send"): "pp", ("embedding", "all_reduce"): "embedding"},
         {("world", "all_reduce"): 4, ("world", "broadcast"): 4}, {"embedding": 2}),  # (the norm; the loss)
        ("cp ring", ["-trainer", "cp", "-cp", 2, "-cp_comm", "ring"],
         {("world", "send"): "cp", ("world", "all_reduce"): "dp"}, {("world", "all_reduce"): 4}, {"cp": 2, "dp": 2}),
        # the world's: the loss, the loads (L E + 2 floats: each expert's tokens, kept and dropped)
        # and the aux loss; the ep group's: the experts' norm, and before each layer's all-to-all
        # its counts, E/ep ints to each other rank
        ("ep", ["-trainer", "ep", "-dp", 4, "-ep", 2, "-experts", E, "-topk", k, "-capacity_factor", 0.5, "-b", B],
         {("world", "all_reduce"): "dp", ("ep", "all_to_all"): "ep", ("expert_dp", "all_reduce"): "edp"},
         {("world", "all_reduce"): 4 + 4 * (L * E + 2) + 4, ("ep", "all_reduce"): 4,
          ("ep", "all_to_all"): L * (E // 2) * (2 - 1) * 4}, {"dp": 4, "ep": 2, "edp": 2}),
    ]
    for name, flags, names, scalars, sizes in layouts:
        base = ["-device", "cpu", "-e", "d2", "-b", B, "-t", T] + flags
        code, text = planner(*(base + ["-profile", profile, "-format", "json"]))
        assert code == 0, "%s: %s" % (name, text[-2000:])
        plan = json.loads(text)
        run = os.path.join(d, name.split()[0])
        out = planner_command_run(plan["command"], run)
        if name == "ep":  # every expert full on every rank: N k slots a rank, E cap kept
            cap = math.ceil(0.5 * B * T * k / E)
            line = re.findall(r"^step 1 moe: .*\| dropped ([\d.]+)%", out, re.M)
            assert line and abs(float(line[0]) / 100 - (1 - E * cap / (B * T * k))) <= 5e-7, (line, out[-2000:])
        counted = trainer_counted(run, names, scalars)
        # the planner: each group's link bytes (a group not listed: none)
        exposed = plan["time_parts"]["comm_exposed"]
        for group, seconds in exposed.items():
            want = 3 * B * T * C * 4 if group == "pp" and ("pp", "send") in counted else sum(  # (the messages on the path)
                STEP_TIME_LINK_SHARE[kind](sizes[g]) * n for (g, kind), n in counted.items() if g == group)
            # (%.9g of numbers under 1e9 prints every byte; the compute hides less than one)
            assert abs(seconds - want) <= 0.5, "%s: the planner's %s bytes %r, the trainer's %r (counted %s)" % (
                name, group, seconds, want, counted)
        if ("pp", "send") in counted:  # m messages of B T C floats a stage; 3 of them one after another
            m, message = 2, B * T * C * 4
            assert counted[("pp", "send")] == m * message, counted
            assert abs(plan["time_parts"]["schedule"] - 3 * message) <= 0.5, (plan["time_parts"], message)
        # collective by collective: step_kernels' rows of the same layout
        inventory = ["-e", "d2", "-b", B, "-t", T, "-precision", "fp32"] + [
            a for a in flags if a not in ("-sched", "1f1b", "-cp_comm", "ring", "-d", 2 * B * T, 2 * 2 * B * T)]
        inventory += ["-micro_batches", 2] if "-d" in flags else []
        rows = step_kernels_link_sums(step_kernels_json(*inventory))
        assert rows == counted, "%s: step_kernels' rows %s, the trainer counted %s" % (name, rows, counted)
        print("    %s: %s" % (name, ", ".join("%s %s %d B" % (g, c, n) for (g, c), n in sorted(counted.items()))))


def planner_search_rows_run(model_flags, count=3):
    """the first `count` layouts of dev/memory_planner -search 4 -rank time for these model flags on
    the CPU: each layout's command from the planner (its plan of that layout alone, whose step is
    the row's: the same layout), run for one step; returns the layouts run"""
    base = ["-device", "cpu", "-t", 32] + list(model_flags)
    code, text = planner(*(base + ["-search", 4, "-rank", "time", "-format", "json"]))
    assert code == 0, text[-2000:]
    search = json.loads(text)
    rows = search["layouts"][:count]
    assert len(rows) == count, search
    d = fresh_dir("search_rows")
    for i, l in enumerate(rows):
        trainer = re.match(r"train_gpt2_(\w+)", l["layout"]).group(1)
        flags = ["-trainer", trainer, "-d", search["batch"], "-dp", l["dp"], "-tp", l["tp"], "-pp", l["pp"], "-cp", l["cp"],
                 "-ep", l["ep"], "-z", l["z"], "-sp", l["sp"], "-r", l["r"], "-offload", l["offload"], "-cp_comm", l["cp_comm"]]
        flags += ["-sched", l["sched"], "-vp", l["vp"]] if l["pp"] > 1 else []
        code, one = planner(*(base + flags + ["-format", "json"]))
        assert code == 0, "%s: %s" % (l["layout"], one[-2000:])
        plan = json.loads(one)
        assert abs(plan["step_seconds"] - l["step_seconds"]) <= 1e-9 * l["step_seconds"], (l, plan["step_seconds"])
        # the row's own command is the one the plan of its layout gives, and the one that runs
        assert l["command"] == plan["command"], "%s: the search row's command %r, the plan's %r" % (
            l["layout"], l["command"], plan["command"])
        out = planner_command_run(l["command"], os.path.join(d, "row%d" % i))
        assert re.search(r"^step +1/1 \|", out, re.M), "%s: no step line:\n%s" % (plan["command"], out[-2000:])
        print("    %.1f ms predicted, ran one step: %s" % (l["step_seconds"] * 1e3, plan["command"]))
    return [l["layout"] for l in rows]


@test
def step_time_search_lists_layouts_the_trainers_run():
    """the three fastest layouts dev/memory_planner -search 4 -rank time lists on this machine's
    profile, for the dense d2 (B 1, T 32) and for d2 with 4 experts a layer in train_gpt2_3d, each
    run one step by the command the planner gives for it: every trainer accepts its layout (exit
    0) and prints its step line"""
    p = make(["dev/memory_planner", "train_gpt2_dp", "train_gpt2_tp", "train_gpt2_pp", "train_gpt2_cp", "train_gpt2_3d"])
    assert p.returncode == 0, p.stdout.decode(errors="replace")[-3000:]
    planner_search_rows_run(["-e", "d2", "-b", 1])
    planner_search_rows_run(["-e", "d2", "-b", 1, "-experts", 4, "-topk", 2, "-trainer", "3d"])


@test
def step_time_bad_profiles_and_flags_refused_by_the_planner_and_a_trainer():
    """a profile file with one thing wrong (a field missing, an unknown one, one given twice, a value
    out of range, a value that is not a number: made from this machine's profile) is refused by
    dev/memory_planner -profile FILE and by train_gpt2_dp -profile FILE (its end-of-run line's
    profile, read before the run starts: no output directory made): exit 1, the message naming the
    file, the line (but for a missing field, which has none) and the field; -profile naming neither
    a built-in profile nor a file is refused by both, naming it; the planner refuses a profile of the
    other backend's kind (a GPU's on -device cpu, the CPU's on -device cuda), naming -profile and
    -device, and a CPU trainer a GPU's, on every rank before its output directory is made. The planner's -gpus_per_node refuses
    -1 naming the flag, and 0 is the profile's figure: h100-sxm's 8 (d12 on dp 4 x tp 4: the same
    step as -gpus_per_node 8, tp's groups inside a node and dp's across two; not as 1, every group
    across nodes, nor as 16, all in one)"""
    p = make(["dev/memory_planner", "train_gpt2_dp"])
    assert p.returncode == 0, p.stdout.decode(errors="replace")[-3000:]
    d = fresh_dir("bad_profiles")
    with open("dev/profiles/cpu-this-machine.txt") as f:
        lines = f.read().splitlines()

    def line_of(key):  # 1-based, comments counted: the line a reader's editor shows
        return next(i + 1 for i, l in enumerate(lines) if l.split() and l.split()[0] == key)

    def replaced(key, value):
        n = line_of(key)
        return lines[:n - 1] + ["%s %s" % (key, value)] + lines[n:], n

    cases = []  # (label, the file's lines, what the message must hold: {path} is the file's)
    gone = line_of("efficiency_memory")
    cases.append(("missing", lines[:gone - 1] + lines[gone:], "{path}: missing field efficiency_memory"))
    cases.append(("unknown", lines + ["peak_flops_fp16 1e12"], "{path}:%d: unknown key 'peak_flops_fp16'" % (len(lines) + 1)))
    cases.append(("repeated", lines + ["memory_bytes 1e9"],
                  "{path}:%d: memory_bytes given twice (first on line %d)" % (len(lines) + 1, line_of("memory_bytes"))))
    text, n = replaced("efficiency_link", "1.5")
    cases.append(("out of range", text, "{path}:%d: efficiency_link 1.5 is out of range [0.001, 1]" % n))
    text, n = replaced("intra_node_bandwidth_bytes_per_s", "6.4GB/s")
    cases.append(("not a number", text, "{path}:%d: intra_node_bandwidth_bytes_per_s '6.4GB/s' is not a number" % n))
    cases.append(("no such profile", None, "h300: not a built-in profile (h100-sxm, h200, a100-80gb) and not a file"))
    for i, (label, text, message) in enumerate(cases):
        path = "h300"
        if text is not None:
            path = os.path.join(d, "bad_%d.txt" % i)
            with open(path, "w") as f:
                f.write("\n".join(text) + "\n")
        want = message.format(path=path)
        code, out = planner("-device", "cpu", "-e", "d2", "-b", 1, "-t", 32, "-dp", 2, "-profile", path)
        assert code == 1 and "error: -profile " in out and want in out, "planner, %s: exit %d, expected 1 and %r:\n%s" % (
            label, code, want, out[-2000:])
        run = os.path.join(d, "run_%d" % i)
        code, out = mpirun(1, ["-e", "d2", "-b", 1, "-t", 32, "-x", 1, "-v", 0, "-s", 0, "-profile", path, "-o", run])
        assert code != 0 and want in out, "train_gpt2_dp, %s: exit %d, expected %r:\n%s" % (label, code, want, out[-2000:])
        assert not os.path.exists(run), "train_gpt2_dp, %s: refused after making %s" % (label, run)
    # a profile of the other backend's kind, refused naming both flags
    for device, profile, kind in (("cpu", "h100-sxm", "cuda"), ("cuda", "dev/profiles/cpu-this-machine.txt", "cpu")):
        code, out = planner("-device", device, "-e", "d2", "-b", 1, "-t", 32, "-dp", 2, "-profile", profile)
        want = "error: -profile %s is a kind %s profile, and -device %s plans the %s backend" % (
            profile, kind, device, device.upper())
        assert code == 1 and want in out, "-device %s -profile %s: exit %d, expected %r:\n%s" % (
            device, profile, code, want, out[-1000:])
    # and a trainer of the CPU backend given a GPU's profile: every rank stops before the run starts
    run = os.path.join(d, "run_cuda_profile")
    code, out = mpirun(2, ["-e", "d2", "-b", 1, "-t", 32, "-x", 1, "-v", 0, "-s", 0, "-profile", "h100-sxm", "-o", run])
    want = "-profile h100-sxm is a kind cuda profile, and this build runs the CPU backend"
    assert code != 0 and want in out and not os.path.exists(run), "train_gpt2_dp -profile h100-sxm: exit %d:\n%s" % (
        code, out[-2000:])
    code, out = planner("-e", "d12", "-dp", 2, "-gpus_per_node", -1)
    assert code == 1 and "flag '-gpus_per_node' is -1, outside its allowed range >= 0" in out, out[-1000:]
    steps = {}
    for per_node in (0, 1, 8, 16):
        code, out = planner("-e", "d12", "-dp", 4, "-tp", 4, "-profile", "h100-sxm", "-gpus_per_node", per_node,
                            "-format", "json")
        assert code == 0, out[-2000:]
        steps[per_node] = json.loads(out)["step_seconds"]
    assert steps[0] == steps[8] and steps[8] not in (steps[1], steps[16]), steps
    print("    %d bad profiles refused by the planner and train_gpt2_dp; -gpus_per_node 0, 1, 8, 16: %s ms" % (
        len(cases), ", ".join("%.2f" % (s * 1e3) for s in steps.values())))


# A GPU profile of round numbers for the tests below: 1e12 FLOP/s, every efficiency 1 but
# attention's (ATTENTION, the number each test turns), memory and links fast enough to leave
# compute-bound work compute-bound.
STEP_TIME_ROUND_GPU = """name round numbers
kind KIND
peak_flops_fp32 1e12
peak_flops_bf16 1e12
memory_bandwidth_bytes_per_s 1e15
memory_bytes 1e15
efficiency_matmul_large 1
efficiency_matmul_small 1
matmul_small_flops 0
efficiency_attention ATTENTION
efficiency_memory 1
intra_node_latency_s 1e-6
intra_node_bandwidth_bytes_per_s 1e11
inter_node_latency_s 1e-6
inter_node_bandwidth_bytes_per_s 1e11
"""


def step_time_round_profile(d, kind, attention):
    path = os.path.join(d, "round_%s_%g.txt" % (kind, attention))
    with open(path, "w") as f:
        f.write(STEP_TIME_ROUND_GPU.replace("KIND", kind).replace("ATTENTION", "%g" % attention))
    return path


@test
def step_time_attention_is_its_useful_flops_at_the_profiles_efficiency():
    """fused attention's part of a step is its useful causal FLOPs over peak x efficiency_attention,
    as device_profile.h defines the efficiency, whatever the kernels execute: the flash kernels on
    a GPU, and the CPU's attention (which calibrate times that way). Useful: 2 T (T + 1) C B L
    forward (q k^T and p v over the causal pairs), twice that backward, so 3 x forward over the
    step (no -r); at efficiency_attention 0.5 and 0.25 the part is that over 0.5e12 and 0.25e12
    FLOP/s. The unfused GPU path (-attention cublas) is priced by its parts instead: the same at
    both efficiencies, its six square GEMMs a layer (2 forward, 4 backward; 2 T^2 hs FLOPs a head
    each, the masked half included) at the GEMM rate, its passes over the scores on memory of
    1e15 bytes/s (some nanoseconds: 1e-4 of the whole)"""
    make(["dev/memory_planner"])
    d = fresh_dir("step_time_attention")
    L, C, NH, B, T = 2, 128, 4, 2, 64
    useful = 3 * 2 * T * (T + 1) * C * B * L

    def attention(kind, eff, device):
        code, out = planner("-e", "%d/%d/%d" % (L, C, NH), "-b", B, "-t", T, "-profile",
                            step_time_round_profile(d, kind, eff), "-format", "json", *device)
        assert code == 0, out[-2000:]
        return json.loads(out)["time_parts"]["attention"]

    for kind, device in (("cuda", ["-device", "cuda", "-precision", "bf16", "-attention", "flash"]),
                         ("cpu", ["-device", "cpu"])):
        for eff in (0.5, 0.25):
            got, want = attention(kind, eff, device), useful / (1e12 * eff)
            # (1e-6: the JSON's 9 significant digits, and the shared-CPU slowdown of a lone rank is 1)
            assert abs(got / want - 1) <= 1e-6, "%s at efficiency_attention %g: attention %.9g s, expected %.9g" % (
                kind, eff, got, want)
    cublas = ["-device", "cuda", "-precision", "bf16", "-attention", "cublas"]
    squares = 6 * B * NH * 2 * T * T * (C // NH) * L
    for eff in (0.5, 0.25):
        got = attention("cuda", eff, cublas)
        assert abs(got / (squares / 1e12) - 1) <= 1e-4, "cublas at efficiency_attention %g: attention %.9g s, " \
            "expected its GEMMs' %.9g" % (eff, got, squares / 1e12)


@test
def step_time_overlap_hides_once_a_step_collectives_behind_the_last_micro_batch():
    """-overlap's gradient reduction is posted in the last micro-batch's backward (train_gpt2_dp),
    so with m micro-batches it hides behind one micro-batch's backward, not m: d48 on 8 H100s
    (dp 8, 4 a node, so the all-reduce crosses nodes) exposes the same dp time at m = 1 and m = 16
    (one micro-batch each of the same size). And collectives that share the compute they hide
    behind share it: under -z 3 -overlap the per-layer gathers and reduce-scatters together hide
    no more than the step computes"""
    make(["dev/memory_planner"])
    base = ["-e", "d48", "-b", 1, "-t", 1024, "-dp", 8, "-overlap", 1, "-gpus_per_node", 4, "-profile", "h100-sxm",
            "-format", "json"]
    exposed = {}
    for d_tokens in (8192, 131072):
        code, out = planner(*(base + ["-d", d_tokens]))
        assert code == 0, out[-2000:]
        plan = json.loads(out)
        exposed[plan["micro_batches"]] = plan["time_parts"]["comm_exposed"]["dp"]
    assert sorted(exposed) == [1, 16], exposed
    # (1e-6: the same sums in another order)
    assert exposed[1] > 0 and abs(exposed[16] / exposed[1] - 1) <= 1e-6, \
        "dp exposed %.9g s at m = 1 and %.9g s at m = 16: expected equal" % (exposed[1], exposed[16])
    code, out = planner(*(base + ["-z", 3]))
    assert code == 0, out[-2000:]
    parts = json.loads(out)["time_parts"]
    compute = parts["gemm"] + parts["attention"] + parts["memory"]
    text = planner(*(base[:-2] + ["-z", 3]))[1]
    m = re.search(r"dp ([0-9.]+) \(([0-9.]+)\) ms", text)
    assert m, text[-2000:]
    hidden = (float(m.group(2)) - float(m.group(1))) / 1e3
    # (1e-5 s: the text's two decimals of a millisecond)
    assert hidden <= compute + 1e-5, "-z 3 -overlap hides %.6f s of collectives behind %.6f s of compute" % (
        hidden, compute)


@test
def step_time_bubble_is_the_unit_plays_on_equal_stages():
    """the step's bubble is what pipeline_play leaves stage 0 idle; on stages of (nearly) equal
    work it is test_pipeline's unit-time play scaled: 1F1B and GPipe (afab) idle (p - 1) of the
    m + p - 1 action slots, interleaving with V chunks (p - 1) of V m + p - 1 (Narayanan et al.
    2021, section 2.2). The stages: 8 layers of C = 1024 over p = 4, a vocabulary of 128 so that
    the last stage's head adds under 2% to its work, links of 1e15 bytes/s and 1e-12 s (the
    messages free), m = 8. (3%: what the first stage's embedding and the last one's head and loss
    leave unequal, which the closed form does not see)"""
    make(["dev/memory_planner"])
    d = fresh_dir("step_time_bubble")
    profile = step_time_round_profile(d, "cuda", 0.5)
    with open(profile) as f:
        text = f.read()
    for key in ("intra_node", "inter_node"):
        text = text.replace("%s_latency_s 1e-6" % key, "%s_latency_s 1e-12" % key)
        text = text.replace("%s_bandwidth_bytes_per_s 1e11" % key, "%s_bandwidth_bytes_per_s 1e15" % key)
    with open(profile, "w") as f:
        f.write(text)
    p, m = 4, 8
    for sched, V in (("1f1b", 1), ("afab", 1), ("interleaved", 2)):
        flags = ["-e", "8/1024/16/256/128", "-b", 1, "-t", 256, "-pp", p, "-d", m * 256, "-trainer", "3d", "-sched", sched,
                 "-profile", profile, "-format", "json"] + (["-vp", V] if V > 1 else [])
        code, out = planner(*flags)
        assert code == 0, out[-2000:]
        plan = json.loads(out)
        assert plan["micro_batches"] == m, plan["micro_batches"]
        parts = plan["time_parts"]
        got, want = parts["bubble"] / parts["schedule"], (p - 1) / (V * m + p - 1)
        assert abs(got / want - 1) <= 0.03, "%s: stage 0 idle %.4f of the schedule, the unit play's (p-1)/(Vm+p-1) = %.4f" % (
            sched, got, want)
        print("    %-11s bubble %.4f of the schedule, unit play %.4f" % (sched, got, want))
