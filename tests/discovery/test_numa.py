"""numaNode's list form (Kubernetes 1.37): the physical node, then its equidistant same-socket
nodes, read from sysfs fixtures; bad files give one log line and the single-element list."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from discovery.model import NUMA_NODE
from discovery.numa import NumaReader, parse_cpulist
from discovery.scan import discover
from discovery.simulate.tree import PciSpec, SysfsBuilder, write_numa
from discovery.sources import Sources
from tests.discovery.test_bad_input import NoRoutes

#: 2 sockets x 2 NUMA nodes, numbered as SNC-2 machines often are (socket 0: nodes 0 and 1).
TWO_BY_TWO = {0: (0, "0-3"), 1: (0, "4-7"), 2: (1, "8-11"), 3: (1, "12-15")}


def _machine(root: Path, numa_nodes: dict[str, int]) -> SysfsBuilder:
    """One Ethernet NIC per entry (bdf -> its numa_node file's value) and the 2x2 topology."""
    sys = SysfsBuilder(root)
    for i, (bdf, node) in enumerate(numa_nodes.items()):
        dev = sys.function(PciSpec(bdf, "pci0000:00", (), 0x8086, 0x1572, 0x020000,
                                   numa_node=node, driver="i40e"))
        sys.net(dev, f"eth{i}", {"address": f"02:00:00:00:00:{i:02x}", "mtu": "1500",
                                 "operstate": "up", "type": "1", "speed": "10000"})
    write_numa(sys, TWO_BY_TWO, near=12, far=21)
    return sys


def _numa(root: Path) -> dict[str, object]:
    sources = Sources(sysfs_root=root, gpu=None, dev_root=root / "dev", routes=NoRoutes(),
                      label="test")
    return {d.name: d.attributes.get(NUMA_NODE) for d in discover(sources).devices}


def _node_file(root: Path, node: int, name: str) -> Path:
    return root / "devices" / "system" / "node" / f"node{node}" / name


def test_two_sockets_of_two_nodes_give_the_socket_sibling_after_the_physical_node(
        tmp_path: Path) -> None:
    _machine(tmp_path, {"0000:01:00.0": 0, "0000:02:00.0": 1, "0000:03:00.0": 3})
    assert _numa(tmp_path) == {"nic-0000-01-00-0": (0, 1), "nic-0000-02-00-0": (1, 0),
                               "nic-0000-03-00-0": (3, 2)}


def test_equidistant_nodes_of_another_socket_are_left_out(tmp_path: Path) -> None:
    # A flat SLIT (every remote node at 21) still keeps to the device's socket.
    _machine(tmp_path, {"0000:01:00.0": 2})
    for node in range(4):
        _node_file(tmp_path, node, "distance").write_text(
            " ".join("10" if i == node else "21" for i in range(4)) + "\n")
    assert _numa(tmp_path) == {"nic-0000-01-00-0": (2, 3)}


def test_no_distance_file_gives_the_single_element_list(tmp_path: Path) -> None:
    _machine(tmp_path, {"0000:01:00.0": 1})
    _node_file(tmp_path, 1, "distance").unlink()
    assert _numa(tmp_path) == {"nic-0000-01-00-0": (1,)}


def test_a_candidate_whose_socket_is_unknown_is_included(tmp_path: Path) -> None:
    # Node 2 becomes a CPU-less memory node at the minimum distance from node 0.
    _machine(tmp_path, {"0000:01:00.0": 0})
    _node_file(tmp_path, 0, "distance").write_text("10 12 12 21\n")
    _node_file(tmp_path, 2, "cpulist").write_text("\n")
    assert _numa(tmp_path) == {"nic-0000-01-00-0": (0, 1, 2)}


def test_own_socket_unknown_keeps_every_equidistant_node(tmp_path: Path) -> None:
    _machine(tmp_path, {"0000:01:00.0": 0})
    _node_file(tmp_path, 0, "distance").write_text("10 12 12 21\n")
    (tmp_path / "devices/system/cpu/cpu0/topology/physical_package_id").unlink()
    assert _numa(tmp_path) == {"nic-0000-01-00-0": (0, 1, 2)}


def test_minus_one_publishes_no_numa_node(tmp_path: Path) -> None:
    _machine(tmp_path, {"0000:01:00.0": -1})
    assert _numa(tmp_path) == {"nic-0000-01-00-0": None}


def test_node_id_1024_is_invalid_and_logged_once(tmp_path: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    _machine(tmp_path, {"0000:01:00.0": 1024, "0000:02:00.0": 1023})
    with caplog.at_level(logging.WARNING, logger="discovery.numa"):
        numa = _numa(tmp_path)
    assert numa == {"nic-0000-01-00-0": None, "nic-0000-02-00-0": (1023,)}
    lines = [r for r in caplog.records if "out of range" in r.getMessage()]
    assert len(lines) == 1 and "0000:01:00.0" in str(getattr(lines[0], "file", ""))


@pytest.mark.parametrize("garbage", ["10 twelve 21 21", "\x00\xff", "10 12", "-"])
def test_a_garbage_distance_file_is_one_line_and_the_single_element_list(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, garbage: str) -> None:
    _machine(tmp_path, {"0000:01:00.0": 3, "0000:02:00.0": 3})
    _node_file(tmp_path, 3, "distance").write_text(garbage + "\n")
    with caplog.at_level(logging.WARNING, logger="discovery.numa"):
        numa = _numa(tmp_path)
    assert numa == {"nic-0000-01-00-0": (3,), "nic-0000-02-00-0": (3,)}
    warned = [r for r in caplog.records if r.name == "discovery.numa"]
    assert len(warned) == 1, "one line per file and scan, not per device"
    assert str(_node_file(tmp_path, 3, "distance")) == getattr(warned[0], "file", None)


def test_a_non_numeric_cpulist_makes_the_socket_unknown(tmp_path: Path,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    _machine(tmp_path, {"0000:01:00.0": 0})
    _node_file(tmp_path, 0, "distance").write_text("10 12 12 21\n")
    _node_file(tmp_path, 0, "cpulist").write_text("zero-three\n")
    with caplog.at_level(logging.WARNING, logger="discovery.numa"):
        numa = _numa(tmp_path)
    assert numa == {"nic-0000-01-00-0": (0, 1, 2)}  # own socket unknown: all equidistant
    assert [r.getMessage() for r in caplog.records if r.name == "discovery.numa"] == [
        "ignoring unparsable NUMA cpulist"]


def test_cpulist_parsing() -> None:
    assert parse_cpulist("0-3,8,10-11\n") == (0, 1, 2, 3, 8, 10, 11)
    assert parse_cpulist("") == ()
    for bad in ("a", "3-1", "1-", "-1"):
        with pytest.raises(ValueError):
            parse_cpulist(bad)


def test_reader_reads_each_node_once(tmp_path: Path) -> None:
    _machine(tmp_path, {})
    reader = NumaReader(tmp_path)
    assert reader.nodes_for(0) == (0, 1)
    _node_file(tmp_path, 0, "distance").unlink()
    assert reader.nodes_for(0) == (0, 1)  # cached for the scan
    assert NumaReader(tmp_path).nodes_for(0) == (0,)


def test_a_list_too_long_for_48_values_is_shortened_keeping_the_physical_node(
        caplog: pytest.LogCaptureFixture) -> None:
    from discovery.attrs import fit_limits
    from discovery.model import Device, DeviceType

    attrs: dict[str, object] = {f"a{i}": i for i in range(20)}
    attrs[NUMA_NODE] = tuple(range(5, 45))  # 1 + 20 + 40 = 61 values
    device = Device("gpu-0", DeviceType.GPU, attrs, {})  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="discovery.attrs"):
        fitted = fit_limits(device)
    numa = fitted.attributes[NUMA_NODE]
    assert isinstance(numa, tuple) and numa[0] == 5 and len(numa) == 48 - 21
    assert len(caplog.records) == 1
    small = Device("gpu-1", DeviceType.GPU, {NUMA_NODE: (0, 1)}, {})
    assert fit_limits(small) is small
