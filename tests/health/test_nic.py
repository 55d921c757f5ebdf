"""NIC link state read from generated sysfs trees."""

from __future__ import annotations

from agent.health.model import Kind
from agent.health.nic import NicProbe
from tests.health.conftest import Node

PF0 = "nic-0000-3b-00-0"
PF0_BDF = "0000:3b:00.0"
VF0 = "vf-0000-3b-00-2"


def probe(node: Node) -> dict[str, list[tuple[str, str]]]:
    found = NicProbe(node.sys).poll(node.inventory)
    for conds in found.values():
        assert all(c.kind is Kind.LINK_DOWN for c in conds)
    return {name: [(c.value, c.message) for c in conds] for name, conds in found.items()}


def test_every_link_of_a_fresh_node_is_up(h100: Node, sriov: Node) -> None:
    assert probe(h100) == {}
    assert probe(sriov) == {}


def test_carrier_zero_is_link_down_with_the_interface_named(h100: Node) -> None:
    nic = h100.device("nic-0000-18-00-0")
    h100.set_carrier(nic.host.if_name, up=False)
    assert probe(h100) == {
        nic.name: [("carrier", f"link down on {nic.host.if_name} (carrier 0, operstate down)")]}
    h100.set_carrier(nic.host.if_name, up=True)
    assert probe(h100) == {}


def test_rdma_port_not_active_is_link_down(h100: Node) -> None:
    nic = h100.device("nic-0000-29-00-0")
    h100.set_port(nic.host.rdma_device, "2: INIT")
    assert probe(h100) == {nic.name: [("rdma-port-1", f"RDMA {nic.host.rdma_device} port 1 INIT")]}
    h100.set_port(nic.host.rdma_device, "4: ACTIVE")
    assert probe(h100) == {}


def test_lower_layer_down_counts_but_admin_down_does_not(h100: Node) -> None:
    nic = h100.device("nic-0000-40-00-0")
    base = h100.sys / "class/net" / nic.host.if_name
    (base / "operstate").write_text("lowerlayerdown\n")
    assert [v for v, _ in probe(h100)[nic.name]] == ["operstate"]
    # Administratively down: the kernel refuses to read carrier; configuration, not a fault.
    (base / "operstate").write_text("down\n")
    (base / "carrier").unlink()
    assert probe(h100) == {}


def test_netdev_moved_into_a_pod_namespace_is_not_a_fault(h100: Node) -> None:
    nic = h100.device("nic-0000-4f-00-0")
    (h100.sys / "class/net" / nic.host.if_name).unlink()
    assert probe(h100) == {}


def test_pf_link_down_is_inherited_by_its_vfs(sriov: Node) -> None:
    pf = sriov.device(PF0)
    sriov.set_carrier(pf.host.if_name, up=False)
    found = probe(sriov)
    vfs = [d.name for d in sriov.inventory.devices if d.host.parent_pf == PF0_BDF]
    assert len(vfs) == 64
    assert set(found) == {PF0, *vfs}
    assert found[VF0] == [("pf-carrier", f"parent PF {PF0}: " + found[PF0][0][1])]
    # VFs of the other PF are untouched.
    assert not any(d.host.parent_pf == "0000:3b:00.1" for d in sriov.inventory.devices
                   if d.name in found)


def test_vanished_pf_takes_its_vfs_with_it(sriov: Node) -> None:
    sriov.remove_function(PF0_BDF)
    found = probe(sriov)
    assert found[PF0] == [("gone", f"PCI function {PF0_BDF} vanished")]
    assert found[VF0] == [("pf-gone", f"parent PF {PF0}: PCI function {PF0_BDF} vanished")]
    assert sum(1 for v in found.values() if v[0][0] == "pf-gone") == 64


def test_vf_whose_pf_is_not_offered_follows_the_pf_presence(sriov: Node) -> None:
    from dataclasses import replace

    # An inventory without the PF (e.g. the PF carries the node's traffic and is reserved).
    sriov.inventory = replace(sriov.inventory, devices=tuple(
        d for d in sriov.inventory.devices if d.name != PF0))
    assert probe(sriov) == {}
    sriov.remove_function(PF0_BDF)
    assert probe(sriov)[VF0] == [("pf-gone", f"parent PF {PF0_BDF} vanished")]


def test_vfio_vf_without_netdev_is_watched_through_its_pf(sriov: Node) -> None:
    vfio = next(d for d in sriov.inventory.devices
                if d.host.parent_pf == PF0_BDF and d.host.if_name is None)
    assert probe(sriov) == {}
    sriov.set_carrier(sriov.device(PF0).host.if_name, up=False)
    assert [v for v, _ in probe(sriov)[vfio.name]] == ["pf-carrier"]
