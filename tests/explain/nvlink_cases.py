"""NVLink claims on the agent's own slices of the simulated NVLink machines, in the shape of
``tests/explain/differential.py``'s cases, so that explain and the scheduler's allocator
(``bin/<minor>/allocate``) answer the same input.

tests/explain/test_nvlink.py replays them against the allocator's answers recorded in
tests/data/explain/nvlink-allocator.json; tests/realk8s/test_nvlink_allocator.py asks the
allocator itself and records them again with ``DRA_AGENT_RECORD=1``.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from agent.common.config import Config
from agent.explain.docs import packaged_classes
from agent.explain.sources import slices_from_discovery

NODE = "node-a"
DRIVER = "dra-agent.io"
GPU_CLASS = f"gpu.{DRIVER}"
DOMAIN = f"{DRIVER}/nvlinkDomain"
RECORDED = Path(__file__).parent.parent / "data" / "explain" / "nvlink-allocator.json"


@functools.cache
def slices(profile: str) -> tuple[dict[str, Any], ...]:
    """The profile's slices as the API server stores them: named (from generateName)."""
    out = []
    for i, s in enumerate(slices_from_discovery(Config(simulate=profile, node_name=NODE))):
        meta = dict(s["metadata"])
        meta["name"] = f"{meta.pop('generateName')}{i:05d}"
        out.append({**s, "metadata": meta})
    return tuple(out)


def classes() -> list[dict[str, Any]]:
    return [d.obj for d in packaged_classes() if d.obj.get("kind") == "DeviceClass"]


def bus_id_of(profile: str, device: str) -> str:
    for s in slices(profile):
        for d in s["spec"].get("devices") or []:
            if d["name"] == device:
                return str(d["attributes"]["resource.kubernetes.io/pciBusID"]["string"])
    raise KeyError(device)


def _request(name: str, count: int, *selectors: str) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": GPU_CLASS, "allocationMode": "ExactCount",
                               "count": count}
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    return {"name": name, "exactly": exactly}


def _on(profile: str, device: str) -> str:
    return (f'device.attributes["resource.kubernetes.io"].pciBusID == '
            f'"{bus_id_of(profile, device)}"')


def _claim(*requests: dict[str, Any], match: list[str] | None = None) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": list(requests)}
    if match is not None:
        constraint: dict[str, Any] = {"matchAttribute": DOMAIN}
        if match:
            constraint["requests"] = match
        devices["constraints"] = [constraint]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "job", "namespace": "default", "uid": "uid-job"},
            "spec": {"devices": devices}}


def _case(profile: str, claim: dict[str, Any], held: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"node": NODE, "labels": {"kubernetes.io/hostname": NODE}, "claim": claim,
            "classes": classes(), "slices": list(slices(profile)),
            "allocated": [{"driver": DRIVER, "pool": NODE, "device": d} for d in held]}


PAIRS, HGX, NVL72 = "pcie-nvlink-pairs", "hgx-h100-nvswitch", "gb200-nvl72"


def cases() -> dict[str, dict[str, Any]]:
    """Name -> case; what each must give is in the name and in tests/explain/test_nvlink.py."""
    two = _request("gpus", 2)
    return {
        "pairs-two-sharing-nvlink": _case(PAIRS, _claim(two, match=[])),
        "pairs-two-from-different-pairs": _case(PAIRS, _claim(
            _request("a", 1, _on(PAIRS, "gpu-0")), _request("b", 1, _on(PAIRS, "gpu-2")),
            match=["a", "b"])),
        "pairs-two-from-one-pair": _case(PAIRS, _claim(
            _request("a", 1, _on(PAIRS, "gpu-2")), _request("b", 1, _on(PAIRS, "gpu-3")),
            match=["a", "b"])),
        "pairs-two-with-the-first-pair-half-held": _case(PAIRS, _claim(two, match=[]),
                                                         held=("gpu-0",)),
        "pairs-two-with-only-unbridged-gpus-free": _case(
            PAIRS, _claim(two, match=[]), held=tuple(f"gpu-{k}" for k in range(6))),
        "pairs-two-unconstrained-with-only-unbridged-gpus-free": _case(
            PAIRS, _claim(two), held=tuple(f"gpu-{k}" for k in range(6))),
        "pairs-four-sharing-nvlink": _case(PAIRS, _claim(_request("gpus", 4), match=[])),
        "hgx-four-sharing-nvlink": _case(HGX, _claim(_request("gpus", 4), match=[])),
        "hgx-eight-sharing-nvlink": _case(HGX, _claim(_request("gpus", 8), match=[])),
        "dgx-without-fabric-manager-two-sharing-nvlink": _case("dgx-h100",
                                                               _claim(two, match=[])),
        "nvl72-four-sharing-the-clique": _case(NVL72, _claim(_request("gpus", 4), match=[])),
    }
