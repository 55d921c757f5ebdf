"""Device preparation: what prepare and unprepare do on this node, without any gRPC.

``DevicePreparer`` receives claims already fetched and checked by the plugin framework and
answers with the devices to hand to the kubelet. It owns three facts:

* which devices exist (the inventory, asked on each call: hotplug may change it);
* which devices are prepared for which claim (the checkpoint, read-modify-written under its
  lock, so "is this device free?" and "it is mine now" happen atomically across claims);
* the CDI spec of each claim (``ClaimBuilder``), and every other change on the host: the
  effects (``agent.prepare.effects``), walked in order, each named by the claim's record
  before it is made.

The framework serialises calls per claim; calls for different claims run in parallel here.
Start-up recovery, which builds on the same steps, is ``agent.prepare.recovery``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TypeVar

from agent.checkpoint.model import ClaimRecord, ClaimState, holders
from agent.checkpoint.store import CheckpointStore, CheckpointWriteError
from agent.claim.identity import check_uid, uid_problem
from agent.claim.model import AllocatedDevice, Claim, ClaimError, ClaimRef
from agent.claim.parse import allocation_json
from agent.claim.status import NicStatus
from agent.common.failpoints import Failpoints, Point, hit
from agent.common.metrics import Metrics
from agent.prepare.claimspec import ClaimBuilder, now
from agent.prepare.devices import NETDEV_TYPES, nic_status
from agent.prepare.effects.base import Release, left_alone, reversed_effects
from agent.prepare.errors import CheckpointUnavailableError, DeviceTakenError
from agent.prepare.gauges import OrderedGauges, Snapshot
from agent.prepare.pfvf import check_pf_and_vfs
from agent.prepare.recovery import RecoveryReport, recover
from agent.prepare.shares import check_shares
from discovery.model import Inventory

log = logging.getLogger(__name__)
Claims = dict[str, ClaimRecord]
T = TypeVar("T")


def put_record(record: ClaimRecord) -> Callable[[dict[str, ClaimRecord]], None]:
    """A checkpoint change that stores ``record`` (bound now, not when the loop moves on)."""
    return lambda claims: claims.__setitem__(record.uid, record)


def put_and_read(record: ClaimRecord, gauges: OrderedGauges) -> Callable[[Claims], Snapshot]:
    """``put_record``, and a snapshot of every record after it: the gauges' input, without a
    second trip through the checkpoint's locks."""
    def change(claims: Claims) -> Snapshot:
        claims[record.uid] = record
        return gauges.take(claims)
    return change


def pop_and_read(uid: str, gauges: OrderedGauges) -> Callable[[Claims], Snapshot]:
    """Drop ``uid``'s record; a snapshot of every record left (as ``put_and_read``)."""
    def change(claims: Claims) -> Snapshot:
        claims.pop(uid, None)
        return gauges.take(claims)
    return change


class DevicePreparer:
    """Prepare and unprepare, as ``agent.plugin.framework.Preparer`` asks for them."""

    def __init__(
        self,
        *,
        builder: ClaimBuilder,
        checkpoint: CheckpointStore,
        inventory: Callable[[], Inventory],
        metrics: Metrics | None = None,
        failpoints: Failpoints | None = None,
    ) -> None:
        self.builder = builder
        self.driver = builder.driver
        self.pool = builder.pool
        self.node_name = builder.node_name
        self.effects = builder.effects
        self._release_order = reversed_effects(self.effects)
        self.checkpoint = checkpoint
        self.inventory = inventory
        self.metrics = metrics or Metrics()
        self._gauges = OrderedGauges(self.metrics)
        #: Crash-test hooks (``agent.common.failpoints``); None in normal operation.
        self.failpoints = failpoints

    def recover(self) -> RecoveryReport:
        """Start-up: finish what a crash or a reboot interrupted (``agent.prepare.recovery``)."""
        return recover(checkpoint=self.checkpoint, builder=self.builder, effects=self.effects,
                       inventory=self.inventory, metrics=self.metrics)

    def close(self) -> None:
        self.checkpoint.close()

    def recorded_claim(self, ref: ClaimRef, record: ClaimRecord) -> Claim | None:
        """The claim as it was prepared, rebuilt from its record; None when not kept."""
        return self.builder.recorded_claim(ref, record)

    # -- prepare --------------------------------------------------------------------------

    def prepare(self, claim: Claim) -> ClaimRecord:
        """Prepare ``claim`` (allocated, UID checked) and return its completed record."""
        ref = claim.ref
        check_uid(ref)  # the framework checked already; this keeps a bad UID off the disk
        results = claim.results_for(self.driver)
        existing = self.checkpoint.claims().get(ref.uid)
        if existing is not None and existing.completed and not existing.recovered:
            return self._repeat(claim, existing, results)
        inventory = self.inventory().by_name()
        step = self.builder.plan(claim, results, inventory)

        def start(claims: dict[str, ClaimRecord]) -> None:
            self._check_free(ref, results, claims)
            check_shares(ref, results, step.record.devices, claims, inventory=inventory,
                         pool=self.pool)
            check_pf_and_vfs(ref, results, claims, inventory=inventory, pool=self.pool)
            for effect in self.effects:
                effect.check(step, claims)
            claims[ref.uid] = step.record

        # The PrepareStarted record reserves the devices at once (atomically with the checks
        # above) but is not fsynced on its own: until PrepareCompleted is durable, the only
        # thing on disk is the claim's CDI spec, named by its UID, and start-up removes a spec
        # that no completed record explains. That is the same roll-back, one durable write
        # cheaper. An effect that changes the host saves the record durably first
        # (``Step.save``); metadata files no record lists are found by start-up too.
        self.store(ref, start, durable=False)
        step.save = lambda r, durable=True: self.store(ref, put_record(r), durable=durable)
        try:
            hit(self.failpoints, Point.PREPARE_AFTER_STARTED, ref.uid)
            for effect in self.effects:
                effect.apply(step)
            if step.devices:
                self.builder.write_spec(ref, step.devices)
            hit(self.failpoints, Point.PREPARE_AFTER_SPEC_WRITTEN, ref.uid)
            done = step.record.with_state(ClaimState.PREPARE_COMPLETED, now())
            snapshot = self.store(ref, put_and_read(done, self._gauges))
            hit(self.failpoints, Point.PREPARE_AFTER_COMPLETED, ref.uid)
        except BaseException:
            if self._host_released(ref):
                self._rollback(ref.uid)
            raise
        self._gauges.show(snapshot)
        return done

    def _host_released(self, ref: ClaimRef) -> bool:
        """Undo what a failed prepare changed on the host, as its record names it, last
        change first (the rollback drops that record, whatever its state); False (the record
        stays, for start-up to finish) when that fails."""
        record = self.checkpoint.claims().get(ref.uid)
        if record is None:
            return True
        how = Release(uid=ref.uid, record=record, rollback=True,
                      remaining=self.checkpoint.claims, ref=ref, boot_id=self.builder.boot_id)
        try:
            for effect in self._release_order:
                effect.release(how)
        except ClaimError as err:
            log.error("rollback cannot undo what the failed prepare changed on the host; "
                      "start-up retries", extra={"claim": ref.uid, "error": str(err)})
            return False
        return True

    def _rollback(self, uid: str) -> None:
        """Drop a failed prepare's spec and record. If the spec cannot be removed, the
        PrepareStarted record stays, so the next prepare or the next start-up finishes it."""
        try:
            self.builder.specs.remove(uid)
            self.checkpoint.update(lambda claims: claims.pop(uid, None))
        except Exception:  # the original error matters more than this one
            log.exception("rollback of a failed prepare failed", extra={"claim": uid})

    def prepare_recorded(self, ref: ClaimRef) -> ClaimRecord | None:
        """Answer a repeated prepare from the checkpoint alone; None when the claim is needed.

        The kubelet repeats prepares (its restart, a container restart) and an API server
        outage must not fail them. A completed record is keyed by the claim UID, which the API
        server never reuses, so it answers for exactly that object: a claim deleted and
        re-created under the same name has a new UID and takes the full path (GET, UID check).
        A record that was recovered, names another claim, or must rewrite its spec without the
        allocation it was prepared from, takes the full path too.
        """
        check_uid(ref)
        existing = self.checkpoint.claims().get(ref.uid)
        if existing is None or not existing.completed or existing.recovered:
            return None
        if (existing.namespace, existing.name) != (ref.namespace, ref.name):
            return None
        if not self.builder.spec_stale(existing):
            return existing
        claim = self.builder.recorded_claim(ref, existing)
        if claim is None:
            return None  # written by an older version: the API object has what is needed
        return self._repeat(claim, existing, claim.results_for(self.driver))

    def _repeat(
        self, claim: Claim, existing: ClaimRecord, results: Sequence[AllocatedDevice]
    ) -> ClaimRecord:
        """A prepare of a prepared claim: same answer; rewrite the spec if it was lost."""
        ref = claim.ref
        if not self.builder.spec_stale(existing):
            return existing
        spec_missing = self.builder.spec_missing(existing)
        fresh = existing
        if existing.devices:
            fresh = self.builder.rewrite(claim, existing, results, self.inventory().by_name())
        fresh = replace(fresh, boot_id=self.builder.boot_id, updated=now(),
                        allocation=allocation_json(claim, self.driver))
        self._gauges.show(self.store(ref, put_and_read(fresh, self._gauges)))
        log.info(
            "rewrote CDI spec of a prepared claim",
            extra={"claim": ref.uid, "reason": "missing" if spec_missing else "reboot",
                   "device_metadata": len(fresh.metadata.requests) if fresh.metadata else 0},
        )
        return fresh

    def network_status(self, claim: Claim) -> list[NicStatus]:
        """What the claim's ``status.devices`` should say about its NICs, after a prepare."""
        inventory = self.inventory().by_name()
        out: list[NicStatus] = []
        for result in claim.results_for(self.driver):
            device = inventory.get(result.device) if result.pool == self.pool else None
            if device is not None and device.type in NETDEV_TYPES:
                out.append(nic_status(result, self.builder.spec_device(claim, result,
                                                                       inventory)))
        return out

    def _check_free(
        self, ref: ClaimRef, results: Sequence[AllocatedDevice], claims: dict[str, ClaimRecord]
    ) -> None:
        """Refuse a device another claim holds, unless admin access or a share makes it legal.

        The driver is the last line of defence against a double allocation (a stale scheduler
        cache, a force-deleted pod whose claim was re-allocated before unprepare).
        """
        for result in results:
            if result.admin_access:
                continue
            for other, held in holders(claims, result.pool, result.device, besides=ref.uid):
                if held.admin_access or (result.share_id and held.share_id):
                    continue
                device = f"device {result.pool}/{result.device}"
                if other.unreadable is not None:
                    raise DeviceTakenError(
                        str(ref),
                        f"{device} is held by claim {other.uid}, whose checkpoint record "
                        f"cannot be read ({other.unreadable}); it stays taken until the "
                        "kubelet unprepares that claim, or an operator runs: dra-agent "
                        f"claims --forget {other.uid}",
                    )
                owner = f"{other.namespace}/{other.name} ({other.uid})"
                raise DeviceTakenError(
                    str(ref),
                    f"{device} is already prepared for claim "
                    f"{owner}; it is released when the pods using that claim are gone",
                )

    def store(self, ref: ClaimRef, change: Callable[[Claims], T], durable: bool = True) -> T:
        """One change of the checkpoint; ``durable``: fsynced (the PrepareCompleted record,
        each effect's record before the host change it names), else kept in the cache until
        the next durable one (docs/durability.md)."""
        try:
            return self.checkpoint.update(change, durable=durable)
        except CheckpointWriteError as err:
            raise CheckpointUnavailableError(str(ref), str(err)) from err

    # -- unprepare ------------------------------------------------------------------------

    def unprepare(self, uid: str, ref: ClaimRef | None = None) -> None:
        """Undo a prepare. Unknown claims succeed: the spec name derives from the UID alone.

        The kubelet also unprepares claims whose prepare failed, and an error keeps their pod
        terminating for ever. A UID that prepare refuses (``uid_problem``) never got a spec, so
        no path is built from it: only a checkpoint record of that key, if any, goes. Each
        effect undoes what the record names, last change first; an error (a VF that refuses)
        fails the call, and the kubelet retries.
        """
        hit(self.failpoints, Point.UNPREPARE_AFTER_STARTED, uid)
        record = self.checkpoint.claims().get(uid)
        if uid_problem(uid) is None:
            self.builder.specs.remove(uid)
        elif record is None:
            return
        # A recovered record (salvaged from a corrupt file, adopted from a spec, unreadable)
        # only kept its devices taken: no effect acts on what it names, as if there were
        # none (``agent.prepare.recovery``).
        trusted = record if record is not None and not record.recovered else None
        if record is not None and trusted is None:
            left_alone(self.effects, record, "unprepare")
        how = Release(uid=uid, record=trusted, rollback=False, remaining=self.checkpoint.claims,
                      ref=ref if ref is not None and ref.uid == uid else None,
                      boot_id=self.builder.boot_id)
        for effect in self._release_order:
            effect.release(how)
        hit(self.failpoints, Point.UNPREPARE_AFTER_SPEC_REMOVED, uid)
        snapshot = self.checkpoint.update(pop_and_read(uid, self._gauges))
        if trusted is not None:
            for effect in self.effects:
                effect.released(trusted, self.checkpoint.claims)
        hit(self.failpoints, Point.UNPREPARE_AFTER_COMPLETED, uid)
        self._gauges.show(snapshot)

    def update_gauges(self) -> None:
        """The gauges from the records as they are now."""
        self._gauges.show(self.checkpoint.update(self._gauges.take, durable=False))
