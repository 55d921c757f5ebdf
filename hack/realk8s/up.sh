#!/usr/bin/env bash
# Starts a real etcd + kube-apiserver on loopback, all state under DIR.
#
#   hack/realk8s/up.sh [--version 1.37|1.35] [--port N] [--resource-versions v1,v1beta2,v1beta1]
#                      [--feature-gates G=true,...] [--audit] [--kubelet-client] DIR
#
# TLS everywhere, --authorization-mode=Node,RBAC, NodeRestriction, a service-account issuer with
# its keys. resource.k8s.io is served at every version in --resource-versions (default all three;
# upstream serves only v1 by default). Ports are free ones unless --port names the API server's.
# Waits for /readyz, then writes DIR/admin.kubeconfig (system:masters) and DIR/cluster.env
# (ports, pids, version) and prints the server URL. Stop with hack/realk8s/down.sh DIR.
# --audit: every request but the server's own, at level Metadata (who, verb, resource, when),
# one JSON event per line in DIR/audit.log, written before the response (blocking mode): what
# the vs-upstream benchmark counts a publisher's requests by.
# --kubelet-client: the server dials kubelets (logs, exec, port-forward) by their InternalIP with
# a client certificate of its own (system:masters, which the kubelet's webhook authorizer
# allows), never by Hostname (a DNS query): what a whole node needs (node-up.sh).
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
die() { echo "up.sh: $*" >&2; exit 1; }
# shellcheck source=lib.sh
. "$HERE/lib.sh"

MINOR=1.37
PORT=""
RESOURCE_VERSIONS="v1,v1beta2,v1beta1"
FEATURE_GATES=""
AUDIT=""
KUBELET_CLIENT=""
DIR=""
while [ $# -gt 0 ]; do
    case "$1" in
        --version) MINOR="${2:?--version needs a value}"; shift 2 ;;
        --version=*) MINOR="${1#*=}"; shift ;;
        --port) PORT="${2:?--port needs a value}"; shift 2 ;;
        --port=*) PORT="${1#*=}"; shift ;;
        --resource-versions) RESOURCE_VERSIONS="${2:?--resource-versions needs a value}"; shift 2 ;;
        --resource-versions=*) RESOURCE_VERSIONS="${1#*=}"; shift ;;
        --feature-gates) FEATURE_GATES="${2:?--feature-gates needs a value}"; shift 2 ;;
        --feature-gates=*) FEATURE_GATES="${1#*=}"; shift ;;
        --audit) AUDIT=1; shift ;;
        --kubelet-client) KUBELET_CLIENT=1; shift ;;
        -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
        -*) die "unknown option $1" ;;
        *) [ -z "$DIR" ] || die "only one DIR, got '$DIR' and '$1'"; DIR="$1"; shift ;;
    esac
done
[ -n "$DIR" ] || die "usage: up.sh [--version 1.37|1.35] [--port N] DIR"

BIN="$HERE/bin/$MINOR"
[ -d "$HERE/v$MINOR" ] || die "unknown Kubernetes minor '$MINOR' (supported: 1.37, 1.35)"
for b in etcd kube-apiserver; do
    [ -x "$BIN/$b" ] || die "$BIN/$b is missing: run hack/realk8s/build.sh $MINOR first"
done
command -v openssl >/dev/null || die "openssl is needed for the cluster's certificates"

mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)"
if [ -f "$DIR/cluster.env" ]; then
    # shellcheck disable=SC1091
    pid="$(. "$DIR/cluster.env" && echo "${APISERVER_PID:-}")"
    if ours "$pid" kube-apiserver; then
        die "a cluster is already running in $DIR (kube-apiserver pid $pid); stop it with hack/realk8s/down.sh $DIR"
    fi
    die "$DIR holds a stopped cluster's state (cluster.env, etcd data); remove it or use an empty DIR"
fi
if [ -n "$(ls -A "$DIR")" ]; then
    die "$DIR is not empty; give an empty or new directory"
fi

# --- ports: free ones, or the one asked for (refused at once when taken) -----------------------
port_free() {
    python3 -c 'import socket,sys
s=socket.socket()
try: s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError: sys.exit(1)' "$1"
}
free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
if [ -n "$PORT" ]; then
    [[ "$PORT" =~ ^[0-9]+$ ]] && [ "$PORT" -ge 1 ] && [ "$PORT" -le 65535 ] || die "--port '$PORT' is not a port number"
    port_free "$PORT" || die "port $PORT on 127.0.0.1 is in use; pick another --port or leave it out"
    API_PORT="$PORT"
else
    API_PORT="$(free_port)"
fi
ETCD_PORT="$(free_port)"
PEER_PORT="$(free_port)"

# --- certificates: CA, serving, admin; service-account keys ------------------------------------
PKI="$DIR/pki"
mkdir -p "$PKI"
(
    cd "$PKI"
    ec() { openssl ecparam -name prime256v1 -genkey -noout -out "$1" 2>/dev/null; }
    ec ca.key
    openssl req -x509 -new -key ca.key -subj /CN=dra-agent-test-ca -days 7 -out ca.crt 2>/dev/null
    ec apiserver.key
    openssl req -new -key apiserver.key -subj /CN=kube-apiserver -out apiserver.csr 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc\nextendedKeyUsage=serverAuth\n' >apiserver.ext
    openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 7 \
        -extfile apiserver.ext -out apiserver.crt 2>/dev/null
    client_cert . dra-agent-test-admin system:masters admin
    [ -z "$KUBELET_CLIENT" ] || client_cert . kube-apiserver-kubelet-client system:masters kubelet-client
    ec sa.key
    openssl ec -in sa.key -pubout -out sa.pub 2>/dev/null
    rm -f ./*.csr
) || die "openssl could not make the certificates in $PKI"

# --- etcd ----------------------------------------------------------------------------------------
setsid "$BIN/etcd" --name default --data-dir "$DIR/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$PEER_PORT" \
    --initial-cluster "default=http://127.0.0.1:$PEER_PORT" --unsafe-no-fsync --log-level warn \
    </dev/null >"$DIR/etcd.log" 2>&1 &
ETCD_PID=$!
write_env() {
    cat >"$DIR/cluster.env" <<EOF
VERSION=$MINOR
GIT_VERSION=$("$BIN/kube-apiserver" --version 2>/dev/null | awk '{print $2}')
API_PORT=$API_PORT
ETCD_PORT=$ETCD_PORT
PEER_PORT=$PEER_PORT
ETCD_PID=$ETCD_PID
APISERVER_PID=${APISERVER_PID:-}
SERVER=https://127.0.0.1:$API_PORT
RESOURCE_VERSIONS=$RESOURCE_VERSIONS
EOF
}
write_env

fail() {
    # Leave nothing running behind a failed start; the DIR stays for the logs.
    "$HERE/down.sh" "$DIR" >/dev/null 2>&1 || true
    die "$*"
}
log_reason() {  # the first telling line of a log, for a one-line failure message
    grep -m1 -E 'address already in use|bind:|Error:|error:|"level":"fatal"|F[0-9]{4} ' "$1" | cut -c1-240 || tail -n1 "$1"
}

for _ in $(seq 1 200); do
    curl -fsS "http://127.0.0.1:$ETCD_PORT/health" >/dev/null 2>&1 && break
    ours "$ETCD_PID" etcd || fail "etcd exited: $(log_reason "$DIR/etcd.log") (log: $DIR/etcd.log)"
    sleep 0.1
done
curl -fsS "http://127.0.0.1:$ETCD_PORT/health" >/dev/null 2>&1 || fail "etcd not healthy after 20 s (log: $DIR/etcd.log)"

# --- kube-apiserver ------------------------------------------------------------------------------
RUNTIME_CONFIG=""
for v in v1 v1beta2 v1beta1; do
    case ",$RESOURCE_VERSIONS," in
        *",$v,"*) RUNTIME_CONFIG+="resource.k8s.io/$v=true," ;;
        *) RUNTIME_CONFIG+="resource.k8s.io/$v=false," ;;
    esac
done
for v in ${RESOURCE_VERSIONS//,/ }; do
    case "$v" in v1|v1beta2|v1beta1) ;; *) fail "--resource-versions: unknown version '$v' (v1, v1beta2, v1beta1)" ;; esac
done
EXTRA=()
if [ -n "$KUBELET_CLIENT" ]; then
    EXTRA+=("--kubelet-client-certificate=$PKI/kubelet-client.crt" "--kubelet-client-key=$PKI/kubelet-client.key"
            "--kubelet-preferred-address-types=InternalIP")
fi
[ -z "$FEATURE_GATES" ] || EXTRA+=("--feature-gates=$FEATURE_GATES")
if [ -n "$AUDIT" ]; then
    cat >"$DIR/audit-policy.yaml" <<'POLICY'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: None
  users: ["system:apiserver"]
- level: Metadata
POLICY
    EXTRA+=("--audit-policy-file=$DIR/audit-policy.yaml" "--audit-log-path=$DIR/audit.log"
            "--audit-log-mode=blocking" "--audit-log-format=json")
fi

setsid "$BIN/kube-apiserver" \
    --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
    --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$API_PORT" \
    --endpoint-reconciler-type=none \
    --allow-privileged=true \
    --cert-dir="$DIR/apiserver-certs" \
    --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
    --client-ca-file="$PKI/ca.crt" \
    --service-account-issuer=https://kubernetes.default.svc \
    --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
    --service-cluster-ip-range=10.0.0.0/24 \
    --authorization-mode=Node,RBAC \
    --enable-admission-plugins=NodeRestriction \
    --runtime-config="${RUNTIME_CONFIG%,}" \
    --enable-priority-and-fairness=false \
    --profiling=false \
    "${EXTRA[@]}" \
    </dev/null >"$DIR/apiserver.log" 2>&1 &
APISERVER_PID=$!
write_env

CURL=(curl -fsS --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key")
READYZ="/readyz"
# kube-apiserver's own informers list resource.k8s.io/v1 ResourceSlices, so with v1 switched
# off its informer-sync check never passes although every API works: that check alone is left
# out then (only to test clients' fallback to v1beta2/v1beta1; no real cluster runs so).
case ",$RESOURCE_VERSIONS," in *",v1,"*) ;; *) READYZ="/readyz?exclude=informer-sync" ;; esac
ready=""
for _ in $(seq 1 600); do
    if "${CURL[@]}" "https://127.0.0.1:$API_PORT$READYZ" >/dev/null 2>&1; then ready=1; break; fi
    ours "$APISERVER_PID" kube-apiserver ||
        fail "kube-apiserver exited: $(log_reason "$DIR/apiserver.log") (log: $DIR/apiserver.log)"
    sleep 0.1
done
[ -n "$ready" ] || fail "kube-apiserver not ready after 60 s (log: $DIR/apiserver.log)"

write_kubeconfig "https://127.0.0.1:$API_PORT" "$PKI" admin "$DIR/admin.kubeconfig"
echo "up.sh: kube-apiserver $(. "$DIR/cluster.env" && echo "$GIT_VERSION") ready at https://127.0.0.1:$API_PORT (state in $DIR)" >&2
echo "https://127.0.0.1:$API_PORT"
