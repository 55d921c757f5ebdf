"""``build_resources(inventory, pool_name)``: the Inventory as the slice controller's input.

One pool per node, named after the node. Devices are ordered deterministically (natural
order of names: gpu-2 before gpu-10) and split into slices that respect the API limits: at
most 128 devices per slice, 64 when any device in that slice has taints or consumes counters.
A pure function: the same inventory always gives equal resources, so the controller can
compare and skip writes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from discovery.model import Device, DriverResources, Inventory, Pool, Slice
from discovery.names import natural_key

MAX_DEVICES = 128
MAX_DEVICES_RESTRICTED = 64  # with taints or consumesCounters (resource.k8s.io 1.35+)

def _restricted(device: Mapping[str, Any]) -> bool:
    return bool(device.get("taints") or device.get("consumesCounters"))


def split_devices(devices: Iterable[Mapping[str, Any]]) -> list[list[Mapping[str, Any]]]:
    """Greedy chunks in order; a chunk closes when the next device would break its limit."""
    chunks: list[list[Mapping[str, Any]]] = []
    current: list[Mapping[str, Any]] = []
    restricted = False
    for device in devices:
        would_restrict = restricted or _restricted(device)
        limit = MAX_DEVICES_RESTRICTED if would_restrict else MAX_DEVICES
        if current and len(current) + 1 > limit:
            chunks.append(current)
            current, restricted = [], False
            would_restrict = _restricted(device)
        current.append(device)
        restricted = would_restrict
    if current:
        chunks.append(current)
    return chunks


def ordered(devices: Iterable[Device]) -> list[Device]:
    return sorted(devices, key=lambda d: natural_key(d.name))


def build_resources(inventory: Inventory, pool_name: str) -> DriverResources:
    """One pool ``pool_name`` holding every offered device, split into valid slices.

    An empty inventory still yields the pool with one empty slice, so the controller
    publishes "this node has nothing" instead of leaving stale slices behind.
    """
    api_devices = [d.to_api() for d in ordered(inventory.devices)]
    chunks = split_devices(api_devices) or [[]]
    slices = tuple(Slice(devices=tuple(chunk)) for chunk in chunks)
    return DriverResources(pools={pool_name: Pool(slices=slices)})
