#!/usr/bin/env bash
# What the compiler made of the flash attention kernels (llmc/cuda/flash_attention.cuh), without
# a GPU: compile them for sm_80, sm_90 and sm_90a (Hopper's own instructions: the wgmma forward,
# LLMC_FLASH=wgmma) with the Makefile's nvcc flags (bf16, the default PRECISION), then check
#   (a) ptxas -v: no kernel spills registers to local memory (0 bytes spill stores and loads)
#       or has a stack frame (a register array indexed by a value known only at run time, such
#       as the counter of a loop left rolled, lives in local memory too); registers per thread
#       and static shared memory per block are printed. (dK/dV at head size 64, compiled for 3
#       blocks an SM at 168 registers, FLASH_DKDV_BLOCKS, was allowed a bounded spill: 68 bytes
#       when it was measured faster than 227 registers and no spills, 23.8 against 24.9 ms a d12
#       step's attention backward on an H200; 8 once v was read from shared memory each tile;
#       none since its tile became flash_dkdv_tile, so no kernel is allowed one now.)
#   (b) the SASS (nvdisasm): every tile kernel contains LDSM (ldmatrix),
#       HMMA (mma.sync on the tensor cores; HGMMA, wgmma, in the wgmma kernel, where ptxas must
#       not have serialized the products) and LDGSTS (cp.async global -> shared), and how many
#       plain shared loads/stores (LDS/STS), local loads/stores (LDL/STL: spills) and MUFU.EX2
#       (the exp2 of the softmax) it has; a tile kernel with any LDL/STL fails; and the
#       instructions of its loop over tiles, which must have no loop inside it (a tile's loads
#       unrolled: looped, they were a third of the instructions a tile issued; a wait that
#       sleeps, the one-kernel backward's for its turn, aside);
#   (c) in the wgmma kernels' SASS, no HGMMA's A registers are written while the product is in
#       flight, or later in its loop without being written again before it (ptxas before CUDA 13.3
#       reused the registers of A fragments held across the loop; FLASH_SASS_DEFINES=
#       -DFLASH_WGMMA_COPY_A=0 builds the kernels without their workaround, and this check fails).
# An instruction is counted once per place in the code, not per execution.
#
#   dev/cuda/flash_sass.sh        exit 0: all checks passed; 1: a check failed; 77: compiled and
#                                 checked (a), but no disassembler was found for (b) and (c)
# nvcc and nvdisasm: where dev/tools.sh looks (PATH, the toolkit, NVIDIA's pip package, which
# dev/setup.sh installs where nvcc lacks a disassembler, as a minimal CUDA 13 toolkit does).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
PYTHON=$(command -v /usr/bin/python3 || command -v python3)

source dev/tools.sh
NVCC=$(find_cuda_tool nvcc || true)
[ -n "$NVCC" ] || { echo "flash_sass: no nvcc (PATH or $CUDA_HOME/bin)"; exit 1; }

# the disassembler: nvdisasm, looked for where dev/setup.sh installs it (dev/tools.sh: PATH, the
# toolkit, NVIDIA's pip package). cuobjdump -sass is not enough alone: it runs nvdisasm itself.
DISASM=$(find_cuda_tool nvdisasm || true)

# the Makefile's device-code flags (NVCC_FLAGS: -O3 -std=c++17 -I. ...); bf16 is PRECISION's default
NVCC_FLAGS=$(sed -n 's/^NVCC_FLAGS := //p' Makefile)
[ -n "$NVCC_FLAGS" ] || { echo "flash_sass: no NVCC_FLAGS in the Makefile"; exit 1; }
# FLASH_SASS_DEFINES: more -D flags, e.g. -DFLASH_WGMMA_COPY_A=0, which leaves out the copy that
# keeps ptxas from reusing the wgmma kernels' A registers: the check of (c) below must then fail
NVCC_FLAGS="$NVCC_FLAGS ${FLASH_SASS_DEFINES:-}"

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
# one translation unit whose host code calls both launchers: every kernel and head size the
# trainers can launch is instantiated, and the forward at MT = 1 (dev/cuda's v5)
cat > "$WORK/flash_kernels.cu" <<'EOF'
#include "llmc/cuda/flash_attention.cuh"
#include "llmc/cuda/ring_attention.cuh"
void flash_instantiate(floatX* out, float* lse, floatX* dqkv, const floatX* dout, const floatX* qkv,
                       int B, int T, int C, int NH) {
    attention_forward_flash(out, lse, qkv, B, T, C, NH);
    attention_backward_flash(dqkv, dout, qkv, out, lse, B, T, C, NH);
}
// context parallelism's blocks: the same kernels on chunk pairs (llmc/cuda/ring_attention.cuh)
void ring_instantiate(float* o, float* lse, float* scratch, float* dq, float* dkv, const floatX* dout, const floatX* qkv,
                      const floatX* kv, CpChunks q, CpChunks k, int B, int C, int NH) {
    attention_block_forward_flash(o, lse, scratch, qkv, kv, q, k, B, C, NH, 1);
    attention_block_backward_flash(dq, dkv, dout, lse, scratch, qkv, kv, q, k, B, C, NH);
}
// and the 64-query forward (MT = 1) that dev/cuda/attention_forward times as v5
template __global__ void flash_attention_forward_kernel<16, 1>(floatX*, float*, const floatX*, int, int, int, int);
template __global__ void flash_attention_forward_kernel<32, 1>(floatX*, float*, const floatX*, int, int, int, int);
template __global__ void flash_attention_forward_kernel<64, 1>(floatX*, float*, const floatX*, int, int, int, int);
EOF

ARCHS="80 90 90a"
for sm in $ARCHS; do  # the architectures side by side; sm_90a as the Makefile builds it (LLMC_WGMMA)
    # shellcheck disable=SC2086
    "$NVCC" -cubin -gencode arch=compute_$sm,code=sm_$sm $NVCC_FLAGS $([ $sm = 90a ] && echo -DLLMC_WGMMA) \
        -I"$ROOT" -Xptxas -v "$WORK/flash_kernels.cu" -o "$WORK/sm_$sm.cubin" > "$WORK/ptxas_$sm.txt" 2>&1 &
done
failed=0
for job in $(jobs -p); do wait "$job" || failed=1; done
if [ $failed -ne 0 ]; then
    cat "$WORK"/ptxas_*.txt
    echo "flash_sass: nvcc failed"
    exit 1
fi
for sm in $ARCHS; do
    if [ -n "$DISASM" ]; then
        "$DISASM" -c "$WORK/sm_$sm.cubin" > "$WORK/sass_$sm.txt"
    fi
done

status=0
"$PYTHON" - "$WORK" "$ARCHS" "${DISASM:-}" <<'EOF' || status=$?
import os, re, sys
work, archs, disasm = sys.argv[1], sys.argv[2].split(), sys.argv[3]

def demangle(symbol):
    """_Z30flash_attention_forward_kernelILi64ELi2EEv... -> (flash_attention_forward_kernel, (64, 2)):
    the name and the int template arguments (head size first), () for a plain function"""
    m = re.match(r"_Z(\d+)", symbol)
    name = symbol[m.end():m.end() + int(m.group(1))]
    args = re.match(r"I((?:Li\d+E)+)E", symbol[m.end() + int(m.group(1)):])
    return name, tuple(int(a) for a in re.findall(r"Li(\d+)E", args.group(1))) if args else ()

def ptxas(sm):
    """kernel -> registers, shared bytes, spill store bytes, spill load bytes, stack bytes"""
    info, kernel = {}, None
    for line in open(os.path.join(work, "ptxas_%s.txt" % sm)):
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            kernel = demangle(m.group(1))
            info[kernel] = {"smem": 0}
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and kernel:
            info[kernel].update(stack=int(m.group(1)), spill_st=int(m.group(2)), spill_ld=int(m.group(3)))
        m = re.search(r"Used (\d+) registers", line)
        if m and kernel:
            info[kernel]["regs"] = int(m.group(1))
            s = re.search(r"(\d+) bytes smem", line)
            info[kernel]["smem"] = int(s.group(1)) if s else 0
    return info

OPS = ["LDSM", "HMMA", "HGMMA", "LDGSTS", "LDS", "STS", "LDL", "STL", "MUFU.EX2"]

# one instruction of nvdisasm's listing: address, guard predicate, opcode, modifiers, operands
INSN = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P[T0-9]+\s+)?([A-Z0-9_]+)((?:\.[A-Za-z0-9_]+)*)\s*(.*?)\s*;")

def sass_listing(sm):
    """(kernel name, head-size args) -> (instructions, labels): each instruction (address, guard,
    op, modifiers, operands), and each branch label's index in that list"""
    kernels, cur = {}, None
    for line in open(os.path.join(work, "sass_%s.txt" % sm)):
        m = re.match(r"^\.text\.(_Z\w+):", line)
        if m:
            cur = kernels.setdefault(demangle(m.group(1)), ([], {}))
        elif cur is not None and re.match(r"^\.L_x_\d+:", line):
            cur[1][line.split(":")[0]] = len(cur[0])
        elif cur is not None and (m := INSN.search(line)):
            cur[0].append((m.group(1), (m.group(2) or "").strip(), m.group(3), m.group(4), m.group(5)))
    return kernels

def sass(listing):
    """kernel -> {op: count}; LDS/STS count only instructions that can execute: ptxas puts
    never-executed '@!PT LDS RZ, [RZ]' beside LDGSTS, counted apart as LDS(@!PT)"""
    counts = {}
    for kernel, (insns, _) in listing.items():
        counts[kernel] = dict.fromkeys(OPS + ["LDS(@!PT)"], 0)
        for _, guard, op, mods, _ in insns:
            if op == "MUFU" and mods.startswith(".EX2"):
                op = "MUFU.EX2"
            if op in ("LDS", "STS") and guard == "@!PT":
                op += "(@!PT)"
            if op in counts[kernel]:
                counts[kernel][op] += 1
    return counts

# wgmma reads its A fragment from registers asynchronously, and ptxas before CUDA 13.3 may give
# those registers to other values too early: on an H200, a q fragment held across the loop over
# tiles was overwritten by p after the first tile (flash_attention.cuh: flash_wg_copy_a). In the
# SASS of each wgmma kernel, for every HGMMA and its A registers (4 from the one named):
#   (1) in flight: nothing writes them before the WARPGROUP.DEPBAR that waits for the product;
#   (2) around a loop (a backward BRA): if the loop writes them after the HGMMA, it writes them
#       again before it, so that the next iteration's product reads this iteration's values.
# (Straight-line reading within a loop: a write on one branch counts as made; enough for these
# kernels, whose writes of A fragments are unconditional.)
def written(op, mods, args):
    """the registers an instruction writes: its first operand when that is a register (SHFL's
    second, after the predicate it writes first; ISETP and the like write predicates only), as
    wide as the instruction (LDSM .4, .128: 4; LDSM .2, .64, .WIDE, CS2R, F64 arithmetic: 2)"""
    if op in ("HGMMA", "BRA", "BAR", "EXIT", "RET", "CALL", "WARPGROUP") or op.startswith("ST") or op == "RED":
        return set()
    operands = [a.strip() for a in args.split(",")]
    if operands and re.fullmatch(r"!?U?P(T|\d+)", operands[0]):
        if op != "SHFL":
            return set()
        operands = operands[1:]
    m = re.fullmatch(r"R(\d+)", operands[0]) if operands else None
    if not m:
        return set()
    n = 4 if ".128" in mods or (op == "LDSM" and mods.endswith(".4")) else \
        2 if (".64" in mods or ".WIDE" in mods or ".F64" in mods or (op == "LDSM" and mods.endswith(".2"))
              or (op == "CS2R" and ".32" not in mods) or op in ("DADD", "DMUL", "DFMA")) else 1
    return {int(m.group(1)) + j for j in range(n)}

def loops(insns, labels):
    """the loops of a kernel's listing: (first, last) instruction index of each backward BRA's span"""
    return [(labels[m.group(1)], e) for e, (_, _, op, _, args) in enumerate(insns)
            for m in [re.search(r"`\((\.L_x_\d+)\)", args)] if op == "BRA" and m and labels.get(m.group(1), e + 1) <= e]

def tile_loop(insns, labels):
    """(instructions in the kernel's loop over tiles, its largest; how many loops lie inside it,
    a wait aside: a loop that sleeps (NANOSLEEP), the one-kernel backward's wait for its turn)"""
    spans = loops(insns, labels)
    if not spans:
        return 0, 0
    first, last = max(spans, key=lambda s: s[1] - s[0])
    waits = lambda a, e: any(insns[j][2] == "NANOSLEEP" for j in range(a, e + 1))
    return last - first + 1, sum(1 for a, e in spans if first <= a and e <= last and (a, e) != (first, last) and not waits(a, e))

def wgmma_register_hazards(listing):
    problems = []
    for (name, _), (insns, labels) in listing.items():
        if "wgmma" not in name:
            continue
        writes = [written(op, mods, args) for _, _, op, mods, args in insns]
        for x, (addr, _, op, _, args) in enumerate(insns):
            m = re.match(r"R\d+, R(\d+),", args)
            if op != "HGMMA" or not m:
                continue
            a = {int(m.group(1)) + j for j in range(4)}
            wait = next((j for j in range(x + 1, len(insns)) if insns[j][2] == "WARPGROUP" and insns[j][3].startswith(".DEPBAR")), len(insns))
            for j in range(x + 1, wait):
                if writes[j] & a:
                    problems.append("sm_90a %s: the HGMMA at %s reads A from R%d.., which %s at %s overwrites before the wait"
                                    % (name, addr, min(a), insns[j][2], insns[j][0]))
            for first, last in loops(insns, labels):
                if first <= x <= last:
                    later = set().union(*writes[x + 1:last + 1]) & a
                    if later - set().union(*writes[first:x]):
                        problems.append("sm_90a %s: the HGMMA at %s reads A from R%d.., which its loop overwrites later (up to %s) "
                                        "and does not write again before it: the next iteration reads other values"
                                        % (name, addr, min(a), insns[last][0]))
    return problems

failures, rows = [], []
for sm in archs:
    for line in open(os.path.join(work, "ptxas_%s.txt" % sm)):
        if "serialized" in line:  # ptxas waits for each wgmma before the next: correct, but slow
            failures.append("sm_%s: %s" % (sm, line.strip()))
    info = ptxas(sm)
    listing = sass_listing(sm) if disasm else {}
    counts = sass(listing)
    if sm == "90a":
        failures += wgmma_register_hazards(listing)
    for (name, hs), k in sorted(info.items()):
        if not name.startswith("flash_attention") and not name.startswith("ring_flash"):
            continue
        label = "%s%s" % (name.replace("flash_attention_", "").replace("_kernel", ""),
                          "<%s>" % ",".join(map(str, hs)) if hs else "")
        if k["spill_st"] or k["spill_ld"]:
            failures.append("sm_%s %s spills: %d bytes stores, %d bytes loads (%d registers)"
                            % (sm, label, k["spill_st"], k["spill_ld"], k["regs"]))
        if k["stack"]:
            failures.append("sm_%s %s has a %d-byte stack frame: a register array in local memory"
                            % (sm, label, k["stack"]))
        c = counts.get((name, hs))
        if disasm and c is None:
            failures.append("sm_%s %s: not found in the SASS" % (sm, label))
        if c and (hs or "wgmma" in name):  # the tile kernels: ldmatrix, tensor cores, cp.async
            for op in ("LDSM", "HGMMA" if "wgmma" in name else "HMMA", "LDGSTS"):
                if c[op] == 0:
                    failures.append("sm_%s %s: no %s in its SASS" % (sm, label, op))
            if c["LDL"] or c["STL"]:
                failures.append("sm_%s %s: %d LDL and %d STL: local memory in the tile loop"
                                % (sm, label, c["LDL"], c["STL"]))
        size, inner = tile_loop(*listing[(name, hs)]) if c else ("-", 0)
        if inner and (hs or "wgmma" in name):  # the tile loads' rounds are unrolled (flash_load_async)
            failures.append("sm_%s %s: %d loop(s) inside the loop over tiles" % (sm, label, inner))
        rows.append(["sm_%s" % sm, label, k["regs"], k["smem"], "%d/%d" % (k["spill_st"], k["spill_ld"])]
                    + ([c[op] for op in OPS + ["LDS(@!PT)"]] if c else ["-"] * (len(OPS) + 1)) + [size])

head = ["arch", "kernel", "regs", "smem B", "spill st/ld B"] + OPS + ["LDS(@!PT)", "tile loop"]
widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
print("  ".join(str(h).rjust(w) if i > 1 else str(h).ljust(w) for i, (h, w) in enumerate(zip(head, widths))))
for r in rows:
    print("  ".join(str(x).rjust(w) if i > 1 else str(x).ljust(w) for i, (x, w) in enumerate(zip(r, widths))))
print("LDS/STS that execute: only the dK/dV kernels' lse_s/D_s rows (flash_load_row_values stores them,\n"
      "the score loop reads them), and the one-kernel backward's ds^T (16 STS a tile); LDS(@!PT):\n"
      "placeholders ptxas sets beside LDGSTS, predicated never-true. smem B: static shared memory only\n"
      "(the one-kernel backward's 64 KB at HS 64 are dynamic).\n"
      "LDGSTS: once per round of each flash_load_async call (unrolled: 4 rounds load a (64, 64) tile).\n"
      "tile loop: the instructions of the loop over key (or query) tiles, the masked branch included,\n"
      "with no loop inside it (the first tile loads looped over blockDim.x: 35 instructions a copy).")
if failures:
    for f in failures:
        print("FAILED: " + f)
    sys.exit(1)
if not disasm:
    print("no nvdisasm: SASS not checked (dev/setup.sh installs it: pip nvidia-cuda-nvdisasm)")
    sys.exit(77)
print("flash_sass: no spills or local memory; LDSM, HMMA (HGMMA) and LDGSTS in every tile kernel;"
      " no HGMMA's A registers overwritten in flight or around its loop (disassembler: %s)" % disasm)
EOF
echo "flash_sass: ${SECONDS} s"
exit $status
