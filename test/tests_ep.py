# Tests of the Mixture-of-Experts trainer (train_gpt2_ep.cu, llmc/moe.h): read into
# test/run_tests.py's namespace, so its helpers (test, run_ok, mpirun, fresh_dir, make, MOE,
# moe_reference, moe_figures, small_run_args, data_args, read_log, ...) are used as if written
# there, collapsed_moe_model among them (a model whose router weights
# are all zero: every token's scores tie at 0, so its top-k are experts 0..k-1, ties going to the
# lower index).


@test
def sanitized_ep_sampling_with_a_small_capacity():
    """a capacity far below the load (-capacity_factor 0.1) and samples as long as the sequence,
    under AddressSanitizer, on 1 rank and on 2 ranks at ep 2: a sample's pass routes with the
    training capacity, so its rows fit the buffers sized for it. (Before, the sample's pass ran
    dropless: up to t k rows an expert where the buffers held ceil(0.1 N k / E) = 4, a heap
    overflow in moe_exchange; at ep 2 an all-to-all larger than its receive buffer)"""
    p = make(["build/sanitize/train_gpt2_ep"], timeout=600)
    assert p.returncode == 0, p.stdout.decode("utf-8", "replace")[-3000:]
    env = dict(ASAN_OPTIONS="detect_leaks=0")  # MPI's own allocations live until exit
    moe = os.path.join(moe_reference(4, 2)["dir"], "model.bin")
    for ranks, ep in ((1, 1), (2, 2)):
        d = fresh_dir("sanitized_ep_small_capacity_np%d" % ranks)
        # B 2 x T 32 a rank, E 4, top-2: capacity ceil(0.1 x 64 x 2 / 4) = 4 slots an expert; a
        # sample of 32 tokens routes up to 31 x 2 slots
        args = small_run_args(d, ["-e", moe, "-x", 2, "-n", 0, "-v", 0, "-s", 2, "-g", 32, "-ep", ep,
                                  "-capacity_factor", 0.1], cfg=MOE)
        out = run_ok(ranks, args, program="./build/sanitize/train_gpt2_ep", env=env, timeout=240)
        assert "AddressSanitizer" not in out and "runtime error:" not in out, out[-3000:]
        assert "---- sample at step 2 ----" in out, out[-3000:]


def moe_lines(out):
    """rank 0's MoE lines: {step: {"min", "mean", "max", "max_vio", "dropped" (a share), "all_to_all"
    (None where the line has none), and with -balance bias "bias": (lo, hi)}}"""
    lines = {}
    for m in re.finditer(r"^step (\d+) moe: aux loss [\d.]+ \| tokens per expert min (\d+) mean ([\d.]+) max (\d+) \| "
                         r"MaxVio ([\d.]+) \| dropped ([\d.]+)%(?: \| all-to-all (\d+) B)?(?: \| bias ([-\d.]+)\.\.([-\d.]+))?$",
                         out, re.M):
        s = m.groups()
        lines[int(s[0])] = dict(min=float(s[1]), mean=float(s[2]), max=float(s[3]), max_vio=float(s[4]),
                                dropped=float(s[5]) / 100, all_to_all=int(s[6]) if s[6] is not None else None,
                                bias=(float(s[7]), float(s[8])) if s[7] is not None else None)
    return lines


def ep_state_bias(d, step, L, E):
    """the routing bias (L E floats) in the EP trainer's checkpoint of `step` in d: the trainer's own
    state, the last bytes of its gathered state file (llmc/checkpoint.h: header, identity, m, v,
    then the extra bytes)"""
    with open(os.path.join(d, "state_%08d.bin" % step), "rb") as f:
        data = f.read()
    header = np.frombuffer(data[:1024], dtype=np.int32)
    extra = int(header[9]) | int(header[10]) << 32
    assert extra >= 4 * L * E, "state file's extra bytes %d, expected at least the bias's %d" % (extra, 4 * L * E)
    return np.frombuffer(data[len(data) - 4 * L * E:], dtype=np.float32).reshape(L, E).astype(np.float64)


@test
def ep_bias_range_is_the_biases():
    """-balance bias's printed range is the smallest and largest bias. A zero router at top-1: each
    step every token takes the expert of largest bias (the lowest index on a tie), which then
    loses gamma while the others gain it: b = (-1, 1, 1, 1) gamma after step 1, (0, 0, 2, 2) after
    step 2, (1, 1, 1, 3) after step 3 in every layer, all positive. (The router stays 0: at top-1
    a token's one gate is 1 whatever its score, so the router has no gradient, and -balance bias
    adds no loss.) The checkpoint's state holds those values; the line prints their min and max
    (0.0010..0.0030; the old code started both from 0 and printed 0.0000..0.0030)"""
    E, L, gamma = 4, MOE["layers"], 1e-3
    d = fresh_dir("ep_bias_range")
    model = collapsed_moe_model(d, E, 1)
    out = run_ok(2, ["-e", model] + data_args(MOE) + ["-b", 2, "-t", MOE["seq_len"], "-x", 3, "-n", 3, "-v", 0, "-s", 0,
                                                       "-ep", 2, "-balance", "bias", "-bias_rate", gamma,
                                                       "-o", os.path.join(d, "run")], program="./train_gpt2_ep")
    bias = ep_state_bias(os.path.join(d, "run"), 3, L, E)
    expected = np.tile(np.array([1, 1, 1, 3]) * gamma, (L, 1))
    assert np.abs(bias - expected).max() <= 1e-9, "bias %s, expected %s (fp32 sums of gamma: 1e-9)" % (bias, expected)
    lo, hi = moe_lines(out)[3]["bias"]
    # (printed to 4 decimals: half a unit of the last, 5e-5, and fp32's rounding of gamma sums)
    assert abs(lo - bias.min()) <= 5.1e-5 and abs(hi - bias.max()) <= 5.1e-5, (
        "printed bias %g..%g, the state's %g..%g" % (lo, hi, bias.min(), bias.max()))


@test
def ep_non_finite_names_where_and_the_aux_loss():
    """a non-finite gradient norm or loss stops the run naming where it first appears and the
    flags that could have caused it. -aux_alpha 1e30: the cross-entropy's gradients stay finite,
    and the backward first meets the aux loss's gradient, alpha E f / (B T) times the router's
    input, at the router of the last layer (the final LayerNorm and that layer's experts come
    before it): its squares pass fp32's 3.4e38, so the norm is inf, and the error names
    -aux_alpha. -l 1e30: the first update moves every weight by about 1e30, so step 2's first
    product of two weights, layer 0's qkv (ln1 x qkvw), overflows and the loss is not finite"""
    L = MOE["layers"]
    moe = os.path.join(moe_reference(4, 2)["dir"], "model.bin")
    for name, flags, where in (("aux", ["-aux_alpha", 1e30], "routerw of layer %d" % (L - 1)),
                               ("lr", ["-l", 1e30, "-gc", 0], "first non-finite values: layer 0's qkv")):
        d = fresh_dir("ep_non_finite_" + name)
        code, out = mpirun(2, ["-e", moe] + data_args(MOE) + ["-b", 2, "-t", MOE["seq_len"], "-x", 3, "-v", 0, "-s", 0,
                                                               "-ep", 2, "-o", d] + flags, program="./train_gpt2_ep")
        assert code != 0, "a non-finite run exited 0:\n" + out[-2000:]
        assert where in out, "expected '%s' named:\n%s" % (where, out[-3000:])
        assert "try a lower -l, or -aux_alpha" in out, out[-3000:]
        assert "step 1: the gradient norm is inf" in out if name == "aux" else "step 2: the loss is" in out, out[-3000:]


@test
def ep_zero_router_worked_example():
    """The EP chapter's worked example, by hand. A router of zeros scores every expert 0 for every
    token, so each token's top-k are experts 0..k-1 (ties go to the lower index). Here E = 4,
    k = 2, 2 ranks at ep 2 (experts 0, 1 on rank 0), B = 4 x T = 32: N = 128 tokens a rank, one
    step of G = 2 N = 256 tokens, C = 64 channels, X = 4 bytes (fp32), L = 2 layers.
      tokens per expert (per layer, over the global batch): experts 0..k-1 take every token, G;
          the others none; mean G k / E = 128. Printed min 0 mean 128.0 max 256.
      MaxVio = max / mean - 1 = G / (G k / E) - 1 = E / k - 1 = 1.
      capacity c = ceil(cf N k / E) slots an expert of a rank's micro-batch: each of experts
          0..k-1 is offered N slots, keeps min(c, N): dropped share 1 - min(c, N) / N.
          cf 0 (dropless): c = N, 0%. cf 1.0: c = 64, 50%. cf 1.25: c = 80, 37.5%.
      all-to-all bytes a rank sends in a step: rank 1 sends its k c kept slots out (forward) and
          their output gradients (backward); rank 0 sends their outputs home (forward) and their
          input gradients (backward): 2 k c C X each, a layer, plus the counts, E/ep ints to the
          other rank: L (2 k c C X + 4 E/ep (ep - 1)) = 2 (2 x 2 c x 64 x 4 + 8) = 2048 c + 16:
          dropless 262160, cf 1.0 131088, cf 1.25 163856 bytes.
    The moe line prints these figures, and main.log's all-to-all bytes agree. (And the banner's
    memory table has its header line.)"""
    E, k, ranks, ep, B = 4, 2, 2, 2, 4
    T, C, L, X = MOE["seq_len"], MOE["channels"], MOE["layers"], 4
    N = B * T
    G = ranks * N
    d = fresh_dir("ep_worked_example")
    model = collapsed_moe_model(d, E, k)
    assert (T, C, L) == (32, 64, 2), "the docstring's figures are for T 32, C 64, L 2"
    for cf, c, dropped, sent in ((0.0, N, 0.0, 262160), (1.0, 64, 0.5, 131088), (1.25, 80, 0.375, 163856)):
        # the hand figures above, and the formulas they came from
        assert c == (N if cf == 0 else math.ceil(cf * N * k / E)) and dropped == 1 - min(c, N) / N
        assert sent == L * (2 * k * c * C * X + 4 * (E // ep) * (ep - 1))
        run = os.path.join(d, "cf%g" % cf)
        out = run_ok(ranks, ["-e", model] + data_args(MOE) + ["-b", B, "-t", T, "-x", 1, "-v", 0, "-s", 0, "-ep", ep,
                                                               "-balance", "none", "-capacity_factor", cf, "-o", run],
                     program="./train_gpt2_ep")
        line = moe_lines(out)[1]
        assert (line["min"], line["mean"], line["max"]) == (0, G * k / E, G), line
        assert line["max_vio"] == E / k - 1, line
        assert abs(line["dropped"] - dropped) <= 5e-7, line  # (printed to 4 decimals of a percent)
        assert line["all_to_all"] == sent, (line, sent)
        train, _ = read_log(run)
        assert train[1]["comm"]["ep"]["all_to_all"] == sent, train[1]["comm"]
    # the banner's memory table opens, as the other trainers' do, with the line saying what Psi is:
    # this rank's parameters, the replicated ones and its E/ep experts (moe_params: by formula)
    replicated, per_expert = moe_params(MOE, E)
    m = re.search(r"^memory per rank, Psi = this rank's parameters .*: (\d+) of the model's (\d+)\):\n  parameters ", out, re.M)
    assert m, "no memory table header line:\n" + out[:3000]
    assert (int(m.group(1)), int(m.group(2))) == (replicated + per_expert * E // ep, replicated + per_expert * E), m.group(0)


@test
def ep_moe_line_prints_the_steps_all_to_all_bytes():
    """the all-to-all's bytes follow the routing, so they change from step to step: each step's moe
    line prints rank 0's, equal to main.log's (the comm layer's count) at every step of a run
    whose routing moves (4 steps of E = 4, top-2, at ep 2 on 2 ranks); the bytes block, printed
    when the bytes change, leaves them out and so prints once"""
    d = fresh_dir("ep_moe_line_bytes")
    moe = os.path.join(moe_reference(4, 2)["dir"], "model.bin")
    out = run_ok(2, ["-e", moe] + data_args(MOE) + ["-b", 2, "-t", MOE["seq_len"], "-x", 4, "-v", 0, "-s", 0, "-ep", 2,
                                                     "-o", d], program="./train_gpt2_ep")
    lines, (train, _) = moe_lines(out), read_log(d)
    printed = [lines[s]["all_to_all"] for s in range(1, 5)]
    assert printed == [train[s]["comm"]["ep"]["all_to_all"] for s in range(1, 5)], (printed, train)
    assert len(set(printed)) > 1, "the bytes never changed (%s): the run does not test a changing count" % printed
    # the bytes block prints once, after step 1 (every other collective's bytes are the same each
    # step), without the all-to-all, which the moe line has
    blocks = re.findall(r"^bytes this rank moved per step, from step (\d+) .*\n((?:  .*\n)*)", out, re.M)
    assert [b[0] for b in blocks] == ["1"], "the bytes block printed from steps %s, expected 1 only" % [b[0] for b in blocks]
    assert "all_to_all" not in blocks[0][1] and "ep        all_reduce 4 B" in blocks[0][1], blocks[0][1]
