# Tests of the F&B overlap (-pp_overlap 1) on the CUDA backend: the sends an F&B group's forward
# posts ahead travel on a side channel of the pp group (a communicator and stream of their own,
# llmc/comm.h; the matching rule and why it cannot deadlock: llmc/pipeline_walk.h). Read into
# test/run_tests.py's namespace, so its helpers (test, build, cuda_runner, cuda_test_name,
# reference_run, trainer_args, check_cuda_against_reference, pp_step_bytes, check_pp_step_bytes,
# compare_pp_with_reference, REF4_CUDA, REF_GPT2, V_SCHEDULES, ...) are used as if written there.


# make_cuda_pp_test (run_tests.py) with overlap=True runs each case: 2 stages, 4 micro-batches,
# -pp_overlap 1. Each F&B group's forward output leaves right after the forward, on the side
# channel of its stage's colour, and is received there; the results must equal the PyTorch
# reference within the precision's bounds, with the bytes of each step the formula's (the overlap
# moves no byte more). A message received on another channel than it was sent on would hang or
# pair with the wrong receive (the emulator's NCCL is MPI, whose messages of two communicators
# never pair). On the emulator with 2 GPUs the sends go through NCCL's calls, posted on the side
# channel's stream and finished only when the compute waits for them (cuda_emu/include/nccl.h), as
# on a GPU; with 1, through the host-staged path's non-blocking MPI calls.

# on the emulator: dualpipev's F&B pairs over NCCL in fp32 (tight), over the host-staged path in
# bf16 (bounded), and interleaved's steady state over NCCL in fp32
test(make_cuda_pp_test("emu", "FP32", 2, "dualpipev", overlap=True))
test(make_cuda_pp_test("emu", "BF16", 1, "dualpipev", overlap=True))
test(make_cuda_pp_test("emu", "FP32", 2, "interleaved", overlap=True))
# on a GPU (every rank on the one GPU, through NCCL): dualpipev in bf16, interleaved in fp32
test(make_cuda_pp_test("cuda", "BF16", None, "dualpipev", overlap=True))
test(make_cuda_pp_test("cuda", "FP32", None, "interleaved", overlap=True))


@test
def pp_overlap_on_an_odd_ring_matches_the_reference():
    """interleaved on 3 stages with -pp_overlap 1: stage 2 sends its last chunk's outputs on to
    stage 0, a neighbour of the same parity, so its sends ahead take a third side channel
    (llmc/pipeline_walk.h's colours: no rank both sends ahead and receives on one channel). On the
    CPU a channel is an MPI tag: a receive posted on another channel than its send would never
    pair (a hang) or pair with another message (wrong results), so the reference checks the rule's
    three channels end to end (6 layers: 3 stages of 2 chunks; 6 micro-batches of one sequence,
    a multiple of p with a steady state on every stage)"""
    compare_pp_with_reference(3, "interleaved", 6, 2, dict(REF_GPT2, layers=6, batch=6), ["-pp_overlap", 1])


@test
def emu_grid3d_pp_overlap_vs_pytorch_fp32_1x2x2_sp_dualpipev_nccl():
    """the grid trainer's CUDA backend on the emulator, pp 2 x tp 2 with -sp, dualpipev with
    -pp_overlap 1 over NCCL (4 emulated GPUs): each tp rank's pp group, itself split from the
    world, splits its side channels off at its first step, and its sends ahead (B T/tp, C) move
    while the stage's tp collectives run on the tp group's stream. Against the reference within
    fp32's bounds; rank 0's bytes per group the formula's (the overlap moves no byte more); the
    tp copies of the replicated tensors identical after every step"""
    run = emu_runner(4)
    ref = reference_run(REF4_CUDA)
    program = build("emu", "FP32", ["train_gpt2_3d"])[0]
    steps, m = REF4_CUDA["steps"], 4
    B = REF4_CUDA["batch"] // m
    d = fresh_dir("emu_FP32_grid3d_1x2x2_sp_dualpipev_overlap")
    grads_path = os.path.join(d, "grads.bin")
    out = run(program, 4, trainer_args(ref, B, d, ["-n", steps, "-dump_grads", grads_path, "-check_replicas", 1,
                                                   "-pp_overlap", 1] + grid3d_flags(1, 2, 2, 1, "dualpipev", 2),
                                       cfg=REF4_CUDA), d)
    check_cuda_against_reference(ref, d, grads_path, "FP32", "emu train_gpt2_3d FP32 1x2x2 -sp dualpipev -pp_overlap 1")
    check_grid3d_step_bytes(out, d, grid3d_step_bytes(REF4_CUDA, B, m, 1, 2, 2, 1, 2, 0, X=4, v_shape=True), steps)
    assert "step %d: tp copies of the replicated tensors identical" % steps in out, out[-2000:]
