"""Dynamic MIG (``--mig dynamic``): a MIG-mode GPU as shared counters plus every partition
it could be cut into (KEP-4815 partitionable devices).

Per GPU one counter set, ``gpu-<minor>-mig``:

* ``memory-slice-0`` ... ``memory-slice-7``: 1 each; a partition consumes the slices of its
  placement, so two partitions on one slice are never allocated together;
* ``compute-slices`` (7), ``memory``, and the engines (``copy-engines``, ``decoders``,
  ``encoders``, ``jpeg-engines``, ``ofa-engines``): the totals of the whole-GPU (7g) profile,
  which no valid layout exceeds; they make one 1g+me per GPU and explain's reasons exact.

One device per valid (profile, placement) of ``nvmlDeviceGetGpuInstancePossiblePlacements``,
named as a MIG device of that profile and placement would be (``gpu-0-mig-3g40gb-4``), so a
claim's device keeps its name once the instance exists. The 7g partition is the whole GPU.

Instances on the GPU that dra-agent did not create (``owned`` says which it did, by parent
UUID, profile id and placement start) are foreign: they stay published as the MIG devices
they are, their memory slices and their share of the other counters leave the set, and no
partition overlapping them is published. Instances dra-agent created change nothing here:
the scheduler accounts for them through the claims they were allocated to, so a prepare
never changes the published slices.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from discovery.attrs import quantity
from discovery.gpulib import (
    GI_PROFILE_INDEXES,
    DeviceHandle,
    GpuInstanceInfo,
    GpuInstanceProfile,
    GpuLibrary,
    GpuLibraryError,
    MigAttributes,
    NotSupportedError,
    Placement,
    mig_profile_name,
)
from discovery.model import (
    AttributeValue,
    CounterConsumption,
    CounterSet,
    Device,
    DeviceType,
    HostInfo,
)
from discovery.names import mig_name

MEMORY_SLICES = 8
COMPUTE_SLICES = 7
#: GI profile id of the "+me" (media extensions) 1g profile.
PROFILE_1G_ME = 20
#: HostInfo.extra keys of a partition device (strings, as HostInfo.extra holds).
EXTRA_PROFILE_ID = "migProfileId"
EXTRA_START = "migPlacementStart"
EXTRA_SIZE = "migPlacementSize"
EXTRA_SLICES = "migSlices"

#: (parent GPU UUID, GI profile id, placement start) of an instance dra-agent created.
OwnedKey = tuple[str, int, int]


def counter_set_name(gpu_name: str) -> str:
    return f"{gpu_name}-mig"


def slice_counter(index: int) -> str:
    return f"memory-slice-{index}"


@dataclass(frozen=True, slots=True)
class Partition:
    """One (profile, placement) a GPU offers; what prepare needs to create it."""

    parent_uuid: str
    profile_id: int
    start: int
    size: int
    slices: int  # compute slices


def partition_of(device: Device) -> Partition | None:
    """The partition a published device stands for; None for any other device."""
    extra = device.host.extra
    if device.type != DeviceType.MIG or EXTRA_PROFILE_ID not in extra:
        return None
    return Partition(parent_uuid=device.host.parent_uuid or "",
                     profile_id=int(extra[EXTRA_PROFILE_ID]), start=int(extra[EXTRA_START]),
                     size=int(extra[EXTRA_SIZE]), slices=int(extra[EXTRA_SLICES]))


def _engines(p: GpuInstanceProfile) -> dict[str, int]:
    return {"compute-slices": p.slices, "copy-engines": p.copy_engines, "decoders": p.decoders,
            "encoders": p.encoders, "jpeg-engines": p.jpeg_engines, "ofa-engines": p.ofa_engines}


@dataclass
class GpuPartitions:
    """What one MIG-mode GPU contributes: its counter set and partition devices."""

    counter_set: CounterSet | None = None
    devices: list[Device] = field(default_factory=list)
    #: GI ids of instances dra-agent created (not published as static MIG devices).
    owned_gis: set[int] = field(default_factory=set)
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class GpuFacts:
    """The parent GPU as discovery already read it."""

    name: str  # gpu-<minor>
    uuid: str
    minor: int
    memory: int  # bytes
    attrs: Mapping[str, AttributeValue]
    host: HostInfo  # the parent's host facts (PCI address, dev nodes, driver)


def plan_gpu(lib: GpuLibrary, handle: DeviceHandle, gpu: GpuFacts,
             owned: Collection[OwnedKey]) -> GpuPartitions:
    """The counter set and partitions of one MIG-mode GPU, from NVML's tables."""
    out = GpuPartitions()
    profiles: list[GpuInstanceProfile] = []
    for index in GI_PROFILE_INDEXES:
        try:
            profiles.append(lib.gpu_instance_profile_info(handle, index))
        except NotSupportedError:
            continue
        except GpuLibraryError as err:
            out.warnings.append(f"{gpu.name}: MIG profile {index} unreadable: {err}")
    whole = max(profiles, key=lambda p: (p.slices, p.memory_mib), default=None)
    if whole is None:
        out.warnings.append(f"{gpu.name}: no MIG profiles readable; not partitioned")
        return out
    existing: list[tuple[GpuInstanceInfo, GpuInstanceProfile]] = []
    placements: dict[int, list[Placement]] = {}
    try:
        for p in profiles:
            placements[p.id] = lib.gpu_instance_possible_placements(handle, p.id)
            existing += [(gi, p) for gi in lib.gpu_instances(handle, p.id)]
    except GpuLibraryError as err:
        out.warnings.append(f"{gpu.name}: MIG placements unreadable, not partitioned: {err}")
        return out
    totals = {"memory": whole.memory_mib, **_engines(whole)}
    taken: set[int] = set()
    for gi, p in existing:
        if (gpu.uuid, gi.profile_id, gi.placement_start) in owned:
            out.owned_gis.add(gi.id)
            continue
        taken |= set(range(gi.placement_start, gi.placement_start + gi.placement_size))
        totals["memory"] -= p.memory_mib
        for key, value in _engines(p).items():
            totals[key] -= value
    counters = {slice_counter(i): "1" for i in range(MEMORY_SLICES) if i not in taken}
    counters.update({k: (quantity(v * 1024 * 1024) if k == "memory" else str(v))
                     for k, v in totals.items() if v > 0})
    set_name = counter_set_name(gpu.name)
    for p in profiles:
        needs = {"memory": p.memory_mib, **_engines(p)}
        free = [w for w in placements.get(p.id, ())
                if not set(range(w.start, w.start + w.size)) & taken]
        if not free or any(totals[k] < v for k, v in needs.items() if v):
            continue  # overlaps a foreign instance, or what is left cannot hold it
        out.devices += _devices(gpu, p, free, set_name)
    if out.devices:
        out.counter_set = CounterSet(set_name, counters)
    return out


def _devices(gpu: GpuFacts, p: GpuInstanceProfile, where: list[Placement],
             set_name: str) -> list[Device]:
    """The partitions of one profile at each placement (what they share is built once)."""
    attrs = MigAttributes(p.multiprocessors, p.copy_engines, p.decoders, p.encoders,
                          p.jpeg_engines, p.ofa_engines, p.slices, p.slices, p.memory_mib)
    profile = mig_profile_name(attrs, gpu.memory, me=p.id == PROFILE_1G_ME)
    memory = quantity(p.memory_mib * 1024 * 1024)
    capacity = {
        "memory": memory,
        "multiprocessors": str(p.multiprocessors),
        "copyEngines": str(p.copy_engines),
        "decoders": str(p.decoders),
        "encoders": str(p.encoders),
        "jpegEngines": str(p.jpeg_engines),
        "ofaEngines": str(p.ofa_engines),
    }
    shared = dict(gpu.attrs)
    shared.update(parentUUID=gpu.uuid, parentMinor=gpu.minor, profile=profile, partition=True)
    engines = {k: str(v) for k, v in _engines(p).items() if v > 0}
    out = []
    for w in where:
        attributes = {**shared, "placementStart": w.start, "placementSize": w.size}
        consumed = {slice_counter(i): "1" for i in range(w.start, w.start + w.size)}
        consumed["memory"] = memory
        consumed.update(engines)
        host = HostInfo(
            pci_address=gpu.host.pci_address, vendor="nvidia", parent_uuid=gpu.uuid,
            minor=gpu.minor, dev_nodes=gpu.host.dev_nodes, driver=gpu.host.driver,
            extra={EXTRA_PROFILE_ID: str(p.id), EXTRA_START: str(w.start),
                   EXTRA_SIZE: str(w.size), EXTRA_SLICES: str(p.slices)},
        )
        out.append(Device(mig_name(gpu.minor, profile, w.start), DeviceType.MIG, attributes,
                          capacity, host, consumes=(CounterConsumption(set_name, consumed),)))
    return out
