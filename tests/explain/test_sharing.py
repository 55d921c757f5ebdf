"""explain on a node published with ``--sharing``: the agent's own slices and DeviceClasses,
other claims' shares counted against each GPU, the remaining capacity in the refusal."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent.explain import explain
from agent.explain.docs import packaged_classes
from agent.explain.render import to_table
from agent.inventory import slice_objects
from discovery.pools import build_resources
from discovery.scan import DiscoveryOptions, discover
from discovery.sharing import parse_sharing_list
from discovery.simulate import scratch_dir, simulated_sources

NODE = "node-a"
DRIVER = "dra-agent.io"


def _slices() -> list[dict[str, Any]]:
    with scratch_dir() as tmp:
        inv = discover(simulated_sources("dgx-h100", Path(tmp)),
                       DiscoveryOptions(sharing=parse_sharing_list(["gpu=shares:4"])))
    return slice_objects(build_resources(inv, NODE), DRIVER, NODE)


def _claim(name: str, shares: int) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": f"gpu-shared.{DRIVER}",
                "capacity": {"requests": {"shares": str(shares)}}}}]}}}


def _holding(i: int, shares: int) -> dict[str, Any]:
    claim = _claim(f"h{i}", shares)
    claim["status"] = {"allocation": {"devices": {"results": [{
        "request": "gpu", "driver": DRIVER, "pool": NODE, "device": f"gpu-{i}",
        "shareID": f"00000000-0000-4000-8000-{i:012d}",
        "consumedCapacity": {"shares": str(shares), "memory": "0"}}]}}}
    return claim


def test_a_share_lands_where_capacity_is_left() -> None:
    held = [_holding(i, 3) for i in range(7)]  # gpu-7 is the only one with 2 shares free
    result = explain(_claim("new", 2), packaged_classes(), _slices(), NODE, allocated=held)
    assert result.fits
    (share,) = result.allocation["devices"]["results"]
    assert share["device"] == "gpu-7"
    assert share["consumedCapacity"] == {"memory": "0", "shares": "2"}
    assert share["shareID"]


def test_a_refusal_says_how_much_each_gpu_has_left() -> None:
    held = [_holding(i, 3) for i in range(8)]
    result = explain(_claim("new", 2), packaged_classes(), _slices(), NODE, allocated=held)
    assert not result.fits
    text = to_table(result)
    assert "8 x shares: needs 2, 1 of 4 left" in text
    assert "the first, gpu-0 under pci0000:15, is not: shares: needs 2, 1 of 4 left" in text


def test_more_shares_than_a_gpu_has_are_refused_by_its_policy() -> None:
    result = explain(_claim("big", 5), packaged_classes(), _slices(), NODE)
    assert not result.fits
    assert "8 x shares: 5 is not allowed by the device's requestPolicy" in to_table(result)


def test_the_exclusive_class_never_hands_out_a_shared_gpu() -> None:
    claim = _claim("whole", 1)
    del claim["spec"]["devices"]["requests"][0]["exactly"]["capacity"]
    claim["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = f"gpu.{DRIVER}"
    result = explain(claim, packaged_classes(), _slices(), NODE)
    assert not result.fits
    assert "!('sharing' in device.attributes['dra-agent.io'])" in to_table(result)
