"""--mig dynamic at prepare: the allocated partition becomes a GPU instance and its compute
instance, the container gets that MIG device, unprepare destroys both; every NVML failure is
the claim's error naming the device and the cause, with nothing left half-made."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent.checkpoint.model import ClaimRecord, ClaimState
from agent.claim.parse import parse_claim
from agent.prepare.effects.migcontrol import PartitionError
from agent.prepare.effects.miginstance import KEY, Instance, instance_of
from agent.prepare.errors import UnknownDeviceError
from cdi.edits import EditsProvider
from discovery.gpulib import (
    GpuIsLostError,
    GpuLibraryError,
    InsufficientResourcesError,
    NoPermissionError,
    Placement,
)
from tests.cdi.fakeroot import FakeHost
from tests.plugnode import make_claim
from tests.prepare.migsetup import MigNode, mig_node

THREE_G = "gpu-0-mig-3g40gb-4"


def prepare(node: MigNode, *devices: str, name: str = "train") -> ClaimRecord:
    return node.preparer.prepare(parse_claim(make_claim(name, list(devices))))


def spec_env(node: MigNode, uid: str) -> list[str]:
    doc: dict[str, Any] = json.loads(node.preparer.builder.specs.path(uid).read_text())
    return [e for d in doc["devices"] for e in d["containerEdits"].get("env", [])]


def test_prepare_creates_the_instance_and_unprepare_destroys_it(tmp_path: Path) -> None:
    node = mig_node(tmp_path)
    record = prepare(node, THREE_G)
    assert record.state is ClaimState.PREPARE_COMPLETED
    [(gi, ci, profile, start)] = node.migs(0)
    assert (ci, profile, start) == (0, 9, 4)
    inst = instance_of(record.devices[0])
    assert inst is not None and (inst.gi, inst.ci) == (gi, 0)
    assert inst.uuid is not None and inst.uuid.startswith("MIG-")
    assert record.devices[0].uuid == inst.uuid
    env = spec_env(node, record.uid)
    key = "DRA_AGENT_DEVICE_GPU_0_MIG_3G40GB_4"
    assert f"{key}_UUID={inst.uuid}" in env
    assert f"{key}_MIG_GI={gi}" in env and f"{key}_MIG_CI=0" in env
    node.preparer.unprepare(record.uid)
    assert node.migs(0) == [] and node.preparer.checkpoint.claims() == {}
    assert not node.preparer.builder.specs.path(record.uid).exists()


def test_two_claims_share_a_gpu_at_disjoint_placements(tmp_path: Path) -> None:
    node = mig_node(tmp_path)
    a = prepare(node, "gpu-0-mig-4g40gb-0", name="a")
    b = prepare(node, "gpu-0-mig-2g20gb-4", "gpu-0-mig-1g10gb-6", name="b")
    assert [m[2:] for m in node.migs(0)] == [(5, 0), (14, 4), (19, 6)]
    assert len({instance_of(d).uuid for d in (*a.devices, *b.devices)}) == 3  # type: ignore[union-attr]
    node.preparer.unprepare(a.uid)
    assert [m[2:] for m in node.migs(0)] == [(14, 4), (19, 6)]


def test_the_spec_carries_the_new_mig_devices_capability_nodes(tmp_path: Path) -> None:
    host = FakeHost(tmp_path / "host")
    for d in (host.root, host.dev, host.proc, host.sys):
        d.mkdir(parents=True)
    host.install_driver()
    host.make_control_nodes()
    host.add_gpu(0, "0000:1b:00.0")
    gi_minor, ci_minor = host.add_mig(0, 1, 0)  # what the driver makes for GI 1 / CI 0
    node = mig_node(tmp_path / "node", edits=EditsProvider(
        host.root, host.dev, host.proc, sysfs_root=host.sys))
    record = prepare(node, THREE_G)
    assert instance_of(record.devices[0]).gi == 1  # type: ignore[union-attr]
    doc = json.loads(node.preparer.builder.specs.path(record.uid).read_text())
    nodes = [n["path"] for n in doc["devices"][0]["containerEdits"]["deviceNodes"]]
    assert nodes == ["/dev/nvidia0", f"/dev/nvidia-caps/nvidia-cap{gi_minor}",
                     f"/dev/nvidia-caps/nvidia-cap{ci_minor}"]


def test_a_placement_another_process_took_is_the_claims_error(tmp_path: Path) -> None:
    node = mig_node(tmp_path)
    node.preparer.inventory()  # published before the other process cut the GPU
    lib = node.nvml
    lib.init()
    lib.create_gpu_instance_with_placement(lib.device_handle_by_index(0), 15, Placement(6, 2))
    lib.shutdown()
    with pytest.raises(PartitionError) as err:
        prepare(node, "gpu-0-mig-3g40gb-4")
    message = str(err.value)
    assert "gpu-0-mig-3g40gb-4" in message and "placement 4:4" in message
    assert "InsufficientResources" in message and "another instance or process" in message
    assert err.value.reason == "mig_partition"
    assert [m[2:] for m in node.migs(0)] == [(15, 6)]  # theirs, untouched; nothing of ours
    assert node.preparer.checkpoint.claims() == {}


@pytest.mark.parametrize("call, error", [
    ("device_count", GpuIsLostError("GPU is lost", call="device_count")),
    ("create_gpu_instance_with_placement",
     NoPermissionError("Insufficient Permissions", call="create_gpu_instance_with_placement")),
    ("create_compute_instance",
     InsufficientResourcesError("no room", call="create_compute_instance")),
    ("device_mig_device_handle_by_index",
     GpuIsLostError("GPU is lost", call="device_mig_device_handle_by_index")),
    ("device_compute_instance_id",
     GpuLibraryError("Unknown Error", call="device_compute_instance_id")),
])
def test_an_nvml_error_at_each_create_call_leaves_nothing(
    tmp_path: Path, call: str, error: GpuLibraryError
) -> None:
    node = mig_node(tmp_path)
    node.nvml.fail(call, error)
    with pytest.raises(PartitionError) as err:
        prepare(node, THREE_G)
    assert THREE_G in str(err.value) and type(error).__name__.removesuffix("Error") in str(
        err.value)
    assert node.migs(0) == []
    assert node.preparer.checkpoint.claims() == {}
    assert list((tmp_path / "cdi").glob("*.json")) == []


def test_a_rollback_that_cannot_destroy_leaves_the_record_for_start_up(tmp_path: Path) -> None:
    node = mig_node(tmp_path)
    node.nvml.fail("create_compute_instance", InsufficientResourcesError("x", call="c"))
    node.nvml.fail("destroy_gpu_instance", GpuIsLostError("lost", call="destroy_gpu_instance"))
    with pytest.raises(PartitionError):
        prepare(node, THREE_G)
    [record] = node.preparer.checkpoint.claims().values()
    assert record.state is ClaimState.PREPARE_STARTED and len(node.migs(0)) == 1
    node.nvml.clear_faults()
    report = node.preparer.recover()
    assert report.partitions_destroyed == (record.uid,)
    assert node.migs(0) == [] and node.preparer.checkpoint.claims() == {}


def test_unprepare_of_a_busy_instance_fails_and_keeps_the_record(tmp_path: Path) -> None:
    node = mig_node(tmp_path)
    record = prepare(node, THREE_G)
    gi = instance_of(record.devices[0]).gi  # type: ignore[union-attr]
    node.nvml.gpus[0].busy.add(gi)  # type: ignore[arg-type]
    with pytest.raises(PartitionError, match=r"InUse .*a process still runs on it"):
        node.preparer.unprepare(record.uid)
    assert record.uid in node.preparer.checkpoint.claims() and node.migs(0)
    node.nvml.gpus[0].busy.clear()
    node.preparer.unprepare(record.uid)
    assert node.migs(0) == [] and node.preparer.checkpoint.claims() == {}


def test_a_partition_of_a_foreign_placement_is_not_offered(tmp_path: Path) -> None:
    node = mig_node(tmp_path)
    with pytest.raises(UnknownDeviceError, match="gpu-4-mig-4g40gb-0"):
        prepare(node, "gpu-4-mig-4g40gb-0")  # GPU 4's slices 0-3 hold someone's 3g
    assert node.migs(4) == [(2, 0, 9, 0)]


def test_the_static_instance_of_a_foreign_gi_is_prepared_without_creating(
    tmp_path: Path,
) -> None:
    node = mig_node(tmp_path)
    record = prepare(node, "gpu-4-mig-3g40gb-0")
    assert KEY not in record.devices[0].extra and node.migs(4) == [(2, 0, 9, 0)]
    node.preparer.unprepare(record.uid)
    assert node.migs(4) == [(2, 0, 9, 0)]  # never destroyed: not ours


def test_start_up_destroys_instances_of_interrupted_prepares_only(tmp_path: Path) -> None:
    node = mig_node(tmp_path)
    kept = prepare(node, "gpu-1-mig-7g80gb-0", name="kept")
    # A prepare that died after its GI was made, before its ids were recorded.
    lib = node.nvml
    lib.init()
    lib.create_gpu_instance_with_placement(lib.device_handle_by_index(0), 9, Placement(0, 4))
    lib.shutdown()
    inst = Instance("", 9, 0, 4, 3)
    uuid = next(g.uuid for g in lib.gpus if g.index == 0)
    stale = ClaimRecord(
        uid="3f1c0c8e-0000-4000-8000-000000000001", namespace="default", name="died",
        state=ClaimState.PREPARE_STARTED,
        devices=(), spec_path="", boot_id="boot-1", updated="",
    )
    from agent.checkpoint.model import PreparedDevice

    held = PreparedDevice(pool="node-a", device="gpu-0-mig-3g40gb-0", requests=("req",),
                          extra={KEY: Instance(uuid, inst.profile_id, 0, 4, 3).to_json()})
    stale = ClaimRecord(**{**{f: getattr(stale, f) for f in stale.__dataclass_fields__},
                           "devices": (held,)})
    node.preparer.checkpoint.update(lambda c: c.__setitem__(stale.uid, stale))
    report = node.preparer.recover()
    assert report.partitions_destroyed == (stale.uid,)
    assert node.migs(0) == [] and [m[2:] for m in node.migs(1)] == [(0, 0)]
    assert node.migs(4) == [(2, 0, 9, 0)]  # foreign, untouched
    assert set(node.preparer.checkpoint.claims()) == {kept.uid}


def test_after_a_reboot_start_up_recreates_a_prepared_claims_partition(tmp_path: Path) -> None:
    node = mig_node(tmp_path)
    record = prepare(node, THREE_G)
    old = instance_of(record.devices[0])
    (tmp_path / "mig-state.json").unlink()  # a reboot: MIG instances do not survive it
    rebooted = mig_node(tmp_path, boot_id="boot-2")
    assert rebooted.migs(0) == []
    report = rebooted.preparer.recover()
    assert report.rebuilt == (record.uid,)
    [(gi, _, profile, start)] = rebooted.migs(0)
    assert (profile, start) == (9, 4)
    fresh = instance_of(rebooted.preparer.checkpoint.claims()[record.uid].devices[0])
    assert fresh is not None and old is not None and fresh.gi == gi
    assert fresh.uuid == next(g for g in rebooted.nvml.gpus if g.index == 0).migs[0].uuid
    assert f"DRA_AGENT_DEVICE_GPU_0_MIG_3G40GB_4_UUID={fresh.uuid}" in spec_env(
        rebooted, record.uid)
