#!/usr/bin/env bash
# Starts a whole one-node Kubernetes 1.37 cluster as root, every bit of its state under DIR:
# etcd and kube-apiserver (up.sh), kube-controller-manager, kube-scheduler, containerd 2.x with
# its CRI plugin and CDI, runc 1.5, Debian's CNI plugins, and the real kubelet.
#
#   hack/realk8s/node-up.sh [--node-name NAME] [--images DIR] [--kubelet-arg ARG]... DIR
#
# Needs hack/realk8s/build.sh 1.37 node (the binaries, runc among them) and, as root, the
# Debian packages containernetworking-plugins and iproute2. --images DIR: every *.tar there (docker archives,
# python -m hack.image build) is imported into containerd's k8s.io namespace before the
# kubelet starts; the sandbox image must be among them (registry.k8s.io/pause:local).
#
# Containment (DIR must not lie under /var, /opt or /run):
# - Network: everything runs in one network namespace made for it, with lo up, the node IP
#   (192.0.2.10, TEST-NET-1) on lo and no route out; Pods get a bridge (cni0, 10.88.0.0/24)
#   inside it. Nothing can send to an address outside that namespace. Run clients inside it:
#   `hack/realk8s/node-exec.sh DIR kubectl get nodes` (kubectl and KUBECONFIG are set there).
# - Files: a private mount namespace with a tmpfs on /run (so /var/run/cdi and containerd's
#   /run/containerd), overlays on /var and /opt whose upper layers are DIR/node/{var,opt}, and
#   /etc/hosts, /etc/resolv.conf bound to files in DIR. The kubelet keeps its default
#   /var/lib/kubelet, so the chart installs with its defaults.
# - Sysctls: protectKernelDefaults is on, and the three values it checks (kernel.panic 10,
#   kernel.panic_on_oops 1, vm.overcommit_memory 1) are files bound over /proc/sys inside the
#   mount namespace: the kubelet changes no host sysctl.
# - What does touch the host: cgroups. Each container's is /k8s.io/<container id> in every
#   cgroup v1 hierarchy (with cgroupsPerQOS off the kubelet names no parent, and containerd
#   defaults to its namespace); down.sh kills what is in them and removes them.
#
# Writes DIR/node.env (pids, node name, IP), DIR/chart-values.yaml (what the chart needs on this
# node: pullPolicy Never, the API server's address) and prints the node name when it is Ready.
# Stop everything with hack/realk8s/down.sh DIR.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
die() { echo "node-up.sh: $*" >&2; exit 1; }
# shellcheck source=lib.sh
. "$HERE/lib.sh"

NODE_NAME=dra-node
IMAGES=""
KUBELET_ARGS=()
DIR=""
while [ $# -gt 0 ]; do
    case "$1" in
        --node-name) NODE_NAME="${2:?--node-name needs a value}"; shift 2 ;;
        --images) IMAGES="${2:?--images needs a value}"; shift 2 ;;
        --kubelet-arg) KUBELET_ARGS+=("${2:?--kubelet-arg needs a value}"); shift 2 ;;
        -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
        -*) die "unknown option $1" ;;
        *) [ -z "$DIR" ] || die "only one DIR, got '$DIR' and '$1'"; DIR="$1"; shift ;;
    esac
done
[ -n "$DIR" ] || die "usage: node-up.sh [--node-name NAME] [--images DIR] DIR"
[ "$(id -u)" = 0 ] || die "must run as root (namespaces, mounts, containers)"
[[ "$NODE_NAME" =~ ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$ ]] || die "'$NODE_NAME' is not a valid node name"

BIN="$HERE/bin/1.37"
NBIN="$HERE/bin/node"
for b in "$BIN"/{etcd,kube-apiserver,kube-controller-manager,kube-scheduler,kubelet,kubectl} \
         "$NBIN"/{containerd,containerd-shim-runc-v2,ctr,runc}; do
    [ -x "$b" ] || die "$b is missing: run hack/realk8s/build.sh 1.37 node first"
done
# runc 1.5 from its Go module (build.sh node): Debian's 1.1.5 ignores linux.netDevices.
RUNC="$NBIN/runc"
[ -x /usr/lib/cni/bridge ] && [ -x /usr/lib/cni/host-local ] && [ -x /usr/lib/cni/loopback ] ||
    die "no CNI plugins in /usr/lib/cni: apt-get install containernetworking-plugins"
command -v ip >/dev/null || die "no ip command: apt-get install iproute2"
[ -z "$IMAGES" ] || [ -d "$IMAGES" ] || die "--images $IMAGES is not a directory"

mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)"
case "$DIR/" in
    /var/*|/opt/*|/run/*) die "DIR $DIR lies under /var, /opt or /run, which the node overlays; use another" ;;
esac
[ -z "$(ls -A "$DIR")" ] || die "$DIR is not empty; give an empty or new directory"

NODE_IP=192.0.2.10
N="$DIR/node"

# --- the namespaces: a holder process keeps them alive; everything else joins it ---------------
# unshare execs sleep in the new namespaces, so $! is a process inside them.
setsid unshare --net --mount --propagation private -- sleep infinity </dev/null >/dev/null 2>&1 &
HOLDER_PID=$!
inside() { nsenter --target "$HOLDER_PID" --net --mount -- "$@"; }
# For `spawn CMD &` alone: the background subshell becomes CMD, so that $! is CMD's pid.
spawn() { exec nsenter --target "$HOLDER_PID" --net --mount -- setsid "$@"; }
write_node_env() {
    cat >"$DIR/node.env" <<EOF
NODE_NAME=$NODE_NAME
NODE_IP=$NODE_IP
CONTAINERD_STATE=$N/ctrd/state
HOLDER_PID=$HOLDER_PID
CONTROLLER_MANAGER_PID=${CONTROLLER_MANAGER_PID:-}
SCHEDULER_PID=${SCHEDULER_PID:-}
CONTAINERD_PID=${CONTAINERD_PID:-}
KUBELET_PID=${KUBELET_PID:-}
CONTAINERD_SOCK=$N/ctrd/containerd.sock
EOF
}
fail() {
    if [ -f "$DIR/node.env" ]; then
        "$HERE/down.sh" "$DIR" >/dev/null 2>&1 || true
    else
        kill -KILL "$HOLDER_PID" 2>/dev/null || true
    fi
    die "$*"
}
for _ in $(seq 1 50); do
    [ "$(readlink "/proc/$HOLDER_PID/ns/net" 2>/dev/null)" != "$(readlink /proc/self/ns/net)" ] && break
    sleep 0.05
done
[ "$(readlink "/proc/$HOLDER_PID/ns/net" 2>/dev/null)" != "$(readlink /proc/self/ns/net)" ] ||
    fail "unshare did not make a network namespace"

# --- control plane: etcd and kube-apiserver first, as up.sh wants an empty DIR ------------------
t0=$(date +%s.%N)
inside ip link set lo up && inside ip addr add "$NODE_IP/32" dev lo || fail "cannot bring up lo in the node's namespace"
inside "$HERE/up.sh" --kubelet-client "$DIR" >/dev/null || fail "the control plane did not start"
mkdir -p "$N"/{var/upper,var/work,opt/upper,opt/work,sysctl,cni/net.d,ctrd,kubelet-pki,volume-plugins,logs}
write_node_env

printf '127.0.0.1 localhost\n%s %s\n' "$NODE_IP" "$NODE_NAME" >"$N/hosts"
# No resolver: a Pod's DNS query goes to loopback inside the namespace and nowhere else.
printf 'nameserver 127.0.0.1\noptions ndots:1 attempts:1 timeout:1\n' >"$N/resolv.conf"
echo 10 >"$N/sysctl/panic"; echo 1 >"$N/sysctl/panic_on_oops"; echo 1 >"$N/sysctl/overcommit_memory"
inside sh -euc '
    mount -t tmpfs -o mode=755 tmpfs /run
    mount -t overlay overlay -o "lowerdir=/var,upperdir=$2/var/upper,workdir=$2/var/work" /var
    mount -t overlay overlay -o "lowerdir=/opt,upperdir=$2/opt/upper,workdir=$2/opt/work" /opt
    mount --bind "$2/hosts" /etc/hosts
    mount --bind "$2/resolv.conf" /etc/resolv.conf
    mount --bind "$2/sysctl/panic" /proc/sys/kernel/panic
    mount --bind "$2/sysctl/panic_on_oops" /proc/sys/kernel/panic_on_oops
    mount --bind "$2/sysctl/overcommit_memory" /proc/sys/vm/overcommit_memory
    mkdir -p /var/run/cdi /var/lib/kubelet /var/log/pods /var/log/containers
' sh "$NODE_IP" "$N" 2>"$N/logs/setup.log" || fail "namespace set-up failed: $(head -c 300 "$N/logs/setup.log")"

# shellcheck disable=SC1091
. "$DIR/cluster.env"
PKI="$DIR/pki"
client_cert "$PKI" system:kube-controller-manager "" controller-manager &&
    write_kubeconfig "$SERVER" "$PKI" controller-manager "$DIR/controller-manager.kubeconfig" &&
    client_cert "$PKI" system:kube-scheduler "" scheduler &&
    write_kubeconfig "$SERVER" "$PKI" scheduler "$DIR/scheduler.kubeconfig" ||
    fail "openssl could not make the controller-manager's and scheduler's certificates"
"$HERE/node-kubeconfig.sh" "$DIR" "$NODE_NAME" >/dev/null || fail "no kubelet identity"

started() {  # started PID NAME LOG: fails the start when NAME exited
    ours "$1" "$2" || fail "$2 exited: $(grep -m1 -E 'E[0-9]{4} |F[0-9]{4} |level=(error|fatal)|Error:' "$3" | cut -c1-300) (log: $3)"
}

# The controllers a one-node DRA cluster needs: claims from templates and their clean-up, the
# DaemonSet, namespaces, service accounts and their tokens, the root CA config map projected
# tokens read, and the device-taint eviction controller (KEP-5055).
CONTROLLERS=resourceclaim-controller,garbage-collector-controller,daemonset-controller
CONTROLLERS+=,namespace-controller,serviceaccount-controller,serviceaccount-token-controller
CONTROLLERS+=,root-ca-certificate-publisher-controller,device-taint-eviction-controller
CONTROLLERS+=,taint-eviction-controller,pod-garbage-collector-controller,ttl-controller
# The node lifecycle controller lifts the not-ready taint the kubelet registers with.
CONTROLLERS+=,node-lifecycle-controller
spawn "$BIN/kube-controller-manager" \
    --kubeconfig="$DIR/controller-manager.kubeconfig" \
    --authentication-kubeconfig="$DIR/controller-manager.kubeconfig" \
    --authorization-kubeconfig="$DIR/controller-manager.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port=0 --leader-elect=false \
    --use-service-account-credentials=true \
    --service-account-private-key-file="$PKI/sa.key" --root-ca-file="$PKI/ca.crt" \
    --controllers="$CONTROLLERS" \
    </dev/null >"$N/logs/controller-manager.log" 2>&1 &
CONTROLLER_MANAGER_PID=$!
spawn "$BIN/kube-scheduler" \
    --kubeconfig="$DIR/scheduler.kubeconfig" \
    --authentication-kubeconfig="$DIR/scheduler.kubeconfig" \
    --authorization-kubeconfig="$DIR/scheduler.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port=0 --leader-elect=false \
    </dev/null >"$N/logs/scheduler.log" 2>&1 &
SCHEDULER_PID=$!
write_node_env

# --- containerd ----------------------------------------------------------------------------------
cat >"$N/ctrd/config.toml" <<EOF
version = 3
root = "$N/ctrd/root"
state = "$N/ctrd/state"
[grpc]
  address = "$N/ctrd/containerd.sock"
[ttrpc]
  address = "$N/ctrd/containerd.sock.ttrpc"
[plugins.'io.containerd.internal.v1.opt']
  path = "$N/ctrd/opt"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = "registry.k8s.io/pause:local"
[plugins.'io.containerd.cri.v1.runtime']
  # CDI is always on in containerd 2.x; the agent writes its specs here.
  cdi_spec_dirs = ["/var/run/cdi", "/etc/cdi"]
  # Root here lacks CAP_SYS_RESOURCE: a negative oom_score_adj fails every sandbox.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
  SystemdCgroup = false
  BinaryName = "$RUNC"
[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dirs = ["/usr/lib/cni"]
  conf_dir = "$N/cni/net.d"
[plugins.'io.containerd.nri.v1.nri']
  disable = true
EOF
cat >"$N/cni/net.d/10-dra-node.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "dra-node",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.88.0.0/24"}]],
              "dataDir": "$N/cni/ipam"}}
  ]
}
EOF
PATH="$NBIN:$PATH" spawn "$NBIN/containerd" --config "$N/ctrd/config.toml" \
    </dev/null >"$N/logs/containerd.log" 2>&1 &
CONTAINERD_PID=$!
write_node_env
CTR=("$NBIN/ctr" --address "$N/ctrd/containerd.sock" -n k8s.io)
for _ in $(seq 1 200); do
    inside "${CTR[@]}" version >/dev/null 2>&1 && break
    started "$CONTAINERD_PID" containerd "$N/logs/containerd.log"
    sleep 0.1
done
inside "${CTR[@]}" version >/dev/null 2>&1 || fail "containerd not serving after 20 s (log: $N/logs/containerd.log)"
if [ -n "$IMAGES" ]; then
    for img in "$IMAGES"/*.tar; do
        [ -e "$img" ] || continue
        inside "${CTR[@]}" images import --no-unpack=false "$img" >>"$N/logs/images.log" 2>&1 ||
            fail "ctr could not import $img (log: $N/logs/images.log)"
    done
fi
t_ctrd=$(date +%s.%N)

# --- the kubelet -------------------------------------------------------------------------------
cat >"$N/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This host: cgroup v1 (hybrid), no swap. cgroup v1 needs failCgroupV1: false, and validation
# wants cgroupsPerQOS: false together with enforceNodeAllocatable: [].
failCgroupV1: false
cgroupsPerQOS: false
enforceNodeAllocatable: []
cgroupDriver: cgroupfs
failSwapOn: false
# Refuses to start unless the three sysctls it would set already hold its values (bound over
# /proc/sys inside the mount namespace): it writes none.
protectKernelDefaults: true
address: $NODE_IP
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
containerRuntimeEndpoint: unix://$N/ctrd/containerd.sock
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization:
  mode: Webhook
podLogsDir: /var/log/pods
volumePluginDir: $N/volume-plugins
resolvConf: $N/resolv.conf
# No cluster DNS runs: Pods' resolv.conf names loopback, inside their own namespace.
clusterDNS: [127.0.0.1]
clusterDomain: cluster.local
# Imported images have nowhere to be pulled from again: never collect them; a small disk
# must not evict test Pods.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 50Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
serializeImagePulls: false
EOF
spawn "$BIN/kubelet" \
    --config="$N/kubelet.yaml" \
    --kubeconfig="$DIR/node-$NODE_NAME.kubeconfig" \
    --root-dir=/var/lib/kubelet --cert-dir="$N/kubelet-pki" \
    --hostname-override="$NODE_NAME" --node-ip="$NODE_IP" "${KUBELET_ARGS[@]}" \
    </dev/null >"$N/logs/kubelet.log" 2>&1 &
KUBELET_PID=$!
write_node_env
t_kubelet=$(date +%s.%N)

KUBECTL=("$BIN/kubectl" --kubeconfig "$DIR/admin.kubeconfig")
ready=""
for _ in $(seq 1 600); do
    if inside "${KUBECTL[@]}" get node "$NODE_NAME" \
            -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null | grep -qx True; then
        ready=1; break
    fi
    started "$KUBELET_PID" kubelet "$N/logs/kubelet.log"
    started "$CONTROLLER_MANAGER_PID" kube-controller-manager "$N/logs/controller-manager.log"
    started "$SCHEDULER_PID" kube-scheduler "$N/logs/scheduler.log"
    sleep 0.1
done
[ -n "$ready" ] || fail "node $NODE_NAME not Ready 60 s after the kubelet started (log: $N/logs/kubelet.log)"
t_ready=$(date +%s.%N)
# The controller-manager's service-account controller makes the default ServiceAccounts Pods
# need; a namespace is usable once it has one.
for _ in $(seq 1 300); do
    inside "${KUBECTL[@]}" -n default get serviceaccount default >/dev/null 2>&1 && break
    sleep 0.1
done
# What the chart needs on this node: images are imported, never pulled, and no kube-proxy turns
# the kubernetes Service into the API server, so the agent is told its address (it runs with
# hostNetwork, in this namespace).
cat >"$DIR/chart-values.yaml" <<EOF
# helm install ... -f $DIR/chart-values.yaml: the node-up.sh node's own values.
image:
  pullPolicy: Never
extraEnv:
  - {name: KUBERNETES_SERVICE_HOST, value: "127.0.0.1"}
  - {name: KUBERNETES_SERVICE_PORT, value: "$API_PORT"}
EOF
awk -v a="$t0" -v b="$t_ctrd" -v c="$t_kubelet" -v d="$t_ready" 'BEGIN {
    printf "node-up.sh: control plane and containerd %.1f s, node Ready %.1f s after the kubelet started\n", b - a, d - c }' >&2
echo "node-up.sh: $NODE_NAME Ready (state in $DIR; clients: hack/realk8s/node-exec.sh $DIR CMD...)" >&2
echo "$NODE_NAME"
