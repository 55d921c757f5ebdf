from __future__ import annotations

from agent.slices import chunk_devices
from agent.slices.validate import validate_pool
from discovery.model import Pool
from tests.slices.helpers import DRIVER, devices


def test_2048_devices_become_16_full_slices_in_order() -> None:
    slices = chunk_devices(devices(2048))
    assert [len(s.devices) for s in slices] == [128] * 16
    names = [d["name"] for s in slices for d in s.devices]
    assert names == [f"gpu-{i}" for i in range(2048)]
    assert validate_pool(DRIVER, "node1", Pool(slices)) == []


def test_no_devices_gives_one_empty_slice() -> None:
    assert [len(s.devices) for s in chunk_devices([])] == [0]


def test_slices_with_tainted_devices_close_at_64() -> None:
    devs = devices(200)
    devs[10]["taints"] = [{"key": "k", "effect": "NoSchedule"}]
    slices = chunk_devices(devs)
    assert [len(s.devices) for s in slices] == [64, 128, 8]
    assert validate_pool(DRIVER, "node1", Pool(slices)) == []


def test_a_smaller_limit_can_be_asked_for() -> None:
    assert [len(s.devices) for s in chunk_devices(devices(10), max_per_slice=4)] == [4, 4, 2]


def test_render_shows_what_would_be_created() -> None:
    from agent.slices import Owner, render_slices
    from discovery.model import DriverResources

    objs = render_slices(DRIVER, Owner(name="node1"), DriverResources(
        {"node1": Pool(chunk_devices(devices(200)))}), "v1beta1")
    assert [o["metadata"]["generateName"] for o in objs] == [
        "00000-dra-agent.io-node1-", "00001-dra-agent.io-node1-"]
    assert all(o["apiVersion"] == "resource.k8s.io/v1beta1" for o in objs)
    assert objs[0]["spec"]["pool"] == {"name": "node1", "generation": 1, "resourceSliceCount": 2}
    assert "basic" in objs[0]["spec"]["devices"][0]
