"""
Text files or JSONL into llm.c token shards with the GPT-2 BPE, in parallel processes.

    /usr/bin/python3 dev/data/prepare.py [--jsonl_field NAME] [--shard_tokens N] [--val_tokens N]
        [--workers N] [--prefix NAME] [--encoder auto|python|tiktoken] [--overwrite] --out DIR FILES...

Inputs: a file ending in .jsonl holds one JSON object a line, the document in its field
--jsonl_field ("text" by default; blank lines are skipped); any other file is one document of
UTF-8 text. Documents are taken in the order of FILES, then of the lines. A quoted pattern
('notes/*.txt', as the trainers' -i takes one) stands for its matches, sorted.

Output: every document is preceded by <|endoftext|> (50256), as in llm.c's FineWeb preparation,
so the model learns that it begins a document and sampling from it starts a new one. The token
stream is cut into files of llm.c's format (a 256 x int32 header: magic 20240520, version 1,
the token count; then uint16 tokens), filled in order, a document running on into the next
file where it does not fit:
    DIR/PREFIX_val_000000.bin     the first --val_tokens tokens (default: one shard's worth,
                                  llm.c's convention; 0: no validation file)
    DIR/PREFIX_train_000001.bin   then --shard_tokens tokens a file; the last may be shorter
    DIR/PREFIX_train_000002.bin   ...
The bytes are the same on every run, whatever --workers: documents are tokenized in parallel
but written in input order.

Files are written under temporary names (NAME.tmp) and renamed at the end, so a run stopped
half-way, or one that met bad input, leaves no shard. A directory that already holds
PREFIX_train_*/PREFIX_val_* shards is refused (its shards would mix with the new ones):
choose another --out or --prefix, or give --overwrite, which deletes them once the new ones
are written.

Bad input (a missing file, a JSONL line that is not JSON or lacks the field, text that is not
UTF-8, a bad flag value) is reported all together in one message, with file:line, exit 1, and
nothing written.

Encoder: tiktoken where installed (faster), else dev/data/gpt2_bpe.py's Python BPE; the two give
the same tokens. The progress bar is tqdm's (dev/setup.sh installs it into .tools), or a plain
line every few seconds without it.
"""
import argparse
import collections
import glob
import itertools
import json
import multiprocessing
import os
import signal
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gpt2_bpe  # noqa: E402

# tqdm from the packages dev/setup.sh puts in .tools (appended: nothing there shadows a Debian package)
sys.path.append(os.environ.get("LLMC_TOOLS_DIR", os.path.join(os.path.dirname(os.path.dirname(HERE)), ".tools")))
try:
    from tqdm import tqdm
except ImportError:
    tqdm = None

CHUNK_BYTES = 1 << 18     # input handed to a worker at a time (256 KiB: it tokenizes a whole chunk)
ERRORS_SHOWN = 50         # a file of bad lines would otherwise print one line per line
# the first bytes of compressed files, named when such a file is given as text
COMPRESSED = ((b"\x1f\x8b", "gzip"), (b"\x28\xb5\x2f\xfd", "zstd"), (b"BZh", "bzip2"), (b"\xfd7zXZ\x00", "xz"))


class BadInput(Exception):
    """every problem found, one per line, raised once"""

    def __init__(self, problems, total=None):
        total = len(problems) if total is None else total
        lines = problems[:ERRORS_SHOWN]
        if total > len(lines):
            lines.append("... and %d more" % (total - len(lines)))
        super().__init__("%d bad input%s, nothing written:\n  %s" % (total, "s" if total > 1 else "", "\n  ".join(lines)))


# ---------------------------------------------------------------------------------------------
# the workers: a chunk of items in, its tokens out. An item is (where, payload, field): with a
# field, the payload is a JSON line (bytes) whose field is the document; without, the payload is
# the document itself (bytes of UTF-8, or a str, or whatever a dataset's column held)

_encode = None


def start_worker(encoder):
    """each process loads the encoder once; Ctrl-C and SIGTERM are the main process's to handle
    (it ends the pool): a worker ignores the first and dies of the second, quietly. A worker is
    forked with SIGTERM blocked (tokenized), so one sent before this point waits, and kills it here"""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGTERM])
    load_encoder(encoder)


def load_encoder(encoder):
    global _encode
    bpe = gpt2_bpe.load_bpe()
    _encode = gpt2_bpe.tiktoken_encoder(bpe).encode_ordinary if encoder == "tiktoken" else bpe.encode


def document(where, payload, field):
    """(text, None) or (None, what is wrong with it)"""
    if field is not None:
        try:
            # (decoded here: json.loads on bytes would guess UTF-16 from a line that starts with
            # \xff\xfe and call it "not JSON"; -sig drops a UTF-8 byte-order mark, as json.loads does)
            row = json.loads(payload.decode("utf-8-sig"))
        except UnicodeDecodeError as e:
            return None, "%s: not UTF-8 (byte %d of the line: 0x%02x)" % (where, e.start, payload[e.start])
        except ValueError as e:
            return None, "%s: not JSON (%s)" % (where, e)
        if not isinstance(row, dict):
            return None, "%s: a JSON %s, expected an object with a field '%s'" % (where, type(row).__name__, field)
        if field not in row:
            return None, "%s: no field '%s' (its fields: %s)" % (where, field, ", ".join(row) or "none")
        payload = row[field]
    if isinstance(payload, bytes):
        try:
            return payload.decode("utf-8"), None
        except UnicodeDecodeError as e:
            line = payload.count(b"\n", 0, e.start) + 1
            packed = [name for magic, name in COMPRESSED if payload.startswith(magic)]
            return None, "%s:%d: not UTF-8 text (byte %d of the file: 0x%02x)%s" % (
                where, line, e.start, payload[e.start], "; a %s file: decompress it first" % packed[0] if packed else "")
    if not isinstance(payload, str):
        return None, "%s: field '%s' is %s, expected a string" % (where, field or "text", json.dumps(payload)[:40])
    return payload, None


def tokenize_chunk(chunk):
    """(tokens as uint16 bytes, documents, non-ASCII documents, problems, input size); once a
    problem is known nothing will be written, and the chunk is only checked (tokenize False):
    reading for the problems is fast, the BPE is not"""
    items, size, tokenize = chunk
    tokens, problems, docs, non_ascii = [], [], 0, 0
    for where, payload, field in items:
        text, problem = document(where, payload, field)
        if problem is None:
            try:
                if tokenize:
                    ids = _encode(text)
                else:
                    text.encode("utf-8")  # (the one check the encoder would make)
                    ids = []
            except UnicodeEncodeError:  # a JSON "\ud800": a lone surrogate is no text
                problem = "%s: holds a lone surrogate (a \\uD800-\\uDFFF escape alone), not text" % where
        if problem is not None:
            problems.append(problem)
            continue
        tokens.append(gpt2_bpe.EOT)
        tokens.extend(ids)
        docs += 1
        non_ascii += not text.isascii()
    return np.array(tokens, dtype=np.uint16).tobytes(), docs, non_ascii, problems, size


def tokenized(chunks, workers, encoder):
    """tokenize_chunk's results in the order of the chunks; at most 2 chunks a worker in flight,
    so that a large input is never read far ahead of the writer"""
    if workers == 1:  # (in this process, whose Ctrl-C and SIGTERM stay write_shards')
        load_encoder(encoder)
        for chunk in chunks:
            yield tokenize_chunk(chunk)
        return
    first = next(chunks, None)
    if first is None:  # (nothing to tokenize: no pool to start and end at once)
        return
    chunks = itertools.chain([first], chunks)
    # A worker is forked with the main process's SIGTERM handler (write_shards': raise Stopped) until
    # start_worker replaces it. The pool ends its workers with SIGTERM; one that arrived in that
    # window was taken by the inherited handler, or lost as start_worker installed the default, and
    # the worker lived on, waiting for a lock that the ending pool held: prepare.py hung. Blocked
    # here, SIGTERM waits in each new worker until start_worker unblocks it, with the default set
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])
    try:
        pool = multiprocessing.Pool(workers, initializer=start_worker, initargs=(encoder,))
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    with pool:
        pending = collections.deque()
        for chunk in chunks:
            pending.append(pool.apply_async(tokenize_chunk, (chunk,)))
            if len(pending) >= 2 * workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


# ---------------------------------------------------------------------------------------------
# the inputs as chunks

def is_jsonl(path):
    return path.endswith(".jsonl")


def file_chunks(paths, field):
    """text files whole, JSONL files a chunk of lines at a time: ([items], bytes) each"""
    for path in paths:
        if not is_jsonl(path):
            with open(path, "rb") as f:
                data = f.read()
            yield [(path, data, None)], len(data)
            continue
        items, size = [], 0
        with open(path, "rb") as f:
            for number, line in enumerate(f, 1):
                size += len(line)
                if line.strip():
                    items.append(("%s:%d" % (path, number), line, field))
                if size >= CHUNK_BYTES:
                    yield items, size
                    items, size = [], 0
        if items or size:
            yield items, size


def expand_patterns(paths):
    """each path that does not exist but holds * ? or [ replaced by its matches, sorted: a quoted
    pattern ('notes/*.txt', as the trainers' -i takes one) works as the shell's expansion would;
    one matching nothing stays, to be reported"""
    files = []
    for path in paths:
        matches = sorted(glob.glob(path)) if not os.path.exists(path) and glob.has_magic(path) else []
        files.extend(matches or [path])
    return files


def unreadable(paths):
    """{file: why it cannot be read} for the files that cannot"""
    problems = {}
    for path in paths:
        if not os.path.exists(path):
            problems[path] = "%s: %s" % (path, "a pattern matching no file" if glob.has_magic(path) else "no such file")
        elif os.path.isdir(path):
            problems[path] = "%s: a directory, expected a text or .jsonl file" % path
        elif not os.access(path, os.R_OK):
            problems[path] = "%s: not readable (permissions)" % path
    return problems


# ---------------------------------------------------------------------------------------------
# the shards

def shard_name(out, prefix, index, val):
    return os.path.join(out, "%s_%s_%06d.bin" % (prefix, "val" if val else "train", index))


def existing_shards(out, prefix):
    return sorted(glob.glob(os.path.join(glob.escape(out), glob.escape(prefix) + "_train_*.bin")) +
                  glob.glob(os.path.join(glob.escape(out), glob.escape(prefix) + "_val_*.bin")))


class ShardWriter:
    """fills shard after shard under temporary names; commit() renames them, discard() removes them"""

    def __init__(self, out, prefix, shard_tokens, val_tokens):
        self.out, self.prefix, self.shard_tokens, self.val_tokens = out, prefix, shard_tokens, val_tokens
        self.index = self.first = 0 if val_tokens > 0 else 1  # shard 0 is the validation split, as in llm.c
        self.file, self.count = None, 0
        self.written = []  # (final name, tokens) of each closed shard

    def capacity(self):
        return self.val_tokens if self.index == 0 else self.shard_tokens

    def add(self, tokens):
        while len(tokens):
            if self.file is None:
                self.file = open(shard_name(self.out, self.prefix, self.index, self.index == 0) + ".tmp", "wb")
                self.file.write(gpt2_bpe.tokens_header(0))  # (the count is written when it is known)
                self.count = 0
            take = tokens[:self.capacity() - self.count]
            self.file.write(take.tobytes())
            self.count += len(take)
            tokens = tokens[len(take):]
            if self.count == self.capacity():
                self.close_shard()

    def close_shard(self):
        self.file.seek(0)
        self.file.write(gpt2_bpe.tokens_header(self.count))
        self.file.close()
        self.written.append((shard_name(self.out, self.prefix, self.index, self.index == 0), self.count))
        self.file = None
        self.index += 1

    def finish(self):
        if self.file is not None:
            self.close_shard()

    def discard(self):
        """removes every temporary of this run: the closed shards' and the one being filled (by
        index: Ctrl-C may land between a shard's open and its bookkeeping)"""
        if self.file is not None:
            try:
                self.file.close()
            except OSError:  # (its flush fails as the write did, the disk full: the file is closed all the same)
                pass
            self.file = None
        for index in range(self.first, self.index + 1):
            name = shard_name(self.out, self.prefix, index, index == 0) + ".tmp"
            if os.path.exists(name):
                os.remove(name)

    def commit(self, old):
        for name in old:
            os.remove(name)
        for name, _ in self.written:
            os.replace(name + ".tmp", name)


class Progress:
    """tqdm's bar where installed, else a line on stderr every 5 seconds"""

    def __init__(self, total, unit, desc):
        self.total, self.unit, self.desc = total, unit, desc
        self.done = self.tokens = 0
        self.shown = time.time()
        self.bar = tqdm(total=total, unit=unit, unit_scale=True, desc=desc) if tqdm else None

    def update(self, amount, tokens):
        self.done += amount
        self.tokens += tokens
        if self.bar is not None:
            self.bar.set_postfix_str("{:,} tokens".format(self.tokens), refresh=False)
            self.bar.update(amount)
        elif time.time() - self.shown >= 5:
            self.shown = time.time()
            of = " of %d" % self.total if self.total else ""
            print("%s: %d%s %s, %d tokens" % (self.desc, self.done, of, self.unit, self.tokens), file=sys.stderr, flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()


def choose_encoder(name):
    """'tiktoken' or 'python'; auto is tiktoken where installed"""
    if name == "auto":
        try:
            import tiktoken  # noqa: F401
            return "tiktoken"
        except ImportError:
            return "python"
    return name


class Stopped(Exception):
    """SIGTERM (kill, timeout, a job scheduler) while shards are being written"""


def stop(signum, frame):
    raise Stopped()


def write_shards(chunks, out, prefix, shard_tokens, val_tokens, workers, encoder, overwrite,
                 problems=(), total=None, unit="B", desc="tokenizing", default_val=False):
    """the chunks' documents into shards; problems already found (unreadable files) are reported
    with those the documents have, after every chunk was read, and then nothing is written.
    Interrupted (Ctrl-C, SIGTERM) or failed, it leaves nothing: no temporary, and no --out it made.
    Returns a summary line; raises BadInput, KeyboardInterrupt or Stopped."""
    problems, bad = list(problems), len(problems)
    old = existing_shards(out, prefix)
    if old and not overwrite:
        problems.append("%s already holds %d %s_* shards (%s, ...): another --out or --prefix, or --overwrite to replace them"
                        % (out, len(old), prefix, os.path.basename(old[0])))
        bad += 1
    made_out = False  # (an --out made here is removed again on failure)
    if os.path.exists(out) and not os.path.isdir(out):
        problems.append("--out %s: a file, expected a directory (made if missing)" % out)
        bad += 1
    elif bad == 0:
        try:
            made_out = not os.path.isdir(out)
            os.makedirs(out, exist_ok=True)
        except OSError as e:
            made_out = False
            problems.append("--out %s: cannot make the directory (%s)" % (out, e.strerror or e))
            bad += 1
    writer = ShardWriter(out, prefix, shard_tokens, val_tokens)
    encoder = choose_encoder(encoder)
    progress = Progress(total, unit, desc)
    started = time.time()
    tokens = docs = non_ascii = 0
    # (bad is read as each chunk is handed out: after the first problem, chunks are only checked)
    chunks = ((items, size, bad == 0) for items, size in chunks)
    done = False
    # SIGTERM's default would end the process at once, leaving the temporaries: raised instead,
    # it runs the finally below as Ctrl-C's KeyboardInterrupt does
    previous = {signal.SIGINT: signal.getsignal(signal.SIGINT), signal.SIGTERM: signal.signal(signal.SIGTERM, stop)}
    try:
        for data, n_docs, n_non_ascii, chunk_problems, size in tokenized(chunks, workers, encoder):
            bad += len(chunk_problems)
            problems.extend(chunk_problems[:max(0, ERRORS_SHOWN - len(problems))])
            ids = np.frombuffer(data, dtype=np.uint16)
            if bad == 0:
                writer.add(ids)
            tokens += len(ids)
            docs += n_docs
            non_ascii += n_non_ascii
            progress.update(size, len(ids))
        if bad == 0 and docs == 0:
            problems.append("no documents in the input")
            bad += 1
        elif bad == 0 and tokens <= val_tokens:
            problems.append("all %d tokens fit in the validation split (--val_tokens %d%s): no training shard; give a smaller "
                            "--val_tokens, e.g. --val_tokens %d (a tenth of them)"
                            % (tokens, val_tokens, ", by default --shard_tokens" if default_val else "", tokens // 10))
            bad += 1
        if bad:
            raise BadInput(problems, bad)
        writer.finish()
        for sig in previous:  # (the renames are not stopped half-way: a signal now is ignored, the run completes)
            signal.signal(sig, signal.SIG_IGN)
        writer.commit([name for name in old if name not in {n for n, _ in writer.written}] if overwrite else [])
        done = True
    finally:
        progress.close()
        writer.discard()  # (removes what commit did not rename: nothing after a success)
        if made_out and not done and not os.listdir(out):
            os.rmdir(out)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    seconds = time.time() - started
    val = [n for n, count in writer.written if "_val_" in os.path.basename(n)]
    train_tokens = sum(count for n, count in writer.written if n not in val)
    summary = ("%d tokens from %d documents in %.1f s (%.0f tokens/s, %s encoder, %d worker%s): %s%d train shard%s (%d tokens) in %s"
               % (tokens, docs, seconds, tokens / max(seconds, 1e-9), encoder, workers, "s" if workers > 1 else "",
                  "validation %d tokens, " % (tokens - train_tokens) if val else "", len(writer.written) - len(val),
                  "s" if len(writer.written) - len(val) != 1 else "", train_tokens, out))
    if non_ascii and encoder == "python" and not gpt2_bpe.EXACT_SPLIT:
        summary += ("\nwarning: %d documents hold non-ASCII text, cut into pieces by the re module's approximation of "
                    "GPT-2's pattern (the regex module is not installed: apt-get install python3-regex)" % non_ascii)
    return summary


def positive(flag, value, allow_zero=False):
    """None, or the problem with a flag's value"""
    if value < 0 or (value == 0 and not allow_zero):
        return "%s %d: expected a %s number of tokens" % (flag, value, "non-negative" if allow_zero else "positive")
    if value >= 1 << 31:
        return "%s %d: more than a token file's int32 count holds (2^31 - 1)" % (flag, value)
    return None


def flag_problems(args):
    problems = [positive("--shard_tokens", args.shard_tokens)]
    if args.val_tokens is not None:
        problems.append(positive("--val_tokens", args.val_tokens, allow_zero=True))
    if args.workers < 1:
        problems.append("--workers %d: expected at least 1 process" % args.workers)
    if args.encoder == "tiktoken" and choose_encoder("auto") != "tiktoken":
        problems.append("--encoder tiktoken: tiktoken is not installed (pip install tiktoken; or --encoder python)")
    if not args.prefix or os.sep in args.prefix:
        problems.append("--prefix %r: expected a file name prefix" % args.prefix)
    return [p for p in problems if p]


def add_shard_flags(ap, prefix, prefix_help):
    """the flags prepare.py and fineweb.py share"""
    ap.add_argument("--shard_tokens", type=int, default=10 ** 8, help="tokens a training shard (default 10^8, as llm.c)")
    ap.add_argument("--val_tokens", type=int, default=None,
                    help="tokens of the validation split, the stream's first ones (default: --shard_tokens; 0: none)")
    ap.add_argument("--workers", type=int, default=max(1, os.cpu_count() or 1), help="processes (default: one a core)")
    ap.add_argument("--prefix", default=prefix, help="shard file names' start (default %s)" % prefix_help)
    ap.add_argument("--encoder", choices=("auto", "python", "tiktoken"), default="auto",
                    help="auto (default): tiktoken where installed, else the Python BPE; the tokens are the same")
    ap.add_argument("--overwrite", action="store_true", help="replace the shards of this prefix already in --out")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="the directory of the shards")
    ap.add_argument("--jsonl_field", default="text", help="the field of a .jsonl line that holds its document (default text)")
    add_shard_flags(ap, "data", "data")
    ap.add_argument("files", nargs="+", metavar="FILES", help="text files (a document each) and .jsonl files")
    args = ap.parse_args()
    args.files = expand_patterns(args.files)
    for name in args.files:
        if name.endswith(".json"):
            print("prepare.py: warning: %s is read as one document of text, its JSON syntax included; a file of one "
                  "JSON object a line must be named .jsonl (Hugging Face's to_json writes those)" % name, file=sys.stderr)
    val_tokens = args.shard_tokens if args.val_tokens is None else args.val_tokens
    problems = flag_problems(args)
    missing = unreadable(args.files)
    try:
        if problems:
            raise BadInput(problems + list(missing.values()))
        readable = [f for f in args.files if f not in missing]
        total = sum(os.path.getsize(f) for f in readable)
        print(write_shards(file_chunks(readable, args.jsonl_field), args.out, args.prefix, args.shard_tokens, val_tokens,
                           args.workers, args.encoder, args.overwrite, problems=list(missing.values()), total=total,
                           default_val=args.val_tokens is None))
    except BadInput as e:
        print("prepare.py: %s" % e, file=sys.stderr)
        sys.exit(1)
    except OSError as e:  # (writing a shard: the disk full, a file-size limit, ...)
        print("prepare.py: writing the shards in %s failed (%s), nothing written" % (args.out, e), file=sys.stderr)
        sys.exit(1)
    except (KeyboardInterrupt, Stopped) as e:
        print("\nprepare.py: %s, nothing written" % ("interrupted" if isinstance(e, KeyboardInterrupt) else "stopped (SIGTERM)"),
              file=sys.stderr)
        sys.exit(130 if isinstance(e, KeyboardInterrupt) else 143)


if __name__ == "__main__":
    main()
