"""Stand-in device nodes of simulated devices (``--simulate-device-nodes``, ``cdi.simnodes``):
the spec a real runtime injects, the nodes on disk, idempotence, what is in the way, failures.

As root (CI) the real ``mknod`` path runs; elsewhere a fake maker stands in for it."""

from __future__ import annotations

import errno
import json
import os
import stat
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from agent.claim.model import ClaimRef
from agent.prepare.cdispecs import CDIClaimSpecs
from agent.prepare.devices import SpecDevice
from cdi.edits import EditsProvider, describe_env, simulated_node_paths
from cdi.errors import DeviceEditsError
from cdi.simnodes import MknodMaker, SimulatedNodes
from cdi.spec import ContainerEdits, DeviceNode
from discovery.model import Device, DeviceType, HostInfo
from tests.cdi.conftest import Checker, gpu, mig, nic, vf

ROOT = os.geteuid() == 0
DRIVER = "dra-agent.io"
UID = "0b6f3d4e-1c2a-4b5d-8e9f-0a1b2c3d4e5f"
REF = ClaimRef("default", "sim", UID)
CLAIM_ENV = ("DRA_AGENT_CLAIM=default/sim", f"DRA_AGENT_CLAIM_UID={UID}")


@dataclass
class FakeMaker:
    """Without CAP_MKNOD: a regular file saying what it stands for."""

    def is_stand_in(self, path: Path) -> bool:
        try:
            st = os.lstat(path)
        except OSError:  # missing, or a file where its directory should be
            return False
        return stat.S_ISREG(st.st_mode) and path.read_text() == "c 1:3"

    def make(self, path: Path) -> None:
        with path.open("x") as f:
            f.write("c 1:3")


@dataclass
class Counting:
    """Counts the nodes its inner maker made; ``fail`` makes each make fail with EPERM."""

    inner: MknodMaker | FakeMaker
    made: list[Path] = field(default_factory=list)
    fail: bool = False

    def is_stand_in(self, path: Path) -> bool:
        return self.inner.is_stand_in(path)

    def make(self, path: Path) -> None:
        if self.fail:
            raise PermissionError(errno.EPERM, os.strerror(errno.EPERM), str(path))
        self.inner.make(path)
        self.made.append(path)


def maker() -> Counting:
    return Counting(MknodMaker() if ROOT else FakeMaker())


def rdma_nic() -> Device:
    base = nic()
    host = HostInfo(pci_address=base.host.pci_address, vendor="mellanox",
                    if_name=base.host.if_name, rdma_device="mlx5_0",
                    dev_nodes=("/dev/infiniband/uverbs0", "/dev/infiniband/rdma_cm"))
    return Device(base.name, DeviceType.NIC, {}, {}, host)


def stand_in(path: str, directory: Path) -> DeviceNode:
    return DeviceNode(path=path, host_path=str(directory / path.removeprefix("/dev/")),
                      type="c", major=1, minor=3, permissions="rw")


def assert_stand_in(path: Path, made_by: Counting) -> None:
    assert made_by.is_stand_in(path), path
    if ROOT:
        st = os.lstat(path)
        assert stat.S_ISCHR(st.st_mode)
        assert (os.major(st.st_rdev), os.minor(st.st_rdev)) == (1, 3)
        assert stat.S_IMODE(st.st_mode) == 0o666


def provider(directory: Path, made_by: Counting) -> EditsProvider:
    return EditsProvider(simulated=True, simulated_nodes=SimulatedNodes(directory, made_by))


def test_each_simulated_device_gets_the_nodes_its_real_one_has(tmp_path: Path) -> None:
    assert simulated_node_paths(gpu(minor=3)) == ("/dev/nvidia3",)
    # MIG: the parent's node and the GI and CI capability nodes (the driver's mig-minors).
    assert simulated_node_paths(mig(minor=0, gi=7, ci=0)) == (
        "/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap66", "/dev/nvidia-caps/nvidia-cap67")
    assert simulated_node_paths(rdma_nic()) == ("/dev/infiniband/uverbs0",)
    assert simulated_node_paths(nic(rdma=None)) == ()  # no RDMA: no node, as on hardware
    assert simulated_node_paths(nic()) == ()  # RDMA, but its uverbs name unknown
    assert simulated_node_paths(vf(group="88")) == ("/dev/vfio/88",)


def test_a_simulated_claims_spec_has_stand_ins_and_the_same_env(
    tmp_path: Path, checker: Checker
) -> None:
    directory = tmp_path / "plugins" / DRIVER / "simulated-dev"
    made_by = maker()
    specs = CDIClaimSpecs(tmp_path / "cdi", DRIVER, provider(directory, made_by))
    devices = [gpu(), mig(minor=1, gi=7, ci=0), rdma_nic(), vf(group="88")]
    path = specs.write(REF, [SpecDevice(d, describe_env(d)) for d in devices], CLAIM_ENV)
    doc = json.loads(path.read_text())

    own = {
        "gpu-0": ["/dev/nvidia0"],
        "gpu-0-mig-1g10gb-0": ["/dev/nvidia1", "/dev/nvidia-caps/nvidia-cap201",
                               "/dev/nvidia-caps/nvidia-cap202"],
        "nic-0": ["/dev/infiniband/uverbs0"],
        "vf-0": ["/dev/vfio/88"],
    }
    for device, entry in zip(devices, doc["devices"], strict=True):
        edits = entry["containerEdits"]
        assert edits["deviceNodes"] == [stand_in(p, directory).to_dict()
                                        for p in own[device.name]]
        # The env entries are exactly those of a simulated spec without the flag.
        assert edits["env"] == [*describe_env(device), *CLAIM_ENV]
    shared = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools",
              "/dev/infiniband/rdma_cm", "/dev/vfio/vfio"]
    assert doc["containerEdits"]["deviceNodes"] == [stand_in(p, directory).to_dict()
                                                    for p in shared]
    assert doc["devices"][0]["containerEdits"]["deviceNodes"] == [{
        "path": "/dev/nvidia0", "hostPath": str(directory / "nvidia0"), "type": "c",
        "major": 1, "minor": 3, "permissions": "rw"}]
    assert doc["cdiVersion"] == "0.5.0"  # hostPath

    for p in (*[q for paths in own.values() for q in paths], *shared):
        assert_stand_in(directory / p.removeprefix("/dev/"), made_by)
    assert len(made_by.made) == 11

    # The reference CDI library takes it, and puts /dev/nvidia0 (1:3) in the container.
    checker.validate(path)
    oci = checker.inject(tmp_path / "cdi", specs.cdi_id(UID, "gpu-0"))
    assert {"path": "/dev/nvidia0", "type": "c", "major": 1, "minor": 3} in [
        {k: d.get(k) for k in ("path", "type", "major", "minor")}
        for d in oci["linux"]["devices"]]
    assert "DRA_AGENT_DEVICE_GPU_0_UUID=GPU-00000000" in oci["process"]["env"]


def test_the_nodes_are_made_once(tmp_path: Path) -> None:
    directory = tmp_path / "sim"
    made_by = maker()
    edits = provider(directory, made_by)
    first = edits.edits_for(gpu())
    node = directory / "nvidia0"
    before = os.lstat(node)
    for _ in range(3):
        assert edits.edits_for(gpu()) == first
        assert edits.common_edits_for([gpu()]) == edits.common_edits_for([gpu()])
    assert made_by.made.count(node.with_name(f".nvidia0.tmp-{os.getpid()}")) == 1
    assert os.lstat(node).st_ino == before.st_ino
    # A fresh provider (an agent restarted) keeps what is there.
    again = maker()
    assert provider(directory, again).edits_for(gpu()) == first
    assert again.made == []
    assert sorted(os.listdir(directory)) == ["nvidia-uvm", "nvidia-uvm-tools", "nvidia0",
                                             "nvidiactl"]


def test_concurrent_prepares_of_one_node_all_succeed(tmp_path: Path) -> None:
    made_by = maker()
    nodes = SimulatedNodes(tmp_path / "sim", made_by)
    errors: list[BaseException] = []

    def prepare() -> None:
        try:
            nodes.node("/dev/nvidia5")
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=prepare) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(made_by.made) == 1
    assert os.listdir(tmp_path / "sim") == ["nvidia5"]


@pytest.mark.parametrize("in_the_way", ["regular file", "other numbers", "symlink",
                                        "directory", "file for its directory"])
def test_what_is_in_the_way_is_replaced(tmp_path: Path, in_the_way: str) -> None:
    directory = tmp_path / "sim"
    directory.mkdir()
    target = directory / "infiniband" / "uverbs0"
    if in_the_way == "file for its directory":
        (directory / "infiniband").write_text("not a directory")
    else:
        target.parent.mkdir()
    if in_the_way == "regular file":
        target.write_text("c 1:5")
    elif in_the_way == "other numbers":
        if not ROOT:
            pytest.skip("a character device with other numbers needs CAP_MKNOD")
        os.mknod(target, stat.S_IFCHR | 0o666, os.makedev(1, 5))  # /dev/zero's
    elif in_the_way == "symlink":
        target.symlink_to("/dev/null")
    elif in_the_way == "directory":
        (target / "sub").mkdir(parents=True)
        (target / "sub" / "file").write_text("x")
    made_by = maker()
    edits = provider(directory, made_by).edits_for(rdma_nic())
    assert edits.device_nodes == (stand_in("/dev/infiniband/uverbs0", directory),)
    assert_stand_in(target, made_by)
    assert os.listdir(target.parent) == ["uverbs0"]  # no temporary file left


def test_a_failing_mknod_is_one_line_naming_the_path(tmp_path: Path) -> None:
    directory = tmp_path / "sim"
    made_by = maker()
    made_by.fail = True
    edits = provider(directory, made_by)
    with pytest.raises(DeviceEditsError) as err:
        edits.edits_for(gpu())
    message = str(err.value)
    assert message == (f"device gpu-0: cannot make the simulated device node "
                       f"{directory}/nvidia0: Operation not permitted; the agent needs "
                       "CAP_MKNOD (a privileged container, or that capability)")
    assert "\n" not in message
    with pytest.raises(DeviceEditsError, match=r"^device gpu-0: .*/nvidiactl: Operation"):
        edits.common_edits_for([gpu()])
    assert os.listdir(directory) == []  # nothing half-made
    # Through the claim's spec: nothing written, the same error for the plugin to return.
    specs = CDIClaimSpecs(tmp_path / "cdi", DRIVER, edits)
    with pytest.raises(DeviceEditsError, match="/nvidia"):
        specs.write(REF, [SpecDevice(gpu(), describe_env(gpu()))], CLAIM_ENV)
    assert not (tmp_path / "cdi").exists() or os.listdir(tmp_path / "cdi") == []


@pytest.mark.skipif(not ROOT, reason="mknod needs CAP_MKNOD (root)")
def test_the_real_maker_makes_a_null_node_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o077)  # as dra-agent run sets it
    try:
        node = SimulatedNodes(tmp_path / "sim").node("/dev/vfio/12")
    finally:
        os.umask(old)
    st = os.lstat(tmp_path / "sim" / "vfio" / "12")
    assert stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(1, 3)
    assert stat.S_IMODE(st.st_mode) == 0o666
    assert node == stand_in("/dev/vfio/12", tmp_path / "sim")
    with open(tmp_path / "sim" / "vfio" / "12", "rb") as f:  # it is /dev/null
        assert f.read() == b""


def test_without_stand_ins_a_simulated_device_keeps_env_only(tmp_path: Path) -> None:
    plain = EditsProvider(simulated=True)
    assert plain.edits_for(gpu()) == ContainerEdits(env=describe_env(gpu()))
    assert plain.common_edits_for([gpu(), vf(group="1")]).is_empty()
    with pytest.raises(ValueError, match="simulated"):
        EditsProvider(simulated_nodes=SimulatedNodes(tmp_path))


def test_a_path_that_would_leave_the_directory_is_refused(tmp_path: Path) -> None:
    odd = vf(group="../../etc")
    with pytest.raises(DeviceEditsError, match="not a device node path"):
        provider(tmp_path / "sim", maker()).edits_for(odd)
    assert not (tmp_path / "etc").exists()


def test_a_simulated_nic_moves_its_interface_only_when_its_claim_asks(tmp_path: Path) -> None:
    """With stand-ins a simulated NIC gets the netDevices edit real hardware would (the runtime
    then moves an interface of that name from the agent's network namespace); without the
    claim's move, or without stand-ins, none."""
    device = rdma_nic()
    made_by = maker()
    edits = provider(tmp_path / "sim", made_by)
    moved = edits.edits_for(device, interface_name="net1", move_netdev=True)
    assert [(n.host_interface_name, n.name) for n in moved.net_devices] == [
        (device.host.if_name, "net1")]
    assert moved.env == describe_env(device)
    assert not edits.edits_for(device, move_netdev=False).net_devices
    assert not edits.edits_for(gpu(), move_netdev=True).net_devices
    assert not EditsProvider(simulated=True).edits_for(device, move_netdev=True).net_devices
    with pytest.raises(DeviceEditsError, match="not a valid Linux interface name"):
        edits.edits_for(device, interface_name="a/b", move_netdev=True)
