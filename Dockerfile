# syntax=docker/dockerfile:1
# The DDS image: `docker build -t ghcr.io/dds-project/dds:dev .` (hack/kind-up.sh builds and loads it into kind).
# Runs as the non-root user 65532 with a read-only root file system in manifests/dds/deployment.yaml.

FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY dds ./dds
# Wheels for DDS and every dependency, so the runtime stage needs no compiler and no network.
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
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
