"""resource.k8s.io fallback against real servers that serve one older version only (as a
1.32-1.33 era cluster, or one with v1 switched off): the agent publishes and prepares."""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.harness import DRIVER, GPU_CLASS, device_classes, ref
from tests.fakes.kubelet import KubeletStandIn
from tests.realk8s.agent import published, wait_settled
from tests.realk8s.cluster import RESOURCE, RealCluster
from tests.realk8s.conftest import StartAgent, StartCluster
from tests.realk8s.test_node_identity import pod_using

# Versioned: the older resource.k8s.io versions as each minor serves and converts them.
pytestmark = pytest.mark.versioned


def claim_body(version: str, name: str) -> dict[str, Any]:
    request: dict[str, Any] = {"name": "gpu"}
    if version == "v1beta1":
        request["deviceClassName"] = GPU_CLASS  # v1beta1 has the request fields inline
    else:
        request["exactly"] = {"deviceClassName": GPU_CLASS}
    return {"apiVersion": f"resource.k8s.io/{version}", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"devices": {"requests": [request]}}}


def allocate_at(cluster: RealCluster, version: str, claim: dict[str, Any], node: str,
                pod: dict[str, Any]) -> dict[str, Any]:
    """The scheduler's write, at the only version served. The allocation's shape is the same
    in v1, v1beta2 and v1beta1; the allocator reads the claim in its v1 form."""
    from agent.explain import explain

    meta = claim["metadata"]
    as_v1 = {**claim_body("v1", meta["name"]), "metadata": meta}
    # The allocator reads v1 slices; v1beta1 wraps each device's fields in "basic".
    slices = [{**s, "spec": {**s["spec"], "devices": [
        {"name": d["name"], **d.get("basic", {})} if "basic" in d else d
        for d in s["spec"]["devices"]]}} for s in cluster.slices(node)]
    result = explain(as_v1, device_classes(), slices, node)
    assert result.fits and result.allocation, result.to_dict()
    path = f"{RESOURCE}/{version}/namespaces/default/resourceclaims/{meta['name']}/status"
    current = cluster.get(path)
    assert current is not None
    current["status"] = {"allocation": result.allocation, "reservedFor": [
        {"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}]}
    resp = cluster.admin.request("PUT", path, body=current)
    resp.raise_for_status()
    allocated: dict[str, Any] = resp.json()
    return allocated


@pytest.mark.parametrize("version", ["v1beta2", "v1beta1"])
def test_agent_falls_back_and_prepares(
    version: str, start_cluster: StartCluster, start_agent: StartAgent,
    kubelet: KubeletStandIn,
) -> None:
    cluster = start_cluster("--resource-versions", version)
    groups = cluster.get(f"{RESOURCE}")
    assert groups is not None
    assert [v["version"] for v in groups["versions"]] == [version]
    node = "node-old"
    cluster.ensure_node(node)
    cluster.create({"apiVersion": "v1", "kind": "ServiceAccount",
                    "metadata": {"name": "default", "namespace": "default"}})
    agent = start_agent(cluster.node_kubeconfig(node), node)
    wait_settled(cluster, node, agent)
    assert f"api_version={version}" in agent.logs()
    assert sum(n.startswith("gpu-") for n in published(cluster, node)) == 8

    claim = cluster.create(claim_body(version, "old"))
    pod = pod_using(cluster, node, claim)
    claim = allocate_at(cluster, version, claim, node, pod)
    result = kubelet.prepare(DRIVER, [ref(claim)])[claim["metadata"]["uid"]]
    assert result.ok, result.error
    (device,) = result.devices
    assert device.device_name == claim["status"]["allocation"]["devices"]["results"][0]["device"]
    unprepared = kubelet.unprepare(DRIVER, [ref(claim)])[claim["metadata"]["uid"]]
    assert unprepared.ok, unprepared.error
