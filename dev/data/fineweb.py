"""
FineWeb or FineWeb-Edu (Hugging Face's web text, Penedo et al. 2024) as llm.c token shards with
the GPT-2 BPE, through dev/data/prepare.py's code: the same shards, names and checks.

    /usr/bin/python3 dev/data/fineweb.py [--version 10B|100B] [--edu] [--out DIR] [prepare.py's flags]
    /usr/bin/python3 dev/data/fineweb.py --local FILE... [--out DIR] [prepare.py's flags]

Online, the sample of about 10 billion GPT-2 tokens (config sample-10BT; --version 100B:
sample-100BT) of HuggingFaceFW/fineweb (--edu: HuggingFaceFW/fineweb-edu) is streamed from the
Hugging Face hub with its datasets package (pip install datasets), document after document in
the dataset's order. Offline, --local reads files in the dataset's own formats: .parquet (the
files on the hub; needs pyarrow) or .jsonl (one row a line), each row with FineWeb's fields
(text, id, dump, url, date, file_path, language, language_score, token_count; only text is used).

Output, as llm.c's fineweb.py: DIR/PREFIX_val_000000.bin (the first 10^8 tokens), then
DIR/PREFIX_train_000001.bin, ... of 10^8 tokens each, every document preceded by <|endoftext|>;
DIR defaults to dev/data/fineweb10B (edu_fineweb10B, ...100B), PREFIX to fineweb (edu_fineweb).
The 10B sample is about 100 shards (20 GB); the 100B sample ten times that.
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import prepare  # noqa: E402

DATASETS = {False: "HuggingFaceFW/fineweb", True: "HuggingFaceFW/fineweb-edu"}
FIELD = "text"  # the column that holds the document


def hub_problems():
    try:
        import datasets  # noqa: F401
    except ImportError:
        return ["the download needs Hugging Face's datasets package: pip install datasets "
                "(offline: --local FILE with the dataset's parquet or JSONL files)"]
    return []


def hub_chunks(name, config):
    """the dataset streamed from the hub, a chunk of rows at a time (sizes in characters)"""
    from datasets import load_dataset
    rows = load_dataset(name, name=config, split="train", streaming=True)
    items, size = [], 0
    for number, row in enumerate(rows):
        text = row.get(FIELD)
        items.append(("%s row %d" % (name, number), text, None))
        size += len(text) if isinstance(text, str) else 0
        if size >= prepare.CHUNK_BYTES:
            yield items, size
            items, size = [], 0
    if items:
        yield items, size


def parquet_chunks(path):
    """a parquet file's text column, a batch of rows at a time (sizes in bytes of text)"""
    import pyarrow.parquet
    table = pyarrow.parquet.ParquetFile(path)
    number = 0
    for batch in table.iter_batches(columns=[FIELD], batch_size=1024):
        texts = batch.column(0).to_pylist()
        yield ([("%s row %d" % (path, number + i), text, None) for i, text in enumerate(texts)],
               sum(len(t.encode("utf-8")) for t in texts if isinstance(t, str)))
        number += len(texts)


def local_problems(paths):
    """what prevents reading each local file: missing, another format, no pyarrow, no text column"""
    problems = prepare.unreadable(paths)
    for path in paths:
        if path in problems:
            continue
        if not path.endswith((".parquet", ".jsonl")):
            problems[path] = "%s: expected a .parquet or .jsonl file (the dataset's formats)" % path
        elif path.endswith(".parquet"):
            try:
                import pyarrow.parquet
            except ImportError:
                problems[path] = "%s: reading parquet needs pyarrow (pip install pyarrow), or give the rows as .jsonl" % path
                continue
            try:
                names = pyarrow.parquet.ParquetFile(path).schema_arrow.names
            except Exception as e:  # (pyarrow's errors have no common class but this)
                problems[path] = "%s: not a parquet file (%s)" % (path, e)
                continue
            if FIELD not in names:
                problems[path] = "%s: no column '%s' (its columns: %s)" % (path, FIELD, ", ".join(names))
    return problems


def local_chunks(paths):
    for path in paths:
        if path.endswith(".parquet"):
            yield from parquet_chunks(path)
        else:
            yield from prepare.file_chunks([path], FIELD)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", choices=("10B", "100B"), default="10B", help="the sample's size in tokens (default 10B)")
    ap.add_argument("--edu", action="store_true", help="FineWeb-Edu (its educational pages) instead of FineWeb")
    ap.add_argument("--local", nargs="+", metavar="FILE", help="the dataset's .parquet or .jsonl files, read instead of the hub")
    ap.add_argument("--out", help="the directory of the shards (default dev/data/fineweb10B, edu_fineweb10B, ...)")
    prepare.add_shard_flags(ap, None, "fineweb, with --edu edu_fineweb")
    args = ap.parse_args()
    stem = ("edu_" if args.edu else "") + "fineweb"
    args.prefix = args.prefix or stem
    out = args.out or os.path.join(HERE, stem + args.version)
    val_tokens = args.shard_tokens if args.val_tokens is None else args.val_tokens
    problems = prepare.flag_problems(args)
    try:
        if args.local:
            args.local = prepare.expand_patterns(args.local)
            missing = local_problems(args.local)
            if problems:
                raise prepare.BadInput(problems + list(missing.values()))
            readable = [f for f in args.local if f not in missing]
            chunks, total, unit = local_chunks(readable), sum(os.path.getsize(f) for f in readable), "B"
            problems = list(missing.values())
        else:
            if problems or hub_problems():
                raise prepare.BadInput(problems + hub_problems())
            chunks, total, unit = hub_chunks(DATASETS[args.edu], "sample-%sT" % args.version), None, "chars"
        print(prepare.write_shards(chunks, out, args.prefix, args.shard_tokens, val_tokens, args.workers,
                                   args.encoder, args.overwrite, problems=problems, total=total, unit=unit,
                                   default_val=args.val_tokens is None))
    except prepare.BadInput as e:
        print("fineweb.py: %s" % e, file=sys.stderr)
        sys.exit(1)
    except OSError as e:  # (writing a shard: the disk full, a file-size limit, ...)
        print("fineweb.py: writing the shards in %s failed (%s), nothing written" % (out, e), file=sys.stderr)
        sys.exit(1)
    except (KeyboardInterrupt, prepare.Stopped) as e:
        print("\nfineweb.py: %s, nothing written" % ("interrupted" if isinstance(e, KeyboardInterrupt) else "stopped (SIGTERM)"),
              file=sys.stderr)
        sys.exit(130 if isinstance(e, KeyboardInterrupt) else 143)


if __name__ == "__main__":
    main()
