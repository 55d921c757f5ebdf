"""The agent under systemd, with the kubelet's own credentials (system:node:<name>): the Node
authorizer and NodeRestriction decide what it may do, no RBAC of ours is involved."""

from __future__ import annotations

from typing import Any

from tests.e2e.harness import DRIVER, GPU_CLASS, NIC_CLASS, ref
from tests.fakes.kubelet import KubeletStandIn
from tests.realk8s.agent import allocate, make_claim, published, wait_settled
from tests.realk8s.cluster import RESOURCE, RealCluster, status_text
from tests.realk8s.conftest import StartAgent
from tests.realk8s.test_daemonset_identity import SLICES, foreign_slice


def pod_using(cluster: RealCluster, node: str, claim: dict[str, Any],
              suffix: str = "pod") -> dict[str, Any]:
    """A Pod bound to ``node`` that names the claim: the Node authorizer's graph then lets the
    node read that claim, and only claims reached like this."""
    name = claim["metadata"]["name"]
    return cluster.create({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"{name}-{suffix}", "namespace": claim["metadata"]["namespace"]},
        "spec": {"nodeName": node, "containers": [
            {"name": "c", "image": "busybox", "resources": {"claims": [{"name": "dev"}]}}],
                 "resourceClaims": [{"name": "dev", "resourceClaimName": name}]},
    })


def test_publishes_through_the_node_authorizer(
    cluster: RealCluster, node: str, start_agent: StartAgent
) -> None:
    agent = start_agent(cluster.node_kubeconfig(node), node)
    wait_settled(cluster, node, agent)
    assert sum(n.startswith("gpu-") for n in published(cluster, node)) == 8
    assert "forbidden" not in agent.logs().lower()


def test_node_is_refused_another_nodes_slices(cluster: RealCluster, node: str) -> None:
    other = f"{node}-other"
    cluster.ensure_node(other)
    theirs = cluster.create(foreign_slice(other, f"{other}-n"))
    kubelet = cluster.client(cluster.node_kubeconfig(node))
    create = cluster.create_response(foreign_slice(other, f"{other}-by-{node}"), kubelet)
    assert create.status == 403, status_text(create)
    path = f"{SLICES}/{theirs['metadata']['name']}"
    delete = kubelet.request("DELETE", path)
    assert delete.status == 403, status_text(delete)
    # Lists only with this node's field selector.
    listed = kubelet.request("GET", SLICES)
    assert listed.status == 403, status_text(listed)
    assert "nodeName field selector" in listed.json()["message"]
    other_list = kubelet.request("GET", SLICES, query={"fieldSelector": f"spec.nodeName={other}"})
    assert other_list.status == 403, status_text(other_list)


def test_reads_only_claims_of_pods_on_its_node_and_keeps_preparing_without_status(
    cluster: RealCluster, node: str, start_agent: StartAgent, kubelet: KubeletStandIn
) -> None:
    agent = start_agent(cluster.node_kubeconfig(node), node)
    wait_settled(cluster, node, agent)

    # A claim no pod on this node uses: the Node authorizer refuses the GET; one clear error.
    stray = allocate(cluster, make_claim(cluster, f"stray-{node}", [("gpu", GPU_CLASS)]), node)
    refused = kubelet.prepare(DRIVER, [ref(stray)])[stray["metadata"]["uid"]]
    assert not refused.ok
    assert "403 Forbidden" in (refused.error or ""), refused.error
    assert "no relationship found between node" in (refused.error or ""), refused.error
    assert "\n" not in (refused.error or "")

    # Claims of pods bound to the node are readable; their NIC status cannot be written by a
    # node (no resourceclaims/status for system:nodes): said once, and preparing goes on.
    prepared = []
    for i in range(2):
        claim = make_claim(cluster, f"nic{i}-{node}", [("nic", NIC_CLASS)])
        pod = pod_using(cluster, node, claim)
        claim = allocate(cluster, claim, node, pod=pod)
        result = kubelet.prepare(DRIVER, [ref(claim)])[claim["metadata"]["uid"]]
        assert result.ok, result.error
        prepared.append(claim)
    logs = agent.logs()
    status_lines = [line for line in logs.splitlines()
                    if "status" in line and ("forbidden" in line.lower() or "403" in line)]
    assert len(status_lines) == 1, status_lines
    for claim in prepared:
        current = cluster.get(f"{RESOURCE}/v1/namespaces/default/resourceclaims/"
                              f"{claim['metadata']['name']}")
        assert current is not None and not current["status"].get("devices")
