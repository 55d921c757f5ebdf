"""The prepared-claims gauges, rebuilt whole from the checkpoint's records.

Rebuilt, never incremented: exact after a restart, an unprepare, a recovery.
"""

from __future__ import annotations

from collections.abc import Mapping

from agent.checkpoint.model import ClaimRecord
from agent.common.metrics import ClaimDevice, Metrics


def update_gauges(metrics: Metrics, claims: Mapping[str, ClaimRecord]) -> None:
    metrics.prepared_claims.set(len(claims))
    metrics.prepared_devices.set(sum(len(r.devices) for r in claims.values()))
    metrics.claim_devices.set(
        ClaimDevice(
            namespace=r.namespace, claim=r.name, pool=d.pool, device=d.device,
            uuid=d.uuid or "", pci_bus_id=d.pci_address or "", ifname=d.if_name or "",
        )
        for _, r in sorted(claims.items())
        for d in r.devices
    )
