"""One contract for every host effect (``agent.prepare.effects``, #29 step 1), run against each
one the wiring builds, each on its simulated node: apply, kill, reapply, release, idempotence.

Every case says how to build a preparer with its effect on (``Case.build``), a claim that
exercises it, and a probe of the host state the effect owns: MIG instances on the fake GPU,
the VFs' drivers, caps and MACs in the simulated sysfs, the GPUs' intervals in
RecordingGpuControl's file, the metadata files on disk, the MPS server's limits in
RecordingMpsControl's file beside what MPS plans into the spec (env and mount). The contract
asserts end
states only, by the probe, the checkpoint and the recovery report, never how an effect gets
there: a new effect gets a case (``test_every_effect_the_wiring_builds_has_a_case``) and
nothing else here changes.

The kill is a real ``kill -9`` (the preparer runs in a child that SIGKILLs itself at a
failpoint, as test_host_undo_kill.py's ``run_child``); every effect has a point right after
its change and before PrepareCompleted (``Case.kill_at``), so no case falls back to ``=error``.
"""

from __future__ import annotations

import atexit
import copy
import functools
import json
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import pytest

from agent.checkpoint.model import ClaimState
from agent.checkpoint.store import CheckpointStore
from agent.claim.model import ClaimError
from agent.claim.parse import parse_claim
from agent.common.failpoints import Failpoints, Point
from agent.daemon import wiring
from agent.netdev.install import HookLaunch
from agent.prepare import DevicePreparer
from agent.prepare.claimmetadata import ClaimMetadata
from agent.prepare.effects.base import BaseEffect
from agent.prepare.effects.metadata import MetadataEffect
from agent.prepare.effects.mig import MigEffect
from agent.prepare.effects.migcontrol import MigPartitions
from agent.prepare.effects.miginstance import owned_instances
from agent.prepare.effects.mps import MpsEffect
from agent.prepare.effects.netdev import NetdevEffect
from agent.prepare.effects.passthrough import PassthroughEffect
from agent.prepare.effects.timeslice import TimeSliceEffect
from agent.prepare.effects.vfs import VfEffect
from agent.prepare.errors import AdminAccessError
from agent.prepare.gpucontrol import RecordingGpuControl
from agent.prepare.metadatafiles import HostMetadataFiles
from agent.prepare.mpscontrol import RecordingMpsControl
from agent.prepare.recovery import RecoveryReport
from cdi.edits import EditsProvider
from discovery.model import Device, DeviceType, HostInfo, Inventory
from discovery.scan import DiscoveryOptions, discover
from discovery.sharing import parse_sharing_list
from discovery.simulate import FakeNvml, simulated_sources
from discovery.simulate.pcibind import SimulatedPciDrivers
from discovery.simulate.sriov import SimulatedSriov
from discovery.sources import ProcRoutes, Sources
from tests.netdev.fakehost import RecordingNetdevHost
from tests.passthrough.node import driver_of, make_node, vm_claim
from tests.passthrough.node import preparer as passthrough_preparer
from tests.plugnode import DRIVER, NODE, device_preparer, gpu, make_claim

REPO = Path(__file__).resolve().parents[2]


class Build(Protocol):
    """A preparer of the case's node under ``root``, as a (re)started agent builds it."""

    def __call__(self, root: Path, *, boot_id: str = "boot-1",
                 failpoints: Failpoints | None = None) -> DevicePreparer: ...


@dataclass(frozen=True)
class Case:
    effect: type[BaseEffect]
    #: The node's hardware, made once before the first preparer.
    setup: Callable[[Path], None]
    build: Build
    claim: Callable[[], dict[str, Any]]
    #: The host state the effect owns, comparable with ``==``.
    probe: Callable[[Path, DevicePreparer], object]
    #: What the probe shows once the claim is prepared.
    applied: object
    #: What a reboot resets of this hardware (the CDI directory, tmpfs, goes for every case).
    reboot: Callable[[Path], None]
    #: The failpoint right after the effect's change, before PrepareCompleted.
    kill_at: Point
    #: The effect saves the record durably before its change, so start-up rolls that record
    #: back; else the change is a file start-up finds with no record (spec, metadata) and
    #: removes as an orphan (``DevicePreparer.prepare``: PrepareStarted is not fsynced).
    intent_durable: bool
    #: ``effect.touches(record)``: False for a plan-only effect, whose trace is the spec.
    recorded: bool = True
    #: What the claim's pod does to the state the effect owns while it runs (release
    #: undoes that too).
    workload: Callable[[Path], None] | None = None
    #: The probe's part that is the owner's claim: an admin-access claim may have state of
    #: its own (its metadata files), never a change to what the owner holds.
    owners: Callable[[Any], object] = lambda probed: probed


def _nothing(root: Path) -> None:
    return None


# -- MIG: dynamic partitions on a simulated dgx-h100-mig (as tests/prepare/migsetup.py) ------

MIG_DEVICES = ["gpu-0-mig-3g40gb-4", "gpu-0-mig-1g10gb-0"]


@functools.cache
def simulated(profile: str) -> Sources:
    """``profile``'s tree, generated once per process (the bulk of a case's cost; nothing
    here writes to it); it goes when the process exits. The inventory discovered from it
    names none of its paths (``EditsProvider(simulated=True)``: env edits only)."""
    tree = tempfile.TemporaryDirectory(prefix="effect-contract-")
    atexit.register(tree.cleanup)
    return simulated_sources(profile, Path(tree.name))


def mig_build(root: Path, *, boot_id: str = "boot-1",
              failpoints: Failpoints | None = None) -> DevicePreparer:
    """migsetup.py's node over the shared tree: the GPUs' MIG instances persist in
    ``root/mig-state.json`` (the "hardware"), each preparer's NVML a fresh copy of the
    profile's GPUs that loads them."""
    template = simulated("dgx-h100-mig").gpu
    assert isinstance(template, FakeNvml)
    nvml = FakeNvml(copy.deepcopy(template.gpus), driver=template.driver, cuda=template.cuda,
                    state_path=root / "mig-state.json")
    sources = replace(simulated("dgx-h100-mig"), gpu=nvml)
    checkpoint = CheckpointStore(root / "state" / "checkpoint.json")
    found = discover(sources, DiscoveryOptions(
        mig="dynamic", mig_owned=lambda: owned_instances(checkpoint.claims())))
    return device_preparer(root, lambda: found, edits=EditsProvider(simulated=True),
                           checkpoint=checkpoint, boot_id=boot_id, failpoints=failpoints,
                           mig=MigPartitions(nvml, failpoints))


def mig_probe(root: Path, preparer: DevicePreparer) -> object:
    """(profile, start) of each GPU's instances, by GPU index: the GPU instance ids NVML
    hands out may differ after a reboot, the placement the claim was allocated may not. GPUs
    4 and 5 hold the profile's own, no claim's: never touched."""
    [mig] = [e for e in preparer.effects if isinstance(e, MigEffect)]
    nvml = mig.partitions.lib
    assert isinstance(nvml, FakeNvml)
    return {g.index: sorted((m.profile.id, m.start) for m in g.migs) for g in nvml.gpus
            if g.migs}


def mig_reboot(root: Path) -> None:
    (root / "mig-state.json").unlink()  # MIG instances do not survive a reboot


MIG = Case(
    effect=MigEffect, setup=_nothing, build=mig_build,
    claim=lambda: make_claim("train", MIG_DEVICES), probe=mig_probe,
    applied={0: [(9, 4), (19, 0)], 4: [(9, 0)], 5: [(19, 0), (19, 1)]},
    reboot=mig_reboot,
    # The first of the claim's two partitions made, its ids in the record (not durably).
    kill_at=Point.MIG_AFTER_IDS_RECORDED,
    intent_durable=True,
)

# -- VFs: on demand, rebound and capped, on the simulated sriov-novfs tree --------------------

PF0, PF1 = "0000:3b:00.0", "0000:3b:00.1"
#: VF bdf -> its index on PF0: the one the claim rebinds to vfio-pci, the one it keeps on
#: the PF's driver (with a netdev whose MAC the pod sets).
VFS = {"0000:3b:00.3": 1, "0000:3b:00.4": 2}
VF_RATE = 25_000
POD_MAC = "0c:42:a1:00:00:99"


def vf_setup(root: Path) -> None:
    """sriov-novfs, its PFs' firmware exposing 4 VFs (sriov_totalvfs) rather than 64: the
    same kernel paths, a sixteenth of the VFs to make and to read back at each prepare."""
    simulated_sources("sriov-novfs", root / "sim")
    for pf in (PF0, PF1):
        (root / "sim/sys/bus/pci/devices" / pf / "sriov_totalvfs").write_text("4\n")


def vf_build(root: Path, *, boot_id: str = "boot-1",
             failpoints: Failpoints | None = None) -> DevicePreparer:
    """--vfs dynamic --vf-bandwidth 25G on the tree as it is (a restarted agent meets the VFs
    and drivers the dead one left)."""
    sim = root / "sim"
    sriov = SimulatedSriov(sim / "sys")
    sources = Sources(sysfs_root=sim / "sys", gpu=None, dev_root=sim / "dev",
                      routes=ProcRoutes(sim / "proc"), proc_root=sim / "proc",
                      label="simulated sriov-novfs", sriov=sriov)
    options = DiscoveryOptions(vfs="dynamic", vf_bandwidth_mbps=VF_RATE)
    found = discover(sources, options)
    return device_preparer(root, lambda: found, edits=EditsProvider(simulated=True),
                           boot_id=boot_id, failpoints=failpoints, sriov=sriov,
                           rescan=lambda: discover(sources, options))


def _pf(root: Path) -> Path:
    return root / "sim/sys/bus/pci/devices" / PF0


def vf_probe(root: Path, preparer: DevicePreparer) -> object:
    """Each VF's (driver, max_tx_rate, whether it has the pod's MAC).

    The VF count is not the effect's to undo (vfs.py: the VFs of a PF are made once and
    stay, idle, for the next claim), so a VF not made yet reads as the VF it will be: on its
    PF's driver, uncapped (the kernel's 0), no MAC of a pod's.
    """
    sriov = SimulatedSriov(root / "sim/sys")
    out: dict[str, tuple[str | None, int, bool]] = {}
    for bdf, index in VFS.items():
        rate = _pf(root) / "sriov" / str(index) / "max_tx_rate"
        macs = [p.read_text().strip() for p in (_pf(root) / f"virtfn{index}").glob(
            "net/*/address")]
        out[bdf] = (sriov.driver(bdf) if sriov.exists(bdf) else sriov.driver(PF0),
                    int(rate.read_text()) if rate.exists() else 0, POD_MAC in macs)
    return out


def vf_claim() -> dict[str, Any]:
    return make_claim("dpdk", results=[
        {"request": "bind", "driver": DRIVER, "pool": NODE, "device": "vf-0000-3b-00-3"},
        {"request": "net", "driver": DRIVER, "pool": NODE, "device": "vf-0000-3b-00-4"},
    ], config=[{"source": "FromClaim", "requests": ["bind"], "opaque": {
        "driver": DRIVER, "parameters": {"apiVersion": "dra-agent.io/v1alpha1",
                                         "kind": "DeviceConfig", "vf": {"driver": "vfio-pci"}}}}])


def vf_workload(root: Path) -> None:
    """The pod sets its netdev VF's MAC (on the PF, as ``ip link set PF vf N mac`` does)."""
    [address] = (_pf(root) / f"virtfn{VFS['0000:3b:00.4']}").glob("net/*/address")
    address.write_text(POD_MAC + "\n")


VF = Case(
    effect=VfEffect, setup=vf_setup, build=vf_build, claim=vf_claim, probe=vf_probe,
    applied={"0000:3b:00.3": ("vfio-pci", VF_RATE, False),
             "0000:3b:00.4": ("mlx5_core", VF_RATE, False)},
    reboot=vf_setup,  # a reboot: the PF has no VFs again
    kill_at=Point.VF_AFTER_BOUND,  # rebound and capped, nothing read back, no spec
    intent_durable=True, workload=vf_workload,
)

# -- GPU shares: time slices (RecordingGpuControl) and MPS, on dgx-h100 with gpu=shares:4 -----

SHARING = DiscoveryOptions(sharing=parse_sharing_list(["gpu=shares:4"]))
MPS_PIPE_DIR = Path("/run/nvidia-mps")  # named in the spec; its daemon is the stand-in's file


def gpu_build(root: Path, *, boot_id: str = "boot-1",
              failpoints: Failpoints | None = None) -> DevicePreparer:
    """The GPUs' intervals live in ``root/time-slices.json``, as a GPU keeps its interval
    when the agent dies; the MPS server's limits in ``root/mps-limits.json``, as the MPS
    control daemon keeps them."""
    found = discover(simulated("dgx-h100"), SHARING)
    return device_preparer(root, lambda: found, edits=EditsProvider(simulated=True),
                           boot_id=boot_id, failpoints=failpoints, mps_pipe_dir=MPS_PIPE_DIR,
                           gpu_control=RecordingGpuControl(root / "time-slices.json"),
                           mps_control=RecordingMpsControl(root / "mps-limits.json"))


def share_claim(**sharing: Any) -> dict[str, Any]:
    return make_claim("train", results=[{
        "request": "req", "driver": DRIVER, "pool": NODE, "device": "gpu-0",
        "shareID": "00000000-0000-4000-8000-000000000001", "consumedCapacity": {"shares": "1"}}],
        config=[{"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": {
            "apiVersion": "dra-agent.io/v1alpha1", "kind": "DeviceConfig",
            "sharing": sharing}}}])


def time_slice_probe(root: Path, preparer: DevicePreparer) -> object:
    """The intervals other than Default: a GPU the file does not name runs the driver's
    Default, and the claim's one GPU is the only one it may change."""
    slices = RecordingGpuControl(root / "time-slices.json").time_slices
    return sorted(level for level in slices.values() if level != "Default")


def time_slice_reboot(root: Path) -> None:
    (root / "time-slices.json").unlink()  # the driver forgets the interval


TIME_SLICE = Case(
    effect=TimeSliceEffect, setup=_nothing, build=gpu_build,
    claim=lambda: share_claim(timeSlice="Long"), probe=time_slice_probe, applied=["Long"],
    reboot=time_slice_reboot,
    kill_at=Point.TIME_SLICE_AFTER_SET,  # the GPU's interval set, no spec yet
    intent_durable=True,
)


def mps_probe(root: Path, preparer: DevicePreparer) -> object:
    """The MPS server's limits other than MPS's defaults (a thread percentage of 100, no
    memory limit: none is set for the dgx-h100's shares of threads), and the MPS client
    variables and mounts of each claim spec on disk."""
    daemon = RecordingMpsControl(root / "mps-limits.json")
    limits = {"threads": daemon.thread_percentage} if daemon.thread_percentage not in (
        None, 100) else {}
    out = []
    for path in sorted((root / "cdi").glob("*.json")):
        for device in json.loads(path.read_text())["devices"]:
            edits = device["containerEdits"]
            out.append((sorted(e for e in edits.get("env", []) if e.startswith("CUDA_")),
                        edits.get("mounts", [])))
    return limits, daemon.pinned_mib, out


def mps_reboot(root: Path) -> None:
    # The control daemon forgets its limits when it quits ("The set value is lost if a quit
    # command is executed"), and a reboot ends it.
    (root / "mps-limits.json").unlink()


MPS = Case(
    effect=MpsEffect, setup=_nothing, build=gpu_build,
    claim=lambda: share_claim(mps=True), probe=mps_probe,
    applied=({"threads": 25}, {}, [(
        ["CUDA_DEVICE_ORDER=PCI_BUS_ID", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25",
         f"CUDA_MPS_PIPE_DIRECTORY={MPS_PIPE_DIR}"],
        [{"hostPath": str(MPS_PIPE_DIR), "containerPath": str(MPS_PIPE_DIR),
          "options": ["rbind", "rw"]}])]),
    reboot=mps_reboot,
    kill_at=Point.PREPARE_AFTER_SPEC_WRITTEN,  # the server's limit set and the spec written
    intent_durable=True,
    # A spec with no MPS edits is another claim's (an admin-access one's): not the owner's.
    owners=lambda probed: (*probed[:2], [spec for spec in probed[2] if spec != ([], [])]),
)

# -- Device metadata files (KEP-5304) -------------------------------------------------------

METADATA_DIR = "dra-device-metadata"


def metadata_build(root: Path, *, boot_id: str = "boot-1",
                   failpoints: Failpoints | None = None) -> DevicePreparer:
    metadata = ClaimMetadata(DRIVER, HostMetadataFiles(root / METADATA_DIR), True)
    return device_preparer(root, lambda: Inventory(devices=(gpu(0),)), boot_id=boot_id,
                           failpoints=failpoints, metadata=metadata)


def metadata_probe(root: Path, preparer: DevicePreparer) -> object:
    """Every directory and file under the metadata root; a file as the devices it names."""
    base = root / METADATA_DIR
    return {str(p.relative_to(base)): [d["name"] for r in json.loads(p.read_text())["requests"]
                                       for d in r["devices"]] if p.is_file() else "dir"
            for p in sorted(base.rglob("*"))}


def metadata_reboot(root: Path) -> None:
    # As test_device_metadata.py's reboot: the file is lost with tmpfs.
    shutil.rmtree(root / METADATA_DIR)


METADATA = Case(
    effect=MetadataEffect, setup=_nothing, build=metadata_build,
    claim=lambda: make_claim("train", ["gpu-0"]), probe=metadata_probe,
    applied={"default_train": "dir", "default_train/req": "dir",
             "default_train/req/metadata.json": ["gpu-0"]},
    reboot=metadata_reboot,
    kill_at=Point.PREPARE_AFTER_SPEC_WRITTEN,  # the first point after the files are written
    intent_durable=False,
    owners=lambda probed: {k: v for k, v in probed.items() if k.startswith("default_train")},
)

# -- A moved interface configured in the pod, RDMA exclusive (RecordingNetdevHost) ---------

NETDEV_NIC = Device(name="nic-0", type=DeviceType.NIC, attributes={}, capacity={},
                    host=HostInfo(pci_address="0000:30:00.0", if_name="ens0",
                                  rdma_device="mlx5_0"))
NETDEV_HOOK = HookLaunch("/hook/ld.so", ("/hook/ld.so", "-I", "-m", "agent.netdev.hook"))


def netdev_build(root: Path, *, boot_id: str = "boot-1",
                 failpoints: Failpoints | None = None) -> DevicePreparer:
    """Where each RDMA device is lives in ``root/rdma-netns.json``, as the kernel keeps it."""
    def inventory() -> Inventory:
        return Inventory(devices=(NETDEV_NIC,))

    effect = NetdevEffect(root / "netdev", lambda: NETDEV_HOOK,
                          RecordingNetdevHost(root / "rdma-netns.json"), inventory)
    return device_preparer(root, inventory, boot_id=boot_id, failpoints=failpoints,
                           netdev=effect)


def _spec_hook_args(root: Path) -> list[list[str]]:
    return [h["args"] for p in sorted((root / "cdi").glob("*.json"))
            for d in json.loads(p.read_text())["devices"]
            for h in d["containerEdits"].get("hooks", [])]


def netdev_probe(root: Path, preparer: DevicePreparer) -> object:
    """The hooks the specs name (their arguments less the claim's own), the RDMA devices in
    a pod's namespace, the hook's records."""
    hooks = [[a for a in args if not a.startswith(("--claim=", "--state="))]
             for args in _spec_hook_args(root)]
    records = sorted(str(p.relative_to(root)) for p in (root / "netdev").rglob("*.json"))
    return hooks, RecordingNetdevHost(root / "rdma-netns.json").in_pods, bool(records)


def netdev_workload(root: Path) -> None:
    """The pod starts: its hook records where the RDMA device goes, then moves it there."""
    [args] = _spec_hook_args(root)
    state = Path(next(a for a in args if a.startswith("--state=")).split("=", 1)[1])
    state.parent.mkdir(parents=True, exist_ok=True)
    state.write_text(json.dumps({"rdmaDevice": "mlx5_0", "netns": "/run/netns/cni-1",
                                 "inode": 4026532999}))
    RecordingNetdevHost(root / "rdma-netns.json").hook_moved("mlx5_0", "/run/netns/cni-1")


def netdev_reboot(root: Path) -> None:
    # Every pod namespace is gone: the kernel has every RDMA device back in init_net.
    (root / "rdma-netns.json").unlink(missing_ok=True)


NETDEV = Case(
    effect=NetdevEffect, setup=_nothing, build=netdev_build,
    claim=lambda: make_claim("rdma", ["nic-0"], config=[{
        "source": "FromClaim", "requests": [], "opaque": {"driver": DRIVER, "parameters": {
            "apiVersion": "dra-agent.io/v1alpha1", "kind": "DeviceConfig",
            "netdev": {"move": True, "interfaceName": "net1",
                       "addresses": ["192.0.2.10/24"], "rdma": "exclusive"}}}}]),
    probe=netdev_probe,
    applied=([[*NETDEV_HOOK.args, "--interface=net1",
               '--config={"addresses":["192.0.2.10/24"],"rdma":"exclusive"}',
               "--rdma-device=mlx5_0"]], {}, False),
    reboot=netdev_reboot,
    kill_at=Point.PREPARE_AFTER_SPEC_WRITTEN,  # the RDMA device recorded, the spec written
    intent_durable=True, workload=netdev_workload,
)

# -- GPU passthrough: an MI210 of passthrough-amd bound to vfio-pci (tests/passthrough) --------

PASSTHROUGH_GPU = "0000:23:00.0"


def passthrough_setup(root: Path) -> None:
    make_node(root, "amd")  # a boot, too: every GPU on its driver


def passthrough_build(root: Path, *, boot_id: str = "boot-1",
                      failpoints: Failpoints | None = None) -> DevicePreparer:
    return passthrough_preparer(root, failpoints, boot_id=boot_id)


PASSTHROUGH = Case(
    effect=PassthroughEffect, setup=passthrough_setup, build=passthrough_build,
    claim=lambda: vm_claim("gpu-vfio-0000-23-00-0"),
    probe=lambda root, preparer: driver_of(root, PASSTHROUGH_GPU), applied="vfio-pci",
    reboot=passthrough_setup,  # the GPU is amdgpu's again
    kill_at=Point.GPU_VFIO_AFTER_BOUND,  # bound, not read back, no spec
    intent_durable=True,
)

CASES = {c.effect.__name__: c for c in (MIG, VF, TIME_SLICE, MPS, METADATA, NETDEV,
                                        PASSTHROUGH)}
every_case = pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))


def test_every_effect_the_wiring_builds_has_a_case(tmp_path: Path) -> None:
    built = wiring.effects(
        lambda: Inventory(devices=()), metadata=ClaimMetadata(DRIVER, None, True),
        mps_pipe_dir=MPS_PIPE_DIR, gpu_control=RecordingGpuControl(),
        mig=MigPartitions(FakeNvml([])), sriov=SimulatedSriov(tmp_path),
        rescan=lambda: Inventory(devices=()), failpoints=None,
        netdev=NetdevEffect(tmp_path, lambda: None, RecordingNetdevHost(tmp_path / "r.json"),
                            lambda: Inventory(devices=())),
        pci_drivers=SimulatedPciDrivers(tmp_path))
    assert sorted(type(e).__name__ for e in built) == sorted(CASES)


# -- the contract -----------------------------------------------------------------------------


def node(case: Case, root: Path) -> DevicePreparer:
    case.setup(root)
    return case.build(root)


def the_effect(case: Case, preparer: DevicePreparer) -> BaseEffect:
    [effect] = [e for e in preparer.effects if isinstance(e, case.effect)]
    return effect


def reboot(case: Case, root: Path) -> DevicePreparer:
    """The node rebooted: its hardware reset, tmpfs (the CDI specs) gone, a new boot ID."""
    case.reboot(root)
    shutil.rmtree(root / "cdi", ignore_errors=True)
    return case.build(root, boot_id="boot-2")


def cdi_ids(record: Any) -> list[str]:
    return [i for d in record.devices for i in d.cdi_ids]


CHILD = """
import json, sys
from pathlib import Path
from agent.claim.parse import parse_claim
from agent.common.failpoints import Failpoints
from tests.prepare.test_effect_contract import CASES

root, case, point = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
preparer = CASES[case].build(root, failpoints=Failpoints.parse(f"{point}=kill"))
preparer.prepare(parse_claim(json.loads((root / "claim.json").read_text())))
print("not killed")
"""


def run_child(root: Path, case: Case, raw: dict[str, Any]) -> None:
    (root / "claim.json").write_text(json.dumps(raw))
    out = subprocess.run([sys.executable, "-c", CHILD, str(root), case.effect.__name__,
                          case.kill_at.value], cwd=REPO, capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == -signal.SIGKILL, out.stdout + out.stderr


@every_case
def test_apply_makes_the_change_and_the_record_names_it(case: Case, tmp_path: Path) -> None:
    preparer = node(case, tmp_path)
    before = case.probe(tmp_path, preparer)
    record = preparer.prepare(parse_claim(case.claim()))
    assert record.state is ClaimState.PREPARE_COMPLETED
    assert case.probe(tmp_path, preparer) == case.applied != before
    stored = preparer.checkpoint.claims()[record.uid]
    assert the_effect(case, preparer).touches(stored) is case.recorded
    assert preparer.builder.specs.path(record.uid).is_file()


@every_case
def test_a_kill_after_the_change_is_undone_at_start_up_and_the_retry_succeeds(
        case: Case, tmp_path: Path) -> None:
    before = case.probe(tmp_path, node(case, tmp_path))
    raw = case.claim()
    run_child(tmp_path, case, raw)
    restarted = case.build(tmp_path)  # the same boot: only the agent died
    # What the dead agent left: the change made, or part of it (MIG dies after the first of
    # the claim's two partitions).
    assert case.probe(tmp_path, restarted) != before

    report = restarted.recover()
    uid = raw["metadata"]["uid"]
    assert (report.rolled_back, report.orphans_removed) == (
        ((uid,), ()) if case.intent_durable else ((), (uid,)))
    assert case.probe(tmp_path, restarted) == before
    assert restarted.checkpoint.claims() == {}
    assert list((tmp_path / "cdi").glob("*.json")) == []

    record = restarted.prepare(parse_claim(raw))  # the kubelet asks again
    assert record.state is ClaimState.PREPARE_COMPLETED
    assert case.probe(tmp_path, restarted) == case.applied


@every_case
def test_after_a_reboot_start_up_makes_the_change_again(case: Case, tmp_path: Path) -> None:
    record = node(case, tmp_path).prepare(parse_claim(case.claim()))
    rebooted = reboot(case, tmp_path)
    report = rebooted.recover()
    assert report.rebuilt == (record.uid,) and not report.not_rebuilt
    assert case.probe(tmp_path, rebooted) == case.applied
    fresh = rebooted.checkpoint.claims()[record.uid]
    assert fresh.boot_id == "boot-2" and fresh.completed
    assert the_effect(case, rebooted).touches(fresh) is case.recorded
    assert cdi_ids(fresh) == cdi_ids(record)


@every_case
def test_unprepare_undoes_the_change_and_drops_the_record(case: Case, tmp_path: Path) -> None:
    preparer = node(case, tmp_path)
    before = case.probe(tmp_path, preparer)
    record = preparer.prepare(parse_claim(case.claim()))
    if case.workload is not None:
        case.workload(tmp_path)
    preparer.unprepare(record.uid)
    assert case.probe(tmp_path, preparer) == before
    assert record.uid not in preparer.checkpoint.claims()
    assert not preparer.builder.specs.path(record.uid).exists()


@every_case
def test_a_second_prepare_answers_the_same_and_changes_nothing(case: Case,
                                                              tmp_path: Path) -> None:
    preparer = node(case, tmp_path)
    claim = parse_claim(case.claim())
    first = preparer.prepare(claim)
    spec = preparer.builder.specs.path(first.uid).read_bytes()
    again = preparer.prepare(claim)
    assert cdi_ids(again) == cdi_ids(first)
    assert case.probe(tmp_path, preparer) == case.applied
    assert preparer.checkpoint.claims() == {first.uid: first}
    assert preparer.builder.specs.path(first.uid).read_bytes() == spec


@every_case
def test_a_second_unprepare_succeeds_and_changes_nothing(case: Case, tmp_path: Path) -> None:
    preparer = node(case, tmp_path)
    before = case.probe(tmp_path, preparer)
    record = preparer.prepare(parse_claim(case.claim()))
    preparer.unprepare(record.uid)
    preparer.unprepare(record.uid)  # the kubelet's retry of an answer it lost
    assert case.probe(tmp_path, preparer) == before
    assert preparer.checkpoint.claims() == {}


@every_case
def test_a_second_start_up_has_nothing_to_do(case: Case, tmp_path: Path) -> None:
    record = node(case, tmp_path).prepare(parse_claim(case.claim()))
    rebooted = reboot(case, tmp_path)
    assert rebooted.recover().rebuilt == (record.uid,)
    claims = rebooted.checkpoint.claims()
    spec = rebooted.builder.specs.path(record.uid).read_bytes()
    assert rebooted.recover() == RecoveryReport()
    again = case.build(tmp_path, boot_id="boot-2")  # and a restart of the agent, the same
    assert again.recover() == RecoveryReport()
    assert case.probe(tmp_path, again) == case.applied
    assert again.checkpoint.claims() == claims
    assert again.builder.specs.path(record.uid).read_bytes() == spec


def admin_claim(raw: dict[str, Any], *, configs: bool) -> dict[str, Any]:
    """``raw``'s devices, allocated again to a monitoring claim with admin access (with
    ``raw``'s configs, or none)."""
    allocation = raw["status"]["allocation"]["devices"]
    results = [{**r, "adminAccess": True} for r in allocation["results"]]
    return make_claim("monitor", results=results,
                      config=copy.deepcopy(allocation["config"]) if configs else [])


@every_case
@pytest.mark.parametrize("configs", [True, False], ids=["owners-config", "no-config"])
def test_an_admin_access_claim_changes_nothing_its_devices_holder_has(
        case: Case, configs: bool, tmp_path: Path) -> None:
    """Finding 3 of #28: admin access is for monitoring. Beside the claim holding the
    devices, an admin-access claim of the same devices either is refused in one line naming
    admin access (it asked for a change: a driver, a partition, an interval) or is prepared
    and unprepared without touching what the holder's effect made and its pod set."""
    preparer = node(case, tmp_path)
    before = case.probe(tmp_path, preparer)
    owner = preparer.prepare(parse_claim(case.claim()))
    if case.workload is not None:
        case.workload(tmp_path)
    held = case.owners(case.probe(tmp_path, preparer))
    monitor = parse_claim(admin_claim(case.claim(), configs=configs))
    try:
        record = preparer.prepare(monitor)
    except ClaimError as err:
        assert "allocated with admin access" in str(err) and "\n" not in str(err)
        assert isinstance(err, AdminAccessError)
        assert set(preparer.checkpoint.claims()) == {owner.uid}
    else:
        assert all(d.admin_access for d in record.devices)
        assert case.owners(case.probe(tmp_path, preparer)) == held
        preparer.unprepare(record.uid)
    assert case.probe(tmp_path, preparer) == held
    assert set(preparer.checkpoint.claims()) == {owner.uid}
    preparer.unprepare(owner.uid)  # the holder's own unprepare still undoes all of it
    assert case.probe(tmp_path, preparer) == before
