"""Dynamic MIG partitions (``--mig dynamic``) as an effect: create the GPU instance at the
allocated placement and its compute instance at prepare, hand the container the new MIG
device, destroy both at unprepare.

Crash safety rests on the checkpoint, never on NVML: a partition's intent is in the claim's
record, durably, before the GPU instance is created, and its ids after (``miginstance``). So
every instance dra-agent makes is named by a record at every moment, and:

* a failed prepare destroys what it made before answering (nothing half-created);
* start-up destroys the instances of records that never completed (their rollback), and
  re-creates those of completed claims that vanished (``reconcile``: a reboot clears MIG
  instances);
* instances no record names are someone else's: never touched. A record names an instance by
  its ids (the GI id is durable before the instance can run anything), on the GPU and at the
  placement discovery publishes under the record's device name; by its placement alone only
  at the rollback of this boot's prepare, and only a GI with no compute instance
  (``MigEffect.refusal``). A recovered record (salvaged, adopted) changes nothing here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import replace

from agent.checkpoint.model import ClaimRecord, PreparedDevice
from agent.common.failpoints import Failpoints, Point, hit
from agent.prepare.effects.base import BaseEffect, Reconciled, Release, Step, refused
from agent.prepare.effects.migcontrol import MigPartitions, NotRecordedError, PartitionError, cause
from agent.prepare.effects.miginstance import (
    KEY,
    Instance,
    instance_of,
    mig_device,
    owned_instances,
    put_instance,
)
from agent.prepare.errors import admin_refusal
from discovery.gpulib import GpuLibraryError
from discovery.model import Device, Inventory
from discovery.partitions import partition_of

log = logging.getLogger(__name__)


class MigEffect(BaseEffect):
    name = "mig"
    manual_fix = "destroy it by hand (nvidia-smi mig -dci / -dgi)"

    def __init__(self, partitions: MigPartitions, inventory: Callable[[], Inventory],
                 failpoints: Failpoints | None = None) -> None:
        self.partitions = partitions
        #: What discovery publishes now, that a record's partitions are checked against.
        self.inventory = inventory
        self.failpoints = failpoints

    def touches(self, record: ClaimRecord) -> bool:
        return any(KEY in d.extra for d in record.devices)

    def plan(self, step: Step) -> None:
        """A partition allocated with admin access is refused: admin access does not
        create (or, at unprepare, destroy) a MIG instance."""
        for item in step.devices:
            if item.admin_access and partition_of(item.device) is not None:
                raise admin_refusal(str(step.ref), item.device.name, item.request,
                                    "the partition is made at prepare, and admin access "
                                    "does not create MIG instances; ask for a MIG device "
                                    "that exists")

    def apply(self, step: Step) -> None:
        """Create the claim's partitions: the intent saved durably before each create, its
        GI id durably as soon as the GI exists (before its compute instance: from then on
        the record names the instance by its id), the other ids after, not durably. Until
        the PrepareCompleted write carries them, start-up destroys the instance by its GI
        id. The spec devices become the MIG devices."""
        ref = step.ref
        for i, item in enumerate(step.devices):
            part = partition_of(item.device)
            if part is None:
                continue
            inst = Instance.of(part)
            step.record = put_instance(step.record, item.device.name, inst)
            step.save(step.record, True)
            hit(self.failpoints, Point.MIG_AFTER_INTENT, ref.uid)

            def made_gi(made: Instance, name: str = item.device.name) -> None:
                step.record = put_instance(step.record, name, made)
                step.save(step.record, True)

            try:
                inst = self.partitions.create(str(ref), item.device.name, inst, made_gi)
            except PartitionError as err:
                if not err.leftover:  # nothing of it exists: the intent goes
                    step.record = put_instance(step.record, item.device.name, None)
                    step.save(step.record, False)
                raise
            step.record = put_instance(step.record, item.device.name, inst)
            step.save(step.record, False)
            hit(self.failpoints, Point.MIG_AFTER_IDS_RECORDED, ref.uid)
            step.devices[i] = replace(item, device=mig_device(item.device, inst))

    def reapply(self, step: Step) -> None:
        """The spec names the MIG devices the record names (``reconcile`` re-created any a
        reboot dropped, before specs are rebuilt)."""
        made = {held.device: inst for held in step.record.devices
                if (inst := instance_of(held)) is not None and inst.created}
        if made:
            step.devices = [replace(d, device=mig_device(d.device, made[d.device.name]))
                            if d.device.name in made else d for d in step.devices]

    def release(self, how: Release) -> None:
        """Destroy every partition the record names, as ``refusal`` allows; a PartitionError
        (the kubelet retries the unprepare) on the first that NVML refuses."""
        if how.record is None or not self.touches(how.record):
            return
        published = self.inventory().by_name()
        for held in how.record.devices:
            inst = self._checked(how.claim, held, published)
            if inst is None:
                continue
            if (why := self.refusal(how, held, inst)) is not None:
                refused(how.claim, held.device, KEY, why)
                continue
            try:
                gone = self.partitions.destroy(inst)
            except NotRecordedError as err:
                refused(how.claim, held.device, KEY, str(err))
                continue
            except GpuLibraryError as err:
                raise PartitionError(
                    how.claim, f"device {held.device}: cannot destroy {inst.describe()}: "
                               f"{cause(err)}") from err
            log.info("MIG partition destroyed" if gone else "MIG partition already gone",
                     extra={"claim": how.claim, "device": held.device,
                            "gpu_instance": inst.gi})
        if not how.rollback:
            hit(self.failpoints, Point.MIG_AFTER_DESTROYED, how.record.uid)

    def refusal(self, how: Release, held: PreparedDevice, inst: Instance) -> str | None:
        """Why a partition named by ids alone may not be destroyed; None when it may.

        A record with its GPU instance id names its instance (``MigPartitions.destroy``
        matches every id it has). One without (the intent written before the create) can
        only name what is at its placement: it may destroy the GI there only at the
        rollback of a prepare of this boot (an instance does not survive a reboot), only one
        holding no compute instance (the GI id is durable before the compute instance is
        made, so the agent's own never has one then), and only when no other record names
        that placement. Even so it cannot tell its own GI from an empty one made there by
        someone else since: such a GI runs nothing, and the published placement is the
        claim's while the record exists.
        """
        if inst.gi is not None:
            return None
        if not how.rollback:
            return "the record names no instance ids, and only the rollback of an " \
                   "interrupted prepare destroys by placement"
        assert how.record is not None
        if not how.boot_id or how.record.boot_id != how.boot_id:
            return "the record names no instance ids and is from another boot, which " \
                   "cleared every instance it could have made"
        for other in how.remaining().values():
            if other.uid != how.uid and inst.key in owned_instances({other.uid: other}):
                return f"claim {other.uid} names that placement too"
        return None

    def _checked(self, claim: str, held: PreparedDevice,
                 published: Mapping[str, Device]) -> Instance | None:
        """The record's partition when it is the one discovery publishes under the
        record's device name (its GPU, profile and placement); else None, in one line."""
        if KEY not in held.extra:
            return None
        if held.admin_access:  # prepare records no partition for it: written by hand
            refused(claim, held.device, KEY, "the device is held with admin access, which "
                                             "creates and destroys nothing")
            return None
        inst = instance_of(held)
        if inst is None:
            refused(claim, held.device, KEY, "not a partition record (a GPU, a profile and "
                                             "a placement, as integers)")
            return None
        device = published.get(held.device)
        part = partition_of(device) if device is not None else None
        if part is None or not Instance.of(part).same_partition(inst):
            refused(claim, held.device, KEY, f"{inst.describe()[:160]} is not the partition "
                                             f"this node publishes as {held.device}")
            return None
        return inst

    def reconcile(self, claims: Mapping[str, ClaimRecord], *, corrupt: bool) -> Reconciled:
        """Re-create the partitions of completed claims that are gone (a reboot): only for a
        record of the agent's own (not recovered), only the partition discovery publishes
        under the record's device name."""
        fresh: list[ClaimRecord] = []
        published: Mapping[str, Device] | None = None
        for uid, record in sorted(claims.items()):
            if not record.completed or record.recovered or not self.touches(record):
                continue
            published = published if published is not None else self.inventory().by_name()
            try:
                made = self._ensure(uid, record, published)
            except Exception as err:  # one claim's partition must not keep the others down
                log.error("cannot re-create the MIG partition of a prepared claim",
                          extra={"claim": uid, "error": str(err)})
                continue
            if made != record:
                fresh.append(made)
                log.info("re-created the MIG partition of a prepared claim",
                         extra={"claim": uid})
        return Reconciled(records=tuple(fresh))

    def _ensure(self, claim: str, record: ClaimRecord,
                published: Mapping[str, Device]) -> ClaimRecord:
        """A completed claim's partitions exist again (created anew after a reboot)."""
        for held in record.devices:
            inst = self._checked(claim, held, published)
            if inst is None or (inst.created and self.partitions.exists(inst)):
                continue
            made = self.partitions.create(claim, held.device,
                                          replace(inst, gi=None, ci=None, uuid=None))
            record = put_instance(record, held.device, made)
        return record
