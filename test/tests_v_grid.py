# The V schedules (ZB-V, -sched zbv, and DualPipeV, -sched dualpipev: llmc/pipeline.h, walked by
# llmc/pipeline_walk.h) in the grid trainer beside the axes run_tests.py's and tests_5d.py's grids
# leave out: context parallelism (-cp 2) at pp 2, and experts (5D) at pp 2. In a V, stage s holds
# virtual stages s and 2pp - 1 - s, so stage 0 holds the first and the last layers (the embedding
# and the head, one wte) and the bottom stage hands chunk 0's output to its chunk 1 by a copy;
# with -cp each of those chunks runs attention's ring (or all-gather) over the cp group on T/cp
# tokens, and with experts each chunk's MoE layers route with their own layer's bias and record.
# Read into test/run_tests.py's namespace, so its helpers (test, make_grid3d_test, REF4_GPT2,
# read_log, ...) and tests_5d.py's and tests_5d_folds.py's (grid5d_shaped_run, grid5d_rank_tokens,
# fold_reference, MOE4) are used as if written here. Every run is held to the float64 reference
# of one process training the same model (test/reference.py): the result must not depend on the
# grid or the schedule.


# Dense, dp x pp x cp x tp with pp 2 and cp 2: compare_grid3d_with_reference (run_tests.py) on the
# 4-layer model with GPT-2's vocabulary (REF4_GPT2; run_tests.py says why not 1000 tokens) and
# m = 4 micro-batches a replica (zbv needs 2pp - 1 = 3, dualpipev 2pp = 4): losses, norms, every
# step-0 gradient, the final weights, rank 0's bytes per group each step against the README's
# formulas (in a V 2 m messages each way over pp, no embedding group; attention's K,V exchange
# over cp for stage 0's L/pp layers, which are layers 0 and 3), every copy identical, the memory table
# to the byte and dev/memory_planner's table equal to the trainer's, the activations held at most
# as the schedule counts them.
# (dp, pp, cp, tp, sp, schedule, m, ZeRO-1, cp layout, cp exchange), each a combination the
# existing grids lack:
V_CP_GRIDS = [
    # ZB-V over the zigzag ring, ZeRO-1 sharding the state over dp x cp = the 2 cp ranks
    (1, 2, 2, 1, 0, "zbv", 4, 1, "zigzag", "ring"),
    # DualPipeV with the contiguous split and the all-gather of K and V
    (1, 2, 2, 1, 0, "dualpipev", 4, 0, "contiguous", "allgather"),
    # both inside each stage: tp 2 with -sp (each rank B T/(cp tp) tokens of the residual stream,
    # the pipe's messages a / tp) beside cp 2 on the zigzag ring; 8 ranks
    (1, 2, 2, 2, 1, "dualpipev", 4, 0, "zigzag", "ring"),
    (1, 2, 2, 2, 1, "zbv", 4, 0, "zigzag", "ring"),
    # replicas beside cp: the gradients averaged and the state sharded (ZeRO-1) over dp x cp = 4
    # ranks, B = 1 sequence a micro-batch; 8 ranks
    (2, 2, 2, 1, 0, "dualpipev", 4, 1, "zigzag", "ring"),
]


def make_v_cp_test(dp, pp, cp, tp, sp, sched, m, zero, cp_layout, cp_comm):
    def fn():
        # (the V schedules hold 2 chunks a stage: -vp 2, as run_tests.py's V grids pass it)
        compare_grid3d_with_reference(dp, pp, tp, sp, sched, 2, m, zero, cp, cp_layout, cp_comm)
        # the figures it held to comparison.py's limits, printed as grid5d_run prints them: the
        # run is the one directory the test made
        d, = glob.glob(os.path.join(test_dir(""), "grid3d_*"))
        ref = reference_run(REF4_GPT2)
        report = comparison.compare_run(ref, d, os.path.join(d, "grads.bin"), "cpu fp32", REF4_GPT2["steps"])
        flags = grid3d_flags(dp, pp, tp, sp, sched, 2, zero, cp, cp_layout, cp_comm)
        print("    cpu train_gpt2_3d %s: %s" % (" ".join(map(str, flags)),
                                               ", ".join("%s %.2e" % (c[0], c[1]) for c in report["checks"])))
    sp_name, zero_name = "_sp" if sp else "", "_z1" if zero else ""
    fn.__name__ = "v_grid_cp_vs_pytorch_%dx%dx%dx%d%s_%s_%s_%s%s" % (dp, pp, cp, tp, sp_name, sched, cp_layout, cp_comm,
                                                                    zero_name)
    fn.__doc__ = "-sched %s on dp x pp x cp x tp = %dx%dx%dx%d%s, -cp_layout %s -cp_comm %s%s, m %d, against the " \
                 "float64 reference" % (sched, dp, pp, cp, tp, " -sp" if sp else "", cp_layout, cp_comm,
                                        " -z 1" if zero else "", m)
    return fn


for _grid in V_CP_GRIDS:
    test(make_v_cp_test(*_grid))


# 5D with a V at pp 2: the V needs L divisible by 2 pp = 4, so the 4-layer MoE model MOE4
# (tests_5d_folds.py; its note says why its learning rate is half MOE's), E 4 experts top-1 (as
# most of GRID5D's cases: tests_5d.py's note on top-2 near the norm's limit). grid5d_shaped_run
# (tests_5d_folds.py) holds the run to the reference: losses, norms, every step-0 gradient
# (routers' and experts'), the final weights, AdamW's first moments, the aux loss, MaxVio and
# dropped share each step, the memory table's total to the byte, the world's and the seq group's
# bytes, every copy identical. Here also rank 0's all-to-all bytes over its ep group from the
# reference's routing of the V's layers (v_grid_check_ep_bytes).
# (name, ranks, grid flags, B, E, k): m = 8 / (dp B) = 4 micro-batches a replica in each
V_5D = [
    # ZB-V: experts over the dp 2 replicas of each stage (its B action computes the experts'
    # weight gradients, W the rest)
    ("pp2_dp2_ep2_zbv", 4, ["-pp", 2, "-dp", 2, "-ep", 2, "-sched", "zbv"], 1, 4, 1),
    # DualPipeV: experts over the 2 cp ranks of each stage, each routing its T/cp tokens of every
    # sequence, the aux loss's figures summed over the seq group
    ("pp2_cp2_ep2_dualpipev", 4, ["-pp", 2, "-cp", 2, "-ep", 2, "-sched", "dualpipev"], 2, 4, 1),
    # DualPipeV with tp 2 and -sp: each tp rank routes its B T/tp tokens, experts over the tp pair
    ("pp2_tp2_sp_ep2_dualpipev", 4, ["-pp", 2, "-tp", 2, "-sp", 1, "-ep", 2, "-sched", "dualpipev"], 2, 4, 1),
    # ZeRO-1 in a V: the dense state sharded over dp 2, the experts' over edp (1 here: ep 2 holds
    # each expert once), F&B pairs' forward outputs sent under their backward (-pp_overlap 1)
    ("pp2_dp2_ep2_z1_dualpipev_overlap", 4, ["-pp", 2, "-dp", 2, "-ep", 2, "-z", 1, "-sched", "dualpipev",
                                              "-pp_overlap", 1], 1, 4, 1),
    # every axis but dp on 8 ranks: experts over a stage's cp 2 x tp 2 ranks
    ("pp2_cp2_tp2_sp_ep4_zbv", 8, ["-pp", 2, "-cp", 2, "-tp", 2, "-sp", 1, "-ep", 4, "-sched", "zbv"], 2, 4, 1),
]


def v_grid_stage0_layers(L, pp):
    """the model's layers on stage 0 in a V, in the order the rank stores them: chunk 0 is virtual
    stage 0 (layers 0 .. L/(2pp) - 1), chunk 1 virtual stage 2pp - 1 (the last L/(2pp))"""
    per_chunk = L // (2 * pp)
    return list(range(per_chunk)) + list(range(L - per_chunk, L))


def v_grid_check_ep_bytes(d, flags, B, E, k, cfg):
    """rank 0's all-to-all bytes over its ep group each step, from the reference's routing (as
    tests_5d.py's grid5d_run counts them, on the V's stage-0 layers): per layer of stage 0 and
    micro-batch, the kept slots of rank 0's tokens routed to the other ranks' experts (the tokens
    out, their gradients back) and the slots of the other ranks' tokens routed to rank 0's experts
    (the outputs back, their input gradients), C floats a row each way; and the counts, E/ep ints
    to each other rank. In a V stage 0's layers are the first and the last (v_grid_stage0_layers);
    counted on a plain pipeline's stage 0 (layers 0 and 1) instead, every case here expects other
    bytes (1-3% apart, as measured), so the count sees which layers the stage runs"""
    ref = fold_reference(cfg, E, k)
    axes = ("-dp", "-pp", "-cp", "-tp", "-ep")
    grid = {flags[i]: int(flags[i + 1]) for i in range(0, len(flags) - 1) if flags[i] in axes}
    dp, pp, cp, tp, ep = (grid.get(f, 1) for f in axes)
    m, L, T, C, El = cfg["batch"] // (dp * B), cfg["layers"], cfg["seq_len"], cfg["channels"], E // ep
    layers = v_grid_stage0_layers(L, pp)
    train, _ = read_log(d)
    for s in range(cfg["steps"]):
        sent = back = 0
        for layer in layers:
            route = ref["routes"][s][layer]
            for q in range(ep):  # rank 0's ep group: the stage's first ep ranks
                for j in grid5d_rank_tokens(q, dp, cp, tp, m, B, T):
                    for e in route[j * k:(j + 1) * k]:
                        if e >= 0 and q == 0 and e // El != 0:
                            sent += 1
                        elif e >= 0 and q != 0 and e // El == 0:
                            back += 1
        expected = 2 * (sent + back) * C * 4 + m * len(layers) * El * (ep - 1) * 4
        got = train[s + 1]["comm"]["ep"]["all_to_all"]
        assert got == expected, "step %d: ep all-to-all %d bytes, the reference's routing of layers %s gives %d" % (
            s + 1, got, layers, expected)


def make_v_5d_test(name, ranks, flags, B, E, k):
    def fn():
        _, d = grid5d_shaped_run("v_grid_5d_" + name, ranks, flags, B, E, k, MOE4)
        v_grid_check_ep_bytes(d, flags, B, E, k, MOE4)
    fn.__name__ = "v_grid_5d_vs_pytorch_" + name
    fn.__doc__ = "5D in a V: %d ranks, %s, B %d, E %d top-%d, 4 layers, against the float64 reference" % (
        ranks, " ".join(map(str, flags)), B, E, k)
    return fn


for _case in V_5D:
    test(make_v_5d_test(*_case))


@test
def v_grid_5d_vs_pytorch_bias():
    """-balance bias in a V at pp 2 (dualpipev, dp 2, ep 2, MOE4): stage 0 holds layers 0 and 3,
    stage 1 layers 1 and 2. Each chunk's MoE layers route with their own model layer's bias and
    count their loads in its row of the (L, E) loads, all-reduced over the world, which move each
    layer's biases by +-gamma a step as the reference's. (With -balance aux every bias stays zero:
    a chunk that took another layer's row routes as the reference does, and only MaxVio, from its
    loads counted in the wrong row, shows it; here its routing and its biases' updates differ too.)
    Held to the reference: losses, norms, step-0 gradients, final weights, the MoE figures each
    step, and the final biases (1e-8, tests_5d.py's limit: each step moves a b_e by +-gamma, and
    fp32's sum of those is within 1e-9)"""
    cfg, E, k, B, steps = MOE4, 4, 1, 1, MOE4["steps"]
    flags = ["-pp", 2, "-dp", 2, "-ep", 2, "-sched", "dualpipev", "-balance", "bias"]
    ref = fold_reference(cfg, E, k, "bias")
    d = fresh_dir("v_grid_5d_bias")
    grads = os.path.join(d, "grads.bin")
    args = trainer_args(ref, B, d, ["-n", steps, "-dump_grads", grads, "-check_replicas", steps] + flags, cfg=cfg)
    out = run_ok(4, args, program=D3)
    report = comparison.compare_run(ref, d, grads, "cpu fp32", steps)
    print("    cpu train_gpt2_3d %s: %s" % (" ".join(map(str, flags)),
                                           ", ".join("%s %.2e" % (c[0], c[1]) for c in report["checks"])))
    comparison.assert_matches(report)
    check_moe_figures(out, ref, steps, 0.0)
    bias, expected = checkpoint_bias(d, steps, cfg["layers"], E), np.array(ref["bias"]).reshape(-1)
    assert np.abs(expected).max() > 0, "the reference's bias never moved: the check would not see a wrong row"
    assert np.abs(bias - expected).max() <= 1e-8, "final bias %s, reference %s" % (bias.tolist(), expected.tolist())
    assert "step %d: dp replicas identical" % steps in out, out[-2000:]
