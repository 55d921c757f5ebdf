"""GPU passthrough on each vendor's simulated node: prepare binds the GPU to vfio-pci and hands
out its VFIO nodes and PCI address; unprepare gives it back its driver; an IOMMU group that is
not the VM's to have, or a GPU another claim holds in its other form, is refused by name."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from agent.checkpoint.codec import decode, encode
from agent.checkpoint.model import ClaimState, PreparedDevice
from agent.claim.parse import parse_claim
from agent.prepare.effects.passthrough import RESTORE, PassthroughError
from agent.prepare.errors import UnknownDeviceError
from discovery.simulate.pcibind import SimulatedPciDrivers
from tests.passthrough.node import (
    VENDORS,
    driver_of,
    make_node,
    preparer,
    published,
    vm_claim,
)
from tests.plugnode import make_claim


def _spec_nodes(path: str) -> set[str]:
    spec = json.loads(Path(path).read_text())
    nodes = {n["path"] for n in spec.get("containerEdits", {}).get("deviceNodes", [])}
    for device in spec["devices"]:
        nodes |= {n["path"] for n in device["containerEdits"].get("deviceNodes", [])}
    return nodes


@pytest.mark.parametrize("vendor", sorted(VENDORS))
def test_prepare_binds_the_gpu_to_vfio_and_unprepare_gives_its_driver_back(
        tmp_path: Path, vendor: str) -> None:
    v = VENDORS[vendor]
    make_node(tmp_path, vendor)
    node = preparer(tmp_path)
    assert v.gpu in published(node)  # its container form, before

    record = node.prepare(parse_claim(vm_claim(v.device)))
    assert record.state is ClaimState.PREPARE_COMPLETED
    assert driver_of(tmp_path, v.bdf) == "vfio-pci"
    assert record.devices[0].extra[RESTORE] == v.driver
    assert record.devices[0].pci_address == v.bdf
    # The VMM's nodes: the group's and the container; no GPU node of the host driver.
    assert _spec_nodes(record.spec_path) == {f"/dev/vfio/{v.group}", "/dev/vfio/vfio"}
    # The KEP-5304 file, where KubeVirt reads the GPU's PCI address.
    (meta,) = (tmp_path / "metadata").rglob("metadata.json")
    doc = json.loads(meta.read_text())
    (entry,) = doc["requests"][0]["devices"]
    assert entry["name"] == v.device
    assert entry["attributes"]["resource.kubernetes.io/pciBusID"] == {"string": v.bdf}
    assert v.gpu not in published(node)  # on vfio-pci it is nobody's container GPU

    node.unprepare(record.uid)
    assert driver_of(tmp_path, v.bdf) == v.driver
    assert v.gpu in published(node)  # published again at once (the effect's rescan)
    assert node.checkpoint.claims() == {}
    assert not list((tmp_path / "metadata").rglob("metadata.json"))


@pytest.mark.parametrize("vendor", sorted(VENDORS))
def test_a_rescan_mid_claim_neither_renames_nor_changes_the_vfio_form(
        tmp_path: Path, vendor: str) -> None:
    v = VENDORS[vendor]
    make_node(tmp_path, vendor)
    node = preparer(tmp_path)
    before = {n: d.to_api() for n, d in published(node).items()}
    node.prepare(parse_claim(vm_claim(v.device)))
    after = {n: d.to_api() for n, d in published(node).items()}
    assert after[v.device] == before[v.device]  # the slice's entry: not one byte changed
    # Every other device keeps its name; only the container form went.
    assert set(before) - set(after) == {v.gpu}
    assert set(after) <= set(before)


def test_nvml_losing_the_gpu_renames_no_other_nvidia_gpu(tmp_path: Path) -> None:
    make_node(tmp_path, "nvidia")
    node = preparer(tmp_path)
    node.prepare(parse_claim(vm_claim("gpu-vfio-0000-18-00-0")))
    now = published(node)
    # NVML's indexes shift (gpu-1 is NVML index 0 now); the names, by minor, do not.
    assert (now["gpu-1"].host.pci_address, now["gpu-1"].attributes["index"]) == (
        "0000:3b:00.0", 0)
    assert now["gpu-2"].host.pci_address == "0000:5e:00.0"


def test_a_gpu_on_vfio_from_boot_is_handed_out_as_it_is_and_left_there(
        tmp_path: Path) -> None:
    make_node(tmp_path, "nvidia")
    node = preparer(tmp_path)
    assert "gpu-3" not in published(node)  # NVML never saw it
    record = node.prepare(parse_claim(vm_claim("gpu-vfio-0000-af-00-0")))
    assert RESTORE not in record.devices[0].extra  # nothing changed, nothing to undo
    assert _spec_nodes(record.spec_path) == {"/dev/vfio/23", "/dev/vfio/vfio"}
    node.unprepare(record.uid)
    assert driver_of(tmp_path, "0000:af:00.0") == "vfio-pci"


def test_a_group_function_the_host_uses_is_refused_by_name(tmp_path: Path) -> None:
    make_node(tmp_path, "nvidia")
    node = preparer(tmp_path)
    with pytest.raises(PassthroughError,
                       match=r"IOMMU group 22 of GPU 0000:5e:00.0, and 0000:5e:00.1 is on "
                             r"snd_hda_intel, in use by the host; .*driverctl set-override"):
        node.prepare(parse_claim(vm_claim("gpu-vfio-0000-5e-00-0")))
    assert driver_of(tmp_path, "0000:5e:00.0") == "nvidia"  # nothing was touched
    assert node.checkpoint.claims() == {}
    # Once the operator gives the audio function to vfio-pci, the GPU goes.
    SimulatedPciDrivers(tmp_path / "sim/sys").bind("0000:5e:00.1", "vfio-pci")
    record = node.prepare(parse_claim(vm_claim("gpu-vfio-0000-5e-00-0")))
    assert driver_of(tmp_path, "0000:5e:00.0") == "vfio-pci"
    node.unprepare(record.uid)
    assert driver_of(tmp_path, "0000:5e:00.1") == "vfio-pci"  # the operator's, left alone


def test_a_shared_group_goes_to_one_claim_whole_and_never_half(tmp_path: Path) -> None:
    make_node(tmp_path, "amd")
    node = preparer(tmp_path)
    # Alone, one GPU of group 32: its sibling is amdgpu's.
    with pytest.raises(PassthroughError, match=r"0000:86:00.0 is on amdgpu, in use by the host"):
        node.prepare(parse_claim(vm_claim("gpu-vfio-0000-85-00-0")))
    # Another claim holds the sibling (as a container GPU): named, with its claim.
    holder = node.prepare(parse_claim(make_claim("train", ["gpu-0000-86-00-0"])))
    with pytest.raises(PassthroughError, match=rf"0000:86:00.0 \(gpu-0000-86-00-0\) is held by "
                                               rf"claim default/train \({holder.uid}\)"):
        node.prepare(parse_claim(vm_claim("gpu-vfio-0000-85-00-0")))
    node.unprepare(holder.uid)
    # Both GPUs of the group in one claim: the VM gets the group.
    both = node.prepare(parse_claim(vm_claim("gpu-vfio-0000-85-00-0",
                                             "gpu-vfio-0000-86-00-0")))
    assert {driver_of(tmp_path, b) for b in ("0000:85:00.0", "0000:86:00.0")} == {"vfio-pci"}
    # And a second VM claim for either is refused while the first holds the group.
    with pytest.raises(UnknownDeviceError):  # its container form is gone meanwhile
        node.prepare(parse_claim(make_claim("train", ["gpu-0000-86-00-0"])))
    node.unprepare(both.uid)
    assert {driver_of(tmp_path, b) for b in ("0000:85:00.0", "0000:86:00.0")} == {"amdgpu"}


@pytest.mark.parametrize("vendor", sorted(VENDORS))
def test_both_forms_of_one_gpu_are_never_prepared_at_once(tmp_path: Path, vendor: str) -> None:
    # The counter both consume keeps the scheduler from it; a cluster without counters
    # (DRAPartitionableDevices off) is stopped here.
    v = VENDORS[vendor]
    make_node(tmp_path, vendor)
    node = preparer(tmp_path)
    container = node.prepare(parse_claim(make_claim("train", [v.gpu])))
    with pytest.raises(PassthroughError, match=rf"{v.bdf} \({v.gpu}\) is held by claim "
                                               rf"default/train \({container.uid}\)"):
        node.prepare(parse_claim(vm_claim(v.device)))
    assert driver_of(tmp_path, v.bdf) == v.driver
    node.unprepare(container.uid)
    with pytest.raises(PassthroughError, match="is handed to a VM by this claim"):
        node.prepare(parse_claim(make_claim("both", [v.gpu, v.device])))
    assert driver_of(tmp_path, v.bdf) == v.driver


def test_a_gpu_without_an_iommu_group_is_refused(tmp_path: Path) -> None:
    make_node(tmp_path, "intel")
    (tmp_path / "sim/sys/bus/pci/devices/0000:4d:00.0/iommu_group").unlink()  # IOMMU off
    node = preparer(tmp_path)
    with pytest.raises(PassthroughError, match="has no IOMMU group; is the IOMMU on"):
        node.prepare(parse_claim(vm_claim("gpu-vfio-0000-4d-00-0")))
    assert driver_of(tmp_path, "0000:4d:00.0") == "i915"


def test_a_driver_that_does_not_let_go_fails_the_claim_and_gives_back_the_others(
        tmp_path: Path) -> None:
    make_node(tmp_path, "nvidia")
    node = preparer(tmp_path)
    control = node.builder.effects[1].control  # type: ignore[attr-defined]
    assert isinstance(control, SimulatedPciDrivers)
    control.stuck.add("0000:3b:00.0")
    with pytest.raises(PassthroughError, match=r"gpu-vfio-0000-3b-00-0: GPU 0000:3b:00.0: "
                                               r"binding to vfio-pci: Device or resource busy"):
        node.prepare(parse_claim(vm_claim("gpu-vfio-0000-18-00-0", "gpu-vfio-0000-3b-00-0")))
    assert driver_of(tmp_path, "0000:18:00.0") == "nvidia"  # the rollback gave it back
    assert node.checkpoint.claims() == {}


@pytest.mark.parametrize(("field", "value", "why"), [
    (RESTORE, "../../../kernel", "is no driver under /sys/bus/pci/drivers"),
    (RESTORE, "e1000e", "is no driver under /sys/bus/pci/drivers"),
    (RESTORE, {"driver": "nvidia"}, "is no driver under /sys/bus/pci/drivers"),
    ("pci_address", "0000:3b:00.0", "is not 0000:18:00.0"),
    ("device", "gpu-1", "is not a GPU's VFIO form this node publishes"),
])
def test_a_tampered_record_changes_no_driver(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                             field: str, value: object, why: str) -> None:
    # A record rewritten with a valid checksum (by hand, or another agent): what it names is
    # checked against what discovery publishes, and anything else left as it is.
    make_node(tmp_path, "nvidia")
    node = preparer(tmp_path)
    record = node.prepare(parse_claim(vm_claim("gpu-vfio-0000-18-00-0")))
    path = tmp_path / "state/checkpoint.json"
    data = decode(path.read_bytes())

    def forged(held: PreparedDevice) -> PreparedDevice:
        if field == RESTORE:
            return replace(held, extra={**held.extra, RESTORE: value})
        changes: dict[str, Any] = {field: value}
        return replace(held, **changes)

    path.write_bytes(encode(data.with_claims({uid: replace(r, devices=tuple(
        forged(d) for d in r.devices)) for uid, r in data.claims.items()})))
    with caplog.at_level(logging.WARNING):
        preparer(tmp_path).unprepare(record.uid)
    (line,) = [r for r in caplog.records if "left alone" in r.getMessage()]
    assert why in line.why  # type: ignore[attr-defined]
    assert driver_of(tmp_path, "0000:18:00.0") == "vfio-pci"  # left for the operator
    assert driver_of(tmp_path, "0000:3b:00.0") == "nvidia"


def test_after_a_reboot_start_up_binds_a_prepared_gpu_again(tmp_path: Path) -> None:
    make_node(tmp_path, "amd")
    record = preparer(tmp_path).prepare(parse_claim(vm_claim("gpu-vfio-0000-23-00-0")))
    make_node(tmp_path, "amd")  # a reboot: the GPU is amdgpu's again, its DRM nodes back
    assert driver_of(tmp_path, "0000:23:00.0") == "amdgpu"
    restarted = preparer(tmp_path, boot_id="boot-2")
    report = restarted.recover()
    assert report.rebuilt == (record.uid,)
    assert driver_of(tmp_path, "0000:23:00.0") == "vfio-pci"
    assert _spec_nodes(record.spec_path) == {"/dev/vfio/30", "/dev/vfio/vfio"}
    restarted.unprepare(record.uid)
    assert driver_of(tmp_path, "0000:23:00.0") == "amdgpu"  # what it had first
