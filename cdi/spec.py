"""The CDI spec model: frozen dataclasses with exact camelCase conversion both ways.

``to_dict`` emits keys in a fixed order and only the fields that are set, so the same spec
always serialises to the same bytes, with the lowest ``cdiVersion`` that covers it
(``minimal_version``). Reading a spec back is ``cdi.parse``'s job: this module does not import
it, so the model has no cycle.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any, TypeVar

from cdi.errors import CDINameError, CDISpecError
from cdi.names import validate_device_name, validate_kind
from cdi.version import BASELINE, version_key

HOOK_NAMES = frozenset(
    {"prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop"}
)
NODE_TYPES = frozenset({"c", "b", "u", "p"})


@dataclass(frozen=True, slots=True)
class DeviceNode:
    """A device node in the container. ``host_path`` defaults to ``path`` (needs 0.5.0 if set)."""

    path: str
    host_path: str | None = None
    type: str | None = None
    major: int | None = None
    minor: int | None = None
    file_mode: int | None = None  # permission bits; written in decimal as CDI wants
    permissions: str | None = None  # cgroup access, letters of "rwm"
    uid: int | None = None
    gid: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path}
        for key, value in (
            ("hostPath", self.host_path),
            ("type", self.type),
            ("major", self.major),
            ("minor", self.minor),
            ("fileMode", self.file_mode),
            ("permissions", self.permissions),
            ("uid", self.uid),
            ("gid", self.gid),
        ):
            if value is not None:
                out[key] = value
        return out


@dataclass(frozen=True, slots=True)
class Mount:
    host_path: str
    container_path: str
    options: tuple[str, ...] = ()
    type: str | None = None  # needs 0.4.0

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"hostPath": self.host_path, "containerPath": self.container_path}
        if self.type is not None:
            out["type"] = self.type
        if self.options:
            out["options"] = list(self.options)
        return out


@dataclass(frozen=True, slots=True)
class Hook:
    hook_name: str
    path: str
    args: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    timeout: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"hookName": self.hook_name, "path": self.path}
        if self.args:
            out["args"] = list(self.args)
        if self.env:
            out["env"] = list(self.env)
        if self.timeout is not None:
            out["timeout"] = self.timeout
        return out


@dataclass(frozen=True, slots=True)
class NetDevice:
    """Move host interface ``host_interface_name`` into the container as ``name`` (CDI 1.1.0)."""

    host_interface_name: str
    name: str

    def to_dict(self) -> dict[str, Any]:
        return {"hostInterfaceName": self.host_interface_name, "name": self.name}


T = TypeVar("T")


def _merge_keyed(items: Iterable[T], key: Callable[[T], object]) -> tuple[T, ...]:
    # A later entry with the same key replaces the earlier one in place, which is what a
    # runtime does when it applies the edits (same env name, node path, mount target).
    merged: dict[object, T] = {}
    for item in items:
        merged[key(item)] = item
    return tuple(merged.values())


def env_name(entry: str) -> str:
    return entry.partition("=")[0]


@dataclass(frozen=True, slots=True)
class ContainerEdits:
    env: tuple[str, ...] = ()
    device_nodes: tuple[DeviceNode, ...] = ()
    mounts: tuple[Mount, ...] = ()
    hooks: tuple[Hook, ...] = ()
    net_devices: tuple[NetDevice, ...] = ()

    def is_empty(self) -> bool:
        return not (self.env or self.device_nodes or self.mounts or self.hooks or self.net_devices)

    def merge(self, other: ContainerEdits) -> ContainerEdits:
        """Both edit sets in order; a later env name, node path or mount target replaces an
        earlier one; identical hooks and net devices appear once."""
        if other.is_empty():
            return self
        if self.is_empty():
            return other
        return ContainerEdits(
            env=_merge_keyed((*self.env, *other.env), env_name),
            device_nodes=_merge_keyed((*self.device_nodes, *other.device_nodes), lambda n: n.path),
            mounts=_merge_keyed((*self.mounts, *other.mounts), lambda m: m.container_path),
            hooks=_merge_keyed((*self.hooks, *other.hooks), lambda h: h),
            net_devices=_merge_keyed(
                (*self.net_devices, *other.net_devices), lambda d: d.host_interface_name
            ),
        )

    def without(self, common: ContainerEdits) -> ContainerEdits:
        """These edits minus the entries that ``common`` already carries identically."""
        return ContainerEdits(
            env=tuple(e for e in self.env if e not in common.env),
            device_nodes=tuple(n for n in self.device_nodes if n not in common.device_nodes),
            mounts=tuple(m for m in self.mounts if m not in common.mounts),
            hooks=tuple(h for h in self.hooks if h not in common.hooks),
            net_devices=tuple(d for d in self.net_devices if d not in common.net_devices),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.env:
            out["env"] = list(self.env)
        if self.device_nodes:
            out["deviceNodes"] = [n.to_dict() for n in self.device_nodes]
        if self.mounts:
            out["mounts"] = [m.to_dict() for m in self.mounts]
        if self.hooks:
            out["hooks"] = [h.to_dict() for h in self.hooks]
        if self.net_devices:
            out["netDevices"] = [d.to_dict() for d in self.net_devices]
        return out

    def validate(self, where: str) -> None:
        """Raise ``CDISpecError`` for anything the reference library would refuse."""
        for entry in self.env:
            if "=" not in entry or entry.startswith("="):
                raise CDISpecError(f"{where}: env entry {entry!r} is not NAME=value")
        for node in self.device_nodes:
            if not node.path:
                raise CDISpecError(f"{where}: device node without path")
            if node.type is not None and node.type not in NODE_TYPES:
                raise CDISpecError(f"{where}: device node {node.path}: bad type {node.type!r}")
            if node.permissions is not None and set(node.permissions) - set("rwm"):
                raise CDISpecError(
                    f"{where}: device node {node.path}: permissions "
                    f"{node.permissions!r} may only hold r, w, m"
                )
        for mount in self.mounts:
            if not mount.host_path or not mount.container_path:
                raise CDISpecError(f"{where}: mount needs hostPath and containerPath")
        for hook in self.hooks:
            if hook.hook_name not in HOOK_NAMES:
                raise CDISpecError(f"{where}: unknown hookName {hook.hook_name!r}")
            if not PurePosixPath(hook.path).is_absolute():
                raise CDISpecError(f"{where}: hook path {hook.path!r} is not absolute")
            if hook.timeout is not None and hook.timeout <= 0:
                raise CDISpecError(f"{where}: hook timeout must be > 0")
            for entry in hook.env:
                if "=" not in entry or entry.startswith("="):
                    raise CDISpecError(f"{where}: hook env entry {entry!r} is not NAME=value")
        hosts = [d.host_interface_name for d in self.net_devices]
        names = [d.name for d in self.net_devices]
        if any(not x for x in (*hosts, *names)):
            raise CDISpecError(f"{where}: netDevices need hostInterfaceName and name")
        if len(set(hosts)) != len(hosts) or len(set(names)) != len(names):
            raise CDISpecError(f"{where}: a netDevices interface appears twice")


@dataclass(frozen=True, slots=True)
class CDIDevice:
    name: str
    container_edits: ContainerEdits

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "containerEdits": self.container_edits.to_dict()}


@dataclass(frozen=True, slots=True)
class Spec:
    """One CDI spec file: a ``vendor/class`` kind, its devices and the shared edits."""

    kind: str
    devices: tuple[CDIDevice, ...]
    container_edits: ContainerEdits = field(default_factory=ContainerEdits)

    @property
    def vendor(self) -> str:
        return self.kind.partition("/")[0]

    @property
    def class_(self) -> str:
        return self.kind.partition("/")[2]

    def qualified_names(self) -> tuple[str, ...]:
        return tuple(f"{self.kind}={d.name}" for d in self.devices)

    def validate(self) -> None:
        """Raise ``CDIError`` for anything a runtime's CDI library would reject at load."""
        validate_kind(self.kind)
        if not self.devices:
            raise CDISpecError("a spec needs at least one device")
        self.container_edits.validate("containerEdits")
        seen: set[str] = set()
        for device in self.devices:
            try:
                validate_device_name(device.name)
            except CDINameError as err:
                raise CDISpecError(str(err)) from err
            if device.name in seen:
                raise CDISpecError(f"device {device.name!r} defined twice")
            seen.add(device.name)
            if device.container_edits.is_empty():
                raise CDISpecError(f"device {device.name!r} has no container edits")
            device.container_edits.validate(f"device {device.name}")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "cdiVersion": minimal_version(self),
            "kind": self.kind,
            "devices": [d.to_dict() for d in self.devices],
        }
        if not self.container_edits.is_empty():
            out["containerEdits"] = self.container_edits.to_dict()
        return out


# Runtimes refuse versions newer than the CDI library they vendored (Debian 12's knows up to
# 0.5.0, containerd 1.7 vendored 0.5.x/0.6.x), so we write the minimum, never the newest.
# The rules mirror the reference library's "minimum required version" table.
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
