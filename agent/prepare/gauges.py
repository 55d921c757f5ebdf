"""The prepared-claims gauges, rebuilt whole from the checkpoint's records.

Rebuilt, never incremented: exact after a restart, an unprepare, a recovery.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator, Mapping

from agent.checkpoint.model import ClaimRecord
from agent.common.metrics import ClaimDevice, Metrics


def update_gauges(metrics: Metrics, claims: Mapping[str, ClaimRecord]) -> None:
    metrics.prepared_claims.set(len(claims))
    metrics.prepared_devices.set(sum(len(r.devices) for r in claims.values()))
    snapshot = dict(claims)  # the records are frozen; the mapping may be the caller's own

    def devices() -> Iterator[ClaimDevice]:
        for _, r in sorted(snapshot.items()):
            for d in r.devices:
                yield ClaimDevice(
                    namespace=r.namespace, claim=r.name, pool=d.pool, device=d.device,
                    uuid=d.uuid or "", pci_bus_id=d.pci_address or "", ifname=d.if_name or "",
                )

    metrics.claim_devices.set_source(devices)


#: The records as one checkpoint change left them, numbered in the order the changes ran.
Snapshot = tuple[int, dict[str, ClaimRecord]]


class OrderedGauges:
    """The gauges, set from the snapshot of the newest change whoever sets them last.

    Changes run one at a time under the checkpoint's lock, but the calls that made them set
    the gauges after it, in any order: numbered when taken (``take``, inside the change),
    a snapshot older than the one shown is dropped, so 100 concurrent calls still leave the
    gauges exact.
    """

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self._numbers = itertools.count(1)
        self._lock = threading.Lock()
        self._shown = 0

    def take(self, claims: Mapping[str, ClaimRecord]) -> Snapshot:
        """A numbered copy of ``claims``; only from inside a checkpoint change."""
        return next(self._numbers), dict(claims)

    def show(self, snapshot: Snapshot) -> None:
        number, claims = snapshot
        with self._lock:
            if number > self._shown:
                self._shown = number
                update_gauges(self._metrics, claims)
