"""The project's one atomic file write: temp file, write, fsync, rename, directory fsync.

A reader of the file's name sees the old file or the complete new one, never part of one.
Three writers need that: CDI spec files (runtimes read every ``*.json``/``*.yaml`` in their
directory), the checkpoint and the device metadata files. What each fsync adds, and which
writer asks for which (docs/durability.md):

* none (``durable=False``): the rename is atomic, and the page cache outlives a kill -9 of the
  writer, so every reader sees the new file until the machine itself goes down;
* the file's (``durable``): after a power loss the name holds the old file or the complete
  new one, never an empty or torn one (the upstream checkpointmanager's guarantee);
* the directory's too (``sync_dir``, by default what ``durable`` says): the rename itself is
  on disk when the call returns.

On tmpfs or ramfs (``/var/run/cdi`` on most nodes) no fsync adds anything: a power loss takes
the files with it. ``volatile_fs`` says whether a directory is on one.

Why it lives in ``cdi/``: cdi stands alone and never imports ``agent``, while the agent
imports cdi; the lowest layer that writes files this way is where the one writer both can use
has to be. It imports nothing of the project. (A top-level package of its own would be this
same code plus an entry in the packaging, the image and the layer contracts.)

What every write gets, whoever calls it:

* the temp name is ``.<name>.<16 random hex>.tmp``: it ends in neither ``.json`` nor
  ``.yaml``, so a CDI watcher never reads it half written; it is random and created
  ``O_EXCL|O_NOFOLLOW``, so concurrent writers never collide and a symlink planted at a
  guessable name is never followed;
* ``rename`` replaces whatever sits at the name itself (a symlink, a FIFO) without opening or
  following it;
* a failure before the rename removes the temp file and leaves the file at the name as it
  was; the error is an ``AtomicWriteError`` saying at which step;
* ``mode`` is the file's exact mode (``fchmod``: the umask may only take bits away), unless
  the caller says the umask's mode is good enough (``exact_mode=False``: one call less);
* with ``dir_fd`` both names are relative to a directory the caller opened itself (the
  metadata files open each level ``O_NOFOLLOW``), so no path is looked up again.

The system calls go through ``FileOps``, so tests make a disk fill up or turn read-only at any
step without monkeypatching. ``OsFileOps`` is the real one: the ``os`` functions themselves,
so the hot path has no Python frame between the writer and the kernel.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import secrets
from typing import Literal, Protocol

TEMP_SUFFIX = ".tmp"
_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC

#: Where a write failed: creating the temp file (the directory refused a new file: full,
#: read-only, not writable), writing or syncing it, renaming it over the name, or syncing the
#: directory after the rename (the new file is in place; a crash may still undo the rename).
Step = Literal["create", "write", "rename", "sync-dir"]


class FileOps(Protocol):
    """The system calls a write makes that can fail for want of disk; ``OsFileOps`` is real."""

    def open(self, path: str, flags: int, mode: int = 0o777, *,
             dir_fd: int | None = None) -> int: ...
    def write(self, fd: int, data: bytes | memoryview, /) -> int: ...
    def fsync(self, fd: int, /) -> None: ...
    def replace(self, src: str, dst: str, *, src_dir_fd: int | None = None,
                dst_dir_fd: int | None = None) -> None: ...


class OsFileOps:
    open = staticmethod(os.open)
    write = staticmethod(os.write)
    fsync = staticmethod(os.fsync)
    replace = staticmethod(os.replace)


#: Stateless, so one serves every write.
OS_FILE_OPS: FileOps = OsFileOps()


class AtomicWriteError(OSError):
    """A write failed at ``step``; ``errno``, ``strerror`` and the file names are the cause's.

    Before ``sync-dir`` the file at the name is unchanged and no temp file is left."""

    def __init__(self, step: Step, cause: OSError) -> None:
        super().__init__(cause.errno, cause.strerror or str(cause), cause.filename, None,
                         cause.filename2)
        self.step: Step = step
        self.cause = cause


def write_atomic(
    path: str | os.PathLike[str], data: bytes, *, mode: int = 0o600, exact_mode: bool = True,
    durable: bool = True, sync_dir: bool | None = None, dir_fd: int | None = None,
    ops: FileOps = OS_FILE_OPS,
) -> None:
    """Replace the file at ``path`` with ``data``, atomically (see the module's docstring).

    ``durable``: fsync the file before the rename (``False``: the caller can do without, and
    says why). ``sync_dir``: fsync the directory after it (None: as ``durable``). ``dir_fd``:
    an open descriptor of ``path``'s directory; only ``path``'s last component is used,
    relative to it. Raises ``AtomicWriteError``; the directory itself must exist.
    """
    final = os.fspath(path)
    where, sep, name = final.rpartition("/")
    temp_name = f".{name}.{secrets.token_hex(8)}{TEMP_SUFFIX}"
    if dir_fd is None:
        temp = f"{where}{sep}{temp_name}"
    else:
        temp, final = temp_name, name
    try:
        fd = ops.open(temp, _TEMP_FLAGS, mode, dir_fd=dir_fd)
    except OSError as err:
        raise AtomicWriteError("create", err) from err
    step: Step = "write"
    try:
        try:
            if exact_mode:
                os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                written = ops.write(fd, view)
                if written <= 0:
                    raise OSError(errno.EIO, "short write")
                view = view[written:]
            if durable:
                ops.fsync(fd)
        finally:
            os.close(fd)
        step = "rename"
        ops.replace(temp, final, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException as err:
        # Nothing more can be done if this fails; the temp name is no reader's name anyway.
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=dir_fd)
        if isinstance(err, OSError):
            raise AtomicWriteError(step, err) from err
        raise
    if durable if sync_dir is None else sync_dir:
        try:
            if dir_fd is None:
                fsync_dir(where or sep or ".", ops)
            else:
                ops.fsync(dir_fd)
        except OSError as err:
            raise AtomicWriteError("sync-dir", err) from err


def fsync_dir(path: str | os.PathLike[str], ops: FileOps = OS_FILE_OPS) -> None:
    """Make a rename or a removal in directory ``path`` durable."""
    fd = ops.open(os.fspath(path), _DIR_FLAGS, 0)
    try:
        ops.fsync(fd)
    finally:
        os.close(fd)


#: ``statfs(2)`` ``f_type`` of the file systems whose files a power loss takes away
#: (linux/magic.h): TMPFS_MAGIC, RAMFS_MAGIC.
_VOLATILE_FS_TYPES = frozenset({0x01021994, 0x858458F6})


def volatile_fs(path: str | os.PathLike[str]) -> bool:
    """``path`` is on tmpfs or ramfs, so a power loss takes its files away and no fsync keeps
    them. False when it cannot tell (no such directory, no ``statfs``): then fsync, as on a
    disk. Asked of the kernel (``statfs(2)``; Python's ``os.statvfs`` lacks ``f_type``),
    never assumed from the path."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        statfs = libc.statfs
    except (OSError, AttributeError):
        return False
    # struct statfs starts with f_type (__fsword_t, a C long); 256 bytes hold all of it on
    # every Linux ABI (120 on x86_64 and arm64).
    buf = ctypes.create_string_buffer(256)
    if statfs(os.fsencode(path), buf) != 0:
        return False
    f_type = ctypes.c_ulong.from_buffer(buf).value & 0xFFFFFFFF
    return f_type in _VOLATILE_FS_TYPES
