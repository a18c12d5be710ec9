"""
PyTorch throughput of test/reference.py's GPT-2 on one GPU, to print beside train_gpt2_dp's:
bf16 autocast (fp32 weights and AdamW, as the C trainer's master weights), eager and
torch.compile, tokens/s, MFU against the GPU's bf16 peak, and peak memory.

    python3 dev/bench/bench_pytorch.py [--batch 16 32 64] [--seq-len 1024] [--steps 10]
"""
import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "test"))
import reference  # noqa: E402

PEAK_BF16 = {(9, 0): 989e12, (8, 0): 312e12}  # H100/H200 SXM, A100: dense bf16 datasheet peaks


def sdpa_attention(self, x):
    """the reference block's attention through torch's fused kernel (flash attention on GPUs)"""
    B, T, C = x.shape
    q, k, v = self.qkv(x).split(C, dim=2)
    q, k, v = [t.view(B, T, self.NH, C // self.NH).transpose(1, 2) for t in (q, k, v)]
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return self.attproj(y.transpose(1, 2).contiguous().view(B, T, C))


MANUAL_ATTENTION = reference.Block.attention


def bench(B, T, steps, compile_model, sdpa):
    torch.manual_seed(0)
    reference.Block.attention = sdpa_attention if sdpa else MANUAL_ATTENTION
    model = reference.GPT2(12, 12, 768, 1024, 50257, 50304)
    model.init_weights(0)  # on the CPU: the reference's generator is a CPU one
    model = model.cuda()
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=True)
    step_fn = torch.compile(model) if compile_model else model
    x = torch.randint(0, 50257, (B, T), device="cuda")
    y = torch.randint(0, 50257, (B, T), device="cuda")
    torch.cuda.reset_peak_memory_stats()
    times = []
    for i in range(steps):
        torch.cuda.synchronize()
        t0 = time.time()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_fn(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if i >= 3:  # compilation and warm-up first
            times.append(time.time() - t0)
    dt = sum(times) / len(times)
    tokens_per_s = B * T / dt
    flops_per_token = 6.0 * params + 12.0 * 12 * 768 * T  # the C trainer's formula
    peak = PEAK_BF16.get(torch.cuda.get_device_capability(), 0.0)
    mfu = 100.0 * flops_per_token * tokens_per_s / peak if peak else float("nan")
    mem = torch.cuda.max_memory_allocated() / 1e9
    name = ("compile" if compile_model else "eager") + (" + sdpa" if sdpa else "")
    print("pytorch %-16s B=%-3d T=%d | %8.1f ms | %9.0f tok/s | MFU %5.1f%% | peak mem %.1f GB"
          % (name, B, T, dt * 1e3, tokens_per_s, mfu, mem), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, nargs="+", default=[16, 32, 64])
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args()
    print("torch %s on %s" % (torch.__version__, torch.cuda.get_device_name()))
    for B in args.batch:
        for compile_model in (False, True):
            for sdpa in (False, True):
                try:
                    bench(B, args.seq_len, args.steps, compile_model, sdpa)
                except torch.cuda.OutOfMemoryError:
                    print("pytorch B=%d: out of memory" % B)
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
