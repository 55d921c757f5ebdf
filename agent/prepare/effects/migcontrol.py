"""Creating and destroying MIG instances through the ``GpuLibrary`` seam (NVML), one at a time.

Every failure names the device and NVML's cause (``PartitionError``); a create that fails half
way destroys what it made before raising, so nothing is left half-created.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from dataclasses import replace

from agent.checkpoint.model import ClaimRecord
from agent.claim.model import ClaimError
from agent.common.failpoints import Failpoints, Point, hit
from agent.prepare.effects.miginstance import Instance, instance_of, put_instance
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

    def ensure(self, claim: str, record: ClaimRecord) -> ClaimRecord:
        """A completed claim's partitions exist again (created anew after a reboot)."""
        for held in record.devices:
            inst = instance_of(held)
            if inst is None or (inst.created and self.exists(inst)):
                continue
            made = self.create(claim, held.device, replace(inst, gi=None, ci=None, uuid=None))
            record = put_instance(record, held.device, made)
        return record


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
