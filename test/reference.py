"""
The PyTorch reference: GPT-2 as DESIGN.md section 5 defines it, trained on one process from
fp32 initial weights (drawn from --seed, or read from an llm.c model file with --init), in
float64 by default (--dtype float32 to train in fp32).
Runs on Debian's torch 1.13 (CPU) and on torch 2.x.

    /usr/bin/python3 test/reference.py --out DIR [--layers 2 --heads 4 --channels 64 ...]

writes to DIR:
    model.bin        the initial weights (llm.c model file, fp32, version 3): the trainers load it
    model_bf16.bin   the same weights rounded to bf16 (version 5)
    grads.bin        the gradients of step 0, before clipping, in the model file layout
    final.bin        the weights after all steps
    reference.json   per-step losses, gradient norms and learning rates

Batches: step s uses the global batch tokens[s*G : s*G + G + 1] of the token file, G = B*T
(B = sequences in the global batch), read as B rows of T inputs with targets shifted by one:
the same tokens the trainers' ranks and micro-steps divide among themselves.
"""
import argparse
import sys
import copy
import json
import math
import os
import struct

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.NH = NH
        self.ln1 = nn.LayerNorm(C)
        self.qkv = nn.Linear(C, 3 * C)
        self.attproj = nn.Linear(C, C)
        self.ln2 = nn.LayerNorm(C)
        self.fc = nn.Linear(C, 4 * C)
        self.fcproj = nn.Linear(4 * C, C)

    def attention(self, x):
        B, T, C = x.shape
        hs = C // self.NH
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = [t.view(B, T, self.NH, hs).transpose(1, 2) for t in (q, k, v)]  # (B, NH, T, hs)
        scores = q @ k.transpose(-2, -1) / math.sqrt(hs)
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
        y = F.softmax(scores, dim=-1) @ v
        return self.attproj(y.transpose(1, 2).contiguous().view(B, T, C))

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, L, NH, C, maxT, V, Vp):
        super().__init__()
        self.L, self.NH, self.C, self.maxT, self.V, self.Vp = L, NH, C, maxT, V, Vp
        self.wte = nn.Parameter(torch.zeros(Vp, C))  # rows V..Vp are padding, never targets
        self.wpe = nn.Parameter(torch.zeros(maxT, C))
        self.blocks = nn.ModuleList([Block(C, NH) for _ in range(L)])
        self.lnf = nn.LayerNorm(C)

    def init_weights(self, seed):
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            self.wte[: self.V].normal_(0.0, 0.02, generator=g)
            self.wpe.normal_(0.0, 0.02, generator=g)
            for b in self.blocks:
                for lin, std in ((b.qkv, 0.02), (b.attproj, 0.02 / math.sqrt(2 * self.L)),
                                 (b.fc, 0.02), (b.fcproj, 0.02 / math.sqrt(2 * self.L))):
                    lin.weight.normal_(0.0, std, generator=g)
                    lin.bias.zero_()

    def logits(self, idx):
        B, T = idx.shape
        x = self.wte[idx] + self.wpe[:T]
        for b in self.blocks:
            x = b(x)
        return self.lnf(x) @ self.wte[: self.V].t()  # LM head tied to the token embedding

    def forward(self, idx, targets):
        return F.cross_entropy(self.logits(idx).view(-1, self.V), targets.reshape(-1))

    def file_parameters(self):
        """the parameters behind each of the model file's 16 tensors, in its order: [p] for a
        tensor of the model, [p of layer 0, p of layer 1, ...] for one stacked over the layers"""
        per_layer = [lambda b: b.ln1.weight, lambda b: b.ln1.bias, lambda b: b.qkv.weight, lambda b: b.qkv.bias,
                     lambda b: b.attproj.weight, lambda b: b.attproj.bias, lambda b: b.ln2.weight, lambda b: b.ln2.bias,
                     lambda b: b.fc.weight, lambda b: b.fc.bias, lambda b: b.fcproj.weight, lambda b: b.fcproj.bias]
        return ([[self.wte], [self.wpe]] + [[f(b) for b in self.blocks] for f in per_layer] +
                [[self.lnf.weight], [self.lnf.bias]])

    def tensors(self, grads=False):
        """the 16 tensors in model-file order, per-layer ones stacked over layers"""
        get = (lambda p: p.grad if p.grad is not None else torch.zeros_like(p)) if grads else (lambda p: p.data)
        return [torch.stack([get(p) for p in ps]) if 2 <= i <= 13 else get(ps[0])
                for i, ps in enumerate(self.file_parameters())]

    def header(self, version):
        h = [0] * 256
        h[:8] = [20240326, version, self.maxT, self.V, self.L, self.NH, self.C, self.Vp]
        return struct.pack("<256i", *h)


def write_model_file(path, model, tensors, bf16=False):
    flat = torch.cat([t.detach().reshape(-1).float() for t in tensors]).numpy()
    with open(path, "wb") as f:
        if bf16:  # round to nearest even, keep the top 16 bits
            bits = flat.view(np.uint32).astype(np.uint64)
            rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
            f.write(model.header(5))
            f.write(rounded.tobytes())
        else:
            f.write(model.header(3))
            f.write(flat.astype(np.float32).tobytes())


def read_model_file(path):
    """(header ints, fp32 parameters) of an llm.c model file, widening bf16"""
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(1024), dtype=np.int32)
        body = f.read()
    if header[1] == 5:
        return header, (np.frombuffer(body, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
    return header, np.frombuffer(body, dtype=np.float32)


def read_tokens(path):
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(1024), dtype=np.int32)
        assert header[0] == 20240520 and header[1] == 1, path
        return np.frombuffer(f.read(), dtype=np.uint16)[: header[2]].astype(np.int64)


def learning_rate(step, lr, warmup, max_steps, final_frac):
    """linear warmup, then cosine from lr to lr * final_frac at max_steps"""
    if step < warmup:
        return lr * (step + 1) / warmup
    if max_steps <= warmup:
        return lr
    progress = (step - warmup) / (max_steps - warmup)
    return lr * final_frac + (lr - lr * final_frac) * 0.5 * (1.0 + math.cos(math.pi * progress))


def load_model_file(path):
    """a GPT2 holding the weights of an llm.c model file (its header gives the shape)"""
    header, flat = read_model_file(path)
    assert header[0] == 20240326 and header[1] in (3, 5), "%s: not an llm.c model file (magic %d version %d)" % (
        path, header[0], header[1])
    maxT, V, L, NH, C, Vp = (int(x) for x in header[2:8])
    model = GPT2(L, NH, C, maxT, V, Vp)
    offset = 0
    with torch.no_grad():
        for ps in model.file_parameters():
            for p in ps:
                n = p.numel()
                assert offset + n <= len(flat), "%s: fewer weights than its header promises" % path
                p.copy_(torch.from_numpy(flat[offset: offset + n].copy()).view(p.shape))
                offset += n
    assert offset == len(flat), "%s: %d weights, its header promises %d" % (path, len(flat), offset)
    return model


def load_hf_state_dict(config, state):
    """a GPT2 holding a Hugging Face GPT2LMHeadModel: config.json's dict and the state dict
    ({name: tensor}, names with "transformer."). Read here on its own terms, apart from
    dev/hf_import.py, so that the tests check the converters against it: Conv1D weights are
    (in, out), the transpose of nn.Linear's; the vocabulary is unpadded; lm_head is wte."""
    V, L, C = config["vocab_size"], config["n_layer"], config["n_embd"]
    model = GPT2(L, config["n_head"], C, config["n_positions"], V, (V + 127) // 128 * 128)
    get = lambda name: state["transformer." + name].float()
    with torch.no_grad():
        model.wte[:V] = get("wte.weight")
        model.wpe.copy_(get("wpe.weight"))
        for i, b in enumerate(model.blocks):
            pairs = [(b.ln1, "ln_1"), (b.qkv, "attn.c_attn"), (b.attproj, "attn.c_proj"), (b.ln2, "ln_2"),
                     (b.fc, "mlp.c_fc"), (b.fcproj, "mlp.c_proj")]
            for module, name in pairs:
                weight = get("h.%d.%s.weight" % (i, name))
                module.weight.copy_(weight.t() if isinstance(module, nn.Linear) else weight)
                module.bias.copy_(get("h.%d.%s.bias" % (i, name)))
        model.lnf.weight.copy_(get("ln_f.weight"))
        model.lnf.bias.copy_(get("ln_f.bias"))
    return model


def padded_vocab(V):
    """the vocabulary padded to a multiple of 128, as the trainers' model files hold it"""
    return (V + 127) // 128 * 128


def gpt2_of_args(args):
    """a GPT-2 of the run's shape; its vocabulary GPT-2's 50257 unless args.vocab says another"""
    V = getattr(args, "vocab", 50257)
    if V < 1:
        sys.exit("error: --vocab %d: expected a vocabulary of at least 1 token" % V)
    return GPT2(args.layers, args.heads, args.channels, args.max_seq_len, V, padded_vocab(V))


def tokens_for(model, path):
    """the run's tokens, each below the model's vocabulary (else a clear error, not an IndexError
    deep in the forward)"""
    tokens = read_tokens(path)
    outside = np.flatnonzero(tokens >= model.V)
    if len(outside):
        sys.exit("error: --tokens %s: token %d at position %d is outside the model's vocabulary of %d (--vocab, or "
                 "the --init file's)" % (path, tokens[outside[0]], outside[0], model.V))
    return tokens


def run(args):
    torch.manual_seed(args.seed)
    if getattr(args, "init", None):
        model = load_model_file(args.init)
    else:
        model = gpt2_of_args(args)
        model.init_weights(args.seed)
    tokens = tokens_for(model, args.tokens)  # (before anything is written)
    os.makedirs(args.out, exist_ok=True)
    write_model_file(os.path.join(args.out, "model.bin"), model, model.tensors())
    write_model_file(os.path.join(args.out, "model_bf16.bin"), model, model.tensors(), bf16=True)
    # the fp32 weights, trained in float64 by default: the exact arithmetic that an fp32 trainer
    # approximates, so the tolerances of a comparison measure only the trainer's own rounding
    if args.dtype == "float64":
        model = model.double()

    # AdamW with decoupled weight decay on the 2-D weights only
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    B, T = args.batch, args.seq_len
    G = B * T
    losses, norms, lrs = [], [], []
    for step in range(args.steps):
        chunk = torch.from_numpy(tokens[step * G: step * G + G + 1])
        x, y = chunk[:-1].view(B, T), chunk[1:].view(B, T)
        loss = model(x, y)
        loss.backward()
        if step == 0:
            write_model_file(os.path.join(args.out, "grads.bin"), model, model.tensors(grads=True))
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        lr = learning_rate(step, args.lr, args.warmup, args.steps, args.final_lr_frac)
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        norms.append(float(norm))
        lrs.append(lr)
    write_model_file(os.path.join(args.out, "final.bin"), model, model.tensors())
    with open(os.path.join(args.out, "reference.json"), "w") as f:
        json.dump({"losses": losses, "grad_norms": norms, "lrs": lrs}, f, indent=1)
    return losses, norms


def run_diloco(args):
    """DiLoCo (Douillard et al. 2023, arXiv:2311.08105, Algorithm 1), written from the paper, not
    from the trainer: args.workers copies of the model from the same initial weights, each with its
    own AdamW (the inner optimizer, the reference's settings), each training on its share of every
    global batch; after every args.H steps, and after the last, the outer step: the outer gradient
    is the mean over the workers of (theta_outer - theta_w), the outer optimizer torch's SGD with
    Nesterov momentum (args.outer_lr, args.outer_momentum), and every worker continues from the new
    theta_outer. A worker's share: the batch's B sequences are ranks x micro-batches chunks of B /
    (ranks m) sequences, chunk i ranks + r read by rank r (the DDP trainer's split), and worker w
    holds ranks w R .. w R + R - 1 (args.ranks, args.micro). Writes final.bin (theta_outer),
    momentum.bin (the outer momentum, a model file), reference.json (per step: the workers' mean
    loss and mean gradient norm). args.dtype: float64 (the default, as run's) or float32.
    Streaming DiLoCo (Douillard et al. 2025, arXiv:2501.18512), args.fragments F: the layers in F
    groups of L/F consecutive blocks (wte and wpe with the first, the final LayerNorm with the
    last), each with its own outer optimizer, group f stepping after the steps s with
    (s - f H/F) % H == 0 (s >= 1), and every group after the last step. args.outer_dtype "bf16":
    the outer gradient crosses the link in bf16 as Streaming DiLoCo sends it in low precision:
    each worker's theta_outer - theta_w rounded to bf16 (nearest, ties to even), their mean taken
    in the reference's dtype and rounded to bf16 again (the average's way back to the workers)."""
    torch.manual_seed(args.seed)
    model = load_model_file(args.init) if getattr(args, "init", None) else None
    if model is None:
        model = gpt2_of_args(args)
        model.init_weights(args.seed)
    model = model.float() if getattr(args, "dtype", "float64") == "float32" else model.double()
    W, H, ranks, m = args.workers, args.H, args.ranks, args.micro
    R, per = ranks // W, args.batch // (ranks * m)
    copies = [copy.deepcopy(model) for _ in range(W)]
    opts = []
    for c in copies:
        decay = [p for p in c.parameters() if p.dim() == 2]
        no_decay = [p for p in c.parameters() if p.dim() < 2]
        opts.append(torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                                       {"params": no_decay, "weight_decay": 0.0}],
                                      lr=args.lr, betas=(0.9, 0.95), eps=1e-8))
    F = getattr(args, "fragments", 1)
    outer = copy.deepcopy(model)  # theta_outer, and an outer optimizer on each fragment of it

    def fragment(name):
        if name.startswith("blocks."):  # block l: fragment l // (L / F)
            return int(name.split(".")[1]) * F // model.L
        return 0 if name in ("wte", "wpe") else F - 1
    groups = [[i for i, (n, _) in enumerate(outer.named_parameters()) if fragment(n) == f] for f in range(F)]

    def link(x):  # what crosses the link between workers
        return x.to(torch.bfloat16).to(x.dtype) if getattr(args, "outer_dtype", "fp32") == "bf16" else x
    params = list(outer.parameters())
    outer_opts = [torch.optim.SGD([params[i] for i in g], lr=args.outer_lr, momentum=args.outer_momentum,
                                  nesterov=args.outer_momentum > 0) for g in groups]
    tokens = tokens_for(model, args.tokens)
    B, T = args.batch, args.seq_len
    G = B * T
    losses, norms = [], []
    for step in range(args.steps):
        chunk = torch.from_numpy(tokens[step * G: step * G + G + 1])
        x, y = chunk[:-1].view(B, T), chunk[1:].view(B, T)
        lr = learning_rate(step, args.lr, args.warmup, args.steps, args.final_lr_frac)
        step_losses, step_norms = [], []
        for w, (c, opt) in enumerate(zip(copies, opts)):
            rows = [(i * ranks + r) * per + j for i in range(m) for r in range(w * R, (w + 1) * R) for j in range(per)]
            loss = c(x[rows], y[rows])
            loss.backward()
            step_norms.append(float(torch.nn.utils.clip_grad_norm_(c.parameters(), args.grad_clip)))
            for group in opt.param_groups:
                group["lr"] = lr
            opt.step()
            opt.zero_grad(set_to_none=True)
            step_losses.append(loss.item())
        losses.append(sum(step_losses) / W)
        norms.append(sum(step_norms) / W)
        s = step + 1
        for f in range(F):
            if not (s == args.steps or (s >= f * H // F and (s - f * H // F) % H == 0)):
                continue
            workers_params = [list(c.parameters()) for c in copies]
            with torch.no_grad():
                for i in groups[f]:
                    params[i].grad = link(sum(link(params[i] - wp[i]) for wp in workers_params) / W)
            outer_opts[f].step()
            with torch.no_grad():
                for i in groups[f]:
                    for wp in workers_params:
                        wp[i].copy_(params[i])
    os.makedirs(args.out, exist_ok=True)
    write_model_file(os.path.join(args.out, "final.bin"), outer, outer.tensors())
    states = {}
    for opt in outer_opts:
        states.update(opt.state)
    for p in outer.parameters():  # the momentum buffers, in the model file's layout (none: zeros)
        buf = states[p].get("momentum_buffer") if p in states else None
        p.grad = buf if buf is not None else torch.zeros_like(p)
    write_model_file(os.path.join(args.out, "momentum.bin"), outer, outer.tensors(grads=True))
    with open(os.path.join(args.out, "reference.json"), "w") as f:
        json.dump({"losses": losses, "grad_norms": norms}, f, indent=1)
    return losses, norms


def add_run_arguments(ap, layers=2):
    """the flags that define a reference run (also dev/compare_with_pytorch.py's)"""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--tokens", default=os.path.join(root, "dev/data/tinyshakespeare/tiny_shakespeare_train.bin"))
    ap.add_argument("--init", help="initial weights from this llm.c model file (its shape overrides --layers ...)")
    ap.add_argument("--vocab", type=int, default=50257, help="the vocabulary (GPT-2's by default): --tokens must lie below it")
    ap.add_argument("--layers", type=int, default=layers)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--channels", type=int, default=64)
    ap.add_argument("--max-seq-len", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8, help="sequences in the global batch")
    ap.add_argument("--seq-len", type=int, default=32)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--final-lr-frac", type=float, default=0.1)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=42)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    add_run_arguments(ap)
    ap.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    args = ap.parse_args()
    losses, norms = run(args)
    for i, (l, n) in enumerate(zip(losses, norms)):
        print("step %d loss %.6f grad norm %.4f" % (i + 1, l, n))


if __name__ == "__main__":
    main()
