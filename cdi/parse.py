"""Strict parsing of spec documents into the model of ``cdi.spec``.

Like the reference library, an unknown key is an error (its JSON decoding would also accept
keys in another case; we do not, so our files never depend on that). Every error names the
field at fault, e.g. ``devices[0].deviceNodes[1].major must be an integer``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cdi.errors import CDISpecError
from cdi.spec import (
    CDIDevice,
    ContainerEdits,
    DeviceNode,
    Hook,
    Mount,
    NetDevice,
    Spec,
    minimal_version,
)
from cdi.version import KNOWN_VERSIONS, version_key


def edits_from_dict(data: Any, where: str) -> ContainerEdits:
    raw = _mapping(data, where)
    _only(raw, {"env", "deviceNodes", "mounts", "hooks", "netDevices"}, where)
    return ContainerEdits(
        env=tuple(_str_list(raw.get("env"), f"{where}.env")),
        device_nodes=tuple(
            _node(n, f"{where}.deviceNodes[{i}]")
            for i, n in enumerate(_list(raw.get("deviceNodes"), f"{where}.deviceNodes"))
        ),
        mounts=tuple(
            _mount(m, f"{where}.mounts[{i}]")
            for i, m in enumerate(_list(raw.get("mounts"), f"{where}.mounts"))
        ),
        hooks=tuple(
            _hook(h, f"{where}.hooks[{i}]")
            for i, h in enumerate(_list(raw.get("hooks"), f"{where}.hooks"))
        ),
        net_devices=tuple(
            _net(d, f"{where}.netDevices[{i}]")
            for i, d in enumerate(_list(raw.get("netDevices"), f"{where}.netDevices"))
        ),
    )


def spec_from_dict(data: Any) -> Spec:
    raw = _mapping(data, "spec")
    _only(raw, {"cdiVersion", "kind", "devices", "containerEdits"}, "spec")
    version = raw.get("cdiVersion")
    if not isinstance(version, str) or not version:
        raise CDISpecError("cdiVersion missing or not a string")
    try:
        known = version_key(version) in {version_key(v) for v in KNOWN_VERSIONS}
    except ValueError:
        known = False
    if not known:
        raise CDISpecError(f"unknown cdiVersion {version!r}")
    kind = raw.get("kind")
    if not isinstance(kind, str):
        raise CDISpecError("kind missing or not a string")
    devices = []
    for i, item in enumerate(_list(raw.get("devices"), "devices")):
        dev = _mapping(item, f"devices[{i}]")
        _only(dev, {"name", "containerEdits"}, f"devices[{i}]")
        name = dev.get("name")
        if not isinstance(name, str):
            raise CDISpecError(f"devices[{i}].name missing or not a string")
        devices.append(
            CDIDevice(name, edits_from_dict(dev.get("containerEdits", {}), f"devices[{i}]"))
        )
    spec = Spec(
        kind=kind,
        devices=tuple(devices),
        container_edits=edits_from_dict(raw.get("containerEdits", {}), "containerEdits"),
    )
    spec.validate()
    # A file that uses features newer than it declares is refused by current runtimes.
    needed = minimal_version(spec)
    if version_key(version) < version_key(needed):
        raise CDISpecError(f"cdiVersion {version} too low: the content needs {needed}")
    return spec


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise CDISpecError(f"{where} must be an object")
    return value


def _only(raw: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise CDISpecError(f"{where}: unknown or unsupported field(s) {', '.join(unknown)}")


def _list(value: Any, where: str) -> Sequence[Any]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise CDISpecError(f"{where} must be a list")
    return value


def _str_list(value: Any, where: str) -> list[str]:
    items = _list(value, where)
    if not all(isinstance(x, str) for x in items):
        raise CDISpecError(f"{where} must be a list of strings")
    return list(items)


def _str(raw: Mapping[str, Any], key: str, where: str, required: bool = False) -> str | None:
    value = raw.get(key)
    if value is None:
        if required:
            raise CDISpecError(f"{where}.{key} is required")
        return None
    if not isinstance(value, str):
        raise CDISpecError(f"{where}.{key} must be a string")
    return value


def _int(raw: Mapping[str, Any], key: str, where: str, unsigned: bool = False) -> int | None:
    value = raw.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or (unsigned and value < 0):
        raise CDISpecError(f"{where}.{key} must be a{' non-negative' if unsigned else 'n'} integer")
    return value


def _node(data: Any, where: str) -> DeviceNode:
    raw = _mapping(data, where)
    _only(
        raw,
        {"path", "hostPath", "type", "major", "minor", "fileMode", "permissions", "uid", "gid"},
        where,
    )
    return DeviceNode(
        path=_str(raw, "path", where, required=True) or "",
        host_path=_str(raw, "hostPath", where),
        type=_str(raw, "type", where),
        major=_int(raw, "major", where),
        minor=_int(raw, "minor", where),
        file_mode=_int(raw, "fileMode", where, unsigned=True),
        permissions=_str(raw, "permissions", where),
        uid=_int(raw, "uid", where, unsigned=True),
        gid=_int(raw, "gid", where, unsigned=True),
    )


def _mount(data: Any, where: str) -> Mount:
    raw = _mapping(data, where)
    _only(raw, {"hostPath", "containerPath", "type", "options"}, where)
    return Mount(
        host_path=_str(raw, "hostPath", where, required=True) or "",
        container_path=_str(raw, "containerPath", where, required=True) or "",
        options=tuple(_str_list(raw.get("options"), f"{where}.options")),
        type=_str(raw, "type", where),
    )


def _hook(data: Any, where: str) -> Hook:
    raw = _mapping(data, where)
    _only(raw, {"hookName", "path", "args", "env", "timeout"}, where)
    return Hook(
        hook_name=_str(raw, "hookName", where, required=True) or "",
        path=_str(raw, "path", where, required=True) or "",
        args=tuple(_str_list(raw.get("args"), f"{where}.args")),
        env=tuple(_str_list(raw.get("env"), f"{where}.env")),
        timeout=_int(raw, "timeout", where),
    )


def _net(data: Any, where: str) -> NetDevice:
    raw = _mapping(data, where)
    _only(raw, {"hostInterfaceName", "name"}, where)
    return NetDevice(
        host_interface_name=_str(raw, "hostInterfaceName", where, required=True) or "",
        name=_str(raw, "name", where, required=True) or "",
    )
