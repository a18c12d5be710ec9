"""
Mutation sweep of the trainers' mechanisms: do the tests catch a one-line bug in each?

Each mutation below is a bug a reviewer might plant: a file, the text of its line (or lines) as
the code has it now, the text that replaces it, the trainers and programs to build, and the tests
(test/run_tests.py name filters) that must catch it. One at a time, on a copy of this checkout
(never the checkout itself: a sweep killed half-way leaves the user's files as they were), the
sweep plants the mutation, builds, runs the tests, and calls it caught when a test fails. Its
table names the test that failed and says why (the first line of the failure), and the time.

    /usr/bin/python3 dev/mutation_sweep.py [--no-control] [--keep] [filter ...]
filter: a part of a mutation's name (e.g. "moe", "diloco"; several: any of them). A control run
comes first: the unmutated copy must pass every test the selected mutations name, else "caught"
would mean nothing; its references (test/tmp) are then shared by the mutations' runs.
--no-control leaves it out (the tests are known to pass); --keep keeps each mutated copy's
directory. A mutation whose text is no longer in its file, or that does not compile, is "not
run": the list needs updating.
Not part of `make test`: 22 of them took 18 minutes on 2 cores shared with other work (about 40 s a
mutation: a build and a test or two; 2.5 minutes for the control); the 20 moe and 5d ones 13 minutes
(about 30 s a mutation, a 66-s control). All are caught.
dev/cuda/mutation_sweep.py is its sibling for the CUDA kernels' barriers under the emulator;
both copy the tree into a scratch directory of their own (copy_checkout) and plant there.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EP, DP, TP, PP, D3, CP, DILOCO = ("train_gpt2_" + t for t in ("ep", "dp", "tp", "pp", "3d", "cp", "diloco"))
PLANNER = "dev/memory_planner"


def mutation(name, path, old, new, tests, build):
    return dict(name=name, path=path, old=old, new=new, tests=tests, build=build)


MUTATIONS = [
    # ---- Mixture-of-Experts (train_gpt2_ep.cu, llmc/moe.h, llmc/cpu/moe.h)
    mutation("moe: top-k ties go to the higher index", "llmc/cpu/moe.h",
             "st[e] + bias[e] > st[best] + bias[best]", "st[e] + bias[e] >= st[best] + bias[best]",
             ["ep_ties_go_to_the_lower_experts"], [EP]),
    mutation("moe: the bias rule's sign flipped", "llmc/moe.h",
             "m->bias_rate * (float)((d > 0) - (d < 0))", "m->bias_rate * (float)((d < 0) - (d > 0))",
             ["ep_vs_pytorch_np4_ep4_accum1_E4_k1_bias"], [EP]),
    mutation("moe: gates a softmax over all E, not the chosen k", "llmc/cpu/moe.h",
             "for (int j = 0; j < k; j++) sum += expf(st[picked[j]] - top);",
             "for (int e = 0; e < E; e++) sum += expf(st[e] - top);",
             ["ep_vs_pytorch_np2_ep2_accum1_E4_k2_aux"], [EP]),
    mutation("moe: capacity rounded down", "llmc/memory_plan.h",
             "double cap = ceil((double)cf * N * k / E * (1.0 - 1e-7));",
             "double cap = floor((double)cf * N * k / E * (1.0 - 1e-7));",
             ["ep_vs_pytorch_np2_ep1_accum1_E4_k2_aux_cf1.25"], [EP, PLANNER]),
    mutation("moe: the aux loss's gradient without its factor E", "llmc/moe.h",
             "aux_weight * m->aux_alpha * E / (float)", "aux_weight * m->aux_alpha / (float)",
             ["ep_vs_pytorch_np2_ep2_accum1_E4_k2_aux"], [EP]),
    mutation("moe: the experts' gradients read without 1/ep", "llmc/moe.h",
             "float scale = r == 1 ? clip_scale * expert_scale : clip_scale;", "float scale = clip_scale;",
             ["ep_vs_pytorch_np4_ep2_accum1_E4_k2_aux"], [EP]),
    mutation("moe: the experts read from the file expert-major, not layer-major", "llmc/model.h",
             "uint64_t block = layer * s.groups + group0 + group;",
             "uint64_t block = s.grouping == GROUPS_EXPERTS ? (group0 + group) * (uint64_t)p->layers + layer "
             ": layer * s.groups + group0 + group;",
             ["ep_vs_pytorch_np2_ep2_accum1_E4_k2_aux"], [EP]),
    mutation("moe: the planner's output rows doubled", "llmc/memory_plan.h",
             "(layers * (R * C + 2 * R * 4 * C + S * C)", "(layers * (R * C + 2 * R * 4 * C + 2 * S * C)",
             ["ep_collapsed_router_max_vio_drops_and_bytes"], [EP, PLANNER]),
    mutation("moe: a sample routed dropless into buffers sized for the capacity", "llmc/moe.h",
             "moe_assign_rows(x.row, m->counts_dev, x.expert, N, k, E, m->capacity);",
             "moe_assign_rows(x.row, m->counts_dev, x.expert, N, k, E, N == m->N ? m->capacity : N * k);",
             ["sanitized_ep_sampling_with_a_small_capacity"], [EP]),
    mutation("moe: the printed bias range starts from 0", "llmc/moe.h",
             "float lo = m->bias_host[0], hi = m->bias_host[0];", "float lo = 0.0f, hi = 0.0f;",
             ["ep_bias_range_is_the_biases"], [EP]),
    # ---- 5D: experts folded over a grid stage's ranks (train_gpt2_3d.cu, llmc/chunk.h, llmc/moe.h,
    # llmc/tensor_parallel.h). Every grid5d_ case has edp = 1 (a stage's dp x cp x tp ranks = ep):
    # (the edp mutations need a grid with two copies of each expert: dp2_tp2_sp_ep2, dp2_cp2_ep2)
    mutation("5d: the experts' gradients read x 1/ep, not tp/ep", "train_gpt2_3d.cu",
             "return (float)g->tp / (float)g->ep;", "return 1.0f / (float)g->ep;",
             ["grid5d_vs_pytorch_cp2_tp2_sp_ep4"], [D3]),
    mutation("5d: the routers left out of the tp all-reduce", "llmc/tensor_parallel.h",
             "PARAM_ROUTERW};\n    for (int i = 0; i < 7; i++) {", "PARAM_ROUTERW};\n    for (int i = 0; i < 6; i++) {",
             ["grid5d_vs_pytorch_pp2_tp2_sp_ep2"], [D3]),
    mutation("5d: the aux loss's sequence shares not summed over the seq group", "llmc/moe.h",
             "t.T_seq, k, E);\n        if (t.seq_group) comm_all_reduce(t.seq_group, x.shares, (size_t)t.B * 2 * E, "
             "COMM_FLOAT, COMM_SUM);",
             "t.T_seq, k, E);",
             ["grid5d_vs_pytorch_cp2_tp2_sp_ep4"], [D3]),
    mutation("5d: the experts reduced over dp x cp, not edp", "train_gpt2_3d.cu",
             "if (g->edp_group.size > 1) comm_all_reduce(&g->edp_group, model->grads_memory + lo,",
             "if (g->dp_group.size > 1) comm_all_reduce(&g->dp_group, model->grads_memory + lo,",
             ["grid5d_vs_pytorch_dp2_ep2"], [D3]),
    mutation("5d: the experts' edp all-reduce left out", "train_gpt2_3d.cu",
             "    if (g->edp_group.size > 1) comm_all_reduce(&g->edp_group, model->grads_memory + lo, hi - lo, COMM_FLOATX, "
             "COMM_AVG);\n", "",
             ["grid5d_vs_pytorch_dp2_cp2_ep2"], [D3]),
    mutation("5d -z 1: the experts' shards reduce-scattered over dp x cp, not edp", "train_gpt2_3d.cu",
             "comm_reduce_scatter(&g->edp_group, model->grads_memory + lo,",
             "comm_reduce_scatter(&g->dp_group, model->grads_memory + lo,",
             ["grid5d_vs_pytorch_dp2_cp2_ep2_z1"], [D3]),
    mutation("5d -z 1: the experts' shard updated without tp/ep", "train_gpt2_3d.cu",
             "float scale = r == 0 ? *clip_scale : *clip_scale * expert_grad_scale(g);", "float scale = *clip_scale;",
             ["grid5d_vs_pytorch_dp2_pp2_ep2_z1"], [D3]),
    mutation("5d -z 1: a checkpoint gathers the experts' shards over the dense tensors' group", "llmc/train.h",
             "comm_all_gather(shards.experts,", "comm_all_gather(shards.dense,",
             ["grid5d_zero1_checkpoints_resume_on_any_grid"], [D3]),
    mutation("5d: the experts counted in the norm by every copy", "train_gpt2_3d.cu",
             "return g->edp_group.rank == 0 ? global_norm_squared(model->grads_memory + lo, hi - lo) * scale * scale : 0.0f;",
             "return global_norm_squared(model->grads_memory + lo, hi - lo) * scale * scale;",
             ["grid5d_vs_pytorch_dp2_tp2_sp_ep2"], [D3]),
    mutation("5d: every micro-batch in flight in the MoE record 0", "llmc/chunk.h",
             "&st->moe->records[a - st->slots]", "&st->moe->records[0]",
             ["grid5d_vs_pytorch_dp2_pp2_tp2_sp_ep4_zb"], [D3]),
    # ---- DiLoCo (train_gpt2_diloco.cu, llmc/outer_link.h, llmc/cpu/outer.h, llmc/precision.h)
    mutation("diloco: -tau applied a step late", "train_gpt2_diloco.cu",
             "apply_after = completed + link->tau;", "apply_after = completed + link->tau + 1;",
             ["diloco_streaming_w2_2_ranks_h4_f2_strided_alpha0.3_tau1"], [DILOCO]),
    mutation("diloco: -alpha and 1 - alpha swapped", "llmc/cpu/outer.h",
             "merged = alpha * local + (1.0f - alpha) * outer[i];", "merged = (1.0f - alpha) * local + alpha * outer[i];",
             ["diloco_streaming_w2_2_ranks_h4_f2_strided_alpha0.3"], [DILOCO]),
    mutation("diloco: strided fragments off by one", "train_gpt2_diloco.cu",
             "return strided ? l % F == f", "return strided ? (l + 1) % F == f",
             ["diloco_streaming_w2_2_ranks_h4_f2_strided_alpha0.3"], [DILOCO]),
    mutation("diloco: e3m0's lowest threshold at 2^-6", "llmc/precision.h",
             "unsigned e = a >= scale * 0.0078125f;", "unsigned e = a >= scale * 0.015625f;",
             ["diloco_e3m0_w3_3_ranks_h2_f2_contiguous"], [DILOCO]),
    mutation("diloco: plain momentum, not Nesterov's step", "llmc/cpu/outer.h",
             "bf16_to_float(delta_bf16[i]);\n        momentum[i] = mu * momentum[i] + g;\n"
             "        outer[i] -= lr * (g + mu * momentum[i]);",
             "bf16_to_float(delta_bf16[i]);\n        momentum[i] = mu * momentum[i] + g;\n"
             "        outer[i] -= lr * momentum[i];",
             ["diloco_vs_reference_w2_h3_2_ranks_accum_2"], [DILOCO]),
    # ---- tensor parallelism and its overlap (llmc/tensor_parallel.h)
    mutation("tp: g after attproj left out (no all-reduce of the partial sums)", "llmc/tensor_parallel.h",
             "floatX* attproj = tp_row_parallel(tp, d,", "floatX* attproj = tp_row_parallel(NULL, d,",
             ["tp_vs_pytorch_tp2_accum_1"], [TP]),
    mutation("tp overlap: the scatter ring's block off by one", "llmc/tensor_parallel.h",
             "int block = (r - s - 1 + n) % n;", "int block = (r - s + n) % n;",
             ["tp_vs_pytorch_tp2_sp_accum_2_overlap"], [TP]),
    mutation("tp overlap: the MLP backward's pending sum not waited for", "llmc/tensor_parallel.h",
             "    tp_pending_finish(&in_flight);\n    layernorm_backward(dresidual, gw.ln2w",
             "    layernorm_backward(dresidual, gw.ln2w",
             ["tp_vs_pytorch_tp2_sp_accum_2_overlap"], [TP]),
    # ---- data parallelism and ZeRO (train_gpt2_dp.cu, llmc/model.h)
    mutation("ddp: the gradients summed, not averaged", "train_gpt2_dp.cu",
             "if (z->stage == 0) comm_all_reduce_start(z->dp, grad, parameter_bucket_size(p, k), COMM_FLOATX, COMM_AVG,",
             "if (z->stage == 0) comm_all_reduce_start(z->dp, grad, parameter_bucket_size(p, k), COMM_FLOATX, COMM_SUM,",
             ["dp_vs_pytorch_2_ranks_accum_1"], [DP]),
    mutation("zero: every rank's shard at shard 0's offset", "llmc/model.h",
             "*global = parameter_bucket_offset(p, k) + (uint64_t)p->shard_rank * *n;",
             "*global = parameter_bucket_offset(p, k);",
             ["dp_zero1_vs_pytorch_2_ranks_accum_1"], [DP]),
    # ---- pipeline parallelism (llmc/pipeline.h)
    mutation("pp: 1F1B's warm-up one forward longer", "llmc/pipeline.h",
             ": pipeline_min(total, s.p - stage - 1);", ": pipeline_min(total, s.p - stage);",
             ["pipeline_schedules"], ["test/test_pipeline"]),
    mutation("pp: zero bubble's W before its B", "llmc/pipeline.h",
             "        out[n++] = pipe_action(PIPE_BACKWARD, backwards++, 0);\n",
             "        if (s.sched == SCHEDULE_ZB && weights < s.m) out[n++] = pipe_action(PIPE_WEIGHT, weights++, 0);\n"
             "        out[n++] = pipe_action(PIPE_BACKWARD, backwards++, 0);\n",
             ["pipeline_schedules", "pp_vs_pytorch_pp2_zb_m4"], ["test/test_pipeline", PP]),
    # ---- context parallelism (llmc/context_parallel.h, llmc/cpu/ring_attention.h)
    mutation("cp: the log-sum-exp merge rescales by e^(lse' - lse)", "llmc/cpu/ring_attention.h",
             "float keep = first ? 0.0f : expf(*l - lse_new)", "float keep = first ? 0.0f : expf(lse_new - *l)",
             ["cp_vs_pytorch_cp2_zigzag_ring_accum_1"], [CP]),
    mutation("cp: the ring's step 0 not the rank's own block", "llmc/context_parallel.h",
             "        for (int s = 0; s < n; s++) {\n            floatX* here = cp->kv[s % 2];  // the block of rank r - s\n"
             "            int owner = (r + n - s) % n;",
             "        for (int s = 0; s < n; s++) {\n            floatX* here = cp->kv[s % 2];  // the block of rank r - s\n"
             "            int owner = (r + n - s - 1) % n;",
             ["cp_vs_pytorch_cp2_zigzag_ring_accum_1"], [CP]),
]


def checkout_files(root):
    """the checkout's files as a user sees them: tracked ones and new ones git does not ignore"""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                         stdout=subprocess.PIPE, check=True).stdout.decode()
    return [f for f in out.split("\0") if f and os.path.isfile(os.path.join(root, f))]


def copy_checkout(dest, files=None, root=ROOT):
    """the checkout's files (or `files`, paths relative to it) copied into dest, times kept so that
    make rebuilds only what a mutation touches"""
    shutil.rmtree(dest, ignore_errors=True)
    for f in files if files is not None else checkout_files(root):
        os.makedirs(os.path.dirname(os.path.join(dest, f)), exist_ok=True)
        shutil.copy2(os.path.join(root, f), os.path.join(dest, f))


def plant(tree, m):
    """m's replacement in place of its text, which must occur exactly once (else the list is stale:
    None and why)"""
    path = os.path.join(tree, m["path"])
    if not os.path.exists(path):
        return "%s does not exist" % m["path"]
    with open(path) as f:
        text = f.read()
    count = text.count(m["old"])
    if count != 1:
        return "its text occurs %d times in %s (the list needs updating)" % (count, m["path"])
    with open(path, "w") as f:
        f.write(text.replace(m["old"], m["new"]))
    return None


def build(tree, targets):
    """make's targets in tree, CPU backend; None, or why it failed"""
    p = subprocess.run(["make", "-s", "-j2", "BACKEND=cpu"] + sorted(set(targets)), cwd=tree, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT)
    return None if p.returncode == 0 else "build failed: " + p.stdout.decode("utf-8", "replace")[-400:]


def run_tests(tree, pattern, env):
    """test/run_tests.py pattern in tree: ("passed" or "failed", [(failed test, the start of why)]),
    or ("none", [why]) when no test ran (a filter that matches nothing is no catch)"""
    try:
        p = subprocess.run([sys.executable, "test/run_tests.py", pattern], cwd=tree, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=3600)
    except subprocess.TimeoutExpired:  # (each run in a test has its own timeout: this is the runner's own hang)
        return "failed", [(pattern, "the test runner did not end within an hour")]
    out = p.stdout.decode("utf-8", "replace")
    failed = [(m.group(1), re.sub(r"^ \(its files kept: [^)]*\)", "", m.group(2)).strip(" :")[:160])
              for m in re.finditer(r"^FAIL (\S+) \([\d.]+s\)(.*)$", out, re.M)]
    ran = re.search(r"^(\d+) passed, (\d+) failed", out, re.M)
    if ran is None or int(ran.group(1)) + int(ran.group(2)) == 0:
        return "none", ["no test matches %r, or the runner stopped: %s" % (pattern, out[-300:])]
    return ("passed" if p.returncode == 0 and not failed else "failed"), failed


def main():
    args = sys.argv[1:]
    control = "--no-control" not in args
    keep = "--keep" in args
    args = [a for a in args if not a.startswith("--")]
    todo = [m for m in MUTATIONS if not args or any(a in m["name"] for a in args)]
    started = time.time()
    scratch = tempfile.mkdtemp(prefix="llmc_mutation_sweep_")
    base = os.path.join(scratch, "base")
    # one suite id for every run: the references the control made (test/tmp) are reused as-is
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    env.update(LLMC_TEST_SUITE="mutation_sweep.%d" % os.getpid(), TEST_JOBS="1", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    print("copying the checkout into %s" % base, flush=True)
    copy_checkout(base)
    error = build(base, sum((m["build"] for m in todo), [PLANNER]))
    if error:
        sys.exit("the unmutated copy does not build: " + error)
    if control:
        t0 = time.time()
        for pattern in dict.fromkeys(p for m in todo for p in m["tests"]):
            status, failed = run_tests(base, pattern, env)
            if status != "passed":
                sys.exit("the unmutated copy fails %s: %s (no sweep)" % (pattern, failed))
        print("control: every named test passes unmutated (%.0f s)" % (time.time() - t0), flush=True)
    rows, missed = [], 0
    for i, m in enumerate(todo):
        t0 = time.time()
        tree = os.path.join(scratch, "m%02d" % i)
        shutil.copytree(base, tree, symlinks=True)  # (the built programs and the references too)
        caught = None
        # not run: the list's text is not in the code any more, or the mutation does not compile
        # (a bad mutation, not a catch)
        stale = plant(tree, m) or build(tree, m["build"] + [PLANNER])
        if stale is None:
            for pattern in m["tests"]:
                status, failed = run_tests(tree, pattern, env)
                if status == "none":
                    stale = failed[0]
                if status != "passed":
                    caught = failed if status == "failed" else None
                    break
        seconds = time.time() - t0
        if stale:
            cell = "**not run**: " + stale
        elif caught:
            cell = "caught by %s: %s" % (caught[0][0], caught[0][1].replace("|", "/").replace("\n", " "))
        else:
            cell = "**missed** (%s)" % ", ".join(m["tests"])
        missed += not caught
        # the mutated line (of a snippet, the line that differs)
        line = next((l for l in m["new"].split("\n") if l not in m["old"].split("\n")), m["new"]).strip()
        rows.append("| %s | %s | `%s` | %s | %.0f s |" % (m["name"], m["path"], line[:90], cell, seconds))
        print(rows[-1], flush=True)
        if not keep:
            shutil.rmtree(tree, ignore_errors=True)
    print()
    print("| mechanism | file | mutation | result | time |")
    print("| --- | --- | --- | --- | --- |")
    print("\n".join(rows))
    print("%d mutations, %d caught, %d missed or not run (%.0f s in all)" % (len(todo), len(todo) - missed, missed,
                                                                       time.time() - started))
    if not keep:
        shutil.rmtree(scratch, ignore_errors=True)
    sys.exit(1 if missed else 0)


if __name__ == "__main__":
    main()
