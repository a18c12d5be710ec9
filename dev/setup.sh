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
set -euo pipefail
source "$(dirname "$0")/tools.sh"

mode=${1:-install}
case "$mode" in
    install|--check|--dry-run|--list|--bench) ;;
    *) echo "dev/setup.sh: unknown argument '$mode' (expected --check, --dry-run, --list or --bench)" >&2; exit 2 ;;
esac
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

apt_packages=() pip_packages=() missing_required=0
while IFS='|' read -r name need used_by installer; do
    if where=$(find_tool "$name"); then
        printf 'found    %-9s %-17s %s\n' "$need" "$name" "$where"
        continue
    fi
    printf 'missing  %-9s %-17s %s (installed by %s)\n' "$need" "$name" "$used_by" "$installer"
    [ "$need" = required ] && missing_required=1
    case "$installer" in
        apt:*) read -ra packages <<< "${installer#apt:}" && apt_packages+=("${packages[@]}") ;;
        # NVIDIA's tools are of use only to a CUDA compiler
        pip:nvidia-*) find_tool nvcc >/dev/null && read -ra packages <<< "${installer#pip:}" && pip_packages+=("${packages[@]}") ;;
        pip:*) read -ra packages <<< "${installer#pip:}" && pip_packages+=("${packages[@]}") ;;
    esac
done < <(tool_rows)
if [ "$mode" = --check ]; then exit $missing_required; fi

# sorted, once each (gcc serves two rows)
mapfile -t apt_packages < <(printf '%s\n' "${apt_packages[@]}" | grep . | sort -u)
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
if [ ${#apt_packages[@]} -gt 0 ]; then
    echo "setup: apt-get install ${apt_packages[*]}"
    if [ "$mode" = install ]; then
        $SUDO apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${apt_packages[@]}"
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
    fi
fi
if [ "$mode" = install ] && [ $((${#apt_packages[@]} + ${#pip_packages[@]})) -gt 0 ]; then
    echo "setup: after installing:"
    exec "$0" --check  # exit 1 if a required tool is still missing
fi
[ "$mode" = install ] || exit $missing_required
