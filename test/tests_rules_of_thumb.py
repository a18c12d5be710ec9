# dev/bench/rules_of_thumb.py: for each case the fastest layout of the planner's search, and for
# each axis the fastest layout with it and without it. What is checked is the selection, from the
# planner's own list: the fastest is the list's quickest step, each "with" uses its axis and no
# layout using it is quicker, each "without" the same for the rest, and the printed verdict is the
# ratio of the two. The speeds themselves are the model's, printed, never asserted. Read by
# run_tests.py into its namespace (@test, ROOT, make, ...).

RULES_AXES = {"tp": lambda l: l["tp"] > 1, "pp": lambda l: l["pp"] > 1, "cp": lambda l: l["cp"] > 1,
              "ep": lambda l: l["ep"] > 1, "ZeRO": lambda l: l["z"] > 0}


@test
def rules_of_thumb_pick_the_fastest_with_and_without_each_axis():
    """rules_of_thumb.py --format json against the planner's search run again for each case: the
    same layouts, the fastest first, and for each of tp, pp, cp, ep and ZeRO the quickest layout
    that uses it and the quickest that does not (None where none fits); its text says 'pays' exactly
    where the first is quicker"""
    make(["dev/memory_planner"])
    script = os.path.join(ROOT, "dev", "bench", "rules_of_thumb.py")
    p = subprocess.run([sys.executable, script, "--format", "json"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    results = json.loads(p.stdout)
    assert len(results) == 5, "%d cases" % len(results)
    text = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=300).stdout
    for r in results:
        cmd = r["command"].split()
        cmd[cmd.index("-format") + 1] = "json"
        q = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert q.returncode == 0, q.stdout[-2000:] + q.stderr[-2000:]
        layouts = json.loads(q.stdout)["layouts"]
        assert len(layouts) == r["fit"] and layouts, "%s: %d layouts, the script says %d" % (r["case"], len(layouts), r["fit"])
        quickest = min(l["step_seconds"] for l in layouts)
        assert r["best"]["step_seconds"] == quickest, "%s: the fastest is not the quickest step" % r["case"]
        for axis, uses in RULES_AXES.items():
            a = r["axes"][axis]
            for key, keep in (("with", uses), ("without", lambda l: not uses(l))):
                subset = [l for l in layouts if keep(l)]
                if not subset:
                    assert a[key] is None, "%s, %s %s: none fits, the script names %s" % (r["case"], axis, key, a[key])
                    continue
                assert a[key] is not None and keep(a[key]), "%s: %s %s is %s" % (r["case"], axis, key, a[key])
                assert a[key]["step_seconds"] == min(l["step_seconds"] for l in subset), \
                    "%s: %s %s is not the quickest of its %d layouts" % (r["case"], axis, key, len(subset))
            if a["with"] and a["without"]:
                pays = a["without"]["step_seconds"] > a["with"]["step_seconds"]
                ratio = a["without"]["step_seconds"] / a["with"]["step_seconds"]
                said = ("pays: %.2fx faster" % ratio) if pays else ("does not pay: the best without is %.2fx" % (1 / ratio))
                assert said in text, "%s, %s: the text lacks '%s'" % (r["case"], axis, said)
        print("    %-58s %4d GPUs  fastest %9.1f ms  %s" % (r["case"], r["gpus"], r["best"]["step_seconds"] * 1e3,
                                                             r["best"]["layout"]))
