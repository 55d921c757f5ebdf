"""PCI functions moved between kernel drivers, and the IOMMU groups a VM takes whole: what VFs
on demand (``vf.driver``, ``discovery.vfs.SysfsSriov``) and GPU passthrough
(``discovery.passthrough``) both change on the host, through one ``SysfsPciDrivers``."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from discovery.sysfs import BDF_RE, read_int

VFIO_DRIVER = "vfio-pci"
#: A kernel driver's name as one path segment under /sys/bus/pci/drivers: no "/", never
#: "." or "..".
DRIVER_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,63}", re.ASCII)
#: Drivers a function may have and still leave its IOMMU group to a VM: the kernel lets
#: userspace have a group only when every member is on a vfio driver, on one that does not
#: use DMA (pci-stub; pcieport of a bridge), or on none.
VM_SAFE_DRIVERS = frozenset({VFIO_DRIVER, "pci-stub", "pcieport"})


# -- the host side: drivers and IOMMU groups -------------------------------------------------


class PciDriverError(Exception):
    """A driver change the kernel refused; names the function and the cause."""


@dataclass(frozen=True, slots=True)
class GroupMember:
    """One function of an IOMMU group as the kernel has it now."""

    bdf: str
    driver: str | None
    pci_class: int | None

    @property
    def is_bridge(self) -> bool:
        return self.pci_class is not None and self.pci_class >> 8 == 0x0604

    @property
    def vm_safe(self) -> bool:
        """This member leaves the group usable by a VM (vfio, pci-stub, no driver, a
        bridge's pcieport)."""
        return self.driver is None or self.driver in VM_SAFE_DRIVERS


class PciDrivers(Protocol):
    """The driver changes GPU passthrough makes, and the IOMMU groups it reads."""

    def exists(self, function: str) -> bool: ...
    def driver(self, function: str) -> str | None: ...
    def has_driver(self, driver: str) -> bool: ...
    def bind(self, function: str, driver: str) -> None: ...
    def group(self, function: str) -> tuple[str, tuple[GroupMember, ...]] | None:
        """(group number, every member, ``function`` included), or None without a group."""
        ...


class SysfsPciDrivers:
    """The kernel's ``/sys/bus/pci``: ``driver_override``, ``unbind``, ``drivers_probe``
    (what driverctl does), and ``/sys/kernel/iommu_groups``. ``kind`` names the function in
    errors (a GPU, a VF)."""

    def __init__(self, sysfs_root: Path, kind: str = "GPU") -> None:
        self.sysfs_root = sysfs_root
        self.kind = kind

    def _dev(self, function: str) -> Path:
        return self.sysfs_root / "bus" / "pci" / "devices" / function

    def exists(self, function: str) -> bool:
        return bool(BDF_RE.fullmatch(function)) and self._dev(function).is_dir()

    def driver(self, function: str) -> str | None:
        link = self._dev(function) / "driver"
        return os.path.basename(os.readlink(link)) if link.is_symlink() else None

    def has_driver(self, driver: str) -> bool:
        return bool(DRIVER_NAME.fullmatch(driver)) and \
            (self.sysfs_root / "bus" / "pci" / "drivers" / driver).is_dir()

    def bind(self, function: str, driver: str) -> None:
        """Move ``function`` to ``driver``; the override stays, so nothing else (a udev rule
        loading the old driver) takes it back while the VM has it."""
        dev = self._dev(function)
        current = self.driver(function)
        if current == driver:
            return
        try:
            (dev / "driver_override").write_text(f"{driver}\n")
            if current is not None:
                (dev / "driver" / "unbind").write_text(function)
            (self.sysfs_root / "bus" / "pci" / "drivers_probe").write_text(function)
        except OSError as err:
            raise PciDriverError(f"{self.kind} {function}: binding to {driver}: "
                                 f"{err.strerror or err}") from err
        if self.driver(function) != driver:
            raise PciDriverError(f"{self.kind} {function}: {driver} did not bind (is its "
                                 "module loaded?)")

    def group(self, function: str) -> tuple[str, tuple[GroupMember, ...]] | None:
        link = self._dev(function) / "iommu_group"
        if not link.is_symlink():
            return None
        number = os.path.basename(os.readlink(link))
        members = self.sysfs_root / "kernel" / "iommu_groups" / number / "devices"
        try:
            names = sorted(n for n in os.listdir(members) if BDF_RE.fullmatch(n))
        except OSError:
            names = [function]
        return number, tuple(
            GroupMember(n, self.driver(n), read_int(self._dev(n) / "class", 16))
            for n in names)
