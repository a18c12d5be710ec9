#!/usr/bin/env bash
# llm.c's trainer, built as dev/bench/bench_gpu.sh's peer: karpathy/llm.c's train_gpt2cu, which is
# never part of this project (fetch its source yourself), in two builds:
#   OUT/train_gpt2cu         its default build: attention by its own kernels, the (B, NH, T, T)
#                            scores in memory
#   OUT/train_gpt2cu_cudnn   USE_CUDNN=1: attention by cuDNN's fused flash kernels (its
#                            cudnn_att.cpp through NVIDIA's header-only cudnn-frontend), the
#                            configuration llm.c's own GPU records were set with
#
#   dev/bench/build_llmc_peer.sh LLMC_SRC OUT [CUDNN_FRONTEND_INCLUDE]
#
# LLMC_SRC: a checkout of karpathy/llm.c (measured at f1e2ace, 2025-05-10). OUT: where the builds
# go. CUDNN_FRONTEND_INCLUDE: the include/ folder of a checkout of NVIDIA/cudnn-frontend (headers
# only); without it only the default build is made. cuDNN itself (cudnn.h, libcudnn.so.9) is found
# at CUDNN_HOME, else in the CUDA toolkit's folder, else in the python's nvidia-cudnn package
# (PyTorch's pip wheels bring one: nvidia/cudnn/{include,lib}). Builds for GPU_COMPUTE_CAPABILITY [90], with nvcc from PATH or
# /usr/local/cuda; no GPU is needed to build, so this can run on a machine without one and the
# two programs travel to the GPU (bench_gpu.sh then finds the cuDNN library the same way).
#
# The source is copied to a temporary folder and built there, with one change: CUDA 13 takes a
# cudaMemLocation where llm.c's one cudaMemAdvise call passes a device id (cudaCpuDeviceId), so
# that call is given the host's location. Nothing else of llm.c is touched.
# Then, e.g.:  LLMC_PEER=OUT/train_gpt2cu LLMC_PEER_CUDNN=OUT/train_gpt2cu_cudnn ./dev/bench/bench_gpu.sh
set -euo pipefail
if [ $# -lt 2 ] || [ $# -gt 3 ]; then
    sed -n '/^#   dev\/bench\/build_llmc_peer.sh /p' "$0" | sed 's/^# *//'
    exit 1
fi
src=$1 out=$2 frontend=${3:-}
if [ ! -f "$src/train_gpt2.cu" ] || [ ! -f "$src/Makefile" ]; then
    echo "build_llmc_peer.sh: $src is not a checkout of karpathy/llm.c (no train_gpt2.cu and Makefile there)"
    exit 1
fi
[ -z "$frontend" ] || [ -f "$frontend/cudnn_frontend.h" ] ||
    { echo "build_llmc_peer.sh: $frontend has no cudnn_frontend.h (expected cudnn-frontend's include/ folder)"; exit 1; }
command -v nvcc > /dev/null || export PATH=/usr/local/cuda/bin:$PATH
command -v nvcc > /dev/null || { echo "build_llmc_peer.sh: no nvcc (on PATH or in /usr/local/cuda/bin)"; exit 1; }
sm=${GPU_COMPUTE_CAPABILITY:-90}
mkdir -p "$out"
out=$(cd "$out" && pwd)
[ -z "$frontend" ] || frontend=$(cd "$frontend" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r "$src/." "$work/"
cd "$work"
grep -q "cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId)" llmc/cuda_utils.cuh ||
    { echo "build_llmc_peer.sh: llmc/cuda_utils.cuh's cudaMemAdvise call is not the one this script knows (f1e2ace's)"; exit 1; }
sed -i 's/cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId)/cudaMemAdviseSetPreferredLocation, cudaMemLocation{cudaMemLocationTypeHost, 0})/' \
    llmc/cuda_utils.cuh
# one GPU, no MPI or NCCL: the benchmark's runs are single-GPU (NVCC_LDFLAGS given: without the
# Makefile's -lnvidia-ml, which a machine without a driver cannot link)
common=(NO_MULTI_GPU=1 NO_USE_MPI=1 GPU_COMPUTE_CAPABILITY="$sm" NVCC_LDFLAGS="-lcublas -lcublasLt")
echo "llm.c's train_gpt2cu, default build (sm_$sm):"
make -s train_gpt2cu USE_CUDNN=0 "${common[@]}" > build.log 2>&1 || { tail -20 build.log; exit 1; }
cp train_gpt2cu "$out/train_gpt2cu"
echo "  $out/train_gpt2cu"
[ -n "$frontend" ] || { echo "(no cudnn-frontend include folder given: no cuDNN build)"; exit 0; }
# cuDNN: CUDNN_HOME, else the CUDA toolkit's own folder where it holds cudnn.h, else the python's
# nvidia-cudnn package
cuda_home=$(dirname "$(dirname "$(command -v nvcc)")")
cudnn=${CUDNN_HOME:-}
[ -n "$cudnn" ] || [ ! -f "$cuda_home/include/cudnn.h" ] || cudnn=$cuda_home
if [ -z "$cudnn" ]; then
    cudnn=$("${PYTHON:-python3}" -c 'import nvidia.cudnn; print(list(nvidia.cudnn.__path__)[0])' 2>/dev/null || true)
fi
if [ -z "$cudnn" ] || [ ! -f "$cudnn/include/cudnn.h" ]; then
    echo "build_llmc_peer.sh: no cuDNN found (set CUDNN_HOME to a folder with include/cudnn.h and lib/libcudnn.so*)"
    exit 1
fi
[ -e "$cudnn/lib/libcudnn.so" ] || ln -sf "$cudnn/lib/libcudnn.so.9" "$work/libcudnn.so"  # (the wheel has only .so.9)
echo "llm.c's train_gpt2cu with cuDNN attention (cuDNN at $cudnn, cudnn-frontend at $frontend; a minute or two):"
make -s clean > /dev/null 2>&1 || true
# (llm.c's Makefile looks for the headers in ./cudnn-frontend/include before it takes
# CUDNN_FRONTEND_PATH; it adds -I$CUDNN_FRONTEND_PATH and -lcudnn, and a command-line NVCC_LDFLAGS
# replaces its whole list, -lcudnn included, so that is named again with where the library is;
# cudnn-frontend 1.x's run-time compiled kernels need NVRTC and the driver API, the latter linked
# against the toolkit's stub: the GPU's driver provides it at run time)
mkdir -p cudnn-frontend && ln -sfn "$frontend" cudnn-frontend/include
make -s train_gpt2cu USE_CUDNN=1 "${common[@]}" CUDNN_FRONTEND_PATH="$frontend -I$cudnn/include" \
    NVCC_LDFLAGS="-lcublas -lcublasLt -lcudnn -L$work -L$cudnn/lib -lnvrtc -lcuda -L$cuda_home/lib64/stubs" > build.log 2>&1 ||
    { tail -20 build.log; exit 1; }
cp train_gpt2cu "$out/train_gpt2cu_cudnn"
echo "  $out/train_gpt2cu_cudnn (needs libcudnn.so.9 at run time: bench_gpu.sh adds the python's nvidia libraries)"
