"""Stand-in device nodes for simulated devices (``dra-agent run --simulate-device-nodes``).

A simulated device has no device node, so a container runtime has nothing to give a container
for it. With this on, the agent makes one itself for each node the real device would have, in
a directory of its own that the runtime sees at the same path (under the plugin directory,
which the DaemonSet mounts from the host at its host path): a character device with the
numbers of ``/dev/null`` (1:3), so that opening it in a container is harmless. The spec names
the real device's path inside the container (``/dev/nvidia0``) and the stand-in as its host
path.

Nodes are made when a spec needs them (prepare, the spec rebuild at start-up), idempotently:
a node already there with the right type and numbers is kept; anything else at its name (a
regular file, a node with other numbers, a symlink, a directory) is replaced. A new node is
made under a temporary name and renamed into place, so a runtime reading the directory never
sees a half-made one and two prepares making the same node at once both succeed.

Making the node is the seam (``NodeMaker``): tests that run without CAP_MKNOD pass their own.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import stat
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from cdi.spec import DeviceNode

log = logging.getLogger(__name__)

#: The numbers of /dev/null: what every stand-in node is.
STAND_IN_MAJOR = 1
STAND_IN_MINOR = 3
#: A container path the stand-ins may take: under /dev, plain names, no "." or "..".
_CONTAINER_PATH_RE = re.compile(r"/dev(/[A-Za-z0-9_][A-Za-z0-9_.:-]*)+")
_CAP_HINT = "the agent needs CAP_MKNOD (a privileged container, or that capability)"


class SimulatedNodeError(Exception):
    """A stand-in node could not be made; the message names the path and the cause."""

    def __init__(self, path: Path, cause: str) -> None:
        super().__init__(f"cannot make the simulated device node {path}: {cause}")
        self.path = path
        self.cause = cause


class NodeMaker(Protocol):
    """Makes and recognises the stand-in nodes (``MknodMaker``; tests pass a fake)."""

    def is_stand_in(self, path: Path) -> bool:
        """Whether ``path`` (not followed if a symlink) already is a stand-in node."""
        ...

    def make(self, path: Path) -> None:
        """Make a stand-in at ``path``, where nothing is; ``OSError`` when it cannot."""
        ...


@dataclass(frozen=True, slots=True)
class MknodMaker:
    """The real one: ``mknod`` of a character device 1:3, mode 0666 whatever the umask."""

    def is_stand_in(self, path: Path) -> bool:
        try:
            st = os.lstat(path)
        except OSError:  # missing, or a file where its directory should be
            return False
        return stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(
            STAND_IN_MAJOR, STAND_IN_MINOR)

    def make(self, path: Path) -> None:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(STAND_IN_MAJOR, STAND_IN_MINOR))
        os.chmod(path, 0o666)  # as /dev/null is; mknod's mode went through the umask


@dataclass(frozen=True)
class SimulatedNodes:
    """The stand-ins under ``directory``: ``node("/dev/nvidia0")`` makes
    ``directory/nvidia0`` if needed and returns the CDI device node that injects it."""

    directory: Path
    maker: NodeMaker = field(default_factory=MknodMaker)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False,
                                  compare=False)

    def host_path(self, container_path: str) -> Path:
        """Where the stand-in of ``container_path`` (``/dev/infiniband/uverbs0``) lives."""
        if not _CONTAINER_PATH_RE.fullmatch(container_path):
            raise ValueError(f"not a device node path for a stand-in: {container_path!a}")
        return self.directory / container_path.removeprefix("/dev/")

    def node(self, container_path: str) -> DeviceNode:
        """The stand-in of ``container_path``, made if needed; ``SimulatedNodeError``."""
        host = self.host_path(container_path)
        self.ensure(host)
        return DeviceNode(path=container_path, host_path=str(host), type="c",
                          major=STAND_IN_MAJOR, minor=STAND_IN_MINOR, permissions="rw")

    def ensure(self, host: Path) -> None:
        """Make ``host`` a stand-in node unless it already is one."""
        if self.maker.is_stand_in(host):
            return
        with self._lock:  # one thread at a time replaces what is in the way
            if self.maker.is_stand_in(host):
                return
            try:
                self._directories(host.parent)
                self._put(host)
            except OSError as err:
                cause = err.strerror or str(err)
                if err.errno == errno.EPERM:
                    cause = f"{cause}; {_CAP_HINT}"
                raise SimulatedNodeError(host, cause) from err

    def _directories(self, parent: Path) -> None:
        """``parent`` and the directories between it and ``directory``, as directories:
        whatever else is in the way (a file, a symlink) goes, since all of it is ours."""
        self.directory.parent.mkdir(parents=True, exist_ok=True)
        rel = parent.relative_to(self.directory)
        current = self.directory
        for part in ("", *rel.parts):
            current = current / part if part else current
            try:
                st = os.lstat(current)
            except FileNotFoundError:
                current.mkdir(mode=0o755)
                continue
            if stat.S_ISDIR(st.st_mode):
                continue
            log.warning("replacing what is in the way of the simulated device node directory",
                        extra={"path": str(current), "found": _file_kind(st.st_mode)})
            current.unlink()
            current.mkdir(mode=0o755)

    def _put(self, host: Path) -> None:
        tmp = host.with_name(f".{host.name}.tmp-{os.getpid()}")
        if os.path.lexists(tmp):
            tmp.unlink()  # left by an agent killed in between
        self.maker.make(tmp)
        try:
            found = _found(host)
            try:
                os.replace(tmp, host)
            except OSError:  # a directory in the way: rename replaces no directory
                if os.path.islink(host) or not os.path.isdir(host):
                    raise
                shutil.rmtree(host)
                os.replace(tmp, host)
        except BaseException:
            if os.path.lexists(tmp):
                tmp.unlink()
            raise
        if found is None:
            log.info("made a simulated device node", extra={"path": str(host)})
        else:
            log.warning("replaced a file in the way of a simulated device node",
                        extra={"path": str(host), "found": found})


def _found(path: Path) -> str | None:
    try:
        return _file_kind(os.lstat(path).st_mode)
    except FileNotFoundError:
        return None


def _file_kind(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "symlink"), (stat.S_ISDIR, "directory"),
                       (stat.S_ISREG, "regular file"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device"), (stat.S_ISFIFO, "fifo"),
                       (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "unknown file"
