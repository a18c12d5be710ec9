# Tests of context parallelism's ring kernels on Hopper's machinery (LLMC_FLASH=fa3: the fa3
# section of llmc/cuda/ring_attention.cuh, dev/cuda/ring_attention v3). The kernels' validation
# against the CPU, in both emulator orders, is emu_dev_cuda_kernels_validate_bf16's (every dev/cuda
# program). Read into test/run_tests.py's namespace: its helpers (test, Skip, ROOT, build,
# emu_runner, taking_paths, REF_HS64_CUDA, ...) are used as if written there.

HOPPER_FORWARD_FILE = os.path.join(ROOT, "llmc", "cuda", "flash_hopper.cuh")


@test
def emu_cp_vs_pytorch_bf16_cp2_contiguous_ring_nccl_flash_fa3():
    """the CP trainer on the emulator, 2 ranks over NCCL, LLMC_FLASH=fa3, against the PyTorch
    reference within bf16's bounds: one head of 64 (REF_HS64_CUDA: the fa3 kernels' head size),
    T = 200 split in contiguous chunks of 100 (two key tiles, the second ragged; a block of 128
    queries whose second warpgroup holds 36 of the chunk's rows and 28 of the next sequence's):
    rank 0's own block is diagonal, rank 1's other block whole. Every block call of the ring took
    the fa3 kernels (paths_print: taken, 0 fell back), the bytes moved are the CP formula's and
    the replicas stay identical"""
    paths = dict(LLMC_FLASH="fa3")
    cfg = REF_HS64_CUDA
    run = taking_paths(emu_runner(2, paths=paths), paths, "BF16")
    ref = reference_run(cfg)
    program = build("emu", "BF16", ["train_gpt2_cp"])[0]
    d = fresh_dir("emu_BF16_cp2_contiguous_ring_fa3")
    grads_path = os.path.join(d, "grads.bin")
    B = cfg["batch"]
    args = trainer_args(ref, B, d, ["-n", cfg["steps"], "-dump_grads", grads_path, "-check_replicas", 1,
                                    "-cp_layout", "contiguous", "-cp_comm", "ring"], cfg=cfg)
    out = run(program, 2, args, d)
    train = check_cuda_against_reference(ref, d, grads_path, "BF16", "emu train_gpt2_cp BF16 cp=2 contiguous ring fa3")
    P = len(reference.read_model_file(os.path.join(ref["dir"], "final.bin"))[1])
    expected = cp_step_bytes(cfg, B, 2, 1, False, P, X=2)
    assert train[1]["comm_bytes"] == sum(expected.values()), (train[1]["comm_bytes"], expected)
    assert "step %d: replicas identical" % cfg["steps"] in out, out[-2000:]


@test
def emu_catches_a_missing_mbarrier_wait_in_the_ring_fa3_forward():
    """delete the fa3 forward consumers' wait on a ring slot's "full" mbarrier (in
    flash_hopper_overlap_turns, the v11 turns that ring_fa3_forward_kernel shares): they would
    multiply q by a k tile (and p by a v tile) before the TMA wrote them. In forward order the
    emulator lands a load only as its phase completes, so the products read the slot's previous
    tile (or the poison of a slot never written): dev/cuda/ring_attention must fail (v3's
    forward against the CPU), or stop on the protocol's broken count"""
    with open(HOPPER_FORWARD_FILE) as f:
        text = f.read()
    start = text.index("flash_hopper_overlap_turns(")
    first = text[:start].count("\n") + 1
    lines = [(first + i, m.group(1)) for i, line in enumerate(text[start:].split("\n"))
             for m in [re.search(r"(mbarrier_wait\(&full\[slot\][^;]*;)", line)] if m]
    assert lines, "no wait on full in flash_hopper_overlap_turns"
    number, statement = lines[0]
    sweep = mutation_sweep_module("ring_fa3")
    sweep.PROGRAMS = dict(sweep.PROGRAMS, **{"flash_hopper.cuh": ["ring_attention"]})  # the ring's program, not v11's
    caught, error = sweep.sweep_one(0, "flash_hopper.cuh", number, statement)
    assert error is None, error
    print("    flash_hopper.cuh:%d deleted: caught in orders %r" % (number, caught))
    assert "f" in caught["warp-serial"], "line %d deleted: caught in orders %r, expected forward" % (number, caught)


@test
def ring_fa3_compiles_to_wgmma_and_tma_without_spills():
    """the three fa3 kernels for sm_90a (the Makefile's flags, bf16, LLMC_WGMMA): ptxas -v reports
    no spill stores or loads and no serialized wgmma (the numbers are in ring_attention.cuh's fa3
    section); with nvdisasm, the SASS has TMA loads (UTMALDG), setmaxnreg, no mma.sync (HMMA), one
    wgmma (HGMMA) per k16 step of each product as the source issues them (the forward 16: q k^T
    and p v, 4 each, in each of the turn's cases that issues them, 2 each; dK dV 16: s^T, dp^T,
    dv, dk; dQ 12: s, dp, dq), and no instruction writes the A registers of an HGMMA before the
    wait that drains it (the forward leaves a p v running under the softmax: its p must stay put;
    tests_flash_hopper_forward.py's sass_written reads the SASS)"""
    out, cubin = sm90a_cubin("ring_fa3_sass", '#include "llmc/cuda/ring_attention.cuh"\n'
        "void instantiate(float* o, float* lse, float* scratch, const floatX* qkv, const floatX* kv, const floatX* dy,\n"
        "                 const float* D, float* dq, float* dkv, CpChunks q, CpChunks k, int B, int C, int NH) {\n"
        "    attention_block_forward_fa3(o, lse, scratch, qkv, kv, q, k, B, C, NH, 1);\n"
        "    attention_block_backward_fa3(dq, dkv, dy, lse, D, qkv, kv, q, k, B, C, NH);\n}\n")
    assert "serialized" not in out, out[-3000:]
    kernels = dict(forward=16, dkdv=16, dq=12)
    for kernel in kernels:
        ptxas_without_spills(out, "ring_fa3_%s_kernel" % kernel)
    sections = sass_sections(cubin)
    for kernel, hgmma in kernels.items():
        body, counts = sass_of(sections, "ring_fa3_%s_kernel" % kernel, ("HGMMA", "HMMA", "UTMALDG", "USETMAXREG"))
        print("    sm_90a ring_fa3_%s_kernel SASS: %s" % (kernel, counts))
        assert counts["HGMMA"] == hgmma and counts["HMMA"] == 0, "%s: %s, expected %d HGMMA, no HMMA" % (kernel, counts, hgmma)
        assert counts["UTMALDG"] > 0 and counts["USETMAXREG"] > 0, "%s: no TMA load or setmaxnreg: %s" % (kernel, counts)
        # (A from registers: p v, dv, dk, dq; the other products read both by descriptor)
        hgmma_a_registers_kept(body, kernel)
