"""
GPT-2's byte-level BPE (Radford et al. 2019) in plain Python, and llm.c's token file, shared by
dev/data/tinyshakespeare.py, dev/data/prepare.py and dev/data/fineweb.py.

    bpe = GPT2BPE(os.path.join(DATA_DIR, "gpt2_encoder.json"), os.path.join(DATA_DIR, "gpt2_vocab.bpe"))
    bpe.encode("Hello world")  ->  [15496, 995]

The vocabulary files are GPT-2's (committed in dev/data). Encoding is two steps: a regular
expression cuts the text into pieces (words with their leading space, numbers, punctuation runs,
spaces), then each piece, as bytes, is merged pair by pair in the order of the merge list.
tiktoken, where installed, is a faster implementation of the same thing (tiktoken_encoder).
"""
import json
import os
import re
import struct

DATA_DIR = os.path.dirname(os.path.abspath(__file__))
EOT = 50256  # <|endoftext|>
TOKENS_MAGIC, TOKENS_VERSION = 20240520, 1  # llm.c's token file: 256 int32 header, then uint16 tokens

# GPT-2's pre-tokenizer: \p{L} letters, \p{N} numbers (the regex module; tiktoken's engine too)
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
try:
    import regex

    SPLIT = regex.compile(GPT2_PATTERN)
    EXACT_SPLIT = True
except ImportError:
    # the same classes in the re module: letters = [^\W\d_], numbers = \d, the rest is
    # neither space, letter nor number. Identical on ASCII text (Tiny Shakespeare is ASCII);
    # for other text install python3-regex.
    SPLIT = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?(?:[^\s\w]|_)+|\s+(?!\S)|\s+""")
    EXACT_SPLIT = False


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
    CACHE_LIMIT = 1 << 18  # pieces remembered (tens of MB): a large corpus has more distinct words than memory

    def __init__(self, encoder_path, merges_path):
        with open(encoder_path, "r", encoding="utf-8") as f:
            self.encoder = json.load(f)
        with open(merges_path, "r", encoding="utf-8") as f:
            lines = f.read().split("\n")
        merges = [tuple(line.split()) for line in lines[1:] if line.strip()]
        self.rank = {pair: i for i, pair in enumerate(merges)}
        self.b2u = byte_to_unicode()
        self.u2b = {u: b for b, u in self.b2u.items()}
        # bytes to GPT-2's characters at C speed: the bytes read as Latin-1 (one character a
        # byte, code point = byte), then each character replaced by its GPT-2 character
        self.latin1_to_gpt2 = {b: u for b, u in self.b2u.items()}
        self.cache = {}  # text piece -> its tokens

    def bpe(self, word):
        """merges the lowest-ranked adjacent pair until no pair of the word is in the merge list"""
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
        return [self.encoder[p] for p in parts]

    def encode(self, text):
        """the text's tokens; '<|endoftext|>' inside the text is ordinary text here"""
        ids, cache = [], self.cache
        for piece in SPLIT.findall(text):
            piece_ids = cache.get(piece)
            if piece_ids is None:
                word = piece.encode("utf-8").decode("latin-1").translate(self.latin1_to_gpt2)
                piece_ids = self.bpe(word)
                if len(cache) >= self.CACHE_LIMIT:
                    cache.clear()  # (forgetting changes the speed, never the tokens)
                cache[piece] = piece_ids
            ids.extend(piece_ids)
        return ids

    def decode_table(self):
        table = [b""] * len(self.encoder)
        for text, i in self.encoder.items():
            table[i] = text.encode("utf-8") if text == "<|endoftext|>" else bytes(self.u2b[ch] for ch in text)
        return table


def load_bpe(folder=DATA_DIR):
    return GPT2BPE(os.path.join(folder, "gpt2_encoder.json"), os.path.join(folder, "gpt2_vocab.bpe"))


def tiktoken_encoder(bpe):
    """tiktoken's GPT-2 encoding built from the same local files (no download), or None where
    tiktoken is not installed"""
    try:
        import tiktoken
    except ImportError:
        return None
    ranks = {}
    for text, i in bpe.encoder.items():
        if text != "<|endoftext|>":
            ranks[bytes(bpe.u2b[ch] for ch in text)] = i
    return tiktoken.Encoding(name="gpt2_local", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": EOT})


def tokens_header(count):
    header = [0] * 256
    header[0], header[1], header[2] = TOKENS_MAGIC, TOKENS_VERSION, count
    return struct.pack("<256i", *header)


def write_tokens(path, tokens):
    """a whole token file, under a temporary name first: an interrupted write leaves no half file"""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(tokens_header(len(tokens)))
        f.write(struct.pack("<%dH" % len(tokens), *tokens))
    os.replace(tmp, path)
