#!/usr/bin/env bash
# The whole-node suite: builds the 1.37 control plane, the kubelet, containerd and helm (a
# no-op when current), then runs tests/cluster as root: one node-up.sh node, the agent's image
# built from its recipe (python -m hack.image, cached) and imported, the chart installed with
# helm, and the scenarios of examples/ as real Pods.
#
#   hack/realk8s/cluster-test.sh [-- PYTEST_ARGS...]     (default: tests/cluster)
#
# Needs root and the Debian packages runc, containernetworking-plugins, iproute2, busybox-static
# and mmdebstrap (.ci/run installs them). Uses the repository's .venv (the README's set-up).
set -euo pipefail
export PATH="/usr/local/go/bin:$PATH"  # the machine's Go (>= 1.26), not Debian's golang-go
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || { echo "cluster-test.sh: no $PY; run the README's test set-up command first" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "cluster-test.sh: must run as root (namespaces, mounts, containers)" >&2; exit 1; }
[ "${1:-}" != "--" ] || shift

"$ROOT/hack/realk8s/build.sh" 1.37 node >/dev/null
start=$(date +%s)
status=0
# One node for the whole session: the tests share it, so they run in one process.
[ $# -gt 0 ] || set -- tests/cluster
(cd "$ROOT" && "$PY" -m pytest -n 0 -m cluster "$@") || status=$?
echo "cluster-test.sh: tests/cluster done in $(( $(date +%s) - start )) s (exit $status)" >&2
exit "$status"
