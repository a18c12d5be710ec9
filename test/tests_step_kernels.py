# llmc/step_kernels.h, the kernels of one GPU training step (dev/bench/step_kernels prints them as
# JSON; dev/bench/roofline.py prices them): its rows against counts derived here from GPT-2's
# shapes and the kernels' tiles, never read back from the program's output.
# (Read into run_tests.py: test, make, ROOT, subprocess, json, re, os come from there.)

STEP_KERNEL_FIELDS = {"group", "kernel", "calls", "launches", "flops", "bytes", "engine", "op", "launch", "phase", "chunks",
                      "comm", "collective", "payload", "ranks", "hidden_by"}


def step_kernels_json(*flags):
    """the program's rows for these flags, built first (make is a no-op when it is up to date)"""
    p = make(["dev/bench/step_kernels"])
    assert p.returncode == 0, p.stdout.decode()[-3000:]
    cmd = ["./dev/bench/step_kernels"] + [str(f) for f in flags]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, "%s: exit %d\n%s" % (" ".join(cmd), p.returncode, p.stderr[-2000:])
    res = json.loads(p.stdout)
    for r in res["rows"]:
        assert set(r) == STEP_KERNEL_FIELDS, "%s: fields %s" % (r.get("kernel"), sorted(r))
        assert r["engine"] in ("gemm", "attn", "vector", "memset", "link", "host"), r
        assert r["calls"] >= 1 and r["launches"] >= 1 and r["flops"] >= 0 and r["bytes"] > 0, r
        # a collective is no launcher's: LLMC_KERNEL_TIMES=1 names every other kind of launch
        assert (r["launch"] is None) == (r["engine"] == "link"), r
        assert (r["comm"] is not None) == (r["engine"] == "link"), r
        assert r["phase"] in ("step", "forward", "backward_input", "backward_weight"), r
        assert (r["chunks"] == 0) == (r["phase"] == "step"), r
        if r["engine"] == "link":  # what crosses the link of what was handed to the collective, n ranks
            n = r["ranks"]
            share = {"all-reduce": 2 * (n - 1) / n, "reduce-scatter": (n - 1) / n, "all-gather": (n - 1) / n}
            roofline_close(r["bytes"], share.get(r["collective"], 1.0) * r["payload"], 1e-12, r["kernel"])
    return res


def step_kernels_total(res, field, **match):
    """the sum over all calls of the matching rows of flops or bytes"""
    rows = [r for r in res["rows"] if all(r[k] == v for k, v in match.items())]
    assert rows, "no row with %s" % match
    return sum(r[field] * r["calls"] for r in rows)


def step_kernels_parameters(L, C, Vp=50304, maxT=1024, experts=0, held=0):
    """gpt2_parameter_sizes summed by hand: wte (Vp, C), wpe (maxT, C), per layer ln1 and ln2 (2C
    each), qkv (3C^2 + 3C), attproj (C^2 + C), fc (4C^2 + 4C) and fcproj (4C^2 + C) for each of the
    `held` experts (1 MLP when dense), a router (E C); lnf (2C)"""
    mlps = held if experts else 1
    return Vp * C + maxT * C + L * (4 * C + 4 * C * C + 4 * C + experts * C + mlps * (8 * C * C + 5 * C)) + 2 * C


@test
def step_kernels_flops_are_6_n_plus_12_l_c_t_per_token():
    """the matmuls (op matmul) of a step do 6 x (the weights they multiply) x tokens FLOPs: forward
    2 N K M, input and weight gradients 2 N K M each, over each layer's 12 C^2 weights and the
    tied LM head (Vp, C). cuBLAS attention multiplies full T x T squares: 2 GEMMs forward, 4
    backward, each 2 T^2 hs a head, 12 L C T a token: all GEMMs together are the standard rule
    (6 N + 12 L C T) x tokens exactly. The flash kernels count whole 64 x 64 tiles on and below
    the diagonal, forward 2 tile products, backward 7 (dK/dV recomputes p: 4; dQ recomputes p and
    dp: 3); the forward's warps own 32 queries and stop at their last one"""
    exact = 1e-12  # integer counts far below 2^53: only the float sum's rounding separates the sides
    for model, L, C, NH, B, T, precision in (("d12", 12, 768, 12, 4, 64, "bf16"), ("d2", 2, 128, 2, 3, 130, "bf16"),
                                             ("3/96/3", 3, 96, 3, 2, 40, "fp32")):
        N, hs, Vp = B * T, C // NH, 50304
        what = "%s B=%d T=%d %s" % (model, B, T, precision)
        cublas = step_kernels_json("-e", model, "-b", B, "-t", T, "-precision", precision, "-attention", "cublas")
        matmul = step_kernels_total(cublas, "flops", op="matmul")
        roofline_close(matmul, 6.0 * (L * 12 * C * C + Vp * C) * N, exact, what + ": matmul FLOPs")
        gemms = step_kernels_total(cublas, "flops", engine="gemm")
        roofline_close(gemms, (6.0 * (L * 12 * C * C + Vp * C) + 12.0 * L * C * T) * N, exact,
                       what + ": all GEMMs = (6 N + 12 L C T) tokens")
        if precision != "bf16":
            continue
        flash = step_kernels_json("-e", model, "-b", B, "-t", T, "-attention", "flash")
        roofline_close(step_kernels_total(flash, "flops", op="matmul"), matmul, exact, what + ": flash leaves the matmuls")
        # the backward's tiles: n = ceil(T / 64) tiles a side, n (n + 1) / 2 on and below the diagonal;
        # the forward's in strips of 32 queries, each computing the 64-key tiles up to its last query,
        # half a tile each: T = 64, one strip of tile 0 and one of tile 0: 1 tile. T = 130: the
        # strips at 0 and 32 take tile 0, 64 and 96 tiles 0-1, 128 (queries 128, 129) tiles 0-2:
        # 9 half tiles = 4.5 where the backward visits 6
        n = -(-T // 64)
        backward_tiles = n * (n + 1) // 2
        forward_tiles = {64: 1, 130: 4.5}[T]
        product = B * NH * 2 * 64 * 64 * hs  # one tile's (64 x hs) x (hs x 64) product over batch and heads
        roofline_close(step_kernels_total(flash, "flops", engine="attn", group="layer forward"),
                       L * 2 * forward_tiles * product, exact, what + ": flash forward FLOPs")
        roofline_close(step_kernels_total(flash, "flops", engine="attn", group="layer backward"),
                       L * 7 * backward_tiles * product, exact, what + ": flash backward FLOPs")
        if T == 64:  # one tile is the whole square: the 2 + 7 products against cuBLAS's 2 + 4
            roofline_close(step_kernels_total(flash, "flops", engine="attn"), 9 / 6 * 12.0 * L * C * T * N, exact,
                           what + ": flash at T = 64")


@test
def step_kernels_elementwise_bytes_by_hand():
    """a 1-layer GPT-2 of C = 8 (2 heads of 4: cuBLAS attention), B = 2, T = 4, fp32 (X = 4): N = 8
    rows. Each elementwise kernel moves its inputs and outputs once at their widths:
    - encoder_forward: the tokens (N ints, 32 B), the distinct rows of wte it reads (8 of C: 256),
      wpe's T rows (128), the output (N C: 256): 672
    - layernorm_forward (ln1): x (256) and the weight and bias (2 C: 64) in; out (256) and fp32 mean
      and rstd (2 N 4: 64) out: 640; the residual ones read and write one (N, C) more: 1152
    - gelu_forward (fp32 builds run GELU in kernels): fch (N, 4C) in, its GELU out: 2 x 1024 = 2048
    - fused_classifier: the logits (N, Vp) read and dlogits written over them (2 x 8 x 50304 x 4) and
      the losses and targets (2 N 4): 3219520
    - adamw: 28 bytes a parameter: the gradient (4), the parameter read and written (8), m and v
      read and written (16)"""
    res = step_kernels_json("-e", "1/8/2", "-b", 2, "-t", 4, "-precision", "fp32")
    P = step_kernels_parameters(1, 8)
    assert res["parameters"] == P == 411512, res["parameters"]
    want = {"encoder_forward": 672, "layernorm_forward (ln1 of layer 0)": 640, "residual + layernorm (ln2)": 1152,
            "residual + layernorm (lnf)": 1152, "gelu_forward": 2048,
            "fused_classifier (softmax, loss, dlogits)": 3219520, "adamw_runs_kernel (16 tensors' pieces)": 28 * P}
    got = {r["kernel"]: r["bytes"] for r in res["rows"] if r["kernel"] in want}
    assert got == want, "bytes: %s, by hand %s" % (got, want)
    # one layer: no LayerNorm "of the next layer"
    assert not [r for r in res["rows"] if "next layer" in r["kernel"]], [r["kernel"] for r in res["rows"]]
    # in bf16 (X = 2) the activations halve and the LayerNorm's fp32 mean and rstd do not: ln1 reads
    # x (128) and its parameters (32), writes out (128) and mean, rstd (64): 352
    res = step_kernels_json("-e", "1/8/2", "-b", 2, "-t", 4, "-precision", "bf16")
    got = [r["bytes"] for r in res["rows"] if r["kernel"] == "layernorm_forward (ln1 of layer 0)"]
    assert got == [352], "bf16 ln1 bytes %s, by hand 352" % got


@test
def step_kernels_context_parallel_and_experts_follow_their_formulas():
    """-cp 4: a rank's matmuls on N / 4 rows, and on its link per layer the ring's cp - 1 K,V blocks
    (B, T/cp, 2C) forward, as many backward with cp blocks of dK, dV in fp32, then the gradients'
    all-reduce, 2 (cp - 1)/cp P X; one rank alone has no link rows.
    -experts 8 -topk 2: each token's MLP rows multiplied by k (the rows of fc and fcproj, forward,
    dinp and dweight, and GELU's: k times the dense FLOPs and GELU's bytes) and a router (6 N C E); with -ep 1 no all-to-all,
    with -ep 2 four a layer (tokens out, outputs back, their gradients out and back), each
    N k C X (ep - 1)/ep bytes; the experts' gradients all-reduced over their dp/ep copies"""
    L, C, B, T, X = 2, 128, 2, 64, 2
    N = B * T
    base = ("-e", "d2", "-b", B, "-t", T)
    one = step_kernels_json(*base)
    assert not [r for r in one["rows"] if r["engine"] == "link"], "one rank with a link row"
    cp = 4
    four = step_kernels_json(*base, "-cp", cp)
    roofline_close(step_kernels_total(four, "flops", op="matmul"), step_kernels_total(one, "flops", op="matmul") / cp,
                   1e-12, "-cp 4: matmul FLOPs")
    P = step_kernels_parameters(L, C)
    block = B * (T // cp) * 2 * C
    ring = L * (cp - 1) * block * X + L * ((cp - 1) * block * X + cp * block * 4)
    roofline_close(step_kernels_total(four, "bytes", engine="link"), ring + 2 * (cp - 1) / cp * P * X, 1e-12,
                   "-cp 4: bytes on the link")

    E, k = 8, 2
    mlp = ("matmul fc (+bias, GELU epilogue)", "matmul fcproj (+bias epilogue)", "matmul fcproj dinp (DGELU epilogue)",
           "matmul fc dinp")

    def mlp_flops(res, dense):
        names = mlp + (("matmul fcproj dweight (+dbias BGRADB)", "matmul fc dweight (+dbias BGRADB)") if dense else
                       ("matmul expert fcproj dweight", "matmul expert fc dweight"))
        return sum(r["flops"] * r["calls"] for r in res["rows"] if r["kernel"] in names)
    dense_mlp = mlp_flops(one, True)
    roofline_close(dense_mlp, 6.0 * L * 8 * C * C * N, 1e-12, "dense MLP FLOPs")
    for dp, ep in ((1, 1), (4, 2), (8, 8)):
        what = "-experts %d -topk %d -dp %d -ep %d" % (E, k, dp, ep)
        moe = step_kernels_json(*base, "-experts", E, "-topk", k, "-dp", dp, "-ep", ep)
        held = E // ep
        P = step_kernels_parameters(L, C, experts=E, held=held)
        assert moe["parameters"] == P, "%s: %d parameters a rank, by hand %d" % (what, moe["parameters"], P)
        roofline_close(mlp_flops(moe, False), k * dense_mlp, 1e-12, what + ": MLP FLOPs k x dense")
        roofline_close(step_kernels_total(moe, "flops", op="matmul"),
                       step_kernels_total(one, "flops", op="matmul") + (k - 1) * dense_mlp + 6.0 * L * N * C * E, 1e-12,
                       what + ": matmul FLOPs with the router's")
        a2a = [r for r in moe["rows"] if r["kernel"].startswith("all-to-all")]
        assert len(a2a) == (0 if ep == 1 else 4), "%s: all-to-all rows %s" % (what, [r["kernel"] for r in a2a])
        for r in a2a:
            assert r["calls"] == L, r
            roofline_close(r["bytes"], N * k * C * X * (ep - 1) / ep, 1e-12, what + ": " + r["kernel"])
        # GELU in kernels: its (N k, 4C) input and output, k times the dense kernel's
        gelu = step_kernels_json(*base, "-experts", E, "-topk", k, "-dp", dp, "-ep", ep, "-gelu", "kernels")
        dense_gelu = step_kernels_json(*base, "-gelu", "kernels")
        for kernel in ("gelu_forward", "gelu_backward"):
            for field in ("flops", "bytes"):
                roofline_close(step_kernels_total(gelu, field, kernel=kernel),
                               k * step_kernels_total(dense_gelu, field, kernel=kernel), 1e-12,
                               "%s: %s %s k x dense" % (what, kernel, field))
        experts_all_reduce = [r for r in moe["rows"] if r["kernel"].startswith("all-reduce expert grads")]
        copies = dp // ep
        assert len(experts_all_reduce) == (1 if copies > 1 else 0), (what, experts_all_reduce)
        for r in experts_all_reduce:
            roofline_close(r["bytes"], 2 * (copies - 1) / copies * L * held * (8 * C * C + 5 * C) * X, 1e-12,
                           what + ": the experts' all-reduce")


@test
def step_kernels_constants_are_the_librarys():
    """llmc/step_kernels.h's copies of the CUDA kernels' launch constants (a CPU build cannot include
    the .cuh files) equal the headers' #defines, evaluated: a kernel changed without its rows fails
    here, not in a benchmark read much later"""
    text = open(os.path.join(ROOT, "llmc/step_kernels.h")).read()
    copies = re.findall(r"^#define STEP_\w+ (\d+)\s+// (llmc/\S+?): (\w+),", text, re.M)
    assert len(copies) >= 4, copies
    for value, header, name in copies:
        defines = dict(re.findall(r"^#define (\w+) ([^/\n]+?)\s*(?://.*)?$", open(os.path.join(ROOT, header)).read(), re.M))
        assert name in defines, "%s: no #define %s" % (header, name)
        expr = defines[name]
        for _ in range(8):  # FLASH_TILE is (FLASH_WARPS * FLASH_ROWS): its names by their values
            expr = re.sub(r"[A-Z_][A-Z0-9_]*", lambda m: "(%s)" % defines[m.group(0)], expr)
        assert re.fullmatch(r"[\d\s()*+/-]+", expr), "%s: %s = %s" % (header, name, expr)
        assert eval(expr) == int(value), "llmc/step_kernels.h copies %s = %s, %s says %s" % (name, value, header, expr)


@test
def step_kernels_micro_batches_repeat_the_forward_and_backward():
    """-micro_batches 3 (train_gpt2_dp accumulating 3 micro-batches a step, -z 0): the forward and
    backward kernels run 3 times a step, each call the same; the gradients' memset, their
    all-reduce (on the last micro-batch: the earlier ones only accumulate), the norm and AdamW once"""
    base = ("-e", "d2", "-b", 2, "-t", 64, "-dp", 2)
    one, three = step_kernels_json(*base), step_kernels_json(*base, "-micro_batches", 3)
    assert [r["kernel"] for r in one["rows"]] == [r["kernel"] for r in three["rows"]], "different kernels"
    once = ("step start", "gradient all-reduce", "global norm + AdamW")
    for a, b in zip(one["rows"], three["rows"]):
        times = 1 if a["group"] in once else 3
        assert b["calls"] == times * a["calls"] and b["launches"] == times * a["launches"], (a, b)
        assert (b["flops"], b["bytes"]) == (a["flops"], a["bytes"]), (a, b)
    assert {r["group"] for r in one["rows"]} >= set(once), "a once-a-step group is missing"
