"""An answer read as it comes over one of our own connections: a watch's events.

``KeepAlivePool.open_stream`` sends the request and reads the head; this reads the body piece
by piece as the server sends it (each chunk of a chunked answer as soon as any of it is
there, so an event is not held back waiting for a buffer to fill), each read bounded by the
request's timeout. It has the shape of urllib3's ``HTTPResponse`` that ``LineStream`` reads
(``status``, ``headers``, ``data``, ``stream``, ``shutdown``, ``release_conn``, ``close``),
so a watch reads the same whichever transport carries it.

The connection is closed at the end, never given back: the API server ends a watch after
its ``timeoutSeconds`` (minutes), and a reader stopped by ``shutdown`` from another thread
leaves the connection in no state to reuse; one TLS handshake per watch is what that costs.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent.kube.http11 import Connection, Deadline, Head

__all__ = ["StreamedAnswer"]


class StreamedAnswer:
    """The head of an answer and its body as it comes; ``shutdown`` from another thread
    ends a read in progress."""

    def __init__(self, discard: Callable[[Connection], None], conn: Connection, head: Head,
                 deadline: Deadline) -> None:
        # ``discard`` closes the connection and frees its place in the pool it came from
        # (``KeepAlivePool.discard``); a callable, so this module need not know the pool.
        self._discard = discard
        self._conn = conn
        self._head = head
        self._deadline = deadline
        self._lock = threading.Lock()
        self._released = False
        self.status = head.status
        self.reason = head.reason
        self.headers = head.headers

    def __repr__(self) -> str:
        return f"StreamedAnswer({self.status} {self.reason}, {self._head.framing})"

    @property
    def data(self) -> bytes:
        """The rest of the body, whole (an error's Status), and the connection closed."""
        try:
            return b"".join(self.stream())
        finally:
            self.release_conn()

    def stream(self, amt: Any = None, decode_content: bool = False) -> Iterator[bytes]:
        """The body's bytes as they arrive (``amt`` and ``decode_content`` as urllib3 takes
        them: any amount, never decoded, since ``Accept-Encoding: identity`` was sent)."""
        head, conn, deadline = self._head, self._conn, self._deadline
        if head.framing == "none":
            return
        if head.framing == "length":
            left = head.length
            while left > 0:
                piece = _take(conn, left, deadline)
                left -= len(piece)
                yield piece
            return
        if head.framing == "close":
            while True:
                if not conn.buf:
                    try:
                        conn.fill_buffer(deadline)
                    except ConnectionResetError:  # the server's close ends the body
                        return
                piece = bytes(conn.buf)
                conn.buf.clear()
                yield piece
        while size := conn.chunk_size(deadline):
            left = size
            while left > 0:
                piece = _take(conn, left, deadline)
                left -= len(piece)
                yield piece
            conn.chunk_end(deadline)

    def shutdown(self) -> None:
        """End a read blocked in another thread: it returns at once (the end of the data,
        or an error the reader's owner knows to ignore)."""
        with contextlib.suppress(OSError, ValueError):  # already closed
            self._conn.sock.shutdown(socket.SHUT_RDWR)

    def release_conn(self) -> None:
        """Close the connection and give its place in the pool back; once."""
        with self._lock:
            if self._released:
                return
            self._released = True
        self._discard(self._conn)

    def close(self) -> None:
        self.release_conn()


def _take(conn: Connection, most: int, deadline: Deadline) -> bytes:
    """Up to ``most`` bytes of the body from the connection's buffer, read first if empty."""
    if not conn.buf:
        conn.fill_buffer(deadline)
    piece = bytes(conn.buf[:most])
    del conn.buf[:most]
    return piece
