"""The kubelet's own DRA manager (bin/<minor>/kubelet-dra) drives the agent, and the
scheduler's own allocator places the claims: prepare, the container's CDI IDs, a kubelet
restart, unprepare."""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness import DRIVER, GPU_CLASS, NIC_CLASS, PCIE_ROOT, AgentProcess, NodeDirs
from tests.fakes.kubelet.scenarios import CDI_REPEATS_AFTER_RESTART, refused
from tests.realk8s.agent import allocate, make_claim, revisions, wait_settled
from tests.realk8s.cluster import RealCluster
from tests.realk8s.conftest import StartAgent, StartKubelet
from tests.realk8s.kubelet import KubeletDRA
from tests.realk8s.test_node_identity import pod_using
from tests.waiting import wait_for


def get_pod(cluster: RealCluster, pod: dict[str, Any]) -> dict[str, Any]:
    meta = pod["metadata"]
    current = cluster.get(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}")
    assert current is not None
    return current


def inject(cdi_check: Path, dirs: NodeDirs, ids: list[str]) -> dict[str, Any]:
    out = subprocess.run([str(cdi_check), "inject", str(dirs.cdi), *ids], capture_output=True,
                         text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    doc: dict[str, Any] = json.loads(out.stdout)
    return doc


#: gpu-0's PCIe root on the simulated dgx-h100 (a NIC shares it, nic-0000-18-00-0).
FIRST_GPU_ROOT = "pci0000:15"


def nic_under(cluster: RealCluster, name: str, root: str) -> dict[str, Any]:
    """A claim for one NIC under PCIe root ``root``."""
    expression = f'device.attributes["resource.kubernetes.io"].pcieRoot == "{root}"'
    return cluster.create({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "nic", "exactly": {
            "deviceClassName": NIC_CLASS, "selectors": [{"cel": {"expression": expression}}]}}]}}})


def pcie_root(cluster: RealCluster, node: str, device: str) -> str | None:
    """The device's resource.kubernetes.io/pcieRoot in the node's published slices."""
    for item in cluster.slices(node):
        for published in item["spec"].get("devices") or []:
            if published["name"] == device:
                value = (published.get("attributes") or {}).get(PCIE_ROOT) or {}
                root: str | None = value.get("string")
                return root
    return None


def agent_and_kubelet(cluster: RealCluster, node: str, start_agent: StartAgent,
                      start_kubelet: StartKubelet, agent_kubeconfig: Path | None = None,
                      ) -> tuple[AgentProcess, KubeletDRA]:
    """The agent (node credentials unless told otherwise) and the kubelet's DRA code on
    ``node``, registered, with the slices the kubelet wipes at its start published again."""
    node_kubeconfig = cluster.node_kubeconfig(node)
    agent = start_agent(agent_kubeconfig or node_kubeconfig, node)
    before = wait_settled(cluster, node, agent)
    kubelet = start_kubelet(node_kubeconfig, node)
    wait_for(lambda: kubelet.registered(DRIVER)[DRIVER], timeout=20,
             what="the kubelet's plugin manager registers the agent")
    # The kubelet's own start wipes the node's slices (one DeleteCollection); the agent
    # publishes them again.
    wait_for(lambda: set(revisions(cluster, node)).isdisjoint(before) and
             revisions(cluster, node), timeout=20, what="slices wiped by the kubelet, restored")
    wait_settled(cluster, node, agent)
    return agent, kubelet


@pytest.mark.versioned  # the 1.35 kubelet lists each CDI ID twice after its restart
@pytest.mark.parametrize("identity", ["node", "daemonset"])
def test_kubelet_prepares_restarts_and_unprepares(
    cluster: RealCluster, node: str, identity: str, dirs: NodeDirs, start_agent: StartAgent,
    start_kubelet: StartKubelet, cdi_check_bin: Path, minor: str,
) -> None:
    node_kubeconfig = cluster.node_kubeconfig(node)
    _, kubelet = agent_and_kubelet(cluster, node, start_agent, start_kubelet,
                                None if identity == "node" else cluster.agent_kubeconfig(node))

    # The pair under one PCIe root: the scheduler's allocator holds it to the constraint.
    # The NIC beside gpu-0 is held first, so only the constraint keeps the allocator from
    # pairing gpu-0 with a NIC under another root.
    allocate(cluster, nic_under(cluster, f"holder-{identity}-{node}", FIRST_GPU_ROOT), node)
    claim = make_claim(cluster, f"pair-{identity}-{node}", [("gpu", GPU_CLASS),
                                                             ("nic", NIC_CLASS)],
                       constraints=[{"requests": ["gpu", "nic"], "matchAttribute": PCIE_ROOT}])
    pod = pod_using(cluster, node, claim)
    claim = allocate(cluster, claim, node, pod=pod)
    pod = get_pod(cluster, pod)
    uid = claim["metadata"]["uid"]
    allocated = claim["status"]["allocation"]["devices"]["results"]
    assert sorted(r["request"] for r in allocated) == ["gpu", "nic"]
    roots = {pcie_root(cluster, node, r["device"]) for r in allocated}
    assert len(roots) == 1 and None not in roots, roots

    kubelet.active([pod])
    assert kubelet.prepare(pod) == ""
    ids = kubelet.resources(pod, "c")
    assert sorted(ids) == sorted(f"k8s.{DRIVER}/claim={uid}-{r['device']}" for r in allocated)
    env = dict(e.split("=", 1) for e in inject(cdi_check_bin, dirs, ids)["process"]["env"])
    assert env["DRA_AGENT_CLAIM_UID"] == uid

    # A kubelet restart: its checkpoint says prepared, it asks again, the answer is the same.
    kubelet.stop()
    kubelet = start_kubelet(node_kubeconfig, node)
    wait_for(lambda: kubelet.registered(DRIVER)[DRIVER], timeout=20, what="re-registration")
    kubelet.active([pod])
    assert kubelet.prepare(pod) == ""
    again = kubelet.resources(pod, "c")
    # The agent answers the repeat identically; the 1.35 kubelet then lists each CDI ID twice
    # (its claim cache appends the re-sent devices to the ones restored from its checkpoint;
    # runtimes inject a device once), 1.37 once.
    assert sorted(set(again)) == sorted(ids)
    assert len(again) == CDI_REPEATS_AFTER_RESTART[minor] * len(ids), again

    assert kubelet.unprepare(pod) == ""
    assert dirs.cdi_files() == []
    assert dirs.records() == {}


def test_kubelet_refuses_a_pod_the_claim_is_not_reserved_for(
    cluster: RealCluster, node: str, dirs: NodeDirs, start_agent: StartAgent,
    start_kubelet: StartKubelet,
) -> None:
    """The real kubelet checks reservedFor itself, before any plugin call."""
    _, kubelet = agent_and_kubelet(cluster, node, start_agent, start_kubelet)
    claim = make_claim(cluster, f"other-{node}", [("gpu", GPU_CLASS)])
    pod = pod_using(cluster, node, claim)
    allocate(cluster, claim, node)  # reserved for some other pod
    pod = get_pod(cluster, pod)
    kubelet.active([pod])
    error = kubelet.prepare(pod)
    assert refused("not reserved for the pod", error), error
    assert dirs.cdi_files() == []


def test_a_claim_shared_by_three_pods(
    cluster: RealCluster, node: str, dirs: NodeDirs, start_agent: StartAgent,
    start_kubelet: StartKubelet,
) -> None:
    """One claim, three pods: prepared once and answered alike for each; the kubelet itself
    sends no unprepare while another pod still uses the claim."""
    _, kubelet = agent_and_kubelet(cluster, node, start_agent, start_kubelet)
    claim = make_claim(cluster, f"shared-{node}", [("gpu", GPU_CLASS)])
    pods = [pod_using(cluster, node, claim, suffix=f"pod{i}") for i in range(3)]
    claim = allocate(cluster, claim, node, pods=pods)
    pods = [get_pod(cluster, p) for p in pods]
    kubelet.active(pods)
    answers = []
    for pod in pods:
        assert kubelet.prepare(pod) == ""
        answers.append(kubelet.resources(pod, "c"))
    assert answers[0] and answers == [answers[0]] * 3
    assert len(dirs.records()) == 1
    for i, pod in enumerate(pods):
        kubelet.active(pods[i + 1:])
        assert kubelet.unprepare(pod) == ""
        if i < 2:  # still in use by the pods left: the spec and the record stay
            assert len(dirs.cdi_files()) == 1 and len(dirs.records()) == 1
    assert dirs.cdi_files() == [] and dirs.records() == {}


def test_admin_access_to_a_device_another_pod_holds(
    cluster: RealCluster, node: str, dirs: NodeDirs, start_agent: StartAgent,
    start_kubelet: StartKubelet,
) -> None:
    """adminAccess (allowed only in a namespace labelled for it) gets a device an ordinary
    claim already holds; the agent prepares both and marks the admin one in its env."""
    _, kubelet = agent_and_kubelet(cluster, node, start_agent, start_kubelet)
    ns = f"admin-{node}"
    cluster.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": ns, "labels": {"resource.kubernetes.io/admin-access": "true"}}})
    cluster.create({"apiVersion": "v1", "kind": "ServiceAccount",
                    "metadata": {"name": "default", "namespace": ns}})

    # Every GPU held by ordinary claims first.
    holder: dict[str, dict[str, Any]] = {}  # device -> the pod whose claim holds it
    for i in range(8):
        claim = make_claim(cluster, f"user{i}-{node}", [("gpu", GPU_CLASS)])
        pod = pod_using(cluster, node, claim)
        claim = allocate(cluster, claim, node, pod=pod)
        (held,) = claim["status"]["allocation"]["devices"]["results"]
        holder[held["device"]] = get_pod(cluster, pod)
    admin = cluster.create({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": f"monitor-{node}", "namespace": ns},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": GPU_CLASS, "adminAccess": True}}]}}})
    admin_pod = pod_using(cluster, node, admin)
    admin = allocate(cluster, admin, node, pod=admin_pod)
    (result,) = admin["status"]["allocation"]["devices"]["results"]
    assert result.get("adminAccess") is True
    admin_pod = get_pod(cluster, admin_pod)
    user = holder[result["device"]]  # the ordinary pod on the same GPU

    kubelet.active([*holder.values(), admin_pod])
    assert kubelet.prepare(user) == ""
    assert kubelet.prepare(admin_pod) == ""
    records = dirs.records()
    assert len(records) == 2
    assert [d["device"] for r in records.values() for d in r["devices"]] == [result["device"]] * 2
    assert kubelet.unprepare(admin_pod) == "" and kubelet.unprepare(user) == ""
    assert dirs.cdi_files() == []


def test_first_available_subrequest_reaches_the_container(
    cluster: RealCluster, node: str, dirs: NodeDirs, start_agent: StartAgent,
    start_kubelet: StartKubelet,
) -> None:
    """firstAvailable: the allocation names ``gpu/<sub>``; the container asks for request
    ``gpu`` and the kubelet finds its CDI IDs only if the agent answers with the base name."""
    _, kubelet = agent_and_kubelet(cluster, node, start_agent, start_kubelet)
    name = f"either-{node}"
    claim = cluster.create({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "firstAvailable": [
            {"name": "two", "deviceClassName": GPU_CLASS, "count": 2},
            {"name": "one", "deviceClassName": GPU_CLASS}]}]}}})
    pod = cluster.create({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"{name}-pod",
                                                         "namespace": "default"},
        "spec": {"nodeName": node, "containers": [
            {"name": "c", "image": "busybox",
             "resources": {"claims": [{"name": "dev", "request": "gpu"}]}}],
                 "resourceClaims": [{"name": "dev", "resourceClaimName": name}]}})
    claim = allocate(cluster, claim, node, pod=pod)
    results = claim["status"]["allocation"]["devices"]["results"]
    assert {r["request"] for r in results} == {"gpu/two"} and len(results) == 2
    pod = get_pod(cluster, pod)
    kubelet.active([pod])
    assert kubelet.prepare(pod) == ""
    uid = claim["metadata"]["uid"]
    assert sorted(kubelet.resources(pod, "c")) == sorted(
        f"k8s.{DRIVER}/claim={uid}-{r['device']}" for r in results)
    assert kubelet.unprepare(pod) == ""


def test_the_kubelets_30_s_wipe_and_a_quick_restart(
    cluster: RealCluster, node: str, start_agent: StartAgent, start_kubelet: StartKubelet,
) -> None:
    """The kubelet's own timer: an agent back within 30 s costs no slice write at all; one
    gone longer has its slices deleted by the kubelet, and publishes them again on return."""
    first, kubelet = agent_and_kubelet(cluster, node, start_agent, start_kubelet)
    node_kubeconfig = cluster.node_kubeconfig(node)
    settled = revisions(cluster, node)
    assert first.terminate() == 0
    quick = start_agent(node_kubeconfig, node, name="quick")
    quick.wait_http("/readyz", timeout=30)
    wait_for(lambda: kubelet.registered(DRIVER)[DRIVER], timeout=20, what="re-registration")
    time.sleep(35)  # past the kubelet's 30 s: its timer was cancelled by the reconnect
    assert revisions(cluster, node) == settled

    assert quick.terminate() == 0
    wait_for(lambda: not revisions(cluster, node), timeout=60,
             what="the kubelet deleting the slices of a driver gone for 30 s")
    back = start_agent(node_kubeconfig, node, name="back")
    restored = wait_settled(cluster, node, back)
    assert len(restored) == len(settled) and set(restored).isdisjoint(settled)


def claim_from_template(cluster: RealCluster, pod: dict[str, Any], pod_claim: str,
                        template: dict[str, Any], owner: dict[str, Any] | None = None,
                        ) -> dict[str, Any]:
    """What the resourceclaim controller does for a pod's template claim: a claim with the
    generated name ``<pod>-<podClaim>-xxxxx``, the pod-claim-name annotation, the template's
    labels and spec, the pod as its controller (``owner``: another pod, to forge one); then
    the pod's status.resourceClaimStatuses names it (the kubelet reads the name there)."""
    meta, owner_meta = pod["metadata"], (owner or pod)["metadata"]
    inner = template["spec"]
    claim = cluster.create({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {
            "generateName": f"{meta['name']}-{pod_claim}-", "namespace": meta["namespace"],
            "annotations": {**(inner.get("metadata") or {}).get("annotations", {}),
                            "resource.kubernetes.io/pod-claim-name": pod_claim},
            "labels": (inner.get("metadata") or {}).get("labels", {}),
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": owner_meta["name"],
                                 "uid": owner_meta["uid"], "controller": True}]},
        "spec": inner["spec"]})
    status = cluster.admin.request(
        "PATCH", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status",
        body={"status": {"resourceClaimStatuses": [
            {"name": pod_claim, "resourceClaimName": claim["metadata"]["name"]}]}},
        content_type="application/merge-patch+json")
    status.raise_for_status()
    return claim


def test_a_claim_from_a_template(
    cluster: RealCluster, node: str, dirs: NodeDirs, start_agent: StartAgent,
    start_kubelet: StartKubelet, cdi_check_bin: Path,
) -> None:
    """A pod's claim made from a ResourceClaimTemplate: the kubelet finds its generated name
    in the pod's status, insists that the pod owns it, and prepares it like any other."""
    _, kubelet = agent_and_kubelet(cluster, node, start_agent, start_kubelet)
    template = cluster.create({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": f"two-gpus-{node}", "namespace": "default"},
        "spec": {"metadata": {"labels": {"app": "trainer"}}, "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": GPU_CLASS, "count": 2}}]}}}})

    def templated_pod(name: str) -> dict[str, Any]:
        return cluster.create({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": node, "containers": [
                {"name": "c", "image": "busybox", "resources": {"claims": [{"name": "gpus"}]}}],
                "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName":
                                    template["metadata"]["name"]}]}})

    pod = templated_pod(f"trainer-{node}")
    kubelet.active([pod])
    # Before the controller has made the claim: the kubelet itself refuses, no plugin call.
    error = kubelet.prepare(pod)
    assert refused("template claim not made yet", error), error

    claim = claim_from_template(cluster, pod, "gpus", template)
    name = claim["metadata"]["name"]
    base = f"trainer-{node}-gpus-"
    assert name.startswith(base) and len(name) == len(base) + 5, name
    claim = allocate(cluster, claim, node, pod=pod)
    pod = get_pod(cluster, pod)
    uid = claim["metadata"]["uid"]
    results = claim["status"]["allocation"]["devices"]["results"]
    assert len(results) == 2
    kubelet.active([pod])
    assert kubelet.prepare(pod) == ""
    ids = kubelet.resources(pod, "c")
    assert sorted(ids) == sorted(f"k8s.{DRIVER}/claim={uid}-{r['device']}" for r in results)
    env = dict(e.split("=", 1) for e in inject(cdi_check_bin, dirs, ids)["process"]["env"])
    assert env["DRA_AGENT_CLAIM_UID"] == uid
    (record,) = dirs.records().values()
    assert (record["namespace"], record["name"]) == ("default", name)

    # A claim that another pod controls, named in this pod's status: refused by the kubelet.
    thief = templated_pod(f"thief-{node}")
    forged = claim_from_template(cluster, thief, "gpus", template, owner=pod)
    allocate(cluster, forged, node, pod=thief)
    thief = get_pod(cluster, thief)
    kubelet.active([pod, thief])
    error = kubelet.prepare(thief)
    assert refused("template claim of another pod", error), error

    kubelet.active([pod])
    assert kubelet.unprepare(pod) == ""
    assert dirs.cdi_files() == [] and dirs.records() == {}


_REQUESTS = re.compile(r'^dra_agent_requests_total\{([^}]*)\} ([0-9.e+]+)$', re.M)


def calls_served(agent: AgentProcess) -> int:
    """NodePrepareResources and NodeUnprepareResources calls the agent answered without error."""
    status, text = agent.url("/metrics")
    assert status == 200, text
    return int(sum(float(value) for labels, value in _REQUESTS.findall(text)
                   if 'method="Node' in labels and 'result="ok"' in labels))


def test_a_rolling_update_moves_the_kubelet_to_the_new_instance(
    cluster: RealCluster, node: str, dirs: NodeDirs, start_agent: StartAgent,
    start_kubelet: StartKubelet,
) -> None:
    """The DaemonSet's surge: a second instance (--rolling-update, its own pod UID) starts
    beside the first; the kubelet, preparing and unpreparing all along, turns to the newer
    one, the old one stops, and not one call fails, nor is a slice rewritten."""
    def instance(name: str) -> StartAgent:
        return lambda kubeconfig, node: start_agent(
            kubeconfig, node, "--rolling-update", "--pod-uid", str(uuid.uuid4()), name=name)

    old, kubelet = agent_and_kubelet(cluster, node, instance("old"), start_kubelet)
    settled = revisions(cluster, node)
    claim = make_claim(cluster, f"rolling-{node}", [("gpu", GPU_CLASS), ("nic", NIC_CLASS)])
    pod = pod_using(cluster, node, claim)
    allocate(cluster, claim, node, pod=pod)
    pod = get_pod(cluster, pod)
    kubelet.active([pod])

    failures: list[str] = []
    stop = threading.Event()

    def churn() -> None:  # the kubelet's calls, one pair after another, through the switch
        while not stop.is_set():
            failures.extend(e for e in (kubelet.prepare(pod), kubelet.unprepare(pod)) if e)

    thread = threading.Thread(target=churn, daemon=True)
    thread.start()
    try:
        wait_for(lambda: calls_served(old) >= 4, timeout=20, what="calls to the old instance")
        new = instance("new")(cluster.node_kubeconfig(node), node)
        new.wait_http("/readyz")
        wait_for(lambda: calls_served(new) >= 4, timeout=30,
                 what="the kubelet calling the new instance")
        # The kubelet holds both instances, each at its own socket in the driver's dir, the
        # new one registered last (the one it calls).
        both = [p for p in kubelet.plugins() if p["driver"] == DRIVER]
        assert len(both) == 2 and both[0]["endpoint"] != both[1]["endpoint"], both
        assert all(Path(p["endpoint"]).parent == dirs.plugin and p["connected"] and
                   p["service"] == "v1.DRAPlugin" for p in both), both
        # From now on the kubelet calls only the newest instance.
        by_old, by_new = calls_served(old), calls_served(new)
        wait_for(lambda: calls_served(new) >= by_new + 4, timeout=20, what="more calls")
        assert calls_served(old) == by_old
        assert old.terminate() == 0
        wait_for(lambda: [p["endpoint"] for p in kubelet.plugins()
                          if p["driver"] == DRIVER] == [both[1]["endpoint"]], timeout=20,
                 what="the kubelet dropping the old instance, keeping the new one")
        by_new = calls_served(new)
        wait_for(lambda: calls_served(new) >= by_new + 4, timeout=20,
                 what="calls after the old instance stopped")
    finally:
        stop.set()
        thread.join(60)
    assert failures == [], failures[:3]
    assert kubelet.registered(DRIVER)[DRIVER]
    registry = sorted(os.listdir(dirs.registry))
    assert len(registry) == 1 and registry[0].startswith(f"{DRIVER}-"), registry  # new's only
    assert dirs.cdi_files() == [] and dirs.records() == {}
    assert revisions(cluster, node) == settled
    assert new.terminate() == 0
