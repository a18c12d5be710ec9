# More of 5D in the grid trainer (train_gpt2_3d.cu with -experts), the folds and paths that
# test/tests_5d.py's GRID5D table leaves out: an ep group smaller than the tp group, an ep that
# neither divides tp nor is divided by it, the interleaved schedule with experts in its chunks,
# validation and samples on a 5D grid, and a capacity run's checkpoint between this trainer and
# train_gpt2_ep. Read into test/run_tests.py's namespace like every tests_*.py (its helpers and
# tests_5d.py's grid5d_run are used as if written here). Every run is held to the float64
# reference of one process training the same MoE model (test/reference.py).

# Two shapes that MOE (2 layers, 4 heads, T = 32, 8 sequences a step) cannot take:
# MOE3, REF3's 3 heads of 16 channels, T = 24 and a vocabulary of 1100 (padded to 1152 = 3 x 384),
# for 3 tp ranks. With MOE every axis but pp is a power of two (dp divides the 8 sequences, tp the
# 4 heads, cp the 32 positions), so an ep, which divides dp cp tp, always divides tp or is divided
# by it; tp 3 beside dp 2 makes a stage of 6 ranks whose ep 2 does neither.
MOE3 = dict(REF3, router_std=1.0)
# MOE4, 4 layers, for pp 2 x vp 2 (the interleaved schedule needs L to divide by pp vp), at half
# MOE's peak learning rate. Its final weights are otherwise held by AdamW's eps, not by fp32: a
# few thousand of its weights have a float64 step-0 gradient of 1e-10 or less, which fp32 computes
# as ~1e-9 of noise, and the first step moves each by lr g / (|g| + eps), eps = 1e-8: up to a
# tenth of a step apart. At lr 1e-3 that left 1.3e-5 to 1.6e-5 off float64 after 5 steps, on one
# rank too, or 2e-6 to 4e-6, as unrelated edits moved the fp32 sums (E 2 or 4, top-1; top-2 3e-5),
# against the 2e-5 limit. At 5e-4 half that, measured 1.0e-6 to 7.8e-6 over the same grids and
# versions; a wrong update (the order of a step, 5e-4) still stands 25 times past the limit, and
# the step-0 gradients and AdamW's m, which the learning rate does not scale, are checked as ever.
MOE4 = dict(MOE, layers=4, lr=5e-4)


def fold_reference(cfg, E, k, balance="aux", cf=0.0, capacity_tokens=0):
    """moe_reference (run_tests.py, MOE's shape only) for any shape: the first seed from 1 whose
    routing keeps MOE_MARGIN clear of a tie at every step, layer and token"""
    if cfg is MOE:
        return moe_reference(E, k, balance, cf, capacity_tokens)
    shared_dir(SMALL_VOCAB, small_vocabulary)  # the tokens (reference.run reads them)
    shape = "L%d_NH%d_C%d_T%d_V%d_B%d_S%d_lr%g" % tuple(cfg[key] for key in ("layers", "heads", "channels", "seq_len",
                                                                             "vocab", "batch", "steps", "lr"))
    for seed in range(1, 30):
        out = os.path.join(TMP, "moe_reference_%s_E%d_k%d_%s_cf%g_n%d_seed%d" % (shape, E, k, balance, cf,
                                                                               capacity_tokens, seed))
        args = dict(cfg, out=out, seed=seed, experts=E, topk=k, balance=balance, aux_alpha=0.01, bias_rate=1e-3,
                    capacity_factor=cf, capacity_tokens=capacity_tokens)
        shared_dir(out, lambda out: reference.run(type("Args", (), dict(args, out=out))))
        ref = comparison.read_reference(out)
        if ref["min_route_margin"] > MOE_MARGIN:
            return ref
    raise AssertionError("no seed in 1..29 routes %s E=%d k=%d clear of ties" % (shape, E, k))


def grid5d_shaped_run(name, ranks, flags, B, E, k, cfg):
    """grid5d_run's checks (tests_5d.py) on a model of another shape than MOE's (grid5d_run runs
    MOE's alone): losses, norms, every step-0 gradient, the final weights, AdamW's first moments,
    the MoE figures each step, the memory table's total, the world's and the seq group's bytes,
    every copy identical. -balance aux, dropless. Returns (the run's output, its directory)"""
    steps = cfg["steps"]
    ref = fold_reference(cfg, E, k)
    d = fresh_dir(name)
    grads = os.path.join(d, "grads.bin")
    out = run_ok(ranks, trainer_args(ref, B, d, ["-n", steps, "-dump_grads", grads, "-check_replicas", steps] + list(flags),
                                     cfg=cfg), program=D3)
    check_memory_table_total(D3, out)
    report = comparison.compare_run(ref, d, grads, "cpu fp32", steps)
    print("    cpu train_gpt2_3d %s: %s" % (" ".join(map(str, flags)),
                                           ", ".join("%s %.2e" % (c[0], c[1]) for c in report["checks"])))
    comparison.assert_matches(report)
    # AdamW's m: 1e-4 of the largest, grid5d_run's limit and reason (an expert's gradient read at
    # a wrong scale, tp/ep, is off by a factor there, while rounding leaves 1e-5)
    m, m_ref = checkpoint_moments(d, steps), reference.read_model_file(os.path.join(ref["dir"], "final_m.bin"))[1]
    err = np.abs(m - m_ref).max() / np.abs(m_ref).max()
    assert err <= 1e-4, "AdamW m after step %d: %.2e of the largest (limit 1e-4)" % (steps, err)
    check_moe_figures(out, ref, steps, 0.0)
    # the world's 4 + 4 (L E + 3) bytes (the norm; the loads, kept and dropped slots, the aux
    # loss), and with cp x tp > 1 each sequence's f and P over the seq group: m Ls B 2E 4
    grid = {flags[i]: int(flags[i + 1]) for i in range(0, len(flags) - 1) if flags[i] in ("-dp", "-pp", "-cp", "-tp")}
    dp, pp, cp, tp = (grid.get(f, 1) for f in ("-dp", "-pp", "-cp", "-tp"))
    m, L = cfg["batch"] // (dp * B), cfg["layers"]
    train, _ = read_log(d)
    for s in range(steps):
        comm = train[s + 1]["comm"]
        assert comm["world"]["all_reduce"] == 4 + 4 * (L * E + 3), (s + 1, comm["world"])
        seq = m * (L // pp) * B * 2 * E * 4 if cp * tp > 1 else 0
        assert comm.get("seq", {}).get("all_reduce", 0) == seq, (s + 1, comm.get("seq"), seq)
    assert "step %d: dp replicas identical" % steps in out or "dp replicas" not in out, out[-2000:]
    assert "step %d: experts' copies identical" % steps in out or "experts' copies" not in out, out[-2000:]
    return out, d


# (name, ranks, grid flags, B, E, k, model shape), each a fold GRID5D lacks, top-1 as most of
# GRID5D's (tests_5d.py's note: top-2 with tp ranks routing parts of the tokens ends near the
# norm's limit). The fold puts ep consecutive ranks of a stage in an ep group and the stage's
# first max(tp, ep) ranks in the model group:
FOLDS = [
    # ep < tp: the tp group {0..3} holds two ep groups {0,1} {2,3}, each routing the tokens of
    # half the tp ranks; each expert has two copies (edp 2) inside one tp group, and the model
    # group is the tp group
    ("tp4_sp_ep2", 4, ["-tp", 4, "-sp", 1, "-ep", 2], 4, 4, 1, MOE),
    # ep 2 and tp 3, neither dividing the other: the ep group {2,3} joins the last tp rank of
    # replica 0 with the first of replica 1, so its all-to-alls carry two replicas' tokens
    ("dp2_tp3_sp_ep2", 6, ["-dp", 2, "-tp", 3, "-sp", 1, "-ep", 2], 4, 4, 1, MOE3),
    # the interleaved schedule, 2 stages of 2 chunks each, MoE layers in every chunk (a chunk's
    # layer is its own: each routes with its own statistics), experts over dp 2, 4 micro-batches
    # a replica in flight (MOE4 says why its learning rate is half MOE's)
    ("pp2_vp2_interleaved_dp2_ep2", 4, ["-pp", 2, "-vp", 2, "-sched", "interleaved", "-dp", 2, "-ep", 2], 1, 4, 1, MOE4),
]


def make_fold_test(name, ranks, flags, B, E, k, cfg):
    def fn():
        if cfg is MOE:
            grid5d_run("grid5d_fold_" + name, ranks, flags, B, E, k)
        else:
            grid5d_shaped_run("grid5d_fold_" + name, ranks, flags, B, E, k, cfg)
    fn.__name__ = "grid5d_fold_vs_pytorch_" + name
    fn.__doc__ = "5D: %d ranks, %s, B %d, E %d top-%d, %d layers %d heads, against the float64 reference" % (
        ranks, " ".join(map(str, flags)), B, E, k, cfg["layers"], cfg["heads"])
    return fn


for _case in FOLDS:
    test(make_fold_test(*_case))


def reference_val_loss(model_path, cfg, B, batches, what):
    """the validation loss a trainer reports for the weights in model_path (the reference's fp32
    model file), in float64: the mean over -m batches of B x T tokens of the val file, batch i
    from token i B T (llmc/run.h's run_validate, every replica on the same chunk), the
    cross-entropy alone (no aux term: that is training's). Its routing must keep MOE_MARGIN clear
    of ties, as the reference's training tokens do, or fp32 may route a token elsewhere"""
    import torch
    model = reference.load_model_file(model_path).double()
    tokens, T = reference.read_tokens(cfg["val_tokens"]), cfg["seq_len"]
    losses, margin = [], math.inf
    with torch.no_grad():
        for i in range(batches):
            chunk = torch.from_numpy(tokens[i * B * T: (i + 1) * B * T + 1])
            losses.append(model(chunk[:-1].view(B, T), chunk[1:].view(B, T)).item())
            margin = min([margin] + [b.routing["margin"] for b in model.blocks])
    assert margin > MOE_MARGIN, "%s: the val tokens' routing comes %.2g from a tie (the check needs %g)" % (
        what, margin, MOE_MARGIN)
    return sum(losses) / batches


@test
def grid5d_fold_validation_and_samples():
    """validation and samples on pp 2 x cp 2 x tp 2 with -sp at ep 4 (every axis but dp, 8
    ranks): validation before every step (-v 1, 2 batches) leaves the training as grid5d_run
    checks it (losses, gradients, weights, moments, the MoE figures each step: no val routing
    counted in a step's loads); the validation losses of the initial and the final weights are
    the reference's on the same val batches; a sample at the last step is printed, the tokens one
    rank draws from the same run"""
    B, E, k, steps = 4, 4, 1, MOE["steps"]
    flags = ["-pp", 2, "-cp", 2, "-tp", 2, "-sp", 1, "-ep", 4]
    more = ["-v", 1, "-m", 2, "-s", steps, "-g", 8]
    out, d = grid5d_run("grid5d_fold_val", 8, flags, B, E, k, extra=more)
    _, val = read_log(d)
    assert sorted(val) == list(range(steps + 1)), "validated at steps %s, expected 0..%d" % (sorted(val), steps)
    ref = moe_reference(E, k)
    for step, weights in ((0, "model.bin"), (steps, "final.bin")):
        expected = reference_val_loss(os.path.join(ref["dir"], weights), MOE, B, 2, "step %d" % step)
        # 1e-5, the training loss's limit (test/comparison.py): at step 0 fp32's forward on the
        # same weights (~5e-7 measured for the training loss), at the last step on weights within
        # fp32 rounding of the reference's, as the training loss of step 5 is (on step 4's)
        assert abs(val[step]["val_loss"] - expected) <= 1e-5, "step %d: val loss %.7f, reference %.7f" % (
            step, val[step]["val_loss"], expected)
    samples = samples_by_step(out)
    assert list(samples) == [steps] and samples[steps].strip(), "samples: %s\n%s" % (samples, out[-2000:])
    # the same run on one rank (ep 1) samples the same tokens: its final weights are within fp32
    # rounding of the grid's, and a draw would need to fall within ~1e-6 of a boundary of the
    # cumulative probabilities to pick another token
    one = fresh_dir("grid5d_fold_val_one_rank")
    one_samples = samples_by_step(run_ok(1, trainer_args(ref, B, one, ["-n", 0] + more, cfg=MOE), program=D3))
    assert one_samples == samples, "the 5D grid sampled %s, one rank %s" % (samples, one_samples)


@test
def grid5d_fold_capacity_checkpoint_between_trainers():
    """a capacity run (-capacity_factor 1.25, top-2) checkpointed at step 3 by train_gpt2_3d on
    pp 2 x dp 2 at ep 2, resumed by train_gpt2_ep at ep 4; and one of train_gpt2_ep at ep 2
    resumed here on dp 4 at ep 4: steps 4 and 5 drop the reference's slots (the MoE figures as the
    reference's), and the final weights are the uninterrupted run's within fp32 rounding (2e-6,
    as tests_5d.py's resume test). The capacity counts a rank's micro-batch, so a resume
    continues the same trajectory only where each rank routes the same tokens: every grid here
    gives each rank whole micro-batches of B = 2 sequences, chunk i of the global batch's 64-token
    groups (the reference's capacity groups) on one rank whichever the grid. (With -cp or -tp -sp
    a rank holds a slice of each sequence, groups of fewer tokens that train_gpt2_ep never makes:
    the checkpoint's "capacity: N tokens a rank" then refuses the resume, checked last.)"""
    B, E, k, cf = 2, 4, 2, 1.25
    ref = moe_reference(E, k, "aux", cf, B * MOE["seq_len"])
    tol = comparison.TOLERANCES["cpu fp32"]

    def run(ranks, program, flags, d, more=()):
        return mpirun(ranks, trainer_args(ref, B, d, ["-n", 3, "-capacity_factor", cf] + list(more) + list(flags), cfg=MOE),
                      program=program)

    assert max(ref["dropped"][3:]) > 0, "the reference dropped nothing in steps 4, 5: the test would not see drops"
    cases = [("3d_to_ep", 4, D3, ["-pp", 2, "-dp", 2, "-ep", 2], 4, "./train_gpt2_ep", ["-ep", 4]),
             ("ep_to_3d", 2, "./train_gpt2_ep", ["-ep", 2], 4, D3, ["-dp", 4, "-ep", 4])]
    for name, w_ranks, writer, w_flags, r_ranks, reader, r_flags in cases:
        whole = fresh_dir("grid5d_fold_capacity_" + name)
        code, out = run(w_ranks, writer, w_flags, whole)
        assert code == 0, why_it_failed(out)
        d = grid5d_step3(whole, "grid5d_fold_capacity_resumed_" + name)
        code, out = run(r_ranks, reader, r_flags, d, ["-y", 1])
        assert code == 0 and "resumed from step 3" in out, why_it_failed(out)
        err = np.abs(grid5d_final(d) - grid5d_final(whole)).max()
        assert err <= 2e-6, "%s: max difference %g from the uninterrupted run (fp32 rounding: 2e-6)" % (name, err)
        # steps 4 and 5 against the reference: the loss and norm within the CPU's fp32 limits,
        # the MoE figures as check_moe_figures holds them (the dropped share exactly: counts)
        train, _ = read_log(d)
        figures = moe_figures(out)
        assert sorted(train) == [4, 5] and sorted(figures) == [4, 5], (sorted(train), sorted(figures))
        for s in (4, 5):
            assert abs(train[s]["train_loss"] - ref["losses"][s - 1]) <= tol["loss"], (name, s, train[s], ref["losses"])
            assert abs(train[s]["grad_norm"] / ref["grad_norms"][s - 1] - 1) <= tol["norm"], (name, s, train[s])
            aux, vio, dropped = figures[s]
            assert abs(aux - ref["aux_losses"][s - 1]) <= 2e-6, (name, s, aux, ref["aux_losses"][s - 1])
            assert abs(vio - ref["max_vio"][s - 1]) <= 1e-6, (name, s, vio, ref["max_vio"][s - 1])
            assert abs(dropped - ref["dropped"][s - 1]) <= 1e-6, (name, s, dropped, ref["dropped"][s - 1])
        p_ref = reference.read_model_file(os.path.join(ref["dir"], "final.bin"))[1]
        err = np.abs(grid5d_final(d) - p_ref).max()
        assert err <= tol["params_max"], "%s: final weights %g off the reference's (limit %g)" % (name, err, tol["params_max"])
    # the EP checkpoint on a grid whose ranks route other tokens (tp 2 -sp: 2 x 16 positions a
    # rank) is refused, once, naming the capacity's tokens a rank, and nothing is written
    d = grid5d_step3(whole, "grid5d_fold_capacity_refused")
    before = sorted(os.listdir(d))
    code, out = run(4, D3, ["-dp", 2, "-tp", 2, "-sp", 1, "-ep", 2], d, ["-y", 1])
    message = "capacity: 64 tokens a rank in the checkpoint, 32 tokens a rank now"
    assert code != 0 and out.count(message) == 1, "expected '%s' once:\n%s" % (message, out[-2000:])
    assert sorted(os.listdir(d)) == before, "the refused resume wrote %s" % sorted(set(os.listdir(d)) - set(before))
