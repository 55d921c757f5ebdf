"""Exception types of the CDI library.

Each carries what an operator needs to act: the file, the name or the device at fault and the
underlying cause. The plugin turns them into per-claim errors at its edge.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from discovery.model import Device


class CDIError(Exception):
    """Base class: something about a CDI spec, name or file is wrong."""


class CDINameError(CDIError, ValueError):
    """A vendor, class, device or qualified name breaks the CDI naming rules."""

    def __init__(self, kind: str, name: str, reason: str) -> None:
        super().__init__(f"invalid CDI {kind} {name!r}: {reason}")
        self.kind = kind
        self.name = name
        self.reason = reason


class CDISpecError(CDIError, ValueError):
    """A spec (ours or read back from disk) is not a valid CDI document."""

    def __init__(self, reason: str, path: Path | None = None) -> None:
        where = f"{path}: " if path is not None else ""
        super().__init__(f"{where}invalid CDI spec: {reason}")
        self.reason = reason
        self.path = path


class CDIWriteError(CDIError, OSError):
    """A spec file could not be written or removed (disk full, read-only, permissions)."""

    def __init__(self, path: Path, cause: OSError) -> None:
        what = cause.strerror or str(cause)
        super().__init__(cause.errno, f"cannot write CDI spec {path}: {what}")
        self.path = path
        self.cause = cause

    def __str__(self) -> str:
        return str(self.args[1])


class DeviceEditsError(CDIError):
    """The container edits for a device cannot be built from what the host has."""

    def __init__(self, device: Device | str, cause: str) -> None:
        name = device if isinstance(device, str) else device.name
        super().__init__(f"device {name}: {cause}")
        self.device = name
        self.cause = cause
