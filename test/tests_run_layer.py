# The shared run layer (llmc/run.h, train.h, checkpoint.h, utils.h), dev/memory_planner and its
# page, dev/setup.sh: issue 58's faults. Read by test/run_tests.py into its namespace, so its
# helpers (test, mpirun, run_ok, fresh_dir, planner, ...) are used here as they are.

# dev/memory_planner -device cpu plans the CPU build; each layout below is one that a trainer
# might refuse (recomputation, ZeRO, -sp, -offload, cp's comm, ep, a capacity), 2 or 4 ranks of d4
PLANNED_LAYOUTS = [
    dict(dp=2, z=1, r=1), dict(dp=2, z=3, offload=1, r=2),
    dict(tp=2, sp=1, r=1), dict(tp=2, z=1),
    dict(pp=2, sched="interleaved", vp=2, r=2, d=64),
    dict(cp=2, cp_comm="allgather", r=1), dict(cp=2, z=1),
    dict(dp=2, tp=2, sp=1, z=1, r=2, trainer="3d"),
    dict(dp=2, trainer="diloco", r=1), dict(dp=2, trainer="diloco", z=1),
    dict(dp=2, experts=4, ep=2, capacity_factor=1.5),
    dict(dp=2, experts=4, ep=2, r=1), dict(dp=2, experts=4, ep=1, r=2),
]


@test
def planner_commands_start_in_their_trainers():
    """every layout the planner accepts prints a command (mpirun -np N ./train_gpt2_X ...), and
    that very command starts and takes its step (one, -x 1, on the CPU backend); what the
    trainer would refuse (train_gpt2_ep's -r 1 and 2, a ZeRO stage the trainer lacks) the
    planner refuses itself, with the trainer's reason, and prints no command. So no layout that
    the planner or the page offers is one its trainer refuses"""
    make(["BACKEND=cpu", "dev/memory_planner", "train_gpt2_dp", "train_gpt2_tp", "train_gpt2_pp", "train_gpt2_cp",
          "train_gpt2_3d", "train_gpt2_diloco", "train_gpt2_ep"])
    started, refused = [], []
    for layout in PLANNED_LAYOUTS:
        flags = ["-e", "d4", "-b", 1, "-t", 32, "-device", "cpu", "-format", "json"]
        flags += [x for k, v in layout.items() for x in ("-" + k, v)]
        code, out = planner(*flags)
        if code == 1:  # refused: the reason, and nothing else
            assert out.startswith("error: ") and "{" not in out, "%s: %s" % (layout, out)
            refused.append((layout, out.strip()))
            continue
        assert code in (0, 2), "%s: exit %d\n%s" % (layout, code, out)
        command = json.loads(out)["command"].split()
        assert command[:2] == ["mpirun", "-np"] and command[3].startswith("./train_gpt2_"), command
        args = command[4:] + ["-x", 1, "-v", 0, "-s", 0, "-o", fresh_dir("planned_%d" % len(started))]
        rc, run = mpirun(int(command[2]), args, program=command[3], timeout=120)
        assert rc == 0, "the planner's command for %s, %s, is refused by its trainer:\n%s" % (
            layout, " ".join(command), why_it_failed(run))
        assert "step    1/1" in run, run[-2000:]
        started.append(" ".join(command))
    reasons = {json.dumps(layout, sort_keys=True): why for layout, why in refused}
    for layout in (dict(dp=2, experts=4, ep=2, r=1), dict(dp=2, experts=4, ep=1, r=2)):
        why = reasons.get(json.dumps(layout, sort_keys=True), "(accepted)")
        assert "train_gpt2_ep keeps every activation (-r 0)" in why, "%s: %s" % (layout, why)
    # (the dense trainers run every -r: at least these started)
    assert len(started) >= 8, started


@test
def planner_refuses_capacity_factor_without_experts():
    """-capacity_factor caps the experts of a MoE model: on a dense one the planner used to plan
    the dense trainer and drop the flag without a word; it names the flag and what it needs"""
    code, out = planner("-e", "d12", "-dp", 2, "-capacity_factor", 1.25)
    assert code == 1 and "-capacity_factor 1.25" in out and "-experts" in out, "exit %d\n%s" % (code, out)
    code, out = planner("-e", "d12", "-dp", 2, "-experts", 4, "-ep", 2, "-capacity_factor", 1.25)
    assert code == 0 and "-capacity_factor 1.25" in out, "exit %d\n%s" % (code, out)


def error_lines(out):
    """the lines of a job's output that report an error (ours, or MPI's abort)"""
    return [l for l in out.splitlines() if re.search(r"\berror\b|MPI_ABORT", l)]


def check_error_once(out, message):
    """message printed once, by rank 0 without a rank, and the job ended without an abort"""
    lines = error_lines(out)
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], \
        "%r: expected one 'error: ...' line\n%s" % (message, "\n".join(lines) or out[-2000:])
    assert "[rank" not in out and "MPI_ABORT" not in out, out[-2000:]


@test
def errors_every_rank_meets_print_once_by_rank_0():
    """2 ranks that meet the same error at run time: a non-finite loss (-l 1e30), a resume with
    another run's flags, a model file whose checksum fails, a checkpoint's model file of another
    checkpoint: one message, from rank 0, not one a rank interleaved, and no MPI abort report.
    A file only one rank finds bad (rank 1's state file) is still reported by that rank"""
    d = fresh_dir("nonfinite_once")
    code, out = mpirun(2, small_run_args(d, ["-l", 1e30, "-v", 0]), timeout=120)
    assert code != 0, out[-2000:]
    check_error_once(out, "step 2: the loss is")
    d = finished_run("another_run_once")
    code, out = mpirun(2, small_run_args(d, ["-x", 6, "-l", 2e-3, "-y", 1]), timeout=60)
    assert code != 0, out[-2000:]
    check_error_once(out, "belongs to another run: -l:")
    model = os.path.join(d, "model_00000004.bin")
    bad = os.path.join(fresh_dir("bad_model_once"), "model.bin")
    shutil.copy(model, bad)
    corrupt(bad, "flip")
    code, out = mpirun(2, small_run_args(fresh_dir("bad_model_out"), ["-e", bad]), timeout=60)
    assert code != 0, out[-2000:]
    check_error_once(out, "model.bin")
    shutil.copy(os.path.join(d, "model_00000002.bin"), model)  # (the state files record another CRC)
    code, out = mpirun(2, small_run_args(d, ["-x", 6, "-y", 1]), timeout=60)
    assert code != 0, out[-2000:]
    check_error_once(out, "the files of this checkpoint do not belong together")
    d = finished_run("one_rank_bad_state")
    corrupt(os.path.join(d, "state_00000004_00001.bin"), "flip")
    code, out = mpirun(2, small_run_args(d, ["-x", 6, "-y", 1]), timeout=60)
    assert code != 0 and "[rank 1] error: state file" in out and "[rank 0] error" not in out, out[-3000:]


EP_SMALL = ["-e", "d2", "-b", 1, "-t", 32, "-experts", 4, "-v", 0, "-s", 0, "-n", 1]


@test
def resume_on_another_world_names_the_rank_count():
    """train_gpt2_ep's checkpoints resume on any ep, but with -d left at -1 the batch is B*T per
    rank: a 2-rank checkpoint resumed by 1 rank is another run, and the refusal names the rank
    counts (it used to say only "-d: 64 in the checkpoint, 32 now", a flag never given). With
    -d given as the checkpoint's 64, the same run resumes on 1 rank"""
    make(["BACKEND=cpu", "train_gpt2_ep"])
    d = fresh_dir("ep_world")
    run_ok(2, EP_SMALL + ["-x", 1, "-o", d], program="./train_gpt2_ep")
    code, out = mpirun(1, EP_SMALL + ["-x", 2, "-y", 1, "-o", d], program="./train_gpt2_ep", timeout=60)
    want = "-d: 64 in the checkpoint (-d -1: B*T*ranks, ranks = 2), 32 now (-d -1: B*T*ranks, ranks = 1)"
    assert code != 0 and want in out, "exit %d, %r not in\n%s" % (code, want, out[-2000:])
    out = run_ok(1, EP_SMALL + ["-x", 2, "-y", 1, "-d", 64, "-o", d], program="./train_gpt2_ep")
    assert "resumed from step 1" in out, out[-2000:]


@test
def ep_checkpoint_given_to_another_trainer_names_train_gpt2_ep():
    """an EP checkpoint (one gathered state file) resumed by train_gpt2_dp, tp or diloco (a state
    file per rank): the refusal names train_gpt2_ep as its writer, not train_gpt2_cp or _3d; a CP
    checkpoint still names those two"""
    make(["BACKEND=cpu", "train_gpt2_ep", "train_gpt2_dp", "train_gpt2_tp", "train_gpt2_diloco", "train_gpt2_cp"])
    d = fresh_dir("ep_checkpoint")
    run_ok(2, EP_SMALL + ["-x", 1, "-o", d], program="./train_gpt2_ep")
    for reader in ("./train_gpt2_dp", "./train_gpt2_tp", "./train_gpt2_diloco"):
        code, out = mpirun(2, ["-e", "d2", "-b", 1, "-t", 32, "-v", 0, "-s", 0, "-x", 2, "-y", 1, "-o", d],
                           program=reader, timeout=60)
        assert code != 0 and "which train_gpt2_ep (its Mixture-of-Experts model) writes" in out, \
            "%s: exit %d\n%s" % (reader, code, out[-2000:])
        check_error_once(out, "is another trainer's")
    d = fresh_dir("cp_checkpoint")
    run_ok(2, small_run_args(d, ["-x", 2]), program=CP)
    code, out = mpirun(2, small_run_args(d, ["-x", 4, "-y", 1]), timeout=60)
    assert code != 0 and "which train_gpt2_cp or train_gpt2_3d writes" in out, out[-2000:]


@test
def diloco_extension_refused_before_resumed_from_step():
    """a finished DiLoCo run of -x 4 (-H 3: its last step took an outer step off the schedule)
    extended to -x 9 is refused (train_gpt2_diloco's check_resume), and the refusal comes before
    any "resumed from step" line, which would say the resume went ahead; printed once"""
    make(["BACKEND=cpu", "train_gpt2_diloco"])
    ref = reference_run()
    d = fresh_dir("diloco_extend_order")
    run_ok(2, trainer_args(ref, 4, d, ["-q", 1, "-H", 3, "-x", 4, "-n", 4]), program=DILOCO)
    code, out = mpirun(2, trainer_args(ref, 4, d, ["-q", 1, "-H", 3, "-x", 9, "-n", 9, "-y", 1]), timeout=60,
                       program=DILOCO)
    assert code != 0 and "took an outer step off the schedule" in out, out[-2000:]
    assert "resumed from step" not in out, out[-2000:]
    check_error_once(out, "took an outer step off the schedule")


@test
def setup_remembers_an_optional_install_that_failed():
    """dev/setup.sh with the WebAssembly toolchain hidden (a clang on PATH that fails) and an
    apt-get that cannot install: the first run tries the wasm row's packages (compiler-rt's wasm32
    builtins among them: wasm-ld needs them), fails softly (the tool is optional: exit 0) and
    remembers it; the next run, as every `make train` runs it, calls no apt-get and prints the
    table once, saying how to retry; --retry tries again, and so does a run RETRY_DAYS later"""
    bin_dir = fresh_dir("setup_fake_bin")
    log = os.path.join(bin_dir, "apt-get.log")
    with open(os.path.join(bin_dir, "apt-get"), "w") as f:  # (update works, install fails as on a release without the package)
        f.write('#!/bin/sh\necho "$@" >> %s\n[ "$1" = update ] && exit 0\nexit 100\n' % log)
    with open(os.path.join(bin_dir, "clang"), "w") as f:
        f.write("#!/bin/sh\nexit 1\n")
    for name in ("apt-get", "clang"):
        os.chmod(os.path.join(bin_dir, name), 0o755)
    failed = os.path.join(bin_dir, "setup_failed")
    env = dict(os.environ, PATH=bin_dir + ":" + os.environ["PATH"], LLMC_SETUP_FAILED=failed)

    def setup(*flags):
        if os.path.exists(log):
            os.remove(log)
        p = subprocess.run([SETUP] + list(flags), cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=300)
        calls = open(log).read().splitlines() if os.path.exists(log) else []
        return p.returncode, p.stdout, calls
    code, out, calls = setup()
    wasm_packages = next(r[3] for r in setup_tool_rows() if r[0] == "wasm")[len("apt:"):].split()
    assert "libclang-rt-dev-wasm32" in wasm_packages, wasm_packages
    assert code == 0 and any(c.split()[-len(wasm_packages):] == wasm_packages for c in calls if "install" in c), (calls, out)
    assert re.match(r"^wasm\|\d+$", open(failed).read().strip()), open(failed).read()
    code, out, calls = setup()
    assert code == 0 and calls == [], "a second run called apt-get %s\n%s" % (calls, out)
    assert out.count("found    required  gcc") == 1, out
    assert re.search(r"^missing\s+optional\s+wasm\s.*its install failed on \d{4}-\d\d-\d\d: dev/setup.sh --retry", out, re.M), out
    code, out, calls = setup("--retry")
    assert code == 0 and any("install" in c for c in calls), (calls, out)
    with open(failed, "w") as f:  # failed 8 days ago: tried again
        f.write("wasm|%d\n" % (time.time() - 8 * 86400))
    code, out, calls = setup()
    assert code == 0 and any("install" in c for c in calls), (calls, out)


@test
def memory_page_backend_defaults_and_run_it_only_with_a_plan():
    """dev/memory.html in headless Chromium: under device=cpu the backend's fields show the CPU's
    defaults (fp32, the CPU's own attention), not the CUDA ones; under cuda bf16 and flash. The
    "Run it" box (build and command lines) shows with a plan, and is hidden after a refusal and in
    a search, which have no command, instead of two empty boxes"""
    if tool("chromium") is None:
        raise Skip("no chromium (dev/setup.sh installs it)")
    from browser import Browser
    browser = Browser(tool("chromium").split()[0], fresh_dir("page_profile"))

    def first_option(html_text, key):  # the select's default entry, as the page shows it
        m = re.search(r'<select name="%s" id="input-%s">\s*<option value="">([^<]*)</option>' % (key, key), html_text)
        assert m, "no select %s" % key
        return m.group(1)

    def run_it_hidden(html_text):
        m = re.search(r'<div id="run-it"( hidden(="")?)?>', html_text)
        assert m, "no run-it box"
        return m.group(1) is not None
    try:
        cpu = browser.dom(memory_page_url([("e", "d4"), ("b", "4"), ("t", "64"), ("dp", "2"), ("device", "cpu")]))
        cuda = browser.dom(memory_page_url([("e", "d4"), ("b", "4"), ("t", "64"), ("dp", "2")]))
        for page, precision, attention in ((cpu, "fp32", "CPU"), (cuda, "bf16", "flash")):
            assert precision in first_option(page, "precision") and attention in first_option(page, "attention"), \
                (first_option(page, "precision"), first_option(page, "attention"))
        assert "bf16" not in first_option(cpu, "precision") and "flash" not in first_option(cpu, "attention")
        for page in (cpu, cuda):
            dom = MemoryPageDom()
            dom.feed(page)
            assert dom.state == "fits" and not run_it_hidden(page) and dom.texts["command"].startswith("mpirun -np 2"), \
                (dom.state, dom.texts.get("command"))
        refused = browser.dom(memory_page_url([("e", "d12"), ("tp", "5")]))
        search = browser.dom(memory_page_url([("e", "d12"), ("search", "4")]))
        for name, page in (("a refusal", refused), ("a search", search)):
            dom = MemoryPageDom()
            dom.feed(page)
            assert dom.state in ("error", "fits") and run_it_hidden(page), "%s: state %s, run-it shown" % (name, dom.state)
    finally:
        browser.close()


@test
def newcomer_one_process_lock_and_tokenizer():
    """three small things a newcomer meets. A run of one process prints no "world all_reduce ...
    (ring 0 B)": nothing crosses a link, and it says so. LOCK, there so that a second job on the
    same -o stops while the first runs (reliability_second_job_on_one_output_dir_stops), is gone
    once the run has ended, finished or refused. A run from another directory that gives -i and
    -j (the paths of its data) and leaves -tok at its default still samples, without a warning
    about -tok: the default tokenizer is found beside the program; a -tok given that is not there
    is still warned about"""
    make(["BACKEND=cpu", "train_gpt2_dp"])
    d = fresh_dir("one_process")
    out = run_ok(1, small_run_args(d))
    assert "(ring 0 B)" not in out and "none crosses a link" in out, out[-2000:]
    assert "LOCK" not in os.listdir(d), os.listdir(d)
    code, out = mpirun(2, small_run_args(d, ["-x", 6, "-l", 1e-3, "-y", 1]), timeout=60)
    assert code != 0 and "LOCK" not in os.listdir(d), (code, os.listdir(d))
    elsewhere = fresh_dir("elsewhere")
    data = os.path.join(ROOT, "dev", "data", "tinyshakespeare", "tiny_shakespeare_%s.bin")
    args = ["-e", "d2", "-b", 1, "-t", 32, "-x", 1, "-v", 0, "-s", 1, "-g", 4, "-i", data % "train", "-j", data % "val"]
    for extra, warned in (([], False), (["-tok", "no_tokenizer.bin"], True)):
        p = subprocess.run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "1", os.path.join(ROOT, "train_gpt2_dp")]
                           + [str(a) for a in args + extra], cwd=elsewhere, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))
        assert p.returncode == 0, p.stdout[-2000:]
        assert ("warning: no tokenizer" in p.stdout) == warned and ("---- sample at step 1 ----" in p.stdout) != warned, \
            "%s: %s" % (extra, p.stdout[-2000:])
