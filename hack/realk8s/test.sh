#!/usr/bin/env bash
# The real-Kubernetes suite: builds kube-apiserver, etcd and kubectl for each minor (a no-op
# when current), then runs tests/realk8s against them.
#
#   hack/realk8s/test.sh [MINOR...] [-- PYTEST_ARGS...]     MINOR: 1.37 (default), 1.35
#
# Uses the repository's .venv (the README's set-up command makes it).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || { echo "test.sh: no $PY; run the README's test set-up command first" >&2; exit 1; }

minors=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do minors+=("$1"); shift; done
[ "${1:-}" != "--" ] || shift
[ ${#minors[@]} -gt 0 ] || minors=(1.37)

"$ROOT/hack/realk8s/build.sh" "${minors[@]}" >/dev/null
status=0
for minor in "${minors[@]}"; do
    echo "test.sh: tests/realk8s against Kubernetes $minor" >&2
    start=$(date +%s)
    (cd "$ROOT" && REALK8S_VERSION="$minor" "$PY" -m pytest -m realk8s tests/realk8s "$@") || status=$?
    echo "test.sh: Kubernetes $minor done in $(( $(date +%s) - start )) s (exit $status)" >&2
    [ "$status" -eq 0 ] || break
done
exit "$status"
