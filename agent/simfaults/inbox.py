"""The agent's end of the inbox: one thread taking requests until the agent stops.

A request delivered is deleted, with one log line naming the device; one that cannot be is
one warning line and is moved aside to ``.rejected/`` with its reason beside it (the newest
``MAX_REJECTED`` kept). What a request does is plan.py's.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from agent.common import filelock
from agent.common.safefile import UnsafeFileError, read_capped
from agent.simfaults.layout import REASON_SUFFIX, REJECTED_SUBDIR, agent_lock_path, inbox_lock
from agent.simfaults.plan import plan_fault
from agent.simfaults.request import (
    MAX_REQUEST_BYTES,
    FaultRequestError,
    parse_request,
    printable,
)

if TYPE_CHECKING:
    from agent.health.options import HealthOptions
    from discovery.gpulib import GpuLibrary
    from discovery.model import Inventory

__all__ = ["BUSY_S", "IDLE_POLL_S", "MAX_PER_POLL", "MAX_REJECTED", "POLL_S", "FaultInbox"]

# Named for the package, not this module: every line of the fault inbox is agent.simfaults's.
log = logging.getLogger("agent.simfaults")

#: Refused entries kept in ``.rejected`` (requests and reason files together).
MAX_REJECTED = 64
#: Requests taken per poll, so a flooded inbox never holds the lock for long.
MAX_PER_POLL = 64
#: How often the agent looks into its inbox while it is busy: for ``BUSY_S`` after its start
#: and after each request taken.
POLL_S = 0.2
#: How often once it has been quiet that long. Every wake-up of an idle agent costs CPU (about
#: 0.1 ms on a VM); five a second were the largest part of an idle simulated node's.
IDLE_POLL_S = 1.0
BUSY_S = 30.0


def _remove(path: Path) -> None:
    """Remove whatever is at ``path``, a directory with what it holds (symlinks not followed)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def _write_reason(path: Path, reason: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    _remove(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8", errors="replace") as out:
        out.write(reason + "\n")
    _remove(path)
    os.rename(tmp, path)


class FaultInbox:
    """The agent's end: one thread (``start``) taking requests until ``stop`` is set.

    ``gpu`` is the agent's GPU library; requests are refused unless it is a ``FakeNvml``.
    ``health`` is the agent's health options (None: monitoring is off, so requests are refused:
    nothing would see the fault)."""

    def __init__(self, directory: Path, gpu: GpuLibrary | None,
                 inventory: Callable[[], Inventory], *, health: HealthOptions | None,
                 stop: threading.Event, poll_s: float = POLL_S,
                 idle_poll_s: float = IDLE_POLL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        from discovery.simulate.fake_nvml import FakeNvml

        self.directory = directory
        self._nvml = gpu if isinstance(gpu, FakeNvml) else None
        self._inventory = inventory
        self._health = health
        self._stop = stop
        self.poll_s = poll_s
        self.idle_poll_s = max(idle_poll_s, poll_s)
        self._clock = clock
        #: Why the inbox could not be read at the last poll (said once, until it can again).
        self._unusable: str | None = None

    def start(self) -> threading.Thread | None:
        """Take the agent's lock and start the thread; None (with a warning) without it."""
        lock = agent_lock_path(self.directory)
        try:
            lock.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = filelock.open_lock(lock)
        except OSError as err:
            log.warning("simulated faults unavailable: cannot open the agent's lock",
                        extra={"lock": str(lock), "error": err.strerror or str(err)})
            return None
        if not self._share(fd):
            os.close(fd)
            log.warning("simulated faults unavailable: the agent's lock is held exclusively",
                        extra={"lock": str(lock)})
            return None
        log.info("simulated faults: 'dra-agent simulate fault' delivers here",
                 extra={"directory": str(self.directory)})
        thread = threading.Thread(target=self.run, args=(fd,), name="simulated-faults",
                                  daemon=True)
        thread.start()
        return thread

    def _share(self, fd: int, wait_s: float = 2.0) -> bool:
        """A shared flock on ``fd``, waiting out a writer's probe (``agent_problem``)."""
        try:
            return filelock.lock(fd, shared=True, wait_s=wait_s, stop=self._stop)
        except OSError:
            return False

    def run(self, lock_fd: int | None = None) -> None:
        """Poll until stopped, holding ``lock_fd`` (closed at the end). Never ends otherwise:
        the daemon takes a dead thread as fatal."""
        busy_until = self._clock() + BUSY_S
        try:
            while not self._stop.is_set():
                try:
                    if self.poll():
                        busy_until = self._clock() + BUSY_S
                except Exception as err:
                    log.warning("simulated fault inbox: poll failed",
                                extra={"error": f"{type(err).__name__}: {err}"})
                busy = self._clock() < busy_until
                self._stop.wait(self.poll_s if busy else self.idle_poll_s)
        finally:
            if lock_fd is not None:
                os.close(lock_fd)

    def poll(self) -> int:
        """Take the pending requests (at most ``MAX_PER_POLL``); how many were taken."""
        if not self._usable():
            return 0
        with inbox_lock(self.directory) as locked:
            if not locked:
                return 0  # the other agent of a rolling update is at it (or a writer is)
            with os.scandir(self.directory) as entries:
                names = sorted(e.name for e in entries if not e.name.startswith("."))
            for name in names[:MAX_PER_POLL]:
                self._take(name)
            return min(len(names), MAX_PER_POLL)

    def _usable(self) -> bool:
        """Whether there is an inbox to read: a directory of its own (a symlink there is never
        followed). None yet is normal: its first writer makes it."""
        problem: str | None = None
        missing = False
        try:
            if not stat.S_ISDIR(os.lstat(self.directory).st_mode):
                problem = "is not a directory (a symlink is never followed)"
        except FileNotFoundError:
            missing = True
        except OSError as err:
            problem = f"cannot be read: {err.strerror or err}"
        if problem != self._unusable:
            if problem is not None:
                log.warning("simulated fault inbox unusable",
                            extra={"directory": str(self.directory), "reason": problem})
            elif self._unusable is not None:
                log.info("simulated fault inbox usable again",
                         extra={"directory": str(self.directory)})
            self._unusable = problem
        return problem is None and not missing

    def _take(self, name: str) -> None:
        path = self.directory / name
        try:
            raw = read_capped(path, MAX_REQUEST_BYTES)
            request = parse_request(raw)
            plan = plan_fault(request, self._nvml, self._inventory, self._health)
        except FileNotFoundError:
            return  # withdrawn by its writer
        except UnsafeFileError as err:
            self._refuse(name, err.reason)
            return
        except OSError as err:
            self._refuse(name, f"cannot be read: {err.strerror or err}")
            return
        except FaultRequestError as err:
            self._refuse(name, str(err))
            return
        try:
            os.unlink(path)  # consumed before it acts: never delivered twice
        except FileNotFoundError:
            return
        except OSError as err:
            log.warning("simulated fault not delivered: the request cannot be removed",
                        extra={"file": printable(name), "device": request.device,
                               "error": err.strerror or str(err)})
            return
        from discovery.gpulib import GpuLibraryError

        try:
            plan.action()
        except GpuLibraryError as err:  # the GPU left the simulation since the plan
            log.warning("simulated fault not delivered", extra={
                "device": request.device, "fault": str(request.fault), "error": str(err)})
            return
        log.info("simulated fault delivered", extra={**plan.fields, "file": printable(name)})

    def _refuse(self, name: str, reason: str) -> None:
        """One warning line; the entry moved aside (its reason beside it) or, if it cannot
        be, removed, so it is not refused again at every poll."""
        where = f"{REJECTED_SUBDIR}/"
        try:
            rejected = self._rejected_dir()
            with contextlib.suppress(OSError):  # a name too long for the suffix: log only
                _write_reason(rejected / (name + REASON_SUFFIX), reason)
            _remove(rejected / name)
            os.rename(self.directory / name, rejected / name)
        except FileNotFoundError:
            return  # withdrawn meanwhile
        except OSError as err:
            try:
                _remove(self.directory / name)
                where = f"removed: cannot move it aside ({err.strerror or err})"
            except OSError as err2:
                where = f"left in place: cannot move or remove it ({err2.strerror or err2})"
        else:
            with contextlib.suppress(OSError):
                self._prune(rejected)
        log.warning("simulated fault refused", extra={
            "file": printable(name), "reason": printable(reason, 500), "moved_to": where})

    def _rejected_dir(self) -> Path:
        path = self.directory / REJECTED_SUBDIR
        try:
            st = os.lstat(path)
            if stat.S_ISDIR(st.st_mode):
                return path
            _remove(path)  # a symlink or file planted there: never followed
        except FileNotFoundError:
            pass
        path.mkdir(mode=0o700)
        return path

    def _prune(self, rejected: Path) -> None:
        """Keep the newest ``MAX_REJECTED`` entries."""
        with os.scandir(rejected) as it:
            entries = [(e.stat(follow_symlinks=False).st_mtime_ns, e.name) for e in it
                       if not e.name.startswith(".")]
        if len(entries) <= MAX_REJECTED:
            return
        for _, name in sorted(entries)[: len(entries) - MAX_REJECTED]:
            with contextlib.suppress(OSError):
                _remove(rejected / name)

