# Data preparation (dev/data/prepare.py, dev/data/fineweb.py): issue 59's items 2 and 3. Read by
# test/run_tests.py into its namespace, so its helpers (test, Skip, fresh_dir, tool, ROOT, ...)
# are used here as they are.

PREPARE = [sys.executable, os.path.join(ROOT, "dev/data/prepare.py")]
FINEWEB = [sys.executable, os.path.join(ROOT, "dev/data/fineweb.py")]
TOKENS_MAGIC, EOT_TOKEN = 20240520, 50256

# documents with what the BPE must get right: leading, inner and trailing spaces, blank lines,
# digits, punctuation runs, contractions, non-ASCII letters and marks, a literal <|endoftext|>
# (ordinary text inside a document) and an emoji (4 UTF-8 bytes)
SAMPLE_DOCS = [
    "Hello world",
    "  It's 2024; they'll say \"no\"...\n\nThen   three spaces,\ttabs\t\tand a trailing space ",
    "caf\u00e9 na\u00efve \u6771\u4eac \u0928\u092e\u0938\u094d\u0924\u0947 x\u00b2 \U0001F600 <|endoftext|> end\n",
    "Numbers 3.14159 and 1,000,000; symbols #$%&*()[]{} -- ok?!\n",
]


def sample_docs(n):
    """n made-up documents: the cases above, then sentences of varied length"""
    words = "the model learns which token comes next from the tokens before it across every rank".split()
    docs = list(SAMPLE_DOCS)
    for i in range(n - len(docs)):
        docs.append(" ".join(words[(i * 7 + k) % len(words)] for k in range(3 + (i * 13) % 40)) + ".\n" * (i % 3))
    return docs[:n]


def read_shards(out, prefix):
    """[(file name, tokens)] of the shards in --out, validation first, then the training shards in
    order; each file's header checked: llm.c's magic and version, its count the tokens it holds"""
    names = sorted(n for n in os.listdir(out) if n.startswith(prefix + "_"))
    names = [n for n in names if "_val_" in n] + [n for n in names if "_train_" in n]
    shards = []
    for name in names:
        with open(os.path.join(out, name), "rb") as f:
            header = np.frombuffer(f.read(1024), dtype="<i4")
            tokens = np.frombuffer(f.read(), dtype="<u2")
        assert header[0] == TOKENS_MAGIC and header[1] == 1, "%s: header %s" % (name, header[:3])
        assert header[2] == len(tokens), "%s: header counts %d tokens, the file holds %d" % (name, header[2], len(tokens))
        assert not header[3:].any(), name + ": the header's unused words are not zero"
        shards.append((name, tokens))
    return shards


def write_inputs(d, docs):
    """the first documents as text files (one each, so that they are many chunks for the workers),
    the rest as a JSONL file with the document in 'body' and other fields around it"""
    files = []
    split = len(docs) // 2
    for i, doc in enumerate(docs[:split]):
        files.append(os.path.join(d, "doc%03d.txt" % i))
        with open(files[-1], "w", encoding="utf-8", newline="") as f:
            f.write(doc)
    files.append(os.path.join(d, "rest.jsonl"))
    with open(files[-1], "w", encoding="utf-8") as f:
        for i, doc in enumerate(docs[split:]):
            f.write(json.dumps({"id": i, "body": doc, "note": "x"}, ensure_ascii=i % 2 == 0) + "\n")
    return files


def run_prepare(args, program=PREPARE):
    # (a timeout: a prepare.py that hangs fails its test rather than the whole run; each input here is small)
    return subprocess.run(program + [str(a) for a in args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=300)


def folder_bytes(d):
    return {n: open(os.path.join(d, n), "rb").read() for n in sorted(os.listdir(d))}


@test
def data_prepare_gives_the_same_bytes_with_1_and_4_workers():
    """40 text files and a JSONL file (41 chunks for the workers, finished out of order), shards
    of 300 tokens after a validation split of 500: every file the same, byte for byte"""
    d = fresh_dir("data_workers")
    docs = sample_docs(80)
    files = write_inputs(d, docs)
    outs = []
    for workers in (1, 4):
        out = os.path.join(d, "out%d" % workers)
        r = run_prepare(["--out", out, "--jsonl_field", "body", "--shard_tokens", 300, "--val_tokens", 500,
                         "--workers", workers] + files)
        assert r.returncode == 0, r.stderr[-2000:]
        outs.append(folder_bytes(out))
    assert outs[0] == outs[1], "1 and 4 workers differ: %s" % [n for n in outs[0] if outs[0][n] != outs[1].get(n)]
    assert len([n for n in outs[0] if "_train_" in n]) >= 3 and "data_val_000000.bin" in outs[0], sorted(outs[0])


def independent_encodings(docs):
    """each document's GPT-2 tokens from an implementation other than the project's: tiktoken
    (with GPT-2's files), else Hugging Face's tokenizers (dev/setup.sh puts it in .tools with
    transformers); None where neither is installed"""
    bpe_files = [os.path.join(ROOT, "dev/data", n) for n in ("gpt2_encoder.json", "gpt2_vocab.bpe")]
    try:
        import tiktoken  # noqa: F401
        sys.path.insert(0, os.path.join(ROOT, "dev/data"))
        import gpt2_bpe
        enc = gpt2_bpe.tiktoken_encoder(gpt2_bpe.load_bpe())
        return "tiktoken", [enc.encode_ordinary(doc) for doc in docs]
    except ImportError:
        pass
    if tool("transformers") is None:
        return None, None
    script = """
import json, sys
from tokenizers import Tokenizer, models, pre_tokenizers
tok = Tokenizer(models.BPE.from_file(sys.argv[1], sys.argv[2]))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # GPT-2's pattern, bytes as GPT-2's characters
print(json.dumps([tok.encode(doc).ids for doc in json.load(sys.stdin)]))
"""
    tools_dir = os.environ.get("LLMC_TOOLS_DIR", os.path.join(ROOT, ".tools"))
    r = subprocess.run([sys.executable, "-c", script] + bpe_files, input=json.dumps(docs), stdout=subprocess.PIPE,
                       text=True, env=dict(os.environ, PYTHONPATH=tools_dir), check=True)
    return "Hugging Face tokenizers", json.loads(r.stdout)


@test
def data_prepare_tokens_are_gpt2s_and_decode_to_the_documents():
    """the shards of prepare.py (the project's Python BPE) in order are, for every document,
    <|endoftext|> then its GPT-2 tokens, as another implementation gives them (tiktoken, or Hugging
    Face's tokenizers; skipped with a message where neither is here); each segment decodes, through
    dev/data/gpt2_tokenizer.bin, to the document's bytes; the validation file holds exactly
    --val_tokens tokens, every training shard --shard_tokens but the last. 'Hello world' is
    [15496, 995] in GPT-2's vocabulary (the ids of 'Hello' and ' world' in gpt2_encoder.json)"""
    d = fresh_dir("data_tokens")
    docs = sample_docs(30)
    files = write_inputs(d, docs)
    out = os.path.join(d, "out")
    r = run_prepare(["--out", out, "--jsonl_field", "body", "--shard_tokens", 250, "--val_tokens", 100,
                     "--workers", 2, "--encoder", "python"] + files)
    assert r.returncode == 0, r.stderr[-2000:]
    shards = read_shards(out, "data")
    assert shards[0][0] == "data_val_000000.bin" and len(shards[0][1]) == 100, [(n, len(t)) for n, t in shards]
    assert [n for n, _ in shards[1:]] == ["data_train_%06d.bin" % i for i in range(1, len(shards))]
    assert all(len(t) == 250 for _, t in shards[1:-1]) and 0 < len(shards[-1][1]) <= 250, [(n, len(t)) for n, t in shards]
    stream = np.concatenate([t for _, t in shards]).tolist()
    # decoded: <|endoftext|> starts each document, and the pieces between are the documents
    table, eot = decode_table(os.path.join(ROOT, "dev/data/gpt2_tokenizer.bin"))
    starts = [i for i, t in enumerate(stream) if t == eot]
    assert stream[0] == eot and len(starts) == len(docs), "%d <|endoftext|> for %d documents" % (len(starts), len(docs))
    for k, (a, b) in enumerate(zip(starts, starts[1:] + [len(stream)])):
        assert b"".join(table[t] for t in stream[a + 1:b]) == docs[k].encode("utf-8"), "document %d decodes differently" % k
    name, expected = independent_encodings(docs + ["Hello world"])
    with open(os.path.join(ROOT, "dev/data/gpt2_encoder.json")) as f:
        vocab = json.load(f)
    assert [vocab["Hello"], vocab["\u0120world"]] == [15496, 995]  # (\u0120: GPT-2's character for the space byte)
    if name is None:
        print("    no tiktoken, no Hugging Face tokenizers: the tokens are checked by decoding and on 'Hello world' only")
        sys.path.insert(0, os.path.join(ROOT, "dev/data"))
        import gpt2_bpe
        assert gpt2_bpe.load_bpe().encode("Hello world") == [15496, 995]
        return
    assert expected[-1] == [15496, 995], "%s: 'Hello world' is %s" % (name, expected[-1])
    want = [t for doc in expected[:-1] for t in [EOT_TOKEN] + doc]
    assert stream == want, "the shards differ from %s's tokens at %d" % (
        name, next(i for i, (a, b) in enumerate(zip(stream + [-1], want + [-2])) if a != b))
    print("    %d tokens, the same as %s's" % (len(stream), name))


@test
def data_prepare_reproduces_the_tiny_shakespeare_files():
    """Tiny Shakespeare's passages (the text cut at blank lines, each keeping its blank line, as
    dev/data/tinyshakespeare.py cuts it) as a JSONL file, with a validation split of 32768 tokens
    and one large training shard: llm.c-format files equal to the committed ones, byte for byte"""
    d = fresh_dir("data_shakespeare")
    with open(os.path.join(ROOT, "dev/data/tinyshakespeare/tinyshakespeare.txt"), encoding="utf-8") as f:
        passages = f.read().split("\n\n")
    with open(os.path.join(d, "passages.jsonl"), "w") as f:
        for i, p in enumerate(passages):
            f.write(json.dumps({"text": p + ("\n\n" if i < len(passages) - 1 else "")}) + "\n")
    out = os.path.join(d, "out")
    r = run_prepare(["--out", out, "--val_tokens", 32768, "--shard_tokens", 10 ** 6, "--workers", 2, "--prefix", "tiny",
                     os.path.join(d, "passages.jsonl")])
    assert r.returncode == 0, r.stderr[-2000:]
    assert sorted(os.listdir(out)) == ["tiny_train_000001.bin", "tiny_val_000000.bin"], os.listdir(out)
    for mine, committed in (("tiny_val_000000.bin", "tiny_shakespeare_val.bin"), ("tiny_train_000001.bin", "tiny_shakespeare_train.bin")):
        with open(os.path.join(out, mine), "rb") as a, open(os.path.join(ROOT, "dev/data/tinyshakespeare", committed), "rb") as b:
            assert a.read() == b.read(), "%s differs from dev/data/tinyshakespeare/%s" % (mine, committed)


@test
def data_prepare_names_every_bad_input_in_one_message():
    """a missing file, a JSONL line without the field, one that is not JSON, one whose text is a
    lone UTF-16 surrogate, one whose bytes are not UTF-8 (from its first byte, 0xff 0xfe: UTF-16's
    byte-order mark, which json.loads would take for UTF-16 and call "not JSON"), a text file that
    is not UTF-8, in one run: one message naming each (file:line, the bad byte's line in a text file),
    exit 1, and no --out (no shard, no temporary, not the directory it would have made); bad flag
    values likewise, with a missing file; shards already in --out refused, and --overwrite
    replaces them all (the stale last shard of a larger run too)"""
    d = fresh_dir("data_bad")
    good = os.path.join(d, "good.txt")
    with open(good, "w") as f:
        f.write(" ".join(["word"] * 399))  # 400 tokens with its <|endoftext|>
    lines = os.path.join(d, "lines.jsonl")
    with open(lines, "w") as f:
        f.write('{"text": "fine"}\n{"body": "no text field"}\n{"text": "cut\n\n{"text": 7}\n{"text": "\\ud800"}\n')
    utf16 = os.path.join(d, "utf16.jsonl")
    with open(utf16, "wb") as f:
        f.write(b'{"text": "fine"}\n\xff\xfe{"text": "x"}\n')
    latin1 = os.path.join(d, "latin1.txt")
    with open(latin1, "wb") as f:
        f.write("a first line\ncaf\u00e9".encode("latin-1"))  # (0xe9: byte 16, on line 2)
    missing = os.path.join(d, "missing.txt")
    out = os.path.join(d, "out")
    r = run_prepare(["--out", out, "--shard_tokens", 100, "--workers", 2, good, missing, lines, utf16, latin1])
    want = ["7 bad inputs, nothing written", missing + ": no such file",
            lines + ":2: no field 'text' (its fields: body)", lines + ":3: not JSON",
            lines + ":5: field 'text' is 7, expected a string", lines + ":6: holds a lone surrogate",
            utf16 + ":2: not UTF-8 (byte 0 of the line: 0xff)", latin1 + ":2: not UTF-8 text (byte 16 of the file: 0xe9)"]
    assert r.returncode == 1 and all(w in r.stderr for w in want) and r.stderr.count("prepare.py:") == 1, \
        "exit %d, missing %s:\n%s" % (r.returncode, [w for w in want if w not in r.stderr], r.stderr)
    assert not os.path.exists(out), os.listdir(out)
    # the bad lines met after 4 shards' worth of good text: the shards written so far are removed
    r = run_prepare(["--out", out, "--shard_tokens", 100, "--val_tokens", 0, good, lines])
    assert r.returncode == 1 and "4 bad inputs" in r.stderr, r.stderr
    assert not os.path.exists(out), os.listdir(out)
    r = run_prepare(["--out", out, "--shard_tokens", 0, "--val_tokens", -1, "--workers", 0, good, missing])
    want = ["--shard_tokens 0: expected a positive", "--val_tokens -1: expected a non-negative",
            "--workers 0: expected at least 1", missing + ": no such file"]
    assert r.returncode == 1 and all(w in r.stderr for w in want), r.stderr
    assert not os.path.exists(out), os.listdir(out)
    # a first run makes 4 training shards; a second with larger shards is refused, then with
    # --overwrite it leaves exactly its own 2
    assert run_prepare(["--out", out, "--shard_tokens", 100, "--val_tokens", 0, good]).returncode == 0
    first = folder_bytes(out)
    assert sorted(first) == ["data_train_%06d.bin" % i for i in range(1, 5)], sorted(first)
    r = run_prepare(["--out", out, "--shard_tokens", 200, "--val_tokens", 0, good])
    assert r.returncode == 1 and "already holds 4 data_* shards" in r.stderr and folder_bytes(out) == first, r.stderr
    r = run_prepare(["--out", out, "--shard_tokens", 200, "--val_tokens", 0, "--overwrite", good])
    assert r.returncode == 0 and sorted(os.listdir(out)) == ["data_train_000001.bin", "data_train_000002.bin"], \
        (r.stderr, os.listdir(out))


@test
def data_prepare_small_text_with_the_default_split_says_what_to_give():
    """the README's command (no --val_tokens, no --shard_tokens) on a text of 400 tokens: the
    default validation split (one shard, 10^8 tokens) takes them all, and the message names the
    default and gives a --val_tokens that works (a tenth, 40); with it, one validation file of 40
    tokens and one training shard of the other 360"""
    d = fresh_dir("data_small")
    text = os.path.join(d, "notes.txt")
    with open(text, "w") as f:
        f.write(" ".join(["word"] * 399))  # 400 tokens with its <|endoftext|>
    out = os.path.join(d, "out")
    r = run_prepare(["--out", out, text])
    want = "all 400 tokens fit in the validation split (--val_tokens 100000000, by default --shard_tokens)"
    assert r.returncode == 1 and want in r.stderr and "e.g. --val_tokens 40 " in r.stderr, r.stderr
    assert not os.path.exists(out), os.listdir(out)
    r = run_prepare(["--out", out, "--val_tokens", 40, text])
    assert r.returncode == 0, r.stderr
    assert [(n, len(t)) for n, t in read_shards(out, "data")] == [("data_val_000000.bin", 40), ("data_train_000001.bin", 360)]


@test
def data_prepare_takes_a_quoted_pattern_as_the_shell_would():
    """'DIR/doc*.txt' quoted (as the trainers' -i takes a pattern) gives the bytes of the files
    listed one by one in sorted order; a pattern matching nothing is named as such, nothing written"""
    d = fresh_dir("data_pattern")
    files = write_inputs(d, sample_docs(12))
    texts = sorted(f for f in files if f.endswith(".txt"))
    flags = ["--shard_tokens", 50, "--val_tokens", 20, "--workers", 2]
    r = run_prepare(["--out", os.path.join(d, "listed")] + flags + texts)
    assert r.returncode == 0, r.stderr
    r = run_prepare(["--out", os.path.join(d, "pattern")] + flags + [os.path.join(d, "doc*.txt")])
    assert r.returncode == 0, r.stderr
    assert folder_bytes(os.path.join(d, "pattern")) == folder_bytes(os.path.join(d, "listed"))
    nothing = os.path.join(d, "none", "*.txt")
    r = run_prepare(["--out", os.path.join(d, "none_out")] + flags + [nothing])
    assert r.returncode == 1 and nothing + ": a pattern matching no file" in r.stderr, r.stderr
    assert not os.path.exists(os.path.join(d, "none_out"))


@test
def data_prepare_out_and_write_failures_are_messages():
    """--out naming a file, --out under a file, and a shard write that fails (a file-size limit
    of 4 KiB, RLIMIT_FSIZE, on shards of 5 KiB: EFBIG, as a full disk gives ENOSPC): each one
    'prepare.py:' line naming --out and the cause, exit 1, no traceback, nothing left (no
    temporary, no directory it made)"""
    import resource
    d = fresh_dir("data_out")
    text = os.path.join(d, "notes.txt")
    with open(text, "w") as f:
        f.write(" ".join(["word"] * 5999))  # 6000 tokens with its <|endoftext|>
    a_file = os.path.join(d, "a_file")
    open(a_file, "w").close()
    flags = ["--shard_tokens", 2500, "--val_tokens", 100, text]
    for out, want in ((a_file, "--out %s: a file, expected a directory" % a_file),
                      (os.path.join(a_file, "sub"), "--out %s: cannot make the directory (Not a directory)" % os.path.join(a_file, "sub"))):
        r = run_prepare(["--out", out] + flags)
        assert r.returncode == 1 and want in r.stderr and "Traceback" not in r.stderr, r.stderr
    out = os.path.join(d, "limited")

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
    r = subprocess.run(PREPARE + ["--out", out] + [str(f) for f in flags], capture_output=True, text=True, preexec_fn=limit)
    want = "prepare.py: writing the shards in %s failed ([Errno 27] File too large), nothing written" % out
    assert r.returncode == 1 and want in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not os.path.exists(out), os.listdir(out)


@test
def data_prepare_names_a_compressed_input_and_warns_on_json():
    """a gzip'd JSONL file (not .jsonl, so text; its second byte 0x8b is not UTF-8) is named as
    gzip, to be decompressed; a .json file of JSON lines is tokenized as text, with a warning that
    names the file and .jsonl"""
    import gzip
    d = fresh_dir("data_packed")
    rows = "".join(json.dumps({"text": doc}) + "\n" for doc in sample_docs(6))
    packed = os.path.join(d, "corpus.jsonl.gz")
    with gzip.open(packed, "wt") as f:
        f.write(rows)
    r = run_prepare(["--out", os.path.join(d, "out"), "--val_tokens", 10, packed])
    want = packed + ":1: not UTF-8 text (byte 1 of the file: 0x8b); a gzip file: decompress it first"
    assert r.returncode == 1 and want in r.stderr, r.stderr
    as_json = os.path.join(d, "corpus.json")
    with open(as_json, "w") as f:
        f.write(rows)
    r = run_prepare(["--out", os.path.join(d, "out"), "--val_tokens", 10, as_json])
    want = "warning: %s is read as one document of text, its JSON syntax included" % as_json
    assert r.returncode == 0 and want in r.stderr and ".jsonl" in r.stderr, r.stderr


@test
def data_prepare_stopped_by_sigterm_or_ctrl_c_leaves_nothing():
    """prepare.py on 12 MB of JSONL (seconds of work), stopped once its first temporary shard is
    in --out: by SIGTERM (what kill, timeout and job schedulers send), exit 143; by SIGINT (Ctrl-C),
    exit 130; each with one line saying nothing was written, and no --out left (no temporary,
    no directory); the worker processes end with it; with --workers 1 and 2"""
    d = fresh_dir("data_stopped")
    big = os.path.join(d, "big.jsonl")
    docs = sample_docs(400)
    with open(big, "w") as f:
        while f.tell() < 12 << 20:
            for i, doc in enumerate(docs):
                f.write(json.dumps({"text": "%d %s" % (f.tell(), doc)}) + "\n")
    # (--workers 1 tokenizes in the main process, whose signals stay prepare.py's: it ignored Ctrl-C once)
    for sig, code, said, workers in ((signal.SIGTERM, 143, "stopped (SIGTERM), nothing written", 2),
                                     (signal.SIGINT, 130, "interrupted, nothing written", 2),
                                     (signal.SIGINT, 130, "interrupted, nothing written", 1)):
        out = os.path.join(d, "out")
        # (SIGINT's default restored: a runner started in the background may have it ignored)
        p = subprocess.Popen(PREPARE + ["--out", out, "--shard_tokens", "1000", "--val_tokens", "1000", "--workers",
                                        str(workers), big],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        deadline = time.time() + 120
        while p.poll() is None and time.time() < deadline and not (
                os.path.isdir(out) and any(n.endswith(".tmp") for n in os.listdir(out))):
            time.sleep(0.01)
        assert p.poll() is None, "prepare.py ended before it could be stopped: %s" % p.communicate()[1][-2000:]
        p.send_signal(sig)
        _, err = p.communicate(timeout=60)
        assert p.returncode == code and err.count(said) == 1 and "Traceback" not in err, \
            "%s: exit %d\n%s" % (sig.name, p.returncode, err[-3000:])
        assert not os.path.exists(out), "%s left %s" % (sig.name, os.listdir(out))
        assert not session_processes(p.pid), "workers left running: %s" % session_processes(p.pid)


def session_processes(sid):
    """the processes of session sid, from /proc (pgrep -s's answer, without procps): a process's
    session is the 4th field after the command's closing parenthesis in /proc/PID/stat"""
    found = []
    for name in os.listdir("/proc"):
        try:
            with open("/proc/%s/stat" % name) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):  # (not a process, or gone meanwhile)
            continue
        if int(fields[3]) == sid:
            found.append(int(name))
    return found


FINEWEB_FIELDS = ("text", "id", "dump", "url", "date", "file_path", "language", "language_score", "token_count")


def fineweb_rows(docs):
    """made-up rows with FineWeb's fields (the dataset card's), the documents in 'text'"""
    return [dict(text=doc, id="<urn:uuid:%08d-0000-0000-0000-000000000000>" % i, dump="CC-MAIN-2024-10",
                 url="https://example.org/%d" % i, date="2024-02-2%dT00:00:00Z" % (i % 10),
                 file_path="s3://commoncrawl/crawl-data/CC-MAIN-2024-10/segments/%d.warc.gz" % i,
                 language="en", language_score=0.9, token_count=len(doc.split())) for i, doc in enumerate(docs)]


@test
def data_fineweb_local_sample_gives_prepare_shards():
    """fineweb.py --local on a JSONL file of FineWeb's rows (and on a parquet file of them where
    pyarrow is installed) writes the same shards as prepare.py on the same texts as text files;
    a row whose text is missing is named by file:line"""
    d = fresh_dir("data_fineweb")
    docs = sample_docs(24)
    rows = fineweb_rows(docs)
    sample = os.path.join(d, "sample.jsonl")
    with open(sample, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    texts = []
    for i, doc in enumerate(docs):
        texts.append(os.path.join(d, "doc%03d.txt" % i))
        with open(texts[-1], "w", encoding="utf-8", newline="") as f:
            f.write(doc)
    flags = ["--shard_tokens", 150, "--val_tokens", 200, "--workers", 2]
    r = run_prepare(["--out", os.path.join(d, "prepared"), "--prefix", "fineweb"] + flags + texts)
    assert r.returncode == 0, r.stderr[-2000:]
    prepared = folder_bytes(os.path.join(d, "prepared"))
    assert len(prepared) >= 3, sorted(prepared)
    sources = [sample]
    try:
        import pyarrow
        import pyarrow.parquet
        sources.append(os.path.join(d, "sample.parquet"))
        pyarrow.parquet.write_table(pyarrow.Table.from_pylist(rows), sources[-1])
    except ImportError:
        print("    no pyarrow: the JSONL sample only (fineweb.py reads parquet with pyarrow)")
    for source in sources:
        out = os.path.join(d, "fineweb_" + os.path.basename(source))
        r = run_prepare(["--local", source, "--out", out] + flags, program=FINEWEB)
        assert r.returncode == 0, r.stderr[-2000:]
        assert folder_bytes(out) == prepared, "%s: fineweb.py's shards differ from prepare.py's" % source
    broken = os.path.join(d, "broken.jsonl")
    with open(broken, "w") as f:
        f.write(json.dumps(rows[0]) + "\n" + json.dumps(dict(rows[1], text=None)) + "\n" +
                json.dumps({k: v for k, v in rows[2].items() if k != "text"}) + "\n")
    r = run_prepare(["--local", broken, os.path.join(d, "none.parquet"), "--out", os.path.join(d, "broken")] + flags,
                    program=FINEWEB)
    want = [broken + ":2: field 'text' is null, expected a string", broken + ":3: no field 'text'",
            os.path.join(d, "none.parquet") + ": no such file"]
    assert r.returncode == 1 and all(w in r.stderr for w in want), r.stderr
    assert not os.path.exists(os.path.join(d, "broken")) or not os.listdir(os.path.join(d, "broken"))
