"""The seam to the GPU management library (NVML): a narrow Protocol plus its value types.

Discovery, health and the simulated profiles all speak this interface, never ``pynvml``
directly: ``discovery.nvml.NvmlLibrary`` adapts the real library, ``discovery.simulate.FakeNvml``
stands in for it. Method names follow NVML's so a reader can look each one up; errors are our
own types so callers never import pynvml to catch them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

#: NVML event type bits (nvmlEventType*), the ones health monitoring registers for.
EVENT_SINGLE_BIT_ECC = 0x1
EVENT_DOUBLE_BIT_ECC = 0x2
EVENT_XID_CRITICAL = 0x8
EVENT_MIG_CONFIG_CHANGE = 0x100
#: gpuInstanceId / computeInstanceId of an event that concerns the whole GPU.
WHOLE_GPU = 0xFFFFFFFF

#: NVML_NVLINK_MAX_LINKS as nvidia-ml-py 13 has it (36; older headers said 18, and H100 and
#: B200 have 18). A link the GPU lacks answers INVALID_ARGUMENT or NOT_SUPPORTED, so asking
#: the larger count is safe on every driver.
NVLINK_MAX_LINKS = 36
#: nvmlDeviceGetNvLinkRemoteDeviceType values (nvmlIntNvLinkDeviceType_t).
NVLINK_REMOTE_GPU = 0x00
NVLINK_REMOTE_IBMNPU = 0x01
NVLINK_REMOTE_SWITCH = 0x02
NVLINK_REMOTE_UNKNOWN = 0xFF
#: nvmlGpuFabricState_t: the fabric manager (or, on GB200, the NVLink subnet manager) has
#: finished registering the GPU in its NVLink fabric.
FABRIC_STATE_NOT_SUPPORTED = 0
FABRIC_STATE_NOT_STARTED = 1
FABRIC_STATE_IN_PROGRESS = 2
FABRIC_STATE_COMPLETED = 3

#: nvmlDeviceGetArchitecture values -> published name.
ARCHITECTURES = {
    2: "Kepler",
    3: "Maxwell",
    4: "Pascal",
    5: "Volta",
    6: "Turing",
    7: "Ampere",
    8: "Ada",
    9: "Hopper",
    10: "Blackwell",
}
#: nvmlDeviceGetBrand values -> published name (the subset current data-centre parts report).
BRANDS = {
    0: "Unknown",
    1: "Quadro",
    2: "Tesla",
    3: "NVS",
    4: "Grid",
    5: "GeForce",
    6: "Titan",
    14: "Nvidia",
    15: "GeForceRTX",
    16: "NvidiaRTX",
}


class GpuLibraryError(Exception):
    """An NVML call failed. ``code`` is NVML's return code; ``call`` the function name."""

    code = 999

    def __init__(self, message: str = "", call: str = "") -> None:
        self.call = call
        super().__init__(f"{call}: {message}" if call else message)


class LibraryNotFoundError(GpuLibraryError):
    """libnvidia-ml.so.1 is not installed: a node without NVIDIA GPUs. Not an error."""

    code = 12


class DriverNotLoadedError(GpuLibraryError):
    """The library exists but the kernel module is not loaded."""

    code = 9


class UninitializedError(GpuLibraryError):
    code = 1


class InvalidArgumentError(GpuLibraryError):
    code = 2


class NotSupportedError(GpuLibraryError):
    code = 3


class NotFoundError(GpuLibraryError):
    code = 6


class FunctionNotFoundError(NotSupportedError):
    """The installed libnvidia-ml lacks the function (a driver older than the call): for the
    caller the same as NOT_SUPPORTED, so it is one."""

    code = 13


class GpuTimeoutError(GpuLibraryError):
    code = 10


class NoPermissionError(GpuLibraryError):
    """The call needs privileges the process lacks (MIG changes need root or CAP_SYS_ADMIN)."""

    code = 4


class GpuIsLostError(GpuLibraryError):
    """The GPU fell off the bus (Xid 79) or stopped answering."""

    code = 15


class InUseError(GpuLibraryError):
    """The instance is in use: a process runs on it, or a GI still holds compute instances."""

    code = 19


class InsufficientResourcesError(GpuLibraryError):
    """The placement overlaps an existing instance, or the GPU has no room for the profile."""

    code = 23


#: NVML return code -> our exception type (anything else becomes GpuLibraryError).
ERRORS_BY_CODE: dict[int, type[GpuLibraryError]] = {
    cls.code: cls
    for cls in (
        LibraryNotFoundError,
        DriverNotLoadedError,
        UninitializedError,
        InvalidArgumentError,
        NotSupportedError,
        NotFoundError,
        FunctionNotFoundError,
        NoPermissionError,
        GpuTimeoutError,
        GpuIsLostError,
        InUseError,
        InsufficientResourcesError,
    )
}

#: nvmlDeviceGetGpuInstanceProfileInfo's profile *indexes* (NVML_GPU_INSTANCE_PROFILE_*) that
#: A100/H100-class GPUs support: 1g, 1g+me (REV1), 1g double memory (REV2), 2g, 3g, 4g, 7g.
#: NVML answers NOT_SUPPORTED for the others; the returned ``id`` is what placements use.
GI_PROFILE_INDEXES = (0, 7, 9, 1, 2, 3, 4)
#: NVML_COMPUTE_INSTANCE_PROFILE_* index of a CI spanning a GI of that many compute slices.
CI_PROFILE_FULL = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}


@dataclass(frozen=True, slots=True)
class MigAttributes:
    """nvmlDeviceGetAttributes of a MIG device handle."""

    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int
    gpu_instance_slices: int
    compute_instance_slices: int
    memory_mib: int


@dataclass(frozen=True, slots=True)
class GpuInstanceInfo:
    """nvmlGpuInstanceGetInfo: the GI's profile id and its placement in memory slices."""

    id: int
    profile_id: int
    placement_start: int
    placement_size: int


@dataclass(frozen=True, slots=True)
class GpuInstanceProfile:
    """nvmlDeviceGetGpuInstanceProfileInfo: one GPU-instance profile of a GPU model.

    ``id`` is the profile id (19, 20, 15, 14, 9, 5, 0), not the index it was asked by;
    ``instance_count`` how many of it fit on an empty GPU.
    """

    id: int
    slices: int  # compute slices (the "g" of the name)
    instance_count: int
    memory_mib: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int


@dataclass(frozen=True, slots=True)
class Placement:
    """nvmlGpuInstancePlacement_t: where a GI sits, in memory slices (8 per GPU)."""

    start: int
    size: int


@dataclass(frozen=True, slots=True)
class GpuEvent:
    """One event from an event set; ``gpu_instance``/``compute_instance`` are WHOLE_GPU for a
    full-GPU event."""

    uuid: str
    event_type: int
    data: int  # the Xid number for EVENT_XID_CRITICAL
    gpu_instance: int = WHOLE_GPU
    compute_instance: int = WHOLE_GPU


@dataclass(frozen=True, slots=True)
class FabricInfo:
    """nvmlDeviceGetGpuFabricInfoV (v2, or the older nvmlDeviceGetGpuFabricInfo): where the
    GPU sits in an NVLink fabric (NVSwitch systems; NVL72 racks span nodes).

    ``cluster_uuid`` is the 16-byte cluster UUID in its canonical 36-character form (all
    zeros on a single-node HGX); ``status`` is the NVML return code of the registration.
    """

    cluster_uuid: str
    clique_id: int
    state: int
    status: int

    @property
    def attached(self) -> bool:
        """Registered in a multi-node NVLink fabric: what go-nvlib's ``IsFabricAttached``
        checks (state completed, status success, a cluster UUID that is not zero)."""
        return (self.state == FABRIC_STATE_COMPLETED and self.status == 0
                and self.cluster_uuid.strip("0-") != "")


class DeviceHandle(Protocol):
    """Opaque per-device handle; only the library that made it knows what is inside."""


class EventSet(Protocol):
    """Opaque event set handle."""


@runtime_checkable
class GpuLibrary(Protocol):
    """The NVML calls dra-agent makes. Every method may raise GpuLibraryError subclasses."""

    def init(self) -> None: ...
    def shutdown(self) -> None: ...
    def driver_version(self) -> str: ...
    def cuda_driver_version(self) -> int: ...  # e.g. 12040
    def device_count(self) -> int: ...
    def device_handle_by_index(self, index: int) -> DeviceHandle: ...
    def device_name(self, handle: DeviceHandle) -> str: ...
    def device_uuid(self, handle: DeviceHandle) -> str: ...
    def device_minor_number(self, handle: DeviceHandle) -> int: ...
    def device_index(self, handle: DeviceHandle) -> int: ...
    def device_brand(self, handle: DeviceHandle) -> int: ...
    def device_architecture(self, handle: DeviceHandle) -> int: ...
    def device_cuda_compute_capability(self, handle: DeviceHandle) -> tuple[int, int]: ...
    def device_memory_total(self, handle: DeviceHandle) -> int: ...  # bytes
    def device_pci_bus_id(self, handle: DeviceHandle) -> str: ...  # NVML form 00000000:1B:00.0
    def device_mig_mode(self, handle: DeviceHandle) -> tuple[int, int]: ...  # current, pending
    def device_max_mig_device_count(self, handle: DeviceHandle) -> int: ...
    def device_mig_device_handle_by_index(
        self, handle: DeviceHandle, index: int
    ) -> DeviceHandle: ...
    def device_gpu_instance_id(self, mig: DeviceHandle) -> int: ...
    def device_compute_instance_id(self, mig: DeviceHandle) -> int: ...
    def device_mig_attributes(self, mig: DeviceHandle) -> MigAttributes: ...
    def gpu_instance_info(self, handle: DeviceHandle, gpu_instance_id: int) -> GpuInstanceInfo: ...
    # MIG instance management (dynamic partitions, agent.prepare.effects.mig). GPU and compute
    # instances are named by their ids; each call looks the handle up again.
    def gpu_instance_profile_info(
        self, handle: DeviceHandle, profile_index: int
    ) -> GpuInstanceProfile: ...
    def gpu_instance_possible_placements(
        self, handle: DeviceHandle, profile_id: int
    ) -> list[Placement]: ...
    def gpu_instances(self, handle: DeviceHandle, profile_id: int) -> list[GpuInstanceInfo]: ...
    def create_gpu_instance_with_placement(
        self, handle: DeviceHandle, profile_id: int, placement: Placement
    ) -> GpuInstanceInfo: ...
    def create_compute_instance(
        self, handle: DeviceHandle, gpu_instance_id: int, ci_profile_index: int
    ) -> int: ...
    def compute_instances(self, handle: DeviceHandle, gpu_instance_id: int) -> list[int]: ...
    def destroy_compute_instance(
        self, handle: DeviceHandle, gpu_instance_id: int, compute_instance_id: int
    ) -> None: ...
    def destroy_gpu_instance(self, handle: DeviceHandle, gpu_instance_id: int) -> None: ...
    # NVLink topology (discovery.nvlink): one link at a time, 0..NVLINK_MAX_LINKS-1.
    def device_nvlink_state(self, handle: DeviceHandle, link: int) -> bool: ...  # active
    def device_nvlink_remote_pci_bus_id(
        self, handle: DeviceHandle, link: int
    ) -> str: ...  # NVML form, like device_pci_bus_id
    def device_nvlink_remote_device_type(self, handle: DeviceHandle, link: int) -> int: ...
    def device_gpu_fabric_info(self, handle: DeviceHandle) -> FabricInfo: ...
    # Events (health monitoring).
    def device_supported_event_types(self, handle: DeviceHandle) -> int: ...
    def event_set_create(self) -> EventSet: ...
    def device_register_events(self, handle: DeviceHandle, mask: int, events: EventSet) -> None: ...
    def event_set_wait(self, events: EventSet, timeout_ms: int) -> GpuEvent | None: ...
    def event_set_free(self, events: EventSet) -> None: ...


def nvml_bus_id_to_sysfs(bus_id: str) -> str:
    """``00000000:1B:00.0`` (NVML) -> ``0000:1b:00.0`` (sysfs and the k8s pciBusID attribute).

    Raises ValueError for anything that is not domain:bus:device.function.
    """
    domain, bus, rest = bus_id.strip().split(":")
    device, function = rest.split(".")
    return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}.{int(function, 16):x}"


def cuda_version_string(value: int) -> str:
    """12040 -> "12.4.0" (NVML packs major*1000 + minor*10)."""
    return f"{value // 1000}.{(value % 1000) // 10}.0"


def mig_profile_name(attrs: MigAttributes, parent_memory_bytes: int, me: bool = False) -> str:
    """The MIG profile name as NVIDIA tools compute it (``1g.10gb``, ``1c.3g.40gb``).

    Tools do not read the name, they derive it from the memory share: the fraction of the
    parent's memory rounded up to eighths, times the parent's total rounded up to whole GiB.
    """
    gib = 1024**3
    mem = attrs.memory_mib * 1024 * 1024
    eighths = -(-mem * 8 // parent_memory_bytes)  # ceil without floats
    total_gb = -(-parent_memory_bytes // gib)
    gb = (eighths * total_gb * 2 + 8) // 16  # round half away from zero of eighths/8*total
    name = f"{attrs.gpu_instance_slices}g.{gb}gb"
    if attrs.compute_instance_slices < attrs.gpu_instance_slices:
        name = f"{attrs.compute_instance_slices}c.{name}"
    return name + ("+me" if me else "")
