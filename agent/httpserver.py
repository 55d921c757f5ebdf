"""One HTTP listener for Prometheus metrics, ``/healthz`` and ``/readyz``.

Kubelet probes and Prometheus reach the agent on the same port, so a DaemonSet needs one
address and a systemd host one firewall rule. Health checks are plain callables registered by
name; each returns ``(ok, reason)``. The answer format follows the Kubernetes components'
verbose health output (``[+]name ok`` / ``[-]name failed: reason``) so operators read it the
way they read the kubelet's own.

``/readyz`` runs the liveness checks too: an agent that is not alive is not ready either.
``/healthz/<name>`` and ``/readyz/<name>`` run one check, for debugging a failing probe.

The port is reachable from the whole cluster (hostNetwork), so no client may cost a thread
while it is slow: one thread reads every connection's request without blocking and hands
complete requests to ``WORKERS`` threads; connections are capped (the longest waiting is
closed for a new one) and a request must arrive within ``REQUEST_TIMEOUT_S``. Before, each
connection had its own thread: 16 slow clients held 654 of them.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import ipaddress
import logging
import queue
import selectors
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

__all__ = ["HealthCheck", "HealthServer", "HealthServerError", "parse_address"]

log = logging.getLogger(__name__)

#: ``() -> (ok, reason)``; the reason is shown on failure (and on success when not empty).
HealthCheck = Callable[[], tuple[bool, str]]


class HealthServerError(RuntimeError):
    """The metrics/health listener could not be set up at ``address``."""

    def __init__(self, address: str, reason: str) -> None:
        super().__init__(f"metrics/health address {address!r}: {reason}")
        self.address = address
        self.reason = reason


def parse_address(address: str) -> tuple[str, int]:
    """``host:port``, ``[v6]:port`` or ``:port`` (all interfaces) -> (host, port)."""
    host, sep, port_text = address.rpartition(":")
    if not sep:
        raise HealthServerError(address, "expected host:port")
    bracketed = host.startswith("[") and host.endswith("]")
    if bracketed:
        host = host[1:-1]
    elif ":" in host:
        # "::1:80" is ambiguous (is 80 part of the address?), so IPv6 needs brackets.
        raise HealthServerError(address, "IPv6 hosts must be written [addr]:port")
    try:
        port = int(port_text)
    except ValueError:
        raise HealthServerError(address, f"port {port_text!r} is not a number") from None
    if not 0 <= port <= 65535:
        raise HealthServerError(address, f"port {port} out of range 0-65535")
    if bracketed:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise HealthServerError(address, f"{host!r} is not an IPv6 address") from None
    return host, port


def _run_checks(checks: Mapping[str, HealthCheck]) -> tuple[bool, list[str]]:
    ok_all = True
    lines: list[str] = []
    for name, check in checks.items():
        try:
            ok, reason = check()
        except Exception as err:  # a broken check is a failed check, never a 500
            ok, reason = False, f"check raised {type(err).__name__}: {err}"
        reason = " ".join(str(reason).split())  # one line per check, whatever the reason holds
        if ok:
            lines.append(f"[+]{name} ok" + (f": {reason}" if reason else ""))
        else:
            ok_all = False
            lines.append(f"[-]{name} failed: {reason or 'no reason given'}")
    return ok_all, lines


#: Threads that answer complete requests. Answers are built from memory in milliseconds
#: (a check is a callable over state the agent already holds), so a few threads serve
#: probes and scrapes; a check that blocks holds only one of them.
WORKERS = 8
#: Connections held open at once (reading, queued or being answered). When full, the one
#: waiting longest for its request is closed to make room, so a crowd of idle or slow
#: clients cannot lock a probe out.
MAX_CONNECTIONS = 128
#: From a request's first byte to its last header line; a client dribbling its headers is
#: dropped after this long (the probe sends its request in one write).
REQUEST_TIMEOUT_S = 10.0
#: An idle keep-alive connection is closed after this long (Prometheus scrapes every 15-60 s
#: and reconnects when it finds the connection closed).
IDLE_TIMEOUT_S = 60.0
#: Writing one answer to a client that does not read it gives up after this long.
WRITE_TIMEOUT_S = 5.0
#: Request line and headers together; probes and scrapers send a few hundred bytes.
MAX_HEADER_BYTES = 16 * 1024

_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Content-Length: 5\r\nConnection: close\r\nRetry-After: 1\r\n\r\nbusy\n"
)
_TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Length: 0\r\n"
    b"Connection: close\r\n\r\n"
)


@dataclass(slots=True)
class _Conn:
    sock: socket.socket
    address: Any
    deadline: float
    buf: bytes = b""


@dataclass(frozen=True, slots=True)
class _Request:
    conn: _Conn
    head: bytes


class _Listener:
    """One thread reads requests from every connection without blocking; ``WORKERS``
    threads answer complete ones. A slow or idle client costs a socket, never a thread."""

    def __init__(self, sock: socket.socket, owner: HealthServer, clock: Callable[[], float]
                 ) -> None:
        self.owner = owner
        self._sock = sock
        self._clock = clock
        self._select = selectors.DefaultSelector()
        self._waiting: dict[socket.socket, _Conn] = {}  # reading a request, oldest first
        self._busy = 0  # connections handed to the workers
        self._work: queue.Queue[_Request | None] = queue.Queue()
        self._back: queue.Queue[_Conn] = queue.Queue()  # keep-alive, from the workers
        self._wake_r, self._wake_w = socket.socketpair()
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []

    @property
    def address(self) -> Any:
        return self._sock.getsockname()

    def start(self) -> None:
        self._sock.setblocking(False)
        self._wake_r.setblocking(False)
        self._select.register(self._sock, selectors.EVENT_READ)
        self._select.register(self._wake_r, selectors.EVENT_READ)
        # Daemon threads: a probe or a hung check must never keep a stopping agent alive.
        self._threads = [threading.Thread(target=self._loop, name="http", daemon=True)]
        self._threads += [
            threading.Thread(target=self._answer, name=f"http-{i}", daemon=True)
            for i in range(WORKERS)
        ]
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stopping.set()
        self._wake()
        for _ in range(WORKERS):
            self._work.put(None)
        self._threads[0].join()
        for conn in list(self._waiting.values()):
            self._close(conn)
        self._select.close()
        self._sock.close()
        self._wake_r.close()
        self._wake_w.close()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def _loop(self) -> None:
        while not self._stopping.is_set():
            for key, _ in self._select.select(timeout=0.5):
                if key.fileobj is self._sock:
                    self._accept()
                elif key.fileobj is self._wake_r:
                    with contextlib.suppress(BlockingIOError):
                        self._wake_r.recv(4096)
                    self._returned()
                else:
                    conn = self._waiting.get(key.fileobj)  # type: ignore[call-overload]
                    if conn is not None:  # None: closed to make room in this round
                        self._read(conn)
            self._expire()

    def _accept(self) -> None:
        while True:
            try:
                sock, address = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as err:  # EMFILE and the like: keep serving who is connected
                log.warning("http accept failed", extra={"error": str(err)})
                return
            if len(self._waiting) + self._busy >= MAX_CONNECTIONS:
                if not self._waiting:
                    self._refuse(sock, _BUSY)
                    continue
                self._close(next(iter(self._waiting.values())))
            sock.setblocking(False)
            conn = _Conn(sock, address, self._clock() + REQUEST_TIMEOUT_S)
            self._waiting[sock] = conn
            self._select.register(sock, selectors.EVENT_READ)

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close(conn)
            return
        if not conn.buf:
            conn.deadline = min(conn.deadline, self._clock() + REQUEST_TIMEOUT_S)
        conn.buf += data
        self._dispatch(conn)

    def _dispatch(self, conn: _Conn) -> None:
        end = conn.buf.find(b"\r\n\r\n")
        if end < 0:
            end = conn.buf.find(b"\n\n")
            end = end + 2 if end >= 0 else -1
        else:
            end += 4
        if end < 0:
            if len(conn.buf) > MAX_HEADER_BYTES:
                self._forget(conn)
                self._refuse(conn.sock, _TOO_LARGE)
            return
        if end > MAX_HEADER_BYTES:
            self._forget(conn)
            self._refuse(conn.sock, _TOO_LARGE)
            return
        head, conn.buf = conn.buf[:end], conn.buf[end:]
        self._forget(conn)
        self._busy += 1
        self._work.put(_Request(conn, head))

    def _returned(self) -> None:
        while True:
            try:
                conn = self._back.get_nowait()
            except queue.Empty:
                return
            self._busy -= 1
            if conn.sock.fileno() < 0:  # the worker closed it
                continue
            if self._stopping.is_set():
                self._close(conn)
                continue
            conn.sock.setblocking(False)
            now = self._clock()
            conn.deadline = now + (REQUEST_TIMEOUT_S if conn.buf else IDLE_TIMEOUT_S)
            self._waiting[conn.sock] = conn
            self._select.register(conn.sock, selectors.EVENT_READ)
            self._dispatch(conn)  # a pipelined request may be complete already

    def _expire(self) -> None:
        now = self._clock()
        for conn in [c for c in self._waiting.values() if c.deadline <= now]:
            self._close(conn)

    def _forget(self, conn: _Conn) -> None:
        if self._waiting.pop(conn.sock, None) is not None:
            self._select.unregister(conn.sock)

    def _close(self, conn: _Conn) -> None:
        self._forget(conn)
        conn.sock.close()

    @staticmethod
    def _refuse(sock: socket.socket, answer: bytes) -> None:
        with contextlib.suppress(OSError):
            sock.setblocking(False)
            sock.send(answer)  # small: fits the send buffer, or is dropped
        sock.close()

    def _answer(self) -> None:
        while True:
            request = self._work.get()
            if request is None:
                return
            conn = request.conn
            keep = False
            try:
                conn.sock.setblocking(True)
                conn.sock.settimeout(WRITE_TIMEOUT_S)
                # http.server's request/server types are its own sockets and servers; the
                # handler here reads its request from ``_Request`` and only ``owner`` of us.
                handler = _Handler(request, conn.address, self)  # type: ignore[arg-type]
                keep = handler.keep_alive
            except Exception:  # a broken connection or a bug: this request only
                log.debug("http request failed", exc_info=True)
            if not keep or self._stopping.is_set():
                conn.sock.close()
            self._back.put(conn)
            self._wake()


class _Handler(BaseHTTPRequestHandler):
    """Answers one request whose head the listener has read already."""

    server: _Listener  # type: ignore[assignment]
    request: _Request
    protocol_version = "HTTP/1.1"
    server_version = "dra-agent"
    sys_version = ""
    # Headers and body leave in two writes; with Nagle on, a keep-alive client (Prometheus)
    # waits out its delayed ACK, about 40 ms, for every scrape.
    disable_nagle_algorithm = True
    keep_alive = False

    def setup(self) -> None:
        self.connection = self.request.conn.sock
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, True)
        self.rfile = io.BytesIO(self.request.head)
        self.wfile = self.connection.makefile("wb")

    def handle(self) -> None:
        self.close_connection = True
        self.handle_one_request()
        # Only the head was read: a request with a body cannot share the connection.
        headers = getattr(self, "headers", None)  # absent when the request line was bad
        has_body = headers is not None and (
            headers.get("Content-Length", "0").strip() not in ("", "0")
            or "Transfer-Encoding" in headers
        )
        self.keep_alive = not self.close_connection and not has_body

    def finish(self) -> None:
        try:
            self.wfile.flush()
        finally:
            self.wfile.close()

    def do_GET(self) -> None:
        self._serve(send_body=True)

    def do_HEAD(self) -> None:
        self._serve(send_body=False)

    def _serve(self, send_body: bool) -> None:
        path = urlsplit(self.path).path.rstrip("/") or "/"
        owner = self.server.owner
        if path == "/metrics":
            self._metrics(send_body)
            return
        for kind in ("healthz", "readyz"):
            prefix = "/" + kind
            if path == prefix or path.startswith(prefix + "/"):
                checks = owner.checks_for(kind)
                name = path[len(prefix) + 1 :]
                if name:
                    if name not in checks:
                        self._reply(404, f"no {kind} check named {name!r}\n", send_body)
                        return
                    checks = {name: checks[name]}
                ok, lines = _run_checks(checks)
                verdict = f"{kind} check {'passed' if ok else 'failed'}"
                self._reply(200 if ok else 503, "\n".join([*lines, verdict, ""]), send_body)
                return
        self._reply(404, "try /metrics, /healthz or /readyz\n", send_body)

    def _metrics(self, send_body: bool) -> None:
        encoder, content_type = choose_encoder(self.headers.get("Accept", ""))
        body = encoder(self.server.owner.registry)
        headers = {"Content-Type": content_type}
        if "gzip" in self.headers.get("Accept-Encoding", ""):
            body = gzip.compress(body)
            headers["Content-Encoding"] = "gzip"
        self._send(200, body, headers, send_body)

    def _reply(self, code: int, text: str, send_body: bool) -> None:
        headers = {
            "Content-Type": "text/plain; charset=utf-8",
            # Probe answers change second to second; proxies must not keep them.
            "Cache-Control": "no-store",
        }
        self._send(code, text.encode(), headers, send_body)

    def _send(self, code: int, body: bytes, headers: dict[str, str], send_body: bool) -> None:
        self.send_response(code)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if send_body:
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        # Probes arrive every few seconds: request lines are debug noise, not operator news.
        log.debug("http request", extra={"client": self.client_address[0], "line": format % args})


def _bind(host: str, port: int, reuse_port: bool) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        # As http.server does: a restarted agent rebinds at once over TIME_WAIT connections.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(128)
    except BaseException:
        sock.close()
        raise
    return sock


class HealthServer:
    """Serves ``registry`` on ``/metrics`` and the named checks on ``/healthz`` and ``/readyz``.

    ``address`` is ``host:port``; port 0 picks a free port (read it back from ``.port``).
    ``reuse_port`` sets ``SO_REUSEPORT`` so a DaemonSet rolling update with ``hostNetwork`` can
    start the new agent while the old one still holds the port.
    """

    def __init__(
        self,
        address: str,
        registry: CollectorRegistry,
        checks: Mapping[str, HealthCheck] | None = None,
        ready_checks: Mapping[str, HealthCheck] | None = None,
        *,
        reuse_port: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.address = address
        #: Monotonic seconds, for the request and idle timeouts (tests move it).
        self.clock = clock
        self.registry = registry
        self._host, self._requested_port = parse_address(address)
        self._checks: dict[str, HealthCheck] = dict(checks or {})
        self._ready_checks: dict[str, HealthCheck] = dict(ready_checks or {})
        self._reuse_port = reuse_port
        self._lock = threading.Lock()
        self._server: _Listener | None = None

    def add_check(self, name: str, check: HealthCheck) -> None:
        """Add (or replace) a liveness check; it also counts for readiness."""
        with self._lock:
            self._checks[name] = check

    def add_ready_check(self, name: str, check: HealthCheck) -> None:
        """Add (or replace) a readiness-only check."""
        with self._lock:
            self._ready_checks[name] = check

    def checks_for(self, kind: str) -> dict[str, HealthCheck]:
        """The checks behind ``/healthz`` or ``/readyz``, in registration order."""
        with self._lock:
            if kind == "healthz":
                return dict(self._checks)
            return {**self._checks, **self._ready_checks}

    @property
    def port(self) -> int:
        """The bound port (the real one when 0 was asked for)."""
        if self._server is None:
            raise RuntimeError("HealthServer.port read before start()")
        return int(self._server.address[1])

    @property
    def url(self) -> str:
        host = self._host or "127.0.0.1"
        if host in ("0.0.0.0", "::"):
            host = "127.0.0.1" if host == "0.0.0.0" else "::1"
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    def start(self) -> None:
        """Bind and serve in background threads; raises HealthServerError when it cannot bind."""
        if self._server is not None:
            return
        try:
            sock = _bind(self._host, self._requested_port, self._reuse_port)
        except OSError as err:
            raise HealthServerError(self.address, err.strerror or str(err)) from err
        self._server = _Listener(sock, self, self.clock)
        self._server.start()
        log.info("metrics and health serving", extra={"address": self.url})

    def stop(self) -> None:
        """Stop accepting, close the socket and every waiting connection; idempotent."""
        server, self._server = self._server, None
        if server is not None:
            server.stop()

    def __enter__(self) -> HealthServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
