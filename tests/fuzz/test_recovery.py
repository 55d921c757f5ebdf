"""Hostile checkpoints through start-up recovery itself (#28, finding 5): random records, with a
checksum that holds or not, naming the node's own VFs, PFs, MIG partitions and GPUs, someone
else's MIG instances, and garbage, in every field an effect acts on. Each case is one start-up
of an agent with every host effect on (dynamic MIG on dgx-h100-mig's GPUs, VFs on sriov-novfs's
PFs, GPU time slices) over the inventory discovery published before the checkpoint was read.

Invariants, after every case:

* ``recover()`` returns: no per-claim problem stops start-up;
* every change to the simulated sysfs tree is to a VF discovery published (its files, its
  driver links, its netdev), its PF's cap of that VF, or a driver the kernel has;
* every MIG instance created or destroyed is at a partition discovery published; someone
  else's instances stay;
* a time slice is set only on a GPU discovery published.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.checkpoint.codec import checksum
from agent.prepare.effects.migcontrol import MigPartitions
from agent.prepare.gpucontrol import RecordingGpuControl
from cdi.edits import EditsProvider
from discovery.gpulib import CI_PROFILE_FULL, Placement
from discovery.model import Device, DeviceType, Inventory
from discovery.partitions import partition_of
from discovery.scan import DiscoveryOptions, discover
from discovery.sharing import parse_sharing_list
from discovery.simulate import FakeNvml, simulated_sources
from discovery.simulate.sriov import SimulatedSriov
from discovery.sources import ProcRoutes, Sources
from tests.fuzz import strategies as fs
from tests.fuzz.report import REPORT
from tests.plugnode import DRIVER, NODE, device_preparer

CASES = 200
FUZZ = settings(max_examples=CASES, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow, HealthCheck.data_too_large])
PFS = ("0000:3b:00.0", "0000:3b:00.1")

Tree = dict[str, tuple[int, bytes]]
#: (GPU UUID, GI profile, placement start) of a MIG instance.
Key = tuple[str, int, int]


def tree(root: Path) -> Tree:
    out: Tree = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in (*dirnames, *filenames):
            path = Path(dirpath) / name
            mode = os.lstat(path).st_mode
            body = (os.readlink(path).encode() if stat.S_ISLNK(mode)
                    else path.read_bytes() if stat.S_ISREG(mode) else b"")
            out[str(path.relative_to(root))] = (mode, body)
    return out


@dataclass
class Host:
    """The simulated machine, as discovery saw it before the checkpoint was read."""

    root: Path
    template: Path
    nvml: FakeNvml
    inventory: Inventory
    pristine: Tree
    cases: int = 0

    @property
    def sys(self) -> Path:
        return self.root / "sim" / "sys"

    def vfs(self) -> dict[str, Device]:
        return {d.host.pci_address or "": d for d in self.inventory.devices
                if d.type == DeviceType.VF}

    def partitions(self) -> set[Key]:
        return {(p.parent_uuid, p.profile_id, p.start) for d in self.inventory.devices
                if (p := partition_of(d)) is not None}

    def gpus(self) -> set[str]:
        return {d.host.uuid for d in self.inventory.devices
                if d.type == DeviceType.GPU and d.host.uuid}


@pytest.fixture(scope="module")
def host() -> Iterator[Host]:
    root = Path(tempfile.mkdtemp(prefix="fr", dir="/tmp"))
    sim = root / "sim"
    simulated_sources("sriov-novfs", sim)
    sriov = SimulatedSriov(sim / "sys")
    for pf in PFS:  # every VF exists: a case binds, caps and resets, never makes VFs
        (sim / "sys/bus/pci/devices" / pf / "sriov_totalvfs").write_text("4\n")
        sriov.set_num_vfs(pf, 4)
    sources = Sources(sysfs_root=sim / "sys", gpu=None, dev_root=sim / "dev",
                      routes=ProcRoutes(sim / "proc"), proc_root=sim / "proc",
                      label="simulated sriov-novfs", sriov=sriov)
    for vf in ("0000:3b:00.3", "0000:3b:08.2"):  # rebound by an agent that then died
        sriov.bind(vf, "vfio-pci")
    nics = discover(sources, DiscoveryOptions(vfs="dynamic", vf_bandwidth_mbps=25_000))
    mig = simulated_sources("dgx-h100-mig", root / "mig")
    assert isinstance(mig.gpu, FakeNvml)
    # What that agent made on GPU 0 (its records named them, so discovery publishes their
    # partitions): a 1g.10gb at 0 with its compute instance, an empty GI at 2.
    nvml = mig.gpu
    nvml.init()
    handle = nvml.device_handle_by_index(0)
    made = nvml.create_gpu_instance_with_placement(handle, 19, Placement(0, 1))
    nvml.create_compute_instance(handle, made.id, CI_PROFILE_FULL[1])
    nvml.create_gpu_instance_with_placement(handle, 19, Placement(2, 1))
    owned = frozenset({(nvml.device_uuid(handle), 19, 0), (nvml.device_uuid(handle), 19, 2)})
    nvml.shutdown()
    gpus = discover(mig, DiscoveryOptions(mig="dynamic", mig_owned=lambda: owned,
                                          sharing=parse_sharing_list(["gpu=shares:4"])))
    template = root / "template"
    shutil.copytree(sim, template, symlinks=True)
    node = Host(root, template, mig.gpu, Inventory(devices=nics.devices + gpus.devices),
                tree(sim))
    try:
        yield node
    finally:
        shutil.rmtree(root, ignore_errors=True)
        REPORT.add_hypothesis({"start-up recoveries": node.cases})


# -- records ------------------------------------------------------------------------------------


def seldom(one_in: int) -> st.SearchStrategy[bool]:
    """True one time in ``one_in`` (hypothesis draws the bounds of a range far more often)."""
    return st.sampled_from([False] * (one_in - 1) + [True])


def sometimes(good: Any, *bad: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``good`` three times in four, else one of ``bad`` (or garbage)."""
    return st.one_of(st.just(good), st.just(good), st.just(good), *bad, fs.junk)


def text(good: str, *bad: st.SearchStrategy[str]) -> st.SearchStrategy[Any]:
    """A string field the record's type reads: ``good``, another string, seldom garbage
    (which makes the whole record unreadable)."""
    return st.one_of(*[st.just(good)] * 6, *bad, fs.names, sometimes(good))


@st.composite
def device_entry(draw: st.DrawFn, host: Host) -> dict[str, Any]:
    """One device of a record: this node's device, with the fields an effect acts on as
    the agent writes them for it, each of them at times another object's or garbage."""
    kinds: dict[str, list[str]] = {}
    for d in host.inventory.devices:
        kinds.setdefault("partition" if partition_of(d) is not None else d.type.value,
                         []).append(d.name)
    # The VFs and the partitions the agent before this one left changed, then any of each.
    name = draw(st.one_of(st.sampled_from(["vf-0000-3b-00-3", "vf-0000-3b-08-2"]),
                          st.sampled_from(["gpu-0-mig-1g10gb-0", "gpu-0-mig-1g10gb-2"]),
                          st.sampled_from(sorted(kinds["gpu"])),
                          st.sampled_from(sorted(kinds["vf"])),
                          st.sampled_from(sorted(kinds["partition"])),
                          st.sampled_from(sorted(n for k, ns in kinds.items()
                                                 if k not in ("vf", "partition") for n in ns)),
                          fs.names))
    found = host.inventory.by_name().get(name)
    out: dict[str, Any] = {"pool": NODE, "device": name, "requests": ["req"],
                           "cdiDeviceIDs": []}
    others = st.sampled_from(sorted(host.vfs()) + list(PFS) + [
        "../../../../../x", "0000:3B:00.3", "0000:3b:00.3\n", "3b:00.3"])
    if found is not None and found.type == DeviceType.VF:
        mark = {"pf": found.host.parent_pf, "index": found.attributes.get("vfIndex")}
        wrong = st.fixed_dictionaries({"pf": st.one_of(st.sampled_from(PFS), fs.names),
                                       "index": st.one_of(st.integers(-1, 5), st.just(True))})
        out["pciAddress"] = draw(text(found.host.pci_address or "", others))
        for key, value in (("vfRestoreDriver", draw(sometimes("mlx5_core", st.sampled_from(
                ["vfio-pci", "", "../x", "ixgbevf"])))), ("vfRateCap", draw(sometimes(
                    mark, wrong))), ("vfMacReset", draw(sometimes(mark, wrong)))):
            if draw(st.booleans()):
                out[key] = value
    part = partition_of(found) if found is not None else None
    if part is not None or draw(seldom(5)):
        gpus = host.nvml.gpus
        intent = {"parentUUID": part.parent_uuid, "profileID": part.profile_id,
                  "start": part.start, "size": part.size, "slices": part.slices} \
            if part is not None else {"parentUUID": draw(st.sampled_from([g.uuid for g in gpus])),
                                      "profileID": 9, "start": 0, "size": 4, "slices": 3}
        foreign = [(m.gi, m.ci, m.uuid) for g in gpus for m in g.migs]
        ids = draw(st.one_of(st.none(), st.none(), st.sampled_from(foreign), st.tuples(
            st.integers(0, 14), st.integers(0, 3), st.just("MIG-x"))))
        if ids is not None:
            intent.update(gi=ids[0], ci=ids[1], uuid=ids[2])
        for key in draw(st.lists(st.sampled_from(sorted(intent)), max_size=1)):
            intent[key] = draw(fs.junk)
        out["migPartition"] = intent
    if (found is not None and found.type == DeviceType.GPU) or draw(seldom(5)):
        out["timeSlice"] = draw(text("Long", st.sampled_from(["Short", "Forever"])))
        if draw(st.booleans()):
            out["shareID"] = draw(text("00000000-0000-4000-8000-000000000001"))
    if draw(seldom(20)):
        out[draw(st.sampled_from(["adminAccess", "requests", "consumedCapacity"]))] = \
            draw(fs.junk)
    return out


def allocation(device: str) -> st.SearchStrategy[dict[str, Any]]:
    """A kept allocation of ``device``, its config hostile (start-up rebuilds specs from it)."""
    params = st.fixed_dictionaries({
        "apiVersion": st.just(f"{DRIVER}/v1alpha1"), "kind": st.just("DeviceConfig")},
        optional={"vf": st.one_of(st.fixed_dictionaries({"driver": st.sampled_from(
                      ["vfio-pci", "netdev"])}), fs.junk),
                  "sharing": st.one_of(st.fixed_dictionaries({}, optional={
                      "timeSlice": st.one_of(st.sampled_from(["Long", "Short"]), fs.junk),
                      "mps": fs.junk}), fs.junk)})
    return st.fixed_dictionaries({
        "results": st.just([{"request": "req", "driver": DRIVER, "pool": NODE,
                             "device": device}]),
        "config": st.lists(st.fixed_dictionaries({
            "source": st.just("FromClaim"),
            "opaque": st.fixed_dictionaries({"driver": st.just(DRIVER),
                                             "parameters": params})}), max_size=1)})


@st.composite
def records(draw: st.DrawFn, host: Host) -> dict[str, Any]:
    devices = draw(st.lists(device_entry(host), min_size=1, max_size=3))
    rec: dict[str, Any] = {
        "namespace": "default", "name": f"fuzz-{draw(st.integers(0, 999))}",
        "state": draw(st.sampled_from(["PrepareStarted"] * 4 + ["PrepareCompleted"] * 3
                                      + ["Bogus"])),
        "devices": devices, "cdiAnnotations": {}, "specPath": "",
        "bootID": draw(st.sampled_from(["boot-1", "boot-1", "boot-0", ""])), "updated": "",
    }
    if draw(st.booleans()):
        rec["allocation"] = draw(fs.junk) if draw(seldom(8)) \
            else draw(allocation(devices[0]["device"]))
    if draw(seldom(20)):
        rec[draw(st.sampled_from(["recovered", "deviceMetadata", "uid", "devices"]))] = \
            draw(fs.junk)
    return rec


# -- the invariants -----------------------------------------------------------------------------


def allowed_change(host: Host, path: str, before: Tree, after: Tree) -> bool:
    """A change to what discovery published: a published VF's own files and links, its PF's
    cap of it, a driver's directory of a driver the kernel has."""
    vfs = host.vfs()
    targets = b"".join(t[1] for t in (before.get(path), after.get(path)) if t)
    if any(a in path.split("/") or a.encode() in targets for a in vfs):
        return True
    indexes = {(d.host.parent_pf, str(d.attributes.get("vfIndex"))) for d in vfs.values()}
    cap = re.fullmatch(r"sys/devices/.*/([0-9a-f:.]+)/sriov(?:/(\d+)(?:/max_tx_rate)?)?", path)
    if cap and ((cap[2] is None and cap[1] in PFS) or (cap[1], cap[2]) in indexes):
        return True
    return bool(re.fullmatch(r"sys/bus/pci/drivers/(" + "|".join(
        map(re.escape, SimulatedSriov.DRIVERS)) + ")", path))


def instances(nvml: FakeNvml) -> set[Key]:
    return {(g.uuid, m.profile.id, m.start) for g in nvml.gpus for m in g.migs}


def test_fuzzed_checkpoints_through_start_up_recovery(host: Host) -> None:
    foreign = {k for k in instances(host.nvml) if k not in host.partitions()}
    assert len(foreign) == 3  # GPU 4's and GPU 5's, someone else's

    @FUZZ
    @given(recs=st.lists(records(host), min_size=1, max_size=3),
           resign=st.sampled_from([True, True, True, False]))
    def case(recs: list[dict[str, Any]], resign: bool) -> None:
        host.cases += 1
        for sub in ("state", "cdi"):
            shutil.rmtree(host.root / sub, ignore_errors=True)
        doc: dict[str, Any] = {"schemaVersion": 1, "claims": {
            f"00000000-0000-4000-8000-{i:012d}": r for i, r in enumerate(recs)}}
        try:
            doc["checksum"] = checksum(doc) if resign else "sha256:" + "0" * 64
        except (UnicodeEncodeError, RecursionError):  # a lone surrogate: no checksum holds
            doc["checksum"] = "sha256:" + "0" * 64
        raw = json.dumps(doc).encode()
        (host.root / "state").mkdir()
        (host.root / "state" / "checkpoint.json").write_bytes(raw)
        nvml = FakeNvml(copy.deepcopy(host.nvml.gpus), driver=host.nvml.driver,
                        cuda=host.nvml.cuda)
        control = RecordingGpuControl()
        sriov = SimulatedSriov(host.sys)
        preparer = device_preparer(
            host.root, lambda: host.inventory, edits=EditsProvider(simulated=True),
            boot_id="boot-1", mig=MigPartitions(nvml), sriov=sriov,
            rescan=lambda: host.inventory, gpu_control=control)
        before = instances(nvml)
        preparer.recover()  # never raises
        preparer.close()

        changed = instances(nvml) ^ before
        assert changed <= host.partitions(), changed
        assert foreign <= instances(nvml)
        assert set(control.time_slices) <= host.gpus(), control.time_slices
        after = tree(host.root / "sim")
        if after != host.pristine:
            wrong = [p for p in set(after) | set(host.pristine)
                     if after.get(p) != host.pristine.get(p)
                     and not allowed_change(host, p, host.pristine, after)]
            assert not wrong, wrong
            shutil.rmtree(host.root / "sim")  # back to the tree discovery saw
            shutil.copytree(host.template, host.root / "sim", symlinks=True)
        assert not (host.root / "x").exists()

    case()
    assert host.cases >= CASES


def test_the_invariant_sees_a_write_outside_what_was_published(host: Host) -> None:
    """The check above would catch the writes finding 1 made: a PF's driver, a file beside
    sysfs, another PF's cap."""
    pf0 = f"sys/bus/pci/devices/{PFS[0]}/driver_override"
    assert not allowed_change(host, pf0, {}, {pf0: (0, b"vfio-pci")})
    assert not allowed_change(host, "sys/../x", {}, {})
    assert not allowed_change(host, "sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.1/sriov/9"
                                    "/max_tx_rate", {}, {})
