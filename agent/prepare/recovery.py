"""Start-up recovery: finish what a crash or a reboot interrupted, before the plugin serves.

Rolls back prepares that never completed (with what they changed on the host: MIG partitions,
VF drivers, GPU time slices), removes (or, after a corrupt checkpoint, adopts) spec
files no record explains, removes device metadata files no record explains (kept after a
corrupt checkpoint), and rebuilds the CDI spec and metadata files of every completed claim
whose spec or file is lost or from another boot, so running pods' containers restart with
their devices.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from agent.checkpoint.model import ClaimRecord, ClaimState, PreparedDevice
from agent.claim.model import ClaimError, ClaimRef
from agent.prepare.state import DevicePreparer, now, put_record
from discovery.model import Device

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    rolled_back: tuple[str, ...] = ()
    orphans_removed: tuple[str, ...] = ()
    adopted: tuple[str, ...] = ()
    #: ``<namespace>_<name>/<request>`` of device metadata files no record explained.
    metadata_removed: tuple[str, ...] = ()
    #: Completed claims whose stale or lost spec was written again from the checkpoint.
    rebuilt: tuple[str, ...] = ()
    #: Claims whose spec could not be rebuilt (a device gone, ...): claim UID -> reason.
    not_rebuilt: tuple[tuple[str, str], ...] = ()
    #: Interrupted prepares whose MIG partitions were destroyed (agent.prepare.partitions).
    partitions_destroyed: tuple[str, ...] = ()


def recover(preparer: DevicePreparer) -> RecoveryReport:
    """Finish what a crash interrupted; run once before serving.

    PrepareStarted records are rolled back (the kubelet will ask again). Spec files of ours
    that no record explains are removed, unless the checkpoint was just found corrupt: then
    they are the best evidence of what is prepared, so they are adopted as recovered
    records that keep their devices reserved.
    """
    from agent.prepare.partitions import reconcile

    partitions_destroyed = reconcile(preparer)  # before the records it reads are rolled back
    records = preparer.checkpoint.claims()
    corrupt = bool(preparer.checkpoint.corrupt_copies)
    set_aside = len(preparer.specs.corrupt_copies)
    on_disk = preparer.specs.claim_devices()
    preparer.metrics.cdi_spec_corrupt.inc(len(preparer.specs.corrupt_copies) - set_aside)
    rolled_back = [u for u, r in records.items() if r.state is ClaimState.PREPARE_STARTED]
    orphans = [u for u in on_disk if u not in records]
    remaining = {u: r for u, r in records.items() if u not in rolled_back}
    for uid in rolled_back:
        _undo_host(preparer, records[uid], remaining)
        preparer.specs.remove(uid)
        preparer.metadata.remove(records[uid])
    adopted: dict[str, ClaimRecord] = {}
    if corrupt:
        for uid in orphans:
            adopted[uid] = ClaimRecord(
                uid=uid, namespace="", name="", state=ClaimState.PREPARE_COMPLETED,
                devices=tuple(
                    PreparedDevice(pool=preparer.pool, device=d, requests=(),
                                   cdi_ids=(preparer.specs.cdi_id(uid, d),))
                    for d in on_disk[uid]
                ),
                spec_path=str(preparer.specs.path(uid)), boot_id=preparer.boot_id,
                updated=now(), recovered=True,
            )
    else:
        for uid in orphans:
            preparer.specs.remove(uid)

    def change(claims: dict[str, ClaimRecord]) -> None:
        for uid in rolled_back:
            claims.pop(uid, None)
        claims.update(adopted)

    preparer.checkpoint.update(change)
    # After the roll-back: the files of a PrepareStarted record are orphans now.
    swept = () if corrupt else preparer.metadata.sweep(preparer.checkpoint.claims())
    rebuilt, not_rebuilt = _rebuild_specs(preparer)
    report = RecoveryReport(
        rolled_back=tuple(rolled_back),
        orphans_removed=() if corrupt else tuple(orphans),
        adopted=tuple(adopted),
        metadata_removed=swept,
        rebuilt=rebuilt,
        not_rebuilt=not_rebuilt,
        partitions_destroyed=partitions_destroyed,
    )
    if rolled_back or orphans or swept:
        log.warning(
            "recovered from an interrupted run",
            extra={
                "rolled_back": ",".join(report.rolled_back),
                "orphans_removed": ",".join(report.orphans_removed),
                "adopted": ",".join(report.adopted),
                "metadata_removed": ",".join(swept),
            },
        )
    preparer.update_gauges()
    return report

def _undo_host(preparer: DevicePreparer, record: ClaimRecord,
               remaining: dict[str, ClaimRecord]) -> None:
    """Give back the VF drivers and GPU intervals of an interrupted prepare (its partitions
    were reconciled before). Start-up goes on when that fails: the line says what to do."""
    try:
        preparer.undo_host(record.uid, record, partitions=False, remaining=remaining)
    except Exception as err:  # a refusing VF or no inventory must not keep the plugin down
        log.error("cannot undo a host change of an interrupted prepare; rebind the VF by "
                  "hand (driverctl) or reset the GPU's time slice (nvidia-smi compute-policy)",
                  extra={"claim": record.uid, "error": str(err)})


def _rebuild_specs(
    preparer: DevicePreparer,
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
    inventory: dict[str, Device] | None = None
    for uid, record in sorted(preparer.checkpoint.claims().items()):
        if not record.completed or record.recovered or not preparer.spec_stale(record):
            continue
        ref = ClaimRef(namespace=record.namespace, name=record.name, uid=uid)
        claim = preparer.recorded_claim(ref, record)
        if claim is None:
            failed.append((uid, "no_allocation"))
            preparer.metrics.spec_rebuild_errors.labels("no_allocation").inc()
            log.warning(
                "cannot rebuild CDI spec at start-up: the record keeps no allocation "
                "(written by an older version); the next prepare rewrites it",
                extra={"claim": uid},
            )
            continue
        if inventory is None:
            try:
                inventory = preparer.inventory().by_name()
            except Exception as err:  # discovery failing must not keep the plugin down
                log.error("cannot rebuild CDI specs at start-up: no inventory",
                          extra={"claim": uid, "error": str(err)})
                preparer.metrics.spec_rebuild_errors.labels("inventory").inc()
                return tuple(rebuilt), ((uid, "inventory"),)
        try:
            results = claim.results_for(preparer.driver)
            fresh = preparer.rewrite(claim, record, results, inventory)
            preparer.store(ref, put_record(fresh))
        except ClaimError as err:
            failed.append((uid, err.reason))
            preparer.metrics.spec_rebuild_errors.labels(err.reason).inc()
            log.error(
                "cannot rebuild CDI spec at start-up",
                extra={"claim": uid, "reason": err.reason, "error": str(err)},
            )
            continue
        rebuilt.append(uid)
        preparer.metrics.specs_rebuilt.inc()
        log.info("rebuilt CDI spec of a prepared claim at start-up",
                 extra={"claim": uid, "devices": len(results),
                        "device_metadata": len(fresh.metadata.requests) if fresh.metadata else 0})
    return tuple(rebuilt), tuple(failed)
