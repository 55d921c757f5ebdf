"""--vfs dynamic: a PF with SR-IOV and no VFs offers its VFs-to-be (counter set ``<pf>-vfs``),
and the first prepare of one makes all of them (the kernel allows 0 -> N only), on the
simulated sriov-novfs machine whose sysfs answers ``sriov_numvfs`` as the kernel does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent.claim.parse import parse_claim
from agent.prepare import DevicePreparer
from agent.prepare.effects.vfs import VfError
from cdi.edits import EditsProvider
from discovery.model import Inventory
from discovery.scan import DiscoveryOptions, discover
from discovery.simulate import simulated_sources
from discovery.sources import Sources
from discovery.vfs import SriovError, SysfsSriov, vf_address
from tests.plugnode import device_preparer, make_claim

DRIVER = "dra-agent.io"
PF0, PF1 = "0000:3b:00.0", "0000:3b:00.1"
DYNAMIC = DiscoveryOptions(vfs="dynamic")


@pytest.fixture
def sources(tmp_path: Path) -> Sources:
    return simulated_sources("sriov-novfs", tmp_path / "sim")


def preparer(tmp_path: Path, sources: Sources) -> DevicePreparer:
    found = discover(sources, DYNAMIC)
    assert sources.sriov is not None
    return device_preparer(tmp_path, lambda: found, edits=EditsProvider(simulated=True),
                           sriov=sources.sriov, rescan=lambda: discover(sources, DYNAMIC))


def numvfs(sources: Sources, pf: str) -> int:
    return int((sources.sysfs_root / "bus/pci/devices" / pf / "sriov_numvfs").read_text())


def test_a_pf_without_vfs_offers_its_vfs_to_be(sources: Sources, tmp_path: Path) -> None:
    inv = discover(sources, DYNAMIC)
    vfs = [d for d in inv.devices if d.type == "vf"]
    assert len(vfs) == 128 and all(d.attributes["partition"] is True for d in vfs)
    assert [(c.name, dict(c.counters)) for c in inv.counter_sets] == [
        ("nic-0000-3b-00-0-vfs", {"vfs": "64"}), ("nic-0000-3b-00-1-vfs", {"vfs": "64"})]
    first = inv.by_name()["vf-0000-3b-00-2"]
    assert first.to_api()["consumesCounters"] == [
        {"counterSet": "nic-0000-3b-00-0-vfs", "counters": {"vfs": {"value": "1"}}}]
    assert inv.by_name()["nic-0000-3b-00-0"].to_api()["consumesCounters"] == [  # all of it
        {"counterSet": "nic-0000-3b-00-0-vfs", "counters": {"vfs": {"value": "64"}}}]
    assert first.attributes["parentPF"] == PF0 and first.attributes["vfIndex"] == 0
    # Named as the VFs will be: the same names sriov-nic (VFs made) publishes.
    made = discover(simulated_sources("sriov-nic", tmp_path / "made"))
    assert {d.name for d in vfs} == {d.name for d in made.devices if d.type == "vf"}
    assert not [d for d in discover(sources).devices if d.type == "vf"]  # static: none


def test_pfs_with_vfs_or_without_sriov_offer_no_candidates(tmp_path: Path) -> None:
    made = simulated_sources("sriov-nic", tmp_path / "made")
    dynamic, static = discover(made, DYNAMIC), discover(made)
    # The VFs as they are, no candidates; their count is the PF's counter set (what the
    # pre-sizing made), each VF consuming one and the PF all of it (test_pf_and_vfs.py).
    assert [d.name for d in dynamic.devices] == [d.name for d in static.devices]
    assert [(c.name, dict(c.counters)) for c in dynamic.counter_sets] == [
        ("nic-0000-3b-00-0-vfs", {"vfs": "64"}), ("nic-0000-3b-00-1-vfs", {"vfs": "64"})]
    consumed = {d.name: d.to_api().get("consumesCounters") for d in dynamic.devices}
    assert consumed["nic-0000-3b-00-0"] == [
        {"counterSet": "nic-0000-3b-00-0-vfs", "counters": {"vfs": {"value": "64"}}}]
    assert consumed["vf-0000-3b-00-2"] == [
        {"counterSet": "nic-0000-3b-00-0-vfs", "counters": {"vfs": {"value": "1"}}}]
    assert not static.counter_sets and not any(consumed_static for consumed_static in (
        d.to_api().get("consumesCounters") for d in static.devices))
    h100 = discover(simulated_sources("dgx-h100", tmp_path / "h100"), DYNAMIC)
    assert not h100.counter_sets and not [d for d in h100.devices if d.type == "vf"]


def test_first_prepare_makes_every_vf_of_the_pf_once(sources: Sources, tmp_path: Path) -> None:
    p = preparer(tmp_path, sources)
    claim = parse_claim(make_claim("net", ["vf-0000-3b-00-2"]))
    record = p.prepare(claim)
    assert numvfs(sources, PF0) == 64 and numvfs(sources, PF1) == 0
    pf = sources.sysfs_root / "bus/pci/devices" / PF0
    assert len(list(pf.glob("virtfn*"))) == 64
    assert record.devices[0].if_name == "enp59s0f0v0"
    doc = json.loads(p.builder.specs.path(record.uid).read_text())
    env = doc["devices"][0]["containerEdits"]["env"]
    assert "DRA_AGENT_DEVICE_VF_0000_3B_00_2_IF_NAME=enp59s0f0v0" in env
    again = p.prepare(parse_claim(make_claim("net2", ["vf-0000-3b-00-7"])))
    assert again.devices[0].if_name == "enp59s0f0v5" and numvfs(sources, PF0) == 64
    p.unprepare(record.uid)
    assert numvfs(sources, PF0) == 64  # the count never shrinks: VFs stay for the next claim


def test_a_pf_resized_by_someone_else_is_a_per_claim_error(
    sources: Sources, tmp_path: Path,
) -> None:
    p = preparer(tmp_path, sources)
    assert sources.sriov is not None
    sources.sriov.set_num_vfs(PF0, 4)  # after the candidates were published
    with pytest.raises(VfError) as err:
        p.prepare(parse_claim(make_claim("net", [f"vf-{vf_address(PF0, 2, 1, 10)}".replace(
            ":", "-").replace(".", "-")])))
    message = str(err.value)
    assert "vf-0000-3b-01-4" in message and "PF 0000:3b:00.0 has 4 VFs" in message
    assert "only from 0" in message and err.value.reason == "sriov"
    assert p.checkpoint.claims() == {} and numvfs(sources, PF0) == 4
    with pytest.raises(SriovError, match="Device or resource busy"):
        sources.sriov.set_num_vfs(PF0, 8)


def test_the_kernel_interface_reports_refusals_and_slow_drivers(tmp_path: Path) -> None:
    pf = tmp_path / "bus/pci/devices" / PF0
    pf.mkdir(parents=True)
    (pf / "sriov_numvfs").mkdir()  # a write the kernel refuses
    with pytest.raises(SriovError, match=f"PF {PF0}: writing 4 to"):
        SysfsSriov(tmp_path).set_num_vfs(PF0, 4)
    (pf / "sriov_numvfs").rmdir()
    (pf / "sriov_numvfs").write_text("0\n")
    ticks = iter(range(100))
    slow = SysfsSriov(tmp_path, timeout_s=3, clock=lambda: float(next(ticks)))
    with pytest.raises(SriovError, match="VF 3 has no driver 3 s after"):
        slow.set_num_vfs(PF0, 4)
    assert slow.num_vfs(PF0) == 4
    with pytest.raises(SriovError, match="SR-IOV disabled"):
        SysfsSriov(tmp_path).num_vfs("0000:3b:00.1")


def test_vf_addresses_follow_offset_and_stride() -> None:
    assert vf_address(PF0, 2, 1, 0) == "0000:3b:00.2"
    assert vf_address(PF0, 2, 1, 6) == "0000:3b:01.0"
    assert vf_address("0000:18:00.0", 1, 1, 255) == "0000:19:00.0"  # crosses into the next bus
    assert vf_address(PF1, 65, 1, 63) == "0000:3b:10.1"


def test_unknown_vf_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown VF mode"):
        DiscoveryOptions(vfs="auto")
    assert Inventory(devices=()).counter_sets == ()


def vf_config(driver: str) -> list[dict[str, Any]]:
    return [{"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": {
        "apiVersion": "dra-agent.io/v1alpha1", "kind": "DeviceConfig",
        "vf": {"driver": driver}}}}]


def driver_of(sources: Sources, bdf: str) -> str:
    return (sources.sysfs_root / "bus/pci/devices" / bdf / "driver").resolve().name


def test_vf_driver_vfio_pci_binds_it_and_unprepare_gives_it_back(
    sources: Sources, tmp_path: Path,
) -> None:
    p = preparer(tmp_path, sources)
    vf = "0000:3b:00.3"
    record = p.prepare(parse_claim(make_claim("dpdk", ["vf-0000-3b-00-3"],
                                              config=vf_config("vfio-pci"))))
    assert numvfs(sources, PF0) == 64 and driver_of(sources, vf) == "vfio-pci"
    assert record.devices[0].extra["vfRestoreDriver"] == "mlx5_core"
    assert record.devices[0].if_name is None  # no netdev on vfio-pci
    spec = json.loads(p.builder.specs.path(record.uid).read_text())
    env = spec["devices"][0]["containerEdits"]["env"]
    assert any(e.startswith("DRA_AGENT_DEVICE_VF_0000_3B_00_3_IOMMU_GROUP=") for e in env)
    assert not any("_IF_NAME=" in e for e in env)
    p.unprepare(record.uid)
    assert driver_of(sources, vf) == "mlx5_core"
    again = p.prepare(parse_claim(make_claim("net", ["vf-0000-3b-00-3"])))
    assert again.devices[0].if_name == "enp59s0f0v1" and "vfRestoreDriver" not in (
        again.devices[0].extra)


def test_a_vf_driver_that_does_not_exist_is_bad_config_and_nothing_changes(
    sources: Sources, tmp_path: Path,
) -> None:
    from agent.prepare.errors import BadConfigError

    p = preparer(tmp_path, sources)
    with pytest.raises(BadConfigError, match=r"vf\.driver: 'igb_uio' is not a driver"):
        p.prepare(parse_claim(make_claim("dpdk", ["vf-0000-3b-00-3"],
                                         config=vf_config("igb_uio"))))
    assert numvfs(sources, PF0) == 0 and p.checkpoint.claims() == {}


def test_a_driver_that_does_not_bind_is_reported(sources: Sources, tmp_path: Path) -> None:
    assert sources.sriov is not None
    sources.sriov.set_num_vfs(PF0, 2)
    with pytest.raises(SriovError, match="uio_pci_generic did not bind"):
        sources.sriov.bind("0000:3b:00.2", "uio_pci_generic")
    assert driver_of(sources, "0000:3b:00.2") == "mlx5_core"
    dev = tmp_path / "k" / "bus/pci/devices" / PF0
    dev.mkdir(parents=True)
    (tmp_path / "k" / "bus/pci/drivers_probe").write_text("")
    with pytest.raises(SriovError, match="vfio-pci did not bind"):
        SysfsSriov(tmp_path / "k").bind(PF0, "vfio-pci")
    assert (dev / "driver_override").read_text() == "vfio-pci\n"


def test_unprepare_unsets_the_mac_a_pod_gave_its_vf(sources: Sources, tmp_path: Path) -> None:
    p = preparer(tmp_path, sources)
    record = p.prepare(parse_claim(make_claim("net", ["vf-0000-3b-00-2"])))
    assert record.devices[0].extra["vfMacReset"] == {"pf": PF0, "index": 0}
    address = sources.sysfs_root / "class/net/enp59s0f0v0/address"
    address.write_text("02:11:22:33:44:55\n")  # what the pod set
    p.unprepare(record.uid)
    assert address.read_text() == "00:00:00:00:00:00\n"


def test_the_mac_reset_message_is_rtnetlinks_setlink_with_nested_vf_info() -> None:
    import struct

    from discovery.vfs import vf_mac_message

    msg = vf_mac_message(7, 3, b"\0" * 6, seq=9)
    length, kind, flags, seq, _ = struct.unpack_from("=IHHII", msg)
    assert (length, kind, flags, seq) == (len(msg), 19, 0x5, 9)
    assert struct.unpack_from("=BxHiII", msg, 16)[2] == 7  # ifinfomsg.ifi_index
    outer_len, outer = struct.unpack_from("=HH", msg, 32)
    assert outer == 22 | 0x8000 and outer_len == len(msg) - 32  # IFLA_VFINFO_LIST, nested
    assert struct.unpack_from("=HH", msg, 36)[1] == 1 | 0x8000  # IFLA_VF_INFO
    mac_len, mac_kind = struct.unpack_from("=HH", msg, 40)
    assert (mac_len, mac_kind) == (4 + 36, 1)  # IFLA_VF_MAC: struct ifla_vf_mac
    assert struct.unpack_from("=I", msg, 44)[0] == 3


def test_a_refused_mac_reset_is_reported_with_the_kernels_cause(tmp_path: Path) -> None:
    pf = tmp_path / "bus/pci/devices" / PF0
    (pf / "net" / "lo").mkdir(parents=True)
    (tmp_path / "class/net/lo").mkdir(parents=True)
    (tmp_path / "class/net/lo/ifindex").write_text("1\n")  # the loopback has no VFs
    with pytest.raises(SriovError, match=r"PF 0000:3b:00.0 \(lo\): resetting VF 0's MAC over "
                                         r"netlink: \S"):
        SysfsSriov(tmp_path).reset_vf_mac(PF0, 0)
    (pf / "net" / "lo").rmdir()
    with pytest.raises(SriovError, match="no network interface"):
        SysfsSriov(tmp_path).reset_vf_mac(PF0, 0)
