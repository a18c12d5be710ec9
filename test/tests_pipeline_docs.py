# The pipeline chapter's claims (issue 62): read into test/run_tests.py's namespace, so ROOT,
# test, run_ok, mpirun, fresh_dir and tests_docs.py's readme_section are its helpers.
#
# The chapter's schedule table gives each schedule's step length, idle share, held activations and
# sends as a formula and as the number at p = 4, m = 8. Here both are checked against the
# unit-time play that ./test/test_pipeline prints (its charts at p = 4, m = 8): the numbers are
# read off the charts (a chart's row has one cell per unit; '.' is idle), the sends counted from
# the charts' actions with the placement rules written again below, and each formula evaluated at
# p = 4, m = 8 must give the same number.

PIPE_CHAPTER = "Pipeline parallelism in five minutes"
PIPE_SHOWN = {"p": 4, "m": 8}  # the charts ./test/test_pipeline prints
PIPE_SCHEDULES = ("afab", "1f1b", "interleaved", "zb", "zbv", "dualpipev")


def unit_play_charts():
    """schedule -> (its chart's text as printed, its rows as lists of cells, idle %, held per stage)
    from ./test/test_pipeline's output"""
    out = run_ok(1, [], program="test/test_pipeline")
    charts = {}
    for m in re.finditer(r"^schedule (\w+), p=4 stages, m=8 .*\n(?:  .*\n)+", out, re.M):
        text = m.group(0)
        rows = [re.search(r"\|(.*)\|", line).group(1).split() for line in text.splitlines() if line.startswith("  stage ")]
        idle = re.search(r"idle: ([\d.]+)% of the step", text).group(1)
        held = [int(h) for h in re.findall(r"stage \d+: (\d+)", re.search(r"activations held at most.*", text).group(0))]
        charts[m.group(1)] = (text.rstrip("\n"), rows, idle, held)
    assert set(charts) == {"afab", "1f1b", "interleaved", "zb", "zbv", "dualpipev"}, sorted(charts)
    return charts


def sends_by_stage(sched, rows, p):
    """each stage's messages a step, counted from its chart's actions: a forward sends its output
    unless its virtual stage is the last, a backward (B) its input gradient unless its virtual
    stage is the first; a message to a virtual stage on the same stage (the V's bottom) is a copy,
    not a message. Virtual stages: interleaved's chunk c of stage s is c p + s; the V's chunk a of
    stage s is s, chunk b 2p - 1 - s (the chapter's drawing)"""
    V = 2 if sched in ("interleaved", "zbv", "dualpipev") else 1
    v_shape = sched in ("zbv", "dualpipev")

    def virtual(s, c):
        return (2 * p - 1 - s if c == 1 else s) if v_shape else c * p + s

    def stage_of(v):
        return (2 * p - 1 - v if v >= p else v) if v_shape else v % p

    sends = []
    for s, row in enumerate(rows):
        seen, n = set(), 0
        for cell in row:
            m = re.match(r"([FBW])(\d+)([a-z]?)$", cell)
            if not m or m.group(1) == "W" or cell in seen:  # '.', a weight gradient, a 2-unit B's second cell
                continue
            seen.add(cell)
            v = virtual(s, ord(m.group(3) or "a") - ord("a"))
            to = v + 1 if m.group(1) == "F" else v - 1
            if 0 <= to < p * V and stage_of(to) != s:
                n += 1
        sends.append(n)
    return sends


def formula_value(formula, p, m, V, s=0):
    """a table formula as the README writes it ('3 (mV + p - 1)', 'min(p - s, m)', '(p-1)/(6m+p-1)')
    evaluated: juxtaposition is a product"""
    f = formula.replace("min", "M")
    for _ in range(2):  # (a run of juxtaposed factors, mV + ...: twice covers 2p, mV, (V-1)p)
        f = re.sub(r"([\dmpsV)])\s*([mpsVM(])", r"\1*\2", f)
    return eval(f, {"M": min, "p": p, "m": m, "V": V, "s": s})


def schedule_table(chapter):
    """the chapter's schedule table: schedule name -> its cells by column title"""
    lines = [l for l in chapter.splitlines() if l.startswith("| ")]
    header = [c.strip() for c in lines[[i for i, l in enumerate(lines) if l.startswith("| schedule |")][0]].strip("|").split("|")]
    table = {}
    for line in lines:
        cells = [c.strip() for c in line.strip("|").split("|")]
        name = re.match(r"`(\w+)", cells[0])
        if len(cells) == len(header) and name and name.group(1) in PIPE_SCHEDULES:
            table[name.group(1)] = dict(zip(header, cells))
    return table


def formula_and_number(cell):
    """'3 (m + p - 1): 33' -> ('3 (m + p - 1)', '33'), the words after a formula ('chunk units',
    'chunks', '(m >= p)') dropped"""
    formula, number = cell.rsplit(": ", 1)
    formula = re.sub(r"\s*(chunk units|chunks|\(m >= p\))$", "", formula.strip())
    return formula, number.strip()


@test
def docs_pipeline_table_is_the_unit_time_play():
    """every row of the chapter's schedule table against ./test/test_pipeline's charts at p = 4,
    m = 8: the step length is the chart's width in units, the idle share its printed one, the held
    activations its printed peaks, the V's idle inside a stage's span the '.' between the stage's
    first and last action, the sends counted from the actions (sends_by_stage); and each cell's
    formula gives its number. A wrong number or formula in any cell fails"""
    p, m = PIPE_SHOWN["p"], PIPE_SHOWN["m"]
    charts = unit_play_charts()
    table = schedule_table(readme_section(PIPE_CHAPTER))
    assert sorted(table) == sorted(PIPE_SCHEDULES), "the table's rows: %s" % sorted(table)
    sends_of = {}
    for sched, row in table.items():
        text, rows, idle, held = charts[sched]
        V = 2 if sched in ("interleaved", "zbv", "dualpipev") else 1
        where = "the README's %s row" % sched
        # the step's length: the chart's cells (each a unit), the same on every row
        formula, number = formula_and_number(row["step length (units)"])
        width = {len(r) for r in rows}
        assert width == {int(number)}, "%s: step length %s, the chart's rows are %s units" % (where, number, width)
        assert formula_value(formula, p, m, V) == int(number), "%s: %s at p=4, m=8 is not %s" % (where, formula, number)
        # the idle share (and in the V the idle time inside each stage's span)
        parts = row["idle share of the step"].split("; ")
        formula, number = formula_and_number(parts[0])
        assert number == idle + "%", "%s: idle %s, the play's %s%%" % (where, number, idle)
        assert "%.1f%%" % (100 * formula_value(formula, p, m, V)) == number, "%s: %s is not %s" % (where, formula, number)
        if sched in ("zbv", "dualpipev"):
            formula, number = formula_and_number(re.sub(r"^inside stage s's span ", "", parts[1]))
            spans = []
            for r in rows:
                busy = [i for i, c in enumerate(r) if c != "."]
                spans.append(sum(1 for c in r[busy[0]:busy[-1] + 1] if c == "."))
            assert number.split() == [str(n) for n in spans], "%s: span idle %s, the play's %s" % (where, number, spans)
            assert [formula_value(formula, p, m, V, s) for s in range(p)] == spans, "%s: %s" % (where, formula)
        else:
            assert len(parts) == 1, where
        # the activations each stage holds at most
        formula, number = formula_and_number(row["activations held by stage s"])
        assert number.split() == [str(h) for h in held], "%s: held %s, the play's %s" % (where, number, held)
        assert [formula_value(formula, p, m, V, s) for s in range(p)] == held, "%s: %s is not %s" % (where, formula, held)
        # the sends: 'X on stages 0 and p-1, Y between: n n n n', or 'as <schedule>: n n n n'
        counted = sends_by_stage(sched, rows, p)
        sends_of[sched] = counted
        cell = row["sends a step by stage s"]
        formula, number = cell.rsplit(": ", 1)
        assert number.split() == [str(n) for n in counted], "%s: sends %s, counted from the chart %s" % (where, number, counted)
        same = re.match(r"as (\w+)$", formula)
        if same:
            assert same.group(1) in sends_of and sends_of[same.group(1)] == counted, "%s: %s" % (where, formula)
        else:
            ends, middle = re.match(r"(.+) on stages 0 and p-1, (.+) between$", formula).groups()
            expected = [formula_value(ends if s in (0, p - 1) else middle, p, m, V) for s in range(p)]
            assert expected == counted, "%s: %s gives %s, counted %s" % (where, formula, expected, counted)
    # the V's whole pipeline: (2p - 2) 2m messages, as the chapter's 'What moves' says
    assert sum(sends_of["zbv"]) == sum(sends_of["dualpipev"]) == (2 * p - 2) * 2 * m, sends_of


@test
def docs_pipeline_v_charts_are_what_test_pipeline_prints():
    """the chapter's zbv and dualpipev charts are ./test/test_pipeline's, character for character;
    the V drawing places chunk a of stage s at virtual stage s and chunk b at 2p - 1 - s; the two
    measured timelines it shows are in dev/images, each under 150 KB"""
    chapter = readme_section(PIPE_CHAPTER)
    charts = unit_play_charts()
    for sched in ("zbv", "dualpipev"):
        assert charts[sched][0] in chapter, "the chapter's %s chart is not ./test/test_pipeline's:\n%s" % (
            sched, charts[sched][0])
    p = PIPE_SHOWN["p"]
    drawing = re.search(r"^ +chunk a, going down .*\n((?:.*\n)+?)```", chapter, re.M)
    assert drawing, "the V drawing is missing"
    for s in range(p):
        line = re.search(r"^stage %d .*$" % s, drawing.group(1), re.M)
        assert line, "the V drawing has no row for stage %d" % s
        assert re.findall(r"\(v(\d+)\)", line.group(0)) == [str(s), str(2 * p - 1 - s)], line.group(0)
    detail = readme_section("The pipeline in detail")
    for name in ("timeline_zbv.png", "timeline_dualpipev.png"):
        path = os.path.join(ROOT, "dev", "images", name)
        assert "(dev/images/%s)" % name in detail, "the chapter does not show %s" % name
        assert os.path.getsize(path) < 150_000, "%s is %d bytes" % (path, os.path.getsize(path))


@test
def docs_pipeline_v_command_prints_what_the_chapter_says():
    """the chapter's dualpipev command, run for one step: the communication block the chapter
    quotes is what it prints at its start, stage 0's parameters are the embedding, lnf and its two
    chunks (no copy of wte, as the table says), the others' their two chunks; and the chapter's
    refusal of m < 2p is what 2 ranks print for -d 192 (m = 3), once"""
    chapter = readme_section(PIPE_CHAPTER)
    command = re.search(r"^mpirun -np (\d+) \./train_gpt2_pp (.*-sched dualpipev.*)$", chapter, re.M)
    assert command, "the chapter has no dualpipev command"
    ranks, args = int(command.group(1)), command.group(2).split()
    flags = dict(zip(args[::2], args[1::2]))
    flags.update({"-x": "1", "-timeline": "0", "-v": "0", "-s": "0", "-o": fresh_dir("docs_pipeline_dualpipev")})
    out = run_ok(ranks, [a for kv in flags.items() for a in kv], program="./train_gpt2_pp")
    detail = readme_section("The pipeline in detail")
    quoted = re.search(r"^(communication per step \(payload of stage 0\).*\n(?:  .*\n)+)```", detail, re.M)
    assert quoted, "the chapter quotes no communication block"
    assert quoted.group(1) in out, "the chapter's block\n%s\nis not what the command prints:\n%s" % (
        quoted.group(1), out[out.find("communication per step"):][:800])
    # parameters: L/p layers a stage in two chunks, stage 0 also wte, wpe and lnf
    L, C = 8, 512  # d8: C = 64 L
    assert flags["-e"] == "d8", flags["-e"]
    Vp, maxT = 50304, 1024
    layer = 12 * C * C + 13 * C
    counts = [int(n) for n in re.findall(r"^  stage \d+ .* (\d+) parameters", out, re.M)]
    assert counts == [Vp * C + maxT * C + 2 * C + 2 * layer] + [2 * layer] * (ranks - 1), counts
    # the refusal of m < 2p, as quoted
    refusal = re.search(r"^(error: -sched dualpipev: .*)$", readme_section("The pipeline in detail"), re.M)
    assert refusal, "the chapter quotes no refusal"
    code, out = mpirun(2, ["-e", "d4", "-b", 1, "-t", 64, "-d", 192, "-sched", "dualpipev", "-x", 2,
                           "-o", fresh_dir("docs_pipeline_refused")], program="./train_gpt2_pp")
    assert code != 0 and out.count(refusal.group(1)) == 1, out[-2000:]
