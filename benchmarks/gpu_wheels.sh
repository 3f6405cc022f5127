#!/usr/bin/env bash
# The wheels a CUDA machine's image lacks for hflow's single-GPU `local` path and the GPU check
# (benchmarks/gpu_check.py), into ./.whl of the project root (git-ignored): the shared fetch script's
# (DeepSpeed built here as a pure-Python wheel, pydantic, textual, TRL, ...) plus what the check
# itself runs (pytest) and what DeepSpeed imports that the image may lack (psutil). Run here, with
# the package registry in reach; the GPU machine has none. About 10 MB.
#   benchmarks/gpu_wheels.sh && ls .whl
set -euo pipefail
cd "$(dirname "$0")/.."
shared="${HFLOW_SHARED:-../shared}/gpu/fetch-wheels.sh"
[ -x "$shared" ] || { echo "gpu_wheels.sh: $shared not found (set HFLOW_SHARED)" >&2; exit 2; }
"$shared"
plat="--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $plat \
  -d .whl pytest pluggy iniconfig pytest-timeout psutil
du -sh .whl
