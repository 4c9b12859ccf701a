# Thin wrapper over CMake.  `make test` and `make demo` are the two commands
# a new user runs on a fresh Debian machine (see README.md).
BUILD      ?= build
JOBS       ?= 2
CMAKE_ARGS ?=

.PHONY: all setup build test test-fast demo bench bench-scale bench-torch bench-horovod bench-mxnet env-doc wheel install clean

all: build

setup:
	@scripts/setup.sh

build:
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_ARGS) >/dev/null
	@$(MAKE) --no-print-directory -C $(BUILD) -j$(JOBS)

# Every test: the normal build, then ASan+UBSan and TSan builds of the core.
test: setup build
	@scripts/run_tests.sh $(BUILD)

test-fast: build
	@cd $(BUILD) && ctest --output-on-failure -j$(JOBS) -LE "slow|peer"

demo: setup build
	@scripts/demo.sh $(BUILD)

bench: setup build
	@.venv/bin/python bench/run_bench.py --build $(BUILD) --venv .venv --np 2,4 \
	    --sizes 4K,64K,1M,16M,64M --reps 3 --out docs/benchmarks.md
	@python3 bench/recorder_bench.py --build $(BUILD) --np 2,4 --reps 7 --out docs/benchmarks.md

# Start-up, barrier, 4 KiB and 1 MiB allreduce for N = 2..64 ranks on this machine, dshim vs OpenMPI vs
# gloo (N <= 16), interleaved, plus dshim's start-up census (store requests, connections per rank);
# replaces the section "## Scaling with the number of ranks" of docs/benchmarks.md and writes
# docs/bench-scale.png (~8 min on 2 cores)
bench-scale: setup build
	@.venv/bin/python bench/scale_bench.py --build $(BUILD) --venv .venv --np 2,4,8,16,32,64 --reps 3 \
	    --out docs/benchmarks.md --plot docs/bench-scale.png

# PyTorch DDP step and tiny all_reduce, backend "dshim" vs gloo, 2 and 4 processes, interleaved;
# replaces the section "## PyTorch DDP: dshim vs gloo" of docs/benchmarks.md (~5 min on 2 cores)
bench-torch: setup build
	@.venv/bin/python bench/ddp_bench.py --build $(BUILD) --venv .venv --np 2,4 --reps 3 \
	    --out docs/benchmarks.md

# Horovod's synthetic benchmark (an MLP) and a tiny allreduce: dshim's Horovod layer vs real Horovod 0.28.1
# (Gloo) vs DDP on dshim, 2 and 4 processes, interleaved; replaces the section "## Horovod: dshim's layer vs
# real Horovod" of docs/benchmarks.md (~10 min on 2 cores).  Real Horovod lives in its own venv
# REAL_HOROVOD, built there by scripts/build_real_horovod.sh when missing (~15 min, once)
REAL_HOROVOD ?= /tmp/hvd-real
bench-horovod: setup build
	@scripts/build_real_horovod.sh $(REAL_HOROVOD)
	@.venv/bin/python bench/horovod_bench.py --build $(BUILD) --venv .venv --real $(REAL_HOROVOD) --np 2,4 \
	    --reps 5 --out docs/benchmarks.md

# MXNet dist kvstore, dshim's parameter server vs ps-lite (pushpull throughput, Gluon Trainer),
# interleaved, on loopback and on 2 namespace hosts with 1 Gbit/s links (2-bit); replaces the
# "## MXNet dist kvstore" sections of docs/benchmarks.md (~4 min, root)
bench-mxnet: setup build
	@.venv-mxnet/bin/python bench/mxnet_bench.py --build $(BUILD) --reps 3 --out docs/benchmarks.md
	@bench/mxnet_netns_bench.sh --reps 3 --out docs/benchmarks.md

# The manylinux wheel in dist/ (pyproject.toml; docs/install.md): pip wheel, then auditwheel bundles
# libunwind (libcudart is left to the machine, as torch's own wheels do)
wheel: setup
	@rm -rf dist/raw && .venv/bin/pip wheel --no-deps -q -w dist/raw .
	@PATH="$(CURDIR)/.venv/bin:$$PATH" .venv/bin/auditwheel repair --exclude 'libcudart.so.*' -w dist dist/raw/dshim-*.whl \
	    >dist/raw/repair.log 2>&1 || { cat dist/raw/repair.log; exit 1; }
	@rm -rf dist/raw && ls dist/dshim-*.whl

# cmake --install of the build under PREFIX (default /usr/local): library, header, dshim-run,
# dshim-bench, dshim.pc, find_package(dshim)
PREFIX ?= /usr/local
install: build
	@cmake --install $(BUILD) --prefix $(PREFIX)

env-doc: build
	@$(BUILD)/bin/gen-env-doc > docs/env-vars.md

clean:
	rm -rf $(BUILD) build-asan build-tsan build-fuzz
