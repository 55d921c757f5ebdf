"""Files of the host as seen under ``--host-root`` (in a pod: the host's ``/`` mounted read-only).

Host paths are absolute on the host, and so are many of its symlinks (``/var/run -> /run``):
followed by the kernel they would leave the mount and name the pod's own files. ``HostRoot.path``
therefore resolves every component itself, an absolute link target starting again at the host
root, never above it; past the kernel's 40 links it is a ``HostFileError`` (the runner shows it
as that check's one line), never a path that still holds a link. Every read goes through
``agent.common.safefile.read_capped``: a FIFO, a device or a huge file at a config's name is
refused at once instead of blocking or filling memory, and comes back as one ``HostFileError``
line.
"""

from __future__ import annotations

import errno
import os
import stat
import tomllib
from pathlib import Path, PurePosixPath
from typing import Any

from agent.common.safefile import UnsafeFileError, read_capped

#: Config files are a few KiB; a bigger file at their name is not one.
MAX_FILE_BYTES = 1 << 20
_MAX_LINKS = 40  # as the kernel's own limit


class HostFileError(Exception):
    """A host file that cannot be read or parsed; the message is one line naming it."""


class HostRoot:
    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, host_path: str | PurePosixPath) -> Path:
        """The local path of ``host_path`` (absolute on the host), its symlinks resolved
        inside the host root: no component of what it returns is a link (a missing one is kept
        as named, and so is the rest after it). Raises ``HostFileError`` past 40 links, as the
        kernel refuses: the rest unresolved would be links the kernel follows out of the root."""
        parts = list(PurePosixPath("/", host_path).parts[1:])
        resolved: list[str] = []
        links = 0
        while parts:
            part = parts.pop(0)
            if part in ("", "."):
                continue
            if part == "..":
                if resolved:
                    resolved.pop()
                continue
            local = self.root.joinpath(*resolved, part)
            try:
                target = os.readlink(local)
            except OSError:  # not a link, or missing: keep the name as it is
                resolved.append(part)
                continue
            links += 1
            if links > _MAX_LINKS:
                raise HostFileError(f"{self.shown(host_path)}: more than {_MAX_LINKS} symbolic "
                                    "links to follow (the kernel refuses as many)")
            if target.startswith("/"):
                resolved = []
            parts = list(PurePosixPath(target).parts[1 if target.startswith("/") else 0:]) + parts
        return self.root.joinpath(*resolved)

    def shown(self, host_path: str | PurePosixPath) -> str:
        """How a host path is named in a report: as the operator knows it on the host."""
        return str(PurePosixPath("/", host_path))

    def exists(self, host_path: str | PurePosixPath) -> bool:
        return os.path.lexists(self.path(host_path))

    def is_dir(self, host_path: str | PurePosixPath) -> bool:
        return self.path(host_path).is_dir()

    def is_socket(self, host_path: str | PurePosixPath) -> bool:
        try:
            return stat.S_ISSOCK(os.lstat(self.path(host_path)).st_mode)
        except OSError:
            return False

    def listdir(self, host_path: str | PurePosixPath) -> list[str]:
        """Sorted names in a directory; [] when it is missing or not one."""
        try:
            return sorted(os.listdir(self.path(host_path)))
        except OSError:
            return []

    def read_bytes(self, host_path: str | PurePosixPath, cap: int = MAX_FILE_BYTES) -> bytes:
        """The file's bytes. Raises ``FileNotFoundError`` when it is absent (callers decide
        whether that is normal) and ``HostFileError`` for anything else."""
        local = self.path(host_path)
        try:
            return read_capped(local, cap)
        except FileNotFoundError:
            raise
        except UnsafeFileError as err:
            raise HostFileError(f"{self.shown(host_path)} {err.reason}") from err
        except OSError as err:
            if err.errno == errno.ENOTDIR:
                raise FileNotFoundError(str(local)) from err
            raise HostFileError(f"{self.shown(host_path)}: {err.strerror or err}") from err

    def read_text(self, host_path: str | PurePosixPath, cap: int = MAX_FILE_BYTES) -> str:
        raw = self.read_bytes(host_path, cap)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise HostFileError(f"{self.shown(host_path)}: not UTF-8 text "
                                f"(byte 0x{raw[err.start]:02x} at offset {err.start})") from err

    def read_toml(self, host_path: str | PurePosixPath) -> dict[str, Any]:
        text = self.read_text(host_path)
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as err:
            raise HostFileError(f"{self.shown(host_path)}: not valid TOML: "
                                f"{one_line(str(err))}") from err
        except RecursionError as err:
            raise HostFileError(f"{self.shown(host_path)}: nested too deeply") from err

    def read_yaml(self, host_path: str | PurePosixPath) -> Any:
        import yaml

        text = self.read_text(host_path)
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise HostFileError(f"{self.shown(host_path)}: not valid YAML: "
                                f"{one_line(str(err))}") from err
        except RecursionError as err:
            raise HostFileError(f"{self.shown(host_path)}: nested too deeply") from err

    def read_json(self, host_path: str | PurePosixPath, cap: int = MAX_FILE_BYTES) -> Any:
        import json

        text = self.read_text(host_path, cap)
        try:
            return json.loads(text)
        except ValueError as err:
            raise HostFileError(f"{self.shown(host_path)}: not valid JSON: "
                                f"{one_line(str(err))}") from err
        except RecursionError as err:
            raise HostFileError(f"{self.shown(host_path)}: nested too deeply") from err


def one_line(text: str, limit: int = 300) -> str:
    return " ".join(text.split())[:limit]


def table(doc: Any, *keys: str) -> dict[str, Any]:
    """``doc[k1][k2]...`` when every step is a table, else {} (a wrong type is not a crash)."""
    for key in keys:
        doc = doc.get(key) if isinstance(doc, dict) else None
    return doc if isinstance(doc, dict) else {}
