# syntax=docker/dockerfile:1
# The DDS image: `docker build -t ghcr.io/dds-project/dds:dev .` (hack/kind-up.sh builds and loads it into kind).
# Runs as the non-root user 65532 with a read-only root file system in manifests/dds/deployment.yaml.
#
# Reproducible: the same sources give the same packages. The base image is named by digest (python:3.11-slim, Python
# 3.11.15 on Debian trixie, as docker-library's repo-info records that tag; the tag alone moves with every rebuild).
# Every dependency is pinned, with the hashes of its files, in requirements.lock (`make image-lock` makes it from
# pyproject.toml), and pip refuses any file whose hash is not there (--require-hashes). DDS itself is built with the
# base image's own setuptools (no build isolation), so nothing is fetched that is not pinned.
# tests/unit/test_image_build.py keeps the lock in step with pyproject.toml and this file pinned.
ARG PYTHON_IMAGE=python:3.11-slim@sha256:90744cff8f32887f075c47d747a173ff333e9e98801667af93c357fa9f5e28ff

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY requirements.lock pyproject.toml README.md ./
COPY dds ./dds
# Wheels for every dependency (hash-checked) and for DDS, so the runtime stage needs no compiler and no network.
RUN pip wheel --no-cache-dir --require-hashes --only-binary=:all: --wheel-dir /wheels -r requirements.lock \
 && pip wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN groupadd --gid 65532 dds \
 && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin dds
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index /wheels/*.whl
USER 65532:65532
# 8086: gRPC for cluster-autoscaler; 8087: /metrics, /healthz, /readyz.
EXPOSE 8086 8087
ENTRYPOINT ["dds"]
CMD ["--help"]
