"""The kernel's side of passthrough as the agent drives it on a real host: the writes of a
driver change, in the kernel's order, and an IOMMU group read from /sys/kernel/iommu_groups."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from discovery.passthrough import GroupMember, PciDriverError, SysfsPciDrivers

BDF = "0000:5e:00.0"


def _tree(root: Path) -> Path:
    """One GPU on nvidia and its audio function on snd_hda_intel, in IOMMU group 22."""
    devices = root / "devices/pci0000:5d/0000:5d:01.0"
    for fn, driver, klass in ((BDF, "nvidia", "0x030000"), ("0000:5e:00.1", "snd_hda_intel",
                                                             "0x040300")):
        dev = devices / fn
        dev.mkdir(parents=True)
        (dev / "class").write_text(klass + "\n")
        drv = root / "bus/pci/drivers" / driver
        drv.mkdir(parents=True, exist_ok=True)
        (drv / "unbind").write_text("")
        os.symlink(os.path.relpath(drv, dev), dev / "driver")
        (root / "bus/pci/devices").mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(dev, root / "bus/pci/devices"), root / "bus/pci/devices" / fn)
        group = root / "kernel/iommu_groups/22/devices"
        group.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(dev, group), group / fn)
        os.symlink(os.path.relpath(group.parent, dev), dev / "iommu_group")
    (root / "bus/pci/drivers/vfio-pci").mkdir()
    (root / "bus/pci/drivers_probe").write_text("")
    return root


def test_a_bind_writes_override_unbind_and_probe_and_checks_the_result(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    pci = SysfsPciDrivers(root)
    assert (pci.driver(BDF), pci.has_driver("vfio-pci"), pci.has_driver("../kernel")) == (
        "nvidia", True, False)
    # A plain directory is no kernel: nothing rebinds, and the agent says so.
    with pytest.raises(PciDriverError, match=r"GPU 0000:5e:00.0: vfio-pci did not bind"):
        pci.bind(BDF, "vfio-pci")
    assert (root / "bus/pci/devices" / BDF / "driver_override").read_text() == "vfio-pci\n"
    assert (root / "bus/pci/drivers/nvidia/unbind").read_text() == BDF
    assert (root / "bus/pci/drivers_probe").read_text() == BDF
    pci.bind(BDF, "nvidia")  # already there: nothing written
    assert (root / "bus/pci/devices" / BDF / "driver_override").read_text() == "vfio-pci\n"


def test_a_write_the_kernel_refuses_is_one_line(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    (root / "bus/pci/drivers_probe").unlink()
    (root / "bus/pci/drivers_probe").mkdir()  # EISDIR stands in for the kernel's refusal
    with pytest.raises(PciDriverError, match=r"GPU 0000:5e:00.0: binding to vfio-pci: "):
        SysfsPciDrivers(root).bind(BDF, "vfio-pci")


def test_the_group_lists_every_member_with_its_driver(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    assert SysfsPciDrivers(root).group(BDF) == ("22", (
        GroupMember(BDF, "nvidia", 0x030000),
        GroupMember("0000:5e:00.1", "snd_hda_intel", 0x040300)))
    (root / "bus/pci/devices" / BDF / "iommu_group").unlink()
    assert SysfsPciDrivers(root).group(BDF) is None  # the IOMMU off
