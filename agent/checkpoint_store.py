"""Durable storage of the checkpoint: locking, atomic writes, corruption handling.

Every change is a read-modify-write under two locks: a ``threading.Lock`` for the threads of
this process and an exclusive ``flock`` on ``<checkpoint>.lock`` for another agent instance
(rolling updates share the plugin directory). The lock file is separate from the checkpoint
because the checkpoint itself is replaced by ``rename`` and a lock on a replaced inode would
not exclude anybody.

A corrupt file never stops the agent and is never silently reset: it is renamed to
``<checkpoint>.corrupt-<unix ts>``, counted, logged, and the records that still parse are kept
as *recovered* (their devices stay taken; the next prepare of such a claim starts over).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from agent.checkpoint import (
    CheckpointCorruptError,
    CheckpointData,
    ClaimRecord,
    decode,
    encode,
    salvage,
)
from agent.metrics import Metrics

log = logging.getLogger(__name__)
T = TypeVar("T")
Claims = dict[str, ClaimRecord]


class CheckpointWriteError(Exception):
    """The checkpoint could not be written durably; the change did not happen."""

    def __init__(self, path: Path, cause: OSError) -> None:
        super().__init__(f"cannot write checkpoint {path}: {cause.strerror or cause}")
        self.path = path
        self.cause = cause


def read_boot_id(path: Path) -> str:
    """The Linux boot ID (changes on every boot); "" when the file cannot be read."""
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def durable_write(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Write ``data`` to ``path`` atomically and durably: temp file, fsync, rename, dir fsync.

    The temp name ends in neither ``.json`` nor ``.yaml`` so CDI watchers never read it half
    written; it carries the thread id so concurrent writers of different files never collide.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.close(fd)
    try:
        os.rename(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def fsync_dir(directory: Path) -> None:
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


class CheckpointStore:
    """The checkpoint file of one plugin directory.

    ``update`` is the only way to change it; reads between writes come from a cache that is
    invalidated when the file's identity (inode, size, mtime) changes, e.g. when the other
    instance of a rolling update wrote it.
    """

    def __init__(
        self,
        path: Path,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = path
        self._metrics = metrics or Metrics()
        self._clock = clock
        self._lock = threading.Lock()
        self._lock_path = path.with_name(path.name + ".lock")
        self._lock_fd: int | None = None
        self._cache: CheckpointData | None = None
        self._cache_key: tuple[int, int, int] | None = None
        #: Paths the corrupt files were moved to during this process's life.
        self.corrupt_copies: list[Path] = []

    # -- public ---------------------------------------------------------------------------

    def claims(self) -> Claims:
        """A snapshot of the records (a copy; changing it changes nothing)."""
        with self._locked():
            return dict(self._read_locked().claims)

    def update(self, change: Callable[[Claims], T], *, durable: bool = True) -> T:
        """Apply ``change`` to the records and write the result if anything changed.

        ``change`` mutates the dict it is given and may return a value, which is passed back.
        If it raises, nothing is written. With ``durable=False`` the change is only visible to
        later updates (and written with the next durable one): used for PrepareStarted, whose
        durable evidence is the claim's CDI spec (see ``DevicePreparer.prepare``).
        """
        with self._locked():
            data = self._read_locked()
            claims = dict(data.claims)
            result = change(claims)
            if claims != dict(data.claims):
                if durable:
                    self._write_locked(data.with_claims(claims))
                else:
                    self._cache = data.with_claims(claims)
            return result

    # -- internals ------------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """This process's lock, then the file lock another agent instance may hold too.

        The lock file stays open between calls (opening it each time was a measurable part
        of a prepare); it is reopened when the path no longer names the open file.
        """
        with self._lock:
            fd = self._lock_file()
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)

    def _lock_file(self) -> int:
        fd = self._lock_fd
        if fd is not None:
            try:
                if os.stat(self._lock_path).st_ino == os.fstat(fd).st_ino:
                    return fd
            except FileNotFoundError:
                pass
            os.close(fd)
            self._lock_fd = None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self._lock_fd = fd
        return fd

    def close(self) -> None:
        """Release the lock file descriptor (the agent is stopping)."""
        with self._lock:
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None

    def _key(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def _read_locked(self) -> CheckpointData:
        key = self._key()
        if self._cache is not None and key == self._cache_key:
            return self._cache
        if key is None:
            data = CheckpointData()
        else:
            try:
                raw = self.path.read_bytes()
                data = decode(raw, str(self.path))
            except (OSError, CheckpointCorruptError) as err:
                data = self._set_aside(err)
                key = self._key()
        self._cache, self._cache_key = data, key
        return data

    def _set_aside(self, err: Exception) -> CheckpointData:
        """Move a bad file out of the way, keep what still parses, and say so loudly."""
        self._metrics.checkpoint_corrupt.inc()
        raw = b""
        with contextlib.suppress(OSError):
            raw = self.path.read_bytes()
        copy = self.path.with_name(f"{self.path.name}.corrupt-{int(self._clock())}")
        try:
            os.replace(self.path, copy)
            self.corrupt_copies.append(copy)
        except OSError as move_err:
            log.error(
                "cannot set corrupt checkpoint aside",
                extra={"path": str(self.path), "cause": str(move_err)},
            )
        recovered = salvage(raw)
        log.error(
            "checkpoint corrupt; kept a copy, recovered records stay reserved until re-prepared",
            extra={
                "path": str(self.path),
                "copy": str(copy),
                "cause": str(err),
                "recovered_claims": len(recovered),
            },
        )
        data = CheckpointData(claims=recovered)
        if recovered:
            # Persist at once so a second crash cannot lose the recovered reservations.
            self._write_locked(data)
        return data

    def _write_locked(self, data: CheckpointData) -> None:
        raw = encode(data)
        start = time.perf_counter()
        try:
            durable_write(self.path, raw)
        except OSError as err:
            self._cache, self._cache_key = None, None
            raise CheckpointWriteError(self.path, err) from err
        self._metrics.checkpoint_write_duration.observe(time.perf_counter() - start)
        self._cache, self._cache_key = data, self._key()
