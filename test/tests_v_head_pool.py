# The LM head's memory in a V (issue 62). In zbv and dualpipev stage 0 holds chunk 0 (the
# embedding side) and chunk 1, the last virtual stage, with the head: lnf, the logits (B, T, Vp)
# and the losses. Only chunk 1's micro-batches use the head, each from its F (which writes it) to
# its W (zero bubble's wte gradient reads the dlogits and lnf), so stage 0 keeps the head in a
# pool of its own (llmc/stage.h), as many as pipeline_peak_heads counts, not one a slot: a head is
# taken when the F's input is received (the exchange before the F's group) and given back after
# the W. By hand: zbv runs chunk 1's F, B and W of a micro-batch, each alone, before the next
# one's F (its B waits for no other stage: its gradient is its own loss's), so 1; dualpipev's
# warm-up pairs W0 with F1 of chunk 1 in one group, whose exchange receives F1's input before W0
# reads micro-batch 0's head, so 2 (HEADS_BY_HAND); test_pipeline.c checks the count on every
# unit-time schedule against the timeline. Here the trainers run with it:
# the results against the float64 reference, the memory table's head row against one head's bytes
# by hand, the table equal to dev/memory_planner's and its total to the measured high-water mark
# to the byte (check_planner_matches_trainer). Read into test/run_tests.py's namespace.


HEADS_BY_HAND = {"zbv": 1, "dualpipev": 2}  # on stage 0, at any p >= 2 and m


def head_bytes_by_hand(cfg, B):
    """one head's bytes on the CPU backend (fp32, no tp or sp): lnf (B T C), its mean and rstd
    (B T each), the logits (B T Vp, Vp the vocabulary padded to a multiple of 128), the losses
    (B T), the vocabulary-parallel loss's row maxima (B T) and sums (B T 2); each tensor of an
    arena starts at a multiple of 256 bytes (llmc/model.h)"""
    BT, C, Vp = B * cfg["seq_len"], cfg["channels"], (cfg["vocab"] + 127) // 128 * 128
    up = lambda n: (n + 255) // 256 * 256
    return sum(up(4 * n) for n in (BT * C, BT, BT, BT * Vp, BT, BT, 2 * BT))


def check_head_row(out, heads, cfg, B, what):
    """the memory table's head row: `heads` heads of head_bytes_by_hand, the count in its note"""
    row = re.search(r"^ +head +([\d.]+) MB +(.*)$", out, re.M)
    assert row, "%s: no head row in the memory table\n%s" % (what, out[-3000:])
    expected = heads * head_bytes_by_hand(cfg, B)
    # (the table prints MB to 0.1; one head here is ~13 MB, so one head too many shows)
    assert abs(float(row.group(1)) - expected / 1e6) <= 0.05 + 1e-9, "%s: head row %s MB, by hand %d x %d bytes" % (
        what, row.group(1), heads, head_bytes_by_hand(cfg, B))
    assert ": %d head%s (" % (heads, "s" if heads > 1 else "") in row.group(2), "%s: %s" % (what, row.group(0))


def v_head_pool_run(ranks, p, sched, B, m, cfg, program=PP, extra=()):
    """a V run with its step-0 gradients: against the reference (losses, norms, gradients, final
    weights within the CPU fp32 tolerances), its table the planner's, stage 0's heads by hand"""
    ref = reference_run(cfg)
    d = fresh_dir("v_head_pool_%s_p%d_m%d_%s" % (os.path.basename(program), p, m, sched))
    grads_path = os.path.join(d, "grads.bin")
    args = trainer_args(ref, B, d, ["-n", cfg["steps"], "-dump_grads", grads_path] + list(extra), cfg=cfg)
    out = run_ok(ranks, args, program=program)
    if program == PP:
        expected = pp_step_bytes(cfg, B, m, p, 2, v_shape=True)
        check_against_reference(ref, d, grads_path, sum(expected.values()), "the sum of %s" % expected)
    else:  # (the grid's bytes per group: tests_v_grid.py)
        comparison.assert_matches(comparison.compare_run(ref, d, grads_path, "cpu fp32", cfg["steps"]))
    check_planner_matches_trainer(program, ranks, args, out)
    check_head_row(out, HEADS_BY_HAND[sched], cfg, B, "%s %s pp %d" % (program, sched, p))


@test
def v_head_pool_pp2_and_pp4_heads_on_stage_0():
    """zbv and dualpipev at pp 2 (m 4) and pp 4 (m 8) in the PP trainer: the reference's results,
    and stage 0's head row 1 (zbv) and 2 (dualpipev) heads, where every one of its 2p or 2p + 1
    slots held one before; the planner's table and the high-water mark equal"""
    for p, m, cfg in ((2, 4, REF4_GPT2), (4, 8, REF8_GPT2)):
        for sched in V_SCHEDULES:
            v_head_pool_run(p, p, sched, cfg["batch"] // m, m, cfg, extra=["-sched", sched, "-vp", 2])


@test
def v_head_pool_in_the_grid_with_dp_and_recompute():
    """the grid trainer at dp 2 x pp 2 (m 4 a replica, B 1) with -r 1 under both V schedules: each
    replica's stage 0 heads by hand, the reference's results, the planner's table to the byte"""
    for sched in V_SCHEDULES:
        v_head_pool_run(4, 2, sched, 1, 4, REF4_GPT2, program=D3, extra=grid3d_flags(2, 2, 1, sched=sched, V=2) + ["-r", 1])


@test
def v_head_pool_planner_counts_heads_as_the_schedules_hold_them():
    """dev/memory_planner's head row: in a V the heads by hand whatever p and m (d24 at pp 4, m 8
    and 16: stage 0 held 8 and 9 before, one a slot); off the V one a slot on the last stage as
    before (1f1b pp 2: 2 slots, 2 heads; afab pp 2 m 4: 4), and none on a stage without the head"""
    def head_row(flags):
        p = subprocess.run([str(f) for f in ["./dev/memory_planner", "-e", "d24", "-b", 1, "-t", 1024] + flags], cwd=ROOT,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
        row = re.search(r"^ +head +([\d.]+) MB +(.*)$", p.stdout.decode(), re.M)
        assert p.returncode in (0, 1) and row, (flags, p.stdout.decode()[-2000:])
        return row.group(2)
    for sched in V_SCHEDULES:
        for m in (8, 16):
            note = head_row(["-pp", 4, "-d", 1024 * m, "-sched", sched, "-stage", 0])
            heads = HEADS_BY_HAND[sched]
            assert ": %d head%s (" % (heads, "s" if heads > 1 else "") in note, (sched, m, note)
        assert "none" in head_row(["-pp", 4, "-d", 8192, "-sched", sched, "-stage", 3])
    assert ": 2 heads (one a slot)" in head_row(["-pp", 2, "-d", 8192, "-sched", "1f1b", "-stage", 1])
    assert ": 4 heads (one a slot)" in head_row(["-pp", 2, "-d", 4096, "-sched", "afab", "-stage", 1])
    assert "none" in head_row(["-pp", 2, "-d", 4096, "-sched", "afab", "-stage", 0])
