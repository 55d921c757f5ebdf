"""Builders shared by the slice controller tests."""

from __future__ import annotations

from typing import Any

from agent.slices import chunk_devices
from discovery.model import DriverResources, Pool

DRIVER = "dra-agent.io"
NODE = "node1"


def device(i: int, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": f"gpu-{i}",
        "attributes": {"type": {"string": "gpu"}, "index": {"int": i}},
        "capacity": {"memory": {"value": "80Gi"}},
    }
    out.update(extra)
    return out


def devices(n: int, start: int = 0, **extra: Any) -> list[dict[str, Any]]:
    return [device(i, **extra) for i in range(start, start + n)]


def pool_of(n: int, **kw: Any) -> Pool:
    return Pool(chunk_devices(devices(n)), **kw)


def resources(**pools: Pool) -> DriverResources:
    return DriverResources(dict(pools))


def node(name: str = NODE) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}
