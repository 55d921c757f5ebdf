#!/usr/bin/env bash
# Stops the kube-apiserver and etcd that hack/realk8s/up.sh started in DIR, and the whole node
# that node-up.sh started there (the kubelet, its containers, containerd, the scheduler and the
# controller-manager, the namespaces, the cgroups under the node's cgroupRoot); removes no file
# in DIR. Succeeds on a cluster that is already down (or was never fully up).
#
#   hack/realk8s/down.sh DIR
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
die() { echo "down.sh: $*" >&2; exit 1; }
# shellcheck source=lib.sh
. "$HERE/lib.sh"
[ $# -eq 1 ] || die "usage: down.sh DIR"
DIR="$1"

# in_netns NS: the pids of every process in network namespace NS (a readlink of /proc/*/ns/net).
in_netns() {
    local ns="$1" p
    for p in /proc/[0-9]*; do
        [ "$(readlink "$p/ns/net" 2>/dev/null)" = "$ns" ] && echo "${p#/proc/}"
    done
    return 0
}
# node_cgroups: the cgroup directories of the node's containers in every cgroup v1 hierarchy.
# With cgroupsPerQOS off the kubelet names no cgroup parent, and containerd puts each container
# (sandboxes included) at /k8s.io/<id>; the ids are the task directories in its state.
node_cgroups() {
    local id
    for id in $(ls "$CONTAINERD_STATE/io.containerd.runtime.v2.task/k8s.io" 2>/dev/null); do
        find /sys/fs/cgroup/*/k8s.io -maxdepth 1 -name "$id" -type d 2>/dev/null || true
    done
}
cgroup_pids() {
    local d
    for d in $(node_cgroups); do cat "$d/cgroup.procs" 2>/dev/null || true; done | sort -u
}
stop_node() {
    CONTAINERD_STATE="${CONTAINERD_STATE:-$DIR/node/ctrd/state}"
    # shellcheck disable=SC1091
    . "$DIR/node.env"
    local ns="" pids i
    [ -z "${HOLDER_PID:-}" ] || ns="$(readlink "/proc/$HOLDER_PID/ns/net" 2>/dev/null || true)"
    # The kubelet first, so that it restarts nothing while the rest goes.
    ours "${KUBELET_PID:-}" kubelet && kill -TERM "$KUBELET_PID" 2>/dev/null || true
    for _ in $(seq 1 50); do ours "${KUBELET_PID:-}" kubelet || break; sleep 0.1; done
    ours "${KUBELET_PID:-}" kubelet && kill -KILL "$KUBELET_PID" 2>/dev/null || true
    # The containers (each in namespaces of its own, but in the node's cgroups), then every
    # process in the node's network namespace: containerd and its shims, the control plane, the
    # holder. The mount namespace and its tmpfs and overlays go with the last of them.
    for i in $(seq 1 50); do
        pids="$(cgroup_pids)"
        [ -n "$ns" ] && pids+=" $(in_netns "$ns")"
        [ -n "${pids// /}" ] || break
        # shellcheck disable=SC2086
        if [ "$i" -le 20 ]; then kill -TERM $pids 2>/dev/null || true; else kill -KILL $pids 2>/dev/null || true; fi
        sleep 0.1
    done
    [ -z "$(cgroup_pids)" ] || die "processes in the node's container cgroups did not stop"
    # The cgroups: the one thing the node made outside DIR. /k8s.io itself goes when empty.
    local d
    for d in $(node_cgroups); do find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || true; done
    [ -z "$(node_cgroups)" ] || die "could not remove the node's container cgroups: $(node_cgroups | head -1) ..."
    rmdir /sys/fs/cgroup/*/k8s.io 2>/dev/null || true
}
[ ! -f "$DIR/node.env" ] || stop_node

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
