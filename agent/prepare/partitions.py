"""Dynamic MIG partitions at prepare: create the GPU instance at the allocated placement and
its compute instance, hand the container the new MIG device, destroy both at unprepare.

Crash safety rests on the checkpoint, never on NVML: a partition's *intent* (parent GPU,
profile, placement) is in the claim's record, durably, before the GPU instance is created,
and its GI/CI ids and MIG UUID after. So every instance dra-agent makes is named by a record
at every moment, and:

* a failed prepare destroys what it made before answering (nothing half-created);
* start-up (``reconcile``) destroys the instances of records that never completed, and
  re-creates those of completed claims that vanished (a reboot clears MIG instances);
* instances no record names are someone else's: never touched, their placements unpublished
  (``discovery.partitions``).

The record keeps the partition under ``PreparedDevice.extra["migPartition"]``; older agents
carry it through unchanged (unknown fields are preserved).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from agent.checkpoint.model import ClaimRecord, PreparedDevice
from agent.claim.model import ClaimError, ClaimRef
from agent.common.failpoints import Failpoints, Point, hit
from agent.prepare.devices import SpecDevice
from discovery.gpulib import (
    CI_PROFILE_FULL,
    DeviceHandle,
    GpuLibrary,
    GpuLibraryError,
    InvalidArgumentError,
    NotFoundError,
    Placement,
)
from discovery.model import Device
from discovery.partitions import OwnedKey, Partition, partition_of

if TYPE_CHECKING:
    from agent.prepare.state import DevicePreparer

log = logging.getLogger(__name__)

KEY = "migPartition"


class PartitionError(ClaimError):
    """A MIG partition could not be created or destroyed; names the device and NVML's cause."""

    reason = "mig_partition"

    def __init__(self, claim: str, message: str, leftover: bool = False) -> None:
        super().__init__(claim, message)
        #: A half-made instance could not be destroyed: its record must stay.
        self.leftover = leftover


@dataclass(frozen=True, slots=True)
class Instance:
    """A partition as the checkpoint records it: the intent, then what NVML made of it."""

    parent_uuid: str
    profile_id: int
    start: int
    size: int
    slices: int
    gi: int | None = None
    ci: int | None = None
    uuid: str | None = None

    @classmethod
    def of(cls, part: Partition) -> Instance:
        return cls(part.parent_uuid, part.profile_id, part.start, part.size, part.slices)

    @property
    def created(self) -> bool:
        return self.gi is not None and self.ci is not None and self.uuid is not None

    @property
    def key(self) -> OwnedKey:
        return (self.parent_uuid, self.profile_id, self.start)

    def describe(self) -> str:
        return (f"GPU instance profile {self.profile_id} at placement {self.start}:{self.size} "
                f"on {self.parent_uuid}")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"parentUUID": self.parent_uuid, "profileID": self.profile_id,
                               "start": self.start, "size": self.size, "slices": self.slices}
        for key, value in (("gi", self.gi), ("ci", self.ci), ("uuid", self.uuid)):
            if value is not None:
                out[key] = value
        return out

    @classmethod
    def from_json(cls, data: Any) -> Instance | None:
        """None for anything that is not a partition record (never raises)."""
        if not isinstance(data, Mapping):
            return None
        try:
            gi, ci, uuid = data.get("gi"), data.get("ci"), data.get("uuid")
            return cls(str(data["parentUUID"]), int(data["profileID"]), int(data["start"]),
                       int(data["size"]), int(data["slices"]),
                       None if gi is None else int(gi), None if ci is None else int(ci),
                       None if uuid is None else str(uuid))
        except (KeyError, TypeError, ValueError):
            return None


def instance_of(held: PreparedDevice) -> Instance | None:
    return Instance.from_json(held.extra.get(KEY)) if KEY in held.extra else None


def with_instance(held: PreparedDevice, inst: Instance) -> PreparedDevice:
    return replace(held, uuid=inst.uuid or held.uuid, extra={**held.extra, KEY: inst.to_json()})


def owned_instances(claims: Mapping[str, ClaimRecord]) -> frozenset[OwnedKey]:
    """The instances dra-agent made or is making, by (parent UUID, profile, placement)."""
    return frozenset(inst.key for r in claims.values() for d in r.devices
                     if (inst := instance_of(d)) is not None)


def mig_device(device: Device, inst: Instance) -> Device:
    """The published partition as the MIG device it now is (UUID, GI and CI ids)."""
    host = replace(device.host, uuid=inst.uuid, mig_gi=inst.gi, mig_ci=inst.ci)
    attrs = {**device.attributes, "uuid": inst.uuid or ""}
    return replace(device, attributes=attrs, host=host)


def overlay(record: ClaimRecord, pool: str, inventory: dict[str, Device]) -> dict[str, Device]:
    """``inventory`` with the record's created partitions as their MIG devices."""
    out = inventory
    for held in record.devices:
        inst = instance_of(held)
        found = inventory.get(held.device) if held.pool == pool else None
        if inst is not None and inst.created and found is not None:
            out = out if out is not inventory else dict(inventory)
            out[held.device] = mig_device(found, inst)
    return out


class MigPartitions:
    """Creates and destroys MIG instances through the GpuLibrary seam, one at a time."""

    def __init__(self, lib: GpuLibrary, failpoints: Failpoints | None = None) -> None:
        self.lib = lib
        self.failpoints = failpoints
        self._lock = threading.Lock()  # NVML's MIG calls are serialised per node anyway

    @contextlib.contextmanager
    def _session(self) -> Iterator[GpuLibrary]:
        with self._lock:
            self.lib.init()
            try:
                yield self.lib
            finally:
                try:
                    self.lib.shutdown()
                except GpuLibraryError as err:
                    log.info("NVML shutdown failed", extra={"error": str(err)})

    def _handle(self, lib: GpuLibrary, uuid: str) -> DeviceHandle:
        for index in range(lib.device_count()):
            handle = lib.device_handle_by_index(index)
            if lib.device_uuid(handle) == uuid:
                return handle
        raise NotFoundError(f"no GPU {uuid}", call="device_handle_by_index")

    # -- create ---------------------------------------------------------------------------

    def create(self, claim: str, device: str, inst: Instance) -> Instance:
        """Make the GI at the placement and its full CI; on any failure destroy what was
        made and raise PartitionError naming the device and NVML's cause."""
        what = f"device {device}: cannot create {inst.describe()}"
        ci_profile = CI_PROFILE_FULL.get(inst.slices)
        if ci_profile is None:
            raise PartitionError(claim, f"{what}: no compute instance profile for "
                                        f"{inst.slices} slices")
        with self._session() as lib:
            try:
                handle = self._handle(lib, inst.parent_uuid)
                gi = lib.create_gpu_instance_with_placement(
                    handle, inst.profile_id, Placement(inst.start, inst.size))
            except GpuLibraryError as err:
                raise PartitionError(claim, f"{what}: {_cause(err)}") from err
            try:
                hit(self.failpoints, Point.MIG_AFTER_GI_CREATED, claim)
                ci = lib.create_compute_instance(handle, gi.id, ci_profile)
                uuid = self._mig_uuid(lib, handle, gi.id, ci)
            except BaseException as err:
                left = not self._destroy_quietly(lib, handle, gi.id)
                if isinstance(err, GpuLibraryError):
                    raise PartitionError(claim, f"{what}: {_cause(err)}", left) from err
                raise
        log.info("MIG partition created", extra={
            "claim": claim, "device": device, "gpu_instance": gi.id, "compute_instance": ci,
            "uuid": uuid})
        return replace(inst, gi=gi.id, ci=ci, uuid=uuid)

    def _mig_uuid(self, lib: GpuLibrary, handle: DeviceHandle, gi: int, ci: int) -> str:
        for index in range(lib.device_max_mig_device_count(handle)):
            try:
                mig = lib.device_mig_device_handle_by_index(handle, index)
            except (NotFoundError, InvalidArgumentError):
                continue
            if (lib.device_gpu_instance_id(mig), lib.device_compute_instance_id(mig)) == (gi, ci):
                return lib.device_uuid(mig)
        raise NotFoundError(f"no MIG device for GI {gi} CI {ci}", call="device_uuid")

    def _destroy_quietly(self, lib: GpuLibrary, handle: DeviceHandle, gi: int) -> bool:
        try:
            self._destroy_gi(lib, handle, gi)
        except GpuLibraryError as err:
            log.error("cannot destroy a half-made MIG instance; start-up retries",
                      extra={"gpu_instance": gi, "error": str(err)})
            return False
        return True

    # -- destroy --------------------------------------------------------------------------

    def _destroy_gi(self, lib: GpuLibrary, handle: DeviceHandle, gi: int) -> None:
        for ci in lib.compute_instances(handle, gi):
            lib.destroy_compute_instance(handle, gi, ci)
        lib.destroy_gpu_instance(handle, gi)

    def _find_gi(self, lib: GpuLibrary, handle: DeviceHandle, inst: Instance) -> int | None:
        """The GI id of the recorded partition, or None when it does not exist (any more)."""
        for gi in lib.gpu_instances(handle, inst.profile_id):
            if gi.placement_start == inst.start and (inst.gi is None or gi.id == inst.gi):
                return gi.id
        return None

    def destroy(self, inst: Instance) -> bool:
        """Destroy the partition's CIs and GI; False when there was nothing (any more).
        NVML errors propagate (a process still on it is IN_USE)."""
        with self._session() as lib:
            try:
                handle = self._handle(lib, inst.parent_uuid)
            except NotFoundError:
                return False  # the GPU is gone, and its instances with it
            gi = self._find_gi(lib, handle, inst)
            if gi is None:
                return False
            self._destroy_gi(lib, handle, gi)
        return True

    def exists(self, inst: Instance) -> bool:
        with self._session() as lib:
            try:
                return self._find_gi(lib, self._handle(lib, inst.parent_uuid), inst) is not None
            except NotFoundError:
                return False

    def release(self, claim: str, record: ClaimRecord | None) -> None:
        """Destroy every partition ``record`` names; PartitionError on the first failure."""
        for held in record.devices if record is not None else ():
            inst = instance_of(held)
            if inst is None:
                continue
            try:
                gone = self.destroy(inst)
            except GpuLibraryError as err:
                raise PartitionError(
                    claim, f"device {held.device}: cannot destroy {inst.describe()}: "
                           f"{_cause(err)}") from err
            log.info("MIG partition destroyed" if gone else "MIG partition already gone",
                     extra={"claim": claim, "device": held.device, "gpu_instance": inst.gi})

    # -- prepare --------------------------------------------------------------------------

    def prepare(
        self, ref: ClaimRef, record: ClaimRecord, devices: Sequence[SpecDevice],
        store: Callable[[ClaimRecord, bool], None],
    ) -> tuple[ClaimRecord, list[SpecDevice]]:
        """Create the claim's partitions: the intent stored durably before each create, the
        ids after (``store(record, durable)``). The ids need no write of their own: until the
        PrepareCompleted write carries them, start-up finds the instance by its intent
        (profile at placement) and destroys it. Returns the record and spec devices naming
        the MIG devices."""
        out = list(devices)
        for i, item in enumerate(devices):
            part = partition_of(item.device)
            if part is None:
                continue
            inst = Instance.of(part)
            record = _put(record, item.device.name, inst)
            store(record, True)
            hit(self.failpoints, Point.MIG_AFTER_INTENT, ref.uid)
            try:
                inst = self.create(str(ref), item.device.name, inst)
            except PartitionError as err:
                if not err.leftover:  # nothing of it exists: the intent goes
                    record = _put(record, item.device.name, None)
                    store(record, False)
                raise
            record = _put(record, item.device.name, inst)
            store(record, False)
            hit(self.failpoints, Point.MIG_AFTER_IDS_RECORDED, ref.uid)
            out[i] = replace(item, device=mig_device(item.device, inst))
        return record, out

    def ensure(self, claim: str, record: ClaimRecord) -> ClaimRecord:
        """A completed claim's partitions exist again (created anew after a reboot)."""
        for held in record.devices:
            inst = instance_of(held)
            if inst is None or (inst.created and self.exists(inst)):
                continue
            made = self.create(claim, held.device, replace(inst, gi=None, ci=None, uuid=None))
            record = _put(record, held.device, made)
        return record


def _put(record: ClaimRecord, device: str, inst: Instance | None) -> ClaimRecord:
    """``record`` with ``device``'s partition set (None: removed)."""
    def change(held: PreparedDevice) -> PreparedDevice:
        if inst is not None:
            return with_instance(held, inst)
        return replace(held, extra={k: v for k, v in held.extra.items() if k != KEY})

    devices = tuple(change(d) if d.device == device else d for d in record.devices)
    return replace(record, devices=devices)


def _cause(err: GpuLibraryError) -> str:
    name = type(err).__name__.removesuffix("Error")
    hint = {
        "InsufficientResources": " (the placement is taken: another instance or process "
                                 "holds it)",
        "InUse": " (a process still runs on it)",
        "NoPermission": " (MIG changes need root or CAP_SYS_ADMIN)",
        "NotSupported": " (MIG mode is off on this GPU)",
    }.get(name, "")
    return f"NVML {name} ({err.code}): {err}{hint}"


def reconcile(preparer: DevicePreparer) -> tuple[str, ...]:
    """Start-up: destroy the partitions of records that never completed (a crash mid-
    prepare), re-create those of completed claims that are gone (a reboot). Instances no
    record names are left alone. Returns the UIDs whose partitions were destroyed."""
    parts = preparer.partitions
    if parts is None:
        return ()
    destroyed: list[str] = []
    for uid, record in sorted(preparer.checkpoint.claims().items()):
        if not any(instance_of(d) for d in record.devices):
            continue
        if not record.completed:
            try:
                parts.release(uid, record)
                destroyed.append(uid)
            except ClaimError as err:
                log.error("cannot destroy the MIG partition of an interrupted prepare; "
                          "destroy it by hand (nvidia-smi mig -dci / -dgi)",
                          extra={"claim": uid, "error": str(err)})
            continue
        try:
            fresh = parts.ensure(uid, record)
        except ClaimError as err:
            log.error("cannot re-create the MIG partition of a prepared claim",
                      extra={"claim": uid, "error": str(err)})
            continue
        if fresh != record:
            from agent.prepare.state import put_record

            preparer.checkpoint.update(put_record(fresh))
            log.info("re-created the MIG partition of a prepared claim", extra={"claim": uid})
    return tuple(destroyed)
