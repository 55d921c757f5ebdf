"""The lowest ``cdiVersion`` that covers what a spec uses.

Runtimes refuse versions newer than the CDI library they vendored (Debian 12's knows up to
0.5.0, containerd 1.7 vendored 0.5.x/0.6.x), so we write the minimum, never the newest.
The rules mirror the reference library's "minimum required version" table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cdi.spec import ContainerEdits, Spec

#: Versions this library can write or read, oldest first.
KNOWN_VERSIONS = ("0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0")
BASELINE = "0.3.0"


def version_key(version: str) -> tuple[int, ...]:
    """``"0.5.0"`` -> ``(0, 5, 0)``; a leading ``v`` is tolerated as the Go library does."""
    return tuple(int(part) for part in version.lstrip("v").split("."))


def _edits_version(edits: ContainerEdits) -> str:
    if edits.net_devices:
        return "1.1.0"
    if any(node.host_path is not None for node in edits.device_nodes):
        return "0.5.0"
    if any(mount.type for mount in edits.mounts):
        return "0.4.0"
    return BASELINE


def minimal_version(spec: Spec) -> str:
    """The lowest cdiVersion whose features cover ``spec``.

    0.3.0 baseline; 0.4.0 for a mount ``type``; 0.5.0 for a node ``hostPath`` or a device name
    starting with a digit; 0.6.0 for a '.' in the class; 1.1.0 for ``netDevices``.
    """
    needed = [_edits_version(spec.container_edits)]
    for device in spec.devices:
        needed.append(_edits_version(device.container_edits))
        if device.name[:1].isdigit():
            needed.append("0.5.0")
    if "." in spec.kind.partition("/")[2]:
        needed.append("0.6.0")
    return max(needed, key=version_key)
