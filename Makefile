# Builds the trainers for the backend this machine can run, the tests and the benchmarks.
#   make                 build every trainer (BACKEND=cpu|cuda; default cuda when nvcc and a GPU are present)
#   make test            build and run all tests; ends with "N passed, N failed, N skipped"
#   make train           set up what is missing, build, and run the quick-start training job;
#                        STEPS=N its length (150), RESUME=1 continues it from its newest checkpoint,
#                        QUICKSTART=dir its output dir (out/quickstart)
#   make compare         train one trainer and PyTorch alike and compare them step by step (dev/compare_with_pytorch.py):
#                        make compare TRAINER=train_gpt2_3d RANKS=8 FLAGS="-dp 2 -pp 2 -tp 2 -sp 1 -b 2"
#                        (TRAINER may be an emulator build, e.g. build/emu_FP32/train_gpt2_tp with ENV=CUDA_EMU_DEVICES=2)
#   make bench           benchmarks (CPU: matmul GFLOP/s, a training step, tensor and pipeline parallelism; GPU: dev/bench/bench_gpu.sh)
#   make sanitize        the CPU trainers built with AddressSanitizer + UndefinedBehaviorSanitizer:
#                        build/sanitize/train_gpt2_dp, ..._tp, ..._pp, ..._3d, ..._cp, ..._diloco, ..._ep (the tests run bad inputs, TP, PP, 3D, CP and DiLoCo runs)
#   make mutation-sweep  delete each barrier of llmc/cuda in turn and check the emulator notices
#                        (dev/cuda/mutation_sweep.py; about 20 minutes on 2 cores)
#   make mutation-sweep-trainers  plant one-line bugs in the mechanisms (MoE, DiLoCo, TP, DDP, ZeRO,
#                        PP, CP) one at a time in a copy and check the tests catch each
#                        (dev/mutation_sweep.py; about 20 minutes on 2 cores)
#   make cuda-check      compile every trainer and dev/cuda file with nvcc for sm_80 and sm_90, bf16 for sm_90a too
#                        (no GPU needed; -j2 runs two at a time)
#   make build/emu_FP32/train_gpt2_dp   the CUDA backend built for the CPU emulator (test/cuda_emu);
#                        also build/emu_BF16/..., build/emu_FP32/dev/cuda/<kernel>, build/cuda_BF16/... (nvcc)
#   make clean
# CUDA options: PRECISION=BF16|FP32 (default BF16), GPU_COMPUTE_CAPABILITY=90 (default: read off the
# GPU; 90 builds for sm_90a, with wgmma), NCCL_HOME=/path (else /usr/local/cuda, system paths, then NCCL from Python packages).

PYTHON ?= /usr/bin/python3
NVCC := $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
HAS_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1)
ifneq ($(and $(NVCC),$(HAS_GPU)),)
  DEFAULT_BACKEND := cuda
else
  DEFAULT_BACKEND := cpu
endif
BACKEND ?= $(DEFAULT_BACKEND)

TRAINERS := train_gpt2_dp train_gpt2_tp train_gpt2_pp train_gpt2_3d train_gpt2_cp train_gpt2_diloco train_gpt2_ep
TEST_PROGRAMS := test/test_comm test/test_dataloader test/test_norm test/test_pipeline test/test_ring_attention test/test_classifier test/test_link_codes test/test_comm_time test/test_step_time
HEADERS := $(wildcard llmc/*.h llmc/cpu/*.h llmc/cuda/*.cuh dev/cuda/*.h dev/cuda/*.cuh)
DEV_CUDA := $(wildcard dev/cuda/*.cu)

# ---- CPU backend: the .cu sources compile as C11 with OpenMP, MPI through mpicc
MPICC ?= mpicc
# portable: no -march=native (the GEMM's micro-kernel and the hot ops pick AVX-512, AVX2 or SSE2 at
# run time: llmc/cpu/matmul.h, llmc/cpu/clones.h), so a binary built here runs on any x86-64
# -fno-trapping-math: nothing here reads the floating-point exception flags, and without it GCC
# keeps a clamp (x < a ? a : x) as a branch and leaves its loop scalar (GELU's e^x)
CFLAGS ?= -O3 -ffp-contract=fast -fno-math-errno -fno-trapping-math
CFLAGS += -std=c11 -D_POSIX_C_SOURCE=200809L -D_DEFAULT_SOURCE -fopenmp -Wall -Wextra -I.
LDLIBS := -lm -lz  # zlib: CRC-32 of checkpoint files
NPROC := $(shell nproc 2>/dev/null || echo 1)

# ---- CUDA backend
, := ,
PRECISION ?= BF16
# without a GPU to ask: sm_80 code plus compute_80 PTX, which newer GPUs compile when loading it
DETECTED_CC := $(shell nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d '.')
GPU_COMPUTE_CAPABILITY ?= $(if $(DETECTED_CC),$(DETECTED_CC),80)
# Hopper (90) builds for sm_90a, its own instructions (wgmma: LLMC_FLASH=wgmma) included; such a
# binary runs on Hopper GPUs only, which is what the detected or named capability says it is for
NVCC_ARCH := $(if $(filter 90,$(GPU_COMPUTE_CAPABILITY)),-gencode arch=compute_90a$(,)code=[sm_90a$(,)compute_90a] -DLLMC_WGMMA,-gencode arch=compute_$(GPU_COMPUTE_CAPABILITY)$(,)code=[sm_$(GPU_COMPUTE_CAPABILITY)$(,)compute_$(GPU_COMPUTE_CAPABILITY)])
NVCC_FLAGS := -O3 -std=c++17 -I. --compiler-options -Wall,-Wextra,-fopenmp,-march=native
PRECISION_FLAG := $(if $(filter FP32,$(PRECISION)),-DENABLE_FP32,)
# NCCL: NCCL_HOME, the CUDA toolkit, system paths, then the nvidia-nccl Python package
NCCL_PY := $(shell $(PYTHON) -c "import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])" 2>/dev/null || python3 -c "import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])" 2>/dev/null)
NCCL_DIR := $(firstword $(foreach d,$(NCCL_HOME) /usr/local/cuda /usr $(NCCL_PY),$(if $(wildcard $(d)/include/nccl.h),$(d),)))
NCCL_LIBDIR := $(firstword $(foreach d,lib lib64 lib/x86_64-linux-gnu,$(if $(wildcard $(NCCL_DIR)/$(d)/libnccl.so*),$(NCCL_DIR)/$(d),)))
# the Python package ships only libnccl.so.2, with no unversioned name for -lnccl to find
NCCL_LIB := $(if $(wildcard $(NCCL_LIBDIR)/libnccl.so),-lnccl,-l:libnccl.so.2)
NCCL_FLAGS := $(if $(NCCL_DIR),-I$(NCCL_DIR)/include -L$(NCCL_LIBDIR) -Xlinker -rpath=$(NCCL_LIBDIR),)
# MPI is optional on the CUDA backend: without it, ranks meet through RANK/WORLD_SIZE/LLMC_NCCL_ID_FILE
HAS_MPI := $(shell command -v $(MPICC) >/dev/null 2>&1 && echo 1)
MPI_FLAGS := $(if $(HAS_MPI),-DUSE_MPI $(shell $(MPICC) --showme:incdirs 2>/dev/null | sed 's/\([^ ]*\)/-I\1/g') $(shell $(MPICC) --showme:libdirs 2>/dev/null | sed 's/\([^ ]*\)/-L\1/g') -lmpi,)
CUDA_LIBS := -lcublas -lcublasLt $(NCCL_LIB) -lz

.PHONY: all test train bench compare clean check-deps check-test-deps check-cuda-deps setup cuda-check sanitize mutation-sweep mutation-sweep-trainers memory-page

all: $(TRAINERS)

ifeq ($(BACKEND),cpu)
train_gpt2_%: train_gpt2_%.cu $(HEADERS) | check-deps
	$(MPICC) $(CFLAGS) -x c $< -x none -o $@ $(LDLIBS)
else
train_gpt2_%: train_gpt2_%.cu $(HEADERS) | check-cuda-deps
	$(NVCC) $(NVCC_ARCH) $(NVCC_FLAGS) $(PRECISION_FLAG) $< -o $@ $(NCCL_FLAGS) $(MPI_FLAGS) $(CUDA_LIBS)
endif

# any out-of-bounds access, use after free or undefined behaviour (an int overflow, a bad shift)
# stops the program with a report; -O1 -g keeps the reports readable
SANITIZE_FLAGS := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
sanitize: build/sanitize/train_gpt2_dp build/sanitize/train_gpt2_tp build/sanitize/train_gpt2_pp build/sanitize/train_gpt2_3d build/sanitize/train_gpt2_cp build/sanitize/train_gpt2_diloco build/sanitize/train_gpt2_ep
build/sanitize/train_gpt2_%: train_gpt2_%.cu $(HEADERS) | check-deps
	@mkdir -p $(dir $@)
	$(MPICC) $(filter-out -O3,$(CFLAGS)) $(SANITIZE_FLAGS) -x c $< -x none -o $@ $(LDLIBS)

test/test_%: test/test_%.c $(HEADERS) | check-deps
	$(MPICC) $(CFLAGS) $< -o $@ $(LDLIBS)
# (the step-time model reads the planner's headers, whose static tables it does not use)
test/test_step_time: CFLAGS += -Wno-unused-variable

# OpenBLAS's sgemm beside ours, when it is installed (dev/setup.sh --bench installs it): its OpenMP
# build (Debian's libopenblas0-openmp), so that one pool of threads serves its sgemm and our code
# (with its pthreads build, its idle workers busy-wait and take the cores from ours)
OPENBLAS_OPENMP := /usr/lib/$(shell $(CC) -print-multiarch)/openblas-openmp/libopenblas.so.0
OPENBLAS_LINK := $(OPENBLAS_OPENMP) -Wl,-rpath,$(dir $(OPENBLAS_OPENMP))
dev/bench/bench_matmul: dev/bench/bench_matmul.c dev/bench/best_seconds.h $(HEADERS)
	$(MPICC) $(CFLAGS) $< -o $@ $(LDLIBS) $(if $(wildcard $(OPENBLAS_OPENMP)),-DHAVE_OPENBLAS $(OPENBLAS_LINK))
# bench_cpu_step.sh's peer: our trainer with OpenBLAS's sgemm doing every matmul
dev/bench/train_gpt2_dp_openblas: train_gpt2_dp.cu $(HEADERS)
	@test -f $(OPENBLAS_OPENMP) || { echo "missing: $(OPENBLAS_OPENMP) (OpenBLAS's OpenMP build). Install: dev/setup.sh --bench"; exit 1; }
	$(MPICC) $(CFLAGS) -DLLMC_GEMM_OPENBLAS -x c $< -x none -o $@ $(LDLIBS) $(OPENBLAS_LINK)
dev/bench/bench_cpu_ops: dev/bench/bench_cpu_ops.c dev/bench/best_seconds.h $(HEADERS)
	$(MPICC) $(CFLAGS) $< -o $@ $(LDLIBS)
# this machine's CPU measured into a device profile: mpirun -np 2 dev/bench/calibrate -o FILE
dev/bench/calibrate: dev/bench/calibrate.c dev/bench/best_seconds.h $(HEADERS)
	$(MPICC) $(CFLAGS) $< -o $@ $(LDLIBS)

# will it fit? a rank's device memory for any model, machine and layout (no GPU, no ranks)
# (the trainers' headers hold static tables the planner does not use: no warning for those)
dev/memory_planner: dev/memory_planner.c $(HEADERS) | check-deps
	$(MPICC) $(CFLAGS) -Wno-unused-variable $< -o $@ $(LDLIBS)
# the kernels of one GPU training step (llmc/step_kernels.h) as JSON, the rows dev/bench/roofline.py prints,
# with -profile each priced by llmc/step_time.h (whose memory_plan.h includes MPI's headers: mpicc, as the
# planner; dev/gpu_check.sh builds it beside test_comm, which needs MPI too)
dev/bench/step_kernels: dev/bench/step_kernels.c $(HEADERS) | check-deps
	$(MPICC) $(CFLAGS) -Wno-unused-variable $< -o $@ $(LDLIBS)

# the planner as a page: dev/memory_planner compiled to WebAssembly and embedded in dev/memory.html
# (committed, so that a reader opens it without the toolchain; a test says when it is older than
# its sources)
memory-page:
	$(PYTHON) dev/memory_page/build.py

# one dev/cuda program: make dev/cuda/layernorm_forward
dev/cuda/%: dev/cuda/%.cu $(HEADERS) | check-cuda-deps
	$(NVCC) $(NVCC_ARCH) $(NVCC_FLAGS) $(PRECISION_FLAG) $< -o $@ $(NCCL_FLAGS) $(CUDA_LIBS) -lgomp

# GPU tests build both precisions side by side: build/cuda_FP32/train_gpt2_dp,
# build/cuda_BF16/dev/cuda/gelu, ...
build/cuda_FP32/%: %.cu $(HEADERS) | check-cuda-deps
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_ARCH) $(NVCC_FLAGS) -DENABLE_FP32 $< -o $@ $(NCCL_FLAGS) $(MPI_FLAGS) $(CUDA_LIBS) -lgomp
build/cuda_BF16/%: %.cu $(HEADERS) | check-cuda-deps
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_ARCH) $(NVCC_FLAGS) $< -o $@ $(NCCL_FLAGS) $(MPI_FLAGS) $(CUDA_LIBS) -lgomp

build/cuda_FP32/test/test_comm: test/test_comm.c $(HEADERS) | check-cuda-deps
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_ARCH) $(NVCC_FLAGS) -DENABLE_FP32 -x cu $< -o $@ $(NCCL_FLAGS) $(MPI_FLAGS) $(CUDA_LIBS) -lgomp

# cuda_emu (test/cuda_emu): the CUDA backend compiled by g++ and run on the CPU, for tests without
# a GPU. The sources are copied to build/emu_src with their kernel launches rewritten.
EMU_SOURCES := $(TRAINERS:=.cu) $(HEADERS) $(DEV_CUDA) test/test_comm.c
EMU_HEADERS := $(wildcard test/cuda_emu/include/*.h)
EMU_CXX ?= g++
# -fsanitize=alignment: a misaligned vector load or store, which faults on a GPU, stops the program.
# -O1: a third less compile time than -O2 and the emulated runs as fast (measured on the tests)
EMU_FLAGS := -O1 -std=c++17 -march=native -fopenmp -fsanitize=alignment -fno-sanitize-recover=alignment \
  -D__CUDACC__ -DCUDA_EMU -Ibuild/emu_src -Itest/cuda_emu/include \
  $(MPI_FLAGS) -lz
build/emu_src/.stamp: $(EMU_SOURCES) test/cuda_emu/translate.py
	@$(PYTHON) test/cuda_emu/translate.py build/emu_src $(EMU_SOURCES) && touch $@
build/emu_FP32/test/test_comm: build/emu_src/.stamp $(EMU_HEADERS)
	@mkdir -p $(dir $@)
	$(EMU_CXX) -DENABLE_FP32 -x c++ build/emu_src/test/test_comm.c $(EMU_FLAGS) -o $@
build/emu_FP32/%: build/emu_src/.stamp $(EMU_HEADERS)
	@mkdir -p $(dir $@)
	$(EMU_CXX) -DENABLE_FP32 -x c++ build/emu_src/$*.cu $(EMU_FLAGS) -o $@
build/emu_BF16/%: build/emu_src/.stamp $(EMU_HEADERS)
	@mkdir -p $(dir $@)
	$(EMU_CXX) -x c++ build/emu_src/$*.cu $(EMU_FLAGS) -o $@

mutation-sweep:
	$(PYTHON) dev/cuda/mutation_sweep.py

mutation-sweep-trainers:
	$(PYTHON) dev/mutation_sweep.py

# CI without a GPU: every trainer, every dev/cuda file and the comm test must compile for Ampere
# and Hopper, in both precisions. One nvcc call builds both architectures (the host code once,
# the two device compilations on two threads); `make -j2 cuda-check` runs two calls at a time.
# The device code is compiled without optimization (-Xcicc -O0 -Xptxas -O0: 2.7x faster, the
# same errors): this checks that it compiles; the optimized SASS of the flash kernels is read by
# dev/cuda/flash_sass.sh, and a GPU build (make BACKEND=cuda) is optimized as always.
CUDA_CHECK_SOURCES := $(TRAINERS:=.cu) $(DEV_CUDA) test/test_comm.c
# build/cuda-check/<precision>/<source without its extension>, from that source and the headers
define CUDA_CHECK_RULE
build/cuda-check/$(1)/$(basename $(2)): $(2) $(HEADERS) | check-cuda-deps
	@mkdir -p $$(dir $$@)
	@echo "nvcc sm_80 + sm_90 $(if $(filter BF16,$(1)),+ sm_90a )$(1) $(2)"
	@$(NVCC) -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
	  $(if $(filter BF16,$(1)),-gencode arch=compute_90a$(,)code=sm_90a -DLLMC_WGMMA,) --threads 2 -O1 -Xcicc -O0 -Xptxas -O0 -std=c++17 -I. \
	  --compiler-options -Wall,-Wextra,-fopenmp $(if $(filter FP32,$(1)),-DENABLE_FP32,) -x cu $(2) -o $$@ \
	  $(NCCL_FLAGS) $(MPI_FLAGS) $(CUDA_LIBS) -lgomp
endef
$(foreach p,BF16 FP32,$(foreach src,$(CUDA_CHECK_SOURCES),$(eval $(call CUDA_CHECK_RULE,$(p),$(src)))))
cuda-check: $(foreach p,BF16 FP32,$(addprefix build/cuda-check/$(p)/,$(basename $(CUDA_CHECK_SOURCES))))
	@echo "cuda-check: all compiled"

# says exactly what is missing and how to install it
check-deps:
	@command -v $(MPICC) >/dev/null 2>&1 || { echo "missing: MPI compiler '$(MPICC)'. Install: apt-get install -y libopenmpi-dev openmpi-bin (or run dev/setup.sh)"; exit 1; }
	@command -v mpirun >/dev/null 2>&1 || { echo "missing: mpirun. Install: apt-get install -y openmpi-bin (or run dev/setup.sh)"; exit 1; }
	@echo '#include <zlib.h>' | $(MPICC) -E -x c - >/dev/null 2>&1 || { echo "missing: zlib (zlib.h). Install: apt-get install -y zlib1g-dev (or run dev/setup.sh)"; exit 1; }

check-test-deps:
	@$(PYTHON) -c "import torch, numpy, matplotlib" 2>/dev/null || { echo "missing: PyTorch, NumPy or matplotlib for $(PYTHON). Install: apt-get install -y python3-torch python3-numpy python3-matplotlib (or run dev/setup.sh)"; exit 1; }

check-cuda-deps:
	@[ -n "$(NVCC)" ] || { echo "missing: nvcc. Install the CUDA toolkit (https://developer.nvidia.com/cuda-downloads) or build with BACKEND=cpu"; exit 1; }
	@[ -n "$(NCCL_DIR)" ] || { echo "missing: NCCL (nccl.h). Install libnccl-dev, set NCCL_HOME, or pip install nvidia-nccl-cu12"; exit 1; }

test: check-deps check-test-deps
	$(MAKE) -s -j$(NPROC) BACKEND=cpu $(TEST_PROGRAMS) dev/memory_planner dev/bench/step_kernels $(TRAINERS)
	$(PYTHON) test/run_tests.py

# one trainer against PyTorch (dev/compare_with_pytorch.py); TRAINER, RANKS, FLAGS and ENV as in the header
TRAINER ?= train_gpt2_dp
RANKS ?= 1
FLAGS ?=
ENV ?=
compare: check-test-deps $(TRAINER)
	$(PYTHON) dev/compare_with_pytorch.py --ranks $(RANKS) $(foreach e,$(ENV),--env $(e)) ./$(TRAINER) -- $(FLAGS)

setup:
	./dev/setup.sh

# the quick start: d4 on Tiny Shakespeare, 2 ranks, into out/quickstart. STEPS is the run's
# length (default 150; the learning rate's schedule spans it, so it is part of the run);
# RESUME=1 continues the run there from its newest checkpoint (a checkpoint every 50 steps),
# with the same STEPS. Without RESUME=1 an earlier run's checkpoints stop it, as the trainer
# would, saying how to continue or start over.
STEPS ?= 150
RESUME ?= 0
QUICKSTART := out/quickstart
train: setup
	$(MAKE) -s BACKEND=cpu train_gpt2_dp
	@if [ "$(RESUME)" != 1 ] && ls $(QUICKSTART)/DONE_* >/dev/null 2>&1; then \
	    steps="$(if $(filter-out 150,$(STEPS)), STEPS=$(STEPS))"; dir="$(if $(filter-out out/quickstart,$(QUICKSTART)), QUICKSTART=$(QUICKSTART))"; \
	    newest=$$(ls $(QUICKSTART)/DONE_* | sed 's/.*DONE_0*//' | sort -n | tail -n 1); newest=$${newest:-0}; \
	    if [ -e $(QUICKSTART)/DONE_$$(printf %08d $(STEPS)) ]; then \
	        echo "make train: $(QUICKSTART) holds a finished run of $(STEPS) steps (its model file:" \
	             "$(QUICKSTART)/model_$$(printf %08d $(STEPS)).bin). For another, start over with" \
	             "'rm -rf $(QUICKSTART)' or give it another dir: 'make train$$steps QUICKSTART=out/another'"; \
	    elif [ $$newest -ge $(STEPS) ]; then \
	        echo "make train: $(QUICKSTART) holds a run already at step $$newest, past STEPS=$(STEPS). Start" \
	             "over with 'rm -rf $(QUICKSTART)', or give it another dir: 'make train$$steps QUICKSTART=out/another'"; \
	    else \
	        echo "make train: $(QUICKSTART) holds checkpoints of an earlier run. Continue it from the" \
	             "newest with 'make train$$steps$$dir RESUME=1' (with the STEPS it had), or start over:" \
	             "'rm -rf $(QUICKSTART)'"; \
	    fi; exit 1; fi
	OMP_NUM_THREADS=1 mpirun --allow-run-as-root --oversubscribe -np 2 ./train_gpt2_dp -e d4 -b 4 -t 64 -x $(STEPS) -v 25 -m 10 -s 50 -g 64 -n 50 -l 1e-3 -u 10 -q 0.1 -c 0.1 -y $(RESUME) -o $(QUICKSTART)

bench:
	./dev/setup.sh --bench
	$(MAKE) -s -B BACKEND=cpu dev/bench/bench_matmul  # (again: now with OpenBLAS)
	$(MAKE) -s BACKEND=cpu train_gpt2_dp train_gpt2_tp train_gpt2_cp train_gpt2_ep dev/bench/bench_cpu_ops
	./dev/bench/bench_matmul
	./dev/bench/bench_cpu_ops
	./dev/bench/bench_cpu_step.sh
	./dev/bench/bench_zero.sh
	./dev/bench/bench_tp.sh
	./dev/bench/bench_pp.sh
	./dev/bench/bench_cp.sh
	./dev/bench/bench_ep.sh

clean:
	rm -f $(TRAINERS) $(TEST_PROGRAMS) dev/bench/bench_matmul dev/bench/bench_cpu_ops dev/bench/train_gpt2_dp_openblas dev/memory_planner dev/bench/step_kernels $(DEV_CUDA:.cu=)
	rm -rf test/tmp build
