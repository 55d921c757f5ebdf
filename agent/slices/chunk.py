"""Splitting a pool's devices into slices that fit the API's per-slice limits.

The controller never splits a pool itself (the upstream contract: one desired Slice, one
ResourceSlice); the driver does, with this helper, so the order of devices (the allocation
preference) is kept and the split is the same on every run for the same hardware.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agent.slices.validate import MAX_DEVICES, MAX_DEVICES_RESTRICTED, is_restricted
from discovery.model import Slice


def chunk_devices(
    devices: Sequence[Mapping[str, Any]], max_per_slice: int = MAX_DEVICES
) -> tuple[Slice, ...]:
    """Consecutive runs of ``devices``, each within the limit that applies to it.

    A slice holding a device with taints, counter consumption or list attributes may carry
    only 64 devices; such a slice is closed at 64. No devices gives one empty slice: an empty
    pool tells the scheduler the driver runs and has nothing, unlike no pool at all.
    """
    if max_per_slice < 1:
        raise ValueError(f"max_per_slice must be >= 1, not {max_per_slice}")
    chunks: list[list[Mapping[str, Any]]] = [[]]
    restricted = False
    for device in devices:
        current = chunks[-1]
        dev_restricted = is_restricted(device)
        limit = min(max_per_slice, MAX_DEVICES_RESTRICTED if restricted or dev_restricted
                    else MAX_DEVICES)
        if len(current) >= limit:
            chunks.append([])
            restricted = False
        chunks[-1].append(device)
        restricted = restricted or dev_restricted
    return tuple(Slice(tuple(chunk)) for chunk in chunks)
