"""How many fsyncs a prepare and an unprepare make (docs/durability.md), counted through the
writers' ``FileOps`` seam: one each, the checkpoint's, as the upstream checkpointmanager;
none on tmpfs; the CDI spec's own only when no boot ID tells start-up of a reboot."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.checkpoint.store import CheckpointStore
from agent.claim.parse import parse_claim
from agent.daemon import wiring
from agent.prepare import CDIClaimSpecs, ClaimBuilder, ClaimMetadata, DevicePreparer, EnvOnlyEdits
from cdi.atomicfile import OsFileOps
from discovery.model import Inventory
from tests.plugnode import DRIVER, NODE, gpu, make_claim


class CountingOps(OsFileOps):
    def __init__(self) -> None:
        self.fsyncs = 0

    def fsync(self, fd: int) -> None:
        self.fsyncs += 1
        super().fsync(fd)


def preparer(root: Path, ops: CountingOps, *, boot_id: str, cdi_tmpfs: bool,
             state_tmpfs: bool = False) -> DevicePreparer:
    found = Inventory(devices=tuple(gpu(i) for i in range(2)))
    specs = CDIClaimSpecs(root / "cdi", DRIVER, EnvOnlyEdits(), ops=ops,
                          volatile=lambda _: cdi_tmpfs)
    effects = wiring.effects(lambda: found, metadata=ClaimMetadata(DRIVER, None, False))
    builder = ClaimBuilder(driver=DRIVER, pool=NODE, node_name=NODE, specs=specs,
                           boot_id=boot_id, effects=effects)
    store = CheckpointStore(root / "state" / "checkpoint.json", ops=ops,
                            volatile=lambda _: state_tmpfs)
    return DevicePreparer(builder=builder, checkpoint=store, inventory=lambda: found)


@pytest.mark.parametrize(("boot_id", "cdi_tmpfs", "state_tmpfs", "prepare", "unprepare"), [
    ("boot-1", False, False, 1, 1),  # the node's case: the checkpoint's fsync, no other
    ("boot-1", True, False, 1, 1),
    ("", False, False, 3, 1),  # no boot ID: the spec's file and directory too
    ("", True, False, 1, 1),  # ... but not on tmpfs, which a reboot empties anyway
    ("boot-1", True, True, 0, 0),
])
def test_fsyncs_per_prepare_and_per_unprepare(
    tmp_path: Path, boot_id: str, cdi_tmpfs: bool, state_tmpfs: bool, prepare: int,
    unprepare: int,
) -> None:
    ops = CountingOps()
    p = preparer(tmp_path, ops, boot_id=boot_id, cdi_tmpfs=cdi_tmpfs, state_tmpfs=state_tmpfs)
    p.checkpoint.update(lambda claims: None)  # the lock file, as start-up makes it
    claim = make_claim("c", ["gpu-0"])
    uid = claim["metadata"]["uid"]
    for _ in range(2):
        before = ops.fsyncs
        record = p.prepare(parse_claim(claim))
        assert record.completed and Path(record.spec_path).is_file()
        assert ops.fsyncs - before == prepare
        before = ops.fsyncs
        p.unprepare(uid)
        assert ops.fsyncs - before == unprepare
        assert not Path(record.spec_path).exists()
        assert uid not in CheckpointStore(p.checkpoint.path).claims()


def test_the_gauges_keep_the_newest_snapshot_whatever_order_calls_end_in() -> None:
    from dataclasses import replace as with_

    from agent.checkpoint.model import ClaimRecord, ClaimState, PreparedDevice
    from agent.common.metrics import Metrics
    from agent.prepare.gauges import OrderedGauges

    metrics = Metrics()
    gauges = OrderedGauges(metrics)
    rec = ClaimRecord(uid="u1", namespace="default", name="c",
                      state=ClaimState.PREPARE_COMPLETED,
                      devices=(PreparedDevice(pool=NODE, device="gpu-0", requests=("req",)),))
    older = gauges.take({"u1": rec})  # the prepare's change ran first ...
    newer = gauges.take({})  # ... then the unprepare's
    gauges.show(newer)
    gauges.show(older)  # the prepare's caller sets the gauges last
    assert metrics.registry.get_sample_value("dra_agent_prepared_claims") == 0
    gauges.show(gauges.take({"u1": with_(rec, name="d")}))
    assert metrics.registry.get_sample_value("dra_agent_prepared_claims") == 1
