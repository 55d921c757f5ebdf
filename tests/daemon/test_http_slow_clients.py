"""The metrics/health listener under slow and idle clients: its threads stay bounded, a
dribbling client is dropped, and the kubelet's probe is still answered."""

from __future__ import annotations

import http.client
import socket
import threading
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from agent.httplistener import MAX_CONNECTIONS, REQUEST_TIMEOUT_S
from agent.httpserver import HealthServer
from tests.waiting import wait_for


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def server(clock: Clock) -> Iterator[HealthServer]:
    with HealthServer("127.0.0.1:0", CollectorRegistry(), {"ok": lambda: (True, "")},
                      clock=clock) as srv:
        yield srv


def _healthz(server: HealthServer) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request("GET", "/healthz")
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def _slow(server: HealthServer, n: int) -> list[socket.socket]:
    """``n`` clients that sent half a request and then went quiet."""
    out = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        out.append(s)
    return out


def _closed_by_server(sock: socket.socket) -> bool:
    """EOF, or a reset (the server closed with our last bytes unread)."""
    try:
        return sock.recv(1024) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_many_slow_clients_take_no_threads_and_the_probe_is_answered(
    server: HealthServer,
) -> None:
    assert _healthz(server) == 200  # every worker that will ever run is started by now
    before = threading.active_count()
    clients = _slow(server, 200)
    try:
        assert _healthz(server) == 200
        # The listener and its WORKERS threads were all running before the clients came.
        assert threading.active_count() <= before
    finally:
        for c in clients:
            c.close()


def test_beyond_the_connection_cap_the_longest_waiting_is_closed_for_the_probe(
    server: HealthServer,
) -> None:
    clients = _slow(server, MAX_CONNECTIONS)
    try:
        assert _healthz(server) == 200
        # Made room for the probe: the first slow client went.
        clients[0].settimeout(10)
        assert _closed_by_server(clients[0])
    finally:
        for c in clients:
            c.close()


def test_a_client_dribbling_its_request_is_dropped_after_the_request_timeout(
    server: HealthServer, clock: Clock
) -> None:
    (client,) = _slow(server, 1)
    try:
        client.sendall(b"Accept: */*\r\n")
        client.settimeout(0.2)

        def dribbled_past_the_timeout_then_closed() -> bool:
            # Moved each round: the listener may see the connection after a move.
            clock.now += REQUEST_TIMEOUT_S + 1
            return _closed_by_server(client)

        wait_for(dribbled_past_the_timeout_then_closed, what="the slow client dropped")
        assert _healthz(server) == 200
    finally:
        client.close()


def test_keep_alive_idle_connection_is_kept_until_its_idle_timeout(
    server: HealthServer, clock: Clock
) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        for _ in range(3):
            clock.now += REQUEST_TIMEOUT_S + 1  # idle between scrapes is not a slow request
            conn.request("GET", "/healthz")
            resp = conn.getresponse()
            assert resp.status == 200
            resp.read()
        sock = conn.sock
        assert sock is not None
        sock.settimeout(0.2)

        def idle_for_an_hour_then_closed() -> bool:
            # Moved each round: the answer may reach us before the connection is back with
            # the listener, which then counts the idle time from when it got it.
            clock.now += 3600
            return _closed_by_server(sock)

        wait_for(idle_for_an_hour_then_closed, what="the idle connection closed")
    finally:
        conn.close()


def test_bad_and_oversized_requests_get_an_answer_and_a_close(server: HealthServer) -> None:
    for raw, code in ((b"NOT HTTP\r\n\r\n", b"400"),
                      (b"GET / HTTP/1.1\r\nX: " + b"a" * 17_000, b"431")):
        s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        try:
            s.sendall(raw)
            answer = b""
            while chunk := _read(s):
                answer += chunk
            assert code in answer  # then the server closed: the loop ended
        finally:
            s.close()
    assert _healthz(server) == 200


def _read(sock: socket.socket) -> bytes:
    return sock.recv(65536)
