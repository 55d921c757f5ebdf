"""Extended resources backed by DRA (KEP-5004, GA in 1.37): a pod asks for `dra-agent.io/gpu: 2`
in its limits, with no ResourceClaim of its own. The scheduler writes a special claim for it
(what `test_a_pod_asking_for_an_extended_resource` plays, from kube-scheduler's
extendeddynamicresources.go at 1.37), and the real kubelet finds it in the pod's
`status.extendedResourceClaimStatus`, has the agent prepare it and hands the container the
devices of the request mapped to it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness import DRIVER, GPU_CLASS, NodeDirs
from tests.realk8s.agent import allocate, wait_settled
from tests.realk8s.cluster import RealCluster
from tests.realk8s.conftest import StartAgent, StartKubelet
from tests.realk8s.test_kubelet_dra import agent_and_kubelet, get_pod, inject

# Versioned: extended resources: GA in 1.37, alpha and off in 1.35 (the field is dropped).
pytestmark = pytest.mark.versioned

RESOURCE = "dra-agent.io/gpu"  # the shipped gpu class's extendedResourceName


def _special_claim(cluster: RealCluster, pod: dict[str, Any], count: int) -> dict[str, Any]:
    """The scheduler's claim for a pod's DRA-backed extended resources: generated name
    ``<pod>-extended-resources-``, the pod as controller, the extended-resource annotation, one
    request per container and resource named ``container-<i>-request-<j>``."""
    meta = pod["metadata"]
    return cluster.create({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {
            "generateName": f"{meta['name']}-extended-resources-", "namespace": meta["namespace"],
            "annotations": {"resource.kubernetes.io/extended-resource-claim": "true"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": meta["name"],
                                 "uid": meta["uid"], "controller": True}]},
        "spec": {"devices": {"requests": [{"name": "container-0-request-0", "exactly": {
            "deviceClassName": GPU_CLASS, "allocationMode": "ExactCount", "count": count}}]}}})


def test_a_pod_asking_for_an_extended_resource(
    cluster: RealCluster, node: str, dirs: NodeDirs, start_agent: StartAgent,
    start_kubelet: StartKubelet, cdi_check_bin: Path, minor: str,
) -> None:
    _, kubelet = agent_and_kubelet(cluster, node, start_agent, start_kubelet)
    pod = cluster.create({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"extended-{node}", "namespace": "default"},
        "spec": {"nodeName": node, "containers": [
            {"name": "c", "image": "busybox",
             "resources": {"limits": {RESOURCE: "2"}, "requests": {RESOURCE: "2"}}}]}})
    claim = allocate(cluster, _special_claim(cluster, pod, 2), node, pod=pod)
    name, uid = claim["metadata"]["name"], claim["metadata"]["uid"]
    patched = cluster.admin.request(
        "PATCH", f"/api/v1/namespaces/default/pods/{pod['metadata']['name']}/status",
        body={"status": {"extendedResourceClaimStatus": {
            "resourceClaimName": name,
            "requestMappings": [{"containerName": "c", "resourceName": RESOURCE,
                                 "requestName": "container-0-request-0"}]}}},
        content_type="application/merge-patch+json")
    patched.raise_for_status()
    pod = get_pod(cluster, pod)
    if minor == "1.35":
        # DRAExtendedResource is alpha and off in 1.35: the API server drops the status field,
        # so no kubelet of that release asks for the claim. Nothing to prepare.
        assert "extendedResourceClaimStatus" not in pod["status"]
        return
    assert pod["status"]["extendedResourceClaimStatus"]["resourceClaimName"] == name

    kubelet.active([pod])
    assert kubelet.prepare(pod) == ""
    results = claim["status"]["allocation"]["devices"]["results"]
    assert len(results) == 2 and {r["request"] for r in results} == {"container-0-request-0"}
    ids = kubelet.resources(pod, "c")
    assert sorted(ids) == sorted(f"k8s.{DRIVER}/claim={uid}-{r['device']}" for r in results)
    env = dict(e.split("=", 1) for e in inject(cdi_check_bin, dirs, ids)["process"]["env"])
    assert env["DRA_AGENT_CLAIM"] == f"default/{name}"
    (record,) = dirs.records().values()
    assert (record["namespace"], record["name"], record["state"]) == \
        ("default", name, "PrepareCompleted")

    assert kubelet.unprepare(pod) == ""
    assert dirs.cdi_files() == [] and dirs.records() == {}


def test_the_shipped_classes_keep_their_extended_resource_names(
    cluster: RealCluster, minor: str
) -> None:
    """Applied as deploy/base ships them: 1.37 stores extendedResourceName, 1.35 (its gate
    off) drops it and serves the classes as before."""
    cluster.apply_deploy()
    listed = cluster.admin.request("GET", "/apis/resource.k8s.io/v1/deviceclasses")
    listed.raise_for_status()
    names = {c["metadata"]["name"]: (c["spec"].get("extendedResourceName"))
             for c in listed.json()["items"] if c["metadata"]["name"].endswith(".dra-agent.io")}
    want = {f"{t}.dra-agent.io": f"dra-agent.io/{t}" for t in ("gpu", "mig", "nic", "vf")}
    want = want if minor == "1.37" else dict.fromkeys(want)
    # The shareable twins name none: a part of a device is no unit of an extended resource;
    # nor does a GPU's VFIO form: a VM's GPU is not a container's nvidia.com/gpu.
    assert names == {**want, "gpu-shared.dra-agent.io": None, "nic-shared.dra-agent.io": None,
                     "vfio.dra-agent.io": None}


def test_the_agent_refuses_a_node_whose_device_plugin_serves_a_mapped_name(
    cluster: RealCluster, node: str, start_agent: StartAgent, minor: str
) -> None:
    """With the DaemonSet's own credentials (its RBAC lists DeviceClasses and gets the Node):
    a device plugin's nvidia.com/gpu in the Node's capacity, and a class mapping that name to
    our GPUs, stop the agent before it publishes anything. 1.35 drops the field: no overlap."""
    cluster.create({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": f"migrated-{node}.dra-agent.io"},
        "spec": {"extendedResourceName": "nvidia.com/gpu", "selectors": [{"cel": {"expression":
                 "device.driver == 'dra-agent.io' && "
                 "device.attributes['dra-agent.io'].type == 'gpu'"}}]}})
    patched = cluster.admin.request(
        "PATCH", f"/api/v1/nodes/{node}/status",
        body={"status": {"capacity": {"nvidia.com/gpu": "8"},
                         "allocatable": {"nvidia.com/gpu": "8"}}},
        content_type="application/merge-patch+json")
    patched.raise_for_status()
    agent = start_agent(cluster.agent_kubeconfig(node), node, "--no-health")
    if minor == "1.35":
        wait_settled(cluster, node, agent)
        assert "device plugin" not in agent.logs()
        return
    assert agent.proc.wait(60) == 1, agent.logs()
    logs = agent.logs()
    assert (f"error: a device plugin already advertises nvidia.com/gpu on this node (Node "
            f"{node} status.capacity), and DeviceClass migrated-{node}.dra-agent.io") in logs
    assert "not listed" not in logs and "not read" not in logs, logs  # RBAC was enough
    assert cluster.slices(node) == []
