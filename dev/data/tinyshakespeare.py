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

The BPE here is a plain-Python implementation of GPT-2's byte-level BPE (Radford et al. 2019).
When tiktoken is installed, it is used instead (with the same local vocabulary files), and the
two must agree: the script checks that they give the same tokens.
"""
import argparse
import json
import os
import re
import struct

EOT = 50256
VAL_TOKENS = 32768

try:
    import regex  # supports \p{L}, \p{N}: GPT-2's exact pre-tokenizer

    SPLIT = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")
except ImportError:
    # the same classes in the re module: letters = [^\W\d_], numbers = \d, the rest is
    # neither space, letter nor number. Identical on ASCII text (Tiny Shakespeare is ASCII);
    # for other text install python3-regex.
    SPLIT = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?(?:[^\s\w]|_)+|\s+(?!\S)|\s+""")


def byte_to_unicode():
    """GPT-2 maps each byte to a printable unicode character so that merges work on strings:
    printable Latin-1 bytes map to themselves, the other 68 bytes to code points from 256 up."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table = {}
    extra = 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


class GPT2BPE:
    def __init__(self, encoder_path, merges_path):
        with open(encoder_path, "r", encoding="utf-8") as f:
            self.encoder = json.load(f)
        with open(merges_path, "r", encoding="utf-8") as f:
            lines = f.read().split("\n")
        merges = [tuple(line.split()) for line in lines[1:] if line.strip()]
        self.rank = {pair: i for i, pair in enumerate(merges)}
        self.b2u = byte_to_unicode()
        self.u2b = {u: b for b, u in self.b2u.items()}
        self.cache = {}

    def bpe(self, word):
        """merges the lowest-ranked adjacent pair until no pair of the word is in the merge list"""
        if word in self.cache:
            return self.cache[word]
        parts = list(word)
        while len(parts) > 1:
            best = None
            for i in range(len(parts) - 1):
                r = self.rank.get((parts[i], parts[i + 1]))
                if r is not None and (best is None or r < best[0]):
                    best = (r, i)
            if best is None:
                break
            a, b = parts[best[1]], parts[best[1] + 1]
            merged, i = [], 0
            while i < len(parts):
                if i < len(parts) - 1 and parts[i] == a and parts[i + 1] == b:
                    merged.append(a + b)
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            parts = merged
        ids = [self.encoder[p] for p in parts]
        self.cache[word] = ids
        return ids

    def encode(self, text):
        ids = []
        for piece in SPLIT.findall(text):
            word = "".join(self.b2u[b] for b in piece.encode("utf-8"))
            ids.extend(self.bpe(word))
        return ids

    def decode_table(self):
        table = [b""] * len(self.encoder)
        for text, i in self.encoder.items():
            table[i] = text.encode("utf-8") if text == "<|endoftext|>" else bytes(self.u2b[ch] for ch in text)
        return table


def tiktoken_encoder(bpe):
    """tiktoken's GPT-2 encoding built from the same local files (no download)"""
    try:
        import tiktoken
    except ImportError:
        return None
    ranks = {}
    for text, i in bpe.encoder.items():
        if text != "<|endoftext|>":
            ranks[bytes(bpe.u2b[ch] for ch in text)] = i
    return tiktoken.Encoding(name="gpt2_local", pat_str=SPLIT.pattern, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": EOT})


def write_tokens(path, tokens):
    header = [0] * 256
    header[0], header[1], header[2] = 20240520, 1, len(tokens)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack("<%dH" % len(tokens), *tokens))
    os.replace(tmp, path)


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
