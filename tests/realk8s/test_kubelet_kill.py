"""kill -9 of the agent at every failpoint while the real kubelet's DRA manager drives it.

As tests/e2e/test_kill.py, but the calls come from the kubelet's own code
(bin/<minor>/kubelet-dra) and the claims from the real API server: the agent SIGKILLs itself
at the point, is started again without failpoints, and the kubelet's call is re-sent until it
succeeds, as the kubelet's pod worker does. The end state is then exact: one spec, one
PrepareCompleted record, the CDI IDs; after unprepare nothing at all.

One kubelet and one node serve every case (module scope): each case costs two agent starts.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness import (
    GPU_CLASS,
    NIC_CLASS,
    AgentProcess,
    NodeDirs,
    assert_nothing_left,
    assert_prepared,
    expected_cdi_id,
    reap,
    temporary_node_dirs,
)
from tests.e2e.test_kill import ENV, PREPARE_POINTS, UNPREPARE_POINTS, assert_killed_at
from tests.realk8s.agent import allocate, make_claim, wait_settled
from tests.realk8s.cluster import RealCluster, collection_path
from tests.realk8s.kubelet import KubeletDRA
from tests.realk8s.test_kubelet_dra import get_pod
from tests.realk8s.test_node_identity import pod_using
from tests.waiting import wait_for


@dataclass
class Node:
    """The node every case here shares: its dirs, credentials and kubelet."""

    cluster: RealCluster
    name: str
    dirs: NodeDirs
    kubeconfig: Path
    kubelet: KubeletDRA
    #: The objects this case made (API paths), deleted after it: the claims would otherwise
    #: keep their devices and the node would run out after eight cases.
    made: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def shared(cluster: RealCluster, minor: str) -> Iterator[Node]:
    name = "node-kill"
    cluster.ensure_node(name)
    kubeconfig = cluster.node_kubeconfig(name)
    with temporary_node_dirs("k") as dirs:
        kubelet = KubeletDRA(minor, kubeconfig, name, dirs.kubelet)
        try:
            yield Node(cluster, name, dirs, kubeconfig, kubelet)
        finally:
            kubelet.stop()
            print(f"--- kubelet-dra ---\n{kubelet.logs()}")


@pytest.fixture
def node(shared: Node) -> Iterator[Node]:
    """The shared node, checked empty before and after each case."""
    assert_nothing_left(shared.dirs)
    yield shared
    for path in shared.made:
        assert shared.cluster.admin.request("DELETE", path).status in (200, 202, 404), path
    shared.made.clear()
    assert_nothing_left(shared.dirs)


@pytest.fixture
def agents(node: Node) -> Iterator[list[AgentProcess]]:
    started: list[AgentProcess] = []
    yield started
    reap(started)


def start(node: Node, agents: list[AgentProcess], name: str,
          env: dict[str, str] | None = None, wait: bool = True) -> AgentProcess:
    """An agent on the node; unless told not to wait, registered with the kubelet and its
    slices in place (the first one publishes them; later ones find them, write nothing)."""
    agent = AgentProcess(node.dirs, str(node.kubeconfig), node=node.name, name=name, env=env)
    agents.append(agent)
    if wait:
        wait_settled(node.cluster, node.name, agent, quiet=0.3)
        registered(agent)
    return agent


def registered(agent: AgentProcess) -> None:
    """Wait until the kubelet has registered ``agent``, the instance started after a kill.

    Until then the kubelet still holds the killed instance's registration, and its gRPC
    connection to the same socket path reconnects to the new instance: a retried call can
    succeed before the registration. When the kubelet then notices the socket was replaced,
    it deregisters the old instance and closes that connection, cancelling a call in flight
    on it on the kubelet's side ("the client connection is closing"; the agent itself
    completed it). The kubelet retries such a call; the calls this test asserts succeed at
    the first try are therefore sent after the registration settled."""
    wait_for(lambda: "registered with the kubelet" in agent.logs(), timeout=20,
             what=f"the kubelet registering {agent.log.name}")


def until_ok(call: Any, pod: dict[str, Any], timeout: float = 30) -> list[str]:
    """Re-send ``call(pod)`` until it succeeds, as the kubelet's pod worker retries a sync;
    returns the errors of the failed attempts."""
    errors: list[str] = []
    deadline = time.monotonic() + timeout
    while (error := call(pod)) != "":
        errors.append(error)
        assert time.monotonic() < deadline, f"still failing after {timeout} s: {errors[-3:]}"
        time.sleep(0.1)
    return errors


def pod_with_pair(node: Node, point: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A GPU+NIC claim allocated by the scheduler's allocator and a pod it is reserved for."""
    claim = make_claim(node.cluster, f"{point}-{node.name}", [("gpu", GPU_CLASS),
                                                              ("nic", NIC_CLASS)])
    pod = pod_using(node.cluster, node.name, claim)
    node.made += [f"{collection_path(o)}/{o['metadata']['name']}" for o in (claim, pod)]
    claim = allocate(node.cluster, claim, node.name, pod=pod)
    pod = get_pod(node.cluster, pod)
    node.kubelet.active([pod])
    return claim, pod


def assert_container_ids(node: Node, pod: dict[str, Any], claim: dict[str, Any]) -> None:
    uid = claim["metadata"]["uid"]
    results = claim["status"]["allocation"]["devices"]["results"]
    assert sorted(node.kubelet.resources(pod, "c")) == sorted(
        expected_cdi_id(uid, r["device"]) for r in results)


@pytest.mark.parametrize("point", PREPARE_POINTS)
def test_kill_during_prepare_the_kubelet_retries(
    point: str, node: Node, agents: list[AgentProcess],
) -> None:
    doomed = start(node, agents, point, env={ENV: f"{point}=kill"})
    claim, pod = pod_with_pair(node, point)
    error = node.kubelet.prepare(pod)
    assert error, "prepare succeeded although the agent was killed during it"
    assert_killed_at(doomed, point)

    # Started, and the kubelet's call re-sent at once: it fails until the new instance
    # answers (through the old registration's connection or the new one), then succeeds.
    agent = start(node, agents, "restarted", wait=False)
    until_ok(node.kubelet.prepare, pod)
    registered(agent)
    assert_prepared(node.dirs, claim)
    assert_container_ids(node, pod, claim)

    node.kubelet.active([])
    assert node.kubelet.unprepare(pod) == ""
    assert_nothing_left(node.dirs)
    assert agent.terminate() == 0


@pytest.mark.parametrize("point", UNPREPARE_POINTS)
def test_kill_during_unprepare_the_kubelet_retries(
    point: str, node: Node, agents: list[AgentProcess],
) -> None:
    doomed = start(node, agents, point, env={ENV: f"{point}=kill"})
    claim, pod = pod_with_pair(node, point)
    assert node.kubelet.prepare(pod) == ""
    assert_prepared(node.dirs, claim)
    node.kubelet.active([])
    error = node.kubelet.unprepare(pod)
    assert error, "unprepare succeeded although the agent was killed during it"
    assert_killed_at(doomed, point)

    agent = start(node, agents, "restarted", wait=False)
    until_ok(node.kubelet.unprepare, pod)
    assert_nothing_left(node.dirs)
    registered(agent)
    # The kubelet forgot the claim: preparing the pod again is a fresh prepare that cleans up.
    node.kubelet.active([pod])
    assert node.kubelet.prepare(pod) == ""
    assert_prepared(node.dirs, claim)
    node.kubelet.active([])
    assert node.kubelet.unprepare(pod) == ""
    assert agent.terminate() == 0
