"""HTTP/1.1 on one connection to the API server: a request's deadline, its answer read.

What ``agent.kube.keepalive``'s pool sends its requests over: the status line and headers
split by hand, bodies with ``Content-Length``, chunked or until the close, each read bounded
by the request's deadline, and the errors a caller tells apart (nothing sent, the server
closed, no answer in time, an answer that is not HTTP). The why of it is in
``agent.kube.keepalive``.
"""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

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


class NothingSentError(Exception):
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
class Head:
    """An answer's status line and headers, and how its body is delimited: ``framing`` is
    "none", "chunked", "length" (``length`` bytes) or "close" (until the server closes)."""

    status: int
    reason: str
    headers: dict[str, str]
    framing: str
    length: int
    #: Whether the connection may carry another request once the body is read.
    reusable: bool


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


class Deadline:
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


class Connection:
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

    def _fill(self, deadline: Deadline) -> None:
        self.sock.settimeout(deadline.read())
        data = self.sock.recv(RECV_SIZE)
        if not data:
            raise ServerClosedError("the server closed the connection before its answer "
                                    "was complete")
        self.answered = True
        self.buf += data

    def read_answer(self, method: str, deadline: Deadline) -> tuple[RawAnswer, bool]:
        """The answer and whether the connection can be reused."""
        head = self.read_head(method, deadline)
        if head.framing == "none":
            body = b""
        elif head.framing == "chunked":
            body = self._read_chunked(deadline)
        elif head.framing == "length":
            body = self._read_exactly(head.length, deadline)
        else:
            body = self._read_to_close(deadline)
        return (RawAnswer(head.status, head.reason, head.headers, body),
                head.reusable and not self.buf)

    def read_head(self, method: str, deadline: Deadline) -> Head:
        """The status line and headers of the answer (past any 1xx), and how its body is
        delimited; the body is left in the buffer and the socket."""
        while True:
            status, reason, version, headers = self._read_head(deadline)
            if not (100 <= status < 200) or status == 101:
                break  # 1xx (103 Early Hints, an unasked-for 100) come before the answer
        tokens = headers.get("connection", "").lower()
        reusable = ("close" not in tokens) if version == "HTTP/1.1" else ("keep-alive" in tokens)
        length = 0
        if method == "HEAD" or status in _NO_BODY_STATUSES:
            framing = "none"
        elif "chunked" in headers.get("transfer-encoding", "").lower():
            framing = "chunked"
        elif (value := headers.get("content-length")) is not None:
            framing, length = "length", _content_length(value)
        else:  # delimited by the server closing the connection (HTTP/1.0 style)
            framing, reusable = "close", False
        return Head(status, reason, headers, framing, length, reusable)

    def chunk_size(self, deadline: Deadline) -> int:
        """The size line of the next chunk, consumed; at the last chunk (0) its trailers
        are consumed too."""
        buf = self.buf
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
            self._skip_trailers(deadline)
        return size

    def chunk_end(self, deadline: Deadline) -> None:
        """The CRLF after a chunk's data, consumed."""
        while len(self.buf) < 2:
            self._fill(deadline)
        if self.buf[:2] != b"\r\n":
            raise BadAnswerError("a chunk of the answer does not end in CRLF")
        del self.buf[:2]

    def fill_buffer(self, deadline: Deadline) -> None:
        """Read more of the answer into ``buf``; ``ServerClosedError`` at the end of the
        stream."""
        self._fill(deadline)

    def _read_head(self, deadline: Deadline) -> tuple[int, str, str, dict[str, str]]:
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

    def _read_exactly(self, n: int, deadline: Deadline) -> bytes:
        buf = self.buf
        while len(buf) < n:
            self._fill(deadline)
        body = bytes(buf[:n])
        del buf[:n]
        return body

    def _read_chunked(self, deadline: Deadline) -> bytes:
        buf = self.buf
        body = bytearray()
        while size := self.chunk_size(deadline):
            while len(buf) < size + 2:
                self._fill(deadline)
            if buf[size:size + 2] != b"\r\n":
                raise BadAnswerError("a chunk of the answer does not end in CRLF")
            body += buf[:size]
            del buf[: size + 2]
        return bytes(body)

    def _skip_trailers(self, deadline: Deadline) -> None:
        """Trailers (never sent by the API server) up to the empty line."""
        buf = self.buf
        while True:
            while (end := buf.find(b"\r\n")) < 0:
                if len(buf) > MAX_HEAD:
                    raise BadAnswerError("the answer's trailers are longer than 1 MiB")
                self._fill(deadline)
            del buf[: end + 2]
            if end == 0:
                return

    def _read_to_close(self, deadline: Deadline) -> bytes:
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
