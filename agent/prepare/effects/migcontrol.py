"""Creating and destroying MIG instances through the ``GpuLibrary`` seam (NVML), one at a time.

Every failure names the device and NVML's cause (``PartitionError``); a create that fails half
way destroys what it made before raising, so nothing is left half-created.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace

from agent.claim.model import ClaimError
from agent.common.failpoints import Failpoints, Point, hit
from agent.prepare.effects.miginstance import Instance
from discovery.gpulib import (
    CI_PROFILE_FULL,
    DeviceHandle,
    GpuLibrary,
    GpuLibraryError,
    InvalidArgumentError,
    NotFoundError,
    Placement,
)

log = logging.getLogger(__name__)


class PartitionError(ClaimError):
    """A MIG partition could not be created or destroyed; names the device and NVML's cause."""

    reason = "mig_partition"

    def __init__(self, claim: str, message: str, leftover: bool = False) -> None:
        super().__init__(claim, message)
        #: A half-made instance could not be destroyed: its record must stay.
        self.leftover = leftover


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

    def create(self, claim: str, device: str, inst: Instance,
               on_gi: Callable[[Instance], None] | None = None) -> Instance:
        """Make the GI at the placement and its full CI; on any failure destroy what was
        made and raise PartitionError naming the device and NVML's cause. ``on_gi`` gets the
        partition with its GI id as soon as the GI exists, before its CI (a prepare records
        it durably then: a record of the agent's own names every instance by its id from the
        moment it can run anything)."""
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
                raise PartitionError(claim, f"{what}: {cause(err)}") from err
            try:
                if on_gi is not None:
                    on_gi(replace(inst, gi=gi.id))
                hit(self.failpoints, Point.MIG_AFTER_GI_CREATED, claim)
                ci = lib.create_compute_instance(handle, gi.id, ci_profile)
                uuid = self._mig_uuid(lib, handle, gi.id, ci)
            except BaseException as err:
                left = not self._destroy_quietly(lib, handle, gi.id)
                if isinstance(err, GpuLibraryError):
                    raise PartitionError(claim, f"{what}: {cause(err)}", left) from err
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

    def _recorded_gi(self, lib: GpuLibrary, handle: DeviceHandle, inst: Instance) -> int | None:
        """The GI to destroy for ``inst``: at its profile and placement, with every id the
        record names (its GI id, then its CI id, then its MIG UUID); with no id recorded,
        one that holds no compute instance (what a prepare that died before recording the
        GI id left). None when nothing is there; ``NotRecordedError`` when something else is."""
        for gi in lib.gpu_instances(handle, inst.profile_id):
            if gi.placement_start != inst.start:
                continue
            cis = lib.compute_instances(handle, gi.id)
            if inst.gi is None:
                if inst.ci is not None or inst.uuid is not None:
                    raise NotRecordedError("the record names compute instance ids without a GPU "
                                      "instance id")
                if cis:
                    raise NotRecordedError(f"GPU instance {gi.id} there holds compute instances, "
                                      "and a record with no ids destroys only one without")
                return gi.id
            if gi.id != inst.gi:
                raise NotRecordedError(f"the GPU instance there is {gi.id}, not {inst.gi}")
            if inst.ci is not None and inst.ci not in cis:
                raise NotRecordedError(f"GPU instance {gi.id} has no compute instance {inst.ci}")
            if inst.uuid is not None and (inst.ci is None or self._uuid_of(
                    lib, handle, gi.id, inst.ci) != inst.uuid):
                raise NotRecordedError(f"the MIG device of GPU instance {gi.id} is not "
                                  f"{inst.uuid[:60]!a}")
            return gi.id
        return None

    def _uuid_of(self, lib: GpuLibrary, handle: DeviceHandle, gi: int, ci: int) -> str | None:
        try:
            return self._mig_uuid(lib, handle, gi, ci)
        except NotFoundError:
            return None

    def destroy(self, inst: Instance) -> bool:
        """Destroy the recorded partition's CIs and GI (``_recorded_gi``: what the record
        names, never another instance at its placement); False when there was nothing (any
        more), ``NotRecordedError`` when what is there is not it. NVML errors propagate (a
        process still on it is IN_USE)."""
        with self._session() as lib:
            try:
                handle = self._handle(lib, inst.parent_uuid)
            except NotFoundError:
                return False  # the GPU is gone, and its instances with it
            gi = self._recorded_gi(lib, handle, inst)
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


class NotRecordedError(Exception):
    """What is at a recorded partition's placement is not the instance the record names:
    someone else's, left alone."""


def cause(err: GpuLibraryError) -> str:
    name = type(err).__name__.removesuffix("Error")
    hint = {
        "InsufficientResources": " (the placement is taken: another instance or process "
                                 "holds it)",
        "InUse": " (a process still runs on it)",
        "NoPermission": " (MIG changes need root or CAP_SYS_ADMIN)",
        "NotSupported": " (MIG mode is off on this GPU)",
    }.get(name, "")
    return f"NVML {name} ({err.code}): {err}{hint}"
