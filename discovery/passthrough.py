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

from collections.abc import Mapping, Sequence
from dataclasses import replace

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
from discovery.pcidrivers import (
    VFIO_DRIVER,
    VM_SAFE_DRIVERS,
    GroupMember,
    PciDriverError,
    PciDrivers,
    SysfsPciDrivers,
)
from discovery.sysfs import PciFunction

#: The counter each form of one PCI function consumes: the function has one owner.
COUNTER = "owner"
NVIDIA, AMD, INTEL = 0x10DE, 0x1002, 0x8086
#: Display controllers (every NVIDIA, Intel and older AMD GPU) and processing accelerators
#: (an AMD Instinct MI300), by PCI base class.
_GPU_CLASSES = (0x03, 0x12)


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


#: The host side lives in ``discovery.pcidrivers``; named here too, as passthrough's.
__all__ = ["VFIO_DRIVER", "VM_SAFE_DRIVERS", "GroupMember", "PciDriverError", "PciDrivers",
           "SysfsPciDrivers", "counter_set_name", "vfio_device", "vfio_name",
           "with_passthrough"]
