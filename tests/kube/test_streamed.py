"""Watches over our own connections (``KeepAlivePool.open_stream``, ``StreamedAnswer``).

The server is a socket the test drives byte by byte: what it sends and when, so the tests
see that an event is handed over as soon as it is on the wire, that a reader blocked in
another thread is ended by ``close``, and what a broken stream becomes (one line, status 0).
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from agent.kube.credentials import Credentials
from agent.kube.errors import KubeAPIError
from agent.kube.lean import LeanBackend
from agent.kube.transport import KubeHTTP

CHUNKED = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def event(name: str) -> bytes:
    return json.dumps({"type": "ADDED", "object": {"metadata": {"name": name}}}).encode() + b"\n"


class Wire:
    """One accepted connection: the request's head read, then what the test sends."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.conn: socket.socket | None = None
        self.request = b""
        self.accepted = threading.Event()
        self.accepts = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            conn, _ = self.listener.accept()
            self.accepts += 1
            data = b""
            while b"\r\n\r\n" not in data:
                more = conn.recv(4096)
                if not more:
                    break
                data += more
            self.request, self.conn = data, conn
            self.accepted.set()

    def send(self, data: bytes) -> None:
        assert self.accepted.wait(5), "no request came"
        assert self.conn is not None
        self.conn.sendall(data)

    def closed_by_client(self, timeout: float = 5) -> bool:
        """Whether the client closed its end (EOF or reset seen within ``timeout``)."""
        assert self.conn is not None
        self.conn.settimeout(timeout)
        try:
            return self.conn.recv(1) == b""
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False

    def close(self) -> None:
        for sock in (self.conn, self.listener):
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.close()


@pytest.fixture
def wire() -> Iterator[Wire]:
    w = Wire()
    yield w
    w.close()


def _http(url: str) -> tuple[KubeHTTP, LeanBackend]:
    backend = LeanBackend(Credentials(server=url, token="t"))
    return KubeHTTP(backend), backend


def _open(http: KubeHTTP, wire: Wire, head: bytes, timeout: object = (5.0, 5.0)
          ) -> Iterator[bytes]:
    """The stream's lines, the server having answered with ``head`` (sent before the call
    returns: open_stream reads the head)."""
    sender = threading.Timer(0.05, wire.send, (head,))
    sender.start()
    try:
        query = [("watch", "true")]
        return iter(http.stream("GET", "/apis/x", query, timeout=timeout))  # type: ignore[arg-type]
    finally:
        sender.join()


def test_each_event_is_handed_over_as_soon_as_it_is_on_the_wire(wire: Wire) -> None:
    http, backend = _http(wire.url)
    lines = _open(http, wire, CHUNKED)
    request = wire.request.decode("latin-1")
    assert request.startswith("GET /apis/x?watch=true HTTP/1.1\r\n")
    assert "Authorization: Bearer t\r\n" in request
    wire.send(chunk(event("a")))
    assert json.loads(next(lines))["object"]["metadata"]["name"] == "a"
    # One event split over two chunks, the second chunk's data in two writes.
    second = event("b")
    wire.send(chunk(second[:10]))
    wire.send(f"{len(second) - 10:x}\r\n".encode() + second[10:20])
    time.sleep(0.05)
    wire.send(second[20:] + b"\r\n")
    assert json.loads(next(lines))["object"]["metadata"]["name"] == "b"
    wire.send(chunk(b"\n") + b"0\r\n\r\n")  # an empty line (skipped), then the end
    assert list(lines) == []
    assert wire.closed_by_client() and backend.stream_pool.open_connections == 0
    assert backend.pool.opened == 0  # the request pool was not touched


def test_close_from_another_thread_ends_a_blocked_read(wire: Wire) -> None:
    http, backend = _http(wire.url)
    sender = threading.Timer(0.05, wire.send, (CHUNKED + chunk(event("a")),))
    sender.start()
    lines = http.stream("GET", "/apis/x", [("watch", "true")], timeout=(5.0, 60.0))
    sender.join()
    seen: list[bytes] = []
    failed: list[BaseException] = []

    def read() -> None:
        try:
            seen.extend(lines)
        except BaseException as err:  # what the reader saw is the assertion
            failed.append(err)

    reader = threading.Thread(target=read)
    reader.start()
    time.sleep(0.2)  # the reader is now blocked waiting for the next event
    started = time.monotonic()
    lines.close()
    reader.join(5)
    assert not reader.is_alive() and time.monotonic() - started < 2
    assert len(seen) == 1 and failed == []
    assert backend.stream_pool.open_connections == 0


@pytest.mark.parametrize("head, status, check", [
    (b"HTTP/1.1 410 Gone\r\nContent-Type: application/json\r\nContent-Length: 52\r\n\r\n"
     b'{"kind":"Status","code":410,"reason":"Expired","x":1}', 410,
     lambda err: err.expired),
    (b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 3\r\nContent-Length: 2\r\n\r\n{}", 429,
     lambda err: err.retry_after == 3 and err.transient),
    (CHUNKED.replace(b"200 OK", b"500 Internal Server Error") + chunk(b'{"message":"boom"}')
     + b"0\r\n\r\n", 500, lambda err: err.message == "boom"),
])
def test_an_error_answer_raises_with_its_status(wire: Wire, head: bytes, status: int,
                                                check: object) -> None:
    http, backend = _http(wire.url)
    with pytest.raises(KubeAPIError) as info:
        _open(http, wire, head)
    assert info.value.status == status and check(info.value)  # type: ignore[operator]
    assert backend.stream_pool.open_connections == 0


@pytest.mark.parametrize("tail, words", [
    (chunk(event("a"))[:20], "closed the connection"),  # mid-chunk
    (b"zz\r\n", "bad chunk size"),
    (b"5\r\nabcdeXX", "does not end in CRLF"),
])
def test_a_broken_stream_is_one_line_with_status_0(wire: Wire, tail: bytes, words: str) -> None:
    http, backend = _http(wire.url)
    lines = _open(http, wire, CHUNKED)
    wire.send(tail)
    if words == "closed the connection":
        wire.conn.shutdown(socket.SHUT_WR)  # type: ignore[union-attr]
    with pytest.raises(KubeAPIError) as info:
        list(lines)
    text = str(info.value)
    assert info.value.status == 0 and words in text and "\n" not in text, text
    assert backend.stream_pool.open_connections == 0


def test_a_silent_server_is_a_read_timeout(wire: Wire) -> None:
    http, _ = _http(wire.url)
    lines = _open(http, wire, CHUNKED, timeout=(5.0, 0.3))
    started = time.monotonic()
    with pytest.raises(KubeAPIError) as info:
        next(lines)
    assert info.value.status == 0 and "timed out" in str(info.value)
    assert time.monotonic() - started < 3


def test_a_refused_watch_is_status_0() -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    http, _ = _http(f"http://127.0.0.1:{port}")
    with pytest.raises(KubeAPIError) as info:
        http.stream("GET", "/apis/x")
    assert info.value.status == 0 and "refused" in str(info.value).lower()


def test_requests_and_watches_never_load_urllib3(wire: Wire) -> None:
    # A child process: this one has urllib3 loaded by other tests.
    code = f"""
import sys, threading, socket
from agent.kube.credentials import Credentials
from agent.kube.lean import lean_client
http = lean_client(Credentials(server={wire.url!r}, token="t"))
lines = http.stream("GET", "/apis/x", [("watch", "true")])
print(next(iter(lines)).decode())
print("urllib3" in sys.modules)
"""
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    wire.send(CHUNKED + chunk(event("a")) + b"0\r\n\r\n")
    out, _ = child.communicate(timeout=30)
    assert child.returncode == 0
    first, loaded = out.strip().splitlines()
    assert json.loads(first)["type"] == "ADDED" and loaded == "False"


def test_through_a_proxy_a_429_comes_back_as_the_answer(wire: Wire) -> None:
    # urllib3 (the proxy path) answered a 429 with Retry-After as status 0, "too many 429
    # error responses": the caller could not wait as the server asked.
    backend = LeanBackend(Credentials(server="http://api.invalid:6443", token="t",
                                      proxy_url=wire.url))
    http = KubeHTTP(backend)
    assert not backend.keepalive
    reply = b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 2\r\nContent-Length: 2\r\n\r\n{}"
    sender = threading.Timer(0.05, wire.send, (reply,))
    sender.start()
    answer = http.request("GET", "/api/v1/nodes/n")
    sender.join()
    assert wire.request.startswith(b"GET http://api.invalid:6443/api/v1/nodes/n HTTP/1.1")
    err = answer.error()
    assert answer.status == 429 and err.retry_after == 2 and err.transient
