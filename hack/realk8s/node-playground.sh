#!/usr/bin/env bash
# The playground on real Kubernetes, in one command (as root, from a clone with the README's
# set-up done): builds the 1.37 control plane, the kubelet, containerd and helm from their Go
# modules (no-ops when current), builds the agent's, a workload's and the sandbox's images from
# hack/image's recipe (cached), starts a whole node in DIR (node-up.sh) and installs the chart
# with the real helm on a simulated DGX H100 whose GPUs are device nodes runc creates.
#
#   hack/realk8s/node-playground.sh [--profile PROFILE] DIR
#
# Then, for example:
#   hack/realk8s/node-exec.sh DIR kubectl apply -f examples/one-gpu.yaml
#   hack/realk8s/node-exec.sh DIR kubectl logs one-gpu
#   hack/realk8s/down.sh DIR
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
HERE="$ROOT/hack/realk8s"
die() { echo "node-playground.sh: $*" >&2; exit 1; }
PROFILE=dgx-h100
DIR=""
while [ $# -gt 0 ]; do
    case "$1" in
        --profile) PROFILE="${2:?--profile needs a value}"; shift 2 ;;
        -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
        -*) die "unknown option $1" ;;
        *) [ -z "$DIR" ] || die "only one DIR"; DIR="$1"; shift ;;
    esac
done
[ -n "$DIR" ] || die "usage: node-playground.sh [--profile PROFILE] DIR"
[ "$(id -u)" = 0 ] || die "must run as root (namespaces, mounts, containers)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || die "no $PY; run the README's set-up command first"
export PATH="/usr/local/go/bin:$PATH"

"$HERE/build.sh" 1.37 node >/dev/null
mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)"
IMAGES="$(mktemp -d)"
trap 'rm -rf "$IMAGES"' EXIT
(cd "$ROOT" && "$PY" -m hack.image build --out "$IMAGES" >&2) || die "the images did not build"
"$HERE/node-up.sh" --images "$IMAGES" "$DIR" >/dev/null
"$HERE/node-exec.sh" "$DIR" helm install dra-agent "$ROOT/deploy/helm/dra-agent" -n dra-agent \
    --create-namespace -f "$DIR/chart-values.yaml" --set "simulate=$PROFILE" \
    --set simulateDeviceNodes=true --wait --timeout 3m >/dev/null ||
    die "helm install failed; the node is still up (hack/realk8s/down.sh $DIR)"
"$HERE/node-exec.sh" "$DIR" kubectl -n dra-agent get pods -o wide >&2
echo "node-playground.sh: the agent runs on $PROFILE; try: hack/realk8s/node-exec.sh $DIR kubectl apply -f examples/one-gpu.yaml" >&2
