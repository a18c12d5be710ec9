# dev/memory.html's predicted step time (issue 61): the page runs dev/memory_planner compiled to
# WebAssembly, so each time it shows (the step, tokens/s, MFU, and stage 0's parts: compute by
# kind, exposed collectives by group, the bubble, the schedule, once a step) must be the native
# planner's -format json, the same C on the same IEEE doubles; and a -rank time search must list
# the planner's layouts in the planner's order, with the first two compared as its text compares
# them. Read into test/run_tests.py's namespace (test, tool, Skip, fresh_dir, make, ROOT,
# MEMORY_PAGE, memory_page_url are used as if written here).

# A device profile of the test's own (llmc/device_profile.h's format): a made-up GPU unlike the
# built-in ones (4 to a node, slow links), handed to the page as its pasted text and to the
# native planner as a file
PAGE_TIME_GPU_PROFILE = """# a GPU of the test's own, not a real one
name test GPU, 4 a node
kind cuda
peak_flops_fp32 40e12
peak_flops_bf16 400e12
memory_bandwidth_bytes_per_s 2e12
memory_bytes 48e9
efficiency_matmul_large 0.6
efficiency_matmul_small 0.4
matmul_small_flops 2e10
efficiency_attention 0.2
efficiency_memory 0.6
intra_node_latency_s 3e-6
intra_node_bandwidth_bytes_per_s 200e9
inter_node_latency_s 8e-6
inter_node_bandwidth_bytes_per_s 12.5e9
gpus_per_node 4
efficiency_link 0.7
"""


def page_time_layouts():
    """planner command lines ((flag, value) pairs) over every trainer and the options the step's
    time reads: dp with each ZeRO stage, -r, -overlap and -offload; tp with and without -sp;
    pipelines under each schedule and -vp; 3D grids with ZeRO-1 and cp; cp's ring and all-gather;
    DiLoCo with -workers and -H; experts (train_gpt2_ep and the 5D grid) with capacity and -maxvio;
    the CPU backend. Each gets a
    profile (the planner's default, a built-in, or a pasted one) and GPUs a node, drawn with a
    fixed seed, so that every run checks the same layouts"""
    import random
    bases = []
    add = lambda **kw: bases.append([(k, str(v)) for k, v in kw.items()])  # noqa: E731
    for e in ("d12", "d24"):
        for z in range(4):
            for r in range(3):
                add(e=e, b=4, t=1024, dp=8, z=z, r=r)
            add(e=e, b=4, t=1024, dp=4, z=z, overlap=0)
            add(e=e, b=2, t=1024, dp=4, z=z, offload=1)
    for e in ("d12", "d36"):
        for tp in (2, 4):
            for sp in (0, 1):
                add(e=e, b=4, t=1024, tp=tp, sp=sp, r=sp)
    for pp, e in ((2, "d12"), (4, "d24")):
        for sched in ("afab", "1f1b", "zb"):
            add(e=e, b=4, t=1024, pp=pp, sched=sched, d=4 * 1024 * 8)
            add(e=e, b=2, t=1024, pp=pp, sched=sched, d=2 * 1024 * 4 * pp, r=2)
        add(e=e, b=4, t=1024, pp=pp, sched="interleaved", vp=2, d=4 * 1024 * 8)
    for dp, tp, pp in ((2, 2, 2), (4, 2, 2), (2, 4, 2), (8, 2, 4)):
        for z, sp in ((0, 0), (1, 1)):
            add(e="d36", b=4, t=1024, dp=dp, tp=tp, pp=pp, z=z, sp=sp, trainer="3d", d=4 * 1024 * dp * 4)
        add(e="d24", b=2, t=1024, dp=dp, tp=tp, pp=pp, sched="interleaved", vp=2, trainer="3d", d=2 * 1024 * dp * 8,
            r=1)
    for cp in (2, 4):
        for comm in ("ring", "allgather"):
            add(e="d12", b=4, t=1024, cp=cp, cp_comm=comm)
            add(e="d24", b=1, t=1024, cp=cp, cp_comm=comm, cp_layout="contiguous", r=1)
        add(e="d36", b=2, t=1024, dp=2, tp=2, cp=cp, sp=1, z=1, trainer="3d", d=2 * 1024 * 2 * 2)
        add(e="d24", b=2, t=1024, pp=2, cp=cp, trainer="3d", d=2 * 1024 * 4)
    for dp in (2, 4, 8):
        add(e="d12", b=4, t=1024, dp=dp, trainer="diloco")
    add(e="d12", b=4, t=1024, dp=8, trainer="diloco", workers=2, H=5)   # (the outer all-reduce's 1/H share)
    add(e="d24", b=4, t=1024, dp=4, trainer="diloco", workers=4, H=20)
    for experts, topk, ep, cf in ((8, 2, 2, 0), (8, 2, 4, 1.25), (16, 1, 4, 1), (16, 4, 8, 0)):
        add(e="d12", b=4, t=1024, dp=8, experts=experts, topk=topk, ep=ep, capacity_factor=cf)
    for maxvio in (0.5, 2):  # (the all-to-all at routed loads: the busiest rank's bytes)
        add(e="d12", b=4, t=1024, dp=4, experts=8, topk=2, ep=4, maxvio=maxvio)
    add(e="d12", b=4, t=1024, pp=2, tp=2, sp=1, experts=8, topk=2, ep=2, d=4 * 1024 * 4)
    add(e="d12", b=4, t=1024, dp=2, cp=2, experts=16, topk=1, ep=4, capacity_factor=1.25, trainer="3d")
    for dp in (1, 2, 4):  # the CPU backend (fp32), small shapes
        add(e="d4", b=4, t=64, dp=dp, device="cpu")
        add(e="d4", b=4, t=64, tp=2, dp=dp, sp=1, trainer="3d", device="cpu")
    add(e="d4", b=2, t=64, pp=2, d=2 * 64 * 4, device="cpu", sched="zb")
    # the profile and GPUs a node, drawn: "own" is PAGE_TIME_GPU_PROFILE pasted, "cpu file" the
    # project's measured CPU profile pasted (the planner's default on -device cpu, named instead);
    # a layout's profile is of its device's kind (the planner refuses a GPU's on -device cpu)
    rng = random.Random(61)
    layouts = []
    for pairs in bases:
        cpu = ("device", "cpu") in pairs
        profile = rng.choice([None, "cpu file"] if cpu else [None, "h100-sxm", "h200", "a100-80gb", "own"])
        per_node = rng.choice([None, 1, 2, 4, 8, 16])
        layouts.append(pairs + ([("profile", profile)] if profile else []) +
                       ([("gpus_per_node", str(per_node))] if per_node else []))
    return layouts


def page_time_searches():
    """-rank time searches: a dense model on 4 and 8 GPUs (a built-in profile, a node of 4), one
    with experts, and one on the CPU backend with its default profile"""
    return [[("e", "d12"), ("b", "4"), ("t", "1024"), ("search", "4"), ("rank", "time")],
            [("e", "d24"), ("b", "8"), ("t", "1024"), ("search", "8"), ("rank", "time"), ("profile", "a100-80gb"),
             ("gpus_per_node", "4"), ("mem", "40")],
            [("e", "d12"), ("b", "4"), ("t", "1024"), ("experts", "8"), ("search", "4"), ("rank", "time"),
             ("profile", "h200")],
            [("e", "d4"), ("b", "4"), ("t", "64"), ("device", "cpu"), ("search", "2"), ("rank", "time")]]


class PageTimeDom(html.parser.HTMLParser):
    """what the test reads of the page's times: the step, tokens/s and MFU (their data attribute
    and their text), each part's row (data-part, data-seconds, the time shown), the search's rows
    (layout, step, tokens/s) and the comparison's rows (part, first, second as shown)"""
    def __init__(self):
        super().__init__()
        self.summary, self.parts, self.layouts, self.why, self.state = {}, {}, [], {}, None
        self.cells = None  # the <td class="num"> texts of the row being read
        self.row = None    # (kind, key, attributes) of that row
        self.text_of = None
        self.in_num = False  # inside one of those cells

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id") == "status":
            self.state = a.get("data-state")
        if a.get("id") in ("step-time", "tokens-per-second", "mfu"):
            self.text_of = a["id"]
            self.summary[a["id"]] = [a.get("data-seconds", a.get("data-value")), ""]
        classes = a.get("class", "").split()
        if tag == "tr" and ("time-part" in classes or "why" in classes or "layout" in classes):
            self.row = ("time-part" if "time-part" in classes else "why" if "why" in classes else "layout", a)
            self.cells = []
        if tag == "td" and self.row is not None and "num" in a.get("class", "").split():
            self.cells.append("")
            self.in_num = True
            if "step" in a["class"].split():  # (a search row's step, in seconds)
                self.row[1]["data-seconds"] = a["data-seconds"]
        if tag == "a" and self.row is not None and "data-layout" in a:  # (a search row's layout)
            self.row[1]["data-layout"] = a["data-layout"]

    def handle_endtag(self, tag):
        if tag == "b":
            self.text_of = None
        if tag == "td":
            self.in_num = False
        if tag == "tr" and self.row is not None:
            kind, a = self.row
            if kind == "time-part":
                self.parts[a["data-part"]] = (a["data-seconds"], self.cells[0])
            elif kind == "why":
                self.why[a["data-part"]] = (self.cells[0], self.cells[1])
            else:
                self.layouts.append((a["data-layout"], a.get("data-seconds"), self.cells))
            self.row = None

    def handle_data(self, data):
        if self.text_of:
            self.summary[self.text_of][1] += data
        if self.in_num:
            self.cells[-1] += data


def page_time_fixed(x, places):
    """x as JavaScript's toFixed(places) writes it: the exact binary value rounded, a tie up"""
    import decimal
    return str(decimal.Decimal(x).quantize(decimal.Decimal(1).scaleb(-places), rounding=decimal.ROUND_HALF_UP))


def page_time_native(pairs, profile_file):
    """dev/memory_planner -format json on the page's inputs (a pasted profile: its file)"""
    args = []
    for k, v in pairs:
        if k == "profile" and v in ("own", "cpu file"):
            v = profile_file if v == "own" else os.path.join(ROOT, "dev", "profiles", "cpu-this-machine.txt")
        args += ["-" + k, v]
    p = subprocess.run(["./dev/memory_planner"] + args + ["-format", "json"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode in (0, 2), "dev/memory_planner %s: exit %d %s" % (" ".join(args), p.returncode, p.stderr[-500:])
    return json.loads(p.stdout)


def page_time_url(pairs, page):
    """the page's URL for the inputs: a pasted profile goes in as your-profile.txt and its text"""
    cpu_text = open(os.path.join(ROOT, "dev", "profiles", "cpu-this-machine.txt")).read()
    out = []
    for k, v in pairs:
        if k == "profile" and v in ("own", "cpu file"):
            pasted = PAGE_TIME_GPU_PROFILE if v == "own" else cpu_text
            out += [("profile", "your-profile.txt"), ("profile_text", pasted)]
        else:
            out.append((k, v))
    return memory_page_url(out, page)


def page_time_check_layout(browser, pairs, plan, page):
    """the page's times for one layout against the native planner's JSON: each number in its
    data attribute equal to the JSON's (both are the planner's %.9g text, parsed), and each shown
    as the page's formats write the JSON's value (milliseconds to 2 places, as the planner's text;
    tokens/s whole; MFU in % to 1 place)"""
    url = page_time_url(pairs, page)
    dom = PageTimeDom()
    dom.feed(browser.dom(url))
    what = "%s\n    %s" % (" ".join("-%s %s" % kv for kv in pairs), url[:200])
    assert dom.state in ("fits", "nofit"), "%s: the page shows no plan (%s)" % (what, dom.state)
    ms = lambda s: page_time_fixed(s * 1e3, 2) + " ms"  # noqa: E731
    want = {"step-time": (plan["step_seconds"], ms(plan["step_seconds"])),
            "tokens-per-second": (plan["tokens_per_second"], page_time_fixed(plan["tokens_per_second"], 0)),
            "mfu": (plan["mfu"], page_time_fixed(100 * plan["mfu"], 1) + "%")}
    got = {k: (float(v[0]), v[1].strip()) for k, v in dom.summary.items()}
    assert got == want, "%s\n    page    %s\n    planner %s" % (what, got, want)
    parts = plan["time_parts"]
    want = {k: s for k, s in parts.items() if isinstance(s, (int, float))}  # (each compute kind, the schedule's three)
    assert {"gemm", "attention", "memory", "bubble", "schedule", "once"} <= set(want), want
    want.update({"comm." + g: s for g, s in parts["comm_exposed"].items() if s > 0})  # (the groups with exposed time)
    want["step"] = plan["step_seconds"]
    want = {k: (s, ms(s)) for k, s in want.items()}
    got = {k: (float(s), text.strip()) for k, (s, text) in dom.parts.items()}
    assert got == want, "%s\n    page    %s\n    planner %s" % (what, sorted(got.items()), sorted(want.items()))
    return parts


def page_time_check_search(browser, pairs, page):
    """a -rank time search on the page against the native planner: the same layouts in the same
    order, each with its step and tokens/s; and the comparison of the first two equal to the
    planner's text ("why the first beats the second": ms a step to 2 places; a group whose exposed
    time is 0 for both may be left out by the page, which does not see the groups' totals)"""
    args = [a for k, v in pairs for a in ("-" + k, v)]
    native = json.loads(subprocess.run(["./dev/memory_planner"] + args + ["-format", "json"], cwd=ROOT, check=True,
                                       capture_output=True, text=True, timeout=300).stdout)
    text = subprocess.run(["./dev/memory_planner"] + args, cwd=ROOT, check=True, capture_output=True, text=True,
                          timeout=300).stdout
    dom = PageTimeDom()
    dom.feed(browser.dom(memory_page_url(pairs, page)))
    what = "dev/memory_planner " + " ".join(args)
    want = [(l["layout"], l["step_seconds"], page_time_fixed(l["step_seconds"] * 1e3, 2) + " ms",
             page_time_fixed(l["tokens_per_second"], 0)) for l in native["layouts"]]
    assert len(want) >= 4, "%s: %d layouts" % (what, len(want))
    got = [(layout, float(seconds), cells[4].strip(), cells[5].strip()) for layout, seconds, cells in dom.layouts]
    assert got == want, "%s\n    page    %s\n    planner %s" % (what, got[:6], want[:6])
    table = text[text.index("why the first beats the second"):]
    printed = {m.group(1).strip(): (m.group(2), m.group(3))
               for m in re.finditer(r"^  (\S[^\n]*?)\s+(\d+\.\d\d)\s+(\d+\.\d\d)$", table, re.M)}
    label = {"step": "step", "bubble": "stage 0 idle", "once": "once a step"}
    shown = {label.get(k, k.replace("comm.", "") + " exposed" if k.startswith("comm.") else k):
             tuple(t.replace(" ms", "").strip() for t in cells) for k, cells in dom.why.items()}
    left_out = {k: v for k, v in printed.items() if k not in shown}
    assert shown and all(v == printed.get(k) for k, v in shown.items()) and \
        all(v == ("0.00", "0.00") and k.endswith(" exposed") for k, v in left_out.items()), \
        "%s: the comparison\n    page    %s\n    planner %s" % (what, shown, printed)
    return len(want)


@test
def memory_page_shows_the_planners_step_time_on_100_layouts():
    """dev/memory.html in headless Chromium, one browser for every page: on 100+ layouts (every
    trainer; dp, tp, pp, cp and ep; -z, -r, -sp, -vp and each schedule; the built-in profiles, a
    pasted one and the CPU's; GPUs a node) the step, tokens/s, MFU and each part shown equal
    dev/memory_planner -format json's; four -rank time searches list the planner's layouts in its
    order with their times, the first two compared as its text compares them. Then the checks
    are run on copies of the page with a planted mistake each (a part read from the wrong field,
    MFU from tokens/s, the search's rows in another order, the comparison's columns swapped),
    and each must fail"""
    if tool("chromium") is None:
        raise Skip("no chromium (dev/setup.sh installs it)")
    from browser import Browser
    p = make(["BACKEND=cpu", "dev/memory_planner"])
    assert p.returncode == 0, p.stdout[-3000:]
    start = time.time()
    d = fresh_dir("memory_page_time")
    profile_file = os.path.join(d, "your-profile.txt")
    with open(profile_file, "w") as f:
        f.write(PAGE_TIME_GPU_PROFILE)
    layouts = page_time_layouts()
    assert len(layouts) >= 100, len(layouts)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        plans = list(pool.map(lambda pairs: page_time_native(pairs, profile_file), layouts))
    browser = Browser(tool("chromium").split()[0], fresh_dir("memory_page_time_profile"))
    seen = collections.Counter()
    try:
        for pairs, plan in zip(layouts, plans):
            parts = page_time_check_layout(browser, pairs, plan, MEMORY_PAGE)
            seen[plan["trainer"]] += 1
            seen["profile " + dict(pairs).get("profile", "default")] += 1
            seen.update("exposed " + g for g, s in parts["comm_exposed"].items() if s > 0)
            seen["bubble"] += parts["bubble"] > 0
        searched = [page_time_check_search(browser, pairs, MEMORY_PAGE) for pairs in page_time_searches()]
        # the planted mistakes, each in a copy of the page: the checks above must catch every one
        text = open(MEMORY_PAGE).read()
        mutants = [
            ("a part from the wrong field: memory shown as attention's", "[k, k, parts[k], TIME_COMPUTE[k]",
             '[k, k, parts[k === "memory" ? "attention" : k], TIME_COMPUTE[k]', "layout"),
            ("the bubble from once a step's field", "parts.bubble, \"stage 0 idle in the schedule",
             "parts.once, \"stage 0 idle in the schedule", "layout"),
            ("a group's exposed time from another group's", 'group + " exposed", seconds,',
             'group + " exposed", parts.comm_exposed[group === "tp" ? "dp" : group],', "layout"),
            ("MFU to the whole percent", "(100 * plan.mfu).toFixed(1)", "(100 * plan.mfu).toFixed(0)", "layout"),
            ("the search's rows reversed", "for (const l of result.layouts) {",
             "for (const l of result.layouts.slice().reverse()) {", "search"),
            ("the comparison's columns swapped", "const [a, b] = plans.map(p => p.time_parts);",
             "const [b, a] = plans.map(p => p.time_parts);", "search"),
        ]
        tp_layout = next(i for i, pairs in enumerate(layouts) if plans[i]["time_parts"]["comm_exposed"]["tp"] > 0)
        bubble_layout = next(i for i, pairs in enumerate(layouts) if plans[i]["time_parts"]["bubble"] > 0)
        for name, old, new, kind in mutants:
            assert text.count(old) == 1, "the planted mistake %r: its line is not in the page once: %s" % (name, old)
            mutant = os.path.join(d, "mutant.html")
            with open(mutant, "w") as f:
                f.write(text.replace(old, new))
            try:
                if kind == "layout":
                    for i in (0, tp_layout, bubble_layout):
                        page_time_check_layout(browser, layouts[i], plans[i], mutant)
                else:
                    page_time_check_search(browser, page_time_searches()[0], mutant)
            except AssertionError:
                continue
            raise AssertionError("a page with %s passed the checks" % name)
    finally:
        browser.close()
    print("    %d layouts, %d searches (%s layouts), 6 planted mistakes caught, %.0f s: %s" % (
        len(layouts), len(searched), "/".join(map(str, searched)), time.time() - start,
        ", ".join("%s %d" % kv for kv in sorted(seen.items()))))
    trainers = {"train_gpt2_" + t for t in ("dp", "tp", "pp", "3d", "cp", "diloco", "ep")}
    assert trainers <= set(seen) and all(seen["profile " + p] > 0 for p in ("h100-sxm", "h200", "a100-80gb", "own",
                                                                            "cpu file", "default")), seen
    assert all(seen["exposed " + g] > 0 for g in ("tp", "cp", "dp", "ep", "embedding")) and seen["bubble"] > 0, seen
