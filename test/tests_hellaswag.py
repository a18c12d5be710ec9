# HellaSwag (issue 59 item 4): -h 1 scores llm.c's eval file (llmc/hellaswag.h) through the
# trainers' forward pass, and dev/data/hellaswag.py writes the file. The examples here are written
# by this file's own writer (hellaswag_write, independent of the C reader and of the script), from
# Tiny Shakespeare's tokens; the expected answers and mean losses come from the PyTorch reference.
# Read by run_tests.py into its namespace (its helpers: @test, run_ok, mpirun, fresh_dir, ...).
import struct

HS_T = 32         # -t of the evaluations: the longest context + completion below is 18 tokens
HS_EXAMPLES = 11  # odd: 2 ranks take 6 and 5, 3 ranks 4, 4 and 3


def hellaswag_write(path, examples, magic=20240522, longest=None):
    """llm.c's eval file from [(context, [4 completions], label)]: 256 int32 (magic, version 1,
    count, longest example's bytes), then per example uint16 65535, its bytes, its index, label, 4,
    the context's length and tokens, each completion's length and tokens"""
    streams = []
    for i, (ctx, ends, label) in enumerate(examples):
        s = [65535, 0, i, label, len(ends), len(ctx)] + list(ctx)
        for e in ends:
            s += [len(e)] + list(e)
        s[1] = 2 * len(s)
        streams.append(s)
    header = [magic, 1, len(streams), longest or max(s[1] for s in streams)] + [0] * 252
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        for s in streams:
            f.write(struct.pack("<%dH" % len(s), *s))


def hellaswag_examples():
    """HS_EXAMPLES examples from REF's validation tokens (GPT-2's modulo 1000): a context of 8-12
    tokens, the right completion the 2-5 tokens that follow it, the three others 2-7 tokens from
    elsewhere in the text; the right one's place (the label) cycles through 2, 1, 0, 3. Completions of
    different lengths, so that a sum of losses ranks them otherwise than the mean"""
    reference_run()
    tokens = [int(t) for t in reference.read_tokens(REF["val_tokens"])]
    rng = np.random.RandomState(59)
    examples = []
    for i in range(HS_EXAMPLES):
        start, n_ctx, n_right = 50 + 301 * i, 8 + i % 5, 2 + i % 4
        ctx = tokens[start:start + n_ctx]
        right = tokens[start + n_ctx:start + n_ctx + n_right]
        wrong = []
        while len(wrong) < 3:
            at, n = int(rng.randint(5000, 30000)), int(rng.randint(2, 8))
            if tokens[at:at + n] not in wrong + [right]:
                wrong.append(tokens[at:at + n])
        label = (3 * i + 2) % 4  # (not the index mod 4: a label read from the index's field must fail)
        examples.append((ctx, wrong[:label] + [right] + wrong[label:], label))
    return examples


def hellaswag_model(out):
    """REF's model trained 40 steps on tiny Shakespeare (lr 1e-3), so that the right completion,
    the text's own continuation, is often the likelier: out/model_00000040.bin"""
    ref = reference_run()
    run_ok(1, ["-e", os.path.join(ref["dir"], "model.bin")] + data_args() +
           ["-b", 8, "-t", HS_T, "-x", 40, "-l", 1e-3, "-v", 0, "-s", 0, "-n", 40, "-o", out] + WATCHDOG)


def hellaswag_setup(d):
    """(model file, eval file, the reference's [(answer, [4 mean losses])], its right answers)"""
    model = os.path.join(shared_dir(os.path.join(TMP, "hellaswag_model"), hellaswag_model), "model_00000040.bin")
    examples = hellaswag_examples()
    path = os.path.join(d, "hellaswag.bin")
    hellaswag_write(path, examples)
    # the reference: each completion's row (context + completion) through the PyTorch model in
    # float64, the cross-entropy of each completion token given what precedes it, its mean
    torch = reference.torch
    net = reference.load_model_file(model).double()
    expected = []
    with torch.no_grad():
        for ctx, ends, label in examples:
            means = []
            for e in ends:
                row = torch.tensor(ctx + e)
                logp = torch.log_softmax(net.logits(row[None, :-1])[0], dim=-1)
                targets = row[len(ctx):]  # predicted from positions len(ctx) - 1 ... len(row) - 2
                losses = -logp[len(ctx) - 1:].gather(1, targets[:, None])[:, 0]
                means.append(float(losses.mean()))
            order = sorted(means)
            # the answer is well defined: no two means within 1e-3 of the lowest (fp32's error is ~1e-6)
            assert order[1] - order[0] > 1e-3, "test data: example with near-equal completions %s" % means
            expected.append((int(np.argmin(means)), means))
    right = sum(a == ex[2] for (a, _), ex in zip(expected, examples))
    return model, path, examples, expected, right


def hellaswag_check(d, out, examples, expected, right, step=0):
    """the trainer's dump (LLMC_HELLASWAG_DUMP), printed line and main.log record against the
    reference: every answer equal, every mean loss within 1e-4 (fp32 forward of a 2-layer model
    against float64 over <= 7 tokens: ~1e-6; a sum instead of the mean is off by a factor >= 2 and
    a mask shifted by one token by O(1)), and the accuracy"""
    with open(os.path.join(d, "dump.txt")) as f:
        rows = [line.split() for line in f]
    assert len(rows) == len(examples), rows
    for i, (row, (ctx, ends, label), (answer, means)) in enumerate(zip(rows, examples, expected)):
        assert int(row[0]) == i and int(row[1]) == label, "example %d: index/label %s, expected %d %d" % (i, row[:2], i, label)
        assert int(row[2]) == answer, "example %d: answer %s, the reference's %d (means %s)" % (i, row[2], answer, means)
        got = [float(x) for x in row[3:]]
        assert max(abs(a - b) for a, b in zip(got, means)) < 1e-4, "example %d: means %s, reference %s" % (i, got, means)
    line = "step %d | hellaswag %d/%d = %.4f" % (step, right, len(examples), right / len(examples))
    assert line in out, "expected '%s' in\n%s" % (line, out[-3000:])
    with open(os.path.join(d, "main.log")) as f:
        records = [json.loads(l) for l in f if '"hellaswag"' in l]
    assert [r["step"] for r in records][-1] == step and abs(records[-1]["hellaswag"] - right / len(examples)) < 1e-9, records


def hellaswag_run(d, ranks, model, path, extra=(), program="./train_gpt2_dp", B=8, env=None):
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    args = ["-e", model] + data_args() + ["-b", B, "-t", HS_T, "-x", 0, "-v", 0, "-s", 0, "-h", 1, "-hellaswag", path,
                                          "-o", d] + WATCHDOG + list(extra)
    return run_ok(ranks, args, program=program, env=dict(env or {}, LLMC_HELLASWAG_DUMP=os.path.join(d, "dump.txt")))


@test
def hellaswag_answers_and_mean_losses_match_pytorch_on_every_layout():
    """11 examples scored by train_gpt2_dp at 1 rank (-b 8: 2 examples a pass, the last pass half
    padding), 2 ranks (6 and 5 examples), 2 ranks under ZeRO-3 with -b 4 (every forward pass
    gathers from both: the rank with 5 runs a sixth, empty, pass), 3 ranks with -b 12 (4, 4, 3),
    train_gpt2_tp at 2 ranks (every rank scores all) and train_gpt2_diloco at 2 workers (theta_outer,
    the model file at -x 0): the same answers and mean losses as the PyTorch reference"""
    d = fresh_dir("hellaswag")
    model, path, examples, expected, right = hellaswag_setup(d)
    assert 0 < right < len(examples), "test data: %d of %d right tells little" % (right, len(examples))
    for name, ranks, extra, program, B in (("dp1", 1, [], "./train_gpt2_dp", 8), ("dp2", 2, [], "./train_gpt2_dp", 8),
                                           ("z3", 2, ["-z", 3], "./train_gpt2_dp", 4),
                                           ("dp3", 3, [], "./train_gpt2_dp", 12), ("tp2", 2, [], TP, 8),
                                           ("diloco2", 2, [], DILOCO, 8)):
        run_dir = os.path.join(d, name)
        out = hellaswag_run(run_dir, ranks, model, path, extra, program, B)
        try:
            hellaswag_check(run_dir, out, examples, expected, right)
        except AssertionError as e:
            raise AssertionError("%s: %s" % (name, e))


@test
def hellaswag_runs_when_validation_does_and_at_the_end():
    """-h 1 follows -v: with -v 1 over 2 steps at steps 0, 1 and 2, each after its val line; with
    -v 0 once, after the last step"""
    d = fresh_dir("hellaswag_schedule")
    model, path, examples, expected, right = hellaswag_setup(d)
    for v, steps in ((1, [0, 1, 2]), (0, [2])):
        run_dir = os.path.join(d, "v%d" % v)
        os.makedirs(run_dir)
        out = run_ok(1, ["-e", model] + data_args() + ["-b", 8, "-t", HS_T, "-x", 2, "-v", v, "-m", 1, "-s", 0, "-h", 1,
                                                       "-hellaswag", path, "-o", run_dir] + WATCHDOG)
        with open(os.path.join(run_dir, "main.log")) as f:
            records = [json.loads(l) for l in f]
        assert [r["step"] for r in records if "hellaswag" in r] == steps, records
        printed = re.findall(r"^step (\d+) \| hellaswag \d+/%d = " % len(examples), out, re.M)
        assert [int(s) for s in printed] == steps, out[-3000:]
        if v:  # (each after its step's validation loss)
            assert all(out.index("val loss after %d steps" % s) < out.index("step %d | hellaswag" % s) for s in steps), out


@test
def hellaswag_refuses_bad_files_and_flags_before_training():
    """a missing file, a directory (hellaswag.py's --out, not the file in it), another magic (a
    token file's; -j's own file too, named as -hellaswag's, not -j's), a truncated file, a token
    outside the vocabulary, an example longer than -t, a wrong longest-example field, -b below 4:
    each an error naming the file or flag and what was expected, exit 1, at 2 ranks (no hang),
    before step 0"""
    d = fresh_dir("hellaswag_bad")
    ref = reference_run()
    examples = hellaswag_examples()
    good = os.path.join(d, "good.bin")
    hellaswag_write(good, examples)
    data = open(good, "rb").read()
    rows = max(len(ctx) + len(e) for ctx, ends, _ in examples for e in ends)  # the longest row

    def variant(name, content):
        p = os.path.join(d, name)
        with open(p, "wb") as f:
            f.write(content)
        return p

    magic = os.path.join(d, "magic.bin")
    hellaswag_write(magic, examples, magic=20240520)
    longest = os.path.join(d, "longest.bin")
    hellaswag_write(longest, examples, longest=1000)
    vocab = os.path.join(d, "vocab.bin")
    hellaswag_write(vocab, [(e[0][:-1] + [1500], e[1], e[2]) for e in examples])
    cases = [
        (os.path.join(d, "missing.bin"), [], r"cannot open file '[^']*missing.bin' \(-hellaswag.*dev/data/hellaswag.py writes them"),
        (d + "/", [], r"(?m)HellaSwag file '%s/' \(-hellaswag: .*\) is a directory; -hellaswag takes the file, e\.g\. %s/hellaswag_val\.bin$"
         % (re.escape(d), re.escape(d))),
        (magic, [], r"magic.bin.*magic 20240520 version 1, expected llm.c's eval file, magic 20240522 version 1"),
        (REF["val_tokens"], [],  # (-j's value too: data_args)
         r"(?m)^error: HellaSwag file '[^']*' \(-hellaswag: HellaSwag examples.*\): magic 20240520 version 1, expected"),
        (variant("truncated.bin", data[:-10]), [], r"truncated.bin.* is truncated: its header says 11 examples, the file ends in example 10"),
        (vocab, [], r"vocab.bin.*: example 0 holds a token outside the model's vocabulary of 1000"),
        (longest, [], r"longest.bin.*: the header says the longest example is 1000 bytes"),
        (good, ["-t", rows - 1], r"good.bin.*context and completion are %d tokens, longer than -t %d.*use -t %d or more" %
         (rows, rows - 1, rows)),
        (good, ["-b", 3], r"-h 1 with -b 3: a HellaSwag example is 4 rows of one batch.*-b must be at least 4"),
    ]
    for path, extra, message in cases:
        args = ["-e", os.path.join(ref["dir"], "model.bin")] + data_args() + ["-b", 8, "-t", HS_T, "-x", 1, "-v", 0, "-s", 0,
                                                                            "-h", 1, "-hellaswag", path] + WATCHDOG + extra
        code, out = mpirun(2, args, timeout=60)
        assert code != 0 and re.search(message, out), "%s %s: exit %d\n%s" % (path, extra, code, out[-3000:])
        assert "step    1/" not in out and "| hellaswag" not in out, out[-3000:]


@test
def hellaswag_py_local_jsonl_writes_llmc_eval_file():
    """dev/data/hellaswag.py --local on a 2-line jsonl in HellaSwag's format writes the bytes
    written out here by hand: each word's GPT-2 id read from the vocabulary file (every word here
    is one token; tiktoken's encoding too where installed), the endings with their leading space;
    the trainer reads the file (GPT-2's vocabulary, -e d2) and scores both examples. The labels as
    strings ("2", as Hugging Face's copy of the dataset has them) give the same bytes. Bad lines
    (a label 4, not JSON, two endings, bytes that are not UTF-8) are reported with file:line, and
    nothing is written; a failed download or write leaves no --out behind, and --out under a file
    is a message"""
    d = fresh_dir("hellaswag_py")
    lines = [{"ind": 4, "activity_label": "Cats", "ctx_a": "The cat sat on the mat.", "ctx_b": "", "split": "val",
              "ctx": "The cat sat on the mat.", "label": 2, "split_type": "indomain", "source_id": "x",
              "endings": ["It was a dog.", "and then it ran away.", "It slept.", "of the house."]},
             {"ind": 9, "ctx": "Hello world", "label": 0, "endings": ["and more", "is", "was the", "in the world"]}]
    src = os.path.join(d, "val.jsonl")
    with open(src, "w") as f:
        f.write("".join(json.dumps(l) + "\n" for l in lines))
    out_dir = os.path.join(d, "out")
    p = subprocess.run([sys.executable, "dev/data/hellaswag.py", "--local", src, "--out", out_dir], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    with open(os.path.join(ROOT, "dev/data/gpt2_encoder.json")) as f:
        vocab = json.load(f)

    def ids(words):  # GPT-2 writes the space before a word as \u0120, part of the word's token
        return [vocab[w.replace(" ", "\u0120")] for w in words]

    expected = [
        (ids(["The", " cat", " sat", " on", " the", " mat", "."]),
         [ids([" It", " was", " a", " dog", "."]), ids([" and", " then", " it", " ran", " away", "."]),
          ids([" It", " slept", "."]), ids([" of", " the", " house", "."])], 2),
        (ids(["Hello", " world"]), [ids([" and", " more"]), ids([" is"]), ids([" was", " the"]), ids([" in", " the", " world"])], 0),
    ]
    assert expected[1][0] == [15496, 995]  # ("Hello world": GPT-2's ids, as the BPE's own test knows them)
    want = os.path.join(d, "expected.bin")
    hellaswag_write(want, expected)
    got = os.path.join(out_dir, "hellaswag_val.bin")
    assert open(got, "rb").read() == open(want, "rb").read(), "hellaswag.py's bytes differ from the hand-written file"
    strings = os.path.join(d, "strings.jsonl")
    with open(strings, "w") as f:
        f.write("".join(json.dumps(dict(l, label=str(l["label"]))) + "\n" for l in lines))
    p = subprocess.run([sys.executable, "dev/data/hellaswag.py", "--local", strings, "--out", os.path.join(d, "strings")],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert open(os.path.join(d, "strings", "hellaswag_val.bin"), "rb").read() == open(want, "rb").read(), \
        "string labels give other bytes"
    try:
        import tiktoken
        enc = tiktoken.get_encoding("gpt2")
        assert [enc.encode(l["ctx"]) for l in lines] == [e[0] for e in expected]
        assert [[enc.encode(" " + x) for x in l["endings"]] for l in lines] == [e[1] for e in expected]
    except ImportError:
        pass
    # the C reader takes the script's file (GPT-2's vocabulary: a random d2 model)
    run_dir = os.path.join(d, "run")
    os.makedirs(run_dir)
    out = run_ok(1, ["-e", "d2", "-b", 4, "-t", 16, "-x", 0, "-v", 0, "-s", 0, "-h", 1, "-hellaswag", got] + WATCHDOG)
    assert re.search(r"^step 0 \| hellaswag [0-2]/2 = ", out, re.M), out[-2000:]
    # bad lines: every one reported with file:line, exit 1, nothing written
    bad = os.path.join(d, "bad.jsonl")
    with open(bad, "w") as f:
        f.write(json.dumps(dict(lines[1], label=4)) + "\n{not json\n" + json.dumps(dict(lines[1], endings=["a", "b"])) + "\n")
    with open(bad, "ab") as f:
        f.write(b'{"ctx": "caf\xe9", "endings": ["a", "b", "c", "d"], "label": 0}\n')  # (0xe9: latin-1's e-acute)
    bad_out = os.path.join(d, "bad_out")
    p = subprocess.run([sys.executable, "dev/data/hellaswag.py", "--local", bad, "--out", bad_out], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and "4 bad line(s)" in p.stderr, p.stderr
    for where, what in (("bad.jsonl:1", "\"label\" must be an integer 0..3, got 4"), ("bad.jsonl:2", "not JSON"),
                        ("bad.jsonl:3", "\"endings\" must be a list of 4 non-empty strings"),
                        ("bad.jsonl:4", "not UTF-8 (byte 12 of the line: 0xe9)")):
        assert re.search(re.escape(where) + ": " + re.escape(what), p.stderr), (where, p.stderr)
    assert not os.path.exists(os.path.join(bad_out, "hellaswag_val.bin")), "a file was written from bad input"
    # the download, from a port where nothing listens (the discard port, 9, of this machine)
    fetch_out = os.path.join(d, "fetch_out")
    script = ("import sys; sys.path.insert(0, 'dev/data'); import hellaswag; hellaswag.URL = 'http://127.0.0.1:9/none'; "
              "sys.argv = ['hellaswag.py', '--out', sys.argv[1]]; hellaswag.main()")
    p = subprocess.run([sys.executable, "-c", script, fetch_out], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and "downloading http://127.0.0.1:9/none failed" in p.stderr, p.stderr
    assert not os.path.exists(fetch_out), "a failed download left %s" % os.listdir(fetch_out)
    # a write that fails (a file-size limit of 1 KiB, RLIMIT_FSIZE: EFBIG, as a full disk gives
    # ENOSPC), and an --out under a file: a message, no traceback, no temporary, no --out made
    import resource
    limited = os.path.join(d, "limited")

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))
    p = subprocess.run([sys.executable, "dev/data/hellaswag.py", "--local", src, "--out", limited], cwd=ROOT,
                       capture_output=True, text=True, timeout=120, preexec_fn=limit)
    assert p.returncode == 1 and "writing '%s' failed ([Errno 27] File too large), nothing written" % os.path.join(
        limited, "hellaswag_val.bin") in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert not os.path.exists(limited), os.listdir(limited)
    under = os.path.join(src, "out")
    p = subprocess.run([sys.executable, "dev/data/hellaswag.py", "--local", src, "--out", under], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and "--out '%s': cannot make the directory (Not a directory)" % under in p.stderr, p.stderr


@test
def emu_hellaswag_answers_and_mean_losses_match_pytorch_fp32_zero3():
    """the CUDA backend (fp32, in the emulator) at 2 ranks on 2 GPUs, ZeRO-3 over NCCL, -b 4: the
    per-token losses come from its classifier kernel and a pinned copy, the passes gather from
    both GPUs; the same answers and mean losses as the PyTorch reference"""
    (program,) = build("emu", "FP32", ["train_gpt2_dp"])
    d = fresh_dir("hellaswag_emu")
    model, path, examples, expected, right = hellaswag_setup(d)
    run_dir = os.path.join(d, "run")
    out = hellaswag_run(run_dir, 2, model, path, ["-z", 3], program, 4, env={"CUDA_EMU_DEVICES": "2"})
    hellaswag_check(run_dir, out, examples, expected, right)


@test
def hellaswag_resume_logs_each_score_once():
    """a run of 2 steps resumed to 4 (-v 2, -n 2) logs main.log as the run of 4 does: the score at
    step 2, written before the checkpoint's resume, is cut back and taken again, once"""
    d = fresh_dir("hellaswag_resume")
    model, path, examples, expected, right = hellaswag_setup(d)
    base = ["-e", model] + data_args() + ["-b", 8, "-t", HS_T, "-v", 2, "-m", 1, "-s", 0, "-n", 2, "-h", 1,
                                          "-hellaswag", path] + WATCHDOG
    full, part = os.path.join(d, "full"), os.path.join(d, "part")
    run_ok(1, base + ["-x", 4, "-o", full])
    run_ok(1, base + ["-x", 2, "-o", part])
    run_ok(1, base + ["-x", 4, "-o", part, "-y", 1])
    assert [r["step"] for r in log_without_timing(full) if "hellaswag" in r] == [0, 2, 4]
    assert log_without_timing(part) == log_without_timing(full), "main.log after the resume differs from the full run's"
