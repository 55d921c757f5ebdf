"""Durable storage of the checkpoint: locking, atomic writes, corruption handling.

Every change is a read-modify-write under two locks: a ``threading.Lock`` for the threads of
this process and an exclusive ``flock`` on ``<checkpoint>.lock`` for another agent instance
(rolling updates share the plugin directory). The lock file is separate from the checkpoint
because the checkpoint itself is replaced by ``rename`` and a lock on a replaced inode would
not exclude anybody.

A corrupt file never stops the agent and is never silently reset: it is renamed to
``<checkpoint>.corrupt-<unix ts>``, counted, logged, and the records that still parse are kept
as *recovered* (their devices stay taken; the next prepare of such a claim starts over), a
record that does not parse as *unreadable* (``agent.checkpoint.unreadable``: its devices
stay taken too, one log line says so).
"Corrupt" includes anything planted at the name (``agent.common.safefile``): a symlink, a FIFO, a
device, a file over ``MAX_CHECKPOINT_BYTES``.

Nothing in the plugin directory is followed or predictable: the file is written by
``cdi.atomicfile.write_atomic`` (temp file with a random name, ``O_EXCL|O_NOFOLLOW``, fsync,
rename); the lock is an ``agent.common.filelock`` lock, and a symlink or non-regular file at
its path is set aside too.

One fsync per durable write, the file's before the rename, and none of the directory: the
upstream checkpointmanager's guarantee (docs/durability.md). A kill -9 loses nothing written;
after a power loss the file is a complete version, never a torn one, the latest unless the
file system had not committed the rename yet (ext4: within 5 s). On tmpfs no fsync at all.
Concurrent changes share one write and its fsync (``agent.checkpoint.groupcommit``).

A change that cannot be encoded (a lone surrogate in a string) fails that change alone: the
cache is only replaced by a state that is known to encode, so one claim's bad string never
makes every other claim's write fail.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import secrets
import stat
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

from agent.checkpoint.codec import (
    CheckpointCorruptError,
    RecordTexts,
    decode,
    encode,
    record_member,
    salvage,
)
from agent.checkpoint.groupcommit import GroupCommit, Request
from agent.checkpoint.model import CheckpointData, ClaimRecord
from agent.checkpoint.unreadable import HELD_LINE
from agent.common.filelock import lock, open_lock, unlock
from agent.common.metrics import Metrics
from agent.common.safefile import UnsafeFileError, read_capped
from cdi.atomicfile import OS_FILE_OPS, AtomicWriteError, FileOps, volatile_fs, write_atomic

log = logging.getLogger(__name__)
T = TypeVar("T")
Claims = dict[str, ClaimRecord]

#: Largest checkpoint read or written. A record is ~1.4 KiB (two GPUs, an opaque config of
#: eight variables), and a node holds at most a few hundred claims (110 pods by default), so a
#: real file stays under 1 MiB. Measured: decoding and re-encoding a 16 MiB file (11,700
#: records) adds ~135 MiB to the process's peak RSS; with the agent's own ~100 MiB that stays
#: under half of the DaemonSet's 512 MiB memory limit (deploy/base/daemonset.yaml). A change
#: that would grow the file past it fails (that claim only), so the agent never writes a file
#: it would refuse to read.
MAX_CHECKPOINT_BYTES = 16 << 20
#: boot_id is a 36-character UUID; the cap only bounds a hostile ``--boot-id-file``.
_MAX_BOOT_ID_BYTES = 256
_BOOT_ID = re.compile(r"[A-Za-z0-9-]{1,64}", re.ASCII)


class CheckpointWriteError(Exception):
    """The checkpoint could not be written durably; the change did not happen."""

    def __init__(self, path: Path, cause: Exception) -> None:
        text = cause.strerror if isinstance(cause, OSError) and cause.strerror else str(cause)
        super().__init__(f"cannot write checkpoint {path}: {text}")
        self.path = path
        self.cause = cause


def read_boot_id(path: Path) -> str:
    """The Linux boot ID (changes on every boot); "" when the file cannot be read or does not
    hold one (it is stored in every record, so nothing else may come from it)."""
    try:
        text = read_capped(path, _MAX_BOOT_ID_BYTES).decode("ascii").strip()
    except (OSError, UnsafeFileError, UnicodeDecodeError):
        return ""
    return text if _BOOT_ID.fullmatch(text) else ""


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
        *,
        ops: FileOps = OS_FILE_OPS,
        volatile: Callable[[Path], bool] = volatile_fs,
    ) -> None:
        self.path = path
        self._metrics = metrics or Metrics()
        self._clock = clock
        self._ops = ops
        self._volatile_fs = volatile
        #: The directory is on tmpfs: no fsync (asked at the first write).
        self._volatile: bool | None = None
        self._commits = GroupCommit(self._commit)
        self._lock = threading.Lock()
        self._lock_path = path.with_name(path.name + ".lock")
        self._lock_fd: int | None = None
        self._cache: CheckpointData | None = None
        self._cache_key: tuple[int, int, int] | None = None
        #: The cache holds a ``durable=False`` change the file does not have yet.
        self._unwritten = False
        #: Each record's encoded text, reused by the next write while the record is unchanged
        #: (``codec.encode``); under ``_lock``.
        self._texts: RecordTexts = {}
        #: Paths the corrupt files were moved to during this process's life.
        self.corrupt_copies: list[Path] = []

    # -- public ---------------------------------------------------------------------------

    def claims(self) -> Claims:
        """A snapshot of the records (a copy; changing it changes nothing).

        While the cache is current (the file's identity unchanged: no other instance wrote
        it) it answers under this process's lock alone, as the locked read would: the file
        lock and the group commit's round are what a prepare's reads cost most
        (docs/durability.md). Else the read queues with the changes and reads the file under
        both locks.
        """
        with self._lock:  # a batch being written holds it: its changes are seen
            if self._cache is not None and self._cache_key == self._key():
                return dict(self._cache.claims)
        result: Claims = self._commits.run(Request(None, False))
        return result

    def update(self, change: Callable[[Claims], T], *, durable: bool = True) -> T:
        """Apply ``change`` to the records and write the result if anything changed.

        ``change`` mutates the dict it is given and may return a value, which is passed back.
        If it raises, nothing of it is written. With ``durable=False`` the change is only
        visible to later updates (and written with the next durable one): used for
        PrepareStarted, whose durable evidence is the claim's CDI spec (see
        ``DevicePreparer.prepare``). Concurrent updates are applied in turn and written
        together, once (``agent.checkpoint.groupcommit``).
        """
        result: T = self._commits.run(Request(change, durable))
        return result

    def _commit(self, batch: list[Request]) -> None:
        """Apply a batch of changes in order and write them once if one of them is durable,
        under this process's lock, then the file lock another agent instance may hold too.

        A change that raises, or that would not encode, fails alone; a failed write fails
        every change of the batch, and leaves the cache as it was before it.
        """
        with self._lock:  # only a leader takes it; close() too
            fd = self._lock_file()
            lock(fd)
            try:
                self._apply(batch)
            finally:
                unlock(fd)

    def _apply(self, batch: list[Request]) -> None:
        """``_commit`` under both locks: each request's result or error set."""
        data = self._read_locked()
        current = data.claims
        changed, durable, applied = False, False, []
        # A lone change is proven to encode by the write itself (or, when it is not
        # durable, here); in a batch each one is, so that one bad string fails alone.
        check = len(batch) > 1
        for request in batch:
            if request.change is None:  # a read: what the changes before it made
                request.result = dict(current)
                continue
            claims = dict(current)
            try:
                request.result = request.change(claims)
                if claims != current:
                    if check or not request.durable:
                        self._check_encodes(claims, current)
                    current, changed = claims, True
            except Exception as err:  # that caller's to handle; the others go on
                request.result, request.error = None, err
                continue
            durable = durable or request.durable
            applied.append(request)
        # A durable change that changes nothing still writes what only the cache has.
        if not (changed or (durable and self._unwritten)):
            return
        if not durable:
            self._cache, self._unwritten = data.with_claims(current), True
            return
        try:
            self._write_locked(data.with_claims(current))
        except CheckpointWriteError as err:
            for request in applied:
                request.result, request.error = None, err

    # -- internals ------------------------------------------------------------------------

    def _lock_file(self) -> int:
        """The lock file's descriptor. It stays open between calls (opening it each time was a
        measurable part of a prepare); it is reopened when the path no longer names it."""
        fd = self._lock_fd
        if fd is not None:
            try:
                if os.lstat(self._lock_path).st_ino == os.fstat(fd).st_ino:
                    return fd
            except FileNotFoundError:
                pass
            os.close(fd)
            self._lock_fd = None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = self._open_lock()
        self._lock_fd = fd
        return fd

    def _open_lock(self) -> int:
        """Open (or create) the lock file without following a symlink planted at its name.

        Anything but a regular file there (a symlink, a FIFO) is renamed aside once and a
        fresh file created: following it would lock, or create, a file elsewhere. The other
        instance of a rolling update does the same, so both end up on the same new inode.
        """
        for attempt in (1, 2):
            try:
                fd = open_lock(self._lock_path)
            except OSError as err:
                if err.errno != errno.ELOOP or attempt == 2:
                    raise CheckpointWriteError(self._lock_path, err) from err
                self._lock_aside("a symbolic link")
                continue
            mode = os.fstat(fd).st_mode
            if stat.S_ISREG(mode):
                return fd
            os.close(fd)
            if attempt == 2:
                break
            self._lock_aside("not a regular file")
        raise CheckpointWriteError(
            self._lock_path, OSError(errno.EINVAL, "the lock path is not a regular file"))

    def _lock_aside(self, what: str) -> None:
        copy = self._lock_path.with_name(
            f"{self._lock_path.name}.corrupt-{int(self._clock())}-{secrets.token_hex(4)}")
        with contextlib.suppress(FileNotFoundError):  # the other instance moved it first
            os.rename(self._lock_path, copy)
        log.error("checkpoint lock path held something planted; set it aside",
                  extra={"path": str(self._lock_path), "copy": str(copy), "found": what})

    def close(self) -> None:
        """Release the lock file descriptor (the agent is stopping)."""
        with self._lock:
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None

    def _key(self) -> tuple[int, int, int] | None:
        try:
            st = os.lstat(self.path)  # a planted symlink is judged as itself, never followed
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
            raw = b""
            try:
                raw = read_capped(self.path, MAX_CHECKPOINT_BYTES)
                data = decode(raw, str(self.path))
            except (OSError, UnsafeFileError, CheckpointCorruptError) as err:
                data = self._set_aside(err, raw)
                key = self._key()
        self._cache, self._cache_key, self._unwritten = data, key, False
        return data

    def _set_aside(self, err: Exception, raw: bytes) -> CheckpointData:
        """Move a bad file out of the way, keep what still parses of ``raw`` (the bytes read,
        b"" when none could be), and say so loudly."""
        self._metrics.checkpoint_corrupt.inc()
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
        unreadable = [r for r in recovered.values() if r.unreadable is not None]
        log.error(
            "checkpoint corrupt; kept a copy, recovered records stay reserved until re-prepared",
            extra={
                "path": str(self.path),
                "copy": str(copy),
                "cause": str(err),
                "recovered_claims": len(recovered),
                "unreadable_claims": len(unreadable),
            },
        )
        for record in unreadable:
            log_unreadable(record)
        data = CheckpointData(claims=recovered)
        if recovered:
            # Persist at once so a second crash cannot lose the recovered reservations.
            self._write_locked(data)
        return data

    def _check_encodes(self, claims: Claims, before: Mapping[str, ClaimRecord]) -> None:
        for uid, record in claims.items():
            if before.get(uid) is not record:
                try:
                    text = record_member(uid, record)
                    text.encode()  # a lone surrogate fails here
                except (ValueError, TypeError, RecursionError) as err:
                    raise CheckpointWriteError(self.path, _encode_error(uid, err)) from err
                self._texts[uid] = (record, text)  # the write reuses it

    def _write_locked(self, data: CheckpointData) -> None:
        # Encoding comes first and touches nothing: if it fails, the cache is as it was.
        try:
            raw = encode(data, self._texts)
        except (ValueError, TypeError, RecursionError) as err:
            raise CheckpointWriteError(self.path, _encode_error(None, err)) from err
        if len(raw) > MAX_CHECKPOINT_BYTES:
            raise CheckpointWriteError(self.path, ValueError(
                f"the checkpoint would be {len(raw)} bytes, over the "
                f"{MAX_CHECKPOINT_BYTES}-byte cap it is read with"))
        start = time.perf_counter()
        if self._volatile is None:
            self._volatile = self._volatile_fs(self.path.parent)
        try:
            # 0600 less what the umask takes away: only the agent reads it, so no fchmod (one
            # call less on every write). The file's fsync makes the file at the name complete
            # after a power loss; a directory fsync would make the rename itself durable, at
            # a second fsync per write, which the upstream checkpointmanager does not pay
            # either (docs/durability.md says what the kubelet does after a reboot instead).
            write_atomic(self.path, raw, exact_mode=False, durable=not self._volatile,
                         sync_dir=False, ops=self._ops)
        except OSError as err:
            if not (isinstance(err, AtomicWriteError) and err.step != "sync-dir"):
                # The file may be the new one or anything: read it again next time.
                self._cache, self._cache_key, self._unwritten = None, None, False
            # Else the file at the name is the one the cache was read from: the cache,
            # with what only it holds (a PrepareStarted not written yet), stays right.
            raise CheckpointWriteError(self.path, err) from err
        self._metrics.checkpoint_write_duration.observe(time.perf_counter() - start)
        self._cache, self._cache_key, self._unwritten = data, self._key(), False


def log_unreadable(record: ClaimRecord) -> None:
    """The operator's one line about a record the agent cannot read."""
    log.error(HELD_LINE, extra={
        "claim": record.uid, "reason": record.unreadable,
        "devices": ",".join(f"{d.pool}/{d.device}" for d in record.devices) or "none"})


def _encode_error(uid: str | None, err: Exception) -> ValueError:
    """What could not be encoded, in ASCII (the cause may hold the very string at fault)."""
    where = f"claim {uid!a}" if uid is not None else "a record"
    return ValueError(f"{where} cannot be encoded: {str(err)!a}"[:300])
