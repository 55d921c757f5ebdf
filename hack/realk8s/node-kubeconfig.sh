#!/usr/bin/env bash
# Writes DIR/node-NODE.kubeconfig: a client certificate for system:node:NODE in system:nodes,
# the kubelet's own identity, which the Node authorizer and NodeRestriction limit to NODE.
#
#   hack/realk8s/node-kubeconfig.sh DIR NODE
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
die() { echo "node-kubeconfig.sh: $*" >&2; exit 1; }
# shellcheck source=lib.sh
. "$HERE/lib.sh"

[ $# -eq 2 ] || die "usage: node-kubeconfig.sh DIR NODE"
DIR="$1" NODE="$2"
[[ "$NODE" =~ ^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$ ]] && [ ${#NODE} -le 253 ] ||
    die "'$NODE' is not a valid node name (a lowercase DNS subdomain)"
[ -f "$DIR/cluster.env" ] && [ -f "$DIR/pki/ca.key" ] ||
    die "$DIR is not a cluster made by hack/realk8s/up.sh (no cluster.env or pki/ca.key)"
# shellcheck disable=SC1091
SERVER="$(. "$DIR/cluster.env" && echo "$SERVER")"
client_cert "$DIR/pki" "system:node:$NODE" system:nodes "node-$NODE" ||
    die "openssl could not sign the certificate for system:node:$NODE"
write_kubeconfig "$SERVER" "$DIR/pki" "node-$NODE" "$DIR/node-$NODE.kubeconfig"
echo "$DIR/node-$NODE.kubeconfig"
