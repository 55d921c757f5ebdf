"""--vfs dynamic end to end: the real agent on simulated sriov-novfs publishes each PF's
VFs-to-be with their counter sets, explain allocates one, the kubelet's prepare makes the PF's
VFs (0 -> TotalVFs) and hands out that VF, and the agent publishes the VFs as they now are."""

from __future__ import annotations

import json
from typing import Any

from tests.e2e.conftest import StartAgent
from tests.e2e.harness import (
    DRIVER,
    Cluster,
    NodeDirs,
    allocated_devices,
    assert_answer,
    ref,
    wait_for,
    wait_registered,
)
from tests.fakes.kubelet import KubeletStandIn

VF_CLASS = f"vf.{DRIVER}"


def devices(cluster: Cluster) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in cluster.node_slices() for d in s["spec"].get("devices") or ()}


def consuming_vfs(got: dict[str, dict[str, Any]]) -> int:
    """The VFs (to be, or made) that consume from their PF's counter set."""
    return sum(1 for name, d in got.items() if name.startswith("vf-") and "consumesCounters" in d)


def test_a_vf_made_on_first_use_from_slices_to_the_pod(
    dirs: NodeDirs, cluster: Cluster, start_agent: StartAgent, kubelet: KubeletStandIn,
) -> None:
    start_agent("--vfs", "dynamic", profile="sriov-novfs")
    wait_registered(kubelet)
    published = wait_for("128 candidate VFs", lambda: (got := devices(cluster))
                         and consuming_vfs(got) == 128 and got, timeout=30)
    assert "vf-0000-3b-00-2" in published
    assert published["nic-0000-3b-00-0"]["consumesCounters"] == [  # the PF: all of its set
        {"counterSet": "nic-0000-3b-00-0-vfs", "counters": {"vfs": {"value": "64"}}}]
    sets = [c["name"] for s in cluster.node_slices() for c in s["spec"].get("sharedCounters") or ()]
    assert sorted(sets) == ["nic-0000-3b-00-0-vfs", "nic-0000-3b-00-1-vfs"]

    claim = cluster.allocate(cluster.create_claim("net", [("vf", VF_CLASS)]))
    [picked] = allocated_devices(claim)
    uid = claim["metadata"]["uid"]
    result = kubelet.prepare(DRIVER, [ref(claim)])[uid]
    assert_answer(claim, result)
    spec = json.loads(next(dirs.cdi.glob(f"*{uid}*.json")).read_text())
    env = [e for d in spec["devices"] for e in d["containerEdits"].get("env", [])]
    assert any(e.endswith("_IF_NAME=enp59s0f0v0") for e in env), env

    # The VFs exist now: the agent publishes them as they are, under the same names.
    def made() -> dict[str, dict[str, Any]] | None:
        got = devices(cluster)
        vf = got.get(picked, {})
        return got if "ifName" in vf.get("attributes", {}) else None

    now = wait_for("the made VFs published", made, timeout=30)
    assert now[picked]["attributes"]["ifName"] == {"string": "enp59s0f0v0"}
    # Made, each still one of its PF's set (which the PF consumes whole); PF1's still to be.
    assert now[picked]["consumesCounters"] == [{"counterSet": "nic-0000-3b-00-0-vfs",
                                                "counters": {"vfs": {"value": "1"}}}]
    assert consuming_vfs(now) == 128
    kubelet.unprepare(DRIVER, [ref(claim)])
    assert not list(dirs.cdi.glob(f"*{uid}*.json"))


def test_vf_bandwidth_survives_the_vfs_being_made(
    dirs: NodeDirs, cluster: Cluster, start_agent: StartAgent, kubelet: KubeletStandIn,
) -> None:
    """--vf-bandwidth 25G on 100G links: four VFs per PF, each consuming 25G of its link,
    before and after the first prepare made the PF's VFs (the set and the names stay)."""
    agent = start_agent("--vfs", "dynamic", "--vf-bandwidth", "25G", profile="sriov-novfs")
    wait_registered(kubelet)
    published = wait_for("8 VFs-to-be", lambda: (got := devices(cluster))
                         and consuming_vfs(got) == 8 and got, timeout=30)
    sets = {c["name"]: c["counters"] for s in cluster.node_slices()
            for c in s["spec"].get("sharedCounters") or ()}
    assert sets["nic-0000-3b-00-0-vfs"]["bandwidth"] == {"value": "100G"}
    assert published["vf-0000-3b-00-2"]["capacity"] == {"bandwidth": {"value": "25G"}}

    claim = cluster.allocate(cluster.create_claim("net", [("vf", VF_CLASS)]))
    [picked] = allocated_devices(claim)
    uid = claim["metadata"]["uid"]
    assert_answer(claim, kubelet.prepare(DRIVER, [ref(claim)])[uid])
    assert 'msg="VF rate capped"' in agent.logs() and "max_tx_rate_mbps=25000" in agent.logs()

    def made() -> dict[str, dict[str, Any]] | None:
        got = devices(cluster)
        vf = got.get(picked, {})
        return got if "ifName" in vf.get("attributes", {}) else None

    now = wait_for("the made VFs published", made, timeout=30)
    assert now[picked]["consumesCounters"] == [{"counterSet": "nic-0000-3b-00-0-vfs", "counters": {
        "bandwidth": {"value": "25G"}, "vfs": {"value": "1"}}}]
    assert consuming_vfs(now) == 8
    kubelet.unprepare(DRIVER, [ref(claim)])
    wait_for("the cap lifted", lambda: 'msg="VF rate cap lifted"' in agent.logs(), timeout=10)
