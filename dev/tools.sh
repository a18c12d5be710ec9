# What the tests, benchmarks and dev scripts run besides the project's own code, and the one place
# that looks for each. Sourced (not run) by dev/setup.sh, which installs what is missing, and by
# dev/cuda/flash_sass.sh, which needs the disassembler; test/run_tests.py asks dev/setup.sh --check
# which optional tools are here, so that a test without its tool is skipped with the tool's name.
# The README's "What the tests need" table lists the same rows; a test checks that the two agree
# and that no script calls a program or imports a module this table does not name.
#
# Where to look can be moved, so that a test can hide what is installed (a fresh machine):
#   PATH            commands
#   PYTHON          the interpreter the tests run (default Debian's /usr/bin/python3, as the Makefile)
#   CUDA_HOME       the CUDA toolkit (default /usr/local/cuda)
#   LLMC_TOOLS_DIR  where dev/setup.sh puts pip packages (default .tools in the repository): with
#                   pip --target, so that no Python installation is changed
#   LLMC_SETUP_FAILED  where dev/setup.sh remembers the optional tools whose install failed
#                   (default LLMC_TOOLS_DIR/setup_failed), so that it does not try them on every run

LLMC_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-/usr/bin/python3}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
LLMC_TOOLS_DIR=${LLMC_TOOLS_DIR:-$LLMC_ROOT/.tools}
LLMC_SETUP_FAILED=${LLMC_SETUP_FAILED:-$LLMC_TOOLS_DIR/setup_failed}

# name | required or optional | what uses it | who installs it: apt:<packages> and pip:<packages>
# (into LLMC_TOOLS_DIR, each named with its version and none of its dependencies installed for it,
# so that nothing there shadows a Debian package: numpy above all) are dev/setup.sh's; "you: ..."
# says why setup does not
TOOL_TABLE='
gcc|required|the CPU trainers and tests (through mpicc), with OpenMP|apt:gcc
sanitizers|required|make sanitize and the sanitized_* tests (AddressSanitizer, UBSan runtimes)|apt:gcc
g++|required|the CUDA sources under the CPU emulator (test/cuda_emu, the emu_* tests)|apt:g++
make|required|every build|apt:make
mpicc|required|every CPU build|apt:libopenmpi-dev
mpirun|required|every multi-rank test and benchmark|apt:openmpi-bin
python3|required|the tests and dev scripts: /usr/bin/python3, Debian packages see it (PYTHON= another)|apt:python3
zlib|required|checkpoint CRC-32 (zlib.h, -lz)|apt:zlib1g-dev
git|required|dev/mutation_sweep.py and dev/cuda/mutation_sweep.py copy the files of the checkout (git ls-files), as the fresh-checkout test does|apt:git
torch|required|test/reference.py, dev/compare_with_pytorch.py, dev/bench/bench_pytorch.py|apt:python3-torch
numpy|required|the tests, dev/hf_export.py, dev/hf_import.py|apt:python3-numpy
matplotlib|required|dev/plot_runs.py, dev/plot_timeline.py (a test draws a plot)|apt:python3-matplotlib
chromium|required|the memory_page tests: headless Chromium opens dev/memory.html from the file system|apt:chromium
wasm|optional|make memory-page: dev/memory_planner compiled to WebAssembly for dev/memory.html (clang for wasm32-wasi, wasi-libc, compiler-rt builtins for wasm32)|apt:clang lld wasi-libc libclang-rt-dev-wasm32
regex|optional|dev/data/gpt2_bpe.py (tinyshakespeare.py, prepare.py, fineweb.py, hellaswag.py): GPT-2 pre-tokenizer on non-ASCII text (re suffices on ASCII)|apt:python3-regex
tiktoken|optional|dev/data/tinyshakespeare.py checks its own BPE against it; prepare.py, fineweb.py and hellaswag.py use it (faster, the same tokens); tests_data.py compares with it|you: pip install tiktoken
tqdm|optional|dev/data/prepare.py and fineweb.py: the progress bar (without it, a plain progress line)|you: installed with the transformers row (tqdm==4.70.1)
datasets|optional|dev/data/fineweb.py: FineWeb streamed from the Hugging Face hub (offline: --local files)|you: pip install datasets (the download needs the hub)
pyarrow|optional|dev/data/fineweb.py --local FILE.parquet, and the parquet case of data_fineweb_local_sample_gives_prepare_shards (JSONL needs nothing)|you: pip install pyarrow (datasets brings it)
transformers|optional|the hf_transformers test: GPT2LMHeadModel loads dev/hf_export.py output (the last release for torch 1.13)|pip:transformers==4.46.3 tokenizers==0.20.3 safetensors==0.8.0 huggingface_hub==0.26.5 tqdm==4.70.1 filelock==4.2.12 fsspec==2026.9.0
nvcc|optional|CUDA builds, make cuda-check, the SASS test (skipped without)|you: the CUDA toolkit
nccl|optional|CUDA builds with nvcc (skipped without; the emulator has its own nccl.h)|you: libnccl-dev or pip nvidia-nccl-cu13 (a 300 MB wheel)
nvdisasm|optional|dev/cuda/flash_sass.sh reads the flash kernels SASS (installed only where nvcc is)|pip:nvidia-cuda-nvdisasm
compute-sanitizer|optional|dev/gpu_check.sh: memcheck and racecheck of the CUDA trainer|you: the CUDA toolkit
ncu|optional|dev/gpu_check.sh: Nsight Compute on the flash attention kernels|you: the CUDA toolkit (Nsight Compute)
gpu|optional|the gpu_* tests, dev/gpu_check.sh, dev/bench/bench_gpu.sh (nvidia-smi -L)|you: an NVIDIA GPU and its driver
'

# a CUDA command-line tool: PATH, beside nvcc, the toolkit, then NVIDIA's pip packages (which put
# it in nvidia/<cuda version>/bin) in LLMC_TOOLS_DIR or in either Python's site-packages
find_cuda_tool() {
    local tool=$1 candidate nvcc py
    nvcc=$(command -v nvcc || true)
    for candidate in "$(command -v "$tool" || true)" "${nvcc:+$(dirname "$nvcc")/$tool}" "$CUDA_HOME/bin/$tool" \
                     "$LLMC_TOOLS_DIR"/nvidia/*/bin/"$tool"; do
        if [ -n "$candidate" ] && [ -x "$candidate" ]; then echo "$candidate"; return 0; fi
    done
    for py in "$PYTHON" python3; do
        command -v "$py" >/dev/null 2>&1 || continue
        candidate=$("$py" -c "import glob, importlib.util, sys
spec = importlib.util.find_spec('nvidia')
paths = [p for root in (spec.submodule_search_locations if spec else []) for p in sorted(glob.glob(root + '/*/bin/' + sys.argv[1]))]
print(paths[0] if paths else '')" "$tool" 2>/dev/null || true)
        if [ -n "$candidate" ] && [ -x "$candidate" ]; then echo "$candidate"; return 0; fi
    done
    return 1
}

# a Python module of $PYTHON, which may be one dev/setup.sh put in LLMC_TOOLS_DIR
python_has() {
    command -v "$PYTHON" >/dev/null 2>&1 &&
        PYTHONPATH="$LLMC_TOOLS_DIR${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -c "import $1" >/dev/null 2>&1 &&
        echo "$PYTHON: import $1"
}

# prints where the tool is and returns 0, or returns 1
find_tool() {
    local scratch
    case "$1" in
        gcc|g++|make|mpicc|mpirun|git) command -v "$1" ;;
        python3) command -v "$PYTHON" ;;
        sanitizers)
            command -v gcc >/dev/null 2>&1 || return 1
            scratch=$(mktemp -d)
            echo 'int main(void) { return 0; }' > "$scratch/main.c"
            gcc -fsanitize=address,undefined "$scratch/main.c" -o "$scratch/main" >/dev/null 2>&1 &&
                "$scratch/main" && echo "gcc -fsanitize=address,undefined"
            local found=$?
            rm -rf "$scratch"
            return $found ;;
        zlib)
            command -v gcc >/dev/null 2>&1 && echo '#include <zlib.h>' | gcc -E -x c - >/dev/null 2>&1 && echo "zlib.h" ;;
        torch|numpy|matplotlib|regex|tiktoken|transformers|tqdm|datasets|pyarrow) python_has "$1" ;;
        nvcc) find_cuda_tool nvcc ;;
        nccl)  # where the Makefile looks: NCCL_HOME, the toolkit, system paths, then NVIDIA's pip package
            local dir
            for dir in ${NCCL_HOME:-} "$CUDA_HOME" /usr; do
                if [ -f "$dir/include/nccl.h" ]; then echo "$dir/include/nccl.h"; return 0; fi
            done
            python_has nvidia.nccl ;;
        nvdisasm|compute-sanitizer|ncu) find_cuda_tool "$1" ;;
        chromium) command -v chromium || command -v chromium-browser ;;
        wasm)  # clang, its WebAssembly linker and wasi-libc: a C file that includes stdio compiles and links
            command -v clang >/dev/null 2>&1 || return 1
            scratch=$(mktemp -d)
            echo '#include <stdio.h>
int main(void) { puts("ok"); return 0; }' > "$scratch/main.c"
            clang --target=wasm32-wasi --sysroot=/usr -nostdlibinc -isystem /usr/include/wasm32-wasi "$scratch/main.c" \
                -o "$scratch/main.wasm" >/dev/null 2>&1 && echo "clang --target=wasm32-wasi"
            local built=$?
            rm -rf "$scratch"
            return $built ;;
        gpu) command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | head -n 1 | grep . ;;
        *) echo "dev/tools.sh: no lookup for '$1'" >&2; return 2 ;;
    esac
}

# the table's rows as "name|need|used by|installer", one a line
tool_rows() {
    echo "$TOOL_TABLE" | grep '|'
}
