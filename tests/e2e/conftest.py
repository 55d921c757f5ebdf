"""Fixtures: one node's directories, the cluster (fake API server + scheduler stand-in), agents
that are always reaped, and the kubelet stand-in."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.e2e.harness import AgentProcess, Cluster, NodeDirs, reap, temporary_node_dirs
from tests.fakes.apiserver import FakeAPIServer
from tests.fakes.kubelet import KubeletStandIn

StartAgent = Callable[..., AgentProcess]


@pytest.fixture
def dirs() -> Iterator[NodeDirs]:
    with temporary_node_dirs("e") as node_dirs:
        yield node_dirs


@pytest.fixture
def cluster(dirs: NodeDirs) -> Iterator[Cluster]:
    with FakeAPIServer() as server:
        yield Cluster(server, dirs.root)


@pytest.fixture
def start_agent(dirs: NodeDirs, cluster: Cluster) -> Iterator[StartAgent]:
    """``start_agent(*extra_args, env=..., kubeconfig=...)``; every agent is killed at the end."""
    started: list[AgentProcess] = []

    def start(*extra: str, kubeconfig: str | None = None, **kwargs: Any) -> AgentProcess:
        agent = AgentProcess(dirs, kubeconfig or cluster.kubeconfig, *extra, **kwargs)
        started.append(agent)
        return agent

    yield start
    reap(started)


@pytest.fixture
def kubelet(dirs: NodeDirs, cluster: Cluster) -> Iterator[KubeletStandIn]:
    from tests.e2e.harness import NODE

    standin = KubeletStandIn(dirs.registry, api_client=cluster.server.api_client(),
                             node_name=NODE, retry_initial=0.05)
    with standin:
        yield standin
        print("--- kubelet stand-in ---")
        for reg in standin.registrations:
            print("registered", reg.socket_path.name, reg.endpoint)
        for reg in standin.deregistrations:
            print("deregistered", reg.socket_path.name, reg.endpoint)
        for failure in standin.failures:
            print("failed", failure)
