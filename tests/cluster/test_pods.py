"""Real Pods with claims on the whole node: created from examples/ by kubectl, claims made by the
real controller-manager, allocated by the real kube-scheduler, prepared through the real
kubelet by the agent running as the chart's DaemonSet Pod, started by containerd applying the
agent's CDI edits. What the container sees is read with kubectl logs and exec."""

from __future__ import annotations

import json
import re
from typing import Any

from tests.cluster.conftest import AGENT_NS, DRIVER, agent_pods, apply_example
from tests.cluster.node import Node
from tests.waiting import wait_for


def claims_on_node(node: Node) -> list[dict[str, Any]]:
    """The agent's checkpoint as its operator sees it: `dra-agent claims` in the agent's Pod."""
    pod = agent_pods(node)[0]["metadata"]["name"]
    out = node.kubectl("-n", AGENT_NS, "exec", pod, "-c", "agent", "--",
                       "dra-agent", "claims", "-o", "json")
    records: list[dict[str, Any]] = json.loads(out)
    return records


def pod_claim(node: Node, ns: str, pod: str, entry: str) -> dict[str, Any]:
    """The ResourceClaim the Pod's ``entry`` resolved to (status.resourceClaimStatuses)."""
    status = node.pod(ns, pod)["status"]
    names = {s["name"]: s.get("resourceClaimName") for s in status.get("resourceClaimStatuses", [])}
    claim: dict[str, Any] = node.get("-n", ns, "resourceclaim", names[entry])
    return claim


def env_of(log: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in log.splitlines()
                if re.match(r"^[A-Z_][A-Z0-9_]*=", line))


def device_names(env: dict[str, str]) -> set[str]:
    """The devices the agent's env names (DRA_AGENT_DEVICE_<ID>_NAME; not a NIC's _IF_NAME)."""
    return {v for k, v in env.items() if k.startswith("DRA_AGENT_DEVICE_")
            and k.endswith("_NAME") and not k.endswith("_IF_NAME")}


def allocated(claim: dict[str, Any]) -> list[str]:
    return [r["device"] for r in claim["status"]["allocation"]["devices"]["results"]]


def test_one_gpu_from_a_template_runs_with_its_device(agent: Node, ns: str) -> None:
    apply_example(agent, ns, "one-gpu.yaml")
    pod = agent.wait_running(ns, "one-gpu")
    log = agent.wait_logged(ns, "one-gpu", "ready")

    # The controller-manager made the claim from the template, owned by the Pod; the
    # scheduler allocated one of our GPUs on this node and reserved it for the Pod.
    claim = pod_claim(agent, ns, "one-gpu", "gpu")
    owner = claim["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"]) == ("Pod", "one-gpu")
    assert owner["uid"] == pod["metadata"]["uid"]
    assert claim["metadata"]["annotations"]["resource.kubernetes.io/pod-claim-name"] == "gpu"
    results = claim["status"]["allocation"]["devices"]["results"]
    assert [(r["driver"], r["pool"]) for r in results] == [(DRIVER, agent.name)]
    assert [r["uid"] for r in claim["status"]["reservedFor"]] == [pod["metadata"]["uid"]]
    assert pod["spec"]["nodeName"] == agent.name
    gpu = results[0]["device"]

    # Inside the container: the device node runc made from the CDI spec, the agent's env,
    # the KEP-5304 metadata file naming the same device.
    minor = int(gpu.removeprefix("gpu-"))
    assert re.search(rf"^c\S+\s.*\s1,\s+3\s.*/dev/nvidia{minor}$", log, re.M), log
    env = env_of(log)
    assert env["DRA_AGENT_CLAIM_UID"] == claim["metadata"]["uid"]
    assert env["DRA_AGENT_CLAIM"] == f"{ns}/{claim['metadata']['name']}"
    assert env[f"DRA_AGENT_DEVICE_GPU_{minor}_NAME"] == gpu
    meta = json.loads(log[log.index("{"):log.rindex("}") + 1])
    assert meta["metadata"]["uid"] == claim["metadata"]["uid"]
    assert meta["podClaimName"] == "gpu"
    assert [d["name"] for d in meta["requests"][0]["devices"]] == [gpu]
    stat = agent.kubectl("-n", ns, "exec", "one-gpu", "--", "stat", "-c", "%F %t:%T",
                         f"/dev/nvidia{minor}")
    assert stat.strip() == "character special file 1:3"
    # Nothing but the claim's own device: no other GPU's node in the container.
    listing = agent.kubectl("-n", ns, "exec", "one-gpu", "--", "ls", "/dev")
    assert [n for n in listing.split() if re.fullmatch(r"nvidia\d+", n)] == [f"nvidia{minor}"]

    # The agent's records: the claim prepared, its CDI spec on the node where containerd
    # read it.
    record = next(r for r in claims_on_node(agent) if r["uid"] == claim["metadata"]["uid"])
    assert record["state"] == "PrepareCompleted"
    spec = record["specPath"]
    assert agent.exists(spec)

    # Deleting the Pod unprepares the claim (spec and record gone) and the garbage collector
    # deletes the claim the Pod owned.
    agent.kubectl("-n", ns, "delete", "pod", "one-gpu", "--wait=true", timeout=120)
    agent.wait_gone("-n", ns, "resourceclaim", claim["metadata"]["name"])
    wait_for(lambda: not agent.exists(spec), timeout=30, interval=0.25, what="the CDI spec removed")
    assert not [r for r in claims_on_node(agent) if r["uid"] == claim["metadata"]["uid"]]


def test_a_gpu_and_a_nic_on_one_pcie_root(agent: Node, ns: str) -> None:
    apply_example(agent, ns, "gpu-nic-pcieroot.yaml")
    agent.wait_running(ns, "gpu-nic")
    log = agent.wait_logged(ns, "gpu-nic", "ready")
    claim = pod_claim(agent, ns, "gpu-nic", "pair")
    results = claim["status"]["allocation"]["devices"]["results"]
    by_request = {r["request"]: r["device"] for r in results}
    assert set(by_request) == {"gpu", "nic"}
    slices = agent.get("resourceslices")["items"]
    attrs = {d["name"]: d.get("attributes", {}) for s in slices if s["spec"]["driver"] == DRIVER
             for d in s["spec"].get("devices", [])}
    roots = {attrs[by_request[r]]["resource.kubernetes.io/pcieRoot"]["string"] for r in by_request}
    assert len(roots) == 1, roots
    env = env_of(log)
    assert device_names(env) == set(by_request.values())


def test_one_claim_shared_by_two_pods_and_by_the_containers_of_one(agent: Node, ns: str) -> None:
    apply_example(agent, ns, "shared-claim.yaml")
    for pod in ("shared-a", "shared-b"):
        agent.wait_running(ns, pod)
    claim = agent.get("-n", ns, "resourceclaim", "shared-gpu")
    reserved = {r["name"] for r in claim["status"]["reservedFor"]}
    assert reserved == {"shared-a", "shared-b"}
    uid = claim["metadata"]["uid"]
    seen = {}
    for pod, container in (("shared-a", None), ("shared-b", "init"), ("shared-b", "first"),
                           ("shared-b", "second")):
        log = agent.wait_logged(ns, pod, "DRA_AGENT_CLAIM_UID", container=container)
        seen[(pod, container)] = env_of(log)
    assert {e["DRA_AGENT_CLAIM_UID"] for e in seen.values()} == {uid}
    assert [device_names(e) for e in seen.values()] == [set(allocated(claim))] * len(seen)
    # Prepared once on the node, for all of them.
    assert len([r for r in claims_on_node(agent) if r["uid"] == uid]) == 1

    # The claim stays prepared while one Pod still uses it.
    agent.kubectl("-n", ns, "delete", "pod", "shared-a", "--wait=true")
    wait_for(lambda: {r["name"] for r in agent.get("-n", ns, "resourceclaim", "shared-gpu")
                      ["status"].get("reservedFor", [])} == {"shared-b"},
             timeout=30, interval=0.25, what="shared-a's reservation dropped")
    assert [r["state"] for r in claims_on_node(agent) if r["uid"] == uid] == ["PrepareCompleted"]
    agent.kubectl("-n", ns, "delete", "pod", "shared-b", "--wait=true")
    wait_for(lambda: not [r for r in claims_on_node(agent) if r["uid"] == uid], timeout=30,
             interval=0.25, what="the shared claim unprepared after its last Pod")


def test_an_extended_resource_without_any_claim(agent: Node, ns: str) -> None:
    apply_example(agent, ns, "extended-resource.yaml")
    pod = agent.wait_running(ns, "extended-gpu")
    log = agent.wait_logged(ns, "extended-gpu", "ready")
    # The scheduler wrote the claim itself and recorded it in the Pod's status.
    status = pod["status"].get("extendedResourceClaimStatus")
    assert status, pod["status"]
    claim = agent.get("-n", ns, "resourceclaim", status["resourceClaimName"])
    assert claim["metadata"]["ownerReferences"][0]["name"] == "extended-gpu"
    (gpu,) = allocated(claim)
    assert gpu.startswith("gpu-")
    env = env_of(log)
    assert env["DRA_AGENT_CLAIM_UID"] == claim["metadata"]["uid"]
    assert device_names(env) == {gpu}


def test_first_available_with_config_for_the_subrequest_and_the_parent(agent: Node,
                                                                      ns: str) -> None:
    apply_example(agent, ns, "prioritized-list.yaml")
    agent.wait_running(ns, "first-available")
    log = agent.wait_logged(ns, "first-available", "ready")
    claim = pod_claim(agent, ns, "first-available", "gpu")
    results = claim["status"]["allocation"]["devices"]["results"]
    # Sixteen GPUs are more than the node has: the scheduler took the second choice.
    assert [r["request"] for r in results] == ["gpu/one"]
    env = env_of(log)
    assert env["CONFIG_SCOPE"] == "subrequest"
    assert env["CONFIG_PARENT"] == "request"


def test_a_nics_interface_moves_into_the_pod(agent: Node, ns: str) -> None:
    """CDI netDevices through the real runtime: the simulated NIC's interface exists in the
    node's network namespace (a veth made here, where the agent's hostNetwork Pod sees it);
    the claim asks for it to move, renamed net1. containerd 2.4 applies the edit to the OCI
    spec (linux.netDevices) and runc 1.5 moves it (Debian's 1.1.5 ignored the field)."""
    agent.run("ip", "link", "add", "ibp24s0", "type", "veth", "peer", "name", "ibp24s0-peer")
    try:
        apply_example(agent, ns, "nic-netdev.yaml")
        pod = agent.wait_running(ns, "nic-netdev")
        log = agent.wait_logged(ns, "nic-netdev", "ready")
        (status,) = pod["status"]["containerStatuses"]
        cid = status["containerID"].removeprefix("containerd://")
        bundle = (agent.dir / "node" / "ctrd" / "state" / "io.containerd.runtime.v2.task" /
                  "k8s.io" / cid / "config.json")
        oci = json.loads(bundle.read_text())
        assert oci["linux"]["netDevices"] == {"ibp24s0": {"name": "net1"}}, oci["linux"]
        assert re.search(r"^\d+: net1[:@]", log, re.M), log
        node_links = agent.run("ip", "-o", "link", "show").stdout
        assert not re.search(r"^\d+: ibp24s0[:@]", node_links, re.M), node_links
    finally:
        agent.run("ip", "link", "del", "ibp24s0", check=False)
