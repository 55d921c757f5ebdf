"""Reading a file the agent owns but does not trust: the checkpoint, its own CDI specs, boot_id.

Whoever can write the plugin or CDI directory can put anything under one of our names: a
symlink to ``/dev/zero`` (read it whole and the agent is OOM-killed), a FIFO (an ordinary open
waits for a writer for ever), a file larger than the DaemonSet's memory limit. ``read_capped``
refuses all of them with ``UnsafeFileError`` before reading more than ``cap + 1`` bytes:

* ``O_NOFOLLOW``: a symlink at the final component is refused, never followed;
* ``O_NONBLOCK``: opening a FIFO or a device returns at once instead of waiting (it changes
  nothing for a regular file); ``O_NOCTTY``: a tty never becomes our controlling terminal;
* ``fstat`` of the open descriptor (not of the name, which could be swapped between a check
  and the open) must say regular file;
* reads stop after ``cap + 1`` bytes, so a file that lies about its size (``/proc`` files say
  0, a file growing while read) still costs at most the cap.

A missing file stays ``FileNotFoundError`` (and other open failures ``OSError``): callers
decide whether absence is normal.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_CHUNK = 1 << 20


class UnsafeFileError(Exception):
    """The file is not one the agent reads: not a regular file, a symlink, or over the cap."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path} {reason}")
        self.path = path
        self.reason = reason


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def read_capped(path: Path, cap: int) -> bytes:
    """The bytes of the regular file ``path``, which must be at most ``cap`` bytes long."""
    try:
        fd = os.open(path, _FLAGS)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise UnsafeFileError(path, "is a symbolic link (never followed)") from err
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFileError(path, f"is {_kind(st.st_mode)}, not a regular file")
        if st.st_size > cap:
            raise UnsafeFileError(path, f"is {st.st_size} bytes, over the {cap}-byte cap")
        chunks: list[bytes] = []
        total = 0
        while total <= cap:
            chunk = os.read(fd, min(_CHUNK, cap + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > cap:
            raise UnsafeFileError(path, f"grew past the {cap}-byte cap while read")
        return b"".join(chunks)
    finally:
        os.close(fd)
