"""NVIDIA GPUs and MIG devices through the GpuLibrary seam, joined with their sysfs PCI facts.

A node without the NVIDIA driver is normal: GPUs are skipped with one log line and the rest
of discovery carries on. An NVML error on one GPU or MIG device skips that device only, with
a warning naming the GPU and the call.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from discovery.attrs import pci_attributes, quantity, semver
from discovery.gpulib import (
    ARCHITECTURES,
    BRANDS,
    DeviceHandle,
    DriverNotLoadedError,
    GpuLibrary,
    GpuLibraryError,
    InvalidArgumentError,
    LibraryNotFoundError,
    NotFoundError,
    NotSupportedError,
    cuda_version_string,
    mig_profile_name,
    nvml_bus_id_to_sysfs,
)
from discovery.model import AttributeValue, CounterSet, Device, DeviceType, HostInfo, Version
from discovery.names import gpu_name, mig_name
from discovery.nvlink import GpuLinks, nvlink_attributes, read_links
from discovery.partitions import GpuFacts, OwnedKey, plan_gpu
from discovery.sysfs import PciFunction

log = logging.getLogger("discovery.gpus")

NVIDIA = 0x10DE
#: GPU instance profile id of the "+me" (media extensions) 1g profile.
PROFILE_1G_ME = 20
#: Control nodes a container using any NVIDIA GPU needs, added when present on the host.
CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")


def mig_cap_minors(gpu_minor: int, gi: int, ci: int) -> tuple[int, int]:
    """Minors of ``/dev/nvidia-caps/nvidia-cap<N>`` for a GI and a CI (closed formula from
    /proc/driver/nvidia-caps/mig-minors: 15 GIs x (1 + 8 CIs) per GPU minor)."""
    base = 135 * gpu_minor + 9 * gi
    return 3 + base, 4 + base + ci


@dataclass
class GpuScan:
    devices: list[Device] = field(default_factory=list)
    reserved: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    counter_sets: list[CounterSet] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _Common:
    """Facts shared by every device of one GPU (full and MIG)."""

    attrs: Mapping[str, AttributeValue]
    fn: PciFunction | None
    bdf: str
    minor: int
    uuid: str
    memory: int


class NvidiaScanner:
    def __init__(
        self,
        lib: GpuLibrary,
        pci: Mapping[str, PciFunction],
        *,
        below: Mapping[str, frozenset[str]],
        dev_root: Path,
        want_gpu: bool,
        want_mig: bool,
        mig_owned: Callable[[], Collection[OwnedKey]] | None = None,
    ) -> None:
        self.lib = lib
        #: None: static MIG (offer the instances that exist); else dynamic, and this says
        #: which instances dra-agent created (discovery.partitions).
        self.mig_owned = mig_owned
        self.pci = pci
        self.below = below
        self.dev_root = dev_root
        self.want_gpu = want_gpu
        self.want_mig = want_mig
        self.out = GpuScan()
        self._links: list[GpuLinks] = []  # of the GPUs offered whole

    def scan(self) -> GpuScan:
        try:
            self.lib.init()
        except (LibraryNotFoundError, DriverNotLoadedError) as err:
            # Normal on a node without NVIDIA GPUs: say so once per library, not per rescan.
            if not getattr(self.lib, "_dra_unavailable_logged", False):
                log.info("NVML not available, NVIDIA GPUs skipped", extra={"reason": str(err)})
                with contextlib.suppress(AttributeError):
                    self.lib._dra_unavailable_logged = True  # type: ignore[attr-defined]
            present = [f.bdf for f in self.pci.values() if _is_nvidia_gpu(f)]
            if present:
                self.out.warnings.append(
                    f"NVML unavailable ({err}); NVIDIA GPUs at {', '.join(present)} not offered"
                )
            return self.out
        except GpuLibraryError as err:
            self.out.warnings.append(f"NVML initialisation failed: {err}")
            return self.out
        try:
            self._scan_all()
        finally:
            try:
                self.lib.shutdown()
            except GpuLibraryError as err:
                log.info("NVML shutdown failed", extra={"error": str(err)})
        return self.out

    def _system_attrs(self) -> dict[str, AttributeValue]:
        attrs: dict[str, AttributeValue] = {}
        try:
            driver = semver(self.lib.driver_version())
            if driver:
                attrs["driverVersion"] = Version(driver)
            cuda = self.lib.cuda_driver_version()
            attrs["cudaDriverVersion"] = Version(cuda_version_string(cuda))
        except GpuLibraryError as err:
            self.out.warnings.append(f"NVML driver version unreadable: {err}")
        return attrs

    def _scan_all(self) -> None:
        system = self._system_attrs()
        try:
            count = self.lib.device_count()
        except GpuLibraryError as err:
            self.out.warnings.append(f"NVML device count failed: {err}")
            return
        for index in range(count):
            try:
                handle = self.lib.device_handle_by_index(index)
                common = self._common(handle, index, system)
            except (GpuLibraryError, ValueError) as err:
                msg = f"GPU index {index} skipped: {err}"
                log.warning("GPU skipped", extra={"index": index, "error": str(err)})
                self.out.warnings.append(msg)
                continue
            self._add_gpu(handle, common)
        self._add_nvlink_attributes()

    def _add_nvlink_attributes(self) -> None:
        """NVLink domains need every GPU's links, so they are added once all are read."""
        node_gpus = {f.bdf for f in self.pci.values() if _is_nvidia_gpu(f)}
        extra = nvlink_attributes(self._links, node_gpus)
        self.out.devices = [
            dataclasses.replace(d, attributes={**d.attributes, **extra[d.host.pci_address]})
            if d.type is DeviceType.GPU and d.host.pci_address in extra else d
            for d in self.out.devices
        ]

    def _common(
        self, handle: DeviceHandle, index: int, system: Mapping[str, AttributeValue]
    ) -> _Common:
        lib = self.lib
        bdf = nvml_bus_id_to_sysfs(lib.device_pci_bus_id(handle))
        fn = self.pci.get(bdf)
        if fn is None:
            self.out.warnings.append(f"GPU {bdf} not found in sysfs; PCI attributes omitted")
        major, minor_cc = lib.device_cuda_compute_capability(handle)
        arch = lib.device_architecture(handle)
        attrs: dict[str, AttributeValue] = {
            "productName": lib.device_name(handle),
            "brand": BRANDS.get(lib.device_brand(handle), "Unknown"),
            "architecture": ARCHITECTURES.get(arch, "Unknown"),
            "cudaComputeCapability": Version(f"{major}.{minor_cc}.0"),
            "vendor": "nvidia",
            **system,
            **pci_attributes(fn, self.below),
        }
        return _Common(
            attrs=attrs,
            fn=fn,
            bdf=bdf,
            minor=lib.device_minor_number(handle),
            uuid=lib.device_uuid(handle),
            memory=lib.device_memory_total(handle),
        )

    def _dev_nodes(self, *own: str) -> tuple[str, ...]:
        shared = tuple(f"/dev/{n}" for n in CONTROL_NODES if (self.dev_root / n).exists())
        return (*own, *shared)

    def _add_gpu(self, handle: DeviceHandle, c: _Common) -> None:
        name = gpu_name(c.minor)
        try:
            mig_current, mig_pending = self.lib.device_mig_mode(handle)
        except NotSupportedError:
            mig_current = mig_pending = 0
        except GpuLibraryError as err:
            self.out.warnings.append(f"{name}: MIG mode unreadable, treated as off: {err}")
            mig_current = mig_pending = 0
        if mig_pending != mig_current:
            log.info("MIG mode change pending a GPU reset",
                     extra={"device": name, "current": mig_current, "pending": mig_pending})
        if mig_current:
            if self.want_gpu:
                self.out.reserved[name] = (
                    "MIG mode enabled: offered as its MIG devices" if self.want_mig
                    else "MIG mode enabled and MIG devices are switched off (--device-types)"
                )
            if self.want_mig and self.mig_owned is not None:
                self._add_partitions(handle, c)
            elif self.want_mig:
                self._add_migs(handle, c)
            return
        if self.mig_owned is not None and self.want_mig and mig_current == 0 \
                and mig_pending == 0 and self._mig_capable(handle):
            self.out.warnings.append(
                f"{name}: MIG mode off, offered whole; --mig dynamic partitions it once MIG "
                f"mode is on (nvidia-smi -i {c.bdf} -mig 1, then reset the GPU)")
        if not self.want_gpu:
            return
        links = read_links(self.lib, handle, c.bdf, name, self.out.warnings)
        if links is not None:
            self._links.append(links)
        attrs = dict(c.attrs)
        attrs["uuid"] = c.uuid
        attrs["minor"] = c.minor
        try:
            attrs["index"] = self.lib.device_index(handle)
        except GpuLibraryError as err:
            log.info("GPU index unreadable", extra={"device": name, "error": str(err)})
        host = HostInfo(
            pci_address=c.bdf,
            vendor="nvidia",
            uuid=c.uuid,
            minor=c.minor,
            dev_nodes=self._dev_nodes(f"/dev/nvidia{c.minor}"),
            driver=c.fn.driver if c.fn else None,
            iommu_group=c.fn.iommu_group if c.fn else None,
        )
        self.out.devices.append(
            Device(name, DeviceType.GPU, attrs, {"memory": quantity(c.memory)}, host)
        )

    def _mig_capable(self, handle: DeviceHandle) -> bool:
        try:
            self.lib.gpu_instance_profile_info(handle, 0)
        except GpuLibraryError:
            return False
        return True

    def _add_partitions(self, handle: DeviceHandle, c: _Common) -> None:
        name = gpu_name(c.minor)
        owned = self.mig_owned() if self.mig_owned is not None else ()
        host = HostInfo(pci_address=c.bdf, dev_nodes=self._dev_nodes(f"/dev/nvidia{c.minor}"),
                        driver=c.fn.driver if c.fn else None)
        plan = plan_gpu(self.lib, handle,
                        GpuFacts(name, c.uuid, c.minor, c.memory, c.attrs, host), owned)
        self.out.warnings += plan.warnings
        self._add_migs(handle, c, skip_gis=plan.owned_gis)
        self.out.devices += plan.devices
        if plan.counter_set is not None:
            self.out.counter_sets.append(plan.counter_set)

    def _add_migs(self, handle: DeviceHandle, c: _Common,
                  skip_gis: Collection[int] = ()) -> None:
        try:
            slots = self.lib.device_max_mig_device_count(handle)
        except GpuLibraryError as err:
            self.out.warnings.append(f"gpu-{c.minor}: MIG devices unreadable: {err}")
            return
        for i in range(slots):
            try:
                mig = self.lib.device_mig_device_handle_by_index(handle, i)
            except (NotFoundError, InvalidArgumentError):
                continue  # empty slot
            except GpuLibraryError as err:
                self.out.warnings.append(f"gpu-{c.minor}: MIG device {i} skipped: {err}")
                continue
            try:
                if skip_gis and self.lib.device_gpu_instance_id(mig) in skip_gis:
                    continue  # created by dra-agent: published as its partition
                self._add_mig(handle, mig, c)
            except GpuLibraryError as err:
                log.warning("MIG device skipped",
                            extra={"gpu": f"gpu-{c.minor}", "slot": i, "error": str(err)})
                self.out.warnings.append(f"gpu-{c.minor}: MIG device {i} skipped: {err}")

    def _add_mig(self, parent: DeviceHandle, mig: DeviceHandle, c: _Common) -> None:
        lib = self.lib
        gi = lib.device_gpu_instance_id(mig)
        ci = lib.device_compute_instance_id(mig)
        info = lib.gpu_instance_info(parent, gi)
        a = lib.device_mig_attributes(mig)
        uuid = lib.device_uuid(mig)
        profile = mig_profile_name(a, c.memory, me=info.profile_id == PROFILE_1G_ME)
        split = a.compute_instance_slices < a.gpu_instance_slices
        name = mig_name(c.minor, profile, info.placement_start, ci if split else None)
        attrs = dict(c.attrs)
        attrs.update(
            uuid=uuid,
            parentUUID=c.uuid,
            parentMinor=c.minor,
            profile=profile,
            placementStart=info.placement_start,
            placementSize=info.placement_size,
        )
        capacity = {
            "memory": quantity(a.memory_mib * 1024 * 1024),
            "multiprocessors": str(a.multiprocessors),
            "copyEngines": str(a.copy_engines),
            "decoders": str(a.decoders),
            "encoders": str(a.encoders),
            "jpegEngines": str(a.jpeg_engines),
            "ofaEngines": str(a.ofa_engines),
        }
        gi_minor, ci_minor = mig_cap_minors(c.minor, gi, ci)
        host = HostInfo(
            pci_address=c.bdf,
            vendor="nvidia",
            uuid=uuid,
            parent_uuid=c.uuid,
            minor=c.minor,
            mig_gi=gi,
            mig_ci=ci,
            dev_nodes=self._dev_nodes(
                f"/dev/nvidia{c.minor}",
                f"/dev/nvidia-caps/nvidia-cap{gi_minor}",
                f"/dev/nvidia-caps/nvidia-cap{ci_minor}",
            ),
            driver=c.fn.driver if c.fn else None,
        )
        self.out.devices.append(Device(name, DeviceType.MIG, attrs, capacity, host))


def _is_nvidia_gpu(fn: PciFunction) -> bool:
    return fn.vendor == NVIDIA and fn.pci_class is not None and fn.pci_class >> 16 == 0x03


def scan_nvidia(
    lib: GpuLibrary | None,
    pci: Mapping[str, PciFunction],
    below: Mapping[str, frozenset[str]],
    dev_root: Path,
    *,
    want_gpu: bool = True,
    want_mig: bool = True,
    mig_owned: Callable[[], Collection[OwnedKey]] | None = None,
) -> GpuScan:
    if lib is None or not (want_gpu or want_mig):
        return GpuScan()
    return NvidiaScanner(
        lib, pci, below=below, dev_root=dev_root, want_gpu=want_gpu, want_mig=want_mig,
        mig_owned=mig_owned,
    ).scan()
