"""Fixtures of the real-Kubernetes suite: one real cluster per session (the minor in
``REALK8S_VERSION``, default 1.37), nodes, agents and kubelet stand-ins on it.

Every test here carries the ``realk8s`` marker, which the README's fast command deselects;
``hack/realk8s/test.sh`` builds the binaries and runs this suite for each minor.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness import AgentProcess, NodeDirs, reap, temporary_node_dirs
from tests.fakes.kubelet import KubeletStandIn
from tests.realk8s.cluster import RealCluster, bin_dir, minor_under_test
from tests.realk8s.kubelet import KubeletDRA

HERE = Path(__file__).resolve().parent
_names = itertools.count()

StartAgent = Callable[..., AgentProcess]
StartCluster = Callable[..., RealCluster]
StartKubelet = Callable[..., KubeletDRA]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.realk8s)


@pytest.fixture(scope="session")
def minor() -> str:
    minor = minor_under_test()
    missing = [b for b in ("etcd", "kube-apiserver", "kubectl")
               if not (bin_dir(minor) / b).is_file()]
    # A missing build is a failure, never a skip: run hack/realk8s/test.sh, which builds first.
    assert not missing, (f"{missing} not built for {minor}: run hack/realk8s/build.sh {minor} "
                         "(hack/realk8s/test.sh does)")
    return minor


@pytest.fixture(scope="session")
def cluster_root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="realk8s-"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def cluster(minor: str, cluster_root: Path) -> Iterator[RealCluster]:
    """The shared cluster, with deploy/base applied as an operator would."""
    real = RealCluster.up(cluster_root / "main", minor)
    try:
        real.apply_deploy("base")
        # No controller-manager runs: make the ServiceAccount it would make for test pods.
        real.create({"apiVersion": "v1", "kind": "ServiceAccount",
                     "metadata": {"name": "default", "namespace": "default"}})
        yield real
    finally:
        real.down()


@pytest.fixture
def start_cluster(minor: str, cluster_root: Path) -> Iterator[StartCluster]:
    """``start_cluster(*up_sh_args)``: a cluster of this test's own, always stopped."""
    started: list[RealCluster] = []

    def start(*args: str) -> RealCluster:
        real = RealCluster.up(Path(tempfile.mkdtemp(dir=cluster_root)), minor, *args)
        started.append(real)
        return real

    yield start
    for real in started:
        real.down()


@pytest.fixture
def node(cluster: RealCluster) -> str:
    """A Node of this test's own (tests share the cluster, never a node)."""
    name = f"node-{next(_names)}"
    cluster.ensure_node(name)
    return name


@pytest.fixture
def dirs() -> Iterator[NodeDirs]:
    with temporary_node_dirs("r") as node_dirs:
        yield node_dirs


@pytest.fixture
def start_agent(dirs: NodeDirs) -> Iterator[StartAgent]:
    """``start_agent(kubeconfig, node, *extra_args, **kwargs)``; every agent is killed at the
    end and its log printed (pytest shows it for a failed test)."""
    started: list[AgentProcess] = []

    def start(kubeconfig: Path, node: str, *extra: str, **kwargs: Any) -> AgentProcess:
        agent = AgentProcess(dirs, str(kubeconfig), *extra, node=node, **kwargs)
        started.append(agent)
        return agent

    yield start
    reap(started)


@pytest.fixture
def kubelet(dirs: NodeDirs) -> Iterator[KubeletStandIn]:
    """The kubelet stand-in's gRPC side (registration, prepare, unprepare) for ``dirs``."""
    with KubeletStandIn(dirs.registry, retry_initial=0.05) as standin:
        yield standin



@pytest.fixture
def start_kubelet(minor: str, dirs: NodeDirs) -> Iterator[StartKubelet]:
    """``start_kubelet(kubeconfig, node, feature_gates="")``: the kubelet's own DRA code
    (bin/<minor>/kubelet-dra) on ``dirs``; stopped at the end, its log printed."""
    started: list[KubeletDRA] = []

    def start(kubeconfig: Path, node: str, feature_gates: str = "") -> KubeletDRA:
        kubelet = KubeletDRA(minor, kubeconfig, node, dirs.kubelet, feature_gates=feature_gates)
        started.append(kubelet)
        return kubelet

    yield start
    for kubelet in started:
        kubelet.stop()
    if started:
        print(f"--- kubelet-dra ---\n{started[-1].logs()}")
