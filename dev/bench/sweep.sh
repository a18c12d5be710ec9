#!/usr/bin/env bash
# Which layout is fastest? The Ultra-Scale Playbook's experiment at laptop scale: for a model and N
# ranks, the layouts the memory planner's search lists (dev/memory_planner -search N: every grid
# of dp x tp x pp x cp, ZeRO stage, -sp, -r, -offload and CP's exchange its trainers run), all of
# them or a seeded random sample, each run for a few steps on the CPU backend, its step time the
# median of the steps after the warm-up (main.log's "ms"; the first steps fill caches and
# allocate), or with -measure fastest the fastest of them. Then a table of the layouts, fastest
# first.
#
# With a model of step time it is also that model's test: each layout's predicted seconds beside
# the measured, and the summary line
#   sweep: N layouts, spearman R, median error E%, worst error W%, predicted best ranks K of N measured
# (dev/bench/sweep_stats.py says how each figure is computed), and a figure of predicted against
# measured. The predictions come from a command: PREDICT_CMD (or -predict) is run once a layout
# with the planner's flags for that layout appended (-e -b -t -d -device cpu -trainer -dp -tp -pp
# -cp -ep -z -sp -r -offload -cp_comm, -sched and -vp with a pipeline, -profile FILE when one is
# given) and prints the step's seconds: as a JSON object's "step_seconds" or as a number alone
# on its last line. By default it is the planner itself (./dev/memory_planner -format json),
# whose JSON has "step_seconds" once it models step time; until then the sweep says that no
# predictions were available and prints the measured times alone.
#
#   ./dev/bench/sweep.sh                          d4, B=2, T=64, 4 ranks, a sample of 24 (seed 1)
#   ./dev/bench/sweep.sh -np 8 -all               every layout of 8 ranks
#   ./dev/bench/sweep.sh -calibrate               measure this machine first (dev/bench/calibrate),
#                                                 and predict with that fresh profile
#   PREDICT_CMD=./my_model ./dev/bench/sweep.sh   predictions from another program
#
# Flags (defaults in brackets):
#   -e MODEL      the model, as the trainers' -e [d4: 4 layers, C = 256, 4 heads, so tp and pp up to 4]
#   -b B, -t T    micro-batch and sequence length [2, 64]
#   -d TOKENS     total batch a step [B x T x N: one micro-batch a rank when all N are replicas;
#                 a layout with fewer replicas accumulates micro-batches to the same batch]
#   -np N         ranks [4]
#   -sample K     run K layouts drawn at random from the search's list, when it lists more [24]
#   -seed S       the sample's seed [1]
#   -all          run every layout the search lists
#   -filter RE    only the layouts whose label (the planner's, e.g. "train_gpt2_tp -tp 4 -sp 1
#                 -r 0") matches the extended regular expression RE, before the sample
#   -warmup W     steps left out of the measure [2]
#   -steps S      steps measured after the warm-up [4]
#   -repeat R     measure the layouts R times, in R passes: the 1st in order, the 2nd in reverse,
#                 the 3rd in order...; a layout's time the median of its passes' (with 2, their
#                 mean; with -measure fastest its fastest step of them all), and a line that says
#                 how well the passes agree [1]
#   -measure M    a layout's time: median (the median of its steps after the warm-up, of its passes'
#                 medians with -repeat) or fastest (its fastest step after the warm-up, of all its
#                 passes: the noise of a shared machine only adds time; dev/bench/README.md says
#                 more); the report ranks by the other one too, on the line before the summary [median]
#   -sched NAME   the pipeline schedule of the layouts with pp > 1 (afab, 1f1b, interleaved, zb) [1f1b]
#   -vp V         chunks of layers a stage, with -sched interleaved [1]
#   -predict CMD  the predictor [PREDICT_CMD, else ./dev/memory_planner -format json]
#   -profile FILE a device profile (llmc/device_profile.h) the predictor is given as -profile FILE
#   -calibrate    first run dev/bench/calibrate (1 thread a rank; on 2, 4 or 8 ranks, the least
#                 that holds -np, so that it measures ranks sharing the host as the sweep runs them)
#                 and predict with its profile (written to -profile FILE when given, else a
#                 temporary file); then, before each run, calibrate -probe times the calibration's
#                 lone GEMMs and triads again, and the table's predictions use the profile's rates
#                 scaled by the calibration's lone times over the probes' medians (their fastest
#                 with -measure fastest): the machine's drift; the line "as calibrated" gives the
#                 summary without it
#   -calibrations K  with -calibrate: K calibrations spread over the passes (before pass 1, then
#                 before pass 1 + i R / K, rounded down, for i = 1 ... K - 1), and the table's
#                 predictions from their median, field by field (sweep_stats.py combine; written
#                 to -profile FILE after the passes), with a line a calibration that says what it
#                 alone would have given: one calibration's minute catches the machine in one
#                 phase, and its collectives are never measured again [1; at most -repeat's R]
#   -figure PNG   where the figure goes [dev/images/sweep_MODEL_N.png; none: no figure]
#   -save FILE    keep the results as tab-separated values (sweep_stats.py's RESULTS.tsv)
#   -timeout S    a layout still running after S seconds is stopped and reported as failed [300]
# Files named by flags are relative to the directory the sweep starts in; the predictor runs in the
# repository's root.
#
# Each rank runs 1 OpenMP thread (OMP_NUM_THREADS=1) and the ranks share the cores: at 4 ranks on
# a 2-core machine two ranks take turns on a core, which the measured times include (as would a
# model of this machine's step that knows its cores, llmc/device_profile.h's cpu_cores). A run
# writes into a temporary -o dir of its own, removed after it; a layout that fails or times out
# is reported and skipped; Ctrl-C stops the running layout and removes the sweep's files.
# The default sweep (24 layouts of d4 at 4 ranks, 6 steps each, 11 to 23 s a layout with the
# start) took 413 s, 7 minutes, on this project's 2-core machine while other work kept its load at
# 6 to 8; its steps spread by up to 100% around their median then (the table's "spread" column):
# on a shared machine the noise, not the model, can decide the ranking. And the machine's speed
# drifts in phases of minutes (one layout measured 1070 ms, then 1470 ms some twenty minutes later),
# which one pass cannot tell from the model's error: -repeat 2 runs every layout twice, the second
# pass in reverse order (so that a slow phase at the end of one pass falls on other layouts in the
# next), and the report's "repeatability" line gives the spearman between the passes: how well
# the machine repeats its own ranking, the noise ceiling to read a model's spearman against
# (dev/bench/sweep_stats.py says more), and the "noise ceiling" line the spearman a model that
# knew every layout's true time could expect against the passes' mean: at 0.5 between passes,
# 0.82 with two passes and 0.93 with six, so a target of 0.9 on a machine this noisy needs -repeat
# 6. Each pass takes as long as the runs of a sweep without it; the planner and the predictor run
# once a layout. The noise is not even: another tenant or a rank's late turn on its core only
# ever adds time to a step, and a layout's fastest step varies less from sweep to sweep than its
# median (two 4-rank sweeps of the same 24 layouts an hour apart ranked them alike at a spearman
# of 0.92 by their fastest steps, 0.37 by their medians): -measure fastest takes it, and the
# machine's drift by its probes' fastest.
set -uo pipefail  # (not -e: a layout that fails is reported, and the sweep goes on)

usage() {
    sed -n '/^#   \.\/dev\/bench\/sweep.sh /,/^#   -timeout/p' "$0" | sed 's/^# \{0,1\}//'
    exit "${1:-0}"
}
fail() {
    echo "error: $*" >&2
    exit 1
}

model=d4 B=2 T=64 batch="" N=4 sample=24 seed=1 all=0 filter="" warmup=2 steps=4 repeat=1 measure=median sched=1f1b vp=1
predict=${PREDICT_CMD:-} profile="" calibrate=0 calibrations=1 figure="" save="" limit=300
while [ $# -gt 0 ]; do
    case "$1" in
        -h|--help) usage 0 ;;
        -all) all=1; shift; continue ;;
        -calibrate) calibrate=1; shift; continue ;;
    esac
    [ $# -ge 2 ] || { echo "error: $1: unknown flag or a flag without its value" >&2; usage 1; }
    case "$1" in
        -e) model=$2 ;;
        -b) B=$2 ;;
        -t) T=$2 ;;
        -d) batch=$2 ;;
        -np) N=$2 ;;
        -sample) sample=$2 ;;
        -seed) seed=$2 ;;
        -filter) filter=$2 ;;
        -warmup) warmup=$2 ;;
        -steps) steps=$2 ;;
        -repeat) repeat=$2 ;;
        -measure) measure=$2 ;;
        -sched) sched=$2 ;;
        -vp) vp=$2 ;;
        -predict) predict=$2 ;;
        -profile) profile=$2 ;;
        -calibrations) calibrations=$2 ;;
        -figure) figure=$2 ;;
        -save) save=$2 ;;
        -timeout) limit=$2 ;;
        *) echo "error: $1: unknown flag" >&2; usage 1 ;;
    esac
    shift 2
done
# the files named by flags are relative to where the sweep was started; it runs in the repository's root
absolute() { case "$1" in /*|"") echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
profile=$(absolute "$profile") save=$(absolute "$save")
[ -n "$figure" ] && [ "$figure" != none ] && figure=$(absolute "$figure")
cd "$(dirname "$0")/../.." || exit 1
for pair in "-b:$B" "-t:$T" "-np:$N" "-sample:$sample" "-steps:$steps" "-repeat:$repeat" "-vp:$vp" "-timeout:$limit" "-calibrations:$calibrations"; do
    [[ ${pair#*:} =~ ^[1-9][0-9]*$ ]] || fail "${pair%%:*} ${pair#*:}: expected a positive whole number"
done
[[ $seed =~ ^[0-9]+$ ]] || fail "-seed $seed: expected a whole number >= 0"
[ "$measure" = median ] || [ "$measure" = fastest ] || fail "-measure $measure: expected median or fastest"
if [ "$calibrations" -gt 1 ]; then
    [ "$calibrate" = 1 ] || fail "-calibrations $calibrations: calibrations are taken with -calibrate"
    [ "$calibrations" -le "$repeat" ] || fail "-calibrations $calibrations: expected at most one a pass (-repeat $repeat)"
fi
[[ $warmup =~ ^[0-9]+$ ]] || fail "-warmup $warmup: expected a whole number of steps >= 0"
[ -z "$batch" ] && batch=$((B * T * N))
[[ $batch =~ ^[1-9][0-9]*$ ]] || fail "-d $batch: expected a positive number of tokens"
[ -z "$predict" ] && predict="./dev/memory_planner -format json"
if [ -n "$profile" ] && [ "$calibrate" = 0 ] && [ ! -f "$profile" ]; then
    fail "-profile $profile: no such file (-calibrate writes one)"
fi
if [ -n "$profile" ] && [ "$calibrate" = 1 ] && [ ! -w "$(dirname "$profile")" ]; then  # (found now, not after the runs)
    fail "-profile $profile: cannot write there (no such directory, or not writable)"
fi
if [ -z "$figure" ]; then
    figure="dev/images/sweep_${model//[^A-Za-z0-9_-]/-}_${N}.png"  # (a model path or L/C/NH made a name)
fi
[ "$figure" = none ] && figure=""
PY=/usr/bin/python3
STATS=dev/bench/sweep_stats.py
# Each rank pinned to a core, round robin by rank (rank r on core r mod cores): left to the
# scheduler, the two ranks of d4's pipeline stage that holds the LM head shared a core in some
# runs or parts of runs and not in others (pp 2 x cp 2: 643 to 1008 ms a step unpinned; pinned
# together 1188 and 1356, pinned apart 572 to 792), noise in the measured time. Round robin
# spreads every stage's ranks over the cores (the grid puts pp outermost), as the model of ranks
# sharing a CPU assumes.
MPI=(mpirun --allow-run-as-root --oversubscribe --bind-to core:overload-allowed --map-by core)
command -v mpirun >/dev/null || fail "mpirun not found on PATH (the layouts run under Open MPI: apt-get install -y openmpi-bin, or dev/setup.sh)"

# the sweep's files, and the run in progress (stopped and removed on Ctrl-C, on an error and at the end)
work=$(mktemp -d "${TMPDIR:-/tmp}/sweep.XXXXXX") || fail "cannot make a temporary directory"
running=""
finish() {
    if [ -n "$running" ]; then
        kill -TERM "$running" 2>/dev/null  # timeout passes it to mpirun, mpirun to the ranks
        # mpirun can be slow to end its ranks (each in a session of its own), or be gone before
        # them: wait up to 10 s for the last process whose command line names this sweep's
        # directory, then kill what is left, so that none writes in it after it is removed
        for _ in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do
            grep -qsF -- "$work" /proc/[0-9]*/cmdline || kill -0 "$running" 2>/dev/null || break
            sleep 0.5
        done
        local cmdline pid
        for cmdline in /proc/[0-9]*/cmdline; do  # (procps, with its process-killing tools, may be missing)
            grep -qsF -- "$work" "$cmdline" || continue
            pid=${cmdline#/proc/}
            kill -KILL "${pid%/cmdline}" 2>/dev/null
        done
        kill -KILL "$running" 2>/dev/null
        wait "$running" 2>/dev/null
    fi
    rm -rf "$work"
}
trap finish EXIT
trap 'echo; echo "sweep: interrupted; stopping the run and removing $work" >&2; exit 130' INT TERM

# where mpirun cannot pin (a system whose Open MPI has no binding support): the scheduler's
# placement, said; probed with N ranks, as the runs will be placed
if ! timeout 60 "${MPI[@]}" -np "$N" "$(type -P true)" >/dev/null 2>"$work/pin.err"; then
    why=$(grep -m1 -v '^[- ]*$' "$work/pin.err")
    MPI=(mpirun --allow-run-as-root --oversubscribe --bind-to none)
    timeout 60 "${MPI[@]}" -np "$N" "$(type -P true)" >/dev/null 2>&1 || fail "mpirun cannot start $N ranks here: $why"
    echo "note: mpirun could not pin the ranks to cores here (--bind-to core: $why); they run where the scheduler puts them"
fi

# run_bg SECONDS OUTFILE COMMAND...: the command in the background (so that Ctrl-C reaches this
# script at once, and the trap stops the run), its output in OUTFILE; its exit status in rc
# (124: stopped after SECONDS)
run_bg() {
    local seconds=$1 out=$2
    shift 2
    OMP_NUM_THREADS=1 timeout -k 10 "$seconds" "$@" </dev/null >"$out" 2>&1 &
    running=$!
    wait "$running"
    rc=$?
    running=""
}

# seconds as milliseconds, to a tenth
milliseconds() { awk -v s="$1" 'BEGIN { printf "%.1f ms", s * 1e3 }'; }

[ -x ./dev/memory_planner ] || make -s dev/memory_planner || fail "could not build dev/memory_planner"
plan_flags=(-e "$model" -b "$B" -t "$T" -d "$batch" -device cpu)
if ! ./dev/memory_planner "${plan_flags[@]}" -search "$N" -sched "$sched" -vp "$vp" -format json >"$work/search.json" 2>"$work/search.err"; then
    fail "the planner's search refused: $(cat "$work/search.err")"
fi
$PY $STATS layouts "$work/search.json" >"$work/all.tsv" || fail "could not read the planner's search"
listed=$(wc -l <"$work/all.tsv")
# each listed layout numbered by its place in the planner's list (smallest memory first), 1 up
awk -F'\t' '{ printf "%d\t%s\n", NR, $0 }' "$work/all.tsv" >"$work/numbered.tsv"
if [ -n "$filter" ]; then
    re="$filter" awk -F'\t' '$3 ~ ENVIRON["re"]' "$work/numbered.tsv" >"$work/candidates.tsv"
else
    cp "$work/numbered.tsv" "$work/candidates.tsv"
fi
candidates=$(wc -l <"$work/candidates.tsv")
[ "$candidates" -gt 0 ] || fail "none of the search's $listed layouts matches -filter '$filter'"

passes=""  # (in the report's title)
[ "$repeat" -gt 1 ] && passes=", $repeat passes"
echo "sweep: -e $model -b $B -t $T -d $batch at $N ranks on the CPU (1 thread a rank, $(nproc) cores), $warmup warm-up + $steps measured steps a layout, its time the $measure of them"
[ "$repeat" -gt 1 ] && echo "in $repeat passes: the layouts in order, then in reverse order, then in order..."
what="the search lists $listed layouts of $N ranks${filter:+, $candidates of them match -filter '$filter'}"
if [ "$all" = 1 ] || [ "$candidates" -le "$sample" ]; then
    cp "$work/candidates.tsv" "$work/selected.tsv"
    echo "$what: running all $candidates"
else
    picks=$($PY $STATS sample "$candidates" "$sample" "$seed") || fail "could not draw the sample"
    awk -F'\t' -v picks="$picks" 'BEGIN { n = split(picks, p, " "); for (i = 1; i <= n; i++) keep[p[i] + 1] = 1 } keep[NR]' \
        "$work/candidates.tsv" >"$work/selected.tsv"
    note=""
    [ "$sample" -lt 24 ] && note=" (fewer than 24: a quick look, not the sweep whose figures the step-time model is held to)"
    echo "$what: a random sample of $sample, seed $seed (-all runs every one)$note:"
    echo "  $(awk -F'\t' '{ printf "%s#%d", (NR > 1 ? " " : ""), $1 }' "$work/selected.tsv")"
fi
count=$(wc -l <"$work/selected.tsv")
for trainer in $(awk -F'\t' '{ split($3, w, " "); print w[1] }' "$work/selected.tsv" | sort -u); do
    [ -x "./$trainer" ] || make -s "$trainer" || fail "could not build $trainer"
done

# calibrate_now K: the sweep's K-th calibration, into calibration.K.txt (with -calibrations 1 straight
# into the profile), kept in calibration_files when it succeeds (rc says)
calibration_files=() calibration_labels=()
calibrate_now() {
    local into="$work/calibration.$1.txt"
    [ "$calibrations" = 1 ] && into=$profile
    run_bg "$limit" "$work/calibrate.out" "${MPI[@]}" -np "$cal_ranks" ./dev/bench/calibrate -o "$into" -threads 1
    [ "$rc" = 0 ] && calibration_files+=("$into") && calibration_labels+=("$1 (before pass $2)")
}
first_profile=$profile  # the profile of the progress lines' predictions (the first calibration's)
if [ "$calibrate" = 1 ]; then
    [ -n "$profile" ] || profile="$work/cpu-profile.txt"
    [ -x ./dev/bench/calibrate ] || make -s dev/bench/calibrate || fail "could not build dev/bench/calibrate"
    cal_ranks=2
    [ "$N" -gt 2 ] && cal_ranks=4
    [ "$N" -gt 4 ] && cal_ranks=8
    first_profile=$profile of=""
    [ "$calibrations" -gt 1 ] && first_profile="$work/calibration.1.txt" of=" (1 of $calibrations)"
    echo "calibrating$of: ${MPI[*]} -np $cal_ranks ./dev/bench/calibrate -o $first_profile -threads 1"
    calibrate_now 1 1 || fail "dev/bench/calibrate failed (exit $rc): $(tail -5 "$work/calibrate.out")"
fi
echo "predictions: $predict FLAGS${profile:+ (with -profile $first_profile)}"

# 1. each layout's command and prediction, once (every pass runs that command): planned.tsv, a
# row a layout in the selected order (index, label, predicted seconds or "-", command)
plan="$work/plan"  # the planner's and the predictor's output for the layout at hand
mkdir "$plan"
# predict_layout PROFILE FLAGS...: the predictor's seconds for a layout, or "-" (why in $plan)
predict_layout() {
    local with=$1 seconds
    shift
    read -ra predictor <<<"$predict"
    if timeout 60 "${predictor[@]}" "${plan_flags[@]}" "$@" ${with:+-profile "$with"} >"$plan/predict.out" 2>"$plan/predict.err" &&
        seconds=$($PY $STATS prediction "$plan/predict.out" 2>"$plan/predict.why"); then
        echo "$seconds"
    else
        echo "-"
    fi
}
predicted_count=0 why_none=""
while IFS=$'\t' read -r index flags label <&3; do
    read -ra layout_flags <<<"$flags"
    [[ " $flags " == *" -pp 1 "* ]] || layout_flags+=(-sched "$sched" -vp "$vp")
    # the command that runs the layout: the planner's own (layout_command), with this sweep's -d
    if ! ./dev/memory_planner "${plan_flags[@]}" "${layout_flags[@]}" -format json >"$plan/plan.json" 2>"$plan/plan.err" &&
        [ ! -s "$plan/plan.json" ]; then
        fail "the planner refused a layout its search listed ($label): $(cat "$plan/plan.err")"
    fi
    command=$($PY $STATS field "$plan/plan.json" command) || fail "the planner's JSON for $label has no \"command\""
    read -ra words <<<"$command"
    [ "${words[0]} ${words[1]} ${words[2]}" = "mpirun -np $N" ] || fail "unexpected command from the planner: $command"
    # the prediction, if the predictor gives one (within a minute: a model, not a run)
    predicted=$(predict_layout "$first_profile" "${layout_flags[@]}")
    if [ "$predicted" != "-" ]; then
        predicted_count=$((predicted_count + 1))
    elif [ -z "$why_none" ]; then
        why_none=$(cat "$plan/predict.why" "$plan/predict.err" 2>/dev/null | head -3)
    fi
    printf "%d\t%s\t%s\t%s\n" "$index" "$label" "$predicted" "$command" >>"$work/planned.tsv"
done 3<"$work/selected.tsv"
mapfile -t planned <"$work/planned.tsv"
in_order=("${!planned[@]}") reversed=()  # the rows of planned (0 up), in order and in reverse
for i in "${in_order[@]}"; do reversed=("$i" "${reversed[@]}"); done

# 2. the runs, in passes: pass 1 in the selected order, pass 2 in reverse, pass 3 in order... (a
# slow phase of the machine late in one pass falls early in the next). A run's time is the median
# of its steps after the warm-up; pass P's go to pass.P.tsv (index, seconds or "failed...: why",
# every step's ms). A layout that failed is not run again: it is reported failed.
declare -A failed_in=()  # a failed layout's index -> the pass it failed in
pass_files=() pass=0
while [ "$pass" -lt "$repeat" ]; do
    pass=$((pass + 1)) k=0
    pass_files+=("$work/pass.$pass.tsv")
    : >"$work/pass.$pass.tsv"
    order=("${in_order[@]}")
    [ $((pass % 2)) = 0 ] && order=("${reversed[@]}")
    # -calibrations K: calibration i + 1 before pass 1 + i R / K (the first was taken before the plan)
    i=1
    while [ "$i" -lt "$calibrations" ]; do
        if [ $((1 + i * repeat / calibrations)) = "$pass" ]; then
            echo "calibrating ($((i + 1)) of $calibrations) before pass $pass"
            calibrate_now $((i + 1)) "$pass" ||
                echo "note: calibration $((i + 1)) failed (exit $rc: $(tail -1 "$work/calibrate.out")); the sweep goes on with the others"
        fi
        i=$((i + 1))
    done
    for i in "${order[@]}"; do
        k=$((k + 1))
        IFS=$'\t' read -r index label predicted command <<<"${planned[i]}"
        progress="[$k/$count]"
        [ "$repeat" -gt 1 ] && progress="[pass $pass/$repeat, $k/$count]"
        if [ -n "${failed_in[$index]:-}" ]; then
            echo "$progress #$index $label: skipped (failed in pass ${failed_in[$index]})"
            continue
        fi
        # with a fresh calibration, the machine's speed just before the run (the drift, after the passes)
        if [ "$calibrate" = 1 ]; then
            OMP_NUM_THREADS=1 timeout 60 ./dev/bench/calibrate -probe -threads 1 >>"$work/probes.txt" 2>/dev/null
        fi
        # the run: the planner's command with this machine's mpirun, a few steps, no validation or samples
        read -ra words <<<"$command"
        d=$(mktemp -d "$work/run.XXXXXX")
        start=$SECONDS
        run_bg "$limit" "$d/out.txt" "${MPI[@]}" -np "$N" "${words[@]:3}" -x $((warmup + steps)) -v 0 -s 0 -o "$d"
        if [ "$rc" = 0 ] && times=$($PY $STATS step-times "$d/main.log" "$warmup" 2>"$d/times.err"); then
            measured=${times%%$'\t'*} all_ms=${times#*$'\t'}
            shown=$(milliseconds "$measured")
            if [ "$measure" = fastest ]; then  # (the pass's median, which the repeatability line reads, and its fastest)
                fastest=$(awk -v w="$warmup" -v ms="$all_ms" 'BEGIN { n = split(ms, s, ","); f = ""
                    for (i = w + 1; i <= n; i++) if (f == "" || s[i] + 0 < f) f = s[i] + 0; printf "%.1f", f }')
                shown="median $shown, fastest $fastest ms"
            fi
        else
            failed_in[$index]=$pass
            failed="failed"
            [ "$repeat" -gt 1 ] && failed="failed in pass $pass"
            if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
                measured="$failed: still running after $limit s (-timeout)"
            elif [ "$rc" != 0 ]; then
                measured="$failed: exit $rc: $(grep -m1 -i 'error' "$d/out.txt" || tail -1 "$d/out.txt")"
            else
                measured="$failed: $(cat "$d/times.err")"
            fi
            all_ms="" shown=$measured
        fi
        [ "$predicted" != "-" ] && shown="$shown, predicted $(milliseconds "$predicted")"
        echo "$progress #$index $label: $shown ($((SECONDS - start)) s)"
        printf "%d\t%s\t%s\n" "$index" "${measured//$'\t'/ }" "$all_ms" >>"$work/pass.$pass.tsv"
        rm -rf "$d"
    done
done
# predict_all PROFILE: planned.tsv (on stdout) with each layout predicted again from PROFILE
predict_all() {
    local index flags label predicted layout_flags
    while IFS=$'\t' read -r index flags label <&3; do
        read -ra layout_flags <<<"$flags"
        [[ " $flags " == *" -pp 1 "* ]] || layout_flags+=(-sched "$sched" -vp "$vp")
        predicted=$(predict_layout "$1" "${layout_flags[@]}")
        awk -F'\t' -v OFS='\t' -v i="$index" -v p="$predicted" '$1 == i { $3 = p; print }' "$work/planned.tsv"
    done 3<"$work/selected.tsv"
}
# 3. the calibrations as one profile (-calibrations K): each field the median of theirs, for the
# same reason as a layout's time is the median of its passes': a calibration's minute catches the
# machine in one phase, and its collectives are measured then and never again.
[ "$calibrate" = 1 ] && [ "$predicted_count" -gt 0 ] && echo
planned_calibrated="$work/planned.tsv"  # the predictions from the calibration, without the drift
if [ "$calibrate" = 1 ] && [ "$calibrations" -gt 1 ]; then
    if combined=$($PY $STATS combine "$profile" "${calibration_files[@]}" 2>"$work/combine.err"); then
        read -r combined_count widest spread <<<"$combined"
        echo "calibrations: $combined_count of $calibrations, the predictions from their median field by field ($profile); their rates differed by up to $spread% ($widest)"
    else  # (the runs are kept: the first calibration's profile, said)
        cp "$first_profile" "$profile" || fail "-profile $profile: cannot write it"
        echo "calibrations: not combined ($(cat "$work/combine.err")): the predictions from the first alone"
    fi
    if [ "$predicted_count" -gt 0 ]; then
        predict_all "$profile" >"$work/planned-combined.tsv"
        planned_calibrated="$work/planned-combined.tsv"
    fi
fi
# 4. the drift (with -calibrate): this VM's speed wanders from one minute to the next by as much as
# the layouts differ, and the calibration took one minute before runs that take many. The probes
# timed the calibration's own lone GEMMs and triads before each run: each layout is predicted again
# with the profile's GEMM rates and bandwidths scaled by the calibration's lone times over the
# probes' medians (sweep_stats.py's drift; the fractions and links as calibrated). The
# predictions as calibrated are printed beside the table's.
drift_taken=0
if [ "$calibrate" = 1 ] && [ "$predicted_count" -gt 0 ] &&
    factors=$($PY $STATS drift "$profile" "$work/probes.txt" "$work/profile-drift.txt" "$measure" 2>"$work/drift.err"); then
    read -r gemm_factor triad_factor probe_count <<<"$factors"
    drift_taken=1
    predict_all "$work/profile-drift.txt" >"$work/planned-drift.tsv"
    echo "drift: $probe_count probes of the calibration's lone work beside the runs (their ${measure/median/medians}): the profile's GEMM rates x $gemm_factor, its bandwidths x $triad_factor"
elif [ "$calibrate" = 1 ] && [ "$predicted_count" -gt 0 ]; then
    echo "drift: not taken ($(cat "$work/drift.err" 2>/dev/null)): the predictions as calibrated"
fi
# RESULTS.tsv: a row a layout, its time by -measure (sweep_stats.py's merge)
planned_final=$planned_calibrated
[ "$drift_taken" = 1 ] && planned_final="$work/planned-drift.tsv"
$PY $STATS merge "$planned_final" "$warmup" "$measure" "${pass_files[@]}" >"$work/results.tsv" || fail "could not gather the passes' times"

echo
report=("$work/results.tsv" --title "$model, B $B, T $T, $N ranks on the CPU: $count layouts$passes")
[ -n "$figure" ] && report+=(--figure "$figure")
[ "$predicted_count" = 0 ] && [ -n "$why_none" ] && echo "no predictions from '$predict': $why_none"
$PY $STATS report "${report[@]}" || fail "could not write the report"
if [ "$drift_taken" = 1 ]; then
    $PY $STATS merge "$planned_calibrated" "$warmup" "$measure" "${pass_files[@]}" >"$work/results-as-calibrated.tsv" &&
        echo "as calibrated, without the drift: $($PY $STATS summary "$work/results-as-calibrated.tsv")"
    # what each calibration alone, with its own drift, would have given: how much the one minute
    # a calibration measures moves the figures
    if [ "$calibrations" -gt 1 ]; then
        for c in "${!calibration_files[@]}"; do
            $PY $STATS drift "${calibration_files[c]}" "$work/probes.txt" "$work/profile-alone.txt" "$measure" >/dev/null 2>&1 &&
                predict_all "$work/profile-alone.txt" >"$work/planned-alone.tsv" &&
                $PY $STATS merge "$work/planned-alone.tsv" "$warmup" "$measure" "${pass_files[@]}" >"$work/results-alone.tsv" &&
                echo "calibration ${calibration_labels[c]} alone, with its drift: $($PY $STATS summary "$work/results-alone.tsv")"
        done
    fi
fi
if [ -n "$save" ]; then
    cp "$work/results.tsv" "$save" || fail "-save $save: cannot write it"
fi
echo "sweep took $SECONDS s"
