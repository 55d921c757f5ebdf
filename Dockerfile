# syntax=docker/dockerfile:1
# The dra-agent image. deploy/ expects it as dra-agent:<package version>:
#   docker build -t dra-agent:0.1.0 .
ARG PYTHON_IMAGE=python:3.11-slim

# Build the wheels (ours and every dependency's) in a throwaway stage, so the final image has
# no build tools, no pip cache and no source tree.
FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY agent ./agent
COPY cdi ./cdi
COPY discovery ./discovery
COPY protos ./protos
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="dra-agent" \
      org.opencontainers.image.description="Kubernetes DRA node agent for GPUs and NICs" \
      org.opencontainers.image.licenses="Apache-2.0"
# Bytecode is compiled at install time; at run time the root file system is read-only.
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels dra-agent
# Fail the build, not the node, when a native dependency is missing from the base image
# (pyudev loads libudev.so.1 at run time).
RUN dra-agent version && python -c "import pyudev; pyudev.Context()"
# Root on purpose: the kubelet (root) owns the plugin and registry directories the agent
# creates sockets in, and /var/run/cdi is root's. The DaemonSet makes the root file system
# read-only; under systemd the unit drops every capability instead.
USER 0:0
ENTRYPOINT ["dra-agent"]
CMD ["run"]
