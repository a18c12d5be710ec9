# The documentation's own checks (issue 58): read into test/run_tests.py's namespace, so ROOT,
# test, fresh_dir, mpirun, ... are its helpers.
#
# The book is split over several markdown files (README.md, dev/cuda/README.md,
# dev/bench/README.md, test/README.md, ...) that link into one another, down to a section's
# anchor. A section renamed or moved leaves a link that GitHub shows and that goes nowhere: these
# tests find every such link.


def markdown_outside_code(text):
    """the lines of a markdown text that are prose: fenced code blocks (``` or ~~~) left out, and
    in the others inline code spans blanked, so that a link or heading shown as code is not one"""
    lines, fence = [], None
    for line in text.splitlines():
        m = re.match(r"^ {0,3}(`{3,}|~{3,})", line)
        if fence is None and m:
            fence = m.group(1)
            lines.append("")
            continue
        if fence is not None:
            if line.strip().startswith(fence[0] * len(fence)) and line.strip().strip(fence[0]) == "":
                fence = None
            lines.append("")
            continue
        lines.append(re.sub(r"(`+)(.+?)\1", lambda c: " " * len(c.group(0)), line))
    return lines


def github_anchor(heading):
    """GitHub's anchor of a heading's text: markup reduced to its words (code spans keep their
    text, a link its label), lower case, every character but letters, digits, spaces, - and _
    dropped, each space a -"""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link or image: its label
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def markdown_anchors(path):
    """the anchors of a markdown file's headings (ATX: 1 to 6 #), a repeated one as GitHub numbers
    it: the second -1, the third -2"""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    anchors, seen = set(), {}
    # headings are read from the raw lines (code spans kept: their text is part of the anchor),
    # at the places markdown_outside_code says are prose
    raw = text.splitlines()
    for i, line in enumerate(markdown_outside_code(text)):
        if re.match(r"^ {0,3}#{1,6}\s", line):
            title = re.sub(r"^ {0,3}#{1,6}\s+", "", raw[i])
            title = re.sub(r"\s+#+\s*$", "", title)  # a closing sequence of #
            base = github_anchor(title)
            n = seen.get(base, 0)
            seen[base] = n + 1
            anchors.add(base if n == 0 else "%s-%d" % (base, n))
    return anchors


def markdown_links(path):
    """(line number, target) of every relative link and image of a markdown file: [text](target)
    and ![alt](target) in prose, targets with a scheme (https:, mailto:) left out"""
    with open(path, encoding="utf-8") as f:
        lines = markdown_outside_code(f.read())
    links = []
    for number, line in enumerate(lines, 1):
        for m in re.finditer(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", line):
            target = m.group(1)
            if not re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):
                links.append((number, target))
    return links


def broken_markdown_links(root, files):
    """every link of the given markdown files (paths relative to root) that does not resolve: its
    file missing, or its #anchor no heading of the target markdown file. Returns (broken, checked):
    broken as 'file:line: target (why)' strings, checked the number of links read"""
    broken, checked, anchors = [], 0, {}
    for name in files:
        for number, target in markdown_links(os.path.join(root, name)):
            checked += 1
            path, _, anchor = target.partition("#")
            where = os.path.normpath(os.path.join(root, os.path.dirname(name), path)) if path else os.path.join(root, name)
            if not os.path.exists(where):
                broken.append("%s:%d: %s (no such file)" % (name, number, target))
                continue
            if anchor:
                if not where.endswith(".md"):
                    broken.append("%s:%d: %s (an anchor into a file that is not markdown)" % (name, number, target))
                    continue
                if where not in anchors:
                    anchors[where] = markdown_anchors(where)
                if anchor not in anchors[where]:
                    broken.append("%s:%d: %s (no heading with that anchor in %s)"
                                  % (name, number, target, os.path.relpath(where, root)))
    return broken, checked


@test
def docs_anchor_rule_is_githubs():
    """the anchor rule on headings whose anchors GitHub shows (read off github.com's rendering of
    such headings, not from this code): code spans, punctuation, dots in file names, repeats"""
    assert github_anchor("DDP in five minutes (`train_gpt2_dp.cu`)") == "ddp-in-five-minutes-train_gpt2_dpcu"
    assert github_anchor("ZeRO-1, ZeRO-2 and ZeRO-3 (`-z`)") == "zero-1-zero-2-and-zero-3--z"
    assert github_anchor("Hiding tp's communication (`-tp_overlap 1`)") == "hiding-tps-communication--tp_overlap-1"
    assert github_anchor("Where a GPU step's time goes, measured: `LLMC_KERNEL_TIMES=1`") == \
        "where-a-gpu-steps-time-goes-measured-llmc_kernel_times1"
    d = fresh_dir("docs_anchor_repeats")
    with open(os.path.join(d, "a.md"), "w") as f:
        f.write("# Title\n\n## Notes\n\n```\n## not a heading\n```\n\n## Notes\n\n### Notes\n")
    assert markdown_anchors(os.path.join(d, "a.md")) == {"title", "notes", "notes-1", "notes-2"}


@test
def docs_every_markdown_link_and_anchor_resolves():
    """every relative link and #anchor of every tracked markdown file (git ls-files '*.md')
    names a file that exists and, with an anchor, a heading of that markdown file; first the
    check itself on an edited copy of README.md, where it must find the links broken there"""
    files = subprocess.run(["git", "ls-files", "*.md"], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                           check=True).stdout.split()
    files += [f for f in ("dev/bench/README.md", "test/README.md")  # (new files, before their commit)
              if f not in files and os.path.exists(os.path.join(ROOT, f))]
    assert "README.md" in files, files
    # the check can fail: a copy of README.md in a test dir, its relative links rewritten to reach
    # what they named from there, with one link's file and one anchor broken, is reported at
    # those two links and no others
    d = fresh_dir("docs_links_edited")
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    good, _ = broken_markdown_links(ROOT, ["README.md"])
    assert "](#quick-start)" in readme and "](dev/memory.html)" in readme, "the edits below need these links"
    edited = readme.replace("](#quick-start)", "](#quick-start-nowhere)", 1).replace(
        "](dev/memory.html)", "](dev/no_such_page.html)", 1)
    copy = os.path.join(d, "README_edited.md")
    up = os.path.relpath(ROOT, d)  # (the copy's relative links made to reach from its dir what they named)
    with open(copy, "w", encoding="utf-8") as f:
        f.write(re.sub(r"\]\((?!#|[a-zA-Z][a-zA-Z0-9+.-]*:)([^)\s]+)\)", lambda m: "](%s/%s)" % (up, m.group(1)), edited))
    bad, checked_copy = broken_markdown_links(ROOT, [os.path.relpath(copy, ROOT)])
    assert len(bad) == len(good) + 2, "the edited copy: %d broken, expected %d\n%s" % (len(bad), len(good) + 2, "\n".join(bad))
    assert any("#quick-start-nowhere (no heading" in b for b in bad) and \
        any("dev/no_such_page.html (no such file)" in b for b in bad), "\n".join(bad)
    # the real files
    broken, checked = broken_markdown_links(ROOT, files)
    print("checked %d links in %d markdown files (%s)" % (checked, len(files), ", ".join(files)))
    assert checked >= 40 and checked_copy >= 20, (checked, checked_copy)  # (the README alone had 48 before issue 58)
    assert not broken, "%d of %d links do not resolve:\n%s" % (len(broken), checked, "\n".join(broken))


# The README's example output lines come from the commands beside them. The MoE chapter's moe
# line is checked by running the chapter's command. What the check relies on: the CPU backend in
# fp32 computes the same bits on every run of one command with one thread count (one thread a
# rank here, as the quick start's exports set for the reader), so the router's logits, and with
# them each token's experts, the loads, MaxVio, the dropped share and the all-to-all bytes, are the
# same numbers every time, and the aux loss the same float.
MOE_LINE = re.compile(r"^step (\d+) moe: aux loss ([\d.]+) \| tokens per expert min (\d+) mean ([\d.]+) max (\d+) \| "
                      r"MaxVio ([\d.]+) \| dropped ([\d.]+)%(.*)$", re.M)


def readme_section(title_start):
    """the README's text from the heading that starts with title_start to the next heading of its
    level or above"""
    readme = open(os.path.join(ROOT, "README.md")).read()
    m = re.search(r"^(#+) %s.*$" % re.escape(title_start), readme, re.M)
    assert m, "no README heading starts with %r" % title_start
    end = re.compile(r"^#{1,%d} " % len(m.group(1)), re.M).search(readme, m.end())
    return readme[m.start():end.start() if end else len(readme)]


@test
def docs_moe_chapter_example_line_is_what_its_command_prints():
    """the MoE chapter's command, parsed from the README and run for as many steps as its example
    line shows (the learning rate is constant, -q 1, so the first steps do not depend on -x): the
    run's moe line of that step has the example's fields in the example's order, and its figures
    equal the example's: aux loss, tokens per expert, MaxVio, dropped share, all-to-all bytes.
    The mean load is also checked against the flags: ranks B T k / E slots over E experts"""
    chapter = readme_section("Mixture-of-Experts and expert parallelism in five minutes")
    command = re.search(r"^mpirun -np (\d+) \./train_gpt2_ep (.*)$", chapter, re.M)
    example = MOE_LINE.search(chapter)
    assert command and example, "the chapter's command or its example moe line is missing"
    ranks, args = int(command.group(1)), command.group(2).split("#")[0].split()
    step = int(example.group(1))
    flags = dict(zip(args[::2], args[1::2]))
    assert len(args) % 2 == 0 and all(a.startswith("-") for a in args[::2]), args
    # the same command, run to the example's step into a test dir (-n: no checkpoints needed)
    flags["-x"], flags["-o"] = str(step), fresh_dir("docs_moe_example")
    flags.pop("-n", None)
    assert flags.get("-q", "1") in ("1", "1.0"), "the chapter's command decays the learning rate: -x would change step %d" % step
    out = run_ok(ranks, [a for kv in flags.items() for a in kv], program="./train_gpt2_ep")
    lines = {int(m.group(1)): m for m in MOE_LINE.finditer(out)}
    assert step in lines, "no moe line of step %d in the run:\n%s" % (step, out[-3000:])
    run = lines[step]
    # the same fields in the same order: the labels between the figures
    def labels(line):
        return re.sub(r"-?\d+(\.\d+)?", "#", line)
    assert labels(run.group(0)) == labels(example.group(0)), \
        "the README's example line\n  %s\nhas other fields than the run's\n  %s" % (example.group(0), run.group(0))
    assert run.group(0) == example.group(0), \
        "the README's example line\n  %s\nis not what the command prints at step %d:\n  %s" % (example.group(0), step, run.group(0))
    B, T, E = int(flags["-b"]), int(flags["-t"]), int(flags["-experts"])
    k = int(flags.get("-topk", 2))
    assert float(example.group(4)) == ranks * B * T * k / E, "mean tokens per expert %s, expected %g" % (
        example.group(4), ranks * B * T * k / E)
