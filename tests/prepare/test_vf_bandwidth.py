"""--vf-bandwidth: each VF of a PF is guaranteed a share of the PF's link. The counter set
``<pf>-vfs`` carries the link speed as ``bandwidth``, every VF (to be, or made) consumes its
rate from it, prepare caps the VF at that rate and unprepare, the rollback and start-up lift
the cap; a PF whose link cannot carry one VF offers none."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

from agent.commands.configfile import ConfigError, build_config
from agent.common.failpoints import FailpointError, Failpoints
from agent.inventory import discovery_options
from discovery.scan import DiscoveryOptions, discover
from discovery.simulate import simulated_sources
from discovery.vfs import parse_vf_rate, rate_quantity, vf_info_message
from tests.plugnode import make_claim
from tests.prepare.test_host_undo_kill import run_child, vf_node, vf_preparer

PF0, PF1 = "0000:3b:00.0", "0000:3b:00.1"
BANDWIDTH = DiscoveryOptions(vfs="dynamic", vf_bandwidth_mbps=25_000)


def cap_of(root: Path, pf: str, index: int) -> int | None:
    path = root / "sim/sys/bus/pci/devices" / pf / "sriov" / str(index) / "max_tx_rate"
    return int(path.read_text()) if path.exists() else None


def counters(inv: Any) -> dict[str, dict[str, str]]:
    return {c.name: dict(c.counters) for c in inv.counter_sets}


def test_vfs_to_be_and_made_vfs_consume_their_rate_of_the_link(tmp_path: Path) -> None:
    novfs = discover(simulated_sources("sriov-novfs", tmp_path / "a"), BANDWIDTH)
    assert counters(novfs) == {"nic-0000-3b-00-0-vfs": {"vfs": "64", "bandwidth": "100G"},
                               "nic-0000-3b-00-1-vfs": {"vfs": "64", "bandwidth": "100G"}}
    first = novfs.by_name()["vf-0000-3b-00-2"].to_api()
    assert first["consumesCounters"] == [{"counterSet": "nic-0000-3b-00-0-vfs", "counters": {
        "bandwidth": {"value": "25G"}, "vfs": {"value": "1"}}}]
    assert first["capacity"] == {"bandwidth": {"value": "25G"}}
    # Four 25G VFs fill a 100G link: only those are offered, the other 60 could never be
    # allocated (and would make a claim for five try every four of 64 in the scheduler).
    offered = [d for d in novfs.devices if d.type == "vf"]
    assert [d.attributes["vfIndex"] for d in offered] == [0, 1, 2, 3] * 2
    # VFs that exist consume from the same set, as the pre-sizing left it (NumVFs).
    made = discover(simulated_sources("sriov-nic", tmp_path / "b"), BANDWIDTH)
    assert counters(made) == {"nic-0000-3b-00-0-vfs": {"vfs": "64", "bandwidth": "100G"},
                              "nic-0000-3b-00-1-vfs": {"vfs": "64", "bandwidth": "100G"}}
    vfs = [d for d in made.devices if d.type == "vf"]
    assert sorted(d.attributes["vfIndex"] for d in vfs) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert all(d.to_api()["consumesCounters"][0]["counters"] == {
        "bandwidth": {"value": "25G"}, "vfs": {"value": "1"}} for d in vfs)
    # The PF consumes the whole set, its link included: never allocated beside its VFs.
    for inv in (novfs, made):
        assert inv.by_name()["nic-0000-3b-00-0"].to_api()["consumesCounters"] == [{
            "counterSet": "nic-0000-3b-00-0-vfs", "counters": {
                "bandwidth": {"value": "100G"}, "vfs": {"value": "64"}}}]
    assert not made.warnings and not novfs.warnings


def test_a_link_that_cannot_carry_one_vf_offers_none_and_says_why(tmp_path: Path) -> None:
    sources = simulated_sources("sriov-novfs", tmp_path / "sim")
    net = next((sources.sysfs_root / "bus/pci/devices" / PF1 / "net").iterdir())
    (net / "speed").write_text("-1\n")  # link down
    (net / "operstate").write_text("down\n")
    inv = discover(sources, DiscoveryOptions(vfs="dynamic", vf_bandwidth_mbps=200_000))
    assert not [d for d in inv.devices if d.type == "vf"]
    assert set(counters(inv)) == {"nic-0000-3b-00-0-vfs", "nic-0000-3b-00-1-vfs"}
    assert inv.warnings == (
        f"VFs of PF {PF0} not offered: each is guaranteed 200G (--vf-bandwidth) and the "
        "link runs at 100G",
        f"VFs of PF {PF1} not offered: each is guaranteed 200G (--vf-bandwidth) and the "
        "link is down or its speed unknown")
    assert [d.name for d in inv.devices if d.type == "nic"] == [  # the PFs themselves stay
        "nic-0000-3b-00-0", "nic-0000-3b-00-1"]


@pytest.mark.parametrize(("text", "mbps"), [("25G", 25_000), ("2500M", 2_500),
                                            ("25000M", 25_000), ("1T", 1_000_000)])
def test_rates_are_whole_mbits(text: str, mbps: int) -> None:
    assert parse_vf_rate(text) == mbps
    assert parse_vf_rate(rate_quantity(mbps)) == mbps


@pytest.mark.parametrize("text", ["25", "25Gi", "1.5G", "0M", "-1G", "25 G", "", "5000T",
                                  "25G\n1G"])
def test_bad_rates_are_one_line(text: str) -> None:
    with pytest.raises(ValueError, match="expected a rate such as 25G"):
        parse_vf_rate(text)


def test_the_flag_needs_vfs_on_demand_and_is_kept_normalised() -> None:
    with pytest.raises(ConfigError, match="--vf-bandwidth needs --vfs dynamic"):
        build_config({"vf_bandwidth": "25G"})
    cfg = build_config({"vf_bandwidth": "25000M", "vfs": "dynamic"})
    assert cfg.vf_bandwidth == "25G"
    assert discovery_options(cfg).vf_bandwidth_mbps == 25_000
    with pytest.raises(ConfigError, match=r"^vf-bandwidth: expected a rate such as 25G"):
        build_config({"vf_bandwidth": "lots", "vfs": "dynamic"})


def bandwidth_node(root: Path) -> Any:
    vf_node(root)
    return vf_preparer(root, bandwidth=25_000)


def test_prepare_caps_the_vf_and_unprepare_lifts_the_cap(tmp_path: Path) -> None:
    p = bandwidth_node(tmp_path)
    record = p.prepare(_claim())
    assert cap_of(tmp_path, PF0, 1) == 25_000
    assert record.devices[0].extra["vfRateCap"] == {"pf": PF0, "index": 1}
    p.unprepare(record.uid)
    assert cap_of(tmp_path, PF0, 1) == 0


def test_a_failing_prepare_lifts_the_cap_it_set(tmp_path: Path) -> None:
    vf_node(tmp_path)
    p = vf_preparer(tmp_path, Failpoints.parse("vf-after-bound=error"), bandwidth=25_000)
    with pytest.raises(FailpointError):
        p.prepare(_claim())
    assert cap_of(tmp_path, PF0, 1) == 0 and p.checkpoint.claims() == {}


def test_kill_after_the_cap_then_start_up_lifts_it(tmp_path: Path) -> None:
    vf_node(tmp_path)
    (tmp_path / "bandwidth").write_text("25000")  # read by the child's vf_preparer
    raw = _raw_claim()
    (tmp_path / "claim.json").write_text(json.dumps(raw))
    run_child(tmp_path, "vf-after-bound", "vf")
    assert cap_of(tmp_path, PF0, 1) == 25_000
    restarted = vf_preparer(tmp_path)
    restarted.recover()
    assert cap_of(tmp_path, PF0, 1) == 0 and restarted.checkpoint.claims() == {}


def test_the_rate_message_is_setlink_with_ifla_vf_rate() -> None:
    msg = vf_info_message(7, 6, struct.pack("=III", 3, 0, 25_000), seq=2)
    assert struct.unpack_from("=IHH", msg)[:2] == (len(msg), 19)
    rate_len, rate_kind = struct.unpack_from("=HH", msg, 40)
    assert (rate_len, rate_kind) == (4 + 12, 6)  # IFLA_VF_RATE: struct ifla_vf_rate
    assert struct.unpack_from("=III", msg, 44) == (3, 0, 25_000)


def _raw_claim() -> dict[str, Any]:
    return make_claim("net", ["vf-0000-3b-00-3"])


def _claim() -> Any:
    from agent.claim.parse import parse_claim

    return parse_claim(_raw_claim())
