"""Discovery on the simulated profiles: counts, names, attributes and topology as on real DGX."""

from __future__ import annotations

import re
from collections.abc import Callable

from discovery.model import NUMA_NODE, PCI_BUS_ID, PCIE_ROOT, Device, Inventory, Version
from discovery.names import is_dns_label
from discovery.scan import DiscoveryOptions, discover
from discovery.sources import Sources

Inv = Callable[[str], Inventory]

H100_PAIRS = {  # GPU -> (its compute NIC, RDMA device), from the DGX H100 port map
    "gpu-0": ("nic-0000-18-00-0", "mlx5_0"),
    "gpu-1": ("nic-0000-40-00-0", "mlx5_3"),
    "gpu-2": ("nic-0000-4f-00-0", "mlx5_4"),
    "gpu-3": ("nic-0000-5e-00-0", "mlx5_5"),
    "gpu-4": ("nic-0000-9a-00-0", "mlx5_6"),
    "gpu-5": ("nic-0000-c0-00-0", "mlx5_9"),
    "gpu-6": ("nic-0000-ce-00-0", "mlx5_10"),
    "gpu-7": ("nic-0000-dc-00-0", "mlx5_11"),
}
BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def by_name(inv: Inventory) -> dict[str, Device]:
    return inv.by_name()


def test_dgx_h100_offers_8_gpus_and_14_nics(inventory_of: Inv) -> None:
    inv = inventory_of("dgx-h100")
    gpus = [d.name for d in inv.devices if d.type == "gpu"]
    nics = [d.name for d in inv.devices if d.type == "nic"]
    assert gpus == [f"gpu-{i}" for i in range(8)]
    assert len(nics) == 12  # 8 compute + 2 dual-port storage cards
    assert {n for n, _ in H100_PAIRS.values()} <= set(nics)
    assert {"nic-0000-29-00-0", "nic-0000-29-00-1", "nic-0000-aa-00-0",
            "nic-0000-aa-00-1"} <= set(nics)
    assert inv.warnings == ()


def test_dgx_h100_reserves_the_default_route_nic(inventory_of: Inv) -> None:
    inv = inventory_of("dgx-h100")
    assert inv.reserved == {"nic-0000-0b-00-0": "eno3: carries the default route"}
    assert "nic-0000-0b-00-0" not in by_name(inv)


def test_dgx_h100_gpu_attributes_match_nvml_and_sysfs(inventory_of: Inv) -> None:
    gpu = by_name(inventory_of("dgx-h100"))["gpu-4"]
    a = gpu.attributes
    assert a["productName"] == "NVIDIA H100 80GB HBM3"
    assert a["architecture"] == "Hopper"
    assert a["brand"] == "Nvidia"
    assert a["cudaComputeCapability"] == Version("9.0.0")
    assert a["driverVersion"] == Version("550.54.15")
    assert a["cudaDriverVersion"] == Version("12.4.0")
    assert a[PCI_BUS_ID] == "0000:9d:00.0"
    assert a[PCIE_ROOT] == "pci0000:97"
    assert a[NUMA_NODE] == (1, 3)  # SNC-2: node 1 and its socket sibling 3
    assert a["index"] == 4 and a["minor"] == 4
    assert str(a["uuid"]).startswith("GPU-")
    assert a["pciVendorID"] == "10de" and a["pciDeviceID"] == "2330"
    assert gpu.capacity == {"memory": "81559Mi"}
    assert gpu.host.dev_nodes[0] == "/dev/nvidia4"
    assert "/dev/nvidiactl" in gpu.host.dev_nodes
    assert gpu.host.pci_address == "0000:9d:00.0" and gpu.host.minor == 4


def test_dgx_h100_gpu_nic_pairs_share_root_and_switch(inventory_of: Inv) -> None:
    devices = by_name(inventory_of("dgx-h100"))
    roots, switches = set(), set()
    for gpu_name, (nic_name, rdma) in H100_PAIRS.items():
        gpu, nic = devices[gpu_name], devices[nic_name]
        assert gpu.attributes[PCIE_ROOT] == nic.attributes[PCIE_ROOT]
        assert gpu.attributes["pcieSwitch"] == nic.attributes["pcieSwitch"]
        assert gpu.attributes[NUMA_NODE] == nic.attributes[NUMA_NODE]
        assert nic.attributes["rdmaDevice"] == rdma
        roots.add(gpu.attributes[PCIE_ROOT])
        switches.add(gpu.attributes["pcieSwitch"])
    assert len(roots) == 8 and len(switches) == 8  # one PCIe root per GPU/NIC pair
    assert [devices[f"gpu-{i}"].attributes[NUMA_NODE] for i in range(8)] == (
        [(0, 2)] * 4 + [(1, 3)] * 4)


def test_dgx_h100_compute_nic_is_infiniband_with_rdma_nodes(inventory_of: Inv) -> None:
    nic = by_name(inventory_of("dgx-h100"))["nic-0000-18-00-0"]
    a = nic.attributes
    assert a["ifName"] == "ibp24s0"
    assert a["linkType"] == "infiniband"
    assert a["mtu"] == 4092
    # Link state and speed flap with the cable: shown, never published (health taints them).
    assert "linkSpeed" not in a and "state" not in a
    assert nic.host.extra == {"operstate": "up", "speedMbps": "400000"}
    assert len(str(a["macAddress"]).split(":")) == 20  # IPoIB hardware address
    assert a["isVF"] is False and a["driver"] == "mlx5_core"
    assert a["vendor"] == "mellanox" and a["pciDeviceID"] == "1021"
    assert nic.host.dev_nodes == ("/dev/infiniband/uverbs0", "/dev/infiniband/rdma_cm")
    assert nic.host.if_name == "ibp24s0" and nic.host.rdma_device == "mlx5_0"


def test_dgx_h100_storage_nics_have_no_switch_and_ethernet_port(inventory_of: Inv) -> None:
    devices = by_name(inventory_of("dgx-h100"))
    port1, port2 = devices["nic-0000-29-00-0"], devices["nic-0000-29-00-1"]
    assert "pcieSwitch" not in port1.attributes
    assert port1.attributes[PCIE_ROOT] == port2.attributes[PCIE_ROOT]
    assert port2.attributes["ifName"] == "enp41s0f1np1"
    assert port2.attributes["linkType"] == "ethernet"


def test_virtual_interfaces_and_nvswitches_are_not_offered(inventory_of: Inv) -> None:
    inv = inventory_of("dgx-h100")
    if_names = {d.attributes.get("ifName") for d in inv.devices}
    assert not if_names & {"lo", "docker0", "veth1a2b3c"}
    assert not [d for d in inv.devices if str(d.attributes.get(PCI_BUS_ID)).endswith(
        ("05:00.0", "06:00.0", "07:00.0", "08:00.0"))]


def test_a100_mig_profile_offers_mig_devices_with_placements(inventory_of: Inv) -> None:
    inv = inventory_of("dgx-a100-mig")
    migs = sorted(d.name for d in inv.devices if d.type == "mig")
    assert migs == sorted(
        [f"gpu-0-mig-1g10gb-{i}" for i in range(7)]
        + ["gpu-1-mig-2g20gb-0", "gpu-1-mig-1g10gb-2", "gpu-1-mig-1g10gb-3",
           "gpu-1-mig-3g40gb-4", "gpu-2-mig-4g40gb-0", "gpu-2-mig-3g40gb-4"]
        + [f"gpu-3-mig-1c3g40gb-0-ci{c}" for c in range(3)]
        + ["gpu-3-mig-1g20gb-4", "gpu-3-mig-1g10gbme-6"]
    )
    assert [d.name for d in inv.devices if d.type == "gpu"] == [f"gpu-{i}" for i in range(4, 8)]
    assert len([d for d in inv.devices if d.type == "nic"]) == 11
    for i in range(4):
        assert inv.reserved[f"gpu-{i}"].startswith("MIG mode enabled")
    assert inv.reserved["nic-0000-e1-00-0"] == "enp225s0f0: carries the default route"


def test_mig_device_attributes_capacity_and_device_nodes(inventory_of: Inv) -> None:
    devices = by_name(inventory_of("dgx-a100-mig"))
    mig = devices["gpu-1-mig-3g40gb-4"]
    a = mig.attributes
    assert a["profile"] == "3g.40gb"
    assert a["placementStart"] == 4 and a["placementSize"] == 4
    assert str(a["uuid"]).startswith("MIG-") and str(a["uuid"])[4:].split("-")[2][0] == "5"
    assert str(a["parentUUID"]).startswith("GPU-")
    assert a["productName"] == "NVIDIA A100-SXM4-80GB"
    assert a[PCI_BUS_ID] == "0000:0f:00.0" and a[NUMA_NODE] == (3, 0, 1, 2)
    assert mig.capacity == {
        "memory": "40192Mi", "multiprocessors": "42", "copyEngines": "3", "decoders": "2",
        "encoders": "0", "jpegEngines": "0", "ofaEngines": "0",
    }
    # GI 2 on GPU minor 1: caps minors 3+135+18=156 (GI) and 157 (CI 0).
    assert mig.host.dev_nodes[:3] == (
        "/dev/nvidia1", "/dev/nvidia-caps/nvidia-cap156", "/dev/nvidia-caps/nvidia-cap157")
    assert mig.host.mig_gi == 2 and mig.host.mig_ci == 0
    split = devices["gpu-3-mig-1c3g40gb-0-ci2"]
    assert split.capacity["multiprocessors"] == "14"
    assert split.attributes["profile"] == "1c.3g.40gb"
    assert devices["gpu-3-mig-1g10gbme-6"].attributes["profile"] == "1g.10gb+me"


def test_a100_switch_complex_holds_two_gpus_and_two_nics(inventory_of: Inv) -> None:
    devices = by_name(inventory_of("dgx-a100-mig"))
    group = [devices[n] for n in ("gpu-6", "gpu-7", "nic-0000-ba-00-0", "nic-0000-cc-00-0")]
    assert len({d.attributes["pcieSwitch"] for d in group}) == 1
    assert len({d.attributes[PCIE_ROOT] for d in group}) == 1
    assert devices["gpu-4"].attributes["pcieSwitch"] != devices["gpu-6"].attributes["pcieSwitch"]


def test_sriov_profile_offers_pfs_and_128_vfs(inventory_of: Inv) -> None:
    inv = inventory_of("sriov-nic")
    pfs = [d for d in inv.devices if d.type == "nic"]
    vfs = [d for d in inv.devices if d.type == "vf"]
    assert [d.name for d in pfs] == ["nic-0000-3b-00-0", "nic-0000-3b-00-1"]
    assert len(vfs) == 128
    assert pfs[0].attributes["sriovTotalVFs"] == 64 and pfs[0].attributes["sriovNumVFs"] == 64
    vfio = [d for d in vfs if d.host.driver == "vfio-pci"]
    assert len(vfio) == 16 + 32
    for vf in vfio:
        assert "ifName" not in vf.attributes
        assert vf.host.dev_nodes == (f"/dev/vfio/{vf.host.iommu_group}", "/dev/vfio/vfio")
    first = by_name(inv)["vf-0000-3b-00-2"]
    assert first.attributes["parentPF"] == "0000:3b:00.0" and first.attributes["vfIndex"] == 0
    assert first.attributes["isVF"] is True and first.attributes["ifName"] == "enp59s0f0v0"
    assert first.host.parent_pf == "0000:3b:00.0"
    pf1_vf = by_name(inv)["vf-0000-3b-08-2"]  # devfn 66: PF1's first VF (offset 65)
    assert pf1_vf.attributes["parentPF"] == "0000:3b:00.1"
    assert pf1_vf.attributes["vfIndex"] == 0
    assert inv.reserved == {"nic-0000-02-00-0": "eno1: carries the default route"}


def test_empty_profile_has_nothing_and_no_warnings(inventory_of: Inv) -> None:
    inv = inventory_of("empty")
    assert inv.devices == () and inv.reserved == {} and inv.warnings == ()


def test_every_device_fits_the_api_limits(inventory_of: Inv) -> None:
    for profile in ("dgx-h100", "dgx-a100-mig", "sriov-nic"):
        for device in inventory_of(profile).devices:
            assert is_dns_label(device.name), device.name
            api = device.to_api()
            assert len(api["attributes"]) + len(api.get("capacity", {})) <= 32, device.name
            for value in api["attributes"].values():
                assert len(str(next(iter(value.values())))) <= 64
            assert BDF.match(str(device.attributes[PCI_BUS_ID]))


def test_rescan_gives_an_equal_inventory(profile_sources: Callable[[str], Sources],
                                         inventory_of: Inv) -> None:
    again = discover(profile_sources("dgx-a100-mig"), DiscoveryOptions())
    assert again == inventory_of("dgx-a100-mig")


def test_device_types_filter(profile_sources: Callable[[str], Sources]) -> None:
    h100 = profile_sources("dgx-h100")
    gpus_only = discover(h100, DiscoveryOptions(device_types=("gpu",)))
    assert {d.type for d in gpus_only.devices} == {"gpu"} and gpus_only.reserved == {}
    nics_only = discover(h100, DiscoveryOptions(device_types=("nic",)))
    assert {d.type for d in nics_only.devices} == {"nic"}
    mig_only = discover(profile_sources("dgx-a100-mig"), DiscoveryOptions(device_types=("mig",)))
    assert {d.type for d in mig_only.devices} == {"mig"} and len(mig_only.devices) == 18
    assert not [k for k in mig_only.reserved if k.startswith("gpu")]
    pfs = discover(profile_sources("sriov-nic"), DiscoveryOptions(device_types=("nic",)))
    assert len(pfs.devices) == 2


def test_interface_include_and_exclude_patterns(profile_sources: Callable[[str], Sources]) -> None:
    h100 = profile_sources("dgx-h100")
    only_ib = discover(h100, DiscoveryOptions(device_types=("nic",), include_ifaces=("ibp*",)))
    assert len(only_ib.devices) == 10
    no_storage = discover(h100, DiscoveryOptions(
        device_types=("nic",), exclude_ifaces=("0000:29:*", "nic-0000-aa-*")))
    assert len(no_storage.devices) == 8


def test_unknown_device_type_is_rejected() -> None:
    try:
        DiscoveryOptions(device_types=("gpu", "fpga"))
    except ValueError as err:
        assert "fpga" in str(err)
    else:
        raise AssertionError("accepted an unknown device type")
