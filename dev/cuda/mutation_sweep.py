"""
Mutation sweep of the barriers in llmc/cuda: does test/cuda_emu notice when one is missing?

For every __syncthreads(), __syncwarp(), cp_async_wait<N>(), wgmma_wait<N>(), mbarrier_wait(...),
named_barrier_sync(...) and tma_store_wait<N>() in llmc/cuda, and in the dev/cuda programs whose kernels are their own
(dev/cuda/tma.cu: Hopper's TMA ring), one at a time: copy the sources to build/mutation/, delete that one statement, build the dev/cuda
programs that test its file under the emulator (bf16), and run them with threads in both orders (CUDA_EMU_ORDER),
under the warp-serial schedule (the default) and under the old lock-step one. A mutation is caught
when a program fails its validation (or the emulator stops it) in at least one order.

Shuffles are left out: deleting one changes which values are combined, not when, and any
validation catches that; they are data movement here, not barriers.

    python3 dev/cuda/mutation_sweep.py [-j JOBS] [--warp-serial-only] [--no-control] [filter]
    make mutation-sweep
filter: "file:line" for one barrier (e.g. "flash_attention.cuh:156"), or a part of a file name.
A control run beside the mutations: the unmutated programs must validate in every configuration,
else nothing is reported. --no-control leaves it out, for a caller that has validated the
unmutated programs already (the test suite's emu_dev_cuda tests do).
"""
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# the sweep of the trainers' mechanisms, whose copy of a checkout this one uses (loaded by its
# path: both files are named mutation_sweep.py)
_spec = importlib.util.spec_from_file_location("trainer_mutation_sweep", os.path.join(ROOT, "dev", "mutation_sweep.py"))
trainer_sweep = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(trainer_sweep)
WORK = os.path.join(ROOT, "build", "mutation")
# (a statement may follow a one-line `if (...)`, as a wait only the issuing thread makes)
BARRIER = re.compile(r"^(\s*)(?:if \([^()]*\) )?(__syncthreads\(\);|__syncwarp\(\);|cp_async_wait<\d+>\(\);|wgmma_wait<\d+>\(\);"
                     r"|mbarrier_wait\([^;]*\);|named_barrier_sync\([^;]*\);|tma_store_wait<\d+>\(\);)")
# the dev/cuda programs that validate each file's kernels
PROGRAMS = {
    "adamw.cuh": ["adamw"],
    "classifier.cuh": ["classifier"],
    "flash_attention.cuh": ["attention_forward", "attention_backward"],
    "flash_hopper.cuh": ["attention_forward"],
    "flash_hopper_backward.cuh": ["attention_backward"],
    "layernorm.cuh": ["layernorm_forward", "layernorm_backward"],
    "encoder.cuh": ["encoder_backward"],
    "gelu.cuh": ["gelu"],
    "matmul.cuh": ["matmul_forward", "matmul_backward"],
    "moe.cuh": ["moe"],
    "ring_attention.cuh": ["ring_attention"],
    "tma.cu": ["tma"],
}
# where each swept file is: llmc/cuda, but for the dev/cuda programs that hold their own kernels
SWEPT_PROGRAMS = {"tma.cu": "dev/cuda"}


def folder(name):
    return SWEPT_PROGRAMS.get(name, "llmc/cuda")
SCHEDULES = ["warp-serial", "lockstep"]


def barriers():
    """(file, line number, statement) of every barrier statement in llmc/cuda (then SWEPT_PROGRAMS)"""
    found = []
    for name in sorted(os.listdir(os.path.join(ROOT, "llmc", "cuda"))) + sorted(SWEPT_PROGRAMS):
        with open(os.path.join(ROOT, folder(name), name)) as f:
            for number, line in enumerate(f, 1):
                m = BARRIER.match(line)
                if m:
                    found.append((name, number, m.group(2)))
    return found


def copy_tree(dest):
    """what the Makefile's emulator build reads: every trainer, llmc, dev/cuda, the emulator (the
    checkout's files there, copied as dev/mutation_sweep.py copies a checkout: never a build output)"""
    read = ("llmc/", "dev/cuda/", "test/cuda_emu/", "test/test_comm.c", "Makefile")
    trainer_sweep.copy_checkout(dest, [f for f in trainer_sweep.checkout_files(ROOT) if f.startswith(read) or re.fullmatch(r"train_gpt2_\w+\.cu", f)])


def run(program, env):
    """1: the program validated; 0: it failed (or hung: a missing barrier can deadlock)"""
    try:
        p = subprocess.run([program], env=dict(os.environ, **env), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=600)
    except subprocess.TimeoutExpired:
        return 0
    return p.returncode == 0


def sweep_one(index, name, number, statement):
    """(caught under each schedule, or an error text); statement None: the unmutated control"""
    dest = os.path.join(WORK, "m%02d" % index)
    copy_tree(dest)
    if statement is not None:
        path = os.path.join(dest, folder(name), name)
        with open(path) as f:
            lines = f.read().split("\n")
        lines[number - 1] = lines[number - 1].replace(statement, ";  /* mutation: barrier removed */", 1)
        with open(path, "w") as f:
            f.write("\n".join(lines))
    # in the order PROGRAMS lists them (forward before backward), once each: the first program
    # that fails is enough, and a forward kernel's barrier fails the cheaper forward program
    programs = list(dict.fromkeys(sum((PROGRAMS.get(n, []) for n in name.split(",")), [])))
    if not programs:
        return None, "no dev/cuda program tests %s" % name
    targets = ["build/emu_BF16/dev/cuda/" + p for p in programs]
    p = subprocess.run(["make", "-s", "-j2"] + targets, cwd=dest, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if p.returncode != 0:
        return None, "build failed: " + p.stdout.decode("utf-8", "replace")[-500:]
    caught = {}
    for schedule in SCHEDULES:
        caught[schedule] = ""
        for order in ("forward", "reverse"):
            if any(not run(os.path.join(dest, t), dict(CUDA_EMU_SCHEDULE=schedule, CUDA_EMU_ORDER=order))
                   for t in targets):
                caught[schedule] += order[0]  # "f", "r" or "fr": the orders that caught it
    shutil.rmtree(dest, ignore_errors=True)
    return caught, None


def main():
    args = sys.argv[1:]
    jobs = 2
    if args[:1] == ["-j"]:
        jobs, args = int(args[1]), args[2:]
    if args[:1] == ["--warp-serial-only"]:
        del SCHEDULES[1:]
        args = args[1:]
    with_control = args[:1] != ["--no-control"]
    if not with_control:
        args = args[1:]
    pattern = args[0] if args else ""
    # "file:line" selects that barrier; anything else, every barrier whose "file:line" contains it
    todo = [(i, *b) for i, b in enumerate(barriers())
            if (pattern == "%s:%d" % (b[0], b[1])) or (":" not in pattern and pattern in b[0])]
    os.makedirs(WORK, exist_ok=True)
    # the control, alongside the mutations: unmutated, every program must validate in both
    # orders under each schedule, or a "caught" below would mean nothing
    with ThreadPoolExecutor(jobs) as pool:
        control_job = pool.submit(sweep_one, 99, ",".join(sorted(set(t[1] for t in todo))), 0, None) if with_control else None
        results = list(pool.map(lambda t: sweep_one(*t), todo))
        control, error = control_job.result() if with_control else ({}, None)
    if error or not all(c == "" for c in control.values()):
        print("the unmutated programs do not validate (%s): no sweep" % (error or control))
        sys.exit(1)
    print("| barrier | statement | " + " | ".join(SCHEDULES) + " |")
    print("| --- | --- |" + " --- |" * len(SCHEDULES))
    missed = 0
    for (i, name, number, statement), (caught, error) in zip(todo, results):
        if error:
            print("| %s/%s:%d | `%s` | %s |" % (folder(name), name, number, statement, error) + " |" * (len(SCHEDULES) - 1))
            missed += 1
            continue
        cells = [("caught (%s)" % "+".join({"f": "forward", "r": "reverse"}[c] for c in caught[s])) if caught[s] else "**missed**"
                 for s in SCHEDULES]
        missed += not caught["warp-serial"]
        print("| %s/%s:%d | `%s` | %s |" % (folder(name), name, number, statement, " | ".join(cells)))
    print("%d barriers, %d caught under warp-serial, %d missed" % (len(todo), len(todo) - missed, missed))
    sys.exit(1 if missed else 0)


if __name__ == "__main__":
    main()
