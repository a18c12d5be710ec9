# What a new user's first tries met (a trial run through the README): the README's prepare.py
# command on a corpus of their own, an unquoted -i pattern that the shell expanded, and scoring a
# model from outside the repository's root. Read by run_tests.py into its namespace (its helpers:
# @test, mpirun, fresh_dir, hellaswag_setup, hellaswag_check, ...).
import shlex


def readme_prepare_command():
    """the README's prepare.py line in the first code block under "Training on real data": (its
    command, its comment). (Not readme_section: the block's "# ..." comment lines read as headings)"""
    readme = open(os.path.join(ROOT, "README.md")).read()
    m = re.search(r"^## Training on real data\n.*?^```bash\n(.*?)^```", readme, re.M | re.S)
    assert m, "no bash block under the README's heading 'Training on real data'"
    lines = [l for l in m.group(1).splitlines() if l.startswith("/usr/bin/python3 dev/data/prepare.py ")]
    assert len(lines) == 1, "expected one prepare.py command in the block, found %d" % len(lines)
    command, _, comment = lines[0].partition("#")
    return command, comment


@test
def docs_readme_prepare_command_runs_on_a_corpus_under_one_shard():
    """the README's prepare.py command, pasted into bash as it stands from a directory holding
    notes/*.txt and corpus.jsonl of ~200k tokens (far under the default validation split of one
    10^8-token shard, which left no training shard: exit 1 before the README gave --val_tokens),
    writes the files that its comment gives to -i and -j, the validation split holding the
    --val_tokens that the command asks for and the training shards the rest"""
    command, comment = readme_prepare_command()
    d = fresh_dir("usage_prepare")
    # the corpus: tiny Shakespeare's text cut into two text files and a JSONL of its paragraphs
    text = open(os.path.join(ROOT, "dev/data/tinyshakespeare/tinyshakespeare.txt"), encoding="utf-8").read()
    os.makedirs(os.path.join(d, "notes"))
    for name, part in (("a.txt", text[:300000]), ("b.txt", text[300000:550000])):
        with open(os.path.join(d, "notes", name), "w", encoding="utf-8") as f:
            f.write(part)
    with open(os.path.join(d, "corpus.jsonl"), "w", encoding="utf-8") as f:
        for paragraph in text[550000:650000].split("\n\n"):
            f.write(json.dumps({"text": paragraph}) + "\n")
    # run from d, as the reader runs it from their own directory; the script by its full path
    script = shlex.quote(os.path.join(ROOT, "dev/data/prepare.py"))
    p = subprocess.run(["bash", "-c", command.replace("dev/data/prepare.py", script, 1)], cwd=d, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, "the README's command %r exited %d:\n%s" % (command, p.returncode, p.stderr[-2000:])
    # the comment's -i and -j: each names files that are there (the pattern as the trainer globs it)
    words = shlex.split(comment)
    assert "-i" in words and "-j" in words, "the comment gives no -i and -j: %r" % comment
    train = sorted(glob.glob(os.path.join(d, words[words.index("-i") + 1])))
    val = os.path.join(d, words[words.index("-j") + 1])
    assert train and os.path.isfile(val), (train, val, os.listdir(os.path.join(d, "out", "mydata")))
    # the split: the command's --val_tokens tokens in -j, the stream's others in -i (all of them:
    # the tokens' count from reading the files, not from prepare.py's report)
    val_tokens = int(shlex.split(command)[shlex.split(command).index("--val_tokens") + 1])
    assert len(reference.read_tokens(val)) == val_tokens, (len(reference.read_tokens(val)), val_tokens)
    assert sum(len(reference.read_tokens(f)) for f in train) > 0, train


@test
def shards_unquoted_pattern_the_shell_expanded_is_named_once():
    """-i dir/*.bin left unquoted reaches the trainer as -i dir/a dir/b ...: the second file was an
    'unknown flag' alone. Under mpirun with 2 ranks the error now names the flag before it and the
    quoted pattern (the two names' common start and end around a '*'), printed once (by rank 0),
    and every rank exits 1; the same after -e (a string flag too), while an unknown word after an
    integer flag's value gets no such note (it is no file that a string flag was given)"""
    d = fresh_dir("usage_expanded")
    names = [os.path.join(d, "data_train_%06d.bin" % k) for k in (1, 2, 3)]
    hint = ("(after -i: a pattern the shell expanded? quote it: -i '%s')"
            % os.path.join(d, "data_train_*.bin"))
    code, out = mpirun(2, ["-i"] + names + ["-x", 1])
    assert code == 1, "exit %d, expected 1:\n%s" % (code, out[-2000:])
    assert out.count("unknown flag '%s' %s" % (names[1], hint)) == 1, out[-2000:]
    assert out.count("error:") == 1, "the error not printed once:\n" + out[-2000:]
    code, out = mpirun(2, ["-e", "out/model_00000010.bin", "out/model_00000020.bin", "-x", 1])
    assert code == 1 and out.count("(after -e: a pattern the shell expanded? quote it: -e "
                                   "'out/model_*.bin')") == 1, out[-2000:]
    code, out = mpirun(2, ["-x", 1, "extra"])
    assert code == 1 and "unknown flag 'extra'" in out and "shell expanded" not in out, out[-2000:]


@test
def hellaswag_and_default_data_found_from_another_directory():
    """-i and -j left at their defaults are paths from the repository's root: a trainer run from
    another directory now finds them beside the program, as it does -tok and -hellaswag. From a
    directory that is not the root: validation only (-x 0 -v 1) on a d1 model with no -i nor -j
    reads both files (the banner's token counts, read here from the files, and a validation
    loss); scoring a model on HellaSwag (-x 0 -v 0 -h 1, dev/data/README.md's command, which
    still opens -i) gives the PyTorch reference's answers and mean losses. Both stopped at
    'cannot open file dev/data/tinyshakespeare/...' before"""
    d = fresh_dir("usage_elsewhere")
    program = os.path.join(ROOT, "train_gpt2_dp")
    env = dict(os.environ, OMP_NUM_THREADS="1")

    def run_here(args, extra_env=None, code=0):
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "1", program] + [str(a) for a in args]
        p = subprocess.run(cmd, cwd=d, env=dict(env, **(extra_env or {})), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=TIMEOUT)
        out = p.stdout.decode("utf-8", "replace")
        assert p.returncode == code, "exit %d from %s, expected %d; %s" % (p.returncode, d, code, why_it_failed(out))
        return out

    assert not os.path.exists(os.path.join(d, "dev"))  # (the defaults do not resolve from d)
    out = run_here(["-e", "d1", "-b", 4, "-t", 32, "-x", 0, "-v", 1, "-m", 2, "-s", 0] + WATCHDOG)
    counts = [len(reference.read_tokens(os.path.join(ROOT, "dev/data/tinyshakespeare/tiny_shakespeare_%s.bin" % s)))
              for s in ("train", "val")]
    assert re.search(r"train / val tokens *\| %d / %d " % tuple(counts), out), out[:3000]
    assert "val loss after 0 steps" in out, out[-2000:]
    # a path the user gives is taken as given, even one that spells the default: not found from d
    default_train = "dev/data/tinyshakespeare/tiny_shakespeare_train.bin"
    out = run_here(["-e", "d1", "-i", default_train, "-x", 0, "-v", 0, "-s", 0] + WATCHDOG, code=1)
    assert "cannot open file '%s' (-i: train token file)" % default_train in out, out[-2000:]
    model, path, examples, expected, right = hellaswag_setup(d)
    run_dir = os.path.join(d, "scored")
    os.makedirs(run_dir)
    out = run_here(["-e", model, "-b", 8, "-t", HS_T, "-x", 0, "-v", 0, "-s", 0, "-h", 1, "-hellaswag", path,
                    "-o", run_dir] + WATCHDOG, {"LLMC_HELLASWAG_DUMP": os.path.join(run_dir, "dump.txt")})
    hellaswag_check(run_dir, out, examples, expected, right)


@test
def ranks_sharing_a_machine_without_omp_num_threads_take_cores_over_ranks():
    """ranks of a CPU run that share a machine, started without OMP_NUM_THREADS: OpenMP alone gives
    each rank a thread per core, and N ranks spin N x cores threads on the same cores (8 ranks of
    train_gpt2_3d on 2 cores ran a step 5 times slower so). Each rank now takes cores / ranks
    threads, at least 1, as torchrun does, and rank 0 prints what OpenMP reads back. 2 ranks,
    unbound: this machine's cores // 2; 1 rank alone: untouched, nothing printed; with
    OMP_NUM_THREADS set: untouched, nothing printed"""
    d = fresh_dir("omp_default")
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    cores = len(os.sched_getaffinity(0))
    expected = max(1, cores // 2)

    def run(ranks, extra_env=None):
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", str(ranks),
               "./train_gpt2_dp", "-e", "d1", "-b", 2, "-t", 32, "-x", 1, "-v", 0, "-s", 0, "-o", d] + WATCHDOG
        p = subprocess.run([str(a) for a in cmd], cwd=ROOT, env=dict(env, **(extra_env or {})), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=TIMEOUT)
        out = p.stdout.decode("utf-8", "replace")
        assert p.returncode == 0, why_it_failed(out)
        return out

    make(["train_gpt2_dp"])
    line = re.compile(r"^OMP_NUM_THREADS is not set: (\d+) threads? a rank, the (\d+) cores rank 0 may run on over the "
                      r"(\d+) ranks on this machine$", re.M)
    found = line.findall(run(2))
    assert found == [(str(expected), str(cores), "2")], (found, cores)
    assert not line.search(run(1)), "one rank alone: OpenMP's default kept, nothing said"
    assert not line.search(run(2, {"OMP_NUM_THREADS": "1"})), "OMP_NUM_THREADS set: nothing said"
