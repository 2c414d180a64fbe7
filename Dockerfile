# ten-runner: the training image. One job per container; the job is the argument.
#
#   docker build -t ten-runner .
#   docker run --rm -v ten-cache:/cache ten-runner run jobs/tiny-cpu.yaml          # CPU
#   docker run --gpus all --ipc host --stop-timeout 110 -v ten-cache:/cache \
#       -e AWS_REGION ten-runner run s3://bucket/runs/my-job/submitted/my-job.yaml  # GPU
#
# Base: the CUDA "base" image (CUDA runtime, and the NVIDIA_* settings the NVIDIA
# container toolkit reads). PyPI's torch 2.11.0 Linux wheel is the CUDA 13.0 build (it
# requires cuda-toolkit 13.0.2, cuDNN, NCCL and Triton 3.6.0 as pip packages), so a
# -runtime or -cudnn base would only add ~3 GB of duplicate libraries that every new spot
# VM has to pull.
#
# The stack is the one the GPU suite measured (benchmarks/results/, BENCHMARKS.md): torch
# 2.11.0 (CUDA 13.0), Triton 3.6.0, bitsandbytes 0.50.2, Liger 0.8.5 on Python 3.12 (Ubuntu
# 24.04's). tests/test_dockerfile.py fails when these pins and the newest committed GPU
# results differ: a kernel ships only under a compiler that has run it on a card. (The CPU
# tests run torch 2.13.0 with Triton 3.7.1's interpreter: README, Set up.)
#
# Hosts need an NVIDIA driver >= 580 for CUDA 13.0. For older drivers (README: Older
# drivers) build for CUDA 12: the base and torch's CUDA build follow CUDA_VERSION
# (torch then comes from the PyTorch index of that CUDA, e.g. cu128):
#   docker build --build-arg CUDA_VERSION=12.8.1 -t ten-runner:cu128 .
#
# BASE_IMAGE replaces the base for a build where no registry is reachable: the project's
# image check (tests/image/) builds on a Debian made from the archive with debootstrap.
ARG CUDA_VERSION=13.0.0
ARG BASE_IMAGE=nvidia/cuda:${CUDA_VERSION}-base-ubuntu24.04
FROM ${BASE_IMAGE}

ARG CUDA_VERSION
ARG TORCH_VERSION=2.11.0
ARG TRITON_VERSION=3.6.0
# Empty: PyPI for CUDA 13.0 (its Linux wheel), else https://download.pytorch.org/whl/cuXY.
ARG TORCH_INDEX=
ARG BITSANDBYTES_VERSION=0.50.2
ARG LIGER_VERSION=0.8.5
ARG PYTEST_VERSION=9.0.3
ARG DEBIAN_FRONTEND=noninteractive

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Python 3.12, tini (PID 1), and gcc + headers: Triton compiles a small C launcher the
# first time torch.compile runs on a GPU. Ubuntu package versions are not pinned: the
# archive drops old versions, so pins would break rebuilds; the base tag fixes the release.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        ca-certificates gcc libc6-dev python3 python3-dev python3-venv tini \
    && rm -rf /var/lib/apt/lists/*

# A non-root user with a fixed uid: infra/cloud-init chowns the host cache to it.
RUN groupadd --gid 10001 ten \
    && useradd --no-log-init --create-home --uid 10001 --gid 10001 --shell /bin/bash ten

# A venv, so pip never touches the distribution's Python.
ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1

# torch first, in its own layer: the biggest download, and it changes the least.
RUN cuda="$(echo "${CUDA_VERSION}" | cut -d. -f1,2 | tr -d .)" \
    && default_index="https://download.pytorch.org/whl/cu${cuda}" \
    && if [ "${cuda}" = 130 ]; then default_index=https://pypi.org/simple; fi \
    && python3 -m venv "$VIRTUAL_ENV" \
    && pip install --no-cache-dir "torch==${TORCH_VERSION}" "triton==${TRITON_VERSION}" \
        --index-url "${TORCH_INDEX:-${default_index}}" \
    && python -c 'import sys, torch; sys.exit(torch.version.cuda != sys.argv[1])' \
        "$(echo "${CUDA_VERSION}" | cut -d. -f1,2)"

# The dependencies, the GPU extra (Liger's fused loss) and the trackers' (a job's
# monitor.report_to), from pyproject.toml alone (a code change does not rebuild this
# layer), and pytest for the GPU tests the image carries. The constraints keep the CUDA torch above (a dependency can never swap it for
# another) and pin Triton and the GPU libraries.
WORKDIR /app
COPY pyproject.toml ./
RUN python -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; o = p["optional-dependencies"]; print("\n".join(p["dependencies"] + o["gpu"] + o["trackers"]))' > /tmp/requirements.txt \
    && printf '%s\n' "torch==${TORCH_VERSION}" "triton==${TRITON_VERSION}" \
        "bitsandbytes==${BITSANDBYTES_VERSION}" "liger-kernel==${LIGER_VERSION}" \
        > /tmp/constraints.txt \
    && pip install --no-cache-dir -r /tmp/requirements.txt "pytest==${PYTEST_VERSION}" \
        -c /tmp/constraints.txt \
    && rm /tmp/requirements.txt /tmp/constraints.txt

# The code, then the example jobs (so `docker run IMAGE run jobs/tiny-cpu.yaml` works),
# and the GPU suite and tests, to measure the host the image runs on (BENCHMARKS.md):
#   docker run --gpus all --entrypoint python IMAGE benchmarks/gpu_suite.py --out /cache
COPY README.md ./
COPY ten ./ten
COPY runner ./runner
RUN pip install --no-cache-dir --no-deps . \
    && rm -rf build ten_runner.egg-info
COPY jobs ./jobs
COPY benchmarks ./benchmarks
COPY tests ./tests

# Caches on one mountable volume: prepared shards and bucket jobs' run directories
# (TEN_CACHE_DIR), Hugging Face downloads (HF_HOME), torch.compile/Triton kernels
# (TORCHINDUCTOR_CACHE_DIR), the fused scan's and loss's Triton kernels (TRITON_CACHE_DIR:
# a new container otherwise compiles them again, seconds each). /app/runs takes
# local-store runs (storage.url ./runs).
ENV TEN_CACHE_DIR=/cache/ten \
    HF_HOME=/cache/hf \
    TORCHINDUCTOR_CACHE_DIR=/cache/torch-compile \
    TRITON_CACHE_DIR=/cache/triton
# The CUDA caching allocator grows segments in place instead of stranding odd-sized
# blocks: long sequences of varying activation sizes fragment less.
ENV PYTORCH_ALLOC_CONF=expandable_segments:True
RUN install -d -o ten -g ten /cache /cache/ten /cache/hf /cache/torch-compile /cache/triton \
        /app/runs
VOLUME ["/cache"]

# Numeric, so Kubernetes runAsNonRoot can verify it.
USER 10001:10001

# tini is PID 1 without -g: SIGTERM (docker stop, spot reclaim) goes to ten-runner only,
# which finishes the step and commits a checkpoint; its DataLoader workers must not get
# it directly. Give `docker stop` the notice window: --stop-timeout 110 on AWS.
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=60s --timeout=30s --start-period=120s --retries=3 \
    CMD ["ten-runner", "healthcheck"]
ENTRYPOINT ["tini", "--", "ten-runner"]
CMD ["--help"]
