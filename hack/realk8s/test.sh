#!/usr/bin/env bash
# The real-Kubernetes suite: builds kube-apiserver, etcd and kubectl for each minor (a no-op
# when current), then runs tests/realk8s against them, and the fake API server's own tests
# (tests/apiserver) against the real server too.
#
#   hack/realk8s/test.sh [MINOR...] [-- PYTEST_ARGS...]     MINOR: 1.37 (default), 1.35
#
# Uses the repository's .venv (the README's set-up command makes it).
set -euo pipefail
export PATH="/usr/local/go/bin:$PATH"  # the machine's Go (>= 1.26), not Debian's golang-go
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || { echo "test.sh: no $PY; run the README's test set-up command first" >&2; exit 1; }

minors=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do minors+=("$1"); shift; done
[ "${1:-}" != "--" ] || shift
[ ${#minors[@]} -gt 0 ] || minors=(1.37)

"$ROOT/hack/realk8s/build.sh" "${minors[@]}" >/dev/null
status=0
failed=()
for minor in "${minors[@]}"; do
    status=0
    echo "test.sh: tests/realk8s against Kubernetes $minor" >&2
    start=$(date +%s)
    (cd "$ROOT" && REALK8S_VERSION="$minor" "$PY" -m pytest -m realk8s tests/realk8s "$@") || status=$?
    if [ "$status" -eq 0 ] && [ $# -eq 0 ]; then
        echo "test.sh: the fake API server's tests against the real Kubernetes $minor" >&2
        (cd "$ROOT" && FAKE_APISERVER_TESTS_AGAINST=real REALK8S_VERSION="$minor" \
            "$PY" -m pytest tests/apiserver) || status=$?
    fi
    echo "test.sh: Kubernetes $minor done in $(( $(date +%s) - start )) s (exit $status)" >&2
    [ "$status" -eq 0 ] || failed+=("$minor")
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "test.sh: failed against Kubernetes ${failed[*]}" >&2
    exit 1
fi
