# Builds the trainers for the backend this machine can run, the tests and the benchmarks.
#   make                 build every trainer (BACKEND=cpu|cuda, default: cuda when nvcc and a GPU are present)
#   make test            build and run all tests; ends with "N passed, N failed, N skipped"
#   make train           set up what is missing, build, and run the quick-start training job
#   make bench           CPU training-step benchmark (dev/bench)
#   make clean

PYTHON ?= /usr/bin/python3
NVCC := $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
HAS_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1)
ifeq ($(NVCC)$(HAS_GPU),)
  DEFAULT_BACKEND := cpu
else ifneq ($(and $(NVCC),$(HAS_GPU)),)
  DEFAULT_BACKEND := cuda
else
  DEFAULT_BACKEND := cpu
endif
BACKEND ?= $(DEFAULT_BACKEND)

TRAINERS := train_gpt2_dp
TEST_PROGRAMS := test/test_comm test/test_dataloader
HEADERS := $(wildcard llmc/*.h llmc/cpu/*.h)

# CPU backend: the .cu sources compile as C11 with OpenMP, MPI through mpicc
MPICC ?= mpicc
CFLAGS ?= -O3 -march=native -ffp-contract=fast
CFLAGS += -std=c11 -D_POSIX_C_SOURCE=200809L -fopenmp -Wall -Wextra -I.
LDLIBS := -lm

.PHONY: all test train bench clean check-deps setup

all: check-deps $(TRAINERS)

ifeq ($(BACKEND),cpu)
train_gpt2_%: train_gpt2_%.cu $(HEADERS) | check-deps
	$(MPICC) $(CFLAGS) -x c $< -x none -o $@ $(LDLIBS)
else
train_gpt2_%: train_gpt2_%.cu
	@echo "BACKEND=cuda: the CUDA backend is not written yet; build with BACKEND=cpu" && false
endif

test/test_%: test/test_%.c $(HEADERS) | check-deps
	$(MPICC) $(CFLAGS) $< -o $@ $(LDLIBS)

dev/bench/bench_matmul: dev/bench/bench_matmul.c $(HEADERS)
	$(MPICC) $(CFLAGS) $< -o $@ $(LDLIBS)

# says exactly what is missing and how to install it
check-deps:
	@command -v $(MPICC) >/dev/null 2>&1 || { echo "missing: MPI compiler '$(MPICC)'. Install: apt-get install -y libopenmpi-dev openmpi-bin (or run dev/setup.sh)"; exit 1; }
	@command -v mpirun >/dev/null 2>&1 || { echo "missing: mpirun. Install: apt-get install -y openmpi-bin (or run dev/setup.sh)"; exit 1; }

check-test-deps:
	@$(PYTHON) -c "import torch, numpy" 2>/dev/null || { echo "missing: PyTorch and NumPy for $(PYTHON). Install: apt-get install -y python3-torch python3-numpy (or run dev/setup.sh)"; exit 1; }

test: check-deps check-test-deps $(TRAINERS) $(TEST_PROGRAMS)
	$(PYTHON) test/run_tests.py

setup:
	./dev/setup.sh

train: setup train_gpt2_dp
	OMP_NUM_THREADS=1 mpirun --allow-run-as-root --oversubscribe -np 2 ./train_gpt2_dp -e d4 -b 4 -t 64 -x 150 -v 25 -m 10 -s 50 -g 64 -n 50 -l 1e-3 -u 10 -q 0.1 -c 0.1 -o out/quickstart

bench: $(TRAINERS) dev/bench/bench_matmul
	./dev/bench/bench_matmul
	./dev/bench/bench_cpu_step.sh

clean:
	rm -f $(TRAINERS) $(TEST_PROGRAMS) dev/bench/bench_matmul
	rm -rf test/tmp
