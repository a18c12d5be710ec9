"""
A trainer's run against the PyTorch reference (test/reference.py): its per-step losses and
gradient norms (main.log), its step-0 gradients (-dump_grads) and its final model file, each
within the tolerance of its backend and precision. test/run_tests.py asserts with it;
dev/compare_with_pytorch.py prints its table for a learner.
"""
import json
import os

import numpy as np

import reference

# The reference trains in float64, so every difference below is the trainer's own rounding.
# Each tolerance with its reason:
TOLERANCES = {
    # fp32 on the CPU: the loss's fp32 spacing at 10.8 is 1e-6 and measured errors are ~5e-7, so
    # 1e-5 leaves 20x room while a wrong token, mask or scale moves it by 1e-2 or more. Gradient
    # norms before clipping: measured ~2e-7 relative. Step-0 gradients: fp32 matmuls agree with
    # float64 to ~4e-7 of the largest gradient (a missing 1/accum or 1/ranks is off 2x). An AdamW
    # step moves a weight by up to lr = 1e-3; measured final errors are ~2e-6 after 5 steps, and
    # 2e-5 (2% of one step) catches any wrong update.
    "cpu fp32": dict(loss=1e-5, norm=1e-5, grads=1e-5, grads_metric="max", params_max=2e-5, params_mean=None),
    # fp32 on the GPU (cuBLAS in strict fp32, fp32 kernels): only the summation order differs, as
    # on the CPU; 10x the CPU tolerances for the GPU's reduction orders
    "cuda fp32": dict(loss=1e-4, norm=1e-4, grads=1e-4, grads_metric="l2", params_max=2e-4, params_mean=None),
    # bf16 activations keep 8 bits of mantissa (0.4% per rounding): a loss of 10.8 moves by a few
    # 1e-2 and gradients agree to a few percent; AdamW can flip the sign of updates whose gradient
    # is noise-sized, at most ~2 lr per step (0.01 over 5 steps), but not on average. The norm is
    # shown, not checked (its relative error follows the gradients')
    "cuda bf16": dict(loss=0.05, norm=None, grads=0.1, grads_metric="l2", params_max=1e-2, params_mean=1e-4),
}


def read_log(out_dir):
    """main.log's records: ({step: train record}, {step: val record})"""
    train, val = {}, {}
    with open(os.path.join(out_dir, "main.log")) as f:
        for line in f:
            rec = json.loads(line)
            (train if "train_loss" in rec else val)[rec["step"]] = rec
    return train, val


def read_reference(ref_dir):
    """reference.json of a reference run, with its directory"""
    with open(os.path.join(ref_dir, "reference.json")) as f:
        return dict(json.load(f), dir=ref_dir)


def compare_run(ref, run_dir, grads_path, kind, steps=None):
    """the run in run_dir against the reference `ref` (read_reference) under TOLERANCES[kind].
    Returns a report: rows (step, loss, reference loss, |difference|, norm, reference norm,
    relative difference), checks (name, measured, limit, ok, text) and ok."""
    tol = TOLERANCES[kind]
    steps = steps or len(ref["losses"])
    train, _ = read_log(run_dir)
    rows, checks = [], []
    missing = [s + 1 for s in range(steps) if s + 1 not in train]
    if missing:
        checks.append(("log", len(missing), 0, False, "main.log has no record of steps %s" % missing))
        return dict(rows=rows, checks=checks, ok=False, kind=kind)
    for s in range(steps):
        loss, norm = train[s + 1]["train_loss"], train[s + 1]["grad_norm"]
        ref_loss, ref_norm = ref["losses"][s], ref["grad_norms"][s]
        rows.append((s + 1, loss, ref_loss, abs(loss - ref_loss), norm, ref_norm, abs(norm - ref_norm) / ref_norm))
    worst = max(rows, key=lambda r: r[3])
    checks.append(("loss", worst[3], tol["loss"], worst[3] <= tol["loss"],
                   "step %d loss %.7f, reference %.7f" % (worst[0], worst[1], worst[2])))
    worst = max(rows, key=lambda r: r[6])
    checks.append(("gradient norm", worst[6], tol["norm"], tol["norm"] is None or worst[6] <= tol["norm"],
                   "step %d grad norm %.7f, reference %.7f (relative)" % (worst[0], worst[4], worst[5])))
    _, g_ref = reference.read_model_file(os.path.join(ref["dir"], "grads.bin"))
    _, g = reference.read_model_file(grads_path)
    if tol["grads_metric"] == "max":  # the largest error against the largest gradient
        scale = np.abs(g_ref).max()
        err = np.abs(g - g_ref).max() / scale
        text = "step-0 gradients: max abs error %.3g (largest gradient %.3g)" % (err * scale, scale)
    else:  # the whole gradient's relative error
        err = np.linalg.norm(g - g_ref) / np.linalg.norm(g_ref)
        text = "step-0 gradient relative error %.3g" % err
    checks.append(("step-0 gradients", err, tol["grads"], err <= tol["grads"], text))
    _, p_ref = reference.read_model_file(os.path.join(ref["dir"], "final.bin"))
    _, p = reference.read_model_file(os.path.join(run_dir, "model_%08d.bin" % steps))
    err_max, err_mean = np.abs(p - p_ref).max(), np.abs(p - p_ref).mean()
    checks.append(("final weights (max)", err_max, tol["params_max"], err_max <= tol["params_max"],
                   "final parameters: max abs error %.3g" % err_max))
    if tol["params_mean"] is not None:
        checks.append(("final weights (mean)", err_mean, tol["params_mean"], err_mean <= tol["params_mean"],
                       "final parameters: mean abs error %.3g" % err_mean))
    return dict(rows=rows, checks=checks, ok=all(c[3] for c in checks), kind=kind)


def assert_matches(report):
    """raises AssertionError naming every check that failed"""
    failed = [c[4] + " (limit %.3g)" % c[2] for c in report["checks"] if not c[3]]
    assert not failed, "; ".join(failed)


def format_report(report):
    """the per-step table, then each check beside its tolerance, then PASS or FAIL"""
    lines = [" step   trainer loss   pytorch loss     |diff|   trainer norm   pytorch norm   rel diff"]
    for step, loss, ref_loss, diff, norm, ref_norm, rel in report["rows"]:
        lines.append("%5d  %13.7f  %13.7f  %9.2e  %13.7f  %13.7f  %9.2e" % (step, loss, ref_loss, diff, norm, ref_norm, rel))
    lines.append("tolerances for %s (test/comparison.py says why):" % report["kind"])
    for name, value, limit, ok, _ in report["checks"]:
        bound = "not checked" if limit is None else "limit %.1e" % limit
        lines.append("  %-22s %9.2e   %-13s %s" % (name, value, bound, "ok" if ok else "FAILED"))
    lines.append("PASS: the trainer matches PyTorch" if report["ok"] else "FAIL: the trainer does not match PyTorch")
    return "\n".join(lines)
