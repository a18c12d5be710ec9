# The step-time model's price of DualPipe's MoE overlap (llmc/step_time.h, time_pair_hidden):
# with the grid trainer's -pp_overlap 1 and ep > 1, each F&B pair's all-to-alls of rows move under
# the other micro-batch's compute on a GPU, and nowhere on a CPU. Read into test/run_tests.py's
# namespace.


def moe_overlap_plan(extra):
    code, out = planner(*(["-e", "d12", "-trainer", "3d", "-experts", 8, "-topk", 2, "-ep", 2, "-format", "json"] + extra))
    assert code == 0, out[-2000:]
    return json.loads(out)


@test
def step_time_prices_the_moe_overlap_of_dualpipev_pairs():
    """d12 with 8 experts (top 2) on dp 2 x pp 2, dualpipev (V = 2), ep 2, m = 8 micro-batches of
    4 x 1024, one H100 a node (the all-to-alls cross nodes: large enough to see). DualPipeV's stage
    0 runs 2 (m - 2p + 1) F&B pairs in its steady state and p - 1 in its cool-down (pipeline.h's
    steps 4 and 5): 2m - 3p + 1 = 11 of its m V = 16 forwards and 16 backwards are paired, and a
    pair hides one forward's and one backward's all-to-alls. Each action's all-to-alls are well
    under the other's compute here (checked), so with -pp_overlap 1 the exposed ep time is
    1 - 11/16 of that without; the schedule shortens, by no more than what was hidden. The same
    layout with ep 1 (no all-to-all) or on the CPU backend (MPI moves the rows on the rank's own
    core: nothing hides) predicts the same step either way"""
    make(["dev/memory_planner"])
    p, m, V = 2, 8, 2
    layout = ["-dp", 2, "-pp", p, "-sched", "dualpipev", "-vp", V, "-b", 4, "-t", 1024, "-d", 2 * m * 4 * 1024,
              "-profile", "h100-sxm", "-gpus_per_node", 1]
    plans = {ov: moe_overlap_plan(layout + ["-pp_overlap", ov]) for ov in (0, 1)}
    assert plans[0]["micro_batches"] == m, plans[0]["micro_batches"]
    before, after = (plans[ov]["time_parts"] for ov in (0, 1))
    compute = before["gemm"] + before["attention"] + before["memory"]
    per_action_a2a = before["comm_exposed"]["ep"] / (2 * m * V)
    # (the precondition of the closed form: a pair hides whole all-to-alls only when each is
    # shorter than the other's compute; a factor 2 of margin for F against B)
    assert 0 < per_action_a2a < compute / (2 * m * V) / 2, (per_action_a2a, compute)
    pairs = 2 * m - 3 * p + 1
    want = before["comm_exposed"]["ep"] * (1 - pairs / (m * V))
    # (1e-6: the same sums in another order)
    assert abs(after["comm_exposed"]["ep"] / want - 1) <= 1e-6, \
        "-pp_overlap 1: ep exposed %.9g s, expected %.9g s (1 - %d/%d of %.9g)" % (
            after["comm_exposed"]["ep"], want, pairs, m * V, before["comm_exposed"]["ep"])
    hidden = before["comm_exposed"]["ep"] - after["comm_exposed"]["ep"]
    shorter = before["schedule"] - after["schedule"]
    assert 0 < shorter <= hidden * (1 + 1e-9), "the schedule shortened by %.9g s, %.9g s hidden" % (shorter, hidden)
    by_link = after["comm_exposed_by_group_and_link"]["ep"]
    # (1e-9 s: the links' shares scaled alike)
    assert abs(sum(by_link.values()) - after["comm_exposed"]["ep"]) <= 1e-9, by_link
    print("    dualpipev p 2 m 8: ep exposed %.2f -> %.2f ms, schedule %.2f -> %.2f ms" % (
        before["comm_exposed"]["ep"] * 1e3, after["comm_exposed"]["ep"] * 1e3, before["schedule"] * 1e3,
        after["schedule"] * 1e3))
    for same in (["-ep", 1], ["-device", "cpu", "-profile", "dev/profiles/cpu-this-machine.txt", "-b", 2, "-t", 64,
                              "-d", 2 * m * 2 * 64]):
        steps = [moe_overlap_plan(layout + same + ["-pp_overlap", ov])["step_seconds"] for ov in (0, 1)]
        assert steps[0] == steps[1], "%s: -pp_overlap 0 and 1 predict %s" % (same, steps)
