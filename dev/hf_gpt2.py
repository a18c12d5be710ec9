"""
The two files a GPT-2 lives in, and the map between them (dev/hf_export.py, dev/hf_import.py):

  llm.c model file   256 x int32 header ([0] 20240326, [1] 3 fp32 or 5 bf16, [2] maxT, [3] V,
                     [4] L, [5] NH, [6] C, [7] Vp; this project adds [8] "3CRC" and [9] a CRC-32),
                     then 16 tensors, each stacked over the layers, the vocabulary padded to Vp
  Hugging Face       a directory: config.json (GPT2Config) and model.safetensors (GPT2LMHeadModel's
                     state dict), the vocabulary unpadded, lm_head tied to wte

Three things differ besides the names. Hugging Face's GPT-2 keeps its linear layers as Conv1D,
whose weight is (in, out): the transpose of llm.c's (out, in). Its vocabulary is the real V rows;
llm.c pads wte to Vp (a multiple of 128) with rows no token uses, zero in every file this
project writes. And its LM head is the embedding itself (tie_word_embeddings), so the file holds
wte once, as llm.c does.

safetensors (https://huggingface.co/docs/safetensors) is read and written here with numpy alone:
8 bytes of little-endian header length, a JSON header naming each tensor's dtype, shape and byte
range, then the raw little-endian data. bf16 has no numpy type, so it stays uint16 bits.
"""
import json
import os
import struct
import zlib

import numpy as np

MAGIC, VERSION_FP32, VERSION_BF16 = 20240326, 3, 5
CHECKSUM_TAG = 0x43524333  # header[8]: header[9] is the CRC-32 of header[0..8] and the parameters
GPT2_EOT = 50256

# the 12 per-layer tensors in the llm.c file's order: (Hugging Face name in block i, transposed)
LAYER_TENSORS = [("ln_1.weight", False), ("ln_1.bias", False), ("attn.c_attn.weight", True), ("attn.c_attn.bias", False),
                 ("attn.c_proj.weight", True), ("attn.c_proj.bias", False), ("ln_2.weight", False), ("ln_2.bias", False),
                 ("mlp.c_fc.weight", True), ("mlp.c_fc.bias", False), ("mlp.c_proj.weight", True), ("mlp.c_proj.bias", False)]


class FormatError(Exception):
    """a file that is not what it claims to be; the message names the file and what was expected"""


# ---------------------------------------------------------------------------------------------
# llm.c model files. Parameters stay in the file's dtype: float32, or bf16 as uint16 bits


def shapes(maxT, V, Vp, L, NH, C):
    """the 16 tensors' shapes in file order"""
    per_layer = [(L, C), (L, C), (L, 3 * C, C), (L, 3 * C), (L, C, C), (L, C), (L, C), (L, C),
                 (L, 4 * C, C), (L, 4 * C), (L, C, 4 * C), (L, C)]
    return [(Vp, C), (maxT, C)] + per_layer + [(C,), (C,)]


def read_llmc(path):
    """(config dict, [16 arrays], dtype 'fp32' or 'bf16') of an llm.c model file"""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 1024:
        raise FormatError("%s: %d bytes, shorter than the 1024-byte header of an llm.c model file" % (path, len(raw)))
    header = np.frombuffer(raw[:1024], dtype="<i4")
    if header[0] != MAGIC or header[1] not in (VERSION_FP32, VERSION_BF16):
        raise FormatError("%s: not an llm.c model file (magic %d, version %d; expected %d and 3 or 5)"
                          % (path, header[0], header[1], MAGIC))
    maxT, V, L, NH, C, Vp = (int(x) for x in header[2:8])
    if header[10] > 1:  # E experts and top-k (train_gpt2_ep): no GPT2LMHeadModel holds them
        raise FormatError("%s: a Mixture-of-Experts model (E=%d experts, top-k %d): Hugging Face's GPT-2 has one MLP "
                          "a layer, so it cannot be converted" % (path, header[10], header[11]))
    dtype = "fp32" if header[1] == VERSION_FP32 else "bf16"
    elem = np.dtype("<f4") if dtype == "fp32" else np.dtype("<u2")
    tensor_shapes = shapes(maxT, V, Vp, L, NH, C)
    count = sum(int(np.prod(s)) for s in tensor_shapes)
    if len(raw) != 1024 + count * elem.itemsize:
        raise FormatError("%s: %d bytes of parameters, expected %d for L=%d C=%d Vp=%d maxT=%d in %s"
                          % (path, len(raw) - 1024, count * elem.itemsize, L, C, Vp, maxT, dtype))
    if header[8] == CHECKSUM_TAG and checksum(header, raw[1024:]) != np.uint32(header[9]):
        raise FormatError("%s: the CRC-32 of its contents differs from the header's (a flipped byte or a torn copy)" % path)
    flat = np.frombuffer(raw, dtype=elem, offset=1024)
    tensors, at = [], 0
    for s in tensor_shapes:
        n = int(np.prod(s))
        tensors.append(flat[at:at + n].reshape(s))
        at += n
    return dict(maxT=maxT, V=V, L=L, NH=NH, C=C, Vp=Vp), tensors, dtype


def checksum(header, body):
    """this project's CRC-32: zlib's over header[0..8], then over the parameters"""
    return zlib.crc32(body, zlib.crc32(np.asarray(header[:9], dtype="<i4").tobytes())) & 0xFFFFFFFF


def write_llmc(path, config, tensors, dtype):
    """an llm.c model file with this project's checksum, written to a temporary name and renamed"""
    header = np.zeros(256, dtype="<i4")
    header[:9] = [MAGIC, VERSION_FP32 if dtype == "fp32" else VERSION_BF16, config["maxT"], config["V"], config["L"],
                  config["NH"], config["C"], config["Vp"], CHECKSUM_TAG]
    body = b"".join(np.ascontiguousarray(t).tobytes() for t in tensors)
    header[9] = np.array([checksum(header, body)], dtype="<u4").view("<i4")[0]
    write_atomically(path, [header.tobytes(), body])


def write_atomically(path, pieces):
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        for piece in pieces:
            f.write(piece)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------
# safetensors

DTYPES = {"F32": np.dtype("<f4"), "BF16": np.dtype("<u2"), "F16": np.dtype("<f2")}


def read_safetensors(path):
    """{name: array} of a safetensors file: F32 as float32, BF16 as uint16 bits, F16 as float16"""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise FormatError("%s: %d bytes, too short for a safetensors file" % (path, len(raw)))
    (n,) = struct.unpack("<Q", raw[:8])
    try:
        header = json.loads(raw[8:8 + n])
    except ValueError as e:
        raise FormatError("%s: its header is not JSON (%s): not a safetensors file?" % (path, e))
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in DTYPES:
            raise FormatError("%s: tensor %s is %s; this converter reads %s" % (path, name, info["dtype"], ", ".join(DTYPES)))
        begin, end = info["data_offsets"]
        data = raw[8 + n + begin:8 + n + end]
        dtype = DTYPES[info["dtype"]]
        if len(data) != int(np.prod(info["shape"])) * dtype.itemsize:
            raise FormatError("%s: tensor %s holds %d bytes, its shape %s needs %d"
                              % (path, name, len(data), info["shape"], int(np.prod(info["shape"])) * dtype.itemsize))
        tensors[name] = (np.frombuffer(data, dtype=dtype).reshape(info["shape"]), info["dtype"])
    return tensors


def write_safetensors(path, tensors, metadata):
    """tensors: [(name, array, 'F32' or 'BF16')], in the order they are stored"""
    header, offset = {"__metadata__": metadata}, 0
    for name, array, dtype in tensors:
        header[name] = {"dtype": dtype, "shape": list(array.shape), "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    write_atomically(path, [struct.pack("<Q", len(text)), text] + [np.ascontiguousarray(a).tobytes() for _, a, _ in tensors])


# ---------------------------------------------------------------------------------------------
# the map


def hf_config(config, dtype):
    """GPT2Config of transformers, as config.json"""
    return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": config["V"],
            "n_positions": config["maxT"], "n_ctx": config["maxT"], "n_embd": config["C"], "n_layer": config["L"],
            "n_head": config["NH"], "n_inner": None, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
            "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "initializer_range": 0.02,
            "bos_token_id": GPT2_EOT, "eos_token_id": GPT2_EOT, "tie_word_embeddings": True,
            "torch_dtype": "float32" if dtype == "fp32" else "bfloat16"}


def llmc_to_hf(config, tensors):
    """[(Hugging Face name, array)] of an llm.c model's 16 tensors"""
    V, L = config["V"], config["L"]
    out = [("transformer.wte.weight", tensors[0][:V]), ("transformer.wpe.weight", tensors[1])]
    for i in range(L):
        for (name, transposed), stacked in zip(LAYER_TENSORS, tensors[2:14]):
            t = stacked[i]
            out.append(("transformer.h.%d.%s" % (i, name), t.T if transposed else t))
    return out + [("transformer.ln_f.weight", tensors[14]), ("transformer.ln_f.bias", tensors[15])]


def hf_to_llmc(config, get):
    """the 16 tensors of an llm.c model from get(Hugging Face name, expected shape)"""
    V, Vp, L, C, maxT = config["V"], config["Vp"], config["L"], config["C"], config["maxT"]
    wte = get("transformer.wte.weight", (V, C))
    padded = np.zeros((Vp, C), dtype=wte.dtype)  # rows V..Vp: no token uses them
    padded[:V] = wte
    expected = shapes(maxT, V, Vp, L, config["NH"], C)
    layers = []
    for (name, transposed), shape in zip(LAYER_TENSORS, expected[2:14]):
        per_layer = shape[1:]
        hf_shape = per_layer[::-1] if transposed else per_layer
        blocks = [get("transformer.h.%d.%s" % (i, name), hf_shape) for i in range(L)]
        layers.append(np.stack([b.T if transposed else b for b in blocks]))
    return ([padded, get("transformer.wpe.weight", (maxT, C))] + layers
            + [get("transformer.ln_f.weight", (C,)), get("transformer.ln_f.bias", (C,))])
