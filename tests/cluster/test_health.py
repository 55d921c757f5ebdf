"""Device taints on the real node: a simulated Xid makes the agent taint the GPU in its slice,
and the real device-taint eviction controller (kube-controller-manager) evicts the Pod that
uses it without tolerating a NoExecute taint; an admin's DeviceTaintRule does the same."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cluster.conftest import AGENT_NS, DRIVER, agent_pods, apply_example, install, node_slices
from tests.cluster.node import Node
from tests.cluster.test_pods import allocated, pod_claim
from tests.waiting import wait_for


@pytest.fixture
def noexecute_agent(agent: Node) -> Iterator[Node]:
    install(agent, **{"health.taintEffects": "xid=NoExecute"})
    try:
        yield agent
    finally:
        install(agent)


def taints_of(node: Node, device: str) -> list[dict[str, str]]:
    for s in node_slices(node):
        for d in s["spec"].get("devices", []):
            if d["name"] == device:
                return list(d.get("taints", []))
    raise AssertionError(f"{device} is in no slice")


def evicted(node: Node, ns: str, pod: str) -> bool:
    """Gone, or on its way out with the eviction controller's DisruptionTarget."""
    got = node.pod(ns, pod)
    if got is None:
        return True
    conditions = got.get("status", {}).get("conditions", [])
    return bool(got["metadata"].get("deletionTimestamp")) and any(
        c["type"] == "DisruptionTarget" for c in conditions)


def test_an_xid_taints_the_gpu_and_the_pod_is_evicted(noexecute_agent: Node, ns: str) -> None:
    node = noexecute_agent
    apply_example(node, ns, "one-gpu.yaml")
    node.wait_running(ns, "one-gpu")
    claim = pod_claim(node, ns, "one-gpu", "gpu")
    (gpu,) = allocated(claim)
    pod = agent_pods(node)[0]["metadata"]["name"]
    node.kubectl("-n", AGENT_NS, "exec", pod, "-c", "agent", "--",
                 "dra-agent", "simulate", "fault", gpu, "--xid", "79")
    taints = wait_for(lambda: taints_of(node, gpu), timeout=60, interval=0.5,
                      what=f"a taint on {gpu}")
    assert [t["effect"] for t in taints] == ["NoExecute"], taints
    wait_for(lambda: evicted(node, ns, "one-gpu"), timeout=60, interval=0.5,
             what="the Pod evicted by the device-taint eviction controller")


def test_a_device_taint_rule_evicts_the_pod_using_the_device(agent: Node, ns: str) -> None:
    apply_example(agent, ns, "one-gpu.yaml")
    agent.wait_running(ns, "one-gpu")
    (gpu,) = allocated(pod_claim(agent, ns, "one-gpu", "gpu"))
    rule = f"maintenance-{ns}"
    agent.kubectl("apply", "-f", "-", input=f"""
apiVersion: resource.k8s.io/v1
kind: DeviceTaintRule
metadata: {{name: {rule}}}
spec:
  deviceSelector: {{driver: {DRIVER}, pool: {agent.name}, device: {gpu}}}
  taint: {{key: example.com/maintenance, value: planned, effect: NoExecute}}
""")
    try:
        wait_for(lambda: evicted(agent, ns, "one-gpu"), timeout=60, interval=0.5,
                 what="the Pod evicted for the DeviceTaintRule")
    finally:
        agent.kubectl("delete", "devicetaintrule", rule, "--ignore-not-found")
