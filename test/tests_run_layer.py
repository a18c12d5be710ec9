# The shared run layer (llmc/run.h, train.h, checkpoint.h, utils.h), dev/memory_planner and its
# page, dev/setup.sh: issue 58's faults. Read by test/run_tests.py into its namespace, so its
# helpers (test, mpirun, run_ok, fresh_dir, planner, ...) are used here as they are.

# dev/memory_planner -device cpu plans the CPU build; each layout below is one that a trainer
# might refuse (recomputation, ZeRO, -sp, -offload, cp's comm, ep, a capacity), 2 or 4 ranks of d4
PLANNED_LAYOUTS = [
    dict(dp=2, z=1, r=1), dict(dp=2, z=3, offload=1, r=2),
    dict(tp=2, sp=1, r=1), dict(tp=2, z=1),
    dict(pp=2, sched="interleaved", vp=2, r=2, d=64),
    dict(cp=2, cp_comm="allgather", r=1), dict(cp=2, z=1),
    dict(dp=2, tp=2, sp=1, z=1, r=2, trainer="3d"),
    dict(dp=2, trainer="diloco", r=1), dict(dp=2, trainer="diloco", z=1),
    dict(dp=2, experts=4, ep=2, capacity_factor=1.5),
    dict(dp=2, experts=4, ep=2, r=1), dict(dp=2, experts=4, ep=1, r=2),
]


@test
def planner_commands_start_in_their_trainers():
    """every layout the planner accepts prints a command (mpirun -np N ./train_gpt2_X ...), and
    that very command starts and takes its step (one, -x 1, on the CPU backend); what the
    trainer would refuse (train_gpt2_ep's -r 1 and 2, a ZeRO stage the trainer lacks) the
    planner refuses itself, with the trainer's reason, and prints no command. So no layout that
    the planner or the page offers is one its trainer refuses"""
    make(["BACKEND=cpu", "dev/memory_planner", "train_gpt2_dp", "train_gpt2_tp", "train_gpt2_pp", "train_gpt2_cp",
          "train_gpt2_3d", "train_gpt2_diloco", "train_gpt2_ep"])
    started, refused = [], []
    for layout in PLANNED_LAYOUTS:
        flags = ["-e", "d4", "-b", 1, "-t", 32, "-device", "cpu", "-format", "json"]
        flags += [x for k, v in layout.items() for x in ("-" + k, v)]
        code, out = planner(*flags)
        if code == 1:  # refused: the reason, and nothing else
            assert out.startswith("error: ") and "{" not in out, "%s: %s" % (layout, out)
            refused.append((layout, out.strip()))
            continue
        assert code in (0, 2), "%s: exit %d\n%s" % (layout, code, out)
        command = json.loads(out)["command"].split()
        assert command[:2] == ["mpirun", "-np"] and command[3].startswith("./train_gpt2_"), command
        args = command[4:] + ["-x", 1, "-v", 0, "-s", 0, "-o", fresh_dir("planned_%d" % len(started))]
        rc, run = mpirun(int(command[2]), args, program=command[3], timeout=120)
        assert rc == 0, "the planner's command for %s, %s, is refused by its trainer:\n%s" % (
            layout, " ".join(command), why_it_failed(run))
        assert "step    1/1" in run, run[-2000:]
        started.append(" ".join(command))
    reasons = {json.dumps(layout, sort_keys=True): why for layout, why in refused}
    for layout in (dict(dp=2, experts=4, ep=2, r=1), dict(dp=2, experts=4, ep=1, r=2)):
        why = reasons.get(json.dumps(layout, sort_keys=True), "(accepted)")
        assert "train_gpt2_ep keeps every activation (-r 0)" in why, "%s: %s" % (layout, why)
    # (the dense trainers run every -r: at least these started)
    assert len(started) >= 8, started


@test
def planner_refuses_capacity_factor_without_experts():
    """-capacity_factor caps the experts of a MoE model: on a dense one the planner used to plan
    the dense trainer and drop the flag without a word; it names the flag and what it needs"""
    code, out = planner("-e", "d12", "-dp", 2, "-capacity_factor", 1.25)
    assert code == 1 and "-capacity_factor 1.25" in out and "-experts" in out, "exit %d\n%s" % (code, out)
    code, out = planner("-e", "d12", "-dp", 2, "-experts", 4, "-ep", 2, "-capacity_factor", 1.25)
    assert code == 0 and "-capacity_factor 1.25" in out, "exit %d\n%s" % (code, out)
