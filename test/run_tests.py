"""
The test runner behind `make test`. Runs every test, prints one line each and ends with
"N passed, N failed, N skipped"; exits non-zero when any test fails.

The trainers are compared against test/reference.py (PyTorch, fp32, one process): same initial
weights (the reference writes the model file the trainers load), same global batches.

    /usr/bin/python3 test/run_tests.py [name-filter]

Tests run side by side, as many at a time as the machine has cores (TEST_JOBS=N to choose; 1:
one after another, in this process). Each runs in a worker process of its own and prints its
lines when it ends. What tests share is made once per suite run and locked while it is made
(shared_dir: the references; build: make), and each test's directories are its own (fresh_dir
puts them under the test's name).
"""
import collections
import concurrent.futures
import fcntl
import glob
import html
import html.parser
import io
import json
import multiprocessing
import math
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
import urllib.parse
import zlib

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "test"))
import reference  # noqa: E402
import comparison  # noqa: E402
from comparison import read_log  # noqa: E402

TMP = os.path.join(ROOT, "test", "tmp")
TIMEOUT = 300  # seconds; a run that takes longer is reported as a hang
TESTS = []
# this suite run, the same in its worker processes: what it made in TMP is reused, what an
# earlier run left there is made again (the code under test may have changed since)
SUITE = os.environ.setdefault("LLMC_TEST_SUITE", "%d.%d" % (os.getpid(), time.time()))


class Skip(Exception):
    pass


def test(fn):
    TESTS.append(fn)
    return fn


def mpirun(np_, args, threads=1, timeout=TIMEOUT, program="./train_gpt2_dp", env=None):
    """runs program under mpirun with np_ ranks; returns (returncode, stdout + stderr)"""
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(np_), program] + [str(a) for a in args]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), **(env or {}))
    try:
        p = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError("no exit within %d s (hang?): %s" % (timeout, " ".join(cmd)))
    return p.returncode, p.stdout.decode("utf-8", "replace")


def why_it_failed(out):
    """the lines of a failed run that say why (a rank's "error:", MPI's abort, the emulator's
    complaint, a test program's "FAIL:"), first, so that a report cut after a few lines still
    shows them; then the tail"""
    why = [l for l in out.splitlines() if re.search(r"error|abort|fatal|emu:|signal|^FAIL:", l, re.I)]
    return "\n".join(why[:12] + ["-- the run's last lines:", out[-3000:]])


def run_ok(np_, args, **kw):
    code, out = mpirun(np_, args, **kw)
    assert code == 0, "exit code %d; %s" % (code, why_it_failed(out))
    return out


# the directories the running test made: removed when it passes (its checkpoints would otherwise
# fill gigabytes over the suite), kept for reading when it fails
TEST_DIRS = []
RUNNING = {"test": None}  # the name of the test this process runs


def test_dir(name):
    """where fresh_dir(name) puts the running test's directory: under the test's own name, so
    that tests running side by side (or helpers that two tests call) never share one"""
    return os.path.join(TMP, RUNNING["test"], name) if RUNNING["test"] else os.path.join(TMP, name)


def fresh_dir(name):
    d = test_dir(name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    TEST_DIRS.append(d)
    return d


def make(targets, timeout=1800):
    """make -s -j2 targets, one make at a time over the suite's processes (two makes of one target
    side by side would write the same files)"""
    os.makedirs(TMP, exist_ok=True)
    with open(os.path.join(TMP, ".make.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return subprocess.run(["make", "-s", "-j2"] + targets, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=timeout)


def shared_dir(out, fill):
    """out, made by fill(out) once in this suite run, whichever test asks first: a test running
    beside it waits on the lock and reads what the first made (a reference run, say)"""
    os.makedirs(TMP, exist_ok=True)
    with open(out + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # (released when the file closes)
        stamp = os.path.join(out, ".suite")
        if not os.path.exists(stamp) or open(stamp).read() != SUITE:
            shutil.rmtree(out, ignore_errors=True)
            fill(out)
            with open(stamp, "w") as f:
                f.write(SUITE)
    return out


def step_comm_bytes(d, steps, out=None, changing=False):
    """{step: {group: {kind: bytes}}} from main.log in d, one entry for each of `steps` steps. With
    the run's stdout `out`: every step line is under 120 characters, and the bytes of each
    collective, the same every step in these runs, print once (after step 1), each group's equal
    to main.log's; changing: bytes that change from step to step (DiLoCo's outer steps) print
    after step 1 and after each step whose bytes differ from the step before, each time equal to
    main.log's"""
    train, _ = read_log(d)
    assert sorted(train) == list(range(1, steps + 1)), "main.log has steps %s, expected 1..%d" % (sorted(train), steps)
    comm = {s: {g: {k.replace("_", "-"): n for k, n in kinds.items()} for g, kinds in train[s]["comm"].items()}
            for s in train}
    if out is not None:
        lines = re.findall(r"^step +\d+/\d+ \|.*$", out, re.M)
        assert len(lines) == steps, "%d step lines, expected %d:\n%s" % (len(lines), steps, out[-2000:])
        long = [line for line in lines if len(line) >= 120]
        assert not long, "step lines of 120 characters or more:\n" + "\n".join(long)
        blocks = re.findall(r"^bytes this rank moved per step, from step (\d+) .*\n((?:  .*\n)*)", out, re.M)
        expected = ["1"] + [str(s) for s in range(2, steps + 1) if comm[s] != comm[s - 1]] if changing else ["1"]
        assert [b[0] for b in blocks] == expected, "the bytes printed from steps %s, expected from %s" % (
            [b[0] for b in blocks], expected)
        for step, text in blocks:
            for line in text.splitlines():
                group, kinds = re.match(r"  (\S+)\s+(.*) \(ring \d+ B\)$", line).groups()
                printed = {k.replace("_", "-"): int(n) for k, n in re.findall(r"(\w+) (\d+) B", kinds)}
                got = comm[int(step)][group]
                assert printed == got, "step %s printed %s: %s, main.log: %s" % (step, group, printed, got)
    return comm


# ---------------------------------------------------------------------------------------------
# what the tests need (dev/tools.sh): one lookup for dev/setup.sh, which installs what is missing,
# and for the tests, which skip with the tool's name when an optional one is not here

SETUP = os.path.join(ROOT, "dev", "setup.sh")
_tools = {}


def tool(name):
    """where dev/setup.sh --check found the tool (a path or a description), or None"""
    if not _tools:
        out = subprocess.run([SETUP, "--check"], cwd=ROOT, stdout=subprocess.PIPE, text=True).stdout
        for line in out.splitlines():
            found, _need, row, where = (line.split(None, 3) + [""])[:4]
            _tools[row] = where if found == "found" else None
    return _tools[name]


def readme_tool_rows():
    """the README's "What the tests need" table as (name, need, used by, installed by) rows"""
    with open(os.path.join(ROOT, "README.md")) as f:
        section = f.read().split("### What the tests need", 1)[1].split("\n#", 1)[0]
    rows = [[cell.strip().strip("`") for cell in line.strip().strip("|").split("|")]
            for line in section.splitlines() if line.startswith("| ")]
    return [tuple(r) for r in rows[2:]]  # (after the head and its --- row)


def setup_tool_rows():
    out = subprocess.run([SETUP, "--list"], stdout=subprocess.PIPE, text=True, check=True).stdout
    return [tuple(line.split("|")) for line in out.splitlines()]


@test
def resume_with_another_trainer_names_whose_checkpoint_it_is():
    """a checkpoint of a trainer with a state file per rank (DP) resumed by one that reads a
    gathered state file (CP), and the other way round: every rank stops naming the checkpoint's
    kind and the trainers that write it, and the dir keeps what it had"""
    for writer, reader, message in (("./train_gpt2_dp", CP, "holds a state file per rank"),
                                    (CP, "./train_gpt2_dp", "holds one gathered state file")):
        d = fresh_dir("resume_other_" + os.path.basename(writer))
        run_ok(2, small_run_args(d, ["-x", 2]), program=writer)
        before = dir_snapshot(d)
        code, out = mpirun(2, small_run_args(d, ["-x", 4, "-y", 1]), timeout=60, program=reader)
        assert code != 0 and "the checkpoint of step 2 in '%s' is another trainer's: it %s" % (d, message) in out, \
            "%s resuming %s's dir: exit %d\n%s" % (reader, writer, code, out[-2000:])
        assert dir_snapshot(d) == before, "the refused resume changed the output dir"


@test
def readme_contents_list_links_every_chapter_in_reading_order():
    """the README's contents: every link names a heading of the README (GitHub's anchor: lower
    case, punctuation but - and _ dropped, spaces as -), every chapter ("in five minutes") is
    listed, and the chapters stand in the file in the order the list gives: CP before 3D, whose
    fourth axis builds on it"""
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    heads = re.findall(r"^#{2,3} (.*)$", text, re.M)
    anchor = lambda h: re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")  # noqa: E731
    anchors = [anchor(h) for h in heads]
    contents = text.split("## Contents\n", 1)[1].split("\n## ", 1)[0]
    links = re.findall(r"\]\(#([^)]+)\)", contents)
    missing = [a for a in links if a not in anchors]
    assert links and not missing, "contents links with no heading: %s" % missing
    chapters = [anchor(h) for h in heads if "in five minutes" in h]
    listed = [a for a in links if a in chapters]
    assert listed == chapters, "chapters in the file %s, in the contents %s" % (chapters, listed)
    assert chapters.index("context-parallelism-in-five-minutes-train_gpt2_cpcu") < \
        chapters.index("3d-to-5d-in-five-minutes-train_gpt2_3dcu"), chapters


@test
def setup_lists_what_the_readme_lists_and_sees_a_fresh_machine():
    # the README's table is dev/tools.sh's, row for row
    rows = setup_tool_rows()
    assert readme_tool_rows() == rows, "README's table differs from dev/setup.sh --list:\n%s\n%s" % (
        "\n".join(map(str, readme_tool_rows())), "\n".join(map(str, rows)))
    # on this machine, which is running the tests, every required tool is found
    r = subprocess.run([SETUP, "--check"], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert r.returncode == 0 and not re.search(r"^missing\s+required", r.stdout, re.M), r.stdout
    # a fresh machine: PATH holds only a shell and a few basics, PYTHON, CUDA_HOME and the pip
    # directory point nowhere. Every tool is reported missing, and setup would install each
    # row's Debian packages and pip packages, but NVIDIA's (they only serve an nvcc)
    bare = fresh_dir("bare_path")
    for name in ("bash", "dirname", "mktemp", "rm", "grep", "sort", "head", "cat", "env", "id", "printf"):
        os.symlink(shutil.which(name), os.path.join(bare, name))
    env = dict(PATH=bare, HOME=bare, PYTHON="/nonexistent", CUDA_HOME="/nonexistent",
               LLMC_TOOLS_DIR=os.path.join(bare, "tools"))
    r = subprocess.run([os.path.join(bare, "bash"), SETUP, "--dry-run"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    assert r.returncode == 1, "a fresh machine: exit %d, expected 1 (required tools missing)\n%s" % (r.returncode, r.stdout)
    for name, need, _used_by, _installer in rows:
        assert re.search(r"^missing\s+%s\s+%s\s" % (need, re.escape(name)), r.stdout, re.M), \
            "a fresh machine: %s not reported missing\n%s" % (name, r.stdout)
    def planned(kind, out):
        m = re.search(r"^setup: %s (.*)$" % ("apt-get install" if kind == "apt" else r"pip install --target \S+"), out, re.M)
        return set(m.group(1).split()) if m else set()

    def packages(kind, nvidia):
        return {p for _n, _need, _u, inst in rows if inst.startswith(kind + ":") for p in inst[len(kind) + 1:].split()
                if nvidia or not p.startswith("nvidia-")}
    assert planned("apt", r.stdout) == packages("apt", True), "apt packages: %s, expected %s" % (
        planned("apt", r.stdout), packages("apt", True))
    assert planned("pip", r.stdout) == packages("pip", False), "pip: %s\n%s" % (packages("pip", False), r.stdout)
    # with nvcc (CUDA_HOME) but no disassembler, setup would pip install NVIDIA's nvdisasm too
    if have_nvcc():
        env["CUDA_HOME"] = os.path.dirname(os.path.dirname(tool("nvcc")))
        r = subprocess.run([os.path.join(bare, "bash"), SETUP, "--dry-run"], cwd=ROOT, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert planned("pip", r.stdout) == packages("pip", True), "pip: %s\n%s" % (packages("pip", True), r.stdout)


# programs every Debian system has (its Essential packages: bash, coreutils, grep, sed, mawk,
# findutils, util-linux, debianutils), which no script needs installed
BASE_COMMANDS = {"awk", "basename", "bash", "cat", "cd", "chmod", "cp", "cut", "date", "dirname", "env", "find",
                 "grep", "head", "id", "kill", "ln", "ls", "mkdir", "mktemp", "mv", "nice", "nproc", "printf",
                 "rm", "sed", "sleep", "sort", "tail", "tee", "timeout", "touch", "tr", "uniq", "wc", "xargs",
                 "mount", "umount"}  # (util-linux's mount: Debian priority required; where it cannot mount, the test skips)
# commands that are rows of their own under another name
COMMAND_ROWS = {"nvidia-smi": "gpu", "python": "python3", "g++": "g++", "cc": "gcc", "clang": "wasm"}


def scripts_dependencies():
    """(commands, Python modules) that the project's scripts call or import: the first word of
    each command in the shell scripts, the programs of subprocess calls, and every import"""
    import ast
    commands, modules, local = {}, {}, set()
    py_files = [f for f in glob.glob(os.path.join(ROOT, "**", "*.py"), recursive=True)
                if "/build/" not in f and "/.tools/" not in f and "/test/tmp/" not in f]
    sh_files = glob.glob(os.path.join(ROOT, "dev", "**", "*.sh"), recursive=True) + [os.path.join(ROOT, ".ci", "run")]
    for path in py_files:
        local.add(os.path.splitext(os.path.basename(path))[0])
        rel = os.path.relpath(path, ROOT)
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.Import):
                for a in node.names:
                    modules.setdefault(a.name.split(".")[0], rel)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                modules.setdefault(node.module.split(".")[0], rel)
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and isinstance(node.func.value, ast.Name) and node.func.value.id == "subprocess"
                  and node.args and isinstance(node.args[0], ast.List) and node.args[0].elts
                  and isinstance(node.args[0].elts[0], ast.Constant) and isinstance(node.args[0].elts[0].value, str)):
                program = node.args[0].elts[0].value
                if not program.startswith(("./", "/")):  # (the project's own programs)
                    commands.setdefault(program, rel)
    functions = set()
    for path in sh_files:
        functions |= set(re.findall(r"^\s*(\w+)\(\)\s*\{", open(path).read(), re.M))
    for path in sh_files:
        rel = os.path.relpath(path, ROOT)
        text = open(path).read()
        # the script's own functions, heredocs (Python fed to an interpreter), comments and quoted
        # text are not commands
        text = re.sub(r"<<-?'?(\w+)'?[^\n]*\n.*?\n\1\n", "\n", text, flags=re.S)
        text = "\n".join(re.sub(r"(^|\s)#.*", "", line) for line in text.splitlines())
        # quoted text, but for the commands run inside a double-quoted $(...)
        text = re.sub(r'"([^"\\]|\\.)*"', lambda m: " ; ".join(re.findall(r"\$\(([^()]*)\)", m.group(0))), text)
        text = re.sub(r"'[^']*'", "''", text)
        text = re.sub(r"^\s*[^\s()]+\)", "", text, flags=re.M)  # a case label
        text = re.sub(r"\$\(\((?:[^()]|\([^()]*\))*\)\)", "0", text)  # arithmetic, $(( ... ))
        for line in text.splitlines():
            for part in re.split(r"&&|\|\||[;|`{}]|\$\(|\(|\bthen\b|\bdo\b|\belse\b", line):
                words = [w for w in part.split() if not re.match(r"^\w+=", w)]
                while words and words[0] in ("if", "while", "until", "!", "time", "exec", "nice", "-n", "19", "sudo"):
                    words = words[1:]
                if words and words[0] == "timeout":  # timeout DURATION COMMAND: the command
                    words = words[2:]
                if words and re.match(r"^[a-z][\w.+-]*$", words[0]) and words[0] not in functions:
                    commands.setdefault(words[0], rel)
    stdlib = set(sys.stdlib_module_names) | local
    shell_words = subprocess.run(["bash", "-c", "compgen -b; compgen -k"], stdout=subprocess.PIPE, text=True).stdout.split()
    return ({c: f for c, f in commands.items() if c not in shell_words},
            {m: f for m, f in modules.items() if m not in stdlib})


@test
def every_program_and_module_the_scripts_use_is_in_setups_table():
    names = {row[0] for row in setup_tool_rows()}
    commands, modules = scripts_dependencies()
    # the scan finds what is known to be there: it can fail
    assert {"mpirun", "make", "compute-sanitizer", "nvidia-smi"} <= set(commands) and {"torch", "numpy"} <= set(modules), \
        (sorted(commands), sorted(modules))
    unlisted = ["%s (command, %s)" % (c, f) for c, f in sorted(commands.items())
                if c not in BASE_COMMANDS and COMMAND_ROWS.get(c, c) not in names]
    unlisted += ["%s (module, %s)" % (m, f) for m, f in sorted(modules.items()) if m not in names]
    assert not unlisted, "used but not in dev/tools.sh's table (nor a Debian base command): " + ", ".join(unlisted)


# ---------------------------------------------------------------------------------------------
# the reference run shared by the trainer tests: a 2-layer GPT-2 (C=64, 4 heads), global batch
# 8 x 32 tokens, 5 AdamW steps with warmup, cosine decay, weight decay and clipping.
# REF_GPT2 has GPT-2's vocabulary and tiny Shakespeare's tokens: the Hugging Face tests need it
# (GPT2LMHeadModel's shapes). Every other test runs REF: the same on a vocabulary of 1000 (padded
# to 1024, so the padding and the vocabulary split are still exercised), the tokens those of tiny
# Shakespeare modulo 1000 and the tokenizer GPT-2's first 1000 tokens with <|endoftext|> at
# 50256 mod 1000 = 256, where samples start. With 50257 tokens the LM head, the classifier and
# AdamW over the embedding were 97% of this model's parameters and most of the suite's time.
REF_GPT2 = dict(layers=2, heads=4, channels=64, max_seq_len=64, batch=8, seq_len=32, steps=5, lr=1e-3,
                warmup=2, final_lr_frac=0.1, weight_decay=0.1, grad_clip=1.0, seed=42, dtype="float64", vocab=50257,
                tokens=os.path.join(ROOT, "dev/data/tinyshakespeare/tiny_shakespeare_train.bin"),
                val_tokens=os.path.join(ROOT, "dev/data/tinyshakespeare/tiny_shakespeare_val.bin"),
                tokenizer=os.path.join(ROOT, "dev/data/gpt2_tokenizer.bin"))
SMALL_VOCAB = os.path.join(TMP, "vocab_1000")
REF = dict(REF_GPT2, vocab=1000, tokens=os.path.join(SMALL_VOCAB, "train.bin"),
           val_tokens=os.path.join(SMALL_VOCAB, "val.bin"), tokenizer=os.path.join(SMALL_VOCAB, "tokenizer.bin"))
# the same with 3 heads of 16 channels and T = 24, for 3 tensor-parallel ranks (NH, 4C, Vp and T
# divide by 3: a vocabulary of 1100 pads to 1152 = 3 x 384)
REF3 = dict(REF, heads=3, channels=48, seq_len=24, vocab=1100)
# 4 and 8 layers, for pipelines of 2 and 4 stages (8: 4 stages of 2 chunks). Their comparisons
# with the reference keep GPT-2's vocabulary (REF4_GPT2, REF8_GPT2): with 1000 tokens one weight
# of the 4-layer model (fcproj of layer 3) has a step-0 gradient of 3e-9, the sum of terms of
# 1e-2 that cancel, so its fp32 value is rounding noise (66% off in some layouts), which AdamW's
# m / (sqrt(v) + eps) turns into steps of up to lr: 3e-5 of final error, past the 2e-5 that
# catches a wrong update. A model whose gradients fp32 resolves is the fair test of the layouts.
REF4 = dict(REF, layers=4)
REF4_GPT2 = dict(REF_GPT2, layers=4)
REF8_GPT2 = dict(REF_GPT2, layers=8)
# batches of an odd number of micro-batches of one or two sequences, for the V schedules' odd m
REF4_GPT2_B6, REF4_GPT2_B10 = dict(REF4_GPT2, batch=6), dict(REF4_GPT2, batch=10)
REF8_GPT2_B7, REF8_GPT2_B9 = dict(REF8_GPT2, batch=7), dict(REF8_GPT2, batch=9)
# a batch of 6 sequences, for 3 data-parallel ranks
REF6 = dict(REF, batch=6)
# 3 steps of REF and REF4 for the CUDA backend's tests: the emulator runs a step in seconds,
# not milliseconds, and 3 steps still cover warmup, decay and a step after clipping
REF_CUDA = dict(REF, steps=3)
REF4_CUDA = dict(REF4, steps=3)  # (the CUDA tolerances leave room for the gradient above)
# GPT-2's vocabulary for the classifier's paths: its bf16 row of 50304 logits fills the split
# kernel's registers and shared memory (the default split kernel), where 1024 would not reach the latter
REF_GPT2_CUDA = dict(REF_GPT2, steps=3)
# one head of 64 channels, for the flash kernels on wgmma (LLMC_FLASH=wgmma), built for head size 64;
# T = 200: four key tiles of 64 and two blocks of 128 queries, so that both warpgroups of a block
# work and each holds its fragments across several tiles (at T = 32, one tile and one warpgroup
# passed on an H200 while a kernel that lost its q fragments after the first tile failed)
REF_HS64_CUDA = dict(REF, heads=1, steps=3, batch=2, seq_len=200, max_seq_len=256)
_ref_cache = {}


def padded_vocab(cfg):
    return reference.padded_vocab(cfg["vocab"])


def small_vocabulary(out):
    """SMALL_VOCAB: tiny Shakespeare's GPT-2 tokens modulo 1000 (train.bin, val.bin) and their
    tokenizer (tokenizer.bin, llm.c's format): GPT-2's tokens 0..999, <|endoftext|> at 256"""
    os.makedirs(out, exist_ok=True)
    V = 1000
    for name in ("train", "val"):
        path = os.path.join(ROOT, "dev/data/tinyshakespeare/tiny_shakespeare_%s.bin" % name)
        write_tokens(os.path.join(out, name + ".bin"), reference.read_tokens(path) % V)
    table, eot = decode_table(os.path.join(ROOT, "dev/data/gpt2_tokenizer.bin"))
    table = table[:eot % V] + [table[eot]] + table[eot % V + 1:V]
    with open(os.path.join(out, "tokenizer.bin"), "wb") as f:
        f.write(np.array([20240328, 2, V, eot % V] + [0] * 252, dtype=np.int32).tobytes())
        f.write(b"".join(bytes([len(t)]) + t for t in table))


def data_args(cfg=REF):
    """the config's train and val tokens and its tokenizer, as trainer flags"""
    return ["-i", cfg["tokens"], "-j", cfg["val_tokens"], "-tok", cfg["tokenizer"]]


def reference_run(cfg=REF):
    if cfg["tokens"].startswith(SMALL_VOCAB):
        shared_dir(SMALL_VOCAB, small_vocabulary)
    key = (cfg["layers"], cfg["heads"], cfg["channels"], cfg["seq_len"], cfg["batch"], cfg["steps"], cfg["vocab"])
    if key not in _ref_cache:
        out = os.path.join(TMP, "reference" if cfg is REF else "reference_%d_%d_%d_%d_%d_%d_v%d" % key)
        shared_dir(out, lambda out: reference.run(type("Args", (), dict(cfg, out=out))))
        with open(os.path.join(out, "reference.json")) as f:
            _ref_cache[key] = dict(json.load(f), dir=out)
        # the comparison is only meaningful if clipping and weight decay act: check they do
        assert _ref_cache[key]["grad_norms"][0] > cfg["grad_clip"], "reference: clipping never active"
    return _ref_cache[key]


def trainer_args(ref, B, out_dir, extra=(), cfg=REF):
    total = cfg["batch"] * cfg["seq_len"]
    return ["-e", os.path.join(ref["dir"], "model.bin")] + data_args(cfg) + ["-b", B,
            "-t", cfg["seq_len"], "-d", total, "-x", cfg["steps"], "-l", cfg["lr"],
            "-u", cfg["warmup"], "-q", cfg["final_lr_frac"], "-c", cfg["weight_decay"],
            "-gc", cfg["grad_clip"], "-v", 0, "-s", 0, "-o", out_dir] + list(extra)


def check_against_reference(ref, d, grads_path, expected_bytes, formula, steps=REF["steps"]):
    """the run in d (main.log, its step-0 gradients in grads_path, its final model file) against
    the reference within the CPU's fp32 tolerances (test/comparison.py), and its communication per
    step against the formula's bytes"""
    comparison.assert_matches(comparison.compare_run(ref, d, grads_path, "cpu fp32", steps))
    # communication per step, from the comm layer's counters, equal to the formula exactly
    train, _ = read_log(d)
    for s in range(steps):
        assert train[s + 1]["comm_bytes"] == expected_bytes, "step %d moved %d bytes, expected %s = %d" % (
            s + 1, train[s + 1]["comm_bytes"], formula, expected_bytes)


def compare_with_reference(ranks, accum):
    ref = reference_run()
    B = REF["batch"] // (ranks * accum)
    d = fresh_dir("dp_np%d_accum%d" % (ranks, accum))
    grads_path = os.path.join(d, "grads.bin")
    run_ok(ranks, trainer_args(ref, B, d, ["-n", REF["steps"], "-dump_grads", grads_path]))
    # DDP all-reduces every gradient (P fp32 values) and the loss (one float), whatever the
    # number of ranks
    P = len(reference.read_model_file(os.path.join(ref["dir"], "final.bin"))[1])
    check_against_reference(ref, d, grads_path, 4 * P + 4, "4 P + 4")


def make_layout_test(ranks, accum):
    def fn():
        compare_with_reference(ranks, accum)
    fn.__name__ = "dp_vs_pytorch_%d_ranks_accum_%d" % (ranks, accum)
    return fn


for _ranks, _accum in [(1, 1), (2, 1), (4, 1), (1, 2), (2, 2), (4, 2)]:
    test(make_layout_test(_ranks, _accum))


# ---------------------------------------------------------------------------------------------
# Mixture-of-Experts and expert parallelism (train_gpt2_ep.cu) against the reference's MoE GPT-2
# (test/reference.py): REF's shape with E experts in every MLP. The router starts wider than
# GPT-2's 0.02 (std 1): routing is discrete, and an fp32 trainer picks the experts float64 picks
# only where no token's k-th and (k+1)-th scores are near a tie (an fp32 logit is off by ~1e-6).
MOE = dict(REF, router_std=1.0)
MOE_MARGIN = 1e-3  # the least gap between the k-th and (k+1)-th score (s + b) the reference may see


def moe_reference(E, k, balance="aux", cf=0.0, capacity_tokens=0):
    """the reference run of an MoE model: the first seed from 1 whose routing, at every step,
    layer and token, keeps MOE_MARGIN clear of a tie"""
    shared_dir(SMALL_VOCAB, small_vocabulary)  # MOE's tokens (reference.run reads them)
    for seed in range(1, 30):
        out = os.path.join(TMP, "moe_reference_E%d_k%d_%s_cf%g_n%d_seed%d" % (E, k, balance, cf, capacity_tokens, seed))
        args = dict(MOE, out=out, seed=seed, experts=E, topk=k, balance=balance, aux_alpha=0.01, bias_rate=1e-3,
                    capacity_factor=cf, capacity_tokens=capacity_tokens)
        shared_dir(out, lambda out: reference.run(type("Args", (), dict(args, out=out))))
        ref = comparison.read_reference(out)
        if ref["min_route_margin"] > MOE_MARGIN:
            return ref
    raise AssertionError("no seed in 1..29 routes E=%d k=%d clear of ties" % (E, k))


def moe_figures(out):
    """the trainer's per-step MoE lines: {step: (aux loss, MaxVio, dropped share)}"""
    return {int(m.group(1)): (float(m.group(2)), float(m.group(3)), float(m.group(4)) / 100) for m in re.finditer(
        r"^step (\d+) moe: aux loss ([\d.]+) \| .*\| MaxVio ([\d.]+) \| dropped ([\d.]+)%", out, re.M)}


def check_moe_figures(out, ref, steps, cf):
    """the run's MoE lines against the reference, each step: the aux loss to fp32 rounding (printed
    to 1e-6), MaxVio and the dropped share exactly (counts; printed to 5e-7 each, and their binary
    fractions round either way); with a capacity, the reference must have dropped some slots, or
    the check would not see drops"""
    figures = moe_figures(out)
    for s in range(steps):
        aux, vio, dropped = figures[s + 1]
        assert abs(aux - ref["aux_losses"][s]) <= 2e-6, "step %d aux loss %g, reference %g" % (s + 1, aux, ref["aux_losses"][s])
        assert abs(vio - ref["max_vio"][s]) <= 1e-6, "step %d MaxVio %g, reference %g" % (s + 1, vio, ref["max_vio"][s])
        assert abs(dropped - ref["dropped"][s]) <= 1e-6, "step %d dropped %g, reference %g" % (s + 1, dropped, ref["dropped"][s])
    if cf > 0:
        assert max(ref["dropped"]) > 0, "capacity %g dropped nothing: the test would not see drops" % cf


def moe_params(cfg, E):
    """(replicated, per expert) parameters of the MoE model: GPT-2's without its MLP, plus the
    routers (L E C); each expert fc (4C C + 4C) and fcproj (C 4C + C) in every layer"""
    C, L, Vp, maxT = cfg["channels"], cfg["layers"], padded_vocab(cfg), cfg["max_seq_len"]
    replicated = (Vp + maxT) * C + L * (4 * C * C + 8 * C) + 2 * C + L * E * C
    return replicated, L * (8 * C * C + 5 * C)


def compare_ep_with_reference(ranks, ep, accum, E=4, k=2, balance="aux", cf=0.0):
    cfg, steps = MOE, MOE["steps"]
    B = cfg["batch"] // (ranks * accum)
    # capacity counts a rank's micro-batch: the reference's capacity groups are those B T tokens
    ref = moe_reference(E, k, balance, cf, B * cfg["seq_len"] if cf > 0 else 0)
    d = fresh_dir("ep_np%d_ep%d_accum%d_E%d_k%d_%s_cf%g" % (ranks, ep, accum, E, k, balance, cf))
    grads = os.path.join(d, "grads.bin")
    args = trainer_args(ref, B, d, ["-n", steps, "-dump_grads", grads, "-ep", ep, "-balance", balance,
                                    "-capacity_factor", cf, "-check_replicas", 1], cfg=cfg)
    out = run_ok(ranks, args, program="./train_gpt2_ep")
    # the memory table's total: the high-water mark to the byte (dev/memory_planner's table is
    # compared in ep_collapsed_router_max_vio_drops_and_bytes: it has no -dump_grads)
    check_memory_table_total("./train_gpt2_ep", out)
    # every copy of each parameter stayed the same: the replicated ones on every rank, each
    # expert on the ranks that hold it
    assert "step %d: replicated parameters identical" % steps in out, out[-2000:]
    assert ranks == ep or "step %d: experts' copies identical" % steps in out, out[-2000:]
    # losses, gradient norms, every parameter's step-0 gradient (routers' and experts' included)
    # and the final weights, within the CPU's fp32 tolerances
    report = comparison.compare_run(ref, d, grads, "cpu fp32", steps)
    print("    cpu train_gpt2_ep: %s" % ", ".join("%s %.2e" % (c[0], c[1]) for c in report["checks"]))
    # AdamW's first moments after the last step against the reference's: the gradients as the
    # optimizer read them. The final weights alone hardly see a gradient read at a wrong scale
    # (AdamW's m / sqrt(v) cancels it, up to eps: experts' gradients read without their 1/ep
    # moved them by 7.7e-5, against 2e-5), m sees it whole. Measured: 1.0e-5 of the
    # largest at most over these cases (m sums 5 steps' gradients, each at weights that differ by
    # fp32's rounding), so 1e-4; experts' gradients read without 1/ep: 0.35 of the largest
    m, m_ref = checkpoint_moments(d, steps), reference.read_model_file(os.path.join(ref["dir"], "final_m.bin"))[1]
    err = np.abs(m - m_ref).max() / np.abs(m_ref).max()
    print("    AdamW m after step %d: max error %.2e of the largest" % (steps, err))
    assert err <= 1e-4, "AdamW m after step %d: max abs error %.3g, %.2e of the largest (limit 1e-4)" % (
        steps, np.abs(m - m_ref).max(), err)
    comparison.assert_matches(report)
    check_moe_figures(out, ref, steps, cf)  # the aux loss, MaxVio, the dropped share
    if balance == "bias":
        # the final bias (the checkpoint's trainer state) is the reference's: each step moves each
        # b_e by +-gamma or 0, so a step whose sign differs moves it by 2 gamma = 2e-3, while
        # fp32's sum of 5 such steps is off by under 1e-9 (gamma's own rounding, 5e-11 a step,
        # and the sum's, half a unit at 5e-3)
        bias, expected = checkpoint_bias(d, steps, cfg["layers"], E), np.array(ref["bias"]).reshape(-1)
        err = np.abs(bias - expected).max()
        assert err <= 1e-8, "final bias %s, reference %s (max difference %g)" % (bias.tolist(), expected.tolist(), err)
        assert np.abs(expected).max() > 0, "the reference's bias never moved: the check would not see a wrong sign"
    # the replicated parameters' all-reduce over every rank (with the loss, the L E loads, the
    # slot counts and the aux loss), each rank's experts' over the ranks that hold the same ones
    replicated, per_expert = moe_params(cfg, E)
    train, _ = read_log(d)
    for s in range(steps):
        # rank 0's all-to-all bytes, from the reference's routing: per layer and micro-batch it sends
        # its kept slots routed to experts of the other ranks of its EP group (the tokens out, and
        # their gradients in the backward), and sends back the outputs of the slots those ranks
        # routed to its own experts (and their input gradients), C floats a row each way; and the
        # counts, E/ep ints to each other rank
        if ep > 1:
            El, N = E // ep, B * cfg["seq_len"]
            out = back = 0
            for micro in range(accum):
                for layer in ref["routes"][s]:
                    for r in range(ep):  # the ranks of rank 0's EP group, their chunks of the micro-step
                        chunk = micro * ranks + r
                        slots = layer[chunk * N * k:(chunk + 1) * N * k]
                        if r == 0:
                            out += sum(1 for e in slots if e >= 0 and e // El != 0)
                        else:
                            back += sum(1 for e in slots if e >= 0 and e // El == 0)
            expected = 2 * (out + back) * cfg["channels"] * 4 + accum * cfg["layers"] * El * (ep - 1) * 4
            assert train[s + 1]["comm"]["ep"]["all_to_all"] == expected, (s + 1, train[s + 1]["comm"]["ep"], expected)
        # main.log's tokens per expert (the fewest, the mean, the most over experts and layers,
        # before drops) are the reference's loads, exactly (counts)
        loads = np.array(ref["loads"][s], dtype=float)
        assert train[s + 1]["moe"]["tokens_per_expert"] == [loads.min(), loads.mean(), loads.max()], (
            s + 1, train[s + 1]["moe"], loads.tolist())
        comm = train[s + 1]["comm"]
        expected = 4 * replicated + 4 + 4 * (cfg["layers"] * E + 2) + 4
        assert comm["world"]["all_reduce"] == expected, (comm, expected)
        assert comm["expert_dp"].get("all_reduce", 0) == (4 * per_expert * E // ep if ranks > ep else 0), comm


def checkpoint_moments(d, step):
    """AdamW's first moments m (the whole model's, in the model file's layout) in the checkpoint of
    `step` in d, a gathered state file: its header, the identity, then m, v and the extra bytes"""
    with open(os.path.join(d, "state_%08d.bin" % step), "rb") as f:
        data = f.read()
    header = np.frombuffer(data[:1024], dtype=np.int32)
    n, at = int(header[7]) | int(header[8]) << 32, 1024 + int(header[11])
    return np.frombuffer(data[at: at + 4 * n], dtype=np.float32).astype(np.float64)


def checkpoint_bias(d, step, L, E):
    """the routing bias (L E floats) of the EP trainer's checkpoint of `step` in d: the last bytes
    of its gathered state file, the trainer's own state after the moments (llmc/checkpoint.h)"""
    with open(os.path.join(d, "state_%08d.bin" % step), "rb") as f:
        data = f.read()
    header = np.frombuffer(data[:1024], dtype=np.int32)
    extra = int(header[9]) | int(header[10]) << 32  # the extra bytes: fp32 weights where kept apart, then the own state
    assert extra >= 4 * L * E and len(data) >= 1024 + extra, "state file of %d bytes, extra %d" % (len(data), extra)
    return np.frombuffer(data[len(data) - 4 * L * E:], dtype=np.float32).astype(np.float64)


def make_ep_test(ranks, ep, accum, E, k, balance, cf):
    def fn():
        compare_ep_with_reference(ranks, ep, accum, E, k, balance, cf)
    fn.__name__ = "ep_vs_pytorch_np%d_ep%d_accum%d_E%d_k%d_%s%s" % (ranks, ep, accum, E, k, balance,
                                                                    "_cf%g" % cf if cf else "")
    return fn


# (Each case's weights must have gradients fp32 resolves, as with REF4_GPT2 above: where slots
# drop (-capacity_factor 1.0 at B = 4 a rank: 10-20% of them) or 8 experts share top-2 routing,
# a weight of an expert left with few tokens gets a noise-sized gradient that AdamW turns into
# steps of lr: 1.4e-5 to 5e-5 off float64's after 5 steps, at the 2e-5 limit, while the losses,
# norms and step-0 gradients still agree to 1e-6. Another CPU's GEMM rounds that noise otherwise,
# so the cases here keep their final weights within about 1e-5, half the limit, as measured:
# 1.01e-5 at most, 3.3e-6 at least, each test printing its own)
for _case in [(1, 1, 2, 4, 2, "aux", 0.0), (2, 2, 1, 4, 2, "aux", 0.0), (4, 2, 1, 4, 2, "aux", 0.0),
              (4, 4, 1, 8, 1, "aux", 0.0), (2, 2, 2, 4, 1, "bias", 0.0), (2, 1, 1, 4, 2, "aux", 1.25),
              (2, 2, 2, 4, 2, "none", 1.0), (4, 2, 1, 4, 2, "aux", 1.25),
              # k = 1 and every balance rule at ep 4 and ep 2; capacity at ep 4, with accumulation
              (4, 4, 1, 4, 1, "bias", 0.0), (2, 2, 1, 4, 1, "none", 0.0), (4, 4, 1, 8, 1, "none", 1.25),
              (4, 4, 2, 8, 1, "aux", 1.25)]:
    test(make_ep_test(*_case))


def collapsed_moe_model(d, E, k, cfg=MOE):
    """moe_reference(E, k)'s initial model with every router weight zero, written into d: every
    token's scores tie at 0 (the path of the file)"""
    ref = moe_reference(E, k)
    header, params = reference.read_model_file(os.path.join(ref["dir"], "model.bin"))
    C, L, Vp, maxT = cfg["channels"], cfg["layers"], padded_vocab(cfg), cfg["max_seq_len"]
    router = (Vp + maxT) * C + L * (4 * C * C + 8 * C)  # wte, wpe, ln1, qkv, attproj, ln2 come first
    params = params.copy()
    params[router: router + L * E * C] = 0.0
    path = os.path.join(d, "collapsed.bin")
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(params.astype(np.float32).tobytes())
    return path


@test
def ep_collapsed_router_max_vio_drops_and_bytes():
    """a router whose weights are all zero: every score ties, so every token picks expert 0 (ties
    go to the lower index). MaxVio is then E - 1; with a capacity factor expert 0 takes
    ceil(cf N k / E) slots of each micro-batch and the rest drop; and the all-to-all moves what the
    formula says: the rank without expert 0 sends all its kept slots there and gets their outputs
    back, forward and backward (N k C floats each way), the other sends the outputs; both send the
    counts (E/ep ints) to each other rank, once a layer and micro-batch"""
    E, k, cfg = 4, 1, MOE
    d = fresh_dir("ep_collapsed")
    collapsed = collapsed_moe_model(d, E, k)
    C, L = cfg["channels"], cfg["layers"]
    B, ranks, ep = 4, 2, 2
    N = B * cfg["seq_len"]
    for cf in (0.0, 1.0):
        out_dir = os.path.join(d, "cf%g" % cf)
        out = run_ok(ranks, ["-e", collapsed] + data_args(cfg) + ["-b", B, "-t", cfg["seq_len"], "-x", 1, "-v", 0, "-s", 0,
                                                                  "-ep", ep, "-balance", "none", "-capacity_factor", cf,
                                                                  "-o", out_dir], program="./train_gpt2_ep")
        _, vio, dropped = moe_figures(out)[1]
        kept = N * k if cf == 0 else math.ceil(cf * N * k / E)
        assert vio == E - 1, "MaxVio %g, expected E - 1 = %d" % (vio, E - 1)
        assert abs(dropped - (1 - kept / (N * k))) <= 5e-7, "dropped %g, expected %g" % (dropped, 1 - kept / (N * k))
        train, _ = read_log(out_dir)
        expected = L * (2 * kept * C * 4 + (E // ep) * (ep - 1) * 4)
        assert train[1]["comm"]["ep"]["all_to_all"] == expected, (train[1]["comm"], expected)
        # the memory table, the experts' buffers sized for the worst case of this capacity, is
        # dev/memory_planner's, and the high-water mark its total
        check_planner_matches_trainer("./train_gpt2_ep", ranks, ["-e", collapsed, "-b", B, "-t", cfg["seq_len"], "-ep", ep,
                                                               "-capacity_factor", cf], out)


@test
def ep_checkpoints_resume_on_any_ep():
    """a run of 4 steps with a checkpoint at step 2, resumed: the same as the run through, bit for
    bit (-balance bias: the bias is in the checkpoint); the ep = 2 checkpoint resumed at ep = 1
    and ep = 4 (the experts regathered from the model file) ends within fp32 rounding"""
    E, k = 4, 2
    ref = moe_reference(E, k, "bias")
    flags = lambda d, extra: ["-e", os.path.join(ref["dir"], "model.bin")] + data_args(MOE) + [  # noqa: E731
        "-b", 2, "-t", MOE["seq_len"], "-d", 256, "-x", 4, "-v", 0, "-s", 0, "-balance", "bias", "-n", 2, "-o", d] + extra
    through = fresh_dir("ep_ckpt_through")
    run_ok(4, flags(through, ["-ep", 2]), program="./train_gpt2_ep")
    final = reference.read_model_file(os.path.join(through, "model_00000004.bin"))[1]
    for ranks, ep in ((4, 2), (1, 1), (4, 4)):
        d = fresh_dir("ep_ckpt_resume_np%d_ep%d" % (ranks, ep))
        for name in os.listdir(through):  # the checkpoint of step 2
            if "00000002" in name or name.startswith("DONE_00000002"):
                shutil.copy(os.path.join(through, name), d)
        run_ok(ranks, flags(d, ["-ep", ep, "-y", 1, "-b", 8 // ranks]), program="./train_gpt2_ep")
        resumed = reference.read_model_file(os.path.join(d, "model_00000004.bin"))[1]
        err = np.abs(resumed - final).max()
        if (ranks, ep) == (4, 2):
            assert err == 0, "resumed on the same layout: max difference %g, expected none" % err
        else:
            assert err <= 2e-6, "resumed at ep %d: max difference %g (fp32 rounding: 2e-6)" % (ep, err)


@test
def sanitized_ep_capacity_bias_checkpoint_sampling_and_resume():
    """the MoE trainer's routing, capacity, row moves and all-to-alls under AddressSanitizer +
    UndefinedBehaviorSanitizer: 4 ranks at ep 2 (two copies of each expert), E = 4, top-2, a
    capacity that drops, the bias rule, a checkpoint, validation, a sample (a pass of its own
    length, routed with the training capacity) and a resume from the checkpoint"""
    p = make(["sanitize"], timeout=600)
    assert p.returncode == 0, p.stdout.decode("utf-8", "replace")[-3000:]
    env = dict(ASAN_OPTIONS="detect_leaks=0")
    d = fresh_dir("sanitized_ep")
    moe = os.path.join(moe_reference(4, 2)["dir"], "model.bin")
    args = small_run_args(d, ["-e", moe, "-b", 1, "-d", 4 * 32, "-x", 2, "-s", 2, "-g", 8, "-ep", 2, "-balance", "bias",
                              "-capacity_factor", 1.0], cfg=MOE)
    for extra in ([], ["-x", 3, "-y", 1]):
        out = run_ok(4, args + extra, program="./build/sanitize/train_gpt2_ep", env=env)
        assert "AddressSanitizer" not in out and "runtime error:" not in out, out[-3000:]
    assert "resumed from step 2" in out and "---- sample at step 3 ----" in out and "val loss" in out, out[-3000:]


@test
def ep_bad_inputs():
    """every bad input of the other trainers (bad_input_cases), given to train_gpt2_ep with an MoE
    model file in place of the dense one and -experts 4 (which the descriptors need): the same
    message, a non-zero exit on every rank, no hang, no files. The one difference: the model file
    with a nan is a dense one, which train_gpt2_ep refuses first"""
    moe = os.path.join(moe_reference(4, 2)["dir"], "model.bin")
    run_bad_inputs_concurrently("./train_gpt2_ep", model=moe, extra=["-experts", 4],
                                messages={"nan_in_model_file": "is a dense GPT-2 model file"})


@test
def ep_refuses_bad_models_and_flags():
    """a dense model file, an MoE file in a dense trainer, bad -ep, -topk and -balance: a message,
    a non-zero exit on every rank, no output dir"""
    dense = os.path.join(reference_run()["dir"], "model.bin")
    moe = os.path.join(moe_reference(4, 2)["dir"], "model.bin")
    d = fresh_dir("ep_refusals")
    out_dir = os.path.join(d, "out")
    base = data_args(MOE) + ["-b", 2, "-t", 32, "-x", 1, "-v", 0, "-s", 0, "-o", out_dir]
    cases = [
        ("./train_gpt2_ep", ["-e", dense, "-experts", 4], "is a dense GPT-2 model file"),
        ("./train_gpt2_dp", ["-e", moe], "is a Mixture-of-Experts model (E=4 experts, top-k 2): train_gpt2_dp trains dense"),
        ("./train_gpt2_tp", ["-e", moe], "train it with train_gpt2_ep"),
        ("./train_gpt2_ep", ["-e", "d2", "-experts", 4, "-ep", 3], "-ep 3: expert parallelism splits the E = 4 experts"),
        ("./train_gpt2_ep", ["-e", "d2", "-experts", 4, "-topk", 5], "-topk 5: expected 1 <= k <= E = 4"),
        ("./train_gpt2_ep", ["-e", "d2", "-experts", 1], "E = 1 is the dense GPT-2"),
        ("./train_gpt2_ep", ["-e", moe, "-experts", 8], "the model file"),
        ("./train_gpt2_ep", ["-e", "d2", "-experts", 4, "-balance", "loss"], "-balance loss: expected aux, bias or none"),
    ]
    for program, args, message in cases:
        code, out = mpirun(2, base + args, timeout=60, program=program)
        assert code != 0 and message in out, "%s %s: exit %d, %r not in:\n%s" % (program, args, code, message, out[-2000:])
        assert not os.path.exists(out_dir), "%s %s left its output dir behind" % (program, args)
    # Hugging Face's GPT-2 has one MLP a layer: dev/hf_export.py refuses the MoE file, writing nothing
    p = subprocess.run([sys.executable, os.path.join(ROOT, "dev", "hf_export.py"), moe, out_dir], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode != 0 and "a Mixture-of-Experts model (E=4 experts, top-k 2)" in p.stderr, p.stderr
    assert not os.path.exists(out_dir), "hf_export left its output dir behind"


# ---------------------------------------------------------------------------------------------
# ZeRO (train_gpt2_dp.cu -z): the same reference, and the communication against the paper's
# formulas. Bucket sizes are computed here from the README's rule, independently of the trainer.


def zero_padded_parameters(cfg, ranks, zero):
    """Psi with padding: the embeddings (Vp + maxT) C, each layer 12 C^2 + 13 C and the final
    LayerNorm 2 C, each bucket padded to a multiple of ranks x 128 elements under ZeRO"""
    C, L, Vp = cfg["channels"], cfg["layers"], padded_vocab(cfg)
    pad = ranks * 128 if zero > 0 else 1
    up = lambda n: (n + pad - 1) // pad * pad
    return up((Vp + cfg["max_seq_len"]) * C) + L * up(12 * C * C + 13 * C) + up(2 * C)


def zero_step_bytes(cfg, ranks, zero, accum, X=4):
    """payload per step (README, ZeRO): DDP all-reduces X Psi and the loss; ZeRO-1 reduce-scatters
    X Psi and all-gathers X Psi, plus the loss and the norm (4 + 4); ZeRO-2 reduce-scatters every
    micro-batch's X Psi; ZeRO-3 reduce-scatters and gathers twice (forward, backward) every
    micro-batch's X Psi, and gathers nothing after the update"""
    psi = zero_padded_parameters(cfg, ranks, zero)
    if zero == 0:
        return X * psi + 4
    if zero == 3:
        return 3 * accum * X * psi + 8
    return (1 if zero == 1 else accum) * X * psi + X * psi + 8


def compare_zero_with_reference(zero, ranks, accum, overlap=1):
    cfg = REF6 if ranks == 3 else REF
    ref = reference_run(cfg)
    B = cfg["batch"] // (ranks * accum)
    d = fresh_dir("dp_z%d_np%d_accum%d_overlap%d" % (zero, ranks, accum, overlap))
    grads_path = os.path.join(d, "grads.bin")
    # (-z 3 holds no replicas to check)
    check = ["-check_replicas", 1] if zero < 3 else []
    run_ok(ranks, trainer_args(ref, B, d, ["-n", cfg["steps"], "-dump_grads", grads_path, "-z", zero,
                                           "-overlap", overlap] + check, cfg=cfg))
    expected = zero_step_bytes(cfg, ranks, zero, accum)
    check_against_reference(ref, d, grads_path, expected, "the README's ZeRO-%d formula" % zero)


def make_zero_test(zero, ranks, accum):
    def fn():
        compare_zero_with_reference(zero, ranks, accum)
    fn.__name__ = "dp_zero%d_vs_pytorch_%d_ranks_accum_%d" % (zero, ranks, accum)
    return fn


# (the default -overlap 1: collectives in flight while the rank computes)
for _zero in (1, 2, 3):
    for _ranks in (1, 2, 3, 4):
        for _accum in (1, 2):
            test(make_zero_test(_zero, _ranks, _accum))


@test
def dp_every_stage_without_overlap_vs_pytorch():
    """-overlap 0, each collective waited for at once (DDP and ZeRO-1 reduce after the backward
    pass): every stage at 3 ranks (uneven shards, REF6) with accumulation, and at 4 without"""
    for zero in (0, 1, 2, 3):
        for ranks, accum in ((3, 2), (4, 1)):
            compare_zero_with_reference(zero, ranks, accum, overlap=0)


@test
def dp_zero_ring_bytes_are_2_2_2_3_times_the_parameters_and_memory_as_predicted():
    """what each rank sends on a ring, at 4 ranks and one micro-batch: DDP's all-reduce
    2 (N-1)/N X Psi, ZeRO-1's and ZeRO-2's reduce-scatter plus all-gather (N-1)/N X Psi each,
    ZeRO-3's two all-gathers and a reduce-scatter, Psi with the padding (the 4-byte loss and norm
    all-reduces add 2 (N-1)/N x 4 each). And memory: the model states of ZeRO-3 at least 3.5x
    below DDP's (the paper: 16 Psi / N against 16 Psi), and the allocated high-water mark within
    5% of the predicted total"""
    N, share = 4, 3 / 4
    states = {}
    for zero in (0, 1, 2, 3):
        d = fresh_dir("dp_ring_z%d" % zero)
        out = run_ok(N, trainer_args(reference_run(), 2, d, ["-x", 2, "-z", zero]))
        measured = step_comm_bytes(d, 2, out)[1]["world"]
        # the formula printed at the start, the measured bytes
        printed = {k.replace("_", "-"): int(n) for k, n in re.findall(r"^  (\w+) +(\d+) bytes ", out, re.M)}
        assert printed == measured, "-z %d: start table %s, measured %s" % (zero, printed, measured)
        rings = [rec["ring_bytes"] for rec in read_log(d)[0].values()]
        psi = zero_padded_parameters(REF, N, zero)
        scalars = 2 * share * (4 if zero == 0 else 8)
        for ring in rings:
            # the printed bytes are rounded to a whole byte
            assert abs(ring - ((3 if zero == 3 else 2) * share * 4 * psi + scalars)) <= 1, \
                "-z %d: ring %d B, expected %d x %g x 4 x %d + %g" % (zero, ring, 3 if zero == 3 else 2, share, psi, scalars)
        # fp32: parameters 4 + gradients 4 + m 4 + v 4 bytes per parameter, each whole or its 1/N
        held = [psi / N if zero >= stage else psi for stage in (3, 2, 1, 1)]
        states[zero] = 4 * sum(held)
        printed = float(re.search(r"model states\s+([\d.]+) MB", out).group(1)) * 1e6
        assert abs(printed - states[zero]) <= 0.05e6, "-z %d: model states %g B printed, %g by the formula" % (zero, printed, states[zero])
        check_memory_table_total("./train_gpt2_dp", out)
    assert states[0] >= 3.5 * states[3], states


@test
def dp_zero_resume_is_bit_identical_and_refuses_another_stage():
    """each stage resumes from its sharded state files bit for bit; a checkpoint of -z 1 does not
    load at -z 2 (nor at another rank count: the state files are this layout's shards)"""
    for zero in (1, 2, 3):
        check_resume(lambda args, d: run_ok(2, args + ["-z", zero]), "dp_z%d_resume" % zero, 2)
    part = test_dir("dp_z1_resume_part")
    code, out = mpirun(2, trainer_args(reference_run(), 2, part, ["-n", 3, "-v", 2, "-m", 2, "-y", 1, "-x", 6, "-z", 2]),
                       timeout=60)
    assert code != 0 and "zero=1" in out and "zero=2" in out, out[-2000:]


def check_resume(run, name, B, cfg=REF):
    """run(args, out_dir) trains; resuming from the step-3 checkpoint must repeat steps 4-5 bit
    for bit"""
    ref = reference_run(cfg)
    full = fresh_dir(name + "_full")
    run(trainer_args(ref, B, full, ["-n", 3, "-v", 2, "-m", 2], cfg=cfg), full)
    part = fresh_dir(name + "_part")
    # the checkpoint of step 3 is what an interrupted run leaves behind
    for f in glob.glob(os.path.join(full, "*_00000003*")):
        shutil.copy(f, part)
    out = run(trainer_args(ref, B, part, ["-n", 3, "-v", 2, "-m", 2, "-y", 1], cfg=cfg), part)
    assert "resumed from step 3" in out, out[-2000:]
    train_full, val_full = read_log(full)
    train_part, val_part = read_log(part)
    for s in (4, 5):  # the log prints 9 significant digits: equal text means equal fp32
        a, b = train_full[s]["train_loss"], train_part[s]["train_loss"]
        assert a == b, "step %d: loss %r uninterrupted, %r resumed" % (s, a, b)
    assert val_full[4]["val_loss"] == val_part[4]["val_loss"]
    with open(os.path.join(full, "model_00000005.bin"), "rb") as f1, open(os.path.join(part, "model_00000005.bin"), "rb") as f2:
        assert f1.read() == f2.read(), "final model files differ after resume"


@test
def resume_is_bit_identical():
    check_resume(lambda args, d: run_ok(2, args), "resume", 2)


@test
def results_do_not_depend_on_threads():
    ref = reference_run()
    logs = []
    for threads in (1, 2):
        d = fresh_dir("threads_%d" % threads)
        run_ok(1, trainer_args(ref, 8, d, ["-x", 2]), threads=threads)
        logs.append(read_log(d)[0])
    # every reduction has a fixed order, whatever the thread count: equal to the last bit
    for s in (1, 2):
        for key in ("train_loss", "grad_norm"):
            assert logs[0][s][key] == logs[1][s][key], "step %d %s: %r with 1 thread, %r with 2" % (s, key, logs[0][s][key], logs[1][s][key])


def cpu_gemm_instruction_sets():
    """the micro-kernels (llmc/cpu/matmul.h) this CPU runs, widest first, from its flags"""
    flags = set()
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            flags = set(next((l.split(":", 1)[1].split() for l in f if l.startswith("flags")), []))
    isas = ["avx512"] if {"avx512f", "avx2", "fma"} <= flags else []
    isas += ["avx2"] if {"avx2", "fma"} <= flags else []
    return isas + ["generic"]


@test
def every_gemm_instruction_set_matches_the_reference_at_any_thread_count():
    """each micro-kernel this CPU runs (LLMC_GEMM_ISA picks one): the step-0 gradients and the
    losses against the reference within the CPU's fp32 tolerances, and the same bits at 1 and 2
    threads; a kernel the CPU lacks, or a name that is none, is refused with a message"""
    ref = reference_run()
    for isa in cpu_gemm_instruction_sets():
        logs = []
        for threads in (1, 2):
            d = fresh_dir("isa_%s_%d" % (isa, threads))
            grads_path = os.path.join(d, "grads.bin")
            run_ok(1, trainer_args(ref, 8, d, ["-n", REF["steps"], "-dump_grads", grads_path]), threads=threads,
                   env={"LLMC_GEMM_ISA": isa})
            report = comparison.compare_run(ref, d, grads_path, "cpu fp32")
            comparison.assert_matches(report)
            logs.append(read_log(d)[0])
        print("    %s: %s" % (isa, ", ".join("%s %.2e" % (c[0], c[1]) for c in report["checks"])))
        for s in logs[0]:
            assert logs[0][s]["train_loss"] == logs[1][s]["train_loss"], "%s, step %d: 1 and 2 threads differ" % (isa, s)
    for isa, message in (("sse9", "LLMC_GEMM_ISA=sse9: expected generic, avx2 or avx512"),
                         ("avx512", "LLMC_GEMM_ISA=avx512: this CPU does not run it")):
        if isa in cpu_gemm_instruction_sets():
            continue
        d = fresh_dir("isa_refused")
        code, out = mpirun(1, trainer_args(ref, 8, d, ["-x", 1]), env={"LLMC_GEMM_ISA": isa})
        assert code != 0 and message in out, out[-2000:]


@test
def model_files_bf16_and_fp32_round_trip():
    ref = reference_run()
    _, fp32 = reference.read_model_file(os.path.join(ref["dir"], "model.bin"))
    for name in ("model.bin", "model_bf16.bin"):
        d = fresh_dir("roundtrip_" + name.replace(".", "_"))
        # zero steps: the checkpoint written at the end holds the weights as loaded
        run_ok(2, ["-e", os.path.join(ref["dir"], name)] + data_args() + ["-b", 2, "-t", 32,
                   "-x", 0, "-v", 0, "-s", 0, "-n", 1, "-o", d])
        header, got = reference.read_model_file(os.path.join(d, "model_00000000.bin"))
        assert header[1] == 3, "checkpoints are written as fp32 (version 3)"
        _, want = reference.read_model_file(os.path.join(ref["dir"], name))  # bf16 widened by numpy
        assert np.array_equal(got, want), name + ": weights changed on the way through the trainer"
        if name == "model_bf16.bin":  # and bf16 is fp32 rounded to 8 bits of mantissa
            assert np.abs(got - fp32).max() <= 2.0 ** -8 * np.abs(fp32).max()


@test
def help_lists_every_flag():
    code, out = mpirun(1, ["--help"])
    assert code == 0, out
    for flag in ["-i", "-j", "-e", "-o", "-b", "-t", "-d", "-l", "-u", "-q", "-c", "-x", "-v", "-m",
                 "-s", "-g", "-n", "-y", "-gc", "-seed", "-shuffle", "-tok", "-watchdog", "-dump_grads", "-dump_logits",
                 "-check_replicas"]:
        assert "  %s " % flag in out, "--help does not list " + flag
    # each flag's allowed range is printed beside its default
    assert "-shuffle     1: shuffle the order of global batches every epoch (default: 0; allowed: 0|1)" in out, out
    # -h and -help too, on stdout (so that it pipes into less), exit 0
    for flag in ("-h", "-help"):
        p = subprocess.run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "1", "./train_gpt2_dp", flag],
                           cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT)
        assert p.returncode == 0 and "  -shuffle " in p.stdout, "%s: exit %d\n%s" % (flag, p.returncode, p.stderr)


@test
def check_replicas_confirms_identical_replicas():
    d = fresh_dir("check_replicas")
    out = run_ok(2, ["-e", "d2", "-b", 2, "-t", 32, "-x", 2, "-v", 0, "-s", 0, "-check_replicas", 1, "-o", d])
    for step in (1, 2):
        assert "step %d: replicas identical" % step in out, out[-2000:]


@test
def check_replicas_stops_diverged_replicas():
    """ranks started from different random inits (-seed differs per rank): DDP would average
    gradients of different models; the check stops every rank at its first step"""
    args = ["-e", "d2", "-b", 2, "-t", 32, "-x", 2, "-v", 0, "-s", 0, "-check_replicas", 1]
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "1", "./train_gpt2_dp"] + [str(a) for a in args + ["-seed", 1]] + \
          [":", "-np", "1", "./train_gpt2_dp"] + [str(a) for a in args + ["-seed", 2]]
    p = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=60)
    out = p.stdout.decode("utf-8", "replace")
    assert p.returncode != 0 and "step 1: the replicas differ" in out, out[-2000:]


@test
def sampling_and_validation_run():
    d = fresh_dir("sample")
    out = run_ok(2, ["-e", "d2", "-b", 2, "-t", 32, "-x", 2, "-v", 1, "-m", 2, "-s", 2, "-g", 16, "-o", d])
    assert "---- sample at step 2 ----" in out and "val loss" in out, out[-2000:]
    _, val = read_log(d)
    assert sorted(val) == [0, 1, 2], "validation at steps 0, 1, 2: got %s" % sorted(val)
    # a random init predicts roughly uniformly over 50257 tokens: loss near ln(50257) = 10.82
    assert abs(val[0]["val_loss"] - np.log(50257)) < 0.2, val[0]


# ---------------------------------------------------------------------------------------------
# bad input: a clear message, a non-zero exit on every rank, no hang, no partial files


def write_file(path, header, body=b""):
    with open(path, "wb") as f:
        f.write(np.array(header + [0] * (256 - len(header)), dtype=np.int32).tobytes())
        f.write(body)


def bad_input_cases():
    ref = reference_run()
    d = fresh_dir("bad_inputs")
    model = os.path.join(ref["dir"], "model.bin")
    with open(model, "rb") as f:
        model_bytes = f.read()
    files = {
        "truncated_model": model_bytes[: len(model_bytes) // 2],
        "bad_magic_model": np.array([1234], dtype=np.int32).tobytes() + model_bytes[4:],
        "bad_version_model": model_bytes[:4] + np.array([7], dtype=np.int32).tobytes() + model_bytes[8:],
    }
    nan_model = bytearray(model_bytes)  # one nan in the 6th qkvw weight
    header, params = reference.read_model_file(model)
    V, C, maxT, L = header[7], header[6], header[2], header[4]
    qkvw = (V + maxT) * C + 2 * L * C  # wte, wpe, ln1w, ln1b come first
    nan_model[1024 + 4 * (qkvw + 5): 1024 + 4 * (qkvw + 6)] = np.array([np.nan], np.float32).tobytes()
    files["nan_model"] = bytes(nan_model)
    for name, data in files.items():
        with open(os.path.join(d, name + ".bin"), "wb") as f:
            f.write(data)
    write_file(os.path.join(d, "truncated_tokens.bin"), [20240520, 1, 100000], np.zeros(1000, np.uint16).tobytes())
    write_file(os.path.join(d, "bad_magic_tokens.bin"), [42, 1, 1000], np.zeros(1000, np.uint16).tobytes())
    write_file(os.path.join(d, "big_token.bin"), [20240520, 1, 1000], np.full(1000, 60000, np.uint16).tobytes())
    os.makedirs(os.path.join(d, "empty_out"))  # (an output dir with no checkpoint in it)
    base = ["-e", model] + data_args() + ["-b", 2, "-t", 32, "-x", 2, "-v", 0, "-s", 0]
    j = lambda n: os.path.join(d, n)  # noqa: E731
    return d, [
        ("missing_train_file", base + ["-i", j("nope.bin")], "nope.bin"),
        ("truncated_token_file", base + ["-i", j("truncated_tokens.bin")], "truncated"),
        ("wrong_token_magic", base + ["-i", j("bad_magic_tokens.bin")], "magic number 42"),
        ("token_outside_vocab", base + ["-i", j("big_token.bin")], "outside the model's vocabulary"),
        ("missing_model_file", base + ["-e", j("nope_model.bin")], "nope_model.bin"),
        ("not_a_descriptor", base + ["-e", "d0"], "-e 'd0' is neither a model file nor a descriptor"),
        ("truncated_model_file", base + ["-e", j("truncated_model.bin")], "truncated"),
        ("wrong_model_magic", base + ["-e", j("bad_magic_model.bin")], "magic number 1234"),
        ("wrong_model_version", base + ["-e", j("bad_version_model.bin")], "version 7"),
        ("batch_does_not_divide", base + ["-d", 1000], "-d 1000 must be a positive multiple"),
        ("sequence_too_long", base + ["-t", 128], "-t 128 is longer"),
        ("unknown_flag", base + ["-zz", 3], "unknown flag '-zz'"),
        ("flag_without_value", base + ["-x"], "flag '-x' needs a value"),
        ("not_a_number", base + ["-l", "fast"], "expects a number"),
        ("resume_without_checkpoint", base + ["-y", 1, "-o", j("empty_out")], "no complete checkpoint"),
        ("resume_from_a_missing_dir", base + ["-y", 1, "-o", j("missing_out")], "-y 1: the output dir '%s' does not "
         "exist, so there is no checkpoint to resume from" % j("missing_out")),
        # non-finite numbers would train on silently: every float flag must be finite
        ("lr_nan", base + ["-l", "nan"], "flag '-l' is nan: expected a finite number"),
        ("lr_inf", base + ["-l", "inf"], "flag '-l' is inf: expected a finite number"),
        ("final_lr_nan", base + ["-q", "nan"], "flag '-q' is nan: expected a finite number"),
        ("weight_decay_nan", base + ["-c", "nan"], "flag '-c' is nan: expected a finite number"),
        ("clip_nan", base + ["-gc", "nan"], "flag '-gc' is nan: expected a finite number"),
        ("nan_in_model_file", base + ["-e", j("nan_model.bin")], "parameter qkvw[5] is nan"),
        # integers past INT_MAX are reported, not wrapped (4294967298 would be 2)
        ("batch_wraps", base + ["-b", 4294967298], "flag '-b' is 4294967298, which does not fit a 32-bit int"),
        ("steps_wrap", base + ["-x", 4294967297], "flag '-x' is 4294967297, which does not fit a 32-bit int"),
        # B*T*ranks = 2^33 overflowed int and divided by zero
        ("batch_tokens_overflow_int", base + ["-e", "d2", "-b", 4194304, "-t", 1024, "-d", 64],
         "-d 64 must be a positive multiple of B*T*ranks = 4194304*1024*2 = 8589934592"),
        ("negative_gen_tokens", base + ["-g", -5], "flag '-g' is -5, outside its allowed range >= 1"),
        ("negative_steps", base + ["-x", -5], "flag '-x' is -5, outside its allowed range >= -1"),
        ("negative_clip", base + ["-gc", -1], "flag '-gc' is -1, outside its allowed range >= 0"),
        ("shuffle_not_0_or_1", base + ["-shuffle", 2], "flag '-shuffle' is 2, outside its allowed range 0|1"),
        ("negative_lr", base + ["-l", -1], "flag '-l' is -1, outside its allowed range >= 0"),
        ("lr_underflows", base + ["-l", "1e-50"], "flag '-l' is 1e-50: expected a finite number that fits a float"),
        # a batch this machine cannot hold: a message before allocating, not the OOM killer
        ("batch_exceeds_memory", base + ["-e", "d4", "-b", 1000000, "-t", 1024], "not enough memory"),  # ~500 TB
    ]


def run_bad_inputs_concurrently(program, env=None, messages={}, model=None, extra=()):
    """every bad-input case through program, three jobs at a time (each is mostly mpirun's
    start-up, not work): the message, a non-zero exit, and, once all are done, no new files.
    messages: the cases whose message differs for this program; model: a model file in place of
    the reference's (MoE: train_gpt2_ep's), extra: flags added to every case. Returns [(name, output)]."""
    d, cases = bad_input_cases()
    before = set(os.listdir(d))
    if model:
        dense = os.path.join(reference_run()["dir"], "model.bin")
        cases = [(name, list(extra) + [model if a == dense else a for a in args], message) for name, args, message in cases]

    def one(case):
        name, args, message = case
        code, out = mpirun(2, args, timeout=60, program=program, env=env)
        message = messages.get(name, message)
        assert code != 0 and message in out, "%s: exit %d, message %r not in:\n%s" % (name, code, message, out[-2000:])
        return name, out
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        results = list(pool.map(one, cases))
    left = set(os.listdir(d)) - before
    assert not left, "bad inputs left files behind: %s" % left
    return results


@test
def bad_inputs():
    """each case of bad_input_cases: its message, a non-zero exit on every rank, no hang (60 s),
    no files left behind"""
    run_bad_inputs_concurrently("./train_gpt2_dp")
    # the DP trainer's own flags
    d, _ = bad_input_cases()
    base = ["-e", "d2", "-i", REF["tokens"], "-b", 2, "-t", 32, "-x", 2, "-v", 0, "-s", 0, "-o", os.path.join(d, "dp_flags")]
    # the files a test asks for (-dump_grads, -dump_logits), refused before any work when the path
    # is no file to write: the rename that ends a write would replace a directory, a pipe (or a
    # device: as root, /dev/full once became a regular file) or a symbolic link
    os.makedirs(os.path.join(d, "a_directory"), exist_ok=True)
    pipe, link = os.path.join(d, "a_pipe"), os.path.join(d, "a_link.bin")
    if not os.path.exists(pipe):
        os.mkfifo(pipe)
    if not os.path.lexists(link):
        os.symlink(os.path.join(d, "target.bin"), link)
    for args, message in ((["-z", 3, "-check_replicas", 1], "there are no replicas to compare"),
                          (["-z", 4], "flag '-z' is 4, outside its allowed range 0|1|2|3"),
                          (["-overlap", 2], "flag '-overlap' is 2, outside its allowed range 0|1"),
                          (["-dump_grads", os.path.join(d, "a_directory")], "which is a directory: give the path of a file"),
                          (["-dump_grads", pipe], "which is a device, pipe or socket"),
                          (["-dump_logits", link], "which is a symbolic link"),
                          (["-dump_grads", os.path.join(d, "missing_dir", "g.bin")], "its directory '%s' does not exist"
                           % os.path.join(d, "missing_dir"))):
        code, out = mpirun(2, base + args, timeout=60)
        assert code != 0 and message in out, "%s: exit %d, %r not in:\n%s" % (args, code, message, out[-2000:])
        assert not os.path.exists(os.path.join(d, "dp_flags")), "%s left its output dir behind" % args
    assert stat.S_ISFIFO(os.lstat(pipe).st_mode) and os.path.islink(link) and not os.path.exists(link + ".tmp")


@test
def a_failed_write_removes_its_temporary_file():
    """a checkpoint written to a full disk (a 20 MB tmpfs, where a d4 model file does not fit): the
    error names the file and the reason, every rank ends, and the half-written model_*.bin.tmp is
    gone, so that the disk is not left full (the final name never held it)"""
    d = fresh_dir("full_disk")
    disk = os.path.join(d, "disk")
    os.makedirs(disk)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=20M", "tmpfs", disk], capture_output=True).returncode != 0:
        raise Skip("cannot mount a small tmpfs here (needs root, outside a restricted container)")
    try:
        out_dir = os.path.join(disk, "run")
        code, out = mpirun(2, ["-e", "d4", "-i", REF["tokens"], "-b", 2, "-t", 32, "-x", 2, "-n", 1, "-v", 0, "-s", 0,
                               "-o", out_dir], timeout=120)
        assert code != 0 and "model_00000001.bin.tmp' failed: No space left on device" in out, out[-2000:]
        left = [f for f in os.listdir(out_dir) if f.endswith(".tmp")]
        assert not left, "temporary files left on the full disk: %s" % left
    finally:
        subprocess.run(["umount", disk], capture_output=True)


def check_one_rank_failing(name, program, env=None):
    """rank 1 gets a missing file while rank 0 goes on to the first all-reduce: the job must end
    with an error instead of rank 0 waiting forever"""
    ref = reference_run()
    d = fresh_dir(name)
    good = trainer_args(ref, 4, d)
    bad = trainer_args(ref, 4, d, ["-i", os.path.join(d, "missing.bin")])
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "1", program] + [str(a) for a in good] + \
          [":", "-np", "1", program] + [str(a) for a in bad]
    try:
        p = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1", **(env or {})),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    except subprocess.TimeoutExpired:
        raise AssertionError("the job hung after one rank's error")
    out = p.stdout.decode("utf-8", "replace")
    assert p.returncode != 0 and "[rank 1] error" in out and "missing.bin" in out, out[-2000:]


@test
def one_rank_failing_stops_all_ranks():
    check_one_rank_failing("one_rank_fails", "./train_gpt2_dp")


# ---------------------------------------------------------------------------------------------
# reliability: what a failure leaves on disk, checkpoints of one run only, resume equal to an
# uninterrupted run. Every job below runs at 2 ranks with a watchdog and a time limit.

WATCHDOG = ["-watchdog", 30]  # seconds without progress before a rank ends the job


def small_run_args(d, extra=(), cfg=REF):
    """the reference model, 2 ranks x B=2 x T=32, a checkpoint every 2 steps"""
    ref = reference_run(cfg)
    return ["-e", os.path.join(ref["dir"], "model.bin")] + data_args(cfg) + ["-b", 2, "-t", 32,
            "-x", 4, "-n", 2, "-v", 2, "-m", 2, "-s", 0, "-o", d] + WATCHDOG + list(extra)


def dir_snapshot(d):
    """name -> bytes of every file in d (LOCK aside: its text names the last holder)"""
    snap = {}
    for name in sorted(os.listdir(d)):
        if name != "LOCK":
            with open(os.path.join(d, name), "rb") as f:
                snap[name] = f.read()
    return snap


def check_log(d, train_steps, val_steps):
    """main.log is valid JSON, one line per entry, each step logged once"""
    train, val = [], []
    with open(os.path.join(d, "main.log")) as f:
        for line in f:
            rec = json.loads(line)  # a bare nan or a torn line fails here
            (train if "train_loss" in rec else val).append(rec["step"])
    assert train == list(train_steps), "main.log train steps %s, expected %s" % (train, list(train_steps))
    assert val == list(val_steps), "main.log val steps %s, expected %s" % (val, list(val_steps))


def expect_stop(args, message, d=None, timeout=60, program="./train_gpt2_dp"):
    """the job ends non-zero within the time limit with message; d (if given) is left as it was"""
    before = dir_snapshot(d) if d else None
    code, out = mpirun(2, args, timeout=timeout, program=program)
    assert code != 0, "exit code 0\n" + out[-2000:]
    assert message in out, "message %r not in output:\n%s" % (message, out[-3000:])
    if d:
        after = dir_snapshot(d)
        assert after == before, "the failed job changed %s" % sorted(
            n for n in set(after) | set(before) if after.get(n) != before.get(n))
    return out


def finished_run(name):
    """a complete 4-step run with checkpoints at steps 2 and 4"""
    d = fresh_dir(name)
    run_ok(2, small_run_args(d))
    return d


@test
def reliability_nonfinite_loss_stops_before_writing_the_step():
    check_nonfinite_stops("./train_gpt2_dp")


def check_nonfinite_stops(program):
    """-l 1e30 makes the weights ~1e30 after step 1; step 2's loss is not finite. Every rank stops
    before step 2 updates, logs or checkpoints anything; checkpoint 1 stays whole."""
    d = fresh_dir("nonfinite_loss")
    out = expect_stop(small_run_args(d, ["-l", 1e30, "-n", 1, "-v", 0]), "step 2: the ", program=program)
    assert "stopping before the update" in out, out[-2000:]
    done = sorted(f for f in os.listdir(d) if f.startswith("DONE_"))
    assert done == ["DONE_00000001"], done
    check_log(d, [1], [])
    # the checkpoint of step 1 is complete and loads (its checksums hold)
    run_ok(2, small_run_args(d, ["-l", 1e30, "-n", 1, "-v", 0, "-x", 1, "-y", 1]), program=program)
    # weights that overflow in an update whose loss and norm were finite (lr 3.4e38 and decay 1
    # scale them by -3.4e38): the checkpoint of that step is refused, no DONE_1
    d = fresh_dir("nonfinite_weights")
    expect_stop(small_run_args(d, ["-l", 3.4e38, "-c", 1, "-gc", 0, "-n", 1, "-v", 0]),
                "the weights after step 1 (not checkpointed): parameter", program=program)
    assert not [f for f in os.listdir(d) if f.startswith(("DONE_", "model_", "state_"))], os.listdir(d)
    check_log(d, [1], [])


@test
def reliability_resume_refuses_another_runs_checkpoint():
    d = finished_run("other_run")
    expect_stop(small_run_args(d, ["-x", 6, "-l", 2e-3, "-y", 1]),
                "belongs to another run: -l: 0.000300000014 in the checkpoint, 0.00200000009 now", d)
    # a fresh run (no -y) into a dir with checkpoints would mix two runs' files: refused
    out = expect_stop(small_run_args(d, ["-x", 6]), "already holds checkpoints", d)
    assert "-y 1" in out and "remove them or choose another -o" in out, out[-2000:]


@test
def reliability_resume_names_the_rank_count_of_the_checkpoint():
    """a 2-rank checkpoint resumed by 1 or 3 ranks: every rank stops, naming both counts, not a
    missing file (rank 2 of 3 has no state file of its own), and nothing in the run changes"""
    d = finished_run("rank_count")
    for ranks in (1, 3):
        before = dir_snapshot(d)
        code, out = mpirun(ranks, small_run_args(d, ["-x", 6, "-y", 1]), timeout=60)
        assert code != 0, "exit code 0\n" + out[-2000:]
        want = "was written by a job of 2 ranks, this job has %d" % ranks
        assert want in out and "resume with 2 ranks" in out, "%d ranks: %r not in\n%s" % (ranks, want, out[-3000:])
        assert "cannot open file" not in out, out[-3000:]
        assert dir_snapshot(d) == before, "the failed %d-rank job changed the run's files" % ranks


@test
def reliability_resume_refuses_a_steps_below_the_checkpoint():
    d = finished_run("steps_below")
    expect_stop(small_run_args(d, ["-x", 3, "-y", 1]), "already at step 4, so there is nothing to train", d)


@test
def reliability_ranks_agree_on_the_resume_step():
    """rank 1's state file of step 2 replaced by its file of step 4 (DONE_4 removed, so step 2 is
    the newest checkpoint): every rank stops, and main.log, which holds steps past 2, is not cut"""
    d = finished_run("ranks_disagree")
    os.remove(os.path.join(d, "DONE_00000004"))
    shutil.copy(os.path.join(d, "state_00000004_00001.bin"), os.path.join(d, "state_00000002_00001.bin"))
    expect_stop(small_run_args(d, ["-x", 6, "-y", 1]),
                "holds step 4 of rank 1, expected step 2 of rank 1", d)


def corrupt(path, how):
    with open(path, "r+b") as f:
        data = bytearray(f.read())
        if how == "flip":
            data[len(data) // 2] ^= 0x10  # one bit of one byte in the middle
        else:
            data += b"\0" * 4  # bytes appended
        f.seek(0)
        f.write(data)


def make_corruption_test(kind, how, message):
    def fn():
        d = finished_run("corrupt_%s_%s" % (kind, how))
        name = "model_00000004.bin" if kind == "model" else "state_00000004_00001.bin"
        corrupt(os.path.join(d, name), how)
        expect_stop(small_run_args(d, ["-x", 6, "-y", 1]), message, d)
    fn.__name__ = "reliability_%s_file_%s_is_refused" % (kind, "bit_flip" if how == "flip" else "trailing_bytes")
    return fn


test(make_corruption_test("model", "flip", "is corrupt: its CRC-32 is"))
test(make_corruption_test("state", "flip", "is corrupt: its CRC-32 is"))
test(make_corruption_test("state", "append", "is corrupt: its CRC-32 is"))
test(make_corruption_test("model", "append", "truncated or corrupt"))


@test
def reliability_a_run_stopped_before_its_first_step_leaves_no_output_dir():
    """an error found after rank 0 claimed -o removes what the claim made: the dirs mkdir created
    (and only those: not one a '..' in the path passes through), LOCK and the empty main.log; a
    dir that was there stays, and so does an earlier run's log in it. The errors: an allocation
    that fails (one process, fail(); the memory check before it passes, the address space is cut
    to 1.5 GB), and -tp_timeline past the last step, which every rank finds once the run's steps
    are known (check_every_rank)"""
    import resource
    d = fresh_dir("unclaim")
    os.makedirs(os.path.join(d, "there"))

    def cut_address_space():
        resource.setrlimit(resource.RLIMIT_AS, (1500 << 20, 1500 << 20))

    def alloc_fails(out_dir):
        p = subprocess.run(["./train_gpt2_dp", "-e", "d2", "-b", "64", "-t", "1024", "-x", "1", "-v", "0", "-s", "0", "-o", out_dir],
                           cwd=ROOT, capture_output=True, text=True, timeout=120, preexec_fn=cut_address_space,
                           env=dict(os.environ, OMP_NUM_THREADS="1"))
        assert p.returncode == 1 and "failed" in p.stderr, p.stdout[-1000:] + p.stderr[-1000:]

    def timeline_past_the_end(out_dir):
        code, out = mpirun(2, ["-e", "d2", "-b", 2, "-t", 32, "-x", 2, "-tp_timeline", 5, "-o", out_dir], program=TP)
        assert code == 1 and "-tp_timeline 5: past the run's last step" in out, out[-2000:]

    for fails in (alloc_fails, timeline_past_the_end):
        for out_dir in ("made/deeper", "made/deeper/", "made/../there/new"):
            fails(os.path.join(d, out_dir))
            assert sorted(os.listdir(d)) == ["there"] and os.listdir(os.path.join(d, "there")) == [], (
                fails.__name__, out_dir, os.listdir(d), os.listdir(os.path.join(d, "there")))
        fails(d)  # (a dir that was there: it stays, emptied of what the claim put in it)
        assert sorted(os.listdir(d)) == ["there"], (fails.__name__, os.listdir(d))
    run_ok(1, ["-e", "d2", "-b", 2, "-t", 32, "-x", 1, "-v", 0, "-s", 0, "-o", d])
    log = open(os.path.join(d, "main.log")).read()
    timeline_past_the_end(d)
    assert open(os.path.join(d, "main.log")).read() == log


@test
def reliability_second_job_on_one_output_dir_stops():
    d = fresh_dir("two_jobs")
    args = small_run_args(d, ["-x", 300, "-n", 100, "-v", 100])
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", "./train_gpt2_dp"] + [str(a) for a in args]
    first = subprocess.Popen(cmd, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    pids = {}
    try:
        lock = os.path.join(d, "LOCK")
        for _ in range(600):  # the first job holds the lock once its LOCK names it
            if os.path.exists(lock) and os.path.getsize(lock) > 0:
                break
            time.sleep(0.05)
        # paused while the second job tries (a step takes milliseconds: it could end first)
        pids = rank_pids(first.pid)
        assert len(pids) == 2 and first.poll() is None, "the first job ended before the second started"
        for pid in pids.values():
            os.kill(pid, signal.SIGSTOP)
        code, out = mpirun(2, args, timeout=60)
        for pid in pids.values():
            os.kill(pid, signal.SIGCONT)
        assert code != 0 and "is in use by another job (pid" in out, out[-2000:]
        first_out = first.communicate(timeout=TIMEOUT)[0].decode("utf-8", "replace")
    finally:
        for pid in pids.values():  # (a stopped process ignores everything but SIGKILL)
            try:
                os.kill(pid, signal.SIGCONT)
            except OSError:
                pass
        first.kill()
    assert first.returncode == 0, first_out[-2000:]
    check_log(d, range(1, 301), [0, 100, 200, 300])
    # the first job's checkpoints are whole: resuming the last one finds nothing to redo
    run_ok(2, args + ["-y", 1])


@test
def reliability_full_disk_on_main_log_stops_the_run():
    if not os.path.exists("/dev/full"):
        raise Skip("no /dev/full")
    d = fresh_dir("disk_full")
    os.symlink("/dev/full", os.path.join(d, "main.log"))  # every write to it fails with ENOSPC
    out = expect_stop(small_run_args(d, ["-n", 0]), "writing the log '%s/main.log' failed: No space left on device" % d)
    assert "step    2/4" not in out, "the run went on after the failed write:\n" + out[-2000:]


def write_tokens(path, tokens):
    write_file(path, [20240520, 1, len(tokens)], np.asarray(tokens, np.uint16).tobytes())


def check_sampling_with_small_vocabulary(program="./train_gpt2_dp", env=None):
    """a model with V = 128 cannot embed the GPT-2 end-of-text token 50256 that samples start
    from: samples are off with a warning, never an out-of-bounds read"""
    d = fresh_dir("small_vocab")
    rng = np.random.default_rng(0)
    L, NH, C, V, maxT = 1, 2, 32, 128, 32
    sizes = [V * C, maxT * C, L * C, L * C, L * 3 * C * C, L * 3 * C, L * C * C, L * C, L * C, L * C,
             L * 4 * C * C, L * 4 * C, L * C * 4 * C, L * C, C, C]
    params = (rng.standard_normal(sum(sizes)) * 0.02).astype(np.float32)
    write_file(os.path.join(d, "v128.bin"), [20240326, 3, maxT, V, L, NH, C, V], params.tobytes())
    write_tokens(os.path.join(d, "tokens.bin"), rng.integers(0, V, 4000))
    out = run_ok(2, ["-e", os.path.join(d, "v128.bin"), "-i", os.path.join(d, "tokens.bin"),
                     "-j", os.path.join(d, "tokens.bin"), "-b", 2, "-t", 16, "-x", 2, "-v", 1, "-m", 1,
                     "-s", 1, "-g", 8] + WATCHDOG, program=program, env=env)
    assert "end-of-text id 50256 is outside the model's vocabulary of 128" in out, out[-2000:]
    assert "---- sample" not in out, out[-2000:]
    return out


@test
def reliability_sampling_with_a_vocabulary_below_the_tokenizers():
    check_sampling_with_small_vocabulary()


def rank_pids(mpirun_pid):
    """{rank: pid} of the processes mpirun started (its children, by OMPI_COMM_WORLD_RANK)"""
    pids = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % pid) as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != mpirun_pid:
                continue
            with open("/proc/%s/environ" % pid, "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
            if b"OMPI_COMM_WORLD_RANK" in env:
                pids[int(env[b"OMPI_COMM_WORLD_RANK"])] = int(pid)
        except (OSError, ValueError, IndexError):
            continue
    return pids


@test
def reliability_stopped_peer_ends_the_job_through_the_watchdog():
    """SIGSTOP on rank 1 mid-run: rank 0 waits in a collective until its watchdog (5 s) ends the
    job, naming the rank and the operation"""
    d = fresh_dir("stopped_peer")
    args = small_run_args(d, ["-x", 1000, "-n", 0, "-v", 0, "-watchdog", 5])
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", "./train_gpt2_dp"] + [str(a) for a in args]
    job = subprocess.Popen(cmd, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    pids = {}
    try:
        log = os.path.join(d, "main.log")
        for _ in range(600):  # wait for the first step to be logged
            if os.path.exists(log) and os.path.getsize(log) > 0:
                break
            time.sleep(0.05)
        pids = rank_pids(job.pid)
        assert 1 in pids, "rank 1's process not found among mpirun's children: %s" % pids
        assert job.poll() is None, "the job ended before its peer was stopped"
        os.kill(pids[1], signal.SIGSTOP)
        t0 = time.time()
        out = job.communicate(timeout=60)[0].decode("utf-8", "replace")
        waited = time.time() - t0
    finally:
        for pid in pids.values():  # a stopped process ignores everything but SIGKILL
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        job.kill()
    assert job.returncode != 0, out[-2000:]
    assert "[rank 0] error: watchdog: no progress for" in out and "waiting in" in out, out[-2000:]
    assert waited < 30, "the job took %.0f s to end after its peer stopped" % waited


@test
def reliability_gradient_norm_sums_are_exact():
    """the CPU norm keeps its per-lane sums in double: the result is the float nearest the exact
    sum of squares (math.fsum), whatever the values; float lane sums were off by up to 1e-5"""
    d = fresh_dir("norm")
    rng = np.random.default_rng(7)
    for name, x in [("uniform", rng.uniform(0, 1, 1 << 22)), ("normal", rng.normal(0, 1e-3, 1 << 22)),
                    ("constant", np.full(1 << 22, 0.1))]:
        path = os.path.join(d, name + ".f32")
        x = x.astype(np.float32)
        x.tofile(path)
        exact = math.fsum((x.astype(np.float64) ** 2).tolist())  # squares of floats are exact in double
        out = subprocess.run(["./test/test_norm", path], cwd=ROOT, stdout=subprocess.PIPE, check=True).stdout.decode()
        got = float(out.split()[-1])
        # rounding the double total to float: at most 2^-24 = 5.96e-8 relative
        assert abs(got - exact) <= 6e-8 * exact, "%s: %r, exact %r (%.2g relative)" % (name, got, exact, (got - exact) / exact)


def samples_by_step(out):
    return dict((int(k), v) for k, v in re.findall(r"---- sample at step (\d+) ----\n(.*?)\n----------------", out, re.S))


# (memory_peak too: a resumed run's allocations so far include reading its checkpoint, not the
# steps before it, so the two high-water marks may differ by a buffer)
TIMING = ("ms", "recompute_ms", "tokens_per_s", "mfu_percent", "comm_ms", "exposed_ms", "memory_peak")


def log_without_timing(d):
    """main.log's records without the timings (and the memory high-water mark so far), the only
    fields a resume may change"""
    with open(os.path.join(d, "main.log")) as f:
        return [{k: v for k, v in json.loads(line).items() if k not in TIMING} for line in f]


def check_resumed_equals_full(full_dir, full_out, part_dir, part_out, from_step, last_step):
    assert log_without_timing(part_dir) == log_without_timing(full_dir), "main.log after resume from %d differs" % from_step
    # a resumed run samples at its first step again when the uninterrupted run did: from the
    # same weights and rng state, so the same text
    full_samples, part_samples = samples_by_step(full_out), samples_by_step(part_out)
    later = dict((k, v) for k, v in full_samples.items() if k >= from_step)
    assert [k for k in later if k > from_step], "no sample after step %d to compare" % from_step
    assert part_samples == later, \
        "samples after resuming from step %d: %s, uninterrupted %s" % (from_step, part_samples, later)
    final = "model_%08d.bin" % last_step
    with open(os.path.join(full_dir, final), "rb") as a, open(os.path.join(part_dir, final), "rb") as b:
        assert a.read() == b.read(), "final weights differ after resuming from step %d" % from_step


@test
def reliability_kill_during_checkpoint_write_then_resume_is_bit_identical():
    """SIGKILL to the whole job while a checkpoint file is being written (a .tmp file exists),
    resume: losses, samples and final weights equal the uninterrupted run's, bit for bit"""
    args = ["-e", "d2", "-b", 2, "-t", 32, "-x", 8, "-n", 1, "-v", 2, "-m", 2, "-s", 2, "-g", 8] + WATCHDOG
    full = fresh_dir("kill_full")
    full_out = run_ok(2, args + ["-o", full])
    part = fresh_dir("kill_part")
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", "./train_gpt2_dp"] + [str(a) for a in args + ["-o", part]]
    job = subprocess.Popen(cmd, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    killed_in, pids = None, {}
    try:
        while job.poll() is None and killed_in is None:
            names = os.listdir(part)
            tmp = [n for n in names if n.endswith(".tmp")]
            if len(pids) < 2:
                pids = rank_pids(job.pid)
            elif tmp and "DONE_00000002" in names:  # past a few complete checkpoints, mid-write
                for pid in pids.values():  # every rank at once, as a power cut would
                    os.kill(pid, signal.SIGKILL)
                killed_in = tmp[0]
            time.sleep(0.001)
    finally:
        for pid in pids.values():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        job.kill()
        job.wait()
    assert killed_in, "the job ended before a checkpoint write could be interrupted"
    step = int(re.search(r"_(\d{8})", killed_in).group(1))
    assert "DONE_%08d" % step not in os.listdir(part), "DONE written while %s was still being written" % killed_in
    resume_from = max(int(n[5:]) for n in os.listdir(part) if n.startswith("DONE_"))
    part_out = run_ok(2, args + ["-o", part, "-y", 1])
    assert "resumed from step %d" % resume_from in part_out, part_out[-2000:]
    check_resumed_equals_full(full, full_out, part, part_out, resume_from, 8)


@test
def reliability_resume_from_every_checkpoint_with_accumulation_shuffle_and_epochs():
    """a train file of 3 global batches, 7 steps: the order is reshuffled at steps 3 and 6. From
    each checkpoint (the full run's log, entries past it included, copied in) the resumed run
    must finish exactly as the uninterrupted one"""
    ref = reference_run()
    d = fresh_dir("resume_every")
    tokens = os.path.join(d, "tokens.bin")
    write_tokens(tokens, reference.read_tokens(REF["tokens"])[: 3 * 256 + 1])  # 3 batches of 2x2x2x32
    args = ["-e", os.path.join(ref["dir"], "model.bin")] + data_args() + ["-i", tokens, "-b", 2, "-t", 32, "-d", 256,
            "-x", 7, "-n", 1, "-v", 2, "-m", 1, "-s", 2, "-g", 8, "-shuffle", 1, "-q", 0.1, "-u", 2] + WATCHDOG
    full = os.path.join(d, "full")
    full_out = run_ok(2, args + ["-o", full])
    for k in range(1, 7):
        part = os.path.join(d, "from_%d" % k)
        os.makedirs(part)
        for f in glob.glob(os.path.join(full, "*_%08d*" % k)) + [os.path.join(full, "main.log")]:
            shutil.copy(f, part)
        part_out = run_ok(2, args + ["-o", part, "-y", 1])
        check_resumed_equals_full(full, full_out, part, part_out, k, 7)


@test
def reliability_longer_run_from_a_finished_one_equals_an_uninterrupted_one():
    """a finished 5-step run validated and sampled at step 5 because it was its last; resumed with
    -x 8 (constant learning rate, so the same trajectory) it must equal a plain 8-step run: no
    validation at 5 in the log, the same samples at 6 and 8, the same weights"""
    args = ["-s", 2, "-g", 8, "-n", 2]
    full = fresh_dir("extend_full")
    full_out = run_ok(2, small_run_args(full, args + ["-x", 8]))
    part = fresh_dir("extend_part")
    run_ok(2, small_run_args(part, args + ["-x", 5]))
    part_out = run_ok(2, small_run_args(part, args + ["-x", 8, "-y", 1]))
    check_resumed_equals_full(full, full_out, part, part_out, 5, 8)


@test
def sanitized_bad_inputs_and_small_vocabulary():
    """the bad-input cases once more, under AddressSanitizer + UndefinedBehaviorSanitizer
    (make sanitize): each must stop with its message and no sanitizer report"""
    p = make(["sanitize"], timeout=600)
    assert p.returncode == 0, p.stdout.decode("utf-8", "replace")[-3000:]
    env = dict(ASAN_OPTIONS="detect_leaks=0")  # MPI's own allocations live until exit
    for name, out in run_bad_inputs_concurrently("./build/sanitize/train_gpt2_dp", env):
        for report in ("AddressSanitizer", "runtime error:"):
            assert report not in out, "%s: sanitizer report\n%s" % (name, out[-3000:])
    out = check_sampling_with_small_vocabulary("./build/sanitize/train_gpt2_dp", env)
    assert "AddressSanitizer" not in out and "runtime error:" not in out, out[-3000:]


@test
def sanitized_dp_zero3_with_accumulation_overlap_sampling_and_resume():
    """ZeRO-3's gather buffer, prefetch and double-buffered gradient buckets under AddressSanitizer
    + UndefinedBehaviorSanitizer: 2 ranks, 2 micro-batches, overlap on, a checkpoint, a sample
    (every rank gathers) and a resume; then ZeRO-2 without overlap"""
    p = make(["sanitize"], timeout=600)
    assert p.returncode == 0, p.stdout.decode("utf-8", "replace")[-3000:]
    env = dict(ASAN_OPTIONS="detect_leaks=0")
    d = fresh_dir("sanitized_dp_z3")
    args = small_run_args(d, ["-d", 2 * 32 * 2 * 2, "-x", 2, "-z", 3, "-s", 2, "-g", 8])
    for extra in ([], ["-x", 3, "-y", 1]):
        out = run_ok(2, args + extra, program="./build/sanitize/train_gpt2_dp", env=env)
        assert "AddressSanitizer" not in out and "runtime error:" not in out, out[-3000:]
    assert "resumed from step 2" in out and "---- sample at step 3 ----" in out, out[-3000:]
    z2 = small_run_args(fresh_dir("sanitized_dp_z2"), ["-d", 2 * 32 * 2 * 2, "-x", 2, "-z", 2, "-overlap", 0])
    out = run_ok(2, z2, program="./build/sanitize/train_gpt2_dp", env=env)
    assert "AddressSanitizer" not in out and "runtime error:" not in out, out[-3000:]


@test
def sanitized_tp_run_with_sequence_parallelism_sampling_and_resume():
    """the TP trainer's slicing, gathering and split-vocabulary sampling under AddressSanitizer +
    UndefinedBehaviorSanitizer: a tp=2 -sp 1 run with a checkpoint, a sample and a resume"""
    p = make(["sanitize"], timeout=600)
    assert p.returncode == 0, p.stdout.decode("utf-8", "replace")[-3000:]
    env = dict(ASAN_OPTIONS="detect_leaks=0")
    d = fresh_dir("sanitized_tp")
    args = small_run_args(d, ["-b", 4, "-d", 4 * 32, "-x", 2, "-sp", 1, "-s", 2, "-g", 8])
    for extra in ([], ["-x", 3, "-y", 1]):
        out = run_ok(2, args + extra, program="./build/sanitize/train_gpt2_tp", env=env)
        assert "AddressSanitizer" not in out and "runtime error:" not in out, out[-3000:]
    assert "resumed from step 2" in out and "---- sample at step 3 ----" in out, out[-3000:]


@test
def sanitized_tp_overlap_ring_steps_and_chunks():
    """-tp_overlap 1 under AddressSanitizer + UndefinedBehaviorSanitizer: at tp = 4 with -sp the
    ring steps use three blocks of scratch in dbuf (and -r 2 reruns the forward's); without -sp
    the chunked all-reduces; 2 steps each"""
    p = make(["sanitize"], timeout=600)
    assert p.returncode == 0, p.stdout.decode("utf-8", "replace")[-3000:]
    env = dict(ASAN_OPTIONS="detect_leaks=0")
    for ranks, extra in ((4, ["-sp", 1, "-r", 2]), (2, ["-sp", 0, "-r", 1])):
        d = fresh_dir("sanitized_tp_overlap_%d" % ranks)
        args = small_run_args(d, ["-b", 4, "-d", 4 * 32, "-x", 2, "-tp_overlap", 1, "-s", 0] + extra)
        out = run_ok(ranks, args, program="./build/sanitize/train_gpt2_tp", env=env)
        assert "AddressSanitizer" not in out and "runtime error:" not in out, out[-3000:]


@test
def sanitized_cp_runs_ring_and_allgather_with_sampling_and_resume():
    """the CP trainer's token split, K,V blocks, exchanges and sampling under AddressSanitizer +
    UndefinedBehaviorSanitizer: 3 ranks, the ring (zigzag, -r 2) with a checkpoint, a sample and a
    resume; then the all-gather (contiguous)"""
    p = make(["sanitize"], timeout=600)
    assert p.returncode == 0, p.stdout.decode("utf-8", "replace")[-3000:]
    env = dict(ASAN_OPTIONS="detect_leaks=0")
    d = fresh_dir("sanitized_cp")
    args = small_run_args(d, ["-b", 2, "-t", 24, "-d", 2 * 24, "-x", 2, "-s", 2, "-g", 8, "-r", 2])
    for extra in ([], ["-x", 3, "-y", 1]):
        out = run_ok(3, args + extra, program="./build/sanitize/train_gpt2_cp", env=env)
        assert "AddressSanitizer" not in out and "runtime error:" not in out, out[-3000:]
    assert "resumed from step 2" in out and "---- sample at step 3 ----" in out, out[-3000:]
    e = fresh_dir("sanitized_cp_allgather")
    out = run_ok(3, small_run_args(e, ["-b", 2, "-t", 24, "-x", 2, "-cp_comm", "allgather", "-cp_layout", "contiguous"]),
                 program="./build/sanitize/train_gpt2_cp", env=env)
    assert "AddressSanitizer" not in out and "runtime error:" not in out, out[-3000:]


@test
def sanitized_diloco_bf16_link_fragments_checkpoint_sampling_and_resume():
    """DiLoCo's outer step under AddressSanitizer + UndefinedBehaviorSanitizer: 3 workers (uneven
    shards of the bf16 exchanges, in the pseudo-gradient's buffer), 2 fragments, H = 2, a
    checkpoint between outer steps (every worker's state), a sample and a resume from it (in a
    dir of its own: the run's last checkpoint follows its final outer steps). The e3m0 and int8
    links at 3 workers (pieces cut at uneven shards, scales and codes in the same buffer) with
    tau 1 (each half of the average in flight in turn), strided fragments, alpha and validation
    every step (theta_outer's, the weights set aside and back). And the fragments' offsets f H/F
    at -H 2147483644 -fragments 4, where f H passes 2^31"""
    p = make(["sanitize"], timeout=600)
    assert p.returncode == 0, p.stdout.decode("utf-8", "replace")[-3000:]
    env = dict(ASAN_OPTIONS="detect_leaks=0")
    d, part = fresh_dir("sanitized_diloco"), fresh_dir("sanitized_diloco_part")
    args = ["-x", 4, "-n", 3, "-s", 3, "-g", 8, "-H", 2, "-fragments", 2, "-outer_dtype", "bf16"]
    for out_dir, extra in ((d, []), (part, ["-y", 1])):
        if out_dir is part:  # the checkpoint between outer steps
            for f in glob.glob(os.path.join(d, "*_00000003*")):
                shutil.copy(f, part)
        out = run_ok(3, small_run_args(out_dir, args + extra), program="./build/sanitize/train_gpt2_diloco", env=env)
        assert "AddressSanitizer" not in out and "runtime error:" not in out, out[-3000:]
    assert "resumed from step 3" in out and "---- sample at step 4 ----" in out, out[-3000:]
    for link in ("e3m0", "int8"):
        d = fresh_dir("sanitized_diloco_" + link)
        out = run_ok(3, small_run_args(d, ["-x", 5, "-n", 0, "-v", 1, "-m", 1, "-H", 4, "-fragments", 2, "-fragment_layout",
                                           "strided", "-tau", 1, "-alpha", 0.5, "-outer_dtype", link], cfg=REF4),
                     program="./build/sanitize/train_gpt2_diloco", env=env)
        assert "AddressSanitizer" not in out and "runtime error:" not in out, out[-3000:]
    d = fresh_dir("sanitized_diloco_long_h")
    out = run_ok(2, small_run_args(d, ["-x", 2, "-n", 0, "-H", 2147483644, "-fragments", 4], cfg=REF4),
                 program="./build/sanitize/train_gpt2_diloco", env=env)
    assert "AddressSanitizer" not in out and "runtime error:" not in out, out[-3000:]


@test
def sanitized_pp_run_interleaved_with_timeline_sampling_and_resume_and_zb():
    """the PP trainer's activation slots, exchanges and gathers under AddressSanitizer +
    UndefinedBehaviorSanitizer: 2 stages of 2 chunks (interleaved) on a 4-layer model, a timeline, a
    checkpoint, a sample and a resume; then zero bubble, whose W reads what B kept in the slots"""
    p = make(["sanitize"], timeout=600)
    assert p.returncode == 0, p.stdout.decode("utf-8", "replace")[-3000:]
    env = dict(ASAN_OPTIONS="detect_leaks=0")
    d = fresh_dir("sanitized_pp")
    # 4 layers: 2 stages of 2 chunks
    args = small_run_args(d, ["-b", 1, "-d", 4 * 32, "-x", 2, "-sched", "interleaved", "-vp", 2, "-s", 2, "-g", 8,
                              "-timeline", 2], REF4)
    for extra in ([], ["-x", 3, "-y", 1]):
        out = run_ok(2, args + extra, program="./build/sanitize/train_gpt2_pp", env=env)
        assert "AddressSanitizer" not in out and "runtime error:" not in out, out[-3000:]
    assert "resumed from step 2" in out and "---- sample at step 3 ----" in out, out[-3000:]
    zb = small_run_args(fresh_dir("sanitized_pp_zb"), ["-b", 1, "-d", 4 * 32, "-x", 2, "-sched", "zb", "-timeline", 2], REF4)
    out = run_ok(2, zb, program="./build/sanitize/train_gpt2_pp", env=env)
    assert "AddressSanitizer" not in out and "runtime error:" not in out, out[-3000:]


@test
def sanitized_grid3d_interleaved_sp_checkpoint_resumed_on_another_grid_with_zero1():
    """the 3D trainer's groups, slots, tp collectives inside chunks and gathered checkpoints under
    AddressSanitizer + UndefinedBehaviorSanitizer: 1x2x2 with -sp, 2 chunks per stage, a sample
    and a checkpoint; resumed as 2x1x2 with ZeRO-1 (other slices, shards and micro-batches), then
    as 1x1x2x2 with -cp 2 (the ring on tp's heads, -sp on T/cp, ZeRO-1 over cp) with a sample;
    and a 1x1x2x2 run at T = 36, whose samples of every length pad to whole chunks and shards
    (multiples of 4, not of 2 cp x tp = 8: the sample must stay within -t's buffers)"""
    p = make(["sanitize"], timeout=600)
    assert p.returncode == 0, p.stdout.decode("utf-8", "replace")[-3000:]
    env = dict(ASAN_OPTIONS="detect_leaks=0")
    d = fresh_dir("sanitized_grid3d")
    args = small_run_args(d, ["-b", 1, "-d", 4 * 32, "-x", 2, "-s", 2, "-g", 8], REF4)
    out = run_ok(4, args + ["-pp", 2, "-tp", 2, "-sp", 1, "-sched", "interleaved", "-vp", 2], program="./build/sanitize/train_gpt2_3d", env=env)
    assert "AddressSanitizer" not in out and "runtime error:" not in out, out[-3000:]
    out = run_ok(4, args + ["-x", 3, "-y", 1, "-b", 2, "-dp", 2, "-tp", 2, "-z", 1], program="./build/sanitize/train_gpt2_3d", env=env)
    assert "AddressSanitizer" not in out and "runtime error:" not in out, out[-3000:]
    assert "resumed from step 2" in out and "---- sample at step 3 ----" in out, out[-3000:]
    out = run_ok(4, args + ["-x", 4, "-y", 1, "-b", 4, "-cp", 2, "-tp", 2, "-sp", 1, "-z", 1],
                 program="./build/sanitize/train_gpt2_3d", env=env)
    assert "AddressSanitizer" not in out and "runtime error:" not in out, out[-3000:]
    assert "resumed from step 3" in out and "---- sample at step 4 ----" in out, out[-3000:]
    d36 = fresh_dir("sanitized_grid3d_t36")
    out = run_ok(4, small_run_args(d36, ["-b", 1, "-t", 36, "-d", 36, "-x", 1, "-n", 0, "-v", 0, "-s", 1, "-g", 36, "-cp", 2,
                                         "-tp", 2, "-sp", 1], REF4),
                 program="./build/sanitize/train_gpt2_3d", env=env)
    assert "AddressSanitizer" not in out and "runtime error:" not in out, out[-3000:]
    assert "---- sample at step 1 ----" in out, out[-3000:]


# ---------------------------------------------------------------------------------------------
# comm layer and dataloader unit tests (C programs under mpirun)


def make_program_test(name, program, ranks, args, expect):
    def fn():
        out = run_ok(ranks, args, program=program)
        assert expect in out, out[-2000:]
    fn.__name__ = name
    return fn


for _n in (1, 2, 3, 4):
    test(make_program_test("comm_collectives_%d_ranks" % _n, "test/test_comm", _n, [], "comm ok"))
for _n in (1, 2, 3, 4):
    for _b, _t, _a, _s in ((2, 16, 2, 1), (3, 8, 1, 0)):
        test(make_program_test("dataloader_%d_ranks_B%d_T%d_accum%d_shuffle%d" % (_n, _b, _t, _a, _s),
                               "test/test_dataloader", _n, [_b, _t, _a, _s], "dataloader ok"))
# pipeline schedules (llmc/pipeline.h): order, dependencies, bubble and memory against their formulas
test(make_program_test("pipeline_schedules", "test/test_pipeline", 1, [], "pipeline ok"))
# context parallelism's block attention (llmc/cpu/ring_attention.h) against the whole-sequence
# attention, cp = 1..4, contiguous and zigzag; the work per rank against its formula
test(make_program_test("ring_attention_blocks_equal_whole_attention", "test/test_ring_attention", 1, [], "ring attention ok"))
# the vocabulary-parallel cross-entropy at one rank is fused_classifier bit for bit (llmc/cpu/classifier.h)
test(make_program_test("classifier_vocabulary_parallel_at_one_rank_is_the_fused_one_bit_for_bit", "test/test_classifier", 1, [],
                       "classifier ok"))
# DiLoCo's int8 and e3m0 codes (llmc/precision.h): zero, denormals, the largest, negatives, ties and
# thresholds, each code written out from the format's definition; a NaN or infinity shows in the scale
test(make_program_test("link_codes_edge_values", "test/test_link_codes", 1, [], "link codes ok"))


@test
def link_codes_equal_the_references_on_random_pieces():
    """pieces of values spread over 12 decades (with zeros, denormals and a negative largest)
    coded by the CPU passes (test/test_link_codes) read back bit for bit as reference.link_round
    reads them, written from the format's definition alone; a piece with a NaN or an infinity is
    refused"""
    d = fresh_dir("link_codes")
    rng = np.random.default_rng(7)
    pieces = [rng.standard_normal(n).astype(np.float32) * np.float32(10.0) ** rng.uniform(-10, 2, n).astype(np.float32)
              for n in (1, 5, 4097)]
    pieces.append(np.array([0.0, -3e-39, 1e-45, -2.0, 1.0, 0.5], dtype=np.float32))  # (the largest negative)
    pieces.append(np.zeros(9, dtype=np.float32))
    pieces.append((rng.standard_normal(1000) * 1e-39).astype(np.float32))  # (denormals only)
    for bits in (8, 4):
        for i, x in enumerate(pieces):
            src, dst = os.path.join(d, "in_%d.f32" % i), os.path.join(d, "out_%d_%d.f32" % (bits, i))
            x.tofile(src)
            subprocess.run(["./test/test_link_codes", str(bits), src, dst], cwd=ROOT, check=True, timeout=60)
            got, want = np.fromfile(dst, dtype=np.float32), reference.link_round(reference.torch.from_numpy(x), bits).numpy()
            assert got.view(np.uint32).tolist() == want.view(np.uint32).tolist(), \
                "bits %d piece %d: %d of %d values differ" % (bits, i, (got != want).sum(), len(x))
    for bad in (np.nan, np.inf):
        src = os.path.join(d, "bad.f32")
        np.array([1.0, bad, 2.0], dtype=np.float32).tofile(src)
        p = subprocess.run(["./test/test_link_codes", "4", src, os.path.join(d, "bad_out.f32")], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
        assert p.returncode != 0 and "a non-finite value, no scale codes it" in p.stdout + p.stderr, p.stdout + p.stderr
        assert not os.path.exists(os.path.join(d, "bad_out.f32"))


# ---------------------------------------------------------------------------------------------
# data: the committed token files decode back to the text


def decode_table(path):
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(1024), dtype=np.int32)
        assert header[0] == 20240328 and header[1] == 2
        table, data = [], f.read()
    pos = 0
    for _ in range(header[2]):
        n = data[pos]
        table.append(data[pos + 1: pos + 1 + n])
        pos += 1 + n
    return table, int(header[3])


@test
def data_tokens_decode_to_the_text():
    table, eot = decode_table(os.path.join(ROOT, "dev/data/gpt2_tokenizer.bin"))
    assert len(table) == 50257 and eot == 50256 and table[eot] == b"<|endoftext|>"
    tokens = np.concatenate([reference.read_tokens(os.path.join(ROOT, "dev/data/tinyshakespeare", n))
                             for n in ("tiny_shakespeare_val.bin", "tiny_shakespeare_train.bin")])
    assert len(reference.read_tokens(os.path.join(ROOT, "dev/data/tinyshakespeare/tiny_shakespeare_val.bin"))) == 32768
    text = b"".join(table[t] for t in tokens if t != eot)
    with open(os.path.join(ROOT, "dev/data/tinyshakespeare/tinyshakespeare.txt"), "rb") as f:
        assert text == f.read(), "decoded tokens differ from the text"
    # every passage (text between blank lines) starts with <|endoftext|>
    assert tokens[0] == eot and (tokens == eot).sum() == text.count(b"\n\n") + 1


@test
def data_script_reproduces_committed_files():
    out = fresh_dir("data")
    subprocess.run([sys.executable, "dev/data/tinyshakespeare.py", "--out", out], cwd=ROOT, check=True,
                   stdout=subprocess.PIPE)
    for rel in ("tinyshakespeare/tiny_shakespeare_train.bin", "tinyshakespeare/tiny_shakespeare_val.bin", "gpt2_tokenizer.bin"):
        with open(os.path.join(out, rel), "rb") as a, open(os.path.join(ROOT, "dev/data", rel), "rb") as b:
            assert a.read() == b.read(), rel + " differs from the committed file"


# ---------------------------------------------------------------------------------------------
# train_gpt2_tp: tensor parallelism against the same reference. The ranks share every
# micro-batch, so B = batch / accum whatever tp is.

TP = "./train_gpt2_tp"


def tp_step_bytes(cfg, B, accum, sp, X=4, overlap=0, tp=1, rerun=0):
    """communication per step (README, tensor parallelism), per kind: per micro-batch 4L + 2
    collectives of B*T*C activations of X bytes (all-reduces; with -sp all-gathers and as many
    reduce-scatters) and the loss's all-reduces of 3 B*T fp32; per step the norm's 4 bytes and
    with -sp the LayerNorm gradients' all-reduce of (4L + 2) C. -r 2 reruns each layer's forward:
    L more reduce-scatters and 2L more all-gathers with -sp (L all-reduces without). With -sp and
    -tp_overlap the layers' collectives (4L of each kind, 3L more with -r 2) are ring steps: each
    sends and receives (tp - 1)/tp of its B*T*C*X, what the ring collective sends (the ring bytes
    are unchanged); the head's two stay collectives"""
    L, C, T = cfg["layers"], cfg["channels"], cfg["seq_len"]
    act = accum * B * T * C * X
    small = accum * 3 * B * T * 4 + 4
    if sp:
        gathers, scatters = (4 * L + 2 + 2 * L * rerun) * act, (4 * L + 2 + L * rerun) * act
        if not overlap:
            return {"all-reduce": small + (4 * L + 2) * C * X, "reduce-scatter": scatters, "all-gather": gathers}
        ring = (8 * L + 3 * L * rerun) * act * (tp - 1) // tp
        return {"all-reduce": small + (4 * L + 2) * C * X, "reduce-scatter": 2 * act, "all-gather": 2 * act,
                "send": ring, "recv": ring}
    return {"all-reduce": (4 * L + 2 + L * rerun) * act + small, "reduce-scatter": 0, "all-gather": 0}


def check_tp_step_bytes(out, d, expected, steps):
    """the bytes of each kind of collective that every step reports, against the formula"""
    for step, groups in step_comm_bytes(d, steps, out).items():
        got = {kind: groups["world"].get(kind, 0) for kind in expected}
        assert got == expected, "step %s moved %s, the formula says %s" % (step, got, expected)


def compare_tp_with_reference(tp, sp, accum, cfg=REF, overlap=0, recompute=0):
    ref = reference_run(cfg)
    B = cfg["batch"] // accum
    d = fresh_dir("tp%d_sp%d_accum%d_nh%d_overlap%d_r%d" % (tp, sp, accum, cfg["heads"], overlap, recompute))
    grads_path = os.path.join(d, "grads.bin")
    # the step-0 gradients are gathered from the ranks' slices into the whole model's layout;
    # every step checks that the copies of the replicated tensors stay identical
    out = run_ok(tp, trainer_args(ref, B, d, ["-n", cfg["steps"], "-dump_grads", grads_path, "-sp", sp,
                                              "-check_replicas", 1, "-tp_overlap", overlap, "-r", recompute], cfg=cfg),
                 program=TP)
    expected = tp_step_bytes(cfg, B, accum, sp and tp > 1, overlap=overlap and tp > 1, tp=tp, rerun=recompute == 2)
    check_against_reference(ref, d, grads_path, sum(expected.values()), "the sum of %s" % expected)
    check_tp_step_bytes(out, d, expected, cfg["steps"])
    if tp > 1:
        assert "step %d: replicated tensors identical" % cfg["steps"] in out, out[-2000:]
    return d


def make_tp_test(tp, sp, accum, cfg=REF, overlap=0, recompute=0):
    def fn():
        compare_tp_with_reference(tp, sp, accum, cfg, overlap, recompute)
    fn.__name__ = "tp_vs_pytorch_tp%d%s_accum_%d%s%s%s" % (tp, "_sp" if sp else "", accum, "_3_heads" if cfg is REF3 else "",
                                                         "_overlap" if overlap else "", "_r%d" % recompute if recompute else "")
    return fn


for _tp, _sp, _accum, _cfg in [(1, 0, 1, REF), (1, 1, 1, REF), (2, 0, 1, REF), (2, 1, 2, REF), (4, 0, 2, REF), (4, 1, 1, REF),
                               (3, 0, 1, REF3), (3, 1, 2, REF3)]:
    test(make_tp_test(_tp, _sp, _accum, _cfg))
# -tp_overlap 1: tp 2, 3, 4, with and without -sp, accumulation, -r 1 and 2
for _tp, _sp, _accum, _cfg, _r in [(2, 1, 2, REF, 0), (2, 0, 1, REF, 1), (3, 1, 1, REF3, 2), (3, 0, 2, REF3, 0),
                                   (4, 1, 2, REF, 1), (4, 0, 1, REF, 2), (4, 1, 1, REF, 2)]:
    test(make_tp_test(_tp, _sp, _accum, _cfg, overlap=1, recompute=_r))


@test
def tp_overlap_is_bit_identical_at_tp2_and_close_at_tp4():
    """-tp_overlap 1 against 0 on the same run: at tp = 2 the same bits, with -sp and without (a
    sum of two parts is the same in either order, and each GEMM row is the same dot products); at
    tp = 4 with -sp the ring sums a block's four parts in another order than the collective, so
    the final weights differ by fp32 rounding only (within the reference's tolerance of each)"""
    ref = reference_run()
    for tp, sp in ((2, 1), (2, 0), (4, 1)):
        finals = []
        for overlap in (0, 1):
            d = fresh_dir("tp_overlap_tp%d_sp%d_%d" % (tp, sp, overlap))
            run_ok(tp, trainer_args(ref, 8, d, ["-n", 5, "-sp", sp, "-tp_overlap", overlap]), program=TP)
            finals.append(open(os.path.join(d, "model_00000005.bin"), "rb").read())
        if tp == 2:
            assert finals[0] == finals[1], "tp %d sp %d: -tp_overlap 1 changed the bits" % (tp, sp)
        else:
            a, b = (np.frombuffer(f[1024:], dtype=np.float32) for f in finals)
            diff = float(np.abs(a - b).max())
            assert 0 < diff <= 1e-5, "tp 4 -sp 1: final weights differ by %g with -tp_overlap (expected rounding, 0 < d <= 1e-5)" % diff


@test
def tp_resume_is_bit_identical():
    check_resume(lambda args, d: run_ok(2, args + ["-sp", 1], program=TP), "tp_resume", 4)


@test
def tp_model_file_loads_at_tp1_and_in_the_dp_trainer():
    """the model file a tp=2 run writes is the whole model in llm.c's layout: tp=1 and the DP
    trainer load it and measure the validation loss the tp=2 run measured"""
    ref = reference_run()
    d = fresh_dir("tp_file")
    run_ok(2, trainer_args(ref, 8, d, ["-x", 2, "-n", 2, "-v", 2, "-m", 2]), program=TP)
    val_tp2 = read_log(d)[1][2]["val_loss"]
    for ranks, program in ((1, TP), (1, "./train_gpt2_dp")):
        e = fresh_dir("tp_file_load")
        run_ok(ranks, trainer_args(ref, 8, e, ["-e", os.path.join(d, "model_00000002.bin"), "-x", 0, "-v", 1, "-m", 2]), program=program)
        val = read_log(e)[1][0]["val_loss"]
        # the same weights; only the order of fp32 sums differs (~1e-7 at a loss of 7)
        assert abs(val - val_tp2) <= 1e-5, "%s: val loss %.7f, the tp=2 run measured %.7f" % (program, val, val_tp2)


def check_tp_bad_layout(ranks, extra, message, model=None):
    """a layout that does not fit: the message, a non-zero exit, no files, no hang"""
    ref = reference_run()
    d = fresh_dir("tp_bad_layout")
    out_dir = os.path.join(d, "out")
    args = trainer_args(ref, 4, out_dir, extra) + (["-e", model] if model else [])
    code, out = mpirun(ranks, args, timeout=60, program=TP)
    assert code != 0, "exit code 0\n" + out[-2000:]
    assert message in out, "message %r not in output:\n%s" % (message, out[-2000:])
    assert not os.path.exists(out_dir), "the failed run created %s" % out_dir


@test
def tp_bad_layouts():
    check_tp_bad_layout(3, [], "-tp 3: tensor parallelism splits the heads NH = 4 over the ranks, and 3 does not divide it")
    # d5 has 5 heads, but the padded vocabulary 50304 = 2^7 x 3 x 131 does not split in 5
    check_tp_bad_layout(5, ["-x", 1], "-tp 5: tensor parallelism splits the padded vocabulary Vp = 50304 over the ranks", model="d5")
    check_tp_bad_layout(2, ["-sp", 1, "-t", 31, "-d", 8 * 31], "-sp 1 splits the tokens over the 2 ranks: -t 31 must be a multiple of 2")
    check_tp_bad_layout(2, ["-tp", 4], "-tp 4: this trainer puts every rank in one tensor-parallel group, so -tp must equal the number of ranks, 2")


# the bad inputs of the DP trainer, given to the TP trainer; messages that name the layout differ
TP_MESSAGES = {"batch_tokens_overflow_int": "-d 64 must be a positive multiple of B*T = 4194304*1024 = 4294967296"}


@test
def tp_bad_inputs():
    run_bad_inputs_concurrently(TP, messages=TP_MESSAGES)


@test
def tp_sampling_and_validation_run():
    """samples are drawn from logits split over the vocabulary; with -sp the prompt is padded"""
    d = fresh_dir("tp_sample")
    out = run_ok(2, ["-e", "d2", "-b", 2, "-t", 32, "-x", 2, "-v", 1, "-m", 2, "-s", 2, "-g", 16, "-sp", 1, "-o", d], program=TP)
    assert "---- sample at step 2 ----" in out and "val loss" in out, out[-2000:]
    _, val = read_log(d)
    assert abs(val[0]["val_loss"] - np.log(50257)) < 0.2, val[0]


@test
def tp_one_rank_failing_stops_all_ranks():
    check_one_rank_failing("tp_one_rank_fails", TP)


@test
def tp_nonfinite_loss_stops_before_writing_the_step():
    check_nonfinite_stops(TP)


# ---------------------------------------------------------------------------------------------
# train_gpt2_pp: pipeline parallelism against the same reference, on 4- and 8-layer models. Every
# stage sees every micro-batch, so B = batch / m whatever p is.

PP = "./train_gpt2_pp"


V_SCHEDULES = ("zbv", "dualpipev")


def pp_step_bytes(cfg, B, m, p, V, X=4, v_shape=False):
    """communication per step on stage 0 (README, pipeline parallelism): per micro-batch (2V - 1)
    messages of B*T*C floatX each way (activations of its V chunks, gradients of all but the
    first); per step the embedding group's all-reduce of wte's gradient (Vp*C), the norm's float
    and the loss's broadcast (4 bytes). In a V (v_shape) stage 0 exchanges 2 messages each way
    per micro-batch with stage 1 (chunk 0's activations and chunk 1's gradient down, the others
    up) and holds the only wte: no embedding all-reduce"""
    Vp = padded_vocab(cfg)
    per_micro = 2 if v_shape else 2 * V - 1
    messages = m * per_micro * B * cfg["seq_len"] * cfg["channels"] * X if p > 1 else 0
    tied = p > 1 and not v_shape
    return {"send": messages, "recv": messages, "all-reduce": (Vp * cfg["channels"] * X if tied else 0) + 4, "broadcast": 4}


def check_pp_step_bytes(out, d, expected, steps):
    """stage 0's bytes of each kind every step (all-reduce: the world's and the embedding group's)"""
    for step, groups in step_comm_bytes(d, steps, out).items():
        got = {kind: sum(g.get(kind, 0) for g in groups.values()) for kind in expected}
        assert got == expected, "step %s moved %s, the formula says %s" % (step, got, expected)


def compare_pp_with_reference(p, sched, m, V, cfg, extra=()):
    ref = reference_run(cfg)
    B = cfg["batch"] // m
    d = fresh_dir("pp%d_%s_m%d_v%d%s" % (p, sched, m, V, "".join(str(x) for x in extra)))
    grads_path = os.path.join(d, "grads.bin")
    # step-0 gradients gathered from the stages into the whole model's layout; after every step
    # the first and last stage's wte copies are compared bit for bit
    out = run_ok(p, trainer_args(ref, B, d, ["-n", cfg["steps"], "-dump_grads", grads_path, "-sched", sched, "-vp", V,
                                             "-check_replicas", 1] + list(extra), cfg=cfg), program=PP)
    v_shape = sched in V_SCHEDULES
    expected = pp_step_bytes(cfg, B, m, p, V, v_shape=v_shape)
    check_against_reference(ref, d, grads_path, sum(expected.values()), "the sum of %s" % expected)
    check_pp_step_bytes(out, d, expected, cfg["steps"])
    # on the link: the sends whole, the embedding group's all-reduce over 2 ranks as a ring
    # (2 (2-1)/2 of its payload), the norm's float over the pipe's p
    link = expected["send"] + (expected["all-reduce"] - 4) + 2 * (p - 1) / p * 4
    check_link_bytes(out, read_log(d)[0], link)
    if p > 1 and not v_shape:  # (in a V one stage holds the only wte)
        for step in range(1, cfg["steps"] + 1):
            assert "step %d: wte copies of the first and last stage identical" % step in out, out[-2000:]
    # each stage held as many micro-batches at once as the schedule predicts
    held = re.search(r"activations held at most, measured \(schedule\):(.*)", out)
    assert held, out[-2000:]
    pairs = re.findall(r"stage (\d+): (\d+) \((\d+)\)", held.group(1))
    assert len(pairs) == p and all(a == b for _, a, b in pairs), held.group(0)


def make_pp_test(p, sched, m, V, cfg):
    def fn():
        compare_pp_with_reference(p, sched, m, V, cfg)
    fn.__name__ = "pp_vs_pytorch_pp%d_%s_m%d%s" % (p, sched, m, "_v%d" % V if V > 1 else "")
    return fn


for _p, _sched, _m, _V, _cfg in [(1, "1f1b", 1, 1, REF4_GPT2), (2, "afab", 1, 1, REF4_GPT2), (2, "afab", 4, 1, REF4_GPT2),
                                 (2, "1f1b", 2, 1, REF4_GPT2), (2, "1f1b", 8, 1, REF4_GPT2), (2, "interleaved", 2, 2, REF4_GPT2),
                                 (2, "interleaved", 4, 2, REF4_GPT2), (4, "afab", 2, 1, REF4_GPT2), (4, "1f1b", 1, 1, REF4_GPT2),
                                 (4, "1f1b", 8, 1, REF4_GPT2), (4, "interleaved", 4, 2, REF8_GPT2), (4, "interleaved", 8, 2, REF8_GPT2),
                                 (2, "zb", 4, 1, REF4_GPT2), (4, "zb", 2, 1, REF4_GPT2), (4, "zb", 8, 1, REF4_GPT2),
                                 # the V: m = 2p, and an odd m, the least each allows at p = 2 (zbv 2p - 1,
                                 # dualpipev 2p + 1; m = p is refused: pp_v_schedules_refuse_too_few_micro_batches)
                                 (2, "zbv", 4, 2, REF4_GPT2), (2, "zbv", 3, 2, REF4_GPT2_B6), (4, "zbv", 8, 2, REF8_GPT2),
                                 (4, "zbv", 7, 2, REF8_GPT2_B7), (2, "dualpipev", 4, 2, REF4_GPT2),
                                 (2, "dualpipev", 5, 2, REF4_GPT2_B10), (4, "dualpipev", 8, 2, REF8_GPT2),
                                 (4, "dualpipev", 9, 2, REF8_GPT2_B9)]:
    test(make_pp_test(_p, _sched, _m, _V, _cfg))


@test
def planner_plans_the_v_schedules_as_the_trainers_run_them():
    """dev/memory_planner -sched zbv and dualpipev: rank 0's memory table byte for byte the one the
    trainer printed (its slots, the head on stage 0, its gradient buffers), for the PP trainer
    at p = 4 and the grid at 2x2x1x1, and no embedding all-reduce in the predicted step"""
    ref = reference_run(REF8_GPT2)
    for sched in V_SCHEDULES:
        d = fresh_dir("planner_v_" + sched)
        args = trainer_args(ref, 1, d, ["-n", 1, "-sched", sched], cfg=REF8_GPT2)
        check_planner_matches_trainer(PP, 4, args, run_ok(4, args, program=PP))
        d3 = fresh_dir("planner_v3d_" + sched)
        args = trainer_args(ref, 1, d3, ["-n", 1] + grid3d_flags(2, 2, 1, sched=sched), cfg=REF8_GPT2)
        check_planner_matches_trainer(D3, 4, args, run_ok(4, args, program=D3))
    # the predicted step's collectives (on the CPU profile nothing hides, so each one shows): the
    # tied wte's all-reduce under 1f1b, none in a V
    for sched in ("1f1b",) + V_SCHEDULES:
        p = subprocess.run([str(a) for a in ["./dev/memory_planner", "-e", "d8", "-b", 1, "-t", 64, "-d", 512, "-pp", 4,
                            "-sched", sched, "-device", "cpu", "-profile", "dev/profiles/cpu-this-machine.txt"]],
                           cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
        line = [l for l in p.stdout.decode().splitlines() if "collectives exposed" in l]
        assert line and ("embedding" in line[0]) == (sched == "1f1b"), (sched, line)


@test
def pp_overlap_of_f_and_b_pairs_matches_the_reference():
    """-pp_overlap 1 posts the sends of an F&B group's forward (and those before it due at the next
    exchange) right after the forward, the rest at the exchange: the messages must still meet
    their receives in order, so the results equal the reference (bytes and held activations as
    without it) for dualpipev's pairs at p = 4 and interleaved's at p = 2, where stage 0 sends
    both its messages to stage 1. (On the CPU an early send changes no value, only when it moves:
    a send posted out of order would pair with the wrong receive and fail this)"""
    compare_pp_with_reference(4, "dualpipev", 8, 2, REF8_GPT2, ["-pp_overlap", 1])
    compare_pp_with_reference(2, "interleaved", 4, 2, REF4_GPT2, ["-pp_overlap", 1])


@test
def pp_zb_is_1f1b_reordered_bit_for_bit():
    """ZB-H1 runs the same kernels as 1F1B on the same data, only later: each weight gradient
    still accumulates the micro-batches in order 0, 1, ..., m-1, and every tensor has one writer
    per stage. So at 4 stages the losses, the step-0 gradients and the final weights equal 1F1B's
    bit for bit (a W that read a gradient B had not kept, or a slot freed before its W, would not)"""
    ref = reference_run(REF4)
    m, runs = 8, {}
    for sched in ("1f1b", "zb"):
        d = fresh_dir("pp4_%s_bits" % sched)
        run_ok(4, trainer_args(ref, REF4["batch"] // m, d, ["-n", REF4["steps"], "-dump_grads", os.path.join(d, "grads.bin"),
                                                             "-sched", sched], cfg=REF4), program=PP)
        losses = [r["train_loss"] for _, r in sorted(read_log(d)[0].items())]
        files = {}
        for name in ("grads.bin", "model_%08d.bin" % REF4["steps"]):
            with open(os.path.join(d, name), "rb") as f:
                files[name] = f.read()
        runs[sched] = (losses, files)
    assert runs["zb"][0] == runs["1f1b"][0], "losses: zb %s, 1f1b %s" % (runs["zb"][0], runs["1f1b"][0])
    for name, data in runs["1f1b"][1].items():
        assert runs["zb"][1][name] == data, "%s differs between zb and 1f1b" % name


@test
def pp_resume_is_bit_identical():
    check_resume(lambda args, d: run_ok(2, args + ["-sched", "interleaved", "-vp", 2], program=PP), "pp_resume", 4, REF4)


@test
def pp_model_file_loads_at_pp1_and_in_the_dp_trainer():
    """the model file a pp=2 run writes is the whole model in llm.c's layout: pp=1 and the DP
    trainer load it and measure the validation loss the pp=2 run measured"""
    ref = reference_run(REF4)
    d = fresh_dir("pp_file")
    run_ok(2, trainer_args(ref, 4, d, ["-x", 2, "-n", 2, "-v", 2, "-m", 2], cfg=REF4), program=PP)
    val_pp2 = read_log(d)[1][2]["val_loss"]
    for ranks, program in ((1, PP), (1, "./train_gpt2_dp")):
        e = fresh_dir("pp_file_load")
        run_ok(ranks, trainer_args(ref, 4, e, ["-e", os.path.join(d, "model_00000002.bin"), "-x", 0, "-v", 1, "-m", 2], cfg=REF4),
               program=program)
        val = read_log(e)[1][0]["val_loss"]
        # the same weights; only the order of fp32 sums differs (~1e-7 at a loss of 7)
        assert abs(val - val_pp2) <= 1e-5, "%s: val loss %.7f, the pp=2 run measured %.7f" % (program, val, val_pp2)


def check_pp_bad_layout(ranks, extra, message):
    """a layout that does not fit: the message on every rank's behalf, a non-zero exit, no files"""
    ref = reference_run(REF4)
    d = fresh_dir("pp_bad_layout")
    out_dir = os.path.join(d, "out")
    code, out = mpirun(ranks, trainer_args(ref, 4, out_dir, extra, cfg=REF4), timeout=60, program=PP)
    assert code != 0, "exit code 0\n" + out[-2000:]
    assert message in out, "message %r not in output:\n%s" % (message, out[-2000:])
    assert not os.path.exists(out_dir), "the failed run created %s" % out_dir


@test
def pp_bad_layouts():
    check_pp_bad_layout(3, [], "the model's L = 4 layers cannot be split into pp x vp = 3 x 1 = 3 equal chunks")
    check_pp_bad_layout(4, ["-sched", "interleaved", "-vp", 2], "cannot be split into pp x vp = 4 x 2 = 8 equal chunks")
    check_pp_bad_layout(2, ["-sched", "interleaved", "-vp", 2, "-b", 8], "the micro-batches in groups of p = 2, so their number m = 1")
    check_pp_bad_layout(2, ["-sched", "gpipe"], "-sched gpipe: unknown schedule")
    check_pp_bad_layout(2, ["-vp", 2], "-vp 2: only -sched interleaved splits a stage into chunks")
    check_pp_bad_layout(2, ["-pp", 4], "-pp 4: this trainer puts every rank in one pipeline, so -pp must equal the number of ranks, 2")


@test
def pp_v_schedules_refuse_too_few_micro_batches():
    """each V schedule's rule on m (pipeline.h: zbv's stage 0 warms up with 2p - 1 forwards,
    dualpipev's steady state runs m - 2p + 1 >= 1 rounds) and its 2 chunks a stage, refused
    before anything is written; m = p (-b 4 of REF4's batch of 8: m = 2 at p = 2) is below both"""
    check_pp_bad_layout(2, ["-sched", "zbv"], "the number of micro-batches m = 2 (-d / (B*T)) must be at least 2p - 1")
    check_pp_bad_layout(2, ["-sched", "dualpipev"], "the number of micro-batches m = 2 (-d / (B*T)) must be at least 2p = 4")
    check_pp_bad_layout(2, ["-sched", "dualpipev", "-vp", 4, "-b", 1], "-vp 4: -sched dualpipev places exactly 2 chunks on each stage")
    # printed once, by rank 0, though every rank meets the rule
    ref = reference_run(REF4)
    d = fresh_dir("pp_v_refused_once")
    code, out = mpirun(2, trainer_args(ref, 4, os.path.join(d, "out"), ["-sched", "zbv"], cfg=REF4), timeout=60, program=PP)
    assert code != 0 and out.count("must be at least 2p - 1") == 1, out[-2000:]


@test
def pp_bad_inputs():
    run_bad_inputs_concurrently(PP, messages=TP_MESSAGES)


@test
def pp_sampling_validation_and_timeline():
    """samples pass through the pipe; the measured timeline is printed and written as JSON lines"""
    d = fresh_dir("pp_sample")
    out = run_ok(2, ["-e", "d2", "-b", 2, "-t", 32, "-d", 256, "-x", 2, "-v", 1, "-m", 2, "-s", 2, "-g", 16, "-timeline", 1,
                     "-o", d], program=PP)
    assert "---- sample at step 2 ----" in out and "val loss" in out, out[-2000:]
    assert "timeline of step 2, measured" in out, out[-2000:]
    _, val = read_log(d)
    assert abs(val[0]["val_loss"] - np.log(50257)) < 0.2, val[0]
    with open(os.path.join(d, "timeline.jsonl")) as f:
        records = [json.loads(line) for line in f]
    # 2 steps x 2 stages x 4 micro-batches x (F, B)
    assert len(records) == 2 * 2 * 4 * 2, len(records)
    for r in records:
        assert 0 <= r["start_ms"] <= r["end_ms"], r


@test
def pp_v_schedule_samples_validates_resumes_and_draws_its_timeline():
    """zbv and dualpipev put the head on stage 0 (the V's two ends): the validation loss and the
    samples come from there, the same as 1f1b's, whose head is on the last stage (the weights
    after 2 steps differ in their last bits at most, and the draws are the same rng's); the
    measured timeline holds every F, B and W of both chunks; a resume from a checkpoint repeats
    the uninterrupted run bit for bit"""
    runs = {}
    for sched in ("1f1b",) + V_SCHEDULES:
        d = fresh_dir("pp_sample_" + sched)
        out = run_ok(2, ["-e", "d4", "-b", 1, "-t", 32, "-d", 128, "-x", 2, "-v", 1, "-m", 2, "-s", 2, "-g", 16, "-timeline", 1,
                         "-sched", sched, "-o", d], program=PP)
        assert "---- sample at step 2 ----" in out and "val loss" in out, out[-2000:]
        runs[sched] = (samples_by_step(out), read_log(d)[1])
        if sched == "1f1b":
            continue
        assert runs[sched][0] == runs["1f1b"][0], "samples: %s %s, 1f1b %s" % (sched, runs[sched][0], runs["1f1b"][0])
        val, val_1f1b = runs[sched][1], runs["1f1b"][1]
        assert sorted(val) == sorted(val_1f1b) and val, (val, val_1f1b)
        for step in val:  # (fp32 sums in another order: 1e-5)
            assert abs(val[step]["val_loss"] - val_1f1b[step]["val_loss"]) < 1e-5, (sched, step, val[step], val_1f1b[step])
        assert "timeline of step 2, measured" in out, out[-2000:]
        _, val = read_log(d)
        assert abs(val[0]["val_loss"] - np.log(50257)) < 0.2, val[0]
        with open(os.path.join(d, "timeline.jsonl")) as f:
            records = [json.loads(line) for line in f]
        # 2 steps x 2 stages x 4 micro-batches x 2 chunks x (F, B, W)
        assert len(records) == 2 * 2 * 4 * 2 * 3, len(records)
        assert {r["chunk"] for r in records} == {0, 1} and {r["op"] for r in records} == {"F", "B", "W"}, records[:3]
        for r in records:
            assert 0 <= r["start_ms"] <= r["end_ms"], r
    check_resume(lambda args, d: run_ok(2, args + ["-sched", "dualpipev"], program=PP), "pp_resume_dualpipev", 2, REF4)


@test
def pp_one_rank_failing_stops_all_ranks():
    check_one_rank_failing("pp_one_rank_fails", PP)


@test
def pp_nonfinite_loss_stops_before_writing_the_step():
    check_nonfinite_stops(PP)


# ---------------------------------------------------------------------------------------------
# 3D parallelism (train_gpt2_3d.cu): dp x pp x tp grids (and with -cp dp x pp x cp x tp) against
# the reference; rank 0's bytes per group against the README's formulas, computed here from the
# rule, independently of the trainer; checkpoints that move between grids

D3 = "./train_gpt2_3d"
def grid3d_rank0_parameters(cfg, dp, pp, tp, zero, v_shape=False):
    """rank 0's parameters (stage 0, tp rank 0): its Vp/tp rows of wte, wpe, its tp slices of the
    L/pp layers of stage 0 (replicated LayerNorms and row-parallel biases whole), lnf when pp = 1
    or in a V (stage 0 holds the head); with -z 1 padded to a multiple of dp x 128 (dp: the ranks
    sharing the state, dp x cp)"""
    C, L, maxT = cfg["channels"], cfg["layers"], cfg["max_seq_len"]
    sliced = 3 * C * C + 3 * C + C * C + 4 * C * C + 4 * C + 4 * C * C  # qkvw qkvb attprojw fcw fcb fcprojw
    layer = sliced // tp + 6 * C  # + ln1w ln1b attprojb ln2w ln2b fcprojb
    n = padded_vocab(cfg) * C // tp + maxT * C + L // pp * layer + (2 * C if pp == 1 or v_shape else 0)
    return -(-n // (dp * 128)) * dp * 128 if zero else n


def grid3d_step_bytes(cfg, B, m, dp, pp, tp, sp, V, zero, X=4, cp=1, allgather=False, overlap=0, v_shape=False):
    """rank 0's payload per group and step (README, 3D): tp collectives of a = B T C X (T = T/cp,
    the rank's tokens), 4 per layer of stage 0 and micro-batch, one for the embedding and one for
    the head when stage 0 is also the last (with -sp each one reduce-scatter plus one all-gather),
    the loss's 3 B T fp32 on the last stage, with -sp the LayerNorm gradients; over cp, per layer
    of stage 0 and micro-batch, K,V blocks of B T 2C/tp (cp_step_bytes' rule on the stage's
    layers and tp's heads); (2V - 1) m messages each way over pp (a / tp with -sp) and the loss
    broadcast; the dp x cp reduction of rank 0's N parameters (twice N with -z 1: reduce-scatter
    and all-gather) and the loss average; the tied wte's Vp/tp C over the embedding group; the
    norm's float over the world. With -sp and -tp_overlap the layers' tp collectives (4 all-gathers
    and 4 reduce-scatters a layer) are ring steps, each sending and receiving (tp - 1)/tp a. In a V
    (v_shape) stage 0 holds the head too (the loss, lnf), exchanges 2 m messages each way with
    stage 1, and its wte is the only one (no embedding group)"""
    T, C, L = cfg["seq_len"] // cp, cfg["channels"], cfg["layers"]
    a, Ls, last, sp = B * T * C * X, L // pp, 1 if pp == 1 or v_shape else 0, sp and tp > 1
    loss = last * m * 3 * B * T * 4
    if sp and overlap:
        tp_bytes = 2 * m * (1 + last) * a + m * 8 * Ls * 2 * (tp - 1) * a // tp + loss + (4 * Ls + 2 * last) * C * X
    elif sp:
        tp_bytes = 2 * m * (4 * Ls + 1 + last) * a + loss + (4 * Ls + 2 * last) * C * X
    else:
        tp_bytes = m * (4 * Ls + 1 + last) * a + loss
    pp_bytes = (2 * (2 if v_shape else 2 * V - 1) * m * a // (tp if sp else 1) if pp > 1 else 0) + 4
    dp_bytes = (2 if zero else 1) * grid3d_rank0_parameters(cfg, dp * cp, pp, tp, zero, v_shape) * X + 4
    cp_bytes = sum(cp_step_bytes(dict(cfg, layers=Ls, channels=C // tp), B, cp, m, allgather, 0, X).values()) - 4
    return {"tp": tp_bytes, "cp": cp_bytes, "pp": pp_bytes, "dp": dp_bytes,
            "embedding": padded_vocab(cfg) * C // tp * X if pp > 1 and not v_shape else 0, "world": 4}


def check_grid3d_step_bytes(out, d, expected, steps):
    """rank 0's bytes per group every step"""
    for step, groups in step_comm_bytes(d, steps, out).items():
        got = {group: sum(groups[group].values()) for group in expected}
        assert got == expected, "step %s moved %s, the formula says %s" % (step, got, expected)


def grid3d_flags(dp, pp, tp, sp=0, sched="1f1b", V=1, zero=0, cp=1, cp_layout="zigzag", cp_comm="ring"):
    return ["-dp", dp, "-pp", pp, "-tp", tp, "-sp", sp, "-sched", sched, "-vp", V, "-z", zero] + (
        ["-cp", cp, "-cp_layout", cp_layout, "-cp_comm", cp_comm] if cp > 1 else [])


def compare_grid3d_with_reference(dp, pp, tp, sp, sched, V, m, zero, cp=1, cp_layout="zigzag", cp_comm="ring", overlap=0):
    cfg = REF4_GPT2
    ref = reference_run(cfg)
    B = cfg["batch"] // (dp * m)
    d = fresh_dir("grid3d_%dx%dx%dx%d_sp%d_%s_v%d_m%d_z%d_%s_%s_o%d" % (dp, pp, cp, tp, sp, sched, V, m, zero, cp_layout,
                                                                     cp_comm, overlap))
    grads_path = os.path.join(d, "grads.bin")
    # step-0 gradients gathered from every rank's pieces into the whole model; after every step
    # every copy of every tensor (tp's replicated ones, the two wte, the dp x cp replicas) compared
    args = trainer_args(ref, B, d, ["-n", cfg["steps"], "-dump_grads", grads_path, "-check_replicas", 1]
                        + grid3d_flags(dp, pp, tp, sp, sched, V, zero, cp, cp_layout, cp_comm) + ["-tp_overlap", overlap],
                        cfg=cfg)
    out = run_ok(dp * pp * cp * tp, args, program=D3)
    if cp > 1:
        check_planner_matches_trainer(D3, dp * pp * cp * tp, args, out)  # (the planner's table is the trainer's)
    v_shape = sched in V_SCHEDULES
    expected = grid3d_step_bytes(cfg, B, m, dp, pp, tp, sp, V, zero, cp=cp, allgather=cp_comm == "allgather",
                                 overlap=overlap, v_shape=v_shape)
    check_against_reference(ref, d, grads_path, sum(expected.values()), "the sum of %s" % expected)
    check_grid3d_step_bytes(out, d, expected, cfg["steps"])
    for what, size in (("tp copies of the replicated tensors", tp), ("wte copies of the first and last stage", 1 if v_shape else pp),
                       ("dp replicas", dp * cp)):
        if size > 1:
            assert "step %d: %s identical" % (cfg["steps"], what) in out, what + "\n" + out[-2000:]
    # the memory table's total against what was allocated, to the byte (the CPU backend counts every buffer)
    check_memory_table_total(D3, out)
    held = re.search(r"activations held at most, measured \(schedule\):(.*)", out)
    pairs = re.findall(r"stage (\d+): (\d+) \((\d+)\)", held.group(1))
    assert len(pairs) == pp and all(a == b for _, a, b in pairs), held.group(0)


def make_grid3d_test(dp, pp, tp, sp, sched, V, m, zero, cp=1, cp_layout="zigzag", cp_comm="ring", overlap=0):
    def fn():
        compare_grid3d_with_reference(dp, pp, tp, sp, sched, V, m, zero, cp, cp_layout, cp_comm, overlap)
    grid = "%dx%dx%d" % (dp, pp, tp) if cp == 1 else "%dx%dx%dx%d_cp_%s_%s" % (dp, pp, cp, tp, cp_layout, cp_comm)
    fn.__name__ = "grid3d_vs_pytorch_%s%s_%s%s_m%d%s%s" % (grid, "_sp" if sp else "", sched, "_v%d" % V if V > 1 else "", m,
                                                          "_z1" if zero else "", "_tp_overlap" if overlap else "")
    return fn


# every grid of sides 1 and 2 (dp x pp x tp), the 8-rank ones twice; -sp wherever tp = 2 allows,
# interleaving, zero bubble and ZeRO-1 spread over them
for _grid in [(1, 1, 1, 0, "1f1b", 1, 1, 0), (2, 1, 1, 0, "1f1b", 1, 2, 1), (1, 2, 1, 0, "interleaved", 2, 2, 0),
              (1, 1, 2, 1, "1f1b", 1, 1, 0), (2, 2, 1, 0, "zb", 1, 2, 1), (2, 1, 2, 1, "afab", 1, 2, 0),
              (1, 2, 2, 1, "interleaved", 2, 2, 0), (2, 2, 2, 1, "1f1b", 1, 2, 1), (2, 2, 2, 0, "interleaved", 2, 2, 0)]:
    test(make_grid3d_test(*_grid))
# the fourth axis, cp (dp x pp x cp x tp): with tp and -sp inside one stage, with a pipeline and
# replicas (ZeRO-1 over dp x cp), and on 8 ranks with tp, each split and exchange somewhere
for _grid in [(1, 1, 2, 1, "1f1b", 1, 2, 0, 2, "zigzag", "ring"), (2, 2, 1, 0, "1f1b", 1, 2, 1, 2, "contiguous", "ring"),
              (2, 1, 2, 0, "afab", 1, 1, 0, 2, "zigzag", "allgather")]:
    test(make_grid3d_test(*_grid))
# -tp_overlap 1 inside the grid: 2x2x2 with -sp (ring steps), and with cp and no -sp (chunks)
test(make_grid3d_test(2, 2, 2, 1, "1f1b", 1, 2, 1, overlap=1))
test(make_grid3d_test(1, 2, 2, 1, "zb", 1, 2, 0, overlap=1))  # (zero bubble's split backward under the ring)
test(make_grid3d_test(1, 1, 2, 0, "1f1b", 1, 2, 0, 2, "zigzag", "ring", overlap=1))
# the V schedules in the grid: 2x2x1x1 with ZeRO-1, and 1x2x1x2 with -sp (dp x pp x cp x tp)
test(make_grid3d_test(2, 2, 1, 0, "zbv", 2, 4, 1))
test(make_grid3d_test(1, 2, 2, 1, "dualpipev", 2, 4, 0))


def check_resumed_against_reference(ref, d, name, steps, last_step):
    """a run resumed in d on another layout: the losses of `steps` and its final weights against the
    uninterrupted reference, within check_against_reference's tolerances (only fp32 summation
    orders differ)"""
    train, _ = read_log(d)
    for s in steps:
        a, b = train[s]["train_loss"], ref["losses"][s - 1]
        assert abs(a - b) <= 1e-5, "%s step %d loss %.7f, reference %.7f" % (name, s, a, b)
    _, p_ref = reference.read_model_file(os.path.join(ref["dir"], "final.bin"))
    _, p = reference.read_model_file(os.path.join(d, "model_%08d.bin" % last_step))
    err = np.abs(p - p_ref).max()
    assert err <= 2e-5, "%s final parameters: max abs error %.3g" % (name, err)


@test
def grid3d_checkpoint_of_2x2x2_resumes_at_1x1x1_and_1x2x4():
    """a 2x2x2 run (-sp, ZeRO-1) checkpoints step 2; resumed on one rank and on 1x2x4 (other
    micro-batches, other slices, other shards), steps 3-5 still match the uninterrupted reference"""
    cfg = REF4_GPT2
    ref = reference_run(cfg)
    saved = fresh_dir("grid3d_saved_2x2x2")
    run_ok(8, trainer_args(ref, 2, saved, ["-n", 2] + grid3d_flags(2, 2, 2, 1, zero=1), cfg=cfg), program=D3)
    for name, ranks, B, flags in (("1x1x1", 1, 8, grid3d_flags(1, 1, 1)), ("1x2x4", 8, 4, grid3d_flags(1, 2, 4, 1))):
        d = fresh_dir("grid3d_resumed_" + name)
        for f in glob.glob(os.path.join(saved, "*_00000002*")):
            shutil.copy(f, d)
        out = run_ok(ranks, trainer_args(ref, B, d, ["-n", 3, "-y", 1] + flags, cfg=cfg), program=D3)
        assert "resumed from step 2" in out, out[-2000:]
        check_resumed_against_reference(ref, d, name, (3, 4, 5), cfg["steps"])


@test
def grid3d_resumes_cp_checkpoints_on_other_grids():
    """checkpoints of step 2 with cp = 2 resumed on other grids, steps 3-5 against the
    uninterrupted reference: train_gpt2_cp's (zigzag ring) on 2x2x1x1 (no cp: replicas and
    stages) and on 1x1x4x2 (cp = 4, contiguous all-gather, tp 2 with -sp); the 3D trainer's own
    on 1x2x2x2 with ZeRO-1 over dp x cp (-sp) on one rank. Every trainer gathers the state into
    the model file's layout, which no grid or split changes"""
    ref = reference_run()
    saved_cp = fresh_dir("grid3d_saved_cp2")
    run_ok(2, trainer_args(ref, 8, saved_cp, ["-n", 2]), program=CP)
    saved_3d = fresh_dir("grid3d_saved_1x2x2x2")
    run_ok(8, trainer_args(ref, 8, saved_3d, ["-n", 2] + grid3d_flags(1, 2, 2, 1, zero=1, cp=2)), program=D3)
    for name, saved, ranks, B, flags in (
            ("2x2x1x1", saved_cp, 4, 4, grid3d_flags(2, 2, 1)),
            ("1x1x4x2", saved_cp, 8, 8, grid3d_flags(1, 1, 2, 1, cp=4, cp_layout="contiguous", cp_comm="allgather")),
            ("1x1x1x1", saved_3d, 1, 8, grid3d_flags(1, 1, 1))):
        d = fresh_dir("grid3d_resumed_cp_" + name)
        for f in glob.glob(os.path.join(saved, "*_00000002*")):
            shutil.copy(f, d)
        out = run_ok(ranks, trainer_args(ref, B, d, ["-n", 3, "-y", 1] + flags), program=D3)
        assert "resumed from step 2" in out, out[-2000:]
        check_resumed_against_reference(ref, d, name, (3, 4, 5), REF["steps"])


@test
def grid3d_checkpoints_resume_across_schedules():
    """a checkpoint is the model file's layout whatever the schedule: one written under 1f1b at
    2x2x1 resumes under zbv (1x2x1) and dualpipev (2x2x1 with -pp_overlap), whose stages hold
    other layers (chunk 1 of stage s is virtual stage 2p - 1 - s) and one wte; one written under
    dualpipev resumes under 1f1b and on one rank. Steps 3-5 match the uninterrupted reference"""
    cfg = REF4_GPT2
    ref = reference_run(cfg)
    saved = {}
    for sched, dp in (("1f1b", 2), ("dualpipev", 2)):
        saved[sched] = fresh_dir("grid3d_saved_" + sched)
        run_ok(4, trainer_args(ref, 1, saved[sched], ["-n", 2] + grid3d_flags(dp, 2, 1, sched=sched), cfg=cfg), program=D3)
    for name, source, ranks, B, flags in (
            ("zbv_1x2x1", "1f1b", 2, 2, grid3d_flags(1, 2, 1, sched="zbv")),
            ("dualpipev_2x2x1", "1f1b", 4, 1, grid3d_flags(2, 2, 1, sched="dualpipev") + ["-pp_overlap", 1]),
            ("1f1b_1x2x1", "dualpipev", 2, 2, grid3d_flags(1, 2, 1)),
            ("1x1x1", "dualpipev", 1, 8, grid3d_flags(1, 1, 1))):
        d = fresh_dir("grid3d_resumed_sched_" + name)
        for f in glob.glob(os.path.join(saved[source], "*_00000002*")):
            shutil.copy(f, d)
        out = run_ok(ranks, trainer_args(ref, B, d, ["-n", 3, "-y", 1] + flags, cfg=cfg), program=D3)
        assert "resumed from step 2" in out, out[-2000:]
        check_resumed_against_reference(ref, d, name, (3, 4, 5), cfg["steps"])


@test
def grid3d_resume_on_the_same_grid_is_bit_identical_samples_included():
    """2x2x2 with -sp and ZeRO-1, samples every 2 steps: resumed from the checkpoint of step 3, the
    log, the samples (the last stage draws them: its rng must be the one checkpointed) and the
    final weights equal the uninterrupted run's bit for bit"""
    ref = reference_run()
    args = lambda d, extra=(): trainer_args(ref, 2, d, ["-n", 3, "-v", 2, "-m", 2, "-s", 2, "-g", 6] + list(extra)
                                            + grid3d_flags(2, 2, 2, 1, zero=1))
    full = fresh_dir("grid3d_resume_full")
    full_out = run_ok(8, args(full), program=D3)
    part = fresh_dir("grid3d_resume_part")
    for f in glob.glob(os.path.join(full, "*_00000003*")) + [os.path.join(full, "main.log")]:
        shutil.copy(f, part)
    part_out = run_ok(8, args(part, ["-y", 1]), program=D3)
    assert "resumed from step 3" in part_out, part_out[-2000:]
    check_resumed_equals_full(full, full_out, part, part_out, 3, REF["steps"])


def check_grid3d_bad_layout(ranks, extra, message):
    """a grid that does not fit: the message on every rank's behalf, a non-zero exit, no files"""
    ref = reference_run(REF4)
    out_dir = os.path.join(fresh_dir("grid3d_bad_layout"), "out")
    code, out = mpirun(ranks, trainer_args(ref, 4, out_dir, extra, cfg=REF4), timeout=60, program=D3)
    assert code != 0, "exit code 0\n" + out[-2000:]
    assert message in out, "message %r not in output:\n%s" % (message, out[-2000:])
    assert not os.path.exists(out_dir), "the failed run created %s" % out_dir


@test
def compare_with_pytorch_fails_when_the_trainer_fails():
    """dev/compare_with_pytorch.py exits 1 with FAIL and the trainer's error when the trainer
    stops (here a grid that does not fit), and with a message when --vocab does not fit the
    tokens; its PASS path runs in the emulator's 3D test"""
    cmd = [sys.executable, "dev/compare_with_pytorch.py", "--layers", 1, "--steps", 1, "--ranks", 2,
           "--out", fresh_dir("compare_tool"), D3, "--", "-tp", 3, "-b", 8]
    p = subprocess.run([str(c) for c in cmd], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=TIMEOUT)
    report = p.stdout.decode("utf-8", "replace")
    assert p.returncode == 1 and "FAIL: the trainer exited with status" in report and "-tp 3" in report, report[-3000:]
    # and a reference it cannot build: a message naming the flag, nothing written
    for flags, message in ((["--vocab", 100], "token 9203 at position 0 is outside the model's vocabulary of 100"),
                           (["--vocab", 0], "--vocab 0: expected a vocabulary of at least 1 token")):
        out = fresh_dir("compare_tool_vocab")
        cmd = [sys.executable, "dev/compare_with_pytorch.py", "--steps", 1, "--out", out] + flags + ["./train_gpt2_dp"]
        p = subprocess.run([str(c) for c in cmd], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=TIMEOUT)
        report = p.stdout.decode("utf-8", "replace")
        assert p.returncode != 0 and message in report, report[-3000:]
        assert not glob.glob(os.path.join(out, "reference", "*")), "files written: %s" % glob.glob(os.path.join(out, "*", "*"))


@test
def grid3d_bad_layouts():
    check_grid3d_bad_layout(4, ["-dp", 2, "-pp", 2, "-tp", 2], "-dp 2 x -pp 2 x -tp 2 = 8 ranks, but the job has 4")
    check_grid3d_bad_layout(6, ["-pp", 2, "-tp", 2], "-pp 2 x -tp 2 = 4 does not divide the 6 ranks")
    check_grid3d_bad_layout(3, ["-tp", 3], "-tp 3: tensor parallelism splits the heads NH = 4")
    check_grid3d_bad_layout(3, ["-pp", 3], "the model's L = 4 layers cannot be split into pp x vp = 3 x 1 = 3 equal chunks")
    check_grid3d_bad_layout(2, ["-pp", 2, "-sched", "interleaved", "-vp", 4], "pp x vp = 2 x 4 = 8 equal chunks")
    check_grid3d_bad_layout(2, ["-tp", 2, "-sp", 1, "-t", 31], "-sp 1 splits the tokens over the 2 tp ranks: -t 31")
    check_grid3d_bad_layout(2, ["-dp", 2, "-b", 3], "-d 256 must be a positive multiple of B*T*dp = 3*32*2 = 192")
    # the fourth axis: the grid, the split of T (zigzag: 2 cp chunks), -sp on each rank's T/cp, the two names
    check_grid3d_bad_layout(4, ["-dp", 2, "-cp", 2, "-tp", 2], "-dp 2 x -pp 1 x -cp 2 x -tp 2 = 8 ranks, but the job has 4")
    check_grid3d_bad_layout(6, ["-cp", 4], "-pp 1 x -cp 4 x -tp 1 = 4 does not divide the 6 ranks")
    check_grid3d_bad_layout(4, ["-cp", 2, "-tp", 2, "-t", 30],
                            "-t 30: the zigzag split cuts each sequence into 4 chunks (2 cp, over the 2 cp ranks), so T must divide by 4")
    check_grid3d_bad_layout(4, ["-cp", 2, "-tp", 2, "-sp", 1, "-t", 34, "-cp_layout", "contiguous"],
                            "-sp 1 splits each rank's T/cp = 17 tokens over the 2 tp ranks: -t 34 must be a multiple of 4")
    check_grid3d_bad_layout(2, ["-cp", 2, "-cp_layout", "diagonal"], "-cp_layout diagonal: expected zigzag or contiguous")
    check_grid3d_bad_layout(2, ["-cp", 2, "-cp_comm", "broadcast"], "-cp_comm broadcast: expected ring or allgather")


@test
def grid3d_bad_inputs():
    # (at 2 ranks the grid is 2 x 1 x 1: both ranks read their own micro-batches)
    run_bad_inputs_concurrently(D3, messages={"batch_tokens_overflow_int": "-d 64 must be a positive multiple of B*T*dp = 4194304*1024*2 = 8589934592"})


@test
def grid3d_sampling_validation_and_timeline():
    """samples and validation pass through a 1x2x2 grid with -sp (the sequence padded to tp);
    the timeline of replica 0's pipe is printed"""
    d = fresh_dir("grid3d_sample")
    out = run_ok(4, ["-e", "d2", "-b", 2, "-t", 32, "-d", 128, "-x", 2, "-v", 1, "-m", 2, "-s", 2, "-g", 9, "-timeline", 1,
                     "-o", d] + grid3d_flags(1, 2, 2, 1), program=D3)
    assert "---- sample at step 2 ----" in out and "val loss" in out, out[-2000:]
    assert "timeline of step 2, measured" in out, out[-2000:]
    _, val = read_log(d)
    assert abs(val[0]["val_loss"] - np.log(50257)) < 0.2, val[0]


@test
def grid3d_with_cp_validates_and_samples_as_one_process():
    """on 1x2x2x1 (two stages, each sequence split over two cp ranks, zigzag) validation averages
    the cp ranks' token means and samples are drawn with the positions split (the last stage's
    owner of each position draws, then the pipe hears it): the validation loss equals one DP
    process's on the same run within 1e-5 (fp32 summation orders), and the samples are its tokens"""
    ref = reference_run(REF4)
    runs = {}
    for name, ranks, program, flags in (("dp", 1, "./train_gpt2_dp", []), ("3d", 4, D3, grid3d_flags(1, 2, 1, cp=2))):
        d = fresh_dir("grid3d_cp_sample_" + name)
        out = run_ok(ranks, trainer_args(ref, 8, d, ["-x", 2, "-v", 2, "-m", 2, "-s", 2, "-g", 12] + flags, cfg=REF4),
                     program=program)
        sample = re.search(r"---- sample at step 2 ----\n(.*?)\n----------------", out, re.S)
        assert sample, out[-2000:]
        runs[name] = (read_log(d)[1][2]["val_loss"], sample.group(1))
    assert abs(runs["dp"][0] - runs["3d"][0]) <= 1e-5, runs
    assert runs["dp"][1] == runs["3d"][1], runs


@test
def grid3d_one_rank_failing_stops_all_ranks():
    check_one_rank_failing("grid3d_one_rank_fails", D3)


@test
def grid3d_nonfinite_loss_stops_before_writing_the_step():
    check_nonfinite_stops(D3)


# ---------------------------------------------------------------------------------------------
# Context parallelism (train_gpt2_cp): every sequence split over the ranks, attention by a ring of
# K,V blocks or one all-gather; the same model as one process trains, bytes as the formula says

CP = "./train_gpt2_cp"


def cp_step_bytes(cfg, B, cp, accum, allgather, P, X=4):
    """{kind: bytes} one rank moves in a step, from the rule (not from the trainer): per layer and
    micro-batch, blocks of K,V of B T/cp 2C values of X bytes; the ring sends cp - 1 of them forward and
    again backward, with cp blocks of dK,dV; the all-gather variant gathers cp blocks forward and
    backward and reduce-scatters cp blocks of dK,dV (fp32 always). Then the gradients' all-reduce,
    P values of X bytes, and the loss's, one float"""
    L, C, T = cfg["layers"], cfg["channels"], cfg["seq_len"]
    block = B * (T // cp) * 2 * C
    b = {"all_reduce": X * P + 4}
    if cp > 1 and allgather:
        b.update(all_gather=accum * L * 2 * cp * block * X, reduce_scatter=accum * L * cp * block * 4)
    elif cp > 1:
        ring = accum * L * (2 * (cp - 1) * block * X + cp * block * 4)
        b.update(send=ring, recv=ring)
    return b


def cp_link_bytes(b, cp):
    """what a CP rank puts on the link in a step, from the payloads b (cp_step_bytes): a ring
    all-reduce sends 2 (cp-1)/cp of its payload, an all-gather or a reduce-scatter (cp-1)/cp, and
    the K,V ring's sends go whole"""
    share = (cp - 1) / cp
    return 2 * share * b["all_reduce"] + share * (b.get("all_gather", 0) + b.get("reduce_scatter", 0)) + b.get("send", 0)


def check_link_bytes(out, train, want):
    """every step's ring_bytes in main.log (the step line's "ring", the "moving" share's bytes)
    and the "on the link" line the trainer prints at the start equal `want`, the formula's; main.log
    and the start line round to a whole byte"""
    for step, rec in train.items():
        assert abs(rec["ring_bytes"] - want) <= 1, "step %d: %.0f bytes on the link, the formula gives %.1f" % (
            step, rec["ring_bytes"], want)
    if want:
        printed = re.search(r"^  on the link +(\d+) bytes", out, re.M)
        assert printed and abs(int(printed.group(1)) - want) <= 1, "the start's 'on the link' line: %s, formula %.1f" % (
            printed and printed.group(0), want)


def cp_run(cp, split, comm, accum, cfg, extra=()):
    """one CP run against the reference: losses, step-0 gradients, final weights, the bytes of
    every step, the replicas identical, dev/memory_planner's table and the measured high-water
    mark; returns its output"""
    ref = reference_run(cfg)
    B = cfg["batch"] // accum
    d = fresh_dir("cp%d_%s_%s_accum%d" % (cp, split, comm, accum))
    grads_path = os.path.join(d, "grads.bin")
    args = trainer_args(ref, B, d, ["-n", cfg["steps"], "-dump_grads", grads_path, "-cp_layout", split, "-cp_comm", comm,
                                    "-check_replicas", 1] + list(extra), cfg=cfg)
    out = run_ok(cp, args, program=CP)
    check_planner_matches_trainer(CP, cp, args, out)  # (the planner's table is the trainer's)
    P = len(reference.read_model_file(os.path.join(ref["dir"], "final.bin"))[1])
    expected = cp_step_bytes(cfg, B, cp, accum, comm == "allgather", P)
    check_against_reference(ref, d, grads_path, sum(expected.values()), "the sum of %s" % expected, cfg["steps"])
    train, _ = read_log(d)
    got = {k: n for kinds in train[1]["comm"].values() for k, n in kinds.items() if n}
    assert got == expected, "step 1 moved %s, the rule gives %s" % (got, expected)
    check_link_bytes(out, train, cp_link_bytes(expected, cp))
    if cp > 1:
        assert "step %d: replicas identical" % cfg["steps"] in out, out[-2000:]
    return out


def make_cp_test(cp, split, comm, accum, cfg):
    def fn():
        out = cp_run(cp, split, comm, accum, cfg)
        # each rank's attention work (score products a step) from the rule: per chunk pair,
        # len^2 where the keys come first, len (len + 1) / 2 on the diagonal, none after;
        # zigzag gives every rank the same, contiguous rank r r len^2 + len (len + 1) / 2; per
        # sequence, head, layer and micro-batch
        work = dict((int(r), float(w)) for r, w in re.findall(r"^rank (\d+): attention work (\d+)", out, re.M))
        B, T, NH = cfg["batch"] // accum, cfg["seq_len"], cfg["heads"]
        n = 2 if split == "zigzag" else 1
        ln = T // (n * cp)
        chunks = lambda r: [r, 2 * cp - 1 - r][:n]  # noqa: E731
        tile = lambda q, k: ln * ln if k < q else ln * (ln + 1) // 2 if k == q else 0  # noqa: E731
        want = {r: accum * cfg["layers"] * B * NH * sum(tile(q, k) for q in chunks(r) for j in range(cp) for k in chunks(j)) for r in range(cp)}
        assert work == want, "attention work per rank %s, the rule gives %s" % (work, want)
    fn.__name__ = "cp_vs_pytorch_cp%d_%s_%s_accum_%d%s" % (cp, split, comm, accum, "_3_heads" if cfg is REF3 else "")
    return fn


# T = 32 splits into 2 cp chunks for cp = 2 and 4; T = 24 (REF3) for cp = 3
for _cp, _split, _comm, _accum, _cfg in [(1, "zigzag", "ring", 1, REF), (1, "contiguous", "allgather", 1, REF),
                                         (2, "zigzag", "ring", 1, REF),
                                         (2, "contiguous", "allgather", 2, REF), (3, "zigzag", "allgather", 1, REF3),
                                         (3, "contiguous", "ring", 2, REF3), (4, "zigzag", "ring", 2, REF),
                                         (4, "contiguous", "ring", 1, REF), (4, "zigzag", "allgather", 1, REF)]:
    test(make_cp_test(_cp, _split, _comm, _accum, _cfg))


@test
def cp_recompute_is_bit_identical():
    """-r 1 and -r 2 (the ring runs again before each layer's backward) train bit for bit as -r 0"""
    ref = reference_run()
    logs = []
    for r in (0, 1, 2):
        d = fresh_dir("cp_r%d" % r)
        run_ok(2, trainer_args(ref, 8, d, ["-x", 2, "-r", r]), program=CP)
        logs.append([(s["train_loss"], s["grad_norm"]) for _, s in sorted(read_log(d)[0].items())])
    assert logs[0] == logs[1] == logs[2], logs


@test
def cp_resume_is_bit_identical():
    check_resume(lambda args, d: run_ok(2, args, program=CP), "cp_resume", 8)


@test
def cp_checkpoint_of_cp2_resumes_at_cp1_and_cp4():
    """a cp = 2 run (zigzag ring) checkpoints step 2; resumed on one rank and on cp = 4 (contiguous,
    all-gather: other tokens per rank, another variant), steps 3-5 still match the uninterrupted
    reference: the state is gathered in the model file's layout, which no split changes"""
    ref = reference_run()
    saved = fresh_dir("cp_saved_cp2")
    run_ok(2, trainer_args(ref, 8, saved, ["-n", 2]), program=CP)
    for ranks, flags in ((1, []), (4, ["-cp_layout", "contiguous", "-cp_comm", "allgather"])):
        d = fresh_dir("cp_resumed_cp%d" % ranks)
        for f in glob.glob(os.path.join(saved, "*_00000002*")):
            shutil.copy(f, d)
        out = run_ok(ranks, trainer_args(ref, 8, d, ["-n", 3, "-y", 1] + flags), program=CP)
        assert "resumed from step 2" in out, out[-2000:]
        check_resumed_against_reference(ref, d, "cp=%d" % ranks, (3, 4, 5), REF["steps"])


@test
def cp_model_file_loads_in_the_dp_trainer_and_samples():
    """the model file of a cp = 2 run is llm.c's: the DP trainer measures the validation loss the
    cp run measured (the same tokens, split or not); samples are drawn with the sequence split"""
    ref = reference_run()
    d = fresh_dir("cp_file")
    out = run_ok(2, trainer_args(ref, 8, d, ["-x", 2, "-n", 2, "-v", 2, "-m", 2, "-s", 2, "-g", 12]), program=CP)
    assert "---- sample at step 2 ----" in out, out[-2000:]
    val_cp = read_log(d)[1][2]["val_loss"]
    e = fresh_dir("cp_file_load")
    run_ok(1, trainer_args(ref, 8, e, ["-e", os.path.join(d, "model_00000002.bin"), "-x", 0, "-v", 1, "-m", 2]))
    val_dp = read_log(e)[1][0]["val_loss"]
    # fp32 sums in another order over 2 x 8 x 32 tokens: 1e-5 relative is ~150 ulps of a loss ~7
    assert abs(val_dp - val_cp) <= 1e-5 * abs(val_dp), "val loss %r at cp=2, %r in the DP trainer" % (val_cp, val_dp)


@test
def cp_bad_inputs():
    """the common bad inputs as every trainer, and CP's own: each rank stops with the message and
    nothing is written"""
    run_bad_inputs_concurrently(CP, messages=TP_MESSAGES)
    d = fresh_dir("cp_flags")
    base = ["-e", "d2", "-i", REF["tokens"], "-b", 2, "-x", 2, "-v", 0, "-s", 0, "-o", os.path.join(d, "out")]
    for ranks, args, message in ((3, ["-t", 32], "-t 32: the zigzag split cuts each sequence into 6 chunks (2 cp, over the 3 cp ranks), so T must divide by 6"),
                                 (3, ["-t", 32, "-cp_layout", "contiguous"], "so T must divide by 3"),
                                 (2, ["-t", 32, "-cp_layout", "stripes"], "-cp_layout stripes: expected zigzag or contiguous"),
                                 (2, ["-t", 32, "-cp_comm", "tree"], "-cp_comm tree: expected ring or allgather"),
                                 (2, ["-t", 32, "-cp", 4], "-cp 4: this trainer puts every rank in one context-parallel group")):
        code, out = mpirun(ranks, base + args, timeout=60, program=CP)
        assert code != 0 and message in out, "%s: exit %d, %r not in:\n%s" % (args, code, message, out[-2000:])
        assert not os.path.exists(os.path.join(d, "out")), "%s left its output dir behind" % args


# ---------------------------------------------------------------------------------------------
# Activation recomputation (-r 1 selective, -r 2 full): the dropped activations are computed again
# by the same kernels from the same inputs, so every bit of the run must equal -r 0's, while the
# activations take less memory. Each trainer at 2 ranks (3D: a 1x2x2 grid), on the CPU backend
# and under the emulator in bf16.

# dev/memory_planner's flags, the trainers' names for the same things
PLANNER_FLAGS = {"-e", "-b", "-t", "-d", "-n", "-z", "-sp", "-r", "-offload", "-overlap", "-sched", "-vp", "-dp", "-pp", "-tp",
                 "-cp", "-cp_comm", "-cp_layout", "-experts", "-topk", "-ep", "-capacity_factor"}


def check_planner_matches_trainer(program, ranks, args, out, attention=None):
    """dev/memory_planner, a CPU program, given a run's flags and the machine it ran on: it prints
    the very memory table the trainer printed (rank 0's rows, byte for byte), and its total is the
    run's measured high-water mark within 5%: the planner shares the trainers' accounting
    (llmc/memory_plan.h) and counts a CUDA bf16 run's buffers without its build"""
    trainer = os.path.basename(program)[len("train_gpt2_"):]
    flags = ["-trainer", trainer, "-stage", 0]
    pairs = dict(zip([str(a) for a in args[0::2]], args[1::2]))
    flags += [x for f, v in pairs.items() if f in PLANNER_FLAGS for x in (f, v)]
    if trainer in ("dp", "tp", "pp", "cp"):
        flags += ["-" + trainer, ranks]
    elif trainer in ("diloco", "ep"):  # (every rank a replica of what is not split, as DDP's)
        flags += ["-dp", ranks]
    elif "-dp" not in pairs:  # the 3D trainer's default: the ranks that pp x cp x tp leave
        flags += ["-dp", ranks // (int(pairs.get("-pp", 1)) * int(pairs.get("-cp", 1)) * int(pairs.get("-tp", 1)))]
    precision = "bf16" if "emu_BF16" in program else "fp32"
    flags += ["-device", "cuda" if "emu_" in program else "cpu", "-precision", precision]
    if attention:
        flags += ["-attention", attention]
    p = subprocess.run([os.path.join(ROOT, "dev", "memory_planner")] + [str(f) for f in flags], cwd=ROOT,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    planned = p.stdout.decode()
    assert p.returncode in (0, 1), "memory_planner %s: exit %d\n%s" % (flags, p.returncode, planned)

    def table(text):
        lines = text.splitlines()
        first = next(i for i, l in enumerate(lines) if l.startswith("  parameters "))
        last = next(i for i, l in enumerate(lines) if l.startswith("  host buffers "))
        return lines[first:last + 1]
    assert table(planned) == table(out), "memory_planner %s printed\n%s\nthe trainer\n%s" % (
        " ".join(str(f) for f in flags), "\n".join(table(planned)), "\n".join(table(out)))
    total = float(re.search(r"^  total +([\d.]+) MB", planned, re.M).group(1)) * 1e6
    peak = int(re.search(r"high-water mark (\d+) bytes allocated", out).group(1))
    # (the table prints MB to one decimal: 0.05 MB of rounding, far inside 5%)
    assert abs(peak - total) <= 0.05 * total, "memory_planner %s: %.0f bytes, the run's high-water mark %d" % (flags, total, peak)
    check_memory_table_total(program, out)


def check_memory_table_total(program, out):
    """the run's memory table total (predicted) against the high-water mark its allocator measured
    (llmc/allocations.h): within 5% for a CUDA build (its workspace and scratch beside the
    table's buffers), and on the CPU backend to the byte: there every buffer the table
    counts is live at once at the mark, so a wrong term of any size fails, not only one over 5%"""
    peak, predicted = map(int, re.search(r"high-water mark (\d+) bytes allocated, predicted (\d+)", out).groups())
    if "emu_" in program or "cuda_" in program:
        assert abs(peak - predicted) <= 0.05 * predicted, "%d bytes allocated at most, %d predicted" % (peak, predicted)
    else:
        assert peak == predicted, "%s: high-water mark %d bytes allocated, the memory table's total %d (%+d)" % (
            program, peak, predicted, peak - predicted)


def variant_run(name, program, ranks, flags, cfg, B, variant, run=None):
    """one run with the variant's flags (-r or -offload): (its log's losses and norms, its files'
    bytes, each step's comm bytes, the high-water mark of its device memory), after checking that
    mark against the memory table's prediction"""
    ref = reference_run(cfg)
    d = fresh_dir("%s_%s" % (name, "".join(str(x) for x in variant).replace("-", "")))
    args = trainer_args(ref, B, d, list(flags) + list(variant) + ["-n", cfg["steps"]], cfg=cfg)
    out = run(program, ranks, args, d) if run else run_ok(ranks, args, program=program)
    train, _ = read_log(d)
    files = {}
    for path in sorted(glob.glob(os.path.join(d, "*.bin"))):
        with open(path, "rb") as f:
            files[os.path.basename(path)] = f.read()
    assert files, "no model or state files in " + d
    peak = int(re.search(r"high-water mark (\d+) bytes allocated", out).group(1))
    check_planner_matches_trainer(program, ranks, args, out, getattr(run, "attention", None))
    if variant[:1] == ["-r"] and variant[1] > 0:
        assert train[1]["recompute_ms"] > 0, "%s: no recompute time in main.log: %s" % (variant, train[1])
    history = [(s, train[s]["train_loss"], train[s]["grad_norm"]) for s in sorted(train)]
    return history, files, [train[s]["comm_bytes"] for s in sorted(train)], peak


def check_variants_bit_identical(name, program, ranks, flags, cfg, B, variants, run=None, extra_bytes=None):
    """every variant against the first: the same losses and norms, the same model and state files
    bit for bit, and less device memory (the high-water mark). extra_bytes(variant): what it adds
    to each step's collectives (-r 2 under tensor parallelism repeats a layer's forward ones)"""
    base = variant_run(name, program, ranks, flags, cfg, B, variants[0], run)
    for variant in variants[1:]:
        history, files, comm, peak = variant_run(name, program, ranks, flags, cfg, B, variant, run)
        assert history == base[0], "%s: losses or norms differ from %s:\n%s\n%s" % (variant, variants[0], history, base[0])
        assert sorted(files) == sorted(base[1]), "%s wrote %s, %s %s" % (variant, sorted(files), variants[0], sorted(base[1]))
        for f in files:
            assert files[f] == base[1][f], "%s: %s differs from %s's" % (variant, f, variants[0])
        assert peak < base[3], "%s: %d bytes at most, not below %s's %d" % (variant, peak, variants[0], base[3])
        added = extra_bytes(variant) if extra_bytes else 0
        assert comm == [c + added for c in base[2]], "%s: %s bytes per step, %s %s + %d" % (variant, comm, variants[0], base[2], added)


def check_recompute_bit_identical(name, program, ranks, flags, cfg, B, levels=(0, 1, 2), run=None, extra_bytes=None):
    """-r 1 and 2 against -r 0: recomputation changes where activations live, not one bit"""
    check_variants_bit_identical(name, program, ranks, flags, cfg, B, [["-r", r] for r in levels], run,
                                 extra_bytes and (lambda v: extra_bytes(v[1])))


def rerun_tp_bytes(cfg, B, accum, sp, X=4):
    """-r 2 reruns each layer's forward before its backward, with its collectives up to the MLP:
    attproj's sum (one B T C all-reduce; with -sp a reduce-scatter and the two all-gathers of ln1
    and ln2), L layers per micro-batch; -r 1 reruns none"""
    a = B * cfg["seq_len"] * cfg["channels"] * X
    return lambda r: (3 if sp else 1) * cfg["layers"] * accum * a if r == 2 else 0


@test
def recompute_dp_zero3_accumulation_is_bit_identical():
    """ZeRO-3 with 2 micro-batches: the rerun (-r 2) uses the parameters gathered for the backward"""
    check_recompute_bit_identical("recompute_dp", "./train_gpt2_dp", 2, ["-z", 3], REF, 2)


@test
def recompute_tp_sp_is_bit_identical_and_repeats_the_collectives():
    check_recompute_bit_identical("recompute_tp", TP, 2, ["-sp", 1], REF, 4, extra_bytes=rerun_tp_bytes(REF, 4, 2, 1))


@test
def recompute_pp_zb_and_interleaved_are_bit_identical():
    """zero bubble's W reads what B left in the slot; interleaving holds 2 chunks per stage"""
    check_recompute_bit_identical("recompute_pp_zb", PP, 2, ["-sched", "zb"], REF4, 2)
    check_recompute_bit_identical("recompute_pp_interleaved", PP, 2, ["-sched", "interleaved", "-vp", 2], REF4, 2, levels=(0, 2))


@test
def recompute_grid3d_1x2x2_sp_is_bit_identical_and_repeats_the_collectives():
    # rank 0's tp group: stage 0's 2 layers per micro-batch, m = 4 micro-batches of B = 2
    tp_bytes = rerun_tp_bytes(dict(REF4, layers=2), 2, 4, 1)
    check_recompute_bit_identical("recompute_3d", D3, 4, grid3d_flags(1, 2, 2, sp=1), REF4, 2, extra_bytes=tp_bytes)


@test
def recompute_grid3d_with_cp_is_bit_identical_and_repeats_the_ring():
    """1x1x2x2 with -sp: -r 2 reruns each layer's forward, its tp collectives (on T/cp = 16 tokens)
    and the ring's K,V blocks (B T/cp 2C/tp, cp - 1 of them each way per layer and micro-batch);
    -r 1 keeps lse (flash's state), so nothing is rerun over cp"""
    cp, tp, B, m, L = 2, 2, 2, 4, REF4["layers"]
    cfg = dict(REF4, seq_len=REF4["seq_len"] // cp)
    tp_bytes = rerun_tp_bytes(cfg, B, m, 1)
    ring = lambda r: 2 * m * L * (cp - 1) * B * cfg["seq_len"] * 2 * (REF4["channels"] // tp) * 4 if r == 2 else 0  # noqa: E731
    check_recompute_bit_identical("recompute_3d_cp", D3, 4, grid3d_flags(1, 1, tp, sp=1, cp=cp), REF4, B,
                                  extra_bytes=lambda r: tp_bytes(r) + ring(r))


@test
def offload_is_bit_identical_for_every_zero_stage():
    """-offload 1: AdamW on the host over host-memory master weights and moments, the same
    arithmetic as the device's, so each -z gives -offload 0's run bit for bit, with the optimizer
    state off the device"""
    for zero in (0, 1, 2, 3):
        check_variants_bit_identical("offload_z%d" % zero, "./train_gpt2_dp", 2, ["-z", zero], REF, 2,
                                     [["-offload", 0], ["-offload", 1]])


@test
def emu_offload_bf16_zero1_and_zero3():
    """bf16 under the emulator, 2 GPUs over NCCL: the host's AdamW rounds stochastically with the
    kernel's own bits from the fp32 master weights in host memory, and the gradients go to the
    host on a copy stream. The emulator compiles the kernel's arithmetic with the host's compiler,
    so the runs agree bit for bit (a GPU's fused multiply-adds may move the last bit of a master
    weight, within bf16's bounds)"""
    (program,) = build("emu", "BF16", ["train_gpt2_dp"])
    for zero in (1, 3):
        check_variants_bit_identical("emu_offload_z%d" % zero, program, 2, ["-z", zero, "-x", 2], REF_CUDA, 2,
                                     [["-offload", 0], ["-offload", 1]], run=emu_runner(2))


# dev/memory_planner on its own: the layouts it lists and the inputs it refuses. Its tables are
# checked against the trainers' runs above (check_planner_matches_trainer, in every variant_run).

def planner(*flags):
    p = subprocess.run([os.path.join(ROOT, "dev", "memory_planner")] + [str(f) for f in flags], cwd=ROOT,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    return p.returncode, p.stdout.decode()


@test
def memory_planner_search_lists_the_layouts_that_fit_smallest_first():
    """d48 (GPT-2 XL, 1.56B parameters) on 8 devices of 12 GB, micro-batch 4 x 1024, CUDA bf16:
    every row fits and the rows are sorted; each row's total is what the planner gives for that
    layout alone; none splits the heads over tp ranks (NH = 25 divides by none of 2, 4, 8); and
    the model states follow the ZeRO paper's arithmetic: 16 bytes per parameter for DDP, and
    under ZeRO-3 16 / 8 per parameter of the padded model"""
    L, C, NH, V, Vp, T = 48, 1600, 25, 50257, 50304, 1024
    P = Vp * C + T * C + L * (12 * C * C + 13 * C) + 2 * C  # the GPT-2 parameter count (wte padded)
    code, out = planner("-e", "d48", "-b", 4, "-t", 1024, "-search", 8, "-mem", 12)
    assert code == 0, out
    # (total, states, activations, other, host; the predicted step and tokens/s; the layout)
    rows = re.findall(r"^ +([\d.]+) +([\d.]+) +([\d.]+) +([\d.]+) +([\d.]+) +(?:[\d.]+|-) +(?:\d+|-)  (train_gpt2_\S+.*) "
                      r"\(m=(\d+)\)$", out, re.M)
    assert len(rows) >= 10, out
    totals = [float(r[0]) for r in rows]
    assert totals == sorted(totals) and max(totals) <= 12.0, out
    assert not any(re.search(r"-tp [248]", r[5]) for r in rows), out
    for total, states, acts, other, host, layout, m in rows:
        flags = layout.split()
        name = flags[0][len("train_gpt2_"):]
        args = ["-e", "d48", "-b", 4, "-t", 1024, "-d", 4 * 1024 * 8, "-trainer", name] + flags[1:]
        if name == "dp":  # "train_gpt2_dp (8 ranks) ..."
            args = [a for a in args if a not in ("(8", "ranks)")] + ["-dp", 8]
        code, alone = planner(*args)
        assert code == 0, "%s: exit %d\n%s" % (args, code, alone)
        planned = float(re.search(r"^  total +([\d.]+) MB", alone, re.M).group(1)) / 1e3
        # the search prints GB to two decimals, the table MB to one
        assert abs(planned - float(total)) <= 0.006, "%s: %.3f GB alone, %s GB in the list" % (layout, planned, total)
    # the states column: DDP keeps 2 + 2 + 4 + 8 bytes of every parameter on every device
    ddp = [r for r in rows if r[5].startswith("train_gpt2_dp") and "-z" not in r[5] and "-offload" not in r[5]]
    for r in ddp:
        assert abs(float(r[1]) - 16 * P / 1e9) <= 0.006, (r, 16 * P / 1e9)
    zero3 = [r for r in rows if "-z 3" in r[5] and "-offload" not in r[5]]
    assert zero3, out
    for r in zero3:
        # ZeRO-3 pads every bucket to a multiple of 8 x 128 elements: at most (L + 2) x 1024 more
        assert 16 * P / 8 / 1e9 - 0.006 <= float(r[1]) <= 16 * (P + (L + 2) * 1024) / 8 / 1e9 + 0.006, (r, 16 * P / 8 / 1e9)


@test
def memory_planner_refuses_bad_layouts_and_says_whether_it_fits():
    """a layout the trainers would refuse is refused with the reason (exit 1); a plan that does not
    fit in -mem exits 2 and says so"""
    cases = [(["-e", "d48", "-tp", 2], "the heads NH = 25"),
             (["-e", "d12", "-pp", 5], "L = 12 layers cannot be split"),
             (["-e", "d12", "-device", "tpu"], "-device tpu: expected cuda or cpu"),
             (["-e", "d12", "-device", "cpu", "-precision", "bf16"], "-device cpu trains in fp32 only"),
             (["-e", "d12", "-dp", 2, "-d", 1000], "-d 1000 must be a positive multiple"),
             (["-e", "d12", "-pp", 2, "-stage", 2], "-stage 2: the pipeline has stages 0..1"),
             (["-e", "d12", "-tp", 2, "-offload", 1], "-offload 1 is train_gpt2_dp's"),
             (["-e", "d12", "-t", 2048], "-t 2048 is longer than the model's maximum sequence length 1024"),
             (["-e", "12/768"], "-e 12/768: expected a descriptor dL (d12 = 124M, d48 = 1.5B), L/C/NH (48/1600/25), L/C/NH/maxT/V or a "
                                "model file, and no file has that name"),
             (["-e", "d0"], "-e 'd0' is neither a model file nor a descriptor"),
             (["-e", "12/768/12/2048/70000"], "-e 12/768/12/2048/70000: expected L/C/NH[/maxT[/V]], all positive, "
                                              "with NH dividing C and V <= 65536")]
    for flags, message in cases:
        code, out = planner(*flags)
        assert code == 1 and message in out, "%s: exit %d, expected '%s' in\n%s" % (flags, code, message, out)
    code, out = planner("-e", "d48", "-b", 32, "-t", 1024, "-dp", 8, "-mem", 80)
    assert code == 2 and "does not fit" in out, out  # (1 is an error)
    # a shape with its longest sequence and vocabulary: -t 2048 is no longer refused, and the
    # parameters are equation (2) of Narayanan et al. 2021 (12 l h^2 (1 + 13/(12 h) + (V + s)/(12 l h)))
    # plus the final LayerNorm's 2h, at V = 51200 (a multiple of 128: no padding rows)
    code, out = planner("-e", "2/256/4/2048/51200", "-b", 1, "-t", 2048, "-format", "json")
    l, h, V, s_ = 2, 256, 51200, 2048
    expected = 12 * l * h * h * (1 + 13 / (12 * h) + (V + s_) / (12 * l * h)) + 2 * h
    assert code == 0 and json.loads(out)["model"]["parameters"] == round(expected), (code, out[:400], expected)
    code, out = planner("-e", "d48", "-b", 32, "-t", 1024, "-dp", 8, "-z", 3, "-r", 2, "-mem", 80)
    assert code == 0 and "fits:" in out, out


# ---------------------------------------------------------------------------------------------
# dev/bench/roofline.py: a model, not a measurement, so its arithmetic is checked exactly here,
# against counts derived in the test from GPT-2's shapes (not read back from the tool's output);
# its prices are llmc/step_time.h's (dev/bench/step_kernels -profile), here on a profile file whose
# efficiencies the test chooses

# GPT-2 as llmc/gpt2.h builds a descriptor: d12 = 12 layers, 768 channels, 12 heads; the
# vocabulary 50257 padded to a multiple of 128; maxT 1024
ROOFLINE_GPT2 = dict(L=12, C=768, NH=12, V=50257, Vp=50304, maxT=1024)
# NVIDIA's datasheet numbers for the H100 SXM (dense): 989 TFLOP/s bf16, 67 fp32, 3.35 TB/s HBM3
ROOFLINE_H100 = dict(bf16=989e12, fp32=67e12, hbm=3.35e12)
# the efficiencies are the test's, in a profile file (llmc/device_profile.h's format), so that the
# test does not depend on the built-in profiles' numbers: GEMMs below 5e10 FLOPs at the small
# class's 0.6, above at 0.7; attention 0.5 of peak on its useful FLOPs; every kernel's bytes at 0.9
# of the HBM; NVLink's 300 GB/s at 0.8 and 2 us a message
ROOFLINE_EFF = dict(gemm_large=0.7, gemm_small=0.6, gemm_small_flops=5e10, attn=0.5, bw=0.9, link=300e9 * 0.8,
                    link_latency=2e-6)
ROOFLINE_PROFILE = """name test H100
kind cuda
peak_flops_fp32 67e12
peak_flops_bf16 989e12
memory_bandwidth_bytes_per_s 3.35e12
memory_bytes 80e9
efficiency_matmul_large 0.7
efficiency_matmul_small 0.6
matmul_small_flops 5e10
efficiency_attention 0.5
efficiency_memory 0.9
intra_node_latency_s 2e-6
intra_node_bandwidth_bytes_per_s 300e9
inter_node_latency_s 5e-6
inter_node_bandwidth_bytes_per_s 50e9
gpus_per_node 8
efficiency_link 0.8
"""


def roofline_profile():
    path = os.path.join(ROOT, "test", "tmp", "roofline_profile.txt")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(ROOFLINE_PROFILE)
    return path


def roofline_json(*flags):
    p = make(["dev/bench/step_kernels"])
    assert p.returncode == 0, p.stdout.decode()[-3000:]
    cmd = ["/usr/bin/python3", "dev/bench/roofline.py", "-device", "h100-sxm", "-json",
           "-profile", roofline_profile()] + [str(f) for f in flags]
    p = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=60)
    assert p.returncode == 0, "%s: exit %d\n%s" % (" ".join(cmd), p.returncode, p.stderr.decode()[-2000:])
    return json.loads(p.stdout)


# ---------------------------------------------------------------------------------------------
# dev/memory.html: dev/memory_planner compiled to WebAssembly, run by the page in a real browser
MEMORY_PAGE = os.path.join(ROOT, "dev", "memory.html")


def memory_page_build():
    """what dev/memory_page/build.py recorded in the page: {file: sha256} of its sources, ..."""
    with open(MEMORY_PAGE) as f:
        m = re.search(r"^const PLANNER_BUILD = (\{.*\});$", f.read(), re.M)
    assert m, "dev/memory.html holds no PLANNER_BUILD record: rebuild it with make memory-page"
    return json.loads(m.group(1))


@test
def memory_page_is_built_from_the_sources_in_the_tree():
    """the committed dev/memory.html records the SHA-256 of every project file its WebAssembly was
    built from (the planner, llmc's headers, the page's template): each must be the file's now, or
    the page is older than its C. Where the WebAssembly toolchain is here, the list itself is
    checked too (a header included since would be missing from it). And the page reaches for
    nothing outside itself: no URL to load, no fetch"""
    import hashlib
    build = memory_page_build()
    assert {"dev/memory_planner.c", "llmc/memory_plan.h", "llmc/model.h", "dev/memory_page/page.html"} <= set(build["sources"]), \
        sorted(build["sources"])
    stale = []
    for name, digest in sorted(build["sources"].items()):
        path = os.path.join(ROOT, name)
        if not os.path.exists(path) or hashlib.sha256(open(path, "rb").read()).hexdigest() != digest:
            stale.append(name)
    assert not stale, "dev/memory.html is older than %s: rebuild it with make memory-page" % ", ".join(stale)
    if tool("wasm") is not None:
        sys.path.insert(0, os.path.join(ROOT, "dev", "memory_page"))
        import build as page_build
        now = page_build.project_sources(page_build.compile_flags())
        assert set(now) == set(build["sources"]), "dev/memory.html was built from %s, the planner reads %s now: make " \
            "memory-page" % (sorted(build["sources"]), sorted(now))
    text = open(MEMORY_PAGE).read()
    outside = re.findall(r"""(?:src|href)=["']?(?:https?:)?//|\bfetch\(|XMLHttpRequest|\bimport\(|@import""", text)
    assert not outside, "dev/memory.html reaches outside itself: %s" % outside


class MemoryPageDom(html.parser.HTMLParser):
    """what a test reads of the page's DOM: the table's rows (label, bytes, kind), the total, the
    stages, the search's layouts, the status and each field's error"""
    def __init__(self):
        super().__init__()
        self.rows, self.stages, self.layouts, self.texts, self.state = [], [], [], {}, None
        self.open = []  # (tag, id) of the elements whose text is collected

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "data-label" in a:
            self.rows.append((a["data-label"], int(a["data-bytes"]), a["data-kind"]))
        if "data-stage" in a:
            self.stages.append(int(a["data-bytes"]))
        if "layout" in a.get("class", "").split():
            self.layouts.append(int(a["data-bytes"]))
        if a.get("id") == "status":
            self.state = a.get("data-state")
        if a.get("id") in ("status", "command", "build") or a.get("id", "").startswith("error-"):
            self.open.append((tag, a["id"]))
            self.texts[a["id"]] = ""
        elif self.open:
            self.open.append((tag, None))

    def handle_endtag(self, tag):
        if self.open:
            self.open.pop()

    def handle_data(self, data):
        for _, name in self.open:
            if name:
                self.texts[name] += data


def memory_page_layouts():
    """planner command lines (a flag name and value each) spread over every trainer and option:
    DP with each ZeRO stage, -offload, -overlap, -r and checkpoints; TP with and without -sp;
    pipelines under each schedule; 3D grids with ZeRO-1, -sp and cp; CP with each comm and split;
    DiLoCo; MoE with ep and capacity; both backends and precisions, cuBLAS attention, memory sizes,
    L/C/NH models; a chosen pipeline stage; refusals of each kind; searches"""
    layouts = []
    add = lambda **kw: layouts.append([(k, str(v)) for k, v in kw.items()])  # noqa: E731
    for e in ("d12", "d48"):
        for z in range(4):
            for r in range(3):
                add(e=e, b=4, t=1024, dp=8, z=z, r=r)
            add(e=e, b=2, t=1024, dp=4, z=z, offload=1)
            add(e=e, b=4, t=512, dp=2, z=z, overlap=0, n=100)
    for dp in (1, 2, 16):
        add(e="d24", b=8, t=1024, dp=dp, d=8 * 1024 * dp * 4)
    for e in ("24/1024/16", "36/1280/20", "48/1600/25", "6/384/6"):
        add(e=e, b=8, t=1024, dp=4, z=1, r=1)
    for e in ("24/1024/16", "36/1280/20", "48/1600/16", "6/384/6"):  # (a head of 100: cuBLAS attention)
        add(e=e, b=4, t=512, tp=2, sp=1)
    for e in ("d12", "d36"):
        for tp in (2, 4):
            for sp in (0, 1):
                for r in range(3):
                    add(e=e, b=4, t=1024, tp=tp, sp=sp, r=r)
    for pp, e in ((2, "d12"), (4, "d24"), (4, "d48")):
        for sched in ("afab", "1f1b", "zb"):
            add(e=e, b=4, t=1024, pp=pp, sched=sched, d=4 * 1024 * 8)
            add(e=e, b=2, t=1024, pp=pp, sched=sched, d=2 * 1024 * 16, r=2)
        add(e=e, b=4, t=1024, pp=pp, sched="interleaved", vp=2, d=4 * 1024 * 8)
        add(e=e, b=4, t=1024, pp=pp, sched="1f1b", d=4 * 1024 * 8, stage=pp - 1)
    for dp, tp, pp in ((2, 2, 2), (2, 1, 2), (1, 2, 2), (4, 2, 1), (2, 4, 2)):
        for z in (0, 1):
            for sp in (0, 1):
                add(e="d36", b=4, t=1024, dp=dp, tp=tp, pp=pp, z=z, sp=sp, trainer="3d", d=4 * 1024 * dp * 4)
        if pp > 1:
            add(e="d24", b=2, t=1024, dp=dp, tp=tp, pp=pp, sched="interleaved", vp=2, trainer="3d", d=2 * 1024 * dp * 8, r=1)
    for cp in (2, 4):
        for comm in ("ring", "allgather"):
            for split in ("zigzag", "contiguous"):
                add(e="d12", b=4, t=1024, cp=cp, cp_comm=comm, cp_layout=split)
                add(e="d24", b=1, t=1024, cp=cp, cp_comm=comm, cp_layout=split, r=1)
        add(e="d36", b=2, t=1024, dp=2, tp=2, cp=cp, sp=1, z=1, trainer="3d", d=2 * 1024 * 2 * 2)
        add(e="d24", b=2, t=1024, pp=2, cp=cp, trainer="3d", d=2 * 1024 * 4)
    for dp in (2, 4, 8):
        add(e="d12", b=4, t=1024, dp=dp, trainer="diloco")
        add(e="d36", b=2, t=1024, dp=dp, trainer="diloco", n=50)
    for experts, topk, ep, cf in ((8, 2, 1, 0), (8, 2, 2, 0), (8, 2, 4, 1.25), (16, 1, 4, 1), (16, 4, 8, 0), (4, 2, 2, 2)):
        add(e="d12", b=4, t=1024, dp=8, experts=experts, topk=topk, ep=ep, capacity_factor=cf)
        add(e="d4", b=4, t=64, dp=ep, experts=experts, topk=topk, ep=ep, capacity_factor=cf, device="cpu")
    for device, precision in (("cpu", "fp32"), ("cuda", "fp32"), ("cuda", "bf16")):
        for e in ("d4", "d12", "12/1024/16"):
            add(e=e, b=4, t=256, dp=2, device=device, precision=precision)
    for attention in ("flash", "cublas"):
        for mem in (24, 80, 141):
            add(e="d24", b=16, t=1024, attention=attention, mem=mem)
            add(e="d12", b=8, t=1024, tp=2, attention=attention, mem=mem, r=1)
    add()  # the defaults: the page opens on them
    for bad in (dict(e="d12", tp=5), dict(b=-1), dict(z=7), dict(e="d12", cp=3, t=1000), dict(e="d12", pp=5),
                dict(e="d12", t=2048), dict(e="bogus"), dict(device="tpu"), dict(e="d12", dp=2, trainer="tp"),
                dict(e="d12", d=1000), dict(e="d12", experts=8, ep=3, dp=4), dict(e="d12", sp=1, tp=2, t=1023),
                dict(e="d12", z=2, trainer="3d", dp=2, pp=2), dict(device="cpu", precision="bf16"),
                dict(e="d12", pp=2, sched="interleaved", vp=4), dict(e="d12", offload=1, tp=2),
                dict(e="d12", attention="sdpa"), dict(e="d12", cp_comm="tree", cp=2),
                dict(e="d12", b=1, t=1, d=134217729, pp=2), dict(e="d12", search=2147483647)):
        add(**bad)
    add(e="d12", b=4, t=1024, search=4)
    add(e="d48", b=4, t=1024, search=8, mem=141)
    add(e="d36", b=8, t=1024, search=16, sched="zb")
    return layouts


def memory_page_url(pairs, page=None):
    """dev/memory.html (or another copy of it) from the file system, the inputs in its URL"""
    query = "&".join("%s=%s" % (k, urllib.parse.quote(v)) for k, v in pairs)
    return "file://" + urllib.parse.quote(page or MEMORY_PAGE) + ("?" + query if query else "")


@test
def memory_page_in_chromium_shows_the_planners_bytes_for_every_layout():
    """for each of the 200+ layouts above, the page (headless Chromium, from the file system, the
    inputs in its URL) shows what dev/memory_planner -format json prints, byte for byte: every row
    of the table in order (label, bytes, kind), each pipeline stage's total, the command that runs
    the layout; a refused layout the planner's own message and no numbers; a search the same
    layouts in the same order. The page's numbers come from its WebAssembly build of the planner,
    so this checks that build (64-bit sizes where size_t is 32) and the page's reading of it"""
    if tool("chromium") is None:
        raise Skip("no chromium (dev/setup.sh installs it)")
    from browser import Browser
    layouts = memory_page_layouts()
    assert len(layouts) >= 200, len(layouts)

    def planner(pairs):
        args = [a for k, v in pairs for a in ("-" + k, v)]
        return subprocess.run(["./dev/memory_planner"] + args + ["-format", "json"], cwd=ROOT, capture_output=True,
                              text=True, timeout=60)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        natives = list(pool.map(planner, layouts))
    browser = Browser(tool("chromium").split()[0], fresh_dir("memory_page_profile"))
    seen = collections.Counter()
    try:
        for pairs, native in zip(layouts, natives):
            url = memory_page_url(pairs)
            dom = MemoryPageDom()
            html_text = browser.dom(url)
            dom.feed(html_text)
            what = "%s\n    dev/memory_planner %s" % (url, " ".join(a for k, v in pairs for a in ("-" + k, v)))
            if native.returncode == 1:  # refused: the same message, and no numbers on the page
                message = native.stderr.strip().splitlines()[-1].replace("error: ", "", 1)
                assert dom.state == "error" and dom.texts.get("status", "").strip() == message, \
                    "%s\n    page: %s %r\n    planner: %r" % (what, dom.state, dom.texts.get("status"), message)
                assert not dom.rows and not dom.layouts and not dom.stages, "%s: a refused layout shows numbers" % what
                seen["refused"] += 1
                continue
            assert native.returncode in (0, 2), "%s: exit %d %s" % (what, native.returncode, native.stderr[-500:])
            plan = json.loads(native.stdout)
            if "search" in plan:
                want = [layout["total"] for layout in plan["layouts"]]
                assert dom.layouts == want, "%s\n    page %s\n    planner %s" % (what, dom.layouts[:8], want[:8])
                # a row's link opens that very layout: the same total (the search's batch kept)
                links = re.findall(r'<tr class="layout" data-bytes="(\d+)">.*?<a href="([^"]+)"', html_text)
                for total, link in links[:3] + links[-2:]:
                    opened = MemoryPageDom()
                    opened.feed(browser.dom("file://" + os.path.join(os.path.dirname(MEMORY_PAGE), html.unescape(link))))
                    assert opened.state != "error" and [r[1] for r in opened.rows if r[0] == "total"] == [int(total)], \
                        "%s: the link %s opens %s %s, the row said %s" % (what, link, opened.state,
                                                                          opened.texts.get("status"), total)
                seen["search"] += 1
                continue
            want = [(r["label"], r["bytes"], r["kind"]) for r in plan["rows"]]
            assert dom.rows == want, "%s\n    page    %s\n    planner %s" % (what, dom.rows, want)
            assert dom.state == ("fits" if plan["fits"] else "nofit"), "%s: state %s" % (what, dom.state)
            stages = [s["total"] for s in plan["stages"]] if len(plan["stages"]) > 1 else []
            assert dom.stages == stages, "%s: stages %s, planner %s" % (what, dom.stages, stages)
            assert dom.texts.get("command", "").strip() == plan["command"], "%s: %r" % (what, dom.texts.get("command"))
            seen[plan["trainer"]] += 1
    finally:
        browser.close()
    print("    %d layouts: %s" % (len(layouts), ", ".join("%s %d" % kv for kv in sorted(seen.items()))))
    trainers = {"train_gpt2_" + t for t in ("dp", "tp", "pp", "3d", "cp", "diloco", "ep")}
    assert trainers <= set(seen) and seen["refused"] >= 15 and seen["search"] == 3, seen


@test
def memory_page_reads_a_runs_table_and_high_water_mark():
    """a run's printed output pasted into the page: its table's parts beside the page's, its
    measured high-water mark beside the prediction; then its main.log, whose step records carry
    the same two numbers (memory_peak, memory_predicted). The run is a real one (train_gpt2_dp,
    2 ranks, d2 on the CPU), its flags given to the page too, so the page's plan is the run's"""
    if tool("chromium") is None:
        raise Skip("no chromium (dev/setup.sh installs it)")
    d = fresh_dir("memory_page_run")
    flags = ["-e", "d2", "-b", "2", "-t", "32", "-dp", "2", "-device", "cpu"]
    out = run_ok(2, ["-e", "d2", "-b", 2, "-t", 32, "-x", 2, "-v", 0, "-s", 0, "-o", d])
    peak = int(re.search(r"high-water mark (\d+) bytes allocated", out).group(1))
    # the page, its URL the layout, and the run pasted in by a script of the page's own elements
    # (a browser's paste is an input event: the test sends the same)
    page = os.path.join(d, "page.html")
    with open(MEMORY_PAGE) as f:
        text = f.read()
    from browser import Browser
    browser = Browser(tool("chromium").split()[0], fresh_dir("memory_page_run_profile"))
    try:
        check_run_on_page(browser, out, d, page, text, flags, peak)
    finally:
        browser.close()


def check_run_on_page(browser, out, d, page, text, flags, peak):
    for name, run_text in (("stdout", out), ("main.log", open(os.path.join(d, "main.log")).read())):
        inject = ("<script>document.getElementById('run-text').value = %s; document.getElementById('run-text')"
                  ".dispatchEvent(new Event('input'));</script></body>" % json.dumps(run_text))
        with open(page, "w") as f:
            f.write(text.replace("</body>", inject))
        dom = browser.dom(memory_page_url([(flags[i][1:], flags[i + 1]) for i in range(0, len(flags), 2)], page))
        m = re.search(r'id="measured-peak" data-bytes="(\d+)">([^<]*)<', dom)
        assert m and int(m.group(1)) == peak, "%s: no measured high-water mark %d on the page:\n%s" % (
            name, peak, dom[-3000:])
        assert "the same layout" in m.group(2), "%s: the page's plan is not the run's: %s" % (name, m.group(2))
        if name == "stdout":  # each part of the run's table beside the page's row, in MB as printed
            cells = re.findall(r'data-label="([^"]+)" data-bytes="(\d+)"[^>]*>.*?<td class="num run"[^>]*>([^<]*)</td>',
                               dom)
            printed = {label: float(mb) for label, mb in re.findall(r"^ {2,4}(\S[^\n]*?)\s+(\d+\.\d) MB", out, re.M)}
            assert len(cells) >= 12, cells
            for label, nbytes, cell in cells:
                assert cell == "%.1f MB" % printed[label] and abs(printed[label] * 1e6 - int(nbytes)) <= 0.05e6, \
                    (label, cell, printed.get(label), nbytes)


def roofline_close(got, want, rel, what):
    assert abs(got - want) <= rel * abs(want), "%s: %r, expected %r (relative tolerance %g)" % (what, got, want, rel)


def roofline_total(res, **match):
    """the sum of FLOPs or bytes over all calls of the rows whose fields match"""
    rows = [r for r in res["rows"] if all(r[k] == v for k, v in match.items())]
    assert rows, "no row with %s" % match
    return sum(r["total_flops"] for r in rows), sum(r["total_bytes"] for r in rows)


@test
def roofline_counts_the_model_flops_and_the_minimum_bytes():
    g = ROOFLINE_GPT2
    L, C, NH, Vp, hs = g["L"], g["C"], g["NH"], g["Vp"], g["C"] // g["NH"]
    # every parameter tensor of gpt2_parameter_sizes: wte, wpe, per layer ln1 (2C), qkv (3C^2 + 3C),
    # attproj (C^2 + C), ln2 (2C), fc (4C^2 + 4C), fcproj (4C^2 + C), then lnf (2C)
    P = Vp * C + g["maxT"] * C + L * (12 * C * C + 13 * C) + 2 * C
    assert P == 124475904, "d12 has %d parameters, llm.c's GPT-2 124M (padded vocabulary) has 124475904" % P
    # the last config has GEMMs of both size classes (the LM head's 2 N C Vp = 79 GFLOP is large)
    for B, T, precision in ((4, 64, "bf16"), (2, 256, "bf16"), (4, 64, "fp32"), (1, 1024, "bf16")):
        # (GELU in kernels of its own, whose bytes are counted below: roofline_gelu_in_the_gemm_epilogues
        # checks what the default epilogues save)
        res = roofline_json("-e", "d12", "-b", B, "-t", T, "-precision", precision, "-gelu", "kernels")
        X = 2 if precision == "bf16" else 4  # bytes of an activation, parameter or gradient
        N = B * T
        what = "d12 B=%d T=%d %s" % (B, T, precision)
        # FLOPs are integer counts far below 2^53: only float rounding separates the two sides
        exact = 1e-12
        # the cuBLASLt matmuls: forward 2 N K M each, backward twice that (input and weight
        # gradients), over the 12 C^2 weights of each layer and the tied LM head (Vp, C)
        flops, _ = roofline_total(res, op="matmul")
        roofline_close(flops, 6.0 * (L * 12 * C * C + Vp * C) * N, exact, what + ": matmul FLOPs")
        if precision == "bf16":
            # flash attention as the kernels execute it: causal, whole 64 x 64 tiles on and below the
            # diagonal, n (n + 1) / 2 of the n^2 tiles (n = T / 64); T = 64 is one tile, the full
            # square: forward 4 B T^2 C. Forward = 2 tile products (q k^T, p v); backward = 7: the
            # dK/dV kernel recomputes p and does 4 products (s, dv, dp, dk), the dQ kernel recomputes
            # p and dp and does 3 (s, dp, dq); FlashAttention-2's single kernel would do 5
            n = T // 64
            product = B * NH * (n * (n + 1) // 2) * 2 * 64 * 64 * hs  # one causal tiled T x T x hs product
            if T == 64:
                assert product == 2 * B * T * T * C, "one tile is the whole square"
            fwd, _ = roofline_total(res, engine="attn", group="layer forward")
            bwd, _ = roofline_total(res, engine="attn", group="layer backward")
            roofline_close(fwd, L * 2 * product, exact, what + ": flash forward FLOPs")
            roofline_close(bwd, L * 7 * product, exact, what + ": flash backward FLOPs (p and dp recomputed)")
        # GELU reads fch (N, 4C) and writes its output (N, 4C) once each
        _, gelu_bytes = roofline_total(res, kernel="gelu_forward")
        roofline_close(gelu_bytes, L * 2 * N * 4 * C * X, exact, what + ": gelu_forward bytes")
        # the prices, as the profile defines its efficiencies (llmc/device_profile.h): a GEMM row
        # (the cuBLAS attention path's aside) at max(FLOPs / (peak x its size class's efficiency),
        # bytes / achievable bandwidth), on the precision's dense peak (fp32 builds: strict fp32,
        # no TF32); an elementwise or memset row by its bytes alone
        W = ROOFLINE_H100["hbm"] * ROOFLINE_EFF["bw"]
        peak = ROOFLINE_H100[precision]
        attention = {"forward": 0.0, "backward_input": 0.0}
        for r in res["rows"]:
            assert r["engine"] in ("gemm", "attn", "vector", "memset"), "%s: row %s has engine %s" % (what, r["kernel"], r["engine"])
            # which side of the datasheet ridge (peak FLOP/s against HBM bytes/s) the row is on
            ridge_flops = r["flops"] / (ROOFLINE_H100["fp32"] if r["engine"] == "vector" else peak)
            want_bound = "compute" if r["engine"] != "memset" and ridge_flops > r["bytes"] / ROOFLINE_H100["hbm"] else "memory"
            assert r["bound"] == want_bound, "%s: %s is %s-bound, expected %s" % (what, r["kernel"], r["bound"], want_bound)
            if r["op"] == "attention" and r["engine"] != "memset" and precision == "bf16":
                attention[r["phase"]] += r["total_time_s"]  # (flash's: priced together below)
                continue
            eff = ROOFLINE_EFF["gemm_small"] if r["flops"] < ROOFLINE_EFF["gemm_small_flops"] else ROOFLINE_EFF["gemm_large"]
            t_flops = r["flops"] / (peak * eff) if r["engine"] == "gemm" else 0.0
            want = max(t_flops, r["bytes"] / W)
            roofline_close(r["time_s"], want, 1e-9, "%s: time of %s" % (what, r["kernel"]))
            roofline_close(r["total_time_s"], want * r["calls"], 1e-9, "%s: total time of %s" % (what, r["kernel"]))
        # flash's rows of a phase share its useful FLOPs' time at the attention efficiency: q k^T
        # and p v over the T (T + 1) / 2 causal pairs, 2 T (T + 1) hs a head and sequence forward,
        # twice that backward, whatever the kernels execute beyond (fp32 runs the unfused path,
        # whose GEMMs and passes were priced above as what they are)
        if precision == "bf16":
            useful = L * B * NH * 2.0 * T * (T + 1) * hs
            roofline_close(attention["forward"], useful / (peak * ROOFLINE_EFF["attn"]), 1e-9, what + ": attention forward")
            roofline_close(attention["backward_input"], 2 * useful / (peak * ROOFLINE_EFF["attn"]), 1e-9,
                           what + ": attention backward")
        # the step is the sum of its kernels; MFU as llmc/run.h: (6 P + 12 L C T) per token,
        # times B T, over the step, over the dense peak of the precision
        step = sum(r["total_time_s"] for r in res["rows"])
        roofline_close(res["summary"]["step_time_s"], step, 1e-9, what + ": step time = sum of the rows")
        mfu = (6.0 * P + 12.0 * L * C * T) * N / step / ROOFLINE_H100[precision]
        roofline_close(res["summary"]["mfu"], mfu, 1e-9, what + ": MFU")
        assert 0 < mfu < 1, "%s: MFU %g" % (what, mfu)


@test
def roofline_context_parallel_rank_does_its_share():
    """-cp 4: one rank's matmuls on B T/4 rows (a quarter of cp = 1's FLOPs), a quarter of the causal
    attention (zigzag), and on the link the ring's K,V per layer, (cp - 1) blocks of B T/cp 2C X
    forward, as many backward plus cp blocks of dK, dV in fp32, and the gradients' all-reduce,
    2 (cp - 1)/cp P X; per rank, the model's FLOPs are a quarter too"""
    g = ROOFLINE_GPT2
    L, C, Vp = g["L"], g["C"], g["Vp"]
    P = Vp * C + g["maxT"] * C + L * (12 * C * C + 13 * C) + 2 * C
    B, T, cp, X = 2, 1024, 4, 2
    one, four = roofline_json("-e", "d12", "-b", B, "-t", T), roofline_json("-e", "d12", "-b", B, "-t", T, "-cp", cp)
    roofline_close(roofline_total(four, engine="gemm")[0], roofline_total(one, engine="gemm")[0] / cp, 1e-12, "GEMM FLOPs")
    roofline_close(roofline_total(four, engine="attn")[0], roofline_total(one, engine="attn")[0] / cp, 1e-12,
                   "attention FLOPs")
    block = B * (T // cp) * 2 * C
    ring = L * (cp - 1) * block * X + L * ((cp - 1) * block * X + cp * block * 4)
    roofline_close(roofline_total(four, engine="link")[1], ring + 2 * (cp - 1) / cp * P * X, 1e-12, "bytes on the link")
    roofline_close(four["summary"]["model_flops"], one["summary"]["model_flops"] / cp, 1e-12, "the model's FLOPs per rank")


@test
def roofline_gelu_in_the_gemm_epilogues():
    """-gelu epilogue (the roofline's and the trainer's default; -gelu kernels, LLMC_GELU=kernels,
    the other path): no GELU kernels; the fc GEMM writes GELU's
    input as its aux matrix, the fcproj input-gradient GEMM reads it. The kernels moved 2 (forward:
    fch read, output written) + 3 (backward: fch, dout read, dinp written) N 4C elements a layer,
    the epilogues 1 + 1: 3 L N 4C X bytes fewer, the same FLOPs on the tensor cores"""
    g = ROOFLINE_GPT2
    L, C, B, T, X = g["L"], g["C"], 4, 64, 2
    N = B * T
    base = ("-e", "d12", "-b", B, "-t", T)
    kernels, fused = roofline_json(*base, "-gelu", "kernels"), roofline_json(*base)
    saved = sum(r["total_bytes"] for r in kernels["rows"]) - sum(r["total_bytes"] for r in fused["rows"])
    assert saved == 3 * L * N * 4 * C * X, "-gelu epilogue moves %d bytes fewer, expected %d" % (saved, 3 * L * N * 4 * C * X)
    assert not [r for r in fused["rows"] if r["op"] == "gelu"], "-gelu epilogue still has GELU kernels"
    roofline_close(roofline_total(fused, op="matmul")[0], roofline_total(kernels, op="matmul")[0], 1e-12, "GEMM FLOPs")
    assert fused["summary"]["step_time_s"] < kernels["summary"]["step_time_s"], "the epilogues save time"


@test
def roofline_layernorm_backward_fused():
    """-ln_backward fused (the roofline's and the trainer's default; -ln_backward separate,
    LLMC_LAYERNORM_BACKWARD=separate, the other path): one kernel reads dout and x
    (N, C) once for the input gradient and the parameters' partial sums, where the separate partial
    kernel read them again with mean and rstd: 2 N C X + 2 N 4 bytes fewer a LayerNorm, 2 L + 1 of
    them a step (ln1, ln2, lnf); a lane holds at most 5 packs of 16 bytes (layernorm.cuh): in fp32
    C = 768 is 6 packs, and in bf16 GPT-2 1.5B's C = 1600 is 7, too many: nothing changes there"""
    B, T = 4, 64
    N = B * T
    # (GPT-2's depths and widths: d12 768, d36 1280, d48 1600; in bf16 d36's row is 5 packs)
    for model, L, C, precision, X, fused_applies in (("d12", 12, 768, "bf16", 2, True), ("d12", 12, 768, "fp32", 4, False),
                                                     ("d36", 36, 1280, "bf16", 2, True), ("d48", 48, 1600, "bf16", 2, False)):
        base = ("-e", model, "-b", B, "-t", T, "-precision", precision)
        separate, fused = roofline_json(*base, "-ln_backward", "separate"), roofline_json(*base)
        saved = sum(r["total_bytes"] for r in separate["rows"]) - sum(r["total_bytes"] for r in fused["rows"])
        want = (2 * L + 1) * (2 * N * C * X + 2 * N * 4) if fused_applies else 0
        assert saved == want, "%s %s: -ln_backward fused moves %d bytes fewer, expected %d" % (model, precision, saved, want)


@test
def roofline_bias_epilogue_cublas_attention_and_all_reduce():
    g = ROOFLINE_GPT2
    L, C, B, T = g["L"], g["C"], 4, 64
    N, X = B * T, 2
    base = ("-e", "d12", "-b", B, "-t", T)
    fused, separate = roofline_json(*base, "-epilogue", 1), roofline_json(*base, "-epilogue", 0)
    # without the epilogue, each of a layer's 4 bias gradients (qkv 3C, attproj C, fc 4C, fcproj C)
    # is a kernel that reads dout (N, OC) again. The difference also holds the partial sums (fp32,
    # one row of OC per 512 rows: +8 bytes per OC and block, under 1% of the reread) less the
    # epilogue's own writes of OC values, hence 2% above the reread at most
    extra = sum(r["total_bytes"] for r in separate["rows"]) - sum(r["total_bytes"] for r in fused["rows"])
    reread = L * N * (3 * C + C + 4 * C + C) * X
    assert reread <= extra <= 1.02 * reread, "-epilogue 0 moves %d more bytes than -epilogue 1, expected %d..%d" % (
        extra, reread, 1.02 * reread)
    assert len(separate["rows"]) > len(fused["rows"]), "-epilogue 0 has %d rows, -epilogue 1 %d" % (
        len(separate["rows"]), len(fused["rows"]))
    assert separate["summary"]["step_time_s"] > fused["summary"]["step_time_s"], "the separate bias kernels cost time"
    # the cuBLAS attention path multiplies full (T, T) squares: 2 GEMMs forward (q k^T, att v) and 4
    # backward (datt, dv, dq, dk), each 2 T^2 hs per (batch, head) = 2 B T^2 C over the heads; no
    # causal saving, and every element is 2 bytes of a (B, NH, T, T) matrix in memory
    res = roofline_json(*base, "-attention", "cublas")
    fwd, _ = roofline_total(res, op="attention", engine="gemm", group="layer forward")
    bwd, _ = roofline_total(res, op="attention", engine="gemm", group="layer backward")
    roofline_close(fwd, L * 4.0 * B * T * T * C, 1e-12, "cuBLAS attention forward FLOPs")
    roofline_close(bwd, L * 8.0 * B * T * T * C, 1e-12, "cuBLAS attention backward FLOPs")
    # -dp 4: one all-reduce of the whole gradient, a ring sends 2 (N-1)/N of it over each link:
    # on one node 2 (N - 1) steps of P X / N bytes, each a message's latency and its bytes at the
    # profile's NVLink (300 GB/s at 0.8); the predicted step is the kernels', the link apart
    res = roofline_json(*base, "-dp", 4)
    P = res["config"]["parameters"]
    rows = [r for r in res["rows"] if r["op"] == "comm"]
    assert len(rows) == 1, "expected one all-reduce row, got %s" % [r["kernel"] for r in rows]
    roofline_close(rows[0]["bytes"], 2 * 3 / 4 * P * X, 1e-12, "all-reduce bytes")
    roofline_close(rows[0]["time_s"], 2 * 3 * (ROOFLINE_EFF["link_latency"] + P * X / 4 / ROOFLINE_EFF["link"]), 1e-9,
                   "all-reduce time")
    roofline_close(res["summary"]["comm_time_s"], rows[0]["total_time_s"], 1e-12, "the collectives' time")
    roofline_close(res["summary"]["step_time_s"], sum(r["total_time_s"] for r in res["rows"] if r["engine"] != "link"),
                   1e-9, "the step: the kernels")
    roofline_close(res["summary"]["tokens_per_s"], 4 * N / res["summary"]["step_time_s"], 1e-9,
                   "tokens/s over 4 ranks")


# ---------------------------------------------------------------------------------------------
# CUDA backend: compiled here whenever nvcc exists; run against the reference when a GPU exists.
# The same tests also run the CUDA sources under test/cuda_emu, the CPU emulator of the CUDA
# subset this project uses: kernels, cuBLAS and NCCL semantics checked on machines with no GPU.


def have_nvcc():
    return tool("nvcc") is not None


def have_gpu():
    return tool("gpu") is not None


def gpu_compute_capability():
    """'9.0' on an H100 or H200, as nvidia-smi says it (the first GPU); None without one"""
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True,
                           text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.split("\n")[0].strip() if r.returncode == 0 else None


def build(kind, precision, targets):
    """kind 'cuda' (nvcc, for a GPU) or 'emu' (g++ and test/cuda_emu, for the CPU)"""
    paths = ["build/%s_%s/%s" % (kind, precision, t) for t in targets]
    p = make(paths)
    assert p.returncode == 0, p.stdout.decode("utf-8", "replace")[-3000:]
    return [os.path.join(ROOT, x) for x in paths]


def run_gpu_ranks(program, ranks, args, out_dir, timeout=600, env=None):
    """ranks processes on the one GPU, brought together by the env bootstrap (no MPI needed);
    env: more variables for every rank"""
    id_file = os.path.join(out_dir, "nccl_id")
    procs = []
    for r in range(ranks):
        rank_env = dict(os.environ, **(env or {}), RANK=str(r), WORLD_SIZE=str(ranks), LOCAL_RANK=str(r),
                        LOCAL_WORLD_SIZE=str(ranks), LLMC_NCCL_ID_FILE=id_file)
        procs.append(subprocess.Popen([program] + [str(a) for a in args], cwd=ROOT, env=rank_env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=timeout)[0].decode("utf-8", "replace"))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise AssertionError("GPU run of %d ranks did not finish in %d s" % (ranks, timeout))
    assert all(p.returncode == 0 for p in procs), "\n".join(o[-2000:] for o in outs)
    return outs[0]


# The code paths a GPU run times against each other (dev/gpu_check.sh), each an environment
# variable of the CUDA backend: GELU in the fc GEMMs' epilogues (the emulated cuBLASLt's: tanh GELU;
# the default) or in kernels, the classifier's rows split between registers and shared memory
# (bf16; the default) or in registers, the LayerNorm backward in one kernel (the default) or two,
# the flash kernels on mma.sync (the default) or Hopper's wgmma (the emulator's wgmma; head size
# 64). A test passes {variable: value}; the others stay at their defaults.
PATHS = ("LLMC_GELU", "LLMC_CLASSIFIER", "LLMC_LAYERNORM_BACKWARD", "LLMC_FLASH", "LLMC_FLASH_BACKWARD")


def paths_env(paths):
    """every variable of PATHS, set as `paths` asks or left empty (the default)"""
    assert set(paths or {}) <= set(PATHS), paths
    return {k: (paths or {}).get(k, "") for k in PATHS}


def paths_suffix(paths):
    """LLMC_GELU=kernels -> _gelu_kernels"""
    return "".join("_%s_%s" % (k[len("LLMC_"):].lower(), v) for k, v in sorted((paths or {}).items()))


def emu_runner(devices, order="forward", attention=None, bias_grad=None, paths=None):
    """ranks under mpirun on `devices` emulated GPUs: one per rank goes through the NCCL calls
    (emulated over MPI); fewer than the ranks takes the comm layer's host-staged MPI path.
    order "reverse" runs each kernel's threads and blocks last to first; attention "cublas"
    makes bf16 builds take the cuBLAS attention path instead of flash attention; bias_grad
    "kernels" sums the bias gradients in their own kernels instead of cuBLASLt's epilogue;
    paths: {variable: value} of PATHS."""
    def run(program, ranks, args, out_dir):
        threads = 2 if ranks == 1 else 1
        env = dict(CUDA_EMU_DEVICES=str(devices), CUDA_EMU_ORDER=order, LLMC_ATTENTION=attention or "",
                   LLMC_BIAS_GRAD=bias_grad or "", **paths_env(paths))
        return run_ok(ranks, args, program=program, threads=threads, env=env)
    run.attention = attention  # (for dev/memory_planner: the path whose buffers to count)
    return run


def cuda_runner(kind, devices):
    """kind "emu": emu_runner(devices); kind "cuda": every rank on the one GPU (skipped without one)"""
    if kind == "cuda":
        if not have_gpu():
            raise Skip("no GPU")
        return run_gpu_ranks
    return emu_runner(devices)


def cuda_test_name(kind, devices):
    """the test name's prefix and its comm path: a GPU's ranks always talk through NCCL"""
    if kind == "cuda":
        return "gpu", "nccl"
    return "emu", "nccl" if devices >= 2 else "host_staged"


def compare_cuda_with_reference(kind, precision, ranks, run, tp_sp=None, zero=0, overlap=0, cfg=REF_CUDA):
    """the DP trainer on `ranks` ranks (-z zero); with tp_sp = 0 or 1 the TP trainer, -sp tp_sp
    (and -tp_overlap overlap); cfg: the model and run (REF_CUDA's vocabulary of 1000, or GPT-2's)"""
    ref = reference_run(cfg)
    trainer = "train_gpt2_dp" if tp_sp is None else "train_gpt2_tp"
    # both trainers in one make -j2 (the second of each precision is then already built)
    programs = build(kind, precision, ["train_gpt2_dp", "train_gpt2_tp"])
    program = programs[0] if tp_sp is None else programs[1]
    d = fresh_dir("%s_%s_%s_np%d_z%d_o%d" % (kind, precision, trainer, ranks, zero, overlap))
    grads_path = os.path.join(d, "grads.bin")
    B = cfg["batch"] // ranks if tp_sp is None else cfg["batch"]
    # (-z 3 holds no replicas to check)
    extra = ["-z", zero] + (["-check_replicas", 1] if zero < 3 else []) if tp_sp is None else ["-sp", tp_sp, "-check_replicas", 1,
                                                                                            "-tp_overlap", overlap]
    out = run(program, ranks, trainer_args(ref, B, d, ["-n", cfg["steps"], "-dump_grads", grads_path] + extra, cfg=cfg), d)
    train = check_cuda_against_reference(ref, d, grads_path, precision, "%s %s %s %d ranks" % (kind, trainer, precision, ranks))
    X = 4 if precision == "FP32" else 2
    if tp_sp is None:  # DDP's all-reduce of X P and the fp32 loss, or ZeRO's (README)
        expected = zero_step_bytes(cfg, ranks, zero, 1, X)
        # the memory table's total, kernel scratch and cuBLASLt's workspace included, against
        # what the CUDA backend allocated (the comm layer's 64-byte scratch per group on top)
        peak, predicted = map(int, re.search(r"high-water mark (\d+) bytes allocated, predicted (\d+)", out).groups())
        assert abs(peak - predicted) <= 0.05 * predicted, "%d bytes allocated at most, %d predicted" % (peak, predicted)
    else:  # the replicated tensors round alike on both ranks (bf16: stochastically, same bits)
        formula = tp_step_bytes(cfg, B, 1, tp_sp, X, overlap=overlap, tp=ranks)
        check_tp_step_bytes(out, d, formula, cfg["steps"])
        assert "step %d: replicated tensors identical" % cfg["steps"] in out, out[-2000:]
        expected = sum(formula.values())
    assert train[1]["comm_bytes"] == expected, "moved %d bytes, expected %d" % (train[1]["comm_bytes"], expected)


def check_cuda_against_reference(ref, d, grads_path, precision, label):
    """a CUDA run's losses, gradient norms, step-0 gradients and final weights against the
    reference, within the bounds of its precision (test/comparison.py); returns its log's train
    records"""
    report = comparison.compare_run(ref, d, grads_path, "cuda " + precision.lower())
    print("    %s: %s" % (label, ", ".join("%s %.2e" % (c[0], c[1]) for c in report["checks"])))
    comparison.assert_matches(report)
    return read_log(d)[0]


def make_cuda_pp_test(kind, precision, devices, sched, overlap=False):
    def fn():
        """pipeline parallelism on the emulator (or a GPU): 2 stages, 4 micro-batches; activations
        and their gradients travel in floatX through NCCL's grouped send/recv (or the host-staged path);
        both wte copies stay bit-identical (bf16: the same stochastic rounding). zb runs the
        backward's two halves (matmul_backward_input, then _weight) apart; zbv and dualpipev put
        two chunks a stage in a V (the bottom's hand-off a device copy, sends put off, one wte);
        interleaved runs 2 chunks a stage. With overlap, -pp_overlap 1 (tests_pp_overlap_cuda.py
        says what it checks)"""
        run = cuda_runner(kind, devices)
        ref = reference_run(REF4_CUDA)
        program = build(kind, precision, ["train_gpt2_pp"])[0]
        what = sched + ("_overlap" if overlap else "")
        d = fresh_dir("%s_%s_pp2_%s" % (kind, precision, what))
        grads_path = os.path.join(d, "grads.bin")
        m = 4
        B = REF4_CUDA["batch"] // m
        v_shape = sched in V_SCHEDULES
        chunks = 2 if v_shape or sched == "interleaved" else 1
        flags = ["-n", REF4_CUDA["steps"], "-dump_grads", grads_path, "-check_replicas", 1, "-sched", sched]
        flags += ["-vp", 2] if sched == "interleaved" else []
        flags += ["-pp_overlap", 1] if overlap else []
        out = run(program, 2, trainer_args(ref, B, d, flags, cfg=REF4_CUDA), d)
        train = check_cuda_against_reference(ref, d, grads_path, precision, "%s train_gpt2_pp %s 2 stages %s%s" % (
            kind, precision, sched, " -pp_overlap 1" if overlap else ""))
        expected = pp_step_bytes(REF4_CUDA, B, m, 2, chunks, X=4 if precision == "FP32" else 2, v_shape=v_shape)
        check_pp_step_bytes(out, d, expected, REF4_CUDA["steps"])
        assert train[1]["comm_bytes"] == sum(expected.values()), train[1]
        if not v_shape:  # (a V holds one wte, on stage 0)
            assert "step %d: wte copies of the first and last stage identical" % REF4_CUDA["steps"] in out, out[-2000:]
    prefix, path = cuda_test_name(kind, devices)
    fn.__name__ = "%s_pp%s_vs_pytorch_%s_pp2_%s_%s" % (prefix, "_overlap" if overlap else "", precision.lower(), sched, path)
    return fn


def make_cuda_cp_test(kind, precision, devices, split, comm):
    def fn():
        """context parallelism on the emulator (or a GPU): the CUDA block-attention kernels, K,V
        blocks in floatX and dK,dV in fp32 through NCCL's send/recv or all-gather (or the
        host-staged path)"""
        run = cuda_runner(kind, devices)
        ref = reference_run(REF_CUDA)
        program = build(kind, precision, ["train_gpt2_cp"])[0]
        d = fresh_dir("%s_%s_cp2_%s_%s" % (kind, precision, split, comm))
        grads_path = os.path.join(d, "grads.bin")
        B = REF_CUDA["batch"]
        args = trainer_args(ref, B, d, ["-n", REF_CUDA["steps"], "-dump_grads", grads_path, "-check_replicas", 1,
                                        "-cp_layout", split, "-cp_comm", comm], cfg=REF_CUDA)
        out = run(program, 2, args, d)
        if kind == "emu":  # (a CUDA run's buffers, planned on the CPU; the planner is built with MPI)
            check_planner_matches_trainer(program, 2, args, out)
        train = check_cuda_against_reference(ref, d, grads_path, precision, "%s train_gpt2_cp %s cp=2 %s %s" %
                                             (kind, precision, split, comm))
        P = len(reference.read_model_file(os.path.join(ref["dir"], "final.bin"))[1])
        expected = cp_step_bytes(REF_CUDA, B, 2, 1, comm == "allgather", P, X=4 if precision == "FP32" else 2)
        assert train[1]["comm_bytes"] == sum(expected.values()), (train[1]["comm_bytes"], expected)
        assert "step %d: replicas identical" % REF_CUDA["steps"] in out, out[-2000:]
    prefix, path = cuda_test_name(kind, devices)
    fn.__name__ = "%s_cp_vs_pytorch_%s_cp2_%s_%s_%s" % (prefix, precision.lower(), split, comm, path)
    return fn


# context parallelism on the emulator: the ring over NCCL in fp32 (tight), the all-gather over the
# host-staged path in bf16 (bounded)
for _precision, _devices, _split, _comm in (("FP32", 2, "zigzag", "ring"), ("BF16", 1, "contiguous", "allgather")):
    test(make_cuda_cp_test("emu", _precision, _devices, _split, _comm))
# on a GPU: the tensor-core flash kernels of the ring's blocks in bf16, the all-gather in fp32
for _precision, _split, _comm in (("BF16", "zigzag", "ring"), ("FP32", "contiguous", "allgather")):
    test(make_cuda_cp_test("cuda", _precision, None, _split, _comm))


def make_cuda_ep_test(kind, precision, devices, order="forward"):
    def fn():
        """Mixture-of-Experts with expert parallelism on the emulator (or a GPU): 2 ranks, ep 2,
        E = 4, top-2, the aux loss; the CUDA row moves (llmc/cuda/moe.cuh), the experts' GEMMs
        through cuBLASLt, the all-to-alls through NCCL's grouped send/recv (or the host-staged
        path), against the MoE reference within the precision's bounds; the routing's figures
        (MaxVio, drops) equal the reference's in fp32"""
        run = emu_runner(devices, order) if kind == "emu" else cuda_runner(kind, devices)
        ref = moe_reference(4, 2)
        program = build(kind, precision, ["train_gpt2_ep"])[0]
        d = fresh_dir("%s_%s_ep2_%s" % (kind, precision, order))
        grads_path = os.path.join(d, "grads.bin")
        steps, B = MOE["steps"], MOE["batch"] // 2
        out = run(program, 2, trainer_args(ref, B, d, ["-n", steps, "-dump_grads", grads_path, "-ep", 2,
                                                       "-check_replicas", 1], cfg=MOE), d)
        check_cuda_against_reference(ref, d, grads_path, precision, "%s train_gpt2_ep %s ep 2" % (kind, precision))
        assert "step %d: replicated parameters identical" % steps in out, out[-2000:]
        if precision == "FP32":  # (bf16 logits may route a near-tie token elsewhere)
            figures = moe_figures(out)
            for s in range(steps):
                assert abs(figures[s + 1][1] - ref["max_vio"][s]) <= 1e-6, (s + 1, figures[s + 1], ref["max_vio"][s])
        peak, predicted = map(int, re.search(r"high-water mark (\d+) bytes allocated, predicted (\d+)", out).groups())
        assert abs(peak - predicted) <= 0.05 * predicted, "%d bytes allocated at most, %d predicted" % (peak, predicted)
    prefix, path = cuda_test_name(kind, devices)
    fn.__name__ = "%s_ep_vs_pytorch_%s_ep2_%s%s" % (prefix, precision.lower(), path, "_reverse" if order == "reverse" else "")
    return fn


# expert parallelism on the emulator: fp32 over NCCL (its kernels' threads and blocks also run last
# to first), bf16 over the host-staged path; on a GPU both precisions over NCCL
for _precision, _devices, _order in (("FP32", 2, "forward"), ("FP32", 2, "reverse"), ("BF16", 1, "forward")):
    test(make_cuda_ep_test("emu", _precision, _devices, _order))
for _precision in ("BF16", "FP32"):
    test(make_cuda_ep_test("cuda", _precision, None))


def make_cuda_diloco_test(kind, precision, devices, outer_dtype, tau=0):
    def fn():
        """DiLoCo on the emulator (or a GPU), 2 workers of one rank, H = 2 over 3 steps (outer steps at 2 and
        3): the CUDA outer-step kernels, the pseudo-gradient averaged in fp32 through NCCL's
        all-reduce (or the host-staged path), or in bf16 through NCCL's sends and receives. Against
        the float64 reference (rounding the link's values as the trainer does) within the GPU's
        tolerances (cuda fp32, cuda bf16; comparison.py), the final weights and momentum within
        them plus twice the reference's own fp32-against-fp64 spread (diloco_run says why)"""
        run = cuda_runner(kind, devices)
        tol = comparison.TOLERANCES["cuda " + precision.lower()]
        alpha = 0.5 if tau else 0.0  # (-tau: the outer step after step 2 posted, landing after 3, merged)
        ref = diloco_reference(2, 2, 2, 1, cfg=REF_CUDA, outer_dtype=outer_dtype, alpha=alpha, tau=tau)
        ref32 = diloco_reference(2, 2, 2, 1, cfg=REF_CUDA, dtype="float32", outer_dtype=outer_dtype, alpha=alpha, tau=tau)
        program = build(kind, precision, ["train_gpt2_diloco"])[0]
        d = fresh_dir("%s_%s_diloco_%s_t%d" % (kind, precision, outer_dtype, tau))
        args = trainer_args(reference_run(REF_CUDA), REF_CUDA["batch"] // 2, d,
                            ["-workers", 2, "-H", 2, "-outer_dtype", outer_dtype, "-tau", tau, "-alpha", alpha,
                             "-dump_outer", os.path.join(d, "momentum.bin")], cfg=REF_CUDA)
        out = run(program, 2, args, d)
        if kind == "emu":  # (a CUDA run's buffers, planned on the CPU; the planner is built with MPI)
            check_planner_matches_trainer(program, 2, args, out)
        train, _ = read_log(d)
        steps = REF_CUDA["steps"]
        worst = max(abs(train[s]["train_loss"] - ref["losses"][s - 1]) for s in range(1, steps + 1))
        assert worst <= tol["loss"], "loss off by %.3g, tolerance %.3g" % (worst, tol["loss"])
        for name, mine in (("final.bin", "model_%08d.bin" % steps), ("momentum.bin", "momentum.bin")):
            _, p_ref = reference.read_model_file(os.path.join(ref["dir"], name))
            _, p_ref32 = reference.read_model_file(os.path.join(ref32["dir"], name))
            _, p = reference.read_model_file(os.path.join(d, mine))
            err, bound = np.abs(p - p_ref).max(), tol["params_max"] + 2 * np.abs(p_ref32 - p_ref).max()
            assert err <= bound, "%s: max abs error %.3g, bound %.3g" % (name, err, bound)
            # (as diloco_run: values off by more than the precision's bound are codes tipped
            # across a threshold by rounding noise, about as many as the float32 reference tips)
            base = tol["params_max"]
            tipped, tipped32 = int((np.abs(p - p_ref) > base).sum()), int((np.abs(p_ref32 - p_ref) > base).sum())
            assert tipped <= 2 * tipped32 + 4, "%s: %d values beyond %.2g, the float32 reference's %d" % (
                name, tipped, base, tipped32)
            print("    %s train_gpt2_diloco %s: loss %.2e, %s max abs error %.2e (bound %.2e), %d values beyond %.2g "
                  "(the float32 reference: %d)" % (kind, precision, worst, name, err, bound, tipped, base, tipped32))
        P = len(p_ref)
        # (the link's dtype whatever the build's; in bf16 with W = 2 rank 0 sends and receives P/2
        # values of 2 bytes in each half of the average: 4 P bytes counted, as fp32's all-reduce)
        # (int8, e3m0: every word of the messages, coded_message_words, sent and received; below
        # fp32 with -tau, half of them a step later, at the all-gather's half)
        outer, late = P * 4, 0
        if outer_dtype in ("int8", "e3m0"):
            words = coded_message_words(REF_CUDA, 1, "contiguous", 0, 2, 8 if outer_dtype == "int8" else 4)
            outer = 2 * 2 * (sum(words) - words[0] + words[0])
        if outer_dtype != "fp32" and tau:
            late = outer // 2
        want = {s: 8 + (outer - late if s % 2 == 0 else 0) + (late if s % 2 == 1 and s > 1 else 0) for s in range(1, steps)}
        want[steps] = 8 + outer + (late if steps % 2 == 1 else 0)
        for s, groups in step_comm_bytes(d, steps, changing=True).items():
            got = sum(groups["across"].values())
            assert got == want[s], "step %d moved %d across workers, the rule gives %d" % (s, got, want[s])
    prefix, path = cuda_test_name(kind, devices)
    fn.__name__ = "%s_diloco_vs_reference_%s_2_workers_%s%s%s" % (prefix, precision.lower(), path,
                                                                 "" if outer_dtype == "fp32" else "_%s_link" % outer_dtype,
                                                                 "_tau%d" % tau if tau else "")
    return fn


# int8 and e3m0: the link's codes by the CUDA passes (llmc/cuda/outer.cuh), through NCCL's sends
for _precision, _devices, _outer in (("FP32", 2, "fp32"), ("BF16", 1, "fp32"), ("BF16", 2, "bf16"), ("FP32", 2, "e3m0"),
                                     ("BF16", 2, "int8")):
    test(make_cuda_diloco_test("emu", _precision, _devices, _outer))
# -tau 1: the all-reduce posted on NCCL's comm stream and waited for a step later; with the e3m0
# link, the reduce-scatter's sends and receives posted, the all-gather's a step later
test(make_cuda_diloco_test("emu", "FP32", 2, "fp32", tau=1))
test(make_cuda_diloco_test("emu", "FP32", 2, "e3m0", tau=1))
for _precision, _outer in (("FP32", "fp32"), ("BF16", "bf16"), ("BF16", "e3m0")):
    test(make_cuda_diloco_test("cuda", _precision, None, _outer))


# pipeline parallelism on the emulator: 1f1b over NCCL in fp32 (tight) and over the host-staged
# path in bf16 (bounded); zero bubble's split backward runs in the 3D trainer's emulator test; the
# V: zbv over NCCL in fp32, dualpipev in bf16
for _precision, _devices, _sched in (("FP32", 2, "1f1b"), ("BF16", 1, "1f1b"), ("FP32", 2, "zbv")):
    test(make_cuda_pp_test("emu", _precision, _devices, _sched))
test(make_cuda_pp_test("emu", "BF16", 2, "dualpipev"))


# on a GPU: 1f1b in bf16, zero bubble's split backward in fp32, the V schedules
for _precision, _sched in (("BF16", "1f1b"), ("FP32", "zb"), ("FP32", "zbv")):
    test(make_cuda_pp_test("cuda", _precision, None, _sched))
test(make_cuda_pp_test("cuda", "BF16", None, "dualpipev"))


# the paths ops.h's paths_print counts (taken, fell back), printed when they are on: each variable's
# counted values, its default (if counted) first; the defaults among them in each precision (GELU's
# epilogues are the default in bf16 builds only)
COUNTED_PATHS = dict(LLMC_GELU=("epilogue",), LLMC_CLASSIFIER=("split",), LLMC_LAYERNORM_BACKWARD=("fused",),
                     LLMC_FLASH=("wgmma", "fa3"), LLMC_FLASH_BACKWARD=("one_kernel",))
DEFAULT_COUNTED = dict(FP32=("LLMC_CLASSIFIER", "LLMC_LAYERNORM_BACKWARD"),
                       BF16=("LLMC_GELU", "LLMC_CLASSIFIER", "LLMC_LAYERNORM_BACKWARD"))


def taking_paths(run, paths, precision):
    """run, then check in its output (ops.h's paths_print) that every counted path asked for was
    taken at least once and never fell back, that every other path asked for turned its
    variable's counted path off (else the comparison would pass on the other path), and that each
    default left alone was taken at least once (so that the tests of the defaults test their
    kernels; a default may fall back where its kernel cannot take a shape)"""
    def checked(*a):
        out = run(*a)
        for k in DEFAULT_COUNTED[precision]:
            if k not in (paths or {}):
                m = re.search(r"%s=%s: (\d+) " % (k, COUNTED_PATHS[k][0]), out)
                assert m and int(m.group(1)) > 0, "the default %s=%s was not taken:\n%s" % (k, COUNTED_PATHS[k][0], out[-1500:])
        for k, v in (paths or {}).items():
            if v not in COUNTED_PATHS[k]:
                assert not re.search(r"^%s=" % k, out, re.M), "%s=%s left %s on:\n%s" % (k, v, COUNTED_PATHS[k][0], out[-1500:])
                continue
            m = re.search(r"%s=%s: (\d+) [^\n]*?, (\d+) fell back" % (k, v), out)
            assert m and int(m.group(1)) > 0 and int(m.group(2)) == 0, "%s=%s was not taken every time:\n%s" % (
                k, v, out[-1500:])
        return out
    checked.attention = getattr(run, "attention", None)
    return checked


def paths_cfg(paths):
    """the model a path is tested on: GPT-2's vocabulary for the classifier's kernels, whose bf16
    row of 50304 logits fills the split kernel's registers and shared memory (1024 would not reach
    the latter) and the register kernel's 800 threads, heads of 64 for the wgmma kernels and the
    one-kernel backward (GPT-2's head size; T over four query tiles, so that tiles take the shares
    of up to four key blocks), else REF_CUDA"""
    if "LLMC_CLASSIFIER" in (paths or {}):
        return REF_GPT2_CUDA
    return REF_HS64_CUDA if {"LLMC_FLASH", "LLMC_FLASH_BACKWARD"} & set(paths or {}) else REF_CUDA


def make_gpu_test(precision, ranks, paths=None):
    """paths: {variable: value} of PATHS (dev/cuda/gelu checks which GELU cuBLASLt's epilogues compute)"""
    def fn():
        if not have_gpu():
            raise Skip("no GPU")
        if "LLMC_FLASH" in (paths or {}) and gpu_compute_capability() != "9.0":
            raise Skip("LLMC_FLASH=%s runs on Hopper (sm_90a) only; this GPU: %s" % (paths["LLMC_FLASH"],
                                                                                   gpu_compute_capability()))
        env = paths_env(paths)
        compare_cuda_with_reference("cuda", precision, ranks,
                                    taking_paths(lambda *a: run_gpu_ranks(*a, env=env), paths, precision),
                                    cfg=paths_cfg(paths))
    fn.__name__ = "gpu_dp_vs_pytorch_%s_%d_ranks%s" % (precision.lower(), ranks, paths_suffix(paths))
    return fn


def make_emu_test(precision, ranks, devices, attention=None, bias_grad=None, paths=None):
    def fn():
        run = emu_runner(devices, attention=attention, bias_grad=bias_grad, paths=paths)
        compare_cuda_with_reference("emu", precision, ranks, taking_paths(run, paths, precision), cfg=paths_cfg(paths))
    path = "" if ranks == 1 else "_nccl" if devices >= ranks else "_host_staged"
    if precision == "BF16":  # the attention path: flash, unless asked for cuBLAS
        path += "_" + (attention or "flash") + "_attention"
    if bias_grad:  # the bias gradients' path: cuBLASLt's epilogue, unless asked for the kernels
        path += "_bias_grad_" + bias_grad
    path += paths_suffix(paths)
    fn.__name__ = "emu_dp_vs_pytorch_%s_%d_ranks%s" % (precision.lower(), ranks, path)
    return fn


for _precision in ("FP32", "BF16"):
    for _ranks in (1, 2):
        test(make_gpu_test(_precision, _ranks))
    # (GELU's other path: the epilogues in fp32, the kernels in bf16)
    test(make_gpu_test(_precision, 1, dict(LLMC_GELU="epilogue" if _precision == "FP32" else "kernels")))
test(make_gpu_test("BF16", 1, dict(LLMC_CLASSIFIER="split")))  # (the default, at GPT-2's vocabulary)
test(make_gpu_test("BF16", 1, dict(LLMC_CLASSIFIER="registers")))
test(make_gpu_test("BF16", 1, dict(LLMC_LAYERNORM_BACKWARD="separate")))
test(make_gpu_test("BF16", 1, dict(LLMC_FLASH="wgmma")))
test(make_gpu_test("BF16", 1, dict(LLMC_FLASH="fa3")))
test(make_gpu_test("BF16", 2, dict(LLMC_FLASH_BACKWARD="one_kernel")))
# on the emulator: NCCL (one emulated GPU per rank) in fp32, the host-staged path in bf16
# (fp32 at 2 ranks runs every kernel that fp32 at 1 rank would, so 1 rank is left to bf16)
for _precision, _ranks, _devices in (("FP32", 2, 2), ("BF16", 1, 1), ("BF16", 2, 1)):
    test(make_emu_test(_precision, _ranks, _devices))
# (the cuBLAS attention run also takes the bias-gradient kernels, the path where cuBLASLt has no
# BGRADB algorithm)
test(make_emu_test("BF16", 1, 1, "cublas", "kernels"))
# the default runs above take the split classifier and the fused LayerNorm backward, and in bf16
# GELU in the fc GEMMs' epilogues (fp32: in its kernels); here the other paths: GELU's epilogues in
# fp32 and its kernels in bf16, the register classifier, the two LayerNorm backward kernels (in
# both precisions: an fp32 row of C = 768 takes them); and the split classifier asked for by name,
# at GPT-2's vocabulary, whose bf16 row fills the shared memory the default tests' 1024 leave empty
test(make_emu_test("FP32", 2, 2, paths=dict(LLMC_GELU="epilogue")))
test(make_emu_test("BF16", 1, 1, paths=dict(LLMC_GELU="kernels")))
test(make_emu_test("FP32", 2, 2, paths=dict(LLMC_LAYERNORM_BACKWARD="separate")))
test(make_emu_test("BF16", 2, 2, paths=dict(LLMC_CLASSIFIER="split")))
test(make_emu_test("BF16", 1, 1, paths=dict(LLMC_CLASSIFIER="registers")))
test(make_emu_test("BF16", 1, 1, paths=dict(LLMC_LAYERNORM_BACKWARD="separate")))
# the flash kernels on wgmma (forward and backward), through the NCCL path at 2 ranks
test(make_emu_test("BF16", 2, 2, paths=dict(LLMC_FLASH="wgmma")))
# ... on FlashAttention-3's machinery (TMA, warp specialization, pingpong: flash_hopper.cuh)
test(make_emu_test("BF16", 2, 2, paths=dict(LLMC_FLASH="fa3")))
# the flash backward in one kernel, dq's shares added in a fixed order
test(make_emu_test("BF16", 2, 2, paths=dict(LLMC_FLASH_BACKWARD="one_kernel")))


def make_cuda_zero_test(kind, precision, devices, zero):
    def fn():
        """ZeRO on the emulator (or a GPU) at 2 ranks: reduce-scatter per bucket, in-place
        all-gather of the parameters (bf16: each rank rounds its shard, the replicas stay identical)"""
        compare_cuda_with_reference(kind, precision, 2, cuda_runner(kind, devices), zero=zero)
    prefix, path = cuda_test_name(kind, devices)
    fn.__name__ = "%s_dp_zero%d_vs_pytorch_%s_2_ranks_%s" % (prefix, zero, precision.lower(), path)
    return fn


# each stage through both paths, in the two precisions
for _zero, _precision, _devices in ((1, "FP32", 2), (1, "BF16", 1), (2, "BF16", 2), (2, "FP32", 1), (3, "FP32", 2), (3, "BF16", 1)):
    test(make_cuda_zero_test("emu", _precision, _devices, _zero))
for _zero, _precision in ((1, "BF16"), (2, "FP32"), (3, "BF16")):
    test(make_cuda_zero_test("cuda", _precision, None, _zero))


def make_cuda_tp_test(kind, precision, devices, sp, overlap=0):
    def fn():
        compare_cuda_with_reference(kind, precision, 2, cuda_runner(kind, devices), tp_sp=sp, overlap=overlap)
    prefix, path = cuda_test_name(kind, devices)
    fn.__name__ = "%s_tp_vs_pytorch_%s_tp2%s%s_%s" % (prefix, precision.lower(), "_sp" if sp else "",
                                                      "_overlap" if overlap else "", path)
    return fn


# tensor parallelism on the emulator: NCCL in fp32 (tight), the host-staged path in bf16 (bounded)
for _precision, _devices in (("FP32", 2), ("BF16", 1)):
    for _sp in (0, 1):
        test(make_cuda_tp_test("emu", _precision, _devices, _sp))
for _precision, _sp in (("FP32", 0), ("BF16", 1)):
    test(make_cuda_tp_test("cuda", _precision, None, _sp))
# -tp_overlap 1: the ring steps through NCCL's grouped send/recv on the comm stream (fp32, tight)
# and through the host-staged path (bf16); the chunked all-reduce without -sp
for _kind, _precision, _devices, _sp in (("emu", "FP32", 2, 1), ("emu", "BF16", 1, 1), ("emu", "FP32", 2, 0),
                                         ("cuda", "BF16", None, 1)):
    test(make_cuda_tp_test(_kind, _precision, _devices, _sp, overlap=1))


def make_cuda_grid3d_test(kind, precision, devices, dp, pp, cp, tp, sp, m, zero):
    def fn():
        """the 3D trainer's CUDA backend on a GPU (or the emulator) against the 4-layer reference,
        dp x pp x cp x tp ranks on the one device, 1f1b over m micro-batches: the pipe's
        activations through NCCL's grouped send/recv, whose first exchange at m = 1 (stage 0
        sends and receives, stage 1 only receives) NCCL can only connect if both ranks connect
        both directions in it (the emulator checks that rule, and the order of every collective); tp's collectives, cp's ring, the dp
        reduction (-z 1: reduce-scatter and all-gather). Rank 0's bytes per group equal the
        formulas, and every copy of every tensor is identical after every step"""
        run = cuda_runner(kind, devices)
        ref = reference_run(REF4_CUDA)
        program = build(kind, precision, ["train_gpt2_3d"])[0]
        ranks, steps, B = dp * pp * cp * tp, REF4_CUDA["steps"], REF4_CUDA["batch"] // (dp * m)
        d = fresh_dir("%s_%s_grid3d_%dx%dx%dx%d_sp%d_z%d" % (kind, precision, dp, pp, cp, tp, sp, zero))
        grads_path = os.path.join(d, "grads.bin")
        out = run(program, ranks, trainer_args(ref, B, d, ["-n", steps, "-dump_grads", grads_path, "-check_replicas", 1]
                                               + grid3d_flags(dp, pp, tp, sp, zero=zero, cp=cp), cfg=REF4_CUDA), d)
        check_cuda_against_reference(ref, d, grads_path, precision, "%s train_gpt2_3d %s %dx%dx%dx%d" %
                                     (kind, precision, dp, pp, cp, tp))
        X = 4 if precision == "FP32" else 2
        check_grid3d_step_bytes(out, d, grid3d_step_bytes(REF4_CUDA, B, m, dp, pp, tp, sp, 1, zero, X=X, cp=cp), steps)
        for what, size in (("tp copies of the replicated tensors", tp), ("wte copies of the first and last stage", pp),
                           ("dp replicas", dp * cp)):
            if size > 1:
                assert "step %d: %s identical" % (steps, what) in out, what + "\n" + out[-2000:]
    prefix, path = cuda_test_name(kind, devices)
    grid = "%dx%dx%d" % (dp, pp, tp) if cp == 1 else "%dx%dx%dx%d_cp" % (dp, pp, cp, tp)
    fn.__name__ = "%s_grid3d_vs_pytorch_%s_%s%s%s_%s" % (prefix, precision.lower(), grid, "_sp" if sp else "",
                                                        "_z1" if zero else "", path)
    return fn


# on a GPU, every rank on the one device (NCCL over sockets: a host id of its own per rank): a
# pipe alone, with tp and -sp, with replicas and ZeRO-1, and cp's ring with tp (dp x pp x cp x tp)
for _precision, _grid in (("FP32", (1, 2, 1, 1, 0, 1, 0)), ("BF16", (1, 2, 1, 2, 1, 1, 0)),
                          ("FP32", (2, 2, 1, 1, 0, 1, 1)), ("BF16", (1, 1, 2, 2, 1, 2, 0))):
    test(make_cuda_grid3d_test("cuda", _precision, None, *_grid))
# on the emulator, the pipe alone at 2 ranks through NCCL, one micro-batch: the first exchange is
# stage 0's send and receive against stage 1's receive (the 4-rank run below adds tp and zb)
test(make_cuda_grid3d_test("emu", "FP32", 2, 1, 2, 1, 1, 0, 1, 0))


@test
def emu_grid3d_vs_pytorch_fp32_1x2x2_sp_zb_nccl_through_compare_with_pytorch():
    """the 3D trainer's CUDA backend on the emulator, 4 ranks (dp 1, pp 2, tp 2, -sp, zero bubble:
    the backward's halves apart on CUDA, with tp collectives in B and none in W) with NCCL,
    run by dev/compare_with_pytorch.py as a learner would: its PASS line and table, the loss
    curves drawn by dev/plot_runs.py, rank 0's bytes per group (fp32) and the memory prediction
    against the emulator's allocations"""
    program = build("emu", "FP32", ["train_gpt2_3d"])[0]
    shared_dir(SMALL_VOCAB, small_vocabulary)  # REF's tokens
    out_dir = fresh_dir("emu_grid3d")
    B, m = 4, 2
    steps = REF4_CUDA["steps"]  # (the emulator is slow; the CPU tests run 5)
    cmd = [sys.executable, "dev/compare_with_pytorch.py", "--ranks", "4", "--env", "CUDA_EMU_DEVICES=4", "--out", out_dir,
           "--steps", steps, "--vocab", REF4_CUDA["vocab"], "--tokens", REF4_CUDA["tokens"], program, "--", "-pp", 2, "-tp", 2, "-sp", 1, "-sched", "zb", "-b", B, "-check_replicas", 1]
    p = subprocess.run([str(c) for c in cmd], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=TIMEOUT)
    report = p.stdout.decode("utf-8", "replace")
    print("    " + "\n    ".join(l for l in report.splitlines() if re.match(r"\s+(loss|gradient|step-0|final)", l)))
    assert p.returncode == 0 and "PASS: the trainer matches PyTorch" in report and "tolerances for cuda fp32" in report, report[-3000:]
    # the table holds the trainer's main.log losses and the reference's
    rows = re.findall(r"^ +(\d+) +([\d.]+) +([\d.]+) ", report, re.M)
    train, _ = read_log(os.path.join(out_dir, "run"))
    ref = comparison.read_reference(os.path.join(out_dir, "reference"))
    assert len(rows) == steps, report
    for step, loss, ref_loss in rows:
        assert abs(float(loss) - train[int(step)]["train_loss"]) < 1e-6, (step, loss)
        assert abs(float(ref_loss) - ref["losses"][int(step) - 1]) < 1e-6, (step, ref_loss)
    # the loss curves of both (dev/plot_runs.py)
    plot = os.path.join(out_dir, "losses.png")
    subprocess.run([sys.executable, "dev/plot_runs.py", "-o", plot, "--reference", os.path.join(out_dir, "reference"),
                    "emu=" + os.path.join(out_dir, "run")], cwd=ROOT, check=True, stdout=subprocess.PIPE)
    with open(plot, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n", "dev/plot_runs.py wrote no PNG"
    with open(os.path.join(out_dir, "run", "stdout.txt")) as f:
        out = f.read()
    check_grid3d_step_bytes(out, os.path.join(out_dir, "run"), grid3d_step_bytes(REF4_CUDA, B, m, 1, 2, 2, 1, 1, 0), steps)
    assert "step %d: wte copies of the first and last stage identical" % steps in out, out[-2000:]
    peak, predicted = map(int, re.search(r"high-water mark (\d+) bytes allocated, predicted (\d+)", out).groups())
    assert abs(peak - predicted) <= 0.05 * predicted, "%d bytes allocated at most, %d predicted" % (peak, predicted)


@test
def emu_odd_depth_matmuls_on_less_aligned_slices_bf16():
    """d5 (C = 320): the tensors stacked over 5 layers put some layers' weight slices only 128 bytes
    from a 256-byte boundary. cuBLASLt picks algorithms for 256-byte alignment unless told each
    pointer's; the emulated cuBLASLt stops on a matrix less aligned than its algorithm assumes."""
    (program,) = build("emu", "BF16", ["train_gpt2_dp"])
    d = fresh_dir("emu_odd_depth")
    out = run_ok(1, ["-e", "d5", "-b", 1, "-t", 32, "-x", 1, "-v", 0, "-s", 0, "-o", d], program=program, threads=2)
    train, _ = read_log(d)
    # at init the logits are near zero (weights ~ N(0, 0.02)), so the loss is near ln(50257) = 10.83
    assert abs(train[1]["train_loss"] - math.log(50257)) < 0.5, out[-2000:]


EMU_DYNAMIC_SHARED_PROGRAM = r"""
#include <cuda_runtime.h>
#include <stdio.h>
// each block: reads its 64 KB of dynamic shared memory as the block starts (the emulator's
// poison: 0xff bytes), then each thread writes its word and, after a barrier, reads its neighbour's
__global__ void neighbours(int* out, int* fresh) {
    extern __shared__ __align__(16) int words[];
    int n = blockDim.x;
    fresh[blockIdx.x * n + threadIdx.x] = words[threadIdx.x + 8192];
    words[threadIdx.x] = (int)(blockIdx.x * n + threadIdx.x);
    __syncthreads();
    out[blockIdx.x * n + threadIdx.x] = words[(threadIdx.x + 1) % n];
}
int main(void) {
    int *out, *fresh;
    cudaMalloc((void**)&out, 2 * 32 * sizeof(int));
    cudaMalloc((void**)&fresh, 2 * 32 * sizeof(int));
    neighbours<<<2, 32, 64 << 10>>>(out, fresh);
    printf("without the attribute: %s\n", cudaGetErrorString(cudaGetLastError()));
    printf("attribute past 227 KB: %s\n", cudaGetErrorString(cudaFuncSetAttribute(neighbours,
           cudaFuncAttributeMaxDynamicSharedMemorySize, 228 << 10)));
    cudaFuncSetAttribute(neighbours, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 << 10);
    neighbours<<<2, 32, 64 << 10>>>(out, fresh);
    printf("with it: %s\n", cudaGetErrorString(cudaGetLastError()));
    int h_out[64], h_fresh[64];
    cudaMemcpy(h_out, out, sizeof(h_out), cudaMemcpyDeviceToHost);
    cudaMemcpy(h_fresh, fresh, sizeof(h_fresh), cudaMemcpyDeviceToHost);
    int neighbours_ok = 1, poisoned = 1;
    for (int i = 0; i < 64; i++) {
        neighbours_ok &= h_out[i] == i / 32 * 32 + (i + 1) % 32;
        poisoned &= h_fresh[i] == -1;
    }
    printf("neighbours %s, fresh words %s\n", neighbours_ok ? "right" : "WRONG", poisoned ? "poisoned" : "NOT poisoned");
    return 0;
}
"""


@test
def emu_dynamic_shared_memory_as_on_a_gpu():
    """the emulator's dynamic shared memory (the one-kernel flash backward's 64 KB): an extern
    __shared__ array is the launch's bytes, poisoned for every block; a launch past 48 KB fails
    as on a GPU until cudaFuncSetAttribute allows it, and no allowance passes an SM's 227 KB"""
    d = fresh_dir("emu_dynamic_shared")
    with open(os.path.join(d, "dynamic.cu"), "w") as f:
        f.write(EMU_DYNAMIC_SHARED_PROGRAM)
    subprocess.run([sys.executable, os.path.join(ROOT, "test/cuda_emu/translate.py"), os.path.join(d, "out"), "dynamic.cu"],
                   cwd=d, check=True)
    exe = os.path.join(d, "dynamic")
    p = subprocess.run(["g++", "-O1", "-std=c++17", "-D__CUDACC__", "-DCUDA_EMU", "-I" + os.path.join(ROOT, "test/cuda_emu/include"),
                        "-x", "c++", os.path.join(d, "out", "dynamic.cu"), "-o", exe], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-3000:]
    out = subprocess.run([exe], capture_output=True, text=True, timeout=60).stdout
    for want in ("without the attribute: invalid argument", "attribute past 227 KB: invalid argument",
                 "with it: no error", "neighbours right, fresh words poisoned"):
        assert want in out, out


@test
def emu_results_do_not_depend_on_thread_order():
    """every CUDA reduction has a fixed order (no float atomics), so running each kernel's threads
    and blocks last to first instead of first to last must not change a single bit"""
    ref = reference_run(REF)
    (program,) = build("emu", "BF16", ["train_gpt2_dp"])
    models = []
    for order in ("forward", "reverse"):
        d = fresh_dir("emu_order_" + order)
        emu_runner(1, order)(program, 1, trainer_args(ref, REF["batch"], d, ["-x", 2, "-n", 2], cfg=REF), d)
        with open(os.path.join(d, "model_%08d.bin" % 2), "rb") as f:
            models.append(f.read())
    assert models[0] == models[1], "final bf16 weights differ between thread orders"


@test
def gpu_resume_is_bit_identical_bf16():
    if not have_gpu():
        raise Skip("no GPU")
    (program,) = build("cuda", "BF16", ["train_gpt2_dp"])
    check_resume(lambda args, d: run_gpu_ranks(program, 1, args, d), "gpu_resume", 4, REF)


def make_emu_recompute_test(trainer, ranks, flags, cfg, B, levels=(0, 1, 2), attention=None, extra_bytes=None,
                            gelu="kernels"):
    """bf16 under the emulator, each rank its own emulated GPU (NCCL): each -r level against the
    first bit for bit. The flash path keeps only attention's row statistics, so -r 1 drops the GELU
    output alone; attention "cublas" takes the path whose probabilities -r 1 drops and recomputes.
    GELU in its kernels (LLMC_GELU=kernels) where -r 0 is among the levels: a recomputed GELU
    output comes from the kernel, which rounds fch to bf16 first, where the default fc GEMM's
    epilogue computes GELU of the fp32 product, so by default -r 1 and 2 differ from -r 0 in
    those roundings (README); gelu "epilogue" (the default) for -r 1 against 2, which both take
    the kernel forward and the DGELU epilogue backward"""
    def fn():
        (program,) = build("emu", "BF16", [trainer])
        check_recompute_bit_identical("emu_recompute_" + fn.__name__, program, ranks, flags, cfg, B, levels,
                                      run=emu_runner(ranks, attention=attention, paths=dict(LLMC_GELU=gelu)),
                                      extra_bytes=extra_bytes)
    fn.__name__ = "emu_recompute_%s_bf16%s%s" % (trainer[len("train_gpt2_"):], "_cublas_attention" if attention else "",
                                                 "_gelu_epilogue" if gelu == "epilogue" else "")
    return fn


# one step each (-x 1): the emulator takes seconds per step, and one step's update already
# carries every gradient; -r 1 where it drops something (the cuBLAS path), -r 2 everywhere
for _args in [("train_gpt2_dp", 2, ["-z", 3, "-x", 1], REF_CUDA, 2, (0, 2)),
              ("train_gpt2_dp", 2, ["-z", 1, "-x", 1], REF_CUDA, 4, (0, 1), "cublas"),
              ("train_gpt2_tp", 2, ["-sp", 1, "-x", 1], REF_CUDA, 8, (0, 2), None, rerun_tp_bytes(REF_CUDA, 8, 1, 1, X=2)),
              ("train_gpt2_pp", 2, ["-sched", "zb", "-x", 1], REF4_CUDA, 4, (0, 2)),
              ("train_gpt2_3d", 4, grid3d_flags(1, 2, 2, sp=1, sched="interleaved", V=2) + ["-x", 1], REF4_CUDA, 4, (0, 2),
               None, rerun_tp_bytes(dict(REF4_CUDA, layers=2), 4, 2, 1, X=2))]:
    test(make_emu_recompute_test(*_args))
# the default GELU (the epilogues): -r 1 and 2 agree with each other
test(make_emu_recompute_test("train_gpt2_dp", 2, ["-z", 1, "-x", 1], REF_CUDA, 2, (1, 2), gelu="epilogue"))


@test
def emu_one_rank_failing_stops_all_ranks_nccl():
    """the CUDA build: rank 0 waits in the NCCL all-reduce (emulated), rank 1's error ends both"""
    (program,) = build("emu", "BF16", ["train_gpt2_dp"])
    check_one_rank_failing("emu_one_rank_fails", program, dict(CUDA_EMU_DEVICES="2"))


def make_emu_env_choice_test(precision, variable, value, message):
    def fn():
        ref = reference_run()
        (program,) = build("emu", precision, ["train_gpt2_dp"])
        d = fresh_dir("emu_%s_%s" % (variable.lower(), value))
        t0 = time.time()
        code, out = mpirun(2, trainer_args(ref, 4, d), program=program, timeout=60,
                           env={variable: value, "CUDA_EMU_DEVICES": "2"})
        assert code != 0 and message in out, "exit code %d\n%s" % (code, out[-2000:])
        assert not os.listdir(d), "files left behind: %s" % os.listdir(d)
        assert time.time() - t0 < 60
    fn.__name__ = "emu_bad_input_%s_%s_%s" % (variable[len("LLMC_"):].lower(), value, precision.lower())
    return fn


# LLMC_ATTENTION: an unknown value, or flash where it cannot run, ends every rank with a message;
# LLMC_BIAS_GRAD: an unknown value likewise
test(make_emu_env_choice_test("BF16", "LLMC_ATTENTION", "fast", "LLMC_ATTENTION=fast: expected flash or cublas"))
test(make_emu_env_choice_test("BF16", "LLMC_BIAS_GRAD", "fused", "LLMC_BIAS_GRAD=fused: expected epilogue or kernels"))
test(make_emu_env_choice_test("BF16", "LLMC_GELU", "fused", "LLMC_GELU=fused: expected epilogue or kernels"))
test(make_emu_env_choice_test("BF16", "LLMC_CLASSIFIER", "shared", "LLMC_CLASSIFIER=shared: expected split or registers"))
test(make_emu_env_choice_test("BF16", "LLMC_LAYERNORM_BACKWARD", "one", "LLMC_LAYERNORM_BACKWARD=one: expected fused or separate"))
test(make_emu_env_choice_test("BF16", "LLMC_FLASH", "tma", "LLMC_FLASH=tma: expected mma, wgmma or fa3"))
test(make_emu_env_choice_test("BF16", "LLMC_FLASH_BACKWARD", "fused", "LLMC_FLASH_BACKWARD=fused: expected two_kernels or one_kernel"))
test(make_emu_env_choice_test("FP32", "LLMC_ATTENTION", "flash", "LLMC_ATTENTION=flash needs a bf16 build"))


@test
def emu_resume_is_bit_identical_bf16():
    (program,) = build("emu", "BF16", ["train_gpt2_dp"])
    check_resume(lambda args, d: emu_runner(1)(program, 1, args, d), "emu_resume", 4, REF)


@test
def emu_diloco_resume_mid_round_is_bit_identical_bf16():
    """DiLoCo in a bf16 build, 2 workers on one emulated GPU (host-staged), H = 2, a bf16 link:
    resumed from the checkpoint of step 3, between outer steps, steps 4-5 and the final theta_outer
    repeat bit for bit (the workers' fp32 master weights restored over their bf16 parameter bits)"""
    (program,) = build("emu", "BF16", ["train_gpt2_diloco"])
    check_resume(lambda args, d: emu_runner(1)(program, 2, args + ["-H", 2, "-outer_dtype", "bf16"], d),
                 "emu_diloco_resume", 4, REF)


@test
def emu_catches_a_missing_block_barrier():
    """delete the barrier after the flash forward loads a k/v tile: other warps would read a
    half-loaded tile on a GPU. The emulator's warp-serial schedule (each warp alone between two
    block barriers) must make attention_forward fail its validation; the old lock-step schedule
    passed it (dev/cuda/mutation_sweep.py runs this for every barrier). The unmutated program's
    validation, the sweep's control, is emu_dev_cuda_kernels_validate_bf16's."""
    path = os.path.join(ROOT, "llmc", "cuda", "flash_attention.cuh")
    with open(path) as f:
        lines = [i + 1 for i, line in enumerate(f) if "__syncthreads();  // ... for every thread's copies" in line]
    assert len(lines) == 1, "the barrier this test deletes moved: %s" % lines
    p = subprocess.run([sys.executable, "dev/cuda/mutation_sweep.py", "-j", "1", "--warp-serial-only", "--no-control",
                        "flash_attention.cuh:%d" % lines[0]], cwd=ROOT, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=900)
    out = p.stdout.decode("utf-8", "replace")
    assert p.returncode == 0 and "1 barriers, 1 caught under warp-serial" in out, out[-2000:]


@test
def emu_catches_a_missing_mbarrier_wait():
    """delete, one at a time, the mbarrier waits of dev/cuda/tma.cu's TMA ring: the consumers'
    waits on a slot's "full" barrier (v1 and v2's, v3's: they would read a tile before the TMA
    wrote it) and the producer's wait on its "empty" barrier (it would refill a slot the consumers
    still read). The
    emulator (a load lands as its phase completes in one order, at once in the other; a release
    hands the CPU to the threads it wakes in reverse) must make tma fail its validation, or stop
    on a deadlock, in at least one order. The unmutated program's validation is
    emu_dev_cuda_kernels_validate_bf16's."""
    with open(os.path.join(ROOT, "dev", "cuda", "tma.cu")) as f:
        lines = [i + 1 for i, line in enumerate(f) if re.match(r"\s*mbarrier_wait\(&(full|empty)\[slot\]", line)]
    assert len(lines) == 3, "the waits this test deletes moved: %s" % lines
    for line in lines:
        p = subprocess.run([sys.executable, "dev/cuda/mutation_sweep.py", "-j", "1", "--warp-serial-only", "--no-control",
                            "tma.cu:%d" % line], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=900)
        out = p.stdout.decode("utf-8", "replace")
        assert p.returncode == 0 and "1 barriers, 1 caught under warp-serial" in out, out[-2000:]


@test
def emu_catches_a_slot_released_before_its_last_read():
    """dev/cuda/tma.cu's consumers arriving on a slot's "empty" mbarrier before they read the slot
    (the producer may refill it under them): no wait is missing, only misplaced. In reverse order
    the emulator lands a TMA load at once and hands the CPU, at the arrival that completes the
    phase, to the producer waiting on it, which refills the slot before the consumer's reads: tma
    must fail its validation there (forward order lets the consumer finish first)."""
    dest = os.path.join(ROOT, "build", "mutation", "early_release")
    subprocess.run([sys.executable, "-c", "import importlib.util as u, sys; s = u.spec_from_file_location('m', sys.argv[1]); "
                    "m = u.module_from_spec(s); s.loader.exec_module(m); m.copy_tree(sys.argv[2])",
                    os.path.join(ROOT, "dev", "cuda", "mutation_sweep.py"), dest], check=True)
    path = os.path.join(dest, "dev", "cuda", "tma.cu")
    with open(path) as f:
        src = f.read()
    # in consume(), v1's and v2's consumers: the arrival moved above the reads of the slot
    start = src.index("__device__ float consume(")
    end = src.index("return sum;", start)
    arrive = "        mbarrier_arrive(&empty[slot]);  // this thread is done with the slot\n"
    reads = "        const floatX* tile = ring + slot"
    body = src[start:end]
    assert body.count(arrive) == 1 and body.count(reads) == 1, "the lines this test moves changed"
    with open(path, "w") as f:
        f.write(src[:start] + body.replace(arrive, "").replace(reads, arrive + reads) + src[end:])
    subprocess.run(["make", "-s", "build/emu_BF16/dev/cuda/tma"], cwd=dest, check=True)
    p = subprocess.run([os.path.join(dest, "build", "emu_BF16", "dev", "cuda", "tma")], env=dict(os.environ, CUDA_EMU_ORDER="reverse"),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    out = p.stdout.decode("utf-8", "replace")
    shutil.rmtree(dest, ignore_errors=True)
    assert p.returncode == 1 and "v1 producer warp       FAIL" in out and "v2 warp-specialized    FAIL" in out, out[-2000:]


def make_comm_test(kind, ranks, run):
    def fn():
        if kind == "cuda" and not have_gpu():
            raise Skip("no GPU")
        (program,) = build(kind, "FP32", ["test/test_comm"])
        out = run(program, ranks, [], fresh_dir("%s_comm_%d" % (kind, ranks)))
        assert "comm ok" in out, out[-2000:]
    fn.__name__ = "%s_comm_collectives_%d_ranks" % ("gpu" if kind == "cuda" else "emu", ranks)
    return fn


for _n in (1, 2, 3):
    test(make_comm_test("cuda", _n, run_gpu_ranks))
test(make_comm_test("emu", 1, emu_runner(1)))
test(make_comm_test("emu", 3, emu_runner(3)))        # NCCL calls
test(make_comm_test("emu", 2, emu_runner(1)))        # host-staged


def dev_cuda_programs():
    return sorted(os.path.splitext(f)[0] for f in os.listdir(os.path.join(ROOT, "dev", "cuda")) if f.endswith(".cu"))


def make_dev_cuda_test(kind, precision):
    def fn():
        if kind == "cuda" and not have_gpu():
            raise Skip("no GPU")
        programs = build(kind, precision, ["dev/cuda/" + name for name in dev_cuda_programs()])
        # the emulator runs each program twice: threads and blocks first to last, then last to
        # first; each emulated program runs on one core, so two run at a time
        orders = ["forward"] if kind == "cuda" else ["forward", "reverse"]

        def one(job):
            prog, order = job
            env = dict(os.environ, CUDA_EMU_ORDER=order)
            p = subprocess.run([prog], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
            return "%s (%s)" % (os.path.basename(prog), order), p.returncode, p.stdout.decode("utf-8", "replace")
        jobs = [(prog, order) for prog in programs for order in orders]
        with concurrent.futures.ThreadPoolExecutor(1 if kind == "cuda" else 2) as pool:
            results = list(pool.map(one, jobs))
        failed = []
        for what, code, out in results:
            print("\n".join("    " + line for line in out.strip().splitlines()))
            if code != 0:
                failed.append(what)
        assert not failed, "dev/cuda validation failed: %s" % failed
    fn.__name__ = "%s_dev_cuda_kernels_validate_%s" % ("gpu" if kind == "cuda" else "emu", precision.lower())
    return fn


for _kind in ("cuda", "emu"):
    for _precision in ("FP32", "BF16"):
        test(make_dev_cuda_test(_kind, _precision))


# ---------------------------------------------------------------------------------------------
# DiLoCo (train_gpt2_diloco.cu): W workers of R ranks, an outer step every H steps, against
# test/reference.py's run_diloco (written from the paper's algorithm, float64)

DILOCO = "./train_gpt2_diloco"
_diloco_cache = {}


def diloco_reference(workers, H, ranks, micro, outer_lr=0.7, outer_momentum=0.9, cfg=REF, dtype="float64", fragments=1,
                     outer_dtype="fp32", alpha=0.0, fragment_layout="contiguous", tau=0):
    """run_diloco from the reference's initial weights: its losses, norms and directory"""
    key = (workers, H, ranks, micro, outer_lr, outer_momentum, dtype, fragments, outer_dtype, cfg["layers"], cfg["steps"],
           alpha, fragment_layout, tau)
    if key not in _diloco_cache:
        out = os.path.join(TMP, "reference_diloco_%d_%d_%d_%d_%g_%g_%s_f%d_%s_l%d_s%d_a%g_%s_t%d" % key)
        init = os.path.join(reference_run(cfg)["dir"], "model.bin")
        args = type("Args", (), dict(cfg, out=out, init=init, workers=workers, H=H, ranks=ranks, micro=micro,
                                     outer_lr=outer_lr, outer_momentum=outer_momentum, dtype=dtype,
                                     fragments=fragments, outer_dtype=outer_dtype, alpha=alpha,
                                     fragment_layout=fragment_layout, tau=tau))
        shared_dir(out, lambda out: reference.run_diloco(args))
        with open(os.path.join(out, "reference.json")) as f:
            _diloco_cache[key] = dict(json.load(f), dir=out)
    return _diloco_cache[key]


def diloco_run(workers, H, ranks, micro, outer_lr=0.7, outer_momentum=0.9, cfg=REF, fragments=1, outer_dtype="fp32",
               alpha=0.0, fragment_layout="contiguous", tau=0):
    """a DiLoCo run against the reference: every step's loss (the workers' mean) and gradient norm
    (their mean) within the CPU's fp32 tolerances; the final weights (theta_outer) and the outer
    momentum within 2e-5 (the other trainers' bound) times the outer optimizer's largest gain on
    an error of the pseudo-gradient (lr (1 + mu + mu^2 + ...), 3.3 after 5 outer steps at lr 0.7,
    mu 0.9), plus twice what the reference's own float32 run differs from its float64 one: W
    workers' AdamW steps on their own, each normalizing gradients of tiny elements by their own
    moments, then the outer momentum, amplify fp32's rounding beyond one DDP trajectory's. How much
    depends on the order of every sum: PyTorch's fp32 run is 2.5e-4 from its fp64 one at W = 4,
    H = 1 on the reference BLAS and 1.9e-5 on OpenBLAS; the trainer is at 7.1e-5 (in wte's rows of
    unseen tokens, whose gradients are tiny). Every step's bytes from the rule: the worker's DDP
    all-reduce (P X and the loss's 4 bytes, when R > 1), across workers 8 bytes for the step line
    and at each outer step (every H steps and the last) P fp32; with fragments F, at the steps s
    with (s - f H/F) % H == 0 the P_f values of each fragment f due (and every fragment at the last).
    outer_dtype bf16: the reference rounds as the trainer does (each worker's pseudo-gradient, and
    the mean), so the same bound holds: its float32 run meets the same roundings, and where fp32's
    noise tips a value to the next bf16 step there, it does so here; the bytes are the exchanges'
    (llmc/outer_link.h's link_post): rank 0 sends and receives P_f - P_f/W + (W - 1) P_f/W values of 2 bytes.
    int8, e3m0: the reference codes alike (reference.link_mean_coded); a code tipped across a
    threshold moves a value by a level, so the values beyond fp32's bound are counted as well
    (below); the bytes are the messages' words (coded_message_words)"""
    ref = diloco_reference(workers, H, ranks, micro, outer_lr, outer_momentum, cfg, fragments=fragments,
                           outer_dtype=outer_dtype, alpha=alpha, fragment_layout=fragment_layout, tau=tau)
    B = cfg["batch"] // (ranks * micro)
    d = fresh_dir("diloco_w%d_h%d_r%d_m%d_f%d_%s_a%g_%s_t%d" % (workers, H, ranks, micro, fragments, outer_dtype, alpha,
                                                               fragment_layout, tau))
    outer_path = os.path.join(d, "momentum.bin")
    args = trainer_args(reference_run(cfg), B, d, ["-workers", workers, "-H", H, "-outer_lr", outer_lr,
                                                   "-outer_momentum", outer_momentum, "-dump_outer", outer_path,
                                                   "-fragments", fragments, "-outer_dtype", outer_dtype, "-alpha", alpha,
                                                   "-fragment_layout", fragment_layout, "-tau", tau], cfg=cfg)
    out = run_ok(ranks, args, program=DILOCO)
    check_planner_matches_trainer(DILOCO, ranks, args, out)  # (the outer state its own row)
    train, _ = read_log(d)
    steps = cfg["steps"]
    # every check's failure, named together at the end of the comparison (a wrong threshold of the
    # link can move a loss by 1.4e-5, just past its 1e-5, and thousands of weights by a level)
    wrong = []
    for s in range(1, steps + 1):
        a, b = train[s]["train_loss"], ref["losses"][s - 1]
        if abs(a - b) > 1e-5:
            wrong.append("step %d loss %.7f, reference %.7f" % (s, a, b))
        n, nr = train[s]["grad_norm"], ref["grad_norms"][s - 1]
        if abs(n - nr) > 1e-5 * nr:
            wrong.append("step %d norm %.7f, reference %.7f" % (s, n, nr))
    ref32 = diloco_reference(workers, H, ranks, micro, outer_lr, outer_momentum, cfg, "float32", fragments, outer_dtype,
                             alpha, fragment_layout, tau)
    # (with no momentum torch's SGD keeps no buffer: the reference writes zeros, nothing to compare)
    files = [("final.bin", "model_%08d.bin" % steps)] + ([("momentum.bin", "momentum.bin")] if outer_momentum > 0 else [])
    # the outer optimizer's largest gain on an error in the pseudo-gradient: at its k-th outer step
    # Nesterov moves theta_outer by lr (delta + mu m), m = delta + mu delta + ... (k terms)
    outer_steps = max(len([s for s in range(1, steps + 1) if s == steps or
                           (s >= f * H // fragments and (s - f * H // fragments) % H == 0)]) for f in range(fragments))
    gain = max(outer_lr * (1 + outer_momentum * sum(outer_momentum ** j for j in range(k))) for k in range(1, outer_steps + 1))
    for name, mine in files:
        _, p_ref = reference.read_model_file(os.path.join(ref["dir"], name))
        _, p_ref32 = reference.read_model_file(os.path.join(ref32["dir"], name))
        _, p = reference.read_model_file(os.path.join(d, mine))
        err, tol = np.abs(p - p_ref).max(), max(gain, 1.0) * 2e-5 + 2 * np.abs(p_ref32 - p_ref).max()
        if err > tol:
            wrong.append("%s: max abs error %.3g against the reference, bound %.3g" % (name, err, tol))
        # and how many values are off by more than fp32's own bound: where fp32's noise tipped a
        # code of the link across a threshold (int8, e3m0; a value then moves by a step of its
        # piece's scale, which the max alone cannot tell from a wrong threshold). The reference's
        # float32 run shows how many such tips its trajectory has; the trainer may tip others, but
        # about as many (a threshold off by a quarter of a level moves thousands)
        base = max(gain, 1.0) * 2e-5
        tipped, tipped32 = int((np.abs(p - p_ref) > base).sum()), int((np.abs(p_ref32 - p_ref) > base).sum())
        if tipped > 2 * tipped32 + 4:
            wrong.append("%s: %d of %d values beyond %.2g of the reference, its float32 run %d" % (
                name, tipped, len(p), base, tipped32))
        print("    %s: max abs error %.2e, bound %.2e; %d values beyond %.2g (the float32 reference: %d)" % (
            name, err, tol, tipped, base, tipped32))
    assert not wrong, "; ".join(wrong)
    P = len(p_ref)
    R = ranks // workers
    # each fragment's parameters from the model's shape: its L/F layers' share of every per-layer
    # tensor, wte and wpe with the first, lnf with the last
    C, L, V, T = cfg["channels"], cfg["layers"], padded_vocab(cfg), cfg["max_seq_len"]
    layer = 12 * C * C + 13 * C
    P_f = [L // fragments * layer + (V * C + T * C if f == 0 else 0) + (2 * C if f == fragments - 1 else 0)
           for f in range(fragments)]
    assert sum(P_f) == P, (P_f, P)
    # the outer steps' bytes by step: (counted, sent on the link). fp32: the all-reduce's payload,
    # 2 (W-1)/W of it sent, at the step it is due. Below fp32 the two halves of exchanges (rank 0
    # owns shard 0 of each fragment; a message is a shard's values in bf16, its words in int8 and
    # e3m0): a. sends the other shards' messages and receives W - 1 of its own, c. the reverse, each
    # word counted sent and received; with -tau, c. a step after a. (but at the last step, at once)
    outer = {s: [0, 0] for s in range(1, steps + 2)}
    for s in range(1, steps + 1):
        for f in range(fragments):
            if not (s == steps or (s >= f * H // fragments and (s - f * H // fragments) % H == 0)):
                continue
            if outer_dtype == "fp32":
                outer[s][0] += 4 * P_f[f]
                outer[s][1] += 2 * (workers - 1) / workers * 4 * P_f[f]
                continue
            if outer_dtype == "bf16":
                words = [(w + 1) * P_f[f] // workers - w * P_f[f] // workers for w in range(workers)]
            else:
                words = coded_message_words(cfg, fragments, fragment_layout, f, workers, 8 if outer_dtype == "int8" else 4)
            others, own = sum(words) - words[0], (workers - 1) * words[0]
            later = s + 1 if tau > 0 and s < steps else s
            outer[s][0] += 2 * (others + own)
            outer[s][1] += 2 * others
            outer[later][0] += 2 * (others + own)
            outer[later][1] += 2 * own
    for s, groups in step_comm_bytes(d, steps, out, changing=True).items():
        got = {g: sum(groups[g].values()) for g in ("worker", "across")}
        want = {"worker": P * 4 + 4 if R > 1 else 0, "across": 8 + outer[s][0]}
        assert got == want, "step %d moved %s, the rule gives %s" % (s, got, want)
        # on the link: the all-reduces as rings (2 (n-1)/n of the payload over n ranks), the
        # exchanges' sends whole
        link = 2 * (R - 1) / R * want["worker"] + 2 * (workers - 1) / workers * 8 + outer[s][1]
        assert abs(train[s]["ring_bytes"] - link) <= 1, "step %d: %.0f bytes on the link, the formula gives %.1f" % (
            s, train[s]["ring_bytes"], link)
    return out


def coded_message_words(cfg, fragments, layout, f, W, bits):
    """the 16-bit words of each shard's message of fragment f in int8 or e3m0, from the model's
    shapes and the format (llmc/outer_link.h's LinkLayout comment): the fragment's tensors of a
    layer in the model file's order, cut into pieces at the W shards' bounds s P_f // W; a message
    holds its pieces' scales (2 words each) and each piece's codes from a word of its own (16 / bits
    to a word), padded to an even number of words"""
    words = [0] * W
    for a, b, shard in coded_pieces(cfg, fragments, layout, f, W):
        words[shard] += 2 + -(-(b - a) // (16 // bits))
    return [w + w % 2 for w in words]


def coded_pieces(cfg, fragments, layout, f, W):
    """fragment f's pieces in int8 and e3m0, (start, end, shard) in its packed order: each tensor of
    each layer in the model file's order, cut where a shard (s P_f // W) ends"""
    C, L, V, T = cfg["channels"], cfg["layers"], padded_vocab(cfg), cfg["max_seq_len"]
    per_layer = [C, C, 3 * C * C, 3 * C, C * C, C, C, C, 4 * C * C, 4 * C, 4 * C * C, C]  # ln1w .. fcprojb
    holds = (lambda l: l % fragments == f) if layout == "strided" else (lambda l: l // (L // fragments) == f)
    units = ([V * C, T * C] if f == 0 else []) + [n for n in per_layer for l in range(L) if holds(l)] + \
        ([C, C] if f == fragments - 1 else [])
    P_f = sum(units)
    cuts = sorted(set([s * P_f // W for s in range(W + 1)] + list(np.cumsum([0] + units))))
    return [(a, b, max(s for s in range(W) if s * P_f // W <= a)) for a, b in zip(cuts, cuts[1:]) if b > a]


def make_diloco_test(workers, H, ranks, micro, cfg=REF):
    def fn():
        diloco_run(workers, H, ranks, micro, cfg=cfg)
    fn.__name__ = "diloco_vs_reference_w%d_h%d_%d_ranks%s" % (workers, H, ranks, "_accum_%d" % micro if micro > 1 else "")
    return fn


# W = 2, 3 (6 sequences: REF6), 4 workers x H = 1, 3, and 4 ranks as 2 workers of 2 (DDP inside)
for _w, _h, _r, _m, _cfg in [(2, 1, 2, 1, REF), (2, 3, 2, 2, REF), (3, 1, 3, 1, REF6), (3, 3, 3, 1, REF6), (4, 1, 4, 1, REF),
                             (4, 3, 4, 1, REF), (2, 3, 4, 1, REF)]:
    test(make_diloco_test(_w, _h, _r, _m, _cfg))


@test
def bandwidth_calculator_matches_its_formulas():
    """dev/bandwidth.py at P = 1e9, a 1 s step, 2 workers and no latency, against the formulas
    worked by hand: DDP's bf16 all-reduce at 10 Gbit/s takes 2 (1/2) 1e9 16 / 1e10 = 1.6 s, so
    1 / 2.6 = 38.5%; DiLoCo (H = 100, 4 bits) at 1 Gbit/s, 4 s every 100: 100/104 = 96.2%;
    streaming (F = 4, tau = 2) at 1 Gbit/s, 1 s a fragment all hidden by 2 steps: 100%; 90% needs
    t = 1/9 s for DDP (144 Gbit/s), t = 100/9 s for DiLoCo (0.36 Gbit/s), and for streaming an
    exposed 25/9 s over tau's 2 s, t = 43/9 s for 1e9 bits (0.209 Gbit/s). A tau that is not
    below H/F is refused"""
    png = os.path.join(fresh_dir("bandwidth"), "bandwidth.png")
    p = subprocess.run([sys.executable, "dev/bandwidth.py", "-params", "1e9", "-step", "1", "-workers", "2", "-latency", "0",
                        "-H", "100", "-fragments", "4", "-tau", "2", "-outer_dtype", "e3m0", "-o", png], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and os.path.exists(png), p.stdout + p.stderr
    table = {line.split("  ")[1].strip(): line for line in p.stdout.splitlines() if line.startswith("  ") and "%" in line}
    ddp, diloco, streaming = (table[k].split() for k in sorted(table, key=lambda k: ("DDP" not in k, "streaming" in k)))
    columns = [1, 2, 5, 10, 25, 50, 100, 200, 400]
    assert ddp[-9:][columns.index(10)] == "38.5%", ddp
    assert diloco[-9:][columns.index(1)] == "96.2%", diloco
    assert streaming[-9:][columns.index(1)] == "100.0%", streaming
    needs = re.findall(r"^  (.*?)\s+([\d.]+) Gbit/s$", p.stdout, re.M)
    got = {name.split()[0] + (" streaming" if "streaming" in name else ""): float(v) for name, v in needs}
    assert abs(got["DDP"] - 144) < 0.5 and abs(got["DiLoCo"] - 0.36) < 0.005, got
    assert abs(got["streaming streaming"] - 1e9 / (43 / 9) / 1e9) < 0.002, got
    p = subprocess.run([sys.executable, "dev/bandwidth.py", "-tau", "25", "-o", png], cwd=ROOT, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode != 0 and "-tau 25: an exchange must land before the next fragment's is posted, H/F = 25 steps " \
        "later, so tau < H/F" in p.stderr, p.stderr


@test
def diloco_bad_inputs():
    """the common bad inputs as every trainer, and DiLoCo's own: each rank stops with the message
    and nothing is written"""
    run_bad_inputs_concurrently(DILOCO)
    d = fresh_dir("diloco_flags")
    base = ["-e", "d2", "-i", REF["tokens"], "-b", 2, "-t", 32, "-x", 2, "-v", 0, "-s", 0, "-o", os.path.join(d, "out")]
    for ranks, args, message in ((3, ["-workers", 2], "-workers 2 does not divide the 3 ranks"),
                                 (2, ["-H", 0], "-H"),
                                 (2, ["-outer_momentum", 1.5], "-outer_momentum"),
                                 (2, ["-fragments", 3], "-fragments 3: the fragments are L/F layers each"),
                                 (2, ["-fragments", 2, "-H", 3], "must divide the model's L = 2 layers and -H 3"),
                                 (2, ["-outer_dtype", "fp8"], "-outer_dtype fp8: expected fp32, bf16, int8 or e3m0"),
                                 (2, ["-fragment_layout", "zigzag"], "-fragment_layout zigzag: expected contiguous or strided"),
                                 (2, ["-alpha", 1.5], "-alpha"),
                                 (2, ["-alpha", 1], "-alpha 1: a worker would keep its own weights and never take theta_outer"),
                                 (2, ["-dump_outer", "/no/such/dir/m.bin"], "flag '-dump_outer' is '/no/such/dir/m.bin': its directory")):
        code, out = mpirun(ranks, base + args, timeout=60, program=DILOCO)
        assert code != 0 and message in out, "%s: exit %d, %r not in:\n%s" % (args, code, message, out[-2000:])
        assert not os.path.exists(os.path.join(d, "out")), "%s left its output dir behind" % args


def make_diloco_stream_test(workers, ranks, fragments, layout, alpha, H=4, tau=0, cfg=REF4):
    def fn():
        """streaming DiLoCo on the 4-layer model against the reference fragmented, merged and
        delayed alike: strided fragments hold the layers l % F == f (wte and wpe still with
        fragment 0, lnf with the last); alpha merges each worker's own weights into theta_outer
        after each outer step; tau > 0 applies a fragment's average tau steps after its post (its
        exchange overlapping them), the merge then using the worker's weights of that later step.
        Losses, norms, theta_outer, the momentum and every step's bytes as diloco_run checks them
        (every worker posts the fragments in the same order: one that did not would hang here,
        under the runner's timeout)"""
        diloco_run(workers, H, ranks, 1, cfg=cfg, fragments=fragments, alpha=alpha, fragment_layout=layout, tau=tau)
    fn.__name__ = "diloco_streaming_w%d_%d_ranks_h%d_f%d_%s_alpha%g%s" % (workers, ranks, H, fragments, layout, alpha,
                                                                         "_tau%d" % tau if tau else "")
    return fn


# strided fragments at F = 2 and 4, the merge at alpha 0.5 and 0.3, 2 workers of 1 and of 2 ranks;
# tau 1 and 2 over 9 steps with F = 2 and 4 (tau < H/F). (0.3, not only 0.5: at 0.5 a merge that
# swapped alpha and 1 - alpha would be the same merge)
REF4_9 = dict(REF4, steps=9)
for _w, _r, _f, _layout, _alpha, _H, _tau, _cfg in [
        (2, 2, 2, "strided", 0.3, 4, 0, REF4), (2, 4, 4, "strided", 0.0, 4, 0, REF4), (2, 4, 2, "contiguous", 0.5, 4, 0, REF4),
        (2, 2, 4, "strided", 0.5, 4, 0, REF4), (2, 2, 2, "strided", 0.3, 4, 1, REF4_9),
        (2, 4, 2, "contiguous", 0.5, 8, 2, REF4_9), (2, 2, 4, "strided", 0.5, 8, 1, REF4_9),
        (2, 4, 1, "contiguous", 0.0, 3, 2, REF4_9)]:
    test(make_diloco_stream_test(_w, _r, _f, _layout, _alpha, _H, _tau, _cfg))


@test
def diloco_alpha_ends_on_theta_outer_with_or_without_a_checkpoint():
    """-alpha 0.5: the last step's outer step is unmerged, so every worker ends on theta_outer and
    the run's model file is the same whether a checkpoint (-n) wrote it from worker 0 or the run's
    end wrote theta_outer"""
    files = []
    for extra in ([], ["-n", 4]):
        d = fresh_dir("diloco_alpha_end_%d" % len(extra))
        run_ok(2, trainer_args(reference_run(), 4, d, ["-x", 4, "-H", 2, "-alpha", 0.5] + extra), program=DILOCO)
        files.append(open(os.path.join(d, "model_00000004.bin"), "rb").read())
    assert files[0] == files[1], "-alpha 0.5: the model file differs with and without a checkpoint at the last step"


@test
def diloco_resume_with_an_exchange_in_flight_is_bit_identical():
    """-tau 2 -H 3: the outer step after step 3 is posted and lands after step 5; the checkpoint
    of step 3 records the average in flight (the trainer waits for it before writing) and which
    fragment it is, and the run resumed from it repeats steps 4-5, theta_outer and the momentum
    bit for bit; so with the e3m0 link, whose codes and scales the checkpoint holds. A -tau that
    is not below H/F is refused with the rule"""
    for link in ("fp32", "e3m0"):
        def run(args, d):
            return run_ok(2, args + ["-workers", 2, "-H", 3, "-tau", 2, "-alpha", 0.5, "-outer_dtype", link, "-dump_outer",
                                     os.path.join(d, "momentum.bin")], program=DILOCO)
        check_resume(run, "diloco_resume_tau_" + link, 4)
        with open(os.path.join(test_dir("diloco_resume_tau_%s_full" % link), "momentum.bin"), "rb") as a, \
                open(os.path.join(test_dir("diloco_resume_tau_%s_part" % link), "momentum.bin"), "rb") as b:
            assert a.read() == b.read(), "%s link: the outer momentum differs after resume" % link
    d = fresh_dir("diloco_tau_refused")
    code, out = mpirun(2, trainer_args(reference_run(), 4, d, ["-H", 4, "-fragments", 2, "-tau", 2]), timeout=60,
                       program=DILOCO)
    assert code != 0 and "-tau 2: a fragment's exchange must be applied before the next fragment's is posted, H/F = 2 " \
        "steps later, so tau < H/F" in out, out[-2000:]


@test
def diloco_streaming_with_2_fragments_against_the_reference():
    """streaming DiLoCo, F = 2 fragments of a 4-layer model, H = 4 over 5 steps: fragment 1
    (layers 2-3, lnf) steps after step 2, fragment 0 (layers 0-1, wte, wpe) after step 4, both
    after the last; each step's bytes are the due fragments' P_f 4"""
    diloco_run(2, 4, 2, 1, cfg=REF4, fragments=2)


@test
def diloco_bf16_pseudo_gradients_against_the_reference():
    """-outer_dtype bf16, W = 3 workers (uneven shards of the exchanges), H = 2 and 2 fragments,
    against the reference that rounds the same values to bf16; fp32's own bound (diloco_run says
    why)"""
    diloco_run(3, 2, 3, 1, cfg=REF6, outer_dtype="bf16", fragments=2)
    # and exactly bf16: after one step, the run's only outer step, the outer momentum is the mean
    # pseudo-gradient as it came back over the link, so every value is a bf16 (low 16 bits 0)
    d = fresh_dir("diloco_bf16_one_step")
    path = os.path.join(d, "momentum.bin")
    run_ok(3, trainer_args(reference_run(REF6), REF6["batch"] // 3, d, ["-x", 1, "-H", 2, "-outer_dtype", "bf16",
                                                                        "-dump_outer", path], cfg=REF6), program=DILOCO)
    _, m = reference.read_model_file(path)
    low = m.astype(np.float32).view(np.uint32) & 0xffff
    assert np.abs(m).max() > 0 and (low == 0).all(), "%d momentum values are not bf16" % (low != 0).sum()


def make_diloco_coded_test(outer_dtype, workers, ranks, H, fragments, layout, alpha, tau, cfg):
    def fn():
        """-outer_dtype int8 / e3m0 against the reference that codes the same values alike
        (reference.link_mean_coded: a scale a tensor of a layer within a shard, each worker's
        pseudo-gradient and the owner's mean rounded), with diloco_run's checks and bounds; the bytes
        are the messages' words (coded_message_words)"""
        diloco_run(workers, H, ranks, 1, cfg=cfg, fragments=fragments, outer_dtype=outer_dtype, alpha=alpha,
                   fragment_layout=layout, tau=tau)
    fn.__name__ = "diloco_%s_w%d_%d_ranks_h%d_f%d_%s_alpha%g_tau%d_against_the_reference" % (
        outer_dtype, workers, ranks, H, fragments, layout, alpha, tau)
    return fn


# W = 3 (uneven shards) with 2 fragments, at once and (int8) with tau 1, its two rounds of each
# half in flight; 2 workers of 2 ranks, strided, merged and delayed
for _dtype in ("int8", "e3m0"):
    test(make_diloco_coded_test(_dtype, 3, 3, 2, 2, "contiguous", 0.0, 0, REF6))
    test(make_diloco_coded_test(_dtype, 2, 4, 8, 2, "strided", 0.5, 1, REF4_9))
test(make_diloco_coded_test("int8", 3, 3, 4, 2, "strided", 0.5, 1, REF6))


@test
def diloco_coded_link_carries_the_grid_and_refuses_a_non_finite_pseudo_gradient():
    """After one step, the run's only outer step (F = 1, so the packed order is the file's), the
    outer momentum is the workers' mean as it came back over the link: in each piece
    (coded_pieces) e3m0's nonzero values are the piece's largest times 2^-j (j = 0..6) and int8's
    are whole steps of the largest / 127. Weights that overflow (lr 3.4e38 with decay: finite loss
    and norm, infinite weights) give a pseudo-gradient no scale codes: every rank stops with the
    tensor named, and nothing is checkpointed"""
    for dtype, workers in (("e3m0", 2), ("int8", 3)):
        d = fresh_dir("diloco_grid_" + dtype)
        path = os.path.join(d, "momentum.bin")
        run_ok(workers, trainer_args(reference_run(REF6), REF6["batch"] // workers, d, ["-x", 1, "-H", 2, "-outer_dtype",
                                                                                        dtype, "-dump_outer", path],
                                     cfg=REF6), program=DILOCO)
        _, m = reference.read_model_file(path)
        for a, b, _ in coded_pieces(REF6, 1, "contiguous", 0, workers):
            piece = m[a:b].astype(np.float64)
            top = np.abs(piece).max()
            if top == 0:
                continue
            if dtype == "e3m0":
                j = -np.log2(np.abs(piece[piece != 0]) / top)
                assert np.all(np.abs(j - np.round(j)) < 1e-6) and j.max() < 6.5, (a, b, sorted(set(np.round(j, 3))))
            else:
                steps = piece / (top / 127)
                assert np.all(np.abs(steps - np.round(steps)) < 1e-4), (a, b, steps[:8])
        d = fresh_dir("diloco_nonfinite_" + dtype)
        code, out = mpirun(2, small_run_args(d, ["-H", 1, "-outer_dtype", dtype, "-l", 3.4e38, "-c", 1, "-gc", 0, "-n", 1,
                                                 "-v", 0]), timeout=60, program=DILOCO)
        message = "-outer_dtype %s: the pseudo-gradient of fragment 0 holds a non-finite value in " % dtype
        assert code != 0 and message in out, "exit %d:\n%s" % (code, out[-3000:])
        assert not [f for f in os.listdir(d) if f.startswith(("DONE_", "model_", "state_"))], os.listdir(d)


@test
def diloco_resume_mid_round_is_bit_identical_and_needs_the_same_workers():
    """2 workers, H = 2: the checkpoint of step 3 falls between the outer steps after 2 and 4,
    when the workers' weights and AdamW moments differ; resumed from it, steps 4-5, the final
    theta_outer and the outer momentum repeat bit for bit. The checkpoint refuses another worker
    count (the run's identity holds W) and another rank count"""
    def run(args, d):
        return run_ok(2, args + ["-workers", 2, "-H", 2, "-dump_outer", os.path.join(d, "momentum.bin")], program=DILOCO)
    check_resume(run, "diloco_resume", 4)
    with open(os.path.join(test_dir("diloco_resume_full"), "momentum.bin"), "rb") as a, \
            open(os.path.join(test_dir("diloco_resume_part"), "momentum.bin"), "rb") as b:
        assert a.read() == b.read(), "the outer momentum differs after resume"
    part = test_dir("diloco_resume_part")
    base = trainer_args(reference_run(), 4, part, ["-n", 3, "-v", 2, "-m", 2, "-y", 1, "-H", 2])
    for ranks, flags, message in ((2, ["-workers", 1], "belongs to another run: layout -workers: 2 in the checkpoint, 1 now"),
                                  (1, ["-workers", 1, "-b", 8], "written by a job of 2 ranks, this job has 1")):
        code, out = mpirun(ranks, base + flags, timeout=60, program=DILOCO)
        assert code != 0 and message in out, "%s: exit %d, %r not in:\n%s" % (flags, code, message, out[-2000:])


@test
def diloco_extending_a_finished_run_continues_exactly_or_is_refused():
    """-q 1 (no decay: -x is not in the run's identity), H = 3, each run's last step taking every
    fragment's outer step. A finished run of -x 6 ended on its schedule (6 = 2 H): resumed with
    -x 9 from its last checkpoint, steps 7-9 and the model file repeat the uninterrupted -x 9 bit for
    bit. A finished run of -x 4 took an outer step after step 4 that a run of -x 9 would not
    (the issue's reproduction: 10.3228 resumed against 10.3988 uninterrupted): -x 9 is refused,
    naming why, and the dir keeps what it had; at -x 4 it has nothing to train and succeeds"""
    ref = reference_run()

    def run(d, x, extra=()):
        return run_ok(2, trainer_args(ref, 4, d, ["-q", 1, "-H", 3, "-x", x, "-n", x] + list(extra)), program=DILOCO)
    full = fresh_dir("diloco_extend_full")
    run(full, 9)
    for end, ok in ((6, True), (4, False)):
        d = fresh_dir("diloco_extend_%d" % end)
        run(d, end)
        if ok:
            out = run(d, 9, ["-y", 1])
            assert "resumed from step %d" % end in out, out[-2000:]
            a, b = read_log(full)[0], read_log(d)[0]
            for s in range(end + 1, 10):  # (9 significant digits: equal text means equal fp32)
                assert a[s]["train_loss"] == b[s]["train_loss"], "step %d: %r uninterrupted, %r extended" % (
                    s, a[s]["train_loss"], b[s]["train_loss"])
            with open(os.path.join(full, "model_00000009.bin"), "rb") as f1, open(os.path.join(d, "model_00000009.bin"), "rb") as f2:
                assert f1.read() == f2.read(), "the extended run's model file differs from the uninterrupted one's"
            continue
        before = dir_snapshot(d)
        code, out = mpirun(2, trainer_args(ref, 4, d, ["-q", 1, "-H", 3, "-x", 9, "-n", 9, "-y", 1]), timeout=60,
                           program=DILOCO)
        message = ("the checkpoint of step 4 in '%s' ends a run of -x 4, whose last step took an outer step off the "
                   "schedule (-H 3: fragment 0 was not due after step 4)" % d)
        assert code != 0 and message in out, "exit %d, %r not in:\n%s" % (code, message, out[-2000:])
        assert dir_snapshot(d) == before, "the refused resume changed the output dir"
        run(d, 4, ["-y", 1])


@test
def diloco_nonfinite_after_an_outer_step_names_outer_lr():
    """-outer_lr 1e30: the first outer step (H = 1) throws the weights out of range, the next
    step's loss is not finite, and the stop names -outer_lr beside -l"""
    d = fresh_dir("diloco_outer_lr_nan")
    code, out = mpirun(2, trainer_args(reference_run(), 4, d, ["-H", 1, "-x", 3, "-outer_lr", 1e30]), timeout=60,
                       program=DILOCO)
    assert code != 0 and "stopping before the update" in out and "try a lower -l, or -outer_lr" in out, \
        "exit %d:\n%s" % (code, out[-2000:])


@test
def diloco_validation_reads_the_batches_ddp_reads():
    """from the same weights, the validation loss before the first step equals the DP trainer's
    over the same ranks (each rank its own batches, the mean over all): the experiment against
    DDP (dev/diloco_vs_ddp.sh) compares the same tokens. 1e-6: the two trainers' forward passes
    are the same kernels in another order of calls"""
    vals = []
    for program in (DILOCO, "./train_gpt2_dp"):
        d = fresh_dir("diloco_val_" + os.path.basename(program))
        run_ok(2, trainer_args(reference_run(), 4, d, ["-x", 1, "-v", 1, "-m", 3]), program=program)
        vals.append(read_log(d)[1][0]["val_loss"])
    assert abs(vals[0] - vals[1]) <= 1e-6, "validation before step 1: DiLoCo %.7f, DDP %.7f" % tuple(vals)


@test
def diloco_validation_measures_theta_outer_and_leaves_training_alone():
    """the validation loss is theta_outer's: with -H 4 theta_outer does not move before the first
    outer step (after step 4), so the losses measured at steps 1-3, while the workers drift, equal
    step 0's to the bit, and step 4's (after the outer step) differs; the workers' weights step
    aside and come back, so the run with validation every step ends on the same model file, bit for
    bit, as one without"""
    files = []
    for v in (1, 0):
        d = fresh_dir("diloco_val_outer_%d" % v)
        run_ok(2, trainer_args(reference_run(), 4, d, ["-x", 5, "-H", 4, "-v", v, "-m", 2]), program=DILOCO)
        files.append(open(os.path.join(d, "model_00000005.bin"), "rb").read())
        if v:
            val = read_log(d)[1]
            assert val[1]["val_loss"] == val[2]["val_loss"] == val[3]["val_loss"] == val[0]["val_loss"], val
            assert val[4]["val_loss"] != val[0]["val_loss"], val
    assert files[0] == files[1], "validation every step changed the run's model file"


@test
def diloco_h1_plain_averaging_equals_the_mean_of_the_workers():
    """-H 1 -outer_lr 1 -outer_momentum 0: theta_outer is the workers' mean after every step (the
    reference computes it as the SGD step of lr 1 on the mean pseudo-gradient)"""
    diloco_run(2, 1, 2, 1, outer_lr=1.0, outer_momentum=0.0)


# ---------------------------------------------------------------------------------------------
# Hugging Face interop (dev/hf_export.py, dev/hf_import.py, their formats in dev/hf_gpt2.py)

sys.path.insert(0, os.path.join(ROOT, "dev"))
import hf_gpt2  # noqa: E402

HF_EXPORT = [sys.executable, os.path.join(ROOT, "dev", "hf_export.py")]
HF_IMPORT = [sys.executable, os.path.join(ROOT, "dev", "hf_import.py")]


def hf_round_trip(model_path, d, *import_flags):
    """export, import; the two files' bytes and the export's directory"""
    hf_dir, back = os.path.join(d, "hf"), os.path.join(d, "back.bin")
    subprocess.run(HF_EXPORT + [model_path, hf_dir], check=True, stdout=subprocess.PIPE)
    subprocess.run(HF_IMPORT + [hf_dir, back] + list(import_flags), check=True, stdout=subprocess.PIPE)
    with open(model_path, "rb") as a, open(back, "rb") as b:
        return a.read(), b.read(), hf_dir


@test
def hf_export_then_import_is_bit_identical():
    # fp32: files the trainer wrote (with its CRC-32), at depth 2 after a step and at depth 3
    ref = reference_run(REF_GPT2)
    d = fresh_dir("hf_round_trip")
    run_ok(1, trainer_args(ref, 8, os.path.join(d, "run2"), ["-x", 1, "-n", 1], cfg=REF_GPT2))
    run_ok(1, ["-e", "d3", "-b", 1, "-t", 16, "-x", 1, "-n", 1, "-v", 0, "-s", 0, "-o", os.path.join(d, "run3")])
    for depth in (2, 3):
        original, back, hf_dir = hf_round_trip(os.path.join(d, "run%d" % depth, "model_00000001.bin"), d)
        assert original == back, "depth %d: the fp32 file differs after export and import" % depth
        with open(os.path.join(hf_dir, "config.json")) as f:
            cfg = json.load(f)
        assert (cfg["n_layer"], cfg["vocab_size"], cfg["model_type"], cfg["tie_word_embeddings"]) == (depth, 50257, "gpt2", True), cfg
        st = hf_gpt2.read_safetensors(os.path.join(hf_dir, "model.safetensors"))
        C = cfg["n_embd"]
        # the unpadded vocabulary, Conv1D's (in, out), no separate lm_head
        assert st["transformer.wte.weight"][0].shape == (50257, C), st["transformer.wte.weight"][0].shape
        assert st["transformer.h.0.attn.c_attn.weight"][0].shape == (C, 3 * C)
        assert st["transformer.h.0.mlp.c_proj.weight"][0].shape == (4 * C, C)
        assert "lm_head.weight" not in st and len(st) == 2 + 12 * depth + 2, sorted(st)
    # bf16: the reference's bf16 file, given this project's checksum here (zlib's CRC-32 of
    # header[0..8] and the parameters, as llmc/gpt2.h defines it)
    with open(os.path.join(ref["dir"], "model_bf16.bin"), "rb") as f:
        raw = f.read()
    header = np.frombuffer(raw[:1024], dtype="<i4").copy()
    header[8] = 0x43524333
    header[9] = np.array([zlib.crc32(raw[1024:], zlib.crc32(header[:9].tobytes()))], dtype="<u4").view("<i4")[0]
    bf16 = os.path.join(d, "model_bf16.bin")
    with open(bf16, "wb") as f:
        f.write(header.tobytes() + raw[1024:])
    original, back, hf_dir = hf_round_trip(bf16, d)
    assert original == back, "the bf16 file differs after export and import"
    assert {kind for _, kind in hf_gpt2.read_safetensors(os.path.join(hf_dir, "model.safetensors")).values()} == {"BF16"}
    # and --dtype bf16 from the fp32 export rounds as the reference does (to nearest even)
    _, back, _ = hf_round_trip(os.path.join(ref["dir"], "model.bin"), d, "--dtype", "bf16")
    assert back[1024:] == original[1024:], "fp32 exported, imported as bf16: not the reference's rounding"


def hf_logits(d, tokens_file, B, T):
    """the trainer's logits (-dump_logits) and loss on the first B x T tokens of tokens_file,
    from the reference's model file; the export of that file; the tokens"""
    ref = reference_run(REF_GPT2)
    run = os.path.join(d, "run")
    logits_path = os.path.join(d, "logits.bin")
    run_ok(1, ["-e", os.path.join(ref["dir"], "model.bin"), "-i", tokens_file, "-b", B, "-t", T, "-x", 1, "-v", 0, "-s", 0,
               "-o", run, "-dump_logits", logits_path])
    logits = np.fromfile(logits_path, dtype="<f4").reshape(B, T, 50257)
    loss = read_log(run)[0][1]["train_loss"]
    hf_dir = os.path.join(d, "hf")
    subprocess.run(HF_EXPORT + [os.path.join(ref["dir"], "model.bin"), hf_dir], check=True, stdout=subprocess.PIPE)
    tokens = reference.read_tokens(tokens_file)[:B * T + 1]
    return logits, loss, hf_dir, tokens[:-1].reshape(B, T), tokens[1:].reshape(B, T)


@test
def hf_export_loaded_by_the_reference_gives_the_trainers_logits():
    import torch
    d = fresh_dir("hf_logits")
    B, T = 4, 32
    logits, loss, hf_dir, inputs, targets = hf_logits(d, REF_GPT2["tokens"], B, T)
    with open(os.path.join(hf_dir, "config.json")) as f:
        cfg = json.load(f)
    state = {name: torch.from_numpy(array.copy()) for name, (array, _) in
             hf_gpt2.read_safetensors(os.path.join(hf_dir, "model.safetensors")).items()}
    model = reference.load_hf_state_dict(cfg, state).double()
    with torch.no_grad():
        expected = model.logits(torch.from_numpy(inputs)).numpy()
        expected_loss = model(torch.from_numpy(inputs), torch.from_numpy(targets)).item()
    # the C forward in fp32 against float64: sums of C = 64 and 4C = 256 products rounded in fp32
    # (~6e-8 relative each) on logits up to ~1: measured 3.8e-7; 2e-6 leaves 5x. The loss is
    # checked as the suite checks every loss (test/comparison.py: 1e-5)
    err = np.abs(logits - expected).max()
    print("    logits max |difference| %.3g (largest %.3g), loss %.3g" % (err, np.abs(expected).max(), abs(loss - expected_loss)))
    assert err < 2e-6, "logits differ by %.3g (largest %.3g)" % (err, np.abs(expected).max())
    assert abs(loss - expected_loss) < 1e-5, "loss %.9g, the reference's %.9g" % (loss, expected_loss)


@test
def hf_transformers_gpt2lmheadmodel_matches_our_logits_and_loss():
    if tool("transformers") is None:
        raise Skip("transformers not installed (dev/setup.sh installs it: pip transformers==4.46.3 and its packages)")
    d = fresh_dir("hf_transformers")
    B, T = 2, 64
    val = os.path.join(ROOT, "dev/data/tinyshakespeare/tiny_shakespeare_val.bin")
    logits, loss, hf_dir, inputs, targets = hf_logits(d, val, B, T)
    np.save(os.path.join(d, "inputs.npy"), inputs)
    np.save(os.path.join(d, "targets.npy"), targets)
    # transformers in a process of its own, with the packages dev/setup.sh put in .tools; its loss
    # shifts the labels itself (position t predicts label t + 1), so the labels it gets are the
    # inputs, and it drops the last position: compared with ours over the first T - 1
    script = """
import sys, numpy as np, torch
from transformers import GPT2LMHeadModel
model = GPT2LMHeadModel.from_pretrained(sys.argv[1]).eval()
inputs = torch.from_numpy(np.load(sys.argv[2]))
with torch.no_grad():
    out = model(inputs, labels=inputs)
np.save(sys.argv[3], out.logits.numpy())
print(out.loss.item())
"""
    tools_dir = os.environ.get("LLMC_TOOLS_DIR", os.path.join(ROOT, ".tools"))
    r = subprocess.run(["/usr/bin/python3", "-c", script, hf_dir, os.path.join(d, "inputs.npy"), os.path.join(d, "hf_logits.npy")],
                       cwd=d, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=tools_dir, HF_HUB_OFFLINE="1"))
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    hf_loss = float(r.stdout.split()[-1])
    hf = np.load(os.path.join(d, "hf_logits.npy"))
    # our loss over the same T - 1 positions, from our logits in float64
    z = logits[:, :-1].astype(np.float64)
    z -= z.max(axis=-1, keepdims=True)
    nll = np.log(np.exp(z).sum(axis=-1)) - np.take_along_axis(z, targets[:, :-1, None], axis=-1)[..., 0]
    # both fp32, summing in different orders (its matmuls against our kernels): logits measured
    # 4.8e-7 apart, the loss (ours averaged in float64) 2.4e-7; 2e-6 leaves 4x and 8x
    err = np.abs(logits - hf).max()
    print("    logits max |difference| %.3g, loss %.3g" % (err, abs(nll.mean() - hf_loss)))
    assert err < 2e-6, "logits differ from GPT2LMHeadModel's by %.3g" % err
    assert abs(nll.mean() - hf_loss) < 2e-6, "loss %.9g over T - 1 positions, GPT2LMHeadModel's %.9g" % (nll.mean(), hf_loss)


@test
def hf_bad_inputs_are_refused_and_write_nothing():
    ref = reference_run(REF_GPT2)
    d = fresh_dir("hf_bad")
    good = os.path.join(d, "good")
    subprocess.run(HF_EXPORT + [os.path.join(ref["dir"], "model.bin"), good], check=True, stdout=subprocess.PIPE)

    def variant(name, edit_config=None, edit_tensors=None):
        path = os.path.join(d, name)
        shutil.copytree(good, path)
        if edit_config:
            with open(os.path.join(path, "config.json")) as f:
                cfg = json.load(f)
            edit_config(cfg)
            with open(os.path.join(path, "config.json"), "w") as f:
                json.dump(cfg, f)
        if edit_tensors:
            st = hf_gpt2.read_safetensors(os.path.join(path, "model.safetensors"))
            hf_gpt2.write_safetensors(os.path.join(path, "model.safetensors"),
                                      edit_tensors([(n, a, k) for n, (a, k) in st.items()]), {})
        return path

    def wte_plus_one(ts):
        return ts + [("lm_head.weight", next(a for n, a, k in ts if n == "transformer.wte.weight") + 1, "F32")]

    def f64_header(path):  # a tensor of a dtype the converter does not read
        raw = open(path, "rb").read().replace(b'"dtype":"F32"', b'"dtype":"F64"', 1)
        open(path, "wb").write(raw)

    f64 = variant("f64")
    f64_header(os.path.join(f64, "model.safetensors"))
    cases = [
        (HF_IMPORT, os.path.join(d, "nowhere"), "nowhere/config.json"),
        (HF_IMPORT, variant("bert", edit_config=lambda c: c.update(model_type="bert")), "model_type 'bert'"),
        (HF_IMPORT, variant("no_wpe", edit_tensors=lambda ts: [t for t in ts if t[0] != "transformer.wpe.weight"]),
         "no tensor transformer.wpe.weight"),
        (HF_IMPORT, variant("short_qkv", edit_tensors=lambda ts: [(n, a[:, :-1] if n.endswith("c_attn.weight") else a, k)
                                                                  for n, a, k in ts]), "has shape [64, 191], expected [64, 192]"),
        (HF_IMPORT, variant("untied", edit_tensors=wte_plus_one), "lm_head.weight differs from wte"),
        (HF_IMPORT, f64, "is F64"),
        (HF_EXPORT, os.path.join(ref["dir"], "reference.json"), "shorter than the 1024-byte header of an llm.c model file"),
        (HF_EXPORT, os.path.join(ROOT, "dev/data/tinyshakespeare/tiny_shakespeare_val.bin"),
         "not an llm.c model file (magic 20240520"),
    ]
    for program, source, message in cases:
        out = os.path.join(d, "out_" + os.path.basename(source))
        r = subprocess.run(program + [source, out], capture_output=True, text=True)
        assert r.returncode != 0 and message in r.stderr, "%s %s: exit %d, expected '%s':\n%s" % (
            os.path.basename(program[1]), source, r.returncode, message, r.stderr)
        assert not os.path.exists(out) and not os.path.exists(out + ".tmp"), "%s left %s behind" % (program[1], out)


# nvcc for sm_80, sm_90 and (bf16) sm_90a (make cuda-check) runs in the background from the start of the run
# (main): the suite leaves about a third of the two cores idle (process start-up, waits), which the
# compiler fills. This test, registered last, waits for it.
_cuda_check = {}


def start_cuda_check():
    if have_nvcc() and tool("nccl") is not None:
        log = open(os.path.join(TMP, "cuda_check.log"), "w")
        _cuda_check["log"] = log.name
        # at the lowest priority: the tests come first, nvcc takes the cores they leave idle
        _cuda_check["proc"] = subprocess.Popen(["nice", "-n", "19", "make", "-s", "-j2", "cuda-check"], cwd=ROOT, stdout=log,
                                               stderr=subprocess.STDOUT)


# Flash attention, checked without a GPU: the shared-memory bank model and the compiled SASS
# (dev/cuda/bank_conflicts.py, dev/cuda/flash_sass.sh).


@test
def flash_attention_shared_memory_has_no_bank_conflicts():
    script = os.path.join(ROOT, "dev", "cuda", "bank_conflicts.py")

    def rows_of(out):
        """(kernel, access, HS, wavefronts, ideal, worst phase, conflict-free) of each table row"""
        rows = []
        for line in out.splitlines():
            m = re.match(r"(\w+)\s+(l\.\d+ .+?)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)-way\s+(yes|NO)$", line)
            if m:
                rows.append((m.group(1), m.group(2), int(m.group(3)), int(m.group(4)), int(m.group(5)),
                             int(m.group(6)), m.group(7)))
        return rows

    r = subprocess.run([sys.executable, script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    rows = unedited = rows_of(r.stdout)
    # the model read every kernel at every head size, and found the accesses the kernels make
    for kernel in ("forward", "backward_dkdv", "backward_dq"):
        for hs in (16, 32, 64):
            kinds = {row[1].split()[1] for row in rows if row[0] == kernel and row[2] == hs}
            assert {"cp.async", "ldmatrix.x4", "ldmatrix.x4.trans"} <= kinds, \
                "%s HS=%d: accesses found %s\n%s" % (kernel, hs, sorted(kinds), out[-3000:])
    bad = [row for row in rows if row[6] != "yes" or row[3] != row[4]]
    assert r.returncode == 0 and not bad, "bank conflicts (exit %d): %s\n%s" % (r.returncode, bad, out[-3000:])

    # the check can fail: unpadded rows (HS elements) put the 8 rows of an ldmatrix phase at HS = 64
    # 128 bytes apart, all in the same 4 banks: 8 wavefronts a phase, 32 for the 4 matrices of an x4
    r = subprocess.run([sys.executable, script, "--pad", "0"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    rows = rows_of(r.stdout)
    ld64 = [row for row in rows if row[2] == 64 and row[1].split()[1].startswith("ldmatrix")]
    assert r.returncode == 1 and ld64, "--pad 0: exit %d\n%s" % (r.returncode, (r.stdout + r.stderr)[-3000:])
    for row in ld64:
        assert row[5] == 8 and row[3] == 8 * row[4] and row[6] == "NO", "--pad 0, HS=64: %s, expected 8-way" % (row,)

    # the model follows a call that only some threads make (its guard evaluated thread by thread),
    # and stops rather than guess at a pointer it cannot follow (a pointer to an element)
    cuh = open(os.path.join(ROOT, "llmc", "cuda", "flash_attention.cuh")).read()
    call = "flash_rows_to_a<HS>(v, v_s, warp * FLASH_ROWS);"  # (flash_dkdv_tile's read of v)
    assert cuh.count(call) == 1, "bank test: the call it edits is gone from flash_attention.cuh"
    edited = os.path.join(TMP, "bank_conflicts_edited.cuh")
    v_rows = lambda rows: sorted(row for row in rows if row[0] == "backward_dkdv" and "-> v_s" in row[1])
    for change, expect in (("if (warp == 1) " + call, "the same v_s reads"),
                           (call.replace("v_s,", "&v_s[0],"), "a refusal")):
        with open(edited, "w") as f:
            f.write(cuh.replace(call, change))
        r2 = subprocess.run([sys.executable, script, "--cuh", edited], cwd=ROOT, capture_output=True, text=True,
                            timeout=300)
        if expect == "a refusal":
            assert r2.returncode == 2 and "&v_s[..]" in r2.stderr, "%s: exit %d\n%s" % (change, r2.returncode, r2.stderr)
        else:
            assert r2.returncode == 0 and v_rows(rows_of(r2.stdout)) and \
                [row[2:] for row in v_rows(rows_of(r2.stdout))] == [row[2:] for row in v_rows(unedited)], \
                "%s: v_s reads %s, unedited %s" % (change, v_rows(rows_of(r2.stdout)), v_rows(unedited))


@test
def flash_attention_compiles_to_ldmatrix_and_mma_without_spills():
    if not have_nvcc():
        raise Skip("no nvcc")
    if tool("nvdisasm") is None:
        raise Skip("no nvdisasm to read the SASS (dev/setup.sh installs it: pip nvidia-cuda-nvdisasm)")
    r = subprocess.run([os.path.join(ROOT, "dev", "cuda", "flash_sass.sh")], cwd=ROOT, capture_output=True,
                       text=True, timeout=900)
    out = r.stdout + r.stderr
    assert r.returncode == 0, "flash_sass.sh exit %d:\n%s" % (r.returncode, out[-4000:])
    # every kernel at every head size, for Ampere and Hopper, with no spills and the three instructions
    for sm in ("sm_80", "sm_90"):
        for kernel in ("forward", "backward_dkdv", "backward_dq"):
            for hs in (16, 32, 64):
                # (the forward's label carries its row tiles per warp too: forward<64,2>; columns
                # LDSM, HMMA, HGMMA, LDGSTS)
                m = re.search(r"^%s\s+%s<%d(?:,\d+)?>\s+(\d+)\s+(\d+)\s+0/0\s+([1-9]\d*)\s+([1-9]\d*)\s+0\s+([1-9]\d*)\s"
                              % (sm, kernel, hs), r.stdout, re.M)
                assert m, "%s %s<%d>: no row without spills and with LDSM, HMMA, LDGSTS\n%s" % (sm, kernel, hs, out[-4000:])
    # the wgmma kernels (LLMC_FLASH=wgmma) on sm_90a: wgmma (HGMMA) and no mma.sync, no spills
    for kernel in ("forward_wgmma", "backward_dkdv_wgmma", "backward_dq_wgmma"):
        m = re.search(r"^sm_90a\s+%s\s+(\d+)\s+(\d+)\s+0/0\s+(\d+)\s+0\s+([1-9]\d*)\s+([1-9]\d*)\s" % kernel,
                      r.stdout, re.M)
        assert m, "sm_90a %s: no row without spills and with HGMMA, LDGSTS\n%s" % (kernel, out[-4000:])


@test
def flash_sass_catches_wgmma_a_registers_reused_across_the_loop():
    """the wgmma kernels built without the copy of their A fragments (-DFLASH_WGMMA_COPY_A=0):
    ptxas (before CUDA 13.3) gives the registers of the q, k, v and dout fragments held across
    the tile loop to other values, as it did in the build that failed on an H200, and
    flash_sass.sh's register check must say so for each of the three kernels"""
    if not have_nvcc():
        raise Skip("no nvcc")
    if tool("nvdisasm") is None:
        raise Skip("no nvdisasm to read the SASS (dev/setup.sh installs it: pip nvidia-cuda-nvdisasm)")
    r = subprocess.run([os.path.join(ROOT, "dev", "cuda", "flash_sass.sh")], cwd=ROOT, capture_output=True,
                       text=True, timeout=900, env=dict(os.environ, FLASH_SASS_DEFINES="-DFLASH_WGMMA_COPY_A=0"))
    out = r.stdout + r.stderr
    assert r.returncode == 1, "flash_sass.sh without the copy: exit %d, expected 1\n%s" % (r.returncode, out[-4000:])
    for kernel in ("forward", "backward_dkdv", "backward_dq"):
        assert re.search(r"FAILED: sm_90a flash_attention_%s_wgmma_kernel: the HGMMA at \w+ reads A from R\d+\.\., which "
                         r"its loop overwrites later" % kernel, out), "%s: no register reuse reported\n%s" % (kernel, out[-4000:])


@test
def cuda_compiles_for_sm80_and_sm90():
    if not have_nvcc():
        raise Skip("no nvcc")
    if tool("nccl") is None:
        raise Skip("no NCCL (nccl.h) beside nvcc: install libnccl-dev or pip nvidia-nccl-cu13")
    if "proc" not in _cuda_check:
        start_cuda_check()
    code = _cuda_check["proc"].wait(timeout=3600)
    with open(_cuda_check["log"]) as f:
        out = f.read()
    assert code == 0 and "cuda-check: all compiled" in out, out[-3000:]


# the most the suite holds on disk at once (its builds and the running test's files), about 2 GB,
# with room to spare: a disk that fills mid-run fails whichever trainer is writing just then
DISK_NEEDED = 3e9


def run_test(fn, capture):
    """one test: (outcome PASS/SKIP/FAIL, seconds, what it printed when captured, its message);
    a test that passes or is skipped leaves no directories behind, a failed one keeps them"""
    t0 = time.time()
    del TEST_DIRS[:]
    RUNNING["test"] = fn.__name__
    printed, stdout = io.StringIO(), sys.stdout
    if capture:
        sys.stdout = printed
    try:
        fn()
        outcome, message = "PASS", ""
    except Skip as e:
        outcome, message = "SKIP", "skipped (%s)" % e
    except Exception as e:  # an assertion or a crash of the test itself
        kept = " (its files kept: %s)" % " ".join(os.path.relpath(d, ROOT) for d in TEST_DIRS) if TEST_DIRS else ""
        outcome, message = "FAIL", "%s: %s" % (kept, e)
    finally:
        sys.stdout = stdout
    if outcome != "FAIL":
        for d in TEST_DIRS:
            shutil.rmtree(d, ignore_errors=True)
        shutil.rmtree(os.path.join(TMP, fn.__name__), ignore_errors=True)
    RUNNING["test"] = None
    return outcome, time.time() - t0, printed.getvalue(), message


def run_test_named(name):  # in a worker process of the pool (forked: it has every test)
    return run_test(next(fn for fn in TESTS if fn.__name__ == name), capture=True)


# what holds this process's state runs here, after the others: the background nvcc it waits for
IN_MAIN_PROCESS = {"cuda_compiles_for_sm80_and_sm90"}


# ---------------------------------------------------------------------------------------------
# LLMC_KERNEL_TIMES=1 (llmc/kernel_times.h): the step's time by kind of launch

def kernel_times_table(out):
    """{kind: (calls a step, ms a step)}, the time outside the launchers and the step, as printed"""
    rows, outside, step = {}, None, None
    table = out[out.index("kernel times on rank 0"):]
    for line in table.splitlines()[2:]:
        m = re.match(r"^  (.+?)\s+([0-9.]+)?\s+([0-9.]+)\s+-?[0-9.]+%$", line)
        if m is None:
            break
        name, calls, ms = m.group(1), m.group(2), float(m.group(3))
        if name.startswith("outside the launchers"):
            outside = ms
        elif name == "step":
            step = ms
        else:
            rows[name] = (float(calls), ms)
    return rows, outside, step


def check_kernel_times(program, out, L, C, Vp, gelu_kernels=True):
    rows, outside, step = kernel_times_table(out)
    # the launches of one train_gpt2_dp step of an L-layer GPT-2, counted from the model
    # (block.h's halves, the trainer's LayerNorms, one AdamW launcher call for its 12 L + 4 tensor
    # pieces: adamw_update_runs); GELU's own launches where it is not in the fc GEMMs' epilogues
    # (gelu_kernels: the CPU backend; the CUDA one computes it in the GEMMs, timed as theirs)
    expected = {"encoder forward": 1, "layernorm forward": 1, "residual + layernorm forward": 2 * L,
                "attention forward": L, "classifier (softmax, loss, dlogits)": 1,
                "layernorm backward": 2 * L + 1, "attention backward": L, "encoder backward": 1,
                "gradient norm": 1, "adamw": 1}
    if gelu_kernels:
        expected.update({"gelu forward": L, "gelu backward": L})
    for K, OC, n in ((C, 3 * C, L), (C, C, L), (C, 4 * C, L), (4 * C, C, L), (C, Vp, 1)):
        for kind in ("forward", "dinp", "dweight"):
            expected["matmul %s %d->%d" % (kind, K, OC)] = n
    for name, calls in expected.items():
        assert name in rows, "%s: no row '%s' in\n%s" % (program, name, out[-3000:])
        assert rows[name][0] == calls, "%s: '%s' %g calls a step, expected %d" % (program, name, rows[name][0], calls)
    others = set(rows) - set(expected)
    assert all(n == "memset" or n.startswith("copy ") for n in others), "%s: unexpected kinds %s" % (program, others)
    # the rows and what fell outside them add up to the step (each printed to 0.001 ms)
    total = sum(ms for _, ms in rows.values()) + outside
    assert all(ms >= 0 for _, ms in rows.values()) and outside >= -0.01, out[-3000:]
    assert abs(total - step) <= 0.001 * (len(rows) + 2), "%s: rows add to %.3f ms, the step is %.3f" % (program, total, step)
    return rows


@test
def kernel_times_count_every_launch_of_the_step_and_name_the_rooflines_rows():
    """LLMC_KERNEL_TIMES=1 on the CPU backend and the CUDA one under the emulator: each kind of launch
    is called as often a step as the model says (L qkv GEMMs, 2L + 1 LayerNorm backwards, one AdamW
    call for all tensors, ...), the rows and the time outside them add to the step, and every kind is one
    dev/bench/roofline.py predicts, so that its -measured table joins them (it fails if a launcher's
    name and the roofline's drift apart)"""
    L, C, B, T = 2, 128, 2, 64
    (emu,) = build("emu", "BF16", ["train_gpt2_dp"])
    for program in ("./train_gpt2_dp", emu):
        # the CPU backend computes GELU in kernels of its own: the roofline's -gelu kernels
        cpu = program == "./train_gpt2_dp"
        gelu = ["-gelu", "kernels"] if cpu else []
        roof = subprocess.run([sys.executable, "dev/bench/roofline.py", "-e", "d%d" % L, "-b", str(B), "-t", str(T),
                               "-json"] + gelu, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert roof.returncode == 0, roof.stderr
        predicted = {r["launch"] for r in json.loads(roof.stdout)["rows"]}
        p = subprocess.run([program, "-e", "d%d" % L, "-b", str(B), "-t", str(T), "-x", "3", "-v", "0", "-s", "0"],
                           cwd=ROOT, env=dict(os.environ, LLMC_KERNEL_TIMES="1", OMP_NUM_THREADS="2"),
                           capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        rows = check_kernel_times(program, p.stdout, L, C, 50304, gelu_kernels=cpu)
        unknown = {n for n in rows if not n.startswith("copy ")} - predicted
        assert not unknown, "%s: kinds the roofline has no row for: %s" % (program, unknown)
        log = os.path.join(fresh_dir("kernel_times"), "out.log")
        with open(log, "w") as f:
            f.write(p.stdout)
        joined = subprocess.run([sys.executable, "dev/bench/roofline.py", "-e", "d%d" % L, "-b", str(B), "-t", str(T),
                                 "-precision", "fp32" if cpu else "bf16", "-measured", log] + gelu,
                                cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert joined.returncode == 0 and "matmul forward 128->384" in joined.stdout, joined.stdout + joined.stderr
    # without the variable: no table, and the launchers' timing costs nothing
    p = subprocess.run(["./train_gpt2_dp", "-e", "d%d" % L, "-b", str(B), "-t", str(T), "-x", "2", "-v", "0", "-s", "0"],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0 and "kernel times" not in p.stdout, p.stdout[-2000:]


# ---------------------------------------------------------------------------------------------
# A newcomer's first hour (issue 46): the exported model in transformers with its tokenizer, the
# plots under out/, and errors a new user can act on: printed once, naming the flag, the
# trainer that takes it, the defaults

# The README's snippet (section "Using the model elsewhere"), run as pasted from the repository's
# root with PYTHONPATH=.tools after dev/hf_export.py wrote out/hf_quickstart; the test reads it
# from the README and runs it on its own export (HF_SNIPPET_DIR replaced)
HF_SNIPPET_DIR = "out/hf_quickstart"


def readme_hf_snippet():
    """the Python of the README's snippet: what it feeds /usr/bin/python3 between <<'EOF' and EOF"""
    readme = open(os.path.join(ROOT, "README.md")).read()
    start = readme.index("PYTHONPATH=.tools /usr/bin/python3 - <<'EOF'\n")
    start = readme.index("\n", start) + 1
    return readme[start:readme.index("\nEOF\n", start) + 1]


@test
def newcomer_hf_export_writes_the_tokenizer_and_generation_fields():
    """vocab.json and merges.txt are GPT-2's BPE files (the ones dev/data/tinyshakespeare.py
    tokenizes with), <|endoftext|> = 50256 is bos and eos in config.json and generation_config.json"""
    ref = reference_run(REF_GPT2)
    d = fresh_dir("hf_tokenizer")
    hf_dir = os.path.join(d, "hf")
    subprocess.run(HF_EXPORT + [os.path.join(ref["dir"], "model.bin"), hf_dir], check=True, stdout=subprocess.PIPE)
    for src, dst in (("gpt2_encoder.json", "vocab.json"), ("gpt2_vocab.bpe", "merges.txt")):
        with open(os.path.join(ROOT, "dev", "data", src), "rb") as a, open(os.path.join(hf_dir, dst), "rb") as b:
            assert a.read() == b.read(), dst + " is not dev/data/" + src
    with open(os.path.join(hf_dir, "vocab.json")) as f:
        assert json.load(f)["<|endoftext|>"] == 50256
    for name in ("config.json", "generation_config.json"):
        with open(os.path.join(hf_dir, name)) as f:
            cfg = json.load(f)
        assert (cfg["bos_token_id"], cfg["eos_token_id"]) == (50256, 50256), (name, cfg)
    with open(os.path.join(hf_dir, "tokenizer_config.json")) as f:
        tc = json.load(f)
    assert tc["eos_token"] == tc["bos_token"] == "<|endoftext|>" and tc["model_max_length"] == REF_GPT2["max_seq_len"], tc


@test
def newcomer_hf_snippet_tokenizes_and_generates_greedily():
    """the README's snippet on an export: the tokenizer gives the ids the data's tokenizer gave
    (tiny_shakespeare_val.bin starts with <|endoftext|> First Citizen:), and each token the loop
    appends is the argmax of test/reference.py's own GPT-2 (float64) on the same prefix"""
    if tool("transformers") is None:
        raise Skip("transformers not installed (dev/setup.sh installs it into .tools)")
    import torch
    ref = reference_run(REF_GPT2)
    d = fresh_dir("hf_snippet")
    hf_dir = os.path.join(d, "hf")
    subprocess.run(HF_EXPORT + [os.path.join(ref["dir"], "model.bin"), hf_dir], check=True, stdout=subprocess.PIPE)
    check = """
print("IDS", ids[0].tolist())
print("PROMPT", tokenizer("First Citizen:\\nBefore we proceed any further, hear me speak").input_ids)
"""
    tools_dir = os.environ.get("LLMC_TOOLS_DIR", os.path.join(ROOT, ".tools"))
    r = subprocess.run(["/usr/bin/python3", "-c", readme_hf_snippet().replace(HF_SNIPPET_DIR, hf_dir) + check], cwd=ROOT,
                       capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=tools_dir))
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    lines = r.stdout.splitlines()
    ids = json.loads(next(l for l in lines if l.startswith("IDS "))[4:])
    prompt = json.loads(next(l for l in lines if l.startswith("PROMPT "))[7:])
    val = reference.read_tokens(REF_GPT2["val_tokens"])
    assert val[0] == 50256 and prompt == [int(t) for t in val[1:1 + len(prompt)]], (prompt, val[:16])
    assert ids[:3] == prompt[:3] and len(ids) == 3 + 20, ids  # "First", " Citizen", ":" and 20 more
    assert lines[0].startswith("First Citizen:"), r.stdout[:500]
    with open(os.path.join(hf_dir, "config.json")) as f:
        cfg = json.load(f)
    state = {name: torch.from_numpy(array.copy()) for name, (array, _) in
             hf_gpt2.read_safetensors(os.path.join(hf_dir, "model.safetensors")).items()}
    model = reference.load_hf_state_dict(cfg, state).double()
    with torch.no_grad():
        logits = model.logits(torch.tensor([ids[:-1]]))[0].numpy()
    # transformers in fp32 against float64: a near-tie may go either way, within fp32's error on
    # logits of magnitude ~1 (hf_transformers measured 4.8e-7; 1e-5 leaves 20x)
    for k in range(3, len(ids)):
        row = logits[k - 1]
        assert row[ids[k]] >= row.max() - 1e-5, "token %d: chose %d (logit %.7g), the reference's argmax %d (%.7g)" % (
            k, ids[k], row[ids[k]], row.argmax(), row.max())


def newcomer_plot_copy(d):
    """dev/plot_runs.py and dev/plot_diloco.py copied into a repository-like tree d/repo (their
    root is the directory above dev/), and one run's main.log and reference.json"""
    repo = os.path.join(d, "repo")
    os.makedirs(os.path.join(repo, "dev"))
    for name in ("plot_runs.py", "plot_diloco.py"):
        shutil.copy(os.path.join(ROOT, "dev", name), os.path.join(repo, "dev", name))
    run = os.path.join(d, "run")
    os.makedirs(run)
    # distances from the reference: 0 (drawn at the 1e-7 floor), 3e-7, 2e-6
    losses = [10.0, 9.5, 9.0]
    ref = [10.0, 9.5 + 3e-7, 9.0 - 2e-6]
    with open(os.path.join(run, "main.log"), "w") as f:
        for s, loss in enumerate(losses, 1):
            f.write(json.dumps({"step": s, "train_loss": loss, "comm": {"dc": {"all_reduce": 1000 * s}}}) + "\n")
            f.write(json.dumps({"step": s, "val_loss": loss + 0.1}) + "\n")
    with open(os.path.join(run, "reference.json"), "w") as f:
        json.dump({"losses": ref}, f)
    return repo, run


@test
def newcomer_plots_write_under_out_never_in_the_root():
    d = fresh_dir("plots_out")
    repo, run = newcomer_plot_copy(d)
    py = "/usr/bin/python3"
    plot = os.path.join(repo, "dev", "plot_runs.py")
    # no -o: out/plots/losses.png of the repository, from any working directory; the lower
    # panel's range printed (the distances above: 0 .. 2e-6, one at or below the floor)
    r = subprocess.run([py, plot, "--reference", run, "a=" + run], cwd=d, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert os.path.exists(os.path.join(repo, "out", "plots", "losses.png")), r.stdout
    assert "from 0 to 2e-06 (1 of 3 steps at or below the 1e-7 floor)" in r.stdout, r.stdout
    # -o naming a file in the repository's root: written into out/ instead
    r = subprocess.run([py, plot, "-o", "losses.png", "a=" + run], cwd=repo, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert os.path.exists(os.path.join(repo, "out", "losses.png")) and not os.path.exists(os.path.join(repo, "losses.png")), r.stdout
    # elsewhere, -o is where the file goes
    r = subprocess.run([py, plot, "-o", os.path.join(d, "mine.png"), "a=" + run], cwd=repo, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and os.path.exists(os.path.join(d, "mine.png")), r.stdout + r.stderr
    r = subprocess.run([py, os.path.join(repo, "dev", "plot_diloco.py"), "--link-ranks", "2", "x=" + run], cwd=repo,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert os.path.exists(os.path.join(repo, "out", "diloco_vs_ddp", "diloco_vs_ddp.png")), r.stdout
    assert sorted(os.listdir(repo)) == ["dev", "out"], os.listdir(repo)


@test
def newcomer_curves_sh_says_its_ranks_time_and_output():
    """bash dev/curves.sh --help: its rank count (the 3D run's 8), its time, out/ by default and
    --readme for the committed figure; an unknown option is refused before any run"""
    r = subprocess.run(["bash", os.path.join(ROOT, "dev", "curves.sh"), "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    for words in ("8 MPI ranks", "minutes", "out/curves/losses_vs_pytorch.png", "--readme",
                  "dev/images/losses_vs_pytorch.png"):
        assert words in r.stdout, "%r not in:\n%s" % (words, r.stdout)
    r = subprocess.run(["bash", os.path.join(ROOT, "dev", "curves.sh"), "-x"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "unknown option '-x'" in r.stderr, r.stdout + r.stderr


def newcomer_lines(out, text):
    """the lines of out that hold text"""
    return [l for l in out.splitlines() if text in l]


MPI_NOISE = ("MPI_ABORT", "ORTE_ERROR_LOG", "[rank ")


@test
def newcomer_layout_errors_print_once_and_end_without_abort_noise():
    """an error every rank meets alike (a layout that does not fit, a batch that does not divide,
    a missing data file every rank opens) is printed once, without a rank, and the job ends by
    exit status: no MPI_Abort report, no ORTE_ERROR_LOG"""
    data = os.path.join(ROOT, "dev/data/tinyshakespeare/tiny_shakespeare_train.bin")
    cases = [
        (TP, 2, ["-e", "d2", "-tp", 3], "-tp 3: this trainer puts every rank in one tensor-parallel group"),
        (TP, 3, ["-e", "d4", "-x", 1], "-tp 3: tensor parallelism splits the heads NH = 4 over the ranks"),
        ("./train_gpt2_dp", 2, ["-e", "d2", "-d", 1000], "-d 1000 must be a positive multiple of B*T*ranks = 4*64*2 = 512"),
        ("./train_gpt2_dp", 2, ["-e", "d2", "-i", data + ".nope"], "cannot open file '%s.nope' (-i: train token file)" % data),
        # (found by a newcomer's walk through the trainers: each printed once a rank, with MPI_Abort's report)
        ("./train_gpt2_dp", 2, ["-e", "nope_model.bin"], "cannot open file 'nope_model.bin' (-e: model file"),
        ("./train_gpt2_dp", 2, ["-e", "d0"], "-e 'd0' is neither a model file nor a descriptor"),
        ("./train_gpt2_dp", 2, ["-e", "d2", "-b", 100000, "-t", 1024], "not enough memory: "),
        ("./train_gpt2_pp", 3, ["-e", "d4", "-x", 1], "the model's L = 4 layers cannot be split into pp x vp = 3 x 1"),
        ("./train_gpt2_pp", 2, ["-e", "d2", "-sched", "foo"], "-sched foo: unknown schedule"),
        ("./train_gpt2_cp", 3, ["-e", "d4", "-x", 1], "-t 64: the zigzag split cuts each sequence into 6 chunks"),
        ("./train_gpt2_cp", 2, ["-e", "d2", "-cp_layout", "foo"], "-cp_layout foo: expected zigzag or contiguous"),
        # an LLMC_* variable's value, checked at the start (not at the first launch that reads it)
        ("./train_gpt2_dp", 2, ["-e", "d2", "-x", 1], "LLMC_KERNEL_TIMES=yes: expected 0 or 1", {"LLMC_KERNEL_TIMES": "yes"}),
    ]
    for program, ranks, args, message, *env in cases:
        code, out = mpirun(ranks, args, timeout=60, program=program, env=env[0] if env else None)
        assert code == 1, "%s %s: exit %d\n%s" % (program, args, code, out[-2000:])
        assert len(newcomer_lines(out, message)) == 1, "%r not printed exactly once:\n%s" % (message, out[-2000:])
        assert "error: " + message in out, out[-2000:]
        for noise in MPI_NOISE:
            assert noise not in out, "%s %s: %r in\n%s" % (program, args, noise, out[-2000:])
    # a rank alone (no mpirun): the same, and no MPI_Abort report either
    p = subprocess.run(["./train_gpt2_dp", "-e", "d2", "-i", "nope.bin"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and "cannot open file 'nope.bin'" in p.stderr, p.stderr
    assert not any(noise in p.stdout + p.stderr for noise in ("MPI_ABORT", "ORTE_ERROR_LOG")), p.stderr


@test
def newcomer_file_error_names_its_flag_and_the_working_directory():
    """run from another directory, a copy of the trainer with no data beside it (the default data
    path is relative to the repository's root, and also looked for beside the program) finds no
    default: the message names -i, says it is the default, and where relative paths start"""
    d = fresh_dir("other_cwd")
    os.makedirs(os.path.join(d, "bin"))
    alone = os.path.join(d, "bin", "train_gpt2_dp")
    shutil.copy(os.path.join(ROOT, "train_gpt2_dp"), alone)
    program = os.path.join(ROOT, "train_gpt2_dp")
    p = subprocess.run([alone, "-e", "d2"], cwd=d, capture_output=True, text=True, timeout=60)
    assert p.returncode == 1, p.stdout + p.stderr
    want = ("cannot open file 'dev/data/tinyshakespeare/tiny_shakespeare_train.bin' (-i: train token file; the default) "
            "for reading: No such file or directory; a relative path starts at the working directory, " + os.path.realpath(d))
    assert want in p.stderr, p.stderr
    for args, flag in ((["-j", "nope_val.bin"], "(-j: validation token file)"), (["-e", "nope_model.bin"], "(-e: model file")):
        p = subprocess.run([program, "-i", os.path.join(ROOT, "dev/data/tinyshakespeare/tiny_shakespeare_train.bin")] + args,
                           cwd=d, capture_output=True, text=True, timeout=60)
        assert p.returncode == 1 and ("'%s' %s" % (args[1], flag)) in p.stderr, p.stderr
    # an absolute path needs no word on the working directory
    p = subprocess.run([program, "-e", "d2", "-i", "/nonexistent/x.bin"], cwd=d, capture_output=True, text=True, timeout=60)
    assert "cannot open file '/nonexistent/x.bin' (-i: train token file) for reading" in p.stderr, p.stderr
    assert "working directory" not in p.stderr, p.stderr


def newcomer_trainers():
    """{trainer: its flags}, from each built trainer's --help (the truth args.h's table must match)"""
    flags = {}
    for src in sorted(glob.glob(os.path.join(ROOT, "train_gpt2_*.cu"))):
        name = os.path.basename(src)[:-3]
        p = subprocess.run([os.path.join(ROOT, name), "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, name + ": " + p.stderr
        flags[name] = set(re.findall(r"^  (-\S+) ", p.stdout, re.M))
    return flags


@test
def newcomer_flag_of_another_trainer_names_the_trainers_that_take_it():
    """every flag that some trainers take and others do not, given to one that does not: the
    message names exactly the trainers whose --help lists it"""
    flags = newcomer_trainers()
    every = set.intersection(*flags.values())
    for flag in sorted(set.union(*flags.values()) - every):
        owners = {t for t in flags if flag in flags[t]}
        for program in sorted(set(flags) - owners):
            p = subprocess.run(["./" + program, flag, "1"], cwd=ROOT, capture_output=True, text=True, timeout=60)
            assert p.returncode == 1, (program, flag, p.stderr)
            m = re.search(r"unknown flag '%s': %s is a flag of (.*), not of %s" % (re.escape(flag), re.escape(flag), program),
                          p.stderr)
            assert m, "%s %s: no trainers named in\n%s" % (program, flag, p.stderr)
            named = set(re.findall(r"train_gpt2_\w+", m.group(1)))
            assert named == owners, "%s %s: names %s, the trainers that take it are %s" % (program, flag, sorted(named),
                                                                                         sorted(owners))
    # the README's example: -z to the TP trainer, once under mpirun
    code, out = mpirun(2, ["-z", 1], timeout=60, program=TP)
    assert code == 1 and len(newcomer_lines(out, "unknown flag '-z'")) == 1, out


@test
def newcomer_bad_flag_prints_the_error_first_and_a_hint():
    """--steps: the error on the first line, one line pointing to --help, not the table of flags;
    once under mpirun with 2 ranks"""
    p = subprocess.run(["./train_gpt2_dp", "--steps", "3"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    lines = p.stderr.splitlines()
    assert p.returncode == 1 and lines[0].startswith("error: unknown flag '--steps'"), p.stderr
    assert len(lines) == 2 and "--help" in lines[1] and "usage:" not in p.stdout + p.stderr, p.stdout + p.stderr
    p = subprocess.run(["./train_gpt2_dp", "--tp", "2"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert "-tp is a flag of train_gpt2_tp and train_gpt2_3d" in p.stderr and "one dash" in p.stderr, p.stderr
    code, out = mpirun(2, ["--steps", 3], timeout=60)
    assert code == 1 and len(newcomer_lines(out, "unknown flag '--steps'")) == 1, out
    assert len(newcomer_lines(out, "--help")) == 1 and "[rank " not in out, out


@test
def newcomer_help_shows_the_defaults_not_the_values_given():
    """--help after other flags prints the same table as --help alone (the values given are not
    defaults), and under mpirun it is printed once"""
    alone = subprocess.run(["./train_gpt2_dp", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    given = subprocess.run(["./train_gpt2_dp", "-e", "d2", "-b", "7", "-l", "0.5", "--help"], cwd=ROOT, capture_output=True,
                           text=True, timeout=60)
    assert alone.returncode == given.returncode == 0, alone.stderr + given.stderr
    assert given.stdout == alone.stdout, "--help after -e d2 -b 7 -l 0.5 differs from --help alone"
    assert "(default: d2)" not in given.stdout and "(default: 7;" not in given.stdout, given.stdout
    code, out = mpirun(2, ["-e", "d2", "--help"], timeout=60)
    assert code == 0 and out.count("usage: ") == 1, out[:2000]


@test
def newcomer_memory_planner_plans_the_quick_start():
    """-device cpu means fp32 (the CPU backend's only); the quick start's run (2 ranks of
    train_gpt2_dp, -e d4 -b 4 -t 64 -n 50) planned with -dp 2 -device cpu gives the trainer's own
    total; the planner's errors carry no rank"""
    code, out = planner("-e", "d4", "-b", 4, "-t", 64, "-dp", 2, "-n", 50, "-device", "cpu")
    assert code == 0 and "CPU fp32" in out, out
    code_fp32, out_fp32 = planner("-e", "d4", "-b", 4, "-t", 64, "-dp", 2, "-n", 50, "-device", "cpu", "-precision", "fp32")
    assert out_fp32 == out, "-device cpu is not -device cpu -precision fp32"
    total = re.search(r"^  total +([\d.]+ MB)", out, re.M).group(1)
    d = fresh_dir("planner_quickstart")
    run = run_ok(2, ["-e", "d4", "-b", 4, "-t", 64, "-x", 0, "-v", 0, "-s", 0, "-n", 50, "-o", os.path.join(d, "out")])
    assert re.search(r"^  total +%s" % re.escape(total), run, re.M), "planner %s, the trainer:\n%s" % (total, run[-3000:])
    code, out = planner("-e", "d12", "-device", "cpu", "-precision", "bf16")
    assert code == 1 and out.startswith("error: -device cpu trains in fp32 only"), out
    code, out = planner("-zz", 1)
    assert code == 1 and out.startswith("error: unknown flag '-zz'") and "[rank" not in out, out


@test
def readme_run_block_runs_as_pasted():
    """the README's "To run a trainer yourself" block pasted into bash as it stands, each -x cut to
    one step: its first line's exports are the only mpirun setup (no OMPI_* from the caller, as
    for a newcomer who is root on a 2-core laptop), every command exits 0, every trainer prints its
    step line and make compare its PASS"""
    readme = open(os.path.join(ROOT, "README.md")).read()
    start = readme.index("```bash\n", readme.index("To run a trainer yourself")) + len("```bash\n")
    block = readme[start:readme.index("```", start)]
    trainers = len(re.findall(r"\./train_gpt2_\w+ ", block))
    assert trainers >= 8 and "OMPI_ALLOW_RUN_AS_ROOT=1" in block, block
    block = re.sub(r"-x \d+", "-x 1", block)  # the commands as written, for one step each
    out = fresh_dir("readme_block")
    block = block.replace("-o out/", "-o %s/" % out)
    # (nor the make that runs the tests: its jobserver and level would pass to the block's make)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("OMPI_") and k not in ("OMP_NUM_THREADS", "MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    env["BACKEND"] = "cpu"  # (make's default on a machine with a GPU builds the CUDA trainers here)
    p = subprocess.run(["bash", "-e", "-c", block], cwd=ROOT, env=env, capture_output=True, timeout=1800)
    out = p.stdout.decode("utf-8", "replace")  # (the samples are byte tokens, not always whole UTF-8)
    assert p.returncode == 0, (out + p.stderr.decode("utf-8", "replace"))[-4000:]
    # every trainer's step line (the averages need a second step)
    assert len(re.findall(r"^step +1/1 \|", out, re.M)) == trainers, out[-4000:]
    if "make compare" in block:
        assert "PASS: the trainer matches PyTorch" in out, out[-3000:]


@test
def make_train_takes_steps_and_resume_and_says_how_to_go_on():
    """make train's knobs on the quick start's model: STEPS=2 trains 2 steps into QUICKSTART; run
    again it stops (exit non-zero, nothing written) naming the finished run's model file and the
    command for another dir; RESUME=1 resumes from step 2 rather than refusing"""
    d = fresh_dir("make_train")
    qs = os.path.join(d, "qs")
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    env["BACKEND"] = "cpu"

    def make_train(*knobs):
        p = subprocess.run(["make", "-s", "train", "STEPS=2", "QUICKSTART=" + qs] + list(knobs), cwd=ROOT, env=env,
                           capture_output=True, timeout=900)
        return p.returncode, (p.stdout + p.stderr).decode("utf-8", "replace")

    rc, out = make_train()
    assert rc == 0 and "step    2/2" in out, out[-3000:]
    before = dir_snapshot(qs)
    rc, out = make_train()
    assert rc != 0 and "holds a finished run of 2 steps" in out and "model_00000002.bin" in out, out[-2000:]
    assert "QUICKSTART=out/another" in out and "STEPS=2" in out, out[-2000:]
    assert dir_snapshot(qs) == before, "the refused run wrote into " + qs
    rc, out = make_train("RESUME=1")
    assert rc == 0 and "resumed from step 2 in " + qs in out, out[-3000:]


# More tests, a file per subject (test/tests_<subject>.py): each is read into this module, so it
# uses the helpers above (test, mpirun, run_ok, fresh_dir, reference_run, ...) as if written here,
# and its tests run in the order of the files' names after the ones above.
for _path in sorted(glob.glob(os.path.join(ROOT, "test", "tests_*.py"))):
    exec(compile(open(_path).read(), _path, "exec"))


def main():
    os.makedirs(TMP, exist_ok=True)
    free = shutil.disk_usage(TMP).free
    if free < DISK_NEEDED:
        print("error: %s has %.1f GB free on its disk; the tests need about %.0f GB (their checkpoints and "
              "builds). Free some space and run again." % (TMP, free / 1e9, DISK_NEEDED / 1e9))
        print("0 passed, 1 failed, 0 skipped")
        sys.exit(1)
    pattern = sys.argv[1] if len(sys.argv) > 1 else ""
    # REF's tokens, made before any test: a test that names REF["tokens"] (or MOE's) without
    # calling reference_run first would otherwise pass only after one that did
    shared_dir(SMALL_VOCAB, small_vocabulary)
    jobs = int(os.environ.get("TEST_JOBS", os.cpu_count() or 1))
    if pattern in "cuda_compiles_for_sm80_and_sm90":
        start_cuda_check()
    selected = [fn for fn in TESTS if pattern in fn.__name__]
    counts = {"PASS": 0, "FAIL": 0, "SKIP": 0}
    durations, start = [], time.time()

    def report(name, result):
        outcome, seconds, printed, message = result
        counts[outcome] += 1
        durations.append((seconds, name))
        sys.stdout.write(printed)
        if outcome == "SKIP":
            print("SKIP %s: %s" % (name, message), flush=True)
        else:
            print("%s %s (%.1fs)%s" % (outcome, name, seconds, message), flush=True)

    later = [fn for fn in selected if fn.__name__ in IN_MAIN_PROCESS] if jobs > 1 else []
    if jobs > 1:
        # fork: the workers start with this module as it is, every test registered
        pool = concurrent.futures.ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork"))
        futures = {pool.submit(run_test_named, fn.__name__): fn.__name__ for fn in selected if fn not in later}
        for future in concurrent.futures.as_completed(futures):
            try:
                result = future.result()
            except Exception as e:  # the worker process died (a crash of Python itself)
                result = ("FAIL", 0.0, "", ": its worker process ended: %r" % e)
            report(futures[future], result)
        pool.shutdown()
    for fn in (later if jobs > 1 else selected):
        report(fn.__name__, run_test(fn, capture=False))
    # where the suite's time goes (a test's time includes the builds it waits for)
    print("the slowest tests (%.0f s in all, %d at a time):" % (time.time() - start, jobs))
    for seconds, name in sorted(durations, reverse=True)[:15]:
        print("  %6.1f s  %s" % (seconds, name))
    print("%d passed, %d failed, %d skipped" % (counts["PASS"], counts["FAIL"], counts["SKIP"]))
    sys.exit(1 if counts["FAIL"] else 0)


if __name__ == "__main__":
    main()
