"""Sharing (``--sharing gpu=shares:4``) on the real API server, allocated by the scheduler's
own allocator and prepared through the kubelet's own DRA manager.

1.37 keeps the shareable form (DRAConsumableCapacity is beta and on since 1.36): three claims
asking for 2, 1 and 1 shares land on one GPU, each share is its own CDI device, and one pod's
unprepare leaves the other shares running. 1.35 has the gate off: the server drops
``allowMultipleAllocations`` and the request policies, the agent says so once and does not
rewrite the slices, and the same claims get whole GPUs, prepared as exclusive devices.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.harness import DRIVER, NodeDirs
from tests.realk8s.agent import allocate, revisions, wait_settled
from tests.realk8s.cluster import RealCluster
from tests.realk8s.conftest import StartAgent, StartKubelet
from tests.realk8s.test_kubelet_dra import get_pod
from tests.realk8s.test_node_identity import pod_using
from tests.waiting import wait_for

# Versioned: DRAConsumableCapacity: on since 1.36, off on 1.35 (whole GPUs there).
pytestmark = pytest.mark.versioned

SHARED_CLASS = f"gpu-shared.{DRIVER}"


def share_claim(cluster: RealCluster, name: str, shares: int) -> dict[str, Any]:
    return cluster.create({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": SHARED_CLASS,
            "capacity": {"requests": {"shares": str(shares)}}}}]}},
    })


def the_result(claim: dict[str, Any]) -> dict[str, Any]:
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    return dict(result)


def test_shares_of_one_gpu_through_the_real_kubelet(
    cluster: RealCluster, node: str, dirs: NodeDirs, start_agent: StartAgent,
    start_kubelet: StartKubelet, minor: str,
) -> None:
    node_kubeconfig = cluster.node_kubeconfig(node)
    agent = start_agent(node_kubeconfig, node, "--sharing", "gpu=shares:4")
    wait_settled(cluster, node, agent)
    kubelet = start_kubelet(node_kubeconfig, node)
    wait_for(lambda: kubelet.registered(DRIVER)[DRIVER], timeout=20,
             what="the kubelet's plugin manager registers the agent")
    before = wait_settled(cluster, node, agent)
    gpus = [d for s in cluster.slices(node) for d in s["spec"]["devices"]
            if d["name"].startswith("gpu-")]
    assert len(gpus) == 8
    gated = minor == "1.35"
    if gated:
        # The server stored the slices without what its gate does not know; the agent said
        # so and does not fight it (the slices stay as they are).
        assert not any("allowMultipleAllocations" in d for d in gpus)
        assert "DRAConsumableCapacity" in agent.logs()
    else:
        assert all(d.get("allowMultipleAllocations") is True for d in gpus)
        assert gpus[0]["capacity"]["shares"]["requestPolicy"]["validRange"]["max"] == "4"

    claims, pods = [], []
    for name, shares in ((f"sa-{node}", 2), (f"sb-{node}", 1), (f"sc-{node}", 1)):
        claim = share_claim(cluster, name, shares)
        pod = pod_using(cluster, node, claim)
        claims.append(allocate(cluster, claim, node, pod=pod))
        pods.append(get_pod(cluster, pod))
    results = [the_result(c) for c in claims]
    if gated:  # whole GPUs, no share
        assert len({r["device"] for r in results}) == 3
        assert not any("shareID" in r for r in results)
    else:  # one GPU, 2 + 1 + 1 of its 4 shares
        assert len({r["device"] for r in results}) == 1
        assert [r["consumedCapacity"]["shares"] for r in results] == ["2", "1", "1"]

    kubelet.active(pods)
    for claim, pod, result in zip(claims, pods, results, strict=True):
        assert kubelet.prepare(pod) == ""
        suffix = f"_{result['shareID']}" if not gated else ""
        assert kubelet.resources(pod, "c") == [
            f"k8s.{DRIVER}/claim={claim['metadata']['uid']}-{result['device']}{suffix}"]
    records = dirs.records()
    assert len(records) == 3
    if not gated:
        assert sorted(r["devices"][0]["consumedCapacity"]["shares"]
                      for r in records.values()) == ["1", "1", "2"]

    # One pod goes: its share is unprepared, the other two keep theirs.
    kubelet.active(pods[1:])
    assert kubelet.unprepare(pods[0]) == ""
    assert sorted(dirs.records()) == sorted(c["metadata"]["uid"] for c in claims[1:])
    assert len(dirs.cdi_files()) == 2
    kubelet.active([])
    for pod in pods[1:]:
        assert kubelet.unprepare(pod) == ""
    assert dirs.records() == {} and dirs.cdi_files() == []
    # Nothing of this was a slice write.
    assert revisions(cluster, node) == before
