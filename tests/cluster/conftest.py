"""Fixtures of the whole-node suite: one real node per session (hack/realk8s/node-up.sh: the
control plane, containerd with CDI, the real kubelet), the agent's image imported into it, and
the chart installed with the real helm, as a user would.

Every test here carries the ``cluster`` marker, which the README's fast command deselects;
``hack/realk8s/cluster-test.sh`` builds what it needs and runs this suite as root.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.node import EXAMPLES, NODE_BINARIES, ROOT, Node
from tests.waiting import wait_for

HERE = Path(__file__).resolve().parent
CHART = ROOT / "deploy" / "helm" / "dra-agent"
RELEASE = "dra-agent"
AGENT_NS = "dra-agent"
DRIVER = "dra-agent.io"
#: The simulated machine the agent publishes: 8 H100s and their NICs under shared PCIe roots.
PROFILE = "dgx-h100"
_names = itertools.count()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.cluster)


@pytest.fixture(scope="session")
def images() -> Iterator[Path]:
    """The agent's, the workload's and the sandbox's images as archives, built here from the
    recipe (hack/image; cached across runs), never pulled."""
    from hack.image import build_all

    out = Path(tempfile.mkdtemp(prefix="cluster-images-"))
    try:
        build_all(out)
        yield out
    finally:
        shutil.rmtree(out, ignore_errors=True)


@pytest.fixture(scope="session")
def node(images: Path) -> Iterator[Node]:
    assert os.geteuid() == 0, "the whole-node suite runs as root (hack/realk8s/cluster-test.sh)"
    missing = [str(b) for b in NODE_BINARIES if not b.is_file()]
    # A missing build is a failure, never a skip: cluster-test.sh builds first.
    assert not missing, f"not built: {missing}: run hack/realk8s/build.sh 1.37 node"
    root = Path(tempfile.mkdtemp(prefix="cluster-"))
    node = Node.up(root / "node", images)
    try:
        yield node
    finally:
        node.down()
        shutil.rmtree(root, ignore_errors=True)


def chart_values(node: Node, **overrides: Any) -> list[str]:
    """helm's value arguments: the node's own (node-up.sh's chart-values.yaml: the imported
    image, never pulled; the API server's address), the simulated profile with device nodes
    runc can create (as hack/realk8s/node-playground.sh installs it), then ``overrides``."""
    values = {"simulate": PROFILE, "simulateDeviceNodes": "true"}
    values.update({k: str(v) for k, v in overrides.items()})
    args = ["-f", str(node.dir / "chart-values.yaml")]
    for key, value in values.items():
        args += ["--set", f"{key}={value}"]
    return args


def agent_pods(node: Node) -> list[Any]:
    return [p for p in node.get("-n", AGENT_NS, "pods")["items"]
            if p["metadata"].get("deletionTimestamp") is None]


def wait_agent_ready(node: Node, timeout: float = 120) -> Any:
    """The agent's one Pod Ready on the node and its slices published."""
    def ready() -> Any:
        pods = agent_pods(node)
        ok = [p for p in pods if any(c["type"] == "Ready" and c["status"] == "True"
                                     for c in p.get("status", {}).get("conditions", []))]
        return ok[0] if len(pods) == 1 and ok else None
    pod = wait_for(ready, timeout=timeout, interval=0.5, what="the agent's Pod Ready")
    wait_for(lambda: node_slices(node), timeout=60, interval=0.5, what="the agent's slices")
    return pod


def node_slices(node: Node) -> list[Any]:
    return [s for s in node.get("resourceslices")["items"]
            if s["spec"].get("driver") == DRIVER and s["spec"].get("nodeName") == node.name]


def install(node: Node, **overrides: Any) -> None:
    node.helm("upgrade", "--install", RELEASE, str(CHART), "-n", AGENT_NS, "--create-namespace",
              *chart_values(node, **overrides))
    wait_agent_ready(node)


@pytest.fixture(scope="session")
def agent(node: Node) -> Node:
    """The chart installed with its defaults but for the simulated node's values."""
    install(node)
    return node


@pytest.fixture
def ns(agent: Node) -> Iterator[str]:
    """A namespace of this test's own (with its default ServiceAccount), deleted after it."""
    name = f"t{next(_names)}-{os.getpid() % 1000}"
    agent.kubectl("create", "namespace", name)
    wait_for(lambda: agent.kubectl("-n", name, "get", "serviceaccount", "default",
                                   "--ignore-not-found", "-o", "name").strip(),
             timeout=30, interval=0.2, what=f"the default ServiceAccount of {name}")
    yield name
    agent.kubectl("delete", "namespace", name, "--wait=false", check=False)


def apply_example(node: Node, ns: str, name: str) -> None:
    node.kubectl("-n", ns, "apply", "-f", str(EXAMPLES / name))


def example(name: str, pod: str | None = None) -> str:
    """examples/NAME's text; ``pod`` renames its one Pod (templates and claims keep theirs,
    so the copy can be applied beside the original)."""
    text = (EXAMPLES / name).read_text()
    if pod is None:
        return text
    docs = text.split("\n---\n")
    (i,) = [n for n, d in enumerate(docs) if "\nkind: Pod\n" in f"\n{d}"]
    head, sep, rest = docs[i].partition("metadata:\n  name: ")
    docs[i] = head + sep + pod + rest[rest.index("\n"):]
    return "\n---\n".join(docs)
