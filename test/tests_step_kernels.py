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
        # (-profile adds each row's price, "seconds")
        want_fields = STEP_KERNEL_FIELDS | ({"seconds"} if "-profile" in flags else set())
        assert set(r) == want_fields, "%s: fields %s" % (r.get("kernel"), sorted(r))
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
    once = ("step start", "gradient all-reduce", "global norm", "AdamW")
    for a, b in zip(one["rows"], three["rows"]):
        times = 1 if a["group"] in once else 3
        assert b["calls"] == times * a["calls"] and b["launches"] == times * a["launches"], (a, b)
        assert (b["flops"], b["bytes"]) == (a["flops"], a["bytes"]), (a, b)
    assert {r["group"] for r in one["rows"]} >= set(once), "a once-a-step group is missing"


def step_kernels_link_sums(res):
    """{(group, collective): payload bytes a step} over the link rows"""
    sums = {}
    for r in res["rows"]:
        if r["engine"] == "link":
            key = (r["comm"], r["collective"])
            sums[key] = sums.get(key, 0) + r["payload"] * r["calls"]
    return sums


@test
def step_kernels_tensor_parallel_splits_the_model():
    """-tp 2 and 4 (train_gpt2_tp's layer: GELU in a kernel, the row-parallel biases after the
    sum), with and without -sp: each rank multiplies a layer's weights 1/tp of each (qkv 3C/tp and
    fc 4C/tp out, attproj C/tp and fcproj 4C/tp in) over all N tokens, and the LM head its Vp/tp
    rows: tp ranks together do the tp = 1 rank's matmul FLOPs, 6 (12 L C^2 + Vp C) N, and its
    attention's on NH/tp heads each. The LayerNorms run on all N rows of every rank, or with -sp
    on N/tp. The collectives: per micro-batch 4 L + 2 of (N, C) X (all-reduces, or with -sp as many
    all-gathers and reduce-scatters) and the loss's 3 N fp32; -sp's LayerNorm gradients (4 L + 2) C
    X once a step (train_gpt2_tp's printed formula, derived in its chapter). -tp_overlap marks the
    layers' collectives as hidden by the GEMM beside them, and no others"""
    exact = 1e-12  # integer counts far below 2^53
    L, C, NH, B, T, X, Vp = 2, 128, 4, 2, 64, 2, 50304
    N = B * T
    base = ("-e", "%d/%d/%d" % (L, C, NH), "-b", B, "-t", T, "-trainer", "tp")
    for attention in ("flash", "cublas"):
        one = step_kernels_json(*base, "-attention", attention)
        roofline_close(step_kernels_total(one, "flops", op="matmul"), 6.0 * (12 * L * C * C + Vp * C) * N, exact,
                       "tp 1 matmul FLOPs")
        for tp in (2, 4):
            for sp in (0, 1):
                what = "-tp %d -sp %d %s" % (tp, sp, attention)
                res = step_kernels_json(*base, "-attention", attention, "-tp", tp, "-sp", sp)
                for group in ("layer forward", "layer backward", "classifier"):
                    roofline_close(tp * step_kernels_total(res, "flops", op="matmul", group=group),
                                   step_kernels_total(one, "flops", op="matmul", group=group), exact,
                                   "%s: %s matmul FLOPs x tp" % (what, group))
                roofline_close(tp * step_kernels_total(res, "flops", op="attention"),
                               step_kernels_total(one, "flops", op="attention"), exact, what + ": attention FLOPs x tp")
                roofline_close(step_kernels_total(res, "flops", op="layernorm", phase="forward"),
                               step_kernels_total(one, "flops", op="layernorm", phase="forward") / (tp if sp else 1), exact,
                               what + ": LayerNorm forward FLOPs")
                act = N * C * X
                want = {("tp", "all-reduce"): 3 * N * 4 + ((4 * L + 2) * C * X if sp else (4 * L + 2) * act)}
                if sp:
                    want[("tp", "reduce-scatter")] = want[("tp", "all-gather")] = (4 * L + 2) * act
                assert step_kernels_link_sums(res) == want, "%s: %s, by hand %s" % (what, step_kernels_link_sums(res), want)
                # -tp_overlap: the 4 L layer collectives (with -sp 8 L) each under a GEMM of the step
                over = step_kernels_json(*base, "-attention", attention, "-tp", tp, "-sp", sp, "-tp_overlap", 1)
                kernels = {r["kernel"] for r in over["rows"]}
                hidden = [r for r in over["rows"] if r["hidden_by"]]
                assert sum(r["calls"] for r in hidden) == (8 if sp else 4) * L, (what, hidden)
                assert all(r["comm"] == "tp" and r["hidden_by"] in kernels and r["hidden_by"].startswith("matmul")
                           for r in hidden), hidden
                assert not [r for r in res["rows"] if r["hidden_by"]], what + ": hidden_by without -tp_overlap"


@test
def step_kernels_pipeline_stages_sum_to_the_model():
    """-pp 2, 4 (with -vp 2) of a 4-layer model, m = 3 micro-batches: the stages' rows together do
    the FLOPs of the whole model on one stage (the same trainer's layer, -pp 1), apart from the
    sends and from the last stage's copy of the tied wte, whose norm (2) and AdamW (20 FLOPs an
    element) the optimizer runs once more: 22 Vp C. Stage s sends each chunk's output on but the
    model's last and each chunk's input gradient back but the model's first: over the stages
    (pp V - 1) m messages each way of N C X (/ tp with -sp). Each stage's matmuls do equal FLOPs in
    its F, B and W actions (forward, input gradient, weight gradient). The embedding's rows run on chunk 0 of
    the first stage only, the loss's on chunk V - 1 of the last; wte's gradient is all-reduced
    between those two stages (Vp/tp C X)"""
    exact = 1e-12
    L, C, NH, B, T, X, Vp, m = 4, 128, 2, 2, 64, 2, 50304, 3
    N = B * T
    base = ("-e", "%d/%d/%d" % (L, C, NH), "-b", B, "-t", T, "-trainer", "pp", "-micro_batches", m)

    def compute_flops(res):
        return sum(r["flops"] * r["calls"] for r in res["rows"] if r["engine"] != "link")
    whole = compute_flops(step_kernels_json(*base))
    for pp, V, tp, sp in ((2, 1, 1, 0), (2, 2, 1, 0), (4, 1, 1, 0), (2, 2, 2, 1)):
        what = "-pp %d -vp %d -tp %d -sp %d" % (pp, V, tp, sp)
        extra = ("-tp", tp, "-sp", sp)
        one = compute_flops(step_kernels_json(*base, *extra, "-pp", 1)) if tp > 1 else whole
        stages = [step_kernels_json(*base, *extra, "-pp", pp, "-vp", V, "-stage", s) for s in range(pp)]
        roofline_close(sum(compute_flops(res) for res in stages), one + 22.0 * Vp // tp * C, exact,
                       what + ": the stages' FLOPs")
        sends = sum(r["calls"] for res in stages for r in res["rows"] if r["collective"] == "send")
        assert sends == 2 * (pp * V - 1) * m, "%s: %d sends, by hand %d" % (what, sends, 2 * (pp * V - 1) * m)
        for s, res in enumerate(stages):
            for r in res["rows"]:
                if r["collective"] == "send":
                    assert r["payload"] == N * C * X // (tp if sp else 1), r
                if r["kernel"].startswith("encoder"):
                    assert s == 0 and r["chunks"] == 1, (what, s, r)
                if "classifier" in r["kernel"] or "LM head" in r["kernel"]:
                    assert s == pp - 1 and r["chunks"] == 1 << (V - 1), (what, s, r)
                if r["group"] in ("layer forward", "layer backward") and r["engine"] != "link":
                    # every chunk's, but the residual add at a stage's end: the model's last chunk has lnf there
                    chunks = (1 << V) - 1
                    if s == pp - 1 and r["kernel"] == "residual_forward (the chunk's output)":
                        chunks -= 1 << (V - 1)
                    assert r["chunks"] == chunks and r["calls"] % (m * bin(chunks).count("1")) == 0, (what, r)
            # each matmul runs once forward (F), once for its input gradient (B) and once for its
            # weight gradient (W, which zero bubble runs apart): the three phases' matmul FLOPs equal
            by_phase = [step_kernels_total(res, "flops", op="matmul", phase=ph)
                        for ph in ("forward", "backward_input", "backward_weight")]
            assert by_phase[0] == by_phase[1] == by_phase[2], (what, s, by_phase)
            ends = s in (0, pp - 1)
            wte = step_kernels_link_sums(res).get(("embedding", "all-reduce"), 0)
            assert wte == (Vp // tp * C * X if ends else 0), (what, s, wte)


@test
def step_kernels_link_bytes_are_the_trainers_counters():
    """the link rows' payloads summed by group and collective equal the bytes the trainers' own
    communication layer counted in one step (main.log's "comm", CPU builds: fp32), rank 0's:
    train_gpt2_pp's interleaved schedule (2 stages of 2
    chunks, 2 micro-batches), train_gpt2_3d -pp 2 -tp 2 -sp 1 -r 2 (stage 0), train_gpt2_3d -dp 2 -pp 2 -z 1 and -cp 2 -tp 2 -sp 1 -r 2 (one stage: the embedding's and the
    head's tp collectives, as train_gpt2_tp's; the ring's K,V again in the rerun) and -cp 2 -cp_comm
    allgather -r 2 (the K,V all-gathers, three a layer, and dK,dV's reduce-scatter);
    train_gpt2_3d's 5D fold with ZeRO-1 (4 experts over dp 2 x tp 2 -sp at ep 2: the dense region
    and the experts' reduce-scattered and all-gathered apart, each padded over its ranks; the
    routers' gradients with the LayerNorms' over tp); and train_gpt2_diloco's outer
    all-reduce over 4 steps of -H 2, its half a step.
    The rows leave out the 4-byte scalars (the loss's, the norm's) the trainers also count: those
    are subtracted here, each named"""
    p = make(["train_gpt2_pp", "train_gpt2_3d", "train_gpt2_diloco"])
    assert p.returncode == 0, p.stdout.decode()[-3000:]
    B, T = 1, 32  # (small: the vocabulary's 50304 columns are most of these models' work)
    runs = [  # trainer, ranks, model, its flags, the inventory's flags, {trainer group: inventory group}, scalars
        ("train_gpt2_pp", 2, "d4", ["-d", 2 * B * T, "-vp", 2, "-sched", "interleaved"],
         ["-trainer", "pp", "-pp", 2, "-vp", 2, "-micro_batches", 2], {"world": "pp", "embedding": "embedding"},
         {("world", "all_reduce"): 4, ("world", "broadcast"): 4}),
        ("train_gpt2_3d", 4, "d2", ["-d", 2 * B * T, "-pp", 2, "-tp", 2, "-sp", 1, "-r", 2],
         ["-trainer", "3d", "-pp", 2, "-tp", 2, "-sp", 1, "-r", 2, "-micro_batches", 2],
         {"tp": "tp", "pp": "pp", "embedding": "embedding"}, {("pp", "broadcast"): 4}),
        # ZeRO-1 on the grid (its buffer padded to dp x 128), and cp's ring with tp -sp and -r 2's rerun
        ("train_gpt2_3d", 4, "d2", ["-d", 2 * 2 * B * T, "-dp", 2, "-pp", 2, "-z", 1],
         ["-trainer", "3d", "-dp", 2, "-pp", 2, "-z", 1, "-micro_batches", 2],
         {"pp": "pp", "dp": "dp", "embedding": "embedding"}, {("pp", "broadcast"): 4, ("dp", "all_reduce"): 4}),
        ("train_gpt2_3d", 4, "d2", ["-d", B * T, "-cp", 2, "-tp", 2, "-sp", 1, "-r", 2],
         ["-trainer", "3d", "-cp", 2, "-tp", 2, "-sp", 1, "-r", 2], {"tp": "tp", "cp": "cp", "dp": "dp"},
         {("dp", "all_reduce"): 4}),
        # cp's all-gather instead of the ring: K,V gathered (forward, the rerun, the backward), dK,dV reduce-scattered
        ("train_gpt2_3d", 2, "d2", ["-d", B * T, "-cp", 2, "-cp_comm", "allgather", "-r", 2],
         ["-trainer", "3d", "-cp", 2, "-cp_comm", "allgather", "-r", 2], {"cp": "cp", "dp": "dp"},
         {("dp", "all_reduce"): 4}),
        # 5D: 4 experts, top-2, folded over dp 2 x tp 2 -sp at ep 2 (the all-to-alls follow the routing,
        # which the balanced rows do not: left out here)
        ("train_gpt2_3d", 4, "d2", ["-experts", 4, "-topk", 2, "-d", 2 * B * T, "-dp", 2, "-tp", 2, "-sp", 1, "-ep", 2,
                                    "-balance", "bias", "-z", 1],
         ["-experts", 4, "-topk", 2, "-trainer", "3d", "-dp", 2, "-tp", 2, "-sp", 1, "-ep", 2, "-z", 1],
         {"tp": "tp", "dp": "dp", "expert_dp": "edp"}, {("dp", "all_reduce"): 4}),
    ]
    for trainer, ranks, model, flags, inventory, groups, scalars in runs:
        d = fresh_dir(trainer)
        run_ok(ranks, ["-e", model, "-b", B, "-t", T, "-x", 1, "-v", 0, "-s", 0, "-o", d] + flags, program="./" + trainer)
        train, _ = read_log(d)
        counted = {}
        for group, kinds in train[1]["comm"].items():
            if group not in groups:
                continue
            for kind, n in kinds.items():
                n -= scalars.get((group, kind), 0)
                if n and kind != "recv":
                    counted[(groups[group], kind.replace("_", "-"))] = n
        res = step_kernels_json("-e", model, "-b", B, "-t", T, "-precision", "fp32", *inventory)
        rows = {k: v for k, v in step_kernels_link_sums(res).items() if k[0] != "ep"}
        assert rows == counted, "%s %s: the rows %s, the trainer counted %s" % (trainer, flags, rows, counted)
        if trainer == "train_gpt2_pp":  # stage 0 receives as many as it sends
            assert train[1]["comm"]["world"]["recv"] == rows[("pp", "send")], train[1]["comm"]
    # DiLoCo, 2 workers of one rank, -H 2: the outer step's all-reduce of P fp32 on steps 2 and 4,
    # the step line's 8 bytes on every step; the rows carry half of the outer step's a step
    d = fresh_dir("train_gpt2_diloco")
    run_ok(2, ["-e", "d2", "-b", B, "-t", T, "-x", 4, "-v", 0, "-s", 0, "-workers", 2, "-H", 2, "-o", d],
           program="./train_gpt2_diloco")
    train, _ = read_log(d)
    across = [train[s]["comm"]["across"]["all_reduce"] - 8 for s in (1, 2, 3, 4)]
    res = step_kernels_json("-e", "d2", "-b", B, "-t", T, "-precision", "fp32", "-trainer", "diloco", "-workers", 2, "-H", 2)
    assert across[0] == across[2] == 0 and across[1] == across[3], across
    assert step_kernels_link_sums(res) == {("across", "all-reduce"): across[1] / 2}, (step_kernels_link_sums(res), across)


@test
def step_kernels_recompute_adds_one_forward():
    """-r 2 keeps each layer's output only (model.h): before each layer's backward its forward runs
    again from ln1 to GELU, the same kernels with the same FLOPs and bytes (and with tp its
    collectives: L a more all-reduced, or with -sp L reduce-scattered and 2 L all-gathered), but
    not fcproj, its sum and bias, whose only reader, the residual, was kept; and GELU leaves the
    fc GEMM's epilogue for a kernel of its own in the forward too (its output is not kept). -r 1
    recomputes GELU, and with cuBLAS attention the attention forward; with flash attention GELU
    alone; under zero bubble (W reads GELU's output later, so it is kept) cuBLAS's attention alone"""
    L, C, B, T, X = 2, 128, 2, 64, 2
    N = B * T
    for trainer, extra in (("dp", ()), ("tp", ("-tp", 2)), ("tp", ("-tp", 2, "-sp", 1))):
        base = ("-e", "d2", "-b", B, "-t", T, "-trainer", trainer) + extra
        none, full = step_kernels_json(*base), step_kernels_json(*base, "-r", 2)
        what = "-trainer %s %s -r 2" % (trainer, " ".join(map(str, extra)))
        rerun = [r for r in full["rows"] if r["group"] == "layer recompute"]
        forward = {r["kernel"]: r for r in full["rows"] if r["group"] == "layer forward"}
        assert rerun[0]["kernel"] == "layernorm_forward (ln1, rerun)", rerun[0]
        ln1 = [r for r in full["rows"] if r["kernel"] == "layernorm_forward (ln1 of layer 0)"][0]
        assert (rerun[0]["flops"], rerun[0]["bytes"], rerun[0]["calls"]) == (ln1["flops"], ln1["bytes"], L), rerun[0]
        for r in rerun[1:]:
            f = forward[r["kernel"]]
            assert (r["flops"], r["bytes"], r["calls"], r["phase"]) == (f["flops"], f["bytes"], f["calls"], "backward_input"), (r, f)
        skipped = set(forward) - {r["kernel"] for r in rerun} - {"residual + layernorm (ln1 of the next layer)"}
        assert all("fcproj" in k for k in skipped) and skipped, (what, skipped)
        assert "gelu_forward" in forward, what + ": GELU still in the fc GEMM's epilogue"
        added = {k: v - step_kernels_link_sums(none).get(k, 0) for k, v in step_kernels_link_sums(full).items()}
        a = N * C * X
        want = {} if trainer == "dp" else {("tp", "all-reduce"): L * a} if "-sp" not in extra else \
            {("tp", "reduce-scatter"): L * a, ("tp", "all-gather"): 2 * L * a, ("tp", "all-reduce"): 0}
        assert {k: v for k, v in added.items() if v or k in want} == want, (what, added, want)
    for attention, zb, want in (("cublas", 0, {"gelu_forward", "attention_to_heads (q, k, v)", "gemm_batched scores = q k^T",
                                               "attention_softmax", "gemm_batched y = att v", "attention_from_heads (y)"}),
                                ("flash", 0, {"gelu_forward"}),
                                ("cublas", 1, {"attention_to_heads (q, k, v)", "gemm_batched scores = q k^T",
                                               "attention_softmax", "gemm_batched y = att v", "attention_from_heads (y)"})):
        res = step_kernels_json("-e", "d2", "-b", B, "-t", T, "-attention", attention, "-r", 1, "-trainer", "pp", "-zb", zb)
        got = {r["kernel"] for r in res["rows"] if r["group"] == "layer recompute"}
        assert got == want, "-r 1 %s -zb %d: recomputes %s, expected %s" % (attention, zb, got, want)


@test
def step_kernels_zero_moves_the_all_reduces_bytes():
    """train_gpt2_dp's ZeRO on 4 ranks, 2 micro-batches, d2 in bf16: each bucket padded to a
    multiple of 4 x 128 elements (the embeddings (Vp + maxT) C, each layer 12 C^2 + 13 C, the final
    LayerNorm 2 C): Psi. -z 1 reduce-scatters the gradients and all-gathers the parameters once a
    step, 2 (n-1)/n X Psi on the link: the all-reduce's bytes but for the padding. -z 2 reduce-scatters
    every micro-batch's buckets, -z 3 also gathers the parameters twice a micro-batch (forward and
    backward) and never after the update. The norm and AdamW run on Psi/4; -offload puts AdamW on
    the host and the shard's gradients and parameters (2 X Psi/4) over PCIe"""
    L, C, X, n, m, Vp, maxT = 2, 128, 2, 4, 2, 50304, 1024
    pad = lambda k: -(-k // (n * 128)) * n * 128  # noqa: E731
    psi = pad((Vp + maxT) * C) + L * pad(12 * C * C + 13 * C) + pad(2 * C)
    P = step_kernels_parameters(L, C)
    base = ("-e", "d2", "-b", 2, "-t", 64, "-dp", n, "-micro_batches", m)
    link = lambda res: step_kernels_total(res, "bytes", engine="link")  # noqa: E731
    z0 = step_kernels_json(*base)
    roofline_close(link(z0), 2 * (n - 1) / n * P * X, 1e-12, "-z 0 all-reduce")
    z1 = step_kernels_json(*base, "-z", 1)
    roofline_close(link(z1), 2 * (n - 1) / n * psi * X, 1e-12, "-z 1: reduce-scatter + all-gather")
    assert step_kernels_link_sums(z1) == {("dp", "reduce-scatter"): psi * X, ("dp", "all-gather"): psi * X}
    assert 0 < link(z1) - link(z0) < 2 * (n - 1) / n * (L + 2) * n * 128 * X, "-z 1 pads each bucket by less than n 128"
    for z, want in ((2, {("dp", "reduce-scatter"): m * psi * X, ("dp", "all-gather"): psi * X}),
                    (3, {("dp", "reduce-scatter"): m * psi * X, ("dp", "all-gather"): 2 * m * psi * X})):
        assert step_kernels_link_sums(step_kernels_json(*base, "-z", z)) == want, z
    for z in (1, 2, 3):
        res = step_kernels_json(*base, "-z", z)
        assert step_kernels_total(res, "flops", kernel="norm_squared_partial") == 2 * psi // n, z
    off = step_kernels_json(*base, "-z", 1, "-offload", 1)
    host = [r for r in off["rows"] if r["engine"] == "host"]
    assert len(host) == 1 and host[0]["flops"] == 20 * psi // n and "adamw" in host[0]["kernel"], host
    assert step_kernels_link_sums(off)[("pcie", "copy")] == 2 * psi // n * X


STEP_KERNELS_RUN_C = r"""
// step_kernels_run with a RunLayout, as the planner and a time model call it: each row on a line
#include <stdlib.h>
#include "llmc/memory_plan.h"
#include "llmc/step_kernels.h"
int main(int argc, char** argv) {
    GPT2Config c;
    gpt2_config_from_descriptor(argv[1], &c);
    int* v = (int*)calloc(32, sizeof(int));
    for (int i = 2; i < argc; i++) v[i - 2] = atoi(argv[i]);
    RunLayout r;
    memset(&r, 0, sizeof(r));
    r.trainer = (TrainerKind)v[0], r.dp = v[1], r.tp = v[2], r.pp = v[3], r.V = v[4], r.sched = (PipeSchedule)v[5];
    r.m = v[6], r.B = v[7], r.T = v[8], r.zero = v[9], r.sp = v[10], r.recompute = v[11], r.offload = v[12];
    r.overlap = v[13], r.cp = v[14];
    StepOptions o = {.X = v[16], .flash = v[17], .bias_epilogue = 1, .gelu_epilogue = v[16] == 2, .ln_backward_fused = 1};
    StepKernel rows[STEP_KERNELS_MAX];
    int n = step_kernels_run(rows, STEP_KERNELS_MAX, c, &r, v[15], o);
    for (int i = 0; i < n; i++) {
        printf("%s|%lld|%.17g|%.17g|%s|%u|%.17g\n", rows[i].kernel, (long long)rows[i].calls, rows[i].flops, rows[i].bytes,
               step_phase_name(rows[i].phase), rows[i].chunks, rows[i].payload);
    }
    return 0;
}
"""


@test
def step_kernels_run_reads_the_memory_planners_layout():
    """step_kernels_run (llmc/step_kernels.h with llmc/memory_plan.h included first, built with MPI's
    compiler as the planner is) gives for a RunLayout the rows dev/bench/step_kernels gives for the
    same layout in its flags: train_gpt2_dp -z 2 -overlap, train_gpt2_tp -sp, a zero-bubble stage of
    train_gpt2_pp with -r 1, train_gpt2_3d's stage 1 with interleaving, ZeRO-1 and cp"""
    d = fresh_dir("step_kernels_run")
    src, exe = os.path.join(d, "run.c"), os.path.join(d, "run")
    with open(src, "w") as f:
        f.write(STEP_KERNELS_RUN_C)
    p = subprocess.run(["mpicc", "-O1", "-std=c11", "-D_POSIX_C_SOURCE=200809L", "-D_DEFAULT_SOURCE", "-fopenmp", "-I", ROOT,
                        src, "-o", exe, "-lm", "-lz"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-3000:]
    trainers = {"dp": 0, "tp": 1, "pp": 2, "3d": 3}  # (llmc/memory_plan.h's TrainerKind)
    scheds = {"afab": 0, "1f1b": 1, "interleaved": 2, "zb": 3}  # (llmc/pipeline.h's PipeSchedule)
    for trainer, dp, tp, pp, V, sched, m, zero, sp, r, overlap, cp, stage in (
            ("dp", 4, 1, 1, 1, "1f1b", 2, 2, 0, 0, 1, 1, 0), ("tp", 1, 2, 1, 1, "1f1b", 1, 0, 1, 0, 0, 1, 0),
            ("pp", 1, 1, 2, 1, "zb", 4, 0, 0, 1, 0, 1, 1), ("3d", 2, 2, 2, 2, "interleaved", 4, 1, 1, 2, 0, 2, 1)):
        args = [trainers[trainer], dp, tp, pp, V, scheds[sched], m, 2, 64, zero, sp, r, 0, overlap, cp, stage, 2, 1]
        p = subprocess.run([exe, "d4"] + [str(a) for a in args], capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr[-2000:]
        got = [line.split("|") for line in p.stdout.splitlines()]
        res = step_kernels_json("-e", "d4", "-b", 2, "-t", 64, "-trainer", trainer, "-dp", dp, "-tp", tp, "-pp", pp, "-vp", V,
                                "-micro_batches", m, "-z", zero, "-sp", sp, "-r", r, "-overlap", overlap, "-cp", cp,
                                "-stage", stage, "-zb", int(sched == "zb"), "-attention", "flash")
        want = [[w["kernel"], str(w["calls"]), "%.17g" % w["flops"], "%.17g" % w["bytes"], w["phase"], str(w["chunks"]),
                 "%.17g" % w["payload"]] for w in res["rows"]]
        assert got == want, "%s: step_kernels_run's rows differ from the CLI's:\n%s\n%s" % (
            trainer, "\n".join(map(str, got)), "\n".join(map(str, want)))


@test
def step_kernels_experts_fold_and_capacity():
    """5D (-trainer 3d): a tp rank of -sp routes its N/tp tokens (with -sp the tp ranks split the
    tokens, the experts are whole), so its experts' rows, the router's and the all-to-alls are 1/tp
    of the tp = 1 rank's, and no tp collective surrounds the MoE: per micro-batch 2 L + 2 of them
    each kind (train_gpt2_3d's formula). A capacity factor cf caps each expert at
    cap = ceil(cf N k / E) slots of a rank's N tokens: under balanced routing (N k / E each) the
    rank's experts take min(N k, E cap) rows, so cf = 0.5 halves the experts' FLOPs and the
    all-to-alls, and cf = 1 changes nothing"""
    L, C, B, T, X, E, k = 2, 128, 2, 64, 2, 8, 2
    N = B * T
    base = ("-e", "2/128/4", "-b", B, "-t", T, "-experts", E, "-topk", k, "-trainer", "3d", "-dp", 2, "-ep", 2)
    def moe(res, field, router=True):
        """the experts' matmul FLOPs (fc and fcproj, forward, dinp, dweight; and the router's), or
        the all-to-alls' bytes"""
        if field == "flops":
            return sum(r["flops"] * r["calls"] for r in res["rows"] if r["op"] == "matmul" and
                       ("fc" in r["kernel"] or (router and "router" in r["kernel"])))
        return sum(r["bytes"] * r["calls"] for r in res["rows"] if r["collective"] == "all-to-all")
    one = step_kernels_json(*base)
    for tp in (2, 4):
        sp = step_kernels_json(*base, "-tp", tp, "-sp", 1)
        for field in ("flops", "bytes"):
            roofline_close(moe(sp, field), moe(one, field) / tp, 1e-12, "-tp %d -sp 1: the MoE's %s" % (tp, field))
        sums = step_kernels_link_sums(sp)
        assert sums[("tp", "reduce-scatter")] == sums[("tp", "all-gather")] == (2 * L + 2) * N * C * X, sums
    for cf, share in ((1.0, 1.0), (0.5, 0.5)):
        capped = step_kernels_json(*base, "-capacity_factor", cf)
        cap = -(-int(cf * N * k) // E)
        assert min(N * k, E * cap) == share * N * k
        for field in ("flops", "bytes"):
            roofline_close(moe(capped, field, router=False), share * moe(one, field, router=False), 1e-12,
                           "-capacity_factor %g: the experts' %s" % (cf, field))


@test
def step_kernels_every_hidden_by_names_compute_that_runs():
    """a link row's hidden_by names the compute it may run under (a kernel, a group or a kind of
    launch), and the time model hides it only behind rows of that name: a name no compute row has
    would leave the collective exposed whatever the overlap flag says (the -z 1/2 parameter
    all-gather once named "adamw", which no row was). For every layout with an overlap rule (DDP
    and ZeRO 1-3 with -overlap, -offload, -tp_overlap, cp's ring forward and backward) each hidden_by
    matches a compute row of the same step"""
    layouts = [("-dp", 4, "-overlap", 1), ("-dp", 4, "-z", 1, "-overlap", 1), ("-dp", 4, "-z", 2, "-overlap", 1),
               ("-dp", 4, "-z", 3, "-overlap", 1), ("-dp", 4, "-z", 1, "-offload", 1, "-overlap", 1),
               ("-dp", 2, "-offload", 1, "-overlap", 0), ("-trainer", "tp", "-tp", 2, "-sp", 1, "-tp_overlap", 1),
               ("-trainer", "cp", "-cp", 2), ("-trainer", "3d", "-cp", 2, "-dp", 2, "-r", 2)]
    seen = 0
    for flags in layouts:
        rows = step_kernels_json("-e", "d2", "-b", 2, "-t", 64, *flags)["rows"]
        names = set()
        for r in rows:
            if r["engine"] != "link":
                names.update((r["kernel"], r["group"], r["launch"]))
        for r in rows:
            if r["engine"] == "link" and r["hidden_by"]:
                seen += 1
                assert r["hidden_by"] in names, "%s: %s hides behind %r, which no compute row is" % (
                    " ".join(map(str, flags)), r["kernel"], r["hidden_by"])
    assert seen >= 10, "only %d link rows with a hidden_by over the layouts" % seen


def step_kernels_time_kind(r):
    """the part of the planner's time_parts a compute row's time is in, as the test reads
    llmc/step_time.h's rule: every row of attention's (its kernels; on the unfused path the GEMMs,
    softmax, dropout and layout changes) is attention's, other GEMMs gemm, the rest memory"""
    if r["engine"] == "host":
        return "host"
    if r["op"] == "attention" and r["engine"] != "memset":
        return "attention"
    return "gemm" if r["engine"] == "gemm" else "memory"


@test
def step_kernels_profile_prices_the_rows_as_the_planner():
    """dev/bench/step_kernels -profile h100-sxm: each row's "seconds" is llmc/step_time.h's price of
    it, the function the planner plays a layout with; on three layouts (dp, tp -sp, cp) the compute
    rows summed by part (gemm, attention, memory) equal dev/memory_planner's time_parts for the same
    layout on the same profile, and the top-level "seconds" is the compute rows' sum; a collective's
    row is its time before overlap (on a GPU, > 0); an unknown profile is refused by name"""
    p = make(["dev/memory_planner", "dev/bench/step_kernels"])
    assert p.returncode == 0, p.stdout.decode()[-3000:]
    base = ["-e", "d12", "-b", 8, "-t", 1024]
    layouts = {"dp": ["-dp", 2], "tp -sp": ["-trainer", "tp", "-tp", 2, "-sp", 1], "cp": ["-trainer", "cp", "-cp", 2]}
    for name, flags in layouts.items():
        res = step_kernels_json(*(base + flags + ["-profile", "h100-sxm"]))
        assert res["profile"] == "h100-sxm", res["profile"]
        parts = {"gemm": 0.0, "attention": 0.0, "memory": 0.0, "host": 0.0}
        for r in res["rows"]:
            assert r["seconds"] > 0, "%s: %s priced %r" % (name, r["kernel"], r["seconds"])
            if r["engine"] != "link":
                parts[step_kernels_time_kind(r)] += r["seconds"]
        # the same sums in the same order: only the last bits of the float sums differ
        roofline_close(res["seconds"], sum(parts.values()), 1e-12, name + ": the kernels' seconds")
        code, text = planner(*(base + flags + ["-profile", "h100-sxm", "-format", "json"]))
        assert code == 0, "%s: %s" % (name, text[-2000:])
        planned = json.loads(text)["time_parts"]
        for part, seconds in parts.items():
            # the planner prints each part with %.9g: rounded to 9 significant digits, 5e-9 of itself
            roofline_close(seconds, planned[part], 5e-9, "%s: the %s part" % (name, part))
        print("    %s: kernels %.4f ms (gemm %.4f, attention %.4f, memory %.4f), collectives before overlap %.4f ms" % (
            name, res["seconds"] * 1e3, parts["gemm"] * 1e3, parts["attention"] * 1e3, parts["memory"] * 1e3,
            sum(r["seconds"] for r in res["rows"] if r["engine"] == "link") * 1e3))
    p = subprocess.run(["./dev/bench/step_kernels", "-profile", "no-such-gpu"], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode != 0 and "-profile no-such-gpu" in p.stderr, (p.returncode, p.stderr)


@test
def step_kernels_roofline_predicts_the_kernels_seconds():
    """dev/bench/roofline.py's predicted step is step_kernels' "seconds" on the profile it names
    (default: -device's built-in), and each of its rows the row's price: one model, in C"""
    p = make(["dev/bench/step_kernels"])
    assert p.returncode == 0, p.stdout.decode()[-3000:]
    for device, profile in (("h100-sxm", "h100-sxm"), ("a100", "a100-80gb")):
        res = step_kernels_json("-e", "d12", "-b", 4, "-t", 256, "-dp", 2, "-profile", profile)
        cmd = ["/usr/bin/python3", "dev/bench/roofline.py", "-e", "d12", "-b", 4, "-t", 256, "-dp", 2, "-device", device,
               "-json"]
        p = subprocess.run([str(a) for a in cmd], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr[-2000:]
        table = json.loads(p.stdout)
        assert table["assumptions"]["profile"] == profile, table["assumptions"]
        # the same doubles, read back from %.17g and summed in the same order
        roofline_close(table["summary"]["step_time_s"], res["seconds"], 1e-12, device + ": the predicted step")
        assert [r["total_time_s"] for r in table["rows"]] == [r["seconds"] for r in res["rows"]], device
