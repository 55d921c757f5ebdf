#!/usr/bin/env bash
# Builds the real kube-apiserver, etcd and kubectl of one Kubernetes minor from their published
# Go modules (hack/realk8s/v<minor>/go.mod pins every version; nothing is downloaded but modules).
#
#   hack/realk8s/build.sh [MINOR...|node|helm]     MINOR: 1.37 (default) or 1.35
#
# Every run also builds helm (hack/realk8s/helm/go.mod pins it) into hack/realk8s/bin/helm;
# `build.sh helm` builds only that. `node` builds containerd 2.x, its runc shim and ctr
# (containerd/go.mod pins them) into hack/realk8s/bin/node: the whole node's runtime.
#
# Output: hack/realk8s/bin/<minor>/{kube-apiserver,etcd,kubectl,allocate,kubelet-dra,peer-driver,
# peer-slices} (git-ignored); the last four are ours (tools/: the scheduler's allocator on JSON,
# the kubelet's DRA manager and plugin manager driven over stdin, and for the vs-upstream
# benchmark a Go driver on the upstream kubeletplugin helper and the upstream resourceslice
# controller alone); for 1.37 also kube-scheduler, kube-controller-manager and the kubelet (the
# whole node of tests/cluster). A build whose inputs (go.mod,
# go.sum, tools/, this script, the Go toolchain) are unchanged is a no-op. Prints how
# long it took; the last line of each minor is the bin directory.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
SUPPORTED="1.37 1.35"
TOOLS=github.com/dra-agent/dra-agent/hack/realk8s/tools
# peer-driver and peer-slices (the vs-upstream benchmark's Go programs) follow the current
# minor's helper and controller only.
PEER_MINOR=1.37
# The rest of a node (tests/cluster: the scheduler, the controller-manager, the real kubelet)
# is built for the current minor only; one `go build` shares their packages with the server's.
NODE_MINOR=1.37
NODE_BINS="kube-scheduler kube-controller-manager kubelet podresources"

die() { echo "build.sh: $*" >&2; exit 1; }

command -v go >/dev/null || die "no go command on PATH (the real Kubernetes bench needs Go >= 1.26)"

# The binaries report the release they were built from (kubectl version, /version), as
# upstream's hack/lib/version.sh stamps them; feature gates follow the module's own version.
ldflags_for() {
    local version="$1" minor major
    major="${version#v}"; major="${major%%.*}"
    minor="$(echo "$version" | cut -d. -f2)"
    local x="" pkg
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        x+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
        x+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
    done
    echo "-s -w$x"
}

# build_failed WHAT LOG: one line, the module that could not be had, else go's first error.
build_failed() {
    local name="$1" log="$2" what
    what="$(grep -oE '[A-Za-z0-9._~-]+(/[A-Za-z0-9._~+-]+)+@v[0-9][A-Za-z0-9.+-]*' "$log" | head -1 || true)"
    # Some failures (GOPROXY=off) name no module; the last download go started is it.
    [ -n "$what" ] || what="$(awk '$1 == "go:" && $2 == "downloading" {m = $3 "@" $4} END {print m}' "$log")"
    if [ -n "$what" ] && grep -qiE 'proxy|dial|lookup|GOPROXY|no such host|timeout|connection' "$log"; then
        die "cannot download module $what for $name ($(go env GOPROXY)); full log: $log"
    fi
    die "go build for $name failed: $(grep -m1 -vE '^go: downloading' "$log" || echo 'no output'); full log: $log"
}

all_executable() {
    local dir="$1" b; shift
    for b in "$@"; do [ -x "$dir/$b" ] || return 1; done
}

build_one() {
    local minor="$1"
    local mod="$HERE/v$minor" out="$HERE/bin/$minor"
    [ -f "$mod/go.mod" ] || die "unknown Kubernetes minor '$minor' (supported: $SUPPORTED)"
    local version
    version="$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ {print $2; exit}' "$mod/go.mod")"
    [ -n "$version" ] || die "$mod/go.mod does not require k8s.io/kubernetes"

    local stamp
    stamp="$( (cat "$mod/go.mod" "$mod/go.sum" "$0"; find "$HERE/tools" -type f \( -name '*.go' -o -name go.mod \) | sort | xargs cat; go version) | sha256sum | cut -c1-16)"
    if [ -f "$out/.stamp" ] && [ "$(cat "$out/.stamp")" = "$stamp" ] &&
        [ -x "$out/kube-apiserver" ] && [ -x "$out/etcd" ] && [ -x "$out/kubectl" ] &&
        [ -x "$out/allocate" ] && [ -x "$out/kubelet-dra" ] &&
        { [ "$minor" != "$PEER_MINOR" ] || { [ -x "$out/peer-driver" ] && [ -x "$out/peer-slices" ]; }; } &&
        { [ "$minor" != "$NODE_MINOR" ] || all_executable "$out" $NODE_BINS; }; then
        echo "build.sh: $minor ($version) is current, nothing to do (0 s)" >&2
        echo "$out"
        return
    fi

    local start tmp log
    local peer="" bins="kube-apiserver etcd kubectl allocate kubelet-dra"
    if [ "$minor" = "$PEER_MINOR" ]; then
        peer="$TOOLS/peer-driver $TOOLS/peer-slices"; bins="$bins peer-driver peer-slices"
    fi
    local node=""
    if [ "$minor" = "$NODE_MINOR" ]; then
        for b in kube-scheduler kube-controller-manager kubelet; do node+=" k8s.io/kubernetes/cmd/$b"; done
        node+=" $TOOLS/podresources"
        bins="$bins $NODE_BINS"
    fi
    start=$(date +%s)
    tmp="$(mktemp -d "$HERE/bin/.build-$minor.XXXXXX")"
    log="$HERE/bin/build-$minor.log"
    echo "build.sh: building ${bins// /, } $version (a cold build takes about 10 min on 2 cores)" >&2
    # go.sum is committed: go verifies every module it downloads against it (-mod=readonly).
    if ! (cd "$mod" && go build -trimpath -ldflags "$(ldflags_for "$version")" -o "$tmp/" \
            go.etcd.io/etcd/server/v3 k8s.io/kubernetes/cmd/kube-apiserver \
            k8s.io/kubernetes/cmd/kubectl "$TOOLS/allocate" "$TOOLS/kubelet-dra" \
            $peer $node) >"$log" 2>&1; then
        rm -rf "$tmp"
        build_failed "$minor" "$log"
    fi
    # The etcd main package is go.etcd.io/etcd/server/v3, so go names its binary "server".
    mv "$tmp/server" "$tmp/etcd"
    mkdir -p "$out"
    for b in $bins; do mv -f "$tmp/$b" "$out/$b"; done
    rmdir "$tmp"
    echo "$stamp" >"$out/.stamp"
    echo "build.sh: $minor ($version) built in $(( $(date +%s) - start )) s, $(du -sh "$out" | cut -f1) in $out" >&2
    echo "$out"
}

# helm from its own module: it pins its own k8s.io versions, which need not be ../v1.37's.
# Prints bin/helm's path only when asked for helm alone, so that `build.sh MINOR`'s stdout
# stays the one bin directory.
build_helm() {
    local print="$1" mod="$HERE/helm" out="$HERE/bin/helm"
    local version
    version="$(awk '{for (i = 1; i < NF; i++) if ($i == "helm.sh/helm/v4" && $(i+1) ~ /^v/) {print $(i+1); exit}}' "$mod/go.mod")"
    [ -n "$version" ] || die "$mod/go.mod does not require helm.sh/helm/v4"
    local stamp
    stamp="$( (cat "$mod/go.mod" "$mod/go.sum" "$0"; go version) | sha256sum | cut -c1-16)"
    if [ -x "$out" ] && [ -f "$HERE/bin/.helm.stamp" ] && [ "$(cat "$HERE/bin/.helm.stamp")" = "$stamp" ]; then
        echo "build.sh: helm ($version) is current, nothing to do (0 s)" >&2
        [ "$print" = 0 ] || echo "$out"
        return
    fi
    local start tmp log
    start=$(date +%s)
    tmp="$(mktemp -d "$HERE/bin/.build-helm.XXXXXX")"
    log="$HERE/bin/build-helm.log"
    echo "build.sh: building helm $version (a cold build takes about 10 min on 2 busy cores)" >&2
    # `helm version` reports the release, as upstream's Makefile stamps it.
    if ! (cd "$mod" && go build -trimpath \
            -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$version -X helm.sh/helm/v4/internal/version.gitTreeState=clean" \
            -o "$tmp/helm" helm.sh/helm/v4/cmd/helm) >"$log" 2>&1; then
        rm -rf "$tmp"
        build_failed helm "$log"
    fi
    mv -f "$tmp/helm" "$out"
    rmdir "$tmp"
    echo "$stamp" >"$HERE/bin/.helm.stamp"
    echo "build.sh: helm ($version) built in $(( $(date +%s) - start )) s" >&2
    [ "$print" = 0 ] || echo "$out"
}

# containerd 2.x, its runc shim and ctr from their own module (containerd/go.mod), and runc
# from its own (runc/go.mod): the whole node's runtime (tests/cluster). Debian 12's containerd
# is 1.6, which predates CDI; 2.x's CRI plugin applies the CDI devices the kubelet names
# (ContainerConfig.CDIDevices). Debian's runc 1.1.5 predates OCI linux.netDevices (CDI
# netDevices), which runc 1.4+ implements. containerd is pure Go (CGO_ENABLED=0, without the
# snapshotters this node does not use); runc needs cgo and libseccomp-dev. The CNI plugins are
# Debian's (containernetworking-plugins): nothing of them is version-specific here.
build_containerd() {
    local mod="$HERE/containerd" runc_mod="$HERE/runc" out="$HERE/bin/node"
    local version
    version="$(awk '$1 == "github.com/containerd/containerd/v2" && $2 ~ /^v/ {print $2; exit}' "$mod/go.mod")"
    [ -n "$version" ] || die "$mod/go.mod does not require github.com/containerd/containerd/v2"
    local stamp bins="containerd containerd-shim-runc-v2 ctr"
    stamp="$( (cat "$mod/go.mod" "$mod/go.sum" "$runc_mod/go.mod" "$runc_mod/go.sum" "$0"; go version) | sha256sum | cut -c1-16)"
    if all_executable "$out" $bins runc && [ -f "$out/.stamp" ] && [ "$(cat "$out/.stamp")" = "$stamp" ]; then
        echo "build.sh: containerd ($version) is current, nothing to do (0 s)" >&2
        echo "$out"
        return
    fi
    local start tmp log pkgs="" b
    for b in $bins; do pkgs+=" github.com/containerd/containerd/v2/cmd/$b"; done
    start=$(date +%s)
    tmp="$(mktemp -d "$HERE/bin/.build-node.XXXXXX")"
    log="$HERE/bin/build-node.log"
    echo "build.sh: building ${bins// /, } $version and runc (a cold build takes about 4 min on 2 cores)" >&2
    # containerd's own Makefile stamps its version package the same way.
    if ! (cd "$mod" && CGO_ENABLED=0 go build -trimpath -tags "no_btrfs no_devmapper no_zfs" \
            -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$version" \
            -o "$tmp/" $pkgs) >"$log" 2>&1; then
        rm -rf "$tmp"
        build_failed containerd "$log"
    fi
    if ! (cd "$runc_mod" && CGO_ENABLED=1 go build -trimpath -tags seccomp -ldflags "-s -w" \
            -o "$tmp/runc" github.com/opencontainers/runc) >>"$log" 2>&1; then
        rm -rf "$tmp"
        build_failed runc "$log"
    fi
    mkdir -p "$out"
    for b in $bins runc; do mv -f "$tmp/$b" "$out/$b"; done
    rmdir "$tmp"
    echo "$stamp" >"$out/.stamp"
    echo "build.sh: containerd ($version) built in $(( $(date +%s) - start )) s" >&2
    echo "$out"
}

mkdir -p "$HERE/bin"
[ $# -gt 0 ] || set -- 1.37
only_helm=1
for minor in "$@"; do
    [ "$minor" = helm ] && continue
    only_helm=0
    if [ "$minor" = node ]; then build_containerd; continue; fi
    build_one "$minor"
done
build_helm "$only_helm"
