"""``EditsProvider``: the container edits a device of the inventory needs, per device kind.

The plugin asks for ``edits_for(device)`` per device and ``common_edits_for(devices)`` once per
claim (the spec-level edits). The NVIDIA common edits walk the driver installation, which
takes milliseconds, so they are cached and rebuilt only when the loaded driver version, the
ld cache or the control device nodes change. Per-device edits are a few ``stat`` calls.

A simulated device has env edits only, unless the provider is given ``SimulatedNodes``
(``--simulate-device-nodes``): then also the nodes its real counterpart would have, as
stand-ins the agent makes (``cdi.simnodes``).
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections.abc import Sequence
from enum import StrEnum
from pathlib import Path

from cdi.dri import KFD, drm_nodes
from cdi.errors import DeviceEditsError
from cdi.host import HostLookupError, char_node, in_root
from cdi.nic import (
    RDMA_CM,
    VFIO_CONTAINER,
    iommu_group,
    net_device,
    rdma_cm_node,
    rdma_nodes,
    vfio_group_node,
)
from cdi.nvidia import (
    OPTIONAL_CONTROL_NODES,
    REQUIRED_CONTROL_NODES,
    control_nodes,
    driver_edits,
    gpu_minor_from_proc,
    gpu_node,
    mig_cap_nodes,
)
from cdi.nvidia_driver import DriverRoot
from cdi.simnodes import SimulatedNodeError, SimulatedNodes
from cdi.spec import ContainerEdits, DeviceNode, NetDevice
from discovery.gpus import mig_cap_minors
from discovery.model import Device, DeviceType

__all__ = [
    "DeviceKind", "DriverRoot", "EditsProvider", "SimulatedNodes", "describe_env",
    "device_kind", "simulated_common_node_paths", "simulated_node_paths",
]  # fmt: skip

_VENDOR_ALIASES = {
    "nvidia": "nvidia", "0x10de": "nvidia", "10de": "nvidia",
    "amd": "amd", "0x1002": "amd", "1002": "amd",
    "intel": "intel", "0x8086": "intel", "8086": "intel",
}  # fmt: skip


class DeviceKind(StrEnum):
    NVIDIA_GPU = "nvidia-gpu"
    NVIDIA_MIG = "nvidia-mig"
    AMD_GPU = "amd-gpu"
    INTEL_GPU = "intel-gpu"
    NIC = "nic"
    VFIO = "vfio"
    OTHER = "other"


_USE_DISCOVERED_NODES = frozenset({DeviceKind.AMD_GPU, DeviceKind.INTEL_GPU, DeviceKind.OTHER})
_NVIDIA_KINDS = frozenset({DeviceKind.NVIDIA_GPU, DeviceKind.NVIDIA_MIG})
_UVERBS_RE = re.compile(r"/dev/infiniband/uverbs[0-9]+")


def device_kind(device: Device) -> DeviceKind:
    """Which edits a device needs. A function bound to ``vfio-pci`` is VFIO whatever it is."""
    host = device.host
    if host.driver == "vfio-pci":
        return DeviceKind.VFIO
    vendor = _VENDOR_ALIASES.get((host.vendor or "").lower())
    if device.type == DeviceType.MIG:
        return DeviceKind.NVIDIA_MIG
    if device.type == DeviceType.GPU:
        if vendor == "nvidia" or (vendor is None and (host.uuid or "").startswith("GPU-")):
            return DeviceKind.NVIDIA_GPU
        if vendor == "amd":
            return DeviceKind.AMD_GPU
        if vendor == "intel":
            return DeviceKind.INTEL_GPU
        return DeviceKind.OTHER
    if device.type in (DeviceType.NIC, DeviceType.VF):
        return DeviceKind.NIC
    return DeviceKind.OTHER


def _env_key(name: str) -> str:
    return re.sub(r"[^A-Z0-9]", "_", name.upper())


def describe_env(device: Device) -> tuple[str, ...]:
    """``DRA_AGENT_DEVICE_<NAME>_<FIELD>=value`` entries telling a container what it got."""
    host = device.host
    prefix = f"DRA_AGENT_DEVICE_{_env_key(device.name)}_"
    fields: list[tuple[str, object]] = [
        ("NAME", device.name),
        ("TYPE", str(device.type)),
        ("PCI_ADDRESS", host.pci_address),
        ("UUID", host.uuid),
        ("PARENT_UUID", host.parent_uuid),
        ("MIG_GI", host.mig_gi),
        ("MIG_CI", host.mig_ci),
        ("IF_NAME", host.if_name),
        ("RDMA_DEVICE", host.rdma_device),
        ("IOMMU_GROUP", host.iommu_group),
    ]
    return tuple(f"{prefix}{key}={value}" for key, value in fields if value is not None)


def simulated_node_paths(device: Device) -> tuple[str, ...]:
    """The device's own nodes on real hardware, from what the simulated device knows:
    ``/dev/nvidia<minor>``; for MIG also its GI and CI capability nodes (when its instance
    exists); an RDMA NIC's ``uverbs<N>``; a VFIO function's ``/dev/vfio/<group>``; an AMD or
    Intel GPU's DRM nodes. Nothing where the device does not say (a NIC without RDMA)."""
    host = device.host
    kind = device_kind(device)
    if kind in _NVIDIA_KINDS:
        if host.minor is None:
            return ()
        paths = [f"/dev/nvidia{host.minor}"]
        if kind == DeviceKind.NVIDIA_MIG and host.mig_gi is not None and host.mig_ci is not None:
            gi, ci = mig_cap_minors(host.minor, host.mig_gi, host.mig_ci)
            paths += [f"/dev/nvidia-caps/nvidia-cap{gi}", f"/dev/nvidia-caps/nvidia-cap{ci}"]
        return tuple(paths)
    if kind == DeviceKind.VFIO:
        return (f"/dev/vfio/{host.iommu_group}",) if host.iommu_group else ()
    if kind == DeviceKind.NIC:
        return tuple(p for p in host.dev_nodes if _UVERBS_RE.fullmatch(p))
    if kind in (DeviceKind.AMD_GPU, DeviceKind.INTEL_GPU):
        return tuple(p for p in host.dev_nodes if p.startswith("/dev/dri/"))
    return ()


def simulated_common_node_paths(devices: Sequence[Device]) -> tuple[tuple[Device, str], ...]:
    """The shared nodes (spec-level) of simulated ``devices``, each with the first device
    needing it: the NVIDIA control nodes, ``/dev/vfio/vfio``, ``rdma_cm``, ``/dev/kfd``."""
    out: dict[str, Device] = {}
    for device in devices:
        kind = device_kind(device)
        paths: tuple[str, ...] = ()
        if kind in _NVIDIA_KINDS:
            paths = REQUIRED_CONTROL_NODES
        elif kind == DeviceKind.VFIO:
            paths = (VFIO_CONTAINER,)
        elif kind == DeviceKind.NIC and device.host.rdma_device:
            paths = (RDMA_CM,)
        elif kind == DeviceKind.AMD_GPU:
            paths = (KFD,)
        for path in paths:
            out.setdefault(path, device)
    return tuple((device, path) for path, device in out.items())


class EditsProvider:
    """Container edits for inventory devices, from the host's real device nodes and driver.

    ``driver_root`` is where the NVIDIA driver installation is seen by this process;
    ``host_driver_root`` where the container runtime sees it (defaults to the same).
    ``simulated=True`` (no real hardware behind the inventory): only env edits, so a
    container in a kind cluster starts and can tell which devices it got; with
    ``simulated_nodes`` also stand-ins (``/dev/null``'s numbers) of the device nodes the real
    devices would have, made under its directory when a spec needs them.
    """

    def __init__(
        self,
        driver_root: Path = Path("/"),
        dev_root: Path = Path("/dev"),
        proc_root: Path = Path("/proc"),
        simulated: bool = False,
        *,
        sysfs_root: Path = Path("/sys"),
        host_driver_root: Path | None = None,
        hook_path: str | None = None,
        simulated_nodes: SimulatedNodes | None = None,
    ) -> None:
        if simulated_nodes is not None and not simulated:
            raise ValueError("simulated_nodes are for simulated devices only")
        self.driver_root = driver_root
        self.dev_root = dev_root
        self.proc_root = proc_root
        self.sysfs_root = sysfs_root
        self.simulated = simulated
        self.host_driver_root = host_driver_root or driver_root
        self.hook_path = hook_path
        self.simulated_nodes = simulated_nodes
        self._lock = threading.Lock()
        self._nvidia: tuple[object, DriverRoot, ContainerEdits] | None = None

    # -- per device ----------------------------------------------------------------------

    def edits_for(
        self, device: Device, *, interface_name: str | None = None, move_netdev: bool = True
    ) -> ContainerEdits:
        """The device's own edits. For a NIC with a host interface, ``move_netdev`` adds a
        CDI 1.1.0 ``netDevices`` edit naming it ``interface_name`` (default: unchanged)
        inside the pod. Raises ``DeviceEditsError`` when the host lacks what it needs."""
        if self.simulated:
            paths = simulated_node_paths(device)
            return ContainerEdits(env=describe_env(device),
                                  device_nodes=self._stand_ins([(device, p) for p in paths]),
                                  net_devices=self._simulated_netdev(device, interface_name,
                                                                     move_netdev))
        try:
            edits = self._hardware_edits(device, interface_name, move_netdev)
            # Discovery's node list is used only where no kind-specific rule exists: for the
            # kinds above it also names shared nodes (which belong in the common edits) and
            # MIG capability nodes that need not exist on the host yet.
            extra: tuple[DeviceNode, ...] = ()
            if device_kind(device) in _USE_DISCOVERED_NODES:
                extra = tuple(char_node(self.dev_root, p) for p in device.host.dev_nodes)
        except HostLookupError as err:
            raise DeviceEditsError(device, err.reason) from err
        return edits.merge(ContainerEdits(device_nodes=extra))

    def _hardware_edits(
        self, device: Device, interface_name: str | None, move_netdev: bool
    ) -> ContainerEdits:
        host = device.host
        kind = device_kind(device)
        if kind == DeviceKind.NVIDIA_GPU:
            return ContainerEdits(device_nodes=(gpu_node(self.dev_root, self._minor(device)),))
        if kind == DeviceKind.NVIDIA_MIG:
            if host.minor is None or host.mig_gi is None or host.mig_ci is None:
                raise HostLookupError("MIG device without parent minor, GI or CI id")
            return ContainerEdits(
                device_nodes=(
                    gpu_node(self.dev_root, host.minor),
                    *mig_cap_nodes(self.proc_root, host.minor, host.mig_gi, host.mig_ci),
                )
            )
        if kind in (DeviceKind.AMD_GPU, DeviceKind.INTEL_GPU):
            if any(p.startswith("/dev/dri/") for p in host.dev_nodes):
                return ContainerEdits()  # discovery already named them; added by the caller
            if host.pci_address is None:
                raise HostLookupError("GPU without a PCI address")
            return ContainerEdits(
                device_nodes=drm_nodes(self.dev_root, self.sysfs_root, host.pci_address)
            )
        if kind == DeviceKind.VFIO:
            group = host.iommu_group
            if group is None:
                if host.pci_address is None:
                    raise HostLookupError("VFIO device without PCI address or IOMMU group")
                group = iommu_group(self.sysfs_root, host.pci_address)
            return ContainerEdits(device_nodes=(vfio_group_node(self.dev_root, group),))
        if kind == DeviceKind.NIC:
            rdma: tuple[DeviceNode, ...] = ()
            if host.rdma_device:
                rdma = rdma_nodes(self.dev_root, self.sysfs_root, host.rdma_device)
            nets: tuple[NetDevice, ...] = ()
            if move_netdev and host.if_name:
                nets = (net_device(host.if_name, interface_name),)
            return ContainerEdits(device_nodes=rdma, net_devices=nets)
        return ContainerEdits()

    def _simulated_netdev(self, device: Device, interface_name: str | None,
                          move_netdev: bool) -> tuple[NetDevice, ...]:
        """With stand-in nodes (``--simulate-device-nodes``), a simulated NIC whose claim asks
        for the move names its interface as real hardware would: the runtime then moves the
        interface of that name from the agent's network namespace (a veth made for it on a
        test node), exactly the edit a real NIC gets. Without stand-ins: none, as before."""
        if (self.simulated_nodes is None or not move_netdev or not device.host.if_name
                or device_kind(device) != DeviceKind.NIC):
            return ()
        try:
            return (net_device(device.host.if_name, interface_name),)
        except HostLookupError as err:
            raise DeviceEditsError(device, err.reason) from err

    def _stand_ins(self, wanted: Sequence[tuple[Device, str]]) -> tuple[DeviceNode, ...]:
        """The stand-in nodes of (device, container path) pairs, made where missing; none
        without ``simulated_nodes``."""
        nodes = self.simulated_nodes
        if nodes is None:
            return ()
        out: list[DeviceNode] = []
        for device, path in wanted:
            try:
                out.append(nodes.node(path))
            except (SimulatedNodeError, ValueError) as err:
                raise DeviceEditsError(device, str(err)) from err
        return tuple(out)

    def _minor(self, device: Device) -> int:
        if device.host.minor is not None:
            return device.host.minor
        if device.host.pci_address is None:
            raise HostLookupError("NVIDIA GPU without minor number or PCI address")
        return gpu_minor_from_proc(self.proc_root, device.host.pci_address)

    # -- shared by the devices of a claim -----------------------------------------------

    def common_edits_for(self, devices: Sequence[Device]) -> ContainerEdits:
        """Edits every container using any of ``devices`` needs once (spec-level edits)."""
        if self.simulated:
            return ContainerEdits(
                device_nodes=self._stand_ins(simulated_common_node_paths(devices)))
        if not devices:
            return ContainerEdits()
        kinds = {device_kind(d): d for d in reversed(devices)}  # first device of each kind
        edits = ContainerEdits()
        nvidia = kinds.get(DeviceKind.NVIDIA_GPU) or kinds.get(DeviceKind.NVIDIA_MIG)
        if nvidia is not None:
            edits = edits.merge(self._nvidia_common(nvidia))
        shared: list[DeviceNode] = []
        vfio = kinds.get(DeviceKind.VFIO)
        if vfio is not None:
            try:
                shared.append(char_node(self.dev_root, VFIO_CONTAINER))
            except HostLookupError as err:
                raise DeviceEditsError(vfio, f"{err.reason}; is vfio-pci loaded?") from err
        if any(device_kind(d) == DeviceKind.NIC and d.host.rdma_device for d in devices):
            cm = rdma_cm_node(self.dev_root)  # only librdmacm users need it; optional
            if cm is not None:
                shared.append(cm)
        if DeviceKind.AMD_GPU in kinds:
            with contextlib.suppress(HostLookupError):  # graphics-only use works without it
                shared.append(char_node(self.dev_root, KFD))
        return edits.merge(ContainerEdits(device_nodes=tuple(shared)))

    def driver(self) -> DriverRoot:
        """The NVIDIA driver installation (cached like the common edits)."""
        return self._nvidia_entry(None)[1]

    def invalidate(self) -> None:
        """Forget cached driver facts (after a driver upgrade the fingerprint notices anyway)."""
        with self._lock:
            self._nvidia = None

    def _nvidia_common(self, device: Device) -> ContainerEdits:
        return self._nvidia_entry(device)[2]

    def _nvidia_entry(self, device: Device | None) -> tuple[object, DriverRoot, ContainerEdits]:
        fingerprint = self._fingerprint()
        with self._lock:
            cached = self._nvidia
            if cached is not None and cached[0] == fingerprint:
                return cached
            try:
                driver = DriverRoot.discover(
                    self.driver_root,
                    self.proc_root,
                    sysfs_root=self.sysfs_root,
                    hook_path=self.hook_path,
                )
                nodes = control_nodes(self.dev_root)
            except HostLookupError as err:
                # Nothing incomplete is cached: the next claim looks again.
                self._nvidia = None
                raise DeviceEditsError(device or "nvidia", err.reason) from err
            edits = ContainerEdits(device_nodes=nodes).merge(
                driver_edits(driver, self.host_driver_root)
            )
            self._nvidia = (fingerprint, driver, edits)
            return self._nvidia

    def _fingerprint(self) -> object:
        """Cheap facts that change when the driver is upgraded or its nodes (re)appear."""
        parts: list[object] = []
        try:
            parts.append((self.proc_root / "driver/nvidia/version").read_bytes())
        except OSError:
            parts.append(None)
        paths = [in_root(self.driver_root, "/etc/ld.so.cache")]
        paths += [
            self.dev_root / p.removeprefix("/dev/")
            for p in (*REQUIRED_CONTROL_NODES, *OPTIONAL_CONTROL_NODES)
        ]
        for path in paths:
            try:
                st = os.stat(path)
                parts.append((st.st_ino, st.st_mtime_ns, st.st_size, st.st_rdev))
            except OSError:
                parts.append(None)
        return tuple(parts)
