# dev/memory_planner (and dev/memory.html, its WebAssembly build) planning 5D layouts: a
# Mixture-of-Experts model in the grid trainer, train_gpt2_3d with -experts, the experts folded
# over each pipeline stage's dp x cp x tp ranks (-ep of them hold the E experts). Read into
# test/run_tests.py's namespace, so its helpers (test, run_ok, mpirun, fresh_dir, planner, MOE,
# moe_reference, trainer_args, check_planner_matches_trainer, D3, MemoryPageDom, memory_page_url,
# tool, Skip, ...) are used as if written here.

# (name, ranks, grid flags, B): each a way the experts fold. dp alone in the grid trainer (not
# train_gpt2_ep: -trainer 3d); over a stage's tp (with -sp) and over cp x tp with two stages, where
# each stage holds its own experts and several micro-batches are in flight (a record a slot); a
# capacity factor over dp x cp (the experts' buffers sized for a rank's capped rows); a
# checkpoint (-n), whose gathers have their row; and ZeRO-1's two shards (the dense tensors' over
# dp, the experts' over edp) with a checkpoint that gathers both
PLANNER_5D = [
    ("dp2_ep2", 2, ["-dp", 2, "-ep", 2], 4),
    ("pp2_tp2_sp_ep2", 4, ["-pp", 2, "-tp", 2, "-sp", 1, "-ep", 2], 8),
    ("pp2_cp2_tp2_sp_ep4", 8, ["-pp", 2, "-cp", 2, "-tp", 2, "-sp", 1, "-ep", 4, "-sched", "afab"], 4),
    ("dp2_cp2_ep4_cf", 4, ["-dp", 2, "-cp", 2, "-ep", 4, "-capacity_factor", 1.25], 4),
    ("dp2_pp2_ep2_ckpt", 4, ["-dp", 2, "-pp", 2, "-ep", 2, "-sched", "zb", "-n", 1], 2),
    ("dp2_tp2_sp_ep2_z1", 4, ["-dp", 2, "-tp", 2, "-sp", 1, "-ep", 2, "-z", 1, "-n", 1], 4),
]


def planner_5d_case(name, ranks, flags, B):
    def fn():
        E, k = 4, 2
        ref = moe_reference(E, k)  # (its model file: the MoE model of MOE's shapes, E = 4, top-2)
        d = fresh_dir("planner_5d_" + name)
        # one step is enough: the table is printed at the start, the high-water mark at the end
        args = trainer_args(ref, B, d, list(flags), cfg=dict(MOE, steps=1))
        out = run_ok(ranks, args, program=D3)
        # the table rank 0 printed, row for row, is the planner's; its total the high-water mark
        # (to the byte on the CPU backend: check_memory_table_total, inside)
        check_planner_matches_trainer(D3, ranks, args, out)
        # the planner's command for the layout names the fifth axis: the experts, top-k and ep
        pairs = dict(zip(flags[0::2], flags[1::2]))
        planned = ["-e", args[args.index("-e") + 1], "-b", B, "-t", MOE["seq_len"], "-trainer", "3d", "-device", "cpu",
                   "-experts", E, "-topk", k] + [a for f, v in pairs.items() if f != "-n" for a in (f, v)]
        if "-dp" not in pairs:
            planned += ["-dp", ranks // (pairs.get("-pp", 1) * pairs.get("-cp", 1) * pairs.get("-tp", 1))]
        code, text = planner(*(planned + ["-format", "json"]))
        assert code == 0, "%s: exit %d\n%s" % (planned, code, text)
        command = json.loads(text)["command"]
        assert ("-experts %d -topk %d -ep %d" % (E, k, pairs["-ep"])) in command and "./train_gpt2_3d" in command, command
    fn.__name__ = "planner_5d_table_is_the_grid_trainers_" + name
    fn.__doc__ = ("dev/memory_planner -trainer 3d -experts 4 -topk 2 %s: the memory table train_gpt2_3d printed on %d "
                  "ranks, byte for byte, its total the run's high-water mark; its command carries -experts, -topk and "
                  "-ep" % (" ".join(map(str, flags)), ranks))
    return fn


for _case in PLANNER_5D:
    test(planner_5d_case(*_case))


# the layouts train_gpt2_3d refuses with experts (grid_add_experts), each on the ranks it names:
# the planner refuses them too, with the trainer's own message
PLANNER_5D_REFUSED = [
    (4, ["-dp", 2, "-tp", 2, "-sp", 1, "-ep", 8], "-ep 8: the E = 4 experts"),            # ep does not divide E
    (4, ["-dp", 2, "-pp", 2, "-ep", 4], "a stage's dp x cp x tp = 2 ranks"),             # nor a stage's ranks
    (2, ["-tp", 2, "-ep", 2], "-tp 2 with experts needs -sp 1"),                         # each token routed twice
    (2, ["-dp", 2, "-r", 1, "-ep", 2], "-r 1 with experts"),                              # no recomputation of MoE
]


@test
def planner_5d_refuses_what_the_grid_trainer_refuses():
    """each layout train_gpt2_3d refuses for a model with experts (ep not dividing E, or not a
    stage's dp x cp x tp ranks; -tp without -sp; -r): the trainer stops with an error and
    the planner exits 1 with that very message, not a plan"""
    ref = moe_reference(4, 2)
    model = os.path.join(ref["dir"], "model.bin")
    for ranks, flags, words in PLANNER_5D_REFUSED:
        d = fresh_dir("planner_5d_refused")
        code, trained = mpirun(ranks, trainer_args(ref, 2, d, list(flags), cfg=dict(MOE, steps=1)), program=D3)
        assert code != 0 and words in trained, "train_gpt2_3d %s: exit %d, expected '%s' in\n%s" % (
            flags, code, words, trained[-2000:])
        pairs = dict(zip(flags[0::2], flags[1::2]))
        grid = [a for f, v in pairs.items() for a in (f, v)]
        if "-dp" not in pairs:
            grid += ["-dp", ranks // (pairs.get("-pp", 1) * pairs.get("-tp", 1))]
        code, planned = planner("-e", model, "-b", 2, "-t", MOE["seq_len"], "-device", "cpu", "-trainer", "3d", *grid)
        message = planned.strip().splitlines()[-1]
        assert code == 1 and message.startswith("error: ") and words in message, "planner %s: exit %d\n%s" % (
            grid, code, planned)
        # the trainer's line, rank prefix aside, is the planner's
        assert message[len("error: "):] in trained, "planner: %r\ntrain_gpt2_3d:\n%s" % (message, trained[-1500:])
    # and on a dense model the expert flags have nothing to act on
    for flags, words in ((["-ep", 2, "-dp", 2], "-ep 2 splits the experts"),
                         (["-capacity_factor", 1, "-dp", 2], "-capacity_factor 1 caps the experts"),
                         (["-capacity_factor", 1, "-search", 2], "-capacity_factor 1 caps the experts")):
        code, planned = planner("-e", "d12", "-trainer", "3d", *flags) if "-search" not in flags else planner("-e", "d12", *flags)
        assert code == 1 and words in planned, "planner %s: exit %d\n%s" % (flags, code, planned)


def planner_5d_search_rows(*flags):
    """dev/memory_planner -search ... -format json: its layouts"""
    code, text = planner(*(list(flags) + ["-format", "json"]))
    assert code == 0, "%s: exit %d\n%s" % (flags, code, text)
    return json.loads(text)["layouts"]


@test
def planner_5d_search_folds_ep_over_each_stages_ranks():
    """-search 8 for a model of 8 experts: every layout uses the 8 devices for its dp x tp x pp x cp
    grid alone (the experts fold over them, no ranks of their own); each grid the dense model's
    search allows appears, at -r 0 and with -sp 1 where tp > 1 (what the trainer runs with
    experts), once for every ep dividing both E and a stage's dp x cp x tp ranks, and never at
    another ep, at -z 0 and, in train_gpt2_3d with dp x cp > 1 ranks to shard over, -z 1; dp alone
    is train_gpt2_ep's (no -z), every other grid train_gpt2_3d's; each row's total is the
    planner's plan of its flags alone"""
    E, N = 8, 8
    common = ["-e", "d4", "-b", 2, "-t", 256, "-device", "cpu", "-mem", 1000, "-search", N]
    moe = planner_5d_search_rows(*(common + ["-experts", E, "-topk", 2]))
    dense = planner_5d_search_rows(*common)
    runnable = {(l["dp"], l["tp"], l["pp"], l["cp"], l["cp_comm"]) for l in dense
                if l["z"] == 0 and l["r"] == 0 and l["offload"] == 0 and l["sp"] == (l["tp"] > 1)}
    assert len(runnable) >= 10, runnable  # (a search wide enough to mean something)
    def alone(g):  # (dp alone: train_gpt2_ep)
        return g[1] == 1 and g[2] == 1 and g[3] == 1
    expected = {g + (ep, z) for g in runnable for ep in range(1, N + 1) for z in (0, 1)
                if E % ep == 0 and (g[0] * g[1] * g[3]) % ep == 0 and (z == 0 or (not alone(g) and g[0] * g[3] > 1))}
    found = [(l["dp"], l["tp"], l["pp"], l["cp"], l["cp_comm"], l["ep"], l["z"]) for l in moe]
    assert len(found) == len(set(found)) and set(found) == expected, "missing %s, unexpected %s" % (
        sorted(expected - set(found)), sorted(set(found) - expected))
    assert any(f[5] > 1 and f[2] > 1 and f[1] * f[3] > 1 for f in found), found  # (folded over a stage's tp or cp)
    for l in moe:
        assert l["dp"] * l["tp"] * l["pp"] * l["cp"] == N and l["r"] == 0, l
        alone = l["tp"] == 1 and l["pp"] == 1 and l["cp"] == 1
        assert l["layout"].startswith("train_gpt2_ep" if alone else "train_gpt2_3d"), l
        if not alone:
            assert " -ep %d " % l["ep"] in l["layout"] + " ", l
    # each row's total is the one layout's plan (a few of them: first, last and one of several stages)
    picks = [moe[0], moe[-1]] + [l for l in moe if l["pp"] > 1 and l["ep"] > 1][:2] + [l for l in moe if l["z"]][:2]
    for l in picks:
        flags = common[:-2] + ["-experts", E, "-topk", 2, "-d", 2 * 256 * N, "-dp", l["dp"], "-tp", l["tp"], "-pp", l["pp"],
                               "-cp", l["cp"], "-cp_comm", l["cp_comm"], "-ep", l["ep"], "-sp", l["sp"], "-z", l["z"],
                               "-format", "json"]
        code, text = planner(*flags)
        assert code == 0 and json.loads(text)["total"] == l["total"], "%s: exit %d, the search's %d\n%s" % (
            flags, code, l["total"], text[-500:])


@test
def memory_page_5d_layouts_show_the_planners_bytes():
    """dev/memory.html (headless Chromium) on 5D layouts, as memory_page_in_chromium_... on the
    others: a grid with experts shows dev/memory_planner -format json's rows, stages and command; a
    refusal the planner's message and no numbers; a search with experts its layouts in order, and a
    row's link (ep kept in it) opens that layout with the same total"""
    if tool("chromium") is None:
        raise Skip("no chromium (dev/setup.sh installs it)")
    from browser import Browser
    add = lambda **kw: [(k, str(v)) for k, v in kw.items()]  # noqa: E731
    layouts = [add(e="d12", b=4, t=1024, pp=2, cp=2, tp=2, sp=1, experts=8, topk=2, ep=4, d=4 * 1024 * 2),
               add(e="d12", b=4, t=1024, pp=2, tp=2, sp=1, experts=8, topk=2, ep=2, d=4 * 1024 * 4, stage=0),
               add(e="d12", b=4, t=1024, dp=2, cp=2, experts=16, topk=1, ep=4, capacity_factor=1.25, trainer="3d"),
               add(e="d4", b=4, t=64, dp=2, pp=2, experts=4, topk=2, ep=2, device="cpu", d=4 * 64 * 2 * 2, n=10),
               add(e="d12", experts=8, tp=2, ep=2),                     # refused: -tp without -sp
               add(e="d12", experts=8, dp=2, pp=2, ep=4),               # refused: ep over a stage's 2 ranks
               add(e="d12", experts=8, dp=2, ep=2, trainer="3d", r=1),  # refused: -r
               add(e="d12", b=4, t=1024, experts=8, topk=2, search=8, mem=12)]
    browser = Browser(tool("chromium").split()[0], fresh_dir("memory_page_5d_profile"))
    try:
        for pairs in layouts:
            args = [a for k, v in pairs for a in ("-" + k, v)]
            native = subprocess.run(["./dev/memory_planner"] + args + ["-format", "json"], cwd=ROOT, capture_output=True,
                                    text=True, timeout=60)
            url = memory_page_url(pairs)
            html_text = browser.dom(url)
            dom = MemoryPageDom()
            dom.feed(html_text)
            what = "%s\n    dev/memory_planner %s" % (url, " ".join(args))
            if native.returncode == 1:
                message = native.stderr.strip().splitlines()[-1].replace("error: ", "", 1)
                assert dom.state == "error" and dom.texts.get("status", "").strip() == message and not dom.rows, \
                    "%s\n    page: %s %r\n    planner: %r" % (what, dom.state, dom.texts.get("status"), message)
                continue
            assert native.returncode in (0, 2), "%s: exit %d %s" % (what, native.returncode, native.stderr[-500:])
            plan = json.loads(native.stdout)
            if "search" in plan:
                want = [l["total"] for l in plan["layouts"]]
                assert len(want) >= 10 and any(l["ep"] > 1 for l in plan["layouts"]), plan["layouts"][:3]
                assert dom.layouts == want, "%s\n    page %s\n    planner %s" % (what, dom.layouts[:8], want[:8])
                links = re.findall(r'<tr class="layout" data-bytes="(\d+)">.*?<a href="([^"]+)"', html_text)
                assert len(links) == len(want), (len(links), len(want))
                for total, link in links[:2] + [x for x in links if "ep=" in x[1]][-2:]:
                    opened = MemoryPageDom()
                    opened.feed(browser.dom("file://" + os.path.join(os.path.dirname(MEMORY_PAGE), html.unescape(link))))
                    assert opened.state != "error" and [r[1] for r in opened.rows if r[0] == "total"] == [int(total)], \
                        "%s: the link %s opens %s %s, the row said %s" % (what, link, opened.state,
                                                                          opened.texts.get("status"), total)
                continue
            assert plan["trainer"] == "train_gpt2_3d" and any(r["label"] == "experts" for r in plan["rows"]), plan
            want = [(r["label"], r["bytes"], r["kind"]) for r in plan["rows"]]
            assert dom.rows == want, "%s\n    page    %s\n    planner %s" % (what, dom.rows, want)
            stages = [s["total"] for s in plan["stages"]] if len(plan["stages"]) > 1 else []
            assert dom.stages == stages, "%s: stages %s, planner %s" % (what, dom.stages, stages)
            assert dom.texts.get("command", "").strip() == plan["command"], "%s: %r" % (what, dom.texts.get("command"))
    finally:
        browser.close()


@test
def planner_5d_commands_start_in_the_grid_trainer():
    """the command dev/memory_planner prints for a 5D layout (mpirun -np N ./train_gpt2_3d ...
    -experts E -topk k -ep n) starts and takes its step on the CPU backend: the flags it names are
    the trainer's, the grid is the ranks it asks for (ep adds none), and train_gpt2_3d, not
    train_gpt2_ep, runs a model with experts on a grid"""
    layouts = [dict(pp=2, tp=2, sp=1, experts=4, ep=2),
               dict(dp=2, cp=2, experts=4, ep=4, capacity_factor=1.5),
               dict(pp=2, cp=2, tp=2, sp=1, experts=8, topk=1, ep=4, sched="zb", d=128),
               dict(dp=2, experts=4, ep=2, trainer="3d")]
    for i, layout in enumerate(layouts):
        flags = ["-e", "d4", "-b", 1, "-t", 32, "-device", "cpu", "-format", "json"]
        flags += [x for k, v in layout.items() for x in ("-" + k, v)]
        code, out = planner(*flags)
        assert code in (0, 2), "%s: exit %d\n%s" % (layout, code, out)
        command = json.loads(out)["command"].split()
        ranks = layout.get("dp", 1) * layout.get("pp", 1) * layout.get("cp", 1) * layout.get("tp", 1)
        assert command[:4] == ["mpirun", "-np", str(ranks), "./train_gpt2_3d"], command
        assert " -experts %d -topk %d -ep %d " % (layout["experts"], layout.get("topk", 2), layout["ep"]) in \
            " ".join(command) + " ", command
        args = command[4:] + ["-x", 1, "-v", 0, "-s", 0, "-o", fresh_dir("planner_5d_command_%d" % i)]
        rc, run = mpirun(ranks, args, program=command[3], timeout=120)
        assert rc == 0, "the planner's command for %s, %s, is refused by its trainer:\n%s" % (
            layout, " ".join(command), why_it_failed(run))
        assert "step    1/1" in run, run[-2000:]
