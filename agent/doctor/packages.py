"""Which containerd, CRI-O and kubelet are installed, from files a read-only host root has.

A binary under the host root cannot be asked ``--version`` (it may not even run in the agent's
image), so: the dpkg database first (Debian and Ubuntu record every package's version), then,
for containerd only, the binary's own bytes: containerd 2.x is built from the Go module
``github.com/containerd/containerd/v2`` and its package paths are in the binary; 1.x's are not.
That one fact decides the CDI default (off in 1.7, on in 2.x) for a version-2 config.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from agent.doctor.host import HostFileError, HostRoot

DPKG_STATUS = "/var/lib/dpkg/status"
#: A big server's status file is a few MiB; the cap only bounds a planted one.
MAX_STATUS_BYTES = 64 << 20
CONTAINERD_BINARIES = ("/usr/bin/containerd", "/usr/local/bin/containerd", "/bin/containerd")
V2_MODULE = b"github.com/containerd/containerd/v2/"
#: containerd is ~50 MiB; a file far bigger at its name is not it.
MAX_BINARY_BYTES = 512 << 20
_CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class Installed:
    """A version (or only a major version) and where it was read."""

    version: str
    source: str

    @property
    def major_minor(self) -> tuple[int, int] | None:
        head = self.version.split(":", 1)[-1].lstrip("v")  # dpkg epochs: "1:1.7.2"
        parts = head.replace("-", ".").replace("~", ".").split(".")
        try:
            return int(parts[0]), int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
        except ValueError:
            return None


def dpkg_versions(host: HostRoot) -> dict[str, str]:
    """Installed package -> version from the dpkg database; {} when there is none (or it
    cannot be read: this only refines other checks, it is never a finding of its own)."""
    try:
        text = host.read_text(DPKG_STATUS, MAX_STATUS_BYTES)
    except (FileNotFoundError, HostFileError):
        return {}
    out: dict[str, str] = {}
    for stanza in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            key, sep, value = line.partition(": ")
            if sep and not line.startswith(" "):
                fields[key] = value.strip()
        if fields.get("Status", "").endswith(" installed") and "Package" in fields:
            out[fields["Package"]] = fields.get("Version", "")
    return out


def from_dpkg(packages: dict[str, str], *names: str) -> Installed | None:
    for name in names:
        if packages.get(name):
            return Installed(packages[name], f"dpkg {name}")
    return None


def _mentions(host: HostRoot, host_path: str, needle: bytes) -> bool | None:
    """Whether the regular file at ``host_path`` holds ``needle``; None when it cannot be read.
    Read in chunks (never whole), without following a planted link or waiting on a FIFO."""
    import stat

    try:
        local = host.path(host_path)
        fd = os.open(local, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except (OSError, HostFileError):
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_BINARY_BYTES:
            return None
        tail = b""
        while chunk := os.read(fd, _CHUNK):
            if needle in tail + chunk:
                return True
            tail = chunk[-len(needle):]
        return False
    finally:
        os.close(fd)


def containerd_installed(host: HostRoot, packages: dict[str, str]) -> Installed | None:
    found = from_dpkg(packages, "containerd.io", "containerd")
    if found is not None:
        return found
    for path in CONTAINERD_BINARIES:
        v2 = _mentions(host, path, V2_MODULE)
        if v2 is not None:
            return Installed("2.x" if v2 else "1.x", f"the binary {path}")
    return None
