# The memory table (llmc/memory_plan.h) row by row against the allocator (llmc/allocations.h):
# every device buffer is counted under the row it belongs to (allocation_kind at the allocating
# code), and LLMC_MEMORY_MEASURED=1 makes rank 0 print, as it exits, each row's predicted bytes
# beside the bytes measured under it at a moment of the high-water mark and the most it held at
# once. On the CPU backend the two agree to the byte: every buffer is a malloc of exactly the bytes
# the table's formula counts (no allocator rounding is counted, no library allocates beside the
# trainer), and every buffer the table counts is live at once at the mark (the file gathers of a
# checkpoint are allocated while the model, its state and its activations are). So a wrong term of
# any size in any row fails here, not only in the total (check_memory_table_total), and a buffer
# counted under the wrong row fails too, even when the total is right. Left out: the CUDA
# backend's kernel scratch (cuBLASLt's workspace and the launchers' buffers, which grow on demand
# to sizes the table bounds) and the allocator's rounding there; on the CPU that row is 0.


def measured_rows(out):
    """{row: (predicted, at the high-water mark, at most)} from a run with LLMC_MEMORY_MEASURED=1"""
    assert "device memory per row (LLMC_MEMORY_MEASURED=1)" in out, "no measured rows printed:\n" + out[-2000:]
    rows = {}
    for m in re.finditer(r"^  (\S.*?) +predicted (\d+), at the high-water mark (\d+), at most (\d+)( \(no row\))?$", out, re.M):
        label = m.group(1) + (" (no row)" if m.group(5) else "")
        rows[label] = tuple(int(m.group(i)) for i in (2, 3, 4))
    return rows


def check_memory_rows(program, out, nonzero):
    """every row of rank 0's table equals its measured bytes, both at the high-water mark and at
    its own most; nothing allocated under a kind the table has no row for (untagged included);
    the rows in `nonzero` are not 0 (so that the run checks what it is meant to)"""
    rows = measured_rows(out)
    wrong = ["%s: predicted %d, measured %d at the high-water mark (%+d), %d at most (%+d)" % (
        label, p, at, at - p, most, most - p) for label, (p, at, most) in rows.items() if not p == at == most]
    assert not wrong, "%s: rows of the memory table that are not what was allocated:\n  %s" % (program, "\n  ".join(wrong))
    for label in nonzero:
        assert rows.get(label, (0,))[0] > 0, "%s: row %r is 0 or missing: %s" % (program, label, sorted(rows))
    print("    %s: %d rows equal to the byte (%s)" % (program, len(rows), ", ".join(
        "%s %d" % (label, p) for label, (p, _, _) in rows.items() if p > 0)))


MEASURED = {"LLMC_MEMORY_MEASURED": "1"}


@test
def memory_rows_ep_np2_ep2_capacity():
    """train_gpt2_ep on 2 ranks, -ep 2, capacity 1.25 (dropping), with -dump_grads and a checkpoint"""
    cfg, E, k, cf = MOE, 4, 2, 1.25
    B = cfg["batch"] // 2
    ref = moe_reference(E, k, "aux", cf, B * cfg["seq_len"])
    d = fresh_dir("memory_rows_ep")
    args = trainer_args(ref, B, d, ["-n", cfg["steps"], "-dump_grads", os.path.join(d, "grads.bin"), "-ep", 2,
                                    "-capacity_factor", cf], cfg=cfg)
    out = run_ok(2, args, program="./train_gpt2_ep", env=MEASURED)
    check_memory_rows("train_gpt2_ep", out, ["parameters", "gradients", "AdamW m, v", "layers", "head", "backward",
                                             "experts", "file gather"])


@test
def memory_rows_grid3d_2x2x2_sp_z1():
    """train_gpt2_3d on dp 2 x pp 2 x tp 2 with -sp, ZeRO-1 and 1F1B over 2 micro-batches, and a
    checkpoint gathered from the shards (rank 0: stage 0, no head)"""
    cfg = REF4_GPT2
    ref = reference_run(cfg)
    B = cfg["batch"] // (2 * 2)
    d = fresh_dir("memory_rows_grid3d")
    args = trainer_args(ref, B, d, ["-n", cfg["steps"]] + grid3d_flags(2, 2, 2, 1, "1f1b", 1, 1), cfg=cfg)
    out = run_ok(8, args, program=D3, env=MEASURED)
    check_memory_rows("train_gpt2_3d", out, ["parameters", "gradients", "AdamW m, v", "layers", "backward",
                                             "comm buffers", "file gather"])


@test
def memory_rows_grid3d_cp_recompute():
    """train_gpt2_3d on dp 2 x pp 2 x cp 2 (zigzag ring), ZeRO-1, 1F1B, -r 2: the context
    parallel buffers in comm, one layer's recomputed buffers"""
    cfg = REF4_GPT2
    ref = reference_run(cfg)
    B = cfg["batch"] // (2 * 2)
    d = fresh_dir("memory_rows_grid3d_cp")
    args = trainer_args(ref, B, d, ["-n", cfg["steps"], "-r", 2] + grid3d_flags(2, 2, 1, 0, "1f1b", 1, 1, 2), cfg=cfg)
    out = run_ok(8, args, program=D3, env=MEASURED)
    check_memory_rows("train_gpt2_3d -cp 2", out, ["layers", "recomputed", "backward", "comm buffers", "file gather"])


@test
def memory_rows_diloco_fragments():
    """train_gpt2_diloco: 2 workers of 2 ranks, 2 fragments, -tau 1 (a fragment's step in flight)"""
    cfg = REF
    ref = reference_run(cfg)
    B = cfg["batch"] // 4
    d = fresh_dir("memory_rows_diloco")
    args = trainer_args(ref, B, d, ["-n", cfg["steps"], "-workers", 2, "-H", 4, "-fragments", 2, "-tau", 1], cfg=cfg)
    out = run_ok(4, args, program=DILOCO, env=MEASURED)
    check_memory_rows("train_gpt2_diloco", out, ["parameters", "gradients", "AdamW m, v", "layers", "head", "backward",
                                                 "outer state"])


@test
def memory_rows_dp_tp_pp_cp():
    """the other four trainers, a run each with a checkpoint and -dump_grads: train_gpt2_dp at -z 3
    with -overlap and accumulation (every ZeRO buffer), train_gpt2_tp with -sp and -r 1,
    train_gpt2_pp interleaved, train_gpt2_cp with the all-gather exchange (its weights whole on
    every rank: no file gather)"""
    cfg = REF4_GPT2
    ref = reference_run(cfg)
    runs = [("train_gpt2_dp -z 3", "./train_gpt2_dp", 2, cfg["batch"] // 4, ["-z", 3, "-overlap", 1], ["comm buffers", "file gather"]),
            ("train_gpt2_tp -sp 1 -r 1", TP, 2, cfg["batch"] // 2, ["-sp", 1, "-r", 1], ["recomputed", "file gather"]),
            ("train_gpt2_pp interleaved", PP, 2, cfg["batch"] // 2, ["-sched", "interleaved", "-vp", 2], ["comm buffers", "file gather"]),
            ("train_gpt2_cp allgather", CP, 2, cfg["batch"] // 2, ["-cp_comm", "allgather"], ["comm buffers"])]
    for i, (name, program, ranks, B, flags, nonzero) in enumerate(runs):
        d = fresh_dir("memory_rows_%d" % i)
        args = trainer_args(ref, B, d, ["-n", cfg["steps"], "-dump_grads", os.path.join(d, "grads.bin")] + flags, cfg=cfg)
        out = run_ok(ranks, args, program=program, env=MEASURED)
        check_memory_rows(name, out, ["parameters", "gradients", "AdamW m, v", "layers", "backward"] + nonzero)
