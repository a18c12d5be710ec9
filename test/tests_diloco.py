# DiLoCo (train_gpt2_diloco.cu): issue 58's findings on its chapter. Read by test/run_tests.py
# into its namespace, so its helpers (test, run_ok, fresh_dir, reference_run, trainer_args,
# DILOCO, reference, ...) are used here as they are.


def diloco_reference_of(name, cfg, **kw):
    """test/reference.py's run_diloco from the reference's initial weights into a directory of this
    file's own (its cache key names every flag given here): its final.bin, as weights"""
    out = os.path.join(TMP, "reference_diloco_h4_" + name)
    init = os.path.join(reference_run(REF)["dir"], "model.bin")
    flags = dict(dict(cfg, out=out, init=init, micro=1, dtype="float64", fragments=1, outer_dtype="fp32", alpha=0.0,
                      fragment_layout="contiguous", tau=0), **kw)
    shared_dir(out, lambda out: reference.run_diloco(type("Args", (), dict(flags, out=out))))
    return reference.read_model_file(os.path.join(out, "final.bin"))[1]


@test
def diloco_checkpoint_model_file_holds_the_merged_weights_with_alpha():
    """-alpha 0.5: the model file of a checkpoint at an outer step (-n 2, -H 2: step 2) holds
    worker 0's weights as the merge left them, 0.5 theta_local + 0.5 theta_outer, as the header
    of train_gpt2_diloco.cu says; not theta_outer (the run's last model file, unmerged). Both
    from the reference, written from the paper: one worker on one rank (W = 1, so that worker
    0's theta_local is the reference's lone worker: run_diloco with outer_lr 1 and no momentum
    keeps theta_outer equal to it), and the reference's theta_outer after 2 steps (outer_lr 0.7,
    momentum 0.9). -q 1: the learning rate after warmup is constant, so a reference of 2 steps
    takes the same inner steps as the trainer's first 2 of 4; -l 1e-2, ten times the suite's, so
    that the worker moves far enough from theta_outer in 2 steps for the two to differ. Bound: the DiLoCo tests' (diloco_run)
    2e-5 times the outer step's gain on an error of the pseudo-gradient, lr (1 + mu) = 1.33, plus
    twice the reference's own float32-to-float64 spread; the model file must also lie more than
    20 times that bound from theta_outer, so that the check tells the two apart"""
    cfg = dict(REF, steps=2, final_lr_frac=1.0, lr=1e-2)
    common = dict(workers=1, H=2, ranks=1)
    local = diloco_reference_of("local", cfg, outer_lr=1.0, outer_momentum=0.0, **common)
    outer = diloco_reference_of("outer", cfg, outer_lr=0.7, outer_momentum=0.9, **common)
    outer32 = diloco_reference_of("outer32", cfg, outer_lr=0.7, outer_momentum=0.9, dtype="float32", **common)
    local32 = diloco_reference_of("local32", cfg, outer_lr=1.0, outer_momentum=0.0, dtype="float32", **common)
    merged = 0.5 * local + 0.5 * outer
    merged32 = 0.5 * local32 + 0.5 * outer32
    d = fresh_dir("diloco_alpha_checkpoint")
    run_ok(1, trainer_args(reference_run(), REF["batch"], d, ["-x", 4, "-q", 1, "-l", 1e-2, "-workers", 1, "-H", 2, "-alpha", 0.5,
                                                              "-n", 2]), program=DILOCO)
    _, model = reference.read_model_file(os.path.join(d, "model_00000002.bin"))
    bound = 0.7 * 1.9 * 2e-5 + 2 * np.abs(merged32 - merged).max()
    err = np.abs(model - merged).max()
    assert err <= bound, "model_00000002.bin: max abs error %.3g against 0.5 theta_local + 0.5 theta_outer, bound %.3g" % (
        err, bound)
    apart = np.abs(merged - outer).max()
    assert apart > 20 * bound, "the merged weights lie only %.3g from theta_outer (bound %.3g): the check cannot tell" % (
        apart, bound)
    print("    model_00000002.bin: %.2e from the merged weights (bound %.2e), which lie %.2e from theta_outer" % (
        err, bound, apart))
