#!/usr/bin/env bash
# Runs CMD inside the network and mount namespaces of the node that node-up.sh started in DIR,
# where the API server, the kubelet and the Pods are reachable and nothing else is: with
# KUBECONFIG set to DIR/admin.kubeconfig and kubectl, helm, ctr on PATH.
#
#   hack/realk8s/node-exec.sh DIR CMD [ARGS...]      e.g. node-exec.sh DIR kubectl get pods -A
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
die() { echo "node-exec.sh: $*" >&2; exit 2; }
[ $# -ge 2 ] || die "usage: node-exec.sh DIR CMD [ARGS...]"
DIR="$(cd "$1" 2>/dev/null && pwd)" || die "no directory $1"
shift
[ -f "$DIR/node.env" ] || die "no node in $DIR (no node.env): start one with hack/realk8s/node-up.sh"
# shellcheck disable=SC1091
HOLDER_PID="$(. "$DIR/node.env" && echo "$HOLDER_PID")"
[ -n "$HOLDER_PID" ] && [ -r "/proc/$HOLDER_PID/ns/net" ] || die "the node in $DIR is not running"
exec nsenter --target "$HOLDER_PID" --net --mount --wd="$PWD" -- \
    env KUBECONFIG="$DIR/admin.kubeconfig" PATH="$HERE/bin/1.37:$HERE/bin/node:$HERE/bin:$PATH" \
    CONTAINERD_ADDRESS="$DIR/node/ctrd/containerd.sock" CONTAINERD_NAMESPACE=k8s.io "$@"
