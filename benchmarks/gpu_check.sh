#!/usr/bin/env bash
# One part of the GPU check (benchmarks/gpu_check.py) on a CUDA machine whose image has torch,
# transformers, peft, accelerate and typer but not the rest: installs the wheels carried in ./.whl
# (made here by benchmarks/gpu_wheels.sh; no network there) into a folder of their own, puts the
# repository on the path as the `hflow` package, and runs the part, teed into OUT/<part>.log.
#   bash benchmarks/gpu_check.sh engine|train|bench|account OUT [--only CASE ...] [--deadline S]
#   bash benchmarks/gpu_check.sh all OUT [--deadline S]
# `all` runs the three parts at once on the one GPU (for a lease too short for three commands):
# every case's checks hold, but its timings share the GPU and the cores with the other parts.
set -euo pipefail
cd "$(dirname "$0")/.."
usage="usage: gpu_check.sh engine|train|bench|account|all OUT [--only CASE ...] [--deadline S]"
part="${1:?$usage}"
out="${2:?$usage}"
shift 2
ls .whl/*.whl >/dev/null 2>&1 || { echo "gpu_check.sh: no wheels in .whl (run benchmarks/gpu_wheels.sh here first)" >&2; exit 2; }
site="${HFLOW_GPU_SITE:-/tmp/hflow-site}"
if [ ! -f "$site/.installed" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" .whl/*.whl
  touch "$site/.installed"
fi
mkdir -p /tmp/hflow-pkg "$out"
ln -sfn "$PWD" /tmp/hflow-pkg/hflow
export PYTHONPATH="/tmp/hflow-pkg:$site${PYTHONPATH:+:$PYTHONPATH}" WANDB_MODE=disabled TOKENIZERS_PARALLELISM=false
if [ "$part" = all ]; then
  for p in engine train bench; do
    python3 benchmarks/gpu_check.py "$p" "$out" "$@" > "$out/$p.log" 2>&1 &
  done
  wait
  cat "$out"/engine.log "$out"/train.log "$out"/bench.log
else
  python3 benchmarks/gpu_check.py "$part" "$out" "$@" 2>&1 | tee "$out/$part.log"
fi
