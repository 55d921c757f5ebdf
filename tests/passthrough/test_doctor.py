"""doctor's IOMMU check on the passthrough nodes: it names what prepare would refuse (a group
function the host uses, a GPU without a group, vfio-pci not loaded) before a VM asks."""

from __future__ import annotations

import shutil
from pathlib import Path

from agent.doctor import hardware
from agent.doctor.context import Context
from agent.doctor.host import HostRoot
from agent.doctor.model import Check, Status
from discovery.scan import discover
from discovery.simulate.pcibind import SimulatedPciDrivers
from tests.doctor.conftest import assert_check
from tests.passthrough.node import OPTIONS, make_node, node_sources


def _check(root: Path) -> Check:
    sources = node_sources(root)
    ctx = Context(host=HostRoot(root / "sim"), discover=lambda: discover(sources, OPTIONS))
    return hardware.check_iommu(ctx)


def test_a_group_function_the_host_uses_is_named_until_it_is_on_vfio(tmp_path: Path) -> None:
    make_node(tmp_path, "nvidia")
    assert_check(_check(tmp_path), Status.WARN,
                 "gpu-vfio-0000-5e-00-0: group 22 also holds 0000:5e:00.1 on snd_hda_intel",
                 "passthrough of these GPUs is refused", fix="driverctl set-override")
    SimulatedPciDrivers(tmp_path / "sim/sys").bind("0000:5e:00.1", "vfio-pci")
    assert_check(_check(tmp_path), Status.OK, "4 GPU(s) for VMs, each in a group a VM can have")


def test_another_gpu_in_the_group_is_named(tmp_path: Path) -> None:
    make_node(tmp_path, "amd")
    assert_check(_check(tmp_path), Status.WARN,
                 "gpu-vfio-0000-85-00-0: group 32 also holds 0000:86:00.0 on amdgpu",
                 fix="vfio-pci")


def test_a_bridge_in_the_group_is_no_problem(tmp_path: Path) -> None:
    make_node(tmp_path, "intel")  # the Max 1100's group holds its switch port
    assert_check(_check(tmp_path), Status.OK, "3 GPU(s) for VMs")


def test_a_gpu_without_a_group_fails(tmp_path: Path) -> None:
    make_node(tmp_path, "intel")
    (tmp_path / "sim/sys/bus/pci/devices/0000:4d:00.0/iommu_group").unlink()
    assert_check(_check(tmp_path), Status.FAIL, "gpu-vfio-0000-4d-00-0: no IOMMU group",
                 fix="intel_iommu=on")


def test_vfio_pci_not_loaded_fails(tmp_path: Path) -> None:
    make_node(tmp_path, "intel")
    shutil.rmtree(tmp_path / "sim/sys/bus/pci/drivers/vfio-pci")
    assert_check(_check(tmp_path), Status.FAIL, "3 GPU(s) offered for VMs but vfio-pci is not "
                 "loaded", fix="modprobe vfio-pci")


def test_no_iommu_at_all_fails_for_the_gpus_too(tmp_path: Path) -> None:
    make_node(tmp_path, "amd")
    groups = tmp_path / "sim/sys/kernel/iommu_groups"
    shutil.rmtree(groups)
    groups.mkdir()
    assert_check(_check(tmp_path), Status.FAIL, "/sys/kernel/iommu_groups is empty",
                 fix="amd_iommu=on")
