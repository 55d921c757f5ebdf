"""The device metadata files on the host: atomic writes, idempotent removal, a start-up scan.

They live in the plugin directory, which whoever can write it may fill with anything, so no
path is ever followed: each directory below the plugin directory is opened ``O_NOFOLLOW``
relative to its parent's descriptor (a symlink or a file where a directory should be is an
error naming it, never a write somewhere else), and each file is written relative to its
directory's descriptor by ``cdi.atomicfile.write_atomic``: the temp file gets a random name and
``O_EXCL|O_NOFOLLOW``, and ``rename`` replaces whatever sits at the file's name (a symlink, a
FIFO) without opening it. Each write is temp file then rename: the container's bind mount
source is the old file or the complete new one.

No fsync, on purpose (it was two per request, the larger part of what metadata added to a
prepare): after kill -9 the page cache still holds the file, and after a power loss the node
boots with a new boot ID, at which start-up rewrites every prepared claim's files from the
checkpoint before the plugin registers, whatever the disk kept.

Modes are the helper's (``kubeletplugin/metadata.go``): files 0644, directories 0755, set
with ``fchmod`` because the agent runs under umask 077 and a non-root container user must be
able to read its file through the mount.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Sequence
from pathlib import Path

from agent.common.k8snames import dns_label_problem, dns_subdomain_problem
from agent.prepare.metadata import HOST_FILE, MetadataFile
from cdi.atomicfile import TEMP_SUFFIX, AtomicWriteError, write_atomic

FILE_MODE = 0o644
DIR_MODE = 0o755
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: ``write_atomic``'s temp names for ``HOST_FILE``, which removal sweeps up after a crash.
_TEMP_PREFIX = f".{HOST_FILE}."
_TEMP_SUFFIX = TEMP_SUFFIX


class MetadataFileError(OSError):
    """A metadata file could not be written or removed; names the path and the cause."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(f"{path}: {why}")
        self.path = path
        self.why = why


def _why(path: Path, err: OSError, dir_fd: int | None = None) -> str:
    """``path`` and what is wrong with it, as one phrase."""
    if err.errno in (errno.ELOOP, errno.ENOTDIR) and dir_fd is not None:
        # O_DIRECTORY|O_NOFOLLOW on a link to a directory says ENOTDIR: look at the entry.
        with contextlib.suppress(OSError):
            if stat.S_ISLNK(os.stat(path.name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                return f"{path} is a symbolic link (never followed)"
    if err.errno == errno.ELOOP:
        return f"{path} is a symbolic link (never followed)"
    if err.errno == errno.ENOTDIR:
        return f"{path} is not a directory"
    if err.errno == errno.EISDIR:
        return f"{path} is a directory, not a file"
    return f"{path}: {err.strerror or err}"


class HostMetadataFiles:
    """The files under ``root`` (``<plugin dir>/dra-device-metadata``).

    ``root``'s parent (the plugin directory) is the agent's configured directory and is
    opened as given; everything from ``root`` down is opened without following links.
    """

    def __init__(self, root: Path) -> None:
        self.root = root

    # -- write ----------------------------------------------------------------------------

    def write(self, files: Sequence[MetadataFile]) -> None:
        """Write each file durably; the first failure raises ``MetadataFileError``."""
        for file in files:
            self._write_one(file)

    def _write_one(self, file: MetadataFile) -> None:
        parts = file.host_path.relative_to(self.root).parts  # <ns>_<name>, <request>, file
        fd = self._open_dirs(parts[:-1], create=True, target=file.host_path)
        try:
            self._write_at(fd, parts[-1], file.content, file.host_path)
        finally:
            os.close(fd)

    def _write_at(self, dir_fd: int, name: str, data: bytes, path: Path) -> None:
        try:
            write_atomic(name, data, mode=FILE_MODE, durable=False, dir_fd=dir_fd)
        except AtomicWriteError as err:
            if err.step == "create":  # the directory refused a new file
                raise MetadataFileError(path, _why(path.parent, err)) from err
            raise MetadataFileError(path, _why(path, err, dir_fd)) from err

    def _open_dirs(self, parts: Sequence[str], *, create: bool, target: Path) -> int:
        """A descriptor of ``root/parts...``, each directory opened without following links;
        with ``create``, missing ones are made (mode ``DIR_MODE``)."""
        here = self.root.parent
        try:
            fd = os.open(here, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as err:
            raise MetadataFileError(target, _why(here, err)) from err
        for part in (self.root.name, *parts):
            here = here / part
            made = False
            try:
                if create:
                    try:
                        os.mkdir(part, DIR_MODE, dir_fd=fd)
                        made = True
                    except FileExistsError:
                        pass
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as err:
                why = _why(here, err, fd)
                os.close(fd)
                raise MetadataFileError(target, why) from err
            os.close(fd)
            fd = child
            if made:  # only ours: an existing directory keeps its mode
                try:
                    os.fchmod(fd, DIR_MODE)
                except OSError as err:
                    os.close(fd)
                    raise MetadataFileError(target, _why(here, err)) from err
        return fd

    # -- read -----------------------------------------------------------------------------

    def present(self, path: Path) -> bool:
        """Whether ``path`` (one of ours) is a regular file, looked at without following."""
        parts = path.relative_to(self.root).parts
        try:
            fd = self._open_dirs(parts[:-1], create=False, target=path)
        except MetadataFileError:
            return False
        try:
            st = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
        except OSError:
            return False
        finally:
            os.close(fd)
        return stat.S_ISREG(st.st_mode)

    def on_disk(self) -> set[tuple[str, str, str]]:
        """(namespace, name, request) of every directory of ours that could hold a file: what
        start-up compares with the checkpoint. Names that no claim can have are left alone."""
        found: set[tuple[str, str, str]] = set()
        for claim_dir in self._list(()) or ():
            namespace, sep, name = claim_dir.partition("_")
            if not sep or dns_label_problem(namespace) or dns_subdomain_problem(name):
                continue
            for request in self._list((claim_dir,)) or ():
                if dns_label_problem(request) is None:
                    found.add((namespace, name, request))
        return found

    def requests(self, claim_dir: str) -> list[str] | None:
        """The request directories in ``root/claim_dir`` whose names could be ours; None when
        there is no such directory to look into (nothing to remove, not even it)."""
        found = self._list((claim_dir,))
        return None if found is None else [r for r in found if dns_label_problem(r) is None]

    def _list(self, parts: Sequence[str]) -> list[str] | None:
        """Subdirectories of ``root/parts`` (not links), sorted; None when it is not a
        directory that can be opened."""
        try:
            fd = self._open_dirs(parts, create=False, target=self.root.joinpath(*parts))
        except MetadataFileError:
            return None
        try:
            names = os.listdir(fd)
            dirs = [n for n in names
                    if stat.S_ISDIR(os.stat(n, dir_fd=fd, follow_symlinks=False).st_mode)]
        except OSError:
            dirs = []
        finally:
            os.close(fd)
        return sorted(dirs)

    # -- remove ---------------------------------------------------------------------------

    def remove(self, claim_dir: str, requests: Sequence[str]) -> None:
        """Remove the files of ``requests`` in ``root/claim_dir`` (and left-over temp files),
        then each directory left empty. Missing files, or a link where a directory of ours
        should be (nothing of ours is behind it), are not errors: removal is idempotent."""
        for request in requests:
            path = self.root / claim_dir / request / HOST_FILE
            try:
                fd = self._open_dirs((claim_dir, request), create=False, target=path)
            except MetadataFileError:
                continue
            try:
                for name in os.listdir(fd):
                    ours = name == HOST_FILE or (
                        name.startswith(_TEMP_PREFIX) and name.endswith(_TEMP_SUFFIX))
                    # A directory under our name was never ours (we write files): it stays.
                    if ours and not stat.S_ISDIR(
                            os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(name, dir_fd=fd)
                # No fsync: a removal lost in a crash brings back a file no record lists,
                # which the next start-up removes (``ClaimMetadata.sweep``).
            except OSError as err:
                raise MetadataFileError(path, _why(path, err)) from err
            finally:
                os.close(fd)
            self._rmdir((claim_dir,), request)
        self._rmdir((), claim_dir)

    def _rmdir(self, parts: Sequence[str], name: str) -> None:
        """Remove ``root/parts/name`` when it is an empty directory; otherwise leave it."""
        try:
            fd = self._open_dirs(parts, create=False, target=self.root.joinpath(*parts, name))
        except MetadataFileError:
            return
        try:
            os.rmdir(name, dir_fd=fd)
        except OSError:
            pass  # not empty (another request's file), gone already, or not a directory
        finally:
            os.close(fd)
