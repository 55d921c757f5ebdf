"""The agent's one way to hold an ``flock``: a lock file opened safely, taken blocking or within
a wait, shared or exclusive.

Why ``flock``: the kernel lets go of it when its holder dies, ``kill -9`` included, so a
crashed agent never leaves a stale lock behind; and it excludes another process (the other
instance of a rolling update, a ``dra-agent simulate`` writer) as well as another open of the
same file in this process.

Lock files live in directories that others may write into (the plugin directory, the fault
inbox), so one is never opened through a symlink (``O_NOFOLLOW``: ``ELOOP``; ``O_CREAT`` would
otherwise create the link's target wherever it points) and an open never waits on a FIFO
planted at its name (``O_NONBLOCK``, which ``flock`` ignores: it still blocks when asked to).
What a holder does with something planted (set it aside, refuse to start, give up for now)
is its own policy, and each holder says which.

Users: the checkpoint store, the framework's rolling-update lock, the instance lock, and the
simulated fault inbox.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

_CREATE = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
#: An existing lock, only looked at: ``flock`` needs no write access.
_EXISTING = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
#: How often a lock taken within a wait is tried again.
RETRY_S = 0.01


def open_lock(path: Path, *, create: bool = True) -> int:
    """A descriptor of the lock file ``path`` (made 0600 when missing, unless not ``create``).

    A symlink at ``path`` is ``OSError(ELOOP)``; whether what was opened is a regular file is
    the caller's to check (``os.fstat``), where its policy needs it.
    """
    if create:
        return os.open(path, _CREATE, 0o600)
    return os.open(path, _EXISTING)


def lock(fd: int, *, shared: bool = False, wait_s: float | None = None,
         stop: threading.Event | None = None) -> bool:
    """Take the ``flock`` on ``fd``; whether it was had.

    ``wait_s`` None blocks until it is (always True). Otherwise it is tried without blocking,
    again every ``RETRY_S``, until ``wait_s`` has passed (0: once) or ``stop`` is set.
    """
    op = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
    if wait_s is None:
        fcntl.flock(fd, op)
        return True
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, op | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
        if stop is None:
            time.sleep(RETRY_S)
        elif stop.wait(RETRY_S):
            return False


def unlock(fd: int) -> None:
    """Let go of the ``flock`` on ``fd`` and keep the file open (closing it lets go too)."""
    fcntl.flock(fd, fcntl.LOCK_UN)


@contextlib.contextmanager
def held(path: Path, *, shared: bool = False, wait_s: float | None = None) -> Iterator[bool]:
    """``open_lock`` and ``lock`` for the block, closed after it; yields whether it was had
    (see ``lock``). An open that fails raises."""
    fd = open_lock(path)
    try:
        yield lock(fd, shared=shared, wait_s=wait_s)
    finally:
        os.close(fd)  # lets go of the lock
