"""``FakeNvml``: a GpuLibrary with the values real DGX machines report, plus fault hooks.

The numbers follow real captures, not the upstream mocks: memory totals that are not round
(81559 MiB on H100), GPU-instance profile *ids* 19/20/15/14/9/5/0 (not enum indexes),
placements counted in 8 memory slices, driver-picked GI ids, MIG UUIDs in UUIDv5 form and an
NVML bus id in NVML's own spelling (``00000000:1B:00.0``).

Hooks for tests and the health feature: ``inject_xid``, ``inject_ecc``, ``set_lost``,
``fail`` (make one call raise for one GPU, e.g. an NVML error mid-scan), ``clear_faults``.
"""

from __future__ import annotations

import hashlib
import queue
import threading
import uuid as uuidlib
from dataclasses import dataclass, field

from discovery.gpulib import (
    EVENT_DOUBLE_BIT_ECC,
    EVENT_MIG_CONFIG_CHANGE,
    EVENT_SINGLE_BIT_ECC,
    EVENT_XID_CRITICAL,
    WHOLE_GPU,
    DeviceHandle,
    EventSet,
    GpuEvent,
    GpuInstanceInfo,
    GpuIsLostError,
    GpuLibraryError,
    InvalidArgumentError,
    MigAttributes,
    NotFoundError,
    NotSupportedError,
    UninitializedError,
)

_NS = uuidlib.UUID("8f0c52de-7c55-4a0e-9f3a-2f3c0c1f6a11")


@dataclass(frozen=True, slots=True)
class GiProfile:
    """A GPU-instance profile row (nvidia-smi mig -lgip) of one GPU model."""

    id: int
    slices: int  # compute slices (the "g")
    placement_size: int  # memory slices out of 8
    memory_mib: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int


#: A100-SXM4-80GB (98 SMs usable in MIG). Keyed by profile id.
A100_80GB_PROFILES = {
    p.id: p
    for p in (
        GiProfile(19, 1, 1, 9728, 14, 1, 0, 0, 0, 0),
        GiProfile(20, 1, 1, 9728, 14, 1, 1, 0, 1, 1),
        GiProfile(15, 1, 2, 19968, 14, 1, 1, 0, 0, 0),
        GiProfile(14, 2, 2, 19968, 28, 2, 1, 0, 0, 0),
        GiProfile(9, 3, 4, 40192, 42, 3, 2, 0, 0, 0),
        GiProfile(5, 4, 4, 40192, 56, 4, 2, 0, 0, 0),
        GiProfile(0, 7, 8, 80896, 98, 7, 5, 0, 1, 1),
    )
}
#: H100 80GB HBM3 (132 SMs).
H100_80GB_PROFILES = {
    p.id: p
    for p in (
        GiProfile(19, 1, 1, 9984, 16, 1, 1, 0, 1, 0),
        GiProfile(20, 1, 1, 9984, 16, 1, 1, 0, 1, 1),
        GiProfile(15, 1, 2, 20096, 26, 1, 1, 0, 1, 0),
        GiProfile(14, 2, 2, 20096, 32, 2, 2, 0, 2, 0),
        GiProfile(9, 3, 4, 40448, 60, 3, 3, 0, 3, 0),
        GiProfile(5, 4, 4, 40448, 64, 4, 4, 0, 4, 0),
        GiProfile(0, 7, 8, 81152, 132, 8, 7, 0, 7, 1),
    )
}


@dataclass
class FakeMig:
    """One MIG device: a compute instance ``ci`` inside GPU instance ``gi``."""

    gi: int
    ci: int
    profile: GiProfile
    start: int
    ci_slices: int = 0  # 0: the CI spans the whole GI
    uuid: str = ""


@dataclass
class FakeGpu:
    index: int
    minor: int
    bdf: str  # sysfs form, 0000:1b:00.0
    name: str
    memory_bytes: int
    pci_device_id: int  # e.g. 0x2330
    architecture: int  # 9 Hopper, 7 Ampere
    compute_capability: tuple[int, int]
    brand: int = 14
    uuid: str = ""
    mig_mode: tuple[int, int] = (0, 0)
    migs: list[FakeMig] = field(default_factory=list)
    lost: bool = False

    def __post_init__(self) -> None:
        if not self.uuid:
            h = hashlib.sha256(f"{self.bdf}/{self.name}".encode()).hexdigest()
            self.uuid = f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"
        for mig in self.migs:
            if not mig.uuid:
                mig.uuid = "MIG-" + str(uuidlib.uuid5(_NS, f"{self.uuid}/{mig.gi}/{mig.ci}"))

    @property
    def nvml_bus_id(self) -> str:
        domain, bus, rest = self.bdf.split(":")
        return f"{int(domain, 16):08X}:{bus.upper()}:{rest.upper()}"


@dataclass(frozen=True, slots=True)
class _Handle:
    gpu: FakeGpu
    mig: FakeMig | None = None


@dataclass
class _EventSet:
    events: queue.Queue[GpuEvent] = field(default_factory=queue.Queue)
    masks: dict[str, int] = field(default_factory=dict)  # GPU uuid -> registered mask


class FakeNvml:
    """In-memory NVML. Thread-safe enough for one scanner plus one health watcher."""

    def __init__(self, gpus: list[FakeGpu], driver: str = "550.54.15", cuda: int = 12040,
                 init_error: GpuLibraryError | None = None) -> None:
        self.gpus = gpus
        self.driver = driver
        self.cuda = cuda
        self.init_error = init_error
        self._refs = 0
        self._lock = threading.Lock()
        self._faults: dict[tuple[str, str | None], GpuLibraryError] = {}
        self._sets: list[_EventSet] = []
        self.calls = 0  # number of library calls, for tests that check caching

    # -- fault hooks -----------------------------------------------------------------------
    def fail(self, call: str, error: GpuLibraryError, uuid: str | None = None) -> None:
        """Make ``call`` (a GpuLibrary method name) raise ``error``, for one GPU or all."""
        self._faults[(call, uuid)] = error

    def clear_faults(self) -> None:
        self._faults.clear()
        for gpu in self.gpus:
            gpu.lost = False

    def set_lost(self, uuid: str) -> None:
        """The GPU fell off the bus: its calls raise GpuIsLostError, and so do event waits."""
        self._gpu(uuid).lost = True
        for es in self._sets:
            if uuid in es.masks:
                es.events.put(GpuEvent(uuid, EVENT_XID_CRITICAL, 79))

    def inject_xid(self, uuid: str, xid: int) -> None:
        """Deliver an Xid event; a MIG UUID targets that MIG device's GI/CI."""
        gpu, mig = self._resolve(uuid)
        self._deliver(gpu, EVENT_XID_CRITICAL, xid, mig)

    def inject_mig_change(self, uuid: str) -> None:
        """Announce a MIG reconfiguration of a GPU (after tests edited ``FakeGpu.migs``)."""
        self._deliver(self._gpu(uuid), EVENT_MIG_CONFIG_CHANGE, 0, None)

    def inject_ecc(self, uuid: str, double_bit: bool = True) -> None:
        gpu, mig = self._resolve(uuid)
        kind = EVENT_DOUBLE_BIT_ECC if double_bit else EVENT_SINGLE_BIT_ECC
        self._deliver(gpu, kind, 0, mig)

    def _deliver(self, gpu: FakeGpu, kind: int, data: int, mig: FakeMig | None) -> None:
        gi, ci = (mig.gi, mig.ci) if mig else (WHOLE_GPU, WHOLE_GPU)
        for es in self._sets:
            if es.masks.get(gpu.uuid, 0) & kind:
                es.events.put(GpuEvent(gpu.uuid, kind, data, gi, ci))

    def _resolve(self, uuid: str) -> tuple[FakeGpu, FakeMig | None]:
        for gpu in self.gpus:
            if gpu.uuid == uuid:
                return gpu, None
            for mig in gpu.migs:
                if mig.uuid == uuid:
                    return gpu, mig
        raise NotFoundError(f"no GPU {uuid}")

    def _gpu(self, uuid: str) -> FakeGpu:
        return self._resolve(uuid)[0]

    # -- plumbing --------------------------------------------------------------------------
    def _check(self, call: str, handle: DeviceHandle | None = None) -> _Handle | None:
        self.calls += 1
        if self._refs <= 0:
            raise UninitializedError("UninitializedError", call=call)
        h = handle if isinstance(handle, _Handle) else None
        if handle is not None and h is None:
            raise InvalidArgumentError("not a FakeNvml handle", call=call)
        uuid = h.gpu.uuid if h else None
        fault = self._faults.get((call, uuid)) or self._faults.get((call, None))
        if fault is not None:
            raise fault
        if h is not None and h.gpu.lost:
            raise GpuIsLostError("GPU is lost", call=call)
        return h

    def _h(self, call: str, handle: DeviceHandle) -> _Handle:
        h = self._check(call, handle)
        assert h is not None
        return h

    # -- GpuLibrary --------------------------------------------------------------------------
    def init(self) -> None:
        if self.init_error is not None:
            raise self.init_error
        with self._lock:
            self._refs += 1

    def shutdown(self) -> None:
        self._check("shutdown")
        with self._lock:
            self._refs -= 1

    def driver_version(self) -> str:
        self._check("driver_version")
        return self.driver

    def cuda_driver_version(self) -> int:
        self._check("cuda_driver_version")
        return self.cuda

    def device_count(self) -> int:
        self._check("device_count")
        return len(self.gpus)

    def device_handle_by_index(self, index: int) -> DeviceHandle:
        self._check("device_handle_by_index")
        for gpu in self.gpus:
            if gpu.index == index:
                self._check("device_handle_by_index", _Handle(gpu))
                return _Handle(gpu)
        raise InvalidArgumentError(f"no GPU index {index}", call="device_handle_by_index")

    def device_name(self, handle: DeviceHandle) -> str:
        return self._h("device_name", handle).gpu.name

    def device_uuid(self, handle: DeviceHandle) -> str:
        h = self._h("device_uuid", handle)
        return h.mig.uuid if h.mig else h.gpu.uuid

    def device_minor_number(self, handle: DeviceHandle) -> int:
        return self._h("device_minor_number", handle).gpu.minor

    def device_index(self, handle: DeviceHandle) -> int:
        return self._h("device_index", handle).gpu.index

    def device_brand(self, handle: DeviceHandle) -> int:
        return self._h("device_brand", handle).gpu.brand

    def device_architecture(self, handle: DeviceHandle) -> int:
        return self._h("device_architecture", handle).gpu.architecture

    def device_cuda_compute_capability(self, handle: DeviceHandle) -> tuple[int, int]:
        return self._h("device_cuda_compute_capability", handle).gpu.compute_capability

    def device_memory_total(self, handle: DeviceHandle) -> int:
        h = self._h("device_memory_total", handle)
        return h.mig.profile.memory_mib * 1024 * 1024 if h.mig else h.gpu.memory_bytes

    def device_pci_bus_id(self, handle: DeviceHandle) -> str:
        return self._h("device_pci_bus_id", handle).gpu.nvml_bus_id

    def device_mig_mode(self, handle: DeviceHandle) -> tuple[int, int]:
        h = self._h("device_mig_mode", handle)
        if h.gpu.architecture < 7:
            raise NotSupportedError("MIG not supported", call="device_mig_mode")
        return h.gpu.mig_mode

    def device_max_mig_device_count(self, handle: DeviceHandle) -> int:
        h = self._h("device_max_mig_device_count", handle)
        return 7 if h.gpu.mig_mode[0] else 0

    def _ordered_migs(self, gpu: FakeGpu) -> list[FakeMig]:
        return sorted(gpu.migs, key=lambda m: (m.start, m.ci))

    def device_mig_device_handle_by_index(self, handle: DeviceHandle, index: int) -> DeviceHandle:
        h = self._h("device_mig_device_handle_by_index", handle)
        migs = self._ordered_migs(h.gpu)
        if not h.gpu.mig_mode[0] or index >= len(migs):
            raise NotFoundError(f"no MIG device {index}", call="device_mig_device_handle_by_index")
        return _Handle(h.gpu, migs[index])

    def _mig(self, call: str, handle: DeviceHandle) -> FakeMig:
        h = self._h(call, handle)
        if h.mig is None:
            raise InvalidArgumentError("not a MIG handle", call=call)
        return h.mig

    def device_gpu_instance_id(self, mig: DeviceHandle) -> int:
        return self._mig("device_gpu_instance_id", mig).gi

    def device_compute_instance_id(self, mig: DeviceHandle) -> int:
        return self._mig("device_compute_instance_id", mig).ci

    def device_mig_attributes(self, mig: DeviceHandle) -> MigAttributes:
        m = self._mig("device_mig_attributes", mig)
        p = m.profile
        ci_slices = m.ci_slices or p.slices
        return MigAttributes(
            multiprocessors=p.multiprocessors * ci_slices // p.slices,
            copy_engines=p.copy_engines,
            decoders=p.decoders,
            encoders=p.encoders,
            jpeg_engines=p.jpeg_engines,
            ofa_engines=p.ofa_engines,
            gpu_instance_slices=p.slices,
            compute_instance_slices=ci_slices,
            memory_mib=p.memory_mib,
        )

    def gpu_instance_info(self, handle: DeviceHandle, gpu_instance_id: int) -> GpuInstanceInfo:
        h = self._h("gpu_instance_info", handle)
        for m in h.gpu.migs:
            if m.gi == gpu_instance_id:
                return GpuInstanceInfo(m.gi, m.profile.id, m.start, m.profile.placement_size)
        raise NotFoundError(f"no GPU instance {gpu_instance_id}", call="gpu_instance_info")

    def device_supported_event_types(self, handle: DeviceHandle) -> int:
        self._h("device_supported_event_types", handle)
        return (EVENT_SINGLE_BIT_ECC | EVENT_DOUBLE_BIT_ECC | EVENT_XID_CRITICAL
                | EVENT_MIG_CONFIG_CHANGE)

    def event_set_create(self) -> EventSet:
        self._check("event_set_create")
        es = _EventSet()
        with self._lock:
            self._sets.append(es)
        return es

    def device_register_events(self, handle: DeviceHandle, mask: int, events: EventSet) -> None:
        h = self._h("device_register_events", handle)
        assert isinstance(events, _EventSet)
        events.masks[h.gpu.uuid] = events.masks.get(h.gpu.uuid, 0) | mask

    def event_set_wait(self, events: EventSet, timeout_ms: int) -> GpuEvent | None:
        self._check("event_set_wait")
        assert isinstance(events, _EventSet)
        try:
            return events.events.get_nowait()
        except queue.Empty:
            pass
        for gpu in self.gpus:
            if gpu.lost and gpu.uuid in events.masks:
                raise GpuIsLostError(f"{gpu.uuid} is lost", call="event_set_wait")
        try:
            return events.events.get(timeout=max(timeout_ms, 0) / 1000)
        except queue.Empty:
            return None

    def event_set_free(self, events: EventSet) -> None:
        with self._lock:
            if events in self._sets:
                self._sets.remove(events)
