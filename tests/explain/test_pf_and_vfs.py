"""A PF and its VFs are never allocated at once under ``--vfs dynamic`` (#28, finding 4): the
PF consumes the whole of its counter set (every VF to be, or made, and with --vf-bandwidth its
whole link), so once one is allocated the scheduler's allocator, as explain replays it, finds
no room for the other. A PF's holder would control its VFs (``ip link set <pf> vf N``), and its
netdev leaving the host would take the VFs' caps and MAC resets with it.
tests/realk8s/test_partitions.py holds the same against the upstream allocator."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent.explain import explain
from agent.inventory import slice_objects
from discovery.pools import build_resources
from discovery.scan import DiscoveryOptions, discover
from discovery.simulate import simulated_sources
from tests.explain.builders import DRIVER, NIC_CLASS, NODE, allocated, claim, device_class, exactly

VF_CLASS = device_class("vf.dra-agent.io", f'device.driver == "{DRIVER}" && '
                                           f'device.attributes["{DRIVER}"].type == "vf"')
CLASSES = [NIC_CLASS, VF_CLASS]
PF0, PF1 = "0000:3b:00.0", "0000:3b:00.1"
NODES = {  # profile, options: the PF with no VFs yet, with them made, with bandwidth
    "vfs-to-be": ("sriov-novfs", DiscoveryOptions(vfs="dynamic")),
    "vfs-made": ("sriov-nic", DiscoveryOptions(vfs="dynamic")),
    "bandwidth": ("sriov-novfs", DiscoveryOptions(vfs="dynamic", vf_bandwidth_mbps=25_000)),
}


def slices(tmp_path: Path, node: str) -> list[dict[str, Any]]:
    profile, options = NODES[node]
    inventory = discover(simulated_sources(profile, tmp_path / "sim"), options)
    out = slice_objects(build_resources(inventory, NODE), DRIVER, NODE)
    for i, s in enumerate(out):
        s["metadata"]["name"] = f"{NODE}-{i}"
    return out


def pf(pf_address: str) -> dict[str, Any]:
    return claim(exactly("r", "nic.dra-agent.io", 1,
                         f'device.attributes["resource.kubernetes.io"].pciBusID == '
                         f'"{pf_address}"'), name="pf")


def vf_of(pf_address: str) -> dict[str, Any]:
    return claim(exactly("r", "vf.dra-agent.io", 1,
                         f'device.attributes["{DRIVER}"].parentPF == "{pf_address}"'),
                 name="vf")


def held(result: Any, name: str) -> dict[str, Any]:
    assert result.fits and result.allocation is not None
    devices = [r["device"] for r in result.allocation["devices"]["results"]]
    return allocated(name, *devices)


@pytest.mark.parametrize("node", list(NODES))
def test_a_pf_allocated_leaves_none_of_its_vfs_and_a_vf_none_of_its_pf(
        tmp_path: Path, node: str) -> None:
    found = slices(tmp_path, node)
    pf_held = held(explain(pf(PF0), CLASSES, found, NODE), "pf")
    assert pf_held["status"]["allocation"]["devices"]["results"][0]["device"] == \
        "nic-0000-3b-00-0"
    assert not explain(vf_of(PF0), CLASSES, found, NODE, allocated=[pf_held]).fits
    assert explain(vf_of(PF1), CLASSES, found, NODE, allocated=[pf_held]).fits  # the other PF

    vf_held = held(explain(vf_of(PF0), CLASSES, found, NODE), "vf")
    assert not explain(pf(PF0), CLASSES, found, NODE, allocated=[vf_held]).fits
    assert explain(pf(PF1), CLASSES, found, NODE, allocated=[vf_held]).fits
