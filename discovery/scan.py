"""``discover(sources, options) -> Inventory``: one full scan of the node.

The same function runs on a real host and on a simulated profile; it never raises for a bad
source. What could not be read becomes a warning in the Inventory, and ``Inventory.reserved``
says which devices were found but deliberately not offered.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from discovery.attrs import fit_limits
from discovery.drm import scan_drm_gpus
from discovery.gpus import scan_nvidia
from discovery.model import CounterSet, Device, DeviceType, Inventory
from discovery.names import natural_key
from discovery.nics import NicFilter, scan_nics, uplink_interfaces
from discovery.partitions import OwnedKey
from discovery.passthrough import with_passthrough
from discovery.sharing import SharingMode, apply_sharing
from discovery.sources import Sources
from discovery.sysfs import Sysfs, endpoints_below
from discovery.vfs import on_demand, with_bandwidth

log = logging.getLogger("discovery.scan")

#: The kinds ``device_types`` switches; the VFIO form of a GPU is switched by
#: ``gpu_passthrough`` (and goes with ``gpu``).
ALL_TYPES: tuple[str, ...] = tuple(str(t) for t in DeviceType if t is not DeviceType.VFIO)
MIG_MODES = ("static", "dynamic")
VF_MODES = ("static", "dynamic")


def no_owned_instances() -> Collection[OwnedKey]:
    return ()
#: Start of the warning given when sysfs has no readable PCI device at all.
SYSFS_UNREADABLE = "no PCI devices readable"


@dataclass(frozen=True, slots=True)
class DiscoveryOptions:
    """What to offer. ``device_types`` is a subset of gpu, mig, nic, vf: switching a kind off
    lets the agent run beside another driver that owns that hardware, so one device is never
    offered twice. Interface patterns are fnmatch globs on ifName, PCI address or device name.
    ``node_addresses`` are addresses the node is known by (e.g. its InternalIP): the NIC
    holding one is reserved, like the default-route NIC. ``sharing``: the device types
    published shareable, and how (``discovery.sharing``).
    """

    device_types: tuple[str, ...] = ALL_TYPES
    include_ifaces: tuple[str, ...] = ()
    exclude_ifaces: tuple[str, ...] = ()
    node_addresses: tuple[str, ...] = ()
    sharing: tuple[SharingMode, ...] = ()
    #: ``static``: offer the MIG instances that exist; ``dynamic``: offer every partition a
    #: MIG-mode GPU has room for (discovery.partitions), ``mig_owned`` naming the instances
    #: dra-agent created (the checkpoint's).
    mig: str = "static"
    mig_owned: Callable[[], Collection[OwnedKey]] = no_owned_instances
    #: ``dynamic``: a PF with SR-IOV and no VFs offers candidate VFs (discovery.vfs).
    vfs: str = "static"
    #: With ``vfs="dynamic"``: the Mbit/s each VF is guaranteed of its PF's link
    #: (``--vf-bandwidth``, discovery.vfs); None: VFs are counted, not their bandwidth.
    vf_bandwidth_mbps: int | None = None
    #: ``--gpu-passthrough``: every whole GPU also offered as its VFIO form, for VMs
    #: (discovery.passthrough).
    gpu_passthrough: bool = False

    def __post_init__(self) -> None:
        if self.mig not in MIG_MODES:
            raise ValueError(f"unknown MIG mode {self.mig!r}; one of {', '.join(MIG_MODES)}")
        if self.vfs not in VF_MODES:
            raise ValueError(f"unknown VF mode {self.vfs!r}; one of {', '.join(VF_MODES)}")
        if self.vf_bandwidth_mbps is not None and self.vfs != "dynamic":
            raise ValueError("a VF bandwidth needs VFs on demand (--vfs dynamic)")
        unknown = sorted(set(self.device_types) - set(ALL_TYPES))
        if unknown:
            raise ValueError(f"unknown device type(s): {', '.join(unknown)}")

    def wants(self, kind: DeviceType) -> bool:
        return str(kind) in self.device_types


def _primary_uplinks(sources: Sources, options: DiscoveryOptions) -> dict[str, str]:
    out: dict[str, str] = {}
    for iface in sorted(sources.routes.default_route_interfaces()):
        out[iface] = "carries the default route"
    if options.node_addresses:
        wanted = set(options.node_addresses)
        for iface, addrs in sorted(sources.routes.interface_addresses().items()):
            hit = sorted(wanted & addrs)
            if hit and iface not in out:
                out[iface] = f"holds the node address {hit[0]}"
    return out


def discover(sources: Sources, options: DiscoveryOptions | None = None) -> Inventory:
    """Scan GPUs (NVML + DRM) and NICs (sysfs) once; devices sorted by name."""
    options = options or DiscoveryOptions()
    started = time.perf_counter()
    warnings: list[str] = []
    sysfs = Sysfs(sources.sysfs_root)
    pci = sysfs.scan()
    if not pci:
        warnings.append(f"{SYSFS_UNREADABLE} under {sources.sysfs_root}/bus/pci/devices")
    below = endpoints_below(pci)
    devices: list[Device] = []
    reserved: dict[str, str] = {}
    counter_sets: list[CounterSet] = []

    gpu_scan = scan_nvidia(
        sources.gpu, pci, below, sources.dev_root,
        want_gpu=options.wants(DeviceType.GPU), want_mig=options.wants(DeviceType.MIG),
        mig_owned=options.mig_owned if options.mig == "dynamic" else None,
    )
    devices += gpu_scan.devices
    counter_sets += gpu_scan.counter_sets
    reserved.update(gpu_scan.reserved)
    warnings += gpu_scan.warnings
    if options.wants(DeviceType.GPU):
        devices += scan_drm_gpus(pci, below)

    if options.wants(DeviceType.NIC) or options.wants(DeviceType.VF):
        uplinks = uplink_interfaces(sources.sysfs_root, _primary_uplinks(sources, options))
        nic_scan = scan_nics(
            pci, below, uplinks,
            want_nic=options.wants(DeviceType.NIC), want_vf=options.wants(DeviceType.VF),
            nic_filter=NicFilter(options.include_ifaces, options.exclude_ifaces),
        )
        reserved.update(nic_scan.reserved)
        nic_devices = nic_scan.devices
        if options.vfs == "dynamic" and options.wants(DeviceType.VF):
            vf_sets, nic_devices = on_demand(sources.sysfs_root, nic_devices)
            if options.vf_bandwidth_mbps is not None:
                vf_sets, nic_devices = with_bandwidth(
                    sources.sysfs_root, nic_devices, vf_sets, options.vf_bandwidth_mbps,
                    warnings)
            counter_sets += vf_sets
        devices += nic_devices

    devices = apply_sharing(devices, options.sharing, warnings)
    if options.gpu_passthrough and options.wants(DeviceType.GPU):
        devices, vfio_sets = with_passthrough(devices, pci, below)
        counter_sets += vfio_sets
    devices = _unique([fit_limits(d) for d in devices], warnings)
    log.debug("discovery done", extra={
        "devices": len(devices), "reserved": len(reserved), "source": sources.label,
        "ms": round((time.perf_counter() - started) * 1000, 2),
    })
    return Inventory(
        devices=tuple(sorted(devices, key=lambda d: natural_key(d.name))),
        warnings=tuple(warnings),
        reserved=dict(sorted(reserved.items())),
        counter_sets=tuple(counter_sets),
    )


def _unique(devices: list[Device], warnings: list[str]) -> list[Device]:
    """Drop later duplicates of a name (two sources claiming one device), with a warning."""
    seen: dict[str, Device] = {}
    for device in devices:
        if device.name in seen:
            warnings.append(f"duplicate device name {device.name}; keeping the first")
            continue
        seen[device.name] = device
    return list(seen.values())


def inventory_key(inventory: Inventory) -> tuple[tuple[Device, ...], Mapping[str, str]]:
    """What makes two inventories different for publishing purposes (warnings excluded)."""
    return inventory.devices, inventory.reserved
