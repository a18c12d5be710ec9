"""
Builds dev/memory.html: dev/memory_planner compiled to WebAssembly (WASI) by clang and embedded,
with page.html, into one file that opens from the file system with no server and no network.

    make memory-page        (python3 dev/memory_page/build.py)

The planner is the native one, the same C (llmc/memory_plan.h, the trainers' own accounting): the
page runs it with the inputs as its flags and -format json, through a few lines of JavaScript
that stand in for WASI (arguments in, stdout and stderr out). clang's wasm32-wasi target and
wasi-libc are Debian packages (clang, lld, wasi-libc, and libclang-rt-dev-wasm32: compiler-rt's
wasm32 builtins, which wasm-ld links; dev/setup.sh installs them); the trainers'
headers name pthreads and zlib, which wasi-libc lacks, so wasi/ declares what they name (the
planner calls neither), and MPI's declarations come from the installed OpenMPI.

The planner's default profile on -device cpu, dev/profiles/cpu-this-machine.txt (a file beside the
program), is embedded too: the page's WASI stand-in hands it, and a profile pasted into the page,
to the planner as files.

The page records the SHA-256 of every project file the build read, so that a test can tell when
the committed page is older than its sources (test/run_tests.py: memory_page_is_built_from_...).
"""
import base64
import hashlib
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.join(ROOT, "dev", "memory_page")
OUT = os.path.join(ROOT, "dev", "memory.html")
SOURCE = "dev/memory_planner.c"
# the linker's: a stack of 1 MiB. wasm-ld's default, 64 KiB, is less than the step-time model's
# frames take (its kernel rows, the profiles' message buffers): past its end the program writes
# over its own data and traps ("memory access out of bounds")
LINK_FLAGS = ["-Wl,-z,stack-size=1048576"]
# this project's CPU profile (dev/bench/calibrate's): the planner's default on -device cpu is a file
# beside the program, which the page hands to its WebAssembly as a file of that name
CPU_PROFILE = "dev/profiles/cpu-this-machine.txt"


def compile_flags():
    """clang's flags for wasm32-wasi with Debian's wasi-libc, the stubs, and MPI's headers"""
    mpi = subprocess.run(["mpicc", "--showme:incdirs"], stdout=subprocess.PIPE, text=True, check=True).stdout.split()
    flags = ["--target=wasm32-wasi", "--sysroot=/usr", "-nostdlibinc", "-isystem", "/usr/include/wasm32-wasi",
             "-I", os.path.join(HERE, "wasi"), "-O2", "-Wno-unused-variable",
             # (signals and mmap are named by the trainers' headers; wasi-libc declares them on request)
             "-D_WASI_EMULATED_SIGNAL", "-D_WASI_EMULATED_MMAN", "-D_WASI_EMULATED_PROCESS_CLOCKS"]
    for d in mpi:
        flags += ["-isystem", d]
    return flags


def project_sources(flags):
    """the project files the build reads (clang -MM: headers outside -isystem), relative to ROOT"""
    deps = subprocess.run(["clang"] + flags + ["-MM", SOURCE], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                          check=True).stdout
    files = [f for f in deps.replace("\\\n", " ").split()[1:]]
    files = sorted({os.path.relpath(os.path.normpath(os.path.join(ROOT, f)), ROOT) for f in files})
    return files + [CPU_PROFILE, "dev/memory_page/page.html", "dev/memory_page/build.py"]


def sources_digest(files):
    """{file: sha256} of the sources, as the test recomputes it"""
    digest = {}
    for f in files:
        with open(os.path.join(ROOT, f), "rb") as handle:
            digest[f] = hashlib.sha256(handle.read()).hexdigest()
    return digest


def main():
    flags = compile_flags()
    with tempfile.TemporaryDirectory() as tmp:
        wasm = os.path.join(tmp, "memory_planner.wasm")
        p = subprocess.run(["clang"] + flags + LINK_FLAGS + [SOURCE, "-o", wasm], cwd=ROOT)
        if p.returncode != 0:
            sys.exit("error: clang could not build %s for wasm32-wasi (dev/setup.sh installs clang, lld, wasi-libc and "
                     "libclang-rt-dev-wasm32; dev/setup.sh --retry if an earlier install of them failed)" % SOURCE)
        with open(wasm, "rb") as f:
            binary = f.read()
    with open(os.path.join(HERE, "page.html")) as f:
        page = f.read()
    build = {"sources": sources_digest(project_sources(flags)), "wasm_bytes": len(binary),
             "compiler": subprocess.run(["clang", "--version"], stdout=subprocess.PIPE, text=True).stdout.splitlines()[0]}
    with open(os.path.join(ROOT, CPU_PROFILE)) as f:
        cpu_profile = json.dumps(f.read()).replace("</", "<\\/")  # (a JavaScript string that cannot end the script)
    for marker, value in (("/*PLANNER_WASM_BASE64*/", base64.b64encode(binary).decode()),
                          ("/*PLANNER_BUILD*/", json.dumps(build, sort_keys=True)),
                          ("/*CPU_PROFILE_TEXT*/", cpu_profile)):
        if page.count(marker) != 1:
            sys.exit("error: dev/memory_page/page.html must hold %s once" % marker)
        page = page.replace(marker, value)
    with open(OUT + ".tmp", "w") as f:
        f.write(page)
    os.replace(OUT + ".tmp", OUT)
    print("wrote %s: %d bytes of WebAssembly, %d source files" % (os.path.relpath(OUT, ROOT), len(binary),
                                                                   len(build["sources"])))


if __name__ == "__main__":
    main()
