"""NICs (physical functions) and SR-IOV virtual functions from sysfs.

A NIC is a PCI function of class 0x02 (network controller, Ethernet or InfiniBand); its
netdev, RDMA device and VFIO group hang off the PCI directory. Interfaces without a PCI parent
(lo, veth, bridges, docker0, cni*, tunnels) are therefore never offered. The interface that
carries the node's own traffic (default route, node address, or anything stacked under
those: bond slaves, bridge ports, VLAN parents) is reserved, never offered: handing it to a
pod would cut the node off.
"""

from __future__ import annotations

import contextlib
import fnmatch
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from discovery.attrs import pci_attributes, vendor_name
from discovery.model import AttributeValue, Device, DeviceType, HostInfo
from discovery.names import pci_name
from discovery.sysfs import PciFunction, net_dir, read_int, read_text

log = logging.getLogger("discovery.nics")

#: ARPHRD numbers in /sys/class/net/<if>/type.
LINK_TYPES = {1: "ethernet", 32: "infiniband"}


@dataclass
class NicScan:
    devices: list[Device] = field(default_factory=list)
    reserved: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class NicFilter:
    """fnmatch patterns matched against the interface name, the PCI address and the device
    name; an empty include list means everything."""

    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    def allows(self, *keys: str) -> bool:
        keys = tuple(k for k in keys if k)
        if self.include and not any(fnmatch.fnmatch(k, p) for k in keys for p in self.include):
            return False
        return not any(fnmatch.fnmatch(k, p) for k in keys for p in self.exclude)


def is_network(fn: PciFunction) -> bool:
    return fn.pci_class is not None and fn.pci_class >> 16 == 0x02


def uplink_interfaces(
    sysfs_root: Path, primary: Mapping[str, str]
) -> dict[str, str]:
    """Interfaces that carry node traffic -> why, following stacked devices downwards.

    ``primary`` holds the interfaces found directly (default route, node address). A bond,
    bridge or VLAN on top of a NIC makes the NIC an uplink too: its ``lower_*`` links and a
    bridge's ``brif/`` entries name the devices below.
    """
    out = dict(primary)
    todo = list(primary)
    class_net = sysfs_root / "class" / "net"
    while todo:
        upper = todo.pop()
        try:
            entries = os.listdir(class_net / upper)
        except OSError:
            entries = []
        lowers = [e[len("lower_"):] for e in entries if e.startswith("lower_")]
        with contextlib.suppress(OSError):
            lowers += os.listdir(class_net / upper / "brif")
        for lower in lowers:
            if lower not in out:
                out[lower] = f"stacked under {upper}, which {out[upper]}"
                todo.append(lower)
    return out


def _iface_attrs(fn: PciFunction, iface: str) -> dict[str, AttributeValue]:
    d = net_dir(fn, iface)
    attrs: dict[str, AttributeValue] = {"ifName": iface}
    mac = read_text(d / "address")
    if mac:
        attrs["macAddress"] = mac
    mtu = read_int(d / "mtu")
    if mtu is not None:
        attrs["mtu"] = mtu
    link = read_int(d / "type")
    if link is not None and link in LINK_TYPES:
        attrs["linkType"] = LINK_TYPES[link]
    return attrs


def _link_facts(fn: PciFunction, iface: str) -> dict[str, str]:
    """Link state and negotiated speed: shown by ``discover``, never published.

    Both change whenever the link flaps; as attributes they would turn every flap into a
    ResourceSlice write and let the scheduler race a cable. Link health is published as a
    device taint by the health monitor instead.
    """
    d = net_dir(fn, iface)
    facts: dict[str, str] = {}
    state = read_text(d / "operstate")
    if state:
        facts["operstate"] = state
    speed = read_int(d / "speed")
    if speed is not None and speed > 0:
        facts["speedMbps"] = str(speed)  # -1 or unreadable while the link is down
    return facts


def _dev_nodes(fn: PciFunction) -> tuple[str, ...]:
    nodes: list[str] = []
    if fn.driver == "vfio-pci" and fn.iommu_group is not None:
        nodes += [f"/dev/vfio/{fn.iommu_group}", "/dev/vfio/vfio"]
    if fn.uverbs:
        nodes += [f"/dev/infiniband/{u}" for u in fn.uverbs]
        nodes.append("/dev/infiniband/rdma_cm")
    return tuple(nodes)


def vf_indexes(pci: Mapping[str, PciFunction]) -> dict[str, int]:
    """VF BDF -> its index under its PF, from the PFs' ``virtfn<N>`` links (read once)."""
    out: dict[str, int] = {}
    for pf in pci.values():
        if not pf.sriov_num_vfs:
            continue
        for entry in _listdir(pf.path):
            if entry.startswith("virtfn") and entry[len("virtfn"):].isdigit():
                with contextlib.suppress(OSError):
                    target = os.path.basename(os.readlink(pf.path / entry))
                    out[target] = int(entry[len("virtfn"):])
    return out


def _listdir(path: Path) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def scan_nics(
    pci: Mapping[str, PciFunction],
    below: Mapping[str, frozenset[str]],
    uplinks: Mapping[str, str],
    *,
    want_nic: bool = True,
    want_vf: bool = True,
    nic_filter: NicFilter = NicFilter(),
) -> NicScan:
    out = NicScan()
    vf_index_of = vf_indexes(pci) if want_vf else {}
    for fn in _sorted(pci.values()):
        if not is_network(fn):
            continue
        is_vf = fn.physfn is not None
        if (is_vf and not want_vf) or (not is_vf and not want_nic):
            continue
        kind = DeviceType.VF if is_vf else DeviceType.NIC
        name = pci_name(str(kind), fn.bdf)
        iface = fn.net_ifaces[0] if fn.net_ifaces else ""
        if not nic_filter.allows(iface, fn.bdf, name):
            log.debug("NIC filtered out", extra={"device": name, "ifName": iface})
            continue
        reason = next((uplinks[i] for i in fn.net_ifaces if i in uplinks), None)
        if reason is not None:
            out.reserved[name] = f"{iface}: {reason}"
            continue
        attrs: dict[str, AttributeValue] = {}
        if iface:
            attrs.update(_iface_attrs(fn, iface))
        if fn.rdma_devices:
            attrs["rdmaDevice"] = fn.rdma_devices[0]
        attrs["isVF"] = is_vf
        if is_vf:
            attrs["parentPF"] = fn.physfn or ""
            vf_index = vf_index_of.get(fn.bdf)
            if vf_index is not None:
                attrs["vfIndex"] = vf_index
        if fn.sriov_total_vfs is not None:
            attrs["sriovTotalVFs"] = fn.sriov_total_vfs
            attrs["sriovNumVFs"] = fn.sriov_num_vfs or 0
        vendor = vendor_name(fn.vendor)
        if vendor:
            attrs["vendor"] = vendor
        attrs.update(pci_attributes(fn, below))
        host = HostInfo(
            pci_address=fn.bdf,
            vendor=vendor,
            if_name=iface or None,
            rdma_device=fn.rdma_devices[0] if fn.rdma_devices else None,
            dev_nodes=_dev_nodes(fn),
            iommu_group=fn.iommu_group,
            driver=fn.driver,
            parent_pf=fn.physfn,
            extra=_link_facts(fn, iface) if iface else {},
        )
        out.devices.append(Device(name, kind, attrs, {}, host))
    return out


def _sorted(fns: Iterable[PciFunction]) -> list[PciFunction]:
    return sorted(fns, key=lambda f: f.bdf)
