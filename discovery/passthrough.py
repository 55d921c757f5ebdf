"""Whole GPUs for VMs (``--gpu-passthrough``): each GPU also offered as its VFIO form.

KubeVirt (and any VMM) takes a GPU bound to ``vfio-pci``: it opens ``/dev/vfio/vfio`` and the
group's ``/dev/vfio/<N>`` and finds the function by the PCI address in the claim's device
metadata file (KEP-5304). A GPU on ``vfio-pci`` is no container GPU any more (its
``/dev/nvidia<N>`` or DRM nodes are gone, NVML no longer lists it), so one PCI function has
two forms that must never be allocated together:

* the container form, as published today (``gpu-<minor>`` from NVML, ``gpu-<address>`` from
  DRM), and
* the VFIO form ``gpu-vfio-<address>`` (``type: vfio``), whose attributes come from sysfs
  alone (PCI identity and topology, no ``driver``): they are the same before and after the
  agent binds the GPU to vfio-pci, so a rescan mid-claim never renames or changes it, and a
  GPU that is on vfio-pci from boot (no NVML at all) is offered the same way.

Both forms consume ``owner: 1`` from the counter set ``pci-<address>`` (KEP-4815), which holds
``owner: 1``: the scheduler never hands out both. While the GPU is on vfio-pci only the VFIO
form is published (its container form is gone from NVML, and a DRM GPU on vfio-pci is not
offered for containers), and the agent checks again at prepare (``agent.prepare.effects.
passthrough``) for a cluster where counters are off.

Offered: every NVIDIA, AMD or Intel GPU offered whole and exclusive (not in MIG mode, not
shareable), and every such GPU function bound to vfio-pci. The IOMMU group is a host fact
(``HostInfo.iommu_group``); which other functions share it is read at prepare, when it counts.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from discovery.attrs import pci_attributes, vendor_name
from discovery.model import (
    AttributeValue,
    CounterConsumption,
    CounterSet,
    Device,
    DeviceType,
    HostInfo,
)
from discovery.names import pci_name
from discovery.sysfs import BDF_RE, PciFunction, read_int
from discovery.vfs import DRIVER_NAME

VFIO_DRIVER = "vfio-pci"
#: The counter each form of one PCI function consumes: the function has one owner.
COUNTER = "owner"
NVIDIA, AMD, INTEL = 0x10DE, 0x1002, 0x8086
#: Display controllers (every NVIDIA, Intel and older AMD GPU) and processing accelerators
#: (an AMD Instinct MI300), by PCI base class.
_GPU_CLASSES = (0x03, 0x12)
#: Drivers a function may have and still leave its IOMMU group to a VM: the kernel lets
#: userspace have a group only when every member is on a vfio driver, on one that does not
#: use DMA (pci-stub; pcieport of a bridge), or on none.
VM_SAFE_DRIVERS = frozenset({VFIO_DRIVER, "pci-stub", "pcieport"})


def vfio_name(bdf: str) -> str:
    return pci_name("gpu-vfio", bdf)


def counter_set_name(bdf: str) -> str:
    return pci_name("pci", bdf)


def _is_gpu_function(fn: PciFunction) -> bool:
    return fn.vendor in (NVIDIA, AMD, INTEL) and fn.pci_class is not None \
        and fn.pci_class >> 16 in _GPU_CLASSES


def with_passthrough(devices: Sequence[Device], pci: Mapping[str, PciFunction],
                     below: Mapping[str, frozenset[str]]
                     ) -> tuple[list[Device], list[CounterSet]]:
    """``devices`` with each offered whole GPU consuming its function's counter, a VFIO form
    for it and for every GPU function on vfio-pci, and the counter sets they consume.

    A GPU device of a function on vfio-pci (a DRM GPU whose nodes went with its driver) is
    left out: the VFIO form is that function now.
    """
    whole: dict[str, Device] = {}
    out: list[Device] = []
    for device in devices:
        bdf = device.host.pci_address
        on_vfio = bdf is not None and (fn := pci.get(bdf)) is not None \
            and fn.driver == VFIO_DRIVER
        if device.type == DeviceType.GPU and on_vfio:
            continue
        if device.type == DeviceType.GPU and bdf and not device.allow_multiple_allocations \
                and not device.consumes and bdf in pci:
            whole[bdf] = device
            out.append(replace(device, consumes=(_owner(bdf),)))
        else:
            out.append(device)
    sets: list[CounterSet] = []
    for bdf, fn in sorted(pci.items()):
        if not _is_gpu_function(fn) or (bdf not in whole and fn.driver != VFIO_DRIVER):
            continue
        out.append(vfio_device(fn, below))
        sets.append(CounterSet(counter_set_name(bdf), {COUNTER: "1"}))
    return out, sets


def _owner(bdf: str) -> CounterConsumption:
    return CounterConsumption(counter_set_name(bdf), {COUNTER: "1"})


def vfio_device(fn: PciFunction, below: Mapping[str, frozenset[str]]) -> Device:
    """The VFIO form of a GPU function: sysfs facts only, the same on any driver."""
    attrs: dict[str, AttributeValue] = {
        k: v for k, v in pci_attributes(fn, below).items() if k != "driver"}
    vendor = vendor_name(fn.vendor) or ""
    attrs["vendor"] = vendor
    if fn.physfn:
        attrs.update(isVF=True, parentPF=fn.physfn)
    nodes = (f"/dev/vfio/{fn.iommu_group}", "/dev/vfio/vfio") \
        if fn.driver == VFIO_DRIVER and fn.iommu_group else ()
    host = HostInfo(pci_address=fn.bdf, vendor=vendor or None, dev_nodes=nodes,
                    iommu_group=fn.iommu_group, driver=fn.driver, parent_pf=fn.physfn)
    return Device(vfio_name(fn.bdf), DeviceType.VFIO, attrs, {}, host,
                  consumes=(_owner(fn.bdf),))


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
    (what driverctl and ``SysfsSriov.bind`` do), and ``/sys/kernel/iommu_groups``."""

    def __init__(self, sysfs_root: Path) -> None:
        self.sysfs_root = sysfs_root

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
            raise PciDriverError(f"GPU {function}: binding to {driver}: "
                                 f"{err.strerror or err}") from err
        if self.driver(function) != driver:
            raise PciDriverError(f"GPU {function}: {driver} did not bind (is its module "
                                 "loaded?)")

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
