"""resource.k8s.io versions: which one to use and how ResourceSlices look in each.

The controller works on v1-shaped dicts everywhere. v1beta2 has the same shape as v1.
v1beta1 nests every device field except ``name`` under ``basic``, and types ``nodeName`` as a
plain string and ``allNodes`` as a plain bool (empty/false meaning unset), so objects are
converted at the API edge only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

GROUP = "resource.k8s.io"
#: In order of preference (DESIGN.md "API versions").
PREFERRED_VERSIONS = ("v1", "v1beta2", "v1beta1")
NESTED_DEVICE_VERSIONS = frozenset({"v1beta1"})


class NoResourceAPIError(RuntimeError):
    """The API server serves none of the resource.k8s.io versions this agent can publish."""

    def __init__(self, served: Iterable[str]) -> None:
        served_list = sorted(served)
        super().__init__(
            f"the API server serves no usable {GROUP} version for ResourceSlices "
            f"(served: {', '.join(served_list) or 'none'}; need one of "
            f"{', '.join(PREFERRED_VERSIONS)}); is DynamicResourceAllocation enabled?"
        )
        self.served = tuple(served_list)


def choose_version(served: Iterable[str]) -> str:
    """The most preferred version the server serves; raise NoResourceAPIError if none."""
    available = set(served)
    for version in PREFERRED_VERSIONS:
        if version in available:
            return version
    raise NoResourceAPIError(available)


def api_version(version: str) -> str:
    return f"{GROUP}/{version}"


def to_wire(obj: Mapping[str, Any], version: str) -> dict[str, Any]:
    """A v1-shaped ResourceSlice dict as ``version`` expects it.

    A new top-level dict; nested values are shared with ``obj`` (nothing here mutates
    them), because deep copies of 2,048 devices cost more than sending them.
    """
    out = dict(obj)
    out["apiVersion"] = api_version(version)
    out.setdefault("kind", "ResourceSlice")
    if version not in NESTED_DEVICE_VERSIONS:
        return out
    spec = out.get("spec")
    if isinstance(spec, Mapping):
        spec = out["spec"] = dict(spec)
        devices = spec.get("devices")
        if isinstance(devices, list):
            spec["devices"] = [_nest_device(d) for d in devices]
    return out


def from_wire(obj: Mapping[str, Any], version: str) -> dict[str, Any]:
    """A ResourceSlice dict read in ``version``, in v1 shape (new top level and spec)."""
    out = dict(obj)
    if version not in NESTED_DEVICE_VERSIONS:
        return out
    spec = out.get("spec")
    if isinstance(spec, Mapping):
        spec = out["spec"] = dict(spec)
        devices = spec.get("devices")
        if isinstance(devices, list):
            spec["devices"] = [_flatten_device(d) for d in devices]
        # v1beta1 cannot tell "unset" from empty/false; v1 omits them.
        if spec.get("nodeName") == "":
            del spec["nodeName"]
        if spec.get("allNodes") is False:
            del spec["allNodes"]
    return out


def _nest_device(device: Mapping[str, Any]) -> dict[str, Any]:
    basic = {k: v for k, v in device.items() if k != "name"}
    return {"name": device.get("name"), "basic": basic}


def _flatten_device(device: Mapping[str, Any]) -> dict[str, Any]:
    out = {"name": device.get("name")}
    basic = device.get("basic")
    if isinstance(basic, Mapping):
        out.update(basic)
    return out
