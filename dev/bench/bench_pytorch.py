"""
PyTorch throughput of test/reference.py's GPT-2 on one GPU, the peers of train_gpt2_dp in
dev/bench/bench_gpu.sh: bf16 autocast (fp32 weights and fused AdamW, as the C trainer's master
weights), gradient clipping at 1, random init, random tokens. Variants:
    compile+sdpa   torch.compile (default mode) with F.scaled_dot_product_attention, its backend
                   PyTorch's own choice for the GPU and shapes
    compile+flash, compile+cudnn, compile+efficient
                   the same with SDPA held to one backend (torch.nn.attention.sdpa_kernel): the
                   FlashAttention-2 kernels built into PyTorch, cuDNN's fused attention, or the
                   memory-efficient (xformers-derived) kernels; a backend this PyTorch or GPU
                   lacks fails alone ("No available kernel"), and the others run
    eager+sdpa     no compile, SDPA's own choice
    compile        torch.compile of the reference's own attention (scores materialised, masked)
    eager          the reference as it is
Each prints ms per step (the mean over the steps after the first 3: compilation and warm-up),
tokens/s, MFU (the C trainer's FLOPs per token, 6 N + 12 L C T, against --peak-tflops or the
GPU's dense bf16 peak), and peak memory twice: what PyTorch's allocator held at most, and the
device's used memory (total - free, as train_gpt2_dp and llm.c report theirs: with the CUDA
context and the allocator's cache).

    python3 dev/bench/bench_pytorch.py [--model d12|d24|d36] [--batch 16 32 64] [--fit]
        [--variants compile+sdpa compile+flash compile+cudnn compile+efficient eager+sdpa compile eager]
        [--seq-len 1024] [--steps 10]
        [--peak-tflops 989]

--fit: --batch lists sizes largest first; each variant runs the first that fits (out of memory:
the next one). A compiled variant takes about 40-60 s to compile at each B it tries.
"""
import argparse
import contextlib
import gc
import math
import os
import sys
import time

# fewer out-of-memory failures from fragmentation at the largest B (as torchtitan runs)
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
try:  # (PyTorch 2.3 or later; before it, only SDPA's own choice)
    from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
except ImportError:
    SDPBackend = sdpa_kernel = None

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "test"))
import reference  # noqa: E402

# the GPT-2 family: layers, heads, channels (as llmc/gpt2.h's descriptors)
MODELS = {"d12": (12, 12, 768), "d24": (24, 16, 1024), "d36": (36, 20, 1280), "d48": (48, 25, 1600)}
V, VP, MAX_T = 50257, 50304, 1024
PEAK_BF16 = {(9, 0): 989e12, (8, 0): 312e12}  # H100/H200 SXM, A100: dense bf16 datasheet peaks
VARIANTS = ("compile+sdpa", "compile+flash", "compile+cudnn", "compile+efficient", "eager+sdpa", "compile", "eager")
# the variants that hold SDPA to one backend
BACKENDS = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION", "efficient": "EFFICIENT_ATTENTION"}


def sdpa_attention(self, x):
    """the reference block's attention through torch's fused kernel (flash attention on GPUs)"""
    B, T, C = x.shape
    q, k, v = self.qkv(x).split(C, dim=2)
    q, k, v = [t.view(B, T, self.NH, C // self.NH).transpose(1, 2) for t in (q, k, v)]
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return self.attproj(y.transpose(1, 2).contiguous().view(B, T, C))


MANUAL_ATTENTION = reference.Block.attention


def init_weights(model, seed):
    """test/reference.py's init (GPT2.init_weights) drawn on the GPU: the same distributions,
    without drawing 124M-774M numbers on the CPU while the GPU waits"""
    g = torch.Generator(device="cuda").manual_seed(seed)
    with torch.no_grad():
        model.wte[: model.V].normal_(0.0, 0.02, generator=g)
        model.wpe.normal_(0.0, 0.02, generator=g)
        for b in model.blocks:
            for lin, std in ((b.qkv, 0.02), (b.attproj, 0.02 / math.sqrt(2 * model.L)),
                             (b.fc, 0.02), (b.fcproj, 0.02 / math.sqrt(2 * model.L))):
                lin.weight.normal_(0.0, std, generator=g)
                lin.bias.zero_()


def flops_per_token(model_name, T):
    """the C trainer's formula (llmc/gpt2.h gpt2_flops_per_token): 6 N + 12 L C T"""
    L, NH, C = MODELS[model_name]
    n = VP * C + MAX_T * C + L * (12 * C * C + 13 * C) + 2 * C  # tied LM head, padded vocabulary
    return 6.0 * n + 12.0 * L * C * T


def train_steps(model, step_fn, opt, x, y, steps):
    """steps training steps: the seconds of those after the first 3 (compilation and warm-up), the
    last one's loss"""
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
        if i >= 3:
            times.append(time.time() - t0)
    return times, loss.item()


def bench(model_name, B, T, steps, variant, peak):
    L, NH, C = MODELS[model_name]
    compile_model, attention = variant.startswith("compile"), variant.partition("+")[2]
    sdpa = attention == "sdpa" or attention in BACKENDS
    # (held for the whole run: torch.compile traces under it, so the compiled graph calls that backend)
    backend = contextlib.nullcontext()
    if attention in BACKENDS:
        if sdpa_kernel is None:
            raise RuntimeError("torch %s has no torch.nn.attention.sdpa_kernel (2.3 or later)" % torch.__version__)
        backend = sdpa_kernel(getattr(SDPBackend, BACKENDS[attention]))
    torch.manual_seed(0)
    reference.Block.attention = sdpa_attention if sdpa else MANUAL_ATTENTION
    with torch.device("cuda"):
        model = reference.GPT2(L, NH, C, MAX_T, V, VP)
    init_weights(model, 0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=True)
    step_fn = torch.compile(model) if compile_model else model
    x = torch.randint(0, V, (B, T), device="cuda")
    y = torch.randint(0, V, (B, T), device="cuda")
    torch.cuda.reset_peak_memory_stats()
    with backend:
        times, loss = train_steps(model, step_fn, opt, x, y, steps)
    dt = sum(times) / len(times)
    tokens_per_s = B * T / dt
    mfu = 100.0 * flops_per_token(model_name, T) * tokens_per_s / peak if peak else float("nan")
    allocated = torch.cuda.max_memory_allocated() / 1e9
    free, total = torch.cuda.mem_get_info()
    # the line bench_gpu.sh reads: fields split at '|'
    print("pytorch %-12s %s B=%-3d T=%d | %8.1f ms | %9.0f tok/s | MFU %5.1f%% | device %.1f GB | allocated %.1f GB | loss %.3f"
          % (variant, model_name, B, T, dt * 1e3, tokens_per_s, mfu, (total - free) / 1e9, allocated, loss),
          flush=True)


def out_of_memory(e):
    return isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e).lower()


def release():
    """what a finished or failed variant held: compiled graphs, cached blocks"""
    torch._dynamo.reset()
    gc.collect()
    torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=sorted(MODELS), default="d12")
    ap.add_argument("--batch", type=int, nargs="+", default=[16, 32, 64])
    ap.add_argument("--fit", action="store_true", help="per variant, the first B of --batch that fits")
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=10, help="steps per run, the first 3 not timed (>= 4)")
    ap.add_argument("--peak-tflops", type=float, default=0.0, help="the GPU's dense bf16 peak (0: by compute capability)")
    args = ap.parse_args()
    if args.steps < 4:
        ap.error("--steps must be at least 4 (3 warm-up steps, then timed ones)")
    peak = args.peak_tflops * 1e12 or PEAK_BF16.get(torch.cuda.get_device_capability(), 0.0)
    print("torch %s on %s, %s, PYTORCH_CUDA_ALLOC_CONF=%s" % (torch.__version__, torch.cuda.get_device_name(),
                                                           args.model, os.environ["PYTORCH_CUDA_ALLOC_CONF"]), flush=True)
    for variant in args.variants:
        for B in args.batch:
            failure = None
            try:
                bench(args.model, B, args.seq_len, args.steps, variant, peak)
            except Exception as e:  # noqa: BLE001 (one failed variant must not stop the others)
                failure = "out of memory" if out_of_memory(e) else "failed: %s" % str(e).splitlines()[0][:200]
            release()
            if failure:
                print("pytorch %-12s %s B=%-3d T=%d | %s" % (variant, args.model, B, args.seq_len, failure), flush=True)
            elif args.fit:
                break  # the largest that fits
            if failure and args.fit and failure != "out of memory":
                break  # a failure that a smaller B does not cure


if __name__ == "__main__":
    main()
