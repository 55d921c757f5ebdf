"""What a prepare changes on the host beyond its files (a VF rebound to ``vf.driver``, a GPU's
time slice) is undone on every path that leaves the claim unprepared: the prepare's own
rollback, start-up after a kill -9 mid-prepare, and an unprepare killed half-way.

As in test_mig_kill.py, the preparer runs in a child that SIGKILLs itself at the failpoint
(no cleanup, no ``finally``). The "hardware" outlives it: the simulated sysfs tree holds the
VFs and their drivers, and the recording GPU control keeps each GPU's interval in a file.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agent.checkpoint.model import ClaimState
from agent.claim.parse import parse_claim
from agent.common.failpoints import FailpointError, Failpoints
from agent.prepare import DevicePreparer
from agent.prepare.effects.timeslice import TimeSliceEffect
from agent.prepare.gpucontrol import RecordingGpuControl
from cdi.edits import EditsProvider
from discovery.scan import DiscoveryOptions, discover
from discovery.sharing import parse_sharing_list
from discovery.simulate import simulated_sources
from discovery.simulate.sriov import SimulatedSriov
from discovery.sources import ProcRoutes, Sources
from tests.plugnode import DRIVER, NODE, device_preparer, make_claim

REPO = Path(__file__).resolve().parents[2]
VF_POINTS = ("vf-after-intent", "vf-after-bound")
TIME_SLICE_POINTS = ("time-slice-after-set",)
#: Every failpoint this file kills at (tests/e2e/test_kill.py checks all are covered).
HOST_POINTS = VF_POINTS + TIME_SLICE_POINTS
VFS = {"vf-0000-3b-00-3": "0000:3b:00.3", "vf-0000-3b-00-4": "0000:3b:00.4"}
SHARING = DiscoveryOptions(sharing=parse_sharing_list(["gpu=shares:4"]))


def _preparer(root: Path, sources: Sources, options: DiscoveryOptions,
              failpoints: Failpoints | None, **kwargs: Any) -> DevicePreparer:
    found = discover(sources, options)
    return device_preparer(root, lambda: found, edits=EditsProvider(simulated=True),
                           failpoints=failpoints, **kwargs)


def vf_preparer(root: Path, failpoints: Failpoints | None = None,
                bandwidth: int | None = None) -> DevicePreparer:
    """--vfs dynamic on the sriov-novfs tree under ``root/sim``, made once by ``vf_node``
    and read as it is here (a restarted agent meets the VFs and drivers the dead one left).
    ``bandwidth``: --vf-bandwidth in Mbit/s, else what ``root/bandwidth`` says (the node's
    setting, which a kill test's child and the restarted preparer both read)."""
    sim = root / "sim"
    sources = Sources(sysfs_root=sim / "sys", gpu=None, dev_root=sim / "dev",
                      routes=ProcRoutes(sim / "proc"), proc_root=sim / "proc",
                      label="simulated sriov-novfs", sriov=SimulatedSriov(sim / "sys"))
    setting = root / "bandwidth"
    if bandwidth is None and setting.exists():
        bandwidth = int(setting.read_text())
    dynamic = DiscoveryOptions(vfs="dynamic", vf_bandwidth_mbps=bandwidth)
    assert sources.sriov is not None
    return _preparer(root, sources, dynamic, failpoints, sriov=sources.sriov,
                     rescan=lambda: discover(sources, dynamic))


def gpu_preparer(root: Path, failpoints: Failpoints | None = None) -> DevicePreparer:
    """dgx-h100 with gpu=shares:4; the GPUs' intervals live in ``root/time-slices.json``."""
    sources = simulated_sources("dgx-h100", root / "sim")
    control = RecordingGpuControl(root / "time-slices.json")
    return _preparer(root, sources, SHARING, failpoints, gpu_control=control)


def vf_node(root: Path) -> DevicePreparer:
    simulated_sources("sriov-novfs", root / "sim")
    return vf_preparer(root)


def driver_of(root: Path, bdf: str) -> str:
    return (root / "sim/sys/bus/pci/devices" / bdf / "driver").resolve().name


def time_slices(root: Path) -> dict[str, str]:
    return RecordingGpuControl(root / "time-slices.json").time_slices


def vf_claim() -> dict[str, Any]:
    return make_claim("dpdk", list(VFS), config=[{"source": "FromClaim", "opaque": {
        "driver": DRIVER, "parameters": {"apiVersion": "dra-agent.io/v1alpha1",
                                         "kind": "DeviceConfig", "vf": {"driver": "vfio-pci"}}}}])


def share_claim(gpus: int = 1) -> dict[str, Any]:
    return make_claim("train", results=[{
        "request": "req", "driver": DRIVER, "pool": NODE, "device": f"gpu-{i}",
        "shareID": f"00000000-0000-4000-8000-{i + 1:012d}", "consumedCapacity": {"shares": "1"}}
        for i in range(gpus)], config=[{"source": "FromClaim", "opaque": {
            "driver": DRIVER, "parameters": {"apiVersion": "dra-agent.io/v1alpha1",
                                             "kind": "DeviceConfig",
                                             "sharing": {"timeSlice": "Long"}}}}])


CHILD = """
import json, sys
from pathlib import Path
from agent.claim.parse import parse_claim
from agent.common.failpoints import Failpoints
from tests.prepare.test_host_undo_kill import gpu_preparer, vf_preparer

root, point, kind, step = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
build = vf_preparer if kind == "vf" else gpu_preparer
preparer = build(root, Failpoints.parse(f"{point}=kill"))
claim = parse_claim(json.loads((root / "claim.json").read_text()))
if step == "prepare":
    preparer.prepare(claim)
else:
    preparer.unprepare(claim.ref.uid)
print("not killed")
"""


def run_child(root: Path, point: str, kind: str, step: str = "prepare") -> None:
    out = subprocess.run([sys.executable, "-c", CHILD, str(root), point, kind, step],
                         cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == -signal.SIGKILL, out.stdout + out.stderr


def uuid_of(preparer: DevicePreparer, name: str) -> str:
    uuid = preparer.inventory().by_name()[name].host.uuid
    assert uuid is not None
    return uuid


@pytest.mark.parametrize("point", VF_POINTS)
def test_kill_while_rebinding_vfs_then_start_up_gives_them_back(tmp_path: Path,
                                                                point: str) -> None:
    vf_node(tmp_path)
    raw = vf_claim()
    (tmp_path / "claim.json").write_text(json.dumps(raw))
    run_child(tmp_path, point, "vf")
    if point == "vf-after-bound":  # the dead agent left both on vfio-pci
        assert {driver_of(tmp_path, bdf) for bdf in VFS.values()} == {"vfio-pci"}

    restarted = vf_preparer(tmp_path)
    report = restarted.recover()
    assert report.rolled_back == (raw["metadata"]["uid"],)
    assert {driver_of(tmp_path, bdf) for bdf in VFS.values()} == {"mlx5_core"}
    assert restarted.checkpoint.claims() == {}
    assert list((tmp_path / "cdi").glob("*.json")) == []

    record = restarted.prepare(parse_claim(raw))  # the kubelet asks again
    assert record.state is ClaimState.PREPARE_COMPLETED
    assert {driver_of(tmp_path, bdf) for bdf in VFS.values()} == {"vfio-pci"}
    restarted.unprepare(record.uid)
    assert {driver_of(tmp_path, bdf) for bdf in VFS.values()} == {"mlx5_core"}


def test_a_failing_prepare_gives_back_every_vf_it_rebound(tmp_path: Path) -> None:
    vf_node(tmp_path)
    failing = vf_preparer(tmp_path, Failpoints.parse("vf-after-bound=error"))
    with pytest.raises(FailpointError):
        failing.prepare(parse_claim(vf_claim()))
    assert {driver_of(tmp_path, bdf) for bdf in VFS.values()} == {"mlx5_core"}
    assert failing.checkpoint.claims() == {}


@pytest.mark.parametrize("point", ["prepare-after-spec-written", "prepare-after-completed"])
def test_a_prepare_failing_after_the_rebind_gives_the_vfs_back(tmp_path: Path,
                                                                point: str) -> None:
    # Even after PrepareCompleted: the rollback drops the record, so what it names goes too.
    vf_node(tmp_path)
    failing = vf_preparer(tmp_path, Failpoints.parse(f"{point}=error"))
    with pytest.raises(FailpointError):
        failing.prepare(parse_claim(vf_claim()))
    assert {driver_of(tmp_path, bdf) for bdf in VFS.values()} == {"mlx5_core"}
    assert failing.checkpoint.claims() == {}


def test_start_up_after_a_reboot_finds_the_vfs_gone_and_says_nothing(tmp_path: Path) -> None:
    vf_node(tmp_path)
    raw = vf_claim()
    (tmp_path / "claim.json").write_text(json.dumps(raw))
    run_child(tmp_path, "vf-after-bound", "vf")
    simulated_sources("sriov-novfs", tmp_path / "sim")  # a reboot: no VFs, none to restore
    report = vf_preparer(tmp_path).recover()
    assert report.rolled_back == (raw["metadata"]["uid"],)
    assert not (tmp_path / "sim/sys/bus/pci/devices/0000:3b:00.3").exists()


def test_kill_after_setting_a_time_slice_then_start_up_resets_it(tmp_path: Path) -> None:
    raw = share_claim()
    (tmp_path / "claim.json").write_text(json.dumps(raw))
    run_child(tmp_path, "time-slice-after-set", "gpu")
    restarted = gpu_preparer(tmp_path)
    gpu0 = uuid_of(restarted, "gpu-0")
    assert time_slices(tmp_path) == {gpu0: "Long"}  # what the dead agent left

    restarted.recover()
    assert time_slices(tmp_path) == {gpu0: "Default"}
    assert restarted.checkpoint.claims() == {}
    record = restarted.prepare(parse_claim(raw))
    assert time_slices(tmp_path) == {gpu0: "Long"}
    restarted.unprepare(record.uid)
    assert time_slices(tmp_path) == {gpu0: "Default"}


def test_start_up_keeps_an_interval_a_prepared_share_still_asks_for(tmp_path: Path) -> None:
    kept = gpu_preparer(tmp_path).prepare(parse_claim(share_claim()))
    other = share_claim()
    other["status"]["allocation"]["devices"]["results"][0]["shareID"] = (
        "00000000-0000-4000-8000-000000000009")
    (tmp_path / "claim.json").write_text(json.dumps(other))
    run_child(tmp_path, "time-slice-after-set", "gpu")
    restarted = gpu_preparer(tmp_path)
    restarted.recover()
    assert time_slices(tmp_path) == {uuid_of(restarted, "gpu-0"): "Long"}  # kept's interval
    assert set(restarted.checkpoint.claims()) == {kept.uid}


def test_a_gpu_refusing_its_interval_resets_the_ones_already_set(tmp_path: Path) -> None:
    preparer = gpu_preparer(tmp_path)
    [control] = [e.control for e in preparer.effects if isinstance(e, TimeSliceEffect)]
    assert isinstance(control, RecordingGpuControl)
    gpu0, gpu1 = uuid_of(preparer, "gpu-0"), uuid_of(preparer, "gpu-1")
    control.failures[gpu1] = "Insufficient Permissions"
    with pytest.raises(Exception, match="setting time slice Long failed"):
        preparer.prepare(parse_claim(share_claim(gpus=2)))
    assert control.time_slices == {gpu0: "Default"}
    assert preparer.checkpoint.claims() == {}


def test_kill_in_unprepare_before_the_record_goes_leaves_no_interval(tmp_path: Path) -> None:
    raw = share_claim()
    (tmp_path / "claim.json").write_text(json.dumps(raw))
    record = gpu_preparer(tmp_path).prepare(parse_claim(raw))
    # The record is still there, the interval is already back: the claim deleted now (the
    # kubelet's retry never comes, or finds nothing) leaves nothing set.
    run_child(tmp_path, "unprepare-after-spec-removed", "gpu", step="unprepare")
    restarted = gpu_preparer(tmp_path)
    assert time_slices(tmp_path) == {uuid_of(restarted, "gpu-0"): "Default"}
    assert set(restarted.checkpoint.claims()) == {record.uid}
    restarted.unprepare(record.uid)  # the kubelet's retry
    assert restarted.checkpoint.claims() == {}


def test_after_a_reboot_start_up_makes_a_prepared_claims_vfs_again(tmp_path: Path) -> None:
    vf_node(tmp_path)
    (tmp_path / "bandwidth").write_text("25000")
    record = vf_preparer(tmp_path).prepare(parse_claim(vf_claim()))
    simulated_sources("sriov-novfs", tmp_path / "sim")  # a reboot: the PF has no VFs again
    assert not (tmp_path / "sim/sys/bus/pci/devices/0000:3b:00.3").exists()

    restarted = vf_preparer(tmp_path)
    restarted.builder.boot_id = "boot-2"
    report = restarted.recover()
    assert report.rebuilt == (record.uid,) and not report.not_rebuilt
    assert {driver_of(tmp_path, bdf) for bdf in VFS.values()} == {"vfio-pci"}
    caps = tmp_path / "sim/sys/bus/pci/devices/0000:3b:00.0/sriov"
    assert [(caps / str(i) / "max_tx_rate").read_text() for i in (1, 2)] == ["25000\n"] * 2
    spec = json.loads(restarted.builder.specs.path(record.uid).read_text())
    env = [e for d in spec["devices"] for e in d["containerEdits"]["env"]]
    assert any(e.startswith("DRA_AGENT_DEVICE_VF_0000_3B_00_3_IOMMU_GROUP=") for e in env)
    restarted.unprepare(record.uid)
    assert {driver_of(tmp_path, bdf) for bdf in VFS.values()} == {"mlx5_core"}
