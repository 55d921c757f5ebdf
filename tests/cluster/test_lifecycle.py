"""The agent's life on a real node: its Pod deleted while workloads run, the kubelet restarted,
a rolling update by helm while a Pod starts, helm uninstall. Workloads must never notice."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from tests.cluster.conftest import (
    AGENT_NS,
    CHART,
    RELEASE,
    agent_pods,
    apply_example,
    chart_values,
    example,
    install,
    node_slices,
    wait_agent_ready,
)
from tests.cluster.node import Node
from tests.waiting import wait_for


def container_id(pod: dict[str, Any]) -> str:
    (status,) = pod["status"]["containerStatuses"]
    assert status["restartCount"] == 0, status
    return str(status["containerID"])


def kubelet_failures(node: Node, ns: str) -> list[str]:
    """Every failure the kubelet recorded for the namespace's Pods (a failed prepare is
    FailedPrepareDynamicResources, a container that could not start Failed or FailedCreate...)."""
    events = node.get("-n", ns, "events")["items"]
    return [f"{e['reason']}: {e['message']}" for e in events if e.get("type") == "Warning"
            and e["reason"].startswith("Failed")
            and "kubelet" in (e.get("source", {}).get("component", ""),
                              e.get("reportingComponent", ""))]


def published_devices(node: Node) -> set[str]:
    return {d["name"] for s in node_slices(node) for d in s["spec"].get("devices", [])}


def test_deleting_the_agents_pod_leaves_workloads_running(agent: Node, ns: str) -> None:
    apply_example(agent, ns, "one-gpu.yaml")
    before = container_id(agent.wait_running(ns, "one-gpu"))
    (old,) = agent_pods(agent)
    agent.kubectl("-n", AGENT_NS, "delete", "pod", old["metadata"]["name"], "--wait=false")
    new = wait_for(lambda: [p for p in agent_pods(agent)
                            if p["metadata"]["uid"] != old["metadata"]["uid"]],
                   timeout=60, interval=0.5, what="the DaemonSet's new agent Pod")[0]
    wait_agent_ready(agent)
    # The workload never restarted.
    assert container_id(agent.pod(ns, "one-gpu")) == before
    # The new agent serves a new Pod (its claim prepared from the checkpoint the old one left).
    text = example("one-gpu.yaml", pod="second-gpu")
    agent.kubectl("-n", ns, "apply", "-f", "-", input=text)
    agent.wait_running(ns, "second-gpu")
    agent.wait_logged(ns, "second-gpu", "ready")
    assert new["metadata"]["name"] != old["metadata"]["name"]
    assert not kubelet_failures(agent, ns)


def test_a_rolling_update_while_a_pod_starts_fails_no_prepare(agent: Node, ns: str) -> None:
    old_uid = agent_pods(agent)[0]["metadata"]["uid"]
    upgrade: dict[str, Any] = {}

    def helm_upgrade() -> None:
        # A changed pod annotation: a new DaemonSet revision, rolled out with maxSurge 1 (the
        # new agent registers beside the old one before the old one stops).
        values = chart_values(agent, **{"podAnnotations.rollout": str(time.time())})
        upgrade["out"] = agent.helm("upgrade", RELEASE, str(CHART), "-n", AGENT_NS, *values,
                                    check=False)

    thread = threading.Thread(target=helm_upgrade)
    thread.start()
    try:
        for i in range(3):
            text = example("one-gpu.yaml", pod=f"during-{i}")
            agent.kubectl("-n", ns, "apply", "-f", "-", input=text)
            time.sleep(1)
    finally:
        thread.join(timeout=300)
    assert upgrade["out"].returncode == 0, upgrade["out"].stderr
    for i in range(3):
        agent.wait_running(ns, f"during-{i}", timeout=120)
    wait_agent_ready(agent)
    assert agent_pods(agent)[0]["metadata"]["uid"] != old_uid
    failures = kubelet_failures(agent, ns)
    assert not failures, (failures, old_uid, agent.dra_log())


def test_a_kubelet_restart_keeps_pods_running_and_slices_published(agent: Node, ns: str) -> None:
    apply_example(agent, ns, "one-gpu.yaml")
    before = container_id(agent.wait_running(ns, "one-gpu"))
    names_before = {s["metadata"]["name"] for s in node_slices(agent)}
    devices_before = published_devices(agent)
    agent.restart_kubelet()
    # The new kubelet wipes the slices of drivers not registered with it yet (our agent
    # re-registers when its socket is seen again, then publishes anew): watch for the gap in
    # which the node's devices are not published, for as long as the wipe may take to come.
    gaps, gap_start, replaced = [], None, False
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline and not replaced:
        now, names = time.monotonic(), {s["metadata"]["name"] for s in node_slices(agent)}
        complete = published_devices(agent) == devices_before
        if not complete and gap_start is None:
            gap_start = now
        if complete and gap_start is not None:
            gaps.append(now - gap_start)
            gap_start = None
        replaced = complete and names != names_before
        time.sleep(0.1)
    assert gap_start is None, "the agent's devices were still not published 40 s after the restart"
    # "restored within about a second" (README), with room for a loaded 2-core machine.
    assert max(gaps, default=0) < 5, gaps
    wait_for(lambda: agent.kubectl("get", "node", agent.name, "-o",
                                   "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}")
             .strip() == "True", timeout=60, interval=0.25, what="the node Ready again")
    text = example("one-gpu.yaml", pod="after-restart")
    agent.kubectl("-n", ns, "apply", "-f", "-", input=text)
    agent.wait_running(ns, "after-restart")
    assert container_id(agent.pod(ns, "one-gpu")) == before
    assert published_devices(agent) == devices_before
    assert not kubelet_failures(agent, ns)


def test_helm_uninstall_removes_the_agents_slices(agent: Node) -> None:
    assert node_slices(agent)
    agent.helm("uninstall", RELEASE, "-n", AGENT_NS, "--wait")
    try:
        wait_for(lambda: not node_slices(agent), timeout=60, interval=0.5,
                 what="the agent's slices removed")
        assert not agent.kubectl("get", "daemonsets", "-A", "-o", "name").strip()
        classes = json.loads(agent.kubectl("get", "deviceclasses", "-o", "json"))["items"]
        assert not [c for c in classes if c["metadata"]["name"].endswith(".dra-agent.io")]
    finally:
        install(agent)  # the other tests' agent, back as it was
