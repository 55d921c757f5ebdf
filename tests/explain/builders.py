"""Hand-built v1 objects for the explain tests (a DGX-like node unless said otherwise)."""

from __future__ import annotations

from typing import Any

DRIVER = "dra-agent.io"
NODE = "node-a"


def device(name: str, type_: str = "gpu", root: str = "pci0000:15", memory: str | None = "80Gi",
           **attrs: Any) -> dict[str, Any]:
    a: dict[str, Any] = {"type": {"string": type_},
                         "resource.kubernetes.io/pcieRoot": {"string": root}}
    for k, v in attrs.items():
        a[k] = ({"bool": v} if isinstance(v, bool) else {"int": v} if isinstance(v, int)
                else {"string": v})
    out: dict[str, Any] = {"name": name, "attributes": a}
    if memory is not None:
        out["capacity"] = {"memory": {"value": memory}}
    return out


def slice_(devices: list[dict[str, Any]], pool: str = NODE, name: str | None = None,
           generation: int = 0, count: int = 1, node: str = NODE, driver: str = DRIVER,
           counters: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"driver": driver, "nodeName": node,
                            "pool": {"name": pool, "generation": generation,
                                     "resourceSliceCount": count}}
    if counters is not None:
        spec["sharedCounters"] = counters
    else:
        spec["devices"] = devices
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": name or f"{node}-{driver}-{pool}-{generation}"}, "spec": spec}


def device_class(name: str, *exprs: str, config: list[dict[str, Any]] | None = None
                 ) -> dict[str, Any]:
    spec: dict[str, Any] = {"selectors": [{"cel": {"expression": e}} for e in exprs]}
    if config:
        spec["config"] = [{"opaque": c} for c in config]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": name}, "spec": spec}


GPU_CLASS = device_class("gpu.dra-agent.io",
                         f'device.driver == "{DRIVER}" && '
                         f'device.attributes["{DRIVER}"].type == "gpu"')
NIC_CLASS = device_class("nic.dra-agent.io",
                         f'device.driver == "{DRIVER}" && '
                         f'device.attributes["{DRIVER}"].type == "nic"')
MIG_CLASS = device_class("mig.dra-agent.io", f'device.attributes["{DRIVER}"].type == "mig"')
CLASSES = [GPU_CLASS, NIC_CLASS, MIG_CLASS]


def exactly(name: str, cls: str = "gpu.dra-agent.io", count: int | None = None,
            *selectors: str, **extra: Any) -> dict[str, Any]:
    ex: dict[str, Any] = {"deviceClassName": cls}
    if count is not None:
        ex["count"] = count
    if selectors:
        ex["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    ex.update(extra)
    return {"name": name, "exactly": ex}


def claim(*requests: dict[str, Any], constraints: list[dict[str, Any]] | None = None,
          config: list[dict[str, Any]] | None = None, name: str = "job",
          namespace: str = "default") -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": list(requests)}
    if constraints:
        devices["constraints"] = constraints
    if config:
        devices["config"] = config
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace}, "spec": {"devices": devices}}


def allocated(name: str, *devices: str, namespace: str = "default", pool: str = NODE,
              admin: bool = False, **extra: Any) -> dict[str, Any]:
    results = []
    for d in devices:
        r: dict[str, Any] = {"request": "r", "driver": DRIVER, "pool": pool, "device": d}
        if admin:
            r["adminAccess"] = True
        r.update(extra)
        results.append(r)
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"devices": {"requests": []}},
            "status": {"allocation": {"devices": {"results": results}}}}


def dgx_slice() -> dict[str, Any]:
    """4 GPUs and 4 NICs, pairs under pci0000:15, :40, :a0, :c0 (two NUMA nodes)."""
    roots = ["pci0000:15", "pci0000:40", "pci0000:a0", "pci0000:c0"]
    devs = [device(f"gpu-{i}", "gpu", r, numa=i // 2) for i, r in enumerate(roots)]
    devs += [device(f"nic-{i}", "nic", r, None, numa=i // 2) for i, r in enumerate(roots)]
    return slice_(devs)
