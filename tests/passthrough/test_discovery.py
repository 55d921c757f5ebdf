"""What ``--gpu-passthrough`` publishes on each vendor's node: a VFIO form per whole GPU, both
forms of one GPU consuming one counter the scheduler never lets both take, valid slices, and
nothing new without the flag."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent.explain import explain
from agent.explain.docs import packaged_classes
from agent.explain.render import to_table
from agent.inventory import slice_objects
from agent.slices.validate import validate_pool
from discovery.model import DeviceType, Inventory
from discovery.passthrough import counter_set_name
from discovery.pools import build_resources
from discovery.scan import DiscoveryOptions, discover
from discovery.sharing import parse_sharing_list
from discovery.simulate import simulated_sources
from tests.passthrough.node import OPTIONS, VENDORS
from tests.plugnode import DRIVER, NODE

#: Every GPU function of each node, and which has a container form (NVIDIA's fourth is on
#: vfio-pci from boot: NVML never lists it).
GPUS: dict[str, dict[str, str | None]] = {
    "nvidia": {"0000:18:00.0": "gpu-0", "0000:3b:00.0": "gpu-1", "0000:5e:00.0": "gpu-2",
               "0000:af:00.0": None},
    "amd": {b: f"gpu-{b.replace(':', '-').replace('.', '-')}" for b in (
        "0000:23:00.0", "0000:43:00.0", "0000:85:00.0", "0000:86:00.0")},
    "intel": {b: f"gpu-{b.replace(':', '-').replace('.', '-')}" for b in (
        "0000:4d:00.0", "0000:9a:00.0", "0000:cc:00.0")},
}


def _discover(tmp_path: Path, vendor: str, options: DiscoveryOptions = OPTIONS) -> Inventory:
    return discover(simulated_sources(VENDORS[vendor].profile, tmp_path), options)


@pytest.mark.parametrize("vendor", sorted(VENDORS))
def test_each_gpu_has_a_vfio_form_and_both_forms_consume_one_counter(
        tmp_path: Path, vendor: str) -> None:
    inventory = _discover(tmp_path, vendor)
    by_name = inventory.by_name()
    sets = {s.name: dict(s.counters) for s in inventory.counter_sets}
    for bdf, container in GPUS[vendor].items():
        vfio = by_name[f"gpu-vfio-{bdf.replace(':', '-').replace('.', '-')}"]
        assert vfio.type is DeviceType.VFIO
        assert vfio.attributes["resource.kubernetes.io/pciBusID"] == bdf
        assert vfio.attributes["vendor"] == vendor
        assert "driver" not in vfio.attributes  # the same on any driver
        owner = counter_set_name(bdf)
        assert sets[owner] == {"owner": "1"}
        assert [(c.counter_set, dict(c.counters)) for c in vfio.consumes] == [
            (owner, {"owner": "1"})]
        if container is not None:
            assert [(c.counter_set, dict(c.counters)) for c in by_name[container].consumes] \
                == [(owner, {"owner": "1"})]
    assert not inventory.warnings


def test_nothing_changes_without_the_flag(tmp_path: Path) -> None:
    plain = _discover(tmp_path / "a", "amd", DiscoveryOptions())
    assert not [d for d in plain.devices if d.type is DeviceType.VFIO]
    assert not plain.counter_sets
    assert all(not d.consumes for d in plain.devices)


def test_a_gpu_on_vfio_from_boot_is_published_from_sysfs_alone(tmp_path: Path) -> None:
    inventory = _discover(tmp_path, "nvidia")
    vfio = inventory.by_name()["gpu-vfio-0000-af-00-0"]
    assert (vfio.host.driver, vfio.host.iommu_group) == ("vfio-pci", "23")
    assert vfio.host.dev_nodes == ("/dev/vfio/23", "/dev/vfio/vfio")
    assert not [d for d in inventory.devices if d.type is DeviceType.GPU
                and d.host.pci_address == "0000:af:00.0"]


def test_a_shared_gpu_is_offered_for_containers_only(tmp_path: Path) -> None:
    shared = DiscoveryOptions(gpu_passthrough=True,
                              sharing=parse_sharing_list(["gpu=shares:4"]))
    inventory = _discover(tmp_path, "intel", shared)
    assert not [d for d in inventory.devices if d.type is DeviceType.VFIO]
    assert all(not d.consumes for d in inventory.devices)


def test_a_mig_mode_gpu_has_no_vfio_form(tmp_path: Path) -> None:
    inventory = discover(simulated_sources("dgx-a100-mig", tmp_path), OPTIONS)
    vfio = sorted(d.host.pci_address or "" for d in inventory.devices
                  if d.type is DeviceType.VFIO)
    whole = sorted(d.host.pci_address or "" for d in inventory.devices
                   if d.type is DeviceType.GPU)
    assert vfio == whole and len(whole) == 4  # GPUs 4-7; 0-3 are in MIG mode


@pytest.mark.parametrize("vendor", sorted(VENDORS))
def test_the_slices_are_valid_with_the_counters_in_their_own(tmp_path: Path,
                                                             vendor: str) -> None:
    resources = build_resources(_discover(tmp_path, vendor), NODE)
    pool = resources.pools[NODE]
    assert validate_pool(DRIVER, NODE, pool) == []
    assert any(s.shared_counters and not s.devices for s in pool.slices)


def _claim(*requests: tuple[str, str]) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "default", "uid": "uid-c"},
            "spec": {"devices": {"requests": [
                {"name": name, "exactly": {"deviceClassName": f"{cls}.{DRIVER}",
                                           "selectors": [{"cel": {"expression": (
                                               "device.attributes['resource.kubernetes.io']"
                                               ".pciBusID == '0000:18:00.0'")}}]}}
                for name, cls in requests]}}}


def test_the_scheduler_never_hands_out_both_forms_of_one_gpu(tmp_path: Path) -> None:
    slices = slice_objects(build_resources(_discover(tmp_path, "nvidia"), NODE), DRIVER, NODE)
    classes = packaged_classes()
    vm = explain(_claim(("vm", "vfio")), classes, slices, NODE)
    assert vm.fits and vm.allocation is not None
    assert [r["device"] for r in vm.allocation["devices"]["results"]] == [
        "gpu-vfio-0000-18-00-0"]
    both = explain(_claim(("vm", "vfio"), ("ctr", "gpu")), classes, slices, NODE)
    assert not both.fits
    assert "counter pci-0000-18-00-0/owner: needs 1, 0 left (taken by gpu-vfio-0000-18-00-0)" \
        in to_table(both)
