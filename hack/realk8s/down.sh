#!/usr/bin/env bash
# Stops the kube-apiserver and etcd that hack/realk8s/up.sh started in DIR; removes nothing.
# Succeeds on a cluster that is already down (or was never fully up).
#
#   hack/realk8s/down.sh DIR
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
die() { echo "down.sh: $*" >&2; exit 1; }
# shellcheck source=lib.sh
. "$HERE/lib.sh"
[ $# -eq 1 ] || die "usage: down.sh DIR"
DIR="$1"
if [ ! -f "$DIR/cluster.env" ]; then
    echo "down.sh: no cluster in $DIR (no cluster.env); nothing to stop" >&2
    exit 0
fi
# shellcheck disable=SC1091
. "$DIR/cluster.env"

stop() {
    local pid="$1" name="$2"
    ours "$pid" "$name" || return 0
    kill -TERM "$pid" 2>/dev/null || return 0
    for _ in $(seq 1 100); do
        ours "$pid" "$name" || return 0
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do ours "$pid" "$name" || return 0; sleep 0.1; done
    die "$name (pid $pid) did not stop"
}
stop "${APISERVER_PID:-}" kube-apiserver
stop "${ETCD_PID:-}" etcd
echo "down.sh: cluster in $DIR stopped" >&2
