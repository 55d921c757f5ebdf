"""Short requests to the API server over kept-alive HTTP/1.1 connections of our own.

urllib3 spends about 0.8 M instructions on each request (its pool, Retry and Timeout objects,
http.client's header parsing through the email package); the agent GETs the ResourceClaim on
every NodePrepareResources, so that is CPU per prepare. This speaks just the HTTP/1.1 the API
server needs over plain or ``ssl`` sockets: one request written in one send, an answer with
``Content-Length`` or chunked, read into one buffer, headers split by hand.

Used by ``agent.kube.lean`` for requests only when no proxy is configured; watches (long
streams) and proxied servers keep urllib3.

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

import contextlib
import re
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

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

#: A connection idle longer than this is closed rather than reused: under kube-apiserver's own
#: 90 s idle timeout, so we close first and rarely race its close.
IDLE_S = 85.0
#: The longest status line plus headers read (Go's http.Server allows 1 MiB).
MAX_HEAD = 1 << 20
#: TCP keep-alive probes on an idle connection after this many seconds, as Go's dialer does:
#: a NAT or load balancer that drops silent flows keeps ours.
TCP_KEEPALIVE_S = 30
RECV_SIZE = 65536
#: Methods sent again after the server closed a reused connection without answering.
IDEMPOTENT = frozenset({"GET", "HEAD"})
_BAD_TARGET = re.compile(r"[\x00-\x20\x7f]")
_NO_BODY_STATUSES = frozenset({204, 304})

Timeout = float | tuple[float, float]


class ConnectError(ConnectionError):
    """No connection to the server (refused, not resolved, TLS handshake failed); the OS or
    ssl error is the ``__cause__``."""


class ConnectTimeoutError(TimeoutError):
    """No connection (or no free one from the pool) in time."""


class ReadTimeoutError(TimeoutError):
    """The server did not answer (or stopped answering) in time."""


class ServerClosedError(ConnectionResetError):
    """The server closed the connection before its answer was whole."""


class BadAnswerError(ValueError):
    """What came back is not an HTTP/1.x answer we can read."""


class _NothingSentError(Exception):
    """Internal: the request did not fully go out, so the server cannot have acted on it."""

    def __init__(self, err: BaseException) -> None:
        super().__init__(str(err))
        self.err = err


class RawAnswer:
    """A whole answer: header names in lower case, repeated ones joined by ", ".

    A plain class: a frozen dataclass's ``__init__`` (``object.__setattr__`` per field)
    cost 6 k instructions of a GET's 143 k, for an object ``KubeHTTP`` drops at once."""

    __slots__ = ("body", "headers", "reason", "status")

    def __init__(self, status: int, reason: str, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.reason = reason
        self.headers = headers
        self.body = body

    def __repr__(self) -> str:
        return f"RawAnswer({self.status} {self.reason}, {len(self.body)} bytes)"


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where connections go: ``server`` (scheme://host[:port][/prefix]) and its TLS."""

    server: str
    #: None for plain http.
    tls: ssl.SSLContext | None = None
    #: The name the certificate must carry (and SNI), when not the server's host.
    tls_server_name: str | None = None
    #: Why the TLS context could not be built (a CA that does not load): every connection
    #: fails with it, as urllib3's do.
    broken_tls: BaseException | None = None
    host: str = field(init=False)
    port: int = field(init=False)
    prefix: str = field(init=False)
    host_header: str = field(init=False)

    def __post_init__(self) -> None:
        parts = urlsplit(self.server)
        host = parts.hostname or ""
        default = 443 if parts.scheme == "https" else 80
        port = parts.port or default
        bracketed = f"[{host}]" if ":" in host else host
        object.__setattr__(self, "host", host)
        object.__setattr__(self, "port", port)
        object.__setattr__(self, "prefix", parts.path.rstrip("/"))
        # As http.client writes Host: the port only where it is not the scheme's default.
        object.__setattr__(self, "host_header",
                           bracketed if port == default else f"{bracketed}:{port}")

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


class _Deadline:
    """The time left for each step of one request, for either form of timeout."""

    __slots__ = ("connect_s", "end", "read_s")

    def __init__(self, timeout: Timeout, now: float) -> None:
        if isinstance(timeout, tuple):
            self.connect_s, self.read_s = float(timeout[0]), float(timeout[1])
            self.end: float | None = None
        else:
            self.connect_s = self.read_s = float(timeout)
            self.end = now + self.connect_s

    def connect(self) -> float:
        return self._left(self.connect_s)

    def describe(self) -> str:
        if self.end is None:
            return f"read timeout {self.read_s:g} s"
        return f"timeout {self.connect_s:g} s"

    def read(self) -> float:
        return self._left(self.read_s)

    def _left(self, step: float) -> float:
        if self.end is None:
            return step
        left = self.end - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out")
        return left


class _Connection:
    """One socket, a receive buffer and the poll that tells a closed idle connection."""

    __slots__ = ("_poll", "answered", "buf", "generation", "requests", "sock", "used_at")

    def __init__(self, sock: socket.socket, generation: int) -> None:
        self.sock = sock
        #: The pool's generation it was opened in: one opened before ``close`` is not kept.
        self.generation = generation
        self.buf = bytearray()
        self.used_at = 0.0
        self.requests = 0
        #: Whether any byte of the current request's answer has come.
        self.answered = False
        self._poll = select.poll()
        self._poll.register(sock.fileno(), select.POLLIN | select.POLLPRI)

    def looks_alive(self) -> bool:
        """Whether an idle connection can be reused: a FIN, a reset, a TLS close_notify or
        stray bytes all poll readable, and each means it cannot."""
        if self.buf:
            return False
        try:
            if not self._poll.poll(0):
                return True
        except (OSError, ValueError):
            return False
        # Readable: a TLS record that carries no data (a late session ticket, a key update)
        # is consumed here and leaves the connection good; anything else ends it.
        try:
            self.sock.setblocking(False)
            data = self.sock.recv(RECV_SIZE)
        except (ssl.SSLWantReadError, BlockingIOError):
            return True
        except OSError:
            return False
        if data:
            self.buf += data
        return False

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    # -- reading ----------------------------------------------------------------------------

    def _fill(self, deadline: _Deadline) -> None:
        self.sock.settimeout(deadline.read())
        data = self.sock.recv(RECV_SIZE)
        if not data:
            raise ServerClosedError("the server closed the connection before its answer "
                                    "was complete")
        self.answered = True
        self.buf += data

    def read_answer(self, method: str, deadline: _Deadline) -> tuple[RawAnswer, bool]:
        """The answer and whether the connection can be reused."""
        while True:
            status, reason, version, headers = self._read_head(deadline)
            if not (100 <= status < 200) or status == 101:
                break  # 1xx (103 Early Hints, an unasked-for 100) come before the answer
        tokens = headers.get("connection", "").lower()
        reusable = ("close" not in tokens) if version == "HTTP/1.1" else ("keep-alive" in tokens)
        if method == "HEAD" or status in _NO_BODY_STATUSES:
            body = b""
        elif "chunked" in headers.get("transfer-encoding", "").lower():
            body = self._read_chunked(deadline)
        elif (length := headers.get("content-length")) is not None:
            body = self._read_exactly(_content_length(length), deadline)
        else:  # delimited by the server closing the connection (HTTP/1.0 style)
            body = self._read_to_close(deadline)
            reusable = False
        return RawAnswer(status, reason, headers, body), reusable and not self.buf

    def _read_head(self, deadline: _Deadline) -> tuple[int, str, str, dict[str, str]]:
        buf = self.buf
        while (end := buf.find(b"\r\n\r\n")) < 0:
            if len(buf) > MAX_HEAD:
                raise BadAnswerError("the answer's headers are longer than 1 MiB")
            self._fill(deadline)
        lines = buf[:end].decode("latin-1").split("\r\n")
        del buf[: end + 4]
        version, _, rest = lines[0].partition(" ")
        code, _, reason = rest.partition(" ")
        if not version.startswith("HTTP/1.") or len(code) != 3 or not code.isdigit():
            raise BadAnswerError(f"not an HTTP answer: {lines[0][:80]!r}")
        headers: dict[str, str] = {}
        name = ""
        for line in lines[1:]:
            if line[:1] in (" ", "\t") and name:  # obsolete line folding
                headers[name] += " " + line.strip()
                continue
            name, sep, value = line.partition(":")
            name = name.lower()
            if not sep or not name or name != name.strip():
                raise BadAnswerError(f"bad header line in the answer: {line[:80]!r}")
            value = value.strip()
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        return int(code), reason.strip(), version, headers

    def _read_exactly(self, n: int, deadline: _Deadline) -> bytes:
        buf = self.buf
        while len(buf) < n:
            self._fill(deadline)
        body = bytes(buf[:n])
        del buf[:n]
        return body

    def _read_chunked(self, deadline: _Deadline) -> bytes:
        buf = self.buf
        body = bytearray()
        while True:
            while (end := buf.find(b"\r\n")) < 0:
                if len(buf) > 4096:
                    raise BadAnswerError("a chunk size line of the answer is too long")
                self._fill(deadline)
            size_text = bytes(buf[:end]).split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise BadAnswerError(f"bad chunk size in the answer: {size_text[:20]!r}") \
                    from None
            if size < 0:
                raise BadAnswerError("negative chunk size in the answer")
            del buf[: end + 2]
            if size == 0:
                break
            while len(buf) < size + 2:
                self._fill(deadline)
            if buf[size:size + 2] != b"\r\n":
                raise BadAnswerError("a chunk of the answer does not end in CRLF")
            body += buf[:size]
            del buf[: size + 2]
        # Trailers (never sent by the API server) up to the empty line.
        while True:
            while (end := buf.find(b"\r\n")) < 0:
                if len(buf) > MAX_HEAD:
                    raise BadAnswerError("the answer's trailers are longer than 1 MiB")
                self._fill(deadline)
            del buf[: end + 2]
            if end == 0:
                return bytes(body)

    def _read_to_close(self, deadline: _Deadline) -> bytes:
        while True:
            self.sock.settimeout(deadline.read())
            data = self.sock.recv(RECV_SIZE)
            if not data:
                body = bytes(self.buf)
                self.buf.clear()
                return body
            self.answered = True
            self.buf += data


def _content_length(value: str) -> int:
    # Repeated identical values arrive joined ("12, 12"); differing ones are an error.
    values = {v.strip() for v in value.split(",")}
    if len(values) != 1 or not (n := values.pop()).isdigit():
        raise BadAnswerError(f"bad Content-Length in the answer: {value[:40]!r}")
    return int(n)


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
        self._idle: list[_Connection] = []  # most recently used last
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
        deadline = _Deadline(timeout, self._clock())
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
                    raise _NothingSentError(err) from err
                answer, reusable = conn.read_answer(method, deadline)
            except _NothingSentError as err:
                self._drop(conn)
                if reused and attempt == 1:
                    continue  # it never reached the server whole: safe for any method
                raise ServerClosedError(f"sending to {address}: {err.err}") from err.err
            except TimeoutError as err:
                self._drop(conn)
                raise ReadTimeoutError(f"no answer from {address} in time "
                                       f"({deadline.describe()})") from err
            except ConnectionResetError as err:  # ServerClosedError among them
                self._drop(conn)
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
                self._drop(conn)
                raise ConnectError(f"reading the answer from {address}: {err}") from err
            except BaseException:
                self._drop(conn)
                raise
            conn.requests += 1
            self._give_back(conn, reusable)
            return answer
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

    def _take(self, deadline: _Deadline) -> tuple[_Connection, bool]:
        """A connection to use and whether it served requests before."""
        stale: list[_Connection] = []
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

    def _connect(self, deadline: _Deadline) -> _Connection:
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
        return _Connection(sock, generation)

    def _give_back(self, conn: _Connection, reusable: bool) -> None:
        with self._lock:
            if reusable and conn.generation == self._generation:
                conn.used_at = self._clock()
                self._idle.append(conn)
                self._notify()
                return
            self._open -= 1
            self._notify()
        conn.close()

    def _drop(self, conn: _Connection) -> None:
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
