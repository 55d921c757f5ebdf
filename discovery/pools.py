"""``build_resources(inventory, pool_name)``: the Inventory as the slice controller's input.

One pool per node, named after the node. Devices are ordered deterministically (natural
order of names: gpu-2 before gpu-10) and split into slices that respect the API limits: at
most 128 devices per slice, 64 when any device in that slice has taints, consumes counters
or has a list attribute.
Shared counter sets (partitionable devices) go in slices of their own ahead of the device
slices, at most 8 per slice, as 1.35+ requires.
A pure function: the same inventory always gives equal resources, so the controller can
compare and skip writes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from discovery.model import CounterSet, Device, DriverResources, Inventory, Pool, Slice
from discovery.names import natural_key

MAX_DEVICES = 128
MAX_DEVICES_RESTRICTED = 64  # with taints, consumesCounters or list attributes (1.35+)
MAX_COUNTER_SETS = 8  # per slice
_LIST_KINDS = ("ints", "bools", "strings", "versions")


def _restricted(device: Mapping[str, Any]) -> bool:
    attrs = device.get("attributes") or {}
    has_list = any(isinstance(a, Mapping) and any(k in a for k in _LIST_KINDS)
                   for a in attrs.values())
    return bool(device.get("taints") or device.get("consumesCounters") or has_list)


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
    devices = ordered(inventory.devices)
    sets = inventory.counter_sets
    pools = {pool_name: _pool([d.to_api() for d in devices], sets)}
    # Both forms are built here, each sliced for its own limits (64 devices per slice with
    # list attributes): the controller learns only at run time which one the server takes.
    if not any(isinstance(v, tuple) for d in devices for v in d.attributes.values()):
        return DriverResources(pools=pools)
    lists = {pool_name: _pool([d.to_api(list_attributes=True) for d in devices], sets)}
    return DriverResources(pools=pools, list_pools=lists)


def _pool(api_devices: list[dict[str, Any]], counter_sets: tuple[CounterSet, ...] = ()) -> Pool:
    ordered_sets = sorted(counter_sets, key=lambda c: natural_key(c.name))
    counters = tuple(
        Slice(devices=(), shared_counters=tuple(c.to_api() for c in
                                                ordered_sets[i:i + MAX_COUNTER_SETS]))
        for i in range(0, len(ordered_sets), MAX_COUNTER_SETS)
    )
    chunks = split_devices(api_devices) or ([] if counters else [[]])
    return Pool(slices=counters + tuple(Slice(devices=tuple(chunk)) for chunk in chunks))
