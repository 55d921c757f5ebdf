"""``FakeNvml``: a GpuLibrary with the values real DGX machines report, plus fault hooks.

The numbers follow real captures, not the upstream mocks: memory totals that are not round
(81559 MiB on H100), GPU-instance profile *ids* 19/20/15/14/9/5/0 (not enum indexes),
placements counted in 8 memory slices, driver-picked GI ids, MIG UUIDs in UUIDv5 form and an
NVML bus id in NVML's own spelling (``00000000:1B:00.0``).

NVLink follows NVML's answers per link: NOT_SUPPORTED on a GPU without NVLink,
INVALID_ARGUMENT for a link index the GPU lacks, each link's state, remote PCI address and
remote device type (``FakeNvLink``); ``FakeGpu.fabric`` is what nvmlDeviceGetGpuFabricInfoV
reports (None: NOT_SUPPORTED, as before Hopper).

Hooks for tests and the health feature: ``inject_xid``, ``inject_ecc``, ``set_lost``,
``recover`` (one GPU answers again), ``fail`` (make one call raise for one GPU, e.g. an NVML
error mid-scan), ``clear_faults``. They may be called from any thread (a running agent takes
them from ``dra-agent simulate fault``, agent/simfaults/).

MIG instances are created and destroyed under the real rules (``mig -lgipp`` placements of
the GPU's model, no two GIs on one memory slice, one 1g+me per GPU, no GI destroyed while it
holds compute instances or a process runs on it) with the NVML return codes the driver gives:
NOT_SUPPORTED without MIG mode, INVALID_ARGUMENT for a placement the profile does not have,
INSUFFICIENT_RESOURCES for a taken one, IN_USE for a busy instance. ``FakeGpu.busy`` holds the
GI ids another process is using. With ``state_path`` the instances outlive the process, as
on a real GPU: every change is written there and a new FakeNvml on the same path starts from
it (crash tests kill the agent and look at the "hardware" afterwards).

size-exempt: exempt from the ~400-line module rule because it mirrors NVML's API surface.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import threading
import uuid as uuidlib
from dataclasses import dataclass, field
from pathlib import Path

from discovery.gpulib import (
    EVENT_DOUBLE_BIT_ECC,
    EVENT_MIG_CONFIG_CHANGE,
    EVENT_SINGLE_BIT_ECC,
    EVENT_XID_CRITICAL,
    GI_PROFILE_INDEXES,
    NVLINK_MAX_LINKS,
    WHOLE_GPU,
    DeviceHandle,
    EventSet,
    FabricInfo,
    GpuEvent,
    GpuInstanceInfo,
    GpuInstanceProfile,
    GpuIsLostError,
    GpuLibraryError,
    InsufficientResourcesError,
    InUseError,
    InvalidArgumentError,
    MigAttributes,
    NotFoundError,
    NotSupportedError,
    Placement,
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


#: GI profile id -> (possible placement starts, size in memory slices, instances on an empty
#: GPU): ``nvidia-smi mig -lgipp``, identical on A100, H100 and H200.
PLACEMENTS: dict[int, tuple[tuple[int, ...], int, int]] = {
    19: ((0, 1, 2, 3, 4, 5, 6), 1, 7),
    20: ((0, 1, 2, 3, 4, 5, 6), 1, 1),
    15: ((0, 2, 4, 6), 2, 4),
    14: ((0, 2, 4), 2, 3),
    9: ((0, 4), 4, 2),
    5: ((0,), 4, 1),
    0: ((0,), 8, 1),
}
#: NVML_GPU_INSTANCE_PROFILE_* index -> profile id.
PROFILE_ID_BY_INDEX = dict(zip(GI_PROFILE_INDEXES, (19, 20, 15, 14, 9, 5, 0), strict=True))
#: NVML_COMPUTE_INSTANCE_PROFILE_* index -> compute slices of the CI.
CI_SLICES_BY_INDEX = {0: 1, 1: 2, 2: 3, 3: 4, 4: 7, 5: 8, 6: 6}
#: ``FakeMig.ci`` of a GPU instance that holds no compute instance (no MIG device yet).
NO_CI = -1
#: Compute slices a MIG-mode GPU of these models has.
COMPUTE_SLICES = 7


@dataclass
class FakeMig:
    """One MIG device: a compute instance ``ci`` inside GPU instance ``gi``."""

    gi: int
    ci: int
    profile: GiProfile
    start: int
    ci_slices: int = 0  # 0: the CI spans the whole GI
    uuid: str = ""


@dataclass(frozen=True, slots=True)
class FakeNvLink:
    """One NVLink of a GPU: what sits at its far end (``remote``: a PCI address in sysfs form,
    "" for an NVSwitch outside the node, whose PCI info NVML does not give) and whether the
    link is trained. ``kind`` is an NVLINK_REMOTE_* value."""

    remote: str
    kind: int
    active: bool = True


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
    #: GI ids a process (not ours) is using: destroying them, or their CIs, is IN_USE.
    busy: set[int] = field(default_factory=set)
    #: The GI profile table; None: chosen by model name (H100, A100 80GB).
    mig_profiles: dict[int, GiProfile] | None = None
    created: int = 0  # instances created so far, for fresh MIG UUIDs
    #: NVLinks the GPU has (0: none, every NVLink call is NOT_SUPPORTED) and, by index, those
    #: wired to something; a link of the count not in ``nvlinks`` is inactive.
    nvlink_count: int = 0
    nvlinks: dict[int, FakeNvLink] = field(default_factory=dict)
    fabric: FabricInfo | None = None

    def __post_init__(self) -> None:
        if not self.uuid:
            h = hashlib.sha256(f"{self.bdf}/{self.name}".encode()).hexdigest()
            self.uuid = f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"
        for mig in self.migs:
            if not mig.uuid:
                mig.uuid = "MIG-" + str(uuidlib.uuid5(_NS, f"{self.uuid}/{mig.gi}/{mig.ci}"))

    def profile_table(self) -> dict[int, GiProfile]:
        if self.mig_profiles is not None:
            return self.mig_profiles
        if "H100" in self.name:
            return H100_80GB_PROFILES
        if "A100" in self.name and "80GB" in self.name:
            return A100_80GB_PROFILES
        return {}

    @property
    def nvml_bus_id(self) -> str:
        return nvml_bus_id(self.bdf)


def nvml_bus_id(bdf: str) -> str:
    """``0000:1b:00.0`` (sysfs) -> ``00000000:1B:00.0``, NVML's spelling."""
    domain, bus, rest = bdf.split(":")
    return f"{int(domain, 16):08X}:{bus.upper()}:{rest.upper()}"


def _driver(device: Path) -> str | None:
    try:
        return os.path.basename(os.readlink(device / "driver"))
    except OSError:
        return None


@dataclass(frozen=True, slots=True)
class _Handle:
    gpu: FakeGpu
    mig: FakeMig | None = None
    #: The GPU's NVML index when it differs from ``gpu.index`` (GPUs before it left NVML).
    position: int | None = None


@dataclass
class _EventSet:
    events: queue.Queue[GpuEvent] = field(default_factory=queue.Queue)
    masks: dict[str, int] = field(default_factory=dict)  # GPU uuid -> registered mask


class FakeNvml:
    """In-memory NVML. Thread-safe enough for one scanner plus one health watcher."""

    def __init__(self, gpus: list[FakeGpu], driver: str = "550.54.15", cuda: int = 12040,
                 init_error: GpuLibraryError | None = None,
                 state_path: Path | None = None, *, sysfs_root: Path | None = None) -> None:
        self.gpus = gpus
        #: The simulated sysfs tree: NVML lists only the GPUs bound to ``nvidia`` there (one
        #: bound to vfio-pci for a VM is gone from it, as from the real NVML). None: all.
        self.sysfs_root = sysfs_root
        self.driver = driver
        self.cuda = cuda
        self.init_error = init_error
        self._refs = 0
        self._lock = threading.Lock()
        self._faults: dict[tuple[str, str | None], GpuLibraryError] = {}
        self._sets: list[_EventSet] = []
        self.calls = 0  # number of library calls, for tests that check caching
        self.state_path = state_path
        if state_path is not None and state_path.exists():
            self._load(state_path)

    # -- persistence (the GPU's MIG layout outlives the process) -------------------------------
    def _load(self, path: Path) -> None:
        saved = json.loads(path.read_text())
        for gpu in self.gpus:
            entry = saved.get(gpu.uuid)
            if entry is None:
                continue
            table = gpu.profile_table()
            gpu.created = int(entry["created"])
            gpu.migs = [FakeMig(m["gi"], m["ci"], table[m["profile"]], m["start"],
                                m["ciSlices"], m["uuid"]) for m in entry["migs"]]

    def _save(self) -> None:
        if self.state_path is None:
            return
        state = {g.uuid: {"created": g.created, "migs": [
            {"gi": m.gi, "ci": m.ci, "profile": m.profile.id, "start": m.start,
             "ciSlices": m.ci_slices, "uuid": m.uuid} for m in g.migs]} for g in self.gpus}
        tmp = self.state_path.with_name(self.state_path.name + ".tmp")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self.state_path)

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
        for es in self._event_sets():
            if uuid in es.masks:
                es.events.put(GpuEvent(uuid, EVENT_XID_CRITICAL, 79))

    def recover(self, uuid: str) -> None:
        """The GPU answers again (after a reset): no longer lost, and the call failures
        ``fail`` set for it alone are gone; a MIG UUID recovers its parent GPU."""
        gpu = self._gpu(uuid)
        gpu.lost = False
        for key in [k for k in self._faults if k[1] == gpu.uuid]:
            self._faults.pop(key, None)

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
        for es in self._event_sets():
            if es.masks.get(gpu.uuid, 0) & kind:
                es.events.put(GpuEvent(gpu.uuid, kind, data, gi, ci))

    def _event_sets(self) -> list[_EventSet]:
        """The event sets now: a copy, so a hook on another thread never walks the list
        while the watcher creates or frees one."""
        with self._lock:
            return list(self._sets)

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

    def _listed(self) -> list[FakeGpu]:
        """The GPUs NVML enumerates, in index order: those on the nvidia driver."""
        if self.sysfs_root is None:
            return self.gpus
        devices = self.sysfs_root / "bus" / "pci" / "devices"
        return sorted((g for g in self.gpus if _driver(devices / g.bdf) == "nvidia"),
                      key=lambda g: g.index)

    def device_count(self) -> int:
        self._check("device_count")
        return len(self._listed())

    def device_handle_by_index(self, index: int) -> DeviceHandle:
        self._check("device_handle_by_index")
        listed = self._listed()
        if self.sysfs_root is not None:  # NVML's indexes: positions among the GPUs it has
            if 0 <= index < len(listed):
                handle = _Handle(listed[index], position=index)
                self._check("device_handle_by_index", handle)
                return handle
            listed = []
        for gpu in listed:
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
        h = self._h("device_index", handle)
        return h.position if h.position is not None else h.gpu.index

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
        return sorted((m for m in gpu.migs if m.ci != NO_CI), key=lambda m: (m.start, m.ci))

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

    # -- MIG instance management ---------------------------------------------------------
    def _mig_gpu(self, call: str, handle: DeviceHandle) -> FakeGpu:
        gpu = self._h(call, handle).gpu
        if not gpu.profile_table():
            raise NotSupportedError("MIG not supported", call=call)
        if not gpu.mig_mode[0]:
            raise NotSupportedError("MIG mode is not enabled", call=call)
        return gpu

    def gpu_instance_profile_info(
        self, handle: DeviceHandle, profile_index: int
    ) -> GpuInstanceProfile:
        call = "gpu_instance_profile_info"
        gpu = self._h(call, handle).gpu
        profile = gpu.profile_table().get(PROFILE_ID_BY_INDEX.get(profile_index, -1))
        if profile is None:
            if not 0 <= profile_index < 0x12:
                raise InvalidArgumentError(f"profile index {profile_index}", call=call)
            raise NotSupportedError(f"profile index {profile_index} not supported", call=call)
        p = profile
        return GpuInstanceProfile(
            id=p.id, slices=p.slices, instance_count=PLACEMENTS[p.id][2],
            memory_mib=p.memory_mib, multiprocessors=p.multiprocessors,
            copy_engines=p.copy_engines, decoders=p.decoders, encoders=p.encoders,
            jpeg_engines=p.jpeg_engines, ofa_engines=p.ofa_engines,
        )

    def _profile(self, call: str, gpu: FakeGpu, profile_id: int) -> GiProfile:
        profile = gpu.profile_table().get(profile_id)
        if profile is None:
            raise InvalidArgumentError(f"no GPU instance profile id {profile_id}", call=call)
        return profile

    def gpu_instance_possible_placements(
        self, handle: DeviceHandle, profile_id: int
    ) -> list[Placement]:
        call = "gpu_instance_possible_placements"
        gpu = self._mig_gpu(call, handle)
        self._profile(call, gpu, profile_id)
        starts, size, _ = PLACEMENTS[profile_id]
        return [Placement(s, size) for s in starts]

    def _gis(self, gpu: FakeGpu) -> dict[int, FakeMig]:
        """GI id -> one of its entries (all entries of a GI share profile and start)."""
        out: dict[int, FakeMig] = {}
        for m in gpu.migs:
            out.setdefault(m.gi, m)
        return out

    def gpu_instances(self, handle: DeviceHandle, profile_id: int) -> list[GpuInstanceInfo]:
        call = "gpu_instances"
        gpu = self._mig_gpu(call, handle)
        self._profile(call, gpu, profile_id)
        return [GpuInstanceInfo(m.gi, m.profile.id, m.start, m.profile.placement_size)
                for m in sorted(self._gis(gpu).values(), key=lambda m: m.gi)
                if m.profile.id == profile_id]

    def create_gpu_instance_with_placement(
        self, handle: DeviceHandle, profile_id: int, placement: Placement
    ) -> GpuInstanceInfo:
        call = "create_gpu_instance_with_placement"
        gpu = self._mig_gpu(call, handle)
        profile = self._profile(call, gpu, profile_id)
        starts, size, count = PLACEMENTS[profile_id]
        if placement.start not in starts or placement.size != size:
            raise InvalidArgumentError(
                f"placement {placement.start}:{placement.size} is not one of profile "
                f"{profile_id}'s", call=call)
        with self._lock:
            gis = self._gis(gpu)
            wanted = set(range(placement.start, placement.start + size))
            for gi in gis.values():
                taken = set(range(gi.start, gi.start + gi.profile.placement_size))
                if wanted & taken:
                    raise InsufficientResourcesError(
                        f"memory slices {sorted(wanted & taken)} held by GI {gi.gi}", call=call)
            same = sum(1 for gi in gis.values() if gi.profile.id == profile_id)
            used = sum(gi.profile.slices for gi in gis.values())
            if same >= count or used + profile.slices > COMPUTE_SLICES:
                raise InsufficientResourcesError(
                    f"no room for another profile {profile_id} instance", call=call)
            gi_id = next(i for i in range(1, 15) if i not in gis)
            gpu.migs.append(FakeMig(gi_id, NO_CI, profile, placement.start))
            self._save()
        self._deliver(gpu, EVENT_MIG_CONFIG_CHANGE, 0, None)
        return GpuInstanceInfo(gi_id, profile_id, placement.start, size)

    def _gi(self, call: str, gpu: FakeGpu, gpu_instance_id: int) -> list[FakeMig]:
        entries = [m for m in gpu.migs if m.gi == gpu_instance_id]
        if not entries:
            raise NotFoundError(f"no GPU instance {gpu_instance_id}", call=call)
        return entries

    def create_compute_instance(
        self, handle: DeviceHandle, gpu_instance_id: int, ci_profile_index: int
    ) -> int:
        call = "create_compute_instance"
        gpu = self._mig_gpu(call, handle)
        with self._lock:
            entries = self._gi(call, gpu, gpu_instance_id)
            gi = entries[0]
            slices = CI_SLICES_BY_INDEX.get(ci_profile_index)
            if slices is None or slices > gi.profile.slices:
                raise InvalidArgumentError(
                    f"compute instance profile {ci_profile_index} not valid in a "
                    f"{gi.profile.slices}g GPU instance", call=call)
            real = [m for m in entries if m.ci != NO_CI]
            used = sum(m.ci_slices or gi.profile.slices for m in real)
            if used + slices > gi.profile.slices:
                raise InsufficientResourcesError(
                    f"GPU instance {gpu_instance_id} has no room for a {slices}c instance",
                    call=call)
            ci = next(i for i in range(8) if i not in {m.ci for m in real})
            gpu.created += 1
            uuid = "MIG-" + str(uuidlib.uuid5(
                _NS, f"{gpu.uuid}/{gpu_instance_id}/{ci}/{gpu.created}"))
            mig = FakeMig(gpu_instance_id, ci, gi.profile, gi.start,
                          0 if slices == gi.profile.slices else slices, uuid)
            gpu.migs = [m for m in gpu.migs
                        if not (m.gi == gpu_instance_id and m.ci == NO_CI)] + [mig]
            self._save()
        self._deliver(gpu, EVENT_MIG_CONFIG_CHANGE, 0, None)
        return ci

    def compute_instances(self, handle: DeviceHandle, gpu_instance_id: int) -> list[int]:
        call = "compute_instances"
        gpu = self._mig_gpu(call, handle)
        return sorted(m.ci for m in self._gi(call, gpu, gpu_instance_id) if m.ci != NO_CI)

    def destroy_compute_instance(
        self, handle: DeviceHandle, gpu_instance_id: int, compute_instance_id: int
    ) -> None:
        call = "destroy_compute_instance"
        gpu = self._mig_gpu(call, handle)
        with self._lock:
            entries = self._gi(call, gpu, gpu_instance_id)
            target = [m for m in entries if m.ci == compute_instance_id]
            if compute_instance_id == NO_CI or not target:
                raise NotFoundError(f"no compute instance {compute_instance_id} in GPU "
                                    f"instance {gpu_instance_id}", call=call)
            if gpu_instance_id in gpu.busy:
                raise InUseError(f"GPU instance {gpu_instance_id} runs processes", call=call)
            gpu.migs.remove(target[0])
            if len(entries) == 1:  # the GI stays, empty
                gpu.migs.append(FakeMig(gpu_instance_id, NO_CI, target[0].profile,
                                        target[0].start))
            self._save()
        self._deliver(gpu, EVENT_MIG_CONFIG_CHANGE, 0, None)

    def destroy_gpu_instance(self, handle: DeviceHandle, gpu_instance_id: int) -> None:
        call = "destroy_gpu_instance"
        gpu = self._mig_gpu(call, handle)
        with self._lock:
            entries = self._gi(call, gpu, gpu_instance_id)
            if gpu_instance_id in gpu.busy or any(m.ci != NO_CI for m in entries):
                raise InUseError(f"GPU instance {gpu_instance_id} holds compute instances "
                                 "or runs processes", call=call)
            gpu.migs.remove(entries[0])
            self._save()
        self._deliver(gpu, EVENT_MIG_CONFIG_CHANGE, 0, None)

    # -- NVLink -----------------------------------------------------------------------------
    def _link(self, call: str, handle: DeviceHandle, link: int) -> FakeNvLink | None:
        """The link asked for; None when it exists but is not trained."""
        gpu = self._h(call, handle).gpu
        if not 0 <= link < NVLINK_MAX_LINKS:
            raise InvalidArgumentError(f"link {link}", call=call)
        if gpu.nvlink_count == 0:
            raise NotSupportedError("NVLink not supported", call=call)
        if link >= gpu.nvlink_count:
            raise InvalidArgumentError(f"link {link} of {gpu.nvlink_count}", call=call)
        wired = gpu.nvlinks.get(link)
        return wired if wired is not None and wired.active else None

    def device_nvlink_state(self, handle: DeviceHandle, link: int) -> bool:
        return self._link("device_nvlink_state", handle, link) is not None

    def device_nvlink_remote_pci_bus_id(self, handle: DeviceHandle, link: int) -> str:
        call = "device_nvlink_remote_pci_bus_id"
        wired = self._link(call, handle, link)
        if wired is None or not wired.remote:
            raise NotSupportedError(f"no remote PCI info on link {link}", call=call)
        return nvml_bus_id(wired.remote)

    def device_nvlink_remote_device_type(self, handle: DeviceHandle, link: int) -> int:
        call = "device_nvlink_remote_device_type"
        wired = self._link(call, handle, link)
        if wired is None:
            raise NotSupportedError(f"link {link} is not active", call=call)
        return wired.kind

    def device_gpu_fabric_info(self, handle: DeviceHandle) -> FabricInfo:
        call = "device_gpu_fabric_info"
        fabric = self._h(call, handle).gpu.fabric
        if fabric is None:
            raise NotSupportedError("no GPU fabric", call=call)
        return fabric

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
