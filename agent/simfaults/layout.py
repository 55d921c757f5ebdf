"""Where the inbox and its locks are, for the writer and the agent alike.

``<plugin dir>/simulated-faults/`` holds the requests; ``<plugin dir>/simulated-faults.lock``
beside it is held (shared) by every running simulated agent; ``.lock`` inside it is held by
each poll of an agent and by a writer withdrawing a request.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from agent.common import filelock
from agent.common.config import SIMULATED_FAULTS_SUBDIR

__all__ = [
    "AGENT_LOCK_SUFFIX",
    "INBOX_SUBDIR",
    "LOCK_NAME",
    "REASON_SUFFIX",
    "REJECTED_SUBDIR",
    "agent_lock_path",
    "inbox_lock",
]

#: The inbox, under the agent's plugin directory (``Config.simulated_faults_dir``).
INBOX_SUBDIR = SIMULATED_FAULTS_SUBDIR
#: Beside the inbox: the lock a running simulated agent holds (shared) for its life.
AGENT_LOCK_SUFFIX = ".lock"
#: Where refused requests go, inside the inbox, each with ``<name>.reason``.
REJECTED_SUBDIR = ".rejected"
REASON_SUFFIX = ".reason"
LOCK_NAME = ".lock"


def agent_lock_path(inbox: Path) -> Path:
    """``<plugin dir>/simulated-faults.lock``, held by every running simulated agent."""
    return inbox.with_name(inbox.name + AGENT_LOCK_SUFFIX)


@contextlib.contextmanager
def inbox_lock(inbox: Path, wait_s: float = 0.0) -> Iterator[bool]:
    """Hold the inbox's flock while the block runs; yields whether it was had within
    ``wait_s`` (False too when the lock file cannot be opened: a symlink, no permission)."""
    try:
        fd = filelock.open_lock(inbox / LOCK_NAME)
    except OSError:
        yield False
        return
    try:
        yield filelock.lock(fd, wait_s=wait_s)
    finally:
        os.close(fd)  # releases the lock
