"""Device metadata (KEP-5304) with the real kubelet DRA manager and API server: a claim made
from a template, as the resource claim controller leaves it (annotation, owner, the pod's
``resourceClaimStatuses``; no controller-manager runs here, so the test does its part), is
prepared by the kubelet, and the container's CDI edits mount the metadata file under the pod's
claim name, holding what the ResourceSlice publishes. The 1.35 kubelet knows nothing of the
feature: the mount is an ordinary CDI mount there, so the same assertions hold."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness import DRIVER, GPU_CLASS, NodeDirs
from tests.realk8s.agent import allocate
from tests.realk8s.cluster import RealCluster
from tests.realk8s.conftest import StartAgent, StartKubelet
from tests.realk8s.test_kubelet_dra import agent_and_kubelet, get_pod, inject

# Versioned: device metadata (KEP-5304) is new in 1.37: the 1.35 kubelet knows nothing of it.
pytestmark = pytest.mark.versioned

ANNOTATION = "resource.kubernetes.io/pod-claim-name"


def template_pod_and_claim(cluster: RealCluster, node: str, name: str
                           ) -> tuple[dict[str, Any], dict[str, Any]]:
    pod = cluster.create({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeName": node, "containers": [
            {"name": "c", "image": "busybox", "resources": {"claims": [{"name": "gpus"}]}}],
            "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "gpu-template"}]},
    })
    claim = cluster.create({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {
            "name": f"{name}-gpus-x7k2p", "namespace": "default",
            "annotations": {ANNOTATION: "gpus"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": name,
                                 "uid": pod["metadata"]["uid"], "controller": True,
                                 "blockOwnerDeletion": True}],
        },
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": GPU_CLASS}}]}},
    })
    status_path = f"/api/v1/namespaces/default/pods/{name}/status"
    current = cluster.get(status_path)
    assert current is not None
    current.setdefault("status", {})["resourceClaimStatuses"] = [
        {"name": "gpus", "resourceClaimName": claim["metadata"]["name"]}]
    cluster.admin.request("PUT", status_path, body=current).raise_for_status()
    return pod, claim


def test_template_claim_container_gets_its_metadata_file(
    cluster: RealCluster, node: str, dirs: NodeDirs, start_agent: StartAgent,
    start_kubelet: StartKubelet, cdi_check_bin: Path,
) -> None:
    _, kubelet = agent_and_kubelet(cluster, node, start_agent, start_kubelet)
    pod, claim = template_pod_and_claim(cluster, node, f"meta-{node}")
    claim = allocate(cluster, claim, node, pod=pod)
    pod = get_pod(cluster, pod)
    (result,) = claim["status"]["allocation"]["devices"]["results"]

    kubelet.active([pod])
    assert kubelet.prepare(pod) == ""
    ids = kubelet.resources(pod, "c")
    (mount,) = inject(cdi_check_bin, dirs, ids)["mounts"]
    assert mount["destination"] == ("/var/run/kubernetes.io/dra-device-attributes/"
                                    f"resourceclaimtemplates/gpus/gpu/{DRIVER}-metadata.json")
    assert mount["options"] == ["ro", "bind"]
    source = Path(mount["source"])
    assert source == (dirs.plugin / "dra-device-metadata" /
                      f"default_{claim['metadata']['name']}" / "gpu" / "metadata.json")

    doc = json.loads(dirs.seen(source).read_text())
    assert doc["apiVersion"] == "metadata.resource.k8s.io/v1beta1"
    assert doc["metadata"] == {"name": claim["metadata"]["name"], "namespace": "default",
                               "uid": claim["metadata"]["uid"], "generation": 1}
    assert doc["podClaimName"] == "gpus"
    (request,) = doc["requests"]
    (device,) = request["devices"]
    assert (request["name"], device["pool"], device["name"]) == (
        result["request"], result["pool"], result["device"])
    published = {d["name"]: d for s in cluster.slices(node, "v1") for d in s["spec"]["devices"]}
    assert device["attributes"] == published[result["device"]]["attributes"]

    assert kubelet.unprepare(pod) == ""
    assert not dirs.seen(source).exists()
    assert dirs.records() == {}
