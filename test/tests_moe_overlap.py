# The MoE overlap (-pp_overlap 1 with experts in the grid trainer; llmc/pipeline_walk.h's header
# says how it runs): in each of DualPipeV's F&B pairs the forward's and the backward's passes
# step in turn, each MoE layer's all-to-alls of rows (dispatch and combine, forward and backward)
# posted non-blocking (MPI_Ialltoallv, llmc/cpu/comm.h) and waited for after a step of the other
# micro-batch. On the CPU backend under mpirun, at pp 2 with ep 2 on the 4-layer MoE model MOE4
# (tests_5d_folds.py), each layout held to:
#   (a) the float64 reference, as tests_v_grid.py holds the V's 5D cases (grid5d_shaped_run:
#       losses, norms, every step-0 gradient, final weights, AdamW's moments, the MoE figures, the
#       memory table's total to the byte, with the second lane of rows it counts);
#   (b) the same run without the overlap (-pp_overlap 0), bit for bit: main.log's records but the
#       timings and the memory prediction (which counts the second lane), the step-0 gradients
#       and every checkpoint file. Each micro-batch's kernels run in the same order on their own
#       buffers either way, so nothing may round differently;
#   (c) the overlap happening: rank 0's "moe all-to-all" line counts its all-to-alls of rows that
#       moved under another micro-batch's compute, which must be, every step, stage 0's F&B pairs
#       (counted by hand from the schedule's construction, below) x its MoE layers a chunk x 4 (a
#       layer's dispatch and combine in the forward and in the backward), and 0 without it.
# DualPipeV is the schedule the overlap is for; interleaved 1F1B's steady state joins a forward
# and a backward the same way, and is held to the same checks.
# Read into test/run_tests.py's namespace (test, run_ok, trainer_args, read_log, MOE4,
# grid5d_shaped_run, ...), as the other tests_*.py files.


def dualpipev_pairs(p, m, stage):
    """the F&B pairs of one stage of DualPipeV (DeepSeek-V3, section 3.2.1; its README's eight
    steps), by hand: step 4 runs m - 2p + stage + 1 rounds of two pairs (F0 & B1, F1 & B0),
    except that the bottom stage runs its first F0 and B1 apart; step 5 runs p - stage - 1 rounds
    of one pair (F1 & B0)"""
    pairs = 2 * (m - 2 * p + stage + 1) + (p - stage - 1)
    return pairs - 1 if stage == p - 1 else pairs


def interleaved_pairs(p, V, m, stage):
    """interleaved 1F1B's F&B pairs on one stage (Narayanan et al. 2021): after 2(p - stage - 1) +
    (V - 1) p warm-up forwards of its m V, each remaining forward joins a backward"""
    return m * V - min(m * V, 2 * (p - stage - 1) + (V - 1) * p)


def moe_overlap_lines(out):
    """rank 0's per-step line of the ep all-to-alls: {step: (the rows' exposed ms, the count under
    another micro-batch's compute)}"""
    return {int(s): (float(ms), int(n)) for s, ms, n in re.findall(
        r"^step (\d+) moe all-to-all: exposed [\d.]+ ms \(rows ([-\d.]+), counts [\d.]+\) \| (\d+) under another "
        r"micro-batch's compute$", out, re.M)}


def log_for_bits(d):
    """main.log's records without what may differ between the two runs: the timings (TIMING) and
    the memory prediction (the overlap's second lane of rows is counted in it)"""
    with open(os.path.join(d, "main.log")) as f:
        return [{k: v for k, v in json.loads(line).items() if k not in TIMING + ("memory_predicted",)} for line in f]


def check_moe_overlap(name, ranks, flags, B, pairs):
    """(a), (b) and (c) above; pairs: stage 0's F&B pairs a step, by hand"""
    cfg, E, k = MOE4, 4, 1
    steps = cfg["steps"]
    # (a) the overlap against the reference
    out, d = grid5d_shaped_run("moe_overlap_" + name, ranks, flags + ["-pp_overlap", 1], B, E, k, cfg)
    # (b) the same run without it: every file and record bit for bit
    ref = fold_reference(cfg, E, k)
    plain = fresh_dir("moe_plain_" + name)
    plain_out = run_ok(ranks, trainer_args(ref, B, plain, ["-n", steps, "-dump_grads", os.path.join(plain, "grads.bin"),
                                                           "-check_replicas", steps] + flags + ["-pp_overlap", 0],
                                           cfg=cfg), program=D3)
    assert log_for_bits(d) == log_for_bits(plain), "main.log with the MoE overlap differs from the run without it"
    files = sorted(f for f in os.listdir(plain) if f.endswith(".bin"))
    assert "grads.bin" in files and "model_%08d.bin" % steps in files, files
    assert sorted(f for f in os.listdir(d) if f.endswith(".bin")) == files, (os.listdir(d), files)
    for f in files:
        with open(os.path.join(d, f), "rb") as a, open(os.path.join(plain, f), "rb") as b:
            assert a.read() == b.read(), "%s with the MoE overlap differs from the run without it" % f
    # (c) the count of all-to-alls under the other micro-batch: stage 0's (rank 0's) pairs x its
    # MoE layers a chunk (L / 2pp: 2 chunks a stage, the V's or -vp 2's) x 4
    pp = flags[flags.index("-pp") + 1]
    expected = pairs * (cfg["layers"] // (2 * pp)) * 4
    lines, plain_lines = moe_overlap_lines(out), moe_overlap_lines(plain_out)
    assert sorted(lines) == sorted(plain_lines) == list(range(1, steps + 1)), (lines, plain_lines)
    for s in lines:
        assert lines[s][1] == expected, "step %d: %d all-to-alls under another micro-batch's compute, the schedule " \
                                        "gives %d" % (s, lines[s][1], expected)
        assert plain_lines[s][1] == 0, "step %d without the overlap: %d" % (s, plain_lines[s][1])
    # what it hides, printed (a CPU with 2 cores and a tiny model: the mechanism, not a speed)
    mean = lambda l: sum(l[s][0] for s in l) / len(l)
    print("    rank 0's all-to-alls of rows exposed a step: %.3f ms with the overlap (%d under the other micro-batch), "
          "%.3f ms without" % (mean(lines), expected, mean(plain_lines)))


@test
def moe_overlap_dualpipev_pp2_dp2_ep2():
    """-sched dualpipev at pp 2, experts over the dp 2 replicas of each stage (ep 2), B 1, m 4,
    -pp_overlap 1: against the float64 reference, bit for bit the run with -pp_overlap 0, and rank
    0's count of all-to-alls under the other micro-batch 3 pairs x 1 layer x 4 = 12 a step"""
    check_moe_overlap("pp2_dp2_ep2", 4, ["-pp", 2, "-dp", 2, "-ep", 2, "-sched", "dualpipev"], 1, dualpipev_pairs(2, 4, 0))


@test
def moe_overlap_dualpipev_pp2_tp2_sp_ep2():
    """the same with tp 2 and -sp inside each stage (experts over the tp pair, each routing its B
    T/tp tokens): the tp collectives of the attention halves run between the two passes' parts,
    in the same order on both tp ranks; B 2, m 4"""
    check_moe_overlap("pp2_tp2_sp_ep2", 4, ["-pp", 2, "-tp", 2, "-sp", 1, "-ep", 2, "-sched", "dualpipev"], 2,
                      dualpipev_pairs(2, 4, 0))


@test
def moe_overlap_interleaved_pp2_vp2_dp2_ep2():
    """-sched interleaved -vp 2 at pp 2 (stage 0 holds layers 0 and 2), experts over dp 2, B 1,
    m 4: stage 0's steady state joins 8 - (2 + 2) = 4 forwards with backwards, so 4 x 1 x 4 = 16
    all-to-alls under the other micro-batch a step; against the reference and bit for bit the run
    without the overlap. (The last stage's steady state joins each forward with its own
    backward, which needs the forward's loss: stepped in turn, as a first version did, they gave
    step-0 gradients 0.135 off; the walk runs those two one after the other)"""
    check_moe_overlap("pp2_vp2_dp2_ep2", 4, ["-pp", 2, "-vp", 2, "-dp", 2, "-ep", 2, "-sched", "interleaved"], 1,
                      interleaved_pairs(2, 2, 4, 0))


@test
def emu_moe_overlap_vs_pytorch_fp32_pp2_dp2_ep2_dualpipev_nccl():
    """the CUDA backend (4 emulated GPUs, NCCL over MPI) with -pp_overlap 1 and experts: each
    all-to-all of rows is grouped ncclSend/ncclRecv on a side channel of the ep group, after the
    compute stream's kernels that wrote its rows, and the compute stream waits for its event at the
    pass's next step (llmc/cuda/comm.cuh's comm_all_to_all_start, comm_wait). The emulator posts a
    group's messages at ncclGroupEnd and finishes them as stream work, when something waits for
    them, so a missing or misplaced wait reads rows not yet received (planted: the request left
    with no event for comm_wait to wait on, step 1's loss is NaN): against the reference within
    fp32's CUDA bounds, rank 0's count under the other micro-batch the hand count of the CPU cases
    (3 pairs x 1 layer x 4 = 12 a step), the memory table (with the lane) within 5% of the
    allocations"""
    cfg, E, k, steps = MOE4, 4, 1, MOE4["steps"]
    ref = fold_reference(cfg, E, k)
    program = build("emu", "FP32", ["train_gpt2_3d"])[0]
    d = fresh_dir("emu_moe_overlap")
    grads = os.path.join(d, "grads.bin")
    pp = 2
    flags = ["-pp", pp, "-dp", 2, "-ep", 2, "-sched", "dualpipev", "-pp_overlap", 1]
    out = emu_runner(4)(program, 4, trainer_args(ref, 1, d, ["-n", steps, "-dump_grads", grads] + flags, cfg=cfg), d)
    check_cuda_against_reference(ref, d, grads, "FP32", "emu train_gpt2_3d FP32 %s" % " ".join(map(str, flags)))
    # stage 0's pairs (m 4) x its MoE layers a chunk (L / 2pp) x 4, as check_moe_overlap's (c)
    expected = dualpipev_pairs(pp, 4, 0) * (cfg["layers"] // (2 * pp)) * 4
    lines = moe_overlap_lines(out)
    assert sorted(lines) == list(range(1, steps + 1)), lines
    for s in lines:
        assert lines[s][1] == expected, "step %d: %d all-to-alls under another micro-batch's compute, the schedule " \
                                        "gives %d" % (s, lines[s][1], expected)
    check_memory_table_total(program, out)
