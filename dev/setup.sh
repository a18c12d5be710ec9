#!/usr/bin/env bash
# Installs what the tests, benchmarks and dev scripts need and this machine lacks (Debian/Ubuntu).
# The list, and where each tool is looked for, is dev/tools.sh (the README's "What the tests
# need" prints the same table).
#
#   dev/setup.sh            install what is missing: Debian packages with apt-get, NVIDIA's
#                           command-line tools with pip --target into .tools (no Python changed)
#   dev/setup.sh --check    only say what is found and what is missing; exit 1 when a required
#                           tool is missing (the tests read this to skip what lacks its tool)
#   dev/setup.sh --dry-run  --check, then the install commands it would run, without running them
#                           (exit 1, as --check, when a required tool is missing)
#   dev/setup.sh --list     the table itself: name|required or optional|used by|installed by
#   dev/setup.sh --bench    (make bench) also OpenBLAS's OpenMP build, the peer that
#                           dev/bench/bench_matmul and bench_cpu_step.sh time ours against;
#                           nothing else needs it
#   dev/setup.sh --retry    install, trying again the optional tools whose install failed before
#
# An optional tool whose install failed (a package this release lacks, no network) is written to
# LLMC_SETUP_FAILED with the day it failed, and is not tried again for RETRY_DAYS days unless
# --retry asks: `make train` runs setup every time, and must not run apt-get every time for it.
# A required tool is always tried, and its failure stops setup.
set -euo pipefail
source "$(dirname "$0")/tools.sh"
RETRY_DAYS=7

mode=${1:-install}
case "$mode" in
    install|--check|--dry-run|--list|--bench|--retry) ;;
    *) echo "dev/setup.sh: unknown argument '$mode' (expected --check, --dry-run, --list, --bench or --retry)" >&2; exit 2 ;;
esac
retry=""
if [ "$mode" = --retry ]; then mode=install; retry=1; fi
if [ "$mode" = --list ]; then tool_rows; exit 0; fi
if [ "$mode" = --bench ]; then
    # (where the Makefile looks for it: the library in its multiarch directory)
    openmp_build="/usr/lib/$(gcc -print-multiarch)/openblas-openmp/libopenblas.so.0"
    if [ -f "$openmp_build" ]; then
        echo "found    bench     openblas (its OpenMP build) $openmp_build"
        exit 0
    fi
    echo "setup: apt-get install libopenblas0-openmp (the peer of dev/bench/bench_matmul and bench_cpu_step.sh)"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq libopenblas0-openmp
    exit 0
fi

# the day (seconds since 1970) an optional tool's install failed, from LLMC_SETUP_FAILED, or nothing
failed_on() {
    local name day
    [ -f "$LLMC_SETUP_FAILED" ] || return 0
    while IFS='|' read -r name day; do
        if [ "$name" = "$1" ]; then echo "$day"; return 0; fi
    done < "$LLMC_SETUP_FAILED"
}
printf -v now '%(%s)T' -1  # (bash's own clock: a bare PATH has no date)

# the rows to install: required apt packages together (one failure stops setup), each optional
# tool's apt packages on their own (its failure is remembered), pip packages together
required_apt=() optional_rows=() pip_packages=() missing_required=0
while IFS='|' read -r name need used_by installer; do
    if where=$(find_tool "$name"); then
        printf 'found    %-9s %-17s %s\n' "$need" "$name" "$where"
        continue
    fi
    failed=$(failed_on "$name")
    if [ "$need" = optional ] && [ -n "$failed" ] && [ -z "$retry" ] && [ $((now - failed)) -lt $((RETRY_DAYS * 86400)) ]; then
        printf 'missing  %-9s %-17s %s (its install failed on %(%F)T: dev/setup.sh --retry tries again)\n' "$need" \
            "$name" "$used_by" "$failed"
        continue
    fi
    printf 'missing  %-9s %-17s %s (installed by %s)\n' "$need" "$name" "$used_by" "$installer"
    [ "$need" = required ] && missing_required=1
    case "$installer" in
        apt:*) if [ "$need" = required ]; then read -ra packages <<< "${installer#apt:}" && required_apt+=("${packages[@]}")
               else optional_rows+=("$name|${installer#apt:}"); fi ;;
        # NVIDIA's tools are of use only to a CUDA compiler
        pip:nvidia-*) find_tool nvcc >/dev/null && read -ra packages <<< "${installer#pip:}" && pip_packages+=("${packages[@]}") ;;
        pip:*) read -ra packages <<< "${installer#pip:}" && pip_packages+=("${packages[@]}") ;;
    esac
done < <(tool_rows)
if [ "$mode" = --check ]; then exit $missing_required; fi

# sorted, once each (gcc serves two rows)
mapfile -t required_apt < <(printf '%s\n' "${required_apt[@]}" | grep . | sort -u)
optional_apt=()
for row in "${optional_rows[@]}"; do read -ra packages <<< "${row#*|}" && optional_apt+=("${packages[@]}"); done
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
tried=()  # the optional tools this run tried to install
if [ $((${#required_apt[@]} + ${#optional_apt[@]})) -gt 0 ]; then
    echo "setup: apt-get install ${required_apt[*]} ${optional_apt[*]}"
    if [ "$mode" = install ]; then
        $SUDO apt-get update -qq || echo "setup: apt-get update failed; installing from the package lists there are"
        if [ ${#required_apt[@]} -gt 0 ]; then
            DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${required_apt[@]}"
        fi
        for row in "${optional_rows[@]}"; do  # (an optional tool that cannot be had: its tests skip)
            read -ra packages <<< "${row#*|}"
            DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${packages[@]}" ||
                echo "setup: could not apt-get install ${packages[*]} (optional: ${row%%|*})"
            tried+=("${row%%|*}")
        done
    fi
fi
# pip --target: the packages' files land in LLMC_TOOLS_DIR, where dev/tools.sh looks, and no
# Python installation is changed (Debian's refuses pip installs into itself); --no-deps: the
# table names every package, so no newer numpy lands beside Debian's torch. An optional tool
# that cannot be had leaves its tests skipped, not failed.
if [ ${#pip_packages[@]} -gt 0 ]; then
    echo "setup: pip install --target $LLMC_TOOLS_DIR ${pip_packages[*]}"
    if [ "$mode" = install ]; then
        pip_ok=""
        for py in "$PYTHON" python3; do
            if command -v "$py" >/dev/null 2>&1 && "$py" -m pip --version >/dev/null 2>&1; then
                "$py" -m pip install -q --disable-pip-version-check --root-user-action=ignore --upgrade --no-deps \
                    --target "$LLMC_TOOLS_DIR" "${pip_packages[@]}" && pip_ok=1 && break
            fi
        done
        [ -n "$pip_ok" ] || echo "setup: could not pip install ${pip_packages[*]}: the tests that need them are skipped"
        while IFS='|' read -r name need _used_by installer; do
            [ "$need" = optional ] && [[ "$installer" == pip:* ]] && tried+=("$name")
        done < <(tool_rows)
    fi
fi
if [ "$mode" = install ] && [ $((${#required_apt[@]} + ${#optional_apt[@]} + ${#pip_packages[@]})) -gt 0 ]; then
    # remember the optional tools still missing after their install, and forget those found
    mkdir -p "$(dirname "$LLMC_SETUP_FAILED")"
    kept=$(grep -v -E "^($(IFS='|'; echo "${tried[*]:-}"))\|" "$LLMC_SETUP_FAILED" 2>/dev/null || true)
    {
        [ -z "$kept" ] || echo "$kept"
        for name in "${tried[@]}"; do find_tool "$name" >/dev/null || echo "$name|$now"; done
    } > "$LLMC_SETUP_FAILED.tmp"
    mv "$LLMC_SETUP_FAILED.tmp" "$LLMC_SETUP_FAILED"
    [ -s "$LLMC_SETUP_FAILED" ] || rm -f "$LLMC_SETUP_FAILED"
    echo "setup: after installing:"
    exec "$0" --check  # exit 1 if a required tool is still missing
fi
[ "$mode" = install ] || exit $missing_required
