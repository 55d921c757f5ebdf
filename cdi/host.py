"""Host facts the edits are built from: device nodes, ``/proc/devices``, rooted paths.

Every number written into a spec is read from the host (``stat`` of the node, or the kernel's
own tables); none is guessed from conventions.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from cdi.spec import DeviceNode

_MAX_LINKS = 40  # the kernel's own symlink-follow limit


class HostLookupError(Exception):
    """A host fact is missing or unreadable; ``reason`` says which and why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def in_root(root: Path, path: str | PurePosixPath) -> Path:
    """``path`` (absolute, as the host sees it) inside ``root``."""
    rel = str(path).lstrip("/")
    return root / rel if rel else root


def strip_root(root: Path, path: Path) -> str:
    """The host-absolute form of ``path``, which lies under ``root``."""
    rel = path.relative_to(root)
    return "/" + str(rel) if str(rel) != "." else "/"


def resolve_in_root(root: Path, path: Path) -> Path:
    """Follow symlinks of ``path`` (under ``root``) as if ``root`` were ``/``.

    An absolute link target inside a driver root mounted elsewhere points at the *host's*
    path, so it is re-anchored under ``root`` instead of being followed on this machine.
    """
    parts = list(PurePosixPath(strip_root(root, path)).parts[1:])
    done: list[str] = []
    follows = 0
    while parts:
        part = parts.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            if done:
                done.pop()
            continue
        candidate = in_root(root, "/".join([*done, part]))
        if candidate.is_symlink():
            follows += 1
            if follows > _MAX_LINKS:
                raise HostLookupError(f"{path}: too many levels of symbolic links")
            target = os.readlink(candidate)
            if target.startswith("/"):
                done = []
            parts = list(PurePosixPath(target).parts[1 if target.startswith("/") else 0 :]) + parts
            continue
        done.append(part)
    return in_root(root, "/".join(done))


@dataclass(frozen=True, slots=True)
class NodeInfo:
    major: int
    minor: int
    mode: int  # permission bits
    ino: int
    mtime_ns: int


def stat_char_node(host_path: Path) -> NodeInfo:
    """``stat`` a character device node; ``HostLookupError`` if missing or not a char device."""
    try:
        st = os.stat(host_path)
    except FileNotFoundError as err:
        raise HostLookupError(f"device node {host_path} does not exist") from err
    except OSError as err:
        raise HostLookupError(f"device node {host_path}: {err.strerror or err}") from err
    if not stat.S_ISCHR(st.st_mode):
        raise HostLookupError(f"{host_path} is not a character device")
    return NodeInfo(
        major=os.major(st.st_rdev),
        minor=os.minor(st.st_rdev),
        mode=stat.S_IMODE(st.st_mode),
        ino=st.st_ino,
        mtime_ns=st.st_mtime_ns,
    )


def char_node(dev_root: Path, container_path: str) -> DeviceNode:
    """A ``type: c`` node for ``container_path`` (``/dev/...``) with numbers from the host.

    Type, major and minor are written explicitly so the runtime need not ``stat`` the host
    again at container creation; ``hostPath`` is written only when the host path differs,
    because it raises the spec to cdiVersion 0.5.0.
    """
    host = dev_host_path(dev_root, container_path)
    info = stat_char_node(host)
    return DeviceNode(
        path=container_path,
        host_path=None if str(host) == container_path else str(host),
        type="c",
        major=info.major,
        minor=info.minor,
        file_mode=info.mode,
    )


def dev_host_path(dev_root: Path, container_path: str) -> Path:
    """Where ``/dev/<x>`` lives on the host when devices are found under ``dev_root``."""
    rel = PurePosixPath(container_path).relative_to("/dev")
    return dev_root / rel


def read_proc_devices(proc_root: Path) -> dict[str, int]:
    """Character device majors by driver name, from ``<proc>/devices``."""
    path = proc_root / "devices"
    try:
        text = path.read_text()
    except OSError as err:
        raise HostLookupError(f"cannot read {path}: {err.strerror or err}") from err
    majors: dict[str, int] = {}
    in_char = False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.endswith(":"):
            in_char = stripped == "Character devices:"
            continue
        fields = stripped.split()
        if in_char and len(fields) == 2 and fields[0].isdigit():
            majors.setdefault(fields[1], int(fields[0]))
    return majors


def read_key_values(path: Path) -> dict[str, str]:
    """``Key: value`` lines (NVIDIA procfs style; values may be tab-padded)."""
    try:
        text = path.read_text()
    except FileNotFoundError as err:
        raise HostLookupError(f"{path} does not exist") from err
    except OSError as err:
        raise HostLookupError(f"cannot read {path}: {err.strerror or err}") from err
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out
