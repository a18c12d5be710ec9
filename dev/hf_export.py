#!/usr/bin/env python3
"""
An llm.c model file (any trainer's: fp32 or bf16, any depth) as a Hugging Face GPT2LMHeadModel
directory: config.json and model.safetensors, in the file's dtype, the padded vocabulary rows
dropped, Conv1D weights transposed to (in, out), lm_head tied to wte (stored once). Needs numpy
only; the formats and the map between them are in dev/hf_gpt2.py.

    /usr/bin/python3 dev/hf_export.py out/run1/model_00000100.bin out/hf_gpt2

Then, where transformers is installed: GPT2LMHeadModel.from_pretrained("out/hf_gpt2").
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_gpt2  # noqa: E402


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
    return config, dtype


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="llm.c model file (fp32 or bf16)")
    ap.add_argument("out_dir", help="directory for config.json and model.safetensors (created)")
    args = ap.parse_args()
    try:
        config, dtype = export(args.model, args.out_dir)
    except (OSError, hf_gpt2.FormatError) as e:
        sys.exit("hf_export: %s" % e)
    print("hf_export: %s -> %s (GPT-2, L=%d NH=%d C=%d maxT=%d V=%d, %s)" % (
        args.model, args.out_dir, config["L"], config["NH"], config["C"], config["maxT"], config["V"], dtype))


if __name__ == "__main__":
    main()
