"""The agent with exactly the DaemonSet's credentials (deploy/base applied: RBAC and the
ValidatingAdmissionPolicy), against the real kube-apiserver: a TokenRequest token of its
ServiceAccount bound to a Pod on the node, as the kubelet projects it."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from tests.e2e.harness import DRIVER, NIC_CLASS, ref
from tests.fakes.kubelet import KubeletStandIn
from tests.realk8s.agent import (
    allocate,
    make_claim,
    published,
    revisions,
    slice_writes,
    wait_settled,
)
from tests.realk8s.cluster import RESOURCE, RealCluster, status_text
from tests.realk8s.conftest import StartAgent, StartCluster
from tests.waiting import wait_for

SLICES = f"{RESOURCE}/v1/resourceslices"


def foreign_slice(node: str | None, name: str) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "driver": DRIVER, "pool": {"name": node or "fleet", "generation": 1,
                                   "resourceSliceCount": 1},
        "devices": [{"name": "gpu-0"}],
    }
    if node:
        spec["nodeName"] = node
    else:
        spec["allNodes"] = True
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": name}, "spec": spec}


def test_publishes_with_the_daemonset_token_and_writes_nothing_at_rest(
    cluster: RealCluster, node: str, start_agent: StartAgent
) -> None:
    kubeconfig = cluster.agent_kubeconfig(node)
    agent = start_agent(kubeconfig, node)
    settled = wait_settled(cluster, node, agent)
    devices = published(cluster, node)
    assert sum(n.startswith("gpu-") for n in devices) == 8
    assert sum(n.startswith("nic-") for n in devices) >= 8
    # Every slice is owned by the Node and was accepted as sent (nothing dropped or refused).
    node_uid = cluster.get(f"/api/v1/nodes/{node}")["metadata"]["uid"]  # type: ignore[index]
    for s in cluster.slices(node):
        (owner,) = s["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"]) == ("Node", node, node_uid)
    assert "dropped" not in agent.logs() and "level=error" not in agent.logs()

    # At rest: no write for a while, neither in the agent's count nor in the server's objects.
    writes = slice_writes(agent)
    time.sleep(3)
    assert slice_writes(agent) == writes
    assert revisions(cluster, node) == settled

    # A restart writes nothing either: the agent recognises its own slices.
    assert agent.terminate() == 0
    again = start_agent(kubeconfig, node, name="agent2")
    again.wait_http("/readyz/slices", timeout=30)  # no kubelet here to confirm a registration
    time.sleep(3)
    assert revisions(cluster, node) == settled
    assert sum(v for k, v in slice_writes(again).items() if k != "get") == 0, slice_writes(again)


def test_kubelet_wipe_with_node_credentials_is_restored(
    cluster: RealCluster, node: str, start_agent: StartAgent
) -> None:
    agent = start_agent(cluster.agent_kubeconfig(node), node)
    before = wait_settled(cluster, node, agent)
    # The kubelet's own wipe: one DELETE of the collection with the nodeName field selector,
    # under the node's identity (the Node authorizer allows no other form).
    kubelet = cluster.client(cluster.node_kubeconfig(node))
    wiped = kubelet.request("DELETE", SLICES, query={"fieldSelector": f"spec.nodeName={node}"})
    assert wiped.status == 200, status_text(wiped)
    assert len(wiped.json()["items"]) == len(before)
    restored = wait_for(lambda: len(revisions(cluster, node)) == len(before) and
                        revisions(cluster, node), timeout=15, what="slices restored")
    assert set(restored).isdisjoint(before)  # new objects, not the old ones
    assert len(published(cluster, node)) >= 16  # the complete pool again


def test_admission_policy_keeps_the_token_to_its_own_node(
    cluster: RealCluster, node: str
) -> None:
    other = f"{node}-other"
    cluster.ensure_node(other)
    agent = cluster.client(cluster.agent_kubeconfig(node))
    # Another node's slice, created by an admin.
    theirs = cluster.create(foreign_slice(other, f"{other}-slice"))

    create = cluster.create_response(foreign_slice(other, f"{other}-mine"), agent)
    assert create.status == 403, status_text(create)
    assert (f"may only write ResourceSlices with spec.nodeName {node}, not {other}"
            in create.json()["message"])
    assert "ValidatingAdmissionPolicy 'dra-agent-own-node-slices'" in create.json()["message"]

    fleet = cluster.create_response(foreign_slice(None, f"{node}-fleet"), agent)
    assert fleet.status == 403, status_text(fleet)
    assert "not a slice without spec.nodeName" in fleet.json()["message"]

    # Its own node, but another driver's name or another pool: refused too.
    nvidia = foreign_slice(node, f"{node}-nvidia")
    nvidia["spec"]["driver"] = "gpu.nvidia.com"
    fake_gpus = cluster.create_response(nvidia, agent)
    assert fake_gpus.status == 403, status_text(fake_gpus)
    assert ("may only write ResourceSlices of driver dra-agent.io, not gpu.nvidia.com"
            in fake_gpus.json()["message"])
    shadow = foreign_slice(node, f"{node}-shadow")
    shadow["spec"]["pool"]["name"] = "shadow"
    pool = cluster.create_response(shadow, agent)
    assert pool.status == 403, status_text(pool)
    assert f"may only write the pool {node}, not shadow" in pool.json()["message"]
    # While its own slice in its own pool passes the policy.
    own = cluster.create_response(foreign_slice(node, f"{node}-own"), agent,
                                  query={"dryRun": "All"})
    assert own.status == 201, status_text(own)

    path = f"{SLICES}/{theirs['metadata']['name']}"
    changed = dict(theirs, spec={**theirs["spec"], "devices": [{"name": "gpu-1"}]})
    update = agent.request("PUT", path, body=changed)
    assert update.status == 403, status_text(update)
    assert f"not {other}" in update.json()["message"]

    # Taking the slice over (moving it to this node) never gets as far as the policy: the
    # real server keeps spec.nodeName immutable (validation runs before admission policies).
    moved = dict(theirs, spec={**theirs["spec"], "nodeName": node})
    take = agent.request("PUT", path, body=moved)
    assert take.status == 422, status_text(take)
    assert take.json()["details"]["causes"][0]["field"] == "spec.nodeName"
    assert "field is immutable" in take.json()["message"]

    delete = agent.request("DELETE", path)
    assert delete.status == 403, status_text(delete)
    assert f"not {other}" in delete.json()["message"]
    assert cluster.get(path) is not None

    # RBAC alone: verbs the agent never uses are not granted.
    patch = agent.request("PATCH", path, body=b"{}", content_type="application/merge-patch+json")
    assert patch.status == 403, status_text(patch)
    assert 'cannot patch resource "resourceslices"' in patch.json()["message"]
    wipe = agent.request("DELETE", SLICES, query={"fieldSelector": f"spec.nodeName={other}"})
    assert wipe.status == 403, status_text(wipe)


def test_token_without_a_node_is_refused(cluster: RealCluster, node: str) -> None:
    """A token of the same ServiceAccount not bound to a pod on a node carries no node name:
    the policy refuses every slice write."""
    review = cluster.admin.request(
        "POST", "/api/v1/namespaces/dra-agent/serviceaccounts/dra-agent/token",
        body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
              "spec": {"expirationSeconds": 600}})
    review.raise_for_status()
    unbound = cluster.client(cluster.token_kubeconfig(review.json()["status"]["token"],
                                                      f"unbound-{node}"))
    resp = cluster.create_response(foreign_slice(node, f"{node}-unbound"), unbound)
    assert resp.status == 403, status_text(resp)
    assert "only with a node-bound token" in resp.json()["message"]


def test_nic_claim_status_is_written(
    cluster: RealCluster, node: str, start_agent: StartAgent, kubelet: KubeletStandIn
) -> None:
    """status.devices of a NIC claim: RBAC resourceclaims/status patch plus, since 1.36,
    resourceclaims/driver associated-node:patch for our driver."""
    agent = start_agent(cluster.agent_kubeconfig(node), node)
    wait_settled(cluster, node, agent)
    claim = make_claim(cluster, f"nic-{node}", [("nic", NIC_CLASS)])
    claim = allocate(cluster, claim, node)
    uid = claim["metadata"]["uid"]
    result = kubelet.prepare(DRIVER, [ref(claim)])[uid]
    assert result.ok, result.error
    path = f"{RESOURCE}/v1/namespaces/default/resourceclaims/{claim['metadata']['name']}"

    def written() -> list[dict[str, object]] | None:
        current = cluster.get(path)
        return ((current or {}).get("status") or {}).get("devices")

    (status,) = wait_for(written, timeout=15, what="status.devices written")
    (allocated,) = claim["status"]["allocation"]["devices"]["results"]
    assert (status["driver"], status["pool"], status["device"]) == (
        DRIVER, allocated["pool"], allocated["device"])
    assert status["networkData"]["interfaceName"]  # type: ignore[index]
    assert "claim status" not in agent.logs() or "forbidden" not in agent.logs().lower()


@pytest.mark.versioned  # granular status authorization: 1.36+ refuses, 1.35 allows
def test_status_write_needs_the_driver_rule_since_1_36(
    start_cluster: StartCluster, start_agent: StartAgent, kubelet: KubeletStandIn, minor: str
) -> None:
    """The rule deploy/base/rbac.yaml lacked: without resourceclaims/driver the same write is
    refused by 1.36+ (granular status authorization), and still allowed by 1.35."""
    cluster = start_cluster()
    cluster.apply_deploy("base")
    role = json.loads(cluster.kubectl("get", "clusterrole", "dra-agent", "-o", "json").stdout)
    role["rules"] = [r for r in role["rules"] if r["resources"] != ["resourceclaims/driver"]]
    replaced = cluster.kubectl("replace", "-f", "-", input=json.dumps(role))
    assert replaced.returncode == 0, replaced.stderr
    node = "node-norule"
    cluster.ensure_node(node)
    agent = start_agent(cluster.agent_kubeconfig(node), node)
    wait_settled(cluster, node, agent)
    claim = allocate(cluster, make_claim(cluster, "nic", [("nic", NIC_CLASS)]), node)
    result = kubelet.prepare(DRIVER, [ref(claim)])[claim["metadata"]["uid"]]
    assert result.ok, result.error  # a refused status write never fails the prepare
    path = f"{RESOURCE}/v1/namespaces/default/resourceclaims/nic"
    if minor == "1.35":
        wait_for(lambda: (cluster.get(path) or {}).get("status", {}).get("devices"),
                 timeout=15, what="status.devices written without the rule on 1.35")
        return
    refused = wait_for(lambda: [line for line in agent.logs().splitlines()
                                if "claim status is not written" in line],
                       timeout=15, what="the refusal logged")
    assert 'resource=\\"resourceclaims/driver\\"' in refused[0], refused[0]
    assert not (cluster.get(path) or {}).get("status", {}).get("devices")
