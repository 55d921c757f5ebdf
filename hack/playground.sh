#!/usr/bin/env bash
# playground.sh - the whole DRA flow on a laptop, in one command, no cluster needed.
#
# Starts the fake Kubernetes API server and `dra-agent run` on simulated DGX H100 hardware,
# then plays the kubelet, a user and the scheduler against them (hack/playground.py): the
# agent publishes ResourceSlices, a claim for a GPU and a NIC under one PCIe root is created
# and allocated, the kubelet prepares it, and the CDI spec the agent wrote is shown; then it
# is unprepared. Every process and temporary file is removed on exit, even on Ctrl-C.
#
# Usage: hack/playground.sh            (PYTHON=... to pick the interpreter; default .venv)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$REPO/.venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python3)"

# Short path: unix socket paths must stay under 108 bytes.
WORK="$(mktemp -d /tmp/dra-playground.XXXXXX)"
PIDS=()

cleanup() {
    local pid
    for pid in "${PIDS[@]}"; do
        kill -TERM "$pid" 2>/dev/null || true
    done
    for pid in "${PIDS[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    rm -rf "$WORK"
    echo "cleaned up: stopped ${#PIDS[@]} processes, removed $WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

fail() {
    echo "playground: $*" >&2
    for log in "$WORK"/*.log; do
        [ -s "$log" ] && { echo "--- $log" >&2; tail -n 30 "$log" >&2; }
    done
    exit 1
}

cd "$REPO"
echo "work dir: $WORK"

"$PY" -m tests.fakes.apiserver --port 0 --kubeconfig "$WORK/kubeconfig" \
    >"$WORK/apiserver.out" 2>"$WORK/apiserver.log" &
PIDS+=("$!")
for _ in $(seq 100); do
    [ -s "$WORK/apiserver.out" ] && break
    sleep 0.1
done
[ -s "$WORK/apiserver.out" ] || fail "the fake API server did not start"
echo "fake API server: $(head -n 1 "$WORK/apiserver.out") (pid ${PIDS[0]})"

"$PY" -m hack.playground setup --kubeconfig "$WORK/kubeconfig" || fail "setup failed"

"$PY" -m agent.cli run --simulate dgx-h100 --node-name playground \
    --kubeconfig "$WORK/kubeconfig" --kubelet-dir "$WORK/kubelet" --cdi-dir "$WORK/cdi" \
    --metrics-address none >"$WORK/agent.log" 2>&1 &
PIDS+=("$!")
echo "dra-agent run --simulate dgx-h100 (pid ${PIDS[1]}, log $WORK/agent.log)"

"$PY" -m hack.playground flow --kubeconfig "$WORK/kubeconfig" \
    --kubelet-dir "$WORK/kubelet" --cdi-dir "$WORK/cdi" || fail "the flow failed"
