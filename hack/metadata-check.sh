#!/usr/bin/env bash
# metadata-check.sh - read device metadata files (KEP-5304) with the upstream consumer library,
# k8s.io/dynamic-resource-allocation v0.37.2 (Kubernetes 1.37), through our own small program
# in metadata-check/main.go next to this script.
#
# Usage:
#   metadata-check.sh FILE...   decode each file as a workload would (devicemetadata), check
#                               that the kubelet plugin helper's encoder writes the very same
#                               bytes for it, print the decoded v1beta1 object (one JSON line)
#   metadata-check.sh setup     build only; prints the binary's path
#
# Exit codes: 0 ok, 1 a file failed, 2 usage error, 3 setup failure (no Go >= 1.26, or a
# module that cannot be downloaded). Modules come from the module cache, else the Go module
# proxy; go.sum pins every one (-mod=readonly), so CI's clean clone builds the same program.
#
# The binary goes to ${METADATA_CHECK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/metadata-check}
# and is rebuilt only when main.go, go.mod, go.sum or the Go version change.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SRC_DIR="$SCRIPT_DIR/metadata-check"
CACHE_DIR="${METADATA_CHECK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/metadata-check}"
BIN="$CACHE_DIR/bin/metadata-check"
STAMP="$CACHE_DIR/bin/metadata-check.stamp"

die() { printf 'metadata-check.sh: %s\n' "$*" >&2; exit 3; }

# shellcheck source=lib/go.sh
. "$SCRIPT_DIR/lib/go.sh"

build() {
    local go stamp tmp
    go="$(go_bin)"
    stamp="$(cat "$SRC_DIR/main.go" "$SRC_DIR/go.mod" "$SRC_DIR/go.sum" | sha256sum | cut -d' ' -f1) $("$go" version)"
    if [ -x "$BIN" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$stamp" ]; then
        return 0
    fi
    mkdir -p "$CACHE_DIR/bin"
    tmp="$(mktemp "$CACHE_DIR/bin/.metadata-check.XXXXXX")"
    # go.sum pins what it may use; a clean machine downloads it once (about 30 s).
    if ! (cd "$SRC_DIR" && env -u GOFLAGS GOTOOLCHAIN=local \
        CGO_ENABLED=0 "$go" build -mod=readonly -o "$tmp" . >&2); then
        rm -f "$tmp"
        die "build failed (k8s.io/dynamic-resource-allocation v0.37.2 and its modules: cached or from $("$go" env GOPROXY))"
    fi
    mv -f "$tmp" "$BIN"
    printf '%s\n' "$stamp" > "$STAMP"
}

main() {
    if [ "$#" -eq 0 ] || [ "$1" = "-h" ] || [ "$1" = "--help" ]; then
        sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"
        [ "$#" -eq 0 ] && exit 2
        exit 0
    fi
    mkdir -p "$CACHE_DIR"
    exec 9>"$CACHE_DIR/.lock"
    flock 9
    build
    exec 9>&-
    if [ "$1" = "setup" ]; then
        echo "$BIN"
        exit 0
    fi
    exec "$BIN" "$@"
}

main "$@"
