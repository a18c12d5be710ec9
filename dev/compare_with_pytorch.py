#!/usr/bin/python3
"""
Train one of this project's trainers and the PyTorch reference (test/reference.py) from the same
initial weights on the same batches with the same hyperparameters, and compare them step by step:
a table of both losses and gradient norms, the step-0 gradients and the final weights, each
beside the tolerance of the trainer's backend and precision (test/comparison.py), and a PASS or
FAIL line (exit status 0 or 1).

    /usr/bin/python3 dev/compare_with_pytorch.py [options] TRAINER [-- TRAINER FLAGS]

TRAINER is a built trainer (./train_gpt2_3d, build/emu_FP32/train_gpt2_tp, ...); the flags after
-- are its own (its layout, -b, -z, -sched ...): the hyperparameters and files the comparison
needs (-e -i -t -d -x -l -u -q -c -gc -o -n -dump_grads) are set here and must not be repeated.
Examples:
    /usr/bin/python3 dev/compare_with_pytorch.py --ranks 2 ./train_gpt2_dp -- -z 1 -b 4
    /usr/bin/python3 dev/compare_with_pytorch.py --ranks 8 ./train_gpt2_3d -- -dp 2 -pp 2 -tp 2 -sp 1 -b 2
    /usr/bin/python3 dev/compare_with_pytorch.py --ranks 4 --env CUDA_EMU_DEVICES=4 build/emu_FP32/train_gpt2_3d -- -pp 2 -tp 2 -b 8
or through make: make compare TRAINER=train_gpt2_pp RANKS=2 FLAGS="-sched zb -b 2"
"""
import argparse
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "test"))
import comparison  # noqa: E402
import reference  # noqa: E402

# the flags this tool sets: a user's copy after -- would silently change what is compared
OWN_FLAGS = ("-e", "-i", "-t", "-d", "-x", "-l", "-u", "-q", "-c", "-gc", "-o", "-n", "-dump_grads", "-y", "-shuffle")


def parse_args(argv):
    trainer_flags = []
    if "--" in argv:
        at = argv.index("--")
        argv, trainer_flags = argv[:at], argv[at + 1:]
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trainer", help="the trainer's program")
    ap.add_argument("--ranks", type=int, default=1, help="processes, launched with mpirun (default 1)")
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="environment of the trainer's ranks")
    # the model and the run, as test/reference.py takes them (4 layers by default: pp 1, 2 and 4 fit)
    reference.add_run_arguments(ap, layers=4)
    ap.add_argument("--tolerance", choices=sorted(comparison.TOLERANCES), help="default: from the trainer's banner")
    ap.add_argument("--out", default=os.path.join(ROOT, "out", "compare"), help="where both runs write (emptied first)")
    args = ap.parse_args(argv)
    if args.steps < 1 or args.ranks < 1:
        ap.error("--steps %d --ranks %d: both at least 1 (the comparison is of each step's loss and the last step's "
                 "weights)" % (args.steps, args.ranks))
    clash = [f for f in trainer_flags if f in OWN_FLAGS]
    if clash:
        ap.error("%s: set by this tool (its options --steps, --lr, ... choose them for both runs)" % " ".join(clash))
    return args, trainer_flags


def launch(args, flags):
    """the trainer's command line: under mpirun unless one rank and no mpirun"""
    program = os.path.abspath(args.trainer)
    if not os.path.exists(program):
        sys.exit("error: no trainer at %s (build it first: make %s)" % (program, os.path.basename(program)))
    cmd = [program] + [str(f) for f in flags]
    if args.ranks > 1 or shutil.which("mpirun"):
        as_root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
        cmd = ["mpirun"] + as_root + ["--oversubscribe", "-np", str(args.ranks)] + cmd
    return cmd


def main():
    args, trainer_flags = parse_args(sys.argv[1:])
    shutil.rmtree(args.out, ignore_errors=True)
    ref_dir, run_dir = os.path.join(args.out, "reference"), os.path.join(args.out, "run")
    os.makedirs(run_dir)

    # 1. the reference: writes the initial weights (model.bin) the trainer starts from
    ref_args = argparse.Namespace(out=ref_dir, dtype="float64", **{k: v for k, v in vars(args).items()
                                                                   if k not in ("out", "trainer", "ranks", "env", "tolerance")})
    print("reference: test/reference.py, %s, global batch %d x %d tokens, %d steps, float64 -> %s" % (
        "weights of " + args.init if args.init else "L=%d NH=%d C=%d (seed %d)" % (args.layers, args.heads, args.channels, args.seed),
        args.batch, args.seq_len, args.steps, ref_dir))
    reference.run(ref_args)
    ref = comparison.read_reference(ref_dir)

    # 2. the trainer on the same weights, batches and hyperparameters
    grads_path = os.path.join(run_dir, "grads.bin")
    flags = trainer_flags + ["-e", os.path.join(ref_dir, "model.bin"), "-i", args.tokens, "-t", args.seq_len,
                             "-d", args.batch * args.seq_len, "-x", args.steps, "-l", args.lr, "-u", args.warmup,
                             "-q", args.final_lr_frac, "-c", args.weight_decay, "-gc", args.grad_clip,
                             "-v", 0, "-s", 0, "-o", run_dir, "-n", args.steps, "-dump_grads", grads_path]
    cmd = launch(args, flags)
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    env.update(kv.split("=", 1) for kv in args.env)
    print("trainer:   %s" % " ".join(str(c) for c in cmd))
    p = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = p.stdout.decode("utf-8", "replace")
    with open(os.path.join(run_dir, "stdout.txt"), "w") as f:
        f.write(out)
    print("           its output: %s, its log: %s" % (os.path.join(run_dir, "stdout.txt"), os.path.join(run_dir, "main.log")))
    if p.returncode != 0:
        print(out[-3000:])
        print("FAIL: the trainer exited with status %d" % p.returncode)
        sys.exit(1)

    # 3. the comparison, under the tolerances of the trainer's backend and precision
    banner = re.search(r"backend (\w+), precision (\w+)", out)
    kind = args.tolerance or ("%s %s" % banner.groups() if banner else "cpu fp32")
    report = comparison.compare_run(ref, run_dir, grads_path, kind)
    print(comparison.format_report(report))
    print("plot the loss curves: /usr/bin/python3 dev/plot_runs.py -o %s --reference %s trainer=%s" % (
        os.path.join(args.out, "losses.png"), ref_dir, run_dir))
    sys.exit(0 if report["ok"] else 1)


if __name__ == "__main__":
    main()
