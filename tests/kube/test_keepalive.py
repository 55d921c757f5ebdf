"""agent.kube.keepalive against real local servers: reuse, the retry rules, timeouts, TLS.

The server here is a raw threading socket server: each test says, per request, what it
answers (or that it closes, or never answers), and it counts accepted connections, so the
tests see on the wire what the pool did."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest

from agent.kube.credentials import Credentials
from agent.kube.errors import KubeAPIError
from agent.kube.keepalive import Endpoint, KeepAlivePool
from agent.kube.lean import lean_client
from agent.kube.transport import KubeHTTP
from tests.kube.conftest import EchoServer, Pki


@dataclass
class Req:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    conn: int  # which accepted connection (0, 1, ...)
    index: int  # which request on that connection (0, 1, ...)


#: What the server does with one request: the bytes to answer (None: none) and whether it
#: closes the connection afterwards. HANG: never answers (until the test ends).
Reply = tuple[bytes | None, bool]
HANG: Reply = (None, False)


def ok(body: bytes = b'{"kind":"Status"}', extra: str = "") -> bytes:
    return (f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
            f"{len(body)}\r\n{extra}\r\n").encode() + body


@dataclass
class RawServer:
    reply: Callable[[Req], Reply]
    sock: socket.socket
    seen: list[Req] = field(default_factory=list)
    accepts: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    threads: list[threading.Thread] = field(default_factory=list)
    conns: list[socket.socket] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                n = self.accepts
                self.accepts += 1
                self.conns.append(conn)
            thread = threading.Thread(target=self._conn, args=(conn, n), daemon=True)
            self.threads.append(thread)
            thread.start()

    def close(self) -> None:
        """Stop everything this server started: no thread or socket outlives the test."""
        self.stop.set()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept (close does not)
        self.sock.close()
        with self.lock:
            conns = list(self.conns)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        for thread in self.threads:
            thread.join(5)

    def _conn(self, conn: socket.socket, n: int) -> None:
        with conn, conn.makefile("rb") as f:
            for index in range(10_000):
                try:
                    line = f.readline()
                except OSError:
                    return
                if not line:
                    return
                method, path, _ = line.decode("latin-1").split(" ", 2)
                headers: dict[str, str] = {}
                while (h := f.readline()) not in (b"\r\n", b""):
                    name, _, value = h.decode("latin-1").partition(":")
                    headers[name.strip().lower()] = value.strip()
                body = f.read(int(headers.get("content-length", "0")))
                req = Req(method, path, headers, body, n, index)
                with self.lock:
                    self.seen.append(req)
                    self.in_flight += 1
                    self.max_in_flight = max(self.max_in_flight, self.in_flight)
                answer, close = self.reply(req)
                with self.lock:
                    self.in_flight -= 1
                if answer is None and not close:
                    self.stop.wait(10)
                    return
                if answer is not None:
                    conn.sendall(answer)
                if close:
                    return


@pytest.fixture
def serve() -> Iterator[Callable[[Callable[[Req], Reply]], RawServer]]:
    servers: list[RawServer] = []

    def start(reply: Callable[[Req], Reply]) -> RawServer:
        sock = socket.create_server(("127.0.0.1", 0), backlog=64)
        server = RawServer(reply, sock)
        thread = threading.Thread(target=server.serve, daemon=True)
        server.threads.append(thread)
        thread.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


def _pool(server: RawServer, maxsize: int = 16) -> KeepAlivePool:
    return KeepAlivePool(Endpoint(server.url), maxsize=maxsize)


def _http(url: str, **kw: object) -> KubeHTTP:
    return lean_client(Credentials(server=url, **kw))  # type: ignore[arg-type]


def _one_line(err: KubeAPIError) -> str:
    text = str(err)
    assert "\n" not in text and "Traceback" not in text
    assert err.status == 0
    return text


def test_sequential_gets_reuse_one_connection(serve: Callable[..., RawServer]) -> None:
    server = serve(lambda req: (ok(req.path.encode()), False))
    pool = _pool(server)
    for i in range(20):
        answer = pool.request("GET", f"/api/{i}", {}, None, 5.0)
        assert (answer.status, answer.body) == (200, f"/api/{i}".encode())
    assert server.accepts == 1 and pool.opened == 1
    assert [r.index for r in server.seen] == list(range(20))
    assert server.seen[0].headers["host"] == server.url.removeprefix("http://")


def test_idle_connection_closed_by_the_server_is_replaced(
    serve: Callable[..., RawServer]
) -> None:
    # Answers, then closes without saying so (a keep-alive timeout on the server).
    server = serve(lambda req: (ok(), True))
    pool = _pool(server)
    for _ in range(3):
        assert pool.request("GET", "/api", {}, None, 5.0).status == 200
    assert server.accepts == 3 and len(server.seen) == 3


def test_get_raced_by_the_close_is_sent_again_once(serve: Callable[..., RawServer]) -> None:
    # The second request on the first connection is read, then the connection closes with
    # no answer: the close raced the GET; it goes again on a new connection.
    server = serve(lambda req: (None, True) if (req.conn, req.index) == (0, 1) else (ok(), False))
    pool = _pool(server)
    assert pool.request("GET", "/a", {}, None, 5.0).status == 200
    assert pool.request("GET", "/b", {}, None, 5.0).status == 200
    assert [(r.path, r.conn) for r in server.seen] == [("/a", 0), ("/b", 0), ("/b", 1)]
    assert pool.opened == 2


def test_get_on_a_new_connection_closed_unanswered_is_not_retried(
    serve: Callable[..., RawServer]
) -> None:
    server = serve(lambda req: (None, True))
    with pytest.raises(KubeAPIError) as info:
        _http(server.url).request("GET", "/api")
    assert "closed the connection before answering" in _one_line(info.value)
    assert len(server.seen) == 1


@pytest.mark.parametrize("reused", [False, True])
def test_a_post_the_server_read_is_never_sent_again(
    serve: Callable[..., RawServer], reused: bool
) -> None:
    server = serve(lambda req: (None, True) if req.method == "POST" else (ok(), False))
    http = _http(server.url)
    if reused:
        assert http.request("GET", "/api").ok
    with pytest.raises(KubeAPIError) as info:
        http.request("POST", "/api/v1/namespaces/d/events", body={"kind": "Event"})
    text = _one_line(info.value)
    assert "POST is not sent again" in text
    assert [r.method for r in server.seen].count("POST") == 1
    assert server.seen[-1].body == b'{"kind":"Event"}'
    # The pool is still good afterwards.
    assert http.request("GET", "/api").ok


def test_chunked_and_content_length_bodies_and_connection_close(
    serve: Callable[..., RawServer]
) -> None:
    chunked = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"5;ext=1\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n0\r\nX-Trailer: t\r\n\r\n")
    answers = {"/chunked": (chunked, False),
               "/length": (ok(b"0123456789" * 1000), False),
               "/empty": (b"HTTP/1.1 204 No Content\r\n\r\n", False),
               "/close": (ok(b"bye", "Connection: close\r\n"), False),
               "/after": (ok(b"after"), False)}
    server = serve(lambda req: answers[req.path])
    pool = _pool(server)
    assert pool.request("GET", "/chunked", {}, None, 5.0).body == b"hello world"
    assert pool.request("GET", "/length", {}, None, 5.0).body == b"0123456789" * 1000
    assert pool.request("GET", "/empty", {}, None, 5.0).status == 204
    assert server.accepts == 1
    # The server keeps its side open; the client must not reuse it after Connection: close.
    answer = pool.request("GET", "/close", {}, None, 5.0)
    assert answer.body == b"bye" and answer.headers["connection"] == "close"
    assert pool.request("GET", "/after", {}, None, 5.0).body == b"after"
    assert server.accepts == 2 and pool.opened == 2
    assert [(r.path, r.conn) for r in server.seen][-2:] == [("/close", 0), ("/after", 1)]


@pytest.mark.parametrize("timeout", [0.3, (2.0, 0.3)], ids=["total", "connect-read"])
def test_a_server_that_never_answers_times_out(
    serve: Callable[..., RawServer], timeout: float | tuple[float, float]
) -> None:
    server = serve(lambda req: HANG)
    start = time.monotonic()
    with pytest.raises(KubeAPIError) as info:
        _http(server.url).request("GET", "/api", timeout=timeout)
    elapsed = time.monotonic() - start
    assert 0.25 <= elapsed < 2.0
    assert "in time" in _one_line(info.value)
    assert info.value.unreachable == "no answer in time"
    assert len(server.seen) == 1


def test_tls_with_the_wrong_ca_is_one_line(pki: Pki, tls_echo: EchoServer) -> None:
    http = _http(tls_echo.url(), ca_file=str(pki.other_ca))
    with pytest.raises(KubeAPIError) as info:
        http.request("GET", "/api")
    text = _one_line(info.value)
    assert "TLS" in text and "certificate" in text.lower()
    assert tls_echo.seen == []


def test_tls_client_certificate_and_bearer_token_reach_the_server(
    pki: Pki, tls_echo: EchoServer
) -> None:
    cert, key = pki.client("node-a")
    http = _http(tls_echo.url(), ca_file=str(pki.ca), cert_file=str(cert), key_file=str(key),
                 token="sekrit")
    for _ in range(3):
        assert http.request("GET", "/api").ok
    assert {s.client_cn for s in tls_echo.seen} == {"system:node:node-a"}
    assert {s.headers.get("authorization") for s in tls_echo.seen} == {"Bearer sekrit"}
    # Kept alive over TLS too: all three on one connection.
    assert len({s.client_port for s in tls_echo.seen}) == 1


def test_many_threads_share_a_bounded_pool(serve: Callable[..., RawServer]) -> None:
    server = serve(lambda req: (ok(req.path.encode()), False))
    pool = _pool(server, maxsize=4)
    errors: list[BaseException] = []
    bodies: list[bytes] = []
    go = threading.Event()

    def work(t: int) -> None:
        go.wait()
        try:
            for i in range(8):
                bodies.append(pool.request("GET", f"/{t}/{i}", {}, None, 5.0).body)
                assert pool.open_connections <= 4
        except BaseException as err:  # collected: asserted in the main thread
            errors.append(err)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(16)]
    for thread in threads:
        thread.start()
    go.set()
    for thread in threads:
        thread.join(10)
    assert errors == []
    assert sorted(bodies) == sorted(f"/{t}/{i}".encode() for t in range(16) for i in range(8))
    assert server.accepts <= 4 and server.max_in_flight <= 4
    assert pool.opened == server.accepts


def test_a_header_value_with_a_line_break_is_refused(serve: Callable[..., RawServer]) -> None:
    server = serve(lambda req: (ok(), False))
    pool = _pool(server)
    for value in ("a\r\nX-Evil: 1", "a\nb", "a\rb"):
        with pytest.raises(ValueError, match="line break"):
            pool.request("GET", "/api", {"X-Test": value}, None, 5.0)
    with pytest.raises(ValueError, match="cannot be sent"):
        pool.request("GET", "/api HTTP/1.1\r\nX: y", {}, None, 5.0)
    # Through the client: a token with a line break is one line, nothing sent.
    with pytest.raises(KubeAPIError) as info:
        _http(server.url, token="tok\nX-Evil: 1").request("GET", "/api")
    assert "line break" in _one_line(info.value)
    assert server.seen == [] and server.accepts == 0
