"""The pod scenarios of tests/realk8s/test_kubelet_dra.py, with the stand-in's PodClaims in the
real kubelet's place: it drives a real ``dra-agent run --simulate dgx-h100`` against the fake
API server, and each test asserts what its realk8s twin asserts (the kubelet's refusals are
read from tests/fakes/kubelet/scenarios.py, which both describe).

One agent, API server and stand-in serve the whole module; each test deletes its claims and
leaves the node as it found it (nothing prepared), so the next one starts clean.
"""

from __future__ import annotations

import json
import re
import subprocess
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness import (
    DRIVER,
    GPU_CLASS,
    NIC_CLASS,
    NODE,
    PCIE_ROOT,
    AgentProcess,
    Cluster,
    NodeDirs,
    assert_nothing_left,
    assert_prepared,
    expected_cdi_id,
    reap,
    temporary_node_dirs,
    wait_registered,
)
from tests.fakes.apiserver import FakeAPIServer
from tests.fakes.kubelet import ClaimRef, KubeletStandIn, PodClaims, PodError
from tests.fakes.kubelet.scenarios import CDI_REPEATS_AFTER_RESTART, refused

_CALLS = re.compile(r'^dra_agent_requests_total\{([^}]*)\} ([0-9.e+]+)$', re.M)


@dataclass
class Node:
    """What every test here shares, and the claims the current test made."""

    dirs: NodeDirs
    cluster: Cluster
    agent: AgentProcess
    kubelet: KubeletStandIn
    made: list[dict[str, Any]] = field(default_factory=list)

    @property
    def server(self) -> FakeAPIServer:
        return self.cluster.server

    def get_claim(self, namespace: str, name: str) -> Mapping[str, Any]:
        """The kubelet's GET of a claim (what PodClaims calls before anything else)."""
        found = self.server.get_object("resourceclaims", name, namespace)
        if found is None:
            raise LookupError(f'resourceclaims.resource.k8s.io "{name}" not found')
        return found

    def pod_claims(self) -> PodClaims:
        """A kubelet's DRA manager with an empty claim cache (a fresh kubelet)."""
        return PodClaims(self.kubelet, self.get_claim)

    def claim(self, name: str, spec: Mapping[str, Any], namespace: str = "default",
              **meta: Any) -> dict[str, Any]:
        made = self.server.put_object({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace, **meta}, "spec": dict(spec)})
        self.made.append(made)
        return made

    def calls(self) -> int:
        """NodePrepareResources and NodeUnprepareResources calls the agent received."""
        status, text = self.agent.url("/metrics")
        assert status == 200, text
        return int(sum(float(v) for labels, v in _CALLS.findall(text) if 'method="Node' in labels))


@pytest.fixture(scope="module")
def node() -> Iterator[Node]:
    with temporary_node_dirs("p") as dirs, FakeAPIServer() as server:
        cluster = Cluster(server, dirs.root)
        agent = AgentProcess(dirs, cluster.kubeconfig)
        try:
            with KubeletStandIn(dirs.registry, api_client=server.api_client(), node_name=NODE,
                                retry_initial=0.05) as kubelet:
                wait_registered(kubelet)
                agent.wait_http("/readyz")
                cluster.wait_published()
                yield Node(dirs, cluster, agent, kubelet)
        finally:
            reap([agent])


@pytest.fixture
def shared(node: Node) -> Iterator[Node]:
    """The module's node; afterwards whatever a failed test left prepared is unprepared and
    its claims are deleted (they would hold devices the next test needs)."""
    yield node
    for uid, record in node.dirs.records().items():
        node.kubelet.unprepare(DRIVER, [ClaimRef(record["namespace"], record["name"], uid)])
    for made in node.made:
        meta = made["metadata"]
        node.server.delete_object("resourceclaims", meta["name"], meta["namespace"])
    node.made.clear()
    assert node.agent.alive(), node.agent.logs()[-4000:]


def exactly(*requests: tuple[str, str], count: int = 1, admin: bool = False,
            constraints: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": [
        {"name": req, "exactly": {"deviceClassName": cls, "count": count,
                                  **({"adminAccess": True} if admin else {})}}
        for req, cls in requests]}
    if constraints:
        devices["constraints"] = [dict(c) for c in constraints]
    return {"devices": devices}


#: gpu-0's PCIe root on the simulated dgx-h100 (a NIC shares it, nic-0000-18-00-0).
FIRST_GPU_ROOT = "pci0000:15"


def nic_under(root: str) -> dict[str, Any]:
    """A claim spec for one NIC under PCIe root ``root``."""
    expression = f'device.attributes["resource.kubernetes.io"].pcieRoot == "{root}"'
    return {"devices": {"requests": [{"name": "nic", "exactly": {
        "deviceClassName": NIC_CLASS, "selectors": [{"cel": {"expression": expression}}]}}]}}


def pcie_root(node: Node, device: str) -> str | None:
    """The device's resource.kubernetes.io/pcieRoot in the node's published slices."""
    for item in node.cluster.wait_published():
        for published in item["spec"].get("devices") or []:
            if published["name"] == device:
                value = (published.get("attributes") or {}).get(PCIE_ROOT) or {}
                root: str | None = value.get("string")
                return root
    return None


def pod_using(claim: Mapping[str, Any], suffix: str = "pod",
              request: str | None = None) -> dict[str, Any]:
    """A Pod (as the API server would return it) whose container ``c`` uses the claim."""
    meta = claim["metadata"]
    use: dict[str, str] = {"name": "dev", **({"request": request} if request else {})}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{meta['name']}-{suffix}", "namespace": meta["namespace"],
                         "uid": str(uuid.uuid4())},
            "spec": {"nodeName": NODE, "containers": [
                {"name": "c", "image": "busybox", "resources": {"claims": [use]}}],
                "resourceClaims": [{"name": "dev", "resourceClaimName": meta["name"]}]}}


def templated_pod(name: str, template: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "uid": str(uuid.uuid4())},
            "spec": {"nodeName": NODE, "containers": [
                {"name": "c", "image": "busybox", "resources": {"claims": [{"name": "gpus"}]}}],
                "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": template}]}}


def allocate(node: Node, claim: Mapping[str, Any],
             pods: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """The scheduler's part: allocate, then reserve the claim for ``pods`` (none: for a pod
    of its own that is not any of the test's)."""
    allocated = node.cluster.allocate(claim)
    if pods:
        allocated["status"]["reservedFor"] = [
            {"resource": "pods", "name": p["metadata"]["name"], "uid": p["metadata"]["uid"]}
            for p in pods]
        allocated = node.server.put_object(allocated)
    return allocated


def results(claim: Mapping[str, Any]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = claim["status"]["allocation"]["devices"]["results"]
    return found


def inject(cdi_check: Path, dirs: NodeDirs, ids: list[str]) -> dict[str, str]:
    """The env a real CDI consumer injects for ``ids``."""
    out = subprocess.run([str(cdi_check), "inject", str(dirs.cdi), *ids], capture_output=True,
                         text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    env: list[str] = json.loads(out.stdout)["process"]["env"]
    return dict(e.split("=", 1) for e in env)


def prepare_error(pods: PodClaims, pod: Mapping[str, Any]) -> str:
    """What the kubelet says for the pod ('' when prepared)."""
    try:
        pods.prepare(pod)
    except PodError as err:
        return str(err)
    return ""


@pytest.mark.parametrize("requests", [[("gpu", GPU_CLASS)], [("gpu", GPU_CLASS),
                                                              ("nic", NIC_CLASS)]],
                         ids=["gpu", "gpu+nic"])
def test_prepares_restarts_and_unprepares(
    shared: Node, requests: list[tuple[str, str]], cdi_check_bin: Path,
) -> None:
    node = shared
    constraints: list[dict[str, Any]] = []
    if len(requests) > 1:
        # GPU+NIC under one PCIe root, as the realk8s twin asks the scheduler's allocator.
        # The NIC beside gpu-0 is held first, so only the constraint keeps the allocator
        # from pairing gpu-0 with a NIC under another root.
        allocate(node, node.claim("holder", nic_under(FIRST_GPU_ROOT)))
        constraints = [{"requests": [r for r, _ in requests], "matchAttribute": PCIE_ROOT}]
    claim = node.claim(f"claim-{len(requests)}", exactly(*requests, constraints=constraints))
    pod = pod_using(claim)
    claim = allocate(node, claim, [pod])
    uid = claim["metadata"]["uid"]
    assert sorted(r["request"] for r in results(claim)) == sorted(r for r, _ in requests)
    roots = {pcie_root(node, r["device"]) for r in results(claim)}
    assert len(roots) == 1 and None not in roots, roots
    pods = node.pod_claims()
    pods.prepare(pod)
    ids = pods.cdi_ids(pod, "c")
    assert sorted(ids) == sorted(expected_cdi_id(uid, r["device"]) for r in results(claim))
    assert inject(cdi_check_bin, node.dirs, ids)["DRA_AGENT_CLAIM_UID"] == uid
    assert_prepared(node.dirs, claim)
    spec = node.dirs.spec_path(uid).read_bytes()

    # A kubelet restart: a new manager sends prepare again and gets the same answer.
    calls = node.calls()
    restarted = node.pod_claims()
    restarted.prepare(pod)
    assert node.calls() == calls + 1
    again = restarted.cdi_ids(pod, "c")
    assert sorted(set(again)) == sorted(ids)
    assert len(again) == CDI_REPEATS_AFTER_RESTART["stand-in"] * len(ids)
    assert node.dirs.spec_path(uid).read_bytes() == spec
    assert_prepared(node.dirs, claim)

    restarted.unprepare(pod)
    assert_nothing_left(node.dirs)


def test_refuses_a_pod_the_claim_is_not_reserved_for(shared: Node) -> None:
    node = shared
    claim = node.claim("other", exactly(("gpu", GPU_CLASS)))
    pod = pod_using(claim)
    allocate(node, claim)  # reserved for some other pod
    calls = node.calls()
    error = prepare_error(node.pod_claims(), pod)
    assert refused("not reserved for the pod", error), error
    assert node.calls() == calls  # refused by the kubelet, before any plugin call
    assert node.dirs.cdi_files() == []


def test_a_claim_shared_by_three_pods(shared: Node) -> None:
    node = shared
    claim = node.claim("shared", exactly(("gpu", GPU_CLASS)))
    users = [pod_using(claim, suffix=f"pod{i}") for i in range(3)]
    claim = allocate(node, claim, users)
    pods = node.pod_claims()
    calls = node.calls()
    answers = []
    for pod in users:
        pods.prepare(pod)
        answers.append(pods.cdi_ids(pod, "c"))
    assert answers[0] and answers == [answers[0]] * 3
    assert node.calls() == calls + 1  # prepared once
    assert len(node.dirs.records()) == 1
    for i, pod in enumerate(users):
        pods.unprepare(pod)
        if i < 2:  # still in use by the pods left: the spec and the record stay
            assert len(node.dirs.cdi_files()) == 1 and len(node.dirs.records()) == 1
    assert node.calls() == calls + 2  # one unprepare, with the last pod
    assert_nothing_left(node.dirs)


def test_admin_access_to_a_device_another_pod_holds(shared: Node) -> None:
    node = shared
    ns = "admin"
    node.server.put_object({"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": ns, "labels": {"resource.kubernetes.io/admin-access": "true"}}})
    holder: dict[str, dict[str, Any]] = {}  # device -> the pod whose claim holds it
    for i in range(8):  # every GPU held by an ordinary claim first
        claim = node.claim(f"user{i}", exactly(("gpu", GPU_CLASS)))
        pod = pod_using(claim)
        (held,) = results(allocate(node, claim, [pod]))
        holder[held["device"]] = pod
    admin = node.claim("monitor", exactly(("gpu", GPU_CLASS), admin=True), namespace=ns)
    admin_pod = pod_using(admin)
    (result,) = results(allocate(node, admin, [admin_pod]))
    assert result.get("adminAccess") is True
    user = holder[result["device"]]

    pods = node.pod_claims()
    pods.prepare(user)
    pods.prepare(admin_pod)
    records = node.dirs.records()
    assert len(records) == 2
    assert [d["device"] for r in records.values() for d in r["devices"]] == [result["device"]] * 2
    pods.unprepare(admin_pod)
    pods.unprepare(user)
    assert node.dirs.cdi_files() == []


def test_first_available_subrequest_reaches_the_container(shared: Node) -> None:
    node = shared
    claim = node.claim("either", {"devices": {"requests": [{"name": "gpu", "firstAvailable": [
        {"name": "two", "deviceClassName": GPU_CLASS, "count": 2},
        {"name": "one", "deviceClassName": GPU_CLASS}]}]}})
    pod = pod_using(claim, request="gpu")
    claim = allocate(node, claim, [pod])
    assert {r["request"] for r in results(claim)} == {"gpu/two"} and len(results(claim)) == 2
    pods = node.pod_claims()
    pods.prepare(pod)
    uid = claim["metadata"]["uid"]
    assert sorted(pods.cdi_ids(pod, "c")) == sorted(
        expected_cdi_id(uid, r["device"]) for r in results(claim))
    pods.unprepare(pod)
    assert_nothing_left(node.dirs)


def test_a_claim_from_a_template(shared: Node, cdi_check_bin: Path) -> None:
    node = shared
    template_spec = exactly(("gpu", GPU_CLASS), count=2)
    pod = templated_pod("trainer", "two-gpus")
    pods = node.pod_claims()
    calls = node.calls()
    error = prepare_error(pods, pod)
    assert refused("template claim not made yet", error), error

    def from_template(for_pod: dict[str, Any], owner: Mapping[str, Any]) -> dict[str, Any]:
        """The resourceclaim controller's part: the claim, owned by ``owner``, named in the
        pod's status."""
        claim = node.claim("", template_spec, generateName=f"{for_pod['metadata']['name']}-gpus-",
                           annotations={"resource.kubernetes.io/pod-claim-name": "gpus"},
                           ownerReferences=[{"apiVersion": "v1", "kind": "Pod",
                                             "name": owner["metadata"]["name"],
                                             "uid": owner["metadata"]["uid"],
                                             "controller": True}])
        for_pod["status"] = {"resourceClaimStatuses": [
            {"name": "gpus", "resourceClaimName": claim["metadata"]["name"]}]}
        return claim

    claim = allocate(node, from_template(pod, pod), [pod])
    uid, name = claim["metadata"]["uid"], claim["metadata"]["name"]
    assert len(results(claim)) == 2
    pods.prepare(pod)
    ids = pods.cdi_ids(pod, "c")
    assert sorted(ids) == sorted(expected_cdi_id(uid, r["device"]) for r in results(claim))
    assert inject(cdi_check_bin, node.dirs, ids)["DRA_AGENT_CLAIM_UID"] == uid
    (record,) = node.dirs.records().values()
    assert (record["namespace"], record["name"]) == ("default", name)

    # A claim that another pod controls, named in this pod's status: refused by the kubelet.
    thief = templated_pod("thief", "two-gpus")
    allocate(node, from_template(thief, pod), [thief])
    before = node.calls()
    error = prepare_error(pods, thief)
    assert refused("template claim of another pod", error), error
    assert node.calls() == before == calls + 1

    pods.unprepare(pod)
    assert_nothing_left(node.dirs)
