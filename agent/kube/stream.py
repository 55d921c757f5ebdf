"""A long answer read line by line (a watch), which another thread can end at once."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any

from agent.kube.errors import no_answer

__all__ = ["LineStream"]


class LineStream:
    """Non-empty lines of a chunked answer; ``close`` from another thread ends the reading."""

    def __init__(self, raw: Any, method: str, path: str) -> None:
        self._raw = raw
        self._method = method
        self._path = path
        self._closed = False
        self._lock = threading.Lock()

    def __iter__(self) -> Iterator[bytes]:
        buffer = bytearray()
        try:
            for chunk in self._raw.stream(amt=None, decode_content=False):
                buffer.extend(chunk)
                while (end := buffer.find(b"\n")) != -1:
                    line = bytes(buffer[:end]).strip()
                    del buffer[: end + 1]
                    if line:
                        yield line
            if tail := bytes(buffer).strip():
                yield tail
        except GeneratorExit:
            raise
        except Exception as err:
            if self._closed:
                return
            raise no_answer(self._method, self._path, err) from err
        finally:
            self.close()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        # shutdown() unblocks a read in another thread; close() alone would not.
        try:
            if hasattr(self._raw, "shutdown"):
                self._raw.shutdown()
            else:  # urllib3 < 2.3
                sock = getattr(getattr(self._raw, "connection", None), "sock", None)
                if sock is not None:
                    sock.shutdown(socket.SHUT_RDWR)
        except (OSError, ValueError, RuntimeError, AttributeError):  # already closed
            pass
        try:
            self._raw.release_conn()
            self._raw.close()
        except Exception:  # the connection is being thrown away anyway
            pass

