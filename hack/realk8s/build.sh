#!/usr/bin/env bash
# Builds the real kube-apiserver, etcd and kubectl of one Kubernetes minor from their published
# Go modules (hack/realk8s/v<minor>/go.mod pins every version; nothing is downloaded but modules).
#
#   hack/realk8s/build.sh [MINOR...|helm]     MINOR: 1.37 (default) or 1.35
#
# Every run also builds helm (hack/realk8s/helm/go.mod pins it) into hack/realk8s/bin/helm;
# `build.sh helm` builds only that.
#
# Output: hack/realk8s/bin/<minor>/{kube-apiserver,etcd,kubectl,allocate,kubelet-dra,peer-driver,
# peer-slices} (git-ignored); the last four are ours (tools/: the scheduler's allocator on JSON,
# the kubelet's DRA manager and plugin manager driven over stdin, and for the vs-upstream
# benchmark a Go driver on the upstream kubeletplugin helper and the upstream resourceslice
# controller alone). A build whose inputs (go.mod,
# go.sum, tools/, this script, the Go toolchain) are unchanged is a no-op. Prints how
# long it took; the last line of each minor is the bin directory.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
SUPPORTED="1.37 1.35"
TOOLS=github.com/dra-agent/dra-agent/hack/realk8s/tools
# peer-driver and peer-slices (the vs-upstream benchmark's Go programs) follow the current
# minor's helper and controller only.
PEER_MINOR=1.37

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
        { [ "$minor" != "$PEER_MINOR" ] || { [ -x "$out/peer-driver" ] && [ -x "$out/peer-slices" ]; }; }; then
        echo "build.sh: $minor ($version) is current, nothing to do (0 s)" >&2
        echo "$out"
        return
    fi

    local start tmp log
    local peer="" bins="kube-apiserver etcd kubectl allocate kubelet-dra"
    if [ "$minor" = "$PEER_MINOR" ]; then
        peer="$TOOLS/peer-driver $TOOLS/peer-slices"; bins="$bins peer-driver peer-slices"
    fi
    start=$(date +%s)
    tmp="$(mktemp -d "$HERE/bin/.build-$minor.XXXXXX")"
    log="$HERE/bin/build-$minor.log"
    echo "build.sh: building ${bins// /, } $version (a cold build takes about 10 min on 2 cores)" >&2
    # go.sum is committed: go verifies every module it downloads against it (-mod=readonly).
    if ! (cd "$mod" && go build -trimpath -ldflags "$(ldflags_for "$version")" -o "$tmp/" \
            go.etcd.io/etcd/server/v3 k8s.io/kubernetes/cmd/kube-apiserver \
            k8s.io/kubernetes/cmd/kubectl "$TOOLS/allocate" "$TOOLS/kubelet-dra" \
            $peer) >"$log" 2>&1; then
        rm -rf "$tmp"
        # One line: the module that could not be had, else go's first error.
        local what
        what="$(grep -oE '[A-Za-z0-9._~-]+(/[A-Za-z0-9._~+-]+)+@v[0-9][A-Za-z0-9.+-]*' "$log" | head -1 || true)"
        # Some failures (GOPROXY=off) name no module; the last download go started is it.
        [ -n "$what" ] || what="$(awk '$1 == "go:" && $2 == "downloading" {m = $3 "@" $4} END {print m}' "$log")"
        if [ -n "$what" ] && grep -qiE 'proxy|dial|lookup|GOPROXY|no such host|timeout|connection' "$log"; then
            die "cannot download module $what for $minor ($(go env GOPROXY)); full log: $log"
        fi
        die "go build for $minor failed: $(grep -m1 -vE '^go: downloading' "$log" || echo 'no output'); full log: $log"
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
        local what
        what="$(grep -oE '[A-Za-z0-9._~-]+(/[A-Za-z0-9._~+-]+)+@v[0-9][A-Za-z0-9.+-]*' "$log" | head -1 || true)"
        if [ -n "$what" ] && grep -qiE 'proxy|dial|lookup|GOPROXY|no such host|timeout|connection' "$log"; then
            die "cannot download module $what for helm ($(go env GOPROXY)); full log: $log"
        fi
        die "go build for helm failed: $(grep -m1 -vE '^go: downloading' "$log" || echo 'no output'); full log: $log"
    fi
    mv -f "$tmp/helm" "$out"
    rmdir "$tmp"
    echo "$stamp" >"$HERE/bin/.helm.stamp"
    echo "build.sh: helm ($version) built in $(( $(date +%s) - start )) s" >&2
    [ "$print" = 0 ] || echo "$out"
}

mkdir -p "$HERE/bin"
[ $# -gt 0 ] || set -- 1.37
only_helm=1
for minor in "$@"; do
    [ "$minor" = helm ] && continue
    only_helm=0
    build_one "$minor"
done
build_helm "$only_helm"
