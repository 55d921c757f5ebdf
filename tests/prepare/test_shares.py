"""Shares of one device (KEP-5075) through the real gRPC server: each share its own prepared
unit and CDI device, the capacity sum checked across claims and restarts, shares and exclusive
use refused against each other, bad consumedCapacity one line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from discovery.model import Device
from discovery.sharing import parse_sharing, shareable
from tests.plugnode import DRIVER, NODE, Node, build_node, make_claim

SHARE = "00000000-0000-4000-8000-{:012d}"
KIND = f"k8s.{DRIVER}/claim"


def _shared(device: Device, mode: str) -> Device:
    out, why = shareable(device, parse_sharing(mode))
    assert out is not None, why
    return out


@pytest.fixture
def node(short_root: Path) -> Iterator[Node]:
    n = build_node(short_root)
    # gpu-0 in 4 shares; gpu-1 stays exclusive
    n.inventory[0] = _shared(n.inventory[0], "gpu=shares:4")
    yield n
    n.kubelet.stop()
    n.server.stop(0)


def share(device: str, index: int, consumed: dict[str, Any] | None = None,
          request: str = "req") -> dict[str, Any]:
    result: dict[str, Any] = {"request": request, "driver": DRIVER, "pool": NODE,
                              "device": device, "shareID": SHARE.format(index)}
    if consumed is not None:
        result["consumedCapacity"] = consumed
    return result


def shares_claim(node: Node, name: str, *results: dict[str, Any]) -> dict[str, Any]:
    return node.book.put(make_claim(name, results=list(results)))


def uid(claim: dict[str, Any]) -> str:
    return str(claim["metadata"]["uid"])


def checkpoint(node: Node) -> dict[str, Any]:
    if not node.checkpoint.exists():  # nothing was ever stored
        return {}
    return dict(json.loads(node.checkpoint.read_text())["claims"])


def test_each_share_is_its_own_cdi_device(node: Node) -> None:
    a = shares_claim(node, "a", share("gpu-0", 1, {"shares": "2"}))
    b = shares_claim(node, "b", share("gpu-0", 2, {"shares": "1"}))
    for claim, index in ((a, 1), (b, 2)):
        result = node.prepare(claim)[uid(claim)]
        assert result.ok, result.error
        (device,) = result.devices
        assert device.share_id == SHARE.format(index)
        assert device.cdi_device_ids == (f"{KIND}={uid(claim)}-gpu-0_{SHARE.format(index)}",)
        spec = json.loads((node.cdi_dir / f"k8s.{DRIVER}-claim_{uid(claim)}.json").read_text())
        assert [d["name"] for d in spec["devices"]] == [f"{uid(claim)}-gpu-0_{SHARE.format(index)}"]
    records = checkpoint(node)
    assert records[uid(a)]["devices"][0]["consumedCapacity"] == {"shares": "2"}
    assert records[uid(b)]["devices"][0]["shareID"] == SHARE.format(2)


def test_two_shares_of_one_device_in_one_claim(node: Node) -> None:
    claim = shares_claim(node, "two", share("gpu-0", 1, {"shares": "1"}),
                         share("gpu-0", 2, {"shares": "1"}, request="other"))
    result = node.prepare(claim)[uid(claim)]
    assert result.ok, result.error
    assert sorted(i for d in result.devices for i in d.cdi_device_ids) == sorted(
        f"{KIND}={uid(claim)}-gpu-0_{SHARE.format(i)}" for i in (1, 2))
    assert len(checkpoint(node)[uid(claim)]["devices"]) == 2


def test_the_capacity_sum_is_held_across_claims_and_a_restart(node: Node) -> None:
    a = shares_claim(node, "a", share("gpu-0", 1, {"shares": "2"}))
    b = shares_claim(node, "b", share("gpu-0", 2, {"shares": "2"}))
    c = shares_claim(node, "c", share("gpu-0", 3, {"shares": "1"}))
    assert node.prepare(a)[uid(a)].ok and node.prepare(b)[uid(b)].ok
    node.restart()  # the sum comes from the checkpoint, not from memory
    refused = node.prepare(c)[uid(c)]
    assert not refused.ok
    assert refused.error == (
        f"claim default/c ({uid(c)}): device {NODE}/gpu-0 has 0 of 4 shares left (2 other "
        "claim(s) hold 4) and this claim's share needs 1; the scheduler's view of the device "
        "was stale, the kubelet retries once a share is released")
    assert uid(c) not in checkpoint(node)
    assert not (node.cdi_dir / f"k8s.{DRIVER}-claim_{uid(c)}.json").exists()
    # unpreparing one share leaves the other running, and frees room for the third
    assert node.unprepare(a)[uid(a)].ok
    assert (node.cdi_dir / f"k8s.{DRIVER}-claim_{uid(b)}.json").exists()
    assert uid(b) in checkpoint(node)
    assert node.prepare(c)[uid(c)].ok


def test_a_share_without_consumed_capacity_counts_the_default(node: Node) -> None:
    held = shares_claim(node, "held", share("gpu-0", 1, {"shares": "3"}))
    assert node.prepare(held)[uid(held)].ok
    plain = shares_claim(node, "plain", share("gpu-0", 2))  # the policy's default: 1
    assert node.prepare(plain)[uid(plain)].ok
    more = shares_claim(node, "more", share("gpu-0", 3))
    error = node.prepare(more)[uid(more)].error
    assert "has 0 of 4 shares left (2 other claim(s) hold 4)" in error


def test_memory_is_summed_in_its_own_unit(short_root: Path) -> None:
    n = build_node(short_root)
    try:
        gpu = n.inventory[0]
        n.inventory[0] = _shared(Device(gpu.name, gpu.type, gpu.attributes, {"memory": "80Gi"},
                                        gpu.host), "gpu=memory:10Gi")
        a = shares_claim(n, "a", share("gpu-0", 1, {"memory": "50Gi"}))
        b = shares_claim(n, "b", share("gpu-0", 2, {"memory": "40Gi"}))
        assert n.prepare(a)[uid(a)].ok
        error = n.prepare(b)[uid(b)].error
        assert "has 30Gi of 80Gi memory left (1 other claim(s) hold 50Gi) and this claim's " \
               "share needs 40Gi" in error
    finally:
        n.kubelet.stop()
        n.server.stop(0)


def test_shares_and_exclusive_use_are_refused_against_each_other(node: Node) -> None:
    shared = shares_claim(node, "shared", share("gpu-0", 1, {"shares": "1"}))
    whole = node.book.put(make_claim("whole", ["gpu-0"]))  # no shareID: exclusive
    assert node.prepare(shared)[uid(shared)].ok
    error = node.prepare(whole)[uid(whole)].error
    assert f"device {NODE}/gpu-0 is already prepared for claim default/shared" in error
    assert node.unprepare(shared)[uid(shared)].ok
    assert node.prepare(whole)[uid(whole)].ok
    later = shares_claim(node, "later", share("gpu-0", 2, {"shares": "1"}))
    assert "is already prepared for claim default/whole" in node.prepare(later)[uid(later)].error


def test_a_share_of_an_exclusive_device_is_refused(node: Node) -> None:
    claim = shares_claim(node, "stale", share("gpu-1", 1, {"shares": "1"}))
    error = node.prepare(claim)[uid(claim)].error
    assert error == (
        f"claim default/stale ({uid(claim)}): device {NODE}/gpu-1 was allocated as a share "
        f"(shareID {SHARE.format(1)}) but this node publishes it exclusive (--sharing); the "
        "allocation was made from an older ResourceSlice, so delete and re-create the claim")
    assert checkpoint(node) == {}


@pytest.mark.parametrize(("consumed", "why"), [
    ({"shares": "two"}, "consumedCapacity[shares] is not a quantity such as 2 or 10Gi"),
    ({"shares": "-1"}, "consumedCapacity[shares] is not a quantity such as 2 or 10Gi"),
    ({"shares": True}, "consumedCapacity[shares] is not a quantity such as 2 or 10Gi"),
    ({"sha\nres": "x"}, "consumedCapacity['sha\\nres'] is not a quantity"),
    (["shares"], "consumedCapacity is not an object"),
])
def test_bad_consumed_capacity_is_one_line(node: Node, consumed: Any, why: str) -> None:
    claim = shares_claim(node, "bad", share("gpu-0", 1, consumed))
    error = node.prepare(claim)[uid(claim)].error
    assert why in error and "\n" not in error
    assert checkpoint(node) == {}
