# Tests of the flash attention backward on Hopper's machinery (llmc/cuda/flash_hopper_backward.cuh,
# dev/cuda/attention_backward v8). Its validation against the CPU, in both emulator orders, is
# emu_dev_cuda_kernels_validate_bf16's (every dev/cuda program). Read into test/run_tests.py's
# namespace: its helpers (test, Skip, ROOT, have_nvcc, tool) are used as if written there.

HOPPER_BACKWARD = os.path.join(ROOT, "llmc", "cuda", "flash_hopper_backward.cuh")


@test
def emu_catches_a_missing_mbarrier_wait_in_the_hopper_backward():
    """delete the dK dV consumers' wait on a ring slot's "full" mbarrier: they would multiply the
    q and dout tiles before the TMA wrote them (and read lse and D before the producer's lanes
    did). In forward order the emulator lands a load only as its phase completes, so the products
    read the slot's previous tile (or the poison of an unwritten one): attention_backward must fail
    its validation (v8 against the CPU, and against v6's bits)."""
    with open(HOPPER_BACKWARD) as f:
        lines = [(i + 1, m.group(1)) for i, line in enumerate(f)
                 for m in [re.search(r"(mbarrier_wait\(&full\[slot\][^;]*;)", line)] if m]
    # v9's dK dV turns (hopper_dkdv_turns, shared with the ring), the dK dV kernel's v8 loop, then
    # the dQ pair the same way: the second is v8's dK dV
    assert len(lines) == 4, "the waits on full moved (two a kernel expected): %s" % lines
    sweep = mutation_sweep_module("hopper_backward")
    number, statement = lines[1]
    caught, error = sweep.sweep_one(0, "flash_hopper_backward.cuh", number, statement)
    assert error is None, error
    assert "f" in caught["warp-serial"], "line %d deleted: caught in orders %r, expected forward" % (number, caught)


@test
def flash_hopper_backward_compiles_to_wgmma_and_tma_without_spills():
    """both kernels of both versions (8, 9) for sm_90a (the Makefile's flags, bf16, LLMC_WGMMA):
    ptxas -v reports no spill stores or loads and no serialized wgmma, and the SASS (nvdisasm)
    has wgmma (HGMMA, 16 in dK dV: 8 products of s^T and dp^T, 8 of dv and dk; 12 in dQ), TMA
    loads (UTMALDG), no mma.sync (HMMA), and setmaxnreg (USETMAXREG)"""
    out, cubin = sm90a_cubin("flash_hopper_backward_sass", '#include "llmc/cuda/flash_hopper_backward.cuh"\n'
        "void instantiate(floatX* dqkv, const floatX* dout, const floatX* qkv, const floatX* out, const float* lse,\n"
        "                 int B, int T, int C, int NH) {\n"
        "    attention_backward_flash_hopper_version<8>(dqkv, dout, qkv, out, lse, B, T, C, NH);\n"
        "    attention_backward_flash_hopper_version<9>(dqkv, dout, qkv, out, lse, B, T, C, NH);\n}\n")
    assert "serialized" not in out, out[-3000:]
    expected = {"flash_hopper_backward_%s_kernelILi%d" % (k, v): n for k, n in (("dkdv", 16), ("dq", 12)) for v in (8, 9)}
    for kernel in expected:
        ptxas_without_spills(out, kernel)
    sections = sass_sections(cubin)
    for kernel, hgmma in expected.items():
        body, counts = sass_of(sections, kernel, ("HGMMA", "HMMA", "UTMALDG", "USETMAXREG"))
        print("    sm_90a %s SASS: %s" % (kernel, counts))
        assert counts["HGMMA"] == hgmma and counts["HMMA"] == 0, "%s: %s, expected %d HGMMA, no HMMA" % (kernel, counts, hgmma)
        assert counts["UTMALDG"] > 0 and counts["USETMAXREG"] > 0, "%s: no TMA load or setmaxnreg: %s" % (kernel, counts)


@test
def emu_catches_a_hopper_backward_slot_released_before_its_products_read_it():
    """v9's dK dV consumers releasing the previous tile's ring slot (their arrival on its "empty"
    mbarrier) before waiting for the products that read it (dv += p^T dout, dk += ds^T q, issued
    in the turn): no wait is missing, one arrival is misplaced. In reverse order the emulator
    hands the CPU, at the arrival that completes the phase, to the producer, whose TMA loads land
    at once in that slot, and runs a product at its wait: the products then multiply the next tile
    but two. attention_backward must fail there, on v9 (v8 is untouched)."""
    sweep = mutation_sweep_module("hopper_backward_release")
    dest = os.path.join(sweep.WORK, "early_release")
    shutil.rmtree(dest, ignore_errors=True)
    sweep.copy_tree(dest)
    path = os.path.join(dest, "llmc", "cuda", "flash_hopper_backward.cuh")
    with open(path) as f:
        src = f.read()
    start = src.index("hopper_dkdv_turns(float")
    end = src.index("flash_hopper_backward_dkdv_kernel(", start)
    body = src[start:end]
    arrive = "\n        if (tile > 0) mbarrier_arrive(&empty[previous]);  // tile - 1's slot has been read"
    wait = "\n        wgmma_wait<0>();\n        wgmma_pin(&dv[0][0], HS / 2);"
    # v9's turns (hopper_dkdv_turns, 8 spaces in): the arrival after its turn's wait
    assert body.count(arrive) == 1 and body.count(wait) == 1 and body.index(arrive) > body.index(wait), \
        "the lines this test moves changed"
    body = body.replace(arrive, "").replace(wait, arrive + wait)
    with open(path, "w") as f:
        f.write(src[:start] + body + src[end:])
    p = subprocess.run(["make", "-s", "build/emu_BF16/dev/cuda/attention_backward"], cwd=dest, capture_output=True,
                       text=True, timeout=1800)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    p = subprocess.run([os.path.join(dest, "build", "emu_BF16", "dev", "cuda", "attention_backward")], cwd=dest,
                       env=dict(os.environ, CUDA_EMU_ORDER="reverse"), capture_output=True, text=True, timeout=600)
    out = p.stdout + p.stderr
    assert p.returncode != 0 and re.search(r"v9 flash \(TMA, pingpong\) FAIL", out), out[-3000:]
    assert not re.search(r"v8 flash \(TMA, warp-specialized\) FAIL", out), out[-3000:]
    shutil.rmtree(dest, ignore_errors=True)
