"""Short requests to the API server over kept-alive HTTP/1.1 connections of our own.

urllib3 spends about 0.8 M instructions on each request (its pool, Retry and Timeout objects,
http.client's header parsing through the email package); the agent GETs the ResourceClaim on
every NodePrepareResources, so that is CPU per prepare. This speaks just the HTTP/1.1 the API
server needs over plain or ``ssl`` sockets: one request written in one send, an answer with
``Content-Length`` or chunked, read into one buffer, headers split by hand.

Used by ``agent.kube.lean`` when no proxy is configured, for requests and, in a pool of their
own, watches (``open_stream``: the answer read as it comes); proxied servers keep urllib3.

Connections: at most ``maxsize`` open at once (a request beyond that waits, within its
timeout, for one to be free), the most recently used reused first, dropped after ``IDLE_S``
idle or when the server said ``Connection: close``. An idle connection the server has closed
(keep-alive timeout, restart) is seen before it is used (it polls readable) and dropped. When
the close races the request, the request is sent again once on a new connection only where
that is safe: the request never fully went out, or it is a GET/HEAD and not one byte of an
answer came. A POST/PUT/PATCH/DELETE the server may have read is never replayed; it fails
as a ``ServerClosedError``.

Timeouts as ``KubeHTTP`` takes them: a float is a deadline for the whole request (waiting
for a connection, connecting, sending, reading); ``(connect, read)`` bounds connecting (and
waiting for a connection) by ``connect`` and each send or read by ``read``, as urllib3 does.
"""

from __future__ import annotations

import re
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from typing import TypeVar

from agent.kube.http11 import (
    IDEMPOTENT,
    IDLE_S,
    TCP_KEEPALIVE_S,
    BadAnswerError,
    ConnectError,
    Connection,
    ConnectTimeoutError,
    Deadline,
    Endpoint,
    NothingSentError,
    RawAnswer,
    ReadTimeoutError,
    ServerClosedError,
    Timeout,
)
from agent.kube.streamed import StreamedAnswer

_T = TypeVar("_T")

#: A request path with a control character or a space could split the request line.
_BAD_TARGET = re.compile(r"[\x00-\x20\x7f]")

__all__ = [
    "IDLE_S",
    "BadAnswerError",
    "ConnectError",
    "ConnectTimeoutError",
    "Endpoint",
    "KeepAlivePool",
    "RawAnswer",
    "ReadTimeoutError",
    "ServerClosedError",
]


class KeepAlivePool:
    """Kept-alive connections to one ``Endpoint``; thread-safe, at most ``maxsize`` open."""

    def __init__(
        self,
        endpoint: Endpoint,
        maxsize: int = 16,
        idle_s: float = IDLE_S,
        clock: Callable[[], float] = time.monotonic,
        user_agent: str = "dra-agent",
    ) -> None:
        if maxsize < 1:
            raise ValueError("maxsize must be at least 1")
        self.endpoint = endpoint
        self.maxsize = maxsize
        self.idle_s = idle_s
        self._clock = clock
        self._lock = threading.Lock()
        self._free = threading.Condition(self._lock)
        self._waiting = 0
        self._idle: list[Connection] = []  # most recently used last
        self._open = 0
        self._generation = 0
        #: Connections opened, for tests and the log of a rebuild.
        self.opened = 0
        # What every request starts with, built once.
        self._fixed = f"Host: {endpoint.host_header}\r\nUser-Agent: {user_agent}\r\n" \
                      "Accept-Encoding: identity\r\n"

    @property
    def open_connections(self) -> int:
        return self._open

    def __repr__(self) -> str:
        return f"KeepAlivePool({self.endpoint.server}, open={self._open}/{self.maxsize})"

    def request(
        self,
        method: str,
        target: str,
        headers: Mapping[str, str],
        body: bytes | None,
        timeout: Timeout,
    ) -> RawAnswer:
        """Send one request (``target``: path and query, under the server's prefix) and
        read its whole answer. Raises ``ConnectError``, ``ConnectTimeoutError``,
        ``ReadTimeoutError``, ``ServerClosedError``, ``BadAnswerError`` or ``ValueError``
        (a header value that cannot be sent)."""
        data = self._encode(method, target, headers, body)
        deadline = Deadline(timeout, self._clock())
        conn, (answer, reusable) = self._exchange(
            method, data, deadline, lambda conn: conn.read_answer(method, deadline))
        conn.requests += 1
        self._give_back(conn, reusable)
        return answer

    def open_stream(
        self,
        method: str,
        target: str,
        headers: Mapping[str, str],
        timeout: Timeout,
    ) -> StreamedAnswer:
        """Send a request without a body and read its answer's head: the body (a watch's
        events) is read as it comes from the ``StreamedAnswer``, which holds the connection
        until it is closed. ``timeout`` bounds each read as for ``request``. Raises as
        ``request`` does."""
        data = self._encode(method, target, headers, None)
        deadline = Deadline(timeout, self._clock())
        conn, head = self._exchange(method, data, deadline,
                                    lambda conn: conn.read_head(method, deadline))
        conn.requests += 1
        return StreamedAnswer(self.discard, conn, head, deadline)

    def _exchange(self, method: str, data: bytes, deadline: Deadline,
                  read: Callable[[Connection], _T]) -> tuple[Connection, _T]:
        """Send ``data`` over a connection and ``read`` its answer (or the answer's head),
        sent again once where that is safe; the connection is the caller's after."""
        address = self.endpoint.address
        for attempt in (1, 2):
            conn, reused = self._take(deadline)
            conn.answered = False
            try:
                try:
                    conn.sock.settimeout(deadline.read())
                    conn.sock.sendall(data)
                except TimeoutError:
                    raise
                except OSError as err:
                    raise NothingSentError(err) from err
                return conn, read(conn)
            except NothingSentError as err:
                self.discard(conn)
                if reused and attempt == 1:
                    continue  # it never reached the server whole: safe for any method
                raise ServerClosedError(f"sending to {address}: {err.err}") from err.err
            except TimeoutError as err:
                self.discard(conn)
                raise ReadTimeoutError(f"no answer from {address} in time "
                                       f"({deadline.describe()})") from err
            except ConnectionResetError as err:  # ServerClosedError among them
                self.discard(conn)
                if method not in IDEMPOTENT:
                    # It may have been applied: never sent twice.
                    raise ServerClosedError(
                        f"{address} closed the connection before answering; {method} is not "
                        "sent again (the server may have applied it)") from err
                if reused and attempt == 1 and not conn.answered:
                    # Closed idle by the server as we sent: the usual race of keep-alive.
                    continue
                raise ServerClosedError(f"{address} closed the connection before answering"
                                        ) from err
            except OSError as err:  # ssl errors, host unreachable mid-request
                self.discard(conn)
                raise ConnectError(f"reading the answer from {address}: {err}") from err
            except BaseException:
                self.discard(conn)
                raise
        raise AssertionError("unreachable")  # pragma: no cover (the loop returns or raises)

    def _encode(self, method: str, target: str, headers: Mapping[str, str],
                body: bytes | None) -> bytes:
        if _BAD_TARGET.search(target) or not target.startswith("/"):
            raise ValueError(f"the request path {target[:80]!r} cannot be sent")
        lines = [f"{method} {self.endpoint.prefix}{target} HTTP/1.1\r\n", self._fixed]
        for name, value in headers.items():
            if "\n" in value or "\r" in value:
                raise ValueError(f"the {name} header value contains a line break")
            lines.append(f"{name}: {value}\r\n")
        if body is not None or method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(body or b'')}\r\n")
        lines.append("\r\n")
        try:
            head = "".join(lines).encode("latin-1")
        except UnicodeEncodeError:
            raise ValueError("a header value is not latin-1 text") from None
        return head + body if body else head

    # -- the pool ---------------------------------------------------------------------------

    def _take(self, deadline: Deadline) -> tuple[Connection, bool]:
        """A connection to use and whether it served requests before."""
        stale: list[Connection] = []
        wait_until: float | None = None
        try:
            with self._lock:
                while True:
                    now = self._clock()
                    while self._idle:
                        conn = self._idle.pop()
                        if now - conn.used_at < self.idle_s and conn.looks_alive():
                            return conn, True
                        self._open -= 1
                        stale.append(conn)
                    if self._open < self.maxsize:
                        self._open += 1
                        break
                    # All in use: wait for one, within the time a connect may take.
                    try:
                        if wait_until is None:
                            wait_until = time.monotonic() + deadline.connect()
                        left = wait_until - time.monotonic()
                    except TimeoutError:
                        left = 0.0
                    if left <= 0:
                        raise ConnectTimeoutError(
                            f"no free connection to {self.endpoint.address} in time "
                            f"(all {self.maxsize} in use)")
                    self._waiting += 1
                    try:
                        self._free.wait(left)
                    finally:
                        self._waiting -= 1
        finally:
            for conn in stale:
                conn.close()
        try:
            return self._connect(deadline), False
        except BaseException:
            with self._lock:
                self._open -= 1
                self._notify()
            raise

    def _connect(self, deadline: Deadline) -> Connection:
        ep = self.endpoint
        if ep.broken_tls is not None:
            raise ConnectError(f"TLS setup for {ep.address} failed: {ep.broken_tls}") \
                from ep.broken_tls
        try:
            sock = socket.create_connection((ep.host, ep.port), timeout=deadline.connect())
        except TimeoutError as err:
            raise ConnectTimeoutError(f"connecting to {ep.address} timed out") from err
        except OSError as err:
            raise ConnectError(f"cannot connect to {ep.address}: {err}") from err
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            if hasattr(socket, "TCP_KEEPIDLE"):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, TCP_KEEPALIVE_S)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, TCP_KEEPALIVE_S)
            if ep.tls is not None:
                sock.settimeout(deadline.connect())
                sock = ep.tls.wrap_socket(sock, server_hostname=ep.tls_server_name or ep.host)
        except TimeoutError as err:
            sock.close()
            raise ConnectTimeoutError(f"TLS handshake with {ep.address} timed out") from err
        except (OSError, ssl.SSLError) as err:
            sock.close()
            raise ConnectError(f"TLS handshake with {ep.address} failed: {err}") from err
        with self._lock:
            self.opened += 1
            generation = self._generation
        return Connection(sock, generation)

    def _give_back(self, conn: Connection, reusable: bool) -> None:
        with self._lock:
            if reusable and conn.generation == self._generation:
                conn.used_at = self._clock()
                self._idle.append(conn)
                self._notify()
                return
            self._open -= 1
            self._notify()
        conn.close()

    def discard(self, conn: Connection) -> None:
        """Close a connection taken from the pool rather than give it back."""
        conn.close()
        with self._lock:
            self._open -= 1
            self._notify()

    def _notify(self) -> None:
        # Called with the lock held; a Condition's notify is only paid when someone waits.
        if self._waiting:
            self._free.notify()

    def close(self) -> None:
        """Close the idle connections; those in use close when their request ends. The pool
        stays usable (as urllib3's ``clear``): later requests open new connections."""
        with self._lock:
            self._generation += 1
            idle, self._idle = self._idle, []
            self._open -= len(idle)
            self._free.notify_all()
        for conn in idle:
            conn.close()
