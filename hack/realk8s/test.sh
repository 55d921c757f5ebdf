#!/usr/bin/env bash
# The real-Kubernetes suite: builds kube-apiserver, etcd and kubectl for each minor (a no-op
# when current), then runs tests/realk8s against them, and the fake API server's own tests
# (tests/apiserver) against the real server too.
#
#   hack/realk8s/test.sh [MINOR...] [-- PYTEST_ARGS...]     MINOR: 1.37 (default), 1.35
#
# The first MINOR named gets the whole suite: all of tests/realk8s (-m realk8s), then all of
# tests/apiserver against it. Every later MINOR gets only the tests whose answer depends on
# the minor, those marked `versioned` (-m 'realk8s and versioned', then -m versioned; 39 of
# the 143 tests of tests/realk8s and 7 of the 89 of tests/apiserver at this writing): the
# allocator and explain's model of it (test_explain_differential, test_partitions, one of
# test_allocator), what each minor's default gates drop or refuse (test_slice_validation,
# test_sharing, test_kubelet_extended, test_list_attributes), the kubelet's DRA manager where
# its releases differ (registration retries, CDI IDs after a restart, the health service),
# granular status authorization, resource.k8s.io's older versions (test_versions), device
# metadata, each minor's schema, validation and CEL for deploy/ and the chart, and the fake
# API server's tests that ask the server its minor (tests/apiserver/conftest.py marks those).
#
# Cut for the later minors (1.35 in CI): the tests that assert one answer for every minor
# over what the minors do alike: the agent's credentials against RBAC, the Node authorizer
# and the admission policy, the slice controller's generation and retry rules, the kubeconfig
# corpus through kubectl, kill -9 at every failpoint under the kubelet, the kubelet paths both
# releases take alike (reservedFor, shared and template claims, admin access, firstAvailable,
# a rolling update, its 30 s wipe), helm install and uninstall, kustomize, the scripts here,
# and the fake API server's other tests. Nothing is lost: such a test has no branch on the
# minor and expects the same answer from both, so the first minor's pass (the current
# release) answers for it; whatever 1.35 does differently is a branch, a per-minor table or
# a gate in a test, and such a test is `versioned` (a new one must be marked so; pyproject.toml
# says what the mark means). To run everything against 1.35 (when hack/realk8s/v1.35 moves to
# a new release, say), name it first: hack/realk8s/test.sh 1.35.
#
# tests/realk8s runs on two pytest-xdist workers, a file each at a time (--numprocesses=2
# --dist=loadfile, ahead of PYTEST_ARGS, which may override them: -n 0 runs one process).
# Each worker starts its own session cluster; RealCluster.up starts one at a time, as up.sh
# takes its ports by binding port 0 and closing it. Against 1.37 on this machine's 2 cores:
# 186-196 s for all 143 tests (3 runs) against 357 s in one process, 92 s against 160 s for
# the 39 versioned ones. tests/apiserver stays in one process (25 s against 21 s: starting
# its real servers is most of it).
#
# pytest's exit 5 (no test collected) is a failure, except for a later minor when
# PYTEST_ARGS chose the tests: then it means none of them is versioned (the first minor ran
# them), and it is said so.
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
failed=()
first=1
for minor in "${minors[@]}"; do
    status=0
    if [ "$first" -eq 1 ]; then
        realk8s="realk8s" apiserver=() what="the whole suite" fake="all of them"
    else
        realk8s="realk8s and versioned" apiserver=(-m versioned)
        what="only the tests that depend on the minor" fake="only those that ask its minor"
    fi
    echo "test.sh: tests/realk8s against Kubernetes $minor: $what (-m '$realk8s')" >&2
    start=$(date +%s)
    (cd "$ROOT" && REALK8S_VERSION="$minor" \
        "$PY" -m pytest --numprocesses=2 --dist=loadfile -m "$realk8s" tests/realk8s "$@") \
        || status=$?
    if [ "$status" -eq 5 ] && [ "$first" -eq 0 ] && [ $# -gt 0 ]; then
        echo "test.sh: none of the tests chosen ($*) depends on the minor: nothing to run" \
             "against Kubernetes $minor" >&2
        status=0
    elif [ "$status" -eq 5 ]; then
        echo "test.sh: no test collected (-m '$realk8s'): a failure" >&2
    fi
    if [ "$status" -eq 0 ] && [ $# -eq 0 ]; then
        echo "test.sh: the fake API server's tests against the real Kubernetes $minor:" \
             "$fake${apiserver[*]:+ (${apiserver[*]})}" >&2
        (cd "$ROOT" && FAKE_APISERVER_TESTS_AGAINST=real REALK8S_VERSION="$minor" \
            "$PY" -m pytest --numprocesses=0 "${apiserver[@]}" tests/apiserver) || status=$?
    fi
    echo "test.sh: Kubernetes $minor done in $(( $(date +%s) - start )) s (exit $status)" >&2
    [ "$status" -eq 0 ] || failed+=("$minor")
    first=0
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "test.sh: failed against Kubernetes ${failed[*]}" >&2
    exit 1
fi
