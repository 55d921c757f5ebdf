"""Device health through the real kubelet: an Xid on the agent's simulated GPU reaches the
kubelet's DRA manager over the health stream, and what the kubelet would write into the
container's status.allocatedResourcesStatus turns Unhealthy, then Healthy again.

The agent runs in this process (its simulated NVML takes the injected Xid); the kubelet's
own DRA code (bin/<minor>/kubelet-dra) has the ResourceHealthStatus gate on (1.37's default;
1.35 needs it set).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from agent.common.config import Config
from agent.daemon import Daemon, RunOptions
from agent.health import HEALTH_SERVICES, HealthOptions
from discovery.simulate import FakeNvml
from tests.e2e.harness import DRIVER, GPU_CLASS, NodeDirs, expected_cdi_id
from tests.realk8s.agent import allocate, make_claim, revisions, wait_settled
from tests.realk8s.cluster import RealCluster
from tests.realk8s.conftest import StartKubelet
from tests.realk8s.test_kubelet_dra import claim_from_template, get_pod
from tests.realk8s.test_node_identity import pod_using
from tests.waiting import wait_for

# Versioned: the health service each kubelet picks (v1 on 1.37, v1alpha1 on 1.35) and its gates.
pytestmark = pytest.mark.versioned


class InProcessAgent:
    """The agent as a Daemon in this process: ready once its plugin serves and its slices
    are in sync (what /readyz says of an agent process)."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon

    def wait_http(self, path: str = "/readyz", timeout: float = 20.0) -> str:
        wait_for(lambda: self.daemon.healthy() and self.daemon.controller.synced(0),
                 timeout=timeout, what="the in-process agent ready")
        return "ok"

    def logs(self) -> str:
        return "(the in-process agent logs to pytest's captured log)"


@pytest.fixture
def daemon(cluster: RealCluster, node: str, dirs: NodeDirs) -> Iterator[Daemon]:
    cfg = Config(driver_name=DRIVER, node_name=node, kubeconfig=str(cluster.node_kubeconfig(node)),
                 kubelet_dir=dirs.kubelet, cdi_dir=dirs.cdi, simulate="dgx-h100",
                 metrics_address="127.0.0.1:0")
    # Healthy again after 2 s without a fault: long enough to see Unhealthy, short to wait.
    health = HealthOptions(quiet_period_s=2.0, min_publish_interval_s=0.1, gpu_wait_ms=50)
    running = Daemon(cfg, RunOptions(health=health, slow_rescan_s=3600), environ={})
    running.start()
    try:
        yield running
    finally:
        running.shutdown()


def statuses(kubelet_health: dict[str, list[dict[str, Any]]]) -> dict[str, str]:
    """resourceID -> health over the container ``c``'s allocatedResourcesStatus."""
    return {r["resourceID"]: r["health"] for status in kubelet_health.get("c", [])
            for r in status["resources"]}


def test_an_xid_turns_the_pods_device_unhealthy_in_the_kubelet(
    cluster: RealCluster, node: str, dirs: NodeDirs, daemon: Daemon,
    start_kubelet: StartKubelet, minor: str,
) -> None:
    agent = InProcessAgent(daemon)
    before = wait_settled(cluster, node, agent)
    kubelet = start_kubelet(cluster.node_kubeconfig(node), node,
                            feature_gates="" if minor == "1.37" else "ResourceHealthStatus=true")
    wait_for(lambda: kubelet.registered(DRIVER)[DRIVER], timeout=20, what="registration")
    wait_for(lambda: set(revisions(cluster, node)).isdisjoint(before) and
             revisions(cluster, node), timeout=20, what="slices wiped by the kubelet, restored")
    wait_settled(cluster, node, agent)

    # A pod with a claim from a template (status.resourceClaimStatuses names it) and one with
    # a claim named in its spec, one GPU each.
    template = cluster.create({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": f"gpu-{node}", "namespace": "default"},
        "spec": {"spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": GPU_CLASS}}]}}}})
    pod = cluster.create({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"sick-{node}",
                                                         "namespace": "default"},
        "spec": {"nodeName": node, "containers": [
            {"name": "c", "image": "busybox", "resources": {"claims": [{"name": "gpus"}]}}],
            "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName":
                                template["metadata"]["name"]}]}})
    claim = allocate(cluster, claim_from_template(cluster, pod, "gpus", template), node, pod=pod)
    pod = get_pod(cluster, pod)
    named = make_claim(cluster, f"named-{node}", [("gpu", GPU_CLASS)])
    other = pod_using(cluster, node, named)
    named = allocate(cluster, named, node, pod=other)
    other = get_pod(cluster, other)
    kubelet.active([pod, other])
    assert kubelet.prepare(pod) == "" and kubelet.prepare(other) == ""

    (result,) = claim["status"]["allocation"]["devices"]["results"]
    device = result["device"]
    resource = expected_cdi_id(claim["metadata"]["uid"], device)
    # The stream's first report (every device healthy) reaches the kubelet.
    wait_for(lambda: statuses(kubelet.health(pod)[0]) == {resource: "Healthy"}, timeout=20,
             what="the kubelet knowing the device healthy")
    # Both versions are advertised: 1.37 picks v1 (pickHealthService), 1.35 knows only v1alpha1.
    chosen = "v1.DRAResourceHealth" if minor == "1.37" else "v1alpha1.DRAResourceHealth"
    servicer = daemon.plugin.health_servicer
    assert daemon.plugin.registration.versions[-2:] == HEALTH_SERVICES
    assert servicer.streams_by_service() == {s: int(s == chosen) for s in HEALTH_SERVICES}
    (named_result,) = named["status"]["allocation"]["devices"]["results"]
    named_resource = expected_cdi_id(named["metadata"]["uid"], named_result["device"])
    # 1.35's kubelet looks a container's claims up in status.resourceClaimStatuses only, which
    # holds template claims alone: a claim named in the spec never gets a health status there.
    assert statuses(kubelet.health(other)[0]) == (
        {named_resource: "Healthy"} if minor == "1.37" else {})
    kubelet.health(pod)  # forget the notifications so far

    nvml = daemon.sources.gpu if daemon.sources is not None else None
    assert isinstance(nvml, FakeNvml)
    uuid = daemon.inventory.by_name()[device].host.uuid
    assert uuid
    nvml.inject_xid(uuid, 79)  # fallen off the bus: a fault of the GPU, not of the job
    notified: list[str] = []

    def unhealthy() -> bool:
        health, uids = kubelet.health(pod)
        notified.extend(uids)
        return statuses(health) == {resource: "Unhealthy"}

    wait_for(unhealthy, timeout=20, what="the kubelet seeing the device unhealthy")
    # The manager asked for the pod's status to be synced again (and only for this pod).
    assert pod["metadata"]["uid"] in notified and other["metadata"]["uid"] not in notified
    if minor == "1.37":  # ResourceHealthStatusMessage: the agent's reason reaches the pod
        (status,) = kubelet.health(pod)[0]["c"]
        (health,) = status["resources"]
        assert "79" in health.get("message", ""), health
        assert statuses(kubelet.health(other)[0]) == {named_resource: "Healthy"}
    wait_for(lambda: statuses(kubelet.health(pod)[0]) == {resource: "Healthy"}, timeout=20,
             what="the device healthy again after the quiet period")

    kubelet.active([])
    assert kubelet.unprepare(pod) == "" and kubelet.unprepare(other) == ""
    assert dirs.cdi_files() == [] and dirs.records() == {}
