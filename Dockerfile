# The hflow image: `hflow` is the entrypoint, /work the working directory (mount your
# project there: models/, data and runs/ land on the mount).
#
#   docker build -t hflow:latest .
#   docker run --gpus all -v "$PWD:/work" hflow:latest train /work/my_recipe.yaml
#   docker run --rm hflow:latest recipes list          # the shipped recipes are in the image
#
#   make docker-smoke    # CPU check of this file: target `smoke` on a Debian base (docker/smoke.sh)
#
# Needs BuildKit (Docker >= 23 uses it by default) or podman/buildah: RUN --mount.
#
# Base: CUDA 13.0 because torch 2.13.0's wheels on PyPI are CUDA 13.0 builds
# (cuda-toolkit 13.0.3, nvidia-*-cu13) and the locked vLLM (0.32.0, see
# docker/constraints.txt) pins torch==2.13.0 and is built against them; the devel
# flavour because DeepSpeed and Triton compile kernels at run time (nvcc, headers);
# Ubuntu 24.04 because vLLM needs Python >= 3.11 and 22.04 has 3.10. The CUDA
# user-space libraries torch uses come from its wheels; the host needs an NVIDIA
# driver for CUDA 13 (>= 580) and the NVIDIA Container Toolkit. Any Debian/Ubuntu
# base with or without Python works (docker/install-python.sh), e.g. a pytorch/pytorch
# 2.13.0 CUDA 13 image, whose torch is reused when it is the one TORCH_SPEC names (the
# venv sees the base's packages; not tried).
# Fully qualified so that podman, which does not default to Docker Hub, finds it too.
ARG BASE_IMAGE=docker.io/nvidia/cuda:13.0.2-cudnn-devel-ubuntu24.04

# ---------------------------------------------------------------------------------
# base: Python (installed with apt when the base image has none), a virtual
# environment at /opt/hflow, and the non-root user `hflow`.
FROM ${BASE_IMAGE} AS base
# uid/gid of `hflow`; match your host user so that files written to a mounted /work
# are yours. Ubuntu 24.04 images ship a user `ubuntu` with uid 1000: it is removed.
ARG HFLOW_UID=1000
ARG HFLOW_GID=1000
ENV VIRTUAL_ENV=/opt/hflow \
    PATH=/opt/hflow/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore
WORKDIR /opt/hflow-build
COPY docker/install-python.sh docker/pip.sh docker/pyproject-deps.py docker/check-lock.py docker/
# bubblewrap: the sandbox model-written code runs in (docs/security.md).
RUN sh docker/install-python.sh g++ bubblewrap \
 && python3 -m venv --system-site-packages "$VIRTUAL_ENV"
RUN set -eu; \
    old=$(getent passwd "$HFLOW_UID" | cut -d: -f1 || true); \
    if [ -n "$old" ] && [ "$old" != hflow ]; then userdel -r "$old" 2>/dev/null || userdel "$old"; fi; \
    group=$(getent group "$HFLOW_GID" | cut -d: -f1 || true); \
    if [ -z "$group" ]; then groupadd -g "$HFLOW_GID" hflow; fi; \
    useradd -m -u "$HFLOW_UID" -g "$HFLOW_GID" -s /bin/bash hflow; \
    mkdir -p /work /home/hflow/.cache/huggingface; \
    chown -R "$HFLOW_UID:$HFLOW_GID" /work /home/hflow

# ---------------------------------------------------------------------------------
# deps: the pinned dependencies. They come from pyproject.toml alone and sit in layers
# of their own (torch, then the rest), so that a change to the source reinstalls
# nothing but hflow.
FROM base AS deps
# Package index and CA bundle for machines behind a proxy or with a mirror. PIP_CERT
# is a path inside the build context (put the PEM under docker/certs/); it is mounted
# for the pip steps only and not stored in the image. Build args are recorded in the
# image history: do not put tokens in PIP_INDEX_URL.
ARG PIP_INDEX_URL=
ARG PIP_CERT=
# torch: a requirement, or a wheel under docker/wheels/ (the smoke build's CPU wheel).
# Keep it equal to the torch vLLM pins (see docker/constraints.txt's header).
ARG TORCH_SPEC=torch==2.13.0
# Extras of hflow to install, comma-separated; empty for none (the CPU smoke build).
# cluster: Ray's `default` extra, for Ray's job server and dashboard on a cluster's head
# (`ray job submit`, KubeRay's RayJob). Keep docker/lock.sh's EXTRAS equal to it.
ARG HFLOW_EXTRAS=vllm,cluster
COPY docker/constraints.txt docker/
RUN --mount=type=bind,source=docker/certs,target=/opt/hflow-build/docker/certs \
    --mount=type=bind,source=docker/wheels,target=/opt/hflow-build/docker/wheels \
    docker/pip.sh install -c docker/constraints.txt pip setuptools \
 && docker/pip.sh install -c docker/constraints.txt "$TORCH_SPEC"
COPY pyproject.toml ./
RUN --mount=type=bind,source=docker/certs,target=/opt/hflow-build/docker/certs \
    python docker/pyproject-deps.py pyproject.toml "$HFLOW_EXTRAS" > requirements.txt \
 && docker/pip.sh install -c docker/constraints.txt -r requirements.txt

# ---------------------------------------------------------------------------------
# wheel: hflow's wheel from the source (.dockerignore keeps out tests, runs, models,
# caches), built with the pinned setuptools and no index. Only the wheel moves on.
FROM deps AS wheel
COPY . /src
RUN docker/pip.sh wheel --no-deps --no-build-isolation --wheel-dir /dist /src

# ---------------------------------------------------------------------------------
# app: the image to run.
FROM deps AS app
COPY --from=wheel /dist/ /opt/hflow-build/dist/
RUN docker/pip.sh install --no-deps --no-index dist/hflow-*.whl \
 && python docker/check-lock.py docker/constraints.txt \
 && hflow --help >/dev/null
USER hflow
WORKDIR /work
ENV HF_HOME=/home/hflow/.cache/huggingface
ENTRYPOINT ["hflow"]
CMD ["--help"]

# ---------------------------------------------------------------------------------
# smoke: `make docker-smoke` builds this target on a CPU Debian base with a CPU torch
# wheel and runs hflow inside the build, so that the steps show in the build log.
FROM app AS smoke
# docker/smoke.sh sets this to the time, so that the checks below run on every build
# instead of coming from the layer cache.
ARG SMOKE_RUN=
RUN echo "smoke run ${SMOKE_RUN}" && hflow --help
# An auto-mapper example (its header says so; hflow cannot train it) is dry-run with `hflow map` instead.
RUN set -e; for name in $(hflow recipes list); do \
      if hflow recipes show "$name" | grep -q "auto-mapper example only"; then hflow map "$name" > /dev/null; \
      else hflow validate --no-inputs "$name"; fi; done
RUN hflow train grpo/quickstart --set trainer.total_steps=5 --output-dir /tmp/runs \
 && rm -rf /tmp/runs models

# ---------------------------------------------------------------------------------
# The default target (the last stage): the image to run.
FROM app AS runtime
