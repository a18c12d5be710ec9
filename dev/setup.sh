#!/usr/bin/env bash
# Installs what the project needs and is missing, on Debian/Ubuntu:
#   MPI (compiler wrapper and mpirun)          libopenmpi-dev openmpi-bin
#   zlib (CRC-32 of checkpoint files)          zlib1g-dev
#   the PyTorch reference for the tests        python3-torch python3-numpy (Debian's /usr/bin/python3)
#   loss curves (dev/plot_runs.py)             python3-matplotlib
#   a SASS disassembler, where nvcc has none   nvidia-cuda-cuobjdump (pip; dev/cuda/flash_sass.sh)
set -euo pipefail
# dev/cuda/flash_sass.sh reads the compiled flash attention kernels; a minimal CUDA toolkit may ship
# nvcc without cuobjdump, and NVIDIA publishes it as a Python package. Optional: without it the
# test that reads the SASS reports itself skipped.
if { command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; } &&
    ! command -v cuobjdump >/dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/cuobjdump ] &&
    ! python3 -c "import glob, nvidia; assert any(glob.glob(p + '/*/bin/cuobjdump') for p in nvidia.__path__)" >/dev/null 2>&1; then
    python3 -m pip install -q nvidia-cuda-cuobjdump >/dev/null 2>&1 ||
        echo "setup: could not pip install nvidia-cuda-cuobjdump (the SASS test will be skipped)"
fi
need=()
command -v mpicc >/dev/null 2>&1 || need+=(libopenmpi-dev)
command -v mpirun >/dev/null 2>&1 || need+=(openmpi-bin)
command -v make >/dev/null 2>&1 || need+=(make)
[ -f /usr/include/zlib.h ] || need+=(zlib1g-dev)
command -v gcc >/dev/null 2>&1 || need+=(gcc)
/usr/bin/python3 -c "import torch" >/dev/null 2>&1 || need+=(python3-torch)
/usr/bin/python3 -c "import numpy" >/dev/null 2>&1 || need+=(python3-numpy)
/usr/bin/python3 -c "import matplotlib" >/dev/null 2>&1 || need+=(python3-matplotlib)
if [ ${#need[@]} -eq 0 ]; then
    echo "setup: everything is installed"
    exit 0
fi
echo "setup: installing ${need[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}"
