"""The netdev effect inside a real preparer (``agent.daemon.wiring.effects``): what it checks
before anything changes, the hook it puts in the claim's CDI spec, the RDMA device recorded
before the spec, and the give-back at unprepare and start-up. The host is a fake
(``FakeHost``) except in the last test, where the spec's own hook runs against a namespace
the test made."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from agent.claim.model import ClaimError
from agent.claim.parse import parse_claim
from agent.netdev.host import Moved
from agent.netdev.install import HookLaunch
from agent.netdev.rtnl import Link
from agent.prepare import DevicePreparer
from agent.prepare.effects.netdev import RDMA, NetdevEffect
from discovery.model import Device, DeviceType, HostInfo, Inventory
from tests.netdev.conftest import Pod
from tests.plugnode import DRIVER, device_preparer, make_claim

LAUNCH = HookLaunch("/opt/hook/ld.so", ("/opt/hook/ld.so", "-I", "-m", "agent.netdev.hook"))


def nic(i: int, rdma: str | None = "mlx5_0") -> Device:
    return Device(name=f"nic-{i}", type=DeviceType.NIC, attributes={}, capacity={},
                  host=HostInfo(pci_address=f"0000:3{i}:00.0", if_name=f"ens{i}",
                                rdma_device=rdma))


class FakeHost:
    def __init__(self, mode: str | None = "exclusive", max_mtu: int = 9216) -> None:
        self.mode, self.max_mtu = mode, max_mtu
        self.given_back: list[Moved] = []

    def link(self, name: str) -> Link | None:
        return Link(index=7, name=name, flags=0, mtu=1500, min_mtu=68, max_mtu=self.max_mtu,
                    address=None)

    def rdma_mode(self) -> str | None:
        return self.mode

    def give_back(self, moved: Moved) -> str:
        self.given_back.append(moved)
        return "moved back from the pod's namespace"


class Node:
    def __init__(self, root: Path, host: FakeHost, launch: HookLaunch | None = LAUNCH,
                 devices: tuple[Device, ...] = (nic(0),)) -> None:
        self.devices = devices
        self.effect = NetdevEffect(root / "netdev", lambda: launch, host, self.inventory)
        self.preparer: DevicePreparer = device_preparer(root, self.inventory, netdev=self.effect)

    def inventory(self) -> Inventory:
        return Inventory(devices=self.devices)


def claim(netdev: dict[str, Any], devices: tuple[str, ...] = ("nic-0",)) -> Any:
    params = {"apiVersion": "dra-agent.io/v1alpha1", "kind": "DeviceConfig",
              "netdev": {"move": True, "interfaceName": "net1", **netdev}}
    return parse_claim(make_claim("c", list(devices), config=[{
        "source": "FromClaim", "requests": [], "opaque": {"driver": DRIVER,
                                                          "parameters": params}}]))


def spec_hooks(node: Node, uid: str) -> list[dict[str, Any]]:
    doc = json.loads(node.preparer.builder.specs.path(uid).read_text())
    return [h for d in doc["devices"] for h in d["containerEdits"].get("hooks", [])]


def test_the_spec_runs_the_hook_with_the_interfaces_config(tmp_path: Path) -> None:
    node = Node(tmp_path, FakeHost())
    c = claim({"addresses": ["192.0.2.10/24"], "mtu": 9000})
    node.preparer.prepare(c)
    [hook] = spec_hooks(node, c.ref.uid)
    assert hook["hookName"] == "createRuntime" and hook["path"] == LAUNCH.path
    assert hook["args"] == [*LAUNCH.args, "--interface=net1",
                            '--config={"addresses":["192.0.2.10/24"],"mtu":9000}',
                            f"--claim={c.ref.uid}"]
    assert hook["timeout"] == 30


def test_a_move_alone_gets_no_hook(tmp_path: Path) -> None:
    node = Node(tmp_path, FakeHost(), launch=None)  # nothing installed, nothing needed
    c = claim({})
    node.preparer.prepare(c)
    assert spec_hooks(node, c.ref.uid) == []


@pytest.mark.parametrize(("host", "launch", "netdev", "devices", "why"), [
    (FakeHost(), None, {"mtu": 9000}, (nic(0),), "has no netdev hook installed"),
    (FakeHost(max_mtu=4000), LAUNCH, {"mtu": 9000}, (nic(0),),
     "mtu 9000 is outside what ens0 takes (68-4000)"),
    (FakeHost(mode="shared"), LAUNCH, {"rdma": "exclusive"}, (nic(0),),
     "needs the kernel's RDMA netns mode exclusive (rdma system set netns exclusive); "
     "it is shared"),
    (FakeHost(mode=None), LAUNCH, {"rdma": "exclusive"}, (nic(0),), "it is not there"),
    (FakeHost(), LAUNCH, {"rdma": "exclusive"}, (nic(0, rdma=None),),
     "rdma: exclusive, but the device has no RDMA device"),
])
def test_what_only_the_host_answers_is_checked_before_anything_changes(
        tmp_path: Path, host: FakeHost, launch: HookLaunch | None, netdev: dict[str, Any],
        devices: tuple[Device, ...], why: str) -> None:
    node = Node(tmp_path, host, launch=launch, devices=devices)
    c = claim(netdev)
    with pytest.raises(ClaimError) as err:
        node.preparer.prepare(c)
    assert why in str(err.value) and "\n" not in str(err.value)
    assert not node.preparer.builder.specs.path(c.ref.uid).exists()
    assert c.ref.uid not in node.preparer.checkpoint.claims()


def test_one_address_for_two_interfaces_is_refused(tmp_path: Path) -> None:
    node = Node(tmp_path, FakeHost(), devices=(nic(0), nic(1)))
    c = parse_claim(make_claim("c", ["nic-0", "nic-1"], config=[{
        "source": "FromClaim", "requests": [], "opaque": {"driver": DRIVER, "parameters": {
            "apiVersion": "dra-agent.io/v1alpha1", "kind": "DeviceConfig",
            "netdev": {"move": True, "addresses": ["192.0.2.10/24"]}}}}]))
    with pytest.raises(ClaimError, match=r"192\.0\.2\.10 is given to nic-0 too"):
        node.preparer.prepare(c)


def test_rdma_is_recorded_then_given_back_at_unprepare(tmp_path: Path) -> None:
    host = FakeHost()
    node = Node(tmp_path, host)
    c = claim({"rdma": "exclusive"})
    node.preparer.prepare(c)
    [held] = node.preparer.checkpoint.claims()[c.ref.uid].devices
    assert held.extra[RDMA] == {"rdmaDevice": "mlx5_0"}
    [hook] = spec_hooks(node, c.ref.uid)
    state = node.effect.state_file(c.ref.uid, "nic-0")
    assert "--rdma-device=mlx5_0" in hook["args"] and f"--state={state}" in hook["args"]
    # What the hook writes before it moves the device.
    state.parent.mkdir(parents=True)
    state.write_text(json.dumps({"rdmaDevice": "mlx5_0", "netns": "/run/netns/cni-1",
                                 "inode": 4026532999}))
    node.preparer.unprepare(c.ref.uid, c.ref)
    assert host.given_back == [Moved("mlx5_0", "/run/netns/cni-1", 4026532999)]
    assert not state.exists() and not state.parent.exists()


def test_a_record_naming_another_rdma_device_is_left_alone(tmp_path: Path) -> None:
    host = FakeHost()
    node = Node(tmp_path, host)
    c = claim({"rdma": "exclusive"})
    node.preparer.prepare(c)
    state = node.effect.state_file(c.ref.uid, "nic-0")
    state.parent.mkdir(parents=True)
    state.write_text(json.dumps({"rdmaDevice": "mlx5_0", "netns": "/run/netns/cni-1",
                                 "inode": 1}))
    node.devices = (nic(0, rdma="mlx5_9"),)  # discovery now sees another RDMA device there
    node.preparer.unprepare(c.ref.uid, c.ref)
    assert host.given_back == []


def test_start_up_gives_back_what_no_prepared_claim_explains(tmp_path: Path) -> None:
    host = FakeHost()
    node = Node(tmp_path, host)
    orphan = node.effect.state_file("0b7e1c1e-0000-4000-8000-000000000001", "nic-0")
    orphan.parent.mkdir(parents=True)
    orphan.write_text(json.dumps({"rdmaDevice": "mlx5_0", "netns": "/run/netns/cni-2",
                                  "inode": 3}))
    done = node.effect.reconcile({}, corrupt=False)
    assert host.given_back == [Moved("mlx5_0", "/run/netns/cni-2", 3)]
    assert done.removed == (str(orphan),) and not orphan.exists()


def test_the_specs_hook_configures_the_pods_interface(tmp_path: Path, pod: Pod,
                                                      launch: HookLaunch) -> None:
    """Prepare writes the spec; the runtime would run its hook: here the test does, with the
    OCI state of a process in the namespace the test made, and reads the result back."""
    node = Node(tmp_path, FakeHost(), launch=launch)
    c = claim({"addresses": ["192.0.2.10/24", "2001:db8::10/64"], "mtu": 9000,
               "hardwareAddress": "02:aa:00:00:00:05",
               "routes": [{"destination": "198.51.100.0/24", "gateway": "192.0.2.1"}]})
    node.preparer.prepare(c)
    [hook] = spec_hooks(node, c.ref.uid)
    done = subprocess.run([hook["path"], *hook["args"][1:]], env=dict(
        e.split("=", 1) for e in hook.get("env", [])), capture_output=True, text=True,
        input=json.dumps({"ociVersion": "1.2.0", "id": "c", "status": "creating",
                          "pid": pod.pid, "bundle": ""}), timeout=30, check=False)
    assert (done.returncode, done.stderr) == (0, "")
    shown = pod.ip_text("addr", "show", "net1")
    assert "mtu 9000" in shown and "link/ether 02:aa:00:00:00:05" in shown
    assert "inet 192.0.2.10/24" in shown and "inet6 2001:db8::10/64" in shown
    assert "198.51.100.0/24 via 192.0.2.1 dev net1" in pod.ip_text("route")
    print(shown, pod.ip_text("route"), sep="\n")


def test_the_claim_status_and_metadata_carry_the_configured_addresses(tmp_path: Path) -> None:
    from agent.prepare.devices import nic_status
    from agent.prepare.metadata import network_data

    node = Node(tmp_path, FakeHost())
    c = claim({"addresses": ["192.0.2.10/24", "2001:db8::10/64"],
               "hardwareAddress": "02:aa:00:00:00:07"})
    [result] = c.results
    item = node.preparer.builder.spec_device(c, result, {"nic-0": node.devices[0]})
    nic = nic_status(result, item)
    assert (nic.interface_name, nic.ips, nic.hardware_address) == (
        "net1", ("192.0.2.10/24", "2001:db8::10/64"), "02:aa:00:00:00:07")
    assert list(network_data(result, item) or {}) == ["interfaceName", "ips", "hardwareAddress"]


def test_a_hook_record_naming_another_device_than_discovery_is_not_acted_on(
        tmp_path: Path) -> None:
    host = FakeHost()
    node = Node(tmp_path, host)
    c = claim({"rdma": "exclusive"})
    node.preparer.prepare(c)
    state = node.effect.state_file(c.ref.uid, "nic-0")
    state.parent.mkdir(parents=True)
    state.write_text(json.dumps({"rdmaDevice": "mlx5_3", "netns": "/run/netns/cni-1",
                                 "inode": 1}))
    node.preparer.unprepare(c.ref.uid, c.ref)
    assert host.given_back == [] and not state.exists()


def test_start_up_passes_over_what_the_hook_never_writes(tmp_path: Path) -> None:
    host = FakeHost()
    node = Node(tmp_path, host)
    base = tmp_path / "netdev"
    (base / "uid-a").mkdir(parents=True)
    (base / "stray-file").write_text("x")
    (base / "uid-a" / "nic-0.json.tmp").write_text("{half")  # a hook killed mid-write
    (base / "uid-a" / "nic-0.json").write_text('{"rdmaDevice": "mlx5_0", "netns": "/x"}')
    done = node.effect.reconcile({}, corrupt=False)
    assert (done.removed, host.given_back) == ((), [])
    assert (base / "uid-a" / "nic-0.json").exists()  # unreadable: logged, left for a person
