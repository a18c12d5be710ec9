# The collectives' times (llmc/comm_time.h): the hand-worked cases of test/test_comm_time.c, and
# the groups it derives from the grid held against train_gpt2_3d's own table ("the grid (tp
# fastest, then cp, dp, pp) and each rank's groups", print_layout) on 5D and 4D grids. Read by
# run_tests.py into its namespace (its helpers: @test, make, run_ok, fresh_dir, D3).

COMM_TIME = "./test/test_comm_time"


def comm_time_built():
    p = make(["test/test_comm_time"])
    assert p.returncode == 0, p.stdout.decode("utf-8", "replace")[-3000:]


@test
def comm_time_hand_worked_cases():
    """ring all-reduce over 2 ranks = 2 alpha + n / beta; 8 ranks in a node against 16 over two
    (the inter-node beta sets the pace); the tree for 8 bytes across nodes, the ring for 1 GB;
    reduce-scatter, all-gather, broadcast, all-to-all with half its peers off the node, send;
    a measured CPU all-reduce; the grid's groups by hand and as partitions (test/test_comm_time.c)"""
    comm_time_built()
    p = subprocess.run([COMM_TIME], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    out = p.stdout.decode("utf-8", "replace")
    assert p.returncode == 0 and "comm_time ok" in out, out[-3000:]


def braces(text):
    """'{0,2}' -> {0, 2}"""
    inner = text.strip("{}")
    return set(int(x) for x in inner.split(",")) if inner else set()


def trainer_group_table(out):
    """{rank: {group: set of ranks}} from train_gpt2_3d's table; ep's {a..b} as the ranks a to b;
    embedding only where the trainer prints it (pp > 1, a first or last stage)"""
    row = re.compile(r"^\s*rank\s+(\d+)\s+dp \d+ pp \d+ cp \d+ tp \d+\s+tp (\{[\d,]*\})\s+cp (\{[\d,]*\})\s+"
                     r"pp (\{[\d,]*\})\s+dp (\{[\d,]*\})\s*(?:embedding (\{[\d,]*\}))?"
                     r"(?:\s+ep \{(\d+)\.\.(\d+)\} edp (\{[\d,]*\}))?\s*$")
    table = {}
    for line in out.splitlines():
        m = row.match(line)
        if m is None:
            continue
        r = int(m.group(1))
        groups = {"tp": braces(m.group(2)), "cp": braces(m.group(3)), "pp": braces(m.group(4)), "dp": braces(m.group(5))}
        if m.group(6):
            groups["embedding"] = braces(m.group(6))
        if m.group(7):
            groups["ep"] = set(range(int(m.group(7)), int(m.group(8)) + 1))
            groups["edp"] = braces(m.group(9))
        table[r] = groups
    return table


def comm_time_group_table(dp, pp, cp, tp, ep):
    """{rank: {group: set of ranks}} as llmc/comm_time.h's grid_group lists them"""
    p = subprocess.run([COMM_TIME, "-groups"] + [str(x) for x in (dp, pp, cp, tp, ep)], cwd=ROOT, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=60)
    out = p.stdout.decode("utf-8", "replace")
    assert p.returncode == 0, out
    table = {}
    for line in out.splitlines():
        words = line.split()
        table[int(words[1])] = {words[i]: braces(words[i + 1]) for i in range(2, len(words), 2)}
    return table


@test
def comm_time_groups_equal_the_trainers_table():
    """each rank's tp, cp, pp, dp (dp x cp), embedding, ep and edp groups from comm_time.h's
    arithmetic equal train_gpt2_3d's printed table on 8 ranks: 5D with pp (dp 2 pp 2 tp 2, ep 2),
    5D with cp and an ep group across dp ranks (dp 2 cp 2 tp 2, ep 4), and dense 4D with middle
    stages (pp 4 cp 2); a rank without an embedding partner (pp 1, a middle stage) is alone"""
    comm_time_built()
    grids = [  # (dp, pp, cp, tp, ep), the trainer's flags (a layer a stage at least)
        ((2, 2, 1, 2, 2), ["-e", "d2", "-experts", 4, "-pp", 2, "-tp", 2, "-sp", 1, "-ep", 2]),
        ((2, 1, 2, 2, 4), ["-e", "d2", "-experts", 4, "-cp", 2, "-tp", 2, "-sp", 1, "-ep", 4]),
        ((1, 4, 2, 1, 1), ["-e", "d4", "-pp", 4, "-cp", 2]),
    ]
    for (dp, pp, cp, tp, ep), flags in grids:
        world = dp * pp * cp * tp
        d = fresh_dir("comm_time_groups")
        out = run_ok(world, ["-x", 0, "-v", 0, "-o", d] + flags, program=D3)
        trainer = trainer_group_table(out)
        ours = comm_time_group_table(dp, pp, cp, tp, ep)
        assert sorted(trainer) == list(range(world)), "the trainer's table has ranks %s of %d:\n%s" % (
            sorted(trainer), world, out[-3000:])
        experts = "-experts" in flags
        for r in range(world):
            for name in ["tp", "cp", "pp", "dp"] + (["ep", "edp"] if experts else []):
                assert name in trainer[r], "rank %d: no %s group in the trainer's row (%s)" % (r, name, flags)
                assert ours[r][name] == trainer[r][name], "%s, rank %d's %s group: comm_time.h %s, the trainer %s" % (
                    " ".join(map(str, flags)), r, name, sorted(ours[r][name]), sorted(trainer[r][name]))
            want = trainer[r].get("embedding", {r})  # unprinted: no partner, a group of itself
            assert ours[r]["embedding"] == want, "%s, rank %d's embedding group: comm_time.h %s, the trainer %s" % (
                " ".join(map(str, flags)), r, sorted(ours[r]["embedding"]), sorted(want))
