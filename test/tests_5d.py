# Tests of 5D in the grid trainer (train_gpt2_3d.cu with -experts: the EP chapter's MoE layers
# inside its pipeline stages, experts folded over each stage's dp x cp x tp ranks). Read into
# test/run_tests.py's namespace, so its helpers (test, run_ok, mpirun, fresh_dir, MOE,
# moe_reference, moe_figures, trainer_args, comparison, checkpoint_moments, checkpoint_bias,
# check_memory_table_total, read_log, D3, ...) are used as if written there. Every run is held to
# the float64 reference of one process training the same MoE model (test/reference.py): the
# result must not depend on the grid.


def grid5d_run(name, ranks, flags, B, E, k, balance="aux", cf=0.0, extra=()):
    """a 5-step run of the grid trainer on the MoE reference's model with these grid flags and
    micro-batch B, compared with the reference: losses, norms, every step-0 gradient (routers and
    experts too: -dump_grads reads the experts as the optimizer does), the final weights, AdamW's
    first moments, the aux loss, MaxVio and dropped share each step, every copy of every tensor
    identical, the memory table's total to the byte. Returns (the run's output, its directory)"""
    cfg, steps = MOE, MOE["steps"]
    # capacity counts a rank's micro-batch (B T tokens with dp alone): the reference's capacity
    # groups are those
    ref = moe_reference(E, k, balance, cf, B * cfg["seq_len"] if cf > 0 else 0)
    d = fresh_dir(name)
    grads = os.path.join(d, "grads.bin")
    args = trainer_args(ref, B, d, ["-n", steps, "-dump_grads", grads, "-balance", balance, "-capacity_factor", cf,
                                    "-check_replicas", steps] + list(flags) + list(extra), cfg=cfg)
    out = run_ok(ranks, args, program=D3)
    check_memory_table_total(D3, out)
    report = comparison.compare_run(ref, d, grads, "cpu fp32", steps)
    print("    cpu train_gpt2_3d %s: %s" % (" ".join(map(str, flags)),
                                           ", ".join("%s %.2e" % (c[0], c[1]) for c in report["checks"])))
    comparison.assert_matches(report)
    # AdamW's m after the last step: the gradients as the optimizer read them (an expert's read
    # at a wrong scale, tp/ep, hardly moves the weights, AdamW's m / sqrt(v) cancels it; m sees
    # it whole). The EP trainer's tests measured 1.0e-5 of the largest at most: 1e-4
    m, m_ref = checkpoint_moments(d, steps), reference.read_model_file(os.path.join(ref["dir"], "final_m.bin"))[1]
    err = np.abs(m - m_ref).max() / np.abs(m_ref).max()
    assert err <= 1e-4, "AdamW m after step %d: %.2e of the largest (limit 1e-4)" % (steps, err)
    check_moe_figures(out, ref, steps, cf)  # the aux loss, MaxVio, the dropped share (run_tests.py)
    if balance == "bias":  # the final bias: each step moves a b_e by +-gamma, fp32's sum within 1e-9
        bias, expected = checkpoint_bias(d, steps, cfg["layers"], E), np.array(ref["bias"]).reshape(-1)
        assert np.abs(bias - expected).max() <= 1e-8, "final bias %s, reference %s" % (bias.tolist(), expected.tolist())
        assert np.abs(expected).max() > 0, "the reference's bias never moved: the check would not see a wrong sign"
    # the bytes the formulas printed at the start give, from main.log's counters (rank 0): the
    # world's 4 (the norm) + 4 (L E + 2) (the loads, kept and dropped slots) + 4 (the aux loss);
    # with cp x tp > 1 and -balance aux, each layer's f and P of every sequence over the seq group,
    # m Ls B 2E 4 (Ls the first stage's layers)
    grid = {flags[i]: int(flags[i + 1]) for i in range(0, len(flags) - 1) if flags[i] in ("-dp", "-pp", "-cp", "-tp")}
    pp, cp, tp = (grid.get(f, 1) for f in ("-pp", "-cp", "-tp"))
    dp = grid.get("-dp", ranks // (pp * cp * tp))  # (without -dp the replicas fill the world)
    m, L = cfg["batch"] // (dp * B), cfg["layers"]
    train, _ = read_log(d)
    for s in range(steps):
        comm = train[s + 1]["comm"]
        assert comm["world"]["all_reduce"] == 4 + 4 * (L * E + 3), (s + 1, comm["world"])
        seq = m * (L // pp) * B * 2 * E * 4 if cp * tp > 1 and balance == "aux" else 0
        assert comm.get("seq", {}).get("all_reduce", 0) == seq, (s + 1, comm.get("seq"), seq)
    # rank 0's all-to-all bytes over its ep group, from the reference's routing (as the EP
    # trainer's check, run_tests.py): per layer of stage 0 and micro-batch, the kept slots it
    # routes to the experts of the other ranks of its group (the tokens out, their gradients back
    # in the backward) and the slots those ranks route to its own experts (the outputs back, and
    # their input gradients), C floats a row each way; and the counts, E/ep ints to each other rank
    ep = int(flags[flags.index("-ep") + 1])
    if ep > 1:
        El, T, Ls = E // ep, cfg["seq_len"], L // pp
        for s in range(steps):
            sent = back = 0
            for layer in ref["routes"][s][:Ls]:
                for q in range(ep):  # rank 0's group: the stage's first ep ranks
                    for j in grid5d_rank_tokens(q, dp, cp, tp, m, B, T):
                        for e in layer[j * k:(j + 1) * k]:
                            if e >= 0 and q == 0 and e // El != 0:
                                sent += 1
                            elif e >= 0 and q != 0 and e // El == 0:
                                back += 1
            expected = 2 * (sent + back) * cfg["channels"] * 4 + m * Ls * El * (ep - 1) * 4
            assert train[s + 1]["comm"]["ep"]["all_to_all"] == expected, (s + 1, train[s + 1]["comm"]["ep"], expected)
    # -z 1: the experts' gradients reduce-scattered and their parameters all-gathered over edp,
    # each of a rank's E/ep experts of its Ls layers (fcw 4C C, fcb 4C, fcprojw C 4C, fcprojb C),
    # the region padded to edp x 128 elements of 4 bytes (model.h's ZERO_ALIGN); none all-reduced.
    # (With edp 1 the collectives are a copy, and count their payload as every group does)
    if "-z" in flags:
        ep = int(flags[flags.index("-ep") + 1])
        edp, C = dp * cp * tp // ep, cfg["channels"]
        region = (L // pp) * (E // ep) * (8 * C * C + 5 * C)
        padded = -(-region // (edp * 128)) * edp * 128
        for s in range(steps):
            comm = train[s + 1]["comm"].get("expert_dp", {})
            assert comm.get("reduce_scatter", 0) == comm.get("all_gather", 0) == padded * 4 and \
                comm.get("all_reduce", 0) == 0, (s + 1, comm, padded * 4)
    # every copy the same after the last step: the dense tensors over dp x cp, each expert over
    # the ranks holding it (when there is more than one copy)
    assert "step %d: dp replicas identical" % steps in out or "dp replicas" not in out, out[-2000:]
    return out, d


def grid5d_rank_tokens(q, dp, cp, tp, m, B, T):
    """the tokens stage rank q routes in a step, as indices into the global batch (sequence
    after sequence, T each): micro-batch i of its replica is chunk i dp + dp_rank of B sequences;
    its cp rank holds the zigzag chunks r and 2cp-1-r of each sequence (T/(2cp) tokens each); with
    tp > 1 (-sp) its tp share of those, BTs = B Tl / tp consecutive of the (b, t) rows"""
    tp_rank, cp_rank, dp_rank = q % tp, q // tp % cp, q // (tp * cp)
    if cp > 1:
        w = T // (2 * cp)
        local = list(range(cp_rank * w, (cp_rank + 1) * w)) + list(range((2 * cp - 1 - cp_rank) * w, (2 * cp - cp_rank) * w))
    else:
        local = list(range(T))
    tokens = []
    for i in range(m):
        chunk = i * dp + dp_rank
        rows = [(chunk * B + b) * T + t for b in range(B) for t in local]
        share = len(rows) // tp
        tokens += rows[tp_rank * share:(tp_rank + 1) * share]
    return tokens


# (name, ranks, grid flags, B, E, k): each a way the fifth axis folds. dp only: the EP chapter's
# layout in the grid trainer. Over cp and tp: Megatron's folding, experts on the ranks that hold
# one replica's sequences. With stages: MoE layers in both, under 1F1B, ZB-H1 (its B action
# computes the experts' weight gradients) and GPipe, with several micro-batches in flight (a
# record a slot). (As for the EP trainer's cases, run_tests.py's note above make_ep_test: an
# expert left with few tokens has a noise-sized gradient that AdamW turns into steps of lr, so a
# case is kept where its final weights and norms stay about half the limits, as measured: at
# top-2 the grids with tp ranks routing half the tokens each ended 1.1-1.2e-5 off in the norm,
# and dp2 ep2 between 6e-6 and 1.0e-5 as unrelated edits moved the buffers (fp32's summation
# order); at top-1 within the limits. cp2 tp2 sp ep4 keeps top-2's gates: 4.2e-6 in the norm)
GRID5D = [
    ("dp2_ep2", 2, ["-ep", 2], 4, 4, 1),
    # two copies of each expert (edp 2): over the dp group itself, and over a part of dp x cp
    ("dp2_tp2_sp_ep2", 4, ["-dp", 2, "-tp", 2, "-sp", 1, "-ep", 2], 4, 4, 1),
    ("dp2_cp2_ep2", 4, ["-dp", 2, "-cp", 2, "-ep", 2], 4, 4, 1),
    ("pp2_tp2_sp_ep2", 4, ["-pp", 2, "-tp", 2, "-sp", 1, "-ep", 2], 8, 4, 1),
    ("cp2_tp2_sp_ep4", 4, ["-cp", 2, "-tp", 2, "-sp", 1, "-ep", 4], 8, 4, 2),
    ("dp2_pp2_tp2_sp_ep4_zb", 8, ["-dp", 2, "-pp", 2, "-tp", 2, "-sp", 1, "-ep", 4, "-sched", "zb"], 2, 4, 1),
    ("pp2_cp2_tp2_sp_ep4_afab", 8, ["-pp", 2, "-cp", 2, "-tp", 2, "-sp", 1, "-ep", 4, "-sched", "afab"], 4, 4, 1),
    # ZeRO-1 in two regions: the dense tensors' state sharded over dp (x cp), the experts' over
    # edp (one copy a stage under 1F1B; two over dp x tp, where the edp groups are the dp groups;
    # two over dp x cp, where the dense state splits 4 ways and the experts' 2)
    ("dp2_pp2_ep2_z1", 4, ["-dp", 2, "-pp", 2, "-ep", 2, "-z", 1], 4, 4, 1),
    ("dp2_tp2_sp_ep2_z1", 4, ["-dp", 2, "-tp", 2, "-sp", 1, "-ep", 2, "-z", 1], 4, 4, 1),
    ("dp2_cp2_ep2_z1", 4, ["-dp", 2, "-cp", 2, "-ep", 2, "-z", 1], 4, 4, 1),
    # the V (dualpipev) with experts: the 2-layer model at pp = 1 is one stage of two chunks, its
    # MoE layers in both, chunk 0's output handed to chunk 1 and back by the stage itself, a
    # routing record for each (micro-batch, chunk) slot, two F&B pairs' worth of micro-batches
    ("dp2_tp2_sp_ep2_dualpipev", 4, ["-dp", 2, "-tp", 2, "-sp", 1, "-ep", 2, "-sched", "dualpipev"], 2, 4, 1),
]


def make_grid5d_test(name, ranks, flags, B, E, k):
    def fn():
        grid5d_run("grid5d_" + name, ranks, flags, B, E, k)
    fn.__name__ = "grid5d_vs_pytorch_" + name
    fn.__doc__ = "5D: %d ranks, %s, B %d, E %d top-%d, against the float64 reference" % (
        ranks, " ".join(map(str, flags)), B, E, k)
    return fn


for _case in GRID5D:
    test(make_grid5d_test(*_case))


@test
def grid5d_vs_pytorch_bias():
    """-balance bias on pp 2 x dp 2 at ep 2, two micro-batches a replica, top-1: the loads of the
    whole global batch (every stage's layers, all-reduced over the world) move each layer's biases
    as the reference's (the EP trainer's case np 2, ep 2, accum 2)"""
    grid5d_run("grid5d_bias", 4, ["-pp", 2, "-dp", 2, "-ep", 2], 2, 4, 1, balance="bias")


@test
def grid5d_vs_pytorch_capacity():
    """-capacity_factor 1.25 on pp 2 x dp 2 at ep 2, B = 2: the capacity counts a rank's
    micro-batch (B T = 64 tokens, the reference's groups), and tokens are dropped"""
    grid5d_run("grid5d_capacity", 4, ["-pp", 2, "-dp", 2, "-ep", 2], 2, 4, 2, cf=1.25)


def grid5d_final(d):
    """the weights after step 5 of the run in d (its model file)"""
    return reference.read_model_file(os.path.join(d, "model_00000005.bin"))[1]


def grid5d_step3(source, name):
    """a fresh dir holding only the checkpoint of step 3 of the run in source, to resume from"""
    d = fresh_dir(name)
    for f in glob.glob(os.path.join(source, "*_00000003*")):
        shutil.copy(f, d)
    return d


@test
def grid5d_checkpoints_resume_across_grids_and_trainers():
    """a 5D run's checkpoint of step 3 resumed: on the grid that wrote it, steps 4 and 5 the
    uninterrupted run's bit for bit; on one rank (ep 1) and in train_gpt2_ep at ep 2, the same
    final weights within fp32 rounding (2e-6, as the EP trainer's own resume test); and an EP
    checkpoint resumed here on a 5D grid likewise"""
    ref = moe_reference(4, 2)

    def run(ranks, program, flags, B, d, more=()):
        return run_ok(ranks, trainer_args(ref, B, d, ["-n", 3] + list(more) + list(flags), cfg=MOE), program=program)

    grid = ["-pp", 2, "-tp", 2, "-sp", 1, "-ep", 2]
    whole = fresh_dir("grid5d_whole")
    run(4, D3, grid, 8, whole)
    for what, ranks, program, flags, B in [("same_grid", 4, D3, grid, 8), ("one_rank", 1, D3, [], 8),
                                           ("train_gpt2_ep", 2, "./train_gpt2_ep", ["-ep", 2], 4)]:
        d = grid5d_step3(whole, "grid5d_resumed_" + what)
        out = run(ranks, program, flags, B, d, ["-y", 1])
        assert "resumed from step 3" in out, out[-2000:]
        err = np.abs(grid5d_final(d) - grid5d_final(whole)).max()
        if what == "same_grid":
            assert err == 0, "resumed on the grid that wrote it: max difference %g, expected none" % err
        else:
            assert err <= 2e-6, "resumed %s: max difference %g (fp32 rounding: 2e-6)" % (what, err)
    ep_whole = fresh_dir("grid5d_ep_whole")
    run(2, "./train_gpt2_ep", ["-ep", 2], 4, ep_whole)
    d = grid5d_step3(ep_whole, "grid5d_from_ep")
    run(8, D3, ["-pp", 2, "-cp", 2, "-tp", 2, "-sp", 1, "-ep", 4], 8, d, ["-y", 1])
    err = np.abs(grid5d_final(d) - grid5d_final(ep_whole)).max()
    assert err <= 2e-6, "an EP checkpoint resumed on 5D: max difference %g (fp32 rounding: 2e-6)" % err


@test
def grid5d_zero1_checkpoints_resume_on_any_grid():
    """-z 1 with experts, the state in two sets of shards (the dense tensors' over dp x cp, the
    experts' over edp), gathered into one state file: resumed on the grid that wrote it, steps 4
    and 5 bit for bit; on another grid without ZeRO, and a checkpoint written without ZeRO resumed
    with it, the same final weights within fp32 rounding (2e-6, as the other resume tests)"""
    ref = moe_reference(4, 1)

    def run(ranks, flags, d, more=()):
        return run_ok(ranks, trainer_args(ref, 4, d, ["-n", 3] + list(more) + list(flags), cfg=MOE), program=D3)

    zero1, plain = ["-dp", 2, "-cp", 2, "-ep", 2, "-z", 1], ["-pp", 2, "-ep", 1]  # (dense 4 ways, experts 2)
    whole = fresh_dir("grid5d_z1_whole")
    run(4, zero1, whole)
    for what, ranks, flags in [("same_grid", 4, zero1), ("without_zero", 2, plain)]:
        d = grid5d_step3(whole, "grid5d_z1_resumed_" + what)
        out = run(ranks, flags, d, ["-y", 1])
        assert "resumed from step 3" in out, out[-2000:]
        err = np.abs(grid5d_final(d) - grid5d_final(whole)).max()
        limit = 0 if what == "same_grid" else 2e-6  # (bit for bit where it was written; else fp32 rounding)
        assert err <= limit, "-z 1 checkpoint resumed %s: max difference %g (limit %g)" % (what, err, limit)
    plain_whole = fresh_dir("grid5d_z1_plain_whole")
    run(2, plain, plain_whole)
    d = grid5d_step3(plain_whole, "grid5d_z1_from_plain")
    run(4, zero1, d, ["-y", 1])
    err = np.abs(grid5d_final(d) - grid5d_final(plain_whole)).max()
    assert err <= 2e-6, "a checkpoint without ZeRO resumed with -z 1: max difference %g (fp32 rounding: 2e-6)" % err


@test
def grid5d_refuses_what_it_cannot_do():
    """with experts, a grid it cannot fold or a flag it does not have yet stops every rank with one
    message naming the flag and the rule: -tp without -sp (each token would be routed tp times),
    -ep not dividing E or a stage's ranks, -r 1 (not written yet); an experts' flag on a
    dense model without -experts"""
    ref = moe_reference(4, 2)
    d = fresh_dir("grid5d_refusals")
    model = os.path.join(ref["dir"], "model.bin")
    cases = [(2, ["-tp", 2], "-tp 2 with experts needs -sp 1"),
             (2, ["-ep", 3], "-ep 3: the E = 4 experts are split over ep of a stage's"),
             (4, ["-pp", 2, "-ep", 4], "so ep must divide both"),
             (2, ["-ep", 2, "-r", 1], "-r 1 with experts")]
    for ranks, flags, message in cases:
        code, out = mpirun(ranks, ["-e", model] + data_args(MOE) + ["-b", 2, "-t", MOE["seq_len"], "-x", 1, "-v", 0,
                                                                    "-s", 0, "-o", d] + flags, program=D3)
        assert code != 0, "%s: exit 0\n%s" % (flags, out[-2000:])
        assert out.count(message) == 1, "%s: expected '%s' once:\n%s" % (flags, message, out[-2000:])
    # a dense model takes none of the experts' flags: each named, none silently ignored
    for flags in (["-topk", 2], ["-ep", 2], ["-capacity_factor", 1.5], ["-balance", "bias"]):
        code, out = mpirun(1, ["-e", "d2"] + flags + data_args(MOE) + ["-x", 1, "-o", d], program=D3)
        assert code != 0 and "%s without -experts: -e d2 is a dense model" % flags[0] in out, out[-2000:]


# the CUDA backend's grids: MoE layers in a pipe (ep 1: no all-to-all, the experts' rows moved on
# one device), the EP chapter's fold over dp (NCCL's grouped send/recv, emulated over MPI), and
# both inside stages whose attention is tensor-parallel
# (ranks, grid flags, B: the global batch of MOE["batch"] sequences split over dp)
CUDA_GRID5D = {"pp2_ep1": (2, ["-pp", 2, "-ep", 1], 8), "dp2_ep2": (2, ["-ep", 2], 4),
               "pp2_tp2_sp_ep2": (4, ["-pp", 2, "-tp", 2, "-sp", 1, "-ep", 2], 8)}


def make_cuda_grid5d_test(kind, precision, grid, order="forward"):
    ranks, flags, B = CUDA_GRID5D[grid]

    def fn():
        run = emu_runner(ranks, order) if kind == "emu" else cuda_runner(kind, None)
        ref = moe_reference(4, 1)
        program = build(kind, precision, ["train_gpt2_3d"])[0]
        d = fresh_dir("%s_%s_grid5d_%s" % (kind, precision, grid))
        grads_path = os.path.join(d, "grads.bin")
        steps = MOE["steps"]
        out = run(program, ranks, trainer_args(ref, B, d, ["-n", steps, "-dump_grads", grads_path,
                                                                      "-check_replicas", steps] + flags, cfg=MOE), d)
        check_cuda_against_reference(ref, d, grads_path, precision, "%s train_gpt2_3d %s 5D %s" % (kind, precision, grid))
        assert "step %d: experts' copies identical" % steps in out or "experts' copies" not in out, out[-2000:]
        check_memory_table_total(program, out)
    fn.__doc__ = ("5D's CUDA backend on the emulator (threads and blocks in %s order; or every rank on one GPU): %s, E = 4, "
                  "top-1, against the MoE reference within the precision's bounds; every copy identical; the memory "
                  "table within 5%% of the allocations (CUDA's workspaces beside the table's buffers)" % (order, " ".join(map(str, flags))))
    prefix, path = cuda_test_name(kind, ranks if kind == "emu" else None)
    fn.__name__ = "%s_grid5d_vs_pytorch_%s_%s_%s%s" % (prefix, precision.lower(), grid, path, "_reverse" if order == "reverse" else "")
    return fn


test(make_cuda_grid5d_test("emu", "FP32", "pp2_ep1"))
test(make_cuda_grid5d_test("emu", "FP32", "dp2_ep2", "reverse"))
test(make_cuda_grid5d_test("emu", "FP32", "pp2_tp2_sp_ep2"))
test(make_cuda_grid5d_test("cuda", "BF16", "pp2_tp2_sp_ep2"))
