"""A hostile checkpoint at start-up changes nothing on the host outside what the agent itself
made (#28, findings 1 and 5): a record salvaged from a file whose checksum is wrong only keeps
its devices taken, and every host object a record names (a VF's address, the driver it goes
back to, the PF and index of a cap or a MAC, a MIG instance's GPU, placement and ids, a GPU's
time slice) is checked by its effect against what discovery sees now before anything is
written. Anything else is one log line and left alone; no per-claim problem stops start-up.

Each test plants records on a simulated node (``sriov-novfs``, ``dgx-h100-mig``,
``dgx-h100``) beside a claim the agent prepared itself, then compares the whole simulated
tree (every path, mode and content or link target) and the fake NVML's MIG instances before
and after start-up.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Collection
from pathlib import Path
from typing import Any

import pytest

from agent.checkpoint.codec import checksum
from agent.claim.parse import parse_claim
from agent.prepare import DevicePreparer
from agent.prepare.effects.vfs import VfEffect
from agent.prepare.gpucontrol import RecordingGpuControl
from cdi.edits import EditsProvider
from discovery.gpulib import CI_PROFILE_FULL, Placement
from discovery.scan import DiscoveryOptions, discover
from discovery.sharing import parse_sharing_list
from discovery.simulate import simulated_sources
from discovery.simulate.sriov import SimulatedSriov
from discovery.sources import ProcRoutes, Sources
from tests.plugnode import DRIVER, NODE, device_preparer, make_claim
from tests.prepare.migsetup import MigNode, mig_node

PF0, PF1 = "0000:3b:00.0", "0000:3b:00.1"
POD_MAC = "0c:42:a1:00:00:99"
CHECKSUMS = pytest.mark.parametrize("valid_checksum", [True, False],
                                    ids=["checksum-ok", "checksum-bad"])

Tree = dict[str, tuple[int, bytes]]


def host_tree(root: Path, skip: Collection[str] = ("state", "cdi")) -> Tree:
    """Every path under ``root`` (but the agent's own state and CDI directories) with its
    mode and its content, or its link's target."""
    out: Tree = {}
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = [d for d in dirnames if str((here / d).relative_to(root)) not in skip]
        for name in (*dirnames, *filenames):
            path = here / name
            mode = os.lstat(path).st_mode
            body = (os.readlink(path).encode() if stat.S_ISLNK(mode)
                    else path.read_bytes() if stat.S_ISREG(mode) else b"")
            out[str(path.relative_to(root))] = (mode, body)
    return out


def device(name: str, **extra: Any) -> dict[str, Any]:
    return {"pool": NODE, "device": name, "requests": ["req"], "cdiDeviceIDs": [], **extra}


def record(uid: str, *devices: dict[str, Any], state: str = "PrepareStarted",
           boot: str = "boot-1") -> dict[str, Any]:
    return {"uid": uid, "namespace": "default", "name": "planted", "state": state,
            "devices": list(devices), "cdiAnnotations": {}, "specPath": "", "bootID": boot,
            "updated": "2026-01-01T00:00:00Z"}


def plant(preparer: DevicePreparer, records: list[dict[str, Any]], *,
          valid_checksum: bool) -> None:
    """Add ``records`` to the checkpoint the agent wrote, with a checksum that holds or not."""
    path = preparer.checkpoint.path
    doc = json.loads(path.read_bytes()) if path.exists() else {"schemaVersion": 1,
                                                                "claims": {}}
    for i, rec in enumerate(records):
        rec["uid"] = f"00000000-0000-4000-8000-{i + 1:012d}"
        rec["name"] = f"planted-{i}"
        doc["claims"][rec["uid"]] = rec
    doc["checksum"] = checksum(doc) if valid_checksum else "sha256:" + "0" * 64
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))


# -- VFs: sriov-novfs, the agent's own claim holding a VF of each PF ---------------------------


def vf_preparer(root: Path) -> DevicePreparer:
    """--vfs dynamic --vf-bandwidth 25G on ``root/sim`` as it is (a restarted agent meets the
    VFs and drivers the last one left)."""
    sim = root / "sim"
    sriov = SimulatedSriov(sim / "sys")
    sources = Sources(sysfs_root=sim / "sys", gpu=None, dev_root=sim / "dev",
                      routes=ProcRoutes(sim / "proc"), proc_root=sim / "proc",
                      label="simulated sriov-novfs", sriov=sriov)
    options = DiscoveryOptions(vfs="dynamic", vf_bandwidth_mbps=25_000)
    found = discover(sources, options)
    return device_preparer(root, lambda: found, edits=EditsProvider(simulated=True),
                           sriov=sriov, rescan=lambda: discover(sources, options))


def vf_node(root: Path) -> DevicePreparer:
    """The agent's own claim: VF 1 of PF0 on vfio-pci, VF 1 of PF1 kept as a netdev whose MAC
    its pod set; both capped. Each PF offers 4 VFs (as test_effect_contract's node)."""
    simulated_sources("sriov-novfs", root / "sim")
    for pf in (PF0, PF1):
        (root / "sim/sys/bus/pci/devices" / pf / "sriov_totalvfs").write_text("4\n")
    (root / "victim").mkdir()  # a directory outside sysfs, beside it
    (root / "victim" / "precious").write_text("keep\n")
    preparer = vf_preparer(root)
    claim = make_claim("dpdk", results=[
        {"request": "bind", "driver": DRIVER, "pool": NODE, "device": "vf-0000-3b-00-3"},
        {"request": "net", "driver": DRIVER, "pool": NODE, "device": "vf-0000-3b-08-3"},
    ], config=[{"source": "FromClaim", "requests": ["bind"], "opaque": {
        "driver": DRIVER, "parameters": {"apiVersion": "dra-agent.io/v1alpha1",
                                         "kind": "DeviceConfig", "vf": {"driver": "vfio-pci"}}}}])
    preparer.prepare(parse_claim(claim))
    devices = root / "sim/sys/bus/pci/devices"
    [address] = (devices / PF1 / "virtfn1").glob("net/*/address")
    address.write_text(POD_MAC + "\n")  # the pod's MAC on its netdev VF
    return preparer


def hostile_vf_records() -> list[dict[str, Any]]:
    """Interrupted prepares naming host objects no claim of this node may touch."""
    return [
        # Out of sysfs: pciAddress joined onto /sys/bus/pci/devices.
        record("", device("vf-0000-3b-00-4", pciAddress="../../../../../victim",
                          vfRestoreDriver="mlx5_core")),
        # The PF itself (every NIC function gets driver_override, unbind, drivers_probe).
        record("", device("vf-0000-3b-00-5", pciAddress=PF0, vfRestoreDriver="vfio-pci")),
        # Another PF's VF in the cap: the record's VF is 00.4, the cap names PF1's VF 0.
        record("", device("vf-0000-3b-00-4", pciAddress="0000:3b:00.4",
                          vfRateCap={"pf": PF1, "index": 0})),
        # A driver that is no driver, and addresses that are not a published VF's.
        record("", device("vf-0000-3b-08-2", pciAddress="0000:3b:08.2",
                          vfRestoreDriver="../../../../../victim")),
        record("", device("vf-0000-3b-08-4", pciAddress="0000:3B:08.4",
                          vfRestoreDriver="vfio-pci")),
        record("", device("nic-0000-3b-00-1", pciAddress=PF1, vfRestoreDriver="vfio-pci",
                          vfRateCap={"pf": PF1, "index": 1})),
    ]


@CHECKSUMS
def test_a_hostile_checkpoint_changes_no_vf_pf_or_file_outside_sysfs(
        tmp_path: Path, valid_checksum: bool) -> None:
    plant(vf_node(tmp_path), hostile_vf_records(), valid_checksum=valid_checksum)
    before = host_tree(tmp_path)
    restarted = vf_preparer(tmp_path)
    restarted.recover()
    assert host_tree(tmp_path) == before


@CHECKSUMS
def test_unprepare_of_a_planted_record_unsets_no_other_claims_mac_or_cap(
        tmp_path: Path, valid_checksum: bool) -> None:
    """A completed record naming the MAC and the cap of the agent's own claim's VF, on a VF
    of its own: its unprepare touches neither."""
    planted = record("", device("vf-0000-3b-08-4", pciAddress="0000:3b:08.4",
                                vfMacReset={"pf": PF1, "index": 1},
                                vfRateCap={"pf": PF1, "index": 1}),
                     state="PrepareCompleted")
    plant(vf_node(tmp_path), [planted], valid_checksum=valid_checksum)
    restarted = vf_preparer(tmp_path)
    restarted.recover()
    before = host_tree(tmp_path)
    restarted.unprepare(planted["uid"])
    assert host_tree(tmp_path) == before
    assert planted["uid"] not in restarted.checkpoint.claims()


@CHECKSUMS
def test_an_admin_access_record_naming_the_holders_vfs_changes_neither(
        tmp_path: Path, valid_checksum: bool) -> None:
    """Finding 3: a completed record holding the agent's own claim's VFs with admin access,
    naming their true PF, index and address, as marks prepare never writes for admin access
    (the holder's MAC and cap, a driver to give back): its unprepare touches none of them."""
    planted = record("", device("vf-0000-3b-08-3", pciAddress="0000:3b:08.3",
                                adminAccess=True, vfMacReset={"pf": PF1, "index": 1},
                                vfRateCap={"pf": PF1, "index": 1}),
                     device("vf-0000-3b-00-3", pciAddress="0000:3b:00.3", adminAccess=True,
                            vfRestoreDriver="mlx5_core"), state="PrepareCompleted")
    plant(vf_node(tmp_path), [planted], valid_checksum=valid_checksum)
    restarted = vf_preparer(tmp_path)
    restarted.recover()
    before = host_tree(tmp_path)
    restarted.unprepare(planted["uid"])
    assert host_tree(tmp_path) == before
    assert planted["uid"] not in restarted.checkpoint.claims()


def test_a_salvaged_record_keeps_its_vfs_taken_and_gives_nothing_back(tmp_path: Path) -> None:
    """The agent's own claim, in a file whose checksum is wrong: its VFs stay taken, and
    neither start-up nor its unprepare rebinds or uncaps anything."""
    preparer = vf_node(tmp_path)
    [uid] = preparer.checkpoint.claims()
    plant(preparer, [], valid_checksum=False)
    before = host_tree(tmp_path)
    restarted = vf_preparer(tmp_path)
    restarted.recover()
    assert host_tree(tmp_path) == before
    kept = restarted.checkpoint.claims()[uid]
    assert kept.recovered and {d.device for d in kept.devices} == {"vf-0000-3b-00-3",
                                                                  "vf-0000-3b-08-3"}
    other = make_claim("other", ["vf-0000-3b-00-3"])
    with pytest.raises(Exception, match="already prepared"):
        restarted.prepare(parse_claim(other))
    restarted.unprepare(uid)
    assert host_tree(tmp_path) == before
    assert restarted.prepare(parse_claim(other)).completed


# -- MIG: dgx-h100-mig, the agent's own claim on GPU 0, foreign instances on GPUs 4 and 5 ------


def mig_state(node: MigNode) -> list[tuple[int, list[tuple[int, int, int, int, str]]]]:
    """Every GPU's MIG instances as the fake NVML has them: (GI, CI, profile, start, UUID)."""
    return [(g.index, sorted((m.gi, m.ci, m.profile.id, m.start, m.uuid) for m in g.migs))
            for g in node.nvml.gpus]


def partition(node: MigNode, gpu: int, profile: int, start: int, size: int, slices: int,
              **ids: Any) -> dict[str, Any]:
    parent = next(g.uuid for g in node.nvml.gpus if g.index == gpu)
    return {"parentUUID": parent, "profileID": profile, "start": start, "size": size,
            "slices": slices, **ids}


def hostile_mig_records(node: MigNode) -> list[dict[str, Any]]:
    [(gi4, ci4, _, _)] = node.migs(4)  # 3g.40gb at 0: someone else's, idle
    (gi5, ci5, _, _), _ = node.migs(5)  # 1g.10gb at 0 and 1: someone else's
    uuid5 = next(m.uuid for g in node.nvml.gpus if g.index == 5 for m in g.migs
                 if m.gi == gi5)
    return [
        # Intent only (no ids), at exactly the foreign instance's profile and placement.
        record("", device("gpu-4-mig-3g40gb-0",
                          migPartition=partition(node, 4, 9, 0, 4, 3))),
        # Its GI id, but not its CI nor UUID; and its GI id with a CI it does not have.
        record("", device("gpu-5-mig-1g10gb-0", migPartition=partition(
            node, 5, 19, 0, 1, 1, gi=gi5, ci=ci5 + 1, uuid=uuid5))),
        record("", device("gpu-4-mig-3g40gb-0", migPartition=partition(
            node, 4, 9, 0, 4, 3, gi=gi4, ci=ci4, uuid="MIG-00000000-0000-0000-0000-000000000000"))),
        # Ids matched by placement alone on another device's name, and a GPU nobody has.
        record("", device("gpu-1-mig-1g10gb-3", migPartition=partition(
            node, 5, 19, 1, 1, 1))),
        record("", device("gpu-1-mig-1g10gb-0", migPartition={
            **partition(node, 1, 19, 0, 1, 1), "parentUUID": "GPU-nope"})),
        # Values the record's type would coerce (a string profile, a boolean start).
        record("", device("gpu-4-mig-3g40gb-0", migPartition={
            **partition(node, 4, 9, 0, 4, 3), "profileID": "9", "start": False})),
        # A prepared claim whose partition is not the one published under its device's name.
        record("", device("gpu-1-mig-1g10gb-0", migPartition=partition(node, 1, 19, 3, 1, 1)),
               state="PrepareCompleted"),
    ]


@CHECKSUMS
def test_a_hostile_checkpoint_destroys_and_creates_no_mig_instance(
        tmp_path: Path, valid_checksum: bool) -> None:
    node = mig_node(tmp_path)
    node.preparer.prepare(parse_claim(make_claim("train", ["gpu-0-mig-3g40gb-4",
                                                           "gpu-0-mig-1g10gb-0"])))
    plant(node.preparer, hostile_mig_records(node), valid_checksum=valid_checksum)
    before, instances = host_tree(tmp_path), mig_state(node)
    restarted = mig_node(tmp_path)
    restarted.preparer.recover()
    assert mig_state(restarted) == instances
    assert host_tree(tmp_path) == before


def test_a_salvaged_prepared_claim_gets_no_mig_instance_at_start_up(tmp_path: Path) -> None:
    """A reboot cleared the MIG instances; the record of the claim that had one is in a file
    whose checksum is wrong: start-up creates nothing for it, and its partition stays
    taken."""
    node = mig_node(tmp_path)
    record_ = node.preparer.prepare(parse_claim(make_claim("train", ["gpu-0-mig-1g10gb-0"])))
    plant(node.preparer, [], valid_checksum=False)
    (tmp_path / "mig-state.json").unlink()  # a reboot
    rebooted = mig_node(tmp_path, boot_id="boot-2")
    before = mig_state(rebooted)
    rebooted.preparer.recover()
    assert mig_state(rebooted) == before
    assert rebooted.preparer.checkpoint.claims()[record_.uid].recovered


# -- GPU time slices: dgx-h100, shares ---------------------------------------------------------


def test_a_planted_time_slice_resets_no_gpu(tmp_path: Path) -> None:
    """An interval the operator set on a GPU (nvidia-smi) stays when a record names it for a
    device no share holds, or names no interval at all."""
    control = RecordingGpuControl(tmp_path / "time-slices.json")
    found = discover(simulated_sources("dgx-h100", tmp_path / "sim"),
                     DiscoveryOptions(sharing=parse_sharing_list(["gpu=shares:4"])))
    preparer = device_preparer(tmp_path, lambda: found, edits=EditsProvider(simulated=True),
                               gpu_control=control)
    gpu2 = found.by_name()["gpu-2"].host.uuid
    assert gpu2 is not None
    control.set_time_slice(gpu2, "Short")
    plant(preparer, [record("", device("gpu-2", timeSlice="Long")),
                     record("", device("gpu-2", timeSlice="Forever",
                                       shareID="00000000-0000-4000-8000-000000000009"))],
          valid_checksum=True)
    before = host_tree(tmp_path)
    device_preparer(tmp_path, lambda: found, edits=EditsProvider(simulated=True),
                    gpu_control=RecordingGpuControl(tmp_path / "time-slices.json")).recover()
    assert host_tree(tmp_path) == before


# -- finding 5: no per-claim problem at start-up stops the agent ------------------------------


@pytest.mark.parametrize("sharing", [{"timeSlice": []}, {"timeSlice": {}}, {"mps": [1]}])
def test_a_prepared_claims_unreadable_config_does_not_stop_start_up(
        tmp_path: Path, sharing: dict[str, Any]) -> None:
    """A completed record whose kept allocation holds a config start-up cannot use: its spec
    is not rebuilt (said once), the agent starts, the claim's device stays taken."""
    found = discover(simulated_sources("dgx-h100", tmp_path / "sim"),
                     DiscoveryOptions(sharing=parse_sharing_list(["gpu=shares:4"])))
    preparer = device_preparer(tmp_path, lambda: found, edits=EditsProvider(simulated=True))
    done = preparer.prepare(parse_claim(make_claim("train", ["gpu-0"])))
    doc = json.loads(preparer.checkpoint.path.read_bytes())
    doc["claims"][done.uid]["allocation"]["config"] = [{"source": "FromClaim", "opaque": {
        "driver": DRIVER, "parameters": {"apiVersion": "dra-agent.io/v1alpha1",
                                         "kind": "DeviceConfig", "sharing": sharing}}}]
    doc["checksum"] = checksum(doc)
    preparer.checkpoint.path.write_text(json.dumps(doc))
    rebooted = device_preparer(tmp_path, lambda: found, edits=EditsProvider(simulated=True),
                               boot_id="boot-2")
    report = rebooted.recover()
    assert [uid for uid, _ in report.not_rebuilt] == [done.uid]
    with pytest.raises(Exception, match="already prepared"):
        rebooted.prepare(parse_claim(make_claim("other", ["gpu-0"])))


# -- MIG: what a record without ids may destroy --------------------------------------------------


def empty_gi(node: MigNode, gpu: int, profile: int, start: int, size: int,
             with_ci: bool = False) -> None:
    """A GI made at the placement (as a prepare that died before recording its id left it),
    with its compute instance when ``with_ci``."""
    nvml = node.nvml
    nvml.init()
    handle = nvml.device_handle_by_index(gpu)
    gi = nvml.create_gpu_instance_with_placement(handle, profile, Placement(start, size))
    if with_ci:
        nvml.create_compute_instance(handle, gi.id, CI_PROFILE_FULL[1])
    nvml.shutdown()


@pytest.mark.parametrize(("with_ci", "boot", "also_named", "destroyed"), [
    (False, "boot-1", False, True),  # the prepare that died between the create and its id
    (True, "boot-1", False, False),  # a compute instance: someone's, maybe running
    (False, "boot-0", False, False),  # another boot: it cleared what the record made
    (False, "boot-1", True, False),  # a prepared claim names that placement too
], ids=["empty", "with-ci", "other-boot", "named-twice"])
def test_a_record_without_ids_destroys_only_an_empty_gi_of_its_own_boot(
        tmp_path: Path, with_ci: bool, boot: str, also_named: bool, destroyed: bool) -> None:
    node = mig_node(tmp_path)
    node.preparer.checkpoint.update(lambda claims: None)
    empty_gi(node, 1, 19, 2, 1, with_ci=with_ci)
    intent = partition(node, 1, 19, 2, 1, 1)
    records = [record("", device("gpu-1-mig-1g10gb-2", migPartition=intent), boot=boot)]
    if also_named:
        records.append(record("", device("gpu-1-mig-1g10gb-2", migPartition=intent),
                              state="PrepareCompleted"))
    plant(node.preparer, records, valid_checksum=True)
    restarted = mig_node(tmp_path)
    restarted.preparer.recover()
    assert (restarted.migs(1) == []) is destroyed, restarted.migs(1)


# -- VFs: the driver a VF goes back to -----------------------------------------------------------


class RecordingSriov(SimulatedSriov):
    """The simulated kernel, with every call that changes it written down."""

    def __init__(self, sysfs_root: Path) -> None:
        super().__init__(sysfs_root)
        self.calls: list[tuple[str, ...]] = []

    def bind(self, function: str, driver: str) -> None:
        self.calls.append(("bind", function, driver))
        super().bind(function, driver)

    def set_vf_rate(self, pf: str, index: int, max_mbps: int) -> None:
        self.calls.append(("rate", pf, str(index), str(max_mbps)))
        super().set_vf_rate(pf, index, max_mbps)

    def reset_vf_mac(self, pf: str, index: int) -> None:
        self.calls.append(("mac", pf, str(index)))
        super().reset_vf_mac(pf, index)


@pytest.mark.parametrize("driver", ["../../../../x", "ixgbevf", "", "vfio-pci\n", ".."])
def test_a_vf_goes_back_only_to_a_driver_the_kernel_has(tmp_path: Path, driver: str) -> None:
    """The driver is written to driver_override before anything can refuse it: a name that
    is no driver under /sys/bus/pci/drivers is never handed to the kernel."""
    preparer = vf_node(tmp_path)
    sriov = RecordingSriov(tmp_path / "sim/sys")
    [vfs] = [e for e in preparer.effects if isinstance(e, VfEffect)]
    vfs.control = sriov
    sriov.bind("0000:3b:08.2", "vfio-pci")  # rebound by a prepare that then died
    sriov.calls.clear()
    planted = record("", device("vf-0000-3b-08-2", pciAddress="0000:3b:08.2",
                                vfRestoreDriver=driver))
    plant(preparer, [planted], valid_checksum=True)
    preparer.recover()
    assert sriov.calls == [], sriov.calls
    assert sriov.driver("0000:3b:08.2") == "vfio-pci"


def test_a_vf_goes_back_to_its_recorded_driver(tmp_path: Path) -> None:
    """The same record with a driver the kernel has: the rollback gives the VF back."""
    preparer = vf_node(tmp_path)
    sriov = SimulatedSriov(tmp_path / "sim/sys")
    sriov.bind("0000:3b:08.2", "vfio-pci")
    plant(preparer, [record("", device("vf-0000-3b-08-2", pciAddress="0000:3b:08.2",
                                       vfRestoreDriver="mlx5_core"))], valid_checksum=True)
    vf_preparer(tmp_path).recover()
    assert sriov.driver("0000:3b:08.2") == "mlx5_core"
