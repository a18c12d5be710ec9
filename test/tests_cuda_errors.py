# The CUDA backend under mpirun: an error that every rank meets alike at run time is printed once,
# by rank 0, and the job ends with exit code 1, not MPI's abort report (llmc/cuda/comm.cuh gives
# utils.h's check_every_rank an MPI count of the failing ranks and a finalize that ends NCCL, then
# MPI). Run on the emulator's FP32 build (test/cuda_emu; the cheaper of its two builds) with 2
# emulated GPUs, so that the ranks talk through the (emulated) NCCL calls, and with 1, so that the
# two ranks share it and take the host-staged MPI path. Both errors come within seconds: a model
# file with a bad header is refused before any step, and -l 1e30 makes step 2's loss non-finite.


def cuda_error_lines(out):
    """the lines of a job's output that report an error: ours, or MPI's abort"""
    return [l for l in out.splitlines() if re.search(r"\berror\b|MPI_ABORT", l)]


def check_cuda_error_once(code, out, message):
    """one 'error: ...' line holding message, no '[rank', no abort report, exit code 1"""
    lines = cuda_error_lines(out)
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], \
        "%r: expected one 'error: ...' line\n%s" % (message, "\n".join(lines) or out[-2000:])
    assert "[rank" not in out and "MPI_ABORT" not in out, out[-2000:]
    # (mpirun passes on the first non-zero exit code of a rank: 1 from exit(1) after MPI_Finalize)
    assert code == 1, "exit code %d\n%s" % (code, out[-2000:])


@test
def emu_errors_every_rank_meets_print_once_by_rank_0_fp32():
    """2 ranks of the CUDA build of train_gpt2_dp meet the same error: a model file whose header
    has magic number 0 (every_rank_alike), and a non-finite loss at step 2 (check_every_rank)"""
    (program,) = build("emu", "FP32", ["train_gpt2_dp"])
    ref = reference_run()
    d = fresh_dir("emu_errors_once")
    bad = os.path.join(d, "model.bin")
    with open(bad, "wb") as f:
        f.write(b"\0" * 1024)  # (a 256-int header of zeros: magic number 0)
    for devices in ("2", "1"):  # (NCCL calls; the host-staged path)
        env = {"CUDA_EMU_DEVICES": devices}
        code, out = mpirun(2, ["-e", bad, "-v", 0, "-s", 0], program=program, timeout=60, env=env)
        check_cuda_error_once(code, out, "model file '%s' has magic number 0" % bad)
        # the smallest run that steps: 1 sequence of 16 tokens a rank; step 1 takes lr 1e30,
        # so step 2's loss is not finite
        args = ["-e", os.path.join(ref["dir"], "model.bin")] + data_args() + \
               ["-b", 1, "-t", 16, "-x", 3, "-v", 0, "-s", 0, "-l", 1e30]
        code, out = mpirun(2, args, program=program, timeout=120, env=env)
        check_cuda_error_once(code, out, "step 2: the loss is")
