"""The agent's own state: checkpoint, the CDI specs it promises, the health endpoint."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agent.checkpoint.codec import encode
from agent.checkpoint.model import CheckpointData, ClaimRecord, ClaimState
from agent.doctor import selfcheck
from agent.doctor.context import Options
from agent.doctor.model import Status
from tests.doctor.conftest import Tree, assert_check, context

PLUGIN = "/var/lib/kubelet/plugins/dra-agent.io"
CKPT = f"{PLUGIN}/checkpoint.json"
UID_A = "0b9e8c2e-3f4a-4f7e-9a39-1d2c3b4a5f60"
UID_B = "7c1d2e3f-4a5b-4c6d-8e9f-0a1b2c3d4e5f"


def _spec(uid: str) -> str:
    return f"/var/run/cdi/k8s.dra-agent.io-claim_{uid}.json"


def _checkpoint(tree: Tree, *records: ClaimRecord) -> None:
    tree.write(CKPT, encode(CheckpointData(claims={r.uid: r for r in records})))


def _record(uid: str, name: str, state: ClaimState = ClaimState.PREPARE_COMPLETED) -> ClaimRecord:
    return ClaimRecord(uid=uid, namespace="ml", name=name, state=state, spec_path=_spec(uid))


def test_no_checkpoint_yet(tree: Tree) -> None:
    ctx = context(tree)
    assert_check(selfcheck.check_checkpoint(ctx), Status.SKIPPED, "see kubelet dir")
    tree.dir("/var/lib/kubelet")
    assert_check(selfcheck.check_checkpoint(ctx), Status.OK, "not written yet")
    assert_check(selfcheck.check_specs(ctx), Status.SKIPPED, "no completed claim")


def test_completed_claims_and_their_specs(tree: Tree) -> None:
    _checkpoint(tree, _record(UID_A, "train"), _record(UID_B, "infer"),
                _record("1" * 8 + UID_A[8:], "half", ClaimState.PREPARE_STARTED))
    tree.write(_spec(UID_A), "{}")
    ctx = context(tree)
    assert_check(selfcheck.check_checkpoint(ctx), Status.OK, "3 claim record(s)")
    assert_check(selfcheck.check_specs(ctx), Status.FAIL, "1 of 2 prepared claim(s)",
                 "ml/infer", fix="restart the agent")
    tree.write(_spec(UID_B), "{}")
    assert_check(selfcheck.check_specs(ctx), Status.OK, "2 prepared claim(s), each with its")


def test_a_corrupt_or_planted_checkpoint_warns(tree: Tree) -> None:
    tree.write(CKPT, '{"schemaVersion": 1, "claims": {}, "checksum": "sha256:00"}')
    ctx = context(tree)
    assert_check(selfcheck.check_checkpoint(ctx), Status.WARN, "is corrupt", fix="restart it")
    assert_check(selfcheck.check_specs(ctx), Status.SKIPPED, "checkpoint unreadable")
    tree.local(CKPT).unlink()
    tree.fifo(CKPT)
    assert_check(selfcheck.check_checkpoint(ctx), Status.WARN, "is a FIFO", fix="restart it")
    assert tree.local(CKPT).exists()  # read only: nothing set aside, no lock file made
    assert sorted(p.name for p in tree.local(CKPT).parent.iterdir()) == ["checkpoint.json"]


class _Health(BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        body = b"[+]ping ok\n[-]registration failed: not registered\n" if self.status != 200 \
            else b"[+]ping ok\nreadyz check passed\n"
        self.send_response(self.status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[ThreadingHTTPServer]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _at(address: str) -> Options:
    return Options(metrics_address=address)


def test_health_answers(tree: Tree, server: ThreadingHTTPServer) -> None:
    address = f"127.0.0.1:{server.server_address[1]}"
    assert_check(selfcheck.check_health(context(tree, options=_at(address))), Status.OK,
                 f"{address}/readyz answers 200")
    _Health.status = 503
    try:
        check = selfcheck.check_health(context(tree, options=_at(address)))
    finally:
        _Health.status = 200
    assert_check(check, Status.WARN, "answers 503: [-]registration failed", fix="agent's log")


def test_a_socket_that_does_not_answer(tree: Tree) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)  # accepts the connection, never answers
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        started = time.monotonic()
        check = selfcheck.check_health(context(tree, options=_at(address)), timeout_s=0.3)
        assert time.monotonic() - started < 2
    assert_check(check, Status.WARN, "no answer within 0.3 s", fix="stuck")


def test_nothing_listening_and_bad_addresses(tree: Tree) -> None:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    check = selfcheck.check_health(context(tree, options=_at(f"127.0.0.1:{port}")))
    assert_check(check, Status.WARN, "Connection refused", fix="is the agent running")
    assert_check(selfcheck.check_health(context(tree, options=_at("nowhere"))), Status.WARN,
                 "expected host:port", fix="host:port")
    assert_check(selfcheck.check_health(context(tree, options=_at("none"))), Status.SKIPPED,
                 "--metrics-address none")
    assert_check(selfcheck.check_health(context(tree, simulated="dgx-h100")), Status.SKIPPED,
                 "simulated node dgx-h100")


def test_a_server_that_is_not_http(tree: Tree) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)

        def answer() -> None:
            conn, _ = listener.accept()
            with conn:
                conn.recv(1024)
                conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")

        thread = threading.Thread(target=answer, daemon=True)
        thread.start()
        check = selfcheck.check_health(
            context(tree, options=_at(f"127.0.0.1:{listener.getsockname()[1]}")))
        thread.join(2)
    assert_check(check, Status.WARN, "not an HTTP answer", fix="is the agent running")
