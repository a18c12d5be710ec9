"""
Tokenizes Tiny Shakespeare with the GPT-2 BPE into llm.c token files, and writes the GPT-2
tokenizer decode table that the trainers use to print samples.

    /usr/bin/python3 dev/data/tinyshakespeare.py [--text FILE] [--bpe DIR] [--out DIR]

Inputs (committed copies of ../shared/data): the text dev/data/tinyshakespeare/tinyshakespeare.txt
and the GPT-2 BPE files dev/data/gpt2_encoder.json, dev/data/gpt2_vocab.bpe.
Outputs:
    dev/data/tinyshakespeare/tiny_shakespeare_val.bin    the first 32768 tokens
    dev/data/tinyshakespeare/tiny_shakespeare_train.bin  the rest
    dev/data/gpt2_tokenizer.bin                          decode table (id -> bytes)

Documents: the text is cut at blank lines ("\n\n") into passages (one speaker's lines each);
every passage starts with <|endoftext|> (id 50256) and keeps its trailing "\n\n", as in llm.c's
preparation of this dataset, so the model learns that <|endoftext|> begins a passage and
sampling from <|endoftext|> starts a new one. The split is by token position: validation is the
first 32768 tokens, training the remaining ones.

The BPE is dev/data/gpt2_bpe.py's plain-Python implementation of GPT-2's byte-level BPE.
When tiktoken is installed, it is used instead (with the same local vocabulary files), and the
two must agree: the script checks that they give the same tokens.
"""
import argparse
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt2_bpe import EOT, GPT2BPE, tiktoken_encoder, write_tokens  # noqa: E402

VAL_TOKENS = 32768


def write_decode_table(path, table):
    header = [0] * 256
    header[0], header[1], header[2], header[3] = 20240328, 2, len(table), EOT
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<256i", *header))
        for b in table:
            assert len(b) < 256
            f.write(struct.pack("<B", len(b)))
            f.write(b)
    os.replace(tmp, path)


def tokenize_passages(text, encode):
    passages = text.split("\n\n")
    tokens = []
    for i, p in enumerate(passages):
        tokens.append(EOT)
        tokens.extend(encode(p + "\n\n" if i != len(passages) - 1 else p))
    return tokens


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--text", default=os.path.join(here, "tinyshakespeare", "tinyshakespeare.txt"))
    ap.add_argument("--bpe", default=here, help="folder with gpt2_encoder.json and gpt2_vocab.bpe")
    ap.add_argument("--out", default=here)
    args = ap.parse_args()

    bpe = GPT2BPE(os.path.join(args.bpe, "gpt2_encoder.json"), os.path.join(args.bpe, "gpt2_vocab.bpe"))
    with open(args.text, "r", encoding="utf-8") as f:
        text = f.read()
    tokens = tokenize_passages(text, bpe.encode)
    tk = tiktoken_encoder(bpe)
    if tk is not None:
        tk_tokens = tokenize_passages(text, tk.encode_ordinary)
        if tk_tokens != tokens:
            raise SystemExit("tiktoken and the Python BPE disagree: not writing any file")
        print("tiktoken gives the same %d tokens" % len(tokens))
    out = os.path.join(args.out, "tinyshakespeare")
    os.makedirs(out, exist_ok=True)
    write_tokens(os.path.join(out, "tiny_shakespeare_val.bin"), tokens[:VAL_TOKENS])
    write_tokens(os.path.join(out, "tiny_shakespeare_train.bin"), tokens[VAL_TOKENS:])
    write_decode_table(os.path.join(args.out, "gpt2_tokenizer.bin"), bpe.decode_table())
    print("%d tokens: %d val, %d train; decode table of %d tokens" % (len(tokens), VAL_TOKENS, len(tokens) - VAL_TOKENS, len(bpe.encoder)))


if __name__ == "__main__":
    main()
