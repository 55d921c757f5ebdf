"""NIC (RDMA, netdev), VFIO, AMD/Intel GPU and simulated edits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cdi.edits import DeviceKind, EditsProvider, describe_env, device_kind
from cdi.errors import DeviceEditsError
from cdi.files import write_spec
from cdi.spec import CDIDevice, ContainerEdits, NetDevice, Spec
from discovery.model import Device, DeviceType, HostInfo
from tests.cdi.conftest import Checker, dri_gpu, gpu, mig, nic, vf
from tests.cdi.fakeroot import FakeHost

KIND = "k8s.dra-agent.io/claim"


def provider(host: FakeHost, simulated: bool = False) -> EditsProvider:
    return EditsProvider(host.root, host.dev, host.proc, simulated, sysfs_root=host.sys)


def spec_for(p: EditsProvider, devices: list[Device], **kw: Any) -> Spec:
    return Spec(
        KIND,
        tuple(CDIDevice(f"c-{d.name}", p.edits_for(d, **kw)) for d in devices),
        p.common_edits_for(devices),
    )


def node_paths(edits: ContainerEdits) -> list[str]:
    return [n.path for n in edits.device_nodes]


def test_device_kinds() -> None:
    assert device_kind(gpu()) == DeviceKind.NVIDIA_GPU
    assert device_kind(mig()) == DeviceKind.NVIDIA_MIG
    assert device_kind(nic()) == DeviceKind.NIC
    assert device_kind(vf()) == DeviceKind.VFIO
    assert device_kind(dri_gpu("a", "amd", "0000:c1:00.0")) == DeviceKind.AMD_GPU
    assert device_kind(dri_gpu("i", "0x8086", "0000:c1:00.0")) == DeviceKind.INTEL_GPU
    passthrough = Device("g", DeviceType.GPU, {}, {}, HostInfo(vendor="nvidia", driver="vfio-pci"))
    assert device_kind(passthrough) == DeviceKind.VFIO


def test_rdma_nic_gets_its_own_verbs_and_mad_nodes_and_shared_rdma_cm(
    host: FakeHost, checker: Checker, tmp_path: Path
) -> None:
    host.add_rdma("mlx5_0", 0)
    host.add_rdma("mlx5_10", 1)  # a prefix match would wrongly take this one too
    host.add_rdma_cm()
    p = provider(host)
    spec = spec_for(p, [nic()], move_netdev=False)
    assert node_paths(spec.devices[0].container_edits) == [
        "/dev/infiniband/uverbs0", "/dev/infiniband/umad0", "/dev/infiniband/issm0",
    ]  # fmt: skip
    assert node_paths(spec.container_edits) == ["/dev/infiniband/rdma_cm"]
    path = write_spec(tmp_path, "nic.json", spec)
    checker.validate(path)
    oci = checker.inject(tmp_path, *spec.qualified_names())
    got = {d["path"]: (d["major"], d["minor"]) for d in oci["linux"]["devices"]}
    assert got == {
        p: host.node(p)[:2]
        for p in ("/dev/infiniband/uverbs0", "/dev/infiniband/umad0", "/dev/infiniband/issm0",
                  "/dev/infiniband/rdma_cm")
    }  # fmt: skip


def test_rdma_device_without_uverbs_is_an_error(host: FakeHost) -> None:
    with pytest.raises(DeviceEditsError, match="mlx5_0 has no uverbs device"):
        provider(host).edits_for(nic())


def test_netdev_moves_into_the_pod_with_a_cdi_1_1_0_spec(
    host: FakeHost, checker: Checker, tmp_path: Path
) -> None:
    p = provider(host)
    device = nic(rdma=None)
    spec = Spec(KIND, (CDIDevice("c-nic-0", p.edits_for(device, interface_name="net1")),))
    assert spec.devices[0].container_edits.net_devices == (NetDevice("ibp24s0", "net1"),)
    doc = spec.to_dict()
    assert doc["cdiVersion"] == "1.1.0"
    assert doc["devices"][0]["containerEdits"] == {
        "netDevices": [{"hostInterfaceName": "ibp24s0", "name": "net1"}]
    }
    path = write_spec(tmp_path, "nic.json", spec)
    checker.schema(path)
    # The old library must refuse it (it cannot move interfaces), not silently drop it.
    assert checker.run("validate", str(path)).returncode == 1
    keep = p.edits_for(device).net_devices
    assert keep == (NetDevice("ibp24s0", "ibp24s0"),)


@pytest.mark.parametrize("name", ["", "a" * 16, "eth/1", "eth 1", "a:b", ".."])
def test_bad_pod_interface_names_are_refused(host: FakeHost, name: str) -> None:
    with pytest.raises(DeviceEditsError, match="interface name"):
        provider(host).edits_for(nic(rdma=None), interface_name=name or " ")


def test_vfio_function_gets_group_and_container_nodes(
    host: FakeHost, checker: Checker, tmp_path: Path
) -> None:
    host.add_vfio("0000:2a:00.1", 42)
    p = provider(host)
    spec = spec_for(p, [vf()])  # group read from sysfs
    assert node_paths(spec.devices[0].container_edits) == ["/dev/vfio/42"]
    assert node_paths(spec.container_edits) == ["/dev/vfio/vfio"]
    assert node_paths(p.edits_for(vf(group="42"))) == ["/dev/vfio/42"]
    path = write_spec(tmp_path, "vf.json", spec)
    checker.validate(path)
    oci = checker.inject(tmp_path, *spec.qualified_names())
    assert {d["path"] for d in oci["linux"]["devices"]} == {"/dev/vfio/42", "/dev/vfio/vfio"}


def test_vfio_noiommu_group_is_mounted_at_the_group_path(host: FakeHost) -> None:
    from tests.cdi.fakeroot import make_char_node

    make_char_node(host.dev / "vfio/noiommu-7", 240, 7)
    (node,) = provider(host).edits_for(vf(group="7")).device_nodes
    assert (node.path, node.host_path) == ("/dev/vfio/7", str(host.dev / "vfio/noiommu-7"))


def test_vfio_without_group_node_or_iommu_is_an_error(host: FakeHost) -> None:
    with pytest.raises(DeviceEditsError, match="no IOMMU group"):
        provider(host).edits_for(vf())
    with pytest.raises(DeviceEditsError, match="bound to vfio-pci"):
        provider(host).edits_for(vf(group="9"))
    with pytest.raises(DeviceEditsError, match="vfio-pci loaded"):
        provider(host).common_edits_for([vf(group="9")])


def test_amd_gpu_gets_drm_nodes_and_kfd(host: FakeHost, checker: Checker, tmp_path: Path) -> None:
    host.add_drm("0000:c1:00.0", 1, 128, kfd=True)
    spec = spec_for(provider(host), [dri_gpu("amd-0", "amd", "0000:c1:00.0")])
    assert node_paths(spec.devices[0].container_edits) == ["/dev/dri/card1", "/dev/dri/renderD128"]
    assert node_paths(spec.container_edits) == ["/dev/kfd"]
    path = write_spec(tmp_path, "amd.json", spec)
    checker.validate(path)
    checker.inject(tmp_path, *spec.qualified_names())


def test_intel_gpu_gets_drm_nodes_only(host: FakeHost) -> None:
    host.add_drm("0000:03:00.0", 0, 129)
    p = provider(host)
    device = dri_gpu("intel-0", "intel", "0000:03:00.0")
    assert node_paths(p.edits_for(device)) == ["/dev/dri/card0", "/dev/dri/renderD129"]
    assert p.common_edits_for([device]).is_empty()
    with pytest.raises(DeviceEditsError, match="no DRM devices"):
        p.edits_for(dri_gpu("intel-1", "intel", "0000:04:00.0"))


def test_device_nodes_named_by_discovery_are_added_and_must_exist(host: FakeHost) -> None:
    from tests.cdi.fakeroot import make_char_node

    make_char_node(host.dev / "accel/accel0", 261, 0)
    dev = Device("x", DeviceType.GPU, {}, {}, HostInfo(dev_nodes=("/dev/accel/accel0",)))
    (node,) = provider(host).edits_for(dev).device_nodes
    assert (node.path, node.major, node.minor) == (
        "/dev/accel/accel0",
        *host.node("/dev/accel/accel0")[:2],
    )
    gone = Device("y", DeviceType.GPU, {}, {}, HostInfo(dev_nodes=("/dev/accel/accel9",)))
    with pytest.raises(DeviceEditsError, match="accel9 does not exist"):
        provider(host).edits_for(gone)


def test_simulated_devices_get_env_only_and_a_container_starts(
    host: FakeHost, checker: Checker, tmp_path: Path
) -> None:
    p = provider(host, simulated=True)  # nothing exists on this fake host
    devices = [gpu(), mig(), nic(), vf(group="3")]
    spec = spec_for(p, devices)
    assert spec.container_edits.is_empty()
    for dev, cdi_dev in zip(devices, spec.devices, strict=True):
        edits = cdi_dev.container_edits
        assert edits == ContainerEdits(env=describe_env(dev))
    assert "DRA_AGENT_DEVICE_GPU_0_PCI_ADDRESS=0000:1b:00.0" in spec.devices[0].container_edits.env
    assert "DRA_AGENT_DEVICE_GPU_0_MIG_1G10GB_0_MIG_GI=1" in spec.devices[1].container_edits.env
    path = write_spec(tmp_path, "sim.json", spec)
    checker.validate(path)
    oci = checker.inject(tmp_path, *spec.qualified_names())
    assert "DRA_AGENT_DEVICE_NIC_0_IF_NAME=ibp24s0" in oci["process"]["env"]
    assert json.loads(path.read_text())["cdiVersion"] == "0.3.0"
