#!/usr/bin/env bash
# Regenerate docker/constraints.txt: the pinned dependency set of the Docker image.
#
#   docker/lock.sh          # PYTHONS="python3.11 python3.12" TORCH_SPEC=torch==2.13.0 EXTRAS=vllm,cluster
#   INCREMENTAL=1 docker/lock.sh   # only add the pins that are missing; no existing pin moves
#
# It is a real resolution, not a hand-written list. For each Python in PYTHONS a fresh
# virtual environment gets TORCH_SPEC, then `pip install .[EXTRAS]`, from the package
# index alone (no find-links or local extra indexes from this machine's pip config, so
# every pin exists on the index), and `pip freeze --all --local` of it is taken.
# docker/merge-freeze.py merges the freezes (a pin that differs between Pythons gets
# a python_version marker), minus torch (the build arg TORCH_SPEC or the base image
# provides it) and hflow. Two Pythons because the pins differ: 3.12 is the default
# GPU base's (Ubuntu 24.04), 3.11 the smoke build's (Debian 12) and the oldest vLLM
# supports; e.g. vLLM 0.32 wants setuptools < 81 on 3.12 only, networkx 3.7 needs 3.12.
# Then, per Python, the image's install steps are re-resolved with the merged pins as
# a dry run, and docker/check-lock.py fails unless every distribution comes out pinned.
#
# The build installs with `-c docker/constraints.txt` and check-lock.py fails it when
# anything installed is not pinned here. This downloads the CUDA build of torch and
# vLLM (a few GB; no GPU needed) and takes about 10 minutes on 2 cores. Run it after
# changing pyproject.toml's dependencies or TORCH_SPEC, then `make docker-smoke`.
#
# INCREMENTAL=1 keeps every line of the existing constraints and adds what is missing,
# e.g. after adding an extra to EXTRAS or a dependency that the pinned set allows. Per
# Python, a light venv (the pinned pip alone, no torch or vLLM installed) resolves the
# image's install steps (pip setuptools, TORCH_SPEC, then pyproject.toml's dependencies
# and EXTRAS, as the Dockerfile installs them) as a dry run with the existing file as
# constraints, so no pin moves; the distributions the report would install that have
# no pin for that Python yet (`docker/check-lock.py --unpinned`; torch's own dependencies
# included, torch and hflow exempt) are merged by docker/merge-freeze.py --keep into
# the file, and a line is added to its header. The same check as above follows. torch
# stays in the dry run (vLLM, DeepSpeed and accelerate require it anyway), so its own
# dependencies are resolved and must be pinned too. A dry run needs only the wheels'
# metadata: the index's PEP 658 metadata files where it lists them, else HTTP range
# requests into the wheels (pip's --use-feature=fast-deps, of the pinned pip 26.3), so
# the multi-GB CUDA wheels of torch and vLLM are not downloaded: a few minutes, a few MB.
# When the existing pins leave no solution, nothing is written: run the full mode.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHONS=${PYTHONS:-python3.11 python3.12}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
EXTRAS=${EXTRAS:-vllm,cluster}  # keep it the Dockerfile's HFLOW_EXTRAS
INCREMENTAL=${INCREMENTAL:-0}
INDEX_URL=${PIP_INDEX_URL:-https://pypi.org/simple}
OUT=${OUT:-docker/constraints.txt}

work=$(mktemp -d)
trap 'rm -rf "$work" build hflow.egg-info' EXIT
# Only the given index: this machine's pip config may add find-links or local indexes
# whose files the image build cannot reach.
export PIP_CONFIG_FILE=/dev/null
unset PIP_FIND_LINKS PIP_EXTRA_INDEX_URL PIP_INDEX_URL PIP_NO_INDEX
pip_args=(--index-url "$INDEX_URL" --progress-bar off)
[ -n "${PIP_CERT:-}" ] && pip_args+=(--cert "$PIP_CERT")

py_version() { "$1" -c 'import platform; print(platform.python_version())'; }
short() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])'; }

# The image's install steps (Dockerfile, stage deps) as a dry run against constraints $3,
# with the venv of Python $1 (short version); pip's report goes to $2.
dry_run() {
  "$work/venv-$1/bin/python" docker/pyproject-deps.py pyproject.toml "$EXTRAS" > "$work/requirements-$1.txt"
  "$work/venv-$1/bin/python" -m pip install -q "${pip_args[@]}" "${dry_args[@]}" --dry-run --ignore-installed \
    --report "$2" -c "$3" pip setuptools "$TORCH_SPEC" -r "$work/requirements-$1.txt"
}
dry_args=()

# Per Python: the install steps with the constraints $1, and check-lock.py on the report.
check_all() {
  for python in $PYTHONS; do
    v=$(short "$python")
    echo "lock.sh: Python $v: the image's install steps with the merged pins (dry run)"
    dry_run "$v" "$work/report-$v.json" "$1"
    "$work/venv-$v/bin/python" docker/check-lock.py "$1" "$work/report-$v.json"
  done
}

# Python $1: its short version in $v, its full one appended to `resolved`, a fresh venv for it.
fresh_venv() {
  v=$(short "$1")
  resolved+=("$(py_version "$1")")
  "$1" -m venv "$work/venv-$v"
}

resolved=()
if [ "$INCREMENTAL" != 0 ]; then
  [ -f "$OUT" ] || { echo "lock.sh: INCREMENTAL=1 adds to $OUT, which does not exist: run the full mode" >&2; exit 2; }
  # Metadata by range requests instead of whole wheels (see above). Not in the full mode:
  # it downloads the wheels anyway, and its pip is the newest, which may drop the feature.
  dry_args=(--use-feature=fast-deps)
  missing=()
  for python in $PYTHONS; do
    fresh_venv "$python"
    echo "lock.sh: Python ${resolved[-1]}: $TORCH_SPEC and .[${EXTRAS}] with the pins of $OUT (dry run)"
    # The pinned pip, the one the image resolves with; the dry run installs nothing.
    "$work/venv-$v/bin/python" -m pip install -q "${pip_args[@]}" -c "$OUT" pip
    if ! dry_run "$v" "$work/before-$v.json" "$OUT"; then
      echo "lock.sh: the pins of $OUT leave no solution on Python $v; run docker/lock.sh without INCREMENTAL" >&2
      exit 1
    fi
    "$work/venv-$v/bin/python" docker/check-lock.py --unpinned "$OUT" "$work/before-$v.json" > "$work/missing-$v.txt"
    echo "  $(grep -c . "$work/missing-$v.txt" || true) distributions without a pin: $(cut -d= -f1 "$work/missing-$v.txt" | tr '\n' ' ')"
    missing+=("$v=$work/missing-$v.txt")
  done
  if ! cat "$work"/missing-*.txt | grep -q .; then
    for python in $PYTHONS; do  # the reports above were resolved with these very pins
      v=$(short "$python")
      "$work/venv-$v/bin/python" docker/check-lock.py "$OUT" "$work/before-$v.json"
    done
    echo "lock.sh: nothing to add; $OUT unchanged ($(grep -c '^[^#]' "$OUT") pins)"
    exit 0
  fi
  python3 docker/merge-freeze.py --keep "$OUT" "${missing[@]}" > "$work/merged.txt"
  added=$(($(grep -c '^[^#]' "$work/merged.txt") - $(grep -c '^[^#]' "$OUT")))
  {
    sed '/^[^#]/,$d' "$OUT"  # its header, kept
    names=$(cut -d= -f1 "$work"/missing-*.txt | sort -fu | paste -sd, | sed 's/,/, /g')
    echo "Added $(date -u +%Y-%m-%d) by INCREMENTAL=1 docker/lock.sh from $INDEX_URL: per Python" \
      "(${resolved[*]}), the image's install steps (pip, setuptools, $TORCH_SPEC, .[${EXTRAS}])" \
      "resolved as a dry run with the pins then in this file as constraints (none moved); the" \
      "$added pins of what it would install unpinned ($names) as resolved, merged by docker/merge-freeze.py." \
      | fold -s -w 86 | sed 's/ *$//; s/^/# /'
    cat "$work/merged.txt"
  } > "$work/constraints.txt"
else
  freezes=()
  for python in $PYTHONS; do
    fresh_venv "$python"
    echo "lock.sh: Python ${resolved[-1]}: $TORCH_SPEC, then .[${EXTRAS}]"
    pip=("$work/venv-$v/bin/python" -m pip)
    "${pip[@]}" install -q "${pip_args[@]}" --upgrade pip setuptools
    "${pip[@]}" install -q "${pip_args[@]}" "$TORCH_SPEC"
    "${pip[@]}" install -q "${pip_args[@]}" ".[${EXTRAS}]"
    "${pip[@]}" freeze --all --local | grep -v -i -E '^(torch|hflow)(==| @ )' > "$work/freeze-$v.txt"
    echo "  torch $("$work/venv-$v/bin/python" -c 'import importlib.metadata as m; print(m.version("torch"))'), $(wc -l < "$work/freeze-$v.txt") other distributions"
    freezes+=("$v=$work/freeze-$v.txt")
  done

  {
    echo "# Pinned dependencies of the hflow Docker image. Generated by docker/lock.sh; do not edit."
    echo "# Resolved $(date -u +%Y-%m-%d) on $(uname -sm) from $INDEX_URL: per Python (${resolved[*]}),"
    echo "# $TORCH_SPEC then .[${EXTRAS}] in a fresh venv, pip freeze; merged by docker/merge-freeze.py."
    echo "# torch is left out: the build arg TORCH_SPEC (or the base image) provides it."
    python3 docker/merge-freeze.py "${freezes[@]}"
  } > "$work/constraints.txt"
fi

check_all "$work/constraints.txt"

mv "$work/constraints.txt" "$OUT"
echo "wrote $OUT ($(grep -c '^[^#]' "$OUT") pins)"
