#!/usr/bin/env python3
"""
A Hugging Face GPT-2 directory (config.json and model.safetensors, e.g. a local copy of the
released GPT-2 124M, or dev/hf_export.py's output) as an llm.c model file that every trainer
starts from with -e: the vocabulary padded to a multiple of 128 with zero rows, Conv1D weights
transposed back to (out, in), wte stored once (a separate lm_head.weight must equal it). Names
with or without the "transformer." prefix are read; the attention mask buffers are skipped.
Needs numpy only; the formats are in dev/hf_gpt2.py.

    /usr/bin/python3 dev/hf_import.py out/gpt2 out/gpt2_124M.bin
    ./train_gpt2_dp -e out/gpt2_124M.bin ...

OpenAI's GPT-2 124M is on the Hugging Face hub as openai-community/gpt2; its two files this script
reads (548 MB) come with the hub's client, which dev/setup.sh installs into .tools:

    PYTHONPATH=.tools .tools/bin/huggingface-cli download openai-community/gpt2 config.json model.safetensors --local-dir out/gpt2

(gpt2-medium, gpt2-large and gpt2-xl likewise: openai-community/gpt2-medium, ...)
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_gpt2  # noqa: E402


def read_config(path):
    try:
        with open(path) as f:
            cfg = json.load(f)
    except ValueError as e:
        raise hf_gpt2.FormatError("%s: not JSON (%s)" % (path, e))
    if cfg.get("model_type") != "gpt2":
        raise hf_gpt2.FormatError("%s: model_type %r; this converter reads GPT-2 (model_type \"gpt2\")"
                                  % (path, cfg.get("model_type")))
    for key in ("vocab_size", "n_positions", "n_layer", "n_head", "n_embd"):
        if not isinstance(cfg.get(key), int) or cfg[key] <= 0:
            raise hf_gpt2.FormatError("%s: %s is %r, expected a positive integer" % (path, key, cfg.get(key)))
    if cfg.get("activation_function", "gelu_new") != "gelu_new" or cfg.get("n_inner") not in (None, 4 * cfg["n_embd"]):
        raise hf_gpt2.FormatError("%s: activation %s, n_inner %s: the trainers run GPT-2's tanh GELU (gelu_new) and a 4C MLP"
                                  % (path, cfg.get("activation_function"), cfg.get("n_inner")))
    if cfg["n_embd"] % cfg["n_head"] != 0:
        raise hf_gpt2.FormatError("%s: n_embd %d is not divisible by n_head %d" % (path, cfg["n_embd"], cfg["n_head"]))
    V = cfg["vocab_size"]
    return dict(maxT=cfg["n_positions"], V=V, L=cfg["n_layer"], NH=cfg["n_head"], C=cfg["n_embd"],
                Vp=(V + 127) // 128 * 128)


def convert(hf_dir, out_path, dtype=None):
    config = read_config(os.path.join(hf_dir, "config.json"))
    st_path = os.path.join(hf_dir, "model.safetensors")
    stored = hf_gpt2.read_safetensors(st_path)
    # the hub's checkpoint names blocks "h.0..."; GPT2LMHeadModel's state dict "transformer.h.0..."
    tensors = {(name if name.startswith("transformer.") or name.startswith("lm_head.") else "transformer." + name): t
               for name, t in stored.items()}
    kinds = {kind for _, kind in tensors.values()}
    dtype = dtype or ("bf16" if kinds == {"BF16"} else "fp32")

    def get(name, shape):
        if name not in tensors:
            raise hf_gpt2.FormatError("%s: no tensor %s (nor %s)" % (st_path, name, name[len("transformer."):]))
        array, kind = tensors[name]
        if tuple(array.shape) != tuple(shape):
            raise hf_gpt2.FormatError("%s: %s has shape %s, expected %s for %s" % (st_path, name, list(array.shape),
                                                                                    list(shape), config))
        return convert_dtype(array, kind, dtype)

    out = hf_gpt2.hf_to_llmc(config, get)
    if "lm_head.weight" in tensors:  # saved untied: it must be wte, as GPT-2's head is
        lm_head = get("lm_head.weight", (config["V"], config["C"]))
        if not np.array_equal(lm_head, out[0][:config["V"]]):
            raise hf_gpt2.FormatError("%s: lm_head.weight differs from wte; GPT-2 ties them, and so do the trainers" % st_path)
    hf_gpt2.write_llmc(out_path, config, out, dtype)
    return config, dtype


def convert_dtype(array, kind, dtype):
    """an array of safetensors dtype `kind` as the file's: fp32 (float32) or bf16 (uint16 bits,
    rounded to nearest even from wider types)"""
    if kind == "BF16":
        return array if dtype == "bf16" else (array.astype(np.uint32) << 16).view(np.float32)
    wide = array.astype(np.float32)
    if dtype == "fp32":
        return wide
    bits = wide.view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("hf_dir", help="directory with config.json and model.safetensors")
    ap.add_argument("out", help="llm.c model file to write")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], help="the file's precision (default: bf16 if every "
                    "tensor is bf16, else fp32)")
    args = ap.parse_args()
    try:
        config, dtype = convert(args.hf_dir, args.out, args.dtype)
    except (OSError, hf_gpt2.FormatError) as e:
        sys.exit("hf_import: %s" % e)
    print("hf_import: %s -> %s (GPT-2, L=%d NH=%d C=%d maxT=%d V=%d padded to %d, %s)" % (
        args.hf_dir, args.out, config["L"], config["NH"], config["C"], config["maxT"], config["V"], config["Vp"], dtype))


if __name__ == "__main__":
    main()
