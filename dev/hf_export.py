#!/usr/bin/env python3
"""
An llm.c model file (any trainer's: fp32 or bf16, any depth) as a Hugging Face GPT2LMHeadModel
directory: config.json and model.safetensors, in the file's dtype, the padded vocabulary rows
dropped, Conv1D weights transposed to (in, out), lm_head tied to wte (stored once); and GPT-2's
tokenizer beside it (vocab.json and merges.txt: OpenAI's BPE files, dev/data/gpt2_encoder.json and
dev/data/gpt2_vocab.bpe; tokenizer_config.json; generation_config.json with <|endoftext|> = 50256
as bos and eos). Needs numpy only; the formats and the map between them are in dev/hf_gpt2.py.

    /usr/bin/python3 dev/hf_export.py out/run1/model_00000100.bin out/hf_gpt2

Then, where transformers is installed (dev/setup.sh puts it in .tools: PYTHONPATH=.tools):
GPT2LMHeadModel.from_pretrained("out/hf_gpt2") and GPT2Tokenizer.from_pretrained("out/hf_gpt2").
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_gpt2  # noqa: E402

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
# GPT-2's BPE as OpenAI released it (encoder.json, vocab.bpe) is what transformers calls vocab.json
# and merges.txt, byte for byte
TOKENIZER_FILES = [("gpt2_encoder.json", "vocab.json"), ("gpt2_vocab.bpe", "merges.txt")]


def write_tokenizer(config, out_dir):
    """GPT2Tokenizer's files; the model's vocabulary must be GPT-2's 50257 tokens"""
    if config["V"] != hf_gpt2.GPT2_EOT + 1:
        print("hf_export: the model's vocabulary is %d tokens, not GPT-2's 50257: no tokenizer written" % config["V"],
              file=sys.stderr)
        return
    for src, dst in TOKENIZER_FILES:
        with open(os.path.join(DATA, src), "rb") as f:
            hf_gpt2.write_atomically(os.path.join(out_dir, dst), [f.read()])
    eot = "<|endoftext|>"
    tokenizer = {"tokenizer_class": "GPT2Tokenizer", "model_max_length": config["maxT"], "bos_token": eot,
                 "eos_token": eot, "unk_token": eot, "add_prefix_space": False}
    generation = {"bos_token_id": hf_gpt2.GPT2_EOT, "eos_token_id": hf_gpt2.GPT2_EOT, "pad_token_id": hf_gpt2.GPT2_EOT}
    for name, fields in (("tokenizer_config.json", tokenizer), ("generation_config.json", generation)):
        hf_gpt2.write_atomically(os.path.join(out_dir, name), [(json.dumps(fields, indent=2) + "\n").encode()])


def export(model_path, out_dir):
    config, tensors, dtype = hf_gpt2.read_llmc(model_path)
    padding = tensors[0][config["V"]:]
    if padding.any():  # rows no token uses: a file whose padding is not zero would not round trip
        print("hf_export: %s: the padded vocabulary rows %d..%d are not zero; they are dropped"
              % (model_path, config["V"], config["Vp"]), file=sys.stderr)
    os.makedirs(out_dir, exist_ok=True)
    st_dtype = "F32" if dtype == "fp32" else "BF16"
    hf_gpt2.write_safetensors(os.path.join(out_dir, "model.safetensors"),
                              [(name, t, st_dtype) for name, t in hf_gpt2.llmc_to_hf(config, tensors)],
                              {"format": "pt", "source": "llm.c model file " + os.path.basename(model_path)})
    text = json.dumps(hf_gpt2.hf_config(config, dtype), indent=2) + "\n"
    hf_gpt2.write_atomically(os.path.join(out_dir, "config.json"), [text.encode()])
    write_tokenizer(config, out_dir)
    return config, dtype


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="llm.c model file (fp32 or bf16)")
    ap.add_argument("out_dir", help="directory for config.json, model.safetensors and the tokenizer's files (created)")
    args = ap.parse_args()
    try:
        config, dtype = export(args.model, args.out_dir)
    except (OSError, hf_gpt2.FormatError) as e:
        sys.exit("hf_export: %s" % e)
    print("hf_export: %s -> %s (GPT-2, L=%d NH=%d C=%d maxT=%d V=%d, %s)" % (
        args.model, args.out_dir, config["L"], config["NH"], config["C"], config["maxT"], config["V"], dtype))


if __name__ == "__main__":
    main()
