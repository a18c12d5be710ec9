#!/usr/bin/env bash
# GPU training throughput of GPT-2 (random init, bf16, T=1024, one GPU): train_gpt2_dp ("ours")
# beside its peers, taken in turns on the same GPU for each model and batch size: ours, then the
# PyTorch peers (dev/bench/bench_pytorch.py: test/reference.py's GPT2 under bf16 autocast with
# fused AdamW, compiled or eager, with scaled_dot_product_attention, PyTorch's own choice of its
# backend or held to one: flash, cuDNN, memory-efficient; or the reference's own attention), then
# llm.c's train_gpt2cu, without and with cuDNN's attention, then ours again. Each run prints ms per step, tokens/s,
# MFU (one formula for all: 6 N + 12 L C T FLOPs per token, against the GPU's dense bf16 peak)
# and peak device memory (total - free: with the CUDA context, as nvidia-smi shows it); ours also
# prints the step dev/bench/roofline.py predicts (its kernels priced by llmc/step_time.h on the GPU's
# built-in profile; none for an H100 PCIe or NVL, which have no profile).
# The run ends with a table of all runs and ours' tokens/s divided by each peer's, then the
# headline of each model: ours over the fastest of torch.compile + SDPA's backends, and over llm.c
# (with cuDNN where that build ran).
#
#   ./dev/bench/bench_gpu.sh [steps]       steps per run (default 10; at least 4)
#
# What it runs is set in the environment (defaults in brackets):
#   MODELS="d12 d24 d36"   the models, in turns: d12 124M, d24 350M, d36 774M    [d12 d24 d36]
#   BATCH_d12, BATCH_d24, BATCH_d36
#                 the batch sizes of each model, each timed in its own turn, or "fit [SIZES]":
#                 the largest of SIZES (else $FIT, largest first) that fits, found for ours and
#                 for each peer on its own (ours first; the peers start at ours' B, since at d12
#                 PyTorch and llm.c hold as much or more per sequence)   [d12: 64; d24, d36: fit]
#   FIT="128 64 32 16 8 4 2 1"  the sizes a bare "fit" tries
#   PEERS_d12, PEERS_d24, PEERS_d36
#                 any of compile+sdpa compile+flash compile+cudnn compile+efficient eager+sdpa
#                 compile eager llmc (none: ""); llmc is each llm.c build given below
#                 [d12: compile+flash compile+cudnn compile+efficient eager+sdpa llmc;
#                  d24, d36: compile+flash compile+cudnn llmc]
#   OURS_ATTENTION="flash"  add "cublas" for ours with LLMC_ATTENTION=cublas too      [flash]
#   OURS_AGAIN="d12"        the models where ours runs once more after the peers (drift) [d12]
#   LLMC_PEER=/path/to/train_gpt2cu   llm.c's trainer, its default build (without it: skipped)
#   LLMC_PEER_CUDNN=/path/to/train_gpt2cu_cudnn   llm.c built with USE_CUDNN=1 (cuDNN's flash
#                           attention; without it: skipped). dev/bench/build_llmc_peer.sh builds both
#   LLMC_RECOMPUTE=0        llm.c's -r (its default is 1: GELU recomputed)            [0, as ours]
#   BENCH_NO_BUILD=1        use build/cuda_BF16/train_gpt2_dp as it is (built elsewhere) [0: make]
#   OURS=path               another build of train_gpt2_dp to time (not made here)
#   PYTHON=python3          the python with PyTorch
#
# What each part costs (an H100, 10 steps): ours 5-15 s a run (d12-d36; a B that does not fit
# fails in a second, before allocating); a PyTorch call 5-10 s to start, then torch.compile
# 40-60 s for each compiled variant and B it tries (one that runs out of memory costs its compile
# too), eager about 10 s; llm.c 10 s at d12, 20-30 s at d36 (it draws the weights on the CPU). So
# d12 with all peers takes about 5 minutes (three compiled variants), d24 or d36 with two compiled
# variants and llm.c 2.5-4.
#
# A short run (d12 at B=64 with every peer, then d24 and d36 at one B each, the largest of two
# that fits: 64 and 32 fit ours on an H100), about 5-6 minutes:
#   BATCH_d24="fit 64 32" BATCH_d36="fit 32 16" PEERS_d24=compile+flash PEERS_d36=compile+flash \
#     ./dev/bench/bench_gpu.sh 10
#
# llm.c's trainer (karpathy/llm.c, never part of this project) is built outside the project by
# dev/bench/build_llmc_peer.sh (from a checkout of llm.c, and for the cuDNN build cudnn-frontend's
# headers; on a machine without a GPU too), and run here as
#   train_gpt2cu -i TOKENS -j TOKENS -e dL -b B -t 1024 -x STEPS -v 1000000 -m 1 -s 0 -r 0 -z 0 -h 0
# (-v 0 divides by zero there: validation once before and after, on one batch, not timed)
# on tiny Shakespeare's tokens (llm.c's own file format): its default build's attention keeps the
# T x T scores in memory, the cuDNN build's is fused; its step time is its "total average
# iteration time" (steps after the first), its memory the use it reports after allocating everything.
set -euo pipefail
cd "$(dirname "$0")/../.."
steps=${1:-10}
[ "$steps" -ge 4 ] 2>/dev/null || { echo "bench_gpu.sh: steps must be a number >= 4 (got '$steps')"; exit 1; }
PYTHON=${PYTHON:-python3}
MODELS=${MODELS:-d12 d24 d36}
FIT=${FIT:-128 64 32 16 8 4 2 1}
OURS_ATTENTION=${OURS_ATTENTION:-flash}
OURS_AGAIN=${OURS_AGAIN-d12}
LLMC_RECOMPUTE=${LLMC_RECOMPUTE:-0}
T=1024
tokens=dev/data/tinyshakespeare/tiny_shakespeare_train.bin
ours=${OURS:-./build/cuda_BF16/train_gpt2_dp}

# a GPU first: without one there is nothing to time (the roofline alone: dev/bench/roofline.py)
gpu=$( (nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits 2>/dev/null || true) | head -n 1)
if [ -z "$gpu" ]; then
    echo "bench_gpu.sh needs an NVIDIA GPU (nvidia-smi found none); for the predicted step without one:"
    echo "  python3 dev/bench/roofline.py -e d12 -b 64 -t 1024"
    exit 1
fi
gpu_name=${gpu%,*}
gpu_mib=${gpu##*, }
if [ -n "${OURS:-}" ] || { [ "${BENCH_NO_BUILD:-0}" = 1 ] && [ -x "$ours" ]; }; then
    echo "$ours as built, $(date -r "$ours" +%Y-%m-%dT%H:%M)"
else
    make -s build/cuda_BF16/train_gpt2_dp
fi
make -s dev/bench/step_kernels  # roofline.py's rows (llmc/step_kernels.h), for the predicted step
logs=$(mktemp -d "${OUT:-/tmp}/bench_gpu.XXXXXX")
results=$logs/results.txt  # one line a run: model|B|system|ms|tokens/s|GB|note
: > "$results"
echo "$gpu_name, $gpu_mib MiB; $steps steps a run; logs in $logs"

# the GPU's dense bf16 peak and roofline device (as llmc/cuda/device.cuh tells the parts apart)
case "$gpu_name" in
    *H100*PCIe*) peak=756; roofline_device=h100-pcie ;;
    *H100*NVL*) peak=835; roofline_device=h100-nvl ;;
    *H100*) peak=989; roofline_device=h100-sxm ;;
    *H200*) peak=989; roofline_device=h200 ;;
    *A100*) peak=312; roofline_device=a100 ;;
    *) peak=0; roofline_device="" ;;
esac
[ -n "$roofline_device" ] || echo "(no MFU and no roofline prediction: this script does not know this GPU's peak)"

# Programs built elsewhere may not find NCCL or cuBLAS here: then the libraries of the python's
# nvidia-* packages (PyTorch's own CUDA 13 libraries)
missing_libraries() { "$@" 2>&1 | grep -q "error while loading shared libraries"; }
if missing_libraries "$ours" -h; then
    nvidia_libs=$("$PYTHON" -c 'import glob, os, nvidia
print(":".join(sorted({os.path.dirname(p) for b in nvidia.__path__ for p in glob.glob(os.path.join(b, "**", "lib*.so*"), recursive=True)})))' 2>/dev/null || true)
    export LD_LIBRARY_PATH=$nvidia_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    echo "libraries from the python's nvidia packages: $nvidia_libs"
    missing_libraries "$ours" -h && { "$ours" -h 2>&1 | head -n 3; exit 1; }
fi
# llm.c's builds that run here: "system=path" each (its default build, then with cuDNN)
llmc_builds=""
for build in "llm.c=${LLMC_PEER:-}" "llm.c (cuDNN)=${LLMC_PEER_CUDNN:-}"; do
    system=${build%%=*} path=${build#*=}
    if [ -z "$path" ]; then
        echo "$system peer skipped: set LLMC_PEER$([ "$system" = llm.c ] || echo _CUDNN)=/path/to/its train_gpt2cu (built outside the project: dev/bench/build_llmc_peer.sh)"
    elif [ ! -x "$path" ] || missing_libraries "$path" -q; then
        echo "$system peer skipped: $path does not run here"
    else
        llmc_builds="$llmc_builds${llmc_builds:+;}$build"
    fi
done

# model shapes: layers, heads, channels; parameters (padded vocabulary 50304, tied LM head) and
# model FLOPs per token (llmc/run.h train_flops_per_token)
shape() {
    case "$1" in
        d12) echo 12 12 768 ;;
        d24) echo 24 16 1024 ;;
        d36) echo 36 20 1280 ;;
        d48) echo 48 25 1600 ;;
        *) echo "bench_gpu.sh: unknown model $1 (d12, d24, d36, d48)" >&2; exit 1 ;;
    esac
}
flops_per_token() {
    local L NH C
    read -r L NH C <<< "$(shape "$1")"
    awk -v L="$L" -v C="$C" -v T="$T" 'BEGIN { n = 50304 * C + 1024 * C + L * (12 * C * C + 13 * C) + 2 * C
        printf "%.6e", 6 * n + 12 * L * C * T }'
}
record() { echo "$1|$2|$3|$4|$5|$6|$7" >> "$results"; }  # model B system ms tokens/s GB note
show() {  # one run's line as it ends
    printf "  %-26s %s B=%-3s | %8s ms | %9s tok/s | %s GB%s\n" "$3" "$1" "$2" "$4" "$5" "$6" "${7:+ | $7}"
}

# ours: train_gpt2_dp; its "average step time" line holds the rest. Returns 1 if it did not run.
run_ours() {  # model B attention
    local model=$1 B=$2 attention=$3 log line ms tps gb system="ours"
    [ "$attention" = flash ] || system="ours ($attention attention)"
    log="$logs/ours_${model}_b${B}_$attention.log"
    LLMC_ATTENTION=$attention "$ours" -e "$model" -b "$B" -t "$T" -x "$steps" -v 0 -s 0 > "$log" 2>&1 || true
    line=$(grep -E "^average step time" "$log" || true)
    if [ -z "$line" ]; then
        if grep -q "not enough memory" "$log"; then
            echo "  $system $model B=$B: does not fit ($(grep -o "not enough memory.*" "$log" | head -n 1 | cut -c 1-160))"
        else
            echo "  $system $model B=$B: failed: $(tail -n 2 "$log" | tr '\n' ' ')"
        fi
        return 1
    fi
    ms=$(sed -n 's/^average step time \([0-9.]*\) ms.*/\1/p' <<< "$line")
    tps=$(sed -n 's/^average step time [0-9.]* ms, \([0-9]*\) tokens\/s.*/\1/p' <<< "$line")
    gb=$(sed -n 's/.*peak device memory \([0-9.]*\) GB.*/\1/p' <<< "$line")
    record "$model" "$B" "$system" "$ms" "$tps" "${gb:-?}" ""
    show "$model" "$B" "$system" "$ms" "$tps" "${gb:-?}" ""
    if [ -n "$roofline_device" ]; then
        local predicted
        predicted=$("$PYTHON" dev/bench/roofline.py -e "$model" -b "$B" -t "$T" -precision bf16 -attention "$attention" \
            -device "$roofline_device" -brief 2>/dev/null) || predicted=""
        # measured / predicted: how far the step is from the model's kernels
        [ -z "$predicted" ] || awk -v m="$ms" -v p="$predicted" 'BEGIN { split(p, f, " ")
            printf "    %s", p; if (f[2] + 0 > 0) printf "; measured / predicted %.2f", m / f[2]; printf "\n" }'
    fi
}

# the PyTorch peers of one turn: variants at the batch sizes given (--fit: the first that fits)
run_pytorch() {  # model "variants" "batches" fit(0|1)
    local model=$1 variants=$2 batches=$3 log fit=()
    [ "$4" = 0 ] || fit=(--fit)
    log="$logs/pytorch_${model}_$(echo "$batches" | tr ' ' '_').log"
    # shellcheck disable=SC2086  # the lists split into arguments
    "$PYTHON" dev/bench/bench_pytorch.py --model "$model" --batch $batches --variants $variants --steps "$steps" \
        --peak-tflops "$peak" ${fit[@]+"${fit[@]}"} > "$log" 2>&1 || true
    # "pytorch VARIANT MODEL B=64  T=1024 |   139.8 ms |    468000 tok/s | MFU 40.9% | device 32.1 GB | allocated 30.4 GB | loss 10.9"
    # or "pytorch VARIANT MODEL B=64  T=1024 | out of memory"
    grep -E "^pytorch " "$log" | while IFS='|' read -r head f2 f3 _ f5 f6 _; do
        read -r _ variant _ b _ <<< "$head"
        b=${b#B=}
        if [[ "$f2" == *" ms"* ]]; then
            local ms tps gb alloc
            ms=$(awk '{ print $1 }' <<< "$f2"); tps=$(awk '{ print $1 }' <<< "$f3")
            gb=$(awk '{ print $2 }' <<< "$f5"); alloc=$(awk '{ print $2 }' <<< "$f6")
            record "$model" "$b" "$variant" "$ms" "$tps" "$gb" "allocated $alloc GB"
            show "$model" "$b" "$variant" "$ms" "$tps" "$gb" "allocated $alloc GB"
        else
            echo "  $variant $model B=$b:$f2"
        fi
    done
    grep -qE "^pytorch " "$log" || echo "  PyTorch peers: no result ($(tail -n 1 "$log"))"
}

# llm.c's device memory in GB at B (train_gpt2.cu: fill_in_activation_sizes, its parameters,
# gradients, AdamW m and v and fp32 master weights, cuBLASLt's workspace), without its context;
# with cuDNN its att holds the softmax's fp32 statistics (L, B, NH, T), not the bf16 (L, B, NH, T, T)
llmc_memory_gb() {  # model B cudnn(0|1)
    local L NH C
    read -r L NH C <<< "$(shape "$1")"
    awk -v L="$L" -v NH="$NH" -v C="$C" -v B="$2" -v T="$T" -v r="$LLMC_RECOMPUTE" -v cudnn="$3" 'BEGIN {
        BT = B * T; BTC = BT * C; n = 50304 * C + 1024 * C + L * (12 * C * C + 13 * C) + 2 * C
        out = 3 * C; if (NH * T > out) out = NH * T; if (50304 > out) out = 50304
        att = cudnn ? 0 : L * B * NH * T * T
        bf16 = BTC + (r < 2 ? L * BTC : 0) + L * BTC + att + L * BTC + (r < 2 ? L * BTC : 0) \
             + 4 * L * BTC + (r < 1 ? 4 * L * BTC : 4 * BTC) + L * BTC + BTC + 3 * L * BTC + BT * out + 5 * BTC
        fp32 = 4 * L * BT + 3 * BT + (cudnn ? L * B * NH * T : 0)
        printf "%.1f", (2 * bf16 + 4 * fp32 + 16 * n + 32 * 2^20) / 1e9 }'
}
# llm.c at B: its "total average iteration time", and the device memory used after it allocated
run_llmc() {  # model B "system=path"
    local model=$1 B=$2 system path log ms tps gb note=""
    system=${3%%=*}; path=${3#*=}
    log="$logs/llmc_${model}_b${B}$([ "$system" = llm.c ] || echo _cudnn).log"
    timeout $((120 + 20 * steps)) "$path" -i "$tokens" -j "$tokens" -e "$model" -b "$B" -t "$T" -x "$steps" \
        -v 1000000 -m 1 -s 0 -r "$LLMC_RECOMPUTE" -z 0 -h 0 > "$log" 2>&1 || true
    ms=$(sed -n 's/^total average iteration time: \([0-9.]*\) ms.*/\1/p' "$log" | awk '{ printf "%.1f", $1 }')
    if [ -z "$ms" ]; then
        echo "  $system $model B=$B: failed: $(grep -v '^\s*$' "$log" | tail -n 2 | tr '\n' ' ')"
        return 1
    fi
    tps=$(awk -v ms="$ms" -v n=$((B * T)) 'BEGIN { printf "%.0f", n / ms * 1e3 }')
    gb=$(sed -n 's/^device memory usage: \([0-9]*\) MiB.*/\1/p' "$log" | awk '{ printf "%.2f", $1 * 1048576 / 1e9 }')
    grep -q "Fell back to cudaMallocManaged" "$log" && note="AdamW state in managed memory: not comparable"
    record "$model" "$B" "$system" "$ms" "$tps" "${gb:-?}" "$note"
    show "$model" "$B" "$system" "$ms" "$tps" "${gb:-?}" "$note"
    [ -z "$note" ]
}
llmc_systems() { local IFS=';' build; for build in $llmc_builds; do printf "%s " "${build%%=*}"; done; }
# llm.c at B if its own formula says it fits; returns 1 if it did not run
run_llmc_if_fits() {  # model B "system=path"
    local need cudnn=0
    [ "${3%%=*}" = llm.c ] || cudnn=1
    need=$(llmc_memory_gb "$1" "$2" "$cudnn")
    if awk -v need="$need" -v mib="$gpu_mib" 'BEGIN { exit !(need + 1.5 > mib * 1048576 / 1e9) }'; then
        echo "  ${3%%=*} $1 B=$2: needs about $need GB (+ the context): skipped"
        return 1
    fi
    run_llmc "$@"
}
# each llm.c build in fit mode: the largest B (at most ours') that fits, then smaller ones while it fails
run_llmc_fit() {  # model "candidates, largest first"
    local B build builds
    IFS=';' read -r -a builds <<< "$llmc_builds"
    for build in "${builds[@]}"; do
        for B in $2; do
            run_llmc_if_fits "$1" "$B" "$build" && break
        done
    done
    return 0
}

for model in $MODELS; do
    shape "$model" > /dev/null
    batch_var=BATCH_$model; peers_var=PEERS_$model
    if [ "$model" = d12 ]; then
        batches=${!batch_var-64}; peers=${!peers_var-compile+flash compile+cudnn compile+efficient eager+sdpa llmc}
    else
        batches=${!batch_var-fit}; peers=${!peers_var-compile+flash compile+cudnn llmc}
    fi
    variants=""; with_llmc=0
    for p in $peers; do
        case "$p" in
            compile+sdpa|compile+flash|compile+cudnn|compile+efficient|eager+sdpa|compile|eager) variants="$variants $p" ;;
            llmc) with_llmc=1 ;;
            *) echo "bench_gpu.sh: unknown peer $p (compile+sdpa compile+flash compile+cudnn compile+efficient eager+sdpa compile eager llmc)"
               exit 1 ;;
        esac
    done
    [ -n "$llmc_builds" ] || with_llmc=0
    echo
    echo "== $model, T=$T, B: $batches; peers:${variants:- none}$([ "$with_llmc" = 1 ] && echo "; $(llmc_systems)")"
    again=0
    for m in $OURS_AGAIN; do [ "$m" != "$model" ] || again=1; done
    if [ "${batches%% *}" = fit ]; then
        sizes=${batches#fit}
        [ -n "${sizes// /}" ] || sizes=$FIT
        # ours: the largest B that fits, with flash attention; the peers start there
        ours_b=""
        for B in $sizes; do
            if run_ours "$model" "$B" flash; then ours_b=$B; break; fi
        done
        below=$sizes
        if [ -n "$ours_b" ]; then
            below=$(for B in $sizes; do [ "$B" -le "$ours_b" ] && echo "$B"; done | tr '\n' ' ')
            for attention in $OURS_ATTENTION; do
                [ "$attention" = flash ] || run_ours "$model" "$ours_b" "$attention" || true
            done
        fi
        [ -z "$variants" ] || run_pytorch "$model" "$variants" "$below" 1
        [ "$with_llmc" = 0 ] || run_llmc_fit "$model" "$below"
        [ "$again" = 0 ] || [ -z "$ours_b" ] || run_ours "$model" "$ours_b" flash || true
    else
        for B in $batches; do
            for attention in $OURS_ATTENTION; do run_ours "$model" "$B" "$attention" || true; done
            [ -z "$variants" ] || run_pytorch "$model" "$variants" "$B" 0
            if [ "$with_llmc" = 1 ]; then
                IFS=';' read -r -a builds <<< "$llmc_builds"
                for build in "${builds[@]}"; do run_llmc_if_fits "$model" "$B" "$build" || true; done
            fi
            [ "$again" = 0 ] || run_ours "$model" "$B" flash || true
        done
    fi
done

# The table: every run, MFU from its tokens/s, and ours' tokens/s over the peer's: ours at the
# same model and B (the mean of its runs), else ours at its largest B of that model (marked *)
echo
echo "== summary: $gpu_name, T=$T, bf16, $steps steps a run; MFU = (6 N + 12 L C T) x tokens/s / $peak TFLOP/s"
fpt=""
for model in $MODELS; do fpt="$fpt $model=$(flops_per_token "$model")"; done
awk -F'|' -v fpt="$fpt" -v peak="$peak" '
    BEGIN { n = split(fpt, kv, " "); for (i = 1; i <= n; i++) { split(kv[i], p, "="); flops[p[1]] = p[2] } }
    { row[NR] = $0
      if ($3 == "ours") { sum[$1, $2] += $5; cnt[$1, $2]++; if ($2 + 0 > best[$1] + 0) best[$1] = $2 } }
    END {
        printf "| model | B | run | ms/step | tokens/s | MFU | memory GB | ours / run |\n"
        printf "| --- | --- | --- | --- | --- | --- | --- | --- |\n"
        for (i = 1; i <= NR; i++) {
            split(row[i], f, "|")
            mfu = peak > 0 ? sprintf("%.1f%%", 100 * flops[f[1]] * f[5] / (peak * 1e12)) : "-"
            ratio = "-"
            if (f[3] != "ours" && f[3] !~ /^ours /) {
                if ((f[1], f[2]) in cnt) ratio = sprintf("%.2f", sum[f[1], f[2]] / cnt[f[1], f[2]] / f[5])
                else if (f[1] in best) ratio = sprintf("%.2f*", sum[f[1], best[f[1]]] / cnt[f[1], best[f[1]]] / f[5])
            }
            printf "| %s | %s | %s | %s | %s | %s | %s%s | %s |\n", f[1], f[2], f[3], f[4], f[5], mfu, f[6],
                   f[7] != "" ? " (" f[7] ")" : "", ratio
        }
    }' "$results"
echo "(* ours at its own largest B; memory: the device's used memory, total - free, with the CUDA context)"
# the headline, at each model and B ours ran: ours over the fastest of torch.compile + SDPA's
# backends that ran there (the issue's yardstick: PyTorch at its best on this GPU), and over each llm.c build
echo
echo "== headline: ours' tokens/s over the fastest torch.compile + SDPA backend, and over llm.c, at the same model and B"
awk -F'|' '
    $3 == "ours" { sum[$1, $2] += $5; cnt[$1, $2]++; if (!(($1, $2) in seen)) { seen[$1, $2] = 1; order[++n] = $1 "|" $2 } }
    $3 ~ /^compile\+(sdpa|flash|cudnn|efficient)$/ { tried[$1, $2]++
        if (!(($1, $2) in fast) || $5 + 0 > fast[$1, $2] + 0) { fast[$1, $2] = $5; fastest[$1, $2] = $3 } }
    $3 ~ /^llm\.c/ { llmc[$1, $2, $3] = $5; systems[$3] = 1 }
    END {
        for (i = 1; i <= n; i++) {
            split(order[i], k, "|"); m = k[1]; b = k[2]; ours = sum[m, b] / cnt[m, b]
            line = sprintf("  %s B=%s:", m, b)
            if ((m, b) in fast) line = line sprintf(" %.2fx %s (the fastest of %d SDPA runs)", ours / fast[m, b], fastest[m, b], tried[m, b])
            else line = line " no torch.compile + SDPA run"
            for (sys in systems) if ((m, b, sys) in llmc) line = line sprintf("; %.2fx %s", ours / llmc[m, b, sys], sys)
            print line
        }
    }' "$results"
