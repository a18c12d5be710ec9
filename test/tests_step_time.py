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
