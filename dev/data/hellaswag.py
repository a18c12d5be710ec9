"""
HellaSwag's validation set (Zellers et al. 2019: 10,042 sentence completions) as llm.c's eval
file, for the trainers' -h 1 (llmc/hellaswag.h reads it; llm.c's train_gpt2 reads it too).

    /usr/bin/python3 dev/data/hellaswag.py [--out DIR] [--local FILE.jsonl]

Input: the dataset's own hellaswag_val.jsonl, downloaded from its repository (the URL llm.c
uses) into DIR unless DIR holds it already; or --local FILE, a copy in the same format (no
network). Of each line's JSON object three fields are used: "ctx" (the context, a string),
"endings" (four strings) and "label" (the right ending, 0..3; "0".."3" as strings too, as
Hugging Face's copy of the dataset has them); the others ("ind", "activity_label", "ctx_a",
"ctx_b", "split", ...) are ignored.

Output: DIR/hellaswag_val.bin (DIR: dev/data/hellaswag by default), llm.c's eval format:
    a header of 256 int32: 20240522 (magic), 1 (version), the number of examples, the bytes of the
    longest example; then each example as uint16:
        65535, the example's bytes (from the 65535 on), its index, its label, 4 (completions),
        the context's length and tokens, then each ending's length and tokens

Tokens: GPT-2's BPE (gpt2_bpe.py: tiktoken where installed, else the Python BPE; the same
tokens). Each ending is tokenized with a space before it (" " + ending), as llm.c does: it
continues the context's sentence, and GPT-2's tokens carry the space before a word.

Bad input (a missing file, a line that is not UTF-8 or not JSON, a missing or ill-typed field, a
label outside 0..3, not four endings, an example too long for the format's 16-bit counts) is
reported with file:line, exit 1, and nothing written: the file is written under a temporary name
and renamed once whole (and a failed download leaves no --out it made).
"""
import argparse
import json
import os
import struct
import sys
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gpt2_bpe  # noqa: E402

URL = "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl"
MAGIC, VERSION = 20240522, 1
DELIMITER = 65535  # each example's first uint16; a token or count must stay below it
CHOICES = 4


def fail(message):
    print("error: " + message, file=sys.stderr)
    sys.exit(1)


def download(path):
    """the validation jsonl into path (under path.tmp until whole)"""
    print("downloading %s to %s" % (URL, path))
    tmp = path + ".tmp"
    try:
        with urllib.request.urlopen(URL, timeout=60) as r, open(tmp, "wb") as f:
            while True:
                piece = r.read(1 << 20)
                if not piece:
                    break
                f.write(piece)
    except OSError as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        fail("downloading %s failed: %s (no network? give a local copy with --local FILE.jsonl)" % (URL, e))
    os.replace(tmp, path)


def label_of(value):
    """the label as an int 0..3, or None: the dataset's file has integers, Hugging Face's copy
    (Rowan/hellaswag, exported to JSONL) the same numbers as strings ("0".."3")"""
    if isinstance(value, str) and value in ("0", "1", "2", "3"):
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < CHOICES:
        return None
    return value


def read_examples(path):
    """[(ctx, endings, label)] from a HellaSwag jsonl; every problem is reported, with its line"""
    try:
        with open(path, "rb") as f:
            lines = f.read().split(b"\n")
    except OSError as e:
        fail("cannot read '%s': %s" % (path, e))
    examples, problems = [], []
    for number, raw in enumerate(lines, 1):
        where = "%s:%d" % (path, number)
        try:
            line = raw.decode("utf-8-sig")  # (-sig: a UTF-8 byte-order mark is dropped)
        except UnicodeDecodeError as e:
            problems.append("%s: not UTF-8 (byte %d of the line: 0x%02x)" % (where, e.start, raw[e.start]))
            continue
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as e:
            problems.append("%s: not JSON (%s)" % (where, e))
            continue
        if not isinstance(item, dict):
            problems.append("%s: expected a JSON object with ctx, endings and label" % where)
            continue
        ctx, endings, label = item.get("ctx"), item.get("endings"), label_of(item.get("label"))
        if not isinstance(ctx, str) or not ctx:
            problems.append("%s: \"ctx\" must be a non-empty string, got %r" % (where, ctx))
        elif not (isinstance(endings, list) and len(endings) == CHOICES and all(isinstance(e, str) and e for e in endings)):
            problems.append("%s: \"endings\" must be a list of %d non-empty strings, got %r" % (where, CHOICES, endings))
        elif label is None:
            problems.append("%s: \"label\" must be an integer 0..%d, got %r" % (where, CHOICES - 1, item.get("label")))
        else:
            examples.append((where, ctx, endings, label))
    if problems:
        fail("%d bad line(s) in '%s':\n  %s" % (len(problems), path, "\n  ".join(problems[:50])))
    if not examples:
        fail("'%s' holds no examples" % path)
    if len(examples) >= DELIMITER:
        fail("'%s': %d examples; the format's 16-bit index holds at most %d" % (path, len(examples), DELIMITER - 1))
    return examples


def encoder():
    bpe = gpt2_bpe.load_bpe()
    fast = gpt2_bpe.tiktoken_encoder(bpe)
    return fast.encode_ordinary if fast is not None else bpe.encode


def example_stream(index, ctx_tokens, ending_tokens, label):
    """one example's uint16s, its byte count filled in"""
    stream = [DELIMITER, 0, index, label, CHOICES, len(ctx_tokens)] + ctx_tokens
    for tokens in ending_tokens:
        stream += [len(tokens)] + tokens
    stream[1] = 2 * len(stream)
    return stream


def write_eval_file(path, streams):
    longest = max(s[1] for s in streams)
    header = [0] * 256
    header[0], header[1], header[2], header[3] = MAGIC, VERSION, len(streams), longest
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<256i", *header))
            for s in streams:
                f.write(struct.pack("<%dH" % len(s), *s))
        os.replace(tmp, path)
    except OSError:  # (the disk full, a file-size limit: no half-written file stays)
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def make_out(path):
    """--out made where missing; whether it was made here (then removed again on failure)"""
    made = not os.path.isdir(path)
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        fail("--out '%s': cannot make the directory (%s)" % (path, e.strerror or e))
    return made


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(HERE, "hellaswag"), help="output directory (default dev/data/hellaswag)")
    ap.add_argument("--local", help="a HellaSwag jsonl to read instead of downloading")
    args = ap.parse_args()
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        fail("--out '%s' is not a directory" % args.out)
    source = args.local
    if source is None:
        made = make_out(args.out)
        source = os.path.join(args.out, "hellaswag_val.jsonl")
        if not os.path.exists(source):
            try:
                download(source)
            finally:  # (a failed download leaves no empty --out behind it)
                if made and not os.listdir(args.out):
                    os.rmdir(args.out)
    elif not os.path.isfile(source):
        fail("--local '%s': no such file (a HellaSwag jsonl: one JSON object a line with ctx, endings, label)" % source)
    examples = read_examples(source)
    encode = encoder()
    streams, longest_row = [], 0
    for index, (where, ctx, endings, label) in enumerate(examples):
        ctx_tokens = encode(ctx)
        ending_tokens = [encode(" " + e) for e in endings]
        longest_row = max([longest_row] + [len(ctx_tokens) + len(t) for t in ending_tokens])
        stream = example_stream(index, ctx_tokens, ending_tokens, label)
        if stream[1] >= 1 << 16:
            fail("%s: the example is %d bytes; the format's 16-bit byte count holds at most 65535" % (where, stream[1]))
        streams.append(stream)
    made = make_out(args.out)
    out = os.path.join(args.out, "hellaswag_val.bin")
    try:
        write_eval_file(out, streams)
    except OSError as e:
        if made and not os.listdir(args.out):
            os.rmdir(args.out)
        fail("writing '%s' failed (%s), nothing written" % (out, e))
    print("wrote %d examples to %s; the longest context + ending is %d tokens (the trainers' -t must hold it)"
          % (len(streams), out, longest_row))


if __name__ == "__main__":
    main()
