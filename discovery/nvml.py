"""``NvmlLibrary``: the real GpuLibrary, a thin adapter over ``pynvml`` (nvidia-ml-py).

pynvml is imported on ``init()``, not at import time, so commands that never touch GPUs
do not pay for it. Every pynvml error is re-raised as the matching ``discovery.gpulib`` type
(by NVML return code), so callers never import pynvml.
"""

from __future__ import annotations

import ctypes
import functools
import uuid
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from discovery.gpulib import (
    ERRORS_BY_CODE,
    DeviceHandle,
    EventSet,
    FabricInfo,
    FunctionNotFoundError,
    GpuEvent,
    GpuInstanceInfo,
    GpuInstanceProfile,
    GpuLibraryError,
    GpuTimeoutError,
    InvalidArgumentError,
    LibraryNotFoundError,
    MigAttributes,
    NotSupportedError,
    Placement,
)

#: Array sizes for NVML's list calls (at most 7 GIs per profile, 8 CIs per GI exist).
_MAX_INSTANCES = 16
#: Compute-instance profile indexes asked when listing every CI of a GI.
_CI_PROFILE_INDEXES = range(9)

P = ParamSpec("P")
R = TypeVar("R")


def _translate(func: Callable[P, R]) -> Callable[P, R]:
    """Turn pynvml.NVMLError into our error types, keeping the NVML function name."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        except GpuLibraryError:
            raise
        except Exception as err:
            code = getattr(err, "value", None)
            if not isinstance(code, int) or not type(err).__name__.startswith("NVMLError"):
                raise
            cls = ERRORS_BY_CODE.get(code, GpuLibraryError)
            raise cls(str(err), call=func.__name__) from err

    return wrapper


class NvmlLibrary:
    """GpuLibrary backed by libnvidia-ml.so.1 through pynvml."""

    def __init__(self, module: Any = None) -> None:
        # ``module`` lets a test hand in a stand-in for pynvml; normally imported on init().
        self._nvml: Any = module

    @property
    def nvml(self) -> Any:
        if self._nvml is None:
            raise GpuLibraryError("NVML used before init()", call="nvml")
        return self._nvml

    def init(self) -> None:
        if self._nvml is None:
            try:
                import pynvml
            except ImportError as err:  # the wheel is a hard dependency; be explicit anyway
                raise LibraryNotFoundError("python module pynvml (nvidia-ml-py) missing") from err
            self._nvml = pynvml
        _translate(self.nvml.nvmlInit)()

    @_translate
    def shutdown(self) -> None:
        self.nvml.nvmlShutdown()

    @_translate
    def driver_version(self) -> str:
        return str(self.nvml.nvmlSystemGetDriverVersion())

    @_translate
    def cuda_driver_version(self) -> int:
        return int(self.nvml.nvmlSystemGetCudaDriverVersion())

    @_translate
    def device_count(self) -> int:
        return int(self.nvml.nvmlDeviceGetCount())

    @_translate
    def device_handle_by_index(self, index: int) -> DeviceHandle:
        handle: DeviceHandle = self.nvml.nvmlDeviceGetHandleByIndex(index)
        return handle

    @_translate
    def device_name(self, handle: DeviceHandle) -> str:
        return str(self.nvml.nvmlDeviceGetName(handle))

    @_translate
    def device_uuid(self, handle: DeviceHandle) -> str:
        return str(self.nvml.nvmlDeviceGetUUID(handle))

    @_translate
    def device_minor_number(self, handle: DeviceHandle) -> int:
        return int(self.nvml.nvmlDeviceGetMinorNumber(handle))

    @_translate
    def device_index(self, handle: DeviceHandle) -> int:
        return int(self.nvml.nvmlDeviceGetIndex(handle))

    @_translate
    def device_brand(self, handle: DeviceHandle) -> int:
        return int(self.nvml.nvmlDeviceGetBrand(handle))

    @_translate
    def device_architecture(self, handle: DeviceHandle) -> int:
        return int(self.nvml.nvmlDeviceGetArchitecture(handle))

    @_translate
    def device_cuda_compute_capability(self, handle: DeviceHandle) -> tuple[int, int]:
        major, minor = self.nvml.nvmlDeviceGetCudaComputeCapability(handle)
        return int(major), int(minor)

    @_translate
    def device_memory_total(self, handle: DeviceHandle) -> int:
        return int(self.nvml.nvmlDeviceGetMemoryInfo(handle).total)

    @_translate
    def device_pci_bus_id(self, handle: DeviceHandle) -> str:
        return str(self.nvml.nvmlDeviceGetPciInfo(handle).busId)

    @_translate
    def device_mig_mode(self, handle: DeviceHandle) -> tuple[int, int]:
        current, pending = self.nvml.nvmlDeviceGetMigMode(handle)
        return int(current), int(pending)

    @_translate
    def device_max_mig_device_count(self, handle: DeviceHandle) -> int:
        return int(self.nvml.nvmlDeviceGetMaxMigDeviceCount(handle))

    @_translate
    def device_mig_device_handle_by_index(self, handle: DeviceHandle, index: int) -> DeviceHandle:
        mig: DeviceHandle = self.nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, index)
        return mig

    @_translate
    def device_gpu_instance_id(self, mig: DeviceHandle) -> int:
        return int(self.nvml.nvmlDeviceGetGpuInstanceId(mig))

    @_translate
    def device_compute_instance_id(self, mig: DeviceHandle) -> int:
        return int(self.nvml.nvmlDeviceGetComputeInstanceId(mig))

    @_translate
    def device_mig_attributes(self, mig: DeviceHandle) -> MigAttributes:
        a = self.nvml.nvmlDeviceGetAttributes(mig)
        return MigAttributes(
            multiprocessors=int(a.multiprocessorCount),
            copy_engines=int(a.sharedCopyEngineCount),
            decoders=int(a.sharedDecoderCount),
            encoders=int(a.sharedEncoderCount),
            jpeg_engines=int(a.sharedJpegCount),
            ofa_engines=int(a.sharedOfaCount),
            gpu_instance_slices=int(a.gpuInstanceSliceCount),
            compute_instance_slices=int(a.computeInstanceSliceCount),
            memory_mib=int(a.memorySizeMB),
        )

    @_translate
    def gpu_instance_info(self, handle: DeviceHandle, gpu_instance_id: int) -> GpuInstanceInfo:
        gi = self.nvml.nvmlDeviceGetGpuInstanceById(handle, gpu_instance_id)
        info = self.nvml.nvmlGpuInstanceGetInfo(gi)
        return GpuInstanceInfo(
            id=int(info.id),
            profile_id=int(info.profileId),
            placement_start=int(info.placement.start),
            placement_size=int(info.placement.size),
        )

    @_translate
    def gpu_instance_profile_info(
        self, handle: DeviceHandle, profile_index: int
    ) -> GpuInstanceProfile:
        i = self.nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, profile_index)
        return GpuInstanceProfile(
            id=int(i.id), slices=int(i.sliceCount), instance_count=int(i.instanceCount),
            memory_mib=int(i.memorySizeMB), multiprocessors=int(i.multiprocessorCount),
            copy_engines=int(i.copyEngineCount), decoders=int(i.decoderCount),
            encoders=int(i.encoderCount), jpeg_engines=int(i.jpegCount),
            ofa_engines=int(i.ofaCount),
        )

    @_translate
    def gpu_instance_possible_placements(
        self, handle: DeviceHandle, profile_id: int
    ) -> list[Placement]:
        nvml = self.nvml
        array = (nvml.c_nvmlGpuInstancePlacement_t * _MAX_INSTANCES)()
        count = ctypes.c_uint(_MAX_INSTANCES)
        nvml.nvmlDeviceGetGpuInstancePossiblePlacements(
            handle, profile_id, array, ctypes.byref(count))
        return [Placement(int(array[i].start), int(array[i].size)) for i in range(count.value)]

    def _gi_info(self, gi: Any) -> GpuInstanceInfo:
        info = self.nvml.nvmlGpuInstanceGetInfo(gi)
        return GpuInstanceInfo(
            id=int(info.id), profile_id=int(info.profileId),
            placement_start=int(info.placement.start), placement_size=int(info.placement.size),
        )

    @_translate
    def gpu_instances(self, handle: DeviceHandle, profile_id: int) -> list[GpuInstanceInfo]:
        nvml = self.nvml
        array = (nvml.c_nvmlGpuInstance_t * _MAX_INSTANCES)()
        count = ctypes.c_uint(0)
        nvml.nvmlDeviceGetGpuInstances(handle, profile_id, array, ctypes.byref(count))
        return [self._gi_info(array[i]) for i in range(count.value)]

    @_translate
    def create_gpu_instance_with_placement(
        self, handle: DeviceHandle, profile_id: int, placement: Placement
    ) -> GpuInstanceInfo:
        nvml = self.nvml
        where = nvml.c_nvmlGpuInstancePlacement_t()
        where.start, where.size = placement.start, placement.size
        gi = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(
            handle, profile_id, ctypes.byref(where))
        return self._gi_info(gi)

    @_translate
    def create_compute_instance(
        self, handle: DeviceHandle, gpu_instance_id: int, ci_profile_index: int
    ) -> int:
        nvml = self.nvml
        gi = nvml.nvmlDeviceGetGpuInstanceById(handle, gpu_instance_id)
        ci = nvml.nvmlGpuInstanceCreateComputeInstance(gi, ci_profile_index)
        return int(nvml.nvmlComputeInstanceGetInfo(ci).id)

    @_translate
    def compute_instances(self, handle: DeviceHandle, gpu_instance_id: int) -> list[int]:
        nvml = self.nvml
        gi = nvml.nvmlDeviceGetGpuInstanceById(handle, gpu_instance_id)
        ids: list[int] = []
        for index in _CI_PROFILE_INDEXES:
            array = (nvml.c_nvmlComputeInstance_t * _MAX_INSTANCES)()
            count = ctypes.c_uint(0)
            try:
                _translate(nvml.nvmlGpuInstanceGetComputeInstances)(
                    gi, index, array, ctypes.byref(count))
            except (NotSupportedError, InvalidArgumentError):
                continue  # a CI profile this GI does not have
            ids += [int(nvml.nvmlComputeInstanceGetInfo(array[i]).id) for i in range(count.value)]
        return sorted(ids)

    @_translate
    def destroy_compute_instance(
        self, handle: DeviceHandle, gpu_instance_id: int, compute_instance_id: int
    ) -> None:
        nvml = self.nvml
        gi = nvml.nvmlDeviceGetGpuInstanceById(handle, gpu_instance_id)
        ci = nvml.nvmlGpuInstanceGetComputeInstanceById(gi, compute_instance_id)
        nvml.nvmlComputeInstanceDestroy(ci)

    @_translate
    def destroy_gpu_instance(self, handle: DeviceHandle, gpu_instance_id: int) -> None:
        nvml = self.nvml
        nvml.nvmlGpuInstanceDestroy(nvml.nvmlDeviceGetGpuInstanceById(handle, gpu_instance_id))

    @_translate
    def device_nvlink_state(self, handle: DeviceHandle, link: int) -> bool:
        # NVML's NvLink methods (docs.nvidia.com/deploy/nvml-api/group__NvLink.html): 1
        # active, 0 inactive, and on newer drivers 2 asleep, a trained link in a low-power
        # state that wakes on traffic, so still a peer. INVALID_ARGUMENT for a link the GPU
        # lacks, NOT_SUPPORTED for a GPU without NVLink.
        return bool(self.nvml.nvmlDeviceGetNvLinkState(handle, link))

    @_translate
    def device_nvlink_remote_pci_bus_id(self, handle: DeviceHandle, link: int) -> str:
        # pynvml calls nvmlDeviceGetNvLinkRemotePciInfo_v2, which fills nvmlPciInfo_t: the
        # bus id at its 9.0 place (busId), the 16-character one before it (busIdLegacy).
        info = self.nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link)
        return str(info.busId or info.busIdLegacy)

    @_translate
    def device_nvlink_remote_device_type(self, handle: DeviceHandle, link: int) -> int:
        return int(self.nvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link))

    def device_gpu_fabric_info(self, handle: DeviceHandle) -> FabricInfo:
        """The versioned call (v2 struct) where the library has it, else the legacy one
        (drivers before it, deprecated since); neither: FunctionNotFoundError."""
        nvml = self.nvml
        versioned = getattr(nvml, "c_nvmlGpuFabricInfo_v2_t", None)  # older nvidia-ml-py: none
        try:
            if versioned is None:
                raise FunctionNotFoundError("no versioned struct", call="device_gpu_fabric_info")
            info = versioned()  # sets .version itself
            _translate(nvml.nvmlDeviceGetGpuFabricInfoV)(handle, ctypes.byref(info))
        except FunctionNotFoundError:
            info = nvml.c_nvmlGpuFabricInfo_t()
            _translate(nvml.nvmlDeviceGetGpuFabricInfo)(handle, ctypes.byref(info))
        return FabricInfo(
            cluster_uuid=str(uuid.UUID(bytes=bytes(info.clusterUuid))),
            clique_id=int(info.cliqueId),
            state=int(info.state),
            status=int(info.status),
        )

    @_translate
    def device_supported_event_types(self, handle: DeviceHandle) -> int:
        return int(self.nvml.nvmlDeviceGetSupportedEventTypes(handle))

    @_translate
    def event_set_create(self) -> EventSet:
        events: EventSet = self.nvml.nvmlEventSetCreate()
        return events

    @_translate
    def device_register_events(self, handle: DeviceHandle, mask: int, events: EventSet) -> None:
        self.nvml.nvmlDeviceRegisterEvents(handle, mask, events)

    def event_set_wait(self, events: EventSet, timeout_ms: int) -> GpuEvent | None:
        try:
            data = _translate(self.nvml.nvmlEventSetWait_v2)(events, timeout_ms)
        except GpuTimeoutError:
            return None
        return GpuEvent(
            uuid=self.device_uuid(data.device),
            event_type=int(data.eventType),
            data=int(data.eventData),
            gpu_instance=int(data.gpuInstanceId),
            compute_instance=int(data.computeInstanceId),
        )

    @_translate
    def event_set_free(self, events: EventSet) -> None:
        self.nvml.nvmlEventSetFree(events)
