# Token shards (issue 59): -i and -j take a glob or a comma list of llm.c token files, read in
# sorted order as one stream of tokens, so that a run on shards is the run on their concatenation.
# Read by run_tests.py into its namespace (its helpers: @test, run_ok, mpirun, fresh_dir, ...).
import zlib

SHARD_SIZES = (300, 400, 837)  # 1537 tokens = 6 global batches of 256 (+1 target); unequal, and
# the boundaries at 300 and 700 fall inside global batches 1 [256, 513) and 2 [512, 769)


def shard_files(d):
    """the first 1537 tokens of REF's train file, once as one file (whole.bin) and once cut into
    shard_0..2.bin; returns (whole, [shards])"""
    reference_run()  # (makes REF's token files)
    tokens = reference.read_tokens(REF["tokens"])[: sum(SHARD_SIZES)]
    whole = os.path.join(d, "whole.bin")
    write_tokens(whole, tokens)
    shards, first = [], 0
    for i, n in enumerate(SHARD_SIZES):
        shards.append(os.path.join(d, "shard_%d.bin" % i))
        write_tokens(shards[-1], tokens[first:first + n])
        first += n
    return whole, shards


def shard_run_args(d, train, extra=()):
    """REF's model, 2 ranks x B=2 x T=32 x 2 micro-steps = 256 tokens a step, 8 steps: the 6
    batches of the shards and 2 of the next epoch (reshuffled with -shuffle 1)"""
    ref = reference_run()
    return ["-e", os.path.join(ref["dir"], "model.bin")] + data_args() + ["-i", train, "-b", 2, "-t", 32, "-d", 256,
            "-x", 8, "-n", 0, "-v", 4, "-m", 1, "-s", 0, "-o", d] + WATCHDOG + list(extra)


@test
def shards_give_the_losses_of_their_concatenation_bit_for_bit():
    """a glob and a comma list (given out of order: read sorted) of 3 shards give main.log's
    losses of the one concatenated file bit for bit, with and without -shuffle, over an epoch's
    end: each batch holds the same tokens, also the two that cross a shard boundary"""
    d = fresh_dir("shards")
    whole, shards = shard_files(d)
    for shuffle in (0, 1):
        runs = {}
        for name, train in (("whole", whole), ("glob", os.path.join(d, "shard_*.bin")),
                            ("list", ",".join([shards[2], shards[0], shards[1]]))):
            out_dir = os.path.join(d, "%s_shuffle%d" % (name, shuffle))
            out = run_ok(2, shard_run_args(out_dir, train, ["-shuffle", shuffle]))
            runs[name] = log_without_timing(out_dir)
            assert len([r for r in runs[name] if "train_loss" in r]) == 8, out[-2000:]
            shards_said = "1537" if name == "whole" else "1537 in 3 shards"  # (the banner)
            assert re.search(r"train / val tokens *\| %s / " % shards_said, out), out[:3000]
        assert runs["glob"] == runs["whole"], "-shuffle %d: the glob's log differs from the one file's" % shuffle
        assert runs["list"] == runs["whole"], "-shuffle %d: the comma list's log differs from the one file's" % shuffle


@test
def shards_resume_across_a_shard_boundary_on_another_grid():
    """train_gpt2_3d on 1 rank (B=8) saves step 2 of REF's run on the 3 shards; its next batch,
    tokens [512, 769), starts in shard 1 at offset 212 (512 - 300) and ends in shard 2: the
    state file records that position. Resumed on 2 data-parallel ranks (B=4), steps 3-5 and the
    final weights equal the PyTorch reference's on the one file (within its fp32 tolerances: only
    summation orders differ; a batch off by a single token would change the loss by far more)"""
    ref = reference_run()
    d = fresh_dir("shards_resume")
    _, shards = shard_files(d)
    spec = os.path.join(d, "shard_*.bin")
    saved = os.path.join(d, "saved")
    run_ok(1, trainer_args(ref, 8, saved, ["-i", spec, "-n", 2] + grid3d_flags(1, 1, 1)), program=D3)
    state = sorted(glob.glob(os.path.join(saved, "state_00000002*.bin")))
    assert state, os.listdir(saved)
    header = np.fromfile(state[0], dtype=np.int32, count=256)
    # (checkpoint.h: [14] the shard, [15..16] the token offset in it)
    assert header[1] == 3 and header[14] == 1 and int(header[15:17].view(np.int64)[0]) == 512 - 300, header[:17]
    part = os.path.join(d, "resumed")
    os.makedirs(part)
    for f in glob.glob(os.path.join(saved, "*_00000002*")):
        shutil.copy(f, part)
    out = run_ok(2, trainer_args(ref, 4, part, ["-i", spec, "-n", 3, "-y", 1] + grid3d_flags(2, 1, 1)), program=D3)
    assert "resumed from step 2" in out, out[-2000:]
    check_resumed_against_reference(ref, part, "shards 1x1x1 -> 2x1x1", (3, 4, 5), REF["steps"])
    # a checkpoint of state version 2 (before the position was recorded: slots 14..16 zero, CRC-32
    # of the whole file with slot 12 taken as 0) still resumes, at the position its step gives
    old = os.path.join(d, "resumed_v2")
    os.makedirs(old)
    for f in glob.glob(os.path.join(saved, "*_00000002*")):
        shutil.copy(f, old)
    for f in glob.glob(os.path.join(old, "state_00000002*.bin")):
        data = np.fromfile(f, dtype=np.uint8)
        header = data[:1024].view(np.int32)
        header[1], header[12], header[14:17] = 2, 0, 0
        header[12] = np.uint32(zlib.crc32(data.tobytes())).view(np.int32)
        data.tofile(f)
    out = run_ok(2, trainer_args(ref, 4, old, ["-i", spec, "-n", 3, "-y", 1] + grid3d_flags(2, 1, 1)), program=D3)
    assert "resumed from step 2" in out, out[-2000:]
    check_resumed_against_reference(ref, old, "version 2 checkpoint", (3, 4, 5), REF["steps"])
    # another shard list (a shard added) is another run's data: refused, naming -i
    extra = os.path.join(d, "shard_3.bin")
    write_tokens(extra, reference.read_tokens(REF["tokens"])[:300])
    expect_stop(trainer_args(ref, 4, part, ["-i", spec, "-n", 3, "-y", 1] + grid3d_flags(2, 1, 1)),
                "belongs to another run: -i: 3 shards, 1537 tokens", part, program=D3)


@test
def shards_bad_inputs_are_named_once_before_anything_is_written():
    """a missing shard of a comma list, a shard with a bad magic number, a directory (prepare.py's
    --out) and a HellaSwag eval file (magic 20240522) given as -i, named as such, a truncated
    shard (its header promises more tokens than it holds), a glob matching nothing (-i and -j): exit 1 on 2
    ranks, one message naming the file or pattern and the flag, printed once, the -o dir left
    empty; a missing and a bad shard together are named in one message"""
    d = fresh_dir("shards_bad")
    _, shards = shard_files(d)
    bad_magic = os.path.join(d, "bad_magic.bin")
    write_file(bad_magic, [12345, 1, 10], np.zeros(10, np.uint16).tobytes())
    eval_file = os.path.join(d, "hellaswag_val.bin")
    write_file(eval_file, [20240522, 1, 1], np.zeros(10, np.uint16).tobytes())
    truncated = os.path.join(d, "truncated.bin")
    write_file(truncated, [20240520, 1, 1000], np.zeros(10, np.uint16).tobytes())
    missing = os.path.join(d, "missing.bin")
    nothing = os.path.join(d, "none_*.bin")
    I, J = "(-i: train token file)", "(-j: validation token file)"
    cases = [
        (["-i", shards[0] + "," + missing],
         ["cannot open token file '%s' %s for reading: No such file or directory" % (missing, I)]),
        (["-i", shards[0] + "," + bad_magic],
         ["token file '%s' %s has magic number 12345, expected 20240520" % (bad_magic, I)]),
        (["-i", d],
         ["token file '%s' %s is a directory; give the token files in it, e.g. as a quoted pattern '%s/data_train_*.bin'"
          % (d, I, d)]),
        (["-i", eval_file],
         ["token file '%s' %s has magic number 20240522, expected 20240520 (an llm.c token file); 20240522 is a "
          "HellaSwag eval file, for -h 1 -hellaswag FILE" % (eval_file, I)]),
        (["-i", truncated + "," + shards[1]],
         ["token file '%s' %s is 1044 bytes, but its header promises 1000 tokens (3024 bytes)" % (truncated, I)]),
        (["-i", nothing], ["the pattern '%s' %s matches no file" % (nothing, I)]),
        (["-j", nothing], ["the pattern '%s' %s matches no file" % (nothing, J)]),
        (["-i", ",".join([missing, shards[0], bad_magic])],  # both in the one message
         ["cannot open token file '%s' %s" % (missing, I), "token file '%s' %s has magic number 12345" % (bad_magic, I)]),
    ]
    for flags, messages in cases:
        out_dir = os.path.join(d, "out")
        shutil.rmtree(out_dir, ignore_errors=True)
        os.makedirs(out_dir)
        code, out = mpirun(2, shard_run_args(out_dir, shards[0]) + flags, timeout=60)
        assert code == 1, "%s: exit %d\n%s" % (flags, code, out[-2000:])
        lines = newcomer_lines(out, messages[0])
        assert len(lines) == 1, "%s: %r not printed exactly once:\n%s" % (flags, messages[0], out[-2000:])
        for m in messages[1:]:
            assert m in lines[0], "%s: %r not in the message %r" % (flags, m, lines[0])
        assert lines[0].startswith("error: "), lines[0]
        assert [f for f in os.listdir(out_dir) if f != "LOCK"] == [], "%s: the failed job wrote %s" % (flags, os.listdir(out_dir))


@test
def shards_help_says_how_to_give_them():
    p = subprocess.run(["./train_gpt2_dp", "-h"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    line = [l for l in p.stdout.splitlines() if l.strip().startswith("-i ")]
    assert line and "glob" in line[0] and "comma list" in line[0] and "sorted" in line[0], p.stdout[:2000]
