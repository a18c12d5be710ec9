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
    final_m.bin      AdamW's first moments after all steps (the gradients' running mean)
    reference.json   per-step losses, gradient norms and learning rates

Batches: step s uses the global batch tokens[s*G : s*G + G + 1] of the token file, G = B*T
(B = sequences in the global batch), read as B rows of T inputs with targets shifted by one:
the same tokens the trainers' ranks and micro-steps divide among themselves.

Mixture of experts (--experts E > 1, --topk k): each layer's MLP becomes E expert MLPs of its
shape and a router Wr (E, C) without bias. On the ln2 output h a token's logits are s = h Wr^T;
it goes to the k experts of largest s + b (b: the layer's balancing bias, state, not a weight;
ties to the lower expert), gated by the softmax of s over those k, its output the gated sum of
their MLPs. --capacity-factor cf > 0: in each group of --capacity-tokens N consecutive tokens
of the flattened batch an expert takes at most ceil(cf N k / E) slots, all 1st choices (in token
order) before all 2nd choices ...; a slot past that is dropped (contributes nothing, gates are
not renormalized). --balance aux: the loss is CE + the Switch Transformer loss, alpha E sum_e
f_e P_e per sequence (f_e: the share of its T k slots routed to e before drops, P_e: its mean
softmax of s over all E), averaged over the sequences, summed over the layers; --balance bias
(DeepSeek-V3): after each step b_e += rate sign(mean load - load_e), load_e counted over the
global batch before drops. The model file holds E and k at header[10], header[11] and the MoE
tensors routerw (L, E, C), fcw (L, E, 4C, C), fcb (L, E, 4C), fcprojw (L, E, C, 4C), fcprojb
(L, E, C) in place of the MLP's; reference.json adds the routing's statistics (see run).
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


class Expert(nn.Module):
    """one expert of an MoE layer: the dense block's MLP"""
    def __init__(self, C):
        super().__init__()
        self.fc = nn.Linear(C, 4 * C)
        self.fcproj = nn.Linear(4 * C, C)

    def forward(self, h):
        return self.fcproj(F.gelu(self.fc(h), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, C, NH, E=0, k=0):
        super().__init__()
        self.NH, self.E, self.k = NH, E, k
        self.ln1 = nn.LayerNorm(C)
        self.qkv = nn.Linear(C, 3 * C)
        self.attproj = nn.Linear(C, C)
        self.ln2 = nn.LayerNorm(C)
        if E:  # MoE: a router and E experts in place of the MLP
            self.router = nn.Linear(C, E, bias=False)
            self.experts = nn.ModuleList([Expert(C) for _ in range(E)])
            self.register_buffer("balance_bias", torch.zeros(E))  # b: moves by -balance bias, not by gradients
            self.capacity_factor, self.capacity_tokens = 0.0, 0  # 0: dropless; 0: one group, the whole batch
            self.routing = None  # the last forward's aux term and statistics
        else:
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

    def kept_slots(self, top):
        """which slots of top (tokens, k) their experts' capacity takes: in each group of
        capacity_tokens consecutive tokens, ceil(cf N k / E) slots an expert, filled by the
        group's 1st choices in token order, then its 2nd choices, ..."""
        if not self.capacity_factor:
            return torch.ones_like(top, dtype=torch.bool)
        N = self.capacity_tokens or len(top)
        capacity = math.ceil(self.capacity_factor * N * self.k / self.E)
        arrivals = top.view(-1, N, self.k).transpose(1, 2).reshape(-1, self.k * N)  # (groups, slots in order)
        hot = F.one_hot(arrivals, self.E)
        place = (hot.cumsum(1) * hot).sum(2) - 1  # the slot's place in its expert's queue
        return (place < capacity).view(-1, self.k, N).transpose(1, 2).reshape(-1, self.k)

    def moe(self, h):
        B, T, C = h.shape
        E, k = self.E, self.k
        h = h.reshape(B * T, C)
        s = self.router(h)  # (tokens, E)
        # a stable sort: equal s + b go to the lower expert, so that the top-k is one set
        ranked = torch.sort(-(s + self.balance_bias), dim=1, stable=True)
        top = ranked.indices[:, :k]  # (tokens, k), the 1st choice first
        gates = F.softmax(s.gather(1, top), dim=1)  # over the chosen, of s without b
        kept = self.kept_slots(top)
        out = torch.zeros_like(h)
        for e, expert in enumerate(self.experts):  # (an expert no slot reaches still runs: its gradient is 0, not None)
            token, slot = torch.nonzero((top == e) & kept, as_tuple=True)
            out = out.index_add(0, token, gates[token, slot].unsqueeze(1) * expert(h[token]))
        # Switch Transformer's balance per sequence: f from the routing (no gradient), P from the softmax
        routed = F.one_hot(top, E).view(B, T * k, E).sum(1)  # slots to each expert, before drops
        f = routed.to(s.dtype) / (T * k)
        P = F.softmax(s, dim=1).view(B, T, E).mean(1)
        # how near a tie the routing came: the k-th against the (k+1)-th score decides which experts;
        # with a capacity the order among the top k decides whose slot queues first, so then every
        # adjacent pair of the top k+1 counts
        first = 0 if self.capacity_factor > 0 else k - 1
        last = min(k, E - 1)
        gaps = ranked.values[:, first + 1:last + 1] - ranked.values[:, first:last]
        margin = gaps.min() if gaps.numel() else torch.tensor(math.inf)
        self.routing = dict(aux=E * (f * P).sum(1).mean(), load=routed.sum(0).tolist(),
                            dropped=int((~kept).sum()), margin=float(margin.min()),
                            route=torch.where(kept, top, torch.full_like(top, -1)).reshape(-1).tolist())
        return out.view(B, T, C)

    def update_balance_bias(self, rate):
        """DeepSeek-V3's auxiliary-loss-free balancing: b_e += rate sign(mean load - load_e)"""
        load = torch.tensor(self.routing["load"], dtype=self.balance_bias.dtype)
        self.balance_bias += rate * torch.sign(load.mean() - load)

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        if self.E:
            return x + self.moe(self.ln2(x))
        return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, L, NH, C, maxT, V, Vp, E=0, k=1):
        super().__init__()
        self.L, self.NH, self.C, self.maxT, self.V, self.Vp = L, NH, C, maxT, V, Vp
        self.E, self.k = (E, k) if E > 1 else (0, 0)  # E <= 1: the dense GPT-2
        assert not self.E or 1 <= k <= E, "top-%d of %d experts" % (k, E)
        self.wte = nn.Parameter(torch.zeros(Vp, C))  # rows V..Vp are padding, never targets
        self.wpe = nn.Parameter(torch.zeros(maxT, C))
        self.blocks = nn.ModuleList([Block(C, NH, self.E, self.k) for _ in range(L)])
        self.lnf = nn.LayerNorm(C)

    def init_weights(self, seed, router_std=0.02):
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            self.wte[: self.V].normal_(0.0, 0.02, generator=g)
            self.wpe.normal_(0.0, 0.02, generator=g)
            proj = 0.02 / math.sqrt(2 * self.L)
            for b in self.blocks:  # (a dense model's draws: qkv, attproj, fc, fcproj, as they always were)
                linears = [(b.qkv, 0.02), (b.attproj, proj)] + ([(b.router, router_std)] if self.E else [])
                for m in (b.experts if self.E else [b]):
                    linears += [(m.fc, 0.02), (m.fcproj, proj)]
                for lin, std in linears:
                    lin.weight.normal_(0.0, std, generator=g)
                    if lin.bias is not None:
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
        """the parameters behind each of the model file's tensors (16, an MoE's 17), in its order:
        [p] for a tensor of the model, [p of layer 0, p of layer 1, ...] for one stacked over the
        layers, [layer 0's p of expert 0, of expert 1, ..., layer 1's ...] for an expert tensor"""
        mlp = [lambda m: m.fc.weight, lambda m: m.fc.bias, lambda m: m.fcproj.weight, lambda m: m.fcproj.bias]
        per_layer = [lambda b: [b.ln1.weight], lambda b: [b.ln1.bias], lambda b: [b.qkv.weight], lambda b: [b.qkv.bias],
                     lambda b: [b.attproj.weight], lambda b: [b.attproj.bias], lambda b: [b.ln2.weight],
                     lambda b: [b.ln2.bias]]
        if self.E:
            per_layer += [lambda b: [b.router.weight]] + [lambda b, f=f: [f(m) for m in b.experts] for f in mlp]
        else:
            per_layer += [lambda b, f=f: [f(b)] for f in mlp]
        return ([[self.wte], [self.wpe]] + [[p for b in self.blocks for p in f(b)] for f in per_layer] +
                [[self.lnf.weight], [self.lnf.bias]])

    def tensors(self, grads=False):
        """the model file's tensors in its order, per-layer ones stacked over layers (L, ...),
        expert ones over layers and experts (L, E, ...)"""
        get = (lambda p: p.grad if p.grad is not None else torch.zeros_like(p)) if grads else (lambda p: p.data)

        def stacked(ps):
            t = torch.stack([get(p) for p in ps])
            return t.view(self.L, self.E, *t.shape[1:]) if len(ps) > self.L else t
        params = self.file_parameters()
        return [stacked(ps) if 2 <= i < len(params) - 2 else get(ps[0]) for i, ps in enumerate(params)]

    def header(self, version):
        h = [0] * 256
        h[:8] = [20240326, version, self.maxT, self.V, self.L, self.NH, self.C, self.Vp]
        h[10:12] = [self.E, self.k]  # 0, 0: dense
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
    E, k = int(header[10]), int(header[11])  # 0, 0: dense
    if E > 1 and not 1 <= k <= E:
        sys.exit("error: %s: top-%d of %d experts in its header" % (path, k, E))
    model = GPT2(L, NH, C, maxT, V, Vp, E, k)
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
    """a GPT-2 of the run's shape; its vocabulary GPT-2's 50257 unless args.vocab says another;
    an MoE if args.experts > 1 (top-args.topk, 1 unless given)"""
    V = getattr(args, "vocab", 50257)
    if V < 1:
        sys.exit("error: --vocab %d: expected a vocabulary of at least 1 token" % V)
    E, k = getattr(args, "experts", None) or 0, getattr(args, "topk", None) or 1
    if E > 1 and not 1 <= k <= E:
        sys.exit("error: --topk %d: expected 1 to --experts %d" % (k, E))
    return GPT2(args.layers, args.heads, args.channels, args.max_seq_len, V, padded_vocab(V), E, k)


def check_moe_of_init(args, model):
    """an --init file's experts and top-k (its header's) must be those of --experts and --topk
    where they are given"""
    E, k = getattr(args, "experts", None), getattr(args, "topk", None)
    if E is not None and (E if E > 1 else 0) != model.E:
        sys.exit("error: --experts %d, but --init %s holds %s" % (
            E, args.init, "%d experts" % model.E if model.E else "a dense model"))
    if k is not None and model.E and k != model.k:
        sys.exit("error: --topk %d, but --init %s routes a token to its top %d experts" % (k, args.init, model.k))


def tokens_for(model, path):
    """the run's tokens, each below the model's vocabulary (else a clear error, not an IndexError
    deep in the forward)"""
    tokens = read_tokens(path)
    outside = np.flatnonzero(tokens >= model.V)
    if len(outside):
        sys.exit("error: --tokens %s: token %d at position %d is outside the model's vocabulary of %d (--vocab, or "
                 "the --init file's)" % (path, tokens[outside[0]], outside[0], model.V))
    return tokens


def moe_settings(args, model):
    """the MoE flags of a run (their defaults where args lacks them), checked; the capacity set
    on the model's blocks"""
    get = lambda name, default: default if getattr(args, name, None) is None else getattr(args, name)
    moe = dict(balance=get("balance", "aux"), aux_alpha=get("aux_alpha", 0.01), bias_rate=get("bias_rate", 1e-3),
               capacity_factor=get("capacity_factor", 0.0), capacity_tokens=get("capacity_tokens", 0))
    G = args.batch * args.seq_len
    if moe["balance"] not in ("aux", "bias", "none"):
        sys.exit("error: --balance %s: expected aux, bias or none" % moe["balance"])
    if moe["capacity_factor"] < 0:
        sys.exit("error: --capacity-factor %g: expected 0 (dropless) or more" % moe["capacity_factor"])
    if moe["capacity_tokens"] < 0 or (moe["capacity_tokens"] and G % moe["capacity_tokens"]):
        sys.exit("error: --capacity-tokens %d: expected a divisor of the global batch's %d tokens" % (
            moe["capacity_tokens"], G))
    for b in model.blocks:
        b.capacity_factor, b.capacity_tokens = moe["capacity_factor"], moe["capacity_tokens"]
    return moe


def run(args):
    """the reference run. reference.json: per step "losses" (the cross-entropy, what the trainers
    print as the loss), "grad_norms" (of the whole loss's gradient, before clipping), "lrs"; an
    MoE's also "aux_losses" (the summed aux term, 0 unless --balance aux), "loads" (per layer, the
    slots routed to each expert over the global batch, before drops), "max_vio" (the largest over
    the layers of max load / mean load - 1), "dropped" (dropped slots / all slots, all layers);
    "routes" (per step and layer, each slot's expert, tokens in order, k a token; -1 where dropped),
    "bias" (each layer's final b) and "min_route_margin" (over all steps, layers and tokens, the
    least gap between the k-th and (k+1)-th largest s + b; inf if k = E: fp32 trainers route as
    the reference only where no token is near a tie)"""
    torch.manual_seed(args.seed)
    if getattr(args, "init", None):
        model = load_model_file(args.init)
        check_moe_of_init(args, model)
    else:
        model = gpt2_of_args(args)
        model.init_weights(args.seed, getattr(args, "router_std", None) or 0.02)
    moe = moe_settings(args, model) if model.E else None
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
    routing = dict(aux_losses=[], loads=[], max_vio=[], dropped=[], min_route_margin=math.inf, routes=[])
    for step in range(args.steps):
        chunk = torch.from_numpy(tokens[step * G: step * G + G + 1])
        x, y = chunk[:-1].view(B, T), chunk[1:].view(B, T)
        loss = model(x, y)
        aux = None
        if moe and moe["balance"] == "aux":
            aux = moe["aux_alpha"] * sum(b.routing["aux"] for b in model.blocks)
        (loss if aux is None else loss + aux).backward()
        if moe:
            loads = [b.routing["load"] for b in model.blocks]
            routing["aux_losses"].append(0.0 if aux is None else aux.item())
            routing["loads"].append(loads)
            routing["max_vio"].append(max(max(load) / (sum(load) / model.E) - 1 for load in loads))
            routing["dropped"].append(sum(b.routing["dropped"] for b in model.blocks) / (model.L * G * model.k))
            routing["min_route_margin"] = min(routing["min_route_margin"], *(b.routing["margin"] for b in model.blocks))
            routing["routes"].append([b.routing["route"] for b in model.blocks])
        if step == 0:
            write_model_file(os.path.join(args.out, "grads.bin"), model, model.tensors(grads=True))
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        lr = learning_rate(step, args.lr, args.warmup, args.steps, args.final_lr_frac)
        for group in opt.param_groups:
            group["lr"] = lr
        opt.step()
        opt.zero_grad(set_to_none=True)
        if moe and moe["balance"] == "bias":  # on this step's loads, for the next step's routing
            for b in model.blocks:
                b.update_balance_bias(moe["bias_rate"])
        losses.append(loss.item())
        norms.append(float(norm))
        lrs.append(lr)
    write_model_file(os.path.join(args.out, "final.bin"), model, model.tensors())
    for p in model.parameters():  # AdamW's first moments, in the model file's layout
        p.grad = opt.state[p]["exp_avg"] if p in opt.state else torch.zeros_like(p)
    write_model_file(os.path.join(args.out, "final_m.bin"), model, model.tensors(grads=True))
    result = {"losses": losses, "grad_norms": norms, "lrs": lrs}
    if moe:
        result.update(routing, bias=[b.balance_bias.tolist() for b in model.blocks])
    with open(os.path.join(args.out, "reference.json"), "w") as f:
        json.dump(result, f, indent=1)
    return losses, norms


E3M0_LEVELS = 7  # e3m0's exponents 1..7: +-scale 2^(e - 7); 0 is zero


def link_round(x, bits):
    """one piece of values as DiLoCo's link carries them in int8 (bits 8) or e3m0 (bits 4), written
    from the definition in llmc/precision.h's comment (not from its code): in float32, the scale
    the largest |x|; int8 (x / scale) 127 rounded to nearest even, within +-127, read back as
    (code / 127) scale; e3m0
    +-scale 2^(e - 7) for e = 1..7 or 0, |x| reaching level e >= 2 at scale 2^(e - 7.5) (the
    geometric mean of two levels, an fp32 constant times the scale) and level 1 at scale 2^-7 (half
    the smallest level). Returns the values as they arrive (float32); a non-finite x is refused"""
    x = x.reshape(-1).float()
    scale = x.abs().max() if x.numel() else torch.zeros((), dtype=torch.float32)
    if not torch.isfinite(scale):
        raise ValueError("link_round: a non-finite value has no scale")
    if scale == 0:
        return torch.zeros_like(x)
    if bits == 8:
        code = torch.round(x / scale * torch.tensor(127.0, dtype=torch.float32)).clamp(-127, 127).int()  # (no -0)
        return code.float() / torch.tensor(127.0, dtype=torch.float32) * scale
    f32 = lambda v: torch.tensor(v, dtype=torch.float32)  # (an fp32 constant, as the C literal is)
    a = x.abs()
    e = (a >= scale * f32(2.0 ** -7)).int()
    for k in range(2, E3M0_LEVELS + 1):
        e += (a >= scale * (f32(math.sqrt(2)) * f32(2.0 ** k) / f32(256.0))).int()
    v = torch.where(e > 0, scale * torch.pow(f32(2.0), (e - 7).float()), torch.zeros_like(x))
    return torch.where((x < 0) & (e > 0), -v, v)  # (code 0 is +0)


def link_mean_coded(deltas, units, W, bits):
    """the mean of W workers' pseudo-gradients of a fragment as the link carries them in int8 or
    e3m0: deltas[w] the fragment's values in the model file's order (each tensor of each layer a
    unit of units[i] values), cut into W shards at w P_f // W (the exchange's owners) and into pieces
    where a unit or a shard ends, each piece rounded with its own scale (link_round); the owner sums
    the W workers' values of its shard in float32, in worker order, divides by W, and rounds each
    piece again for the way back"""
    P_f = sum(units)
    cuts = sorted(set([s * P_f // W for s in range(W + 1)] + list(np.cumsum([0] + units))))
    pieces = [(a, b) for a, b in zip(cuts, cuts[1:]) if b > a]
    mean = torch.zeros(P_f, dtype=torch.float32)
    for d in deltas:
        mean += torch.cat([link_round(d[a:b], bits) for a, b in pieces])
    mean = mean / torch.tensor(float(W), dtype=torch.float32)
    return torch.cat([link_round(mean[a:b], bits) for a, b in pieces])


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
    args.alpha: after an outer step a worker continues from alpha theta_w + (1 - alpha) theta_outer
    (Streaming DiLoCo's merge; 0: theta_outer; the last step's outer steps unmerged). args.tau: a fragment's mean pseudo-gradient, taken at
    its outer step, is applied tau steps later (the exchange overlapping them), theta_w then being
    the worker's weights of that later step; at the last step whatever is pending first, then
    every fragment at once. args.fragment_layout "strided": fragment f holds the
    blocks l with l % F == f (the paper's pattern) rather than the consecutive ones.
    Streaming DiLoCo (Douillard et al. 2025, arXiv:2501.18512), args.fragments F: the layers in F
    groups of L/F consecutive blocks (wte and wpe with the first, the final LayerNorm with the
    last), each with its own outer optimizer, group f stepping after the steps s with
    (s - f H/F) % H == 0 (s >= 1), and every group after the last step. args.outer_dtype "bf16":
    the outer gradient crosses the link in bf16 as Streaming DiLoCo sends it in low precision:
    each worker's theta_outer - theta_w rounded to bf16 (nearest, ties to even), their mean taken
    in the reference's dtype and rounded to bf16 again (the average's way back to the workers).
    args.outer_dtype "int8" or "e3m0": link_mean_coded, with a scale a piece."""
    torch.manual_seed(args.seed)
    model = load_model_file(args.init) if getattr(args, "init", None) else None
    if model is None:
        model = gpt2_of_args(args)
        model.init_weights(args.seed)
    if model.E:
        sys.exit("error: run_diloco: a dense model only (the MoE's aux loss and balancing are run's)")
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

    strided = getattr(args, "fragment_layout", "contiguous") == "strided"
    alpha = getattr(args, "alpha", 0.0)

    def fragment(name):
        if name.startswith("blocks."):  # block l: fragment l // (L / F), or strided l % F
            layer = int(name.split(".")[1])
            return layer % F if strided else layer * F // model.L
        return 0 if name in ("wte", "wpe") else F - 1
    groups = [[i for i, (n, _) in enumerate(outer.named_parameters()) if fragment(n) == f] for f in range(F)]

    def link(x):  # what crosses the link between workers
        return x.to(torch.bfloat16).to(x.dtype) if getattr(args, "outer_dtype", "fp32") == "bf16" else x
    params = list(outer.parameters())
    coded = {"int8": 8, "e3m0": 4}.get(getattr(args, "outer_dtype", "fp32"))
    # int8 and e3m0: each fragment's parameters in the model file's order, each layer's tensor a unit
    index = {id(p): i for i, p in enumerate(params)}
    names = {id(p): n for n, p in outer.named_parameters()}
    packed = [[index[id(p)] for ps in outer.file_parameters() for p in ps if fragment(names[id(p)]) == f] for f in range(F)]

    def mean_pseudo_gradient(f, workers_params):  # (theta_outer - theta_w) over the workers, as the link carries it
        if coded is None:
            return [link(sum(link(params[i] - wp[i]) for wp in workers_params) / W) for i in groups[f]]
        deltas = [torch.cat([(params[i] - wp[i]).reshape(-1).float() for i in packed[f]]) for wp in workers_params]
        mean = link_mean_coded(deltas, [params[i].numel() for i in packed[f]], W, coded)
        at, by_index = 0, {}
        for i in packed[f]:
            by_index[i] = mean[at: at + params[i].numel()].view(params[i].shape).to(params[i].dtype)
            at += params[i].numel()
        return [by_index[i] for i in groups[f]]
    outer_opts = [torch.optim.SGD([params[i] for i in g], lr=args.outer_lr, momentum=args.outer_momentum,
                                  nesterov=args.outer_momentum > 0) for g in groups]
    tau = getattr(args, "tau", 0)
    pending = None  # (fragment, its mean pseudo-gradient, the step after which it is applied)

    def apply(f, grads, alpha=alpha):  # the outer step of fragment f, each worker from theta_outer merged by alpha
        with torch.no_grad():
            for i, g in zip(groups[f], grads):
                params[i].grad = g
        outer_opts[f].step()
        with torch.no_grad():
            for wp in [list(c.parameters()) for c in copies]:
                for i in groups[f]:
                    wp[i].copy_(alpha * wp[i] + (1 - alpha) * params[i])
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
        if pending is not None and (s == pending[2] or s == args.steps):  # tau steps after its post
            apply(pending[0], pending[1])
            pending = None
        for f in range(F):
            if not (s == args.steps or (s >= f * H // F and (s - f * H // F) % H == 0)):
                continue
            workers_params = [list(c.parameters()) for c in copies]
            with torch.no_grad():  # the mean pseudo-gradient, as the link carries it
                grads = mean_pseudo_gradient(f, workers_params)
            if tau > 0 and s < args.steps:
                pending = (f, grads, s + tau)
            else:  # (the last step's outer steps unmerged: every worker ends on theta_outer)
                apply(f, grads, alpha if s < args.steps else 0.0)
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


def add_moe_arguments(ap):
    """the flags of a mixture-of-experts run (apart from add_run_arguments: a tool that takes
    those passes them to a trainer, and a trainer takes these only once it routes)"""
    ap.add_argument("--experts", type=int, help="E experts a layer (default 0: the dense GPT-2; also 1)")
    ap.add_argument("--topk", type=int, help="experts a token (default 1)")
    ap.add_argument("--balance", choices=["aux", "bias", "none"], default="aux",
                    help="aux: Switch Transformer's loss (default); bias: DeepSeek-V3's bias on the routing")
    ap.add_argument("--aux-alpha", type=float, default=0.01, help="the aux loss's weight")
    ap.add_argument("--bias-rate", type=float, default=1e-3, help="the bias's step a training step")
    ap.add_argument("--capacity-factor", type=float, default=0.0,
                    help="an expert takes ceil(cf N k / E) of a group's slots (default 0: all, dropless)")
    ap.add_argument("--router-std", type=float, default=0.02,
                    help="the router's initial weights' std: a wider one routes with wider margins, so that fp32 "
                         "trainers pick the experts the float64 reference picks")
    ap.add_argument("--capacity-tokens", type=int, default=0,
                    help="N, the tokens of a capacity group: consecutive in the global batch (default: all of it)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    add_run_arguments(ap)
    add_moe_arguments(ap)
    ap.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    args = ap.parse_args()
    losses, norms = run(args)
    for i, (l, n) in enumerate(zip(losses, norms)):
        print("step %d loss %.6f grad norm %.4f" % (i + 1, l, n))


if __name__ == "__main__":
    main()
