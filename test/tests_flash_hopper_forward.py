# Tests of the flash attention forward on Hopper's machinery (llmc/cuda/flash_hopper.cuh, dev/cuda/
# attention_forward v8-v11: TMA ring, warp specialization, pingpong, intra-warpgroup overlap). Their
# validation against the CPU, in both emulator orders, is emu_dev_cuda_kernels_validate_bf16's
# (every dev/cuda program). Read into test/run_tests.py's namespace: its helpers (test, Skip, ROOT,
# have_nvcc, tool, fresh_dir) are used as if written there.

HOPPER_FORWARD = os.path.join(ROOT, "llmc", "cuda", "flash_hopper.cuh")
# the four rungs' kernels, in the order the file defines them
HOPPER_FORWARD_KERNELS = ("tma", "ws", "pingpong", "overlap")


# (the helpers below serve tests_flash_hopper_backward.py and tests_ring_fa3.py too: every
# tests_*.py is read into one namespace)
def mutation_sweep_module(work):
    """dev/cuda/mutation_sweep.py loaded as a module (its PROGRAMS map each swept file to the
    dev/cuda program that validates it), warp-serial only (the default schedule), with a work
    folder of its own, build/mutation/<work>: one a test, since tests run side by side and a sweep
    removes its copy when done"""
    import importlib.util
    spec = importlib.util.spec_from_file_location("sweep_" + work, os.path.join(ROOT, "dev", "cuda", "mutation_sweep.py"))
    sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep)
    sweep.WORK = os.path.join(ROOT, "build", "mutation", work)
    del sweep.SCHEDULES[1:]
    return sweep


def sm90a_cubin(work, source):
    """source (a .cu that includes a header and instantiates its launchers) compiled for sm_90a
    with the Makefile's NVCC_FLAGS, bf16 and LLMC_WGMMA, under ptxas -v: (ptxas's report, the
    cubin's path). Skips without nvcc."""
    if not have_nvcc():
        raise Skip("no nvcc")
    with open(os.path.join(ROOT, "Makefile")) as f:
        flags = re.search(r"^NVCC_FLAGS := (.*)$", f.read(), re.M).group(1).split()
    d = fresh_dir(work)
    src, cubin = os.path.join(d, "k.cu"), os.path.join(d, "k.cubin")
    with open(src, "w") as f:
        f.write(source)
    p = subprocess.run([tool("nvcc"), "-cubin", "-gencode", "arch=compute_90a,code=sm_90a"] + flags +
                       ["-DLLMC_WGMMA", "-I" + ROOT, "-Xptxas", "-v", src, "-o", cubin],
                       cwd=ROOT, capture_output=True, text=True, timeout=900)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    return out, cubin


def ptxas_without_spills(out, kernel):
    """ptxas -v's report of the kernel whose name matches `kernel`: no stack frame, no spill stores
    or loads (printed with its registers)"""
    m = re.search(r"Function properties for \w*%s\w*\n\s*(\d+) bytes stack frame, "
                  r"(\d+) bytes spill stores, (\d+) bytes spill loads\n.*Used (\d+) registers" % kernel, out)
    assert m, "no ptxas -v report of %s\n%s" % (kernel, out[-3000:])
    print("    sm_90a %s: %s registers, stack %s, spills %s/%s bytes" % (kernel, m.group(4), *m.group(1, 2, 3)))
    assert m.group(1, 2, 3) == ("0", "0", "0"), "%s spills registers:\n%s" % (kernel, m.group(0))


def sass_sections(cubin):
    """the cubin's SASS (nvdisasm), one section a kernel, each starting with its mangled name;
    skips (after the ptxas checks) without nvdisasm"""
    disasm = tool("nvdisasm")
    if disasm is None:
        raise Skip("ptxas checked; no nvdisasm to read the SASS (dev/setup.sh installs it: pip nvidia-cuda-nvdisasm)")
    sass = subprocess.run([disasm, "-c", cubin], capture_output=True, text=True, timeout=300).stdout
    return re.split(r"^\s*\.section\s+\.text\.", sass, flags=re.M)


def sass_of(sections, kernel, ops):
    """the one SASS section of the kernel matching `kernel`, and how many of each instruction in ops"""
    body = [s for s in sections if re.match(r"\w*%s" % kernel, s)]
    assert len(body) == 1, "no SASS section of %s" % kernel
    return body[0], {op: len(re.findall(r"\b%s\b" % op, body[0])) for op in ops}


# one SASS instruction: address, opcode, modifiers, operands
SASS_INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z0-9_]+)((?:\.[A-Za-z0-9_]+)*)\s*(.*?)\s*;")


def hgmma_a_registers_kept(body, what):
    """no instruction writes the A registers of an HGMMA that reads A from registers before the
    wait that drains every product after it (WARPGROUP.DEPBAR ... 0x0): a product left running
    under other work (the softmax) must find its A as it was issued"""
    insns = [m.groups() for m in SASS_INSTRUCTION.finditer(body)]
    for x, (addr, op, mods, args) in enumerate(insns):
        a = re.match(r"R\d+, R(\d+),", args)  # (A from registers; q k^T reads both by descriptor)
        if op != "HGMMA" or not a:
            continue
        regs = {int(a.group(1)) + j for j in range(4)}
        drained = next((j for j in range(x + 1, len(insns)) if insns[j][1] == "WARPGROUP" and
                        insns[j][2].startswith(".DEPBAR") and insns[j][3].endswith("0x0")), len(insns))
        for j in range(x + 1, drained):
            assert not sass_written(*insns[j][1:]) & regs, "%s: the HGMMA at %s reads A from R%d.., which %s at %s " \
                "overwrites before the wait" % (what, addr, min(regs), insns[j][1], insns[j][0])


def hopper_forward_lines(pattern):
    """(line number, statement) of each statement of flash_hopper.cuh that the regex matches"""
    with open(HOPPER_FORWARD) as f:
        return [(i + 1, m.group(1)) for i, line in enumerate(f) for m in [re.search(pattern, line)] if m]


@test
def emu_catches_a_missing_mbarrier_wait_in_the_hopper_forward():
    """delete, one at a time, (a) the producer's wait on a ring slot's "empty" mbarrier (it would
    refill a slot that a consumer warpgroup is still multiplying) and (b) v9's consumers' wait on
    "full" (they would multiply k and v before the TMA wrote them). The emulator (in forward order a load
    lands only when a thread waits on its barrier's completed phase, in reverse at once; a release
    hands the CPU to the warps it wakes in reverse) must make attention_forward fail its validation, or stop on a deadlock, in at
    least one order."""
    empty = hopper_forward_lines(r"(mbarrier_wait\(&empty\[slot\][^;]*;)")
    full = hopper_forward_lines(r"(mbarrier_wait\(&full\[slot\][^;]*;)")
    # one empty wait (flash_hopper_load_kv, every rung's loads); a full wait per rung, v9's second
    assert len(empty) == 1 and len(full) == 4, "the waits this test deletes moved: %s %s" % (empty, full)
    sweep = mutation_sweep_module("hopper_forward_waits")
    for number, statement in (empty[0], full[1]):
        caught, error = sweep.sweep_one(0, "flash_hopper.cuh", number, statement)
        assert error is None, error
        assert caught["warp-serial"], "line %d (%s) deleted: not caught in either order" % (number, statement)


@test
def emu_catches_a_missing_pingpong_turn_in_the_hopper_forward():
    """delete v11's wait for its turn (the named barrier that orders the two consumer warpgroups'
    products): each warpgroup's data is its own, so no value changes, but the other warpgroup's
    arrivals on that barrier are then never waited for, and the emulator stops the block that ends
    with them (on a GPU: a barrier left part-way, and the two warpgroups' products no longer take
    turns)"""
    turns = hopper_forward_lines(r"(named_barrier_sync\(1 \+ w, 256\);)")
    assert len(turns) == 2, "the turns this test deletes moved: %s" % turns  # v10's, v11's
    sweep = mutation_sweep_module("hopper_forward_turn")
    caught, error = sweep.sweep_one(0, "flash_hopper.cuh", *turns[1])
    assert error is None, error
    assert caught["warp-serial"], "line %d deleted: not caught in either order" % turns[1][0]


# the registers a SASS instruction writes: its first operand when that is a register (none for
# stores, branches, barriers, HGMMA's accumulators aside), 4 wide for .128, 2 for .64 and the like
def sass_written(op, mods, args):
    if op in ("HGMMA", "BRA", "BAR", "EXIT", "RET", "CALL", "WARPGROUP") or op.startswith(("ST", "RED", "SYNCS", "UTMA")):
        return set()
    operands = [a.strip() for a in args.split(",")]
    if operands and re.fullmatch(r"!?U?P(T|\d+)", operands[0]):
        if op != "SHFL":
            return set()
        operands = operands[1:]
    m = re.fullmatch(r"R(\d+)", operands[0]) if operands else None
    if not m:
        return set()
    n = 4 if ".128" in mods else 2 if (".64" in mods or ".WIDE" in mods or (op == "CS2R" and ".32" not in mods)) else 1
    return {int(m.group(1)) + j for j in range(n)}


@test
def flash_hopper_forward_compiles_to_wgmma_and_tma_without_spills():
    """the four rungs' kernels for sm_90a (the Makefile's flags, bf16, LLMC_WGMMA): ptxas -v reports
    no spills, no stack frame and no serialized wgmma; the SASS (nvdisasm) has wgmma (HGMMA), TMA
    loads (UTMALDG), no mma.sync (HMMA) and no cp.async (LDGSTS), setmaxnreg (USETMAXREG) from v9 on,
    and no instruction writes the A registers of an HGMMA (p, in p v) before the wait that drains
    every product after it (v11 leaves a p v running under the softmax: its p must stay put)"""
    out, cubin = sm90a_cubin("flash_hopper_forward_sass", '#include "llmc/cuda/flash_hopper.cuh"\n'
        "void instantiate(floatX* out, float* lse, const floatX* qkv, int B, int T, int C, int NH) {\n"
        "    for (int v = 8; v < 8 + FLASH_HOPPER_FORWARD_VERSIONS; v++) flash_hopper_forward(v, out, lse, qkv, B, T, C, NH);\n"
        "}\n")
    # (flash_attention.cuh's kernels come along; only these must not be serialized)
    serialized = [line for line in out.splitlines() if "serialized" in line and "flash_hopper_forward" in line]
    assert not serialized, "\n".join(serialized)
    for kernel in HOPPER_FORWARD_KERNELS:
        ptxas_without_spills(out, "flash_hopper_forward_%s_kernel" % kernel)
    sections = sass_sections(cubin)
    for v, kernel in enumerate(HOPPER_FORWARD_KERNELS, 8):
        body, counts = sass_of(sections, "flash_hopper_forward_%s_kernel" % kernel,
                               ("HGMMA", "HMMA", "UTMALDG", "LDGSTS", "USETMAXREG"))
        print("    sm_90a v%d %s SASS: %s" % (v, kernel, counts))
        assert counts["HGMMA"] > 0 and counts["HMMA"] == 0 and counts["LDGSTS"] == 0, "%s: %s" % (kernel, counts)
        assert counts["UTMALDG"] > 0 and (counts["USETMAXREG"] > 0) == (v >= 9), "%s: %s" % (kernel, counts)
        hgmma_a_registers_kept(body, "v%d" % v)
