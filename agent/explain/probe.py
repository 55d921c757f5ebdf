"""Whether a DeviceClass selects a device of some slices, as the scheduler would find.

The question the start-up check of agent/deviceplugins.py asks of explain: the daemon hands
``selects_a_device`` to it, so that deviceplugins, which doctor loads too, never loads the
allocator or its CEL engine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agent.explain import explain


def selects_a_device(device_class: Mapping[str, Any], slices: Sequence[Mapping[str, Any]],
                     node_name: str) -> bool:
    """True when a claim for one device of ``device_class`` could be allocated from ``slices``
    on ``node_name``: its selectors pass one device, as the scheduler's CEL says.

    Raises ``InputError`` (a ValueError) when the class's selectors do not compile.
    """
    name = (device_class.get("metadata") or {}).get("name")
    probe = {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "device-plugin-overlap", "namespace": "default"},
        "spec": {"devices": {"requests": [
            {"name": "probe", "exactly": {"deviceClassName": name, "count": 1}}]}},
    }
    result = explain(probe, [device_class], slices, node_name)
    return any(report.matching for report in result.requests)
