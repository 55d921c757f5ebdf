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
* instances no record names are someone else's: never touched.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace

from agent.checkpoint.model import ClaimRecord
from agent.claim.model import ClaimError
from agent.common.failpoints import Failpoints, Point, hit
from agent.prepare.effects.base import BaseEffect, Reconciled, Release, Step
from agent.prepare.effects.migcontrol import MigPartitions, PartitionError
from agent.prepare.effects.miginstance import Instance, instance_of, mig_device, put_instance
from discovery.partitions import partition_of

log = logging.getLogger(__name__)


class MigEffect(BaseEffect):
    name = "mig"
    manual_fix = "destroy it by hand (nvidia-smi mig -dci / -dgi)"

    def __init__(self, partitions: MigPartitions, failpoints: Failpoints | None = None) -> None:
        self.partitions = partitions
        self.failpoints = failpoints

    def touches(self, record: ClaimRecord) -> bool:
        return any(instance_of(d) is not None for d in record.devices)

    def apply(self, step: Step) -> None:
        """Create the claim's partitions: the intent saved durably before each create, the
        ids after, not durably. The ids need no write of their own: until the
        PrepareCompleted write carries them, start-up finds the instance by its intent
        (profile at placement) and destroys it. The spec devices become the MIG devices."""
        ref = step.ref
        for i, item in enumerate(step.devices):
            part = partition_of(item.device)
            if part is None:
                continue
            inst = Instance.of(part)
            step.record = put_instance(step.record, item.device.name, inst)
            step.save(step.record, True)
            hit(self.failpoints, Point.MIG_AFTER_INTENT, ref.uid)
            try:
                inst = self.partitions.create(str(ref), item.device.name, inst)
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
        """Destroy every partition the record names; a PartitionError (the kubelet retries
        the unprepare) on the first that refuses."""
        if how.record is None:
            return
        self.partitions.release(how.claim, how.record)
        if not how.rollback:
            hit(self.failpoints, Point.MIG_AFTER_DESTROYED, how.record.uid)

    def reconcile(self, claims: Mapping[str, ClaimRecord], *, corrupt: bool) -> Reconciled:
        """Re-create the partitions of completed claims that are gone (a reboot)."""
        fresh: list[ClaimRecord] = []
        for uid, record in sorted(claims.items()):
            if not record.completed or not self.touches(record):
                continue
            try:
                made = self.partitions.ensure(uid, record)
            except ClaimError as err:
                log.error("cannot re-create the MIG partition of a prepared claim",
                          extra={"claim": uid, "error": str(err)})
                continue
            if made != record:
                fresh.append(made)
                log.info("re-created the MIG partition of a prepared claim",
                         extra={"claim": uid})
        return Reconciled(records=tuple(fresh))
