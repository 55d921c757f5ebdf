"""The writer's side (``dra-agent simulate fault``): leave a request, learn what became of it.

A request is a temporary dot-file renamed into place, so the agent never reads half of one;
``agent_problem`` says, before writing, whether a simulated agent runs here at all.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
import time
from enum import StrEnum
from pathlib import Path

from agent.common import filelock
from agent.common.safefile import UnsafeFileError, read_capped
from agent.simfaults.layout import REASON_SUFFIX, REJECTED_SUBDIR, agent_lock_path, inbox_lock
from agent.simfaults.request import MAX_REQUEST_BYTES, FaultRequest, printable

__all__ = ["Outcome", "agent_problem", "open_inbox", "outcome", "withdraw", "write_request"]


def agent_problem(inbox: Path) -> str | None:
    """Why no simulated agent takes requests from ``inbox`` (None: one runs). Its lock is
    tried exclusively and let go at once; an agent holds it shared, so this fails while one
    runs, and an agent starting meanwhile waits the moment out."""
    lock = agent_lock_path(inbox)
    try:
        fd = filelock.open_lock(lock, create=False)
    except FileNotFoundError:
        return f"{lock} does not exist: no 'dra-agent run --simulate' ran here"
    except OSError as err:
        return f"cannot open {lock}: {err.strerror or err}"
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return f"{lock} is not a regular file"
        if not filelock.lock(fd, wait_s=0):
            return None  # held: an agent runs
        return f"no running agent holds {lock}: the 'dra-agent run --simulate' here stopped"
    finally:
        os.close(fd)


def open_inbox(inbox: Path) -> None:
    """Make the inbox if it is not there yet; ``OSError`` when it cannot be, or when something
    other than a directory (a symlink: never followed) is at its name."""
    with contextlib.suppress(FileExistsError):
        inbox.mkdir(mode=0o700)
    if not stat.S_ISDIR(os.lstat(inbox).st_mode):
        raise NotADirectoryError(errno.ENOTDIR, "not a directory (a symlink is never followed)",
                                 str(inbox))


def write_request(inbox: Path, request: FaultRequest) -> str:
    """Leave ``request`` in ``inbox`` (a temporary dot-file renamed into place); its name.

    Names sort in the order they were written (nanoseconds first), which the agent keeps."""
    name = f"{time.time_ns():020d}-{os.getpid()}-{secrets.token_hex(4)}.json"
    tmp = inbox / f".{name}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(request.to_json())
        os.rename(tmp, inbox / name)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return name


class Outcome(StrEnum):
    PENDING = "pending"
    DELIVERED = "delivered"
    REFUSED = "refused"


def outcome(inbox: Path, name: str) -> tuple[Outcome, str]:
    """What became of the request ``name``, and the agent's reason when it refused it. The
    agent writes the reason before it moves the request, so a request gone without one was
    delivered."""
    if os.path.lexists(inbox / name):
        return Outcome.PENDING, ""
    rejected = inbox / REJECTED_SUBDIR
    try:
        reason = read_capped(rejected / (name + REASON_SUFFIX), MAX_REQUEST_BYTES)
    except FileNotFoundError:
        if os.path.lexists(rejected / name):
            return Outcome.REFUSED, "its reason is in the agent's log"
        return Outcome.DELIVERED, ""
    except (OSError, UnsafeFileError):
        return Outcome.REFUSED, "its reason is in the agent's log"
    return Outcome.REFUSED, printable(" ".join(reason.decode(errors="replace").split()), 500)


def withdraw(inbox: Path, name: str) -> bool:
    """Take back a request the agent has not taken; False when it was taken meanwhile."""
    with inbox_lock(inbox, wait_s=2.0):
        try:
            os.unlink(inbox / name)
        except FileNotFoundError:
            return False
    return True
