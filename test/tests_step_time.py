# The step-time model (llmc/step_time.h): the hand-worked cases of test/test_step_time.c (a
# kernel's roofline, attention's useful FLOPs, the data-parallel all-reduce inside and across
# nodes and under -overlap, ranks sharing a CPU's cores, a pipeline message across nodes, the
# throughput and MFU). Read into test/run_tests.py's namespace.


@test
def step_time_parts_against_hand_worked_cases():
    """test/test_step_time: each part of the step-time model against its formula worked by hand"""
    p = make(["test/test_step_time"])
    assert p.returncode == 0, p.stdout.decode(errors="replace")[-3000:]
    out = run_ok(1, [], program="test/test_step_time")
    assert "step time ok" in out, out[-2000:]
