"""Claim specs on real-hardware layouts: the preparer with ``cdi.edits.EditsProvider`` on the
CDI tests' fixture hosts (driver root, /dev, /proc, /sys), checked by the reference library."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from agent.claim.parse import parse_claim
from agent.prepare import DevicePreparer, EnvOnlyEdits
from agent.prepare.cdispecs import DeviceEdits
from agent.prepare.errors import BadConfigError, SpecWriteError
from cdi.edits import EditsProvider
from discovery.model import Device, DeviceType, HostInfo, Inventory
from tests.cdi.fakeroot import DRIVER_LIBS, LIB_DIR, RM, FakeHost
from tests.plugnode import DRIVER, device_preparer, make_claim

GOOD = {"apiVersion": "dra-agent.io/v1alpha1", "kind": "DeviceConfig"}


def nvidia_gpu(i: int = 0) -> Device:
    return Device(f"gpu-{i}", DeviceType.GPU, {}, {}, HostInfo(
        pci_address=f"0000:1b:0{i}.0", vendor="nvidia", uuid=f"GPU-{i:08d}", minor=i))


def rdma_nic(i: int = 0, if_name: str | None = "ibp24s0", rdma: str | None = "mlx5_0",
             device_type: DeviceType = DeviceType.NIC) -> Device:  # fmt: skip
    return Device(f"nic-{i}", device_type, {"macAddress": f"02:00:00:00:00:0{i}"}, {}, HostInfo(
        pci_address=f"0000:18:0{i}.0", vendor="mellanox", if_name=if_name, rdma_device=rdma))


def run(binary: Path, *args: str) -> dict[str, Any]:
    out = subprocess.run([str(binary), *args], capture_output=True, text=True, check=False,
                         timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout) if out.stdout.strip().startswith("{") else {}


@pytest.fixture
def host(tmp_path: Path) -> FakeHost:
    fake = FakeHost(tmp_path / "host")
    for d in (fake.root, fake.dev, fake.proc, fake.sys):
        d.mkdir(parents=True)
    return fake


def preparer(tmp_path: Path, edits: DeviceEdits, devices: list[Device]) -> DevicePreparer:
    return device_preparer(tmp_path, lambda: Inventory(devices=tuple(devices)), edits=edits)


def provider(host: FakeHost) -> EditsProvider:
    return EditsProvider(host.root, host.dev, host.proc, sysfs_root=host.sys)


def spec_of(p: DevicePreparer, uid: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(p.builder.specs.path(uid).read_text())
    return doc


def test_gpu_claim_spec_carries_control_nodes_and_driver_libraries(
    host: FakeHost, tmp_path: Path, cdi_check_bin: Path
) -> None:
    host.install_driver()
    host.make_control_nodes()
    host.add_gpu(0, "0000:1b:00.0")
    p = preparer(tmp_path, provider(host), [nvidia_gpu(0)])
    claim = parse_claim(make_claim("train", ["gpu-0"]))
    record = p.prepare(claim)

    doc = spec_of(p, claim.ref.uid)
    shared = [n["path"] for n in doc["containerEdits"]["deviceNodes"]]
    assert shared == ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools",
                      "/dev/nvidia-modeset"]  # fmt: skip
    assert [n["path"] for n in doc["devices"][0]["containerEdits"]["deviceNodes"]] == [
        "/dev/nvidia0"]
    # The agent's variables sit at the end of each device's edits, none at spec level.
    assert "env" not in doc["containerEdits"]
    device_env = doc["devices"][0]["containerEdits"]["env"]
    assert device_env[-2:] == [f"DRA_AGENT_NODE={p.node_name}", "NVIDIA_VISIBLE_DEVICES=void"]
    assert f"DRA_AGENT_CLAIM_UID={claim.ref.uid}" in device_env

    run(cdi_check_bin, "validate", str(p.builder.specs.path(claim.ref.uid)))
    oci = run(cdi_check_bin, "inject", str(tmp_path / "cdi"), *record.devices[0].cdi_ids)
    assert sorted(d["path"] for d in oci["linux"]["devices"]) == sorted([*shared, "/dev/nvidia0"])
    mounted = {m["destination"] for m in oci["mounts"]}
    for stem in DRIVER_LIBS:
        assert f"{LIB_DIR}/{stem}.{RM}" in mounted
    assert "/usr/bin/nvidia-smi" in mounted


def test_fresh_node_without_control_nodes_is_a_per_claim_error_and_rolls_back(
    host: FakeHost, tmp_path: Path
) -> None:
    host.install_driver()
    host.add_gpu(0, "0000:1b:00.0")  # /dev/nvidia0 exists, /dev/nvidiactl not yet
    p = preparer(tmp_path, provider(host), [nvidia_gpu(0)])
    claim = parse_claim(make_claim("train", ["gpu-0"]))
    with pytest.raises(SpecWriteError, match="nvidiactl"):
        p.prepare(claim)
    assert not p.builder.specs.path(claim.ref.uid).exists()
    assert p.checkpoint.claims() == {}


def test_rdma_nic_stays_on_the_host_by_default_and_the_spec_stays_loadable(
    host: FakeHost, tmp_path: Path, cdi_check_bin: Path
) -> None:
    host.add_rdma("mlx5_0", 0)
    host.add_rdma_cm()
    p = preparer(tmp_path, provider(host), [rdma_nic(0)])
    claim = parse_claim(make_claim("net", ["nic-0"]))
    record = p.prepare(claim)
    doc = spec_of(p, claim.ref.uid)
    assert doc["cdiVersion"] in ("0.3.0", "0.5.0")  # 0.5.0 when the claim UID starts with a digit
    assert "netDevices" not in json.dumps(doc)
    assert [n["path"] for n in doc["containerEdits"]["deviceNodes"]] == [
        "/dev/infiniband/rdma_cm"]
    run(cdi_check_bin, "validate", str(p.builder.specs.path(claim.ref.uid)))
    oci = run(cdi_check_bin, "inject", str(tmp_path / "cdi"), *record.devices[0].cdi_ids)
    assert "/dev/infiniband/uverbs0" in {d["path"] for d in oci["linux"]["devices"]}


def netdev_claim(devices: list[str], *configs: dict[str, Any]) -> dict[str, Any]:
    return make_claim("net", devices, config=[
        {"source": src, "opaque": {"driver": DRIVER, "parameters": {**GOOD, "netdev": nd}}}
        for src, nd in (next(iter(c.items())) for c in configs)
    ])  # fmt: skip


def test_netdev_moves_into_the_pod_when_the_claim_asks(
    host: FakeHost, tmp_path: Path, cdi_check_bin: Path
) -> None:
    p = preparer(tmp_path, provider(host), [rdma_nic(0, rdma=None)])
    # The class turns the move on, the claim picks the name: merged field by field.
    claim = parse_claim(netdev_claim(
        ["nic-0"], {"FromClass": {"move": True}}, {"FromClaim": {"interfaceName": "net1"}}))
    p.prepare(claim)
    doc = spec_of(p, claim.ref.uid)
    assert doc["cdiVersion"] == "1.1.0"
    assert doc["devices"][0]["containerEdits"]["netDevices"] == [
        {"hostInterfaceName": "ibp24s0", "name": "net1"}]
    out = subprocess.run([str(cdi_check_bin), "schema",
                          str(Path(__file__).parents[1] / "data/cdi-schema/schema.json"),
                          str(p.builder.specs.path(claim.ref.uid))],
                         capture_output=True, text=True, check=False, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_claim_may_turn_a_class_wide_move_off(host: FakeHost, tmp_path: Path) -> None:
    p = preparer(tmp_path, provider(host), [rdma_nic(0, rdma=None)])
    claim = parse_claim(netdev_claim(
        ["nic-0"], {"FromClass": {"move": True, "interfaceName": "net1"}},
        {"FromClaim": {"move": False}}))
    p.prepare(claim)
    doc = spec_of(p, claim.ref.uid)
    assert doc["cdiVersion"] != "1.1.0" and "netDevices" not in json.dumps(doc)


@pytest.mark.parametrize(("netdev", "field"), [
    ({"move": True, "interfaceName": "a" * 16}, "netdev.interfaceName"),
    ({"move": True, "interfaceName": "eth/1"}, "netdev.interfaceName"),
    ({"move": True, "interfaceName": "eth 1"}, "netdev.interfaceName"),
    ({"move": True, "interfaceName": ".."}, "netdev.interfaceName"),
    ({"move": True, "interfaceName": "lo"}, "netdev.interfaceName"),
    ({"move": True, "interfaceName": "eth0"}, "netdev.interfaceName"),
    ({"move": True, "interfaceName": "net\x001"}, "netdev.interfaceName"),
    ({"move": True, "interfaceName": "net\x7f"}, "netdev.interfaceName"),
    ({"move": "yes"}, "netdev.move"),
    ({"move": True, "name": "net1"}, "netdev.name"),
    ({"move": False, "interfaceName": "net1"}, "netdev.interfaceName"),
    ("net1", "netdev"),
])
def test_bad_netdev_config_is_a_per_claim_error_naming_the_field(
    tmp_path: Path, netdev: Any, field: str
) -> None:
    p = preparer(tmp_path, EnvOnlyEdits(), [rdma_nic(0, rdma=None)])
    claim = parse_claim(netdev_claim(["nic-0"], {"FromClaim": netdev}))
    with pytest.raises(BadConfigError, match=f"field {field}:"):
        p.prepare(claim)
    assert p.checkpoint.claims() == {}


def test_two_nics_cannot_take_one_name_in_the_pod(tmp_path: Path) -> None:
    p = preparer(tmp_path, EnvOnlyEdits(), [rdma_nic(0), rdma_nic(1, if_name="ibp25s0")])
    claim = parse_claim(netdev_claim(["nic-0", "nic-1"],
                                     {"FromClaim": {"move": True, "interfaceName": "net1"}}))
    with pytest.raises(BadConfigError, match="nic-0 and nic-1 would both be 'net1'"):
        p.prepare(claim)


def test_moving_a_vf_without_a_netdev_is_refused(tmp_path: Path) -> None:
    vf = rdma_nic(0, if_name=None, rdma=None, device_type=DeviceType.VF)
    p = preparer(tmp_path, EnvOnlyEdits(), [vf])
    claim = parse_claim(netdev_claim(["nic-0"], {"FromClaim": {"move": True}}))
    with pytest.raises(BadConfigError, match="no network interface on the host"):
        p.prepare(claim)


def test_gpus_ignore_a_claim_wide_netdev_config(host: FakeHost, tmp_path: Path) -> None:
    p = preparer(tmp_path, EnvOnlyEdits(), [nvidia_gpu(0), rdma_nic(0, rdma=None)])
    claim = parse_claim(netdev_claim(["gpu-0", "nic-0"], {"FromClaim": {"move": True}}))
    p.prepare(claim)
    assert [s.interface_name for s in p.network_status(claim)] == ["ibp24s0"]
