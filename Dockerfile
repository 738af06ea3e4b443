# syntax=docker/dockerfile:1
# The tiered broker image. Build:  docker build -t tiered:0.1.0 .
# Run:    docker run -p 11011:11011 -p 9102:9102 -v tiered-data:/var/lib/tiered tiered:0.1.0
# The image holds no credentials: the catalog password and S3 keys arrive at run time as PGPASSWORD and AWS_*.

# --- build: the project's wheel only; dependencies come as wheels from the index in the final stage ---------
FROM python:3.11-slim AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /src
# Exactly what setuptools packs (pyproject.toml names README.md as the readme; packages tiered* and migrations*).
COPY pyproject.toml README.md ./
COPY tiered ./tiered
COPY migrations ./migrations
RUN pip wheel --no-deps --wheel-dir /wheels .

# --- runtime ------------------------------------------------------------------------------------------------
FROM python:3.11-slim
LABEL org.opencontainers.image.title="tiered" \
      org.opencontainers.image.description="An object-storage tiered broker that speaks TANK's wire protocol" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
# A fixed uid/gid (10001) that the Helm chart's securityContext names too; no home, no login shell. The data
# directory belongs to it, so a plain `docker run` with a named volume works as well as a Kubernetes fsGroup.
RUN groupadd --system --gid 10001 tiered \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
            --shell /usr/sbin/nologin tiered \
 && install -d -o 10001 -g 10001 -m 0750 /var/lib/tiered
# The wheel is bind-mounted from the build stage, so it never lands in a layer; pip compiles the bytecode here,
# because the root filesystem is read-only at run time.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install /wheels/*.whl \
 && tiered --help > /dev/null
WORKDIR /var/lib/tiered
USER 10001:10001
# 11011: TANK protocol; 9102: /metrics, /healthz, /readyz.
EXPOSE 11011 9102
# SIGTERM: stop accepting, finish in-flight requests, commit the open block (within TIERED_SHUTDOWN_TIMEOUT_S).
STOPSIGNAL SIGTERM
# For docker and compose; Kubernetes uses the chart's probes instead. It fails when the HTTP port is turned off.
HEALTHCHECK --interval=15s --timeout=3s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9102/healthz', timeout=2)"]
ENTRYPOINT ["tiered"]
CMD ["serve", "-p", "/var/lib/tiered", "-l", ":11011"]
