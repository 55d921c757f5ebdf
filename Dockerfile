# syntax=docker/dockerfile:1
# GENERATED from hack/image/recipe.py by `python -m hack.image dockerfile > Dockerfile`:
# edit the recipe, not this file (tests/image checks the two are the same).
# The dra-agent image. deploy/ expects it as dra-agent:0.1.0:
#   docker build -t dra-agent:0.1.0 .
# The same recipe builds it without a daemon or registry: python -m hack.image build
ARG BASE_IMAGE=debian:bookworm-slim

# Build the wheels (ours and every dependency's) in a throwaway stage, on the python the
# image runs, so the final image has no build tools, no pip cache and no source tree.
FROM ${BASE_IMAGE} AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates libudev1 python3 python3-venv \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/cache/apt/archives/*.deb
RUN python3 -m venv /opt/wheel-build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY agent ./agent
COPY cdi ./cdi
COPY discovery ./discovery
COPY protos ./protos
RUN --mount=type=cache,target=/root/.cache/pip \
    /opt/wheel-build/bin/python -m pip wheel --wheel-dir /wheels .

FROM ${BASE_IMAGE}
LABEL org.opencontainers.image.title=dra-agent \
      org.opencontainers.image.description="Kubernetes DRA node agent for GPUs and NICs" \
      org.opencontainers.image.licenses=Apache-2.0 \
      org.opencontainers.image.version=0.1.0
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates libudev1 python3 python3-venv \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/cache/apt/archives/*.deb
# Bytecode is compiled at install time; at run time the root file system is read-only.
ENV PATH=/opt/dra-agent/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      PYTHONUNBUFFERED=1 \
      PYTHONDONTWRITEBYTECODE=1 \
      PIP_NO_CACHE_DIR=1 \
      PIP_DISABLE_PIP_VERSION_CHECK=1
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python3 -m venv /opt/dra-agent \
    && /opt/dra-agent/bin/pip install --no-index --find-links=/wheels dra-agent
# Fail the build, not the node, when a native dependency is missing from the packages
# (pyudev loads libudev.so.1 at run time).
RUN dra-agent version && python -c "import pyudev; pyudev.Context()"
# Root on purpose: the kubelet (root) owns the plugin and registry directories the
# agent creates sockets in, and /var/run/cdi is root's. The DaemonSet makes the root
# file system read-only; under systemd the unit drops every capability instead.
USER 0:0
ENTRYPOINT ["dra-agent"]
CMD ["run"]
