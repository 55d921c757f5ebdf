"""Start-up recovery: finish what a crash or a reboot interrupted, before the plugin serves.

Rolls back prepares that never completed (each effect undoing what their records name: MIG
partitions, VF drivers and caps, GPU time slices, metadata files), removes (or, after a
corrupt checkpoint, adopts) spec files no record explains, lets each effect reconcile the
host with the completed records (a MIG partition a reboot dropped comes back; metadata files
no record explains go, kept after a corrupt checkpoint), and rebuilds the CDI spec of every
completed claim whose spec or file is lost or from another boot, so running pods' containers
restart with their devices.

A record salvaged from a corrupt checkpoint, adopted from a spec or unreadable is
``recovered``: it keeps its devices taken and nothing else. It is not rolled back, no effect
reconciles or reapplies for it, and it stays until the kubelet prepares or unprepares that
claim (one line says which host changes it names are left as they are). No per-claim problem
stops start-up: each is one line, and the plugin serves the other claims.

It takes the stores and the effects, never the preparer: nothing here serves a call.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from agent.checkpoint.model import ClaimRecord, ClaimState, PreparedDevice
from agent.checkpoint.store import CheckpointStore, CheckpointWriteError, log_unreadable
from agent.checkpoint.unreadable import one_line
from agent.claim.model import ClaimError, ClaimRef
from agent.common.metrics import Metrics
from agent.prepare.claimspec import ClaimBuilder, now
from agent.prepare.effects.base import Effect, Release, left_alone, reversed_effects
from agent.prepare.errors import CheckpointUnavailableError
from agent.prepare.gauges import update_gauges
from discovery.model import Device, Inventory

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    rolled_back: tuple[str, ...] = ()
    orphans_removed: tuple[str, ...] = ()
    adopted: tuple[str, ...] = ()
    #: Completed claims whose stale or lost spec was written again from the checkpoint.
    rebuilt: tuple[str, ...] = ()
    #: Claims whose spec could not be rebuilt (a device gone, ...): claim UID -> reason.
    not_rebuilt: tuple[tuple[str, str], ...] = ()
    #: Effect name -> UIDs of interrupted prepares whose host changes it undid.
    released: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: Effect name -> what its reconcile removed that no record explained.
    removed: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def partitions_destroyed(self) -> tuple[str, ...]:
        """Interrupted prepares whose MIG partitions were destroyed."""
        return self.released.get("mig", ())

    @property
    def metadata_removed(self) -> tuple[str, ...]:
        """``<namespace>_<name>/<request>`` of device metadata files no record explained."""
        return self.removed.get("metadata", ())


def recover(
    *, checkpoint: CheckpointStore, builder: ClaimBuilder, effects: Sequence[Effect],
    inventory: Callable[[], Inventory], metrics: Metrics,
) -> RecoveryReport:
    """Finish what a crash interrupted; run once before serving.

    PrepareStarted records are rolled back (the kubelet will ask again). Spec files of ours
    that no record explains are removed, unless the checkpoint was just found corrupt: then
    they are the best evidence of what is prepared, so they are adopted as recovered
    records that keep their devices reserved.
    """
    specs = builder.specs
    records = checkpoint.claims()
    corrupt = bool(checkpoint.corrupt_copies)
    set_aside = len(specs.corrupt_copies)
    on_disk = specs.claim_devices()
    metrics.cdi_spec_corrupt.inc(len(specs.corrupt_copies) - set_aside)
    # A recovered record (salvaged from a corrupt file, adopted, unreadable) only keeps its
    # devices taken: an interrupted prepare of one is not undone from what it says.
    rolled_back = [u for u, r in records.items()
                   if r.state is ClaimState.PREPARE_STARTED and not r.recovered]
    for record in records.values():
        if record.unreadable is not None and not corrupt:  # the store said so when corrupt
            log_unreadable(record)
        elif record.recovered and record.state is ClaimState.PREPARE_STARTED:
            left_alone(effects, record, "start-up")
    orphans = [u for u in on_disk if u not in records]
    remaining = {u: r for u, r in records.items() if u not in rolled_back}
    released: dict[str, list[str]] = {}
    for uid in rolled_back:
        for name in _undo(effects, records[uid], remaining, builder.boot_id):
            released.setdefault(name, []).append(uid)
        specs.remove(uid)
    adopted: dict[str, ClaimRecord] = {}
    if corrupt:
        for uid in orphans:
            adopted[uid] = ClaimRecord(
                uid=uid, namespace="", name="", state=ClaimState.PREPARE_COMPLETED,
                devices=tuple(
                    PreparedDevice(pool=builder.pool, device=d, requests=(),
                                   cdi_ids=(specs.cdi_id(uid, d),))
                    for d in on_disk[uid]
                ),
                spec_path=str(specs.path(uid)), boot_id=builder.boot_id,
                updated=now(), recovered=True,
            )
    else:
        for uid in orphans:
            specs.remove(uid)

    def change(claims: dict[str, ClaimRecord]) -> None:
        for uid in rolled_back:
            claims.pop(uid, None)
        claims.update(adopted)

    checkpoint.update(change)
    # After the roll-back: what a PrepareStarted record named is no record's now.
    removed: dict[str, tuple[str, ...]] = {}
    for effect in effects:
        try:
            done = effect.reconcile(checkpoint.claims(), corrupt=corrupt)
        except Exception as err:  # start-up goes on: the plugin must serve the other claims
            log.error(f"cannot reconcile the host at start-up; {effect.manual_fix}",
                      extra={"effect": effect.name, "error": str(err)})
            continue
        if done.records:
            checkpoint.update(_put_all(done.records))
        if done.removed:
            removed[effect.name] = done.removed
    rebuilt, not_rebuilt = _rebuild_specs(checkpoint, builder, inventory, metrics)
    report = RecoveryReport(
        rolled_back=tuple(rolled_back),
        orphans_removed=() if corrupt else tuple(orphans),
        adopted=tuple(adopted),
        rebuilt=rebuilt,
        not_rebuilt=not_rebuilt,
        released={k: tuple(v) for k, v in released.items()},
        removed=removed,
    )
    swept = [f"{k}:{v}" for k, vs in removed.items() for v in vs]
    if rolled_back or orphans or swept:
        log.warning(
            "recovered from an interrupted run",
            extra={
                "rolled_back": ",".join(report.rolled_back),
                "orphans_removed": ",".join(report.orphans_removed),
                "adopted": ",".join(report.adopted),
                "removed": ",".join(swept),
            },
        )
    update_gauges(metrics, checkpoint.claims())
    return report


def _put_all(records: Sequence[ClaimRecord]) -> Callable[[dict[str, ClaimRecord]], None]:
    """A checkpoint change that stores ``records`` (bound now)."""
    fresh = {r.uid: r for r in records}
    return lambda claims: claims.update(fresh)


def _undo(effects: Sequence[Effect], record: ClaimRecord,
          remaining: Mapping[str, ClaimRecord], boot_id: str) -> list[str]:
    """Undo an interrupted prepare's host changes, last first; the names of the effects that
    had something to undo and did. Start-up goes on when one fails: the line says what to
    do by hand."""
    how = Release(uid=record.uid, record=record, rollback=True, remaining=lambda: remaining,
                  boot_id=boot_id)
    done: list[str] = []
    for effect in reversed_effects(effects):
        touched = effect.touches(record)
        try:
            effect.release(how)
        except Exception as err:  # a refusing VF or no inventory must not keep the plugin down
            log.error(f"cannot undo a host change of an interrupted prepare; "
                      f"{effect.manual_fix}",
                      extra={"claim": record.uid, "effect": effect.name, "error": str(err)})
            continue
        if touched:
            done.append(effect.name)
    return done


def _rebuild_specs(
    checkpoint: CheckpointStore, builder: ClaimBuilder, inventory: Callable[[], Inventory],
    metrics: Metrics,
) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """Rewrite the spec of every completed claim whose spec is lost or from another boot.

    Containers of running pods restart after a reboot without the kubelet preparing their
    claims first, so a spec that only comes back on the next prepare is a failed container
    start. The spec is built from the record's allocation and the *current* inventory (a
    device node's minor can change across a reboot). A claim that cannot be rebuilt is
    reported once here and left stale: start-up goes on, and the kubelet's next prepare
    gets the same reason as a per-claim error.
    """
    rebuilt: list[str] = []
    failed: list[tuple[str, str]] = []
    devices: dict[str, Device] | None = None
    for uid, record in sorted(checkpoint.claims().items()):
        if not record.completed or record.recovered or not builder.spec_stale(record):
            continue
        ref = ClaimRef(namespace=record.namespace, name=record.name, uid=uid)
        claim = builder.recorded_claim(ref, record)
        if claim is None:
            failed.append((uid, "no_allocation"))
            metrics.spec_rebuild_errors.labels("no_allocation").inc()
            log.warning(
                "cannot rebuild CDI spec at start-up: the record keeps no allocation "
                "(written by an older version); the next prepare rewrites it",
                extra={"claim": uid},
            )
            continue
        if devices is None:
            try:
                devices = inventory().by_name()
            except Exception as err:  # discovery failing must not keep the plugin down
                log.error("cannot rebuild CDI specs at start-up: no inventory",
                          extra={"claim": uid, "error": str(err)})
                metrics.spec_rebuild_errors.labels("inventory").inc()
                return tuple(rebuilt), ((uid, "inventory"),)
        try:
            results = claim.results_for(builder.driver)
            fresh = builder.rewrite(claim, record, results, devices)
            try:
                checkpoint.update(_put_all((fresh,)))
            except CheckpointWriteError as err:
                raise CheckpointUnavailableError(str(ref), str(err)) from err
        except ClaimError as err:
            failed.append((uid, err.reason))
            metrics.spec_rebuild_errors.labels(err.reason).inc()
            log.error(
                "cannot rebuild CDI spec at start-up",
                extra={"claim": uid, "reason": err.reason, "error": str(err)},
            )
            continue
        except Exception as err:  # a record no check foresaw must not keep the plugin down
            failed.append((uid, "internal"))
            metrics.spec_rebuild_errors.labels("internal").inc()
            log.error(
                "cannot rebuild CDI spec at start-up: the record holds what the agent "
                "cannot use; the next prepare rewrites it from the API server",
                extra={"claim": uid, "reason": "internal", "error": one_line(str(err))},
            )
            continue
        rebuilt.append(uid)
        metrics.specs_rebuilt.inc()
        log.info("rebuilt CDI spec of a prepared claim at start-up",
                 extra={"claim": uid, "devices": len(results),
                        "device_metadata": len(fresh.metadata.requests) if fresh.metadata else 0})
    return tuple(rebuilt), tuple(failed)
