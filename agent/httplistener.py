"""The metrics/health server's sockets: no client may cost a thread while it is slow.

The port is reachable from the whole cluster (hostNetwork). One thread reads every
connection's request without blocking and hands complete requests to ``WORKERS`` threads;
connections are capped (the longest waiting is closed for a new one) and a request must arrive
within ``REQUEST_TIMEOUT_S``. Before, each connection had its own thread: 16 slow clients held
654 of them. The answers themselves are agent/httproutes.py's.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import selectors
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent.httproutes import Handler, Site

__all__ = [
    "IDLE_TIMEOUT_S",
    "MAX_CONNECTIONS",
    "MAX_HEADER_BYTES",
    "REQUEST_TIMEOUT_S",
    "WORKERS",
    "WRITE_TIMEOUT_S",
    "Listener",
]

# One name for the whole metrics/health server in the agent's log.
log = logging.getLogger("agent.httpserver")

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

    @property
    def sock(self) -> socket.socket:
        return self.conn.sock


class Listener:
    """One thread reads requests from every connection without blocking; ``WORKERS``
    threads answer complete ones. A slow or idle client costs a socket, never a thread."""

    def __init__(self, sock: socket.socket, owner: Site, clock: Callable[[], float]) -> None:
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
            # With no connection to time out, sleep until one comes (or stop() wakes us):
            # an idle agent's listener costs no wake-up. Else every half second, to expire.
            for key, _ in self._select.select(timeout=0.5 if self._waiting else None):
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
                handler = Handler(request, conn.address, self)  # type: ignore[arg-type]
                keep = handler.keep_alive
            except Exception:  # a broken connection or a bug: this request only
                log.debug("http request failed", exc_info=True)
            if not keep or self._stopping.is_set():
                conn.sock.close()
            self._back.put(conn)
            self._wake()

